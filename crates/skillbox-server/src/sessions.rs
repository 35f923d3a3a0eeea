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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use serde::Deserialize;
use skillbox_door::{Refusal, Reservation, SessionBounds, SessionTable};
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, ExecEvent, ExecRequest, ExecutionEnv, Limits,
    SandboxPolicy, SandboxSpec,
};
use skillbox_pace::{AnswerDeadline, DeadlineSlot, Paced};
use skillbox_protocol::{
    ApiError, Encoding, ErrorCode, MAX_TIMEOUT_MS, SessionCreateRequest, SessionExecEvent,
    SessionExecRequest, SessionFileEntry, SessionInfo, SessionList, SessionListing, SkillsPlaced,
    SnapshotReport,
};
use skillbox_run::{RunError, Scope};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{BodyHold, body_size, hold_body_bytes, json_body_size, read_body, read_json};
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
) -> Json<SessionList> {
    let mut sessions: Vec<SessionInfo> = state
        .sessions
        .table
        .of_tenant(tenant.as_str())
        .iter()
        .map(|s| s.info())
        .collect();
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

/// Text from output chunks, never splitting a UTF-8 character between two events.
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn push(&mut self, chunk: &[u8]) -> String {
        self.0.extend_from_slice(chunk);
        let cut = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(cut);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0.clear();
        text
    }
}

fn ndjson(event: &SessionExecEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// Counts a running exec while alive.
struct Running(Arc<Session>, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut execs) = self.0.execs.lock() {
            execs.remove(&self.1);
        }
        self.0.touch();
    }
}

