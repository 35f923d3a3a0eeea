//! `POST /v1/agent/runs` and `GET /v1/agent/runs/{id}`: agent sessions as background
//! jobs, recorded in SQLite so they survive a restart.

use std::path::PathBuf;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::json;
use skillbox_agent::{
    Agent, AgentConfig, LoopbackProvider, ModelProvider, SKILL_NAMES, builtin_skill,
};
use skillbox_store::{ArtifactStore, RunRecords};
use tokio::sync::Semaphore;
use utoipa::ToSchema;

use crate::api::{AppState, Failure};

/// Which model agent runs use.
#[derive(Debug, Clone)]
pub enum AgentModel {
    /// The skill's recorded session (offline, deterministic).
    Loopback,
    /// A given loopback transcript (JSON) for every run, whatever the skill.
    Transcript(String),
    /// An OpenAI-compatible endpoint.
    OpenAi(skillbox_agent::openai::OpenAiConfig),
}

/// What agent runs need: records, the artifact store, the data dir, the model.
#[derive(Debug, Clone)]
pub struct AgentRuns {
    records: RunRecords,
    store: ArtifactStore,
    data_dir: PathBuf,
    model: AgentModel,
    slots: Arc<Semaphore>,
    /// Runs started and not yet recorded as ended (running or waiting for a slot).
    in_system: Arc<std::sync::atomic::AtomicUsize>,
    /// Most runs in the system before new ones get 429.
    max_in_system: usize,
    /// The background runs, so shutdown can wait for their records.
    tasks: tokio_util::task::TaskTracker,
}

impl AgentRuns {
    /// Records live in `<data_dir>/agent-runs.sqlite`.
    pub fn open(
        data_dir: PathBuf,
        store: ArtifactStore,
        model: AgentModel,
        max_concurrency: usize,
    ) -> Result<Self, String> {
        let records =
            RunRecords::open(&data_dir.join("agent-runs.sqlite")).map_err(|e| e.to_string())?;
        let max_concurrency = max_concurrency.max(1);
        Ok(AgentRuns {
            records,
            store,
            data_dir,
            model,
            slots: Arc::new(Semaphore::new(max_concurrency)),
            in_system: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_in_system: max_concurrency * 8,
            tasks: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Waits (at most `limit`) for the background runs to record how they ended.
    pub async fn wait(&self, limit: std::time::Duration) {
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("shutdown: some agent runs did not finish recording in time");
        }
    }

    fn provider(&self, skill: &skillbox_agent::Skill) -> Result<Arc<dyn ModelProvider>, String> {
        match &self.model {
            AgentModel::Loopback => {
                let transcript = skill
                    .transcript
                    .ok_or_else(|| format!("skill {} has no loopback transcript", skill.name))?;
                Ok(Arc::new(
                    LoopbackProvider::from_json(transcript).map_err(|e| e.to_string())?,
                ))
            }
            AgentModel::Transcript(text) => Ok(Arc::new(
                LoopbackProvider::from_json(text).map_err(|e| e.to_string())?,
            )),
            AgentModel::OpenAi(config) => Ok(Arc::new(
                skillbox_agent::openai::OpenAiProvider::new(config.clone())
                    .map_err(|e| e.to_string())?,
            )),
        }
    }
}

/// `POST /v1/agent/runs`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRunRequest {
    pub prompt: String,
    /// Default `pptx`.
    #[serde(default)]
    pub skill: Option<String>,
    /// Failed runs before giving up, 1..=10 (default 3).
    #[serde(default)]
    pub max_attempts: Option<u32>,
}

/// The answer to `POST /v1/agent/runs`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AgentRunCreated {
    pub id: String,
    pub status: String,
}

