//! The host's HTTP admin API (axum) and its Prometheus endpoint.
//!
//! Every `/v1` call carries `Authorization: Bearer <tenant token>`. A bad
//! or missing token gets 401; a deployment of another tenant is
//! indistinguishable from one that does not exist (404). Tokens are never
//! logged.
//!
//! | method and path | does |
//! |---|---|
//! | `POST /v1/artifacts` (body: the component) | validates and stores a component; returns its sha256 |
//! | `PUT /v1/deployments/{name}` `{manifest, artifact}` | deploys (or upgrades) a processor |
//! | `GET /v1/deployments` | the tenant's deployments |
//! | `GET /v1/deployments/{name}` | status, version, partitions per host, lag, rates, last errors |
//! | `POST /v1/deployments/{name}/pause`, `/resume` | stops or restarts its workers, keeping state and offsets |
//! | `DELETE /v1/deployments/{name}?purge_state=true` | removes it (and its state) |
//! | `GET /v1/deployments/{name}/logs?from=&tail=&wait_ms=` | guest log lines |
//! | `GET /v1/deployments/{name}/state/{store}?key=` | the committed value of a key |
//! | `GET /metrics` | Prometheus text: the caller tenant's series (all with the operator token) |
//! | `GET /healthz` | liveness, no token |

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::deploy::registry::{
    DeploymentRecord, Desired, HostStatus, LogEntry, MAX_ARTIFACT_BYTES, deployment_key, now_ms,
};
use crate::fleet::{Fleet, manifest_of, parse_manifest};
use crate::sandbox::ProcessorPolicy;
use crate::stream::StreamError;
use crate::tenancy::{Existing, Principal, Tenant};

/// A status older than this is reported as stale (its host is likely gone).
const STALE_AFTER_MS: i64 = 10_000;
/// A status older than this is not shown at all (its host is gone).
const FORGET_AFTER_MS: i64 = 60_000;

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
    fn not_found(name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("no deployment named {name:?} (see `onceflow list`)"),
        )
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }
    fn kafka(e: StreamError) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(json!({ "error": self.message }))).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// Runs `f` on the blocking pool (Kafka and wasmtime calls block).
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("handler failed: {e}"),
        )
    })?
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
    match bearer(headers).and_then(|t| fleet.tenants.authenticate(t)) {
        Some(Principal::Tenant(t)) => Ok(t.clone()),
        Some(Principal::Operator) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "the operator token reads metrics only: use a tenant token",
        )),
        None => Err(unauthorized()),
    }
}

/// The tenant's live (not deleted) deployment `name`.
fn own_record(fleet: &Fleet, tenant: &Tenant, name: &str) -> ApiResult<DeploymentRecord> {
    fleet
        .control
        .deployments
        .get(&deployment_key(&tenant.name, name))
        .filter(|r| r.desired != Desired::Deleted)
        .ok_or_else(|| ApiError::not_found(name))
}

/// The admin API's routes.
pub fn router(fleet: Arc<Fleet>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route(
            "/v1/artifacts",
            post(upload).layer(DefaultBodyLimit::max(MAX_ARTIFACT_BYTES)),
        )
        .route("/v1/deployments", get(list))
        .route(
            "/v1/deployments/{name}",
            put(deploy).get(describe).delete(delete),
        )
        .route("/v1/deployments/{name}/pause", post(pause))
        .route("/v1/deployments/{name}/resume", post(resume))
        .route("/v1/deployments/{name}/logs", get(logs))
        .route("/v1/deployments/{name}/state/{store}", get(query))
        .with_state(fleet)
}

