//! A sandbox container's configuration: hardened by default (no network, a read-only
//! root, a non-root user, every capability dropped, `no-new-privileges`, limits), and
//! loosened only where the spec names something (a workspace directory, read-only
//! mounts). The same spec always makes the same config, which is how the pool knows a
//! started container fits a sandbox.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType, ResourcesUlimits};
use skillbox_env::{EnvError, EnvResult, ErrorCode, SandboxSpec, WorkspaceRoot};

use crate::daemon::unavailable;
use crate::runtime::{NR_PRCTL, Runtime};
use crate::{LABEL_OWNER, LABEL_SANDBOX, SANDBOX_UID};

const INIT_PL: &str = include_str!("helpers/init.pl");
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// The workspace tmpfs; its pages count against the container's memory limit too.
const WORKSPACE_BYTES: u64 = 1024 * 1024 * 1024;
/// Host tasks gVisor's sentry needs besides the sandbox's own processes (measured: 64
/// idle, about 8 more per process on the ptrace platform).
const GVISOR_BASE_TASKS: i64 = 256;
const GVISOR_TASKS_PER_PROCESS: i64 = 16;

/// The container's configuration: hardened by default, loosened only where the spec
/// names something (a workspace directory, read-only mounts).
pub(crate) fn container_config(
    runtime: Runtime,
    image: &str,
    owner: &str,
    spec: &SandboxSpec,
) -> EnvResult<ContainerCreateBody> {
    let limits = &spec.limits;
    // The disk bound, split between /workspace and /tmp by the one rule every backend
    // uses; a caller's directory cannot be bounded.
    let split = limits.disk_split();
    if spec.workspace.is_some() && split.is_some() {
        return Err(unavailable(
            "disk limit: a --workdir on the host's filesystem cannot be bounded; run \
             without --disk (the workdir is yours, /tmp keeps its own bound) or without --workdir",
        ));
    }
    let ids = match &spec.workspace {
        None => (SANDBOX_UID, SANDBOX_UID),
        Some(dir) => workspace_owner(runtime, dir)?,
    };
    // A read-write volume is written as its owner: the container runs as that user
    // (one owner for all of them and a workdir; never root).
    let ids = volumes_owner(runtime, spec, ids)?;
    let user = format!("{}:{}", ids.0, ids.1);
    // This runsc (20221219) keeps a tmpfs's size but drops nr_inodes (its mounts show
    // only size=): an inode bound asked for is refused, never run without; the one a
    // disk bound brings by default is left out there (gVisor's inodes live in its own
    // kernel's memory, under the memory limit, not in the host's).
    let keeps_inodes = runtime != Runtime::Runsc;
    if let Some(split) = split
        && split.inodes_asked
        && !keeps_inodes
    {
        return Err(unavailable(
            "gvisor: inode bound: this runsc does not enforce a tmpfs's nr_inodes; run \
             without --inodes (the memory limit still bounds what the sandbox kernel's \
             inodes cost) or use the docker or native backend for it",
        ));
    }
    let inodes = |n: u64| {
        if keeps_inodes {
            format!(",nr_inodes={n}")
        } else {
            String::new()
        }
    };
    let (tmp_bytes, tmp_inodes, workspace_bytes, workspace_inodes) = match split {
        Some(split) => (
            split.tmp_bytes,
            inodes(split.tmp_inodes),
            split.workspace_bytes,
            inodes(split.workspace_inodes),
        ),
        None => (
            limits.tmp_bytes,
            String::new(),
            WORKSPACE_BYTES,
            String::new(),
        ),
    };
    let mut tmpfs = HashMap::from([(
        "/tmp".to_string(),
        format!("rw,exec,nosuid,nodev,size={tmp_bytes}{tmp_inodes},mode=1777"),
    )]);
    let mut mounts = Vec::new();
    match &spec.workspace {
        None => {
            tmpfs.insert(
                spec.root.as_str().into(),
                format!(
                    "rw,exec,nosuid,nodev,size={workspace_bytes}{workspace_inodes},mode=0755,uid={},gid={}",
                    ids.0,
                    ids.1
                ),
            );
        }
        Some(dir) => mounts.push(Mount {
            target: Some(spec.root.as_str().into()),
            source: Some(dir.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        }),
    }
    for mount in &spec.policy.read_only_mounts {
        let target = skillbox_env::path::normalize(&mount.sandbox);
        if !mount.host.is_absolute() || !target.is_absolute() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} -> {}: both paths must be absolute",
                mount.host.display(),
                mount.sandbox.display()
            )));
        }
        if !mount.host.is_dir() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {}: must be an existing directory (a socket or \
                 device would give the code what read-only does not stop)",
                mount.host.display()
            )));
        }
        if target == Path::new("/")
            || target.starts_with(spec.root.as_path())
            || target.starts_with("/tmp")
            || target.starts_with("/proc")
            || target.starts_with("/dev")
        {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} may not be mounted over {}",
                mount.host.display(),
                target.display()
            )));
        }
        mounts.push(Mount {
            target: Some(target.display().to_string()),
            source: Some(mount.host.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(true),
            ..Default::default()
        });
    }
    for volume in &spec.policy.volumes {
        let target = volume_target(volume, &spec.root, &mounts)?;
        mounts.push(Mount {
            target: Some(target.display().to_string()),
            source: Some(volume.host.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(!volume.rw),
            ..Default::default()
        });
    }
    let mut ulimits = Vec::new();
    let mut ulimit = |name: &str, value: u64| {
        let value = i64::try_from(value).unwrap_or(i64::MAX);
        ulimits.push(ResourcesUlimits {
            name: Some(name.into()),
            soft: Some(value),
            hard: Some(value),
        });
    };
    if let Some(size) = limits.file_size_bytes {
        ulimit("fsize", size);
    }
    if let Some(files) = limits.open_files {
        ulimit("nofile", files);
    }
    if let Some(seconds) = limits.cpu_seconds {
        ulimit("cpu", seconds);
    }
    let pids_limit = match (runtime, limits.pids) {
        (_, None) => None,
        (Runtime::Runc, Some(pids)) => Some(i64::from(pids)),
        // Under gVisor the container's pids cgroup counts the sentry's host tasks, not the
        // sandbox's processes: those are bounded by RLIMIT_NPROC, which gVisor enforces in
        // its own kernel (one uid per sandbox there, so per-uid means per-sandbox).
        (Runtime::Runsc, Some(pids)) => {
            ulimit("nproc", u64::from(pids));
            Some(GVISOR_BASE_TASKS + GVISOR_TASKS_PER_PROCESS * i64::from(pids))
        }
    };
    let memory = limits
        .memory_bytes
        .map(|m| i64::try_from(m).unwrap_or(i64::MAX));
    let cpus = limits
        .cpus
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64));
    let host_config = HostConfig {
        network_mode: Some("none".into()),
        readonly_rootfs: Some(true),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges:true".into()]),
        privileged: Some(false),
        ipc_mode: Some("private".into()),
        memory,
        memory_swap: memory,
        nano_cpus: Some((cpus * 1e9) as i64),
        pids_limit,
        ulimits: Some(ulimits),
        tmpfs: Some(tmpfs),
        mounts: Some(mounts),
        runtime: Some(runtime.docker_name().into()),
        // skillbox's own pid 1 (helpers/init.pl) reaps and kills; see the crate docs.
        init: Some(false),
        auto_remove: Some(false),
        ..Default::default()
    };
    let env = vec![
        format!("PATH={PATH}"),
        "HOME=/tmp".into(),
        "USER=sandbox".into(),
        "LOGNAME=sandbox".into(),
        "LANG=C.UTF-8".into(),
        "TMPDIR=/tmp".into(),
        "SHELL=/bin/sh".into(),
    ];
    Ok(ContainerCreateBody {
        image: Some(image.into()),
        user: Some(user),
        // Interpreters by absolute path: no PATH lookup for skillbox's own helpers.
        entrypoint: Some(vec![
            runtime.perl().into(),
            "-e".into(),
            INIT_PL.into(),
            NR_PRCTL.to_string(),
        ]),
        cmd: Some(vec![]),
        working_dir: Some(spec.root.as_str().into()),
        env: Some(env),
        network_disabled: Some(true),
        labels: Some(HashMap::from([
            (LABEL_SANDBOX.to_string(), runtime.backend().to_string()),
            (LABEL_OWNER.to_string(), owner.to_string()),
        ])),
        host_config: Some(host_config),
        ..Default::default()
    })
}

