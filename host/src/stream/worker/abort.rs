//! The failure arms of the protocol: a failed call or delivery inside the
//! transaction aborts it (the producer's side first, then the worker's:
//! stores' pending layers, guests, input rewound to the committed
//! offsets), replaces the producer when the outcome is unknown, or ends the
//! session, as [`protocol::decide`] says. Every arm returns
//! [`Flow::Aborted`] or an error.

use super::*;
use crate::stream::protocol::{self, AbortEnd, Failure};

/// What failed, as librdkafka said it.
pub(super) enum Cause {
    /// A call: begin, produce, flush, the offsets, the commit.
    Call {
        operation: &'static str,
        error: KafkaError,
    },
    /// Records of the transaction were not delivered.
    Delivery {
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    },
}

impl Cause {
    pub(super) fn call(operation: &'static str, error: KafkaError) -> Cause {
        Cause::Call { operation, error }
    }

    /// The failure as the protocol tells failures apart.
    fn failure(&self) -> Failure {
        match self {
            Cause::Call { error, .. } => {
                let code = error.rdkafka_error_code();
                if kafka::authorization_failure(error).is_some() {
                    Failure::Authorization
                } else if kafka::is_member_fencing(error) {
                    Failure::MemberFenced
                } else if kafka::is_fencing(error) {
                    Failure::ProducerFenced
                } else if code.is_some_and(is_unsendable) {
                    Failure::Unsendable
                } else if kafka::is_stale_generation(error) {
                    Failure::StaleGeneration
                } else if code.is_some_and(is_timeout) {
                    Failure::TimedOut
                } else if let KafkaError::MessageProduction(_) = error {
                    Failure::RecordRefused
                } else if matches!(kafka::classify(error), TxnFailure::Abort) {
                    Failure::Abortable
                } else {
                    Failure::Fatal
                }
            }
            Cause::Delivery { code, .. } => match code {
                Some(c) if kafka::is_authorization(*c) => Failure::Authorization,
                Some(c) if is_unsendable(*c) => Failure::Unsendable,
                Some(c) if is_timeout(*c) => Failure::TimedOut,
                _ => Failure::Abortable,
            },
        }
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cause::Call { operation, error } => write!(f, "{operation}: {error}"),
            Cause::Delivery { count, first, .. } => {
                write!(
                    f,
                    "{count} records failed delivery (first: {})",
                    first.message
                )
            }
        }
    }
}

impl Core {
    /// Acts on a failed Kafka call inside the transaction.
    pub(super) fn on_txn_error(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        operation: &'static str,
        error: KafkaError,
    ) -> Result<Flow, StreamError> {
        self.on_failure(consumer, Step::Call, Cause::call(operation, error))
    }

    /// Acts on a failure at `step` of the transaction, as the protocol
    /// decides.
    pub(super) fn on_failure(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        step: Step,
        cause: Cause,
    ) -> Result<Flow, StreamError> {
        let mut failure = cause.failure();
        if failure == Failure::ProducerFenced {
            if let Some((code, reason)) = consumer.client().fatal_error() {
                // The consumer was fenced as well (another instance with
                // this worker's id): this one is the zombie, and a new
                // producer would only fence the live one's.
                tracing::warn!(
                    worker = self.worker,
                    "{cause}; the consumer is fenced too ({code:?}: {reason})"
                );
                failure = Failure::MemberFenced;
            } else {
                Metrics::add(&self.d.metrics.fenced, 1);
            }
        }
        match protocol::decide(step, failure, self.d.exactly_once()) {
            Action::Abort => {
                if failure == Failure::StaleGeneration {
                    tracing::info!(
                        worker = self.worker,
                        "{cause}: the group is rebalancing; aborting and rewinding"
                    );
                } else {
                    tracing::warn!(worker = self.worker, "{cause}; aborting the transaction");
                }
                self.abort(Some(consumer)).map(|()| Flow::Aborted)
            }
            Action::AbortUnknown => self.abort_unknown(consumer, &cause.to_string()),
            Action::AbortAndEnd => {
                let _ = self.abort(None);
                Err(self.session_error(failure, cause))
            }
            Action::End => Err(self.session_error(failure, cause)),
        }
    }

