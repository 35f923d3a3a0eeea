//! What a sandbox's root is made of: the mount table (shared by the child's mount
//! plan and the host-side file view), the synthesized `/etc`, and the layout handed
//! to the child.

use std::ffi::CString;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};
use skillbox_env::{EnvError, Limits, SandboxPolicy, WorkspaceRoot};

use crate::child::{
    Layout, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountOp,
    STAGE,
};
use crate::ids::SANDBOX_ID;
use crate::landlock;
use crate::scratch::Scratch;

/// Top-level host directories shown read-only (or as the symlinks they are).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32",
];
/// Whether every native sandbox shows this host path read-only where it is: inside
/// one of the system directories (through the symlink a merged `/usr` makes of `/bin`
/// and the like). `path` should be canonical: a symlink elsewhere is not followed here.
pub fn shown_read_only(path: &Path) -> bool {
    SYSTEM_DIRS
        .iter()
        .any(|dir| path.starts_with(dir) && path != Path::new(dir))
}

/// Host files and directories shown read-only inside the synthesized `/etc`.
const ETC_PASSTHROUGH: &[&str] = &[
    "/etc/ssl/certs",
    "/etc/alternatives",
    "/etc/ca-certificates",
];
/// Device nodes bound from the host.
pub const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// Directories of terminal devices (ptys) the sandbox may open and ioctl.
pub const TTYS: &[&str] = &["/dev/pts"];
/// Where the sandbox may write besides its workspace.
pub const WRITABLE: &[&str] = &["/tmp", "/dev/shm"];

/// A directory of the host shown in the sandbox, as the host-side file view uses it.
#[derive(Debug)]
pub struct MountEntry {
    pub sandbox: PathBuf,
    pub host: PathBuf,
    pub fd: Arc<OwnedFd>,
    /// The sandbox may write here (the workspace, a read-write volume).
    pub writable: bool,
    /// A read-write volume: written by the sandbox's code, never by the host-side file
    /// view (whose writes go to `/workspace`).
    pub volume: bool,
}

/// A sandbox's root, prepared once and reused by every exec.
#[derive(Debug)]
pub struct Root {
    pub layout: Arc<Layout>,
    /// Where the workspace is in the sandbox (the spec's root).
    pub workspace: PathBuf,
    /// Directory mounts, for the host-side file view (longest prefix wins).
    pub mounts: Vec<MountEntry>,
    /// `/bin` → `/usr/bin` style top-level symlinks.
    pub aliases: Vec<(PathBuf, PathBuf)>,
    /// The volumes' binds, in order.
    pub volumes: Vec<VolumeBind>,
}

/// A volume's bind: where it is in the mount plan and its source, opened without
/// following a symlink.
#[derive(Debug)]
pub struct VolumeBind {
    /// Its index in [`Layout::mounts`].
    pub op: usize,
    pub host: PathBuf,
    pub dir: Arc<OwnedFd>,
    pub rw: bool,
}

fn open_path(path: &Path) -> Result<OwnedFd, EnvError> {
    rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| EnvError::io(&e.into(), "open", path))
}

fn cstring(path: impl AsRef<Path>) -> CString {
    CString::new(path.as_ref().as_os_str().as_bytes()).unwrap_or_default()
}

fn staged(sandbox_path: &Path) -> CString {
    cstring(format!("{STAGE}{}", sandbox_path.display()))
}

/// Adds mkdir ops for every ancestor of `path` (inside the stage).
fn ancestors(ops: &mut Vec<MountOp>, path: &Path) {
    let mut parents: Vec<&Path> = path
        .ancestors()
        .skip(1)
        .filter(|p| *p != Path::new("/"))
        .collect();
    parents.reverse();
    for parent in parents {
        ops.push(MountOp::Dir {
            path: staged(parent),
        });
    }
}

/// Host files shown read-only inside the synthesized `/etc` (bound over empty files).
const ETC_FILES: &[&str] = &["/etc/ld.so.cache", "/etc/ssl/openssl.cnf"];

/// The files of the sandbox's own `/etc`: a passwd with the sandbox user and nothing
/// of the host's accounts, keys or homes.
fn etc_files() -> Vec<(&'static str, String)> {
    let id = SANDBOX_ID;
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\nsandbox:x:{id}:{id}:sandbox:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{id}:\nnogroup:x:65534:\n"),
        ),
        (
            "hosts",
            "127.0.0.1 localhost skillbox\n::1 localhost ip6-localhost\n".into(),
        ),
        ("hostname", "skillbox\n".into()),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nhosts: files\n".into(),
        ),
    ]
}

/// A directory a backend shows at `/etc/NAME` beyond [`ETC_PASSTHROUGH`]: the host's own
/// `/etc/NAME`, or a directory the caller made in its place (a filtered copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcDir {
    /// Where the sandbox sees it: a directory right under `/etc`.
    pub sandbox: &'static str,
    /// What it shows there, read-only; left out when it is not a directory.
    pub host: PathBuf,
}

