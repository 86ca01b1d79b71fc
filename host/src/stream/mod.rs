//! The exactly-once runtime on Kafka: `onceflow run`.
//!
//! A deployment runs `worker-threads` workers. Each worker is one
//! read_committed consumer in the deployment's group and one transactional
//! producer (EOS v2: per thread, not per task), driving the tasks of the
//! partitions assigned to it. The commit protocol is in [`worker`], top to
//! bottom; restoring stores from their changelogs is in [`changelog`]; the
//! Kafka names a deployment derives, and their collisions, in [`names`].
//!
//! This module drives Kafka (with the shared plumbing in [`crate::kafka`]);
//! `sandbox` and `state` know nothing of Kafka.

pub mod changelog;
mod clients;
pub mod cpu;
mod hibernate;
pub mod names;
pub mod protocol;
pub mod queries;
pub mod replay;
mod standby;
pub mod verify;
mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use changelog::{changelog_topic, changelog_topics};
pub(crate) use clients::prepare_topics_with;
pub use clients::{InputPartitions, input_partitions, prepare_topics};
pub use hibernate::Hibernation;

use crate::kafka::{Connection, KafkaError};
use crate::manifest::{Guarantee, Manifest};
use crate::metrics::Metrics;
use crate::sandbox::Processor;
use crate::schema::registry::RegistrySource;
use crate::schema::{Codecs, Registry, SchemaFiles};
use crate::task::TaskConfig;

