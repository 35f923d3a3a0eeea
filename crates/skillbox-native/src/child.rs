//! The code that runs in the cloned child, before and instead of `execve`.
//!
//! The child is a copy of one thread of a multi-threaded process, so everything here is
//! raw syscalls over data prepared by the parent: no allocation, no locks, no panics.
//! The child becomes the sandbox's init (pid 1): it builds the root, locks itself down
//! (every layer is inherited by what it forks), forks the payload, reaps, reports the
//! payload's wait status and exits — which kills whatever is left in the namespace.

use std::ffi::CString;

use crate::landlock;

/// Where the new root is assembled inside the child's mount namespace, before
/// `pivot_root`. Every bind source is an fd, so whatever this hides does not matter.
pub const STAGE: &str = "/tmp";

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const OPEN_TREE_CLONE: u32 = 1;
const MOVE_MOUNT_F_EMPTY_PATH: u32 = 0x4;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// One step of building the root; paths are absolute, under [`STAGE`].
#[derive(Debug)]
pub enum MountOp {
    Dir {
        path: CString,
    },
    File {
        path: CString,
    },
    Symlink {
        target: CString,
        path: CString,
    },
    /// `source` is a host path, captured with `open_tree` before the child gives up
    /// the parent's credentials (it may sit in a directory only they can traverse).
    Bind {
        source: CString,
        target: CString,
        attrs: u64,
    },
    Tmpfs {
        target: CString,
        options: CString,
    },
    Proc {
        target: CString,
    },
    /// A private devpts instance, so programs can open ptys.
    Devpts {
        target: CString,
    },
}

/// Steps reported through the error pipe: `(step, errno)`. Mount ops report
/// `STEP_MOUNT + index`.
pub const STEP_MOUNT_PRIVATE: u32 = 1;
pub const STEP_ROOT_TMPFS: u32 = 2;
pub const STEP_PIVOT: u32 = 3;
pub const STEP_ROOT_READONLY: u32 = 4;
pub const STEP_HOSTNAME: u32 = 5;
pub const STEP_LOOPBACK: u32 = 6;
pub const STEP_RLIMIT: u32 = 7;
pub const STEP_NO_NEW_PRIVS: u32 = 8;
pub const STEP_LANDLOCK: u32 = 9;
pub const STEP_CAPS: u32 = 10;
pub const STEP_SECCOMP: u32 = 11;
pub const STEP_FORK: u32 = 12;
pub const STEP_STDIO: u32 = 13;
pub const STEP_CHDIR: u32 = 14;
pub const STEP_EXEC: u32 = 15;
pub const STEP_IDS: u32 = 16;
pub const STEP_CLOSE_FDS: u32 = 17;
/// A prepared init's command was malformed (a parent's bug, never the sandbox's).
pub const STEP_COMMAND: u32 = 18;
/// Joining the exec's cgroup v1 leaves failed.
pub const STEP_CGROUP: u32 = 19;
/// A cgroup namespace rooted at the exec's own cgroups could not be made.
pub const STEP_CGROUP_NS: u32 = 20;
pub const STEP_MOUNT: u32 = 1000;
/// `STEP_OPEN_TREE + index`: capturing a bind source failed.
pub const STEP_OPEN_TREE: u32 = 100_000;

/// At most this many arguments and environment variables: the payload's argv and envp
/// arrays (4096 and 1024 slots) keep a terminating null after them.
pub const MAX_ARGS: usize = 4000;
pub const MAX_ENV: usize = 1000;

/// At most this many candidate program paths (the PATH search's directories).
pub const MAX_PROGRAMS: usize = 256;

/// The payload's stack: its argv/envp arrays live on it until exec.
pub const PAYLOAD_STACK: usize = 256 * 1024;

/// The largest command a prepared init takes (`ChildPlan::late`): its cwd, programs,
/// argv and env, each NUL-terminated. Small enough that the parent's one write to the
/// sync pipe never blocks; a larger command starts a sandbox the usual way.
pub const LATE_BYTES: usize = 32 * 1024;

