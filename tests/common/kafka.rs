//! A real Kafka for the integration tests, started through scripts/kafka,
//! and helpers to drive `onceflow run` processes against it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::{build_guest, repo};

/// A Kafka cluster run by scripts/kafka in its own directory and ports.
pub struct Cluster {
    pub bootstrap: String,
    pub dir: PathBuf,
    pub port: u16,
    pub brokers: u32,
}

fn cache() -> PathBuf {
    std::env::var_os("ONCEFLOW_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/onceflow")
        })
}

impl Cluster {
    fn script(&self, args: &[&str]) -> std::process::Output {
        Command::new(repo().join("scripts/kafka"))
            .args(args)
            .env("ONCEFLOW_KAFKA_DIR", &self.dir)
            .env("ONCEFLOW_KAFKA_PORT", self.port.to_string())
            .env(
                "ONCEFLOW_KAFKA_CONTROLLER_PORT",
                (self.port + 1000).to_string(),
            )
            // Timed-out transactions are aborted within a second, so a
            // paused zombie's transaction does not hold readers for long.
            .env(
                "ONCEFLOW_KAFKA_EXTRA_CONFIG",
                "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
            )
            .stdin(Stdio::null())
            .output()
            .expect("run scripts/kafka")
    }

    /// Starts (or finds running) a cluster of `brokers` nodes from `port`.
    ///
    /// `ONCEFLOW_TEST_PORT_OFFSET` shifts every port and `ONCEFLOW_TEST_KAFKA_TAG`
    /// renames the run directories, so two checkouts can run their broker
    /// tests side by side on one machine.
    pub fn start(name: &str, port: u16, brokers: u32) -> Cluster {
        let offset: u16 = std::env::var("ONCEFLOW_TEST_PORT_OFFSET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let port = port + offset;
        let dir = match std::env::var("ONCEFLOW_TEST_KAFKA_TAG") {
            Ok(tag) if !tag.is_empty() => format!("kafka-tag-{tag}-{name}"),
            _ => format!("kafka-test-{name}"),
        };
        let c = Cluster {
            bootstrap: (0..brokers)
                .map(|i| format!("127.0.0.1:{}", port + i as u16))
                .collect::<Vec<_>>()
                .join(","),
            dir: cache().join(dir),
            port,
            brokers,
        };
        let out = c.script(&["up", "--brokers", &brokers.to_string()]);
        assert!(
            out.status.success(),
            "scripts/kafka up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// The single-node cluster most tests share (stopped by scripts/test).
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| Cluster::start("shared", 19092, 1))
    }

    pub fn stop_broker(&self, i: u32, signal: &str) {
        let out = self.script(&["stop-broker", &i.to_string(), "--signal", signal]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start_broker(&self, i: u32) {
        let out = self.script(&["start-broker", &i.to_string()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The brokers' view of open and hanging transactions, for a failure
    /// message.
    pub fn transactions_report(&self) -> String {
        let mut report = String::new();
        let mut run = |args: &[&str]| {
            let out = self.script(args);
            report.push_str(&format!(
                "$ scripts/kafka {}\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        };
        run(&["transactions", "list"]);
        for broker in 1..=self.brokers {
            run(&[
                "transactions",
                "find-hanging",
                "--broker-id",
                &broker.to_string(),
            ]);
        }
        report
    }

    pub fn down(&self) {
        let out = self.script(&["down"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn create_topics(&self, topics: &[(&str, i32)]) {
        let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("admin client");
        let rf = self.brokers.min(3) as i32;
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(rf)))
            .collect();
        let res = futures::executor::block_on(admin.create_topics(&new, &AdminOptions::new()))
            .expect("create topics");
        for r in res {
            r.expect("topic created");
        }
    }

    /// The next offset to read of every partition of `topic` for `group`,
    /// as committed (stable), and the partitions' ends.
    pub fn progress(&self, group: &str, topic: &str) -> (i64, i64) {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let md = c
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let mut tpl = TopicPartitionList::new();
        let mut end = 0;
        for p in md.topics()[0].partitions() {
            tpl.add_partition(topic, p.id());
            end += c
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .map(|(_, h)| h)
                .unwrap_or(0);
        }
        let committed = c
            .committed_offsets(tpl, Duration::from_secs(30))
            .map(|tpl| {
                tpl.elements()
                    .iter()
                    .map(|e| match e.offset() {
                        Offset::Offset(o) => o,
                        _ => 0,
                    })
                    .sum()
            })
            .unwrap_or(0);
        (committed, end)
    }
}

/// A wallet deployment on its own topics.
pub struct Wallet {
    pub cluster: &'static Cluster,
    pub guarantee: String,
    pub name: String,
    pub app: String,
    pub payments: String,
    pub balances: String,
    pub audit: String,
    pub dlq: String,
    pub dir: tempfile::TempDir,
    pub manifest: PathBuf,
}

/// What was produced.
#[derive(Debug, Default, Clone)]
pub struct Produced {
    pub valid: u64,
    pub invalid: u64,
    pub totals: BTreeMap<String, i64>,
}

impl Produced {
    /// Adds another production run's counts and totals.
    pub fn absorb(&mut self, other: Produced) {
        self.valid += other.valid;
        self.invalid += other.invalid;
        for (k, v) in other.totals {
            *self.totals.entry(k).or_insert(0) += v;
        }
    }
}

impl Wallet {
    pub fn new(cluster: &'static Cluster, label: &str, guarantee: &str, partitions: i32) -> Wallet {
        Self::in_tenant(cluster, "test", "", label, guarantee, partitions)
    }

    /// A wallet of `tenant` whose topics start with `topic_prefix`.
    pub fn in_tenant(
        cluster: &'static Cluster,
        tenant: &str,
        topic_prefix: &str,
        label: &str,
        guarantee: &str,
        partitions: i32,
    ) -> Wallet {
        let suffix = format!("{label}-{}-{}", std::process::id(), unique());
        let name = format!("wallet-{suffix}");
        let w = Wallet {
            cluster,
            guarantee: guarantee.to_owned(),
            app: format!("{tenant}.{name}"),
            payments: format!("{topic_prefix}payments-{suffix}"),
            balances: format!("{topic_prefix}balances-{suffix}"),
            audit: format!("{topic_prefix}audit-{suffix}"),
            dlq: format!("{topic_prefix}payments-{suffix}.dlq"),
            name,
            dir: tempfile::tempdir().expect("temp dir"),
            manifest: PathBuf::new(),
        };
        cluster.create_topics(&[
            (&w.payments, partitions),
            (&w.balances, partitions),
            (&w.audit, partitions),
            (&w.dlq, 1),
        ]);
        let wallet_manifest = build_guest("examples/wallet/onceflow.toml");
        let component = wallet_manifest
            .parent()
            .unwrap()
            .join("target/onceflow/wallet.wasm");
        let manifest = format!(
            r#"name = "{name}"
tenant = "{tenant}"
inputs = ["{payments}"]
stores = ["balances"]

[build]
language = "rust"
component = "{component}"

[outputs]
balances = "{balances}"
audit = "{audit}"

[processing]
guarantee = "{guarantee}"
commit-interval-ms = 100

[errors]
policy = "dead-letter"
dead-letter-topic = "{dlq}"
"#,
            name = w.name,
            payments = w.payments,
            component = component.display(),
            balances = w.balances,
            audit = w.audit,
            dlq = w.dlq,
        );
        let path = w.dir.path().join("onceflow.toml");
        std::fs::write(&path, manifest).expect("write manifest");
        Wallet {
            manifest: path,
            ..w
        }
    }

    /// Runs the wallet port in `example` (e.g. `examples/wallet-js`, built
    /// with `onceflow build`) instead of the Rust wallet, with the example's
    /// limits; its fuel per record is capped at `max_fuel` if given (a
    /// tenant's quota).
    pub fn use_example(&self, example: &str, max_fuel: Option<u64>) {
        let manifest = build_guest(&format!("{example}/onceflow.toml"));
        let own = onceflow::deploy::Manifest::load(&manifest).expect("the example's manifest");
        let text = std::fs::read_to_string(&self.manifest).expect("the rig's manifest");
        let mut lines: Vec<String> = text
            .lines()
            .map(|line| {
                if line.starts_with("component = ") {
                    format!("component = \"{}\"", own.component_path().display())
                } else if line.starts_with("language = ") {
                    format!("language = \"{}\"", own.build.language.name())
                } else {
                    line.to_owned()
                }
            })
            .collect();
        // Interpreters need their example's limits (docs/languages.md).
        let fuel = max_fuel.map_or(own.limits.fuel_per_record, |m| {
            m.min(own.limits.fuel_per_record)
        });
        lines.push("[limits]".to_owned());
        lines.push(format!("memory-mb = {}", own.limits.memory_mb));
        lines.push(format!("fuel-per-record = {fuel}"));
        lines.push(format!("timeout-ms = {}", own.limits.timeout_ms));
        std::fs::write(&self.manifest, lines.join("\n") + "\n").expect("write the manifest");
    }

    /// Produces `n` payments over `accounts` accounts, keyed by account;
    /// every `invalid_every`-th is malformed. Ids start at `first`.
    pub fn produce(
        &self,
        first: u64,
        n: u64,
        accounts: u64,
        invalid_every: Option<u64>,
    ) -> Produced {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &self.cluster.bootstrap)
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "500000")
            .create()
            .expect("producer");
        let mut produced = Produced::default();
        let mut rng = first.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        for i in first..first + n {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let account = format!("acct-{:04}", rng % accounts);
            let amount = (rng >> 20) as i64 % 1000 - 300;
            let invalid = invalid_every.is_some_and(|k| i % k == k - 1);
            let value = if invalid {
                produced.invalid += 1;
                format!(r#"{{"payment_id":"p{i}","account":"{account}","amount":"N/A"}}"#)
            } else {
                produced.valid += 1;
                *produced.totals.entry(account.clone()).or_insert(0) += amount;
                format!(r#"{{"payment_id":"p{i}","account":"{account}","amount":{amount}}}"#)
            };
            loop {
                match producer.send(BaseRecord::to(&self.payments).key(&account).payload(&value)) {
                    Ok(()) => break,
                    Err((_, _)) => producer.poll(Duration::from_millis(10)),
                }
            }
            producer.poll(Duration::ZERO);
        }
        producer
            .flush(Duration::from_secs(60))
            .expect("flush payments");
        produced
    }

    /// Starts `onceflow run` for instance `instance` (its own state dir).
    pub fn start(&self, instance: &str, extra: &[&str]) -> Host {
        Host::start(self, instance, extra)
    }

    /// Waits until the group committed every input offset.
    pub fn wait_done(&self, timeout: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let (committed, end) = self.cluster.progress(&self.app, &self.payments);
            if end > 0 && committed >= end {
                return started.elapsed();
            }
            if started.elapsed() >= timeout {
                let mut logs = String::new();
                for entry in std::fs::read_dir(self.dir.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let path = entry.path();
                    if path.extension().is_some_and(|e| e == "log") {
                        let text = std::fs::read_to_string(&path).unwrap_or_default();
                        let lines: Vec<&str> =
                            text.lines().filter(|l| !l.contains(" figures ")).collect();
                        // The cause is usually early, the symptom repeats
                        // at the end: the first warnings, then the tail.
                        let first_warnings: Vec<&str> = lines
                            .iter()
                            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                            .take(30)
                            .copied()
                            .collect();
                        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                        logs.push_str(&format!(
                            "\n--- {} (first 30 warnings)\n{}\n--- (last 40 lines)\n{tail}",
                            path.display(),
                            first_warnings.join("\n")
                        ));
                    }
                }
                let broker_view = self.cluster.transactions_report();
                panic!(
                    "not done after {timeout:?}: committed {committed} of {end}{logs}\n--- broker's open transactions\n{broker_view}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Committed input records so far.
    pub fn committed(&self) -> i64 {
        self.cluster.progress(&self.app, &self.payments).0
    }

    pub fn verify(&self, read_uncommitted: bool) -> onceflow::stream::verify::VerifyReport {
        onceflow::stream::verify::verify(&onceflow::stream::verify::VerifyOptions {
            bootstrap_servers: self.cluster.bootstrap.clone(),
            input: self.payments.clone(),
            id_field: "payment_id".into(),
            key_field: "account".into(),
            sum_field: "amount".into(),
            echo: Some(self.audit.clone()),
            totals: Some(self.balances.clone()),
            total_field: "balance".into(),
            dead_letter: Some(self.dlq.clone()),
            read_uncommitted,
            timeout: Duration::from_secs(120),
        })
        .expect("verify runs")
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    (t % 1_000_000) * 100 + N.fetch_add(1, Ordering::Relaxed)
}

/// Sees whether a topic has an open transaction holding data: its last
/// stable offset (read_committed) behind its high watermark.
pub struct TxnProbe {
    committed: BaseConsumer,
    uncommitted: BaseConsumer,
    topic: String,
    partitions: Vec<i32>,
}

impl TxnProbe {
    pub fn new(cluster: &Cluster, topic: &str) -> TxnProbe {
        let client = |isolation: &str| -> BaseConsumer {
            ClientConfig::new()
                .set("bootstrap.servers", &cluster.bootstrap)
                .set("group.id", "txn-probe")
                .set("isolation.level", isolation)
                .create()
                .expect("probe consumer")
        };
        let committed = client("read_committed");
        let md = committed
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
        TxnProbe {
            committed,
            uncommitted: client("read_uncommitted"),
            topic: topic.to_owned(),
            partitions,
        }
    }

    /// Records in the topic, committed or not.
    pub fn end(&self) -> i64 {
        self.partitions
            .iter()
            .map(|&p| {
                self.uncommitted
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .map_or(0, |(_, h)| h)
            })
            .sum()
    }

    /// Records a read_committed reader can see (up to the last stable
    /// offsets).
    pub fn committed_end(&self) -> i64 {
        self.partitions
            .iter()
            .map(|&p| {
                self.committed
                    .fetch_watermarks(&self.topic, p, Duration::from_secs(5))
                    .map_or(0, |(_, h)| h)
            })
            .sum()
    }

    pub fn open(&self) -> bool {
        self.partitions.iter().any(|&p| {
            let lso = self
                .committed
                .fetch_watermarks(&self.topic, p, Duration::from_secs(5));
            let hw = self
                .uncommitted
                .fetch_watermarks(&self.topic, p, Duration::from_secs(5));
            matches!((lso, hw), (Ok((_, l)), Ok((_, h))) if l < h)
        })
    }
}

/// A running `onceflow run`, killed on drop.
pub struct Host {
    pub child: Child,
    pub log: PathBuf,
    pub instance: String,
}

impl Host {
    fn start(w: &Wallet, instance: &str, extra: &[&str]) -> Host {
        let log = w.dir.path().join(format!("{instance}.log"));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_onceflow"))
            .arg("run")
            .arg(&w.manifest)
            .args(["--bootstrap-servers", &w.cluster.bootstrap])
            .arg("--state-dir")
            .arg(w.dir.path().join(format!("state-{instance}")))
            .args(["--instance-id", instance])
            .args(["--report-interval-ms", "1000"])
            .args(extra)
            .env("ONCEFLOW_LOG", "info,onceflow::stream=info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .expect("start onceflow run");
        Host {
            child,
            log,
            instance: instance.to_owned(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: sending a signal to our own child's PID.
        unsafe {
            libc::kill(self.pid(), sig);
        }
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                panic!(
                    "onceflow run did not stop within 60 s of SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sums `restored N changelog records` over a log.
pub fn restored_records(log: &str) -> u64 {
    log.lines()
        .filter_map(|l| {
            let i = l.find("restored ")?;
            l[i + 9..].split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

pub fn assert_exact(
    report: &onceflow::stream::verify::VerifyReport,
    produced: &Produced,
    context: &str,
) {
    assert!(
        report.is_exact(),
        "{context}: findings: {:#?}",
        report.findings
    );
    assert_eq!(report.valid, produced.valid, "{context}: valid inputs");
    assert_eq!(
        report.echo_records, produced.valid,
        "{context}: audit holds every valid payment once"
    );
    assert_eq!(
        report.dead_letters, produced.invalid,
        "{context}: one dead letter per malformed payment"
    );
    assert_eq!(
        report.key_totals, produced.totals,
        "{context}: final balances equal the sums"
    );
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A plain idempotent producer on `cluster`.
pub fn plain_producer(cluster: &Cluster) -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer")
}

/// Sends one record and waits for it to be acknowledged.
pub fn send(producer: &BaseProducer, topic: &str, key: &str, value: &str) {
    loop {
        match producer.send(BaseRecord::to(topic).key(key).payload(value)) {
            Ok(()) => break,
            Err(_) => producer.poll(Duration::from_millis(10)),
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}
