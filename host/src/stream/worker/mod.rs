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
//!     commit when commit-interval-ms has passed        Core::start_commit (steps 2-4 on the committer: run_commit)
//!         or 20 batches are pending
//! }
//! ```
//!
//! The protocol: changelog records for every dirty key and the
//! transaction's usage record (on a fleet host), then the tasks' changes
//! are frozen and the session's committer thread runs flush,
//! `send_offsets_to_transaction(offsets,
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

use super::protocol::{self, AbortEnd};
use super::{Deployment, Restart, StreamError, changelog, replay};
use crate::kafka::{self, TxnFailure};
use crate::metrics::{Metrics, WorkerLoad};
use crate::state::rocks::RocksPartition;
use crate::task::{BatchOutcome, Task, TaskError};
use crate::types::{InputRecord, OutputRecord, Usage, UsageRecord, error_chain};

mod abort;
mod alignment;
mod commit;
mod committer;
mod producer;
mod rebalance;
mod restore;
mod txn;

use abort::Cause;
use alignment::*;
use committer::*;
use producer::*;
use rebalance::*;
use txn::*;

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
        if d.stopping() {
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

/// How far [`Core::process_part`] got.
#[must_use]
enum Part {
    /// This many records finished (or dropped as no longer ours).
    Done(usize),
    /// The transaction aborted and the input was rewound: the rest is read
    /// again.
    Aborted,
}

/// Counts of the open transaction, added to the metrics when it commits.
#[derive(Default)]
struct Pending {
    pub(super) records: u64,
    pub(super) outputs: u64,
    pub(super) dead_lettered: u64,
    pub(super) skipped: u64,
    pub(super) late_dropped: u64,
    pub(super) punctuations: u64,
    /// Bytes of the outputs produced (held by the producer until acked).
    pub(super) output_bytes: u64,
    /// Bytes of the input records processed.
    pub(super) input_bytes: u64,
    /// Bytes of the changelog records written at commit.
    pub(super) state_bytes: u64,
    /// Fuel and log lines taken from the deployment's ledger
    /// (`Metrics::unbilled_fuel`, `unbilled_log_lines`) into the usage
    /// record (step 1b): what the guest burned since the last record, this
    /// transaction's records and aborted attempts' alike. Given back if the
    /// transaction does not commit ([`Core::forget_txn`]).
    pub(super) fuel: u64,
    pub(super) log_lines: u64,
}

impl Pending {
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
/// How long a worker that hands its partitions over waits for the revoke
/// (see [`Session::hand_over`]); then it closes all the same.
const HAND_OVER_WAIT: Duration = Duration::from_secs(10);

/// Outputs of records processed while a commit is in flight wait in memory
/// up to this many bytes; past it the worker waits for the commit.
const MAX_HELD_OUTPUT_BYTES: u64 = 32 << 20;

/// What the poll loop and the rebalance callbacks share.
struct Core {
    pub(super) d: Arc<Deployment>,
    pub(super) worker: u32,
    pub(super) producer: Arc<BaseProducer<ProducerCtx>>,
    /// The session's committer thread (steps 2-4 of each transaction).
    pub(super) committer: Committer,
    /// The producer's `init_transactions`, running on a thread of its own
    /// until the worker first needs the producer.
    pub(super) producer_init: Option<std::sync::mpsc::Receiver<Result<(), StreamError>>>,
    pub(super) tasks: BTreeMap<i32, Task>,
    /// Assigned partitions whose stores are not restored yet (paused).
    pub(super) restoring: BTreeSet<i32>,
    /// The transaction: idle, open, or committing with the next one
    /// behind it (`txn.rs`; pipelined commits, see [`Core::start_commit`]).
    pub(super) txn: Txn,
    /// An error raised inside a rebalance callback, for the loop to act on.
    pub(super) failure: Option<StreamError>,
    /// Inside a rebalance callback: an abort cannot rewind there, so it
    /// ends the session instead.
    pub(super) in_callback: bool,
    /// Partitions revoked since the last poll batch began: records of the
    /// batch from them are not ours any more (even if reassigned since, the
    /// consumer reads them again from the committed offset).
    pub(super) revoked_during_poll: BTreeSet<i32>,
    /// The open transaction was aborted inside a rebalance callback (where
    /// seeking is not allowed): the loop rewinds the partitions it keeps to
    /// the committed offsets before it processes anything else.
    pub(super) rewind_pending: bool,
    /// When each restoring partition's restore began failing (brokers
    /// away), for [`RESTORE_RETRY_LIMIT`].
    pub(super) restore_failing_since: BTreeMap<i32, Instant>,
    pub(super) restore_consumer: Option<changelog::Restorer>,
    /// Records polled and not processed yet, of tasks with more than one
    /// source topic (see [`Queued`]).
    pub(super) queued: BTreeMap<i32, Queued>,
    /// The committed offset each source partition was last read from (at
    /// its restore or a rewind): its position until the consumer returns
    /// something from it (librdkafka's position is unknown until then).
    pub(super) read_from: HashMap<(String, i32), i64>,
    /// What this worker holds in memory until its commits, against the
    /// deployment's and the tenant's budgets ([`Core::hold`]).
    pub(super) memory: crate::memory::Held,
    /// When its idle tasks were last marked in sync ([`Core::mark_idle_synced`]).
    pub(super) idle_synced: Instant,
    /// The input offsets of the commit that failed, while its transaction
    /// is aborted ([`Core::reopen_failed`]): whether it committed after
    /// all, if its outcome was unknown, is told by them.
    pub(super) failed_offsets: Option<BTreeMap<(String, i32), i64>>,
}

impl Drop for Core {
    /// The session ended: its tasks close, their databases first, then
    /// their partitions are released (as `close_task` does): released
    /// first, another worker could open a database still locked by this one
    /// (eos-audit-3 finding 13).
    fn drop(&mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        let partitions: Vec<i32> = tasks.keys().copied().collect();
        drop(tasks);
        if let Some(q) = self.d.queries() {
            let app = self.d.manifest.application_id();
            for p in &partitions {
                q.closed(&app, *p);
            }
        }
        let mut open = self.d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
        for p in &partitions {
            open.remove(p);
        }
    }
}

fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|e| e.into_inner())
}

