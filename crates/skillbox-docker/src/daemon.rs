//! Reaching the Docker daemon, and the calls every part of the backend makes through
//! it: what its errors mean, removing a container, asking whether one runs, and running
//! one of skillbox's own commands in a container to its end.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::{InspectContainerOptions, RemoveContainerOptions};
use futures_util::StreamExt;
use skillbox_env::{BackendKind, EnvError, EnvResult, ErrorCode};
use tokio::io::AsyncWriteExt;

/// How long the daemon may take to answer a ping before it counts as down.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// The most one of skillbox's own commands may print on stdout (a file read).
pub(crate) const MAX_READ_BYTES: usize = 1024 * 1024 * 1024;
/// The most stderr one of skillbox's own commands may print: its errors are a line.
const MAX_HELPER_STDERR_BYTES: usize = 1024 * 1024;
/// The most stdout one of skillbox's own commands that answers in a few lines may print.
pub(crate) const LINE_BYTES: usize = 64 * 1024;

/// The containers a backend made and has not removed yet.
pub(crate) type Live = Arc<Mutex<BTreeSet<String>>>;

pub(crate) fn unavailable(message: impl Into<String>) -> EnvError {
    EnvError::new(ErrorCode::Unavailable, message)
}

/// Where the client looks for the daemon, for messages.
pub(crate) fn daemon_address() -> String {
    std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into())
}

/// Says why the daemon did not answer, and what to do about it.
pub(crate) fn daemon_error(backend: BackendKind, error: &bollard::errors::Error) -> EnvError {
    let address = daemon_address();
    let text = error.to_string();
    // The client's error does not always carry the OS error; for a local socket, ask
    // the OS directly why a connect fails.
    let probe = address
        .strip_prefix("unix://")
        .and_then(|path| std::os::unix::net::UnixStream::connect(path).err())
        .map(|e| e.to_string())
        .unwrap_or_default();
    let lower = format!("{text} {probe}").to_lowercase();
    let fix = if lower.contains("permission denied") {
        "the socket is not accessible to this user: run as root or join the `docker` group"
    } else if lower.contains("no such file")
        || lower.contains("not found")
        || lower.contains("connection refused")
    {
        "no daemon is listening: start it (`systemctl start docker`, or `dockerd &`)"
    } else {
        "check that dockerd is running and reachable"
    };
    let detail = if probe.is_empty() {
        text
    } else {
        format!("{text}: {probe}")
    };
    unavailable(format!(
        "backend {backend}: the Docker daemon at {address} did not answer ({detail}); {fix}"
    ))
}

/// Connects to the daemon named by `DOCKER_HOST` (default: the local socket) and agrees
/// on an API version both sides speak.
pub(crate) async fn connect(backend: BackendKind) -> EnvResult<Docker> {
    let docker = Docker::connect_with_defaults().map_err(|e| daemon_error(backend, &e))?;
    let negotiated = tokio::time::timeout(PING_TIMEOUT, docker.negotiate_version())
        .await
        .map_err(|_| {
            unavailable(format!(
                "backend {backend}: the Docker daemon at {} did not answer within {}s",
                daemon_address(),
                PING_TIMEOUT.as_secs()
            ))
        })?;
    negotiated.map_err(|e| daemon_error(backend, &e))
}

pub(crate) fn image_missing(backend: BackendKind, image: &str) -> EnvError {
    unavailable(format!(
        "backend {backend}: image {image} is not in the daemon; build it with `skillbox image build`"
    ))
}

/// Maps a daemon error during a sandbox operation.
pub(crate) fn op_error(
    backend: BackendKind,
    what: &str,
    error: &bollard::errors::Error,
) -> EnvError {
    match error {
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            message,
        } => unavailable(format!(
            "backend {backend}: {what}: the sandbox container is gone or stopped ({message})"
        )),
        bollard::errors::Error::DockerResponseServerError {
            status_code,
            message,
        } => EnvError::new(
            ErrorCode::Unknown,
            format!("backend {backend}: {what}: the daemon answered {status_code}: {message}"),
        ),
        other => daemon_error(backend, other),
    }
}

/// Force-removes a container (killing what runs in it) and its anonymous volumes.
/// True when it is gone (or going).
pub(crate) async fn remove_container(docker: &Docker, id: &str) -> bool {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        ..Default::default()
    };
    match docker.remove_container(id, Some(options)).await {
        Ok(()) => true,
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => true,
        // 409: removal already in progress (a concurrent cleanup).
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => true,
        Err(e) => {
            tracing::warn!(container = %id, error = %e, "docker: cannot remove a sandbox container");
            false
        }
    }
}

/// False once container `id` has stopped (or is gone).
pub(crate) async fn is_running(docker: &Docker, id: &str) -> bool {
    match docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
    {
        Ok(info) => info.state.and_then(|s| s.running).unwrap_or(false),
        Err(_) => false,
    }
}

/// What one of skillbox's own commands printed and how it ended (uncapped up to a
/// bound).
pub(crate) struct Collected {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
    /// `None` when it was not waited for (more stdout came than the bound).
    pub(crate) exit_code: Option<i64>,
    /// More stdout came than the bound: what fitted is in `stdout`, the rest was not
    /// read, and how it ended is not known.
    pub(crate) stdout_past_bound: bool,
}

