//! The control plane's Kafka side: the internal topics that hold the
//! deployment registry, the components, the hosts' status and usage (see [`super::registry`] for their layout). Components are in
//! `artifacts.rs`, guest logs in `logs.rs`; this file opens the topics,
//! tails the registry and the statuses into memory, and writes records.
//!
//! Kafka is the only stateful dependency: every host tails the deployments
//! and status topics into memory, and the admin API of any host can answer
//! for all of them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use super::FleetError;
use super::registry::{
    ARTIFACTS_TOPIC, DEPLOYMENTS_TOPIC, DeploymentRecord, GRANTS_TOPIC, Grant, HostStatus,
    STATUS_TOPIC, USAGE_RETENTION_DAYS, USAGE_TOPIC, heartbeat_key, status_key,
};
use crate::kafka::{self, Connection, KafkaError, TopicSpec};

/// How long a registry write may take to be acknowledged and read back.
pub(super) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(30);

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

    /// Entries (with their keys) whose key starts with `prefix`.
    pub fn entries_with_prefix(&self, prefix: &str) -> Vec<(String, T)> {
        self.entries
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The next offset this view will read.
    pub fn position(&self) -> i64 {
        *self.progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until the view has read past `offset` (read-your-writes).
    pub(super) fn wait_past(&self, offset: i64, timeout: Duration) -> bool {
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
    conn: Connection,
    pub(super) producer: kafka::Publisher,
    /// The registry.
    pub deployments: Arc<View<DeploymentRecord>>,
    /// Every host's status of every deployment.
    pub statuses: Arc<View<HostStatus>>,
    /// Which tenant uploaded which component (`artifacts.rs`).
    pub grants: Arc<View<Grant>>,
    pub(super) artifact_cache: PathBuf,
    /// Tenants whose log topic this host has made sure of (`logs.rs`).
    pub(super) log_topics: Mutex<std::collections::HashSet<String>>,
    /// One read_uncommitted client for metadata and high watermarks: a
    /// deploy's topic checks and its admission's registry end.
    metadata: kafka::SharedClient,
    /// Each tenant's admission producer between admissions (`admission.rs`).
    pub(super) admitters: super::admission::Admitters,
    /// When a failed status delivery was last logged.
    lost_statuses: Mutex<kafka::OncePerMinute>,
    stop: Arc<AtomicBool>,
}

impl ControlPlane {
    /// Waits (up to `wait`, logging what for) until the brokers answer,
    /// creates the internal topics if needed, waits until they have leaders,
    /// and starts tailing the registry. Returns once the registry has been
    /// read up to its current end.
    pub fn connect(
        conn: Connection,
        artifact_cache: PathBuf,
        wait: Duration,
    ) -> Result<Arc<Self>, FleetError> {
        let deadline = Instant::now() + wait;
        kafka::wait_for_brokers(&conn, deadline)?;
        let usage_retention = (USAGE_RETENTION_DAYS * 24 * 3600 * 1000).to_string();
        let specs = [
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
                name: GRANTS_TOPIC,
                partitions: 1,
                config: &[("cleanup.policy", "compact")],
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
                name: USAGE_TOPIC,
                partitions: 1,
                config: &[
                    ("cleanup.policy", "delete"),
                    ("retention.ms", &usage_retention),
                ],
            },
        ];
        // A cluster that is still starting may refuse (too few brokers
        // registered yet) or time out: try again until the deadline.
        kafka::wait_until(
            &format!(
                "the control topics to be created on {}",
                conn.bootstrap_servers
            ),
            "can this host create topics (ACLs, enough brokers for the replication factor)?",
            deadline,
            |_| kafka::create_topics(&conn, &specs),
        )?;
        kafka::wait_for_topics(
            &conn,
            &[
                DEPLOYMENTS_TOPIC,
                STATUS_TOPIC,
                ARTIFACTS_TOPIC,
                GRANTS_TOPIC,
                USAGE_TOPIC,
            ],
            deadline,
        )?;
        std::fs::create_dir_all(&artifact_cache).map_err(|source| FleetError::Io {
            what: format!(
                "cannot create the artifact cache {}",
                artifact_cache.display()
            ),
            source,
        })?;
        // Renewing: a producer that librdkafka left stuck (a status
        // partition once leaderless, librdkafka#5430) is replaced, so this
        // host's statuses and heartbeat keep reaching the fleet.
        let producer = kafka::Publisher::renewing(
            &conn,
            "onceflow-control",
            &[
                ("enable.idempotence", "true"),
                ("acks", "all"),
                ("linger.ms", "2"),
                ("message.max.bytes", "1048576"),
            ],
        )?;
        let stop = Arc::new(AtomicBool::new(false));
        let deployments = Arc::new(View::new());
        let statuses = Arc::new(View::new());
        let grants = Arc::new(View::new());
        let metadata = kafka::SharedClient::new(
            conn.clone(),
            &[("isolation.level", "read_uncommitted")],
            "the control plane's metadata client",
        );
        let me = Arc::new(Self {
            conn,
            metadata,
            admitters: Default::default(),
            lost_statuses: Mutex::default(),
            producer,
            deployments: deployments.clone(),
            statuses: statuses.clone(),
            grants: grants.clone(),
            artifact_cache,
            log_topics: Mutex::default(),
            stop: stop.clone(),
        });
        let reading = Instant::now();
        let end_d = me.tail(DEPLOYMENTS_TOPIC, deployments.clone(), deadline)?;
        let end_s = me.tail(STATUS_TOPIC, statuses.clone(), deadline)?;
        let end_g = me.tail(GRANTS_TOPIC, grants.clone(), deadline)?;
        if !deployments.wait_past(end_d - 1, PUBLISH_TIMEOUT)
            || !statuses.wait_past(end_s - 1, PUBLISH_TIMEOUT)
            || !grants.wait_past(end_g - 1, PUBLISH_TIMEOUT)
        {
            return Err(FleetError::Unavailable(
                "could not read the registry topics to their end within 30 s".to_owned(),
            ));
        }
        tracing::info!(
            deployments = end_d,
            statuses = end_s,
            grants = end_g,
            ms = reading.elapsed().as_millis() as u64,
            "read the control topics (records up to their ends)"
        );
        Ok(me)
    }

    /// Stops the tailing threads.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// The cluster this host uses.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The host's client for metadata and high watermarks (read_uncommitted;
    /// made at its first use).
    pub(crate) fn metadata(&self) -> Result<Arc<kafka::Reader>, KafkaError> {
        self.metadata.get()
    }

    /// A reader of the control topics (read_committed, reports ends). Its
    /// group is never joined, but brokers that enforce ACLs let only a
    /// principal that may describe it look up its coordinator: it is under
    /// the internal prefix, as the control topics are (docs/kafka-security.md).
    pub(super) fn reader(&self) -> Result<kafka::Reader, KafkaError> {
        control_reader(&self.conn)
    }

    /// A reader of single-partition `topic` from offset `from` (`None`: its
    /// beginning), and the topic's (low, high) watermarks when it started.
    pub(super) fn read_from(
        &self,
        topic: &str,
        from: impl FnOnce(i64, i64) -> Option<i64>,
    ) -> Result<(kafka::Reader, (i64, i64)), KafkaError> {
        let consumer = self.reader()?;
        let (low, high) = kafka::watermarks(&consumer, topic, 0)?;
        kafka::assign(&consumer, &[(topic, 0, from(low, high))])?;
        Ok((consumer, (low, high)))
    }

    /// A reader of single-partition `topic` from its first record stamped
    /// at or after `ts_ms` (its end when none is; its start for `ts_ms` 0
    /// or less), and the offsets it starts and ends at.
    pub(super) fn read_since(
        &self,
        topic: &str,
        ts_ms: i64,
    ) -> Result<(kafka::Reader, (i64, i64)), KafkaError> {
        let consumer = self.reader()?;
        let (low, high) = kafka::watermarks(&consumer, topic, 0)?;
        let start = if ts_ms <= 0 {
            low
        } else {
            kafka::offset_at_time(&consumer, topic, 0, ts_ms)?
                .unwrap_or(high)
                .clamp(low, high)
        };
        kafka::assign(&consumer, &[(topic, 0, Some(start))])?;
        Ok((consumer, (start, high)))
    }

    /// Starts a thread that reads `topic` from the beginning into `view`
    /// (JSON values; tombstones remove). Returns the end offset at start.
    fn tail<T>(
        &self,
        topic: &'static str,
        view: Arc<View<T>>,
        deadline: Instant,
    ) -> Result<i64, FleetError>
    where
        T: DeserializeOwned + Clone + Send + Sync + 'static,
    {
        // Its leader is known (`connect` waited), but this new client may
        // ask a broker whose metadata is a moment behind.
        let (consumer, (_, end)) = kafka::wait_until(
            &format!("the end of {topic}"),
            "are the brokers healthy?",
            deadline.max(Instant::now() + Duration::from_secs(5)),
            |_| self.read_from(topic, |_, _| None),
        )?;
        let stop = self.stop.clone();
        let conn = self.conn.clone();
        std::thread::Builder::new()
            .name(format!("tail-{topic}"))
            .spawn(move || {
                let mut consumer = consumer;
                let mut stalled = Stalled::new();
                while !stop.load(Ordering::Relaxed) {
                    let progress = *view.progress.lock().unwrap_or_else(|e| e.into_inner());
                    if stalled.due(progress) {
                        // No record for a while: fine at the topic's end,
                        // not below it. librdkafka 2.12 was seen to stop
                        // fetching for good after its broker went away
                        // ("new leader-1 not found in cache"), which froze
                        // this host's view of the fleet (the rolling drill).
                        // A reader left stuck cannot ask its partition's
                        // end either (librdkafka#5430): no answer renews it
                        // too.
                        let end = kafka::watermarks(&consumer, topic, 0).map(|(_, end)| end);
                        if end.as_ref().map_or(true, |&end| end > progress) {
                            match renew_reader(&conn, topic, progress) {
                                Ok(fresh) => {
                                    let why = match &end {
                                        Ok(end) => format!("below the topic's end ({end})"),
                                        Err(e) => {
                                            format!("and could not ask the topic's end ({e})")
                                        }
                                    };
                                    tracing::warn!(
                                        topic,
                                        position = progress,
                                        "the control topic's reader made no progress for {} s \
                                         {why}: re-created it",
                                        STALL_AFTER.as_secs()
                                    );
                                    consumer = fresh;
                                }
                                Err(e) => tracing::debug!(topic, "re-creating the reader: {e}"),
                            }
                        }
                        stalled.checked(progress);
                    }
                    match kafka::poll(&consumer, Duration::from_millis(100)) {
                        kafka::Polled::Record(m) => {
                            let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok())
                            else {
                                continue;
                            };
                            apply_record(
                                &mut view.entries.write().unwrap_or_else(|e| e.into_inner()),
                                key,
                                &m,
                            );
                            *view.progress.lock().unwrap_or_else(|e| e.into_inner()) =
                                m.offset() + 1;
                            view.moved.notify_all();
                        }
                        kafka::Polled::End => {
                            // At the end: past any transaction marker too
                            // (admissions write the registry in
                            // transactions), which no record reports.
                            let at = kafka::position(&consumer, topic, 0);
                            let mut progress =
                                view.progress.lock().unwrap_or_else(|e| e.into_inner());
                            if at > *progress {
                                *progress = at;
                                view.moved.notify_all();
                            }
                        }
                        kafka::Polled::Failed(e) => {
                            tracing::debug!(topic, "registry consumer: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        kafka::Polled::Nothing => {}
                    }
                }
            })
            .map_err(|source| FleetError::Io {
                what: "cannot start a registry thread".to_owned(),
                source,
            })?;
        Ok(end)
    }

    /// Writes one record and waits for the broker's acknowledgement.
    pub(super) fn publish(
        &self,
        topic: &str,
        key: &str,
        payload: Option<&[u8]>,
    ) -> Result<i64, KafkaError> {
        self.producer.publish(topic, key, payload, PUBLISH_TIMEOUT)
    }

    /// Writes a deployment record and returns once this host's view has it.
    pub fn put_deployment(&self, record: &DeploymentRecord) -> Result<(), FleetError> {
        // A record of strings and numbers always encodes.
        let json = serde_json::to_vec(record).unwrap_or_default();
        let offset = self.publish(DEPLOYMENTS_TOPIC, &record.key(), Some(&json))?;
        if self.deployments.wait_past(offset, PUBLISH_TIMEOUT) {
            Ok(())
        } else {
            Err(FleetError::Unavailable(
                "the registry did not read back its own write within 30 s".to_owned(),
            ))
        }
    }

    /// Publishes this host's status of a deployment (fire and forget).
    pub fn put_status(&self, status: &HostStatus) {
        self.put_status_at(
            &status_key(&status.tenant, &status.name, &status.host),
            status,
        );
    }

    /// Publishes a host's heartbeat (fire and forget). First looks after
    /// the producer every status goes through: says (once a minute) that
    /// statuses were lost, and replaces the producer if it is stuck
    /// ([`kafka::Publisher::mend`]).
    pub fn put_heartbeat(&self, status: &HostStatus) {
        if let Some(e) = self.producer.take_failure()
            && self
                .lost_statuses
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .due()
        {
            tracing::warn!(
                "a status, heartbeat or log line of this host did not reach the brokers ({}): \
                 other hosts and `onceflow list` see this host's news late until they do",
                crate::types::error_chain(&e)
            );
        }
        self.producer.mend(STATUS_TOPIC);
        self.put_status_at(&heartbeat_key(&status.host), status);
    }

    /// Removes a host's heartbeat (a clean stop).
    pub fn clear_heartbeat(&self, host: &str) {
        let _ = self.producer.send(STATUS_TOPIC, &heartbeat_key(host), None);
    }

    fn put_status_at(&self, key: &str, status: &HostStatus) {
        match serde_json::to_vec(status) {
            Ok(json) => {
                if let Err(e) = self.producer.send(STATUS_TOPIC, key, Some(&json)) {
                    tracing::debug!("cannot publish status: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot encode status: {e}"),
        }
    }

    /// Removes this host's status of the deployment `<tenant>/<name>`.
    pub fn clear_status_of(&self, deployment_key: &str, host: &str) {
        // `<tenant>/<name>/<host>`, as `status_key` makes it.
        let key = format!("{deployment_key}/{host}");
        let _ = self.producer.send(STATUS_TOPIC, &key, None);
    }

    /// Flushes pending status and log writes.
    pub fn flush(&self) {
        self.producer.flush(Duration::from_secs(5));
    }
}

/// Applies one record of a registry topic with key `key` to `entries`:
/// its JSON value, or a tombstone removing the key. An unreadable value is
/// logged and skipped.
pub(super) fn apply_record<T: DeserializeOwned>(
    entries: &mut BTreeMap<String, T>,
    key: &str,
    m: &kafka::Record<'_>,
) {
    match m.payload() {
        None => {
            entries.remove(key);
        }
        Some(bytes) => match serde_json::from_slice::<T>(bytes) {
            Ok(v) => {
                entries.insert(key.to_owned(), v);
            }
            Err(e) => tracing::warn!(
                topic = m.topic(),
                key,
                offset = m.offset(),
                "ignoring an unreadable registry record: {e}"
            ),
        },
    }
}

/// How long a control topic's reader may go without progress before its
/// position is checked against the topic's end.
const STALL_AFTER: Duration = Duration::from_secs(30);

/// When a tail's reader last moved, and when that was last checked.
struct Stalled {
    progress: i64,
    since: Instant,
}

impl Stalled {
    fn new() -> Self {
        Self {
            progress: -1,
            since: Instant::now(),
        }
    }

    /// Whether the reader has stood at `progress` for [`STALL_AFTER`].
    fn due(&mut self, progress: i64) -> bool {
        if progress != self.progress {
            self.checked(progress);
            return false;
        }
        self.since.elapsed() >= STALL_AFTER
    }

    /// Looked at: the next check is [`STALL_AFTER`] from now.
    fn checked(&mut self, progress: i64) {
        self.progress = progress;
        self.since = Instant::now();
    }
}

/// A new reader of single-partition `topic` from offset `from`.
fn renew_reader(conn: &Connection, topic: &str, from: i64) -> Result<kafka::Reader, KafkaError> {
    let consumer = control_reader(conn)?;
    kafka::assign(&consumer, &[(topic, 0, Some(from))])?;
    Ok(consumer)
}

/// A reader of the control topics (see [`ControlPlane::reader`]).
fn control_reader(conn: &Connection) -> Result<kafka::Reader, KafkaError> {
    conn.reader(
        "_onceflow.control",
        "read_committed",
        50,
        kafka::QuietContext::default(),
    )
}
