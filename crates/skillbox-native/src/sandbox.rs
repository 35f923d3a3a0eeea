//! `NativeBackend` turns a `SandboxSpec` into a `NativeSandbox`: a prepared root over
//! one workspace, in which every exec gets a fresh namespace tree.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use skillbox_env::{
    Backend, BackendKind, BackendReport, CancellationToken, Ended, Ending, EnvError, EnvResult,
    ErrorCode, ExecEvent, ExecRequest, ExecStream, ExecutionEnv, Limits, SandboxSpec, Shell,
    StreamKind, Truncated, errno_code, pump_output,
};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio_util::task::TaskTracker;

use crate::cgroup::{self, ExecCgroup};
use crate::child::{ChildFds, ChildPlan, STEP_CHDIR, STEP_EXEC, read_record};
use crate::child::{MAX_ARGS, MAX_ENV, MAX_PROGRAMS};
use crate::ids::HostIds;
use crate::landlock;
use crate::layout::{self, Root};
use crate::spawn::{self, InitProcess, Started};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

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

/// One native sandbox. Cheap to exec in many times; `cleanup` removes everything.
#[derive(Debug)]
pub struct NativeSandbox {
    pub(crate) root: Root,
    /// Per bind: the source captured at create (root, on a kernel that clones detached
    /// mounts); empty where binds are looked up by path at each exec.
    pub(crate) bind_trees: Vec<Option<crate::trees::Captured>>,
    /// The tmpfs shown as `/workspace` when the sandbox owns its workspace and has a
    /// disk bound; dropping it frees everything the sandbox wrote there.
    pub(crate) scratch: Option<Arc<crate::scratch::Scratch>>,
    pub(crate) dir: PathBuf,
    pub(crate) workspace: PathBuf,
    pub(crate) temp_workspace: bool,
    pub(crate) ids: HostIds,
    /// Set when we run as root: host-side file writes are handed to the sandbox user.
    pub(crate) chown_to: Option<HostIds>,
    pub(crate) limits: Limits,
    pub(crate) cwd: PathBuf,
    pub(crate) temps: Mutex<Vec<PathBuf>>,
    /// Cancelled by `cleanup`: ends every running exec.
    pub(crate) shutdown: CancellationToken,
    /// The exec tasks, so `cleanup` can wait until their processes are gone.
    pub(crate) running: TaskTracker,
    /// Set by `cleanup`; a sandbox dropped without it still ends its execs and
    /// removes its directory.
    pub(crate) cleaned: std::sync::atomic::AtomicBool,
    /// The workspace is mounted idmapped (root with a root-owned workspace).
    pub(crate) idmapped: bool,
    /// As root: the volumes, each cloned from its source's fd for every exec (a
    /// read-write one idmapped to the sandbox when another user owns it). Empty
    /// unprivileged, where the child looks their paths up.
    pub(crate) volumes: Vec<ClonedVolume>,
    /// Made by [`NativeBackend::create_blocking`]: clones and housekeeping block the
    /// calling thread instead of handing them to other threads.
    pub(crate) one_shot: bool,
    cgroup_host: &'static cgroup::Host,
    /// The egress proxy every exec's loopback listener is served by (one rule set,
    /// one byte budget, one audit for the sandbox); `None`: no network.
    pub(crate) egress: Option<crate::egress::Egress>,
    /// The host directory of the CA files shown at `/skillbox-egress` (secrets),
    /// removed with the sandbox.
    pub(crate) egress_dir: Option<PathBuf>,
    /// The next exec's init, started ahead of its command with every layer in place
    /// ([`NativeSandbox::prepare_exec`]): that exec pays only for its command.
    pub(crate) prepared: Mutex<Option<PreparedExec>>,
}

/// A volume the parent clones for each exec (as root).
#[derive(Debug)]
pub(crate) struct ClonedVolume {
    /// Its place among the binds.
    slot: usize,
    host: PathBuf,
    dir: Arc<std::os::fd::OwnedFd>,
    /// Set when its owner is not the sandbox's host ids: the sandbox sees the owner's
    /// files as its own, and what it writes is the owner's on disk.
    mapping: Option<crate::idmap::Mapping>,
    /// The clone made at create to learn that this host allows it, kept for the first
    /// exec: closing it unused would cost a grace period.
    spare: Mutex<Option<std::os::fd::OwnedFd>>,
}

impl ClonedVolume {
    /// A detached clone for one exec to attach.
    fn clone_for_exec(&self) -> EnvResult<std::os::fd::OwnedFd> {
        if let Some(spare) = self.spare.lock().ok().and_then(|mut spare| spare.take()) {
            return Ok(spare);
        }
        self.make_clone()
    }

    fn make_clone(&self) -> EnvResult<std::os::fd::OwnedFd> {
        let clone = crate::idmap::clone_dir(&self.dir).map_err(|e| {
            unavailable(
                "mount_ns",
                format!("open_tree of the volume {}: {e}", self.host.display()),
            )
        })?;
        match self.mapping {
            Some(mapping) => crate::idmap::idmapped(clone, &self.host, mapping)
                .map_err(|e| unavailable("idmapped volume", e)),
            None => Ok(clone),
        }
    }
}

/// The volumes of `root` that the parent clones per exec: all of them as root (`ids`
/// the sandbox's host ids; a read-write one owned by another is idmapped to them), none
/// unprivileged.
fn cloned_volumes(root: &layout::Root, ids: HostIds) -> EnvResult<Vec<ClonedVolume>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Vec::new());
    }
    let mut volumes = Vec::new();
    for volume in &root.volumes {
        let slot = root.layout.mounts[..volume.op]
            .iter()
            .filter(|op| matches!(op, crate::child::MountOp::Bind { .. }))
            .count();
        let stat = rustix::fs::fstat(&*volume.dir)
            .map_err(|e| EnvError::io(&e.into(), "stat", &volume.host))?;
        let mapping = crate::idmap::Mapping {
            disk: (stat.st_uid, stat.st_gid),
            sandbox: (ids.uid, ids.gid),
        };
        let mut volume = ClonedVolume {
            slot,
            host: volume.host.clone(),
            dir: volume.dir.clone(),
            mapping: (volume.rw && mapping.disk != mapping.sandbox).then_some(mapping),
            spare: Mutex::new(None),
        };
        // Learnt now, not at the first exec: this host and filesystem allow it.
        let spare = volume.make_clone()?;
        volume.spare = Mutex::new(Some(spare));
        volumes.push(volume);
    }
    Ok(volumes)
}

