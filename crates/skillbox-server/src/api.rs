//! Routes and handlers.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use skillbox_client::{ApiError, ApiErrorBody, RunRequest, RunResult};
use skillbox_run::{RunError, Runner};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use utoipa::OpenApi;

use crate::metrics::Metrics;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Runs at once (default: the number of cores).
    pub max_concurrency: usize,
    /// Runs that may wait for a slot before new ones get 429.
    pub max_queue: usize,
    /// Largest request body (413 above).
    pub body_limit: usize,
    /// Agent runs (`/v1/agent/runs`); `None` answers 503 there.
    pub agents: Option<crate::agents::AgentRuns>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_concurrency: cores,
            max_queue: cores * 8,
            body_limit: 48 * 1024 * 1024,
            agents: None,
        }
    }
}

/// Shared by every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    runner: Arc<Runner>,
    slots: Arc<Semaphore>,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    runs: CancellationToken,
}

impl AppState {
    pub fn new(config: ServerConfig, runner: Arc<Runner>, runs: CancellationToken) -> Self {
        AppState {
            runner,
            slots: Arc::new(Semaphore::new(config.max_concurrency.max(1))),
            config,
            metrics: Arc::new(Metrics::default()),
            runs,
        }
    }

    /// Cancelled at shutdown: every running run is cancelled and its sandbox removed.
    pub fn runs_cancel(&self) -> &CancellationToken {
        &self.runs
    }

    pub(crate) fn agents(&self) -> Option<&crate::agents::AgentRuns> {
        self.config.agents.as_ref()
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "skillbox",
        description = "Run code that AI agents write behind a real boundary."
    ),
    paths(
        run,
        get_object,
        healthz,
        metrics,
        crate::agents::create,
        crate::agents::get
    ),
    components(schemas(
        crate::agents::AgentRunRequest,
        crate::agents::AgentRunCreated,
        RunRequest,
        RunResult,
        ApiError,
        ApiErrorBody,
        skillbox_client::FileInput,
        skillbox_client::ArtifactInfo,
        skillbox_client::Language,
        skillbox_client::Encoding
    ))
)]
#[derive(Debug)]
pub struct ApiDoc;

/// Counts one up while alive.
struct Gauge<'a> {
    counter: &'a std::sync::atomic::AtomicU64,
    /// The value before this one was counted.
    before: u64,
}