/// Run a command in the session, streaming its output as NDJSON.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/exec",
    params(("id" = String, Path, description = "The session's id")),
    request_body = SessionExecRequest,
    responses(
        (status = 200, description = "NDJSON, one SessionExecEvent a line: started, stdout/stderr chunks as they come, then exit (or error)", body = SessionExecEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Bad request: the message names the field", body = ApiError),
        (status = 404, description = "No such session of this tenant", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 415, description = "Not `Content-Type: application/json`", body = ApiError),
        (status = 429, description = "As many execs running in this session as it takes, or as many request bodies held as the server may", body = ApiError),
        (status = 504, description = "The body was not received within --body-timeout", body = ApiError),
    )
)]
pub(crate) async fn exec(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(id): UrlPath<String>,
    request: Request,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    let (parts, body) = request.into_parts();
    // Everything that can refuse the exec without its body does so before any of it is
    // read: the headers, the session's bound on execs, the budget of bodies in memory.
    let announced = json_body_size(&parts.headers, state.config.body_limit)?;
    if session.running.fetch_add(1, Ordering::SeqCst) >= MAX_EXECS {
        session.running.fetch_sub(1, Ordering::SeqCst);
        return Err(Failure::overloaded(
            format!("{MAX_EXECS} execs are running in this session; wait for one to end"),
            1,
        ));
    }
    let exec_id = match new_id("exe_", 8) {
        Ok(id) => id,
        Err(e) => {
            session.running.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
    };
    // Counted from here: a body still arriving holds its place among the session's execs.
    let running = Running(session.clone(), exec_id.clone());
    let held = hold_body_bytes(&state, &tenant, announced)?;
    let request: SessionExecRequest =
        read_json(body, state.config.body_limit, state.config.body_timeout).await?;
    drop(held);
    let mut exec = match (request.command.is_empty(), &request.shell) {
        (false, None) => ExecRequest::argv(request.command.clone()),
        (true, Some(script)) => ExecRequest::shell(script.clone()),
        _ => {
            return Err(Failure::new(
                ErrorCode::Invalid,
                "give exactly one of command (an argv) and shell (a script for /bin/sh -c)",
            ));
        }
    };
    let door = state.runner.workspace(session.env.as_ref());
    exec.cwd = Some(match &request.cwd {
        Some(cwd) => door.absolute(&door.parse(cwd, "cwd")?),
        None => door.root().as_path().to_path_buf(),
    });
    exec.env = request.env.clone();
    if let Some(stdin) = request.stdin {
        exec.stdin = Some(match request.stdin_encoding {
            Encoding::Utf8 => stdin.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(stdin.trim())
                .map_err(|e| {
                    Failure::new(ErrorCode::Invalid, format!("stdin: not valid base64: {e}"))
                })?,
        });
    }
    if let Some(ms) = request.timeout_ms {
        if ms == 0 || ms > MAX_TIMEOUT_MS {
            return Err(Failure::new(
                ErrorCode::Invalid,
                format!("timeoutMs: between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        exec.timeout = Some(Duration::from_millis(ms));
    }
    exec.validate().map_err(env_failure)?;
    session.touch();
    let cancel = session.ending.child_token();
    if let Ok(mut execs) = session.execs.lock() {
        execs.insert(exec_id.clone(), cancel.clone());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let after = session.clone();
    let relay = async move {
        let _running = running;
        // The client going away drops the body, and with it the receiver: the exec is
        // cancelled then, its whole process tree with it.
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            let cancel = cancel.clone();
            async move {
                if tx.send(Ok(bytes)).await.is_err() {
                    cancel.cancel();
                }
            }
        };
        send(ndjson(&SessionExecEvent::Started {
            exec_id: exec_id.clone(),
        }))
        .await;
        let started = Instant::now();
        // A cancel ends the stream with exit, cancelled: whether it came while the
        // command was being started or once it ran (its duration is until the cancel
        // ended it).
        let cancelled = || {
            ndjson(&SessionExecEvent::Exit {
                exit_code: None,
                signal: Some(libc_sigkill()),
                timed_out: false,
                limit_hit: None,
                duration_ms: started.elapsed().as_millis() as u64,
                truncated: skillbox_protocol::Truncated::default(),
                cancelled: true,
            })
        };
        let env = &session.env;
        let mut stream = match env.exec_stream(exec, &cancel).await {
            Ok(stream) => stream,
            Err(e) if e.code == ErrorCode::Aborted => {
                send(cancelled()).await;
                return;
            }
            Err(e) => {
                send(ndjson(&SessionExecEvent::Error {
                    code: e.code.as_str().to_string(),
                    message: e.to_string(),
                }))
                .await;
                return;
            }
        };
        let (mut out, mut err) = (Utf8Carry::default(), Utf8Carry::default());
        // A command that writes nothing never learns from a send that its client went
        // away: the receiver's drop (the body's) cancels it too.
        let mut watching = true;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = tx.closed(), if watching => {
                    watching = false;
                    cancel.cancel();
                    continue;
                }
            };
            let Some(event) = event else {
                return;
            };
            match event {
                Ok(ExecEvent::Stdout(chunk)) => {
                    let data = out.push(&chunk);
                    if !data.is_empty() {
                        send(ndjson(&SessionExecEvent::Stdout { data })).await;
                    }
                }
                Ok(ExecEvent::Stderr(chunk)) => {
                    let data = err.push(&chunk);
                    if !data.is_empty() {
                        send(ndjson(&SessionExecEvent::Stderr { data })).await;
                    }
                }
                Ok(ExecEvent::Exit(output)) => {
                    for (carry, stdout) in [(&mut out, true), (&mut err, false)] {
                        let data = carry.finish();
                        if !data.is_empty() {
                            let event = if stdout {
                                SessionExecEvent::Stdout { data }
                            } else {
                                SessionExecEvent::Stderr { data }
                            };
                            send(ndjson(&event)).await;
                        }
                    }
                    send(ndjson(&SessionExecEvent::Exit {
                        exit_code: output.exit_code,
                        signal: output.signal,
                        timed_out: output.timed_out,
                        limit_hit: output.limit_hit,
                        duration_ms: output.duration_ms,
                        truncated: output.truncated,
                        cancelled: false,
                    }))
                    .await;
                    return;
                }
                Err(e) if e.code == ErrorCode::Aborted => {
                    send(cancelled()).await;
                    return;
                }
                Err(e) => {
                    send(ndjson(&SessionExecEvent::Error {
                        code: e.code.as_str().to_string(),
                        message: e.to_string(),
                    }))
                    .await;
                    return;
                }
            }
        }
    };
    tokio::spawn(async move {
        relay.await;
        // The answer is complete (its body ended with the relay): the session's next
        // exec gets ready now, so it pays only for its command.
        after.env.prepare_next().await;
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

fn libc_sigkill() -> i32 {
    9
}

/// Cancel one running exec: its whole process tree inside the sandbox dies.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/execs/{exec_id}/cancel",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("exec_id" = String, Path, description = "The exec's id, from its `started` event"),
    ),
    responses(
        (status = 200, description = "Cancelled (its stream ends with exit, cancelled true)"),
        (status = 404, description = "No such session of this tenant, or no such exec running", body = ApiError),
    )
)]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, exec_id)): UrlPath<(String, String)>,
) -> Result<Json<serde_json::Value>, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let token = session
        .execs
        .lock()
        .ok()
        .and_then(|execs| execs.get(&exec_id).cloned())
        .ok_or_else(|| {
            Failure::new(
                ErrorCode::NotFound,
                format!("no exec {exec_id} running in session {id}"),
            )
        })?;
    token.cancel();
    Ok(Json(serde_json::json!({"cancelled": exec_id})))
}

