//! Processors in other languages: the wallet, pageviews and fraud examples
//! written in JavaScript, Python, Go and C, built with `onceflow build`, must
//! print byte-for-byte what the Rust ones print under `onceflow test`
//! (outputs and dead letters; for pageviews also the final window store),
//! every SDK's session windows must count sessions as the Rust SDK's and an
//! independent model do (and store them alike), and the language runtimes'
//! WASI imports must give them no network and no files.
//!
//! Needs the toolchains `onceflow build` installs into the toolchain cache
//! (`scripts/setup` installs them ahead: node/npm, python3-venv, Go 1.24+,
//! clang + wasi-libc, `wit-bindgen`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::sessions::{BASE, clicks, edge_at, sessions_model};
use crate::common::{self, build_guest, onceflow, repo};

const WALLETS: [&str; 4] = [
    "examples/wallet-js/onceflow.toml",
    "examples/wallet-python/onceflow.toml",
    "examples/wallet-go/onceflow.toml",
    "examples/wallet-c/onceflow.toml",
];

const PAGEVIEWS: [&str; 4] = [
    "examples/pageviews-js/onceflow.toml",
    "examples/pageviews-python/onceflow.toml",
    "examples/pageviews-go/onceflow.toml",
    "examples/pageviews-c/onceflow.toml",
];

const FRAUDS: [&str; 4] = [
    "examples/fraud-js/onceflow.toml",
    "examples/fraud-python/onceflow.toml",
    "examples/fraud-go/onceflow.toml",
    "examples/fraud-c/onceflow.toml",
];

/// The session-counting test guest in every language, Rust first.
const SESSIONS: [&str; 5] = [
    "tests/guests/sessions/onceflow.toml",
    "tests/guests/sessions-js/onceflow.toml",
    "tests/guests/sessions-python/onceflow.toml",
    "tests/guests/sessions-go/onceflow.toml",
    "tests/guests/sessions-c/onceflow.toml",
];

/// A copy of `manifest` in `dir` with an absolute component path and,
/// for `big`, the raised limits every wallet (Rust included) needs for
/// 1 MiB payments.
fn manifest_copy(manifest: &Path, dir: &Path, big: bool) -> PathBuf {
    let text = std::fs::read_to_string(manifest).expect("read the manifest");
    let base = manifest.parent().expect("the manifest has a directory");
    let lines: Vec<String> = text
        .lines()
        .map(|line| {
            let key = line.split('=').next().unwrap_or("").trim();
            match key {
                "component" => {
                    let relative = line
                        .split('"')
                        .nth(1)
                        .expect("component = \"...\" in the manifest");
                    format!("component = \"{}\"", base.join(relative).display())
                }
                "source" => String::new(),
                "fuel-per-record" if big => "fuel-per-record = 200000000".to_owned(),
                "memory-mb" if big => "memory-mb = 128".to_owned(),
                _ => line.to_owned(),
            }
        })
        .collect();
    let name = base
        .file_name()
        .expect("a directory name")
        .to_string_lossy();
    let path = dir.join(format!("{name}{}.toml", if big { "-big" } else { "" }));
    std::fs::write(&path, lines.join("\n")).expect("write the manifest copy");
    path
}

