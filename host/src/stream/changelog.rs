//! Restoring a task's stores from their changelog topics.
//!
//! The committed store only ever holds committed data, and records how far
//! into each changelog it reaches. Restoring reads, with read_committed,
//! from that position to the changelog's last stable offset as seen *after*
//! the group's committed offsets became stable (the caller waits for that):
//! every transaction that could have committed those offsets is then
//! resolved, so nothing the offsets cover can still appear in the changelog.
//! After a clean shutdown there is nothing to replay; after a crash, only
//! the transactions committed but not yet applied locally; on a new host,
//! the whole (compacted) changelog.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant, SystemTime};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{Deployment, StreamError};
use crate::kafka::{self, ADMIN_TIMEOUT, Connection, KafkaError};
use crate::manifest::Manifest;
use crate::state::{StoreChanges, WriteBatch};
use crate::task::Task;

/// Changelog records applied per write batch.
const CHUNK: usize = 10_000;
/// How long a restore slice may go on past its end while no record
/// arrives (a fetch that hangs on a leader that moved or a connection that
/// stalls): then it fails with a timeout, and the worker tries again from
/// the store's position or, after its retry limit, restarts the session.
/// Without this bound a stalled fetch held the worker (and its consumer's
/// poll) silent for minutes (seen in the network-fault drill).
const RESTORE_STALL: Duration = Duration::from_secs(30);

/// The changelog topic of a store: `<tenant>.<name>-<store>-changelog`.
pub fn changelog_topic(manifest: &Manifest, store: &str) -> String {
    format!("{}-{store}-changelog", manifest.application_id())
}

/// The changelog topics of every store of a deployment.
pub fn changelog_topics(manifest: &Manifest) -> Vec<String> {
    manifest
        .stores
        .iter()
        .map(|s| changelog_topic(manifest, s))
        .collect()
}

/// What a restore did.
#[derive(Debug, Default, Clone, Copy)]
pub struct RestoreStats {
    /// Changelog records replayed.
    pub records: u64,
    /// Time taken.
    pub elapsed: Duration,
    /// Whether every store reached its changelog's end (otherwise the slice
    /// ran out: call again).
    pub finished: bool,
}

/// The clients a worker restores with: a read_committed reader, and a
/// read_uncommitted probe for each changelog partition's high watermark.
pub(crate) struct Restorer {
    reader: BaseConsumer<kafka::QuietContext>,
    probe: BaseConsumer<kafka::QuietContext>,
    created: Instant,
    /// Per changelog partition whose stable end is awaited across restore
    /// slices ([`stable_end`]): since when, and whether that was logged.
    waits: std::sync::Mutex<BTreeMap<(String, i32), (Instant, bool)>>,
}

impl Restorer {
    /// How long ago these clients were created.
    pub(crate) fn age(&self) -> Duration {
        self.created.elapsed()
    }
}

/// A restorer: assigned partitions only, never in a group, never
/// committing; the reader reads committed data and reports partition ends.
pub(crate) fn restorer(d: &Deployment) -> Result<Restorer, StreamError> {
    let group = format!("{}-restore", d.manifest.application_id());
    // The end of a changelog is usually near: do not let the broker hold an
    // empty fetch for the default 500 ms before reporting it.
    let reader =
        d.options
            .kafka
            .reader(&group, "read_committed", 10, kafka::QuietContext::default())?;
    let probe = d.options.kafka.reader(
        &group,
        "read_uncommitted",
        10,
        kafka::QuietContext::default(),
    )?;
    Ok(Restorer {
        reader,
        probe,
        created: Instant::now(),
        waits: std::sync::Mutex::default(),
    })
}

