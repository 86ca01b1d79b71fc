//! The sink's committer: a thread that owns the database connection and the
//! dead-letter producer, and runs the loop's jobs in order (claims, batch
//! transactions, marker expiry). The loop reads and parses the next batch
//! while this thread commits the previous one: at most two batches are in
//! memory, and the Kafka offsets of a batch are committed (by the loop)
//! only after its database transaction.
//!
//! A transient database failure (connection lost, restart, serialization
//! failure) is retried here with the same records, after a reconnect: the
//! positions in the database make the retry apply nothing twice.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc::{Receiver, SyncSender};
use std::time::{Duration, Instant};

use super::db::{self, Applied, BatchError, Claim, Db, DeadLetter, Item, Unforwarded};
use super::{SinkConfig, SinkError, SinkOptions, show};
use crate::kafka::{self, KafkaError, Outgoing};
use crate::types::{Header, Usage, UsageRecord};

/// What the loop asks of the committer.
pub(super) enum Job {
    /// Claim these partitions (raise their owner epochs).
    Claim(
        Vec<(String, i32)>,
        SyncSender<Result<Vec<Claim>, SinkError>>,
    ),
    /// Apply a batch in one transaction.
    Batch(Box<BatchJob>),
    /// Delete markers past the retention.
    Expire,
    /// Forward the dead letters and the usage rows not forwarded yet
    /// (left behind by a forward that could not reach Kafka in time).
    Forward,
}

/// A batch and the epochs it was read under.
pub(super) struct BatchJob {
    pub items: Vec<Item>,
    pub epochs: HashMap<(String, i32), i64>,
    pub reply: SyncSender<Result<BatchDone, SinkError>>,
}

/// A committed batch.
pub(super) struct BatchDone {
    pub applied: Applied,
    /// Partitions another instance had claimed (with the epoch this batch
    /// carried): their records were dropped.
    pub fenced: Vec<((String, i32), i64)>,
    /// Transactions retried after a transient failure.
    pub retries: u64,
    /// The next offset of each partition of the batch (the Kafka offsets to
    /// commit, for lag monitoring).
    pub next: BTreeMap<(String, i32), i64>,
}

/// The committer's state.
pub(super) struct Committer {
    pub db: Db,
    /// Dead letters and usage records (acknowledged before the rows are
    /// marked forwarded).
    pub producer: kafka::Publisher,
    pub config: SinkConfig,
    pub options: SinkOptions,
    /// How many COMMIT answers the `lose_commit_answers` fault dropped.
    pub lost_answers: u32,
    /// When usage was last forwarded (at most once a second).
    pub usage_forwarded: Instant,
}

/// How often a billed sink forwards its usage rows while it runs.
const USAGE_EVERY: Duration = Duration::from_secs(1);

/// Most time one round of marker expiry takes (every
/// [`super::EXPIRE_EVERY`]): 10,000 markers go in about 0.1 s, so a round
/// keeps up with some 50,000 records/s while batches wait at most this long.
pub(super) const EXPIRE_SLICE: Duration = Duration::from_secs(2);

/// How long a forward waits for Kafka to acknowledge what it sent while its
/// rows stay locked in a database transaction: half the
/// idle-in-transaction timeout the sink sets on its sessions (`db.rs`).
/// Past it the transaction rolls back and the rows are sent again at the
/// next forward (at least once: what was sent may still land, with the
/// headers that identify it). Before, a forward waited up to 60 s: a
/// broker stalled for more than 10 s left the session idle in its
/// transaction until PostgreSQL ended it (issue 48).
const FORWARD_BOUND: Duration = Duration::from_secs(5);

