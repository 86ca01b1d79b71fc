//! The control plane on a real Kafka: `onceflow host` processes with the
//! admin API, driven through the `onceflow` CLI as a user would.
//!
//! - deploy -> produce -> exact output with 2 hosts, one SIGKILLed mid-run,
//!   and a host started after the deployment taking its share;
//! - an upgrade under load with exact output; a bad version leaves the old
//!   one running;
//! - tenant isolation (topics, list, describe, logs, query, metrics) and
//!   bad manifests, components and tokens refused with the named reason;
//! - hostile neighbours beside a victim (its latency reported as figures);
//! - the Python wallet (an ~18 MiB component) deployed through the fleet;
//! - hosts on a cluster that never saw Onceflow (and before its brokers are
//!   up) wait for the control topics instead of exiting;
//! - a second host with a live host's id is refused; so is a deployment
//!   whose changelog topics would be another's;
//! - the admin API over HTTPS with `--ca-cert`, a token rotated and
//!   `tenants.toml` re-read without a restart;
//! - a tenant's uploads held to its `artifact-mb` quota, and the unused
//!   ones collected.
//!
//! Figures are printed as `FIGURE name value` lines (run with --nocapture).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::cluster::{Cluster, serial};
use crate::common::wallet::{Produced, Wallet, assert_exact};
use crate::common::{self, build_guest, onceflow, repo};
use serde_json::Value;

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("FIGURE {name} {value}");
}

pub(crate) const ACME: &str = "acme-token-1";
const GLOBEX: &str = "globex-token-2";
pub(crate) const OPERATOR: &str = "operator-token-3";
const INITECH: &str = "initech-token-4";
const DENSE: &str = "dense-token-5";
/// Deployments in CI's density round ([`q_a_short_density_round`]).
const DENSITY_ROUND: usize = 10;

/// The control-plane tests' own single-node cluster.
#[path = "isolation.rs"]
mod isolation;

/// Formats with a real schema registry, through the fleet.
#[path = "formats.rs"]
mod formats;

fn cluster() -> &'static Cluster {
    static C: std::sync::OnceLock<Cluster> = std::sync::OnceLock::new();
    C.get_or_init(|| Cluster::start("control", 19392, 1))
}

/// A tenants file and a place for hosts' state and logs.
pub(crate) struct Fleet {
    dir: tempfile::TempDir,
    tenants: PathBuf,
}

/// `tenants.toml` for the control-plane tests, acme's `token-sha256`
/// given as TOML (one digest in quotes, or a list while rotating).
fn tenants_toml(acme_digests: &str) -> String {
    tenants_toml_with(acme_digests, 100)
}

/// As [`tenants_toml`], with globex's `cpu-share`.
fn tenants_toml_with(acme_digests: &str, globex_cpu_share: u32) -> String {
    let hash = onceflow::fleet::tenancy::hash_token;
    format!(
        r#"
[operator]
token-sha256 = "{}"

[[tenant]]
name = "acme"
token-sha256 = {acme_digests}
[tenant.quotas]
deployments = 3
worker-threads = 4
memory-mb = 128
fuel-per-record = 50000000

[[tenant]]
name = "globex"
token-sha256 = "{}"
[tenant.quotas]
deployments = 3
worker-threads = 4
memory-mb = 64
fuel-per-record = 50000000
cpu-share = {globex_cpu_share}

[[tenant]]
name = "dense"
token-sha256 = "{}"
[tenant.quotas]
deployments = {DENSITY_ROUND}
worker-threads = {DENSITY_ROUND}
guest-memory-mb = 4096

[[tenant]]
name = "initech"
token-sha256 = "{}"
[tenant.quotas]
deployments = 2
artifact-mb = 4
"#,
        hash(OPERATOR),
        hash(GLOBEX),
        hash(DENSE),
        hash(INITECH)
    )
}

impl Fleet {
    pub(crate) fn new() -> Fleet {
        let dir = tempfile::tempdir().expect("temp dir");
        let tenants = dir.path().join("tenants.toml");
        let acme = format!("\"{}\"", onceflow::fleet::tenancy::hash_token(ACME));
        std::fs::write(&tenants, tenants_toml(&acme)).expect("write tenants.toml");
        Fleet { dir, tenants }
    }

    /// Replaces `tenants.toml` whole, as an operator's editor or a config
    /// tool does (a new file renamed over it): a write in place could be
    /// read half-written by the host's poller, which then logs "cannot be
    /// used" and keeps the old tenants a while longer.
    fn write_tenants(&self, text: &str) {
        let next = self.dir.path().join("tenants.toml.next");
        std::fs::write(&next, text).expect("write tenants.toml.next");
        std::fs::rename(&next, &self.tenants).expect("rename over tenants.toml");
    }

    fn start_host(&self, name: &str) -> HostProc {
        let mut host = self.spawn_host(name, &cluster().bootstrap, &["--host-id", name]);
        host.wait_healthy(name, Duration::from_secs(90));
        host
    }

    /// Starts `onceflow host` on `bootstrap` with its state in
    /// `state-<label>` and its log in `<label>.log`, without waiting for it.
    pub(crate) fn spawn_host(&self, label: &str, bootstrap: &str, extra: &[&str]) -> HostProc {
        self.spawn_host_tls(label, bootstrap, extra, None)
    }