/// Read a file of the session's `/workspace`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 404, description = "No such session, or no such file", body = ApiError),
        (status = 429, description = "As many request bodies and file reads held as the server may", body = ApiError),
    )
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    deadline: Option<Extension<AnswerDeadline>>,
    UrlPath((id, path)): UrlPath<(String, String)>,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.parse_url(&path, "path")?;
    let shown = door.absolute(&path);
    let cancel = session.ending.child_token();
    let size = door
        .sized_file(
            &path,
            state.runner.read_caps().http,
            &format!("list a directory with GET /v1/sessions/{id}/ls, read a part of a file with an exec (head -c, tail -c)"),
            &cancel,
        )
        .await?;
    // The bytes stay in memory until they are sent, so they are held within the budget
    // of bytes in memory that request bodies count against, from before the read until
    // the last of them is sent; as many as the size above, which the read itself holds
    // against a file that grew or was swapped for a bigger one since.
    let held = hold_answer(
        &state,
        &tenant,
        usize::try_from(size).unwrap_or(usize::MAX),
        |budget| {
            format!(
                "{}: {size} bytes, more than the {budget} this server holds in memory at once (--max-body-bytes-in-flight)",
                shown.display()
            )
        },
    )?;
    let bytes = door.read(&path, size, &cancel).await?;
    // A download, as a stored object is: never rendered as this origin's page.
    let name = path.file_name().unwrap_or_default();
    let headers = crate::download::download_headers("application/octet-stream", name);
    Ok(held_response(headers, bytes, held, deadline))
}

/// Holds `size` bytes of an answer in the budget of bytes in memory that request bodies
/// count against, until the returned hold goes with the answer's last byte (429 while
/// the budget, or `tenant`'s share of it, is taken). An answer larger than all a tenant
/// may hold could never be held: `resource_exhausted`, saying `too_large(most)`.
fn hold_answer(
    state: &AppState,
    tenant: &Tenant,
    size: usize,
    too_large: impl FnOnce(String) -> String,
) -> Result<BodyHold, Failure> {
    let budget = state.config.max_body_bytes_in_flight;
    let most = match &state.body_shares {
        Some(shares) => (
            shares.limit,
            format!("{} bytes, one tenant's half of the {budget}", shares.limit),
        ),
        None => (budget, format!("{budget}")),
    };
    if size > most.0 {
        return Err(Failure::new(
            ErrorCode::ResourceExhausted,
            too_large(most.1),
        ));
    }
    hold_body_bytes(state, tenant, size)
}

/// A 200 of `bytes` with `headers`, which gives their place in the budget (`held`)
/// back when the response is done with them. With the connection's `deadline` the
/// body goes in pieces, each arming it again: a client that takes nothing for the body
/// timeout has its connection closed, which gives the bytes back; one that reads
/// steadily is served however slowly.
fn held_response(
    headers: HeaderMap,
    bytes: Vec<u8>,
    held: BodyHold,
    deadline: Option<Extension<AnswerDeadline>>,
) -> Response {
    let slot = DeadlineSlot::default();
    let owned = Bytes::from_owner(HeldBytes {
        bytes,
        _held: held,
        _slot: slot.clone(),
    });
    let body = http_body_util::Full::new(owned);
    let body = match deadline {
        Some(Extension(deadline)) => Body::new(Paced::new(body, deadline, slot, Box::new(|| true))),
        None => Body::new(body),
    };
    (headers, body).into_response()
}

