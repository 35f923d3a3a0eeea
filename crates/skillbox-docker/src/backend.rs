//! Reaching the daemon, checking what a backend needs, and making sandboxes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{ContainerCreateBody, SystemInfo};
use bollard::query_parameters::{ListContainersOptions, RemoveContainerOptions};
use skillbox_env::{
    Backend, BackendKind, BackendReport, EnvError, EnvResult, ErrorCode, ExecutionEnv, Layer,
    SandboxSpec,
};
use tokio_util::task::TaskTracker;

use crate::sandbox::{DockerSandbox, Warm, container_config};
use crate::{LABEL_OWNER, LABEL_SANDBOX};

/// How long the daemon may take to answer a ping before it counts as down.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Which OCI runtime runs the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Docker's default (`runc`): the host kernel behind namespaces, cgroups, seccomp.
    Runc,
    /// gVisor (`runsc`): a user-space kernel between the code and the host kernel.
    Runsc,
}

impl Runtime {
    /// The skillbox backend kind.
    pub fn backend(self) -> BackendKind {
        match self {
            Runtime::Runc => BackendKind::Docker,
            Runtime::Runsc => BackendKind::Gvisor,
        }
    }

    /// The runtime name the daemon knows.
    pub fn docker_name(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }

    /// The perl that runs skillbox's init, exec wrapper and killer.
    ///
    /// Under runc, the image's execute-only copy: the sandbox user cannot read it, so
    /// the kernel makes every process started from it non-dumpable from its first
    /// instruction. The sandbox's code (the same uid) never gets a moment in which it
    /// could write a helper's memory through `/proc/<pid>/mem`, before the helper's
    /// own `prctl` or its filter. gVisor cannot load a binary it cannot read: there,
    /// the plain interpreter, which makes itself undumpable as its first act.
    pub(crate) fn perl(self) -> &'static str {
        match self {
            Runtime::Runc => crate::image::PRIVATE_PERL,
            Runtime::Runsc => "/usr/bin/perl",
        }
    }

    /// The python that runs skillbox's file helper, as [`Runtime::perl`].
    pub(crate) fn python(self) -> &'static str {
        match self {
            Runtime::Runc => crate::image::PRIVATE_PYTHON,
            Runtime::Runsc => "/usr/bin/python3",
        }
    }
}

/// The containers a backend made and has not removed yet.
pub(crate) type Live = Arc<Mutex<BTreeSet<String>>>;

/// Makes docker (or gvisor) sandboxes from one image.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    docker: Docker,
    runtime: Runtime,
    image: String,
    owner: String,
    live: Live,
    pool: Option<Arc<Pool>>,
}

