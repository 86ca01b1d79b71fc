//! One worker thread: the exactly-once loop, top to bottom.
//!
//! ```text
//! loop {                                               Session::run
//!     poll up to max-batch-records                     Session::poll_batch (rebalance callbacks run in here)
//!     the commit in flight returned? step 5, and a     Core::poll_commit -> Core::finish_commit
//!         transaction for the records processed meanwhile
//!     restore newly assigned tasks                     Core::restore_pending (stable offsets, then changelog tail)
//!     drop records of partitions revoked meanwhile
//!     begin the transaction if none is open            Core::process
//!     per partition, in order: task.process_batch      state -> call/txn layers; outputs -> produce (held
//!                                                          while a commit is in flight)
//!     commit when commit-interval-ms has passed        Core::start_commit (steps 2-4 on a thread: run_commit)
//!         or 20 batches are pending
//! }
//! ```
//!
//! The protocol: changelog records for every dirty key and the
//! transaction's usage record (on a fleet host), then the tasks' changes
//! are frozen and a thread runs flush, `send_offsets_to_transaction(offsets,
//! group metadata as of the transaction's first record)` and
//! `commit_transaction` (each call retried within one 30 s budget) while the
//! worker goes on (pipelined commits: the next records' writes layer over
//! the frozen changes, their outputs wait in memory); only when it returned
//! committed do the frozen changes go to RocksDB together with the changelog
//! positions. Abortable errors abort, drop every task's guest and pending
//! changes (frozen ones and what was processed behind them included), and
//! rewind to the committed offsets (inside a rebalance callback, where a
//! rewind is not allowed, the loop rewinds right after); anything else
//! (fenced, fatal, a timeout, an unknown state) ends the session: producer,
//! consumer and tasks are dropped and the worker rejoins with new ones.
//! Nothing that must not run under a commit (an abort, a restore, the
//! session's end) does: each waits for the commit in flight first.
//!
//! A transaction never spans a rebalance: the rebalance callbacks abort the
//! open one (never commit it; a commit already in flight is waited for, and
//! its offsets carry the generation of its first record, so the coordinator
//! refuses it if the generation moved on), and every task kept catches up
//! with its changelog and committed offset before processing again
//! (`Core::resync_after_rebalance`).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::client::ClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::clients::{consumer_config, producer_config};
use rdkafka::producer::{BaseProducer, DeliveryResult, Producer, ProducerContext, PurgeConfig};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{Deployment, StreamError, changelog};
use crate::kafka::{self, TxnFailure};
use crate::metrics::{Metrics, WorkerLoad};
use crate::state::rocks::RocksPartition;
use crate::task::{BatchOutcome, Task, TaskError};
use crate::types::{InputRecord, OutputRecord, Usage, UsageRecord, error_chain};

/// How long a blocking transactional call may take before the producer is
/// considered to be in an unknown state.
const TXN_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries of a retriable transactional call.
const TXN_RETRIES: u32 = 5;
/// Longest a worker restores before it polls its consumer again.
const RESTORE_SLICE: Duration = Duration::from_secs(5);
/// How long a restore may keep failing on Kafka errors (a broker away)
/// before the session restarts.
const RESTORE_RETRY_LIMIT: Duration = Duration::from_secs(120);
/// How long a restore may keep failing before its clients are replaced by
/// new ones (at most once per this long). After a broker restart, a
/// client's cached metadata can lack a changelog partition: librdkafka
/// answers `UnknownPartition` from its cache, as a permanent error, without
/// asking the brokers again, until the entry expires (`metadata.max.age.ms`,
/// 15 minutes). In the network-fault drill a worker restored nothing for
/// 103 s after a coordinator broker's SIGKILL and restart, until
/// [`RESTORE_RETRY_LIMIT`] or a rebalance ended it; a new client asks the
/// brokers afresh.
const RESTORER_RENEW_AFTER: Duration = Duration::from_secs(2);

