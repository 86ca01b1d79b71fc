//! `onceflow replay` on a real Kafka: what it says when a replay is not
//! what committed, what a candidate component would have done, and its
//! refusals. (That committed transactions replay identically is checked at
//! the end of the wallet, language, pageviews and fraud tests, after their
//! kills and rebalances: `common::replay`.)

use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, Producer};

use crate::common::cluster::{Cluster, plain_producer, serial};
use crate::common::host_process::Host;
use crate::common::kstreams::unique;
use crate::common::{build_guest, onceflow};

/// The hostile guest on its own topics, one partition.
fn manifest(dir: &Path, id: &str, component: &Path, replay_hours: u32) -> std::path::PathBuf {
    let path = dir.join(format!("replay-{id}-{replay_hours}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"name = "replay-{id}"
tenant = "test"
inputs = ["replay-in-{id}"]
stores = ["seen"]
[build]
language = "rust"
component = "{component}"
[outputs]
out = "replay-out-{id}"
[processing]
replay-window-hours = {replay_hours}
[errors]
policy = "skip"
[limits]
memory-mb = 16
fuel-per-record = 5000000
timeout-ms = 2000
"#,
            component = component.display()
        ),
    )
    .expect("write the manifest");
    path
}

fn replay(manifest: &Path, cluster: &Cluster, args: &[&str]) -> (i32, String, String) {
    let out = onceflow()
        .arg("replay")
        .arg(manifest)
        .args(["--bootstrap-servers", &cluster.bootstrap])
        .args(args)
        .output()
        .expect("run onceflow replay");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A processor whose outputs depend on memory it keeps between
/// transactions (the hostile guest's `global`: a counter in a static) is
/// not what a replay, on a fresh instance, computes: replay says where.
/// The transaction before it replays identically; a candidate component
/// shows its outputs beside the committed ones; a component that did not
/// commit, and a deployment that keeps no replay records, are refused with
/// what to do.
#[test]
fn replay_names_the_first_difference_and_shows_a_candidates() {
    let _serial = serial();
    let cluster = Cluster::shared();
    let id = unique();
    let dir = tempfile::tempdir().expect("temp dir");
    let hostile = build_guest("tests/guests/hostile/onceflow.toml")
        .parent()
        .expect("the guest's directory")
        .join("target/onceflow/hostile.wasm");
    let input = format!("replay-in-{id}");
    cluster.create_topics(&[(&input, 1), (&format!("replay-out-{id}"), 1)]);
    let m = manifest(dir.path(), &id, &hostile, 24);
    let host = Host::run(&m, &cluster.host_bootstrap, dir.path(), "a", &[]);
    let producer = plain_producer(cluster);
    let group = format!("test.replay-{id}");
    // Two transactions, each committed before the next is written: plain
    // records and three `global`s, then three more `global`s, which the
    // running instance numbers 4 to 6 and a fresh one 1 to 3.
    let mut sent = 0;
    for values in [
        &["a", "b", "global", "global", "global"][..],
        &["global"; 3][..],
    ] {
        for v in values {
            producer
                .send(BaseRecord::to(&input).key("k").payload(*v))
                .expect("queue a record");
        }
        producer.flush(Duration::from_secs(30)).expect("flush");
        sent += values.len() as i64;
        let deadline = Instant::now() + Duration::from_secs(120);
        while cluster.progress(&group, &input).0 < sent {
            assert!(
                Instant::now() < deadline,
                "not committed; log:\n{}",
                host.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    assert!(host.stop().success(), "a clean stop");

    let (code, listed, err) = replay(&m, cluster, &["--list"]);
    assert_eq!(code, 0, "{err}");
    let ids: Vec<&str> = listed
        .lines()
        .filter_map(|l| l.strip_prefix("transaction ")?.split(':').next())
        .collect();
    assert_eq!(ids.len(), 2, "two transactions:\n{listed}");
    assert!(listed.contains(&format!("{input}@0+5")), "{listed}");

    let (code, out, err) = replay(&m, cluster, &["--all"]);
    assert_eq!(code, 1, "a difference exits 1: {out}{err}");
    let verdicts: Vec<&str> = out
        .lines()
        .filter(|l| *l == "identical" || l.starts_with("differs: "))
        .collect();
    assert_eq!(verdicts.len(), 2, "{out}");
    assert_eq!(verdicts[0], "identical", "{out}");
    // The first record of the second transaction already differs: its
    // batch is named by its first offset.
    assert!(
        verdicts[1].starts_with(&format!("differs: batch 0 ({input}/0 offsets 5.."))
            && verdicts[1].contains("outputs are not the bytes the transaction committed"),
        "{out}"
    );
    // One poll's records are one batch: the counts of batches are not
    // asserted (a fetch may split them).
    assert!(
        out.contains(&format!(
            "\n8 records of test.replay-{id} partition 0 replayed: 1 of 2 transactions differ\n\
             in 2 transactions, "
        )),
        "{out}"
    );

    // The first transaction with a candidate (another component) and the
    // state before and after: the candidate (the wallet) emits to no alias
    // of this manifest, so each output the hostile guest committed is
    // missing from its run.
    let wallet = build_guest("examples/wallet/onceflow.toml")
        .parent()
        .expect("the example's directory")
        .join("target/onceflow/wallet.wasm");
    let (code, out, err) = replay(
        &m,
        cluster,
        &[
            "--transaction",
            ids[0],
            "--dump-state",
            "--component",
            wallet.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(code, 0, "the replay itself is identical: {out}{err}");
    assert!(
        out.contains("state before:\noutputs:\n"),
        "nothing before: {out}"
    );
    // The two plain records counted (`global` counts nothing).
    let count = r#"{"store":"seen","partition":0,"key":"count","value":"2"}"#;
    assert!(
        out.contains(&format!("state after:\n{count}\nidentical\n")),
        "{out}"
    );
    assert!(
        out.contains(
            "candidate state: store seen key \"count\": the candidate wrote no change, the \
             transaction committed \"2\""
        ),
        "{out}"
    );
    assert!(
        out.contains("candidate output 0:\n- {\"topic\":\"replay-out-"),
        "{out}"
    );
    assert!(out.contains("+ (none)"), "{out}");

    // A manifest naming a component that did not commit.
    let other = manifest(dir.path(), &format!("{id}-other"), &wallet, 24);
    let text = std::fs::read_to_string(&other)
        .expect("read")
        .replace(&format!("replay-{id}-other"), &format!("replay-{id}"));
    std::fs::write(&other, text).expect("write");
    let (code, _, err) = replay(&other, cluster, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("was committed by component sha256")
            && err.contains("build the version that ran"),
        "{err}"
    );
    // A deployment that keeps no replay records.
    let off = manifest(dir.path(), &id, &hostile, 0);
    let (code, _, err) = replay(&off, cluster, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("keeps no replay records (processing.replay-window-hours = 0)"),
        "{err}"
    );
}
