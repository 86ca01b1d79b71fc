//! Plain data shared by every module: records in, records out, and the errors
//! a processor can see. This module depends on no external library, so
//! `sandbox`, `state`, `task` and `stream` can all speak it without depending
//! on each other.

use std::fmt;
use std::sync::Arc;

/// A Kafka record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Header key.
    pub key: String,
    /// Header value.
    pub value: Vec<u8>,
}

/// One input record, as read from Kafka (or from an offline input file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRecord {
    /// Input topic (its name shared by the records of a poll: no
    /// allocation per record).
    pub topic: Arc<str>,
    /// Input partition.
    pub partition: i32,
    /// Offset in the partition.
    pub offset: i64,
    /// Timestamp in milliseconds since the Unix epoch.
    pub timestamp: i64,
    /// Key; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// Value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers in their original order.
    pub headers: Vec<Header>,
}

/// A record a processor emitted, already resolved from alias to topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRecord {
    /// Destination topic, shared with the deployment's alias table: an
    /// output costs no allocation for its topic's name.
    pub topic: Arc<str>,
    /// Key; `None` is a null key.
    pub key: Option<Vec<u8>>,
    /// Value; `None` is a tombstone.
    pub value: Option<Vec<u8>>,
    /// Headers.
    pub headers: Vec<Header>,
    /// Timestamp (ms since the epoch): the input record's, as in Kafka
    /// Streams, so downstream windows and retention see event time.
    pub timestamp: Option<i64>,
}

/// Bytes of a record's key, value and headers.
fn record_size(key: Option<&[u8]>, value: Option<&[u8]>, headers: &[Header]) -> usize {
    key.map_or(0, <[u8]>::len)
        + value.map_or(0, <[u8]>::len)
        + headers
            .iter()
            .map(|h| h.key.len() + h.value.len())
            .sum::<usize>()
}

impl InputRecord {
    /// Bytes of key, value and headers (what usage counts as bytes in).
    pub fn size(&self) -> usize {
        record_size(self.key.as_deref(), self.value.as_deref(), &self.headers)
    }
}

impl OutputRecord {
    /// Bytes of key, value and headers: what counts against
    /// [`MAX_RECORD_BYTES`].
    pub fn size(&self) -> usize {
        record_size(self.key.as_deref(), self.value.as_deref(), &self.headers)
    }
}

/// Largest record (key, value and headers together) the host writes to
/// Kafka: an output, a state change (one changelog record), a dead letter.
/// The producer's `message.max.bytes` is set to 1 MiB and a topic's default
/// `max.message.bytes` is 1 MiB + 12; the rest is left for the record and
/// batch framing, so a record the host accepted is never refused by Kafka.
pub const MAX_RECORD_BYTES: u64 = 1_000_000;

/// A state operation the processor asked for that the host refused. The
/// processor sees it as a `state-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAccessError {
    /// The store is not declared in the manifest.
    UnknownStore(String),
    /// The key or value exceeds the limit (bytes).
    TooLarge(u64),
    /// The write would take the instance's state past `limits.state-mb`
    /// (the limit in bytes; the guest sees `too-large` with it).
    StateFull(u64),
    /// The store is a table: only the host writes it, from its topic.
    ReadOnly(String),
    /// The store is of the other kind: a window store through the
    /// key-value calls, or a key-value store through the window calls.
    WrongKind {
        /// The store.
        store: String,
        /// Whether the store is a window store.
        window: bool,
    },
}

impl fmt::Display for StoreAccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownStore(name) => write!(
                f,
                "unknown state store {name:?}: declare it under `stores` in onceflow.toml"
            ),
            Self::TooLarge(limit) => write!(f, "key and value together larger than {limit} bytes"),
            Self::StateFull(limit) => write!(
                f,
                "the state of this instance would exceed limits.state-mb ({} MiB): delete keys \
                 the processor no longer needs, or raise limits.state-mb",
                limit >> 20
            ),
            Self::ReadOnly(store) => write!(
                f,
                "{store:?} is a table (under `tables` in onceflow.toml): the host writes it from \
                 its topic, a processor only reads it"
            ),
            Self::WrongKind {
                store,
                window: true,
            } => write!(
                f,
                "{store:?} is a window store (under `window-stores` in onceflow.toml): use the \
                 window calls on it"
            ),
            Self::WrongKind {
                store,
                window: false,
            } => write!(
                f,
                "{store:?} is a key-value store, not a window store: declare it under \
                 `window-stores` in onceflow.toml to use the window calls"
            ),
        }
    }
}

