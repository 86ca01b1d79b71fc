//! Tables and stream–table joins on the broker: the fraud example (payments
//! joined with an accounts table) under exactly_once_v2 while three hosts
//! join and leave (one killed with SIGKILL, one stopped), against a model
//! and against Kafka Streams' `stream.join(table)` (`KStreamsFraud`) on the
//! same topics. Every assignment a host logs gives each partition of the
//! payments and of the accounts to the same worker (co-partitioned: the
//! range assignor), and a table whose partition count differs from the
//! input's is refused, both named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::build_guest;
use crate::common::cluster::{Cluster, plain_producer, serial};
use crate::common::fraud::{Out, model, round};
use crate::common::host_process::{Host, assignments};
use crate::common::kstreams::{KStreams, produce, read_committed, unique};

/// The fraud manifest on the test's topics.
fn fraud_manifest(dir: &Path, name: &str, topics: [&str; 4]) -> PathBuf {
    let [payments, accounts, alerts, dlq] = topics;
    let example = build_guest("examples/fraud/onceflow.toml");
    let component = example
        .parent()
        .expect("the example's directory")
        .join("target/onceflow/fraud.wasm");
    let text = std::fs::read_to_string(&example)
        .expect("the example's manifest")
        .replace("name = \"fraud\"", &format!("name = \"{name}\""))
        .replace("tenant = \"demo\"", "tenant = \"test\"")
        .replace(
            "inputs = [\"payments\"]",
            &format!("inputs = [\"{payments}\"]"),
        )
        .replace(
            "accounts = \"accounts\"",
            &format!("accounts = \"{accounts}\""),
        )
        .replace(
            "component = \"target/onceflow/fraud.wasm\"",
            &format!("component = \"{}\"", component.display()),
        )
        .replace("alerts = \"alerts\"", &format!("alerts = \"{alerts}\""))
        .replace(
            "dead-letter-topic = \"payments.dlq\"",
            &format!("dead-letter-topic = \"{dlq}\""),
        );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, text).expect("write the manifest");
    path
}

