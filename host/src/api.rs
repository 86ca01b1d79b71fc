//! The admin API's requests and answers: the one definition that the host
//! (`admin`, which serves them, and `fleet`, which computes them) and the
//! CLI's client share. Plain serde types; JSON on the wire.
//!
//! | method and path | request | answer |
//! |---|---|---|
//! | `POST /v1/artifacts` | the component's bytes | [`Uploaded`] (201) |
//! | `PUT /v1/deployments/{name}` | [`DeployRequest`] | [`DeploymentSummary`] (201 new, 200 upgrade) |
//! | `GET /v1/deployments` | | [`DeploymentList`] |
//! | `GET /v1/deployments/{name}` | | [`DeploymentSummary`] with `manifest` |
//! | `POST /v1/deployments/{name}/pause`, `/resume` | | [`DeploymentSummary`] |
//! | `DELETE /v1/deployments/{name}?purge_state=` | [`DeleteParams`] | [`Deleted`] |
//! | `GET /v1/deployments/{name}/logs?from=&tail=&wait_ms=` | [`LogParams`] | [`LogLines`] |
//! | `GET /v1/deployments/{name}/state/{store}?key=` (or `prefix=`, `from=&to=`, `key=&window_from_ms=&window_to_ms=`) | [`QueryParams`] | [`QueryAnswer`] |
//! | `POST /v1/internal/deployments/{name}/state/{store}` (host to host, with the tenant's token) | [`LocalReadRequest`] | [`LocalReadAnswer`] |
//! | `GET /v1/usage?since_ms=` | [`UsageParams`] | [`UsageReport`] |
//! | `POST /v1/deployments/{name}/replay` | [`ReplayRequest`] | [`ReplayAnswer`] |
//! | `GET /healthz` | | [`Health`] |
//! | any error | | [`ErrorBody`] with a 4xx or 5xx status |

use serde::{Deserialize, Serialize};

/// The body of every error answer: a message the CLI shows verbatim.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What was refused or failed, and what to do.
    pub error: String,
}

/// `GET /healthz`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Health {
    /// The answering host's id.
    pub host: String,
    /// `ok`, or `draining` (answered with 503: the host was asked to stop
    /// and takes no new work; a load balancer sends writes elsewhere).
    pub status: String,
}

/// A stored component.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Uploaded {
    /// Its sha256, hex: what a [`DeployRequest`] names.
    pub artifact: String,
    /// Its size in bytes.
    pub size: u64,
}

/// The body of `PUT /v1/deployments/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeployRequest {
    /// The manifest's text.
    pub manifest: String,
    /// sha256 of an uploaded component.
    pub artifact: String,
    /// The schema files the manifest names (`schema = "..."` of its inputs
    /// and outputs), by that path: the host registers the output schemas
    /// and keeps them with the deployment (docs/formats.md).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub schemas: std::collections::BTreeMap<String, String>,
}

/// The body of `PUT /v1/sinks/{name}`: a tenant's `sink.toml`, whose
/// `postgres.connection` names a connection the hosts offer the tenant.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SinkDeployRequest {
    /// The configuration's text.
    pub config: String,
}

