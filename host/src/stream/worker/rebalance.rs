//! Rebalance handling: the consumer's context (its callbacks abort the
//! open transaction and never commit one; membership from its statistics),
//! and the catch-up of kept tasks after a rebalance.

use super::*;

pub(super) struct WorkerContext {
    pub(super) core: Arc<Mutex<Core>>,
    pub(super) errors: kafka::ErrorLog,
    /// Records behind the last stable offsets over the assigned partitions,
    /// from librdkafka's statistics (every second).
    pub(super) lag: std::sync::atomic::AtomicI64,
    /// Assigned partitions not yet fetched to their last stable offset, or
    /// with fetched records not yet polled (the statistics' `next_offset`,
    /// which passes transaction markers and aborted records, and
    /// `fetchq_cnt`): 0 when everything there is reached the worker. Until
    /// the first statistics, 1.
    pub(super) unfetched: std::sync::atomic::AtomicI64,
    /// The consumer's group membership as the statistics report it.
    pub(super) membership: Mutex<Membership>,
}

/// When librdkafka last reported this consumer connected to its group
/// coordinator (group state `up`), and when it last reported at all. The join
/// state is left out on purpose: a rebalance may wait minutes for a member
/// that is restoring, and that is no reason to start over.
pub(super) struct Membership {
    pub(super) last_report: Option<Instant>,
    pub(super) last_connected: Instant,
    pub(super) state: String,
}

/// How long a consumer may go without its group coordinator before the
/// session is re-created. librdkafka can lose its way back to the group
/// coordinator after a broker restart (it keeps a decommissioned broker as
/// the coordinator, librdkafka#5511) and then never rejoins; a new client
/// finds the coordinator again.
pub(super) fn membership_limit(session_timeout: Duration) -> Duration {
    (session_timeout * 3).max(Duration::from_secs(30))
}

/// How long the consumer has been without its coordinator, judged only from statistics
/// seen recently: while the poll loop is busy elsewhere (restoring,
/// committing) no statistics arrive, and that is not the group's fault.
pub(super) fn coordinator_lost_for(membership: &Membership, now: Instant) -> Option<Duration> {
    let report = membership.last_report?;
    if now.saturating_duration_since(report) > Duration::from_secs(5) {
        return None;
    }
    Some(report.saturating_duration_since(membership.last_connected))
}

impl ClientContext for WorkerContext {
    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.report("consumer", &error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        crate::kafka::log(level, fac, message);
    }

    fn stats(&self, statistics: rdkafka::Statistics) {
        if let Some(group) = &statistics.cgrp {
            let now = Instant::now();
            let mut m = self.membership.lock().unwrap_or_else(|e| e.into_inner());
            m.last_report = Some(now);
            if group.state == "up" {
                m.last_connected = now;
            }
            m.state = format!("{}/{}", group.state, group.join_state);
        }
        let lag: i64 = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.iter())
            .filter(|(p, _)| **p >= 0)
            .map(|(_, p)| p.consumer_lag.max(0))
            .sum();
        self.lag.store(lag, Ordering::Relaxed);
        let unfetched = statistics
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .filter(|p| p.partition >= 0 && p.desired)
            .filter(|p| p.fetchq_cnt > 0 || p.ls_offset < 0 || p.next_offset < p.ls_offset)
            .count();
        self.unfetched.store(unfetched as i64, Ordering::Relaxed);
    }
}

