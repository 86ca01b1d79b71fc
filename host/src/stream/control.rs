//! The control plane's Kafka side: the internal topics that hold the
//! deployment registry, the components, the hosts' status and the guest
//! logs (see [`crate::deploy::registry`] for their layout).
//!
//! Kafka is the only stateful dependency: every host tails the deployments
//! and status topics into memory, and the admin API of any host can answer
//! for all of them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use super::kafka::{self, ADMIN_TIMEOUT, TopicSpec};
use super::{RunOptions, StreamError};
use crate::deploy::registry::{
    ARTIFACT_CHUNK, ARTIFACTS_TOPIC, DEPLOYMENTS_TOPIC, DeploymentRecord, HostStatus, LOGS_TOPIC,
    LogEntry, STATUS_TOPIC, chunk_key, parse_chunk_key,
};
use crate::sandbox::log::{GuestLogLine, LogLabels, LogSink};

/// How long a registry write may take to be acknowledged and read back.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

type Delivery = mpsc::SyncSender<Result<i64, String>>;

struct PublishCtx;

impl ClientContext for PublishCtx {}

impl ProducerContext for PublishCtx {
    type DeliveryOpaque = Box<Option<Delivery>>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        if let Some(tx) = *opaque {
            let _ = tx.send(match result {
                Ok(m) => Ok(m.offset()),
                Err((e, _)) => Err(e.to_string()),
            });
        }
    }
}

/// A compacted topic read into memory and kept up to date.
pub struct View<T> {
    entries: RwLock<BTreeMap<String, T>>,
    /// Next offset to read, and a signal when it moves.
    progress: Mutex<i64>,
    moved: Condvar,
}

impl<T: Clone> View<T> {
    fn new() -> Self {
        Self {
            entries: RwLock::new(BTreeMap::new()),
            progress: Mutex::new(0),
            moved: Condvar::new(),
        }
    }

