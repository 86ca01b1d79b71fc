//! Replay: a committed transaction run again from what Kafka keeps, and
//! compared with what it committed (docs/replay.md).
//!
//! Each transaction writes, per task that processed records, a replay
//! record (`record.rs`) to the deployment's replay topic, in the task's
//! partition. [`replay`] reads them, and for each selected transaction:
//! 1. brings an in-memory copy of the task's stores to the changelog
//!    positions the transaction began at (read_committed: what committed
//!    before it; the copy only moves forward, so a run of transactions
//!    reads each changelog once);
//! 2. reads the transaction's input records again (read_committed, from
//!    each source's first offset, as many as it processed);
//! 3. runs them through the component in the same batches, on a fresh
//!    instance, from the same stream time;
//! 4. compares each batch's outputs (their digest and count) and the state
//!    changes (with the changelog records the transaction wrote).
//!
//! A candidate component (`--component`) runs on the same records from the
//! same state, and its outputs and changes are compared with the committed
//! ones. Nothing is written to Kafka.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::kafka::{self, Connection, KafkaError, QuietContext};
use crate::manifest::Manifest;
use crate::sandbox::Processor;
use crate::state::{MemoryPartition, StoreChanges, WriteBatch};
use crate::task::{BatchOutcome, Task, TaskConfig, TaskError, outputs_digest};
use crate::types::{Entry, InputRecord, OutputRecord};

mod cursor;
mod record;

use cursor::Cursor;

pub use record::{Batch, ReplayRecord, VERSION};

/// The topic a deployment's replay records go to, `None` when it keeps
/// none (`processing.replay-window-hours = 0`): the changelog of the
/// reserved store name `onceflow.replay`, so no manifest can name it
/// (`stream::names`).
pub fn replay_topic(manifest: &Manifest) -> Option<String> {
    (manifest.processing.replay_window_hours > 0)
        .then(|| super::changelog_topic(manifest, "onceflow.replay"))
}

/// Which transactions of a partition to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Those that processed any of the records from `from` to `to`
    /// (inclusive) of the deployment's first input.
    Offsets {
        /// First input offset.
        from: i64,
        /// Last input offset.
        to: i64,
    },
    /// The first committed at or after this time (ms since the epoch).
    At(i64),
    /// The transaction whose replay record is at this offset of the
    /// replay topic's partition (`onceflow replay --list` shows them).
    Transaction(i64),
    /// The last `n` transactions.
    Last(usize),
    /// Every transaction still in the replay topic.
    All,
}

/// What to replay.
pub struct ReplayRequest {
    /// The task's partition.
    pub partition: i32,
    /// Its transactions to replay.
    pub select: Selection,
    /// Another component to run on the same records and state, compared
    /// with what committed.
    pub candidate: Option<Processor>,
    /// Collect each store's entries before and after each transaction.
    pub dump_state: bool,
    /// Most transactions to replay (`None`: no limit): a selection of more
    /// is refused, saying how many it named.
    pub max: Option<usize>,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Kafka could not be read.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The task failed outside the processor (a host failure).
    #[error(transparent)]
    Task(#[from] TaskError),
    /// The deployment keeps no replay records.
    #[error(
        "deployment {0} keeps no replay records (processing.replay-window-hours = 0): set it, \
         deploy again, and replay the transactions committed from then on"
    )]
    Off(String),
    /// A replay record could not be read.
    #[error("replay record {topic}/{partition}@{offset}: {why}")]
    Record {
        /// The replay topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The record's offset.
        offset: i64,
        /// Why.
        why: String,
    },
    /// The component that committed a transaction cannot be had.
    #[error(
        "transaction {transaction} of partition {partition} was committed by component sha256 \
         {committed}, which cannot be run here: {why}"
    )]
    Component {
        /// The partition.
        partition: i32,
        /// The transaction (its replay record's offset).
        transaction: i64,
        /// The digest that committed.
        committed: String,
        /// Why it cannot be had, and what to do.
        why: String,
    },
    /// The selection names more transactions than a replay may run.
    #[error(
        "{select} names {count} transactions of partition {partition}, more than the {max} one \
         replay runs: ask for fewer (--offsets, --at, --last)"
    )]
    TooMany {
        /// The partition.
        partition: i32,
        /// The selection, in words.
        select: String,
        /// How many it named.
        count: usize,
        /// The most.
        max: usize,
    },
    /// Kafka no longer has what the transaction read or wrote.
    #[error(
        "transaction {transaction} of partition {partition} cannot be replayed: {what} (the \
         topic's retention or compaction removed it; transactions stay replayable for \
         processing.replay-window-hours, docs/replay.md)"
    )]
    Gone {
        /// The partition.
        partition: i32,
        /// The transaction.
        transaction: i64,
        /// What is missing.
        what: String,
    },
    /// Nothing matched the selection.
    #[error("no committed transaction of partition {partition} matches {select}")]
    NoneSelected {
        /// The partition.
        partition: i32,
        /// The selection, as words.
        select: String,
    },
}

