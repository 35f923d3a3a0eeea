//! `POST /v1/run` (and `GET /v1/runs`, the summaries it keeps), artifact downloads,
//! health and metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use skillbox_protocol::{
    ApiError, ArtifactInfo, BackendKind, ErrorCode, Language, PlainRunList, PlainRunSummary,
    RunRequest, RunResult,
};
use skillbox_store::is_sha256_hex;
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::Tenant;
use crate::error::Failure;
use crate::state::{AppState, Gauge, TenantRun};

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
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Result<Json<RunResult>, Failure> {
    let (parts, body) = request.into_parts();
    let admission = admit(&state, &tenant, &parts.headers).await?;
    let metrics = &state.metrics;
    let request: RunRequest =
        read_json(body, state.config.body_limit, state.config.body_timeout).await?;
    let asked = (
        request.language,
        request.backend.unwrap_or(BackendKind::Native),
        first_line(&request.script),
    );
    // The run lives in its own task: if the client goes away, this handler is dropped,
    // the token is cancelled, and the run still ends properly and removes its sandbox.
    let cancel = state.runs_cancel().child_token();
    let _cancel_on_drop = cancel.clone().drop_guard();
    let runner = state.runner.clone();
    let task_metrics = state.metrics.clone();
    let task_tenant = tenant.clone();
    let task = tokio::spawn(async move {
        let _running = Gauge::up(&task_metrics.in_flight);
        let started = Instant::now();
        let result = runner.run_as(request, task_tenant.as_str(), &cancel).await;
        drop(admission);
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
            grant(&state, &tenant, &result.files).await?;
            remember(&state, &tenant, asked, &result).await;
            Ok(Json(result))
        }
        Err(error) => {
            metrics.runs_error.fetch_add(1, Ordering::Relaxed);
            Err(error.into())
        }
    }
}

/// Plain runs kept per tenant for `GET /v1/runs`; older ones are forgotten.
const PLAIN_RUNS_KEPT: usize = 500;
/// Files listed in a plain run's summary.
const PLAIN_RUN_FILES: usize = 64;

/// A script's first non-empty line, cut to 120 characters: what names it in a list.
fn first_line(script: &str) -> String {
    let line = script
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    let mut cut: String = line.chars().take(120).collect();
    if cut.len() < line.len() {
        cut.push('…');
    }
    cut
}

