//! Hostile guests: each is stopped with a clear reason, handled by the error
//! policy, leaves no state behind, and the host keeps processing.

use std::sync::{Arc, Mutex};

use crate::common::{build_guest, onceflow};
use onceflow::manifest::{ErrorPolicy, Manifest};
use onceflow::offline::{OfflineRunner, RunOptions};
use onceflow::sandbox::log::{GuestLogLine, LogLabels, LogSink};
use onceflow::sandbox::{ProcessorPolicy, Sandbox, SandboxConfig};
use onceflow::task::{dead_letter_headers, processor_policy};
use onceflow::types::{Header, InputRecord, OutputRecord};

fn record(topic: &str, offset: i64, key: &str, value: &str) -> InputRecord {
    InputRecord {
        topic: topic.into(),
        partition: 0,
        offset,
        timestamp: 1_700_000_000_000 + offset,
        key: Some(key.as_bytes().to_vec()),
        value: Some(value.as_bytes().to_vec()),
        headers: vec![],
    }
}

fn error_of(o: &OutputRecord) -> Option<String> {
    o.headers
        .iter()
        .find(|h| h.key == dead_letter_headers::ERROR)
        .map(|h| String::from_utf8_lossy(&h.value).into_owned())
}

/// Loads a guest with its manifest switched to dead-letter (topic `dlq`), so
/// every failure's reason is visible in the outputs.
fn load(manifest: &str, fuel: bool) -> (Manifest, onceflow::sandbox::Processor) {
    load_edited(manifest, fuel, |_| {})
}

/// [`load`], with the manifest edited before the processor is loaded (its
/// limits and `[config]` are the processor's).
fn load_edited(
    manifest: &str,
    fuel: bool,
    edit: impl FnOnce(&mut Manifest),
) -> (Manifest, onceflow::sandbox::Processor) {
    let path = build_guest(manifest);
    let mut m = Manifest::load(&path).unwrap();
    m.errors = ErrorPolicy::DeadLetter {
        topic: "dlq".to_owned(),
    };
    if fuel {
        // Fuel is what must stop these guests: on a machine stalled past
        // the manifest's 2 s deadline, a fuel-bound loop would end
        // "exceeded the deadline" instead. A minute still ends a guest
        // that fuel failed to stop.
        m.limits.timeout_ms = 60_000;
    }
    edit(&mut m);
    let bytes = std::fs::read(m.component_path()).unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        fuel,
        ..SandboxConfig::default()
    })
    .unwrap();
    let processor = sandbox.load(&bytes, processor_policy(&m)).unwrap();
    (m, processor)
}

fn run(
    runner: &mut OfflineRunner,
    records: &[InputRecord],
    batch_size: usize,
) -> Vec<OutputRecord> {
    let mut outputs = Vec::new();
    runner
        .run(records, &RunOptions { batch_size }, |o| {
            outputs.push(o.clone());
            Ok(())
        })
        .expect("the run completes despite hostile records");
    outputs
}

#[test]
fn hostile_records_are_stopped_and_dead_lettered_and_the_rest_proceeds() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let values = [
        "ok1", "loop", "ok2", "alloc", "ok3", "panic", "ok4", "fail", "ok5", "stack", "ok6",
    ];
    let records: Vec<_> = values
        .iter()
        .enumerate()
        .map(|(i, v)| record("hostile-in", i as i64, &format!("k{i}"), v))
        .collect();
    // Whole batch in one call, then again one record per call: same result.
    for batch_size in [values.len(), 1] {
        let mut runner = OfflineRunner::new(processor.clone(), &manifest);
        let outputs = run(&mut runner, &records, batch_size);
        let summary: Vec<(String, String)> = outputs
            .iter()
            .map(|o| {
                let v = String::from_utf8_lossy(o.value.as_deref().unwrap()).into_owned();
                (o.topic.to_string(), v)
            })
            .collect();
        let expected: Vec<(String, String)> = values
            .iter()
            .map(|v| {
                let topic = if v.starts_with("ok") {
                    "hostile-out"
                } else {
                    "dlq"
                };
                (topic.to_owned(), (*v).to_owned())
            })
            .collect();
        assert_eq!(summary, expected, "batch size {batch_size}");
        // Outputs and dead letters carry their input record's timestamp.
        for o in &outputs {
            let input = records
                .iter()
                .find(|r| r.value == o.value)
                .expect("every output echoes an input");
            assert_eq!(o.timestamp, Some(input.timestamp), "{:?}", o.value);
        }

        let reasons: Vec<String> = outputs.iter().filter_map(error_of).collect();
        let want = [
            ("loop", "ran out of fuel"),
            ("alloc", "memory limit of 16 MiB exceeded"),
            ("panic", "hostile guest panicked on purpose"),
            ("fail", "hostile guest failed on purpose"),
            ("stack", "stack overflow"),
        ];
        for ((kind, needle), reason) in want.iter().zip(&reasons) {
            assert!(
                reason.contains(needle),
                "{kind}: {reason:?} lacks {needle:?}"
            );
        }
        // The failed calls' state writes were dropped: only the six good
        // records counted.
        let state = runner.dump_state().unwrap();
        let seen: Vec<_> = state
            .iter()
            .filter(|e| e.store == "seen")
            .map(|e| (e.key.clone(), e.value.clone()))
            .collect();
        assert_eq!(
            seen,
            vec![(b"count".to_vec(), b"6".to_vec())],
            "batch size {batch_size}"
        );
    }
}

