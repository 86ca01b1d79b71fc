//! `onceflow.toml`: what a processor is, where its component lives, what it
//! reads and writes, and how it is run.
//!
//! Parsing is strict: an unknown key or a bad value is an error that names
//! the key and the file, because a typo in a manifest (say `comit-interval-ms`)
//! silently falling back to a default is how exactly-once setups go wrong.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::types::default_limits;

mod formats;
mod processing;

pub use formats::{Deliver, Format, ValueFormat};
use formats::{check_format, topic_entry};
pub use processing::{Guarantee, MAX_REPLAY_WINDOW_HOURS, MAX_STANDBY_REPLICAS, ProcessingSection};

/// The file name `onceflow` looks for when given a directory.
pub const MANIFEST_FILE: &str = "onceflow.toml";

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file could not be read.
    #[error("cannot read manifest {path}")]
    Read {
        /// The manifest path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown key or a value of the
    /// wrong type (the TOML error names the key and the line).
    #[error("invalid manifest {path}: {message}")]
    Parse {
        /// The manifest path.
        path: PathBuf,
        /// What is wrong, with the key and the line.
        message: String,
    },
    /// A value is well-typed but not allowed.
    #[error("invalid manifest {path}: `{key}`: {message}")]
    Invalid {
        /// The manifest path.
        path: PathBuf,
        /// The offending key, dotted (`errors.dead-letter-topic`).
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
}

/// What happens to a record whose processing fails (the processor returned
/// an error for it, trapped, or ran out of fuel, memory or time).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ErrorPolicy {
    /// Stop the deployment and surface the error (Kafka Streams' default).
    #[default]
    Fail,
    /// Count and log the record, and carry on.
    Skip,
    /// Write the record with the reason and its coordinates to the
    /// dead-letter topic, inside the same transaction, and carry on.
    DeadLetter {
        /// The dead-letter topic.
        topic: String,
    },
}

impl ErrorPolicy {
    /// The dead-letter topic, with `dead-letter`.
    pub fn dead_letter_topic(&self) -> Option<&str> {
        match self {
            Self::DeadLetter { topic } => Some(topic),
            _ => None,
        }
    }
}

/// `[errors] policy` as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
enum PolicyName {
    #[default]
    Fail,
    Skip,
    DeadLetter,
}

/// The source language of a processor, for `onceflow build`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Rust with the `onceflow-sdk` crate.
    Rust,
    /// JavaScript (an ES module), componentized with ComponentizeJS.
    Js,
    /// TypeScript, compiled to JavaScript with `tsc`, then as `js`.
    Ts,
    /// Python, componentized with componentize-py.
    Python,
    /// Go (1.24+), `GOOS=wasip1 -buildmode=c-shared` with `//go:wasmexport`.
    Go,
    /// C, with clang, wasi-libc and bindings from `wit-bindgen c`.
    C,
}

impl Language {
    /// Every language, as written in the manifest.
    pub const ALL: [Language; 6] = [
        Language::Rust,
        Language::Js,
        Language::Ts,
        Language::Python,
        Language::Go,
        Language::C,
    ];

    /// The name used in the manifest and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "rust",
            Language::Js => "js",
            Language::Ts => "ts",
            Language::Python => "python",
            Language::Go => "go",
            Language::C => "c",
        }
    }
}

/// `[build]`: how `onceflow build` makes the component.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct BuildSection {
    /// Source language.
    pub language: Language,
    /// Source directory, relative to the manifest.
    #[serde(default = "default_source")]
    pub source: PathBuf,
    /// The component file, relative to the manifest. Defaults to
    /// `target/onceflow/<name>.wasm`.
    pub component: Option<PathBuf>,
    /// The compilation target (Rust): `wasm32-unknown-unknown` (default, no
    /// WASI imports at all) or `wasm32-wasip2`.
    pub target: Option<String>,
}

fn default_source() -> PathBuf {
    PathBuf::from(".")
}

/// `[errors]` as written; validated into an [`ErrorPolicy`].
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct ErrorsSection {
    /// `fail` (default), `skip` or `dead-letter`.
    #[serde(default)]
    policy: PolicyName,
    /// The dead-letter topic; required with `dead-letter`.
    dead_letter_topic: Option<String>,
}