/// A late command's header: its body's length, then how many programs, arguments and
/// environment variables follow the cwd.
pub const LATE_HEADER: usize = 16;

/// At most this many bind mounts per sandbox.
pub const MAX_BINDS: usize = 128;

/// Everything the child needs, built by the parent before clone.
#[derive(Debug)]
pub struct ChildPlan {
    pub layout: std::sync::Arc<Layout>,
    /// Drop the supplementary groups inherited from the parent (possible only when
    /// the parent could leave `setgroups` allowed, i.e. as root).
    pub clear_groups: bool,
    pub cwd: CString,
    /// Candidate program paths, tried in order (PATH search done up front).
    pub programs: Vec<CString>,
    pub argv: Vec<CString>,
    pub env: Vec<CString>,
    pub fds: ChildFds,
    /// The payload's stack until it execs, [`PAYLOAD_STACK`] bytes (allocated before
    /// the clone, by whoever clones: init cannot allocate).
    pub payload_stack: Vec<u8>,
    /// A prepared init: `cwd`, `programs`, `argv` and `env` are left empty and come
    /// once every layer is in place, as the go-ahead itself (see [`late_command`]).
    pub late: bool,
    /// Where a prepared init reads its command, [`LATE_BYTES`] (allocated before the
    /// clone, by whoever clones, when `late`).
    pub late_buffer: Vec<u8>,
    /// The parent makes the egress proxy's listener in the exec's network namespace
    /// before letting init go (the child does nothing with it).
    pub egress: bool,
    /// A detached, idmapped mount of the workspace the parent prepared, or -1: then the
    /// child clones the workspace itself like every other bind source.
    pub workspace_tree: i32,
    /// The sandbox's own tmpfs (a detached mount the sandbox holds), or -1. When set,
    /// the child clones it as the workspace; the bind's path is never looked up.
    pub workspace_source: i32,
    /// Per bind, in order: a detached clone, made for this exec by the parent from the
    /// source captured at create, to attach as it is (-1: look the path up).
    pub bind_trees: Vec<i32>,
    /// On cgroup v1: the `tasks` file of each of the exec's leaves, opened by the
    /// parent, which init writes `0` to (itself) before anything else. A thread that
    /// moves itself takes no global lock; the parent moving init through `cgroup.procs`
    /// waits for an RCU grace period (5 to 20 ms here) after a quiet spell. Empty on
    /// v2, where init is born in its cgroup (`CLONE_INTO_CGROUP`).
    pub cgroup_join: Vec<i32>,
}

/// The part of a plan that is the same for every exec of one sandbox.
#[derive(Debug)]
pub struct Layout {
    pub mounts: Vec<MountOp>,
    pub root_options: CString,
    /// Paths (after pivot) made read-only once populated.
    pub seal: Vec<CString>,
    pub hostname: CString,
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    pub landlock: landlock::Plan,
    pub seccomp: Vec<libc::sock_filter>,
    /// The index in `mounts` of the workspace's bind.
    pub workspace_op: usize,
}

/// The child's ends of the pipes.
#[derive(Debug, Clone, Copy)]
pub struct ChildFds {
    pub sync: i32,
    pub error: i32,
    pub status: i32,
    pub stdin: i32,
    pub stdout: i32,
    pub stderr: i32,
}

fn errno() -> i32 {
    landlock::errno()
}

/// Reports a failed step to the parent and exits.
unsafe fn fail(fds: &ChildFds, step: u32, err: i32) -> ! {
    let mut record = [0u8; 8];
    record[..4].copy_from_slice(&step.to_ne_bytes());
    record[4..].copy_from_slice(&err.to_ne_bytes());
    // SAFETY: writing a stack buffer to our error pipe, then exiting without unwinding.
    unsafe {
        libc::write(fds.error, record.as_ptr().cast(), record.len());
        libc::_exit(127)
    }
}

