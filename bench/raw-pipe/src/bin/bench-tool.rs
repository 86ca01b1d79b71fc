//! The harness's load and measurement tool (bench/README.md):
//!
//! - `produce`: writes the deterministic input (all at once, or paced at a
//!   fixed rate for the latency runs);
//! - `await`: reads output topics `read_committed` until the expected count
//!   is visible, and reports throughput, end-to-end latency, and the
//!   contender's CPU time and peak RSS from /proc;
//! - `verify-enrich`: checks the enrich outputs record by record.
//!
//! Every command prints one JSON object on stdout.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use raw_pipe::{Kind, region};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Onceflow benchmark: load generator and measurements")]
struct Cli {
    #[arg(long, global = true, env = "ONCEFLOW_BOOTSTRAP", default_value = "")]
    bootstrap_servers: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Produce records [first, first+count) of a kind.
    Produce {
        #[arg(long)]
        topic: String,
        #[arg(long, value_enum)]
        kind: Kind,
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long)]
        count: u64,
        /// Records per second (default: as fast as possible).
        #[arg(long)]
        rate: Option<u64>,
        /// Only count what would be produced.
        #[arg(long)]
        dry_run: bool,
    },
    /// Wait until `expect` records are visible (read_committed) in `topics`.
    Await {
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        #[arg(long)]
        expect: u64,
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
        /// Process to sample CPU time and peak RSS of (the contender).
        #[arg(long)]
        pid: Option<u32>,
        /// Record end-to-end latency (now - record timestamp) of records
        /// stamped at or after this wall time (ms since the epoch).
        #[arg(long)]
        latency_from_ms: Option<i64>,
    },
    /// Create topics, `name:partitions` each (existing ones are kept).
    CreateTopics {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Delete topics (missing ones are ignored).
    DeleteTopics {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Check the enrich outputs for input records [first, first+count).
    VerifyEnrich {
        #[arg(long)]
        first: u64,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        large: String,
        #[arg(long)]
        standard: String,
        #[arg(long)]
        dead_letter: String,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if cli.bootstrap_servers.is_empty() {
        bail!("--bootstrap-servers (or ONCEFLOW_BOOTSTRAP) is required");
    }
    let out = match cli.command {
        Command::Produce {
            topic,
            kind,
            first,
            count,
            rate,
            dry_run,
        } => {
            if dry_run {
                count_expected(kind, first, count)
            } else {
                produce(&cli.bootstrap_servers, &topic, kind, first, count, rate)?
            }
        }
        Command::Await {
            topics,
            expect,
            timeout_secs,
            pid,
            latency_from_ms,
        } => await_outputs(
            &cli.bootstrap_servers,
            &topics,
            expect,
            Duration::from_secs(timeout_secs),
            pid,
            latency_from_ms,
        )?,
        Command::CreateTopics { topics } => create_topics(&cli.bootstrap_servers, &topics)?,
        Command::DeleteTopics { topics } => delete_topics(&cli.bootstrap_servers, &topics)?,
        Command::VerifyEnrich {
            first,
            count,
            large,
            standard,
            dead_letter,
            timeout_secs,
        } => verify_enrich(
            &cli.bootstrap_servers,
            first,
            count,
            [&large, &standard],
            &dead_letter,
            Duration::from_secs(timeout_secs),
        )?,
    };
    println!("{out}");
    Ok(())
}

fn admin(bootstrap: &str) -> anyhow::Result<AdminClient<DefaultClientContext>> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating the admin client")
}

fn create_topics(bootstrap: &str, specs: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut parsed = Vec::new();
    for spec in specs {
        let (name, partitions) = spec
            .rsplit_once(':')
            .with_context(|| format!("topic {spec:?}: expected name:partitions"))?;
        let partitions: i32 = partitions
            .parse()
            .with_context(|| format!("topic {spec:?}: partitions must be a number"))?;
        parsed.push((name.to_owned(), partitions));
    }
    let new: Vec<NewTopic> = parsed
        .iter()
        .map(|(name, partitions)| NewTopic::new(name, *partitions, TopicReplication::Fixed(1)))
        .collect();
    let results = futures::executor::block_on(admin(bootstrap)?.create_topics(
        &new,
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .context("creating topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("creating topic {topic}: {code}"),
        }
    }
    Ok(json!({ "created": specs }))
}

fn delete_topics(bootstrap: &str, topics: &[String]) -> anyhow::Result<serde_json::Value> {
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let results = futures::executor::block_on(admin(bootstrap)?.delete_topics(
        &names,
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .context("deleting topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => bail!("deleting topic {topic}: {code}"),
        }
    }
    Ok(json!({ "deleted": topics }))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn count_expected(kind: Kind, first: u64, count: u64) -> serde_json::Value {
    let (mut invalid, mut expected_outputs) = (0u64, 0u64);
    for i in first..first + count {
        let g = kind.generate(i);
        if g.invalid {
            invalid += 1;
        } else if kind == Kind::Payments || g.output.is_some() {
            expected_outputs += 1;
        }
    }
    json!({ "count": count, "invalid": invalid, "expected_outputs": expected_outputs })
}

fn produce(
    bootstrap: &str,
    topic: &str,
    kind: Kind,
    first: u64,
    count: u64,
    rate: Option<u64>,
) -> anyhow::Result<serde_json::Value> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        // Paced records go out at once, so their timestamps are their send
        // times; bulk loads batch.
        .set("linger.ms", if rate.is_some() { "0" } else { "5" })
        .set("queue.buffering.max.messages", "500000")
        .create()
        .context("creating the producer")?;
    let started = Instant::now();
    let started_ms = now_ms();
    let (mut invalid, mut expected_outputs) = (0u64, 0u64);
    for (n, i) in (first..first + count).enumerate() {
        if let Some(rate) = rate {
            // Send record n at n/rate seconds after the start.
            let due = Duration::from_secs_f64(n as f64 / rate as f64);
            let elapsed = started.elapsed();
            if due > elapsed {
                producer.poll(Duration::ZERO);
                std::thread::sleep(due - elapsed);
            }
        }
        let g = kind.generate(i);
        if g.invalid {
            invalid += 1;
        } else if kind == Kind::Payments || g.output.is_some() {
            expected_outputs += 1;
        }
        let mut record = BaseRecord::to(topic).key(&g.key).payload(&g.value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(e).context("producing the input"),
            }
        }
        producer.poll(Duration::ZERO);
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the input")?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({
        "count": count,
        "invalid": invalid,
        // Payments: one audit record per valid payment; orders: one record
        // in large or standard per valid order with a positive amount.
        "expected_outputs": expected_outputs,
        "started_ms": started_ms,
        "seconds": seconds,
        "rate": count as f64 / seconds.max(1e-9),
    }))
}

