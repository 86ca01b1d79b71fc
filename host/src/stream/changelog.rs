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
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::{Message, Offset, TopicPartitionList};

use super::kafka::{self, ADMIN_TIMEOUT};
use super::{Deployment, StreamError};
use crate::state::{StoreChanges, WriteBatch};
use crate::task::Task;

/// Changelog records applied per write batch.
const CHUNK: usize = 10_000;
/// Longest a restore may take before the worker gives up and rejoins.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);

/// What a restore did.
#[derive(Debug, Default, Clone, Copy)]
pub struct RestoreStats {
    /// Changelog records replayed.
    pub records: u64,
    /// Time taken.
    pub elapsed: Duration,
}

/// The restore consumer's type.
pub(crate) type RestoreConsumer = BaseConsumer<kafka::QuietContext>;

/// A consumer for restoring: assigned partitions only, never in a group,
/// never committing; reads committed data and reports partition ends.
pub(crate) fn restore_consumer(d: &Deployment) -> Result<RestoreConsumer, StreamError> {
    let mut c = kafka::base_config(&d.options);
    c.set(
        "group.id",
        format!("{}-restore", d.manifest.application_id()),
    )
    .set("enable.auto.commit", "false")
    .set("enable.auto.offset.store", "false")
    .set("isolation.level", "read_committed")
    .set("enable.partition.eof", "true")
    // The end of a changelog is usually near: do not let the broker hold an
    // empty fetch for the default 500 ms before reporting it.
    .set("fetch.wait.max.ms", "10")
    .set("auto.offset.reset", "earliest");
    c.create_with_context(kafka::QuietContext::default())
        .map_err(|e| StreamError::kafka("creating the restore consumer", e))
}

/// Replays each store's changelog tail into the task's committed stores.
pub(crate) fn restore(
    d: &Deployment,
    consumer: &RestoreConsumer,
    task: &mut Task,
) -> Result<RestoreStats, StreamError> {
    let started = Instant::now();
    let partition = task.partition();
    let errors = kafka::ErrorLog::default();
    let mut total = 0u64;
    for (store, topic) in &d.changelogs {
        let position = task
            .changelog_position(store)
            .map_err(|e| StreamError::State(e.to_string()))?
            .unwrap_or(0);
        // For a read_committed client this is the last stable offset.
        let (low, end) = consumer
            .fetch_watermarks(topic, partition, ADMIN_TIMEOUT)
            .map_err(|e| StreamError::Restart(format!("changelog {topic} watermarks: {e}")))?;
        let from = position.max(low);
        if from >= end {
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
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(from))
            .map_err(|e| StreamError::kafka("assigning the changelog", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| StreamError::kafka("assigning the changelog", e))?;

        let mut chunk: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut next = from;
        let mut last_progress = Instant::now();
        let deadline = Instant::now() + RESTORE_TIMEOUT;
        loop {
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    if let Some(key) = m.key() {
                        chunk.insert(key.to_vec(), m.payload().map(<[u8]>::to_vec));
                    }
                    next = m.offset() + 1;
                    total += 1;
                    if chunk.len() >= CHUNK {
                        write(task, store, &mut chunk, next)?;
                    }
                    if last_progress.elapsed() >= Duration::from_secs(5) {
                        tracing::info!(%topic, partition, at = next, end, "restore progress");
                        last_progress = Instant::now();
                    }
                    if next >= end {
                        break;
                    }
                }
                // The fetcher reached the partition's (stable) end: every
                // committed record before it has been delivered.
                Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) => {
                    errors.report("restore consumer", &e, topic);
                    std::thread::sleep(Duration::from_millis(50));
                }
                None => {
                    if Instant::now() > deadline {
                        return Err(StreamError::Restart(format!(
                            "restoring {topic}/{partition} took longer than {RESTORE_TIMEOUT:?}"
                        )));
                    }
                }
            }
        }
        write(task, store, &mut chunk, next)?;
        consumer
            .unassign()
            .map_err(|e| StreamError::kafka("unassigning the changelog", e))?;
    }
    Ok(RestoreStats {
        records: total,
        elapsed: started.elapsed(),
    })
}

fn write(
    task: &mut Task,
    store: &str,
    chunk: &mut BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    next: i64,
) -> Result<(), StreamError> {
    let changes = std::mem::take(chunk).into_iter().collect();
    task.write_restored(&WriteBatch {
        changes: vec![StoreChanges {
            store: store.to_owned(),
            changes,
        }],
        positions: vec![(store.to_owned(), next)],
    })
    .map_err(|e| StreamError::State(e.to_string()))
}
