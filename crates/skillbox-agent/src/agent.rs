//! The loop, its tools (implemented only over `ExecutionEnv`) and what it records: the
//! run's skills placed first (over its scope's last snapshot), listed in the system
//! prompt, read and run by name; the scope saved after.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use skillbox_door::{Collection, Workspace};
use skillbox_env::{
    CancellationToken, EnvError, ErrorCode, ExecRequest, ExecutionEnv, Limits, SandboxPolicy,
    SandboxSpec,
};
use skillbox_protocol::{
    AgentStatus, ArtifactInfo, Attempt, ErrorInfo, Language, OutputSelection, SandboxedKind,
    SkillsPlaced, SnapshotReport, Usage, Verification, WorkspacePath, WorkspaceRoot,
};
use skillbox_run::{PlannedSkills, RunError, Runner, Scope, script_command, script_name};
use skillbox_store::{CollectLimits, CollectedFile, store_all};

use crate::correction::{
    Correction, CorrectionKind, Corrects, Echo, SAME_TURN_LIMIT, Streak, fingerprint,
};
use crate::provider::{Message, ModelProvider, ProviderError, ToolCall, ToolSpec};
use crate::skills::Skill;

/// Tool calls executed per model turn; the rest are answered "skipped".
const MAX_CALLS_PER_TURN: usize = 8;
/// Characters of a skill's description in the system prompt's listing.
const DESCRIPTION_CHARS: usize = 300;
/// Characters of a SKILL.md body `read_skill` hands to the model (the head is kept).
const SKILL_BODY_CHARS: usize = 32_000;
/// The bytes of each string argument a refused call keeps in the history the model is
/// sent again. A refused call ran nothing; a small model's nonsense (a path of a
/// thousand characters) would otherwise fill its context again every turn.
const REFUSED_ARGUMENT_KEPT: usize = 200;

/// Bounds of one agent run, and what its sandbox starts with.
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
    pub backend: SandboxedKind,
    /// Skills placed in `/workspace` before the loop, by name (the runner's skills
    /// workspace and the tenant's own, as a run's `skills`): listed in the system prompt,
    /// read with `read_skill`, run with `run_skill`.
    pub skills: Vec<String>,
    /// The scope whose last snapshot of `/workspace` the sandbox starts from; a new one
    /// is saved after the loop.
    pub scope_key: Option<String>,
    /// Whose user skills and scopes these are.
    pub tenant: String,
    /// What the scripts may reach through the egress proxy; `None`: no network.
    pub network: Option<skillbox_protocol::NetworkPolicy>,
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
            backend: SandboxedKind::Native,
            skills: Vec::new(),
            scope_key: None,
            tenant: skillbox_store::LOCAL_TENANT.to_string(),
            network: None,
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
    /// The skills placed before the loop.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub placed: Option<SkillsPlaced>,
    /// With a scope: the snapshot the run started from and the one it left (or why none
    /// was saved).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotReport>,
    /// Every connection the scripts asked the egress proxy for.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<skillbox_protocol::EgressConnection>,
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
    /// Collecting or storing the run's files failed (a store past its budget is
    /// `quota_exceeded`, as for a plain run).
    #[error("artifacts: {0}")]
    Store(skillbox_store::StoreError),
    /// The run's skills or scope could not be set up (a name that is not there, a
    /// snapshot that cannot be restored); the message names the field.
    #[error("{0}")]
    Workspace(RunError),
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
            AgentError::Provider(
                ProviderError::Config(_)
                | ProviderError::Transcript(_)
                | ProviderError::Refused { .. },
            ) => ErrorCode::Invalid,
            AgentError::Provider(_) => ErrorCode::Unavailable,
            AgentError::Sandbox(e) => e.code,
            AgentError::Runtime(_) => ErrorCode::Unavailable,
            AgentError::Store(e) => e.code(),
            AgentError::Workspace(e) => e.code(),
        }
    }
}

/// What a run's sandbox starts with, found before it is made.
struct Setup {
    skills: Option<PlannedSkills>,
    scope: Option<Scope>,
}

