//! One sandbox = one container: created hardened, driven by execs, removed by `cleanup`
//! (or on drop).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, ExecConfig, HostConfig, Mount, MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptions, EventsOptions, InspectContainerOptions, KillContainerOptions,
    StartContainerOptions,
};
use bytes::Bytes;
use futures_util::StreamExt;
use skillbox_env::{BackendKind, DiskSplit, Ended, Ending};
use skillbox_env::{
    CancellationToken, DirEntry, EnvError, EnvResult, ErrorCode, ExecEvent, ExecRequest,
    ExecStream, ExecutionEnv, FileInfo, FileKind, FileRead, FileSystem, LimitKind, Limits,
    SandboxSpec, Shell, TextLines, Truncated, WalkEntry, first_lines, too_many_entries,
};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Mutex, OwnedMutexGuard, RwLock, mpsc};

use crate::backend::{Live, Runtime, daemon_error, remove_container};
use crate::{LABEL_OWNER, LABEL_SANDBOX, SANDBOX_UID};

const INIT_PL: &str = include_str!("helpers/init.pl");
const EXEC_PL: &str = include_str!("helpers/exec.pl");
const FS_PY: &str = include_str!("helpers/fs.py");
/// Kills every process in the container but pid 1 and itself, in passes (stopping them
/// first, so a fork bomb cannot outrun it), until only zombies are left; prints how many
/// live ones remain. Used under runsc, where a kill through init's signal can hit an exec
/// while it starts, which runsc does not survive.
const KILL_PL: &str = r#"syscall($ARGV[0], 4, 0, 0, 0, 0) == 0 or exit 3;
my $left = 0;
for my $pass (1 .. 200) {
    opendir(my $d, '/proc') or exit 1;
    my @p;
    for my $pid (grep { /^\d+$/ && $_ != 1 && $_ != $$ } readdir($d)) {
        open(my $f, '<', "/proc/$pid/stat") or next;
        my $st = <$f> // '';
        push @p, $pid unless $st =~ /\) Z /;
    }
    closedir($d);
    $left = scalar @p;
    last unless $left;
    kill('STOP', @p);
    kill('KILL', @p);
    select(undef, undef, undef, 0.005);
}
print "left $left\n";
exit($left ? 1 : 0);"#;
const WORKSPACE: &str = "/workspace";
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The workspace tmpfs; its pages count against the container's memory limit too.
const WORKSPACE_BYTES: u64 = 1024 * 1024 * 1024;
/// Bytes of stderr held back until the end, where the wrapper's status line is.
const HOLD_BACK: usize = 128;
/// How long a kill of the container's processes may take before the sandbox is
/// given up (removed) instead.
const KILL_BOUND: Duration = Duration::from_secs(10);
/// How long a kill waits for running file operations to finish before it goes ahead
/// (a file operation stuck on something the sandbox made is killed with the rest).
const FS_DRAIN_BOUND: Duration = Duration::from_secs(2);
/// The most a file read may return.
const MAX_READ_BYTES: usize = 1024 * 1024 * 1024;
/// What one `readmany` helper run prints at most, about: the files after that go to
/// the next run.
const READ_BATCH_BYTES: u64 = 256 * 1024 * 1024;
/// The largest file `read_files` reads: a run's output must hold it after a batch.
const READ_MAX_FILE_BYTES: u64 = MAX_READ_BYTES as u64 - READ_BATCH_BYTES - 4096;
/// Host tasks gVisor's sentry needs besides the sandbox's own processes (measured: 64
/// idle, about 8 more per process on the ptrace platform).
const GVISOR_BASE_TASKS: i64 = 256;
const GVISOR_TASKS_PER_PROCESS: i64 = 16;

#[cfg(target_arch = "x86_64")]
const NR_PRCTL: u32 = 157;
#[cfg(target_arch = "x86_64")]
const NR_SECCOMP: u32 = 317;
#[cfg(target_arch = "aarch64")]
const NR_PRCTL: u32 = 167;
#[cfg(target_arch = "aarch64")]
const NR_SECCOMP: u32 = 277;

/// A docker (or gvisor) sandbox: one running container.
#[derive(Debug)]
pub struct DockerSandbox {
    inner: Arc<Inner>,
    cwd: PathBuf,
}

#[derive(Debug)]
struct Inner {
    docker: Docker,
    id: String,
    runtime: Runtime,
    limits: Limits,
    /// The container's pid 1 as `top` shows it (runc; under runsc the reset does not
    /// use it).
    init_pid: String,
    /// Execs run one at a time; see the crate docs.
    turn: Arc<Mutex<()>>,
    /// File operations hold it shared; a kill of the container's processes takes it
    /// exclusively (for a bounded time), so it does not hit a file operation mid-way.
    fs_gate: Arc<RwLock<()>>,
    /// Fired by cleanup or drop: running execs end as aborted.
    shutdown: CancellationToken,
    removed: AtomicBool,
    /// Fired when the daemon reports the container died (under gVisor, a memory bomb
    /// takes the sandbox's kernel with it).
    died: CancellationToken,
    /// Out-of-memory events the daemon reported for the container.
    ooms: AtomicU64,
    live: Live,
    filter_hex: String,
}

