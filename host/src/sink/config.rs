//! `sink.toml`: which topics a sink reads, how each record becomes rows, and
//! where the database is. Parsing is strict, as for `onceflow.toml`: an
//! unknown key is an error that names it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::SinkError;

/// A sink's configuration, checked.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The sink's name: its consumer group is `onceflow-sink-<name>`, and its
    /// rows in the progress and marker tables carry it.
    pub name: String,
    /// Where the database is and how to log in.
    pub postgres: PostgresConfig,
    /// The topics and what each record becomes.
    pub routes: Vec<Route>,
    /// Where records that cannot be applied go (with the reason in headers).
    pub dead_letter_topic: String,
    /// At most this many records per database transaction.
    pub max_batch_records: usize,
    /// A batch is applied after at most this long, full or not.
    pub max_batch_wait_ms: u64,
    /// Markers older than this are deleted (see docs/sink.md, "Replays").
    pub marker_retention: std::time::Duration,
    /// The consumer group, when not `onceflow-sink-<name>` (a tenant's sink
    /// on the fleet: `<tenant>.<name>`, in the tenant's namespace).
    pub group: Option<String>,
}

/// The database connection, without a password in clear.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// A libpq-style connection string (`host=... port=... user=...
    /// dbname=...`) with no `password`.
    pub connection: String,
    /// A file holding the password (first line), if the server wants one;
    /// else the `PGPASSWORD` environment variable, if set.
    pub password_file: Option<PathBuf>,
    /// The schema of the sink's own tables (`onceflow_sink_progress`,
    /// `onceflow_sink_markers`, `onceflow_sink_dead_letters`).
    pub schema: String,
    /// The role the routes' statements run under (`SET LOCAL ROLE`), with
    /// its schema first on the `search_path`; `None`: the connection's user
    /// (a sink of the operator's own). On the fleet, the tenant's role
    /// (`db/roles.rs`).
    pub role: Option<String>,
    /// The tenant whose role `role` is (on the fleet), for messages.
    pub tenant: Option<String>,
}

/// One topic and what its records become.
#[derive(Debug, Clone)]
pub struct Route {
    /// The topic read (read_committed).
    pub topic: String,
    /// What a record does to the database.
    pub apply: Apply,
    /// What identifies a record's effect in the marker table.
    pub identity: Identity,
}

/// What a record does to the database.
#[derive(Debug, Clone)]
pub enum Apply {
    /// `INSERT ... ON CONFLICT (key) DO UPDATE`: the value's JSON fields named
    /// like the table's columns; a null value (tombstone) deletes the row
    /// whose single key column equals the record key.
    Upsert {
        /// The table (optionally `schema.table`).
        table: String,
        /// The columns written, from the JSON fields of the same name.
        columns: Vec<String>,
        /// The conflict target: the table's primary key or a unique index.
        key: Vec<String>,
    },
    /// `INSERT`: one row per record; a unique violation sends the record to
    /// the dead-letter topic.
    Insert {
        /// The table.
        table: String,
        /// The columns written.
        columns: Vec<String>,
    },
    /// A parameterized statement run once per record.
    Sql {
        /// The statement, with `$1`, `$2`, ... .
        statement: String,
        /// What each parameter is: a JSON field of the value, or `$key`,
        /// `$topic`, `$partition`, `$offset`, `$value`.
        params: Vec<String>,
    },
}

