//! A sandbox's own disk: one tmpfs per sandbox, with the disk bound's size and inode
//! count, that is never attached anywhere on the host. It exists as a detached mount
//! (`fsopen` → `fsconfig` → `fsmount`) whose fd the sandbox holds: the host-side file
//! view opens paths beneath that fd, and every exec clones it (`open_tree`) as its
//! `/workspace`. Filling it ends the write with ENOSPC inside; closing the fd frees it,
//! so a crash leaves nothing to sweep and no tree to walk.
//!
//! As root the tmpfs is made here, owned by the sandbox's host uid. Unprivileged, the
//! kernel lets a user make a tmpfs only inside a user namespace of its own: a short-lived
//! child in one makes it and hands the mount back over a socket (`SCM_RIGHTS`).
//!
//! Cloning a detached mount into another mount namespace needs a recent kernel (6.18
//! here allows it; Debian 12's 6.1 refuses it). Where it is refused, a helper child in
//! a mount namespace of its own makes the tmpfs the root and only mount there
//! (`pivot_root` into it, the copy of the host's mounts detached) and hands back that
//! namespace with the mount (unprivileged, also the user namespace it made it in); the
//! sandbox keeps them by fd after the child exits. A clone can be made only from
//! inside, so for each exec a short-lived child joins them, clones the tmpfs there and
//! hands the clone back, and the exec's init attaches that clone as it is (moving a
//! detached mount in is allowed where cloning one is not): nothing is mounted on the
//! host, as root or not.

use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::ids::HostIds;

const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;

/// Tests: every tmpfs is made as an older kernel needs it (kept attached in its helper's
/// namespaces, a clone made there per exec), whatever this kernel allows.
static KEEP_ALWAYS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// For tests on a kernel that clones detached mounts: makes this process's sandboxes
/// take the path an older kernel needs (see the module docs).
#[doc(hidden)]
pub fn keep_in_namespaces_for_tests() {
    KEEP_ALWAYS.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The sandbox's tmpfs, as a detached mount (or, on an older kernel, the only mount of
/// a mount namespace of its own).
#[derive(Debug)]
pub struct Scratch {
    mount: OwnedFd,
    bytes: u64,
    /// On an older kernel: the namespaces it is attached in, where each exec's clone is
    /// made ([`Scratch::exec_tree`]).
    kept: Option<Kept>,
}

/// The mount namespace of the child that kept the tmpfs, held open after it exited (the
/// tmpfs is its root and only mount), and, unprivileged, the user namespace that child
/// made it in.
#[derive(Debug)]
struct Kept {
    user: Option<OwnedFd>,
    mnt: OwnedFd,
}

/// The steps of making the tmpfs, for the message when one fails.
const STEPS: &[&str] = &[
    "wait for the user namespace map",
    "fsopen tmpfs",
    "fsconfig size",
    "fsconfig nr_inodes",
    "fsconfig mode",
    "fsconfig uid",
    "fsconfig gid",
    "fsconfig create (Linux 5.2+)",
    "fsmount",
    "clone the detached tmpfs (open_tree of a detached mount: Linux 6.15+ or so)",
    "hand the mount back",
    "keep the tmpfs as the only mount of the helper's own mount namespace",
    "join the tmpfs's user namespace (setns)",
    "join the tmpfs's mount namespace (setns)",
    "clone the tmpfs for an exec (open_tree)",
];

/// What a made-but-unusable tmpfs says, with the way out.
fn failed(step: usize, errno: i32) -> String {
    let what = STEPS.get(step).copied().unwrap_or("make the tmpfs");
    format!(
        "{what}: {}; run without a disk bound (--disk none), or give exec a --workdir DIR",
        std::io::Error::from_raw_os_error(errno)
    )
}

/// The fsconfig options, as C strings made before any fork: the child of a fork-like
/// clone in a threaded process may not allocate (another thread may hold malloc's lock).
struct Options {
    size: CString,
    mode: CString,
    inodes: CString,
    uid: CString,
    gid: CString,
}

impl Options {
    fn new(bytes: u64, inodes: u64, owner: HostIds) -> Options {
        let c = |v: String| CString::new(v).unwrap_or_default();
        Options {
            size: c(bytes.to_string()),
            mode: c("0755".into()),
            inodes: c(inodes.to_string()),
            uid: c(owner.uid.to_string()),
            gid: c(owner.gid.to_string()),
        }
    }
}

/// Makes the tmpfs and tells whether this kernel lets another mount namespace clone it
/// while detached, with raw syscalls only (it also runs in a forked child).
/// `Err((step, errno))` names the step that failed.
///
/// # Safety
/// Only async-signal-safe calls are made; `options` must outlive the call.
unsafe fn make(options: &Options) -> Result<(OwnedFd, bool), (usize, i32)> {
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: fsopen with a NUL-terminated name.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) };
    if fs < 0 {
        return Err((1, errno()));
    }
    // SAFETY: the kernel gave us this fd.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
    let set = |step: usize, key: &std::ffi::CStr, value: &CString| {
        // SAFETY: key and value are NUL-terminated and live through the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        };
        if r < 0 { Err((step, errno())) } else { Ok(()) }
    };
    set(2, c"size", &options.size)?;
    set(3, c"nr_inodes", &options.inodes)?;
    set(4, c"mode", &options.mode)?;
    set(5, c"uid", &options.uid)?;
    set(6, c"gid", &options.gid)?;
    // SAFETY: a plain fsconfig command on our fs context.
    let created = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if created < 0 {
        return Err((7, errno()));
    }
    // SAFETY: fsmount of a created context.
    let mount = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        )
    };
    if mount < 0 {
        return Err((8, errno()));
    }
    // SAFETY: the kernel gave us this fd.
    let mount = unsafe { OwnedFd::from_raw_fd(mount as i32) };
    // What every exec will do: clone the detached mount. Refused here, refused there.
    // SAFETY: open_tree on our own fd with an empty path.
    let clone = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            mount.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if clone < 0 {
        return match errno() {
            // The kernel's answer for a mount outside the caller's namespace.
            libc::EINVAL => Ok((mount, false)),
            errno => Err((9, errno)),
        };
    }
    // SAFETY: closing the probe clone we just made.
    unsafe { libc::close(clone as i32) };
    Ok((mount, true))
}

