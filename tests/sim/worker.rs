//! The worker under test: production's protocol (below) over a model of
//! `host/src/stream/worker/`'s I/O: one transactional producer (librdkafka 2.12, transaction version 1) and one
//! group member, processing input records into outputs and a keyed count
//! whose changes go to a changelog at commit, and applying them to its
//! store ("RocksDB") only once the commit returned. Commits are pipelined
//! as in production (`Txn::Committing { flight, frozen, next }`): while one
//! commits, the records that follow go into the next transaction, their
//! outputs held and their counts layered over the frozen changes, and an
//! abort (a rebalance callback's) waits for the commit in flight first.
//!
//! The transaction and its decisions are production's own:
//! `onceflow::stream::protocol` (the worker's [`Txn`], its transitions,
//! [`protocol::decide`], [`protocol::on_rebalance`], [`protocol::after_drain`]),
//! the same code `host/src/stream/worker/` drives over librdkafka. What this
//! file adds is the I/O: the producer (librdkafka 2.12's transactional
//! producer: sequence numbers, `AddPartitionsToTxn` before a partition's
//! first record, an abortable state after a failed produce, an epoch bump on
//! out-of-order), the consumer and the committer's steps 2-4 as requests to
//! the simulated brokers. [`Logic`] switches two rules back to what they
//! were, for the simulation to show it sees their holes: an abort that
//! purged its requests in flight, and a rebalance callback that committed
//! with the rejoined generation.

use std::collections::{BTreeMap, BTreeSet};

use onceflow::stream::protocol::{
    self, AbortEnd, Action, Commit, Drained, Failure, Kinds, Open, Route, Step, Work,
};

use super::kafka::{Broken, Refusal, Topic, Tp, Value};
use super::{Io, Logic, Request, Time};

/// How long an abort waits for its records in flight before it replaces
/// the producer (`ABORT_DRAIN`, scaled to the simulation's clock).
pub const ABORT_DRAIN: Time = 500;
pub const COMMIT_INTERVAL: Time = 20;
/// Records processed behind a commit in flight before the worker waits for
/// it (production: `MAX_HELD_OUTPUT_BYTES`).
const MAX_HELD: usize = 8;

/// The simulation's side of the protocol's types: its clock, a group
/// generation as the group metadata, the committer's stage as the commit in
/// flight, output records, input partitions, and what a transaction's
/// records did to the store.
#[derive(Debug)]
pub struct Sim;

impl Kinds for Sim {
    type Instant = Time;
    type Group = u32;
    type Flight = Stage;
    type Output = (Tp, Value);
    type Input = u32;
    type Work = Changes;
}

/// What a transaction's records did: the store's new values (layered over
/// the store, and over the frozen changes of a commit in flight), and the
/// generations they were read under (for the checker).
#[derive(Debug, Default)]
pub struct Changes {
    pub read_under: BTreeSet<u32>,
    pub changes: BTreeMap<u32, i64>,
}

impl Work for Changes {
    /// Nothing: the model burns no fuel.
    fn carried(&self) -> Changes {
        Changes::default()
    }

    fn carry(&mut self, _dropped: &Changes) {}
}

/// The worker's transaction: production's.
pub type Txn = protocol::Txn<Sim>;

/// Where a commit in flight is (steps 2-4, the committer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for every record to be acknowledged, until the deadline.
    Flush(Time),
    Offsets(u64),
    End(u64),
}

/// A blocking step the worker waits on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// `init_transactions` (request id).
    Init(u64),
    /// Waiting for the aborted transaction's records, until this deadline.
    AbortDrain(Time),
    /// `abort_transaction`'s EndTxn.
    EndAbort(u64),
    /// An abort waits for the commit in flight to return first.
    Flight,
    /// Too much processed behind the commit in flight: wait for it.
    Settle,
}

/// What a request in flight was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    Produce,
    Add,
    Other,
}

