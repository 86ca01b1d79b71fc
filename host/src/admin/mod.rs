//! The host's HTTP admin API (axum) and its Prometheus endpoint: only
//! authentication, (de)serialisation and the mapping of a [`FleetError`] to
//! a status. The work is the fleet's ([`Fleet`]'s operations in
//! `fleet/service.rs`); the request and answer types are in [`crate::api`],
//! which the CLI's client shares.
//!
//! Every `/v1` call carries `Authorization: Bearer <tenant token>`. A bad
//! or missing token gets 401; a deployment of another tenant is
//! indistinguishable from one that does not exist (404). Tokens are never
//! logged. The routes are listed in [`crate::api`]; `GET /metrics` answers
//! Prometheus text: the caller tenant's series (all with the operator
//! token).
//!
//! The API is served over HTTPS when the host has a certificate
//! ([`ServerTls`], `tls.rs`), plain HTTP otherwise. The tenants a request
//! is checked against are the ones in force when it arrives
//! ([`Fleet::tenants`]: `tenants.toml` is re-read when it changes).
//!
//! A request's token is checked before its body is read: a client without
//! a valid token never makes the host buffer a byte of it (before, eight
//! unauthenticated 120 MB uploads took a host from 55 MB to 874 MB). Bodies
//! are then read up to their limit (413 naming it), and at most
//! [`UPLOADS_PER_TENANT`] uploads of one tenant are read at a time.
//!
//! Operations block (Kafka, wasmtime) and run on the blocking pool, each
//! tenant's on at most [`OPERATIONS_PER_TENANT`] of its threads, in a
//! queue of the tenant's own ([`WAITING_PER_TENANT`] long; 429 past it):
//! one tenant's burst never queues another tenant's call. Log reads have
//! slots of their own ([`LOG_READS_PER_TENANT`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::api::{
    DeleteParams, DeployRequest, DeploymentList, DeploymentSummary, ErrorBody, Health,
    LocalReadRequest, LogParams, QueryParams, ReplayRequest, SinkDeployRequest, UsageParams,
};
use crate::fleet::Deployed;
use crate::fleet::registry::{Desired, MAX_ARTIFACT_BYTES, MAX_MANIFEST_BYTES};
use crate::fleet::tenancy::Principal;
use crate::fleet::{Fleet, FleetError, Tenant};
use crate::kafka::KafkaError;
use crate::schema::{RegistryError, SetupError};
use crate::types::error_chain;

mod queries;
mod tls;
pub use queries::{Peers, QUERY_WAIT};
pub use tls::{ServerTls, TlsError, TlsFiles};

/// An error answer: a status and a message the CLI shows verbatim.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
}