/// Runs worker `n` until shutdown, restarting its session after errors that
/// do not stop the deployment.
pub(crate) fn run_worker(d: &Arc<Deployment>, n: u32) -> Result<(), StreamError> {
    let mut backoff = Duration::from_millis(200);
    // Its thread id, for CPU accounting from outside (/proc/<pid>/task/<tid>;
    // scripts/isolation checks the host's accounting against it).
    if let Ok(link) = std::fs::read_link("/proc/thread-self") {
        tracing::info!(
            app = %d.manifest.application_id(),
            worker = n,
            thread = %link.display(),
            "worker thread"
        );
    }
    loop {
        if d.shutdown.load(Ordering::Relaxed) {
            return Ok(());
        }
        let result = Session::start(d, n).and_then(|mut session| {
            let result = session.run();
            if result.is_err() {
                session.discard();
            }
            result
        });
        d.metrics.worker_load(n, WorkerLoad::default());
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.stops_deployment() => {
                tracing::error!(worker = n, "{}", error_chain(&e));
                return Err(e);
            }
            Err(e) => {
                let why = error_chain(&e);
                tracing::warn!(
                    worker = n,
                    "{why}; re-creating the producer and rejoining the group"
                );
                d.metrics.restarted(why);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Delivery reports: the last offset acknowledged per changelog partition
/// (the store's position after the commit), and failures.
#[derive(Default)]
struct Deliveries {
    changelog_offsets: HashMap<(String, i32), i64>,
    failures: u64,
    first_failure: Option<(Option<RDKafkaErrorCode>, FailedDelivery)>,
}

/// A record the brokers did not take.
struct FailedDelivery {
    topic: String,
    /// The error, and the topic.
    message: String,
}

struct ProducerCtx {
    changelog_topics: Vec<String>,
    deliveries: Mutex<Deliveries>,
    errors: kafka::ErrorLog,
}

impl ProducerCtx {
    fn deliveries(&self) -> MutexGuard<'_, Deliveries> {
        self.deliveries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ClientContext for ProducerCtx {
    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.report("producer", &error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::log(level, fac, message);
    }
}

impl ProducerContext for ProducerCtx {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let mut d = self.deliveries();
        match result {
            Ok(m) => {
                if self.changelog_topics.iter().any(|t| t == m.topic()) {
                    let slot = d
                        .changelog_offsets
                        .entry((m.topic().to_owned(), m.partition()))
                        .or_insert(-1);
                    *slot = (*slot).max(m.offset());
                }
            }
            Err((e, m)) => {
                d.failures += 1;
                if d.first_failure.is_none() {
                    d.first_failure = Some((
                        e.rdkafka_error_code(),
                        FailedDelivery {
                            topic: m.topic().to_owned(),
                            message: format!("{e} (topic {})", m.topic()),
                        },
                    ));
                }
            }
        }
    }
}

/// Counts of the open transaction, added to the metrics when it commits.
#[derive(Default)]
struct Pending {
    records: u64,
    outputs: u64,
    dead_lettered: u64,
    skipped: u64,
    late_dropped: u64,
    punctuations: u64,
    /// Bytes of the outputs produced (held by the producer until acked).
    output_bytes: u64,
    /// Bytes of the input records processed.
    input_bytes: u64,
    /// Bytes of the changelog records written at commit.
    state_bytes: u64,
    /// Fuel burned, this transaction's and aborted attempts' since the last
    /// commit (carried over an abort: the guest did burn it).
    fuel: u64,
    /// Log lines taken from the deployment's unbilled count (carried over
    /// an abort too).
    log_lines: u64,
}

impl Pending {
    /// What an abort leaves to be counted by the next commit.
    fn carried(&self) -> Pending {
        Pending {
            fuel: self.fuel,
            log_lines: self.log_lines,
            ..Pending::default()
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            records_in: self.records,
            bytes_in: self.input_bytes,
            records_out: self.outputs,
            bytes_out: self.output_bytes,
            state_bytes: self.state_bytes,
            dead_letters: self.dead_lettered,
            fuel: self.fuel,
            log_lines: self.log_lines,
        }
    }
}

/// A transaction commits once its outputs reach this many bytes, whatever
/// the commit interval: the producer holds them until the commit.
const MAX_TXN_OUTPUT_BYTES: u64 = 64 << 20;

/// A poll stops taking records once they reach this many bytes (or
/// `processing.max-batch-records`): the batch is held in memory until
/// processed.
const MAX_POLL_BYTES: u64 = 32 << 20;

/// While a commit is in flight the loop polls for at most this long, so
/// that it sees the commit return soon.
const COMMIT_POLL: Duration = Duration::from_millis(2);

/// Outputs of records processed while a commit is in flight wait in memory
/// up to this many bytes; past it the worker waits for the commit.
const MAX_HELD_OUTPUT_BYTES: u64 = 32 << 20;

/// A transaction being committed on its own thread.
struct InFlight {
    done: std::sync::mpsc::Receiver<Result<CommitOutcome, StreamError>>,
    started: Instant,
    /// Its input offsets (a table's next offset is its store's position).
    offsets: BTreeMap<(String, i32), i64>,
    /// Its counts, for the metrics once it commits.
    pending: Pending,
}

impl InFlight {
    /// Waits for the outcome (the committer's calls are bounded: see
    /// [`bounded`]).
    fn wait(&self) -> Result<CommitOutcome, StreamError> {
        self.done.recv().map_err(|_| {
            StreamError::Restart("the commit thread ended without an outcome".to_owned())
        })?
    }

    /// The outcome, if the commit has returned.
    fn try_outcome(&self) -> Option<Result<CommitOutcome, StreamError>> {
        match self.done.try_recv() {
            Ok(outcome) => Some(outcome),
            Err(std::sync::mpsc::TryRecvError::Empty) => None,
            Err(std::sync::mpsc::TryRecvError::Disconnected) => Some(Err(StreamError::Restart(
                "the commit thread ended without an outcome".to_owned(),
            ))),
        }
    }
}

/// How steps 2-4 of the protocol (flush, offsets, commit) ended.
enum CommitOutcome {
    /// Committed (at_least_once: flushed); the last changelog offset each
    /// changelog partition reached.
    Committed {
        changelog_offsets: HashMap<(String, i32), i64>,
    },
    Flush(KafkaError),
    /// Records of the transaction were not delivered.
    Undelivered {
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    },
    Offsets(KafkaError),
    Commit(KafkaError),
}

/// Steps 2-4 of the protocol on `producer`: flush (every record
/// acknowledged, so the delivery reports hold the changelog positions), the
/// offsets with the consumer's group metadata (none: at_least_once, where
/// the consumer commits them), and the commit. Each transactional call runs
/// bounded ([`bounded`]): an overrun ends the session.
fn run_commit(
    producer: &Arc<BaseProducer<ProducerCtx>>,
    offsets: TopicPartitionList,
    group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
) -> Result<CommitOutcome, StreamError> {
    if let Err(e) = kafka::drain(producer.as_ref(), TXN_CALL_TIMEOUT) {
        return Ok(CommitOutcome::Flush(e));
    }
    {
        let mut d = producer.context().deliveries();
        let failures = std::mem::take(&mut d.failures);
        if let Some((code, first)) = d.first_failure.take() {
            return Ok(CommitOutcome::Undelivered {
                count: failures,
                code,
                first,
            });
        }
    }
    if let Some(metadata) = group {
        if offsets.count() > 0 {
            let metadata = Arc::new(metadata);
            let mut overrun = None;
            let r = retry("send_offsets_to_transaction", |timeout| {
                let (offsets, metadata) = (offsets.clone(), Arc::clone(&metadata));
                let call = move |p: &BaseProducer<ProducerCtx>| {
                    p.send_offsets_to_transaction(&offsets, &metadata, timeout)
                };
                bounded(producer, "send_offsets_to_transaction", timeout, call).unwrap_or_else(
                    |e| {
                        overrun = Some(e);
                        Ok(())
                    },
                )
            });
            if let Some(e) = overrun {
                return Err(e);
            }
            if let Err(e) = r {
                return Ok(CommitOutcome::Offsets(e));
            }
        }
        let mut overrun = None;
        let r = retry("commit_transaction", |timeout| {
            let call = move |p: &BaseProducer<ProducerCtx>| p.commit_transaction(timeout);
            bounded(producer, "commit_transaction", timeout, call).unwrap_or_else(|e| {
                overrun = Some(e);
                Ok(())
            })
        });
        if let Some(e) = overrun {
            return Err(e);
        }
        if let Err(e) = r {
            return Ok(CommitOutcome::Commit(e));
        }
    }
    let changelog_offsets = std::mem::take(&mut producer.context().deliveries().changelog_offsets);
    Ok(CommitOutcome::Committed { changelog_offsets })
}

/// What the poll loop and the rebalance callbacks share.
struct Core {
    d: Arc<Deployment>,
    worker: u32,
    producer: Arc<BaseProducer<ProducerCtx>>,
    /// The producer's `init_transactions`, running on a thread of its own
    /// until the worker first needs the producer.
    producer_init: Option<std::sync::mpsc::Receiver<Result<(), StreamError>>>,
    tasks: BTreeMap<i32, Task>,
    /// Assigned partitions whose stores are not restored yet (paused).
    restoring: BTreeSet<i32>,
    /// A Kafka transaction is open (or, at_least_once, a batch is
    /// uncommitted).
    in_txn: bool,
    txn_started: Instant,
    /// The transaction whose commit runs on a thread of its own while the
    /// worker goes on (pipelined commits; see [`Core::start_commit`]).
    in_flight: Option<InFlight>,
    /// Records were processed while a commit was in flight: they go into
    /// the next Kafka transaction, which begins when that commit returns;
    /// their outputs wait in `held` until then.
    deferred: bool,
    held: Vec<OutputRecord>,
    /// Next offset to read per input partition consumed in this transaction.
    next_offsets: BTreeMap<(String, i32), i64>,
    pending: Pending,
    /// An error raised inside a rebalance callback, for the loop to act on.
    failure: Option<StreamError>,
    /// Inside a rebalance callback: an abort cannot rewind there, so it
    /// ends the session instead.
    in_callback: bool,
    /// Partitions revoked since the last poll batch began: records of the
    /// batch from them are not ours any more (even if reassigned since, the
    /// consumer reads them again from the committed offset).
    revoked_during_poll: BTreeSet<i32>,
    /// The open transaction was aborted inside a rebalance callback (where
    /// seeking is not allowed): the loop rewinds the partitions it keeps to
    /// the committed offsets before it processes anything else.
    rewind_pending: bool,
    /// The group metadata (generation) when the open transaction began.
    txn_group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    /// When each restoring partition's restore began failing (brokers
    /// away), for [`RESTORE_RETRY_LIMIT`].
    restore_failing_since: BTreeMap<i32, Instant>,
    /// Transactions aborted by this session: a batch polled before an
    /// abort is stale (the input was rewound) and must not be processed.
    aborts: u64,
    restore_consumer: Option<changelog::Restorer>,
    /// Records polled and not processed yet, of tasks with more than one
    /// source topic (see [`Queued`]).
    queued: BTreeMap<i32, Queued>,
    /// The committed offset each source partition was last read from (at
    /// its restore or a rewind): its position until the consumer returns
    /// something from it (librdkafka's position is unknown until then).
    read_from: HashMap<(String, i32), i64>,
    /// What this worker holds in memory until its commits, against the
    /// deployment's and the tenant's budgets ([`Core::hold`]).
    memory: crate::memory::Held,
}

/// A task's polled records while it has more than one source topic (inputs
/// and tables), one queue per topic in the order of
/// [`Core::source_order`]. Kafka Streams' `max.task.idle.ms` at its default
/// (0): the task takes the record with the smallest timestamp among its
/// topics' heads, and while a topic's queue is empty it waits if that
/// topic's partition has records on the broker it has not read (they may
/// come first), and goes on without it when it is read to its end.
struct Queued {
    queues: Vec<VecDeque<InputRecord>>,
    /// Since when the task has waited for an empty topic with unread
    /// records.
    waiting_since: Option<Instant>,
    /// When the waiting task last asked the broker for the last stable
    /// offsets, and which of its topics were read up to them then.
    stable_check: Option<(Instant, Vec<bool>)>,
    /// It waited [`MAX_SOURCE_WAIT`] and goes on without the empty topics.
    gave_up: bool,
}

impl Queued {
    /// The records the task may process now, in timestamp order across its
    /// topics (on a tie, the topic first; a topic's records keep their
    /// offset order even when their timestamps go back), for as long as no
    /// topic is empty or `may_go_without` the empty ones (their ranks) says
    /// yes; it may wait at most [`MAX_SOURCE_WAIT`].
    fn take(
        &mut self,
        mut may_go_without: impl FnMut(&[usize], &mut Queued) -> bool,
    ) -> Vec<InputRecord> {
        let mut taken = Vec::new();
        // Queues only empty here: an answer holds for the rest of the call.
        let mut allowed: Vec<usize> = Vec::new();
        loop {
            let empty: Vec<usize> = (0..self.queues.len())
                .filter(|&i| self.queues[i].is_empty())
                .collect();
            if empty.len() == self.queues.len() {
                break;
            }
            if empty.iter().all(|i| allowed.contains(i)) || may_go_without(&empty, self) {
                allowed = empty;
                self.waiting_since = None;
                self.stable_check = None;
                self.gave_up = false;
            } else {
                let since = *self.waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() < MAX_SOURCE_WAIT {
                    break;
                }
                if !self.gave_up {
                    tracing::info!(
                        "waited {} ms for a topic's unread records: going on without them",
                        since.elapsed().as_millis()
                    );
                    self.gave_up = true;
                }
            }
            let next = (0..self.queues.len())
                .filter_map(|i| self.queues[i].front().map(|r| (r.timestamp, i)))
                .min();
            let Some((_, i)) = next else {
                break;
            };
            taken.extend(self.queues[i].pop_front());
        }
        taken
    }
}

/// A waiting task asks the broker for the last stable offset of a topic it
/// waits for after this long, and again every as long: librdkafka's
/// cached end is the high watermark, which an open transaction keeps past
/// what a read_committed consumer can read (Kafka Streams' consumer knows
/// the last stable offset; librdkafka's does not tell).
const STABLE_CHECK_EVERY: Duration = Duration::from_millis(200);

/// A task never waits longer than this for a topic (a partition whose
/// position cannot reach its end: not expected, but it must not stall the
/// task's other topics for good).
const MAX_SOURCE_WAIT: Duration = Duration::from_secs(5);

impl Drop for Core {
    /// The session ended: its tasks close.
    fn drop(&mut self) {
        let mut open = self.d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
        for p in self.tasks.keys() {
            open.remove(p);
        }
    }
}

struct WorkerContext {
    core: Arc<Mutex<Core>>,
    errors: kafka::ErrorLog,
    /// Records behind the last stable offsets over the assigned partitions,
    /// from librdkafka's statistics (every second).
    lag: std::sync::atomic::AtomicI64,
    /// The consumer's group membership as the statistics report it.
    membership: Mutex<Membership>,
}

/// When librdkafka last reported this consumer connected to its group
/// coordinator (group state `up`), and when it last reported at all. The join
/// state is left out on purpose: a rebalance may wait minutes for a member
/// that is restoring, and that is no reason to start over.
struct Membership {
    last_report: Option<Instant>,
    last_connected: Instant,
    state: String,
}

/// How long a consumer may go without its group coordinator before the
/// session is re-created. librdkafka can lose its way back to the group
/// coordinator after a broker restart (it keeps a decommissioned broker as
/// the coordinator, librdkafka#5511) and then never rejoins; a new client
/// finds the coordinator again.
fn membership_limit(session_timeout: Duration) -> Duration {
    (session_timeout * 3).max(Duration::from_secs(30))
}

/// How long the consumer has been without its coordinator, judged only from statistics
/// seen recently: while the poll loop is busy elsewhere (restoring,
/// committing) no statistics arrive, and that is not the group's fault.
fn coordinator_lost_for(membership: &Membership, now: Instant) -> Option<Duration> {
    let report = membership.last_report?;
    if now.saturating_duration_since(report) > Duration::from_secs(5) {
        return None;
    }
    Some(report.saturating_duration_since(membership.last_connected))
}

impl ClientContext for WorkerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.report("consumer", &error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::log(level, fac, message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        if let Some(group) = &statistics.cgrp {
            let now = Instant::now();
            let mut m = self.membership.lock().unwrap_or_else(|e| e.into_inner());
            m.last_report = Some(now);
            if group.state == "up" {
                m.last_connected = now;
            }
            m.state = format!("{}/{}", group.state, group.join_state);
        }
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.iter())
            .filter(|(p, _)| **p >= 0)
            .map(|(_, p)| p.consumer_lag.max(0))
            .sum();
        self.lag.store(lag, Ordering::Relaxed);
    }
}

impl ConsumerContext for WorkerContext {
    /// Partitions are leaving: abort the open transaction, close their
    /// tasks, and re-synchronise the tasks that stay (see
    /// [`Core::resync_after_rebalance`]).
    ///
    /// A transaction never spans a rebalance, and is never committed in
    /// one: a member that was out of the group without knowing it (its
    /// partitions processed meanwhile by another member) rejoins with a new,
    /// valid generation, and a commit in this callback would carry that
    /// generation and go through, committing records the other member
    /// already committed. Seen in the network-fault drill: 1,115 duplicate
    /// outputs and 172 wrong balances in one round, after a member whose
    /// offsets had been refused as "generation not valid" committed in the
    /// revoke callback of its rejoin. Aborting costs at most one commit
    /// interval of work, processed again from the committed offsets.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let mut core = lock(&self.core);
        tracing::info!(
            worker = core.worker,
            revoked = ?partitions_of(tpl),
            lost = consumer.assignment_lost(),
            "partitions revoked"
        );
        core.in_callback = true;
        if core.busy() {
            let result = if std::thread::panicking() {
                // The consumer is being dropped while a panic unwinds (a
                // bug in processing): the transaction is half built. Never
                // commit it.
                tracing::error!(
                    worker = core.worker,
                    "aborting the open transaction: the worker panicked"
                );
                core.abort(None)
            } else {
                tracing::info!(
                    worker = core.worker,
                    lost = consumer.assignment_lost(),
                    "rebalance: aborting the open transaction"
                );
                // The partitions we keep are rewound by the loop.
                core.abort(Some(consumer))
            };
            if let Err(e) = result {
                core.failure.get_or_insert(e);
            }
        }
        core.in_callback = false;
        for p in partitions_of(tpl) {
            core.revoked_during_poll.insert(p);
            if core.close_task(p) {
                tracing::info!(
                    worker = core.worker,
                    partition = p,
                    "task closed (partition revoked)"
                );
            }
            core.restoring.remove(&p);
        }
        if let Err(e) = core.resync_after_rebalance(consumer) {
            core.failure.get_or_insert(e);
        }
    }

    /// Partitions arrived: open their stores and pause them until restored
    /// (restoring waits for stable offsets, which needs the poll loop).
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let tpl = match rebalance {
            Rebalance::Assign(tpl) => tpl,
            Rebalance::Revoke(_) => return,
            Rebalance::Error(e) => {
                tracing::warn!("rebalance error: {e}");
                return;
            }
        };
        let mut core = lock(&self.core);
        let assigned = partitions_of(tpl);
        tracing::info!(
            worker = core.worker,
            ?assigned,
            topics = %topic_partitions(tpl),
            "partitions assigned"
        );
        // Nothing processed before the rebalance may commit after it (see
        // `pre_rebalance`), and the tasks kept may have been another
        // member's meanwhile.
        core.in_callback = true;
        if core.busy()
            && let Err(e) = core.abort(Some(consumer))
        {
            core.failure.get_or_insert(e);
        }
        core.in_callback = false;
        if let Err(e) = core.resync_after_rebalance(consumer) {
            core.failure.get_or_insert(e);
        }
        let mut pause = TopicPartitionList::new();
        let mut to_open = Vec::new();
        for p in assigned {
            if core.tasks.contains_key(&p) {
                // Assigned again without a revoke in between: the open
                // transaction may hold this partition's records while the
                // consumer reads them again from the committed offset. Only
                // a clean rejoin is safe.
                tracing::warn!(
                    partition = p,
                    "partition assigned while its task is open; rejoining"
                );
                core.failure.get_or_insert(StreamError::Restart(format!(
                    "partition {p} assigned twice"
                )));
                continue;
            }
            to_open.push(p);
        }
        core.start_fencing(consumer, &to_open);
        for (p, opened) in core.open_tasks(&to_open) {
            match opened {
                Ok(task) => {
                    core.tasks.insert(p, task);
                    core.restoring.insert(p);
                    for e in tpl.elements().iter().filter(|e| e.partition() == p) {
                        pause.add_partition(e.topic(), p);
                    }
                }
                Err(e) => {
                    core.failure.get_or_insert(e);
                }
            }
        }
        if pause.count() > 0
            && let Err(e) = consumer.pause(&pause)
        {
            core.failure
                .get_or_insert(StreamError::kafka("pausing partitions to restore", e));
        }
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// `topic[0,2] other[0,2]`: an assignment by topic, for the logs (tests
/// check from it that a task's topics were never split between workers).
fn topic_partitions(tpl: &TopicPartitionList) -> String {
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_owned())
            .or_default()
            .push(e.partition());
    }
    by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{t}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn partitions_of(tpl: &TopicPartitionList) -> BTreeSet<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

/// librdkafka applies a resume on its main thread without waking the
/// thread that fetches from the partition's leader, which sleeps until its
/// next I/O (a heartbeat, a fetch of other partitions) or for up to 1 s:
/// after a restart, with every partition paused to restore, the first
/// records came 0.4 to 0.9 s after the resume (the recovery benchmark;
/// `rd_kafka_toppar_pause_resume` in librdkafka 2.12). Any request to a
/// leader wakes its thread, which then sees the partitions fetchable: one
/// ListOffsets per leader (`offsets_for_times`, "latest"). Only a wake-up:
/// an error is no reason to stop, the fetch starts within a second anyway.
fn wake_fetchers(consumer: &BaseConsumer<WorkerContext>, resumed: &TopicPartitionList) {
    let mut latest = TopicPartitionList::new();
    for e in resumed.elements() {
        if let Err(e) = latest.add_partition_offset(e.topic(), e.partition(), Offset::End) {
            tracing::debug!("waking the fetchers: {e}");
            return;
        }
    }
    if let Err(e) = consumer.offsets_for_times(latest, Duration::from_secs(1)) {
        tracing::debug!("waking the fetchers of resumed partitions: {e}");
    }
}

/// Worker `n`'s client id, also its transactional id.
fn client_id(d: &Deployment, n: u32) -> String {
    super::names::transactional_id(&d.manifest.application_id(), &d.options.instance_id, n)
}

/// Worker `n`'s producer, transactional under exactly-once: its
/// `init_transactions` fences any earlier producer with the same
/// transactional id (a crashed incarnation of this worker, or this worker's
/// previous producer) and aborts its open transaction.
fn new_producer(d: &Deployment, n: u32) -> Result<Arc<BaseProducer<ProducerCtx>>, StreamError> {
    let producer = create_producer(d, n)?;
    if d.exactly_once() {
        init_producer(d, n, &producer)?;
    }
    Ok(producer)
}

/// The worker's producer, its transactions not initialised yet.
fn create_producer(d: &Deployment, n: u32) -> Result<Arc<BaseProducer<ProducerCtx>>, StreamError> {
    let client_id = client_id(d, n);
    let transactional_id = d.exactly_once().then(|| client_id.clone());
    let producer: BaseProducer<ProducerCtx> =
        producer_config(&d.options, transactional_id.as_deref(), &client_id)
            .create_with_context(ProducerCtx {
                changelog_topics: d.changelogs.iter().map(|(_, t)| t.clone()).collect(),
                deliveries: Mutex::default(),
                errors: kafka::ErrorLog::default(),
            })
            .map_err(|e| StreamError::kafka("creating the producer", e))?;
    Ok(Arc::new(producer))
}

/// `init_transactions`: fences the previous incarnation of the worker's
/// transactional id and aborts its open transaction.
fn init_producer(
    d: &Deployment,
    n: u32,
    producer: &BaseProducer<ProducerCtx>,
) -> Result<(), StreamError> {
    let started = Instant::now();
    let client_id = client_id(d, n);
    let topic = d.manifest.sources().first().map(|t| t.to_string());
    abort_previous_quickly(&d.options, &client_id, topic.as_deref());
    if let Some(topic) = &topic {
        connect_first(producer, topic, ABORT_PROBE_WAIT);
    }
    producer.init_transactions(TXN_CALL_TIMEOUT).map_err(
        |e| match kafka::authorization_failure(&e) {
            Some(code) => refused(d, n, code, None),
            None => StreamError::Restart(format!("init_transactions: {e}")),
        },
    )?;
    tracing::debug!(
        worker = n,
        init_ms = started.elapsed().as_millis() as u64,
        "transactional producer ready"
    );
    Ok(())
}

/// The brokers' authorizer refused worker `n` something (an ACL is
/// missing): what, named from the answer's code (`topic` when the call
/// names one). Retrying cannot help, so the deployment stops with this, as
/// Kafka Streams stops on an authorization exception; grant the ACL, then
/// start (or `resume`) it again.
fn refused(d: &Deployment, n: u32, code: RDKafkaErrorCode, topic: Option<&str>) -> StreamError {
    let (resource, operation) = match code {
        RDKafkaErrorCode::GroupAuthorizationFailed => (
            format!("consumer group {:?}", d.manifest.application_id()),
            "Read",
        ),
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => {
            (format!("transactional id {:?}", client_id(d, n)), "Write")
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => match topic {
            Some(t) => (format!("topic {t:?}"), "Write"),
            None => (
                format!(
                    "a topic of {} (inputs and tables {}, outputs, dead letters, changelogs)",
                    d.manifest.application_id(),
                    d.manifest.sources().join(", ")
                ),
                "Read or Write",
            ),
        },
        _ => ("the cluster".to_owned(), "IdempotentWrite"),
    };
    StreamError::Kafka(kafka::KafkaError::not_authorized(resource, operation, code))
}

/// How long past its own timeout a transactional call may run before its
/// producer is given up.
const TXN_CALL_GRACE: Duration = Duration::from_secs(15);

/// Runs a transactional call on a helper thread and waits for it at most
/// `timeout` + [`TXN_CALL_GRACE`]. librdkafka 2.12's
/// `send_offsets_to_transaction` waits for its coordinator's answer without
/// a bound (`rd_kafka_txn_op_req1(…, RD_POLL_INFINITE)`, "timeout is
/// enforced by" the request chain), and in the network-fault drill it never
/// returned after a broker was killed: the worker stood still for minutes.
/// Past the limit the session restarts; the helper thread keeps the old
/// producer until its call returns, and the new producer's
/// `init_transactions` (same transactional id) fences it and aborts its
/// transaction.
fn bounded<T: Send + 'static>(
    producer: &Arc<BaseProducer<ProducerCtx>>,
    what: &str,
    timeout: Duration,
    call: impl FnOnce(&BaseProducer<ProducerCtx>) -> T + Send + 'static,
) -> Result<T, StreamError> {
    let (tx, rx) = std::sync::mpsc::channel();
    let producer = Arc::clone(producer);
    std::thread::Builder::new()
        .name("onceflow-txn-call".to_owned())
        .spawn(move || {
            let _ = tx.send(call(&producer));
        })
        .map_err(|e| StreamError::Restart(format!("{what}: cannot start a thread: {e}")))?;
    let limit = timeout + TXN_CALL_GRACE;
    rx.recv_timeout(limit).map_err(|_| {
        StreamError::Restart(format!(
            "{what} did not return within {} s (librdkafka waits for the transaction \
             coordinator without a bound): giving the producer up; a new one fences it",
            limit.as_secs()
        ))
    })
}

/// Whether the group is steady as librdkafka last reported it (`up/steady`
/// in its statistics; before the first report, `init`, it is taken as
/// steady).
fn group_steady(state: &str) -> bool {
    state == "init" || state.ends_with("/steady")
}

/// One membership of the group with one producer.
struct Session {
    d: Arc<Deployment>,
    consumer: BaseConsumer<WorkerContext>,
    core: Arc<Mutex<Core>>,
    consumer_errors: u64,
    last_error_log: Option<Instant>,
    last_load_report: Instant,
    /// The input topics' names, shared by the records polled from them.
    topics: kafka::TopicNames,
}

impl Session {
    fn start(d: &Arc<Deployment>, n: u32) -> Result<Self, StreamError> {
        let app = d.manifest.application_id();
        let client_id = client_id(d, n);
        // The restorer first: its clients connect while the producer fences
        // and the consumer joins, not after the first assignment.
        let restore_consumer = if d.changelogs.is_empty() {
            None
        } else {
            Some(changelog::restorer(d)?)
        };
        // The producer fences its previous incarnation (0.5-1 s after a
        // crash) on a thread of its own while the consumer joins the group
        // and the stores open; the worker waits for it before it restores
        // or begins a transaction (`Core::producer_ready`).
        let producer = create_producer(d, n)?;
        let producer_init = if d.exactly_once() {
            let (tx, rx) = std::sync::mpsc::channel();
            let (d, producer) = (d.clone(), producer.clone());
            std::thread::Builder::new()
                .name(format!("onceflow-init-{n}"))
                .spawn(move || {
                    // The receiver is gone only when the session ended.
                    let _ = tx.send(init_producer(&d, n, &producer));
                })
                .map_err(|e| {
                    StreamError::Restart(format!("starting the producer's init thread: {e}"))
                })?;
            Some(rx)
        } else {
            None
        };
        let core = Arc::new(Mutex::new(Core {
            d: d.clone(),
            worker: n,
            producer,
            producer_init,
            tasks: BTreeMap::new(),
            restoring: BTreeSet::new(),
            in_txn: false,
            in_flight: None,
            deferred: false,
            held: Vec::new(),
            txn_started: Instant::now(),
            next_offsets: BTreeMap::new(),
            pending: Pending::default(),
            failure: None,
            in_callback: false,
            revoked_during_poll: BTreeSet::new(),
            rewind_pending: false,
            txn_group: None,
            aborts: 0,
            restore_failing_since: BTreeMap::new(),
            restore_consumer,
            queued: BTreeMap::new(),
            read_from: HashMap::new(),
            memory: d.memory.holder(),
        }));
        let sources = d.manifest.sources();
        let consumer: BaseConsumer<WorkerContext> = consumer_config(
            &d.options,
            &app,
            &client_id,
            sources.len() > 1,
            d.manifest.processing.commit_interval_ms,
        )
        .set("statistics.interval.ms", "1000")
        .create_with_context(WorkerContext {
            core: core.clone(),
            errors: kafka::ErrorLog::default(),
            lag: std::sync::atomic::AtomicI64::new(0),
            membership: Mutex::new(Membership {
                last_report: None,
                last_connected: Instant::now(),
                state: "init".to_owned(),
            }),
        })
        .map_err(|e| StreamError::kafka("creating the consumer", e))?;
        consumer
            .subscribe(&sources)
            .map_err(|e| StreamError::kafka("subscribing", e))?;
        tracing::info!(worker = n, %client_id, "worker session started");
        Ok(Self {
            d: d.clone(),
            consumer,
            core,
            consumer_errors: 0,
            last_error_log: None,
            last_load_report: Instant::now(),
            topics: kafka::TopicNames::default(),
        })
    }

    fn run(&mut self) -> Result<(), StreamError> {
        let interval = Duration::from_millis(self.d.manifest.processing.commit_interval_ms);
        let max_batch = self.d.manifest.processing.max_batch_records as usize;
        loop {
            if self.d.shutdown.load(Ordering::Relaxed) {
                return self.shut_down();
            }
            let wait = {
                let mut core = lock(&self.core);
                core.revoked_during_poll.clear();
                if core.in_flight.is_some() {
                    // Back soon to see the commit return.
                    COMMIT_POLL
                } else if core.in_txn || core.deferred {
                    interval.saturating_sub(core.txn_started.elapsed())
                } else {
                    Duration::from_millis(100)
                }
            };
            let batch = self.poll_batch(wait.min(Duration::from_millis(100)), max_batch)?;

            let steady = group_steady(
                &self
                    .consumer
                    .context()
                    .membership
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .state,
            );
            let mut core = lock(&self.core);
            if let Some(e) = core.failure.take() {
                return Err(e);
            }
            if core.rewind_pending {
                // A rebalance callback aborted the transaction: what was
                // polled after it is past the committed offsets.
                core.rewind(&self.consumer)?;
                continue;
            }
            // The commit in flight returned: its outcome, and the next
            // transaction for what was processed meanwhile.
            let aborts = core.aborts;
            core.poll_commit(&self.consumer)?;
            if core.rewind_pending || core.aborts != aborts {
                continue;
            }
            if !core.restoring.is_empty() {
                // Restoring takes a while: nothing may stay open meanwhile
                // (the transaction timeout runs).
                let aborts = core.aborts;
                if core.busy() {
                    core.commit(&self.consumer)?;
                }
                core.restore_pending(&self.consumer)?;
                if core.rewind_pending || core.aborts != aborts {
                    continue;
                }
            }
            let batch: Vec<InputRecord> = if core.revoked_during_poll.is_empty() {
                batch
            } else {
                let revoked = std::mem::take(&mut core.revoked_during_poll);
                batch
                    .into_iter()
                    .filter(|r| !revoked.contains(&r.partition))
                    .collect()
            };
            if !batch.is_empty() || !core.queued.is_empty() {
                core.process(&self.consumer, batch)?;
            }
            // Commits returned and gave memory back: the budgets see it.
            core.hold();
            // Kafka Streams does not commit while a rebalance is in
            // progress: the offsets would carry a generation that is about
            // to change. Interval commits wait for the group to settle, up
            // to half the transaction timeout.
            let open_for = core.txn_started.elapsed();
            let due = core.in_txn
                && ((open_for >= interval && steady)
                    || open_for >= self.d.options.transaction_timeout / 2
                    || core.pending.records >= 20 * max_batch as u64
                    || core.pending.output_bytes >= MAX_TXN_OUTPUT_BYTES);
            if due && core.in_flight.is_none() {
                // Pipelined: the worker goes on while it commits.
                core.start_commit(&self.consumer)?;
            }
            drop(core);
            if self.last_load_report.elapsed() >= Duration::from_secs(1) {
                self.report_load();
                self.check_membership()?;
            }
        }
    }

    /// Ends the session when the consumer has been without its group
    /// coordinator for too long (see [`membership_limit`]).
    fn check_membership(&self) -> Result<(), StreamError> {
        let limit = membership_limit(self.d.options.session_timeout);
        let m = self
            .consumer
            .context()
            .membership
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match coordinator_lost_for(&m, Instant::now()) {
            Some(lost) if lost >= limit => Err(StreamError::Restart(format!(
                "the consumer has had no group coordinator for group {} for {} s (librdkafka \
                 group state {}); re-creating it so it looks the coordinator up afresh",
                self.d.manifest.application_id(),
                lost.as_secs(),
                m.state
            ))),
            _ => Ok(()),
        }
    }

    /// Publishes this worker's partitions and lag to the metrics.
    fn report_load(&mut self) {
        self.last_load_report = Instant::now();
        let (worker, partitions) = {
            let core = lock(&self.core);
            (core.worker, core.tasks.keys().copied().collect())
        };
        let lag = self.consumer.context().lag.load(Ordering::Relaxed);
        self.d
            .metrics
            .worker_load(worker, WorkerLoad { partitions, lag });
    }

    /// Polls up to `max` records: waits up to `wait` for the first, then
    /// takes what is already fetched.
    fn poll_batch(&mut self, wait: Duration, max: usize) -> Result<Vec<InputRecord>, StreamError> {
        let mut batch = Vec::new();
        let mut timeout = wait;
        let mut bytes = 0;
        while batch.len() < max && bytes < MAX_POLL_BYTES {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Ok(m)) => {
                    let record = kafka::to_input(&m, &mut self.topics);
                    bytes += record.size() as u64;
                    batch.push(record);
                }
                Some(Err(KafkaError::PartitionEOF(_))) => {}
                // A fatal consumer error (for example a static member fenced
                // by its own new incarnation after a broker restart): this
                // consumer is finished; rejoin with a new one.
                Some(Err(KafkaError::MessageConsumptionFatal(code))) => {
                    return Err(StreamError::Restart(format!("consumer: fatal: {code}")));
                }
                // No ACL for the group or an input: polling on would only
                // repeat the refusal.
                Some(Err(e)) if kafka::authorization_failure(&e).is_some() => {
                    let code = kafka::authorization_failure(&e).expect("checked");
                    let worker = lock(&self.core).worker;
                    return Err(refused(&self.d, worker, code, None));
                }
                Some(Err(e)) => {
                    // Transient (brokers down, a transport failure): librdkafka
                    // reconnects by itself. Say so now and then, not on every
                    // poll, and do not spin.
                    self.consumer_errors += 1;
                    if self
                        .last_error_log
                        .is_none_or(|t| t.elapsed() >= Duration::from_secs(5))
                    {
                        tracing::warn!(
                            "consumer: {e} ({} errors since the last report)",
                            self.consumer_errors
                        );
                        self.consumer_errors = 0;
                        self.last_error_log = Some(Instant::now());
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        Ok(batch)
    }

    /// After an error: make sure nothing of the open transaction commits
    /// when the consumer closes (its revoke callback would try).
    fn discard(&mut self) {
        let mut core = lock(&self.core);
        if let Some(f) = core.in_flight.take() {
            // Not under a commit in flight: it ends first. One that
            // committed stays committed (the stores catch up from their
            // changelogs when the tasks open again); one that failed is
            // aborted here with the rest.
            if !matches!(f.wait(), Ok(CommitOutcome::Committed { .. })) {
                core.in_txn = true;
            }
        }
        if core.in_txn && self.d.exactly_once() {
            core.producer
                .purge(PurgeConfig::default().queue().inflight());
            let _ = kafka::drain(&core.producer, Duration::from_secs(5));
            let _ = core.producer.abort_transaction(Duration::from_secs(5));
        }
        core.in_txn = false;
        core.deferred = false;
        core.held.clear();
        for task in core.tasks.values_mut() {
            task.abort();
        }
        core.next_offsets.clear();
        core.pending = Pending::default();
    }

    /// Clean shutdown: commit what was processed, then leave the group.
    fn shut_down(&mut self) -> Result<(), StreamError> {
        {
            let mut core = lock(&self.core);
            if core.busy() {
                core.commit(&self.consumer)?;
            }
        }
        // Dropping the consumer closes it: the revoke callback runs with no
        // open transaction and closes the tasks (their stores are up to
        // date with their changelog positions).
        tracing::info!("worker leaving the group");
        Ok(())
    }
}

impl Core {
    /// Opens the tasks of `partitions` over their local stores, the
    /// databases up to [`PARALLEL_OPENS`] at a time: after a crash each
    /// replays its write-ahead log, and one after another six partitions
    /// took ~450 ms with 1 GB of state (the recovery benchmark).
    fn open_tasks(&self, partitions: &[i32]) -> Vec<(i32, Result<Task, StreamError>)> {
        let d = &*self.d;
        let mut open = d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
        let mut opened = Vec::with_capacity(partitions.len());
        for chunk in partitions.chunks(PARALLEL_OPENS) {
            std::thread::scope(|s| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|&p| (p, s.spawn(move || open_store(d, p))))
                    .collect();
                for (p, h) in handles {
                    let store = h.join().unwrap_or_else(|_| {
                        Err(StreamError::Restart(format!(
                            "opening the stores of partition {p} panicked"
                        )))
                    });
                    opened.push((p, store));
                }
            });
        }
        opened
            .into_iter()
            .map(|(p, store)| {
                let task = store.map(|store| {
                    open.insert(p);
                    Task::new(
                        p,
                        d.processor.clone(),
                        d.task_config.clone(),
                        Box::new(store),
                    )
                });
                (p, task)
            })
            .collect()
    }

    /// Closes `partition`'s task (its stores stay on disk for
    /// `state_cleanup_delay`).
    fn close_task(&mut self, partition: i32) -> bool {
        self.restore_failing_since.remove(&partition);
        self.queued.remove(&partition);
        let closed = self.tasks.remove(&partition).is_some();
        if closed {
            self.d
                .open_tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&partition);
        }
        closed
    }

    /// Starts fencing the workers of other instances that ran `partitions`
    /// before and are no longer in the group (killed, or paused past their
    /// session), on a thread of its own while the stores open: a
    /// transaction session started under their transactional ids aborts
    /// their last transaction at once. Left open, it would hold the
    /// committed offsets unstable (KIP-447) and the changelogs' ends until
    /// the broker aborts it after the transaction timeout, on its next scan
    /// for expired transactions (every 10 s by default): 10 to 20 s before a
    /// failover could go on. A zombie still alive finds itself fenced at its
    /// next commit, as when its own instance restarts.
    ///
    /// Nothing waits for the thread: the coordinator begins aborting at the
    /// first InitProducerId, sent as soon as the fencing producer has found
    /// it, and `restore_pending` goes on once the offsets are stable; the
    /// rest of `init_transactions` is librdkafka's 500 ms retry timers
    /// (0.5 to 1 s measured in the failover benchmark).
    ///
    /// The previous owners are known from the standby thread's view of the
    /// group (read every second with standbys, every 5 s without: a
    /// partition that moved in the last seconds before its owner died may
    /// still wait for the transaction timeout). A worker fenced twice (its
    /// partitions came in two assignments) is harmless: its epoch is bumped
    /// again.
    fn start_fencing(&self, consumer: &BaseConsumer<WorkerContext>, partitions: &[i32]) {
        if !self.d.exactly_once() {
            return;
        }
        let app = self.d.manifest.application_id();
        let me = &self.d.options.instance_id;
        let previous: BTreeSet<String> = partitions
            .iter()
            .filter_map(|p| self.d.standbys.previous_owner(&app, me, *p))
            .collect();
        if previous.is_empty() {
            return;
        }
        let members = match kafka::group_members(consumer, &app) {
            Ok(Some(members)) => members,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("cannot describe the group to fence departed workers: {e}");
                return;
            }
        };
        let departed: Vec<String> = previous
            .into_iter()
            .filter(|id| !members.iter().any(|m| m.client_id == *id))
            .collect();
        if departed.is_empty() {
            return;
        }
        let options = self.d.options.clone();
        let worker = self.worker;
        let topic = self.d.manifest.sources().first().map(|t| t.to_string());
        let spawned = std::thread::Builder::new()
            .name(format!("onceflow-fence-{worker}"))
            .spawn(move || {
                for id in departed {
                    fence(&options, worker, &id, topic.as_deref());
                }
            });
        if let Err(e) = spawned {
            tracing::info!("cannot start a thread to fence departed workers: {e}");
        }
    }

    /// Restores the paused, newly assigned tasks, then resumes them: for
    /// up to [`RESTORE_SLICE`] per call, so that the loop goes on polling
    /// (and processing the partitions that are ready) during a long restore.
    fn restore_pending(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        self.producer_ready()?;
        let partitions: Vec<i32> = self.restoring.iter().copied().collect();
        let mut tpl = TopicPartitionList::new();
        for topic in self.d.manifest.sources() {
            for p in &partitions {
                tpl.add_partition(topic, *p);
            }
        }
        // Wait for the committed offsets to be stable (KIP-447: the previous
        // owner's pending transaction has committed or aborted). Only then
        // is the changelog's end final for what those offsets cover.
        let committed = consumer
            .committed_offsets(tpl.clone(), TXN_CALL_TIMEOUT)
            .map_err(|e| {
                // librdkafka retries UNSTABLE_OFFSET_COMMIT until the timeout
                // and then reports a timeout: say what it usually means.
                StreamError::Restart(format!(
                    "the committed offsets of group {} did not become stable within {} s ({e}): \
                     a transaction holding offsets for it is still open; if this repeats for \
                     longer than the transaction timeout, look for a hanging transaction with \
                     `kafka-transactions.sh find-hanging`",
                    self.d.manifest.application_id(),
                    TXN_CALL_TIMEOUT.as_secs()
                ))
            })?;
        // Where each table's store must be restored to: the committed offset
        // of its topic (the records after it come through the consumer).
        let mut table_ends = BTreeMap::new();
        for elem in committed.elements() {
            let at = (elem.topic().to_owned(), elem.partition());
            if let Offset::Offset(o) = elem.offset() {
                table_ends.insert(at.clone(), o);
                self.read_from.insert(at, o);
            } else {
                self.read_from.remove(&at);
            }
        }
        // The stream time each task had at its last commit.
        for elem in committed.elements() {
            let Some(time) = parse_stream_time_metadata(&elem) else {
                continue;
            };
            if let Some(task) = self.tasks.get_mut(&elem.partition())
                && task.stream_time().is_none_or(|t| t < time)
            {
                task.restore_stream_time(Some(time));
            }
        }
        if self.restore_consumer.is_none() {
            self.restore_consumer = Some(changelog::restorer(&self.d)?);
        }
        let restorer = self.restore_consumer.as_ref().expect("created above");
        let restoring = &self.d.metrics.restoring;
        restoring.fetch_add(partitions.len() as u64, Ordering::Relaxed);
        let started = Instant::now();
        // Whether the restore clients are replaced before the next try
        // (see RESTORER_RENEW_AFTER).
        let mut renew = false;
        let mut done = TopicPartitionList::new();
        for p in &partitions {
            let left = RESTORE_SLICE.saturating_sub(started.elapsed());
            if left.is_zero() {
                restoring.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let task = self.tasks.get_mut(p).expect("restoring tasks exist");
            let stats = changelog::restore(&self.d, restorer, task, &table_ends, left);
            restoring.fetch_sub(1, Ordering::Relaxed);
            let stats = match stats {
                Ok(stats) => {
                    self.restore_failing_since.remove(p);
                    stats
                }
                // A broker away (a leader moving): the partition stays
                // paused and restoring, and the next loop tries again from
                // the store's position; the session stays.
                Err(StreamError::Kafka(
                    e @ (kafka::KafkaError::Client { .. } | kafka::KafkaError::Timeout { .. }),
                )) if self
                    .restore_failing_since
                    .entry(*p)
                    .or_insert_with(Instant::now)
                    .elapsed()
                    < RESTORE_RETRY_LIMIT =>
                {
                    let failing = self
                        .restore_failing_since
                        .get(p)
                        .map_or(Duration::ZERO, Instant::elapsed);
                    renew =
                        failing >= RESTORER_RENEW_AFTER && restorer.age() >= RESTORER_RENEW_AFTER;
                    tracing::info!(
                        worker = self.worker,
                        partition = p,
                        failing_ms = failing.as_millis() as u64,
                        renewing_clients = renew,
                        "restore interrupted, trying again: {}",
                        error_chain(&e)
                    );
                    let left = partitions.iter().filter(|&q| q > p).count() as u64;
                    restoring.fetch_sub(left, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                Err(e) => {
                    let left = partitions.iter().filter(|&q| q > p).count() as u64;
                    restoring.fetch_sub(left, Ordering::Relaxed);
                    return Err(e);
                }
            };
            Metrics::add(&self.d.metrics.restored, stats.records);
            tracing::info!(
                worker = self.worker,
                partition = p,
                records = stats.records,
                ms = stats.elapsed.as_millis() as u64,
                finished = stats.finished,
                "restored {} changelog records",
                stats.records
            );
            if stats.finished {
                Metrics::add(&self.d.metrics.restores, 1);
                self.restoring.remove(p);
                // Every source resumes at once: records are taken in
                // timestamp order across them (`take_ready`).
                for topic in self.d.manifest.sources() {
                    done.add_partition(topic, *p);
                }
            }
        }
        if renew {
            // A new pair is created at the next try.
            self.restore_consumer = None;
        }
        if done.count() > 0 {
            consumer
                .resume(&done)
                .map_err(|e| StreamError::kafka("resuming restored partitions", e))?;
            wake_fetchers(consumer, &done);
        }
        Ok(())
    }

    /// Whether anything is processed and not committed yet: an open
    /// transaction, a commit in flight, or records processed meanwhile.
    fn busy(&self) -> bool {
        self.in_txn || self.deferred || self.in_flight.is_some()
    }

    /// Begins a transaction if none is open; while a commit is in flight,
    /// marks the records that follow as the next transaction's (it begins
    /// when the commit returns).
    fn ensure_txn(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        if self.in_txn || self.deferred {
            return Ok(());
        }
        // The generation this transaction's records are read under: its
        // offsets go with it, so that a transaction across a rebalance can
        // never commit (the coordinator refuses the old generation), even
        // when the worker commits before it has served the rebalance's
        // callbacks.
        self.txn_group = consumer.group_metadata();
        self.txn_started = Instant::now();
        if self.in_flight.is_some() {
            self.deferred = true;
            return Ok(());
        }
        self.begin()
    }

    /// Waits for the producer's `init_transactions` (started with the
    /// session): the crashed incarnation's transaction is aborted, so the
    /// committed offsets are stable and the changelogs' ends final.
    fn producer_ready(&mut self) -> Result<(), StreamError> {
        let Some(init) = self.producer_init.take() else {
            return Ok(());
        };
        init.recv().unwrap_or_else(|_| {
            Err(StreamError::Restart(
                "the producer's init thread ended without an outcome".to_owned(),
            ))
        })
    }

    fn begin(&mut self) -> Result<(), StreamError> {
        self.producer_ready()?;
        if self.d.exactly_once() {
            self.producer
                .begin_transaction()
                .map_err(|e| StreamError::Restart(format!("begin_transaction: {e}")))?;
        }
        self.in_txn = true;
        Ok(())
    }

    /// The task's source topics in the order a timestamp tie is broken:
    /// tables first (a record sees the table as of its own time, that
    /// instant included), then the inputs.
    fn source_order(&self) -> Vec<&str> {
        let m = &self.d.manifest;
        m.tables
            .iter()
            .map(|(_, t)| t.as_str())
            .chain(m.inputs.iter().map(String::as_str))
            .collect()
    }

    /// Runs a polled batch through the tasks and produces their outputs
    /// inside the open transaction. A task with one source topic takes its
    /// records as polled; one with more takes them in timestamp order
    /// across its topics, holding back what may not go yet
    /// ([`Core::take_ready`]).
    fn process(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        batch: Vec<InputRecord>,
    ) -> Result<(), StreamError> {
        let ready = if self.d.manifest.sources().len() == 1 {
            let mut by_partition: BTreeMap<i32, Vec<InputRecord>> = BTreeMap::new();
            for r in batch {
                by_partition.entry(r.partition).or_default().push(r);
            }
            by_partition
        } else {
            self.queue(batch);
            self.take_ready(consumer)
        };
        let aborts = self.aborts;
        for (partition, records) in ready {
            self.process_task(consumer, partition, records)?;
            if self.aborts != aborts {
                // A commit failed and the input was rewound: the rest of
                // the batch is read again.
                return Ok(());
            }
        }
        Ok(())
    }

    /// Queues a polled batch by task and topic.
    fn queue(&mut self, batch: Vec<InputRecord>) {
        let order: Vec<String> = self.source_order().into_iter().map(str::to_owned).collect();
        for r in batch {
            if !self.tasks.contains_key(&r.partition) {
                continue;
            }
            let Some(rank) = order.iter().position(|t| t.as_str() == &*r.topic) else {
                continue;
            };
            let q = self.queued.entry(r.partition).or_insert_with(|| Queued {
                queues: (0..order.len()).map(|_| VecDeque::new()).collect(),
                waiting_since: None,
                stable_check: None,
                gave_up: false,
            });
            q.queues[rank].push_back(r);
        }
    }

    /// Takes from each task's queues the records it may process now, in
    /// timestamp order across its topics (on a tie, the topic first in
    /// [`Core::source_order`]; a topic's records keep their offset order
    /// even when their timestamps go back). While one of the task's topics
    /// has nothing queued, the task goes on only if that topic's partition
    /// is read to its end; else it waits for the records to come, at most
    /// [`MAX_SOURCE_WAIT`].
    fn take_ready(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> BTreeMap<i32, Vec<InputRecord>> {
        let order: Vec<String> = self.source_order().into_iter().map(str::to_owned).collect();
        let mut positions: Option<TopicPartitionList> = None;
        let mut ready = BTreeMap::new();
        let read_from = &self.read_from;
        for (&partition, q) in self.queued.iter_mut() {
            let taken = q.take(|empty, q| {
                let at = Position {
                    consumer,
                    partition,
                    positions: &mut positions,
                    read_from,
                };
                may_go_without(at, &order, empty, q)
            });
            if !taken.is_empty() {
                ready.insert(partition, taken);
            }
        }
        self.queued
            .retain(|_, q| q.queues.iter().any(|x| !x.is_empty()));
        ready
    }

    /// Runs one task's records through its guest, in the open transaction.
    /// A transaction open for half the transaction timeout is committed
    /// before the next guest call, and the records go on in a new one.
    ///
    /// The task stops early when its outputs and state writes fill the
    /// room left in the deployment's and the tenant's memory budgets
    /// (`memory.rs`); the transaction then commits and the rest goes
    /// on in the next: a batch whose effects would not fit is committed in
    /// parts.
    fn process_task(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        partition: i32,
        records: Vec<InputRecord>,
    ) -> Result<(), StreamError> {
        let aborts = self.aborts;
        let mut from = 0;
        while from < records.len() {
            from += self.process_part(consumer, partition, &records[from..])?;
            if self.aborts != aborts {
                return Ok(());
            }
            if !self.hold() {
                tracing::debug!(
                    worker = self.worker,
                    held = self.memory.bytes(),
                    "over the memory budget: committing the batch's part done"
                );
                Metrics::add(&self.d.metrics.memory_commits, 1);
                self.commit(consumer)?;
                if self.aborts != aborts {
                    return Ok(());
                }
                self.hold();
            }
        }
        Ok(())
    }

    /// Counts what the worker holds until its commits (outputs of the open
    /// transaction, held or sent, those of the commit in flight, the
    /// tasks' state changes) against its budgets: false when over one.
    fn hold(&mut self) -> bool {
        let in_flight = self
            .in_flight
            .as_ref()
            .map_or(0, |f| f.pending.output_bytes);
        let state: u64 = self.tasks.values().map(Task::held_bytes).sum();
        self.memory
            .set(self.pending.output_bytes + in_flight + state)
    }

    /// [`Core::process_task`] until the memory budgets' room runs out: how
    /// many of `records` it finished (all of them, or dropped, unless it
    /// stopped early; at least one).
    fn process_part(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        partition: i32,
        records: &[InputRecord],
    ) -> Result<usize, StreamError> {
        if !self.tasks.contains_key(&partition) {
            // Fetched before a revoke took the partition away: not ours
            // to process; the new owner reads it from the committed
            // offset.
            tracing::debug!(
                partition,
                "dropping records of a partition no longer assigned"
            );
            return Ok(records.len());
        }
        // A call is at most limits.timeout-ms, which is at most the
        // transaction timeout (checked at start); the broker's clock starts
        // with the transaction's first record, after the first call.
        let budget = self.d.options.transaction_timeout / 2;
        if (self.in_txn || self.deferred) && self.txn_started.elapsed() >= budget {
            let aborts = self.aborts;
            self.commit(consumer)?;
            if self.aborts != aborts {
                return Ok(records.len());
            }
        }
        self.ensure_txn(consumer)?;
        let task = self.tasks.get_mut(&partition).expect("checked above");
        // Outputs wait in `outcome` until the part returns, then go to the
        // producer (which copies them): parts of at most one call's bytes
        // keep the two copies small.
        let mut outcome = BatchOutcome {
            room: Some(self.memory.room().min(crate::task::MAX_CALL_BYTES)),
            ..BatchOutcome::default()
        };
        let called = Instant::now();
        let result = task.process_batch(records, &mut outcome);
        let outputs = outcome.outputs.len() as u64;
        // The tenant's CPU share is charged inside the calls, which park
        // while it is spent (sandbox/clock.rs, `stream::run`).
        let parked = task.take_parked();
        Metrics::add(&self.d.metrics.throttled_us, parked.as_micros() as u64);
        Metrics::add(
            &self.d.metrics.call_us,
            called.elapsed().saturating_sub(parked).as_micros() as u64,
        );
        let fuel = task.take_fuel_used();
        Metrics::add(&self.d.metrics.fuel, fuel);
        self.pending.fuel += fuel;
        if let Err(e) = result {
            return Err(self.fail_batch(e));
        }
        // The records it finished: the rest is for the next part.
        debug_assert!(outcome.full || outcome.done == records.len());
        let records = if outcome.full {
            &records[..outcome.done]
        } else {
            records
        };
        if self.deferred {
            // A commit is in flight: the outputs wait for the next
            // transaction.
            for o in outcome.outputs.drain(..) {
                self.pending.output_bytes += o.size() as u64;
                self.held.push(o);
            }
        } else {
            for o in &outcome.outputs {
                if let Err(e) = kafka::send_output(&self.producer, o) {
                    return self
                        .on_txn_error(consumer, "producing an output", e)
                        .map(|()| records.len());
                }
                self.pending.output_bytes += o.size() as u64;
            }
            self.producer.poll(Duration::ZERO);
        }
        // Only each source topic's last record moves its offset (records of
        // a topic are in offset order): no per-record work here.
        let sources = self.d.manifest.inputs.len() + self.d.manifest.tables.len();
        let mut seen: Vec<&str> = Vec::with_capacity(sources);
        for r in records.iter().rev() {
            if !seen.contains(&&*r.topic) {
                seen.push(&r.topic);
                self.next_offsets
                    .insert((r.topic.to_string(), r.partition), r.offset + 1);
                if seen.len() == sources {
                    break;
                }
            }
        }
        self.pending.records += records.len() as u64;
        self.pending.input_bytes += records.iter().map(|r| r.size() as u64).sum::<u64>();
        self.pending.outputs += outputs;
        self.pending.dead_lettered += outcome.dead_lettered;
        self.pending.skipped += outcome.skipped;
        self.pending.late_dropped += outcome.late_dropped;
        self.pending.punctuations += outcome.punctuations;
        if self.deferred && self.pending.output_bytes >= MAX_HELD_OUTPUT_BYTES {
            self.settle(consumer)?;
        }
        Ok(records.len())
    }

    /// The protocol, synchronously: a commit in flight returns first (and
    /// what was processed meanwhile becomes the open transaction), then the
    /// open transaction commits. Runs in the poll loop and in the rebalance
    /// callbacks.
    fn commit(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        self.settle(consumer)?;
        if !self.in_txn {
            return Ok(());
        }
        let aborts = self.aborts;
        self.start_commit(consumer)?;
        if self.aborts != aborts {
            return Ok(());
        }
        self.settle(consumer)
    }

    /// The protocol, top to bottom. Steps 1 and 1b put the state changes
    /// and the usage into the open transaction; then the tasks' changes are
    /// frozen and steps 2-4 (flush, offsets, commit: [`run_commit`]) run on
    /// a thread of their own. The worker goes on meanwhile: the next
    /// records' state writes layer over the frozen changes and their
    /// outputs wait in memory, for the next transaction, which begins when
    /// this one returns ([`Core::finish_commit`]: step 5, the frozen
    /// changes into RocksDB). If it fails, both are dropped and the input
    /// is read again from the committed offsets. at_least_once runs the
    /// steps here, without a transaction.
    fn start_commit(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        if !self.in_txn {
            return Ok(());
        }
        debug_assert!(self.in_flight.is_none(), "one commit in flight at a time");
        let started = Instant::now();

        // 1. Every dirty key's latest value (or tombstone) to its store's
        //    changelog, in the same partition as the task's input.
        for task in self.tasks.values() {
            for changes in task.pending_changes() {
                let topic = self.changelog_of(&changes.store);
                for (key, value) in &changes.changes {
                    let record = kafka::Outgoing {
                        topic: &topic,
                        partition: Some(task.partition()),
                        key: Some(key),
                        value: value.as_deref(),
                        headers: &[],
                        timestamp: None,
                    };
                    if let Err(e) = kafka::send(&self.producer, record) {
                        return self.on_txn_error(consumer, "producing a changelog record", e);
                    }
                    self.pending.state_bytes +=
                        (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
                }
            }
        }

        // 1b. What this transaction's work used, in the same transaction
        //     (a fleet host only): committed work is counted exactly once.
        if let Some(topic) = self.d.options.usage_topic.clone() {
            self.pending.log_lines += self
                .d
                .metrics
                .unbilled_log_lines
                .swap(0, std::sync::atomic::Ordering::Relaxed);
            let usage = self.pending.usage();
            if usage != Usage::default() {
                let m = &self.d.manifest;
                let record = UsageRecord {
                    tenant: m.tenant.clone(),
                    deployment: m.name.clone(),
                    host: self.d.options.instance_id.clone(),
                    ts_ms: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as i64),
                    usage,
                    id: None,
                };
                let key = format!("{}/{}", m.tenant, m.name);
                let value = serde_json::to_vec(&record).unwrap_or_default();
                let out = kafka::Outgoing {
                    topic: &topic,
                    partition: None,
                    key: Some(key.as_bytes()),
                    value: Some(&value),
                    headers: &[],
                    timestamp: None,
                };
                if let Err(e) = kafka::send(&self.producer, out) {
                    return self.on_txn_error(consumer, "producing a usage record", e);
                }
            }
        }

        // Each input offset of a task that keeps time (window stores or
        // punctuation) carries its stream time, as Kafka Streams keeps a
        // partition's time: it commits with the offsets, so a restarted task
        // goes on from the same stream time. (Only those: with metadata on
        // the offsets, the abort after a failed record was then refused as
        // "invalid state" in hardening h06; not understood yet.)
        let offsets = kafka::offsets_list(&self.next_offsets);
        for elem in offsets.elements().iter_mut() {
            if let Some(time) = self
                .tasks
                .get(&elem.partition())
                .filter(|t| t.keeps_time())
                .and_then(Task::stream_time)
            {
                elem.set_metadata(stream_time_metadata(time));
            }
        }
        let group = if self.d.exactly_once() {
            // The offsets go with the consumer's group metadata: the group
            // coordinator refuses them if this member's generation is stale
            // (a zombie whose partitions moved), and the transaction cannot
            // commit.
            let Some(metadata) = self.txn_group.take() else {
                return Err(StreamError::Restart(
                    "no consumer group metadata".to_owned(),
                ));
            };
            Some(metadata)
        } else {
            None
        };
        for task in self.tasks.values_mut() {
            task.freeze();
        }
        self.in_txn = false;
        let (tx, done) = std::sync::mpsc::channel();
        let flight = InFlight {
            done,
            started,
            offsets: std::mem::take(&mut self.next_offsets),
            pending: std::mem::take(&mut self.pending),
        };
        if group.is_none() {
            // at_least_once: flush here, then the consumer commits.
            let mut outcome = run_commit(&self.producer, offsets.clone(), None)?;
            if matches!(outcome, CommitOutcome::Committed { .. })
                && offsets.count() > 0
                && let Err(e) = consumer.commit(&offsets, CommitMode::Sync)
            {
                outcome = CommitOutcome::Commit(e);
            }
            return self.finish_commit(consumer, flight, outcome, true);
        }
        let producer = Arc::clone(&self.producer);
        std::thread::Builder::new()
            .name("onceflow-commit".to_owned())
            .spawn(move || {
                let _ = tx.send(run_commit(&producer, offsets, group));
            })
            .map_err(|e| StreamError::Restart(format!("cannot start a commit thread: {e}")))?;
        self.in_flight = Some(flight);
        Ok(())
    }

    /// Acts on the commit in flight if it has returned (the loop asks every
    /// round).
    fn poll_commit(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        let Some(outcome) = self.in_flight.as_ref().and_then(InFlight::try_outcome) else {
            return Ok(());
        };
        let flight = self.in_flight.take().expect("checked above");
        self.finish_commit(consumer, flight, outcome?, true)
    }

    /// Waits for the commit in flight, if any, and acts on its outcome.
    fn settle(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(());
        };
        let outcome = flight.wait()?;
        self.finish_commit(consumer, flight, outcome, true)
    }

    /// A commit returned. Committed: step 5, then (`go_on`) the next
    /// transaction begins with the outputs held meanwhile. Failed: the
    /// transaction is aborted (it is still the producer's open one), and
    /// with it whatever was processed since.
    fn finish_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        flight: InFlight,
        outcome: CommitOutcome,
        go_on: bool,
    ) -> Result<(), StreamError> {
        let changelog_offsets = match outcome {
            CommitOutcome::Committed { changelog_offsets } => changelog_offsets,
            failed => {
                if self.deferred {
                    tracing::info!(
                        worker = self.worker,
                        records = self.pending.records,
                        "a commit failed with records processed behind it: they are dropped \
                         with it and read again"
                    );
                }
                self.in_txn = true;
                self.pending.fuel += flight.pending.fuel;
                self.pending.log_lines += flight.pending.log_lines;
                return match failed {
                    CommitOutcome::Committed { .. } => unreachable!("matched above"),
                    CommitOutcome::Flush(e) => self.on_txn_error(consumer, "flushing", e),
                    CommitOutcome::Undelivered { count, code, first } => {
                        self.on_undelivered(consumer, count, code, first)
                    }
                    CommitOutcome::Offsets(e) => {
                        self.on_txn_error(consumer, "send_offsets_to_transaction", e)
                    }
                    CommitOutcome::Commit(e) if !self.d.exactly_once() => {
                        Err(StreamError::Restart(format!("committing offsets: {e}")))
                    }
                    CommitOutcome::Commit(e) if kafka::is_fencing(&e) => {
                        self.on_txn_error(consumer, "commit_transaction", e)
                    }
                    // Whatever librdkafka calls it, the outcome of an EndTxn
                    // that failed is not known here: it may have committed.
                    CommitOutcome::Commit(e) => {
                        self.abort_unknown(consumer, &format!("commit_transaction: {e}"))
                    }
                };
            }
        };

        // 5. Committed: now, and only now, the frozen changes go to
        //    RocksDB, with the changelog positions in the same write batch.
        for task in self.tasks.values_mut() {
            let p = task.partition();
            let changelogs = self.d.changelogs.iter().filter_map(|(store, topic)| {
                changelog_offsets
                    .get(&(topic.clone(), p))
                    .map(|last| (store.clone(), last + 1))
            });
            // A table's position is its topic's next offset.
            let tables = self.d.manifest.tables.iter().filter_map(|(store, topic)| {
                flight
                    .offsets
                    .get(&(topic.clone(), p))
                    .map(|next| (store.clone(), *next))
            });
            let positions: Vec<(String, i64)> = changelogs.chain(tables).collect();
            task.apply_committed(positions).map_err(StreamError::Task)?;
        }
        let m = &self.d.metrics;
        let p = flight.pending;
        Metrics::add(&m.records, p.records);
        Metrics::add(&m.outputs, p.outputs);
        Metrics::add(&m.dead_lettered, p.dead_lettered);
        Metrics::add(&m.skipped, p.skipped);
        Metrics::add(&m.late_dropped, p.late_dropped);
        Metrics::add(&m.punctuations, p.punctuations);
        Metrics::add(&m.bytes_in, p.input_bytes);
        Metrics::add(&m.bytes_out, p.output_bytes);
        Metrics::add(&m.state_bytes, p.state_bytes);
        Metrics::add(&m.commits, 1);
        let took = flight.started.elapsed();
        m.commit_latency(took);
        tracing::debug!(
            worker = self.worker,
            records = p.records,
            outputs = p.outputs,
            ms = took.as_millis() as u64,
            "transaction committed"
        );

        if go_on && self.deferred {
            // What was processed during the commit: its transaction.
            self.deferred = false;
            self.begin()?;
            for o in std::mem::take(&mut self.held) {
                if let Err(e) = kafka::send_output(&self.producer, &o) {
                    return self.on_txn_error(consumer, "producing an output", e);
                }
            }
        }
        Ok(())
    }

    /// Records of the transaction were not delivered.
    fn on_undelivered(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    ) -> Result<(), StreamError> {
        if let Some(code) = code.filter(|c| kafka::is_authorization(*c)) {
            let _ = self.abort(None);
            return Err(refused(&self.d, self.worker, code, Some(&first.topic)));
        }
        let first = first.message;
        if let Some(code) = code.filter(|c| is_unsendable(*c)) {
            // Retrying cannot help: the same record would be refused
            // again, forever.
            let _ = self.abort(None);
            return Err(StreamError::Unsendable {
                message: format!("{first}: {code}"),
            });
        }
        tracing::warn!("{count} records failed delivery (first: {first}); aborting");
        if code.is_some_and(is_timeout) {
            // A produce request whose outcome is unknown may still land:
            // only a new producer epoch keeps it out of later
            // transactions.
            return self.abort_unknown(consumer, "a delivery timed out");
        }
        self.abort(Some(consumer))
    }

    /// Acts on a failed Kafka call inside the transaction.
    fn on_txn_error(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        operation: &str,
        e: KafkaError,
    ) -> Result<(), StreamError> {
        if let Some(code) = kafka::authorization_failure(&e) {
            let _ = self.abort(None);
            return Err(refused(&self.d, self.worker, code, None));
        }
        if kafka::is_fencing(&e) {
            Metrics::add(&self.d.metrics.fenced, 1);
            tracing::warn!(worker = self.worker, "{operation}: fenced: {e}");
            return Err(StreamError::Restart(format!("{operation}: fenced: {e}")));
        }
        if let Some(code) = e.rdkafka_error_code().filter(|c| is_unsendable(*c)) {
            let _ = self.abort(None);
            return Err(StreamError::Unsendable {
                message: format!("{operation}: {e}: {code}"),
            });
        }
        if !self.d.exactly_once() {
            return Err(StreamError::Restart(format!("{operation}: {e}")));
        }
        if kafka::is_stale_generation(&e) {
            // A rebalance began while this transaction was open (its offsets
            // carry the old generation), or the member's session expired.
            // Abort and read the input again from the committed offsets; the
            // producer and the consumer stay, and the consumer rejoins by
            // itself (a new consumer under the same static id would get its
            // old assignment back without a rebalance, and a partition
            // revoked meanwhile would be owned by nobody).
            tracing::info!(
                worker = self.worker,
                "{operation}: {e}: the group is rebalancing; aborting and rewinding"
            );
            return self.abort(Some(consumer));
        }
        if e.rdkafka_error_code().is_some_and(is_timeout) {
            return self.abort_unknown(consumer, &format!("{operation}: {e}"));
        }
        if let KafkaError::MessageProduction(_) = e {
            // The producer refused a record (its transaction is in an
            // abortable state after an earlier failure): nothing of this
            // transaction can commit; abort it (a failing abort ends the
            // session).
            tracing::warn!(
                worker = self.worker,
                "{operation}: {e}; aborting the transaction"
            );
            return self.abort(Some(consumer));
        }
        match kafka::classify(&e) {
            TxnFailure::Abort => {
                tracing::warn!(
                    worker = self.worker,
                    "{operation}: {e}; aborting the transaction"
                );
                self.abort(Some(consumer))
            }
            _ => Err(StreamError::Restart(format!("{operation}: {e}"))),
        }
    }

    /// Aborts after an error whose outcome is unknown (a timed-out request,
    /// a failed EndTxn): the producer is replaced, so that a late request of
    /// this transaction can never join a later one (librdkafka 2.12 does
    /// not speak transaction version 2, KIP-890), and every task restores
    /// its stores from the changelogs, which hold this transaction's state
    /// changes if it committed after all.
    fn abort_unknown(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        why: &str,
    ) -> Result<(), StreamError> {
        tracing::warn!(
            worker = self.worker,
            "{why}: the transaction's outcome is unknown; aborting, re-creating the producer \
             and restoring the stores from their changelogs"
        );
        // No abort_transaction first (it may fail: the transaction may be
        // complete): the new producer's init_transactions aborts it, or
        // waits for its commit, either way. The worker forgets it all the
        // same (before, a failed abort left it "open" on the new producer,
        // whose next record was refused with "Erroneous state").
        self.replace_producer()?;
        self.forget_txn();
        self.reload(consumer)?;
        if self.in_callback {
            self.rewind_pending = true;
            return Ok(());
        }
        self.rewind(consumer)
    }

    /// After a rebalance, every task this worker keeps catches up with its
    /// changelog and its committed offset before it processes anything
    /// more: if this member was out of the group for a while without
    /// knowing it, another member may have processed (and committed) its
    /// partitions meanwhile. Usually there is nothing to restore (a
    /// watermark check per task).
    fn resync_after_rebalance(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        self.reload(consumer)?;
        self.rewind_pending = true;
        Ok(())
    }

    /// Every task restores its stores again (from the position of its
    /// committed store) before it processes anything more.
    fn reload(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        let mut pause = TopicPartitionList::new();
        for p in self.tasks.keys() {
            self.restoring.insert(*p);
            for topic in self.d.manifest.sources() {
                pause.add_partition(topic, *p);
            }
        }
        if pause.count() > 0 {
            consumer
                .pause(&pause)
                .map_err(|e| StreamError::kafka("pausing partitions to restore", e))?;
        }
        Ok(())
    }

    /// Aborts the open transaction: pending state dropped, guests replaced,
    /// and (given the consumer) the input rewound to the committed offsets.
    fn abort(&mut self, consumer: Option<&BaseConsumer<WorkerContext>>) -> Result<(), StreamError> {
        if let Some(flight) = self.in_flight.take() {
            // Never under a commit in flight: it ends first. Committed, it
            // stays (step 5 runs); failed, it is handled as any failed
            // commit, which aborts what came after it too. Without a
            // consumer the session ends: a failed one is aborted below, and
            // a committed one's stores catch up from their changelogs when
            // the tasks open again.
            let outcome = flight.wait()?;
            match consumer {
                Some(consumer) => {
                    let aborts = self.aborts;
                    self.finish_commit(consumer, flight, outcome, false)?;
                    if self.aborts != aborts {
                        return Ok(());
                    }
                }
                None => {
                    if !matches!(outcome, CommitOutcome::Committed { .. }) {
                        self.in_txn = true;
                    }
                }
            }
        }
        if self.d.exactly_once() && self.in_txn {
            // librdkafka's abort waits until every outstanding record's
            // delivery report is served, and on this thread nobody would
            // serve them while it waits: purge and serve them first.
            self.producer
                .purge(PurgeConfig::default().queue().inflight());
            let _ = kafka::drain(&self.producer, Duration::from_secs(5));
            if let Err(e) = self.producer.abort_transaction(TXN_CALL_TIMEOUT) {
                // The coordinator may have aborted it already (a
                // transaction past its timeout: "invalid state", or the
                // epoch bumped: "fenced"). A new
                // producer's init_transactions aborts it in any case, and
                // the consumer keeps its membership: restarting the session
                // here (as before) rejoined as the same static member in
                // the middle of a cooperative rebalance, and partitions
                // revoked in its first round were then owned by nobody
                // (seen in the network-fault drill: 2 of 6 partitions
                // stranded).
                tracing::info!(
                    worker = self.worker,
                    "abort_transaction: {e}; replacing the producer instead"
                );
                self.replace_producer()?;
            }
        }
        self.forget_txn();
        let Some(consumer) = consumer else {
            return Ok(());
        };
        if self.in_callback {
            // Seeking inside a rebalance callback is not allowed: the loop
            // rewinds right after the poll returns.
            self.rewind_pending = true;
            return Ok(());
        }
        self.rewind(consumer)
    }

    /// A new producer with the same transactional id: its
    /// `init_transactions` fences the old one (a new epoch) and resolves its
    /// transaction; the old one's queued and in-flight records are purged.
    fn replace_producer(&mut self) -> Result<(), StreamError> {
        let fresh = new_producer(&self.d, self.worker)?;
        let old = std::mem::replace(&mut self.producer, fresh);
        old.purge(PurgeConfig::default().queue().inflight());
        Ok(())
    }

    /// Drops the open transaction's state in the worker (pending state,
    /// offsets, counts, delivery reports), once the producer's side is
    /// aborted or the producer replaced.
    fn forget_txn(&mut self) {
        Metrics::add(&self.d.metrics.aborts, 1);
        self.aborts += 1;
        for task in self.tasks.values_mut() {
            task.abort();
        }
        self.in_txn = false;
        self.deferred = false;
        self.held.clear();
        self.txn_group = None;
        self.next_offsets.clear();
        self.pending = self.pending.carried();
        *self.producer.context().deliveries() = Deliveries::default();
    }

    /// Seeks every assigned partition back to its committed offset.
    fn rewind(&mut self, consumer: &BaseConsumer<WorkerContext>) -> Result<(), StreamError> {
        self.rewind_pending = false;
        // Polled and not processed: read again from the committed offsets.
        self.queued.clear();
        let assignment = consumer
            .assignment()
            .map_err(|e| StreamError::Restart(format!("reading the assignment: {e}")))?;
        if assignment.count() == 0 {
            return Ok(());
        }
        let committed = consumer
            .committed_offsets(assignment, TXN_CALL_TIMEOUT)
            .map_err(|e| StreamError::Restart(format!("reading committed offsets: {e}")))?;
        let mut rewind = TopicPartitionList::new();
        for e in committed.elements() {
            let at = (e.topic().to_owned(), e.partition());
            let offset = match e.offset() {
                Offset::Offset(o) => {
                    self.read_from.insert(at, o);
                    Offset::Offset(o)
                }
                _ => {
                    self.read_from.remove(&at);
                    Offset::Beginning
                }
            };
            let _ = rewind.add_partition_offset(e.topic(), e.partition(), offset);
        }
        consumer
            .seek_partitions(rewind, TXN_CALL_TIMEOUT)
            .map_err(|e| StreamError::Restart(format!("rewinding: {e}")))?;
        Ok(())
    }

    fn fail_batch(&mut self, e: TaskError) -> StreamError {
        // Whatever happens next, nothing of this transaction may commit:
        // some of the batch's state changes are in the tasks' transaction
        // layers without their outputs.
        if let Err(abort_error) = self.abort(None) {
            tracing::warn!("{abort_error}");
        }
        match e {
            TaskError::RecordFailed { .. }
            | TaskError::Punctuate { .. }
            | TaskError::Table { .. } => StreamError::ProcessorFailed(e),
            other => StreamError::Task(other),
        }
    }

    fn changelog_of(&self, store: &str) -> String {
        self.d
            .changelogs
            .iter()
            .find(|(s, _)| s == store)
            .map(|(_, t)| t.clone())
            .unwrap_or_else(|| super::changelog_topic(&self.d.manifest, store))
    }
}

/// Where a worker is in its partition `partition` of each topic.
struct Position<'a> {
    consumer: &'a BaseConsumer<WorkerContext>,
    partition: i32,
    /// librdkafka's positions of the whole assignment, read once per round.
    positions: &'a mut Option<TopicPartitionList>,
    read_from: &'a HashMap<(String, i32), i64>,
}

