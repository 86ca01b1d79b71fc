//! The commit protocol's state and decisions, without I/O (the sans-IO
//! style of quinn-proto and rustls): where a worker's transaction is
//! ([`Txn`]), how it moves, and what each failure does to it
//! ([`decide`]). Nothing here calls Kafka, reads a clock or names rdkafka:
//! the caller does the I/O and tells the protocol what came of it.
//!
//! Two callers drive this same code: the worker (`stream/worker/`), over
//! librdkafka, and the deterministic simulation (`tests/sim/`), over a
//! simulated Kafka that delays, drops, duplicates and times out requests,
//! fences, rebalances and crashes under a seeded scheduler
//! (`scripts/simulate`). A rule of the protocol lives here once, so a
//! simulated seed exercises the rule production runs.
//!
//! The rules, each where it is decided:
//! - a transaction's offsets go with the group metadata of its first
//!   record ([`Open::group`]): one across a rebalance cannot commit;
//! - records processed while a commit is in flight go into the next
//!   transaction, their outputs held until it begins ([`Txn::route`],
//!   [`Txn::begin_next`]);
//! - a commit's state changes are applied only once it returned committed
//!   ([`Txn::take_flight`] hands the frozen transaction back for that);
//! - a rebalance aborts what is open and never commits it
//!   ([`on_rebalance`]);
//! - an abort never purges a request in flight: it waits (bounded) for
//!   every record of the transaction, and replaces the producer if some
//!   stay unacknowledged ([`after_drain`]);
//! - a failure whose outcome is unknown replaces the producer
//!   ([`Action::AbortUnknown`]).

use std::collections::BTreeMap;

/// The types a caller of the protocol brings: its clock's instants, its
/// consumer's group metadata, its handle on a commit in flight, its output
/// records, its input positions and what a transaction's records did.
pub trait Kinds {
    /// A point in the caller's time (`std::time::Instant`; the
    /// simulation's step clock).
    type Instant: Copy;
    /// The consumer's group metadata (member, generation).
    type Group;
    /// A commit in flight: the caller's handle on steps 2-4.
    type Flight;
    /// An output record.
    type Output;
    /// An input partition (a topic and a partition, in production).
    type Input: Ord;
    /// What a transaction's records did.
    type Work: Work;
}

/// What a transaction's records did (counts, in production). An aborted
/// transaction's work is dropped, except what it burned, which the next
/// commit bills ([`Work::carried`]).
pub trait Work: Default {
    /// What of this work an abort leaves to bill.
    fn carried(&self) -> Self;
    /// Adds what a dropped transaction leaves to bill.
    fn carry(&mut self, dropped: &Self);
}

/// Where the worker's transaction is.
pub enum Txn<K: Kinds> {
    /// Nothing processed since the last commit or abort.
    Idle,
    /// A Kafka transaction is open at the producer (at_least_once: a batch
    /// not committed yet): its records' outputs are sent as they come.
    Open(Open<K>),
    /// Steps 2-4 of a commit run on the committer (`flight`) for `frozen`.
    /// What is processed meanwhile is `next`: its Kafka transaction begins
    /// when the commit returns, and its outputs are held until then.
    Committing {
        /// The caller's handle on the commit's steps 2-4.
        flight: K::Flight,
        /// The transaction being committed.
        frozen: Open<K>,
        /// The transaction behind it, if records came meanwhile.
        next: Option<Open<K>>,
    },
}

/// A transaction's records: since when, under which group generation, up
/// to which input offsets, what they did, and (behind a commit in flight)
/// their outputs.
pub struct Open<K: Kinds> {
    /// When its first record came (frozen: when its commit started).
    pub started: K::Instant,
    /// The consumer's group metadata when the transaction began: its
    /// offsets go with it, so that a transaction across a rebalance can
    /// never commit (the coordinator refuses the old generation), even
    /// when the worker commits before it has served the rebalance's
    /// callbacks.
    pub group: Option<K::Group>,
    /// Next offset to read per input partition consumed.
    pub offsets: BTreeMap<K::Input, i64>,
    /// What its records did.
    pub work: K::Work,
    /// Outputs waiting for the producer's transaction to begin (only while
    /// behind a commit in flight; empty once it has begun).
    pub held: Vec<K::Output>,
}

impl<K: Kinds> Open<K> {
    /// A transaction beginning at `started` under `group`, its work
    /// starting from what aborted attempts left to bill (`carried`).
    pub fn new(started: K::Instant, group: Option<K::Group>, carried: K::Work) -> Open<K> {
        Open {
            started,
            group,
            offsets: BTreeMap::new(),
            work: carried,
            held: Vec::new(),
        }
    }
}

