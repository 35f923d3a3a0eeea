//! `skillbox agent PROMPT`: a model writes the script, skillbox runs it, errors go back,
//! the fixed run ships a verified file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use skillbox_agent::{
    Agent, AgentConfig, AgentEvent, AgentStatus, LoopbackProvider, ModelProvider, SKILL_NAMES,
    builtin_skill,
};
use skillbox_client::outdir::{Declared, ExportOptions, Exported, OutDir};
use skillbox_env::CancellationToken;
use skillbox_protocol::SandboxedKind;
use skillbox_run::RunnerConfig;
use skillbox_store::LOCAL_TENANT;

use crate::terminal::{escaped, escaped_path};
use crate::units::{parse_root, sandboxed_parser};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Model {
    /// A scripted model that replays the skill's transcript (offline, deterministic).
    Loopback,
    /// An OpenAI-compatible endpoint: SKILLBOX_MODEL_URL, SKILLBOX_MODEL, SKILLBOX_API_KEY.
    Openai,
}

#[derive(Debug, Args)]
pub struct AgentArgs {
    /// What to make.
    prompt: String,
    /// The built-in skill (its SKILL.md is the system prompt).
    #[arg(long, value_name = "NAME", default_value = "pptx")]
    builtin: String,
    /// Place the skill NAME in /workspace first (repeatable): the workspace's
    /// skills/NAME, a staged .skills-cache/SOURCE/NAME, or the user's own. The system
    /// prompt lists it; the model reads it with read_skill and runs its scripts with
    /// run_skill.
    #[arg(long = "skill", value_name = "NAME")]
    skills: Vec<String>,
    /// Start from this scope's last snapshot of /workspace (what earlier runs with the
    /// same KEY installed or built) and save a new one after the run.
    #[arg(long = "scope", value_name = "KEY")]
    scope: Option<String>,
    /// The workspace whose skills --skill names [default: the current directory]
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Let the model's scripts reach HOST through skillbox's egress proxy (repeatable;
    /// as `skillbox run --allow-net`). Without it they have no network at all.
    #[arg(long = "allow-net", value_name = "HOST")]
    allow_net: Vec<String>,
    /// Never let them reach HOST (repeatable; no port means every port).
    #[arg(long = "deny-net", value_name = "HOST", requires = "allow_net")]
    deny_net: Vec<String>,
    /// The model.
    #[arg(long, value_enum, default_value = "loopback")]
    model: Model,
    /// A loopback transcript to replay instead of the skill's own.
    #[arg(long, value_name = "FILE")]
    transcript: Option<PathBuf>,
    /// Failed runs before giving up.
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// Which boundary the scripts run behind.
    #[arg(long, value_parser = sandboxed_parser(), default_value_t = SandboxedKind::Native)]
    backend: SandboxedKind,
    /// Where the workspace is in every sandbox [default: /workspace]: the code's working
    /// directory, the paths the model and MCP clients are told, collection and
    /// snapshots follow it (beneath /workspace, /home, /srv, /work or /mnt).
    #[arg(long, value_name = "PATH", value_parser = parse_root)]
    workspace_root: Option<skillbox_protocol::WorkspaceRoot>,

    /// Disk for each script's /workspace and /tmp together (512M, 2G), or none for no
    /// bound.
    #[arg(long, value_parser = crate::units::parse_size_bound, default_value = "1G")]
    disk: crate::units::Bound,
    /// Copy the verified files into DIR (never through a symlink; existing files are
    /// kept unless --overwrite; hidden paths are never copied).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Replace files that already exist in --out DIR.
    #[arg(long, requires = "out")]
    overwrite: bool,
    /// Print the outcome as JSON.
    #[arg(long)]
    json: bool,
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox agent: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(message: &str) -> ExitCode {
    eprintln!("skillbox agent: {message}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

/// The line of stderr that says what went wrong: an `…Error: …` line if there is one.
fn first_line(text: &str) -> &str {
    let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty());
    lines()
        .find(|l| {
            l.split(':')
                .next()
                .is_some_and(|head| head.ends_with("Error") && !head.contains(' '))
        })
        .or_else(|| lines().next())
        .unwrap_or("")
}

pub fn provider(
    args_model: Model,
    skill: &skillbox_agent::Skill,
    transcript: Option<&Path>,
) -> Result<Arc<dyn ModelProvider>, String> {
    match args_model {
        Model::Loopback => {
            let text = match transcript {
                Some(path) => std::fs::read_to_string(path)
                    .map_err(|e| format!("--transcript {}: {e}", path.display()))?,
                None => skill
                    .transcript
                    .ok_or_else(|| {
                        format!(
                            "skill {} ships no loopback transcript; pass --transcript FILE",
                            skill.name
                        )
                    })?
                    .to_string(),
            };
            let provider = LoopbackProvider::from_json(&text).map_err(|e| match transcript {
                Some(path) => format!("--transcript {}: {e}", path.display()),
                None => e.to_string(),
            })?;
            Ok(Arc::new(provider))
        }
        Model::Openai => {
            let config =
                skillbox_agent::openai::OpenAiConfig::from_env().map_err(|e| e.to_string())?;
            let provider =
                skillbox_agent::openai::OpenAiProvider::new(config).map_err(|e| e.to_string())?;
            Ok(Arc::new(provider))
        }
    }
}

pub async fn run(args: AgentArgs, data_dir: &Path) -> ExitCode {
    if args.prompt.trim().is_empty() {
        return usage("PROMPT: empty; say what to make");
    }
    let Some(skill) = builtin_skill(&args.builtin) else {
        return usage(&format!(
            "--builtin {}: no such built-in skill (have: {})",
            args.builtin,
            SKILL_NAMES.join(", ")
        ));
    };
    if args.max_attempts == 0 {
        return usage("--max-attempts: must be at least 1");
    }
    let mut runner_config = RunnerConfig::new(data_dir);
    if let Some(root) = &args.workspace_root {
        runner_config.door.root = root.clone();
    }
    runner_config.limits.disk_bytes = args.disk.0;
    runner_config.skills_workspace = match &args.workspace {
        Some(dir) => Some(dir.clone()),
        None => std::env::current_dir().ok(),
    };
    // Read from the host, before anything starts: a name that is not there is bad usage.
    if let Err(e) = runner_config.find_skills(&args.skills, LOCAL_TENANT) {
        return usage(&e.to_string());
    }
    if let Some(key) = &args.scope
        && let Err(e) = skillbox_store::check_scope_key(key)
    {
        return usage(&format!("--scope: {e}"));
    }
    let network = (!args.allow_net.is_empty()).then(|| skillbox_protocol::NetworkPolicy {
        allow: args.allow_net.clone(),
        deny: args.deny_net.clone(),
    });
    if let Some(network) = &network
        && let Err(e) = skillbox_egress::Rules::new(network)
    {
        return usage(&format!("--allow-net/--deny-net: {e}"));
    }
    // Opened before the run: a missing directory fails fast, and what is written later
    // goes beneath this fd whatever happens to the path meanwhile. What is declared
    // (the verified artifacts) is known at the end.
    let mut out = match &args.out {
        Some(path) => {
            let options = ExportOptions {
                overwrite: args.overwrite,
                own_dir_prefix: "agent",
                ..ExportOptions::default()
            };
            match OutDir::open(path, options) {
                Ok(out) => Some(out),
                Err(e) => return usage(&e.message),
            }
        }
        None => None,
    };
    let provider = match provider(args.model, &skill, args.transcript.as_deref()) {
        Ok(provider) => provider,
        Err(e) => return usage(&e),
    };
    if provider.is_scripted() {
        eprintln!(
            "skillbox agent: model: loopback — a scripted model replaying a recorded session, not a live model"
        );
    } else {
        eprintln!("skillbox agent: model: {}", provider.name());
    }
    // Container backends carry the Node runtime in their image.
    let runner =
        match crate::local::runner_with(runner_config, args.backend == SandboxedKind::Native).await
        {
            Ok(runner) => Arc::new(runner),
            Err(e) => return failed(&e.to_string()),
        };
    let store = runner.store().clone();
    let agent = Agent::new(provider, runner);
    let mut config = AgentConfig {
        max_attempts: args.max_attempts,
        backend: args.backend,
        skills: args.skills.clone(),
        scope_key: args.scope.clone(),
        tenant: LOCAL_TENANT.to_string(),
        network,
        ..AgentConfig::default()
    };
    // Each script's sandbox is made from these limits, not the runner's.
    config.limits.disk_bytes = args.disk.0;
    let cancel = CancellationToken::new();
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.cancel();
        }
    });
    let report = |event: AgentEvent<'_>| match event {
        AgentEvent::Attempt(attempt) => {
            let verdict = if attempt.succeeded {
                "ok".to_string()
            } else if attempt.timed_out {
                "timed out".into()
            } else {
                match attempt.exit_code {
                    Some(code) => format!("exit {code}"),
                    None => format!("signal {}", attempt.signal.unwrap_or(0)),
                }
            };
            let detail = if attempt.succeeded {
                attempt
                    .verification
                    .iter()
                    .map(|v| format!("{}: {} slides, verified", v.path, v.slides.unwrap_or(0)))
                    .chain(
                        attempt
                            .files
                            .iter()
                            .filter(|f| !f.ends_with(".pptx"))
                            .cloned(),
                    )
                    .collect::<Vec<_>>()
                    .join("; ")
            } else if let Some(bad) = attempt.verification.iter().find(|v| !v.ok) {
                format!("{}: {}", bad.path, bad.error.clone().unwrap_or_default())
            } else {
                first_line(&attempt.stderr).to_string()
            };
            // The detail names the script's files and quotes its stderr.
            eprintln!(
                "attempt {}: {verdict} ({} ms) {}",
                attempt.number,
                attempt.duration_ms,
                escaped(&detail)
            );
        }
        AgentEvent::ToolError { tool, message } => {
            eprintln!("  tool {}: {}", escaped(tool), escaped(message));
        }
        AgentEvent::ModelTurn { .. } => {}
    };
    let outcome = match agent
        .run(&args.prompt, &skill, &config, &cancel, &report)
        .await
    {
        Ok(outcome) => outcome,
        Err(skillbox_agent::AgentError::Cancelled) => {
            eprintln!("skillbox agent: cancelled");
            return ExitCode::from(130);
        }
        Err(e) => return failed(&format!("{} ({})", e, e.code())),
    };
    let mut undelivered = 0;
    // The verified artifacts land in --out itself; anything else the run made goes into
    // a directory of its own beneath it.
    let verified = outcome
        .attempts
        .iter()
        .rev()
        .find(|attempt| attempt.succeeded)
        .map(|attempt| {
            attempt
                .verification
                .iter()
                .filter(|v| v.ok)
                .map(|v| v.path.clone())
                .collect()
        })
        .unwrap_or_default();
    if let Some(out) = out.as_mut() {
        out.declare(Declared::Paths(verified));
        for artifact in &outcome.artifacts {
            let bytes = match store.get(&artifact.sha256).await {
                Ok(bytes) => bytes,
                Err(e) => return failed(&e.to_string()),
            };
            match out.write(&artifact.path, &bytes) {
                Ok(Exported::Written(target)) => {
                    eprintln!("skillbox agent: wrote {}", escaped_path(&target));
                }
                Ok(Exported::NotSelected) => {
                    eprintln!(
                        "skillbox agent: not copied: {} (hidden)",
                        escaped(&artifact.path)
                    );
                }
                Err(e) => {
                    eprintln!("skillbox agent: {}", escaped(&e.message));
                    undelivered += 1;
                }
            }
        }
        if let Some(own) = out.own_dir() {
            eprintln!(
                "skillbox agent: the run's files that were not verified went into {}, a new directory of their own",
                escaped_path(own)
            );
        }
    }
    if args.json {
        match serde_json::to_string(&outcome) {
            Ok(text) => println!("{text}"),
            Err(e) => return failed(&e.to_string()),
        }
    } else {
        if !outcome.answer.is_empty() {
            println!("{}", outcome.answer);
        }
        eprintln!(
            "skillbox agent: {:?}: {}",
            outcome.status,
            escaped(&outcome.reason)
        );
    }
    if outcome.status == AgentStatus::Succeeded && undelivered > 0 {
        ExitCode::from(crate::EXIT_SETUP_FAILED)
    } else if outcome.status == AgentStatus::Succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