/// The status a fleet error deserves: the caller's fault (403, 404, 422) or
/// the fleet's (500, 503).
pub fn status_of(e: &FleetError) -> StatusCode {
    match e {
        FleetError::NoDeployment { .. }
        | FleetError::NoStore { .. }
        | FleetError::NoValue { .. } => StatusCode::NOT_FOUND,
        FleetError::Refused(_) => StatusCode::FORBIDDEN,
        FleetError::NameConflict { .. } | FleetError::DuplicateHost { .. } => StatusCode::CONFLICT,
        FleetError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        FleetError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
        FleetError::Manifest(_)
        | FleetError::Component(_)
        | FleetError::Invalid(_)
        | FleetError::Artifact { .. }
        | FleetError::Kafka(KafkaError::Topic { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
        FleetError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        FleetError::Formats(e) => match e {
            SetupError::Registry {
                source: RegistryError::Incompatible { .. },
                ..
            } => StatusCode::CONFLICT,
            SetupError::Registry {
                source: RegistryError::Unavailable { .. } | RegistryError::Config(_),
                ..
            } => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        },
        FleetError::Kafka(_)
        | FleetError::Stream(_)
        | FleetError::Sink(_)
        | FleetError::Unavailable(_)
        | FleetError::Draining { .. } => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl From<FleetError> for ApiError {
    fn from(e: FleetError) -> Self {
        Self::new(status_of(&e), error_chain(&e))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
        };
        (self.status, axum::Json(body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Runs a fleet operation on the blocking pool (Kafka and wasmtime calls
/// block). Tenants' operations go through [`TenantWork`] instead.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, FleetError> + Send + 'static,
) -> ApiResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("handler failed: {e}"),
        )),
    }
}

/// Blocking operations (upload checks, deploy, sink deploy, pause, resume,
/// delete, query) one tenant may have running at once on a host.
pub const OPERATIONS_PER_TENANT: usize = 8;
/// A tenant's operations past those that may wait for one of its slots;
/// any more are answered 429 at once.
pub const WAITING_PER_TENANT: usize = 32;
/// How long an operation waits for one of its tenant's slots before 429.
const OPERATION_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The blocking pool, shared fairly: each tenant's operations run on at
/// most [`OPERATIONS_PER_TENANT`] of its threads, and wait for one of
/// those in a queue of the tenant's own (before, they queued in the pool's
/// one queue, so one burst of 800 refused sink deploys from one tenant made
/// another's `pause` take 142.5 s instead of 6 ms). A slot is held until
/// the operation ends, even when its client went away.
struct TenantWork {
    /// Running, per tenant.
    running: TenantSlots,
    /// Running or waiting, per tenant.
    admitted: TenantSlots,
    /// How long one waits for a running slot.
    wait: std::time::Duration,
}

impl Default for TenantWork {
    fn default() -> Self {
        Self::new(OPERATIONS_PER_TENANT, WAITING_PER_TENANT, OPERATION_WAIT)
    }
}

impl TenantWork {
    fn new(running: usize, waiting: usize, wait: std::time::Duration) -> Self {
        Self {
            running: TenantSlots::new(running),
            admitted: TenantSlots::new(running + waiting),
            wait,
        }
    }

    /// Runs `tenant`'s operation `f` on the blocking pool once one of the
    /// tenant's slots is free; 429 at once when the tenant already has as
    /// many operations running and waiting as it may, or after waiting
    /// [`OPERATION_WAIT`] for a slot.
    async fn run<T: Send + 'static>(
        &self,
        tenant: &str,
        f: impl FnOnce() -> Result<T, FleetError> + Send + 'static,
    ) -> ApiResult<T> {
        let (running, queued) = (self.running.slots, self.admitted.slots - self.running.slots);
        let place = self.admitted.of(tenant).try_acquire_owned().map_err(|_| {
            tracing::debug!(%tenant, "operation refused: its slots and queue are full");
            ApiError::from(FleetError::Busy(format!(
                "too many requests in flight for tenant {tenant:?} on this host ({running} \
                     running, {queued} waiting): wait for them to finish, then retry"
            )))
        })?;
        let slot =
            match tokio::time::timeout(self.wait, self.running.of(tenant).acquire_owned()).await {
                Ok(Ok(slot)) => slot,
                _ => {
                    return Err(ApiError::from(FleetError::Busy(format!(
                        "tenant {tenant:?} has had {running} operations running on this host for \
                     {} s: wait for them to finish, then retry",
                        self.wait.as_secs()
                    ))));
                }
            };
        blocking(move || {
            let _held = (slot, place);
            f()
        })
        .await
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

fn unauthorized() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or unknown token: pass your tenant token with --token or ONCEFLOW_TOKEN",
    )
}

/// The calling tenant (the operator token is not a tenant).
fn tenant_of(fleet: &Fleet, headers: &HeaderMap) -> ApiResult<Tenant> {
    let tenants = fleet.tenants();
    match bearer(headers).and_then(|t| tenants.authenticate(t)) {
        Some(Principal::Tenant(t)) => Ok(t.clone()),
        Some(Principal::Operator) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the operator token reads metrics only: use a tenant token",
        )),
        None => Err(unauthorized()),
    }
}

