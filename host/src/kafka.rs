//! The shared Kafka plumbing: client settings, topic admin, reading a topic
//! to its end, sending records, and what a client error means.
//!
//! rdkafka is owned here, by `stream` (the EOS loop's consumer and
//! transactional producer) and by `fleet::control` (the control topics). No
//! `pub` signature outside these modules names an rdkafka type: callers see
//! [`Connection`] and [`KafkaError`].

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError as ClientError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header as KHeader, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};

use crate::types::{Header, InputRecord, OutputRecord};

mod secrets;
pub use secrets::{ConfigError, FILE_SECRETS, PASSWORD_ENV, extra_config, is_secret};

/// How long metadata and admin calls may take.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Whether a code is the brokers' authorizer refusing this client's
/// principal (an ACL is missing).
pub(crate) fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::GroupAuthorizationFailed
            | RDKafkaErrorCode::ClusterAuthorizationFailed
            | RDKafkaErrorCode::TransactionalIdAuthorizationFailed
    )
}

/// The authorizer's refusal in a client error, if that is what it is.
pub(crate) fn authorization_failure(e: &ClientError) -> Option<RDKafkaErrorCode> {
    e.rdkafka_error_code().filter(|c| is_authorization(*c))
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

/// The partitions of `topic`, or `None` when it does not exist. A topic
/// this client's principal may not describe is an error
/// ([`KafkaError::NotAuthorized`]): the brokers answer so whether it
/// exists or not, and "does not exist" would send the user the wrong way.
pub(crate) fn partitions<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<Option<Vec<i32>>, KafkaError> {
    let md = consumer
        .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("fetching metadata of {topic}"), e))?;
    let Some(t) = md.topics().first() else {
        return Ok(None);
    };
    match t.error().map(RDKafkaErrorCode::from) {
        Some(code) if is_authorization(code) => Err(KafkaError::not_authorized(
            format!("topic {topic:?}"),
            "Describe",
            code,
        )),
        Some(_) => Ok(None),
        None if t.partitions().is_empty() => Ok(None),
        None => Ok(Some(t.partitions().iter().map(|p| p.id()).collect())),
    }
}

/// Polls an assigned reader (see [`Connection::reader`]) until each of its
/// `partitions` assigned partitions has reported its end, `on_record`
/// returns `Break`, or `deadline` passes ([`KafkaError::Timeout`]). Client
/// errors are logged (rate-limited) and polling goes on. With
/// read_committed, a partition's end is its last stable offset.
pub(crate) fn read_to_end<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: usize,
    what: &str,
    deadline: Instant,
    mut on_record: impl FnMut(&BorrowedMessage<'_>) -> ControlFlow<()>,
) -> Result<(), KafkaError> {
    let errors = ErrorLog::default();
    let mut ended = std::collections::HashSet::new();
    while ended.len() < partitions {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) if on_record(&m).is_break() => return Ok(()),
            Some(Ok(_)) => {}
            Some(Err(ClientError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => {
                errors.report(what, &e, "reading to the end");
                std::thread::sleep(Duration::from_millis(50));
            }
            None => {}
        }
        if ended.len() < partitions && Instant::now() >= deadline {
            return Err(KafkaError::timeout(
                format!("reading {what}"),
                "did not reach the end of every partition in time: are the brokers reachable?",
            ));
        }
    }
    Ok(())
}

/// Assigns `(topic, partition, from)` to a reader; `from: None` is the
/// beginning.
pub(crate) fn assign<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[(&str, i32, Option<i64>)],
) -> Result<(), KafkaError> {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for (topic, partition, from) in partitions {
        let offset = from.map_or(rdkafka::Offset::Beginning, rdkafka::Offset::Offset);
        tpl.add_partition_offset(topic, *partition, offset)
            .map_err(|e| KafkaError::client(format!("assigning {topic}/{partition}"), e))?;
    }
    consumer
        .assign(&tpl)
        .map_err(|e| KafkaError::client("assigning partitions", e))
}

/// A partition's (low, high) watermarks; for a read_committed client the
/// high one is the last stable offset.
pub(crate) fn watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64), KafkaError> {
    consumer
        .fetch_watermarks(topic, partition, ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("reading the bounds of {topic}/{partition}"), e))
}