impl<'a> Gauge<'a> {
    fn up(counter: &'a std::sync::atomic::AtomicU64) -> Self {
        let before = counter.fetch_add(1, Ordering::SeqCst);
        Gauge { counter, before }
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An error answer: `{"error":{"code","message"}}`.
#[derive(Debug)]
pub(crate) struct Failure {
    status: StatusCode,
    code: String,
    message: String,
    pub(crate) retry_after: Option<u32>,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Failure {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let body = ApiError {
            error: ApiErrorBody {
                code: self.code,
                message: self.message,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<RunError> for Failure {
    fn from(error: RunError) -> Self {
        let status = match &error {
            RunError::Invalid(_) => StatusCode::BAD_REQUEST,
            RunError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            RunError::Aborted => StatusCode::SERVICE_UNAVAILABLE,
            RunError::TooLarge(_) => StatusCode::UNPROCESSABLE_ENTITY,
            RunError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure::new(status, error.code(), error.to_string())
    }
}

pub(crate) fn json_rejection(rejection: JsonRejection) -> Failure {
    let status = rejection.status();
    let (status, code) = match status {
        StatusCode::PAYLOAD_TOO_LARGE => (status, "payload_too_large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (status, "unsupported_media_type"),
        _ => (StatusCode::BAD_REQUEST, "invalid"),
    };
    Failure::new(
        status,
        code,
        format!("request body: {}", rejection.body_text()),
    )
}

pub fn router(state: AppState) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/v1/run", post(run))
        .route("/run", post(run))
        .route("/v1/objects/{sha256}", get(get_object).head(get_object))
        .route("/v1/agent/runs", post(crate::agents::create))
        .route("/v1/agent/runs/{id}", get(crate::agents::get))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> Failure {
    Failure::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /openapi.json",
    )
}

async fn method_not_allowed(method: Method) -> Failure {
    Failure::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed here; see /openapi.json"),
    )
}

/// Run one script in a fresh sandbox.
#[utoipa::path(
    post,
    path = "/v1/run",
    request_body = RunRequest,
    responses(
        (status = 200, description = "The run happened (it may have failed or hit a limit)", body = RunResult),
        (status = 400, description = "Bad request: the message names the field", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 429, description = "Too many runs queued; retry after Retry-After", body = ApiError),
        (status = 503, description = "A needed backend or runtime is unavailable", body = ApiError),
    )
)]
async fn run(
    State(state): State<AppState>,
    body: Result<Json<RunRequest>, JsonRejection>,
) -> Result<Json<RunResult>, Failure> {
    let Json(request) = body.map_err(json_rejection)?;
    let metrics = &state.metrics;
    // Admission: a slot, or a place in the queue, or 429. The gauges are guards, so a
    // client that goes away while queued or running does not leave them counted.
    let queued = Gauge::up(&metrics.queued);
    let permit = match state.slots.clone().try_acquire_owned() {
        Ok(permit) => permit,
        Err(_) if queued.before as usize >= state.config.max_queue => {
            drop(queued);
            metrics.rejected_overloaded.fetch_add(1, Ordering::Relaxed);
            let mut failure = Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "overloaded",
                format!(
                    "{} runs are running and {} waiting; retry later",
                    state.config.max_concurrency, state.config.max_queue
                ),
            );
            failure.retry_after = Some(1);
            return Err(failure);
        }
        Err(_) => match state.slots.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => {
                return Err(Failure::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "the server is shutting down",
                ));
            }
        },
    };
    drop(queued);
    // The run lives in its own task: if the client goes away, this handler is dropped,
    // the token is cancelled, and the run still ends properly and removes its sandbox.
    let cancel = state.runs.child_token();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let runner = state.runner.clone();
    let task_metrics = state.metrics.clone();
    let task = tokio::spawn(async move {
        let _running = Gauge::up(&task_metrics.in_flight);
        let started = Instant::now();
        let result = runner.run(request, &cancel).await;
        drop(permit);
        task_metrics
            .run_millis_total
            .fetch_add(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        result
    });
    let result = task.await.map_err(|e| {
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unknown",
            format!("the run failed: {e}"),
        )
    })?;
    match result {
        Ok(result) => {
            let counter = if result.limit_hit.is_some() || result.timed_out {
                &metrics.runs_limit_hit
            } else if result.exit_code == Some(0) {
                &metrics.runs_ok
            } else {
                &metrics.runs_failed
            };
            counter.fetch_add(1, Ordering::Relaxed);
            metrics
                .artifacts_total
                .fetch_add(result.files.len() as u64, Ordering::Relaxed);
            metrics
                .artifact_bytes_total
                .fetch_add(result.files.iter().map(|f| f.size).sum(), Ordering::Relaxed);
            Ok(Json(result))
        }
        Err(error) => {
            metrics.runs_error.fetch_add(1, Ordering::Relaxed);
            Err(error.into())
        }
    }
}

#[derive(Debug, Deserialize)]
struct ObjectQuery {
    name: Option<String>,
}

/// Download an artifact by its sha256 (`?name=` sets the file name).
#[utoipa::path(
    get,
    path = "/v1/objects/{sha256}",
    params(("sha256" = String, Path, description = "64 lowercase hex digits"), ("name" = Option<String>, Query, description = "file name for Content-Disposition")),
    responses(
        (status = 200, description = "The artifact's bytes"),
        (status = 400, description = "Not a sha256", body = ApiError),
        (status = 404, description = "No such artifact", body = ApiError),
    )
)]
async fn get_object(
    State(state): State<AppState>,
    method: Method,
    Path(sha256): Path<String>,
    Query(query): Query<ObjectQuery>,
) -> Result<Response, Failure> {
    let store = state.runner.store();
    let store_failure = |e: skillbox_store::StoreError| {
        let code = e.code();
        let status = match code {
            skillbox_env::ErrorCode::Invalid => StatusCode::BAD_REQUEST,
            skillbox_env::ErrorCode::NotFound => StatusCode::NOT_FOUND,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Failure::new(status, code.as_str(), e.to_string())
    };
    let content_type = query
        .name
        .as_deref()
        .and_then(|n| mime_guess::from_path(n).first_raw())
        .unwrap_or("application/octet-stream");
    let mut builder = Response::builder().header(header::CONTENT_TYPE, content_type);
    if let Some(name) = query.name.as_deref() {
        let safe: String = name
            .chars()
            .filter(|c| !c.is_control() && *c != '"' && *c != '\\' && *c != '/')
            .collect();
        builder = builder.header(
            header::CONTENT_DISPOSITION,
            format!("attachment; filename=\"{safe}\""),
        );
    }
    let response = if method == Method::HEAD {
        let size = store
            .head(&sha256)
            .await
            .map_err(store_failure)?
            .ok_or_else(|| {
                Failure::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    format!("no artifact {sha256}"),
                )
            })?;
        builder
            .header(header::CONTENT_LENGTH, size)
            .body(Body::empty())
    } else {
        let bytes = store.get(&sha256).await.map_err(store_failure)?;
        builder
            .header(header::CONTENT_LENGTH, bytes.len())
            .body(Body::from(bytes))
    };
    response.map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "unknown", e.to_string()))
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "ok")))]
async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format")))]
async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
