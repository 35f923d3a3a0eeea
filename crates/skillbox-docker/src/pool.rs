//! Starting sandbox containers, and the pool of started ones a backend keeps ready: a
//! [`Warm`] container runs skillbox's init and nothing else until it is handed out,
//! once, as a sandbox.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptions, StartContainerOptions};
use skillbox_env::{EnvResult, Limits, WorkspaceRoot};
use tokio_util::task::TaskTracker;

use crate::container::Container;
use crate::daemon::{Live, image_missing, is_running, op_error, remove_container, unavailable};
use crate::reset::init_pid;
use crate::runtime::Runtime;
use crate::sandbox::DockerSandbox;

/// How long the pool waits after a failed refill before it tries again.
const REFILL_BACKOFF: Duration = Duration::from_secs(5);
/// How long shutdown waits for refills in flight.
const REFILL_WAIT: Duration = Duration::from_secs(60);

/// Starts sandbox containers: the daemon, the runtime and image a backend uses, and the
/// set of containers it made.
#[derive(Debug, Clone)]
pub(crate) struct Launcher {
    pub(crate) docker: Docker,
    pub(crate) runtime: Runtime,
    pub(crate) image: String,
    pub(crate) live: Live,
}

impl Launcher {
    /// Creates and starts a container from `config` (see `container_config`).
    pub(crate) async fn start(&self, config: ContainerCreateBody) -> EnvResult<Warm> {
        let (docker, runtime, live) = (self.docker.clone(), self.runtime, self.live.clone());
        let backend = runtime.backend();
        let created = docker
            .create_container(None::<CreateContainerOptions>, config)
            .await
            .map_err(|e| match &e {
                bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                } => image_missing(backend, &self.image),
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
                return Err(e);
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
}

/// A started container with skillbox's init running and nothing else: a sandbox not
/// handed out yet. Dropped, it removes its container.
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
    pub(crate) fn into_sandbox(mut self, limits: Limits, root: &WorkspaceRoot) -> DockerSandbox {
        let container = Container::started(
            self.docker.clone(),
            self.id.clone(),
            self.runtime,
            limits,
            std::mem::take(&mut self.init_pid),
            self.live.clone(),
            self.created_at,
        );
        self.pending.docker = None;
        DockerSandbox::new(container, root)
    }
}

/// Removes a container whose sandbox was never handed out (see [`Launcher::start`]).
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

/// Started containers kept ready for a backend's `create`, each handed out once and
/// never reused (see `DockerBackend::with_pool`).
#[derive(Debug)]
pub(crate) struct Pool {
    size: usize,
    /// What every pooled container was made with: one is handed out only for a spec
    /// that makes exactly this config.
    config: ContainerCreateBody,
    state: Mutex<PoolState>,
    /// The refills in flight, which shutdown waits for.
    refills: TaskTracker,
}

#[derive(Debug, Default)]
struct PoolState {
    ready: Vec<Warm>,
    /// Being created and started.
    starting: usize,
    /// Shut down: nothing is added any more.
    closed: bool,
    /// When a refill last failed: refills pause for [`REFILL_BACKOFF`] after that.
    failed_at: Option<Instant>,
}

impl Pool {
    /// A pool of `size` containers made from `config`, empty until [`Pool::refill`].
    pub(crate) fn new(size: usize, config: ContainerCreateBody) -> Arc<Pool> {
        Arc::new(Pool {
            size,
            config,
            state: Mutex::default(),
            refills: TaskTracker::new(),
        })
    }

    /// How many pooled containers are ready now.
    pub(crate) fn ready(&self) -> usize {
        self.state.lock().map_or(0, |state| state.ready.len())
    }

    /// Starts containers until the pool holds (or is starting) its size; not within
    /// [`REFILL_BACKOFF`] of a failed start.
    pub(crate) fn refill(self: &Arc<Self>, launcher: &Launcher) {
        let missing = match self.state.lock() {
            Ok(mut state)
                if !state.closed
                    && state
                        .failed_at
                        .is_none_or(|at| at.elapsed() >= REFILL_BACKOFF) =>
            {
                let missing = self.size.saturating_sub(state.ready.len() + state.starting);
                state.starting += missing;
                missing
            }
            _ => 0,
        };
        for _ in 0..missing {
            let pool = self.clone();
            let launcher = launcher.clone();
            self.refills.spawn(async move {
                let made = launcher.start(pool.config.clone()).await;
                let late = {
                    let Ok(mut state) = pool.state.lock() else {
                        return;
                    };
                    state.starting -= 1;
                    match made {
                        Ok(warm) if !state.closed => {
                            state.failed_at = None;
                            state.ready.push(warm);
                            None
                        }
                        Ok(warm) => Some(warm),
                        Err(e) => {
                            state.failed_at = Some(Instant::now());
                            tracing::warn!(error = %e, "docker: cannot start a pooled container");
                            None
                        }
                    }
                };
                // Finished after shutdown began: removed here, before shutdown returns.
                if let Some(warm) = late {
                    warm.remove().await;
                }
            });
        }
    }

    /// A pooled container made for `config`, if one is ready and still running.
    pub(crate) async fn take(
        self: &Arc<Self>,
        launcher: &Launcher,
        config: &ContainerCreateBody,
    ) -> Option<Warm> {
        if self.config != *config {
            return None;
        }
        loop {
            let (warm, emptied) = {
                let mut state = self.state.lock().ok()?;
                let warm = state.ready.pop();
                (warm, state.ready.is_empty())
            };
            // A run's place is refilled once it has been removed (see
            // `DockerBackend::create`), so the refill does not compete with the run it
            // serves; only a pool this take empties refills now, for the runs that come
            // meanwhile.
            if emptied {
                self.refill(launcher);
            }
            let warm = warm?;
            if warm.is_running().await {
                return Some(warm);
            }
            tracing::warn!(container = %warm.id(), "docker: a pooled container is not running; removing it");
            warm.remove().await;
        }
    }

    /// Closes the pool and removes every container it holds or is still starting.
    pub(crate) async fn shutdown(&self) {
        // Closed first, so no refill adds to the pool any more; what it holds is removed
        // here, and what is still starting is removed by its refill, awaited below.
        let pooled: Vec<Warm> = match self.state.lock() {
            Ok(mut state) => {
                state.closed = true;
                std::mem::take(&mut state.ready)
            }
            Err(_) => Vec::new(),
        };
        // Refills in flight remove what they made once they see the pool closed.
        self.refills.close();
        if tokio::time::timeout(REFILL_WAIT, self.refills.wait())
            .await
            .is_err()
        {
            tracing::warn!("docker: pooled containers still starting at shutdown");
        }
        for warm in pooled {
            warm.remove().await;
        }
    }
}
