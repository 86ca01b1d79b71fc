//! The ceiling: a consume-transform-produce loop straight on rdkafka, with
//! Kafka transactions (exactly-once v2: `send_offsets_to_transaction` with
//! the consumer's group metadata) and no Wasm. It commits every
//! `--commit-interval-ms`, like Onceflow and Kafka Streams do. With
//! `--changelog` the wallet keeps its balances in a map and writes the
//! records Onceflow's wallet writes, the changed balances to that topic at
//! each commit included (`raw_pipe::Balances`); without it the wallet keeps
//! no state.
//!
//! It is meant for one instance per group (the benchmark's case): it does not
//! abort the open transaction on a rebalance. On SIGTERM/SIGINT it commits
//! what it has and exits.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use raw_pipe::{Balances, Transform, dead_letter_headers};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

#[derive(Debug, Parser)]
#[command(about = "A raw transactional consume-transform-produce loop (benchmark ceiling)")]
struct Args {
    #[arg(long)]
    bootstrap_servers: String,
    /// Consumer group (and transactional id prefix).
    #[arg(long)]
    group: String,
    #[arg(long)]
    input: String,
    /// Output topics, comma-separated: wallet = accounts,audit;
    /// enrich = large,standard.
    #[arg(long, value_delimiter = ',', required = true)]
    outputs: Vec<String>,
    #[arg(long)]
    dead_letter: String,
    #[arg(long, value_enum)]
    transform: Transform,
    #[arg(long, default_value_t = 100)]
    commit_interval_ms: u64,
    /// The wallet with its balances: a compacted topic with the input's
    /// partition count, for the changed balances at each commit (on their
    /// input's partition).
    #[arg(long)]
    changelog: Option<String>,
}

const TIMEOUT: Duration = Duration::from_secs(30);

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.changelog.is_some() && args.transform != Transform::Wallet {
        bail!("--changelog keeps the wallet's balances: use it with --transform wallet");
    }
    // With --changelog: its topic and the balances it records.
    let mut stateful = args
        .changelog
        .clone()
        .map(|topic| (topic, Balances::default()));
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("installing signal handlers")?;
    }

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("group.id", &args.group)
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        // Onceflow's fetch settings (host/src/stream/clients.rs): fuller
        // fetches, up to a tenth of the commit interval later (1-10 ms).
        .set("fetch.min.bytes", "65536")
        .set(
            "fetch.wait.max.ms",
            (args.commit_interval_ms / 10).clamp(1, 10).to_string(),
        )
        .create()
        .context("creating the consumer")?;
    // The same producer settings as Onceflow's (host/src/stream/kafka.rs).
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap_servers)
        .set("transactional.id", format!("{}-0", args.group))
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        // Without these, every new transaction's AddPartitionsToTxn waits
        // 100 ms for the previous one's markers (docs/changelog.md, issue 3).
        .set("retry.backoff.ms", "5")
        .set("retry.backoff.max.ms", "100")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "200000")
        .create()
        .context("creating the producer")?;
    producer
        .init_transactions(TIMEOUT)
        .context("init_transactions")?;
    consumer
        .subscribe(&[&args.input])
        .context("subscribing to the input")?;

    let interval = Duration::from_millis(args.commit_interval_ms);
    let mut next_offsets: HashMap<(String, i32), i64> = HashMap::new();
    let mut in_txn = false;
    let mut txn_started = Instant::now();
    let mut processed: u64 = 0;
    // Commit durations, reported on exit (where a latency goes).
    let (mut commits, mut commit_total, mut commit_max) = (0u64, Duration::ZERO, Duration::ZERO);
    while !stop.load(Ordering::Relaxed) {
        let wait = if in_txn {
            interval.saturating_sub(txn_started.elapsed())
        } else {
            Duration::from_millis(100)
        };
        match consumer.poll(wait) {
            Some(Ok(m)) => {
                if !in_txn {
                    producer.begin_transaction().context("begin_transaction")?;
                    in_txn = true;
                    txn_started = Instant::now();
                }
                let timestamp = m.timestamp().to_millis();
                let result = match &mut stateful {
                    Some((_, balances)) => balances.pay(m.payload(), m.partition()),
                    None => args.transform.apply(m.payload()),
                };
                match result {
                    Ok(emits) => {
                        for e in emits {
                            let mut record = BaseRecord::to(&args.outputs[e.output])
                                .key(&e.key)
                                .payload(&e.value);
                            if let Some(t) = timestamp {
                                record = record.timestamp(t);
                            }
                            send(&producer, record)?;
                        }
                    }
                    Err(message) => {
                        let partition = m.partition().to_string();
                        let offset = m.offset().to_string();
                        let headers = OwnedHeaders::new()
                            .insert(Header {
                                key: dead_letter_headers::ERROR,
                                value: Some(message.as_bytes()),
                            })
                            .insert(Header {
                                key: dead_letter_headers::TOPIC,
                                value: Some(m.topic().as_bytes()),
                            })
                            .insert(Header {
                                key: dead_letter_headers::PARTITION,
                                value: Some(partition.as_bytes()),
                            })
                            .insert(Header {
                                key: dead_letter_headers::OFFSET,
                                value: Some(offset.as_bytes()),
                            })
                            .insert(Header {
                                key: dead_letter_headers::PROCESSOR,
                                value: Some(args.group.as_bytes()),
                            });
                        let mut record =
                            BaseRecord::<[u8], [u8]>::to(&args.dead_letter).headers(headers);
                        if let Some(k) = m.key() {
                            record = record.key(k);
                        }
                        if let Some(v) = m.payload() {
                            record = record.payload(v);
                        }
                        send(&producer, record)?;
                    }
                }
                next_offsets.insert((m.topic().to_owned(), m.partition()), m.offset() + 1);
                processed += 1;
                if processed.is_multiple_of(1024) {
                    producer.poll(Duration::ZERO);
                }
            }
            Some(Err(e)) => eprintln!("raw-pipe: consumer error: {e}"),
            None => {}
        }
        if in_txn && txn_started.elapsed() >= interval {
            let started = Instant::now();
            commit(&consumer, &producer, &mut next_offsets, stateful.as_mut())?;
            let took = started.elapsed();
            commits += 1;
            commit_total += took;
            commit_max = commit_max.max(took);
            in_txn = false;
        }
    }
    if in_txn {
        commit(&consumer, &producer, &mut next_offsets, stateful.as_mut())?;
    }
    eprintln!(
        "raw-pipe: stopped after {processed} records, {commits} transactions, commit mean {:?} max {:?}",
        commit_total / (commits.max(1) as u32),
        commit_max
    );
    Ok(())
}

