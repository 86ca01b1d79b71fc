//! The control plane: `onceflow host`'s fleet. Each host reconciles the
//! deployment registry (kept in Kafka, read by [`ControlPlane`]) into
//! running deployments, and serves the tenants' operations ([`Fleet`]'s
//! `deploy`, `set_desired`, `delete`, `describe`, `logs`, `query`, in
//! `service.rs`) for the admin API.
//!
//! | file | what |
//! |---|---|
//! | `reconciler.rs` | starts, stops, pauses and upgrades deployments (processors and sinks); publishes statuses |
//! | `service.rs` | the tenants' operations, with typed results ([`crate::api`]) and errors ([`FleetError`]) |
//! | `control.rs` | the control topics' I/O: opening them, tailing the registry and statuses |
//! | `artifacts.rs`, `logs.rs` | components and guest logs in their topics |
//! | `registry.rs` | the records in those topics |
//! | `tenancy.rs` | tenants, tokens, namespaces and quotas |
//! | `admission.rs` | a deploy's quota check and write as one compare-and-set across hosts |
//! | `identity.rs` | one id, one host process: incarnations, heartbeats, refusing a duplicate |
//!
//! Hosts never talk to each other. Every host runs every deployment that
//! should run, with its own host id as the instance id; Kafka's consumer
//! groups spread the partitions over the hosts, so adding a host adds
//! capacity, and a host that dies loses its partitions to the others when its
//! session expires.
//!
//! An upgrade stops the running version (its workers commit their open
//! transactions: a commit boundary), then starts the new one on the same
//! application id, state directory and transactional ids, so state and
//! offsets carry over with no gap and no duplicate.

mod admission;
mod artifacts;
pub mod control;
mod error;
mod identity;
mod logs;
mod queries;
mod reconciler;
pub mod registry;
pub mod replay;
mod service;
pub mod tenancy;
mod usage;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use crate::memory::{MemoryBudget, MemoryLimits};
use crate::stream::cpu::CpuBudget;

pub use control::ControlPlane;
pub use error::FleetError;
pub use logs::{DeploymentLogSink, remember_error};
pub use queries::{Owners, Peer, QueryPlan, merge_answer, query_value, wire_read};
pub use reconciler::RunState;
pub use service::Deployed;
pub use tenancy::{Tenant, Tenants, TenantsFile};

use crate::manifest::{Manifest, ManifestError};
use crate::metrics::Exposition;
use crate::sandbox::Sandbox;
use crate::sink::{Connections, SinkConfig};
use crate::stream::RunOptions;
use reconciler::Running;
use registry::DeploymentRecord;

/// The state a draining host's heartbeat says.
pub(crate) const DRAINING: &str = "draining";
/// The state a host's heartbeat says once it drained and exited.
pub(crate) const DRAINED: &str = "drained";

/// The manifest a record carries. Its `[build]` paths mean nothing on a
/// host; the name is for messages.
pub fn manifest_of(record: &DeploymentRecord) -> Result<Manifest, ManifestError> {
    parse_manifest(&record.tenant, &record.name, &record.manifest)
}

impl Fleet {
    /// The parsed manifest of a deployment record, parsed once per text: a
    /// deploy checks its tenant's quotas and every deployment's names
    /// against all records, and parsing each manifest each time made
    /// `onceflow deploy` grow with the host (0.33 s at 10 deployments,
    /// 0.59 s at 250, dev build).
    pub(crate) fn manifest(&self, r: &DeploymentRecord) -> Result<Arc<Manifest>, ManifestError> {
        let key = r.key();
        if let Some((text, m)) = self
            .manifests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            && *text == r.manifest
        {
            return Ok(m.clone());
        }
        let m = Arc::new(manifest_of(r)?);
        self.manifests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (r.manifest.clone(), m.clone()));
        Ok(m)
    }
}

/// Parses manifest text sent for `<tenant>/<name>` (the path is only for
/// messages).
pub fn parse_manifest(tenant: &str, name: &str, text: &str) -> Result<Manifest, ManifestError> {
    Manifest::parse(
        text,
        PathBuf::from(format!("{tenant}/{name}/onceflow.toml")),
    )
}

/// CPU seconds per second for a `cpu-share` percent of this host; `None`
/// (no limit) at 100.
fn cpu_limit(share: u32) -> Option<f64> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (share < 100).then(|| f64::from(share) / 100.0 * cores as f64)
}

