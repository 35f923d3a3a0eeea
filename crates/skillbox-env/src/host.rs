//! `HostEnv`: the unsandboxed env. **No boundary**: commands run as the calling user with
//! the caller's view of the machine. Use it only for code you would run in your own shell.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;

use crate::error::{EnvError, EnvResult};
use crate::exec::{ExecEvent, ExecRequest, ExecStream, StreamKind, pump_output};
use crate::exit::{Ended, Ending};
use crate::fs::{
    DirEntry, FileInfo, FileKind, FileSystem, TextLines, Tree, TreeKind, first_lines, read_at_most,
    regular_file, symlink_not_read,
};
use crate::limits::{Limits, SandboxSpec};
use crate::path::temp_name;
use crate::{
    Backend, BackendKind, BackendReport, CancellationToken, ExecutionEnv, Shell, Truncated,
    blocking,
};

/// Runs on the host itself. There is no isolation: see the module docs.
#[derive(Debug)]
pub struct HostEnv {
    cwd: PathBuf,
    temp_root: PathBuf,
    limits: Limits,
    temps: Mutex<Vec<PathBuf>>,
    /// Process groups of the execs still running, so `cleanup` can end them.
    running: Arc<Mutex<HashSet<i32>>>,
    /// Fired by `cleanup`: running execs stop waiting and report `aborted`.
    shutdown: CancellationToken,
}

impl HostEnv {
    /// A host env rooted at `cwd`; temp entries go under `temp_root`.
    pub fn new(cwd: impl Into<PathBuf>, temp_root: impl Into<PathBuf>) -> Self {
        HostEnv {
            cwd: cwd.into(),
            temp_root: temp_root.into(),
            limits: Limits::default(),
            temps: Mutex::new(Vec::new()),
            running: Arc::new(Mutex::new(HashSet::new())),
            shutdown: CancellationToken::new(),
        }
    }

    /// Makes `cleanup` remove `path` too, e.g. a temporary workspace made for this env.
    pub fn owning(self, path: impl Into<PathBuf>) -> Self {
        self.remember(&path.into());
        self
    }

    /// Timeout and output cap for execs (the other limits need a sandbox).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    fn remember(&self, path: &Path) {
        if let Ok(mut temps) = self.temps.lock() {
            temps.push(path.to_path_buf());
        }
    }
}