/// CPU seconds (user + system, all threads) and peak RSS (bytes) of `pid`.
fn proc_usage(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: utime and stime are fields 14 and 15 (11 and 12 after ')').
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // USER_HZ is 100 on Linux x86-64 and arm64.
    let cpu = ticks / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kb = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()?;
    Some((cpu, hwm_kb * 1024))
}

fn assign_from_start(consumer: &BaseConsumer, topics: &[String]) -> anyhow::Result<()> {
    let mut tpl = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of {topic}"))?;
        let Some(t) = metadata.topics().first() else {
            bail!("topic {topic} not found");
        };
        if t.partitions().is_empty() {
            bail!("topic {topic} has no partitions (does it exist?)");
        }
        for p in t.partitions() {
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)?;
        }
    }
    consumer.assign(&tpl).context("assigning partitions")?;
    Ok(())
}

fn reader(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "onceflow-bench-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "10")
        .set("enable.partition.eof", "false")
        .create()
        .context("creating the reader")
}

fn percentile(sorted: &[i64], q: f64) -> Option<i64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

fn await_outputs(
    bootstrap: &str,
    topics: &[String],
    expect: u64,
    timeout: Duration,
    pid: Option<u32>,
    latency_from_ms: Option<i64>,
) -> anyhow::Result<serde_json::Value> {
    let consumer = reader(bootstrap)?;
    assign_from_start(&consumer, topics)?;
    let started = Instant::now();
    let mut seen = 0u64;
    // At the first visible output: when, how many, the contender's CPU.
    let mut first: Option<(Instant, u64, Option<f64>)> = None;
    let mut latencies: Vec<i64> = Vec::new();
    while seen < expect {
        if started.elapsed() > timeout {
            bail!(
                "timed out after {}s: {seen} of {expect} records visible in {topics:?}",
                timeout.as_secs()
            );
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(m)) => {
                let now = now_ms();
                seen += 1;
                if first.is_none() {
                    first = Some((Instant::now(), seen, pid.and_then(proc_usage).map(|u| u.0)));
                }
                if let (Some(from), Some(ts)) = (latency_from_ms, m.timestamp().to_millis())
                    && ts >= from
                {
                    latencies.push(now - ts);
                }
            }
            Some(Err(e)) => eprintln!("bench-tool: reader error: {e}"),
            None => {
                if let Some(pid) = pid
                    && !std::path::Path::new(&format!("/proc/{pid}")).exists()
                {
                    bail!(
                        "the contender (pid {pid}) exited with {seen} of {expect} records visible"
                    );
                }
            }
        }
    }
    let end = Instant::now();
    let usage = pid.and_then(proc_usage);
    let (first_at, first_seen, first_cpu) = first.unwrap_or((end, 0, None));
    let window = end.duration_since(first_at).as_secs_f64();
    let counted = seen - first_seen;
    latencies.sort_unstable();
    Ok(json!({
        "seen": seen,
        // Records that became visible after the first one, over the time
        // from the first visible output to the last.
        "throughput": if window > 0.0 { counted as f64 / window } else { 0.0 },
        "window_seconds": window,
        "since_start_seconds": end.duration_since(started).as_secs_f64(),
        "cpu_seconds": match (usage, first_cpu) { (Some((end, _)), Some(start)) => Some(end - start), _ => None },
        "cpu_seconds_total": usage.map(|u| u.0),
        "counted": counted,
        "peak_rss_bytes": usage.map(|u| u.1),
        "latency_samples": latencies.len(),
        "latency_p50_ms": percentile(&latencies, 0.50),
        "latency_p99_ms": percentile(&latencies, 0.99),
        "latency_max_ms": latencies.last(),
    }))
}

