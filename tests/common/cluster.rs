//! A real Kafka for the broker tests, started through scripts/kafka in its
//! own directory and ports, and plain clients on it.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::repo;

/// One test at a time, across the modules of the Kafka test binary: they
/// share the brokers and two cores. The guard prints how long its test held
/// it (`TEST-TIME <test> <s>`), for CI's budget.
pub fn serial() -> Serial {
    static SERIAL: Mutex<()> = Mutex::new(());
    Serial {
        _guard: SERIAL.lock().unwrap_or_else(|e| e.into_inner()),
        started: std::time::Instant::now(),
    }
}

/// The guard of [`serial`].
pub struct Serial {
    _guard: MutexGuard<'static, ()>,
    started: std::time::Instant,
}

impl Drop for Serial {
    fn drop(&mut self) {
        eprintln!(
            "TEST-TIME {} {:.1} s",
            std::thread::current().name().unwrap_or("?"),
            self.started.elapsed().as_secs_f64()
        );
    }
}

/// A Kafka cluster run by scripts/kafka in its own directory and ports.
pub struct Cluster {
    /// Where the rig's own clients connect (topic admin, input, progress,
    /// verify): never through a proxy.
    pub bootstrap: String,
    /// Where the `onceflow run` hosts connect: the proxy's ports when the
    /// cluster is behind one (`start_behind_proxy`), else `bootstrap`.
    pub host_bootstrap: String,
    pub dir: PathBuf,
    pub port: u16,
    pub brokers: u32,
    /// Behind a proxy: node i advertises `proxy_port + i - 1` to the hosts,
    /// where the proxy must listen and forward to `broker_port(i)`.
    pub proxy_port: Option<u16>,
    /// More arguments for `scripts/kafka up` (the SASL_SSL listener's).
    pub up_args: Vec<String>,
}

/// Behind a proxy, the proxies' ports are this far above the brokers', and
/// the internal listeners (inter-broker, tools, the rig's clients) half as
/// far (scripts/kafka's default `ONCEFLOW_KAFKA_INTERNAL_PORT`).
const PROXY_PORT_DISTANCE: u16 = 3000;
const INTERNAL_PORT_DISTANCE: u16 = 2000;

/// `$ONCEFLOW_CACHE` (default `~/.cache/onceflow`).
pub fn cache() -> PathBuf {
    std::env::var_os("ONCEFLOW_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/onceflow")
        })
}

impl Cluster {
    /// Runs `scripts/kafka` on this cluster (its tools connect directly,
    /// never through the proxy).
    pub fn script(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(repo().join("scripts/kafka"));
        match self.proxy_port {
            Some(p) => cmd.env("ONCEFLOW_KAFKA_PROXY_PORT", p.to_string()),
            None => cmd.env_remove("ONCEFLOW_KAFKA_PROXY_PORT"),
        };
        cmd.env_remove("ONCEFLOW_KAFKA_INTERNAL_PORT")
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
        let c = Self::at(name, port, brokers);
        c.up();
        c
    }

    /// Like `start`, but the hosts reach the brokers through a TCP proxy
    /// (scripts/kafka `up --proxy-port`): node i advertises
    /// `proxy_port + i - 1` to them, and the rig's own clients use the
    /// internal listeners. Start the proxy with `proxy::FaultProxy::start`.
    pub fn start_behind_proxy(name: &str, port: u16, brokers: u32) -> Cluster {
        let c = Self::place(name, port, brokers, true);
        c.up();
        c
    }

    /// Node i's client port (behind a proxy: the proxy's upstream).
    pub fn broker_port(&self, i: u32) -> u16 {
        self.port + i as u16 - 1
    }

    /// A cluster's place (directory, ports) without starting it; see
    /// [`Cluster::start`].
    pub fn at(name: &str, port: u16, brokers: u32) -> Cluster {
        Self::place(name, port, brokers, false)
    }