#[derive(Debug)]
pub struct Worker {
    pub id: usize,
    pub txnid: String,
    pub incarnation: u32,
    pub alive: bool,
    pub paused_until: Option<Time>,
    pub logic: Logic,
    // The producer.
    pub pid: u32,
    pub epoch: u16,
    pub next_seq: BTreeMap<Tp, u32>,
    pub in_flight: BTreeMap<u64, Sent>,
    pub added: BTreeSet<Tp>,
    /// Records waiting for their partition's `AddPartitionsToTxn`.
    pub waiting_add: Vec<(Tp, u32, Value)>,
    /// A produce request failed: the transaction must abort (and, with
    /// `true`, the epoch be bumped: librdkafka's "requires epoch bump").
    pub abortable: Option<bool>,
    // The consumer.
    pub generation: Option<u32>,
    pub assignment: BTreeSet<u32>,
    pub positions: BTreeMap<u32, u64>,
    /// Partitions whose store is restored from the changelog (RocksDB in
    /// production): an abort keeps it (only the transaction's pending
    /// changes go), an unknown outcome, a new session or a rebalance
    /// restores it again, as production does.
    pub restored: BTreeSet<u32>,
    // The transaction and the store.
    pub txn: Txn,
    pub store: BTreeMap<u32, i64>,
    pub blocked: Option<Blocked>,
}

/// An input record.
#[derive(Debug, Clone, Copy)]
pub struct Input {
    pub id: u64,
    pub key: u32,
}

pub const OUTPUT_PARTITIONS: u32 = 3;

impl Worker {
    pub fn new(id: usize, logic: Logic) -> Worker {
        Worker {
            id,
            txnid: format!("app-w{id}"),
            incarnation: 0,
            alive: true,
            paused_until: None,
            logic,
            pid: 0,
            epoch: 0,
            next_seq: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            added: BTreeSet::new(),
            waiting_add: Vec::new(),
            abortable: None,
            generation: None,
            assignment: BTreeSet::new(),
            positions: BTreeMap::new(),
            restored: BTreeSet::new(),
            txn: Txn::Idle,
            store: BTreeMap::new(),
            blocked: None,
        }
    }

    /// A new incarnation (a start, a restart after a crash, or a new
    /// producer): `init_transactions` first.
    pub fn start(&mut self, io: &mut Io) {
        self.incarnation += 1;
        self.alive = true;
        self.paused_until = None;
        self.in_flight.clear();
        self.waiting_add.clear();
        self.next_seq.clear();
        self.added.clear();
        self.abortable = None;
        self.txn = Txn::Idle;
        let req = io.send(self, Request::InitPid);
        self.in_flight.insert(req, Sent::Other);
        self.blocked = Some(Blocked::Init(req));
    }

    /// A new producer under the same transactional id (its
    /// `init_transactions` aborts the open transaction and fences the old
    /// producer); the worker's consumer and membership stay.
    fn replace_producer(&mut self, io: &mut Io) {
        let (generation, assignment, positions) = (
            self.generation,
            std::mem::take(&mut self.assignment),
            std::mem::take(&mut self.positions),
        );
        self.start(io);
        self.generation = generation;
        self.assignment = assignment;
        self.positions = positions;
    }

    pub fn busy(&self) -> bool {
        !self.txn.is_idle()
    }

