//! Sessions: one sandbox kept open across many steps, as agent frameworks drive one
//! (write a file, run, read the error, fix, run again).
//!
//! A session belongs to the tenant that opened it (another tenant gets 404, as for a
//! session that is not there). Everything goes through its `ExecutionEnv`: no host path
//! is ever touched for it. Exec output is streamed as NDJSON while the command runs; a
//! client that goes away cancels its exec (the whole process tree dies), and so does
//! `POST …/execs/{execId}/cancel`. A session ends when it is deleted, after its idle
//! timeout (no call and nothing running), past its lifetime, or when the server shuts
//! down; its sandbox goes with it, and with a `scopeKey` its workspace is saved first
//! (not at shutdown).

pub(crate) mod exec;
pub(crate) mod files;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use skillbox_door::{Refusal, Reservation, SessionBounds, SessionTable};
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, ExecutionEnv, Limits, SandboxPolicy, SandboxSpec,
};
use skillbox_protocol::{
    ApiError, ErrorCode, MAX_TIMEOUT_MS, SessionCreateRequest, SessionInfo, SessionList,
    SkillsPlaced, SnapshotReport,
};
use skillbox_run::{RunError, Scope};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{hold_body_bytes, json_body_size, read_json};
use crate::state::AppState;

/// Execs running at once in one session.
const MAX_EXECS: usize = 4;
/// The largest `POST /v1/sessions` body.
const MAX_CREATE_BODY: usize = 64 * 1024;
/// How often the reaper looks.
const REAP_EVERY: Duration = Duration::from_secs(2);

/// How many sessions a server keeps open, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct SessionConfig {
    /// How many are open at once, in all and per tenant.
    pub bounds: SessionBounds,
    pub default_idle: Duration,
    pub max_idle: Duration,
    pub default_lifetime: Duration,
    pub max_lifetime: Duration,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            bounds: SessionBounds::default(),
            default_idle: Duration::from_secs(600),
            max_idle: Duration::from_secs(3600),
            default_lifetime: Duration::from_secs(3600),
            max_lifetime: Duration::from_secs(24 * 3600),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// `prefix` and `bytes` random bytes in hex: a session's or an exec's id.
fn new_id(prefix: &str, bytes: usize) -> Result<String, Failure> {
    let random = skillbox_protocol::random::hex(bytes)
        .map_err(|e| Failure::new(ErrorCode::Unavailable, format!("no {prefix}id: {e}")))?;
    Ok(format!("{prefix}{random}"))
}

/// One open session.
pub(crate) struct Session {
    id: String,
    tenant: Arc<str>,
    backend: BackendKind,
    env: Box<dyn ExecutionEnv>,
    created: Instant,
    created_ms: u64,
    open_ms: u64,
    idle_timeout: Duration,
    max_lifetime: Duration,
    last_used: Mutex<(Instant, u64)>,
    running: AtomicUsize,
    /// The cancel of each running exec, by id.
    execs: Mutex<HashMap<String, CancellationToken>>,
    /// Cancelled when the session ends: every exec with it.
    ending: CancellationToken,
    scope: Option<Scope>,
    skills: Option<SkillsPlaced>,
    snapshot: Mutex<Option<SnapshotReport>>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("id", &self.id)
            .field("tenant", &self.tenant)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Session {
    fn touch(&self) {
        if let Ok(mut last) = self.last_used.lock() {
            *last = (Instant::now(), now_ms());
        }
    }

    fn info(&self) -> SessionInfo {
        let last_ms = self
            .last_used
            .lock()
            .map(|l| l.1)
            .unwrap_or(self.created_ms);
        SessionInfo {
            id: self.id.clone(),
            backend: self.backend,
            created_at_ms: self.created_ms,
            last_used_at_ms: last_ms,
            expires_at_ms: self.created_ms + self.max_lifetime.as_millis() as u64,
            idle_timeout_ms: self.idle_timeout.as_millis() as u64,
            execs_running: self.running.load(Ordering::SeqCst),
            open_ms: self.open_ms,
            skills: self.skills.clone(),
            snapshot: self.snapshot.lock().ok().and_then(|s| s.clone()),
            egress: self.env.egress(),
        }
    }

    /// Why the reaper should end it now, if it should.
    fn expired(&self) -> Option<&'static str> {
        if self.created.elapsed() >= self.max_lifetime {
            return Some("its lifetime is over");
        }
        let idle_since = self.last_used.lock().map(|l| l.0).unwrap_or(self.created);
        if self.running.load(Ordering::SeqCst) == 0 && idle_since.elapsed() >= self.idle_timeout {
            return Some("it was idle too long");
        }
        None
    }
}