/// One transaction, replayed.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// Its replay record's offset: the transaction's id here.
    pub transaction: i64,
    /// When it committed (its replay record's timestamp, ms).
    pub committed_at: Option<i64>,
    /// The record.
    pub record: ReplayRecord,
    /// The input records it processed, in order.
    pub inputs: Vec<InputRecord>,
    /// The outputs of the replay, per batch (dead letters in their place).
    pub outputs: Vec<Vec<OutputRecord>>,
    /// The replay's state changes, per store.
    pub changes: Vec<StoreChanges>,
    /// The state changes the transaction committed, per store.
    pub committed_changes: Vec<StoreChanges>,
    /// `identical`, or the first difference.
    pub verdict: Verdict,
    /// The candidate's run, with `--component`.
    pub candidate: Option<CandidateRun>,
    /// With `dump_state`: the stores before and after (the replay's).
    pub state: Option<(StoreDump, StoreDump)>,
}

/// Each store's entries.
pub type StoreDump = Vec<(String, Vec<Entry>)>;

/// A store's changes in a changelog's order: (key, value or `None` for a
/// delete).
type Changes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// The candidate component's run of a transaction.
#[derive(Debug, Clone)]
pub struct CandidateRun {
    /// Its outputs, per batch.
    pub outputs: Vec<Vec<OutputRecord>>,
    /// Its state changes.
    pub changes: Vec<StoreChanges>,
    /// Its failure, if the batch failed (a record under the `fail`
    /// policy, `punctuate`).
    pub failed: Option<String>,
}

/// How a replay compares with what committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The same outputs, in the same order, and the same state changes.
    Identical,
    /// The first difference, in words.
    Differs(String),
}

/// A deployment to replay: its manifest, the components that committed,
/// its task settings (formats included) and the cluster.
pub struct ReplaySource<'a> {
    /// The manifest.
    pub manifest: &'a Manifest,
    /// The component that committed a transaction, by its SHA-256 (a
    /// transaction's record names it), or why it cannot be had.
    pub component: &'a dyn Fn(&str) -> Result<Processor, String>,
    /// The task settings (with the deployment's codecs).
    pub config: TaskConfig,
    /// The cluster.
    pub kafka: &'a Connection,
}

/// A committed transaction's replay record, as read.
#[derive(Debug, Clone)]
pub struct Committed {
    /// The record's offset in the replay topic's partition: the
    /// transaction's id for `onceflow replay --transaction`.
    pub id: i64,
    /// When it was written (ms since the epoch): the transaction's commit,
    /// within its commit's latency.
    pub at: Option<i64>,
    /// The record's size (its value's bytes): what replay adds to the
    /// transaction.
    pub bytes: usize,
    /// The record.
    pub record: ReplayRecord,
}

/// The transactions of a partition still in its replay topic, oldest
/// first.
pub fn transactions(
    source: &ReplaySource<'_>,
    partition: i32,
) -> Result<Vec<Committed>, ReplayError> {
    let topic = replay_topic(source.manifest)
        .ok_or_else(|| ReplayError::Off(source.manifest.application_id()))?;
    let mut out = Vec::new();
    let mut bad = None;
    read_replay_topic(source, &topic, partition, |r| {
        match r.payload().map(ReplayRecord::parse) {
            Some(Ok(record)) => out.push(Committed {
                id: r.offset(),
                at: r.timestamp(),
                bytes: r.payload().map_or(0, <[u8]>::len),
                record,
            }),
            Some(Err(why)) => {
                bad = Some((r.offset(), why));
                return ControlFlow::Break(());
            }
            None => {}
        }
        ControlFlow::Continue(())
    })?;
    if let Some((offset, why)) = bad {
        return Err(ReplayError::Record {
            topic,
            partition,
            offset,
            why,
        });
    }
    Ok(out)
}