    /// One round of the loop.
    pub fn tick(&mut self, io: &mut Io, inputs: &BTreeMap<u32, Vec<Input>>) {
        if !self.alive || self.paused_until.is_some() {
            return;
        }
        match self.blocked {
            Some(Blocked::AbortDrain(deadline)) => {
                let drained = if self.flushed() {
                    Drained::All
                } else if io.now >= deadline {
                    Drained::Unacknowledged(self.in_flight.len() as u64)
                } else {
                    return;
                };
                match protocol::after_drain(drained) {
                    AbortEnd::EndTxn => self.end_abort(io),
                    AbortEnd::ReplaceProducer => {
                        // Still unacknowledged: a new epoch fences them.
                        io.note("abort drain timed out: producer replaced");
                        self.forget_and_rewind(io);
                        self.replace_producer(io);
                    }
                }
                return;
            }
            Some(Blocked::Flight | Blocked::Settle) => {
                // The committer goes on meanwhile (its flush is watched
                // here).
                self.watch_flush(io);
                return;
            }
            Some(_) => return,
            None => {}
        }
        self.watch_flush(io);
        if self.blocked.is_some() || !self.alive {
            return;
        }
        // The group, as the consumer's poll serves it: a member that was
        // expired rejoins, and a new generation's callbacks run.
        if self.generation.is_some() && !io.kafka.members.contains_key(&self.id) {
            io.join(self.id);
        }
        let generation = io.kafka.generation;
        if io.kafka.members.contains_key(&self.id) && self.generation != Some(generation) {
            self.on_rebalance(io, generation);
            if self.blocked.is_some() {
                return;
            }
        }
        if let (Some(bump), Txn::Open(_)) = (self.abortable, &self.txn) {
            return self.abort(io, bump);
        }
        let due = match &self.txn {
            Txn::Open(t) => io.now.saturating_sub(t.started) >= COMMIT_INTERVAL,
            _ => false,
        };
        if due {
            return self.start_commit(io);
        }
        self.process_one(io, inputs);
    }

    /// The committer's step 2 (flush), then step 3 (the offsets).
    fn watch_flush(&mut self, io: &mut Io) {
        let Some(&Stage::Flush(deadline)) = self.txn.flight() else {
            return;
        };
        if self.flushed() {
            if self.abortable.is_some() {
                // Records of it were not delivered: the commit failed.
                return self.act(io, Step::Delivery, Failure::Abortable);
            }
            self.send_offsets(io);
        } else if io.now >= deadline {
            // The flush timed out.
            self.act(io, Step::Call, Failure::TimedOut);
        }
    }

    /// The rebalance callbacks (pre- and post-rebalance in one).
    fn on_rebalance(&mut self, io: &mut Io, generation: u32) {
        let new: BTreeSet<u32> = io.kafka.members.get(&self.id).cloned().unwrap_or_default();
        let kept = match self.generation {
            Some(g) => io.kafka.owned_throughout(self.id, g),
            None => BTreeSet::new(),
        };
        self.positions.retain(|p, _| kept.contains(p));
        self.restored.retain(|p| kept.contains(p));
        self.generation = Some(generation);
        self.assignment = new;
        if self.logic.commit_in_callback && self.busy() {
            // The hole: commit what is open, under the generation the
            // member holds now.
            io.note("callback commits the open transaction");
            if let Txn::Open(_) = self.txn {
                self.start_commit(io);
            }
            return;
        }
        // Production: a transaction never spans a rebalance.
        if protocol::on_rebalance(&self.txn) == Some(Action::Abort) {
            io.note("callback aborts the open transaction");
            self.abort(io, false);
        }
    }

