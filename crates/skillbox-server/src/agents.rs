//! `POST /v1/agent/runs`, `GET /v1/agent/runs[/{id}]` and `GET /v1/agent`: agent
//! sessions as background jobs, each recorded as an [`AgentRun`] as it goes, listed
//! newest first.

use std::sync::atomic::Ordering;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use skillbox_agent::{Agent, AgentConfig, AgentEvent, SKILL_NAMES, builtin_skill};
use skillbox_protocol::{
    AgentInfo, AgentRun, AgentRunCreated, AgentRunList, AgentRunRequest, AgentRunSummary,
    AgentStatus, ErrorCode, ErrorInfo,
};
use skillbox_store::RunRecord;

use crate::agent_runs::AgentRuns;
use crate::auth::Tenant;
use crate::error::{Failure, json_rejection};
use crate::state::AppState;

/// A new run's id: 24 random hex digits.
pub(crate) fn new_id() -> Result<String, Failure> {
    skillbox_protocol::random::hex(12)
        .map_err(|e| Failure::new(ErrorCode::Unavailable, format!("no id for the run: {e}")))
}

pub(crate) fn not_configured() -> Failure {
    Failure::new(
        ErrorCode::Unavailable,
        "agent runs are not configured on this server",
    )
}

/// Writes `record`: as a running run's progress (only while its record says running),
/// or as how it ended.
async fn save(agents: &AgentRuns, record: &AgentRun, progress: bool) {
    let body = match serde_json::to_string(record) {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(id = %record.id, error = %e, "agent run: cannot render the record");
            return;
        }
    };
    let saved = if progress {
        agents.records.update_running(&record.id, &body).await
    } else {
        agents
            .records
            .update(&record.id, record.status.as_str(), &body)
            .await
    };
    if let Err(e) = saved {
        tracing::error!(id = %record.id, progress, error = %e, "agent run: cannot save the record");
    }
}