/// The input `script` (a generator under examples/, see the wallet's and
/// the pageviews' gen_input.py) writes with `args`.
fn generated_input(script: &str, dir: &Path, name: &str, args: &[&str]) -> PathBuf {
    let script = repo().join(script);
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .output()
        .expect("run gen_input.py (needs python3)");
    assert!(
        out.status.success(),
        "gen_input.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join(name);
    std::fs::write(&path, &out.stdout).expect("write the input");
    path
}

const WALLET_INPUT: &str = "examples/wallet-js/conformance/gen_input.py";
const PAGEVIEWS_INPUT: &str = "examples/pageviews-js/conformance/gen_input.py";
const FRAUD_INPUT: &str = "examples/fraud-js/conformance/gen_input.py";

fn run_test(manifest: &Path, input: &Path, batch: &str, partitions: &str) -> Vec<u8> {
    run_test_with(
        manifest,
        input,
        &["--batch-size", batch, "--partitions", partitions],
    )
}

fn run_test_with(manifest: &Path, input: &Path, args: &[&str]) -> Vec<u8> {
    let out = onceflow()
        .arg("test")
        .arg(manifest)
        .arg("--input")
        .arg(input)
        .args(args)
        .output()
        .expect("run onceflow test");
    assert!(
        out.status.success(),
        "onceflow test {} failed: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

#[test]
fn every_wallet_prints_exactly_what_the_rust_wallet_prints() {
    let reference = build_guest("examples/wallet/onceflow.toml");
    let wallets: Vec<PathBuf> = WALLETS.iter().map(|m| build_guest(m)).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let sample = repo().join("examples/wallet/sample.jsonl");
    let mixed = generated_input(
        WALLET_INPUT,
        dir.path(),
        "mixed.jsonl",
        &["--lines", "2000", "--seed", "1"],
    );
    let big = generated_input(
        WALLET_INPUT,
        dir.path(),
        "big.jsonl",
        &["--lines", "300", "--seed", "7", "--big"],
    );
    // (input, whether its records are big, its (batch size, partitions) runs)
    type Case<'a> = (&'a Path, bool, &'a [(&'a str, &'a str)]);
    let cases: [Case<'_>; 3] = [
        (&sample, false, &[("100", "1"), ("1", "1")]),
        (&mixed, false, &[("100", "1"), ("7", "3"), ("1", "1")]),
        (&big, true, &[("7", "3")]),
    ];
    let mut compared = 0;
    for (input, big, runs) in cases {
        let expected_manifest = manifest_copy(&reference, dir.path(), big);
        for (batch, partitions) in runs {
            let expected = run_test(&expected_manifest, input, batch, partitions);
            let lines = expected.iter().filter(|b| **b == b'\n').count();
            assert!(lines > 0, "the reference printed nothing");
            for wallet in &wallets {
                let manifest = manifest_copy(wallet, dir.path(), big);
                let actual = run_test(&manifest, input, batch, partitions);
                let label = format!(
                    "{} on {} (batch {batch}, {partitions} partitions)",
                    wallet.display(),
                    input.file_name().unwrap_or_default().to_string_lossy()
                );
                assert_identical(&expected, &actual, &label, "the Rust wallet's");
                eprintln!("identical: {label}, {lines} lines");
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 6 * WALLETS.len());
}

/// Panics with the first differing line unless `actual == expected`.
fn assert_identical(expected: &[u8], actual: &[u8], label: &str, reference: &str) {
    if actual == expected {
        return;
    }
    let first_difference = String::from_utf8_lossy(expected)
        .lines()
        .zip(String::from_utf8_lossy(actual).lines())
        .enumerate()
        .find(|(_, (e, a))| e != a)
        .map(|(i, (e, a))| {
            format!(
                "line {i}:\n  rust: {}\n  this: {}",
                e.chars().take(300).collect::<String>(),
                a.chars().take(300).collect::<String>()
            )
        })
        .unwrap_or_else(|| "one output is a prefix of the other".to_owned());
    panic!("{label}: output differs from {reference}\n{first_difference}");
}

/// The JS glue `onceflow build` writes (host/src/build/js_glue.mjs):
/// Uint8Arrays of both realms, empty and absent keys and values, plain
/// arrays and headers (the generated functions), arguments larger than the
/// fast paths' reused area, the records the export glue lifts (every field,
/// headers, no key), and every error a fast path decodes, each with the
/// SDK's message. expected.jsonl is what the unmodified componentize-js glue
/// printed for the same input, in batches of 1 and of 100 alike.
#[test]
fn js_import_glue_passes_every_argument_and_error_as_the_generated_glue_did() {
    let manifest = build_guest("tests/guests/glue-js/onceflow.toml");
    let dir = repo().join("tests/guests/glue-js");
    let expected = std::fs::read(dir.join("expected.jsonl")).expect("read expected.jsonl");
    for batch in ["1", "100"] {
        let actual = run_test(&manifest, &dir.join("input.jsonl"), batch, "1");
        assert_identical(
            &expected,
            &actual,
            &format!("glue-js, batch {batch}"),
            "expected.jsonl",
        );
    }
}

/// The JS glue's argument area is taken afresh in every export call and left
/// to ComponentizeJS, which frees what its `realloc` gave when the call
/// returns; so are arguments past the area's 64 KiB. 1,000 calls that each
/// put 10 KB and 70 KB must then run in 16 MiB: were either kept from call
/// to call, they would need ~80 MB, and the records past the limit would
/// fail (dead letters, which `onceflow test` prints).
#[test]
fn js_glue_argument_areas_do_not_outlive_their_export_call() {
    let manifest = build_guest("tests/guests/glue-js/onceflow.toml");
    let dir = tempfile::tempdir().expect("temp dir");
    let component = repo().join("tests/guests/glue-js/target/onceflow/glue-js.wasm");
    let text = std::fs::read_to_string(&manifest).expect("read the glue-js manifest");
    let small: String = text
        .lines()
        .filter(|l| !l.starts_with("source "))
        .map(|l| {
            if l.starts_with("memory-mb ") {
                "memory-mb = 16".to_owned()
            } else if l.starts_with("component ") {
                format!("component = \"{}\"", component.display())
            } else {
                l.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(small.contains("memory-mb = 16") && small.contains(&component.display().to_string()));
    let small_manifest = dir.path().join("onceflow.toml");
    std::fs::write(&small_manifest, small).expect("write the manifest");
    let input = dir.path().join("area.jsonl");
    let lines: String = (0..1000)
        .map(|i| format!("{{\"topic\":\"commands\",\"key\":\"k{i}\",\"value\":\"area\"}}\n"))
        .collect();
    std::fs::write(&input, lines).expect("write the input");
    let out = run_test(&small_manifest, &input, "1", "1");
    assert!(
        out.is_empty(),
        "records failed under 16 MiB (memory kept from one export call to the next?): {}",
        String::from_utf8_lossy(&out[..out.len().min(600)])
    );
}

#[test]
fn every_pageviews_prints_exactly_what_the_rust_pageviews_prints() {
    let reference = build_guest("examples/pageviews/onceflow.toml");
    let ports: Vec<PathBuf> = PAGEVIEWS.iter().map(|m| build_guest(m)).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let sample = repo().join("examples/pageviews/sample.jsonl");
    // 3000 views of ~300 pages: out of order, late, no key, keys that are
    // not UTF-8 or need escaping, negative timestamps, a burst of 300 pages
    // in one window (more than one `fetch-all` page closes at once), a jump
    // that closes everything.
    let views = generated_input(
        PAGEVIEWS_INPUT,
        dir.path(),
        "views.jsonl",
        &["--lines", "3000", "--seed", "1"],
    );
    let cases: [(&Path, &[(&str, &str)]); 2] = [
        (&sample, &[("100", "1"), ("1", "1")]),
        (&views, &[("100", "1"), ("1", "3"), ("7", "3")]),
    ];
    let expected_manifest = manifest_copy(&reference, dir.path(), false);
    let mut compared = 0;
    for (input, runs) in cases {
        for (batch, partitions) in runs {
            // The outputs, then every window left in the store.
            let args = [
                "--batch-size",
                batch,
                "--partitions",
                partitions,
                "--dump-state",
            ];
            let expected = run_test_with(&expected_manifest, input, &args);
            let text = String::from_utf8_lossy(&expected);
            assert!(
                text.contains("\"topic\":\"pageview-counts\"")
                    && (input == sample.as_path() || text.contains("late record: ")),
                "the reference emitted no counts (or no late view):\n{text}"
            );
            for port in &ports {
                let manifest = manifest_copy(port, dir.path(), false);
                let actual = run_test_with(&manifest, input, &args);
                let label = format!(
                    "{} on {} (batch {batch}, {partitions} partitions)",
                    port.display(),
                    input.file_name().unwrap_or_default().to_string_lossy()
                );
                assert_identical(&expected, &actual, &label, "the Rust pageviews'");
                eprintln!("identical: {label}, {} lines", text.lines().count());
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 5 * PAGEVIEWS.len());
}

#[test]
fn every_fraud_prints_exactly_what_the_rust_fraud_prints() {
    let reference = build_guest("examples/fraud/onceflow.toml");
    let ports: Vec<PathBuf> = FRAUDS.iter().map(|m| build_guest(m)).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let sample = repo().join("examples/fraud/sample.jsonl");
    // 2000 account updates and payments: tombstones, blocked accounts and
    // limits of every shape, unknown accounts, payments without a key or a
    // value or with keys that are not UTF-8, invalid JSON of every kind
    // serde_json names (its message and position are in the dead letter),
    // missing fields, amounts that are not i64 integers, ids and names that
    // need escaping, randomly mutated payments and account values.
    let generated = generated_input(
        FRAUD_INPUT,
        dir.path(),
        "fraud.jsonl",
        &["--lines", "2000", "--seed", "1"],
    );
    let expected_manifest = manifest_copy(&reference, dir.path(), false);
    let mut compared = 0;
    for input in [&sample, &generated] {
        for (batch, partitions) in [("1", "1"), ("1", "3"), ("64", "1"), ("64", "3")] {
            let expected = run_test(&expected_manifest, input, batch, partitions);
            let text = String::from_utf8_lossy(&expected);
            assert!(
                text.contains("\"topic\":\"alerts\"")
                    && text.contains("record value is not the expected JSON: ")
                    && (input == &sample
                        || (text.contains("its table value is not JSON: ")
                            && text.contains("must be an integer")
                            && text.contains("record key is not UTF-8 text"))),
                "the reference raised no alert or dead letter of some kind:\n{text}"
            );
            for port in &ports {
                let manifest = manifest_copy(port, dir.path(), false);
                let actual = run_test(&manifest, input, batch, partitions);
                let label = format!(
                    "{} on {} (batch {batch}, {partitions} partitions)",
                    port.display(),
                    input.file_name().unwrap_or_default().to_string_lossy()
                );
                assert_identical(&expected, &actual, &label, "the Rust fraud's");
                eprintln!("identical: {label}, {} lines", text.lines().count());
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 8 * FRAUDS.len());
}

/// `onceflow test --dump-state` in batches of `batch` over `partitions`:
/// stdout, and how many late records the run's summary says it dropped.
fn run_sessions(manifest: &Path, input: &Path, batch: &str, partitions: &str) -> (Vec<u8>, usize) {
    let out = onceflow()
        .arg("test")
        .arg(manifest)
        .arg("--input")
        .arg(input)
        .args([
            "--batch-size",
            batch,
            "--partitions",
            partitions,
            "--dump-state",
        ])
        .output()
        .expect("run onceflow test");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "onceflow test {}: {stderr}",
        manifest.display()
    );
    let dropped = stderr
        .lines()
        .find_map(|l| l.strip_suffix(" late records dropped"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    (out.stdout, dropped)
}

#[test]
fn every_sdk_counts_sessions_as_the_rust_sdk_and_a_model_do() {
    use base64::Engine as _;
    let guests: Vec<PathBuf> = SESSIONS.iter().map(|m| build_guest(m)).collect();
    let dir = tempfile::tempdir().expect("temp dir");
    let clicks = clicks(1_500, 3, BASE);
    let input = dir.path().join("clicks.jsonl");
    let lines: Vec<String> = clicks
        .iter()
        .map(|(user, at)| {
            serde_json::json!({"topic": "clicks", "key": user, "value": "", "timestamp": at})
                .to_string()
        })
        .collect();
    std::fs::write(&input, lines.join("\n")).expect("write the clicks");
    let manifests: Vec<PathBuf> = guests
        .iter()
        .map(|g| manifest_copy(g, dir.path(), false))
        .collect();
    let mut compared = 0;
    for partitions in [1, 3] {
        let (emitted, late, left) = sessions_model(&clicks, partitions);
        // The boundary user's session grew after the point where Kafka
        // Streams' suppress would have emitted it, and is emitted once.
        let edge: Vec<&String> = emitted
            .iter()
            .filter(|(k, _)| k == "edge")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            edge.first().map(|v| v.as_str()),
            Some(format!("{} {} 3", edge_at(BASE), edge_at(BASE) + 10_000).as_str()),
            "the boundary sessions: {edge:?}"
        );
        assert!(
            emitted.len() > 500 && late > 10 && !left.is_empty(),
            "{} sessions, {late} late, {} open",
            emitted.len(),
            left.len()
        );
        let parts = partitions.to_string();
        for batch in ["1", "64"] {
            // The Rust guest against the model.
            let (expected, dropped) = run_sessions(&manifests[0], &input, batch, &parts);
            let label = format!("batch {batch}, {partitions} partitions");
            let mut got_emitted = Vec::new();
            let mut got_left = BTreeSet::new();
            for line in common::json_lines(&expected) {
                let key = line["key"].as_str().expect("a UTF-8 key").to_owned();
                if line["topic"] == "sessions" {
                    got_emitted.push((key, line["value"].as_str().expect("a value").to_owned()));
                    continue;
                }
                // A session left in the store: its end (8 bytes, big-endian),
                // then the count in decimal.
                assert_eq!(line["store"], "sessions", "{line}");
                let value = match line["value"].as_str() {
                    Some(text) => text.as_bytes().to_vec(),
                    None => base64::engine::general_purpose::STANDARD
                        .decode(line["value_base64"].as_str().expect("a value"))
                        .expect("base64"),
                };
                let (end, count) = value.split_at(8);
                got_left.insert((
                    line["partition"].as_i64().expect("partition") as i32,
                    key,
                    line["start"].as_i64().expect("start"),
                    i64::from_be_bytes(end.try_into().expect("8 bytes")),
                    std::str::from_utf8(count)
                        .expect("text")
                        .parse()
                        .expect("a count"),
                ));
            }
            assert_eq!(got_emitted, emitted, "emitted sessions ({label})");
            assert_eq!(dropped, late, "late clicks dropped ({label})");
            assert_eq!(got_left, left, "sessions left open ({label})");
            // Every other SDK: the same bytes, outputs and store.
            for (guest, manifest) in guests.iter().zip(&manifests).skip(1) {
                let (actual, dropped) = run_sessions(manifest, &input, batch, &parts);
                let label = format!("{} ({label})", guest.display());
                assert_identical(&expected, &actual, &label, "the Rust SDK's");
                assert_eq!(dropped, late, "late clicks dropped by {label}");
                eprintln!("identical: {label}, {} sessions", emitted.len());
                compared += 1;
            }
        }
    }
    assert_eq!(compared, 4 * (SESSIONS.len() - 1));
}

/// The imports of a built component.
fn imports_of(manifest: &Path) -> Vec<String> {
    let m = onceflow::manifest::Manifest::load(manifest).expect("load the manifest");
    let bytes = std::fs::read(m.component_path()).expect("read the component");
    onceflow::sandbox::policy::inspect(&bytes)
        .expect("inspect the component")
        .imports
}

#[test]
fn language_runtimes_import_only_what_the_sandbox_grants() {
    for manifest in WALLETS {
        let path = build_guest(manifest);
        let imports = imports_of(&path);
        let wasi: Vec<&String> = imports.iter().filter(|i| i.starts_with("wasi:")).collect();
        eprintln!("{manifest}: {} WASI imports: {wasi:?}", wasi.len());
        // What each runtime brings (docs/languages.md lists them).
        match manifest {
            // ComponentizeJS with every engine feature disabled: no WASI.
            "examples/wallet-js/onceflow.toml" => assert!(wasi.is_empty(), "{wasi:?}"),
            // CPython: sockets and files among 25 interfaces.
            "examples/wallet-python/onceflow.toml" => {
                assert!(wasi.iter().any(|i| i.starts_with("wasi:sockets/tcp@")));
                assert!(wasi.iter().any(|i| i.starts_with("wasi:filesystem/")));
            }
            // Go and C through the preview1 adapter: no sockets.
            _ => assert!(
                !wasi.iter().any(|i| i.starts_with("wasi:sockets/")),
                "{wasi:?}"
            ),
        }
        assert!(
            !imports.iter().any(|i| i.starts_with("wasi:http/")),
            "{imports:?}"
        );
        let out = onceflow()
            .arg("validate")
            .arg(&path)
            .output()
            .expect("run onceflow validate");
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("accepted"),
            "{manifest}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs the probe guest `manifest` (see tests/guests/wasi-probe) and
/// returns probe name -> result, with a real listener on 127.0.0.1 that no
/// connection may reach.
fn probe(manifest: &str) -> std::collections::HashMap<String, String> {
    let path = build_guest(manifest);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a listener");
    listener.set_nonblocking(true).expect("non-blocking");
    let port = listener
        .local_addr()
        .expect("local address")
        .port()
        .to_string();
    let probes = ["tcp", "udp", "dns", "file", "dir", "env", "random"];
    let input: Vec<String> = probes
        .iter()
        .map(|p| common::input_line("probe-in", &port, p))
        .collect();
    let out = common::offline_test(&path, &input.join("\n"), &[]);
    assert!(
        out.status.success(),
        "{manifest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        listener.accept().is_err(),
        "{manifest}: a connection reached the listener"
    );
    common::json_lines(&out.stdout)
        .into_iter()
        .map(|line| {
            assert_eq!(line["topic"], "probe-out", "{line}");
            (
                line["key"].as_str().unwrap_or_default().to_owned(),
                line["value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn assert_failed(manifest: &str, probe: &str, result: &str) {
    if probe == "dir" {
        // "/: <result>; .: <result>"
        for part in result.split("; ") {
            let listing = part.split_once(": ").map_or(part, |(_, r)| r);
            assert_failed(manifest, "a listing", listing);
        }
        return;
    }
    let r = result.to_lowercase();
    assert!(
        r.starts_with("error:")
            && (r.contains("denied")
                || r.contains("not permitted")
                || r.contains("no such file")
                || r.contains("bad file")
                || r.contains("capabilities insufficient")
                || r.contains("refused")
                || r.contains("reset")
                || r.contains("non-recoverable")),
        "{manifest}: {probe} must fail: {result}"
    );
}

#[test]
fn python_runtime_reaches_no_network_and_no_file() {
    let manifest = "tests/guests/wasi-probe-python/onceflow.toml";
    let results = probe(manifest);
    // CPython really calls wasi:sockets and wasi:filesystem: refused.
    for name in ["tcp", "udp", "dns", "file", "dir"] {
        assert_failed(manifest, name, &results[name]);
    }
    assert!(results["tcp"].contains("Permission denied"), "{results:?}");
    assert_eq!(results["env"], "env=0 args=0");
}

#[test]
fn go_runtime_reaches_no_network_and_no_file() {
    let manifest = "tests/guests/wasi-probe-go/onceflow.toml";
    let results = probe(manifest);
    // Go's wasip1 net package is an in-process simulation (preview1 has no
    // sockets; the component imports none): a connection to the real
    // listener is refused, a name lookup fails, and the UDP socket it
    // "binds" exists only inside the instance.
    for name in ["tcp", "dns", "file", "dir"] {
        assert_failed(manifest, name, &results[name]);
    }
    assert!(!results["file"].contains("root:"), "{results:?}");
    assert_eq!(results["env"], "env=0 args=0");
    let imports = imports_of(&build_guest(manifest));
    assert!(
        !imports.iter().any(|i| i.starts_with("wasi:sockets/")),
        "{imports:?}"
    );
}

/// Inputs of format `json` or `avro` reach a processor as JSON text; every
/// interpreted or garbage-collected language's SDK reads it in one call
/// (`valueJson`, `value_json`, `ValueJSON`: docs/languages.md, "JSON
/// values"), with one message when it is not JSON. The guests are the ones
/// the tests above build anyway.
#[test]
fn every_sdk_reads_a_json_value_in_one_call() {
    let value = r#"{"a":{"c":null,"d":[true,false]},"b":[1,2.5,"x"],"n":-7}"#;
    for (manifest, input, output) in [
        ("tests/guests/glue-js/onceflow.toml", "commands", "out"),
        (
            "tests/guests/wasi-probe-python/onceflow.toml",
            "probe-in",
            "probe-out",
        ),
        (
            "tests/guests/wasi-probe-go/onceflow.toml",
            "probe-in",
            "probe-out",
        ),
    ] {
        let path = build_guest(manifest);
        let lines = [
            common::input_line(input, "k", value),
            common::input_line(input, "k", "not json"),
        ];
        let out = common::offline_test(&path, &lines.join("\n"), &[]);
        assert!(
            out.status.success(),
            "{manifest}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let got: Vec<String> = common::json_lines(&out.stdout)
            .iter()
            .map(|l| {
                assert_eq!(l["topic"], output, "{manifest}: {l}");
                assert_eq!(l["key"], "json", "{manifest}: {l}");
                l["value"].as_str().unwrap_or_default().to_owned()
            })
            .collect();
        assert_eq!(got.len(), 2, "{manifest}: {got:?}");
        assert_eq!(got[0], value, "{manifest}: the same object, keys in order");
        assert!(
            got[1].starts_with("error: record value is not the expected JSON: "),
            "{manifest}: {}",
            got[1]
        );
    }
}

#[test]
fn init_scaffolds_a_processor_in_every_language_and_a_rust_one_builds_anywhere() {
    // Every language's scaffold is built, tested and deployed by the doc
    // runner (docs/languages.md, scripts/doc-test); here: init itself, and
    // a Rust project far from any checkout, which builds with the SDK
    // init wrote into it (before: a path into the checkout the binary was
    // built from).
    let dir = tempfile::tempdir().expect("temp dir");
    for language in ["rust", "js", "ts", "python", "go", "c"] {
        let project = dir.path().join(format!("{language}-counter"));
        let out = onceflow()
            .arg("init")
            .arg(&project)
            .args(["--lang", language, "--tenant", "acme"])
            .output()
            .expect("run onceflow init");
        assert!(
            out.status.success(),
            "init {language}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let manifest = std::fs::read_to_string(project.join("onceflow.toml")).expect("manifest");
        assert!(
            manifest.contains(&format!("language = \"{language}\""))
                && manifest.contains(r#"tenant = "acme""#)
                && manifest.contains(r#"inputs = ["acme.events"]"#),
            "{manifest}"
        );
        // A second init into the same directory is refused.
        let again = onceflow()
            .arg("init")
            .arg(&project)
            .args(["--lang", language])
            .output()
            .expect("run onceflow init");
        assert!(
            !again.status.success(),
            "init {language} overwrote a project"
        );
    }
    let project = dir.path().join("rust-counter");
    let cargo = std::fs::read_to_string(project.join("Cargo.toml")).expect("Cargo.toml");
    assert!(
        !cargo.contains(&repo().display().to_string()),
        "the scaffold points into the checkout: {cargo}"
    );
    let built = build_guest(project.join("onceflow.toml").to_str().expect("utf-8 path"));
    // The defaults of `onceflow test`.
    let stdout = run_test(&built, &project.join("sample.jsonl"), "100", "1");
    let stdout = String::from_utf8_lossy(&stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            r#"{"topic":"acme.counts","key":"a","value":"1"}"#,
            r#"{"topic":"acme.counts","key":"b","value":"1"}"#,
            r#"{"topic":"acme.counts","key":"a","value":"2"}"#,
            r#"{"topic":"acme.events.dlq","key":null,"value":"no key: dead-lettered","error":"record has no key"}"#,
        ]
    );
}

#[test]
fn c_runtime_reaches_no_file() {
    let manifest = "tests/guests/wasi-probe-c/onceflow.toml";
    let path = build_guest(manifest);
    let input: Vec<String> = ["file", "dir", "env", "clock"]
        .iter()
        .map(|p| {
            serde_json::json!({"topic": "probe-in", "key": "0", "value": p, "timestamp": 1_700_000_000_123i64})
                .to_string()
        })
        .collect();
    let out = common::offline_test(&path, &input.join("\n"), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let results: std::collections::HashMap<String, String> = common::json_lines(&out.stdout)
        .into_iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap_or_default().to_owned(),
                l["value"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    // wasi-libc through the preview1 adapter: no preopened directory.
    assert_failed(manifest, "file", &results["file"]);
    assert_failed(manifest, "dir", &results["dir"]);
    assert_eq!(results["env"], "env=0 args=0");
    // The wall clock reads the record's timestamp.
    assert_eq!(results["clock"], "1700000000123");
    let imports = imports_of(&path);
    assert!(
        !imports.iter().any(|i| i.starts_with("wasi:sockets/")),
        "{imports:?}"
    );
}