    /// The error that ends the session after `cause`.
    fn session_error(&self, failure: Failure, cause: Cause) -> StreamError {
        match (failure, cause) {
            (Failure::Authorization, Cause::Call { error, .. }) => {
                let code = kafka::authorization_failure(&error)
                    .unwrap_or(RDKafkaErrorCode::TopicAuthorizationFailed);
                refused(&self.d, self.worker, code, None)
            }
            (Failure::Authorization, Cause::Delivery { code, first, .. }) => {
                let code = code.unwrap_or(RDKafkaErrorCode::TopicAuthorizationFailed);
                refused(&self.d, self.worker, code, Some(&first.topic))
            }
            (Failure::Unsendable, Cause::Call { operation, error }) => StreamError::Unsendable {
                message: match error.rdkafka_error_code() {
                    Some(code) => format!("{operation}: {error}: {code}"),
                    None => format!("{operation}: {error}"),
                },
            },
            (Failure::Unsendable, Cause::Delivery { code, first, .. }) => StreamError::Unsendable {
                message: match code {
                    Some(code) => format!("{}: {code}", first.message),
                    None => first.message,
                },
            },
            (Failure::MemberFenced | Failure::ProducerFenced, Cause::Call { operation, error }) => {
                Metrics::add(&self.d.metrics.fenced, 1);
                tracing::warn!(worker = self.worker, "{operation}: fenced: {error}");
                Restart::fenced(operation, error)
            }
            (_, Cause::Call { operation, error }) => Restart::kafka(operation, error),
            // decide() ends a session on a failed delivery only when it was
            // refused (above); any other is aborted.
            (failure, cause @ Cause::Delivery { .. }) => Restart::Undecided {
                failure: format!("{failure:?}"),
                cause: cause.to_string(),
            }
            .into(),
        }
    }

    /// Aborts after an error whose outcome is unknown (a timed-out request,
    /// a failed EndTxn): the producer is replaced, so that a late request of
    /// this transaction can never join a later one (librdkafka 2.12 does
    /// not speak transaction version 2, KIP-890), and every task restores
    /// its stores from the changelogs, which hold this transaction's state
    /// changes if it committed after all.
    pub(super) fn abort_unknown(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        why: &str,
    ) -> Result<Flow, StreamError> {
        tracing::warn!(
            worker = self.worker,
            "{why}: the transaction's outcome is unknown; aborting, re-creating the producer \
             and restoring the stores from their changelogs"
        );
        // No abort_transaction first (it may fail: the transaction may be
        // complete): the new producer's init_transactions aborts it, or
        // waits for its commit, either way. The worker forgets it all the
        // same (before, a failed abort left it "open" on the new producer,
        // whose next record was refused with "Erroneous state").
        self.replace_producer()?;
        // The new producer's init_transactions has resolved it: the group's
        // offsets tell whether it committed, and its usage record with it.
        let committed = self.committed_after_all(consumer);
        self.forget_txn(!committed);
        self.reload(consumer)?;
        if self.in_callback {
            self.rewind_pending = true;
        } else {
            self.rewind(consumer)?;
        }
        Ok(Flow::Aborted)
    }

    /// Aborts the open transaction: pending state dropped, guests replaced,
    /// and (given the consumer) the input rewound to the committed offsets.
    pub(super) fn abort(
        &mut self,
        consumer: Option<&BaseConsumer<WorkerContext>>,
    ) -> Result<(), StreamError> {
        if let Some(Commit {
            flight,
            frozen,
            next,
        }) = self.txn.take_flight()
        {
            // Never under a commit in flight: it ends first. Committed, it
            // stays (step 5 runs); failed, it is handled as any failed
            // commit, which aborts what came after it too. Without a
            // consumer the session ends: a failed one is aborted below, and
            // a committed one's stores catch up from their changelogs when
            // the tasks open again.
            let outcome = flight.wait()?;
            let committed = matches!(outcome, CommitOutcome::Committed { .. });
            match consumer {
                Some(consumer) if committed => {
                    // What came behind it never began at the producer:
                    // nothing to abort there.
                    if let Some(next) = next {
                        self.unbill(&next.work);
                    }
                    let _ = self.finish_commit(consumer, frozen, None, outcome)?;
                }
                Some(consumer) => {
                    // The failure arms abort (or end the session).
                    self.reopen_failed(frozen, next);
                    let _aborted = self.on_failed_commit(consumer, outcome)?;
                    return Ok(());
                }
                None if committed => {
                    if let Some(next) = next {
                        self.unbill(&next.work);
                    }
                }
                None => self.reopen_failed(frozen, next),
            }
        }
        let producer_open = matches!(self.txn, Txn::Open(_));
        if self.d.exactly_once() && producer_open {
            let drained = drain_in_flight(&self.producer);
            let replace = match protocol::after_drain(drained) {
                AbortEnd::EndTxn => match end_transaction(&self.producer) {
                    Ok(()) => false,
                    Err(e) => {
                        tracing::info!(
                            worker = self.worker,
                            "abort_transaction: {e}; replacing the producer instead"
                        );
                        true
                    }
                },
                AbortEnd::ReplaceProducer => {
                    tracing::info!(
                        worker = self.worker,
                        ?drained,
                        "records of the aborted transaction unacknowledged after {ABORT_DRAIN:?}; \
                         replacing the producer (its new epoch fences them)"
                    );
                    true
                }
            };
            if replace {
                self.replace_producer()?;
            }
        }
        self.forget_txn(true);
        let Some(consumer) = consumer else {
            return Ok(());
        };
        if self.in_callback {
            // Seeking inside a rebalance callback is not allowed: the loop
            // rewinds right after the poll returns.
            self.rewind_pending = true;
            return Ok(());
        }
        self.rewind(consumer)
    }