/// The calling tenant's name, or `None` for the operator (who reads every
/// tenant's metrics and usage).
fn tenant_or_operator(fleet: &Fleet, headers: &HeaderMap) -> ApiResult<Option<String>> {
    let tenants = fleet.tenants();
    match bearer(headers).and_then(|t| tenants.authenticate(t)) {
        Some(Principal::Tenant(t)) => Ok(Some(t.name.clone())),
        Some(Principal::Operator) => Ok(None),
        None => Err(unauthorized()),
    }
}

/// Uploads one tenant may have in progress at once on a host.
pub const UPLOADS_PER_TENANT: usize = 2;
/// Largest deploy request body: the manifest and the artifact's digest,
/// JSON-escaped.
const MAX_DEPLOY_BODY: usize = 2 * MAX_MANIFEST_BYTES;

/// How long an upload waits for one of its tenant's slots before 429.
const UPLOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// A fixed number of slots per tenant (one semaphore each, made on first
/// use): what bounds a tenant's uploads and its log reads.
struct TenantSlots {
    per_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
    slots: usize,
}

impl TenantSlots {
    fn new(slots: usize) -> Self {
        Self {
            per_tenant: Mutex::default(),
            slots,
        }
    }

    /// The tenant's semaphore.
    fn of(&self, tenant: &str) -> Arc<Semaphore> {
        let mut map = self.per_tenant.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            map.entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.slots))),
        )
    }
}

/// Upload slots, per tenant: an upload's body is read only once it holds
/// one, so a tenant makes the host buffer at most [`UPLOADS_PER_TENANT`]
/// components at a time; the others wait (their bodies unread).
struct Uploads(TenantSlots);

impl Default for Uploads {
    fn default() -> Self {
        Self(TenantSlots::new(UPLOADS_PER_TENANT))
    }
}

impl Uploads {
    async fn enter(&self, tenant: &str) -> ApiResult<OwnedSemaphorePermit> {
        match tokio::time::timeout(UPLOAD_WAIT, self.0.of(tenant).acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::from(FleetError::Busy(format!(
                "tenant {tenant:?} has had {UPLOADS_PER_TENANT} uploads in progress on this host \
                 for {} s: wait for them to finish, then upload again",
                UPLOAD_WAIT.as_secs()
            )))),
        }
    }
}

/// Log reads (long polls, up to 30 s each) one tenant may have waiting at
/// once on a host.
pub const LOG_READS_PER_TENANT: usize = 8;
/// Log reads waiting at once on a host, all tenants together: well under
/// the blocking pool's 512 threads, so that long polls never starve the
/// calls every tenant needs (before, 520 `logs --follow` of one tenant made
/// another's `pause` take 24.5 s).
pub const LOG_READS_PER_HOST: usize = 128;

/// Log reads in progress, per tenant and in all.
struct LogReads {
    per_tenant: TenantSlots,
    all: Arc<Semaphore>,
}

impl Default for LogReads {
    fn default() -> Self {
        Self {
            per_tenant: TenantSlots::new(LOG_READS_PER_TENANT),
            all: Arc::new(Semaphore::new(LOG_READS_PER_HOST)),
        }
    }
}

impl LogReads {
    /// A slot for one log read, or 429 at once.
    fn enter(&self, tenant: &str) -> ApiResult<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
        let busy = |what: String| ApiError::from(FleetError::Busy(what));
        let own = self.per_tenant.of(tenant).try_acquire_owned().map_err(|_| {
            busy(format!(
                "tenant {tenant:?} already has {LOG_READS_PER_TENANT} log reads waiting on this \
                 host: stop some `logs --follow`, or read without waiting"
            ))
        })?;
        let all = Arc::clone(&self.all).try_acquire_owned().map_err(|_| {
            busy(format!(
                "this host has {LOG_READS_PER_HOST} log reads waiting: try again shortly"
            ))
        })?;
        Ok((own, all))
    }
}

