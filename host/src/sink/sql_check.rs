//! The statement of a `sql` route, checked when the configuration is read
//! (`onceflow sink postgres` start, and `onceflow deploy` on the fleet),
//! before any database sees it.
//!
//! A route's statement is **one parameterised DML statement**: `INSERT`
//! (with `ON CONFLICT`), `UPDATE` or `DELETE`, optionally under `WITH`. It is
//! parsed with `sqlparser`'s PostgreSQL dialect and refused, with the
//! construct named, when it is:
//!
//! - several statements (`...; ...`);
//! - anything but DML: DDL (`CREATE`, `DROP`, `ALTER`, `TRUNCATE`, ...),
//!   `COPY`, `DO`, `CALL`, `SET`, `GRANT`, a bare `SELECT`, ...;
//! - a call of a function outside [`ALLOWED_FUNCTIONS`] (a function that
//!   reads files, large objects, locks, the clock or the sessions; one of
//!   the tenant's own), or a table function outside
//!   [`ALLOWED_TABLE_FUNCTIONS`], or a function qualified with a schema
//!   other than `pg_catalog`;
//! - a reference to the server's catalogs (`pg_*`, `information_schema`)
//!   or to Onceflow's own tables (`onceflow_sink_*`);
//! - a user-defined operator (`OPERATOR(schema.op)`).
//!
//! This is the first wall, not the only one: the statement runs under the
//! tenant's role, which has no privilege on Onceflow's tables, on other
//! tenants' schemas or on the server's files and programs (`db/roles.rs`).
//!
//! The allowlist keeps a retried batch computing what the first try did:
//! no clock (`now()`), no randomness, no sequences.

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr, FunctionArguments, ObjectName, SetExpr, Statement, TableFactor, Visit,
    Visitor,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, Tokenizer};

/// The functions a route's statement may call (docs/sink.md): plain value
/// functions on text, numbers, JSON and dates, deterministic in their
/// arguments.
pub const ALLOWED_FUNCTIONS: &[&str] = &[
    // null handling and choice
    "coalesce",
    "nullif",
    "greatest",
    "least",
    // text
    "lower",
    "upper",
    "trim",
    "btrim",
    "ltrim",
    "rtrim",
    "length",
    "char_length",
    "substr",
    "substring",
    "replace",
    "concat",
    "concat_ws",
    "left",
    "right",
    "lpad",
    "rpad",
    "split_part",
    "starts_with",
    // numbers
    "abs",
    "round",
    "trunc",
    "floor",
    "ceil",
    "ceiling",
    "mod",
    "sign",
    // JSON
    "jsonb_build_object",
    "jsonb_build_array",
    "to_jsonb",
    "jsonb_extract_path",
    "jsonb_extract_path_text",
    "jsonb_typeof",
    "jsonb_strip_nulls",
    // dates from values (never the clock)
    "to_timestamp",
    "to_date",
    "make_date",
    "make_timestamp",
    "make_timestamptz",
    "date_trunc",
    "date_part",
];

/// The table functions a route's statement may read from (`FROM f(...)`).
pub const ALLOWED_TABLE_FUNCTIONS: &[&str] = &[
    "jsonb_array_elements",
    "jsonb_array_elements_text",
    "jsonb_to_record",
    "jsonb_to_recordset",
    "jsonb_populate_record",
    "jsonb_populate_recordset",
    "unnest",
];

