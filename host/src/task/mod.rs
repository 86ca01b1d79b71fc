//! A task: one input partition's guest instance and state, and the rule that
//! turns a failing record into exactly one error-policy action.
//!
//! A batch goes to the guest in one `process` call. If the call fails, its
//! effects are dropped (state call layer, outputs) and the batch is split
//! around the record to blame: the one the processor named (a returned error
//! with an index, or the record it announced with `begin-record` before it
//! trapped), else the halves of the batch. A record is poison only when it
//! fails alone; the records before and after it are processed normally. So
//! a batch with one bad record costs a few extra calls, never a lost or
//! doubled effect. Any failed call drops the instance; the next call gets a
//! fresh one, so a re-run record never meets memory that saw it.
//!
//! Used by the offline runner and by the EOS loop, which adds the commit.

use std::any::Any;

use std::sync::Arc;
use std::time::Duration;

use crate::manifest::{ErrorPolicy, LateRecords, Manifest};
use crate::sandbox::{
    CallFailure, Guest, INIT_FUEL, Lineage, Processor, ProcessorPolicy, SandboxError,
};
use crate::schema::Codecs;
use crate::state::window::WindowStore;
use crate::state::{PartitionStore, StateError, StoreChanges, TaskState, WriteBatch};
use crate::types::{AccessError, Effects, Entry, InputRecord, OutputRecord};

mod dead_letter;
mod effects;
mod formats;
mod replay;
mod time;

pub use dead_letter::{dead_letter, dead_letter_headers};
use effects::TaskEffects;
pub use replay::{LoggedBatch, ReplayLog, outputs_digest};
use time::{Times, next_punctuation};

/// Largest output record (key + value + headers) accepted, in bytes.
pub const MAX_OUTPUT_BYTES: u64 = crate::types::MAX_RECORD_BYTES;

/// Most bytes of outputs and state writes one `process` call may buffer in
/// the host (`limits.memory-mb` bounds only the guest's own memory): one
/// record emitting 2,500 outputs of 1 MB took a host to 2.48 GB before.
/// Past it every emit and put of the call is refused, and the call fails
/// (a batch is split until the record to blame is alone; then its error
/// policy applies), even if the guest ignores the refusals.
pub const MAX_CALL_BYTES: u64 = 64 << 20;

/// Most records one `process` call gets: a batch is handed over in calls of
/// this many. The records after a failing one go to the guest again in a
/// call of their own (lowered into its memory again); past a few dozen
/// records per call, the per-call cost no longer shows.
pub const MAX_CALL_RECORDS: usize = 64;

/// How a task handles failures, from the manifest.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// `tenant.name`, for dead-letter headers and messages.
    pub application_id: String,
    /// The error policy.
    pub policy: ErrorPolicy,
    /// Output alias -> topic (shared by every output to it).
    pub outputs: Vec<(String, Arc<str>)>,
    /// State store names (key-value and window stores).
    pub stores: Vec<String>,
    /// The window stores among `stores`, with their retention in ms.
    pub window_stores: Vec<(String, u64)>,
    /// Tables: store -> topic. Their records come in the batches, in
    /// timestamp order with the inputs', and are written to the store by
    /// the host; their changelog is their topic.
    pub tables: Vec<(String, String)>,
    /// What to do with the records the processor reports late.
    pub late_records: LateRecords,
    /// Most bytes of keys and values the stores of one task hold together
    /// (`limits.state-mb`).
    pub state_limit_bytes: u64,
    /// How input values are decoded and output values encoded (`None`:
    /// every value is bytes as they are). Set by the runtime, which knows
    /// the schema registry.
    pub codecs: Option<Arc<Codecs>>,
}

impl TaskConfig {
    /// The task settings a manifest asks for.
    pub fn from_manifest(m: &Manifest) -> Self {
        Self {
            application_id: m.application_id(),
            policy: m.errors.clone(),
            outputs: m
                .outputs
                .iter()
                .map(|(a, t)| (a.clone(), Arc::from(t.as_str())))
                .collect(),
            stores: m.stores.clone(),
            window_stores: m
                .window_stores
                .iter()
                .map(|(name, w)| (name.clone(), w.retention_ms))
                .collect(),
            late_records: m.time.late_records,
            tables: m.tables.clone(),
            state_limit_bytes: m.limits.state_mb.saturating_mul(1 << 20),
            codecs: None,
        }
    }

