//! Exec requests and results: what to run, and what came back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

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

/// The events of a running exec. Dropping it does not stop the process; cancel the token.
#[derive(Debug)]
pub struct ExecStream {
    events: mpsc::Receiver<EnvResult<ExecEvent>>,
}

impl ExecStream {
    /// A stream and the sender a backend feeds it through.
    pub fn channel() -> (mpsc::Sender<EnvResult<ExecEvent>>, ExecStream) {
        let (tx, rx) = mpsc::channel(64);
        (tx, ExecStream { events: rx })
    }

    /// The next event; `None` after `Exit` (or an error).
    pub async fn next(&mut self) -> Option<EnvResult<ExecEvent>> {
        self.events.recv().await
    }

    /// Collects every chunk into one [`ExecOutput`].
    pub async fn collect(mut self) -> EnvResult<ExecOutput> {
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Stdout(chunk) => stdout.extend_from_slice(&chunk),
                ExecEvent::Stderr(chunk) => stderr.extend_from_slice(&chunk),
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