/// Where a volume goes in the container: an absolute path that shares its place with no
/// other mount, never a place the sandbox owns, and a source reached without a symlink
/// on its path (the daemon follows one, after this check: a known limit).
fn volume_target(
    mount: &skillbox_env::Volume,
    root: &WorkspaceRoot,
    mounts: &[Mount],
) -> EnvResult<PathBuf> {
    let invalid = |why: String| {
        EnvError::invalid(format!(
            "policy.volumes: {} -> {}: {why}",
            mount.host.display(),
            mount.sandbox.display()
        ))
        .with_path(&mount.host)
    };
    let target = skillbox_env::path::normalize(&mount.sandbox);
    if !mount.host.is_absolute() || !target.is_absolute() {
        return Err(invalid("both paths must be absolute".into()));
    }
    if target == Path::new("/")
        || [root.as_str(), "/tmp", "/proc", "/dev", "/etc", "/usr"]
            .iter()
            .any(|r| target.starts_with(r))
    {
        return Err(invalid(
            "at or under a directory the sandbox owns or the image holds".into(),
        ));
    }
    if let Some(other) = mounts
        .iter()
        .filter_map(|m| m.target.as_deref())
        .find(|other| target.starts_with(other) || Path::new(other).starts_with(&target))
    {
        return Err(invalid(format!(
            "it shares its place with the mount at {other}"
        )));
    }
    match std::fs::canonicalize(&mount.host) {
        Ok(real) if real.is_dir() && real == skillbox_env::path::normalize(&mount.host) => {
            Ok(target)
        }
        Ok(real) if real.is_dir() => Err(invalid(format!(
            "its path goes through a symlink (it is {}); give the directory's own path",
            real.display()
        ))),
        Ok(_) => Err(invalid("not a directory".into())),
        Err(e) => Err(invalid(e.to_string())),
    }
}