    /// Reads and processes one record of an assigned partition.
    fn process_one(&mut self, io: &mut Io, inputs: &BTreeMap<u32, Vec<Input>>) {
        let Some(generation) = self.generation else {
            return;
        };
        if self.txn.route() == Route::Hold
            && self.txn.current().is_some_and(|n| n.held.len() >= MAX_HELD)
        {
            self.blocked = Some(Blocked::Settle);
            return;
        }
        let candidates: Vec<u32> = self.assignment.iter().copied().collect();
        if candidates.is_empty() {
            return;
        }
        let p = candidates[io.rng.below(candidates.len() as u64) as usize];
        let position = match self.positions.get(&p) {
            Some(&pos) => pos,
            None => {
                // KIP-447: the committed offset is read only once no
                // transaction has offsets pending on it (require_stable).
                if io.kafka.pending_offsets(p) {
                    return;
                }
                let pos = io.kafka.committed.get(&p).copied().unwrap_or(0);
                // Restore the partition's keys from the committed changelog
                // (a rewind after an abort keeps them).
                if self.restored.insert(p) {
                    for input in &inputs[&p] {
                        match io.kafka.state.get(&input.key) {
                            Some(v) => self.store.insert(input.key, *v),
                            None => self.store.remove(&input.key),
                        };
                    }
                }
                self.positions.insert(p, pos);
                pos
            }
        };
        let Some(input) = inputs[&p].get(position as usize).copied() else {
            return;
        };
        let now = io.now;
        let ensured = self.txn.ensure::<()>(
            || Open::new(now, Some(generation), Changes::default()),
            // begin_transaction is local to librdkafka.
            || Ok(()),
        );
        debug_assert!(ensured.is_ok());
        let route = self.txn.route();
        let below = self
            .txn
            .frozen()
            .and_then(|f| f.work.changes.get(&input.key))
            .or(self.store.get(&input.key))
            .copied();
        let open = self.txn.receiving();
        open.work.read_under.insert(generation);
        open.offsets.insert(p, position as i64 + 1);
        let count = open
            .work
            .changes
            .get(&input.key)
            .copied()
            .or(below)
            .unwrap_or(0);
        open.work.changes.insert(input.key, count + 1);
        self.positions.insert(p, position + 1);
        let tp = (Topic::Output, (input.id % OUTPUT_PARTITIONS as u64) as u32);
        let value = Value::Output { input: input.id };
        match route {
            Route::Hold => open.held.push((tp, value)),
            Route::Send => self.produce(io, tp, value),
        }
    }

    /// `produce()`: the sequence number is taken now; the record waits for
    /// its partition to be added to the transaction.
    fn produce(&mut self, io: &mut Io, tp: Tp, value: Value) {
        let seq = self.next_seq.entry(tp).or_insert(0);
        let s = *seq;
        *seq += 1;
        if self.added.contains(&tp) {
            let req = io.send(self, Request::Produce { tp, seq: s, value });
            self.in_flight.insert(req, Sent::Produce);
        } else {
            if !self.waiting_add.iter().any(|(t, _, _)| *t == tp) {
                let req = io.send(self, Request::Add { tp });
                self.in_flight.insert(req, Sent::Add);
            }
            self.waiting_add.push((tp, s, value));
        }
    }

    fn flushed(&self) -> bool {
        self.in_flight.is_empty() && self.waiting_add.is_empty()
    }

    /// Step 1, then steps 2-4 on the committer while the worker goes on.
    fn start_commit(&mut self, io: &mut Io) {
        let Some(open) = self.txn.freeze(io.now) else {
            return;
        };
        for (&key, &value) in &open.work.changes {
            let tp = (Topic::Changelog, io.partition_of(key));
            self.produce(io, tp, Value::Change { key, value });
        }
        self.txn
            .committing(Stage::Flush(io.now + io.request_timeout), open);
    }

    /// Step 3: the offsets, with the group metadata.
    fn send_offsets(&mut self, io: &mut Io) {
        let Some(frozen) = self.txn.frozen() else {
            return;
        };
        let first = frozen.group.expect("the generation of its first record");
        let generation = if self.logic.metadata_at_start {
            first
        } else {
            self.generation.unwrap_or(first)
        };
        let request = Request::Offsets {
            generation,
            offsets: frozen
                .offsets
                .iter()
                .map(|(&p, &next)| (p, next as u64))
                .collect(),
            read_under: frozen.work.read_under.clone(),
        };
        let req = io.send(self, request);
        self.in_flight.insert(req, Sent::Other);
        self.stage(Stage::Offsets(req));
    }

    /// The commit in flight committed: step 5, then the next transaction
    /// (or, under an abort that waited for it, the abort of what came
    /// after it, which never began at the producer).
    fn committed(&mut self, io: &mut Io) {
        let Some(Commit { frozen, next, .. }) = self.txn.take_flight() else {
            return;
        };
        for (&key, &value) in &frozen.work.changes {
            if !io.kafka.ever.get(&key).is_some_and(|v| v.contains(&value)) {
                io.kafka.broken.push(Broken::Uncommitted {
                    worker: self.id,
                    key,
                    value,
                });
            }
        }
        self.store.extend(frozen.work.changes);
        self.added.clear();
        io.commits += 1;
        if self.blocked == Some(Blocked::Flight) {
            self.blocked = None;
            return self.forget_and_rewind(io);
        }
        if self.blocked == Some(Blocked::Settle) {
            self.blocked = None;
        }
        // begin_transaction is local to librdkafka.
        let held = self
            .txn
            .begin_next::<()>(next, || Ok(()))
            .unwrap_or_default();
        for (tp, value) in held {
            self.produce(io, tp, value);
        }
    }

