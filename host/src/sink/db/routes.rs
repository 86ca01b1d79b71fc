//! A route's statements and how a batch's records are applied through
//! them: a table route's INSERT or upsert (and an upsert's DELETE of
//! tombstoned keys), a `sql` route's statement with its parameters
//! converted from each record's JSON.

use postgres::Transaction;
use postgres::types::{ToSql, Type};
use serde_json::Value;

use super::*;

/// Columns quoted and comma-separated.
fn quote_list(columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| quote(c))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A route's statements: the apply statement, and an upsert's delete.
pub(super) fn route_sql(apply: &Apply) -> (String, Option<String>) {
    match apply {
        Apply::Upsert {
            table,
            columns,
            key,
        } => {
            let t = quote(table);
            let cols = quote_list(columns);
            let keys = quote_list(key);
            let set: Vec<String> = columns
                .iter()
                .filter(|c| !key.contains(c))
                .map(|c| format!("{q} = EXCLUDED.{q}", q = quote(c)))
                .collect();
            let action = if set.is_empty() {
                "DO NOTHING".to_owned()
            } else {
                format!("DO UPDATE SET {}", set.join(", "))
            };
            let upsert = format!(
                "INSERT INTO {t} ({cols}) SELECT {cols} FROM jsonb_populate_recordset(NULL::{t}, $1::text::jsonb) \
                 ON CONFLICT ({keys}) {action}"
            );
            let delete = (key.len() == 1).then(|| {
                let k = quote(&key[0]);
                format!(
                    "DELETE FROM {t} AS x USING jsonb_populate_recordset(NULL::{t}, $1::text::jsonb) AS d \
                     WHERE x.{k} = d.{k}"
                )
            });
            (upsert, delete)
        }
        Apply::Insert { table, columns } => {
            let t = quote(table);
            let cols = quote_list(columns);
            (
                format!(
                    "INSERT INTO {t} ({cols}) SELECT {cols} FROM jsonb_populate_recordset(NULL::{t}, $1::text::jsonb)"
                ),
                None,
            )
        }
        Apply::Sql { statement, .. } => (statement.clone(), None),
    }
}

/// Applies `items` of one route; records that cannot be (a missing key
/// field, a tombstone where none is allowed, a parameter that does not
/// convert) are pushed to `dead`.
pub(super) fn apply_route(
    t: &mut Transaction<'_>,
    apply: &Apply,
    prep: &Prepared,
    items: &[&Item],
    dead: &mut Vec<DeadLetter>,
) -> Result<(), postgres::Error> {
    match apply {
        Apply::Upsert { key, .. } => {
            // The last record per key wins (the table ends as after applying
            // them one by one); a tombstone deletes.
            let mut last: BTreeMap<Vec<String>, (&Item, bool)> = BTreeMap::new();
            for item in items {
                match item.json.as_ref() {
                    Ok(Some(obj)) => {
                        let mut k = Vec::new();
                        for col in key {
                            match obj.get(col) {
                                None | Some(Value::Null) => {
                                    dead.push(letter(
                                        item,
                                        format!("the key column {col:?} is missing from the value"),
                                        None,
                                    ));
                                    k.clear();
                                    break;
                                }
                                Some(v) => k.push(v.to_string()),
                            }
                        }
                        if k.len() == key.len() {
                            last.insert(k, (item, false));
                        }
                    }
                    Ok(None) => {
                        if prep.delete.is_none() {
                            dead.push(letter(
                                item,
                                "a tombstone (null value) deletes only with a one-column key"
                                    .to_owned(),
                                None,
                            ));
                            continue;
                        }
                        let Some(k) = item
                            .key
                            .as_ref()
                            .map(|k| String::from_utf8_lossy(k).into_owned())
                        else {
                            dead.push(letter(item, "a tombstone without a key".to_owned(), None));
                            continue;
                        };
                        last.insert(vec![Value::String(k).to_string()], (item, true));
                    }
                    Err(_) => {}
                }
            }
            let mut upserts = JsonArray::default();
            let mut deletes = Vec::new();
            for (k, (item, tombstone)) in last {
                if tombstone {
                    let mut o = serde_json::Map::new();
                    let raw: Value = serde_json::from_str(&k[0]).unwrap_or(Value::Null);
                    o.insert(key[0].clone(), raw);
                    deletes.push(Value::Object(o));
                } else {
                    upserts.push(item);
                }
            }
            if !deletes.is_empty()
                && let Some(d) = &prep.delete
            {
                t.execute(d, &[&Value::Array(deletes).to_string()])?;
            }
            if let Some(rows) = upserts.finish() {
                t.execute(&prep.apply, &[&rows])?;
            }
        }
        Apply::Insert { .. } => {
            let mut rows = JsonArray::default();
            for item in items {
                match &item.json {
                    Ok(Some(_)) => rows.push(item),
                    Ok(None) => dead.push(letter(
                        item,
                        "a tombstone (null value) in an insert route".to_owned(),
                        None,
                    )),
                    Err(_) => {}
                }
            }
            if let Some(rows) = rows.finish() {
                t.execute(&prep.apply, &[&rows])?;
            }
        }
        Apply::Sql { params, .. } => {
            for item in items {
                match sql_params(item, params, prep.apply.params()) {
                    Ok(values) => {
                        let refs: Vec<&(dyn ToSql + Sync)> = values
                            .iter()
                            .map(|v| v.as_ref() as &(dyn ToSql + Sync))
                            .collect();
                        t.execute(&prep.apply, &refs)?;
                    }
                    Err(reason) => dead.push(letter(item, reason, None)),
                }
            }
        }
    }
    Ok(())
}

