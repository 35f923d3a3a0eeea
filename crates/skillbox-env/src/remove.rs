//! Removing a directory tree that sandboxed code built: however deep it is (a script
//! can nest 100,000 directories in a second), with three file descriptors open at most
//! and no recursion, never following a symlink, and refusing to go on when the tree is
//! moved under it.
//!
//! It walks down one directory at a time, removing what it finds, and comes back up
//! through `..`. The names and `(dev, ino)` of the directories it went through are kept
//! in memory (a few bytes per level, not an fd); each `..` is checked against them, so a
//! process that renames a directory mid-walk gets an error, never a removal elsewhere.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

fn open_dir(at: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        at,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

fn identity(fd: BorrowedFd<'_>) -> Result<(u64, u64), Errno> {
    let stat = rustix::fs::fstat(fd)?;
    Ok((stat.st_dev, stat.st_ino))
}

/// Removes `name` beneath `dir`: a file or symlink is unlinked, a directory removed
/// with everything below it. A missing `name` is not an error.
pub fn remove_tree_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => stat,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return ignore_missing(rustix::fs::unlinkat(dir, name, AtFlags::empty()));
    }
    let top = open_dir(dir, name)?;
    empty_tree(top)?;
    ignore_missing(rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR))
}

/// Removes the tree at `path` (its last component is not followed if a symlink).
pub fn remove_tree(path: &Path) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a path with no name"))?;
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let parent = match rustix::fs::open(
        parent,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    remove_tree_at(parent.as_fd(), name)
}

fn ignore_missing(result: Result<(), Errno>) -> io::Result<()> {
    match result {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A directory the walk went down through: its name in its parent, the parent's
/// identity (to check `..` against), and the parent's subdirectories still to visit.
struct Frame {
    name: OsString,
    parent: (u64, u64),
    pending: Vec<OsString>,
}

/// Empties the directory `top` (it stays). The walk holds `current`, for a moment its
/// parent or child, and the fd a listing reads from: three fds, whatever the depth.
fn empty_tree(top: OwnedFd) -> io::Result<()> {
    let mut stack: Vec<Frame> = Vec::new();
    let mut current = top;
    let mut pending = scan(current.as_fd())?;
    loop {
        if let Some(name) = pending.pop() {
            match open_dir(current.as_fd(), &name) {
                Ok(child) => {
                    stack.push(Frame {
                        parent: identity(current.as_fd())?,
                        name,
                        pending,
                    });
                    current = child;
                    pending = scan(current.as_fd())?;
                }
                Err(Errno::NOENT) => {}
                // Replaced by a file or a symlink since it was listed: unlink that.
                Err(Errno::NOTDIR | Errno::LOOP) => {
                    ignore_missing(rustix::fs::unlinkat(
                        current.as_fd(),
                        &name,
                        AtFlags::empty(),
                    ))?;
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        }
        let Some(frame) = stack.pop() else {
            return Ok(());
        };
        let parent = open_dir(current.as_fd(), OsStr::new(".."))?;
        if identity(parent.as_fd())? != frame.parent {
            return Err(io::Error::other(
                "the directory tree was moved while it was being removed",
            ));
        }
        drop(current);
        pending = frame.pending;
        match rustix::fs::unlinkat(parent.as_fd(), &frame.name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            // Something was added meanwhile: visit it again.
            Err(Errno::NOTEMPTY) => pending.push(frame.name),
            Err(e) => return Err(e.into()),
        }
        current = parent;
    }
}

/// Unlinks every non-directory in `dir`; returns the names of its subdirectories.
fn scan(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut subdirs = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = OsStr::from_bytes(name);
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => FileType::from_raw_mode(stat.st_mode) == FileType::Directory,
                Err(Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            },
            _ => false,
        };
        if is_dir {
            subdirs.push(name.to_os_string());
            continue;
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => {}
            // A directory after all (it changed since the listing).
            Err(Errno::ISDIR) => subdirs.push(name.to_os_string()),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(subdirs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deep(root: &Path, depth: usize) {
        let mut dir = open_dir(rustix::fs::CWD, root.as_os_str()).unwrap();
        for i in 0..depth {
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o755)).unwrap();
            if i % 1000 == 0 {
                let file = rustix::fs::openat(
                    &dir,
                    "f",
                    OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                drop(file);
                rustix::fs::symlinkat("/etc/passwd", &dir, "link").unwrap();
            }
            dir = open_dir(dir.as_fd(), OsStr::new("d")).unwrap();
        }
    }

    #[test]
    fn a_tree_100000_directories_deep_is_removed() {
        // On a tmpfs where there is one: the depth is the point, not the disk's speed.
        let tmp = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let root = tmp.path().join("tree");
        std::fs::create_dir(&root).unwrap();
        deep(&root, 100_000);
        remove_tree(&root).unwrap();
        assert!(!root.exists());
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_wide_tree_is_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("tree");
        for i in 0..2000 {
            std::fs::create_dir_all(root.join(format!("d{i}/e"))).unwrap();
            std::fs::write(root.join(format!("d{i}/e/f")), "x").unwrap();
        }
        remove_tree(&root).unwrap();
        assert!(!root.exists());
    }

    #[test]
    fn a_symlink_is_removed_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let root = tmp.path().join("tree");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("a/b/out")).unwrap();
        std::os::unix::fs::symlink(&outside, tmp.path().join("top-link")).unwrap();
        remove_tree(&root).unwrap();
        remove_tree(&tmp.path().join("top-link")).unwrap();
        assert!(!root.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
        // Missing: fine.
        remove_tree(&tmp.path().join("nothing")).unwrap();
    }
}
