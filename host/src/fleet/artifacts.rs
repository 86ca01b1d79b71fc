//! Components in the artifacts topic: content-addressed (sha256), chunked
//! to fit Kafka's record limit, and cached on each host's disk. Each upload
//! also writes a grant (`<sha>/grant/<tenant>`): a tenant deploys only
//! components it uploaded itself, not another tenant's by its digest.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::Message;
use sha2::{Digest, Sha256};

use super::FleetError;
use super::control::ControlPlane;
use super::registry::{ARTIFACT_CHUNK, ARTIFACTS_TOPIC, chunk_key, grant_key, parse_chunk_key};
use crate::kafka;

impl ControlPlane {
    fn cached_artifact(&self, sha256: &str) -> PathBuf {
        self.artifact_cache.join(format!("{sha256}.wasm"))
    }

    /// Reads the artifacts topic from its start to its end as of now,
    /// handing each record to `visit` until it breaks.
    fn scan(
        &self,
        mut visit: impl FnMut(&rdkafka::message::BorrowedMessage<'_>) -> ControlFlow<()>,
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
        self.publish(ARTIFACTS_TOPIC, &grant_key(&sha, tenant), Some(b"{}"))?;
        write_atomically(&self.cached_artifact(&sha), bytes)?;
        write_atomically(&self.cached_grant(&sha, tenant), b"")?;
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
