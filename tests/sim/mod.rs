//! A deterministic simulation of the exactly-once protocol (issue 41): a
//! seeded scheduler runs workers ([`worker`]) against a simulated Kafka
//! ([`kafka`]) over a simulated network, injects faults, and checks the
//! invariants after every step. A seed is a whole run: the same seed runs
//! the same way, so a failing one replays with its trace.
//!
//! Faults, while the fault phase lasts: a broker's connections slowed (50
//! to 400 ms each way: requests arrive late, after what was sent after
//! them on other connections), responses dropped (the client times out,
//! the outcome unknown), produce requests delivered twice, rebalances at
//! any step (the callbacks run inside the next poll), workers crashed and
//! restarted, workers paused past their session timeout (zombies), and the
//! coordinator aborting transactions past their timeout. Then the faults
//! stop and every input must be committed within a bound.
//!
//! Invariants: each input record's output is committed exactly once in the
//! read_committed output; no transaction commits offsets under a
//! generation other than the one its records were read under; the state
//! folded from the committed changelog is the exact count per key, and
//! what each worker's store holds for its partitions is that; every
//! partition makes progress once faults stop.

pub mod kafka;
pub mod worker;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};

use kafka::{Kafka, Topic, Tp, Value};
use worker::{Answer, Input, Worker};

/// Simulated milliseconds.
pub type Time = u64;

const BROKERS: u32 = 3;
const INPUT_PARTITIONS: u32 = 3;
const RECORDS_PER_PARTITION: u64 = 24;
const KEYS_PER_PARTITION: u32 = 3;
const WORKERS: usize = 2;
const FAULT_PHASE: Time = 1_500;
/// Once the faults stop, everything must be committed within this.
const PROGRESS_BOUND: Time = 30_000;
const SESSION_TIMEOUT: Time = 300;
const TXN_TIMEOUT: Time = 3_000;
const REQUEST_TIMEOUT: Time = 1_000;

/// The protocol variants the simulation tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logic {
    /// An abort purges the produce requests in flight (before issue 41's
    /// fix) instead of waiting for them.
    pub purge_in_flight: bool,
    /// A transaction's offsets carry the group metadata of when its first
    /// record was read (else the member's current one).
    pub metadata_at_start: bool,
    /// A rebalance callback commits the open transaction (else aborts it).
    pub commit_in_callback: bool,
}

impl Logic {
    /// Today's production logic.
    pub const PRODUCTION: Logic = Logic {
        purge_in_flight: false,
        metadata_at_start: true,
        commit_in_callback: false,
    };
    /// The abort before issue 41's fix.
    pub const PURGE: Logic = Logic {
        purge_in_flight: true,
        ..Logic::PRODUCTION
    };
    /// Without the guard against a late revoke callback: it commits, with
    /// the rejoined generation.
    pub const LATE_REVOKE: Logic = Logic {
        purge_in_flight: false,
        metadata_at_start: false,
        commit_in_callback: true,
    };

    pub fn named(name: &str) -> Option<Logic> {
        match name {
            "production" => Some(Logic::PRODUCTION),
            "purge" => Some(Logic::PURGE),
            "late-revoke" => Some(Logic::LATE_REVOKE),
            _ => None,
        }
    }
}

/// SplitMix64: small, seeded, the same on every machine.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }
}

/// What a client sends.
#[derive(Debug, Clone)]
pub enum Request {
    InitPid,
    Add {
        tp: Tp,
    },
    Produce {
        tp: Tp,
        seq: u32,
        value: Value,
    },
    Offsets {
        generation: u32,
        offsets: BTreeMap<u32, u64>,
        read_under: BTreeSet<u32>,
    },
    End {
        commit: bool,
    },
}

#[derive(Debug, Clone)]
struct Envelope {
    worker: usize,
    incarnation: u32,
    req: u64,
    txnid: String,
    pid: u32,
    epoch: u16,
    broker: u32,
    request: Request,
}

#[derive(Debug, Clone)]
enum Event {
    Tick(usize),
    Deliver(Envelope),
    Respond {
        worker: usize,
        incarnation: u32,
        req: u64,
        answer: Answer,
    },
    Timeout {
        worker: usize,
        incarnation: u32,
        req: u64,
    },
    Fault,
    Expire(usize),
    Restart(usize),
    Resume(usize),
    Scan,
}

/// Faults injected, by kind.
#[derive(Debug, Default, Clone)]
pub struct Faults {
    pub slow: u64,
    pub dropped: u64,
    pub duplicated: u64,
    pub rebalances: u64,
    pub crashes: u64,
    pub zombies: u64,
    pub expired_txns: u64,
}