/// Serves the admin API on `listen` until `shutdown` resolves.
pub async fn serve(
    fleet: Arc<Fleet>,
    listen: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    tracing::info!(%listen, "admin API listening");
    axum::serve(listener, router(fleet))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz(State(fleet): State<Arc<Fleet>>) -> impl IntoResponse {
    axum::Json(json!({ "host": fleet.host_id, "status": "ok" }))
}

async fn metrics(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> ApiResult<Response> {
    let tenant = match bearer(&headers).and_then(|t| fleet.tenants.authenticate(t)) {
        Some(Principal::Tenant(t)) => Some(t.name.clone()),
        Some(Principal::Operator) => None,
        None => return Err(unauthorized()),
    };
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(fleet.exposition(tenant.as_deref())));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        )
    })?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// `POST /v1/artifacts`: checks the component (parses, allowed imports,
/// expected exports, compiles) and stores it, chunked, in Kafka.
async fn upload(
    State(fleet): State<Arc<Fleet>>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    blocking(move || {
        fleet
            .sandbox
            .load(&body, ProcessorPolicy::default())
            .map_err(|e| ApiError::invalid(format!("component refused: {e}")))?;
        let sha = fleet.control.put_artifact(&body).map_err(ApiError::kafka)?;
        tracing::info!(tenant = %tenant.name, artifact = %sha, bytes = body.len(), "component stored");
        Ok((
            StatusCode::CREATED,
            axum::Json(json!({ "artifact": sha, "size": body.len() })),
        )
            .into_response())
    })
    .await
}

/// The body of `PUT /v1/deployments/{name}`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DeployRequest {
    /// The manifest's text.
    pub manifest: String,
    /// sha256 of an uploaded component.
    pub artifact: String,
}

