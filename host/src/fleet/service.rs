//! The tenants' operations on the fleet, as the admin API offers them: each
//! takes the authenticated tenant and returns a typed answer
//! ([`crate::api`]) or a [`FleetError`] whose variant decides the HTTP
//! status. They block (Kafka, wasmtime): the admin API runs them on its
//! blocking pool, within each tenant's slots (`admin::TenantWork`).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::registry::{
    DeploymentKind, DeploymentRecord, Desired, HostStatus, MAX_MANIFEST_BYTES, deployment_key,
    now_ms,
};
use super::tenancy::{Existing, Tenant};
use super::{Fleet, FleetError, manifest_of, parse_manifest};
use crate::api::{
    Deleted, DeployRequest, DeploymentSummary, HostSummary, LogLines, LogParams, Uploaded,
};
use crate::api::{UsageReport, UsageRow};
use crate::manifest::Manifest;
use crate::sandbox::ProcessorPolicy;
use crate::sink::SinkConfig;
use crate::stream::{self, StreamError, changelog, names};
use crate::task::processor_policy;
use crate::types::Usage;
use sha2::Digest as _;

/// A status older than this is reported as stale (its host is likely gone).
const STALE_AFTER_MS: i64 = 10_000;
/// A status older than this is not shown at all (its host is gone).
const FORGET_AFTER_MS: i64 = 60_000;
/// Longest a log read waits for a first line.
const MAX_LOG_WAIT: Duration = Duration::from_secs(30);

/// Whether a deploy created the deployment or upgraded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployed {
    /// A new deployment (or one deleted before).
    Created,
    /// A new version of a live deployment.
    Upgraded,
}

impl Fleet {
    /// Checks a component (parses, allowed imports, expected exports,
    /// compiles) and stores it, chunked, in Kafka.
    pub fn upload(&self, tenant: &Tenant, bytes: &[u8]) -> Result<Uploaded, FleetError> {
        self.refuse_if_draining()?;
        self.sandbox
            .load(bytes, ProcessorPolicy::default())
            .map_err(FleetError::Component)?;
        self.check_artifact_quota(tenant, bytes)?;
        let sha = self.control.put_artifact(&tenant.name, bytes)?;
        tracing::info!(tenant = %tenant.name, artifact = %sha, bytes = bytes.len(), "component stored");
        Ok(Uploaded {
            artifact: sha,
            size: bytes.len() as u64,
        })
    }

    /// Refuses an upload that would take the tenant past its `artifact-mb`
    /// quota, after collecting its own uploads that no deployment of its
    /// runs (older than the grace period). An upload it already holds adds
    /// nothing.
    fn check_artifact_quota(&self, tenant: &Tenant, bytes: &[u8]) -> Result<(), FleetError> {
        let sha = hex::encode(sha2::Sha256::digest(bytes));
        let quota = tenant.quotas.artifact_mb << 20;
        let size = bytes.len() as u64;
        let over = |held: u64| held + size > quota;
        if !over(self.control.held_bytes(&tenant.name, &sha)) {
            return Ok(());
        }
        let collected = self
            .control
            .collect_artifacts(Some(&tenant.name), self.artifact_grace)?;
        let held = self.control.held_bytes(&tenant.name, &sha);
        if over(held) {
            return Err(FleetError::Refused(format!(
                "quota exceeded: tenant {:?} holds {:.1} MiB of uploaded components and this one \
                 is {:.1} MiB, over its artifact-mb quota of {} MiB. Components that none of its \
                 deployments runs are collected {} s after their upload ({} collected just now): \
                 delete deployments you no longer need, or wait",
                tenant.name,
                held as f64 / 1048576.0,
                size as f64 / 1048576.0,
                tenant.quotas.artifact_mb,
                self.artifact_grace.as_secs(),
                collected.grants,
            )));
        }
        Ok(())
    }