impl ConsumerContext for WorkerContext {
    /// Partitions are leaving: abort the open transaction, close their
    /// tasks, and re-synchronise the tasks that stay (see
    /// [`Core::resync_after_rebalance`]).
    ///
    /// A transaction never spans a rebalance, and is never committed in
    /// one: a member that was out of the group without knowing it (its
    /// partitions processed meanwhile by another member) rejoins with a new,
    /// valid generation, and a commit in this callback would carry that
    /// generation and go through, committing records the other member
    /// already committed. Seen in the network-fault drill: 1,115 duplicate
    /// outputs and 172 wrong balances in one round, after a member whose
    /// offsets had been refused as "generation not valid" committed in the
    /// revoke callback of its rejoin. Aborting costs at most one commit
    /// interval of work, processed again from the committed offsets.
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let mut core = lock(&self.core);
        tracing::info!(
            worker = core.worker,
            revoked = ?partitions_of(tpl),
            lost = consumer.assignment_lost(),
            "partitions revoked"
        );
        core.in_callback = true;
        // The protocol's rule: abort, never commit (`protocol::on_rebalance`).
        if crate::stream::protocol::on_rebalance(&core.txn) == Some(Action::Abort) {
            let result = if std::thread::panicking() {
                // The consumer is being dropped while a panic unwinds (a
                // bug in processing): the transaction is half built. Never
                // commit it.
                tracing::error!(
                    worker = core.worker,
                    "aborting the open transaction: the worker panicked"
                );
                core.abort(None)
            } else {
                tracing::info!(
                    worker = core.worker,
                    lost = consumer.assignment_lost(),
                    unacknowledged = core.producer.in_flight_count(),
                    "rebalance: aborting the open transaction"
                );
                // The partitions we keep are rewound by the loop.
                core.abort(Some(consumer))
            };
            if let Err(e) = result {
                core.failure.get_or_insert(e);
            }
        }
        core.in_callback = false;
        for p in partitions_of(tpl) {
            core.revoked_during_poll.insert(p);
            if core.close_task(p) {
                tracing::info!(
                    worker = core.worker,
                    partition = p,
                    "task closed (partition revoked)"
                );
            }
            core.restoring.remove(&p);
        }
        if let Err(e) = core.resync_after_rebalance(consumer) {
            core.failure.get_or_insert(e);
        }
    }

    /// Partitions arrived: open their stores and pause them until restored
    /// (restoring waits for stable offsets, which needs the poll loop).
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let tpl = match rebalance {
            Rebalance::Assign(tpl) => tpl,
            Rebalance::Revoke(_) => return,
            Rebalance::Error(e) => {
                tracing::warn!("rebalance error: {e}");
                return;
            }
        };
        let mut core = lock(&self.core);
        let assigned = partitions_of(tpl);
        tracing::info!(
            worker = core.worker,
            ?assigned,
            topics = %topic_partitions(tpl),
            "partitions assigned"
        );
        // Nothing processed before the rebalance may commit after it (see
        // `pre_rebalance`), and the tasks kept may have been another
        // member's meanwhile.
        core.in_callback = true;
        if crate::stream::protocol::on_rebalance(&core.txn) == Some(Action::Abort) {
            tracing::info!(
                worker = core.worker,
                unacknowledged = core.producer.in_flight_count(),
                "rebalance: aborting the open transaction"
            );
            if let Err(e) = core.abort(Some(consumer)) {
                core.failure.get_or_insert(e);
            }
        }
        core.in_callback = false;
        if let Err(e) = core.resync_after_rebalance(consumer) {
            core.failure.get_or_insert(e);
        }
        let mut pause = TopicPartitionList::new();
        let mut to_open = Vec::new();
        for p in assigned {
            if core.tasks.contains_key(&p) {
                // Assigned again without a revoke in between: the open
                // transaction may hold this partition's records while the
                // consumer reads them again from the committed offset. Only
                // a clean rejoin is safe.
                tracing::warn!(
                    partition = p,
                    "partition assigned while its task is open; rejoining"
                );
                core.failure.get_or_insert(Restart::AssignedTwice(p).into());
                continue;
            }
            to_open.push(p);
        }
        core.start_fencing(consumer, &to_open);
        for (p, opened) in core.open_tasks(&to_open) {
            match opened {
                Ok(task) => {
                    core.tasks.insert(p, task);
                    core.restoring.insert(p);
                    for e in tpl.elements().iter().filter(|e| e.partition() == p) {
                        pause.add_partition(e.topic(), p);
                    }
                }
                Err(e) => {
                    core.failure.get_or_insert(e);
                }
            }
        }
        if pause.count() > 0
            && let Err(e) = consumer.pause(&pause)
        {
            core.failure
                .get_or_insert(StreamError::kafka("pausing partitions to restore", e));
        }
    }
}