/// Start an agent run: a model writes the script, skillbox runs it and feeds errors back.
#[utoipa::path(
    post,
    path = "/v1/agent/runs",
    request_body = AgentRunRequest,
    responses(
        (status = 202, description = "Started; poll GET /v1/agent/runs/{id}", body = AgentRunCreated),
        (status = 400, description = "Bad request", body = skillbox_protocol::ApiError),
        (status = 503, description = "Agent runs are not configured, or the model is unavailable", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn create(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    body: Result<Json<AgentRunRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<AgentRunCreated>), Failure> {
    let Json(request) = body.map_err(json_rejection)?;
    let agents = state.agents().ok_or_else(not_configured)?;
    if request.prompt.trim().is_empty() {
        return Err(Failure::new(
            ErrorCode::Invalid,
            "prompt: empty; say what to make",
        ));
    }
    let skill_name = request.skill.clone().unwrap_or_else(|| "pptx".into());
    let skill = builtin_skill(&skill_name).ok_or_else(|| {
        Failure::new(
            ErrorCode::Invalid,
            format!(
                "skill: no skill {skill_name:?} (have: {})",
                SKILL_NAMES.join(", ")
            ),
        )
    })?;
    let max_attempts = request.max_attempts.unwrap_or(3);
    if !(1..=10).contains(&max_attempts) {
        return Err(Failure::new(
            ErrorCode::Invalid,
            format!("maxAttempts: {max_attempts} is out of range 1..=10"),
        ));
    }
    let backend = skillbox_door::sandboxed(request.backend)?;
    // The tenant's skills and scope, as POST /v1/run's: a name that is not there is 400
    // now, naming those that are, rather than a failed record later.
    state
        .runner
        .find_skills(&request.skills, tenant.as_str())
        .await?;
    if let Some(key) = &request.scope_key {
        skillbox_store::check_scope_key(key).map_err(|e| Failure::new(ErrorCode::Invalid, e))?;
    }
    if let Some(network) = &request.network {
        skillbox_egress::Rules::new(network)
            .map_err(|e| Failure::new(ErrorCode::Invalid, e.to_string()))?;
    }
    let provider = agents
        .provider(&skill)
        .map_err(|e| Failure::new(ErrorCode::Unavailable, format!("model: {e}")))?;
    let Some(tenant_run) = state.tenant_run(&tenant) else {
        return Err(Failure::overloaded(
            format!(
                "tenant {} has {} runs running or waiting, its most; retry later",
                tenant.as_str(),
                state.config.tenant_max_runs
            ),
            5,
        ));
    };
    // Bounded like /v1/run: past the limit, 429 instead of an ever-growing backlog.
    if agents.in_system.fetch_add(1, Ordering::SeqCst) >= agents.max_in_system {
        agents.in_system.fetch_sub(1, Ordering::SeqCst);
        return Err(Failure::overloaded(
            format!(
                "{} agent runs are running or waiting; retry later",
                agents.max_in_system
            ),
            5,
        ));
    }
    let record = AgentRun {
        id: new_id()?,
        status: AgentStatus::Running,
        prompt: request.prompt.clone(),
        skill: skill_name,
        max_attempts,
        backend: backend.kind(),
        skills: request.skills.clone(),
        scope_key: request.scope_key.clone(),
        model: provider.name(),
        scripted: provider.is_scripted(),
        reason: None,
        answer: None,
        attempts: Vec::new(),
        artifacts: Vec::new(),
        error: None,
        corrections: Vec::new(),
        placed: None,
        snapshot: None,
        network: request.network.clone(),
        egress: Vec::new(),
    };
    let body = serde_json::to_string(&record)
        .map_err(|e| Failure::new(ErrorCode::Unknown, e.to_string()))?;
    agents
        .records
        .insert(&record.id, tenant.as_str(), record.status.as_str(), &body)
        .await
        .map_err(|e| {
            agents.in_system.fetch_sub(1, Ordering::SeqCst);
            Failure::from(e)
        })?;
    let created = AgentRunCreated {
        id: record.id.clone(),
        status: AgentStatus::Running,
    };
    let cancel = state.runs_cancel().child_token();
    let agents = agents.clone();
    let runner = state.runner.clone();
    let tracker = agents.tasks.clone();
    let state = state.clone();
    let tenant_name = tenant.as_str().to_string();
    tracker.spawn(async move {
        let _tenant_run = tenant_run;
        // The work runs in its own task, so a panic there still ends the record.
        let work = {
            let agents = agents.clone();
            let mut record = record.clone();
            tokio::spawn(async move {
                let slot = tokio::select! {
                    slot = agents.slots.clone().acquire_owned() => slot.ok(),
                    () = cancel.cancelled() => None,
                };
                let Some(_slot) = slot else {
                    record.status = AgentStatus::Failed;
                    record.reason = Some("cancelled before it started".into());
                    return record;
                };
                // Each script's disk bound is the server's (`serve --disk`, `--inodes`).
                let mut limits = AgentConfig::default().limits;
                limits.disk_bytes = runner.limits().disk_bytes;
                limits.disk_inodes = runner.limits().disk_inodes;
                let agent = Agent::new(provider, runner);
                let config = AgentConfig {
                    max_attempts,
                    backend,
                    skills: request.skills.clone(),
                    scope_key: request.scope_key.clone(),
                    tenant: tenant_name,
                    network: request.network.clone(),
                    limits,
                    ..AgentConfig::default()
                };
                // Each attempt is saved as it happens, so GET shows progress: a task
                // writes the latest of them, in order, and only while the record says
                // running (so a late one never undoes how the run ended).
                let (live, mut latest) = tokio::sync::watch::channel(record.clone());
                let saver = {
                    let agents = agents.clone();
                    tokio::spawn(async move {
                        while latest.changed().await.is_ok() {
                            let progress = latest.borrow_and_update().clone();
                            save(&agents, &progress, true).await;
                        }
                    })
                };
                let report = |event: AgentEvent<'_>| {
                    if let AgentEvent::Attempt(attempt) = event {
                        live.send_modify(|live| live.attempts.push(attempt.clone()));
                    }
                };
                let result = agent
                    .run(&request.prompt, &skill, &config, &cancel, &report)
                    .await;
                record.attempts.clone_from(&live.borrow().attempts);
                drop(live);
                let _ = saver.await;
                match result {
                    Ok(outcome) => {
                        record.status = outcome.status;
                        record.reason = Some(outcome.reason);
                        record.answer = Some(outcome.answer);
                        record.attempts = outcome.attempts;
                        record.artifacts = outcome.artifacts;
                        record.error = outcome.error;
                        record.corrections = outcome.corrections;
                        record.placed = outcome.placed;
                        record.snapshot = outcome.snapshot;
                        record.egress = outcome.egress;
                    }
                    Err(error) => {
                        record.status = AgentStatus::Failed;
                        record.reason = Some(error.to_string());
                        record.error = Some(ErrorInfo {
                            code: error.code(),
                            message: error.to_string(),
                        });
                    }
                }
                record
            })
        };
        let record = match work.await {
            Ok(done) => done,
            Err(e) => AgentRun {
                status: AgentStatus::Failed,
                reason: Some(format!("the run crashed: {e}")),
                ..record
            },
        };
        // The tenant may download what its run made.
        if let Err(e) = crate::runs::grant(&state, &tenant, &record.artifacts).await {
            tracing::error!(id = %record.id, error = ?e, "agent run: cannot record the artifacts' owner");
        }
        save(&agents, &record, false).await;
        agents.in_system.fetch_sub(1, Ordering::SeqCst);
    });
    Ok((StatusCode::ACCEPTED, Json(created)))
}

/// An agent run: status, attempts (script, exitCode, stderr, durationMs, …), artifacts.
#[utoipa::path(
    get,
    path = "/v1/agent/runs/{id}",
    params(("id" = String, Path, description = "the id from POST /v1/agent/runs")),
    responses(
        (status = 200, description = "The run record", body = AgentRun),
        (status = 404, description = "No such run", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn get(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> Result<Json<AgentRun>, Failure> {
    let agents = state.agents().ok_or_else(not_configured)?;
    // Another tenant's run is answered exactly as one that does not exist.
    let record = agents
        .records
        .get(&id)
        .await?
        .filter(|record| record.tenant == tenant.as_str())
        .ok_or_else(|| Failure::new(ErrorCode::NotFound, format!("no agent run {id:?}")))?;
    Ok(Json(read_record(&record)?))
}

/// A stored record as the `AgentRun` it holds.
fn read_record(record: &RunRecord) -> Result<AgentRun, Failure> {
    let mut run: AgentRun = serde_json::from_str(&record.body)
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("record {}: {e}", record.id)))?;
    // The column is the authority: a run interrupted by a restart is marked there.
    run.status = match record.status.as_str() {
        "running" => AgentStatus::Running,
        "succeeded" => AgentStatus::Succeeded,
        _ => AgentStatus::Failed,
    };
    Ok(run)
}

/// Runs a page holds at most, and by default.
const MAX_PAGE: usize = 100;
const DEFAULT_PAGE: usize = 20;

/// `?limit=&before=` of a list.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    limit: Option<String>,
    pub(crate) before: Option<String>,
}

impl ListQuery {
    /// The query, or 400 naming what is wrong with it.
    pub(crate) fn read(query: Result<Query<ListQuery>, QueryRejection>) -> Result<Self, Failure> {
        let Query(query) = query.map_err(|e| {
            Failure::new(
                ErrorCode::Invalid,
                format!("query: {}; use limit and before", e.body_text()),
            )
        })?;
        Ok(query)
    }

    /// The page size: 1..=100, default 20; else 400 naming `limit`.
    pub(crate) fn limit(&self) -> Result<usize, Failure> {
        match self.limit.as_deref() {
            None => Ok(DEFAULT_PAGE),
            Some(text) => text
                .parse::<usize>()
                .ok()
                .filter(|n| (1..=MAX_PAGE).contains(n))
                .ok_or_else(|| {
                    Failure::new(
                        ErrorCode::Invalid,
                        format!("limit: {text:?} is not a number in 1..={MAX_PAGE}"),
                    )
                }),
        }
    }
}

/// This tenant's agent runs, newest first, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/agent/runs",
    params(
        ("limit" = Option<usize>, Query, description = "runs in the page, 1..=100 (default 20)"),
        ("before" = Option<String>, Query, description = "the `next` of the previous page: runs older than that run"),
    ),
    responses(
        (status = 200, description = "A page of runs", body = AgentRunList),
        (status = 400, description = "A bad limit or before", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<AgentRunList>, Failure> {
    let query = ListQuery::read(query)?;
    let agents = state.agents().ok_or_else(not_configured)?;
    let limit = query.limit()?;
    // `before` is a run of this tenant; another's reads as one that does not exist.
    let before = match query.before.as_deref() {
        None => None,
        Some(id) => Some(
            agents
                .records
                .get(id)
                .await?
                .filter(|record| record.tenant == tenant.as_str())
                .ok_or_else(|| {
                    Failure::new(
                        ErrorCode::Invalid,
                        format!("before: no agent run {id:?}; give the `next` of a page"),
                    )
                })?,
        ),
    };
    // One more than asked says whether there is a next page.
    let mut records = agents
        .records
        .list(tenant.as_str(), limit + 1, before.as_ref())
        .await?;
    let more = records.len() > limit;
    records.truncate(limit);
    let next = more
        .then(|| records.last().map(|record| record.id.clone()))
        .flatten();
    let runs = records
        .iter()
        .map(|record| {
            let run = read_record(record)?;
            let ended = run.status != AgentStatus::Running;
            Ok(AgentRunSummary {
                duration_ms: ended.then(|| {
                    u64::try_from(record.updated_ms.saturating_sub(record.created_ms)).unwrap_or(0)
                }),
                id: run.id,
                status: run.status,
                prompt: run.prompt,
                skill: run.skill,
                backend: run.backend,
                model: run.model,
                scripted: run.scripted,
                created_ms: record.created_ms,
                updated_ms: record.updated_ms,
                attempts: run.attempts.len(),
                artifacts: run.artifacts,
                reason: run.reason,
            })
        })
        .collect::<Result<Vec<_>, Failure>>()?;
    Ok(Json(AgentRunList { runs, next }))
}

/// What a new agent run gets here: the model and the built-in skills.
#[utoipa::path(
    get,
    path = "/v1/agent",
    responses(
        (status = 200, description = "The model and the built-in skills", body = AgentInfo),
        (status = 503, description = "Agent runs are not configured", body = skillbox_protocol::ApiError),
    )
)]
pub(crate) async fn info(State(state): State<AppState>) -> Result<Json<AgentInfo>, Failure> {
    let agents = state.agents().ok_or_else(not_configured)?;
    let (model, scripted) = agents.model_name();
    Ok(Json(AgentInfo {
        model,
        scripted,
        skills: SKILL_NAMES.iter().map(|name| (*name).to_string()).collect(),
    }))
}
