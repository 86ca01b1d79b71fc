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
pub mod names;
pub mod verify;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub use changelog::{changelog_topic, changelog_topics};
pub use clients::prepare_topics;

use crate::kafka::{Connection, KafkaError};
use crate::manifest::{Guarantee, Manifest};
use crate::metrics::Metrics;
use crate::sandbox::Processor;
use crate::task::TaskConfig;

/// Why a deployment stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// A Kafka operation failed (a missing or unusable topic is
    /// [`KafkaError::Topic`]).
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
    /// A worker must restart its session (producer, consumer, tasks):
    /// fencing, a fatal producer error, a timeout.
    #[error("worker session must restart: {0}")]
    Restart(String),
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
            Self::ProcessorFailed(_) | Self::Kafka(KafkaError::Topic { .. })
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
    /// How often to log the figures.
    pub report_interval: Duration,
}

/// Everything the workers of one deployment share.
pub(crate) struct Deployment {
    pub manifest: Manifest,
    pub processor: Processor,
    pub task_config: TaskConfig,
    pub options: RunOptions,
    pub changelogs: Vec<(String, String)>,
    pub metrics: Arc<Metrics>,
    pub shutdown: Arc<AtomicBool>,
}

impl Deployment {
    pub(crate) fn exactly_once(&self) -> bool {
        self.manifest.processing.guarantee == Guarantee::ExactlyOnceV2
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
    let partitions = prepare_topics(&manifest, &options.kafka)?;
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
    let deployment = Arc::new(Deployment {
        task_config: TaskConfig::from_manifest(&manifest),
        manifest,
        processor,
        options,
        changelogs,
        metrics: metrics.clone(),
        shutdown: shutdown.clone(),
    });

    let mut handles = Vec::new();
    for n in 0..deployment.manifest.processing.worker_threads {
        let d = deployment.clone();
        let handle = std::thread::Builder::new()
            .name(format!("onceflow-worker-{n}"))
            .spawn(move || worker::run_worker(&d, n))
            .map_err(|e| StreamError::Restart(format!("cannot start worker thread: {e}")))?;
        handles.push(handle);
    }

    let app = deployment.manifest.application_id();
    let mut last_report = Instant::now();
    let mut last = metrics.snapshot();
    let mut result = Ok(());
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if handles.iter().any(|h| h.is_finished()) && !shutdown.load(Ordering::Relaxed) {
            // A worker stopped on its own: the deployment failed. Stop the
            // others cleanly.
            shutdown.store(true, Ordering::Relaxed);
        }
        if last_report.elapsed() >= deployment.options.report_interval {
            last = report(&app, &metrics, last, last_report.elapsed());
            last_report = Instant::now();
        }
    }
    for h in handles {
        let worker = h
            .join()
            .unwrap_or_else(|_| Err(StreamError::Restart("a worker thread panicked".to_owned())));
        // The first failure is the one to report.
        if let (Ok(()), Err(e)) = (&result, worker) {
            result = Err(e);
        }
    }
    report(&app, &metrics, last, last_report.elapsed());
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
        "deployment stopped"
    );
    result.map(|()| metrics)
}

/// Logs the figures since `last`.
fn report(
    app: &str,
    metrics: &Metrics,
    last: crate::metrics::Snapshot,
    elapsed: Duration,
) -> crate::metrics::Snapshot {
    let now = metrics.snapshot();
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
        "figures"
    );
    now
}
