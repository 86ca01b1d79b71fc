//! The JavaScript and Python wallets under exactly_once_v2 on a real Kafka,
//! with a host killed (SIGKILL) while a transaction holding outputs is open:
//! the wallet verification must find every valid payment's effects exactly
//! once and every malformed one dead-lettered exactly once.
//!
//! Uses the `Wallet` rig of tests/common/wallet.rs with the ported wallet's
//! component and limits in place of the Rust one's.

use std::time::{Duration, Instant};

use crate::common::cluster::{Cluster, serial};
use crate::common::replay::replay_everything;
use crate::common::txn_probe::TxnProbe;
use crate::common::wallet::{Produced, Wallet, assert_exact};

/// A wallet deployment on fresh topics running the wallet of `example`
/// (e.g. `examples/wallet-js`) with that example's limits.
fn ported_wallet(cluster: &'static Cluster, example: &str, label: &str) -> Wallet {
    let w = Wallet::new(cluster, label, "exactly_once_v2", 3);
    w.use_example(example, None);
    // Transactions of 1 s, not 100 ms: the kill below must land inside one.
    // Once the JS wallet got fast (2026-12-03), a 100 ms transaction could
    // commit between the probe seeing it open and the kill (CI: "killed
    // mid-stream, not at 550 of 550").
    let text = std::fs::read_to_string(&w.manifest).expect("the rig's manifest");
    assert!(
        text.contains("commit-interval-ms = 100\n"),
        "the rig's commit interval"
    );
    let text = text.replace("commit-interval-ms = 100\n", "commit-interval-ms = 1000\n");
    std::fs::write(&w.manifest, text).expect("write the manifest");
    w
}

/// Feeds payments (every 25th malformed) until the host is killed while a
/// transaction holding outputs is open, restarts it, feeds `n / 2` more,
/// and verifies the outputs.
fn exactly_once_with_a_crash(example: &str, label: &str) {
    let _serial = serial();
    let cluster = Cluster::shared();
    let w = ported_wallet(cluster, example, label);
    let probe = TxnProbe::new(w.cluster, &w.audit);
    let n = 6_000;
    let mut produced = Produced::default();
    let mut host = w.start("a", &[]);
    // Payments arrive at 500/s (50 every 100 ms), slower than either wallet
    // processes them, so transactions holding outputs keep opening whatever
    // the machine's speed; kill during one of them, once some batches are
    // committed (the first start compiles the component: up to a minute for
    // a 12-18 MB interpreter).
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut first_half = 0;
    std::thread::scope(|scope| {
        let feeder = scope.spawn(|| {
            let mut fed = Produced::default();
            let mut at = 0;
            while at < 60_000 && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                fed.absorb(w.produce(at, 50, 200, Some(25)));
                at += 50;
                std::thread::sleep(Duration::from_millis(100));
            }
            (fed, at)
        });
        // A hang guard: the compile alone takes minutes on a slow or busy
        // machine.
        let deadline = Instant::now() + Duration::from_secs(600);
        while w.committed() < 500 || !probe.open() {
            assert!(
                Instant::now() < deadline,
                "{example}: no open transaction; log:\n{}",
                host.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        host.kill();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (fed, at) = feeder.join().expect("feeder");
        produced.absorb(fed);
        first_half = at;
    });
    let at_kill = w.committed();
    host = w.start("a", &[]);
    produced.absorb(w.produce(first_half, n / 2, 200, Some(25)));
    w.wait_done(Duration::from_secs(300));
    let log = host.log_text();
    assert!(host.stop().success(), "{example}: clean stop; log:\n{log}");
    assert!(
        (500..first_half as i64).contains(&at_kill),
        "{example}: killed mid-stream, not at {at_kill} of {first_half}"
    );
    let report = w.verify(false);
    assert_exact(&report, &produced, example);
    // Every committed transaction, the killed host's included, replays to
    // the same bytes, dead letters and all (docs/replay.md).
    let replays = replay_everything(&w.cluster.bootstrap, &w.manifest, 3, Some(&w.dlq), label);
    assert_eq!(
        replays.dead_letters, report.dead_letters,
        "{example}: dead letters replayed"
    );
    println!(
        "FIGURE {label}_eos_valid {} dead_letters {} committed_at_kill {at_kill}",
        report.valid, report.dead_letters
    );
}

#[test]
fn js_wallet_is_exactly_once_on_the_broker() {
    exactly_once_with_a_crash("examples/wallet-js", "lang-js");
}

#[test]
fn python_wallet_is_exactly_once_on_the_broker() {
    exactly_once_with_a_crash("examples/wallet-python", "lang-py");
}