fn unavailable(message: impl Into<String>) -> EnvError {
    EnvError::new(ErrorCode::Unavailable, message)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn nonce() -> String {
    let mut bytes = [0u8; 16];
    skillbox_env::path::fill_random(&mut bytes);
    hex(&bytes)
}

/// The container's configuration: hardened by default, loosened only where the spec
/// names something (a workspace directory, read-only mounts).
pub(crate) fn container_config(
    runtime: Runtime,
    image: &str,
    owner: &str,
    spec: &SandboxSpec,
) -> EnvResult<ContainerCreateBody> {
    let limits = &spec.limits;
    // The disk bound, split between /workspace and /tmp by the one rule every backend
    // uses; a caller's directory cannot be bounded.
    let split = limits.disk_split();
    if spec.workspace.is_some() && split.is_some() {
        return Err(unavailable(
            "disk limit: a --workdir on the host's filesystem cannot be bounded; run \
             without --disk (the workdir is yours, /tmp keeps its own bound) or without --workdir",
        ));
    }
    let user = match &spec.workspace {
        None => format!("{SANDBOX_UID}:{SANDBOX_UID}"),
        Some(dir) => workspace_owner(runtime, dir)?,
    };
    // This runsc (20221219) keeps a tmpfs's size but drops nr_inodes (its mounts show
    // only size=): an inode bound asked for is refused, never run without; the one a
    // disk bound brings by default is left out there (gVisor's inodes live in its own
    // kernel's memory, under the memory limit, not in the host's).
    let keeps_inodes = runtime != Runtime::Runsc;
    if let Some(split) = split
        && split.inodes_asked
        && !keeps_inodes
    {
        return Err(unavailable(
            "gvisor: inode bound: this runsc does not enforce a tmpfs's nr_inodes; run \
             without --inodes (the memory limit still bounds what the sandbox kernel's \
             inodes cost) or use the docker or native backend for it",
        ));
    }
    let inodes = |n: u64| {
        if keeps_inodes {
            format!(",nr_inodes={n}")
        } else {
            String::new()
        }
    };
    let (tmp_bytes, tmp_inodes, workspace_bytes, workspace_inodes) = match split {
        Some(split) => (
            split.tmp_bytes,
            inodes(split.tmp_inodes),
            split.workspace_bytes,
            inodes(split.workspace_inodes),
        ),
        None => (
            limits.tmp_bytes,
            String::new(),
            WORKSPACE_BYTES,
            String::new(),
        ),
    };
    let mut tmpfs = HashMap::from([(
        "/tmp".to_string(),
        format!("rw,exec,nosuid,nodev,size={tmp_bytes}{tmp_inodes},mode=1777"),
    )]);
    let mut mounts = Vec::new();
    match &spec.workspace {
        None => {
            tmpfs.insert(
                WORKSPACE.into(),
                format!(
                    "rw,exec,nosuid,nodev,size={workspace_bytes}{workspace_inodes},mode=0755,uid={SANDBOX_UID},gid={SANDBOX_UID}"
                ),
            );
        }
        Some(dir) => mounts.push(Mount {
            target: Some(WORKSPACE.into()),
            source: Some(dir.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        }),
    }
    for mount in &spec.policy.read_only_mounts {
        let target = skillbox_env::path::normalize(&mount.sandbox);
        if !mount.host.is_absolute() || !target.is_absolute() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} -> {}: both paths must be absolute",
                mount.host.display(),
                mount.sandbox.display()
            )));
        }
        if !mount.host.is_dir() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {}: must be an existing directory (a socket or \
                 device would give the code what read-only does not stop)",
                mount.host.display()
            )));
        }
        if target == Path::new("/")
            || target.starts_with(WORKSPACE)
            || target.starts_with("/tmp")
            || target.starts_with("/proc")
            || target.starts_with("/dev")
        {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} may not be mounted over {}",
                mount.host.display(),
                target.display()
            )));
        }
        mounts.push(Mount {
            target: Some(target.display().to_string()),
            source: Some(mount.host.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        });
    }
    let mut ulimits = Vec::new();
    let mut ulimit = |name: &str, value: u64| {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        ulimits.push(ResourcesUlimits {
            name: Some(name.into()),
            soft: Some(value),
            hard: Some(value),
        });
    };
    if let Some(size) = limits.file_size_bytes {
        ulimit("fsize", size);
    }
    if let Some(files) = limits.open_files {
        ulimit("nofile", files);
    }
    if let Some(seconds) = limits.cpu_seconds {
        ulimit("cpu", seconds);
    }
    let pids_limit = match (runtime, limits.pids) {
        (_, None) => None,
        (Runtime::Runc, Some(pids)) => Some(i64::from(pids)),
        // Under gVisor the container's pids cgroup counts the sentry's host tasks, not the
        // sandbox's processes: those are bounded by RLIMIT_NPROC, which gVisor enforces in
        // its own kernel (one uid per sandbox there, so per-uid means per-sandbox).
        (Runtime::Runsc, Some(pids)) => {
            ulimit("nproc", u64::from(pids));
            Some(GVISOR_BASE_TASKS + GVISOR_TASKS_PER_PROCESS * i64::from(pids))
        }
    };
    let memory = limits
        .memory_bytes
        .map(|m| i64::try_from(m).unwrap_or(i64::MAX));
    let cpus = limits
        .cpus
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        privileged: Some(false),
        ipc_mode: Some("private".into()),
        memory,
        memory_swap: memory,
        nano_cpus: Some((cpus * 1e9) as i64),
        pids_limit,
        ulimits: Some(ulimits),
        tmpfs: Some(tmpfs),
        mounts: Some(mounts),
        runtime: Some(runtime.docker_name().into()),
        // skillbox's own pid 1 (helpers/init.pl) reaps and kills; see the crate docs.
        init: Some(false),
        auto_remove: Some(false),
        ..Default::default()
    };
    let env = vec![
        format!("PATH={PATH}"),
        "HOME=/tmp".into(),
        "USER=sandbox".into(),
        "LOGNAME=sandbox".into(),
        "LANG=C.UTF-8".into(),
        "TMPDIR=/tmp".into(),
        "SHELL=/bin/sh".into(),
    ];
    Ok(ContainerCreateBody {
        image: Some(image.into()),
        user: Some(user),
        // Interpreters by absolute path: no PATH lookup for skillbox's own helpers.
        entrypoint: Some(vec![
            runtime.perl().into(),
            "-e".into(),
            INIT_PL.into(),
            NR_PRCTL.to_string(),
        ]),
        cmd: Some(vec![]),
        working_dir: Some(WORKSPACE.into()),
        env: Some(env),
        network_disabled: Some(true),
        labels: Some(HashMap::from([
            (LABEL_SANDBOX.to_string(), runtime.backend().to_string()),
            (LABEL_OWNER.to_string(), owner.to_string()),
        ])),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// The user a container with a host workspace runs as: the directory's owner, so what
/// the code writes there is the owner's. Never root.
fn workspace_owner(runtime: Runtime, dir: &Path) -> EnvResult<String> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(dir).map_err(|e| EnvError::io(&e, "workdir", dir).with_path(dir))?;
    if !meta.is_dir() {
        return Err(EnvError::new(
            ErrorCode::NotDirectory,
            format!("workdir {}: not a directory", dir.display()),
        )
        .with_path(dir));
    }
    if meta.uid() == 0 {
        return Err(EnvError::invalid(format!(
            "backend {}: workdir {} is owned by root, and a container never runs as root;              chown it to an unprivileged user (e.g. `chown {SANDBOX_UID}:{SANDBOX_UID}`) or              leave the workdir out for a tmpfs workspace",
            runtime.backend(),
            dir.display()
        ))
        .with_path(dir));
    }
    Ok(format!("{}:{}", meta.uid(), meta.gid()))
}

/// Maps a daemon error during a sandbox operation.
fn op_error(backend: BackendKind, what: &str, error: &bollard::errors::Error) -> EnvError {
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

/// How the exec wrapper said the command ended.
#[derive(Debug, PartialEq, Eq)]
enum Status {
    Exit(i32),
    Signal(i32),
    ExecFailed(i32),
    CwdFailed(i32),
    SetupFailed(i32),
}

fn parse_status(text: &str) -> Option<Status> {
    let (kind, number) = text.split_once(' ')?;
    let number: i32 = number.trim().parse().ok()?;
    Some(match kind {
        "exit" => Status::Exit(number),
        "signal" => Status::Signal(number),
        "exec" => Status::ExecFailed(number),
        "cwd" => Status::CwdFailed(number),
        "setup" => Status::SetupFailed(number),
        _ => return None,
    })
}

/// Splits the wrapper's status line off the end of stderr.
fn split_status(tail: &[u8], nonce: &str) -> (usize, Option<Status>) {
    let marker = format!("\0skillbox-status:{nonce}:");
    let Some(at) = find_last(tail, marker.as_bytes()) else {
        return (tail.len(), None);
    };
    let rest = &tail[at + marker.len()..];
    match rest.strip_suffix(b"\n") {
        Some(line) if !line.contains(&b'\n') => {
            (at, std::str::from_utf8(line).ok().and_then(parse_status))
        }
        _ => (tail.len(), None),
    }
}

fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > haystack.len() {
        return None;
    }
    (0..=haystack.len() - needle.len())
        .rev()
        .find(|&i| &haystack[i..i + needle.len()] == needle)
}

/// One output stream, cut at the cap (the rest is drained and dropped).
struct Capped {
    cap: u64,
    kept: u64,
    truncated: bool,
    stderr: bool,
}

impl Capped {
    async fn feed(&mut self, data: &[u8], tx: &mpsc::Sender<EnvResult<ExecEvent>>) {
        if data.is_empty() {
            return;
        }
        let room = self.cap.saturating_sub(self.kept);
        let take = (data.len() as u64).min(room) as usize;
        if take < data.len() {
            self.truncated = true;
        }
        if take == 0 {
            return;
        }
        self.kept += take as u64;
        let chunk = Bytes::copy_from_slice(&data[..take]);
        let event = if self.stderr {
            ExecEvent::Stderr(chunk)
        } else {
            ExecEvent::Stdout(chunk)
        };
        // A dropped stream does not stop the exec; the output is drained regardless.
        let _ = tx.send(Ok(event)).await;
    }
}

/// What the command printed and how it ended, for the helper (uncapped up to a bound).
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: Option<i64>,
}

