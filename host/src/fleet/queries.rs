//! Interactive queries, the fleet's part: which deployment and store a
//! tenant may read, which host owns each of its partitions now (from the
//! hosts' statuses, and their addresses from their heartbeats), this
//! host's reads of its own tasks' stores (`stream/queries.rs`), and the
//! changelog scan that answered every query before. The admin API routes
//! a query's partitions to their owners (`admin/queries.rs`).

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use super::registry::{DeploymentKind, heartbeat_key, now_ms};
use super::{Fleet, FleetError, Tenant};
use crate::api::{
    LocalPartition, LocalReadAnswer, LocalReadRequest, QueryAnswer, QueryEntry, QueryParams,
    QueryValue, WireRead,
};
use crate::stream::queries::{MAX_ENTRIES, PartitionRead, Read, decode_window};
use crate::stream::{self, changelog};

/// Entries a range, prefix or window query answers unless it says
/// (`limit`; at most [`MAX_ENTRIES`]).
pub const DEFAULT_LIMIT: usize = 1_000;

/// A status older than this does not say who owns a partition (its host
/// is likely gone; `list` calls such a status stale too).
const OWNER_STATUS_MS: i64 = 10_000;

/// What a query of one store needs before it asks the owners.
#[derive(Debug, Clone)]
pub struct QueryPlan {
    /// The deployment's application id (its tasks' registry key).
    pub app: String,
    /// Its input partitions: one task, and one store partition, each.
    pub partitions: i32,
    /// This host's id.
    pub me: String,
    /// Whether the store is a window store (read by key and time range).
    pub window_store: bool,
}

/// A host that owns (or hibernates) partitions of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Peer {
    /// Its id.
    pub host: String,
    /// Where its admin API answers (empty: its heartbeat does not say; a
    /// host that predates routed queries).
    pub api: String,
}

/// Who holds a deployment's partitions, as the hosts last said.
#[derive(Debug, Clone, Default)]
pub struct Owners {
    /// Per partition, the host whose workers own its task.
    pub owners: BTreeMap<i32, Peer>,
    /// Hosts where the deployment hibernates (they hold no task until
    /// woken).
    pub hibernating: Vec<Peer>,
}

impl Fleet {
    /// Sets where this host's admin API answers other hosts (published in
    /// its heartbeat).
    pub fn set_api_url(&self, url: String) {
        *self.api_url.write().unwrap_or_else(|e| e.into_inner()) = url;
    }

