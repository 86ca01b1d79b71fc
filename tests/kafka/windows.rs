//! Windows and stream time on the broker: the pageviews example under
//! exactly_once_v2 with the host killed (SIGKILL) while a transaction
//! holding window counts is open, then restarted; every closed window must
//! be emitted exactly once with its final count and every late view
//! dead-lettered exactly once, as an independent model says. Then Kafka
//! Streams 4.4 (`bench/kstreams-wallet`'s `KStreamsPageviews`: the DSL's
//! `windowedBy(...).count().suppress(untilWindowCloses(...))`) runs on the
//! same input topic, and its output must equal Onceflow's, record for
//! record per partition, key and window. And the session windows (issue
//! 44) beside `KStreamsSessions`, with its record cache and without.

use crate::common::replay::replay_everything;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdkafka::producer::BaseProducer;

use crate::common::build_guest;
use crate::common::cluster::{Cluster, plain_producer, serial};
use crate::common::host_process::Host;
use crate::common::kstreams::{KStreams, Read, produce, read_committed, unique};
use crate::common::pageviews::{late_at, model, parse_count, views};
use crate::common::sessions;
use crate::common::txn_probe::TxnProbe;

/// Sends views with their timestamps, then waits for the acknowledgements.
fn produce_views(producer: &BaseProducer, topic: &str, views: &[(String, i64)]) {
    let records: Vec<_> = views
        .iter()
        .map(|(page, at)| {
            let value = format!("{{\"page\":\"{page}\"}}");
            (topic.to_owned(), page.clone(), Some(value), *at)
        })
        .collect();
    produce(producer, &records);
}

/// The manifest of guest `manifest` (built, its component `wasm` under
/// `target/onceflow`) in `dir`, with each `(line, replacement)` made:
/// the test's own names and topics.
fn manifest_on(dir: &Path, manifest: &str, wasm: &str, replace: &[(&str, String)]) -> PathBuf {
    let guest = build_guest(manifest);
    let component = guest
        .parent()
        .expect("the guest's directory")
        .join("target/onceflow")
        .join(wasm);
    let mut text = std::fs::read_to_string(&guest)
        .expect("the guest's manifest")
        .replace(
            &format!("component = \"target/onceflow/{wasm}\""),
            &format!("component = \"{}\"", component.display()),
        );
    for (line, with) in replace {
        assert!(text.contains(line), "{manifest} has no {line:?}");
        text = text.replace(line, with);
    }
    let path = dir.join("onceflow.toml");
    std::fs::write(&path, text).expect("write the manifest");
    path
}

/// The pageviews manifest on the test's own topics (or a port's:
/// `common::example_port`).
fn pageviews_manifest(dir: &Path, name: &str, input: &str, counts: &str, dlq: &str) -> PathBuf {
    let example = crate::common::example_port("pageviews");
    manifest_on(
        dir,
        &format!("examples/{example}/onceflow.toml"),
        &format!("{example}.wasm"),
        &[
            (
                &format!("name = \"{example}\""),
                format!("name = \"{name}\""),
            ),
            ("tenant = \"demo\"", "tenant = \"test\"".to_owned()),
            (
                "inputs = [\"pageviews\"]",
                format!("inputs = [\"{input}\"]"),
            ),
            (
                "counts = \"pageview-counts\"",
                format!("counts = \"{counts}\""),
            ),
            (
                "dead-letter-topic = \"pageviews.dlq\"",
                format!("dead-letter-topic = \"{dlq}\""),
            ),
        ],
    )
}

/// A day ago, in ms: inside the topics' 7-day retention (judged by record
/// time) and never in the broker's future.
fn a_day_ago() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as i64;
    now - 24 * 3600 * 1000
}

