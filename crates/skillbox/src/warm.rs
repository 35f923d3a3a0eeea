//! `skillbox warm`: native sandboxes made ahead for `skillbox exec` on one data dir.
//!
//! The server keeps a few sandboxes of the shape `exec` asks for, each with its first
//! exec's init started and locked down (`NativeBackend::with_warm`), and listens on
//! `<data>/warm.sock`: a unix socket in the private data dir, mode 0600, that answers
//! only its own user (the peer's uid, from the kernel). `exec` with the native backend
//! and no `--workdir` sends it the limits and the command, and relays what comes back:
//! the command's stdout and stderr, then skillbox's own closing lines and the exit
//! status, exactly what it would have printed itself. Without a server (or one of
//! another version) `exec` makes its sandbox itself, as before.
//!
//! A plain `exec -- CMD` (default limits) is sent by the binary's entry point before
//! glibc starts (`skillbox_entry`, same wire format); this client serves the rest
//! (`exec` with limits of its own) and binaries without that entry point.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use serde::{Deserialize, Serialize};
use skillbox_env::{
    CancellationToken, EnvError, ExecEvent, ExecRequest, ExecutionEnv, Limits, SandboxSpec,
};
use skillbox_native::NativeBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

#[derive(Debug, Args)]
pub struct WarmArgs {
    /// Sandboxes to keep made ahead, each with its init started and locked down.
    #[arg(long, value_name = "N", default_value_t = 2,
          value_parser = clap::value_parser!(u16).range(1..=64))]
    sandboxes: u16,
}

use skillbox_entry::{END, ERR, MAX_REQUEST, OTHER_VERSION, OUT, SOCKET};

/// What `exec` asks for: the sandbox's limits and the command.
#[derive(Debug, Serialize, Deserialize)]
pub struct Exec {
    pub limits: Limits,
    pub command: Vec<String>,
    pub json: bool,
}

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    version: String,
    exec: Exec,
}

fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join(SOCKET)
}

// ---- The client: `skillbox exec` ----

/// Runs `exec` in a sandbox the data dir's `skillbox warm` made ahead; `None` when no
/// server answers there (or it is another version): the caller makes the sandbox.
///
/// Plain blocking I/O on the calling thread: a one-shot client has nothing else to
/// do, and an async runtime would cost it more to start than the relay costs.
pub fn exec(data_dir: &Path, exec: &Exec) -> Option<ExitCode> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket_path(data_dir)).ok()?;
    // A server of another user, or a process in a sandbox (whose user may be this
    // one's uid), is none of this client's business (as the entry point's).
    // SAFETY: geteuid has no preconditions.
    if peer_uid(&stream)? != unsafe { libc::geteuid() }
        || !peer_in_my_user_namespace(&stream).ok()?
    {
        return None;
    }
    let request = serde_json::to_vec(&Request {
        version: env!("CARGO_PKG_VERSION").into(),
        exec: Exec {
            limits: exec.limits.clone(),
            command: exec.command.clone(),
            json: exec.json,
        },
    })
    .ok()?;
    let mut message = (request.len() as u32).to_le_bytes().to_vec();
    message.extend_from_slice(&request);
    stream.write_all(&message).ok()?;
    tracing::debug!("exec: in a sandbox skillbox warm made ahead");
    // Ctrl-C ends this client, and the server ends the command when it sees the
    // connection close.
    let interrupt = Interrupt::install();
    let mut frames = std::io::BufReader::new(stream);
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let mut first = true;
    loop {
        match read_frame(&mut frames) {
            Some((OTHER_VERSION, _)) if first => {
                drop(interrupt);
                return None;
            }
            Some((OUT, bytes)) => {
                let _ = out.write_all(&bytes).and_then(|()| out.flush());
            }
            Some((ERR, bytes)) => {
                let _ = err.write_all(&bytes).and_then(|()| err.flush());
            }
            Some((END, bytes)) if bytes.len() == 1 => return Some(ExitCode::from(bytes[0])),
            _ => {
                eprint!(
                    "{}{}{}",
                    skillbox_entry::WENT_AWAY_BEFORE,
                    socket_path(data_dir).display(),
                    skillbox_entry::WENT_AWAY_AFTER
                );
                return Some(ExitCode::from(skillbox_entry::INTERRUPTED_STATUS));
            }
        }
        first = false;
    }
}

