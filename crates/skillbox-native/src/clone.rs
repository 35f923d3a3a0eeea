//! The one `clone3` that makes a sandbox's init: into every namespace at once (on
//! cgroup v2 also into its cgroup), the child running `child::init_main`. Made by this
//! process (`spawn`) or by the spawner process (`spawner::server`), which is why it is
//! a module of its own below both.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::child::{self, ChildPlan};

/// The namespaces every sandbox is cloned into. Its cgroup namespace, the last, init
/// makes itself once it is in the exec's cgroups (`child::init_main`), so that it is
/// rooted there on v1 as on v2.
const NAMESPACES: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// `CLONE_INTO_CGROUP` (Linux 5.7); libc's constant is deprecated for overflowing.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Clones init from `plan` (on v2 straight into the cgroup `into`): its pid and pidfd.
/// The child runs `init_main` and never returns here. `sibling` (the spawner process):
/// init becomes this process's parent's child (`CLONE_PARENT`), so to the server it is
/// its own child, as if cloned in process: reaped by it, and killed when its spawner
/// thread exits.
pub(crate) fn clone_init(
    plan: &mut ChildPlan,
    into: Option<std::os::fd::RawFd>,
    sibling: bool,
) -> std::io::Result<(i32, OwnedFd)> {
    // Init starts the payload on this stack (and a prepared one reads its command into
    // that buffer): never clone without them.
    if plan.payload_stack.len() < child::PAYLOAD_STACK
        || (plan.late && plan.late_buffer.len() < child::LATE_BYTES)
    {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let memory = child::Writable {
        stack: plan.payload_stack.as_mut_ptr(),
        late: plan.late_buffer.as_mut_ptr(),
    };
    let plan = &*plan;
    let mut pidfd: libc::c_int = -1;
    // SAFETY: clone_args is plain data; zeroed is its documented default.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = NAMESPACES | libc::CLONE_PIDFD as u64;
    args.pidfd = (&mut pidfd as *mut libc::c_int) as u64;
    if sibling {
        // clone3 wants no exit signal here: the child takes this process's (SIGCHLD).
        args.flags |= libc::CLONE_PARENT as u64;
    } else {
        args.exit_signal = libc::SIGCHLD as u64;
    }
    if let Some(fd) = into {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = fd as u64;
    }
    // SAFETY: clone3 with no stack behaves like fork; the child only runs `init_main`,
    // which never returns and uses raw syscalls only.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if pid == 0 {
        // SAFETY: we are the child; see above. The buffers are this process's copies,
        // written only through these pointers.
        unsafe { child::init_main(plan, memory) }
    }
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel gave us this pidfd.
    Ok((pid as i32, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

pub(crate) fn clone_error(err: &std::io::Error) -> String {
    format!(
        "user_ns: cannot create the sandbox namespaces (clone3: {err}); check that unprivileged user namespaces are enabled (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)"
    )
}