/// The synthesized `/etc` a sandbox is shown: its directory, and the directories shown
/// in it beyond [`ETC_PASSTHROUGH`] (a backend's own, e.g. fontconfig's and a filtered
/// copy of LibreOffice's for the slide previews' renders; never every sandbox's).
#[derive(Debug, Clone)]
pub struct Etc {
    pub dir: PathBuf,
    pub extra: Arc<[EtcDir]>,
}

/// The synthesized `/etc`, shared read-only by every sandbox with the same `extra`
/// host directories: built once under `native_dir`, named by a hash of its content so
/// a new version never reuses an old one.
pub fn ensure_etc(native_dir: &Path, extra: &Arc<[EtcDir]>) -> std::io::Result<Etc> {
    let extra_names = || extra.iter().map(|e| e.sandbox);
    let files = etc_files();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    // The mount points are made in it too: a new one is a new `/etc`.
    let mount_points = ETC_FILES
        .iter()
        .copied()
        .chain(ETC_PASSTHROUGH.iter().copied())
        .chain(extra_names())
        .map(|p| (p, ""));
    for (name, content) in files
        .iter()
        .map(|(n, c)| (*n, c.as_str()))
        .chain(mount_points)
    {
        for byte in name.bytes().chain(content.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }
    let dir = native_dir.join(format!("etc-{hash:016x}"));
    if dir.is_dir() {
        return Ok(Etc {
            dir,
            extra: extra.clone(),
        });
    }
    skillbox_env::owner::claim(native_dir)?;
    let staging = native_dir.join(skillbox_env::path::temp_name(&format!(
        "{}-etc-",
        skillbox_env::owner::this_process()
    ))?);
    let build = || -> std::io::Result<()> {
        fs::create_dir(&staging)?;
        for (name, content) in &files {
            fs::write(staging.join(name), content)?;
        }
        for mount_point in ETC_FILES {
            let target = staging.join(mount_point.trim_start_matches("/etc/"));
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent)?;
            }
            fs::write(target, "")?;
        }
        for name in ETC_PASSTHROUGH.iter().copied().chain(extra_names()) {
            fs::create_dir_all(staging.join(name.trim_start_matches("/etc/")))?;
        }
        if let Ok(target) = fs::read_link("/etc/localtime") {
            std::os::unix::fs::symlink(target, staging.join("localtime"))?;
        }
        // The sandbox's user reads it: 0755 and 0644 whatever skillbox's umask.
        readable_tree(&staging)
    };
    let built = build().and_then(|()| fs::rename(&staging, &dir));
    if built.is_err() {
        let _ = fs::remove_dir_all(&staging);
        // Another process may have built it first.
        if dir.is_dir() {
            return Ok(Etc {
                dir,
                extra: extra.clone(),
            });
        }
    }
    built.map(|()| Etc {
        dir,
        extra: extra.clone(),
    })
}

/// Gives `dir` and everything in it (symlinks aside) modes a sandbox's user can read:
/// directories 0755, files 0644.
fn readable_tree(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            readable_tree(&entry.path())?;
        } else if kind.is_file() {
            fs::set_permissions(entry.path(), fs::Permissions::from_mode(0o644))?;
        }
    }
    Ok(())
}

/// The workspace: what is shown, and where.
#[derive(Debug, Clone, Copy)]
pub struct Workspace<'a> {
    pub at: &'a WorkspaceRoot,
    pub source: WorkspaceSource<'a>,
}

