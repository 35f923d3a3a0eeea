//! A docker or gvisor backend: checking at connect what its sandboxes will need, making
//! them (fresh, or from its pool), sweeping what dead skillbox processes left, and what
//! `doctor` reports.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use bollard::models::SystemInfo;
use bollard::query_parameters::ListContainersOptions;
use skillbox_env::{
    Backend, BackendKind, BackendReport, EnvError, EnvResult, ExecutionEnv, Layer, SandboxSpec,
};

use crate::config::container_config;
use crate::daemon::{
    connect, daemon_address, daemon_error, image_missing, remove_container, unavailable,
};
use crate::pool::{Launcher, Pool};
use crate::runtime::Runtime;
use crate::sandbox::DockerSandbox;
use crate::{LABEL_OWNER, LABEL_SANDBOX};

/// Makes docker (or gvisor) sandboxes from one image.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    launcher: Launcher,
    owner: String,
    pool: Option<Arc<Pool>>,
    /// Resolves the names a sandbox's egress proxy connects to.
    resolver: Arc<dyn skillbox_egress::Resolve>,
    /// Roots the egress proxy trusts for the hosts it adds secrets for, beyond the
    /// public web roots (a private CA; tests).
    upstream_roots: Arc<Vec<rustls_pki_types::CertificateDer<'static>>>,
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
            launcher: Launcher {
                docker,
                runtime,
                image,
                live: Arc::default(),
            },
            owner: owner_label(),
            pool: None,
            resolver: Arc::new(skillbox_egress::SystemResolver),
            upstream_roots: Arc::default(),
        };
        this.sweep().await;
        Ok(this)
    }

    /// The resolver of the sandboxes' egress proxies (the host's getaddrinfo by
    /// default). Every address it answers is still judged before a connect.
    pub fn with_resolver(mut self, resolver: Arc<dyn skillbox_egress::Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// Roots the egress proxy also trusts when it opens TLS to a host it adds secrets
    /// for (a private CA), beyond the public web roots.
    pub fn with_upstream_roots(
        mut self,
        roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    ) -> Self {
        self.upstream_roots = Arc::new(roots);
        self
    }

    pub fn runtime(&self) -> Runtime {
        self.launcher.runtime
    }

    pub fn image(&self) -> &str {
        &self.launcher.image
    }

    /// Keeps `size` started containers ready for sandboxes of `spec`: `create` of such
    /// a sandbox then costs no container create and start (about 200 ms here), only a
    /// check that the container still runs. Each pooled container is handed out once,
    /// and its place is refilled in the background once its sandbox is cleaned up, or
    /// dropped and its container removed (or at once when the take left the pool empty). A spec that would make a different
    /// container (other limits, a workdir, mounts) gets a fresh one, as without a pool.
    /// [`DockerBackend::shutdown`] removes what the pool holds.
    pub fn with_pool(mut self, size: usize, spec: &SandboxSpec) -> EnvResult<Self> {
        if size == 0 {
            return Ok(self);
        }
        spec.limits.validate().map_err(EnvError::invalid)?;
        let config = container_config(self.runtime(), self.image(), &self.owner, spec)?;
        let pool = Pool::new(size, config);
        pool.refill(&self.launcher);
        self.pool = Some(pool);
        Ok(self)
    }

    /// How many pooled containers are ready now.
    pub fn pooled(&self) -> usize {
        self.pool.as_ref().map_or(0, |pool| pool.ready())
    }

    /// Starts a sandbox container for `spec`, or hands out a pooled one made for it.
    pub async fn create(&self, spec: SandboxSpec) -> EnvResult<DockerSandbox> {
        spec.limits.validate().map_err(EnvError::invalid)?;
        let config = container_config(self.runtime(), self.image(), &self.owner, &spec)?;
        let mut sandbox = match &self.pool {
            Some(pool) => match pool.take(&self.launcher, &config).await {
                Some(warm) => {
                    tracing::debug!(container = %warm.id(), "docker: sandbox from the pool");
                    warm.into_sandbox(spec.limits.clone(), &spec.root)
                }
                None => self
                    .launcher
                    .start(config)
                    .await?
                    .into_sandbox(spec.limits.clone(), &spec.root),
            },
            None => self
                .launcher
                .start(config)
                .await?
                .into_sandbox(spec.limits.clone(), &spec.root),
        };
        if let Some(pool) = &self.pool {
            let (pool, launcher) = (pool.clone(), self.launcher.clone());
            sandbox.after_cleanup =
                std::sync::Mutex::new(Some(crate::sandbox::AfterCleanup(Box::new(move || {
                    pool.refill(&launcher)
                }))));
        }
        // Before any of the sandbox's code runs; a failure drops (removes) the container.
        sandbox.egress = crate::egress::attach(
            sandbox.container(),
            &spec.policy,
            self.resolver.clone(),
            &self.upstream_roots,
        )
        .await?;
        Ok(sandbox)
    }

    /// Removes every container this backend made that is still there (for a server
    /// that shuts down while runs are in flight).
    pub async fn shutdown(&self) {
        if let Some(pool) = &self.pool {
            pool.shutdown().await;
        }
        let live = &self.launcher.live;
        let ids: Vec<String> = match live.lock() {
            Ok(live) => live.iter().cloned().collect(),
            Err(_) => return,
        };
        for id in ids {
            if remove_container(&self.launcher.docker, &id).await
                && let Ok(mut live) = live.lock()
            {
                live.remove(&id);
            }
        }
    }

    /// Removes the sandbox containers of skillbox processes that no longer exist.
    async fn sweep(&self) {
        sweep_dead_owners(&self.launcher.docker).await;
    }
}