impl<K: Kinds> std::fmt::Debug for Open<K>
where
    K::Instant: std::fmt::Debug,
    K::Input: std::fmt::Debug,
    K::Work: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Open")
            .field("started", &self.started)
            .field("group", &self.group.is_some())
            .field("offsets", &self.offsets)
            .field("work", &self.work)
            .field("held", &self.held.len())
            .finish()
    }
}

impl<K: Kinds> std::fmt::Debug for Txn<K>
where
    K::Instant: std::fmt::Debug,
    K::Input: std::fmt::Debug,
    K::Work: std::fmt::Debug,
    K::Flight: std::fmt::Debug,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Txn::Idle => f.write_str("Idle"),
            Txn::Open(open) => f.debug_tuple("Open").field(open).finish(),
            Txn::Committing {
                flight,
                frozen,
                next,
            } => f
                .debug_struct("Committing")
                .field("flight", flight)
                .field("frozen", frozen)
                .field("next", next)
                .finish(),
        }
    }
}

/// A commit taken out of [`Txn::Committing`] ([`Txn::take_flight`]).
pub struct Commit<K: Kinds> {
    /// The caller's handle on its steps 2-4.
    pub flight: K::Flight,
    /// The transaction it commits.
    pub frozen: Open<K>,
    /// The transaction behind it, if records came meanwhile.
    pub next: Option<Open<K>>,
}

/// What a transition that may abort did: the caller goes on, or drops what
/// it was doing, whose input was rewound (or is rewound by the loop after a
/// rebalance callback).
#[must_use = "a transition may have aborted the transaction: records polled before it are stale"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Nothing aborted: go on.
    Go,
    /// The transaction aborted: what was polled before is stale.
    Aborted,
}

/// Where a processed record's outputs go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the producer now: they belong to its open transaction.
    Send,
    /// Into [`Open::held`]: a commit is in flight and their transaction
    /// has not begun at the producer yet.
    Hold,
}

impl<K: Kinds> Txn<K> {
    /// Nothing processed since the last commit or abort.
    pub fn is_idle(&self) -> bool {
        matches!(self, Txn::Idle)
    }

    /// The transaction records go into now: the open one, or the next one
    /// behind a commit in flight.
    pub fn current(&self) -> Option<&Open<K>> {
        match self {
            Txn::Open(open) => Some(open),
            Txn::Committing { next, .. } => next.as_ref(),
            Txn::Idle => None,
        }
    }

    /// [`Txn::current`], to add to.
    pub fn current_mut(&mut self) -> Option<&mut Open<K>> {
        match self {
            Txn::Open(open) => Some(open),
            Txn::Committing { next, .. } => next.as_mut(),
            Txn::Idle => None,
        }
    }

    /// The transaction a record's effects go into, once [`Txn::ensure`]
    /// opened one (only an abort closes it again).
    pub fn receiving(&mut self) -> &mut Open<K> {
        self.current_mut()
            .expect("ensure opened a transaction, and only an abort closes it")
    }

    /// The commit in flight, if any.
    pub fn flight(&self) -> Option<&K::Flight> {
        match self {
            Txn::Committing { flight, .. } => Some(flight),
            _ => None,
        }
    }

    /// The transaction being committed.
    pub fn frozen(&self) -> Option<&Open<K>> {
        match self {
            Txn::Committing { frozen, .. } => Some(frozen),
            _ => None,
        }
    }

    /// Opens a transaction for the records to come, if none is: behind a
    /// commit in flight, the next one (its producer transaction begins when
    /// the commit returns); otherwise `begin` begins the producer's
    /// transaction first, and nothing opens if it fails.
    pub fn ensure<E>(
        &mut self,
        open: impl FnOnce() -> Open<K>,
        begin: impl FnOnce() -> Result<(), E>,
    ) -> Result<(), E> {
        match self {
            Txn::Open(_) | Txn::Committing { next: Some(_), .. } => Ok(()),
            Txn::Committing { next, .. } => {
                *next = Some(open());
                Ok(())
            }
            Txn::Idle => {
                begin()?;
                *self = Txn::Open(open());
                Ok(())
            }
        }
    }

    /// Where the outputs of a record processed now go.
    pub fn route(&self) -> Route {
        match self {
            Txn::Committing { .. } => Route::Hold,
            _ => Route::Send,
        }
    }