/// What is shown as the workspace.
#[derive(Debug, Clone, Copy)]
pub enum WorkspaceSource<'a> {
    /// A host directory (the caller's workdir, or a temp one without a disk bound).
    Host(&'a Path),
    /// The sandbox's own tmpfs: each exec clones it (never a host path).
    Scratch(&'a Scratch),
}

/// Plans the root: system dirs, `etc` as `/etc`, `/proc`, `/dev`, `/tmp`, the
/// workspace at its root, and the policy's read-only mounts.
pub fn plan(
    etc: &Etc,
    workspace: Workspace<'_>,
    limits: &Limits,
    policy: &SandboxPolicy,
    landlock_abi: u32,
    rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    seccomp: Vec<libc::sock_filter>,
) -> Result<Root, EnvError> {
    let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let mut ops = Vec::new();
    let mut mounts = Vec::new();
    let mut aliases = Vec::new();
    let mut bind_dir = |ops: &mut Vec<MountOp>,
                        host: &Path,
                        sandbox: &Path,
                        attrs: u64,
                        writable: bool|
     -> Result<(), EnvError> {
        let fd = Arc::new(open_path(host)?);
        ancestors(ops, sandbox);
        ops.push(MountOp::Dir {
            path: staged(sandbox),
        });
        ops.push(MountOp::Bind {
            source: cstring(host),
            target: staged(sandbox),
            attrs,
        });
        mounts.push(MountEntry {
            sandbox: sandbox.to_path_buf(),
            host: host.to_path_buf(),
            fd,
            writable,
            volume: false,
        });
        Ok(())
    };

    for dir in SYSTEM_DIRS {
        let host = Path::new(dir);
        match fs::symlink_metadata(host) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(host).map_err(|e| EnvError::io(&e, "readlink", host))?;
                let resolved = skillbox_env::path::normalize(&Path::new("/").join(&target));
                ops.push(MountOp::Symlink {
                    target: cstring(&target),
                    path: staged(host),
                });
                aliases.push((host.to_path_buf(), resolved));
            }
            Ok(meta) if meta.is_dir() => bind_dir(&mut ops, host, host, ro, false)?,
            _ => {}
        }
    }

    bind_dir(&mut ops, &etc.dir, Path::new("/etc"), ro, false)?;
    if let Some(odd) = etc.extra.iter().find(|dir| {
        !Path::new(dir.sandbox)
            .strip_prefix("/etc")
            .is_ok_and(|name| {
                name.components().count() == 1
                    && name.to_str() == name.file_name().and_then(|n| n.to_str())
            })
    }) {
        return Err(EnvError::invalid(format!(
            "native: {}: only a directory right under /etc is shown there",
            odd.sandbox
        )));
    }
    let passthrough = ETC_PASSTHROUGH
        .iter()
        .map(|dir| (Path::new(dir), Path::new(dir)));
    let extra = etc
        .extra
        .iter()
        .map(|dir| (dir.host.as_path(), Path::new(dir.sandbox)));
    for (host, sandbox) in passthrough.chain(extra) {
        if host.is_dir() {
            bind_dir(&mut ops, host, sandbox, ro, false)?;
        }
    }
    for host in ETC_FILES {
        let host = Path::new(host);
        if host.is_file() {
            ops.push(MountOp::Bind {
                source: cstring(host),
                target: staged(host),
                attrs: ro,
            });
        }
    }

    ops.push(MountOp::Dir {
        path: staged(Path::new("/proc")),
    });
    ops.push(MountOp::Proc {
        target: staged(Path::new("/proc")),
    });

    let dev = Path::new("/dev");
    ops.push(MountOp::Dir { path: staged(dev) });
    ops.push(MountOp::Tmpfs {
        target: staged(dev),
        options: cstring("mode=0755,size=64k"),
    });
    for device in DEVICES {
        let host = Path::new(device);
        ops.push(MountOp::File { path: staged(host) });
        ops.push(MountOp::Bind {
            source: cstring(host),
            target: staged(host),
            attrs: MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(MountOp::Symlink {
            target: cstring(target),
            path: staged(&dev.join(name)),
        });
    }
    ops.push(MountOp::Dir {
        path: staged(&dev.join("pts")),
    });
    ops.push(MountOp::Devpts {
        target: staged(&dev.join("pts")),
    });
    ops.push(MountOp::Symlink {
        target: cstring("pts/ptmx"),
        path: staged(&dev.join("ptmx")),
    });
    let shm_bytes = limits.tmp_bytes.min(64 * 1024 * 1024);
    ops.push(MountOp::Dir {
        path: staged(&dev.join("shm")),
    });
    ops.push(MountOp::Tmpfs {
        target: staged(&dev.join("shm")),
        options: cstring(format!("mode=1777,size={shm_bytes}")),
    });

    let tmp = Path::new("/tmp");
    ops.push(MountOp::Dir { path: staged(tmp) });
    ops.push(MountOp::Tmpfs {
        target: staged(tmp),
        options: cstring(tmp_options(limits)),
    });

    let workspace_attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let mut scratch_entry = None;
    let root = workspace.at;
    match workspace.source {
        WorkspaceSource::Host(host) => {
            bind_dir(&mut ops, host, root.as_path(), workspace_attrs, true)?;
        }
        WorkspaceSource::Scratch(scratch) => {
            let sandbox = root.as_path();
            ancestors(&mut ops, sandbox);
            ops.push(MountOp::Dir {
                path: staged(sandbox),
            });
            // No source path: the child clones the sandbox's tmpfs by fd, and an empty
            // path could never be looked up instead.
            ops.push(MountOp::Bind {
                source: CString::default(),
                target: staged(sandbox),
                attrs: workspace_attrs,
            });
            let fd = scratch
                .try_clone_fd()
                .map_err(|e| EnvError::io(&e, "dup", Path::new("the sandbox's tmpfs")))?;
            scratch_entry = Some(MountEntry {
                sandbox: sandbox.to_path_buf(),
                // A detached mount resolves to paths from its own root.
                host: PathBuf::from("/"),
                fd: Arc::new(fd),
                writable: true,
                volume: false,
            });
        }
    }
    let workspace_op = ops.len() - 1;

    for mount in &policy.read_only_mounts {
        let sandbox = skillbox_env::path::normalize(&mount.sandbox);
        if !mount.sandbox.is_absolute() || !mount.host.is_absolute() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} -> {}: both paths must be absolute",
                mount.host.display(),
                mount.sandbox.display()
            )));
        }
        // Never at or under a directory the sandbox writes or the kernel fills: init
        // would build the mount point through paths the payload controls.
        let reserved = ["/proc", "/dev", "/tmp", root.as_str()];
        if sandbox == Path::new("/") || reserved.iter().any(|r| sandbox.starts_with(r)) {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} is at or under a directory the sandbox owns (/, /proc, /dev, /tmp, {root})",
                sandbox.display()
            )));
        }
        if !mount.host.is_dir() {
            return Err(EnvError::invalid(format!(
                "policy.readOnlyMounts: {} is not a directory on the host",
                mount.host.display()
            ))
            .with_path(&mount.host));
        }
        bind_dir(&mut ops, &mount.host, &sandbox, ro, false)?;
    }

    let mut writable: Vec<String> = std::iter::once(root.as_str())
        .chain(WRITABLE.iter().copied())
        .map(str::to_string)
        .collect();
    let mut volumes = Vec::new();
    for volume in &policy.volumes {
        let sandbox = volume_target(volume, root, &mounts, &aliases)?;
        let fd = Arc::new(open_volume(volume)?);
        ancestors(&mut ops, &sandbox);
        ops.push(MountOp::Dir {
            path: staged(&sandbox),
        });
        volumes.push(VolumeBind {
            op: ops.len(),
            host: volume.host.clone(),
            dir: fd.clone(),
            rw: volume.rw,
        });
        ops.push(MountOp::Bind {
            source: cstring(&volume.host),
            target: staged(&sandbox),
            attrs: if volume.rw { workspace_attrs } else { ro },
        });
        if volume.rw {
            writable.push(sandbox.display().to_string());
        }
        mounts.push(MountEntry {
            sandbox,
            host: volume.host.clone(),
            fd,
            writable: volume.rw,
            volume: volume.rw,
        });
    }
    let writable: Vec<&str> = writable.iter().map(String::as_str).collect();

    let binds = ops
        .iter()
        .filter(|op| matches!(op, MountOp::Bind { .. }))
        .count();
    if binds > crate::child::MAX_BINDS {
        return Err(EnvError::invalid(format!(
            "policy mounts: too many mounts ({binds} binds, at most {})",
            crate::child::MAX_BINDS
        )));
    }
    let layout = Layout {
        mounts: ops,
        root_options: cstring("mode=0755,size=1m"),
        seal: vec![cstring("/"), cstring("/dev")],
        hostname: cstring("skillbox"),
        rlimits,
        landlock: landlock::Plan::sandbox(
            landlock_abi,
            &writable,
            DEVICES,
            TTYS,
            &policy.listen_ports,
            if policy.wants_egress() {
                &[crate::egress::EGRESS_PORT][..]
            } else {
                &[]
            },
        ),
        seccomp,
        workspace_op,
    };
    mounts.extend(scratch_entry);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.sandbox.as_os_str().len()));
    Ok(Root {
        layout: Arc::new(layout),
        workspace: root.as_path().to_path_buf(),
        mounts,
        aliases,
        volumes,
    })
}

