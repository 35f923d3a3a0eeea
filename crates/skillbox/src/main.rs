//! The `skillbox` binary (DESIGN.md §4).

mod agent;
mod cap;
mod cap_service;
mod doctor;
mod exec;
mod image;
mod keys;
mod local;
mod mcp;
mod run;
mod serve;
mod serve_mcp;
mod session;
mod skills;
mod terminal;
mod units;
mod warm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Run code that AI agents write behind a real boundary.
#[derive(Debug, Parser)]
#[command(name = "skillbox", version, about, long_about = None)]
struct Cli {
    /// Where skillbox keeps its state [default: $SKILLBOX_DATA, else ~/.local/share/skillbox]
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show every backend, whether it works here and why, and each native layer.
    Doctor(doctor::DoctorArgs),
    /// Run one command in a fresh sandbox with /workspace as its working directory.
    Exec(exec::ExecArgs),
    /// Run one script (Node with pptxgenjs preinstalled, Python or sh) and collect the
    /// files it makes.
    Run(run::RunArgs),
    /// Serve the HTTP API (POST /v1/run, artifact downloads, /metrics, /openapi.json).
    Serve(Box<serve::ServeArgs>),
    /// Install what runs need ahead of the first run: the Node runtime, and the wasm
    /// backend's guests (CPython and QuickJS for WASI), compiled for this host.
    Setup(serve::SetupArgs),
    /// Build the runtime image the docker and gvisor backends run (no registry needed).
    Image(image::ImageArgs),
    /// A model writes a script, skillbox runs it and feeds errors back until the files
    /// it makes pass verification.
    Agent(agent::AgentArgs),
    /// API keys for `skillbox serve --api-keys`.
    Keys(keys::KeysArgs),
    /// Capabilities: list, show, grant or deny, run, and start or stop the persistent
    /// ones (capabilities/*/manifest.yaml).
    Cap(cap::CapArgs),
    /// Skills: list and show them (no sandbox needed), stage a marketplace archive,
    /// project them into a sandbox, run one's script there.
    Skills(skills::SkillsArgs),
    /// Serve MCP on stdio: run_script, exec and the file tools in sandboxes, the files
    /// runs made as resources (stdout carries only the protocol).
    Mcp(mcp::McpArgs),
    /// Sessions on a `skillbox serve`: open one, run commands in it with their output
    /// streamed, move files in and out, end it.
    Session(session::SessionArgs),
    /// Keep native sandboxes made ahead for `skillbox exec` on this data dir (until
    /// SIGTERM or Ctrl-C): an exec then pays only for its command.
    Warm(warm::WarmArgs),
}

/// Exit status for skillbox's own failures (the sandbox could not be set up), as
/// distinct from the command's exit status.
pub const EXIT_SETUP_FAILED: u8 = 125;
/// Exit status for bad usage.
pub const EXIT_USAGE: u8 = 2;

/// The data dir named by the flag, `SKILLBOX_DATA` or `HOME`, created private or checked
/// to be ours alone.
fn data_dir(flag: Option<PathBuf>) -> Result<PathBuf, skillbox_env::EnvError> {
    let dir = match flag {
        Some(dir) => dir,
        None => skillbox_env::default_data_dir()?,
    };
    // Absolute from here on: paths under it are opened by other processes (a sandbox's
    // init, the spawner) and after a chdir, where a relative one names something else.
    let dir = std::path::absolute(&dir)
        .map_err(|e| skillbox_env::EnvError::io(&e, "resolve the data dir", &dir))?;
    skillbox_env::own_data_dir(&dir)?;
    Ok(dir)
}

/// Raises this process's soft limit on open files toward its hard limit.
fn raise_open_files() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: reading and then setting our own limit through a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            let wanted = limit.rlim_max.min(65536);
            if wanted > limit.rlim_cur {
                limit.rlim_cur = wanted;
                libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            }
        }
    }
}