/// `topic`'s `partition`'s (low, high) watermarks as the consumer's last
/// fetch from it saw them (librdkafka keeps them per partition), without
/// asking the broker; `None` before the first fetch. For a read_committed
/// consumer the high one can be past the last stable offset (an open
/// transaction).
pub(crate) fn fetched_watermarks<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<(i64, i64)> {
    let topic = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1_i64, -1_i64);
    // SAFETY: the client handle lives as long as `consumer`, which this
    // call borrows; the topic is a NUL-terminated string that outlives the
    // call; librdkafka only writes the two integers and keeps no pointer.
    // rust-rdkafka wraps only the querying variant (a broker round trip).
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        && low >= 0
        && high >= 0)
        .then_some((low, high))
}

/// The next offset an assigned reader will return from `topic`'s
/// `partition`: past the transaction markers and aborted records it skipped
/// (librdkafka advances past them); -1 before its first fetch.
pub(crate) fn position<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> i64 {
    consumer
        .position()
        .ok()
        .and_then(|tpl| {
            tpl.find_partition(topic, partition)
                .and_then(|p| p.offset().to_raw())
        })
        .unwrap_or(-1)
}

/// A topic the host creates for itself.
pub(crate) struct TopicSpec<'a> {
    pub name: &'a str,
    pub partitions: i32,
    pub config: &'a [(&'a str, &'a str)],
}

/// An admin client.
pub(crate) fn admin(conn: &Connection) -> Result<AdminClient<QuietContext>, KafkaError> {
    conn.config()
        .create_with_context(QuietContext::default())
        .map_err(|e| KafkaError::client("creating an admin client", e))
}

/// The configuration of `topic` as the brokers report it (every entry,
/// defaults included), its replication factor (the smallest of its
/// partitions') and the number of brokers.
pub(crate) fn topic_config(
    conn: &Connection,
    topic: &str,
) -> Result<(std::collections::BTreeMap<String, String>, usize, usize), KafkaError> {
    use rdkafka::admin::ResourceSpecifier;
    let admin = admin(conn)?;
    let opts = rdkafka::admin::AdminOptions::new().request_timeout(Some(ADMIN_TIMEOUT));
    let results = futures::executor::block_on(
        admin.describe_configs(&[ResourceSpecifier::Topic(topic)], &opts),
    )
    .map_err(|e| KafkaError::client(format!("describing topic {topic}"), e))?;
    let mut config = std::collections::BTreeMap::new();
    for r in results {
        let resource = r.map_err(|code| {
            if is_authorization(code) {
                KafkaError::not_authorized(format!("topic {topic:?}"), "DescribeConfigs", code)
            } else {
                KafkaError::topic(topic, format!("cannot read its configuration: {code}"))
            }
        })?;
        for e in resource.entries {
            if let Some(v) = e.value {
                config.insert(e.name, v);
            }
        }
    }
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("reading the metadata of {topic}"), e))?;
    let replicas = md
        .topics()
        .iter()
        .flat_map(|t| t.partitions())
        .map(|p| p.replicas().len())
        .min()
        .unwrap_or(0);
    Ok((config, replicas, md.brokers().len()))
}

/// A client for metadata calls only.
pub(crate) fn metadata_client(conn: &Connection) -> Result<BaseConsumer<QuietContext>, KafkaError> {
    conn.config()
        .create_with_context(QuietContext::default())
        .map_err(|e| KafkaError::client("creating a metadata client", e))
}

/// Why an attempt of [`wait_until`] did not succeed.
pub(crate) enum NotYet {
    /// Try again; the reason is logged.
    Retry(String),
    /// Waiting cannot help (a refused ACL): give up at once.
    Fatal(KafkaError),
}

impl From<String> for NotYet {
    fn from(reason: String) -> Self {
        Self::Retry(reason)
    }
}

impl From<KafkaError> for NotYet {
    /// A refusal is fatal; anything else is worth another try.
    fn from(e: KafkaError) -> Self {
        match e {
            e @ KafkaError::NotAuthorized { .. } => Self::Fatal(e),
            e => Self::Retry(crate::types::error_chain(&e)),
        }
    }
}