    /// As [`Fleet::spawn_host`], serving HTTPS with `tls` when given.
    fn spawn_host_tls(
        &self,
        label: &str,
        bootstrap: &str,
        extra: &[&str],
        tls: Option<&TestTls>,
    ) -> HostProc {
        let port = free_port();
        let log = self.dir.path().join(format!("{label}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = Command::new(crate::common::onceflow_bin())
            .arg("host")
            .args(["--bootstrap-servers", bootstrap])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tenants")
            .arg(&self.tenants)
            .arg("--state-dir")
            .arg(self.dir.path().join(format!("state-{label}")))
            .args(if extra.contains(&"--session-timeout-ms") {
                &[][..]
            } else {
                &["--session-timeout-ms", "6000"][..]
            })
            .args(["--report-interval-ms", "1000"])
            .args(tls.map_or(Vec::new(), |t| {
                vec![
                    "--tls-cert".to_owned(),
                    path(&t.cert).to_owned(),
                    "--tls-key".to_owned(),
                    path(&t.key).to_owned(),
                ]
            }))
            .args(extra)
            .env("ONCEFLOW_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start onceflow host");
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut client = reqwest::blocking::Client::builder();
        if let Some(t) = tls {
            let pem = std::fs::read(&t.ca).expect("ca.pem");
            client = client
                .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("a CA cert"));
        }
        HostProc {
            child,
            log,
            server: format!("{scheme}://127.0.0.1:{port}"),
            client: client.build().expect("HTTP client"),
            ca: tls.map(|t| t.ca.clone()),
        }
    }
}

/// A CA and a server certificate it signed, for 127.0.0.1 and localhost,
/// as PEM files.
struct TestTls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl TestTls {
    fn make(dir: &Path) -> TestTls {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "onceflow test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .expect("server params");
        let cert = params.signed_by(&key, &issuer).expect("server cert");
        let tls = TestTls {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server-key.pem"),
        };
        std::fs::write(&tls.ca, ca_cert.pem()).expect("write");
        std::fs::write(&tls.cert, cert.pem()).expect("write");
        std::fs::write(&tls.key, key.serialize_pem()).expect("write");
        tls
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running `onceflow host`, killed on drop.
pub(crate) struct HostProc {
    child: Child,
    log: PathBuf,
    server: String,
    /// Trusts the host's CA when it serves HTTPS.
    client: reqwest::blocking::Client,
    /// The CA the CLI is given (`--ca-cert`) when the host serves HTTPS.
    ca: Option<PathBuf>,
}

impl HostProc {
    /// CPU seconds this host process has used so far.
    fn cpu_seconds(&self) -> f64 {
        common::cpu_seconds(self.child.id())
    }

    /// Waits until the host serves `/healthz`; panics with its log if it
    /// exits or takes longer than `timeout`.
    pub(crate) fn wait_healthy(&mut self, name: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = self.client.get(format!("{}/healthz", self.server)).send()
                && r.status().is_success()
            {
                return;
            }
            if let Some(status) = self.exited() {
                panic!(
                    "host {name} exited ({status}) instead of serving /healthz:\n{}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "host {name} did not serve /healthz within {timeout:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit status, if the host has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for the host to exit on its own.
    pub(crate) fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM (the host drains) without waiting.
    fn terminate(&self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// `/healthz`'s status code and `status` field, if it answers.
    fn health(&self) -> Option<(u16, String)> {
        let r = self
            .client
            .get(format!("{}/healthz", self.server))
            .send()
            .ok()?;
        let code = r.status().as_u16();
        let body: Value = r.json().ok()?;
        Some((code, body["status"].as_str().unwrap_or_default().to_owned()))
    }

    pub(crate) fn stop(mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("host did not stop within 60 s:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs the CLI against this host.
    fn cli(&self, token: &str, args: &[&str]) -> Output {
        let mut cmd = onceflow();
        cmd.args(args)
            .args(["--server", &self.server])
            .env("ONCEFLOW_TOKEN", token);
        if let Some(ca) = &self.ca {
            cmd.env("ONCEFLOW_CA_CERT", ca);
        }
        cmd.output().expect("run onceflow")
    }

    /// Runs the CLI with `--output json`, expecting success.
    pub(crate) fn json(&self, token: &str, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["--output", "json"]);
        let out = self.cli(token, &all);
        assert!(
            out.status.success(),
            "onceflow {args:?} failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "onceflow {args:?}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    /// Runs the CLI expecting failure; returns stderr.
    pub(crate) fn refused(&self, token: &str, args: &[&str]) -> String {
        let out = self.cli(token, args);
        assert!(
            !out.status.success(),
            "onceflow {args:?} should have failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    fn metrics(&self, token: &str) -> String {
        self.client
            .get(format!("{}/metrics", self.server))
            .bearer_auth(token)
            .send()
            .and_then(|r| r.text())
            .expect("scrape /metrics")
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(crate) fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Waits until `f` holds (polling), or panics with `what`.
/// Whether `asker`'s `describe` of `deployment` shows `host` running with
/// partitions of its own.
fn owns_partitions(asker: &HostProc, deployment: &str, host: &str) -> bool {
    let d = asker.json(ACME, &["describe", deployment]);
    d["hosts"].as_array().is_some_and(|hosts| {
        hosts.iter().any(|h| {
            h["host"] == host
                && h["state"] == "running"
                && h["partitions"].as_array().is_some_and(|p| !p.is_empty())
        })
    })
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !f() {
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// Sets its flag when dropped, also while a panic unwinds.
struct SetOnDrop<'a>(&'a std::sync::atomic::AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The client ids of `group`'s members, as its coordinator lists them.
fn group_client_ids(group: &str) -> Vec<String> {
    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &cluster().bootstrap)
        .create()
        .expect("a client");
    let list = reader
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .expect("describe the group");
    list.groups()
        .iter()
        .flat_map(|g| g.members().iter().map(|m| m.client_id().to_owned()))
        .collect()
}

/// Committed (read_committed-visible) records in a topic.
fn committed_records(topic: &str) -> i64 {
    common::txn_probe::TxnProbe::new(cluster(), topic).committed_end()
}

/// Produces `n` payments in chunks, spread over `over`.
fn produce_paced(w: &Wallet, first: u64, n: u64, over: Duration) -> Produced {
    // One producer for all the chunks: a new one per chunk took longer than
    // the chunk's 250 ms, so a 20 s phase offered its load over ~50 s.
    produce_paced_noting(w, &w.producer(), first, n, over).0
}

/// As [`produce_paced`], through `producer`, also returning when each
/// chunk was sent: its first payment's number and the moment before its
/// first send. (A new idempotent producer's first chunk waits for its
/// producer id: a producer already used is what a latency is measured
/// from.)
fn produce_paced_noting(
    w: &Wallet,
    producer: &rdkafka::producer::BaseProducer,
    first: u64,
    n: u64,
    over: Duration,
) -> (Produced, Vec<(u64, Instant)>) {
    let chunks = (over.as_millis() / 250).max(1) as u64;
    let per = n.div_ceil(chunks);
    let mut produced = Produced::default();
    let mut sent = Vec::with_capacity(chunks as usize);
    let started = Instant::now();
    let mut at = first;
    let mut i = 0;
    while at < first + n {
        let k = per.min(first + n - at);
        sent.push((at, Instant::now()));
        produced.absorb(w.produce_with(producer, at, k, 500, Some(97)));
        at += k;
        i += 1;
        let due = started + Duration::from_millis(250 * i);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    (produced, sent)
}

#[test]
fn a_two_hosts_one_killed_and_a_late_host() {
    let _g = serial();
    let fleet = Fleet::new();
    let h1 = fleet.start_host("h1");
    let h2 = fleet.start_host("h2");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "cp", "exactly_once_v2", 6);
    // One payment waits before the deploy: the first output measures deploy
    // to first committed output.
    let mut produced = w.produce(0, 1, 500, None);

    let started = Instant::now();
    let deployed = h1.json(ACME, &["deploy", path(&w.manifest)]);
    assert_eq!(deployed["version"], 1, "{deployed}");
    wait_for(
        "the first committed output",
        Duration::from_secs(120),
        || committed_records(&w.audit) > 0,
    );
    let first_output = started.elapsed();
    figure(
        "cp_deploy_to_first_output_s_2_hosts",
        format!("{:.2}", first_output.as_secs_f64()),
    );

    // Both hosts run it and share the 6 partitions.
    wait_for("both hosts own partitions", Duration::from_secs(60), || {
        let d = h2.json(ACME, &["describe", &w.name]);
        let hosts = d["hosts"].as_array().cloned().unwrap_or_default();
        let owning = hosts
            .iter()
            .filter(|h| h["partitions"].as_array().is_some_and(|p| !p.is_empty()))
            .count();
        owning == 2 && d["partitions"] == 6
    });

    std::thread::scope(|scope| {
        let load = scope.spawn(|| produce_paced(&w, 1, 20_000, Duration::from_secs(8)));
        std::thread::sleep(Duration::from_secs(4));
        h1.kill();
        produced.absorb(load.join().expect("producer"));
    });
    w.wait_done(Duration::from_secs(180));

    // A host started after the deployment picks it up and takes a share.
    let h3 = fleet.start_host("h3");
    wait_for(
        "the late host owns partitions",
        Duration::from_secs(90),
        || owns_partitions(&h3, &w.name, "h3"),
    );
    produced.absorb(w.produce(20_001, 5_000, 500, Some(97)));
    w.wait_done(Duration::from_secs(120));
    let report = w.verify(false);
    assert_exact(&report, &produced, "2 hosts, one SIGKILLed, one late");

    // Usage, written in each commit's transaction, agrees with the topics
    // counted independently, a SIGKILL notwithstanding.
    let usage = h2.json(ACME, &["usage"]);
    let row = usage["deployments"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["deployment"] == w.name.as_str()))
        .unwrap_or_else(|| panic!("no usage for {}: {usage}", w.name))
        .clone();
    let (inputs, input_bytes) = cluster().records_and_bytes(&w.payments);
    let outputs: u64 = [&w.audit, &w.balances, &w.dlq]
        .iter()
        .map(|t| cluster().records_and_bytes(t).0)
        .sum();
    let counted = |field: &str| row[field].as_u64().unwrap_or(0);
    for (field, independent) in [
        ("records_in", inputs),
        ("bytes_in", input_bytes),
        ("records_out", outputs),
        ("dead_letters", report.dead_letters),
    ] {
        figure(
            &format!("usage_{field}"),
            format!("{} (topics: {independent})", counted(field)),
        );
        let off = counted(field).abs_diff(independent) as f64 / independent.max(1) as f64;
        assert!(
            off <= 0.01,
            "usage {field}: {} vs {independent}: {row}",
            counted(field)
        );
    }
    assert_eq!(inputs, report.inputs, "the payments topic read twice");
    for field in ["bytes_out", "state_bytes", "fuel"] {
        assert!(counted(field) > 0, "usage {field} is 0: {row}");
    }
    // Another tenant sees none of it; the operator sees it.
    let theirs = h2.json(GLOBEX, &["usage"]);
    assert!(!theirs.to_string().contains(&w.name), "{theirs}");
    let all = h2.json(OPERATOR, &["usage"]);
    assert!(all.to_string().contains(&w.name), "{all}");
    let later = h2.json(ACME, &["usage", "--since", "0s"]);
    assert_eq!(later["total"]["records_in"], 0, "{later}");
    let metrics = h2.metrics(ACME);
    assert!(metrics.contains("onceflow_input_bytes_total{"), "{metrics}");

    // The list and metrics show it; the query returns a committed balance.
    let list = h3.json(ACME, &["list"]);
    assert!(
        list["deployments"]
            .as_array()
            .is_some_and(|d| d.iter().any(|x| x["name"] == w.name.as_str())),
        "{list}"
    );
    let (account, balance) = produced.totals.iter().next().expect("an account");
    let q = h3.json(ACME, &["query", &w.name, "balances", account]);
    let value = q["values"][0]["value"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(value.trim(), balance.to_string(), "query {account}: {q}");
    let metrics = h2.metrics(ACME);
    assert!(
        metrics.contains(&format!(
            "onceflow_records_total{{tenant=\"acme\",deployment=\"{}\"",
            w.name
        )),
        "{metrics}"
    );
    h3.json(ACME, &["delete", &w.name, "--purge-state"]);
    h2.stop();
    h3.stop();
}

#[test]
fn b_upgrade_under_load_and_a_refused_version() {
    let _g = serial();
    let fleet = Fleet::new();
    let h1 = fleet.start_host("u1");
    let h2 = fleet.start_host("u2");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "up", "exactly_once_v2", 4);
    h1.json(ACME, &["deploy", path(&w.manifest)]);
    let mut produced = Produced::default();
    std::thread::scope(|scope| {
        let load = scope.spawn(|| produce_paced(&w, 0, 20_000, Duration::from_secs(10)));
        std::thread::sleep(Duration::from_secs(4));
        // Version 2: another manifest and another component, 20 MiB like a
        // Python one (the wallet with a 20 MiB custom section), deployed
        // through the other host: every host fetches it from Kafka's chunks.
        let text = std::fs::read_to_string(&w.manifest).expect("manifest");
        let v2 = text.replacen(
            "tenant = \"acme\"",
            "tenant = \"acme\"\ndescription = \"version two\"",
            1,
        );
        std::fs::write(&w.manifest, v2).expect("write v2");
        let big = w.dir.path().join("wallet-20mib.wasm");
        std::fs::write(&big, padded(&wallet_component(), 20 << 20)).expect("write padded");
        let started = Instant::now();
        let upgraded = h2.json(
            ACME,
            &["deploy", path(&w.manifest), "--component", path(&big)],
        );
        figure(
            "cp_deploy_20mib_component_s",
            format!("{:.2}", started.elapsed().as_secs_f64()),
        );
        assert_eq!(upgraded["version"], 2, "{upgraded}");
        produced.absorb(load.join().expect("producer"));
    });
    wait_for("every host runs version 2", Duration::from_secs(60), || {
        let d = h1.json(ACME, &["describe", &w.name]);
        d["status"] == "running" && d["running_versions"] == serde_json::json!([2])
    });
    w.wait_done(Duration::from_secs(180));
    assert_exact(&w.verify(false), &produced, "upgrade under load");

    // A version that fails validation leaves version 2 running.
    let bad = w.dir.path().join("http.wasm");
    std::fs::write(&bad, http_component()).expect("write bad component");
    let err = h1.refused(
        ACME,
        &["deploy", path(&w.manifest), "--component", path(&bad)],
    );
    assert!(err.contains("wasi:http/outgoing-handler@0.2.0"), "{err}");
    let d = h1.json(ACME, &["describe", &w.name]);
    assert_eq!(d["version"], 2, "{d}");
    assert_eq!(d["running_versions"], serde_json::json!([2]), "{d}");
    let more = w.produce(20_000, 2_000, 500, Some(97));
    produced.absorb(more);
    w.wait_done(Duration::from_secs(60));
    assert_exact(&w.verify(false), &produced, "after the refused version");

    // Pause, resume, delete.
    h1.json(ACME, &["pause", &w.name]);
    wait_for("paused on every host", Duration::from_secs(60), || {
        h1.json(ACME, &["describe", &w.name])["hosts"]
            .as_array()
            .is_some_and(|h| h.is_empty())
    });
    let paused_input = w.produce(22_000, 500, 500, None);
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        w.committed() < 22_500,
        "a paused deployment processed input"
    );
    h1.json(ACME, &["resume", &w.name]);
    produced.absorb(paused_input);
    w.wait_done(Duration::from_secs(60));
    assert_exact(&w.verify(false), &produced, "after pause and resume");
    let deleted = h1.json(ACME, &["delete", &w.name, "--purge-state"]);
    assert_eq!(deleted["state_purged"], true, "{deleted}");
    let err = h1.refused(ACME, &["describe", &w.name]);
    assert!(err.contains("no deployment named"), "{err}");
    h1.stop();
    h2.stop();
}

fn wallet_component() -> Vec<u8> {
    let manifest = build_guest("examples/wallet/onceflow.toml");
    std::fs::read(
        manifest
            .parent()
            .expect("dir")
            .join("target/onceflow/wallet.wasm"),
    )
    .expect("the built wallet")
}

/// `component` with a custom section of `size` bytes appended (a valid
/// component: custom sections may appear anywhere and are ignored).
fn padded(component: &[u8], size: usize) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"onceflow-test-padding";
    let mut payload = Vec::with_capacity(size + 32);
    leb(name.len(), &mut payload);
    payload.extend_from_slice(name);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    payload.extend((0..size).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    let mut out = component.to_vec();
    out.push(0); // custom section id
    leb(payload.len(), &mut out);
    out.extend_from_slice(&payload);
    out
}

/// A component importing `wasi:http/outgoing-handler` (never linked).
fn http_component() -> Vec<u8> {
    wat::parse_str(
        r#"(component
            (import "wasi:http/outgoing-handler@0.2.0" (instance))
        )"#,
    )
    .expect("valid WAT")
}

/// A hostile processor of `tenant` on its own topics: each record's value
/// picks a misbehaviour (loop, alloc, panic).
struct Hostile {
    name: String,
    input: String,
    manifest: PathBuf,
}

fn hostile(dir: &Path, tenant: &str, label: &str) -> Hostile {
    let built = build_guest("tests/guests/hostile/onceflow.toml");
    let component = built
        .parent()
        .expect("dir")
        .join("target/onceflow/hostile.wasm");
    let suffix = format!("{label}-{}", std::process::id());
    let h = Hostile {
        name: format!("hostile-{suffix}"),
        input: format!("{tenant}.hostile-in-{suffix}"),
        manifest: dir.join(format!("hostile-{suffix}.toml")),
    };
    let out = format!("{tenant}.hostile-out-{suffix}");
    let dlq = format!("{tenant}.hostile-dlq-{suffix}");
    cluster().create_topics(&[(&h.input, 2), (&out, 2), (&dlq, 1)]);
    std::fs::write(
        &h.manifest,
        format!(
            r#"name = "{name}"
tenant = "{tenant}"
inputs = ["{input}"]
stores = ["seen"]
[build]
language = "rust"
component = "{component}"
[outputs]
out = "{out}"
[processing]
max-batch-records = 10
[errors]
policy = "dead-letter"
dead-letter-topic = "{dlq}"
[limits]
memory-mb = 16
fuel-per-record = 5000000
timeout-ms = 2000
log-lines-per-second = 1000
"#,
            name = h.name,
            input = h.input,
            component = component.display(),
        ),
    )
    .expect("write hostile manifest");
    h
}

#[test]
fn c_tenant_isolation_and_refusals() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("t1");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "iso", "exactly_once_v2", 2);
    h.json(ACME, &["deploy", path(&w.manifest)]);
    let produced = w.produce(0, 2_000, 100, Some(50));
    let evil = hostile(fleet.dir.path(), "globex", "iso");
    h.json(GLOBEX, &["deploy", path(&evil.manifest)]);
    let producer = common::cluster::plain_producer(cluster());
    for value in ["panic", "ok-1", "panic"] {
        common::cluster::send(&producer, &evil.input, "k", value);
    }
    w.wait_done(Duration::from_secs(120));
    assert_exact(&w.verify(false), &produced, "isolation");

    // Bad tokens: 401, and the token is not in the host's log.
    let err = h.refused("not-a-token", &["list"]);
    assert!(err.contains("HTTP 401"), "{err}");
    // Each tenant sees only its own deployments.
    let names = |list: &Value| -> Vec<String> {
        list["deployments"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|x| x["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let acme_names = names(&h.json(ACME, &["list"]));
    assert!(
        acme_names.contains(&w.name) && !acme_names.contains(&evil.name),
        "{acme_names:?}"
    );
    let globex_names = names(&h.json(GLOBEX, &["list"]));
    assert!(
        globex_names.contains(&evil.name) && !globex_names.contains(&w.name),
        "{globex_names:?}"
    );
    // Another tenant's deployment is a 404 for describe, logs, query, pause.
    for args in [
        vec!["describe", w.name.as_str()],
        vec!["logs", w.name.as_str()],
        vec!["query", w.name.as_str(), "balances", "acct-0001"],
        vec!["pause", w.name.as_str()],
        vec!["delete", w.name.as_str()],
    ] {
        let err = h.refused(GLOBEX, &args);
        assert!(
            err.contains("HTTP 404") && err.contains("no deployment named"),
            "{args:?}: {err}"
        );
    }
    // The hostile guest's panics are in its own logs, not in acme's.
    wait_for("globex's guest logs", Duration::from_secs(60), || {
        let out = h.cli(GLOBEX, &["logs", &evil.name]);
        String::from_utf8_lossy(&out.stdout).contains("hostile guest panicked on purpose")
    });
    // `logs --follow` prints new lines as they come.
    let panics = |text: &[u8]| {
        String::from_utf8_lossy(text)
            .lines()
            .filter(|l| l.contains("hostile guest panicked on purpose"))
            .count()
    };
    let old = panics(&h.cli(GLOBEX, &["logs", &evil.name]).stdout);
    assert!(old >= 1, "the earlier panics are logged");
    let mut follow = onceflow()
        .args(["logs", &evil.name, "--follow", "--server", &h.server])
        .env("ONCEFLOW_TOKEN", GLOBEX)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start logs --follow");
    let stdout = follow.stdout.take().expect("piped stdout");
    let lines = std::thread::spawn(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("hostile guest panicked on purpose"))
            .take(old + 1)
            .count()
    });
    std::thread::sleep(Duration::from_secs(2));
    common::cluster::send(&producer, &evil.input, "k", "panic");
    wait_for(
        "logs --follow shows the new panic",
        Duration::from_secs(60),
        || lines.is_finished(),
    );
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(
        lines.join().expect("reader"),
        old + 1,
        "the old panics and the new one"
    );
    // describe shows the last errors and the dead letters.
    let d = h.json(GLOBEX, &["describe", &evil.name]);
    assert!(
        d.to_string().contains("hostile guest panicked on purpose"),
        "{d}"
    );
    let acme_logs = h.cli(ACME, &["logs", &w.name]);
    assert!(acme_logs.status.success());
    assert!(!String::from_utf8_lossy(&acme_logs.stdout).contains("hostile"));
    let err = h.refused(ACME, &["logs", &evil.name]);
    assert!(err.contains("HTTP 404"), "{err}");
    // Metrics: each tenant's own series only; the operator sees both.
    let acme_metrics = h.metrics(ACME);
    assert!(
        acme_metrics.contains(&w.name) && !acme_metrics.contains(&evil.name),
        "{acme_metrics}"
    );
    let globex_metrics = h.metrics(GLOBEX);
    assert!(globex_metrics.contains(&evil.name) && !globex_metrics.contains(&w.name));
    let all = h.metrics(OPERATOR);
    assert!(all.contains(&evil.name) && all.contains(&w.name));

    // A tenant cannot use another tenant's topics (or claim its name).
    let steal = fleet.dir.path().join("steal.toml");
    let text = std::fs::read_to_string(&w.manifest)
        .expect("manifest")
        .replace("tenant = \"acme\"", "tenant = \"globex\"")
        .replace("name = \"wallet-", "name = \"thief-");
    std::fs::write(&steal, &text).expect("write");
    let err = h.refused(GLOBEX, &["deploy", path(&steal)]);
    assert!(
        err.contains(&format!(
            "topic \"{}\" is outside your namespace",
            w.payments
        )),
        "{err}"
    );
    let err = h.refused(ACME, &["deploy", path(&steal)]);
    assert!(err.contains("token is tenant \"acme\"'s"), "{err}");
    // Quotas: memory per instance.
    let big = fleet.dir.path().join("big.toml");
    std::fs::write(
        &big,
        std::fs::read_to_string(&evil.manifest)
            .expect("manifest")
            .replace("memory-mb = 16", "memory-mb = 512"),
    )
    .expect("write");
    let err = h.refused(GLOBEX, &["deploy", path(&big)]);
    assert!(
        err.contains("limits.memory-mb = 512 exceeds your quota of 64 MiB"),
        "{err}"
    );
    // Bad manifests and components, with the named reason.
    let typo = fleet.dir.path().join("typo.toml");
    std::fs::write(
        &typo,
        text.replace("[processing]", "[processing]\ncommit-intervall-ms = 5"),
    )
    .expect("write");
    let err = h.refused(GLOBEX, &["deploy", path(&typo)]);
    assert!(err.contains("commit-intervall-ms"), "{err}");
    let junk = fleet.dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not a component").expect("write");
    let err = h.refused(
        GLOBEX,
        &["deploy", path(&evil.manifest), "--component", path(&junk)],
    );
    assert!(err.contains("component refused"), "{err}");
    let log = h.log_text();
    for token in [ACME, GLOBEX, OPERATOR, "not-a-token"] {
        assert!(!log.contains(token), "a token leaked into the host log");
    }
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    h.json(GLOBEX, &["delete", &evil.name, "--purge-state"]);
    h.stop();
}

/// Commit latency p99 (s) of a deployment from the difference of two
/// scrapes of the histogram (interpolated inside the bucket, as Prometheus'
/// histogram_quantile does); `None` with fewer than `min_commits` commits
/// between them.
fn p99_between(before: &str, after: &str, deployment: &str, min_commits: f64) -> Option<f64> {
    let buckets = |text: &str| -> Vec<(f64, f64)> {
        text.lines()
            .filter(|l| l.starts_with("onceflow_commit_latency_seconds_bucket{"))
            .filter(|l| l.contains(&format!("deployment=\"{deployment}\"")))
            .filter_map(|l| {
                let i = l.find("le=\"")? + 4;
                let le = &l[i..i + l[i..].find('"')?];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                let count = l.rsplit(' ').next()?.parse().ok()?;
                Some((le, count))
            })
            .collect()
    };
    let (b, a) = (buckets(before), buckets(after));
    let delta: Vec<(f64, f64)> = a
        .iter()
        .map(|(le, n)| {
            (
                *le,
                n - b.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1),
            )
        })
        .collect();
    let total = delta.last()?.1;
    if total < min_commits {
        return None;
    }
    let target = 0.99 * total;
    let mut prev = (0.0, 0.0);
    for (le, n) in delta {
        if n >= target {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let frac = if n > prev.1 {
                (target - prev.1) / (n - prev.1)
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, n);
    }
    None
}

/// The value of the series `name` (`onceflow_records_total{`, …) of
/// `deployment` in a scrape of the host's metrics; 0 when absent.
fn series_of(metrics: &str, name: &str, deployment: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(name) && l.contains(deployment))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A record the hostile guest answers with 2 M loop iterations (about 4 M
/// fuel, under its 5 M per record): legitimate, heavy work.
const BURN: &str = "burn:2000000";
/// The feeds' period in `d_hostile_neighbour_latency`.
const FEED_EVERY: Duration = Duration::from_millis(200);

/// Sends `n` records to `topic` under key `k`, the `i`th with `value(i)`,
/// waiting for room in the producer's queue, and flushes.
fn send_many(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    n: u64,
    value: impl Fn(u64) -> String,
) {
    use rdkafka::producer::{BaseRecord, Producer};
    for i in 0..n {
        let v = value(i);
        let mut record = BaseRecord::to(topic).key("k").payload(&v);
        while let Err((_, r)) = producer.send(record) {
            producer.poll(Duration::from_millis(10));
            record = r;
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}

/// How many [`BURN`] records a feed sends for the neighbour to want 1.5
/// cores: a neighbour at `cpu-share = 10` must be over its share on any
/// machine. The count of loop iterations says nothing of that (on a fast
/// machine 40 records a feed cost under 10% of the host, the throttle had
/// nothing to do, and the test failed), so the cost of one record is
/// measured here, in the host's CPU seconds, with the host otherwise idle:
/// its idle rate first, then 200 records, less that rate.
fn burn_records_per_feed(
    h: &HostProc,
    producer: &rdkafka::producer::BaseProducer,
    burner: &Hostile,
) -> u64 {
    const SAMPLE: u32 = 200;
    let processed = || {
        series_of(
            &h.metrics(OPERATOR),
            "onceflow_records_total{",
            &burner.name,
        )
    };
    let (cpu, at) = (h.cpu_seconds(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let idle = (h.cpu_seconds() - cpu) / at.elapsed().as_secs_f64();
    let (done, cpu, at) = (processed(), h.cpu_seconds(), Instant::now());
    send_many(producer, &burner.input, SAMPLE.into(), |_| BURN.into());
    wait_for(
        "the burn neighbour to process its calibration records",
        Duration::from_secs(300),
        || processed() >= done + f64::from(SAMPLE),
    );
    let used = h.cpu_seconds() - cpu;
    // The idle rate is at most half of what was used (a host busy with
    // something else while idle would otherwise leave nothing to measure).
    let burnt = (used - idle * at.elapsed().as_secs_f64()).max(used / 2.0);
    let per_record = burnt / f64::from(SAMPLE);
    let feed = (1.5 * FEED_EVERY.as_secs_f64() / per_record)
        .ceil()
        .clamp(1.0, 5_000.0) as u64;
    figure("cp_burn_record_cpu_ms", format!("{:.2}", per_record * 1e3));
    figure("cp_burn_host_idle_cores", format!("{idle:.3}"));
    figure("cp_burn_records_per_feed", feed);
    feed
}

/// Deletes what a test deployed on the shared cluster's control plane when
/// the test panics: its deployments would otherwise count in the tenants'
/// quotas of every later test (two control-plane tests failed that way
/// after `d_hostile_neighbour_latency` had).
struct DeleteOnPanic<'a> {
    host: &'a HostProc,
    deployed: std::cell::RefCell<Vec<(&'static str, String)>>,
}

impl<'a> DeleteOnPanic<'a> {
    fn new(host: &'a HostProc) -> Self {
        Self {
            host,
            deployed: Default::default(),
        }
    }

    fn deployed(&self, token: &'static str, name: &str) {
        self.deployed.borrow_mut().push((token, name.to_owned()));
    }
}

impl Drop for DeleteOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for (token, name) in self.deployed.borrow().iter() {
                let _ = self.host.cli(token, &["delete", name, "--purge-state"]);
            }
        }
    }
}

#[test]
fn d_hostile_neighbour_latency() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("n1");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "victim", "exactly_once_v2", 2);
    let cleanup = DeleteOnPanic::new(&h);
    h.json(ACME, &["deploy", path(&w.manifest)]);
    cleanup.deployed(ACME, &w.name);
    let mut produced = w.produce(0, 100, 100, None);
    w.wait_done(Duration::from_secs(120));
    // ~40 commits per phase (100 ms interval) and the drain's: the p99s
    // are figures (their targets live in scripts/isolation, which repeats
    // longer phases); what the test checks is that the victim commits in
    // every phase and stays exact.
    let phase = Duration::from_secs(4);
    // Records/s offered to the victim: about what the phases offered before
    // 2026-12-03, when `produce_paced` made a producer per 250 ms chunk and
    // so spread the 40,000 records of a "2,000/s" phase over ~50 s. At a
    // true 2,000/s the victim, the broker and the burning neighbour
    // saturate this 2-core machine (commit p99 750 ms alone).
    let rate = 800u64;
    let mut next = 100u64;
    let mut run_phase = |label: &str, feed: &dyn Fn()| -> f64 {
        let before = h.metrics(OPERATOR);
        std::thread::scope(|scope| {
            let load = scope.spawn(|| produce_paced(&w, next, rate * phase.as_secs(), phase));
            let stop_at = Instant::now() + phase;
            while Instant::now() < stop_at {
                feed();
                std::thread::sleep(FEED_EVERY);
            }
            produced.absorb(load.join().expect("producer"));
        });
        next += rate * phase.as_secs();
        w.wait_done(Duration::from_secs(120));
        let after = h.metrics(OPERATOR);
        let p99 = p99_between(&before, &after, &w.name, 1.0)
            .unwrap_or_else(|| panic!("the victim committed no transaction in the {label} phase"))
            * 1e3;
        figure(
            &format!("cp_victim_commit_p99_ms_{label}"),
            format!("{p99:.1}"),
        );
        p99
    };
    let solo = run_phase("solo", &|| {});

    let producer = common::cluster::plain_producer(cluster());
    let mut beside = Vec::new();
    // A neighbour with 10x the victim's load of heavy (but valid) records,
    // first with no CPU limit (cpu-share 100), then held to 10% of the
    // host's CPU (tenants.toml re-read, no restart); then the hostile
    // kinds under the same limit.
    let acme = format!("\"{}\"", onceflow::fleet::tenancy::hash_token(ACME));
    let phases = [
        ("burn", 100),
        ("burn", 10),
        ("loop", 10),
        ("alloc", 10),
        ("panic", 10),
        ("outputs", 10),
        ("logs", 10),
    ];
    // A second deployment of acme's that logs three lines: a neighbour
    // flooding its own logs must not push them out of `onceflow logs`
    // (before: one log topic for all, read from its last 10,000 records).
    let quiet = hostile(fleet.dir.path(), "acme", "quiet");
    h.json(ACME, &["deploy", path(&quiet.manifest)]);
    cleanup.deployed(ACME, &quiet.name);
    common::cluster::send(&producer, &quiet.input, "k", "logs:3");
    let quiet_lines = || {
        let out = h.cli(ACME, &["logs", &quiet.name]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("hostile log line"))
            .count()
    };
    wait_for("acme's three log lines", Duration::from_secs(60), || {
        quiet_lines() == 3
    });
    // The burn neighbour is one deployment through both of its phases: the
    // limit must reach workers that started without one. (Before, a
    // deployment started at cpu-share 100 held no CPU budget, so a share
    // lowered later never applied to it; each phase deployed a new
    // neighbour after a 3 s wait for the re-read, which hid that, and
    // failed when the re-read came later.)
    // Deployed before the phases, so that its records' cost is measured
    // first: the burn feed is sized by what it costs on this machine.
    let burner = hostile(fleet.dir.path(), "globex", "burn-100");
    h.json(GLOBEX, &["deploy", path(&burner.manifest)]);
    cleanup.deployed(GLOBEX, &burner.name);
    let burn_feed = burn_records_per_feed(&h, &producer, &burner);
    let mut burning = Some(burner);
    let mut share_in_force = 100;
    for (kind, share) in phases {
        if share != share_in_force {
            let reloads = || {
                h.log_text()
                    .matches("tenants.toml changed: the new tenants and tokens are in force")
                    .count()
            };
            let before = reloads();
            fleet.write_tenants(&tenants_toml_with(&acme, share));
            wait_for(
                "the host to read tenants.toml",
                Duration::from_secs(30),
                || reloads() > before,
            );
            share_in_force = share;
        }
        let evil = match burning.take() {
            Some(running) if kind == "burn" => running,
            _ => {
                let evil = hostile(fleet.dir.path(), "globex", &format!("{kind}-{share}"));
                h.json(GLOBEX, &["deploy", path(&evil.manifest)]);
                cleanup.deployed(GLOBEX, &evil.name);
                evil
            }
        };
        let label = format!("{kind}_share{share}");
        // Each feed, 5 times a second: burn, records of 2 M iterations as
        // many as cost 1.5 cores (measured above: the neighbour wants more
        // than a core on any machine); outputs, a record of
        // 10,000 outputs; logs, a record of 2,000 log lines (past its rate
        // limit of 1,000 a second per instance); the others, a hostile
        // record and an ordinary one.
        let p99 = run_phase(&label, &|| match kind {
            "burn" => send_many(&producer, &evil.input, burn_feed, |_| BURN.into()),
            "outputs" => common::cluster::send(&producer, &evil.input, "k", "outputs:10000"),
            "logs" => common::cluster::send(&producer, &evil.input, "k", "logs:2000"),
            _ => {
                common::cluster::send(&producer, &evil.input, "k", kind);
                common::cluster::send(&producer, &evil.input, "k", "ordinary");
            }
        });
        beside.push((label, p99));
        let metrics = h.metrics(OPERATOR);
        let series = |name: &str| series_of(&metrics, name, &evil.name);
        let records = series("onceflow_records_total{");
        figure(
            &format!("cp_neighbour_records_{kind}_share{share}"),
            records,
        );
        // Held back, never starved: its records go on.
        assert!(records > 0.0, "the neighbour ({kind}) made no progress");
        if kind == "burn" {
            // Cumulative over the deployment's two phases.
            let throttled = series("onceflow_cpu_throttled_microseconds_total{") / 1e6;
            figure(
                &format!("cp_neighbour_throttled_s_share{share}"),
                format!("{throttled:.1}"),
            );
            if share < 100 {
                assert!(
                    throttled > 0.0,
                    "the neighbour, deployed at cpu-share 100, was never held back at {share}"
                );
                h.json(GLOBEX, &["delete", &evil.name]);
            } else {
                assert!(throttled == 0.0, "held back without a limit");
                burning = Some(evil);
            }
            continue;
        }
        if kind == "logs" {
            let flooded = h.cli(GLOBEX, &["logs", &evil.name, "--output", "json"]);
            let lines = common::json_lines(&flooded.stdout).len();
            figure("cp_neighbour_log_lines_read", lines);
            assert!(lines >= 1_000, "the neighbour's flood was logged: {lines}");
            let kept = quiet_lines();
            figure("cp_victim_log_lines_kept_after_flood", kept);
            assert_eq!(kept, 3, "the flood evicted another tenant's log lines");
        }
        if matches!(kind, "outputs" | "logs") {
            h.json(GLOBEX, &["delete", &evil.name]);
            continue;
        }
        let d = h.json(GLOBEX, &["describe", &evil.name]);
        assert!(
            d["hosts"][0]["dead_lettered"].as_u64().unwrap_or(0) > 0,
            "the hostile records were dead-lettered: {d}"
        );
        h.json(GLOBEX, &["delete", &evil.name]);
    }
    // Two controls, for what the host cannot separate on a shared machine:
    // the broker and the test's producer under the heaviest neighbour's
    // broker load with no processor at all (10,000 records per feed, as
    // `outputs` emits, written straight to a topic nobody reads), and the
    // solo phase again (the machine's own drift over the run).
    let idle = format!("globex.unread-{}", std::process::id());
    cluster().create_topics(&[(&idle, 2)]);
    let broker_only = run_phase("broker_only", &|| {
        send_many(&producer, &idle, 10_000, |i| i.to_string())
    });
    beside.push(("broker_only".to_string(), broker_only));
    let solo_again = run_phase("solo_again", &|| {});
    beside.push(("solo_again".to_string(), solo_again));
    assert_exact(
        &w.verify(false),
        &produced,
        "victim beside hostile neighbours",
    );
    // The victim's latency beside each neighbour is a figure, not a check:
    // on this 2-core machine it swings with the machine's own load (beside
    // a CPU hog, 1,341 ms beside the broker-only control against 92 ms
    // solo), so its target lives in scripts/isolation, which repeats the
    // phases. What this test checks is that no neighbour stopped the
    // victim: it committed in every phase (`run_phase`) and every payment
    // is exact (above).
    for (kind, p99) in beside {
        figure(
            &format!("cp_victim_p99_ratio_{kind}"),
            format!("{:.2}", p99 / solo),
        );
    }
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    h.json(ACME, &["delete", &quiet.name, "--purge-state"]);
    drop(cleanup);
    h.stop();
}

#[test]
fn e_a_python_processor_through_the_control_plane() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("py1");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "py", "exactly_once_v2", 2);
    // The Python wallet (an ~18 MiB component) in place of the Rust one,
    // within acme's fuel quota.
    w.use_example("examples/wallet-python", Some(50_000_000));
    let own =
        onceflow::manifest::Manifest::load(repo().join("examples/wallet-python/onceflow.toml"))
            .expect("the example's manifest");
    let size = std::fs::metadata(own.component_path())
        .expect("component")
        .len();
    assert!(size > 10 << 20, "the Python component is {size} bytes");

    let started = Instant::now();
    h.json(ACME, &["deploy", path(&w.manifest)]);
    figure(
        "cp_deploy_python_component_s",
        format!("{:.2}", started.elapsed().as_secs_f64()),
    );
    let produced = w.produce(0, 2_000, 100, Some(40));
    // A hang guard that covers the ~18 MiB component's first compile on a
    // slow or busy machine.
    w.wait_done(Duration::from_secs(600));
    assert_exact(
        &w.verify(false),
        &produced,
        "the Python wallet deployed through the fleet",
    );
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    h.stop();
}

/// Stops a test's own cluster and deletes its data when dropped.
struct Purged(Cluster);

impl Drop for Purged {
    fn drop(&mut self) {
        if !self.0.purge_quietly() {
            eprintln!("could not purge the cluster in {}", self.0.dir.display());
        }
    }
}

#[test]
fn f_a_host_on_a_fresh_cluster_waits_for_its_topics_and_brokers() {
    let _g = serial();
    // A 3-node cluster of this test's own that has never seen Onceflow: no
    // internal topics (scripts/kafka formats new data on every `up`).
    let fresh = Purged(Cluster::at("fresh", 19042, 3));
    let fleet = Fleet::new();

    // 1. The brokers are up, the control topics are not there: three hosts
    //    started at once (a fleet rolled out on a new cluster) create them
    //    and serve. A topic just created has no leader for a moment, which
    //    one round does not always see; every CI run is another round (a
    //    second round here cost 30 s of the suite's budget).
    const ROUNDS: u32 = 1;
    for round in 1..=ROUNDS {
        fresh.0.purge();
        fresh.0.up();
        let mut hosts: Vec<(String, HostProc)> = ["a", "b", "c"]
            .iter()
            .map(|x| {
                let name = format!("fresh{round}{x}");
                let h = fleet.spawn_host(&name, &fresh.0.bootstrap, &["--host-id", &name]);
                (name, h)
            })
            .collect();
        for (name, h) in &mut hosts {
            h.wait_healthy(name, Duration::from_secs(90));
        }
        let list = hosts[0].1.json(ACME, &["list"]);
        assert_eq!(list["deployments"], serde_json::json!([]), "{list}");
        for topic in [
            "_onceflow.deployments",
            "_onceflow.status",
            "_onceflow.artifacts",
            "_onceflow.usage",
        ] {
            assert!(fresh.0.topic_exists(topic), "{topic} was not created");
        }
        for (name, h) in hosts {
            for line in h.log_text().lines().filter(|l| l.contains("waiting for")) {
                println!("{name}: {line}");
            }
            h.stop();
        }
    }

    // 2. The host starts before the broker: it waits (and says so), and
    //    serves once the broker is up.
    fresh.0.purge();
    // The wait is long: three brokers start in up to scripts/kafka's
    // readiness bound, and the default 60 s is about waiting, not this.
    let mut h = fleet.spawn_host(
        "fresh2",
        &fresh.0.bootstrap,
        &["--host-id", "fresh2", "--kafka-wait-secs", "900"],
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        h.exited().is_none(),
        "the host gave up at once without a broker:\n{}",
        h.log_text()
    );
    fresh.0.up();
    h.wait_healthy("fresh2", Duration::from_secs(300));
    let log = h.log_text();
    for line in log.lines().filter(|l| l.contains("waiting for")) {
        println!("fresh2: {line}");
    }
    assert!(
        log.contains("waiting for") && log.contains(&fresh.0.bootstrap),
        "the host did not log what it waited for:\n{log}"
    );
    h.stop();

    // 3. No broker at all: the wait is bounded, and the error names the
    //    bootstrap address and what to check.
    fresh.0.purge();
    let mut h = fleet.spawn_host(
        "fresh3",
        &fresh.0.bootstrap,
        &["--host-id", "fresh3", "--kafka-wait-secs", "5"],
    );
    let status = h
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the host waited forever:\n{}", h.log_text()));
    let log = h.log_text();
    println!("fresh3 (no broker):\n{log}");
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&fresh.0.bootstrap) && log.contains("not there within 5 s"),
        "the error does not name the bootstrap address and the wait:\n{log}"
    );
}

#[test]
fn g_a_second_host_with_the_same_id_is_refused() {
    let _g = serial();
    let fleet = Fleet::new();
    let h1 = fleet.start_host("dup");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "dup", "exactly_once_v2", 2);
    wait_for("the wallet's topics", Duration::from_secs(30), || {
        cluster().topic_exists(&w.payments)
    });
    h1.json(ACME, &["deploy", path(&w.manifest)]);
    let mut produced = w.produce(0, 500, 50, None);
    w.wait_done(Duration::from_secs(120));

    // Another process with the same host id (what two machines whose state
    // directories have the same path got by default): its own state
    // directory, the same transactional ids and static memberships.
    let mut h2 = fleet.spawn_host("dup-copy", &cluster().bootstrap, &["--host-id", "dup"]);
    let Some(status) = h2.wait_exit(Duration::from_secs(40)) else {
        // Show the damage: the two fence each other.
        let more = w.produce(500, 2_000, 50, None);
        std::thread::sleep(Duration::from_secs(15));
        let d = h1.json(ACME, &["describe", &w.name]);
        let fenced = |log: &str| log.lines().filter(|l| l.contains("fenc")).count();
        let (log1, log2) = (h1.log_text(), h2.log_text());
        let sample: Vec<&str> = log2
            .lines()
            .filter(|l| l.contains("fenc"))
            .take(5)
            .collect();
        panic!(
            "a second host with id \"dup\" was allowed to start; 40 s later it still runs. \
             Committed {} of {} payments; log lines about fencing: first host {}, second host {}; \
             describe: {d}\nsecond host's fencing lines:\n{}",
            w.committed(),
            produced.valid + produced.invalid + more.valid + more.invalid,
            fenced(&log1),
            fenced(&log2),
            sample.join("\n")
        );
    };
    let log = h2.log_text();
    println!("the second host \"dup\" ({status}):\n{log}");
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("host id \"dup\"") && log.contains("--host-id"),
        "the refusal does not name the id and what to do:\n{log}"
    );
    // The first host was not disturbed.
    produced.absorb(w.produce(500, 500, 50, None));
    w.wait_done(Duration::from_secs(120));
    assert_exact(
        &w.verify(false),
        &produced,
        "beside a refused duplicate host",
    );
    h1.json(ACME, &["delete", &w.name, "--purge-state"]);
    h1.stop();
}

#[test]
fn h_deployments_whose_changelogs_collide_are_refused() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("names1");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "names", "exactly_once_v2", 1);
    // `<name>` with store `by-customer` and `<name>-by` with store
    // `customer`: both changelogs are `acme.<name>-by-customer-changelog`.
    let text = std::fs::read_to_string(&w.manifest).expect("manifest");
    let first = fleet.dir.path().join("orders.toml");
    std::fs::write(
        &first,
        text.replace(
            "stores = [\"balances\"]",
            "stores = [\"balances\", \"by-customer\"]",
        ),
    )
    .expect("write");
    let second_name = format!("{}-by", w.name);
    let second = fleet.dir.path().join("orders-by.toml");
    std::fs::write(
        &second,
        text.replace(
            &format!("name = \"{}\"", w.name),
            &format!("name = \"{second_name}\""),
        )
        .replace(
            "stores = [\"balances\"]",
            "stores = [\"balances\", \"customer\"]",
        ),
    )
    .expect("write");
    let shared = format!("acme.{}-by-customer-changelog", w.name);
    let changelogs = |p: &Path| {
        onceflow::stream::changelog_topics(
            &onceflow::manifest::Manifest::load(p).expect("a valid manifest"),
        )
    };
    assert!(changelogs(&first).contains(&shared) && changelogs(&second).contains(&shared));

    h.json(ACME, &["deploy", path(&first)]);
    let out = h.cli(ACME, &["deploy", path(&second)]);
    if out.status.success() {
        // Show the damage: purging the second deletes the first's state.
        assert!(cluster().topic_exists(&shared));
        h.json(ACME, &["delete", &second_name, "--purge-state"]);
        let gone = !cluster().topic_exists(&shared);
        let list = h.json(ACME, &["list"]);
        panic!(
            "{second_name} was deployed beside {} although both use the changelog {shared}; \
             deleting {second_name} with --purge-state deleted that topic: {gone}, while {} is \
             still deployed: {list}",
            w.name, w.name
        );
    }
    let err = String::from_utf8_lossy(&out.stderr);
    println!("deploy {second_name}: {err}");
    assert!(
        err.contains("HTTP 409")
            && err.contains(&shared)
            && err.contains(&format!("acme/{}", w.name))
            && err.contains(&format!("acme/{second_name}"))
            && err.contains("rename"),
        "{err}"
    );
    // Nothing of the refused deployment was created or listed.
    let list = h.json(ACME, &["list"]);
    assert!(
        !list.to_string().contains(&second_name),
        "the refused deployment is listed: {list}"
    );
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    h.stop();
}

/// Sends `head` and the first `body` bytes of a request on a raw
/// connection (the rest of the declared body never comes) and returns the
/// status line and body of the answer, if one arrives within `wait`.
fn answer_before_the_body(server: &str, head: &str, body: &[u8], wait: Duration) -> Option<String> {
    use std::io::{Read, Write};
    let addr = server.trim_start_matches("http://");
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the admin API");
    conn.write_all(head.as_bytes()).expect("send the head");
    // The server may close as soon as it answered: a failed write is fine.
    let _ = conn.write_all(body);
    conn.set_read_timeout(Some(wait)).expect("read timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if String::from_utf8_lossy(&got).contains("\"}") {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    (!got.is_empty()).then(|| String::from_utf8_lossy(&got).into_owned())
}

/// The doors a hostile tenant (or a client without a token) opened on a
/// shared host (issue 15), each shown closed:
///
/// - an upload without a valid token is answered 401 before its body is
///   read (before: the host buffered the whole declared body first; here
///   no answer came within 5 s of sending 64 KiB of a declared 100 MB);
/// - a component or manifest over the limit is a 413 naming the limit
///   (before: a 1.2 MB manifest was accepted and failed as a raw
///   `MessageSizeTooLarge` 503);
/// - a tenant cannot deploy another tenant's component by its digest;
/// - eight concurrent deploys, through two hosts, against a quota of 3
///   admit exactly 3 (before: all eight could get in through one host;
///   with one admission lock per host, each host still admitted up to 3);
/// - a tenant's long polls of its logs are bounded (8 per host), and past
///   that refused at once (429).
#[test]
fn i_bodies_limits_and_quota_races() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("doors1");
    let wait = Duration::from_secs(5);
    // Every door is tried and what is wrong collected, so that one run
    // shows them all.
    let mut open: Vec<String> = Vec::new();
    let mut check = |ok: bool, door: String| {
        println!("door {}: {door}", if ok { "closed" } else { "OPEN" });
        if !ok {
            open.push(door);
        }
    };

    let head = |token: &str, length: u64| {
        format!(
            "POST /v1/artifacts HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/wasm\r\nContent-Length: {length}\r\n\r\n"
        )
    };
    let started = Instant::now();
    let answer = answer_before_the_body(
        &h.server,
        &head("not-a-token", 100 << 20),
        &[0u8; 65536],
        wait,
    );
    figure(
        "door_unauthenticated_upload_answer_ms",
        started.elapsed().as_millis(),
    );
    check(
        answer
            .as_deref()
            .is_some_and(|a| a.starts_with("HTTP/1.1 401")),
        format!(
            "an unauthenticated upload of a declared 100 MB, 64 KiB sent: answer within \
             {wait:?}: {answer:?}"
        ),
    );
    let answer = answer_before_the_body(&h.server, &head(ACME, 200 << 20), &[0u8; 65536], wait);
    check(
        answer.as_deref().is_some_and(|a| {
            a.starts_with("HTTP/1.1 413") && a.contains("over the limit of 134217728 bytes")
        }),
        format!("an upload of a declared 200 MiB: answer within {wait:?}: {answer:?}"),
    );

    // A manifest of 1.2 MB: 413, naming the limit; the CLI says so before
    // sending anything. The component is padded to a digest of its own, so
    // that no earlier test's deployment of globex ran it (a tenant may
    // redeploy a component one of its deployments already ran).
    let component = padded(
        &wallet_component(),
        1024 + std::process::id() as usize % 1024,
    );
    let client = reqwest::blocking::Client::new();
    let uploaded: Value = client
        .post(format!("{}/v1/artifacts", h.server))
        .bearer_auth(ACME)
        .body(component)
        .send()
        .and_then(|r| r.json())
        .expect("upload the wallet");
    let artifact = uploaded["artifact"]
        .as_str()
        .expect("artifact digest")
        .to_owned();
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "doors", "exactly_once_v2", 1);
    let big = format!(
        "{}\n[config]\npadding = \"{}\"\n",
        std::fs::read_to_string(&w.manifest).expect("manifest"),
        "x".repeat(1_200_000)
    );
    let answer = client
        .put(format!("{}/v1/deployments/{}", h.server, w.name))
        .bearer_auth(ACME)
        .json(&serde_json::json!({ "manifest": big, "artifact": artifact }))
        .send()
        .map(|r| (r.status().as_u16(), r.text().unwrap_or_default()));
    check(
        answer
            .as_ref()
            .is_ok_and(|(status, text)| *status == 413 && text.contains("limit")),
        format!("a deploy with a 1.2 MB manifest: {answer:?}"),
    );
    let big_path = fleet.dir.path().join("big.toml");
    std::fs::write(&big_path, &big).expect("write");
    let out = h.cli(ACME, &["deploy", path(&big_path)]);
    let err = String::from_utf8_lossy(&out.stderr);
    check(
        !out.status.success() && err.contains("over the host's limit of 262144 bytes"),
        format!("`onceflow deploy` of a 1.2 MB manifest: {err}"),
    );

    // Another tenant's component, by its digest: refused as if it did not
    // exist.
    let g = Wallet::in_tenant(
        cluster(),
        "globex",
        "globex.",
        "steal",
        "exactly_once_v2",
        1,
    );
    let answer = client
        .put(format!("{}/v1/deployments/{}", h.server, g.name))
        .bearer_auth(GLOBEX)
        .json(&serde_json::json!({
            "manifest": format!(
                "{}\n[limits]\nmemory-mb = 64\n",
                std::fs::read_to_string(&g.manifest).expect("manifest")
            ),
            "artifact": artifact,
        }))
        .send()
        .map(|r| (r.status().as_u16(), r.text().unwrap_or_default()));
    check(
        answer.as_ref().is_ok_and(|(status, text)| {
            *status == 422 && text.contains("was not uploaded by tenant") && text.contains("globex")
        }),
        format!("globex deploys acme's component by its digest: {answer:?}"),
    );

    // Eight deploys at once against acme's quota of 3 deployments (less
    // what earlier tests left deployed).
    let before = h.json(ACME, &["list"])["deployments"]
        .as_array()
        .map_or(0, Vec::len);
    let manifests: Vec<Hostile> = (0..8)
        .map(|i| hostile(fleet.dir.path(), "acme", &format!("race{i}")))
        .collect();
    // Split over two hosts: admission must be atomic across hosts, not
    // only within one (before: each host admitted up to the quota).
    let h2 = fleet.start_host("doors2");
    let children: Vec<Child> = manifests
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let server = if i % 2 == 0 { &h.server } else { &h2.server };
            onceflow()
                .args(["deploy", path(&m.manifest), "--server", server])
                .env("ONCEFLOW_TOKEN", ACME)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start onceflow deploy")
        })
        .collect();
    let outcomes: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().expect("deploy finished"))
        .collect();
    let admitted = outcomes.iter().filter(|o| o.status.success()).count();
    // A deploy through h2 returns once h2's registry has it: h's view may
    // lag behind (more so on a busy machine), so wait for it to hold what
    // was admitted, then count.
    let listed_now = || {
        let list = h.json(ACME, &["list"]);
        let n = list["deployments"].as_array().map_or(0, Vec::len);
        (list, n)
    };
    let caught_up = Instant::now() + Duration::from_secs(60);
    let (list, listed) = loop {
        let (list, n) = listed_now();
        if n >= admitted + before || Instant::now() >= caught_up {
            break (list, n);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    figure("door_quota_race_admitted_of_8_quota_3", admitted);
    let refusals: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .collect();
    check(
        admitted + before == 3
            && listed == 3
            && refusals.iter().all(|e| e.contains("quota exceeded")),
        format!(
            "8 concurrent deploys through two hosts against a quota of 3 ({before} deployed \
             before): {admitted} admitted, {listed} listed, refusals {refusals:?}"
        ),
    );

    // Twelve long polls of one tenant's logs at once: eight wait, the rest
    // are refused at once.
    let name = manifests
        .iter()
        .zip(&outcomes)
        .find(|(_, o)| o.status.success())
        .map(|(m, _)| m.name.clone())
        .or_else(|| list["deployments"][0]["name"].as_str().map(str::to_owned))
        .expect("a deployment of acme");
    let polls: Vec<_> = (0..12)
        .map(|_| {
            let url = format!(
                "{}/v1/deployments/{name}/logs?from=999999999999&wait_ms=20000",
                h.server
            );
            std::thread::spawn(move || {
                let started = Instant::now();
                let status = reqwest::blocking::Client::new()
                    .get(url)
                    .bearer_auth(ACME)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .map(|r| r.status().as_u16())
                    .unwrap_or(0);
                (status, started.elapsed())
            })
        })
        .collect();
    // Meanwhile another tenant's call is answered at once.
    std::thread::sleep(Duration::from_secs(2));
    let started = Instant::now();
    h.json(GLOBEX, &["list"]);
    figure(
        "door_other_tenant_list_during_long_polls_ms",
        started.elapsed().as_millis(),
    );
    let answers: Vec<(u16, Duration)> =
        polls.into_iter().map(|t| t.join().expect("poll")).collect();
    let refused: Vec<&(u16, Duration)> = answers.iter().filter(|(s, _)| *s == 429).collect();
    check(
        refused.len() == 4 && refused.iter().all(|(_, took)| *took < wait),
        format!("12 long polls of one tenant's logs at once: {answers:?}"),
    );
    // The registry outlives the test: leave acme's quota free for the next.
    for (m, o) in manifests.iter().zip(&outcomes) {
        if o.status.success() {
            h.cli(ACME, &["delete", &m.name, "--purge-state"]);
        }
    }
    h2.stop();
    h.stop();
    assert!(open.is_empty(), "doors still open:\n{}", open.join("\n"));
}

/// A deployment in a restart loop (here: a guest whose `init` always
/// fails) is `failing` in `describe`, `list` and `/metrics`, with the
/// error that restarts it. Before, it said `running` while no record was
/// ever processed.
#[test]
fn j_a_restart_loop_shows_as_failing() {
    let _g = serial();
    let fleet = Fleet::new();
    let h = fleet.start_host("failing1");
    let evil = hostile(fleet.dir.path(), "acme", "failing");
    let text = std::fs::read_to_string(&evil.manifest).expect("manifest");
    std::fs::write(
        &evil.manifest,
        format!("{text}\n[config]\nfail-init = \"no way\"\n"),
    )
    .expect("write");
    h.json(ACME, &["deploy", path(&evil.manifest)]);
    let producer = common::cluster::plain_producer(cluster());
    common::cluster::send(&producer, &evil.input, "k", "ok");
    let mut last = Value::Null;
    let took = wait_for(
        "the deployment to show as failing",
        Duration::from_secs(120),
        || {
            last = h.json(ACME, &["describe", &evil.name]);
            last["status"] == "failing"
        },
    );
    figure("door_restart_loop_failing_after_s", took.as_secs());
    let errors = last["hosts"][0]["last_errors"].to_string();
    assert!(errors.contains("init failed on purpose: no way"), "{last}");
    let list = h.json(ACME, &["list"]);
    assert!(list.to_string().contains("\"failing\""), "{list}");
    let metrics = h.metrics(ACME);
    let line = metrics
        .lines()
        .find(|l| l.starts_with("onceflow_failing{") && l.contains(&evil.name))
        .unwrap_or_else(|| panic!("no onceflow_failing series:\n{metrics}"));
    assert!(line.ends_with(" 1"), "{line}");
    h.json(ACME, &["delete", &evil.name, "--purge-state"]);
    h.stop();
}

#[test]
fn k_https_token_rotation_and_reload() {
    let _g = serial();
    let fleet = Fleet::new();
    let tls = TestTls::make(fleet.dir.path());

    // A certificate that cannot be used stops the host before any Kafka
    // work, naming the file.
    let mut bad = fleet.spawn_host(
        "tls-bad",
        &cluster().bootstrap,
        &["--tls-cert", path(&tls.cert), "--tls-key", path(&tls.ca)],
    );
    let status = bad
        .wait_exit(Duration::from_secs(30))
        .expect("a host with a bad key exits");
    assert_eq!(status.code(), Some(2), "{}", bad.log_text());
    assert!(bad.log_text().contains("--tls-key"), "{}", bad.log_text());

    let mut h = fleet.spawn_host_tls(
        "tls",
        &cluster().bootstrap,
        &["--host-id", "tls"],
        Some(&tls),
    );
    h.wait_healthy("tls", Duration::from_secs(90));
    assert!(h.server.starts_with("https://"), "{}", h.server);
    // The CLI with the CA (ONCEFLOW_CA_CERT, set by `cli`) works.
    let list = h.json(ACME, &["list"]);
    assert!(list.is_array() || list.is_object(), "{list}");

    // Without the CA: refused, saying what to pass.
    let out = onceflow()
        .args(["list", "--server", &h.server])
        .env("ONCEFLOW_TOKEN", ACME)
        .output()
        .expect("run onceflow");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "trusted an unknown CA");
    assert!(err.contains("--ca-cert"), "{err}");
    figure("tls_without_ca", err.lines().next().unwrap_or(""));
    // Plain http to the https port: refused, saying to use https.
    let plain = h.server.replace("https://", "http://");
    let out = onceflow()
        .args(["list", "--server", &plain])
        .env("ONCEFLOW_TOKEN", ACME)
        .output()
        .expect("run onceflow");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "plain http was served");
    assert!(err.contains("https://"), "{err}");
    figure("tls_plain_http", err.lines().next().unwrap_or(""));
    // --ca-cert with an http:// server is a usage error.
    let out = onceflow()
        .args(["list", "--server", &plain, "--ca-cert", path(&tls.ca)])
        .env("ONCEFLOW_TOKEN", ACME)
        .output()
        .expect("run onceflow");
    assert_eq!(out.status.code(), Some(2));

    // Rotation: the new token is added beside the old, without a restart.
    const ACME_NEXT: &str = "acme-token-rotated";
    let hash = onceflow::fleet::tenancy::hash_token;
    let both = format!("[\"{}\", \"{}\"]", hash(ACME), hash(ACME_NEXT));
    fleet.write_tenants(&tenants_toml(&both));
    let took = wait_for(
        "the new token to be accepted",
        Duration::from_secs(30),
        || h.cli(ACME_NEXT, &["list"]).status.success(),
    );
    figure("tenants_reload_s", format!("{:.1}", took.as_secs_f64()));
    h.json(ACME, &["list"]);
    // The old token is dropped: refused from then on.
    fleet.write_tenants(&tenants_toml(&format!("\"{}\"", hash(ACME_NEXT))));
    wait_for(
        "the old token to be refused",
        Duration::from_secs(30),
        || !h.cli(ACME, &["list"]).status.success(),
    );
    let err = h.refused(ACME, &["list"]);
    assert!(err.contains("HTTP 401"), "{err}");
    h.json(ACME_NEXT, &["list"]);
    h.json(GLOBEX, &["list"]);

    // A tenant removed from tenants.toml: its deployments stop at their
    // next commit boundary, and start again from their committed offsets
    // when it is put back. Before: they ran on, with no CPU share at all
    // (1.77 cores), and only the token was revoked.
    let removed = hostile(fleet.dir.path(), "initech", "removed");
    h.json(INITECH, &["deploy", path(&removed.manifest)]);
    let out = removed.input.replace("hostile-in-", "hostile-out-");
    let producer = common::cluster::plain_producer(cluster());
    common::cluster::send(&producer, &removed.input, "k", "ordinary");
    wait_for("initech's first output", Duration::from_secs(90), || {
        cluster().records_and_bytes(&out).0 >= 1
    });
    let with_initech = tenants_toml(&format!("\"{}\"", hash(ACME_NEXT)));
    let initech_at = with_initech
        .find("[[tenant]]\nname = \"initech\"")
        .expect("initech in tenants.toml");
    let written = Instant::now();
    fleet.write_tenants(&with_initech[..initech_at]);
    let stopped = |h: &HostProc| {
        h.log_text()
            .lines()
            .any(|l| l.contains(" stopped deployment=") && l.contains(&removed.name))
    };
    wait_for(
        "the removed tenant's deployment to stop",
        Duration::from_secs(60),
        || stopped(&h),
    );
    figure(
        "removed_tenant_stopped_s",
        format!("{:.1}", written.elapsed().as_secs_f64()),
    );
    assert!(
        h.log_text()
            .contains("the tenant is not in tenants.toml any more"),
        "{}",
        h.log_text()
    );
    let err = h.refused(INITECH, &["list"]);
    assert!(err.contains("HTTP 401"), "{err}");
    // Sent while it is stopped: processed once it is back.
    common::cluster::send(&producer, &removed.input, "k", "ordinary");
    fleet.write_tenants(&with_initech);
    wait_for(
        "the restored tenant's deployment to process what came meanwhile",
        Duration::from_secs(90),
        || cluster().records_and_bytes(&out).0 >= 2,
    );
    h.json(INITECH, &["delete", &removed.name]);

    // A bad edit is logged and ignored: the tenants in force stay.
    fleet.write_tenants("[[tenant]]\nname = \"acme\"\n");
    wait_for("the bad edit to be logged", Duration::from_secs(30), || {
        h.log_text().contains("cannot be used")
    });
    h.json(ACME_NEXT, &["list"]);
    h.json(GLOBEX, &["list"]);
    assert!(h.exited().is_none(), "the host stopped on a bad edit");
    h.stop();
}