    /// The same, with the deployment's formats.
    pub fn with_codecs(mut self, codecs: Option<Arc<Codecs>>) -> Self {
        self.codecs = codecs;
        self
    }
}

/// The sandbox limits and labels a manifest asks for: the one place that
/// turns `[limits]` and `[config]` into the sandbox's own terms (the sandbox
/// knows nothing of manifests).
pub fn processor_policy(m: &Manifest) -> ProcessorPolicy {
    ProcessorPolicy {
        memory_bytes: (m.limits.memory_mb as usize) << 20,
        fuel_per_record: m.limits.fuel_per_record,
        // No manifest key yet: every processor gets the sandbox's default.
        init_fuel: INIT_FUEL,
        timeout: Duration::from_millis(m.limits.timeout_ms),
        log_lines_per_second: m.limits.log_lines_per_second,
        config: m.config.clone(),
        tenant: m.tenant.clone(),
        processor: m.name.clone(),
    }
}

/// Why a batch could not be processed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A record failed under the `fail` policy.
    #[error("record {topic}/{partition}@{offset} failed and the error policy is `fail`: {reason}")]
    RecordFailed {
        /// Input topic.
        topic: String,
        /// Input partition.
        partition: i32,
        /// Input offset.
        offset: i64,
        /// Why.
        reason: String,
    },
    /// The host failed (not the record's fault): abort and retry the batch.
    #[error("host failure while processing: {0}")]
    Host(String),
    /// The schema registry could not be asked for an input's schema (not
    /// the record's fault): abort, and retry the batch later.
    #[error("{0}")]
    SchemaRegistry(String),
    /// The processor could not be instantiated.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
    /// A table's record could not be written to its store.
    #[error("table {table}: cannot apply {topic}/{partition}@{offset}: {reason}")]
    Table {
        /// The table.
        table: String,
        /// Its topic.
        topic: String,
        /// The partition.
        partition: i32,
        /// The offset.
        offset: i64,
        /// Why.
        reason: String,
    },
    /// `punctuate` failed: no record is to blame, so the deployment stops.
    #[error(
        "punctuate at stream time {stream_time} of partition {partition} failed: {reason}; fix the \
         processor and deploy it again"
    )]
    Punctuate {
        /// The task's partition.
        partition: i32,
        /// The stream time it was called for.
        stream_time: i64,
        /// Why.
        reason: String,
    },
}

/// What one batch produced.
#[derive(Debug, Default)]
pub struct BatchOutcome {
    /// Output records in emit order, dead letters in their place.
    pub outputs: Vec<OutputRecord>,
    /// Records handed to the error policy's skip.
    pub skipped: u64,
    /// Records written to the dead-letter topic.
    pub dead_lettered: u64,
    /// `process` calls made (more than one when the batch was split).
    pub calls: u64,
    /// Records the processor reported late that were dropped
    /// (`time.late-records = "drop"`).
    pub late_dropped: u64,
    /// `punctuate` calls made.
    pub punctuations: u64,
    /// Bytes of `outputs`.
    pub output_bytes: u64,
    /// How many bytes of outputs and state writes the batch may add to
    /// what the host holds before it stops early ([`Task::process_batch`]);
    /// `None`: no limit.
    pub room: Option<u64>,
    /// The batch's records finished (processed, or handed to the error
    /// policy), from its first: all of them unless it stopped early.
    pub done: usize,
    /// It stopped early: its room ran out.
    pub full: bool,
}

