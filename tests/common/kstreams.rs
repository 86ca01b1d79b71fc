//! Writing records with their times, reading topics back, and running the
//! Kafka Streams twins (`bench/kstreams-wallet`) next to Onceflow in the
//! broker tests.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Headers;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::cluster::Cluster;
use super::repo;

/// One committed record: partition, key, value, the dead-letter reason.
pub type Read = (i32, String, String, Option<String>);

/// Every committed record of `topic` (read_committed, to the last stable
/// offsets).
pub fn read_committed(cluster: &Cluster, topic: &str) -> Vec<Read> {
    let c = cluster.committed_reader("test-reader");
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let mut tpl = TopicPartitionList::new();
    let mut ends = Vec::new();
    for p in md.topics()[0].partitions() {
        let (_, high) = c
            .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
            .expect("watermarks");
        tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
            .expect("offset");
        ends.push((p.id(), high));
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let done = |c: &BaseConsumer| {
        ends.iter().all(|(p, high)| {
            c.position().ok().is_some_and(|pos| {
                pos.find_partition(topic, *p)
                    .is_some_and(|e| matches!(e.offset(), Offset::Offset(o) if o >= *high))
            }) || *high == 0
        })
    };
    while !done(&c) {
        assert!(Instant::now() < deadline, "reading {topic} took over 60 s");
        let Some(m) = c.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m.expect("a record");
        let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
        let error = m.headers().and_then(|h| {
            h.iter()
                .find(|x| x.key == "onceflow.error.message")
                .map(|x| text(x.value))
        });
        out.push((m.partition(), text(m.key()), text(m.payload()), error));
    }
    out
}

/// The Kafka Streams twins' classpath, built once with Maven.
pub fn kstreams_classpath() -> String {
    static BUILT: OnceLock<String> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = repo().join("bench/kstreams-wallet");
            let out = Command::new("mvn")
                .args([
                    "-q",
                    "-B",
                    "-Dstyle.color=never",
                    "compile",
                    "dependency:copy-dependencies",
                ])
                .current_dir(&dir)
                .output()
                .expect("run mvn (Maven must be installed)");
            assert!(
                out.status.success(),
                "building bench/kstreams-wallet failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            format!(
                "{}:{}/*",
                dir.join("target/classes").display(),
                dir.join("target/lib").display()
            )
        })
        .clone()
}

/// A Kafka Streams application run as a child process, stopped with
/// SIGTERM (and killed if it will not stop) when dropped.
pub struct KStreams(std::process::Child);

impl KStreams {
    pub fn start(class: &str, args: &[&str], log: &Path) -> KStreams {
        let log = std::fs::File::create(log).expect("log file");
        let child = Command::new("java")
            .args(["-Xmx512m", "-XX:+UseSerialGC", "-cp", &kstreams_classpath()])
            .arg(format!("dev.onceflow.bench.{class}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start java");
        KStreams(child)
    }
}

impl Drop for KStreams {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.0.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A suffix no other test of this process uses.
pub fn unique() -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

/// Sends records `(topic, key, value or a tombstone, time)`, then waits for
/// the acknowledgements.
pub fn produce(producer: &BaseProducer, records: &[(String, String, Option<String>, i64)]) {
    for (topic, key, value, at) in records {
        let mut record = BaseRecord::<str, str>::to(topic).key(key).timestamp(*at);
        if let Some(v) = value {
            record = record.payload(v);
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(30)).expect("flush");
}