    fn place(name: &str, port: u16, brokers: u32, behind_proxy: bool) -> Cluster {
        let offset: u16 = std::env::var("ONCEFLOW_TEST_PORT_OFFSET")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let port = port + offset;
        let dir = match std::env::var("ONCEFLOW_TEST_KAFKA_TAG") {
            Ok(tag) if !tag.is_empty() => format!("kafka-tag-{tag}-{name}"),
            _ => format!("kafka-test-{name}"),
        };
        let list = |first: u16| {
            (0..brokers)
                .map(|i| format!("127.0.0.1:{}", first + i as u16))
                .collect::<Vec<_>>()
                .join(",")
        };
        let (bootstrap, host_bootstrap, proxy_port) = if behind_proxy {
            let proxy = port + PROXY_PORT_DISTANCE;
            (
                list(port + INTERNAL_PORT_DISTANCE),
                list(proxy),
                Some(proxy),
            )
        } else {
            (list(port), list(port), None)
        };
        Cluster {
            bootstrap,
            host_bootstrap,
            dir: cache().join(dir),
            port,
            brokers,
            proxy_port,
            up_args: Vec::new(),
        }
    }

    /// Starts one node that also serves SASL_SSL on its port + 1
    /// (scripts/kafka `up --sasl-cert`): SCRAM-SHA-512 over TLS with the
    /// key and certificate chain in `cert` (PEM), the SCRAM users `admin`
    /// (a super user) and `users` (`NAME=PASSWORD` each), and ACLs enforced.
    /// The hosts (`host_bootstrap`) connect there; the rig's own clients and
    /// the tools use the PLAINTEXT listener, whose principal is the broker's
    /// own, a super user. A cluster left running under this name is purged
    /// first: it would serve another certificate.
    pub fn start_with_sasl(
        name: &str,
        port: u16,
        cert: &std::path::Path,
        admin: &str,
        users: &[&str],
    ) -> Cluster {
        let mut c = Self::place(name, port, 1, false);
        let sasl_port = c.port + 1;
        c.host_bootstrap = format!("127.0.0.1:{sasl_port}");
        c.up_args = vec![
            "--sasl-cert".to_owned(),
            cert.to_str().expect("utf-8 path").to_owned(),
            "--sasl-port".to_owned(),
            sasl_port.to_string(),
            "--sasl-admin".to_owned(),
            admin.to_owned(),
        ];
        for user in users {
            c.up_args
                .extend(["--sasl-user".to_owned(), (*user).to_owned()]);
        }
        c.purge_quietly();
        c.up();
        c
    }