/// What identifies a record's effect in the marker table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The record's position: `topic/partition/offset`.
    Position,
    /// A string or integer field of the JSON value (e.g. `payment_id`): the
    /// same event sent twice upstream is applied once.
    Field(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    name: String,
    postgres: RawPostgres,
    #[serde(default)]
    batch: RawBatch,
    dead_letter_topic: String,
    #[serde(default)]
    markers: RawMarkers,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawPostgres {
    connection: String,
    password_file: Option<PathBuf>,
    #[serde(default = "default_schema")]
    schema: String,
    role: Option<String>,
}

fn default_schema() -> String {
    "public".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawBatch {
    #[serde(default = "default_max_records")]
    max_records: usize,
    #[serde(default = "default_max_wait_ms")]
    max_wait_ms: u64,
}

impl Default for RawBatch {
    fn default() -> Self {
        Self {
            max_records: default_max_records(),
            max_wait_ms: default_max_wait_ms(),
        }
    }
}

fn default_max_records() -> usize {
    5000
}

fn default_max_wait_ms() -> u64 {
    100
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
#[derive(Default)]
struct RawMarkers {
    retention_hours: Option<u64>,
    /// Instead of `retention-hours`, for a retention under an hour.
    retention_minutes: Option<u64>,
}

/// The markers' retention when none is given: a week.
const DEFAULT_RETENTION_HOURS: u64 = 7 * 24;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRoute {
    topic: String,
    mode: String,
    table: Option<String>,
    columns: Option<Vec<String>>,
    key: Option<Vec<String>>,
    sql: Option<String>,
    params: Option<Vec<String>>,
    identity: Option<String>,
}

/// The special parameters of a `sql` route.
pub const SPECIAL_PARAMS: [&str; 5] = ["$key", "$topic", "$partition", "$offset", "$value"];

impl SinkConfig {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, SinkError> {
        let text = std::fs::read_to_string(path).map_err(|source| SinkError::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        // A relative password file is relative to the sink.toml.
        if let Some(f) = &mut config.postgres.password_file
            && f.is_relative()
        {
            *f = path.parent().unwrap_or(Path::new(".")).join(&*f);
        }
        Ok(config)
    }

    /// Parses and checks the text of `path`.
    pub fn parse(text: &str, path: &Path) -> Result<Self, SinkError> {
        let invalid = |key: &str, message: String| SinkError::Config {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| SinkError::Config {
            path: path.to_owned(),
            key: String::new(),
            message: e.to_string(),
        })?;
        if raw.name.is_empty()
            || !raw
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(invalid(
                "name",
                format!("{:?}: use letters, digits, '.', '_' and '-'", raw.name),
            ));
        }
        if has_password(&raw.postgres.connection) {
            return Err(invalid(
                "postgres.connection",
                "holds a password in clear: remove it and give `password-file` (a file \
                 readable by the sink only) or set PGPASSWORD in the sink's environment"
                    .to_owned(),
            ));
        }
        check_identifier(&raw.postgres.schema).map_err(|m| invalid("postgres.schema", m))?;
        if let Some(role) = &raw.postgres.role {
            check_identifier(role).map_err(|m| invalid("postgres.role", m))?;
        }
        if raw.batch.max_records == 0 || raw.batch.max_records > 100_000 {
            return Err(invalid(
                "batch.max-records",
                format!("{}: must be 1 to 100000", raw.batch.max_records),
            ));
        }
        if raw.batch.max_wait_ms == 0 || raw.batch.max_wait_ms > 60_000 {
            return Err(invalid(
                "batch.max-wait-ms",
                format!("{}: must be 1 to 60000", raw.batch.max_wait_ms),
            ));
        }
        let marker_retention = match (raw.markers.retention_hours, raw.markers.retention_minutes) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "markers.retention-minutes",
                    "give markers.retention-hours or markers.retention-minutes, not both"
                        .to_owned(),
                ));
            }
            (Some(0), None) => {
                return Err(invalid(
                    "markers.retention-hours",
                    "0 would delete every marker at once: give at least 1 (default 168, a week), \
                     or markers.retention-minutes"
                        .to_owned(),
                ));
            }
            (None, Some(0)) => {
                return Err(invalid(
                    "markers.retention-minutes",
                    "0 would delete every marker at once: give at least 1".to_owned(),
                ));
            }
            (hours, minutes) => std::time::Duration::from_secs(
                minutes.unwrap_or(hours.unwrap_or(DEFAULT_RETENTION_HOURS) * 60) * 60,
            ),
        };
        if raw.dead_letter_topic.is_empty() {
            return Err(invalid("dead-letter-topic", "is empty".to_owned()));
        }
        if raw.routes.is_empty() {
            return Err(invalid(
                "routes",
                "no [[routes]]: give at least one topic to sink".to_owned(),
            ));
        }
        let mut routes = Vec::new();
        for (i, r) in raw.routes.into_iter().enumerate() {
            let at = |k: &str| format!("routes[{i}].{k}");
            if r.topic.is_empty() {
                return Err(invalid(&at("topic"), "is empty".to_owned()));
            }
            if routes.iter().any(|o: &Route| o.topic == r.topic) {
                return Err(invalid(
                    &at("topic"),
                    format!("{:?} has two routes: one route per topic", r.topic),
                ));
            }
            if r.topic == raw.dead_letter_topic {
                return Err(invalid(
                    &at("topic"),
                    "is the dead-letter topic: a sink may not read what it writes".to_owned(),
                ));
            }
            let columns = |r: &RawRoute| -> Result<Vec<String>, SinkError> {
                let cols = r.columns.clone().ok_or_else(|| {
                    invalid(
                        &at("columns"),
                        "missing: name the columns written".to_owned(),
                    )
                })?;
                if cols.is_empty() {
                    return Err(invalid(&at("columns"), "is empty".to_owned()));
                }
                for c in &cols {
                    check_identifier(c).map_err(|m| invalid(&at("columns"), m))?;
                }
                Ok(cols)
            };
            let table = |r: &RawRoute| -> Result<String, SinkError> {
                let t = r.table.clone().ok_or_else(|| {
                    invalid(
                        &at("table"),
                        format!("missing: mode {:?} writes a table", r.mode),
                    )
                })?;
                check_table(&t).map_err(|m| invalid(&at("table"), m))?;
                Ok(t)
            };
            let unused = |r: &RawRoute, keys: &[(&str, bool)]| -> Result<(), SinkError> {
                for (k, present) in keys {
                    if *present {
                        return Err(invalid(
                            &at(k),
                            format!("not used by mode {:?}: remove it", r.mode),
                        ));
                    }
                }
                Ok(())
            };
            let apply = match r.mode.as_str() {
                "upsert" => {
                    unused(
                        &r,
                        &[("sql", r.sql.is_some()), ("params", r.params.is_some())],
                    )?;
                    let columns = columns(&r)?;
                    let key = r.key.clone().ok_or_else(|| {
                        invalid(
                            &at("key"),
                            "missing: name the columns of the table's primary key (or a \
                             unique index), the conflict target"
                                .to_owned(),
                        )
                    })?;
                    if key.is_empty() {
                        return Err(invalid(&at("key"), "is empty".to_owned()));
                    }
                    for k in &key {
                        if !columns.contains(k) {
                            return Err(invalid(
                                &at("key"),
                                format!("{k:?} is not one of `columns`: add it there"),
                            ));
                        }
                    }
                    Apply::Upsert {
                        table: table(&r)?,
                        columns,
                        key,
                    }
                }
                "insert" => {
                    unused(
                        &r,
                        &[
                            ("sql", r.sql.is_some()),
                            ("params", r.params.is_some()),
                            ("key", r.key.is_some()),
                        ],
                    )?;
                    Apply::Insert {
                        table: table(&r)?,
                        columns: columns(&r)?,
                    }
                }
                "sql" => {
                    unused(
                        &r,
                        &[
                            ("table", r.table.is_some()),
                            ("columns", r.columns.is_some()),
                            ("key", r.key.is_some()),
                        ],
                    )?;
                    let statement = r.sql.clone().ok_or_else(|| {
                        invalid(
                            &at("sql"),
                            "missing: mode \"sql\" runs a statement".to_owned(),
                        )
                    })?;
                    super::sql_check::check(&statement)
                        .map_err(|refusal| invalid(&at("sql"), refusal.to_string()))?;
                    let params = r.params.clone().unwrap_or_default();
                    for p in &params {
                        if p.starts_with('$') && !SPECIAL_PARAMS.contains(&p.as_str()) {
                            return Err(invalid(
                                &at("params"),
                                format!(
                                    "{p:?}: a parameter is a JSON field of the value or one of {}",
                                    SPECIAL_PARAMS.join(", ")
                                ),
                            ));
                        }
                    }
                    Apply::Sql { statement, params }
                }
                other => {
                    return Err(invalid(
                        &at("mode"),
                        format!("{other:?}: use \"upsert\", \"insert\" or \"sql\""),
                    ));
                }
            };
            let identity = match r.identity.as_deref() {
                None | Some("position") => Identity::Position,
                Some("") => return Err(invalid(&at("identity"), "is empty".to_owned())),
                Some(field) => Identity::Field(field.to_owned()),
            };
            routes.push(Route {
                topic: r.topic,
                apply,
                identity,
            });
        }
        Ok(SinkConfig {
            name: raw.name,
            postgres: PostgresConfig {
                connection: raw.postgres.connection,
                password_file: raw.postgres.password_file,
                schema: raw.postgres.schema,
                role: raw.postgres.role,
                tenant: None,
            },
            routes,
            dead_letter_topic: raw.dead_letter_topic,
            max_batch_records: raw.batch.max_records,
            max_batch_wait_ms: raw.batch.max_wait_ms,
            marker_retention,
            group: None,
        })
    }

    /// A tenant's sink on a fleet host: `postgres.connection` names one of
    /// the connections the host offers the tenant (`onceflow host
    /// --sink-connections`), whose credentials stay in the host's
    /// configuration; the sink's name in the database and its group become
    /// `<tenant>.<name>`.
    pub fn for_tenant(mut self, tenant: &str, connections: &Connections) -> Result<Self, String> {
        if self.postgres.password_file.is_some() {
            return Err("postgres.password-file: not on the fleet: the hosts' configuration                         holds the credentials; name a connection in postgres.connection"
                .to_owned());
        }
        let offered = connections.names_for(tenant);
        let wanted = self.postgres.connection.trim();
        if wanted.contains('=') || wanted.contains("://") {
            return Err(format!(
                "postgres.connection: on the fleet, name one of the connections the hosts offer                  tenant {tenant:?} ({}), not a connection string",
                list_or_none(&offered)
            ));
        }
        let c = connections
            .0
            .iter()
            .find(|c| c.name == wanted && c.tenants.iter().any(|t| t == tenant))
            .ok_or_else(|| {
                format!(
                    "postgres.connection: {wanted:?} is not a connection this host offers tenant                      {tenant:?} (offered: {}); the operator lists them in the file given to                      `onceflow host --sink-connections`",
                    list_or_none(&offered)
                )
            })?;
        if self.postgres.role.is_some() {
            return Err(format!(
                "postgres.role: not on the fleet: your statements run under your role on \
                 connection {wanted:?}, which the operator names; remove it"
            ));
        }
        self.postgres.connection = c.connection.clone();
        self.postgres.password_file = c.password_file.clone();
        if let Some(schema) = &c.schema {
            self.postgres.schema = schema.clone();
        }
        self.postgres.role = Some(c.role_of(tenant));
        self.postgres.tenant = Some(tenant.to_owned());
        self.name = format!("{tenant}.{}", self.name);
        self.group = Some(self.name.clone());
        Ok(self)
    }

    /// Every topic the sink reads or writes, with its key in `sink.toml`.
    pub fn topics(&self) -> Vec<(String, &str)> {
        self.routes
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("routes[{i}].topic"), r.topic.as_str()))
            .chain([(
                "dead-letter-topic".to_owned(),
                self.dead_letter_topic.as_str(),
            )])
            .collect()
    }

    /// The route of `topic`.
    pub fn route(&self, topic: &str) -> Option<(usize, &Route)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.topic == topic)
    }

    /// The consumer group of the sink's instances.
    pub fn group(&self) -> String {
        self.group
            .clone()
            .unwrap_or_else(|| format!("onceflow-sink-{}", self.name))
    }
}

