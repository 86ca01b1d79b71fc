//! Multi-topic alignment: a task's topics go to it in timestamp order,
//! waiting a bounded time for a topic not yet read; and stream time carried
//! in the committed offsets' metadata.

use super::*;

/// A task's polled records while it has more than one source topic (inputs
/// and tables), one queue per topic in the order of
/// [`Core::source_order`]. Kafka Streams' `max.task.idle.ms` at its default
/// (0): the task takes the record with the smallest timestamp among its
/// topics' heads, and while a topic's queue is empty it waits if that
/// topic's partition has records on the broker it has not read (they may
/// come first), and goes on without it when it is read to its end.
pub(super) struct Queued {
    pub(super) queues: Vec<VecDeque<InputRecord>>,
    /// Since when the task has waited for an empty topic with unread
    /// records.
    pub(super) waiting_since: Option<Instant>,
    /// When the waiting task last asked the broker for the last stable
    /// offsets, and which of its topics were read up to them then.
    pub(super) stable_check: Option<(Instant, Vec<bool>)>,
    /// It waited [`MAX_SOURCE_WAIT`] and goes on without the empty topics.
    pub(super) gave_up: bool,
}

impl Queued {
    /// The records the task may process now, in timestamp order across its
    /// topics (on a tie, the topic first; a topic's records keep their
    /// offset order even when their timestamps go back), for as long as no
    /// topic is empty or `may_go_without` the empty ones (their ranks) says
    /// yes; it may wait at most [`MAX_SOURCE_WAIT`].
    pub(super) fn take(
        &mut self,
        mut may_go_without: impl FnMut(&[usize], &mut Queued) -> bool,
    ) -> Vec<InputRecord> {
        let mut taken = Vec::new();
        // Queues only empty here: an answer holds for the rest of the call.
        let mut allowed: Vec<usize> = Vec::new();
        loop {
            let empty: Vec<usize> = (0..self.queues.len())
                .filter(|&i| self.queues[i].is_empty())
                .collect();
            if empty.len() == self.queues.len() {
                break;
            }
            if empty.iter().all(|i| allowed.contains(i)) || may_go_without(&empty, self) {
                allowed = empty;
                self.waiting_since = None;
                self.stable_check = None;
                self.gave_up = false;
            } else {
                let since = *self.waiting_since.get_or_insert_with(Instant::now);
                if since.elapsed() < MAX_SOURCE_WAIT {
                    break;
                }
                if !self.gave_up {
                    tracing::info!(
                        "waited {} ms for a topic's unread records: going on without them",
                        since.elapsed().as_millis()
                    );
                    self.gave_up = true;
                }
            }
            let next = (0..self.queues.len())
                .filter_map(|i| self.queues[i].front().map(|r| (r.timestamp, i)))
                .min();
            let Some((_, i)) = next else {
                break;
            };
            taken.extend(self.queues[i].pop_front());
        }
        taken
    }
}

/// A waiting task asks the broker for the last stable offset of a topic it
/// waits for after this long, and again every as long: librdkafka's
/// cached end is the high watermark, which an open transaction keeps past
/// what a read_committed consumer can read (Kafka Streams' consumer knows
/// the last stable offset; librdkafka's does not tell).
pub(super) const STABLE_CHECK_EVERY: Duration = Duration::from_millis(200);

/// A task never waits longer than this for a topic (a partition whose
/// position cannot reach its end: not expected, but it must not stall the
/// task's other topics for good).
pub(super) const MAX_SOURCE_WAIT: Duration = Duration::from_secs(5);

/// Where a worker is in its partition `partition` of each topic.
pub(super) struct Position<'a> {
    consumer: &'a BaseConsumer<WorkerContext>,
    partition: i32,
    /// librdkafka's positions of the whole assignment, read once per round.
    positions: &'a mut Option<TopicPartitionList>,
    read_from: &'a HashMap<(String, i32), i64>,
}

