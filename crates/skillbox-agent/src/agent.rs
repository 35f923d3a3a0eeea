//! The loop, its tools (implemented only over `ExecutionEnv`) and what it records.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, ErrorCode, ExecRequest, ExecutionEnv, Limits,
    SandboxPolicy, SandboxSpec,
};
use skillbox_protocol::{
    AgentStatus, ArtifactInfo, Attempt, ErrorInfo, Language, OutputSelection, Usage, Verification,
};
use skillbox_run::{RunError, Runner, script_command, script_name};
use skillbox_store::{CollectLimits, CollectedFile, collect_artifacts, store_all};

use crate::correction::{Correction, CorrectionKind, Corrects, Streak};
use crate::provider::{Message, ModelProvider, ProviderError, ToolCall, ToolSpec};
use crate::skills::Skill;

const WORKSPACE: &str = "/workspace";
/// Tool calls executed per model turn; the rest are answered "skipped".
const MAX_CALLS_PER_TURN: usize = 8;
/// The largest file `read_file` hands to the model.
const MAX_READ_BYTES: u64 = 256 * 1024;

/// Bounds of one agent run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Failed script runs (non-zero exit, timeout, or an artifact that fails
    /// verification) before the loop gives up.
    pub max_attempts: u32,
    /// Model turns before the loop gives up (a model that never stops).
    pub max_turns: u32,
    /// The whole run's deadline.
    pub deadline: Duration,
    /// Each script run's limits.
    pub limits: Limits,
    /// Characters of stdout/stderr fed back per run (the tail is kept).
    pub output_budget: usize,
    /// Which sandbox the scripts run in.
    pub backend: BackendKind,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            max_attempts: 3,
            max_turns: 12,
            deadline: Duration::from_secs(600),
            limits: Limits {
                timeout_ms: 60_000,
                ..Limits::default()
            },
            output_budget: 4000,
            backend: BackendKind::Native,
        }
    }
}

/// How the run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentOutcome {
    pub status: AgentStatus,
    /// Why it ended, in words.
    pub reason: String,
    pub model: String,
    /// True when a scripted (loopback) model was used.
    pub scripted: bool,
    /// The model's last words.
    pub answer: String,
    pub attempts: Vec<Attempt>,
    /// The turns (or calls) the loop answered with a correction instead of acting on.
    pub corrections: Vec<Correction>,
    /// The files of the last successful run, stored.
    pub artifacts: Vec<ArtifactInfo>,
    /// Set when the run ended on an error (the model, the sandbox, the store) rather
    /// than by its own bounds; the attempts made until then are kept.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// What the loop reports as it goes (for live output).
#[derive(Debug, Clone)]
pub enum AgentEvent<'a> {
    ModelTurn { turn: u32, text: &'a str },
    Attempt(&'a Attempt),
    ToolError { tool: &'a str, message: &'a str },
}

/// Why an agent run could not happen or had to stop early.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("prompt: empty; say what to make")]
    EmptyPrompt,
    #[error("{0}")]
    Provider(#[from] ProviderError),
    #[error("sandbox: {0}")]
    Sandbox(EnvError),
    #[error("node runtime: {0}")]
    Runtime(String),
    #[error("artifacts: {0}")]
    Store(String),
    #[error("cancelled")]
    Cancelled,
}

impl AgentError {
    /// The stable error code on the wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            AgentError::EmptyPrompt => ErrorCode::Invalid,
            AgentError::Provider(ProviderError::Cancelled) | AgentError::Cancelled => {
                ErrorCode::Aborted
            }
            AgentError::Provider(ProviderError::Timeout(_)) => ErrorCode::Timeout,
            AgentError::Provider(ProviderError::Config(_) | ProviderError::Transcript(_)) => {
                ErrorCode::Invalid
            }
            AgentError::Provider(_) => ErrorCode::Unavailable,
            AgentError::Sandbox(e) => e.code,
            AgentError::Runtime(_) => ErrorCode::Unavailable,
            AgentError::Store(_) => ErrorCode::Unknown,
        }
    }
}