impl Committer {
    /// Runs jobs until the loop drops its sender. A failed job is answered
    /// with its error; the loop then stops.
    pub(super) fn run(mut self, jobs: Receiver<Job>) {
        for job in jobs {
            match job {
                Job::Claim(parts, reply) => {
                    let _ = reply.send(self.claim(&parts));
                }
                Job::Batch(job) => {
                    let BatchJob {
                        items,
                        epochs,
                        reply,
                    } = *job;
                    let result = self.batch(items, epochs).and_then(|done| {
                        if done.applied.dead > 0 {
                            self.forward_dead_letters()?;
                        }
                        if self.usage_forwarded.elapsed() >= USAGE_EVERY {
                            self.forward_usage()?;
                        }
                        Ok(done)
                    });
                    let _ = reply.send(result);
                }
                Job::Expire => match self.db.expire_markers(EXPIRE_SLICE) {
                    Ok((n, false)) => {
                        tracing::debug!(markers = n, "expired markers past the retention");
                    }
                    Ok((n, true)) => tracing::info!(
                        markers = n,
                        "expired markers past the retention for {} s; more are left for the next \
                         round (every {} s)",
                        EXPIRE_SLICE.as_secs(),
                        super::EXPIRE_EVERY.as_secs()
                    ),
                    Err(e) => tracing::warn!("expiring markers: {}", db::pg_message(&e)),
                },
                Job::Forward => {
                    if let Err(e) = self.forward_dead_letters() {
                        tracing::warn!(
                            "forwarding the sink's dead letters: {}",
                            crate::types::error_chain(&e)
                        );
                    }
                    if let Err(e) = self.forward_usage() {
                        // Left in the database: forwarded at the next try.
                        tracing::warn!(
                            "forwarding the sink's usage: {}",
                            crate::types::error_chain(&e)
                        );
                    }
                }
            }
        }
        // Stopping: what the last batches used.
        if let Err(e) = self.forward_usage() {
            tracing::warn!(
                "forwarding the sink's usage: {}",
                crate::types::error_chain(&e)
            );
        }
    }

    /// Applies `items` in one transaction, dropping the records of
    /// partitions another instance claimed, retrying after transient
    /// failures.
    fn batch(
        &mut self,
        mut items: Vec<Item>,
        mut epochs: HashMap<(String, i32), i64>,
    ) -> Result<BatchDone, SinkError> {
        let mut next = db::next_offsets(&items);
        if !self.options.pause_before_begin.is_zero() {
            tracing::info!(
                ms = self.options.pause_before_begin.as_millis() as u64,
                records = items.len(),
                "fault window: before BEGIN"
            );
            std::thread::sleep(self.options.pause_before_begin);
        }
        let pause_before = self.options.pause_before_commit;
        let before_commit = move || {
            if !pause_before.is_zero() {
                tracing::info!(
                    ms = pause_before.as_millis() as u64,
                    "fault window: before COMMIT"
                );
                std::thread::sleep(pause_before);
            }
        };
        let mut fenced = Vec::new();
        let mut retries = 0u64;
        loop {
            if items.is_empty() {
                return Ok(BatchDone {
                    applied: Applied::default(),
                    fenced,
                    retries,
                    next,
                });
            }
            match self.db.commit_batch(&items, &epochs, &before_commit) {
                Ok(_) if self.lost_answers < self.options.lose_commit_answers => {
                    // The ambiguous outcome, made certain: the COMMIT went
                    // through, and the sink does as when its answer times
                    // out.
                    self.lost_answers += 1;
                    retries += 1;
                    tracing::warn!(
                        attempt = retries,
                        "fault window: the answer to COMMIT is lost (it committed); applying the \
                         batch again as after a timeout"
                    );
                    self.reconnect(retries as u32)?;
                }
                Ok(applied) => {
                    return Ok(BatchDone {
                        applied,
                        fenced,
                        retries,
                        next,
                    });
                }
                Err(BatchError::Fenced(parts)) => {
                    tracing::warn!(
                        partitions = %show(&parts),
                        "another instance claimed these partitions (this one was out of the \
                         group): dropping their records; nothing of them was committed here"
                    );
                    for at in &parts {
                        if let Some(e) = epochs.remove(at) {
                            fenced.push((at.clone(), e));
                        }
                        next.remove(at);
                    }
                    items.retain(|i| {
                        !parts
                            .iter()
                            .any(|(t, p)| *t == i.topic && *p == i.partition)
                    });
                }
                Err(BatchError::Database(e)) if db::is_transient(&e) => {
                    retries += 1;
                    tracing::warn!(
                        attempt = retries,
                        "the batch's transaction failed ({}): reconnecting and applying it again \
                         (records already applied are skipped by their position)",
                        db::pg_message(&e)
                    );
                    self.reconnect(retries as u32)?;
                }
                Err(BatchError::Database(e)) => {
                    return Err(SinkError::Database {
                        what: "applying a batch".to_owned(),
                        // Redacted: the tenant sees this (a sink's status).
                        source: db::pg_message(&e).into(),
                    });
                }
                Err(BatchError::Fatal(e)) => return Err(e),
            }
        }
    }