impl DockerSandbox {
    pub(crate) async fn start(
        docker: Docker,
        runtime: Runtime,
        image: &str,
        owner: &str,
        spec: SandboxSpec,
        live: Live,
    ) -> EnvResult<DockerSandbox> {
        let config = container_config(runtime, image, owner, &spec)?;
        let warm = Warm::start(docker, runtime, image, config, live).await?;
        Ok(warm.into_sandbox(spec.limits))
    }

    /// The container's id.
    pub fn container_id(&self) -> &str {
        &self.inner.id
    }

    fn backend_name(&self) -> BackendKind {
        self.inner.runtime.backend()
    }

    async fn take_turn(&self, cancel: &CancellationToken) -> EnvResult<OwnedMutexGuard<()>> {
        if self.inner.removed.load(Ordering::SeqCst) {
            return Err(gone(&self.inner));
        }
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("exec"));
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(EnvError::aborted("waiting for the sandbox")),
            () = self.inner.shutdown.cancelled() => Err(EnvError::aborted("the sandbox was cleaned up")),
            guard = self.inner.turn.clone().lock_owned() => Ok(guard),
        }
    }

    /// Runs one of skillbox's helper commands (not the caller's code) to the end and
    /// collects what it printed.
    async fn helper(
        &self,
        argv: Vec<String>,
        stdin: Option<Vec<u8>>,
        cancel: &CancellationToken,
    ) -> EnvResult<Collected> {
        if self.inner.removed.load(Ordering::SeqCst) {
            return Err(gone(&self.inner));
        }
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("file operation"));
        }
        let gate = self.inner.fs_gate.clone().read_owned().await;
        let docker = self.inner.docker.clone();
        let id = self.inner.id.clone();
        let backend = self.backend_name();
        // The helper runs to its end in a task of its own: a cancelled caller stops
        // waiting at once, and the operation (bounded, and killed with the rest by the
        // next reset if it got stuck) keeps the gate until it is really over.
        let run = tokio::spawn(async move {
            let _gate = gate;
            collect_exec(&docker, &id, backend, "file operation", argv, stdin).await
        });
        tokio::select! {
            joined = run => joined.map_err(|e| EnvError::new(ErrorCode::Unknown, format!("file operation: {e}")))?,
            () = cancel.cancelled() => Err(EnvError::aborted("file operation")),
            () = self.inner.shutdown.cancelled() => Err(EnvError::aborted("the sandbox was cleaned up")),
        }
    }

    /// Runs the file helper: `op` with `args`, returning its stdout.
    async fn fs_op(
        &self,
        op: &str,
        args: &[String],
        stdin: Option<Vec<u8>>,
        path: &Path,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        let python = self.inner.runtime.python();
        let mut argv: Vec<String> = [python, "-I", "-S", "-c", FS_PY, op]
            .iter()
            .map(|s| s.to_string())
            .collect();
        argv.extend(args.iter().cloned());
        let out = self.helper(argv, stdin, cancel).await?;
        match out.exit_code {
            Some(0) => Ok(out.stdout),
            Some(1) => {
                let parsed: Option<serde_json::Value> = serde_json::from_slice(&out.stderr).ok();
                let errno = parsed
                    .as_ref()
                    .and_then(|v| v["errno"].as_i64())
                    .unwrap_or(0) as i32;
                let msg = parsed
                    .as_ref()
                    .and_then(|v| v["msg"].as_str().map(str::to_string))
                    .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).into_owned());
                Err(EnvError::new(
                    skillbox_env::errno_code(errno),
                    format!("{op} {}: {msg}", path.display()),
                )
                .with_path(path))
            }
            other => Err(EnvError::new(
                ErrorCode::Unknown,
                format!(
                    "{op} {}: the file helper failed (exit {other:?}): {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            )
            .with_path(path)),
        }
    }

    async fn fs_json(
        &self,
        op: &str,
        args: &[String],
        path: &Path,
        cancel: &CancellationToken,
    ) -> EnvResult<serde_json::Value> {
        let out = self.fs_op(op, args, None, path, cancel).await?;
        serde_json::from_slice(&out).map_err(|e| {
            EnvError::new(
                ErrorCode::Unknown,
                format!("{op} {}: unreadable helper answer: {e}", path.display()),
            )
        })
    }

    fn arg(&self, path: &Path) -> String {
        self.absolute(path).display().to_string()
    }
}

/// Whether the sandbox's bounded `/workspace` or `/tmp` is full (or as good as: less
/// left than a failed write would leave, or no inodes). False without a disk bound.
async fn disk_full(inner: &Inner, backend: BackendKind) -> bool {
    let Some(split) = inner.limits.disk_split() else {
        return false;
    };
    const STATFS: &str = "import os\nfor p in ('/workspace', '/tmp'):\n    s = os.statvfs(p)\n    print(s.f_bavail * s.f_frsize, s.f_favail)\n";
    let argv = [inner.runtime.python(), "-I", "-S", "-c", STATFS]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let Ok(out) = collect_exec(&inner.docker, &inner.id, backend, "disk check", argv, None).await
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let sizes = [split.workspace_bytes, split.tmp_bytes];
    text.lines().zip(sizes).any(|(line, size)| {
        let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
        let (Some(Some(free)), Some(Some(inodes))) = (fields.next(), fields.next()) else {
            return false;
        };
        // gVisor reports no inode counts (0 of 0): its inodes are not bounded there.
        let inodes = (inner.runtime != Runtime::Runsc).then_some(inodes);
        DiskSplit::is_full(size, free, inodes)
    })
}

/// Runs one of skillbox's own commands in the container to its end and collects what it
/// printed (up to [`MAX_READ_BYTES`] of stdout).
async fn collect_exec(
    docker: &Docker,
    id: &str,
    backend: BackendKind,
    what: &'static str,
    argv: Vec<String>,
    stdin: Option<Vec<u8>>,
) -> EnvResult<Collected> {
    let exec = docker
        .create_exec(
            id,
            ExecConfig {
                cmd: Some(argv),
                attach_stdin: Some(stdin.is_some()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                working_dir: Some("/".into()),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    let started = docker
        .start_exec(&exec.id, None::<StartExecOptions>)
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(EnvError::new(ErrorCode::Unknown, "exec did not attach"));
    };
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
    };
    while let Some(frame) = output.next().await {
        match frame {
            Ok(LogOutput::StdOut { message }) => {
                if collected.stdout.len() + message.len() > MAX_READ_BYTES {
                    return Err(EnvError::new(
                        ErrorCode::ResourceExhausted,
                        format!("{what}: more than {MAX_READ_BYTES} bytes"),
                    ));
                }
                collected.stdout.extend_from_slice(&message);
            }
            Ok(LogOutput::StdErr { message }) => collected.stderr.extend_from_slice(&message),
            Ok(_) => {}
            Err(e) => return Err(op_error(backend, what, &e)),
        }
    }
    if let Some(writer) = writer {
        writer.abort();
    }
    let inspected = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| op_error(backend, what, &e))?;
    collected.exit_code = inspected.exit_code;
    Ok(collected)
}