/// Replays each store's changelog tail into the task's committed stores,
/// for up to `slice` (then returns with `finished: false`; the next call
/// goes on from the stores' positions, so the worker can poll its consumer
/// in between).
///
/// The end is the changelog's last stable offset once it has reached the
/// high watermark sampled first (KAFKA-10167): the group coordinator makes
/// the committed offsets stable as soon as its own marker is written, but
/// the previous owner's last transaction may still lack its marker on this
/// changelog partition (another broker); restoring only to the stable offset
/// would leave that transaction out, and the task would process past it.
///
/// A local store whose position this changelog cannot continue (past the
/// end: the topic was deleted and recreated, or the store belongs to another
/// changelog; before the log start: records were deleted) is wiped and
/// restored in full.
///
/// A table's store is restored from its own topic, up to the group's
/// committed offset of that topic (`table_ends`; none: nothing committed,
/// the consumer reads it all): the records after it come through the
/// consumer, in the transactions that commit them.
pub(crate) fn restore(
    d: &Deployment,
    restorer: &Restorer,
    task: &mut Task,
    table_ends: &BTreeMap<(String, i32), i64>,
    slice: Duration,
) -> Result<RestoreStats, StreamError> {
    let started = Instant::now();
    let partition = task.partition();
    let consumer = &restorer.reader;
    let mut total = 0u64;
    let logs = d
        .changelogs
        .iter()
        .map(|(s, t)| (s, t, false))
        .chain(d.manifest.tables.iter().map(|(s, t)| (s, t, true)));
    for (store, topic, table) in logs {
        let mut position = task
            .changelog_position(store)
            .map_err(StreamError::Task)?
            .unwrap_or(0);
        // A store last in sync with its log longer ago than the log's
        // delete.retention.ms may lack a tombstone that compaction removed
        // since (a host down that long; a standby, which follows the
        // changelogs but not the tables' topics; eos-audit-3 findings 2
        // and 10): wiped and restored in full.
        let horizon = d.trust_horizon(store);
        let synced = task.synced_at(store).map_err(StreamError::Task)?;
        if let Some(age) = stale(position, synced, horizon, SystemTime::now()) {
            let wiped = task.wipe_store(store).map_err(StreamError::Task)?;
            tracing::warn!(
                %topic,
                partition,
                position,
                wiped,
                "the local store {store} was last in sync with its log {} ago, longer than \
                 the topic's delete.retention.ms ({}): compaction may have removed a tombstone \
                 it never saw; wiped it and restoring it in full",
                span(age),
                span(horizon)
            );
            position = 0;
        }
        // Every record at or past the end sampled now is appended after
        // this (a table's end is the group's committed offset: the
        // consumer reads on from there).
        let sampled = SystemTime::now();
        let high = kafka::watermarks(&restorer.probe, topic, partition)?.1;
        let (low, end) = if table {
            let low = kafka::watermarks(consumer, topic, partition)?.0;
            let end = table_ends
                .get(&(topic.clone(), partition))
                .copied()
                .unwrap_or(0);
            (low, end)
        } else {
            match stable_end(d, restorer, topic, partition, high, started + slice)? {
                Some(ends) => ends,
                // The previous owner's last transaction is still open on
                // it: the worker polls meanwhile and the next slice looks
                // again.
                None => {
                    return Ok(RestoreStats {
                        records: total,
                        elapsed: started.elapsed(),
                        finished: false,
                    });
                }
            }
        };
        // A table store ahead of the committed offset: the group's offsets
        // were moved back; restore it to them.
        let mut from_start = position == 0;
        let from =
            if position > high || (position < low && position > 0) || (table && position > end) {
                from_start = true;
                let wiped = task.wipe_store(store).map_err(StreamError::Task)?;
                tracing::warn!(
                    %topic,
                    partition,
                    position,
                    low,
                    high,
                    wiped,
                    "the local store {store} does not match its changelog (its position is outside \
                     the changelog's offsets: the topic was recreated or truncated); wiped it and \
                     restoring it in full"
                );
                low
            } else {
                position.max(low)
            };
        if from >= end {
            task.write_restored(&WriteBatch {
                synced: vec![(store.clone(), sampled)],
                ..WriteBatch::default()
            })
            .map_err(StreamError::Task)?;
            continue;
        }
        tracing::info!(
            %topic,
            partition,
            from,
            end,
            "restoring store {store}: up to {} changelog records",
            end - from
        );
        kafka::assign(consumer, &[(topic, partition, Some(from))])?;
        let mut marks = SyncMarks::new(from_start, sampled);

        let mut chunk: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut next = from;
        let mut last_progress = Instant::now();
        let mut failed = None;
        let mut out_of_time = false;
        // The fetcher reaching the partition's (stable) end means every
        // committed record before it has been delivered.
        kafka::read_to_end(consumer, 1, topic, started + slice + RESTORE_STALL, |m| {
            // A table's end is the group's committed offset, and its topic
            // goes on past it: a record there is the future (the consumer
            // brings it in its own transaction, in timestamp order). It
            // shows up first when the records just below the end were
            // compacted away; the store's position is then the end, as
            // Kafka Streams' restore stops at its limit. (A changelog's end
            // is its last stable offset: a read_committed reader never
            // returns a record at or past it.)
            if m.offset() >= end {
                next = end;
                return ControlFlow::Break(());
            }
            if let Some(key) = m.key() {
                chunk.insert(key.to_vec(), m.payload().map(<[u8]>::to_vec));
            }
            next = m.offset() + 1;
            total += 1;
            if chunk.len() >= CHUNK
                && let Err(e) = write(task, store, &mut chunk, next, marks.chunk())
            {
                failed = Some(e);
                return ControlFlow::Break(());
            }
            if last_progress.elapsed() >= Duration::from_secs(5) {
                tracing::info!(%topic, partition, at = next, end, "restore progress");
                last_progress = Instant::now();
            }
            if next >= end {
                ControlFlow::Break(())
            } else if started.elapsed() >= slice {
                out_of_time = true;
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
        }
        write(task, store, &mut chunk, next, marks.finish(!out_of_time))?;
        consumer
            .unassign()
            .map_err(|e| StreamError::kafka("unassigning the changelog", e))?;
        if out_of_time {
            return Ok(RestoreStats {
                records: total,
                elapsed: started.elapsed(),
                finished: false,
            });
        }
    }
    Ok(RestoreStats {
        records: total,
        elapsed: started.elapsed(),
        finished: true,
    })
}

/// The changelog partition's (log start, last stable offset), once the
/// last stable offset has reached `high`: every transaction that had
/// written to it when `high` was sampled is then resolved. A transaction
/// left open by a crashed or paused owner is aborted by the broker after
/// the transaction timeout, so this waits at most about that long in all,
/// but only until `until` in one call: then `None`, and the worker polls
/// its consumer before the next slice looks again (eos-audit-3 finding 8:
/// a wait on the poll thread as long as a transaction timeout past about
/// 270 s outlasted `max.poll.interval.ms`, and the member was expelled).
fn stable_end(
    d: &Deployment,
    restorer: &Restorer,
    topic: &str,
    partition: i32,
    high: i64,
    until: Instant,
) -> Result<Option<(i64, i64)>, StreamError> {
    let limit = d.options.transaction_timeout + Duration::from_secs(30);
    let key = (topic.to_owned(), partition);
    let waits = || restorer.waits.lock().unwrap_or_else(|e| e.into_inner());
    let since = waits()
        .entry(key.clone())
        .or_insert((Instant::now(), false))
        .0;
    loop {
        let (low, end) = kafka::watermarks(&restorer.reader, topic, partition)?;
        if end >= high {
            waits().remove(&key);
            return Ok(Some((low, end)));
        }
        if since.elapsed() >= limit {
            waits().remove(&key);
            return Err(super::Restart::Hanging {
                topic: topic.to_owned(),
                partition,
                start: end,
                high,
                waited: limit,
            }
            .into());
        }
        if since.elapsed() >= Duration::from_secs(1)
            && let Some(wait) = waits().get_mut(&key)
            && !wait.1
        {
            wait.1 = true;
            tracing::info!(
                %topic,
                partition,
                stable = end,
                high,
                "waiting for the previous owner's last transaction to be resolved on the changelog"
            );
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A duration as an operator reads it: "26 h 3 min", "4 min 10 s", "1 s".
fn span(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        3600.. => format!("{} h {} min", s / 3600, s % 3600 / 60),
        60.. => format!("{} min {} s", s / 60, s % 60),
        1.. => format!("{s} s"),
        0 => format!("{} ms", d.as_millis()),
    }
}

/// How long ago a store at `position` was last in sync with its log, if
/// longer than `horizon` (its topic's `delete.retention.ms`): it may lack a
/// tombstone that compaction removed since. A store at position 0 is
/// restored from the log's start anyway; one with no sync time recorded
/// cannot be judged (a store's first restore records one with its first
/// write: [`SyncMarks`]).
fn stale(
    position: i64,
    synced: Option<SystemTime>,
    horizon: Duration,
    now: SystemTime,
) -> Option<Duration> {
    let age = now.duration_since(synced?).ok()?;
    (position > 0 && age > horizon).then_some(age)
}

/// The sync times a restore's writes record ([`WriteBatch::synced`]).
///
/// A restore that reaches the end marks the store in sync as of the end's
/// sample time. One cut short (the slice ran out, the host stopped) leaves
/// records past its position that were appended before that time, so the
/// store keeps its older sync time, except on a restore from the log's
/// start: the store then holds nothing older than this restore, and its
/// first write records the sample time, so that the restore's rest, if it
/// resumes only later than the topic's `delete.retention.ms`, starts over
/// ([`stale`]) rather than go on past tombstones compacted away meanwhile.
struct SyncMarks {
    first: Option<SystemTime>,
    sampled: SystemTime,
}

impl SyncMarks {
    fn new(from_start: bool, sampled: SystemTime) -> Self {
        SyncMarks {
            first: from_start.then_some(sampled),
            sampled,
        }
    }

    /// The mark of a chunk written on the way.
    fn chunk(&mut self) -> Option<SystemTime> {
        self.first.take()
    }

    /// The mark of the restore's last write.
    fn finish(&mut self, reached_end: bool) -> Option<SystemTime> {
        if reached_end {
            Some(self.sampled)
        } else {
            self.first.take()
        }
    }
}

/// Writes restored records with the store's new position and, if given,
/// its sync time ([`SyncMarks`]).
fn write(
    task: &mut Task,
    store: &str,
    chunk: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    next: i64,
    synced: Option<SystemTime>,
) -> Result<(), StreamError> {
    let changes = std::mem::take(chunk).into_iter().collect();
    task.write_restored(&WriteBatch {
        changes: vec![StoreChanges {
            store: store.to_owned(),
            changes,
        }],
        positions: vec![(store.to_owned(), next)],
        synced: synced
            .map(|at| (store.to_owned(), at))
            .into_iter()
            .collect(),
    })
    .map_err(StreamError::Task)
}

/// The committed value of `key` in a store, read from its changelog up to
/// the last stable offset (read_committed): only committed state, from any
/// host. Returns (partition, value) for each partition whose task holds the
/// key. The reader's group (never joined) is named after the changelog, so
/// it is under the tenant's prefix for ACLs.
pub fn query(
    conn: &Connection,
    topic: &str,
    key: &[u8],
) -> Result<Vec<(i32, Vec<u8>)>, KafkaError> {
    let consumer = conn.reader(
        &format!("{topic}.onceflow-query"),
        "read_committed",
        10,
        kafka::QuietContext::default(),
    )?;
    let partitions = kafka::partitions(&consumer, topic)?.unwrap_or_default();
    let mut found = Vec::new();
    for p in partitions {
        let (low, high) = kafka::watermarks(&consumer, topic, p)?;
        if high <= low {
            continue;
        }
        kafka::assign(&consumer, &[(topic, p, None)])?;
        let mut value: Option<Vec<u8>> = None;
        kafka::read_to_end(
            &consumer,
            1,
            &format!("{topic}/{p}"),
            Instant::now() + Duration::from_secs(60),
            |m| {
                if m.key() == Some(key) {
                    value = m.payload().map(<[u8]>::to_vec);
                }
                ControlFlow::Continue(())
            },
        )?;
        if let Some(v) = value {
            found.push((p, v));
        }
    }
    Ok(found)
}

/// Deletes a deployment's consumer group and changelog topics (after its
/// workers have left; retries for 60 s while the group still has members).
pub fn purge(conn: &Connection, group: &str, changelogs: &[String]) -> Result<(), KafkaError> {
    use rdkafka::types::RDKafkaErrorCode;
    let admin = kafka::admin(conn)?;
    let opts = rdkafka::admin::AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = futures::executor::block_on(admin.delete_groups(&[group], &opts))
            .map_err(|e| KafkaError::client("deleting the consumer group", e))?;
        match r.first() {
            Some(Ok(_)) | None => break,
            Some(Err((_, RDKafkaErrorCode::GroupIdNotFound))) => break,
            Some(Err((_, code))) if Instant::now() < deadline => {
                tracing::debug!(group, "group not deletable yet: {code}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Some(Err((_, code))) => {
                return Err(KafkaError::timeout(
                    format!("deleting consumer group {group}"),
                    format!(
                        "{code}: its members did not leave within 60 s (static members leave after the session timeout)"
                    ),
                ));
            }
        }
    }
    if !changelogs.is_empty() {
        let names: Vec<&str> = changelogs.iter().map(String::as_str).collect();
        let results = futures::executor::block_on(admin.delete_topics(&names, &opts))
            .map_err(|e| KafkaError::client("deleting changelog topics", e))?;
        for r in results {
            if let Err((topic, code)) = r
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(KafkaError::topic(
                    topic,
                    format!("cannot delete the changelog: {code}"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{MemoryPartition, PartitionStore};

    const DAY: Duration = Duration::from_secs(86_400);

    /// Writes a restored chunk of `records` keys as `restore` does.
    fn chunk(store: &mut MemoryPartition, at: i64, records: i64, synced: Option<SystemTime>) {
        store
            .write(&WriteBatch {
                changes: vec![StoreChanges {
                    store: "s".into(),
                    changes: (at..at + records)
                        .map(|i| (i.to_be_bytes().to_vec(), Some(vec![1])))
                        .collect(),
                }],
                positions: vec![("s".into(), at + records)],
                synced: synced.map(|t| ("s".to_owned(), t)).into_iter().collect(),
            })
            .unwrap();
    }

    #[test]
    fn a_first_restore_cut_short_is_judged_from_its_start() {
        // A new store's restore from the log's start, cut short after two
        // chunks (the host stopped), resumed two days later: the records past
        // its position may have lost tombstones of keys it holds, so it is
        // stale against a one-day horizon (before: no sync time, never judged).
        let t0 = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let mut store = MemoryPartition::default();
        let mut marks = SyncMarks::new(true, t0);
        chunk(&mut store, 0, 10, marks.chunk());
        chunk(&mut store, 10, 5, marks.finish(false));
        let synced = store.synced_at("s").unwrap();
        assert_eq!(synced, Some(t0));
        assert_eq!(stale(15, synced, DAY, t0 + 2 * DAY), Some(2 * DAY));
        // Resumed within the horizon it goes on from its position.
        assert_eq!(stale(15, synced, DAY, t0 + DAY / 2), None);
    }

    #[test]
    fn a_resumed_restore_keeps_the_older_sync_time_until_it_reaches_the_end() {
        let old = SystemTime::UNIX_EPOCH + 1000 * DAY;
        let t1 = old + DAY / 2;
        let mut store = MemoryPartition::default();
        chunk(&mut store, 0, 10, Some(old));
        // From position 10: the records between it and the end were
        // appended before t1, so a cut-short restore cannot claim t1.
        let mut marks = SyncMarks::new(false, t1);
        chunk(&mut store, 10, 10, marks.chunk());
        chunk(&mut store, 20, 3, marks.finish(false));
        assert_eq!(store.synced_at("s").unwrap(), Some(old));
        let mut marks = SyncMarks::new(false, t1);
        chunk(&mut store, 23, 4, marks.finish(true));
        assert_eq!(store.synced_at("s").unwrap(), Some(t1));
        // A store at position 0 is read from the start whatever its age;
        // one without a sync time cannot be judged.
        assert_eq!(stale(0, Some(old), DAY, old + 3 * DAY), None);
        assert_eq!(stale(5, None, DAY, old + 3 * DAY), None);
    }
}