    /// Starts a commit at `now`: the open transaction, taken out to be
    /// frozen and handed to the committer (the worker's transaction is idle
    /// until [`Txn::committing`]); from here its `started` is when its
    /// commit started. None unless a transaction is open and no commit in
    /// flight.
    pub fn freeze(&mut self, now: K::Instant) -> Option<Open<K>> {
        if !matches!(self, Txn::Open(_)) {
            return None;
        }
        match std::mem::replace(self, Txn::Idle) {
            Txn::Open(mut open) => {
                open.started = now;
                Some(open)
            }
            _ => unreachable!("checked above"),
        }
    }

    /// The frozen transaction's steps 2-4 are in flight.
    pub fn committing(&mut self, flight: K::Flight, frozen: Open<K>) {
        debug_assert!(self.is_idle(), "freeze took the transaction");
        *self = Txn::Committing {
            flight,
            frozen,
            next: None,
        };
    }

    /// Takes the commit in flight, the transaction it commits and the one
    /// behind it (the worker's transaction is idle until the caller says
    /// what follows: [`Txn::begin_next`], [`Txn::failed`] or an abort).
    pub fn take_flight(&mut self) -> Option<Commit<K>> {
        self.flight()?;
        match std::mem::replace(self, Txn::Idle) {
            Txn::Committing {
                flight,
                frozen,
                next,
            } => Some(Commit {
                flight,
                frozen,
                next,
            }),
            _ => unreachable!("checked above"),
        }
    }

    /// A commit returned committed and its changes are applied: what was
    /// processed behind it becomes the open transaction, once `begin` began
    /// it at the producer; its held outputs are returned, to be sent now.
    pub fn begin_next<E>(
        &mut self,
        next: Option<Open<K>>,
        begin: impl FnOnce() -> Result<(), E>,
    ) -> Result<Vec<K::Output>, E> {
        let Some(mut next) = next else {
            return Ok(Vec::new());
        };
        begin()?;
        let held = std::mem::take(&mut next.held);
        *self = Txn::Open(next);
        Ok(held)
    }

    /// A commit returned failed: the transaction that failed is still the
    /// producer's open one and is aborted next ([`decide`]); the records
    /// processed behind it never began at the producer and are dropped with
    /// it, what they burned carried.
    pub fn failed(&mut self, frozen: Open<K>, next: Option<Open<K>>) -> Option<Open<K>> {
        let mut failed: Open<K> = Open::new(frozen.started, None, frozen.work.carried());
        let dropped = next.inspect(|next| failed.work.carry(&next.work));
        *self = Txn::Open(failed);
        dropped
    }

    /// Forgets the transaction once the producer's side is aborted (or the
    /// producer replaced): what it burned is returned, for the next commit
    /// to bill. A commit in flight is forgotten only when the session ends
    /// (an abort waits for its outcome first).
    pub fn forget(&mut self) -> K::Work {
        let mut carried = K::Work::default();
        match std::mem::replace(self, Txn::Idle) {
            Txn::Idle => {}
            Txn::Open(open) => carried.carry(&open.work),
            Txn::Committing { frozen, next, .. } => {
                carried.carry(&frozen.work);
                if let Some(next) = next {
                    carried.carry(&next.work);
                }
            }
        }
        carried
    }
}

/// A failure, as the protocol tells failures apart (the caller classifies
/// its client's errors: `kafka::errors` for librdkafka's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The principal may not write or read there.
    Authorization,
    /// This producer's epoch is no longer current: a newer producer with
    /// its transactional id initialised, or the transaction coordinator
    /// aborted its transaction at the transaction timeout (under
    /// transaction version 1 that bumps the epoch). The consumer's
    /// membership is not in question: Kafka Streams, too, replaces the
    /// producer and keeps the consumer (`StreamThread.handleTaskMigrated`).
    ProducerFenced,
    /// Another member joined with this worker's static id
    /// (`FencedInstanceId`): this one is a zombie.
    MemberFenced,
    /// The record can never be sent (too large): retrying cannot help.
    Unsendable,
    /// The offsets carry a generation the group has left.
    StaleGeneration,
    /// A request timed out: its outcome is unknown.
    TimedOut,
    /// The producer refused a record: its transaction is in an abortable
    /// state after an earlier failure.
    RecordRefused,
    /// Any other error that leaves the transaction abortable.
    Abortable,
    /// Anything else.
    Fatal,
}