/// Where a volume goes in the sandbox: an absolute path that shares its place with no
/// other mount (one inside it would be made in the host's directory, by paths the code
/// controls; one over it would hide it), never a place the sandbox owns or the kernel
/// fills, and never through one of the root's symlinks.
fn volume_target(
    mount: &skillbox_env::Volume,
    root: &WorkspaceRoot,
    mounts: &[MountEntry],
    aliases: &[(PathBuf, PathBuf)],
) -> Result<PathBuf, EnvError> {
    let invalid = |why: String| {
        EnvError::invalid(format!(
            "policy.volumes: {} -> {}: {why}",
            mount.host.display(),
            mount.sandbox.display()
        ))
    };
    if !mount.sandbox.is_absolute() || !mount.host.is_absolute() {
        return Err(invalid("both paths must be absolute".into()));
    }
    let sandbox = skillbox_env::path::normalize(&mount.sandbox);
    let reserved = ["/proc", "/dev", "/tmp", root.as_str(), "/etc"];
    if sandbox == Path::new("/") || reserved.iter().any(|r| sandbox.starts_with(r)) {
        return Err(invalid(format!(
            "at or under a directory the sandbox owns (/, /proc, /dev, /tmp, {root}, /etc)"
        )));
    }
    let nested = |other: &Path| sandbox.starts_with(other) || other.starts_with(&sandbox);
    if let Some(other) = mounts.iter().find(|m| nested(&m.sandbox)) {
        return Err(invalid(format!(
            "it shares its place with the mount at {}",
            other.sandbox.display()
        )));
    }
    if let Some((alias, _)) = aliases.iter().find(|(alias, _)| sandbox.starts_with(alias)) {
        return Err(invalid(format!(
            "{} is a symlink in the sandbox",
            alias.display()
        )));
    }
    Ok(sandbox)
}