    /// Where this host's admin API answers other hosts.
    pub fn api_url(&self) -> String {
        self.api_url
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The manifest of `tenant`'s deployment `name` if it is a processor
    /// with a store `store`: what a tenant may read.
    fn readable(
        &self,
        tenant: &Tenant,
        name: &str,
        store: &str,
    ) -> Result<std::sync::Arc<crate::manifest::Manifest>, FleetError> {
        let r = self.own_record(tenant, name)?;
        if r.kind == DeploymentKind::Sink {
            return Err(FleetError::Invalid(format!(
                "{name:?} is a sink: it has no stores (its rows are in its database)"
            )));
        }
        let manifest = self.manifest(&r).map_err(FleetError::Manifest)?;
        if !manifest.stores.iter().any(|s| s == store) {
            return Err(FleetError::NoStore {
                name: name.to_owned(),
                store: store.to_owned(),
                stores: manifest.stores.join(", "),
            });
        }
        Ok(manifest)
    }

    /// Checks that `tenant` may read `store` of its deployment `name`, and
    /// what the query needs.
    pub fn query_plan(
        &self,
        tenant: &Tenant,
        name: &str,
        store: &str,
    ) -> Result<QueryPlan, FleetError> {
        let manifest = self.readable(tenant, name, store)?;
        let probe = self.control.metadata()?;
        let partitions = stream::InputPartitions::new(&probe)
            .of_existing(&manifest)?
            .ok_or_else(|| {
                FleetError::Unavailable(format!(
                    "the input topic of {name:?} does not exist (deleted?): its stores have no \
                     partitions to read"
                ))
            })?;
        Ok(QueryPlan {
            app: manifest.application_id(),
            partitions,
            me: self.host_id.clone(),
            window_store: manifest.window_stores.iter().any(|(s, _)| s == store),
        })
    }

    /// Who owns each partition of `tenant`'s deployment `name` now: the
    /// hosts' statuses of the last 10 s that say `running`, and where each
    /// host answers (its heartbeat).
    pub fn owners(&self, tenant: &Tenant, name: &str) -> Owners {
        let now = now_ms();
        let api = |host: &str| {
            self.control
                .statuses
                .get(&heartbeat_key(host))
                .map(|h| h.api)
                .unwrap_or_default()
        };
        let mut owners = Owners::default();
        let fresh = self
            .control
            .statuses
            .with_prefix(&format!("{}/{name}/", tenant.name))
            .into_iter()
            .filter(|s| s.name == name && now - s.updated_ms <= OWNER_STATUS_MS);
        for s in fresh {
            let peer = Peer {
                api: api(&s.host),
                host: s.host.clone(),
            };
            if s.hibernating {
                owners.hibernating.push(peer);
                continue;
            }
            if s.state != "running" {
                continue;
            }
            for p in &s.partitions {
                owners.owners.insert(*p, peer.clone());
            }
        }
        owners
    }

    /// Reads `store` of `tenant`'s deployment `name` in `partitions` from
    /// this host's tasks (a deployment hibernating here is woken).
    pub fn read_local(
        &self,
        tenant: &Tenant,
        name: &str,
        store: &str,
        partitions: &[i32],
        read: &Read,
    ) -> Result<Vec<(i32, PartitionRead)>, FleetError> {
        let manifest = self.readable(tenant, name, store)?;
        let Some(stores) = &self.options.queries else {
            return Ok(partitions
                .iter()
                .map(|&p| (p, PartitionRead::NotHere))
                .collect());
        };
        stores
            .read(&manifest.application_id(), store, partitions, read)
            .map_err(|e| FleetError::Unavailable(format!("reading the local store: {e}")))
    }

    /// The committed value of `key` in a deployment's store, from a scan of
    /// the store's changelog topic (every partition, from its start): what
    /// every query did before the owners' stores answered. Its cost grows
    /// with the store; kept for comparison (`source=changelog`) and for a
    /// deployment no host runs.
    pub fn query_changelog(
        &self,
        tenant: &Tenant,
        name: &str,
        store: &str,
        key: &str,
    ) -> Result<QueryAnswer, FleetError> {
        let manifest = self.readable(tenant, name, store)?;
        let topic = stream::changelog_topic(&manifest, store);
        let found: Vec<(i32, Vec<u8>)> =
            changelog::query(self.control.connection(), &topic, key.as_bytes())?;
        if found.is_empty() {
            return Err(FleetError::NoValue {
                store: store.to_owned(),
                key: key.to_owned(),
            });
        }
        Ok(QueryAnswer {
            store: store.to_owned(),
            key: key.to_owned(),
            values: found
                .into_iter()
                .map(|(partition, v)| query_value(partition, v))
                .collect(),
            entries: Vec::new(),
            truncated: false,
            source: "changelog".to_owned(),
            hosts: Vec::new(),
        })
    }
}

/// The read a query's parameters ask for, its keys in base64 (as hosts
/// ask each other), each partition's limit one past the query's: a merged
/// answer with more than the limit was cut short.
pub fn wire_read(p: &QueryParams) -> Result<WireRead, FleetError> {
    let b64 = |s: &str| STANDARD.encode(s.as_bytes());
    let limit = p.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_ENTRIES {
        return Err(FleetError::Invalid(format!(
            "limit {limit}: a query answers 1 to {MAX_ENTRIES} entries"
        )));
    }
    let ranged = p.from.is_some() || p.to.is_some();
    let windows = p.window_from_ms.is_some() || p.window_to_ms.is_some();
    let one_of = "give one of: a key (key=), a prefix (prefix=), a key range (from=, to=), or a \
                  window store's key and time range (key=, window_from_ms=, window_to_ms=)";
    match (p.prefix.as_deref(), ranged, windows) {
        (Some(prefix), false, false) if p.key.is_empty() => Ok(WireRead::Prefix {
            prefix: b64(prefix),
            limit: limit + 1,
        }),
        (None, true, false) if p.key.is_empty() => Ok(WireRead::Range {
            from: p.from.as_deref().map(b64),
            to: p.to.as_deref().map(b64),
            limit: limit + 1,
        }),
        (None, false, true) if !p.key.is_empty() => Ok(WireRead::Windows {
            key: b64(&p.key),
            from_ms: p.window_from_ms.unwrap_or(i64::MIN),
            to_ms: p.window_to_ms.unwrap_or(i64::MAX),
            limit: limit + 1,
        }),
        (None, false, false) if !p.key.is_empty() => Ok(WireRead::Key { key: b64(&p.key) }),
        _ => Err(FleetError::Invalid(one_of.to_owned())),
    }
}

fn unbase64(what: &str, s: &str) -> Result<Vec<u8>, FleetError> {
    STANDARD
        .decode(s)
        .map_err(|e| FleetError::Invalid(format!("{what} is not base64: {e}")))
}

/// A wire read as the local stores take it.
fn local_read(w: &WireRead) -> Result<Read, FleetError> {
    let opt = |what: &str, s: &Option<String>| s.as_deref().map(|s| unbase64(what, s)).transpose();
    Ok(match w {
        WireRead::Key { key } => Read::Key(unbase64("the key", key)?),
        WireRead::Range { from, to, limit } => Read::Range {
            from: opt("from", from)?,
            to: opt("to", to)?,
            limit: *limit,
        },
        WireRead::Prefix { prefix, limit } => Read::Prefix {
            prefix: unbase64("the prefix", prefix)?,
            limit: *limit,
        },
        WireRead::Windows {
            key,
            from_ms,
            to_ms,
            limit,
        } => Read::Windows {
            key: unbase64("the key", key)?,
            from_ms: *from_ms,
            to_ms: *to_ms,
            limit: *limit,
        },
    })
}

impl Fleet {
    /// Answers another host's [`LocalReadRequest`] from this host's tasks.
    pub fn read_local_wire(
        &self,
        tenant: &Tenant,
        name: &str,
        store: &str,
        req: &LocalReadRequest,
    ) -> Result<LocalReadAnswer, FleetError> {
        let read = local_read(&req.read)?;
        let answers = self.read_local(tenant, name, store, &req.partitions, &read)?;
        let partitions = answers
            .into_iter()
            .map(|(partition, a)| {
                let (state, entries) = match a {
                    PartitionRead::Entries(e) => (
                        "entries",
                        e.into_iter()
                            .map(|(k, v)| (STANDARD.encode(k), STANDARD.encode(v)))
                            .collect(),
                    ),
                    PartitionRead::NotHere => ("not_here", Vec::new()),
                    PartitionRead::Restoring => ("restoring", Vec::new()),
                    PartitionRead::Waking => ("waking", Vec::new()),
                };
                LocalPartition {
                    partition,
                    state: state.to_owned(),
                    entries,
                }
            })
            .collect();
        Ok(LocalReadAnswer {
            host: self.host_id.clone(),
            partitions,
        })
    }
}

/// The answer to a query from every partition's entries (base64, as hosts
/// answered them) and the hosts that answered.
pub fn merge_answer(
    store: &str,
    params: &QueryParams,
    read: &WireRead,
    found: BTreeMap<i32, Vec<(String, String)>>,
    hosts: Vec<String>,
) -> Result<QueryAnswer, FleetError> {
    let mut answer = QueryAnswer {
        store: store.to_owned(),
        key: params.key.clone(),
        values: Vec::new(),
        entries: Vec::new(),
        truncated: false,
        source: "stores".to_owned(),
        hosts,
    };
    let mut entries = Vec::new();
    for (partition, found) in found {
        for (k, v) in found {
            entries.push((partition, unbase64("a key", &k)?, unbase64("a value", &v)?));
        }
    }
    let limit = params.limit.unwrap_or(DEFAULT_LIMIT);
    match read {
        WireRead::Key { .. } => {
            answer.values = entries
                .into_iter()
                .map(|(p, _, v)| query_value(p, v))
                .collect();
            if answer.values.is_empty() {
                return Err(FleetError::NoValue {
                    store: store.to_owned(),
                    key: params.key.clone(),
                });
            }
        }
        WireRead::Range { .. } | WireRead::Prefix { .. } => {
            entries.sort_by(|a, b| (&a.1, a.0).cmp(&(&b.1, b.0)));
            answer.truncated = entries.len() > limit;
            answer.entries = entries
                .into_iter()
                .take(limit)
                .map(|(p, k, v)| query_entry(p, k, None, v))
                .collect();
        }
        WireRead::Windows { .. } => {
            let mut windows = entries
                .into_iter()
                .filter_map(|(p, k, v)| decode_window(&k).map(|w| (w.start, p, w.key, v)))
                .collect::<Vec<_>>();
            windows.sort_by_key(|w| (w.0, w.1));
            answer.truncated = windows.len() > limit;
            answer.entries = windows
                .into_iter()
                .take(limit)
                .map(|(start, p, k, v)| query_entry(p, k, Some(start), v))
                .collect();
        }
    }
    Ok(answer)
}

fn text_or_base64(bytes: Vec<u8>) -> (Option<String>, Option<String>) {
    match String::from_utf8(bytes) {
        Ok(text) => (Some(text), None),
        Err(e) => (None, Some(STANDARD.encode(e.as_bytes()))),
    }
}

fn query_entry(
    partition: i32,
    key: Vec<u8>,
    window_start_ms: Option<i64>,
    value: Vec<u8>,
) -> QueryEntry {
    let (key, key_base64) = text_or_base64(key);
    let (value, value_base64) = text_or_base64(value);
    QueryEntry {
        partition,
        key,
        key_base64,
        window_start_ms,
        value,
        value_base64,
    }
}

/// A value as answered: text when it is UTF-8, else base64.
pub fn query_value(partition: i32, v: Vec<u8>) -> QueryValue {
    let (value, value_base64) = text_or_base64(v);
    QueryValue {
        partition,
        value,
        value_base64,
    }
}