/// Where in the protocol a failure happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A transactional call or a produce call: begin, produce, flush,
    /// `send_offsets_to_transaction` (`AddOffsetsToTxn`, `TxnOffsetCommit`).
    Call,
    /// A delivery report: records of the transaction were not written.
    Delivery,
    /// `commit_transaction` (`EndTxn`).
    EndTxn,
}

/// What the worker does about a failure.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Abort the transaction at the producer (never purging a request in
    /// flight: [`after_drain`]), drop it in the worker, and read the input
    /// again from the committed offsets.
    Abort,
    /// The transaction's outcome is unknown (it may have committed, or a
    /// late request of it may still land): replace the producer (its new
    /// epoch fences the old one's requests, its `init_transactions` ends
    /// the transaction either way), reload the stores from their
    /// changelogs, read the input again.
    AbortUnknown,
    /// Abort, then end the session with the error: retrying cannot help.
    AbortAndEnd,
    /// End the session (another member took this worker's static id; at
    /// at_least_once: the consumer reads from the committed offsets).
    End,
}

/// What a failure at `step` does to the transaction.
pub fn decide(step: Step, failure: Failure, exactly_once: bool) -> Action {
    use Failure::*;
    match step {
        // Whatever the client calls it, the outcome of an EndTxn that
        // failed is not known here: it may have committed.
        Step::EndTxn => match failure {
            MemberFenced => Action::End,
            _ if !exactly_once => Action::End,
            _ => Action::AbortUnknown,
        },
        Step::Delivery => match failure {
            Authorization | Unsendable => Action::AbortAndEnd,
            // A produce request whose outcome is unknown may still land:
            // only a new producer epoch keeps it out of later transactions.
            TimedOut => Action::AbortUnknown,
            _ => Action::Abort,
        },
        Step::Call => match failure {
            Authorization | Unsendable => Action::AbortAndEnd,
            MemberFenced => Action::End,
            _ if !exactly_once => Action::End,
            // A rebalance began while this transaction was open (its
            // offsets carry the old generation), or the member's session
            // expired: abort and read again; the producer and the consumer
            // stay, and the consumer rejoins by itself (a new consumer
            // under the same static id would get its old assignment back
            // without a rebalance, and a partition revoked meanwhile would
            // be owned by nobody).
            StaleGeneration | RecordRefused | Abortable => Action::Abort,
            // A fenced producer is replaced and the consumer stays, for the
            // same reason: ending the session in the middle of a
            // cooperative rebalance (a commit in flight failing inside the
            // revoke callback) rejoined as the same static member, and the
            // partition revoked in the first round was owned by nobody for
            // 5 minutes (bench/results/2026-12-07-rolling-s28-heavy.md).
            // Whether the fenced transaction committed is asked as for any
            // unknown outcome.
            TimedOut | ProducerFenced => Action::AbortUnknown,
            Fatal => Action::End,
        },
    }
}

/// What a rebalance callback does to a busy worker's transaction: aborts
/// it, and never commits it. A member that was out of the group without
/// knowing it (its partitions processed meanwhile by another member)
/// rejoins with a new, valid generation, and a commit in the callback
/// would carry that generation and go through, committing records the
/// other member already committed (seen in the network-fault drill: 1,115
/// duplicate outputs in one round). A commit already in flight carries the
/// generation of its first record, and is waited for.
pub fn on_rebalance<K: Kinds>(txn: &Txn<K>) -> Option<Action> {
    (!txn.is_idle()).then_some(Action::Abort)
}

/// How an abort's wait for the transaction's records in flight ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drained {
    /// Every record acknowledged (or failed): none can arrive later.
    All,
    /// This many still unacknowledged at the bound.
    Unacknowledged(u64),
}

/// What an abort does at the producer once it has waited for the
/// transaction's records in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AbortEnd {
    /// `abort_transaction` (EndTxn abort): nothing of the transaction is
    /// left in flight to join a later one.
    EndTxn,
    /// Replace the producer: its new epoch fences what is still in flight
    /// and its `init_transactions` aborts the transaction. Purging instead
    /// would not recall a request already sent: arriving after the next
    /// transaction added its partition, it passes the leader's checks (same
    /// producer id and epoch, an ongoing transaction, the next sequence)
    /// and commits with that transaction.
    ///
    /// Also the step when `abort_transaction` itself fails: the coordinator
    /// may have aborted the transaction already (past its timeout, or the
    /// epoch bumped), and a new producer's `init_transactions` aborts it in
    /// any case, while the consumer keeps its membership (restarting the
    /// session instead rejoined as the same static member in the middle of
    /// a cooperative rebalance, and partitions revoked in its first round
    /// were then owned by nobody).
    ReplaceProducer,
}