/// An exec's init, cloned into its namespaces and cgroup and locked down, waiting for
/// its command. Dropped unused, it is killed, and its cgroup removed off this thread.
#[derive(Debug)]
pub(crate) struct PreparedExec {
    started: Option<Started>,
    cgroup: Option<Arc<ExecCgroup>>,
}

impl PreparedExec {
    /// Whether its init still waits (one killed meanwhile has exited).
    fn waiting(&mut self) -> bool {
        self.started
            .as_mut()
            .is_some_and(|started| !started.init.try_reap())
    }

    fn take(mut self) -> Option<(Started, Option<Arc<ExecCgroup>>)> {
        let started = self.started.take()?;
        Some((started, self.cgroup.take()))
    }

    /// As dropping it, but waits until its cgroup is removed (or could not be): a
    /// sandbox's cleanup, so that a server stopping right after leaves no cgroup.
    /// `in_place`: on this thread (a one-shot caller's), not the blocking pool.
    pub(crate) async fn discard(mut self, in_place: bool) {
        let cgroup = self.cgroup.take();
        // Kills its init; the cgroup is ours to remove.
        drop(self);
        if let Some(cgroup) = cgroup {
            if in_place {
                drop(cgroup);
            } else if let Err(e) = tokio::task::spawn_blocking(move || drop(cgroup)).await {
                tracing::warn!(error = %e, "native: removing a prepared exec's cgroup");
            }
        }
    }
}

impl Drop for PreparedExec {
    fn drop(&mut self) {
        if let Some(started) = self.started.take() {
            started.init.kill();
            drop(started);
        }
        // Removing the cgroup waits for the killed init to be gone.
        if let Some(cgroup) = self.cgroup.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || drop(cgroup))),
                Err(_) => drop(cgroup),
            }
        }
    }
}

fn seccomp_filter() -> Vec<libc::sock_filter> {
    static FILTER: OnceLock<Vec<libc::sock_filter>> = OnceLock::new();
    FILTER.get_or_init(skillbox_seccomp::filter).clone()
}

fn sandbox_counter() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Removes sandbox dirs of skillbox processes that no longer run: each name starts
/// with its maker's owner tag (`skillbox_env::owner`), so a pid handed out again (a
/// server that is pid 1 of its container, restarted) does not keep them, and one made
/// from another pid namespace is judged by its maker's claim.
fn sweep_dirs(native_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(native_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(owner) = name.split('-').next() else {
            continue;
        };
        // `etc-<hash>` and the like are no owner's: only a name that starts with a pid.
        if !owner.starts_with(|c: char| c.is_ascii_digit()) {
            continue;
        }
        if skillbox_env::owner::gone(native_dir, owner) {
            // A tmpfs an earlier skillbox attached there as root goes first.
            crate::scratch::unmount_leftover(&entry.path());
            let _ = skillbox_env::remove::remove_tree(&entry.path());
        }
    }
}

/// Sweeps, once per process, what skillbox processes that no longer run left: their
/// sandbox dirs under `native_dir` and their exec cgroups.
fn sweep_once(native_dir: &Path, one_shot: bool, cgroup_host: &'static cgroup::Host) {
    static SWEPT: OnceLock<()> = OnceLock::new();
    SWEPT.get_or_init(|| {
        sweep_dirs(native_dir);
        skillbox_env::owner::sweep_claims(native_dir);
        // Leftover cgroups are empty directories: the spawner removes them while
        // this thread goes on. A one-shot caller sweeps them only if it uses
        // cgroups itself (it has probed them anyway).
        if !one_shot {
            crate::spawn::run_on_spawner(|| cgroup::sweep(cgroup::Host::get()));
        } else if !std::ptr::eq(cgroup_host, cgroup::Host::unused()) {
            cgroup::sweep(cgroup_host);
        }
    });
}

/// Takes this process's claim in `native_dir` before it makes its first directory
/// there (a temp workspace, an egress CA): what tells a skillbox in another pid
/// namespace, sharing this data dir, that this one's are in use. A sandbox with a disk
/// bound makes none (its workspace is its own tmpfs), and takes none.
fn claim(native_dir: &Path) -> EnvResult<()> {
    skillbox_env::owner::claim(native_dir)
        .map_err(|e| EnvError::io(&e, "claim", native_dir.join(skillbox_env::owner::CLAIMS)))
}

fn unavailable(layer: &str, detail: impl std::fmt::Display) -> EnvError {
    EnvError::unavailable(format!("native: {layer}: {detail}"))
}