/// `topic[0,2] other[0,2]`: an assignment by topic, for the logs (tests
/// check from it that a task's topics were never split between workers).
pub(super) fn topic_partitions(tpl: &TopicPartitionList) -> String {
    let mut by_topic: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for e in tpl.elements() {
        by_topic
            .entry(e.topic().to_owned())
            .or_default()
            .push(e.partition());
    }
    by_topic
        .into_iter()
        .map(|(t, mut ps)| {
            ps.sort_unstable();
            let ps: Vec<String> = ps.iter().map(i32::to_string).collect();
            format!("{t}[{}]", ps.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

pub(super) fn partitions_of(tpl: &TopicPartitionList) -> BTreeSet<i32> {
    tpl.elements().iter().map(|e| e.partition()).collect()
}

/// librdkafka applies a resume on its main thread without waking the
/// thread that fetches from the partition's leader, which sleeps until its
/// next I/O (a heartbeat, a fetch of other partitions) or for up to 1 s:
/// after a restart, with every partition paused to restore, the first
/// records came 0.4 to 0.9 s after the resume (the recovery benchmark;
/// `rd_kafka_toppar_pause_resume` in librdkafka 2.12). Any request to a
/// leader wakes its thread, which then sees the partitions fetchable: one
/// ListOffsets per leader (`offsets_for_times`, "latest"). Only a wake-up:
/// an error is no reason to stop, the fetch starts within a second anyway.
pub(super) fn wake_fetchers(consumer: &BaseConsumer<WorkerContext>, resumed: &TopicPartitionList) {
    let mut latest = TopicPartitionList::new();
    for e in resumed.elements() {
        if let Err(e) = latest.add_partition_offset(e.topic(), e.partition(), Offset::End) {
            tracing::debug!("waking the fetchers: {e}");
            return;
        }
    }
    if let Err(e) = consumer.offsets_for_times(latest, Duration::from_secs(1)) {
        tracing::debug!("waking the fetchers of resumed partitions: {e}");
    }
}

/// Whether the group is steady as librdkafka last reported it (`up/steady`
/// in its statistics; before the first report, `init`, it is taken as
/// steady).
pub(super) fn group_steady(state: &str) -> bool {
    state == "init" || state.ends_with("/steady")
}

impl Core {
    /// After a rebalance, every task this worker keeps catches up with its
    /// changelog and its committed offset before it processes anything
    /// more: if this member was out of the group for a while without
    /// knowing it, another member may have processed (and committed) its
    /// partitions meanwhile. Usually there is nothing to restore (a
    /// watermark check per task).
    pub(super) fn resync_after_rebalance(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        if self.tasks.is_empty() {
            return Ok(());
        }
        self.reload(consumer)?;
        self.rewind_pending = true;
        Ok(())
    }

    /// Every task restores its stores again (from the position of its
    /// committed store) before it processes anything more.
    pub(super) fn reload(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> Result<(), StreamError> {
        let mut pause = TopicPartitionList::new();
        for p in self.tasks.keys() {
            self.restoring.insert(*p);
            if let Some(q) = self.d.queries() {
                q.restoring(&self.d.manifest.application_id(), *p);
            }
            for topic in self.d.manifest.sources() {
                pause.add_partition(topic, *p);
            }
        }
        if pause.count() > 0 {
            consumer
                .pause(&pause)
                .map_err(|e| StreamError::kafka("pausing partitions to restore", e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn membership(report_ago: Option<u64>, connected_ago: u64, now: Instant) -> Membership {
        Membership {
            last_report: report_ago.map(|s| now - Duration::from_secs(s)),
            last_connected: now - Duration::from_secs(connected_ago),
            state: "wait-coord/init".to_owned(),
        }
    }

    #[test]
    fn a_consumer_is_judged_only_on_recent_statistics() {
        let now = Instant::now() + Duration::from_secs(3600);
        // No statistics yet, or none for a while (the loop was restoring):
        // no verdict.
        assert_eq!(coordinator_lost_for(&membership(None, 100, now), now), None);
        assert_eq!(
            coordinator_lost_for(&membership(Some(60), 100, now), now),
            None
        );
        // Recent statistics: lost from the last connected report to the
        // latest report.
        assert_eq!(
            coordinator_lost_for(&membership(Some(1), 41, now), now),
            Some(Duration::from_secs(40))
        );
        assert_eq!(
            coordinator_lost_for(&membership(Some(0), 0, now), now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn the_limit_outlasts_a_session_timeout_and_a_broker_restart() {
        assert_eq!(
            membership_limit(Duration::from_secs(10)),
            Duration::from_secs(30)
        );
        assert_eq!(
            membership_limit(Duration::from_secs(45)),
            Duration::from_secs(135)
        );
        assert_eq!(
            membership_limit(Duration::from_secs(1)),
            Duration::from_secs(30)
        );
    }
}