    /// Starts the cluster (a running one is kept; a stopped one starts with
    /// fresh data).
    pub fn up(&self) {
        let brokers = self.brokers.to_string();
        let mut args = vec!["up", "--brokers", &brokers];
        args.extend(self.up_args.iter().map(String::as_str));
        let out = self.script(&args);
        assert!(
            out.status.success(),
            "scripts/kafka up failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Stops every node and deletes the cluster's data and logs.
    pub fn purge(&self) {
        let out = self.script(&["down", "--purge"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The single-node cluster most tests share (stopped by scripts/test).
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| Cluster::start("shared", 19092, 1))
    }

    /// [`Cluster::purge`] for a `Drop`: never panics; says whether it worked.
    pub fn purge_quietly(&self) -> bool {
        self.script(&["down", "--purge"]).status.success()
    }

    /// Whether `topic` exists (with partitions) on the cluster.
    pub fn topic_exists(&self, topic: &str) -> bool {
        let c: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("metadata client");
        let md = c
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        md.topics()
            .first()
            .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty())
    }

    pub fn stop_broker(&self, i: u32, signal: &str) {
        self.script_ok(&["stop-broker", &i.to_string(), "--signal", signal]);
    }

    /// SIGSTOPs node i (`scripts/kafka pause-broker`): its connections stay
    /// open and nothing answers until [`Cluster::resume_broker`].
    pub fn pause_broker(&self, i: u32) {
        self.script_ok(&["pause-broker", &i.to_string()]);
    }

    pub fn resume_broker(&self, i: u32) {
        self.script_ok(&["resume-broker", &i.to_string()]);
    }

    pub fn start_broker(&self, i: u32) {
        self.script_ok(&["start-broker", &i.to_string()]);
    }

    /// Restarts several nodes together (`scripts/kafka start-broker 1 2 3`):
    /// a quorum that lost every node serves again only with a majority.
    pub fn start_brokers(&self, nodes: &[u32]) {
        let mut args = vec!["start-broker".to_owned()];
        args.extend(nodes.iter().map(u32::to_string));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.script_ok(&args);
    }

    /// `scripts/kafka args`, which must succeed.
    fn script_ok(&self, args: &[&str]) {
        let out = self.script(args);
        assert!(
            out.status.success(),
            "scripts/kafka {}: {}",
            args.join(" "),
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
        // Retried for up to 3 minutes: a broker just resumed or restarted
        // by the test before (SIGSTOPped past its session with the
        // controller, it registers again) may not take a topic at once
        // (the project's CI timed out here after a broker pause, 959124e).
        // A topic created by an earlier attempt whose answer was lost counts.
        let deadline = std::time::Instant::now() + Duration::from_secs(180);
        let mut left: Vec<(&str, i32)> = topics.to_vec();
        loop {
            let new: Vec<NewTopic<'_>> = left
                .iter()
                .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(rf)))
                .collect();
            let options = AdminOptions::new()
                .operation_timeout(Some(Duration::from_secs(15)))
                .request_timeout(Some(Duration::from_secs(25)));
            // The topics to try again, and why.
            let failed: Vec<(String, String)> =
                match futures::executor::block_on(admin.create_topics(&new, &options)) {
                    Ok(results) => results
                        .into_iter()
                        .filter_map(|r| match r {
                            Ok(_) => None,
                            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => None,
                            Err((topic, code)) => Some((topic, code.to_string())),
                        })
                        .collect(),
                    Err(e) => left
                        .iter()
                        .map(|(t, _)| ((*t).to_owned(), e.to_string()))
                        .collect(),
                };
            if failed.is_empty() {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "creating topics for 3 minutes: {failed:?}"
            );
            eprintln!("creating topics: {failed:?}; retrying");
            std::thread::sleep(Duration::from_secs(1));
            left.retain(|(t, _)| failed.iter().any(|(f, _)| f == t));
        }
    }

    /// A read_committed consumer in `group` that commits nothing.
    pub fn committed_reader(&self, group: &str) -> BaseConsumer {
        ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer")
    }

    /// Records and bytes (keys, values, headers) committed in `topic`, read
    /// independently of the host: what usage must agree with.
    pub fn records_and_bytes(&self, topic: &str) -> (u64, u64) {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::{Headers, Message};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", "usage-check")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
        let md = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .expect("metadata");
        let partitions = md.topics()[0].partitions().len();
        let mut tpl = rdkafka::TopicPartitionList::new();
        for p in 0..partitions as i32 {
            tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let (mut records, mut bytes, mut ended) = (0u64, 0u64, 0usize);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ended < partitions {
            assert!(
                std::time::Instant::now() < deadline,
                "reading {topic} took over 60 s"
            );
            match consumer.poll(Duration::from_millis(200)) {
                Some(Ok(m)) => {
                    records += 1;
                    let headers = m.headers().map_or(0, |h| {
                        h.iter()
                            .map(|x| x.key.len() + x.value.map_or(0, <[u8]>::len))
                            .sum()
                    });
                    bytes += (m.key().map_or(0, <[u8]>::len)
                        + m.payload().map_or(0, <[u8]>::len)
                        + headers) as u64;
                }
                Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => ended += 1,
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                None => {}
            }
        }
        (records, bytes)
    }

    /// The next offset to read of every partition of `topic` for `group`,
    /// as committed (stable), and the partitions' ends.
    pub fn progress(&self, group: &str, topic: &str) -> (i64, i64) {
        let c = self.committed_reader(group);
        // Retried: the drill calls this while its faults are on (a broker
        // just restarted did not answer metadata for 10 s in one CI run),
        // and its callers wait with deadlines of their own.
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let md = loop {
            match c.fetch_metadata(Some(topic), Duration::from_secs(10)) {
                Ok(md) => break md,
                Err(e) if std::time::Instant::now() < deadline => {
                    eprintln!("progress of {group} on {topic}: metadata: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => panic!("metadata of {topic} for 120 s: {e}"),
            }
        };
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

/// A test's own cluster, leaked so that wallets can borrow it for
/// `'static`, and stopped (by the PIDs scripts/kafka recorded) with its data
/// deleted when this drops, also when the test fails.
pub struct OwnCluster(pub &'static Cluster);

impl OwnCluster {
    pub fn new(cluster: Cluster) -> OwnCluster {
        OwnCluster(Box::leak(Box::new(cluster)))
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        if !self.0.purge_quietly() {
            eprintln!("could not purge the cluster in {}", self.0.dir.display());
        }
    }
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
