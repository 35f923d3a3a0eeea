//! Bind sources captured once, at create: the host directories a caller names (a
//! workdir, a runtime's packages) are cloned into detached mounts while the sandbox is
//! made, and for each exec the parent clones those again for the child to attach, so no
//! path is looked up again. Someone on the host who controls a parent directory of a
//! workdir can then no longer swap what an exec sees between create and exec. (The
//! system dirs and the synthesized `/etc` sit under directories only root, or this user
//! in its own 0700 data dir, can change; capturing them too cost 0.7 ms an exec.)
//!
//! It needs root (a detached clone in the host's mount namespace) and a kernel that lets
//! another mount namespace clone a detached mount (6.18 here; 6.1 refuses). Elsewhere
//! the binds are looked up by path at each exec, as before, and `doctor` says which.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::OnceLock;

const OPEN_TREE_CLONE: u32 = 1;

fn open_tree(dirfd: i32, path: &CString, flags: u32) -> std::io::Result<OwnedFd> {
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

/// A detached, recursive clone of `source`, ready for an exec to clone again.
pub fn capture(source: &CString) -> std::io::Result<OwnedFd> {
    open_tree(libc::AT_FDCWD, source, 0)
}

/// A clone of the captured `tree` (each exec needs its own: a detached mount attaches
/// once).
pub fn reclone(tree: &OwnedFd) -> std::io::Result<OwnedFd> {
    open_tree(
        tree.as_raw_fd(),
        &CString::default(),
        libc::AT_EMPTY_PATH as u32,
    )
}

/// Whether binds are captured here: root, and a kernel that clones detached mounts.
pub fn captured_here() -> bool {
    static WORKS: OnceLock<bool> = OnceLock::new();
    *WORKS.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        capture(&CString::from(c"/"))
            .and_then(|tree| reclone(&tree))
            .is_ok()
    })
}