impl Faults {
    pub fn add(&mut self, o: &Faults) {
        self.slow += o.slow;
        self.dropped += o.dropped;
        self.duplicated += o.duplicated;
        self.rebalances += o.rebalances;
        self.crashes += o.crashes;
        self.zombies += o.zombies;
        self.expired_txns += o.expired_txns;
    }
}

/// What the workers share: the clock, the randomness, the brokers and the
/// network.
pub struct Io {
    pub now: Time,
    pub rng: Rng,
    pub kafka: Kafka,
    pub request_timeout: Time,
    queue: BinaryHeap<Reverse<(Time, u64)>>,
    events: HashMap<u64, Event>,
    next_event: u64,
    next_req: u64,
    /// The last delivery time per connection (worker, incarnation, broker,
    /// direction): TCP keeps a connection's order.
    conn_last: HashMap<(usize, u32, u32, bool), Time>,
    slow_until: BTreeMap<u32, Time>,
    drop_until: BTreeMap<u32, Time>,
    duplicate_until: Time,
    pub faults: Faults,
    pub commits: u64,
    pub aborts: u64,
    trace: Option<Vec<String>>,
}

impl Io {
    fn schedule(&mut self, at: Time, event: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.queue.push(Reverse((at, id)));
        self.events.insert(id, event);
    }

    /// A line of the trace (kept only when replaying a seed).
    pub fn note(&mut self, text: &str) {
        if let Some(trace) = &mut self.trace {
            trace.push(format!("{:>6} ms  {text}", self.now));
        }
    }

    fn delay(&mut self, broker: u32) -> Time {
        if self.slow_until.get(&broker).is_some_and(|t| *t > self.now) {
            self.rng.range(50, 400)
        } else {
            self.rng.range(1, 3)
        }
    }

    /// When a message sent now on a connection arrives (after what was sent
    /// before it there).
    fn arrival(&mut self, key: (usize, u32, u32, bool), broker: u32) -> Time {
        let at =
            (self.now + self.delay(broker)).max(self.conn_last.get(&key).copied().unwrap_or(0));
        self.conn_last.insert(key, at);
        at
    }

    pub fn partition_of(&self, key: u32) -> u32 {
        key / KEYS_PER_PARTITION
    }

    /// Sends `request` for worker `w`; returns its id.
    pub fn send(&mut self, w: &Worker, request: Request) -> u64 {
        self.next_req += 1;
        let req = self.next_req;
        let broker = match &request {
            Request::Produce { tp, .. } => leader(*tp),
            _ => coordinator(&w.txnid),
        };
        if let Some(trace) = &mut self.trace {
            trace.push(format!(
                "{:>6} ms  w{} #{req} -> b{broker}: {request:?} (pid {} epoch {})",
                self.now, w.id, w.pid, w.epoch
            ));
        }
        let envelope = Envelope {
            worker: w.id,
            incarnation: w.incarnation,
            req,
            txnid: w.txnid.clone(),
            pid: w.pid,
            epoch: w.epoch,
            broker,
            request,
        };
        let at = self.arrival((w.id, w.incarnation, broker, true), broker);
        if matches!(envelope.request, Request::Produce { .. }) && self.duplicate_until > self.now {
            self.faults.duplicated += 1;
            let again = at + self.rng.range(1, 20);
            self.schedule(again, Event::Deliver(envelope.clone()));
        }
        self.schedule(at, Event::Deliver(envelope));
        self.schedule(
            self.now + self.request_timeout,
            Event::Timeout {
                worker: w.id,
                incarnation: w.incarnation,
                req,
            },
        );
        req
    }

    /// Worker `w` joins (or rejoins) the group: a rebalance.
    pub fn join(&mut self, w: usize) {
        let mut members: BTreeSet<usize> = self.kafka.members.keys().copied().collect();
        members.insert(w);
        self.rebalance(members);
    }

    fn rebalance(&mut self, members: BTreeSet<usize>) {
        let members: Vec<usize> = members.into_iter().collect();
        let mut assignment: BTreeMap<usize, BTreeSet<u32>> =
            members.iter().map(|m| (*m, BTreeSet::new())).collect();
        if !members.is_empty() {
            for p in 0..INPUT_PARTITIONS {
                let m = members[self.rng.below(members.len() as u64) as usize];
                assignment.entry(m).or_default().insert(p);
            }
        }
        self.note(&format!(
            "rebalance: generation {} {assignment:?}",
            self.kafka.generation + 1
        ));
        self.kafka.rebalance(assignment);
    }
}

