//! Components in the artifacts topic: content-addressed (sha256), chunked
//! to fit Kafka's record limit, and cached on each host's disk. Each upload
//! also writes a grant (`<tenant>/<sha>` in `_onceflow.grants`, a
//! [`Grant`]): a tenant deploys only components it uploaded itself, not
//! another tenant's by its digest, and its grants' sizes count against its
//! `artifact-mb` quota.
//!
//! Collection ([`ControlPlane::collect_artifacts`]): a grant that none of
//! its tenant's deployments runs, uploaded longer ago than the grace
//! period, is removed; a component left with no grant and run by no
//! deployment has its chunks removed (tombstones; compaction frees the
//! bytes) and leaves the hosts' caches. Every host collects every 10
//! minutes, and a tenant's upload over its quota collects that tenant's
//! first. Grants written by older hosts (`<sha>/grant/<tenant>` in the
//! artifacts topic) still let their tenant deploy; their components are
//! not counted or collected.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::FleetError;
use super::control::ControlPlane;
use super::registry::{
    ARTIFACT_CHUNK, ARTIFACTS_TOPIC, Desired, GRANTS_TOPIC, Grant, chunk_key, grant_key, now_ms,
    parse_chunk_key, tenant_grant_key,
};
use crate::kafka;

/// What one collection removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    /// Grants removed (a tenant's uploads no deployment of its runs).
    pub grants: usize,
    /// Components removed from the artifacts topic.
    pub components: usize,
    /// Their bytes.
    pub bytes: u64,
}

impl ControlPlane {
    fn cached_artifact(&self, sha256: &str) -> PathBuf {
        self.artifact_cache.join(format!("{sha256}.wasm"))
    }