/// The uid of the process at the other end of `stream`, from the kernel.
fn peer_uid(stream: &impl AsRawFd) -> Option<u32> {
    // SAFETY: an all-zero ucred is a valid value to overwrite.
    let mut credentials: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `credentials`.
    let done = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut len,
        )
    };
    (done == 0).then_some(credentials.uid)
}

fn read_frame(stream: &mut impl Read) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).ok()?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    let mut bytes = vec![0u8; len];
    stream.read_exact(&mut bytes).ok()?;
    Some((head[0], bytes))
}

/// While it lives, SIGINT ends this process with the abort message and status 125
/// (the server sees the connection close and ends the command); dropped, the
/// disposition before it is back.
struct Interrupt {
    before: libc::sigaction,
}

impl Interrupt {
    fn install() -> Interrupt {
        extern "C" fn interrupted(_: libc::c_int) {
            // Only async-signal-safe calls: write(2) and _exit(2).
            let message = skillbox_entry::INTERRUPTED;
            // SAFETY: writing a live, initialised buffer to stderr.
            unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
            // SAFETY: ends the process at once; nothing is left to flush.
            unsafe { libc::_exit(i32::from(skillbox_entry::INTERRUPTED_STATUS)) };
        }
        // SAFETY: sigaction with zeroed structs and a handler of the right type.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = interrupted as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            let mut before: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, &action, &mut before);
            Interrupt { before }
        }
    }
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        // SAFETY: puts back the disposition sigaction handed us.
        unsafe { libc::sigaction(libc::SIGINT, &self.before, std::ptr::null_mut()) };
    }
}

// ---- The server ----

pub async fn serve(args: WarmArgs, data_dir: &Path) -> ExitCode {
    let report = skillbox_native::probe();
    if !report.available {
        eprintln!(
            "skillbox warm: the native sandbox is unavailable here: {}",
            report.reason.unwrap_or_default()
        );
        return ExitCode::from(crate::EXIT_SETUP_FAILED);
    }
    // The server tells a sandbox's process from the caller's by the peer's pidfd.
    let peer_check = std::os::unix::net::UnixStream::pair()
        .map_err(|e| e.to_string())
        .and_then(|(a, _b)| peer_in_my_user_namespace(&a));
    if peer_check != Ok(true) {
        eprintln!(
            "skillbox warm: unavailable: cannot check who connects ({}); it needs Linux 6.5 or later (SO_PEERPIDFD)",
            peer_check.err().unwrap_or_default()
        );
        return ExitCode::from(crate::EXIT_SETUP_FAILED);
    }
    let path = socket_path(data_dir);
    let listener = match listen(&path).await {
        Ok(listener) => listener,
        Err(message) => {
            eprintln!("skillbox warm: {message}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    };
    // Sandboxes are cloned by a small copy of this program, as under `serve`.
    if let Err(e) = skillbox_native::spawner_process::start(Path::new("/proc/self/exe"), &[]) {
        tracing::warn!(error = %e, "warm: no spawner process; sandboxes are cloned here");
    }
    let backend = Arc::new(NativeBackend::new(data_dir).with_warm(usize::from(args.sandboxes)));
    // Made ahead for what a plain `skillbox exec` asks for (the pool follows the last
    // shape asked for after that).
    backend.prepare_warm(SandboxSpec {
        workspace: None,
        limits: crate::exec::default_limits(),
        ..SandboxSpec::default()
    });
    eprintln!(
        "skillbox warm: {} sandbox(es) made ahead for `skillbox exec` on {}",
        args.sandboxes,
        path.display()
    );
    let connections = tokio_util::task::TaskTracker::new();
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(e) => {
                eprintln!("skillbox warm: cannot watch SIGTERM: {e}");
                return ExitCode::from(crate::EXIT_SETUP_FAILED);
            }
        };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_one(stream, backend.clone()));
                }
                Err(e) => tracing::warn!(error = %e, "warm: accept"),
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
    backend.drain_warm().await;
    connections.close();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), connections.wait()).await;
    eprintln!("skillbox warm: stopped");
    ExitCode::SUCCESS
}