impl Position<'_> {
    /// The next offset the consumer returns from `topic`: librdkafka's
    /// position (past the transaction markers it skipped), or, before it
    /// returned anything since the partition's restore or last rewind, the
    /// committed offset it was read from then.
    fn next(&mut self, topic: &str) -> Option<i64> {
        let consumer = self.consumer;
        let tpl = self
            .positions
            .get_or_insert_with(|| consumer.position().unwrap_or_default());
        tpl.find_partition(topic, self.partition)
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0)
            .or_else(|| {
                self.read_from
                    .get(&(topic.to_owned(), self.partition))
                    .copied()
            })
    }

    /// Whether `topic` is read up to the end of `watermarks` (an empty
    /// partition with no committed offset is).
    fn read_to(&mut self, topic: &str, watermarks: Option<(i64, i64)>) -> bool {
        match (watermarks, self.next(topic)) {
            (Some((_, end)), Some(at)) => at >= end,
            (Some((low, end)), None) => low >= end,
            (None, _) => false,
        }
    }
}

/// Whether a task may take its next record while its topics `empty` (ranks
/// in `order`) have nothing queued: each of them is read to its end, as
/// librdkafka's last fetch saw it, or (asked of the broker once the task
/// waited [`STABLE_CHECK_EVERY`]) to its last stable offset.
fn may_go_without(mut at: Position<'_>, order: &[String], empty: &[usize], q: &mut Queued) -> bool {
    let (consumer, partition) = (at.consumer, at.partition);
    if empty.iter().all(|&i| {
        let fetched = kafka::fetched_watermarks(consumer, &order[i], partition);
        at.read_to(&order[i], fetched)
    }) {
        return true;
    }
    let Some(since) = q.waiting_since else {
        return false;
    };
    if since.elapsed() < STABLE_CHECK_EVERY {
        return false;
    }
    let stale = q
        .stable_check
        .as_ref()
        .is_none_or(|(at, _)| at.elapsed() >= STABLE_CHECK_EVERY);
    if stale {
        let read: Vec<bool> = order
            .iter()
            .enumerate()
            .map(|(i, topic)| {
                empty.contains(&i) && {
                    let stable = kafka::watermarks(consumer, topic, partition).ok();
                    at.read_to(topic, stable)
                }
            })
            .collect();
        q.stable_check = Some((Instant::now(), read));
    }
    let (_, read) = q.stable_check.as_ref().expect("set above");
    empty.iter().all(|&i| read[i])
}