/// The step and errno of a record [`fail`] wrote, if `bytes` holds one.
pub fn read_record(bytes: &[u8]) -> Option<(u32, i32)> {
    let step = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    let errno = i32::from_ne_bytes(bytes.get(4..8)?.try_into().ok()?);
    Some((step, errno))
}

unsafe fn check(fds: &ChildFds, step: u32, rc: libc::c_long) {
    if rc < 0 {
        // SAFETY: see `fail`.
        unsafe { fail(fds, step, errno()) }
    }
}

unsafe fn mount_setattr(path: &CString, flags: u32, attr_set: u64) -> libc::c_long {
    let attr = MountAttr {
        attr_set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: `attr` and `path` outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    }
}

unsafe fn apply_mount(op: &MountOp, tree: i32) -> libc::c_long {
    // SAFETY: every pointer is a NUL-terminated string owned by the plan.
    unsafe {
        match op {
            MountOp::Dir { path } => {
                let rc = libc::mkdir(path.as_ptr(), 0o755);
                if rc < 0 && errno() == libc::EEXIST {
                    0
                } else {
                    rc as libc::c_long
                }
            }
            MountOp::File { path } => {
                let fd = libc::open(
                    path.as_ptr(),
                    libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                    0o644,
                );
                if fd >= 0 {
                    libc::close(fd);
                }
                fd as libc::c_long
            }
            MountOp::Symlink { target, path } => {
                libc::symlink(target.as_ptr(), path.as_ptr()) as libc::c_long
            }
            MountOp::Bind { target, attrs, .. } => {
                let rc = libc::syscall(
                    libc::SYS_move_mount,
                    tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                );
                if rc < 0 {
                    return rc;
                }
                mount_setattr(target, libc::AT_RECURSIVE as u32, *attrs)
            }
            MountOp::Tmpfs { target, options } => libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                options.as_ptr().cast(),
            ) as libc::c_long,
            MountOp::Devpts { target } => libc::mount(
                c"devpts".as_ptr(),
                target.as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ) as libc::c_long,
            MountOp::Proc { target } => libc::mount(
                c"proc".as_ptr(),
                target.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ) as libc::c_long,
        }
    }
}

/// Brings `lo` up so programs can use loopback inside their own network namespace.
unsafe fn loopback_up() -> libc::c_long {
    // SAFETY: raw syscalls only, as init needs.
    unsafe { skillbox_egress::netns::loopback_up() }
}

/// Closes every fd except those in `keep` (sorted ascending).
/// Closes every fd except those in `keep` (sorted ascending). Returns -1 if the kernel
/// refused (then fds could leak into the sandbox: the caller fails the setup).
unsafe fn close_all_but(keep: &[i32]) -> libc::c_long {
    let mut next: u32 = 0;
    for &fd in keep {
        let fd = fd as u32;
        if fd > next {
            // SAFETY: closing a range of our own fds.
            if unsafe { libc::syscall(libc::SYS_close_range, next, fd - 1, 0u32) } < 0 {
                return -1;
            }
        }
        next = fd + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, next, u32::MAX, 0u32) }
}

unsafe fn drop_capabilities() -> libc::c_long {
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    // SAFETY: prctl/capset with stack structs of the kernel's layout.
    unsafe {
        let mut cap = 0;
        while libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) == 0 {
            cap += 1;
        }
        if errno() != libc::EINVAL {
            return -1;
        }
        if libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ) < 0
        {
            return -1;
        }
        let header = CapHeader {
            version: CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr())
    }
}

/// The child's entry point. Never returns.
///
/// # Safety
/// Only in the child of `clone3`, with `plan` as prepared by the parent.
/// The memory init writes: the payload's stack and a prepared init's command buffer
/// (pointers taken with `as_mut_ptr` before the clone, into the plan's own buffers).
#[derive(Debug, Clone, Copy)]
pub struct Writable {
    pub stack: *mut u8,
    pub late: *mut u8,
}

