//! `NativeBackend` turns a `SandboxSpec` into a `NativeSandbox`: made now (`create`),
//! or taken from the sandboxes made ahead (`warm`), its first exec prepared.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use skillbox_env::{
    Backend, BackendKind, BackendReport, EnvError, EnvResult, ErrorCode, ExecutionEnv, SandboxSpec,
};

use crate::cgroup;
use crate::create::sweep_once;
use crate::layout;
use crate::sandbox::NativeSandbox;

/// Creates native sandboxes under `<data_dir>/native`.
#[derive(Debug, Clone)]
pub struct NativeBackend {
    data_dir: PathBuf,
    /// Resolves the names a sandbox's egress proxy connects to.
    resolver: Arc<dyn skillbox_egress::Resolve>,
    /// Roots the egress proxy trusts for the hosts it adds secrets for, beyond the
    /// public web roots (a private CA; tests).
    upstream_roots: Arc<Vec<rustls_pki_types::CertificateDer<'static>>>,
    /// Sandboxes made ahead, with their first exec prepared (`with_warm`).
    warm: Option<Arc<crate::warm::Warm>>,
    /// Directories shown at `/etc/NAME` beyond the usual ones (`with_etc`,
    /// `with_etc_from`).
    etc: Arc<[layout::EtcDir]>,
}

