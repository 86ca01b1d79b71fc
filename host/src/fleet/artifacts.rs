//! Components in the artifacts topic: content-addressed (sha256), chunked
//! to fit Kafka's record limit, and cached on each host's disk.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rdkafka::Message;
use sha2::{Digest, Sha256};

use super::FleetError;
use super::control::ControlPlane;
use super::registry::{ARTIFACT_CHUNK, ARTIFACTS_TOPIC, chunk_key, parse_chunk_key};
use crate::kafka;

impl ControlPlane {
    fn cached_artifact(&self, sha256: &str) -> PathBuf {
        self.artifact_cache.join(format!("{sha256}.wasm"))
    }

    /// Stores a component in the artifacts topic and in the local cache;
    /// returns its sha256. An index record `<sha>/index` gives the chunk
    /// count; the chunks are `<sha>/<i>`.
    pub fn put_artifact(&self, bytes: &[u8]) -> Result<String, FleetError> {
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
        let (consumer, (_, end)) = self.read_from(ARTIFACTS_TOPIC, |_, _| None)?;
        let mut chunks: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut count: Option<usize> = None;
        let index_key = format!("{sha256}/index");
        if end > 0 {
            kafka::read_to_end(
                &consumer,
                1,
                ARTIFACTS_TOPIC,
                Instant::now() + Duration::from_secs(120),
                |m| {
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
                    if m.offset() + 1 >= end {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            )?;
        }
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
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| FleetError::Io {
            what: format!("cannot write {}", path.display()),
            source,
        })
}
