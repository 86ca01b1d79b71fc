//! The commit protocol (steps 2-5 of the loop in `mod.rs`), top to bottom:
//! the transaction ([`Txn`]: `stream/protocol.rs`, its state and
//! decisions, shared with the simulation) begun for the first record,
//! committed on the session's committer thread (`committer.rs`) while the
//! worker goes on, finished when it returns. Its failure arms (abort,
//! rewind, a new producer, the end of the session) are in `abort.rs`.

use super::*;

impl Core {
    /// Begins a transaction if none is open; while a commit is in flight,
    /// opens the next one behind it (its Kafka transaction begins when the
    /// commit returns).
    pub(super) fn ensure_txn(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        let open = || {
            Open::new(
                Instant::now(),
                consumer.group_metadata(),
                Pending::default(),
            )
        };
        let (init, producer) = (&mut self.producer_init, &self.producer);
        let eos = self.d.exactly_once();
        self.txn.ensure(open, || begin(init, producer, eos))
    }

    /// Waits for the producer's `init_transactions` (started with the
    /// session): the crashed incarnation's transaction is aborted, so the
    /// committed offsets are stable and the changelogs' ends final.
    pub(super) fn producer_ready(&mut self) -> Result<(), StreamError> {
        ready(&mut self.producer_init)
    }

    /// The protocol, synchronously: a commit in flight returns first (and
    /// what was processed meanwhile becomes the open transaction), then the
    /// open transaction commits. Runs in the poll loop and in the rebalance
    /// callbacks.
    pub(super) fn commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<Flow, StreamError> {
        if self.settle(consumer)? == Flow::Aborted {
            return Ok(Flow::Aborted);
        }
        if self.start_commit(consumer)? == Flow::Aborted {
            return Ok(Flow::Aborted);
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
    ) -> Result<Flow, StreamError> {
        if !matches!(self.txn, Txn::Open(_)) {
            return Ok(Flow::Go);
        }

        // 1. Every dirty key's latest value (or tombstone) to its store's
        //    changelog, in the same partition as the task's input.
        let changes = match self.send_changes() {
            Ok(changes) => changes,
            Err(e) => return self.on_txn_error(consumer, "producing a changelog record", e),
        };
        // 1a. What replaying the transaction needs that Kafka does not
        //     keep (`stream/replay/`): one record per task that processed
        //     records, in the same transaction.
        let replays = self.replay_records(&changes)?;
        if let Err(e) = self.send_replays(replays) {
            return self.on_txn_error(consumer, "producing a replay record", e);
        }
        // 1b. What this transaction's work used, in the same transaction
        //     (a fleet host only): committed work is counted exactly once.
        if let Err(e) = self.send_usage() {
            return self.on_txn_error(consumer, "producing a usage record", e);
        }
        let Some(mut open) = self.txn.freeze(Instant::now()) else {
            unreachable!("checked above");
        };

        // Each input offset of a task that keeps time (window stores or
        // punctuation) carries its stream time, as Kafka Streams keeps a
        // partition's time: it commits with the offsets, so a restarted task
        // goes on from the same stream time. (Only those: with metadata on
        // the offsets, the abort after a failed record was then refused as
        // "invalid state" in hardening h06; not understood yet.)
        let offsets = kafka::offsets_list(&open.offsets);
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
        for task in self.tasks.values_mut() {
            task.freeze();
        }
        if !self.d.exactly_once() {
            // at_least_once: flush here, then the consumer commits.
            let mut outcome = Committer::run_here(&self.producer, offsets.clone());
            if matches!(outcome, CommitOutcome::Committed { .. })
                && offsets.count() > 0
                && let Err(e) = consumer.commit(&offsets, CommitMode::Sync)
            {
                outcome = CommitOutcome::Commit(e);
            }
            return self.finish_commit(consumer, open, None, outcome);
        }
        // The offsets go with the consumer's group metadata: the group
        // coordinator refuses them if this member's generation is stale (a
        // zombie whose partitions moved), and the transaction cannot commit.
        let Some(group) = open.group.take() else {
            return Err(Restart::NoGroupMetadata.into());
        };
        let flight = self.committer.submit(&self.producer, offsets, group)?;
        self.txn.committing(flight, open);
        Ok(Flow::Go)
    }

    /// Step 1: each task's pending changes to its stores' changelogs.
    /// Returns how many records went to each (partition, store).
    fn send_changes(&mut self) -> Result<BTreeMap<(i32, String), u64>, KafkaError> {
        let mut sent = BTreeMap::new();
        for task in self.tasks.values() {
            for changes in task.pending_changes() {
                let topic = self.changelog_of(&changes.store);
                sent.insert(
                    (task.partition(), changes.store.clone()),
                    changes.changes.len() as u64,
                );
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
                    if let Some(open) = self.txn.current_mut() {
                        open.work.state_bytes +=
                            (key.len() + value.as_ref().map_or(0, Vec::len)) as u64;
                    }
                }
            }
        }
        Ok(sent)
    }

