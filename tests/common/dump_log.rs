//! A topic's log segments as the broker keeps them, read with Kafka's
//! DumpLogSegments: which producer wrote each record batch, and which of
//! those batches their transactions committed, in offset order.
//!
//! The tool's output (Kafka 4.x, `--print-data-log`) has one header line per
//! batch and, under it, one `| offset: …` line per record; a control batch's
//! record says `endTxnMarker: COMMIT` or `endTxnMarker: ABORT`:
//!
//! ```text
//! Dumping /…/node-1/data/topic-0/00000000000000000000.log
//! Log starting offset: 0
//! baseOffset: 0 lastOffset: 32 count: 33 baseSequence: 0 lastSequence: 32 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1796193930683 size: 721 magic: 2 compresscodec: none crc: 223971458 isvalid: true
//! | offset: 0 CreateTime: 1796193930683 keySize: 8 valueSize: 5 sequence: 0 headerKeys: [] key: acct-000 payload: 13395
//! baseOffset: 33 lastOffset: 33 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 721 CreateTime: 1796193930727 size: 78 magic: 2 compresscodec: none crc: 2363314035 isvalid: true
//! | offset: 33 CreateTime: 1796193930727 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
//! ```

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use super::cluster::Cluster;

/// DumpLogSegments' main class: Java in `kafka-tools` since Kafka 4.0 (as
/// in the 4.4.0 the rig runs), Scala in the core jar before.
const DUMP_LOG_SEGMENTS: [&str; 2] = [
    "org.apache.kafka.tools.DumpLogSegments",
    "kafka.tools.DumpLogSegments",
];

/// How a transaction ended, from its control record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    Commit,
    Abort,
}

/// One record batch's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    pub base_offset: i64,
    pub last_offset: i64,
    pub producer_id: i64,
    pub transactional: bool,
    pub control: bool,
    /// A control batch's transaction marker (none for other control
    /// records, and for data batches).
    pub marker: Option<Marker>,
}

/// A partition's data batches sorted by how their transactions ended.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Transactions {
    /// `(base offset, producer id)` of every committed data batch (and of
    /// non-transactional ones), in offset order.
    pub committed: Vec<(i64, i64)>,
    /// Data batches whose transaction aborted.
    pub aborted: usize,
    /// Data batches with no marker after them yet: open transactions.
    pub open: usize,
}

impl Transactions {
    /// The producer ids of the maximal runs of one producer among the
    /// committed batches, in offset order: a task owned by one worker at a
    /// time gives one run per change of owner at most.
    pub fn runs(&self) -> Vec<i64> {
        let mut runs: Vec<i64> = self.committed.iter().map(|&(_, p)| p).collect();
        runs.dedup();
        runs
    }
}

/// Every `.log` segment of every partition of `topic` on `cluster`, by
/// partition, oldest first, from the first node that holds the partition
/// (scripts/kafka keeps node i's data in `<dir>/node-<i>/data`, a partition
/// in `<topic>-<partition>/`).
pub fn segment_files(cluster: &Cluster, topic: &str) -> BTreeMap<i32, Vec<PathBuf>> {
    let prefix = format!("{topic}-");
    let mut found: BTreeMap<i32, Vec<PathBuf>> = BTreeMap::new();
    for node in 1..=cluster.brokers {
        let data = cluster.dir.join(format!("node-{node}/data"));
        let Ok(entries) = std::fs::read_dir(&data) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(partition) = name
                .to_str()
                .and_then(|n| n.strip_prefix(&prefix))
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<i32>().ok())
            else {
                continue;
            };
            if found.contains_key(&partition) {
                // Another replica of the same log.
                continue;
            }
            let mut logs: Vec<PathBuf> = std::fs::read_dir(entry.path())
                .unwrap_or_else(|e| panic!("list {}: {e}", entry.path().display()))
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "log"))
                .collect();
            // Segments are named by their base offset, zero-padded.
            logs.sort();
            found.insert(partition, logs);
        }
    }
    found
}

