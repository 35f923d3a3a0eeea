//! `skillbox cap start|stop|status`: persistent capabilities from the command line.
//!
//! `start` runs a supervisor: this binary again (`cap start NAME --foreground`), in a
//! session of its own, its stderr in `<services>/NAME.log`. It starts the service,
//! says on its stdout when it is ready (or why not), and then forwards clients until
//! it is stopped (SIGTERM, which `cap stop` sends) or the service ends by itself, which
//! leaves it `failed` and down. Killing the supervisor kills the sandbox with it.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use skillbox_capability::{
    CAP_START, Capability, Listen, Owner, ServiceTable, TrustStore, describe_failure,
};
use skillbox_protocol::{ServiceInfo, ServiceState};

/// What `cap start` was asked.
#[derive(Debug)]
pub struct Start {
    pub name: String,
    pub listen: Option<String>,
    pub foreground: bool,
    pub json: bool,
    /// Set in the supervisor a detached start runs: one line on stdout, then quiet.
    pub detached: bool,
}

/// The line a supervisor writes when its service is ready, or could not start.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Started {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    service: Option<ServiceInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn failed(message: &str) -> ExitCode {
    eprintln!("skillbox cap: {message}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

/// How to reach `info` from a shell, for people.
fn hint(info: &ServiceInfo) -> String {
    match info.endpoint.strip_prefix("unix:") {
        Some(path) if info.serves.starts_with("port ") => {
            format!("e.g. curl --unix-socket {path} http://localhost/")
        }
        Some(path) => format!("connect to the unix socket {path}"),
        None => format!(
            "connect to {}",
            info.endpoint.strip_prefix("tcp:").unwrap_or(&info.endpoint)
        ),
    }
}

fn show_ready(info: &ServiceInfo, json: bool) {
    if json {
        println!("{}", serde_json::to_string(info).unwrap_or_default());
    } else {
        println!("{}", info.endpoint);
        eprintln!(
            "skillbox cap: {} is ready ({}, serving {}): {}",
            info.name,
            info.process.as_deref().unwrap_or("?"),
            info.serves,
            hint(info)
        );
    }
}

pub async fn start(
    capability: &Capability,
    project: &Path,
    roots: &[PathBuf],
    trust: &TrustStore,
    data_dir: &Path,
    start: Start,
) -> ExitCode {
    let listen = match start
        .listen
        .as_deref()
        .map(str::parse::<Listen>)
        .transpose()
    {
        Ok(listen) => listen,
        Err(e) => {
            eprintln!("skillbox cap: --listen {e}");
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    if !start.foreground {
        return detach(project, roots, data_dir, &start);
    }
    let table = ServiceTable::new(data_dir, project, Owner::this_process(CAP_START));
    let backends = skillbox_registry::BackendRegistry::new(skillbox_run::registry_config(data_dir));
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => return failed(&format!("cannot watch for SIGTERM: {e}")),
        };
    // A stop (SIGTERM) or Ctrl-C while it starts ends the start and whatever it made.
    let started = tokio::select! {
        started = table.start(capability, project, trust, &backends, listen, None) => started,
        _ = terminate.recv() => {
            // Cut short, it may have registered the service already: end that one.
            let _ = table.stop_own(capability.name()).await;
            Err(skillbox_env::EnvError::aborted("start (stopped while it started)"))
        }
        _ = tokio::signal::ctrl_c() => {
            let _ = table.stop_own(capability.name()).await;
            Err(skillbox_env::EnvError::aborted("start (interrupted)"))
        }
    };
    let name = capability.name();
    match &started {
        Ok(info) if start.detached => {
            let line = Started {
                service: Some(info.clone()),
                error: None,
            };
            println!("{}", serde_json::to_string(&line).unwrap_or_default());
            quiet_stdout();
        }
        Ok(info) => show_ready(info, start.json),
        Err(e) => {
            let line = Started {
                service: table.status(name),
                error: Some(e.to_string()),
            };
            if start.detached || start.json {
                println!("{}", serde_json::to_string(&line).unwrap_or_default());
            }
            backends.shutdown().await;
            return failed(&format!("{name}: {e}"));
        }
    }
    tracing::info!(service = name, "supervising until stopped");
    let code = tokio::select! {
        _ = terminate.recv() => stop_here(&table, name).await,
        _ = tokio::signal::ctrl_c() => stop_here(&table, name).await,
        ended = table.ended(name) => {
            let info = ended.or_else(|| table.status(name));
            let why = info.as_ref().map(describe_failure).unwrap_or_default();
            eprintln!("skillbox cap: {name} failed and stays down: {why}");
            ExitCode::from(1)
        }
    };
    backends.shutdown().await;
    code
}

async fn stop_here(table: &ServiceTable, name: &str) -> ExitCode {
    match table.stop(name).await {
        Ok(_) => {
            eprintln!("skillbox cap: {name} stopped");
            ExitCode::SUCCESS
        }
        Err(e) => failed(&format!("stop {name}: {e}")),
    }
}

/// After the one line a detached start reads: stdout goes nowhere (the reader is gone,
/// and a write to a closed pipe must not end the supervisor).
fn quiet_stdout() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto our own stdout; both fds are open.
        unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
    }
}