/// `[window-stores.NAME]`: a window store.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct WindowStoreSection {
    /// How long a window is kept, in ms of stream time from its start: a
    /// window whose start is at or before `stream time - retention-ms` has
    /// expired. Default 1 day, as Kafka Streams' window stores. Make it at
    /// least window size + grace, plus the punctuation interval when closed
    /// windows are emitted from `punctuate` (so none expires before the
    /// punctuation that emits it).
    #[serde(default = "default_retention_ms")]
    pub retention_ms: u64,
}

fn default_retention_ms() -> u64 {
    24 * 3600 * 1000
}

/// What the host does with a record the processor reports late
/// (`context.late-record`): `[time] late-records`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum LateRecords {
    /// Count it (`onceflow_late_records_total`) and drop it, as Kafka
    /// Streams does.
    #[default]
    Drop,
    /// Hand it to `[errors]`' policy (a dead letter, say).
    ErrorPolicy,
}

/// `[time]`.
#[derive(Debug, Clone, Copy, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TimeSection {
    /// Late records: `drop` (default) or `error-policy`.
    #[serde(default)]
    pub late_records: LateRecords,
}

/// `[limits]`: what one instance of the processor may use.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct Limits {
    /// Linear memory cap per instance, in MiB.
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u64,
    /// Fuel (roughly, WebAssembly instructions) per input record; a call gets
    /// this times its batch size. 0 turns fuel metering off.
    #[serde(default = "default_fuel")]
    pub fuel_per_record: u64,
    /// Wall-clock deadline for one `process` call, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Guest log lines allowed per second per instance; the rest are counted
    /// and dropped.
    #[serde(default = "default_log_rate")]
    pub log_lines_per_second: u32,
    /// Committed state per instance, in MiB: the keys and values of all its
    /// stores. A write past it is refused and its record goes to the error
    /// policy; deletes always go through.
    #[serde(default = "default_state_mb")]
    pub state_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_mb: default_memory_mb(),
            fuel_per_record: default_fuel(),
            timeout_ms: default_timeout_ms(),
            log_lines_per_second: default_log_rate(),
            state_mb: default_state_mb(),
        }
    }
}

fn default_memory_mb() -> u64 {
    default_limits::MEMORY_MB
}
fn default_fuel() -> u64 {
    default_limits::FUEL_PER_RECORD
}
fn default_timeout_ms() -> u64 {
    default_limits::TIMEOUT_MS
}
fn default_log_rate() -> u32 {
    default_limits::LOG_LINES_PER_SECOND
}
fn default_state_mb() -> u64 {
    default_limits::STATE_MB
}

/// The raw file, exactly as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawManifest {
    name: String,
    tenant: String,
    #[serde(default)]
    description: Option<String>,
    inputs: Vec<toml::Value>,
    #[serde(default)]
    stores: Vec<String>,
    #[serde(default)]
    window_stores: BTreeMap<String, WindowStoreSection>,
    #[serde(default)]
    tables: BTreeMap<String, String>,
    build: BuildSection,
    #[serde(default)]
    outputs: BTreeMap<String, toml::Value>,
    #[serde(default)]
    processing: ProcessingSection,
    #[serde(default)]
    errors: ErrorsSection,
    #[serde(default)]
    limits: Limits,
    #[serde(default)]
    time: TimeSection,
    #[serde(default)]
    config: BTreeMap<String, toml::Value>,
}

/// A validated manifest.
#[derive(Debug, Clone)]
pub struct Manifest {
    /// Where the manifest was read from.
    pub path: PathBuf,
    /// Processor name: `[a-z0-9][a-z0-9_-]*`, at most 64 characters.
    pub name: String,
    /// Owning tenant, same character set.
    pub tenant: String,
    /// Free text.
    pub description: Option<String>,
    /// Input topics (a task reads the same partition of each).
    pub inputs: Vec<String>,
    /// Tables: store name -> compacted topic, materialized into a read-only
    /// store per task from the same partition of the topic (which is the
    /// store's changelog).
    pub tables: Vec<(String, String)>,
    /// Every state store's name: the key-value stores of `stores`, then the
    /// window stores (each has a changelog and a RocksDB column family).
    pub stores: Vec<String>,
    /// The window stores among `stores`, with their settings.
    pub window_stores: Vec<(String, WindowStoreSection)>,
    /// `[time]`.
    pub time: TimeSection,
    /// Build instructions.
    pub build: BuildSection,
    /// Output alias -> topic.
    pub outputs: BTreeMap<String, String>,
    /// The inputs whose values are not plain bytes: topic -> format.
    pub input_formats: BTreeMap<String, ValueFormat>,
    /// The outputs whose values are not plain bytes: alias -> format.
    pub output_formats: BTreeMap<String, ValueFormat>,
    /// Processing settings.
    pub processing: ProcessingSection,
    /// Error handling (`[errors]`).
    pub errors: ErrorPolicy,
    /// Resource limits.
    pub limits: Limits,
    /// `[config]`, flattened to strings, handed to the processor's `init`.
    pub config: Vec<(String, String)>,
}

