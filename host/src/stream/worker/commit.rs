//! The commit protocol (steps 2-5 of the loop in `mod.rs`): the
//! transaction begun for the first record, committed on the session's
//! committer thread (`committer.rs`) while the worker goes on, finished when
//! it returns; its failures abort and rewind, or end the session.

use super::*;

impl Core {
    /// Whether anything is processed and not committed yet: an open
    /// transaction, a commit in flight, or records processed meanwhile.
    pub(super) fn busy(&self) -> bool {
        self.in_txn || self.deferred || self.in_flight.is_some()
    }

    /// Begins a transaction if none is open; while a commit is in flight,
    /// marks the records that follow as the next transaction's (it begins
    /// when the commit returns).
    pub(super) fn ensure_txn(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        if self.in_txn || self.deferred {
            return Ok(());
        }
        // The generation this transaction's records are read under: its
        // offsets go with it, so that a transaction across a rebalance can
        // never commit (the coordinator refuses the old generation), even
        // when the worker commits before it has served the rebalance's
        // callbacks.
        self.txn_group = consumer.group_metadata();
        self.txn_started = Instant::now();
        if self.in_flight.is_some() {
            self.deferred = true;
            return Ok(());
        }
        self.begin()
    }

    /// Waits for the producer's `init_transactions` (started with the
    /// session): the crashed incarnation's transaction is aborted, so the
    /// committed offsets are stable and the changelogs' ends final.
    pub(super) fn producer_ready(&mut self) -> Result<(), StreamError> {
        let Some(init) = self.producer_init.take() else {
            return Ok(());
        };
        init.recv()
            .unwrap_or_else(|_| Err(Restart::lost("the producer's init thread")))
    }

    pub(super) fn begin(&mut self) -> Result<(), StreamError> {
        self.producer_ready()?;
        if self.d.exactly_once() {
            self.producer
                .begin_transaction()
                .map_err(|e| Restart::kafka("begin_transaction", e))?;
        }
        self.in_txn = true;
        Ok(())
    }