/// What an input offset's commit metadata says of the task's stream time.
const STREAM_TIME_METADATA: &str = "onceflow:stream-time=";

fn stream_time_metadata(time: i64) -> String {
    format!("{STREAM_TIME_METADATA}{time}")
}

/// The stream time in a committed offset's metadata, if it holds one (the
/// group's offsets are written by this deployment's workers only; metadata
/// that is not UTF-8 makes rdkafka panic, which is caught here).
fn parse_stream_time_metadata(
    elem: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>,
) -> Option<i64> {
    let metadata =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| elem.metadata().to_owned()))
            .ok()?;
    metadata.strip_prefix(STREAM_TIME_METADATA)?.parse().ok()
}

/// Fences the transactional id `id` of another instance's worker (see
/// `Core::start_fencing`): `init_transactions` under it bumps its epoch and
/// aborts its open transaction.
fn fence(options: &super::RunOptions, worker: u32, id: &str, topic: Option<&str>) {
    let started = Instant::now();
    abort_previous_quickly(options, id, topic);
    let fenced = producer_config(options, Some(id), &format!("{id}-fence"))
        .create::<BaseProducer>()
        .map_err(|e| e.to_string())
        .and_then(|p| {
            if let Some(topic) = topic {
                connect_first(&p, topic, ABORT_PROBE_WAIT);
            }
            p.init_transactions(TXN_CALL_TIMEOUT)
                .map_err(|e| e.to_string())
        });
    match fenced {
        Ok(()) => tracing::info!(
            worker,
            transactional_id = %id,
            ms = started.elapsed().as_millis() as u64,
            "fenced a departed instance's worker (its open transaction is aborted)"
        ),
        Err(e) => tracing::info!(
            worker,
            transactional_id = %id,
            "could not fence a departed instance's worker ({e}); waiting for its \
             transaction to time out"
        ),
    }
}

