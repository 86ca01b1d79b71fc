//! The shared Kafka plumbing: client settings, topic admin, reading a topic
//! to its end, sending records, and what a client error means.
//!
//! Here: [`Connection`] and [`KafkaError`]; reading in `read.rs`, sending in
//! `send.rs`, publishing small records (the fleet's control topics, guest
//! logs, a deploy's admission) in `publish.rs`, topic admin in `topics.rs`,
//! what an error means in `errors.rs`, secrets in `secrets.rs`, the ends
//! of many partitions watched for hibernating deployments in `ends.rs`, the
//! deployments' consumer groups watched by one client in `group_watch.rs`.
//!
//! rdkafka is owned here and by `stream` (the EOS loop's consumer and
//! transactional producer; docs/architecture.md, "Rules"): the fleet and
//! the sink write through `Publisher` and read `Record`s, the sink's loop
//! through a `GroupReader` (`group.rs`) whose rebalances it claims. No `pub` signature names an rdkafka type
//! (`scripts/check-layers`): callers see [`Connection`] and [`KafkaError`].

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::types::{Header, InputRecord, OutputRecord};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header as KHeader, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

mod secrets;
pub use secrets::{ConfigError, FILE_SECRETS, PASSWORD_ENV, extra_config, is_secret};

mod ends;
mod errors;
mod group;
mod group_watch;
mod publish;
mod read;
mod send;
mod topics;

pub use ends::{EndWatch, Ends};
pub(crate) use errors::*;
pub(crate) use group::*;
pub(crate) use group_watch::GroupRegistration;
pub use group_watch::GroupWatch;
pub use publish::produce_records;
pub(crate) use publish::*;
pub(crate) use read::*;
pub(crate) use send::*;
pub use topics::*;

/// Where the cluster is, and the extra librdkafka properties (`-X k=v`) every
/// client of this process gets. Its `Debug` shows secret values (see
/// [`is_secret`]) as `[redacted]`.
#[derive(Clone, Default)]
pub struct Connection {
    /// Kafka bootstrap servers (`host:port,...`).
    pub bootstrap_servers: String,
    /// Extra librdkafka properties for every client, applied last.
    pub extra_config: Vec<(String, String)>,
}

/// A consumer client a process-wide watch (`ends.rs`, `group_watch.rs`)
/// creates at its first use and keeps.
pub(crate) struct SharedClient {
    connection: Connection,
    settings: &'static [(&'static str, &'static str)],
    what: &'static str,
    client: std::sync::Mutex<Option<Arc<BaseConsumer<QuietContext>>>>,
}

impl SharedClient {
    /// A client of `connection` with `settings`; `what` names it in errors.
    pub(crate) fn new(
        connection: Connection,
        settings: &'static [(&'static str, &'static str)],
        what: &'static str,
    ) -> SharedClient {
        SharedClient {
            connection,
            settings,
            what,
            client: Default::default(),
        }
    }

    /// The client, created now if it was not yet.
    pub(crate) fn get(&self) -> Result<Arc<BaseConsumer<QuietContext>>, KafkaError> {
        let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = client.as_ref() {
            return Ok(c.clone());
        }
        let c: BaseConsumer<QuietContext> = self
            .connection
            .config_with(self.settings)
            .create_with_context(QuietContext::default())
            .map_err(|e| KafkaError::client(format!("creating {}", self.what), e))?;
        let c = Arc::new(c);
        *client = Some(c.clone());
        Ok(c)
    }
}

/// Whether a repeated failure is due to be logged again: once a minute.
#[derive(Default)]
pub(crate) struct OncePerMinute(Option<Instant>);

impl OncePerMinute {
    pub(crate) fn due(&mut self) -> bool {
        let due = self
            .0
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(60));
        if due {
            self.0 = Some(Instant::now());
        }
        due
    }
}

/// A Kafka operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A client call failed; the source is the client's error.
    #[error("kafka: {operation}")]
    Client {
        /// What was being done.
        operation: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A call got no answer in time.
    #[error("kafka: {operation}: {what}")]
    Timeout {
        /// What was being done.
        operation: String,
        /// What did not happen in time, and what to check.
        what: String,
    },
    /// A topic is missing or unusable.
    #[error("topic {topic:?}: {message}")]
    Topic {
        /// The topic.
        topic: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The brokers' authorizer refused this client's principal an operation
    /// on a resource: retrying cannot help until an ACL is granted.
    #[error(
        "{resource}: not authorized: the brokers refused {operation} on it to this client's \
         principal: {code}; grant the principal its prefixed ACLs (docs/kafka-security.md), or \
         check -X sasl.username"
    )]
    NotAuthorized {
        /// What was refused, e.g. `topic "acme.payments"`.
        resource: String,
        /// The ACL operation needed (Describe, Read, Write, Create, ...).
        operation: String,
        /// The brokers' answer (librdkafka's text for its error code).
        code: String,
    },
}

