//! [`WasmBackend`]: WASI guests run by wasmtime, one runner process per exec, inside a
//! native sandbox made for the wasm sandbox. Two boundaries, one inside the other: the
//! guest sees only its preopened workspace (no sockets, no other files, no processes),
//! and the runner around it has every native layer (namespaces, Landlock, seccomp,
//! cgroups, the disk bound). Files go through the native sandbox's file view, so the
//! workspace is the same one the guest writes.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use skillbox_env::{
    Backend, BackendKind, BackendReport, CancellationToken, Command, DirEntry, EnvError, EnvResult,
    ExecEvent, ExecOutput, ExecRequest, ExecStream, ExecutionEnv, FileInfo, FileRead, FileSystem,
    Layer, LimitKind, Mount, SandboxSpec, Shell, TextLines, Tree, WalkEntry,
};
use tokio::sync::Mutex;

use crate::engine;
use crate::guests::{Guest, Guests};
use crate::runner::{DEADLINE_SIGNAL, MEMORY_SIGNAL, ModuleSource, Preopen, RunnerSpec};

/// Where the runner, the guests and the compile cache appear inside the sandbox.
const BIN: &str = "/skillbox-wasm/bin";
const GUESTS: &str = "/skillbox-wasm/guests";
const CACHE: &str = crate::runner::SANDBOX_CACHE;
const ROOT: &str = "/skillbox-wasm";
/// Memory the runner itself needs beside the guest's linear memory (wasmtime, the WASI
/// host, the compiled code's pages); the native sandbox's bound is the guest's plus this.
const RUNTIME_MEMORY: u64 = 128 * 1024 * 1024;
/// Threads the runner starts (the epoch ticker, WASI's I/O runtime, compile workers).
const RUNTIME_PIDS: u32 = 16;
/// How long past the guest's deadline the native sandbox waits before killing the
/// runner (the deadline itself is the epoch's).
const DEADLINE_GRACE: Duration = Duration::from_secs(2);

/// What the wasm backend is made with.
#[derive(Debug, Clone)]
pub struct WasmConfig {
    /// The guests, the compile cache and the runner's copy: `guests/`, `cache/`,
    /// `runner/`. `skillbox setup` fills `guests/`.
    pub home: PathBuf,
    /// The program that runs `__wasm-guest` (the skillbox binary); `None` when this
    /// process cannot start guests.
    pub runner: Option<PathBuf>,
}

impl WasmConfig {
    /// The guests dir.
    pub fn guests_dir(&self) -> PathBuf {
        self.home.join("guests")
    }

    fn cache_dir(&self) -> PathBuf {
        self.home.join("cache")
    }
}

#[derive(Debug)]
struct Shared {
    config: WasmConfig,
    engine: std::sync::OnceLock<wasmtime::Engine>,
    /// One compile of a guest at a time.
    compiling: Mutex<()>,
}

impl Shared {
    fn engine(&self) -> EnvResult<&wasmtime::Engine> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let engine = engine::engine()?;
        Ok(self.engine.get_or_init(|| engine))
    }

    /// The compiled guest's file name in the cache, compiling it first if needed.
    async fn compiled(&self, guest: &Guest, cancel: &CancellationToken) -> EnvResult<String> {
        let engine = self.engine()?.clone();
        let sha = guest.module_sha256().unwrap_or_default().to_string();
        let cache = self.config.cache_dir();
        let path = engine::cached_path(&cache, &sha, &engine);
        if !path.is_file() {
            let _one = self.compiling.lock().await;
            let module = self.config.guests_dir().join(&guest.module);
            skillbox_env::blocking(cancel, "wasm: compile a guest", move || {
                engine::ensure_compiled(&engine, &cache, &module, &sha)
            })
            .await?;
        }
        path.file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| EnvError::invalid("wasm: the compile cache path has no name"))
    }
}

/// Makes wasm sandboxes.
#[derive(Debug, Clone)]
pub struct WasmBackend {
    shared: Arc<Shared>,
    /// The backend whose sandbox the runner runs in (the registry gives native).
    native: Arc<dyn Backend>,
}