fn new_id() -> String {
    let mut bytes = [0u8; 12];
    skillbox_env::path::fill_random(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Start an agent run: a model writes the script, skillbox runs it and feeds errors back.
#[utoipa::path(
    post,
    path = "/v1/agent/runs",
    request_body = AgentRunRequest,
    responses(
        (status = 202, description = "Started; poll GET /v1/agent/runs/{id}", body = AgentRunCreated),
        (status = 400, description = "Bad request", body = skillbox_client::ApiError),
        (status = 503, description = "Agent runs are not configured, or the model is unavailable", body = skillbox_client::ApiError),
    )
)]
pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<AgentRunRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<AgentRunCreated>), Failure> {
    let Json(request) = body.map_err(crate::api::json_rejection)?;
    let agents = state.agents().ok_or_else(|| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "agent runs are not configured on this server",
        )
    })?;
    if request.prompt.trim().is_empty() {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            "prompt: empty; say what to make",
        ));
    }
    let skill_name = request.skill.clone().unwrap_or_else(|| "pptx".into());
    let skill = builtin_skill(&skill_name).ok_or_else(|| {
        Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!(
                "skill: no skill {skill_name:?} (have: {})",
                SKILL_NAMES.join(", ")
            ),
        )
    })?;
    let max_attempts = request.max_attempts.unwrap_or(3);
    if !(1..=10).contains(&max_attempts) {
        return Err(Failure::new(
            StatusCode::BAD_REQUEST,
            "invalid",
            format!("maxAttempts: {max_attempts} is out of range 1..=10"),
        ));
    }
    let provider = agents.provider(&skill).map_err(|e| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("model: {e}"),
        )
    })?;
    // Bounded like /v1/run: past the limit, 429 instead of an ever-growing backlog.
    if agents
        .in_system
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        >= agents.max_in_system
    {
        agents
            .in_system
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        let mut failure = Failure::new(
            StatusCode::TOO_MANY_REQUESTS,
            "overloaded",
            format!(
                "{} agent runs are running or waiting; retry later",
                agents.max_in_system
            ),
        );
        failure.retry_after = Some(5);
        return Err(failure);
    }
    let id = new_id();
    let record = json!({"id": id, "status": "running", "prompt": request.prompt, "skill": skill_name,
        "maxAttempts": max_attempts, "model": provider.name(), "scripted": provider.is_scripted(),
        "attempts": [], "artifacts": []});
    agents
        .records
        .insert(&id, "running", &record.to_string())
        .map_err(|e| {
            agents
                .in_system
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "unknown", e.to_string())
        })?;
    let cancel = state.runs_cancel().child_token();
    let agents = agents.clone();
    let run_id = id.clone();
    let tracker = agents.tasks.clone();
    tracker.spawn(async move {
        // The work runs in its own task, so a panic there still ends the record.
        let work = {
            let agents = agents.clone();
            let run_id = run_id.clone();
            let mut record = record.clone();
            tokio::spawn(async move {
                let slot = tokio::select! {
                    slot = agents.slots.clone().acquire_owned() => slot.ok(),
                    () = cancel.cancelled() => None,
                };
                let Some(_slot) = slot else {
                    record["reason"] = json!("cancelled before it started");
                    return ("failed", record);
                };
                let agent = Agent::new(provider, agents.store.clone(), &agents.data_dir);
                let config = AgentConfig {
                    max_attempts,
                    ..AgentConfig::default()
                };
                // Each attempt is saved as it happens, so GET shows progress.
                let progress = std::sync::Mutex::new(Vec::new());
                let report = |event: skillbox_agent::AgentEvent<'_>| {
                    if let skillbox_agent::AgentEvent::Attempt(attempt) = event
                        && let Ok(mut attempts) = progress.lock()
                    {
                        attempts.push(serde_json::to_value(attempt).unwrap_or_default());
                        let mut live = record.clone();
                        live["attempts"] = json!(*attempts);
                        let _ = agents.records.update(&run_id, "running", &live.to_string());
                    }
                };
                let result = agent
                    .run(&request.prompt, &skill, &config, &cancel, &report)
                    .await;
                let status = match result {
                    Ok(outcome) => {
                        let status = match outcome.status {
                            skillbox_agent::AgentStatus::Succeeded => "succeeded",
                            skillbox_agent::AgentStatus::Failed => "failed",
                        };
                        if let (Some(object), Ok(serde_json::Value::Object(fields))) =
                            (record.as_object_mut(), serde_json::to_value(&outcome))
                        {
                            object.extend(fields);
                        }
                        status
                    }
                    Err(error) => {
                        if let Ok(attempts) = progress.lock() {
                            record["attempts"] = json!(*attempts);
                        }
                        record["reason"] = json!(error.to_string());
                        record["error"] =
                            json!({"code": error.code(), "message": error.to_string()});
                        "failed"
                    }
                };
                (status, record)
            })
        };
        let (status, mut record) = match work.await {
            Ok(done) => done,
            Err(e) => {
                let mut record = record;
                record["reason"] = json!(format!("the run crashed: {e}"));
                ("failed", record)
            }
        };
        record["status"] = json!(status);
        if let Err(e) = agents.records.update(&run_id, status, &record.to_string()) {
            tracing::error!(id = %run_id, error = %e, "agent run: cannot record the outcome");
        }
        agents
            .in_system
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    });
    Ok((
        StatusCode::ACCEPTED,
        Json(AgentRunCreated {
            id,
            status: "running".into(),
        }),
    ))
}

/// An agent run: status, attempts (script, exitCode, stderr, durationMs, …), artifacts.
#[utoipa::path(
    get,
    path = "/v1/agent/runs/{id}",
    params(("id" = String, Path, description = "the id from POST /v1/agent/runs")),
    responses(
        (status = 200, description = "The run record"),
        (status = 404, description = "No such run", body = skillbox_client::ApiError),
    )
)]
pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, Failure> {
    let agents = state.agents().ok_or_else(|| {
        Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "agent runs are not configured on this server",
        )
    })?;
    let record = agents
        .records
        .get(&id)
        .map_err(|e| Failure::new(StatusCode::INTERNAL_SERVER_ERROR, "unknown", e.to_string()))?
        .ok_or_else(|| {
            Failure::new(
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no agent run {id:?}"),
            )
        })?;
    let mut body: serde_json::Value = serde_json::from_str(&record.body).map_err(|e| {
        Failure::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "unknown",
            format!("record {id}: {e}"),
        )
    })?;
    body["status"] = json!(record.status);
    Ok(Json(body))
}
