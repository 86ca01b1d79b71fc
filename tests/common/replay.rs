//! `onceflow replay` of every committed transaction of a deployment, as a
//! user runs it: each must be `identical` (the determinism check of
//! docs/replay.md, run at the end of the broker tests that kill and move
//! tasks).

use std::path::Path;

/// What the replays found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Replays {
    /// Transactions replayed.
    pub transactions: u64,
    /// Of them, identical.
    pub identical: u64,
    /// Their batches.
    pub batches: u64,
    /// Input records they processed.
    pub records: u64,
    /// Dead letters among the replayed outputs.
    pub dead_letters: u64,
    /// Bytes of the replay records (what replay adds to the transactions).
    pub bytes: u64,
}

/// Replays every transaction of each of `partitions` of the deployment of
/// `manifest`, through `bootstrap`; asserts each is identical and prints
/// the figures as `FIGURE replay_<label> ...`.
pub fn replay_everything(
    bootstrap: &str,
    manifest: &Path,
    partitions: i32,
    dead_letter_topic: Option<&str>,
    label: &str,
) -> Replays {
    let mut total = Replays::default();
    let run = |args: &[&str]| {
        let out = super::onceflow()
            .arg("replay")
            .arg(manifest)
            .args(["--bootstrap-servers", bootstrap])
            .args(args)
            .output()
            .expect("run onceflow replay");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status, stdout, stderr)
    };
    for p in 0..partitions {
        let p = p.to_string();
        let (status, listed, stderr) = run(&["--partition", &p, "--list"]);
        assert!(
            status.success(),
            "{label}: replay --list of partition {p}: {stderr}"
        );
        for line in listed.lines().filter(|l| l.starts_with("transaction ")) {
            let bytes = line
                .split(", ")
                .find_map(|w| w.strip_suffix(" bytes"))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("{label}: no size in {line:?}"));
            total.bytes += bytes;
        }
        if !listed.lines().any(|l| l.starts_with("transaction ")) {
            continue;
        }
        let (status, out, stderr) = run(&["--partition", &p, "--all"]);
        let differs: Vec<&str> = out.lines().filter(|l| l.starts_with("differs")).collect();
        assert!(
            status.success() && differs.is_empty(),
            "{label}: replay of partition {p} ({status}): {differs:?}\n{stderr}\n{}",
            out.lines().rev().take(40).collect::<Vec<_>>().join("\n")
        );
        // "R records of APP partition P replayed: identical", then
        // "in N transactions, M batches".
        let lines: Vec<&str> = out.lines().collect();
        let n = lines.len();
        assert!(n >= 2, "{label}: no summary in the replay of partition {p}");
        let (summary, count) = (lines[n - 2], lines[n - 1]);
        assert!(
            summary.ends_with(" replayed: identical"),
            "{label}: {summary:?}"
        );
        let records: u64 = summary
            .split_whitespace()
            .next()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("{label}: {summary:?}"));
        // "in N transactions, M batches"
        let words: Vec<&str> = count.split_whitespace().collect();
        let number = |i: usize| -> u64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("{label}: {count:?}"))
        };
        let transactions = number(1);
        total.batches += number(3);
        let identical = out.lines().filter(|l| *l == "identical").count() as u64;
        assert_eq!(identical, transactions, "{label}: partition {p}");
        total.transactions += transactions;
        total.records += records;
        total.identical += identical;
        // One transaction from the middle alone: its stores rebuilt from
        // the changelogs up to where it began.
        let ids: Vec<&str> = listed
            .lines()
            .filter_map(|l| l.strip_prefix("transaction ")?.split(':').next())
            .collect();
        if ids.len() >= 3 {
            let middle = ids[ids.len() / 2];
            let (status, out, stderr) =
                run(&["--partition", &p, "--transaction", middle, "--quiet"]);
            assert!(
                status.success() && out.lines().any(|l| l == "identical"),
                "{label}: transaction {middle} of partition {p} alone: {out}{stderr}"
            );
        }
        if let Some(dlq) = dead_letter_topic {
            let tag = format!("{{\"topic\":\"{dlq}\",");
            total.dead_letters += out.lines().filter(|l| l.starts_with(&tag)).count() as u64;
        }
    }
    assert!(total.transactions > 0, "{label}: no transaction to replay");
    assert_eq!(total.identical, total.transactions, "{label}: {total:?}");
    println!(
        "FIGURE replay_{label} transactions {} identical {} batches {} records {} dead_letters {} \
         bytes_per_transaction {}",
        total.transactions,
        total.identical,
        total.batches,
        total.records,
        total.dead_letters,
        total.bytes / total.transactions
    );
    total
}
