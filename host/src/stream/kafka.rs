//! Typed helpers over rdkafka: client configurations, topic checks and
//! creation, record conversion, error classification.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header as KHeader, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::util::Timeout;

use super::{RunOptions, StreamError, changelog_topic};
use crate::deploy::Manifest;
use crate::types::{Header, InputRecord, OutputRecord};

/// How long metadata and admin calls may take.
pub const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings every client of a deployment shares.
pub fn base_config(options: &RunOptions) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &options.bootstrap_servers);
    for (k, v) in &options.extra_config {
        c.set(k, v);
    }
    c
}

/// A consumer that reads only committed data and commits nothing by itself.
pub fn consumer_config(options: &RunOptions, group: &str, client_id: &str) -> ClientConfig {
    let mut c = base_config(options);
    c.set("group.id", group)
        .set("client.id", client_id)
        // Static membership (KIP-345): a restarted instance takes its
        // partitions back at once instead of waiting for its previous
        // incarnation's session to expire. The id is the instance's, so a
        // paused zombie is still fenced when its session expires.
        .set("group.instance.id", client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("partition.assignment.strategy", "cooperative-sticky")
        .set(
            "session.timeout.ms",
            options.session_timeout.as_millis().to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            (options.session_timeout.as_millis() / 4)
                .max(100)
                .to_string(),
        )
        .set("max.poll.interval.ms", "300000");
    c
}

/// An idempotent producer; transactional when `transactional_id` is given.
pub fn producer_config(
    options: &RunOptions,
    transactional_id: Option<&str>,
    client_id: &str,
) -> ClientConfig {
    let mut c = base_config(options);
    c.set("client.id", client_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Java's partitioner, so keys land where Kafka Streams and Java
        // producers put them.
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        // After a commit the coordinator is still writing markers; the next
        // transaction's AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS and
        // is retried. librdkafka's default 100 ms backoff would hold every
        // new transaction's records back by 100 ms.
        .set("retry.backoff.ms", "5")
        .set("retry.backoff.max.ms", "100")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "200000");
    if let Some(id) = transactional_id {
        let txn_ms = options.transaction_timeout.as_millis();
        c.set("transactional.id", id)
            .set("transaction.timeout.ms", txn_ms.to_string())
            // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
            .set(
                "message.timeout.ms",
                (txn_ms.saturating_sub(1000)).max(1000).to_string(),
            );
    }
    c
}

/// Checks the manifest's topics and creates missing changelog topics.
/// Returns the input partition count.
pub fn prepare_topics(manifest: &Manifest, options: &RunOptions) -> Result<i32, StreamError> {
    let probe: BaseConsumer = base_config(options)
        .create()
        .map_err(|e| StreamError::kafka("creating a metadata client", e))?;
    let partitions_of = |topic: &str| -> Result<Option<i32>, StreamError> {
        let md = probe
            .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
            .map_err(|e| StreamError::kafka(format!("fetching metadata of {topic}"), e))?;
        Ok(md.topics().first().and_then(|t| match t.error() {
            Some(_) => None,
            None if t.partitions().is_empty() => None,
            None => Some(t.partitions().len() as i32),
        }))
    };

    let mut input_partitions = None;
    for topic in &manifest.inputs {
        let n = partitions_of(topic)?.ok_or_else(|| StreamError::Topic {
            topic: topic.clone(),
            message: "input topic does not exist: create it first".to_owned(),
        })?;
        match input_partitions {
            None => input_partitions = Some(n),
            Some(m) if m != n => {
                return Err(StreamError::Topic {
                    topic: topic.clone(),
                    message: format!(
                        "has {n} partitions but {} has {m}: a task reads the same partition of every input, so inputs must be co-partitioned",
                        manifest.inputs[0]
                    ),
                });
            }
            Some(_) => {}
        }
    }
    let input_partitions = input_partitions.unwrap_or(1);

    let outputs = manifest
        .outputs
        .values()
        .chain(manifest.errors.dead_letter_topic.iter());
    for topic in outputs {
        if partitions_of(topic)?.is_none() {
            return Err(StreamError::Topic {
                topic: topic.clone(),
                message: "output topic does not exist: create it first".to_owned(),
            });
        }
    }

    let mut missing = Vec::new();
    for store in &manifest.stores {
        let topic = changelog_topic(manifest, store);
        match partitions_of(&topic)? {
            Some(n) if n == input_partitions => {}
            Some(n) => {
                return Err(StreamError::Topic {
                    topic,
                    message: format!(
                        "changelog has {n} partitions, the inputs {input_partitions}: \
                         the store cannot be restored partition by partition"
                    ),
                });
            }
            None => missing.push(topic),
        }
    }
    if !missing.is_empty() {
        create_compacted(options, &missing, input_partitions)?;
    }
    Ok(input_partitions)
}

fn create_compacted(
    options: &RunOptions,
    topics: &[String],
    partitions: i32,
) -> Result<(), StreamError> {
    let specs: Vec<TopicSpec<'_>> = topics
        .iter()
        .map(|t| TopicSpec {
            name: t,
            partitions,
            config: &[("cleanup.policy", "compact")],
        })
        .collect();
    create_topics(options, &specs)
}

/// A topic the host creates for itself.
pub(crate) struct TopicSpec<'a> {
    pub name: &'a str,
    pub partitions: i32,
    pub config: &'a [(&'a str, &'a str)],
}

