//! A group member whose positions live outside Kafka (the sink's database):
//! [`GroupReader`] reports the group's rebalances as [`Change`]s, keeps a
//! newly assigned partition paused until its owner says where to start
//! ([`GroupReader::start_at`]), and commits Kafka offsets for lag
//! monitoring only.

use std::sync::Mutex;

use rdkafka::consumer::{CommitMode, Rebalance};
use rdkafka::{Offset, TopicPartitionList};

use super::*;

/// A change of assignment, in the order the consumer reported them.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Newly assigned, paused until [`GroupReader::start_at`].
    Assigned(Vec<(String, i32)>),
    /// Taken away: records of these read and not yet applied belong to the
    /// next owner.
    Revoked(Vec<(String, i32)>),
}

/// The consumer's context: rebalances queued for the loop, newly assigned
/// partitions paused in the callback (the consumer must not fetch from
/// Kafka's committed offsets before the owner seeks).
struct GroupContext {
    changes: Mutex<Vec<Change>>,
    quiet: QuietContext,
}

impl rdkafka::client::ClientContext for GroupContext {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        self.quiet.log(level, fac, log_message);
    }
    fn error(&self, error: ClientError, reason: &str) {
        self.quiet.error(error, reason);
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            lock(&self.changes).push(Change::Revoked(pairs(tpl)));
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                if let Err(e) = consumer.pause(tpl) {
                    tracing::warn!("pausing newly assigned partitions: {e}");
                }
                lock(&self.changes).push(Change::Assigned(pairs(tpl)));
            }
            Rebalance::Revoke(_) => {}
            Rebalance::Error(e) => tracing::warn!("rebalance error: {e}"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pairs(tpl: &TopicPartitionList) -> Vec<(String, i32)> {
    tpl.elements()
        .iter()
        .map(|e| (e.topic().to_owned(), e.partition()))
        .collect()
}

fn list(parts: &[(String, i32)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (t, p) in parts {
        tpl.add_partition(t, *p);
    }
    tpl
}

/// A member of consumer group `group` reading `topics` with
/// read_committed, cooperative-sticky assignment and no automatic commits.
pub(crate) struct GroupReader {
    consumer: BaseConsumer<GroupContext>,
    topics: Vec<String>,
}

impl GroupReader {
    /// Joins `group` as `client_id` and subscribes to `topics`.
    pub(crate) fn subscribe(
        kafka: &Connection,
        group: &str,
        client_id: &str,
        topics: &[&str],
        session: Duration,
    ) -> Result<GroupReader, KafkaError> {
        let mut c = kafka.config();
        c.set("group.id", group)
            .set("client.id", client_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("partition.assignment.strategy", "cooperative-sticky");
        set_session(&mut c, session);
        let consumer: BaseConsumer<GroupContext> = c
            .create_with_context(GroupContext {
                changes: Mutex::new(Vec::new()),
                quiet: QuietContext::default(),
            })
            .map_err(|e| KafkaError::client(format!("creating the consumer ({group})"), e))?;
        consumer
            .subscribe(topics)
            .map_err(|e| KafkaError::client(format!("subscribing to {}", topics.join(", ")), e))?;
        Ok(GroupReader {
            consumer,
            topics: topics.iter().map(|t| t.to_string()).collect(),
        })
    }

    /// Those of `parts` the group assigns to this member now (an
    /// assignment reported earlier may have been lost since: the member
    /// was expelled while it did not poll).
    pub(crate) fn still_assigned(
        &self,
        parts: &[(String, i32)],
    ) -> Result<Vec<(String, i32)>, KafkaError> {
        let assigned = self
            .consumer
            .assignment()
            .map_err(|e| KafkaError::client("reading the assignment", e))?;
        Ok(parts
            .iter()
            .filter(|(t, p)| assigned.find_partition(t, *p).is_some())
            .cloned()
            .collect())
    }

    /// Leaves the group and joins it again: every partition is revoked
    /// (reported as a [`Change`]), and the group assigns anew.
    pub(crate) fn rejoin(&self) -> Result<(), KafkaError> {
        self.consumer.unsubscribe();
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        self.consumer
            .subscribe(&topics)
            .map_err(|e| KafkaError::client(format!("subscribing to {}", topics.join(", ")), e))
    }

    /// Polls once, up to `timeout` (rebalance callbacks run inside).
    pub(crate) fn poll(&self, timeout: Duration) -> Polled<'_> {
        poll(&self.consumer, timeout)
    }

    /// The rebalances reported since the last call, in order.
    pub(crate) fn changes(&self) -> Vec<Change> {
        std::mem::take(&mut *lock(&self.consumer.context().changes))
    }

    /// Stops fetching `parts` (until they are assigned and started again).
    pub(crate) fn pause(&self, parts: &[(String, i32)]) -> Result<(), KafkaError> {
        self.consumer
            .pause(&list(parts))
            .map_err(|e| KafkaError::client("pausing partitions", e))
    }

    /// Fetches `parts` again where the application's position is (after
    /// [`GroupReader::pause`]: nothing is skipped or read twice).
    pub(crate) fn resume(&self, parts: &[(String, i32)]) -> Result<(), KafkaError> {
        self.consumer
            .resume(&list(parts))
            .map_err(|e| KafkaError::client("resuming partitions", e))
    }

    /// Reads each of `starts` (paused since assigned) from its owner's
    /// position, `None` being the beginning, then resumes them.
    pub(crate) fn start_at(&self, starts: &[(String, i32, Option<i64>)]) -> Result<(), KafkaError> {
        let mut seek = TopicPartitionList::new();
        let mut parts = Vec::with_capacity(starts.len());
        for (topic, partition, next) in starts {
            let offset = next.map_or(Offset::Beginning, Offset::Offset);
            seek.add_partition_offset(topic, *partition, offset)
                .map_err(|e| KafkaError::client(format!("seeking {topic}/{partition}"), e))?;
            parts.push((topic.clone(), *partition));
        }
        self.consumer
            .seek_partitions(seek, Duration::from_secs(10))
            .map_err(|e| KafkaError::client("seeking to the owner's positions", e))?;
        self.consumer
            .resume(&list(&parts))
            .map_err(|e| KafkaError::client("resuming started partitions", e))
    }

    /// Commits `next` offsets to Kafka without waiting (for lag monitoring:
    /// the owner's positions are its own).
    pub(crate) fn commit_async(
        &self,
        next: &std::collections::BTreeMap<(String, i32), i64>,
    ) -> Result<(), KafkaError> {
        self.consumer
            .commit(&offsets_list(next), CommitMode::Async)
            .map_err(|e| KafkaError::client("committing offsets", e))
    }
}
