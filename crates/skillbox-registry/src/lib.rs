//! [`BackendRegistry`]: the only place a [`BackendKind`] is turned into a sandbox. The
//! CLI (`exec`, `run`, `agent`, `doctor`), the runner, the server and the agent all ask
//! it for "a sandbox of kind K with spec S", and nothing else names a backend crate.
//!
//! Backends that need a daemon (docker, gvisor) connect on first use, so a host without
//! Docker still runs native sandboxes, and `doctor` probes them without connecting. A
//! kind that is not part of this build, or whose backend cannot be set up here, is
//! `unavailable` with the reason; nothing ever falls back to another kind.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use skillbox_docker::{DockerBackend, Runtime};
use skillbox_egress::UpstreamRoots;
use skillbox_env::{
    Backend, BackendKind, BackendReport, EnvError, EnvResult, ExecutionEnv, HostBackend,
    SandboxSpec,
};
use skillbox_native::NativeBackend;
use skillbox_wasm::{WasmBackend, WasmConfig};
use tokio::sync::OnceCell;

/// What the registry's backends are made with.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// skillbox's data dir: native sandboxes and host temp entries live under it.
    pub data_dir: PathBuf,
    /// The image docker and gvisor sandboxes run (`skillbox image build` makes it).
    pub image: String,
    /// Started containers kept ready per container backend once it is used, for
    /// sandboxes of `warm_spec`; 0 keeps none.
    pub warm_containers: usize,
    pub warm_spec: SandboxSpec,
    /// Native sandboxes kept made ahead, each with its first exec's init started and
    /// locked down, for the shape of the last native sandbox asked for
    /// (`NativeBackend::with_warm`); 0 keeps none.
    pub warm_native: usize,
    /// The wasm backend's guests, compile cache and runner copy
    /// [default: `$SKILLBOX_WASM_HOME`, else `<data>/wasm`].
    pub wasm_home: PathBuf,
    /// The program that runs wasm guests: the skillbox binary, when it is the one
    /// running (see [`skillbox_wasm::runner::this_program_runs_guests`]).
    pub wasm_runner: Option<PathBuf>,
    /// Roots the egress proxy also trusts when it opens TLS to a host it adds secrets
    /// for (`--egress-ca`): given to every backend with egress (native, docker,
    /// gvisor); the others refuse network and secrets altogether.
    pub upstream_roots: UpstreamRoots,
}

impl RegistryConfig {
    pub fn new(data_dir: impl Into<PathBuf>, image: impl Into<String>) -> Self {
        let data_dir = data_dir.into();
        RegistryConfig {
            wasm_home: skillbox_wasm::default_home(&data_dir),
            wasm_runner: skillbox_wasm::runner::guest_runner(),
            data_dir,
            image: image.into(),
            warm_containers: 0,
            warm_spec: SandboxSpec::default(),
            warm_native: 0,
            upstream_roots: UpstreamRoots::default(),
        }
    }

    /// The backends on `data_dir` whose docker and gvisor sandboxes run the image made
    /// for the Node runtime `runtime_id`, under the tag `skillbox image build` gives it.
    pub fn for_node_runtime(data_dir: impl Into<PathBuf>, runtime_id: &str) -> Self {
        RegistryConfig::new(data_dir, skillbox_docker::image_tag(runtime_id))
    }
}

/// What a native sandbox of a caller's own shows under `/etc` beyond what every native
/// sandbox does (previews' renders: fontconfig's dir, a filtered copy of LibreOffice's
/// configuration); never shown in a run's sandbox.
#[derive(Debug, Clone, Default)]
pub struct NativeEtc {
    /// Host dirs shown read-only at the same path (`/etc/fonts`).
    pub host: &'static [&'static str],
    /// `(path, dir)`: the host's `dir`, one the caller made in place of the host's own,
    /// shown read-only at `path` (`/etc/NAME`). A missing one is left out.
    pub made: Vec<(&'static str, PathBuf)>,
}

/// The native sandbox's report on this host (what [`BackendRegistry::probe`] gives for
/// native), without a registry.
pub fn native_probe() -> BackendReport {
    skillbox_native::probe()
}

/// Whether a native sandbox shows host `path` read-only, where it is: inside the system
/// directories (`/usr`, `/bin`, `/lib`…), so a program there runs in one.
pub fn native_shows(path: &Path) -> bool {
    skillbox_native::shown_read_only(path)
}

/// One backend per kind, made when first asked for.
#[derive(Debug)]
pub struct BackendRegistry {
    config: RegistryConfig,
    native: Arc<NativeBackend>,
    host: HostBackend,
    wasm: WasmBackend,
    docker: OnceCell<Arc<DockerBackend>>,
    gvisor: OnceCell<Arc<DockerBackend>>,
}

fn not_built(kind: BackendKind) -> String {
    format!("backend {kind}: not part of this build; use native, docker, gvisor or wasm")
}