    /// The commit in flight failed: it is still the producer's open
    /// transaction; it aborts, and what came after it with it.
    fn failed_commit(&mut self, io: &mut Io, bump: bool) {
        let Some(Commit { frozen, next, .. }) = self.txn.take_flight() else {
            return;
        };
        if self.blocked == Some(Blocked::Flight) || self.blocked == Some(Blocked::Settle) {
            self.blocked = None;
        }
        let _dropped = self.txn.failed(frozen, next);
        self.abort(io, bump);
    }

    /// Aborts the open transaction: production waits for its records in
    /// flight (bounded); the old logic purged them. Under a commit in
    /// flight, the commit ends first.
    pub fn abort(&mut self, io: &mut Io, bump: bool) {
        if self.txn.flight().is_some() {
            self.blocked = Some(Blocked::Flight);
            return;
        }
        if bump {
            // librdkafka's abort with an epoch bump: InitProducerId.
            self.forget_and_rewind(io);
            return self.replace_producer(io);
        }
        if self.logic.purge_in_flight {
            let purged = self
                .in_flight
                .values()
                .filter(|s| **s == Sent::Produce)
                .count()
                + self.waiting_add.len();
            if purged > 0 {
                io.note("abort purges records in flight");
            }
            self.in_flight.clear();
            self.waiting_add.clear();
            return self.end_abort(io);
        }
        self.blocked = Some(Blocked::AbortDrain(io.now + ABORT_DRAIN));
    }

    fn end_abort(&mut self, io: &mut Io) {
        if !io.kafka.open(&self.txnid) && self.added.is_empty() {
            // Nothing reached the coordinator: nothing to end there.
            self.blocked = None;
            return self.forget_and_rewind(io);
        }
        let req = io.send(self, Request::End { commit: false });
        self.in_flight.insert(req, Sent::Other);
        self.blocked = Some(Blocked::EndAbort(req));
    }

    /// An outcome that is not known: a new producer (a new epoch), the
    /// stores reloaded from their changelogs, the input rewound.
    fn abort_unknown(&mut self, io: &mut Io) {
        io.note("outcome unknown: producer replaced, stores reloaded");
        self.forget_and_rewind(io);
        self.restored.clear();
        self.replace_producer(io);
    }

    /// Drops the transaction in the worker and reads the input again from
    /// the committed offsets (the store reloads on the next read).
    fn forget_and_rewind(&mut self, io: &mut Io) {
        let _burned = self.txn.forget();
        self.added.clear();
        self.abortable = None;
        self.blocked = None;
        self.positions.clear();
        io.aborts += 1;
    }