/// Keeps a summary of a finished plain run for its tenant's list (no output, the first
/// line of the script, the files). A failure to keep it is logged: the run stands.
async fn remember(
    state: &AppState,
    tenant: &Tenant,
    (language, backend, script): (Language, BackendKind, String),
    result: &RunResult,
) {
    let Some(agents) = state.agents() else {
        return;
    };
    let Ok(id) = crate::agents::new_id() else {
        tracing::warn!("runs: no id for the run's summary; it is not kept");
        return;
    };
    let summary = PlainRunSummary {
        id,
        created_ms: 0,
        language,
        backend,
        script,
        exit_code: result.exit_code,
        signal: result.signal,
        timed_out: result.timed_out,
        limit_hit: result.limit_hit,
        duration_ms: result.duration_ms,
        files: result.files.iter().take(PLAIN_RUN_FILES).cloned().collect(),
    };
    let kept = match serde_json::to_string(&summary) {
        Ok(body) => agents
            .records
            .insert_plain(&summary.id, tenant.as_str(), &body, PLAIN_RUNS_KEPT)
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = kept {
        tracing::warn!(error = %e, "run: cannot keep its summary for the list");
    }
}

/// This tenant's plain runs (`POST /v1/run`), newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/runs",
    params(
        ("limit" = Option<usize>, Query, description = "runs in the page, 1..=100 (default 20)"),
        ("before" = Option<String>, Query, description = "the `next` of the previous page"),
    ),
    responses(
        (status = 200, description = "A page of plain runs", body = PlainRunList),
        (status = 400, description = "A bad limit or before", body = ApiError),
    )
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    query: Result<Query<crate::agents::ListQuery>, QueryRejection>,
) -> Result<Json<PlainRunList>, Failure> {
    let query = crate::agents::ListQuery::read(query)?;
    let limit = query.limit()?;
    let agents = state.agents().ok_or_else(crate::agents::not_configured)?;
    let before = match query.before.as_deref() {
        None => None,
        Some(id) => Some(
            agents
                .records
                .get_plain(id)
                .await?
                .filter(|record| record.tenant == tenant.as_str())
                .ok_or_else(|| {
                    Failure::new(
                        ErrorCode::Invalid,
                        format!("before: no run {id:?}; give the `next` of a page"),
                    )
                })?,
        ),
    };
    let mut records = agents
        .records
        .list_plain(tenant.as_str(), limit + 1, before.as_ref())
        .await?;
    let more = records.len() > limit;
    records.truncate(limit);
    let next = more
        .then(|| records.last().map(|record| record.id.clone()))
        .flatten();
    let runs = records
        .iter()
        .map(|record| {
            let mut run: PlainRunSummary = serde_json::from_str(&record.body)
                .map_err(|e| Failure::new(ErrorCode::Unknown, format!("run {}: {e}", record.id)))?;
            run.created_ms = record.created_ms;
            Ok(run)
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(Json(PlainRunList { runs, next }))
}

/// What a run holds from its admission until it ends: its place in its tenant's count,
/// a run slot, and its body's bytes in the budget of bodies held in memory.
#[derive(Debug)]
pub struct Admission {
    _tenant_run: TenantRun,
    _slot: OwnedSemaphorePermit,
    _body_bytes: BodyHold,
}

/// Admits a run of `tenant` (`POST /v1/run`, a capability's run) whose JSON body is
/// announced by `headers`, or refuses it before any of the body is read: 415 or 413 by
/// the headers, then the tenant's bound, a slot or a place in the queue, and the body
/// budget, else 429. The body may be read once this returns.
pub(crate) async fn admit(
    state: &AppState,
    tenant: &Tenant,
    headers: &HeaderMap,
) -> Result<Admission, Failure> {
    // What can be refused without the body is refused before any of it is read.
    let announced = json_body_size(headers, state.config.body_limit)?;
    admit_bytes(state, tenant, announced).await
}

/// Admits a run of `tenant` holding `announced` bytes of input in memory (an
/// extension's call, an MCP tool's, whose body is read): the tenant's bound, a slot or a place in the queue,
/// and the body budget, else 429.
pub(crate) async fn admit_bytes(
    state: &AppState,
    tenant: &Tenant,
    announced: usize,
) -> Result<Admission, Failure> {
    let metrics = &state.metrics;
    let Some(tenant_run) = state.tenant_run(tenant) else {
        metrics.rejected_overloaded.fetch_add(1, Ordering::Relaxed);
        return Err(Failure::overloaded(
            format!(
                "tenant {} has {} runs running or waiting, its most; retry later",
                tenant.as_str(),
                state.config.tenant_max_runs
            ),
            1,
        ));
    };
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
    // The body is read only after this, within the bytes all bodies in memory may take
    // together, and held to that budget until the run ends.
    let body_bytes = hold_body_bytes(state, tenant, announced)?;
    Ok(Admission {
        _tenant_run: tenant_run,
        _slot: permit,
        _body_bytes: body_bytes,
    })
}

/// Records that `tenant` may read `files`: a tenant downloads only what its runs made.
pub(crate) async fn grant(
    state: &AppState,
    tenant: &Tenant,
    files: &[ArtifactInfo],
) -> Result<(), Failure> {
    for file in files {
        state
            .owners
            .grant(tenant.as_str(), &file.sha256, file.size, &file.content_type)
            .await?;
    }
    Ok(())
}

/// `bytes` of the budget of request bodies, file reads and answers in memory
/// (`--max-body-bytes-in-flight`), and of `tenant`'s share of it on a server with API
/// keys, held until the hold is dropped; 429 when they are not free now.
pub(crate) fn hold_body_bytes(
    state: &AppState,
    tenant: &Tenant,
    bytes: usize,
) -> Result<BodyHold, Failure> {
    let overloaded = |message: String| {
        state
            .metrics
            .rejected_overloaded
            .fetch_add(1, Ordering::Relaxed);
        Failure::overloaded(message, 1)
    };
    // The tenant's share first: one tenant's holds never take the whole budget.
    let share = match &state.body_shares {
        Some(shares) => Some(shares.take(&tenant.0, bytes).ok_or_else(|| {
            overloaded(format!(
                "tenant {} holds its share of the server's request bodies, file reads and answers in memory ({} bytes, half of --max-body-bytes-in-flight); retry once its others are done",
                tenant.as_str(),
                shares.limit
            ))
        })?),
        None => None,
    };
    let permit = state
        .body_bytes
        .clone()
        .try_acquire_many_owned(u32::try_from(bytes).unwrap_or(u32::MAX))
        .map_err(|_| {
            overloaded(
                "the server holds as many request bodies and file reads as it may; retry later"
                    .into(),
            )
        })?;
    Ok(BodyHold {
        _permit: permit,
        _share: share,
    })
}

/// Bytes held in memory for a request body, a file read or an answer: their place in
/// the server's budget and, with API keys, in their tenant's share of it; both given
/// back when this drops.
#[derive(Debug)]
pub struct BodyHold {
    _permit: OwnedSemaphorePermit,
    _share: Option<ShareHold>,
}

/// Each tenant's share of the budget of bytes in memory, on a server with API keys:
/// at most half of it (or one body, if that is more) at once, so that a tenant whose
/// clients stall (reading answers slowly, or sending bodies slowly) holds others off
/// half of it at most.
#[derive(Debug)]
pub(crate) struct BodyShares {
    pub(crate) limit: usize,
    held: std::sync::Mutex<HashMap<Arc<str>, usize>>,
}

impl BodyShares {
    pub(crate) fn new(budget: usize, body_limit: usize) -> Arc<BodyShares> {
        Arc::new(BodyShares {
            limit: (budget / 2).max(body_limit).min(budget),
            held: std::sync::Mutex::default(),
        })
    }

    fn take(self: &Arc<Self>, tenant: &Arc<str>, bytes: usize) -> Option<ShareHold> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let now = held.get(tenant).copied().unwrap_or(0);
        if now.saturating_add(bytes) > self.limit {
            return None;
        }
        held.insert(tenant.clone(), now + bytes);
        Some(ShareHold {
            shares: self.clone(),
            tenant: tenant.clone(),
            bytes,
        })
    }
}

/// A tenant's bytes in its share, given back on drop.
#[derive(Debug)]
struct ShareHold {
    shares: Arc<BodyShares>,
    tenant: Arc<str>,
    bytes: usize,
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(now) = held.get_mut(&self.tenant) {
            *now = now.saturating_sub(self.bytes);
            if *now == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

/// The body size to budget for a JSON request, from its headers: 415 unless it says
/// JSON, 413 when it announces more than `limit` (an unannounced, chunked body is
/// budgeted at `limit`, and reading stops there).
pub(crate) fn json_body_size(headers: &HeaderMap, limit: usize) -> Result<usize, Failure> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase())
        .is_some_and(|v| {
            v == "application/json" || (v.starts_with("application/") && v.ends_with("+json"))
        });
    if !json {
        return Err(Failure::new(
            ErrorCode::UnsupportedMediaType,
            "request body: expected `Content-Type: application/json`",
        ));
    }
    body_size(headers, limit)
}

/// The body size to budget for a request of any content type, from its headers: 413
/// when it announces more than `limit`, else what it announces, or `limit` for an
/// unannounced (chunked) body, whose reading stops there.
pub(crate) fn body_size(headers: &HeaderMap, limit: usize) -> Result<usize, Failure> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match announced {
        Some(size) if size > limit as u64 => Err(too_large(limit)),
        Some(size) => Ok(size as usize),
        None => Ok(limit),
    }
}