/// Why a route's statement is refused; each names the construct.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SqlRefusal {
    /// No statement at all.
    #[error("is empty: give one INSERT, UPDATE or DELETE statement")]
    Empty,
    /// More than one statement.
    #[error(
        "holds {0} statements: a route runs one INSERT, UPDATE or DELETE statement (remove the \
         `;` and what follows)"
    )]
    Several(usize),
    /// Not DML.
    #[error(
        "{0} is not allowed: a route runs one INSERT, UPDATE or DELETE statement (ON CONFLICT \
         allowed); create tables and functions outside the sink, as the database's operator"
    )]
    NotDml(String),
    /// The parser did not understand it.
    #[error("does not parse as PostgreSQL ({0}): give one INSERT, UPDATE or DELETE statement")]
    Parse(String),
    /// A function outside the allowlist.
    #[error(
        "calls the function {0}, which a route may not call: allowed are {list} (docs/sink.md, \
         \"sql routes\")",
        list = ALLOWED_FUNCTIONS.join(", ")
    )]
    Function(String),
    /// A table function outside the allowlist.
    #[error(
        "reads from the table function {0}, which a route may not call: allowed are {list}",
        list = ALLOWED_TABLE_FUNCTIONS.join(", ")
    )]
    TableFunction(String),
    /// A catalog or Onceflow's own tables.
    #[error("refers to {0}, {1}: a route reads and writes the tenant's own tables only")]
    Relation(String, &'static str),
    /// `OPERATOR(schema.op)`.
    #[error("uses the operator {0}: a route may use PostgreSQL's built-in operators only")]
    Operator(String),
}

/// Checks a `sql` route's statement.
pub fn check(sql: &str) -> Result<(), SqlRefusal> {
    let dialect = PostgreSqlDialect {};
    // Statements are counted on the tokens first: `...; DO $$ ... $$` is
    // "two statements" even where the second does not parse.
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| SqlRefusal::Parse(e.to_string()))?;
    let mut statements = 0;
    let mut in_statement = false;
    let mut first_words = Vec::new();
    for t in &tokens {
        match t {
            Token::SemiColon => in_statement = false,
            Token::Whitespace(_) => {}
            other => {
                if !in_statement {
                    statements += 1;
                    in_statement = true;
                    if let Token::Word(w) = other {
                        first_words.push(w.value.to_ascii_uppercase());
                    } else {
                        first_words.push(other.to_string());
                    }
                }
            }
        }
    }
    match statements {
        0 => return Err(SqlRefusal::Empty),
        1 => {}
        n => return Err(SqlRefusal::Several(n)),
    }
    let first = first_words.first().cloned().unwrap_or_default();
    let parsed = match Parser::parse_sql(&dialect, sql) {
        Ok(p) => p,
        Err(e) => {
            return Err(
                if ["INSERT", "UPDATE", "DELETE", "WITH"].contains(&first.as_str()) {
                    SqlRefusal::Parse(e.to_string())
                } else {
                    SqlRefusal::NotDml(first)
                },
            );
        }
    };
    let [statement] = parsed.as_slice() else {
        return Err(SqlRefusal::Several(parsed.len()));
    };
    if !is_dml(statement) {
        return Err(SqlRefusal::NotDml(construct(statement)));
    }
    match statement.visit(&mut Checker) {
        ControlFlow::Break(refusal) => Err(refusal),
        ControlFlow::Continue(()) => Ok(()),
    }
}

fn is_dml(s: &Statement) -> bool {
    match s {
        Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => true,
        // `WITH ... INSERT/UPDATE/DELETE`.
        Statement::Query(q) => matches!(
            q.body.as_ref(),
            SetExpr::Insert(_) | SetExpr::Update(_) | SetExpr::Delete(_)
        ),
        _ => false,
    }
}

