//! Idmapped mounts, as root: a root-owned workspace, and a read-write volume owned by
//! another (never root) user than the sandbox's host ids. The sandbox (host uid 65534 for a
//! root-owned workspace) sees the directory's owner's files as its own, and what it
//! writes lands on disk owned by that owner. The directory stays its owner's, and
//! sandboxed code still never runs as host root. (Seccomp refuses setuid/setgid modes,
//! so nothing it writes there can become a setuid file.)

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::OnceLock;

const OPEN_TREE_CLONE: u32 = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// On-disk owner → the sandbox's host ids, for one idmapped mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mapping {
    /// The owner on disk (uid, gid), seen by the sandbox as its own.
    pub disk: (u32, u32),
    /// The sandbox's ids on the host (uid, gid).
    pub sandbox: (u32, u32),
}

impl Mapping {
    /// A root-owned workspace, for the sandbox as host uid 65534.
    pub const ROOT_WORKSPACE: Mapping = Mapping {
        disk: (0, 0),
        sandbox: (65534, 65534),
    };
}

/// The most mappings kept: one per distinct owner of an idmapped mount; past it a
/// mapping's namespace is made for the one mount and dropped with it.
const KEPT: usize = 64;

/// A user namespace mapping `mapping.disk` to `mapping.sandbox`, kept per process.
fn userns(mapping: Mapping) -> Result<std::sync::Arc<OwnedFd>, String> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};
    static KEPT_NS: OnceLock<Mutex<HashMap<Mapping, Arc<OwnedFd>>>> = OnceLock::new();
    let kept = KEPT_NS.get_or_init(Default::default);
    if let Some(ns) = kept.lock().ok().and_then(|k| k.get(&mapping).cloned()) {
        return Ok(ns);
    }
    let ns = Arc::new(make_userns_with(mapping, |_| {})?);
    if let Ok(mut kept) = kept.lock()
        && kept.len() < KEPT
    {
        return Ok(kept.entry(mapping).or_insert(ns).clone());
    }
    Ok(ns)
}

/// A user namespace mapping `mapping`, calling `cloned` with the helper's pid right
/// after it is made.
fn make_userns_with(mapping: Mapping, cloned: impl FnOnce(i32)) -> Result<OwnedFd, String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fresh fds owned here.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: a fork-like clone into a new user namespace; the child only closes its
    // copy of the write end, blocks on a read of the pipe and exits (raw syscalls,
    // nothing else).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        let mut byte = 0u8;
        // SAFETY: child: with only the parent holding the write end, the read ends at
        // EOF when the parent drops it, or dies however it dies (a SIGKILL included):
        // the helper never outlives its parent. Then exit without unwinding.
        unsafe {
            libc::close(write.as_raw_fd());
            libc::read(read.as_raw_fd(), (&mut byte as *mut u8).cast(), 1);
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return Err(format!(
            "clone a user namespace: {}",
            std::io::Error::last_os_error()
        ));
    }
    cloned(pid as i32);
    let result = (|| -> std::io::Result<OwnedFd> {
        let ((uid, gid), (to_uid, to_gid)) = (mapping.disk, mapping.sandbox);
        fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("{uid} {to_uid} 1\n"),
        )?;
        fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("{gid} {to_gid} 1\n"),
        )?;
        Ok(OwnedFd::from(fs::File::open(format!(
            "/proc/{pid}/ns/user"
        ))?))
    })();
    // The helper's read ends at EOF.
    drop(write);
    let mut status = 0;
    // SAFETY: reaping the helper, which exits once its read ended.
    unsafe { libc::waitpid(pid as i32, &mut status, 0) };
    drop(read);
    result.map_err(|e| format!("map the idmap user namespace: {e}"))
}

/// Checks that this host can give an idmapped workspace here (root, Linux 5.12+, a
/// filesystem that allows idmapped mounts).
pub fn check(workspace: &Path) -> Result<(), String> {
    idmapped_tree(workspace).map(drop)
}

/// A detached, recursive, idmapped clone of the root-owned `workspace`, ready for
/// `move_mount`.
pub fn idmapped_tree(workspace: &Path) -> Result<OwnedFd, String> {
    let path = CString::new(workspace.as_os_str().as_bytes())
        .map_err(|_| "the workspace path has a NUL byte".to_string())?;
    let tree = clone_tree(libc::AT_FDCWD, &path, 0)
        .map_err(|e| format!("open_tree {}: {e}", workspace.display()))?;
    idmapped(tree, workspace, Mapping::ROOT_WORKSPACE)
}

/// A detached, recursive clone of the directory `dir` is open at (`O_PATH`).
pub fn clone_dir(dir: &OwnedFd) -> std::io::Result<OwnedFd> {
    clone_tree(dir.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32)
}

fn clone_tree(dirfd: i32, path: &std::ffi::CStr, flags: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: open_tree on a NUL-terminated path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dirfd,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_RECURSIVE as u32 | flags,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the fd open_tree returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Makes the detached `tree` (a clone of `shown`) idmapped by `mapping`.
pub fn idmapped(tree: OwnedFd, shown: &Path, mapping: Mapping) -> Result<OwnedFd, String> {
    let userns = userns(mapping)?;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on our detached tree with a struct of the kernel's layout.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as u32,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(format!(
            "idmapping {} (needs Linux 5.12+ and a filesystem that allows idmapped mounts): {}",
            shown.display(),
            std::io::Error::last_os_error()
        ));
    }
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead as _, BufReader};
    use std::os::unix::process::ExitStatusExt as _;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    const BODY_VAR: &str = "SKILLBOX_IDMAP_KILLED_BODY";

    /// The state letter of `/proc/<pid>/stat`, `None` once the process is gone.
    fn state(pid: i32) -> Option<char> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit_once(") ")?.1.chars().next()
    }

    /// The attack on the host's process table: the process making the idmap user
    /// namespace is SIGKILLed while its helper (in the new namespace) waits to be told
    /// to exit. The helper ends with it instead of waiting for good, holding the dead
    /// process's files.
    #[test]
    fn the_user_namespace_helper_ends_when_its_maker_is_killed() {
        let mut maker = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "idmap::tests::killed_maker_body",
                "--ignored",
                "--nocapture",
            ])
            .env(BODY_VAR, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // Up to its helper's line only: a helper that lived on would hold the pipe open.
        let helper = BufReader::new(maker.stdout.take().unwrap())
            .lines()
            .find_map(|line| line.ok()?.strip_prefix("helper ")?.parse::<i32>().ok())
            .expect("the maker never made its helper");
        let status = maker.wait().unwrap();
        assert_eq!(
            status.signal(),
            Some(9),
            "the maker was not killed: {status}"
        );
        let start = Instant::now();
        while let Some(s) = state(helper).filter(|&s| s != 'Z') {
            if start.elapsed() > Duration::from_secs(10) {
                // SAFETY: ends the helper this test left, before failing.
                unsafe { libc::kill(helper, libc::SIGKILL) };
                panic!("the helper {helper} outlived its killed maker (state {s})");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    #[ignore = "the maker killed by the_user_namespace_helper_ends_when_its_maker_is_killed"]
    fn killed_maker_body() {
        if std::env::var_os(BODY_VAR).is_none() {
            return;
        }
        let _ = make_userns_with(Mapping::ROOT_WORKSPACE, |pid| {
            use std::io::Write as _;
            let mut out = std::io::stdout();
            writeln!(out, "helper {pid}").unwrap();
            out.flush().unwrap();
            // SAFETY: kills this process, the helper's parent, at once.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        });
        unreachable!("the maker outlived its SIGKILL");
    }
}