#[test]
fn every_record_field_reaches_the_guest() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", false);
    let with_headers = |mut r: InputRecord| {
        r.partition = 3;
        r.headers = vec![
            Header {
                key: "trace".into(),
                value: b"t-1".to_vec(),
            },
            Header {
                key: "trace".into(),
                value: vec![0, 255],
            },
            Header {
                key: "empty".into(),
                value: vec![],
            },
        ];
        r
    };
    let mut null_key = record("hostile-in", 41, "", "plain");
    null_key.key = None;
    let records = [
        with_headers(record("hostile-in", 40, "k40", "meta")),
        with_headers(null_key),
    ];
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, 10);
    assert_eq!(outputs.len(), 2, "{outputs:?}");
    assert_eq!(
        String::from_utf8_lossy(outputs[0].value.as_deref().unwrap()),
        "hostile-in/3/40/1700000000040"
    );
    assert_eq!(outputs[0].key.as_deref(), Some(&b"k40"[..]));
    assert_eq!(outputs[1].key, None, "a null key stays null");
    assert_eq!(outputs[1].value.as_deref(), Some(&b"plain"[..]));
    for o in &outputs {
        assert_eq!(
            o.headers, records[0].headers,
            "headers in order, bytes intact"
        );
    }
}

#[test]
fn deadline_stops_a_loop_when_fuel_is_off() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", false);
    let records = [
        record("hostile-in", 0, "a", "loop"),
        record("hostile-in", 1, "b", "ok"),
    ];
    let mut runner = OfflineRunner::new(processor, &manifest);
    let started = std::time::Instant::now();
    let outputs = run(&mut runner, &records, 10);
    let reason = error_of(&outputs[0]).expect("the loop is dead-lettered");
    assert!(
        reason.contains("exceeded the deadline of 2000 ms"),
        "{reason}"
    );
    assert_eq!(outputs[1].value.as_deref(), Some(&b"ok"[..]));
    // The deadline stopped it (the reason says so), once in the batch and
    // once alone: this bound only guards against a hang, since the epoch
    // ticker itself runs late on a busy machine.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "the loop ran {:?}",
        started.elapsed()
    );
}

#[derive(Default)]
struct Collect(Mutex<Vec<String>>);
impl LogSink for Collect {
    fn line(&self, _: &LogLabels, line: &GuestLogLine) {
        self.0.lock().unwrap().push(line.message.clone());
    }
    fn dropped(&self, _: &LogLabels, _: u64) {}
}

#[test]
fn wasi_guest_gets_no_network_no_files_no_env_and_deterministic_time_and_randomness() {
    let (manifest, processor) = load("tests/guests/wasi-probe/onceflow.toml", true);
    let logs = Arc::new(Collect::default());
    let processor = processor.with_log_sink(logs.clone());

    // A real listener: if the sandbox leaked, the guest would connect here.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();

    let probes = [
        "tcp", "udp", "dns", "file", "dir", "env", "clock", "random", "stdout",
    ];
    let records: Vec<_> = probes
        .iter()
        .enumerate()
        .map(|(i, p)| record("probe-in", i as i64, &port, p))
        .collect();
    let mut runner = OfflineRunner::new(processor.clone(), &manifest);
    let outputs = run(&mut runner, &records, 100);
    let result = |probe: &str| -> String {
        let i = probes.iter().position(|p| *p == probe).unwrap();
        let o = &outputs[i];
        assert_eq!(&*o.topic, "probe-out", "{probe}: {:?}", error_of(o));
        String::from_utf8_lossy(o.value.as_deref().unwrap()).into_owned()
    };

    assert!(
        listener.accept().is_err(),
        "no connection reached the listener"
    );
    for probe in ["tcp", "udp", "dns", "file"] {
        let r = result(probe).to_lowercase();
        assert!(
            r.contains("denied")
                || r.contains("not permitted")
                || r.contains("no such file")
                || r.contains("not supported")
                || r.contains("unsupported")
                || r.contains("error"),
            "{probe} must fail: {r}"
        );
        assert!(!r.starts_with("ok"), "{probe} must fail: {r}");
    }
    assert!(!result("file").contains("root:"), "no file content leaks");
    assert_eq!(result("env"), "env=0 args=0");
    // The wall clock is the record's timestamp, not the host's time.
    let clock_offset = probes.iter().position(|p| *p == "clock").unwrap() as i64;
    assert_eq!(
        result("clock"),
        (1_700_000_000_000 + clock_offset).to_string()
    );
    assert!(
        logs.0
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("probe stdout")),
        "stdout is captured into the log"
    );

    // Randomness depends only on the record: the same record gives the same
    // bytes in a new instance; another offset gives other bytes.
    let random = result("random");
    let again = run(
        &mut OfflineRunner::new(processor.clone(), &manifest),
        &[record("probe-in", 7, &port, "random")],
        1,
    );
    assert_eq!(
        String::from_utf8_lossy(again[0].value.as_deref().unwrap()),
        random
    );
    let other = run(
        &mut OfflineRunner::new(processor, &manifest),
        &[record("probe-in", 8, &port, "random")],
        1,
    );
    assert_ne!(
        String::from_utf8_lossy(other[0].value.as_deref().unwrap()),
        random
    );
}

