//! `NativeSandbox`: a prepared root over one workspace, in which every exec gets a
//! fresh namespace tree. What one holds (the root's plan, its captured binds and the
//! volumes cloned per exec, its tmpfs, its egress proxy, the next exec's init made
//! ahead) and what dropping it undoes. `create` makes one, `exec` runs commands in it,
//! `fs` is its files.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use skillbox_env::{BackendKind, CancellationToken, EnvError, EnvResult, ExecutionEnv, Limits};
use tokio_util::task::TaskTracker;

use crate::cgroup::{self, ExecCgroup};
use crate::ids::HostIds;
use crate::layout::{self, Root};
use crate::spawn::Started;

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
    /// Made by [`NativeBackend::create_blocking`](crate::NativeBackend::create_blocking):
    /// clones and housekeeping block the calling thread instead of handing them to other
    /// threads.
    pub(crate) one_shot: bool,
    pub(crate) cgroup_host: &'static cgroup::Host,
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
    pub(crate) slot: usize,
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
    pub(crate) fn clone_for_exec(&self) -> EnvResult<std::os::fd::OwnedFd> {
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
pub(crate) fn cloned_volumes(root: &layout::Root, ids: HostIds) -> EnvResult<Vec<ClonedVolume>> {
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
    pub(crate) started: Option<Started>,
    pub(crate) cgroup: Option<Arc<ExecCgroup>>,
}

impl PreparedExec {
    /// Whether its init still waits (one killed meanwhile has exited).
    pub(crate) fn waiting(&mut self) -> bool {
        self.started
            .as_mut()
            .is_some_and(|started| !started.init.try_reap())
    }

    pub(crate) fn take(mut self) -> Option<(Started, Option<Arc<ExecCgroup>>)> {
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

/// This process's next number for a name it makes unique: a sandbox's directory, an
/// exec's cgroup.
pub(crate) fn sandbox_counter() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The error for a layer this host cannot give, named.
pub(crate) fn unavailable(layer: &str, detail: impl std::fmt::Display) -> EnvError {
    EnvError::unavailable(format!("native: {layer}: {detail}"))
}

impl NativeSandbox {
    /// The host directory shown as `/workspace`.
    pub fn workspace_dir(&self) -> &Path {
        &self.workspace
    }

    pub(crate) fn absolute_path(&self, path: &Path) -> PathBuf {
        skillbox_env::path::normalize(&self.cwd.join(path))
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