/// A host's view of one deployment: what each host publishes every few
/// seconds to the status topic (`_onceflow.status`), and the per-host part
/// of [`DeploymentSummary`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostStatus {
    /// The host.
    pub host: String,
    /// Tenant.
    pub tenant: String,
    /// Processor name.
    pub name: String,
    /// The version this host runs (or last ran).
    pub version: u64,
    /// `starting`, `running`, `stopping`, `failing` (workers restarting in a
    /// loop; the reason is in `last_errors`) or `failed`.
    pub state: String,
    /// Input partitions this host's workers own.
    pub partitions: Vec<i32>,
    /// Records behind the last stable offset, summed over its partitions.
    pub lag: i64,
    /// Records processed (committed) per second, lately.
    pub records_per_s: f64,
    /// Commits per second, lately.
    pub commits_per_s: f64,
    /// Commit latency p99 lately, in ms.
    pub commit_p99_ms: f64,
    /// Totals since the deployment started on this host.
    pub records: u64,
    /// Aborted transactions.
    pub aborts: u64,
    /// Producer fencings.
    pub fenced: u64,
    /// Records dead-lettered.
    pub dead_lettered: u64,
    /// The most recent errors (newest last).
    pub last_errors: Vec<String>,
    /// When published (ms since the epoch).
    pub updated_ms: i64,
    /// A random id of the host process that published it: a status with
    /// this host's id and another incarnation is another process using the
    /// same id. Empty from hosts that predate it.
    #[serde(default)]
    pub incarnation: String,
    /// Whether the deployment hibernates on this host (its state stays
    /// `running`): no input for `--hibernate-after-secs`, so no workers or
    /// Kafka clients until a record arrives. False from hosts that predate
    /// it.
    #[serde(default)]
    pub hibernating: bool,
    /// In a host's heartbeat: where its admin API answers other hosts
    /// (routed queries). Empty in deployments' statuses and from hosts
    /// that predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api: String,
}

/// One host's view of a deployment, as answered.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostSummary {
    /// What the host published (rates rounded to one decimal).
    #[serde(flatten)]
    pub status: HostStatus,
    /// Whether its status is old (the host is likely gone).
    pub stale: bool,
    /// The status's age in ms.
    pub age_ms: i64,
}

/// What `list` and `describe` show of a deployment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeploymentSummary {
    /// Processor name.
    pub name: String,
    /// Owning tenant.
    pub tenant: String,
    /// The deployed version.
    pub version: u64,
    /// `running`, `starting`, `upgrading`, `failing` (restarting in a loop on
    /// some host), `failed`, `paused` or `deleted`.
    pub status: String,
    /// sha256 of its component.
    pub artifact: String,
    /// The component's size in bytes.
    pub artifact_size: u64,
    /// When its record was last written (ms since the epoch).
    pub updated_ms: i64,
    /// Versions that live hosts run now.
    pub running_versions: Vec<u64>,
    /// Partitions owned by live hosts.
    pub partitions: usize,
    /// Records behind, over live hosts.
    pub lag: i64,
    /// Records per second, over live hosts.
    pub records_per_s: f64,
    /// Commits per second, over live hosts.
    pub commits_per_s: f64,
    /// Per host.
    pub hosts: Vec<HostSummary>,
    /// The manifest's text (`describe` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
}

/// `GET /v1/deployments`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeploymentList {
    /// The tenant's deployments, by name.
    pub deployments: Vec<DeploymentSummary>,
}

/// The query of `DELETE /v1/deployments/{name}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DeleteParams {
    /// Drop its state too: stores, changelogs and consumer group.
    #[serde(default)]
    pub purge_state: bool,
}

/// `DELETE /v1/deployments/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Deleted {
    /// The deleted deployment's name.
    pub deleted: String,
    /// Whether its state is gone.
    pub state_purged: bool,
}

/// The query of `GET /v1/deployments/{name}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogParams {
    /// Continue from this offset (from a previous [`LogLines::next`]).
    pub from: Option<i64>,
    /// Without `from`: start this many records before the log's end.
    #[serde(default = "default_tail")]
    pub tail: i64,
    /// Wait up to this long (ms, at most 30 s) for a first line.
    #[serde(default)]
    pub wait_ms: u64,
}

fn default_tail() -> i64 {
    10_000
}

/// One guest log line, as kept in the log topic and as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// When the host received it (ms since the epoch).
    pub ts_ms: i64,
    /// Host that ran the instance.
    pub host: String,
    /// Input partition of the instance.
    pub partition: i32,
    /// `error`, `warn`, `info`, `debug`, `trace`.
    pub level: String,
    /// The text.
    pub message: String,
}

/// `GET /v1/deployments/{name}/logs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LogLines {
    /// The lines, oldest first.
    pub lines: Vec<LogLine>,
    /// The offset to continue from.
    pub next: i64,
}