/// The latest value of each key in `_onceflow.artifacts` (`None`: a
/// tombstone).
fn artifact_records() -> HashMap<String, Option<usize>> {
    use rdkafka::Message;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &cluster().bootstrap)
        .set("group.id", "onceflow-test-artifacts")
        .set("enable.partition.eof", "true")
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("_onceflow.artifacts", 0, rdkafka::Offset::Beginning)
        .expect("partition");
    consumer.assign(&tpl).expect("assign");
    let mut latest = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                latest.insert(key, m.payload().map(<[u8]>::len));
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => return latest,
            _ => {}
        }
    }
    panic!("did not read _onceflow.artifacts to its end in 60 s");
}

/// How long `l_artifact_quota_and_collection`'s host keeps an unused
/// upload: three uploads (each compiled by the host) must fit in it.
const ARTIFACT_GRACE: Duration = Duration::from_secs(10);

/// A tenant's uploads count against its `artifact-mb` quota, and the ones
/// none of its deployments runs are collected after the grace period,
/// chunks and all; a component a deployment runs is kept. Before: no
/// quota, nothing ever collected (12 uploads of 20 MB accepted in 10 s).
#[test]
fn l_artifact_quota_and_collection() {
    let _g = serial();
    let fleet = Fleet::new();
    let mut h = fleet.spawn_host(
        "gc1",
        &cluster().bootstrap,
        &[
            "--host-id",
            "gc1",
            "--artifact-grace-secs",
            &ARTIFACT_GRACE.as_secs().to_string(),
        ],
    );
    h.wait_healthy("gc1", Duration::from_secs(90));
    // A deployment of initech's: its component is in use.
    let used = hostile(fleet.dir.path(), "initech", "gc");
    h.json(INITECH, &["deploy", path(&used.manifest)]);
    let used_size = std::fs::metadata(
        build_guest("tests/guests/hostile/onceflow.toml")
            .parent()
            .expect("dir")
            .join("target/onceflow/hostile.wasm"),
    )
    .expect("the built hostile guest")
    .len() as usize;
    // Two uploads that fit beside it in 4 MiB, and a third that does not;
    // each padded to a digest of its own.
    let base = wallet_component();
    let pad = ((4 << 20) - used_size) / 2 - base.len() - 20_000 - 1024;
    let client = reqwest::blocking::Client::new();
    let salt = std::process::id() as usize % 1000;
    let upload = |i: usize| -> (u16, Value) {
        let r = client
            .post(format!("{}/v1/artifacts", h.server))
            .bearer_auth(INITECH)
            .body(padded(&base, pad + salt + i))
            .send()
            .expect("upload");
        let status = r.status().as_u16();
        (status, r.json().unwrap_or(Value::Null))
    };
    let digest = |v: &Value| v["artifact"].as_str().unwrap_or_default().to_owned();
    // Each upload is compiled by the host: three of them take seconds, more
    // on a slow or busy machine, and the first two must still be within
    // the grace period when the third is checked.
    let uploads_started = Instant::now();
    let (s1, first) = upload(1);
    let (s2, second) = upload(2);
    let second_stored = Instant::now();
    assert!(
        s1 < 300 && s2 < 300,
        "two uploads within the quota: {first} {second}"
    );
    let (s3, refused) = upload(3);
    let three_took = uploads_started.elapsed();
    figure(
        "artifact_three_uploads_s",
        format!("{:.1}", three_took.as_secs_f64()),
    );
    assert!(
        three_took < ARTIFACT_GRACE,
        "three uploads took {three_took:?}, past the {ARTIFACT_GRACE:?} grace period: the first two \
         may have been collected before the third was checked (a machine this slow or loaded \
         needs a longer ARTIFACT_GRACE)"
    );
    println!("over the quota: HTTP {s3} {refused}");
    let message = refused.to_string();
    assert!(
        s3 == 403
            && message.contains("quota exceeded")
            && message.contains("artifact-mb quota of 4 MiB"),
        "a third upload past 4 MiB: HTTP {s3} {refused}"
    );
    // Past the grace period, the same upload collects the two unused ones.
    let collectable = second_stored + ARTIFACT_GRACE + Duration::from_secs(1);
    std::thread::sleep(collectable.saturating_duration_since(Instant::now()));
    let (s4, third) = upload(3);
    assert!(s4 < 300, "the upload after collection: HTTP {s4} {third}");
    let (a1, a2) = (digest(&first), digest(&second));
    let records = artifact_records();
    for sha in [&a1, &a2] {
        assert_eq!(
            records.get(&format!("{sha}/index")),
            Some(&None),
            "component {sha} was not collected"
        );
        assert_eq!(
            records.get(&format!("{sha}/0")),
            Some(&None),
            "its chunks stay"
        );
    }
    let running = h.json(INITECH, &["describe", &used.name]);
    let used_sha = running["artifact"].as_str().expect("artifact").to_owned();
    assert!(
        records
            .get(&format!("{used_sha}/index"))
            .is_some_and(Option::is_some),
        "the component a deployment runs was collected"
    );
    // A collected component can no longer be deployed by its digest.
    let answer = client
        .put(format!("{}/v1/deployments/{}", h.server, used.name))
        .bearer_auth(INITECH)
        .json(&serde_json::json!({
            "manifest": std::fs::read_to_string(&used.manifest).expect("manifest"),
            "artifact": a1,
        }))
        .send()
        .map(|r| (r.status().as_u16(), r.text().unwrap_or_default()));
    assert!(
        answer
            .as_ref()
            .is_ok_and(|(status, text)| *status == 422 && text.contains("was not uploaded")),
        "deploying a collected component: {answer:?}"
    );
    figure("door_artifact_quota_refusal_status", s3);
    h.json(INITECH, &["delete", &used.name, "--purge-state"]);
    h.stop();
}