/// Why a deployment stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A Kafka operation failed (a missing or unusable topic is
    /// [`KafkaError::Topic`], a missing ACL [`KafkaError::NotAuthorized`]).
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A record failed under the `fail` policy: the deployment stops.
    #[error("processing stopped")]
    ProcessorFailed(#[source] crate::task::TaskError),
    /// A task's state store could not be opened.
    #[error("state store")]
    State(#[source] crate::state::StateError),
    /// A task failed outside a record's processing (its state, its guest).
    #[error("task")]
    Task(#[source] crate::task::TaskError),
    /// A record that Kafka refuses whatever is tried (larger than the
    /// topic's `max.message.bytes`): retrying would loop on it forever.
    #[error(
        "a record cannot be written: {message}; raise the topic's max.message.bytes or make \
         the processor's outputs and state values smaller"
    )]
    Unsendable {
        /// The record's topic and Kafka's answer.
        message: String,
    },
    /// The deployment's settings cannot work together.
    #[error("{0}")]
    Settings(String),
    /// A partition's stores hold committed state, but its group has no
    /// committed offsets for it: reading its input from the earliest
    /// offset would apply every retained record to that state again.
    #[error(
        "group {group} has no committed offset for partition {partition} of {topics}, but the \
         changelogs of its stores hold committed state ({stores}): processing from the earliest \
         offset would apply every retained record again (duplicate outputs, state counted \
         twice). Kafka deletes a group's offsets offsets.retention.minutes (7 days by default) \
         after its last member left: was the deployment stopped or paused that long? To go on \
         from where the input is now, set the group's offsets (kafka-consumer-groups.sh \
         --bootstrap-server <brokers> --group {group} --topic <topic> --reset-offsets \
         --to-latest (or --to-datetime <when it stopped>) --execute) and start it again; to \
         process everything again from scratch, delete the changelog topics and the state \
         directory first. Raise the brokers' offsets.retention.minutes above the longest pause."
    )]
    OffsetsLost {
        /// The deployment's group.
        group: String,
        /// The input partition.
        partition: i32,
        /// Its source topics.
        topics: String,
        /// Its stores with state, and their changelog positions.
        stores: String,
    },
    /// The deployment's formats cannot be set up (a schema file, the
    /// registry's refusal of an output schema).
    #[error("formats")]
    Formats(#[source] crate::schema::SetupError),
    /// The schema registry could not be asked for an input's schema: the
    /// batch was aborted; the worker starts its session again and asks
    /// again.
    #[error("{0}")]
    SchemaRegistry(String),
    /// A worker must restart its session (producer, consumer, tasks):
    /// fencing, a fatal producer error, a timeout.
    #[error("worker session must restart")]
    Restart(#[from] Restart),
}

/// Why a worker's session restarts: its producer, consumer and tasks are
/// dropped and it rejoins with new ones; the deployment goes on.
#[derive(Debug, thiserror::Error)]
pub enum Restart {
    /// A Kafka call failed in a way only new clients cure (a fatal or
    /// unknown producer state, a stale consumer).
    #[error(transparent)]
    Kafka(KafkaError),
    /// Another member joined with this worker's static id, or its
    /// producer was fenced while the consumer was too: another instance
    /// runs with this `--instance-id`, or this one is a zombie. (A fenced
    /// producer alone is replaced within the session.)
    #[error("fenced by a newer instance with this worker's id")]
    Fenced(#[source] KafkaError),
    /// A transactional call did not return in time: librdkafka waits for
    /// the transaction coordinator without a bound.
    #[error(
        "{operation} did not return within {} s (librdkafka waits for the transaction \
         coordinator without a bound): giving the producer up; a new one fences it",
        .limit.as_secs()
    )]
    Overrun {
        /// The call.
        operation: String,
        /// How long it was given.
        limit: Duration,
    },
    /// A thread of the worker could not be started.
    #[error("cannot start {what}")]
    Spawn {
        /// Which thread.
        what: String,
        /// Why the system refused it.
        #[source]
        source: std::io::Error,
    },
    /// A thread of the worker ended without an answer (it panicked).
    #[error("{what} ended without an outcome")]
    Lost {
        /// Which thread.
        what: String,
    },
    /// The protocol ended the session on a failure its rules abort (a
    /// failed delivery other than a refusal): a bug in the worker.
    #[error(
        "the protocol ended the session on \"{cause}\" ({failure}), a failure its rules abort: \
         a bug in onceflow; the worker rejoins"
    )]
    Undecided {
        /// The failure as the protocol told it apart.
        failure: String,
        /// What librdkafka said.
        cause: String,
    },
    /// The transaction about to commit has no group metadata (taken when it
    /// begins): a bug.
    #[error("the transaction has no consumer group metadata")]
    NoGroupMetadata,
    /// The consumer had no group coordinator for longer than its limit.
    #[error(
        "the consumer has had no group coordinator for group {group} for {} s (librdkafka group \
         state {state}); re-creating it so it looks the coordinator up afresh",
        .lost.as_secs()
    )]
    CoordinatorLost {
        /// The consumer group.
        group: String,
        /// How long it has been without one.
        lost: Duration,
        /// librdkafka's group state.
        state: String,
    },
    /// A partition was assigned again without a revoke in between: the open
    /// transaction may hold its records while the consumer reads them again.
    #[error("partition {0} assigned twice without a revoke; rejoining cleanly")]
    AssignedTwice(i32),
    /// A changelog partition stayed unstable longer than a transaction may
    /// stay open: the transaction at its last stable offset is hanging
    /// (its producer is gone, and the brokers will not end it).
    #[error(
        "changelog {topic}/{partition} has not been stable for {} s (last stable offset \
         {start}, high watermark {high}), longer than a transaction may stay open: the \
         transaction that starts at offset {start} is probably hanging (the brokers lost its \
         end; `kafka-transactions.sh --bootstrap-server <brokers> find-hanging --broker-id <id>` \
         lists it and its other partitions if so), and this partition's state cannot be \
         restored past it. Abort it with `kafka-transactions.sh --bootstrap-server <brokers> \
         abort --topic {topic} --partition {partition} --start-offset {start}`, and the same \
         for each other partition listed; nothing committed is lost (docs/operations.md, \
         \"A hanging transaction\")",
        .waited.as_secs()
    )]
    Hanging {
        /// The changelog topic.
        topic: String,
        /// Its partition.
        partition: i32,
        /// The last stable offset: where the hanging transaction starts.
        start: i64,
        /// The high watermark.
        high: i64,
        /// How long the worker waited.
        waited: Duration,
    },
    /// Something stayed unstable: a transaction holding it is still open.
    #[error(
        "{what} did not become stable within {} s: a transaction holding it is still open, or \
         the broker did not answer (a busy broker; the cause says which it reported last); if \
         this repeats for longer than the transaction timeout, look for a hanging transaction \
         with `kafka-transactions.sh find-hanging`",
        .waited.as_secs()
    )]
    Unstable {
        /// What: the committed offsets of a group, a changelog partition.
        what: String,
        /// How long the worker waited.
        waited: Duration,
        /// The client's last answer, if it gave one.
        #[source]
        source: Option<KafkaError>,
    },
}