    /// A response to request `req`.
    pub fn on_response(&mut self, io: &mut Io, req: u64, answer: Answer) {
        let Some(sent) = self.in_flight.remove(&req) else {
            return; // purged, or of an earlier producer
        };
        let stage = self.txn.flight().copied();
        match (answer, sent) {
            (Answer::Init { pid, epoch }, _) if self.blocked == Some(Blocked::Init(req)) => {
                self.pid = pid;
                self.epoch = epoch;
                self.blocked = None;
                if self.generation.is_none() {
                    io.join(self.id);
                }
            }
            (Answer::Added { tp }, _) => {
                self.added.insert(tp);
                let (go, stay): (Vec<_>, Vec<_>) =
                    self.waiting_add.drain(..).partition(|(t, _, _)| *t == tp);
                self.waiting_add = stay;
                for (tp, seq, value) in go {
                    let r = io.send(self, Request::Produce { tp, seq, value });
                    self.in_flight.insert(r, Sent::Produce);
                }
            }
            (Answer::Acked, Sent::Produce) => {}
            (Answer::Refused(why), Sent::Produce | Sent::Add) => {
                // A failed produce (or add): the transaction must abort;
                // out of order needs an epoch bump, fenced ends the session.
                match why {
                    Refusal::Fenced => self.fenced(io),
                    Refusal::OutOfOrder => self.abortable = Some(true),
                    _ => {
                        self.abortable.get_or_insert(false);
                    }
                }
                if sent == Sent::Add {
                    self.waiting_add.clear();
                }
            }
            (Answer::Acked, _) if stage == Some(Stage::Offsets(req)) => {
                let end = io.send(self, Request::End { commit: true });
                self.in_flight.insert(end, Sent::Other);
                self.stage(Stage::End(end));
            }
            (Answer::Refused(why), _) if stage == Some(Stage::Offsets(req)) => {
                self.act(io, Step::Call, why.failure());
            }
            (Answer::Acked, _) if stage == Some(Stage::End(req)) => self.committed(io),
            (Answer::Refused(why), _) if stage == Some(Stage::End(req)) => {
                self.act(io, Step::EndTxn, why.failure());
            }
            (Answer::Acked, _) if self.blocked == Some(Blocked::EndAbort(req)) => {
                self.forget_and_rewind(io);
            }
            (Answer::Refused(why), _) if self.blocked == Some(Blocked::EndAbort(req)) => {
                // A refused EndTxn abort: the producer is replaced
                // (protocol::AbortEnd::ReplaceProducer), unless fenced.
                match why {
                    Refusal::Fenced => self.fenced(io),
                    _ => {
                        self.forget_and_rewind(io);
                        self.replace_producer(io);
                    }
                }
            }
            _ => {}
        }
    }

    /// A request timed out: its outcome is unknown.
    pub fn on_timeout(&mut self, io: &mut Io, req: u64) {
        let Some(sent) = self.in_flight.remove(&req) else {
            return;
        };
        let step = match (sent, self.txn.flight()) {
            (Sent::Produce, _) => Step::Delivery,
            (_, Some(&Stage::End(end))) if end == req => Step::EndTxn,
            _ => Step::Call,
        };
        match self.blocked {
            Some(Blocked::Init(r)) if r == req => self.start(io),
            _ => self.act(io, step, Failure::TimedOut),
        }
    }

    /// Acts on a failure as production does ([`protocol::decide`]).
    fn act(&mut self, io: &mut Io, step: Step, failure: Failure) {
        match protocol::decide(step, failure, true) {
            Action::Abort => {
                // librdkafka bumps the epoch on its abort after an
                // out-of-order produce.
                let bump = self.abortable == Some(true);
                if self.txn.flight().is_some() {
                    self.failed_commit(io, bump);
                } else {
                    self.abort(io, bump);
                }
            }
            Action::AbortUnknown => self.abort_unknown(io),
            Action::AbortAndEnd | Action::End => self.fenced(io),
        }
    }

    /// The commit in flight moved on to `stage`.
    fn stage(&mut self, stage: Stage) {
        if let Txn::Committing { flight, .. } = &mut self.txn {
            *flight = stage;
        }
    }

    /// Fenced: the session ends; a new one starts with a new producer and
    /// reads from the committed offsets.
    fn fenced(&mut self, io: &mut Io) {
        io.note("fenced: new session");
        self.forget_and_rewind(io);
        self.restored.clear();
        self.replace_producer(io);
    }
}

/// A broker's answer.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    Init { pid: u32, epoch: u16 },
    Added { tp: Tp },
    Acked,
    Refused(Refusal),
}

impl Refusal {
    /// The refusal as the protocol tells failures apart.
    fn failure(self) -> Failure {
        match self {
            Refusal::Fenced => Failure::ProducerFenced,
            Refusal::IllegalGeneration => Failure::StaleGeneration,
            Refusal::InvalidTxnState | Refusal::OutOfOrder => Failure::Abortable,
        }
    }
}