/// The pid of the container's init, from `top` (a host pid: runc only).
async fn init_pid(docker: &Docker, id: &str) -> EnvResult<String> {
    let rows = top(docker, id).await?;
    match rows.as_slice() {
        [(pid, _)] => Ok(pid.clone()),
        other => Err(unavailable(format!(
            "the sandbox container started with {} processes instead of its init",
            other.len()
        ))),
    }
}

/// The container's processes as (pid, command line), seen from the host (runc only:
/// under runsc `docker top` does not list the sandbox's processes).
async fn top(docker: &Docker, id: &str) -> EnvResult<Vec<(String, String)>> {
    let top = docker
        .top_processes(id, None::<bollard::query_parameters::TopOptions>)
        .await
        .map_err(|e| op_error(BackendKind::Docker, "list the sandbox's processes", &e))?;
    let titles = top.titles.unwrap_or_default();
    let pid_at = titles.iter().position(|t| t == "PID");
    let cmd_at = titles.iter().position(|t| t == "CMD" || t == "COMMAND");
    let (Some(pid_at), Some(cmd_at)) = (pid_at, cmd_at) else {
        return Err(EnvError::new(
            ErrorCode::Unknown,
            format!("unexpected process list columns {titles:?}"),
        ));
    };
    let rows = top
        .processes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|row| Some((row.get(pid_at)?.clone(), row.get(cmd_at)?.clone())))
        .collect();
    Ok(rows)
}

/// How many kills init has done (from its command line, `skillbox-init N`), and whether
/// anything but init runs (runc only).
async fn kill_state(inner: &Inner) -> EnvResult<(Option<u64>, bool)> {
    let rows = top(&inner.docker, &inner.id).await?;
    let mut kills = None;
    let mut others = false;
    for (pid, cmd) in rows {
        if pid == inner.init_pid {
            kills = cmd
                .strip_prefix("skillbox-init ")
                .and_then(|n| n.trim().parse().ok());
        } else {
            others = true;
        }
    }
    Ok((kills, others))
}

/// Kills every process in the container but its pid 1, and waits until they are gone.
/// If that cannot be confirmed the container is removed: nothing may outlive its exec.
async fn kill_all(inner: &Inner) -> EnvResult<()> {
    if inner.removed.load(Ordering::SeqCst) {
        return Ok(());
    }
    let _gate = tokio::time::timeout(FS_DRAIN_BOUND, inner.fs_gate.clone().write_owned())
        .await
        .ok();
    let outcome = async {
        if inner.runtime == Runtime::Runsc {
            return kill_from_inside(inner).await;
        }
        let (before, _) = kill_state(inner).await?;
        let before = before.ok_or_else(|| unavailable("the sandbox's init is gone"))?;
        inner
            .docker
            .kill_container(
                &inner.id,
                Some(KillContainerOptions {
                    signal: "SIGUSR1".into(),
                }),
            )
            .await
            .map_err(|e| op_error(inner.runtime.backend(), "kill the sandbox's processes", &e))?;
        let deadline = Instant::now() + KILL_BOUND;
        let mut pause = Duration::from_millis(2);
        let mut resend = Instant::now() + Duration::from_secs(1);
        loop {
            let (kills, others) = kill_state(inner).await?;
            if kills.is_some_and(|k| k > before) && !others {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(unavailable("the sandbox's processes did not die"));
            }
            // Init has killed (its count moved) but something is still there, say a
            // child forked just then: ask again.
            if Instant::now() > resend && kills.is_some_and(|k| k > before) {
                resend = Instant::now() + Duration::from_secs(1);
                let _ = inner
                    .docker
                    .kill_container(
                        &inner.id,
                        Some(KillContainerOptions {
                            signal: "SIGUSR1".into(),
                        }),
                    )
                    .await;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
    .await;
    if let Err(e) = &outcome {
        // A container that stopped by itself died (gVisor after a memory bomb).
        if !container_running(inner).await {
            if container_oom_killed(inner).await {
                inner.ooms.fetch_add(1, Ordering::SeqCst);
            }
            inner.died.cancel();
        }
        // Fail closed: a container whose processes cannot be confirmed dead goes.
        tracing::warn!(container = %inner.id, error = %e, "docker: removing a sandbox that could not be reset");
        remove(inner).await;
    }
    outcome
}

/// The runsc way of [`kill_all`]: a killer process inside the container.
async fn kill_from_inside(inner: &Inner) -> EnvResult<()> {
    let argv = vec![
        inner.runtime.perl().to_string(),
        "-e".into(),
        KILL_PL.into(),
        NR_PRCTL.to_string(),
    ];
    let out = bounded(collect_exec(
        &inner.docker,
        &inner.id,
        inner.runtime.backend(),
        "reset the sandbox",
        argv,
        None,
    ))
    .await?;
    // The exit status is the authority: the sandbox's code cannot forge it (it could
    // write into the killer's output pipe).
    match (out.exit_code, String::from_utf8_lossy(&out.stdout).trim()) {
        (Some(0), "left 0") => Ok(()),
        (code, said) => Err(unavailable(format!(
            "the sandbox's processes did not die (killer exit {code:?}, {said:?})"
        ))),
    }
}

/// Bounds one of skillbox's own commands in the container: one that hangs (a runtime
/// that lost it) counts as a failed reset, and the sandbox is given up.
async fn bounded<T>(work: impl std::future::Future<Output = EnvResult<T>>) -> EnvResult<T> {
    tokio::time::timeout(KILL_BOUND, work)
        .await
        .map_err(|_| unavailable("the container did not answer in time"))?
}

/// Kills what an exec left running, if anything.
async fn settle(inner: &Inner) -> EnvResult<()> {
    if inner.removed.load(Ordering::SeqCst) {
        return Ok(());
    }
    // Under runsc the only view of the processes is from inside, where what is left of
    // the code could fake it: the killer runs every time (it is quick when there is
    // nothing to kill, and its exit status cannot be faked).
    if inner.runtime == Runtime::Runsc {
        return kill_all(inner).await;
    }
    match kill_state(inner).await {
        Ok((_, false)) => Ok(()),
        _ => kill_all(inner).await,
    }
}

async fn remove(inner: &Inner) {
    if inner.removed.swap(true, Ordering::SeqCst) {
        return;
    }
    inner.shutdown.cancel();
    // A container that could not be removed stays on the backend's list, for its
    // shutdown (and the next start's sweep) to try again.
    if remove_container(&inner.docker, &inner.id).await
        && let Ok(mut set) = inner.live.lock()
    {
        set.remove(&inner.id);
    }
}

/// A started container with skillbox's init running and nothing else: a sandbox not
/// handed out yet (see the backend's pool). Dropped, it removes its container.
pub(crate) struct Warm {
    docker: Docker,
    id: String,
    runtime: Runtime,
    init_pid: String,
    /// When its events start (a second early, for clock granularity).
    created_at: u64,
    live: Live,
    pending: PendingContainer,
}

impl Drop for Warm {
    fn drop(&mut self) {
        // Not handed out and not removed: `pending` removes the container; forget it.
        if self.pending.docker.is_some()
            && let Ok(mut live) = self.live.lock()
        {
            live.remove(&self.id);
        }
    }
}

impl std::fmt::Debug for Warm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Warm").field("id", &self.id).finish()
    }
}

impl Warm {
    /// Creates and starts a container from `config` (see [`container_config`]).
    pub(crate) async fn start(
        docker: Docker,
        runtime: Runtime,
        image: &str,
        config: ContainerCreateBody,
        live: Live,
    ) -> EnvResult<Warm> {
        let backend = runtime.backend();
        let created = docker
            .create_container(None::<CreateContainerOptions>, config)
            .await
            .map_err(|e| match &e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => unavailable(format!(
                    "backend {backend}: image {image} is not in the daemon; build it with `skillbox image build`"
                )),
                _ => op_error(backend, "create the container", &e),
            })?;
        let id = created.id;
        if !created.warnings.is_empty() {
            // Docker warns instead of failing when it drops a limit (no swap accounting,
            // no pids controller): that would be less isolation than asked.
            remove_container(&docker, &id).await;
            return Err(unavailable(format!(
                "backend {backend}: the daemon would not apply every limit: {}",
                created.warnings.join("; ")
            )));
        }
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs().saturating_sub(1))
            .unwrap_or(0);
        if let Ok(mut set) = live.lock() {
            set.insert(id.clone());
        }
        // Until the sandbox is handed out, a cancelled caller (this future dropped) or a
        // dropped pool must not leave the container behind.
        let pending = PendingContainer {
            docker: Some(docker.clone()),
            id: id.clone(),
        };
        let forget = |live: &Live, id: &str| {
            if let Ok(mut set) = live.lock() {
                set.remove(id);
            }
        };
        if let Err(e) = docker
            .start_container(&id, None::<StartContainerOptions>)
            .await
        {
            remove_container(&docker, &id).await;
            forget(&live, &id);
            let message = e.to_string();
            if runtime == Runtime::Runsc && message.contains("runsc") {
                return Err(unavailable(format!(
                    "backend gvisor: runsc could not start the container ({message}); check that \
                     runsc is registered with \"runtimeArgs\": [\"--network=none\"]"
                )));
            }
            return Err(op_error(backend, "start the container", &e));
        }
        let init_pid = match runtime {
            Runtime::Runc => init_pid(&docker, &id).await,
            // Seen from inside, which is how processes are listed under runsc.
            Runtime::Runsc => Ok("1".to_string()),
        };
        let init_pid = match init_pid {
            Ok(pid) => pid,
            Err(e) => {
                remove_container(&docker, &id).await;
                forget(&live, &id);
                return Err(e.with_path(WORKSPACE));
            }
        };
        tracing::debug!(container = %id, %backend, "docker: sandbox started");
        Ok(Warm {
            docker,
            id,
            runtime,
            init_pid,
            created_at,
            live,
            pending,
        })
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Removes the container (never handed out) and forgets it.
    pub(crate) async fn remove(mut self) {
        self.pending.docker = None;
        remove_container(&self.docker, &self.id).await;
        if let Ok(mut live) = self.live.lock() {
            live.remove(&self.id);
        }
    }

    /// True while the container is running (a pooled one may have been removed or
    /// killed from outside since it started).
    pub(crate) async fn is_running(&self) -> bool {
        is_running(&self.docker, &self.id).await
    }

    /// The sandbox, with `limits` for its execs (its container's limits were set at
    /// create).
    pub(crate) fn into_sandbox(mut self, limits: Limits) -> DockerSandbox {
        let inner = Arc::new(Inner {
            docker: self.docker.clone(),
            id: self.id.clone(),
            runtime: self.runtime,
            limits,
            init_pid: std::mem::take(&mut self.init_pid),
            turn: Arc::new(Mutex::new(())),
            fs_gate: Arc::new(RwLock::new(())),
            shutdown: CancellationToken::new(),
            removed: AtomicBool::new(false),
            died: CancellationToken::new(),
            ooms: AtomicU64::new(0),
            live: self.live.clone(),
            filter_hex: hex(&skillbox_seccomp::filter_bytes()),
        });
        self.pending.docker = None;
        tokio::spawn(watch(Arc::downgrade(&inner), self.created_at));
        DockerSandbox {
            inner,
            cwd: PathBuf::from(WORKSPACE),
        }
    }
}

