//! Agent runs (`POST /v1/agent/runs`, `GET /v1/agent/runs/{id}`): a model writes a
//! script, skillbox runs it and feeds errors back until the files verify.

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::error::ErrorCode;
use crate::run::{ArtifactInfo, Language, SkillsPlaced, SnapshotReport};

/// `POST /v1/agent/runs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentRunRequest {
    pub prompt: String,
    /// Default `pptx`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
    /// Failed runs before giving up, 1..=10 (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Which sandbox the scripts run in (default `native`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Skills placed in `/workspace` first, by name, as `POST /v1/run`'s: listed in the
    /// system prompt, read with `read_skill` and run with `run_skill`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Start from this scope's last snapshot of `/workspace`, and save a new one after
    /// the run (the tenant's scope, as `POST /v1/run`'s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    /// What the model's scripts may reach through skillbox's egress proxy (native and
    /// docker), as `POST /v1/run`'s: none without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkPolicy>,
}

/// The answer to `POST /v1/agent/runs` (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AgentRunCreated {
    pub id: String,
    pub status: AgentStatus,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    Running,
    Succeeded,
    Failed,
}

impl AgentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Running => "running",
            AgentStatus::Succeeded => "succeeded",
            AgentStatus::Failed => "failed",
        }
    }
}

/// Tokens one model turn used, when the model reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// How a `.pptx` artifact fared in verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Verification {
    pub path: String,
    pub ok: bool,
    pub slides: Option<usize>,
    pub error: Option<String>,
}

/// One script run, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    pub number: u32,
    pub language: Language,
    pub script: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    /// The tail of stdout.
    pub stdout: String,
    /// The tail of stderr.
    pub stderr: String,
    pub duration_ms: u64,
    /// Tokens of the model turn that asked for this run, when reported.
    pub usage: Option<Usage>,
    pub files: Vec<String>,
    pub verification: Vec<Verification>,
    /// True when the run exited 0 and every artifact passed verification.
    pub succeeded: bool,
}

/// An error, as a stable code and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorInfo {
    pub code: ErrorCode,
    pub message: String,
}

/// An agent run's record: what was asked, every attempt so far and, once it ended, how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentRun {
    pub id: String,
    pub status: AgentStatus,
    pub prompt: String,
    pub skill: String,
    pub max_attempts: u32,
    /// Records older than this field read as `native`, the only backend they could use.
    #[serde(default)]
    pub backend: BackendKind,
    /// The skills asked for (`skills` of the request).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    pub model: String,
    /// True when a scripted (loopback) model is in use.
    pub scripted: bool,
    /// Why it ended, in words; none while running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The model's last words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    pub attempts: Vec<Attempt>,
    /// The files of the last successful run, stored.
    pub artifacts: Vec<ArtifactInfo>,
    /// Set when the run ended on an error (the model, the sandbox, the store) rather
    /// than by its own bounds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// The turns the loop could not act on, and what it answered (older records: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub corrections: Vec<Correction>,
    /// What was placed of `skills`, once the sandbox had them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed: Option<SkillsPlaced>,
    /// With a `scopeKey`: the snapshot the run started from and the one it left (or
    /// why none was saved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotReport>,
    /// The run's network policy, and every connection its scripts asked the proxy for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::EgressConnection>,
}

/// What was wrong with a corrected turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum CorrectionKind {
    /// No tool call, before any run made verified files. Answered with a user message.
    NoToolCall,
    /// A tool call that cannot run: arguments that are not a JSON object, a required
    /// argument missing, empty or of the wrong type or value, an argument the tool does
    /// not take, an unknown tool. Answered as that call's result, under its id.
    MalformedCall,
    /// A script (or `run_skill` command) that already failed, sent again unchanged with
    /// nothing in the workspace changed since: not run again. Answered as that call's
    /// result, under its id; a second one in a row ends the run.
    RepeatedScript,
}

/// A model turn (or one call of it) the loop could not act on, and what it sent back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct Correction {
    /// The model turn, from 1.
    pub turn: u32,
    pub kind: CorrectionKind,
    /// For `malformed_call`: the tool named and the call's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// What the model sent: its text, or the call's arguments as sent (cut).
    pub received: String,
    /// What the loop answered. On the turn that reaches maxTurns no request follows, so
    /// that one never reaches the model.
    pub message: String,
}

/// `GET /v1/agent`: what a new agent run will get here: the model the server was
/// started with and the built-in skills a run may name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// As `AgentRun.model` will read: `loopback`, or `openai:MODEL`.
    pub model: String,
    /// True when it is the loopback model (a recorded session replayed, no real model).
    pub scripted: bool,
    /// The built-in skills (`skill` of `POST /v1/agent/runs`); the first is the default.
    pub skills: Vec<String>,
}

/// One agent run in `GET /v1/agent/runs`: enough for a list, without the scripts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentRunSummary {
    pub id: String,
    pub status: AgentStatus,
    pub prompt: String,
    pub skill: String,
    pub backend: BackendKind,
    pub model: String,
    pub scripted: bool,
    /// When it was started and last recorded, in ms since the Unix epoch.
    pub created_ms: i64,
    pub updated_ms: i64,
    /// From start to end; none while it runs.
    pub duration_ms: Option<u64>,
    /// Attempts so far.
    pub attempts: usize,
    pub artifacts: Vec<ArtifactInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /v1/agent/runs`: a page of this tenant's agent runs, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct AgentRunList {
    pub runs: Vec<AgentRunSummary>,
    /// The `before` of the next page; none on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// One plain run (`POST /v1/run`) in `GET /v1/runs`: a summary kept for the list, not
/// the run's output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlainRunSummary {
    pub id: String,
    /// When it ended, in ms since the Unix epoch.
    pub created_ms: i64,
    pub language: Language,
    pub backend: BackendKind,
    /// The script's first non-empty line, cut to 120 characters.
    pub script: String,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub limit_hit: Option<crate::exec::LimitKind>,
    pub duration_ms: u64,
    /// The files it made (the first 64), downloadable by its tenant.
    pub files: Vec<ArtifactInfo>,
}

/// `GET /v1/runs`: a page of this tenant's plain runs, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct PlainRunList {
    pub runs: Vec<PlainRunSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// How a slide preview came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum PreviewFormat {
    /// Each slide rendered to a PNG (LibreOffice and pdftoppm on the server).
    Png,
    /// The text of each slide, as the verifier reads it.
    Outline,
}

/// One slide of a preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SlidePreview {
    /// From 1, in presentation order.
    pub number: usize,
    /// The slide's text runs, in document order (empty ones left out).
    pub texts: Vec<String>,
    /// With `png`: `/v1/objects/{sha256}/slides/{number}`, relative to the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// `GET /v1/objects/{sha256}/slides`: a stored deck's slides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct SlidePreviews {
    pub sha256: String,
    pub format: PreviewFormat,
    pub slides: Vec<SlidePreview>,
    /// With `outline`: why there are no images (no LibreOffice here, or the render
    /// failed and how).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}