/// A memory figure of process `pid` (`VmHWM:`, `VmRSS:`), in MiB.
/// The OS threads of process `pid`.
fn thread_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count() as u64)
}

fn status_mb(pid: u32, field: &str) -> u64 {
    common::status_bytes(&format!("/proc/{pid}/status"), field) >> 20
}

/// Issue 45, item 3, on a fleet host: a tenant's deployment whose one
/// poll's batch emits 600 outputs of 999 KB (`max-batch-records =
/// 100000`) stays within the tenant's `held-mb = 64` (the batch committed
/// in parts: every output once), and the host gives the memory back once
/// the deployment is deleted. Before, such a batch was held whole: 2,500
/// outputs took a host to 3.86 GB.
#[test]
fn m_memory_held_per_tenant_and_returned_after_delete() {
    let _g = serial();
    let fleet = Fleet::new();
    let acme = format!("\"{}\"", onceflow::fleet::tenancy::hash_token(ACME));
    let text = tenants_toml(&acme).replace(
        "memory-mb = 64\n",
        "memory-mb = 64\nheld-mb = 64\nhost-held-mb = 128\n",
    );
    assert!(text.contains("held-mb = 64"));
    fleet.write_tenants(&text);
    let h = fleet.start_host("mem");
    let pid = h.child.id();
    let base = status_mb(pid, "VmRSS:");
    let evil = hostile(fleet.dir.path(), "globex", "mem");
    let manifest = std::fs::read_to_string(&evil.manifest).expect("manifest");
    std::fs::write(
        &evil.manifest,
        manifest.replace("max-batch-records = 10\n", "max-batch-records = 100000\n"),
    )
    .expect("manifest");
    let n = 600;
    let producer = common::cluster::plain_producer(cluster());
    for _ in 0..n {
        producer
            .send(
                rdkafka::producer::BaseRecord::to(&evil.input)
                    .key("k")
                    .payload("output:999000"),
            )
            .expect("send");
    }
    rdkafka::producer::Producer::flush(&producer, Duration::from_secs(30)).expect("flush");
    h.json(GLOBEX, &["deploy", path(&evil.manifest)]);
    let out = evil.input.replace("hostile-in-", "hostile-out-");
    wait_for("the outputs committed", Duration::from_secs(180), || {
        committed_records(&out) >= n
    });
    // Committed in parts: more transactions (one marker each) than the
    // one batch.
    let markers = committed_records(&out) - n;
    figure("mem_flood_transactions", markers);
    assert!(
        markers > 1,
        "the batch was committed in {markers} transaction(s)"
    );
    let peak = status_mb(pid, "VmHWM:");
    h.json(GLOBEX, &["delete", &evil.name, "--purge-state"]);
    std::thread::sleep(Duration::from_secs(5));
    let after = status_mb(pid, "VmRSS:");
    let (records, bytes) = cluster().records_and_bytes(&out);
    assert_eq!(records, n as u64, "every output once");
    assert_eq!(
        bytes,
        n as u64 * (999_000 + 1),
        "every output whole (value and key)"
    );
    figure("mem_host_base_rss_mb", base);
    figure("mem_flood_output_mb", (n as u64 * 999_000) >> 20);
    figure("mem_host_peak_rss_mb", peak);
    figure("mem_host_rss_after_delete_mb", after);
    // The host (its control plane, wasmtime, librdkafka) plus the budget,
    // one part's outputs (64 MiB) and the producer's copies of them; before,
    // the whole batch twice (2 GB for 1,000 outputs).
    assert!(
        peak < base + 400,
        "the host peaked at {peak} MiB (from {base} MiB) for 572 MiB of outputs with held-mb = 64"
    );
}