impl NativeSandbox {
    fn prepare(
        data_dir: &Path,
        spec: SandboxSpec,
        etc_extra: Arc<[layout::EtcDir]>,
        one_shot: bool,
        resolver: &Arc<dyn skillbox_egress::Resolve>,
        upstream_roots: &[rustls_pki_types::CertificateDer<'static>],
    ) -> EnvResult<NativeSandbox> {
        spec.limits
            .validate()
            .map_err(|e| EnvError::invalid(format!("limits: {e}")))?;
        let egress = crate::egress::proxy_for(&spec.policy, resolver, upstream_roots)?;
        let mut spec = spec;
        let abi = landlock::abi_version().map_err(|e| unavailable("landlock", e))?;
        // Probing the cgroup hierarchy is only worth it when a limit will use it.
        let limits = &spec.limits;
        let cgroup_host =
            if limits.memory_bytes.is_some() || limits.pids.is_some() || limits.cpus.is_some() {
                cgroup::Host::get()
            } else {
                cgroup::Host::unused()
            };
        if spec.limits.cpus.is_some() && !cgroup_host.has("cpu") {
            return Err(unavailable(
                "cgroup",
                format!(
                    "a cpus limit needs the cpu controller, and this host has {}",
                    cgroup_host.describe()
                ),
            ));
        }
        // SAFETY: geteuid/getegid have no preconditions.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        // As root, the sandbox user is never host root: it is the owner of the
        // workspace the caller gave (when that is an ordinary user), else nobody.
        let mut idmapped = false;
        let ids = if euid == 0 {
            match &spec.workspace {
                Some(path) => {
                    use std::os::unix::fs::MetadataExt;
                    let meta =
                        std::fs::metadata(path).map_err(|e| EnvError::io(&e, "workspace", path))?;
                    if meta.uid() == 0 {
                        // Never host root: the sandbox is nobody, and an idmapped mount
                        // shows it the root-owned directory as its own.
                        crate::idmap::check(path)
                            .map_err(|e| unavailable("idmapped workspace", e))?;
                        idmapped = true;
                        HostIds {
                            uid: 65534,
                            gid: 65534,
                        }
                    } else {
                        HostIds {
                            uid: meta.uid(),
                            // Never root's group either: a directory of it runs as
                            // nogroup (its group's rights are not the sandbox's).
                            gid: if meta.gid() == 0 { 65534 } else { meta.gid() },
                        }
                    }
                }
                None => HostIds {
                    uid: 65534,
                    gid: 65534,
                },
            }
        } else {
            HostIds {
                uid: euid,
                gid: egid,
            }
        };
        // Host-side writes are handed to the sandbox user, except in an idmapped
        // workspace, where root-owned is what the sandbox sees as its own.
        let chown_to = (euid == 0 && !idmapped).then_some(ids);

        let native_dir = data_dir.join(BackendKind::Native.as_str());
        std::fs::create_dir_all(&native_dir)
            .map_err(|e| EnvError::io(&e, "create data dir", &native_dir))?;
        sweep_once(&native_dir, one_shot, cgroup_host);
        let spec_has_no_workspace = spec.workspace.is_none();
        let random = skillbox_protocol::random::hex(4)
            .map_err(|e| EnvError::io(&e, "name a sandbox directory in", &native_dir))?;
        let dir = native_dir.join(format!(
            "{}-{}-{random}",
            skillbox_env::owner::this_process(),
            sandbox_counter(),
        ));
        // The CA of a sandbox that adds secrets, beside its directory (never in its
        // workspace), shown read-only at /skillbox-egress.
        let mut egress_dir = None;
        if let Some(ca_pem) = egress.as_ref().and_then(|e| e.ca_pem.as_deref()) {
            // Not `with_extension`: the owner tag in the name has a dot of its own.
            let mut ca_dir = dir.clone().into_os_string();
            ca_dir.push(".egress");
            let ca_dir = PathBuf::from(ca_dir);
            claim(&native_dir)?;
            crate::egress::write_ca_dir(&ca_dir, ca_pem).map_err(|e| {
                let _ = skillbox_env::remove::remove_tree(&ca_dir);
                EnvError::io(&e, "write the egress CA", &ca_dir)
            })?;
            spec.policy.read_only_mounts.push(skillbox_env::Mount {
                host: ca_dir.clone(),
                sandbox: PathBuf::from(crate::egress::CA_DIR),
            });
            egress_dir = Some(ca_dir);
        }
        let result = Self::prepare_in(&dir, spec, &etc_extra, abi, ids, chown_to, cgroup_host).map(
            |mut sandbox| {
                sandbox.idmapped = idmapped;
                sandbox.one_shot = one_shot;
                sandbox.egress = egress;
                sandbox.egress_dir = egress_dir.clone();
                sandbox
            },
        );
        if result.is_err()
            && let Some(ca_dir) = &egress_dir
        {
            let _ = skillbox_env::remove::remove_tree(ca_dir);
        }
        if result.as_ref().is_err_and(|_| spec_has_no_workspace) {
            let _ = skillbox_env::remove::remove_tree(&dir);
        }
        result
    }

    fn prepare_in(
        dir: &Path,
        spec: SandboxSpec,
        etc_extra: &Arc<[layout::EtcDir]>,
        abi: u32,
        ids: HostIds,
        chown_to: Option<HostIds>,
        cgroup_host: &'static cgroup::Host,
    ) -> EnvResult<NativeSandbox> {
        // A workspace the sandbox owns gets the disk bound: its own tmpfs, never a host
        // directory. A caller's directory cannot be bounded here (no project quotas).
        let split = spec.limits.disk_split();
        if spec.workspace.is_some() && split.is_some() {
            return Err(unavailable(
                "disk limit",
                "a --workdir on the host's filesystem cannot be bounded; run without --disk \
                 (the workdir is yours, /tmp keeps its own bound) or without --workdir",
            ));
        }
        let scratch = match split {
            Some(split) => Some(
                crate::scratch::Scratch::create(split.workspace_bytes, split.workspace_inodes, ids)
                    .map(Arc::new)
                    .map_err(|e| unavailable("disk limit", e))?,
            ),
            None => None,
        };
        let (workspace, temp_workspace) = match &spec.workspace {
            Some(path) => {
                let meta =
                    std::fs::metadata(path).map_err(|e| EnvError::io(&e, "workspace", path))?;
                if !meta.is_dir() {
                    return Err(EnvError::new(
                        ErrorCode::NotDirectory,
                        format!("workspace {}: not a directory", path.display()),
                    )
                    .with_path(path));
                }
                (path.clone(), false)
            }
            // On its tmpfs: nothing on the host.
            None if scratch.is_some() => (dir.to_path_buf(), true),
            // A temp workspace is the sandbox's own directory (which exists only then).
            None => {
                let ws = dir.to_path_buf();
                claim(dir.parent().unwrap_or(dir))?;
                std::fs::create_dir(&ws).map_err(|e| EnvError::io(&e, "create workspace", &ws))?;
                if let Some(ids) = chown_to {
                    std::os::unix::fs::chown(&ws, Some(ids.uid), Some(ids.gid))
                        .map_err(|e| EnvError::io(&e, "chown workspace", &ws))?;
                }
                (ws, true)
            }
        };
        let native_dir = dir.parent().unwrap_or(dir);
        let etc = layout::ensure_etc(native_dir, etc_extra)
            .map_err(|e| EnvError::io(&e, "write the sandbox /etc", native_dir))?;
        let rlimits = rlimits(&spec.limits, cgroup_host);
        let source = match &scratch {
            Some(scratch) => layout::WorkspaceSource::Scratch(scratch),
            None => layout::WorkspaceSource::Host(&workspace),
        };
        let root = layout::plan(
            &etc,
            layout::Workspace {
                at: &spec.root,
                source,
            },
            &spec.limits,
            &spec.policy,
            abi,
            rlimits,
            seccomp_filter(),
        )?;
        // The caller's bind sources once, now: an exec clones these, never the paths
        // again. Those are the workspace and the policy's mounts, which come after it;
        // the system dirs and the synthesized /etc sit under directories only root (or
        // this user, in its own data dir) can change, and stay looked up by path.
        // With none of those (a temp workspace on the sandbox's tmpfs) nothing is
        // captured, and nothing is probed.
        // The volumes are cloned from their fds instead, as root.
        let volumes = cloned_volumes(&root, ids)?;
        let cloned = |i: usize| !volumes.is_empty() && root.volumes.iter().any(|v| v.op == i);
        let binds = root
            .layout
            .mounts
            .iter()
            .enumerate()
            .filter_map(|(i, op)| match op {
                crate::child::MountOp::Bind { source, .. } => Some(
                    (!source.is_empty() && i >= root.layout.workspace_op && !cloned(i))
                        .then_some(source),
                ),
                _ => None,
            })
            .collect::<Vec<_>>();
        let sources = binds
            .iter()
            .flatten()
            .map(|s| s.as_c_str())
            .collect::<Vec<_>>();
        let bind_trees = match crate::trees::capture_sources(&sources)
            .map_err(|e| unavailable("mount_ns", format!("open_tree {}: {}", e.source, e.error)))?
        {
            Some(captured) => {
                let mut captured = captured.into_iter();
                binds
                    .iter()
                    .map(|source| source.and_then(|_| captured.next()))
                    .collect()
            }
            None => Vec::new(),
        };
        Ok(NativeSandbox {
            root,
            bind_trees,
            scratch,
            dir: dir.to_path_buf(),
            workspace,
            temp_workspace,
            ids,
            chown_to,
            limits: spec.limits,
            cwd: spec.root.as_path().to_path_buf(),
            temps: Mutex::new(Vec::new()),
            shutdown: CancellationToken::new(),
            running: TaskTracker::new(),
            cleaned: std::sync::atomic::AtomicBool::new(false),
            idmapped: false,
            volumes,
            one_shot: false,
            cgroup_host,
            egress: None,
            egress_dir: None,
            prepared: Mutex::new(None),
        })
    }

    /// The host directory shown as `/workspace`.
    pub fn workspace_dir(&self) -> &Path {
        &self.workspace
    }

    fn needs_cgroup(&self) -> bool {
        (self.limits.memory_bytes.is_some() && self.cgroup_host.has("memory"))
            || (self.limits.pids.is_some() && self.cgroup_host.has("pids"))
            || self.limits.cpus.is_some()
    }

    /// The plan of an exec without its command: what [`NativeSandbox::prepare_exec`]
    /// starts an init from.
    fn layout_plan(&self) -> ChildPlan {
        ChildPlan {
            layout: self.root.layout.clone(),
            // As root (an idmapped workspace too) the inherited supplementary groups
            // are dropped; unprivileged, the kernel allows no setgroups at all.
            // SAFETY: geteuid has no preconditions.
            clear_groups: unsafe { libc::geteuid() } == 0,
            cwd: CString::default(),
            programs: Vec::new(),
            argv: Vec::new(),
            env: Vec::new(),
            // Allocated by whoever clones (`spawn`): the spawner process has its own.
            payload_stack: Vec::new(),
            late: false,
            late_buffer: Vec::new(),
            egress: self.egress.is_some(),
            workspace_tree: -1,
            bind_trees: Vec::new(),
            // Filled in by whoever clones (`spawn`), from the exec's cgroup.
            cgroup_join: Vec::new(),
            // The child clones the tmpfs itself, unless it is kept in its helper's
            // namespaces (`start_init` hands it a clone made there).
            workspace_source: match &self.scratch {
                Some(s) if !s.cloned_per_exec() => std::os::fd::AsRawFd::as_raw_fd(&s.fd()),
                _ => -1,
            },
            fds: ChildFds {
                sync: -1,
                error: -1,
                status: -1,
                stdin: -1,
                stdout: -1,
                stderr: -1,
            },
        }
    }

    fn child_plan(&self, request: &ExecRequest) -> EnvResult<ChildPlan> {
        let argv = request.command.to_argv();
        if argv.len() > MAX_ARGS {
            return Err(EnvError::invalid(format!(
                "command: more than {MAX_ARGS} arguments"
            )));
        }
        let mut env = vec![
            ("PATH".to_string(), PATH.to_string()),
            ("HOME".into(), "/tmp".into()),
            ("USER".into(), "sandbox".into()),
            ("LOGNAME".into(), "sandbox".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TMPDIR".into(), "/tmp".into()),
            ("SHELL".into(), "/bin/sh".into()),
        ];
        if let Some(egress) = &self.egress {
            env.extend(
                crate::egress::proxy_env()
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v)),
            );
            env.extend(egress.env.iter().cloned());
        }
        for (key, value) in &request.env {
            env.retain(|(k, _)| k != key);
            env.push((key.clone(), value.clone()));
        }
        if env.len() > MAX_ENV {
            return Err(EnvError::invalid(format!(
                "env: more than {MAX_ENV} variables"
            )));
        }
        let path_var = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let cwd = self.absolute_path(request.cwd.as_deref().unwrap_or(&self.cwd));
        let c = |s: &str| {
            CString::new(s).map_err(|_| EnvError::invalid("command: contains a NUL byte"))
        };
        let programs = if argv[0].contains('/') {
            vec![c(&argv[0])?]
        } else {
            path_var
                .split(':')
                .filter(|d| d.starts_with('/'))
                .map(|d| c(&format!("{d}/{}", argv[0])))
                .collect::<EnvResult<Vec<_>>>()?
        };
        if programs.len() > MAX_PROGRAMS {
            return Err(EnvError::invalid(format!(
                "env PATH: more than {MAX_PROGRAMS} directories"
            )));
        }
        Ok(ChildPlan {
            cwd: CString::new(cwd.as_os_str().as_bytes())
                .map_err(|_| EnvError::invalid("cwd: contains a NUL byte"))?,
            programs,
            argv: argv.iter().map(|a| c(a)).collect::<EnvResult<_>>()?,
            env: env
                .iter()
                .map(|(k, v)| c(&format!("{k}={v}")))
                .collect::<EnvResult<_>>()?,
            ..self.layout_plan()
        })
    }