fn leader(tp: Tp) -> u32 {
    match tp.0 {
        Topic::Output => tp.1 % BROKERS,
        Topic::Changelog => (tp.1 + 1) % BROKERS,
    }
}

fn coordinator(txnid: &str) -> u32 {
    txnid.bytes().map(u32::from).sum::<u32>() % BROKERS
}

/// How a seed ended.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub steps: u64,
    pub faults: Faults,
    pub commits: u64,
    pub aborts: u64,
    /// The first invariant broken, if any.
    pub violation: Option<String>,
    /// The trace, when run with one.
    pub trace: Vec<String>,
}

/// Runs seed `seed` under `logic`; with `trace`, keeps every step's line.
pub fn run(seed: u64, logic: Logic, trace: bool) -> Outcome {
    let mut io = Io {
        now: 0,
        rng: Rng::new(seed),
        kafka: Kafka::new(TXN_TIMEOUT),
        request_timeout: REQUEST_TIMEOUT,
        queue: BinaryHeap::new(),
        events: HashMap::new(),
        next_event: 0,
        next_req: 0,
        conn_last: HashMap::new(),
        slow_until: BTreeMap::new(),
        drop_until: BTreeMap::new(),
        duplicate_until: 0,
        faults: Faults::default(),
        commits: 0,
        aborts: 0,
        trace: trace.then(Vec::new),
    };
    let inputs: BTreeMap<u32, Vec<Input>> = (0..INPUT_PARTITIONS)
        .map(|p| {
            let records = (0..RECORDS_PER_PARTITION)
                .map(|i| Input {
                    id: p as u64 * 1_000 + i,
                    key: p * KEYS_PER_PARTITION + (i % KEYS_PER_PARTITION as u64) as u32,
                })
                .collect();
            (p, records)
        })
        .collect();
    let mut workers: Vec<Worker> = (0..WORKERS).map(|i| Worker::new(i, logic)).collect();
    for w in &mut workers {
        w.start(&mut io);
        io.schedule(1, Event::Tick(w.id));
    }
    io.schedule(10, Event::Fault);
    io.schedule(100, Event::Scan);
    let mut steps = 0;
    let violation = loop {
        let Some(Reverse((at, id))) = io.queue.pop() else {
            break Some("the simulation ran out of events".to_owned());
        };
        let event = io.events.remove(&id).expect("scheduled");
        io.now = at;
        steps += 1;
        step(&mut io, &mut workers, &inputs, event);
        if let Some(broken) = io.kafka.broken.first() {
            break Some(format!("{broken:?}"));
        }
        if io.now > FAULT_PHASE && done(&io, &workers, &inputs) {
            break check_end(&io, &workers, &inputs);
        }
        if io.now > FAULT_PHASE + PROGRESS_BOUND {
            break Some(format!(
                "no progress: {PROGRESS_BOUND} ms after the faults stopped, committed {:?} of {} per partition; open transactions: {}; workers blocked: {:?}",
                io.kafka.committed,
                RECORDS_PER_PARTITION,
                io.kafka.any_open(),
                workers.iter().map(|w| w.blocked).collect::<Vec<_>>()
            ));
        }
    };
    Outcome {
        seed,
        steps,
        faults: io.faults.clone(),
        commits: io.kafka.commits,
        aborts: io.kafka.aborts,
        violation,
        trace: io.trace.take().unwrap_or_default(),
    }
}

fn done(io: &Io, workers: &[Worker], inputs: &BTreeMap<u32, Vec<Input>>) -> bool {
    inputs
        .iter()
        .all(|(p, records)| io.kafka.committed.get(p).copied().unwrap_or(0) == records.len() as u64)
        && !io.kafka.any_open()
        && workers.iter().all(|w| w.blocked.is_none() && !w.busy())
}