impl Manifest {
    /// Reads and validates a manifest. `path` may be the file or the
    /// directory that holds `onceflow.toml`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ManifestError> {
        let mut path = path.as_ref().to_path_buf();
        if path.is_dir() {
            path.push(MANIFEST_FILE);
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses and validates manifest text; `path` is used for messages and
    /// to resolve relative paths.
    pub fn parse(text: &str, path: PathBuf) -> Result<Self, ManifestError> {
        let raw: RawManifest = toml::from_str(text).map_err(|e| ManifestError::Parse {
            path: path.clone(),
            message: e.to_string().trim_end().to_owned(),
        })?;
        let invalid = |key: &str, message: String| ManifestError::Invalid {
            path: path.clone(),
            key: key.to_owned(),
            message,
        };

        check_name(&raw.name).map_err(|m| invalid("name", m))?;
        check_name(&raw.tenant).map_err(|m| invalid("tenant", m))?;
        let mut input_formats = BTreeMap::new();
        let mut inputs = Vec::with_capacity(raw.inputs.len());
        for entry in raw.inputs {
            let (topic, format) = topic_entry(entry).map_err(|m| invalid("inputs", m))?;
            if let Some(format) = format {
                check_format(&format, false)
                    .map_err(|(k, m)| invalid(&format!("inputs.{topic}{k}"), m))?;
                if format.format != Format::Bytes {
                    input_formats.insert(topic.clone(), format);
                }
            }
            inputs.push(topic);
        }
        let mut output_formats = BTreeMap::new();
        let mut outputs = BTreeMap::new();
        for (alias, entry) in raw.outputs {
            let (topic, format) =
                topic_entry(entry).map_err(|m| invalid(&format!("outputs.{alias}"), m))?;
            if let Some(format) = format {
                check_format(&format, true)
                    .map_err(|(k, m)| invalid(&format!("outputs.{alias}{k}"), m))?;
                if format.format != Format::Bytes {
                    output_formats.insert(alias.clone(), format);
                }
            }
            outputs.insert(alias, topic);
        }
        if inputs.is_empty() {
            return Err(invalid(
                "inputs",
                "list at least one input topic".to_owned(),
            ));
        }
        for topic in &inputs {
            check_topic(topic).map_err(|m| invalid("inputs", m))?;
        }
        let mut sources = std::collections::BTreeSet::new();
        for topic in &inputs {
            if !sources.insert(topic) {
                return Err(invalid(
                    "inputs",
                    format!("topic {topic:?} is listed twice"),
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for store in &raw.stores {
            check_store_name(store).map_err(|m| invalid("stores", m))?;
            if !seen.insert(store) {
                return Err(invalid(
                    "stores",
                    format!("store {store:?} is listed twice"),
                ));
            }
        }
        for (store, w) in &raw.window_stores {
            let key = format!("window-stores.{store}");
            check_store_name(store).map_err(|m| invalid(&key, m))?;
            if !seen.insert(store) {
                return Err(invalid(
                    &key,
                    format!(
                        "{store:?} is also listed under `stores`: a store is one kind or the other"
                    ),
                ));
            }
            if w.retention_ms == 0 {
                return Err(invalid(
                    &format!("{key}.retention-ms"),
                    "0 would expire every window at once: give at least the window size plus its grace"
                        .to_owned(),
                ));
            }
        }
        for (store, topic) in &raw.tables {
            let key = format!("tables.{store}");
            check_store_name(store).map_err(|m| invalid(&key, m))?;
            check_topic(topic).map_err(|m| invalid(&key, m))?;
            if !seen.insert(store) {
                return Err(invalid(
                    &key,
                    format!("{store:?} is also a store's name: a table is a store of its own"),
                ));
            }
            if !sources.insert(topic) {
                return Err(invalid(
                    &key,
                    format!("topic {topic:?} is already an input or another table"),
                ));
            }
        }
        for (alias, topic) in &outputs {
            check_identifier(alias).map_err(|m| invalid(&format!("outputs.{alias}"), m))?;
            check_topic(topic).map_err(|m| invalid(&format!("outputs.{alias}"), m))?;
            if sources.contains(topic) {
                return Err(invalid(
                    &format!("outputs.{alias}"),
                    format!(
                        "topic {topic:?} is also an input or a table: a processor cannot feed itself"
                    ),
                ));
            }
        }
        if let Some(target) = &raw.build.target
            && !matches!(target.as_str(), "wasm32-unknown-unknown" | "wasm32-wasip2")
        {
            return Err(invalid(
                "build.target",
                format!("{target:?} is not supported: use wasm32-unknown-unknown or wasm32-wasip2"),
            ));
        }
        let in_range = |key: &str, value: u64, max: u64| {
            if (1..=max).contains(&value) {
                Ok(())
            } else {
                Err(invalid(key, format!("{value} is out of range 1..={max}")))
            }
        };
        raw.processing
            .check()
            .map_err(|(key, why)| invalid(key, why))?;
        let errors = match (raw.errors.policy, raw.errors.dead_letter_topic) {
            (PolicyName::DeadLetter, None) => {
                return Err(invalid(
                    "errors.dead-letter-topic",
                    "policy `dead-letter` needs a dead-letter-topic".to_owned(),
                ));
            }
            (PolicyName::DeadLetter, Some(topic)) => {
                check_topic(&topic).map_err(|m| invalid("errors.dead-letter-topic", m))?;
                if sources.contains(&topic) {
                    return Err(invalid(
                        "errors.dead-letter-topic",
                        format!("topic {topic:?} is also an input"),
                    ));
                }
                ErrorPolicy::DeadLetter { topic }
            }
            (_, Some(_)) => {
                return Err(invalid(
                    "errors.dead-letter-topic",
                    "only used with policy = \"dead-letter\": remove it or change the policy"
                        .to_owned(),
                ));
            }
            (PolicyName::Fail, None) => ErrorPolicy::Fail,
            (PolicyName::Skip, None) => ErrorPolicy::Skip,
        };
        let l = &raw.limits;
        in_range("limits.memory-mb", l.memory_mb, 4096)?;
        in_range("limits.timeout-ms", l.timeout_ms, 600_000)?;
        in_range("limits.state-mb", l.state_mb, 1 << 20)?;
        let mut config = Vec::with_capacity(raw.config.len());
        for (key, value) in raw.config {
            let value = match value {
                toml::Value::String(s) => s,
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(invalid(
                        &format!("config.{key}"),
                        format!(
                            "a {} is not allowed: config values are strings, numbers or booleans",
                            other.type_str()
                        ),
                    ));
                }
            };
            config.push((key, value));
        }

        Ok(Self {
            path,
            name: raw.name,
            tenant: raw.tenant,
            description: raw.description,
            inputs,
            input_formats,
            output_formats,
            tables: raw.tables.into_iter().collect(),
            stores: raw
                .stores
                .into_iter()
                .chain(raw.window_stores.keys().cloned())
                .collect(),
            window_stores: raw.window_stores.into_iter().collect(),
            time: raw.time,
            build: raw.build,
            outputs,
            processing: raw.processing,
            errors,
            limits: raw.limits,
            config,
        })
    }

    /// The directory holding the manifest; relative paths start here.
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or_else(|| Path::new("."))
    }

    /// The component file.
    pub fn component_path(&self) -> PathBuf {
        match &self.build.component {
            Some(p) => self.dir().join(p),
            None => self
                .dir()
                .join("target")
                .join("onceflow")
                .join(format!("{}.wasm", self.name)),
        }
    }

    /// The source directory.
    pub fn source_dir(&self) -> PathBuf {
        self.dir().join(&self.build.source)
    }

    /// Every topic a task reads: the inputs, then the tables' topics. They
    /// must be co-partitioned.
    pub fn sources(&self) -> Vec<&str> {
        self.inputs
            .iter()
            .map(String::as_str)
            .chain(self.tables.iter().map(|(_, t)| t.as_str()))
            .collect()
    }

    /// The table whose topic is `topic`.
    pub fn table_of(&self, topic: &str) -> Option<&str> {
        self.tables
            .iter()
            .find(|(_, t)| t == topic)
            .map(|(s, _)| s.as_str())
    }

    /// Every store a task keeps locally: the changelogged stores, then the
    /// tables.
    pub fn local_stores(&self) -> Vec<String> {
        self.stores
            .iter()
            .cloned()
            .chain(self.tables.iter().map(|(s, _)| s.clone()))
            .collect()
    }

    /// The application id: consumer group and prefix of everything the
    /// deployment owns in Kafka.
    pub fn application_id(&self) -> String {
        format!("{}.{}", self.tenant, self.name)
    }
}

/// Names of processors and tenants: they end up in consumer group ids,
/// transactional ids and topic names.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name: use 1 to 64 lowercase letters, digits, '-' or '_', starting with a letter or digit"
        ))
    }
}