/// How much of a refused body the host still reads (and drops), so that a
/// client that sends it whole gets the 413 instead of a reset connection.
/// Larger bodies are answered at once and the connection is closed.
const DRAIN_REFUSED: u64 = 8 << 20;

/// Reads a request body of at most `limit` bytes, after the caller was
/// authenticated: a declared length over the limit is refused before
/// reading, a body that grows past it as soon as it does.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize, what: &str) -> ApiResult<Bytes> {
    let too_large = |size: u64| {
        ApiError::from(FleetError::TooLarge {
            what: what.to_owned(),
            size,
            limit: limit as u64,
            advice: "the host takes no larger".to_owned(),
        })
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if let Some(size) = declared
        && size > limit as u64
    {
        if size <= limit as u64 + DRAIN_REFUSED {
            drain(&mut stream, size).await;
        }
        return Err(too_large(size));
    }
    let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(1 << 20) as usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("reading {what}: {e}")))?;
        if buf.len() + chunk.len() > limit {
            let seen = (buf.len() + chunk.len()) as u64;
            drop(buf);
            drain(&mut stream, limit as u64 + DRAIN_REFUSED - seen).await;
            return Err(too_large(declared.unwrap_or(seen)));
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(buf))
}

/// Reads and drops up to `most` more bytes of a refused body (for at most
/// 10 s).
async fn drain(
    stream: &mut (impl futures::Stream<Item = Result<Bytes, axum::Error>> + Unpin),
    most: u64,
) {
    let mut left = most;
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while left > 0 {
            match stream.next().await {
                Some(Ok(chunk)) => left = left.saturating_sub(chunk.len() as u64),
                _ => return,
            }
        }
    })
    .await;
}

/// The admin API's routes; `peers` asks other hosts (routed queries).
pub fn router(fleet: Arc<Fleet>, peers: Arc<Peers>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/v1/artifacts", post(upload))
        .route("/v1/deployments", get(list))
        .route(
            "/v1/deployments/{name}",
            put(deploy).get(describe).delete(delete),
        )
        .route("/v1/sinks/{name}", put(deploy_sink))
        .route("/v1/deployments/{name}/pause", post(pause))
        .route("/v1/deployments/{name}/resume", post(resume))
        .route("/v1/deployments/{name}/logs", get(logs))
        .route("/v1/deployments/{name}/state/{store}", get(query))
        .route("/v1/deployments/{name}/replay", post(replay))
        .route(
            "/v1/internal/deployments/{name}/state/{store}",
            post(read_local),
        )
        .route("/v1/usage", get(usage))
        .layer(Extension(Arc::new(Uploads::default())))
        .layer(Extension(Arc::new(TenantWork::default())))
        .layer(Extension(Arc::new(LogReads::default())))
        .layer(Extension(peers))
        .with_state(fleet)
}

/// How long open requests may take to finish once the host stops.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Serves the admin API on `listener`, over HTTPS when given `tls`, until
/// `shutdown` resolves.
pub async fn serve(
    fleet: Arc<Fleet>,
    listener: tokio::net::TcpListener,
    tls: Option<ServerTls>,
    peers: Arc<Peers>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listen = listener.local_addr().ok();
    let app = router(fleet, peers);
    let Some(tls) = tls else {
        if let Some(listen) = listen {
            if listen.ip().is_loopback() {
                tracing::info!(%listen, "admin API listening (http)");
            } else {
                tracing::warn!(
                    %listen,
                    "admin API listening over plain http on a non-loopback address: tokens \
                     cross the network in clear text; give --tls-cert and --tls-key, or put \
                     a TLS-terminating proxy in front"
                );
            }
        }
        return axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await;
    };
    if let Some(listen) = listen {
        tracing::info!(%listen, "admin API listening (https)");
    }
    tls.serve(listener, app, shutdown, DRAIN).await
}

async fn healthz(State(fleet): State<Arc<Fleet>>) -> (StatusCode, axum::Json<Health>) {
    let (code, status) = if fleet.draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (StatusCode::OK, "ok")
    };
    let health = Health {
        host: fleet.host_id.clone(),
        status: status.to_owned(),
    };
    (code, axum::Json(health))
}