#[test]
fn components_importing_wasi_http_are_refused_before_running() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("http.wasm");
    let bytes = wat::parse_str(
        r#"(component
            (import "wasi:http/outgoing-handler@0.2.0" (instance))
            (core module $m (func (export "process")))
        )"#,
    )
    .unwrap();
    std::fs::write(&wasm, &bytes).unwrap();
    let out = onceflow().arg("validate").arg(&wasm).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("REFUSED  wasi:http/outgoing-handler@0.2.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("verdict:   refused: import `wasi:http/outgoing-handler@0.2.0` is refused"),
        "{stdout}"
    );

    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let err = sandbox
        .load(&bytes, ProcessorPolicy::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("never links wasi:http"), "{err}");
}

#[test]
fn validate_accepts_the_wallet_and_lists_its_imports() {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    let out = onceflow()
        .args(["validate", "--output", "json"])
        .arg(&manifest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["accepted"], true);
    let imports: Vec<&str> = v["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(!imports.is_empty());
    assert!(
        imports.iter().all(|i| i.starts_with("onceflow:processor/")),
        "a Rust guest imports no WASI: {imports:?}"
    );
    assert!(
        v["exports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e == "process")
    );
}

#[test]
fn a_looping_record_burns_one_records_fuel_not_the_batchs() {
    use onceflow::state::MemoryPartition;
    use onceflow::task::{BatchOutcome, Task, TaskConfig};
    let (m, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let per_record = m.limits.fuel_per_record;
    let k = 20;
    let batch: Vec<InputRecord> = (0..k)
        .map(|i| record("hostile-in", i, "k", "loop"))
        .collect();
    let mut task = Task::new(
        0,
        processor,
        TaskConfig::from_manifest(&m),
        Box::new(MemoryPartition::default()),
    );
    let mut outcome = BatchOutcome::default();
    task.process_batch(&batch, &mut outcome)
        .expect("every looping record is dead-lettered");
    assert_eq!(outcome.dead_lettered, k as u64);
    let burned = task.take_fuel_used();
    // Each looping record runs out twice (in its batch, then alone to be
    // named poison): ~2 x its own budget. Charged per batch it would be
    // ~k^2/2 budgets (the first record would burn all k).
    assert!(
        burned <= 2 * k as u64 * per_record + per_record,
        "burned {burned} fuel for {k} looping records of {per_record} each"
    );
    assert!(
        burned >= k as u64 * per_record,
        "burned {burned}: fuel is not being counted"
    );
}

/// A guest that calls `begin-record` for the same record in a loop gets no
/// more fuel: it runs out of its budget. Before, every call refilled the
/// fuel, and only the call's deadline (here 60 s; up to 10 minutes) stopped
/// it.
#[test]
fn begin_record_in_a_loop_does_not_refuel() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let records = [
        record("hostile-in", 0, "a", "refuel"),
        record("hostile-in", 1, "b", "ok"),
    ];
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, 10);
    let reason = error_of(&outputs[0]).expect("the refueling loop is dead-lettered");
    assert!(reason.contains("ran out of fuel"), "{reason}");
    assert_eq!(outputs[1].value.as_deref(), Some(&b"ok"[..]));
}

/// One record emitting 100 outputs of ~1 MB (ignoring the refusals): the
/// host stops buffering at its per-call limit and the record goes to the
/// error policy, naming the limit; the next record is processed. Before,
/// all 100 MB were buffered and committed.
#[test]
fn a_record_cannot_fill_the_hosts_memory_with_outputs() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let records = [
        record("hostile-in", 0, "a", "flood:100"),
        record("hostile-in", 1, "b", "ok"),
    ];
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, 10);
    let summary: Vec<(&str, usize)> = outputs
        .iter()
        .map(|o| (&*o.topic, o.value.as_ref().map_or(0, Vec::len)))
        .collect();
    assert_eq!(summary, [("dlq", 9), ("hostile-out", 2)], "{summary:?}");
    let reason = error_of(&outputs[0]).expect("a reason");
    assert!(reason.contains("limit of 64 MiB"), "{reason}");
}

