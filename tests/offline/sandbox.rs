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