/// Removes a container whose sandbox was never handed out (see `DockerSandbox::start`).
struct PendingContainer {
    docker: Option<Docker>,
    id: String,
}

impl Drop for PendingContainer {
    fn drop(&mut self) {
        let Some(docker) = self.docker.take() else {
            return;
        };
        let id = std::mem::take(&mut self.id);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { remove_container(&docker, &id).await });
        }
    }
}

/// Why a removed sandbox cannot be used: cleaned up by its owner, or its container died.
fn gone(inner: &Inner) -> EnvError {
    if inner.died.is_cancelled() {
        let why = if inner.ooms.load(Ordering::SeqCst) > 0 {
            " (out of memory: under gVisor the memory limit ends the sandbox's kernel with the code that hit it)"
        } else {
            ""
        };
        unavailable(format!(
            "backend {}: the sandbox's container died{why}; start a new sandbox",
            inner.runtime.backend()
        ))
    } else {
        EnvError::aborted("the sandbox was cleaned up")
    }
}

/// True when the daemon recorded that the container was killed for memory.
async fn container_oom_killed(inner: &Inner) -> bool {
    match inner
        .docker
        .inspect_container(
            &inner.id,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
    {
        Ok(info) => info.state.and_then(|s| s.oom_killed).unwrap_or(false),
        Err(_) => false,
    }
}

/// False once the container has stopped (or is gone).
async fn container_running(inner: &Inner) -> bool {
    is_running(&inner.docker, &inner.id).await
}

/// False once container `id` has stopped (or is gone).
async fn is_running(docker: &Docker, id: &str) -> bool {
    match docker
        .inspect_container(id, None::<InspectContainerOptions>)
        .await
    {
        Ok(info) => info.state.and_then(|s| s.running).unwrap_or(false),
        Err(_) => false,
    }
}

/// Follows the daemon's events for the container: counts out-of-memory events, and
/// fires `died` when it dies. Ends with the sandbox.
async fn watch(inner: std::sync::Weak<Inner>, since: u64) {
    let (id, docker, shutdown) = match inner.upgrade() {
        Some(inner) => (
            inner.id.clone(),
            inner.docker.clone(),
            inner.shutdown.clone(),
        ),
        None => return,
    };
    let options = EventsOptions {
        since: Some(since.to_string()),
        until: None,
        filters: Some(HashMap::from([
            ("container".to_string(), vec![id]),
            (
                "event".to_string(),
                vec!["oom".to_string(), "die".to_string()],
            ),
        ])),
    };
    let mut events = docker.events(Some(options)).boxed();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = shutdown.cancelled() => return,
        };
        let Some(Ok(event)) = event else { return };
        let Some(inner) = inner.upgrade() else { return };
        match event.action.as_deref() {
            Some("oom") => {
                inner.ooms.fetch_add(1, Ordering::SeqCst);
            }
            Some("die") => {
                tracing::warn!(container = %inner.id, "docker: the sandbox container died");
                inner.died.cancel();
                return;
            }
            _ => {}
        }
    }
}