/// Creates topics that do not exist yet, replicated up to 3 times (as many
/// as there are brokers).
pub(crate) fn create_topics(
    options: &RunOptions,
    specs: &[TopicSpec<'_>],
) -> Result<(), StreamError> {
    let admin: AdminClient<DefaultClientContext> = base_config(options)
        .create()
        .map_err(|e| StreamError::kafka("creating an admin client", e))?;
    let probe: BaseConsumer = base_config(options)
        .create()
        .map_err(|e| StreamError::kafka("creating a metadata client", e))?;
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
    .map_err(|e| StreamError::kafka("creating topics", e))?;
    for r in results {
        match r {
            Ok(topic) => tracing::info!(%topic, "created topic"),
            Err((topic, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::debug!(%topic, "topic already exists")
            }
            Err((topic, code)) => {
                return Err(StreamError::Topic {
                    topic,
                    message: format!("cannot create the topic: {code}"),
                });
            }
        }
    }
    Ok(())
}

/// Copies a consumed message into an [`InputRecord`].
pub fn to_input(m: &BorrowedMessage<'_>) -> InputRecord {
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
        topic: m.topic().to_owned(),
        partition: m.partition(),
        offset: m.offset(),
        timestamp: m.timestamp().to_millis().unwrap_or(0),
        key: m.key().map(<[u8]>::to_vec),
        value: m.payload().map(<[u8]>::to_vec),
        headers,
    }
}

/// A record to send.
pub struct Outgoing<'a> {
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
pub fn send<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    out: Outgoing<'_>,
) -> Result<(), KafkaError> {
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
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                producer.poll(Duration::from_millis(50));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// Sends an output record (partition chosen from the key).
pub fn send_output<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    o: &OutputRecord,
) -> Result<(), KafkaError> {
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
/// delivery report served. rdkafka's `flush` sleeps in 100 ms polls, which
/// would add 100 ms to every commit; this polls in 1 ms steps.
pub fn drain<C: ProducerContext<DeliveryOpaque = ()>>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        producer.poll(Duration::ZERO);
        if producer.in_flight_count() == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut));
        }
        producer.poll(Duration::from_millis(1));
    }
}

/// Client-level errors (brokers down, transport failures) arrive on every
/// poll while a broker is away; this logs them at most every 5 s, with a
/// count, instead of thousands of lines a second.
#[derive(Default)]
pub struct ErrorLog {
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl ErrorLog {
    /// Records an error from librdkafka's error callback.
    pub fn report(&self, client: &str, error: &KafkaError, reason: &str) {
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
/// errors, and other client errors are rate-limited.
#[derive(Default)]
pub struct QuietContext {
    errors: ErrorLog,
}

impl rdkafka::client::ClientContext for QuietContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if !matches!(error, KafkaError::PartitionEOF(_)) {
            self.errors.report("consumer", &error, reason);
        }
    }
}

impl rdkafka::consumer::ConsumerContext for QuietContext {}

/// What to do about a failed transactional call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnFailure {
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
pub fn classify(e: &KafkaError) -> TxnFailure {
    match e {
        KafkaError::Transaction(r) if r.is_fatal() => TxnFailure::Fatal,
        KafkaError::Transaction(r) if r.txn_requires_abort() => TxnFailure::Abort,
        KafkaError::Transaction(r) if r.is_retriable() => TxnFailure::Retry,
        _ => TxnFailure::Fatal,
    }
}

/// Whether an error means this producer or member was fenced by a newer
/// one (a zombie caught).
pub fn is_fencing(e: &KafkaError) -> bool {
    let code = e.rdkafka_error_code();
    matches!(
        code,
        Some(
            RDKafkaErrorCode::Fenced
                | RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::IllegalGeneration
                | RDKafkaErrorCode::UnknownMemberId
                | RDKafkaErrorCode::FencedInstanceId
                | RDKafkaErrorCode::RebalanceInProgress
        )
    )
}

/// Next offsets per (topic, partition), as a partition list.
pub fn offsets_list(next: &BTreeMap<(String, i32), i64>) -> rdkafka::TopicPartitionList {
    let mut tpl = rdkafka::TopicPartitionList::new();
    for ((topic, partition), offset) in next {
        // Cannot fail: the offset is absolute.
        let _ = tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset));
    }
    tpl
}

/// A timeout for blocking client calls.
pub fn timeout(d: Duration) -> Timeout {
    Timeout::After(d)
}