/// Deletes count against a call's 64 MiB as puts do (issue 45): the host
/// holds each deleted key until the commit, whether or not it existed.
/// Before, one record deleting 1,500 absent 1 MiB keys took the host to
/// 2.9 GB; here 100 of them (100 MiB) are refused past 64 MiB and the
/// record goes to the dead letters, the next one proceeds.
#[test]
fn a_record_cannot_fill_the_hosts_memory_with_deletes() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let records = [
        record("hostile-in", 0, "a", "forgets:100"),
        record("hostile-in", 1, "b", "ok"),
    ];
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, 10);
    let topics: Vec<&str> = outputs.iter().map(|o| &*o.topic).collect();
    assert_eq!(topics, ["dlq", "hostile-out"], "{topics:?}");
    let reason = error_of(&outputs[0]).expect("a reason");
    assert!(reason.contains("limit of 64 MiB"), "{reason}");
}

/// A failed call's records are run again (around the failing one) on a
/// fresh instance: memory that saw them once (a guest's globals) never sees
/// them twice. Here the calls fail on writes the host refused (past a call's
/// 64 MiB), which the guest ignored, so the host isolates the record in
/// calls of [0..=2], [0], [1, 2], [1] and [2]: records 0 and 1 run three
/// times each and still count 1. Before 2026-12-01 the instance of a failed
/// call was kept, and the re-run records counted on.
#[test]
fn records_run_again_after_a_failed_call_meet_a_fresh_instance() {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let records: Vec<_> = ["global", "global", "flood:100", "global"]
        .iter()
        .enumerate()
        .map(|(i, v)| record("hostile-in", i as i64, &format!("k{i}"), v))
        .collect();
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, 4);
    let counts: Vec<String> = outputs
        .iter()
        .filter(|o| &*o.topic != "dlq")
        .map(|o| String::from_utf8_lossy(o.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    assert_eq!(counts, ["1", "1", "1"], "{outputs:?}");
    let dead: Vec<&[u8]> = outputs
        .iter()
        .filter(|o| &*o.topic == "dlq")
        .filter_map(|o| o.key.as_deref())
        .collect();
    assert_eq!(dead, [&b"k2"[..]], "{outputs:?}");
}

/// The values of `records_before_a_failing_one_are_not_run_again`: a record
/// the processor rejects (`fail`, index 2) and one that traps (`panic`, 5)
/// among records that count in the instance's memory (`global`).
const REJECT_THEN_TRAP: [&str; 7] = [
    "global", "global", "fail", "global", "global", "panic", "global",
];

fn run_counting(batch_size: usize) -> (Vec<String>, Vec<Vec<u8>>, u64) {
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let records: Vec<_> = REJECT_THEN_TRAP
        .iter()
        .enumerate()
        .map(|(i, v)| record("hostile-in", i as i64, &format!("k{i}"), v))
        .collect();
    let mut runner = OfflineRunner::new(processor, &manifest);
    let mut outputs = Vec::new();
    let summary = runner
        .run(&records, &RunOptions { batch_size }, |o| {
            outputs.push(o.clone());
            Ok(())
        })
        .expect("the run completes");
    let counts = outputs
        .iter()
        .filter(|o| error_of(o).is_none())
        .map(|o| String::from_utf8_lossy(o.value.as_deref().unwrap_or_default()).into_owned())
        .collect();
    let dead = outputs
        .iter()
        .filter(|o| error_of(o).is_some())
        .filter_map(|o| o.key.clone())
        .collect();
    (counts, dead, summary.calls)
}

/// A failing record costs the guest one call more, not a second run of the
/// records before it: their effects stand, the failing record's are taken
/// back, and the records after it go on in a call of their own. After a
/// record the processor rejected (returned an error for) that call runs on
/// the same instance, as after a record that succeeded; after a trap, on a
/// fresh one (a trap may leave memory torn mid-record), and the trapping
/// record first gets a call alone (the trap may have been the whole call's).
#[test]
fn records_before_a_failing_one_are_not_run_again() {
    let (counts, dead, calls) = run_counting(7);
    // The count goes on after the rejected record and restarts after the
    // trap. Before 2026-12-03 it restarted after both: 1, 2, 1, 2, 1.
    assert_eq!(counts, ["1", "2", "3", "4", "1"]);
    assert_eq!(dead, [b"k2".to_vec(), b"k5".to_vec()]);
    // [0..=6] fails on 2 (rejected: dead-lettered as it stands), [3..=6]
    // traps on 5, [5] alone traps again, [6]. Before: 7 calls, records 0, 1,
    // 3 and 4 each run twice.
    assert_eq!(calls, 4);
}

/// What a guest keeps in memory across records does not depend on how the
/// host batched them, around a rejected record (kept instance, whether it
/// is first in its call or not) and a trapped one (fresh instance).
#[test]
fn memory_after_a_failing_record_is_the_same_whatever_the_batching() {
    let (counts, dead, _) = run_counting(7);
    for batch_size in [1, 2, 3, 4, 5, 6] {
        let (c, d, _) = run_counting(batch_size);
        assert_eq!((&c, &d), (&counts, &dead), "batch size {batch_size}");
    }
}

#[test]
fn state_past_limits_state_mb_is_refused_and_deletes_make_room() {
    let (mut manifest, processor) = load("tests/guests/hostile/onceflow.toml", true);
    manifest.limits.state_mb = 1;
    let keep = "keep:300000";
    // Three values of ~300 kB fit in 1 MiB; the fourth does not, until a
    // delete makes room.
    let records = vec![
        record("hostile-in", 0, "k0", keep),
        record("hostile-in", 1, "k1", keep),
        record("hostile-in", 2, "k2", keep),
        record("hostile-in", 3, "k3", keep),
        record("hostile-in", 4, "k0", "forget"),
        record("hostile-in", 5, "k3", keep),
    ];
    for batch_size in [records.len(), 1] {
        let mut runner = OfflineRunner::new(processor.clone(), &manifest);
        let outputs = run(&mut runner, &records, batch_size);
        let reasons: Vec<String> = outputs.iter().filter_map(error_of).collect();
        assert_eq!(reasons.len(), 1, "one dead letter: {reasons:?}");
        assert!(
            reasons[0].contains("would exceed limits.state-mb (1 MiB)")
                && reasons[0].contains("delete keys"),
            "{}",
            reasons[0]
        );
        let dead = outputs
            .iter()
            .find(|o| error_of(o).is_some())
            .expect("a dead letter");
        assert_eq!(dead.key.as_deref(), Some(&b"k3"[..]), "the fourth put");
        let state = runner.dump_state().unwrap();
        let keys: Vec<&[u8]> = state
            .iter()
            .filter(|e| e.store == "seen")
            .map(|e| e.key.as_slice())
            .collect();
        assert_eq!(
            keys,
            vec![&b"k1"[..], b"k2", b"k3"],
            "batch size {batch_size}"
        );
    }
}

/// Counts a guest's log lines (those containing `needle`) and the lines the
/// rate limit dropped.
struct CountLines {
    needle: &'static str,
    lines: std::sync::atomic::AtomicU64,
    dropped: std::sync::atomic::AtomicU64,
}

impl LogSink for CountLines {
    fn line(&self, _: &LogLabels, line: &GuestLogLine) {
        if line.message.contains(self.needle) {
            self.lines
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    fn dropped(&self, _: &LogLabels, count: u64) {
        self.dropped
            .fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Issue 45: a guest that logs a flood and then traps gets a fresh instance,
/// and had a fresh rate limit with it: at 40 lines/s a tenant wrote ~3,500
/// lines/s into its log topic. The limit belongs to the task now, so it holds
/// across the instances a trap throws away. Here 20 records log 50 lines
/// each, each followed by a trapping record, at 5 lines/s: before, every
/// instance got its own 5 (100 lines in well under a second).
#[test]
fn the_log_rate_limit_holds_across_traps() {
    use std::sync::atomic::Ordering::Relaxed;
    const PER_SECOND: u32 = 5;
    const PAIRS: usize = 20;
    let (manifest, processor) = load_edited("tests/guests/hostile/onceflow.toml", true, |m| {
        m.limits.log_lines_per_second = PER_SECOND;
    });
    let sink = Arc::new(CountLines {
        needle: "hostile log line",
        lines: Default::default(),
        dropped: Default::default(),
    });
    let processor = processor.with_log_sink(sink.clone());
    let records: Vec<_> = (0..PAIRS)
        .flat_map(|i| ["logs:50", "panic"].map(|v| (i, v)))
        .enumerate()
        .map(|(n, (i, v))| record("hostile-in", n as i64, &format!("k{i}"), v))
        .collect();
    let started = std::time::Instant::now();
    let mut runner = OfflineRunner::new(processor, &manifest);
    let outputs = run(&mut runner, &records, records.len());
    drop(runner);
    let elapsed = started.elapsed();
    assert_eq!(
        outputs.iter().filter(|o| error_of(o).is_some()).count(),
        PAIRS,
        "every panic is dead-lettered"
    );
    let (lines, dropped) = (sink.lines.load(Relaxed), sink.dropped.load(Relaxed));
    // The limiter's window is one second: in `elapsed` it lets through at
    // most PER_SECOND lines per started second.
    let bound = u64::from(PER_SECOND) * (elapsed.as_secs() + 1);
    println!(
        "FIGURE log_lines_across_traps {lines} lines delivered in {:.1} ms at a limit of \
         {PER_SECOND}/s (at most {bound}); {dropped} dropped",
        elapsed.as_secs_f64() * 1e3,
    );
    assert!(
        lines <= bound,
        "{lines} lines in {elapsed:?} at {PER_SECOND}/s (at most {bound}): the rate limit \
         restarted with each new instance"
    );
    // The dropped lines are counted, not lost (the count also holds the
    // panic messages the SDK logs, which the sink does not count as lines).
    assert!(
        lines + dropped >= 50 * PAIRS as u64,
        "{lines} delivered + {dropped} dropped of {} lines",
        50 * PAIRS
    );
}

/// Issue 45: `late-record` messages had no size cap: a guest limited to
/// 64 MiB made the host hold 64 messages of 20 MB for one call (1.40 GB).
/// They are cut like log lines now (8 KiB, saying so). Here 64 records each
/// report themselves late with a 1 MB message in one call: before, the host
/// held 64 MB of messages after it.
#[test]
fn late_record_messages_are_capped_like_log_lines() {
    use onceflow::types::{Effects, NoEffects};
    const RECORDS: usize = 64;
    const MESSAGE: usize = 1_000_000;
    let (_, processor) = load("tests/guests/hostile/onceflow.toml", true);
    let mut guest = processor.instantiate(0).expect("the hostile guest starts");
    let batch: Vec<_> = (0..RECORDS)
        .map(|i| record("hostile-in", i as i64, "k", &format!("late:{MESSAGE}")))
        .collect();
    let times = vec![None; RECORDS];
    let mut effects: Box<dyn Effects> = Box::new(NoEffects);
    guest
        .process(&batch, &times, &mut effects)
        .expect("reporting late records is no failure");
    let late = guest.take_late();
    assert_eq!(late.len(), RECORDS, "one report per record");
    let held: usize = late.iter().map(|(_, m)| m.len()).sum();
    println!(
        "FIGURE late_record_bytes_held {held} bytes for {RECORDS} messages of {MESSAGE} bytes"
    );
    for (_, message) in &late {
        assert!(
            message.len() <= 8 * 1024 + 64,
            "a late-record message of {} bytes was kept whole",
            message.len()
        );
        assert!(
            message.ends_with("(cut at 8192 bytes)"),
            "a cut message says so: …{:?}",
            &message[message.len().saturating_sub(40)..]
        );
    }
    assert!(held <= RECORDS * (8 * 1024 + 64), "{held} bytes held");
}

/// A task for partition 0 of the hostile guest over memory stores.
fn hostile_task(m: &Manifest, processor: onceflow::sandbox::Processor) -> onceflow::task::Task {
    use onceflow::state::MemoryPartition;
    use onceflow::task::{Task, TaskConfig};
    Task::new(
        0,
        processor,
        TaskConfig::from_manifest(m),
        Box::new(MemoryPartition::default()),
    )
}

/// Issue 45: fuel spent in `init` was never billed, and each trap re-runs
/// `init` on a fresh instance: 10 trapping records cost 50.5 s of CPU and
/// were billed 133,651 fuel. Now every instance's init is billed, the
/// re-runs after traps included. Here init burns `BURN` iterations (at least
/// one unit of fuel each) and 10 records trap: before, the task billed only
/// the records' own fuel.
#[test]
fn init_fuel_is_billed_and_a_trap_does_not_buy_a_free_rerun() {
    use onceflow::task::BatchOutcome;
    const BURN: u64 = 2_000_000;
    const RECORDS: i64 = 10;
    let (m, processor) = load_edited("tests/guests/hostile/onceflow.toml", true, |m| {
        m.config.push(("burn-init".to_owned(), BURN.to_string()));
    });
    let billed = |value: &str| -> u64 {
        let mut task = hostile_task(&m, processor.clone());
        let batch: Vec<_> = (0..RECORDS)
            .map(|i| record("hostile-in", i, &format!("k{i}"), value))
            .collect();
        let mut outcome = BatchOutcome::default();
        task.process_batch(&batch, &mut outcome)
            .expect("the batch completes");
        task.take_fuel_used()
    };
    let trapping = billed("panic");
    let normal = billed("ok");
    println!(
        "FIGURE init_fuel_billed {RECORDS} trapping records: {trapping} fuel; \
         {RECORDS} normal records: {normal} fuel (init burns >= {BURN} per instance)"
    );
    assert!(
        normal >= BURN,
        "{normal} fuel billed for {RECORDS} records and one init of >= {BURN}: init is not billed"
    );
    // Each trapping record meets a fresh instance at least once: its init is
    // billed each time.
    assert!(
        trapping >= RECORDS as u64 * BURN,
        "{trapping} fuel billed for {RECORDS} traps, each followed by an init of >= {BURN}: \
         the re-run inits were free"
    );
}

/// `init` has its own fuel limit (`sandbox::INIT_FUEL`), not a 1000-record
/// batch's: an init that never ends is stopped there, says which limit it
/// hit, and what it burned is billed. Before, the hostile guest's init got
/// 1000 x 5 M = 5 G fuel, its error named the per-record limit, and none of
/// it was billed.
#[test]
fn an_endless_init_is_stopped_at_inits_own_limit_and_billed() {
    use onceflow::sandbox::INIT_FUEL;
    use onceflow::task::BatchOutcome;
    let (m, processor) = load_edited("tests/guests/hostile/onceflow.toml", true, |m| {
        m.config
            .push(("burn-init".to_owned(), u64::MAX.to_string()));
    });
    let mut task = hostile_task(&m, processor);
    let started = std::time::Instant::now();
    let err = task
        .process_batch(
            &[record("hostile-in", 0, "k", "ok")],
            &mut BatchOutcome::default(),
        )
        .expect_err("init never ends");
    let billed = task.take_fuel_used();
    println!(
        "FIGURE endless_init {billed} fuel billed in {:.2} s: {err}",
        started.elapsed().as_secs_f64()
    );
    let message = err.to_string();
    assert!(
        message.contains("init ran out of fuel") && message.contains(&INIT_FUEL.to_string()),
        "{message}"
    );
    assert!(
        (INIT_FUEL..=INIT_FUEL + 1_000_000).contains(&billed),
        "billed {billed} for an init stopped at {INIT_FUEL}"
    );
}

/// The calling thread's CPU time.
fn thread_cpu() -> std::time::Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A thread's CPU time from `/proc/self/task/<tid>/stat` (utime + stime,
/// in clock ticks), readable from another thread.
fn task_cpu(tid: i32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

/// Issue 45: a tenant's CPU share was charged after each call, so one
/// long call ran at full speed before its first wait: at `cpu-share = 10`
/// on 2 cores, calls of 64 records each took 1.20 cores (the cap: 0.20).
/// Now the call's CPU is charged at every epoch tick while it runs, and
/// the call is parked there while the share is spent. A sampler reads the
/// calling thread's CPU time every 20 ms; in no half-second window of the
/// call may it take more than its share, plus the budget's burst. The call
/// is sized by what its records cost on this machine (about 0.75 s of CPU),
/// and the bound is in CPU time, so it holds on any machine.
#[test]
fn a_long_call_is_held_to_its_tenants_cpu_share_while_it_runs() {
    use onceflow::stream::cpu::{BURST, CpuBudget};
    use onceflow::task::BatchOutcome;
    use std::time::{Duration, Instant};
    const RATE: f64 = 0.25;
    const WINDOW: f64 = 0.5;
    const ITERATIONS: u64 = 20_000_000;
    let (m, processor) = load_edited("tests/guests/hostile/onceflow.toml", false, |m| {
        m.limits.timeout_ms = 600_000;
        m.processing.max_batch_records = 100_000;
    });
    let burn = |offset: i64| record("hostile-in", offset, "k", &format!("burn:{ITERATIONS}"));
    // What one record costs here, unthrottled (the instance's init first).
    let mut free = hostile_task(&m, processor.clone());
    free.process_batch(&[burn(0)], &mut BatchOutcome::default())
        .expect("a burn record");
    let started = thread_cpu();
    free.process_batch(&[burn(1), burn(2)], &mut BatchOutcome::default())
        .expect("burn records");
    let per_record = (thread_cpu() - started).as_secs_f64() / 2.0;
    let n = ((0.75 / per_record).ceil() as i64).clamp(2, 100_000);

    let budget = Arc::new(CpuBudget::new(Some(RATE)));
    let mut task = hostile_task(&m, processor.with_cpu_meter(budget));
    task.process_batch(&[burn(0)], &mut BatchOutcome::default())
        .expect("a burn record");
    task.take_parked();
    let batch: Vec<InputRecord> = (1..=n).map(burn).collect();
    // SAFETY: gettid has no memory effects.
    let tid = unsafe { libc::gettid() };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut samples = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(cpu) = task_cpu(tid) {
                    samples.push((Instant::now(), cpu));
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            samples
        })
    };
    let wall0 = Instant::now();
    let mut outcome = BatchOutcome::default();
    let called = task.process_batch(&batch, &mut outcome);
    let wall = wall0.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.join().expect("the sampler");
    called.expect("one call of burn records");
    assert_eq!(outcome.outputs.len() as i64, n, "every record burnt");
    let parked = task.take_parked().as_secs_f64();
    // The most CPU the call took in any window of WINDOW seconds.
    let mut busiest: f64 = 0.0;
    for (i, (at, cpu)) in samples.iter().enumerate() {
        if let Some((_, later)) = samples[i..]
            .iter()
            .find(|(t, _)| t.duration_since(*at).as_secs_f64() >= WINDOW)
        {
            busiest = busiest.max(later - cpu);
        }
    }
    let busiest_rate = busiest / WINDOW;
    println!(
        "FIGURE cpu_share_in_call records {n} ({:.2} ms each) in {wall:.2} s, parked {parked:.2} s; \
         busiest {WINDOW} s window: {busiest_rate:.2} of a core at a share of {RATE}",
        per_record * 1e3,
    );
    assert!(
        samples.len() >= 10 && wall >= 2.0 * WINDOW,
        "too few samples ({}) in {wall:.2} s to judge",
        samples.len()
    );
    // The share, the burst the budget may save up, and a clock tick (the
    // stat file counts in 10 ms ticks) at each end of the window.
    let allowed = RATE + (RATE * BURST.as_secs_f64() + 0.04) / WINDOW;
    assert!(
        busiest_rate <= allowed,
        "the call took {busiest_rate:.2} of a core in its busiest {WINDOW} s, over its share of \
         {RATE} (at most {allowed:.2}): the share is not charged while the call runs"
    );
}

/// Issue 45, item 3: a batch given a room in bytes stops after the call
/// that fills it, its records before that finished and the rest not begun
/// (the worker commits, then hands it the rest): 200 records of 100 KB
/// outputs, in calls of 64, against a room of 10 MB. Nothing is lost or
/// done twice, and stream time stops at the last record finished.
#[test]
fn a_batch_stops_after_the_call_that_fills_its_room() {
    use onceflow::state::MemoryPartition;
    use onceflow::task::{BatchOutcome, Task, TaskConfig};
    let (manifest, processor) = load("tests/guests/hostile/onceflow.toml", false);
    let mut task = Task::new(
        0,
        processor,
        TaskConfig::from_manifest(&manifest),
        Box::new(MemoryPartition::default()),
    );
    let records: Vec<InputRecord> = (0..200)
        .map(|i| record("hostile-in", i, &format!("k{i}"), "output:100000"))
        .collect();
    let mut first = BatchOutcome {
        room: Some(10_000_000),
        ..BatchOutcome::default()
    };
    task.process_batch(&records, &mut first)
        .expect("first part");
    // The first call (64 records, 6.4 MB) leaves room; the second fills it.
    assert!(first.full, "stopped early");
    assert_eq!(first.done, 128, "two calls of 64 finished");
    assert_eq!(first.outputs.len(), 128);
    assert_eq!(
        first.output_bytes,
        first.outputs.iter().map(|o| o.size() as u64).sum::<u64>()
    );
    assert_eq!(task.stream_time(), Some(records[127].timestamp));
    let mut rest = BatchOutcome {
        room: Some(10_000_000),
        ..BatchOutcome::default()
    };
    task.process_batch(&records[first.done..], &mut rest)
        .expect("the rest");
    assert!(!rest.full);
    assert_eq!(rest.done, 72);
    let keys: Vec<Vec<u8>> = first
        .outputs
        .iter()
        .chain(&rest.outputs)
        .map(|o| o.key.clone().unwrap_or_default())
        .collect();
    let expected: Vec<Vec<u8>> = (0..200).map(|i| format!("k{i}").into_bytes()).collect();
    assert_eq!(keys, expected, "every record's output once, in order");
    assert_eq!(task.stream_time(), Some(records[199].timestamp));
}

/// Issue 45, item 4: a tenant whose batches are one record each is held to
/// its share too, the host's work around each call included: records fed
/// one batch at a time for 2 s of wall time at a share of 0.25 take at most
/// the share of this thread's CPU (plus the budget's burst), measured in
/// CPU time so that it holds on any machine.
#[test]
fn one_record_batches_are_held_to_their_tenants_share() {
    use onceflow::stream::cpu::{BURST, CpuBudget};
    use onceflow::task::BatchOutcome;
    use std::time::{Duration, Instant};
    const RATE: f64 = 0.25;
    let (m, processor) = load_edited("tests/guests/hostile/onceflow.toml", false, |m| {
        m.limits.timeout_ms = 600_000;
    });
    let burn = |offset: i64| record("hostile-in", offset, "k", "burn:200000");
    let budget = Arc::new(CpuBudget::new(Some(RATE)));
    let mut task = hostile_task(&m, processor.with_cpu_meter(budget));
    task.process_batch(&[burn(0)], &mut BatchOutcome::default())
        .expect("a burn record");
    task.take_parked();
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    let mut n = 1;
    let mut charged = Duration::ZERO;
    while wall0.elapsed() < Duration::from_secs(2) {
        let called = Instant::now();
        task.process_batch(&[burn(n)], &mut BatchOutcome::default())
            .expect("a burn record");
        charged += called.elapsed().saturating_sub(task.take_parked());
        n += 1;
    }
    let wall = wall0.elapsed().as_secs_f64();
    let cpu = (thread_cpu() - cpu0).as_secs_f64() / wall;
    let accounted = charged.as_secs_f64() / wall;
    println!(
        "FIGURE cpu_share_one_record_batches {n} batches in {wall:.2} s: {cpu:.3} of a core (CPU \
         time), {accounted:.3} accounted, at a share of {RATE}"
    );
    let allowed = RATE + RATE * BURST.as_secs_f64() / wall + 0.01;
    assert!(
        cpu <= allowed,
        "one-record batches took {cpu:.3} of a core at a share of {RATE} (at most {allowed:.3})"
    );
}