    /// Starts the next exec's init now, ahead of its command: its clone, maps, root,
    /// layers and cgroup, so that exec only sends its command. Not for a sandbox with
    /// egress (its listener and proxy are per exec) nor a one-shot one; a sandbox holds
    /// one at most.
    pub async fn prepare_exec(&self) -> EnvResult<()> {
        // Counted as running: a cleanup meanwhile waits until the init started here
        // is ended and its cgroup gone.
        let _running = self.running.token();
        let has_one = self.prepared.lock().map_or(true, |slot| slot.is_some());
        if self.egress.is_some() || self.one_shot || self.shutdown.is_cancelled() || has_one {
            return Ok(());
        }
        let plan = ChildPlan {
            late: true,
            ..self.layout_plan()
        };
        let (started, cgroup) = self.start_init(plan).await?;
        let prepared = PreparedExec {
            started: Some(started),
            cgroup,
        };
        let unused = match self.prepared.lock() {
            // Cleaned up meanwhile: ended here (killed, its cgroup removed).
            Ok(_) if self.shutdown.is_cancelled() => Some(prepared),
            Ok(mut slot) if slot.is_none() => slot.replace(prepared),
            _ => Some(prepared),
        };
        if let Some(unused) = unused {
            unused.discard(false).await;
        }
        Ok(())
    }