    /// Step 1a: each task's replay record (`stream/replay/`), with its
    /// stores' changelog positions as the transaction began (the last
    /// transaction's changes are in RocksDB: a commit starts only after
    /// the one before it returned) and how many changelog records this
    /// one sent. Every task's log is taken, written or not.
    fn replay_records(
        &mut self,
        changes: &BTreeMap<(i32, String), u64>,
    ) -> Result<Vec<(i32, Vec<u8>)>, StreamError> {
        let mut records = Vec::new();
        let on = self.d.replay_topic.is_some();
        for task in self.tasks.values_mut() {
            let Some(log) = task.take_replay().filter(|_| on) else {
                continue;
            };
            let p = task.partition();
            let stores = self.d.changelogs.iter().map(|(s, _)| s);
            let tables = self.d.manifest.tables.iter().map(|(s, _)| s);
            let mut positions = Vec::new();
            for store in stores.chain(tables) {
                let from = task
                    .changelog_position(store)
                    .map_err(StreamError::Task)?
                    .unwrap_or(0);
                let sent = changes.get(&(p, store.clone())).copied().unwrap_or(0);
                positions.push((store.clone(), from, sent));
            }
            let record = replay::ReplayRecord::new(&self.d.processor, positions, log);
            records.push((p, record.encode()));
        }
        Ok(records)
    }

    /// Sends the replay records of step 1a.
    fn send_replays(&mut self, records: Vec<(i32, Vec<u8>)>) -> Result<(), KafkaError> {
        let Some(topic) = self.d.replay_topic.as_deref() else {
            return Ok(());
        };
        for (partition, value) in records {
            kafka::send(
                &self.producer,
                kafka::Outgoing {
                    topic,
                    partition: Some(partition),
                    key: None,
                    value: Some(&value),
                    headers: &[],
                    timestamp: None,
                },
            )?;
        }
        Ok(())
    }

    /// Step 1b: the transaction's usage record (a fleet host only).
    fn send_usage(&mut self) -> Result<(), KafkaError> {
        let Some(topic) = self.d.options.usage_topic.clone() else {
            return Ok(());
        };
        let Some(open) = self.txn.current_mut() else {
            return Ok(());
        };
        // Everything burned since the last record, from the deployment's
        // ledger: given back if this transaction does not commit.
        let ledger = &self.d.metrics;
        open.work.log_lines += ledger.unbilled_log_lines.swap(0, Ordering::Relaxed);
        open.work.fuel += ledger.unbilled_fuel.swap(0, Ordering::Relaxed);
        let usage = open.work.usage();
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
    ) -> Result<Flow, StreamError> {
        let Some(outcome) = self.txn.flight().and_then(InFlight::try_outcome) else {
            return Ok(Flow::Go);
        };
        let Commit { frozen, next, .. } = self.txn.take_flight().expect("a commit in flight");
        self.finish_commit(consumer, frozen, next, outcome?)
    }

    /// Waits for the commit in flight, if any, and acts on its outcome.
    pub(super) fn settle(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<Flow, StreamError> {
        let Some(Commit {
            flight,
            frozen,
            next,
        }) = self.txn.take_flight()
        else {
            return Ok(Flow::Go);
        };
        let outcome = flight.wait()?;
        self.finish_commit(consumer, frozen, next, outcome)
    }

    /// A commit of `frozen` returned. Committed: step 5, then the next
    /// transaction begins with the outputs held meanwhile. Failed: the
    /// transaction is aborted (it is still the producer's open one), and
    /// with it whatever was processed since.
    pub(super) fn finish_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        frozen: Open,
        next: Option<Open>,
        outcome: CommitOutcome,
    ) -> Result<Flow, StreamError> {
        let changelog_offsets = match outcome {
            CommitOutcome::Committed { changelog_offsets } => changelog_offsets,
            failed => {
                self.reopen_failed(frozen, next);
                return self.on_failed_commit(consumer, failed);
            }
        };
        self.apply_committed(&frozen, &changelog_offsets)?;
        // What was processed during the commit: its transaction.
        let (init, producer) = (&mut self.producer_init, &self.producer);
        let eos = self.d.exactly_once();
        let held = self.txn.begin_next(next, || begin(init, producer, eos))?;
        for o in held {
            if let Err(e) = kafka::send_output(&self.producer, &o) {
                return self.on_txn_error(consumer, "producing an output", e);
            }
        }
        Ok(Flow::Go)
    }

