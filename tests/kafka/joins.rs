//! Tables and stream–table joins on the broker: the fraud example (payments
//! joined with an accounts table) under exactly_once_v2 while three hosts
//! join and leave (one killed with SIGKILL, one stopped), against a model
//! and against Kafka Streams' `stream.join(table)` (`KStreamsFraud`) on the
//! same topics. Every assignment a host logs gives each partition of the
//! payments and of the accounts to the same worker (co-partitioned: the
//! range assignor), and a table whose partition count differs from the
//! input's is refused, both named.

use crate::common::replay::replay_everything;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::build_guest;
use crate::common::cluster::{Cluster, plain_producer, serial};
use crate::common::fraud::{Out, model, round};
use crate::common::host_process::{Host, assignments};
use crate::common::kstreams::{KStreams, produce, read_committed, unique};

/// The fraud manifest on the test's topics (or a port's:
/// `common::example_port`).
fn fraud_manifest(dir: &Path, name: &str, topics: [&str; 4]) -> PathBuf {
    let [payments, accounts, alerts, dlq] = topics;
    let port = crate::common::example_port("fraud");
    let example = build_guest(&format!("examples/{port}/onceflow.toml"));
    let component = example
        .parent()
        .expect("the example's directory")
        .join(format!("target/onceflow/{port}.wasm"));
    let text = std::fs::read_to_string(&example)
        .expect("the example's manifest")
        .replace(&format!("name = \"{port}\""), &format!("name = \"{name}\""))
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
            &format!("component = \"target/onceflow/{port}.wasm\""),
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
    // Every transaction replays to its bytes: the payments joined with the
    // table as it was, its records interleaved as they were polled.
    let label = crate::common::example_port("fraud");
    replay_everything(&cluster.bootstrap, &manifest, 3, Some(&dlq), &label);

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

/// A table's restore stops at the group's committed offset of its topic
/// (issue 42, item 3; eos-audit-3 finding 4). Host A joins payment p1 with
/// account k's first value (limit 1,000) and stops; k's second value
/// (limit 100) follows, and the cleaner compacts the first away. Host B,
/// with an empty state directory, restores the table up to the committed
/// offset, then takes payment p2, older than k's second value, which a run
/// without the restart joins with the first value (no alert). Before, the
/// restore read one record past the committed offset when the records below
/// it were compacted: the store held k's future value, and p2 raised an
/// over-limit alert. Now k is absent until its second value comes through
/// the consumer (Kafka Streams' behaviour: restoring "as of" an offset of a
/// compacted topic cannot bring back a value the cleaner removed), and p2
/// raises nothing.
#[test]
fn table_restore_stops_at_the_committed_offset() {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};

    let _serial = serial();
    let rig = CompactedFraud::new("restore", &[]);
    let (cluster, t0) = (rig.cluster, rig.t0);
    let (payments, accounts) = (rig.payments.clone(), rig.accounts.clone());
    let producer = plain_producer(cluster);
    let account = |limit: i64| Some(format!("{{\"limit\":{limit},\"status\":\"active\"}}"));

    // Host A: k's first value (offset 0) and p1, joined, committed.
    produce(
        &producer,
        &[
            (accounts.clone(), "k".into(), account(1_000), t0),
            (
                payments.clone(),
                "k".into(),
                CompactedFraud::payment("p1", 500),
                t0 + 1_000,
            ),
        ],
    );
    let a = rig.host("a", &[]);
    rig.wait_committed(&accounts, 1, &a);
    rig.wait_committed(&payments, 1, &a);
    assert!(a.stop().success(), "host A's exit");

    // k's second value (offset 1), then fillers until offset 0 is gone.
    produce(
        &producer,
        &[(accounts.clone(), "k".into(), account(100), t0 + 10_000)],
    );
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("group.id", format!("probe-{accounts}"))
        .set("enable.auto.commit", "false")
        .create()
        .expect("a reader");
    let first_offset = || -> Option<i64> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&accounts, 0, Offset::Beginning)
            .expect("offset");
        reader.assign(&tpl).expect("assign");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Some(Ok(m)) = reader.poll(Duration::from_millis(200)) {
                return Some(m.offset());
            }
        }
        None
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut fillers = 0;
    while !matches!(first_offset(), Some(o) if o > 0) {
        assert!(
            Instant::now() < deadline,
            "the cleaner did not compact k's first value away within 180 s"
        );
        fillers += 1;
        produce(
            &producer,
            &[(
                accounts.clone(),
                format!("filler-{fillers}"),
                account(1),
                t0 + 20_000 + fillers * 1_000,
            )],
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // p2, older than k's second value; host B from an empty state dir.
    produce(
        &producer,
        &[(
            payments.clone(),
            "k".into(),
            CompactedFraud::payment("p2", 500),
            t0 + 5_000,
        )],
    );
    let b = rig.host("b", &[]);
    rig.wait_committed(&payments, 2, &b);
    let log = b.log_text();
    assert!(b.stop().success(), "host B's exit");
    let raised = rig.alerts_for("p2");
    println!("FIGURE table_restore_fillers_until_compacted {fillers}");
    println!(
        "FIGURE table_restore_alerts_from_the_future {}",
        raised.len()
    );
    assert!(
        raised.is_empty(),
        "p2 was joined with k's value from after it (the restore read past the committed \
         offset): {raised:?}\nhost B:\n{log}"
    );
}

/// A table store is trusted only as long as its topic's own
/// `delete.retention.ms` since it was last in sync (issue 42, item 1;
/// eos-audit-3 findings 2 and 10). Host Y runs the fraud example alone and
/// applies account k (blocked); host X joins and the group gives it the
/// partition (the range assignor sorts members by instance), while Y keeps
/// a standby of it, which follows the changelogs and leaves the table
/// store as it was. X applies k's tombstone, and the cleaner removes k from
/// the table's topic (its `delete.retention.ms` is 1 s). X is killed, and
/// the partition returns to Y. Before, Y trusted its table store (the
/// directory's age, which the standby kept fresh, against the changelogs'
/// one-day horizon): k was still blocked there, and payment p2 raised a
/// "blocked" alert for an account that no longer exists. Now each store
/// carries when it was last in sync with its log: Y's table store is older
/// than its topic's horizon, so it is wiped and restored, and p2 raises
/// nothing (as on a host with no state).
#[test]
fn a_stale_table_store_is_restored_in_full() {
    let _serial = serial();
    // The table's tombstones kept for 1 s (the changelogs keep Kafka's
    // default day).
    let rig = CompactedFraud::new("stale", &[("delete.retention.ms", "1000")]);
    let (cluster, t0) = (rig.cluster, rig.t0);
    let (payments, accounts) = (rig.payments.clone(), rig.accounts.clone());
    let text = std::fs::read_to_string(&rig.manifest).expect("the manifest");
    assert!(text.contains("commit-interval-ms = 100\n"));
    std::fs::write(
        &rig.manifest,
        text.replace(
            "commit-interval-ms = 100\n",
            "commit-interval-ms = 100\nstandby-replicas = 1\n",
        ),
    )
    .expect("write the manifest");
    let producer = plain_producer(cluster);
    let blocked = Some("{\"limit\":1000,\"status\":\"blocked\"}".to_owned());
    let wait_log = |host: &Host, text: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !host.log_text().contains(text) {
            assert!(
                Instant::now() < deadline,
                "no \"{text}\" after 120 s:\n{}",
                host.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let session = ["--session-timeout-ms", "2000"];

    // Y alone: k blocked, and p1 raises its alert.
    produce(
        &producer,
        &[
            (accounts.clone(), "k".into(), blocked.clone(), t0),
            (
                payments.clone(),
                "k".into(),
                CompactedFraud::payment("p1", 5),
                t0 + 1_000,
            ),
        ],
    );
    let y = rig.host("y", &session);
    rig.wait_committed(&accounts, 1, &y);
    rig.wait_committed(&payments, 1, &y);
    // X joins and runs the partition; Y follows it as a standby.
    let x = rig.host("x", &session);
    wait_log(&y, "standby started");
    wait_log(&x, "partitions assigned");
    // k's tombstone, then fillers until the cleaner has removed every
    // record of k from the table's topic; X applies them all.
    produce(
        &producer,
        &[(accounts.clone(), "k".into(), None, t0 + 2_000)],
    );
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut fillers = 0i64;
    loop {
        let keys: Vec<String> = read_all(cluster, &accounts)
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        if !keys.iter().any(|k| k == "k") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cleaner did not remove k's records within 180 s: {keys:?}"
        );
        fillers += 1;
        produce(
            &producer,
            &[(
                accounts.clone(),
                format!("filler-{fillers}"),
                Some("{\"limit\":1,\"status\":\"active\"}".to_owned()),
                t0 + 3_000 + fillers * 1_000,
            )],
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let table_end = cluster.progress(&rig.group, &accounts).1;
    rig.wait_committed(&accounts, table_end, &x);
    let y_before = y.log_text().len();
    x.kill();
    // The partition returns to Y, and p2 comes.
    produce(
        &producer,
        &[(
            payments.clone(),
            "k".into(),
            CompactedFraud::payment("p2", 5),
            t0 + 900_000,
        )],
    );
    rig.wait_committed(&payments, 2, &y);
    let log = y.log_text();
    assert!(y.stop().success(), "host Y's exit");
    let takeover = &log[y_before..];
    let raised = rig.alerts_for("p2");
    println!("FIGURE stale_table_fillers_until_compacted {fillers}");
    println!(
        "FIGURE stale_table_alerts_for_a_deleted_account {}",
        raised.len()
    );
    assert!(
        raised.is_empty(),
        "p2 was joined with account k, deleted from the table before Y took the partition \
         back (Y trusted its stale table store): {raised:?}\nhost Y after the kill:\n{takeover}"
    );
    assert!(
        takeover.contains("last in sync with its log"),
        "Y says it wiped the stale table store:\n{takeover}"
    );
}

/// Every record of `topic` (one partition) as (key, value), read
/// uncommitted from its log start: what the cleaner has left.
fn read_all(cluster: &Cluster, topic: &str) -> Vec<(String, Option<String>)> {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Message, Offset, TopicPartitionList};
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("group.id", format!("scan-{topic}"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .expect("a reader");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .expect("offset");
    reader.assign(&tpl).expect("assign");
    let mut records = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match reader.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => records.push((
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                m.payload().map(|v| String::from_utf8_lossy(v).into_owned()),
            )),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return records,
            _ => {}
        }
    }
    panic!("{topic}: no end within 10 s");
}

/// A fraud deployment on one-partition topics whose table topic the cleaner
/// compacts as soon as it can (segments rolled every 200 ms, any dirty
/// ratio cleaned; `table_config` adds to that), for the tests of what a
/// restore makes of a compacted table.
struct CompactedFraud {
    cluster: &'static Cluster,
    payments: String,
    accounts: String,
    alerts: String,
    group: String,
    dir: tempfile::TempDir,
    manifest: PathBuf,
    /// A base for record timestamps: an hour ago.
    t0: i64,
}

impl CompactedFraud {
    fn new(label: &str, table_config: &[(&str, &str)]) -> CompactedFraud {
        use rdkafka::ClientConfig;
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        use rdkafka::client::DefaultClientContext;

        let cluster = Cluster::shared();
        let id = unique();
        let name = format!("fraud-{label}-{id}");
        let (payments, accounts, alerts, dlq) = (
            format!("payments-{label}-{id}"),
            format!("accounts-{label}-{id}"),
            format!("alerts-{label}-{id}"),
            format!("payments-{label}-{id}.dlq"),
        );
        cluster.create_topics(&[(&payments, 1), (&alerts, 1), (&dlq, 1)]);
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &cluster.bootstrap)
            .create()
            .expect("admin client");
        let mut table = NewTopic::new(&accounts, 1, TopicReplication::Fixed(1))
            .set("cleanup.policy", "compact")
            .set("segment.ms", "200")
            .set("min.cleanable.dirty.ratio", "0.01");
        for (k, v) in table_config {
            table = table.set(k, v);
        }
        for r in futures::executor::block_on(admin.create_topics([&table], &AdminOptions::new()))
            .expect("create the table's topic")
        {
            r.expect("the table's topic created");
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let manifest = fraud_manifest(dir.path(), &name, [&payments, &accounts, &alerts, &dlq]);
        let t0 = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as i64
            - 3600 * 1000;
        CompactedFraud {
            cluster,
            payments,
            accounts,
            alerts,
            group: format!("test.{name}"),
            dir,
            manifest,
            t0,
        }
    }

    /// Payment `id` of 5 or `amount` from account k.
    fn payment(id: &str, amount: i64) -> Option<String> {
        Some(format!(
            "{{\"payment_id\":\"{id}\",\"account\":\"k\",\"amount\":{amount}}}"
        ))
    }

    /// Waits for the group to commit `n` records of `topic`.
    fn wait_committed(&self, topic: &str, n: i64, host: &Host) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.cluster.progress(&self.group, topic).0 < n {
            assert!(
                Instant::now() < deadline,
                "{topic}: {n} records not committed after 120 s:\n{}",
                host.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `onceflow run` as `instance`.
    fn host(&self, instance: &str, extra: &[&str]) -> Host {
        Host::run(
            &self.manifest,
            &self.cluster.host_bootstrap,
            self.dir.path(),
            instance,
            extra,
        )
    }

    /// The committed alerts for payment `id`.
    fn alerts_for(&self, id: &str) -> Vec<crate::common::kstreams::Read> {
        read_committed(self.cluster, &self.alerts)
            .into_iter()
            .filter(|(_, _, value, _)| value.contains(&format!("\"{id}\"")))
            .collect()
    }
}