/// One host.
pub struct Fleet {
    /// This host's id: the instance id of every deployment it runs.
    pub host_id: String,
    /// This host process's random id (see `identity.rs`).
    pub incarnation: String,
    /// The registry and internal topics.
    pub control: Arc<ControlPlane>,
    /// Who may do what: replaced whole when `tenants.toml` changes.
    tenants: RwLock<Arc<Tenants>>,
    /// Compiles and checks components.
    pub sandbox: Sandbox,
    options: RunOptions,
    running: Mutex<BTreeMap<String, Running>>,
    /// Set when the host drains: the reconciler stops every deployment.
    shutdown: Arc<AtomicBool>,
    /// Set when the host begins to drain ([`Fleet::start_draining`]): it
    /// takes no new work.
    draining: AtomicBool,
    duplicates: Mutex<identity::DuplicateWatch>,
    /// One lock per tenant, held from a deploy's quota check to its write:
    /// two deploys of one tenant on this host are admitted one after the
    /// other (before, eight at once against a quota of 2 all got in).
    admissions: Mutex<BTreeMap<String, Arc<Mutex<()>>>>,
    /// Each tenant's CPU budget on this host (unlimited at cpu-share 100),
    /// shared by all its deployments' workers.
    cpu_budgets: Mutex<BTreeMap<String, Arc<CpuBudget>>>,
    /// Each tenant's memory budget on this host (`host-held-mb`), shared
    /// by all its deployments and sinks.
    memory_budgets: Mutex<BTreeMap<String, Arc<MemoryBudget>>>,
    /// How long an unused upload is kept (`artifacts.rs`).
    artifact_grace: Duration,
    /// The database connections this host offers tenants' sinks.
    sink_connections: RwLock<Arc<Connections>>,
    /// Deployments held back because their tenant is not in tenants.toml
    /// (logged once each, when it happens).
    held: Mutex<std::collections::BTreeSet<String>>,
    /// Where this host's admin API answers other hosts (`queries.rs`).
    api_url: RwLock<String>,
    /// Each deployment record's manifest, parsed once per text
    /// ([`Fleet::manifest`]).
    manifests: Mutex<std::collections::HashMap<String, (String, Arc<Manifest>)>>,
}

impl Fleet {
    /// A host over `control`, running deployments with `options` (its
    /// `instance_id` is the host id), keeping uploads no deployment runs
    /// for `artifact_grace`.
    pub fn new(
        control: Arc<ControlPlane>,
        tenants: Tenants,
        sandbox: Sandbox,
        options: RunOptions,
        shutdown: Arc<AtomicBool>,
        artifact_grace: Duration,
    ) -> Arc<Self> {
        // A host whose heartbeat says it drains commits before its workers
        // leave: their partitions' next owners need not fence them.
        let statuses = control.statuses.clone();
        let options = RunOptions {
            draining: Some(crate::stream::Draining(Arc::new(move |host: &str| {
                statuses
                    .get(&registry::heartbeat_key(host))
                    .is_some_and(|s| s.state == DRAINING || s.state == DRAINED)
            }))),
            ..options
        };
        Arc::new(Self {
            host_id: options.instance_id.clone(),
            incarnation: identity::new_incarnation(),
            control,
            tenants: RwLock::new(Arc::new(tenants)),
            sandbox,
            options,
            running: Mutex::default(),
            shutdown,
            draining: AtomicBool::new(false),
            duplicates: Mutex::default(),
            admissions: Mutex::default(),
            cpu_budgets: Mutex::default(),
            memory_budgets: Mutex::default(),
            artifact_grace,
            sink_connections: RwLock::default(),
            held: Mutex::default(),
            api_url: RwLock::default(),
            manifests: Mutex::default(),
        })
    }

    /// The host begins to drain (`host::Host::wait`): the API refuses
    /// writes ([`Fleet::refuse_if_draining`]), `/healthz` says so, the
    /// reconciler starts nothing more, and the host's heartbeat says
    /// `draining`. Returns how many deployments run here.
    pub fn start_draining(&self) -> usize {
        self.draining.store(true, Ordering::Relaxed);
        self.heartbeat();
        self.control.flush();
        self.running().len()
    }

    /// The drain timed out and the process exits with deployments still
    /// stopping: its heartbeat goes, so that the hosts that take their
    /// partitions from now on fence them.
    pub fn drain_abandoned(&self) {
        self.control.clear_heartbeat(&self.host_id);
        self.control.flush();
    }

    /// Whether the host drains.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Refuses a write (deploy, upload, pause, resume, delete) on a
    /// draining host: the caller sends it to another host.
    pub(crate) fn refuse_if_draining(&self) -> Result<(), FleetError> {
        if self.draining() {
            return Err(FleetError::Draining {
                host: self.host_id.clone(),
            });
        }
        Ok(())
    }

