//! `skillbox exec`: one command in a fresh sandbox.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, ExecEvent, ExecRequest, ExecutionEnv, Limits,
    SandboxSpec,
};
use skillbox_registry::BackendRegistry;

use crate::units::{Bound, backend_parser, parse_count_bound, parse_duration, parse_size_bound};

/// `--timeout` when it is not given (a session's own when it runs in one).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Which boundary to run behind.
    #[arg(long, value_parser = backend_parser(), default_value_t = BackendKind::Native)]
    backend: BackendKind,
    /// Host directory shown as /workspace (default: a temp dir removed afterwards).
    #[arg(long, value_name = "DIR")]
    workdir: Option<PathBuf>,
    /// Wall-clock limit (500ms, 30s, 2m) [default: 60s; with --session, the session's]
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Memory limit for the whole process tree (256M, 1G, or none) [default: 1G]
    #[arg(long, value_parser = parse_size_bound)]
    memory: Option<Bound>,
    /// Most processes and threads at once (or none) [default: 256]
    #[arg(long, value_parser = parse_count_bound)]
    pids: Option<Bound>,
    /// Disk for /workspace and /tmp together (512M, 2G, or none) [default: 1G; none
    /// with --workdir, whose filesystem cannot be bounded]
    #[arg(long, value_parser = parse_size_bound)]
    disk: Option<Bound>,
    /// Files and directories in /workspace and /tmp together [default: one per 16K of
    /// --disk, where the backend can hold it (not gvisor)]
    #[arg(long, value_parser = parse_count_bound)]
    inodes: Option<Bound>,
    /// Print one ExecOutput JSON object instead of streaming the output.
    #[arg(long)]
    json: bool,
    /// Run in this open session of a `skillbox serve` (`skillbox session create`)
    /// instead of a fresh sandbox.
    #[arg(
        long,
        value_name = "ID",
        conflicts_with_all = ["backend", "workdir", "memory", "pids", "disk", "inodes"]
    )]
    session: Option<String>,
    /// With --session: the server that holds it [default: $SKILLBOX_URL, else
    /// http://127.0.0.1:8080]
    #[arg(long, value_name = "URL", requires = "session")]
    remote: Option<String>,
    /// With --session: the server's API key; set SKILLBOX_API_KEY rather than the flag,
    /// which other users can read in the process list.
    #[arg(long, env = "SKILLBOX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The limits of an `exec` given no limit flags.