/// Waits (up to 180 s) until `group` has committed all `total` records of
/// `input`; `log` says why not.
fn wait_consumed(
    cluster: &Cluster,
    group: &str,
    input: &str,
    total: usize,
    log: impl Fn() -> String,
) {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let (committed, end) = cluster.progress(group, input);
        if end == total as i64 && committed == end {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{group} did not finish: {committed} of {end}; log:\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn pageviews_exactly_once_with_kills_matches_kafka_streams() {
    let _serial = serial();
    let cluster = Cluster::shared();
    let id = unique();
    let name = format!("pageviews-{id}");
    let (input, counts, dlq, ks_counts) = (
        format!("pageviews-{id}"),
        format!("pageview-counts-{id}"),
        format!("pageviews-{id}.dlq"),
        format!("ks-pageview-counts-{id}"),
    );
    cluster.create_topics(&[(&input, 3), (&counts, 3), (&dlq, 1), (&ks_counts, 3)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = pageviews_manifest(dir.path(), &name, &input, &counts, &dlq);

    // A day ago, on a minute boundary.
    let base = a_day_ago();
    let base = base - base.rem_euclid(60_000);
    let all = views(3_000, 11, base);

    // Views arrive at about 600/s while the host runs; it is killed twice
    // while a transaction holding window counts is open.
    let probe = TxnProbe::new(cluster, &counts);
    let producer = plain_producer(cluster);
    let start = || Host::run(&manifest, &cluster.host_bootstrap, dir.path(), "a", &[]);
    let mut host = Some(start());
    let fed = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut kills = 0;
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for chunk in all.chunks(60) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                produce_views(&producer, &input, chunk);
                fed.fetch_add(chunk.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        let mut committed_at_kill = 0;
        for round in 1..=2 {
            // Past what was committed at the last kill (the killed host's
            // transaction stays open until the restarted one fences it).
            let deadline = Instant::now() + Duration::from_secs(120);
            while probe.committed_end() <= committed_at_kill + 10 || !probe.open() {
                assert!(
                    Instant::now() < deadline,
                    "no open transaction with counts (round {round}); log:\n{}",
                    host.as_ref().map(Host::log_text).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Some(h) = host.take() {
                h.kill();
            }
            kills += 1;
            committed_at_kill = probe.committed_end();
            println!(
                "FIGURE pageviews_kill_{round} fed {} counts_committed {}",
                fed.load(Ordering::Relaxed),
                probe.committed_end()
            );
            host = Some(start());
        }
        stop.store(true, Ordering::Relaxed);
    });
    let mut host = host.expect("restarted");
    let group = format!("test.{name}");
    let caught_up = |host: &Host, total: usize| {
        wait_consumed(cluster, &group, &input, total, || host.log_text());
    };

    // Then a restart whose first record in each partition is a late view:
    // only the stream time committed with the offsets tells it is late (a
    // task starting from no stream time would count it, and emit its
    // window a second time).
    let fed = fed.load(Ordering::Relaxed);
    let mut produced: Vec<(String, i64)> = all[..fed].to_vec();
    caught_up(&host, produced.len());
    assert!(host.stop().success(), "a clean stop");
    let mut stale = Vec::new();
    for p in 0..3 {
        let page = (0..)
            .map(|i| format!("/page-{i}"))
            .find(|page| onceflow::offline::kafka_partition(page.as_bytes(), 3) == p)
            .expect("a page of each partition");
        let time = produced
            .iter()
            .filter(|(q, _)| onceflow::offline::kafka_partition(q.as_bytes(), 3) == p)
            .map(|(_, at)| *at)
            .max()
            .expect("views in every partition");
        stale.push((page, time - 90_000));
    }
    produce_views(&producer, &input, &stale);
    produced.extend(stale);
    host = start();
    produce_views(&producer, &input, &all[fed..]);
    produced.extend_from_slice(&all[fed..]);
    caught_up(&host, produced.len());
    let (closed, late) = model(&produced, 3);
    let log = host.log_text();
    assert!(host.stop().success(), "a clean stop; log:\n{log}");
    assert!(
        !log.contains(" WARN ") && !log.contains(" ERROR "),
        "a healthy run logs no warnings:\n{log}"
    );

    let onceflow: Vec<Read> = read_committed(cluster, &counts);
    let mut ours = BTreeSet::new();
    for (partition, key, value, _) in &onceflow {
        let count = parse_count(value);
        assert_eq!(*key, count.0);
        assert!(
            ours.insert((*partition, count.clone())),
            "{count:?} emitted twice"
        );
    }
    let windows: BTreeSet<_> = ours.iter().map(|(_, c)| c.clone()).collect();
    assert!(
        windows == closed,
        "every closed window once, with its final count: emitted and not expected {:?}; \
         expected and not emitted {:?}",
        windows.difference(&closed).collect::<Vec<_>>(),
        closed.difference(&windows).collect::<Vec<_>>()
    );
    let mut dead = BTreeSet::new();
    for (_, key, _, error) in read_committed(cluster, &dlq) {
        let at = late_at(error.as_deref().expect("a dead letter's reason"));
        assert!(
            dead.insert((key.clone(), at)),
            "{key} at {at} dead-lettered twice"
        );
    }
    assert!(
        dead == late,
        "every late view dead-lettered once: dead-lettered and not late {:?}; late and not \
         dead-lettered {:?}",
        dead.difference(&late).collect::<Vec<_>>(),
        late.difference(&dead).collect::<Vec<_>>()
    );
    println!(
        "FIGURE pageviews_eos views {} windows {} late {} kills {kills} restarts {}",
        produced.len(),
        ours.len(),
        dead.len(),
        kills + 1
    );
    // Every transaction replays to its bytes: punctuations, windows, the
    // late views' dead letters, across the kills and restarts.
    let label = crate::common::example_port("pageviews");
    let replays = replay_everything(&cluster.bootstrap, &manifest, 3, Some(&dlq), &label);
    assert_eq!(
        replays.dead_letters,
        dead.len() as u64,
        "late views replayed"
    );

    // Kafka Streams on the same input.
    let state = dir.path().join("kstreams-state");
    let app = format!("ks-pageviews-{id}");
    let ks = KStreams::start(
        "KStreamsPageviews",
        &[
            &cluster.bootstrap,
            &app,
            &input,
            &ks_counts,
            "exactly_once_v2",
            "100",
            state.to_str().expect("utf-8 path"),
        ],
        &dir.path().join("kstreams.log"),
    );
    // Its output's offsets count transaction markers too: wait for the
    // records themselves.
    let ks_log = || std::fs::read_to_string(dir.path().join("kstreams.log")).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let read = read_committed(cluster, &ks_counts).len();
        if read >= closed.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Kafka Streams emitted {read} of {} windows; log:\n{}",
            closed.len(),
            ks_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Let a few more commits pass: nothing more may come.
    std::thread::sleep(Duration::from_secs(2));
    drop(ks);
    let mut theirs = BTreeSet::new();
    for (partition, _, value, _) in read_committed(cluster, &ks_counts) {
        let count = parse_count(&value);
        assert!(
            theirs.insert((partition, count.clone())),
            "Kafka Streams emitted {count:?} twice; log:\n{}",
            ks_log()
        );
    }
    assert!(
        theirs == ours,
        "Onceflow and Kafka Streams agree per partition, page and window: only Kafka Streams \
         {:?}; only Onceflow {:?}",
        theirs.difference(&ours).collect::<Vec<_>>(),
        ours.difference(&theirs).collect::<Vec<_>>()
    );
    println!(
        "FIGURE pageviews_vs_kafka_streams records {} equal {}",
        theirs.len(),
        theirs == ours
    );
}

/// The sessions test guest's manifest on the test's own topics.
fn sessions_manifest(dir: &Path, name: &str, input: &str, output: &str, dlq: &str) -> PathBuf {
    manifest_on(
        dir,
        "tests/guests/sessions/onceflow.toml",
        "sessions.wasm",
        &[
            ("name = \"sessions\"", format!("name = \"{name}\"")),
            ("inputs = [\"clicks\"]", format!("inputs = [\"{input}\"]")),
            (
                "sessions = \"sessions\"",
                format!("sessions = \"{output}\""),
            ),
            (
                "dead-letter-topic = \"clicks.dlq\"",
                format!("dead-letter-topic = \"{dlq}\""),
            ),
        ],
    )
}

/// A `<start> <end> <count>` session value.
fn parse_session(value: &str) -> (i64, i64, u64) {
    let parts: Vec<&str> = value.split(' ').collect();
    match parts[..] {
        [start, end, count] => (
            start.parse().expect("a start"),
            end.parse().expect("an end"),
            count.parse().expect("a count"),
        ),
        _ => panic!("not a session: {value:?}"),
    }
}

/// Issue 44: session windows beside Kafka Streams 4.4's
/// (`KStreamsSessions`: `SessionWindows.ofInactivityGapAndGrace(5 s, 10 s)`,
/// `count()`, `suppress(untilWindowCloses(unbounded()))`) on the same
/// clicks, boundary cases included (docs/time.md, "When a session is late,
/// and when it is final"). Onceflow's sessions must be the model's, each
/// once. Kafka Streams emits a session at `end + gap + grace` and again
/// each time a record that is not late makes it grow; with those earlier
/// emissions set aside (each is contained in a later one of its key), its
/// sessions must be Onceflow's exactly: the lateness rule is the same.
#[test]
fn sessions_match_kafka_streams_where_the_semantics_agree() {
    let _serial = serial();
    let cluster = Cluster::shared();
    let id = unique();
    let name = format!("sessions-{id}");
    let (input, output, dlq, ks_output) = (
        format!("clicks-{id}"),
        format!("sessions-{id}"),
        format!("clicks-{id}.dlq"),
        format!("ks-sessions-{id}"),
    );
    cluster.create_topics(&[(&input, 3), (&output, 3), (&dlq, 1)]);
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = sessions_manifest(dir.path(), &name, &input, &output, &dlq);

    let base = a_day_ago();
    let mut all = sessions::clicks(1_500, 5, base);
    // Last, a click an hour later in every partition: every session closes
    // in both.
    let last = all.iter().map(|(_, at)| *at).max().expect("clicks");
    for p in 0..3 {
        let user = (0..)
            .map(|i| format!("flush-{i}"))
            .find(|u| onceflow::offline::kafka_partition(u.as_bytes(), 3) == p)
            .expect("a user of each partition");
        all.push((user, last + 3_600_000));
    }
    let records: Vec<_> = all
        .iter()
        .map(|(user, at)| (input.clone(), user.clone(), Some(String::new()), *at))
        .collect();
    produce(&plain_producer(cluster), &records);
    let (model, late, _) = sessions::sessions_model(&all, 3);

    let host = Host::run(&manifest, &cluster.host_bootstrap, dir.path(), "a", &[]);
    let group = format!("test.{name}");
    wait_consumed(cluster, &group, &input, all.len(), || host.log_text());
    let log = host.log_text();
    assert!(host.stop().success(), "a clean stop; log:\n{log}");
    let mut ours = BTreeSet::new();
    for (_, key, value, _) in read_committed(cluster, &output) {
        let session = (key.clone(), parse_session(&value));
        assert!(ours.insert(session.clone()), "{session:?} emitted twice");
    }
    let expected: BTreeSet<_> = model
        .iter()
        .map(|(key, value)| (key.clone(), parse_session(value)))
        .collect();
    assert!(
        ours == expected,
        "Onceflow's sessions are the model's: only Onceflow {:?}; only the model {:?}",
        ours.difference(&expected).collect::<Vec<_>>(),
        expected.difference(&ours).collect::<Vec<_>>()
    );

    // Kafka Streams on the same input: with its record cache (the
    // default), then without (every update reaches suppress, as in
    // TopologyTestDriver).
    let edge = sessions::edge_at(base);
    for cache in ["cache", "no-cache"] {
        let ks_output = format!("{ks_output}-{cache}");
        cluster.create_topics(&[(&ks_output, 3)]);
        let state = dir.path().join(format!("kstreams-state-{cache}"));
        let app = format!("ks-sessions-{id}-{cache}");
        let log_path = dir.path().join(format!("kstreams-{cache}.log"));
        let ks = KStreams::start(
            "KStreamsSessions",
            &[
                &cluster.bootstrap,
                &app,
                &input,
                &ks_output,
                "exactly_once_v2",
                "100",
                state.to_str().expect("utf-8 path"),
                cache,
            ],
            &log_path,
        );
        let ks_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        wait_consumed(cluster, &app, &input, all.len(), ks_log);
        // Its last commit carried its last emissions.
        std::thread::sleep(Duration::from_secs(2));
        drop(ks);
        // Each partition's emissions in order; an emission is superseded by
        // a later one of its key that contains it (the session grew).
        let theirs: Vec<(String, (i64, i64, u64))> = read_committed(cluster, &ks_output)
            .into_iter()
            .map(|(_, key, value, _)| (key, parse_session(&value)))
            .collect();
        let mut kept = BTreeSet::new();
        let mut superseded = Vec::new();
        for (i, (key, session)) in theirs.iter().enumerate() {
            let (start, end, count) = *session;
            let grown = theirs[i + 1..]
                .iter()
                .any(|(k, (s, e, _))| k == key && *s <= start && *e >= end);
            if grown {
                superseded.push((key.clone(), *session));
            } else {
                assert!(
                    kept.insert((key.clone(), *session)),
                    "Kafka Streams ({cache}) emitted {key} {start} {end} {count} twice"
                );
            }
        }
        println!(
            "FIGURE sessions_vs_kafka_streams_{} clicks {} late {late} onceflow_sessions {} \
             kafka_streams_emissions {} of_which_superseded {} equal {}",
            cache.replace('-', "_"),
            all.len(),
            ours.len(),
            theirs.len(),
            superseded.len(),
            kept == ours
        );
        if cache == "no-cache" {
            // The boundary user's session, emitted at end + gap + grace
            // with 1 click, then 2, before it grew to its final 3.
            assert!(
                superseded.contains(&("edge".to_owned(), (edge, edge, 1)))
                    && superseded.contains(&("edge".to_owned(), (edge, edge + 5_000, 2))),
                "Kafka Streams emitted the boundary session before it grew (docs/time.md): \
                 {superseded:?}"
            );
        }
        assert!(
            kept == ours,
            "Onceflow and Kafka Streams ({cache}) agree on every final session: only Kafka \
             Streams {:?}; only Onceflow {:?}; log:\n{}",
            kept.difference(&ours).collect::<Vec<_>>(),
            ours.difference(&kept).collect::<Vec<_>>(),
            ks_log()
        );
    }
}