fn too_large(limit: usize) -> Failure {
    Failure::new(
        ErrorCode::PayloadTooLarge,
        format!("request body: larger than {limit} bytes"),
    )
}

/// Reads at most `limit` bytes of body within `deadline`: 413 past `limit`, 504 when
/// it is not all there in time.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<axum::body::Bytes, Failure> {
    match tokio::time::timeout(deadline, axum::body::to_bytes(body, limit)).await {
        Err(_) => Err(Failure::new(
            ErrorCode::Timeout,
            format!("request body: not received within {} s", deadline.as_secs()),
        )),
        Ok(Err(e)) => {
            let too_big = std::error::Error::source(&e)
                .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
            Err(if too_big {
                too_large(limit)
            } else {
                Failure::new(ErrorCode::Invalid, format!("request body: {e}"))
            })
        }
        Ok(Ok(bytes)) => Ok(bytes),
    }
}

/// Reads at most `limit` bytes of body within `deadline` ([`read_body`]) and parses
/// them as `T`; an error names the field that did not fit.
pub(crate) async fn read_json<T: serde::de::DeserializeOwned>(
    body: Body,
    limit: usize,
    deadline: Duration,
) -> Result<T, Failure> {
    let bytes = read_body(body, limit, deadline).await?;
    let mut parser = serde_json::Deserializer::from_slice(&bytes);
    serde_path_to_error::deserialize(&mut parser).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path == "." {
            format!("request body: {inner}")
        } else {
            format!("request body: {path}: {inner}")
        };
        Failure::new(ErrorCode::Invalid, message)
    })
}

