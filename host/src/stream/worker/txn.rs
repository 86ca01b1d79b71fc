//! The worker's transaction: the protocol's [`Txn`](protocol::Txn)
//! (`stream/protocol.rs`, the state and decisions shared with the
//! simulation) over the worker's types: librdkafka's group metadata, the
//! committer's [`InFlight`], output records, and the counts of
//! [`Pending`].

use super::*;
use crate::stream::protocol;

pub(super) use protocol::{Action, Commit, Flow, Route, Step};

/// The worker's side of the protocol's types.
pub(super) struct Production;

impl protocol::Kinds for Production {
    type Instant = Instant;
    type Group = rdkafka::consumer::ConsumerGroupMetadata;
    type Flight = InFlight;
    type Output = OutputRecord;
    type Input = (String, i32);
    type Work = Pending;
}

pub(super) type Txn = protocol::Txn<Production>;
pub(super) type Open = protocol::Open<Production>;

impl protocol::Work for Pending {
    /// Fuel and log lines: the guest did burn them.
    fn carried(&self) -> Pending {
        Pending {
            fuel: self.fuel,
            log_lines: self.log_lines,
            ..Pending::default()
        }
    }

    fn carry(&mut self, dropped: &Pending) {
        self.fuel += dropped.fuel;
        self.log_lines += dropped.log_lines;
    }
}

/// Bytes of outputs the worker holds until commits return: the current
/// transaction's (held or sent) and those of the commit in flight.
pub(super) fn output_bytes(txn: &Txn) -> u64 {
    txn.current().map_or(0, |o| o.work.output_bytes)
        + txn.frozen().map_or(0, |f| f.work.output_bytes)
}