/// Binds the socket, mode 0600. A socket left by a server that is gone is replaced;
/// one that answers is another server's.
async fn listen(path: &Path) -> Result<UnixListener, String> {
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(format!(
                "{} answers: another skillbox warm serves this data dir",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove the stale {}: {e}", path.display()))?;
    }
    // Private from the start: no moment where another user could connect.
    // SAFETY: umask has no preconditions; it is set back at once.
    let umask = unsafe { libc::umask(0o177) };
    let listener = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(umask) };
    let listener = listener.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make {} private: {e}", path.display()))?;
    Ok(listener)
}

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the peer, which cannot be reused as a pid can.
const SO_PEERPIDFD: libc::c_int = 77;

/// A pidfd of the process at the other end of `stream`.
fn peer_pidfd(stream: &impl AsRawFd) -> std::io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel gave us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Whether the peer is a process of this server's own user namespace. A sandbox's
/// process never is, whatever host uid it maps to (without root the sandbox user is the
/// caller's uid), so code in a sandbox that can see the socket is refused too.
fn peer_in_my_user_namespace(stream: &impl AsRawFd) -> Result<bool, String> {
    use std::os::unix::fs::MetadataExt;
    let pidfd = peer_pidfd(stream).map_err(|e| format!("the peer's pidfd: {e}"))?;
    let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))
        .map_err(|e| format!("the peer's pid: {e}"))?;
    let pid: i32 = fdinfo
        .lines()
        .find_map(|line| line.strip_prefix("Pid:"))
        .and_then(|pid| pid.trim().parse().ok())
        .filter(|pid| *pid > 0)
        .ok_or("the peer has exited")?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/user"))
        .map_err(|e| format!("the peer's user namespace: {e}"))?;
    // Still alive after the lookup: the pid was not reused in between.
    // SAFETY: signal 0 through our own pidfd only checks that the process lives.
    let alive = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    } == 0;
    if !alive {
        return Err("the peer has exited".into());
    }
    let mine = std::fs::metadata("/proc/self/ns/user")
        .map_err(|e| format!("this process's user namespace: {e}"))?;
    Ok((theirs.dev(), theirs.ino()) == (mine.dev(), mine.ino()))
}

async fn send(stream: &mut tokio::net::unix::OwnedWriteHalf, kind: u8, bytes: &[u8]) -> bool {
    let mut frame = Vec::with_capacity(5 + bytes.len());
    frame.push(kind);
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    stream.write_all(&frame).await.is_ok()
}