pub unsafe fn init_main(plan: &ChildPlan, memory: Writable) -> ! {
    let fds = &plan.fds;
    // SAFETY: raw syscalls on plan data, as the module docs describe.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // The sandbox's root is made, and its code runs, with the usual umask, whatever
        // skillbox's own (0077, for what it keeps in the data dir).
        libc::umask(0o022);
        // Signal handlers came with the copy of the parent; none of them are ours.
        for sig in 1..libc::SIGRTMAX() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());

        // Wait until the parent has written our uid/gid maps. (A second byte, before we
        // fork the payload, says the parent is still there; a prepared init reads its
        // command there instead.)
        let mut byte = 0u8;
        if libc::read(fds.sync, (&mut byte as *mut u8).cast(), 1) != 1 {
            libc::_exit(1);
        }
        // Into the exec's cgroup (v1) before anything is made here, and for good: a
        // failure ends init, so nothing ever runs outside the limits it was given.
        for &fd in &plan.cgroup_join {
            check(
                fds,
                STEP_CGROUP,
                libc::write(fd, c"0".as_ptr().cast(), 1) as libc::c_long,
            );
            libc::close(fd);
        }
        // Our cgroup namespace, made here rather than at the clone: rooted where we
        // are now, the exec's leaves (on v2 we were born there; on v1 we just joined
        // them), it shows the sandbox `/` and none of the host's cgroup names.
        check(
            fds,
            STEP_CGROUP_NS,
            libc::unshare(libc::CLONE_NEWCGROUP) as libc::c_long,
        );

        // Capture every bind source while we still have the parent's credentials.
        let mut trees = [-1i32; MAX_BINDS];
        let mut slot = 0;
        for (i, op) in plan.layout.mounts.iter().enumerate() {
            if let MountOp::Bind { source, .. } = op {
                if i == plan.layout.workspace_op && plan.workspace_tree >= 0 {
                    if slot < MAX_BINDS {
                        trees[slot] = plan.workspace_tree;
                    }
                    slot += 1;
                    continue;
                }
                let captured = plan.bind_trees.get(slot).copied().unwrap_or(-1);
                if captured >= 0 {
                    if slot < MAX_BINDS {
                        trees[slot] = captured;
                    }
                    slot += 1;
                    continue;
                }
                let fd = if i == plan.layout.workspace_op && plan.workspace_source >= 0 {
                    libc::syscall(
                        libc::SYS_open_tree,
                        plan.workspace_source,
                        c"".as_ptr(),
                        OPEN_TREE_CLONE
                            | libc::O_CLOEXEC as u32
                            | libc::AT_RECURSIVE as u32
                            | libc::AT_EMPTY_PATH as u32,
                    )
                } else {
                    libc::syscall(
                        libc::SYS_open_tree,
                        libc::AT_FDCWD,
                        source.as_ptr(),
                        OPEN_TREE_CLONE | libc::O_CLOEXEC as u32 | libc::AT_RECURSIVE as u32,
                    )
                };
                check(fds, STEP_OPEN_TREE + i as u32, fd);
                if slot < MAX_BINDS {
                    trees[slot] = fd as i32;
                }
                slot += 1;
            }
        }

        // Become the mapped sandbox user; our credentials are still the parent's.
        // Raw syscalls: glibc's set*id wrappers broadcast to every thread it thinks we
        // have (copied from the parent) and would wait for them for ever.
        if plan.clear_groups {
            check(
                fds,
                STEP_IDS,
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()),
            );
        }
        let id = crate::ids::SANDBOX_ID;
        check(
            fds,
            STEP_IDS,
            libc::syscall(libc::SYS_setresgid, id, id, id),
        );
        check(
            fds,
            STEP_IDS,
            libc::syscall(libc::SYS_setresuid, id, id, id),
        );
        // A credential change clears the parent-death signal: set it again. Should the
        // parent die before this, its end of the sync pipe is closed when we look
        // there, just before the command.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);

        let null = std::ptr::null::<libc::c_char>();
        check(
            fds,
            STEP_MOUNT_PRIVATE,
            libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) as _,
        );
        let stage = c"/tmp";
        check(
            fds,
            STEP_ROOT_TMPFS,
            libc::mount(
                c"tmpfs".as_ptr(),
                stage.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                plan.layout.root_options.as_ptr().cast(),
            ) as _,
        );
        let mut slot = 0;
        for (i, op) in plan.layout.mounts.iter().enumerate() {
            let tree = if matches!(op, MountOp::Bind { .. }) {
                slot += 1;
                trees.get(slot - 1).copied().unwrap_or(-1)
            } else {
                -1
            };
            check(fds, STEP_MOUNT + i as u32, apply_mount(op, tree));
        }
        check(fds, STEP_PIVOT, libc::chdir(stage.as_ptr()) as _);
        check(
            fds,
            STEP_PIVOT,
            libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()),
        );
        check(
            fds,
            STEP_PIVOT,
            libc::umount2(c".".as_ptr(), libc::MNT_DETACH) as _,
        );
        check(fds, STEP_PIVOT, libc::chdir(c"/".as_ptr()) as _);
        for path in &plan.layout.seal {
            check(
                fds,
                STEP_ROOT_READONLY,
                mount_setattr(path, 0, MOUNT_ATTR_RDONLY),
            );
        }
        check(
            fds,
            STEP_HOSTNAME,
            libc::sethostname(
                plan.layout.hostname.as_ptr(),
                plan.layout.hostname.as_bytes().len(),
            ) as _,
        );
        check(fds, STEP_LOOPBACK, loopback_up());
        for &(resource, soft, hard) in &plan.layout.rlimits {
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            check(fds, STEP_RLIMIT, libc::setrlimit(resource, &limit) as _);
        }

        let mut keep = [
            fds.sync, fds.error, fds.status, fds.stdin, fds.stdout, fds.stderr,
        ];
        keep.sort_unstable();
        check(fds, STEP_CLOSE_FDS, close_all_but(&keep));

        // Nothing in the sandbox may read or trace init's memory.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        check(
            fds,
            STEP_NO_NEW_PRIVS,
            libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) as _,
        );
        if let Err(err) = landlock::apply(&plan.layout.landlock) {
            fail(fds, STEP_LANDLOCK, err);
        }
        check(fds, STEP_CAPS, drop_capabilities());
        let prog = libc::sock_fprog {
            len: plan.layout.seccomp.len() as u16,
            filter: plan.layout.seccomp.as_ptr().cast_mut(),
        };
        check(
            fds,
            STEP_SECCOMP,
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
            ) as _,
        );

        // The go-ahead: a byte, or for a prepared init its command.
        let late = if plan.late {
            match read_late_command(fds.sync, plan, memory.late) {
                Ok(command) => Some(command),
                Err(0) => libc::_exit(1),
                Err(err) => fail(fds, STEP_COMMAND, err),
            }
        } else {
            if libc::read(fds.sync, (&mut byte as *mut u8).cast(), 1) != 1 {
                libc::_exit(1);
            }
            None
        };
        // The parent holds its end of the sync pipe until our setup is done: closed
        // (`POLLHUP`, whatever was asked for), it died, maybe before the parent-death
        // signal was set again above, and nothing may run unsupervised.
        let mut sync = libc::pollfd {
            fd: fds.sync,
            events: 0,
            revents: 0,
        };
        if libc::poll(&mut sync, 1, 0) < 0 || sync.revents & libc::POLLHUP != 0 {
            libc::_exit(1);
        }
        libc::close(fds.sync);
        let launch = Launch { plan, late };
        // vfork-style: the payload borrows init's memory (on its own stack) until it
        // execs, so nothing is copied for a process that is about to be replaced.
        let stack = memory.stack as usize + plan.payload_stack.len();
        let pid = libc::clone(
            payload_entry,
            (stack & !15) as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&launch as *const Launch).cast_mut().cast(),
        );
        check(fds, STEP_FORK, pid as libc::c_long);
        libc::close(fds.error);
        libc::close(fds.stdin);
        libc::close(fds.stdout);
        libc::close(fds.stderr);
        let pid = pid as libc::pid_t;
        loop {
            let mut status = 0;
            let reaped = libc::waitpid(-1, &mut status, 0);
            if reaped == pid {
                let bytes = status.to_ne_bytes();
                libc::write(fds.status, bytes.as_ptr().cast(), bytes.len());
                // Exiting as pid 1 makes the kernel kill everything left in the namespace.
                libc::_exit(0);
            }
            if reaped < 0 && errno() != libc::EINTR {
                libc::_exit(1);
            }
        }
    }
}