/// Runs agent sessions: a model, and a sandbox per session from the runner's backends,
/// whose files go to the runner's artifact store.
#[derive(Debug)]
pub struct Agent {
    provider: Arc<dyn ModelProvider>,
    runner: Arc<Runner>,
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "run_script".into(),
            description: "Run a script in the sandbox (cwd /workspace). Returns exitCode, stdout, stderr, the files in /workspace and, for .pptx files, a verification.".into(),
            parameters: json!({"type": "object", "properties": {
                "language": {"type": "string", "enum": ["node", "python", "sh"]},
                "script": {"type": "string"}
            }, "required": ["language", "script"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "read_file".into(),
            description: "Read a text file from /workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "write_file".into(),
            description: "Write a text file in /workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "list_dir".into(),
            description: "List a directory of /workspace.".into(),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false}),
        },
    ]
}

/// The last `budget` characters of `text`, marked when cut.
fn tail(text: &str, budget: usize) -> String {
    let count = text.chars().count();
    if count <= budget {
        return text.to_string();
    }
    let kept: String = text.chars().skip(count - budget).collect();
    format!("[…{} characters cut…]\n{kept}", count - budget)
}

/// A workspace path from a tool argument: relative (or under /workspace), no `..`.
fn workspace_path(raw: &str) -> Result<PathBuf, String> {
    let path = Path::new(raw);
    let relative = path.strip_prefix(WORKSPACE).unwrap_or(path);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| matches!(c, Component::ParentDir))
    {
        return Err(format!(
            "path {raw:?}: give a path inside /workspace, without `..`"
        ));
    }
    Ok(Path::new(WORKSPACE).join(relative))
}

fn string_arg(call: &ToolCall, name: &str) -> Result<String, String> {
    call.arguments[name]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            format!(
                "{}: argument {name:?} is missing or not a string",
                call.name
            )
        })
}

fn verify(files: &[CollectedFile]) -> Vec<Verification> {
    files
        .iter()
        .filter(|f| f.path.ends_with(".pptx"))
        .map(|f| match skillbox_pptx::verify(&f.bytes) {
            Ok(deck) => Verification {
                path: f.path.clone(),
                ok: true,
                slides: Some(deck.slide_count()),
                error: None,
            },
            Err(e) => Verification {
                path: f.path.clone(),
                ok: false,
                slides: None,
                error: Some(e.to_string()),
            },
        })
        .collect()
}

struct Session<'a> {
    env: &'a dyn ExecutionEnv,
    config: &'a AgentConfig,
    cancel: &'a CancellationToken,
    /// When the whole run must end.
    deadline: Instant,
    /// A successful run must leave at least one file with this extension.
    requires: Option<&'static str>,
    attempts: Vec<Attempt>,
    corrections: Vec<Correction>,
    failed_runs: u32,
    last_good: Option<Vec<CollectedFile>>,
}

