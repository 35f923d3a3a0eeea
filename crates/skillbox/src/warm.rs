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
//! (`exec` with limits of its own) and binaries without that entry point. Which server
//! a client talks to, and whom the server serves, is decided by one piece of code that
//! all three run, `skillbox_entry::trust`.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
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

use skillbox_entry::trust::Refusal;
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
/// server this client trusts answers there (or it is another version): the caller makes
/// the sandbox.
///
/// Plain blocking I/O on the calling thread: a one-shot client has nothing else to
/// do, and an async runtime would cost it more to start than the relay costs.
pub fn exec(data_dir: &Path, exec: &Exec) -> Option<ExitCode> {
    let mut stream = connect(data_dir)?;
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

/// `warm.sock` in the data dir, connected, when the data dir, the socket and the
/// process listening there are trusted, as the entry point trusts them (the same code).
fn connect(data_dir: &Path) -> Option<std::os::unix::net::UnixStream> {
    let dir = std::ffi::CString::new(data_dir.as_os_str().as_bytes()).ok()?;
    let fd = skillbox_entry::trust::connect(&dir)?;
    // SAFETY: `connect` hands over a connected unix stream socket, ours to close.
    Some(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// Whether the process at the other end of `stream` is served: this user's, in this
/// user namespace (the check a client makes of its server, the same code).
fn check_peer(stream: &impl AsFd) -> Result<(), Refusal> {
    // SAFETY: the descriptor stays open while `stream` is borrowed.
    unsafe { skillbox_entry::trust::check_peer(stream.as_fd().as_raw_fd()) }
}

/// What a refusal says of the peer, for a message.
fn why(refusal: Refusal) -> String {
    match refusal {
        Refusal::NoCredentials => "the kernel does not say who it is (SO_PEERCRED)".into(),
        Refusal::OtherUser(uid) => format!("it is uid {uid}"),
        Refusal::NoPidfd(0) => "no pidfd of it (SO_PEERPIDFD)".into(),
        Refusal::NoPidfd(errno) => format!(
            "no pidfd of it (SO_PEERPIDFD): {}",
            std::io::Error::from_raw_os_error(errno)
        ),
        Refusal::Gone => "it has exited, or this /proc does not number it".into(),
        Refusal::NoUserNamespace => "its user namespace cannot be read".into(),
        Refusal::OtherUserNamespace => "it is in another user namespace".into(),
    }
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
        .and_then(|(a, _b)| check_peer(&a).map_err(why));
    if let Err(reason) = peer_check {
        eprintln!(
            "skillbox warm: unavailable: cannot check who connects ({reason}); it needs Linux 6.5 or later (SO_PEERPIDFD)"
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

async fn send(stream: &mut tokio::net::unix::OwnedWriteHalf, kind: u8, bytes: &[u8]) -> bool {
    let mut frame = Vec::with_capacity(5 + bytes.len());
    frame.push(kind);
    frame.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    frame.extend_from_slice(bytes);
    stream.write_all(&frame).await.is_ok()
}

/// One `exec`: checked to come from this server's own user, run, answered.
async fn serve_one(stream: UnixStream, backend: Arc<NativeBackend>) {
    let peer = check_peer(&stream);
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
    let refusal = match peer {
        Ok(()) => None,
        Err(Refusal::OtherUser(uid)) => {
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            Some(format!("skillbox warm serves uid {me} only, not uid {uid}"))
        }
        Err(Refusal::OtherUserNamespace) => {
            Some("skillbox warm serves no process in another user namespace (a sandbox)".into())
        }
        Err(other) => Some(format!(
            "skillbox warm cannot tell who connected: {}",
            why(other)
        )),
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

    /// A client (the entry point's code, `skillbox_entry::trust`) trusts the data dirs
    /// `own_data_dir` accepts, and no other, when a socket of this user's is in them:
    /// the rule has a second copy there (it creates the dir and says what to fix), and
    /// this holds the two to each other, row by row.
    #[test]
    fn a_client_trusts_the_data_dirs_own_data_dir_accepts() {
        use std::fs::{Permissions, create_dir, set_permissions, write};
        use std::os::unix::fs::{lchown, symlink};
        fn chmod(path: &Path, mode: u32) {
            set_permissions(path, Permissions::from_mode(mode)).unwrap();
        }
        fn dir_with(path: &Path, mode: u32) {
            create_dir(path).unwrap();
            chmod(path, mode);
        }
        fn files(dir: &Path) {
            // Past one 4 KiB listing buffer.
            for n in 0..200 {
                write(dir.join(format!("{n:0>60}")), "").unwrap();
            }
        }
        fn someone_else(path: &Path) {
            lchown(path, Some(65534), Some(65534)).unwrap();
        }
        // SAFETY: geteuid has no preconditions.
        let root_user = unsafe { libc::geteuid() } == 0;
        let root = tempfile::tempdir().unwrap();
        type Plant = Box<dyn Fn(&Path) -> PathBuf>;
        let same = |plant: fn(&Path)| -> Plant {
            Box::new(move |dir: &Path| {
                plant(dir);
                dir.to_path_buf()
            })
        };
        // (what it is, what is done to a data dir with a listening warm.sock (the path
        // to try), own_data_dir accepts it, a client trusts it)
        let mut rows: Vec<(&str, Plant, bool, bool)> = vec![
            ("as own_data_dir makes it", same(|_| {}), true, true),
            ("0755", same(|d| chmod(d, 0o755)), true, true),
            (
                "0775: its group may write",
                same(|d| chmod(d, 0o775)),
                false,
                false,
            ),
            (
                "0757: others may write",
                same(|d| chmod(d, 0o757)),
                false,
                false,
            ),
            ("1777", same(|d| chmod(d, 0o1777)), false, false),
            (
                "a file anyone may write in it",
                same(|d| {
                    write(d.join("f"), "").unwrap();
                    chmod(&d.join("f"), 0o666);
                }),
                true,
                true,
            ),
            (
                "a fifo in it",
                same(|d| {
                    let fifo =
                        std::ffi::CString::new(d.join("fifo").as_os_str().as_bytes()).unwrap();
                    // SAFETY: a NUL-terminated path.
                    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o666) }, 0);
                }),
                true,
                true,
            ),
            (
                "a private directory in it",
                same(|d| dir_with(&d.join("sub"), 0o755)),
                true,
                true,
            ),
            (
                "a directory in it its group may write",
                same(|d| dir_with(&d.join("sub"), 0o770)),
                false,
                false,
            ),
            (
                "a directory in it anyone may write, sticky",
                same(|d| dir_with(&d.join("sub"), 0o1777)),
                false,
                false,
            ),
            (
                "a directory anyone may write, one further down",
                same(|d| {
                    dir_with(&d.join("sub"), 0o700);
                    dir_with(&d.join("sub/deep"), 0o777);
                }),
                true,
                true,
            ),
            (
                "a symlink in it",
                same(|d| symlink("/etc", d.join("link")).unwrap()),
                false,
                false,
            ),
            (
                "a symlink to a directory of its own",
                same(|d| {
                    dir_with(&d.join("sub"), 0o700);
                    symlink("sub", d.join("link")).unwrap();
                }),
                false,
                false,
            ),
            (
                "a dangling symlink in it",
                same(|d| symlink("/nonexistent", d.join("link")).unwrap()),
                false,
                false,
            ),
            ("many files in it", same(files), true, true),
            (
                "many files and a directory anyone may write in it",
                same(|d| {
                    files(d);
                    dir_with(&d.join("sub"), 0o777);
                }),
                false,
                false,
            ),
            (
                "warm.sock a link to the socket",
                same(|d| {
                    std::fs::rename(d.join(SOCKET), d.join("real.sock")).unwrap();
                    symlink("real.sock", d.join(SOCKET)).unwrap();
                }),
                false,
                false,
            ),
            // The client's own rule: own_data_dir knows nothing of sockets.
            (
                "warm.sock a file",
                same(|d| {
                    std::fs::remove_file(d.join(SOCKET)).unwrap();
                    write(d.join(SOCKET), "").unwrap();
                }),
                true,
                false,
            ),
            (
                "reached through a symlink",
                Box::new(|d: &Path| {
                    let link = d.with_extension("link");
                    symlink(d, &link).unwrap();
                    link
                }) as Plant,
                true,
                true,
            ),
            // Root reads what it may not.
            (
                "0300: it cannot be listed",
                same(|d| chmod(d, 0o300)),
                root_user,
                root_user,
            ),
        ];
        if root_user {
            rows.extend::<[(&str, Plant, bool, bool); 4]>([
                ("another user's", same(someone_else), false, false),
                (
                    "another user's directory in it",
                    same(|d| {
                        dir_with(&d.join("sub"), 0o700);
                        someone_else(&d.join("sub"));
                    }),
                    false,
                    false,
                ),
                (
                    "another user's file in it",
                    same(|d| {
                        write(d.join("f"), "").unwrap();
                        someone_else(&d.join("f"));
                    }),
                    true,
                    true,
                ),
                // The client's own rule again.
                (
                    "warm.sock another user's",
                    same(|d| someone_else(&d.join(SOCKET))),
                    true,
                    false,
                ),
            ]);
        }
        for (n, (what, plant, own, trusted)) in rows.iter().enumerate() {
            let dir = root.path().join(n.to_string());
            dir_with(&dir, 0o700);
            let listener = std::os::unix::net::UnixListener::bind(dir.join(SOCKET)).unwrap();
            let path = plant(&dir);
            let client = connect(&path).is_some();
            let accepted = skillbox_env::own_data_dir(&path).is_ok();
            assert_eq!((accepted, client), (*own, *trusted), "{what}");
            drop(listener);
            chmod(&dir, 0o700);
        }
    }
}
