//! Exec requests and results: what to run, and what came back.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ExecOutput;
use crate::error::{EnvError, EnvResult};

/// What to run: an argv vector (no shell) or a string for `sh -c`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Argv(Vec<String>),
    Shell(String),
}

impl Command {
    /// The argv that actually runs.
    pub fn to_argv(&self) -> Vec<String> {
        match self {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(script) => vec!["/bin/sh".into(), "-c".into(), script.clone()],
        }
    }
}

/// One command to run in an env.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    pub command: Command,
    /// Working directory; the env's cwd when `None`.
    pub cwd: Option<PathBuf>,
    /// Extra environment variables (the env decides the base set).
    pub env: BTreeMap<String, String>,
    /// Bytes fed to stdin; stdin is empty (`/dev/null`) when `None`.
    pub stdin: Option<Vec<u8>>,
    /// Wall-clock limit; the env's default when `None`.
    pub timeout: Option<Duration>,
    /// The sandbox's last exec: afterwards its files are only read and it is cleaned
    /// up. A backend whose reset after an exec is a round trip of its own (the
    /// container ones) then leaves what the command started in the background to
    /// cleanup, instead of killing it before the exec returns. The exec still ends
    /// when the command does (what holds its output open is killed).
    pub last: bool,
    /// The walk the caller makes as soon as the exec ends (a run's collection). A
    /// backend for which each operation is a round trip (the container ones) may make
    /// it at the end of the exec's own and answer that walk from it, as long as nothing
    /// else began in the sandbox since.
    pub walk_after: Option<WalkAfter>,
}

/// A [`FileSystem::walk`](crate::FileSystem::walk) to come, as [`ExecRequest::walk_after`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalkAfter {
    /// Absolute, in the sandbox.
    pub root: PathBuf,
    pub prune: Vec<String>,
    pub max_entries: usize,
}

impl ExecRequest {
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(Command::Argv(argv.into_iter().map(Into::into).collect()))
    }

    pub fn shell(script: impl Into<String>) -> Self {
        Self::new(Command::Shell(script.into()))
    }

    fn new(command: Command) -> Self {
        ExecRequest {
            command,
            cwd: None,
            env: BTreeMap::new(),
            stdin: None,
            timeout: None,
            last: false,
            walk_after: None,
        }
    }

    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    pub fn stdin(mut self, stdin: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(stdin.into());
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Marks the sandbox's last exec (see [`ExecRequest::last`]).
    pub fn last(mut self) -> Self {
        self.last = true;
        self
    }

    /// Announces the walk that follows the exec (see [`ExecRequest::walk_after`]).
    pub fn walk_after(mut self, walk: WalkAfter) -> Self {
        self.walk_after = Some(walk);
        self
    }

    /// Rejects what no backend can run: an empty argv, NUL bytes, `=` in env names.
    pub fn validate(&self) -> EnvResult<()> {
        let argv = self.command.to_argv();
        if argv.is_empty() || argv[0].is_empty() {
            return Err(EnvError::invalid("command: empty; give a program to run"));
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(EnvError::invalid("command: contains a NUL byte"));
        }
        for (key, value) in &self.env {
            if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
                return Err(EnvError::invalid(format!(
                    "env: invalid variable name or value {key:?}"
                )));
            }
        }
        if self.timeout == Some(Duration::ZERO) {
            return Err(EnvError::invalid("timeout: must be greater than 0"));
        }
        if self.timeout.is_some_and(|t| t > crate::limits::MAX_TIMEOUT) {
            return Err(EnvError::invalid("timeout: at most 24 hours"));
        }
        Ok(())
    }
}

/// One piece of a streamed exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    /// Always last; its `stdout`/`stderr` are empty (the chunks came before).
    Exit(ExecOutput),
}

/// Where a process in a sandbox serves, as the process sees it: a TCP port on the
/// sandbox's own loopback, or a unix socket at a path in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Port(u16),
    Socket(PathBuf),
}

/// A service's socket is in a capability's workspace, which is at the default root.
const WORKSPACE: &str = skillbox_protocol::DEFAULT_WORKSPACE_ROOT;

impl Endpoint {
    /// A socket's `path` as a plain relative path below [`WORKSPACE`] (no `..`, no
    /// `.`): the only sockets skillbox connects to (each exec's `/tmp` is its own).
    pub fn socket_in_workspace(path: &Path) -> EnvResult<PathBuf> {
        let relative = path.strip_prefix(WORKSPACE).map_err(|_| {
            EnvError::invalid(format!(
                "socket {}: must be under {WORKSPACE} (each exec's /tmp is its own; the host sees only the workspace)",
                path.display()
            ))
        })?;
        if relative.as_os_str().is_empty()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(EnvError::invalid(format!(
                "socket {}: give a plain path of a file under {WORKSPACE}",
                path.display()
            )));
        }
        Ok(relative.to_path_buf())
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Port(port) => write!(f, "127.0.0.1:{port} (in the sandbox)"),
            Endpoint::Socket(path) => write!(f, "unix:{} (in the sandbox)", path.display()),
        }
    }
}