async fn metrics(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> ApiResult<Response> {
    let tenant = tenant_or_operator(&fleet, &headers)?;
    let text = fleet
        .exposition(tenant.as_deref())
        .encode_text()
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding metrics: {e}"),
            )
        })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            crate::metrics::Exposition::CONTENT_TYPE,
        )],
        text,
    )
        .into_response())
}

/// `POST /v1/artifacts`.
async fn upload(
    State(fleet): State<Arc<Fleet>>,
    Extension(uploads): Extension<Arc<Uploads>>,
    Extension(work): Extension<Arc<TenantWork>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let _slot = uploads.enter(&tenant.name).await?;
    let body = read_body(&headers, body, MAX_ARTIFACT_BYTES, "the component").await?;
    let uploaded = work
        .run(&tenant.name.clone(), move || fleet.upload(&tenant, &body))
        .await?;
    Ok((StatusCode::CREATED, axum::Json(uploaded)).into_response())
}

/// `PUT /v1/deployments/{name}`.
async fn deploy(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let req: DeployRequest = deploy_body(&headers, body, "the deploy request").await?;
    let done = work
        .run(&tenant.name.clone(), move || {
            fleet.deploy(&tenant, &name, req)
        })
        .await?;
    Ok(deployed(done))
}

/// A deploy request's JSON body.
async fn deploy_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
    what: &str,
) -> ApiResult<T> {
    let body = read_body(headers, body, MAX_DEPLOY_BODY, what).await?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("{what} is not valid JSON for this host: {e}"),
        )
    })
}

/// 201 with the summary for a new deployment, 200 for an upgrade.
fn deployed((deployed, summary): (Deployed, DeploymentSummary)) -> Response {
    let status = match deployed {
        Deployed::Created => StatusCode::CREATED,
        Deployed::Upgraded => StatusCode::OK,
    };
    (status, axum::Json(summary)).into_response()
}

/// `PUT /v1/sinks/{name}`: deploys a sink (listed, described, paused,
/// resumed and deleted as any deployment).
async fn deploy_sink(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let req: SinkDeployRequest = deploy_body(&headers, body, "the sink deploy request").await?;
    let done = work
        .run(&tenant.name.clone(), move || {
            fleet.deploy_sink(&tenant, &name, &req.config)
        })
        .await?;
    Ok(deployed(done))
}

async fn list(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let deployments = fleet.list(&tenant);
    Ok(axum::Json(DeploymentList { deployments }).into_response())
}

async fn describe(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    Ok(axum::Json(fleet.describe(&tenant, &name)?).into_response())
}

async fn pause(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    set_desired(fleet, &work, headers, name, Desired::Paused).await
}

async fn resume(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    set_desired(fleet, &work, headers, name, Desired::Running).await
}

async fn set_desired(
    fleet: Arc<Fleet>,
    work: &TenantWork,
    headers: HeaderMap,
    name: String,
    desired: Desired,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let summary = work
        .run(&tenant.name.clone(), move || {
            fleet.set_desired(&tenant, &name, desired)
        })
        .await?;
    Ok(axum::Json(summary).into_response())
}

async fn delete(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path(name): Path<String>,
    Query(params): Query<DeleteParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let deleted = work
        .run(&tenant.name.clone(), move || {
            fleet.delete(&tenant, &name, params.purge_state)
        })
        .await?;
    Ok(axum::Json(deleted).into_response())
}

async fn logs(
    State(fleet): State<Arc<Fleet>>,
    Extension(reads): Extension<Arc<LogReads>>,
    Path(name): Path<String>,
    Query(params): Query<LogParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let slot = reads.enter(&tenant.name)?;
    let lines = blocking(move || {
        let _slot = slot;
        fleet.logs(&tenant, &name, &params)
    })
    .await?;
    Ok(axum::Json(lines).into_response())
}