fn kind_of(file_type: std::fs::FileType) -> FileKind {
    if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Dir
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

#[async_trait]
impl FileSystem for HostEnv {
    fn cwd(&self) -> &Path {
        &self.cwd
    }

    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
        let p = self.absolute(path);
        blocking(cancel, "canonical", move || {
            std::fs::canonicalize(&p).map_err(|e| EnvError::io(&e, "canonical", &p))
        })
        .await
    }

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
        let p = self.absolute(path);
        blocking(cancel, "exists", move || {
            match std::fs::symlink_metadata(&p) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(EnvError::io(&e, "exists", &p)),
            }
        })
        .await
    }

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
        let p = self.absolute(path);
        blocking(cancel, "file_info", move || {
            let meta = std::fs::symlink_metadata(&p).map_err(|e| EnvError::io(&e, "stat", &p))?;
            Ok(FileInfo {
                kind: kind_of(meta.file_type()),
                size: meta.size(),
                mode: meta.permissions().mode() & 0o7777,
                modified: meta.modified().ok(),
                read_only: meta.permissions().readonly(),
            })
        })
        .await
    }

    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>> {
        let p = self.absolute(path);
        blocking(cancel, "list_dir", move || {
            let read = std::fs::read_dir(&p).map_err(|e| EnvError::io(&e, "list", &p))?;
            let mut entries = Vec::new();
            for entry in read {
                let entry = entry.map_err(|e| EnvError::io(&e, "list", &p))?;
                if entries.len() == crate::MAX_LIST_ENTRIES {
                    return Err(crate::too_many_to_list(&p));
                }
                // `DirEntry::metadata` does not follow a symlink.
                let meta = entry.metadata().ok();
                let kind = meta
                    .as_ref()
                    .map(|m| kind_of(m.file_type()))
                    .unwrap_or(FileKind::Other);
                entries.push(DirEntry {
                    name: entry.file_name().to_string_lossy().into(),
                    kind,
                    size: meta.filter(|m| m.is_file()).map(|m| m.len()),
                });
            }
            entries.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(entries)
        })
        .await
    }

    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
        let bytes = self.read_bytes(path, cancel).await?;
        String::from_utf8(bytes).map_err(|_| {
            let p = self.absolute(path);
            EnvError::invalid(format!(
                "read {}: not UTF-8 text; read it as bytes",
                p.display()
            ))
            .with_path(p)
        })
    }

    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines> {
        let p = self.absolute(path);
        blocking(cancel, "read", move || {
            let file = open_regular(&p, false, "read")?;
            first_lines(std::io::BufReader::new(file), max, &p)
        })
        .await
    }

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>> {
        let p = self.absolute(path);
        blocking(cancel, "read", move || {
            let mut bytes = Vec::new();
            open_regular(&p, false, "read")?
                .read_to_end(&mut bytes)
                .map_err(|e| EnvError::io(&e, "read", &p))?;
            Ok(bytes)
        })
        .await
    }

    async fn read_bytes_max(
        &self,
        path: &Path,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        let p = self.absolute(path);
        blocking(cancel, "read", move || {
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
                .open(&p)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ELOOP) => symlink_not_read(&p),
                    _ => EnvError::io(&e, "read", &p),
                })?;
            read_at_most(regular_file(file.into(), "read", &p)?, max_bytes, &p)
        })
        .await
    }

    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        let p = self.absolute(path);
        let data = data.to_vec();
        blocking(cancel, "write", move || {
            let dir = p.parent().unwrap_or(Path::new("/"));
            let name = p.file_name().ok_or_else(|| {
                EnvError::invalid(format!("write {}: not a file path", p.display()))
            })?;
            // Replacing a file keeps its permissions (an edited script stays executable).
            let kept = std::fs::metadata(&p)
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.permissions());
            replace_file(dir, name, &data, kept).map_err(|e| EnvError::io(&e, "write", &p))
        })
        .await
    }

    /// Each directory made once (`create_dir_all`), each file through `replace_file`
    /// with the tree's mode.
    async fn put_tree(&self, dir: &Path, tree: &Tree, cancel: &CancellationToken) -> EnvResult<()> {
        let base = self.absolute(dir);
        let tree = tree.clone();
        let stop = cancel.clone();
        blocking(cancel, "put_tree", move || {
            let mut made = HashSet::new();
            make_tree_dir(&base, &mut made)?;
            for entry in tree.entries() {
                if stop.is_cancelled() {
                    return Err(EnvError::aborted("put_tree"));
                }
                let p = base.join(&entry.path);
                let TreeKind::File { data, executable } = &entry.kind else {
                    make_tree_dir(&p, &mut made)?;
                    continue;
                };
                let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
                    return Err(EnvError::invalid(format!(
                        "put_tree {}: not a file path",
                        p.display()
                    )));
                };
                make_tree_dir(parent, &mut made)?;
                let mode = if *executable { 0o755 } else { 0o644 };
                replace_file(
                    parent,
                    name,
                    data,
                    Some(std::fs::Permissions::from_mode(mode)),
                )
                .map_err(|e| EnvError::io(&e, "put_tree", &p))?;
            }
            Ok(())
        })
        .await
    }

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        let p = self.absolute(path);
        let data = data.to_vec();
        blocking(cancel, "append", move || {
            let mut file = open_regular(&p, true, "append")?;
            file.write_all(&data)
                .map_err(|e| EnvError::io(&e, "append", &p))
        })
        .await
    }

    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()> {
        let (from, to) = (self.absolute(from), self.absolute(to));
        blocking(cancel, "rename", move || {
            std::fs::rename(&from, &to).map_err(|e| EnvError::io(&e, "rename", &from))
        })
        .await
    }

    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let p = self.absolute(path);
        blocking(cancel, "remove", move || {
            let meta = std::fs::symlink_metadata(&p).map_err(|e| EnvError::io(&e, "remove", &p))?;
            let result = if meta.is_dir() {
                if recursive {
                    crate::remove::remove_tree(&p)
                } else {
                    std::fs::remove_dir(&p)
                }
            } else {
                std::fs::remove_file(&p)
            };
            result.map_err(|e| EnvError::io(&e, "remove", &p))
        })
        .await
    }

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        let p = self.absolute(path);
        blocking(cancel, "create_dir", move || {
            let result = if recursive {
                std::fs::create_dir_all(&p)
            } else {
                std::fs::create_dir(&p)
            };
            result.map_err(|e| EnvError::io(&e, "create_dir", &p))
        })
        .await
    }

    async fn create_temp_dir(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        let p = self.temp_root.join(
            temp_name(prefix).map_err(|e| EnvError::io(&e, "create_temp_dir", &self.temp_root))?,
        );
        let made = p.clone();
        blocking(cancel, "create_temp_dir", move || {
            std::fs::create_dir_all(made.parent().unwrap_or(Path::new("/")))
                .and_then(|()| std::fs::create_dir(&made))
                .map_err(|e| EnvError::io(&e, "create_temp_dir", &made))
        })
        .await?;
        self.remember(&p);
        Ok(p)
    }

    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        let p = self.temp_root.join(
            temp_name(prefix).map_err(|e| EnvError::io(&e, "create_temp_file", &self.temp_root))?,
        );
        let made = p.clone();
        blocking(cancel, "create_temp_file", move || {
            std::fs::create_dir_all(made.parent().unwrap_or(Path::new("/")))
                .and_then(|()| std::fs::File::create_new(&made).map(drop))
                .map_err(|e| EnvError::io(&e, "create_temp_file", &made))
        })
        .await?;
        self.remember(&p);
        Ok(p)
    }

    async fn cleanup(&self) -> EnvResult<()> {
        self.shutdown.cancel();
        let groups: Vec<i32> = match self.running.lock() {
            Ok(running) => running.iter().copied().collect(),
            Err(_) => Vec::new(),
        };
        for group in groups {
            kill_group(group);
        }
        let temps = match self.temps.lock() {
            Ok(mut temps) => std::mem::take(&mut *temps),
            Err(_) => Vec::new(),
        };
        for temp in temps {
            let result = if temp.is_dir() {
                crate::remove::remove_tree(&temp)
            } else {
                std::fs::remove_file(&temp)
            };
            match result {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(EnvError::io(&e, "cleanup", &temp));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// How long the pipes may stay open after a timeout killed the process group: they hold
/// at most what was already written, unless a process left the group.
const DRAIN_AFTER_TIMEOUT: Duration = Duration::from_secs(1);

/// SIGKILL to a whole process group.
fn kill_group(group: i32) {
    // SAFETY: kill(2) takes no pointers; a negative pid names the group.
    unsafe { libc::kill(-group, libc::SIGKILL) };
}

/// The tasks that move bytes between an exec and its stream. A handle is taken out once
/// awaited: a finished `JoinHandle` must not be polled again.
struct Pipes {
    stdout: Option<JoinHandle<bool>>,
    stderr: Option<JoinHandle<bool>>,
    stdin: Option<JoinHandle<()>>,
}

impl Pipes {
    /// Waits for both output pumps to reach end of file; says which one truncated.
    async fn drained(&mut self) -> Truncated {
        let mut truncated = Truncated::default();
        if let Some(pump) = self.stdout.as_mut() {
            truncated.stdout = pump.await.unwrap_or(false);
            self.stdout = None;
        }
        if let Some(pump) = self.stderr.as_mut() {
            truncated.stderr = pump.await.unwrap_or(false);
            self.stderr = None;
        }
        truncated
    }

    /// Stops every task and waits until none can send another event.
    async fn stop(self) {
        for pump in [self.stdout, self.stderr].into_iter().flatten() {
            pump.abort();
            let _ = pump.await;
        }
        if let Some(stdin) = self.stdin {
            stdin.abort();
            let _ = stdin.await;
        }
    }
}

#[async_trait]
impl Shell for HostEnv {
    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        request.validate()?;
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("exec"));
        }
        if self.shutdown.is_cancelled() {
            return Err(EnvError::unavailable(
                "exec: this env was cleaned up; make a new one",
            ));
        }
        let argv = request.command.to_argv();
        let cwd = self.absolute(request.cwd.as_deref().unwrap_or(&self.cwd));
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .current_dir(&cwd)
            .envs(&request.env)
            .stdin(if request.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so cancel and timeout reach the children too.
            .process_group(0)
            .kill_on_drop(true);
        let started = Instant::now();
        let timeout = request.timeout.unwrap_or(self.limits.timeout());
        let deadline = tokio::time::Instant::now()
            .checked_add(timeout)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(u32::MAX.into()));
        let mut child = command.spawn().map_err(|e| {
            if cwd.is_dir() {
                EnvError::io(&e, "exec", &argv[0])
            } else {
                EnvError::io(&e, "exec: working directory", &cwd)
            }
        })?;
        let (Some(group), Some(out), Some(err)) = (
            child.id().and_then(|p| i32::try_from(p).ok()),
            child.stdout.take(),
            child.stderr.take(),
        ) else {
            return Err(EnvError::new(
                crate::ErrorCode::Unknown,
                "exec: the child has no pipes",
            ));
        };
        let (tx, stream) = ExecStream::channel();
        let cap = self.limits.output_bytes;
        let stdin = match (child.stdin.take(), request.stdin) {
            (Some(mut sink), Some(input)) => Some(tokio::spawn(async move {
                let _ = sink.write_all(&input).await;
            })),
            _ => None,
        };
        let mut pipes = Pipes {
            stdout: Some(tokio::spawn(pump_output(
                out,
                StreamKind::Stdout,
                cap,
                tx.clone(),
            ))),
            stderr: Some(tokio::spawn(pump_output(
                err,
                StreamKind::Stderr,
                cap,
                tx.clone(),
            ))),
            stdin,
        };
        if let Ok(mut running) = self.running.lock() {
            running.insert(group);
        }
        let running = Arc::clone(&self.running);
        let cancel = cancel.clone();
        let shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let stopped = async {
                tokio::select! {
                    () = cancel.cancelled() => {}
                    () = shutdown.cancelled() => {}
                }
            };
            tokio::pin!(stopped);
            let forget = || {
                if let Ok(mut running) = running.lock() {
                    running.remove(&group);
                }
            };
            let mut timed_out = false;
            let status = tokio::select! {
                status = child.wait() => status,
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = true;
                    kill_group(group);
                    child.wait().await
                }
                () = &mut stopped => {
                    kill_group(group);
                    let _ = child.wait().await;
                    forget();
                    pipes.stop().await;
                    let _ = tx.send(Err(EnvError::aborted("exec"))).await;
                    return;
                }
            };
            // The group may hold children that outlived the leader.
            kill_group(group);
            forget();
            // A process that left the group can hold the pipes open: the deadline and the
            // token still end the wait.
            let drain_until = if timed_out {
                tokio::time::Instant::now() + DRAIN_AFTER_TIMEOUT
            } else {
                deadline
            };
            let truncated = tokio::select! {
                truncated = pipes.drained() => truncated,
                () = tokio::time::sleep_until(drain_until) => {
                    timed_out = true;
                    Truncated::default()
                }
                () = &mut stopped => {
                    pipes.stop().await;
                    let _ = tx.send(Err(EnvError::aborted("exec"))).await;
                    return;
                }
            };
            pipes.stop().await;
            let output = match status {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    let ending = match (status.code(), status.signal()) {
                        (Some(code), _) => Ending::Exited(code),
                        (None, Some(signal)) => Ending::Signaled(signal),
                        (None, None) => Ending::Killed,
                    };
                    Ended {
                        ending,
                        timed_out,
                        truncated,
                        accounted: None,
                        duration: started.elapsed(),
                    }
                    .output()
                }
                Err(e) => {
                    let _ = tx.send(Err(EnvError::io(&e, "wait", "child"))).await;
                    return;
                }
            };
            let _ = tx.send(Ok(ExecEvent::Exit(output))).await;
        });
        Ok(stream)
    }
}

