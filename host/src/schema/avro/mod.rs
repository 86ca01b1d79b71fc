//! Avro values to JSON and back, following the schema (owns `apache_avro`).
//!
//! The JSON a processor sees (docs/formats.md, "Avro as JSON"): records are
//! objects, arrays arrays, maps objects; a union is its branch's value
//! (`null`, or the value itself, never Avro's `{"string": "x"}` wrapping);
//! enums are their symbol; `bytes` and `fixed` are base64 (standard, with
//! padding); `decimal` is a string (`"12.34"`, exact); dates, times and
//! timestamps are their numbers (days, ms or µs since the epoch); `uuid` a
//! string; a float that is not a number is `"NaN"`, `"Infinity"` or
//! `"-Infinity"`. Encoding takes the same JSON back; a union also takes
//! Avro's own wrapped form, and a record field left out takes its default.

use std::collections::HashMap;
use std::str::FromStr;

use apache_avro::schema::{InnerDecimalSchema, Name, RecordSchema, ResolvedSchema, UnionSchema};
use apache_avro::types::Value;
use apache_avro::{Decimal, Schema};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use num_bigint::BigInt;
use serde_json::{Number, Value as Json};

/// Most bytes one allocation may take while decoding a value.
const MAX_ALLOCATION_BYTES: usize = 64 << 20;

mod binary;

/// A parsed Avro schema with its named types, ready to read and write.
#[derive(Debug)]
pub struct AvroSchema {
    schema: Schema,
    /// Every named type by its full name (for `Ref`s).
    names: HashMap<Name, Schema>,
    /// A digest of its canonical form: two schemas with the same are the
    /// same schema (a reader equal to the writer resolves nothing).
    fingerprint: u64,
}

impl AvroSchema {
    /// Parses a schema's JSON text.
    ///
    /// A schema with an array of items that take no bytes (`null`, a record
    /// without fields, a `fixed` of size 0) is refused: a few bytes of such
    /// an array can claim millions of items, and a value naming it would
    /// make the host allocate them (a decompression bomb). Every other
    /// item takes at least one byte of the value, so what a value decodes
    /// to is bounded by its size.
    pub fn parse(text: &str) -> Result<Self, String> {
        // No single allocation while decoding may pass this (a length
        // prefix claiming more than a record can hold fails at once).
        apache_avro::util::max_allocation_bytes(MAX_ALLOCATION_BYTES);
        let schema = Schema::parse_str(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let names: HashMap<Name, Schema> = ResolvedSchema::try_from(&schema)
            .map_err(|e| format!("not an Avro schema: {e}"))?
            .get_names()
            .iter()
            .map(|(n, s)| (n.clone(), (*s).clone()))
            .collect();
        let fingerprint = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            schema.canonical_form().hash(&mut h);
            h.finish()
        };
        let parsed = Self {
            schema,
            names,
            fingerprint,
        };
        if parsed
            .names
            .values()
            .chain([&parsed.schema])
            .any(has_big_decimal)
        {
            return Err(
                "logical type big-decimal is apache-avro's own, not the Avro specification's: \
                 use decimal (bytes or fixed, with a precision and a scale)"
                    .to_owned(),
            );
        }
        parsed.refuse_empty_items(&parsed.schema, &mut Vec::new())?;
        Ok(parsed)
    }

    /// Refuses arrays whose items can be written in zero bytes.
    fn refuse_empty_items(&self, s: &Schema, seen: &mut Vec<Name>) -> Result<(), String> {
        match s {
            Schema::Ref { name } => {
                if seen.contains(name) {
                    return Ok(());
                }
                seen.push(name.clone());
                let target = self.resolve(s)?;
                self.refuse_empty_items(target, seen)
            }
            Schema::Record(r) => {
                if seen.contains(&r.name) && !std::ptr::eq(s, &self.schema) {
                    return Ok(());
                }
                seen.push(r.name.clone());
                for f in &r.fields {
                    self.refuse_empty_items(&f.schema, seen)?;
                }
                Ok(())
            }
            Schema::Array(a) => {
                if self.zero_width(&a.items, &mut Vec::new())? {
                    return Err(
                        "an array whose items take no bytes (null, a record without fields, \
                         a fixed of size 0) is not accepted: a tiny value could claim \
                         millions of them; give the items a type with content"
                            .to_owned(),
                    );
                }
                self.refuse_empty_items(&a.items, seen)
            }
            Schema::Map(m) => self.refuse_empty_items(&m.types, seen),
            Schema::Union(u) => u
                .variants()
                .iter()
                .try_for_each(|v| self.refuse_empty_items(v, seen)),
            _ => Ok(()),
        }
    }