/// Started containers kept ready for [`DockerBackend::create`], each handed out once
/// and never reused (see [`DockerBackend::with_pool`]).
#[derive(Debug)]
struct Pool {
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

/// How long the pool waits after a failed refill before it tries again.
const REFILL_BACKOFF: Duration = Duration::from_secs(5);
/// How long shutdown waits for refills in flight.
const REFILL_WAIT: Duration = Duration::from_secs(60);

fn unavailable(message: impl Into<String>) -> EnvError {
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

/// The registered runtimes in the daemon's info.
fn runtimes(info: &SystemInfo) -> Vec<String> {
    info.runtimes
        .as_ref()
        .map(|r| r.keys().cloned().collect())
        .unwrap_or_default()
}

/// Refuses a daemon whose containers get no seccomp profile (`seccomp-profile:
/// unconfined` in its config): Docker's profile is one of the layers this backend names.
fn check_seccomp(info: &SystemInfo, backend: BackendKind) -> EnvResult<()> {
    let options = info.security_options.clone().unwrap_or_default();
    let seccomp = options.iter().find(|o| o.starts_with("name=seccomp"));
    match seccomp {
        Some(option) if !option.contains("profile=unconfined") => Ok(()),
        _ => Err(unavailable(format!(
            "backend {backend}: the Docker daemon applies no seccomp profile \
             (security options: {options:?}); remove `seccomp-profile: unconfined` from its config"
        ))),
    }
}

fn runsc_missing() -> EnvError {
    unavailable(
        "backend gvisor: the Docker daemon has no `runsc` runtime registered; install runsc \
         (Debian: apt-get install runsc) and add to /etc/docker/daemon.json \
         {\"runtimes\":{\"runsc\":{\"path\":\"/usr/bin/runsc\",\"runtimeArgs\":[\"--network=none\"]}}}, \
         then reload dockerd (kill -HUP)",
    )
}

fn image_missing(backend: BackendKind, image: &str) -> EnvError {
    unavailable(format!(
        "backend {backend}: image {image} is not in the daemon; build it with `skillbox image build`"
    ))
}

impl DockerBackend {
    /// Connects and checks everything a sandbox will need: the daemon answers, the
    /// runtime is registered, the image is there. Also removes containers that a
    /// skillbox process which is gone left behind.
    pub async fn connect(runtime: Runtime, image: impl Into<String>) -> EnvResult<Self> {
        let backend = runtime.backend();
        let image = image.into();
        let docker = connect(backend).await?;
        let info = docker.info().await.map_err(|e| daemon_error(backend, &e))?;
        if runtime == Runtime::Runsc && !runtimes(&info).iter().any(|r| r == "runsc") {
            return Err(runsc_missing());
        }
        check_seccomp(&info, backend)?;
        match docker.inspect_image(&image).await {
            Ok(_) => {}
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Err(image_missing(backend, &image)),
            Err(e) => return Err(daemon_error(backend, &e)),
        }
        let this = DockerBackend {
            docker,
            runtime,
            image,
            owner: owner_label(),
            live: Arc::default(),
            pool: None,
        };
        this.sweep().await;
        Ok(this)
    }

    pub fn runtime(&self) -> Runtime {
        self.runtime
    }

    pub fn image(&self) -> &str {
        &self.image
    }

    /// Keeps `size` started containers ready for sandboxes of `spec`: `create` of such
    /// a sandbox then costs no container create and start (about 200 ms here), only a
    /// check that the container still runs. Each pooled container is handed out once,
    /// and its place is refilled in the background. A spec that would make a different
    /// container (other limits, a workdir, mounts) gets a fresh one, as without a pool.
    /// [`DockerBackend::shutdown`] removes what the pool holds.
    pub fn with_pool(mut self, size: usize, spec: &SandboxSpec) -> EnvResult<Self> {
        if size == 0 {
            return Ok(self);
        }
        spec.limits.validate().map_err(EnvError::invalid)?;
        let config = container_config(self.runtime, &self.image, &self.owner, spec)?;
        self.pool = Some(Arc::new(Pool {
            size,
            config,
            state: Mutex::default(),
            refills: TaskTracker::new(),
        }));
        self.refill();
        Ok(self)
    }

    /// How many pooled containers are ready now.
    pub fn pooled(&self) -> usize {
        self.pool
            .as_ref()
            .and_then(|pool| pool.state.lock().ok().map(|state| state.ready.len()))
            .unwrap_or(0)
    }

    /// Starts containers until the pool holds (or is starting) its size; not within
    /// [`REFILL_BACKOFF`] of a failed start.
    fn refill(&self) {
        let Some(pool) = &self.pool else {
            return;
        };
        let missing = match pool.state.lock() {
            Ok(mut state)
                if !state.closed
                    && state
                        .failed_at
                        .is_none_or(|at| at.elapsed() >= REFILL_BACKOFF) =>
            {
                let missing = pool.size.saturating_sub(state.ready.len() + state.starting);
                state.starting += missing;
                missing
            }
            _ => 0,
        };
        for _ in 0..missing {
            let pool = pool.clone();
            let (docker, runtime, image, live) = (
                self.docker.clone(),
                self.runtime,
                self.image.clone(),
                self.live.clone(),
            );
            let refills = pool.refills.clone();
            refills.spawn(async move {
                let made = Warm::start(docker, runtime, &image, pool.config.clone(), live).await;
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
    async fn take_pooled(&self, config: &ContainerCreateBody) -> Option<Warm> {
        let pool = self.pool.as_ref().filter(|pool| pool.config == *config)?;
        loop {
            let warm = pool.state.lock().ok()?.ready.pop();
            // Its place, or after failed refills (once the backoff is over) the pool's.
            self.refill();
            let warm = warm?;
            if warm.is_running().await {
                return Some(warm);
            }
            tracing::warn!(container = %warm.id(), "docker: a pooled container is not running; removing it");
            warm.remove().await;
        }
    }

    /// Starts a sandbox container for `spec`, or hands out a pooled one made for it.
    pub async fn create(&self, spec: SandboxSpec) -> EnvResult<DockerSandbox> {
        spec.limits.validate().map_err(EnvError::invalid)?;
        if self.pool.is_some() {
            let config = container_config(self.runtime, &self.image, &self.owner, &spec)?;
            if let Some(warm) = self.take_pooled(&config).await {
                tracing::debug!(container = %warm.id(), "docker: sandbox from the pool");
                return Ok(warm.into_sandbox(spec.limits));
            }
        }
        DockerSandbox::start(
            self.docker.clone(),
            self.runtime,
            &self.image,
            &self.owner,
            spec,
            self.live.clone(),
        )
        .await
    }

    /// Removes every container this backend made that is still there (for a server
    /// that shuts down while runs are in flight).
    pub async fn shutdown(&self) {
        // Closed first, so no refill adds to the pool any more; what it holds is removed
        // here, and what is still starting is removed by its refill, awaited below.
        let pooled: Vec<Warm> = match self.pool.as_ref().map(|pool| pool.state.lock()) {
            Some(Ok(mut state)) => {
                state.closed = true;
                std::mem::take(&mut state.ready)
            }
            _ => Vec::new(),
        };
        // Refills in flight remove what they made once they see the pool closed.
        if let Some(pool) = &self.pool {
            pool.refills.close();
            if tokio::time::timeout(REFILL_WAIT, pool.refills.wait())
                .await
                .is_err()
            {
                tracing::warn!("docker: pooled containers still starting at shutdown");
            }
        }
        for warm in pooled {
            warm.remove().await;
        }
        let ids: Vec<String> = match self.live.lock() {
            Ok(live) => live.iter().cloned().collect(),
            Err(_) => return,
        };
        for id in ids {
            if remove_container(&self.docker, &id).await
                && let Ok(mut live) = self.live.lock()
            {
                live.remove(&id);
            }
        }
    }

    /// Removes the sandbox containers of skillbox processes that no longer exist (a
    /// crash, a kill -9). Only for a daemon on this machine: owners are named by this
    /// machine's boot id and pids.
    async fn sweep(&self) {
        if !daemon_address().starts_with("unix://") {
            return;
        }
        let filters = HashMap::from([("label".to_string(), vec![LABEL_SANDBOX.to_string()])]);
        let options = ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        };
        let Ok(containers) = self.docker.list_containers(Some(options)).await else {
            return;
        };
        for container in containers {
            let (Some(id), Some(labels)) = (container.id, container.labels) else {
                continue;
            };
            let owner = labels.get(LABEL_OWNER).map(String::as_str).unwrap_or("");
            if !owner_alive(owner) {
                tracing::info!(container = %id, owner, "docker: removing a sandbox left by a skillbox that is gone");
                remove_container(&self.docker, &id).await;
            }
        }
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

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Field 22 of /proc/<pid>/stat: when the process started, in clock ticks since boot.
fn start_time(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; fields after it follow its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19).map(str::to_string)
}

/// `<boot id>/<pid>/<start time>` of this process.
fn owner_label() -> String {
    let pid = std::process::id().to_string();
    let started = start_time(&pid).unwrap_or_default();
    format!("{}/{pid}/{started}", boot_id())
}

/// True while the process named by an owner label still runs.
fn owner_alive(owner: &str) -> bool {
    let mut parts = owner.split('/');
    let (Some(boot), Some(pid), Some(started)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    boot == boot_id() && start_time(pid).as_deref() == Some(started)
}

/// What the docker (or gvisor) backend gives on this host, layer by layer.
pub async fn probe(runtime: Runtime, image: &str) -> BackendReport {
    let backend = runtime.backend();
    let mut layers = BTreeMap::new();
    let layer = |available: bool, detail: String| Layer::new(available, detail);
    let docker = match connect(backend).await {
        Ok(docker) => docker,
        Err(e) => {
            layers.insert("daemon", layer(false, e.message.clone()));
            return report(runtime, Some(e.message), layers);
        }
    };
    let version = docker
        .version()
        .await
        .ok()
        .and_then(|v| v.version)
        .unwrap_or_else(|| "unknown version".into());
    layers.insert(
        "daemon",
        layer(true, format!("Docker {version} at {}", daemon_address())),
    );
    let mut reason = None;
    let registered = match docker.info().await {
        Ok(info) => runtimes(&info),
        Err(_) => Vec::new(),
    };
    let has_runtime = registered.iter().any(|r| r == runtime.docker_name());
    layers.insert(
        "runtime",
        layer(
            has_runtime,
            if has_runtime {
                format!("{} registered", runtime.docker_name())
            } else {
                format!(
                    "{} not registered (registered: {})",
                    runtime.docker_name(),
                    registered.join(", ")
                )
            },
        ),
    );
    if !has_runtime {
        reason = Some(runsc_missing().message);
    }
    let has_image = docker.inspect_image(image).await.is_ok();
    layers.insert(
        "image",
        layer(
            has_image,
            if has_image {
                format!("{image} present")
            } else {
                format!("{image} missing: run `skillbox image build`")
            },
        ),
    );
    if !has_image && reason.is_none() {
        reason = Some(image_missing(backend, image).message);
    }
    report(runtime, reason, layers)
}

fn report(
    runtime: Runtime,
    reason: Option<String>,
    layers: BTreeMap<&'static str, Layer>,
) -> BackendReport {
    BackendReport {
        layers: layers
            .into_iter()
            .map(|(name, layer)| (name.to_string(), layer))
            .collect(),
        ..BackendReport::new(runtime.backend(), reason)
    }
}

#[async_trait]
impl Backend for DockerBackend {
    fn kind(&self) -> BackendKind {
        self.runtime.backend()
    }

    async fn probe(&self) -> BackendReport {
        probe(self.runtime, &self.image).await
    }

    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        Ok(Box::new(DockerBackend::create(self, spec).await?))
    }

    async fn shutdown(&self) {
        DockerBackend::shutdown(self).await;
    }
}
