//! `skillbox session …` and `skillbox exec --session`: a session on a `skillbox serve`
//! (design.md §4, §5.3) driven through the client's session calls: open one, run
//! commands in it with their output streamed, move files in and out, end it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use skillbox_client::{
    ClientError, ExecOutput, HttpSkillSandbox, SessionCreateRequest, SessionExecEvent,
    SessionExecRequest, SessionInfo, SessionLimits, Sessions,
};

use crate::terminal::escaped;
use crate::units::{parse_duration, parse_size, sandboxed_parser};

/// Where a `skillbox serve` listens unless `--remote` or `SKILLBOX_URL` says otherwise.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";
/// How long Ctrl-C waits for the server to confirm a cancel.
const CANCEL_WAIT: Duration = Duration::from_secs(5);
/// The exit status after Ctrl-C.
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, Args)]
pub struct SessionArgs {
    /// The `skillbox serve` that holds the sessions.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "SKILLBOX_URL",
        default_value = DEFAULT_URL
    )]
    remote: String,
    /// The API key for the server (from `skillbox keys new`); set SKILLBOX_API_KEY
    /// rather than the flag, which other users can read in the process list.
    #[arg(long, global = true, env = "SKILLBOX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    #[command(subcommand)]
    command: SessionCommand,
}

#[derive(Debug, Subcommand)]
enum SessionCommand {
    /// Open a session: a sandbox kept across commands until deleted, idle too long or
    /// past its lifetime. Prints its id.
    Create(CreateArgs),
    /// This tenant's open sessions.
    List {
        #[arg(long)]
        json: bool,
    },
    /// One session: its backend, when it was used, when it ends.
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Run a command in the session with /workspace as its working directory, its
    /// output streamed as it comes; exits with its status (124 timed out, 128+N signal
    /// N). Ctrl-C cancels it.
    Exec(SessionExecArgs),
    /// Write LOCAL (`-`: stdin) to REMOTE in /workspace [default: LOCAL's file name];
    /// executable when LOCAL is.
    Put {
        id: String,
        local: PathBuf,
        #[arg(value_name = "REMOTE")]
        to: Option<String>,
    },
    /// Read REMOTE from /workspace, to stdout or --out LOCAL.
    Get {
        id: String,
        #[arg(value_name = "REMOTE")]
        from: String,
        /// Write it to this file instead of stdout, or into this directory under
        /// REMOTE's name (never through a symlink; an existing file is kept unless
        /// --overwrite).
        #[arg(long, value_name = "LOCAL")]
        out: Option<PathBuf>,
        /// Replace LOCAL if it is there.
        #[arg(long, requires = "out")]
        overwrite: bool,
    },
    /// List a directory of /workspace [default: /workspace itself].
    Ls {
        id: String,
        path: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Remove a file of /workspace (a directory with --recursive).
    Rm {
        id: String,
        path: String,
        #[arg(long)]
        recursive: bool,
    },
    /// End the session: its commands cancelled, its workspace saved to its scope (if
    /// it has one), its sandbox removed.
    Delete {
        id: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// Which boundary [default: native; host is refused]
    #[arg(long, value_parser = sandboxed_parser())]
    backend: Option<skillbox_protocol::SandboxedKind>,
    /// Place the skill NAME in /workspace when it opens (repeatable; the server's
    /// --project skills or the tenant's own).
    #[arg(long = "skill", value_name = "NAME")]
    skills: Vec<String>,
    /// Start from this scope's last snapshot of /workspace; a new one is saved when
    /// the session is deleted or reaped.
    #[arg(long = "scope", value_name = "KEY")]
    scope: Option<String>,
    /// End it after this long with no call and nothing running [default: 10m; at most
    /// 1h]
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    idle: Option<Duration>,
    /// End it this long after it opened, whatever it is doing [default: 1h; at most
    /// 24h]
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    lifetime: Option<Duration>,
    /// Each exec's wall-clock limit unless the exec gives its own [default: the
    /// server's, 60s]
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    timeout: Option<Duration>,
    /// Memory for each exec's process tree (at most the server's) [default: the
    /// server's]
    #[arg(long, value_parser = parse_size, value_name = "S")]
    memory: Option<u64>,
    /// Disk for /workspace and /tmp together (at most the server's) [default: the
    /// server's]
    #[arg(long, value_parser = parse_size, value_name = "S")]
    disk: Option<u64>,
    /// Let its commands reach HOST through skillbox's egress proxy (repeatable; as
    /// `skillbox run --allow-net`). Without it the session has no network at all.
    #[arg(long = "allow-net", value_name = "HOST")]
    allow_net: Vec<String>,
    /// Never let its commands reach HOST (repeatable; no port means every port).
    #[arg(long = "deny-net", value_name = "HOST", requires = "allow_net")]
    deny_net: Vec<String>,
    /// Bytes through the egress proxy over the session's life (10M, 1G)
    #[arg(long, value_parser = parse_size, value_name = "S", requires = "allow_net")]
    egress_bytes: Option<u64>,
    /// Print the SessionInfo JSON instead of the id.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SessionExecArgs {
    id: String,
    /// Feed FILE (`-`: this process's stdin) to the command's stdin [default: none,
    /// it reads end of file]
    #[arg(long, value_name = "FILE")]
    stdin: Option<PathBuf>,
    /// Working directory, inside /workspace [default: /workspace]
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Wall-clock limit (500ms, 30s, 2m) [default: the session's]
    #[arg(long, value_parser = parse_duration, value_name = "D")]
    timeout: Option<Duration>,
    /// Print one ExecOutput JSON object (as `skillbox exec --json`) instead of
    /// streaming; exit 0 once it is printed.
    #[arg(long)]
    json: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The exec half of `session exec` and `exec --session`: everything but where it runs.
pub struct ExecOptions {
    pub stdin: Option<PathBuf>,
    pub cwd: Option<String>,
    pub timeout: Option<Duration>,
    pub json: bool,
    pub command: Vec<String>,
}

fn usage(message: &str) -> ExitCode {
    eprintln!("skillbox session: {message}");
    ExitCode::from(crate::EXIT_USAGE)
}

fn failed(error: &ClientError) -> ExitCode {
    eprintln!("skillbox session: {error}");
    ExitCode::from(crate::EXIT_SETUP_FAILED)
}

/// The client for `url`, with `api_key` when there is one; a URL that is not http(s)
/// is bad usage.
pub fn client(url: &str, api_key: Option<&str>) -> Result<HttpSkillSandbox, ExitCode> {
    let client = HttpSkillSandbox::new(url).map_err(|e| usage(&e.message))?;
    Ok(match api_key {
        Some(key) => client.with_api_key(key),
        None => client,
    })
}

/// `--remote` of `exec --session`: the flag, else `SKILLBOX_URL`, else [`DEFAULT_URL`].
pub fn remote_url(flag: Option<String>) -> String {
    flag.or_else(|| std::env::var("SKILLBOX_URL").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| DEFAULT_URL.to_string())
}

pub async fn run(args: SessionArgs) -> ExitCode {
    let client = match client(&args.remote, args.api_key.as_deref()) {
        Ok(client) => client,
        Err(code) => return code,
    };
    let sessions = client.sessions();
    match args.command {
        SessionCommand::Create(create) => create_session(&sessions, create).await,
        SessionCommand::List { json } => match sessions.list().await {
            Ok(list) if json => print_json(&skillbox_client::SessionList { sessions: list }),
            Ok(list) => {
                for info in &list {
                    println!("{}", summary(info));
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed(&e),
        },
        SessionCommand::Show { id, json } => match sessions.get(&id).await {
            Ok(info) if json => print_json(&info),
            Ok(info) => {
                print!("{}", details(&info));
                ExitCode::SUCCESS
            }
            Err(e) => failed(&e),
        },
        SessionCommand::Exec(exec) => {
            let options = ExecOptions {
                stdin: exec.stdin,
                cwd: exec.cwd,
                timeout: exec.timeout,
                json: exec.json,
                command: exec.command,
            };
            exec_in(&sessions, &exec.id, options, "skillbox session").await
        }
        SessionCommand::Put { id, local, to } => put(&sessions, &id, &local, to).await,
        SessionCommand::Get {
            id,
            from,
            out,
            overwrite,
        } => get(&sessions, &id, &from, out, overwrite).await,
        SessionCommand::Ls { id, path, json } => match sessions.ls(&id, path.as_deref()).await {
            Ok(listing) if json => print_json(&listing),
            Ok(listing) => {
                for entry in &listing.entries {
                    let (size, suffix) = match entry.kind.as_str() {
                        "dir" => (String::new(), "/"),
                        "symlink" => (String::new(), "@"),
                        _ => (entry.size.map(|s| s.to_string()).unwrap_or_default(), ""),
                    };
                    println!("{size:>12}  {}{suffix}", escaped(&entry.name));
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed(&e),
        },
        SessionCommand::Rm {
            id,
            path,
            recursive,
        } => match sessions.remove_file(&id, &path, recursive).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => failed(&e),
        },
        SessionCommand::Delete { id, json } => match sessions.delete(&id).await {
            Ok(info) if json => print_json(&info),
            Ok(info) => {
                if let Some(snapshot) = &info.snapshot {
                    match (&snapshot.saved, &snapshot.error) {
                        (Some(saved), _) => eprintln!(
                            "skillbox session: saved the workspace as snapshot {saved} ({} files, {} bytes)",
                            snapshot.files, snapshot.bytes
                        ),
                        (None, Some(error)) => {
                            eprintln!("skillbox session: the workspace was not saved: {error}")
                        }
                        (None, None) => {}
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => failed(&e),
        },
    }
}

fn print_json<T: serde::Serialize>(value: &T) -> ExitCode {
    match serde_json::to_string(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("skillbox session: cannot render the answer: {e}");
            ExitCode::from(crate::EXIT_SETUP_FAILED)
        }
    }
}

async fn create_session(sessions: &Sessions, args: CreateArgs) -> ExitCode {
    let millis = |d: Duration| d.as_millis() as u64;
    let limits = SessionLimits {
        timeout_ms: args.timeout.map(millis),
        memory_bytes: args.memory,
        pids: None,
        disk_bytes: args.disk,
        egress_bytes: args.egress_bytes,
    };
    let request = SessionCreateRequest {
        backend: args.backend.map(skillbox_protocol::SandboxedKind::kind),
        limits: (limits != SessionLimits::default()).then_some(limits),
        skills: args.skills,
        scope_key: args.scope,
        idle_timeout_ms: args.idle.map(millis),
        max_lifetime_ms: args.lifetime.map(millis),
        network: (!args.allow_net.is_empty()).then(|| skillbox_protocol::NetworkPolicy {
            allow: args.allow_net.clone(),
            deny: args.deny_net.clone(),
        }),
    };
    match sessions.create(&request).await {
        Ok(info) if args.json => print_json(&info),
        Ok(info) => {
            println!("{}", info.id);
            ExitCode::SUCCESS
        }
        Err(e) => failed(&e),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A span of milliseconds as people read it: `850ms`, `42s`, `7m`, `3h`.
fn span(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..120_000 => format!("{}s", ms / 1_000),
        120_000..7_200_000 => format!("{}m", ms / 60_000),
        _ => format!("{}h", ms / 3_600_000),
    }
}

/// One line of `session list`.
fn summary(info: &SessionInfo) -> String {
    let now = now_ms();
    format!(
        "{}  {}  opened {} ago  last used {} ago  {} running  ends in {}",
        info.id,
        info.backend.as_str(),
        span(now.saturating_sub(info.created_at_ms)),
        span(now.saturating_sub(info.last_used_at_ms)),
        info.execs_running,
        span(info.expires_at_ms.saturating_sub(now)),
    )
}

/// `session show`.
fn details(info: &SessionInfo) -> String {
    let now = now_ms();
    let mut text = format!(
        "id: {}\nbackend: {}\nopened: {} ago (in {} ms)\nlast used: {} ago (ended after {} idle)\nends: in {} at most\nexecs running: {}\n",
        info.id,
        info.backend.as_str(),
        span(now.saturating_sub(info.created_at_ms)),
        info.open_ms,
        span(now.saturating_sub(info.last_used_at_ms)),
        span(info.idle_timeout_ms),
        span(info.expires_at_ms.saturating_sub(now)),
        info.execs_running,
    );
    if let Some(placed) = &info.skills {
        let names: Vec<String> = placed
            .skills
            .iter()
            .map(|s| format!("{} ({})", s.name, s.path))
            .collect();
        text.push_str(&format!("skills: {}\n", escaped(&names.join(", "))));
    }
    if let Some(snapshot) = &info.snapshot {
        let restored = snapshot
            .restored
            .as_deref()
            .unwrap_or("none (the scope had none)");
        text.push_str(&format!("restored snapshot: {restored}\n"));
    }
    text
}

async fn put(
    sessions: &Sessions,
    id: &str,
    local: &std::path::Path,
    remote: Option<String>,
) -> ExitCode {
    let from_stdin = local.as_os_str() == "-";
    let remote = match remote {
        Some(remote) => remote,
        None if from_stdin => return usage("put ID - REMOTE: name the file to write from stdin"),
        None => match local.file_name() {
            Some(name) => name.to_string_lossy().into_owned(),
            None => return usage(&format!("{}: name a file", local.display())),
        },
    };
    let (bytes, executable) = if from_stdin {
        let mut bytes = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut bytes) {
            return usage(&format!("stdin: {e}"));
        }
        (bytes, false)
    } else {
        use std::os::unix::fs::PermissionsExt;
        let read = std::fs::read(local).and_then(|bytes| {
            let mode = std::fs::metadata(local)?.permissions().mode();
            Ok((bytes, mode & 0o111 != 0))
        });
        match read {
            Ok(read) => read,
            Err(e) => return usage(&format!("{}: {e}", local.display())),
        }
    };
    match sessions.write_file(id, &remote, bytes, executable).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(&e),
    }
}

async fn get(
    sessions: &Sessions,
    id: &str,
    remote: &str,
    out: Option<PathBuf>,
    overwrite: bool,
) -> ExitCode {
    // Where it goes is worked out, and the directory opened, before the read.
    let target = match &out {
        Some(path) => match local_target(path, remote, overwrite) {
            Ok(target) => Some(target),
            Err(e) => {
                eprintln!("skillbox session: {e}");
                return ExitCode::from(crate::EXIT_USAGE);
            }
        },
        None => None,
    };
    let bytes = match sessions.read_file(id, remote).await {
        Ok(bytes) => bytes,
        Err(e) => return failed(&e),
    };
    let written = match target {
        Some((mut dir, name)) => dir.write(&name, &bytes).map(drop).map_err(|e| e.message),
        None => {
            let mut stdout = std::io::stdout().lock();
            stdout
                .write_all(&bytes)
                .and_then(|()| stdout.flush())
                .map_err(|e| format!("stdout: {e}"))
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "skillbox session: {} was read but not written: {}",
                escaped(remote),
                escaped(&e)
            );
            ExitCode::from(crate::EXIT_SETUP_FAILED)
        }
    }
}

/// `session get --out LOCAL`: the directory the file goes into and its name there. A
/// LOCAL that is a directory takes REMOTE's file name; else LOCAL names the file. The
/// name is the one declared, and copy-out's rules hold for it (§6.4).
fn local_target(
    local: &Path,
    remote: &str,
    overwrite: bool,
) -> Result<(skillbox_client::outdir::OutDir, String), String> {
    use skillbox_client::outdir::{Declared, ExportOptions, OutDir};
    let (dir, name) = if local.is_dir() {
        let name = remote
            .rsplit('/')
            .find(|c| !c.is_empty())
            .unwrap_or_default();
        (local.to_path_buf(), name.to_string())
    } else {
        let Some(name) = local.file_name().and_then(|n| n.to_str()) else {
            return Err(format!(
                "--out {}: name a file (UTF-8) or a directory",
                local.display()
            ));
        };
        let dir = match local.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            _ => PathBuf::from("."),
        };
        (dir, name.to_string())
    };
    let options = ExportOptions {
        overwrite,
        declared: Declared::Paths(std::collections::BTreeSet::from([name.clone()])),
        ..ExportOptions::default()
    };
    let out = OutDir::open(&dir, options).map_err(|e| e.message)?;
    // The name is checked now, before anything is read.
    out.selects(&name).map_err(|e| e.message)?;
    Ok((out, name))
}

/// Runs `options.command` in session `id`: its output streamed to ours as it comes (or
/// one ExecOutput with `json`), and our exit status its shell status; Ctrl-C cancels it
/// through the server and exits 130. `who` begins each line of our own.
pub async fn exec_in(sessions: &Sessions, id: &str, options: ExecOptions, who: &str) -> ExitCode {
    let mut request = SessionExecRequest {
        command: options.command,
        cwd: options.cwd,
        timeout_ms: options.timeout.map(|d| d.as_millis() as u64),
        ..SessionExecRequest::default()
    };
    if let Some(path) = &options.stdin {
        let mut bytes = Vec::new();
        let read = if path.as_os_str() == "-" {
            std::io::stdin().read_to_end(&mut bytes).map(drop)
        } else {
            std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut bytes).map(drop))
        };
        if let Err(e) = read {
            eprintln!("{who}: --stdin {}: {e}", path.display());
            return ExitCode::from(crate::EXIT_USAGE);
        }
        let (stdin, encoding) = skillbox_client::stdin_of(bytes);
        request.stdin = Some(stdin);
        request.stdin_encoding = encoding;
    }
    let failed = |e: &ClientError| {
        eprintln!("{who}: {e}");
        ExitCode::from(crate::EXIT_SETUP_FAILED)
    };
    let mut stream = match sessions.exec(id, &request).await {
        Ok(stream) => stream,
        Err(e) => return failed(&e),
    };
    let mut interrupt = std::pin::pin!(tokio::signal::ctrl_c());
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = &mut interrupt => {
                // Without an id yet, closing the connection (exiting) cancels it.
                if let Some(exec_id) = stream.exec_id() {
                    match tokio::time::timeout(CANCEL_WAIT, sessions.cancel(id, exec_id)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => eprintln!("{who}: interrupted; cancelling the exec: {e}"),
                        Err(_) => eprintln!("{who}: interrupted; the server did not confirm the cancel"),
                    }
                }
                return ExitCode::from(EXIT_INTERRUPTED);
            }
        };
        let event = match event {
            Some(Ok(event)) => event,
            Some(Err(e)) => return failed(&e),
            None => {
                return failed(&ClientError::new(
                    skillbox_client::ErrorCode::Unknown,
                    "the exec ended without an exit status",
                ));
            }
        };
        match event {
            SessionExecEvent::Started { .. } => {}
            SessionExecEvent::Stdout { data } if options.json => stdout.extend(data.into_bytes()),
            SessionExecEvent::Stderr { data } if options.json => stderr.extend(data.into_bytes()),
            SessionExecEvent::Stdout { data } => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(data.as_bytes()).and_then(|()| out.flush());
            }
            SessionExecEvent::Stderr { data } => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(data.as_bytes()).and_then(|()| err.flush());
            }
            SessionExecEvent::Error { code, message } => {
                return failed(&skillbox_client::event_error(&code, message));
            }
            SessionExecEvent::Exit { cancelled, .. } => {
                let Some(ended) = skillbox_client::exit_output(&event) else {
                    continue;
                };
                if options.json {
                    return print_json(&ExecOutput {
                        stdout,
                        stderr,
                        ..ended
                    });
                }
                report_ending(&ended, cancelled, who);
                return ExitCode::from(ended.shell_status().clamp(0, 255) as u8);
            }
        }
    }
}

/// What plain mode says on stderr about an exec that did not just exit.
fn report_ending(ended: &ExecOutput, cancelled: bool, who: &str) {
    if cancelled {
        eprintln!("{who}: cancelled (a cancel request, or the session ended)");
    }
    if ended.timed_out {
        eprintln!("{who}: timed out");
    }
    if let Some(limit) = ended.limit_hit {
        eprintln!("{who}: limit hit: {}", limit.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_read_plainly() {
        assert_eq!(span(850), "850ms");
        assert_eq!(span(42_000), "42s");
        assert_eq!(span(600_000), "10m");
        assert_eq!(span(3 * 3_600_000), "3h");
    }
}
