//! `skillbox skills …`: the skills of a workspace (its `skills/`, the staged marketplace
//! ones in `.skills-cache/`, the user's in the data dir), read from the host; staging a
//! marketplace archive; projecting them into a sandbox; running one's script there.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use skillbox_env::{
    BackendKind, CancellationToken, ExecEvent, ExecRequest, ExecutionEnv, Limits, SandboxSpec,
};
use skillbox_protocol::DEFAULT_WORKSPACE_ROOT;
use skillbox_registry::BackendRegistry;
use skillbox_skills::{
    Archive, HashCache, ProjectionConfig, SkillSet, Sources, StageLimits, apply, plan, stage,
};

use crate::terminal::{escaped, escaped_path};
use crate::units::{backend_parser, parse_duration};

#[derive(Debug, Args)]
pub struct SkillsArgs {
    /// The workspace whose skills/ and .skills-cache/ are read [default: the current
    /// directory]
    #[arg(long, global = true, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Whose skills in the data dir (<data>/users/<user>/skills) [default:
    /// $SKILLBOX_USER, else local]
    #[arg(long, global = true, value_name = "NAME")]
    user: Option<String>,
    #[command(subcommand)]
    command: SkillsCommand,
}

#[derive(Debug, Subcommand)]
enum SkillsCommand {
    /// Every skill that loads (name, where it comes from, its folder in a sandbox,
    /// description); then each that does not, and why. Needs no sandbox.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One skill: its front matter, where it is, its scripts, and its SKILL.md.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Stage a marketplace archive (tar, tar.gz or zip) or a local git repository's HEAD
    /// into .skills-cache/SOURCE/: only what changed is written, what is gone upstream
    /// is removed; a hostile archive is refused whole.
    Stage {
        source: String,
        /// The archive (.tar, .tar.gz, .zip).
        #[arg(required_unless_present = "git", conflicts_with = "git")]
        archive: Option<PathBuf>,
        /// A git repository on this machine instead.
        #[arg(long, value_name = "REPO")]
        git: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Project the workspace's skill roots into a sandbox, as every run does, and say
    /// whether anything was copied (nothing, when the sandbox has the same fingerprint).
    Project {
        #[command(flatten)]
        sandbox: SandboxArgs,
        #[arg(long)]
        json: bool,
    },
    /// Run SCRIPT of skill NAME in a sandbox, through its projected path
    /// (/workspace/skills/NAME/SCRIPT or /workspace/.skills-cache/SOURCE/NAME/SCRIPT).
    Run {
        name: String,
        /// The script, relative to the skill's folder (scripts/run.sh).
        script: String,
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Wall-clock limit of the script.
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        timeout: Duration,
        /// Print one JSON object (the command and its ExecOutput).
        #[arg(long)]
        json: bool,
        /// Arguments for the script.
        #[arg(last = true, value_name = "ARGS")]
        args: Vec<String>,
    },
}

#[derive(Debug, Args)]
struct SandboxArgs {
    /// Which boundary to run behind.
    #[arg(long, value_parser = backend_parser(), default_value_t = BackendKind::Native)]
    backend: BackendKind,
    /// Host directory shown as /workspace (kept; default: a temp one removed afterwards).
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// What to project: workspace entries, repeatable [default: AGENTS.md, skills,
    /// subagents, knowledge, .skills-cache]
    #[arg(long = "root", value_name = "ENTRY")]
    roots: Vec<String>,
    /// Leave the user's own skills out.
    #[arg(long)]
    no_user_skills: bool,
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox skills: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(message: &str) -> ExitCode {
    eprintln!("skillbox skills: {message}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

fn print_json(value: &impl serde::Serialize) {
    println!("{}", serde_json::to_string(value).unwrap_or_default());
}

/// The user whose skills are read: the flag, `$SKILLBOX_USER`, else `local`.
fn user_name(flag: Option<String>) -> Result<String, String> {
    let user = flag
        .or_else(|| {
            std::env::var("SKILLBOX_USER")
                .ok()
                .filter(|u| !u.is_empty())
        })
        .unwrap_or_else(|| "local".into());
    if skillbox_skills::skill::valid_name(&user) {
        Ok(user)
    } else {
        Err(format!(
            "--user {user:?}: use letters, digits, -, _ and ., at most 64"
        ))
    }
}

pub async fn run(args: SkillsArgs, data_dir: &Path) -> ExitCode {
    let workspace = match &args.workspace {
        Some(dir) => dir.clone(),
        None => match std::env::current_dir() {
            Ok(dir) => dir,
            Err(e) => return usage(&format!("the current directory: {e}")),
        },
    };
    let workspace = match workspace.canonicalize() {
        Ok(dir) if dir.is_dir() => dir,
        Ok(dir) => return usage(&format!("--workspace {}: not a directory", dir.display())),
        Err(e) => return usage(&format!("--workspace {}: {e}", workspace.display())),
    };
    let user = match user_name(args.user) {
        Ok(user) => user,
        Err(e) => return usage(&e),
    };
    let user_dir = Sources::user_dir(data_dir, &user);
    let sources = Sources {
        workspace: Some(workspace.clone()),
        user: Some((user.clone(), user_dir.clone())),
    };
    match args.command {
        SkillsCommand::List { json } => {
            let set = SkillSet::load(&sources);
            if json {
                let errors: Vec<String> = set.errors().iter().map(ToString::to_string).collect();
                let skills: Vec<_> = set.iter().collect();
                print_json(&serde_json::json!({"skills": skills, "errors": errors}));
            } else {
                for skill in set.iter() {
                    let description: String = skill.meta.description.chars().take(80).collect();
                    println!(
                        "{:<24} {:<32} {}",
                        escaped(&skill.meta.name),
                        escaped_path(&Path::new(DEFAULT_WORKSPACE_ROOT).join(&skill.projected)),
                        escaped(&description)
                    );
                }
                for e in set.errors() {
                    eprintln!("skillbox skills: not loaded: {}", escaped(&e.to_string()));
                }
            }
            ExitCode::SUCCESS
        }
        SkillsCommand::Show { name, json } => {
            let set = SkillSet::load(&sources);
            let Some(skill) = set.get(&name) else {
                return usage(&set.missing(&name));
            };
            let doc = match skillbox_skills::skill::read(&skill.dir) {
                Ok(doc) => doc,
                Err(e) => return failed(&e.to_string()),
            };
            if json {
                print_json(&serde_json::json!({
                    "skill": skill,
                    "sandboxDir": skill.sandbox_dir(Path::new(DEFAULT_WORKSPACE_ROOT)),
                    "scripts": skill.scripts(),
                    "body": doc.body,
                }));
            } else {
                println!("name:        {}", escaped(&skill.meta.name));
                println!("description: {}", escaped(&skill.meta.description));
                println!("host:        {}", escaped_path(&skill.dir));
                println!(
                    "sandbox:     {}",
                    escaped_path(&skill.sandbox_dir(Path::new(DEFAULT_WORKSPACE_ROOT)))
                );
                println!("scripts:     {}", escaped(&skill.scripts().join(", ")));
                println!();
                print!("{}", doc.body);
            }
            ExitCode::SUCCESS
        }
        SkillsCommand::Stage {
            source,
            archive,
            git,
            json,
        } => stage_command(&workspace, &source, archive, git, json),
        SkillsCommand::Project { sandbox, json } => {
            let cancel = CancellationToken::new();
            let user_dir = (!sandbox.no_user_skills).then_some(user_dir.as_path());
            let made = project_into(&workspace, user_dir, &sandbox, data_dir, None, &cancel).await;
            let (env, report) = match made {
                Ok(made) => made,
                Err(e) => return failed(&e),
            };
            let _ = env.cleanup().await;
            if json {
                print_json(&report);
            } else {
                let (copied, files, bytes, millis) = (
                    report["copied"].as_bool().unwrap_or(false),
                    &report["files"],
                    &report["bytes"],
                    &report["totalMillis"],
                );
                eprintln!(
                    "skillbox skills: {} {files} files, {bytes} bytes into /workspace in {millis} ms",
                    if copied {
                        "projected"
                    } else {
                        "already there (same fingerprint):"
                    }
                );
            }
            ExitCode::SUCCESS
        }
        SkillsCommand::Run {
            name,
            script,
            sandbox,
            timeout,
            json,
            args: script_args,
        } => {
            let set = SkillSet::load(&sources);
            let Some(skill) = set.get(&name) else {
                return usage(&set.missing(&name));
            };
            let argv = match skill.script_command(
                &script,
                &script_args,
                Path::new(DEFAULT_WORKSPACE_ROOT),
            ) {
                Ok(argv) => argv,
                Err(e) => return usage(&e),
            };
            let cancel = CancellationToken::new();
            let interrupt = cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    interrupt.cancel();
                }
            });
            let user_dir = (!sandbox.no_user_skills).then_some(user_dir.as_path());
            let (env, _) = match project_into(
                &workspace,
                user_dir,
                &sandbox,
                data_dir,
                Some(timeout),
                &cancel,
            )
            .await
            {
                Ok(made) => made,
                Err(e) => return failed(&e),
            };
            let request = ExecRequest::argv(argv.clone()).cwd(DEFAULT_WORKSPACE_ROOT);
            let code = run_script(env.as_ref(), request, json, &argv, &cancel).await;
            let _ = env.cleanup().await;
            code
        }
    }
}

fn stage_command(
    workspace: &Path,
    source: &str,
    archive: Option<PathBuf>,
    git: Option<PathBuf>,
    json: bool,
) -> ExitCode {
    let bytes;
    let archive = match (&archive, &git) {
        (_, Some(repo)) => Archive::Git(repo),
        (Some(path), None) => {
            bytes = match std::fs::read(path) {
                Ok(bytes) => bytes,
                Err(e) => return usage(&format!("{}: {e}", path.display())),
            };
            if bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06") {
                Archive::Zip(&bytes)
            } else {
                Archive::Tar(&bytes)
            }
        }
        (None, None) => return usage("give an ARCHIVE or --git REPO"),
    };
    match stage(workspace, source, archive, StageLimits::default()) {
        Ok(report) => {
            if json {
                print_json(&report);
            } else {
                eprintln!(
                    "skillbox skills: staged {} from {source} into {}: {} written, {} unchanged, {} removed",
                    escaped(&report.skills.join(", ")),
                    escaped_path(&workspace.join(skillbox_skills::SKILLS_CACHE).join(source)),
                    report.written.len(),
                    report.unchanged,
                    report.removed.len()
                );
                for skipped in &report.skipped {
                    eprintln!("skillbox skills: skipped {}", escaped(skipped));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) if e.code() == skillbox_env::ErrorCode::Unknown => failed(&e.to_string()),
        Err(e) => usage(&e.to_string()),
    }
}

/// A sandbox with the workspace's roots projected into it, and what the projection did.
async fn project_into(
    workspace: &Path,
    user_skills: Option<&Path>,
    sandbox: &SandboxArgs,
    data_dir: &Path,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
) -> Result<(Box<dyn ExecutionEnv>, serde_json::Value), String> {
    if let Some(dir) = &sandbox.workdir
        && !dir.is_dir()
    {
        return Err(format!("--workdir {}: no such directory", dir.display()));
    }
    let mut config = ProjectionConfig::default();
    if !sandbox.roots.is_empty() {
        config.roots = sandbox.roots.clone();
    }
    let started = Instant::now();
    let cache_dir = data_dir.join("skills");
    let _ = std::fs::create_dir_all(&cache_dir);
    let mut cache = HashCache::open(&cache_dir.join("hash-cache"));
    let projection =
        plan(Some(workspace), user_skills, &config, &mut cache).map_err(|e| e.to_string())?;
    let planned_ms = started.elapsed().as_millis() as u64;
    let mut limits = Limits::default();
    if let Some(timeout) = timeout {
        limits.timeout_ms = timeout.as_millis() as u64;
    }
    if sandbox.workdir.is_some() {
        // The caller's directory cannot be bounded (see `exec --disk`).
        limits.disk_bytes = None;
    }
    let spec = SandboxSpec {
        workspace: sandbox.workdir.clone(),
        limits,
        ..SandboxSpec::default()
    };
    let env = BackendRegistry::new(skillbox_run::registry_config(data_dir))
        .create_one_shot(sandbox.backend, spec)
        .await
        .map_err(|e| e.to_string())?;
    let applied = match apply(env.as_ref(), &projection, &config, cancel).await {
        Ok(applied) => applied,
        Err(e) => {
            let _ = env.cleanup().await;
            return Err(format!("projection: {e}"));
        }
    };
    for note in &projection.notes {
        tracing::info!("projection: {note}");
    }
    let report = serde_json::json!({
        "copied": applied.copied,
        "files": applied.files,
        "bytes": applied.bytes,
        "fingerprint": applied.fingerprint,
        "planMillis": planned_ms,
        "applyMillis": applied.millis,
        "totalMillis": planned_ms + applied.millis,
        "notes": projection.notes,
        "backend": sandbox.backend,
    });
    Ok((env, report))
}

async fn run_script(
    env: &dyn ExecutionEnv,
    request: ExecRequest,
    json: bool,
    argv: &[String],
    cancel: &CancellationToken,
) -> ExitCode {
    use std::io::Write;
    if json {
        return match env.exec(request, cancel).await {
            Ok(output) => {
                let status = output.shell_status().clamp(0, 255) as u8;
                print_json(&serde_json::json!({"command": argv, "output": output}));
                ExitCode::from(status)
            }
            Err(e) => failed(&e.to_string()),
        };
    }
    let mut stream = match env.exec_stream(request, cancel).await {
        Ok(stream) => stream,
        Err(e) => return failed(&e.to_string()),
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(ExecEvent::Stdout(chunk)) => {
                let _ = std::io::stdout().write_all(&chunk);
            }
            Ok(ExecEvent::Stderr(chunk)) => {
                let _ = std::io::stderr().write_all(&chunk);
            }
            Ok(ExecEvent::Exit(output)) => {
                let _ = std::io::stdout().flush();
                return ExitCode::from(output.shell_status().clamp(0, 255) as u8);
            }
            Err(e) => return failed(&e.to_string()),
        }
    }
    failed("the script's output ended without an exit status")
}