/// Runs the supervisor in a session of its own and waits for its one line.
fn detach(project: &Path, roots: &[PathBuf], data_dir: &Path, start: &Start) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return failed(&format!("cannot find this program: {e}")),
    };
    let data_dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let dir = skillbox_capability::services_dir(&data_dir, project);
    if let Err(e) = {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
    } {
        return failed(&format!("{}: {e}", dir.display()));
    }
    let log_path = dir.join(format!("{}.log", start.name));
    // A start that is refused leaves no log it made (the refusal is printed).
    let new_log = std::fs::symlink_metadata(&log_path).is_err();
    let log = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
    {
        Ok(log) => log,
        Err(e) => return failed(&format!("{}: {e}", log_path.display())),
    };
    let mut command = std::process::Command::new(exe);
    command
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("cap")
        .arg("--project")
        .arg(project);
    for root in roots {
        command.arg("--root").arg(root);
    }
    command.args(["start", &start.name, "--foreground", "--json", "--detached"]);
    if let Some(listen) = &start.listen {
        command.arg("--listen").arg(listen);
    }
    command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(log);
    // SAFETY: setsid is async-signal-safe; the supervisor leaves our terminal's session
    // so a Ctrl-C there does not reach it.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return failed(&format!("cannot start the supervisor: {e}")),
    };
    let mut line = String::new();
    if let Some(stdout) = child.stdout.take() {
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
    }
    let answer: Option<Started> = serde_json::from_str(line.trim()).ok();
    match answer {
        Some(Started {
            service: Some(info),
            error: None,
        }) => {
            show_ready(&info, start.json);
            ExitCode::SUCCESS
        }
        Some(answer) => {
            if start.json {
                println!("{}", serde_json::to_string(&answer).unwrap_or_default());
            }
            if new_log && answer.service.is_none() {
                let _ = child.wait();
                let _ = std::fs::remove_file(&log_path);
            }
            failed(&format!(
                "{}: {}",
                start.name,
                answer.error.unwrap_or_else(|| "did not start".into())
            ))
        }
        None => {
            let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            failed(&format!(
                "{}: the supervisor ended ({status}) without starting it: {}",
                start.name,
                tail.join(" | ")
            ))
        }
    }
}

pub async fn stop(project: &Path, data_dir: &Path, name: &str, json: bool) -> ExitCode {
    let table = ServiceTable::new(data_dir, project, Owner::this_process(CAP_START));
    match table.stop(name).await {
        Ok(info) => {
            if json {
                println!("{}", serde_json::to_string(&info).unwrap_or_default());
            } else if info.state == ServiceState::Failed {
                eprintln!(
                    "skillbox cap: cleared {name}, which had failed: {}",
                    describe_failure(&info)
                );
            } else {
                eprintln!("skillbox cap: {name} stopped");
            }
            ExitCode::SUCCESS
        }
        Err(e) => failed(&e.to_string()),
    }
}

pub fn status(project: &Path, data_dir: &Path, name: Option<&str>, json: bool) -> ExitCode {
    let table = ServiceTable::new(data_dir, project, Owner::this_process(CAP_START));
    let services: Vec<ServiceInfo> = match name {
        Some(name) => match table.status(name) {
            Some(info) => vec![info],
            None => {
                return failed(&format!("{name} is not started in {}", project.display()));
            }
        },
        None => table.list(),
    };
    if json {
        let list = skillbox_protocol::ServiceList { services };
        println!("{}", serde_json::to_string(&list).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    for info in &services {
        println!(
            "{:<24} {:<9} {:<11} {:<24} {}",
            info.name,
            info.state.as_str(),
            info.process.as_deref().unwrap_or("-"),
            info.serves,
            info.endpoint
        );
        if matches!(info.state, ServiceState::Failed) {
            println!("    {}", describe_failure(info));
        }
    }
    ExitCode::SUCCESS
}