impl WasmBackend {
    /// Wasm sandboxes whose runner runs in sandboxes of `outer` (native: a WASI guest
    /// never runs with less around it than a native sandbox).
    pub fn new(config: WasmConfig, outer: Arc<dyn Backend>) -> Self {
        WasmBackend {
            native: outer,
            shared: Arc::new(Shared {
                config,
                engine: std::sync::OnceLock::new(),
                compiling: Mutex::new(()),
            }),
        }
    }

    /// The installed guests.
    pub fn guests(&self) -> EnvResult<Guests> {
        Guests::load(&self.shared.config.guests_dir())
    }

    /// Compiles every installed guest that is not in the cache yet (`skillbox setup`),
    /// returning each guest's name and whether it was compiled now.
    pub async fn precompile(&self) -> EnvResult<Vec<(String, bool)>> {
        let guests = self.guests()?;
        let cancel = CancellationToken::new();
        let mut done = Vec::new();
        for guest in &guests.guests {
            let engine = self.shared.engine()?;
            let sha = guest.module_sha256().unwrap_or_default();
            let fresh =
                !engine::cached_path(&self.shared.config.cache_dir(), sha, engine).is_file();
            self.shared.compiled(guest, &cancel).await?;
            done.push((guest.name.clone(), fresh));
        }
        Ok(done)
    }

    fn runner(&self) -> EnvResult<PathBuf> {
        let config = &self.shared.config;
        let runner = config.runner.as_ref().ok_or_else(|| {
            EnvError::unavailable(
                "backend wasm: this program cannot start wasm guests (only the skillbox binary can)",
            )
        })?;
        // Code compiled or placed here runs in every wasm sandbox: the home must be ours
        // alone, as the data dir is.
        skillbox_env::own_data_dir(&config.home).map_err(|e| {
            EnvError::new(
                e.code,
                format!(
                    "backend wasm: its home {}: {}",
                    config.home.display(),
                    e.message
                ),
            )
        })?;
        runner_dir(runner, &config.home.join("runner"))
    }
}

/// A directory holding the runner as `skillbox`, to show read-only in the sandbox: a
/// hard link (or, across file systems, a copy) under `runners`, named after the
/// executable's identity so a rebuilt binary gets a new one. For this program it is made
/// from the executable it started from, never looked up by path again.
fn runner_dir(runner: &Path, runners: &Path) -> EnvResult<PathBuf> {
    use std::hash::{Hash, Hasher};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};

    let opened;
    let source = match crate::runner::held_executable(runner) {
        Some(file) => file,
        None => {
            opened = std::fs::File::open(runner).map_err(|e| EnvError::io(&e, "open", runner))?;
            &opened
        }
    };
    let meta = source
        .metadata()
        .map_err(|e| EnvError::io(&e, "stat", runner))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
    )
        .hash(&mut hasher);
    let dir = runners.join(format!("{:016x}", hasher.finish()));
    let target = dir.join("skillbox");
    if target.is_file() {
        return Ok(dir);
    }
    prune_runners(runners);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(runners)
        .map_err(|e| EnvError::io(&e, "create", runners))?;
    let temp = runners.join(format!(".{}", crate::nonce()));
    // Shown read-only to the sandbox's user: 0755 whatever the umask.
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&temp)
        .and_then(|()| skillbox_env::readable_by_sandboxes(&temp))
        .map_err(|e| EnvError::io(&e, "create", &temp))?;
    let staged = temp.join("skillbox");
    let placed = link_fd(source.as_raw_fd(), &staged).or_else(|_| {
        let mut from = source.try_clone()?;
        use std::io::Seek;
        from.seek(std::io::SeekFrom::Start(0))?;
        let mut to = std::fs::File::create(&staged)?;
        std::io::copy(&mut from, &mut to)?;
        to.sync_all()?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o755))
    });
    if let Err(e) = placed {
        let _ = std::fs::remove_dir_all(&temp);
        return Err(EnvError::io(&e, "place the wasm runner in", runners));
    }
    match std::fs::rename(&temp, &dir) {
        Ok(()) => Ok(dir),
        // Another process placed it first.
        Err(_) if target.is_file() => {
            let _ = std::fs::remove_dir_all(&temp);
            Ok(dir)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&temp);
            Err(EnvError::io(&e, "rename", &dir))
        }
    }
}