impl NativeBackend {
    /// A relative `data_dir` is taken from the current directory now: the paths under it
    /// reach processes with another working directory (the spawner's is `/`), where a
    /// relative one names nothing.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        NativeBackend {
            data_dir: std::path::absolute(&data_dir).unwrap_or(data_dir),
            resolver: Arc::new(skillbox_egress::SystemResolver),
            upstream_roots: Arc::default(),
            warm: None,
            etc: Arc::new([]),
        }
    }

    /// Also shows these host directories of `/etc` (each `/etc/NAME`), read-only where
    /// they are, in every sandbox this backend makes: configuration a program of the
    /// caller's needs (LibreOffice's, for the slide previews' renders), never in a run's
    /// sandbox. Missing ones are left out.
    pub fn with_etc(mut self, dirs: &'static [&'static str]) -> Self {
        let mut etc = self.etc.to_vec();
        etc.extend(dirs.iter().map(|dir| layout::EtcDir {
            sandbox: dir,
            host: PathBuf::from(dir),
        }));
        self.etc = etc.into();
        self
    }

    /// Also shows `host`, read-only, at `sandbox` (`/etc/NAME`) in every sandbox this
    /// backend makes: a directory the caller made in place of the host's own (a
    /// filtered copy of it), never in a run's sandbox. A missing one is left out.
    pub fn with_etc_from(mut self, sandbox: &'static str, host: PathBuf) -> Self {
        let mut etc = self.etc.to_vec();
        etc.push(layout::EtcDir { sandbox, host });
        self.etc = etc.into();
        self
    }

    /// Keeps up to `size` sandboxes made ahead for the shape of the last `create`
    /// (limits and policy; a temp workspace and no egress), each with its first exec's
    /// init started and locked down: a run that takes one pays only for its command.
    /// Every sandbox this backend's `create` hands out then has its first exec
    /// prepared, made ahead or not. `size` 0: none of this.
    pub fn with_warm(mut self, size: usize) -> Self {
        self.warm = (size > 0).then(|| crate::warm::Warm::new(size));
        self
    }

    /// Removes what skillbox processes that no longer run left (sandbox dirs under this
    /// data dir, exec cgroups), as the first `create` of this process does: a server
    /// calls it as it starts, so what a killed one left goes then, not at its first
    /// native sandbox. Once per process; it may block on the removals.
    pub fn sweep_leftovers(&self) {
        let native_dir = self.data_dir.join(BackendKind::Native.as_str());
        sweep_once(&native_dir, false, cgroup::Host::get());
    }

    /// Starts making sandboxes ahead for `spec`'s shape, before the first `create`.
    pub fn prepare_warm(&self, spec: SandboxSpec) {
        if let Some(warm) = &self.warm {
            warm.prime(&spec, &self.maker());
        }
    }

    /// What the pool of sandboxes made ahead has done; `None` without one.
    pub fn warm_stats(&self) -> Option<crate::warm::WarmStats> {
        self.warm.as_ref().map(|warm| warm.stats())
    }

    /// Cleans up the sandboxes made ahead (each kills its prepared init) and those
    /// being made, and makes no more: for a server stopping. Returns once their
    /// cgroups and directories are gone.
    pub async fn drain_warm(&self) {
        if let Some(warm) = &self.warm {
            for sandbox in warm.drain().await {
                use skillbox_env::FileSystem;
                if let Err(e) = sandbox.cleanup().await {
                    tracing::warn!(error = %e, "native: cleaning up a sandbox made ahead");
                }
            }
        }
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

    /// The resolver of the sandboxes' egress proxies (the host's getaddrinfo by
    /// default). Every address it answers is still judged before a connect.
    pub fn with_resolver(mut self, resolver: Arc<dyn skillbox_egress::Resolve>) -> Self {
        self.resolver = resolver;
        self
    }

    /// As [`NativeBackend::create`], on the calling thread: for a one-shot CLI, where a
    /// blocking millisecond costs less than starting a worker thread.
    ///
    /// The sandbox it makes is for such a caller: it clones its sandboxes on the thread
    /// that polls its exec (no spawner thread; a sandbox dies when that thread exits),
    /// and does its housekeeping (removing its cgroup and directory) in place.
    pub fn create_blocking(&self, spec: SandboxSpec) -> EnvResult<NativeSandbox> {
        NativeSandbox::prepare(
            &self.data_dir,
            spec,
            self.etc.clone(),
            true,
            &self.resolver,
            &self.upstream_roots,
        )
    }

    /// Prepares a sandbox: its root, `/etc`, workspace and limits. Refuses with
    /// `unavailable` naming the layer this host cannot give.
    pub async fn create(&self, spec: SandboxSpec) -> EnvResult<NativeSandbox> {
        let Some(warm) = &self.warm else {
            return self.maker()(spec).await;
        };
        // Checked here too: a sandbox made ahead takes this spec's limits as they are.
        spec.limits
            .validate()
            .map_err(|e| EnvError::invalid(format!("limits: {e}")))?;
        if let Some(sandbox) = warm.take(&spec, &self.maker()) {
            tracing::debug!(dir = %sandbox.dir.display(), "native: sandbox made ahead");
            return Ok(sandbox);
        }
        let sandbox = self.maker()(spec).await?;
        sandbox.prepare_exec().await?;
        Ok(sandbox)
    }

    /// How a sandbox is made, off the async threads.
    fn maker(&self) -> crate::warm::Make {
        let data_dir = self.data_dir.clone();
        let resolver = self.resolver.clone();
        let roots = self.upstream_roots.clone();
        let etc = self.etc.clone();
        Arc::new(move |spec| {
            let (data_dir, resolver, roots) = (data_dir.clone(), resolver.clone(), roots.clone());
            let etc = etc.clone();
            Box::pin(async move {
                crate::spawn::warm_up();
                tokio::task::spawn_blocking(move || {
                    NativeSandbox::prepare(&data_dir, spec, etc, false, &resolver, &roots)
                })
                .await
                .map_err(|e| {
                    EnvError::new(
                        ErrorCode::Unknown,
                        format!("native: setup worker failed: {e}"),
                    )
                })?
            })
        })
    }
}

#[async_trait]
impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    async fn probe(&self) -> BackendReport {
        crate::probe()
    }

    async fn create(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        Ok(Box::new(NativeBackend::create(self, spec).await?))
    }

    async fn create_one_shot(&self, spec: SandboxSpec) -> EnvResult<Box<dyn ExecutionEnv>> {
        Ok(Box::new(self.create_blocking(spec)?))
    }
}
