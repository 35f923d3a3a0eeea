//! One sandbox = one container: handed out started and hardened, driven by execs
//! (`exec.rs`) and file operations (`files.rs`), removed by `cleanup` or on drop.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use skillbox_env::{BackendKind, CancellationToken, EnvError, EnvResult, ExecutionEnv, FileSystem};
use tokio::sync::OwnedMutexGuard;

use crate::config::WORKSPACE;
use crate::container::Container;

/// A docker (or gvisor) sandbox: one running container.
#[derive(Debug)]
pub struct DockerSandbox {
    container: Arc<Container>,
    cwd: PathBuf,
}

impl DockerSandbox {
    pub(crate) fn new(container: Arc<Container>) -> DockerSandbox {
        DockerSandbox {
            container,
            cwd: PathBuf::from(WORKSPACE),
        }
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
            guard = container.turn.clone().lock_owned() => Ok(guard),
        }
    }
}

#[async_trait]
impl ExecutionEnv for DockerSandbox {
    fn kind(&self) -> BackendKind {
        self.container.runtime.backend()
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        if self.container.is_removed() {
            return;
        }
        // Dropped without cleanup (a cancelled caller): the container goes anyway.
        self.container.shutdown.cancel();
        let container = self.container.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn(async move { container.remove().await });
            }
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