/// The end state: every output once, the exact counts, the stores.
fn check_end(io: &Io, workers: &[Worker], inputs: &BTreeMap<u32, Vec<Input>>) -> Option<String> {
    let mut expected: BTreeMap<u32, i64> = BTreeMap::new();
    for records in inputs.values() {
        for r in records {
            if io.kafka.outputs.get(&r.id).copied().unwrap_or(0) != 1 {
                return Some(format!(
                    "input {} committed {} times in the outputs",
                    r.id,
                    io.kafka.outputs.get(&r.id).copied().unwrap_or(0)
                ));
            }
            *expected.entry(r.key).or_insert(0) += 1;
        }
    }
    if io.kafka.state != expected {
        return Some(format!(
            "the committed changelog folds to {:?}, not the counts {expected:?}",
            io.kafka.state
        ));
    }
    // The members that caught up with the group (a zombie that did not
    // notice yet restores when it does).
    let current = workers.iter().filter(|w| {
        w.alive && w.generation == Some(io.kafka.generation) && io.kafka.members.contains_key(&w.id)
    });
    for w in current {
        for p in w.positions.keys().filter(|p| w.assignment.contains(p)) {
            for r in &inputs[p] {
                if w.store.get(&r.key) != io.kafka.state.get(&r.key) {
                    return Some(format!(
                        "worker {} holds {:?} for key {}, the committed changelog {:?}",
                        w.id,
                        w.store.get(&r.key),
                        r.key,
                        io.kafka.state.get(&r.key)
                    ));
                }
            }
        }
    }
    None
}

fn step(io: &mut Io, workers: &mut [Worker], inputs: &BTreeMap<u32, Vec<Input>>, event: Event) {
    // A paused process reads its socket, then sees its timers fire, when it
    // resumes.
    let paused = match &event {
        Event::Respond { worker, .. } => workers[*worker].paused_until.map(|t| t + 1),
        Event::Timeout { worker, .. } => workers[*worker].paused_until.map(|t| t + 2),
        _ => None,
    };
    if let Some(at) = paused {
        return io.schedule(at, event);
    }
    match event {
        Event::Tick(w) => {
            workers[w].tick(io, inputs);
            let next = io.now + io.rng.range(1, 2);
            io.schedule(next, Event::Tick(w));
        }
        Event::Deliver(env) => deliver(io, env),
        Event::Respond {
            worker,
            incarnation,
            req,
            answer,
        } => {
            let w = &mut workers[worker];
            if w.alive && w.incarnation == incarnation {
                io.note(&format!("w{worker} #{req} <- {answer:?}"));
                w.on_response(io, req, answer);
            }
        }
        Event::Timeout {
            worker,
            incarnation,
            req,
        } => {
            let w = &mut workers[worker];
            if w.alive && w.incarnation == incarnation {
                w.on_timeout(io, req);
            }
        }
        Event::Scan => {
            let n = io.kafka.expire(io.now);
            io.faults.expired_txns += n as u64;
            io.schedule(io.now + 100, Event::Scan);
        }
        Event::Expire(w) => {
            // A session timeout: still not heard from, the member leaves.
            if !workers[w].alive || workers[w].paused_until.is_some() {
                let members: BTreeSet<usize> = io
                    .kafka
                    .members
                    .keys()
                    .copied()
                    .filter(|m| *m != w)
                    .collect();
                io.note(&format!("w{w}'s session expired"));
                io.rebalance(members);
            }
        }
        Event::Restart(w) => {
            io.note(&format!("w{w} restarts"));
            workers[w].start(io);
        }
        Event::Resume(w) => {
            io.note(&format!("w{w} resumes"));
            workers[w].paused_until = None;
        }
        Event::Fault => {
            if io.now < FAULT_PHASE {
                inject(io, workers);
                let next = io.now + io.rng.range(20, 120);
                io.schedule(next, Event::Fault);
            }
        }
    }
}

/// One fault, chosen by the seed.
fn inject(io: &mut Io, workers: &mut [Worker]) {
    match io.rng.below(10) {
        0..=2 => {
            let b = io.rng.below(BROKERS as u64) as u32;
            let until = io.now + io.rng.range(200, 1_000);
            io.note(&format!("fault: broker {b} slow until {until}"));
            io.slow_until.insert(b, until);
            io.faults.slow += 1;
        }
        3 => {
            let b = io.rng.below(BROKERS as u64) as u32;
            let until = io.now + io.rng.range(50, 300);
            io.note(&format!("fault: broker {b} drops responses until {until}"));
            io.drop_until.insert(b, until);
        }
        4 => {
            io.duplicate_until = io.now + io.rng.range(50, 300);
            io.note("fault: produce requests delivered twice");
        }
        5 | 6 => {
            io.faults.rebalances += 1;
            let members: BTreeSet<usize> = io.kafka.members.keys().copied().collect();
            io.rebalance(members);
        }
        7 => {
            let w = io.rng.below(WORKERS as u64) as usize;
            if workers[w].alive && workers[w].paused_until.is_none() {
                io.faults.crashes += 1;
                io.note(&format!("fault: w{w} crashes"));
                let worker = &mut workers[w];
                worker.alive = false;
                worker.generation = None;
                worker.assignment.clear();
                worker.positions.clear();
                worker.restored.clear();
                worker.txn = worker::Txn::Idle;
                worker.blocked = None;
                worker.in_flight.clear();
                worker.store.clear();
                io.schedule(io.now + SESSION_TIMEOUT, Event::Expire(w));
                let back = io.now + io.rng.range(100, 600);
                io.schedule(back, Event::Restart(w));
            }
        }
        _ => {
            let w = io.rng.below(WORKERS as u64) as usize;
            if workers[w].alive && workers[w].paused_until.is_none() {
                io.faults.zombies += 1;
                // Past the session timeout (a zombie), sometimes past the
                // transaction timeout too (the coordinator aborts its
                // transaction and bumps its epoch).
                let until = io.now + io.rng.range(400, 4_000);
                io.note(&format!("fault: w{w} paused until {until}"));
                workers[w].paused_until = Some(until);
                io.schedule(io.now + SESSION_TIMEOUT, Event::Expire(w));
                io.schedule(until, Event::Resume(w));
            }
        }
    }
}