    /// Deploys (or upgrades) `name` after checking the manifest, the
    /// tenant's namespace and quotas, the component and the topics.
    pub fn deploy(
        &self,
        tenant: &Tenant,
        name: &str,
        req: DeployRequest,
    ) -> Result<(Deployed, DeploymentSummary), FleetError> {
        self.refuse_if_draining()?;
        if req.manifest.len() > MAX_MANIFEST_BYTES {
            return Err(FleetError::TooLarge {
                what: "the manifest".to_owned(),
                size: req.manifest.len() as u64,
                limit: MAX_MANIFEST_BYTES as u64,
                advice: "a manifest of that size is likely a mistake (large [config] values \
                         belong in a topic or in the component)"
                    .to_owned(),
            });
        }
        let manifest =
            parse_manifest(&tenant.name, name, &req.manifest).map_err(FleetError::Manifest)?;
        if manifest.name != name {
            return Err(FleetError::Invalid(format!(
                "the manifest's name is {:?} but the request deploys {name:?}",
                manifest.name
            )));
        }
        // One deploy of this tenant at a time on this host; across hosts,
        // the final quota check and the write are one compare-and-set
        // (`admission.rs`). This first check refuses early, before the
        // component is fetched and compiled.
        let lock = self.admission_lock(&tenant.name);
        let _admitting = lock.lock().unwrap_or_else(|e| e.into_inner());
        // One client counts the partitions of every deployment of the
        // tenant, each topic once, for both checks below.
        let probe = self.control.metadata()?;
        let counts = std::cell::RefCell::new(stream::InputPartitions::new(&probe));
        let wanted = counts
            .borrow_mut()
            .of(&manifest)?
            .map_or(0, |n| n.max(0) as u32);
        let instances = |m: &Manifest| -> Result<u32, FleetError> {
            Ok(counts
                .borrow_mut()
                .of_existing(m)?
                .map_or(0, |n| n.max(0) as u32))
        };
        let admit = |records: &[DeploymentRecord]| -> Result<(), FleetError> {
            let mut others = Vec::new();
            for r in records.iter().filter(|r| r.desired != Desired::Deleted) {
                if r.kind == DeploymentKind::Sink {
                    // A deployment, without guest threads or memory.
                    others.push(Existing {
                        name: r.name.clone(),
                        worker_threads: 0,
                        guest_memory_mb: 0,
                    });
                    continue;
                }
                let Ok(m) = self.manifest(r) else { continue };
                others.push(Existing {
                    name: r.name.clone(),
                    worker_threads: m.processing.worker_threads,
                    guest_memory_mb: u64::from(instances(&m)?) * m.limits.memory_mb,
                });
            }
            tenant
                .admit(&manifest, wanted, &others)
                .map_err(FleetError::Refused)
        };
        admit(&self.live_records(tenant))?;
        self.check_names(tenant, &manifest)?;
        // Only the tenant's own uploads (or a component one of its
        // deployments already ran, uploaded before grants existed); another
        // tenant's component is as unknown as one never uploaded.
        let ran_before = self
            .control
            .deployments
            .with_prefix(&format!("{}/", tenant.name))
            .iter()
            .any(|r| r.artifact == req.artifact);
        if !ran_before && !self.control.granted(&tenant.name, &req.artifact)? {
            return Err(FleetError::Invalid(format!(
                "component {} was not uploaded by tenant {:?} (upload it with POST /v1/artifacts \
                 first; `onceflow deploy` does)",
                req.artifact, tenant.name
            )));
        }
        let bytes = self.control.artifact(&req.artifact).map_err(|e| match e {
            FleetError::Artifact { .. } => {
                FleetError::Invalid(format!("{e} (upload it with POST /v1/artifacts first)"))
            }
            other => other,
        })?;
        self.sandbox
            .load(&bytes, processor_policy(&manifest))
            .map_err(FleetError::Component)?;
        stream::prepare_topics_with(&manifest, self.control.connection(), &probe)?;
        // Last before the write: output schemas are registered (the
        // registry's compatibility check refuses an incompatible one).
        let schemas = self.check_formats(tenant, &manifest, &req.schemas)?;
        let key = deployment_key(&tenant.name, name);
        let mut previous = None;
        let record = self.control.admit(&tenant.name, |records| {
            let live: Vec<DeploymentRecord> = records.values().cloned().collect();
            admit(&live)?;
            previous = records.get(&key).cloned();
            if let Some(p) = &previous
                && p.kind == DeploymentKind::Sink
                && p.desired != Desired::Deleted
            {
                return Err(FleetError::Invalid(format!(
                    "{name:?} is a sink: a processor needs a name of its own (or delete the \
                     sink first)"
                )));
            }
            Ok(DeploymentRecord {
                tenant: tenant.name.clone(),
                name: name.to_owned(),
                version: previous.as_ref().map_or(1, |p| p.version + 1),
                manifest: req.manifest.clone(),
                artifact: req.artifact.clone(),
                artifact_size: bytes.len() as u64,
                desired: Desired::Running,
                purge_state: false,
                updated_ms: now_ms(),
                kind: DeploymentKind::Processor,
                schemas: schemas.clone(),
            })
        })?;
        tracing::info!(deployment = %record.key(), version = record.version, "deployed");
        let deployed = if previous.is_some_and(|p| p.desired != Desired::Deleted) {
            Deployed::Upgraded
        } else {
            Deployed::Created
        };
        Ok((deployed, summary(&record, &[])))
    }

