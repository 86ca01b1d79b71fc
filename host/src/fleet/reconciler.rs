//! The reconciler: makes what runs on this host match the registry, and
//! publishes this host's status of each deployment.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::identity::STATUS_INTERVAL;
use super::logs::{DeploymentLogSink, remember_error};
use super::registry::{DeploymentKind, DeploymentRecord, Desired, HostStatus, now_ms};
use super::{Fleet, FleetError, manifest_of};
use crate::manifest::Manifest;
use crate::metrics::{Metrics, Snapshot};
use crate::sandbox::Processor;
use crate::sink;
use crate::stream;
use crate::task::processor_policy;

/// How often each host collects components no deployment runs
/// (`artifacts.rs`).
const COLLECT_INTERVAL: Duration = Duration::from_secs(600);

/// Where a deployment stands on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunState {
    /// Fetching and compiling the component, creating topics.
    Starting,
    /// Workers are in the group.
    Running,
    /// Asked to stop (pause, delete or upgrade); workers are committing.
    Stopping,
    /// Stopped by an error (e.g. the `fail` policy); waits for a new
    /// version or `resume`.
    Failed(String),
}

impl RunState {
    fn label(&self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Failed(_) => "failed",
        }
    }
}

/// A deployment this host runs, or is stopping.
pub(super) struct Running {
    pub(super) record: DeploymentRecord,
    pub(super) metrics: Arc<Metrics>,
    shutdown: Arc<AtomicBool>,
    /// Set before `shutdown` when its workers should leave their groups as
    /// they stop (`RunOptions::hand_over`): the host drains, or the
    /// deployment is deleted. Unset, they keep their static memberships
    /// (a pause, an upgrade: the same instance comes back).
    hand_over: Arc<AtomicBool>,
    pub(super) thread: Option<JoinHandle<Result<(), FleetError>>>,
    state: RunState,
    recent_errors: Arc<Mutex<VecDeque<String>>>,
    /// When the last status was published, and the counters then.
    last: (Instant, Snapshot),
    /// The last status published (what a quiet one is compared with).
    published: Option<HostStatus>,
    /// When the status was last looked at.
    checked: Instant,
    /// Failed on an error that may pass (the brokers did not answer): when
    /// it is started again.
    retry_at: Option<Instant>,
}

/// How long a deployment stopped by a transient broker error waits before
/// it starts again ([`FleetError::is_transient`]): before, a timeout of one
/// admin call on an overloaded broker failed it on that host for good.
const TRANSIENT_RETRY: Duration = Duration::from_secs(10);

/// How often a deployment's status is published when nothing in it
/// changed (an idle or hibernating deployment): within the 10 s after which
/// `list` calls a status stale, with room for a busy host's delays. A status
/// that changed goes out at the next [`STATUS_INTERVAL`]. (Every 2 s
/// regardless, 500 idle deployments wrote 250 statuses a second, which
/// every host read.)
const QUIET_STATUS_INTERVAL: Duration = Duration::from_secs(6);
/// A reconciler pass this long is logged (statuses and the heartbeat wait
/// for it; other hosts count a heartbeat stale after a minute).
const SLOW_PASS: Duration = Duration::from_secs(10);

/// Whether `now` tells nothing that `before` did not (its rates and time
/// aside): a deployment with no records, commits, errors or moves since.
fn same_news(before: &HostStatus, now: &HostStatus) -> bool {
    before.version == now.version
        && before.state == now.state
        && before.partitions == now.partitions
        && before.lag == now.lag
        && before.records == now.records
        && before.aborts == now.aborts
        && before.fenced == now.fenced
        && before.dead_lettered == now.dead_lettered
        && before.last_errors == now.last_errors
        && before.hibernating == now.hibernating
}