impl Session<'_> {
    /// Runs one tool call; the string goes back to the model.
    async fn tool(
        &mut self,
        call: &ToolCall,
        usage: Option<Usage>,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<String, AgentError> {
        let outcome = match call.name.as_str() {
            "run_script" => return self.run_script(call, usage, report).await,
            "read_file" => self.read_file(call).await,
            "write_file" => self.write_file(call).await,
            "list_dir" => self.list_dir(call).await,
            // `Correction::malformed_call` answers calls to other tools before this.
            other => Err(format!(
                "unknown tool {other:?}; the tools are run_script, read_file, write_file, list_dir"
            )),
        };
        Ok(match outcome {
            Ok(text) => text,
            Err(message) => {
                report(AgentEvent::ToolError {
                    tool: &call.name,
                    message: &message,
                });
                json!({"error": message}).to_string()
            }
        })
    }

    async fn read_file(&self, call: &ToolCall) -> Result<String, String> {
        let path = workspace_path(&string_arg(call, "path")?)?;
        // The size of what a read would return (through a symlink inside /workspace too).
        let target = self
            .env
            .canonical(&path, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        let info = self
            .env
            .file_info(&target, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        if info.size > MAX_READ_BYTES {
            return Err(format!(
                "read_file {}: {} bytes, more than the {MAX_READ_BYTES} bytes a read may return",
                path.display(),
                info.size
            ));
        }
        let text = self
            .env
            .read_text(&path, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({"content": tail(&text, self.config.output_budget * 4)}).to_string())
    }

    async fn write_file(&self, call: &ToolCall) -> Result<String, String> {
        let path = workspace_path(&string_arg(call, "path")?)?;
        let content = string_arg(call, "content")?;
        self.env
            .write(&path, content.as_bytes(), self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(json!({"written": path.display().to_string(), "bytes": content.len()}).to_string())
    }

    async fn list_dir(&self, call: &ToolCall) -> Result<String, String> {
        let path = workspace_path(&string_arg(call, "path")?)?;
        let entries = self
            .env
            .list_dir(&path, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(serde_json::to_string(&entries).unwrap_or_default())
    }

    async fn run_script(
        &mut self,
        call: &ToolCall,
        usage: Option<Usage>,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<String, AgentError> {
        let parsed = string_arg(call, "script").and_then(|script| {
            let language = match call.arguments["language"].as_str().unwrap_or("node") {
                "node" => Language::Node,
                "python" => Language::Python,
                "sh" => Language::Sh,
                other => {
                    return Err(format!(
                        "run_script: language {other:?} is not one of node, python, sh"
                    ));
                }
            };
            Ok((language, script))
        });
        let (language, script) = match parsed {
            Ok(ok) => ok,
            Err(message) => {
                report(AgentEvent::ToolError {
                    tool: &call.name,
                    message: &message,
                });
                return Ok(json!({"error": message}).to_string());
            }
        };
        let name = script_name(language);
        // Scripts live in the env's scratch dir, which is never collected: a script of
        // an earlier attempt is not an artifact.
        let scratch = Path::new(WORKSPACE).join(".tmp");
        self.env
            .create_dir(&scratch, true, self.cancel)
            .await
            .map_err(AgentError::Sandbox)?;
        let script_path = scratch.join(name);
        self.env
            .write(&script_path, script.as_bytes(), self.cancel)
            .await
            .map_err(AgentError::Sandbox)?;
        let request = ExecRequest::argv(script_command(
            self.env.kind(),
            language,
            &script_path.display().to_string(),
        ))
        .cwd(WORKSPACE)
        // Never past the run's deadline.
        .timeout(
            self.config
                .limits
                .timeout()
                .min(self.deadline.saturating_duration_since(Instant::now()))
                .max(Duration::from_millis(1)),
        );
        let output = self
            .env
            .exec(request, self.cancel)
            .await
            .map_err(|e| match e.code {
                ErrorCode::Aborted => AgentError::Cancelled,
                _ => AgentError::Sandbox(e),
            })?;
        // Files over the collection limits fail the attempt, with the reason fed back.
        let (files, collect_error) = match collect_artifacts(
            self.env,
            Path::new(WORKSPACE),
            &BTreeMap::new(),
            &OutputSelection::visible(),
            CollectLimits::default(),
            self.cancel,
        )
        .await
        {
            Ok(files) => (files, None),
            Err(e) if e.code() == ErrorCode::Aborted => {
                return Err(AgentError::Cancelled);
            }
            Err(e) if e.code() == ErrorCode::ResourceExhausted => (Vec::new(), Some(e.to_string())),
            Err(e) => return Err(AgentError::Store(e.to_string())),
        };
        let mut verification = verify(&files);
        if let Some(extension) = self.requires
            && output.success()
            && collect_error.is_none()
            && !files.iter().any(|f| f.path.ends_with(extension))
        {
            verification.push(Verification {
                path: format!("*{extension}"),
                ok: false,
                slides: None,
                error: Some(format!("the run made no {extension} file in /workspace")),
            });
        }
        let succeeded =
            output.success() && collect_error.is_none() && verification.iter().all(|v| v.ok);
        let attempt = Attempt {
            number: self.attempts.len() as u32 + 1,
            language,
            script,
            exit_code: output.exit_code,
            signal: output.signal,
            timed_out: output.timed_out,
            stdout: tail(&output.stdout_text(), self.config.output_budget),
            stderr: tail(&output.stderr_text(), self.config.output_budget),
            duration_ms: output.duration_ms,
            usage,
            files: files.iter().map(|f| f.path.clone()).collect(),
            verification: verification.clone(),
            succeeded,
        };
        report(AgentEvent::Attempt(&attempt));
        let result = json!({
            "exitCode": attempt.exit_code,
            "signal": attempt.signal,
            "timedOut": attempt.timed_out,
            "stdout": attempt.stdout,
            "stderr": attempt.stderr,
            "files": files.iter().map(|f| json!({"path": f.path, "size": f.size})).collect::<Vec<_>>(),
            "verification": verification,
            "collectError": collect_error,
        })
        .to_string();
        if succeeded {
            if !files.is_empty() {
                self.last_good = Some(files);
            }
        } else {
            self.failed_runs += 1;
        }
        self.attempts.push(attempt);
        Ok(result)
    }
}

impl Agent {
    pub fn new(provider: Arc<dyn ModelProvider>, runner: Arc<Runner>) -> Self {
        Agent { provider, runner }
    }

    /// One session: a fresh sandbox, the skill as the system prompt, the loop.
    pub async fn run(
        &self,
        prompt: &str,
        skill: &Skill,
        config: &AgentConfig,
        cancel: &CancellationToken,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<AgentOutcome, AgentError> {
        if prompt.trim().is_empty() {
            return Err(AgentError::EmptyPrompt);
        }
        let mut policy = SandboxPolicy::default();
        self.runner
            .runtime_mount(config.backend, &mut policy)
            .await
            .map_err(|e| match e {
                RunError::Unavailable(message) => AgentError::Runtime(message),
                other => AgentError::Sandbox(EnvError::new(other.code(), other.to_string())),
            })?;
        let spec = SandboxSpec {
            workspace: None,
            limits: config.limits.clone(),
            policy,
        };
        let env = self
            .runner
            .backends()
            .create(config.backend, spec)
            .await
            .map_err(AgentError::Sandbox)?;
        let result = self
            .session(env.as_ref(), prompt, skill, config, cancel, report)
            .await;
        if let Err(e) = env.cleanup().await {
            tracing::warn!(error = %e, "agent: sandbox cleanup failed");
        }
        result
    }

    async fn session(
        &self,
        env: &dyn ExecutionEnv,
        prompt: &str,
        skill: &Skill,
        config: &AgentConfig,
        cancel: &CancellationToken,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<AgentOutcome, AgentError> {
        let started = Instant::now();
        let tools = tools();
        let mut messages = vec![Message::system(skill.instructions), Message::user(prompt)];
        let mut session = Session {
            env,
            config,
            cancel,
            deadline: started + config.deadline,
            requires: skill.requires,
            attempts: Vec::new(),
            corrections: Vec::new(),
            failed_runs: 0,
            last_good: None,
        };
        let mut answer = String::new();
        let ended = self
            .turns(&mut session, &mut messages, &tools, &mut answer, report)
            .await;
        let (status, reason, error) = match ended {
            Ok((status, reason)) => (status, reason, None),
            // Cancelled is the caller's own doing: no outcome.
            Err(AgentError::Cancelled | AgentError::Provider(ProviderError::Cancelled)) => {
                return Err(AgentError::Cancelled);
            }
            // Any other error ends the run, but keeps what was tried until then.
            Err(e) => {
                let info = ErrorInfo {
                    code: e.code(),
                    message: e.to_string(),
                };
                (AgentStatus::Failed, e.to_string(), Some(info))
            }
        };
        let artifacts = match session
            .last_good
            .take()
            .filter(|_| status == AgentStatus::Succeeded)
        {
            Some(files) => store_all(self.runner.store(), files)
                .await
                .map_err(|e| AgentError::Store(e.to_string()))?
                .into_iter()
                .map(|a| ArtifactInfo {
                    url: skillbox_run::object_url(&a.sha256, &a.path),
                    path: a.path,
                    size: a.size,
                    sha256: a.sha256,
                    content_type: a.content_type,
                })
                .collect(),
            None => Vec::new(),
        };
        Ok(AgentOutcome {
            status,
            reason,
            model: self.provider.name(),
            scripted: self.provider.is_scripted(),
            answer,
            attempts: session.attempts,
            corrections: session.corrections,
            artifacts,
            error,
        })
    }

    /// Model turns until the run ends by its own bounds (`Ok`) or on an error.
    async fn turns(
        &self,
        session: &mut Session<'_>,
        messages: &mut Vec<Message>,
        tools: &[ToolSpec],
        answer: &mut String,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<(AgentStatus, String), AgentError> {
        let config = session.config;
        let cancel = session.cancel;
        let past_deadline = || {
            format!(
                "the run passed its deadline of {} s",
                config.deadline.as_secs()
            )
        };
        let mut turn = 0;
        let mut streak = Streak::default();
        loop {
            if cancel.is_cancelled() {
                return Err(AgentError::Cancelled);
            }
            if turn >= config.max_turns {
                // The last allowed turn ran a script that made verified files: that is
                // the run's result, though the model had no turn left to say so.
                if session.last_good.is_some() {
                    return Ok((
                        AgentStatus::Succeeded,
                        format!(
                            "the last run made verified files; the model had no turn left after it (maxTurns {})",
                            config.max_turns
                        ),
                    ));
                }
                return Ok((AgentStatus::Failed, streak.turn_limit_reason(turn)));
            }
            let left = session.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok((AgentStatus::Failed, past_deadline()));
            }
            turn += 1;
            let reply = tokio::select! {
                reply = self.provider.complete(messages, tools, cancel) => reply?,
                () = tokio::time::sleep(left) => return Ok((AgentStatus::Failed, past_deadline())),
            };
            report(AgentEvent::ModelTurn {
                turn,
                text: &reply.message.content,
            });
            answer.clone_from(&reply.message.content);
            let calls = reply.message.tool_calls.clone();
            messages.push(reply.message);
            if calls.is_empty() {
                if session.last_good.is_some() {
                    return Ok((
                        AgentStatus::Succeeded,
                        "the model stopped after a run that made verified files".to_string(),
                    ));
                }
                // Prose, often with the script in a code block: say so, and how to run it.
                let correction =
                    Correction::no_tool_call(turn, answer, !session.attempts.is_empty(), tools);
                messages.push(Message::user(correction.message.clone()));
                session.corrections.push(correction);
                streak.push(Some(CorrectionKind::NoToolCall));
                continue;
            }
            // Every call gets an answer (the API wants one per id), but the bounds hold
            // inside a turn too: once one is reached, the rest are skipped.
            let mut usage = reply.usage;
            let (mut ran, mut malformed) = (false, false);
            for (i, call) in calls.iter().enumerate() {
                let skip = if cancel.is_cancelled() {
                    return Err(AgentError::Cancelled);
                } else if session.failed_runs >= config.max_attempts {
                    Some("maxAttempts reached")
                } else if Instant::now() >= session.deadline {
                    Some("the run's deadline passed")
                } else if i >= MAX_CALLS_PER_TURN {
                    Some("too many tool calls in one turn")
                } else {
                    None
                };
                let content = if let Some(why) = skip {
                    json!({"error": format!("skipped: {why}")}).to_string()
                } else if let Some(correction) = Correction::malformed_call(turn, call, tools) {
                    report(AgentEvent::ToolError {
                        tool: &call.name,
                        message: &correction.message,
                    });
                    let content = json!({"error": correction.message}).to_string();
                    session.corrections.push(correction);
                    malformed = true;
                    content
                } else {
                    ran = true;
                    session.tool(call, usage.take(), report).await?
                };
                messages.push(Message::tool(call.id.clone(), content));
            }
            streak.push((malformed && !ran).then_some(CorrectionKind::MalformedCall));
            if session.failed_runs >= config.max_attempts {
                return Ok((
                    AgentStatus::Failed,
                    format!(
                        "{} runs failed (maxAttempts {})",
                        session.failed_runs, config.max_attempts
                    ),
                ));
            }
        }
    }
}
