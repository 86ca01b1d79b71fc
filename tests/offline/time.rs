//! Stream time, windows and punctuation offline: the pageviews example
//! against an independent model of Kafka Streams' windowed count with
//! `suppress(untilWindowCloses)`, under every batching; and the contract's
//! compatibility (a component built against `onceflow:processor@0.1.0`).

use std::collections::BTreeSet;

use crate::common::fraud::{model as fraud_model, round};
use crate::common::{build_guest, json_lines, offline_test, repo};
use serde_json::json;

use crate::common::pageviews::{SIZE, boundary_views, late_at, model, parse_count, views};

/// A minute boundary, so windows start on round numbers.
const BASE: i64 = 1_700_000_040_000;

/// `onceflow test` in batches of `batch` over `partitions` partitions: its
/// standard output, the run having succeeded.
fn batched(manifest: &std::path::Path, input: &str, batch: &str, partitions: i32) -> Vec<u8> {
    let parts = partitions.to_string();
    let out = offline_test(
        manifest,
        input,
        &["--batch-size", batch, "--partitions", &parts],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn input(views: &[(String, i64)]) -> String {
    views
        .iter()
        .map(|(page, at)| {
            json!({"topic": "pageviews", "key": page, "value": "{}", "timestamp": at}).to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn pageviews_emits_each_closed_window_once_whatever_the_batching() {
    let manifest = build_guest("examples/pageviews/onceflow.toml");
    // The boundaries first, 10 minutes before the rest.
    let edge_at = BASE - 10 * SIZE;
    let mut views_all = boundary_views(edge_at);
    views_all.extend(views(3_000, 7, BASE));
    let views = views_all;
    let input = input(&views);
    for partitions in [1, 3] {
        let (closed, late) = model(&views, partitions);
        assert!(closed.len() > 100 && late.len() > 50, "{closed:?} {late:?}");
        // The window [edge, edge + 60 s) counts the view at 59.999 s that
        // came when stream time stood at its end, and not the one at
        // exactly end + grace.
        assert!(
            closed.contains(&("/edge".to_owned(), edge_at, 2)),
            "{closed:?}"
        );
        assert!(
            late.contains(&("/edge".to_owned(), edge_at + SIZE - 1)),
            "{late:?}"
        );
        let mut first: Option<Vec<u8>> = None;
        for batch in ["1", "7", "500"] {
            let out = batched(&manifest, &input, batch, partitions);
            let mut got_closed = BTreeSet::new();
            let mut got_late = BTreeSet::new();
            for line in json_lines(&out) {
                match line["topic"].as_str() {
                    Some("pageview-counts") => {
                        let key = parse_count(line["value"].as_str().unwrap());
                        assert_eq!(line["key"].as_str(), Some(key.0.as_str()));
                        assert!(got_closed.insert(key.clone()), "{key:?} emitted twice");
                    }
                    Some("pageviews.dlq") => {
                        let at = late_at(line["error"].as_str().unwrap());
                        got_late.insert((line["key"].as_str().unwrap().to_owned(), at));
                    }
                    other => panic!("unexpected output topic {other:?}"),
                }
            }
            assert_eq!(got_closed, closed, "partitions {partitions}, batch {batch}");
            assert_eq!(got_late, late, "partitions {partitions}, batch {batch}");
            // The same records punctuate at the same places, however batched:
            // the output is the same, byte for byte, in the same order.
            match &first {
                None => first = Some(out),
                Some(f) => assert!(*f == out, "batch {batch} changed the output"),
            }
        }
    }
}

#[test]
fn dump_state_shows_the_open_windows() {
    let manifest = build_guest("examples/pageviews/onceflow.toml");
    let input = input(&[
        ("/a".into(), BASE + 1_000),
        ("/a".into(), BASE + 2_000),
        ("/b".into(), BASE + 61_000),
    ]);
    let out = offline_test(&manifest, &input, &["--dump-state"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state: Vec<_> = json_lines(&out.stdout)
        .into_iter()
        .filter(|l| l["store"] == "views")
        .map(|l| {
            (
                l["key"].as_str().unwrap().to_owned(),
                l["start"].as_i64().unwrap(),
                l["value"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        state,
        [
            ("/a".to_owned(), BASE, "2".to_owned()),
            ("/b".to_owned(), BASE + SIZE, "1".to_owned())
        ]
    );
}

/// A component built against `onceflow:processor@0.1.0` (the wallet as it
/// was built before 0.2.0, kept as a fixture) runs on this host unchanged
/// and prints what the wallet built against 0.2.0 prints.
#[test]
fn a_component_built_against_wit_0_1_0_runs_unchanged() {
    let fixture = repo().join("tests/fixtures/wallet-0.1.0.wasm");
    let bytes = std::fs::read(&fixture).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("onceflow:processor/state@0.1.0"));
    assert!(
        !text.contains("@0.2.0"),
        "the fixture must be a 0.1.0 build"
    );

    let manifest = build_guest("examples/wallet/onceflow.toml");
    let current =
        std::fs::read(repo().join("examples/wallet/target/onceflow/wallet.wasm")).unwrap();
    assert!(String::from_utf8_lossy(&current).contains("onceflow:processor/state@0.2.0"));
    let input = std::fs::read_to_string(repo().join("examples/wallet/sample.jsonl")).unwrap();
    let old = offline_test(
        &manifest,
        &input,
        &["--component", fixture.to_str().unwrap(), "--dump-state"],
    );
    let new = offline_test(&manifest, &input, &["--dump-state"]);
    assert!(
        old.status.success(),
        "{}",
        String::from_utf8_lossy(&old.stderr)
    );
    assert!(
        new.status.success(),
        "{}",
        String::from_utf8_lossy(&new.stderr)
    );
    assert!(json_lines(&old.stdout).len() > 5);
    assert_eq!(
        String::from_utf8_lossy(&old.stdout),
        String::from_utf8_lossy(&new.stdout)
    );
}

/// The fraud example offline: account updates and payments in one input
/// file (the table's records by its topic), in rounds, against the model of
/// the join, under several batch sizes and partition counts.
#[test]
fn fraud_joins_payments_with_the_accounts_table_offline() {
    let manifest = build_guest("examples/fraud/onceflow.toml");
    let mut records = Vec::new();
    for r in 0..20 {
        let (updates, payments) = round(r, BASE, "payments", "accounts");
        records.extend(updates);
        records.extend(payments);
    }
    let input = records
        .iter()
        .map(|(topic, key, value, at)| {
            json!({"topic": topic, "key": key, "value": value, "timestamp": at}).to_string()
        })
        .collect::<Vec<_>>()
        .join("\n");
    for partitions in [1, 3] {
        let expected: BTreeSet<(String, String)> = fraud_model(&records, "accounts", partitions)
            .into_iter()
            .map(|(_, key, value)| (key, value))
            .collect();
        assert!(expected.len() > 100, "{}", expected.len());
        for batch in ["1", "64"] {
            let out = batched(&manifest, &input, batch, partitions);
            let mut got = BTreeSet::new();
            for line in json_lines(&out) {
                assert_eq!(line["topic"], "alerts", "{line}");
                let alert = (
                    line["key"].as_str().unwrap().to_owned(),
                    line["value"].as_str().unwrap().to_owned(),
                );
                assert!(got.insert(alert.clone()), "{alert:?} twice");
            }
            assert_eq!(got, expected, "partitions {partitions}, batch {batch}");
        }
    }
}

/// A task of the pageviews example on partition 0 over memory stores, its
/// window store's retention set to `retention_ms`.
fn pageviews_task(retention_ms: u64) -> onceflow::task::Task {
    use onceflow::manifest::Manifest;
    use onceflow::sandbox::{Sandbox, SandboxConfig};
    use onceflow::state::MemoryPartition;
    use onceflow::task::{Task, TaskConfig, processor_policy};
    let m = Manifest::load(build_guest("examples/pageviews/onceflow.toml")).unwrap();
    let bytes = std::fs::read(m.component_path()).unwrap();
    let processor = Sandbox::new(SandboxConfig::default())
        .unwrap()
        .load(&bytes, processor_policy(&m))
        .unwrap();
    let mut config = TaskConfig::from_manifest(&m);
    config.window_stores = vec![("views".to_owned(), retention_ms)];
    Task::new(0, processor, config, Box::new(MemoryPartition::default()))
}

/// eos-audit-3 finding 12: an abort takes the last sweep of expired windows
/// back with the stream time, so the records that run again sweep again and
/// their transaction deletes the expired windows. Before, `Task::abort` kept
/// the sweep's time: the second run swept nothing, and the expired windows
/// stayed (with their changelog records) for another quarter of the
/// retention.
#[test]
fn an_abort_takes_back_the_sweep_of_expired_windows() {
    use onceflow::state::window::decode;
    use onceflow::task::{BatchOutcome, Task};
    use onceflow::types::InputRecord;
    let view = |offset: i64, page: &str, at: i64| InputRecord {
        topic: "pageviews".into(),
        partition: 0,
        offset,
        timestamp: at,
        key: Some(page.as_bytes().to_vec()),
        value: Some(b"{}".to_vec()),
        headers: vec![],
    };
    // The windows the open transaction deletes: (page, start).
    let deleted = |task: &Task| -> Vec<(String, i64)> {
        task.pending_changes()
            .into_iter()
            .filter(|c| c.store == "views")
            .flat_map(|c| c.changes)
            .filter(|(_, value)| value.is_none())
            .filter_map(|(raw, _)| decode(&raw))
            .map(|w| (String::from_utf8_lossy(&w.key).into_owned(), w.start))
            .collect()
    };
    // Retention 5 s: a sweep is due every 1.25 s of stream time.
    let mut task = pageviews_task(5_000);
    task.process_batch(&[view(0, "/a", BASE + 4_000)], &mut BatchOutcome::default())
        .unwrap();
    task.freeze();
    task.apply_committed(Vec::new(), None).unwrap();
    assert_eq!(deleted(&task), []);

    // 2 s later /a's window (start BASE) is 6 s old: the sweep deletes it.
    let next = [view(1, "/b", BASE + 6_000)];
    task.process_batch(&next, &mut BatchOutcome::default())
        .unwrap();
    assert_eq!(deleted(&task), [("/a".to_owned(), BASE)]);

    // The transaction aborts; the same record runs again.
    task.abort();
    task.process_batch(&next, &mut BatchOutcome::default())
        .unwrap();
    assert_eq!(
        deleted(&task),
        [("/a".to_owned(), BASE)],
        "the record ran again, and its transaction must delete what its sweep deleted"
    );
}