impl Restart {
    /// A failed Kafka call while doing `operation`.
    pub(crate) fn kafka(
        operation: impl Into<String>,
        e: rdkafka::error::KafkaError,
    ) -> StreamError {
        Restart::Kafka(KafkaError::client(operation, e)).into()
    }

    /// Fenced while doing `operation`.
    pub(crate) fn fenced(
        operation: impl Into<String>,
        e: rdkafka::error::KafkaError,
    ) -> StreamError {
        Restart::Fenced(KafkaError::client(operation, e)).into()
    }

    /// Thread `what` could not be started.
    pub(crate) fn spawn(what: impl Into<String>, source: std::io::Error) -> StreamError {
        Restart::Spawn {
            what: what.into(),
            source,
        }
        .into()
    }

    /// Thread `what` ended without an answer.
    pub(crate) fn lost(what: impl Into<String>) -> StreamError {
        Restart::Lost { what: what.into() }.into()
    }
}

impl StreamError {
    pub(crate) fn kafka(operation: impl Into<String>, e: rdkafka::error::KafkaError) -> Self {
        Self::Kafka(KafkaError::client(operation, e))
    }

    /// Whether the error ends the deployment (as opposed to a worker
    /// rejoining and carrying on).
    pub fn stops_deployment(&self) -> bool {
        matches!(
            self,
            Self::ProcessorFailed(_)
                | Self::Kafka(KafkaError::Topic { .. } | KafkaError::NotAuthorized { .. })
                | Self::Unsendable { .. }
                | Self::Settings(_)
                | Self::OffsetsLost { .. }
        )
    }
}