fn commit(
    consumer: &BaseConsumer,
    producer: &BaseProducer,
    next_offsets: &mut HashMap<(String, i32), i64>,
    stateful: Option<&mut (String, Balances)>,
) -> anyhow::Result<()> {
    // The changed balances' changelog records first, in this transaction.
    if let Some((topic, balances)) = stateful {
        for (partition, key, value) in &balances.changelog() {
            send(
                producer,
                BaseRecord::to(topic)
                    .partition(*partition)
                    .key(key)
                    .payload(value),
            )?;
        }
    }
    let mut offsets = TopicPartitionList::new();
    for ((topic, partition), offset) in next_offsets.drain() {
        offsets.add_partition_offset(&topic, partition, Offset::Offset(offset))?;
    }
    // rust-rdkafka's flush (inside commit_transaction) sleeps in 100 ms
    // polls; wait for the acknowledgements in 1 ms steps first, as Onceflow
    // does (host/src/stream/kafka.rs, `drain`).
    let deadline = Instant::now() + TIMEOUT;
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            bail!("records not acknowledged within {TIMEOUT:?}");
        }
        producer.poll(Duration::from_millis(1));
    }
    let Some(group) = consumer.group_metadata() else {
        bail!("the consumer has no group metadata");
    };
    producer
        .send_offsets_to_transaction(&offsets, &group, TIMEOUT)
        .context("send_offsets_to_transaction")?;
    producer
        .commit_transaction(TIMEOUT)
        .context("commit_transaction (the loop does not retry: rerun the benchmark)")?;
    Ok(())
}

fn send<K, P>(producer: &BaseProducer, mut record: BaseRecord<'_, K, P>) -> anyhow::Result<()>
where
    K: rdkafka::message::ToBytes + ?Sized,
    P: rdkafka::message::ToBytes + ?Sized,
{
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(e).context("producing"),
        }
    }
}