/// Store names and output aliases.
fn check_identifier(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid name: use 1 to 64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// Store names: identifiers, but not the host's own (its metadata lives
/// beside the stores, in a column family named `onceflow.meta`: a store of
/// that name would let the guest overwrite changelog positions) and not
/// `.` or `..`.
fn check_store_name(name: &str) -> Result<(), String> {
    check_identifier(name)?;
    if name.bytes().all(|b| b == b'.') {
        return Err(format!(
            "{name:?} is not a valid store name: use letters or digits, not only dots"
        ));
    }
    if name.to_ascii_lowercase().starts_with("onceflow.") {
        return Err(format!(
            "store name {name:?} is reserved: names starting with \"onceflow.\" are the host's; \
             rename the store"
        ));
    }
    Ok(())
}

/// Kafka's own rule for topic names.
pub fn check_topic(topic: &str) -> Result<(), String> {
    let ok = !topic.is_empty()
        && topic.len() <= 249
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{topic:?} is not a valid Kafka topic name: use 1 to 249 letters, digits, '-', '_' or '.'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const WALLET: &str = r#"
name = "wallet"
tenant = "demo"
inputs = ["payments"]
stores = ["balances"]

[build]
language = "rust"

[outputs]
balances = "balances"
audit = "audit"

[errors]
policy = "dead-letter"
dead-letter-topic = "payments.dlq"
"#;

    pub(super) fn parse(text: &str) -> Result<Manifest, ManifestError> {
        Manifest::parse(text, PathBuf::from("/x/onceflow.toml"))
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let m = parse(WALLET).unwrap();
        assert_eq!(m.processing.guarantee, Guarantee::ExactlyOnceV2);
        assert_eq!(m.processing.commit_interval_ms, 100);
        assert_eq!(m.processing.worker_threads, 1);
        assert_eq!(m.limits.memory_mb, 128);
        assert_eq!(
            m.errors,
            ErrorPolicy::DeadLetter {
                topic: "payments.dlq".to_owned()
            }
        );
        assert_eq!(m.application_id(), "demo.wallet");
        assert_eq!(
            m.component_path(),
            PathBuf::from("/x/target/onceflow/wallet.wasm")
        );
    }

    #[test]
    fn standby_replicas_default_to_none_and_are_bounded() {
        assert_eq!(parse(WALLET).unwrap().processing.standby_replicas, 0);
        let with = |n: u32| {
            WALLET.replace(
                "[errors]",
                &format!("[processing]\nstandby-replicas = {n}\n\n[errors]"),
            )
        };
        assert_eq!(parse(&with(2)).unwrap().processing.standby_replicas, 2);
        let err = parse(&with(9)).unwrap_err().to_string();
        assert!(err.contains("processing.standby-replicas"), "{err}");
        assert!(err.contains("0..=8"), "{err}");
    }

    #[test]
    fn transactions_stay_replayable_a_week_unless_said() {
        assert_eq!(parse(WALLET).unwrap().processing.replay_window_hours, 168);
        let with = |n: u32| {
            WALLET.replace(
                "[errors]",
                &format!("[processing]\nreplay-window-hours = {n}\n\n[errors]"),
            )
        };
        assert_eq!(parse(&with(0)).unwrap().processing.replay_window_hours, 0);
        assert_eq!(
            parse(&with(2160)).unwrap().processing.replay_window_hours,
            2160
        );
        let err = parse(&with(2161)).unwrap_err().to_string();
        assert!(err.contains("processing.replay-window-hours"), "{err}");
        assert!(
            err.contains("0..=2160 (0 writes no replay records)"),
            "{err}"
        );
    }

    #[test]
    fn unknown_key_names_the_key_and_the_file() {
        let text = WALLET.replace(
            "[errors]",
            "[processing]\ncomit-interval-ms = 5\n\n[errors]",
        );
        let err = parse(&text).unwrap_err().to_string();
        assert!(err.contains("/x/onceflow.toml"), "{err}");
        assert!(err.contains("comit-interval-ms"), "{err}");
    }

    #[test]
    fn bad_values_name_the_key() {
        let cases = [
            (WALLET.replace("wallet\"", "Wallet!\""), "`name`"),
            (
                WALLET.replace("dead-letter-topic = \"payments.dlq\"", ""),
                "errors.dead-letter-topic",
            ),
            (
                WALLET.replace("audit = \"audit\"", "audit = \"payments\""),
                "outputs.audit",
            ),
            (
                WALLET.replace("[errors]", "[limits]\nmemory-mb = 0\n[errors]"),
                "limits.memory-mb",
            ),
            (
                WALLET.replace("policy = \"dead-letter\"", "policy = \"retry\""),
                "retry",
            ),
            (
                WALLET.replace("stores = [\"balances\"]", "stores = [\"a\", \"a\"]"),
                "listed twice",
            ),
            // The host's metadata column family (a guest writing it moved
            // changelog positions) and dot-only names.
            (
                WALLET.replace("stores = [\"balances\"]", "stores = [\"onceflow.meta\"]"),
                "reserved",
            ),
            (
                WALLET.replace("stores = [\"balances\"]", "stores = [\"OnceFlow.x\"]"),
                "reserved",
            ),
            (
                WALLET.replace("stores = [\"balances\"]", "stores = [\".\"]"),
                "not only dots",
            ),
            (
                WALLET.replace("stores = [\"balances\"]", "stores = [\"..\"]"),
                "not only dots",
            ),
            (
                WALLET.replace("[build]", "[window-stores.balances]\n[build]"),
                "also listed under `stores`",
            ),
            (
                WALLET.replace("[build]", "[window-stores.v]\nretention-ms = 0\n[build]"),
                "window-stores.v.retention-ms",
            ),
            (
                WALLET.replace("[errors]", "[time]\nlate-records = \"keep\"\n[errors]"),
                "keep",
            ),
            (
                WALLET.replace("[build]", "[tables]\nbalances = \"accounts\"\n[build]"),
                "tables.balances",
            ),
            (
                WALLET.replace("[build]", "[tables]\naccounts = \"payments\"\n[build]"),
                "already an input",
            ),
            (
                WALLET.replace("[build]", "[tables]\naccounts = \"audit\"\n[build]"),
                "outputs.audit",
            ),
            (
                WALLET.replace(
                    "inputs = [\"payments\"]",
                    "inputs = [\"payments\", \"payments\"]",
                ),
                "listed twice",
            ),
        ];
        for (text, needle) in cases {
            let err = parse(&text).unwrap_err().to_string();
            assert!(err.contains(needle), "{needle:?} not in {err}");
        }
    }

    #[test]
    fn window_stores_join_the_stores_with_their_retention() {
        let text = WALLET.replace(
            "[build]",
            "[window-stores.views]\nretention-ms = 80000\n[window-stores.daily]\n[time]\nlate-records = \"error-policy\"\n[build]",
        );
        let m = parse(&text).unwrap();
        assert_eq!(m.stores, ["balances", "daily", "views"]);
        let retention: Vec<_> = m
            .window_stores
            .iter()
            .map(|(n, w)| (n.as_str(), w.retention_ms))
            .collect();
        assert_eq!(retention, [("daily", 86_400_000), ("views", 80_000)]);
        assert_eq!(m.time.late_records, LateRecords::ErrorPolicy);
        assert_eq!(parse(WALLET).unwrap().time.late_records, LateRecords::Drop);
    }

    #[test]
    fn several_inputs_and_tables_are_the_sources() {
        let text = WALLET
            .replace(
                "inputs = [\"payments\"]",
                "inputs = [\"payments\", \"refunds\"]",
            )
            .replace("[build]", "[tables]\naccounts = \"accounts\"\n[build]");
        let m = parse(&text).unwrap();
        assert_eq!(m.sources(), ["payments", "refunds", "accounts"]);
        assert_eq!(m.table_of("accounts"), Some("accounts"));
        assert_eq!(m.table_of("payments"), None);
        assert_eq!(m.stores, ["balances"], "a table has no changelog");
        assert_eq!(m.local_stores(), ["balances", "accounts"]);
    }

    #[test]
    fn config_values_become_strings() {
        let text = format!("{WALLET}\n[config]\nthreshold = 10\nmode = \"strict\"\n");
        let m = parse(&text).unwrap();
        assert_eq!(
            m.config,
            vec![
                ("mode".to_owned(), "strict".to_owned()),
                ("threshold".to_owned(), "10".to_owned())
            ]
        );
    }
}