/// How long each of [`abort_previous_quickly`]'s probes waits for its
/// answer, and how long it goes on probing at most.
const ABORT_PROBE_WAIT: Duration = Duration::from_millis(150);
const ABORT_PROBE_BUDGET: Duration = Duration::from_secs(3);

/// Waits until the open transaction of `transactional_id`'s previous
/// incarnation (crashed, or a departed host's worker) is aborted, so that
/// the `init_transactions` that follows succeeds at its first request.
///
/// An `InitProducerId` that meets an open transaction makes the
/// coordinator abort it and answers CONCURRENT_TRANSACTIONS until the abort
/// is complete (its markers written: a few milliseconds to most of a second
/// on a busy broker); librdkafka asks again only after a fixed 500 ms
/// (`rd_kafka_idemp_pid_timer_restart`, not configurable), so a restart
/// would pay 0.5 s for every answer that came too early (0, 1 or 2 of them
/// in the recovery benchmark: results/2026-12-05-recovery.md). Instead,
/// throwaway producers ask, one after another, each dropped after
/// [`ABORT_PROBE_WAIT`] unless it got its producer id (the abort is done,
/// or nothing was open), for at most [`ABORT_PROBE_BUDGET`]; an answer the
/// probes cannot help with (not authorized, say) ends them at once and
/// the real `init_transactions` reports it. Fencing is unchanged: every
/// successful `InitProducerId` bumps the epoch, and the caller's comes last.
/// (Were a probe's request still in flight when it is dropped and handled
/// after the caller's, the caller's producer would be fenced by it: its
/// next transactional call fails, and the worker starts a new session, as
/// for any fencing.)
fn abort_previous_quickly(
    options: &super::RunOptions,
    transactional_id: &str,
    topic: Option<&str>,
) {
    let started = Instant::now();
    let mut probes = 0;
    let outcome = loop {
        let probe = match producer_config(
            options,
            Some(transactional_id),
            &format!("{transactional_id}-probe"),
        )
        .create::<BaseProducer>()
        {
            Ok(p) => p,
            Err(e) => break Err(e),
        };
        probes += 1;
        if let Some(topic) = topic {
            connect_first(&probe, topic, ABORT_PROBE_WAIT);
        }
        let outcome = probe.init_transactions(ABORT_PROBE_WAIT);
        drop(probe);
        match outcome {
            // A timeout, or CONCURRENT_TRANSACTIONS: the abort goes on.
            Err(KafkaError::Transaction(e))
                if e.is_retriable() && started.elapsed() < ABORT_PROBE_BUDGET => {}
            outcome => break outcome,
        }
    };
    tracing::debug!(
        transactional_id,
        probes,
        ms = started.elapsed().as_millis() as u64,
        // Ok: no transaction open (any more).
        outcome = ?outcome.err(),
        "abort probes"
    );
}

