//! The wallet scenario on a real Kafka: a deployment of the wallet example
//! on its own topics, what was produced to it, and the exactness check.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use super::build_guest;
use super::cluster::Cluster;
use super::host_process::Host;

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
    /// Where `verify` finds the schemas of values in the registry's wire
    /// format (`None`: values are JSON).
    pub schema_registry: Option<std::sync::Arc<onceflow::schema::Registry>>,
    /// Valid payments are written in Avro with this schema (its registry
    /// id), in the registry's wire format; malformed ones stay JSON text
    /// (`None`: every payment is JSON).
    pub avro: Option<(u32, std::sync::Arc<onceflow::schema::AvroSchema>)>,
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
            schema_registry: None,
            avro: None,
        };
        cluster.create_topics(&[
            (&w.payments, partitions),
            (&w.balances, partitions),
            (&w.audit, partitions),
            (&w.dlq, 1),
        ]);
        let manifest = manifest_text(&ManifestTopics {
            name: &w.name,
            tenant,
            inputs: &[&w.payments],
            balances: &w.balances,
            audit: &w.audit,
            dlq: &w.dlq,
            guarantee,
        });
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
        let own = onceflow::manifest::Manifest::load(&manifest).expect("the example's manifest");
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
        self.produce_with(&self.producer(), first, n, accounts, invalid_every)
    }

    /// The idempotent producer `produce` writes payments with; one of its
    /// own for a caller that produces in many small steps (a new producer
    /// costs a round of metadata and an idempotent producer id first, and
    /// its drop waits: one per 250 ms chunk fell behind the chunks).
    pub fn producer(&self) -> BaseProducer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.cluster.bootstrap)
            .set("enable.idempotence", "true")
            .set("partitioner", "murmur2_random")
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "500000")
            .create()
            .expect("producer")
    }

    /// `produce` through `producer` (from [`Wallet::producer`]).
    pub fn produce_with(
        &self,
        producer: &BaseProducer,
        first: u64,
        n: u64,
        accounts: u64,
        invalid_every: Option<u64>,
    ) -> Produced {
        self.produce_avro(
            producer,
            first,
            n,
            accounts,
            invalid_every,
            self.avro.as_ref(),
        )
    }

    /// `produce_with`, valid payments written in Avro with `avro` (schema
    /// id and schema) when given, whatever the wallet's own `avro` is.
    pub fn produce_avro(
        &self,
        producer: &BaseProducer,
        first: u64,
        n: u64,
        accounts: u64,
        invalid_every: Option<u64>,
        avro: Option<&(u32, std::sync::Arc<onceflow::schema::AvroSchema>)>,
    ) -> Produced {
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
            let value = match avro {
                Some((id, schema)) if !invalid => onceflow::schema::frame(
                    *id,
                    &schema
                        .encode(value.as_bytes())
                        .expect("a payment fits its schema"),
                ),
                _ => value.into_bytes(),
            };
            loop {
                match producer.send(BaseRecord::to(&self.payments).key(&account).payload(&value)) {
                    Ok(()) => break,
                    Err((_, _)) => producer.poll(Duration::from_millis(10)),
                }
            }
            producer.poll(Duration::ZERO);
        }
        // Up to 5 minutes: the drills stop every broker at once.
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while let Err(e) = producer.flush(Duration::from_secs(10)) {
            assert!(
                std::time::Instant::now() < deadline,
                "flush payments for 5 minutes: {e}"
            );
        }
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
                let logs = self.logs_report();
                let broker_view = self.cluster.transactions_report();
                panic!(
                    "not done after {timeout:?}: committed {committed} of {end}{logs}\n--- broker's open transactions\n{broker_view}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// For a failure message: of each host's log in the wallet's directory,
    /// the first warnings (the cause is usually early, the symptom repeats
    /// at the end) and the last lines.
    pub fn logs_report(&self) -> String {
        let mut logs = String::new();
        let mut paths: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.extension().is_some_and(|e| e == "log"))
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // Not the periodic figures, nor librdkafka's notes that a `-X`
            // property does not apply to a consumer or producer.
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.contains(" figures ") && !l.contains("CONFWARN"))
                .collect();
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
        logs
    }

    /// Committed input records so far.
    pub fn committed(&self) -> i64 {
        self.cluster.progress(&self.app, &self.payments).0
    }

    /// `onceflow verify` on this wallet's topics, as a user runs it.
    pub fn verify_cli(&self) -> std::process::Output {
        self.verify_cli_at(&self.cluster.bootstrap, &[])
    }

    /// `onceflow verify` through `bootstrap` with `extra` arguments (`-X`).
    pub fn verify_cli_at(&self, bootstrap: &str, extra: &[&str]) -> std::process::Output {
        super::onceflow()
            .args(["verify", "--bootstrap-servers", bootstrap])
            .args(extra)
            .args(["--input", &self.payments, "--echo", &self.audit])
            .args(["--totals", &self.balances, "--dead-letter", &self.dlq])
            .output()
            .expect("run onceflow verify")
    }

    pub fn verify(&self, read_uncommitted: bool) -> onceflow::stream::verify::VerifyReport {
        onceflow::stream::verify::verify(&onceflow::stream::verify::VerifyOptions {
            kafka: onceflow::kafka::Connection {
                bootstrap_servers: self.cluster.bootstrap.clone(),
                extra_config: Vec::new(),
            },
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
            schema_registry: self.schema_registry.clone(),
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

/// Where a wallet deployment reads and writes.
pub struct ManifestTopics<'a> {
    pub name: &'a str,
    pub tenant: &'a str,
    pub inputs: &'a [&'a str],
    pub balances: &'a str,
    pub audit: &'a str,
    pub dlq: &'a str,
    pub guarantee: &'a str,
}

/// The Rust wallet example's manifest (built first) on the given topics,
/// committing every 100 ms, bad records dead-lettered.
pub fn manifest_text(t: &ManifestTopics<'_>) -> String {
    let example = build_guest("examples/wallet/onceflow.toml");
    let component = example
        .parent()
        .expect("the example's directory")
        .join("target/onceflow/wallet.wasm");
    let inputs = t
        .inputs
        .iter()
        .map(|i| format!("\"{i}\""))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"name = "{name}"
tenant = "{tenant}"
inputs = [{inputs}]
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
        name = t.name,
        tenant = t.tenant,
        component = component.display(),
        balances = t.balances,
        audit = t.audit,
        guarantee = t.guarantee,
        dlq = t.dlq,
    )
}