/// A JSON array of records' values, as text: the values are JSON objects
/// already (checked when the batch was read), so they are copied as they
/// came, not serialised again.
#[derive(Default)]
struct JsonArray(String);

impl JsonArray {
    fn push(&mut self, item: &Item) {
        let Some(v) = item.value.as_deref() else {
            return;
        };
        self.0.push(if self.0.is_empty() { '[' } else { ',' });
        // Valid UTF-8: it parsed as JSON.
        self.0.push_str(&String::from_utf8_lossy(v));
    }

    fn finish(mut self) -> Option<String> {
        if self.0.is_empty() {
            return None;
        }
        self.0.push(']');
        Some(self.0)
    }
}

/// How a parameter type is fed from JSON.
#[derive(Debug, Clone, Copy)]
pub(super) enum ParamKind {
    Text,
    Int2,
    Int4,
    Int8,
    Float8,
    Float4,
    Bool,
    Json,
    Bytea,
}

pub(super) fn param_kind(ty: &Type) -> Option<ParamKind> {
    Some(match *ty {
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => ParamKind::Text,
        Type::INT2 => ParamKind::Int2,
        Type::INT4 => ParamKind::Int4,
        Type::INT8 => ParamKind::Int8,
        Type::FLOAT8 => ParamKind::Float8,
        Type::FLOAT4 => ParamKind::Float4,
        Type::BOOL => ParamKind::Bool,
        Type::JSON | Type::JSONB => ParamKind::Json,
        Type::BYTEA => ParamKind::Bytea,
        _ => return None,
    })
}

/// A `sql` route's parameters for one record, converted to the statement's
/// parameter types.
fn sql_params(
    item: &Item,
    names: &[String],
    types: &[Type],
) -> Result<Vec<Box<dyn ToSql + Sync>>, String> {
    let obj = match &item.json {
        Ok(o) => o.as_ref(),
        Err(e) => return Err(e.clone()),
    };
    let mut out: Vec<Box<dyn ToSql + Sync>> = Vec::new();
    for (n, (name, ty)) in names.iter().zip(types).enumerate() {
        let v: Value = match name.as_str() {
            "$key" => item.key.as_ref().map_or(Value::Null, |k| {
                Value::String(String::from_utf8_lossy(k).into_owned())
            }),
            "$topic" => Value::String(item.topic.clone()),
            "$partition" => Value::from(item.partition),
            "$offset" => Value::from(item.offset),
            "$value" => match obj {
                Some(o) => Value::Object(o.clone()),
                None => Value::Null,
            },
            field => obj
                .and_then(|o| o.get(field))
                .cloned()
                .unwrap_or(Value::Null),
        };
        let kind = param_kind(ty).unwrap_or(ParamKind::Text);
        let bad = || format!("parameter ${} ({name}): {v} is not a {ty}", n + 1);
        let b: Box<dyn ToSql + Sync> = if v.is_null() && !matches!(kind, ParamKind::Json) {
            match kind {
                ParamKind::Text => Box::new(None::<String>),
                ParamKind::Int2 => Box::new(None::<i16>),
                ParamKind::Int4 => Box::new(None::<i32>),
                ParamKind::Int8 => Box::new(None::<i64>),
                ParamKind::Float8 => Box::new(None::<f64>),
                ParamKind::Float4 => Box::new(None::<f32>),
                ParamKind::Bool => Box::new(None::<bool>),
                ParamKind::Bytea => Box::new(None::<Vec<u8>>),
                ParamKind::Json => unreachable!(),
            }
        } else {
            match kind {
                ParamKind::Text => Box::new(match &v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                }),
                ParamKind::Int2 => Box::new(
                    v.as_i64()
                        .and_then(|x| i16::try_from(x).ok())
                        .ok_or_else(bad)?,
                ),
                ParamKind::Int4 => Box::new(
                    v.as_i64()
                        .and_then(|x| i32::try_from(x).ok())
                        .ok_or_else(bad)?,
                ),
                ParamKind::Int8 => Box::new(v.as_i64().ok_or_else(bad)?),
                ParamKind::Float8 => Box::new(v.as_f64().ok_or_else(bad)?),
                ParamKind::Float4 => Box::new(v.as_f64().ok_or_else(bad)? as f32),
                ParamKind::Bool => Box::new(v.as_bool().ok_or_else(bad)?),
                ParamKind::Json => Box::new(v),
                ParamKind::Bytea => Box::new(match &v {
                    Value::String(s) => s.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                }),
            }
        };
        out.push(b);
    }
    Ok(out)
}