    /// Reads the artifacts topic from its start to its end as of now,
    /// handing each record to `visit` until it breaks.
    fn scan(
        &self,
        mut visit: impl FnMut(&kafka::Record<'_>) -> ControlFlow<()>,
    ) -> Result<(), FleetError> {
        let (consumer, (_, end)) = self.read_from(ARTIFACTS_TOPIC, |_, _| None)?;
        if end > 0 {
            kafka::read_to_end(
                &consumer,
                1,
                ARTIFACTS_TOPIC,
                Instant::now() + Duration::from_secs(120),
                |m| {
                    if visit(m).is_break() || m.offset() + 1 >= end {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )?;
        }
        Ok(())
    }

    fn cached_grant(&self, sha256: &str, tenant: &str) -> PathBuf {
        self.artifact_cache.join(format!("{sha256}.{tenant}.grant"))
    }

    /// Whether `tenant` uploaded the component `sha256` (through any host).
    pub fn granted(&self, tenant: &str, sha256: &str) -> Result<bool, FleetError> {
        if self.grants.get(&tenant_grant_key(tenant, sha256)).is_some() {
            return Ok(true);
        }
        // A grant an older host wrote, in the artifacts topic.
        let marker = self.cached_grant(sha256, tenant);
        if marker.exists() {
            return Ok(true);
        }
        let wanted = grant_key(sha256, tenant);
        let mut found = false;
        self.scan(|m| {
            found |= m.key() == Some(wanted.as_bytes()) && m.payload().is_some();
            if found {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if found {
            write_atomically(&marker, b"")?;
        }
        Ok(found)
    }

    /// Bytes of components `tenant` holds (its grants), leaving out
    /// `except`.
    pub fn held_bytes(&self, tenant: &str, except: &str) -> u64 {
        let prefix = format!("{tenant}/");
        self.grants
            .entries_with_prefix(&prefix)
            .into_iter()
            .filter(|(k, _)| k[prefix.len()..] != *except)
            .map(|(_, g)| g.size)
            .sum()
    }

    /// Removes the grants that none of their tenant's deployments runs and
    /// that were uploaded more than `grace` ago (only `tenant`'s, when
    /// given), then the components left with no grant that no deployment
    /// runs. See the module's doc.
    pub fn collect_artifacts(
        &self,
        tenant: Option<&str>,
        grace: Duration,
    ) -> Result<Collected, FleetError> {
        let deployments = self.deployments.all();
        let runs = |tenant: Option<&str>, sha: &str| {
            deployments.iter().any(|d| {
                d.desired != Desired::Deleted
                    && d.artifact == sha
                    && tenant.is_none_or(|t| d.tenant == t)
            })
        };
        let before = now_ms() - i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let prefix = tenant.map(|t| format!("{t}/")).unwrap_or_default();
        let mut done = Collected::default();
        let mut orphans = BTreeMap::new();
        for (key, grant) in self.grants.entries_with_prefix(&prefix) {
            let Some((owner, sha)) = key.split_once('/') else {
                continue;
            };
            if grant.uploaded_ms >= before || runs(Some(owner), sha) {
                continue;
            }
            let offset = self.publish(GRANTS_TOPIC, &key, None)?;
            self.grants
                .wait_past(offset, super::control::PUBLISH_TIMEOUT);
            let _ = std::fs::remove_file(self.cached_grant(sha, owner));
            done.grants += 1;
            orphans.insert(sha.to_owned(), grant);
            tracing::info!(tenant = owner, artifact = sha, "collected an unused upload");
        }
        // Every component with no grant left and no deployment running it
        // (this collection's, and any an earlier one left half done).
        let granted = self.granted_components();
        for (sha, grant) in orphans {
            if granted.contains(&sha) || runs(None, &sha) {
                continue;
            }
            self.publish(ARTIFACTS_TOPIC, &format!("{sha}/index"), None)?;
            for i in 0..grant.chunks {
                self.publish(ARTIFACTS_TOPIC, &chunk_key(&sha, i), None)?;
            }
            let _ = std::fs::remove_file(self.cached_artifact(&sha));
            done.components += 1;
            done.bytes += grant.size;
            tracing::info!(artifact = %sha, bytes = grant.size, "collected a component no deployment runs");
        }
        Ok(done)
    }

    /// The components some tenant holds a grant of.
    fn granted_components(&self) -> std::collections::HashSet<String> {
        self.grants
            .entries_with_prefix("")
            .into_iter()
            .filter_map(|(k, _)| k.split_once('/').map(|(_, sha)| sha.to_owned()))
            .collect()
    }

    /// Removes from this host's cache the components that no grant and no
    /// deployment names any more (another host collected them).
    pub fn prune_cache(&self) {
        let Ok(dir) = std::fs::read_dir(&self.artifact_cache) else {
            return;
        };
        let deployments = self.deployments.all();
        let granted = self.granted_components();
        for entry in dir.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(sha) = name.strip_suffix(".wasm") else {
                continue;
            };
            if !granted.contains(sha) && !deployments.iter().any(|d| d.artifact == sha) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Stores a component in the artifacts topic and in the local cache;
    /// returns its sha256. An index record `<sha>/index` gives the chunk
    /// count; the chunks are `<sha>/<i>`.
    pub fn put_artifact(&self, tenant: &str, bytes: &[u8]) -> Result<String, FleetError> {
        let sha = hex::encode(Sha256::digest(bytes));
        let chunks: Vec<&[u8]> = if bytes.is_empty() {
            vec![bytes]
        } else {
            bytes.chunks(ARTIFACT_CHUNK).collect()
        };
        let count = chunks.len();
        let index_record = serde_json::json!({ "chunks": count, "size": bytes.len() }).to_string();
        self.publish(
            ARTIFACTS_TOPIC,
            &format!("{sha}/index"),
            Some(index_record.as_bytes()),
        )?;
        for (i, chunk) in chunks.iter().enumerate() {
            self.publish(ARTIFACTS_TOPIC, &chunk_key(&sha, i), Some(chunk))?;
        }
        let grant = Grant {
            size: bytes.len() as u64,
            chunks: count,
            uploaded_ms: now_ms(),
        };
        // A record of numbers always encodes.
        let json = serde_json::to_vec(&grant).unwrap_or_default();
        let offset = self.publish(GRANTS_TOPIC, &tenant_grant_key(tenant, &sha), Some(&json))?;
        if !self
            .grants
            .wait_past(offset, super::control::PUBLISH_TIMEOUT)
        {
            return Err(FleetError::Unavailable(
                "the grants topic did not read back its own write within 30 s".to_owned(),
            ));
        }
        write_atomically(&self.cached_artifact(&sha), bytes)?;
        Ok(sha)
    }

    /// A component by sha256: from the local cache, else read back from the
    /// artifacts topic (and cached).
    pub fn artifact(&self, sha256: &str) -> Result<Vec<u8>, FleetError> {
        let path = self.cached_artifact(sha256);
        if let Ok(bytes) = std::fs::read(&path)
            && hex::encode(Sha256::digest(&bytes)) == sha256
        {
            return Ok(bytes);
        }
        let mut chunks: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut count: Option<usize> = None;
        let index_key = format!("{sha256}/index");
        self.scan(|m| {
            let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
            if key == Some(index_key.as_str()) {
                count = m
                    .payload()
                    .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
                    .and_then(|v| v["chunks"].as_u64())
                    .map(|n| n as usize);
            } else if let Some((sha, i)) = key.and_then(parse_chunk_key)
                && sha == sha256
            {
                chunks.insert(i, m.payload().unwrap_or_default().to_vec());
            }
            ControlFlow::Continue(())
        })?;
        let missing = |problem: String| FleetError::Artifact {
            sha256: sha256.to_owned(),
            problem,
        };
        let Some(count) = count else {
            return Err(missing("is not".to_owned()));
        };
        let mut bytes = Vec::new();
        for i in 0..count {
            let chunk = chunks
                .remove(&i)
                .ok_or_else(|| missing(format!("has chunk {i} of {count} missing")))?;
            bytes.extend_from_slice(&chunk);
        }
        if hex::encode(Sha256::digest(&bytes)) != sha256 {
            return Err(missing("has chunks that do not add up to it".to_owned()));
        }
        write_atomically(&path, &bytes)?;
        Ok(bytes)
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), FleetError> {
    // One temporary name per write: two uploads of one component at once
    // (same path) each rename their own file (with one name per process,
    // one rename took the other's file away: "No such file or directory").
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| FleetError::Io {
            what: format!("cannot write {}", path.display()),
            source,
        })
}