    /// The protocol, synchronously: a commit in flight returns first (and
    /// what was processed meanwhile becomes the open transaction), then the
    /// open transaction commits. Runs in the poll loop and in the rebalance
    /// callbacks.
    pub(super) fn commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        self.settle(consumer)?;
        if !self.in_txn {
            return Ok(());
        }
        let aborts = self.aborts;
        self.start_commit(consumer)?;
        if self.aborts != aborts {
            return Ok(());
        }
        self.settle(consumer)
    }

    /// The protocol, top to bottom. Steps 1 and 1b put the state changes
    /// and the usage into the open transaction; then the tasks' changes are
    /// frozen and steps 2-4 (flush, offsets, commit: [`run_commit`]) run on
    /// a thread of their own. The worker goes on meanwhile: the next
    /// records' state writes layer over the frozen changes and their
    /// outputs wait in memory, for the next transaction, which begins when
    /// this one returns ([`Core::finish_commit`]: step 5, the frozen
    /// changes into RocksDB). If it fails, both are dropped and the input
    /// is read again from the committed offsets. at_least_once runs the
    /// steps here, without a transaction.
    pub(super) fn start_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        if !self.in_txn {
            return Ok(());
        }
        debug_assert!(self.in_flight.is_none(), "one commit in flight at a time");
        let started = Instant::now();

        // 1. Every dirty key's latest value (or tombstone) to its store's
        //    changelog, in the same partition as the task's input.
        if let Err(e) = self.send_changes() {
            return self.on_txn_error(consumer, "producing a changelog record", e);
        }
        // 1b. What this transaction's work used, in the same transaction
        //     (a fleet host only): committed work is counted exactly once.
        if let Err(e) = self.send_usage() {
            return self.on_txn_error(consumer, "producing a usage record", e);
        }

        // Each input offset of a task that keeps time (window stores or
        // punctuation) carries its stream time, as Kafka Streams keeps a
        // partition's time: it commits with the offsets, so a restarted task
        // goes on from the same stream time. (Only those: with metadata on
        // the offsets, the abort after a failed record was then refused as
        // "invalid state" in hardening h06; not understood yet.)
        let offsets = kafka::offsets_list(&self.next_offsets);
        for elem in offsets.elements().iter_mut() {
            if let Some(time) = self
                .tasks
                .get(&elem.partition())
                .filter(|t| t.keeps_time())
                .and_then(Task::stream_time)
            {
                elem.set_metadata(stream_time_metadata(time));
            }
        }
        let group = if self.d.exactly_once() {
            // The offsets go with the consumer's group metadata: the group
            // coordinator refuses them if this member's generation is stale
            // (a zombie whose partitions moved), and the transaction cannot
            // commit.
            let Some(metadata) = self.txn_group.take() else {
                return Err(Restart::NoGroupMetadata.into());
            };
            Some(metadata)
        } else {
            None
        };
        for task in self.tasks.values_mut() {
            task.freeze();
        }
        self.in_txn = false;
        let taken = (
            std::mem::take(&mut self.next_offsets),
            std::mem::take(&mut self.pending),
        );
        let Some(group) = group else {
            // at_least_once: flush here, then the consumer commits.
            let mut outcome = Committer::run_here(&self.producer, offsets.clone());
            if matches!(outcome, CommitOutcome::Committed { .. })
                && offsets.count() > 0
                && let Err(e) = consumer.commit(&offsets, CommitMode::Sync)
            {
                outcome = CommitOutcome::Commit(e);
            }
            return self.finish_commit(consumer, InFlight::settled(started, taken), outcome, true);
        };
        let flight = self
            .committer
            .submit(&self.producer, offsets, group, started, taken)?;
        self.in_flight = Some(flight);
        Ok(())
    }

    /// Step 1: each task's pending changes to its stores' changelogs.
    fn send_changes(&mut self) -> Result<(), KafkaError> {
        for task in self.tasks.values() {
            for changes in task.pending_changes() {
                let topic = self.changelog_of(&changes.store);
                for (key, value) in &changes.changes {
                    let record = kafka::Outgoing {
                        topic: &topic,
                        partition: Some(task.partition()),
                        key: Some(key),
                        value: value.as_deref(),
                        headers: &[],
                        timestamp: None,
                    };
                    kafka::send(&self.producer, record)?;
                    self.pending.state_bytes +=
                        (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
                }
            }
        }
        Ok(())
    }

    /// Step 1b: the transaction's usage record (a fleet host only).
    fn send_usage(&mut self) -> Result<(), KafkaError> {
        let Some(topic) = self.d.options.usage_topic.clone() else {
            return Ok(());
        };
        self.pending.log_lines += self
            .d
            .metrics
            .unbilled_log_lines
            .swap(0, std::sync::atomic::Ordering::Relaxed);
        let usage = self.pending.usage();
        if usage == Usage::default() {
            return Ok(());
        }
        let m = &self.d.manifest;
        let record = UsageRecord {
            tenant: m.tenant.clone(),
            deployment: m.name.clone(),
            host: self.d.options.instance_id.clone(),
            ts_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64),
            usage,
            id: None,
        };
        let key = format!("{}/{}", m.tenant, m.name);
        let value = serde_json::to_vec(&record).unwrap_or_default();
        kafka::send(
            &self.producer,
            kafka::Outgoing {
                topic: &topic,
                partition: None,
                key: Some(key.as_bytes()),
                value: Some(&value),
                headers: &[],
                timestamp: None,
            },
        )
    }

    /// Acts on the commit in flight if it has returned (the loop asks every
    /// round).
    pub(super) fn poll_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        let Some(outcome) = self.in_flight.as_ref().and_then(InFlight::try_outcome) else {
            return Ok(());
        };
        let flight = self.in_flight.take().expect("checked above");
        self.finish_commit(consumer, flight, outcome?, true)
    }

    /// Waits for the commit in flight, if any, and acts on its outcome.
    pub(super) fn settle(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        let Some(flight) = self.in_flight.take() else {
            return Ok(());
        };
        let outcome = flight.wait()?;
        self.finish_commit(consumer, flight, outcome, true)
    }

    /// A commit returned. Committed: step 5, then (`go_on`) the next
    /// transaction begins with the outputs held meanwhile. Failed: the
    /// transaction is aborted (it is still the producer's open one), and
    /// with it whatever was processed since.
    pub(super) fn finish_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        flight: InFlight,
        outcome: CommitOutcome,
        go_on: bool,
    ) -> Result<(), StreamError> {
        let changelog_offsets = match outcome {
            CommitOutcome::Committed { changelog_offsets } => changelog_offsets,
            failed => {
                if self.deferred {
                    tracing::info!(
                        worker = self.worker,
                        records = self.pending.records,
                        "a commit failed with records processed behind it: they are dropped \
                         with it and read again"
                    );
                }
                self.in_txn = true;
                self.pending.fuel += flight.pending.fuel;
                self.pending.log_lines += flight.pending.log_lines;
                return match failed {
                    CommitOutcome::Committed { .. } => unreachable!("matched above"),
                    CommitOutcome::Flush(e) => self.on_txn_error(consumer, "flushing", e),
                    CommitOutcome::Undelivered { count, code, first } => {
                        self.on_undelivered(consumer, count, code, first)
                    }
                    CommitOutcome::Offsets(e) => {
                        self.on_txn_error(consumer, "send_offsets_to_transaction", e)
                    }
                    CommitOutcome::Commit(e) if !self.d.exactly_once() => {
                        Err(Restart::kafka("committing offsets", e))
                    }
                    CommitOutcome::Commit(e) if kafka::is_fencing(&e) => {
                        self.on_txn_error(consumer, "commit_transaction", e)
                    }
                    // Whatever librdkafka calls it, the outcome of an EndTxn
                    // that failed is not known here: it may have committed.
                    CommitOutcome::Commit(e) => {
                        self.abort_unknown(consumer, &format!("commit_transaction: {e}"))
                    }
                };
            }
        };

        // 5. Committed: now, and only now, the frozen changes go to
        //    RocksDB, with the changelog positions in the same write batch.
        for task in self.tasks.values_mut() {
            let p = task.partition();
            let changelogs = self.d.changelogs.iter().filter_map(|(store, topic)| {
                changelog_offsets
                    .get(&(topic.clone(), p))
                    .map(|last| (store.clone(), last + 1))
            });
            // A table's position is its topic's next offset.
            let tables = self.d.manifest.tables.iter().filter_map(|(store, topic)| {
                flight
                    .offsets
                    .get(&(topic.clone(), p))
                    .map(|next| (store.clone(), *next))
            });
            let positions: Vec<(String, i64)> = changelogs.chain(tables).collect();
            task.apply_committed(positions).map_err(StreamError::Task)?;
        }
        let m = &self.d.metrics;
        let p = flight.pending;
        Metrics::add(&m.records, p.records);
        Metrics::add(&m.outputs, p.outputs);
        Metrics::add(&m.dead_lettered, p.dead_lettered);
        Metrics::add(&m.skipped, p.skipped);
        Metrics::add(&m.late_dropped, p.late_dropped);
        Metrics::add(&m.punctuations, p.punctuations);
        Metrics::add(&m.bytes_in, p.input_bytes);
        Metrics::add(&m.bytes_out, p.output_bytes);
        Metrics::add(&m.state_bytes, p.state_bytes);
        Metrics::add(&m.commits, 1);
        let took = flight.started.elapsed();
        m.commit_latency(took);
        tracing::debug!(
            worker = self.worker,
            records = p.records,
            outputs = p.outputs,
            ms = took.as_millis() as u64,
            "transaction committed"
        );

        if go_on && self.deferred {
            // What was processed during the commit: its transaction.
            self.deferred = false;
            self.begin()?;
            for o in std::mem::take(&mut self.held) {
                if let Err(e) = kafka::send_output(&self.producer, &o) {
                    return self.on_txn_error(consumer, "producing an output", e);
                }
            }
        }
        Ok(())
    }

    /// Records of the transaction were not delivered.
    pub(super) fn on_undelivered(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        count: u64,
        code: Option<RDKafkaErrorCode>,
        first: FailedDelivery,
    ) -> Result<(), StreamError> {
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
        self.abort(Some(consumer))
    }

    /// Acts on a failed Kafka call inside the transaction.
    pub(super) fn on_txn_error(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        operation: &str,
        e: KafkaError,
    ) -> Result<(), StreamError> {
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
            return self.abort(Some(consumer));
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
            return self.abort(Some(consumer));
        }
        match kafka::classify(&e) {
            TxnFailure::Abort => {
                tracing::warn!(
                    worker = self.worker,
                    "{operation}: {e}; aborting the transaction"
                );
                self.abort(Some(consumer))
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
    ) -> Result<(), StreamError> {
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
            return Ok(());
        }
        self.rewind(consumer)
    }

    /// Aborts the open transaction: pending state dropped, guests replaced,
    /// and (given the consumer) the input rewound to the committed offsets.
    pub(super) fn abort(
        &mut self,
        consumer: Option<&BaseConsumer<WorkerContext>>,
    ) -> Result<(), StreamError> {
        if let Some(flight) = self.in_flight.take() {
            // Never under a commit in flight: it ends first. Committed, it
            // stays (step 5 runs); failed, it is handled as any failed
            // commit, which aborts what came after it too. Without a
            // consumer the session ends: a failed one is aborted below, and
            // a committed one's stores catch up from their changelogs when
            // the tasks open again.
            let outcome = flight.wait()?;
            match consumer {
                Some(consumer) => {
                    let aborts = self.aborts;
                    self.finish_commit(consumer, flight, outcome, false)?;
                    if self.aborts != aborts {
                        return Ok(());
                    }
                }
                None => {
                    if !matches!(outcome, CommitOutcome::Committed { .. }) {
                        self.in_txn = true;
                    }
                }
            }
        }
        if self.d.exactly_once() && self.in_txn {
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
    /// offsets, counts, delivery reports), once the producer's side is
    /// aborted or the producer replaced.
    pub(super) fn forget_txn(&mut self) {
        Metrics::add(&self.d.metrics.aborts, 1);
        self.aborts += 1;
        for task in self.tasks.values_mut() {
            task.abort();
        }
        self.in_txn = false;
        self.deferred = false;
        self.held.clear();
        self.txn_group = None;
        self.next_offsets.clear();
        self.pending = self.pending.carried();
        *self.producer.context().deliveries() = Deliveries::default();
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