impl Fleet {
    /// Reconciles until shutdown, then stops every deployment cleanly.
    pub fn run(self: &Arc<Self>) {
        let mut seen = -1;
        let mut heartbeat = Instant::now() - STATUS_INTERVAL;
        let mut collected = Instant::now();
        let mut slow = crate::kafka::OncePerMinute::default();
        while !self.shutdown.load(Ordering::Relaxed) {
            let pass = Instant::now();
            self.reconcile();
            let reconciled = pass.elapsed();
            self.publish_statuses();
            let published = pass.elapsed();
            if collected.elapsed() >= COLLECT_INTERVAL {
                match self.control.collect_artifacts(None, self.artifact_grace) {
                    Ok(_) => self.control.prune_cache(),
                    Err(e) => tracing::warn!(
                        "collecting unused components failed (tried again in 10 minutes): {}",
                        crate::types::error_chain(&e)
                    ),
                }
                collected = Instant::now();
            }
            if heartbeat.elapsed() >= STATUS_INTERVAL {
                self.heartbeat();
                self.watch_for_duplicates();
                self.control.admitters.close_idle();
                heartbeat = Instant::now();
            }
            // Statuses and heartbeats wait for this loop: say when it is slow.
            if pass.elapsed() >= SLOW_PASS && slow.due() {
                tracing::warn!(
                    "the reconciler's pass took {:.1} s (reconcile {:.1} s, statuses {:.1} s, the rest \
                     {:.1} s): this host's statuses and heartbeat wait for it",
                    pass.elapsed().as_secs_f64(),
                    reconciled.as_secs_f64(),
                    (published - reconciled).as_secs_f64(),
                    (pass.elapsed() - published).as_secs_f64(),
                );
            }
            seen = self
                .control
                .deployments
                .wait_change(seen, Duration::from_millis(250));
        }
        tracing::info!("host stopping: committing and stopping every deployment");
        let keys: Vec<String> = self.running().keys().cloned().collect();
        for key in &keys {
            if let Some(r) = self.running().get_mut(key) {
                // The host drains: the other hosts take the partitions now.
                r.hand_over.store(true, Ordering::Relaxed);
                r.shutdown.store(true, Ordering::Relaxed);
            }
        }
        for key in keys {
            let handle = self.running().get_mut(&key).and_then(|r| r.thread.take());
            if let Some(h) = handle {
                let _ = h.join();
            }
            self.control.clear_status_of(&key, &self.host_id);
        }
        self.heartbeat_drained();
        self.control.flush();
    }