/// Connects a new producer to a broker (a metadata request for `topic`, one
/// of the deployment's, waited for at most `timeout`) before its
/// `init_transactions`. A producer connects only when it has something to
/// send, and `init_transactions` called with no broker connection up finds
/// no broker to ask for the transaction coordinator: it asks again on
/// librdkafka's 500 ms coordinator-query timer (seen in the recovery
/// benchmark: the real `init_transactions` returning 0.5 s after probes
/// that had found the abort done). A failure here is left to
/// `init_transactions` to report.
fn connect_first<C: ProducerContext>(producer: &BaseProducer<C>, topic: &str, timeout: Duration) {
    if let Err(e) = producer.client().fetch_metadata(Some(topic), timeout) {
        tracing::debug!(topic, "no broker connection before init_transactions: {e}");
    }
}

/// Databases a worker opens at once (see `Core::open_tasks`).
const PARALLEL_OPENS: usize = 8;

/// Opens `partition`'s local stores, taking them from a standby that kept
/// them warm (the restore then reads only the changelog's tail past it).
/// Stores last written longer ago than the changelogs'
/// `delete.retention.ms` are removed first: compaction may have dropped a
/// tombstone they never saw. The caller holds `open_tasks`.
fn open_store(d: &Deployment, partition: i32) -> Result<RocksPartition, StreamError> {
    let path = d.store_dir(partition);
    if d.standbys.release(partition) {
        tracing::info!(partition, "taking over the partition's standby stores");
    }
    if let Some(age) = last_written(&path).and_then(|t| t.elapsed().ok())
        && age > d.trust_horizon
    {
        tracing::warn!(
            partition,
            dir = %path.display(),
            "the local stores were last written {} h ago, longer than the changelogs' \
             delete.retention.ms ({} h): removing them and restoring in full",
            age.as_secs() / 3600,
            d.trust_horizon.as_secs() / 3600
        );
        std::fs::remove_dir_all(&path).map_err(|e| {
            StreamError::State(crate::state::StateError::Backend {
                store: path.display().to_string(),
                message: format!("cannot remove stale local stores: {e}"),
            })
        })?;
    }
    RocksPartition::open(&path, &d.manifest.local_stores()).map_err(StreamError::State)
}