/// How `onceflow run` connects and where it keeps state.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The cluster, and `-X` properties for every client.
    pub kafka: Connection,
    /// Local state directory (RocksDB per task).
    pub state_dir: PathBuf,
    /// This instance's id: part of its transactional ids. Stable across
    /// restarts of the same instance, so a restarted instance fences its
    /// previous incarnation at once.
    pub instance_id: String,
    /// Consumer session timeout.
    pub session_timeout: Duration,
    /// Transaction timeout (also bounds how long a crashed instance's open
    /// transaction blocks readers).
    pub transaction_timeout: Duration,
    /// The consumer group protocol the workers use.
    pub group_protocol: GroupProtocol,
    /// How often to log the figures.
    pub report_interval: Duration,
    /// The deployment's formats, made by the caller (a fleet host, from
    /// the schema files sent with the deploy); `None`: made here from the
    /// files beside the manifest, with `schema_registry`.
    pub codecs: Option<Arc<Codecs>>,
    /// The schema registry, for manifests with registry formats.
    pub schema_registry: Option<Arc<Registry>>,
    /// How long the local stores of a partition this instance no longer
    /// owns are kept (Kafka Streams' `state.cleanup.delay.ms`): long enough
    /// for a rebalance to give the partition back without a full restore.
    pub state_cleanup_delay: Duration,
    /// Where each committed transaction writes what its work used (a fleet
    /// host's `_onceflow.usage`), inside the transaction; `None`: nowhere.
    pub usage_topic: Option<String>,
    /// The tenant's share of this host's CPU, charged by every guest call
    /// (`None`: no limit; a fleet host gives every tenant one, unlimited at
    /// cpu-share 100, so that a share lowered later applies).
    pub cpu_budget: Option<std::sync::Arc<cpu::CpuBudget>>,
    /// Most bytes the host holds for this deployment at once (outputs and
    /// state changes not yet committed), and for its tenant on this host
    /// (`memory.rs`).
    pub held_mb: u64,
    /// The tenant's budget on this host, shared by its deployments and
    /// sinks (`None` outside a fleet).
    pub tenant_memory: Option<std::sync::Arc<crate::memory::MemoryBudget>>,
    /// Tests only (`--fault-lose-commit-answers`): this many successful
    /// commits, of any deployment and worker of the process, answer as if
    /// timed out (the outcome unknown, as after a lost EndTxn response).
    pub lose_commit_answers: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
    /// When an idle deployment gives back its clients and threads until
    /// input arrives (`hibernate.rs`); `None`: never.
    pub hibernation: Option<Hibernation>,
    /// The process's watch over its deployments' consumer groups (shared:
    /// one client for all); `None`: each deployment describes its own group
    /// from its standby thread.
    pub groups: Option<Arc<crate::kafka::GroupWatch>>,
    /// The process's registry of tasks that answer interactive queries
    /// from their local stores (`queries.rs`); `None`: no queries.
    pub queries: Option<Arc<queries::LocalStores>>,
    /// When this flag is set (a host draining: `onceflow host` on
    /// SIGTERM), a worker that stops hands its partitions over: it leaves
    /// the group, so that the other instances take them at once. Unset, or
    /// `None`, a stopping worker keeps its static membership (KIP-345) and
    /// its partitions wait one session for it: what a restart, an upgrade
    /// of the deployment or hibernation want.
    pub hand_over: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// Which instances (host ids) are draining: their workers commit before
    /// they leave, so a partition's next owner does not fence them
    /// (`worker::producer`, `Core::start_fencing`). Such a fence lands
    /// seconds later, when the drained host may be back under the same id:
    /// it fenced the new workers instead. `None`: every departed instance
    /// is fenced.
    pub draining: Option<Draining>,
}

/// Answers whether an instance (a host id) is draining ([`RunOptions::draining`]).
#[derive(Clone)]
pub struct Draining(pub Arc<dyn Fn(&str) -> bool + Send + Sync>);

impl std::fmt::Debug for Draining {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Draining(..)")
    }
}

/// The consumer group protocol of a deployment's workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    /// The classic protocol: static membership (`group.instance.id`), the
    /// members' own cooperative-sticky or range assignment, the client's
    /// session timeout.
    #[default]
    Classic,
    /// KIP-848's consumer protocol: the brokers assign (range when a task
    /// reads several topics, else uniform) and set the session and
    /// heartbeat times.
    Consumer,
}

/// Kafka's default `delete.retention.ms` (one day), when a topic's cannot
/// be read.
const DEFAULT_DELETE_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Everything the workers of one deployment share.
pub(crate) struct Deployment {
    pub manifest: Manifest,
    pub processor: Processor,
    pub task_config: TaskConfig,
    pub options: RunOptions,
    pub changelogs: Vec<(String, String)>,
    /// Where each transaction's replay records go (`replay.rs`); `None`:
    /// none are kept.
    pub replay_topic: Option<String>,
    pub metrics: Arc<Metrics>,
    /// Set by the caller: stop for good.
    pub shutdown: Arc<AtomicBool>,
    /// Set to hibernate: the workers stop as at a shutdown, and start again
    /// when input arrives (`hibernate.rs`). Workers and the standby thread
    /// look at both through [`Deployment::stopping`].
    pub hibernate: AtomicBool,
    /// Partitions whose task is open on this instance: their local stores
    /// are in use. Held while a task's store is opened or a store removed.
    pub open_tasks: std::sync::Mutex<std::collections::BTreeSet<i32>>,
    /// Per local store, its log's `delete.retention.ms`: a store last in
    /// sync with its log longer ago than this is not trusted (a tombstone
    /// may have been compacted away meanwhile); it is wiped and restored
    /// in full (`changelog::restore`).
    pub trust_horizons: std::collections::BTreeMap<String, Duration>,
    /// The warm copies of other instances' tasks kept here
    /// (`processing.standby-replicas`).
    pub standbys: standby::Standbys,
    /// What its workers hold in memory, against its budget and its
    /// tenant's (`memory.rs`).
    pub memory: crate::memory::MemoryLimits,
}

