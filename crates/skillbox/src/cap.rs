//! `skillbox cap …`: the capabilities of a project (`<project>/capabilities/*/manifest.yaml`
//! and `<data>/capabilities/*`), and who granted them what.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand, ValueEnum};
use skillbox_capability::{Capability, CapabilityRegistry, Scope, TrustStore, ceiling};

use crate::terminal::{escaped, escaped_path};

#[derive(Debug, Args)]
pub struct CapArgs {
    /// The project whose capabilities and grants these are [default: the current
    /// directory]
    #[arg(long, global = true, value_name = "DIR")]
    project: Option<PathBuf>,
    /// Load capabilities from DIR too (repeatable), after <project>/capabilities and
    /// <data>/capabilities.
    #[arg(long = "root", global = true, value_name = "DIR")]
    roots: Vec<PathBuf>,
    /// Keep and read grants in the records database `skillbox serve --db` nodes share
    /// (`postgres://…`) instead of the data dir: what is granted there, every node runs.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "SKILLBOX_DB",
        hide_env_values = true
    )]
    db: Option<String>,
    #[command(subcommand)]
    command: CapCommand,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum GrantScope {
    /// For the next run only.
    Once,
    /// For this project, kept in the data dir (not for host capabilities).
    Project,
}

#[derive(Debug, Subcommand)]
enum CapCommand {
    /// Every capability that loads, with its environment, lifecycle and grant; then each
    /// one that does not, and why.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One capability's manifest, what it needs granted, and its grants.
    Show { name: String },
    /// Grant NAME what its manifest declares: running in its environment and each
    /// permission.
    Grant {
        name: String,
        #[arg(long, value_enum, default_value = "project")]
        scope: GrantScope,
    },
    /// Remove every grant of NAME in this project.
    Revoke { name: String },
    /// Refuse NAME in this project, whatever is granted (the most restrictive rule wins).
    Deny { name: String },
    /// Lift a deny.
    Allow { name: String },
    /// The JSON Schema of manifest.yaml.
    Schema,
    /// Start NAME (persistent) in its declared environment, if granted, and return once
    /// it answers at its endpoint: a unix socket on the host (only you may open it)
    /// forwarded into the sandbox, which keeps no network of its own. A supervisor
    /// keeps it running until `cap stop`; if it ends by itself it is `failed` and stays
    /// down.
    Start {
        name: String,
        /// Where clients connect: unix:PATH (default: a socket in the data dir, printed)
        /// or a loopback ADDRESS:PORT (any local user may connect to that).
        #[arg(long, value_name = "ADDR")]
        listen: Option<String>,
        /// Supervise from this terminal until Ctrl-C instead of in the background.
        #[arg(long)]
        foreground: bool,
        /// Print the service as JSON.
        #[arg(long)]
        json: bool,
        #[arg(long, hide = true)]
        detached: bool,
    },
    /// Stop NAME and everything it started; a failed one is cleared.
    Stop {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// The services started in this project: state, process, what they serve and where
    /// to connect; for a failed one, how it ended and the tail of its stderr.
    Status {
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run NAME once (oneshot, ondemand) in its declared environment, if granted; the
    /// files its write_file permissions name come back.
    Run {
        name: String,
        /// A file put in /workspace first, by its name (repeatable).
        #[arg(long = "input", value_name = "FILE")]
        inputs: Vec<PathBuf>,
        /// Feed FILE to the capability's stdin (`-` for this command's own stdin).
        #[arg(long, value_name = "FILE")]
        stdin: Option<PathBuf>,
        /// Copy what comes back into DIR (never through a symlink; existing files kept
        /// unless --overwrite).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        #[arg(long, requires = "out")]
        overwrite: bool,
        /// Print the outcome as JSON.
        #[arg(long)]
        json: bool,
        /// Arguments after the manifest's own.
        #[arg(last = true, value_name = "ARGS")]
        args: Vec<String>,
    },
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox cap: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(message: &str) -> ExitCode {
    eprintln!("skillbox cap: {message}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

fn project_root(flag: Option<&Path>) -> Result<PathBuf, String> {
    let dir = match flag {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?,
    };
    dir.canonicalize()
        .map_err(|e| format!("--project {}: {e}", dir.display()))
}

fn find<'a>(registry: &'a CapabilityRegistry, name: &str) -> Result<&'a Capability, String> {
    registry.get(name).ok_or_else(|| registry.missing(name))
}

pub async fn run(args: CapArgs, data_dir: &Path) -> ExitCode {
    if let CapCommand::Schema = args.command {
        match serde_json::to_string_pretty(&skillbox_capability::schema()) {
            Ok(text) => println!("{text}"),
            Err(e) => return failed(&e.to_string()),
        }
        return ExitCode::SUCCESS;
    }
    let project = match project_root(args.project.as_deref()) {
        Ok(project) => project,
        Err(e) => return usage(&e),
    };
    let mut roots = vec![project.join("capabilities"), data_dir.join("capabilities")];
    roots.extend(args.roots.iter().cloned());
    let registry = CapabilityRegistry::load(&roots);
    let trust = match &args.db {
        None => TrustStore::open(data_dir),
        Some(url) => {
            let grants = match skillbox_store::RecordsDb::postgres(url)
                .await
                .and_then(|records| skillbox_store::GrantRecords::open(&records))
            {
                Ok(grants) => grants,
                Err(e) => return failed(&e.to_string()),
            };
            TrustStore::in_records(data_dir, grants)
        }
    };
    match args.command {
        CapCommand::Schema => ExitCode::SUCCESS,
        CapCommand::Start {
            name,
            listen,
            foreground,
            json,
            detached,
        } => {
            let capability = match find(&registry, &name) {
                Ok(c) => c,
                Err(e) => return usage(&e),
            };
            let start = crate::cap_service::Start {
                name,
                listen,
                foreground: foreground || detached,
                json,
                detached,
            };
            crate::cap_service::start(capability, &project, &args.roots, &trust, data_dir, start)
                .await
        }
        CapCommand::Stop { name, json } => {
            crate::cap_service::stop(&project, data_dir, &name, json).await
        }
        CapCommand::Status { name, json } => {
            crate::cap_service::status(&project, data_dir, name.as_deref(), json)
        }
        CapCommand::Run {
            name,
            inputs,
            stdin,
            out,
            overwrite,
            json,
            args: call_args,
        } => {
            let capability = match find(&registry, &name) {
                Ok(c) => c,
                Err(e) => return usage(&e),
            };
            call(
                capability,
                &project,
                &trust,
                data_dir,
                Call {
                    inputs,
                    stdin,
                    out,
                    overwrite,
                    json,
                    args: call_args,
                },
            )
            .await
        }
        CapCommand::List { json } => {
            let standings = standings(&trust, registry.iter(), &project).await;
            let granted = |c: &Capability| standings.get(c.name()).cloned().unwrap_or_default();
            if json {
                let list: Vec<serde_json::Value> = registry
                    .iter()
                    .map(|c| {
                        serde_json::json!({
                            "name": c.name(),
                            "environment": c.manifest.environment,
                            "lifecycle": c.manifest.lifecycle,
                            "description": c.manifest.description,
                            "dir": c.dir,
                            "grant": granted(c),
                        })
                    })
                    .collect();
                let errors: Vec<String> = registry.errors().iter().map(|e| e.to_string()).collect();
                println!(
                    "{}",
                    serde_json::json!({"capabilities": list, "errors": errors})
                );
            } else {
                for c in registry.iter() {
                    println!(
                        "{:<24} {:<7} {:<10} {:<12} {}",
                        escaped(c.name()),
                        c.manifest.environment.to_string(),
                        c.manifest.lifecycle.as_str(),
                        escaped(&granted(c)),
                        escaped(&c.manifest.description)
                    );
                }
                for e in registry.errors() {
                    eprintln!("skillbox cap: not loaded: {}", escaped(&e.to_string()));
                }
            }
            ExitCode::SUCCESS
        }
        CapCommand::Show { name } => {
            let capability = match find(&registry, &name) {
                Ok(c) => c,
                Err(e) => return usage(&e),
            };
            let standings = standings(&trust, [capability], &project).await;
            let granted = |c: &Capability| standings.get(c.name()).cloned().unwrap_or_default();
            let shown = serde_json::json!({
                "manifest": capability.manifest,
                "dir": capability.dir,
                "needs": capability.manifest.needs(),
                "ceiling": ceiling(capability.manifest.environment).as_str(),
                "grant": granted(capability),
            });
            match serde_json::to_string_pretty(&shown) {
                Ok(text) => println!("{text}"),
                Err(e) => return failed(&e.to_string()),
            }
            ExitCode::SUCCESS
        }
        CapCommand::Grant { name, scope } => {
            let capability = match find(&registry, &name) {
                Ok(c) => c,
                Err(e) => return usage(&e),
            };
            let scope = match scope {
                GrantScope::Once => Scope::Once,
                GrantScope::Project => Scope::Project,
            };
            match trust.grant(capability, scope, &project).await {
                Ok(grant) => {
                    eprintln!(
                        "skillbox cap: granted {name} ({}) in {}: {}",
                        grant.scope.as_str(),
                        project.display(),
                        grant.covers.iter().cloned().collect::<Vec<_>>().join(", ")
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => usage(&e.message),
            }
        }
        CapCommand::Revoke { name } => match trust.revoke(&name, &project).await {
            Ok(n) => {
                eprintln!(
                    "skillbox cap: revoked {n} grant(s) of {name} in {}",
                    project.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => failed(&e.message),
        },
        CapCommand::Deny { name } => match trust.deny(&name, &project).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(&e.message),
        },
        CapCommand::Allow { name } => match trust.allow(&name, &project).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(&e.message),
        },
    }
}

/// Where each of `capabilities` stands in `project`, by name (the error's message
/// when that cannot be read).
async fn standings<'a>(
    trust: &TrustStore,
    capabilities: impl IntoIterator<Item = &'a Capability>,
    project: &Path,
) -> std::collections::HashMap<String, String> {
    let mut standings = std::collections::HashMap::new();
    for c in capabilities {
        let standing = match trust.standing(c, project).await {
            Ok(standing) => standing.describe().to_string(),
            Err(e) => e.message,
        };
        standings.insert(c.name().to_string(), standing);
    }
    standings
}

struct Call {
    inputs: Vec<PathBuf>,
    stdin: Option<PathBuf>,
    out: Option<PathBuf>,
    overwrite: bool,
    json: bool,
    args: Vec<String>,
}

async fn call(
    capability: &Capability,
    project: &Path,
    trust: &TrustStore,
    data_dir: &Path,
    call: Call,
) -> ExitCode {
    use skillbox_client::outdir::{Declared, ExportOptions, Exported, OutDir};
    let mut inputs = Vec::new();
    for path in &call.inputs {
        let Some(name) = path.file_name() else {
            return usage(&format!("--input {}: names no file", path.display()));
        };
        match std::fs::read(path) {
            Ok(bytes) => inputs.push((PathBuf::from(name), bytes.into())),
            Err(e) => return usage(&format!("--input {}: {e}", path.display())),
        }
    }
    let stdin = match &call.stdin {
        None => None,
        Some(path) if path.as_os_str() == "-" => {
            use std::io::Read;
            let mut bytes = Vec::new();
            if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
                return usage(&format!("--stdin -: {e}"));
            }
            Some(bytes)
        }
        Some(path) => match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) => return usage(&format!("--stdin {}: {e}", path.display())),
        },
    };
    // What the capability declared (its write_file globs) lands in --out itself.
    let declared = match skillbox_capability::outputs(capability) {
        Ok(Some(globs)) => Declared::Globs(globs),
        Ok(None) => Declared::Nothing,
        Err(e) => return failed(&e.to_string()),
    };
    let mut out = match &call.out {
        Some(dir) => match OutDir::open(
            dir,
            ExportOptions {
                overwrite: call.overwrite,
                declared,
                own_dir_prefix: "cap",
                ..ExportOptions::default()
            },
        ) {
            Ok(out) => Some(out),
            Err(e) => return usage(&e.message),
        },
        None => None,
    };
    let backends = skillbox_registry::BackendRegistry::new(skillbox_run::registry_config(data_dir));
    let cancel = skillbox_env::CancellationToken::new();
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.cancel();
        }
    });
    let request = skillbox_capability::CapabilityCall {
        args: call.args,
        inputs,
        stdin,
    };
    // Collected within the limits of the CLI's own runs.
    let collect = skillbox_run::RunnerConfig::new(data_dir).door.collect;
    let outcome = match skillbox_capability::run(
        capability, request, project, trust, &backends, collect, &cancel,
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(e) => return failed(&format!("{}: {e}", capability.name())),
    };
    let mut undelivered = false;
    let mut written = Vec::new();
    for file in &outcome.files {
        match out.as_mut().map(|o| o.write(&file.path, &file.bytes)) {
            Some(Ok(Exported::Written(path))) => written.push(path.display().to_string()),
            Some(Ok(Exported::NotSelected)) | None => {}
            Some(Err(e)) => {
                // The message names the file.
                eprintln!("skillbox cap: {}", escaped(&e.message));
                undelivered = true;
            }
        }
    }
    let status = outcome.output.shell_status().clamp(0, 255) as u8;
    if call.json {
        let mut shown = serde_json::json!({
            "capability": capability.name(),
            "grant": outcome.scope.as_str(),
            "output": outcome.output,
            "files": outcome.files.iter().map(|f| serde_json::json!({"path": f.path, "size": f.size, "sha256": f.sha256})).collect::<Vec<_>>(),
            "written": written,
        });
        // With a network section only, as a run's `egress`.
        if !outcome.egress.is_empty() {
            shown["egress"] = serde_json::json!(outcome.egress);
        }
        println!("{shown}");
    } else {
        print!("{}", outcome.output.stdout_text());
        eprint!("{}", outcome.output.stderr_text());
        for file in &outcome.files {
            let place = match &out {
                Some(out) => escaped_path(&out.path().join(&file.path)),
                None => format!("{} (--out DIR to copy it)", escaped(&file.path)),
            };
            eprintln!("skillbox cap: made {place}, {} bytes", file.size);
        }
    }
    if status == 0 && undelivered {
        return ExitCode::from(crate::EXIT_SETUP_FAILED);
    }
    ExitCode::from(status)
}
