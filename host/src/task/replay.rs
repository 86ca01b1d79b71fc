//! What a task records of one transaction so that `onceflow replay` can run
//! it again and get the same bytes (docs/replay.md).
//!
//! A processor's only inputs are its records, its state and the host's
//! per-record clock and randomness (a record's timestamp; a seed from its
//! coordinates), so most of what replay needs is in Kafka already. What is
//! not, a task keeps here while the transaction runs:
//! - the stream time and the last sweep when it began (punctuation and
//!   window expiry depend on them);
//! - each `process_batch` the runtime made (a poll's records for one
//!   partition, or the part of them that fit the memory budget): the
//!   host cuts its calls from the batch's start (64 records, tables,
//!   punctuation), so the same batches make the same calls;
//! - which source topic each record came from, in order (a task with a
//!   table or several inputs interleaves them as they were polled), and
//!   each topic's first offset: the records themselves are read again
//!   from Kafka, read_committed, as the task read them;
//! - a digest of each batch's outputs (dead letters included), to compare:
//!   outputs of many tasks interleave in the output partitions.
//!
//! The runtime adds the stores' changelog positions and the component's
//! digest ([`crate::stream`]); the state changes are compared with the
//! changelog records the transaction committed.

use sha2::{Digest, Sha256};

use super::time::Times;
use crate::types::{InputRecord, OutputRecord};

/// One transaction of one task, as the task saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayLog {
    /// Stream time when the transaction's first batch began.
    pub stream_time: Option<i64>,
    /// Stream time of the last sweep of expired windows then.
    pub swept: Option<i64>,
    /// Each source topic the transaction read, in the order first seen,
    /// with the offset of its first record.
    pub sources: Vec<(String, i64)>,
    /// The batches, in order.
    pub batches: Vec<LoggedBatch>,
}

/// One `process_batch` of a transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoggedBatch {
    /// Its records as runs of one source: (index into
    /// [`ReplayLog::sources`], how many records).
    pub runs: Vec<(usize, u32)>,
    /// How many outputs it produced (dead letters included).
    pub outputs: u32,
    /// [`outputs_digest`] of them.
    pub digest: u64,
}

impl LoggedBatch {
    /// How many records the batch had.
    pub fn records(&self) -> usize {
        self.runs.iter().map(|&(_, n)| n as usize).sum()
    }
}

impl ReplayLog {
    /// A log for a transaction whose first batch begins at `times`.
    pub(super) fn begin(times: Times) -> Self {
        Self {
            stream_time: times.stream,
            swept: times.swept,
            ..Self::default()
        }
    }

    /// Adds a batch: the records it finished and the outputs it produced.
    pub(super) fn add(&mut self, records: &[InputRecord], outputs: &[OutputRecord]) {
        let mut batch = LoggedBatch {
            outputs: outputs.len() as u32,
            digest: outputs_digest(outputs),
            ..LoggedBatch::default()
        };
        for r in records {
            let source = match self.sources.iter().position(|(t, _)| **t == *r.topic) {
                Some(i) => i,
                None => {
                    self.sources.push((r.topic.to_string(), r.offset));
                    self.sources.len() - 1
                }
            };
            match batch.runs.last_mut() {
                Some((s, n)) if *s == source => *n += 1,
                _ => batch.runs.push((source, 1)),
            }
        }
        self.batches.push(batch);
    }
}

/// A digest of outputs in order: topic, key, value, headers and timestamp
/// of each (the first 8 bytes of their SHA-256), so two runs that emit the
/// same records in the same order have the same digest.
pub fn outputs_digest(outputs: &[OutputRecord]) -> u64 {
    let mut h = Sha256::new();
    let bytes = |h: &mut Sha256, b: Option<&[u8]>| match b {
        Some(b) => {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        }
        None => h.update(u64::MAX.to_le_bytes()),
    };
    for o in outputs {
        bytes(&mut h, Some(o.topic.as_bytes()));
        bytes(&mut h, o.key.as_deref());
        bytes(&mut h, o.value.as_deref());
        h.update((o.headers.len() as u64).to_le_bytes());
        for x in &o.headers {
            bytes(&mut h, Some(x.key.as_bytes()));
            bytes(&mut h, Some(&x.value));
        }
        h.update(o.timestamp.unwrap_or(i64::MIN).to_le_bytes());
    }
    let d = h.finalize();
    u64::from_le_bytes(d[..8].try_into().expect("a SHA-256 has 32 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Header;
    use std::sync::Arc;

    fn input(topic: &str, offset: i64) -> InputRecord {
        InputRecord {
            topic: Arc::from(topic),
            partition: 0,
            offset,
            key: None,
            value: None,
            headers: Vec::new(),
            timestamp: 0,
        }
    }

    fn output(value: &[u8]) -> OutputRecord {
        OutputRecord {
            topic: Arc::from("out"),
            key: Some(b"k".to_vec()),
            value: Some(value.to_vec()),
            headers: vec![Header {
                key: "h".into(),
                value: b"v".to_vec(),
            }],
            timestamp: Some(7),
        }
    }

    #[test]
    fn batches_are_runs_of_sources_with_each_sources_first_offset() {
        let mut log = ReplayLog::begin(Times {
            stream: Some(5),
            swept: None,
        });
        let a = [
            input("in", 10),
            input("in", 11),
            input("t", 3),
            input("in", 13),
        ];
        log.add(&a, &[output(b"x")]);
        log.add(&[input("t", 4)], &[]);
        assert_eq!(log.stream_time, Some(5));
        assert_eq!(
            log.sources,
            vec![("in".to_owned(), 10), ("t".to_owned(), 3)]
        );
        assert_eq!(log.batches[0].runs, vec![(0, 2), (1, 1), (0, 1)]);
        assert_eq!(log.batches[0].records(), 4);
        assert_eq!(log.batches[0].outputs, 1);
        assert_eq!(log.batches[1].runs, vec![(1, 1)]);
        assert_eq!(log.batches[1].digest, outputs_digest(&[]));
    }

    #[test]
    fn the_digest_sees_every_field_and_the_order() {
        let (a, b) = (output(b"a"), output(b"b"));
        let d = outputs_digest(&[a.clone(), b.clone()]);
        assert_eq!(d, outputs_digest(&[a.clone(), b.clone()]));
        assert_ne!(d, outputs_digest(&[b.clone(), a.clone()]));
        let changed: [fn(&mut OutputRecord); 5] = [
            |o| o.topic = Arc::from("other"),
            |o| o.key = None,
            |o| o.value = Some(b"ab".to_vec()),
            |o| o.headers[0].value = b"w".to_vec(),
            |o| o.timestamp = Some(8),
        ];
        for change in changed {
            let mut c = a.clone();
            change(&mut c);
            assert_ne!(outputs_digest(&[c, b.clone()]), d);
        }
        // Lengths are framed: moving a byte from the key to the value shows.
        let mut c = a.clone();
        c.key = Some(b"kv".to_vec());
        c.value = Some(Vec::new());
        let mut e = a.clone();
        e.key = Some(b"k".to_vec());
        e.value = Some(b"v".to_vec());
        assert_ne!(outputs_digest(&[c]), outputs_digest(&[e]));
    }
}