/// An answer's bytes with their place in the budget of bytes in memory, given back when
/// the response is done with them, and the last arming of the connection's deadline,
/// kept until then.
struct HeldBytes {
    bytes: Vec<u8>,
    _held: BodyHold,
    _slot: DeadlineSlot,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PutQuery {
    #[serde(default)]
    executable: bool,
}

/// Write a file of the session's `/workspace` (its directories made as needed): the
/// request body is its content.
#[utoipa::path(
    put,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
        ("executable" = Option<bool>, Query, description = "Mode 0755 instead of 0644"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written"),
        (status = 404, description = "No such session of this tenant", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 429, description = "As many request bodies held as the server may", body = ApiError),
        (status = 504, description = "The body was not received within --body-timeout", body = ApiError),
    )
)]
pub(crate) async fn write_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, path)): UrlPath<(String, String)>,
    Query(query): Query<PutQuery>,
    request: Request,
) -> Result<Json<serde_json::Value>, Failure> {
    // The session and the path are checked, and the announced size, before any of the
    // body is read; it is read within the body timeout and held within the budget of
    // bodies in memory until it is written.
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.file(door.parse_url(&path, "path")?, "path")?;
    let (parts, body) = request.into_parts();
    let limit = state.config.body_limit;
    let announced = body_size(&parts.headers, limit)?;
    let _held = hold_body_bytes(&state, &tenant, announced)?;
    let body = read_body(body, limit, state.config.body_timeout).await?;
    session.touch();
    let size = body.len();
    let cancel = session.ending.child_token();
    door.write(&path, body, query.executable, &cancel).await?;
    Ok(Json(
        serde_json::json!({"written": door.absolute(&path), "bytes": size}),
    ))
}

#[derive(Debug, Deserialize)]
pub(crate) struct DeleteQuery {
    #[serde(default)]
    recursive: bool,
}

/// Remove a file (or, with `recursive=true`, a directory tree) of the session's
/// `/workspace`.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
        ("recursive" = Option<bool>, Query, description = "Remove a directory and all it holds"),
    ),
    responses(
        (status = 200, description = "Removed"),
        (status = 404, description = "No such session, or no such file", body = ApiError),
    )
)]
pub(crate) async fn remove_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, path)): UrlPath<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.file(door.parse_url(&path, "path")?, "path")?;
    let cancel = session.ending.child_token();
    door.remove(&path, query.recursive, &cancel).await?;
    Ok(Json(serde_json::json!({"removed": door.absolute(&path)})))
}

#[derive(Debug, Deserialize)]
pub(crate) struct LsQuery {
    #[serde(default)]
    path: Option<String>,
}

/// List a directory of the session's `/workspace` (symlinks listed, never followed).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ls",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = Option<String>, Query, description = "Relative to /workspace (default: /workspace itself)"),
    ),
    responses(
        (status = 200, description = "The entries, by name", body = SessionListing),
        (status = 404, description = "No such session, or no such directory", body = ApiError),
        (status = 429, description = "As many request bodies and answers held as the server may", body = ApiError),
        (status = 422, description = "More entries than a listing gives (100,000), or a listing larger than the server holds in memory at once: list a directory beneath", body = ApiError),
    )
)]
pub(crate) async fn ls(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    deadline: Option<Extension<AnswerDeadline>>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<LsQuery>,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.parse(query.path.as_deref().unwrap_or(""), "path")?;
    let cancel = session.ending.child_token();
    let listed = door.list(&path, &cancel).await?;
    // A listing of many long names is megabytes (a control byte in a name is six in
    // JSON): held within the budget of bytes in memory, as a file read is, from before
    // its JSON is made until it is sent; one larger than the whole budget is refused.
    let size = skillbox_env::listing_json_len(&listed).saturating_add(256);
    let held = hold_answer(&state, &tenant, size, |budget| {
        format!(
            "list {}: its answer takes about {size} bytes, more than the {budget} this server holds in memory at once (--max-body-bytes-in-flight); list a directory beneath it",
            door.absolute(&path).display()
        )
    })?;
    // The sizes come with the listing: no look per file (on a container backend, a
    // process each).
    let entries = listed
        .into_iter()
        .map(|entry| SessionFileEntry {
            name: entry.name,
            kind: entry.kind.as_str().to_string(),
            size: entry.size,
        })
        .collect::<Vec<_>>();
    let body = serde_json::to_vec(&SessionListing {
        path: path.as_str().to_string(),
        entries,
    })
    .map_err(|e| Failure::new(ErrorCode::Unknown, format!("listing: {e}")))?;
    let headers = HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )]);
    Ok(held_response(headers, body, held, deadline))
}