/// Removes the runner links of builds that are gone: a link whose binary has no other
/// name left (the build was replaced or removed) and that is over ten minutes old. A
/// process still running such a build makes its link again from its own executable.
fn prune_runners(runners: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(runners) else {
        return;
    };
    let old = std::time::SystemTime::now() - Duration::from_secs(600);
    for entry in entries.flatten() {
        let dir = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(dir.join("skillbox")) else {
            continue;
        };
        let stale = meta.nlink() == 1 && meta.modified().is_ok_and(|m| m < old);
        if stale && entry.file_name().to_string_lossy().len() == 16 {
            let _ = skillbox_env::remove::remove_tree(&dir);
        }
    }
}

/// A hard link at `to` of the file open as `fd` (through its `/proc/self/fd` link).
fn link_fd(fd: i32, to: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let from = std::ffi::CString::new(format!("/proc/self/fd/{fd}"))?;
    let to = std::ffi::CString::new(to.as_os_str().as_bytes())?;
    // SAFETY: two NUL-terminated paths that outlive the call.
    let done = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[async_trait]
impl Backend for WasmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }

    async fn probe(&self) -> BackendReport {
        let native = self.native.probe().await;
        let mut reason = None;
        let mut layers = std::collections::BTreeMap::new();
        let engine = self.shared.engine();
        layers.insert(
            "wasmtime".to_string(),
            Layer::new(
                engine.is_ok(),
                "wasmtime 48: WASI preview 1, the workspace the only preopened directory, no sockets; an epoch deadline; a store limiter on linear memory",
            ),
        );
        if let Err(e) = &engine {
            reason = Some(e.to_string());
        }
        let guests = self.guests();
        let detail = match &guests {
            Ok(g) if g.guests.is_empty() => format!(
                "none installed in {} (run `skillbox setup`); .wasm and .wat files still run",
                g.dir.display()
            ),
            Ok(g) => g
                .guests
                .iter()
                .map(|guest| {
                    format!(
                        "{} {} ({})",
                        guest.name,
                        guest.version,
                        guest.commands.join(", ")
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
            Err(e) => e.to_string(),
        };
        layers.insert(
            "guests".to_string(),
            Layer::new(guests.as_ref().is_ok_and(|g| !g.guests.is_empty()), detail),
        );
        if let Err(e) = self.runner() {
            reason.get_or_insert(e.to_string());
        }
        layers.insert(
            "native sandbox".to_string(),
            Layer::new(
                native.available,
                "the runner runs inside a native sandbox with every native layer",
            ),
        );
        for (name, layer) in native.layers {
            layers.insert(format!("native: {name}"), layer);
        }
        if !native.available {
            reason.get_or_insert(format!(
                "wasm guests run inside the native sandbox, which is unavailable: {}",
                native.reason.unwrap_or_default()
            ));
        }
        BackendReport {
            layers,
            ..BackendReport::new(BackendKind::Wasm, reason)
        }
    }

    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        spec.policy.refuse_egress("wasm")?;
        let runner = self.runner()?;
        let config = &self.shared.config;
        let guests = self.guests()?;
        // Both are shown read-only to the sandbox's user: 0755 whatever the umask.
        let cache = config.cache_dir();
        std::fs::create_dir_all(&cache)
            .and_then(|()| skillbox_env::readable_by_sandboxes(&cache))
            .map_err(|e| EnvError::io(&e, "create", &cache))?;
        let guests_dir = config.guests_dir();
        std::fs::create_dir_all(&guests_dir)
            .and_then(|()| skillbox_env::readable_by_sandboxes(&guests_dir))
            .map_err(|e| EnvError::io(&e, "create", &guests_dir))?;

        let limits = spec.limits.clone();
        // The caller's read-only mounts (a capability's dir) and volumes are preopened
        // for the guest at the same paths, writable only for a read-write volume (the
        // native sandbox the runner runs in shows them as it shows any).
        let read_only: Vec<PathBuf> = spec
            .policy
            .read_only_mounts
            .iter()
            .map(|m| skillbox_env::path::normalize(&m.sandbox))
            .chain(
                spec.policy
                    .volumes
                    .iter()
                    .filter(|v| !v.rw)
                    .map(|v| skillbox_env::path::normalize(&v.sandbox)),
            )
            .collect();
        let read_write: Vec<PathBuf> = spec
            .policy
            .volumes
            .iter()
            .filter(|v| v.rw)
            .map(|v| skillbox_env::path::normalize(&v.sandbox))
            .collect();
        if let Some(taken) = read_only
            .iter()
            .chain(&read_write)
            .find(|p| p.starts_with(ROOT) || Path::new(ROOT).starts_with(p))
        {
            return Err(EnvError::invalid(format!(
                "policy: {} shares its place with {ROOT}, where the wasm backend shows its runner and guests",
                taken.display()
            )));
        }
        if !spec.policy.listen_ports.is_empty() {
            return Err(EnvError::invalid(
                "policy.listenPorts: a WASI guest has no sockets to listen on",
            ));
        }
        let workspace = spec.root.as_path().to_path_buf();
        let mut native = spec;
        for (host, sandbox) in [(runner, BIN), (guests_dir, GUESTS), (cache, CACHE)] {
            native.policy.read_only_mounts.push(Mount {
                host,
                sandbox: PathBuf::from(sandbox),
            });
        }
        native.limits.memory_bytes = native.limits.memory_bytes.map(|m| m + RUNTIME_MEMORY);
        native.limits.pids = native.limits.pids.map(|p| p + RUNTIME_PIDS);
        let inner: Arc<dyn ExecutionEnv> = Arc::from(self.native.create(native).await?);
        Ok(Box::new(WasmSandbox {
            inner,
            shared: self.shared.clone(),
            guests: Arc::new(guests),
            limits,
            workspace,
            read_only,
            read_write,
        }))
    }
}

/// One wasm sandbox: a native sandbox whose execs are WASI guests.
pub struct WasmSandbox {
    inner: Arc<dyn ExecutionEnv>,
    shared: Arc<Shared>,
    guests: Arc<Guests>,
    limits: skillbox_env::Limits,
    /// Where the workspace is (the spec's root), preopened read-write at its own path.
    workspace: PathBuf,
    /// Preopened read-only at their own paths.
    read_only: Vec<PathBuf>,
    /// Read-write volumes, preopened writable at their paths.
    read_write: Vec<PathBuf>,
}

impl std::fmt::Debug for WasmSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmSandbox")
            .field("cwd", &self.inner.cwd())
            .field("guests", &self.guests.commands())
            .finish_non_exhaustive()
    }
}