    /// Clones an exec's init from `plan`, in its cgroup: the clones of the captured
    /// binds it attaches are made here and dropped once it has its own.
    async fn start_init(
        &self,
        mut plan: ChildPlan,
    ) -> EnvResult<(Started, Option<Arc<ExecCgroup>>)> {
        // A detached mount attaches once: an idmapped workspace is cloned per exec.
        let workspace_tree = if self.idmapped {
            let captured = self.workspace_bind_tree();
            let tree = match captured {
                Some(tree) => tree
                    .clone_for_exec()
                    .map_err(|e| format!("open_tree of the captured workspace: {e}"))
                    .and_then(|clone| {
                        crate::idmap::idmapped(
                            clone,
                            &self.workspace,
                            crate::idmap::Mapping::ROOT_WORKSPACE,
                        )
                    }),
                None => crate::idmap::idmapped_tree(&self.workspace),
            }
            .map_err(|e| unavailable("idmapped workspace", e))?;
            plan.workspace_tree = std::os::fd::AsRawFd::as_raw_fd(&tree);
            Some(tree)
        } else {
            None
        };
        // A tmpfs kept in its helper's namespaces (an older kernel): a clone made there
        // for this exec, which the child attaches as it is.
        // (A fork of this process and a wait: off the async threads.)
        let scratch_tree = match &self.scratch {
            Some(scratch) if scratch.cloned_per_exec() => {
                let scratch = scratch.clone();
                tokio::task::spawn_blocking(move || scratch.exec_tree())
                    .await
                    .map_err(|e| unavailable("disk limit", e))?
                    .map_err(|e| unavailable("disk limit", e))?
            }
            _ => None,
        };
        if let Some(tree) = &scratch_tree {
            plan.workspace_tree = std::os::fd::AsRawFd::as_raw_fd(tree);
        }
        // The binds captured at create, cloned for this exec (a detached mount attaches
        // once); the idmapped workspace has its own clone above.
        // The volumes: cloned from their fds (as root).
        let slots = self
            .volumes
            .iter()
            .map(|v| v.slot + 1)
            .fold(self.bind_trees.len(), usize::max);
        let bind_clones = (0..slots)
            .map(|slot| {
                if let Some(volume) = self.volumes.iter().find(|v| v.slot == slot) {
                    return volume.clone_for_exec().map(Some);
                }
                match self.bind_trees.get(slot) {
                    Some(Some(tree)) if !(self.idmapped && slot == self.workspace_bind_slot()) => {
                        tree.clone_for_exec().map(Some).map_err(|e| {
                            unavailable("mount_ns", format!("cloning a captured bind: {e}"))
                        })
                    }
                    _ => Ok(None),
                }
            })
            .collect::<EnvResult<Vec<_>>>()?;
        plan.bind_trees = bind_clones
            .iter()
            .map(|t| t.as_ref().map_or(-1, std::os::fd::AsRawFd::as_raw_fd))
            .collect();
        let cgroup = if self.needs_cgroup() {
            let name = format!(
                "{}-{}",
                sandbox_counter(),
                self.dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            );
            Some(Arc::new(
                ExecCgroup::create(self.cgroup_host, &self.limits, &name)
                    .map_err(|e| unavailable("cgroup", e))?,
            ))
        } else {
            None
        };
        let started = if self.one_shot {
            spawn::start_here(plan, self.ids, cgroup.as_deref())
        } else {
            spawn::start(plan, self.ids, cgroup.clone()).await
        }
        .map_err(|e| unavailable("setup", e))?;
        // The child has its copies (and moved them into place): ours can go.
        drop(workspace_tree);
        drop(scratch_tree);
        drop(bind_clones);
        Ok((started, cgroup))
    }

    /// The workspace's bind source as captured at create, if it was.
    fn workspace_bind_tree(&self) -> Option<&crate::trees::Captured> {
        self.bind_trees
            .get(self.workspace_bind_slot())
            .and_then(Option::as_ref)
    }