/// One `exec`: checked to come from this server's own user, run, answered.
async fn serve_one(stream: UnixStream, backend: Arc<NativeBackend>) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let peer = stream.peer_cred().map(|cred| cred.uid());
    let own_namespace = peer_in_my_user_namespace(&stream);
    let (mut input, mut output) = stream.into_split();
    let request = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut head = [0u8; 4];
        input.read_exact(&mut head).await.ok()?;
        let len = u32::from_le_bytes(head) as usize;
        if len > MAX_REQUEST {
            return None;
        }
        let mut bytes = vec![0u8; len];
        input.read_exact(&mut bytes).await.ok()?;
        serde_json::from_slice::<serde_json::Value>(&bytes).ok()
    })
    .await;
    let Ok(Some(request)) = request else {
        return;
    };
    // Read first: a socket closed on an unread request resets, and the refusal with it.
    let refusal = match (peer.as_ref().ok() == Some(&me), own_namespace) {
        (true, Ok(true)) => None,
        (false, _) => Some(format!("skillbox warm serves uid {me} only, not {peer:?}")),
        (true, Ok(false)) => {
            Some("skillbox warm serves no process in another user namespace (a sandbox)".into())
        }
        (true, Err(e)) => Some(format!("skillbox warm cannot tell who connected: {e}")),
    };
    if let Some(refusal) = refusal {
        tracing::warn!(?peer, refusal, "warm: a connection refused");
        let message = format!("skillbox exec: {refusal}\n");
        let _ = send(&mut output, ERR, message.as_bytes()).await;
        let _ = send(&mut output, END, &[crate::EXIT_SETUP_FAILED]).await;
        return;
    }
    if request["version"] != env!("CARGO_PKG_VERSION") {
        let _ = send(&mut output, OTHER_VERSION, &[]).await;
        return;
    }
    let Ok(Request { exec, .. }) = serde_json::from_value::<Request>(request) else {
        let _ = send(&mut output, ERR, b"skillbox exec: a malformed request\n").await;
        let _ = send(&mut output, END, &[crate::EXIT_SETUP_FAILED]).await;
        return;
    };
    tracing::debug!(command = ?exec.command, "warm: an exec");
    let spec = SandboxSpec {
        workspace: None,
        limits: exec.limits,
        ..SandboxSpec::default()
    };
    let env: Box<dyn ExecutionEnv> = match backend.create(spec).await {
        Ok(sandbox) => Box::new(sandbox),
        Err(e) => {
            let _ = send(&mut output, ERR, format!("skillbox exec: {e}\n").as_bytes()).await;
            let _ = send(&mut output, END, &[crate::EXIT_SETUP_FAILED]).await;
            return;
        }
    };
    // The client closing its end (it was interrupted or killed) ends the command.
    let cancel = CancellationToken::new();
    let watch = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let mut byte = [0u8; 1];
            let _ = input.read(&mut byte).await;
            cancel.cancel();
        })
    };
    let request = ExecRequest::argv(exec.command);
    let (code, notes) = if exec.json {
        match env.exec(request, &cancel).await {
            Ok(done) => match crate::exec::json_line(&done) {
                Ok(line) => {
                    send(&mut output, OUT, line.as_bytes()).await;
                    (0, String::new())
                }
                Err(message) => (crate::EXIT_SETUP_FAILED, message),
            },
            Err(e) => (crate::EXIT_SETUP_FAILED, format!("skillbox exec: {e}\n")),
        }
    } else {
        stream_exec(env.as_ref(), request, &cancel, &mut output).await
    };
    let _ = send(&mut output, ERR, notes.as_bytes()).await;
    let _ = send(&mut output, END, &[code]).await;
    drop(output);
    watch.abort();
    if let Err(e) = env.cleanup().await {
        tracing::warn!(error = %e, "warm: cleanup");
    }
}

/// The command's output as frames; its exit status and skillbox's closing lines.
async fn stream_exec(
    env: &dyn ExecutionEnv,
    request: ExecRequest,
    cancel: &CancellationToken,
    output: &mut tokio::net::unix::OwnedWriteHalf,
) -> (u8, String) {
    let failed = |e: EnvError| (crate::EXIT_SETUP_FAILED, format!("skillbox exec: {e}\n"));
    let mut stream = match env.exec_stream(request, cancel).await {
        Ok(stream) => stream,
        Err(e) => return failed(e),
    };
    while let Some(event) = stream.next().await {
        match event {
            Ok(ExecEvent::Stdout(chunk)) => {
                send(output, OUT, &chunk).await;
            }
            Ok(ExecEvent::Stderr(chunk)) => {
                send(output, ERR, &chunk).await;
            }
            Ok(ExecEvent::Exit(done)) => {
                let (notes, code) = crate::exec::ending(&done);
                return (code, notes);
            }
            Err(e) => return failed(e),
        }
    }
    failed(crate::exec::no_ending())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry point's client says and ends as this one does.
    #[test]
    fn the_entry_point_s_client_says_what_this_one_says() {
        assert_eq!(
            skillbox_entry::INTERRUPTED,
            format!("skillbox exec: {}\n", EnvError::aborted("exec"))
        );
        assert_eq!(skillbox_entry::INTERRUPTED_STATUS, crate::EXIT_SETUP_FAILED);
        assert_eq!(skillbox_entry::VERSION, env!("CARGO_PKG_VERSION"));
        let limits: Limits = serde_json::from_str(skillbox_entry::LIMITS).unwrap();
        assert_eq!(limits, crate::exec::default_limits());
    }
}
