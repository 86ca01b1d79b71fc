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

use std::time::Duration;

use crate::manifest::{ErrorPolicy, Manifest};
use crate::sandbox::{CallFailure, Guest, Processor, ProcessorPolicy, SandboxError};
use crate::state::{PartitionStore, StateError, StoreChanges, TaskState, WriteBatch};
use crate::types::{
    AccessError, Effects, EmitError, Entry, Header, InputRecord, OutputRecord, StoreAccessError,
};

/// Largest output record (key + value + headers) accepted, in bytes.
pub const MAX_OUTPUT_BYTES: u64 = crate::types::MAX_RECORD_BYTES;

/// Most bytes of outputs and state writes one `process` call may buffer in
/// the host (`limits.memory-mb` bounds only the guest's own memory): one
/// record emitting 2,500 outputs of 1 MB took a host to 2.48 GB before.
/// Past it every emit and put of the call is refused, and the call fails
/// (a batch is split until the record to blame is alone; then its error
/// policy applies), even if the guest ignores the refusals.
pub const MAX_CALL_BYTES: u64 = 64 << 20;

/// Longest reason a dead letter carries, in bytes (the rest is cut).
const MAX_REASON_BYTES: usize = 4096;

/// Header names on dead-lettered records.
pub mod dead_letter_headers {
    /// What every header the host adds to a dead letter starts with; an
    /// input's own headers with this prefix are dropped from its dead
    /// letter.
    pub const PREFIX: &str = "onceflow.error.";
    /// Why the record failed.
    pub const ERROR: &str = "onceflow.error.message";
    /// The input topic.
    pub const TOPIC: &str = "onceflow.error.topic";
    /// The input partition (decimal).
    pub const PARTITION: &str = "onceflow.error.partition";
    /// The input offset (decimal).
    pub const OFFSET: &str = "onceflow.error.offset";
    /// The application id (`tenant.processor`).
    pub const PROCESSOR: &str = "onceflow.error.processor";
    /// Present when the record's value was too large to go with it: the
    /// value's size in bytes (decimal). Read the original from the input
    /// topic at the given offset.
    pub const VALUE_DROPPED: &str = "onceflow.error.value-dropped";
}

/// How a task handles failures, from the manifest.
#[derive(Debug, Clone)]
pub struct TaskConfig {
    /// `tenant.name`, for dead-letter headers and messages.
    pub application_id: String,
    /// The error policy.
    pub policy: ErrorPolicy,
    /// Output alias -> topic.
    pub outputs: Vec<(String, String)>,
    /// State store names.
    pub stores: Vec<String>,
    /// Most bytes of keys and values the stores of one task hold together
    /// (`limits.state-mb`).
    pub state_limit_bytes: u64,
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
                .map(|(a, t)| (a.clone(), t.clone()))
                .collect(),
            stores: m.stores.clone(),
            state_limit_bytes: m.limits.state_mb.saturating_mul(1 << 20),
        }
    }
}