/// When anything in a task's store directory was last modified (RocksDB
/// writes its log on every write batch).
pub(super) fn last_written(dir: &std::path::Path) -> Option<std::time::SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

/// Errors that sending the same record again cannot cure.
fn is_unsendable(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
    )
}

/// Errors that leave a request's outcome unknown.
fn is_timeout(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::TimedOutQueue
    )
}

/// Calls a transactional operation again while it fails retriably, within
/// one budget of [`TXN_CALL_TIMEOUT`] for all attempts together: a timed-out
/// call resumes where it was on the next attempt, but when librdkafka has
/// lost its coordinator (librdkafka#5511) no attempt succeeds, and only a
/// new producer (a new session) finds it again.
fn retry(
    operation: &str,
    mut call: impl FnMut(Duration) -> Result<(), KafkaError>,
) -> Result<(), KafkaError> {
    let deadline = Instant::now() + TXN_CALL_TIMEOUT;
    let mut attempt = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match call(left.max(Duration::from_secs(1))) {
            Err(e)
                if kafka::classify(&e) == TxnFailure::Retry
                    && attempt < TXN_RETRIES
                    && Instant::now() < deadline =>
            {
                attempt += 1;
                tracing::warn!("{operation}: {e}; retrying (attempt {attempt})");
                std::thread::sleep(Duration::from_millis(100 << attempt).min(left));
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each topic's records keep their offset order (timestamps may go
    /// back); across topics the smaller head goes first, a tie to the topic
    /// listed first; partitions are kept apart.
    #[test]
    fn a_tasks_topics_go_in_timestamp_order_and_wait_for_unread_ones() {
        let r = |topic: &str, offset: i64, timestamp: i64| InputRecord {
            topic: topic.into(),
            partition: 0,
            offset,
            timestamp,
            key: None,
            value: None,
            headers: Vec::new(),
        };
        let queued = |records: Vec<InputRecord>| {
            let mut q = Queued {
                queues: vec![VecDeque::new(), VecDeque::new()],
                waiting_since: None,
                stable_check: None,
                gave_up: false,
            };
            for r in records {
                let rank = usize::from(&*r.topic == "payments");
                q.queues[rank].push_back(r);
            }
            q
        };
        let order = |taken: &[InputRecord]| {
            taken
                .iter()
                .map(|r| (r.topic.to_string(), r.offset))
                .collect::<Vec<_>>()
        };
        let pair = |t: &str, o: i64| (t.to_owned(), o);

        // Both topics queued: smallest timestamp first, a tie to the table,
        // a topic's offsets in order even when its timestamps go back. Once
        // the table is empty and read to its end, the payments go on.
        let mut q = queued(vec![
            r("payments", 0, 10),
            r("payments", 1, 5),
            r("payments", 2, 30),
            r("accounts", 0, 7),
            r("accounts", 1, 30),
            r("payments", 3, 40),
        ]);
        let mut asked = Vec::new();
        let taken = q.take(|empty, _| {
            asked.push(empty.to_vec());
            true
        });
        assert_eq!(
            order(&taken),
            [
                pair("accounts", 0),
                pair("payments", 0),
                pair("payments", 1),
                pair("accounts", 1),
                pair("payments", 2),
                pair("payments", 3),
            ]
        );
        assert_eq!(asked, [vec![0]], "asked once, when the table ran out");

        // The table has unread records: the payments wait for them, and
        // the task remembers since when it waits.
        let mut q = queued(vec![r("accounts", 0, 7), r("payments", 0, 10)]);
        let taken = q.take(|_, _| false);
        assert_eq!(order(&taken), [pair("accounts", 0)]);
        assert_eq!(q.queues[1].len(), 1);
        assert!(q.waiting_since.is_some());

        // Past the longest wait, it goes on without them.
        q.waiting_since = Some(Instant::now() - MAX_SOURCE_WAIT);
        let taken = q.take(|_, _| false);
        assert_eq!(order(&taken), [pair("payments", 0)]);
    }

    fn membership(report_ago: Option<u64>, connected_ago: u64, now: Instant) -> Membership {
        Membership {
            last_report: report_ago.map(|s| now - Duration::from_secs(s)),
            last_connected: now - Duration::from_secs(connected_ago),
            state: "wait-coord/init".to_owned(),
        }
    }

    #[test]
    fn a_consumer_is_judged_only_on_recent_statistics() {
        let now = Instant::now() + Duration::from_secs(3600);
        // No statistics yet, or none for a while (the loop was restoring):
        // no verdict.
        assert_eq!(coordinator_lost_for(&membership(None, 100, now), now), None);
        assert_eq!(
            coordinator_lost_for(&membership(Some(60), 100, now), now),
            None
        );
        // Recent statistics: lost from the last connected report to the
        // latest report.
        assert_eq!(
            coordinator_lost_for(&membership(Some(1), 41, now), now),
            Some(Duration::from_secs(40))
        );
        assert_eq!(
            coordinator_lost_for(&membership(Some(0), 0, now), now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn the_limit_outlasts_a_session_timeout_and_a_broker_restart() {
        assert_eq!(
            membership_limit(Duration::from_secs(10)),
            Duration::from_secs(30)
        );
        assert_eq!(
            membership_limit(Duration::from_secs(45)),
            Duration::from_secs(135)
        );
        assert_eq!(
            membership_limit(Duration::from_secs(1)),
            Duration::from_secs(30)
        );
    }
}
