//! The replay record: what one task's transaction needs to be replayed
//! that Kafka does not keep, written in the transaction itself (step 1a of
//! the commit, `stream/worker/commit.rs`) to the deployment's replay topic,
//! in the task's partition.
//!
//! JSON, one object per record, so an operator can read it with any
//! consumer; fields are only ever added (a reader ignores what it does not
//! know, and `v` changes only if a field changes meaning):
//!
//! ```json
//! {"v":1,"component":"<sha-256>","wit":"0.2.0","time":1700000000000,"swept":null,
//!  "stores":[["balances",1042,7]],"sources":[["payments",3310]],
//!  "batches":[[[[0,64]],65,"9f1c2b7d00e4a6c1"]]}
//! ```
//!
//! `stores`: each store's changelog position when the transaction began
//! (its next offset; a table's: its topic's next offset) and how many
//! changelog records the transaction wrote to it. `sources`: each source
//! topic read, with its first record's offset. `batches`: each
//! `process_batch`, as runs of (source index, records), its output count
//! and the digest of its outputs ([`crate::task::outputs_digest`]).

use serde::{Deserialize, Serialize};

use crate::sandbox::Processor;
use crate::task::{LoggedBatch, ReplayLog};

/// The current version of the record.
pub const VERSION: u32 = 1;

/// One task's transaction, as written to the replay topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayRecord {
    /// The record's version ([`VERSION`]).
    pub v: u32,
    /// The SHA-256 of the component that ran, in hex.
    pub component: String,
    /// The `onceflow:processor` version the component was built against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wit: Option<String>,
    /// The task's stream time when the transaction began.
    pub time: Option<i64>,
    /// The stream time of the last sweep of expired windows then.
    pub swept: Option<i64>,
    /// Per store: (name, changelog position at the start, changelog
    /// records written).
    pub stores: Vec<(String, i64, u64)>,
    /// Per source topic read: (topic, first offset).
    pub sources: Vec<(String, i64)>,
    /// The batches: (runs of (source index, records), outputs, digest in
    /// hex).
    pub batches: Vec<Batch>,
}

/// A batch as written: runs of (source index, records), its output count
/// and the digest of its outputs in hex.
pub type Batch = (Vec<(usize, u32)>, u32, String);

impl ReplayRecord {
    /// The record of a task's transaction: what its log holds, with the
    /// component that ran and its stores' positions.
    pub fn new(processor: &Processor, stores: Vec<(String, i64, u64)>, log: ReplayLog) -> Self {
        Self {
            v: VERSION,
            component: processor.digest().to_owned(),
            wit: processor.wit_version().map(str::to_owned),
            time: log.stream_time,
            swept: log.swept,
            stores,
            sources: log.sources,
            batches: log
                .batches
                .into_iter()
                .map(|b| (b.runs, b.outputs, format!("{:016x}", b.digest)))
                .collect(),
        }
    }

    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a replay record is plain data")
    }

    /// Reads a record's bytes, refusing what this host cannot replay.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let r: Self =
            serde_json::from_slice(bytes).map_err(|e| format!("not a replay record: {e}"))?;
        if r.v > VERSION {
            return Err(format!(
                "a replay record of version {} (this host reads up to {VERSION}): replay with a \
                 newer onceflow",
                r.v
            ));
        }
        for (runs, _, digest) in &r.batches {
            if let Some((s, _)) = runs.iter().find(|(s, _)| *s >= r.sources.len()) {
                return Err(format!("a batch names source {s}, of {}", r.sources.len()));
            }
            u64::from_str_radix(digest, 16).map_err(|_| format!("digest {digest:?} is not hex"))?;
        }
        Ok(r)
    }

    /// The batches as the task logged them.
    pub fn logged_batches(&self) -> Vec<LoggedBatch> {
        self.batches
            .iter()
            .map(|(runs, outputs, digest)| LoggedBatch {
                runs: runs.clone(),
                outputs: *outputs,
                digest: u64::from_str_radix(digest, 16).unwrap_or_default(),
            })
            .collect()
    }

    /// How many records the transaction processed.
    pub fn records(&self) -> usize {
        self.logged_batches().iter().map(LoggedBatch::records).sum()
    }

    /// How many records of source `i` the transaction read.
    pub fn records_of(&self, i: usize) -> usize {
        self.batches
            .iter()
            .flat_map(|(runs, _, _)| runs)
            .filter(|(s, _)| *s == i)
            .map(|&(_, n)| n as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ReplayRecord {
        ReplayRecord {
            v: VERSION,
            component: "ab".repeat(32),
            wit: Some("0.2.0".into()),
            time: Some(1_700_000_000_000),
            swept: None,
            stores: vec![("balances".into(), 1042, 7)],
            sources: vec![("payments".into(), 3310), ("rates".into(), 12)],
            batches: vec![
                (vec![(0, 64)], 65, "9f1c2b7d00e4a6c1".into()),
                (vec![(1, 1), (0, 3)], 3, "0000000000000001".into()),
            ],
        }
    }

    #[test]
    fn a_record_reads_back_and_counts_its_records() {
        let r = record();
        let back = ReplayRecord::parse(&r.encode()).expect("its own bytes");
        assert_eq!(back, r);
        assert_eq!(r.records(), 68);
        assert_eq!((r.records_of(0), r.records_of(1)), (67, 1));
        assert_eq!(r.logged_batches()[1].digest, 1);
    }

    #[test]
    fn what_this_host_cannot_replay_is_refused_with_why() {
        let mut newer = record();
        newer.v = VERSION + 1;
        let e = ReplayRecord::parse(&newer.encode()).unwrap_err();
        assert!(e.contains("replay with a newer onceflow"), "{e}");
        let mut bad = record();
        bad.batches[0].0 = vec![(2, 1)];
        let e = ReplayRecord::parse(&bad.encode()).unwrap_err();
        assert!(e.contains("names source 2, of 2"), "{e}");
        let e = ReplayRecord::parse(b"{\"v\":1}").unwrap_err();
        assert!(e.starts_with("not a replay record"), "{e}");
        // A field added later is read past.
        let mut text = String::from_utf8(record().encode()).unwrap();
        text.insert_str(1, "\"later\":[1,2],");
        assert_eq!(ReplayRecord::parse(text.as_bytes()).unwrap(), record());
    }
}
