//! An abort while produce requests are in flight (issue 41, item 3).
//!
//! A worker aborts its open transaction in every rebalance callback. Before
//! the fix it purged the produce requests already sent (librdkafka's
//! `purge(queue | inflight)`) and then ended the transaction with the same
//! producer and epoch. A purged request is not recalled: it still reaches
//! its partition leader, and when it arrives after the worker's next
//! transaction added that partition, the leader takes it (same producer id
//! and epoch, the partition in an ongoing transaction, KIP-890 part 1's
//! check satisfied, its sequence the next one expected) and it commits with
//! the next transaction, although its input records were rewound and
//! processed again: duplicate outputs and balances counted twice.
//! librdkafka's own `abort_transaction` never purges requests in flight,
//! for this reason ("purging these messages may lead to gaps in the
//! idempotent producer sequences", rdkafka_txnmgr.c).
//!
//! The window is made wide on purpose: three brokers behind toxiproxy, the
//! requests to the brokers that coordinate neither the worker's
//! transactions nor its group held 2 s (so every output to their
//! partitions is in flight that long, while the coordinator answers
//! `EndTxn` and `AddPartitionsToTxn` at once), and hosts b1, b2, b3 join
//! and leave the group one after the other under continuous input, each
//! join and leave a rebalance whose callbacks abort.
//!
//! On a real broker the purged request was refused in the runs made (it
//! arrived before the next transaction added its partition: KIP-890 part
//! 1), and its gap failed the next transaction ("skipped sequence numbers
//! (OUT_OF_ORDER_SEQUENCE_NUMBER, requires epoch bump)"); the duplicate
//! itself is shown by the simulation (`scripts/simulate --logic purge`).
//!
//! The verifier reads every output and balance: exact, and no host logs
//! librdkafka's "Purged in flight" error. Figures: `FIGURE abort_<name>`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{
    EXACTLY_ONCE, PARTITIONS, StopOnDrop, feed, group_coordinator, transaction_coordinators,
    violations,
};
use crate::common::cluster::{Cluster, cache, serial};
use crate::common::proxy::{Direction, FaultProxy, Toxic};
use crate::common::wallet::Wallet;

/// How long requests to the delayed brokers are held: longer than an abort
/// and the next transaction's first records take, shorter than the hosts'
/// request timeouts (a restore's 1 s offset probes among them).
const LATENCY_MS: u64 = 2_000;
/// Times the second host joins and leaves (two: each of the 4 rebalances
/// of three rounds aborted with records in flight, so two rounds keep the
/// test's proof and save the suite a round of about 20 s).
const REBALANCES: u32 = 2;
/// The hosts' commit interval: records are produced into the open
/// transaction (in flight, held up by the latency) for this long before its
/// commit begins, and an abort waits for a commit in flight to end first.
const COMMIT_INTERVAL_MS: u64 = 6_000;
/// Transactions wait out the latency a few times over: a timeout well
/// above the commit interval plus those waits.
const HOST_ARGS: [&str; 4] = [
    "--session-timeout-ms",
    "6000",
    "--transaction-timeout-ms",
    "60000",
];

/// Waits until `host` logged its `n`th non-empty assignment.
fn wait_assigned(host: &mut crate::common::host_process::Host, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = host.log_text();
        if assigned_count(&log) >= n {
            return;
        }
        assert!(
            Instant::now() < deadline && host.exited().is_none(),
            "host {} did not get partitions (assignment {n}) within 120 s; its log:\n{log}",
            host.instance
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Non-empty assignments in a host's log.
fn assigned_count(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("partitions assigned") && !l.contains("assigned={}"))
        .count()
}

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE abort_{name} {value}");
}