/// The sandbox limits and labels a manifest asks for: the one place that
/// turns `[limits]` and `[config]` into the sandbox's own terms (the sandbox
/// knows nothing of manifests).
pub fn processor_policy(m: &Manifest) -> ProcessorPolicy {
    ProcessorPolicy {
        memory_bytes: (m.limits.memory_mb as usize) << 20,
        fuel_per_record: m.limits.fuel_per_record,
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
    /// The processor could not be instantiated.
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// The state store failed.
    #[error(transparent)]
    State(#[from] StateError),
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
}

/// The effects of a task: its state and the outputs of the call in progress.
struct TaskEffects {
    state: TaskState,
    outputs: Vec<(String, String)>,
    call_outputs: Vec<OutputRecord>,
    /// Bytes of outputs and state writes in the call in progress.
    call_bytes: u64,
    /// Whether the call went past [`MAX_CALL_BYTES`].
    over_budget: bool,
    /// Whether a write of the call was refused for `limits.state-mb`.
    state_full: bool,
}

impl TaskEffects {
    /// Counts `size` more bytes for the call; false (and every later
    /// request of the call refused) past [`MAX_CALL_BYTES`].
    fn spend(&mut self, size: u64) -> bool {
        if self.over_budget || self.call_bytes + size > MAX_CALL_BYTES {
            self.over_budget = true;
            return false;
        }
        self.call_bytes += size;
        true
    }
}

impl Effects for TaskEffects {
    fn get(&mut self, store: &str, key: &[u8]) -> Result<Option<Vec<u8>>, AccessError> {
        self.state.get(store, key)
    }
    fn put(&mut self, store: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), AccessError> {
        if !self.spend((key.len() + value.len()) as u64) {
            return Err(AccessError::Refused(StoreAccessError::TooLarge(
                MAX_CALL_BYTES,
            )));
        }
        let put = self.state.put(store, key, value);
        if matches!(
            put,
            Err(AccessError::Refused(StoreAccessError::StateFull(_)))
        ) {
            self.state_full = true;
        }
        put
    }
    fn delete(&mut self, store: &str, key: Vec<u8>) -> Result<(), AccessError> {
        self.state.delete(store, key)
    }
    fn scan_prefix(
        &mut self,
        store: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        self.state.scan_prefix(store, prefix, after, limit)
    }
    fn scan_range(
        &mut self,
        store: &str,
        start: Option<&[u8]>,
        end: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<Entry>, AccessError> {
        self.state.scan_range(store, start, end, limit)
    }
    fn emit(
        &mut self,
        alias: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<Header>,
        timestamp: i64,
    ) -> Result<(), EmitError> {
        let topic = self
            .outputs
            .iter()
            .find(|(a, _)| a == alias)
            .map(|(_, t)| t.clone())
            .ok_or_else(|| EmitError::UnknownAlias(alias.to_owned()))?;
        let record = OutputRecord {
            topic,
            key,
            value,
            headers,
            timestamp: Some(timestamp),
        };
        if record.size() as u64 > MAX_OUTPUT_BYTES {
            return Err(EmitError::TooLarge(MAX_OUTPUT_BYTES));
        }
        if !self.spend(record.size() as u64) {
            return Err(EmitError::TooLarge(MAX_CALL_BYTES));
        }
        self.call_outputs.push(record);
        Ok(())
    }
}

/// One input partition's processing.
pub struct Task {
    partition: i32,
    processor: Processor,
    config: TaskConfig,
    guest: Option<Guest>,
    effects: Box<dyn Effects>,
    fuel_used: u64,
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
        let state = TaskState::new(&config.stores, committed).limit_bytes(config.state_limit_bytes);
        Self {
            partition,
            processor,
            config,
            guest: None,
            fuel_used: 0,
            effects: Box::new(TaskEffects {
                state,
                outputs,
                call_outputs: Vec::new(),
                call_bytes: 0,
                over_budget: false,
                state_full: false,
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

    /// Processes a batch of this partition's records, in order, adding
    /// what it produced to `outcome`. State changes stay pending until
    /// [`Task::apply_committed`] or [`Task::abort`]. On an error, `outcome`
    /// holds what the records before the failing one produced.
    pub fn process_batch(
        &mut self,
        batch: &[InputRecord],
        outcome: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        self.run(batch, outcome)
    }

    fn run(&mut self, records: &[InputRecord], out: &mut BatchOutcome) -> Result<(), TaskError> {
        if records.is_empty() {
            return Ok(());
        }
        out.calls += 1;
        let failure = match self.call(records)? {
            Ok(()) => {
                let fx = self.fx();
                fx.state.end_call();
                out.outputs.append(&mut fx.call_outputs);
                return Ok(());
            }
            Err(failure) => failure,
        };
        let fx = self.fx();
        fx.state.discard_call();
        fx.call_outputs.clear();
        // The records are run again (in parts): on a fresh instance, since
        // this one's memory saw them once already.
        self.guest = None;
        if let CallFailure::Host(message) = failure {
            return Err(TaskError::Host(message));
        }
        if records.len() == 1 {
            return self.poison(&records[0], failure.to_string(), out);
        }
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
                self.run(&records[..i], out)?;
                self.run(&records[i..=i], out)?;
                self.run(&records[i + 1..], out)
            }
            None => {
                let mid = records.len() / 2;
                self.run(&records[..mid], out)?;
                self.run(&records[mid..], out)
            }
        }
    }

    /// One `process` call on a live instance.
    fn call(&mut self, records: &[InputRecord]) -> Result<Result<(), CallFailure>, TaskError> {
        if self.guest.as_ref().is_none_or(Guest::is_poisoned) {
            // Drop the old instance first: only one lives at a time.
            self.guest = None;
            self.guest = Some(self.processor.instantiate(self.partition)?);
        }
        {
            let fx = self.fx();
            fx.call_bytes = 0;
            fx.over_budget = false;
            fx.state_full = false;
        }
        let guest = self.guest.as_mut().expect("instantiated above");
        let result = guest.process(records, &mut self.effects);
        self.fuel_used += guest.take_fuel_used();
        let fx = self.fx_ref();
        let refused = if fx.over_budget {
            Some(format!(
                "the outputs and state writes of one call exceeded the host's limit of {} MiB: \
                 the record emits or writes too much at once",
                MAX_CALL_BYTES >> 20
            ))
        } else if fx.state_full {
            Some(format!(
                "{} (partition {} holds {} bytes)",
                StoreAccessError::StateFull(self.config.state_limit_bytes),
                self.partition,
                fx.state.visible_bytes()
            ))
        } else {
            None
        };
        if let Some(message) = refused {
            // Whatever the guest made of the refusals, the call failed.
            return Ok(Err(match result {
                Err(CallFailure::Rejected { index, .. }) => {
                    CallFailure::Rejected { index, message }
                }
                // The refusal is why: a guest that unwraps it traps.
                Err(CallFailure::Trapped { index, reason }) => CallFailure::Trapped {
                    index,
                    reason: format!("{message}; then the guest trapped: {reason}"),
                },
                Err(host @ CallFailure::Host(_)) => host,
                Ok(()) => CallFailure::Rejected {
                    index: None,
                    message,
                },
            }));
        }
        Ok(result)
    }

    /// Fuel the guest burned since the last call of this (0 with metering
    /// off), including calls that failed.
    pub fn take_fuel_used(&mut self) -> u64 {
        std::mem::take(&mut self.fuel_used)
    }

    fn poison(
        &mut self,
        record: &InputRecord,
        reason: String,
        out: &mut BatchOutcome,
    ) -> Result<(), TaskError> {
        match &self.config.policy {
            ErrorPolicy::Fail => Err(TaskError::RecordFailed {
                topic: record.topic.clone(),
                partition: record.partition,
                offset: record.offset,
                reason,
            }),
            ErrorPolicy::Skip => {
                tracing::warn!(
                    processor = %self.config.application_id,
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    "skipped a record: {reason}"
                );
                out.skipped += 1;
                Ok(())
            }
            ErrorPolicy::DeadLetter { topic } => {
                tracing::debug!(
                    topic = %record.topic,
                    partition = record.partition,
                    offset = record.offset,
                    "dead-lettered a record: {reason}"
                );
                out.outputs.push(dead_letter(
                    record,
                    topic.clone(),
                    &self.config.application_id,
                    reason,
                ));
                out.dead_lettered += 1;
                Ok(())
            }
        }
    }

    /// Whether state changes wait for a commit.
    pub fn is_dirty(&self) -> bool {
        self.fx_ref().state.is_dirty()
    }

    /// The state changes since the last commit, for the changelogs.
    pub fn pending_changes(&self) -> Vec<StoreChanges> {
        self.fx_ref().state.pending_changes()
    }

    /// The transaction committed: apply the pending changes to the
    /// committed stores, recording how far each store's changelog reached
    /// (`positions`: store -> next changelog offset).
    pub fn apply_committed(&mut self, positions: Vec<(String, i64)>) -> Result<(), TaskError> {
        Ok(self.fx().state.apply_committed(positions)?)
    }

    /// The next changelog offset to restore from, per store.
    pub fn changelog_position(&self, store: &str) -> Result<Option<i64>, TaskError> {
        Ok(self.fx_ref().state.committed().changelog_position(store)?)
    }

    /// Deletes every committed entry of `store` and sets its changelog
    /// position to 0 (the store is then restored in full). Returns the
    /// entries deleted.
    pub fn wipe_store(&mut self, store: &str) -> Result<u64, TaskError> {
        let keys: Vec<Vec<u8>> = self
            .fx_ref()
            .state
            .committed()
            .range(
                store,
                std::ops::Bound::Unbounded,
                std::ops::Bound::Unbounded,
            )
            .map(|e| e.map(|(k, _)| k))
            .collect::<Result<_, StateError>>()?;
        let wiped = keys.len() as u64;
        self.fx().state.write_committed(&WriteBatch {
            changes: vec![StoreChanges {
                store: store.to_owned(),
                changes: keys.into_iter().map(|k| (k, None)).collect(),
            }],
            positions: vec![(store.to_owned(), 0)],
        })?;
        Ok(wiped)
    }

    /// Writes restored changelog records straight to the committed stores.
    pub fn write_restored(&mut self, batch: &WriteBatch) -> Result<(), TaskError> {
        Ok(self.fx().state.write_committed(batch)?)
    }

    /// The transaction aborted: drop pending changes and the instance (a
    /// guest never outlives an aborted transaction).
    pub fn abort(&mut self) {
        self.fx().state.abort();
        self.fx().call_outputs.clear();
        self.guest = None;
    }

    /// Visible state per store, for `--dump-state`.
    pub fn dump_state(&self) -> Result<Vec<(String, Vec<Entry>)>, TaskError> {
        Ok(self.fx_ref().state.dump()?)
    }
}

/// The dead-letter record for `record`: its key, value and headers, plus
/// the reason and its coordinates as headers. The reason is cut to 4 KiB;
/// if the record would still be larger than Kafka takes, its value is
/// dropped and header `onceflow.error.value-dropped` gives its size.
pub fn dead_letter(
    record: &InputRecord,
    topic: String,
    application_id: &str,
    mut reason: String,
) -> OutputRecord {
    use dead_letter_headers as h;
    if reason.len() > MAX_REASON_BYTES {
        let mut cut = MAX_REASON_BYTES;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
        reason.push_str(" [cut]");
    }
    // The host's headers win: an input that already carries
    // `onceflow.error.*` headers (forged upstream, or a dead letter fed back
    // in) loses them, so readers find exactly one of each, the host's.
    let mut headers: Vec<Header> = record
        .headers
        .iter()
        .filter(|x| !x.key.starts_with(h::PREFIX))
        .cloned()
        .collect();
    let mut add = |key: &str, value: String| {
        headers.push(Header {
            key: key.to_owned(),
            value: value.into_bytes(),
        })
    };
    add(h::ERROR, reason);
    add(h::TOPIC, record.topic.clone());
    add(h::PARTITION, record.partition.to_string());
    add(h::OFFSET, record.offset.to_string());
    add(h::PROCESSOR, application_id.to_owned());
    let mut out = OutputRecord {
        topic,
        key: record.key.clone(),
        value: record.value.clone(),
        headers,
        timestamp: Some(record.timestamp),
    };
    if out.size() as u64 > MAX_OUTPUT_BYTES {
        let dropped = out.value.take().map_or(0, |v| v.len());
        out.headers.push(Header {
            key: h::VALUE_DROPPED.to_owned(),
            value: dropped.to_string().into_bytes(),
        });
    }
    if out.size() as u64 > MAX_OUTPUT_BYTES {
        // The input's own key and headers are too large: keep only what
        // says where the record was.
        out.key = None;
        out.headers.retain(|x| x.key.starts_with(h::PREFIX));
    }
    out
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

    /// An input carrying forged `onceflow.error.*` headers: its dead letter
    /// has one of each, the host's (before, the forged ones came first and
    /// `verify` read the forged offset).
    #[test]
    fn the_hosts_dead_letter_headers_win_over_the_inputs() {
        let forged = |key: &str, value: &str| Header {
            key: key.to_owned(),
            value: value.as_bytes().to_vec(),
        };
        let record = InputRecord {
            topic: "in".to_owned(),
            partition: 2,
            offset: 41,
            timestamp: 7,
            key: Some(b"k".to_vec()),
            value: Some(b"v".to_vec()),
            headers: vec![
                forged(dead_letter_headers::OFFSET, "999"),
                forged(dead_letter_headers::ERROR, "all good"),
                forged("trace-id", "abc"),
            ],
        };
        let out = dead_letter(&record, "dlq".to_owned(), "t.p", "boom".to_owned());
        let values = |key: &str| -> Vec<String> {
            out.headers
                .iter()
                .filter(|x| x.key == key)
                .map(|x| String::from_utf8_lossy(&x.value).into_owned())
                .collect()
        };
        assert_eq!(values(dead_letter_headers::OFFSET), ["41"]);
        assert_eq!(values(dead_letter_headers::ERROR), ["boom"]);
        assert_eq!(values(dead_letter_headers::PARTITION), ["2"]);
        assert_eq!(values("trace-id"), ["abc"], "other headers are kept");
    }
}