/// The open sessions of a server: the door's one table of kept sandboxes, bounded by
/// `config.bounds`.
#[derive(Debug, Default)]
pub struct Sessions {
    table: SessionTable<String, Session>,
    config: SessionConfig,
}

impl Sessions {
    pub fn new(config: SessionConfig) -> Sessions {
        Sessions {
            table: SessionTable::new(config.bounds),
            config,
        }
    }

    fn get(&self, tenant: &Tenant, id: &str) -> Result<Arc<Session>, Failure> {
        self.table
            .get(tenant.as_str(), &id.to_string())
            .ok_or_else(|| {
                Failure::new(
                    ErrorCode::NotFound,
                    format!("no session {id} (it ended, or it never was yours)"),
                )
            })
    }

    /// Takes a place for session `id` of `tenant`, or says why there is none.
    fn reserve(
        &self,
        id: &str,
        tenant: &Tenant,
    ) -> Result<Reservation<'_, String, Session>, Failure> {
        self.table
            .reserve(id.to_string(), &tenant.0)
            .map_err(|refused| match refused {
                Refusal::Closed => shutting_down(),
                refused => Failure::overloaded(refused.message("sessions", "delete one"), 5),
            })
    }

    fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.table.remove(&id.to_string())
    }

    /// Every session past its idle timeout or lifetime, taken out of the table.
    fn expired(&self) -> Vec<(Arc<Session>, &'static str)> {
        self.table.take_ended(Session::expired)
    }

    /// Takes every session out, and opens none from now on (the server shutting down).
    fn drain(&self) -> Vec<Arc<Session>> {
        self.table.drain()
    }
}

/// Ends `session`: its execs cancelled, its workspace saved to its scope when `save`,
/// its sandbox removed.
async fn close(state: &AppState, session: Arc<Session>, save: bool, why: &str) -> SessionInfo {
    session.ending.cancel();
    // The execs' tasks end on the cancel; their sandbox calls return promptly.
    let wait = Instant::now();
    while session.running.load(Ordering::SeqCst) > 0 && wait.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if save && let Some(scope) = &session.scope {
        let mut report = session
            .snapshot
            .lock()
            .ok()
            .and_then(|s| s.clone())
            .unwrap_or_default();
        let cancel = CancellationToken::new();
        if let Err(e) = state
            .runner
            .save_scope(session.env.as_ref(), scope, &mut report, &cancel)
            .await
        {
            report.error = Some(e.to_string());
        }
        if let Ok(mut snapshot) = session.snapshot.lock() {
            *snapshot = Some(report);
        }
    }
    if let Err(e) = session.env.cleanup().await {
        tracing::warn!(session = %session.id, error = %e, "sessions: cleanup failed");
    }
    tracing::info!(session = %session.id, why, "sessions: ended");
    session.info()
}

/// Ends idle and expired sessions every [`REAP_EVERY`] until `shutdown`; then every one.
pub async fn reap(state: AppState, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(REAP_EVERY) => {}
        }
        for (session, why) in state.sessions.expired() {
            close(&state, session, true, why).await;
        }
    }
}

/// Ends every session (the server shutting down): nothing is left behind.
pub async fn close_all(state: &AppState) {
    for session in state.sessions.drain() {
        close(state, session, false, "the server is shutting down").await;
    }
}

/// 503 to a session asked for once the server's shutdown began.
fn shutting_down() -> Failure {
    Failure::new(
        ErrorCode::Unavailable,
        "the server is shutting down; no session opens now (open one once it is back)",
    )
}

fn run_failure(e: RunError) -> Failure {
    Failure::new(e.code(), e.to_string())
}

fn env_failure(e: EnvError) -> Failure {
    e.into()
}

/// A bound the request asks for: within the server's, never looser (the runner's rule).
fn tighter(
    field: &str,
    asked: Option<u64>,
    server: Option<u64>,
    least: u64,
) -> Result<Option<u64>, Failure> {
    skillbox_run::tighter(field, asked, server, least).map_err(run_failure)
}