/// A byte stream both ways: one connection to a service in a sandbox.
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// Opens connections, from the host side, to what a running exec serves. The sandbox
/// gets no network for it: the backend reaches into the exec's own network namespace
/// (a port) or opens its socket beneath the sandbox's directory fd (never a path the
/// sandbox could point elsewhere).
#[async_trait]
pub trait ExecConnector: Send + Sync + fmt::Debug {
    /// The process that serves, as the host names it (`pid 1234`, a container id).
    fn process(&self) -> String;

    /// One new connection to `endpoint`; `unavailable` once the exec has ended, and the
    /// error the sandbox's kernel gave (refused, not found) while nothing listens.
    async fn connect(
        &self,
        endpoint: &Endpoint,
        cancel: &CancellationToken,
    ) -> EnvResult<Box<dyn Duplex>>;
}

/// The events of a running exec. Dropping it does not stop the process; cancel the token.
#[derive(Debug)]
pub struct ExecStream {
    events: mpsc::Receiver<EnvResult<ExecEvent>>,
    connector: Option<Arc<dyn ExecConnector>>,
}

impl ExecStream {
    /// A stream and the sender a backend feeds it through.
    pub fn channel() -> (mpsc::Sender<EnvResult<ExecEvent>>, ExecStream) {
        let (tx, rx) = mpsc::channel(64);
        (
            tx,
            ExecStream {
                events: rx,
                connector: None,
            },
        )
    }

    /// The same stream, with a way to reach what the exec serves.
    pub fn with_connector(mut self, connector: Arc<dyn ExecConnector>) -> Self {
        self.connector = Some(connector);
        self
    }

    /// How to reach what the exec serves; `None` where the backend cannot (yet).
    pub fn connector(&self) -> Option<Arc<dyn ExecConnector>> {
        self.connector.clone()
    }

    /// The next event; `None` after `Exit` (or an error).
    pub async fn next(&mut self) -> Option<EnvResult<ExecEvent>> {
        self.events.recv().await
    }

    /// Collects every chunk into one [`ExecOutput`].
    pub async fn collect(self) -> EnvResult<ExecOutput> {
        self.collect_seeing(|_, _| {}).await
    }

    /// [`collect`](Self::collect), showing `seen` each chunk as it comes.
    pub async fn collect_seeing(
        mut self,
        mut seen: impl FnMut(StreamKind, &Bytes),
    ) -> EnvResult<ExecOutput> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Stdout(chunk) => {
                    seen(StreamKind::Stdout, &chunk);
                    stdout.extend_from_slice(&chunk);
                }
                ExecEvent::Stderr(chunk) => {
                    seen(StreamKind::Stderr, &chunk);
                    stderr.extend_from_slice(&chunk);
                }
                ExecEvent::Exit(mut output) => {
                    output.stdout = stdout;
                    output.stderr = stderr;
                    return Ok(output);
                }
            }
        }
        Err(EnvError::new(
            crate::ErrorCode::Unknown,
            "exec: the backend ended the stream without an exit status",
        ))
    }
}

/// Which stream a pump reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Stdout,
    Stderr,
}

/// Copies `reader` to `events` until EOF, forwarding at most `cap` bytes and draining
/// the rest so the writer never blocks on a full pipe. Returns whether it truncated.
pub async fn pump_output<R: AsyncRead + Unpin>(
    mut reader: R,
    kind: StreamKind,
    cap: u64,
    events: mpsc::Sender<EnvResult<ExecEvent>>,
) -> bool {
    let mut forwarded: u64 = 0;
    let mut truncated = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let room = cap.saturating_sub(forwarded);
        let keep = usize::try_from(room).unwrap_or(usize::MAX).min(n);
        if keep < n {
            truncated = true;
        }
        if keep > 0 {
            forwarded += keep as u64;
            let chunk = Bytes::copy_from_slice(&buf[..keep]);
            let event = match kind {
                StreamKind::Stdout => ExecEvent::Stdout(chunk),
                StreamKind::Stderr => ExecEvent::Stderr(chunk),
            };
            // The receiver may be gone; keep draining so the child can finish.
            let _ = events.send(Ok(event)).await;
        }
    }
    truncated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn sockets_must_be_plain_paths_under_the_workspace() {
        assert!(Endpoint::socket_in_workspace(Path::new("/workspace/app.sock")).is_ok());
        assert_eq!(
            Endpoint::socket_in_workspace(Path::new("/workspace/run/app.sock")).ok(),
            Some(PathBuf::from("run/app.sock"))
        );
        for bad in [
            "/tmp/app.sock",
            "/workspace",
            "/workspace/../etc/x",
            "relative.sock",
        ] {
            let e = Endpoint::socket_in_workspace(Path::new(bad)).err();
            assert_eq!(e.map(|e| e.code), Some(ErrorCode::Invalid), "{bad}");
        }
    }
}