/// A volume's source, opened without following a symlink anywhere on its path (a
/// sandbox that writes where one sits could have planted it), and never a read-write
/// one root or root's group owns (the sandbox would be root in it).
fn open_volume(volume: &skillbox_env::Volume) -> Result<OwnedFd, EnvError> {
    use rustix::fs::ResolveFlags;
    let host = &volume.host;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let dir = rustix::fs::openat2(
        rustix::fs::CWD,
        host,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )
    .map_err(|e| {
        let why = match e {
            rustix::io::Errno::LOOP => {
                "a symlink on its path (give the directory's own path)".to_string()
            }
            rustix::io::Errno::NOTDIR => "not a directory".to_string(),
            e => std::io::Error::from(e).to_string(),
        };
        EnvError::invalid(format!("policy.volumes: {}: {why}", host.display())).with_path(host)
    })?;
    if volume.rw {
        let stat = rustix::fs::fstat(&dir).map_err(|e| EnvError::io(&e.into(), "stat", host))?;
        if stat.st_uid == 0 || stat.st_gid == 0 {
            return Err(EnvError::invalid(format!(
                "policy.volumes: {}: owned by {}:{}; a read-write volume is never written as root or root's group",
                host.display(),
                stat.st_uid,
                stat.st_gid
            ))
            .with_path(host));
        }
    }
    Ok(dir)
}

/// The options of the per-exec `/tmp`: its share of the disk bound, in bytes and inodes.
fn tmp_options(limits: &Limits) -> String {
    match limits.disk_split() {
        Some(split) => format!(
            "mode=1777,size={},nr_inodes={}",
            split.tmp_bytes, split.tmp_inodes
        ),
        None => format!("mode=1777,size={}", limits.tmp_bytes),
    }
}

/// Describes a failed child step for an `unavailable` error.
pub fn describe_step(layout: &Layout, step: u32) -> String {
    use crate::child::*;
    match step {
        STEP_MOUNT_PRIVATE => "mount_ns: making mounts private".into(),
        STEP_ROOT_TMPFS => "mount_ns: mounting the root tmpfs".into(),
        STEP_PIVOT => "mount_ns: pivot_root into the new root".into(),
        STEP_ROOT_READONLY => {
            "mount_ns: sealing the root read-only (mount_setattr, Linux 5.12+)".into()
        }
        STEP_HOSTNAME => "uts_ns: setting the hostname".into(),
        STEP_LOOPBACK => "net_ns: bringing up loopback".into(),
        STEP_RLIMIT => "rlimits: setrlimit".into(),
        STEP_NO_NEW_PRIVS => "no_new_privs".into(),
        STEP_LANDLOCK => "landlock: applying the ruleset".into(),
        STEP_CAPS => "capabilities: dropping".into(),
        STEP_SECCOMP => "seccomp: installing the filter".into(),
        STEP_FORK => "pid_ns: forking the payload".into(),
        STEP_STDIO => "stdio: dup2".into(),
        STEP_IDS => "user_ns: switching to the sandbox user".into(),
        STEP_CLOSE_FDS => "fds: close_range (Linux 5.9+)".into(),
        STEP_CGROUP => "cgroup: joining the exec's cgroup v1 leaves (writing to tasks)".into(),
        STEP_CGROUP_NS => "cgroup_ns: a namespace rooted at the exec's own cgroups".into(),
        n if n >= STEP_OPEN_TREE => match layout.mounts.get((n - STEP_OPEN_TREE) as usize) {
            Some(MountOp::Bind { source, .. }) if source.is_empty() => {
                "mount_ns: cloning the sandbox's tmpfs as /workspace (open_tree of a detached mount)".into()
            }
            Some(MountOp::Bind { source, .. }) => format!(
                "mount_ns: open_tree {} (Linux 5.2+)",
                source.to_string_lossy()
            ),
            _ => "mount_ns: open_tree".into(),
        },
        n if n >= STEP_MOUNT => match layout.mounts.get((n - STEP_MOUNT) as usize) {
            Some(op) => format!("mount_ns: {}", describe_op(op)),
            None => "mount_ns: unknown mount".into(),
        },
        _ => format!("sandbox setup step {step}"),
    }
}

fn describe_op(op: &MountOp) -> String {
    // Once: the stage is /tmp, and /tmp itself is staged as /tmp/tmp.
    let s = |c: &CString| {
        let text = c.to_string_lossy();
        text.strip_prefix(STAGE).unwrap_or(&text).to_string()
    };
    match op {
        MountOp::Dir { path } => format!("mkdir {}", s(path)),
        MountOp::File { path } => format!("create mount point {}", s(path)),
        MountOp::Symlink { path, .. } => format!("symlink {}", s(path)),
        MountOp::Bind { target, .. } => format!("bind mount {}", s(target)),
        MountOp::Tmpfs { target, .. } => format!("tmpfs {}", s(target)),
        MountOp::Proc { target } => format!("proc on {}", s(target)),
        MountOp::Devpts { target } => format!("devpts on {}", s(target)),
    }
}