    /// The deployments whose threads have not stopped yet (a drain that
    /// timed out names them).
    pub fn still_running(&self) -> Vec<String> {
        self.running()
            .iter()
            .filter(|(_, r)| r.thread.as_ref().is_some_and(|t| !t.is_finished()))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Offers these database connections to tenants' sinks
    /// (`onceflow host --sink-connections`).
    pub fn set_sink_connections(&self, connections: Connections) {
        *self
            .sink_connections
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(connections);
    }

    /// A tenant's sink configuration as deployed (`record.manifest`), with
    /// the connection it names resolved on this host.
    fn sink_of(&self, tenant: &str, name: &str, text: &str) -> Result<SinkConfig, FleetError> {
        let path = PathBuf::from(format!("{tenant}/{name}/sink.toml"));
        let config = SinkConfig::parse(text, &path)
            .map_err(|e| FleetError::Invalid(crate::types::error_chain(&e)))?;
        if config.name != name {
            return Err(FleetError::Invalid(format!(
                "the sink's name is {:?} but the request deploys {name:?}",
                config.name
            )));
        }
        let connections = self
            .sink_connections
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        config
            .for_tenant(tenant, &connections)
            .map_err(|e| FleetError::Invalid(format!("{}: {e}", path.display())))
    }

    /// The tenants in force now (a request keeps the ones it started with).
    pub fn tenants(&self) -> Arc<Tenants> {
        self.tenants
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Puts new tenants in force (`tenants.toml` changed). A tenant removed
    /// from the file can no longer call the API, and its deployments stop
    /// at their next commit boundary (`reconciler.rs`); they start again,
    /// from their committed offsets and stores, if it is put back.
    pub fn replace_tenants(&self, tenants: Tenants) {
        // Under the budgets' lock, which cpu_budget reads the tenants under:
        // a budget made meanwhile gets either the old share and then the
        // new one here, or the new one.
        let budgets = self.cpu_budgets.lock().unwrap_or_else(|e| e.into_inner());
        for (name, budget) in budgets.iter() {
            let share = tenants.get(name).map_or(100, |t| t.quotas.cpu_share);
            budget.set_rate(cpu_limit(share));
        }
        for (name, budget) in self
            .memory_budgets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            if let Some(t) = tenants.get(name) {
                budget.set_limit(t.quotas.host_held_mb.saturating_mul(1 << 20));
            }
        }
        *self.tenants.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(tenants);
    }

    /// The CPU budget of `tenant`'s workers on this host, made on first use
    /// and shared after; unlimited while its `cpu-share` is 100. Every
    /// known tenant gets one (before, a tenant at 100 got none, so a share
    /// lowered later never applied to the deployments already running).
    pub fn cpu_budget(&self, tenant: &str) -> Option<Arc<CpuBudget>> {
        let mut budgets = self.cpu_budgets.lock().unwrap_or_else(|e| e.into_inner());
        let share = self.tenants().get(tenant)?.quotas.cpu_share;
        Some(
            budgets
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(CpuBudget::new(cpu_limit(share))))
                .clone(),
        )
    }

    /// The memory budgets of a deployment or sink of `tenant` on this host:
    /// its own (`held-mb`) under the tenant's (`host-held-mb`), made on
    /// first use and shared after (`memory.rs`).
    pub fn memory_limits(&self, tenant: &str) -> MemoryLimits {
        let quotas = self
            .tenants()
            .get(tenant)
            .map(|t| t.quotas)
            .unwrap_or_default();
        let shared = self
            .memory_budgets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(tenant.to_owned())
            .or_insert_with(|| {
                Arc::new(MemoryBudget::new(
                    quotas.host_held_mb.saturating_mul(1 << 20),
                ))
            })
            .clone();
        MemoryLimits::new(quotas.held_mb, Some(shared))
    }

    fn running(&self) -> MutexGuard<'_, BTreeMap<String, Running>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Prometheus view of the deployments this host runs, for one
    /// tenant or (`None`) all of them.
    pub fn exposition(&self, tenant: Option<&str>) -> Exposition {
        Exposition {
            deployments: self
                .running()
                .values()
                .filter(|r| tenant.is_none_or(|t| t == r.record.tenant))
                .map(|r| {
                    (
                        r.record.tenant.clone(),
                        r.record.name.clone(),
                        r.record.version,
                        r.metrics.clone(),
                    )
                })
                .collect(),
        }
    }

    /// The admission lock of a tenant (see `admissions`).
    fn admission_lock(&self, tenant: &str) -> Arc<Mutex<()>> {
        let mut locks = self.admissions.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(locks.entry(tenant.to_owned()).or_default())
    }

    /// Whether this host still runs (or is stopping) a deployment.
    pub fn is_running(&self, key: &str) -> bool {
        self.running().get(key).is_some_and(|r| r.thread.is_some())
    }
}
