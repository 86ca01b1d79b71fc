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
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::{Deployment, StreamError};
use crate::kafka::{self, ADMIN_TIMEOUT, Connection, KafkaError};
use crate::manifest::Manifest;
use crate::state::{StoreChanges, WriteBatch};
use crate::task::Task;

/// Changelog records applied per write batch.
const CHUNK: usize = 10_000;
/// Longest a restore may take before the worker gives up and rejoins.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(600);

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
}

/// The restore consumer's type.
pub(crate) type RestoreConsumer = BaseConsumer<kafka::QuietContext>;

/// A consumer for restoring: assigned partitions only, never in a group,
/// never committing; reads committed data and reports partition ends.
pub(crate) fn restore_consumer(d: &Deployment) -> Result<RestoreConsumer, StreamError> {
    let group = format!("{}-restore", d.manifest.application_id());
    // The end of a changelog is usually near: do not let the broker hold an
    // empty fetch for the default 500 ms before reporting it.
    Ok(d.options
        .kafka
        .reader(&group, "read_committed", 10, kafka::QuietContext::default())?)
}

/// Replays each store's changelog tail into the task's committed stores.
pub(crate) fn restore(
    d: &Deployment,
    consumer: &RestoreConsumer,
    task: &mut Task,
) -> Result<RestoreStats, StreamError> {
    let started = Instant::now();
    let partition = task.partition();
    let mut total = 0u64;
    for (store, topic) in &d.changelogs {
        let position = task
            .changelog_position(store)
            .map_err(StreamError::Task)?
            .unwrap_or(0);
        // For a read_committed client this is the last stable offset.
        let (low, end) = kafka::watermarks(consumer, topic, partition)?;
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
        kafka::assign(consumer, &[(topic, partition, Some(from))])?;

        let mut chunk: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut next = from;
        let mut last_progress = Instant::now();
        let mut failed = None;
        // The fetcher reaching the partition's (stable) end means every
        // committed record before it has been delivered.
        kafka::read_to_end(consumer, 1, topic, Instant::now() + RESTORE_TIMEOUT, |m| {
            if let Some(key) = m.key() {
                chunk.insert(key.to_vec(), m.payload().map(<[u8]>::to_vec));
            }
            next = m.offset() + 1;
            total += 1;
            if chunk.len() >= CHUNK
                && let Err(e) = write(task, store, &mut chunk, next)
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
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if let Some(e) = failed {
            return Err(e);
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
    .map_err(StreamError::Task)
}

/// The committed value of `key` in a store, read from its changelog up to
/// the last stable offset (read_committed): only committed state, from any
/// host. Returns (partition, value) for each partition whose task holds the
/// key.
pub fn query(
    conn: &Connection,
    topic: &str,
    key: &[u8],
) -> Result<Vec<(i32, Vec<u8>)>, KafkaError> {
    let consumer = conn.reader(
        "onceflow-query",
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
