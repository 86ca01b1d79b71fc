//! The harness's load and measurement tool (bench/README.md):
//!
//! - `produce`: writes the deterministic input (all at once, or paced at a
//!   fixed rate for the latency runs);
//! - `await`: reads output topics `read_committed` until the expected count
//!   is visible, and reports throughput, end-to-end latency, and the
//!   contender's CPU time and peak RSS from /proc;
//! - `verify-enrich`, `verify-pageviews`, `verify-fraud`: check a run's
//!   outputs against what the generator and the workload's model say;
//! - `pauses`: the rebalance benchmark's measure (the longest gap in
//!   committed output per partition after a host joins or leaves).
//! - `first-new` and `count`: the recovery benchmark's measures (the first
//!   output committed after a kill; every output counted once).
//! - `pg-insert`: the sink benchmark's baseline, a plain at-least-once
//!   batch insert into PostgreSQL (insert, then commit the offsets).
//!
//! Every command prints one JSON object on stdout.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use raw_pipe::{Kind, fraud, kafka_partition, pageviews, region};
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
    /// Produce records [first, first+count) of a kind (accounts: the whole
    /// table, no count).
    Produce {
        #[arg(long)]
        topic: String,
        #[arg(long, value_enum)]
        kind: Kind,
        #[arg(long, default_value_t = 0)]
        first: u64,
        #[arg(long)]
        count: Option<u64>,
        /// Page views: the first view's time (default: six hours ago, on a
        /// minute boundary); printed as `base_ms`, for the verifier.
        #[arg(long)]
        base_ms: Option<i64>,
        /// Records per second (default: as fast as possible).
        #[arg(long)]
        rate: Option<u64>,
        /// Only count what would be produced.
        #[arg(long)]
        dry_run: bool,
        /// Wallet payments: write each valid one in Avro (the wallet's
        /// payment schema: payment_id, account, amount) in the schema
        /// registry's wire format with this schema id; malformed ones stay
        /// JSON text (docs/formats.md; `scripts/bench formats`).
        #[arg(long, value_name = "ID", conflicts_with = "proto_schema_id")]
        avro_schema_id: Option<u32>,
        /// Wallet payments: write each valid one as the Protobuf message
        /// `Payment { string payment_id = 1; string account = 2; int64
        /// amount = 3; }` (examples/wallet-avro/schemas/payment.proto), the
        /// file's first message, in the wire format with this schema id.
        #[arg(long, value_name = "ID")]
        proto_schema_id: Option<u32>,
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
        /// With `--group`: measure throughput in input records of this
        /// topic, as the contender's consumer group commits them, and wait
        /// until all of it is committed too.
        #[arg(long, requires = "group")]
        input_topic: Option<String>,
        /// The contender's consumer group (Onceflow: `<tenant>.<name>`;
        /// Kafka Streams: the application id).
        #[arg(long, requires = "input_topic")]
        group: Option<String>,
    },
    /// Create topics, `name:partitions` or `name:partitions:compact` each
    /// (existing ones are kept).
    CreateTopics {
        #[arg(required = true)]
        topics: Vec<String>,
        /// A topic config for every topic named, `key=value` (repeatable),
        /// e.g. `message.timestamp.type=LogAppendTime`.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
    },
    /// Delete topics (missing ones are ignored).
    DeleteTopics {
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// The recovery benchmark's clock. Connects and prints
    /// `{"armed":true}`; then reads one line from stdin, the time the
    /// contender was killed (ms since the epoch, sent once it is dead),
    /// takes the end of each partition of `topics`, prints `{"ready":true}`
    /// (the harness restarts the contender then), and waits for the first
    /// record written after those ends to be visible (read_committed: a
    /// transaction of the restarted contender). With `--every-partition`,
    /// until every partition of `topics` has a new record (the failover
    /// benchmark: the survivor's own partitions go on at once, the dead
    /// host's only once they moved), and the time is the last one's.
    FirstNew {
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        #[arg(long)]
        every_partition: bool,
        #[arg(long, default_value_t = 900)]
        timeout_secs: u64,
    },
    /// The rebalance benchmark's measure. Connects at the end of every
    /// partition of `topics` (read_committed) and prints `{"armed":true}`;
    /// reads one line from stdin, the time of an event (ms since the epoch:
    /// a host started or stopped); then for `seconds` records, per
    /// partition, the longest time without a new record becoming visible,
    /// counted from the event (the pause). The same for the time between
    /// arming and the event (the baseline: commits every 100 ms make gaps
    /// of their own).
    Pauses {
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        #[arg(long)]
        seconds: u64,
    },
    /// A steady load over many topics from one producer (the rolling
    /// drill's): `--rate` fill records a second to each topic, numbered
    /// from 1 in each, until stdin closes; then flushes and prints what was
    /// sent per topic.
    ProduceMany {
        #[arg(long, value_delimiter = ',', required = true)]
        topics: Vec<String>,
        #[arg(long)]
        rate: u64,
    },
    /// The rolling-upgrade drill's measure. For each `group=topic` pair (a
    /// deployment's consumer group and its input), polls the group's
    /// committed offsets and the input's ends every `interval-ms`, from
    /// when it prints `{"armed":true}` until stdin closes. Per partition:
    /// the longest time its input waited (its end past the committed
    /// offset) with the committed offset standing still, which covers the
    /// time the partition had no owner and its new owner's restore; and
    /// every such stall longer than `report-ms`, with when it began.
    Stalls {
        #[arg(long, value_delimiter = ',', required = true)]
        pairs: Vec<String>,
        #[arg(long, default_value_t = 250)]
        interval_ms: u64,
        #[arg(long, default_value_t = 2000)]
        report_ms: i64,
    },
    /// Count the records of `topic` (read_committed, up to the end of
    /// every partition) and their distinct keys; run once the contender
    /// stopped.
    Count {
        #[arg(long)]
        topic: String,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
    },
    /// The sink benchmark's baseline: reads `topic` (read_committed, group
    /// `group`) and inserts each batch of up to `batch` JSON values into
    /// `table` (columns from the fields, as `onceflow sink postgres` does),
    /// then commits the offsets: at least once. Stops after `count`
    /// records. The password is PGPASSWORD's.
    PgInsert {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        group: String,
        #[arg(long)]
        connection: String,
        #[arg(long)]
        table: String,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 5000)]
        batch: usize,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
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
    /// Check the pageviews outputs for the views [0, count) from `base_ms`
    /// in `input` (its partition count): every window closed by its
    /// partition's stream time exactly once with its final count, nothing
    /// else; with `--dead-letter`, every late view dead-lettered once.
    VerifyPageviews {
        #[arg(long)]
        input: String,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        base_ms: i64,
        #[arg(long)]
        counts: String,
        /// Onceflow dead-letters late views (Kafka Streams drops them).
        #[arg(long)]
        dead_letter: Option<String>,
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Check the fraud alerts for payments [first, first+count) against the
    /// accounts table: every alert exactly once, nothing else; with
    /// `--dead-letter`, one dead letter per malformed payment.
    VerifyFraud {
        #[arg(long)]
        first: u64,
        #[arg(long)]
        count: u64,
        #[arg(long)]
        alerts: String,
        /// Onceflow dead-letters malformed payments (Kafka Streams drops
        /// them).
        #[arg(long)]
        dead_letter: Option<String>,
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
            base_ms,
            rate,
            dry_run,
            avro_schema_id,
            proto_schema_id,
        } => {
            let count = match (kind, count) {
                (Kind::Accounts, _) => fraud::table_records().len() as u64,
                (_, Some(count)) => count,
                (_, None) => bail!("--count is required for --kind {kind:?}"),
            };
            let input = Input::new(
                &cli.bootstrap_servers,
                &topic,
                kind,
                first,
                count,
                base_ms,
                dry_run,
            )?;
            if dry_run {
                input.expected
            } else {
                let framing = match (avro_schema_id, proto_schema_id) {
                    (Some(id), _) => Framing::Avro(id),
                    (_, Some(id)) => Framing::Protobuf(id),
                    _ => Framing::None,
                };
                produce(&cli.bootstrap_servers, &topic, input, rate, framing)?
            }
        }
        Command::Await {
            topics,
            expect,
            timeout_secs,
            pid,
            latency_from_ms,
            input_topic,
            group,
        } => await_outputs(
            &cli.bootstrap_servers,
            &topics,
            expect,
            Duration::from_secs(timeout_secs),
            pid,
            latency_from_ms,
            input_topic.as_deref().zip(group.as_deref()),
        )?,
        Command::FirstNew {
            topics,
            every_partition,
            timeout_secs,
        } => first_new(
            &cli.bootstrap_servers,
            &topics,
            every_partition,
            Duration::from_secs(timeout_secs),
        )?,
        Command::Pauses { topics, seconds } => pauses(
            &cli.bootstrap_servers,
            &topics,
            Duration::from_secs(seconds),
        )?,
        Command::ProduceMany { topics, rate } => {
            produce_many(&cli.bootstrap_servers, &topics, rate)?
        }
        Command::Stalls {
            pairs,
            interval_ms,
            report_ms,
        } => stalls(
            &cli.bootstrap_servers,
            &pairs,
            Duration::from_millis(interval_ms),
            report_ms,
        )?,
        Command::Count {
            topic,
            timeout_secs,
        } => count(
            &cli.bootstrap_servers,
            &topic,
            Duration::from_secs(timeout_secs),
        )?,
        Command::PgInsert {
            topic,
            group,
            connection,
            table,
            count,
            batch,
            timeout_secs,
        } => pg_insert(
            &cli.bootstrap_servers,
            &PgInsert {
                topic,
                group,
                connection,
                table,
                count,
                batch,
                timeout: Duration::from_secs(timeout_secs),
            },
        )?,
        Command::CreateTopics { topics, configs } => {
            create_topics(&cli.bootstrap_servers, &topics, &configs)?
        }
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
        Command::VerifyPageviews {
            input,
            count,
            base_ms,
            counts,
            dead_letter,
            timeout_secs,
        } => verify_pageviews(
            &cli.bootstrap_servers,
            &input,
            count,
            base_ms,
            &counts,
            dead_letter.as_deref(),
            Duration::from_secs(timeout_secs),
        )?,
        Command::VerifyFraud {
            first,
            count,
            alerts,
            dead_letter,
            timeout_secs,
        } => verify_fraud(
            &cli.bootstrap_servers,
            first,
            count,
            &alerts,
            dead_letter.as_deref(),
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

fn create_topics(
    bootstrap: &str,
    specs: &[String],
    configs: &[String],
) -> anyhow::Result<serde_json::Value> {
    let configs = configs
        .iter()
        .map(|c| {
            c.split_once('=')
                .with_context(|| format!("--config {c:?}: expected key=value"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut parsed = Vec::new();
    for spec in specs {
        let (rest, compact) = match spec.strip_suffix(":compact") {
            Some(rest) => (rest, true),
            None => (spec.as_str(), false),
        };
        let (name, partitions) = rest
            .rsplit_once(':')
            .with_context(|| format!("topic {spec:?}: expected name:partitions[:compact]"))?;
        let partitions: i32 = partitions
            .parse()
            .with_context(|| format!("topic {spec:?}: partitions must be a number"))?;
        parsed.push((name.to_owned(), partitions, compact));
    }
    let new: Vec<NewTopic> = parsed
        .iter()
        .map(|(name, partitions, compact)| {
            let mut topic = NewTopic::new(name, *partitions, TopicReplication::Fixed(1));
            if *compact {
                topic = topic.set("cleanup.policy", "compact");
            }
            for (key, value) in &configs {
                topic = topic.set(key, value);
            }
            topic
        })
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

/// One input record to send: to Kafka's partitioner unless `partition`,
/// stamped at send time unless `timestamp`.
struct Rec {
    key: String,
    value: Option<String>,
    partition: Option<i32>,
    timestamp: Option<i64>,
}

/// What `produce` sends, and what the contenders must make of it.
struct Input {
    records: Box<dyn Iterator<Item = Rec>>,
    /// `count`, `invalid`, `expected_outputs` (what `await` waits for) and
    /// the kind's own figures.
    expected: serde_json::Value,
}

/// The partition count of `topic`.
fn partitions_of(bootstrap: &str, topic: &str) -> anyhow::Result<i32> {
    let metadata = reader(bootstrap)?
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .with_context(|| format!("metadata of {topic}"))?;
    let n = metadata
        .topics()
        .first()
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        bail!("topic {topic} has no partitions (does it exist?)");
    }
    Ok(n)
}

impl Input {
    fn new(
        bootstrap: &str,
        topic: &str,
        kind: Kind,
        first: u64,
        count: u64,
        base_ms: Option<i64>,
        dry_run: bool,
    ) -> anyhow::Result<Input> {
        let range = first..first + count;
        Ok(match kind {
            Kind::Fill => Input {
                // One audit record per payment; none is malformed.
                records: Box::new(range.map(|i| {
                    let g = Kind::Fill.generate(i);
                    Rec {
                        key: g.key,
                        value: Some(g.value),
                        partition: None,
                        timestamp: None,
                    }
                })),
                expected: json!({"count": count, "invalid": 0, "expected_outputs": count}),
            },
            Kind::Payments | Kind::Orders => {
                let (mut invalid, mut expected_outputs) = (0u64, 0u64);
                for i in range.clone() {
                    let g = kind.generate(i);
                    if g.invalid {
                        invalid += 1;
                    } else if kind == Kind::Payments || g.output.is_some() {
                        expected_outputs += 1;
                    }
                }
                Input {
                    records: Box::new(range.map(move |i| {
                        let g = kind.generate(i);
                        Rec {
                            key: g.key,
                            value: Some(g.value),
                            partition: None,
                            timestamp: None,
                        }
                    })),
                    // Payments: one audit record per valid payment; orders:
                    // one record in large or standard per valid order with a
                    // positive amount.
                    expected: json!({
                        "count": count,
                        "invalid": invalid,
                        "expected_outputs": expected_outputs,
                    }),
                }
            }
            Kind::Fraud => {
                // Co-partitioned with the accounts: both sent to Kafka's
                // partition of the account explicitly. (A dry run counts
                // without the topic.)
                let partitions = if dry_run {
                    1
                } else {
                    partitions_of(bootstrap, topic)?
                };
                let table = fraud::table();
                let (mut invalid, mut alerts) = (0u64, 0u64);
                for i in range.clone() {
                    if fraud::payment(i).invalid {
                        invalid += 1;
                    } else if fraud::alert(i, &table).is_some() {
                        alerts += 1;
                    }
                }
                Input {
                    records: Box::new(range.map(move |i| {
                        let g = fraud::payment(i);
                        let partition = kafka_partition(g.key.as_bytes(), partitions);
                        Rec {
                            key: g.key,
                            value: Some(g.value),
                            partition: Some(partition),
                            // Send time: later than every account, and what
                            // the latency is measured from.
                            timestamp: None,
                        }
                    })),
                    expected: json!({
                        "count": count,
                        "invalid": invalid,
                        // One alert per valid payment on an account in the
                        // table that is blocked or whose limit it exceeds.
                        "expected_outputs": alerts,
                        "accounts": table.len(),
                    }),
                }
            }
            Kind::Accounts => {
                let partitions = partitions_of(bootstrap, topic)?;
                let records = fraud::table_records();
                let count = records.len();
                // An hour ago, a millisecond apart: before every payment in
                // time, so both engines apply the whole table first.
                let base = now_ms() - 3600 * 1000;
                Input {
                    records: Box::new(records.into_iter().enumerate().map(
                        move |(n, (key, value))| Rec {
                            partition: Some(kafka_partition(key.as_bytes(), partitions)),
                            key,
                            value,
                            timestamp: Some(base + n as i64),
                        },
                    )),
                    expected: json!({
                        "count": count,
                        "invalid": 0,
                        "expected_outputs": 0,
                        "accounts": fraud::table().len(),
                    }),
                }
            }
            Kind::Pageviews => {
                let partitions = partitions_of(bootstrap, topic)?;
                let base = base_ms.unwrap_or_else(|| pageviews::base(now_ms()));
                let all = pageviews::views((first + count) as usize, base);
                let model = pageviews::model(&all, partitions);
                let last_ms = all.iter().map(|v| v.1).max();
                Input {
                    records: Box::new(all.into_iter().skip(first as usize).map(
                        move |(page, at)| Rec {
                            partition: Some(kafka_partition(page.as_bytes(), partitions)),
                            value: Some(pageviews::value(&page)),
                            key: page,
                            timestamp: Some(at),
                        },
                    )),
                    expected: json!({
                        "count": count,
                        "invalid": 0,
                        // One final count per window closed by the end of
                        // its partition's stream time (of the views
                        // [0, first + count)).
                        "expected_outputs": model.closed.len(),
                        "late": model.late_count(),
                        "open_windows": model.open,
                        "base_ms": base,
                        "last_ms": last_ms,
                        "partitions": partitions,
                    }),
                }
            }
        })
    }
}

/// How `produce` writes valid wallet payments.
#[derive(Clone, Copy)]
enum Framing {
    /// As their JSON text.
    None,
    /// Avro, in the wire format with this schema id.
    Avro(u32),
    /// Protobuf, in the wire format with this schema id.
    Protobuf(u32),
}

/// A wallet payment's JSON as the Protobuf message `Payment` (fields 1
/// and 2 strings, 3 an int64), the schema's first message (indexes `[0]`:
/// one 0 byte), in the schema registry's wire format; `None` when it is
/// no such payment.
fn proto_payment(id: u32, json: &str) -> Option<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.push(0);
    let varint = |out: &mut Vec<u8>, mut n: u64| {
        while n >= 0x80 {
            out.push((n as u8) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
    };
    for (tag, field) in [(0x0a, "payment_id"), (0x12, "account")] {
        let s = v.get(field)?.as_str()?;
        out.push(tag);
        varint(&mut out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    let amount = v.get("amount")?.as_i64()?;
    if amount != 0 {
        out.push(0x18);
        varint(&mut out, amount as u64);
    }
    Some(out)
}

/// A wallet payment's JSON as an Avro datum of the payment schema
/// (`{"payment_id": string, "account": string, "amount": long}`), in the
/// schema registry's wire format; `None` when it is no such payment.
fn avro_payment(id: u32, json: &str) -> Option<Vec<u8>> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    let long = |out: &mut Vec<u8>, n: i64| {
        let mut z = ((n << 1) ^ (n >> 63)) as u64;
        while z >= 0x80 {
            out.push((z as u8) | 0x80);
            z >>= 7;
        }
        out.push(z as u8);
    };
    for field in ["payment_id", "account"] {
        let s = v.get(field)?.as_str()?;
        long(&mut out, s.len() as i64);
        out.extend_from_slice(s.as_bytes());
    }
    long(&mut out, v.get("amount")?.as_i64()?);
    Some(out)
}

fn produce(
    bootstrap: &str,
    topic: &str,
    input: Input,
    rate: Option<u64>,
    framing: Framing,
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
    let mut count = 0u64;
    for (n, r) in input.records.enumerate() {
        if let Some(rate) = rate {
            // Send record n at n/rate seconds after the start.
            let due = Duration::from_secs_f64(n as f64 / rate as f64);
            let elapsed = started.elapsed();
            if due > elapsed {
                producer.poll(Duration::ZERO);
                std::thread::sleep(due - elapsed);
            }
        }
        let value: Option<Vec<u8>> = r.value.map(|v| {
            match framing {
                Framing::None => None,
                Framing::Avro(id) => avro_payment(id, &v),
                Framing::Protobuf(id) => proto_payment(id, &v),
            }
            .unwrap_or_else(|| v.into_bytes())
        });
        let mut record = BaseRecord::<String, Vec<u8>>::to(topic).key(&r.key);
        if let Some(value) = &value {
            record = record.payload(value);
        }
        if let Some(p) = r.partition {
            record = record.partition(p);
        }
        if let Some(at) = r.timestamp {
            record = record.timestamp(at);
        }
        send_waiting(&producer, record).context("producing the input")?;
        producer.poll(Duration::ZERO);
        count += 1;
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the input")?;
    let seconds = started.elapsed().as_secs_f64();
    let mut out = input.expected;
    out["started_ms"] = json!(started_ms);
    out["seconds"] = json!(seconds);
    out["rate"] = json!(count as f64 / seconds.max(1e-9));
    Ok(out)
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
    for (topic, p) in partitions(consumer, topics)? {
        tpl.add_partition_offset(&topic, p, Offset::Beginning)?;
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

/// A contender's progress through an input topic: the offsets its consumer
/// group has committed (stable ones: with exactly_once_v2, committed with the
/// outputs of the same transaction).
struct InputProgress {
    consumer: BaseConsumer,
    partitions: TopicPartitionList,
    /// The topic's end (all of it was produced before the contender started).
    end: i64,
}

impl InputProgress {
    fn new(bootstrap: &str, topic: &str, group: &str) -> anyhow::Result<InputProgress> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // Fetching offsets only, never joining the group. Not
            // read_committed: librdkafka would then ask for stable offsets
            // and wait out every open transaction instead of answering with
            // the last committed offsets.
            .set("isolation.level", "read_uncommitted")
            .create()
            .context("creating the progress reader")?;
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of {topic}"))?;
        let mut partitions = TopicPartitionList::new();
        let mut end = 0;
        for p in metadata
            .topics()
            .first()
            .map_or(&[][..], |t| t.partitions())
        {
            partitions.add_partition(topic, p.id());
            let (_, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .with_context(|| format!("watermarks of {topic}/{}", p.id()))?;
            end += high;
        }
        if partitions.count() == 0 {
            bail!("topic {topic} has no partitions (does it exist?)");
        }
        Ok(InputProgress {
            consumer,
            partitions,
            end,
        })
    }

    /// Input records committed so far.
    fn committed(&self) -> i64 {
        match self
            .consumer
            .committed_offsets(self.partitions.clone(), Duration::from_secs(5))
        {
            Ok(tpl) => tpl
                .elements()
                .iter()
                .map(|e| match e.offset() {
                    Offset::Offset(o) => o,
                    _ => 0,
                })
                .sum(),
            Err(e) => {
                eprintln!("bench-tool: committed offsets: {e}");
                0
            }
        }
    }
}

fn await_outputs(
    bootstrap: &str,
    topics: &[String],
    expect: u64,
    timeout: Duration,
    pid: Option<u32>,
    latency_from_ms: Option<i64>,
    input: Option<(&str, &str)>,
) -> anyhow::Result<serde_json::Value> {
    let consumer = reader(bootstrap)?;
    assign_from_start(&consumer, topics)?;
    let progress = match input {
        Some((topic, group)) => Some(InputProgress::new(bootstrap, topic, group)?),
        None => None,
    };
    let started = Instant::now();
    let mut seen = 0u64;
    // At the first visible output: when, how many, the contender's CPU.
    let mut first: Option<(Instant, u64, Option<f64>)> = None;
    // The same for the input records committed (with `progress`), and when
    // the last of them was.
    let mut first_input: Option<(Instant, i64, Option<f64>)> = None;
    let mut last_input: Option<Instant> = None;
    let mut committed = 0i64;
    let mut checked = Instant::now() - Duration::from_secs(1);
    let mut output_end = None;
    let mut latencies: Vec<i64> = Vec::new();
    loop {
        if let Some(progress) = &progress
            && last_input.is_none()
            && checked.elapsed() >= Duration::from_millis(50)
        {
            checked = Instant::now();
            committed = progress.committed();
            if committed > 0 && first_input.is_none() {
                first_input = Some((checked, committed, pid.and_then(proc_usage).map(|u| u.0)));
            }
            if committed >= progress.end {
                last_input = Some(checked);
            }
        }
        let inputs_done = progress.is_none() || last_input.is_some();
        if seen >= expect && inputs_done {
            break;
        }
        if started.elapsed() > timeout {
            let inputs = progress.as_ref().map_or(String::new(), |p| {
                format!(", {committed} of {} input records committed", p.end)
            });
            bail!(
                "timed out after {}s: {seen} of {expect} records visible in {topics:?}{inputs}",
                timeout.as_secs()
            );
        }
        let wait = if seen >= expect { 10 } else { 50 };
        match consumer.poll(Duration::from_millis(wait)) {
            Some(Ok(m)) => {
                let now = now_ms();
                seen += 1;
                if first.is_none() {
                    first = Some((Instant::now(), seen, pid.and_then(proc_usage).map(|u| u.0)));
                }
                if seen == expect {
                    output_end = Some(Instant::now());
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
    let output_end = output_end.unwrap_or(end);
    let (first_at, first_seen, first_cpu) = first.unwrap_or((output_end, 0, None));
    let output_window = output_end.duration_since(first_at).as_secs_f64();
    let output_counted = seen - first_seen;
    let output_throughput = if output_window > 0.0 {
        output_counted as f64 / output_window
    } else {
        0.0
    };
    latencies.sort_unstable();
    let mut out = json!({
        "seen": seen,
        // Records that became visible after the first one, over the time
        // from the first visible output to the last.
        "throughput": output_throughput,
        "window_seconds": output_window,
        "since_start_seconds": end.duration_since(started).as_secs_f64(),
        "cpu_seconds": match (usage, first_cpu) { (Some((end, _)), Some(start)) => Some(end - start), _ => None },
        "cpu_seconds_total": usage.map(|u| u.0),
        "counted": output_counted,
        "peak_rss_bytes": usage.map(|u| u.1),
        "latency_samples": latencies.len(),
        "latency_p50_ms": percentile(&latencies, 0.50),
        "latency_p99_ms": percentile(&latencies, 0.99),
        "latency_max_ms": latencies.last(),
    });
    if let (Some(progress), Some((first_at, first_committed, first_cpu)), Some(last_at)) =
        (&progress, first_input, last_input)
    {
        // The same measure in input records: those committed after the
        // first commit seen, over the time from it to the last.
        let window = last_at.duration_since(first_at).as_secs_f64();
        let counted = progress.end - first_committed;
        out["measured_in"] = json!("input records committed");
        out["output_throughput"] = json!(output_throughput);
        out["output_window_seconds"] = json!(output_window);
        out["output_counted"] = json!(output_counted);
        out["throughput"] = json!(if window > 0.0 {
            counted as f64 / window
        } else {
            0.0
        });
        out["window_seconds"] = json!(window);
        out["counted"] = json!(counted);
        out["input_records"] = json!(progress.end);
        out["cpu_seconds"] = json!(match (usage, first_cpu) {
            (Some((end, _)), Some(start)) => Some(end - start),
            _ => None,
        });
    }
    Ok(out)
}

/// Every partition of `topics`. A topic created a moment ago may not be in
/// the broker's metadata yet (the density harness creates a hundred at
/// once, then reads them): each is waited for up to 30 s.
fn partitions(consumer: &BaseConsumer, topics: &[String]) -> anyhow::Result<Vec<(String, i32)>> {
    let mut all = Vec::new();
    for topic in topics {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let metadata = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .with_context(|| format!("metadata of {topic}"))?;
            let found: Vec<i32> = metadata
                .topics()
                .first()
                .map(|t| t.partitions().iter().map(|p| p.id()).collect())
                .unwrap_or_default();
            if !found.is_empty() {
                all.extend(found.into_iter().map(|p| (topic.clone(), p)));
                break;
            }
            if Instant::now() >= deadline {
                bail!("topic {topic} has no partitions after 30 s (does it exist?)");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(all)
}

fn first_new(
    bootstrap: &str,
    topics: &[String],
    every_partition: bool,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    use std::io::{BufRead as _, Write as _};
    let consumer = reader(bootstrap)?;
    // The high watermark, not the last stable offset (what a read_committed
    // client's ListOffsets answers): every record below it was written
    // before the kill, even one whose commit marker the coordinator writes
    // later (an EndTxn sent just before the kill); every record at or above
    // it, by the restarted process.
    let sampler: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "onceflow-bench-reader")
        .set("isolation.level", "read_uncommitted")
        .create()
        .context("creating the watermark reader")?;
    let all = partitions(&consumer, topics)?;
    // Connected (the metadata above), so that sampling after the kill is
    // one request per partition, not a client's start.
    for (topic, p) in &all {
        sampler
            .fetch_watermarks(topic, *p, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
    }
    println!("{}", json!({"armed": true}));
    std::io::stdout().flush().context("stdout")?;
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .context("reading the kill time from stdin")?;
    let killed_at_ms: i64 = line
        .trim()
        .parse()
        .with_context(|| format!("expected the kill time in ms on stdin, got {line:?}"))?;
    let mut tpl = TopicPartitionList::new();
    for (topic, p) in &all {
        let (_, high) = sampler
            .fetch_watermarks(topic, *p, Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{p}"))?;
        tpl.add_partition_offset(topic, *p, Offset::Offset(high))?;
    }
    consumer.assign(&tpl).context("assigning partitions")?;
    let sampled_ms = now_ms();
    println!("{}", json!({"ready": true, "sampled_ms": sampled_ms}));
    std::io::stdout().flush().context("stdout")?;
    let started = Instant::now();
    // Per partition, when its first new record became visible.
    let mut seen: std::collections::BTreeMap<(String, i32), i64> = Default::default();
    while started.elapsed() < timeout {
        match consumer.poll(Duration::from_millis(20)) {
            Some(Ok(m)) if every_partition => {
                let now = now_ms();
                seen.entry((m.topic().to_owned(), m.partition()))
                    .or_insert(now - killed_at_ms);
                if seen.len() == all.len() {
                    let (last, ms) = seen
                        .iter()
                        .max_by_key(|(_, ms)| **ms)
                        .expect("every partition seen");
                    return Ok(json!({
                        "first_visible_ms": now,
                        "recovery_ms": ms,
                        "sampled_after_kill_ms": sampled_ms - killed_at_ms,
                        "topic": last.0,
                        "partition": last.1,
                        "per_partition_ms": seen.values().collect::<Vec<_>>(),
                    }));
                }
            }
            Some(Ok(m)) => {
                let now = now_ms();
                return Ok(json!({
                    "first_visible_ms": now,
                    "recovery_ms": now - killed_at_ms,
                    "sampled_after_kill_ms": sampled_ms - killed_at_ms,
                    "topic": m.topic(),
                    "partition": m.partition(),
                    "offset": m.offset(),
                }));
            }
            Some(Err(e)) => eprintln!("bench-tool: reader error: {e}"),
            None => {}
        }
    }
    bail!(
        "no new record in {topics:?} ({} of {} partitions had one) within {}s of the kill",
        seen.len(),
        all.len(),
        timeout.as_secs()
    )
}

fn pauses(
    bootstrap: &str,
    topics: &[String],
    window: Duration,
) -> anyhow::Result<serde_json::Value> {
    use std::io::{BufRead as _, Write as _};
    let consumer = reader(bootstrap)?;
    let all = partitions(&consumer, topics)?;
    let mut tpl = TopicPartitionList::new();
    for (topic, p) in &all {
        tpl.add_partition_offset(topic, *p, Offset::End)?;
    }
    consumer.assign(&tpl).context("assigning partitions")?;
    let armed_ms = now_ms();
    // The event time arrives on stdin while the reader goes on polling.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(line);
    });
    println!("{}", json!({"armed": true}));
    std::io::stdout().flush().context("stdout")?;
    let mut last: BTreeMap<(String, i32), i64> =
        all.iter().map(|tp| (tp.clone(), armed_ms)).collect();
    let mut baseline: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut pause: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut event_ms: Option<i64> = None;
    loop {
        if event_ms.is_none()
            && let Ok(line) = rx.try_recv()
        {
            let at: i64 = line
                .trim()
                .parse()
                .with_context(|| format!("expected the event time in ms on stdin, got {line:?}"))?;
            // Gaps so far are the baseline; from here on, gaps count from
            // the event at the earliest.
            for (tp, seen) in &mut last {
                let gap = at - *seen;
                let b = baseline.entry(tp.clone()).or_insert(0);
                *b = (*b).max(gap);
                *seen = at.max(*seen);
            }
            event_ms = Some(at);
        }
        let now = now_ms();
        if let Some(at) = event_ms
            && now - at >= window.as_millis() as i64
        {
            for (tp, seen) in &last {
                let p = pause.entry(tp.clone()).or_insert(0);
                *p = (*p).max(now - *seen);
            }
            break;
        }
        match consumer.poll(Duration::from_millis(10)) {
            Some(Ok(m)) => {
                let tp = (m.topic().to_owned(), m.partition());
                let seen = last.entry(tp.clone()).or_insert(now);
                let gap = now - *seen;
                let into = if event_ms.is_some() {
                    &mut pause
                } else {
                    &mut baseline
                };
                let g = into.entry(tp).or_insert(0);
                *g = (*g).max(gap);
                *seen = now;
            }
            Some(Err(e)) => eprintln!("bench-tool: reader error: {e}"),
            None => {}
        }
    }
    let max = |m: &BTreeMap<(String, i32), i64>| m.values().copied().max().unwrap_or(0);
    let per_partition: Vec<serde_json::Value> = pause
        .iter()
        .map(|((t, p), ms)| json!({"topic": t, "partition": p, "pause_ms": ms}))
        .collect();
    Ok(json!({
        "baseline_max_gap_ms": max(&baseline),
        "max_pause_ms": max(&pause),
        "per_partition": per_partition,
        "window_ms": window.as_millis() as u64,
    }))
}

/// Prints `{"armed":true}`; the receiver hears when stdin closes (the
/// harness's signal to finish).
fn armed_until_stdin_closes() -> anyhow::Result<std::sync::mpsc::Receiver<()>> {
    use std::io::{Read as _, Write as _};
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = std::io::stdin().lock().read_to_end(&mut rest);
        let _ = tx.send(());
    });
    println!("{}", json!({"armed": true}));
    std::io::stdout().flush().context("stdout")?;
    Ok(rx)
}

/// Sends `record`, waiting while the producer's queue is full.
fn send_waiting<V: rdkafka::message::ToBytes + ?Sized>(
    producer: &BaseProducer,
    mut record: BaseRecord<'_, String, V>,
) -> Result<(), KafkaError> {
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(5));
            }
            Err((e, _)) => return Err(e),
        }
    }
}

/// See `Command::ProduceMany`.
fn produce_many(
    bootstrap: &str,
    topics: &[String],
    rate: u64,
) -> anyhow::Result<serde_json::Value> {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .set("queue.buffering.max.messages", "500000")
        .create()
        .context("creating the producer")?;
    let rx = armed_until_stdin_closes()?;
    let started = Instant::now();
    // Records sent to each topic so far (the same for all: one round each).
    let mut sent = 0u64;
    while rx.try_recv().is_err() {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while sent < due {
            sent += 1;
            let g = Kind::Fill.generate(sent);
            for topic in topics {
                let record = BaseRecord::<String, String>::to(topic)
                    .key(&g.key)
                    .payload(&g.value);
                send_waiting(&producer, record).context("producing")?;
            }
        }
        producer.poll(Duration::from_millis(20));
    }
    // What is not acknowledged by then is not in the inputs either: the
    // drill counts the inputs themselves.
    if let Err(e) = producer.flush(Duration::from_secs(120)) {
        eprintln!("bench-tool: flushing the load: {e}");
    }
    Ok(json!({
        "unacknowledged": producer.in_flight_count(),
        "per_topic": sent,
        "topics": topics.len(),
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

/// See `Command::Stalls`.
fn stalls(
    bootstrap: &str,
    pairs: &[String],
    interval: Duration,
    report_ms: i64,
) -> anyhow::Result<serde_json::Value> {
    struct Watched {
        group: String,
        topic: String,
        partitions: i32,
        /// The group's own client: committed offsets are per group.
        client: BaseConsumer,
    }
    let mut watched = Vec::new();
    for pair in pairs {
        let Some((group, topic)) = pair.split_once('=') else {
            bail!("--pairs: expected group=topic, got {pair:?}");
        };
        let client: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            // Offsets as last committed, without waiting for a
            // transaction in flight to end (KIP-447's stable offsets).
            .set("isolation.level", "read_uncommitted")
            .create()
            .context("creating a group's reader")?;
        watched.push(Watched {
            group: group.to_owned(),
            topic: topic.to_owned(),
            partitions: partitions_of(bootstrap, topic)?,
            client,
        });
    }
    let ends_reader = reader(bootstrap)?;
    let rx = armed_until_stdin_closes()?;
    // Per (group, partition): the committed offset and since when.
    let mut since: BTreeMap<(String, i32), (i64, i64)> = BTreeMap::new();
    let mut longest: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let mut long_ones: Vec<serde_json::Value> = Vec::new();
    let mut polls = 0u64;
    while rx.try_recv().is_err() {
        let started = Instant::now();
        let mut ends = TopicPartitionList::new();
        for w in &watched {
            for p in 0..w.partitions {
                ends.add_partition_offset(&w.topic, p, Offset::End)?;
            }
        }
        let ends = match ends_reader.offsets_for_times(ends, Duration::from_secs(10)) {
            Ok(ends) => ends,
            Err(e) => {
                eprintln!("bench-tool: ends: {e}");
                continue;
            }
        };
        for w in &watched {
            let mut tpl = TopicPartitionList::new();
            for p in 0..w.partitions {
                tpl.add_partition(&w.topic, p);
            }
            let committed = match w.client.committed_offsets(tpl, Duration::from_secs(10)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("bench-tool: committed offsets of {}: {e}", w.group);
                    continue;
                }
            };
            let now = now_ms();
            for p in 0..w.partitions {
                let at = |l: &TopicPartitionList| match l
                    .find_partition(&w.topic, p)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) => o,
                    _ => 0,
                };
                let (c, end) = (at(&committed), at(&ends));
                let key = (w.group.clone(), p);
                let entry = since.entry(key.clone()).or_insert((c, now));
                // Input waited past what was committed when last seen, for
                // this long with no commit.
                let stalled = if end > entry.0 { now - entry.1 } else { 0 };
                let l = longest.entry(key).or_insert(0);
                *l = (*l).max(stalled);
                if c != entry.0 || c >= end {
                    // Moved, or nothing waits: a stall (if any) ended.
                    if stalled >= report_ms {
                        long_ones.push(json!({
                            "group": w.group, "partition": p,
                            "from_ms": entry.1, "ms": stalled,
                        }));
                    }
                    *entry = (c, now);
                }
            }
        }
        polls += 1;
        if let Some(rest) = interval.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    let mut per_partition: Vec<serde_json::Value> = longest
        .iter()
        .map(|((g, p), ms)| json!({"group": g, "partition": p, "longest_stall_ms": ms}))
        .collect();
    per_partition.sort_by_key(|v| -v["longest_stall_ms"].as_i64().unwrap_or(0));
    Ok(json!({
        "max_stall_ms": longest.values().copied().max().unwrap_or(0),
        "polls": polls,
        "partitions": since.len(),
        "worst": per_partition.into_iter().take(20).collect::<Vec<_>>(),
        "stalls_over_report_ms": long_ones,
    }))
}

/// A read_committed reader that reports each partition's end.
fn eof_reader(bootstrap: &str) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "onceflow-bench-reader")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .context("creating the reader")
}

/// Counts `topic`'s committed records and distinct keys (without keeping
/// the records, unlike [`read_all`]: the recovery benchmark's 10 M).
fn count(bootstrap: &str, topic: &str, timeout: Duration) -> anyhow::Result<serde_json::Value> {
    let consumer = eof_reader(bootstrap)?;
    let topics = [topic.to_string()];
    let mut open: HashSet<i32> = partitions(&consumer, &topics)?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assign_from_start(&consumer, &topics)?;
    let mut keys: HashSet<Vec<u8>> = HashSet::new();
    let (mut records, mut keyless) = (0u64, 0u64);
    let started = Instant::now();
    while !open.is_empty() {
        if started.elapsed() > timeout {
            bail!(
                "timed out after {}s with {records} records of {topic} counted; partitions not read to their end: {open:?}",
                timeout.as_secs()
            );
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                records += 1;
                match m.key() {
                    Some(k) => {
                        keys.insert(k.to_vec());
                    }
                    None => keyless += 1,
                }
                // A record after a partition's end (written since): read on.
                open.insert(m.partition());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
            }
            Some(Err(e)) => eprintln!("bench-tool: reader error: {e}"),
            None => {}
        }
    }
    // A read_committed reader stops at a partition's last stable offset:
    // short of its high watermark, a transaction there is still open (or
    // hanging), and what follows it is not visible yet.
    // (A read_committed client's watermark query answers the last stable
    // offset: the high watermark needs a read_uncommitted one.)
    let mut unstable = Vec::new();
    let uncommitted: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("isolation.level", "read_uncommitted")
        .create()
        .context("creating the watermark reader")?;
    let positions = consumer.position().context("reading the positions")?;
    for e in positions.elements() {
        let (_, high) = uncommitted
            .fetch_watermarks(topic, e.partition(), Duration::from_secs(10))
            .with_context(|| format!("watermarks of {topic}/{}", e.partition()))?;
        if let Offset::Offset(at) = e.offset()
            && at < high
        {
            unstable
                .push(json!({"partition": e.partition(), "stable_to": at, "high_watermark": high}));
        }
    }
    Ok(
        json!({"records": records, "distinct_keys": keys.len(), "keyless": keyless,
              "open_transactions": unstable}),
    )
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
        for Read { key, value, .. } in read_all(bootstrap, topic, timeout)? {
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
        .filter(|r| r.has_coordinates)
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

/// The findings of a verifier as its report; an error if there are any.
fn conclude(
    what: &str,
    findings: Vec<String>,
    mut report: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    let exact = findings.is_empty();
    report["exact"] = json!(exact);
    report["findings"] = json!(findings);
    if !exact {
        bail!("{what} outputs are wrong: {report}");
    }
    Ok(report)
}

fn verify_pageviews(
    bootstrap: &str,
    input: &str,
    count: u64,
    base_ms: i64,
    counts: &str,
    dead_letter: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let partitions = partitions_of(bootstrap, input)?;
    let views = pageviews::views(count as usize, base_ms);
    let expected = pageviews::model(&views, partitions);
    let mut findings: Vec<String> = Vec::new();
    // (page, start) -> how many times emitted.
    let mut seen: BTreeMap<(String, i64), u32> = BTreeMap::new();
    let (mut foreign, mut wrong, mut malformed) = (0u64, 0u64, 0u64);
    for Read { key, value, .. } in read_all(bootstrap, counts, timeout)? {
        let v: serde_json::Value = serde_json::from_slice(&value).unwrap_or_default();
        let (Some(page), Some(start), Some(end), Some(n)) = (
            v["page"].as_str(),
            v["start"].as_i64(),
            v["end"].as_i64(),
            v["count"].as_u64(),
        ) else {
            malformed += 1;
            continue;
        };
        if key != page || end != start + pageviews::SIZE {
            wrong += 1;
        }
        let window = (page.to_owned(), start);
        match expected.closed.get(&window) {
            None => foreign += 1,
            Some(&want) => {
                if want != n {
                    wrong += 1;
                }
                *seen.entry(window).or_insert(0) += 1;
            }
        }
    }
    let missing = expected.closed.len() - seen.len();
    let duplicates: u32 = seen.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    if missing > 0 {
        findings.push(format!("{missing} closed windows missing"));
    }
    if duplicates > 0 {
        findings.push(format!("{duplicates} windows emitted more than once"));
    }
    if foreign > 0 {
        findings.push(format!(
            "{foreign} counts of windows not closed (or never viewed)"
        ));
    }
    if wrong > 0 {
        findings.push(format!("{wrong} counts with a wrong count, key or end"));
    }
    if malformed > 0 {
        findings.push(format!("{malformed} outputs are not counts"));
    }
    let mut report = json!({
        "expected": expected.closed.len(),
        "seen": seen.len(),
        "views": count,
        "late": expected.late_count(),
        "open_windows": expected.open,
    });
    if let Some(dead_letter) = dead_letter {
        // Every late view once, by page and time (the time from the
        // reason: "late record: view of <page> at <ms> arrived ...").
        let mut late: BTreeMap<(String, i64), u64> = BTreeMap::new();
        let mut other = 0u64;
        for r in read_all(bootstrap, dead_letter, timeout)? {
            let at = r
                .error
                .as_deref()
                .filter(|e| e.starts_with("late record: ") && r.has_coordinates)
                .and_then(|e| e.split(" at ").nth(1))
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse::<i64>().ok());
            match at {
                Some(at) => *late.entry((r.key, at)).or_default() += 1,
                None => other += 1,
            }
        }
        let dead_lettered: u64 = late.values().sum();
        if late != expected.late {
            findings.push(format!(
                "{dead_lettered} late views dead-lettered, expected {} (or not the same views)",
                expected.late_count()
            ));
        }
        if other > 0 {
            findings.push(format!("{other} dead letters that are not late views"));
        }
        report["dead_letters"] = json!(dead_lettered + other);
    }
    conclude("pageviews", findings, report)
}

fn verify_fraud(
    bootstrap: &str,
    first: u64,
    count: u64,
    alerts: &str,
    dead_letter: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<serde_json::Value> {
    let table = fraud::table();
    // account -> the alert values it must get.
    let mut expected: HashMap<(String, String), u32> = HashMap::new();
    let mut invalid = 0u64;
    for i in first..first + count {
        if fraud::payment(i).invalid {
            invalid += 1;
        }
        if let Some(alert) = fraud::alert(i, &table) {
            expected.insert((fraud::payment(i).key, alert), 0);
        }
    }
    let mut foreign = 0u64;
    for Read { key, value, .. } in read_all(bootstrap, alerts, timeout)? {
        let value = String::from_utf8_lossy(&value).into_owned();
        match expected.get_mut(&(key, value)) {
            Some(n) => *n += 1,
            None => foreign += 1,
        }
    }
    let missing = expected.values().filter(|n| **n == 0).count();
    let duplicates: u32 = expected.values().filter(|n| **n > 1).map(|n| n - 1).sum();
    let mut findings: Vec<String> = Vec::new();
    if missing > 0 {
        findings.push(format!("{missing} alerts missing"));
    }
    if duplicates > 0 {
        findings.push(format!("{duplicates} duplicate alerts"));
    }
    if foreign > 0 {
        findings.push(format!(
            "{foreign} alerts that match no expected alert (key and value)"
        ));
    }
    let mut report = json!({
        "expected": expected.len(),
        "seen": expected.len() - missing,
        "payments": count,
        "invalid": invalid,
    });
    if let Some(dead_letter) = dead_letter {
        let dead_letters = read_all(bootstrap, dead_letter, timeout)?
            .into_iter()
            .filter(|r| r.has_coordinates)
            .count() as u64;
        if dead_letters != invalid {
            findings.push(format!(
                "{dead_letters} dead letters with coordinates, expected {invalid}"
            ));
        }
        report["dead_letters"] = json!(dead_letters);
    }
    conclude("fraud", findings, report)
}

/// A committed record, as the verifiers need it.
struct Read {
    key: String,
    value: Vec<u8>,
    /// It has the dead-letter coordinate headers.
    has_coordinates: bool,
    /// The dead-letter reason header.
    error: Option<String>,
}

/// Every committed record of `topic`. Reads each partition to its end
/// (partition EOF, as `onceflow verify` does).
fn read_all(bootstrap: &str, topic: &str, timeout: Duration) -> anyhow::Result<Vec<Read>> {
    let consumer = eof_reader(bootstrap)?;
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
    let mut ended = HashSet::new();
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
                let error = m.headers().and_then(|h| {
                    h.iter()
                        .find(|h| h.key == raw_pipe::dead_letter_headers::ERROR)
                        .map(|h| String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned())
                });
                records.push(Read {
                    key,
                    value: m.payload().unwrap_or_default().to_vec(),
                    has_coordinates,
                    error,
                });
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

struct PgInsert {
    topic: String,
    group: String,
    connection: String,
    table: String,
    count: u64,
    batch: usize,
    timeout: Duration,
}

/// A plain at-least-once batch insert: per batch, one INSERT of the values
/// (autocommit), then the offsets. Prints the records/s from the first
/// insert to the last.
fn pg_insert(bootstrap: &str, a: &PgInsert) -> anyhow::Result<serde_json::Value> {
    let mut config: postgres::Config = a.connection.parse().context("--connection")?;
    if let Ok(p) = std::env::var("PGPASSWORD") {
        config.password(p);
    }
    let mut db = config
        .connect(postgres::NoTls)
        .context("connecting to PostgreSQL")?;
    let insert = db.prepare(&format!(
        "INSERT INTO {t} SELECT * FROM jsonb_populate_recordset(NULL::{t}, $1::jsonb)",
        t = a.table
    ))?;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", &a.group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&[&a.topic])?;
    let deadline = Instant::now() + a.timeout;
    let mut done = 0u64;
    let mut first: Option<Instant> = None;
    let mut batches = 0u64;
    while done < a.count {
        if Instant::now() > deadline {
            bail!(
                "{done} of {} records inserted after {:?}",
                a.count,
                a.timeout
            );
        }
        let mut rows = Vec::with_capacity(a.batch);
        let started = Instant::now();
        while rows.len() < a.batch && started.elapsed() < Duration::from_millis(100) {
            match consumer.poll(Duration::from_millis(20)) {
                Some(Ok(m)) => {
                    if let Some(v) = m.payload().and_then(|v| serde_json::from_slice(v).ok()) {
                        rows.push(v);
                    }
                }
                Some(Err(e)) => bail!("consumer: {e}"),
                None => {}
            }
        }
        if rows.is_empty() {
            continue;
        }
        done += rows.len() as u64;
        db.execute(&insert, &[&serde_json::Value::Array(rows)])?;
        first.get_or_insert_with(Instant::now);
        consumer.commit_consumer_state(rdkafka::consumer::CommitMode::Async)?;
        batches += 1;
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    Ok(json!({"records": done, "batches": batches, "seconds": secs}))
}
