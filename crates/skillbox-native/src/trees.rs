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
//!
//! Whether that holds is learnt from the first real capture (its first clone, kept for
//! the first exec), not from a throwaway probe: closing a detached tree waits out an
//! expedited RCU grace period (0.1 to 0.3 ms here), and the probe closed two, plus a
//! recursive copy of every mount under `/`, on every CLI run.

use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

const OPEN_TREE_CLONE: u32 = 1;

fn open_tree(dirfd: i32, path: &CStr, flags: u32) -> std::io::Result<OwnedFd> {
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
pub fn capture(source: &CStr) -> std::io::Result<OwnedFd> {
    open_tree(libc::AT_FDCWD, source, 0)
}

/// A clone of the captured `tree` (each exec needs its own: a detached mount attaches
/// once).
pub fn reclone(tree: &OwnedFd) -> std::io::Result<OwnedFd> {
    open_tree(tree.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32)
}

/// Whether binds are captured here: root, and a kernel that clones detached mounts.
/// Known without a probe once a sandbox of this process has captured one.
pub fn captured_here() -> bool {
    *WORKS.get_or_init(|| {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return false;
        }
        capture(c"/").and_then(|tree| reclone(&tree)).is_ok()
    })
}

static WORKS: OnceLock<bool> = OnceLock::new();

/// One bind source captured at create, and the clone the next exec attaches.
#[derive(Debug)]
pub struct Captured {
    tree: OwnedFd,
    /// The clone made at create to learn that the kernel allows it, kept for the first
    /// exec: closing it unused would cost a grace period.
    spare: Mutex<Option<OwnedFd>>,
}

impl Captured {
    /// A fresh clone of the captured source for one exec to attach.
    pub fn clone_for_exec(&self) -> std::io::Result<OwnedFd> {
        let spare = self.spare.lock().ok().and_then(|mut spare| spare.take());
        match spare {
            Some(clone) => Ok(clone),
            None => reclone(&self.tree),
        }
    }
}

/// The bind `sources` captured, in order, or `None` where binds are looked up by path
/// at each exec instead: unprivileged, or a kernel that cannot clone a detached mount.
///
/// A capture or clone that fails where [`captured_here`] holds is an error naming the
/// source, never a quiet fall back to paths; the full probe runs only then.
pub fn capture_sources(sources: &[&CStr]) -> Result<Option<Vec<Captured>>, CaptureError> {
    // SAFETY: geteuid has no preconditions.
    if sources.is_empty() || unsafe { libc::geteuid() } != 0 || WORKS.get() == Some(&false) {
        return Ok(None);
    }
    let refused = |source: &CStr, error: std::io::Error| {
        if captured_here() {
            Err(CaptureError {
                source: source.to_string_lossy().into_owned(),
                error,
            })
        } else {
            Ok(None)
        }
    };
    let mut captured = Vec::with_capacity(sources.len());
    for source in sources {
        match capture(source) {
            Ok(tree) => captured.push(Captured {
                tree,
                spare: Mutex::new(None),
            }),
            Err(e) => return refused(source, e),
        }
    }
    // What the probe asked, on the first real capture: does a detached mount made here
    // clone again? (6.1 refuses: EINVAL.)
    if let Some(first) = captured.first_mut() {
        match reclone(&first.tree) {
            Ok(clone) => first.spare = Mutex::new(Some(clone)),
            Err(e) => return refused(sources[0], e),
        }
    }
    let _ = WORKS.set(true);
    Ok(Some(captured))
}

/// A bind source that could not be captured where binds are captured.
#[derive(Debug)]
pub struct CaptureError {
    pub source: String,
    pub error: std::io::Error,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

    use std::ffi::CString;

    use super::*;

    #[test]
    fn the_first_exec_attaches_the_clone_made_at_create_and_later_ones_their_own() {
        if !captured_here() {
            return skillbox_env::testkit::skip(
                "the_first_exec_attaches_the_clone_made_at_create",
                "binds are not captured here (unprivileged, or an older kernel)",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("mine.txt"), "captured\n").unwrap();
        let source = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let captured = capture_sources(&[&source]).unwrap().expect("captured");
        let [first] = &captured[..] else {
            panic!("one source, one capture")
        };
        let spare = first.spare.lock().unwrap().as_ref().map(AsRawFd::as_raw_fd);
        let clone = first.clone_for_exec().unwrap();
        assert_eq!(Some(clone.as_raw_fd()), spare, "the clone made at create");
        let again = first.clone_for_exec().unwrap();
        assert_ne!(again.as_raw_fd(), clone.as_raw_fd());
        for tree in [&clone, &again] {
            let seen = format!("/proc/self/fd/{}/mine.txt", tree.as_raw_fd());
            assert_eq!(std::fs::read_to_string(seen).unwrap(), "captured\n");
        }
    }

    /// Where binds are captured, a source that cannot be is an error, never a quiet
    /// fall back to looking paths up at each exec.
    #[test]
    fn a_source_that_cannot_be_captured_is_an_error_where_binds_are_captured() {
        if !captured_here() {
            return skillbox_env::testkit::skip(
                "a_source_that_cannot_be_captured_is_an_error",
                "binds are not captured here (unprivileged, or an older kernel)",
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let there = CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
        let missing = CString::new(dir.path().join("gone").as_os_str().as_encoded_bytes()).unwrap();
        for sources in [&[&*missing][..], &[&*there, &*missing][..]] {
            let err = capture_sources(sources).expect_err("refused");
            assert_eq!(err.source, missing.to_string_lossy());
            assert_eq!(err.error.raw_os_error(), Some(libc::ENOENT));
        }
    }
}