impl Deployment {
    /// How long after its last sync `store`'s local copy is trusted.
    pub(crate) fn trust_horizon(&self, store: &str) -> Duration {
        self.trust_horizons
            .get(store)
            .copied()
            .unwrap_or(DEFAULT_DELETE_RETENTION)
    }

    /// The process's query registry, if it has one.
    pub(crate) fn queries(&self) -> Option<&queries::LocalStores> {
        self.options.queries.as_deref()
    }

    /// Where the stores of `partition` live.
    pub(crate) fn store_dir(&self, partition: i32) -> PathBuf {
        self.options
            .state_dir
            .join(self.manifest.application_id())
            .join(partition.to_string())
    }
}

impl Deployment {
    pub(crate) fn exactly_once(&self) -> bool {
        self.manifest.processing.guarantee == Guarantee::ExactlyOnceV2
    }

    /// Whether the workers should stop (commit what they processed and
    /// leave): the deployment stops, or hibernates.
    pub(crate) fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed) || self.hibernate.load(Ordering::Relaxed)
    }

    /// Whether stopping workers leave the group ([`RunOptions::hand_over`]).
    pub(crate) fn handing_over(&self) -> bool {
        self.options
            .hand_over
            .as_ref()
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }
}

/// How a session of the workers ended without an error.
enum SessionEnd {
    /// Asked to stop (or a worker stopped on its own, which stops the rest).
    Stopped,
    /// Stopped to hibernate, waiting for these inputs' ends to move.
    Hibernated(crate::kafka::Ends),
}

/// How often the deployment's thread looks at its workers when none ended:
/// the figures, the unowned stores, whether it may hibernate.
const TICK: Duration = Duration::from_secs(1);

/// The deployment thread's periodic work, kept across hibernations.
struct Watch {
    last_report: Instant,
    last: crate::metrics::Snapshot,
    unowned_since: BTreeMap<i32, Instant>,
    last_cleanup: Instant,
}

/// Tells the deployment's thread that a worker ended (sent when the
/// worker's thread drops it), so the thread sleeps until then or its next
/// tick instead of looking every few milliseconds.
struct Ended(std::sync::mpsc::Sender<()>);

