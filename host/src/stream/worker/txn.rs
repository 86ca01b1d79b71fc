//! The worker's transaction as one value. A [`Txn`] is idle, open, or
//! committing: a commit in flight on the committer thread, with the next
//! transaction's records behind it. `commit.rs` moves it from one state to
//! the next; every transition that may abort says so in what it returns
//! ([`Flow`]), so no caller compares counters or flags to learn what
//! happened beneath it.

use super::*;

/// Where the worker's transaction is.
pub(super) enum Txn {
    /// Nothing processed since the last commit or abort.
    Idle,
    /// A Kafka transaction is open at the producer (at_least_once: a batch
    /// not committed yet): its records' outputs are sent as they come.
    Open(Open),
    /// Steps 2-4 of a commit run on the committer (`flight`). What is
    /// processed meanwhile is `next`: its Kafka transaction begins when the
    /// commit returns, and its outputs are held until then.
    Committing {
        flight: InFlight,
        next: Option<Open>,
    },
}

/// A transaction's records: since when, under which group generation, up
/// to which input offsets, what they cost, and (behind a commit in flight)
/// their outputs.
pub(super) struct Open {
    pub(super) started: Instant,
    /// The consumer's group metadata when the transaction began: its
    /// offsets go with it, so that a transaction across a rebalance can
    /// never commit (the coordinator refuses the old generation), even
    /// when the worker commits before it has served the rebalance's
    /// callbacks.
    pub(super) group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
    /// Next offset to read per input partition consumed.
    pub(super) offsets: BTreeMap<(String, i32), i64>,
    pub(super) pending: Pending,
    /// Outputs waiting for the producer's transaction to begin (only while
    /// behind a commit in flight; empty once it has begun).
    pub(super) held: Vec<OutputRecord>,
}

impl Open {
    /// A transaction beginning now under `group`, its counts starting from
    /// what aborted attempts left to bill (`carried`).
    pub(super) fn new(
        group: Option<rdkafka::consumer::ConsumerGroupMetadata>,
        carried: Pending,
    ) -> Open {
        Open {
            started: Instant::now(),
            group,
            offsets: BTreeMap::new(),
            pending: carried,
            held: Vec::new(),
        }
    }
}

/// What a transition that may abort did: the caller goes on, or drops what
/// it was doing, whose input was rewound (or is rewound by the loop after a
/// rebalance callback).
#[must_use = "a transition may have aborted the transaction: records polled before it are stale"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Flow {
    Go,
    Aborted,
}

impl Txn {
    pub(super) fn is_idle(&self) -> bool {
        matches!(self, Txn::Idle)
    }

    /// The transaction records go into now: the open one, or the next one
    /// behind a commit in flight.
    pub(super) fn current(&self) -> Option<&Open> {
        match self {
            Txn::Open(open) => Some(open),
            Txn::Committing { next, .. } => next.as_ref(),
            Txn::Idle => None,
        }
    }

    pub(super) fn current_mut(&mut self) -> Option<&mut Open> {
        match self {
            Txn::Open(open) => Some(open),
            Txn::Committing { next, .. } => next.as_mut(),
            Txn::Idle => None,
        }
    }

    /// The transaction a task's records go into, once
    /// [`Core::ensure_txn`] opened one (only an abort closes it again).
    pub(super) fn receiving(&mut self) -> &mut Open {
        self.current_mut()
            .expect("ensure_txn opened a transaction, and only an abort closes it")
    }

    pub(super) fn flight(&self) -> Option<&InFlight> {
        match self {
            Txn::Committing { flight, .. } => Some(flight),
            _ => None,
        }
    }

    /// Bytes of outputs the worker holds until commits return: the current
    /// transaction's (held or sent) and those of the commit in flight.
    pub(super) fn output_bytes(&self) -> u64 {
        self.current().map_or(0, |o| o.pending.output_bytes)
            + self.flight().map_or(0, |f| f.pending.output_bytes)
    }
}