/// Runs agent sessions: a model, and a sandbox per session from the runner's backends,
/// whose files go to the runner's artifact store.
#[derive(Debug)]
pub struct Agent {
    provider: Arc<dyn ModelProvider>,
    runner: Arc<Runner>,
}

/// The tools; `read_skill` and `run_skill` only when the run has skills, their names
/// the schema's enum (a call naming another is corrected against it).
fn tools(skills: &[skillbox_skills::Skill], root: &WorkspaceRoot) -> Vec<ToolSpec> {
    let mut tools = vec![
        ToolSpec {
            name: "run_script".into(),
            description: format!(
                "Run a script in the sandbox (cwd {root}). Returns exitCode, stdout, stderr, the files in {root} and, for .pptx files, a verification."
            ),
            parameters: json!({"type": "object", "properties": {
                "language": {"type": "string", "enum": ["node", "python", "sh"]},
                "script": {"type": "string", "minLength": 1}
            }, "required": ["language", "script"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "read_file".into(),
            description: format!("Read a text file from {root}."),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string", "minLength": 1}}, "required": ["path"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "write_file".into(),
            description: format!("Write a text file in {root}."),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string", "minLength": 1}, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
        },
        ToolSpec {
            name: "list_dir".into(),
            description: format!(
                "List a directory of {root} (the first few hundred entries of a larger one)."
            ),
            parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"], "additionalProperties": false}),
        },
    ];
    if !skills.is_empty() {
        let names: Vec<&str> = skills.iter().map(|s| s.meta.name.as_str()).collect();
        tools.push(ToolSpec {
            name: "read_skill".into(),
            description: "Read a skill's SKILL.md (its front matter and instructions), its folder in the sandbox and its scripts. Read a skill before using it.".into(),
            parameters: json!({"type": "object", "properties": {
                "name": {"type": "string", "enum": names}
            }, "required": ["name"], "additionalProperties": false}),
        });
        tools.push(ToolSpec {
            name: "run_skill".into(),
            description: format!("Run one of a skill's scripts (its path inside the skill's folder, e.g. scripts/run.py) with arguments, cwd {root}. Returns what run_script returns."),
            parameters: json!({"type": "object", "properties": {
                "skill": {"type": "string", "enum": names},
                "script": {"type": "string", "minLength": 1},
                "args": {"type": "array", "items": {"type": "string"}}
            }, "required": ["skill", "script"], "additionalProperties": false}),
        });
    }
    tools
}

/// The system prompt: the built-in skill's instructions, then the run's skills, each
/// by name, folder and description (cut); their SKILL.md bodies are read on demand.
fn system_prompt(
    instructions: &str,
    skills: &[skillbox_skills::Skill],
    root: &WorkspaceRoot,
) -> String {
    if skills.is_empty() {
        return instructions.to_string();
    }
    let mut prompt = format!(
        "{}\n\n## Skills\n\nThese skills are in the sandbox, each in its folder. Before using one, call read_skill with its name to read its SKILL.md. To run one of its scripts, call run_skill with the skill, the script's path inside the skill's folder and its arguments.\n\n",
        instructions.trim_end()
    );
    for skill in skills {
        let description = skill
            .meta
            .description
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        prompt.push_str(&format!(
            "- {} ({}): {}\n",
            skill.meta.name,
            skill.sandbox_dir(root.as_path()).display(),
            head(&description, DESCRIPTION_CHARS)
        ));
    }
    prompt
}

/// Why a run ended on a model that sent the same corrected turn again and again.
fn same_turn_reason(what: &str) -> String {
    format!(
        "stopped early: the model sent the same turn {SAME_TURN_LIMIT} times in a row ({what}), corrected each time"
    )
}

/// The first `budget` characters of `text`, marked when cut.
fn head(text: &str, budget: usize) -> String {
    if text.chars().count() <= budget {
        return text.to_string();
    }
    format!("{}…", text.chars().take(budget).collect::<String>())
}

/// `word` as sh reads it back: bare when plain, else in single quotes.
fn sh_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
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

/// A listing as a tool result of at most about `budget` characters (what `read_file`'s
/// content may take): the entries as a JSON array, or, when they do not fit, as many of
/// the first as do, with how many more there are.
fn listing(entries: &[skillbox_env::DirEntry], budget: usize) -> String {
    // Entry by entry, never the whole listing (100,000 names of control bytes are
    // 150 MB of JSON) for a result of a few KB.
    let mut array = String::from("[");
    let mut shown = 0;
    for entry in entries {
        let one = serde_json::to_string(entry).unwrap_or_default();
        if array.len() + one.len() + 1 > budget {
            break;
        }
        if shown > 0 {
            array.push(',');
        }
        array.push_str(&one);
        shown += 1;
    }
    array.push(']');
    if shown == entries.len() {
        return array;
    }
    format!(
        r#"{{"entries":{array},"more":{},"note":"the listing is cut: list a directory beneath this one, or run ls in a script"}}"#,
        entries.len() - shown
    )
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
    /// The sandbox through its door: tool paths parsed by the one rule.
    door: Workspace<'a>,
    /// What one attempt's collection may hold, and the most `read_file` hands the model.
    collect: CollectLimits,
    read_cap: u64,
    config: &'a AgentConfig,
    cancel: &'a CancellationToken,
    /// The run's skills (placed in the sandbox).
    skills: &'a [skillbox_skills::Skill],
    /// Files placed before the loop (restored, skills) by path and SHA-256: collection
    /// leaves them out unless a run changed them.
    inputs: BTreeMap<PathBuf, String>,
    /// When the whole run must end.
    deadline: Instant,
    /// A successful run must leave at least one file with this extension.
    requires: Option<&'static str>,
    attempts: Vec<Attempt>,
    corrections: Vec<Correction>,
    failed_runs: u32,
    last_good: Option<Vec<CollectedFile>>,
    /// The model turn being answered (for the corrections a tool makes).
    turn: u32,
    /// The last run, when it failed and nothing in the workspace changed since (no file
    /// written, no other run): sent again unchanged, it would fail the same way.
    unchanged_failure: Option<FailedRun>,
    /// Failed scripts sent again unchanged since something last ran.
    repeats: u32,
}

/// A run that failed, as the model sent it, and why in one line.
struct FailedRun {
    number: u32,
    language: Language,
    script: String,
    why: String,
}

/// Why `attempt` failed, in one line: the limit or exit and the error line of stderr,
/// else the collection or verification error.
fn why_failed(attempt: &Attempt, collect_error: Option<&str>) -> String {
    let ended = if attempt.timed_out {
        "timed out".to_string()
    } else if let Some(signal) = attempt.signal {
        format!("killed by signal {signal}")
    } else {
        format!("exit {}", attempt.exit_code.unwrap_or(-1))
    };
    let detail = collect_error
        .map(str::to_string)
        .or_else(|| {
            attempt
                .verification
                .iter()
                .find_map(|v| v.error.as_ref().map(|e| format!("{}: {e}", v.path)))
        })
        .or_else(|| {
            let lines = || {
                attempt
                    .stderr
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
            };
            lines()
                .find(|l| l.contains("Error") || l.contains("error"))
                .or_else(|| lines().next_back())
                .map(str::to_string)
        });
    match detail {
        Some(detail) => format!("{ended}: {detail}"),
        None => ended,
    }
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
            "write_file" => {
                let written = self.write_file(call).await;
                if written.is_ok() {
                    self.unchanged_failure = None;
                }
                written
            }
            "list_dir" => self.list_dir(call).await,
            "read_skill" if !self.skills.is_empty() => self.read_skill(call).await,
            "run_skill" if !self.skills.is_empty() => {
                return self.run_skill(call, usage, report).await;
            }
            // `Correction::malformed_call` answers calls to other tools before this.
            other => Err(format!(
                "unknown tool {other:?}; the tools are {}",
                tools(self.skills, self.door.root())
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
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

    /// A path from a tool call's argument `path`, by the one rule every door parses
    /// paths with; the error is the tool's answer.
    fn path(&self, call: &ToolCall) -> Result<WorkspacePath, String> {
        let raw = string_arg(call, "path")?;
        self.door.parse(&raw, "path").map_err(|e| e.message)
    }

    async fn read_file(&self, call: &ToolCall) -> Result<String, String> {
        let path = self.path(call)?;
        let shown = self.door.absolute(&path);
        // The size of what a read would return (through a symlink inside the workspace
        // too).
        let target = self
            .env
            .canonical(&shown, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        let info = self
            .env
            .file_info(&target, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        if info.size > self.read_cap {
            return Err(format!(
                "read_file {}: {} bytes, more than the {} bytes a read may return",
                shown.display(),
                info.size,
                self.read_cap
            ));
        }
        // Bounded by the read itself: a file swapped or grown since the look above is
        // refused as too large, never read whole.
        let bytes = self
            .env
            .read_bytes_max(&target, self.read_cap, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8(bytes)
            .map_err(|_| format!("read_file {}: not UTF-8 text", shown.display()))?;
        Ok(json!({"content": tail(&text, self.config.output_budget * 4)}).to_string())
    }

    async fn write_file(&self, call: &ToolCall) -> Result<String, String> {
        let path = self.path(call)?;
        let content = string_arg(call, "content")?;
        let size = content.len();
        self.door
            .write(&path, content.into_bytes().into(), false, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(
            json!({"written": self.door.absolute(&path).display().to_string(), "bytes": size})
                .to_string(),
        )
    }

    async fn list_dir(&self, call: &ToolCall) -> Result<String, String> {
        let path = self.path(call)?;
        let entries = self
            .door
            .list(&path, self.cancel)
            .await
            .map_err(|e| e.to_string())?;
        Ok(listing(&entries, self.config.output_budget * 4))
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
        let scratch = self.door.root().join_str(".tmp");
        self.env
            .create_dir(&scratch, true, self.cancel)
            .await
            .map_err(AgentError::Sandbox)?;
        let script_path = scratch.join(name);
        self.env
            .write(&script_path, script.as_bytes(), self.cancel)
            .await
            .map_err(AgentError::Sandbox)?;
        let argv = script_command(
            self.env.kind(),
            self.door.root(),
            language,
            &script_path.display().to_string(),
        );
        self.attempt(call, argv, language, script, usage, report)
            .await
    }

    /// The skill of a tool call's argument `field`, or an error naming the skills there are.
    fn skill(&self, call: &ToolCall, field: &str) -> Result<&skillbox_skills::Skill, String> {
        let name = string_arg(call, field)?;
        self.skills
            .iter()
            .find(|s| s.meta.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.skills.iter().map(|s| s.meta.name.as_str()).collect();
                format!(
                    "{}: no skill {name:?}; the skills: {}",
                    call.name,
                    names.join(", ")
                )
            })
    }

    async fn read_skill(&self, call: &ToolCall) -> Result<String, String> {
        let skill = self.skill(call, "name")?.clone();
        let folder = skill.sandbox_dir(self.door.root().as_path());
        let (doc, scripts) = tokio::task::spawn_blocking(move || {
            (skillbox_skills::skill::read(&skill.dir), skill.scripts())
        })
        .await
        .map_err(|e| format!("read_skill: reading the skill failed: {e}"))?;
        let doc = doc.map_err(|e| format!("read_skill: {e}"))?;
        let mut body = head(&doc.body, SKILL_BODY_CHARS);
        if doc.body.chars().count() > SKILL_BODY_CHARS {
            body.push_str(&format!(
                "\n[… cut at {SKILL_BODY_CHARS} characters; the whole file is {}/SKILL.md]",
                folder.display()
            ));
        }
        Ok(json!({
            "name": doc.meta.name,
            "folder": folder.display().to_string(),
            "frontMatter": doc.meta,
            "body": body,
            "scripts": scripts,
        })
        .to_string())
    }

    /// A skill's script by name, run through its path in the sandbox and recorded as an
    /// attempt whose script is the command line (language `sh`: it reads the same).
    async fn run_skill(
        &mut self,
        call: &ToolCall,
        usage: Option<Usage>,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<String, AgentError> {
        match self.skill_command(call).await {
            Ok((argv, line)) => {
                self.attempt(call, argv, Language::Sh, line, usage, report)
                    .await
            }
            Err(message) => {
                report(AgentEvent::ToolError {
                    tool: &call.name,
                    message: &message,
                });
                Ok(json!({"error": message}).to_string())
            }
        }
    }

    /// The argv of a `run_skill` call, and its command line as sh would read it.
    async fn skill_command(&self, call: &ToolCall) -> Result<(Vec<String>, String), String> {
        let skill = self.skill(call, "skill")?.clone();
        let script = string_arg(call, "script")?;
        let args: Vec<String> = match call.arguments.get("args") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(value) => value
                .as_array()
                .and_then(|items| {
                    items
                        .iter()
                        .map(|item| item.as_str().map(str::to_string))
                        .collect()
                })
                .ok_or("run_skill: argument \"args\" must be an array of strings")?,
        };
        let name = skill.meta.name.clone();
        let argv = {
            let script = script.clone();
            let root = self.door.root().as_path().to_path_buf();
            tokio::task::spawn_blocking(move || skill.script_command(&script, &args, &root))
                .await
                .map_err(|e| format!("run_skill: finding the script failed: {e}"))?
                .map_err(|e| format!("run_skill: {e}"))?
        };
        let line = format!(
            "# run_skill {name} {}\n{}\n",
            sh_quote(&script),
            argv.iter()
                .map(|w| sh_quote(w))
                .collect::<Vec<_>>()
                .join(" ")
        );
        Ok((argv, line))
    }

    /// Runs `argv` in `/workspace` as one attempt: the timeout rule, collection (inputs
    /// left out), verification and the count of failed runs. `script` is what the record
    /// shows. The script of a failed attempt sent again with nothing changed since is
    /// not run: it is answered with a correction.
    async fn attempt(
        &mut self,
        call: &ToolCall,
        argv: Vec<String>,
        language: Language,
        script: String,
        usage: Option<Usage>,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<String, AgentError> {
        if let Some(failed) = self
            .unchanged_failure
            .as_ref()
            .filter(|f| f.language == language && f.script == script)
        {
            let correction = Correction::repeated_script(
                self.turn,
                call,
                &script,
                failed.number,
                &failed.why,
                self.door.root().as_str(),
            );
            report(AgentEvent::ToolError {
                tool: &call.name,
                message: &correction.message,
            });
            let content = json!({"error": correction.message}).to_string();
            self.corrections.push(correction);
            self.repeats += 1;
            return Ok(content);
        }
        let request = ExecRequest::argv(argv)
            // Never past the run's deadline.
            .timeout(
                self.config
                    .limits
                    .timeout()
                    .min(self.deadline.saturating_duration_since(Instant::now()))
                    .max(Duration::from_millis(1)),
            );
        let outputs = OutputSelection::visible();
        let collection = Collection {
            inputs: &self.inputs,
            outputs: &outputs,
            limits: self.collect,
        };
        let (output, collected) = self
            .door
            .run_and_collect(Vec::new(), request, collection, self.cancel)
            .await
            .map_err(|e| match e.code {
                ErrorCode::Aborted => AgentError::Cancelled,
                _ => AgentError::Sandbox(e),
            })?;
        // Files over the collection limits fail the attempt, with the reason fed back.
        let (files, collect_error) = match collected {
            Ok(files) => (files, None),
            Err(e) if e.code() == ErrorCode::Aborted => {
                return Err(AgentError::Cancelled);
            }
            Err(e) if e.code() == ErrorCode::ResourceExhausted => (Vec::new(), Some(e.to_string())),
            Err(e) => return Err(AgentError::Store(e)),
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
                error: Some(format!(
                    "the run made no {extension} file in {}",
                    self.door.root()
                )),
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
        self.repeats = 0;
        self.unchanged_failure = (!succeeded).then(|| FailedRun {
            number: attempt.number,
            language,
            script: attempt.script.clone(),
            why: why_failed(&attempt, collect_error.as_deref()),
        });
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
        // Found and planned before a sandbox is made: a name that is not there ends the
        // run here.
        let setup = Setup {
            skills: self
                .runner
                .plan_skills(&config.skills, &config.tenant)
                .await
                .map_err(AgentError::Workspace)?,
            scope: config
                .scope_key
                .as_deref()
                .map(|key| self.runner.scope(&config.tenant, key))
                .transpose()
                .map_err(AgentError::Workspace)?,
        };
        let mut policy = SandboxPolicy {
            network: config.network.clone(),
            ..SandboxPolicy::default()
        };
        self.runner
            .runtime_mount(config.backend.kind(), &mut policy)
            .await
            .map_err(|e| match e {
                RunError::Unavailable(message) => AgentError::Runtime(message),
                other => AgentError::Sandbox(EnvError::new(other.code(), other.to_string())),
            })?;
        let spec = SandboxSpec {
            workspace: None,
            root: self.runner.root().clone(),
            limits: config.limits.clone(),
            policy,
        };
        let env = self
            .runner
            .backends()
            .create(config.backend.kind(), spec)
            .await
            .map_err(AgentError::Sandbox)?;
        let result = self
            .session(env.as_ref(), prompt, skill, config, &setup, cancel, report)
            .await;
        if let Err(e) = env.cleanup().await {
            tracing::warn!(error = %e, "agent: sandbox cleanup failed");
        }
        result
    }

    /// Restores the scope, places the skills, runs the loop, stores what the last good
    /// run made and saves the scope.
    #[expect(
        clippy::too_many_arguments,
        reason = "the run's parts, each borrowed from Agent::run"
    )]
    async fn session(
        &self,
        env: &dyn ExecutionEnv,
        prompt: &str,
        skill: &Skill,
        config: &AgentConfig,
        setup: &Setup,
        cancel: &CancellationToken,
        report: &(dyn Fn(AgentEvent<'_>) + Send + Sync),
    ) -> Result<AgentOutcome, AgentError> {
        let started = Instant::now();
        let setup_error = |e: RunError| match e {
            RunError::Aborted => AgentError::Cancelled,
            other => AgentError::Workspace(other),
        };
        let mut inputs = BTreeMap::new();
        // The scope's last workspace first, then the skills over it, as a run does.
        let mut snapshot = None;
        if let Some(scope) = &setup.scope {
            let (restored, files) = self
                .runner
                .restore_scope(env, scope, cancel)
                .await
                .map_err(setup_error)?;
            snapshot = Some(restored);
            inputs.extend(files);
        }
        let (placed, skills) = match &setup.skills {
            Some(planned) => {
                let placed = self
                    .runner
                    .place_skills(env, planned, cancel)
                    .await
                    .map_err(setup_error)?;
                inputs.extend(planned.projection.inputs());
                (Some(placed), planned.skills.as_slice())
            }
            None => (None, &[][..]),
        };
        let root = self.runner.root();
        let tools = tools(skills, root);
        let mut messages = vec![
            Message::system(system_prompt(skill.instructions, skills, root)),
            Message::user(prompt),
        ];
        let mut session = Session {
            env,
            door: self.runner.workspace(env),
            collect: self.runner.collect_limits(),
            read_cap: self.runner.read_caps().model,
            config,
            cancel,
            skills,
            inputs,
            deadline: started + config.deadline,
            requires: skill.requires,
            attempts: Vec::new(),
            corrections: Vec::new(),
            failed_runs: 0,
            last_good: None,
            turn: 0,
            unchanged_failure: None,
            repeats: 0,
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
                .map_err(AgentError::Store)?
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
        if let (Some(scope), Some(report)) = (&setup.scope, snapshot.as_mut()) {
            self.runner
                .save_scope(env, scope, report, cancel)
                .await
                .map_err(setup_error)?;
        }
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
            placed,
            snapshot,
            egress: env.egress(),
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
        let mut echo = Echo::default();
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
            let print = fingerprint(&reply.message.content, &calls);
            let asked_at = messages.len();
            messages.push(reply.message);
            session.turn = turn;
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
                if echo.push(Some(print)) >= SAME_TURN_LIMIT {
                    return Ok((AgentStatus::Failed, same_turn_reason("no tool call")));
                }
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
                let mut refused = true;
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
                    // A failed script sent again is answered with a correction, not run.
                    let corrections = session.corrections.len();
                    let content = session.tool(call, usage.take(), report).await?;
                    ran |= session.corrections.len() == corrections;
                    // A script that ran stays as sent: the model fixes it from there.
                    refused = !matches!(call.name.as_str(), "run_script" | "run_skill")
                        && is_error_answer(&content);
                    content
                };
                if refused && let Some(asked) = messages[asked_at].tool_calls.get_mut(i) {
                    cut_refused_arguments(&mut asked.arguments);
                }
                messages.push(Message::tool(call.id.clone(), content));
            }
            let repeated = session.repeats > 0 && !ran;
            streak.push(match (ran, malformed, repeated) {
                (true, _, _) => None,
                (false, true, _) => Some(CorrectionKind::MalformedCall),
                (false, false, true) => Some(CorrectionKind::RepeatedScript),
                (false, false, false) => None,
            });
            if session.repeats >= 2 {
                let first = session.unchanged_failure.as_ref().map_or(0, |f| f.number);
                return Ok((
                    AgentStatus::Failed,
                    format!(
                        "stopped early: the model sent the failed script of attempt {first} again, unchanged, {} times, told each time that it would fail the same way",
                        session.repeats
                    ),
                ));
            }
            let corrected = !ran && (malformed || repeated);
            if echo.push(corrected.then_some(print)) >= SAME_TURN_LIMIT {
                return Ok((
                    AgentStatus::Failed,
                    same_turn_reason("tool calls that could not run"),
                ));
            }
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

/// Whether a tool's answer is a refusal (`{"error": …}`).
fn is_error_answer(content: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(content)
        .is_ok_and(|answer| answer.get("error").is_some())
}

/// Cuts each string argument of a refused call to [`REFUSED_ARGUMENT_KEPT`] bytes (at
/// a character boundary), saying so, in the history only: the answer the model got
/// already said what was wrong with it.
fn cut_refused_arguments(arguments: &mut serde_json::Value) {
    let Some(fields) = arguments.as_object_mut() else {
        return;
    };
    for value in fields.values_mut() {
        let Some(text) = value.as_str() else {
            continue;
        };
        if text.len() <= REFUSED_ARGUMENT_KEPT {
            continue;
        }
        let mut end = REFUSED_ARGUMENT_KEPT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        *value = serde_json::Value::String(format!(
            "{}… (cut here: {} bytes in all; the call was refused)",
            &text[..end],
            text.len()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillbox_env::{DirEntry, FileKind};

    #[test]
    fn a_listing_past_its_budget_is_cut_and_says_how_many_more() {
        let entries: Vec<DirEntry> = (0..3000)
            .map(|i| DirEntry {
                name: format!("file-{i:05}"),
                kind: FileKind::File,
                size: Some(i),
            })
            .collect();
        let whole = listing(&entries[..3], 16_000);
        assert_eq!(whole, serde_json::to_string(&entries[..3]).unwrap());
        let cut = listing(&entries, 16_000);
        // The entries take at most the budget; the note and count a few words more.
        assert!(cut.len() <= 16_000 + 200, "{} characters", cut.len());
        let cut: serde_json::Value = serde_json::from_str(&cut).unwrap();
        let shown = cut["entries"].as_array().unwrap();
        assert!(shown.len() > 200, "{} entries shown", shown.len());
        assert_eq!(shown[0]["name"], "file-00000");
        assert_eq!(
            shown.len() as u64 + cut["more"].as_u64().unwrap(),
            entries.len() as u64
        );
    }
}