/// Issue 42 item 5 (eos-audit-3 finding 6): a commit whose answer is lost
/// (it committed; the worker cannot know) is neither billed twice nor left
/// out. The host loses the answers to its first 4 commits
/// (`--fault-lose-commit-answers`, hidden): each time the worker replaces
/// its producer, reloads its stores and reads the input again from the
/// committed offsets. Every counter of `onceflow usage` is then exact
/// against an independent count: input, outputs and changelog from the
/// topics, fuel and log lines from the host's own `/metrics` (what its
/// guests burned, aborted attempts included). Before, the fuel of every
/// such commit was billed again with the next one.
#[test]
fn n_usage_exact_through_lost_commit_answers() {
    const LOST: usize = 4;
    let _g = serial();
    let fleet = Fleet::new();
    let mut h = fleet.spawn_host(
        "lost",
        &cluster().bootstrap,
        &[
            "--host-id",
            "lost",
            "--fault-lose-commit-answers",
            &LOST.to_string(),
        ],
    );
    h.wait_healthy("lost", Duration::from_secs(90));
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "lost", "exactly_once_v2", 3);
    h.json(ACME, &["deploy", path(&w.manifest)]);
    let mut produced = produce_paced(&w, 0, 3_000, Duration::from_secs(6));
    produced.absorb(w.produce(3_000, 300, 50, Some(29)));
    w.wait_done(Duration::from_secs(180));
    let report = w.verify(false);
    assert_exact(&report, &produced, "commit answers lost");
    let log = h.log_text();
    let injected = log
        .matches("fault injected: the commit's answer is lost")
        .count();
    let unknown = log.matches("the transaction's outcome is unknown").count();
    figure("usage_lost_commit_answers", injected);
    assert_eq!(injected, LOST, "the faults injected:\n{log}");
    assert!(
        unknown >= LOST,
        "{unknown} unknown outcomes handled:\n{log}"
    );

    let usage = h.json(ACME, &["usage"]);
    let row = usage["deployments"]
        .as_array()
        .and_then(|d| d.iter().find(|x| x["deployment"] == w.name.as_str()))
        .unwrap_or_else(|| panic!("no usage for {}: {usage}", w.name))
        .clone();
    let billed = |field: &str| row[field].as_u64().unwrap_or(0);
    let (inputs, input_bytes) = cluster().records_and_bytes(&w.payments);
    let (mut outputs, mut output_bytes) = (0, 0);
    for t in [&w.audit, &w.balances, &w.dlq] {
        let (n, b) = cluster().records_and_bytes(t);
        outputs += n;
        output_bytes += b;
    }
    let changelog = format!("{}-balances-changelog", w.app);
    let state_bytes = cluster().records_and_bytes(&changelog).1;
    let metrics = h.metrics(ACME);
    let metric = |name: &str| series_of(&metrics, name, &w.name) as u64;
    let fuel = metric("onceflow_fuel_total");
    let log_lines = metric("onceflow_log_lines_total");
    let mut wrong = Vec::new();
    for (field, independent) in [
        ("records_in", inputs),
        ("bytes_in", input_bytes),
        ("records_out", outputs),
        ("bytes_out", output_bytes),
        ("state_bytes", state_bytes),
        ("dead_letters", report.dead_letters),
        ("fuel", fuel),
        ("log_lines", log_lines),
    ] {
        figure(
            &format!("usage_exact_{field}"),
            format!("{} (independent: {independent})", billed(field)),
        );
        if billed(field) != independent {
            wrong.push(format!(
                "{field}: billed {} vs {independent}",
                billed(field)
            ));
        }
    }
    assert!(wrong.is_empty(), "usage not exact: {wrong:?}\n{row}");
    assert!(fuel > 0 && report.dead_letters > 0, "{row}");
    h.json(ACME, &["delete", &w.name, "--purge-state"]);
    h.stop();
}

