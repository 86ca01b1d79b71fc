//! Helpers shared by the integration tests: paths, building guests with the
//! real `onceflow build`, and running the CLI; and, in the submodules, the
//! rig of the broker tests.

// Each test binary uses some of the helpers (this covers the submodules).
#![allow(dead_code)]

pub mod cluster;
pub mod dump_log;
pub mod fraud;
pub mod host_process;
pub mod kstreams;
pub mod pageviews;
pub mod pg;
pub mod proxy;
pub mod registry;
pub mod replay;
pub mod request_delay;
pub mod sessions;
pub mod txn_probe;
pub mod wallet;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// The `onceflow` binary the tests run: the one cargo built for them, or
/// `ONCEFLOW_TEST_BIN` when set (a frozen copy for `scripts/isolation`, or
/// an older build to show what a test found before a fix).
pub fn onceflow_bin() -> PathBuf {
    std::env::var_os("ONCEFLOW_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_onceflow")))
}

/// A command running [`onceflow_bin`].
pub fn onceflow() -> Command {
    let mut cmd = Command::new(onceflow_bin());
    cmd.env("ONCEFLOW_LOG", "warn");
    cmd
}

/// The example a broker test runs: `example` (`pageviews`, `fraud`), or
/// its port in the language `ONCEFLOW_TEST_PORT` names (`js`, `python`,
/// `go`, `c`: `examples/pageviews-js`), which `scripts/drill
/// --replay-ports` sets.
pub fn example_port(example: &str) -> String {
    match std::env::var("ONCEFLOW_TEST_PORT") {
        Ok(port) if !port.is_empty() => format!("{example}-{port}"),
        _ => example.to_owned(),
    }
}

/// Where guests are built: their own target directory, because `cargo test`
/// holds the lock of the host's.
fn guest_target_dir() -> PathBuf {
    std::env::var_os("ONCEFLOW_GUEST_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").expect("HOME is set");
            PathBuf::from(home).join(".cache/onceflow/guest-target")
        })
}

/// Builds the guest whose manifest is at `manifest` (relative to the repo)
/// with `onceflow build`, once per test process, and returns the manifest's
/// absolute path.
pub fn build_guest(manifest: &str) -> PathBuf {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    // One build at a time: cargo would serialise them on its lock anyway.
    let built = BUILT.get_or_init(Default::default);
    let mut built = built.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(manifest) {
        return p.clone();
    }
    let path = repo().join(manifest);
    let out = onceflow()
        .arg("build")
        .arg(&path)
        .env("CARGO_TARGET_DIR", guest_target_dir())
        .output()
        .expect("run onceflow build");
    assert!(
        out.status.success(),
        "onceflow build {manifest} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    built.insert(manifest.to_owned(), path.clone());
    path
}

/// Runs `onceflow test` on `manifest` with `input` (JSON Lines text) and
/// extra arguments.
pub fn offline_test(manifest: &Path, input: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("input.jsonl");
    std::fs::write(&file, input).expect("write input");
    onceflow()
        .arg("test")
        .arg(manifest)
        .arg("--input")
        .arg(&file)
        .args(extra)
        .output()
        .expect("run onceflow test")
}

/// Parses JSON Lines.
pub fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

/// One input line for `onceflow test`.
pub fn input_line(topic: &str, key: &str, value: &str) -> String {
    serde_json::json!({"topic": topic, "key": key, "value": value}).to_string()
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// CPU seconds (user and system, all threads) that process `pid` has used,
/// from `/proc/<pid>/stat`: what a test calibrates a load by, so that the
/// load costs the same share of any machine, faster or slower.
pub fn cpu_seconds(pid: u32) -> f64 {
    stat_cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// A memory figure (`VmHWM:`, `VmRSS:`) from a `/proc/<pid>/status` file
/// (`/proc/self/status` for this process), in bytes.
pub fn status_bytes(path: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("{path} has no {field}: {status}"))
        * 1024
}

/// CPU seconds (user and system) thread `tid` of process `pid` has used.
pub fn thread_cpu_seconds(pid: u32, tid: u32) -> f64 {
    stat_cpu_seconds(&format!("/proc/{pid}/task/{tid}/stat"))
}

/// As [`cpu_seconds`], or `None` once the process has gone (a database
/// backend may exit between a listing of `/proc` and the read).
pub fn cpu_seconds_if_running(pid: u32) -> Option<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).ok()?;
    Some(stat_text_cpu_seconds(&path, &stat))
}

fn stat_cpu_seconds(path: &str) -> f64 {
    let stat = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    stat_text_cpu_seconds(path, &stat)
}

fn stat_text_cpu_seconds(path: &str, stat: &str) -> f64 {
    // The fields after the command name (which may hold spaces) start at
    // the third, `state`; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> f64 {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{path} has no field {}: {stat}", i + 3))
    };
    // SAFETY: sysconf reads a constant of the running system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(11) + ticks(12)) / hz
}