/// The ids a container with read-write volumes runs as: their owner, so what the code
/// writes there is the owner's, as in a workdir. One owner for them all and the
/// workspace (`ids`, the workspace's owner or the sandbox user), and never root.
fn volumes_owner(runtime: Runtime, spec: &SandboxSpec, ids: (u32, u32)) -> EnvResult<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let mut owner: Option<((u32, u32), &Path)> = spec.workspace.as_deref().map(|w| (ids, w));
    for mount in spec.policy.volumes.iter().filter(|v| v.rw) {
        let host = mount.host.as_path();
        let meta = std::fs::metadata(host)
            .map_err(|e| EnvError::io(&e, "read-write volume", host).with_path(host))?;
        let this = (meta.uid(), meta.gid());
        if this.0 == 0 || this.1 == 0 {
            return Err(EnvError::invalid(format!(
                "backend {}: read-write volume {} is owned by {}:{} (root or root's group), and a container never runs as either; \
                 chown it to an unprivileged user and group",
                runtime.backend(),
                host.display(),
                this.0,
                this.1
            ))
            .with_path(host));
        }
        match owner {
            Some((theirs, other)) if theirs != this => {
                return Err(EnvError::invalid(format!(
                    "backend {}: read-write volume {} belongs to {}:{}, and {} to {}:{}; a container runs as one user, \
                     so every directory it writes must have one owner (or use the native backend, which maps each)",
                    runtime.backend(),
                    host.display(),
                    this.0,
                    this.1,
                    other.display(),
                    theirs.0,
                    theirs.1
                ))
                .with_path(host));
            }
            Some(_) => {}
            None => owner = Some((this, host)),
        }
    }
    Ok(owner.map_or(ids, |(ids, _)| ids))
}

/// The user a container with a host workspace runs as: the directory's owner, so what
/// the code writes there is the owner's. Never root.
fn workspace_owner(runtime: Runtime, dir: &Path) -> EnvResult<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(dir).map_err(|e| EnvError::io(&e, "workdir", dir).with_path(dir))?;
    if !meta.is_dir() {
        return Err(EnvError::new(
            ErrorCode::NotDirectory,
            format!("workdir {}: not a directory", dir.display()),
        )
        .with_path(dir));
    }
    if meta.uid() == 0 {
        return Err(EnvError::invalid(format!(
            "backend {}: workdir {} is owned by root, and a container never runs as root;              chown it to an unprivileged user (e.g. `chown {SANDBOX_UID}:{SANDBOX_UID}`) or              leave the workdir out for a tmpfs workspace",
            runtime.backend(),
            dir.display()
        ))
        .with_path(dir));
    }
    // Never root's group either: a directory of it runs as nogroup.
    let gid = if meta.gid() == 0 { 65534 } else { meta.gid() };
    Ok((meta.uid(), gid))
}

#[cfg(test)]
mod tests {
    use skillbox_env::Limits;

    use super::*;

