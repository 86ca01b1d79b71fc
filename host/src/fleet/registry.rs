//! The deployment registry's records: what every host reads from the
//! compacted internal topics and reconciles into running workers.
//!
//! | topic | key | value |
//! |---|---|---|
//! | `_onceflow.deployments` | `<tenant>/<name>` | [`DeploymentRecord`] (JSON) |
//! | `_onceflow.artifacts` | `<sha256>/<index>` | chunk `index` of the component ([`ARTIFACT_CHUNK`] bytes at most); `<sha256>/index` their count |
//! | `_onceflow.grants` | `<tenant>/<sha256>` | [`Grant`] (JSON): the tenant uploaded it (older hosts wrote `<sha256>/grant/<tenant>` in the artifacts topic) |
//! | `_onceflow.status` | `<tenant>/<name>/<host>` | [`HostStatus`] (JSON), refreshed by each host |
//! | `_onceflow.status` | `_host/<host>` ([`heartbeat_key`]) | the host's heartbeat: a [`HostStatus`] with an empty tenant and name (so hosts that predate it read it, and list it under no deployment) |
//! | `_onceflow.logs.<tenant>` ([`logs_topic`]) | `<tenant>/<name>` | [`LogEntry`](crate::api::LogLine) (JSON); one topic per tenant, not compacted, not transactional |
//!
//! Components are content-addressed (sha256), so a redeploy of the same
//! bytes uploads nothing new, and chunked, so a 20 MB Python component fits
//! Kafka's default 1 MiB record limit.

use serde::{Deserialize, Serialize};

/// The deployments topic.
pub const DEPLOYMENTS_TOPIC: &str = "_onceflow.deployments";
/// The artifacts topic.
pub const ARTIFACTS_TOPIC: &str = "_onceflow.artifacts";
/// Which tenant uploaded which component (`<tenant>/<sha256>` →
/// [`Grant`]): what a tenant may deploy, and what counts against its
/// `artifact-mb` quota.
pub const GRANTS_TOPIC: &str = "_onceflow.grants";
/// The hosts' status topic.
pub const STATUS_TOPIC: &str = "_onceflow.status";
/// The guest log topic of `tenant`: one per tenant, each with its own
/// retention ([`LOG_RETENTION_BYTES`]), so that a tenant flooding its logs
/// evicts only its own lines.
pub fn logs_topic(tenant: &str) -> String {
    format!("_onceflow.logs.{tenant}")
}
/// Most bytes of guest log lines kept per tenant (then the oldest go).
pub const LOG_RETENTION_BYTES: u64 = 256 << 20;
/// What each committed transaction used (`fleet/usage.rs`), written in the
/// transaction; kept [`USAGE_RETENTION_DAYS`].
pub const USAGE_TOPIC: &str = "_onceflow.usage";
/// How long usage records are kept: a bill's year and a month of slack.
pub const USAGE_RETENTION_DAYS: u64 = 400;
/// Largest artifact chunk: well under Kafka's default 1 MiB record limit.
pub const ARTIFACT_CHUNK: usize = 512 * 1024;
/// Largest component accepted.
pub const MAX_ARTIFACT_BYTES: usize = 128 * 1024 * 1024;
/// Largest manifest accepted: a deployment record (manifest and all) must
/// fit in one record of the deployments topic (1 MiB by default).
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024;

/// A tenant's upload of a component, under `<tenant>/<sha256>` in
/// [`GRANTS_TOPIC`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// The component's size in bytes.
    pub size: u64,
    /// Its chunks in the artifacts topic.
    pub chunks: usize,
    /// When the tenant last uploaded it (ms since the epoch): a component no
    /// deployment runs is collected a grace period after this.
    pub uploaded_ms: i64,
}

/// The key of `tenant`'s grant of `sha256` in [`GRANTS_TOPIC`].
pub fn tenant_grant_key(tenant: &str, sha256: &str) -> String {
    format!("{tenant}/{sha256}")
}

/// What the tenant wants of a deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Run it.
    Running,
    /// Keep it (state, offsets) but run no worker.
    Paused,
    /// Gone; hosts stop it (and drop local state if `purge_state`).
    Deleted,
}