/// Removes the sandbox containers (docker's and gvisor's) of skillbox processes that no
/// longer run, without a backend: a server calls it as it starts, so what a killed one
/// left goes then, not when a container backend is first used. Nothing when the
/// daemon's unix socket is not there (no Docker here) or the daemon is not on this
/// machine.
pub async fn sweep_left_behind() {
    let address = daemon_address();
    let Some(socket) = address.strip_prefix("unix://") else {
        return;
    };
    if !std::path::Path::new(socket).exists() {
        return;
    }
    if let Ok(docker) = connect(BackendKind::Docker).await {
        sweep_dead_owners(&docker).await;
    }
}

/// Removes the sandbox containers whose owner label names a skillbox process that no
/// longer runs (a crash, a kill -9). Only for a daemon on this machine: owners are named
/// by this machine's boot id and pids.
async fn sweep_dead_owners(docker: &bollard::Docker) {
    if !daemon_address().starts_with("unix://") {
        return;
    }
    let filters = HashMap::from([("label".to_string(), vec![LABEL_SANDBOX.to_string()])]);
    let options = ListContainersOptions {
        all: true,
        filters: Some(filters),
        ..Default::default()
    };
    let Ok(containers) = docker.list_containers(Some(options)).await else {
        return;
    };
    for container in containers {
        let (Some(id), Some(labels)) = (container.id, container.labels) else {
            continue;
        };
        let owner = labels.get(LABEL_OWNER).map(String::as_str).unwrap_or("");
        if !owner_alive(owner) {
            tracing::info!(container = %id, owner, "docker: removing a sandbox left by a skillbox that is gone");
            remove_container(docker, &id).await;
        }
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `<boot id>/<pid namespace>/<pid>/<start time>` of this process: the pid and start
/// time mean something only in the pid namespace named beside them.
fn owner_label() -> String {
    let tag = skillbox_env::owner::this_process();
    let mut parts = tag.split('.');
    let pid = parts.next().unwrap_or_default();
    let started = parts.next().unwrap_or_default();
    let namespace = skillbox_env::owner::pid_namespace().unwrap_or(0);
    format!("{}/{namespace}/{pid}/{started}", boot_id())
}

/// True while the process named by an owner label may still run: it does, or it is
/// in another pid namespace, whose pids this process cannot look up (a skillbox in a
/// container beside one on the host, both on one daemon: each sweeps only its own).
/// An earlier boot's owner is gone. A label of the older form `<boot id>/<pid>/<start
/// time>` is judged by this namespace's pids, as it was written.
fn owner_alive(owner: &str) -> bool {
    let parts: Vec<&str> = owner.split('/').collect();
    let (boot, namespace, pid, started) = match parts[..] {
        [boot, namespace, pid, started] => (boot, Some(namespace), pid, started),
        [boot, pid, started] => (boot, None, pid, started),
        _ => return false,
    };
    if boot != boot_id() {
        return false;
    }
    let ours = skillbox_env::owner::pid_namespace().map(|ns| ns.to_string());
    if namespace.is_some_and(|ns| Some(ns) != ours.as_deref()) {
        return true;
    }
    !pid.is_empty()
        && !started.is_empty()
        && skillbox_env::owner::alive(&format!("{pid}.{started}"))
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
        self.runtime().backend()
    }

    async fn probe(&self) -> BackendReport {
        probe(self.runtime(), self.image()).await
    }

    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        Ok(Box::new(DockerBackend::create(self, spec).await?))
    }

    async fn shutdown(&self) {
        DockerBackend::shutdown(self).await;
    }
}
