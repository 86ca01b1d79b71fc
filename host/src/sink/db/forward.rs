//! What a batch transaction recorded for Kafka, forwarded after the commit:
//! the dead letters (to the sink's dead-letter topic) and, on a fleet host,
//! the batch's usage (to `_onceflow.usage`). Both the same way: the rows
//! not yet forwarded, oldest first, locked (`FOR UPDATE SKIP LOCKED`) in a
//! transaction, handed to `send`, then marked forwarded in it. At least
//! once: a crash between the send and the mark sends them again, each with
//! what identifies it (a dead letter's source headers, a usage record's
//! row id, which the usage reader counts once).

use postgres::Row;

use super::{BatchError, Db, DeadLetter};
use crate::sink::SinkError;

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
    /// `parse` reads `columns`; `send` gets them, then they are marked.
    fn forward<R>(
        &mut self,
        table: &str,
        columns: &str,
        parse: impl Fn(&Row) -> R,
        id: impl Fn(&R) -> i64,
        send: &mut dyn FnMut(&[R]) -> Result<(), SinkError>,
    ) -> Result<u64, BatchError> {
        let mut t = self.client.transaction().map_err(BatchError::Database)?;
        let rows = t
            .query(
                &format!(
                    "SELECT {columns} FROM {table} WHERE sink = $1 AND NOT forwarded \
                     ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED"
                ),
                &[&self.config.name],
            )
            .map_err(BatchError::Database)?;
        if rows.is_empty() {
            return Ok(0);
        }
        let parsed: Vec<R> = rows.iter().map(parse).collect();
        send(&parsed).map_err(BatchError::Fatal)?;
        let ids: Vec<i64> = parsed.iter().map(id).collect();
        t.execute(
            &format!("UPDATE {table} SET forwarded = true WHERE id = ANY($1)"),
            &[&ids],
        )
        .map_err(BatchError::Database)?;
        t.commit().map_err(BatchError::Database)?;
        Ok(ids.len() as u64)
    }
}