/// Unmounts what may be a tmpfs an earlier skillbox (as root, on an older kernel)
/// attached at the sandbox's directory `dir` and left behind when it crashed (the
/// sweep); not a mount point is fine.
pub fn unmount_leftover(dir: &std::path::Path) {
    use std::os::unix::ffi::OsStrExt;
    if let Ok(path) = CString::new(dir.as_os_str().as_bytes()) {
        // SAFETY: umount2 of a path; EINVAL when it is not a mount point.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

impl Scratch {
    /// A tmpfs of `bytes` and `inodes`, its root owned by `owner` on the host.
    pub fn create(bytes: u64, inodes: u64, owner: HostIds) -> Result<Scratch, String> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let (mount, kept) = if root {
            let options = Options::new(bytes, inodes, owner);
            // SAFETY: options lives through the call.
            let (mount, clonable) =
                unsafe { make(&options) }.map_err(|(step, errno)| failed(step, errno))?;
            if clonable && !KEEP_ALWAYS.load(std::sync::atomic::Ordering::Relaxed) {
                (mount, None)
            } else {
                let (mount, kept) = keep_as_root(mount)?;
                (mount, Some(kept))
            }
        } else {
            in_user_namespace(bytes, inodes, owner)?
        };
        Ok(Scratch { mount, bytes, kept })
    }

    /// Whether each exec gets its clone from [`Scratch::exec_tree`] (and must not clone
    /// the mount itself).
    pub fn cloned_per_exec(&self) -> bool {
        self.kept.is_some()
    }

    /// A clone of the tmpfs for one exec to attach as it is, made inside the namespaces
    /// it is kept in; `None` where an exec clones it itself (or by path).
    pub fn exec_tree(&self) -> Result<Option<OwnedFd>, String> {
        self.kept
            .as_ref()
            .map(|kept| kept.clone_mount(&self.mount))
            .transpose()
    }

    /// The detached mount: a directory fd to open paths beneath, and what each exec
    /// clones as `/workspace`.
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.mount.as_fd()
    }

    /// A second fd for the same mount (the host-side file view keeps its own).
    pub fn try_clone_fd(&self) -> std::io::Result<OwnedFd> {
        self.mount.try_clone()
    }

    /// Whether it is full, or as good as: the bytes or inodes left are under what a
    /// failed write would leave.
    pub fn is_full(&self) -> bool {
        let Ok(stat) = rustix::fs::fstatfs(&self.mount) else {
            return false;
        };
        let free = stat.f_bavail.saturating_mul(stat.f_bsize as u64);
        skillbox_env::DiskSplit::is_full(self.bytes, free, Some(stat.f_ffree))
    }
}