async fn deploy(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    axum::Json(req): axum::Json<DeployRequest>,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    blocking(move || {
        let manifest = parse_manifest(&tenant.name, &name, &req.manifest)
            .map_err(|e| ApiError::invalid(format!("manifest refused: {e}")))?;
        if manifest.name != name {
            return Err(ApiError::invalid(format!(
                "the manifest's name is {:?} but the request deploys {name:?}",
                manifest.name
            )));
        }
        let others: Vec<Existing> = fleet
            .control
            .deployments
            .with_prefix(&format!("{}/", tenant.name))
            .into_iter()
            .filter(|r| r.desired != Desired::Deleted)
            .filter_map(|r| {
                let m = manifest_of(&r).ok()?;
                Some(Existing {
                    name: r.name,
                    worker_threads: m.processing.worker_threads,
                })
            })
            .collect();
        tenant
            .admit(&manifest, &others)
            .map_err(|m| ApiError::new(StatusCode::FORBIDDEN, format!("refused: {m}")))?;
        let bytes = fleet.control.artifact(&req.artifact).map_err(|e| {
            ApiError::invalid(format!("{e} (upload it with POST /v1/artifacts first)"))
        })?;
        fleet
            .sandbox
            .load(&bytes, ProcessorPolicy::from_manifest(&manifest))
            .map_err(|e| ApiError::invalid(format!("component refused: {e}")))?;
        crate::stream::kafka::prepare_topics(&manifest, fleet.options()).map_err(|e| match e {
            StreamError::Topic { .. } => ApiError::invalid(format!("refused: {e}")),
            other => ApiError::kafka(other),
        })?;
        let previous = fleet
            .control
            .deployments
            .get(&deployment_key(&tenant.name, &name));
        let record = DeploymentRecord {
            tenant: tenant.name.clone(),
            name: name.clone(),
            version: previous.as_ref().map_or(1, |p| p.version + 1),
            manifest: req.manifest,
            artifact: req.artifact,
            artifact_size: bytes.len() as u64,
            desired: Desired::Running,
            purge_state: false,
            updated_ms: now_ms(),
        };
        fleet
            .control
            .put_deployment(&record)
            .map_err(ApiError::kafka)?;
        tracing::info!(deployment = %record.key(), version = record.version, "deployed");
        let status = if previous.is_some_and(|p| p.desired != Desired::Deleted) {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        Ok((status, axum::Json(summary(&record, &[]))).into_response())
    })
    .await
}

fn statuses_of(fleet: &Fleet, r: &DeploymentRecord) -> Vec<HostStatus> {
    let now = now_ms();
    fleet
        .control
        .statuses
        .with_prefix(&format!("{}/{}/", r.tenant, r.name))
        .into_iter()
        .filter(|s| now - s.updated_ms <= FORGET_AFTER_MS)
        .collect()
}

/// What `list` and `describe` show of a deployment.
fn summary(r: &DeploymentRecord, statuses: &[HostStatus]) -> serde_json::Value {
    let now = now_ms();
    let hosts: Vec<serde_json::Value> = statuses
        .iter()
        .map(|s| {
            json!({
                "host": s.host,
                "version": s.version,
                "state": s.state,
                "partitions": s.partitions,
                "lag": s.lag,
                "records_per_s": (s.records_per_s * 10.0).round() / 10.0,
                "commits_per_s": (s.commits_per_s * 10.0).round() / 10.0,
                "commit_p99_ms": (s.commit_p99_ms * 10.0).round() / 10.0,
                "records": s.records,
                "aborts": s.aborts,
                "fenced": s.fenced,
                "dead_lettered": s.dead_lettered,
                "last_errors": s.last_errors,
                "stale": now - s.updated_ms > STALE_AFTER_MS,
                "age_ms": now - s.updated_ms,
            })
        })
        .collect();
    let live: Vec<&HostStatus> = statuses
        .iter()
        .filter(|s| now - s.updated_ms <= STALE_AFTER_MS)
        .collect();
    let running_versions: std::collections::BTreeSet<u64> = live
        .iter()
        .filter(|s| s.state == "running")
        .map(|s| s.version)
        .collect();
    let status = match r.desired {
        Desired::Paused => "paused".to_owned(),
        Desired::Deleted => "deleted".to_owned(),
        Desired::Running if live.iter().any(|s| s.state == "failed") => "failed".to_owned(),
        Desired::Running
            if running_versions.contains(&r.version) && running_versions.len() == 1 =>
        {
            "running".to_owned()
        }
        Desired::Running if !running_versions.is_empty() => "upgrading".to_owned(),
        Desired::Running => "starting".to_owned(),
    };
    json!({
        "name": r.name,
        "tenant": r.tenant,
        "version": r.version,
        "status": status,
        "artifact": r.artifact,
        "artifact_size": r.artifact_size,
        "updated_ms": r.updated_ms,
        "running_versions": running_versions,
        "partitions": live.iter().map(|s| s.partitions.len()).sum::<usize>(),
        "lag": live.iter().map(|s| s.lag).sum::<i64>(),
        "records_per_s": (live.iter().map(|s| s.records_per_s).sum::<f64>() * 10.0).round() / 10.0,
        "commits_per_s": (live.iter().map(|s| s.commits_per_s).sum::<f64>() * 10.0).round() / 10.0,
        "hosts": hosts,
    })
}

async fn list(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let items: Vec<serde_json::Value> = fleet
        .control
        .deployments
        .with_prefix(&format!("{}/", tenant.name))
        .into_iter()
        .filter(|r| r.desired != Desired::Deleted)
        .map(|r| summary(&r, &statuses_of(&fleet, &r)))
        .collect();
    Ok(axum::Json(json!({ "deployments": items })).into_response())
}

async fn describe(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let r = own_record(&fleet, &tenant, &name)?;
    let mut s = summary(&r, &statuses_of(&fleet, &r));
    s["manifest"] = json!(r.manifest);
    Ok(axum::Json(s).into_response())
}

async fn set_desired(
    fleet: Arc<Fleet>,
    headers: HeaderMap,
    name: String,
    desired: Desired,
    purge_state: bool,
) -> ApiResult<DeploymentRecord> {
    let tenant = tenant_of(&fleet, &headers)?;
    let mut r = own_record(&fleet, &tenant, &name)?;
    blocking(move || {
        r.desired = desired;
        r.purge_state = purge_state;
        r.updated_ms = now_ms();
        fleet.control.put_deployment(&r).map_err(ApiError::kafka)?;
        tracing::info!(deployment = %r.key(), ?desired, "desired state changed");
        Ok(r)
    })
    .await
}

async fn pause(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let r = set_desired(fleet, headers, name, Desired::Paused, false).await?;
    Ok(axum::Json(summary(&r, &[])).into_response())
}

async fn resume(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let r = set_desired(fleet, headers, name, Desired::Running, false).await?;
    Ok(axum::Json(summary(&r, &[])).into_response())
}

#[derive(Debug, Deserialize)]
struct DeleteParams {
    #[serde(default)]
    purge_state: bool,
}

async fn delete(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    Query(params): Query<DeleteParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let r = set_desired(
        fleet.clone(),
        headers,
        name,
        Desired::Deleted,
        params.purge_state,
    )
    .await?;
    if !params.purge_state {
        return Ok(axum::Json(json!({ "deleted": r.name, "state_purged": false })).into_response());
    }
    // Purge: once the workers have left (this host's at once; the others'
    // static memberships when their sessions expire), drop the group and
    // the changelogs. Each host drops its local stores itself.
    blocking(move || {
        let key = r.key();
        for _ in 0..600 {
            if !fleet.is_running(&key) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let manifest = manifest_of(&r).map_err(ApiError::invalid)?;
        fleet
            .control
            .purge(&manifest.application_id(), &Fleet::changelogs_of(&r))
            .map_err(ApiError::kafka)?;
        Ok(axum::Json(json!({ "deleted": r.name, "state_purged": true })).into_response())
    })
    .await
}

#[derive(Debug, Deserialize)]
struct LogParams {
    from: Option<i64>,
    #[serde(default = "default_tail")]
    tail: i64,
    #[serde(default)]
    wait_ms: u64,
}

fn default_tail() -> i64 {
    10_000
}

async fn logs(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    Query(params): Query<LogParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let r = own_record(&fleet, &tenant, &name)?;
    blocking(move || {
        let wait = Duration::from_millis(params.wait_ms.min(30_000));
        let (lines, next): (Vec<LogEntry>, i64) = fleet
            .control
            .read_logs(&r.key(), params.from, params.tail.clamp(1, 1_000_000), wait)
            .map_err(ApiError::kafka)?;
        Ok(axum::Json(json!({ "lines": lines, "next": next })).into_response())
    })
    .await
}

#[derive(Debug, Deserialize)]
struct QueryParams {
    key: String,
}

async fn query(
    State(fleet): State<Arc<Fleet>>,
    Path((name, store)): Path<(String, String)>,
    Query(params): Query<QueryParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let r = own_record(&fleet, &tenant, &name)?;
    let manifest = manifest_of(&r).map_err(ApiError::invalid)?;
    if !manifest.stores.contains(&store) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "deployment {name:?} has no store {store:?} (its stores: {})",
                manifest.stores.join(", ")
            ),
        ));
    }
    let topic = crate::stream::changelog_topic(&manifest, &store);
    blocking(move || {
        let found = fleet
            .control
            .query_changelog(&topic, params.key.as_bytes())
            .map_err(ApiError::kafka)?;
        if found.is_empty() {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "key {:?} has no committed value in store {store:?}",
                    params.key
                ),
            ));
        }
        let values: Vec<serde_json::Value> = found
            .into_iter()
            .map(|(partition, v)| match String::from_utf8(v) {
                Ok(text) => json!({ "partition": partition, "value": text }),
                Err(e) => json!({
                    "partition": partition,
                    "value_base64": base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD,
                        e.as_bytes()
                    ),
                }),
            })
            .collect();
        Ok(
            axum::Json(json!({ "store": store, "key": params.key, "values": values }))
                .into_response(),
        )
    })
    .await
}