/// Calls `attempt` until it succeeds or `deadline` passes, logging what it
/// waits for: once when it starts waiting, then every 10 s with the latest
/// reason. `what` names what is awaited (e.g. "the Kafka brokers at
/// host:port"), `hint` what to check if it never comes. The timeout names
/// both, how long it waited and the last reason. A [`NotYet::Fatal`]
/// attempt ends the wait with its error.
pub(crate) fn wait_until<T, E: Into<NotYet>>(
    what: &str,
    hint: &str,
    deadline: Instant,
    mut attempt: impl FnMut(Duration) -> Result<T, E>,
) -> Result<T, KafkaError> {
    let started = Instant::now();
    let mut last_log: Option<Instant> = None;
    loop {
        // Each attempt gets at most 5 s, and never past the deadline.
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = attempt(left.clamp(Duration::from_millis(500), Duration::from_secs(5)))
            .map_err(Into::into);
        let reason = match outcome {
            Err(NotYet::Fatal(e)) => return Err(e),
            Err(NotYet::Retry(reason)) => reason,
            Ok(v) => {
                if last_log.is_some() {
                    tracing::info!(
                        "done waiting for {what} ({:.1} s)",
                        started.elapsed().as_secs_f64()
                    );
                }
                return Ok(v);
            }
        };
        if Instant::now() >= deadline {
            return Err(KafkaError::timeout(
                format!("waiting for {what}"),
                format!(
                    "not there within {} s (last: {reason}): {hint}",
                    deadline
                        .saturating_duration_since(started)
                        .as_secs_f64()
                        .round()
                ),
            ));
        }
        match last_log {
            None => {
                tracing::info!(
                    "waiting for {what} (up to {} s): {reason}; {hint}",
                    deadline
                        .saturating_duration_since(started)
                        .as_secs_f64()
                        .round()
                );
                last_log = Some(Instant::now());
            }
            Some(t) if t.elapsed() >= Duration::from_secs(10) => {
                tracing::warn!(
                    "still waiting for {what} after {} s: {reason}",
                    started.elapsed().as_secs()
                );
                last_log = Some(Instant::now());
            }
            Some(_) => {}
        }
        std::thread::sleep(Duration::from_millis(500).min(left));
    }
}

