//! Why a fleet operation failed. The admin API picks the HTTP status from
//! the variant (`admin::status_of`), and shows the whole chain of causes.

use crate::kafka::KafkaError;
use crate::manifest::ManifestError;
use crate::sandbox::SandboxError;
use crate::sink::SinkError;
use crate::stream::StreamError;

/// A failed fleet operation.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The caller's tenant has no live deployment of that name (or it is
    /// another tenant's: indistinguishable on purpose).
    #[error("no deployment named {name:?} (see `onceflow list`)")]
    NoDeployment {
        /// The name asked for.
        name: String,
    },
    /// The deployment has no such store.
    #[error("deployment {name:?} has no store {store:?} (its stores: {stores})")]
    NoStore {
        /// The deployment.
        name: String,
        /// The store asked for.
        store: String,
        /// Its stores, comma-separated.
        stores: String,
    },
    /// The key has no committed value.
    #[error("key {key:?} has no committed value in store {store:?}")]
    NoValue {
        /// The store.
        store: String,
        /// The key.
        key: String,
    },
    /// The manifest is not valid.
    #[error("manifest refused")]
    Manifest(#[source] ManifestError),
    /// The sandbox refused the component (imports, exports, compilation).
    #[error("component refused")]
    Component(#[source] SandboxError),
    /// The request does not make sense as sent (what to change is in the
    /// message).
    #[error("{0}")]
    Invalid(String),
    /// The deployment would use a Kafka name (changelog topic,
    /// transactional ids, dead-letter topic) that another deployment owns.
    #[error(
        "deployment {deployment} conflicts with {other}: {conflicts}. Names are joined with '-' \
         into Kafka names, so the two would share state (a purge of one deletes the other's) \
         or fence each other's transactions, and an output into another's dead-letter topic \
         would forge its dead letters: rename the deployment, the store or the output's topic"
    )]
    NameConflict {
        /// The deployment refused (`<tenant>/<name>`).
        deployment: String,
        /// The deployment that owns the names (`deployment <tenant>/<name>`,
        /// or "another tenant's deployment").
        other: String,
        /// What collides, `; `-separated.
        conflicts: String,
    },
    /// Another live host process publishes statuses under this host's id.
    #[error(
        "host id {host:?} is in use by another live host process (its status was refreshed \
         {age_s} s ago, while this host watched): two hosts with one id fence each other's \
         transactions and group memberships forever. Give this host its own id (--host-id, or \
         its own --state-dir: a new state directory gets a new random id), or stop the other one"
    )]
    DuplicateHost {
        /// The id.
        host: String,
        /// How old the other process's latest status was, in seconds.
        age_s: i64,
    },
    /// A request body (component, manifest) is larger than the host takes.
    #[error("{what} is {size} bytes, over the limit of {limit} bytes: {advice}")]
    TooLarge {
        /// What was sent.
        what: String,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
        /// What to do.
        advice: String,
    },
    /// Too many requests of one kind at once from this tenant.
    #[error("{0}")]
    Busy(String),
    /// The tenant's namespace or quotas forbid it.
    #[error("refused: {0}")]
    Refused(String),
    /// The component is not (or not wholly) in the artifacts topic.
    #[error("component {sha256} {problem} in _onceflow.artifacts: deploy it again")]
    Artifact {
        /// The component's sha256.
        sha256: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A Kafka call failed (a bad topic is [`KafkaError::Topic`]).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A deployment's runtime stopped with an error.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// A sink stopped with an error.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The deployment's formats were refused: a schema file, or the schema
    /// registry's answer for an output schema.
    #[error("formats refused")]
    Formats(#[source] crate::schema::SetupError),
    /// The control topics did not answer as expected in time.
    #[error("{0}")]
    Unavailable(String),
    /// The host drains (it was asked to stop) and takes no new work.
    #[error(
        "host {host} is draining (it was asked to stop: a restart or an upgrade) and takes no \
         new work: send the request to another host of the fleet, or again once this one is back"
    )]
    Draining {
        /// The host.
        host: String,
    },
    /// A local file could not be written or read.
    #[error("{what}")]
    Io {
        /// The file and what was being done.
        what: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl FleetError {
    /// Whether a deployment that stopped with this error may run if started
    /// again later: the brokers did not answer, or not in time (an
    /// overloaded or restarting broker). Anything else (a refusal, a bad
    /// manifest, the `fail` policy) waits for a new version or `resume`.
    pub fn is_transient(&self) -> bool {
        match self {
            FleetError::Kafka(e) | FleetError::Stream(StreamError::Kafka(e)) => e.is_transient(),
            FleetError::Unavailable(_) => true,
            // The registry did not answer when the deployment started.
            FleetError::Stream(StreamError::Formats(crate::schema::SetupError::Registry {
                source: crate::schema::RegistryError::Unavailable { .. },
                ..
            })) => true,
            _ => false,
        }
    }
}