/// The leading keywords of a statement (`DROP TABLE`, `COPY`, `CREATE OR
/// REPLACE FUNCTION`).
fn construct(s: &Statement) -> String {
    let text = s.to_string();
    let words: Vec<&str> = text
        .split_whitespace()
        .take_while(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .take(4)
        .collect();
    if words.is_empty() {
        text.chars().take(20).collect()
    } else {
        words.join(" ")
    }
}

/// The last part of a name, lowercased (unquoted names fold to lower case
/// in PostgreSQL; a quoted one compared in lower case is refused more
/// often, never less), and its schema if qualified.
fn parts(name: &ObjectName) -> (Option<String>, String) {
    let idents: Vec<String> = name
        .0
        .iter()
        .map(|p| match p.as_ident() {
            Some(i) => i.value.to_ascii_lowercase(),
            None => p.to_string().to_ascii_lowercase(),
        })
        .collect();
    let last = idents.last().cloned().unwrap_or_default();
    let schema = (idents.len() > 1).then(|| idents[idents.len() - 2].clone());
    (schema, last)
}

struct Checker;

impl Checker {
    fn function(&self, name: &ObjectName, allowed: &[&str]) -> Result<(), String> {
        let (schema, last) = parts(name);
        let schema_ok = schema.as_deref().is_none_or(|s| s == "pg_catalog");
        if schema_ok && allowed.contains(&last.as_str()) {
            Ok(())
        } else {
            Err(name.to_string())
        }
    }
}

impl Visitor for Checker {
    type Break = SqlRefusal;

    fn pre_visit_statement(&mut self, s: &Statement) -> ControlFlow<SqlRefusal> {
        // Nested statements (data-modifying CTEs) are DML too.
        if is_dml(s) {
            ControlFlow::Continue(())
        } else {
            ControlFlow::Break(SqlRefusal::NotDml(construct(s)))
        }
    }

    fn pre_visit_relation(&mut self, name: &ObjectName) -> ControlFlow<SqlRefusal> {
        let (schema, last) = parts(name);
        let refused = match schema.as_deref() {
            Some(s) if s.starts_with("pg_") || s == "information_schema" => {
                Some("the server's catalog")
            }
            _ if last.starts_with("pg_") => Some("the server's catalog"),
            _ if last.starts_with("onceflow_sink_") => Some("Onceflow's own table"),
            _ => None,
        };
        match refused {
            Some(what) => ControlFlow::Break(SqlRefusal::Relation(name.to_string(), what)),
            None => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<SqlRefusal> {
        let refused = match t {
            TableFactor::Table {
                name,
                args: Some(_),
                ..
            } => self.function(name, ALLOWED_TABLE_FUNCTIONS).err(),
            TableFactor::Function { name, .. } => {
                self.function(name, ALLOWED_TABLE_FUNCTIONS).err()
            }
            TableFactor::TableFunction { expr, .. } => Some(expr.to_string()),
            TableFactor::UNNEST { .. }
            | TableFactor::Table { .. }
            | TableFactor::Derived { .. }
            | TableFactor::NestedJoin { .. } => None,
            other => Some(other.to_string()),
        };
        match refused {
            Some(f) => ControlFlow::Break(SqlRefusal::TableFunction(f)),
            None => ControlFlow::Continue(()),
        }
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<SqlRefusal> {
        match e {
            Expr::Function(f) => {
                if let Err(name) = self.function(&f.name, ALLOWED_FUNCTIONS) {
                    return ControlFlow::Break(SqlRefusal::Function(name));
                }
                // `f(...) WITHIN GROUP`, `OVER`: aggregates and windows are
                // not in the allowlist; a parameter list is a plain call.
                if !matches!(f.parameters, FunctionArguments::None) || f.over.is_some() {
                    return ControlFlow::Break(SqlRefusal::Function(f.to_string()));
                }
                ControlFlow::Continue(())
            }
            Expr::BinaryOp {
                op: op @ BinaryOperator::PGCustomBinaryOperator(_),
                ..
            } => ControlFlow::Break(SqlRefusal::Operator(op.to_string())),
            _ => ControlFlow::Continue(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(sql: &str) -> String {
        check(sql).expect_err(sql).to_string()
    }

    #[test]
    fn dml_with_parameters_and_allowed_functions_passes() {
        for sql in [
            "INSERT INTO audit (payment_id, account, amount) VALUES ($1, lower($2), $3::bigint)",
            "INSERT INTO acme.balances (account, balance) VALUES ($1, $2) \
             ON CONFLICT (account) DO UPDATE SET balance = greatest(balances.balance, EXCLUDED.balance)",
            "UPDATE balances SET balance = balance + coalesce($2, 0) WHERE account = $1",
            "DELETE FROM balances WHERE account = $1",
            "INSERT INTO t (a, b) SELECT r.a, r.b FROM jsonb_to_record($1::jsonb) AS r(a text, b int)",
            "WITH x AS (SELECT $1::text AS a) INSERT INTO t (a) SELECT a FROM x",
            "INSERT INTO t (j) VALUES (jsonb_build_object('k', $1::text))",
            "INSERT INTO t (s) VALUES ('a;b' || $1)",
        ] {
            assert_eq!(check(sql), Ok(()), "{sql}");
        }
    }

    #[test]
    fn each_refusal_names_the_construct() {
        let cases: &[(&str, &str)] = &[
            ("DROP TABLE acme.balances", "DROP TABLE is not allowed"),
            ("CREATE TABLE x (a int)", "CREATE TABLE is not allowed"),
            ("TRUNCATE acme.balances", "TRUNCATE"),
            ("ALTER TABLE t ADD COLUMN c int", "ALTER TABLE"),
            (
                "COPY (SELECT 1) TO PROGRAM 'touch /tmp/x'",
                "COPY is not allowed",
            ),
            ("DO $$ BEGIN PERFORM 1; END $$", "DO is not allowed"),
            ("SELECT $1::int", "SELECT is not allowed"),
            ("SET ROLE acme", "SET"),
            ("GRANT ALL ON t TO evil", "GRANT"),
            ("CALL p($1)", "CALL"),
            (
                "INSERT INTO t VALUES ($1); DROP TABLE t",
                "holds 2 statements",
            ),
            (
                "INSERT INTO t VALUES ($1); DO $$ BEGIN END $$",
                "holds 2 statements",
            ),
            (
                "INSERT INTO t (s) SELECT pg_read_file('/etc/passwd') WHERE $1 IS NOT NULL",
                "the function pg_read_file",
            ),
            (
                "INSERT INTO t (n) SELECT pg_advisory_lock(7245821) WHERE $1 IS NOT NULL",
                "the function pg_advisory_lock",
            ),
            (
                "INSERT INTO t (n) SELECT lo_import('/etc/passwd') WHERE $1 IS NOT NULL",
                "the function lo_import",
            ),
            ("INSERT INTO t (ts) VALUES (now())", "the function now"),
            (
                "INSERT INTO t (s) SELECT string_agg(a, ',') FROM x WHERE $1 IS NOT NULL",
                "the function string_agg",
            ),
            (
                "INSERT INTO t (s) VALUES (evil.f($1))",
                "the function evil.f",
            ),
            (
                "INSERT INTO t (s) VALUES (public.lower($1))",
                "the function public.lower",
            ),
            (
                "INSERT INTO t (s) SELECT application_name FROM pg_stat_activity WHERE $1 IS NOT NULL",
                "pg_stat_activity, the server's catalog",
            ),
            (
                "INSERT INTO t (s) SELECT table_name FROM information_schema.tables",
                "information_schema.tables, the server's catalog",
            ),
            (
                "UPDATE onceflow_sink_progress SET next_offset = 1000001 WHERE sink LIKE 'acme.%'",
                "onceflow_sink_progress, Onceflow's own table",
            ),
            (
                "DELETE FROM public.onceflow_sink_markers WHERE $1 IS NOT NULL",
                "Onceflow's own table",
            ),
            (
                "INSERT INTO t (n) SELECT x FROM generate_series(1, 10) AS x",
                "the table function generate_series",
            ),
            (
                "INSERT INTO t (n) VALUES ($1 OPERATOR(evil.+) 1)",
                "the operator OPERATOR(evil.+)",
            ),
            (
                "WITH x AS (SELECT pg_sleep(100)) INSERT INTO t SELECT 1 FROM x",
                "the function pg_sleep",
            ),
            ("", "is empty"),
        ];
        for (sql, expected) in cases {
            let e = refused(sql);
            assert!(e.contains(expected), "{sql}: {e}");
        }
    }
}