impl Position<'_> {
    /// The next offset the consumer returns from `topic`: librdkafka's
    /// position (past the transaction markers it skipped), or, before it
    /// returned anything since the partition's restore or last rewind, the
    /// committed offset it was read from then.
    pub(super) fn next(&mut self, topic: &str) -> Option<i64> {
        let consumer = self.consumer;
        let tpl = self
            .positions
            .get_or_insert_with(|| consumer.position().unwrap_or_default());
        tpl.find_partition(topic, self.partition)
            .and_then(|e| e.offset().to_raw())
            .filter(|o| *o >= 0)
            .or_else(|| {
                self.read_from
                    .get(&(topic.to_owned(), self.partition))
                    .copied()
            })
    }

    /// Whether `topic` is read up to the end of `watermarks` (an empty
    /// partition with no committed offset is).
    pub(super) fn read_to(&mut self, topic: &str, watermarks: Option<(i64, i64)>) -> bool {
        match (watermarks, self.next(topic)) {
            (Some((_, end)), Some(at)) => at >= end,
            (Some((low, end)), None) => low >= end,
            (None, _) => false,
        }
    }
}

/// Whether a task may take its next record while its topics `empty` (ranks
/// in `order`) have nothing queued: each of them is read to its end, as
/// librdkafka's last fetch saw it, or (asked of the broker once the task
/// waited [`STABLE_CHECK_EVERY`]) to its last stable offset.
pub(super) fn may_go_without(
    mut at: Position<'_>,
    order: &[String],
    empty: &[usize],
    q: &mut Queued,
) -> bool {
    let (consumer, partition) = (at.consumer, at.partition);
    if empty.iter().all(|&i| {
        let fetched = kafka::fetched_watermarks(consumer, &order[i], partition);
        at.read_to(&order[i], fetched)
    }) {
        return true;
    }
    let Some(since) = q.waiting_since else {
        return false;
    };
    if since.elapsed() < STABLE_CHECK_EVERY {
        return false;
    }
    let stale = q
        .stable_check
        .as_ref()
        .is_none_or(|(at, _)| at.elapsed() >= STABLE_CHECK_EVERY);
    if stale {
        let read: Vec<bool> = order
            .iter()
            .enumerate()
            .map(|(i, topic)| {
                empty.contains(&i) && {
                    let stable = kafka::watermarks(consumer, topic, partition).ok();
                    at.read_to(topic, stable)
                }
            })
            .collect();
        q.stable_check = Some((Instant::now(), read));
    }
    let (_, read) = q.stable_check.as_ref().expect("set above");
    empty.iter().all(|&i| read[i])
}

/// What an input offset's commit metadata says of the task's stream time.
pub(super) const STREAM_TIME_METADATA: &str = "onceflow:stream-time=";

pub(super) fn stream_time_metadata(time: i64) -> String {
    format!("{STREAM_TIME_METADATA}{time}")
}

/// The stream time in a committed offset's metadata, if it holds one (the
/// group's offsets are written by this deployment's workers only; metadata
/// that is not UTF-8 makes rdkafka panic, which is caught here).
pub(super) fn parse_stream_time_metadata(
    elem: &rdkafka::topic_partition_list::TopicPartitionListElem<'_>,
) -> Option<i64> {
    let metadata =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| elem.metadata().to_owned()))
            .ok()?;
    metadata.strip_prefix(STREAM_TIME_METADATA)?.parse().ok()
}

impl Core {
    /// The task's source topics in the order a timestamp tie is broken:
    /// tables first (a record sees the table as of its own time, that
    /// instant included), then the inputs.
    pub(super) fn source_order(&self) -> Vec<&str> {
        let m = &self.d.manifest;
        m.tables
            .iter()
            .map(|(_, t)| t.as_str())
            .chain(m.inputs.iter().map(String::as_str))
            .collect()
    }

    /// Queues a polled batch by task and topic.
    pub(super) fn queue(&mut self, batch: Vec<InputRecord>) {
        let order: Vec<String> = self.source_order().into_iter().map(str::to_owned).collect();
        for r in batch {
            if !self.tasks.contains_key(&r.partition) {
                continue;
            }
            let Some(rank) = order.iter().position(|t| t.as_str() == &*r.topic) else {
                continue;
            };
            let q = self.queued.entry(r.partition).or_insert_with(|| Queued {
                queues: (0..order.len()).map(|_| VecDeque::new()).collect(),
                waiting_since: None,
                stable_check: None,
                gave_up: false,
            });
            q.queues[rank].push_back(r);
        }
    }