    /// Whether a value of `s` can take no bytes at all.
    fn zero_width(&self, s: &Schema, seen: &mut Vec<Name>) -> Result<bool, String> {
        Ok(match self.resolve(s)? {
            Schema::Null => true,
            Schema::Fixed(f) => f.size == 0,
            Schema::Record(r) => {
                if seen.contains(&r.name) {
                    // Recursive: needs a union (one byte) to end.
                    return Ok(false);
                }
                seen.push(r.name.clone());
                let mut all = true;
                for f in &r.fields {
                    all &= self.zero_width(&f.schema, seen)?;
                }
                all
            }
            _ => false,
        })
    }

    /// The schema in Avro's canonical form (what a registry compares).
    pub fn canonical(&self) -> String {
        self.schema.canonical_form()
    }

    /// Reads one datum written with `self` (the writer's schema), resolved
    /// to `reader` when given, as JSON text.
    pub fn decode(&self, datum: &[u8], reader: Option<&AvroSchema>) -> Result<Vec<u8>, String> {
        let reader = reader.filter(|r| r.fingerprint != self.fingerprint);
        // The fast path reads it (bounded: lengths, counts, nesting), or
        // checks it before the generic path resolves it to the reader.
        let json = self
            .read_json(datum)
            .map_err(|e| format!("not an Avro datum of schema {}: {e}", short(&self.schema)))?;
        match reader {
            None => Ok(json),
            Some(reader) => self.decode_generic(datum, Some(reader)),
        }
    }

    /// One datum written with `self` as a datum of `reader` (for a
    /// processor that decodes Avro itself with the schema it was built
    /// with): the same bytes when the schemas are the same, checked.
    pub fn to_reader_datum(&self, datum: &[u8], reader: &AvroSchema) -> Result<Vec<u8>, String> {
        if reader.fingerprint == self.fingerprint {
            self.check_datum(datum)?;
            return Ok(datum.to_vec());
        }
        let json = self.decode(datum, Some(reader))?;
        reader.encode(&json)
    }

    /// Checks that `datum` is one whole datum of this schema.
    pub fn check_datum(&self, datum: &[u8]) -> Result<(), String> {
        self.read_json(datum)
            .map(|_| ())
            .map_err(|e| format!("not an Avro datum of schema {}: {e}", short(&self.schema)))
    }

    /// [`AvroSchema::decode`] through apache-avro's `Value`s: schema
    /// resolution (a reader that is not the writer).
    fn decode_generic(
        &self,
        mut datum: &[u8],
        reader: Option<&AvroSchema>,
    ) -> Result<Vec<u8>, String> {
        let bad = |e: apache_avro::Error| {
            format!("not an Avro datum of schema {}: {e}", short(&self.schema))
        };
        let value = apache_avro::reader::datum::GenericDatumReader::builder(&self.schema)
            .maybe_reader_schema(reader.map(|r| &r.schema))
            .build()
            .map_err(bad)?
            .read_value(&mut datum)
            .map_err(bad)?;
        if !datum.is_empty() {
            return Err(format!(
                "{} bytes left after the Avro datum: the value was not written with this schema",
                datum.len()
            ));
        }
        let target = reader.unwrap_or(self);
        let mut out = Vec::with_capacity(datum.len() * 2 + 16);
        target.write_json(&value, &target.schema, &mut out)?;
        Ok(out)
    }

    /// Writes JSON text as one datum of this schema.
    pub fn encode(&self, json: &[u8]) -> Result<Vec<u8>, String> {
        let json: Json =
            serde_json::from_slice(json).map_err(|e| format!("the value is not JSON: {e}"))?;
        let value = self.value_of(&json, &self.schema, "")?;
        let mut datum = Vec::new();
        self.write(&value, &self.schema, &mut datum)?;
        Ok(datum)
    }

    fn resolve<'a>(&'a self, schema: &'a Schema) -> Result<&'a Schema, String> {
        match schema {
            Schema::Ref { name } => self
                .names
                .get(name)
                .ok_or_else(|| format!("the schema names an unknown type {name}")),
            other => Ok(other),
        }
    }