impl KafkaError {
    /// A client error while doing `operation`.
    pub(crate) fn client(operation: impl Into<String>, source: ClientError) -> Self {
        Self::Client {
            operation: operation.into(),
            source: Box::new(source),
        }
    }

    /// A call that timed out.
    pub(crate) fn timeout(operation: impl Into<String>, what: impl Into<String>) -> Self {
        Self::Timeout {
            operation: operation.into(),
            what: what.into(),
        }
    }

    /// A topic problem.
    pub(crate) fn topic(topic: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Topic {
            topic: topic.into(),
            message: message.into(),
        }
    }

    /// The authorizer refused `operation` on `resource` (see
    /// [`authorization_failure`]).
    pub(crate) fn not_authorized(
        resource: impl Into<String>,
        operation: impl Into<String>,
        code: RDKafkaErrorCode,
    ) -> Self {
        Self::NotAuthorized {
            resource: resource.into(),
            operation: operation.into(),
            code: code.to_string(),
        }
    }
}

impl Connection {
    /// The settings every client shares: the bootstrap servers, then `-X`.
    pub(crate) fn config(&self) -> ClientConfig {
        self.config_with(&[])
    }

    /// The bootstrap servers, then `settings`, then `-X` (which wins).
    pub(crate) fn config_with(&self, settings: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.bootstrap_servers);
        for (k, v) in settings {
            c.set(*k, *v);
        }
        for (k, v) in &self.extra_config {
            c.set(k, v);
        }
        c
    }

    /// A consumer that reads assigned partitions to their end: never in a
    /// group (`group.id` only names it), never committing, reporting each
    /// partition's end; `isolation` is `read_committed` or
    /// `read_uncommitted`. An empty fetch returns after `fetch_wait_ms`.
    pub(crate) fn reader<C: ConsumerContext>(
        &self,
        group: &str,
        isolation: &str,
        fetch_wait_ms: u32,
        context: C,
    ) -> Result<BaseConsumer<C>, KafkaError> {
        let fetch_wait = fetch_wait_ms.to_string();
        let c = self.config_with(&[
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "true"),
            ("auto.offset.reset", "earliest"),
            ("isolation.level", isolation),
            ("fetch.wait.max.ms", &fetch_wait),
        ]);
        c.create_with_context(context)
            .map_err(|e| KafkaError::client(format!("creating a consumer ({group})"), e))
    }
}

/// A group member's session timeout, and heartbeats at a tenth of it (at
/// least 100 ms apart): members learn of a rebalance within a tenth of a
/// session (the failover benchmark, bench/README.md). Classic protocol.
pub(crate) fn set_session(c: &mut ClientConfig, session: Duration) {
    c.set("session.timeout.ms", session.as_millis().to_string())
        .set(
            "heartbeat.interval.ms",
            (session.as_millis() / 10).max(100).to_string(),
        );
}

/// How asking for a group's committed offsets failed
/// ([`committed_offsets`]).
#[derive(Debug)]
pub(crate) enum CommittedError {
    /// No answer within the time given: librdkafka asks with
    /// `require_stable` (KIP-447) and retries while a transaction holding
    /// the offsets is open, and retries while it looks for the group's
    /// coordinator; either kept it waiting. The last error it reported.
    Unanswered(ClientError),
    /// Anything else (not authorized, an unknown group or topic).
    Failed(ClientError),
}

impl CommittedError {
    /// The client's error, whichever way it failed.
    pub(crate) fn into_cause(self) -> ClientError {
        match self {
            CommittedError::Unanswered(e) | CommittedError::Failed(e) => e,
        }
    }
}

/// The committed offsets of `partitions` in the consumer's group (stable:
/// librdkafka asks with `require_stable` when the consumer reads
/// read_committed), within `timeout`. A coordinator that moved or is loading
/// (`NOT_COORDINATOR`, `COORDINATOR_NOT_AVAILABLE`,
/// `COORDINATOR_LOAD_IN_PROGRESS`: a busy, restarting or re-electing broker)
/// is asked again, 200 ms later, until then: librdkafka reports those at
/// once from `committed`, and each used to restart a worker's session with
/// a message that blamed an open transaction.
pub(crate) fn committed_offsets<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &rdkafka::TopicPartitionList,
    timeout: Duration,
) -> Result<rdkafka::TopicPartitionList, CommittedError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match consumer.committed_offsets(partitions.clone(), left) {
            Ok(committed) => return Ok(committed),
            Err(e) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut) => {
                return Err(CommittedError::Unanswered(e));
            }
            Err(e) if coordinator_moving(&e) => {
                if left <= Duration::from_millis(200) {
                    return Err(CommittedError::Unanswered(e));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(CommittedError::Failed(e)),
        }
    }
}