/// One input partition's processing.
pub struct Task {
    partition: i32,
    processor: Processor,
    config: TaskConfig,
    guest: Option<Guest>,
    /// What outlives an instance: the log's rate limit, init's fuel.
    lineage: Lineage,
    effects: Box<dyn Effects>,
    /// Fuel to bill: the calls' and the inits' (every new instance's, after
    /// a trap too).
    fuel_used: u64,
    /// Stream time and the last sweep, counting records not committed yet.
    time: Times,
    /// The times of the last commit (what an abort goes back to).
    committed_time: Times,
    /// The times the transaction being committed ends at (`Some` while one
    /// is frozen, see [`Task::freeze`]).
    committing_time: Option<Times>,
    /// Whether the processor ever asked for punctuation (its instance may be
    /// gone when the offsets commit).
    punctuated: bool,
    /// [`Task::held_bytes`] when the batch in progress began.
    held_at_start: u64,
    /// Time its calls were parked for the tenant's CPU share, not yet
    /// taken ([`Task::take_parked`]): kept here, since a trap drops the
    /// instance that counted it.
    parked: Duration,
    /// The records of the batch in progress whose value did not decode:
    /// (topic, offset, why). They go to the error policy in their place.
    undecodable: Vec<(Arc<str>, i64, String)>,
    /// What replay needs of the transaction in progress (`replay.rs`):
    /// begun by its first batch, taken by the runtime at its commit.
    replay: Option<ReplayLog>,
}

impl Task {
    /// A task for `partition` over its committed stores. The guest is
    /// instantiated on first use.
    pub fn new(
        partition: i32,
        processor: Processor,
        config: TaskConfig,
        committed: Box<dyn PartitionStore>,
    ) -> Self {
        let outputs = config.outputs.clone();
        let codecs = config.codecs.clone();
        let windows = config.window_stores.clone();
        let tables: Vec<String> = config.tables.iter().map(|(s, _)| s.clone()).collect();
        let local: Vec<String> = config.stores.iter().chain(&tables).cloned().collect();
        let state = TaskState::new(&local, committed).limit_bytes(config.state_limit_bytes);
        Self {
            partition,
            lineage: processor.lineage(partition),
            processor,
            config,
            guest: None,
            fuel_used: 0,
            time: Times::default(),
            committed_time: Times::default(),
            committing_time: None,
            punctuated: false,
            held_at_start: 0,
            parked: Duration::ZERO,
            undecodable: Vec::new(),
            replay: None,
            effects: Box::new(TaskEffects {
                codecs,
                unencodable: None,
                state,
                windows,
                tables,
                outputs,
                call_outputs: Vec::new(),
                call_bytes: 0,
                over_budget: false,
                state_full: false,
                record_mark: (0, 0),
            }),
        }
    }