    /// Writes `value` (of `schema`) as JSON text: records' fields in the
    /// schema's order, maps' keys sorted.
    fn write_json(&self, value: &Value, schema: &Schema, out: &mut Vec<u8>) -> Result<(), String> {
        let schema = self.resolve(schema)?;
        let text = |out: &mut Vec<u8>, s: &str| {
            serde_json::to_writer(&mut *out, s).map_err(|e| e.to_string())
        };
        match (value, schema) {
            (Value::Union(i, inner), Schema::Union(u)) => {
                let branch = u
                    .variants()
                    .get(*i as usize)
                    .ok_or_else(|| format!("union branch {i} out of range"))?;
                return self.write_json(inner, branch, out);
            }
            (Value::Null, _) => out.extend_from_slice(b"null"),
            (Value::Boolean(b), _) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            (Value::Int(n) | Value::Date(n) | Value::TimeMillis(n), _) => {
                out.extend_from_slice(n.to_string().as_bytes())
            }
            (
                Value::Long(n)
                | Value::TimeMicros(n)
                | Value::TimestampMillis(n)
                | Value::TimestampMicros(n)
                | Value::TimestampNanos(n)
                | Value::LocalTimestampMillis(n)
                | Value::LocalTimestampMicros(n)
                | Value::LocalTimestampNanos(n),
                _,
            ) => out.extend_from_slice(n.to_string().as_bytes()),
            (Value::Float(f), _) => write_float(out, f64::from(*f))?,
            (Value::Double(f), _) => write_float(out, *f)?,
            (Value::Bytes(b) | Value::Fixed(_, b), _) => text(out, &BASE64.encode(b))?,
            (Value::String(s), _) => text(out, s)?,
            (Value::Enum(_, symbol), _) => text(out, symbol)?,
            (Value::Uuid(u), _) => text(out, &u.to_string())?,
            (Value::BigDecimal(d), _) => text(out, &d.to_string())?,
            (Value::Decimal(d), Schema::Decimal(s)) => {
                text(out, &decimal_text(&BigInt::from(d.clone()), s.scale))?
            }
            (Value::Duration(d), _) => out.extend_from_slice(
                format!(
                    r#"{{"months":{},"days":{},"millis":{}}}"#,
                    u32::from(d.months()),
                    u32::from(d.days()),
                    u32::from(d.millis())
                )
                .as_bytes(),
            ),
            (Value::Array(items), Schema::Array(a)) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    self.write_json(v, &a.items, out)?;
                }
                out.push(b']');
            }
            (Value::Map(entries), Schema::Map(m)) => {
                let mut keys: Vec<&String> = entries.keys().collect();
                keys.sort();
                out.push(b'{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    text(out, k)?;
                    out.push(b':');
                    self.write_json(&entries[k], &m.types, out)?;
                }
                out.push(b'}');
            }
            (Value::Record(fields), Schema::Record(r)) => {
                out.push(b'{');
                for (i, (name, v)) in fields.iter().enumerate() {
                    let field = r
                        .fields
                        .iter()
                        .find(|f| &f.name == name)
                        .ok_or_else(|| format!("field {name:?} is not in the schema"))?;
                    if i > 0 {
                        out.push(b',');
                    }
                    text(out, name)?;
                    out.push(b':');
                    self.write_json(v, &field.schema, out)?;
                }
                out.push(b'}');
            }
            (v, s) => {
                return Err(format!(
                    "a {} value where the schema has {}",
                    kind_of(v),
                    short(s)
                ));
            }
        }
        Ok(())
    }

    fn value_of(&self, json: &Json, schema: &Schema, path: &str) -> Result<Value, String> {
        let schema = self.resolve(schema)?;
        let wrong = |expected: &str| -> Result<Value, String> {
            Err(format!(
                "{}: expected {expected}, got {}",
                at(path),
                json_kind(json)
            ))
        };
        let expected =
            |what: &str| format!("{}: expected {what}, got {}", at(path), json_kind(json));
        Ok(match schema {
            Schema::Null => match json {
                Json::Null => Value::Null,
                _ => return wrong("null"),
            },
            Schema::Boolean => match json {
                Json::Bool(b) => Value::Boolean(*b),
                _ => return wrong("a boolean"),
            },
            Schema::Int | Schema::Date | Schema::TimeMillis => {
                let n = json
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| expected("a 32-bit integer"))?;
                match schema {
                    Schema::Date => Value::Date(n),
                    Schema::TimeMillis => Value::TimeMillis(n),
                    _ => Value::Int(n),
                }
            }
            Schema::Long
            | Schema::TimeMicros
            | Schema::TimestampMillis
            | Schema::TimestampMicros
            | Schema::TimestampNanos
            | Schema::LocalTimestampMillis
            | Schema::LocalTimestampMicros
            | Schema::LocalTimestampNanos => {
                let n = json.as_i64().ok_or_else(|| expected("a 64-bit integer"))?;
                match schema {
                    Schema::TimeMicros => Value::TimeMicros(n),
                    Schema::TimestampMillis => Value::TimestampMillis(n),
                    Schema::TimestampMicros => Value::TimestampMicros(n),
                    Schema::TimestampNanos => Value::TimestampNanos(n),
                    Schema::LocalTimestampMillis => Value::LocalTimestampMillis(n),
                    Schema::LocalTimestampMicros => Value::LocalTimestampMicros(n),
                    Schema::LocalTimestampNanos => Value::LocalTimestampNanos(n),
                    _ => Value::Long(n),
                }
            }
            Schema::Float => Value::Float(number(json).ok_or_else(|| expected("a number"))? as f32),
            Schema::Double => Value::Double(number(json).ok_or_else(|| expected("a number"))?),
            Schema::String => match json {
                Json::String(s) => Value::String(s.clone()),
                _ => return wrong("a string"),
            },
            Schema::Uuid(_) => match json {
                Json::String(s) => Value::Uuid(
                    apache_avro::Uuid::from_str(s)
                        .map_err(|e| format!("{}: not a UUID: {e}", at(path)))?,
                ),
                _ => return wrong("a UUID string"),
            },
            Schema::Bytes => Value::Bytes(base64(json, path)?),
            Schema::Fixed(f) => {
                let bytes = base64(json, path)?;
                if bytes.len() != f.size {
                    return Err(format!(
                        "{}: {} bytes where the fixed type {} has {}",
                        at(path),
                        bytes.len(),
                        f.name,
                        f.size
                    ));
                }
                Value::Fixed(f.size, bytes)
            }
            Schema::Enum(e) => match json {
                Json::String(s) => match e.symbols.iter().position(|x| x == s) {
                    Some(i) => Value::Enum(i as u32, s.clone()),
                    None => {
                        return Err(format!(
                            "{}: {s:?} is not a symbol of enum {} ({})",
                            at(path),
                            e.name,
                            e.symbols.join(", ")
                        ));
                    }
                },
                _ => return wrong("an enum symbol"),
            },
            Schema::Decimal(d) => {
                let text = match json {
                    Json::String(s) => s.clone(),
                    Json::Number(n) => n.to_string(),
                    _ => return wrong("a decimal string"),
                };
                let unscaled = decimal_unscaled(&text, d.scale)
                    .map_err(|e| format!("{}: {text:?}: {e}", at(path)))?;
                let mut bytes = unscaled.to_signed_bytes_be();
                if let InnerDecimalSchema::Fixed(f) = &d.inner {
                    if bytes.len() > f.size {
                        return Err(format!(
                            "{}: {text:?} does not fit in {} bytes",
                            at(path),
                            f.size
                        ));
                    }
                    let pad = if unscaled.sign() == num_bigint::Sign::Minus {
                        0xff
                    } else {
                        0
                    };
                    let mut padded = vec![pad; f.size - bytes.len()];
                    padded.append(&mut bytes);
                    bytes = padded;
                }
                Value::Decimal(Decimal::from(bytes))
            }
            Schema::BigDecimal => match json {
                Json::String(s) => Value::BigDecimal(
                    apache_avro::BigDecimal::from_str(s)
                        .map_err(|e| format!("{}: not a decimal: {e}", at(path)))?,
                ),
                _ => return wrong("a decimal string"),
            },
            Schema::Duration(_) => {
                let part = |k: &str| {
                    json.get(k)
                        .and_then(Json::as_u64)
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            format!(
                                "{}: expected {{\"months\", \"days\", \"millis\"}}, each a 32-bit count",
                                at(path)
                            )
                        })
                };
                Value::Duration(apache_avro::Duration::new(
                    apache_avro::Months::new(part("months")?),
                    apache_avro::Days::new(part("days")?),
                    apache_avro::Millis::new(part("millis")?),
                ))
            }
            Schema::Array(a) => match json {
                Json::Array(items) => Value::Array(
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, v)| self.value_of(v, &a.items, &format!("{path}[{i}]")))
                        .collect::<Result<_, _>>()?,
                ),
                _ => return wrong("an array"),
            },
            Schema::Map(m) => match json {
                Json::Object(entries) => Value::Map(
                    entries
                        .iter()
                        .map(|(k, v)| {
                            Ok((
                                k.clone(),
                                self.value_of(v, &m.types, &format!("{path}.{k}"))?,
                            ))
                        })
                        .collect::<Result<_, String>>()?,
                ),
                _ => return wrong("an object (an Avro map)"),
            },
            Schema::Union(u) => self.union_from_json(json, u, path)?,
            Schema::Record(r) => self.record_from_json(json, r, path)?,
            Schema::Ref { .. } => unreachable!("resolved above"),
        })
    }

    fn union_from_json(&self, json: &Json, u: &UnionSchema, path: &str) -> Result<Value, String> {
        let mut first_error = None;
        for (i, branch) in u.variants().iter().enumerate() {
            match self.value_of(json, branch, path) {
                Ok(v) => return Ok(Value::Union(i as u32, Box::new(v))),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        // Avro's JSON encoding: {"<branch type>": value}.
        if let Json::Object(m) = json
            && m.len() == 1
            && let Some((tag, inner)) = m.iter().next()
        {
            for (i, branch) in u.variants().iter().enumerate() {
                if branch_name(branch) == *tag {
                    let v = self.value_of(inner, branch, path)?;
                    return Ok(Value::Union(i as u32, Box::new(v)));
                }
            }
        }
        Err(format!(
            "{}: {} fits no branch of the union [{}] (first branch's reason: {})",
            at(path),
            json_kind(json),
            u.variants()
                .iter()
                .map(branch_name)
                .collect::<Vec<_>>()
                .join(", "),
            first_error.unwrap_or_default()
        ))
    }

    fn record_from_json(&self, json: &Json, r: &RecordSchema, path: &str) -> Result<Value, String> {
        let Json::Object(given) = json else {
            return Err(format!(
                "{}: expected an object (record {}), got {}",
                at(path),
                r.name,
                json_kind(json)
            ));
        };
        if let Some(unknown) = given
            .keys()
            .find(|k| !r.fields.iter().any(|f| &f.name == *k))
        {
            return Err(format!(
                "{}: field {unknown:?} is not in record {} (its fields: {})",
                at(path),
                r.name,
                r.fields
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let mut fields = Vec::with_capacity(r.fields.len());
        for f in &r.fields {
            let here = format!("{path}.{}", f.name);
            let v = match (given.get(&f.name), &f.default) {
                (Some(v), _) => self.value_of(v, &f.schema, &here)?,
                (None, Some(default)) => {
                    // A union's default is for its first branch.
                    match self.resolve(&f.schema)? {
                        Schema::Union(u) => {
                            let first = u.variants().first().ok_or("an empty union")?;
                            Value::Union(0, Box::new(self.value_of(default, first, &here)?))
                        }
                        s => self.value_of(default, s, &here)?,
                    }
                }
                (None, None) => {
                    return Err(format!(
                        "{}: field {:?} of record {} is missing and has no default",
                        at(path),
                        f.name,
                        r.name
                    ));
                }
            };
            fields.push((f.name.clone(), v));
        }
        Ok(Value::Record(fields))
    }
}

/// Whether `s` is or holds (not through a named reference) a big-decimal.
fn has_big_decimal(s: &Schema) -> bool {
    match s {
        Schema::BigDecimal => true,
        Schema::Array(a) => has_big_decimal(&a.items),
        Schema::Map(m) => has_big_decimal(&m.types),
        Schema::Union(u) => u.variants().iter().any(has_big_decimal),
        Schema::Record(r) => r.fields.iter().any(|f| has_big_decimal(&f.schema)),
        _ => false,
    }
}

fn at(path: &str) -> String {
    if path.is_empty() {
        "the value".to_owned()
    } else {
        format!("`{}`", path.trim_start_matches('.'))
    }
}

fn write_float(out: &mut Vec<u8>, f: f64) -> Result<(), String> {
    let json = match Number::from_f64(f) {
        Some(n) => Json::Number(n),
        None if f.is_nan() => Json::String("NaN".into()),
        None if f > 0.0 => Json::String("Infinity".into()),
        None => Json::String("-Infinity".into()),
    };
    serde_json::to_writer(out, &json).map_err(|e| e.to_string())
}

fn number(json: &Json) -> Option<f64> {
    match json {
        Json::Number(n) => n.as_f64(),
        Json::String(s) => match s.as_str() {
            "NaN" => Some(f64::NAN),
            "Infinity" => Some(f64::INFINITY),
            "-Infinity" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

fn base64(json: &Json, path: &str) -> Result<Vec<u8>, String> {
    match json {
        Json::String(s) => BASE64
            .decode(s)
            .map_err(|e| format!("{}: not base64 bytes: {e}", at(path))),
        other => Err(format!(
            "{}: expected base64 bytes, got {}",
            at(path),
            json_kind(other)
        )),
    }
}

/// `unscaled` with `scale` digits after the point: 1234, 2 -> "12.34".
fn decimal_text(unscaled: &BigInt, scale: usize) -> String {
    let negative = unscaled.sign() == num_bigint::Sign::Minus;
    let digits = unscaled.magnitude().to_string();
    let digits = if digits.len() <= scale {
        format!("{}{digits}", "0".repeat(scale + 1 - digits.len()))
    } else {
        digits
    };
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if negative { "-" } else { "" };
    if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

/// "12.34" at scale 2 -> 1234; more fraction digits than the scale is an
/// error (never rounded).
fn decimal_unscaled(text: &str, scale: usize) -> Result<BigInt, String> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
    {
        return Err("not a decimal number (digits, one optional point)".to_owned());
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > scale {
        return Err(format!(
            "has more than the schema's {scale} digits after the point"
        ));
    }
    let digits = format!("{int}{frac}{}", "0".repeat(scale - frac.len()));
    let n = BigInt::from_str(if digits.is_empty() { "0" } else { &digits })
        .map_err(|e| e.to_string())?;
    Ok(if negative { -n } else { n })
}

fn json_kind(json: &Json) -> String {
    match json {
        Json::Null => "null".to_owned(),
        Json::Bool(b) => format!("the boolean {b}"),
        Json::Number(n) => format!("the number {n}"),
        Json::String(s) if s.len() <= 40 => format!("the string {s:?}"),
        Json::String(_) => "a string".to_owned(),
        Json::Array(_) => "an array".to_owned(),
        Json::Object(_) => "an object".to_owned(),
    }
}

fn kind_of(v: &Value) -> String {
    let debug = format!("{v:?}");
    debug.split('(').next().unwrap_or("?").to_owned()
}

/// A union branch's name in Avro's JSON encoding.
fn branch_name(s: &Schema) -> String {
    match s {
        Schema::Record(r) => r.name.fullname(None),
        Schema::Enum(e) => e.name.fullname(None),
        Schema::Fixed(f) => f.name.fullname(None),
        Schema::Ref { name } => name.fullname(None),
        other => short(other).trim_matches('"').to_owned(),
    }
}

/// A schema's type in a few words, for messages.
fn short(s: &Schema) -> String {
    let text = s.canonical_form();
    if text.len() <= 60 {
        text
    } else {
        format!("{}…", &text[..text.floor_char_boundary(60)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAYMENT: &str = r#"{"type":"record","name":"Payment","namespace":"demo",
        "fields":[{"name":"account","type":"string"},{"name":"amount","type":"long"},
        {"name":"note","type":["null","string"],"default":null},
        {"name":"price","type":{"type":"bytes","logicalType":"decimal","precision":9,"scale":2}},
        {"name":"raw","type":"bytes","default":""},
        {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["CREDIT","DEBIT"]}},
        {"name":"tags","type":{"type":"map","values":"int"},"default":{}}]}"#;

    #[test]
    fn a_value_goes_to_avro_and_back_as_the_same_json() {
        let s = AvroSchema::parse(PAYMENT).unwrap();
        let json = br#"{"account":"ana","amount":-5,"note":"hi","price":"-12.30","raw":"AAE=","kind":"DEBIT","tags":{"b":2,"a":1}}"#;
        let datum = s.encode(json).unwrap();
        let back: Json = serde_json::from_slice(&s.decode(&datum, None).unwrap()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"account":"ana","amount":-5,"note":"hi","price":"-12.30",
                "raw":"AAE=","kind":"DEBIT","tags":{"a":1,"b":2}})
        );
    }

    #[test]
    fn records_keep_the_schemas_field_order() {
        let s = AvroSchema::parse(PAYMENT).unwrap();
        let datum = s
            .encode(
                br#"{"kind":"CREDIT","price":"1","amount":2,"account":"z","tags":{"b":1,"a":2}}"#,
            )
            .unwrap();
        assert_eq!(
            String::from_utf8(s.decode(&datum, None).unwrap()).unwrap(),
            r#"{"account":"z","amount":2,"note":null,"price":"1.00","raw":"","kind":"CREDIT","tags":{"a":2,"b":1}}"#
        );
    }

    #[test]
    fn defaults_fill_missing_fields_and_wrapped_unions_are_taken() {
        let s = AvroSchema::parse(PAYMENT).unwrap();
        let datum = s
            .encode(br#"{"account":"b","amount":1,"price":"0.5","kind":"CREDIT","note":{"string":"x"}}"#)
            .unwrap();
        let back: Json = serde_json::from_slice(&s.decode(&datum, None).unwrap()).unwrap();
        assert_eq!(back["price"], "0.50");
        assert_eq!(back["note"], "x");
        assert_eq!(back["raw"], "");
        assert_eq!(back["tags"], serde_json::json!({}));
    }

    #[test]
    fn a_value_that_does_not_fit_says_where() {
        let s = AvroSchema::parse(PAYMENT).unwrap();
        let e = s
            .encode(br#"{"account":"ana","amount":"5","price":"1","kind":"CREDIT"}"#)
            .unwrap_err();
        assert!(
            e.contains("`amount`: expected a 64-bit integer, got the string \"5\""),
            "{e}"
        );
        let e = s
            .encode(br#"{"account":"ana","amount":5,"price":"1.234","kind":"CREDIT"}"#)
            .unwrap_err();
        assert!(e.contains("`price`") && e.contains("2 digits"), "{e}");
        let e = s
            .encode(br#"{"account":"ana","amount":5,"price":"1","kind":"REFUND"}"#)
            .unwrap_err();
        assert!(
            e.contains("\"REFUND\" is not a symbol of enum demo.Kind"),
            "{e}"
        );
        let e = s
            .encode(br#"{"account":"ana","amonut":5,"price":"1","kind":"CREDIT"}"#)
            .unwrap_err();
        assert!(
            e.contains("field \"amonut\" is not in record demo.Payment"),
            "{e}"
        );
        let e = s
            .encode(br#"{"account":"ana","price":"1","kind":"CREDIT"}"#)
            .unwrap_err();
        assert!(
            e.contains("\"amount\" of record demo.Payment is missing"),
            "{e}"
        );
    }

    #[test]
    fn a_datum_of_another_schema_is_refused() {
        let s = AvroSchema::parse(PAYMENT).unwrap();
        assert!(s.decode(b"\x01\x02\x03", None).is_err());
        let datum = s
            .encode(br#"{"account":"ana","amount":5,"price":"1","kind":"CREDIT"}"#)
            .unwrap();
        let mut longer = datum.clone();
        longer.push(0);
        let e = s.decode(&longer, None).unwrap_err();
        assert!(e.contains("1 bytes left"), "{e}");
    }

    #[test]
    fn a_reader_schema_adds_a_field_with_its_default() {
        let writer = AvroSchema::parse(
            r#"{"type":"record","name":"Balance","fields":[{"name":"account","type":"string"},{"name":"balance","type":"long"}]}"#,
        )
        .unwrap();
        let reader = AvroSchema::parse(
            r#"{"type":"record","name":"Balance","fields":[{"name":"account","type":"string"},{"name":"balance","type":"long"},{"name":"currency","type":"string","default":"EUR"}]}"#,
        )
        .unwrap();
        let datum = writer.encode(br#"{"account":"a","balance":3}"#).unwrap();
        let back: Json =
            serde_json::from_slice(&writer.decode(&datum, Some(&reader)).unwrap()).unwrap();
        assert_eq!(
            back,
            serde_json::json!({"account":"a","balance":3,"currency":"EUR"})
        );
    }

    #[test]
    fn an_array_of_items_without_bytes_is_refused() {
        for items in [
            r#""null""#,
            r#"{"type":"record","name":"E","fields":[]}"#,
            r#"{"type":"fixed","name":"F","size":0}"#,
        ] {
            let text = format!(
                r#"{{"type":"record","name":"R","fields":[{{"name":"xs","type":{{"type":"array","items":{items}}}}}]}}"#
            );
            let e = AvroSchema::parse(&text).unwrap_err();
            assert!(e.contains("items take no bytes"), "{items}: {e}");
        }
        // A recursive list ends in a union: one byte per item.
        AvroSchema::parse(
            r#"{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"]},
               {"name":"xs","type":{"type":"array","items":"int"}}]}"#,
        )
        .unwrap();
    }

    #[test]
    fn a_length_past_what_a_record_can_hold_is_refused_without_allocating_it() {
        let s = AvroSchema::parse(r#""string""#).unwrap();
        // A string claiming 2^40 bytes, in 6 bytes.
        let e = s.decode(b"\x80\x80\x80\x80\x80\x40", None).unwrap_err();
        assert!(e.contains("not an Avro datum"), "{e}");
    }

    /// Every type the fast path reads and writes, against apache-avro's
    /// own encoding and decoding of the same values.
    const EVERYTHING: &str = r#"{"type":"record","name":"All","namespace":"t","fields":[
        {"name":"n","type":"null"},{"name":"b","type":"boolean"},{"name":"i","type":"int"},
        {"name":"l","type":"long"},{"name":"f","type":"float"},{"name":"d","type":"double"},
        {"name":"by","type":"bytes"},{"name":"s","type":"string"},
        {"name":"fx","type":{"type":"fixed","name":"F4","size":4}},
        {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B","C"]}},
        {"name":"u","type":["null","string",{"type":"record","name":"Inner","fields":[{"name":"x","type":"int"}]}]},
        {"name":"a","type":{"type":"array","items":"Inner"}},
        {"name":"m","type":{"type":"map","values":["null","long"]}},
        {"name":"dec","type":{"type":"bytes","logicalType":"decimal","precision":12,"scale":3}},
        {"name":"decf","type":{"type":"fixed","name":"D8","size":8,"logicalType":"decimal","precision":12,"scale":2}},
        {"name":"date","type":{"type":"int","logicalType":"date"}},
        {"name":"ts","type":{"type":"long","logicalType":"timestamp-micros"}},
        {"name":"uuid","type":{"type":"string","logicalType":"uuid"}},
        {"name":"dur","type":{"type":"fixed","name":"Dur","size":12,"logicalType":"duration"}},
        {"name":"next","type":["null","All"],"default":null}]}"#;

    const EVERYTHING_VALUE: &str = r#"{"n":null,"b":true,"i":-7,"l":9007199254740993,"f":1.5,
        "d":-2.25,"by":"AAEC/w==","s":"é\u0000\"x","fx":"AQIDBA==","e":"C",
        "u":{"x":3},"a":[{"x":1},{"x":-1}],"m":{"z":null,"a":5},"dec":"-123456.789",
        "decf":"-0.05","date":19000,"ts":-1,"uuid":"67e55044-10b1-426f-9247-bb680e5fe0c8",
        "dur":{"months":1,"days":2,"millis":3},
        "next":{"n":null,"b":false,"i":0,"l":0,"f":0,"d":0,"by":"","s":"","fx":"AAAAAA==","e":"A",
        "u":null,"a":[],"m":{},"dec":"0","decf":"0","date":0,"ts":0,
        "uuid":"00000000-0000-0000-0000-000000000000","dur":{"months":0,"days":0,"millis":0}}}"#;

    #[test]
    fn the_fast_path_writes_and_reads_what_apache_avro_does() {
        let s = AvroSchema::parse(EVERYTHING).unwrap();
        let json: Json = serde_json::from_str(EVERYTHING_VALUE).unwrap();
        let value = s.value_of(&json, &s.schema, "").unwrap();
        let mut ours = Vec::new();
        s.write(&value, &s.schema, &mut ours).unwrap();
        let mut theirs = Vec::new();
        apache_avro::writer::datum::GenericDatumWriter::builder(&s.schema)
            .build()
            .and_then(|w| w.write_value(&mut theirs, value.clone()))
            .unwrap();
        // Maps may be written in any order: the decodings must agree.
        assert_eq!(ours.len(), theirs.len());
        let fast = String::from_utf8(s.read_json(&ours).unwrap()).unwrap();
        let generic = String::from_utf8(s.decode_generic(&theirs, None).unwrap()).unwrap();
        assert_eq!(fast, generic);
        let again: Json = serde_json::from_str(&fast).unwrap();
        assert_eq!(again["m"], serde_json::json!({"a": 5, "z": null}));
        assert_eq!(again["dec"], "-123456.789");
        assert_eq!(again["decf"], "-0.05");
        assert_eq!(again["l"], 9007199254740993_i64);
        assert_eq!(
            again["next"]["uuid"],
            "00000000-0000-0000-0000-000000000000"
        );
        // And what it reads, it writes back to the same bytes.
        assert_eq!(s.encode(fast.as_bytes()).unwrap(), ours);
    }

    #[test]
    fn garbage_is_refused_without_a_panic_and_nesting_is_bounded() {
        let s = AvroSchema::parse(EVERYTHING).unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        for len in 0..2000 {
            let bytes: Vec<u8> = (0..len % 97)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect();
            let _ = s.decode(&bytes, None);
        }
        let list = AvroSchema::parse(
            r#"{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]}]}"#,
        )
        .unwrap();
        // 200 levels: branch 1 (L) 200 times, then branch 0 (null).
        let mut deep = vec![2u8; 200];
        deep.push(0);
        let e = list.decode(&deep, None).unwrap_err();
        assert!(e.contains("nested deeper than 128"), "{e}");
        let mut shallow = vec![2u8; 100];
        shallow.push(0);
        list.decode(&shallow, None).unwrap();
    }

    #[test]
    fn decimals_are_exact() {
        assert_eq!(decimal_text(&BigInt::from(1234), 2), "12.34");
        assert_eq!(decimal_text(&BigInt::from(-5), 3), "-0.005");
        assert_eq!(decimal_text(&BigInt::from(7), 0), "7");
        assert_eq!(decimal_unscaled("12.34", 2).unwrap(), BigInt::from(1234));
        assert_eq!(decimal_unscaled("-0.5", 3).unwrap(), BigInt::from(-500));
        assert_eq!(decimal_unscaled("3", 1).unwrap(), BigInt::from(30));
        assert!(decimal_unscaled("1e5", 0).is_err());
        assert!(decimal_unscaled("1.25", 1).is_err());
    }
}