    /// The workspace's place among the binds.
    fn workspace_bind_slot(&self) -> usize {
        self.root.layout.mounts[..self.root.layout.workspace_op]
            .iter()
            .filter(|op| matches!(op, crate::child::MountOp::Bind { .. }))
            .count()
    }

    pub(crate) fn absolute_path(&self, path: &Path) -> PathBuf {
        skillbox_env::path::normalize(&self.cwd.join(path))
    }
}

impl NativeSandbox {
    /// The memory bound when it is held as an address-space limit (no memory cgroup
    /// here) rather than a cgroup's.
    fn address_space_bound(&self) -> Option<u64> {
        self.limits
            .memory_bytes
            .filter(|_| !self.cgroup_host.has("memory"))
    }
}

/// The line stderr gets when a command crashed (a signal its runtime raises on a failed
/// reservation: SIGTRAP, SIGABRT, SIGSEGV, SIGBUS) under a memory bound held as
/// `RLIMIT_AS`: address space reserved ahead counts against it though it is never
/// used, and node reserves about 720 MiB before it runs a line.
fn crash_note(program: &str, ending: &Ending, bound: u64) -> Option<String> {
    let Ending::Signaled(signal) = ending else {
        return None;
    };
    let name = match *signal {
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        _ => return None,
    };
    Some(format!(
        "skillbox: {program} crashed ({name}) under a memory bound of {} MiB held as an address-space limit (RLIMIT_AS: no memory cgroup for this user); address space a runtime reserves ahead counts against it (node needs about 720 MiB): raise --memory (1G runs node), or run where a cgroup is delegated (see `skillbox doctor`)\n",
        bound / (1024 * 1024)
    ))
}

fn rlimits(limits: &Limits, host: &cgroup::Host) -> Vec<(libc::__rlimit_resource_t, u64, u64)> {
    let mut out = vec![(libc::RLIMIT_CORE, 0, 0)];
    if let Some(n) = limits.open_files {
        out.push((libc::RLIMIT_NOFILE, n, n));
    }
    if let Some(bytes) = limits.file_size_bytes {
        out.push((libc::RLIMIT_FSIZE, bytes, bytes));
    }
    if let Some(secs) = limits.cpu_seconds {
        // SIGXCPU at the soft limit, SIGKILL one second later.
        out.push((libc::RLIMIT_CPU, secs, secs + 1));
    }
    if let Some(bytes) = limits.memory_bytes.filter(|_| !host.has("memory")) {
        out.push((libc::RLIMIT_AS, bytes, bytes));
    }
    if let Some(n) = limits.pids.filter(|_| !host.has("pids")) {
        out.push((libc::RLIMIT_NPROC, u64::from(n), u64::from(n)));
    }
    out
}

/// Waits for init to exit and reaps it. (Dropping the `InitProcess` instead kills it.)
async fn reap(watch: &AsyncFd<OwnedFd>, init: &mut InitProcess) {
    while !init.try_reap() {
        match watch.readable().await {
            Ok(mut guard) => guard.clear_ready(),
            // Without the watch, poll: a rare fallback, never the normal path.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
        }
    }
}

fn errno_text(errno: i32) -> String {
    std::io::Error::from_raw_os_error(errno).to_string()
}

