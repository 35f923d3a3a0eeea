//! One sandbox = one container: handed out started and hardened, driven by execs
//! (`exec.rs`) and file operations (`files.rs`), removed by `cleanup` or on drop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, EnvResult, ExecutionEnv, FileRead, FileSystem,
    WorkspaceRoot,
};
use tokio::sync::OwnedMutexGuard;

use crate::container::Container;

/// What a sandbox's cleanup does after removing its container.
pub(crate) struct AfterCleanup(pub(crate) Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for AfterCleanup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AfterCleanup")
    }
}

/// A docker (or gvisor) sandbox: one running container.
#[derive(Debug)]
pub struct DockerSandbox {
    container: Arc<Container>,
    /// Where the workspace is (the spec's root): the default working directory.
    cwd: PathBuf,
    /// Counts every exec and helper run begun: what a walk read ahead is good only
    /// while nothing else has begun since.
    generation: AtomicU64,
    read_ahead: Mutex<Option<ReadAhead>>,
    /// The last exec ([`skillbox_env::ExecRequest::last`]) left what it started to
    /// cleanup: another exec first kills it (nothing of the sandbox may run while an
    /// exec's wrapper reads its key).
    pub(crate) unsettled: std::sync::atomic::AtomicBool,
    /// The walk an exec made after its command (`walk_after`), for the walk that follows.
    pub(crate) walk_ahead: Arc<Mutex<Option<WalkAhead>>>,
    /// Called once the container is removed by cleanup, or after a drop (the pool
    /// refills its place).
    pub(crate) after_cleanup: Mutex<Option<AfterCleanup>>,
    /// The egress proxy listening in the container's network namespace (a network
    /// policy on docker); `None`: no network.
    pub(crate) egress: Option<skillbox_egress::SandboxEgress>,
}

/// The output of the file helper's `walkread` that an exec made after its command, good
/// for that walk while nothing else has begun since the exec.
#[derive(Debug)]
pub(crate) struct WalkAhead {
    /// The exec's generation.
    pub(crate) generation: u64,
    pub(crate) walk: skillbox_env::WalkAfter,
    pub(crate) out: Vec<u8>,
}

/// The contents a `walk` read along with its listing (a small tree), for the
/// `read_files` that follows it to answer without another helper run: a run's
/// collection then costs one exec, not two.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    /// The generation it is good for.
    pub(crate) generation: u64,
    /// Each file's answer, by the path as the helpers take it ([`DockerSandbox::arg`]).
    pub(crate) files: HashMap<String, FileRead>,
}

impl DockerSandbox {
    pub(crate) fn new(container: Arc<Container>, root: &WorkspaceRoot) -> DockerSandbox {
        DockerSandbox {
            container,
            cwd: root.as_path().to_path_buf(),
            generation: AtomicU64::new(0),
            read_ahead: Mutex::new(None),
            unsettled: std::sync::atomic::AtomicBool::new(false),
            walk_ahead: Arc::new(Mutex::new(None)),
            after_cleanup: Mutex::new(None),
            egress: None,
        }
    }

    /// The exec's environment: the proxy's variables and the egress's own (secrets'
    /// placeholders, the CA's paths) when the sandbox has egress, then the request's
    /// own (which win).
    pub(crate) fn exec_env(
        &self,
        asked: &std::collections::BTreeMap<String, String>,
    ) -> std::collections::BTreeMap<String, String> {
        let mut env = std::collections::BTreeMap::new();
        if let Some(egress) = &self.egress {
            env.extend(
                skillbox_egress::netns::proxy_env()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
            env.extend(egress.env.iter().cloned());
        }
        env.extend(asked.iter().map(|(k, v)| (k.clone(), v.clone())));
        env
    }

    /// Something begins that may change the files (an exec, a helper run): what was
    /// read ahead is dropped.
    pub(crate) fn begin(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut ahead) = self.read_ahead.lock() {
            *ahead = None;
        }
    }

