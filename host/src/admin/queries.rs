//! Routed interactive queries: `GET /v1/deployments/{name}/state/{store}`
//! answered from the local stores of the hosts that own the store's
//! partitions, as Kafka Streams' interactive queries are.
//!
//! The host that receives a query asks, for every partition of the store,
//! the host that owns its task now (the hosts' statuses say which;
//! their heartbeats say where they answer): itself directly, the others
//! with `POST /v1/internal/deployments/{name}/state/{store}` and the
//! caller's own token, so that each host checks the tenant for itself. A
//! partition whose owner is restoring, moving (a rebalance) or asleep (a
//! hibernating deployment, woken by the ask) is asked again every
//! [`RETRY_EVERY`] for up to [`QUERY_WAIT`]; then the query is answered 503
//! with what each partition waits for, and may be retried. Each answer is
//! the committed layer of the owner's store, as the changelog scan that
//! answered before saw it (`?source=changelog` still does).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderValue, StatusCode};

use super::{ApiError, ApiResult, TenantWork};
use crate::api::{
    ErrorBody, LocalReadAnswer, LocalReadRequest, QueryAnswer, QueryParams, WireRead,
};
use crate::fleet::{self, Fleet, FleetError, Peer, QueryPlan, Tenant};

/// How long a query waits for partitions without an owner that answers (a
/// rebalance, a restore, a wake from hibernation) before it is answered
/// 503.
pub const QUERY_WAIT: Duration = Duration::from_secs(10);
/// How long one host waits for another's answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two rounds of asking the partitions still without an answer.
const RETRY_EVERY: Duration = Duration::from_millis(100);

/// The client one host asks others with.
pub struct Peers {
    client: reqwest::Client,
}

impl Peers {
    /// A client that trusts the system's roots and, for hosts that serve
    /// HTTPS with a private CA, `ca` (PEM).
    pub fn new(ca: Option<&[u8]>) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder().timeout(PEER_TIMEOUT);
        if let Some(pem) = ca {
            for cert in reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| format!("the peer CA is not PEM: {e}"))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(Self {
            client: builder
                .build()
                .map_err(|e| format!("cannot make the peers' HTTP client: {e}"))?,
        })
    }
}

/// Who asks a query, of which store, and through what.
pub(super) struct Asker {
    pub(super) fleet: Arc<Fleet>,
    pub(super) work: Arc<TenantWork>,
    pub(super) peers: Arc<Peers>,
    pub(super) tenant: Tenant,
    /// The caller's `Authorization`, passed on to the other hosts.
    pub(super) auth: Option<HeaderValue>,
    pub(super) name: String,
    pub(super) store: String,
}

/// A query under way: who asks, what the store is, and what is read.
struct Query {
    who: Asker,
    plan: QueryPlan,
    read: WireRead,
}

/// Answers a query from the owners' stores (or, with
/// `source=changelog`, from a scan of the changelog).
pub(super) async fn answer(who: Asker, params: QueryParams) -> ApiResult<QueryAnswer> {
    let Asker {
        fleet,
        work,
        tenant,
        name,
        store,
        ..
    } = &who;
    match params.source.as_deref() {
        None | Some("stores") => {}
        Some("changelog") => {
            let key = params.key.clone();
            if key.is_empty() || params.prefix.is_some() || params.from.is_some() {
                return Err(FleetError::Invalid(
                    "source=changelog answers a key only (key=)".to_owned(),
                )
                .into());
            }
            let (f, t, n, s) = (fleet.clone(), tenant.clone(), name.clone(), store.clone());
            return work
                .run(&tenant.name, move || f.query_changelog(&t, &n, &s, &key))
                .await;
        }
        Some(other) => {
            return Err(FleetError::Invalid(format!(
                "source={other}: a query reads the owners' stores (no source) or the \
                 changelog (source=changelog)"
            ))
            .into());
        }
    }
    let read = fleet::wire_read(&params)?;
    let plan = {
        let (f, t, n, s) = (fleet.clone(), tenant.clone(), name.clone(), store.clone());
        work.run(&tenant.name, move || f.query_plan(&t, &n, &s))
            .await?
    };
    match (plan.window_store, matches!(read, WireRead::Windows { .. })) {
        (true, false) => {
            return Err(FleetError::Invalid(format!(
                "{store:?} is a window store: query a key's windows (key= with \
                 window_from_ms= and window_to_ms=, or --window-from-ms/--window-to-ms)"
            ))
            .into());
        }
        (false, true) => {
            return Err(FleetError::Invalid(format!(
                "{store:?} is a key-value store: window_from_ms and window_to_ms are for \
                 window stores"
            ))
            .into());
        }
        _ => {}
    }
    let q = Query { who, plan, read };
    let (found, hosts) = q.gather().await?;
    Ok(fleet::merge_answer(
        &q.who.store,
        &params,
        &q.read,
        found,
        hosts,
    )?)
}