pub fn default_limits() -> Limits {
    Limits {
        timeout_ms: DEFAULT_TIMEOUT.as_millis() as u64,
        ..Limits::default()
    }
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox exec: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(error: &EnvError) -> ExitCode {
    eprintln!("skillbox exec: {error}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

async fn make_env(
    args: &ExecArgs,
    data_dir: &Path,
    limits: Limits,
) -> Result<Box<dyn ExecutionEnv>, EnvError> {
    let spec = SandboxSpec {
        workspace: args.workdir.clone(),
        limits,
        ..SandboxSpec::default()
    };
    BackendRegistry::new(skillbox_run::registry_config(data_dir))
        .create_one_shot(args.backend, spec)
        .await
}

pub async fn run(args: ExecArgs, data_dir: &Path) -> ExitCode {
    if let Some(id) = &args.session {
        let client = match crate::session::client(
            &crate::session::remote_url(args.remote.clone()),
            args.api_key.as_deref(),
        ) {
            Ok(client) => client,
            Err(code) => return code,
        };
        let options = crate::session::ExecOptions {
            stdin: None,
            cwd: None,
            timeout: args.timeout,
            json: args.json,
            command: args.command,
        };
        return crate::session::exec_in(&client.sessions(), id, options, "skillbox exec").await;
    }
    if let Some(dir) = &args.workdir
        && !dir.is_dir()
    {
        return usage(&format!("--workdir {}: no such directory", dir.display()));
    }
    let mut limits = default_limits();
    if let Some(timeout) = args.timeout {
        limits.timeout_ms = timeout.as_millis() as u64;
    }
    if let Some(Bound(memory)) = args.memory {
        limits.memory_bytes = memory;
    }
    if let Some(Bound(pids)) = args.pids {
        limits.pids = pids.map(|n| n as u32);
    }
    // A workdir is the caller's own disk: bounded only when asked (and then refused).
    if args.workdir.is_some() && args.disk.is_none() {
        limits.disk_bytes = None;
        limits.disk_inodes = None;
    }
    if let Some(Bound(disk)) = args.disk {
        limits.disk_bytes = disk;
    }
    if let Some(Bound(Some(inodes))) = args.inodes {
        limits.disk_inodes = Some(inodes);
    }
    if limits.disk_inodes.is_some() && limits.disk_bytes.is_none() {
        return usage(
            "--inodes bounds a disk: it needs --disk SIZE (not none, and not a --workdir's own disk)",
        );
    }
    // A `skillbox warm` on this data dir runs it in a sandbox it made ahead: the same
    // backend, spec and command; only who makes the sandbox differs.
    if args.backend == BackendKind::Native && args.workdir.is_none() {
        let command = crate::warm::Exec {
            limits: limits.clone(),
            command: args.command.clone(),
            json: args.json,
        };
        if let Some(code) = crate::warm::exec(data_dir, &command) {
            return code;
        }
    }
    // Watched before the sandbox is made: a stop asked while it is made cancels the
    // exec once it is there, and the sandbox is removed.
    let cancel = CancellationToken::new();
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        crate::local::stop_asked().await;
        interrupt.cancel();
    });
    let env = match make_env(&args, data_dir, limits).await {
        Ok(env) => env,
        Err(e) => return failed(&e),
    };
    let request = ExecRequest::argv(args.command.clone());
    let code = if args.json {
        run_json(env.as_ref(), request, &cancel).await
    } else {
        run_streaming(env.as_ref(), request, &cancel).await
    };
    if let Err(e) = env.cleanup().await {
        eprintln!("skillbox exec: cleanup: {e}");
    }
    code
}

async fn run_json(
    env: &dyn ExecutionEnv,
    request: ExecRequest,
    cancel: &CancellationToken,
) -> ExitCode {
    match env.exec(request, cancel).await {
        Ok(output) => match json_line(&output) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprint!("{message}");
                ExitCode::from(crate::EXIT_SETUP_FAILED)
            }
        },
        Err(e) => failed(&e),
    }
}

/// `--json`'s line for `output`, or the message of why it cannot be rendered.
pub fn json_line(output: &skillbox_env::ExecOutput) -> Result<String, String> {
    serde_json::to_string(output)
        .map(|text| format!("{text}\n"))
        .map_err(|e| format!("skillbox exec: cannot render the output: {e}\n"))
}

/// What a streamed exec says on stderr when it ends (a timeout, a limit), and its
/// exit status.
pub fn ending(output: &skillbox_env::ExecOutput) -> (String, u8) {
    let mut notes = String::new();
    if output.timed_out {
        notes.push_str("skillbox exec: timed out\n");
    }
    if let Some(limit) = output.limit_hit {
        notes.push_str(&format!(
            "skillbox exec: limit hit: {}\n",
            serde_json::to_string(&limit)
                .unwrap_or_default()
                .trim_matches('"')
        ));
    }
    (notes, output.shell_status().clamp(0, 255) as u8)
}

/// The message of a stream that ended without an exit status.
pub fn no_ending() -> EnvError {
    EnvError::new(
        skillbox_env::ErrorCode::Unknown,
        "the sandbox ended without an exit status",
    )
}

async fn run_streaming(
    env: &dyn ExecutionEnv,
    request: ExecRequest,
    cancel: &CancellationToken,
) -> ExitCode {
    let mut stream = match env.exec_stream(request, cancel).await {
        Ok(stream) => stream,
        Err(e) => return failed(&e),
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    while let Some(event) = stream.next().await {
        match event {
            Ok(ExecEvent::Stdout(chunk)) => {
                let _ = out.write_all(&chunk).and_then(|()| out.flush());
            }
            Ok(ExecEvent::Stderr(chunk)) => {
                let _ = err.write_all(&chunk).and_then(|()| err.flush());
            }
            Ok(ExecEvent::Exit(output)) => {
                let (notes, code) = ending(&output);
                eprint!("{notes}");
                return ExitCode::from(code);
            }
            Err(e) => return failed(&e),
        }
    }
    failed(&no_ending())
}
