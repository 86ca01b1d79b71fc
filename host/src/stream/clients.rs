//! The EOS loop's clients: the consumer and the transactional producer
//! settings of a worker, and the topic checks before a deployment starts.

use rdkafka::ClientConfig;

use super::{GroupProtocol, RunOptions, changelog_topic, replay::replay_topic};
use crate::kafka::{self, Connection, KafkaError, TopicSpec};
use crate::manifest::Manifest;

/// A consumer that reads only committed data and commits nothing by itself.
///
/// Under the classic group protocol (the default), with `co_partitioned`
/// (several topics per task: inputs and tables) the range assignor, which gives partition p of every topic (all have the
/// same partition count) to one member, through every rebalance: a task
/// never has its topics split between two workers. Otherwise
/// cooperative-sticky, whose rebalances move only the partitions that move.
///
/// Fetches wait for [`FETCH_MIN_BYTES`], up to a tenth of the commit
/// interval (at most 10 ms; see [`fetch_wait_ms`]), unless `-X` sets them.
pub(crate) fn consumer_config(
    options: &RunOptions,
    group: &str,
    client_id: &str,
    co_partitioned: bool,
    commit_interval_ms: u64,
) -> ClientConfig {
    // librdkafka's defaults (1 byte, up to 500 ms) answer a fetch as soon as
    // one record is there: under a steady load of tens of thousands of
    // records a second the consumer then fetches hundreds of times a second,
    // a few records at a time, and the broker and this host spend their CPU
    // on requests (bench/results/2026-12-04-fetch.md). Under
    // exactly_once_v2 outputs are visible only at the next commit anyway,
    // so waiting a tenth of its interval for a fuller fetch costs a reader
    // no latency; under at_least_once up to that long.
    let min_bytes = FETCH_MIN_BYTES.to_string();
    let fetch_wait = fetch_wait_ms(commit_interval_ms).to_string();
    // (An operator's -X max.poll.interval.ms wins over the 5 minutes here.)
    let mut c = options.kafka.config_with(&[
        ("fetch.min.bytes", &min_bytes),
        ("fetch.wait.max.ms", &fetch_wait),
        ("max.poll.interval.ms", "300000"),
    ]);
    c.set("group.id", group)
        .set("client.id", client_id)
        // Static membership (KIP-345): a restarted instance takes its
        // partitions back at once instead of waiting for its previous
        // incarnation's session to expire. The id is the instance's, so a
        // paused zombie is still fenced when its session expires.
        .set("group.instance.id", client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        // After a restart or a rebalance the committed offsets are unstable
        // (KIP-447) until the previous owner's transaction is resolved, and
        // librdkafka retries the OffsetFetch with an exponential backoff,
        // 100 ms doubling to 1 s by default: a task waited up to a second
        // longer than the transaction took to resolve (the recovery
        // benchmark, bench/README.md). Retries of at most 100 ms apart.
        .set("retry.backoff.ms", "10")
        .set("retry.backoff.max.ms", "100");
    match options.group_protocol {
        GroupProtocol::Classic => {
            c.set(
                "partition.assignment.strategy",
                if co_partitioned {
                    "range"
                } else {
                    "cooperative-sticky"
                },
            );
            // A member learns of a rebalance at its next heartbeat: at a
            // tenth of the session (a quarter before), the survivors of a
            // dead host rejoin up to 1 s after its session expired, not
            // 2.5 s (10 s sessions).
            kafka::set_session(&mut c, options.session_timeout);
        }
        GroupProtocol::Consumer => {
            // The brokers' range assignor co-partitions as the classic one
            // does (i_copartition::two_inputs_under_kip_848_never_give_a_
            // task_two_owners: no assignment splits a task's topics, and no
            // changelog partition has two owners' commits interleaved).
            c.set("group.protocol", "consumer").set(
                "group.remote.assignor",
                if co_partitioned { "range" } else { "uniform" },
            );
        }
    }
    c
}

/// The bytes a worker's fetch waits for (unless [`fetch_wait_ms`] passes
/// first): about 400 records of the benchmark's payments.
const FETCH_MIN_BYTES: u32 = 64 << 10;

/// How long a worker's fetch may wait for [`FETCH_MIN_BYTES`]: a tenth of
/// the commit interval, between 1 and 10 ms.
fn fetch_wait_ms(commit_interval_ms: u64) -> u64 {
    (commit_interval_ms / 10).clamp(1, 10)
}

/// An idempotent producer; transactional when `transactional_id` is given.
pub(crate) fn producer_config(
    options: &RunOptions,
    transactional_id: Option<&str>,
    client_id: &str,
) -> ClientConfig {
    let mut c = options.kafka.config();
    c.set("client.id", client_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        // Java's partitioner, so keys land where Kafka Streams and Java
        // producers put them.
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        // After a commit the coordinator is still writing markers; the next
        // transaction's AddPartitionsToTxn gets CONCURRENT_TRANSACTIONS and
        // is retried. librdkafka's default 100 ms backoff would hold every
        // new transaction's records back by 100 ms.
        .set("retry.backoff.ms", "5")
        .set("retry.backoff.max.ms", "100")
        .set("batch.num.messages", "10000")
        // The host caps every record at types::MAX_RECORD_BYTES, under this.
        .set("message.max.bytes", "1048576")
        .set("queue.buffering.max.messages", "200000");
    if let Some(id) = transactional_id {
        let txn_ms = options.transaction_timeout.as_millis();
        c.set("transactional.id", id)
            .set("transaction.timeout.ms", txn_ms.to_string())
            // librdkafka requires message.timeout.ms <= transaction.timeout.ms.
            .set(
                "message.timeout.ms",
                (txn_ms.saturating_sub(1000)).max(1000).to_string(),
            );
    }
    c
}

/// Checks the configuration of the deployment's changelog topics (they
/// exist: [`prepare_topics`] ran) and returns each local store's trust
/// horizon: its log's `delete.retention.ms` (a changelog's, or a table's
/// topic's). A store last in sync longer ago than that may have missed a
/// tombstone that compaction removed since. A topic whose value cannot be
/// read gets `default`.
pub(crate) fn check_changelogs(
    manifest: &Manifest,
    conn: &Connection,
    default: std::time::Duration,
) -> Result<std::collections::BTreeMap<String, std::time::Duration>, KafkaError> {
    let retention = |config: &std::collections::BTreeMap<String, String>| {
        config
            .get("delete.retention.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(default, std::time::Duration::from_millis)
    };
    let mut horizons = std::collections::BTreeMap::new();
    for (store, topic) in &manifest.tables {
        let (config, _, _) = kafka::topic_config(conn, topic)?;
        horizons.insert(store.clone(), retention(&config));
    }
    for store in &manifest.stores {
        let topic = changelog_topic(manifest, store);
        let compacted = |config: &std::collections::BTreeMap<String, String>| {
            let policy = config
                .get("cleanup.policy")
                .map_or("delete", String::as_str);
            policy.split(',').any(|p| p.trim() == "compact")
        };
        // A topic created a moment ago (by prepare_topics) may still be
        // described with the broker's defaults: look again for a while
        // before calling it wrong.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let (config, replicas, brokers) = loop {
            let (config, replicas, brokers) = kafka::topic_config(conn, &topic)?;
            if compacted(&config) || std::time::Instant::now() >= deadline {
                break (config, replicas, brokers);
            }
            std::thread::sleep(std::time::Duration::from_millis(250));
        };
        let policy = config
            .get("cleanup.policy")
            .map_or("delete", String::as_str);
        if !compacted(&config) {
            return Err(KafkaError::topic(
                topic,
                format!(
                    "changelog has cleanup.policy={policy}: retention would delete state that \
                     is still current, and the store could not be restored. Set it to compact \
                     (kafka-configs.sh --alter --add-config cleanup.policy=compact)"
                ),
            ));
        }
        if replicas < brokers.min(3) {
            tracing::warn!(
                %topic,
                replicas,
                brokers,
                "changelog has fewer replicas than the cluster allows (up to 3): losing a \
                 broker can lose the store's state; reassign it to more replicas"
            );
        }
        horizons.insert(store.clone(), retention(&config));
    }
    Ok(horizons)
}

/// How long a topic that is not in the metadata is looked for again: a
/// topic created a moment ago may not have reached the broker that answers
/// yet (seen: a deploy right after creating its topics was refused with
/// "input topic does not exist").
const TOPIC_APPEAR_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// A topic's partition count, `None` if it still does not exist after
/// [`TOPIC_APPEAR_WAIT`].
fn partition_count(
    probe: &rdkafka::consumer::BaseConsumer<kafka::QuietContext>,
    topic: &str,
) -> Result<Option<i32>, KafkaError> {
    let started = std::time::Instant::now();
    loop {
        if let Some(p) = kafka::partitions(probe, topic)? {
            return Ok(Some(p.len() as i32));
        }
        if started.elapsed() >= TOPIC_APPEAR_WAIT {
            return Ok(None);
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// The partition count of a manifest's (first) input topic, `None` if it
/// does not exist: the number of instances the deployment runs.
pub fn input_partitions(manifest: &Manifest, conn: &Connection) -> Result<Option<i32>, KafkaError> {
    InputPartitions::new(&kafka::metadata_client(conn)?).of(manifest)
}

/// [`input_partitions`] of many manifests through one client, each topic
/// asked once: a deploy counts every deployment of its tenant against the
/// quotas (before, a client and a metadata request per deployment, twice
/// per deploy: `onceflow deploy` took 5.3 s with 100 deployments on the
/// host). A topic that does not exist is not waited for here (only the
/// deployed manifest's is: [`input_partitions`]).
pub struct InputPartitions<'a> {
    probe: &'a kafka::Reader,
    known: std::collections::HashMap<String, Option<i32>>,
}

impl<'a> InputPartitions<'a> {
    /// Counts through `probe` (a client for metadata calls, such as the
    /// control plane's).
    pub(crate) fn new(probe: &'a kafka::Reader) -> InputPartitions<'a> {
        InputPartitions {
            probe,
            known: Default::default(),
        }
    }

    /// The partition count of `manifest`'s first input, waiting up to
    /// [`TOPIC_APPEAR_WAIT`] for it to appear.
    pub fn of(&mut self, manifest: &Manifest) -> Result<Option<i32>, KafkaError> {
        self.count(manifest, true)
    }

    /// [`InputPartitions::of`] of a deployment already running: a topic
    /// that is not there is not waited for.
    pub fn of_existing(&mut self, manifest: &Manifest) -> Result<Option<i32>, KafkaError> {
        self.count(manifest, false)
    }

    fn count(&mut self, manifest: &Manifest, wait: bool) -> Result<Option<i32>, KafkaError> {
        let Some(topic) = manifest.inputs.first() else {
            return Ok(None);
        };
        if let Some(n) = self.known.get(topic) {
            return Ok(*n);
        }
        let probe = self.probe;
        let n = if wait {
            partition_count(probe, topic)?
        } else {
            kafka::partitions(probe, topic)?.map(|p| p.len() as i32)
        };
        self.known.insert(topic.clone(), n);
        Ok(n)
    }
}

/// Checks the manifest's topics and creates missing changelog topics.
/// Returns the input partition count.
pub fn prepare_topics(manifest: &Manifest, conn: &Connection) -> Result<i32, KafkaError> {
    prepare_topics_with(manifest, conn, &kafka::metadata_client(conn)?)
}

/// [`prepare_topics`] with the metadata client `probe` (a host's deploys
/// share the control plane's).
pub(crate) fn prepare_topics_with(
    manifest: &Manifest,
    conn: &Connection,
    probe: &kafka::Reader,
) -> Result<i32, KafkaError> {
    let partitions_of = |topic: &str| -> Result<Option<i32>, KafkaError> {
        Ok(kafka::partitions(probe, topic)?.map(|p| p.len() as i32))
    };

    let mut input_partitions = None;
    let sources = manifest.sources();
    for topic in &sources {
        let what = if manifest.table_of(topic).is_some() {
            "table"
        } else {
            "input"
        };
        let n = partition_count(probe, topic)?.ok_or_else(|| {
            KafkaError::topic(
                topic.to_string(),
                format!("{what} topic does not exist: create it first"),
            )
        })?;
        match input_partitions {
            None => input_partitions = Some(n),
            Some(m) if m != n => {
                return Err(KafkaError::topic(
                    topic.to_string(),
                    format!(
                        "has {n} partitions but {} has {m}: a task reads the same partition of \
                         every input and table, so they must be co-partitioned (repartition \
                         one into a topic with {m} partitions)",
                        sources[0]
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    let input_partitions = input_partitions.unwrap_or(1);

    let outputs = manifest
        .outputs
        .values()
        .map(String::as_str)
        .chain(manifest.errors.dead_letter_topic());
    for topic in outputs {
        if partition_count(probe, topic)?.is_none() {
            return Err(KafkaError::topic(
                topic,
                "output topic does not exist: create it first",
            ));
        }
    }

    let mut missing = Vec::new();
    let replay = replay_topic(manifest);
    let logs = manifest
        .stores
        .iter()
        .map(|store| (changelog_topic(manifest, store), format!("store {store}")))
        .chain(
            replay
                .iter()
                .map(|t| (t.clone(), "replay records".to_owned())),
        );
    for (topic, of) in logs {
        match partitions_of(&topic)? {
            Some(n) if n == input_partitions => {}
            Some(n) => {
                return Err(KafkaError::topic(
                    topic,
                    format!(
                        "changelog of {of} has {n} partitions, the inputs {input_partitions}: \
                         it cannot be read partition by partition (delete it, or give it \
                         {input_partitions} partitions)"
                    ),
                ));
            }
            None => missing.push(topic),
        }
    }
    if !missing.is_empty() {
        // A transaction stays replayable while the changelog records after
        // it are not compacted: Kafka's cleaner then keeps every record
        // before it too (it drops a record only for a later one of its key
        // in the part it cleans). The replay topic keeps its records as
        // long (docs/replay.md).
        let window = (u64::from(manifest.processing.replay_window_hours) * 3_600_000).to_string();
        let changelog: &[(&str, &str)] = if replay.is_some() {
            &[
                ("cleanup.policy", "compact"),
                ("min.compaction.lag.ms", &window),
            ]
        } else {
            &[("cleanup.policy", "compact")]
        };
        let records: &[(&str, &str)] = &[("cleanup.policy", "delete"), ("retention.ms", &window)];
        let specs: Vec<TopicSpec<'_>> = missing
            .iter()
            .map(|t| TopicSpec {
                name: t,
                partitions: input_partitions,
                config: if Some(t) == replay.as_ref() {
                    records
                } else {
                    changelog
                },
            })
            .collect();
        kafka::create_topics(conn, &specs)?;
    }
    Ok(input_partitions)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn options(extra: &[(&str, &str)]) -> RunOptions {
        RunOptions {
            codecs: None,
            schema_registry: None,
            kafka: Connection {
                bootstrap_servers: "127.0.0.1:9092".to_owned(),
                extra_config: extra
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
            state_dir: PathBuf::from("state"),
            instance_id: "i0".to_owned(),
            session_timeout: Duration::from_secs(10),
            transaction_timeout: Duration::from_secs(60),
            group_protocol: GroupProtocol::Classic,
            report_interval: Duration::from_secs(10),
            state_cleanup_delay: Duration::from_secs(600),
            usage_topic: None,
            cpu_budget: None,
            held_mb: crate::memory::DEFAULT_HELD_MB,
            tenant_memory: None,
            lose_commit_answers: None,
            hibernation: None,
            groups: None,
            queries: None,
            hand_over: None,
            draining: None,
        }
    }

    #[test]
    fn fetches_wait_a_tenth_of_the_commit_interval_for_fuller_batches() {
        let c = consumer_config(&options(&[]), "g", "c", false, 100);
        assert_eq!(c.get("fetch.min.bytes"), Some("65536"));
        assert_eq!(c.get("fetch.wait.max.ms"), Some("10"));
        let c = consumer_config(&options(&[]), "g", "c", false, 30);
        assert_eq!(c.get("fetch.wait.max.ms"), Some("3"));
        assert_eq!(fetch_wait_ms(5), 1);
        assert_eq!(fetch_wait_ms(60_000), 10);
    }

    #[test]
    fn dash_x_fetch_settings_win() {
        let extra = [("fetch.min.bytes", "1"), ("fetch.wait.max.ms", "500")];
        let c = consumer_config(&options(&extra), "g", "c", false, 100);
        assert_eq!(c.get("fetch.min.bytes"), Some("1"));
        assert_eq!(c.get("fetch.wait.max.ms"), Some("500"));
    }
}
