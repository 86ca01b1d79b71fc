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
//! | `GET /v1/deployments/{name}/state/{store}?key=` | [`QueryParams`] | [`QueryAnswer`] |
//! | `GET /v1/usage?since_ms=` | [`UsageParams`] | [`UsageReport`] |
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
    /// `ok`.
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

/// The query of `GET /v1/deployments/{name}/state/{store}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryParams {
    /// The key.
    pub key: String,
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

/// `GET /v1/deployments/{name}/state/{store}?key=`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QueryAnswer {
    /// The store.
    pub store: String,
    /// The key.
    pub key: String,
    /// Its committed values, one per partition that holds it.
    pub values: Vec<QueryValue>,
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
