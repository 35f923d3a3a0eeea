//! An idmapped workspace, for root with a root-owned workspace: the sandbox (host uid
//! 65534) sees the directory's root-owned files as its own, and what it writes lands
//! on disk owned by root. The user's directory stays theirs, and sandboxed code still
//! never runs as host root. (Seccomp refuses setuid/setgid modes, so nothing it writes
//! there can become a setuid-root file.)

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

/// A user namespace mapping on-disk uid/gid 0 to host 65534, made once per process.
fn userns() -> Result<&'static OwnedFd, String> {
    static USERNS: OnceLock<Result<OwnedFd, String>> = OnceLock::new();
    USERNS
        .get_or_init(make_userns)
        .as_ref()
        .map_err(Clone::clone)
}

fn make_userns() -> Result<OwnedFd, String> {
    make_userns_with(|_| {})
}

/// [`make_userns`], calling `cloned` with the helper's pid right after it is made.
fn make_userns_with(cloned: impl FnOnce(i32)) -> Result<OwnedFd, String> {
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
        fs::write(format!("/proc/{pid}/uid_map"), "0 65534 1\n")?;
        fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        fs::write(format!("/proc/{pid}/gid_map"), "0 65534 1\n")?;
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

/// A detached, recursive, idmapped clone of `workspace`, ready for `move_mount`.
pub fn idmapped_tree(workspace: &Path) -> Result<OwnedFd, String> {
    let path = CString::new(workspace.as_os_str().as_bytes())
        .map_err(|_| "the workspace path has a NUL byte".to_string())?;
    // SAFETY: open_tree on a NUL-terminated path; returns a new fd or -1.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_RECURSIVE as u32,
        )
    };
    if fd < 0 {
        return Err(format!(
            "open_tree {}: {}",
            workspace.display(),
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the fd open_tree returned.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    idmapped(tree, workspace)
}

/// Makes the detached `tree` (a clone of `workspace`) idmapped.
pub fn idmapped(tree: OwnedFd, workspace: &Path) -> Result<OwnedFd, String> {
    let userns = userns()?;
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
            workspace.display(),
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
        let _ = make_userns_with(|pid| {
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
