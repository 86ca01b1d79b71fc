//! What a batch transaction recorded for Kafka, forwarded after the commit:
//! the dead letters (to the sink's dead-letter topic) and, on a fleet host,
//! the batch's usage (to `_onceflow.usage`). Both the same way, with no
//! transaction open while Kafka is waited for (eos-audit-3 finding 11):
//!
//! - the rows not yet forwarded, oldest first, are claimed for
//!   [`CLAIM`] in one statement (`claimed_until`; `FOR UPDATE SKIP LOCKED`
//!   keeps two instances of a sink from claiming the same rows; the
//!   sink's own table, which no other tenant can touch, unlike an advisory
//!   lock);
//! - `send` sends them and waits (up to its bound) for Kafka's
//!   acknowledgements; then they are marked forwarded;
//! - rows not acknowledged within the bound are remembered, their claim
//!   renewed, and settled (acknowledged, then marked) before anything more
//!   is sent: a slow broker delays them instead of having them sent twice.
//!
//! At least once: a crash between the send and the mark sends them again
//! (once the claim runs out), each with what identifies it (a dead letter's
//! source headers, a usage record's row id, which the usage reader counts
//! once).

use postgres::Row;

use std::time::Duration;

use super::{BatchError, Db, DeadLetter};
use crate::kafka::KafkaError;
use crate::sink::SinkError;

/// How long a claim keeps other instances of the sink off the rows: longer
/// than a forward waits for Kafka, renewed while it waits again.
const CLAIM: Duration = Duration::from_secs(60);

/// A dead letter recorded in the database, not yet in the Kafka topic.
#[derive(Debug)]
pub(crate) struct Unforwarded {
    pub id: i64,
    pub letter: DeadLetter,
}

/// A batch's usage recorded in the database, not yet in `_onceflow.usage`.
#[derive(Debug)]
pub(crate) struct UsageRow {
    pub id: i64,
    /// When its batch committed (ms since the epoch, the database's clock).
    pub ts_ms: i64,
    pub records_in: i64,
    pub bytes_in: i64,
    pub records_out: i64,
    pub dead_letters: i64,
}

impl Db {
    /// Forwards up to 1,000 dead letters; returns how many.
    pub(crate) fn forward_dead_letters(
        &mut self,
        send: &mut dyn FnMut(&[Unforwarded]) -> Result<(), SinkError>,
    ) -> Result<u64, BatchError> {
        let table = self.s.dead_letters.clone();
        self.forward(
            &table,
            "id, topic, kafka_partition, kafka_offset, record_key, record_value, reason, digest, \
             applied_digest",
            |r| Unforwarded {
                id: r.get(0),
                letter: DeadLetter {
                    topic: r.get(1),
                    partition: r.get(2),
                    offset: r.get(3),
                    key: r.get(4),
                    value: r.get(5),
                    reason: r.get(6),
                    digest: r.get(7),
                    applied_digest: r.get(8),
                },
            },
            |u| u.id,
            send,
        )
    }

    /// Forwards up to 1,000 usage rows; returns how many.
    pub(crate) fn forward_usage(
        &mut self,
        send: &mut dyn FnMut(&[UsageRow]) -> Result<(), SinkError>,
    ) -> Result<u64, BatchError> {
        let table = self.s.usage.clone();
        self.forward(
            &table,
            "id, (extract(epoch FROM created_at) * 1000)::bigint, records_in, bytes_in, \
             records_out, dead_letters",
            |r| UsageRow {
                id: r.get(0),
                ts_ms: r.get(1),
                records_in: r.get(2),
                bytes_in: r.get(3),
                records_out: r.get(4),
                dead_letters: r.get(5),
            },
            |u| u.id,
            send,
        )
    }

    /// The rows of this sink in `table` not forwarded yet, oldest first, as
    /// `parse` reads `columns` (the id first): claimed, `send` gets them,
    /// then they are marked. `send(&[])` waits for what was sent before.
    fn forward<R>(
        &mut self,
        table: &str,
        columns: &str,
        parse: impl Fn(&Row) -> R,
        id: impl Fn(&R) -> i64,
        send: &mut dyn FnMut(&[R]) -> Result<(), SinkError>,
    ) -> Result<u64, BatchError> {
        let claim = format!("{} seconds", CLAIM.as_secs());
        // Sent before and not acknowledged then: settled first.
        let mut n = 0;
        if let Some(ids) = self.unconfirmed.remove(table) {
            self.client
                .execute(
                    &format!(
                        "UPDATE {table} SET claimed_until = now() + $2::text::interval \
                         WHERE id = ANY($1)"
                    ),
                    &[&ids, &claim],
                )
                .map_err(|e| {
                    self.unconfirmed.insert(table.to_owned(), ids.clone());
                    BatchError::Database(e)
                })?;
            n = ids.len() as u64;
            self.settle(table, ids, send(&[]))?;
        }
        let rows = self
            .client
            .query(
                &format!(
                    "UPDATE {table} SET claimed_until = now() + $2::text::interval \
                     WHERE id IN (SELECT id FROM {table} WHERE sink = $1 AND NOT forwarded \
                       AND (claimed_until IS NULL OR claimed_until < now()) \
                       ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED) \
                     RETURNING {columns}"
                ),
                &[&self.config.name, &claim],
            )
            .map_err(BatchError::Database)?;
        if rows.is_empty() {
            return Ok(n);
        }
        let mut parsed: Vec<R> = rows.iter().map(parse).collect();
        parsed.sort_by_key(|r| id(r));
        let ids: Vec<i64> = parsed.iter().map(id).collect();
        n += ids.len() as u64;
        self.settle(table, ids, send(&parsed))?;
        Ok(n)
    }

    /// Marks `ids` forwarded if `sent` (their send) succeeded. Not
    /// acknowledged in time, or not marked, they wait in `unconfirmed`;
    /// failed, they are sent again at the next forward.
    fn settle(
        &mut self,
        table: &str,
        ids: Vec<i64>,
        sent: Result<(), SinkError>,
    ) -> Result<(), BatchError> {
        match sent {
            Ok(()) => {}
            Err(e @ SinkError::Kafka(KafkaError::Timeout { .. })) => {
                self.unconfirmed.insert(table.to_owned(), ids);
                return Err(BatchError::Fatal(e));
            }
            Err(e) => {
                // Refused: claimed no more, sent again at the next forward.
                let _ = self.client.execute(
                    &format!("UPDATE {table} SET claimed_until = NULL WHERE id = ANY($1)"),
                    &[&ids],
                );
                return Err(BatchError::Fatal(e));
            }
        }
        let marked = self.client.execute(
            &format!("UPDATE {table} SET forwarded = true WHERE id = ANY($1)"),
            &[&ids],
        );
        if let Err(e) = marked {
            // In Kafka already: marked at the next forward.
            self.unconfirmed.insert(table.to_owned(), ids);
            return Err(BatchError::Database(e));
        }
        Ok(())
    }
}