#[derive(Debug, Deserialize)]
pub(crate) struct ObjectQuery {
    name: Option<String>,
}

/// Download an artifact by its sha256 (`?name=` sets the file name it is saved as).
/// Only a run of the caller's own tenant makes an object readable; any other is 404,
/// whether or not it exists. `Range: bytes=A-B` gives one part (206).
#[utoipa::path(
    get,
    path = "/v1/objects/{sha256}",
    params(("sha256" = String, Path, description = "64 lowercase hex digits"), ("name" = Option<String>, Query, description = "file name for Content-Disposition")),
    responses(
        (status = 200, description = "The artifact's bytes, as the content type it was stored with"),
        (status = 206, description = "The requested range"),
        (status = 400, description = "Not a sha256", body = ApiError),
        (status = 404, description = "No such artifact of this tenant", body = ApiError),
        (status = 416, description = "The range is outside the artifact"),
    )
)]
pub(crate) async fn get_object(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    method: Method,
    headers: HeaderMap,
    Path(sha256): Path<String>,
    Query(query): Query<ObjectQuery>,
) -> Result<Response, Failure> {
    let store = state.runner.store();
    if !is_sha256_hex(&sha256) {
        return Err(Failure::new(
            ErrorCode::Invalid,
            format!("{sha256:?} is not a sha256 (64 lowercase hex digits)"),
        ));
    }
    let missing = || Failure::new(ErrorCode::NotFound, format!("no artifact {sha256}"));
    let owned = state
        .owners
        .get(tenant.as_str(), &sha256)
        .await?
        .ok_or_else(missing)?;
    let size = store.head(&sha256).await?.ok_or_else(missing)?;
    let mut builder = Response::builder().header(header::ACCEPT_RANGES, "bytes");
    if let Some(headers) = builder.headers_mut() {
        // The type it was stored as: never one a query can choose.
        let name = query.name.as_deref().unwrap_or(&sha256);
        headers.extend(crate::download::download_headers(&owned.content_type, name));
    }
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|v| byte_range(v, size));
    let response = match (method == Method::HEAD, range) {
        (true, _) => builder
            .header(header::CONTENT_LENGTH, size)
            .body(Body::empty()),
        (false, Some(Some(Err(())))) => builder
            .status(StatusCode::RANGE_NOT_SATISFIABLE)
            .header(header::CONTENT_RANGE, format!("bytes */{size}"))
            .body(Body::empty()),
        (false, Some(Some(Ok(range)))) => {
            let part = store.get_range(&sha256, range.clone()).await?;
            builder
                .status(StatusCode::PARTIAL_CONTENT)
                .header(header::CONTENT_LENGTH, part.size)
                .header(
                    header::CONTENT_RANGE,
                    format!("bytes {}-{}/{size}", range.start, range.end - 1),
                )
                .body(Body::from_stream(part.stream))
        }
        // No Range, or one this server does not read (several ranges, other units):
        // the whole object, as RFC 9110 allows.
        (false, Some(None) | None) => {
            let whole = store.get_stream(&sha256).await?;
            builder
                .header(header::CONTENT_LENGTH, whole.size)
                .body(Body::from_stream(whole.stream))
        }
    };
    response.map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))
}