/// Replays the selected transactions of a partition, handing each to
/// `each` as it is done.
pub fn replay(
    source: &ReplaySource<'_>,
    request: &ReplayRequest,
    mut each: impl FnMut(&Replayed),
) -> Result<Summary, ReplayError> {
    let partition = request.partition;
    let all = transactions(source, partition)?;
    let selected = select(source.manifest, &all, &request.select);
    if selected.is_empty() {
        return Err(ReplayError::NoneSelected {
            partition,
            select: describe(&request.select),
        });
    }
    if let Some(max) = request.max.filter(|max| selected.len() > *max) {
        return Err(ReplayError::TooMany {
            partition,
            select: describe(&request.select),
            count: selected.len(),
            max,
        });
    }
    let mut logs = Logs {
        source,
        partition,
        cursors: BTreeMap::new(),
    };
    // The replica of the component that ran: a transaction of another
    // version starts another, from an empty state.
    let mut replica: Option<(String, Replica<'_>)> = None;
    let mut summary = Summary::default();
    for i in selected {
        let Committed {
            id: transaction,
            at: committed_at,
            record,
            ..
        } = &all[i];
        if replica
            .as_ref()
            .is_none_or(|(sha, _)| *sha != record.component)
        {
            let processor =
                (source.component)(&record.component).map_err(|why| ReplayError::Component {
                    partition,
                    transaction: *transaction,
                    committed: record.component.clone(),
                    why,
                })?;
            replica = Some((
                record.component.clone(),
                Replica::new(source, processor, request.candidate.clone(), partition),
            ));
        }
        let (_, replica) = replica.as_mut().expect("made above");
        let replayed = replica.run(&mut logs, *transaction, *committed_at, record, request)?;
        summary.transactions += 1;
        summary.batches += record.batches.len() as u64;
        summary.records += replayed.inputs.len() as u64;
        if replayed.verdict == Verdict::Identical {
            summary.identical += 1;
        }
        each(&replayed);
    }
    Ok(summary)
}

/// What a replay did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Transactions replayed.
    pub transactions: u64,
    /// Their batches (as the runtime handed them to the task).
    pub batches: u64,
    /// Of them, identical to what committed.
    pub identical: u64,
    /// Input records processed.
    pub records: u64,
}

/// The indexes of `all` the selection names.
pub fn select(manifest: &Manifest, all: &[Committed], select: &Selection) -> Vec<usize> {
    match *select {
        Selection::All => (0..all.len()).collect(),
        Selection::Last(n) => (all.len().saturating_sub(n)..all.len()).collect(),
        Selection::Transaction(t) => all.iter().position(|c| c.id == t).into_iter().collect(),
        Selection::At(ts) => all
            .iter()
            .position(|c| c.at.is_some_and(|at| at >= ts))
            .into_iter()
            .collect(),
        Selection::Offsets { from, to } => {
            let Some(input) = manifest.inputs.first() else {
                return Vec::new();
            };
            // Each transaction's first offset of the input; a transaction
            // holds the offsets up to the next one's first.
            let firsts: Vec<(usize, i64)> = all
                .iter()
                .enumerate()
                .filter_map(|(i, c)| {
                    c.record
                        .sources
                        .iter()
                        .find(|(t, _)| t == input)
                        .map(|&(_, o)| (i, o))
                })
                .collect();
            firsts
                .iter()
                .enumerate()
                .filter(|&(k, &(_, first))| {
                    let next = firsts.get(k + 1).map_or(i64::MAX, |&(_, o)| o);
                    first <= to && next > from
                })
                .map(|(_, &(i, _))| i)
                .collect()
        }
    }
}

fn describe(select: &Selection) -> String {
    match select {
        Selection::Offsets { from, to } => format!("input offsets {from}..{to}"),
        Selection::At(ts) => format!("a commit at or after {ts} ms"),
        Selection::Transaction(t) => format!("transaction {t}"),
        Selection::Last(n) => format!("the last {n}"),
        Selection::All => "any".to_owned(),
    }
}