/// A state access that did not succeed: refused (the processor's fault; it
/// sees a `state-error`) or failed in the host (the call traps and the batch
/// is retried, since the record is not to blame).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessError {
    /// The processor asked for something it may not have.
    Refused(StoreAccessError),
    /// The store backend failed.
    Failed(String),
}

impl From<StoreAccessError> for AccessError {
    fn from(e: StoreAccessError) -> Self {
        Self::Refused(e)
    }
}

impl fmt::Display for AccessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused(e) => e.fmt(f),
            Self::Failed(m) => write!(f, "state store failed: {m}"),
        }
    }
}

impl std::error::Error for AccessError {}

/// An emit the host refused. The processor sees it as an `output-error`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EmitError {
    /// The alias is not declared in the manifest's `[outputs]`.
    UnknownAlias(String),
    /// The record exceeds the limit (bytes).
    TooLarge(u64),
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownAlias(alias) => write!(
                f,
                "unknown output alias {alias:?}: declare it under [outputs] in onceflow.toml"
            ),
            Self::TooLarge(limit) => write!(f, "output record larger than {limit} bytes"),
        }
    }
}

/// A key-value pair returned by a scan.
pub type Entry = (Vec<u8>, Vec<u8>);

/// Severity of a guest log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// Finest detail.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unexpected that the processor handled.
    Warn,
    /// Something failed.
    Error,
}

/// Where a processor's effects go during a `process` call: the state stores
/// of its partition and its output buffer. The sandbox calls these from the
/// guest's imports; `task` implements them over `state`.
pub trait Effects: std::any::Any + Send {
    /// The guest began the next record of the call (`begin-record`): the
    /// effects so far belong to the records before it.
    fn record_begun(&mut self) {}
    /// Reads a key.
    fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, AccessError>;
    /// Writes a key.
    fn put(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError>;
    /// Deletes a key.
    fn delete(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError>;
    /// Keys with `prefix`, ascending, strictly after `after`, at most `limit`.
    fn scan_prefix(
        &mut self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError>;
    /// Keys in `[start, end)`, ascending, at most `limit`.
    fn scan_range(
        &mut self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError>;
    /// Emits a record to an output alias, stamped with `timestamp` (the
    /// input record's).
    fn emit(
        &mut self,
        alias: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<Header>,
        timestamp: i64,
    ) -> Result<(), EmitError>;

    /// Sets the window of `key` starting at `start` in a window store, as
    /// of stream time `now` (a window already expired is not written).
    fn window_put(
        &mut self,
        store: &str,
        window: WindowKey,
        value: Vec<u8>,
        now: Option<i64>,
    ) -> Result<(), AccessError> {
        let _ = (window, value, now);
        Err(outside_process(store))
    }
    /// Reads a window, as of stream time `now`.
    fn window_get(
        &mut self,
        store: &str,
        window: WindowKey,
        now: Option<i64>,
    ) -> Result<Option<Vec<u8>>, AccessError> {
        let _ = (window, now);
        Err(outside_process(store))
    }
    /// Deletes a window.
    fn window_delete(&mut self, store: &str, window: WindowKey) -> Result<(), AccessError> {
        let _ = window;
        Err(outside_process(store))
    }
    /// The windows of `key` starting in `[from, to]`, by start, as of
    /// stream time `now`.
    fn window_fetch(
        &mut self,
        store: &str,
        key: &[u8],
        from: i64,
        to: i64,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        let _ = (key, from, to, now);
        Err(outside_process(store))
    }
    /// Up to `limit` windows of any key starting in `[from, to]`, in (key,
    /// start) order, strictly after `after`, as of stream time `now`.
    fn window_fetch_all(
        &mut self,
        store: &str,
        from: i64,
        to: i64,
        after: Option<WindowKey>,
        limit: usize,
        now: Option<i64>,
    ) -> Result<Vec<WindowEntry>, AccessError> {
        let _ = (from, to, after, limit, now);
        Err(outside_process(store))
    }
}

/// A window of a window store: its key and start time (ms).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WindowKey {
    /// The key.
    pub key: Vec<u8>,
    /// The window's start, ms since the Unix epoch.
    pub start: i64,
}

/// A window and its value.
pub type WindowEntry = (WindowKey, Vec<u8>);

/// An [`Effects`] that refuses everything: what a guest sees outside a
/// `process` call (for example during `init`).
#[derive(Debug, Default)]
pub struct NoEffects;

impl Effects for NoEffects {
    fn get(&mut self, store: &str, _: &[u8]) -> Result<Option<Vec<u8>>, AccessError> {
        Err(outside_process(store))
    }
    fn put(&mut self, store: &str, _: Vec<u8>, _: Vec<u8>) -> Result<(), AccessError> {
        Err(outside_process(store))
    }
    fn delete(&mut self, store: &str, _: Vec<u8>) -> Result<(), AccessError> {
        Err(outside_process(store))
    }
    fn scan_prefix(
        &mut self,
        store: &str,
        _: &[u8],
        _: Option<&[u8]>,
        _: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        Err(outside_process(store))
    }
    fn scan_range(
        &mut self,
        store: &str,
        _: Option<&[u8]>,
        _: Option<&[u8]>,
        _: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        Err(outside_process(store))
    }
    fn emit(
        &mut self,
        alias: &str,
        _: Option<Vec<u8>>,
        _: Option<Vec<u8>>,
        _: Vec<Header>,
        _: i64,
    ) -> Result<(), EmitError> {
        Err(EmitError::UnknownAlias(alias.to_owned()))
    }
}

fn outside_process(store: &str) -> AccessError {
    AccessError::Failed(format!(
        "state store {store:?} is only available inside `process`, not in `init`"
    ))
}

/// An error and every cause under it, as one line (`a: b: c`); a cause
/// whose text its parent already quotes is left out.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !text.contains(&part) {
            text = format!("{text}: {part}");
        }
        source = cause.source();
    }
    text
}