#[async_trait]
impl Shell for NativeSandbox {
    async fn prepare_next(&self) {
        if let Err(e) = self.prepare_exec().await {
            tracing::debug!(error = %e, "native: the next exec was not prepared");
        }
    }

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
                "native: this sandbox was cleaned up; create a new one",
            ));
        }
        let plan = self.child_plan(&request)?;
        let timeout = request.timeout.unwrap_or(self.limits.timeout());
        let started_at = Instant::now();
        let deadline = tokio::time::Instant::now() + timeout;
        // A prepared init takes the command as it is; one too large for it is started
        // the usual way (and the prepared one kept for a later exec).
        let command = crate::child::late_command(&plan.cwd, &plan.programs, &plan.argv, &plan.env);
        let prepared = match command {
            Some(_) => self.prepared.lock().ok().and_then(|mut slot| slot.take()),
            None => None,
        }
        .and_then(|mut prepared| prepared.waiting().then_some(prepared))
        .and_then(PreparedExec::take);
        let (
            Started {
                mut init,
                stdin,
                stdout,
                stderr,
                error,
                status,
                namespaces,
                egress,
                go: sync,
            },
            cgroup,
        ) = match (prepared, command) {
            (Some((mut started, cgroup)), Some(command)) => {
                if started.go(&command) {
                    (started, cgroup)
                } else {
                    // Gone before its command came: dropped, and a fresh one started.
                    drop(PreparedExec {
                        started: Some(started),
                        cgroup,
                    });
                    self.start_init(plan).await?
                }
            }
            _ => self.start_init(plan).await?,
        };
        // The proxy serves this exec's loopback listener until the exec's task ends.
        let egress_done = match (egress, self.egress.as_ref().map(|e| &e.proxy)) {
            (Some(listener), Some(proxy)) => {
                let listener = std::net::TcpListener::from(listener);
                let listener = tokio::net::TcpListener::from_std(listener)
                    .map_err(|e| unavailable("egress", format!("the proxy's listener: {e}")))?;
                let done = CancellationToken::new();
                let (proxy, until) = (proxy.clone(), done.clone());
                tokio::spawn(async move { proxy.serve_until(listener, until).await });
                Some(done.drop_guard())
            }
            _ => None,
        };
        let spawned_at = Instant::now();
        let spawn_ms = started_at.elapsed().as_millis();
        tracing::debug!(spawn_ms, "native: sandbox cloned");
        let watch = init
            .watch_fd()
            .map_err(|e| EnvError::io(&e, "watch", "sandbox init"))?;
        // SAFETY: the OwnedFd stays open and unchanged inside the AsyncFd until it drops.
        let watch =
            unsafe { AsyncFd::register_with_interest(watch, tokio::io::Interest::READABLE) }
                .map_err(|e| EnvError::io(&e.into(), "watch", "sandbox init"))?;
        let pipe_err = |e: std::io::Error| EnvError::io(&e, "pipe", "sandbox");

        // The error pipe closes when the payload execs (or setup fails): wait for that.
        let mut error = pipe::Receiver::from_owned_fd(error).map_err(pipe_err)?;
        let mut record = Vec::new();
        let setup = tokio::select! {
            read = error.read_to_end(&mut record) => read.map(|_| ()).map_err(pipe_err),
            () = tokio::time::sleep_until(deadline) => Err(EnvError::new(
                ErrorCode::Timeout,
                format!(
                    "native: sandbox setup did not finish before the timeout (clone and maps took {spawn_ms} ms, then {} ms waiting for the exec)",
                    spawned_at.elapsed().as_millis()
                ),
            )),
            () = cancel.cancelled() => Err(EnvError::aborted("exec")),
        };
        let setup = setup.and_then(|()| match read_record(&record) {
            None => Ok(None),
            Some((STEP_EXEC, errno)) => Ok(Some(errno)),
            Some((STEP_CHDIR, errno)) => Err(EnvError::new(
                errno_code(errno),
                format!("cwd {}: {}", plan_cwd(&request, self), errno_text(errno)),
            )),
            Some((step, errno)) => Err(unavailable(
                &layout::describe_step(&self.root.layout, step),
                errno_text(errno),
            )),
        });
        let exec_errno = match setup {
            Ok(exec_errno) => exec_errno,
            Err(e) => {
                init.kill();
                reap(&watch, &mut init).await;
                return Err(e);
            }
        };
        // Init is past its look at the sync pipe (it runs the command, or failed to).
        drop(sync);

        let (tx, stream) = ExecStream::channel();
        let stream = match (init.watch_fd(), namespaces.net) {
            (Ok(pidfd), Some(net)) => {
                let workspace = self
                    .root
                    .mounts
                    .iter()
                    .find(|m| m.sandbox == self.root.workspace)
                    .map(|m| m.fd.clone());
                // Root joins the exec's network namespace directly; anyone else through
                // the user namespace their sandbox runs in.
                // SAFETY: geteuid has no preconditions.
                let user = (unsafe { libc::geteuid() } != 0)
                    .then_some(namespaces.user)
                    .flatten();
                stream.with_connector(Arc::new(crate::connect::NativeConnector::new(
                    init.pid(),
                    pidfd,
                    net,
                    user,
                    workspace,
                )))
            }
            _ => {
                tracing::debug!("native: this exec has no connector");
                stream
            }
        };
        let cap = self.limits.output_bytes;
        let stdout = pipe::Receiver::from_owned_fd(stdout).map_err(pipe_err)?;
        let stderr = pipe::Receiver::from_owned_fd(stderr).map_err(pipe_err)?;
        let stdout_task = tokio::spawn(pump_output(stdout, StreamKind::Stdout, cap, tx.clone()));
        let stderr_task = tokio::spawn(pump_output(stderr, StreamKind::Stderr, cap, tx.clone()));
        match (request.stdin, exec_errno) {
            (Some(input), None) => {
                let mut sink = pipe::Sender::from_owned_fd(stdin).map_err(pipe_err)?;
                tokio::spawn(async move {
                    let _ = sink.write_all(&input).await;
                });
            }
            _ => drop(stdin),
        }
        if let Some(errno) = exec_errno {
            let what = if errno == libc::ENOENT {
                "command not found".to_string()
            } else {
                errno_text(errno)
            };
            let line = format!("skillbox: {}: {what}\n", request.command.to_argv()[0]);
            let _ = tx
                .send(Ok(ExecEvent::Stderr(line.into_bytes().into())))
                .await;
        }
        let cancel = cancel.clone();
        let shutdown = self.shutdown.clone();
        let one_shot = self.one_shot;
        let scratch = self.scratch.clone();
        // What a crash note needs, only where one can be given (not on every exec).
        let crash_note_for = self
            .address_space_bound()
            .map(|bytes| (request.command.to_argv()[0].clone(), bytes));
        self.running.spawn(async move {
            let _egress = egress_done;
            let mut timed_out = false;
            let mut aborted = false;
            // Init writes the payload's wait status, then exits, which kills what is
            // left in the namespace. The status is the answer: the namespaces' teardown
            // after it is not waited for before the exit is reported (it is before the
            // cgroup goes, and before `cleanup` returns).
            let mut status_bytes = [0u8; 4];
            let mut wait_status = None;
            match pipe::Receiver::from_owned_fd(status) {
                Ok(mut status) => tokio::select! {
                    read = status.read_exact(&mut status_bytes) => {
                        wait_status = read.ok().map(|_| i32::from_ne_bytes(status_bytes));
                    }
                    () = tokio::time::sleep_until(deadline) => { timed_out = true; }
                    () = cancel.cancelled() => { aborted = true; }
                    () = shutdown.cancelled() => { aborted = true; }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "native: the status pipe; waiting for init instead");
                    tokio::select! {
                        () = reap(&watch, &mut init) => {}
                        () = tokio::time::sleep_until(deadline) => { timed_out = true; }
                        () = cancel.cancelled() => { aborted = true; }
                        () = shutdown.cancelled() => { aborted = true; }
                    }
                }
            }
            // No status (init was killed, by the OOM killer or us), a timeout or an
            // abort: the whole tree dies now. Otherwise init is on its way out and takes
            // what the command left with it.
            if (wait_status.is_none() || timed_out || aborted) && !init.try_reap() {
                init.kill();
                reap(&watch, &mut init).await;
            }
            let truncated = Truncated {
                stdout: stdout_task.await.unwrap_or(false),
                stderr: stderr_task.await.unwrap_or(false),
            };
            let limit_hit = cgroup.as_ref().and_then(|cg| cg.limit_hit());
            let wrap_up = async move {
                // Init exits right after the status; its cgroup goes once it is gone.
                if !init.try_reap() {
                    reap(&watch, &mut init).await;
                }
                // Removing the cgroup may wait for the kernel to let go: not on this
                // thread.
                if let Some(cgroup) = cgroup {
                    if one_shot {
                        drop(cgroup);
                    } else {
                        let _ = tokio::task::spawn_blocking(move || drop(cgroup)).await;
                    }
                }
            };
            if aborted {
                wrap_up.await;
                let _ = tx.send(Err(EnvError::aborted("exec"))).await;
                return;
            }
            let ending = match (exec_errno, wait_status) {
                (Some(errno), _) => Ending::NotStarted(errno),
                (None, Some(status)) => Ending::from_wait_status(status),
                // Init itself was killed: by us on timeout, or by the OOM killer.
                (None, None) => Ending::Killed,
            };
            // A command that failed with its workspace full ran out of disk (the kernel
            // said ENOSPC; the full tmpfs says why).
            let failed = !matches!(ending, Ending::Exited(0));
            let limit_hit = limit_hit.or_else(|| {
                (failed && scratch.as_ref().is_some_and(|s| s.is_full()))
                    .then_some(skillbox_env::LimitKind::Disk)
            });
            if let Some(note) = crash_note_for
                .as_ref()
                .and_then(|(program, bytes)| crash_note(program, &ending, *bytes))
            {
                let _ = tx.send(Ok(ExecEvent::Stderr(note.into_bytes().into()))).await;
            }
            let output = Ended {
                ending,
                timed_out,
                truncated,
                accounted: limit_hit,
                duration: started_at.elapsed(),
            }
            .output();
            let _ = tx.send(Ok(ExecEvent::Exit(output))).await;
            wrap_up.await;
        });
        Ok(stream)
    }
}