/// How long reading the replay topic may wait for the brokers.
const READ_WAIT: Duration = Duration::from_secs(60);

/// Reads the replay topic's `partition` from its start, handing each record
/// to `each`.
fn read_replay_topic(
    source: &ReplaySource<'_>,
    topic: &str,
    partition: i32,
    each: impl FnMut(&kafka::Record<'_>) -> ControlFlow<()>,
) -> Result<(), KafkaError> {
    let consumer = source.kafka.reader(
        &reader_group(source.manifest),
        "read_committed",
        10,
        QuietContext::default(),
    )?;
    kafka::assign(&consumer, &[(topic, partition, Some(0))])?;
    kafka::read_to_end(&consumer, 1, topic, Instant::now() + READ_WAIT, each)
}

/// The group id replay's readers name (they never join it).
fn reader_group(manifest: &Manifest) -> String {
    format!("{}.onceflow-replay", manifest.application_id())
}

/// A cursor per log a replay reads (`cursor.rs`), made on first use.
struct Logs<'a> {
    source: &'a ReplaySource<'a>,
    partition: i32,
    cursors: BTreeMap<(String, bool), Cursor>,
}

impl Logs<'_> {
    /// The cursor of `topic` read as an input (`state`: false) or as a
    /// store's log: a table's topic is both, read at different offsets.
    fn cursor(&mut self, topic: &str, state: bool, from: i64) -> Result<&mut Cursor, KafkaError> {
        let key = (topic.to_owned(), state);
        if !self.cursors.contains_key(&key) {
            let c = Cursor::new(
                self.source.kafka,
                &reader_group(self.source.manifest),
                topic,
                self.partition,
                from,
            )?;
            self.cursors.insert(key.clone(), c);
        }
        Ok(self.cursors.get_mut(&key).expect("inserted above"))
    }

    /// The first `n` records of `topic` from `from`.
    fn records(
        &mut self,
        topic: &str,
        from: i64,
        n: usize,
    ) -> Result<Vec<InputRecord>, KafkaError> {
        self.cursor(topic, false, from)?.first(from, n)
    }

    /// A log's keyed records from `from` up to `to` (exclusive), as one
    /// store's changes: the latest value of each key.
    fn changes(&mut self, topic: &str, from: i64, to: i64) -> Result<Changes, KafkaError> {
        let mut latest = BTreeMap::new();
        for r in self.cursor(topic, true, from)?.take_below(from, to)? {
            if let Some(key) = r.key {
                latest.insert(key, r.value);
            }
        }
        Ok(latest.into_iter().collect())
    }

    /// The next `n` records of a changelog from `from`, as (key, value),
    /// in order.
    fn next_changes(&mut self, topic: &str, from: i64, n: u64) -> Result<Changes, KafkaError> {
        let records = self.cursor(topic, true, from)?.first(from, n as usize)?;
        Ok(records
            .into_iter()
            .map(|r| (r.key.unwrap_or_default(), r.value))
            .collect())
    }
}

/// The replayed task (and the candidate's) over in-memory stores that
/// follow the committed state, transaction by transaction.
struct Replica<'a> {
    source: &'a ReplaySource<'a>,
    partition: i32,
    task: Task,
    candidate: Option<Task>,
    /// Per store, how far its committed copy has read its log.
    at: BTreeMap<String, i64>,
}

impl<'a> Replica<'a> {
    fn new(
        source: &'a ReplaySource<'a>,
        processor: Processor,
        candidate: Option<Processor>,
        partition: i32,
    ) -> Self {
        let task = |p: Processor| {
            Task::new(
                partition,
                p,
                source.config.clone(),
                Box::new(MemoryPartition::default()),
            )
        };
        Self {
            source,
            partition,
            task: task(processor),
            candidate: candidate.map(task),
            at: BTreeMap::new(),
        }
    }

    /// The log of `store`: its changelog, or a table's topic.
    fn log_of(&self, store: &str) -> String {
        let m = self.source.manifest;
        m.tables
            .iter()
            .find(|(s, _)| s == store)
            .map(|(_, topic)| topic.clone())
            .unwrap_or_else(|| super::changelog_topic(m, store))
    }