/// What a deployment runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeploymentKind {
    /// A processor: `manifest` is its `onceflow.toml`, `artifact` its
    /// component. Records written before kinds existed are processors.
    #[default]
    Processor,
    /// A PostgreSQL sink (`onceflow sink postgres`): `manifest` is its
    /// `sink.toml`; no component.
    Sink,
}

/// One deployment, as stored under `<tenant>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentRecord {
    /// Owning tenant.
    pub tenant: String,
    /// Processor name.
    pub name: String,
    /// Increases by one per deploy of this name.
    pub version: u64,
    /// The manifest's text, exactly as deployed.
    pub manifest: String,
    /// sha256 of the component, hex.
    pub artifact: String,
    /// Component size in bytes.
    pub artifact_size: u64,
    /// What hosts should do.
    pub desired: Desired,
    /// With `Deleted`: drop local state, changelogs and the consumer group.
    #[serde(default)]
    pub purge_state: bool,
    /// When this record was written (ms since the epoch).
    pub updated_ms: i64,
    /// What it runs (absent in records of hosts that predate sinks).
    #[serde(default)]
    pub kind: DeploymentKind,
    /// The schema files its manifest names, by path (absent when it names
    /// none, and in records of hosts that predate formats).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub schemas: std::collections::BTreeMap<String, String>,
}

impl DeploymentRecord {
    /// The registry key.
    pub fn key(&self) -> String {
        deployment_key(&self.tenant, &self.name)
    }
}

/// The registry key of a deployment.
pub fn deployment_key(tenant: &str, name: &str) -> String {
    format!("{tenant}/{name}")
}

/// The status-topic key of a host's heartbeat. Tenant names start with a
/// letter or digit, so no deployment's status key starts like this.
pub fn heartbeat_key(host: &str) -> String {
    format!("_host/{host}")
}

/// The status-topic key of a host's status of a deployment.
pub fn status_key(tenant: &str, name: &str, host: &str) -> String {
    format!("{tenant}/{name}/{host}")
}

/// The key of an artifact chunk.
pub fn chunk_key(sha256: &str, index: usize) -> String {
    format!("{sha256}/{index}")
}

/// The key of the record saying `tenant` uploaded the component `sha256`:
/// a tenant may deploy only components it uploaded.
pub fn grant_key(sha256: &str, tenant: &str) -> String {
    format!("{sha256}/grant/{tenant}")
}

/// Splits a chunk key into (sha256, index).
pub fn parse_chunk_key(key: &str) -> Option<(&str, usize)> {
    let (sha, index) = key.split_once('/')?;
    Some((sha, index.parse().ok()?))
}

/// A host's view of one deployment, published every few seconds (the admin
/// API answers with it too).
pub use crate::api::HostStatus;

/// One guest log line in the log topic (the admin API answers with the
/// same type).
pub use crate::api::LogLine as LogEntry;

/// Milliseconds since the epoch, for record stamps.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_keys_round_trip() {
        let k = chunk_key("ab12", 7);
        assert_eq!(parse_chunk_key(&k), Some(("ab12", 7)));
        assert_eq!(parse_chunk_key("nochunk"), None);
        assert_eq!(parse_chunk_key("ab/x"), None);
    }

    #[test]
    fn records_round_trip_as_json() {
        let r = DeploymentRecord {
            tenant: "acme".into(),
            name: "wallet".into(),
            version: 3,
            manifest: "name = \"wallet\"".into(),
            artifact: "00".repeat(32),
            artifact_size: 10,
            desired: Desired::Paused,
            purge_state: false,
            updated_ms: 1,
            kind: DeploymentKind::Processor,
            schemas: Default::default(),
        };
        let json = serde_json::to_string(&r).expect("serialize");
        assert!(json.contains("\"desired\":\"paused\""), "{json}");
        // A record of a host that predates sinks is a processor's.
        let old = json.replace(",\"kind\":\"processor\"", "");
        assert_ne!(old, json);
        assert_eq!(
            serde_json::from_str::<DeploymentRecord>(&old).expect("parse"),
            r
        );
        assert_eq!(
            serde_json::from_str::<DeploymentRecord>(&json).expect("parse"),
            r
        );
        assert_eq!(r.key(), "acme/wallet");
    }
}