    /// The input partition.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    fn fx(&mut self) -> &mut TaskEffects {
        let any: &mut dyn Any = self.effects.as_mut();
        any.downcast_mut::<TaskEffects>()
            .expect("a task's effects are always TaskEffects")
    }

    fn fx_ref(&self) -> &TaskEffects {
        let any: &dyn Any = self.effects.as_ref();
        any.downcast_ref::<TaskEffects>()
            .expect("a task's effects are always TaskEffects")
    }

    /// The task's stream time: the largest record timestamp it has seen
    /// (committed or not).
    pub fn stream_time(&self) -> Option<i64> {
        self.time.stream
    }

    /// Whether the task's results depend on stream time (window stores, or
    /// a punctuation schedule seen so far): its committed offsets then carry
    /// its stream time.
    pub fn keeps_time(&self) -> bool {
        !self.config.window_stores.is_empty()
            || self
                .guest
                .as_ref()
                .is_some_and(|g| g.punctuation_interval().is_some())
            || self.punctuated
    }

    /// Sets the stream time the task's committed offsets carry (restoring
    /// the task); records older than it do not move it.
    pub fn restore_stream_time(&mut self, committed: Option<i64>) {
        self.time = Times {
            stream: committed,
            swept: None,
        };
        self.committed_time = self.time;
        self.replay = None;
    }

    /// Sets the stream time and the last sweep a replayed transaction
    /// began with, and drops the instance: a transaction is replayed on a
    /// fresh one (docs/replay.md).
    pub fn begin_replay(&mut self, stream_time: Option<i64>, swept: Option<i64>) {
        self.time = Times {
            stream: stream_time,
            swept,
        };
        self.committed_time = self.time;
        self.replay = None;
        self.guest = None;
    }

    /// What the transaction so far did, for replay ([`ReplayLog`]): `None`
    /// if it processed no record. The next batch begins a new log.
    pub fn take_replay(&mut self) -> Option<ReplayLog> {
        self.replay.take()
    }

    /// Processes a batch of this partition's records, in order, adding
    /// what it produced to `outcome`. State changes stay pending until
    /// [`Task::apply_committed`] or [`Task::abort`]. On an error, `outcome`
    /// holds what the records before the failing one produced.
    ///
    /// Stream time advances record by record; when it reaches a point the
    /// processor scheduled, `punctuate` is called right after the record
    /// that carried it there, before the next one, so the punctuations
    /// depend on the records alone, never on how they were batched.
    ///
    /// With `outcome.room` set, the batch stops after the call (or the
    /// record given to the error policy) that took what it added past the
    /// room, its records before that finished (`outcome.done`, at least
    /// one) and the rest not begun: the caller commits and goes on with
    /// them. A call's own effects are capped ([`MAX_CALL_BYTES`]), so the
    /// batch stays within its room plus one call's.
    pub fn process_batch(
        &mut self,
        batch: &[InputRecord],
        outcome: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        if batch.is_empty() {
            return Ok(());
        }
        let decoded;
        let batch = match &self.config.codecs {
            Some(codecs) if batch.iter().any(|r| codecs.decodes(&r.topic)) => {
                let codecs = codecs.clone();
                decoded = self.decode(&codecs, batch)?;
                &decoded[..]
            }
            _ => batch,
        };
        let (times, outputs) = (self.time, outcome.outputs.len());
        let result = self.process_decoded(batch, outcome);
        self.undecodable.clear();
        if result.is_ok() && outcome.done > 0 {
            self.replay
                .get_or_insert_with(|| ReplayLog::begin(times))
                .add(&batch[..outcome.done], &outcome.outputs[outputs..]);
        }
        result
    }

    fn process_decoded(
        &mut self,
        batch: &[InputRecord],
        outcome: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        let guest = self.live_guest()?;
        guest.begin_batch();
        let every = guest.punctuation_interval();
        self.punctuated |= every.is_some();
        self.held_at_start = self.held_bytes();
        outcome.done = 0;
        outcome.full = false;
        let mut times = Vec::with_capacity(batch.len());
        let mut now = self.time.stream;
        let mut from = 0;
        for (i, record) in batch.iter().enumerate() {
            let before = now;
            if record.timestamp >= 0 && now.is_none_or(|t| record.timestamp > t) {
                now = Some(record.timestamp);
            }
            times.push(now);
            if let Some(table) = self.table_of(&record.topic) {
                // The stream records before it see the table as it was.
                self.run(&batch[from..i], &times[from..i], outcome)?;
                if outcome.full {
                    break;
                }
                self.apply_table_record(table, record)?;
                outcome.done += 1;
                from = i + 1;
            }
            let due = match (every, before, now) {
                (Some(_), None, Some(_)) => true,
                (Some(every), Some(before), Some(now)) => now >= next_punctuation(before, every),
                _ => false,
            };
            if let (true, Some(now)) = (due, now) {
                self.run(&batch[from..=i], &times[from..=i], outcome)?;
                if outcome.done <= i {
                    // Stopped before the record that carried stream time
                    // here: it punctuates when that record is processed.
                    break;
                }
                self.time.stream = Some(now);
                self.punctuate(now, outcome)?;
                from = i + 1;
                if outcome.full {
                    break;
                }
            }
        }
        if !outcome.full {
            self.run(&batch[from..], &times[from..], outcome)?;
        }
        // The stream time of the last record finished.
        if let Some(last) = outcome.done.checked_sub(1) {
            self.time.stream = times[last];
        }
        let swept = self.sweep_expired_windows();
        // The host's work for the batch after its last call is the
        // tenant's too: charged (and parked for) now.
        if let Some(guest) = self.guest.as_mut() {
            guest.end_batch();
            self.parked += guest.take_parked();
        }
        swept
    }

    /// `n` more records of the batch finished, in order; the batch is full
    /// when what it added reached its room.
    fn finished(&mut self, n: usize, out: &mut BatchOutcome) {
        out.done += n;
        if let Some(room) = out.room {
            let state = self.held_bytes().saturating_sub(self.held_at_start);
            out.full |= out.output_bytes + state >= room;
        }
    }

    /// The table whose topic is `topic`.
    fn table_of(&self, topic: &str) -> Option<usize> {
        self.config.tables.iter().position(|(_, t)| t == topic)
    }

    /// Writes a table's record to its store, in the transaction: a value
    /// sets the key, a tombstone deletes it, a record without a key is
    /// ignored (as Kafka Streams ignores it).
    fn apply_table_record(&mut self, table: usize, record: &InputRecord) -> Result<(), TaskError> {
        let Some(key) = record.key.clone() else {
            return Ok(());
        };
        let table = self.config.tables[table].0.as_str();
        let any: &mut dyn Any = self.effects.as_mut();
        let fx = any
            .downcast_mut::<TaskEffects>()
            .expect("a task's effects are always TaskEffects");
        let written = match &record.value {
            Some(value) => fx.state.put(table, key, value.clone()),
            None => fx.state.delete(table, key),
        };
        match written {
            Ok(()) => {
                fx.state.end_call();
                Ok(())
            }
            Err(e) => {
                fx.state.discard_call();
                Err(TaskError::Table {
                    table: table.to_owned(),
                    topic: record.topic.to_string(),
                    partition: record.partition,
                    offset: record.offset,
                    reason: match e {
                        AccessError::Refused(r) => r.to_string(),
                        AccessError::Failed(m) => m,
                    },
                })
            }
        }
    }

    /// Deletes the windows that expired, once stream time has moved a
    /// quarter of the store's retention (at least a second) since the last
    /// sweep. Reads never see an expired window anyway: this only frees
    /// the space, in the same transaction.
    fn sweep_expired_windows(&mut self) -> Result<(), TaskError> {
        let Some(now) = self.time.stream else {
            return Ok(());
        };
        let windows = self.config.window_stores.clone();
        let due = |retention: u64| {
            let step = (retention / 4).max(1000) as i64;
            self.time
                .swept
                .is_none_or(|at| now >= at.saturating_add(step))
        };
        if !windows.iter().any(|(_, retention)| due(*retention)) {
            return Ok(());
        }
        self.time.swept = Some(now);
        let fx = self.fx();
        for (store, retention) in &windows {
            let expired = WindowStore {
                state: &fx.state,
                store,
                retention: *retention,
            }
            .expired_keys(now)
            .map_err(access_failure)?;
            for raw in expired {
                fx.state.delete(store, raw).map_err(access_failure)?;
            }
        }
        fx.state.end_call();
        Ok(())
    }

    /// Calls `punctuate` for stream time `now`.
    fn punctuate(&mut self, now: i64, out: &mut BatchOutcome) -> Result<(), TaskError> {
        self.live_guest()?;
        self.reset_call();
        let guest = self.guest.as_mut().expect("made live above");
        let result = guest.punctuate(self.partition, now, &mut self.effects);
        self.fuel_used += guest.take_fuel_used();
        self.parked += guest.take_parked();
        let result = self.refusal(result);
        out.punctuations += 1;
        let fx = self.fx();
        match result {
            Ok(()) => {
                fx.state.end_call();
                out.output_bytes += fx.call_outputs.iter().map(|o| o.size() as u64).sum::<u64>();
                out.outputs.append(&mut fx.call_outputs);
                self.finished(0, out);
                Ok(())
            }
            Err(failure) => {
                fx.state.discard_call();
                fx.call_outputs.clear();
                self.guest = None;
                match failure {
                    CallFailure::Host(message) => Err(TaskError::Host(message)),
                    failure => Err(TaskError::Punctuate {
                        partition: self.partition,
                        stream_time: now,
                        reason: failure.to_string(),
                    }),
                }
            }
        }
    }

    fn run(
        &mut self,
        records: &[InputRecord],
        times: &[Option<i64>],
        out: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        if records.is_empty() || out.full {
            return Ok(());
        }
        if let Some(j) = self.undecodable_at(records) {
            // The records before it, the record to the error policy, the
            // rest: in order, as if the processor had refused it.
            self.run(&records[..j], &times[..j], out)?;
            if out.full {
                return Ok(());
            }
            let why = self.take_undecodable(&records[j]);
            self.poison(&records[j], why, out)?;
            self.finished(1, out);
            return self.run(&records[j + 1..], &times[j + 1..], out);
        }
        if records.len() > MAX_CALL_RECORDS {
            for (records, times) in records
                .chunks(MAX_CALL_RECORDS)
                .zip(times.chunks(MAX_CALL_RECORDS))
            {
                self.run(records, times, out)?;
            }
            return Ok(());
        }
        out.calls += 1;
        let failure = match self.call(records, times)? {
            Ok(()) => {
                self.keep_call(records, records.len(), out)?;
                self.finished(records.len(), out);
                return Ok(());
            }
            Err(failure) => failure,
        };
        if let CallFailure::Host(message) = failure {
            self.drop_call();
            return Err(TaskError::Host(message));
        }
        match (&failure, self.failed_at(&failure, records.len())) {
            // The processor returned an error for the record it began last,
            // and the host refused none of the call's writes: the records
            // before it finished (their effects stand), the failing record's
            // effects are taken back, and the same instance goes on with the
            // records after it. Its memory has seen every record once, in
            // order, whatever the batching: as after a record that succeeded
            // (or an exception that Kafka Streams' handler lets pass).
            (CallFailure::Rejected { .. }, Some(i)) => {
                if i == 0 {
                    // Nothing before it to keep; what the guest did before
                    // beginning it goes with it, as the next call does it
                    // again.
                    self.discard_call_effects();
                } else {
                    self.take_back_record(records, i, out)?;
                }
                tracing::debug!(
                    partition = self.partition,
                    records = records.len(),
                    index = i,
                    "record rejected ({failure}); the records before it stand"
                );
                self.poison(&records[i], failure.to_string(), out)?;
                self.finished(i + 1, out);
                return self.run(&records[i + 1..], &times[i + 1..], out);
            }
            // A trap: the records before the failing one finished in this
            // call, so their effects stay and no record is run twice. The
            // instance's memory may be torn mid-record: the failing record
            // gets a call of its own on a fresh instance (the trap may have
            // been the whole call's: its deadline), and the records after it
            // meet a fresh instance too, as after that record in any batch.
            // Not the call's first record: what a guest did before beginning
            // it (outside any record) would stand and then be done again by
            // the next call.
            (CallFailure::Trapped { .. }, Some(i)) if i > 0 => {
                self.take_back_record(records, i, out)?;
                self.finished(i, out);
                self.guest = None;
                tracing::debug!(
                    partition = self.partition,
                    records = records.len(),
                    index = i,
                    "record trapped ({failure}); the records before it stand"
                );
                self.run(&records[i..=i], &times[i..=i], out)?;
                return self.run(&records[i + 1..], &times[i + 1..], out);
            }
            _ => {}
        }
        if records.len() == 1 {
            self.drop_call();
            self.poison(&records[0], failure.to_string(), out)?;
            self.finished(1, out);
            return Ok(());
        }
        self.drop_call();
        let named = match &failure {
            CallFailure::Rejected { index, .. } | CallFailure::Trapped { index, .. } => {
                index.map(|i| i as usize).filter(|&i| i < records.len())
            }
            CallFailure::Host(_) => None,
        };
        tracing::debug!(
            partition = self.partition,
            records = records.len(),
            named,
            "call failed ({failure}); isolating the record"
        );
        match named {
            Some(i) => {
                self.run(&records[..i], &times[..i], out)?;
                self.run(&records[i..=i], &times[i..=i], out)?;
                self.run(&records[i + 1..], &times[i + 1..], out)
            }
            None => {
                let mid = records.len() / 2;
                self.run(&records[..mid], &times[..mid], out)?;
                self.run(&records[mid..], &times[mid..], out)
            }
        }
    }

    /// Keeps the effects of the call's first `upto` records (all of its
    /// effects when `upto` is the call's length, else those before the
    /// failing record's, which the caller took back), and handles the late
    /// records among them.
    fn keep_call(
        &mut self,
        records: &[InputRecord],
        upto: usize,
        out: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        let late = self
            .guest
            .as_mut()
            .map(Guest::take_late)
            .unwrap_or_default();
        let fx = self.fx();
        fx.state.end_call();
        out.output_bytes += fx.call_outputs.iter().map(|o| o.size() as u64).sum::<u64>();
        out.outputs.append(&mut fx.call_outputs);
        for (index, message) in late {
            let Some(record) = records[..upto].get(index as usize) else {
                continue;
            };
            match self.config.late_records {
                LateRecords::Drop => {
                    tracing::debug!(
                        topic = %record.topic,
                        partition = record.partition,
                        offset = record.offset,
                        "dropped a late record: {message}"
                    );
                    out.late_dropped += 1;
                }
                LateRecords::ErrorPolicy => {
                    self.poison(record, format!("late record: {message}"), out)?
                }
            }
        }
        Ok(())
    }

    /// Forgets a failed call's effects and its instance: any of its records
    /// run again meet a fresh instance, since this one's memory saw them
    /// once already.
    fn drop_call(&mut self) {
        self.discard_call_effects();
        self.guest = None;
    }

    /// Forgets a failed call's state writes and outputs.
    fn discard_call_effects(&mut self) {
        let fx = self.fx();
        fx.state.discard_call();
        fx.call_outputs.clear();
    }

    /// Takes back the effects of the call's record `i` (the one it failed
    /// on) and keeps those of the records before it.
    fn take_back_record(
        &mut self,
        records: &[InputRecord],
        i: usize,
        out: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        let fx = self.fx();
        fx.state.undo_record();
        let (outputs, bytes) = fx.record_mark;
        fx.call_outputs.truncate(outputs);
        fx.call_bytes = bytes;
        self.keep_call(records, i, out)
    }

    /// The index of the record a failed call failed on, when the effects of
    /// the records before it can stand: the processor (or the trap) named
    /// the record it had begun last (`begin-record`), so every effect before
    /// that record's beginning belongs to records that finished, and no
    /// write of the call was refused (a refused write may have changed what
    /// the records after it did, and the host's refusal is not the
    /// processor's verdict on the record).
    fn failed_at(&self, failure: &CallFailure, len: usize) -> Option<usize> {
        let index = match failure {
            CallFailure::Rejected { index, .. } | CallFailure::Trapped { index, .. } => (*index)?,
            CallFailure::Host(_) => return None,
        };
        let fx = self.fx_ref();
        let cursor = self.guest.as_ref()?.cursor()?;
        let keep = index == cursor
            && (index as usize) < len
            && !fx.over_budget
            && !fx.state_full
            && fx.unencodable.is_none();
        keep.then_some(index as usize)
    }

    /// The live instance, made if there is none (or it trapped).
    fn live_guest(&mut self) -> Result<&mut Guest, TaskError> {
        if self.guest.as_ref().is_none_or(Guest::is_poisoned) {
            // Drop the old instance first: only one lives at a time.
            self.guest = None;
            let made = self.processor.instantiate_in(&mut self.lineage);
            // Billed whether init succeeded or not.
            self.fuel_used += self.lineage.take_init_fuel();
            self.guest = Some(made?);
        }
        Ok(self.guest.as_mut().expect("instantiated above"))
    }

    fn reset_call(&mut self) {
        let fx = self.fx();
        fx.call_bytes = 0;
        fx.over_budget = false;
        fx.state_full = false;
        fx.unencodable = None;
        fx.record_mark = (0, 0);
    }

    /// One `process` call on a live instance.
    fn call(
        &mut self,
        records: &[InputRecord],
        times: &[Option<i64>],
    ) -> Result<Result<(), CallFailure>, TaskError> {
        self.live_guest()?;
        self.reset_call();
        let guest = self.guest.as_mut().expect("made live above");
        let result = guest.process(records, times, &mut self.effects);
        self.fuel_used += guest.take_fuel_used();
        self.parked += guest.take_parked();
        Ok(self.refusal(result))
    }

    /// Fuel the guest burned since the last call of this (0 with metering
    /// off), including calls that failed and every instance's
    /// instantiation and `init`.
    pub fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    /// How long the guest's calls were parked for the tenant's CPU share
    /// since the last call of this (`Processor::with_cpu_meter`).
    pub fn take_parked(&mut self) -> Duration {
        // An instance's init parks too (taken here, before it is replaced).
        let init = self
            .guest
            .as_mut()
            .map_or(Duration::ZERO, Guest::take_parked);
        std::mem::take(&mut self.parked) + init
    }

    /// Bytes of state changes held in memory until their commit
    /// (`memory.rs`).
    pub fn held_bytes(&self) -> u64 {
        self.fx_ref().state.held_bytes()
    }

    /// Whether state changes wait for a commit.
    pub fn is_dirty(&self) -> bool {
        self.fx_ref().state.is_dirty()
    }

    /// The state changes since the last commit, for the changelogs (a
    /// table's changes are not: its topic is its changelog).
    pub fn pending_changes(&self) -> Vec<StoreChanges> {
        let mut changes = self.fx_ref().state.pending_changes();
        changes.retain(|c| !self.config.tables.iter().any(|(s, _)| *s == c.store));
        changes
    }

    /// The transaction committed: apply the pending changes to the
    /// committed stores, recording how far each store's changelog reached
    /// (`positions`: store -> next changelog offset) and, when given, that
    /// every store was in sync with its log as of `synced`.
    pub fn apply_committed(
        &mut self,
        positions: Vec<(String, i64)>,
        synced: Option<std::time::SystemTime>,
    ) -> Result<(), TaskError> {
        self.committed_time = self.committing_time.take().unwrap_or(self.time);
        Ok(self.fx().state.apply_committed(positions, synced)?)
    }

    /// Freezes the transaction's changes for its commit, which may run
    /// while the task goes on with the next records: they see the frozen
    /// changes, and [`Task::apply_committed`] applies only those. An
    /// abort forgets both.
    pub fn freeze(&mut self) {
        self.committing_time = Some(self.time);
        self.fx().state.freeze();
    }

    /// The next changelog offset to restore from, per store.
    pub fn changelog_position(&self, store: &str) -> Result<Option<i64>, TaskError> {
        Ok(self.fx_ref().state.committed().changelog_position(store)?)
    }

    /// Deletes every committed entry of `store` and sets its changelog
    /// position to 0 (the store is then restored in full). Returns the
    /// entries deleted.
    pub fn wipe_store(&mut self, store: &str) -> Result<u64, TaskError> {
        Ok(self.fx().state.wipe_committed(store)?)
    }

    /// Records that every store is in sync with its log as of `at`
    /// (nothing of it waits for a commit).
    pub fn mark_synced(&mut self, at: std::time::SystemTime) -> Result<(), TaskError> {
        Ok(self.fx().state.mark_synced(at)?)
    }

    /// When `store` was last known in sync with its log
    /// ([`crate::state::WriteBatch::synced`]).
    pub fn synced_at(&self, store: &str) -> Result<Option<std::time::SystemTime>, TaskError> {
        Ok(self.fx_ref().state.committed().synced_at(store)?)
    }

    /// Writes restored changelog records straight to the committed stores.
    pub fn write_restored(&mut self, batch: &WriteBatch) -> Result<(), TaskError> {
        Ok(self.fx().state.write_committed(batch)?)
    }

    /// The transaction aborted: drop pending changes and the instance (a
    /// guest never outlives an aborted transaction).
    pub fn abort(&mut self) {
        // The sweep goes back too: the windows it deleted are deleted
        // again when the records run again (eos-audit-3 finding 12).
        self.time = self.committed_time;
        self.committing_time = None;
        self.fx().state.abort();
        self.fx().call_outputs.clear();
        self.guest = None;
        self.replay = None;
    }

    /// Visible state per store, for `--dump-state`.
    pub fn dump_state(&self) -> Result<Vec<(String, Vec<Entry>)>, TaskError> {
        Ok(self.fx_ref().state.dump()?)
    }
}

/// A host failure while the task itself touched its stores.
fn access_failure(e: AccessError) -> TaskError {
    TaskError::Host(match e {
        AccessError::Refused(r) => r.to_string(),
        AccessError::Failed(m) => m,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sandbox_default_policy_is_the_manifest_default() {
        let text =
            "name = \"p\"\ntenant = \"t\"\ninputs = [\"in\"]\n[build]\nlanguage = \"rust\"\n";
        let m = Manifest::parse(text, "/x/onceflow.toml".into()).expect("a minimal manifest");
        let (from_manifest, default) = (processor_policy(&m), ProcessorPolicy::default());
        assert_eq!(from_manifest.memory_bytes, default.memory_bytes);
        assert_eq!(from_manifest.fuel_per_record, default.fuel_per_record);
        assert_eq!(from_manifest.timeout, default.timeout);
        assert_eq!(
            from_manifest.log_lines_per_second,
            default.log_lines_per_second
        );
    }
}