impl Drop for Ended {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Runs a deployment until `shutdown` is set (then finishes or aborts the
/// open transactions, records store positions, and returns) or a worker
/// fails in a way that stops the deployment.
pub fn run(
    manifest: Manifest,
    processor: Processor,
    options: RunOptions,
    shutdown: Arc<AtomicBool>,
) -> Result<Arc<Metrics>, StreamError> {
    run_with_metrics(
        manifest,
        processor,
        options,
        shutdown,
        Arc::new(Metrics::default()),
    )
}

/// [`run`], updating `metrics` as it goes (the host reads them live).
pub fn run_with_metrics(
    manifest: Manifest,
    processor: Processor,
    options: RunOptions,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) -> Result<Arc<Metrics>, StreamError> {
    check_settings(&manifest, &options)?;
    // The tenant's CPU share, charged as each call runs: the call parks at
    // an epoch tick while the share is spent (sandbox/clock.rs).
    let processor = match &options.cpu_budget {
        Some(budget) => processor.with_cpu_meter(budget.clone()),
        None => processor,
    };
    let partitions = prepare_topics(&manifest, &options.kafka)?;
    let trust_horizons =
        clients::check_changelogs(&manifest, &options.kafka, DEFAULT_DELETE_RETENTION)?;
    tracing::info!(
        app = %manifest.application_id(),
        partitions,
        guarantee = ?manifest.processing.guarantee,
        workers = manifest.processing.worker_threads,
        "starting deployment"
    );
    let changelogs = manifest
        .stores
        .iter()
        .map(|s| (s.clone(), changelog_topic(&manifest, s)))
        .collect();
    let codecs = match &options.codecs {
        Some(c) => Some(c.clone()),
        None => deployment_codecs(&manifest, options.schema_registry.as_ref(), None)?,
    };
    let memory = crate::memory::MemoryLimits::new(options.held_mb, options.tenant_memory.clone());
    let replay_topic = replay::replay_topic(&manifest);
    let deployment = Arc::new(Deployment {
        memory,
        task_config: TaskConfig::from_manifest(&manifest).with_codecs(codecs),
        manifest,
        processor,
        options,
        changelogs,
        replay_topic,
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
        hibernate: AtomicBool::new(false),
        open_tasks: Default::default(),
        trust_horizons,
        standbys: Default::default(),
    });

    let app = deployment.manifest.application_id();
    let mut watch = Watch {
        last_report: Instant::now(),
        last: metrics.snapshot(),
        unowned_since: BTreeMap::new(),
        last_cleanup: Instant::now(),
    };
    let result = loop {
        match run_session(&deployment, &mut watch, partitions) {
            Ok(SessionEnd::Hibernated(ends)) => {
                let Some(h) = &deployment.options.hibernation else {
                    break Ok(());
                };
                if !hibernate::hibernate(&deployment, h, ends) {
                    break Ok(());
                }
                // Not watched while asleep: kept another full delay.
                watch.unowned_since.clear();
                deployment.hibernate.store(false, Ordering::Relaxed);
            }
            Ok(SessionEnd::Stopped) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if let Some(q) = deployment.queries() {
        q.stopped(&app);
    }
    report(&app, &metrics, watch.last, watch.last_report.elapsed());
    log_stopped(&metrics);
    result.map(|()| metrics)
}

/// The formats of `manifest` (its schema files read from beside it, or
/// `files`), output schemas registered in `registry` under `namespace`'s
/// subjects (a fleet tenant's topic prefix; `None`: any subject).
pub fn deployment_codecs(
    manifest: &Manifest,
    registry: Option<&Arc<Registry>>,
    files: Option<(&SchemaFiles, Option<String>)>,
) -> Result<Option<Arc<Codecs>>, StreamError> {
    if manifest.input_formats.is_empty() && manifest.output_formats.is_empty() {
        return Ok(None);
    }
    let read;
    let (files, namespace) = match files {
        Some((files, namespace)) => (files, namespace),
        None => {
            read = SchemaFiles::read(manifest).map_err(StreamError::Formats)?;
            (&read, None)
        }
    };
    let source = registry.map(|r| {
        Arc::new(RegistrySource::new(r.clone(), namespace)) as Arc<dyn crate::schema::SchemaSource>
    });
    Codecs::for_manifest(manifest, files, source).map_err(StreamError::Formats)
}

/// Runs the workers (and the standby thread) until they all stopped:
/// asked to, after one failed, or to hibernate.
fn run_session(
    deployment: &Arc<Deployment>,
    watch: &mut Watch,
    partitions: i32,
) -> Result<SessionEnd, StreamError> {
    let d = deployment;
    let (ended, ends) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for n in 0..d.manifest.processing.worker_threads {
        let (d, ended) = (d.clone(), Ended(ended.clone()));
        let span = tracing::Span::current();
        let handle = std::thread::Builder::new()
            .name(format!("onceflow-worker-{n}"))
            .spawn(move || {
                let _span = span.enter();
                let _ended = ended;
                worker::run_worker(&d, n)
            })
            .map_err(|e| Restart::spawn("a worker thread", e))?;
        handles.push(handle);
    }
    drop(ended);
    let app = d.manifest.application_id();
    // Who owns which partition: for standbys, and under exactly-once to
    // fence a dead host's transactions. Without standbys the deployment
    // thread reads it from the process's watch, and no thread of its own
    // runs.
    let replicas = d.manifest.processing.standby_replicas;
    let owners = match &d.options.groups {
        Some(groups) if replicas > 0 || d.exactly_once() => {
            groups.register(&app, standby::watch_interval(d))
        }
        _ => None,
    };
    let (standby, owners) = match owners {
        Some(owners) if replicas == 0 => (None, Some(owners)),
        owners => (start_standby(d, owners), None),
    };
    let mut seen = 0;

    let tick = TICK.min(d.options.report_interval);
    let mut idle = d
        .options
        .hibernation
        .as_ref()
        .map(|h| hibernate::Idle::new(d, h.after, partitions));
    let mut hibernating = None;
    while handles.iter().any(|h| !h.is_finished()) {
        if let Err(std::sync::mpsc::RecvTimeoutError::Disconnected) = ends.recv_timeout(tick) {
            // Every worker dropped its `Ended`; their threads end now.
            std::thread::sleep(Duration::from_millis(10));
        }
        if watch.last_cleanup.elapsed() >= Duration::from_secs(10) {
            watch.last_cleanup = Instant::now();
            remove_unowned_stores(d, &mut watch.unowned_since);
        }
        if handles.iter().any(|h| h.is_finished()) && !d.stopping() {
            // A worker stopped on its own: the deployment failed. Stop the
            // others cleanly.
            d.shutdown.store(true, Ordering::Relaxed);
        }
        if watch.last_report.elapsed() >= d.options.report_interval {
            watch.last = report(&app, &d.metrics, watch.last, watch.last_report.elapsed());
            watch.last_report = Instant::now();
        }
        if let Some(owners) = &owners {
            standby::saw_group(d, owners, &mut seen);
        }
        if hibernating.is_none()
            && !d.stopping()
            && let (Some(idle), Some(h)) = (idle.as_mut(), &d.options.hibernation)
            && let Some(inputs) = idle.check(d, &h.ends)
        {
            d.hibernate.store(true, Ordering::Relaxed);
            hibernating = Some(inputs);
        }
    }
    if let Some(h) = standby {
        if !d.stopping() {
            // The workers stopped on their own (each one failed).
            d.shutdown.store(true, Ordering::Relaxed);
        }
        // The thread ends within a poll.
        if h.join().is_err() {
            tracing::warn!("the standby thread panicked");
        }
    }
    let mut result = Ok(());
    for h in handles {
        let worker = h
            .join()
            .unwrap_or_else(|_| Err(Restart::lost("a worker thread")));
        // The first failure is the one to report.
        if let (Ok(()), Err(e)) = (&result, worker) {
            result = Err(e);
        }
    }
    result?;
    Ok(match hibernating {
        Some(inputs) if !d.shutdown.load(Ordering::Relaxed) => SessionEnd::Hibernated(inputs),
        _ => SessionEnd::Stopped,
    })
}

/// Starts the standby thread (standby replicas, and fencing a dead host's
/// transactions), reading the group from `owners` if given: optional, the
/// workers go on without it.
fn start_standby(
    deployment: &Arc<Deployment>,
    owners: Option<crate::kafka::GroupRegistration>,
) -> Option<std::thread::JoinHandle<()>> {
    if deployment.manifest.processing.standby_replicas == 0 && !deployment.exactly_once() {
        return None;
    }
    let d = deployment.clone();
    let span = tracing::Span::current();
    std::thread::Builder::new()
        .name("onceflow-standby".to_owned())
        .spawn(move || {
            let _span = span.enter();
            standby::run(&d, owners)
        })
        .inspect_err(|e| {
            tracing::warn!(
                "cannot start the standby thread ({e}): no standby replicas, and a dead host's \
                 transactions are not fenced at once"
            );
        })
        .ok()
}

/// The deployment's totals, once it stopped.
fn log_stopped(metrics: &Metrics) {
    let total = metrics.snapshot();
    let latency = metrics.overall_latency();
    tracing::info!(
        commit_p50_ms = latency.p50.as_secs_f64() * 1e3,
        commit_p99_ms = latency.p99.as_secs_f64() * 1e3,
        records = total.records,
        outputs = total.outputs,
        commits = total.commits,
        aborts = total.aborts,
        fenced = total.fenced,
        restarts = total.restarts,
        restored = total.restored,
        standby_records = total.standby_records,
        "deployment stopped"
    );
}

/// Removes the local stores of partitions no task of this instance has had
/// open for [`RunOptions::state_cleanup_delay`] (counted from when this
/// scan first saw them unowned, so a restarted instance keeps its stores
/// that long too). A store kept forever could later be reopened after
/// compaction removed a tombstone it never saw.
fn remove_unowned_stores(d: &Deployment, unowned_since: &mut BTreeMap<i32, Instant>) {
    let root = d.options.state_dir.join(d.manifest.application_id());
    let Ok(entries) = std::fs::read_dir(&root) else {
        return;
    };
    let on_disk: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let open = d.open_tasks.lock().unwrap_or_else(|e| e.into_inner());
    unowned_since.retain(|p, _| on_disk.contains(p) && !open.contains(p));
    for p in on_disk {
        if open.contains(&p) || d.standbys.holds(p) {
            unowned_since.remove(&p);
            continue;
        }
        let since = *unowned_since.entry(p).or_insert_with(Instant::now);
        if since.elapsed() < d.options.state_cleanup_delay {
            continue;
        }
        let dir = d.store_dir(p);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {
                tracing::info!(
                    partition = p,
                    dir = %dir.display(),
                    "removed the local stores of a partition not owned for {} s",
                    d.options.state_cleanup_delay.as_secs()
                );
                unowned_since.remove(&p);
            }
            Err(e) => tracing::warn!(
                partition = p,
                dir = %dir.display(),
                "cannot remove the local stores of a partition no longer owned: {e}"
            ),
        }
    }
}

/// Refuses settings that cannot work together: under exactly-once, a
/// transaction must commit well within the transaction timeout, or the
/// broker aborts it and nothing ever commits.
fn check_settings(manifest: &Manifest, options: &RunOptions) -> Result<(), StreamError> {
    if manifest.processing.guarantee != Guarantee::ExactlyOnceV2 {
        return Ok(());
    }
    let txn_ms = options.transaction_timeout.as_millis() as u64;
    let commit_ms = manifest.processing.commit_interval_ms;
    if commit_ms * 2 > txn_ms {
        return Err(StreamError::Settings(format!(
            "processing.commit-interval-ms = {commit_ms} in {} is more than half the \
             transaction timeout ({txn_ms} ms, --transaction-timeout-ms): transactions would \
             time out before they commit. Lower commit-interval-ms to at most {} or raise \
             --transaction-timeout-ms to at least {}",
            manifest.path.display(),
            txn_ms / 2,
            commit_ms * 2
        )));
    }
    let call_ms = manifest.limits.timeout_ms;
    if call_ms > txn_ms {
        return Err(StreamError::Settings(format!(
            "limits.timeout-ms = {call_ms} in {} is longer than the transaction timeout \
             ({txn_ms} ms, --transaction-timeout-ms): one slow call would outlast the \
             transaction. Lower limits.timeout-ms or raise --transaction-timeout-ms to at \
             least {call_ms}",
            manifest.path.display()
        )));
    }
    Ok(())
}

/// Logs the figures since `last`, unless nothing happened since: an idle
/// deployment stays quiet (a host of hundreds would log a line per
/// deployment every report interval).
fn report(
    app: &str,
    metrics: &Metrics,
    last: crate::metrics::Snapshot,
    elapsed: Duration,
) -> crate::metrics::Snapshot {
    let now = metrics.snapshot();
    if now == last {
        return now;
    }
    let secs = elapsed.as_secs_f64().max(1e-3);
    let latency = metrics.take_latency();
    tracing::info!(
        app,
        records_per_s = ((now.records - last.records) as f64 / secs).round(),
        commits_per_s = ((now.commits - last.commits) as f64 / secs * 10.0).round() / 10.0,
        commit_p50_ms = latency.p50.as_secs_f64() * 1e3,
        commit_p99_ms = latency.p99.as_secs_f64() * 1e3,
        aborts = now.aborts,
        fenced = now.fenced,
        restarts = now.restarts,
        restored = now.restored,
        standby_records = now.standby_records,
        "figures"
    );
    now
}