    /// A new producer with the same transactional id: its
    /// `init_transactions` fences the old one (a new epoch) and resolves its
    /// transaction; the old one is retired (see [`retire`]).
    pub(super) fn replace_producer(&mut self) -> Result<(), StreamError> {
        let fresh = new_producer(&self.d, self.worker)?;
        let old = std::mem::replace(&mut self.producer, fresh);
        retire(&old);
        Ok(())
    }

    /// Drops the open transaction's state in the worker (pending state,
    /// offsets, counts, held outputs, delivery reports), once the
    /// producer's side is aborted or the producer replaced. What it took
    /// from the usage ledger goes back (`bill_again`: it did not commit),
    /// for the next commit to bill.
    pub(super) fn forget_txn(&mut self, bill_again: bool) {
        Metrics::add(&self.d.metrics.aborts, 1);
        for task in self.tasks.values_mut() {
            task.abort();
        }
        let burned = self.txn.forget();
        self.failed_offsets = None;
        if bill_again {
            self.unbill(&burned);
        }
        *self.producer.context().deliveries() = Deliveries::default();
    }

    /// Gives what a transaction that did not commit took from the usage
    /// ledger (fuel, log lines: the guest did burn them) back to it.
    pub(super) fn unbill(&self, work: &Pending) {
        Metrics::add(&self.d.metrics.unbilled_fuel, work.fuel);
        Metrics::add(&self.d.metrics.unbilled_log_lines, work.log_lines);
    }

    /// Whether the open transaction, whose outcome was unknown, committed
    /// after all: only a commit that failed may have ([`Core::reopen_failed`]
    /// keeps its offsets), and it did if the group's committed offsets
    /// (stable: a new producer's init_transactions has resolved it) reach
    /// them. Unknown (no offsets, the group unreadable) counts as
    /// committed: its usage is then billed at most once, never twice
    /// (eos-audit-3 finding 6).
    fn committed_after_all(&self, consumer: &BaseConsumer<WorkerContext>) -> bool {
        let Some(failed) = &self.failed_offsets else {
            // A failure before the commit: it never committed.
            return false;
        };
        if failed.is_empty() {
            return true;
        }
        let offsets = kafka::offsets_list(failed);
        match kafka::committed_offsets(consumer, &offsets, TXN_CALL_TIMEOUT) {
            Ok(committed) => failed.iter().all(|((topic, p), next)| {
                committed
                    .find_partition(topic, *p)
                    .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *next))
            }),
            Err(e) => {
                let e = e.into_cause();
                tracing::info!(
                    worker = self.worker,
                    "reading the committed offsets to tell whether a transaction committed: {e}; \
                     its usage is not billed again"
                );
                true
            }
        }
    }

    /// Seeks every assigned partition back to its committed offset.
    pub(super) fn rewind(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        self.rewind_pending = false;
        // Polled and not processed: read again from the committed offsets.
        self.queued.clear();
        let assignment = consumer
            .assignment()
            .map_err(|e| Restart::kafka("reading the assignment", e))?;
        if assignment.count() == 0 {
            return Ok(());
        }
        let committed = kafka::committed_offsets(consumer, &assignment, TXN_CALL_TIMEOUT)
            .map_err(|e| Restart::kafka("reading committed offsets", e.into_cause()))?;
        let mut rewind = TopicPartitionList::new();
        for e in committed.elements() {
            let at = (e.topic().to_owned(), e.partition());
            let offset = match e.offset() {
                Offset::Offset(o) => {
                    self.read_from.insert(at, o);
                    Offset::Offset(o)
                }
                _ => {
                    self.read_from.remove(&at);
                    Offset::Beginning
                }
            };
            let _ = rewind.add_partition_offset(e.topic(), e.partition(), offset);
        }
        consumer
            .seek_partitions(rewind, TXN_CALL_TIMEOUT)
            .map_err(|e| Restart::kafka("rewinding", e))?;
        Ok(())
    }
}