/// What the payload runs: the plan's command, or a prepared init's, read late.
struct Launch<'a> {
    plan: &'a ChildPlan,
    late: Option<LateCommand<'a>>,
}

/// A command read by a prepared init: NUL-terminated strings, the cwd first, then
/// `counts` programs, arguments and environment variables.
struct LateCommand<'a> {
    strings: &'a [u8],
    counts: [usize; 3],
}

/// Encodes a command for a prepared init; `None` when it is larger than it can take
/// (or has more entries than its arrays hold): start a sandbox the usual way then.
pub fn late_command(
    cwd: &CString,
    programs: &[CString],
    argv: &[CString],
    env: &[CString],
) -> Option<Vec<u8>> {
    let strings = std::iter::once(cwd)
        .chain(programs)
        .chain(argv)
        .chain(env)
        .map(|s| s.as_bytes_with_nul().len())
        .sum::<usize>();
    let fits = strings <= LATE_BYTES
        && programs.len() <= MAX_PROGRAMS
        && (1..=MAX_ARGS).contains(&argv.len())
        && env.len() <= MAX_ENV;
    if !fits {
        return None;
    }
    let mut bytes = Vec::with_capacity(LATE_HEADER + strings);
    for n in [strings, programs.len(), argv.len(), env.len()] {
        bytes.extend_from_slice(&(n as u32).to_ne_bytes());
    }
    for s in std::iter::once(cwd).chain(programs).chain(argv).chain(env) {
        bytes.extend_from_slice(s.as_bytes_with_nul());
    }
    Some(bytes)
}