fn verify_enrich(
    bootstrap: &str,
    first: u64,
    count: u64,
    outputs: [&String; 2],
    dead_letter: &str,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    // What must be there, from the generator alone.
    let mut expected: HashMap<String, (usize, i64, String)> = HashMap::new();
    let mut invalid = 0u64;
    for i in first..first + count {
        let g = Kind::Orders.generate(i);
        if g.invalid {
            invalid += 1;
        }
        if let Some(output) = g.output {
            let v: serde_json::Value = serde_json::from_str(&g.value)?;
            let amount = v["amount"].as_i64().unwrap_or_default();
            let country = v["country"].as_str().unwrap_or_default().to_owned();
            expected.insert(g.id, (output, amount, country));
        }
    }
    let mut findings: Vec<String> = Vec::new();
    let mut seen: HashMap<String, u32> = HashMap::new();
    let (mut foreign, mut wrong) = (0u64, 0u64);
    for (index, topic) in outputs.iter().enumerate() {
        for (key, value, _) in read_all(bootstrap, topic, timeout)? {
            let Some(&(output, amount, ref country)) = expected.get(&key) else {
                foreign += 1;
                continue;
            };
            *seen.entry(key).or_insert(0) += 1;
            let v: serde_json::Value = serde_json::from_slice(&value).unwrap_or_default();
            let right = output == index
                && v["amount"].as_i64() == Some(amount)
                && v["country"].as_str() == Some(country.as_str())
                && v["region"].as_str() == Some(region(country));
            if !right {
                wrong += 1;
            }
        }
    }
    let missing = expected.keys().filter(|k| !seen.contains_key(*k)).count();
    let duplicates: u32 = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    let dead_letters = read_all(bootstrap, dead_letter, timeout)?
        .into_iter()
        .filter(|(_, _, has_coordinates)| *has_coordinates)
        .count() as u64;
    if missing > 0 {
        findings.push(format!("{missing} enriched orders missing (gap)"));
    }
    if duplicates > 0 {
        findings.push(format!("{duplicates} duplicate enriched orders"));
    }
    if foreign > 0 {
        findings.push(format!("{foreign} outputs match no expected order"));
    }
    if wrong > 0 {
        findings.push(format!(
            "{wrong} outputs in the wrong topic or with wrong fields"
        ));
    }
    if dead_letters != invalid {
        findings.push(format!(
            "{dead_letters} dead letters with coordinates, expected {invalid}"
        ));
    }
    let exact = findings.is_empty();
    let report = json!({
        "exact": exact,
        "expected": expected.len(),
        "seen": seen.len(),
        "dead_letters": dead_letters,
        "findings": findings,
    });
    if !exact {
        bail!("enrich outputs are wrong: {report}");
    }
    Ok(report)
}

/// Every committed record of `topic`: key, value, and whether it has the
/// dead-letter coordinate headers. Reads each partition to its end (partition
/// EOF, as `onceflow verify` does).
fn read_all(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<(String, Vec<u8>, bool)>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "onceflow-bench-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .context("creating the reader")?;
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("metadata of {topic}"))?;
    let mut tpl = TopicPartitionList::new();
    if let Some(t) = metadata.topics().first() {
        for p in t.partitions() {
            let (low, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .with_context(|| format!("watermarks of {topic}/{}", p.id()))?;
            if high > low {
                tpl.add_partition_offset(topic, p.id(), Offset::Offset(low))?;
            }
        }
    }
    let mut records = Vec::new();
    let remaining = tpl.count();
    if remaining == 0 {
        return Ok(records);
    }
    consumer.assign(&tpl).context("assigning partitions")?;
    let deadline = Instant::now() + timeout;
    let mut ended = std::collections::HashSet::new();
    while ended.len() < remaining {
        if Instant::now() > deadline {
            bail!("timed out reading {topic}");
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let has_coordinates = m.headers().is_some_and(|h| {
                    h.iter()
                        .any(|h| h.key == raw_pipe::dead_letter_headers::OFFSET)
                });
                records.push((
                    key,
                    m.payload().unwrap_or_default().to_vec(),
                    has_coordinates,
                ));
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                ended.insert(p);
            }
            Some(Err(e)) => eprintln!("bench-tool: reader error: {e}"),
            None => {}
        }
    }
    Ok(records)
}
