//! The failure arms of the protocol: a failed call or delivery inside the
//! transaction aborts it (the producer's side first, then the worker's:
//! stores' pending layers, guests, input rewound to the committed
//! offsets), replaces the producer when the outcome is unknown, or ends the
//! session. Every arm returns [`Flow::Aborted`] or an error.

use super::*;

impl Core {
    /// Records of the transaction were not delivered.
    pub(super) fn on_undelivered(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    ) -> Result<Flow, StreamError> {
        if let Some(code) = code.filter(|c| kafka::is_authorization(*c)) {
            let _ = self.abort(None);
            return Err(refused(&self.d, self.worker, code, Some(&first.topic)));
        }
        let first = first.message;
        if let Some(code) = code.filter(|c| is_unsendable(*c)) {
            // Retrying cannot help: the same record would be refused
            // again, forever.
            let _ = self.abort(None);
            return Err(StreamError::Unsendable {
                message: format!("{first}: {code}"),
            });
        }
        tracing::warn!("{count} records failed delivery (first: {first}); aborting");
        if code.is_some_and(is_timeout) {
            // A produce request whose outcome is unknown may still land:
            // only a new producer epoch keeps it out of later
            // transactions.
            return self.abort_unknown(consumer, "a delivery timed out");
        }
        self.abort(Some(consumer)).map(|()| Flow::Aborted)
    }

    /// Acts on a failed Kafka call inside the transaction.
    pub(super) fn on_txn_error(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        operation: &str,
        e: KafkaError,
    ) -> Result<Flow, StreamError> {
        if let Some(code) = kafka::authorization_failure(&e) {
            let _ = self.abort(None);
            return Err(refused(&self.d, self.worker, code, None));
        }
        if kafka::is_fencing(&e) {
            Metrics::add(&self.d.metrics.fenced, 1);
            tracing::warn!(worker = self.worker, "{operation}: fenced: {e}");
            return Err(Restart::fenced(operation, e));
        }
        if let Some(code) = e.rdkafka_error_code().filter(|c| is_unsendable(*c)) {
            let _ = self.abort(None);
            return Err(StreamError::Unsendable {
                message: format!("{operation}: {e}: {code}"),
            });
        }
        if !self.d.exactly_once() {
            return Err(Restart::kafka(operation, e));
        }
        if kafka::is_stale_generation(&e) {
            // A rebalance began while this transaction was open (its offsets
            // carry the old generation), or the member's session expired.
            // Abort and read the input again from the committed offsets; the
            // producer and the consumer stay, and the consumer rejoins by
            // itself (a new consumer under the same static id would get its
            // old assignment back without a rebalance, and a partition
            // revoked meanwhile would be owned by nobody).
            tracing::info!(
                worker = self.worker,
                "{operation}: {e}: the group is rebalancing; aborting and rewinding"
            );
            return self.abort(Some(consumer)).map(|()| Flow::Aborted);
        }
        if e.rdkafka_error_code().is_some_and(is_timeout) {
            return self.abort_unknown(consumer, &format!("{operation}: {e}"));
        }
        if let KafkaError::MessageProduction(_) = e {
            // The producer refused a record (its transaction is in an
            // abortable state after an earlier failure): nothing of this
            // transaction can commit; abort it (a failing abort ends the
            // session).
            tracing::warn!(
                worker = self.worker,
                "{operation}: {e}; aborting the transaction"
            );
            return self.abort(Some(consumer)).map(|()| Flow::Aborted);
        }
        match kafka::classify(&e) {
            TxnFailure::Abort => {
                tracing::warn!(
                    worker = self.worker,
                    "{operation}: {e}; aborting the transaction"
                );
                self.abort(Some(consumer)).map(|()| Flow::Aborted)
            }
            _ => Err(Restart::kafka(operation, e)),
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
        self.forget_txn();
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
        if self.txn.flight().is_some() {
            // Never under a commit in flight: it ends first. Committed, it
            // stays (step 5 runs); failed, it is handled as any failed
            // commit, which aborts what came after it too. Without a
            // consumer the session ends: a failed one is aborted below, and
            // a committed one's stores catch up from their changelogs when
            // the tasks open again.
            let (flight, next) = self.take_flight();
            let outcome = flight.wait()?;
            let committed = matches!(outcome, CommitOutcome::Committed { .. });
            match consumer {
                Some(consumer) if committed => {
                    // What came behind it never began at the producer:
                    // nothing to abort there.
                    if let Some(next) = next {
                        self.carry(next);
                    }
                    let _ = self.finish_commit(consumer, flight, None, outcome)?;
                }
                Some(consumer) => {
                    // The failure arms abort (or end the session).
                    self.txn = Txn::Open(self.failed_txn(&flight, next));
                    let _aborted = self.on_failed_commit(consumer, outcome)?;
                    return Ok(());
                }
                None if committed => {
                    if let Some(next) = next {
                        self.carry(next);
                    }
                }
                None => self.txn = Txn::Open(self.failed_txn(&flight, next)),
            }
        }
        let producer_open = matches!(self.txn, Txn::Open(_));
        if self.d.exactly_once() && producer_open {
            match abort_transaction(&self.producer) {
                Aborted::Clean => {}
                Aborted::Unacknowledged(records) => {
                    tracing::info!(
                        worker = self.worker,
                        records,
                        "records of the aborted transaction unacknowledged after {ABORT_DRAIN:?}; \
                         replacing the producer (its new epoch fences them)"
                    );
                    self.replace_producer()?;
                }
                Aborted::Refused(e) => {
                    // The coordinator may have aborted it already (a
                    // transaction past its timeout: "invalid state", or the
                    // epoch bumped: "fenced"). A new producer's
                    // init_transactions aborts it in any case, and the
                    // consumer keeps its membership: restarting the session
                    // here (as before) rejoined as the same static member in
                    // the middle of a cooperative rebalance, and partitions
                    // revoked in its first round were then owned by nobody
                    // (seen in the network-fault drill: 2 of 6 partitions
                    // stranded).
                    tracing::info!(
                        worker = self.worker,
                        "abort_transaction: {e}; replacing the producer instead"
                    );
                    self.replace_producer()?;
                }
            }
        }
        self.forget_txn();
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
    /// producer's side is aborted or the producer replaced; what its
    /// attempts burned is billed with the next commit.
    pub(super) fn forget_txn(&mut self) {
        Metrics::add(&self.d.metrics.aborts, 1);
        for task in self.tasks.values_mut() {
            task.abort();
        }
        match std::mem::replace(&mut self.txn, Txn::Idle) {
            Txn::Idle => {}
            Txn::Open(open) => self.carry(open),
            Txn::Committing { flight, next } => {
                // Only after its outcome was learnt (`abort` waits for it):
                // here only when the session ends.
                self.carried.fuel += flight.pending.fuel;
                self.carried.log_lines += flight.pending.log_lines;
                if let Some(next) = next {
                    self.carry(next);
                }
            }
        }
        *self.producer.context().deliveries() = Deliveries::default();
    }

    /// Keeps what a dropped transaction's work burned (fuel, log lines) for
    /// the next commit to bill.
    fn carry(&mut self, dropped: Open) {
        self.carried.fuel += dropped.pending.fuel;
        self.carried.log_lines += dropped.pending.log_lines;
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
        let committed = consumer
            .committed_offsets(assignment, TXN_CALL_TIMEOUT)
            .map_err(|e| Restart::kafka("reading committed offsets", e))?;
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