/// Unprivileged: a child in a user and mount namespace of its own makes the tmpfs (its
/// uid 0 is our uid, so the tmpfs is ours on the host) and sends the mount back.
fn in_user_namespace(
    bytes: u64,
    inodes: u64,
    owner: HostIds,
) -> Result<(OwnedFd, Option<Kept>), String> {
    // Inside the child's namespace, our uid and gid are 0.
    let options = Options::new(bytes, inodes, HostIds { uid: 0, gid: 0 });
    let (pid, ours) = spawn_helper(
        libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
        "user_ns: cannot make the tmpfs's namespace",
        // SAFETY: `child_main` makes raw syscalls only, and options outlives it.
        |socket| unsafe { child_main(socket, &options) },
    )?;
    let maps = (|| -> std::io::Result<()> {
        std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
        std::fs::write(
            format!("/proc/{pid}/uid_map"),
            format!("0 {} 1\n", owner.uid),
        )?;
        std::fs::write(
            format!("/proc/{pid}/gid_map"),
            format!("0 {} 1\n", owner.gid),
        )
    })();
    // The child waits for one byte (or the socket's end) before it goes on.
    let go = match &maps {
        Ok(()) => [1u8],
        Err(_) => [0u8],
    };
    // SAFETY: one byte from a stack array to our socket.
    unsafe { libc::send(ours.as_raw_fd(), go.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    let answer = answer_of(pid, &ours);
    if let Err(e) = maps {
        return Err(format!(
            "user_ns: cannot write the tmpfs namespace's map: {e}"
        ));
    }
    answer
}

/// Root, on an older kernel: a child in a mount namespace of its own keeps the tmpfs
/// there as its only mount ([`keep_here`]) and sends back the mount and that namespace.
/// (Root needs no user namespace to join it, and the tmpfs stays in the host's, so the
/// host-side view writes to it as root can.)
fn keep_as_root(mount: OwnedFd) -> Result<(OwnedFd, Kept), String> {
    let (pid, ours) = spawn_helper(
        libc::CLONE_NEWNS,
        "mnt_ns: cannot make the tmpfs's mount namespace",
        // SAFETY: raw syscalls on fds the child holds. It never waits for the parent's
        // end (see `child_main`).
        |socket| unsafe {
            match keep_here(mount.as_raw_fd()) {
                Ok((_user, mnt)) => answer(socket, [-3, 0], &[mount.as_raw_fd(), mnt]),
                Err(errno) => answer(socket, [11, errno], &[]),
            }
        },
    )?;
    match answer_of(pid, &ours)? {
        (mount, Some(kept)) => Ok((mount, kept)),
        (_, None) => Err("the tmpfs helper sent no mount namespace".into()),
    }
}

impl Kept {
    /// A clone of `mount` (attached in these namespaces), made by a short-lived child
    /// that joins them: only from inside may it be cloned on such a kernel.
    fn clone_mount(&self, mount: &OwnedFd) -> Result<OwnedFd, String> {
        let user = self.user.as_ref().map_or(-1, AsRawFd::as_raw_fd);
        let (pid, ours) = spawn_helper(
            0,
            "clone the tmpfs for an exec",
            // SAFETY: `clone_main` makes raw syscalls only, on fds the child holds.
            |socket| unsafe { clone_main(socket, user, self.mnt.as_raw_fd(), mount.as_raw_fd()) },
        )?;
        answer_of(pid, &ours).map(|(clone, _)| clone)
    }
}

/// Starts a helper child: a fork-like clone into the new `namespaces` given (0: none)
/// that runs `child` on its end of a fresh socket pair (ours closed there) and exits.
/// Here: its pid and our end. A failed clone is `what` with the errno.
///
/// `child` runs in a fork of a threaded process: raw syscalls only, no allocation.
fn spawn_helper(
    namespaces: libc::c_int,
    what: &str,
    child: impl FnOnce(i32),
) -> Result<(i32, OwnedFd), String> {
    let (ours, theirs) = seqpacket_pair()?;
    // SAFETY: a fork-like clone; the child runs `child` and exits without unwinding.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (namespaces | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: we are the child: our copy of the parent's end is not ours to use.
        unsafe { libc::close(ours.as_raw_fd()) };
        child(theirs.as_raw_fd());
        // SAFETY: exiting without unwinding.
        unsafe { libc::_exit(0) }
    }
    drop(theirs);
    if pid < 0 {
        return Err(format!(
            "{what}: clone: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok((pid as i32, ours))
}

/// A helper's answer ([`receive`]), once it has been reaped.
fn answer_of(pid: i32, ours: &OwnedFd) -> Result<(OwnedFd, Option<Kept>), String> {
    let answer = receive(ours);
    let mut status = 0;
    // SAFETY: reaping the child we made.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    answer
}

/// A connected pair of `SOCK_SEQPACKET` sockets: ours, and the child's.
fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), String> {
    let mut pair = [0; 2];
    // SAFETY: socketpair fills the array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            pair.as_mut_ptr(),
        )
    } < 0
    {
        return Err(format!("socketpair: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: fresh fds owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) })
}

/// The per-exec child: joins the kept namespaces, clones the tmpfs there, sends the
/// clone (or the failed step and errno) and exits.
///
/// # Safety
/// Runs after a fork-like clone: raw syscalls only, never returns.
unsafe fn clone_main(socket: i32, user: i32, mnt: i32, mount: i32) -> ! {
    // (`user` is -1 for root's tmpfs, kept in a mount namespace alone.)
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: setns and open_tree on fds this process holds; see above.
    let result = unsafe {
        if user >= 0 && libc::setns(user, libc::CLONE_NEWUSER) < 0 {
            Err((12, errno()))
        } else if libc::setns(mnt, libc::CLONE_NEWNS) < 0 {
            Err((13, errno()))
        } else {
            // The tmpfs alone (not recursive): nothing else comes with it.
            let clone = libc::syscall(
                libc::SYS_open_tree,
                mount,
                c"".as_ptr(),
                OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
            );
            if clone < 0 {
                Err((14, errno()))
            } else {
                Ok(clone as i32)
            }
        }
    };
    // SAFETY: answering on our socket, then exiting without unwinding.
    unsafe {
        match result {
            Ok(clone) => answer(socket, [-1, 0], &[clone]),
            Err((step, errno)) => answer(socket, [step, errno], &[]),
        }
        libc::_exit(0)
    }
}

/// The child: waits for its map, makes the tmpfs, sends it (or the failed step and
/// errno) and exits. Where this kernel cannot clone it detached into an exec, it first
/// makes it the only mount of its own mount namespace and sends that namespace and its
/// user namespace with it ([`keep_here`]). It never waits for the parent's end to close:
/// a helper forked meanwhile for another sandbox may hold a copy of it.
///
/// # Safety
/// Runs after a fork-like clone: raw syscalls only, never returns.
unsafe fn child_main(socket: i32, options: &Options) -> ! {
    let mut go = 0u8;
    // SAFETY: reading one byte into a stack variable.
    let got = unsafe { libc::recv(socket, (&mut go as *mut u8).cast(), 1, 0) };
    if got != 1 || go != 1 {
        // SAFETY: answering on our socket, then exiting without unwinding.
        unsafe {
            answer(socket, [0, libc::EPERM], &[]);
            libc::_exit(0)
        }
    }
    // SAFETY: options outlives the call; raw syscalls only.
    match unsafe { make(options) } {
        Ok((mount, true)) if !KEEP_ALWAYS.load(std::sync::atomic::Ordering::Relaxed) => {
            // SAFETY: as above.
            unsafe { answer(socket, [-1, 0], &[mount.as_raw_fd()]) }
        }
        // SAFETY: raw syscalls on our own mount and namespaces.
        Ok((mount, _)) => match unsafe { keep_here(mount.as_raw_fd()) } {
            // SAFETY: as above.
            Ok((user, mnt)) => unsafe { answer(socket, [-2, 0], &[mount.as_raw_fd(), user, mnt]) },
            // SAFETY: as above.
            Err(errno) => unsafe { answer(socket, [11, errno], &[]) },
        },
        // SAFETY: as above.
        Err((step, errno)) => unsafe { answer(socket, [step as i32, errno], &[]) },
    }
    // SAFETY: exiting without unwinding.
    unsafe { libc::_exit(0) }
}

/// Makes the detached `mount` the root of this (the helper's own) mount namespace, with
/// nothing else in it (a mount of the caller's own namespace is one it may clone), and
/// opens this process's user and mount namespaces for the parent to keep. The mount
/// namespace then holds the tmpfs alone: no copy of the host's mounts that could keep
/// one of them busy. `Err(errno)` of the step that failed.
///
/// # Safety
/// Raw syscalls only (it runs in a forked child).
unsafe fn keep_here(mount: i32) -> Result<(i32, i32), i32> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    let errno = || {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO)
    };
    // SAFETY: raw syscalls on C literals and fds this process holds.
    unsafe {
        let user = libc::open(
            c"/proc/self/ns/user".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if user < 0 {
            return Err(errno());
        }
        let mnt = libc::open(
            c"/proc/self/ns/mnt".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if mnt < 0 {
            return Err(errno());
        }
        // Nothing here propagates anywhere, nor anything from the host to here.
        if libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ) < 0
        {
            return Err(errno());
        }
        // Attached on a directory every host has, entered, made the root; the old root
        // (this namespace's copy of the host's mounts) detached.
        let mut attached = false;
        for place in [c"/tmp", c"/mnt", c"/dev"] {
            let moved = libc::syscall(
                libc::SYS_move_mount,
                mount,
                c"".as_ptr(),
                libc::AT_FDCWD,
                place.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            );
            if moved == 0 {
                attached = libc::chdir(place.as_ptr()) == 0;
                break;
            }
        }
        if !attached {
            return Err(errno());
        }
        if libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) < 0
            || libc::umount2(c".".as_ptr(), libc::MNT_DETACH) < 0
            || libc::chdir(c"/".as_ptr()) < 0
        {
            return Err(errno());
        }
        Ok((user, mnt))
    }
}

/// Sends a child's answer: `record` (`[-1, 0]` with the mount, `[-2, 0]` with the mount
/// and the user and mount namespaces it is kept in, `[-3, 0]` with the mount and the
/// mount namespace it is kept in, or the failed step and errno) and
/// `fds` as `SCM_RIGHTS`.
///
/// # Safety
/// Raw syscalls over stack buffers only (it runs in a forked child).
unsafe fn answer(socket: i32, mut record: [i32; 2], fds: &[i32]) {
    let fds = &fds[..fds.len().min(MAX_FDS)];
    let mut space = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: record.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(&record),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = space.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE is a pure computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: the control buffer (32 bytes) holds one header and up to three fds.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            let data = libc::CMSG_DATA(cmsg).cast::<i32>();
            for (i, &fd) in fds.iter().enumerate() {
                std::ptr::write_unaligned(data.add(i), fd);
            }
        }
    }
    // SAFETY: msg points at live stack buffers.
    unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
}

