//! Making a `NativeSandbox` from a `SandboxSpec`: the sandbox's host ids, its
//! directory and temp workspace (or its own tmpfs), the egress CA, the root's plan, the
//! binds captured once; and sweeping, once per process, what skillbox processes that
//! no longer run left.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use skillbox_env::{
    BackendKind, CancellationToken, EnvError, EnvResult, ErrorCode, Limits, SandboxSpec,
};
use tokio_util::task::TaskTracker;

use crate::cgroup;
use crate::ids::HostIds;
use crate::landlock;
use crate::layout;
use crate::sandbox::{NativeSandbox, cloned_volumes, sandbox_counter, unavailable};

fn seccomp_filter() -> Vec<libc::sock_filter> {
    static FILTER: OnceLock<Vec<libc::sock_filter>> = OnceLock::new();
    FILTER.get_or_init(skillbox_seccomp::filter).clone()
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
pub(crate) fn sweep_once(native_dir: &Path, one_shot: bool, cgroup_host: &'static cgroup::Host) {
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

impl NativeSandbox {
    pub(crate) fn prepare(
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