/// The issue-42 drill "rolling restart of the hosts", as an upgrade of the
/// host binary does it, with issue 43's drain: every host of a 3-host fleet
/// stopped (SIGTERM), down for 8 s, then started again, one after another,
/// under a steady load; `ONCEFLOW_ROLLING_PASSES` times (default 1;
/// scripts/drill --rolling-hosts runs 2).
///
/// Each stop is a drain: the host exits 0 having handed its partitions
/// over, so the group no longer lists its workers the moment it exits.
/// The sessions are 30 s long on purpose: a host that only closed its
/// static members (as before the drain) would still be listed, its
/// partitions waiting, for 30 s. The first drain is held 8 s
/// (`--fault-drain-hold-ms`) to see its first step: `/healthz` answers 503
/// `draining`, a deploy sent to it is refused with 503 naming the drain,
/// and reads are still answered. Exact at the end; the standbys
/// (`standby-replicas = 2`: hosts - 1, so that wherever the group's
/// assignor puts a drained host's partitions there is a warm copy; with 1
/// it may put every one elsewhere, as one CI run saw) take them over;
/// figures: restarts,
/// standby takeovers, the longest drain, and the longest time the
/// deployment's committed input did not move while payments waited (the
/// bound asserted is loose, 60 s: the figure is the measure).
#[test]
fn o_rolling_restart_of_the_hosts() {
    let _g = serial();
    let passes: u32 = std::env::var("ONCEFLOW_ROLLING_PASSES")
        .ok()
        .map(|v| {
            v.parse()
                .expect("ONCEFLOW_ROLLING_PASSES: a number of passes")
        })
        .unwrap_or(1);
    let fleet = Fleet::new();
    let names = ["r1", "r2", "r3"];
    let start = |name: &str, hold: bool| -> HostProc {
        let mut args = vec!["--host-id", name, "--session-timeout-ms", "30000"];
        if hold {
            args.extend(["--fault-drain-hold-ms", "8000"]);
        }
        let mut host = fleet.spawn_host(name, &cluster().bootstrap, &args);
        host.wait_healthy(name, Duration::from_secs(90));
        host
    };
    let mut hosts: Vec<Option<HostProc>> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Some(start(n, i == 0)))
        .collect();
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "roll", "exactly_once_v2", 6);
    let text = std::fs::read_to_string(&w.manifest).expect("manifest");
    assert!(text.contains("commit-interval-ms = 100\n"), "{text}");
    std::fs::write(
        &w.manifest,
        text.replace(
            "commit-interval-ms = 100\n",
            "commit-interval-ms = 100\nstandby-replicas = 2\n",
        ),
    )
    .expect("write the manifest");
    let mut produced = w.produce(0, 1, 500, None);
    hosts[0]
        .as_ref()
        .expect("r1 runs")
        .json(ACME, &["deploy", path(&w.manifest)]);
    wait_for(
        "every host owns partitions",
        Duration::from_secs(120),
        || {
            let d = hosts[0]
                .as_ref()
                .expect("r1")
                .json(ACME, &["describe", &w.name]);
            let hosts = d["hosts"].as_array().cloned().unwrap_or_default();
            hosts
                .iter()
                .filter(|h| h["partitions"].as_array().is_some_and(|p| !p.is_empty()))
                .count()
                == 3
        },
    );
    w.wait_done(Duration::from_secs(120));

    // The load, and a watch on the committed input: the longest stretch
    // with payments waiting and nothing committed.
    let restarts = 3 * passes as u64;
    let per_restart = Duration::from_secs(10);
    let load_for = per_restart * restarts as u32 + Duration::from_secs(10);
    let stop_watch = std::sync::atomic::AtomicBool::new(false);
    let mut longest_stall = Duration::ZERO;
    let mut longest_drain = 0u64;
    std::thread::scope(|scope| {
        // A failed assertion below unwinds out of the scope, which waits
        // for the watch: it must stop then too, or the suite hangs.
        let _stop_watch = SetOnDrop(&stop_watch);
        let load = scope.spawn(|| produce_paced(&w, 1, 500 * load_for.as_secs(), load_for));
        let watch = scope.spawn(|| {
            let mut longest = Duration::ZERO;
            let mut moved = Instant::now();
            let mut last = -1;
            while !stop_watch.load(std::sync::atomic::Ordering::Relaxed) {
                let (committed, end) = w.cluster.progress(&w.app, &w.payments);
                if committed != last || committed >= end {
                    last = committed;
                    moved = Instant::now();
                }
                longest = longest.max(moved.elapsed());
                std::thread::sleep(Duration::from_millis(100));
            }
            longest
        });
        for pass in 0..passes {
            for (i, name) in names.iter().enumerate() {
                let started = Instant::now();
                let mut host = hosts[i].take().expect("the host runs");
                host.terminate();
                if pass == 0 && i == 0 {
                    // The drain's first step (held 8 s): no new work.
                    wait_for("r1 says it drains", Duration::from_secs(30), || {
                        host.health()
                            .is_some_and(|(code, status)| code == 503 && status == "draining")
                    });
                    let refused = host.refused(ACME, &["deploy", path(&w.manifest)]);
                    assert!(
                        refused.contains("is draining") && refused.contains("503"),
                        "a deploy to a draining host: {refused}"
                    );
                    let d = host.json(ACME, &["describe", &w.name]);
                    assert_eq!(d["name"], w.name.as_str(), "{d}");
                }
                let status = host.wait_exit(Duration::from_secs(90));
                let log = host.log_text();
                assert!(
                    status.is_some_and(|s| s.success()),
                    "{name} did not drain and exit 0 within 90 s ({status:?}):\n{log}"
                );
                let drain = log
                    .lines()
                    .rev()
                    .find(|l| l.contains("host drained"))
                    .and_then(|l| l.split("ms=").nth(1))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or_else(|| panic!("{name} did not log its drain:\n{log}"));
                longest_drain = longest_drain.max(drain);
                // Handed over: its workers left the group (a closed static
                // member stays listed for its 30 s session).
                let members = group_client_ids(&w.app);
                let instance = format!("-{name}-");
                assert!(
                    !members.iter().any(|c| c.contains(&instance)),
                    "{name} exited but the group still lists its workers: {members:?}"
                );
                // Down long enough for the group to settle on the others: two
                // rebalances a moment apart can abort librdkafka 2.12's consumer
                // (confluentinc/librdkafka#5573, docs/operations.md "Known limits").
                std::thread::sleep(Duration::from_secs(8));
                hosts[i] = Some(start(name, false));
                println!(
                    "rolling pass {pass}: {name} drained in {drain} ms and restarted ({} ms)",
                    started.elapsed().as_millis()
                );
                // The next drain waits for the group to take the restarted
                // host back (it owns partitions again) and a moment more:
                // a drain's leave right behind that rebalance aborted a host
                // in librdkafka 2.12 (#5573, "Assertion rktp->rktp_started";
                // a CI run of 527a585 here).
                if let Some(back) = hosts[i].as_ref() {
                    wait_for(
                        "the restarted host to own partitions again",
                        Duration::from_secs(90),
                        || owns_partitions(back, &w.name, name),
                    );
                    std::thread::sleep(Duration::from_secs(3));
                }
                if let Some(rest) = per_restart.checked_sub(started.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
        }
        produced.absorb(load.join().expect("the load"));
        w.wait_done(Duration::from_secs(180));
        stop_watch.store(true, std::sync::atomic::Ordering::Relaxed);
        longest_stall = watch.join().expect("the watch");
    });
    let logs: String = names
        .iter()
        .map(|n| {
            std::fs::read_to_string(fleet.dir.path().join(format!("{n}.log"))).unwrap_or_default()
        })
        .collect();
    let takeovers = logs
        .matches("taking over the partition's standby stores")
        .count();
    // A drained host's workers committed before they left: nobody fences
    // them (a late fence would hit the host back under the same id).
    let fenced = logs.matches("fenced a departed instance's worker").count();
    let spared = logs.matches("not fencing a departed worker").count();
    let report = w.verify(false);
    figure("rolling_host_restarts", restarts);
    figure("rolling_standby_takeovers", takeovers);
    figure("rolling_records_verified", report.valid);
    figure("rolling_longest_drain_ms", longest_drain);
    figure("rolling_longest_stall_ms", longest_stall.as_millis());
    figure("rolling_departed_workers_not_fenced", spared);
    assert_exact(&report, &produced, "rolling restarts of the hosts");
    assert_eq!(fenced, 0, "a drained host's workers were fenced:\n{logs}");
    assert!(
        takeovers > 0,
        "no standby took over a partition of a stopped host"
    );
    assert!(
        longest_stall < Duration::from_secs(60),
        "the deployment's input stood still for {longest_stall:?}"
    );
    // The others drain first (their workers leave), so that the purge
    // does not wait for their 30 s sessions.
    let last = hosts[0].take().expect("r1");
    for h in hosts.into_iter().flatten() {
        h.stop();
    }
    last.json(ACME, &["delete", &w.name, "--purge-state"]);
    last.stop();
}

/// Interactive queries from the owners' stores (issue 43, item 2): two
/// hosts share a wallet's four partitions; every account's balance asked
/// of one host comes from both hosts' local stores (the other's over its
/// internal endpoint) and equals both the payments' total and the
/// changelog scan's answer; prefix and range scans merge the partitions in
/// key order; another tenant's token is refused at both doors; and while
/// the second host stops, a query either waits for the new owner or
/// answers 503 saying why, and then answers from the survivor's stores.
#[test]
fn p_queries_are_answered_by_the_owners_stores() {
    let _g = serial();
    let fleet = Fleet::new();
    let q1 = fleet.start_host("q1");
    let q2 = fleet.start_host("q2");
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "iq", "exactly_once_v2", 4);
    let produced = w.produce(0, 400, 40, None);
    q1.json(ACME, &["deploy", path(&w.manifest)]);
    wait_for(
        "both hosts own partitions",
        Duration::from_secs(120),
        || {
            let d = q1.json(ACME, &["describe", &w.name]);
            d["hosts"].as_array().is_some_and(|hosts| {
                hosts
                    .iter()
                    .filter(|h| h["partitions"].as_array().is_some_and(|p| !p.is_empty()))
                    .count()
                    == 2
            })
        },
    );
    w.wait_done(Duration::from_secs(120));
    assert_eq!(produced.totals.len(), 40);

    // Every account, asked of q1: one value, from the stores of both.
    let mut answered_by = std::collections::BTreeSet::new();
    for (account, total) in &produced.totals {
        let q = q1.json(ACME, &["query", &w.name, "balances", account]);
        assert_eq!(q["source"], "stores", "{q}");
        let values = q["values"].as_array().cloned().unwrap_or_default();
        assert_eq!(values.len(), 1, "{account}: {q}");
        assert_eq!(
            values[0]["value"].as_str().unwrap_or_default().trim(),
            total.to_string(),
            "{account}: {q}"
        );
        for h in q["hosts"].as_array().cloned().unwrap_or_default() {
            answered_by.insert(h.as_str().unwrap_or_default().to_owned());
        }
    }
    assert_eq!(
        answered_by.iter().map(String::as_str).collect::<Vec<_>>(),
        vec!["q1", "q2"],
        "both hosts' stores answered"
    );
    // The changelog scan (the old path) agrees.
    let (account, total) = produced.totals.iter().next().expect("an account");
    let scan = q2.json(
        ACME,
        &["query", &w.name, "balances", account, "--from-changelog"],
    );
    assert_eq!(scan["source"], "changelog", "{scan}");
    assert_eq!(
        scan["values"][0]["value"]
            .as_str()
            .unwrap_or_default()
            .trim(),
        total.to_string(),
        "{scan}"
    );

    // Scans merge the partitions in key order.
    let prefix = q2.json(ACME, &["query", &w.name, "balances", "--prefix", "acct-00"]);
    let entries = prefix["entries"].as_array().cloned().unwrap_or_default();
    let keys: Vec<String> = entries
        .iter()
        .map(|e| e["key"].as_str().unwrap_or_default().to_owned())
        .collect();
    let expected: Vec<String> = produced.totals.keys().cloned().collect();
    assert_eq!(keys, expected, "{prefix}");
    for e in &entries {
        let key = e["key"].as_str().unwrap_or_default();
        assert_eq!(
            e["value"].as_str().unwrap_or_default().trim(),
            produced.totals[key].to_string(),
            "{e}"
        );
    }
    let range = q1.json(
        ACME,
        &[
            "query",
            &w.name,
            "balances",
            "--from",
            "acct-0010",
            "--to",
            "acct-0020",
        ],
    );
    assert_eq!(
        range["entries"].as_array().map_or(0, Vec::len),
        10,
        "{range}"
    );
    let limited = q1.json(
        ACME,
        &[
            "query", &w.name, "balances", "--prefix", "acct-", "--limit", "5",
        ],
    );
    assert_eq!(
        limited["entries"].as_array().map_or(0, Vec::len),
        5,
        "{limited}"
    );
    assert_eq!(limited["truncated"], true, "{limited}");

    // Another tenant reads neither through the public door nor the hosts'.
    let err = q1.refused(GLOBEX, &["query", &w.name, "balances", account]);
    assert!(err.contains("HTTP 404"), "{err}");
    let internal = |token: Option<&str>| {
        let mut r = q2
            .client
            .post(format!(
                "{}/v1/internal/deployments/{}/state/balances",
                q2.server, w.name
            ))
            .json(&serde_json::json!({
                "partitions": [0, 1, 2, 3],
                "read": {"kind": "prefix", "prefix": "", "limit": 100},
            }));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send().expect("the internal endpoint answers")
    };
    assert_eq!(internal(Some(GLOBEX)).status().as_u16(), 404);
    assert_eq!(internal(None).status().as_u16(), 401);
    assert!(internal(Some(ACME)).status().is_success());

    // q2 stops: a query waits for the new owner (or says why it cannot
    // answer yet), then q1's stores answer everything.
    q2.stop();
    let mut retryable = 0;
    let started = Instant::now();
    wait_for(
        "q1 alone answers every partition",
        Duration::from_secs(120),
        || {
            let out = q1.cli(
                ACME,
                &["query", &w.name, "balances", account, "--output", "json"],
            );
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                assert!(err.contains("HTTP 503") && err.contains("retry"), "{err}");
                retryable += 1;
                return false;
            }
            let q: Value = serde_json::from_slice(&out.stdout).expect("JSON");
            assert_eq!(
                q["values"][0]["value"].as_str().unwrap_or_default().trim(),
                total.to_string(),
                "{q}"
            );
            q["hosts"] == serde_json::json!(["q1"])
        },
    );
    figure("routed_query_takeover_ms", started.elapsed().as_millis());
    figure("routed_query_retryable_answers", retryable);
    q1.json(ACME, &["delete", &w.name, "--purge-state"]);
    q1.stop();
}

