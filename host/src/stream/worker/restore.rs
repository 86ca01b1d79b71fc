//! Opening a worker's tasks over their local stores and catching them up
//! with their changelogs (and stable offsets) before they process.

use super::*;

/// Longest a worker restores before it polls its consumer again.
pub(super) const RESTORE_SLICE: Duration = Duration::from_secs(5);
/// How long a restore may keep failing on Kafka errors (a broker away)
/// before the session restarts.
pub(super) const RESTORE_RETRY_LIMIT: Duration = Duration::from_secs(120);
/// How long a restore may keep failing before its clients are replaced by
/// new ones (at most once per this long). After a broker restart, a
/// client's cached metadata can lack a changelog partition: librdkafka
/// answers `UnknownPartition` from its cache, as a permanent error, without
/// asking the brokers again, until the entry expires (`metadata.max.age.ms`,
/// 15 minutes). In the network-fault drill a worker restored nothing for
/// 103 s after a coordinator broker's SIGKILL and restart, until
/// [`RESTORE_RETRY_LIMIT`] or a rebalance ended it; a new client asks the
/// brokers afresh.
pub(super) const RESTORER_RENEW_AFTER: Duration = Duration::from_secs(2);

/// Databases a worker opens at once (see `Core::open_tasks`).
pub(super) const PARALLEL_OPENS: usize = 8;

/// Opens `partition`'s local stores, taking them from a standby that kept
/// them warm (the restore then reads only the changelog's tail past it).
/// Each store's age is judged by the restore (`changelog::restore`): one
/// last in sync with its log longer ago than the log's
/// `delete.retention.ms` is wiped and restored in full. The caller holds
/// `open_tasks`.
pub(super) fn open_store(d: &Deployment, partition: i32) -> Result<RocksPartition, StreamError> {
    let path = d.store_dir(partition);
    if d.standbys.release(partition) {
        tracing::info!(partition, "taking over the partition's standby stores");
    }
    RocksPartition::open(&path, &d.manifest.local_stores()).map_err(StreamError::State)
}