/// Waits until a broker of the cluster answers, up to `deadline`: after the
/// first failed try (at most 5 s) it logs the address it waits for and what
/// to check, again every 10 s, and the error at the end names both. Returns
/// how many brokers the cluster has.
pub fn wait_for_brokers(conn: &Connection, deadline: Instant) -> Result<usize, KafkaError> {
    let client = metadata_client(conn)?;
    wait_until(
        &format!("the Kafka brokers at {}", conn.bootstrap_servers),
        "is Kafka running there, and do --bootstrap-servers (ONCEFLOW_BOOTSTRAP) and the -X settings reach it?",
        deadline,
        |timeout| match client.fetch_metadata(None, timeout) {
            Ok(md) if !md.brokers().is_empty() => Ok(md.brokers().len()),
            Ok(_) => Err("the cluster lists no brokers yet".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    )
}

/// Waits until every partition of each of `topics` has a leader that
/// answers for its offsets (a topic just created may not have one for a
/// moment: metadata calls then say UnknownPartition or
/// NotLeaderForPartition), up to `deadline`.
pub(crate) fn wait_for_topics(
    conn: &Connection,
    topics: &[&str],
    deadline: Instant,
) -> Result<(), KafkaError> {
    let client = metadata_client(conn)?;
    wait_until(
        &format!("the leaders of {}", topics.join(", ")),
        &format!(
            "are the brokers at {} healthy (`kafka-topics.sh --describe` shows each partition's leader)?",
            conn.bootstrap_servers
        ),
        deadline,
        |timeout| {
            for topic in topics {
                let md = client
                    .fetch_metadata(Some(topic), timeout)
                    .map_err(|e| format!("{topic}: {e}"))?;
                let t = md
                    .topics()
                    .first()
                    .ok_or_else(|| format!("{topic}: not in the metadata yet"))?;
                if let Some(e) = t.error() {
                    return Err(format!("{topic}: {}", RDKafkaErrorCode::from(e)));
                }
                if t.partitions().is_empty() {
                    return Err(format!("{topic}: no partitions yet"));
                }
                for p in t.partitions() {
                    if let Some(e) = p.error() {
                        return Err(format!("{topic}/{}: {}", p.id(), RDKafkaErrorCode::from(e)));
                    }
                    if p.leader() < 0 {
                        return Err(format!("{topic}/{}: no leader yet", p.id()));
                    }
                    client
                        .fetch_watermarks(topic, p.id(), timeout)
                        .map_err(|e| format!("{topic}/{}: {e}", p.id()))?;
                }
            }
            Ok(())
        },
    )
}

/// Creates topics that do not exist yet, replicated up to 3 times (as many
/// as there are brokers).
pub(crate) fn create_topics(conn: &Connection, specs: &[TopicSpec<'_>]) -> Result<(), KafkaError> {
    let admin = admin(conn)?;
    let probe = metadata_client(conn)?;
    let brokers = probe
        .fetch_metadata(None, ADMIN_TIMEOUT)
        .map(|m| m.brokers().len())
        .unwrap_or(1)
        .clamp(1, 3) as i32;
    let new: Vec<NewTopic<'_>> = specs
        .iter()
        .map(|spec| {
            let mut t = NewTopic::new(spec.name, spec.partitions, TopicReplication::Fixed(brokers))
                .set("min.insync.replicas", if brokers >= 3 { "2" } else { "1" });
            for (k, v) in spec.config {
                t = t.set(k, v);
            }
            t
        })
        .collect();
    let results = futures::executor::block_on(admin.create_topics(
        &new,
        &AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT)),
    ))
    .map_err(|e| KafkaError::client("creating topics", e))?;
    for r in results {
        match r {
            Ok(topic) => tracing::info!(%topic, "created topic"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(%topic, "topic already exists")
            }
            Err((topic, code)) if is_authorization(code) => {
                return Err(KafkaError::not_authorized(
                    format!("topic {topic:?}"),
                    "Create",
                    code,
                ));
            }
            Err((topic, code)) => {
                return Err(KafkaError::topic(
                    topic,
                    format!("cannot create the topic: {code}"),
                ));
            }
        }
    }
    Ok(())
}

/// The topic names a consumer has seen, shared by the records that come
/// from them: a polled record costs no allocation for its topic's name.
#[derive(Debug, Default)]
pub(crate) struct TopicNames(Vec<Arc<str>>);

impl TopicNames {
    /// The shared name `topic` (a linear search: a consumer reads a few
    /// topics, its inputs and tables).
    pub(crate) fn get(&mut self, topic: &str) -> Arc<str> {
        if let Some(name) = self.0.iter().find(|n| &***n == topic) {
            return name.clone();
        }
        let name: Arc<str> = Arc::from(topic);
        self.0.push(name.clone());
        name
    }
}

/// Copies a consumed message into an [`InputRecord`].
pub(crate) fn to_input(m: &BorrowedMessage<'_>, topics: &mut TopicNames) -> InputRecord {
    let headers = m
        .headers()
        .map(|hs| {
            hs.iter()
                .map(|h| Header {
                    key: h.key.to_owned(),
                    value: h.value.map(<[u8]>::to_vec).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    InputRecord {
        topic: topics.get(m.topic()),
        partition: m.partition(),
        offset: m.offset(),
        timestamp: m.timestamp().to_millis().unwrap_or(0),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// A record to send.
pub(crate) struct Outgoing<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition (`None`: from the key, Java's murmur2).
    pub partition: Option<i32>,
    /// Key.
    pub key: Option<&'a [u8]>,
    /// Value (`None`: tombstone).
    pub value: Option<&'a [u8]>,
    /// Headers.
    pub headers: &'a [Header],
    /// Timestamp, ms (`None`: the producer's clock).
    pub timestamp: Option<i64>,
}

/// Sends one record, waiting for room in the producer's queue.
pub(crate) fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    out: Outgoing<'_>,
) -> Result<(), ClientError> {
    let Outgoing {
        topic,
        partition,
        key,
        value,
        headers,
        timestamp,
    } = out;
    let owned = (!headers.is_empty()).then(|| {
        headers
            .iter()
            .fold(OwnedHeaders::new_with_capacity(headers.len()), |hs, h| {
                hs.insert(KHeader {
                    key: &h.key,
                    value: Some(&h.value),
                })
            })
    });
    loop {
        let mut record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic);
        if let Some(k) = key {
            record = record.key(k);
        }
        if let Some(v) = value {
            record = record.payload(v);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        if let Some(t) = timestamp.filter(|t| *t > 0) {
            record = record.timestamp(t);
        }
        if let Some(h) = &owned {
            record = record.headers(h.clone());
        }
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((ClientError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Sends an output record (partition chosen from the key).
pub(crate) fn send_output<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    o: &OutputRecord,
) -> Result<(), ClientError> {
    send(
        producer,
        Outgoing {
            topic: &o.topic,
            partition: None,
            key: o.key.as_deref(),
            value: o.value.as_deref(),
            headers: &o.headers,
            timestamp: o.timestamp,
        },
    )
}

/// Waits until every produced record is acknowledged (or failed) and its
/// delivery report served. rdkafka's `flush` polls in 100 ms steps, which
/// would add up to 100 ms to every commit. A short `poll` does not help:
/// rdkafka 0.39's `BaseProducer::poll` loops until its deadline and hands
/// librdkafka the time left in whole milliseconds, so `poll(1 ms)` asks
/// for 0 ms and spins for the whole millisecond (half the commit thread's
/// CPU was `clock_gettime` in a profile of the wallet). So: serve one event
/// at a time without waiting while they come, and nap [`DRAIN_NAP`] when
/// none is ready.
pub(crate) fn drain<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> Result<(), ClientError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let before = producer.in_flight_count();
        if before == 0 {
            return Ok(());
        }
        // At most one event; every event served lowers the count.
        producer.poll(Duration::ZERO);
        let after = producer.in_flight_count();
        if after == 0 {
            return Ok(());
        }
        if after < before {
            continue;
        }
        if std::time::Instant::now() >= deadline {
            return Err(ClientError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        std::thread::sleep(DRAIN_NAP);
    }
}

/// How long [`drain`] sleeps when no delivery report is ready: what it
/// adds to a commit at most, against a spinning thread.
const DRAIN_NAP: Duration = Duration::from_micros(200);

/// Client-level errors (brokers down, transport failures) arrive on every
/// poll while a broker is away; this logs them at most every 5 s, with a
/// count, instead of thousands of lines a second.
#[derive(Default)]
pub(crate) struct ErrorLog {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl ErrorLog {
    /// Records an error from librdkafka's error callback.
    pub(crate) fn report(&self, client: &str, error: &ClientError, reason: &str) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 += 1;
        if s.0.is_none_or(|t| t.elapsed() >= Duration::from_secs(5)) {
            tracing::warn!(
                "{client}: {error}: {reason} ({} similar errors since the last report)",
                s.1
            );
            *s = (Some(std::time::Instant::now()), 0);
        }
    }
}

/// The context of the helper consumers that read to a partition's end
/// (restore, verify): the end-of-partition events they ask for are not
/// errors, nor is a SASL handshake cut short by their own close, and other
/// client errors are rate-limited.
#[derive(Default)]
pub(crate) struct QuietContext {
    errors: ErrorLog,
}

impl rdkafka::client::ClientContext for QuietContext {
    fn error(&self, error: ClientError, reason: &str) {
        if is_sasl_handshake_cut(reason) {
            tracing::debug!("consumer: {error}: {reason}");
        } else if !is_end_of_partition(&error) {
            self.errors.report("consumer", &error, reason);
        }
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        log(level, fac, message);
    }
}

/// librdkafka's log lines, as every client context of the host logs them:
/// at their own level, except the ones that only say librdkafka is already
/// retrying something that heals by itself (a healthy run prints no
/// warning), which go to debug.
pub(crate) fn log(level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
    use rdkafka::config::RDKafkaLogLevel as L;
    match level {
        _ if is_sasl_handshake_cut(message)
            || is_retried_pid(fac, message)
            || is_stale_generation_txnerr(fac, message) =>
        {
            tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Emerg | L::Alert | L::Critical | L::Error => {
            tracing::error!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Warning => tracing::warn!(target: "librdkafka", "librdkafka: {fac} {message}"),
        L::Notice | L::Info => {
            tracing::info!(target: "librdkafka", "librdkafka: {fac} {message}")
        }
        L::Debug => tracing::debug!(target: "librdkafka", "librdkafka: {fac} {message}"),
    }
}

/// Whether librdkafka says it failed to get a producer id and is retrying:
/// a cluster just started or a coordinator just moved answers "Not
/// coordinator" or "Coordinator load in progress" for a moment. If it never
/// heals, `init_transactions` times out, and that error is reported.
fn is_retried_pid(fac: &str, message: &str) -> bool {
    fac == "GETPID" && message.contains("Failed to acquire") && message.ends_with(": retrying")
}

/// Whether librdkafka says the open transaction failed because its offsets
/// were sent for a group generation that a rebalance just ended
/// (`send_offsets_to_transaction` answered ILLEGAL_GENERATION, or the member
/// was unknown or rebalancing). The worker gets the same error from the call,
/// aborts and rewinds, and logs that at info ([`is_stale_generation`]); a
/// host joining a deployment's group while its first transaction commits
/// printed this line at ERROR (the README's second host, 2026-12-03).
fn is_stale_generation_txnerr(fac: &str, message: &str) -> bool {
    fac == "TXNERR"
        && STALE_GENERATION
            .iter()
            .any(|(_, name)| message.contains(name))
}

/// Whether librdkafka reports a SASL handshake that its own disconnect cut
/// short: a client closed while its group coordinator's connection was
/// still authenticating. Benign (the request fails with a local transport
/// error, not an authentication error), but logged at ERROR and sent to
/// the error callback; `onceflow verify`'s short-lived readers met it on
/// every run against a SASL_SSL broker (also confluent-kafka-python#1780).
/// Wrong credentials say "Authentication failed" instead. The cut comes in
/// either step of the handshake: the mechanism handshake or the
/// authentication that follows it.
fn is_sasl_handshake_cut(text: &str) -> bool {
    text.contains("SaslAuthenticateRequest failed: Local: Broker transport failure")
        || (text.contains("mechanism handshake failed")
            && text.contains("Local: Broker transport failure"))
}

/// Whether an error only says that a consumer reached a partition's end:
/// it comes with the message stream, and also (as a "global" error) to the
/// client's error callback.
fn is_end_of_partition(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::PartitionEOF(_) | ClientError::Global(RDKafkaErrorCode::PartitionEOF)
    )
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// What to do about a failed transactional call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxnFailure {
    /// Call it again.
    Retry,
    /// Abort the transaction, rewind, carry on.
    Abort,
    /// The producer is unusable (fenced, fatal, or in an unknown state):
    /// re-create it and rejoin.
    Fatal,
}

/// Classifies a transactional error as librdkafka's transactional API
/// documents: fatal, abortable, retriable; none of the three is fatal.
pub(crate) fn classify(e: &ClientError) -> TxnFailure {
    match e {
        ClientError::Transaction(r) if r.is_fatal() => TxnFailure::Fatal,
        ClientError::Transaction(r) if r.txn_requires_abort() => TxnFailure::Abort,
        ClientError::Transaction(r) if r.is_retriable() => TxnFailure::Retry,
        _ => TxnFailure::Fatal,
    }
}

/// Whether an error means this producer or member was fenced by a newer
/// one (a zombie caught).
pub(crate) fn is_fencing(e: &ClientError) -> bool {
    let code = e.rdkafka_error_code();
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::FencedInstanceId
        )
    )
}

/// Whether an offset commit was refused because the group moved on: a
/// rebalance began (a new generation), or the member's session expired
/// (unknown member). Not fencing: the consumer rejoins by itself on its
/// next poll and gets its new assignment (Kafka Streams' "task migrated":
/// close the tasks, keep the producer, rejoin).
pub(crate) fn is_stale_generation(e: &ClientError) -> bool {
    e.rdkafka_error_code()
        .is_some_and(|code| STALE_GENERATION.iter().any(|(stale, _)| *stale == code))
}

/// The codes of a group that moved on, with the name librdkafka's log lines
/// give each (in parentheses, at the end of a TXNERR line).
const STALE_GENERATION: [(RDKafkaErrorCode, &str); 3] = [
    (RDKafkaErrorCode::IllegalGeneration, "(ILLEGAL_GENERATION)"),
    (
        RDKafkaErrorCode::RebalanceInProgress,
        "(REBALANCE_IN_PROGRESS)",
    ),
    (RDKafkaErrorCode::UnknownMemberId, "(UNKNOWN_MEMBER_ID)"),
];

/// A member of a consumer group (classic protocol) and the partitions it
/// was assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupMember {
    /// Its `client.id`.
    pub client_id: String,
    /// Its assignment, `(topic, partition)`.
    pub partitions: Vec<(String, i32)>,
}

/// The members of `group` and their assignments, as the group coordinator
/// describes them (DescribeGroups); `None` while the group is not stable
/// (a rebalance is under way: the assignments are not final).
pub(crate) fn group_members<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    group: &str,
) -> Result<Option<Vec<GroupMember>>, KafkaError> {
    let list = consumer
        .fetch_group_list(Some(group), ADMIN_TIMEOUT)
        .map_err(|e| KafkaError::client(format!("describing consumer group {group}"), e))?;
    let Some(info) = list.groups().iter().find(|g| g.name() == group) else {
        return Ok(None);
    };
    if info.state() != "Stable" {
        return Ok(None);
    }
    let mut members = Vec::new();
    for m in info.members() {
        let partitions = match m.assignment() {
            Some(bytes) if !bytes.is_empty() => parse_assignment(bytes).unwrap_or_else(|| {
                tracing::debug!(
                    group,
                    member = m.id(),
                    "an assignment this host cannot read"
                );
                Vec::new()
            }),
            _ => Vec::new(),
        };
        members.push(GroupMember {
            client_id: m.client_id().to_owned(),
            partitions,
        });
    }
    Ok(Some(members))
}

/// Reads a consumer protocol assignment (any version; none has tagged
/// fields): version (i16), then topics (i32 count) of name (i16 length,
/// bytes) and partitions (i32 count, i32 each), then user data.
fn parse_assignment(bytes: &[u8]) -> Option<Vec<(String, i32)>> {
    struct Reader<'a>(&'a [u8]);
    impl Reader<'_> {
        fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
            let (head, rest) = self.0.split_first_chunk::<N>()?;
            self.0 = rest;
            Some(*head)
        }
        fn i16(&mut self) -> Option<i16> {
            self.take().map(i16::from_be_bytes)
        }
        fn i32(&mut self) -> Option<i32> {
            self.take().map(i32::from_be_bytes)
        }
    }
    let mut r = Reader(bytes);
    let _version = r.i16()?;
    let topics = r.i32()?;
    let mut out = Vec::new();
    for _ in 0..topics.max(0) {
        let len = usize::try_from(r.i16()?).ok()?;
        let name = r.0.get(..len)?;
        let name = std::str::from_utf8(name).ok()?.to_owned();
        r.0 = &r.0[len..];
        let count = r.i32()?;
        for _ in 0..count.max(0) {
            out.push((name.clone(), r.i32()?));
        }
    }
    Some(out)
}

/// Next offsets per (topic, partition), as a partition list.
pub(crate) fn offsets_list(next: &BTreeMap<(String, i32), i64>) -> rdkafka::TopicPartitionList {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        // Cannot fail: the offset is absolute.
        let _ = tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset));
    }
    tpl
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes Kafka's `ConsumerProtocol.serializeAssignment` writes
    /// (version 3: topic "in" partitions 0 and 2, topic "t" partition 1,
    /// empty user data); a truncated copy is refused, not misread.
    #[test]
    fn reads_a_consumer_protocol_assignment() {
        let mut b = Vec::new();
        b.extend(3i16.to_be_bytes());
        b.extend(2i32.to_be_bytes());
        b.extend(2i16.to_be_bytes());
        b.extend(b"in");
        b.extend(2i32.to_be_bytes());
        b.extend(0i32.to_be_bytes());
        b.extend(2i32.to_be_bytes());
        b.extend(1i16.to_be_bytes());
        b.extend(b"t");
        b.extend(1i32.to_be_bytes());
        b.extend(1i32.to_be_bytes());
        b.extend((-1i32).to_be_bytes());
        assert_eq!(
            parse_assignment(&b),
            Some(vec![
                ("in".to_owned(), 0),
                ("in".to_owned(), 2),
                ("t".to_owned(), 1)
            ])
        );
        assert_eq!(parse_assignment(&b[..b.len() - 9]), None);
    }

    /// librdkafka's TXNERR line for a commit refused for a stale generation
    /// is not an error line (the worker aborts, rewinds and logs it at info).
    #[test]
    fn a_transaction_failed_by_a_rebalance_is_not_an_error_line() {
        // The line as librdkafka 2.12.1 wrote it (CI, the README's second host).
        let line = "Current transaction failed in state InTransaction: Failed to commit offsets to \
                    transaction on broker 127.0.0.1:19192/1: demo.payments((null))[2](Broker: \
                    Specified group generation id is not valid) (after 23ms) (ILLEGAL_GENERATION)";
        assert!(is_stale_generation_txnerr("TXNERR", line));
        assert!(!is_stale_generation_txnerr("GETPID", line));
        let fenced = "Current transaction failed in state InTransaction: ... (PRODUCER_FENCED)";
        assert!(!is_stale_generation_txnerr("TXNERR", fenced));
    }

    /// A commit refused for a stale generation (a rebalance began) used to
    /// count as fencing: the worker dropped producer and consumer and
    /// rejoined under its static id, which gets the old assignment back
    /// without a rebalance (issue 16, item 9).
    #[test]
    fn a_stale_generation_is_not_fencing() {
        for code in [
            RDKafkaErrorCode::IllegalGeneration,
            RDKafkaErrorCode::RebalanceInProgress,
            RDKafkaErrorCode::UnknownMemberId,
        ] {
            let e = ClientError::Global(code);
            assert!(!is_fencing(&e), "{code:?} is not fencing");
            assert!(is_stale_generation(&e), "{code:?} is a stale generation");
        }
        for code in [
            RDKafkaErrorCode::ProducerFenced,
            RDKafkaErrorCode::FencedInstanceId,
            RDKafkaErrorCode::InvalidProducerEpoch,
        ] {
            let e = ClientError::Global(code);
            assert!(is_fencing(&e), "{code:?} is fencing");
            assert!(!is_stale_generation(&e));
        }
    }

    #[test]
    fn a_producer_id_librdkafka_retries_is_not_a_warning() {
        assert!(is_retried_pid(
            "GETPID",
            "[thrd:main]: Failed to acquire transactional PID from broker TxnCoordinator/1: \
             Broker: Not coordinator: retrying"
        ));
        assert!(is_retried_pid(
            "GETPID",
            "Failed to acquire idempotence PID from broker 127.0.0.1:19192/1: \
             Broker: Coordinator load in progress: retrying"
        ));
        assert!(!is_retried_pid(
            "GETPID",
            "Failed to acquire transactional PID from broker TxnCoordinator/1: \
             Broker: Transactional Id authorization failed"
        ));
    }

    #[test]
    fn a_sasl_handshake_cut_by_a_close_is_not_an_error() {
        assert!(is_sasl_handshake_cut(
            "GroupCoordinator: SASL authentication error: SaslAuthenticateRequest failed: \
             Local: Broker transport failure (after 0ms in state DOWN)"
        ));
        assert!(is_sasl_handshake_cut(
            "GroupCoordinator: SASL SCRAM-SHA-512 mechanism handshake failed: \
             Local: Broker transport failure: broker's supported mechanisms: SCRAM-SHA-512"
        ));
        assert!(!is_sasl_handshake_cut(
            "sasl_ssl://127.0.0.1:9093/1: SASL authentication error: Authentication failed \
             during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
        ));
    }

    #[test]
    fn authorization_failures_are_told_apart() {
        for code in [
            RDKafkaErrorCode::TopicAuthorizationFailed,
            RDKafkaErrorCode::GroupAuthorizationFailed,
            RDKafkaErrorCode::TransactionalIdAuthorizationFailed,
            RDKafkaErrorCode::ClusterAuthorizationFailed,
        ] {
            assert_eq!(
                authorization_failure(&ClientError::Global(code)),
                Some(code)
            );
        }
        assert_eq!(
            authorization_failure(&ClientError::Global(
                RDKafkaErrorCode::BrokerTransportFailure
            )),
            None
        );
        let e = KafkaError::not_authorized(
            "topic \"acme.payments\"",
            "Describe",
            RDKafkaErrorCode::TopicAuthorizationFailed,
        );
        assert!(
            e.to_string().starts_with(
                "topic \"acme.payments\": not authorized: the brokers refused Describe"
            ),
            "{e}"
        );
    }

    #[test]
    fn the_end_of_a_partition_is_not_an_error() {
        assert!(is_end_of_partition(&ClientError::PartitionEOF(3)));
        assert!(is_end_of_partition(&ClientError::Global(
            RDKafkaErrorCode::PartitionEOF
        )));
        assert!(!is_end_of_partition(&ClientError::Global(
            RDKafkaErrorCode::BrokerTransportFailure
        )));
    }
}