#[async_trait]
impl ExecutionEnv for HostEnv {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
}

/// Makes [`HostEnv`]s: `/workspace` is the spec's workspace, else the current
/// directory. **No boundary** (see the module docs); extra mounts cannot be honoured,
/// so a spec that names any is refused.
#[derive(Debug)]
pub struct HostBackend {
    temp_root: PathBuf,
}

impl HostBackend {
    /// Temp entries of its envs go under `temp_root`.
    pub fn new(temp_root: impl Into<PathBuf>) -> Self {
        HostBackend {
            temp_root: temp_root.into(),
        }
    }
}

#[async_trait]
impl Backend for HostBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    async fn probe(&self) -> BackendReport {
        BackendReport::new(BackendKind::Host, None)
    }

    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        if !spec.policy.read_only_mounts.is_empty() || !spec.policy.volumes.is_empty() {
            return Err(EnvError::unavailable(
                "backend host: mounts (volumes) need a sandbox; use another backend",
            ));
        }
        spec.policy.refuse_egress("host")?;
        let cwd = match spec.workspace {
            Some(dir) => dir,
            None => std::env::current_dir().map_err(|e| EnvError::io(&e, "cwd", "."))?,
        };
        Ok(Box::new(
            HostEnv::new(cwd, &self.temp_root).with_limits(spec.limits),
        ))
    }
}