#[test]
fn abort_with_requests_in_flight() {
    let _g = serial();
    let cluster: &'static Cluster =
        Box::leak(Box::new(Cluster::start_behind_proxy("abort", 19792, 3)));
    let proxy = FaultProxy::start(cluster).unwrap_or_else(|e| panic!("{e}"));
    let w = Wallet::new(cluster, "abort", EXACTLY_ONCE, PARTITIONS);
    let manifest = std::fs::read_to_string(&w.manifest).expect("the wallet's manifest");
    assert!(
        manifest.contains("commit-interval-ms = 100\n"),
        "{manifest}"
    );
    std::fs::write(
        &w.manifest,
        manifest.replace(
            "commit-interval-ms = 100\n",
            &format!("commit-interval-ms = {COMMIT_INTERVAL_MS}\n"),
        ),
    )
    .expect("write the manifest");
    let stop = AtomicBool::new(false);
    let started = Instant::now();
    let note = |text: &str| println!("abort: [{:>6.1}s] {text}", started.elapsed().as_secs_f64());

    let (produced, logs) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let feeder = s.spawn(|| feed(&w, 0, &stop));
        let mut a = w.start("a", &HOST_ARGS);
        let deadline = Instant::now() + Duration::from_secs(120);
        while w.committed() == 0 {
            assert!(
                Instant::now() < deadline && a.exited().is_none(),
                "no first commit within 120 s; host a's log:\n{}",
                a.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Only brokers that coordinate nothing of the wallet's are slowed:
        // `EndTxn`, `AddPartitionsToTxn` and the group's requests are
        // answered at once, produce requests to their partitions held.
        let mut coordinating = transaction_coordinators(cluster, &w.app);
        coordinating.extend(group_coordinator(cluster, &w.app));
        let delayed: Vec<u32> = (1..=cluster.brokers)
            .filter(|b| !coordinating.contains(b))
            .collect();
        assert!(
            !delayed.is_empty(),
            "every broker coordinates something of {}: {coordinating:?}",
            w.app
        );
        for &b in &delayed {
            proxy
                .add(b, Direction::Upstream, Toxic::Latency { ms: LATENCY_MS })
                .unwrap_or_else(|e| panic!("{e}"));
        }
        note(&format!(
            "requests to brokers {delayed:?} held {LATENCY_MS} ms (brokers {coordinating:?} coordinate the transactions and the group)"
        ));
        let hosts: Vec<String> = (1..=REBALANCES).map(|r| format!("b{r}")).collect();
        for (round, instance) in hosts.iter().enumerate() {
            // Commits now wait for their outputs' acknowledgements: some
            // are in flight whenever the group rebalances. A new member
            // each round: a static member that leaves keeps its partitions
            // for its session timeout, and rejoining as the same one would
            // take them back without a rebalance.
            std::thread::sleep(Duration::from_secs(2));
            let mut b = w.start(instance, &HOST_ARGS);
            wait_assigned(&mut b, 1);
            note(&format!("round {}: host {instance} joined", round + 1));
            std::thread::sleep(Duration::from_secs(2));
            let status = b.stop();
            assert!(status.success(), "host {instance} exited with {status}");
            // Host a takes the partitions back (after the session timeout).
            let before = assigned_count(&a.log_text());
            wait_assigned(&mut a, before + 1);
            note(&format!(
                "round {}: host {instance} left, host a took its partitions back",
                round + 1
            ));
        }
        std::thread::sleep(Duration::from_secs(3));
        proxy.clear().unwrap_or_else(|e| panic!("{e}"));
        stop.store(true, Ordering::Relaxed);
        let (produced, _next) = feeder.join().expect("the input thread");
        let took = w.wait_done(Duration::from_secs(180));
        note(&format!(
            "faults over; lag drained in {:.1} s",
            took.as_secs_f64()
        ));
        let kept = cache().join("abort-logs");
        let _ = std::fs::remove_dir_all(&kept);
        let _ = std::fs::create_dir_all(&kept);
        let mut logs = String::new();
        for host in std::iter::once("a").chain(hosts.iter().map(String::as_str)) {
            let log = w.dir.path().join(format!("{host}.log"));
            let _ = std::fs::copy(&log, kept.join(format!("{host}.log")));
            logs.push_str(&std::fs::read_to_string(&log).unwrap_or_default());
        }
        note(&format!("the hosts' logs are kept in {}", kept.display()));
        assert!(a.exited().is_none(), "host a exited:\n{}", a.log_text());
        drop(a);
        (produced, logs)
    });

    let report = w.verify(false);
    let count = |needle: &str| logs.lines().filter(|l| l.contains(needle)).count();
    let found = violations(&report, &produced);
    figure("rebalances", REBALANCES * 2);
    let aborts: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("rebalance: aborting the open transaction"))
        .collect();
    let with_records = aborts
        .iter()
        .filter(|l| !l.contains("unacknowledged=0"))
        .count();
    figure("aborts_in_rebalance", aborts.len());
    figure("aborts_with_records_in_flight", with_records);
    figure("records_verified", report.valid);
    figure("duplicates", report.duplicates);
    figure("keys_wrong", report.keys_wrong);
    figure("violations", found);
    figure("purged_in_flight_errors", count("Purged in flight"));
    assert_eq!(
        found, 0,
        "an abort with requests in flight lost or duplicated effects: duplicates {} keys_wrong {} missing {} unexpected {}; findings {:#?}",
        report.duplicates, report.keys_wrong, report.missing, report.unexpected, report.findings
    );
    assert!(
        with_records > 0,
        "no rebalance aborted a transaction with records in flight: the test proves nothing; its aborts:\n{}",
        aborts.join("\n")
    );
    let errors: Vec<&str> = logs.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(
        errors.is_empty(),
        "the hosts logged errors:\n{}",
        errors.join("\n")
    );
    drop(proxy);
    cluster.down();
}