impl WasmSandbox {
    /// The runner spec and guest argv for `argv`, or the message of a command that is
    /// not there (exit 127).
    async fn plan(
        &self,
        argv: &[String],
        cwd: &Path,
        caller_env: &std::collections::BTreeMap<String, String>,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> EnvResult<Result<RunnerSpec, String>> {
        let program = &argv[0];
        let mut dirs = vec![Preopen {
            dir: self.workspace.clone(),
            guest: self.workspace.display().to_string(),
            writable: true,
        }];
        // Relative paths resolve against the working directory when it is inside the
        // workspace (WASI has no cwd of its own).
        if cwd.starts_with(&self.workspace) {
            dirs.push(Preopen {
                dir: cwd.to_path_buf(),
                guest: ".".into(),
                writable: true,
            });
        }
        for (dir, writable) in self
            .read_only
            .iter()
            .map(|d| (d, false))
            .chain(self.read_write.iter().map(|d| (d, true)))
        {
            dirs.push(Preopen {
                dir: dir.clone(),
                guest: dir.display().to_string(),
                writable,
            });
        }
        // The guest's environment: a home and a temp dir it can reach (the workspace's
        // scratch dir, never collected), the guest's own, then the caller's.
        let mut env: std::collections::BTreeMap<String, String> = [
            ("HOME", self.workspace.display().to_string()),
            ("TMPDIR", self.workspace.join(".tmp").display().to_string()),
            ("LANG", "C.UTF-8".to_string()),
            ("PWD", cwd.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let module = if let Some(guest) = self.guests.for_command(program) {
            let file = self.shared.compiled(guest, cancel).await?;
            for dir in &guest.dirs {
                dirs.push(Preopen {
                    dir: Path::new(GUESTS).join(&dir.host),
                    guest: dir.guest.clone(),
                    writable: false,
                });
            }
            env.extend(guest.env.clone());
            ModuleSource::Compiled(Path::new(CACHE).join(file))
        } else if program.ends_with(".wasm") || program.ends_with(".wat") {
            ModuleSource::Source(skillbox_env::path::normalize(&cwd.join(program)))
        } else {
            let installed = self.guests.commands();
            return Ok(Err(format!(
                "skillbox wasm: {program}: no such guest (installed: {}); run `skillbox setup` to install python3 and node, or run a .wasm or .wat file\n",
                if installed.is_empty() {
                    "none".to_string()
                } else {
                    installed.join(", ")
                }
            )));
        };
        env.extend(caller_env.clone());
        Ok(Ok(RunnerSpec {
            module,
            dirs,
            env: env.into_iter().collect(),
            memory_bytes: self.limits.memory_bytes,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        }))
    }
}

/// A stream that prints `message` and exits 127, as a shell does for a missing program.
fn not_found(message: String) -> ExecStream {
    let (tx, stream) = ExecStream::channel();
    tokio::spawn(async move {
        let _ = tx.send(Ok(ExecEvent::Stderr(Bytes::from(message)))).await;
        let _ = tx
            .send(Ok(ExecEvent::Exit(ExecOutput {
                exit_code: Some(127),
                ..ExecOutput::default()
            })))
            .await;
    });
    stream
}

/// Reads the runner's own signals: the deadline passed (a timeout, reported as every
/// backend reports one), or the memory bound refused the guest (`limitHit: memory`,
/// as an OOM kill is reported).
fn patch(mut output: ExecOutput) -> ExecOutput {
    match output.signal {
        Some(DEADLINE_SIGNAL) => {
            output.timed_out = true;
            output.signal = Some(libc::SIGKILL);
        }
        Some(MEMORY_SIGNAL) => {
            output.signal = Some(libc::SIGKILL);
            output.limit_hit.get_or_insert(LimitKind::Memory);
        }
        _ => {}
    }
    output
}

#[async_trait]
impl Shell for WasmSandbox {
    async fn prepare_next(&self) {
        self.inner.prepare_next().await;
    }

    async fn exec_stream(
        &self,
        request: ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<ExecStream> {
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("exec"));
        }
        request.validate()?;
        let argv = match &request.command {
            Command::Argv(argv) => argv.clone(),
            Command::Shell(_) => {
                return Err(EnvError::invalid(
                    "command: the wasm backend has no shell; pass an argv (python3 -c …, node x.js, or a .wasm file)",
                ));
            }
        };
        let cwd = skillbox_env::path::normalize(&request.cwd.as_ref().map_or_else(
            || self.inner.cwd().to_path_buf(),
            |c| self.inner.absolute(c),
        ));
        // The working directory becomes the guest's `.`, read-write: it must be a
        // directory of the workspace as the sandbox resolves it, not a link elsewhere.
        let resolved = self.inner.canonical(&cwd, cancel).await?;
        if !resolved.starts_with(&self.workspace) {
            return Err(EnvError::invalid(format!(
                "cwd: {} resolves to {}, outside {}; a wasm guest runs in the workspace",
                cwd.display(),
                resolved.display(),
                self.workspace.display()
            )));
        }
        // The guest's TMPDIR (the workspace's scratch dir, as native's temp entries use).
        self.inner
            .create_dir(&self.workspace.join(".tmp"), true, cancel)
            .await?;
        let timeout = request.timeout.unwrap_or_else(|| self.limits.timeout());
        let spec = match self
            .plan(&argv, &resolved, &request.env, timeout, cancel)
            .await?
        {
            Ok(spec) => spec,
            Err(message) => return Ok(not_found(message)),
        };
        // The spec (the guest's environment among it: a capability's `env`, a token)
        // goes first on the runner's stdin, never on its command line, which any user
        // of the host reads in `/proc/<pid>/cmdline`; the guest reads the rest.
        let stdin = crate::runner::framed_stdin(&spec, request.stdin.as_deref())
            .map_err(|e| EnvError::invalid(format!("wasm: runner spec: {e}")))?;
        let mut runner_argv = vec![
            format!("{BIN}/skillbox"),
            crate::runner::SUBCOMMAND.to_string(),
            "--".to_string(),
        ];
        runner_argv.extend(argv);
        // The runner gets none of the caller's environment (it goes to the guest, in
        // the spec): nothing like LD_PRELOAD or WASMTIME_* may reach the runner itself.
        // Its thread pools stay small whatever the host's core count.
        let mut inner_request = ExecRequest::argv(runner_argv)
            .timeout(timeout + DEADLINE_GRACE)
            .cwd(&self.workspace)
            .env("TOKIO_WORKER_THREADS", "2")
            .env("RAYON_NUM_THREADS", "2");
        inner_request.stdin = Some(stdin);
        let mut events = self.inner.exec_stream(inner_request, cancel).await?;

        let (tx, stream) = ExecStream::channel();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(ExecEvent::Exit(output)) => Ok(ExecEvent::Exit(patch(output))),
                    other => other,
                };
                let _ = tx.send(event).await;
            }
        });
        Ok(stream)
    }
}