/// `POST /v1/deployments/{name}/replay`: committed transactions of the
/// caller's deployment run again on this host (docs/replay.md). A long read
/// of the cluster: it takes one of the caller's log-read slots.
async fn replay(
    State(fleet): State<Arc<Fleet>>,
    Extension(reads): Extension<Arc<LogReads>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let req: ReplayRequest = deploy_body(&headers, body, "the replay request").await?;
    let slot = reads.enter(&tenant.name)?;
    let answer = blocking(move || {
        let _slot = slot;
        fleet.replay(&tenant, &name, req)
    })
    .await?;
    Ok(axum::Json(answer).into_response())
}

/// `GET /v1/usage`: the caller tenant's usage; every tenant's with the
/// operator token. A read of the whole usage topic: it takes one of the
/// caller's log-read slots.
async fn usage(
    State(fleet): State<Arc<Fleet>>,
    Extension(reads): Extension<Arc<LogReads>>,
    Query(params): Query<UsageParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_or_operator(&fleet, &headers)?;
    // The operator's reads count under a name no tenant can have.
    let slot = reads.enter(tenant.as_deref().unwrap_or("_operator"))?;
    let report = blocking(move || {
        let _slot = slot;
        fleet.usage(tenant.as_deref(), params.since_ms)
    })
    .await?;
    Ok(axum::Json(report).into_response())
}

async fn query(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Extension(peers): Extension<Arc<Peers>>,
    Path((name, store)): Path<(String, String)>,
    Query(params): Query<QueryParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let auth = headers.get(header::AUTHORIZATION).cloned();
    let who = queries::Asker {
        fleet,
        work,
        peers,
        tenant,
        auth,
        name,
        store,
    };
    let answer = queries::answer(who, params).await?;
    Ok(axum::Json(answer).into_response())
}