#[test]
fn fraud_join_through_hosts_joining_and_leaving_matches_kafka_streams() {
    let _serial = serial();
    let cluster = Cluster::shared();
    let id = unique();
    let name = format!("fraud-{id}");
    let (payments, accounts, alerts, dlq, ks_alerts, bad) = (
        format!("payments-{id}"),
        format!("accounts-{id}"),
        format!("alerts-{id}"),
        format!("payments-{id}.dlq"),
        format!("ks-alerts-{id}"),
        format!("accounts-two-{id}"),
    );
    cluster.create_topics(&[
        (&payments, 3),
        (&accounts, 3),
        (&alerts, 3),
        (&dlq, 1),
        (&ks_alerts, 3),
        (&bad, 2),
    ]);
    let dir = tempfile::tempdir().expect("temp dir");

    // A table that is not co-partitioned with the input is refused, both
    // named.
    let refused = fraud_manifest(
        dir.path(),
        &format!("{name}-bad"),
        [&payments, &bad, &alerts, &dlq],
    );
    let mut host = Host::run(&refused, &cluster.host_bootstrap, dir.path(), "bad", &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while host.exited().is_none() {
        assert!(
            Instant::now() < deadline,
            "a bad manifest ran:\n{}",
            host.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = host.log_text();
    assert!(
        log.contains(&bad) && log.contains(&payments) && log.contains("co-partitioned"),
        "{log}"
    );

    let manifest = fraud_manifest(dir.path(), &name, [&payments, &accounts, &alerts, &dlq]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    let base = now - 2 * 3600 * 1000;
    let producer = plain_producer(cluster);
    let group = format!("test.{name}");
    let start = |instance: &str| {
        Host::run(
            &manifest,
            &cluster.host_bootstrap,
            dir.path(),
            instance,
            &[],
        )
    };
    let mut hosts: BTreeMap<&str, Host> = BTreeMap::new();
    let mut produced: Vec<Out> = Vec::new();
    let mut ends: BTreeMap<String, i64> = BTreeMap::new();
    // The first two rounds are in Kafka before any host starts: a task takes
    // its records in timestamp order across the payments and the table,
    // waiting for the table's unread records, as Kafka Streams does. A host
    // that checked payments against the part of the table one poll had
    // fetched missed alerts; one that read the table to its end first
    // checked round 0's payments against round 1's accounts.
    let (updates, pays) = round(0, base, &payments, &accounts);
    let (next_updates, next_pays) = round(1, base, &payments, &accounts);
    // A table of 3,000 records before them (each account updated 75 times:
    // only the last value counts), so that the first polls cannot hold all
    // of it.
    let history: Vec<Out> = (0..3_000)
        .map(|i| {
            let value = format!("{{\"limit\":{},\"status\":\"active\"}}", (i * 7) % 1000);
            (
                accounts.clone(),
                format!("acct-{}", i % 40),
                Some(value),
                base - 10_000 + i,
            )
        })
        .collect();
    for batch in [history, updates, pays, next_updates, next_pays] {
        produce(&producer, &batch);
        *ends.entry(batch[0].0.clone()).or_default() += batch.len() as i64;
        produced.extend(batch);
    }
    hosts.insert("a", start("a"));
    let consumed = |hosts: &BTreeMap<&str, Host>, topic: &str, end: i64| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (committed, _) = cluster.progress(&group, topic);
            if committed >= end {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{topic}: {committed} of {end} consumed; logs:\n{}",
                hosts
                    .values()
                    .map(Host::log_text)
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let rounds = 24;
    for topic in [&accounts, &payments] {
        consumed(&hosts, topic, ends[topic]);
    }
    for r in 2..rounds {
        match r {
            6 => {
                hosts.insert("b", start("b"));
            }
            10 => {
                hosts.insert("c", start("c"));
            }
            14 => hosts.remove("b").expect("b runs").kill(),
            18 => assert!(hosts.remove("c").expect("c runs").stop().success()),
            _ => {}
        }
        let (updates, pays) = round(r, base, &payments, &accounts);
        for batch in [updates, pays] {
            produce(&producer, &batch);
            let topic = batch[0].0.clone();
            *ends.entry(topic.clone()).or_default() += batch.len() as i64;
            produced.extend(batch);
            consumed(&hosts, &topic, ends[&topic]);
        }
    }
    let expected = model(&produced, &accounts, 3);
    for (instance, host) in std::mem::take(&mut hosts) {
        assert!(host.stop().success(), "{instance} stops cleanly");
    }
    let mut rebalances = 0;
    for entry in std::fs::read_dir(dir.path()).expect("the test's directory") {
        let path = entry.expect("an entry").path();
        if path.extension().is_some_and(|e| e == "log") && !path.ends_with("bad.log") {
            let log = std::fs::read_to_string(&path).expect("a host log");
            let assigned = assignments(&log);
            rebalances += assigned.len();
            for assignment in assigned {
                assert_eq!(
                    assignment.get(&payments),
                    assignment.get(&accounts),
                    "{}: a task's topics split between workers: {assignment:?}",
                    path.display()
                );
            }
            assert!(
                !log.contains(" ERROR "),
                "{}: no errors:\n{log}",
                path.display()
            );
            // A task waits for a topic's unread records only while they
            // come; a partition read to its end (nothing new in the table
            // since the task's restore) must not hold the payments back.
            assert!(
                !log.contains("going on without them"),
                "{}: a task waited the longest wait for a table:\n{log}",
                path.display()
            );
        }
    }

    let mut ours = BTreeSet::new();
    for (partition, key, value, _) in read_committed(cluster, &alerts) {
        assert!(
            ours.insert((partition, key.clone(), value.clone())),
            "alert {value} emitted twice"
        );
    }
    assert!(
        ours == expected,
        "every alert once: emitted and not expected {:?}; expected and not emitted {:?}",
        ours.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&ours).collect::<Vec<_>>()
    );
    assert!(read_committed(cluster, &dlq).is_empty(), "no dead letters");
    println!(
        "FIGURE fraud_join records {} alerts {} hosts 3 kills 1 assignments {rebalances}",
        produced.len(),
        ours.len()
    );

    // Kafka Streams on the same topics, every record already there.
    let state = dir.path().join("kstreams-state");
    let log = dir.path().join("kstreams-fraud.log");
    let ks = KStreams::start(
        "KStreamsFraud",
        &[
            &cluster.bootstrap,
            &format!("ks-fraud-{id}"),
            &payments,
            &accounts,
            &ks_alerts,
            "exactly_once_v2",
            "100",
            state.to_str().expect("utf-8 path"),
        ],
        &log,
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let read = read_committed(cluster, &ks_alerts).len();
        if read >= expected.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Kafka Streams emitted {read} of {} alerts; log:\n{}",
            expected.len(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(2));
    drop(ks);
    let mut theirs = BTreeSet::new();
    for (partition, key, value, _) in read_committed(cluster, &ks_alerts) {
        assert!(
            theirs.insert((partition, key, value.clone())),
            "Kafka Streams emitted {value} twice"
        );
    }
    assert!(
        theirs == ours,
        "Onceflow and Kafka Streams agree per partition and record: only Kafka Streams {:?}; \
         only Onceflow {:?}",
        theirs.difference(&ours).collect::<Vec<_>>(),
        ours.difference(&theirs).collect::<Vec<_>>()
    );
    println!(
        "FIGURE fraud_vs_kafka_streams records {} equal {}",
        theirs.len(),
        theirs == ours
    );
}