/// CI's short density round (issue 43; `scripts/bench density` runs the
/// stages up to 500 and keeps the figures): `DENSITY_ROUND` wallets of one
/// tenant deployed on one host, each on its own 1-partition topics, with 5
/// payments each; once all are processed they hibernate (after 6 s without
/// input, the session's length); 5 more payments each wake them; every one
/// is exact on its input. Figures, not judged: the host's RSS and threads
/// per deployment once they hibernate, and the deploys' time.
#[test]
fn q_a_short_density_round() {
    let _g = serial();
    let fleet = Fleet::new();
    let mut host = fleet.spawn_host(
        "dense1",
        &cluster().bootstrap,
        &["--host-id", "dense1", "--hibernate-after-secs", "6"],
    );
    host.wait_healthy("dense1", Duration::from_secs(90));
    let pid = host.child.id();
    let (rss0, threads0) = (status_mb(pid, "VmRSS:"), thread_count(pid));
    let wallets: Vec<Wallet> = (0..DENSITY_ROUND)
        .map(|i| {
            Wallet::in_tenant(
                cluster(),
                "dense",
                "dense.",
                &format!("d{i}"),
                "exactly_once_v2",
                1,
            )
        })
        .collect();
    let mut produced: Vec<Produced> = wallets.iter().map(|w| w.produce(0, 5, 10, None)).collect();
    let started = Instant::now();
    for w in &wallets {
        host.json(DENSE, &["deploy", path(&w.manifest)]);
    }
    for w in &wallets {
        w.wait_done(Duration::from_secs(180));
    }
    figure(
        "density_round_deployed_and_processed_ms",
        started.elapsed().as_millis(),
    );
    let asleep = || {
        let list = host.json(DENSE, &["list"]);
        list["deployments"].as_array().map_or(0, |d| {
            d.iter()
                .filter(|x| {
                    x["hosts"]
                        .as_array()
                        .is_some_and(|h| h.iter().any(|s| s["hibernating"].as_bool() == Some(true)))
                })
                .count()
        })
    };
    let waited = wait_for(
        "every deployment of the round hibernates",
        Duration::from_secs(180),
        || asleep() == DENSITY_ROUND,
    );
    figure("density_round_hibernated_after_ms", waited.as_millis());
    let per = |now: u64, before: u64| (now.saturating_sub(before)) as f64 / DENSITY_ROUND as f64;
    figure(
        "density_round_rss_mb_per_deployment",
        format!("{:.1}", per(status_mb(pid, "VmRSS:"), rss0)),
    );
    figure(
        "density_round_threads_per_deployment",
        format!("{:.1}", per(thread_count(pid), threads0)),
    );
    // The trickle wakes them.
    let woke = Instant::now();
    for (w, p) in wallets.iter().zip(produced.iter_mut()) {
        p.absorb(w.produce(5, 5, 10, None));
    }
    for w in &wallets {
        w.wait_done(Duration::from_secs(180));
    }
    figure(
        "density_round_woken_and_processed_ms",
        woke.elapsed().as_millis(),
    );
    for (w, p) in wallets.iter().zip(&produced) {
        assert_exact(&w.verify(false), p, &format!("density round, {}", w.name));
    }
    for w in &wallets {
        host.json(DENSE, &["delete", &w.name, "--purge-state"]);
    }
    host.stop();
}