/// One membership of the group with one producer.
struct Session {
    pub(super) d: Arc<Deployment>,
    pub(super) consumer: BaseConsumer<WorkerContext>,
    pub(super) core: Arc<Mutex<Core>>,
    pub(super) consumer_errors: u64,
    pub(super) last_error_log: Option<Instant>,
    pub(super) last_load_report: Instant,
    /// The input topics' names, shared by the records polled from them.
    pub(super) topics: kafka::TopicNames,
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
            let span = tracing::Span::current();
            std::thread::Builder::new()
                .name(format!("onceflow-init-{n}"))
                .spawn(move || {
                    let _span = span.enter();
                    // The receiver is gone only when the session ended.
                    let _ = tx.send(init_producer(&d, n, &producer));
                })
                .map_err(|e| Restart::spawn("the producer's init thread", e))?;
            Some(rx)
        } else {
            None
        };
        let committer = Committer::start(n, d.options.lose_commit_answers.clone())?;
        let core = Arc::new(Mutex::new(Core {
            d: d.clone(),
            worker: n,
            producer,
            committer,
            producer_init,
            tasks: BTreeMap::new(),
            restoring: BTreeSet::new(),
            txn: Txn::Idle,
            failure: None,
            in_callback: false,
            revoked_during_poll: BTreeSet::new(),
            rewind_pending: false,
            restore_failing_since: BTreeMap::new(),
            restore_consumer,
            idle_synced: Instant::now(),
            failed_offsets: None,
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
            unfetched: std::sync::atomic::AtomicI64::new(1),
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
            if self.d.stopping() {
                return self.shut_down();
            }
            let wait = {
                let mut core = lock(&self.core);
                core.revoked_during_poll.clear();
                match &core.txn {
                    // Back soon to see the commit return.
                    Txn::Committing { .. } => COMMIT_POLL,
                    Txn::Open(open) => interval.saturating_sub(open.started.elapsed()),
                    Txn::Idle => Duration::from_millis(100),
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
            if core.poll_commit(&self.consumer)? == Flow::Aborted {
                continue;
            }
            if !core.restoring.is_empty() {
                // Restoring takes a while: nothing may stay open meanwhile
                // (the transaction timeout runs).
                if core.commit(&self.consumer)? == Flow::Aborted {
                    continue;
                }
                core.restore_pending(&self.consumer)?;
                if core.rewind_pending {
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
            let due = match &core.txn {
                Txn::Open(open) => {
                    let open_for = open.started.elapsed();
                    (open_for >= interval && steady)
                        || open_for >= self.d.options.transaction_timeout / 2
                        || open.work.records >= 20 * max_batch as u64
                        || open.work.output_bytes >= MAX_TXN_OUTPUT_BYTES
                }
                _ => false,
            };
            if due {
                // Pipelined: the worker goes on while it commits. An abort
                // rewound the input; the next round polls again.
                let _ = core.start_commit(&self.consumer)?;
            }
            core.mark_idle_synced()?;
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
            Some(lost) if lost >= limit => Err(Restart::CoordinatorLost {
                group: self.d.manifest.application_id(),
                lost,
                state: m.state.clone(),
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// Publishes this worker's partitions and lag to the metrics.
    fn report_load(&mut self) {
        self.last_load_report = Instant::now();
        let (worker, partitions, unsettled) = {
            let core = lock(&self.core);
            let unsettled = !matches!(core.txn, Txn::Idle)
                || !core.queued.is_empty()
                || !core.restoring.is_empty()
                || core.rewind_pending;
            (core.worker, core.tasks.keys().copied().collect(), unsettled)
        };
        let context = self.consumer.context();
        let lag = context.lag.load(Ordering::Relaxed);
        let unfetched = context.unfetched.load(Ordering::Relaxed);
        self.d.metrics.worker_load(
            worker,
            WorkerLoad {
                partitions,
                lag,
                unfetched,
                unsettled: i64::from(unsettled),
                reported: Some(Instant::now()),
            },
        );
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
                Some(Err(e @ KafkaError::MessageConsumptionFatal(_))) => {
                    return Err(Restart::kafka("polling the consumer (fatal)", e));
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
        // What a transaction that did not commit took from the usage ledger
        // goes back to the deployment's, for the next session to bill.
        let producer_open = match core.txn.take_flight() {
            // Not under a commit in flight: it ends first. One that
            // committed stays committed (the stores catch up from their
            // changelogs when the tasks open again); one that failed is
            // aborted here with the rest.
            Some(Commit {
                flight,
                frozen,
                next,
            }) => {
                if let Some(next) = next {
                    core.unbill(&next.work);
                }
                match flight.wait() {
                    Ok(CommitOutcome::Committed { .. }) => false,
                    // The commit call failed or overran: it may have
                    // committed, its usage record with it (billed at most
                    // once: the host's /metrics still count it).
                    Ok(CommitOutcome::Commit(_)) | Err(_) => true,
                    Ok(_) => {
                        core.unbill(&frozen.work);
                        true
                    }
                }
            }
            None => {
                let open = !core.txn.is_idle();
                let dropped = core.txn.forget();
                core.unbill(&dropped);
                open
            }
        };
        if producer_open && self.d.exactly_once() {
            // Whatever the abort's outcome, the session ends here, and the
            // next one's producer fences this one (a new epoch).
            let clean = match protocol::after_drain(drain_in_flight(&core.producer)) {
                AbortEnd::EndTxn => end_transaction(&core.producer).is_ok(),
                AbortEnd::ReplaceProducer => false,
            };
            if !clean {
                retire(&core.producer);
            }
        }
        for task in core.tasks.values_mut() {
            task.abort();
        }
    }

    /// Clean shutdown: commit what was processed, then leave the group.
    fn shut_down(&mut self) -> Result<(), StreamError> {
        {
            let mut core = lock(&self.core);
            // Aborted instead, it is read again by the partitions' next
            // owners.
            let _ = core.commit(&self.consumer)?;
        }
        if self.d.handing_over() {
            self.hand_over();
        }
        // Dropping the consumer closes it: the revoke callback runs with no
        // open transaction and closes the tasks (their stores are up to
        // date with their changelog positions).
        tracing::info!("worker leaving the group");
        Ok(())
    }

    /// Gives the partitions to the group's other members before closing
    /// (the host drains). A static member (KIP-345) that closes sends no
    /// LeaveGroup, and its partitions would wait a session for it; one that
    /// unsubscribes first has them revoked here (the revoke callback closes
    /// the tasks, nothing being open) and then leaves, so the group
    /// rebalances them at once. Records polled meanwhile are dropped: they
    /// are past the committed offsets, where the next owner starts.
    ///
    /// Under KIP-848 (`--group-protocol consumer`) a static member's leave
    /// is temporary (epoch -2): the brokers keep its partitions until its
    /// session expires all the same (docs/operations.md, "Rolling upgrades").
    fn hand_over(&mut self) {
        let owned = |c: &BaseConsumer<WorkerContext>| c.assignment().map_or(0, |a| a.count());
        tracing::info!(
            partitions = owned(&self.consumer),
            "handing the partitions over: leaving the group"
        );
        self.consumer.unsubscribe();
        let deadline = Instant::now() + HAND_OVER_WAIT;
        while owned(&self.consumer) > 0 && Instant::now() < deadline {
            let _ = self.consumer.poll(Duration::from_millis(50));
        }
        if let Some(e) = lock(&self.core).failure.take() {
            tracing::warn!("while handing the partitions over: {}", error_chain(&e));
        }
    }
}

impl Core {
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
        for (partition, records) in ready {
            if self.process_task(consumer, partition, records)? == Flow::Aborted {
                // A commit failed and the input was rewound: the rest of
                // the batch is read again.
                return Ok(());
            }
        }
        Ok(())
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
    ) -> Result<Flow, StreamError> {
        let mut from = 0;
        while from < records.len() {
            match self.process_part(consumer, partition, &records[from..])? {
                Part::Done(n) => from += n,
                Part::Aborted => return Ok(Flow::Aborted),
            }
            if !self.hold() {
                tracing::debug!(
                    worker = self.worker,
                    held = self.memory.bytes(),
                    "over the memory budget: committing the batch's part done"
                );
                Metrics::add(&self.d.metrics.memory_commits, 1);
                if self.commit(consumer)? == Flow::Aborted {
                    return Ok(Flow::Aborted);
                }
                self.hold();
            }
        }
        Ok(Flow::Go)
    }

    /// Counts what the worker holds until its commits (outputs of the open
    /// transaction, held or sent, those of the commit in flight, the
    /// tasks' state changes) against its budgets: false when over one.
    fn hold(&mut self) -> bool {
        let state: u64 = self.tasks.values().map(Task::held_bytes).sum();
        self.memory.set(output_bytes(&self.txn) + state)
    }

    /// [`Core::process_task`] until the memory budgets' room runs out: how
    /// many of `records` it finished (all of them, or dropped, unless it
    /// stopped early; at least one), or that the transaction aborted.
    fn process_part(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        partition: i32,
        records: &[InputRecord],
    ) -> Result<Part, StreamError> {
        if !self.tasks.contains_key(&partition) {
            // Fetched before a revoke took the partition away: not ours
            // to process; the new owner reads it from the committed
            // offset.
            tracing::debug!(
                partition,
                "dropping records of a partition no longer assigned"
            );
            return Ok(Part::Done(records.len()));
        }
        // A call is at most limits.timeout-ms, which is at most the
        // transaction timeout (checked at start); the broker's clock starts
        // with the transaction's first record, after the first call.
        let budget = self.d.options.transaction_timeout / 2;
        if self
            .txn
            .current()
            .is_some_and(|open| open.started.elapsed() >= budget)
            && self.commit(consumer)? == Flow::Aborted
        {
            return Ok(Part::Aborted);
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
        Metrics::add(&self.d.metrics.unbilled_fuel, fuel);
        if let Err(e) = result {
            return Err(self.fail_batch(e));
        }
        // The records it finished: the rest is for the next part.
        debug_assert!(outcome.full || outcome.done == records.len());
        let records = &records[..outcome.done];
        self.txn.receiving().work.output_bytes += outcome.output_bytes;
        let behind_commit = self.txn.route() == Route::Hold;
        if behind_commit {
            // A commit is in flight: the outputs wait for the next
            // transaction.
            self.txn.receiving().held.append(&mut outcome.outputs);
        } else {
            for o in &outcome.outputs {
                if let Err(e) = kafka::send_output(&self.producer, o) {
                    let _aborted = self.on_txn_error(consumer, "producing an output", e)?;
                    return Ok(Part::Aborted);
                }
            }
            self.producer.poll(Duration::ZERO);
        }
        let open = self.txn.receiving();
        // Only each source topic's last record moves its offset (records of
        // a topic are in offset order): no per-record work here.
        let sources = self.d.manifest.inputs.len() + self.d.manifest.tables.len();
        let mut seen: Vec<&str> = Vec::with_capacity(sources);
        for r in records.iter().rev() {
            if !seen.contains(&&*r.topic) {
                seen.push(&r.topic);
                open.offsets
                    .insert((r.topic.to_string(), r.partition), r.offset + 1);
                if seen.len() == sources {
                    break;
                }
            }
        }
        let p = &mut open.work;
        p.records += records.len() as u64;
        p.input_bytes += records.iter().map(|r| r.size() as u64).sum::<u64>();
        p.outputs += outputs;
        p.dead_lettered += outcome.dead_lettered;
        p.skipped += outcome.skipped;
        p.late_dropped += outcome.late_dropped;
        p.punctuations += outcome.punctuations;
        if behind_commit
            && p.output_bytes >= MAX_HELD_OUTPUT_BYTES
            && self.settle(consumer)? == Flow::Aborted
        {
            return Ok(Part::Aborted);
        }
        Ok(Part::Done(records.len()))
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
            TaskError::SchemaRegistry(why) => StreamError::SchemaRegistry(why),
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
