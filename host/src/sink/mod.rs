//! `onceflow sink postgres`: topics into PostgreSQL, exactly once.
//!
//! A Kafka transaction cannot hold a database write, so the sink turns the
//! commit around: the database's own transaction holds the effect, a
//! marker per record (its identity and a digest of its value) and each
//! partition's next offset (`db.rs` has the transaction top to bottom). The
//! sink resumes from the database's positions, never from Kafka's committed
//! offsets, which it commits afterwards for lag monitoring only. A crash at
//! any point either leaves nothing (the transaction did not commit) or a
//! position past the records it applied (they are skipped when read again).
//!
//! Zombies: the consumer group gives each partition to one instance, and an
//! instance that gets a partition claims it in the database by raising the
//! partition's owner epoch. Every batch transaction locks its partitions'
//! progress rows and checks their epochs, so an instance that was expelled
//! without noticing (paused, partitioned away) commits nothing after the
//! new owner's claim.
//!
//! This module owns the Kafka side (the consumer, the dead-letter
//! producer) and the loop; `config.rs` reads `sink.toml`; `db.rs` owns the
//! PostgreSQL client; `db/roles.rs` checks who runs what (the sink's role owns
//! Onceflow's tables, a tenant's statements run under the tenant's role);
//! `sql_check.rs` checks a `sql` route's statement; `db/redact.rs` takes the
//! values out of PostgreSQL's messages. docs/sink.md is the user's guide.

mod committer;
pub mod config;
mod db;
pub mod sql_check;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use committer::{BatchDone, BatchJob, Committer, Job};
use config::Identity;
pub use config::{Connections, SinkConfig};
pub use db::roles::check_connections;
use db::{Db, Item};

use crate::kafka::{self, Connection, KafkaError};
use crate::memory::{Held, MemoryLimits};
use crate::metrics::Metrics;