/// The deployment's status from `host` as `describe` shows it: its state
/// and age in ms (`None`: no host has published one yet).
fn status_of(host: &HostProc, name: &str) -> Option<(String, i64)> {
    let d = host.json(ACME, &["describe", name]);
    let first = d["hosts"].as_array()?.first()?.clone();
    Some((
        first["state"].as_str()?.to_owned(),
        first["age_ms"].as_i64()?,
    ))
}

/// A broker fenced by its controller while its process lives: the broker
/// (a single node, so no leader for any partition then) is paused past its
/// session with the controller (9 s), twice, with payments before, between
/// and after; the deployment's status must be fresh and `running` again
/// and its output exact. The first run of an earlier form of this test on
/// the old code (b6148a6) met a deployment whose worker, restarted by the
/// pause, asked to create its tenant's log topic while the broker was
/// fenced, got InvalidReplicationFactor (the factor is the number of
/// brokers the host had just seen) and was `failed` for good; that depends
/// on timing (the next run passed), and the unit test
/// `kafka::errors::tests::timeouts_are_transient_and_refusals_are_not` pins
/// the cure (such a failure is transient: started again 10 s later). The
/// figures say whether librdkafka called the status partition leaderless
/// ("new leader-1 not found in cache", seen in the fleet drill where a
/// host's statuses stopped) and whether the control producer was replaced.
#[test]
fn r_a_fenced_broker_neither_fails_deployments_nor_stops_statuses() {
    let _g = serial();
    let fleet = Fleet::new();
    let mut host = fleet.spawn_host("fenced1", &cluster().bootstrap, &["--host-id", "fenced1"]);
    host.wait_healthy("fenced1", Duration::from_secs(90));
    let w = Wallet::in_tenant(cluster(), "acme", "acme.", "fenced", "exactly_once_v2", 2);
    let mut produced = w.produce(0, 200, 50, Some(40));
    host.json(ACME, &["deploy", path(&w.manifest)]);
    w.wait_done(Duration::from_secs(120));
    for round in 0..2u64 {
        cluster().pause_broker(1);
        std::thread::sleep(Duration::from_secs(14));
        cluster().resume_broker(1);
        produced.absorb(w.produce(1_000 * (round + 1), 200, 50, Some(40)));
    }
    let resumed = Instant::now();
    let mut last = None;
    let took = wait_for(
        "the deployment's status to be fresh and running after the broker's fences",
        Duration::from_secs(120),
        || {
            last = status_of(&host, &w.name);
            last.as_ref().is_some_and(|(state, age)| {
                state == "running" && *age < 8_000 && (*age as u128) < resumed.elapsed().as_millis()
            })
        },
    );
    figure("fenced_broker_status_fresh_again_s", took.as_secs());
    w.wait_done(Duration::from_secs(180));
    assert_exact(&w.verify(false), &produced, "a broker fenced twice");
    let log = host.log_text();
    figure(
        "fenced_broker_status_partition_leaderless",
        u8::from(log.contains("_onceflow.status") && log.contains("not found in cache")),
    );
    figure(
        "fenced_broker_control_producer_replaced",
        u8::from(log.contains("replaced it with a new one")),
    );
    host.json(ACME, &["delete", &w.name, "--purge-state"]);
    host.stop();
}