/// DumpLogSegments' output for `files` (one partition's segments, oldest
/// first), with every record (`--print-data-log`: the control records'
/// markers are printed only then).
pub fn dump(cluster: &Cluster, files: &[PathBuf]) -> String {
    assert!(!files.is_empty(), "no segment files to dump");
    let files = files
        .iter()
        .map(|f| f.to_str().expect("utf-8 path"))
        .collect::<Vec<_>>()
        .join(",");
    let mut tried = String::new();
    for class in DUMP_LOG_SEGMENTS {
        let out = cluster.script(&["cli", class, "--files", &files, "--print-data-log"]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        tried.push_str(&format!("\n{class}: {}\n{stderr}", out.status));
        if !stderr.contains("Could not find or load main class")
            && !stderr.contains("ClassNotFoundException")
        {
            break;
        }
    }
    panic!("DumpLogSegments failed on {files}:{tried}");
}

/// The `key: value` pairs of one line of the tool's output.
fn fields(line: &str) -> HashMap<&str, &str> {
    let tokens: Vec<&str> = line.split_whitespace().collect();
    tokens
        .windows(2)
        .filter_map(|w| Some((w[0].strip_suffix(':')?, w[1])))
        .collect()
}

/// The batches in DumpLogSegments' output, in the order printed (offset
/// order within a partition's segments, given oldest first).
pub fn parse(text: &str) -> Vec<Batch> {
    let mut batches: Vec<Batch> = Vec::new();
    for line in text.lines() {
        if line.starts_with("baseOffset:") {
            let f = fields(line);
            let field = |name: &str| {
                *f.get(name)
                    .unwrap_or_else(|| panic!("a batch header has {name}: {line}"))
            };
            let number = |name: &str| {
                field(name)
                    .parse::<i64>()
                    .unwrap_or_else(|e| panic!("{name} is a number ({e}): {line}"))
            };
            let flag = |name: &str| match field(name) {
                "true" => true,
                "false" => false,
                other => panic!("{name} is true or false, not {other}: {line}"),
            };
            batches.push(Batch {
                base_offset: number("baseOffset"),
                last_offset: number("lastOffset"),
                producer_id: number("producerId"),
                transactional: flag("isTransactional"),
                control: flag("isControl"),
                marker: None,
            });
        } else if let Some(marker) = fields(line).get("endTxnMarker") {
            let batch = batches
                .last_mut()
                .filter(|b| b.control)
                .unwrap_or_else(|| panic!("a transaction marker follows a control batch: {line}"));
            batch.marker = Some(match *marker {
                "COMMIT" => Marker::Commit,
                "ABORT" => Marker::Abort,
                other => panic!("a marker is COMMIT or ABORT, not {other}: {line}"),
            });
        }
    }
    batches
}

/// Sorts one partition's data batches (in offset order) by their
/// transactions' ends: a producer's transactional batches since its
/// previous marker on the partition belong to the transaction its next
/// marker ends.
pub fn resolve(batches: &[Batch]) -> Transactions {
    let mut pending: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    let mut out = Transactions::default();
    for b in batches {
        if b.control {
            let ended = pending.remove(&b.producer_id).unwrap_or_default();
            match b.marker {
                Some(Marker::Commit) => out
                    .committed
                    .extend(ended.into_iter().map(|o| (o, b.producer_id))),
                Some(Marker::Abort) => out.aborted += ended.len(),
                // Not a transaction marker: the transaction goes on.
                None => {
                    if !ended.is_empty() {
                        pending.insert(b.producer_id, ended);
                    }
                }
            }
        } else if b.transactional {
            pending
                .entry(b.producer_id)
                .or_default()
                .push(b.base_offset);
        } else {
            out.committed.push((b.base_offset, b.producer_id));
        }
    }
    out.open = pending.values().map(Vec::len).sum();
    out.committed.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Output of Kafka 4.4.0's DumpLogSegments (headers as the tool prints
    /// them; offsets and producers arranged): producer 1 commits; producer 7
    /// is killed mid-transaction and the coordinator aborts it; producers 3
    /// and 1 then interleave their commits (what two owners of one task
    /// would write); producer 3 leaves a transaction open.
    const SAMPLE: &str = "\
Dumping /cache/kafka-test-shared/node-1/data/test.w-balances-changelog-0/00000000000000000000.log
Log starting offset: 0
baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 0 lastSequence: 2 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1796193930683 size: 121 magic: 2 compresscodec: none crc: 223971458 isvalid: true
| offset: 0 CreateTime: 1796193930683 keySize: 8 valueSize: 5 sequence: 0 headerKeys: [] key: acct-000 payload: 13395
| offset: 1 CreateTime: 1796193930683 keySize: 8 valueSize: 5 sequence: 1 headerKeys: [] key: acct-002 payload: 19597
| offset: 2 CreateTime: 1796193930683 keySize: 8 valueSize: 5 sequence: 2 headerKeys: [] key: acct-014 payload: 18097
baseOffset: 3 lastOffset: 3 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 121 CreateTime: 1796193930727 size: 78 magic: 2 compresscodec: none crc: 2363314035 isvalid: true
| offset: 3 CreateTime: 1796193930727 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
baseOffset: 4 lastOffset: 5 count: 2 baseSequence: 0 lastSequence: 1 producerId: 7 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 199 CreateTime: 1796193930800 size: 96 magic: 2 compresscodec: none crc: 1955792300 isvalid: true
| offset: 4 CreateTime: 1796193930800 keySize: 8 valueSize: 5 sequence: 0 headerKeys: [] key: acct-019 payload: 25054
| offset: 5 CreateTime: 1796193930800 keySize: 8 valueSize: 5 sequence: 1 headerKeys: [] key: acct-033 payload: 21049
baseOffset: 6 lastOffset: 6 count: 1 baseSequence: -1 lastSequence: -1 producerId: 7 producerEpoch: 1 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 295 CreateTime: 1796193940800 size: 78 magic: 2 compresscodec: none crc: 1026003928 isvalid: true
| offset: 6 CreateTime: 1796193940800 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: ABORT coordinatorEpoch: 0
baseOffset: 7 lastOffset: 8 count: 2 baseSequence: 0 lastSequence: 1 producerId: 3 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 373 CreateTime: 1796193941000 size: 96 magic: 2 compresscodec: none crc: 747776310 isvalid: true
| offset: 7 CreateTime: 1796193941000 keySize: 8 valueSize: 5 sequence: 0 headerKeys: [] key: acct-019 payload: 25054
| offset: 8 CreateTime: 1796193941000 keySize: 8 valueSize: 5 sequence: 1 headerKeys: [] key: acct-033 payload: 21049
baseOffset: 9 lastOffset: 9 count: 1 baseSequence: -1 lastSequence: -1 producerId: 3 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 469 CreateTime: 1796193941100 size: 78 magic: 2 compresscodec: none crc: 2363314035 isvalid: true
| offset: 9 CreateTime: 1796193941100 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
baseOffset: 10 lastOffset: 10 count: 1 baseSequence: 3 lastSequence: 3 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 547 CreateTime: 1796193941150 size: 70 magic: 2 compresscodec: none crc: 3241191352 isvalid: true
| offset: 10 CreateTime: 1796193941150 keySize: 8 valueSize: 5 sequence: 3 headerKeys: [] key: acct-043 payload: 21879
baseOffset: 11 lastOffset: 11 count: 1 baseSequence: 2 lastSequence: 2 producerId: 3 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 617 CreateTime: 1796193941160 size: 70 magic: 2 compresscodec: none crc: 584923365 isvalid: true
| offset: 11 CreateTime: 1796193941160 keySize: 8 valueSize: 5 sequence: 2 headerKeys: [] key: acct-044 payload: 17718
baseOffset: 12 lastOffset: 12 count: 1 baseSequence: -1 lastSequence: -1 producerId: 3 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 687 CreateTime: 1796193941200 size: 78 magic: 2 compresscodec: none crc: 2363314035 isvalid: true
| offset: 12 CreateTime: 1796193941200 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
baseOffset: 13 lastOffset: 13 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 765 CreateTime: 1796193941210 size: 78 magic: 2 compresscodec: none crc: 2363314035 isvalid: true
| offset: 13 CreateTime: 1796193941210 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
baseOffset: 14 lastOffset: 14 count: 1 baseSequence: 3 lastSequence: 3 producerId: 3 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: true isControl: false deleteHorizonMs: OptionalLong.empty position: 843 CreateTime: 1796193941300 size: 70 magic: 2 compresscodec: none crc: 4090884623 isvalid: true
| offset: 14 CreateTime: 1796193941300 keySize: 8 valueSize: 5 sequence: 3 headerKeys: [] key: acct-054 payload: 20756
";

    #[test]
    fn dump_log_segments_output_parses_into_batches() {
        let batches = parse(SAMPLE);
        assert_eq!(batches.len(), 11, "{batches:#?}");
        assert_eq!(
            batches[0],
            Batch {
                base_offset: 0,
                last_offset: 2,
                producer_id: 1,
                transactional: true,
                control: false,
                marker: None,
            }
        );
        let markers: Vec<(i64, Option<Marker>)> = batches
            .iter()
            .filter(|b| b.control)
            .map(|b| (b.base_offset, b.marker))
            .collect();
        assert_eq!(
            markers,
            [
                (3, Some(Marker::Commit)),
                (6, Some(Marker::Abort)),
                (9, Some(Marker::Commit)),
                (12, Some(Marker::Commit)),
                (13, Some(Marker::Commit)),
            ]
        );
    }

    #[test]
    fn committed_batches_run_by_producer_and_interleaved_commits_show() {
        let txns = resolve(&parse(SAMPLE));
        assert_eq!(txns.committed, [(0, 1), (7, 3), (10, 1), (11, 3)]);
        // The zombie's one batch (2 records) aborted; producer 3's last open.
        assert_eq!((txns.aborted, txns.open), (1, 1));
        // Producer 1's commit at 13 covers its batch at 10, after producer
        // 3's first commit: four runs where one owner after another would
        // have given two.
        assert_eq!(txns.runs(), [1, 3, 1, 3]);

        // One owner after another: the aborted zombie leaves no run.
        let handover: Vec<Batch> = parse(SAMPLE).into_iter().take(7).collect();
        assert_eq!(resolve(&handover).runs(), [1, 3]);
    }

    #[test]
    fn an_empty_segment_has_no_batches() {
        let text = "Dumping /d/t-0/00000000000000000000.log\nLog starting offset: 0\n";
        assert_eq!(resolve(&parse(text)), Transactions::default());
    }
}