/// Why a sink stopped.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// `sink.toml` could not be read.
    #[error("cannot read {path}")]
    ReadConfig {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `sink.toml` has a bad or unknown key.
    #[error("invalid sink configuration {path}: {}{message}", if key.is_empty() { String::new() } else { format!("`{key}`: ") })]
    Config {
        /// The file.
        path: PathBuf,
        /// The key, dotted (`routes[1].table`); empty for a syntax error.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The password file could not be read.
    #[error("cannot read the password file {path} (postgres.password-file)")]
    PasswordFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A route does not fit its table or statement.
    #[error("routes[{route}] (topic {topic:?}): {message}")]
    Route {
        /// The route's index in `sink.toml`.
        route: usize,
        /// Its topic.
        topic: String,
        /// What the database said, and what to do.
        message: String,
    },
    /// A database call failed for good.
    #[error("postgres: {what}")]
    Database {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Kafka failed.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// How a sink instance runs (the command line's flags).
#[derive(Debug, Clone)]
pub struct SinkOptions {
    /// The cluster.
    pub kafka: Connection,
    /// This instance's name in the group (its client id) and in the
    /// progress table's `owner` column.
    pub instance_id: String,
    /// The consumer group session: how long a dead instance keeps its
    /// partitions.
    pub session_timeout: Duration,
    /// How often progress is logged.
    pub report_interval: Duration,
    /// Fault windows for tests: sleep this long with a batch in hand before
    /// its database transaction begins (zero: none),
    pub pause_before_begin: Duration,
    /// ... before the database COMMIT,
    pub pause_before_commit: Duration,
    /// ... after each marker, inserted one at a time,
    pub pause_between_markers: Duration,
    /// ... and after it, before the Kafka offset commit.
    pub pause_after_commit: Duration,
    /// Fault for tests: the answers to this many successful COMMITs are
    /// treated as lost (as after a timeout), and those batches applied
    /// again.
    pub lose_commit_answers: u32,
    /// Counters (records, commits and their latency, dead letters, fenced
    /// partitions): a fleet host's status and `/metrics` of the sink.
    pub metrics: Arc<Metrics>,
    /// On a fleet host: where the sink's work is billed (`onceflow
    /// usage`); none for a sink of its own (`onceflow sink postgres`).
    pub usage: Option<UsageTarget>,
    /// What the sink's batches may hold in memory (`held-mb` of its
    /// tenant, under `host-held-mb`; `memory.rs`): a batch that
    /// reaches it is handed over, full or not.
    pub memory: MemoryLimits,
}

/// Where a fleet host's sink bills its committed work, and whose it is:
/// each batch transaction records its records, bytes and dead letters in
/// the sink's usage table (`db.rs`), forwarded to `topic` afterwards
/// (`committer.rs`), keyed `<tenant>/<deployment>` as a deployment's.
#[derive(Debug, Clone)]
pub struct UsageTarget {
    /// `_onceflow.usage`.
    pub topic: String,
    /// The sink's tenant.
    pub tenant: String,
    /// The sink's name in its tenant (its deployment's).
    pub deployment: String,
}

/// What a sink instance did, in total.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct SinkReport {
    /// Database transactions committed.
    pub batches: u64,
    /// Records applied.
    pub applied: u64,
    /// Records skipped as below the stored position.
    pub behind: u64,
    /// Records skipped as already marked (same digest).
    pub duplicates: u64,
    /// Records sent to the dead letters.
    pub dead_letters: u64,
    /// Batch transactions retried after a transient database failure.
    pub retries: u64,
    /// Partitions found claimed by another instance at commit.
    pub fenced: u64,
    /// Batches applied record by record (one of their records did not fit
    /// its table).
    pub slow_batches: u64,
}

/// Refuses a sink whose topics (routes and dead-letter topic) do not
/// exist: it creates none, as they are the tenant's (or the processors')
/// to create with their partition counts.
pub fn check_topics(config: &SinkConfig, kafka: &Connection) -> Result<(), KafkaError> {
    let client = kafka::metadata_client(kafka)?;
    // A topic created a moment ago may not be in the answering broker's
    // metadata yet: "no such topic" is the verdict after a short grace.
    let grace = Instant::now() + TOPIC_GRACE;
    for (key, topic) in config.topics() {
        while kafka::partitions(&client, topic)?.is_none() {
            if Instant::now() >= grace {
                return Err(KafkaError::topic(
                    topic,
                    format!("{key}: no such topic: create it first (a sink creates no topic)"),
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(())
}

/// How long a topic may be missing from the metadata before a sink's start
/// (or deploy) says it does not exist.
const TOPIC_GRACE: Duration = Duration::from_secs(5);

/// How often markers past the retention are deleted ([`committer::EXPIRE_SLICE`]
/// at most each time, on the committer's connection: the batches wait
/// meanwhile). Before, 10,000 a minute: above about 167 records/s the table
/// only grew (eos-audit-3 finding 7).
const EXPIRE_EVERY: Duration = Duration::from_secs(10);

/// How long a batch may be in flight, with the next one full, before the
/// sink pauses its partitions ([`Sink::hold_back`]): a healthy batch
/// returns well within it, so the fast path never pauses.
const HOLD_BACK_AFTER: Duration = Duration::from_secs(1);

/// Runs a PostgreSQL sink until `shutdown` is set (the batch in hand is
/// committed first).
pub fn run_postgres(
    config: SinkConfig,
    options: SinkOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<SinkReport, SinkError> {
    // The database first: a connection that may not be used (a superuser,
    // a tenant's role that could reach more than its tables) is refused
    // before any Kafka work.
    let mut db = Db::connect(&config)?;
    if options.usage.is_some() {
        db.bill_usage();
    }
    db.pause_between_markers(options.pause_between_markers);
    check_topics(&config, &options.kafka)?;
    let topics: Vec<&str> = config.routes.iter().map(|r| r.topic.as_str()).collect();
    kafka::wait_for_topics(
        &options.kafka,
        &topics,
        Instant::now() + kafka::ADMIN_TIMEOUT,
    )?;
    let group = config.group();
    let consumer = kafka::GroupReader::subscribe(
        &options.kafka,
        &group,
        &options.instance_id,
        &topics,
        options.session_timeout,
    )?;
    let producer = kafka::Publisher::new(
        &options.kafka,
        &format!("{}-dead-letters", options.instance_id),
        &[
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("linger.ms", "5"),
        ],
    )?;

    tracing::info!(
        sink = %config.name,
        instance = %options.instance_id,
        group = %group,
        topics = %topics.join(", "),
        "sink started"
    );
    let mut committer = Committer {
        db,
        producer,
        config: config.clone(),
        options: options.clone(),
        lost_answers: 0,
        usage_forwarded: Instant::now(),
    };
    // Letters and usage a crash left unforwarded.
    committer.forward_dead_letters()?;
    committer.forward_usage()?;
    let (jobs, queue) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("sink-committer".into())
        .spawn(move || committer.run(queue))
        .map_err(|e| SinkError::Database {
            what: "starting the committer thread".into(),
            source: Box::new(e),
        })?;
    let mut sink = Sink {
        config: &config,
        options: &options,
        consumer: &consumer,
        jobs: Some(jobs),
        epochs: HashMap::new(),
        batch: Vec::new(),
        in_flight: None,
        held: options.memory.holder(),
        batch_bytes: 0,
        in_flight_bytes: 0,
        held_back: Vec::new(),
        report: SinkReport::default(),
    };
    let result = sink.run(&shutdown);
    // The committer ends when its queue closes.
    sink.jobs = None;
    let _ = thread.join();
    result.map(|()| sink.report)
}

struct Sink<'a> {
    config: &'a SinkConfig,
    options: &'a SinkOptions,
    consumer: &'a kafka::GroupReader,
    /// The committer's queue.
    jobs: Option<Sender<Job>>,
    /// This instance's claims: (topic, partition) -> owner epoch.
    epochs: HashMap<(String, i32), i64>,
    /// The records read since the last batch was handed over, in arrival
    /// order (offset order per partition).
    batch: Vec<Item>,
    /// The batch the committer is applying, and when it was handed over.
    in_flight: Option<(Receiver<Result<BatchDone, SinkError>>, Instant)>,
    /// The two batches' bytes in memory, parsed, against the budgets.
    held: Held,
    /// Bytes of `batch` ([`held_bytes`]), and of the batch in flight.
    batch_bytes: u64,
    in_flight_bytes: u64,
    /// The partitions paused while the next batch is full and the one in
    /// flight has not returned ([`Sink::hold_back`]).
    held_back: Vec<(String, i32)>,
    report: SinkReport,
}

impl Sink<'_> {
    fn run(&mut self, shutdown: &AtomicBool) -> Result<(), SinkError> {
        let max_wait = Duration::from_millis(self.config.max_batch_wait_ms);
        let mut first_at: Option<Instant> = None;
        let mut reported = Instant::now();
        let mut last_expiry = Instant::now();
        let mut last_usage = Instant::now();
        while !shutdown.load(Ordering::Relaxed) {
            self.take_changes()?;
            self.finish_in_flight(false)?;
            if self.in_flight.is_none() {
                self.release_held_back()?;
            }
            let wait = match first_at {
                Some(t) => max_wait.saturating_sub(t.elapsed()),
                None => max_wait,
            }
            .min(Duration::from_millis(20));
            match self.consumer.poll(wait) {
                kafka::Polled::Record(record) => {
                    if let Some(item) = self.item(&record) {
                        first_at.get_or_insert_with(Instant::now);
                        self.batch_bytes += held_bytes(&item);
                        self.batch.push(item);
                    }
                }
                kafka::Polled::Failed(e) => tracing::debug!("consumer: {e}"),
                kafka::Polled::End | kafka::Polled::Nothing => {}
            }
            let full = self.batch.len() >= self.config.max_batch_records
                || !self.held.set(self.batch_bytes + self.in_flight_bytes);
            let due = first_at.is_some_and(|t| t.elapsed() >= max_wait);
            if full && self.in_flight.is_some() {
                // Wait for the batch in flight in short steps, the consumer
                // polled between them; past HOLD_BACK_AFTER the database is
                // slow or away: the partitions pause until it returns.
                self.finish_in_flight_within(Some(Duration::from_millis(100)))?;
                if self
                    .in_flight
                    .as_ref()
                    .is_some_and(|(_, handed)| handed.elapsed() >= HOLD_BACK_AFTER)
                {
                    self.hold_back()?;
                }
            } else if full || (due && self.in_flight.is_none()) {
                self.take_changes()?;
                self.submit()?;
                first_at = None;
            }
            if reported.elapsed() >= self.options.report_interval {
                reported = Instant::now();
                let r = &self.report;
                tracing::info!(
                    batches = r.batches,
                    applied = r.applied,
                    behind = r.behind,
                    duplicates = r.duplicates,
                    dead_letters = r.dead_letters,
                    retries = r.retries,
                    partitions = self.epochs.len(),
                    "sink progress"
                );
            }
            if last_expiry.elapsed() >= EXPIRE_EVERY {
                last_expiry = Instant::now();
                self.send(Job::Expire)?;
            }
            // Usage left behind by the last batches (the committer forwards
            // after a batch at most once a second), and what a forward could
            // not send in time.
            if last_usage.elapsed() >= Duration::from_secs(5) {
                last_usage = Instant::now();
                self.send(Job::Forward)?;
            }
        }
        self.take_changes()?;
        self.submit()?;
        self.finish_in_flight(true)?;
        tracing::info!(
            applied = self.report.applied,
            batches = self.report.batches,
            "sink stopped"
        );
        Ok(())
    }

    fn send(&self, job: Job) -> Result<(), SinkError> {
        self.jobs
            .as_ref()
            .and_then(|j| j.send(job).ok())
            .ok_or_else(committer_gone)
    }

    /// The next batch is full while the one in flight has not returned for
    /// [`HOLD_BACK_AFTER`] (the database slow or away, the committer
    /// retrying): the loop pauses the partitions and goes on polling, so
    /// that the instance keeps its membership (`max.poll.interval.ms`) and
    /// sees rebalances, rather than wait for the committer with the consumer
    /// unpolled (eos-audit-3 finding 3: an instance expelled meanwhile then
    /// outlived its membership).
    /// Partitions claimed while held back (a rebalance meanwhile) are
    /// paused too.
    fn hold_back(&mut self) -> Result<(), SinkError> {
        let parts: Vec<(String, i32)> = self
            .epochs
            .keys()
            .filter(|at| !self.held_back.contains(at))
            .cloned()
            .collect();
        if parts.is_empty() {
            return Ok(());
        }
        self.consumer.pause(&parts)?;
        tracing::info!(
            partitions = parts.len(),
            "the batch in flight is slow (the database slow or away) and the next one is full: \
             partitions paused until it returns"
        );
        self.held_back.extend(parts);
        Ok(())
    }

    /// Resumes the partitions [`Sink::hold_back`] paused that are still
    /// this instance's.
    fn release_held_back(&mut self) -> Result<(), SinkError> {
        if self.held_back.is_empty() {
            return Ok(());
        }
        let parts: Vec<(String, i32)> = std::mem::take(&mut self.held_back)
            .into_iter()
            .filter(|at| self.epochs.contains_key(at))
            .collect();
        self.consumer.resume(&parts)?;
        Ok(())
    }

    /// Hands the batch to the committer, once the previous one is
    /// committed.
    fn submit(&mut self) -> Result<(), SinkError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.finish_in_flight(true)?;
        let (reply, done) = std::sync::mpsc::sync_channel(1);
        let items = std::mem::take(&mut self.batch);
        // Now in flight: still held until it is committed.
        self.in_flight_bytes = std::mem::take(&mut self.batch_bytes);
        self.send(Job::Batch(Box::new(BatchJob {
            items,
            epochs: self.epochs.clone(),
            reply,
        })))?;
        self.in_flight = Some((done, Instant::now()));
        Ok(())
    }

    /// Takes the in-flight batch's outcome (waiting for it with `block`):
    /// the counts, the partitions found claimed by another instance, and
    /// the Kafka offsets to commit (for lag monitoring only).
    fn finish_in_flight(&mut self, block: bool) -> Result<(), SinkError> {
        self.finish_in_flight_within((!block).then_some(Duration::ZERO))
    }

    /// [`Sink::finish_in_flight`], waiting at most `wait` (`None`: until
    /// it returns).
    fn finish_in_flight_within(&mut self, wait: Option<Duration>) -> Result<(), SinkError> {
        use std::sync::mpsc::RecvTimeoutError;
        let Some((rx, handed)) = &self.in_flight else {
            return Ok(());
        };
        let handed = *handed;
        let outcome = match wait {
            None => rx.recv().map_err(|_| committer_gone())?,
            Some(wait) => match rx.recv_timeout(wait) {
                Ok(o) => o,
                Err(RecvTimeoutError::Timeout) => return Ok(()),
                Err(RecvTimeoutError::Disconnected) => return Err(committer_gone()),
            },
        };
        self.in_flight = None;
        self.in_flight_bytes = 0;
        self.held.set(self.batch_bytes);
        let done = outcome?;
        let a = done.applied;
        self.report.batches += 1;
        self.report.applied += a.applied;
        self.report.behind += a.behind;
        self.report.duplicates += a.duplicates;
        self.report.dead_letters += a.dead;
        self.report.slow_batches += u64::from(a.slow);
        self.report.retries += done.retries;
        let m = &self.options.metrics;
        Metrics::add(&m.records, a.applied + a.behind + a.duplicates + a.dead);
        Metrics::add(&m.commits, 1);
        Metrics::add(&m.dead_lettered, a.dead);
        Metrics::add(&m.fenced, done.fenced.len() as u64);
        m.commit_latency(handed.elapsed());
        let mut lost = Vec::new();
        for (at, epoch) in done.fenced {
            self.report.fenced += 1;
            // Not if the partition was claimed again since.
            if self.epochs.get(&at) == Some(&epoch) {
                self.epochs.remove(&at);
                self.drop_from_batch(|i| i.topic == at.0 && i.partition == at.1);
                lost.push(at);
            }
        }
        if !lost.is_empty() {
            let _ = self.consumer.pause(&lost);
            // Claimed by another instance while the group still gives them
            // here: that claim was stale (an instance expelled while it was
            // blocked claimed them from an assignment it had lost;
            // eos-audit-3 finding 3). Paused, they would stay unread: the
            // group never assigns a member what it keeps. Rejoining has the
            // group assign them anew, and their owner claims them again.
            let kept = self.consumer.still_assigned(&lost)?;
            if !kept.is_empty() {
                tracing::warn!(
                    partitions = %show(&kept),
                    "partitions this instance owns in the group were claimed by another \
                     instance (a stale claim); rejoining the group to claim them again"
                );
                self.consumer.rejoin()?;
            }
        }
        if !self.options.pause_after_commit.is_zero() {
            tracing::info!(
                ms = self.options.pause_after_commit.as_millis() as u64,
                "fault window: after COMMIT, before the Kafka offset commit"
            );
            std::thread::sleep(self.options.pause_after_commit);
        }
        if !done.next.is_empty()
            && let Err(e) = self.consumer.commit_async(&done.next)
        {
            tracing::debug!("committing offsets for lag monitoring: {e}");
        }
        Ok(())
    }

    /// Drops the batch's items that `drop` picks (a partition lost).
    fn drop_from_batch(&mut self, drop: impl Fn(&Item) -> bool) {
        self.batch.retain(|i| !drop(i));
        self.batch_bytes = self.batch.iter().map(held_bytes).sum();
    }

    /// The record as a batch item, if its partition is claimed.
    fn item(&self, m: &kafka::Record<'_>) -> Option<Item> {
        let at = (m.topic().to_owned(), m.partition());
        if !self.epochs.contains_key(&at) {
            return None;
        }
        let (route_index, route) = self.config.route(m.topic())?;
        let value = m.payload().map(<[u8]>::to_vec);
        let mut json = match &value {
            None => Ok(None),
            Some(v) => match serde_json::from_slice::<serde_json::Value>(v) {
                Ok(serde_json::Value::Object(o)) => Ok(Some(o)),
                Ok(_) => Err("the value is not a JSON object".to_owned()),
                Err(e) => Err(format!("the value is not JSON: {e}")),
            },
        };
        let position = format!("{}/{}/{}", at.0, at.1, m.offset());
        let identity = match &route.identity {
            Identity::Position => position,
            Identity::Field(f) => {
                let v = json.as_ref().ok().and_then(|o| o.as_ref()?.get(f.as_str()));
                match v {
                    Some(serde_json::Value::String(s)) => format!("{}#{s}", at.0),
                    Some(n @ serde_json::Value::Number(_)) => format!("{}#{n}", at.0),
                    _ => {
                        if json.is_ok() {
                            json = Err(format!(
                                "the identity field {f:?} is missing, or not a string or an integer"
                            ));
                        }
                        position
                    }
                }
            }
        };
        let digest = match &value {
            Some(v) => Sha256::digest(v).to_vec(),
            None => vec![0; 32],
        };
        // What usage counts as bytes in, as for a deployment's input:
        // key, value and headers.
        let bytes = (m.key().map_or(0, <[u8]>::len)
            + value.as_ref().map_or(0, Vec::len)
            + m.header_bytes()) as u64;
        Some(Item {
            route: route_index,
            topic: at.0,
            partition: at.1,
            offset: m.offset(),
            bytes,
            key: m.key().map(<[u8]>::to_vec),
            value,
            json,
            identity,
            marked: matches!(route.identity, Identity::Field(_)),
            digest,
        })
    }

    /// Applies the rebalances the consumer reported: a revoked partition's
    /// records are dropped (its next owner reads them from the database's
    /// position); an assigned one is claimed, then read from there.
    fn take_changes(&mut self) -> Result<(), SinkError> {
        for change in self.consumer.changes() {
            match change {
                kafka::Change::Revoked(parts) => {
                    tracing::info!(partitions = %show(&parts), "partitions revoked");
                    for at in &parts {
                        self.epochs.remove(at);
                    }
                    self.drop_from_batch(|i| {
                        parts
                            .iter()
                            .any(|(t, p)| *t == i.topic && *p == i.partition)
                    });
                }
                kafka::Change::Assigned(parts) => {
                    // Not what the group took back since (this instance was
                    // expelled while it did not poll): claiming it would
                    // out-epoch its real owner.
                    let parts = self.consumer.still_assigned(&parts)?;
                    if parts.is_empty() {
                        continue;
                    }
                    let (reply, answer) = std::sync::mpsc::sync_channel(1);
                    self.send(Job::Claim(parts.clone(), reply))?;
                    let claims = answer.recv().map_err(|_| committer_gone())??;
                    // The claim waited behind a batch: what the group took
                    // back meanwhile is not read (its owner, fenced by this
                    // claim, rejoins and claims it again).
                    let kept = self.consumer.still_assigned(&parts)?;
                    let mut starts = Vec::with_capacity(claims.len());
                    for c in claims
                        .iter()
                        .filter(|c| kept.iter().any(|(t, p)| *t == c.topic && *p == c.partition))
                    {
                        let at = (c.topic.clone(), c.partition);
                        self.drop_from_batch(|i| i.topic == c.topic && i.partition == c.partition);
                        self.epochs.insert(at, c.epoch);
                        starts.push((c.topic.clone(), c.partition, c.next_offset));
                    }
                    if kept.len() < parts.len() {
                        tracing::info!(
                            partitions = %show(&parts),
                            kept = %show(&kept),
                            "the group took partitions back while their claim waited: not \
                             reading those"
                        );
                    }
                    if !kept.is_empty() {
                        tracing::info!(
                            partitions = %show(&kept),
                            epochs = ?claims.iter().map(|c| c.epoch).collect::<Vec<_>>(),
                            "partitions assigned and claimed"
                        );
                    }
                    // The positions are the database's: Kafka's committed
                    // offsets are for lag monitoring only.
                    self.consumer.start_at(&starts)?;
                }
            }
        }
        Ok(())
    }
}

fn committer_gone() -> SinkError {
    SinkError::Database {
        what: "the committer thread stopped".into(),
        source: "it panicked or exited: see the log above".into(),
    }
}

fn show(parts: &[(String, i32)]) -> String {
    parts
        .iter()
        .map(|(t, p)| format!("{t}/{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Bytes an item holds in memory, its parsed JSON included (the sink's
/// budget counts these, not the record's size on the wire: a small JSON
/// document parses into several times its size).
fn held_bytes(item: &Item) -> u64 {
    let json = match &item.json {
        Ok(Some(map)) => map_bytes(map),
        Ok(None) => 0,
        Err(reason) => reason.len(),
    };
    (std::mem::size_of::<Item>()
        + item.topic.len()
        + item.key.as_ref().map_or(0, Vec::len)
        + item.value.as_ref().map_or(0, Vec::len)
        + item.identity.len()
        + item.digest.len()
        + json) as u64
}

/// A JSON object's heap bytes, roughly: each entry's key and value, and a
/// map node's share per entry.
fn map_bytes(map: &serde_json::Map<String, serde_json::Value>) -> usize {
    map.iter()
        .map(|(k, v)| 3 * std::mem::size_of::<usize>() + k.len() + json_bytes(v))
        .sum()
}

fn json_bytes(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    std::mem::size_of::<Value>()
        + match value {
            Value::String(s) => s.len(),
            Value::Array(a) => a.iter().map(json_bytes).sum(),
            Value::Object(o) => map_bytes(o),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parsed_items_bytes_count_its_json() {
        // 1,000 small numbers: 4 KB of text, many times that parsed.
        let text = format!("{{\"n\": [{}]}}", vec!["1"; 1000].join(","));
        let json = match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(o)) => o,
            other => panic!("{other:?}"),
        };
        let item = Item {
            route: 0,
            topic: "t".into(),
            partition: 0,
            offset: 0,
            bytes: text.len() as u64,
            key: None,
            value: Some(text.clone().into_bytes()),
            json: Ok(Some(json)),
            identity: "t/0/0".into(),
            marked: false,
            digest: vec![0; 32],
        };
        let held = held_bytes(&item);
        assert!(
            held > 1000 * std::mem::size_of::<serde_json::Value>() as u64 + text.len() as u64,
            "{held} bytes for {} of text",
            text.len()
        );
    }
}