/// Creates or replaces the file `name` in `dir`: written under a temp name (with
/// `permissions`, else the default for a new file) and renamed over it, so a reader sees
/// the old content or the new, and a symlink at the path is replaced, never followed.
fn replace_file(
    dir: &Path,
    name: &std::ffi::OsStr,
    data: &[u8],
    permissions: Option<std::fs::Permissions>,
) -> std::io::Result<()> {
    let tmp = dir.join(temp_name(&format!(".{}.", name.to_string_lossy()))?);
    let result = (|| {
        let mut file = std::fs::File::create_new(&tmp)?;
        file.write_all(data)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        std::fs::rename(&tmp, dir.join(name))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Makes the directory `p` of a tree with its parents, once per `put_tree` (`made`).
/// Something else already there is `not_directory`.
fn make_tree_dir(p: &Path, made: &mut HashSet<PathBuf>) -> EnvResult<()> {
    if made.contains(p) {
        return Ok(());
    }
    match std::fs::create_dir_all(p) {
        Ok(()) => {}
        // `create_dir_all` says "exists" only when the last component is not a directory.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let e = std::io::Error::from_raw_os_error(libc::ENOTDIR);
            return Err(EnvError::io(&e, "put_tree", p));
        }
        Err(e) => return Err(EnvError::io(&e, "put_tree", p)),
    }
    made.insert(p.to_path_buf());
    Ok(())
}

/// Opens `path` to read (or to append, creating it) without waiting on a FIFO, and
/// refuses anything but a regular file.
fn open_regular(path: &Path, append: bool, op: &str) -> EnvResult<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    if append {
        options.append(true).create(true);
    } else {
        options.read(true);
    }
    let file = options
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // Opening a FIFO with no reader for writing.
            Some(libc::ENXIO) => EnvError::new(
                crate::ErrorCode::Invalid,
                format!(
                    "{op} {}: a FIFO; only regular files are read or appended to",
                    path.display()
                ),
            )
            .with_path(path),
            _ => EnvError::io(&e, op, path),
        })?;
    regular_file(file.into(), op, path)
}