    /// Brings the committed copies to the positions `record` began at.
    fn catch_up(
        &mut self,
        logs: &mut Logs<'_>,
        transaction: i64,
        record: &ReplayRecord,
    ) -> Result<(), ReplayError> {
        for (store, from, _) in &record.stores {
            let at = self.at.get(store).copied().unwrap_or(0);
            if *from < at {
                // Selected transactions are replayed oldest first, and
                // positions only grow: a log that went back was recreated.
                return Err(ReplayError::Gone {
                    partition: self.partition,
                    transaction,
                    what: format!(
                        "store {store}'s log begins the transaction at {from}, before {at}, \
                         where an earlier one ended: was the topic recreated?"
                    ),
                });
            }
            let changes = logs.changes(&self.log_of(store), at, *from)?;
            self.write(store, changes, *from)?;
        }
        Ok(())
    }

    /// Writes committed changes of `store` to both copies, its log read up
    /// to `position`.
    fn write(&mut self, store: &str, changes: Changes, position: i64) -> Result<(), ReplayError> {
        let batch = WriteBatch {
            changes: vec![StoreChanges {
                store: store.to_owned(),
                changes,
            }],
            positions: vec![(store.to_owned(), position)],
            synced: Vec::new(),
        };
        self.task.write_restored(&batch)?;
        if let Some(c) = self.candidate.as_mut() {
            c.write_restored(&batch)?;
        }
        self.at.insert(store.to_owned(), position);
        Ok(())
    }

    fn run(
        &mut self,
        logs: &mut Logs<'_>,
        transaction: i64,
        committed_at: Option<i64>,
        record: &ReplayRecord,
        request: &ReplayRequest,
    ) -> Result<Replayed, ReplayError> {
        let partition = self.partition;
        self.catch_up(logs, transaction, record)?;
        // The inputs, per source, then in the batches' order.
        let mut per_source = Vec::with_capacity(record.sources.len());
        for (i, (topic, from)) in record.sources.iter().enumerate() {
            let want = record.records_of(i);
            let got = logs.records(topic, *from, want)?;
            if got.len() < want || got.first().is_some_and(|r| r.offset != *from) {
                return Err(ReplayError::Gone {
                    partition,
                    transaction,
                    what: format!(
                        "{topic}/{partition} has {} of its {want} records from offset {from}",
                        got.len()
                    ),
                });
            }
            per_source.push(got.into_iter());
        }
        let batches = record.logged_batches();
        let mut inputs_of = Vec::with_capacity(batches.len());
        for b in &batches {
            let mut records = Vec::with_capacity(b.records());
            for &(s, n) in &b.runs {
                records.extend(per_source[s].by_ref().take(n as usize));
            }
            inputs_of.push(records);
        }
        let before = if request.dump_state {
            Some(self.task.dump_state()?)
        } else {
            None
        };
        self.task.begin_replay(record.time, record.swept);
        let mut verdict = Verdict::Identical;
        let mut outputs = Vec::with_capacity(batches.len());
        for (k, (b, records)) in batches.iter().zip(&inputs_of).enumerate() {
            let mut outcome = BatchOutcome::default();
            let result = self.task.process_batch(records, &mut outcome);
            let got = std::mem::take(&mut outcome.outputs);
            if verdict == Verdict::Identical {
                let span = span(records);
                verdict = match result {
                    Err(TaskError::Host(why)) => return Err(TaskError::Host(why).into()),
                    Err(e) => Verdict::Differs(format!(
                        "batch {k} ({span}) failed in the replay, and committed: {e}"
                    )),
                    Ok(()) if outcome.done < records.len() => Verdict::Differs(format!(
                        "batch {k} ({span}) stopped after {} of its records",
                        outcome.done
                    )),
                    Ok(()) if got.len() != b.outputs as usize => Verdict::Differs(format!(
                        "batch {k} ({span}): the replay emitted {} outputs, the transaction \
                         committed {}",
                        got.len(),
                        b.outputs
                    )),
                    Ok(()) if outputs_digest(&got) != b.digest => Verdict::Differs(format!(
                        "batch {k} ({span}): the replay's {} outputs are not the bytes the \
                         transaction committed (digest {:016x}, committed {:016x}); see \
                         docs/replay.md, \"When a replay differs\"",
                        got.len(),
                        outputs_digest(&got),
                        b.digest
                    )),
                    Ok(()) => Verdict::Identical,
                };
            }
            outputs.push(got);
        }
        let changes = self.task.pending_changes();
        let after = if request.dump_state {
            Some(self.task.dump_state()?)
        } else {
            None
        };
        // What the transaction committed to each store's changelog.
        let mut committed_changes = Vec::new();
        let tables: Vec<&String> = self.source.manifest.tables.iter().map(|(s, _)| s).collect();
        for (store, from, sent) in &record.stores {
            if tables.contains(&store) {
                continue;
            }
            let changes = logs.next_changes(&self.log_of(store), *from, *sent)?;
            if (changes.len() as u64) < *sent {
                return Err(ReplayError::Gone {
                    partition,
                    transaction,
                    what: format!(
                        "store {store}'s changelog has {} of the {sent} records it committed",
                        changes.len()
                    ),
                });
            }
            committed_changes.push(StoreChanges {
                store: store.clone(),
                changes,
            });
        }
        if verdict == Verdict::Identical {
            verdict = compare_changes("the replay", &changes, &committed_changes);
        }
        let candidate = self
            .candidate
            .as_mut()
            .map(|c| run_candidate(c, record, &inputs_of));
        // The copies go back to what committed: the next transaction's
        // catch-up reads this one's changelog records.
        self.task.abort();
        if let Some(c) = self.candidate.as_mut() {
            c.abort();
        }
        Ok(Replayed {
            transaction,
            committed_at,
            record: record.clone(),
            inputs: inputs_of.into_iter().flatten().collect(),
            outputs,
            changes,
            committed_changes,
            verdict,
            candidate,
            state: before.zip(after),
        })
    }
}