#[cfg(test)]
mod tests {
    //! The setup plan as data: what a sandbox of a given spec mounts, checked without
    //! root and without making anything.

    use super::*;
    use skillbox_env::{Mount, Volume};

    fn shown(c: &CString) -> String {
        let text = c.to_string_lossy();
        text.strip_prefix(STAGE).unwrap_or(&text).to_string()
    }

    /// Each bind as (source, target in the sandbox, attrs); each tmpfs as (target, options).
    fn binds(root: &Root) -> Vec<(String, String, u64)> {
        root.layout
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::Bind {
                    source,
                    target,
                    attrs,
                } => Some((source.to_string_lossy().into_owned(), shown(target), *attrs)),
                _ => None,
            })
            .collect()
    }

    fn tmpfs(root: &Root) -> Vec<(String, String)> {
        root.layout
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::Tmpfs { target, options } => {
                    Some((shown(target), options.to_string_lossy().into_owned()))
                }
                _ => None,
            })
            .collect()
    }

    fn planned(
        limits: &Limits,
        policy: &SandboxPolicy,
    ) -> (tempfile::TempDir, Result<Root, EnvError>) {
        planned_with_etc(limits, policy, &[])
    }

    fn planned_with_etc(
        limits: &Limits,
        policy: &SandboxPolicy,
        extra: &'static [&'static str],
    ) -> (tempfile::TempDir, Result<Root, EnvError>) {
        let extra: Arc<[EtcDir]> = extra
            .iter()
            .map(|dir| EtcDir {
                sandbox: dir,
                host: PathBuf::from(dir),
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        let workspace = dir.path().join("ws");
        fs::create_dir(&etc).unwrap();
        fs::create_dir(&workspace).unwrap();
        let etc = Etc { dir: etc, extra };
        let root = plan(
            &etc,
            Workspace {
                at: &WorkspaceRoot::default(),
                source: WorkspaceSource::Host(&workspace),
            },
            limits,
            policy,
            1,
            Vec::new(),
            Vec::new(),
        );
        (dir, root)
    }

    /// A backend's own `/etc` directories are shown in its sandboxes, read-only, and in
    /// no other's; only a directory right under `/etc` is taken.
    #[test]
    fn a_backend_s_own_etc_dirs_are_shown_only_in_its_sandboxes() {
        let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        let (_dir, root) = planned(&Limits::default(), &SandboxPolicy::default());
        let shown = binds(&root.unwrap());
        assert!(
            !shown.iter().any(|(s, _, _)| s == "/etc/fonts"),
            "{shown:?}"
        );
        // /etc/ssl is on every host this runs on; /etc/fonts may not be.
        let (_dir, root) =
            planned_with_etc(&Limits::default(), &SandboxPolicy::default(), &["/etc/ssl"]);
        let shown = binds(&root.unwrap());
        assert!(
            shown
                .iter()
                .any(|(s, t, a)| s == "/etc/ssl" && t == "/etc/ssl" && *a == ro),
            "{shown:?}"
        );
        // A directory the caller made, shown in place of the host's own.
        let made = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::create_dir(dir.path().join("ws")).unwrap();
        let etc = Etc {
            dir: dir.path().join("etc"),
            extra: Arc::new([EtcDir {
                sandbox: "/etc/libreoffice",
                host: made.path().to_path_buf(),
            }]),
        };
        let root = plan(
            &etc,
            Workspace {
                at: &WorkspaceRoot::default(),
                source: WorkspaceSource::Host(&dir.path().join("ws")),
            },
            &Limits::default(),
            &SandboxPolicy::default(),
            1,
            Vec::new(),
            Vec::new(),
        );
        let shown = binds(&root.unwrap());
        let made = made.path().display().to_string();
        assert!(
            shown
                .iter()
                .any(|(s, t, a)| s == &made && t == "/etc/libreoffice" && *a == ro),
            "{shown:?}"
        );
        assert!(
            !shown.iter().any(|(s, _, _)| s == "/etc/libreoffice"),
            "{shown:?}"
        );
        for odd in [
            &["/etc/../root"][..],
            &["/etc"],
            &["/etc/ssl/certs"],
            &["/home/x"],
        ] {
            let (_dir, root) = planned_with_etc(&Limits::default(), &SandboxPolicy::default(), odd);
            assert!(root.is_err(), "{odd:?} was taken");
        }
    }

    #[test]
    fn the_workspace_is_the_one_writable_bind_and_system_dirs_are_read_only() {
        let (dir, root) = planned(&Limits::default(), &SandboxPolicy::default());
        let root = root.unwrap();
        let ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        let binds = binds(&root);
        let workspace = dir.path().join("ws").display().to_string();
        let writable: Vec<_> = binds
            .iter()
            .filter(|(_, _, a)| a & MOUNT_ATTR_RDONLY == 0)
            .collect();
        // The workspace, and the device nodes (which are files, not directories).
        for (source, target, attrs) in &writable {
            assert!(
                (source == &workspace && target == "/workspace")
                    || DEVICES.contains(&target.as_str()),
                "{source} -> {target} is writable"
            );
            assert_ne!(attrs & MOUNT_ATTR_NOSUID, 0, "{target} without nosuid");
        }
        assert!(binds.iter().any(|(_, t, a)| t == "/etc" && *a == ro));
        assert!(
            binds
                .iter()
                .any(|(s, t, a)| s == "/usr" && t == "/usr" && *a == ro)
        );
        assert!(matches!(
            &root.layout.mounts[root.layout.workspace_op],
            MountOp::Bind { target, .. } if shown(target) == "/workspace"
        ));
        // Nothing of the host's /etc, /root or /home.
        for (source, _, _) in &binds {
            assert!(
                !(source == "/etc" || source.starts_with("/root") || source.starts_with("/home")),
                "{source} is shown"
            );
        }
    }

    /// Another root: the workspace is bound there, its parents made on the sandbox's
    /// own root, and it is the writable place; nothing is at `/workspace`.
    #[test]
    fn another_root_is_where_the_workspace_is_bound_and_written() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("etc")).unwrap();
        fs::create_dir(dir.path().join("ws")).unwrap();
        let etc = Etc {
            dir: dir.path().join("etc"),
            extra: Arc::new([]),
        };
        let root = WorkspaceRoot::new("/home/agentscope/workspace").unwrap();
        let plan = plan(
            &etc,
            Workspace {
                at: &root,
                source: WorkspaceSource::Host(&dir.path().join("ws")),
            },
            &Limits::default(),
            &SandboxPolicy::default(),
            1,
            Vec::new(),
            Vec::new(),
        )
        .unwrap();
        assert!(matches!(
            &plan.layout.mounts[plan.layout.workspace_op],
            MountOp::Bind { target, .. } if shown(target) == "/home/agentscope/workspace"
        ));
        let dirs: Vec<String> = plan
            .layout
            .mounts
            .iter()
            .filter_map(|op| match op {
                MountOp::Dir { path } => Some(shown(path)),
                _ => None,
            })
            .collect();
        for made in ["/home", "/home/agentscope", "/home/agentscope/workspace"] {
            assert!(dirs.iter().any(|d| d == made), "{made}: {dirs:?}");
        }
        assert!(!binds(&plan).iter().any(|(_, t, _)| t == "/workspace"));
        let writable: Vec<String> = plan
            .layout
            .landlock
            .rules
            .iter()
            .filter(|r| r.access & landlock::ACCESS_FS_WRITE_FILE != 0)
            .map(|r| r.path.to_string_lossy().into_owned())
            .filter(|p| !DEVICES.contains(&p.as_str()) && !TTYS.contains(&p.as_str()))
            .collect();
        assert_eq!(writable, ["/home/agentscope/workspace", "/tmp", "/dev/shm"]);
        assert_eq!(plan.workspace, Path::new("/home/agentscope/workspace"));
    }

    #[test]
    fn tmp_gets_its_share_of_the_disk_bound_in_bytes_and_inodes() {
        let limits = Limits {
            disk_bytes: Some(64 << 20),
            disk_inodes: Some(4096),
            tmp_bytes: 256 << 20,
            ..Limits::default()
        };
        let (_dir, root) = planned(&limits, &SandboxPolicy::default());
        let split = limits.disk_split().unwrap();
        let tmp = tmpfs(&root.unwrap());
        let options = &tmp.iter().find(|(t, _)| t == "/tmp").unwrap().1;
        assert_eq!(
            options,
            &format!(
                "mode=1777,size={},nr_inodes={}",
                split.tmp_bytes, split.tmp_inodes
            )
        );
        let unbounded = Limits {
            disk_bytes: None,
            ..Limits::default()
        };
        let (_dir, root) = planned(&unbounded, &SandboxPolicy::default());
        let tmp = tmpfs(&root.unwrap());
        let options = &tmp.iter().find(|(t, _)| t == "/tmp").unwrap().1;
        assert_eq!(options, &format!("mode=1777,size={}", unbounded.tmp_bytes));
    }

    /// A volume is a bind alone at its place; a read-write one is writable (never
    /// setuid, never a device), Landlock lets the sandbox write beneath it and nowhere
    /// new besides, and the file view does not write there; a read-only one stays
    /// read-only. Neither is reached through a symlink, and a read-write one root owns
    /// is refused.
    #[test]
    fn a_volume_is_alone_at_its_place_and_writable_only_when_read_write() {
        let volume = tempfile::tempdir().unwrap();
        let extra = tempfile::tempdir().unwrap();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            std::os::unix::fs::chown(volume.path(), Some(4242), Some(4242)).unwrap();
        }
        let policy = |sandbox: &str| SandboxPolicy {
            read_only_mounts: vec![Mount {
                host: extra.path().to_path_buf(),
                sandbox: "/ref".into(),
            }],
            volumes: vec![
                Volume {
                    host: volume.path().to_path_buf(),
                    sandbox: sandbox.into(),
                    rw: true,
                },
                Volume {
                    host: extra.path().to_path_buf(),
                    sandbox: "/seen".into(),
                    rw: false,
                },
            ],
            ..SandboxPolicy::default()
        };
        let (_dir, root_plan) = planned(&Limits::default(), &policy("/data"));
        let plan = root_plan.unwrap();
        let binds = binds(&plan);
        let (source, _, attrs) = binds.iter().find(|(_, t, _)| t == "/data").unwrap();
        assert_eq!(source, &volume.path().display().to_string());
        assert_eq!(*attrs, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
        let (_, _, attrs) = binds.iter().find(|(_, t, _)| t == "/seen").unwrap();
        assert_eq!(
            *attrs,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV
        );
        let writable: Vec<String> = plan
            .layout
            .landlock
            .rules
            .iter()
            .filter(|r| r.access & landlock::ACCESS_FS_WRITE_FILE != 0)
            .map(|r| r.path.to_string_lossy().into_owned())
            .filter(|p| !DEVICES.contains(&p.as_str()) && !TTYS.contains(&p.as_str()))
            .collect();
        let mut expected: Vec<String> = std::iter::once("/workspace")
            .chain(WRITABLE.iter().copied())
            .map(str::to_string)
            .collect();
        expected.push("/data".into());
        assert_eq!(writable, expected);
        let entry = plan
            .mounts
            .iter()
            .find(|m| m.sandbox == Path::new("/data"))
            .unwrap();
        assert!(entry.writable && entry.volume);
        let seen = plan
            .mounts
            .iter()
            .find(|m| m.sandbox == Path::new("/seen"))
            .unwrap();
        assert!(!seen.writable && !seen.volume);
        assert_eq!(plan.volumes.len(), 2);
        assert!(matches!(
            &plan.layout.mounts[plan.volumes[0].op],
            MountOp::Bind { target, .. } if shown(target) == "/data"
        ));

        for bad in [
            "/",
            "/tmp/x",
            "/workspace/a",
            "/proc/x",
            "/dev/x",
            "/etc/x",
            "/usr/local/x",
            "/usr",
            "/ref",
            "/ref/inner",
            "/seen/x",
            "/bin/x",
            "relative",
        ] {
            let (_dir, plan) = planned(&Limits::default(), &policy(bad));
            let err = plan.unwrap_err();
            assert!(err.message.contains("policy.volumes"), "{bad}: {err}");
        }

        // A source reached through a symlink is refused, never followed.
        let link = extra.path().join("link");
        std::os::unix::fs::symlink(volume.path(), &link).unwrap();
        for rw in [true, false] {
            let linked = SandboxPolicy {
                volumes: vec![Volume {
                    host: link.clone(),
                    sandbox: "/data".into(),
                    rw,
                }],
                ..SandboxPolicy::default()
            };
            let (_dir, plan) = planned(&Limits::default(), &linked);
            let err = plan.unwrap_err();
            assert!(err.message.contains("symlink"), "{err}");
        }
        // Root's, read-write: refused (the sandbox would be root in it).
        if root {
            let rooted = SandboxPolicy {
                volumes: vec![Volume {
                    host: extra.path().to_path_buf(),
                    sandbox: "/data".into(),
                    rw: true,
                }],
                ..SandboxPolicy::default()
            };
            let (_dir, plan) = planned(&Limits::default(), &rooted);
            let err = plan.unwrap_err();
            assert!(err.message.contains("owned by 0:0"), "{err}");
        }
    }

    #[test]
    fn policy_mounts_are_read_only_and_never_where_the_sandbox_writes() {
        let extra = tempfile::tempdir().unwrap();
        let policy = |sandbox: &str| SandboxPolicy {
            read_only_mounts: vec![Mount {
                host: extra.path().to_path_buf(),
                sandbox: sandbox.into(),
            }],
            ..SandboxPolicy::default()
        };
        let (_dir, root) = planned(&Limits::default(), &policy("/node_modules"));
        let binds = binds(&root.unwrap());
        let (_, _, attrs) = binds.iter().find(|(_, t, _)| t == "/node_modules").unwrap();
        assert_ne!(attrs & MOUNT_ATTR_RDONLY, 0);
        for bad in [
            "/",
            "/tmp/x",
            "/workspace",
            "/workspace/a",
            "/proc/x",
            "/dev/x",
        ] {
            let (_dir, root) = planned(&Limits::default(), &policy(bad));
            let err = root.unwrap_err();
            assert!(err.message.contains("readOnlyMounts"), "{bad}: {err}");
        }
        let (_dir, root) = planned(&Limits::default(), &policy("relative"));
        assert!(root.is_err());
    }
}