    /// Deploys a tenant's PostgreSQL sink (`config`: its `sink.toml`): its
    /// topics must be in the tenant's namespace and none a name Onceflow
    /// reserves (`names::Reserved`: changelogs, `_onceflow.*`), and its
    /// connection one
    /// this host offers the tenant (`onceflow host --sink-connections`).
    /// Every host runs it, as it runs processors; the consumer group
    /// `<tenant>.<name>` shares the partitions.
    pub fn deploy_sink(
        &self,
        tenant: &Tenant,
        name: &str,
        config: &str,
    ) -> Result<(Deployed, DeploymentSummary), FleetError> {
        self.refuse_if_draining()?;
        if config.len() > MAX_MANIFEST_BYTES {
            return Err(FleetError::TooLarge {
                what: "the sink configuration".to_owned(),
                size: config.len() as u64,
                limit: MAX_MANIFEST_BYTES as u64,
                advice: "a sink.toml of that size is likely a mistake".to_owned(),
            });
        }
        let sink = self.sink_of(&tenant.name, name, config)?;
        check_sink_topics(tenant, &sink)?;
        crate::sink::check_topics(&sink, self.control.connection())?;
        let lock = self.admission_lock(&tenant.name);
        let _admitting = lock.lock().unwrap_or_else(|e| e.into_inner());
        let key = deployment_key(&tenant.name, name);
        let mut previous = None;
        let record = self.control.admit(&tenant.name, |records| {
            previous = records.get(&key).cloned();
            if let Some(p) = &previous
                && p.kind != DeploymentKind::Sink
                && p.desired != Desired::Deleted
            {
                return Err(FleetError::Invalid(format!(
                    "{name:?} is a processor: a sink needs a name of its own (or delete the \
                     processor first)"
                )));
            }
            let live = records
                .values()
                .filter(|r| r.desired != Desired::Deleted && r.key() != key)
                .count() as u32;
            if live >= tenant.quotas.deployments {
                return Err(FleetError::Refused(format!(
                    "deploying {name:?} would make {} deployments, over your quota of {}",
                    live + 1,
                    tenant.quotas.deployments
                )));
            }
            Ok(DeploymentRecord {
                tenant: tenant.name.clone(),
                name: name.to_owned(),
                version: previous.as_ref().map_or(1, |p| p.version + 1),
                manifest: config.to_owned(),
                artifact: String::new(),
                artifact_size: 0,
                desired: Desired::Running,
                purge_state: false,
                updated_ms: now_ms(),
                kind: DeploymentKind::Sink,
                schemas: BTreeMap::new(),
            })
        })?;
        tracing::info!(deployment = %record.key(), version = record.version, group = %sink.group(), "sink deployed");
        let deployed = if previous.is_some_and(|p| p.desired != Desired::Deleted) {
            Deployed::Upgraded
        } else {
            Deployed::Created
        };
        Ok((deployed, summary(&record, &[])))
    }

    /// The schema files `manifest` names, from those sent with its deploy;
    /// its formats checked and its output schemas registered under the
    /// tenant's subjects.
    fn check_formats(
        &self,
        tenant: &Tenant,
        manifest: &Manifest,
        sent: &BTreeMap<String, String>,
    ) -> Result<BTreeMap<String, String>, FleetError> {
        let mut kept = BTreeMap::new();
        for path in crate::schema::schema_paths(manifest) {
            let key = path.to_string_lossy().replace('\\', "/");
            let Some(text) = sent.get(&key) else {
                return Err(FleetError::Invalid(format!(
                    "the manifest names schema file {key:?}, which was not sent with the deploy \
                     (`onceflow deploy` sends the files its manifest names, from beside it)"
                )));
            };
            kept.insert(key, text.clone());
        }
        let total: usize = kept.values().map(String::len).sum();
        if total > crate::schema::MAX_SCHEMA_BYTES {
            return Err(FleetError::TooLarge {
                what: "the schema files".to_owned(),
                size: total as u64,
                limit: crate::schema::MAX_SCHEMA_BYTES as u64,
                advice: "keep a deployment's schemas together under that".to_owned(),
            });
        }
        let files = crate::schema::SchemaFiles(kept);
        stream::deployment_codecs(
            manifest,
            self.options.schema_registry.as_ref(),
            Some((&files, Some(tenant.topic_prefix.clone()))),
        )
        .map_err(|e| match e {
            StreamError::Formats(e) => FleetError::Formats(e),
            other => FleetError::Stream(other),
        })?;
        Ok(files.0)
    }