fn list_or_none(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The PostgreSQL connections a fleet host offers tenants' sinks (`onceflow
/// host --sink-connections FILE`): a sink deployed on the fleet names one,
/// and never carries credentials itself.
///
/// ```toml
/// [[postgres]]
/// name = "analytics"
/// connection = "host=10.0.0.5 port=5432 user=acme_sink dbname=analytics"
/// password-file = "/etc/onceflow/analytics.password"
/// tenants = ["acme"]
/// ```
#[derive(Debug, Clone, Default)]
pub struct Connections(Vec<NamedConnection>);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub(crate) struct NamedConnection {
    pub(crate) name: String,
    pub(crate) connection: String,
    password_file: Option<PathBuf>,
    pub(crate) tenants: Vec<String>,
    /// Where Onceflow's tables live on this connection (owned by the
    /// connection's user); default: the sink.toml's `postgres.schema`.
    schema: Option<String>,
    /// Each tenant's role (its statements run under it); default: the
    /// tenant's name.
    #[serde(default)]
    roles: std::collections::BTreeMap<String, String>,
}

impl NamedConnection {
    /// The role tenant `tenant`'s statements run under.
    pub(crate) fn role_of(&self, tenant: &str) -> String {
        self.roles
            .get(tenant)
            .cloned()
            .unwrap_or_else(|| tenant.to_owned())
    }

    /// The connection as a sink's `[postgres]`.
    pub(crate) fn as_config(&self) -> PostgresConfig {
        PostgresConfig {
            connection: self.connection.clone(),
            password_file: self.password_file.clone(),
            schema: self.schema.clone().unwrap_or_else(default_schema),
            role: None,
            tenant: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnections {
    #[serde(default)]
    postgres: Vec<NamedConnection>,
}

impl Connections {
    /// Reads and checks the file.
    pub fn load(path: &Path) -> Result<Self, SinkError> {
        let text = std::fs::read_to_string(path).map_err(|source| SinkError::ReadConfig {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |key: String, message: String| SinkError::Config {
            path: path.to_owned(),
            key,
            message,
        };
        let raw: RawConnections =
            toml::from_str(&text).map_err(|e| invalid(String::new(), e.to_string()))?;
        let mut seen = Vec::new();
        for (i, c) in raw.postgres.iter().enumerate() {
            let at = |k: &str| format!("postgres[{i}].{k}");
            if c.name.is_empty() || c.name.contains(['=', '/', ' ']) {
                return Err(invalid(at("name"), format!("{:?}: a plain name", c.name)));
            }
            if seen.contains(&c.name.as_str()) {
                return Err(invalid(at("name"), format!("{:?} is given twice", c.name)));
            }
            seen.push(&c.name);
            if has_password(&c.connection) {
                return Err(invalid(
                    at("connection"),
                    "holds a password in clear: give `password-file` instead".to_owned(),
                ));
            }
            if let Some(schema) = &c.schema {
                check_identifier(schema).map_err(|m| invalid(at("schema"), m))?;
            }
            for (tenant, role) in &c.roles {
                check_identifier(role).map_err(|m| invalid(at(&format!("roles.{tenant}")), m))?;
                if !c.tenants.contains(tenant) {
                    return Err(invalid(
                        at(&format!("roles.{tenant}")),
                        format!("{tenant:?} is not in `tenants`: add it there, or remove its role"),
                    ));
                }
            }
        }
        let mut all = raw.postgres;
        for c in &mut all {
            if let Some(f) = &mut c.password_file
                && f.is_relative()
            {
                *f = path.parent().unwrap_or(Path::new(".")).join(&*f);
            }
        }
        Ok(Connections(all))
    }

    /// Every connection.
    pub(crate) fn all(&self) -> &[NamedConnection] {
        &self.0
    }

    /// The names offered to `tenant`.
    pub fn names_for(&self, tenant: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|c| c.tenants.iter().any(|t| t == tenant))
            .map(|c| c.name.as_str())
            .collect()
    }
}

/// Whether a connection string (key=value or URL form) carries a password.
fn has_password(connection: &str) -> bool {
    let c = connection.trim();
    if c.starts_with("postgres://") || c.starts_with("postgresql://") {
        let rest = c.split_once("://").map_or("", |(_, r)| r);
        let userinfo = rest.split(['@', '/']).next().filter(|_| rest.contains('@'));
        return userinfo.is_some_and(|u| u.contains(':')) || c.contains("password=");
    }
    c.split_whitespace()
        .any(|kv| kv.trim_start().to_ascii_lowercase().starts_with("password"))
}

/// A plain SQL identifier: quoted as is, so letters, digits and `_`.
pub(crate) fn check_identifier(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?}: use letters, digits and '_' (at most 63, not starting with a digit)"
        ))
    }
}

/// `table` or `schema.table`.
fn check_table(name: &str) -> Result<(), String> {
    match name.split_once('.') {
        Some((schema, table)) => check_identifier(schema).and(check_identifier(table)),
        None => check_identifier(name),
    }
}

/// An identifier (or `schema.table`) quoted for SQL.
pub(crate) fn quote(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{p}\""))
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "wallet-pg"
dead-letter-topic = "sink.dlq"
[postgres]
connection = "host=127.0.0.1 port=15432 user=onceflow dbname=onceflow"
password-file = "pw"
[[routes]]
topic = "balances"
mode = "upsert"
table = "balances"
columns = ["account", "balance"]
key = ["account"]
[[routes]]
topic = "audit"
mode = "insert"
table = "audit"
columns = ["payment_id", "account", "amount"]
identity = "payment_id"
"#;

    fn parse(text: &str) -> Result<SinkConfig, SinkError> {
        SinkConfig::parse(text, Path::new("sink.toml"))
    }

    #[test]
    fn a_good_config_parses() {
        let c = parse(GOOD).expect("parses");
        assert_eq!(c.group(), "onceflow-sink-wallet-pg");
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].identity, Identity::Field("payment_id".into()));
        assert_eq!(c.routes[0].identity, Identity::Position);
        assert_eq!(c.max_batch_records, 5000);
    }

    #[test]
    fn a_password_in_clear_is_refused() {
        for conn in [
            "host=h user=u password=secret dbname=d",
            "postgres://u:secret@h/d",
            "postgresql://h/d?password=secret",
        ] {
            let text = GOOD.replace(
                "host=127.0.0.1 port=15432 user=onceflow dbname=onceflow",
                conn,
            );
            let e = parse(&text).expect_err(conn).to_string();
            assert!(e.contains("password in clear"), "{conn}: {e}");
        }
        assert!(!has_password("postgres://u@h/d"));
    }

    #[test]
    fn bad_routes_name_the_key() {
        let cases = [
            (
                GOOD.replace("key = [\"account\"]", "key = [\"id\"]"),
                "routes[0].key",
            ),
            (
                GOOD.replace("mode = \"insert\"", "mode = \"merge\""),
                "routes[1].mode",
            ),
            (
                GOOD.replace("table = \"audit\"", "table = \"au dit\""),
                "routes[1].table",
            ),
            (
                GOOD.replace("topic = \"audit\"", "topic = \"balances\""),
                "routes[1].topic",
            ),
            (
                GOOD.replace("topic = \"audit\"", "topic = \"sink.dlq\""),
                "routes[1].topic",
            ),
            (
                GOOD.replace("name = \"wallet-pg\"", "name = \"wallet-pg\"\nbogus = 1"),
                "bogus",
            ),
        ];
        for (text, key) in cases {
            let e = parse(&text).expect_err(key).to_string();
            assert!(e.contains(key), "{key}: {e}");
        }
    }

    #[test]
    fn on_the_fleet_a_sink_names_a_connection_of_its_tenant() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("connections.toml");
        std::fs::write(
            &file,
            "[[postgres]]\nname = \"analytics\"\nconnection = \"host=h user=u dbname=d\"\n\
             password-file = \"pw\"\ntenants = [\"acme\"]\n",
        )
        .expect("write");
        let connections = Connections::load(&file).expect("loads");
        assert_eq!(connections.names_for("acme"), ["analytics"]);
        let named = GOOD
            .replace(
                "host=127.0.0.1 port=15432 user=onceflow dbname=onceflow",
                "analytics",
            )
            .replace("password-file = \"pw\"\n", "");
        let c = parse(&named)
            .expect("parses")
            .for_tenant("acme", &connections)
            .expect("resolves");
        assert_eq!(c.postgres.connection, "host=h user=u dbname=d");
        assert_eq!(c.postgres.password_file, Some(dir.path().join("pw")));
        assert_eq!(
            (c.name.as_str(), c.group()),
            ("acme.wallet-pg", "acme.wallet-pg".into())
        );
        let e = parse(&named)
            .expect("parses")
            .for_tenant("globex", &connections)
            .expect_err("not offered to globex");
        assert!(e.contains("offered: none"), "{e}");
        let e = parse(&GOOD.replace("password-file = \"pw\"\n", ""))
            .expect("parses")
            .for_tenant("acme", &connections)
            .expect_err("a connection string");
        assert!(
            e.contains("not a connection string") && e.contains("analytics"),
            "{e}"
        );
    }

    #[test]
    fn the_markers_retention_in_hours_or_minutes() {
        let with = |markers: &str| {
            parse(&GOOD.replace("[postgres]", &format!("[markers]\n{markers}\n[postgres]")))
        };
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(parse(GOOD).expect("parses").marker_retention, 7 * day);
        let c = with("retention-hours = 24").expect("hours");
        assert_eq!(c.marker_retention, day);
        let c = with("retention-minutes = 5").expect("minutes");
        assert_eq!(c.marker_retention.as_secs(), 300);
        for (bad, names) in [
            ("retention-hours = 0", "markers.retention-hours"),
            ("retention-minutes = 0", "markers.retention-minutes"),
            (
                "retention-hours = 1\nretention-minutes = 5",
                "markers.retention-minutes",
            ),
        ] {
            let e = crate::types::error_chain(&with(bad).expect_err(bad));
            assert!(e.contains(names), "{bad}: {e}");
        }
    }

    #[test]
    fn quoting() {
        assert_eq!(quote("audit"), "\"audit\"");
        assert_eq!(quote("s.audit"), "\"s\".\"audit\"");
        assert!(check_identifier("1x").is_err());
        assert!(check_identifier("a\"b").is_err());
    }
}