fn duration_field(
    field: &str,
    asked: Option<u64>,
    default: Duration,
    max: Duration,
) -> Result<Duration, Failure> {
    match asked {
        None => Ok(default),
        Some(0) => Err(Failure::new(
            ErrorCode::Invalid,
            format!("{field}: must be more than 0"),
        )),
        Some(ms) if Duration::from_millis(ms) > max => Err(Failure::new(
            ErrorCode::Invalid,
            format!("{field}: at most {} on this server", max.as_millis()),
        )),
        Some(ms) => Ok(Duration::from_millis(ms)),
    }
}

/// Open a session: a sandbox kept until it is deleted, idle too long or past its
/// lifetime.
#[utoipa::path(
    post,
    path = "/v1/sessions",
    request_body = SessionCreateRequest,
    responses(
        (status = 201, description = "Open", body = SessionInfo),
        (status = 400, description = "Bad request: the message names the field", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 415, description = "Not `Content-Type: application/json`", body = ApiError),
        (status = 429, description = "As many sessions open as the server or this tenant may have, or as many request bodies held as the server may", body = ApiError),
        (status = 503, description = "The backend, or the scope's snapshot, is not available; or the server is shutting down", body = ApiError),
        (status = 504, description = "The body was not received within --body-timeout", body = ApiError),
    )
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
) -> Result<(StatusCode, Json<SessionInfo>), Failure> {
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    // Refused by its headers before any of it is read; read within the body budget.
    let announced = json_body_size(&parts.headers, MAX_CREATE_BODY)?;
    let held = hold_body_bytes(&state, &tenant, announced)?;
    let request: SessionCreateRequest =
        read_json(body, MAX_CREATE_BODY, state.config.body_timeout).await?;
    drop(held);
    // Sessions are closed as the shutdown begins: one asked for since is not opened.
    if state.runs_cancel().is_cancelled() {
        return Err(shutting_down());
    }
    let kind = skillbox_door::sandboxed(request.backend)?.kind();
    let config = state.sessions.config;
    let idle = duration_field(
        "idleTimeoutMs",
        request.idle_timeout_ms,
        config.default_idle,
        config.max_idle,
    )?;
    let lifetime = duration_field(
        "maxLifetimeMs",
        request.max_lifetime_ms,
        config.default_lifetime,
        config.max_lifetime,
    )?;
    if let Some(network) = &request.network {
        skillbox_egress::Rules::new(network)
            .map_err(|e| Failure::new(ErrorCode::Invalid, e.to_string()))?;
    }
    let base = state.runner.limits().clone();
    let asked = request.limits.clone().unwrap_or_default();
    // An exec's time is bounded as a run's and an MCP exec's are: a session does not
    // hold a command longer than `POST /v1/run` could.
    let timeout_ms = match asked.timeout_ms {
        None => base.timeout_ms.min(MAX_TIMEOUT_MS),
        Some(ms) if ms == 0 || ms > MAX_TIMEOUT_MS => {
            return Err(Failure::new(
                ErrorCode::Invalid,
                format!("limits.timeoutMs: between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        Some(ms) => ms,
    };
    let limits = Limits {
        timeout_ms,
        memory_bytes: tighter(
            "memoryBytes",
            asked.memory_bytes,
            base.memory_bytes,
            16 * 1024 * 1024,
        )?,
        pids: tighter(
            "pids",
            asked.pids.map(u64::from),
            base.pids.map(u64::from),
            1,
        )?
        .map(|p| p as u32),
        disk_bytes: tighter(
            "diskBytes",
            asked.disk_bytes,
            base.disk_bytes,
            skillbox_env::MIN_DISK_BYTES,
        )?,
        ..base
    };
    let id = new_id("ses_", 16)?;
    // On a shared database, the id names this node, where the session lives.
    let id = match &state.cluster {
        Some(cluster) => cluster.session_id(&id),
        None => id,
    };
    let place = state.sessions.reserve(&id, &tenant)?;
    let skills = state
        .runner
        .plan_skills(&request.skills, tenant.as_str())
        .await
        .map_err(run_failure)?;
    let scope = match &request.scope_key {
        Some(key) => Some(
            state
                .runner
                .scope(tenant.as_str(), key)
                .map_err(run_failure)?,
        ),
        None => None,
    };
    let mut policy = SandboxPolicy {
        network: request.network.clone(),
        egress_bytes: asked.egress_bytes,
        ..SandboxPolicy::default()
    };
    state
        .runner
        .runtime_mount(kind, &mut policy)
        .await
        .map_err(run_failure)?;
    let spec = SandboxSpec {
        workspace: None,
        root: state.runner.root().clone(),
        limits,
        policy,
    };
    let env = state
        .runner
        .backends()
        .create(kind, spec)
        .await
        .map_err(env_failure)?;
    let cancel = CancellationToken::new();
    let prepared = async {
        let mut snapshot = None;
        if let Some(scope) = &scope {
            let (report, _restored) = state
                .runner
                .restore_scope(env.as_ref(), scope, &cancel)
                .await?;
            snapshot = Some(report);
        }
        let placed = match &skills {
            Some(skills) => Some(
                state
                    .runner
                    .place_skills(env.as_ref(), skills, &cancel)
                    .await?,
            ),
            None => None,
        };
        Ok::<_, RunError>((snapshot, placed))
    }
    .await;
    let (snapshot, placed) = match prepared {
        Ok(done) => done,
        Err(e) => {
            let _ = env.cleanup().await;
            return Err(run_failure(e));
        }
    };
    let created_ms = now_ms();
    let session = Arc::new(Session {
        id,
        tenant: tenant.0.clone(),
        backend: kind,
        env,
        created: Instant::now(),
        created_ms,
        open_ms: started.elapsed().as_millis() as u64,
        idle_timeout: idle,
        max_lifetime: lifetime,
        last_used: Mutex::new((Instant::now(), created_ms)),
        running: AtomicUsize::new(0),
        execs: Mutex::new(HashMap::new()),
        ending: CancellationToken::new(),
        scope,
        skills: placed,
        snapshot: Mutex::new(snapshot),
    });
    let info = session.info();
    // The shutdown drains the table (closing it) after it cancels: a session opened
    // meanwhile is either drained with the others or, once it is closed, not opened.
    let kept = if state.runs_cancel().is_cancelled() {
        Err(session)
    } else {
        place.fill(session)
    };
    if let Err(session) = kept {
        if let Err(e) = session.env.cleanup().await {
            tracing::warn!(session = %session.id, error = %e, "sessions: cleanup failed");
        }
        return Err(shutting_down());
    }
    tracing::info!(session = %info.id, backend = %kind.as_str(), open_ms = info.open_ms, "sessions: opened");
    Ok((StatusCode::CREATED, Json(info)))
}

/// This tenant's open sessions.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    responses((status = 200, description = "This tenant's open sessions", body = SessionList))
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    headers: axum::http::HeaderMap,
) -> Json<SessionList> {
    let mut sessions: Vec<SessionInfo> = state
        .sessions
        .table
        .of_tenant(tenant.as_str())
        .iter()
        .map(|s| s.info())
        .collect();
    // On a shared database, the tenant's sessions on the other nodes too (unless this
    // is one of those asks).
    if let Some(cluster) = &state.cluster
        && !headers.contains_key(&crate::cluster::FORWARDED_BY)
    {
        sessions.extend(crate::cluster::sessions_elsewhere(cluster, &headers).await);
    }
    sessions.sort_by_key(|s| s.created_at_ms);
    Json(SessionList { sessions })
}

/// One session.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session", body = SessionInfo),
        (status = 404, description = "No such session of this tenant", body = ApiError),
    )
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<SessionInfo>, Failure> {
    Ok(Json(state.sessions.get(&tenant, &id)?.info()))
}

/// End a session: its execs cancelled, its workspace saved to its scope (if it has
/// one), its sandbox removed.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "Ended; the snapshot saved, if it has a scope", body = SessionInfo),
        (status = 404, description = "No such session of this tenant", body = ApiError),
    )
)]
pub(crate) async fn delete(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<SessionInfo>, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    let Some(session) = state.sessions.remove(&session.id) else {
        return Err(Failure::new(
            ErrorCode::NotFound,
            format!("no session {id}"),
        ));
    };
    Ok(Json(close(&state, session, true, "deleted").await))
}