    /// Refuses a manifest whose derived Kafka names collide with each
    /// other (422), or with another deployment's, of any tenant (409):
    /// deployed but for a purged deletion, since a deletion without purge
    /// keeps its changelogs (see `stream::names`).
    fn check_names(&self, tenant: &Tenant, manifest: &Manifest) -> Result<(), FleetError> {
        let key = deployment_key(&tenant.name, &manifest.name);
        let own = names::own_conflicts(manifest);
        if !own.is_empty() {
            return Err(FleetError::Invalid(format!(
                "deployment {key}: {}",
                own.join("; ")
            )));
        }
        let hosts = self.live_host_ids();
        for r in self.control.deployments.all() {
            if r.key() == key || (r.desired == Desired::Deleted && r.purge_state) {
                continue;
            }
            let Ok(other) = self.manifest(&r) else {
                continue;
            };
            let found = names::conflicts_between(manifest, &other, &hosts);
            if found.is_empty() {
                continue;
            }
            // Another tenant's deployment is not named, nor its topics.
            let (other, conflicts) = if r.tenant == tenant.name {
                let deleted = if r.desired == Desired::Deleted {
                    " (deleted without --purge-state: its changelogs are kept)"
                } else {
                    ""
                };
                (
                    format!("deployment {}{deleted}", r.key()),
                    found
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            } else {
                (
                    "another tenant's deployment".to_owned(),
                    found
                        .iter()
                        .map(|c| format!("its {} is one of the other's names", c.mine))
                        .collect::<Vec<_>>()
                        .join("; "),
                )
            };
            tracing::info!(deployment = %key, conflicts_with = %r.key(), "deploy refused: {conflicts}");
            return Err(FleetError::NameConflict {
                deployment: key,
                other,
                conflicts,
            });
        }
        Ok(())
    }

    /// The tenant's deployments.
    pub fn list(&self, tenant: &Tenant) -> Vec<DeploymentSummary> {
        self.live_records(tenant)
            .into_iter()
            .map(|r| summary(&r, &self.statuses_of(&r)))
            .collect()
    }

    /// One deployment, with its manifest and every live host's view.
    pub fn describe(&self, tenant: &Tenant, name: &str) -> Result<DeploymentSummary, FleetError> {
        let r = self.own_record(tenant, name)?;
        let mut s = summary(&r, &self.statuses_of(&r));
        s.manifest = Some(r.manifest);
        Ok(s)
    }

    /// Pauses (`Paused`) or resumes (`Running`) a deployment: hosts stop or
    /// start its workers at a commit boundary, keeping state and offsets.
    pub fn set_desired(
        &self,
        tenant: &Tenant,
        name: &str,
        desired: Desired,
    ) -> Result<DeploymentSummary, FleetError> {
        self.refuse_if_draining()?;
        let r = self.write_desired(tenant, name, desired, false)?;
        Ok(summary(&r, &[]))
    }

    /// Deletes a deployment; with `purge_state`, once its workers have left
    /// (each host's leave the group as they stop; a hibernating one's
    /// static members when their sessions expire), drops its consumer group
    /// and changelogs too. Each host drops its local stores itself.
    pub fn delete(
        &self,
        tenant: &Tenant,
        name: &str,
        purge_state: bool,
    ) -> Result<Deleted, FleetError> {
        self.refuse_if_draining()?;
        let r = self.write_desired(tenant, name, Desired::Deleted, purge_state)?;
        if purge_state {
            let key = r.key();
            for _ in 0..600 {
                if !self.is_running(&key) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if r.kind == DeploymentKind::Sink {
                // No local state, no changelogs: its tables and positions
                // are the tenant's, in its database.
                return Ok(Deleted {
                    deleted: r.name,
                    state_purged: purge_state,
                });
            }
            let manifest = manifest_of(&r).map_err(FleetError::Manifest)?;
            changelog::purge(
                self.control.connection(),
                &manifest.application_id(),
                &stream::changelog_topics(&manifest)
                    .into_iter()
                    .chain(stream::replay::replay_topic(&manifest))
                    .collect::<Vec<_>>(),
            )?;
        }
        Ok(Deleted {
            deleted: r.name,
            state_purged: purge_state,
        })
    }

    /// Guest log lines of a deployment.
    pub fn logs(
        &self,
        tenant: &Tenant,
        name: &str,
        params: &LogParams,
    ) -> Result<LogLines, FleetError> {
        let r = self.own_record(tenant, name)?;
        let wait = Duration::from_millis(params.wait_ms).min(MAX_LOG_WAIT);
        let (lines, next) = self.control.read_logs(
            &r.tenant,
            &r.key(),
            params.from,
            params.tail.clamp(1, 1_000_000),
            wait,
        )?;
        Ok(LogLines { lines, next })
    }

    /// What `tenant`'s deployments used (`None`: every tenant's, for the
    /// operator), from `_onceflow.usage`.
    pub fn usage(&self, tenant: Option<&str>, since_ms: i64) -> Result<UsageReport, FleetError> {
        let sums = self.control.read_usage(tenant, since_ms)?;
        let mut total = Usage::default();
        let deployments = sums
            .into_iter()
            .map(|((tenant, deployment), usage)| {
                total += usage;
                UsageRow {
                    tenant,
                    deployment,
                    usage,
                }
            })
            .collect();
        Ok(UsageReport {
            since_ms,
            deployments,
            total,
        })
    }

    /// The tenant's live (not deleted) deployment `name`.
    pub(super) fn own_record(
        &self,
        tenant: &Tenant,
        name: &str,
    ) -> Result<DeploymentRecord, FleetError> {
        self.control
            .deployments
            .get(&deployment_key(&tenant.name, name))
            .filter(|r| r.desired != Desired::Deleted)
            .ok_or_else(|| FleetError::NoDeployment {
                name: name.to_owned(),
            })
    }

    /// The tenant's live deployments.
    fn live_records(&self, tenant: &Tenant) -> Vec<DeploymentRecord> {
        self.control
            .deployments
            .with_prefix(&format!("{}/", tenant.name))
            .into_iter()
            .filter(|r| r.desired != Desired::Deleted)
            .collect()
    }

    fn write_desired(
        &self,
        tenant: &Tenant,
        name: &str,
        desired: Desired,
        purge_state: bool,
    ) -> Result<DeploymentRecord, FleetError> {
        let mut r = self.own_record(tenant, name)?;
        r.desired = desired;
        r.purge_state = purge_state;
        r.updated_ms = now_ms();
        self.control.put_deployment(&r)?;
        tracing::info!(deployment = %r.key(), ?desired, "desired state changed");
        Ok(r)
    }

    fn statuses_of(&self, r: &DeploymentRecord) -> Vec<HostStatus> {
        let now = now_ms();
        self.control
            .statuses
            .with_prefix(&format!("{}/{}/", r.tenant, r.name))
            .into_iter()
            .filter(|s| now - s.updated_ms <= FORGET_AFTER_MS)
            .collect()
    }
}

/// Refuses a sink whose topics (its routes and its dead-letter topic) are
/// outside the tenant's namespace, or are names Onceflow reserves
/// (`names::Reserved`). Before, a sink could read a changelog, or send its
/// dead letters into one, which the next restore of that store would take
/// for state.
fn check_sink_topics(tenant: &Tenant, sink: &SinkConfig) -> Result<(), FleetError> {
    let topics = sink.topics();
    for (key, topic) in &topics {
        if !topic.starts_with(&tenant.topic_prefix) {
            return Err(FleetError::Refused(format!(
                "{key}: topic {topic:?} is outside your namespace: tenant {:?} may only use \
                 topics starting with {:?}",
                tenant.name, tenant.topic_prefix
            )));
        }
    }
    match names::first_reserved(topics) {
        Some(refusal) => Err(FleetError::Refused(format!("sink.toml: {refusal}"))),
        None => Ok(()),
    }
}

/// Rounded to one decimal, for people.
fn tenth(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// What `list` and `describe` show of a deployment, from its record and
/// the hosts' statuses.
fn summary(r: &DeploymentRecord, statuses: &[HostStatus]) -> DeploymentSummary {
    let now = now_ms();
    let hosts = statuses
        .iter()
        .map(|s| HostSummary {
            status: HostStatus {
                records_per_s: tenth(s.records_per_s),
                commits_per_s: tenth(s.commits_per_s),
                commit_p99_ms: tenth(s.commit_p99_ms),
                ..s.clone()
            },
            stale: now - s.updated_ms > STALE_AFTER_MS,
            age_ms: now - s.updated_ms,
        })
        .collect();
    let live: Vec<&HostStatus> = statuses
        .iter()
        .filter(|s| now - s.updated_ms <= STALE_AFTER_MS)
        .collect();
    let running_versions: BTreeSet<u64> = live
        .iter()
        .filter(|s| s.state == "running")
        .map(|s| s.version)
        .collect();
    let status = match r.desired {
        Desired::Paused => "paused",
        Desired::Deleted => "deleted",
        Desired::Running if live.iter().any(|s| s.state == "failed") => "failed",
        Desired::Running if live.iter().any(|s| s.state == "failing") => "failing",
        Desired::Running
            if running_versions.contains(&r.version) && running_versions.len() == 1 =>
        {
            "running"
        }
        Desired::Running if !running_versions.is_empty() => "upgrading",
        Desired::Running => "starting",
    };
    DeploymentSummary {
        name: r.name.clone(),
        tenant: r.tenant.clone(),
        version: r.version,
        status: status.to_owned(),
        artifact: r.artifact.clone(),
        artifact_size: r.artifact_size,
        updated_ms: r.updated_ms,
        running_versions: running_versions.into_iter().collect(),
        partitions: live.iter().map(|s| s.partitions.len()).sum(),
        lag: live.iter().map(|s| s.lag).sum(),
        records_per_s: tenth(live.iter().map(|s| s.records_per_s).sum()),
        commits_per_s: tenth(live.iter().map(|s| s.commits_per_s).sum()),
        hosts,
        manifest: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::tenancy::{Tenants, hash_token};

    fn acme() -> Tenant {
        let tenants = Tenants::parse(&format!(
            "[[tenant]]\nname = \"acme\"\ntoken-sha256 = \"{}\"\n",
            hash_token("t")
        ))
        .expect("valid tenants.toml");
        tenants.get("acme").expect("acme").clone()
    }

    fn sink(dead_letter_topic: &str, topic: &str) -> SinkConfig {
        SinkConfig::parse(
            &format!(
                "name = \"s\"\ndead-letter-topic = \"{dead_letter_topic}\"\n[postgres]\n\
                 connection = \"analytics\"\n[[routes]]\ntopic = \"{topic}\"\nmode = \"insert\"\n\
                 table = \"audit\"\ncolumns = [\"id\"]\n"
            ),
            std::path::Path::new("sink.toml"),
        )
        .expect("a valid sink.toml")
    }

    /// Issue 45: a sink's dead-letter topic could be a changelog (the
    /// sink's dead letters became the store's state at its next restore),
    /// and its routes could read one. Before, both deployed.
    #[test]
    fn a_sinks_topics_may_not_be_reserved_names() {
        let acme = acme();
        check_sink_topics(&acme, &sink("acme.dlq", "acme.audit")).expect("its own topics");
        let e = check_sink_topics(&acme, &sink("acme.wallet-balances-changelog", "acme.audit"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dead-letter-topic: topic \"acme.wallet-balances-changelog\" is reserved")
                && e.contains("\"acme.wallet-balances-changes\""),
            "{e}"
        );
        let e = check_sink_topics(&acme, &sink("acme.dlq", "acme.wallet-balances-changelog"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("routes[0].topic: topic \"acme.wallet-balances-changelog\" is reserved"),
            "{e}"
        );
        assert!(matches!(
            check_sink_topics(&acme, &sink("acme.dlq", "acme.x-changelog")),
            Err(FleetError::Refused(_))
        ));
        // The namespace comes first: `_onceflow.*` is outside every
        // tenant's prefix.
        let e = check_sink_topics(&acme, &sink("_onceflow.usage", "acme.audit"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("outside your namespace"), "{e}");
    }

    /// `names::Reserved` covers every topic the fleet keeps for itself.
    #[test]
    fn the_fleets_own_topics_are_reserved() {
        use super::super::registry;
        for topic in [
            registry::DEPLOYMENTS_TOPIC.to_owned(),
            registry::ARTIFACTS_TOPIC.to_owned(),
            registry::GRANTS_TOPIC.to_owned(),
            registry::STATUS_TOPIC.to_owned(),
            registry::USAGE_TOPIC.to_owned(),
            registry::logs_topic("acme"),
        ] {
            assert_eq!(
                names::Reserved::of(&topic),
                Some(names::Reserved::Internal),
                "{topic}"
            );
        }
    }
}