/// A request reaches its broker; the answer goes back (unless dropped).
fn deliver(io: &mut Io, env: Envelope) {
    let kafka = &mut io.kafka;
    let answer = match env.request {
        Request::InitPid => {
            let (pid, epoch) = kafka.init_pid(&env.txnid);
            Answer::Init { pid, epoch }
        }
        Request::Add { tp } => {
            match kafka.add_partitions(io.now, &env.txnid, env.pid, env.epoch, &[tp]) {
                Ok(()) => Answer::Added { tp },
                Err(e) => Answer::Refused(e),
            }
        }
        Request::Produce { tp, seq, value } => {
            match kafka.produce(&env.txnid, tp, env.pid, env.epoch, seq, value) {
                Ok(()) => Answer::Acked,
                Err(e) => Answer::Refused(e),
            }
        }
        Request::Offsets {
            generation,
            ref offsets,
            ref read_under,
        } => match kafka.txn_offsets(
            &env.txnid,
            env.pid,
            env.epoch,
            generation,
            env.worker,
            offsets.clone(),
            read_under.clone(),
        ) {
            Ok(()) => Answer::Acked,
            Err(e) => Answer::Refused(e),
        },
        Request::End { commit } => match kafka.end_txn(&env.txnid, env.pid, env.epoch, commit) {
            Ok(()) => Answer::Acked,
            Err(e) => Answer::Refused(e),
        },
    };
    io.note(&format!(
        "b{} handles w{} #{}: {answer:?}",
        env.broker, env.worker, env.req
    ));
    if io.drop_until.get(&env.broker).is_some_and(|t| *t > io.now) && io.rng.one_in(2) {
        io.faults.dropped += 1;
        io.note(&format!("response to w{} #{} dropped", env.worker, env.req));
        return;
    }
    let at = io.arrival((env.worker, env.incarnation, env.broker, false), env.broker);
    io.schedule(
        at,
        Event::Respond {
            worker: env.worker,
            incarnation: env.incarnation,
            req: env.req,
            answer,
        },
    );
}

/// Runs seeds `first..first + n` under `logic`; returns the outcomes'
/// totals and the first failing seed's outcome (replayed with its trace).
pub fn explore(first: u64, n: u64, logic: Logic) -> (Totals, Option<Outcome>) {
    let mut totals = Totals::default();
    for seed in first..first + n {
        let outcome = run(seed, logic, false);
        totals.seeds += 1;
        totals.steps += outcome.steps;
        totals.commits += outcome.commits;
        totals.aborts += outcome.aborts;
        totals.faults.add(&outcome.faults);
        if outcome.violation.is_some() {
            return (totals, Some(run(seed, logic, true)));
        }
    }
    (totals, None)
}

#[derive(Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub steps: u64,
    pub commits: u64,
    pub aborts: u64,
    pub faults: Faults,
}

/// A failing seed, for people: the invariant, the last steps, how to rerun.
pub fn report(o: &Outcome, logic_name: &str) -> String {
    let tail: Vec<&String> = o.trace.iter().rev().take(60).collect();
    format!(
        "seed {} broke an invariant after {} steps: {}\nthe last {} steps:\n{}\nrerun: scripts/simulate --logic {logic_name} --seed {}",
        o.seed,
        o.steps,
        o.violation.as_deref().unwrap_or("none"),
        tail.len(),
        tail.into_iter()
            .rev()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        o.seed
    )
}