/// Folds clap's multi-line error into one line: the error, plus the valid values.
fn one_line(rendered: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("For more information") || line.starts_with("Usage:") {
            continue;
        }
        parts.push(line.trim_start_matches("error: "));
    }
    format!("{} (see --help)", parts.join(" "))
}

fn main() -> ExitCode {
    // A wasm sandbox's runner: this binary, started inside the native sandbox.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == skillbox_wasm::runner::SUBCOMMAND)
    {
        let args: Vec<String> = std::env::args_os()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let code = skillbox_wasm::runner::main(&args[2..]);
        return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    // Everything skillbox makes is its user's alone (files 0600, directories 0700):
    // every sandbox runs as one host user, which must not read what others' runs
    // stored. What sandboxes read through a mount gets its mode explicitly, and a
    // sandbox's processes start from 022 again. (Not for the wasm runner above: it
    // runs inside a sandbox, for its guest.)
    // SAFETY: umask has no preconditions.
    let caller_umask = unsafe { libc::umask(skillbox_env::PRIVATE_UMASK) };
    // What copy-out writes is the caller's: its modes are theirs.
    skillbox_client::outdir::set_caller_umask(caller_umask);
    // The server's spawner process: this binary again, cloning sandboxes for it.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == skillbox_native::spawner_process::SUBCOMMAND)
    {
        let args: Vec<String> = std::env::args().skip(2).collect();
        let code = skillbox_native::spawner_process::main(&args);
        return ExitCode::from(u8::try_from(code & 0xff).unwrap_or(1));
    }
    skillbox_wasm::runner::this_program_runs_guests();
    // Without SKILLBOX_LOG, a plain level filter: parsing filter directives costs
    // more than a one-shot exec wants to spend on logging it will not do.
    let logs = tracing_subscriber::fmt().with_writer(std::io::stderr);
    match tracing_subscriber::EnvFilter::try_from_env("SKILLBOX_LOG") {
        Ok(filter) => logs.with_env_filter(filter).init(),
        Err(_) => logs
            .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
            .init(),
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("skillbox: {}", one_line(&e.to_string()));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if let Command::Keys(args) = cli.command {
        return keys::run(args);
    }
    let data_dir = match data_dir(cli.data_dir) {
        Ok(dir) => dir,
        Err(e) => {
            eprintln!("skillbox: {}", e.message);
            return ExitCode::from(EXIT_SETUP_FAILED);
        }
    };
    // A server, or a supervisor forwarding clients to a service, holds two fds a
    // connection: the soft limit goes up to the hard one (at most 65536).
    if matches!(cli.command, Command::Serve(_) | Command::Cap(_)) {
        raise_open_files();
    }
    // One thread is fastest for a single exec or run, and for `warm`, whose execs are
    // each a few wake-ups (sandboxes are made on blocking threads); the HTTP server
    // wants every core.
    let mut builder = if matches!(cli.command, Command::Serve(_)) {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("skillbox: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_SETUP_FAILED);
        }
    };
    runtime.block_on(async move {
        match cli.command {
            Command::Doctor(args) => doctor::run(args, &data_dir).await,
            Command::Image(args) => image::run(args, &data_dir).await,
            Command::Exec(args) => exec::run(args, &data_dir).await,
            Command::Run(args) => run::run(args, &data_dir).await,
            Command::Serve(args) => serve::serve(*args, &data_dir).await,
            Command::Setup(args) => serve::setup(args, &data_dir).await,
            Command::Agent(args) => agent::run(args, &data_dir).await,
            Command::Keys(args) => keys::run(args),
            Command::Cap(args) => cap::run(args, &data_dir).await,
            Command::Skills(args) => skills::run(args, &data_dir).await,
            Command::Mcp(args) => mcp::run(args, &data_dir).await,
            Command::Session(args) => session::run(args).await,
            Command::Warm(args) => warm::serve(args, &data_dir).await,
        }
    })
}