/// The abort's next step after its wait for the records in flight.
pub fn after_drain(drained: Drained) -> AbortEnd {
    match drained {
        Drained::All => AbortEnd::EndTxn,
        Drained::Unacknowledged(_) => AbortEnd::ReplaceProducer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct T;
    #[derive(Default, Debug, PartialEq)]
    struct Burned(u64, u64);
    impl Work for Burned {
        fn carried(&self) -> Self {
            Burned(self.0, 0)
        }
        fn carry(&mut self, dropped: &Self) {
            self.0 += dropped.0;
        }
    }
    impl Kinds for T {
        type Instant = u32;
        type Group = u32;
        type Flight = &'static str;
        type Output = u32;
        type Input = u32;
        type Work = Burned;
    }

    #[test]
    fn records_behind_a_commit_wait_for_it_and_begin_when_it_returns() {
        let mut txn: Txn<T> = Txn::Idle;
        let begun = std::cell::Cell::new(0);
        let begin = || {
            begun.set(begun.get() + 1);
            Ok::<(), ()>(())
        };
        txn.ensure(|| Open::new(0, Some(1), Burned::default()), begin)
            .unwrap();
        assert_eq!((begun.get(), txn.route()), (1, Route::Send));
        let frozen = txn.freeze(3).expect("open");
        assert_eq!(frozen.started, 3, "its commit's start");
        assert!(txn.freeze(3).is_none(), "nothing else open");
        txn.committing("flight", frozen);
        txn.ensure(|| Open::new(5, Some(2), Burned::default()), begin)
            .unwrap();
        assert_eq!(
            (begun.get(), txn.route()),
            (1, Route::Hold),
            "not begun behind a commit"
        );
        txn.receiving().held.push(7);
        let Commit { frozen, next, .. } = txn.take_flight().expect("in flight");
        assert_eq!(frozen.group, Some(1), "the group of its first record");
        let held = txn.begin_next(next, begin).unwrap();
        assert_eq!((begun.get(), held), (2, vec![7]));
        assert_eq!(txn.current().map(|o| o.group), Some(Some(2)));
    }

    #[test]
    fn a_failed_commit_reopens_the_failed_one_and_carries_what_was_burned_behind_it() {
        let mut txn: Txn<T> = Txn::Idle;
        let mut frozen = Open::new(0, Some(1), Burned(3, 9));
        frozen.offsets.insert(0, 10);
        let next = Open::new(1, Some(1), Burned(4, 2));
        let dropped = txn.failed(frozen, Some(next));
        assert!(dropped.is_some());
        let open = txn.current().expect("the failed one is open");
        assert_eq!((open.work.0, open.work.1, open.group), (7, 0, None));
        assert!(open.offsets.is_empty(), "none of its offsets commit");
        assert_eq!(txn.forget(), Burned(7, 0));
        assert!(txn.is_idle());
    }

    #[test]
    fn failures_are_decided_as_documented() {
        use Failure::*;
        assert_eq!(decide(Step::Call, StaleGeneration, true), Action::Abort);
        assert_eq!(decide(Step::Call, TimedOut, true), Action::AbortUnknown);
        assert_eq!(
            decide(Step::Call, ProducerFenced, true),
            Action::AbortUnknown
        );
        assert_eq!(decide(Step::Call, MemberFenced, true), Action::End);
        assert_eq!(decide(Step::Call, StaleGeneration, false), Action::End);
        assert_eq!(decide(Step::Delivery, TimedOut, true), Action::AbortUnknown);
        assert_eq!(decide(Step::Delivery, ProducerFenced, true), Action::Abort);
        assert_eq!(
            decide(Step::Delivery, Unsendable, false),
            Action::AbortAndEnd
        );
        assert_eq!(decide(Step::EndTxn, Abortable, true), Action::AbortUnknown);
        assert_eq!(
            decide(Step::EndTxn, ProducerFenced, true),
            Action::AbortUnknown
        );
        assert_eq!(decide(Step::EndTxn, MemberFenced, true), Action::End);
        assert_eq!(
            decide(Step::EndTxn, Authorization, true),
            Action::AbortUnknown
        );
        assert_eq!(decide(Step::Call, Authorization, true), Action::AbortAndEnd);
        assert_eq!(
            after_drain(Drained::Unacknowledged(3)),
            AbortEnd::ReplaceProducer
        );
        assert_eq!(after_drain(Drained::All), AbortEnd::EndTxn);
    }
}