    /// One pass: make what runs here match the registry.
    pub fn reconcile(self: &Arc<Self>) {
        let desired: BTreeMap<String, DeploymentRecord> = self
            .control
            .deployments
            .all()
            .into_iter()
            .map(|r| (r.key(), r))
            .collect();
        let mut running = self.running();
        // A tenant removed from tenants.toml: its deployments stop (before,
        // they ran on, with no CPU share at all: 1.77 cores).
        let tenants = self.tenants();
        let known = |tenant: &str| tenants.get(tenant).is_some();

        // Collect finished threads.
        for (key, r) in running.iter_mut() {
            if r.thread.as_ref().is_some_and(JoinHandle::is_finished) {
                let result = r
                    .thread
                    .take()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(FleetError::Unavailable(
                                "the deployment thread panicked".into(),
                            ))
                        })
                    })
                    .unwrap_or(Ok(()));
                match result {
                    // Asked to stop and did: removed below.
                    Ok(()) if r.state == RunState::Stopping => {}
                    Err(e) if r.state == RunState::Stopping => {
                        let e = crate::types::error_chain(&e);
                        tracing::warn!(deployment = %key, "deployment stopped with an error: {e}");
                    }
                    Ok(()) => r.state = RunState::Failed("stopped on its own".into()),
                    Err(e) if e.is_transient() => {
                        let e = crate::types::error_chain(&e);
                        tracing::warn!(
                            deployment = %key,
                            version = r.record.version,
                            "deployment stopped by an error of the brokers or the schema registry; starting it again in {} s: {e}",
                            TRANSIENT_RETRY.as_secs()
                        );
                        remember_error(&r.recent_errors, e.clone());
                        r.state = RunState::Failed(e);
                        r.retry_at = Some(Instant::now() + TRANSIENT_RETRY);
                    }
                    Err(e) => {
                        let e = crate::types::error_chain(&e);
                        tracing::error!(deployment = %key, version = r.record.version, "deployment failed: {e}");
                        remember_error(&r.recent_errors, e.clone());
                        r.state = RunState::Failed(e);
                    }
                }
            }
        }

        // Stop what should not run (any more, or not in this version).
        let mut finished_stopping = Vec::new();
        for (key, r) in running.iter_mut() {
            let keep = desired.get(key).is_some_and(|d| {
                d.desired == Desired::Running
                    && d.version == r.record.version
                    && d.updated_ms == r.record.updated_ms
                    && known(&d.tenant)
            });
            let retry_failed = matches!(r.state, RunState::Failed(_))
                && (!keep || r.retry_at.is_some_and(|at| Instant::now() >= at));
            if !keep && r.thread.is_some() {
                if r.state != RunState::Stopping {
                    if !known(&r.record.tenant) {
                        tracing::info!(
                            deployment = %key,
                            tenant = %r.record.tenant,
                            "the tenant is not in tenants.toml any more: its deployment stops; \
                             it starts again if the tenant is put back"
                        );
                    }
                    tracing::info!(deployment = %key, version = r.record.version, "stopping at the next commit boundary");
                    r.state = RunState::Stopping;
                    // Deleted: nothing comes back for its partitions, so its
                    // workers leave (a purge then waits for no session).
                    let deleted = desired
                        .get(key)
                        .is_none_or(|d| d.desired == Desired::Deleted);
                    r.hand_over.store(deleted, Ordering::Relaxed);
                    r.shutdown.store(true, Ordering::Relaxed);
                }
            } else if r.thread.is_none() && (r.state == RunState::Stopping || retry_failed) {
                finished_stopping.push(key.clone());
            }
        }
        for key in finished_stopping {
            if let Some(r) = running.remove(&key) {
                tracing::info!(deployment = %key, version = r.record.version, "stopped");
                self.control.clear_status_of(&key, &self.host_id);
                if let Some(d) = desired.get(&key)
                    && d.desired == Desired::Deleted
                    && d.purge_state
                {
                    self.purge_local_state(d);
                }
            }
        }

        // Start what should run and does not: not on a draining host.
        if self.draining() {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|key| desired.get(key).is_some_and(|d| !known(&d.tenant)));
        for (key, d) in &desired {
            if d.desired != Desired::Running || running.contains_key(key) {
                continue;
            }
            if !known(&d.tenant) {
                if held.insert(key.clone()) {
                    tracing::info!(
                        deployment = %key,
                        tenant = %d.tenant,
                        "not started: the tenant is not in tenants.toml"
                    );
                }
                continue;
            }
            let r = self.start(d.clone());
            running.insert(key.clone(), r);
        }
    }

    fn purge_local_state(&self, d: &DeploymentRecord) {
        let Ok(manifest) = manifest_of(d) else {
            return;
        };
        let dir = self.options.state_dir.join(manifest.application_id());
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => tracing::info!(deployment = %d.key(), "local state purged"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(deployment = %d.key(), "cannot purge {}: {e}", dir.display()),
        }
    }

    fn start(self: &Arc<Self>, record: DeploymentRecord) -> Running {
        let metrics = Arc::new(Metrics::default());
        let shutdown = Arc::new(AtomicBool::new(false));
        let hand_over = Arc::new(AtomicBool::new(false));
        let recent_errors = Arc::new(Mutex::new(VecDeque::new()));
        tracing::info!(deployment = %record.key(), version = record.version, "starting");
        let thread = {
            let me = self.clone();
            let record = record.clone();
            let (metrics, shutdown, recent) =
                (metrics.clone(), shutdown.clone(), recent_errors.clone());
            let hand_over = hand_over.clone();
            std::thread::Builder::new()
                .name(format!("deployment-{}", record.name))
                .spawn(move || {
                    // Every line its threads log names the deployment.
                    let span = tracing::info_span!("deployment", name = %record.key());
                    let _span = span.enter();
                    if record.kind == DeploymentKind::Sink {
                        return me.run_sink(&record, shutdown, metrics);
                    }
                    let manifest = manifest_of(&record).map_err(FleetError::Manifest)?;
                    let processor = me.load(&record, &manifest, recent, metrics.clone())?;
                    if let Some(r) = me.running().get_mut(&record.key())
                        && r.state == RunState::Starting
                    {
                        r.state = RunState::Running;
                    }
                    let memory = me.memory_limits(&record.tenant);
                    let namespace = me
                        .tenants()
                        .get(&record.tenant)
                        .map(|t| t.topic_prefix.clone());
                    let codecs = stream::deployment_codecs(
                        &manifest,
                        me.options.schema_registry.as_ref(),
                        Some((
                            &crate::schema::SchemaFiles(record.schemas.clone()),
                            // A tenant gone from tenants.toml: no subject is its.
                            Some(namespace.unwrap_or_else(|| format!("{}.", record.tenant))),
                        )),
                    )?;
                    let options = stream::RunOptions {
                        codecs,
                        cpu_budget: me.cpu_budget(&record.tenant),
                        held_mb: memory.deployment.limit() >> 20,
                        tenant_memory: memory.tenant,
                        hand_over: Some(hand_over),
                        ..me.options.clone()
                    };
                    stream::run_with_metrics(manifest, processor, options, shutdown, metrics)
                        .map(|_| ())
                        .map_err(FleetError::from)
                })
        };
        let (thread, state) = match thread {
            Ok(t) => (Some(t), RunState::Starting),
            Err(e) => (
                None,
                RunState::Failed(format!("cannot start a thread: {e}")),
            ),
        };
        Running {
            record,
            metrics,
            shutdown,
            hand_over,
            thread,
            state,
            recent_errors,
            // Due at once: the first status says "starting".
            last: (Instant::now() - STATUS_INTERVAL, Snapshot::default()),
            published: None,
            checked: Instant::now() - STATUS_INTERVAL,
            retry_at: None,
        }
    }

    /// Runs a tenant's sink until `shutdown` (every host runs it; the group
    /// shares the partitions). Its credentials are this host's (the
    /// connection the sink names).
    fn run_sink(
        self: &Arc<Self>,
        record: &DeploymentRecord,
        shutdown: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Result<(), FleetError> {
        let config = self.sink_of(&record.tenant, &record.name, &record.manifest)?;
        if let Some(r) = self.running().get_mut(&record.key())
            && r.state == RunState::Starting
        {
            r.state = RunState::Running;
        }
        let options = sink::SinkOptions {
            kafka: self.options.kafka.clone(),
            instance_id: self.host_id.clone(),
            session_timeout: self.options.session_timeout,
            report_interval: self.options.report_interval,
            pause_before_begin: Duration::ZERO,
            pause_before_commit: Duration::ZERO,
            pause_between_markers: Duration::ZERO,
            pause_after_commit: Duration::ZERO,
            lose_commit_answers: 0,
            metrics,
            usage: self
                .options
                .usage_topic
                .clone()
                .map(|topic| sink::UsageTarget {
                    topic,
                    tenant: record.tenant.clone(),
                    deployment: record.name.clone(),
                }),
            memory: self.memory_limits(&record.tenant),
        };
        sink::run_postgres(config, options, shutdown)?;
        Ok(())
    }

    /// Fetches and compiles a deployment's component (cached on disk).
    fn load(
        &self,
        record: &DeploymentRecord,
        manifest: &Manifest,
        recent: Arc<Mutex<VecDeque<String>>>,
        metrics: Arc<Metrics>,
    ) -> Result<Processor, FleetError> {
        let bytes = self.control.artifact(&record.artifact)?;
        self.control.ensure_log_topic(&record.tenant)?;
        let processor = self
            .sandbox
            .load(&bytes, processor_policy(manifest))
            .map_err(FleetError::Component)?;
        let sink = DeploymentLogSink::new(
            self.control.clone(),
            &record.tenant,
            record.key(),
            self.host_id.clone(),
            recent,
            metrics,
        );
        Ok(processor.with_log_sink(Arc::new(sink)))
    }

    /// Publishes this host's status of each deployment it runs: every
    /// [`STATUS_INTERVAL`] while it changes, else every
    /// [`QUIET_STATUS_INTERVAL`].
    pub fn publish_statuses(&self) {
        let mut running = self.running();
        for r in running.values_mut() {
            if r.checked.elapsed() < STATUS_INTERVAL {
                continue;
            }
            r.checked = Instant::now();
            let now = r.metrics.snapshot();
            let secs = r.last.0.elapsed().as_secs_f64().max(1e-3);
            let (records_per_s, commits_per_s) = (
                (now.records - r.last.1.records) as f64 / secs,
                (now.commits - r.last.1.commits) as f64 / secs,
            );
            let load = r.metrics.load();
            // A restart loop (a record the client cannot send, a store that
            // cannot open, an init that always fails) is `failing`, with
            // the error that restarted it last: never `running`.
            let failing = match (&r.state, r.metrics.failing()) {
                (RunState::Running, Some(error)) => Some(error),
                _ => None,
            };
            let mut last_errors: Vec<String> = r
                .recent_errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .cloned()
                .collect();
            if let Some(error) = &failing {
                last_errors.push(format!("worker restarting in a loop: {error}"));
            }
            let mut status = HostStatus {
                host: self.host_id.clone(),
                tenant: r.record.tenant.clone(),
                name: r.record.name.clone(),
                version: r.record.version,
                state: if failing.is_some() {
                    "failing".to_owned()
                } else {
                    r.state.label().to_owned()
                },
                partitions: load.partitions.into_iter().collect(),
                lag: load.lag,
                records_per_s,
                commits_per_s,
                commit_p99_ms: 0.0,
                records: now.records,
                aborts: now.aborts,
                fenced: now.fenced,
                dead_lettered: now.dead_lettered,
                last_errors,
                updated_ms: now_ms(),
                incarnation: self.incarnation.clone(),
                hibernating: r
                    .metrics
                    .hibernating
                    .load(std::sync::atomic::Ordering::Relaxed),
                api: String::new(),
            };
            let quiet = r.published.as_ref().is_some_and(|p| same_news(p, &status));
            if quiet && r.last.0.elapsed() < QUIET_STATUS_INTERVAL {
                continue;
            }
            status.commit_p99_ms = r.metrics.take_status_latency().p99.as_secs_f64() * 1e3;
            r.last = (Instant::now(), now);
            self.control.put_status(&status);
            r.published = Some(status);
        }
    }
}