/// Reads `len` bytes from `fd` into `buf`; false at end of file or on an error.
unsafe fn read_full(fd: i32, buf: *mut u8, len: usize) -> bool {
    let mut got = 0;
    while got < len {
        // SAFETY: `buf` has room for `len` bytes; raw read on our own pipe.
        let n = unsafe { libc::read(fd, buf.add(got).cast(), len - got) };
        if n > 0 {
            got += n as usize;
        } else if n == 0 || errno() != libc::EINTR {
            return false;
        }
    }
    true
}

/// A prepared init's go-ahead: its command, into the plan's late buffer. `Err(0)`: the
/// parent went away (no command will come); otherwise the errno of a malformed one.
unsafe fn read_late_command(
    fd: i32,
    plan: &ChildPlan,
    buffer: *mut u8,
) -> Result<LateCommand<'_>, i32> {
    let mut header = [0u8; LATE_HEADER];
    // SAFETY: reads into our own arrays; the late buffer is this process's copy, which
    // nothing else in it refers to.
    unsafe {
        if !read_full(fd, header.as_mut_ptr(), LATE_HEADER) {
            return Err(0);
        }
        let field = |i: usize| {
            u32::from_ne_bytes([
                header[4 * i],
                header[4 * i + 1],
                header[4 * i + 2],
                header[4 * i + 3],
            ]) as usize
        };
        let (len, counts) = (field(0), [field(1), field(2), field(3)]);
        let well_formed = len <= plan.late_buffer.len()
            && counts[0] <= MAX_PROGRAMS
            && (1..=MAX_ARGS).contains(&counts[1])
            && counts[2] <= MAX_ENV;
        if !well_formed {
            return Err(libc::E2BIG);
        }
        if !read_full(fd, buffer, len) {
            return Err(0);
        }
        let strings = std::slice::from_raw_parts(buffer, len);
        // Exactly one NUL ends each string, and the last byte is one.
        let nuls = strings.iter().filter(|&&b| b == 0).count();
        if strings.last() != Some(&0) || nuls != 1 + counts[0] + counts[1] + counts[2] {
            return Err(libc::EINVAL);
        }
        Ok(LateCommand { strings, counts })
    }
}