/// The most fds an answer carries: the mount and the two namespaces it is kept in.
const MAX_FDS: usize = 3;

/// A child's answer: the mount (and, where it is kept in the child's namespaces, those),
/// or the step that failed.
fn receive(socket: &OwnedFd) -> Result<(OwnedFd, Option<Kept>), String> {
    let mut record = [0i32; 2];
    let mut space = [0u64; 4];
    let mut iov = libc::iovec {
        iov_base: record.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(&record),
    };
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space);
    // SAFETY: msg points at live stack buffers.
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got != std::mem::size_of_val(&record) as isize {
        return Err("the tmpfs helper ended without an answer".into());
    }
    // Every fd that came, owned (and closed when dropped) before anything is judged.
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if !cmsg.is_null()
            && (*cmsg).cmsg_level == libc::SOL_SOCKET
            && (*cmsg).cmsg_type == libc::SCM_RIGHTS
        {
            // As many as came (at most what the buffer holds): any beyond an answer's
            // are closed with the rest when it is refused.
            let header = libc::CMSG_LEN(0) as usize;
            let room = (std::mem::size_of_val(&space) - header) / 4;
            let count = ((*cmsg).cmsg_len as usize).saturating_sub(header) / 4;
            let data = libc::CMSG_DATA(cmsg).cast::<i32>();
            for i in 0..count.min(room) {
                // The kernel installed these fds for us.
                fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
            }
        }
    }
    let mut fds = fds.into_iter();
    match (record, fds.next(), fds.next(), fds.next()) {
        ([-1, _], Some(mount), None, None) => Ok((mount, None)),
        ([-2, _], Some(mount), Some(user), Some(mnt)) => Ok((
            mount,
            Some(Kept {
                user: Some(user),
                mnt,
            }),
        )),
        ([-3, _], Some(mount), Some(mnt), None) => Ok((mount, Some(Kept { user: None, mnt }))),
        ([step, errno], _, _, _) if step >= 0 => Err(failed(step as usize, errno)),
        _ => Err("the tmpfs helper sent no mount".into()),
    }
}