impl BackendRegistry {
    pub fn new(config: RegistryConfig) -> Self {
        let native = Arc::new(
            NativeBackend::new(&config.data_dir)
                .with_upstream_roots(config.upstream_roots.certificates().to_vec())
                .with_warm(config.warm_native),
        );
        BackendRegistry {
            native: native.clone(),
            host: HostBackend::new(config.data_dir.join("host-tmp")),
            wasm: WasmBackend::new(
                WasmConfig {
                    home: config.wasm_home.clone(),
                    runner: config.wasm_runner.clone(),
                },
                native,
            ),
            docker: OnceCell::new(),
            gvisor: OnceCell::new(),
            config,
        }
    }

    /// The backend of `kind`, connected (and checked) on first use.
    pub async fn backend(&self, kind: BackendKind) -> EnvResult<&dyn Backend> {
        let runtime = match kind {
            BackendKind::Native => return Ok(self.native.as_ref()),
            BackendKind::Host => return Ok(&self.host),
            BackendKind::Wasm => return Ok(&self.wasm),
            BackendKind::Docker => Runtime::Runc,
            BackendKind::Gvisor => Runtime::Runsc,
            _ => return Err(EnvError::unavailable(not_built(kind))),
        };
        let cell = match runtime {
            Runtime::Runc => &self.docker,
            Runtime::Runsc => &self.gvisor,
        };
        let backend = cell
            .get_or_try_init(|| async {
                let backend = DockerBackend::connect(runtime, self.config.image.clone())
                    .await?
                    .with_upstream_roots(self.config.upstream_roots.certificates().to_vec());
                let backend =
                    backend.with_pool(self.config.warm_containers, &self.config.warm_spec)?;
                Ok::<_, EnvError>(Arc::new(backend))
            })
            .await?;
        Ok(backend.as_ref())
    }

    /// A new sandbox of `kind` for `spec`.
    pub async fn create(
        &self,
        kind: BackendKind,
        spec: SandboxSpec,
    ) -> EnvResult<Box<dyn ExecutionEnv>> {
        self.backend(kind).await?.create(spec).await
    }

    /// A sandbox for one exec in a short-lived process (see [`Backend::create_one_shot`]).
    pub async fn create_one_shot(
        &self,
        kind: BackendKind,
        spec: SandboxSpec,
    ) -> EnvResult<Box<dyn ExecutionEnv>> {
        self.backend(kind).await?.create_one_shot(spec).await
    }

    /// A native backend of a caller's own, whose sandboxes also show `etc`: apart from
    /// this registry's, so no sandbox it made ahead for runs is taken or reshaped, and
    /// no run's sandbox shows `etc` (previews render in these).
    pub fn native_with_etc(&self, etc: NativeEtc) -> Arc<dyn Backend> {
        let mut native = NativeBackend::new(&self.config.data_dir).with_etc(etc.host);
        for (path, dir) in etc.made {
            native = native.with_etc_from(path, dir);
        }
        Arc::new(native)
    }

    /// The wasm backend itself (`skillbox setup` compiles its guests).
    pub fn wasm(&self) -> &WasmBackend {
        &self.wasm
    }

    /// What the native pool of sandboxes made ahead has done; `None` without one.
    pub fn native_warm(&self) -> Option<skillbox_native::WarmStats> {
        self.native.warm_stats()
    }

    /// What `kind` gives on this host, without connecting to anything for good.
    pub async fn probe(&self, kind: BackendKind) -> BackendReport {
        match kind {
            BackendKind::Native => self.native.probe().await,
            BackendKind::Host => self.host.probe().await,
            BackendKind::Wasm => self.wasm.probe().await,
            BackendKind::Docker => skillbox_docker::probe(Runtime::Runc, &self.config.image).await,
            BackendKind::Gvisor => skillbox_docker::probe(Runtime::Runsc, &self.config.image).await,
            _ => BackendReport::new(kind, Some(not_built(kind))),
        }
    }

    /// Every kind's report, in [`BackendKind::ALL`] order; the probes run together.
    pub async fn probe_all(&self) -> Vec<BackendReport> {
        futures_util::future::join_all(BackendKind::ALL.map(|kind| self.probe(kind))).await
    }

    /// Removes what skillbox processes that no longer run left behind: native sandbox
    /// dirs and cgroups, and the containers of both container backends, used here or
    /// not. A server calls it as it starts: what a killed one left goes at the next
    /// start, not only once a run uses that backend again.
    pub async fn sweep_leftovers(&self) {
        let native = self.native.clone();
        let _ = tokio::task::spawn_blocking(move || native.sweep_leftovers()).await;
        skillbox_docker::sweep_left_behind().await;
    }

    /// Removes what the connected backends still hold (a server shutting down).
    pub async fn shutdown(&self) {
        self.native.drain_warm().await;
        for cell in [&self.docker, &self.gvisor] {
            if let Some(backend) = cell.get() {
                backend.shutdown().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The image a runtime's sandboxes run is the one `skillbox image build` makes for
    /// it: another runtime, another image.
    #[test]
    fn a_node_runtime_names_the_image_its_sandboxes_run() {
        let config = RegistryConfig::for_node_runtime("/data", "node-runtime-a");
        assert_eq!(config.image, skillbox_docker::image_tag("node-runtime-a"));
        assert_eq!(config.data_dir, PathBuf::from("/data"));
        let other = RegistryConfig::for_node_runtime("/data", "node-runtime-b");
        assert_ne!(config.image, other.image);
    }
}
