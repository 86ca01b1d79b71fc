//! The worker under test, as a model of `host/src/stream/worker/`: one
//! transactional producer (librdkafka 2.12, transaction version 1) and one
//! group member, processing input records into outputs and a keyed count
//! whose changes go to a changelog at commit, and applying them to its
//! store ("RocksDB") only once the commit returned. Commits are pipelined
//! as in production (`Txn::Committing { flight, next }`): while one commits,
//! the records that follow go into the next transaction, their outputs held
//! and their counts layered over the frozen changes, and an abort (a
//! rebalance callback's) waits for the commit in flight first.
//!
//! The protocol's decisions follow the production code, with the variants
//! that the simulation must be able to tell apart ([`Logic`]): how an abort
//! treats produce requests in flight, and which group metadata a
//! transaction's offsets carry and whether a rebalance callback may commit.
//! It is a model: the production worker is not driven by it yet (see
//! tests/simulate.rs).

use std::collections::{BTreeMap, BTreeSet};

use super::kafka::{Broken, Refusal, Topic, Tp, Value};
use super::{Io, Logic, Request, Time};

/// How long an abort waits for its records in flight before it replaces
/// the producer (`ABORT_DRAIN`, scaled to the simulation's clock).
pub const ABORT_DRAIN: Time = 500;
pub const COMMIT_INTERVAL: Time = 20;
/// Records processed behind a commit in flight before the worker waits for
/// it (production: `MAX_HELD_OUTPUT_BYTES`).
const MAX_HELD: usize = 8;

/// A transaction's records.
#[derive(Debug, Default)]
pub struct Open {
    pub started: Time,
    /// The generation when its first record was read.
    pub generation: u32,
    pub read_under: BTreeSet<u32>,
    pub offsets: BTreeMap<u32, u64>,
    /// The store's new values (layered over the store, and over the
    /// frozen changes of a commit in flight).
    pub changes: BTreeMap<u32, i64>,
    /// Outputs held until the producer's transaction begins (behind a
    /// commit in flight).
    pub held: Vec<(Tp, Value)>,
}

/// Where a commit in flight is (steps 2-4, the committer's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for every record to be acknowledged, until the deadline.
    Flush(Time),
    Offsets(u64),
    End(u64),
}