    /// Takes from each task's queues the records it may process now, in
    /// timestamp order across its topics (on a tie, the topic first in
    /// [`Core::source_order`]; a topic's records keep their offset order
    /// even when their timestamps go back). While one of the task's topics
    /// has nothing queued, the task goes on only if that topic's partition
    /// is read to its end; else it waits for the records to come, at most
    /// [`MAX_SOURCE_WAIT`].
    pub(super) fn take_ready(
        &mut self,
        consumer: &BaseConsumer<WorkerContext>,
    ) -> BTreeMap<i32, Vec<InputRecord>> {
        let order: Vec<String> = self.source_order().into_iter().map(str::to_owned).collect();
        let mut positions: Option<TopicPartitionList> = None;
        let mut ready = BTreeMap::new();
        let read_from = &self.read_from;
        for (&partition, q) in self.queued.iter_mut() {
            let taken = q.take(|empty, q| {
                let at = Position {
                    consumer,
                    partition,
                    positions: &mut positions,
                    read_from,
                };
                may_go_without(at, &order, empty, q)
            });
            if !taken.is_empty() {
                ready.insert(partition, taken);
            }
        }
        self.queued
            .retain(|_, q| q.queues.iter().any(|x| !x.is_empty()));
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each topic's records keep their offset order (timestamps may go
    /// back); across topics the smaller head goes first, a tie to the topic
    /// listed first; partitions are kept apart.
    #[test]
    fn a_tasks_topics_go_in_timestamp_order_and_wait_for_unread_ones() {
        let r = |topic: &str, offset: i64, timestamp: i64| InputRecord {
            topic: topic.into(),
            partition: 0,
            offset,
            timestamp,
            key: None,
            value: None,
            headers: Vec::new(),
        };
        let queued = |records: Vec<InputRecord>| {
            let mut q = Queued {
                queues: vec![VecDeque::new(), VecDeque::new()],
                waiting_since: None,
                stable_check: None,
                gave_up: false,
            };
            for r in records {
                let rank = usize::from(&*r.topic == "payments");
                q.queues[rank].push_back(r);
            }
            q
        };
        let order = |taken: &[InputRecord]| {
            taken
                .iter()
                .map(|r| (r.topic.to_string(), r.offset))
                .collect::<Vec<_>>()
        };
        let pair = |t: &str, o: i64| (t.to_owned(), o);

        // Both topics queued: smallest timestamp first, a tie to the table,
        // a topic's offsets in order even when its timestamps go back. Once
        // the table is empty and read to its end, the payments go on.
        let mut q = queued(vec![
            r("payments", 0, 10),
            r("payments", 1, 5),
            r("payments", 2, 30),
            r("accounts", 0, 7),
            r("accounts", 1, 30),
            r("payments", 3, 40),
        ]);
        let mut asked = Vec::new();
        let taken = q.take(|empty, _| {
            asked.push(empty.to_vec());
            true
        });
        assert_eq!(
            order(&taken),
            [
                pair("accounts", 0),
                pair("payments", 0),
                pair("payments", 1),
                pair("accounts", 1),
                pair("payments", 2),
                pair("payments", 3),
            ]
        );
        assert_eq!(asked, [vec![0]], "asked once, when the table ran out");

        // The table has unread records: the payments wait for them, and
        // the task remembers since when it waits.
        let mut q = queued(vec![r("accounts", 0, 7), r("payments", 0, 10)]);
        let taken = q.take(|_, _| false);
        assert_eq!(order(&taken), [pair("accounts", 0)]);
        assert_eq!(q.queues[1].len(), 1);
        assert!(q.waiting_since.is_some());

        // Past the longest wait, it goes on without them.
        q.waiting_since = Some(Instant::now() - MAX_SOURCE_WAIT);
        let taken = q.take(|_, _| false);
        assert_eq!(order(&taken), [pair("payments", 0)]);
    }
}