    #[test]
    fn gvisor_refuses_an_inode_bound_it_would_not_hold_and_docker_sets_it() {
        let asked = SandboxSpec {
            limits: Limits {
                disk_inodes: Some(1000),
                ..Limits::default()
            },
            ..SandboxSpec::default()
        };
        let Err(e) = container_config(Runtime::Runsc, "img", "me", &asked) else {
            panic!("runsc took an inode bound it does not enforce");
        };
        assert_eq!(e.code, ErrorCode::Unavailable);
        assert!(e.message.contains("inode"), "{e}");
        let config = container_config(Runtime::Runc, "img", "me", &asked).unwrap();
        let tmpfs = config.host_config.unwrap().tmpfs.unwrap();
        assert!(tmpfs["/workspace"].contains("nr_inodes="), "{tmpfs:?}");
        // The default (derived) bound is left out under runsc, the bytes kept.
        let default = SandboxSpec::default();
        let config = container_config(Runtime::Runsc, "img", "me", &default).unwrap();
        let tmpfs = config.host_config.unwrap().tmpfs.unwrap();
        assert!(!tmpfs["/workspace"].contains("nr_inodes"), "{tmpfs:?}");
        let split = Limits::default().disk_split().unwrap();
        assert!(tmpfs["/workspace"].contains(&format!("size={}", split.workspace_bytes)));
        assert!(tmpfs["/tmp"].contains(&format!("size={}", split.tmp_bytes)));
    }

    #[test]
    fn a_workdir_with_a_disk_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SandboxSpec {
            workspace: Some(dir.path().to_path_buf()),
            ..SandboxSpec::default()
        };
        let Err(e) = container_config(Runtime::Runc, "img", "me", &spec) else {
            panic!("a workdir took a disk bound");
        };
        assert!(e.message.contains("disk limit"), "{e}");
    }

    /// A read-write volume is a writable bind, and the container runs as its owner
    /// (the tmpfs workspace too); volumes of two owners, a root-owned one, one through a
    /// symlink and one over another mount are refused, never run as someone else.
    #[test]
    fn a_read_write_volume_runs_the_container_as_its_owner() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            std::os::unix::fs::chown(&a, Some(4242), Some(4343)).unwrap();
        }
        let meta = std::fs::metadata(&a).unwrap();
        let rw = |host: &Path, sandbox: &str| skillbox_env::Volume {
            host: host.to_path_buf(),
            sandbox: sandbox.into(),
            rw: true,
        };
        let mut spec = SandboxSpec::default();
        spec.policy.volumes.push(rw(&a, "/data"));
        let config = container_config(Runtime::Runc, "img", "me", &spec).unwrap();
        assert_eq!(config.user, Some(format!("{}:{}", meta.uid(), meta.gid())));
        let host = config.host_config.unwrap();
        let tmpfs = host.tmpfs.unwrap();
        assert!(
            tmpfs["/workspace"].contains(&format!("uid={},gid={}", meta.uid(), meta.gid())),
            "{tmpfs:?}"
        );
        let mount = host
            .mounts
            .unwrap()
            .into_iter()
            .find(|m| m.target.as_deref() == Some("/data"))
            .unwrap();
        assert_eq!(mount.read_only, Some(false));
        assert_eq!(mount.source, Some(a.display().to_string()));

        let refused = |spec: &SandboxSpec, words: &str| {
            let Err(e) = container_config(Runtime::Runc, "img", "me", spec) else {
                panic!("taken: {:?}", spec.policy.volumes);
            };
            assert!(e.message.contains(words), "{words}: {e}");
        };
        if root {
            let mut rooted = SandboxSpec::default();
            rooted.policy.volumes.push(rw(&b, "/data"));
            refused(&rooted, "owned by 0:0");
            std::os::unix::fs::chown(&b, Some(4444), Some(4444)).unwrap();
            let mut two = spec.clone();
            two.policy.volumes.push(rw(&b, "/other"));
            refused(&two, "one owner");
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let mut linked = SandboxSpec::default();
        linked.policy.volumes.push(rw(&link, "/data"));
        refused(&linked, "symlink");
        let mut over = spec.clone();
        over.policy.read_only_mounts.push(skillbox_env::Mount {
            host: b.clone(),
            sandbox: "/data/ref".into(),
        });
        refused(&over, "shares its place");
        for place in ["/workspace/x", "/tmp", "/", "/usr/local"] {
            let mut owned = SandboxSpec::default();
            owned.policy.volumes.push(rw(&a, place));
            refused(&owned, "policy.volumes");
        }
    }
}