/// The candidate's run of the same batches from the same state.
fn run_candidate(
    task: &mut Task,
    record: &ReplayRecord,
    inputs: &[Vec<InputRecord>],
) -> CandidateRun {
    task.begin_replay(record.time, record.swept);
    let mut run = CandidateRun {
        outputs: Vec::with_capacity(inputs.len()),
        changes: Vec::new(),
        failed: None,
    };
    for records in inputs {
        let mut outcome = BatchOutcome::default();
        let result = task.process_batch(records, &mut outcome);
        run.outputs.push(std::mem::take(&mut outcome.outputs));
        if let Err(e) = result {
            run.failed = Some(e.to_string());
            return run;
        }
    }
    run.changes = task.pending_changes();
    run
}

/// Where a batch's records are, in words.
fn span(records: &[InputRecord]) -> String {
    match (records.first(), records.last()) {
        (Some(a), Some(b)) if a.topic == b.topic => {
            format!(
                "{}/{} offsets {}..{}",
                a.topic, a.partition, a.offset, b.offset
            )
        }
        (Some(a), Some(b)) => format!(
            "{}/{}@{} .. {}/{}@{}",
            a.topic, a.partition, a.offset, b.topic, b.partition, b.offset
        ),
        _ => "no records".to_owned(),
    }
}

/// The first difference between state changes a run (`who`: "the
/// replay", "the candidate") wrote and the committed ones, store by store,
/// key by key.
pub fn compare_changes(
    who: &str,
    replayed: &[StoreChanges],
    committed: &[StoreChanges],
) -> Verdict {
    let as_map = |c: &[StoreChanges]| -> BTreeMap<(String, Vec<u8>), Option<Vec<u8>>> {
        c.iter()
            .flat_map(|s| {
                s.changes
                    .iter()
                    .map(|(k, v)| ((s.store.clone(), k.clone()), v.clone()))
            })
            .collect()
    };
    let (ours, theirs) = (as_map(replayed), as_map(committed));
    for key in ours.keys().chain(theirs.keys()) {
        let (a, b) = (ours.get(key), theirs.get(key));
        if a != b {
            let show = |v: Option<&Option<Vec<u8>>>| match v {
                None => "no change".to_owned(),
                Some(None) => "deleted".to_owned(),
                Some(Some(v)) => format!("{:?}", String::from_utf8_lossy(v)),
            };
            return Verdict::Differs(format!(
                "store {} key {:?}: {who} wrote {}, the transaction committed {}",
                key.0,
                String::from_utf8_lossy(&key.1),
                show(a),
                show(b)
            ));
        }
    }
    Verdict::Identical
}
