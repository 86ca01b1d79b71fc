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

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

use crate::api::{
    DeleteParams, DeployRequest, DeploymentList, ErrorBody, Health, LogParams, QueryParams,
};
use crate::fleet::Deployed;
use crate::fleet::registry::{Desired, MAX_ARTIFACT_BYTES};
use crate::fleet::tenancy::Principal;
use crate::fleet::{Fleet, FleetError, Tenant};
use crate::kafka::KafkaError;
use crate::types::error_chain;

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
        FleetError::Manifest(_)
        | FleetError::Component(_)
        | FleetError::Invalid(_)
        | FleetError::Artifact { .. }
        | FleetError::Kafka(KafkaError::Topic { .. }) => StatusCode::UNPROCESSABLE_ENTITY,
        FleetError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        FleetError::Kafka(_) | FleetError::Stream(_) | FleetError::Unavailable(_) => {
            StatusCode::SERVICE_UNAVAILABLE
        }
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
/// block).
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

/// Serves the admin API on `listener` until `shutdown` resolves.
pub async fn serve(
    fleet: Arc<Fleet>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(listen) = listener.local_addr() {
        tracing::info!(%listen, "admin API listening");
    }
    axum::serve(listener, router(fleet))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn healthz(State(fleet): State<Arc<Fleet>>) -> axum::Json<Health> {
    axum::Json(Health {
        host: fleet.host_id.clone(),
        status: "ok".to_owned(),
    })
}

async fn metrics(State(fleet): State<Arc<Fleet>>, headers: HeaderMap) -> ApiResult<Response> {
    let tenant = match bearer(&headers).and_then(|t| fleet.tenants.authenticate(t)) {
        Some(Principal::Tenant(t)) => Some(t.name.clone()),
        Some(Principal::Operator) => None,
        None => return Err(unauthorized()),
    };
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
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let uploaded = blocking(move || fleet.upload(&tenant, &body)).await?;
    Ok((StatusCode::CREATED, axum::Json(uploaded)).into_response())
}

/// `PUT /v1/deployments/{name}`.
async fn deploy(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    axum::Json(req): axum::Json<DeployRequest>,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let (deployed, summary) = blocking(move || fleet.deploy(&tenant, &name, req)).await?;
    let status = match deployed {
        Deployed::Created => StatusCode::CREATED,
        Deployed::Upgraded => StatusCode::OK,
    };
    Ok((status, axum::Json(summary)).into_response())
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
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    set_desired(fleet, headers, name, Desired::Paused).await
}

async fn resume(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    set_desired(fleet, headers, name, Desired::Running).await
}

async fn set_desired(
    fleet: Arc<Fleet>,
    headers: HeaderMap,
    name: String,
    desired: Desired,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let summary = blocking(move || fleet.set_desired(&tenant, &name, desired)).await?;
    Ok(axum::Json(summary).into_response())
}

async fn delete(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    Query(params): Query<DeleteParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let deleted = blocking(move || fleet.delete(&tenant, &name, params.purge_state)).await?;
    Ok(axum::Json(deleted).into_response())
}

async fn logs(
    State(fleet): State<Arc<Fleet>>,
    Path(name): Path<String>,
    Query(params): Query<LogParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let lines = blocking(move || fleet.logs(&tenant, &name, &params)).await?;
    Ok(axum::Json(lines).into_response())
}

async fn query(
    State(fleet): State<Arc<Fleet>>,
    Path((name, store)): Path<(String, String)>,
    Query(params): Query<QueryParams>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let tenant = tenant_of(&fleet, &headers)?;
    let answer = blocking(move || fleet.query(&tenant, &name, &store, &params.key)).await?;
    Ok(axum::Json(answer).into_response())
}