    /// The producer's transaction after a failed commit is the one that
    /// failed (still open there); the records processed behind it are
    /// dropped with it.
    pub(super) fn reopen_failed(&mut self, frozen: Open, next: Option<Open>) {
        // Its offsets, to tell once its outcome is settled whether it
        // committed after all ([`Core::committed_after_all`]).
        self.failed_offsets = Some(frozen.offsets.clone());
        if let Some(next) = self.txn.failed(frozen, next) {
            tracing::info!(
                worker = self.worker,
                records = next.work.records,
                "a commit failed with records processed behind it: they are dropped \
                 with it and read again"
            );
        }
    }

    /// The failure arms of a commit (the failed transaction is the open
    /// one): each aborts, or ends the session ([`protocol::decide`]).
    pub(super) fn on_failed_commit(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        failed: CommitOutcome,
    ) -> Result<Flow, StreamError> {
        let (step, cause) = match failed {
            CommitOutcome::Committed { .. } => unreachable!("a failed commit"),
            CommitOutcome::Flush(error) => (Step::Call, Cause::call("flushing", error)),
            CommitOutcome::Undelivered { count, code, first } => {
                (Step::Delivery, Cause::Delivery { count, code, first })
            }
            CommitOutcome::Offsets(error) => (
                Step::Call,
                Cause::call("send_offsets_to_transaction", error),
            ),
            CommitOutcome::Commit(error) if !self.d.exactly_once() => {
                (Step::EndTxn, Cause::call("committing offsets", error))
            }
            CommitOutcome::Commit(error) => {
                (Step::EndTxn, Cause::call("commit_transaction", error))
            }
        };
        self.on_failure(consumer, step, cause)
    }

    /// Step 5 of a transaction that committed: now, and only now, its
    /// frozen changes go to RocksDB, with the changelog positions in the
    /// same write batch; its counts go to the metrics.
    fn apply_committed(
        &mut self,
        frozen: &Open,
        changelog_offsets: &HashMap<(String, i32), i64>,
    ) -> Result<(), StreamError> {
        // Every store is in sync with its log as of the commit's start:
        // what comes after its positions is the next transactions' (a
        // table's: what the consumer reads next).
        let synced = std::time::SystemTime::now()
            .checked_sub(frozen.started.elapsed())
            .unwrap_or(std::time::UNIX_EPOCH);
        for task in self.tasks.values_mut() {
            let p = task.partition();
            // (A task still restoring is in sync once its restore ends.)
            let synced = (!self.restoring.contains(&p)).then_some(synced);
            let changelogs = self.d.changelogs.iter().filter_map(|(store, topic)| {
                changelog_offsets
                    .get(&(topic.clone(), p))
                    .map(|last| (store.clone(), last + 1))
            });
            // A table's position is its topic's next offset.
            let tables = self.d.manifest.tables.iter().filter_map(|(store, topic)| {
                frozen
                    .offsets
                    .get(&(topic.clone(), p))
                    .map(|next| (store.clone(), *next))
            });
            let positions: Vec<(String, i64)> = changelogs.chain(tables).collect();
            task.apply_committed(positions, synced)
                .map_err(StreamError::Task)?;
        }
        let m = &self.d.metrics;
        let p = &frozen.work;
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
        let took = frozen.started.elapsed();
        m.commit_latency(took);
        tracing::debug!(
            worker = self.worker,
            records = p.records,
            outputs = p.outputs,
            ms = took.as_millis() as u64,
            "transaction committed"
        );
        Ok(())
    }
}

/// Waits for the producer's `init_transactions` if it has not returned yet.
fn ready(
    init: &mut Option<std::sync::mpsc::Receiver<Result<(), StreamError>>>,
) -> Result<(), StreamError> {
    let Some(init) = init.take() else {
        return Ok(());
    };
    init.recv()
        .unwrap_or_else(|_| Err(Restart::lost("the producer's init thread")))
}

/// Begins the producer's transaction (at_least_once: nothing to begin).
fn begin(
    init: &mut Option<std::sync::mpsc::Receiver<Result<(), StreamError>>>,
    producer: &BaseProducer<ProducerCtx>,
    exactly_once: bool,
) -> Result<(), StreamError> {
    ready(init)?;
    if exactly_once {
        producer
            .begin_transaction()
            .map_err(|e| Restart::kafka("begin_transaction", e))?;
    }
    Ok(())
}
