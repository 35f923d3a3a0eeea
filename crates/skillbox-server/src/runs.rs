//! `POST /v1/run`, artifact downloads, health and metrics.

use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{Method, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use skillbox_protocol::{ApiError, ErrorCode, RunRequest, RunResult};

use crate::error::{Failure, json_rejection};
use crate::state::{AppState, Gauge};

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
pub(crate) async fn run(
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
            return Err(Failure::overloaded(
                format!(
                    "{} runs are running and {} waiting; retry later",
                    state.config.max_concurrency, state.config.max_queue
                ),
                1,
            ));
        }
        Err(_) => match state.slots.clone().acquire_owned().await {
            Ok(permit) => permit,
            Err(_) => {
                return Err(Failure::new(
                    ErrorCode::Unavailable,
                    "the server is shutting down",
                ));
            }
        },
    };
    drop(queued);
    // The run lives in its own task: if the client goes away, this handler is dropped,
    // the token is cancelled, and the run still ends properly and removes its sandbox.
    let cancel = state.runs_cancel().child_token();
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
    let result = task
        .await
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("the run failed: {e}")))?;
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
pub(crate) struct ObjectQuery {
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
pub(crate) async fn get_object(
    State(state): State<AppState>,
    method: Method,
    Path(sha256): Path<String>,
    Query(query): Query<ObjectQuery>,
) -> Result<Response, Failure> {
    let store = state.runner.store();
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
            .await?
            .ok_or_else(|| Failure::new(ErrorCode::NotFound, format!("no artifact {sha256}")))?;
        builder
            .header(header::CONTENT_LENGTH, size)
            .body(Body::empty())
    } else {
        let bytes = store.get(&sha256).await?;
        builder
            .header(header::CONTENT_LENGTH, bytes.len())
            .body(Body::from(bytes))
    };
    response.map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "ok")))]
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