/// The query of `GET /v1/deployments/{name}/state/{store}`: one of a key,
/// a prefix, a key range, or a window store's key and time range.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct QueryParams {
    /// The key (with `window_from_ms`/`window_to_ms`: a window store's key).
    #[serde(default)]
    pub key: String,
    /// Keys that start with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Keys from this one (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Keys up to this one (exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Windows of `key` starting at or after this time (ms since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_from_ms: Option<i64>,
    /// Windows of `key` starting at or before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_to_ms: Option<i64>,
    /// Most entries answered by a range, prefix or window query (default
    /// 1,000, at most 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `changelog`: a key's values from a scan of the store's changelog
    /// topic (what queries read before they were answered from the
    /// owners' stores; slow, and independent of the hosts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// A committed value of one partition's store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryValue {
    /// The partition whose task holds the key.
    pub partition: i32,
    /// The value, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value in base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

/// One entry of a range, prefix or window query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueryEntry {
    /// The partition whose task holds it.
    pub partition: i32,
    /// The key, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The key in base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_base64: Option<String>,
    /// A window's start (ms since the epoch), for a window query.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_start_ms: Option<i64>,
    /// The value, when it is UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// The value in base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_base64: Option<String>,
}

/// `GET /v1/deployments/{name}/state/{store}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryAnswer {
    /// The store.
    pub store: String,
    /// The key (empty for a range or prefix query).
    pub key: String,
    /// A key query's committed values, one per partition that holds it.
    pub values: Vec<QueryValue>,
    /// A range, prefix or window query's entries: by key (windows: by
    /// start), at most the limit.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<QueryEntry>,
    /// Whether more entries matched than the limit.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// Where the answer came from: `stores` (the owners' local stores) or
    /// `changelog`. Empty from hosts that predate it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The hosts whose stores answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// What one host asks another to read from its local stores.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalReadRequest {
    /// The partitions it believes the other host owns.
    pub partitions: Vec<i32>,
    /// Keys and values in base64.
    pub read: WireRead,
}

/// A read of one store, keys in base64.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WireRead {
    /// One key.
    Key {
        /// The key.
        key: String,
    },
    /// Keys in `[from, to)`.
    Range {
        /// First key (inclusive).
        from: Option<String>,
        /// Last key (exclusive).
        to: Option<String>,
        /// Most entries.
        limit: usize,
    },
    /// Keys with a prefix.
    Prefix {
        /// The prefix.
        prefix: String,
        /// Most entries.
        limit: usize,
    },
    /// A window store key's windows that start in `[from_ms, to_ms]`.
    Windows {
        /// The key.
        key: String,
        /// Earliest start.
        from_ms: i64,
        /// Latest start.
        to_ms: i64,
        /// Most entries.
        limit: usize,
    },
}

/// One host's answer to a [`LocalReadRequest`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalReadAnswer {
    /// The host that answered.
    pub host: String,
    /// Per partition asked.
    pub partitions: Vec<LocalPartition>,
}

/// One partition of a [`LocalReadAnswer`].
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LocalPartition {
    /// The partition.
    pub partition: i32,
    /// `entries`, `not_here` (the host does not hold its task now),
    /// `restoring`, or `waking` (it hibernated; a wake was asked for).
    pub state: String,
    /// With `entries`: (key, value) pairs in base64, by key.
    #[serde(default)]
    pub entries: Vec<(String, String)>,
}

/// The query of `GET /v1/usage`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UsageParams {
    /// Only usage recorded at or after this time (ms since the epoch).
    #[serde(default)]
    pub since_ms: i64,
}

/// One deployment's usage.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageRow {
    /// Tenant.
    pub tenant: String,
    /// Deployment name.
    pub deployment: String,
    /// What its committed work used.
    #[serde(flatten)]
    pub usage: crate::types::Usage,
}

/// The answer of `GET /v1/usage`: the caller tenant's deployments (every
/// tenant's with the operator token), deleted ones included.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UsageReport {
    /// Counted from this time (ms since the epoch; 0: since the start).
    pub since_ms: i64,
    /// Per deployment, by tenant and name.
    pub deployments: Vec<UsageRow>,
    /// Their sum.
    pub total: crate::types::Usage,
}