/// The payload: stdio, session, cwd, then exec. Every layer is already in place.
extern "C" fn payload_entry(launch: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `launch` is on init's stack, alive (init is suspended) until we exec.
    unsafe { payload_main(&*(launch as *const Launch)) }
}

unsafe fn payload_main(launch: &Launch) -> ! {
    let plan = launch.plan;
    let fds = &plan.fds;
    // SAFETY: raw syscalls on plan data, as the module docs describe.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // A new session: no controlling terminal, so no TIOCSTI into the caller's.
        libc::setsid();
        check(fds, STEP_STDIO, libc::dup2(fds.stdin, 0) as _);
        check(fds, STEP_STDIO, libc::dup2(fds.stdout, 1) as _);
        check(fds, STEP_STDIO, libc::dup2(fds.stderr, 2) as _);
        check(
            fds,
            STEP_CLOSE_FDS,
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            ),
        );
        // The command's strings, each array ending in a null.
        let null = std::ptr::null::<libc::c_char>();
        let mut programs: [*const libc::c_char; MAX_PROGRAMS + 1] = [null; MAX_PROGRAMS + 1];
        let mut argv: [*const libc::c_char; 4096] = [null; 4096];
        let mut envp: [*const libc::c_char; 1024] = [null; 1024];
        let cwd = match &launch.late {
            None => {
                let fill = |slots: &mut [*const libc::c_char], from: &[CString]| {
                    for (slot, s) in slots.iter_mut().zip(from) {
                        *slot = s.as_ptr();
                    }
                };
                fill(&mut programs[..MAX_PROGRAMS], &plan.programs);
                fill(&mut argv[..MAX_ARGS], &plan.argv);
                fill(&mut envp[..MAX_ENV], &plan.env);
                plan.cwd.as_ptr()
            }
            Some(late) => {
                let mut strings = late
                    .strings
                    .split(|&b| b == 0)
                    .map(|s| s.as_ptr().cast::<libc::c_char>());
                let cwd = strings.next().unwrap_or(null);
                let [n_programs, n_argv, n_env] = late.counts;
                for (slots, n) in [
                    (&mut programs[..], n_programs),
                    (&mut argv[..], n_argv),
                    (&mut envp[..], n_env),
                ] {
                    for (slot, s) in slots.iter_mut().zip(strings.by_ref().take(n)) {
                        *slot = s;
                    }
                }
                cwd
            }
        };
        check(fds, STEP_CHDIR, libc::chdir(cwd) as _);

        let mut err = libc::ENOENT;
        for &program in programs.iter().take_while(|p| !p.is_null()) {
            libc::execve(program, argv.as_ptr(), envp.as_ptr());
            let e = errno();
            // Keep looking past missing entries, but remember a real refusal.
            if e != libc::ENOENT && e != libc::ENOTDIR {
                err = e;
            }
        }
        fail(fds, STEP_EXEC, err)
    }
}