impl Core {
    /// Opens the tasks of `partitions` over their local stores, the
    /// databases up to [`PARALLEL_OPENS`] at a time: after a crash each
    /// replays its write-ahead log, and one after another six partitions
    /// took ~450 ms with 1 GB of state (the recovery benchmark).
    pub(super) fn open_tasks(&self, partitions: &[i32]) -> Vec<(i32, Result<Task, StreamError>)> {
        let d = &*self.d;
        let mut open = d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
        let mut opened = Vec::with_capacity(partitions.len());
        for chunk in partitions.chunks(PARALLEL_OPENS) {
            std::thread::scope(|s| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|&p| (p, s.spawn(move || open_store(d, p))))
                    .collect();
                for (p, h) in handles {
                    let store = h.join().unwrap_or_else(|_| {
                        Err(Restart::lost(format!(
                            "the thread opening the stores of partition {p}"
                        )))
                    });
                    opened.push((p, store));
                }
            });
        }
        opened
            .into_iter()
            .map(|(p, store)| {
                let task = store.map(|store| {
                    open.insert(p);
                    if let Some(q) = d.queries() {
                        q.opened(&d.manifest.application_id(), p, store.reader());
                    }
                    Task::new(
                        p,
                        d.processor.clone(),
                        d.task_config.clone(),
                        Box::new(store),
                    )
                });
                (p, task)
            })
            .collect()
    }

    /// A worker with nothing in flight has its tasks' stores in sync with
    /// their logs (it alone writes their changelogs; a table's topic is
    /// read on by the consumer): marked so about once a minute, so that a
    /// quiet deployment's stores are not taken for stale after a restart
    /// (`changelog::restore` judges them by it).
    pub(super) fn mark_idle_synced(&mut self) -> Result<(), StreamError> {
        if !matches!(self.txn, Txn::Idle) || self.idle_synced.elapsed() < Duration::from_secs(60) {
            return Ok(());
        }
        self.idle_synced = Instant::now();
        let now = std::time::SystemTime::now();
        for task in self.tasks.values_mut() {
            if !self.restoring.contains(&task.partition()) {
                task.mark_synced(now).map_err(StreamError::Task)?;
            }
        }
        Ok(())
    }

    /// Closes `partition`'s task (its stores stay on disk for
    /// `state_cleanup_delay`).
    pub(super) fn close_task(&mut self, partition: i32) -> bool {
        self.restore_failing_since.remove(&partition);
        self.queued.remove(&partition);
        let closed = self.tasks.remove(&partition).is_some();
        if closed {
            if let Some(q) = self.d.queries() {
                q.closed(&self.d.manifest.application_id(), partition);
            }
            self.d
                .open_tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&partition);
        }
        closed
    }

    /// Restores the paused, newly assigned tasks, then resumes them: for
    /// up to [`RESTORE_SLICE`] per call, so that the loop goes on polling
    /// (and processing the partitions that are ready) during a long restore.
    pub(super) fn restore_pending(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        self.producer_ready()?;
        let partitions: Vec<i32> = self.restoring.iter().copied().collect();
        let table_ends = self.stable_positions(consumer, &partitions)?;
        if self.restore_consumer.is_none() {
            self.restore_consumer = Some(changelog::restorer(&self.d)?);
        }
        let restorer = self.restore_consumer.as_ref().expect("created above");
        let restoring = &self.d.metrics.restoring;
        restoring.fetch_add(partitions.len() as u64, Ordering::Relaxed);
        let started = Instant::now();
        // Whether the restore clients are replaced before the next try
        // (see RESTORER_RENEW_AFTER).
        let mut renew = false;
        let mut done = TopicPartitionList::new();
        for p in &partitions {
            let left = RESTORE_SLICE.saturating_sub(started.elapsed());
            if left.is_zero() {
                restoring.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let task = self.tasks.get_mut(p).expect("restoring tasks exist");
            let stats = changelog::restore(&self.d, restorer, task, &table_ends, left);
            restoring.fetch_sub(1, Ordering::Relaxed);
            let stats = match stats {
                Ok(stats) => {
                    self.restore_failing_since.remove(p);
                    stats
                }
                // A broker away (a leader moving): the partition stays
                // paused and restoring, and the next loop tries again from
                // the store's position; the session stays.
                Err(StreamError::Kafka(
                    e @ (kafka::KafkaError::Client { .. } | kafka::KafkaError::Timeout { .. }),
                )) if self
                    .restore_failing_since
                    .entry(*p)
                    .or_insert_with(Instant::now)
                    .elapsed()
                    < RESTORE_RETRY_LIMIT =>
                {
                    let failing = self
                        .restore_failing_since
                        .get(p)
                        .map_or(Duration::ZERO, Instant::elapsed);
                    renew =
                        failing >= RESTORER_RENEW_AFTER && restorer.age() >= RESTORER_RENEW_AFTER;
                    tracing::info!(
                        worker = self.worker,
                        partition = p,
                        failing_ms = failing.as_millis() as u64,
                        renewing_clients = renew,
                        "restore interrupted, trying again: {}",
                        error_chain(&e)
                    );
                    let left = partitions.iter().filter(|&q| q > p).count() as u64;
                    restoring.fetch_sub(left, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                Err(e) => {
                    let left = partitions.iter().filter(|&q| q > p).count() as u64;
                    restoring.fetch_sub(left, Ordering::Relaxed);
                    return Err(e);
                }
            };
            Metrics::add(&self.d.metrics.restored, stats.records);
            tracing::info!(
                worker = self.worker,
                partition = p,
                records = stats.records,
                ms = stats.elapsed.as_millis() as u64,
                finished = stats.finished,
                "restored {} changelog records",
                stats.records
            );
            if stats.finished {
                if let Err(e) = self.check_offsets_kept(*p) {
                    let left = partitions.iter().filter(|&q| q > p).count() as u64;
                    restoring.fetch_sub(left, Ordering::Relaxed);
                    return Err(e);
                }
                Metrics::add(&self.d.metrics.restores, 1);
                self.restoring.remove(p);
                if let Some(q) = self.d.queries() {
                    q.ready(&self.d.manifest.application_id(), *p);
                }
                // Every source resumes at once: records are taken in
                // timestamp order across them (`take_ready`).
                for topic in self.d.manifest.sources() {
                    done.add_partition(topic, *p);
                }
            }
        }
        if renew || self.restoring.is_empty() {
            // A new pair is created at the next try, or at the next restore:
            // between restores (most of a session's life) the worker holds
            // no restore clients, two librdkafka clients (8 threads, 4
            // connections) fewer per deployment on a host of hundreds.
            self.restore_consumer = None;
        }
        if done.count() > 0 {
            consumer
                .resume(&done)
                .map_err(|e| StreamError::kafka("resuming restored partitions", e))?;
            wake_fetchers(consumer, &done);
        }
        Ok(())
    }

    /// Refuses to process `partition` from no committed offsets over stores
    /// that hold committed state (eos-audit-3 finding 5): under
    /// exactly-once a changelog record commits with the offsets, so state
    /// without offsets means the group's offsets were deleted (expired
    /// after `offsets.retention.minutes` with no member, or removed by
    /// hand), and `earliest` would apply the retained input again. A
    /// partition read before has an offset for at least one source.
    fn check_offsets_kept(&self, partition: i32) -> Result<(), StreamError> {
        let d = &self.d;
        let sources = d.manifest.sources();
        if !d.exactly_once()
            || sources
                .iter()
                .any(|t| self.read_from.contains_key(&(t.to_string(), partition)))
        {
            return Ok(());
        }
        let task = &self.tasks[&partition];
        let mut held = Vec::new();
        for (store, _) in &d.changelogs {
            if let Some(at) = task
                .changelog_position(store)
                .map_err(StreamError::Task)?
                .filter(|&at| at > 0)
            {
                held.push(format!("{store} up to changelog offset {at}"));
            }
        }
        if held.is_empty() {
            return Ok(());
        }
        Err(StreamError::OffsetsLost {
            group: d.manifest.application_id(),
            partition,
            topics: sources
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            stores: held.join(", "),
        })
    }

    /// Waits for the committed offsets of `partitions` to be stable and
    /// takes from them where each source is read from, each task's stream
    /// time at its last commit, and where each table's store must be
    /// restored to (returned: the committed offset of its topic; the records
    /// after it come through the consumer).
    fn stable_positions(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
        partitions: &[i32],
    ) -> Result<BTreeMap<(String, i32), i64>, StreamError> {
        let mut tpl = TopicPartitionList::new();
        for topic in self.d.manifest.sources() {
            for p in partitions {
                tpl.add_partition(topic, *p);
            }
        }
        // Wait for the committed offsets to be stable (KIP-447: the previous
        // owner's pending transaction has committed or aborted). Only then
        // is the changelog's end final for what those offsets cover.
        let committed =
            kafka::committed_offsets(consumer, &tpl, TXN_CALL_TIMEOUT).map_err(|e| match e {
                // librdkafka retries UNSTABLE_OFFSET_COMMIT until the timeout
                // and then reports a timeout: say what it usually means.
                kafka::CommittedError::Unanswered(e) => StreamError::from(Restart::Unstable {
                    what: format!(
                        "the committed offsets of group {}",
                        self.d.manifest.application_id()
                    ),
                    waited: TXN_CALL_TIMEOUT,
                    source: Some(kafka::KafkaError::client("committed offsets", e)),
                }),
                kafka::CommittedError::Failed(e) => Restart::kafka("reading committed offsets", e),
            })?;
        let mut table_ends = BTreeMap::new();
        for elem in committed.elements() {
            let at = (elem.topic().to_owned(), elem.partition());
            if let Offset::Offset(o) = elem.offset() {
                table_ends.insert(at.clone(), o);
                self.read_from.insert(at, o);
            } else {
                self.read_from.remove(&at);
            }
        }
        // The stream time each task had at its last commit.
        for elem in committed.elements() {
            let Some(time) = parse_stream_time_metadata(&elem) else {
                continue;
            };
            if let Some(task) = self.tasks.get_mut(&elem.partition())
                && task.stream_time().is_none_or(|t| t < time)
            {
                task.restore_stream_time(Some(time));
            }
        }
        Ok(table_ends)
    }
}