/// One `bytes=` range of an object of `size` bytes: `None` when the header is not one
/// range this server reads (it then sends the whole object), `Err` when the range lies
/// outside the object (416).
fn byte_range(header: &str, size: u64) -> Option<Result<std::ops::Range<u64>, ()>> {
    let spec = header.trim().strip_prefix("bytes=")?.trim();
    if spec.contains(',') {
        return None;
    }
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        // The last N bytes.
        let n: u64 = last.parse().ok()?;
        if n == 0 {
            return Some(Err(()));
        }
        size.saturating_sub(n)..size
    } else {
        let start: u64 = first.parse().ok()?;
        let end = if last.is_empty() {
            size
        } else {
            let last: u64 = last.parse().ok()?;
            if last < start {
                return None;
            }
            last.saturating_add(1).min(size)
        };
        start..end
    };
    Some(if range.start < range.end {
        Ok(range)
    } else {
        Err(())
    })
}

/// Liveness.
#[utoipa::path(get, path = "/healthz", responses((status = 200, description = "ok")))]
pub(crate) async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// Prometheus metrics.
#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format")))]
pub(crate) async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let mut text = state.metrics.render();
    if let Some(warm) = state.runner.backends().native_warm() {
        text.push_str(&format!(
            "# HELP skillbox_warm_sandboxes_ready Native sandboxes made ahead and ready now.\n\
             # TYPE skillbox_warm_sandboxes_ready gauge\nskillbox_warm_sandboxes_ready {}\n\
             # HELP skillbox_warm_sandboxes_total Native sandboxes asked for in a shape the pool makes: taken (made ahead) or missed (none ready, made on the spot).\n\
             # TYPE skillbox_warm_sandboxes_total counter\n\
             skillbox_warm_sandboxes_total{{outcome=\"taken\"}} {}\n\
             skillbox_warm_sandboxes_total{{outcome=\"missed\"}} {}\n",
            warm.ready, warm.taken, warm.missed
        ));
    }
    for extension in &state.extensions {
        text.push_str(&extension.metrics().await);
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_as_rfc_9110_says() {
        assert_eq!(byte_range("bytes=0-9", 100), Some(Ok(0..10)));
        assert_eq!(byte_range("bytes=90-", 100), Some(Ok(90..100)));
        assert_eq!(byte_range("bytes=-10", 100), Some(Ok(90..100)));
        assert_eq!(byte_range("bytes=-1000", 100), Some(Ok(0..100)));
        assert_eq!(byte_range("bytes=95-1000", 100), Some(Ok(95..100)));
        assert_eq!(byte_range("bytes=100-", 100), Some(Err(())));
        assert_eq!(byte_range("bytes=-0", 100), Some(Err(())));
        // Not read: the whole object goes out.
        assert_eq!(byte_range("bytes=0-1,5-6", 100), None);
        assert_eq!(byte_range("items=0-1", 100), None);
        assert_eq!(byte_range("bytes=5-1", 100), None);
        assert_eq!(byte_range("bytes=x-1", 100), None);
    }
}