#[async_trait]
impl FileSystem for WasmSandbox {
    fn cwd(&self) -> &Path {
        self.inner.cwd()
    }

    async fn canonical(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<PathBuf> {
        self.inner.canonical(path, cancel).await
    }

    async fn exists(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<bool> {
        self.inner.exists(path, cancel).await
    }

    async fn file_info(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<FileInfo> {
        self.inner.file_info(path, cancel).await
    }

    async fn list_dir(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<DirEntry>> {
        self.inner.list_dir(path, cancel).await
    }

    async fn read_text(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<String> {
        self.inner.read_text(path, cancel).await
    }

    async fn read_text_lines(
        &self,
        path: &Path,
        max: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<TextLines> {
        self.inner.read_text_lines(path, max, cancel).await
    }

    async fn read_bytes(&self, path: &Path, cancel: &CancellationToken) -> EnvResult<Vec<u8>> {
        self.inner.read_bytes(path, cancel).await
    }

    async fn read_bytes_max(
        &self,
        path: &Path,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<u8>> {
        self.inner.read_bytes_max(path, max_bytes, cancel).await
    }

    async fn write(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.inner.write(path, data, cancel).await
    }

    async fn append(&self, path: &Path, data: &[u8], cancel: &CancellationToken) -> EnvResult<()> {
        self.inner.append(path, data, cancel).await
    }

    async fn rename(&self, from: &Path, to: &Path, cancel: &CancellationToken) -> EnvResult<()> {
        self.inner.rename(from, to, cancel).await
    }

    async fn remove(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        self.inner.remove(path, recursive, cancel).await
    }

    async fn create_dir(
        &self,
        path: &Path,
        recursive: bool,
        cancel: &CancellationToken,
    ) -> EnvResult<()> {
        self.inner.create_dir(path, recursive, cancel).await
    }

    async fn create_temp_dir(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        self.inner.create_temp_dir(prefix, cancel).await
    }

    async fn create_temp_file(
        &self,
        prefix: &str,
        cancel: &CancellationToken,
    ) -> EnvResult<PathBuf> {
        self.inner.create_temp_file(prefix, cancel).await
    }

    async fn cleanup(&self) -> EnvResult<()> {
        self.inner.cleanup().await
    }

    async fn walk(
        &self,
        root: &Path,
        prune: &[&str],
        max_entries: usize,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<WalkEntry>> {
        self.inner.walk(root, prune, max_entries, cancel).await
    }

    async fn read_files(
        &self,
        paths: &[PathBuf],
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> EnvResult<Vec<FileRead>> {
        self.inner.read_files(paths, max_bytes, cancel).await
    }

    async fn put_tree(&self, dir: &Path, tree: &Tree, cancel: &CancellationToken) -> EnvResult<()> {
        self.inner.put_tree(dir, tree, cancel).await
    }
}

#[async_trait]
impl ExecutionEnv for WasmSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Wasm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_signals_say_deadline_and_memory() {
        let ended = |signal, exit_code| ExecOutput {
            signal,
            exit_code,
            ..ExecOutput::default()
        };
        let late = patch(ended(Some(DEADLINE_SIGNAL), None));
        assert!(late.timed_out);
        assert_eq!((late.signal, late.limit_hit), (Some(libc::SIGKILL), None));
        let refused = patch(ended(Some(MEMORY_SIGNAL), None));
        assert!(!refused.timed_out);
        assert_eq!(
            (refused.signal, refused.limit_hit),
            (Some(libc::SIGKILL), Some(LimitKind::Memory))
        );
        assert_eq!(patch(ended(None, Some(3))), ended(None, Some(3)));
        assert_eq!(
            patch(ended(Some(libc::SIGTERM), None)),
            ended(Some(libc::SIGTERM), None)
        );
    }
}