/// The worker's transaction (production: `Txn`).
#[derive(Debug, Default)]
pub enum Txn {
    #[default]
    Idle,
    Open(Open),
    Committing {
        frozen: Open,
        stage: Stage,
        next: Option<Open>,
    },
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
        !matches!(self.txn, Txn::Idle)
    }

    /// One round of the loop.
    pub fn tick(&mut self, io: &mut Io, inputs: &BTreeMap<u32, Vec<Input>>) {
        if !self.alive || self.paused_until.is_some() {
            return;
        }
        match self.blocked {
            Some(Blocked::AbortDrain(deadline)) => {
                if self.flushed() {
                    self.end_abort(io);
                } else if io.now >= deadline {
                    // Still unacknowledged: a new epoch fences them.
                    io.note("abort drain timed out: producer replaced");
                    self.forget_and_rewind(io);
                    self.replace_producer(io);
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
        let Txn::Committing {
            stage: Stage::Flush(deadline),
            ..
        } = self.txn
        else {
            return;
        };
        if self.flushed() {
            if let Some(bump) = self.abortable {
                // Records of it were not delivered: the commit failed.
                return self.failed_commit(io, bump);
            }
            self.send_offsets(io);
        } else if io.now >= deadline {
            self.abort_unknown(io);
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
        self.generation = Some(generation);
        self.assignment = new;
        if !self.busy() {
            return;
        }
        if self.logic.commit_in_callback {
            // The hole: commit what is open, under the generation the
            // member holds now.
            io.note("callback commits the open transaction");
            if let Txn::Open(_) = self.txn {
                self.start_commit(io);
            }
            return;
        }
        // Production: a transaction never spans a rebalance.
        io.note("callback aborts the open transaction");
        self.abort(io, false);
    }

    /// Reads and processes one record of an assigned partition.
    fn process_one(&mut self, io: &mut Io, inputs: &BTreeMap<u32, Vec<Input>>) {
        let Some(generation) = self.generation else {
            return;
        };
        if let Txn::Committing { next: Some(n), .. } = &self.txn
            && n.held.len() >= MAX_HELD
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
                // Restore the partition's keys from the committed changelog.
                for input in &inputs[&p] {
                    match io.kafka.state.get(&input.key) {
                        Some(v) => self.store.insert(input.key, *v),
                        None => self.store.remove(&input.key),
                    };
                }
                self.positions.insert(p, pos);
                pos
            }
        };
        let Some(input) = inputs[&p].get(position as usize).copied() else {
            return;
        };
        let fresh = || Open {
            started: io.now,
            generation,
            ..Open::default()
        };
        let (open, frozen) = match &mut self.txn {
            Txn::Idle => {
                self.txn = Txn::Open(fresh());
                let Txn::Open(open) = &mut self.txn else {
                    unreachable!()
                };
                (open, None)
            }
            Txn::Open(open) => (open, None),
            Txn::Committing { frozen, next, .. } => {
                (next.get_or_insert_with(fresh), Some(&*frozen))
            }
        };
        open.read_under.insert(generation);
        open.offsets.insert(p, position + 1);
        let count = open
            .changes
            .get(&input.key)
            .or(frozen.and_then(|f| f.changes.get(&input.key)))
            .or(self.store.get(&input.key))
            .copied()
            .unwrap_or(0);
        open.changes.insert(input.key, count + 1);
        self.positions.insert(p, position + 1);
        let tp = (Topic::Output, (input.id % OUTPUT_PARTITIONS as u64) as u32);
        let value = Value::Output { input: input.id };
        if frozen.is_some() {
            open.held.push((tp, value));
        } else {
            self.produce(io, tp, value);
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
        let Txn::Open(open) = std::mem::take(&mut self.txn) else {
            return;
        };
        for (&key, &value) in &open.changes {
            let tp = (Topic::Changelog, io.partition_of(key));
            self.produce(io, tp, Value::Change { key, value });
        }
        self.txn = Txn::Committing {
            frozen: open,
            stage: Stage::Flush(io.now + io.request_timeout),
            next: None,
        };
    }

    /// Step 3: the offsets, with the group metadata.
    fn send_offsets(&mut self, io: &mut Io) {
        let Txn::Committing { frozen, .. } = &self.txn else {
            return;
        };
        let generation = if self.logic.metadata_at_start {
            frozen.generation
        } else {
            self.generation.unwrap_or(frozen.generation)
        };
        let request = Request::Offsets {
            generation,
            offsets: frozen.offsets.clone(),
            read_under: frozen.read_under.clone(),
        };
        let req = io.send(self, request);
        self.in_flight.insert(req, Sent::Other);
        if let Txn::Committing { stage, .. } = &mut self.txn {
            *stage = Stage::Offsets(req);
        }
    }

    /// The commit in flight committed: step 5, then the next transaction
    /// (or, under an abort that waited for it, the abort of what came
    /// after it, which never began at the producer).
    fn committed(&mut self, io: &mut Io) {
        let Txn::Committing { frozen, next, .. } = std::mem::take(&mut self.txn) else {
            return;
        };
        for (&key, &value) in &frozen.changes {
            if !io.kafka.ever.get(&key).is_some_and(|v| v.contains(&value)) {
                io.kafka.broken.push(Broken::Uncommitted {
                    worker: self.id,
                    key,
                    value,
                });
            }
        }
        self.store.extend(frozen.changes);
        self.added.clear();
        io.commits += 1;
        if self.blocked == Some(Blocked::Flight) {
            self.blocked = None;
            return self.forget_and_rewind(io);
        }
        if self.blocked == Some(Blocked::Settle) {
            self.blocked = None;
        }
        let Some(mut next) = next else {
            return;
        };
        let held = std::mem::take(&mut next.held);
        self.txn = Txn::Open(next);
        for (tp, value) in held {
            self.produce(io, tp, value);
        }
    }

    /// The commit in flight failed: it is still the producer's open
    /// transaction; it aborts, and what came after it with it.
    fn failed_commit(&mut self, io: &mut Io, bump: bool) {
        let Txn::Committing { frozen, .. } = std::mem::take(&mut self.txn) else {
            return;
        };
        if self.blocked == Some(Blocked::Flight) || self.blocked == Some(Blocked::Settle) {
            self.blocked = None;
        }
        self.txn = Txn::Open(frozen);
        self.abort(io, bump);
    }

    /// Aborts the open transaction: production waits for its records in
    /// flight (bounded); the old logic purged them. Under a commit in
    /// flight, the commit ends first.
    pub fn abort(&mut self, io: &mut Io, bump: bool) {
        if let Txn::Committing { .. } = self.txn {
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
        io.note("outcome unknown: producer replaced");
        self.forget_and_rewind(io);
        self.replace_producer(io);
    }

    /// Drops the transaction in the worker and reads the input again from
    /// the committed offsets (the store reloads on the next read).
    fn forget_and_rewind(&mut self, io: &mut Io) {
        self.txn = Txn::Idle;
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
        let stage = match &self.txn {
            Txn::Committing { stage, .. } => Some(*stage),
            _ => None,
        };
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
                if let Txn::Committing { stage, .. } = &mut self.txn {
                    *stage = Stage::End(end);
                }
            }
            (Answer::Refused(why), _) if stage == Some(Stage::Offsets(req)) => match why {
                Refusal::Fenced => self.fenced(io),
                // A rebalance moved on: abort and read again.
                _ => self.failed_commit(io, false),
            },
            (Answer::Acked, _) if stage == Some(Stage::End(req)) => self.committed(io),
            (Answer::Refused(why), _) if stage == Some(Stage::End(req)) => match why {
                Refusal::Fenced => self.fenced(io),
                // A failed EndTxn: the outcome is not known.
                _ => self.abort_unknown(io),
            },
            (Answer::Acked, _) if self.blocked == Some(Blocked::EndAbort(req)) => {
                self.forget_and_rewind(io);
            }
            (Answer::Refused(why), _) if self.blocked == Some(Blocked::EndAbort(req)) => {
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
        if self.in_flight.remove(&req).is_none() {
            return;
        }
        match self.blocked {
            Some(Blocked::Init(r)) if r == req => self.start(io),
            _ => self.abort_unknown(io),
        }
    }

    /// Fenced: the session ends; a new one starts with a new producer and
    /// reads from the committed offsets.
    fn fenced(&mut self, io: &mut Io) {
        io.note("fenced: new session");
        self.forget_and_rewind(io);
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