/// True when an out-of-memory event for the container arrives (events may trail the
/// kill they explain by a moment).
async fn oom_after(inner: &Inner, before: u64) -> bool {
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        if inner.ooms.load(Ordering::SeqCst) > before {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[async_trait]
impl Shell for DockerSandbox {
    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        request.validate()?;
        let turn = self.take_turn(cancel).await?;
        let inner = self.inner.clone();
        let backend = self.backend_name();
        let timeout = request.timeout.unwrap_or_else(|| inner.limits.timeout());
        let deadline = tokio::time::Instant::now() + timeout;
        let nonce = nonce();
        let cwd = self.arg(request.cwd.as_deref().unwrap_or(&self.cwd));
        let mut argv = vec![
            inner.runtime.perl().to_string(),
            "-e".into(),
            EXEC_PL.into(),
            NR_PRCTL.to_string(),
            NR_SECCOMP.to_string(),
            inner.filter_hex.clone(),
            nonce.clone(),
            cwd.clone(),
            // The caller's variables reach only the command, never the wrapper (see
            // helpers/exec.pl).
            request.env.len().to_string(),
        ];
        argv.extend(request.env.iter().map(|(k, v)| format!("{k}={v}")));
        let command = request.command.to_argv();
        let program = command.first().cloned().unwrap_or_default();
        argv.extend(command);
        let exec = inner
            .docker
            .create_exec(
                &inner.id,
                ExecConfig {
                    cmd: Some(argv),
                    attach_stdin: Some(request.stdin.is_some()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    working_dir: Some("/".into()),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| op_error(backend, "exec", &e))?;
        let started_at = Instant::now();
        let ooms_before = inner.ooms.load(Ordering::SeqCst);
        let started = inner
            .docker
            .start_exec(
                &exec.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: Some(64 * 1024),
                }),
            )
            .await
            .map_err(|e| op_error(backend, "exec", &e))?;
        let StartExecResults::Attached {
            mut output,
            mut input,
        } = started
        else {
            return Err(EnvError::new(ErrorCode::Unknown, "exec did not attach"));
        };
        let writer = request.stdin.map(|data| {
            tokio::spawn(async move {
                let _ = input.write_all(&data).await;
                let _ = input.shutdown().await;
            })
        });
        let (tx, stream) = ExecStream::channel();
        let cancel = cancel.clone();
        let cap = inner.limits.output_bytes;
        tokio::spawn(async move {
            let _turn = turn;
            let mut stdout = Capped {
                cap,
                kept: 0,
                truncated: false,
                stderr: false,
            };
            let mut stderr = Capped {
                cap,
                kept: 0,
                truncated: false,
                stderr: true,
            };
            let mut tail: Vec<u8> = Vec::new();
            let (mut timed_out, mut aborted, mut killed, mut settled) =
                (false, false, false, false);
            let mut died = false;
            let mut failure: Option<EnvError> = None;
            // A kill (timeout, cancel) or a reset (the command ended) runs alongside the
            // reading: output left unread could stall the container's next exec.
            let mut reset: Option<Pin<Box<dyn Future<Output = EnvResult<()>> + Send>>> = None;
            let start_reset = |inner: &Arc<Inner>,
                               kill: bool|
             -> Pin<Box<dyn Future<Output = EnvResult<()>> + Send>> {
                let inner = inner.clone();
                Box::pin(async move {
                    if kill {
                        kill_all(&inner).await
                    } else {
                        settle(&inner).await
                    }
                })
            };
            loop {
                tokio::select! {
                    frame = output.next() => match frame {
                        Some(Ok(LogOutput::StdOut { message })) => stdout.feed(&message, &tx).await,
                        Some(Ok(LogOutput::StdErr { message })) => {
                            tail.extend_from_slice(&message);
                            if !settled && !killed && split_status(&tail, &nonce).1.is_some() {
                                // The command ended; what it left behind (holding the
                                // output open, say) is killed so the stream can end.
                                settled = true;
                                reset = Some(start_reset(&inner, false));
                            }
                            if tail.len() > HOLD_BACK {
                                let emit: Vec<u8> = tail.drain(..tail.len() - HOLD_BACK).collect();
                                stderr.feed(&emit, &tx).await;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            failure = Some(op_error(backend, "exec output", &e));
                            break;
                        }
                        None => break,
                    },
                    done = async {
                        match reset.as_mut() {
                            Some(pending) => pending.await,
                            None => std::future::pending().await,
                        }
                    }, if reset.is_some() => {
                        reset = None;
                        if let Err(e) = done { failure = Some(e); break; }
                    }
                    () = tokio::time::sleep_until(deadline), if !killed => {
                        timed_out = true;
                        killed = true;
                        reset = Some(start_reset(&inner, true));
                    }
                    () = cancel.cancelled(), if !killed => {
                        aborted = true;
                        killed = true;
                        reset = Some(start_reset(&inner, true));
                    }
                    () = inner.shutdown.cancelled(), if !killed => {
                        aborted = true;
                        killed = true;
                    }
                    () = inner.died.cancelled() => {
                        died = true;
                        break;
                    }
                }
            }
            // The stream ended while a reset was still under way: let it finish.
            if let Some(pending) = reset.take()
                && let Err(e) = pending.await
            {
                failure.get_or_insert(e);
            }
            if let Some(writer) = writer {
                writer.abort();
            }
            let (end, status) = split_status(&tail, &nonce);
            stderr.feed(&tail[..end], &tx).await;
            // The output also ends when the whole container dies (under gVisor, the memory
            // limit takes the sandbox's kernel with the code that hit it).
            if !died
                && !killed
                && !settled
                && !inner.died.is_cancelled()
                && let Err(e) = settle(&inner).await
            {
                failure.get_or_insert(e);
            }
            // The output also ends when the whole container dies (under gVisor, the memory
            // limit takes the sandbox's kernel with the code that hit it); a reset that
            // failed may be the first sign of it.
            let died = died
                || inner.died.is_cancelled()
                || (status.is_none() && !killed && !container_running(&inner).await);
            if died {
                inner.died.cancel();
                // The daemon's OOM event can trail the death under load; the container's
                // own record says it too.
                let memory = container_oom_killed(&inner).await
                    || oom_after(&inner, ooms_before).await
                    || container_oom_killed(&inner).await;
                remove(&inner).await;
                let out = Ended {
                    ending: Ending::Killed,
                    timed_out: false,
                    truncated: Truncated {
                        stdout: stdout.truncated,
                        stderr: stderr.truncated,
                    },
                    accounted: memory.then_some(LimitKind::Memory),
                    duration: started_at.elapsed(),
                }
                .output();
                let _ = tx.send(Ok(ExecEvent::Exit(out))).await;
                return;
            }
            if aborted
                || (inner.removed.load(Ordering::SeqCst) && failure.is_none() && status.is_none())
            {
                let _ = tx.send(Err(EnvError::aborted("exec"))).await;
                return;
            }
            if let Some(error) = failure {
                let _ = tx.send(Err(error)).await;
                return;
            }
            let ending = match status {
                Some(Status::Exit(code)) => Ending::Exited(code),
                Some(Status::Signal(signal)) => Ending::Signaled(signal),
                Some(Status::ExecFailed(errno)) => {
                    let what = if errno == libc::ENOENT {
                        "command not found".to_string()
                    } else {
                        format!("cannot run it (errno {errno})")
                    };
                    let line = format!("skillbox: {program}: {what}\n");
                    stderr.feed(line.as_bytes(), &tx).await;
                    Ending::NotStarted(errno)
                }
                Some(Status::CwdFailed(errno)) => {
                    let _ = tx
                        .send(Err(EnvError::new(
                            skillbox_env::errno_code(errno),
                            format!("exec: cannot use {cwd} as the working directory"),
                        )
                        .with_path(&cwd)))
                        .await;
                    return;
                }
                Some(Status::SetupFailed(errno)) => {
                    let _ = tx
                        .send(Err(unavailable(format!(
                            "backend {backend}: the exec wrapper could not apply skillbox's \
                             seccomp layer (errno {errno}); refusing to run without it"
                        ))))
                        .await;
                    return;
                }
                // Killed by us (timeout) or before the wrapper could report (the OOM killer
                // picked the wrapper).
                None => Ending::Killed,
            };
            // A SIGKILL that was not ours may be the memory cgroup's.
            let killed = matches!(ending, Ending::Killed | Ending::Signaled(libc::SIGKILL));
            let memory = killed && !timed_out && oom_after(&inner, ooms_before).await;
            // A command that failed with its disk full ran out of disk.
            let failed = !matches!(ending, Ending::Exited(0));
            let disk = !memory && failed && disk_full(&inner, backend).await;
            let accounted = if memory {
                Some(LimitKind::Memory)
            } else {
                disk.then_some(LimitKind::Disk)
            };
            let out = Ended {
                ending,
                timed_out,
                truncated: Truncated {
                    stdout: stdout.truncated,
                    stderr: stderr.truncated,
                },
                accounted,
                duration: started_at.elapsed(),
            }
            .output();
            let _ = tx.send(Ok(ExecEvent::Exit(out))).await;
        });
        Ok(stream)
    }
}

fn kind_of(text: &str) -> FileKind {
    match text {
        "file" => FileKind::File,
        "dir" => FileKind::Dir,
        "symlink" => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

/// How a `readmany` run ended.
#[derive(Debug, PartialEq, Eq)]
enum ReadsEnd {
    /// Every answer is in (or a "later": the rest goes to the next run).
    Done,
    /// The next path failed with this errno.
    Failed(i32),
}

/// The answers of one `readmany` run, appended to `read`. `None` when the answer is
/// malformed.
fn parse_reads(mut out: &[u8], read: &mut Vec<FileRead>) -> Option<ReadsEnd> {
    while !out.is_empty() {
        let end = out.iter().position(|&b| b == b'\n')?;
        let header: serde_json::Value = serde_json::from_slice(&out[..end]).ok()?;
        out = &out[end + 1..];
        match header["s"].as_str()? {
            "ok" => {
                let n = usize::try_from(header["n"].as_u64()?).ok()?;
                read.push(FileRead::Content(out.get(..n)?.to_vec()));
                out = &out[n..];
            }
            "missing" => read.push(FileRead::Missing),
            "notfile" => read.push(FileRead::NotFile),
            "toolarge" => read.push(FileRead::TooLarge(header["n"].as_u64()?)),
            "later" => return out.is_empty().then_some(ReadsEnd::Done),
            "error" => {
                let errno = i32::try_from(header["errno"].as_i64()?).ok()?;
                return out.is_empty().then_some(ReadsEnd::Failed(errno));
            }
            _ => return None,
        }
    }
    Some(ReadsEnd::Done)
}

fn bad_answer(op: &str, path: &Path) -> EnvError {
    EnvError::new(
        ErrorCode::Unknown,
        format!("{op} {}: unreadable helper answer", path.display()),
    )
}

#[async_trait]
impl FileSystem for DockerSandbox {
    fn cwd(&self) -> &Path {
        &self.cwd
    }

    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
        let value = self
            .fs_json("canonical", &[self.arg(path)], path, cancel)
            .await?;
        value
            .as_str()
            .map(PathBuf::from)
            .ok_or_else(|| bad_answer("canonical", path))
    }

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
        let value = self
            .fs_json("exists", &[self.arg(path)], path, cancel)
            .await?;
        value.as_bool().ok_or_else(|| bad_answer("exists", path))
    }

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
        let v = self
            .fs_json("info", &[self.arg(path)], path, cancel)
            .await?;
        let modified = v["mtimeNs"].as_i64().and_then(|ns| {
            u64::try_from(ns)
                .ok()
                .map(|ns| std::time::UNIX_EPOCH + Duration::from_nanos(ns))
        });
        Ok(FileInfo {
            kind: kind_of(v["kind"].as_str().unwrap_or("")),
            size: v["size"].as_u64().ok_or_else(|| bad_answer("info", path))?,
            mode: v["mode"].as_u64().unwrap_or(0) as u32,
            modified,
            read_only: v["readOnly"].as_bool().unwrap_or(false),
        })
    }

    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>> {
        let v = self
            .fs_json("list", &[self.arg(path)], path, cancel)
            .await?;
        let entries = v.as_array().ok_or_else(|| bad_answer("list", path))?;
        entries
            .iter()
            .map(|e| {
                Some(DirEntry {
                    name: e.get(0)?.as_str()?.to_string(),
                    kind: kind_of(e.get(1)?.as_str()?),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_answer("list", path))
    }

    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
        let bytes = self.read_bytes(path, cancel).await?;
        String::from_utf8(bytes).map_err(|_| {
            EnvError::invalid(format!("{}: not UTF-8 text", path.display())).with_path(path)
        })
    }

    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines> {
        let text = self.read_text(path, cancel).await?;
        first_lines(std::io::Cursor::new(text), max, path)
    }

    /// One helper run for the whole tree.
    async fn walk(
        &self,
        root: &Path,
        prune: &[&str],
        max_entries: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<WalkEntry>> {
        let root = self.absolute(root);
        let mut args = vec![self.arg(&root), max_entries.to_string()];
        args.extend(prune.iter().map(|p| p.to_string()));
        let v = self.fs_json("walk", &args, &root, cancel).await?;
        let listed = v.as_array().ok_or_else(|| bad_answer("walk", &root))?;
        if listed.len() > max_entries {
            return Err(too_many_entries(&root, max_entries));
        }
        listed
            .iter()
            .map(|e| {
                Some(WalkEntry {
                    path: e.get(0)?.as_str()?.to_string(),
                    kind: kind_of(e.get(1)?.as_str()?),
                    size: e.get(2)?.as_u64()?,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad_answer("walk", &root))
    }

    /// As few helper runs as the bytes allow (about [`READ_BATCH_BYTES`] each).
    async fn read_files(
        &self,
        paths: &[PathBuf],
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<FileRead>> {
        // One file must fit what a helper run may print.
        if max_bytes > READ_MAX_FILE_BYTES {
            return Err(EnvError::invalid(format!(
                "read_files: a cap of {max_bytes} bytes is over the {} backend's {READ_MAX_FILE_BYTES}",
                self.inner.runtime.backend()
            )));
        }
        let mut read = Vec::with_capacity(paths.len());
        while read.len() < paths.len() {
            let rest = &paths[read.len()..];
            let shown = &rest[0];
            let list: Vec<String> = rest.iter().map(|p| self.arg(p)).collect();
            let stdin = serde_json::to_vec(&list)
                .map_err(|e| EnvError::new(ErrorCode::Unknown, format!("read_files: {e}")))?;
            let args = [max_bytes.to_string(), READ_BATCH_BYTES.to_string()];
            let out = self
                .fs_op("readmany", &args, Some(stdin), shown, cancel)
                .await?;
            let before = read.len();
            let end = parse_reads(&out, &mut read).ok_or_else(|| bad_answer("readmany", shown))?;
            if read.len() > paths.len() {
                return Err(bad_answer("readmany", shown));
            }
            if let ReadsEnd::Failed(errno) = end {
                let failed = paths.get(read.len()).unwrap_or(shown);
                return Err(EnvError::new(
                    skillbox_env::errno_code(errno),
                    format!(
                        "read {}: {}",
                        failed.display(),
                        std::io::Error::from_raw_os_error(errno)
                    ),
                )
                .with_path(failed));
            }
            if read.len() == before {
                return Err(bad_answer("readmany", shown));
            }
        }
        Ok(read)
    }

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>> {
        self.fs_op("read", &[self.arg(path)], None, path, cancel)
            .await
    }

    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_op(
            "write",
            &[self.arg(path)],
            Some(data.to_vec()),
            path,
            cancel,
        )
        .await
        .map(drop)
    }

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_op(
            "append",
            &[self.arg(path)],
            Some(data.to_vec()),
            path,
            cancel,
        )
        .await
        .map(drop)
    }

    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()> {
        self.fs_json("rename", &[self.arg(from), self.arg(to)], from, cancel)
            .await
            .map(drop)
    }

    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let flag = if recursive { "1" } else { "0" };
        self.fs_json("remove", &[self.arg(path), flag.into()], path, cancel)
            .await
            .map(drop)
    }

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let flag = if recursive { "1" } else { "0" };
        self.fs_json("mkdir", &[self.arg(path), flag.into()], path, cancel)
            .await
            .map(drop)
    }

    async fn create_temp_dir(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        temp_entry(self, "dir", prefix, cancel).await
    }

    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        temp_entry(self, "file", prefix, cancel).await
    }

    async fn cleanup(&self) -> EnvResult<()> {
        remove(&self.inner).await;
        Ok(())
    }
}

async fn temp_entry(
    sandbox: &DockerSandbox,
    kind: &str,
    prefix: &str,
    cancel: &CancellationToken,
) -> EnvResult<PathBuf> {
    if prefix.contains('/') || prefix.contains('\0') {
        return Err(EnvError::invalid(format!(
            "temp prefix {prefix:?}: must not contain '/'"
        )));
    }
    let path = Path::new("/workspace/.tmp");
    let v = sandbox
        .fs_json("mktemp", &[kind.into(), prefix.into()], path, cancel)
        .await?;
    v.as_str()
        .map(PathBuf::from)
        .ok_or_else(|| bad_answer("mktemp", path))
}

#[async_trait]
impl ExecutionEnv for DockerSandbox {
    fn kind(&self) -> BackendKind {
        self.inner.runtime.backend()
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        if self.inner.removed.load(Ordering::SeqCst) {
            return;
        }
        // Dropped without cleanup (a cancelled caller): the container goes anyway.
        self.inner.shutdown.cancel();
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { remove(&inner).await });
            }
            Err(_) => {
                std::thread::spawn(move || {
                    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        rt.block_on(remove(&inner));
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the file helper's `readmany` here, on the host, over `paths`.
    fn readmany(paths: &[&Path], limit: u64, budget: u64) -> Vec<u8> {
        use std::io::Write as _;
        let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        let mut child = std::process::Command::new("python3")
            .args(["-I", "-S", "-c", FS_PY, "readmany"])
            .args([limit.to_string(), budget.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(&serde_json::to_vec(&list).unwrap())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout
    }

    /// Past its byte budget the helper stops with "later", and the next run picks up
    /// there: every file is read once, in order, whatever the batches.
    #[test]
    fn readmany_batches_by_bytes_and_resumes() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<PathBuf> = (0..5).map(|i| dir.path().join(format!("{i}"))).collect();
        for (i, file) in files.iter().enumerate() {
            std::fs::write(file, vec![b'a' + i as u8; 40]).unwrap();
        }
        std::os::unix::fs::symlink(&files[0], dir.path().join("link")).unwrap();
        let mut paths: Vec<PathBuf> = files.clone();
        paths.insert(2, dir.path().join("link"));
        paths.insert(3, dir.path().join("gone"));
        let mut read = Vec::new();
        let mut runs = 0;
        while read.len() < paths.len() {
            let rest: Vec<&Path> = paths[read.len()..].iter().map(PathBuf::as_path).collect();
            // 100 bytes a run: two 40-byte files each, the next goes to the next run.
            let out = readmany(&rest, 64, 100);
            let before = read.len();
            assert_eq!(parse_reads(&out, &mut read), Some(ReadsEnd::Done));
            assert!(read.len() > before);
            runs += 1;
        }
        assert_eq!(runs, 3);
        let content = |i: usize| FileRead::Content(vec![b'a' + i as u8; 40]);
        assert_eq!(
            read,
            vec![
                content(0),
                content(1),
                FileRead::NotFile,
                FileRead::Missing,
                content(2),
                content(3),
                content(4),
            ]
        );
        // Over the cap: the size, not the content.
        std::fs::write(&files[0], [0u8; 65]).unwrap();
        let mut read = Vec::new();
        parse_reads(&readmany(&[&files[0]], 64, 100), &mut read).unwrap();
        assert_eq!(read, vec![FileRead::TooLarge(65)]);
        // A file that cannot be opened ends the run with its errno, after what came
        // before it (a name too long: an errno root gets too).
        let unopenable = dir.path().join("n".repeat(300));
        let mut read = Vec::new();
        let out = readmany(&[&files[1], &unopenable, &files[2]], 64, 100);
        let end = parse_reads(&out, &mut read).unwrap();
        assert_eq!(end, ReadsEnd::Failed(libc::ENAMETOOLONG));
        assert_eq!(read, vec![content(1)]);
        // A malformed answer is refused, not half-read.
        assert!(parse_reads(b"{\"s\":\"ok\",\"n\":5}\nabc", &mut Vec::new()).is_none());
    }

    #[test]
    fn the_status_line_is_split_off_stderr() {
        let tail = b"some error\n\0skillbox-status:abc:signal 9\n";
        let (end, status) = split_status(tail, "abc");
        assert_eq!(&tail[..end], b"some error\n");
        assert_eq!(status, Some(Status::Signal(9)));
        // Another nonce, or a line that is not last, is left alone.
        let (end, status) = split_status(tail, "xyz");
        assert_eq!((end, status), (tail.len(), None));
        let forged = b"\0skillbox-status:abc:exit 0\nmore\n";
        assert_eq!(split_status(forged, "abc"), (forged.len(), None));
    }

    #[test]
    fn gvisor_refuses_an_inode_bound_it_would_not_hold_and_docker_sets_it() {
        let asked = SandboxSpec {
            limits: Limits {
                disk_inodes: Some(1000),
                ..Limits::default()
            },
            ..SandboxSpec::default()
        };
        let Err(e) = container_config(Runtime::Runsc, "img", "me", &asked) else {
            panic!("runsc took an inode bound it does not enforce");
        };
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.message.contains("inode"), "{e}");
        let config = container_config(Runtime::Runc, "img", "me", &asked).unwrap();
        let tmpfs = config.host_config.unwrap().tmpfs.unwrap();
        assert!(tmpfs["/workspace"].contains("nr_inodes="), "{tmpfs:?}");
        // The default (derived) bound is left out under runsc, the bytes kept.
        let default = SandboxSpec::default();
        let config = container_config(Runtime::Runsc, "img", "me", &default).unwrap();
        let tmpfs = config.host_config.unwrap().tmpfs.unwrap();
        assert!(!tmpfs["/workspace"].contains("nr_inodes"), "{tmpfs:?}");
        let split = Limits::default().disk_split().unwrap();
        assert!(tmpfs["/workspace"].contains(&format!("size={}", split.workspace_bytes)));
        assert!(tmpfs["/tmp"].contains(&format!("size={}", split.tmp_bytes)));
    }

    #[test]
    fn a_workdir_with_a_disk_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SandboxSpec {
            workspace: Some(dir.path().to_path_buf()),
            ..SandboxSpec::default()
        };
        let Err(e) = container_config(Runtime::Runc, "img", "me", &spec) else {
            panic!("a workdir took a disk bound");
        };
        assert!(e.message.contains("disk limit"), "{e}");
    }

    #[test]
    fn statuses_parse() {
        assert_eq!(parse_status("exit 3"), Some(Status::Exit(3)));
        assert_eq!(parse_status("exec 2"), Some(Status::ExecFailed(2)));
        assert_eq!(parse_status("cwd 20"), Some(Status::CwdFailed(20)));
        assert_eq!(parse_status("bogus 1"), None);
        assert_eq!(parse_status("exit x"), None);
    }
}