impl Drop for NativeSandbox {
    fn drop(&mut self) {
        if self.cleaned.load(Ordering::SeqCst) {
            return;
        }
        // Dropped without cleanup (a cancelled caller): every running exec kills its
        // namespace tree when it sees this, and the sandbox's own directory goes now.
        self.shutdown.cancel();
        if let Err(e) = skillbox_env::remove::remove_tree(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "native: cannot remove a dropped sandbox");
        }
        if let Some(ca_dir) = &self.egress_dir {
            let _ = skillbox_env::remove::remove_tree(ca_dir);
        }
    }
}

fn plan_cwd(request: &ExecRequest, sandbox: &NativeSandbox) -> String {
    sandbox
        .absolute_path(request.cwd.as_deref().unwrap_or(&sandbox.cwd))
        .display()
        .to_string()
}

#[async_trait]
impl ExecutionEnv for NativeSandbox {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn egress(&self) -> Vec<skillbox_egress::Connection> {
        self.egress
            .as_ref()
            .map(|e| e.proxy.audit().connections())
            .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

    use std::io::Read;

    use skillbox_env::FileSystem;

    use super::*;
    use crate::child::STEP_CGROUP;

    /// Whether the native sandbox runs here; where it cannot, fine only outside CI.
    fn native_available() -> bool {
        let available = crate::probe().available;
        assert!(
            available || !skillbox_env::testkit::require_all(),
            "native sandbox unavailable"
        );
        available
    }

    /// Init that cannot join its cgroup (here: the `tasks` file it is given refuses the
    /// write) stops there and says so: its command never runs, outside the limits or
    /// at all.
    #[test]
    fn init_that_cannot_join_its_cgroup_runs_nothing() {
        if !native_available() {
            return;
        }
        let data = tempfile::tempdir().unwrap();
        let backend = NativeBackend::new(data.path());
        let sandbox = backend
            .create_blocking(SandboxSpec {
                workspace: None,
                ..SandboxSpec::default()
            })
            .unwrap();
        let plan = sandbox
            .child_plan(&ExecRequest::argv(["/bin/echo", "ran"]))
            .unwrap();
        // Open for reading only: init's write of `0` fails with EBADF.
        let tasks = std::fs::File::open("/proc/self/cgroup").unwrap();
        let started = spawn::clone_into_cgroup(
            Box::new(plan),
            sandbox.ids,
            None,
            &[OwnedFd::from(tasks)],
            false,
        );
        match started {
            Ok(mut started) => {
                let mut record = Vec::new();
                std::fs::File::from(started.error.try_clone().unwrap())
                    .read_to_end(&mut record)
                    .unwrap();
                assert_eq!(
                    read_record(&record),
                    Some((STEP_CGROUP, libc::EBADF)),
                    "init names the step that failed"
                );
                // The command's stdout: nothing, and closed (init, its one writer, is
                // gone without forking it).
                let mut out = Vec::new();
                std::fs::File::from(started.stdout.try_clone().unwrap())
                    .read_to_end(&mut out)
                    .unwrap();
                assert!(out.is_empty(), "the command ran: {out:?}");
                while !started.init.try_reap() {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
            }
            // Init failed before the parent's second byte: the parent read why.
            Err(message) => assert!(
                message.contains("cgroup: joining") && message.contains("Bad file descriptor"),
                "{message}"
            ),
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(sandbox.cleanup()).unwrap();
    }

    /// A parent that dies just after it let init go (before init could set its
    /// parent-death signal again after the uid switch, say) leaves an init that runs
    /// nothing: init finds the parent's end of its sync pipe closed and exits.
    #[test]
    fn an_init_whose_parent_is_gone_runs_nothing() {
        if !native_available() {
            return;
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let data = tempfile::tempdir().unwrap();
            let backend = NativeBackend::new(data.path());
            let sandbox = backend.create(SandboxSpec::default()).await.unwrap();
            sandbox.prepare_exec().await.unwrap();
            let prepared = sandbox.prepared.lock().unwrap().take().unwrap();
            let (mut started, _cgroup) = prepared.take().unwrap();
            let plan = sandbox
                .child_plan(&ExecRequest::argv(["/bin/echo", "ran"]))
                .unwrap();
            let command =
                crate::child::late_command(&plan.cwd, &plan.programs, &plan.argv, &plan.env)
                    .unwrap();
            // Stopped, init finds both the command and the closed end when it looks.
            let pid = started.init.pid();
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            assert!(started.go(&command), "the command is sent");
            drop(started.go.take());
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
            let mut out = Vec::new();
            std::fs::File::from(started.stdout.try_clone().unwrap())
                .read_to_end(&mut out)
                .unwrap();
            assert!(out.is_empty(), "the command ran: {out:?}");
            while !started.init.try_reap() {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            drop(started);
            sandbox.cleanup().await.unwrap();
        });
    }
}