/// The default per-processor limits: `[limits]` in the manifest and the
/// sandbox's `ProcessorPolicy::default()` both take them from here.
pub mod default_limits {
    /// Linear memory per instance, MiB.
    pub const MEMORY_MB: u64 = 128;
    /// Fuel per input record.
    pub const FUEL_PER_RECORD: u64 = 50_000_000;
    /// Deadline per `process` call, ms.
    pub const TIMEOUT_MS: u64 = 10_000;
    /// Guest log lines per second per instance.
    pub const LOG_LINES_PER_SECOND: u32 = 100;
    /// Committed state per instance (keys and values of all its stores),
    /// MiB.
    pub const STATE_MB: u64 = 1024;
}

/// What a deployment used, as counted in one usage record: written to
/// `_onceflow.usage` inside the transaction whose work it counts, so that
/// committed work is counted exactly once (an aborted transaction's record
/// is never read). Fuel and log lines of an aborted attempt are carried to
/// the next committed transaction of the same worker: the guest did burn
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Usage {
    /// Input records processed.
    pub records_in: u64,
    /// Their bytes (keys, values, headers).
    pub bytes_in: u64,
    /// Output records produced (dead letters included).
    pub records_out: u64,
    /// Their bytes.
    pub bytes_out: u64,
    /// Bytes of changelog records written (state).
    pub state_bytes: u64,
    /// Records sent to the dead-letter topic.
    pub dead_letters: u64,
    /// Fuel burned.
    pub fuel: u64,
    /// Guest log lines written.
    pub log_lines: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        self.records_in += o.records_in;
        self.bytes_in += o.bytes_in;
        self.records_out += o.records_out;
        self.bytes_out += o.bytes_out;
        self.state_bytes += o.state_bytes;
        self.dead_letters += o.dead_letters;
        self.fuel += o.fuel;
        self.log_lines += o.log_lines;
    }
}

/// One record of `_onceflow.usage` (keyed `<tenant>/<name>`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct UsageRecord {
    /// Tenant.
    pub tenant: String,
    /// Deployment name.
    pub deployment: String,
    /// The host that did the work.
    pub host: String,
    /// When the transaction committed (ms since the epoch, host clock).
    pub ts_ms: i64,
    /// What it counts.
    #[serde(flatten)]
    pub usage: Usage,
    /// A sink's record only (`sink:<sink>:<row id>`): a sink forwards its
    /// usage from the database after the batch committed there, at least
    /// once, so a record may come twice; the reader counts an id once.
    /// A worker's record has none: it is written in the transaction it
    /// counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}