/// Another host's read of this host's stores for a routed query
/// (`admin/queries.rs`), with the querying tenant's token.
async fn read_local(
    State(fleet): State<Arc<Fleet>>,
    Extension(work): Extension<Arc<TenantWork>>,
    Path((name, store)): Path<(String, String)>,
    headers: HeaderMap,
    axum::Json(req): axum::Json<LocalReadRequest>,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let answer = work
        .run(&tenant.name.clone(), move || {
            fleet.read_local_wire(&tenant, &name, &store, &req)
        })
        .await?;
    Ok(axum::Json(answer).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Condvar;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// What the burst's operations block on, as on a slow Kafka call,
    /// until it opens.
    #[derive(Default)]
    struct Gate {
        open: Mutex<bool>,
        opened: Condvar,
    }

    impl Gate {
        fn pass(&self) {
            let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
            while !*open {
                open = self.opened.wait(open).unwrap_or_else(|e| e.into_inner());
            }
        }

        fn open(&self) {
            *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.opened.notify_all();
        }
    }

    /// How each tenant's operation gets to the blocking pool: what the
    /// handlers call.
    async fn call<T: Send + 'static>(
        work: &TenantWork,
        tenant: &str,
        f: impl FnOnce() -> Result<T, FleetError> + Send + 'static,
    ) -> ApiResult<T> {
        work.run(tenant, f).await
    }

    /// Polls `done` every 5 ms until it holds or `guard` (a hang guard)
    /// passed; whether it held.
    async fn until(guard: Duration, done: impl Fn() -> bool) -> bool {
        let start = Instant::now();
        while !done() {
            if start.elapsed() > guard {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Issue 45: one burst of 800 refused sink deploys from `evil` made
    /// acme's `pause` take 142.5 s: every tenant's operations queued in
    /// the blocking pool's one queue. Here evil's 800 operations block
    /// until acme's one has finished (or a hang guard passed); acme's must
    /// finish first, and evil must have had no more than its slots running
    /// and its queue waiting. The pool is as small as two tenants' slots
    /// and a few more (the host's is 512), so the burst overflows it as
    /// 800 overflowed 512.
    #[test]
    fn one_tenants_burst_does_not_queue_anothers_operation() {
        const BURST: usize = 800;
        const GUARD: Duration = Duration::from_secs(60);
        let pool = 2 * OPERATIONS_PER_TENANT + 4;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(pool)
            .enable_all()
            .build()
            .expect("a runtime");
        // Waiting operations wait past the hang guard: none gives up.
        let work = Arc::new(TenantWork::new(
            OPERATIONS_PER_TENANT,
            WAITING_PER_TENANT,
            3 * GUARD,
        ));
        let gate = Arc::new(Gate::default());
        let (running, most_running, busy) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        runtime.block_on(async {
            let burst: Vec<_> = (0..BURST)
                .map(|_| {
                    let (work, gate) = (Arc::clone(&work), Arc::clone(&gate));
                    let (running, most_running, busy) = (
                        Arc::clone(&running),
                        Arc::clone(&most_running),
                        Arc::clone(&busy),
                    );
                    tokio::spawn(async move {
                        let answer = call(&work, "evil", move || {
                            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                            most_running.fetch_max(now, Ordering::SeqCst);
                            gate.pass();
                            running.fetch_sub(1, Ordering::SeqCst);
                            Err::<(), _>(FleetError::Refused("refused sink deploy".to_owned()))
                        })
                        .await;
                        let status = answer.map_or_else(|e| e.status, |()| StatusCode::OK);
                        if status == StatusCode::TOO_MANY_REQUESTS {
                            busy.fetch_add(1, Ordering::SeqCst);
                        }
                        status
                    })
                })
                .collect();
            let filled = until(GUARD, || {
                running.load(Ordering::SeqCst) >= OPERATIONS_PER_TENANT
            })
            .await;
            assert!(filled, "evil's operations never started");

            let asked = Instant::now();
            let work2 = Arc::clone(&work);
            let pause = tokio::spawn(async move { call(&work2, "acme", || Ok("paused")).await });
            let before_release = until(GUARD, || pause.is_finished()).await;
            let pause_ms = asked.elapsed().as_secs_f64() * 1000.0;
            let evil_running = running.load(Ordering::SeqCst);
            // Every one of evil's calls has been answered 429 or holds a
            // place, so the count below does not depend on when the gate
            // opens.
            let expected_busy = BURST - OPERATIONS_PER_TENANT - WAITING_PER_TENANT;
            until(GUARD, || busy.load(Ordering::SeqCst) >= expected_busy).await;
            let busy_before_release = busy.load(Ordering::SeqCst);
            gate.open();
            let paused = pause.await.expect("acme's task");
            let mut ran = 0;
            for call in burst {
                if call.await.expect("evil's task") == StatusCode::FORBIDDEN {
                    ran += 1;
                }
            }
            let busy = busy.load(Ordering::SeqCst);
            println!("FIGURE admin_neighbour_pause_ms {pause_ms:.1}");
            println!("FIGURE admin_burst_calls {BURST}");
            println!("FIGURE admin_burst_running_at_pause {evil_running}");
            println!(
                "FIGURE admin_burst_most_running {}",
                most_running.load(Ordering::SeqCst)
            );
            println!("FIGURE admin_burst_ran {ran}");
            println!("FIGURE admin_burst_refused_429 {busy}");
            println!("FIGURE admin_burst_refused_429_before_release {busy_before_release}");
            assert!(
                before_release,
                "acme's pause was queued behind evil's burst: it finished only after evil's \
                 {BURST} operations were let go ({pause_ms:.0} ms, {evil_running} of evil's \
                 running on a pool of {pool})"
            );
            assert_eq!(
                paused.map_err(|e| e.message).expect("acme's pause"),
                "paused"
            );
            assert_eq!(
                most_running.load(Ordering::SeqCst),
                OPERATIONS_PER_TENANT,
                "evil's operations running at once"
            );
            assert_eq!(ran, OPERATIONS_PER_TENANT + WAITING_PER_TENANT);
            assert_eq!(busy, expected_busy);
        });
    }
}