/// Runs one of skillbox's own commands in the container to its end and collects what it
/// printed: up to `max_stdout` bytes of stdout (past them it stops reading, and says
/// so: [`Collected::stdout_past_bound`]) and [`MAX_HELPER_STDERR_BYTES`] of stderr
/// (past them it fails `resource_exhausted`). The bounds hold against the sandbox's
/// code too, which under gVisor can open a helper's stdout and stderr
/// (`/proc/<pid>/fd/1`) and write into them as long as it likes.
pub(crate) async fn collect_exec(
    docker: &Docker,
    id: &str,
    backend: BackendKind,
    what: &'static str,
    argv: Vec<String>,
    stdin: Option<Vec<u8>>,
    max_stdout: usize,
) -> EnvResult<Collected> {
    let attach = Attach {
        argv,
        stdin: stdin.is_some(),
        user: None,
        output_capacity: None,
    };
    collect(docker, id, backend, what, attach, stdin, max_stdout).await
}

/// An exec's output (stdout and stderr, demultiplexed) and its stdin.
pub(crate) type ExecOutput = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>,
>;
pub(crate) type ExecInput = std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// How [`start_attached`] runs a command in a container.
pub(crate) struct Attach<'a> {
    pub(crate) argv: Vec<String>,
    /// Whether the command gets a stdin (else it reads end of file).
    pub(crate) stdin: bool,
    /// The container's own user when `None`.
    pub(crate) user: Option<&'a str>,
    /// How much output the client holds before it stops reading (bollard's default
    /// when `None`).
    pub(crate) output_capacity: Option<usize>,
}

/// A started exec: its id (to inspect how it ended), its output and its stdin.
pub(crate) struct Attached {
    pub(crate) id: String,
    pub(crate) output: ExecOutput,
    pub(crate) input: ExecInput,
}

/// Starts `attach.argv` in the container from `/`, attached.
pub(crate) async fn start_attached(
    docker: &Docker,
    id: &str,
    backend: BackendKind,
    what: &'static str,
    attach: Attach<'_>,
) -> EnvResult<Attached> {
    let exec = docker
        .create_exec(
            id,
            ExecConfig {
                cmd: Some(attach.argv),
                attach_stdin: Some(attach.stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                working_dir: Some("/".into()),
                user: attach.user.map(str::to_string),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    let options = attach.output_capacity.map(|capacity| StartExecOptions {
        detach: false,
        tty: false,
        output_capacity: Some(capacity),
    });
    let started = docker
        .start_exec(&exec.id, options)
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    let StartExecResults::Attached { output, input } = started else {
        return Err(EnvError::new(
            ErrorCode::Unknown,
            format!("{what}: the exec did not attach"),
        ));
    };
    Ok(Attached {
        id: exec.id,
        output,
        input,
    })
}

/// [`collect_exec`] as `user` (the container's own when `None`), with up to
/// [`MAX_READ_BYTES`] of stdout.
pub(crate) async fn collect_exec_as(
    docker: &Docker,
    id: &str,
    backend: BackendKind,
    what: &'static str,
    argv: Vec<String>,
    stdin: Option<Vec<u8>>,
    user: Option<&str>,
) -> EnvResult<Collected> {
    let attach = Attach {
        argv,
        stdin: stdin.is_some(),
        user,
        output_capacity: None,
    };
    collect(docker, id, backend, what, attach, stdin, MAX_READ_BYTES).await
}

/// [`collect_exec`] and [`collect_exec_as`]: `attach` run to its end, `stdin` written
/// to it, its output collected within the bounds.
async fn collect(
    docker: &Docker,
    id: &str,
    backend: BackendKind,
    what: &'static str,
    attach: Attach<'_>,
    stdin: Option<Vec<u8>>,
    max_stdout: usize,
) -> EnvResult<Collected> {
    let Attached {
        id: exec,
        mut output,
        mut input,
    } = start_attached(docker, id, backend, what, attach).await?;
    let writer = stdin.map(|data| {
        tokio::spawn(async move {
            let _ = input.write_all(&data).await;
            let _ = input.shutdown().await;
        })
    });
    let mut collected = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        exit_code: None,
        stdout_past_bound: false,
    };
    while let Some(frame) = output.next().await {
        match frame {
            Ok(LogOutput::StdOut { message }) => {
                if collected.stdout.len() + message.len() > max_stdout {
                    collected.stdout_past_bound = true;
                    return Ok(collected);
                }
                collected.stdout.extend_from_slice(&message);
            }
            Ok(LogOutput::StdErr { message }) => {
                if collected.stderr.len() + message.len() > MAX_HELPER_STDERR_BYTES {
                    return Err(EnvError::new(
                        ErrorCode::ResourceExhausted,
                        format!("{what}: more than {MAX_HELPER_STDERR_BYTES} bytes of stderr"),
                    ));
                }
                collected.stderr.extend_from_slice(&message);
            }
            Ok(_) => {}
            Err(e) => return Err(op_error(backend, what, &e)),
        }
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    let inspected = docker
        .inspect_exec(&exec)
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    collected.exit_code = inspected.exit_code;
    Ok(collected)
}