/// The body of `POST /v1/deployments/{name}/replay`: which committed
/// transactions of a partition to run again (docs/replay.md).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayRequest {
    /// The task's partition.
    pub partition: i32,
    /// Which of its transactions.
    pub select: ReplaySelect,
    /// A component uploaded with `POST /v1/artifacts` (its sha256), run on
    /// the same records and state and compared with what committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<String>,
    /// Each store's entries before and after each transaction.
    #[serde(default)]
    pub dump_state: bool,
    /// Only the verdicts: no outputs, no state changes.
    #[serde(default)]
    pub quiet: bool,
}

/// Which transactions a replay runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplaySelect {
    /// Those that processed any record of the first input from `from` to
    /// `to`, inclusive.
    Offsets {
        /// First offset.
        from: i64,
        /// Last offset.
        to: i64,
    },
    /// The first committed at or after this time (ms since the epoch).
    At(i64),
    /// One, by its id.
    Transaction(i64),
    /// The last `n`.
    Last(usize),
    /// Every one the replay topic holds.
    All,
    /// None: list them.
    List,
}

/// The answer of a replay: each transaction replayed (or listed), then
/// the totals.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReplayAnswer {
    /// `tenant.name`.
    pub application_id: String,
    /// The partition.
    pub partition: i32,
    /// With [`ReplaySelect::List`]: every transaction, oldest first.
    #[serde(default)]
    pub listed: Vec<ListedTransaction>,
    /// The transactions replayed, oldest first.
    #[serde(default)]
    pub transactions: Vec<ReplayedTransaction>,
    /// Input records they processed.
    pub records: u64,
    /// Their batches.
    pub batches: u64,
    /// How many were identical to what committed.
    pub identical: u64,
}

/// A replayable transaction, as `--list` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ListedTransaction {
    /// Its id (its replay record's offset).
    pub id: i64,
    /// When it committed (ms since the epoch).
    pub at: Option<i64>,
    /// Input records.
    pub records: u64,
    /// Per source topic: (topic, first offset, records).
    pub sources: Vec<(String, i64, u64)>,
    /// Batches.
    pub batches: u64,
    /// Bytes of its replay record.
    pub bytes: u64,
    /// The SHA-256 of the component that ran.
    pub component: String,
}

/// One transaction replayed: what it read, what the replay did (as the
/// JSON lines `onceflow test` prints), and the verdict.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReplayedTransaction {
    /// Its id.
    pub id: i64,
    /// When it committed (ms since the epoch).
    pub committed_at: Option<i64>,
    /// The partition.
    pub partition: i32,
    /// Input records.
    pub records: u64,
    /// Its first and last input record: (topic, offset).
    pub first: Option<(String, i64)>,
    /// See `first`.
    pub last: Option<(String, i64)>,
    /// Batches.
    pub batches: u64,
    /// The replay's outputs, one JSON line each (dead letters with their
    /// reason).
    #[serde(default)]
    pub outputs: Vec<String>,
    /// The replay's state changes, one JSON line each.
    #[serde(default)]
    pub changes: Vec<String>,
    /// `None`: identical to what committed; else the first difference.
    pub differs: Option<String>,
    /// With a candidate: how it differs from what committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<CandidateDiff>,
    /// With `dump_state`: each store's entries before, one JSON line each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_before: Option<Vec<String>>,
    /// With `dump_state`: and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_after: Option<Vec<String>>,
}

/// How a candidate's run of a transaction differs from what committed.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CandidateDiff {
    /// Each output that differs: (its index, the committed one, the
    /// candidate's), as JSON lines (`None`: no output there).
    pub outputs: Vec<(usize, Option<String>, Option<String>)>,
    /// The first state change that differs, in words.
    pub state: Option<String>,
    /// The candidate's state changes, when they differ.
    #[serde(default)]
    pub changes: Vec<String>,
    /// Why its run failed, if it did.
    pub failed: Option<String>,
}