    /// A copy of every entry.
    pub fn all(&self) -> Vec<T> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// One entry.
    pub fn get(&self, key: &str) -> Option<T> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }

    /// Entries whose key starts with `prefix`.
    pub fn with_prefix(&self, prefix: &str) -> Vec<T> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// The next offset this view will read.
    pub fn position(&self) -> i64 {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the view has read past `offset` (read-your-writes).
    fn wait_past(&self, offset: i64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut at = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        while *at <= offset {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            at = self
                .moved
                .wait_timeout(at, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// Waits until the view moves past `seen` or `timeout` passes; returns
    /// the position.
    pub fn wait_change(&self, seen: i64, timeout: Duration) -> i64 {
        let at = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let (at, _) = self
            .moved
            .wait_timeout_while(at, timeout, |at| *at <= seen)
            .unwrap_or_else(|e| e.into_inner());
        *at
    }
}

/// The control plane's topics, as one host sees them.
pub struct ControlPlane {
    options: RunOptions,
    producer: ThreadedProducer<PublishCtx>,
    /// The registry.
    pub deployments: Arc<View<DeploymentRecord>>,
    /// Every host's status of every deployment.
    pub statuses: Arc<View<HostStatus>>,
    artifact_cache: PathBuf,
    stop: Arc<AtomicBool>,
}

impl ControlPlane {
    /// Creates the internal topics if needed and starts tailing the registry.
    /// Returns once the registry has been read up to its current end.
    pub fn connect(options: RunOptions, artifact_cache: PathBuf) -> Result<Arc<Self>, StreamError> {
        let week = (7 * 24 * 3600 * 1000u64).to_string();
        kafka::create_topics(
            &options,
            &[
                TopicSpec {
                    name: DEPLOYMENTS_TOPIC,
                    partitions: 1,
                    config: &[("cleanup.policy", "compact")],
                },
                TopicSpec {
                    name: ARTIFACTS_TOPIC,
                    partitions: 1,
                    config: &[
                        ("cleanup.policy", "compact"),
                        ("max.message.bytes", "1048588"),
                    ],
                },
                TopicSpec {
                    name: STATUS_TOPIC,
                    partitions: 1,
                    config: &[
                        ("cleanup.policy", "compact"),
                        ("segment.ms", "600000"),
                        ("min.cleanable.dirty.ratio", "0.1"),
                    ],
                },
                TopicSpec {
                    name: LOGS_TOPIC,
                    partitions: 1,
                    config: &[("cleanup.policy", "delete"), ("retention.ms", &week)],
                },
            ],
        )?;
        std::fs::create_dir_all(&artifact_cache).map_err(|e| {
            StreamError::State(format!(
                "cannot create the artifact cache {}: {e}",
                artifact_cache.display()
            ))
        })?;
        let producer: ThreadedProducer<PublishCtx> = kafka::base_config(&options)
            .set("client.id", "onceflow-control")
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "2")
            .set("message.max.bytes", "1048576")
            .create_with_context(PublishCtx)
            .map_err(|e| StreamError::kafka("creating the control-plane producer", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let deployments = Arc::new(View::new());
        let statuses = Arc::new(View::new());
        let me = Arc::new(Self {
            options,
            producer,
            deployments: deployments.clone(),
            statuses: statuses.clone(),
            artifact_cache,
            stop: stop.clone(),
        });
        let end_d = me.tail(DEPLOYMENTS_TOPIC, deployments.clone())?;
        let end_s = me.tail(STATUS_TOPIC, statuses.clone())?;
        if !deployments.wait_past(end_d - 1, PUBLISH_TIMEOUT)
            || !statuses.wait_past(end_s - 1, PUBLISH_TIMEOUT)
        {
            return Err(StreamError::Restart(
                "could not read the registry topics to their end within 30 s".to_owned(),
            ));
        }
        Ok(me)
    }

    /// Stops the tailing threads.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn consumer(&self) -> Result<BaseConsumer, StreamError> {
        kafka::base_config(&self.options)
            .set("group.id", "onceflow-control-unused")
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "50")
            .create()
            .map_err(|e| StreamError::kafka("creating a control-plane consumer", e))
    }

    /// A consumer reading single-partition `topic` from its beginning, and
    /// the topic's end offset when it started.
    fn read_from_start(&self, topic: &str) -> Result<(BaseConsumer, i64), StreamError> {
        let consumer = self.consumer()?;
        let end = consumer
            .fetch_watermarks(topic, 0, ADMIN_TIMEOUT)
            .map(|(_, high)| high)
            .map_err(|e| StreamError::kafka(format!("reading the end of {topic}"), e))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .and_then(|()| consumer.assign(&tpl))
            .map_err(|e| StreamError::kafka(format!("assigning {topic}"), e))?;
        Ok((consumer, end))
    }

    /// Starts a thread that reads `topic` from the beginning into `view`
    /// (JSON values; tombstones remove). Returns the end offset at start.
    fn tail<T>(&self, topic: &'static str, view: Arc<View<T>>) -> Result<i64, StreamError>
    where
        T: DeserializeOwned + Clone + Send + Sync + 'static,
    {
        let (consumer, end) = self.read_from_start(topic)?;
        let stop = self.stop.clone();
        std::thread::Builder::new()
            .name(format!("tail-{topic}"))
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match consumer.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => {
                            let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok())
                            else {
                                continue;
                            };
                            let mut entries =
                                view.entries.write().unwrap_or_else(|e| e.into_inner());
                            match m.payload() {
                                None => {
                                    entries.remove(key);
                                }
                                Some(bytes) => match serde_json::from_slice::<T>(bytes) {
                                    Ok(v) => {
                                        entries.insert(key.to_owned(), v);
                                    }
                                    Err(e) => tracing::warn!(
                                        topic,
                                        key,
                                        offset = m.offset(),
                                        "ignoring an unreadable registry record: {e}"
                                    ),
                                },
                            }
                            drop(entries);
                            *view.progress.lock().unwrap_or_else(|e| e.into_inner()) =
                                m.offset() + 1;
                            view.moved.notify_all();
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) => {}
                        Some(Err(e)) => {
                            tracing::debug!(topic, "registry consumer: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        None => {}
                    }
                }
            })
            .map_err(|e| StreamError::Restart(format!("cannot start a registry thread: {e}")))?;
        Ok(end)
    }

    /// Writes one record and waits for the broker's acknowledgement.
    fn publish(&self, topic: &str, key: &str, payload: Option<&[u8]>) -> Result<i64, StreamError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let mut record: BaseRecord<'_, str, [u8], Box<Option<Delivery>>> =
            BaseRecord::with_opaque_to(topic, Box::new(Some(tx))).key(key);
        if let Some(p) = payload {
            record = record.payload(p);
        }
        self.producer
            .send(record)
            .map_err(|(e, _)| StreamError::kafka(format!("writing to {topic}"), e))?;
        match rx.recv_timeout(PUBLISH_TIMEOUT) {
            Ok(Ok(offset)) => Ok(offset),
            Ok(Err(e)) => Err(StreamError::kafka(format!("writing to {topic}"), e)),
            Err(_) => Err(StreamError::Kafka {
                operation: format!("writing to {topic}"),
                message: "no acknowledgement within 30 s: is the cluster reachable?".to_owned(),
            }),
        }
    }

    /// Writes a deployment record and returns once this host's view has it.
    pub fn put_deployment(&self, record: &DeploymentRecord) -> Result<(), StreamError> {
        let json = serde_json::to_vec(record)
            .map_err(|e| StreamError::State(format!("encoding a deployment record: {e}")))?;
        let offset = self.publish(DEPLOYMENTS_TOPIC, &record.key(), Some(&json))?;
        if self.deployments.wait_past(offset, PUBLISH_TIMEOUT) {
            Ok(())
        } else {
            Err(StreamError::Restart(
                "the registry did not read back its own write within 30 s".to_owned(),
            ))
        }
    }

    /// Publishes this host's status of a deployment (fire and forget).
    pub fn put_status(&self, status: &HostStatus) {
        let key = format!("{}/{}/{}", status.tenant, status.name, status.host);
        match serde_json::to_vec(status) {
            Ok(json) => {
                let record: BaseRecord<'_, str, [u8], Box<Option<Delivery>>> =
                    BaseRecord::with_opaque_to(STATUS_TOPIC, Box::new(None))
                        .key(key.as_str())
                        .payload(json.as_slice());
                if let Err((e, _)) = self.producer.send(record) {
                    tracing::debug!("cannot publish status: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode status: {e}"),
        }
    }

    /// Removes this host's status of the deployment `<tenant>/<name>`.
    pub fn clear_status_of(&self, deployment_key: &str, host: &str) {
        let key = format!("{deployment_key}/{host}");
        let record: BaseRecord<'_, str, [u8], Box<Option<Delivery>>> =
            BaseRecord::with_opaque_to(STATUS_TOPIC, Box::new(None)).key(key.as_str());
        let _ = self.producer.send(record);
    }

    fn cached_artifact(&self, sha256: &str) -> PathBuf {
        self.artifact_cache.join(format!("{sha256}.wasm"))
    }

    /// Stores a component in the artifacts topic and in the local cache;
    /// returns its sha256. An index record `<sha>/index` gives the chunk
    /// count; the chunks are `<sha>/<i>`.
    pub fn put_artifact(&self, bytes: &[u8]) -> Result<String, StreamError> {
        let sha = hex::encode(Sha256::digest(bytes));
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(ARTIFACT_CHUNK).collect()
        };
        let count = chunks.len();
        let index_record = serde_json::json!({ "chunks": count, "size": bytes.len() }).to_string();
        self.publish(
            ARTIFACTS_TOPIC,
            &format!("{sha}/index"),
            Some(index_record.as_bytes()),
        )?;
        for (i, chunk) in chunks.iter().enumerate() {
            self.publish(ARTIFACTS_TOPIC, &chunk_key(&sha, i), Some(chunk))?;
        }
        let path = self.cached_artifact(&sha);
        write_atomically(&path, bytes)?;
        Ok(sha)
    }

    /// A component by sha256: from the local cache, else read back from the
    /// artifacts topic (and cached).
    pub fn artifact(&self, sha256: &str) -> Result<Vec<u8>, StreamError> {
        let path = self.cached_artifact(sha256);
        if let Ok(bytes) = std::fs::read(&path)
            && hex::encode(Sha256::digest(&bytes)) == sha256
        {
            return Ok(bytes);
        }
        let (consumer, end) = self.read_from_start(ARTIFACTS_TOPIC)?;
        let mut chunks: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut count: Option<usize> = None;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut next = 0;
        while next < end && Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
                        continue;
                    };
                    if key == format!("{sha256}/index") {
                        count = m
                            .payload()
                            .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                            .and_then(|v| v["chunks"].as_u64())
                            .map(|n| n as usize);
                    } else if let Some((sha, i)) = parse_chunk_key(key)
                        && sha == sha256
                    {
                        chunks.insert(i, m.payload().unwrap_or_default().to_vec());
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => {
                    tracing::debug!("artifacts consumer: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                None => {}
            }
        }
        let Some(count) = count else {
            return Err(StreamError::State(format!(
                "component {sha256} is not in {ARTIFACTS_TOPIC}: deploy it again"
            )));
        };
        let mut bytes = Vec::new();
        for i in 0..count {
            let chunk = chunks.remove(&i).ok_or_else(|| {
                StreamError::State(format!(
                    "component {sha256}: chunk {i} of {count} is missing in {ARTIFACTS_TOPIC}: deploy it again"
                ))
            })?;
            bytes.extend_from_slice(&chunk);
        }
        if hex::encode(Sha256::digest(&bytes)) != sha256 {
            return Err(StreamError::State(format!(
                "component {sha256}: the chunks in {ARTIFACTS_TOPIC} do not add up to it: deploy it again"
            )));
        }
        write_atomically(&path, &bytes)?;
        Ok(bytes)
    }

    /// Appends a guest log line (not transactional: logs of aborted work
    /// are kept too, which is what one wants when debugging).
    pub fn append_log(&self, key: &str, entry: &LogEntry) {
        if let Ok(json) = serde_json::to_vec(entry) {
            let record: BaseRecord<'_, str, [u8], Box<Option<Delivery>>> =
                BaseRecord::with_opaque_to(LOGS_TOPIC, Box::new(None))
                    .key(key)
                    .payload(json.as_slice());
            if let Err((e, _)) = self.producer.send(record) {
                tracing::debug!("cannot write a guest log line: {e}");
            }
        }
    }

    /// Log lines of `key` from offset `from` (default: the last `tail`
    /// records of the log topic), waiting up to `wait` for the first one.
    /// Returns the lines and the offset to continue from.
    pub fn read_logs(
        &self,
        key: &str,
        from: Option<i64>,
        tail: i64,
        wait: Duration,
    ) -> Result<(Vec<LogEntry>, i64), StreamError> {
        let consumer = self.consumer()?;
        let (low, end) = consumer
            .fetch_watermarks(LOGS_TOPIC, 0, ADMIN_TIMEOUT)
            .map_err(|e| StreamError::kafka("reading the log topic's bounds", e))?;
        let start = from.unwrap_or(end - tail).clamp(low, end.max(low));
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(LOGS_TOPIC, 0, Offset::Offset(start))
            .map_err(|e| StreamError::kafka("assigning the log topic", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| StreamError::kafka("assigning the log topic", e))?;
        let mut lines = Vec::new();
        let mut next = start;
        let deadline = Instant::now() + wait;
        loop {
            match consumer.poll(Duration::from_millis(50)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    if m.key() == Some(key.as_bytes())
                        && let Some(entry) =
                            m.payload().and_then(|p| serde_json::from_slice(p).ok())
                    {
                        lines.push(entry);
                    }
                    if lines.len() >= 1000 {
                        break;
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {
                    if !lines.is_empty() || Instant::now() >= deadline {
                        break;
                    }
                }
                Some(Err(e)) => {
                    tracing::debug!("log consumer: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
                None => {
                    if Instant::now() >= deadline {
                        break;
                    }
                }
            }
        }
        Ok((lines, next))
    }

    /// The committed value of `key` in a store, read from its changelog up
    /// to the last stable offset (read_committed): only committed state,
    /// from any host. Returns (partition, value) for each partition whose
    /// task holds the key.
    pub fn query_changelog(
        &self,
        topic: &str,
        key: &[u8],
    ) -> Result<Vec<(i32, Vec<u8>)>, StreamError> {
        let consumer = self.consumer()?;
        let md = consumer
            .fetch_metadata(Some(topic), ADMIN_TIMEOUT)
            .map_err(|e| StreamError::kafka(format!("fetching metadata of {topic}"), e))?;
        let partitions: Vec<i32> = md
            .topics()
            .first()
            .map(|t| t.partitions().iter().map(|p| p.id()).collect())
            .unwrap_or_default();
        let mut found = Vec::new();
        for p in partitions {
            let (low, high) = consumer
                .fetch_watermarks(topic, p, ADMIN_TIMEOUT)
                .map_err(|e| StreamError::kafka(format!("reading {topic}/{p}'s bounds"), e))?;
            if high <= low {
                continue;
            }
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .map_err(|e| StreamError::kafka("assigning a changelog", e))?;
            consumer
                .assign(&tpl)
                .map_err(|e| StreamError::kafka("assigning a changelog", e))?;
            let mut value: Option<Vec<u8>> = None;
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        if m.key() == Some(key) {
                            value = m.payload().map(<[u8]>::to_vec);
                        }
                    }
                    // read_committed: EOF is the last stable offset.
                    Some(Err(KafkaError::PartitionEOF(_))) => break,
                    Some(Err(e)) => {
                        tracing::debug!("query consumer: {e}");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    None => {}
                }
                if Instant::now() > deadline {
                    return Err(StreamError::Restart(format!(
                        "reading {topic}/{p} took longer than 60 s"
                    )));
                }
            }
            if let Some(v) = value {
                found.push((p, v));
            }
        }
        Ok(found)
    }

    /// Deletes a deployment's consumer group and changelog topics (after
    /// its workers have left; retries while the group still has members).
    pub fn purge(&self, group: &str, changelogs: &[String]) -> Result<(), StreamError> {
        let admin: AdminClient<DefaultClientContext> =
            kafka::base_config(&self.options)
                .create()
                .map_err(|e| StreamError::kafka("creating an admin client", e))?;
        let opts = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = futures::executor::block_on(admin.delete_groups(&[group], &opts))
                .map_err(|e| StreamError::kafka("deleting the consumer group", e))?;
            match r.first() {
                Some(Ok(_)) | None => break,
                Some(Err((_, code)))
                    if *code == rdkafka::types::RDKafkaErrorCode::GroupIdNotFound =>
                {
                    break;
                }
                Some(Err((_, code))) if Instant::now() < deadline => {
                    tracing::debug!(group, "group not deletable yet: {code}");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Some(Err((_, code))) => {
                    return Err(StreamError::Kafka {
                        operation: format!("deleting consumer group {group}"),
                        message: format!(
                            "{code}: its members did not leave within 60 s (static members leave after the session timeout)"
                        ),
                    });
                }
            }
        }
        if !changelogs.is_empty() {
            let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
            let results = futures::executor::block_on(admin.delete_topics(&names, &opts))
                .map_err(|e| StreamError::kafka("deleting changelog topics", e))?;
            for r in results {
                if let Err((topic, code)) = r
                    && code != rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition
                {
                    return Err(StreamError::Topic {
                        topic,
                        message: format!("cannot delete the changelog: {code}"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Flushes pending status and log writes.
    pub fn flush(&self) {
        let _ = self.producer.flush(Duration::from_secs(5));
    }
}

fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> Result<(), StreamError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| StreamError::State(format!("cannot write {}: {e}", path.display())))
}

/// Guest logs of one deployment on this host: to the log topic, to the
/// host's own log, and the latest warnings kept for `describe`.
pub struct DeploymentLogSink {
    control: Arc<ControlPlane>,
    key: String,
    host: String,
    recent_errors: Arc<Mutex<std::collections::VecDeque<String>>>,
}

impl DeploymentLogSink {
    /// A sink for `<tenant>/<name>` on `host`, keeping warnings in `recent`.
    pub fn new(
        control: Arc<ControlPlane>,
        key: String,
        host: String,
        recent_errors: Arc<Mutex<std::collections::VecDeque<String>>>,
    ) -> Self {
        Self {
            control,
            key,
            host,
            recent_errors,
        }
    }
}

impl DeploymentLogSink {
    fn append(&self, labels: &LogLabels, level: String, message: String) {
        self.control.append_log(
            &self.key,
            &LogEntry {
                ts_ms: crate::deploy::registry::now_ms(),
                host: self.host.clone(),
                partition: labels.partition,
                level,
                message,
            },
        );
    }
}

/// Keeps the last few errors for `describe`.
pub fn remember_error(recent: &Mutex<std::collections::VecDeque<String>>, message: String) {
    let mut r = recent.lock().unwrap_or_else(|e| e.into_inner());
    if r.len() >= 5 {
        r.pop_front();
    }
    r.push_back(message);
}

impl LogSink for DeploymentLogSink {
    fn line(&self, labels: &LogLabels, line: &GuestLogLine) {
        let level = format!("{:?}", line.level).to_lowercase();
        if matches!(level.as_str(), "error" | "warn") {
            remember_error(
                &self.recent_errors,
                format!("partition {}: {}", labels.partition, line.message),
            );
        }
        self.append(labels, level, line.message.clone());
    }

    fn dropped(&self, labels: &LogLabels, count: u64) {
        self.append(
            labels,
            "warn".to_owned(),
            format!("{count} log lines dropped by the rate limit"),
        );
    }
}