    /// What an exec's walk printed, if it made exactly this walk (root absolute) and
    /// nothing else began since; given up either way.
    pub(crate) fn take_walk_ahead(
        &self,
        root: &Path,
        prune: &[&str],
        max_entries: usize,
    ) -> Option<Vec<u8>> {
        let ahead = self.walk_ahead.lock().ok()?.take()?;
        let same = ahead.generation == self.generation()
            && ahead.walk.root == root
            && ahead.walk.max_entries == max_entries
            && ahead
                .walk
                .prune
                .iter()
                .map(String::as_str)
                .eq(prune.iter().copied());
        same.then_some(ahead.out)
    }

    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Keeps what a walk read, if nothing else began since it (its own helper run is
    /// generation `generation`).
    pub(crate) fn keep_read_ahead(&self, generation: u64, files: HashMap<String, FileRead>) {
        if let Ok(mut ahead) = self.read_ahead.lock()
            && self.generation() == generation
        {
            *ahead = Some(ReadAhead { generation, files });
        }
    }

    /// The answers for all of `paths` (as the helpers take them) from what was read
    /// ahead, each a content of at most `max_bytes`, a missing file or not a file; or
    /// `None` (then read them). Those answered are given up.
    pub(crate) fn take_read_ahead(
        &self,
        paths: &[String],
        max_bytes: u64,
    ) -> Option<Vec<FileRead>> {
        let mut guard = self.read_ahead.lock().ok()?;
        let ahead = guard.as_mut()?;
        if ahead.generation != self.generation() {
            *guard = None;
            return None;
        }
        let servable = paths.iter().all(|p| match ahead.files.get(p) {
            Some(FileRead::Content(data)) => data.len() as u64 <= max_bytes,
            Some(FileRead::Missing | FileRead::NotFile) => true,
            Some(FileRead::TooLarge(_)) | None => false,
        });
        if !servable {
            return None;
        }
        paths
            .iter()
            .map(|p| ahead.files.remove(p))
            .collect::<Option<Vec<_>>>()
    }

    /// The container's id.
    pub fn container_id(&self) -> &str {
        &self.container.id
    }

    pub(crate) fn container(&self) -> &Arc<Container> {
        &self.container
    }

    pub(crate) fn default_cwd(&self) -> &Path {
        &self.cwd
    }

    pub(crate) fn backend_name(&self) -> BackendKind {
        self.container.runtime.backend()
    }

    /// `path` as the helpers inside take it: absolute, against the sandbox's cwd.
    pub(crate) fn arg(&self, path: &Path) -> String {
        self.absolute(path).display().to_string()
    }

    /// Waits for this sandbox's turn to exec (one at a time), unless cancelled first.
    pub(crate) async fn take_turn(
        &self,
        cancel: &CancellationToken,
    ) -> EnvResult<OwnedMutexGuard<()>> {
        let container = &self.container;
        if container.is_removed() {
            return Err(container.gone());
        }
        if cancel.is_cancelled() {
            return Err(EnvError::aborted("exec"));
        }
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(EnvError::aborted("waiting for the sandbox")),
            () = container.shutdown.cancelled() => Err(EnvError::aborted("the sandbox was cleaned up")),
            guard = container.turn.clone().lock_owned() => {
                self.begin();
                Ok(guard)
            }
        }
    }
}

#[async_trait]
impl ExecutionEnv for DockerSandbox {
    fn kind(&self) -> BackendKind {
        self.container.runtime.backend()
    }

    fn egress(&self) -> Vec<skillbox_egress::Connection> {
        self.egress
            .as_ref()
            .map(|e| e.proxy.audit().connections())
            .unwrap_or_default()
    }

    /// The exec wrapper writes the files before it starts the command: one exec.
    async fn write_and_exec(
        &self,
        files: Vec<(PathBuf, Vec<u8>)>,
        request: skillbox_env::ExecRequest,
        cancel: &CancellationToken,
    ) -> EnvResult<skillbox_env::ExecOutput> {
        let inputs = files
            .into_iter()
            .map(|(path, data)| (self.arg(&path), data))
            .collect();
        self.exec_with_inputs(inputs, request, cancel)
            .await?
            .collect()
            .await
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        // Not taken by a cleanup: the pool's place is refilled once the container is
        // gone, as after a cleanup (a pool refills on a runtime: within one only).
        let after = self.after_cleanup.get_mut().ok().and_then(Option::take);
        let removed = self.container.is_removed();
        if removed && after.is_none() {
            return;
        }
        // Dropped without cleanup (a cancelled caller): the container goes anyway.
        self.container.shutdown.cancel();
        let container = self.container.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move {
                    container.remove().await;
                    if let Some(after) = after {
                        (after.0)();
                    }
                });
            }
            Err(_) if removed => {}
            Err(_) => {
                std::thread::spawn(move || {
                    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        rt.block_on(container.remove());
                    }
                });
            }
        }
    }
}