impl Query {
    /// Every partition's entries (base64), asking the owners until each
    /// answered or [`QUERY_WAIT`] passed; and the hosts that answered.
    async fn gather(&self) -> ApiResult<(BTreeMap<i32, Vec<(String, String)>>, Vec<String>)> {
        let deadline = Instant::now() + QUERY_WAIT;
        let mut pending: BTreeSet<i32> = (0..self.plan.partitions).collect();
        let mut found = BTreeMap::new();
        let mut hosts = BTreeSet::new();
        let mut why: BTreeMap<i32, String> = BTreeMap::new();
        loop {
            let owners = self.who.fleet.owners(&self.who.tenant, &self.who.name);
            // By host: the peer, and the partitions asked of it.
            let mut asks: BTreeMap<String, (Peer, Vec<i32>)> = BTreeMap::new();
            let mut ask_of = |peer: &Peer, p: i32| {
                let (_, asked) = asks
                    .entry(peer.host.clone())
                    .or_insert_with(|| (peer.clone(), Vec::new()));
                if !asked.contains(&p) {
                    asked.push(p);
                }
            };
            let mut unowned = Vec::new();
            for &p in &pending {
                match owners.owners.get(&p) {
                    Some(peer) => ask_of(peer, p),
                    None => unowned.push(p),
                }
            }
            for &p in &unowned {
                why.insert(
                    p,
                    if owners.hibernating.is_empty() {
                        "no host owns it now (a rebalance, or the deployment is starting)"
                            .to_owned()
                    } else {
                        "the deployment hibernates: waking it".to_owned()
                    },
                );
            }
            // Asking a host where the deployment hibernates wakes it. This
            // host's own tasks are asked too: it may own a partition its
            // status does not say yet (it publishes every 2 s).
            let me = Peer {
                host: self.plan.me.clone(),
                api: String::new(),
            };
            for peer in owners.hibernating.iter().chain([&me]) {
                for &p in &unowned {
                    ask_of(peer, p);
                }
            }
            let calls = asks.into_values().map(|(peer, partitions)| async move {
                let answer = self.ask(&peer, partitions.clone()).await;
                (peer, partitions, answer)
            });
            for (peer, partitions, answer) in futures::future::join_all(calls).await {
                let a = match answer {
                    Ok(a) => a,
                    Err(e) => {
                        for p in partitions {
                            why.insert(
                                p,
                                format!("its owner, host {}, did not answer: {e}", peer.host),
                            );
                        }
                        continue;
                    }
                };
                for lp in a.partitions {
                    if !pending.contains(&lp.partition) {
                        continue;
                    }
                    let reason = match lp.state.as_str() {
                        "entries" => {
                            pending.remove(&lp.partition);
                            why.remove(&lp.partition);
                            found.insert(lp.partition, lp.entries);
                            hosts.insert(a.host.clone());
                            continue;
                        }
                        "restoring" => format!("host {} is restoring its stores", a.host),
                        "waking" => format!("waking on host {} (it hibernated)", a.host),
                        // Asked only in case: the reason found above stays.
                        _ if unowned.contains(&lp.partition) => continue,
                        _ => format!("moving: host {} no longer holds it", a.host),
                    };
                    why.insert(lp.partition, reason);
                }
            }
            if pending.is_empty() {
                return Ok((found, hosts.into_iter().collect()));
            }
            if Instant::now() >= deadline {
                let waits: Vec<String> = pending
                    .iter()
                    .map(|p| {
                        format!(
                            "partition {p}: {}",
                            why.get(p).map_or("no answer", String::as_str)
                        )
                    })
                    .collect();
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "store {:?} of {:?} did not answer in full within {} s ({}): retry \
                         shortly",
                        self.who.store,
                        self.who.name,
                        QUERY_WAIT.as_secs(),
                        waits.join("; ")
                    ),
                ));
            }
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }

    /// One host's answer for `partitions`: this host's own stores, or
    /// another host's over HTTP with the caller's token.
    async fn ask(&self, peer: &Peer, partitions: Vec<i32>) -> Result<LocalReadAnswer, String> {
        let req = LocalReadRequest {
            partitions,
            read: self.read.clone(),
        };
        if peer.host == self.plan.me {
            let (f, t, n, s) = (
                self.who.fleet.clone(),
                self.who.tenant.clone(),
                self.who.name.clone(),
                self.who.store.clone(),
            );
            return self
                .who
                .work
                .run(&self.who.tenant.name, move || {
                    f.read_local_wire(&t, &n, &s, &req)
                })
                .await
                .map_err(|e| e.message);
        }
        if peer.api.is_empty() {
            return Err(
                "its heartbeat does not say where it answers (a host older than routed queries: \
                 upgrade it, or query with source=changelog)"
                    .to_owned(),
            );
        }
        let url = format!(
            "{}/v1/internal/deployments/{}/state/{}",
            peer.api.trim_end_matches('/'),
            self.who.name,
            self.who.store
        );
        let mut request = self.who.peers.client.post(&url).json(&req);
        if let Some(auth) = &self.who.auth {
            request = request.header(reqwest::header::AUTHORIZATION, auth.as_bytes());
        }
        let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            let error = response
                .json::<ErrorBody>()
                .await
                .map_or_else(|_| String::new(), |b| b.error);
            return Err(format!("{url} answered {status}: {error}"));
        }
        response
            .json::<LocalReadAnswer>()
            .await
            .map_err(|e| format!("{url}: an answer that does not parse: {e}"))
    }
}