    fn claim(&mut self, parts: &[(String, i32)]) -> Result<Vec<Claim>, SinkError> {
        let mut attempt = 0;
        loop {
            match self.db.claim(parts, &self.options.instance_id) {
                Ok(v) => return Ok(v),
                Err(BatchError::Fatal(e)) => return Err(e),
                Err(BatchError::Fenced(parts)) => {
                    return Err(SinkError::Database {
                        what: format!("claiming {}", show(&parts)),
                        source: "a claim raises the epoch and is never fenced: a bug".into(),
                    });
                }
                Err(BatchError::Database(e)) if db::is_transient(&e) && attempt < 20 => {
                    attempt += 1;
                    tracing::warn!("claiming partitions: {}; reconnecting", db::pg_message(&e));
                    self.reconnect(attempt)?;
                }
                Err(BatchError::Database(e)) => {
                    return Err(SinkError::Database {
                        what: "claiming partitions".to_owned(),
                        // Redacted: the tenant sees this (a sink's status).
                        source: db::pg_message(&e).into(),
                    });
                }
            }
        }
    }

    /// Reconnects, waiting up to 5 s between attempts, until it works or a
    /// minute has passed.
    fn reconnect(&mut self, attempt: u32) -> Result<(), SinkError> {
        let started = Instant::now();
        let mut delay = Duration::from_millis(100 * u64::from(attempt.clamp(1, 10)));
        loop {
            std::thread::sleep(delay);
            match self.db.reconnect() {
                Ok(()) => return Ok(()),
                Err(e) if started.elapsed() < Duration::from_secs(60) => {
                    tracing::warn!("{}; retrying", crate::types::error_chain(&e));
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Sends the dead letters recorded in the database to the dead-letter
    /// topic, then marks them forwarded (`db/forward.rs`; at least once: a
    /// crash between the two sends them again; the key and headers identify
    /// them).
    pub(super) fn forward_dead_letters(&mut self) -> Result<(), SinkError> {
        let topic = self.config.dead_letter_topic.clone();
        let producer = &self.producer;
        loop {
            let mut send = |letters: &[Unforwarded]| -> Result<(), SinkError> {
                for u in letters {
                    let headers = dead_letter_headers(&u.letter);
                    producer.send_record(Outgoing {
                        topic: &topic,
                        partition: None,
                        key: u.letter.key.as_deref(),
                        value: u.letter.value.as_deref(),
                        headers: &headers,
                        timestamp: None,
                    })?;
                }
                Ok(producer.delivered(FORWARD_BOUND, &format!("dead letters to {topic}"))?)
            };
            match self.db.forward_dead_letters(&mut send) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    tracing::info!(dead_letters = n, topic = %topic, "dead letters forwarded")
                }
                Err(BatchError::Fatal(e @ SinkError::Kafka(KafkaError::Timeout { .. }))) => {
                    // Kafka did not take them within FORWARD_BOUND: the
                    // next forward waits for them again, then marks them.
                    tracing::warn!(
                        "forwarding dead letters: {}; they stay unmarked in the database until \
                         Kafka acknowledges them (checked again in a few seconds)",
                        crate::types::error_chain(&e)
                    );
                    return Ok(());
                }
                Err(BatchError::Fatal(e)) => return Err(e),
                Err(BatchError::Database(e)) if db::is_transient(&e) => {
                    // Forwarded again at the next forward (within seconds).
                    tracing::warn!("forwarding dead letters: {}", db::pg_message(&e));
                    return Ok(());
                }
                Err(BatchError::Database(e)) => {
                    return Err(SinkError::Database {
                        what: "forwarding dead letters".to_owned(),
                        // Redacted: the tenant sees this (a sink's status).
                        source: db::pg_message(&e).into(),
                    });
                }
                Err(BatchError::Fenced(_)) => return Ok(()),
            }
        }
    }
}

impl Committer {
    /// Sends the usage rows recorded in the database to the usage topic,
    /// then marks them forwarded (at least once: a crash between the two
    /// sends them again, each with its row's id, which the reader counts
    /// once). Nothing without a usage target (a sink of its own).
    pub(super) fn forward_usage(&mut self) -> Result<(), SinkError> {
        self.usage_forwarded = Instant::now();
        let Some(target) = self.options.usage.clone() else {
            return Ok(());
        };
        let producer = &self.producer;
        let host = self.options.instance_id.clone();
        let sink = self.config.name.clone();
        let key = format!("{}/{}", target.tenant, target.deployment);
        loop {
            let mut send = |rows: &[db::UsageRow]| -> Result<(), SinkError> {
                for row in rows {
                    let record = UsageRecord {
                        tenant: target.tenant.clone(),
                        deployment: target.deployment.clone(),
                        host: host.clone(),
                        ts_ms: row.ts_ms,
                        usage: Usage {
                            records_in: row.records_in.max(0) as u64,
                            bytes_in: row.bytes_in.max(0) as u64,
                            records_out: row.records_out.max(0) as u64,
                            dead_letters: row.dead_letters.max(0) as u64,
                            ..Usage::default()
                        },
                        id: Some(format!("sink:{sink}:{}", row.id)),
                    };
                    let value = serde_json::to_vec(&record).map_err(|e| SinkError::Database {
                        what: "encoding a usage record".to_owned(),
                        source: Box::new(e),
                    })?;
                    producer.send_record(Outgoing {
                        topic: &target.topic,
                        partition: None,
                        key: Some(key.as_bytes()),
                        value: Some(&value),
                        headers: &[],
                        timestamp: None,
                    })?;
                }
                Ok(producer.delivered(FORWARD_BOUND, &format!("usage to {}", target.topic))?)
            };
            match self.db.forward_usage(&mut send) {
                Ok(0) => return Ok(()),
                Ok(n) => tracing::debug!(rows = n, "sink usage forwarded"),
                Err(BatchError::Fatal(e @ SinkError::Kafka(KafkaError::Timeout { .. }))) => {
                    tracing::warn!(
                        "forwarding the sink's usage: {}; it stays unmarked in the database until \
                         Kafka acknowledges it (checked again in a few seconds)",
                        crate::types::error_chain(&e)
                    );
                    return Ok(());
                }
                Err(BatchError::Fatal(e)) => return Err(e),
                Err(BatchError::Database(e)) if db::is_transient(&e) => {
                    tracing::warn!("forwarding the sink's usage: {}", db::pg_message(&e));
                    return Ok(());
                }
                Err(BatchError::Database(e)) => {
                    return Err(SinkError::Database {
                        what: "forwarding the sink's usage".to_owned(),
                        source: db::pg_message(&e).into(),
                    });
                }
                Err(BatchError::Fenced(_)) => return Ok(()),
            }
        }
    }
}

fn dead_letter_headers(d: &DeadLetter) -> Vec<Header> {
    let mut h = vec![
        Header {
            key: "onceflow.error".into(),
            value: d.reason.clone().into_bytes(),
        },
        Header {
            key: "onceflow.source".into(),
            value: format!("{}/{}/{}", d.topic, d.partition, d.offset).into_bytes(),
        },
        Header {
            key: "onceflow.digest".into(),
            value: hex::encode(&d.digest).into_bytes(),
        },
    ];
    if let Some(a) = &d.applied_digest {
        h.push(Header {
            key: "onceflow.applied-digest".into(),
            value: hex::encode(a).into_bytes(),
        });
    }
    h
}
