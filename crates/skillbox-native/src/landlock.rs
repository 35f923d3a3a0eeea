//! Landlock, spoken directly: the ruleset is planned in the parent (plain data) and
//! applied by the sandbox's init with raw syscalls, so nothing allocates after clone.

use std::ffi::CString;

pub const ACCESS_FS_EXECUTE: u64 = 1 << 0;
pub const ACCESS_FS_WRITE_FILE: u64 = 1 << 1;
pub const ACCESS_FS_READ_FILE: u64 = 1 << 2;
pub const ACCESS_FS_READ_DIR: u64 = 1 << 3;
const ACCESS_FS_ABI1_ALL: u64 = (1 << 13) - 1;
const ACCESS_FS_REFER: u64 = 1 << 13;
const ACCESS_FS_TRUNCATE: u64 = 1 << 14;
const ACCESS_FS_IOCTL_DEV: u64 = 1 << 15;
const ACCESS_NET_BIND_TCP: u64 = 1 << 0;
const ACCESS_NET_CONNECT_TCP: u64 = 1 << 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;
const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;
const RULE_NET_PORT: libc::c_int = 2;

#[repr(C)]
pub struct RulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

#[repr(C, packed)]
pub struct PathBeneathAttr {
    pub allowed_access: u64,
    pub parent_fd: i32,
}

#[repr(C)]
pub struct NetPortAttr {
    pub allowed_access: u64,
    pub port: u64,
}

/// The Landlock ABI version the kernel offers, or why there is none.
pub fn abi_version() -> Result<u32, String> {
    // SAFETY: the documented version query: null attr, size 0.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel has no Landlock support (needs Linux 5.13+)".into(),
            Some(libc::EOPNOTSUPP) => "Landlock is disabled (boot with lsm=…,landlock)".into(),
            _ => format!("landlock_create_ruleset failed: {err}"),
        });
    }
    Ok(v as u32)
}

/// One path and what may be done beneath it.
#[derive(Debug)]
pub struct Rule {
    pub path: CString,
    pub access: u64,
}

/// A ruleset ready to apply: what is handled, and the allowances.
#[derive(Debug)]
pub struct Plan {
    pub abi: u32,
    pub handled_fs: u64,
    pub handled_net: u64,
    pub scoped: u64,
    pub rules: Vec<Rule>,
    /// TCP ports that may be bound (where Landlock handles the network: ABI 4+; below
    /// that nothing is handled and the namespace's lone `lo` is the boundary).
    pub bind_ports: Vec<u16>,
    /// TCP ports that may be connected to (skillbox's egress proxy on the sandbox's
    /// own loopback; the same ABI caveat).
    pub connect_ports: Vec<u16>,
}

impl Plan {
    /// Reads and executes everywhere; writes only beneath `writable` paths (and the
    /// harmless device nodes); no TCP but a listener on `bind_ports` and connects to
    /// `connect_ports`; no abstract sockets or signals out of the sandbox.
    pub fn sandbox(
        abi: u32,
        writable: &[&str],
        devices: &[&str],
        ttys: &[&str],
        bind_ports: &[u16],
        connect_ports: &[u16],
    ) -> Plan {
        let mut handled_fs = ACCESS_FS_ABI1_ALL;
        if abi >= 2 {
            handled_fs |= ACCESS_FS_REFER;
        }
        if abi >= 3 {
            handled_fs |= ACCESS_FS_TRUNCATE;
        }
        if abi >= 5 {
            handled_fs |= ACCESS_FS_IOCTL_DEV;
        }
        let handled_net = if abi >= 4 {
            ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP
        } else {
            0
        };
        let scoped = if abi >= 6 {
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        } else {
            0
        };
        let read = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR;
        let mut rules = vec![Rule {
            path: cstring("/"),
            access: read,
        }];
        for path in writable {
            rules.push(Rule {
                path: cstring(path),
                access: handled_fs,
            });
        }
        let device = ACCESS_FS_READ_FILE | ACCESS_FS_WRITE_FILE | (handled_fs & ACCESS_FS_TRUNCATE);
        for path in devices {
            rules.push(Rule {
                path: cstring(path),
                access: device,
            });
        }
        // Terminals need their ioctls (seccomp still refuses TIOCSTI and TIOCLINUX).
        let tty = device | ACCESS_FS_READ_DIR | (handled_fs & ACCESS_FS_IOCTL_DEV);
        for path in ttys {
            rules.push(Rule {
                path: cstring(path),
                access: tty,
            });
        }
        Plan {
            abi,
            handled_fs,
            handled_net,
            scoped,
            rules,
            bind_ports: if handled_net != 0 {
                bind_ports.to_vec()
            } else {
                Vec::new()
            },
            connect_ports: if handled_net != 0 {
                connect_ports.to_vec()
            } else {
                Vec::new()
            },
        }
    }
}

fn cstring(path: &str) -> CString {
    CString::new(path).unwrap_or_default()
}

/// Applies `plan` to the calling thread. Raw syscalls only (safe after clone).
/// Returns the errno of the first failure.
///
/// # Safety
/// Must be called with `no_new_privs` already set.
pub unsafe fn apply(plan: &Plan) -> Result<(), i32> {
    let attr = RulesetAttr {
        handled_access_fs: plan.handled_fs,
        handled_access_net: plan.handled_net,
        scoped: plan.scoped,
    };
    // Older ABIs reject the fields they do not know: pass only the prefix they have.
    let size = if plan.abi >= 6 {
        std::mem::size_of::<RulesetAttr>()
    } else if plan.abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` outlives the call and `size` never exceeds its size.
    let ruleset = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    };
    if ruleset < 0 {
        return Err(errno());
    }
    let ruleset = ruleset as libc::c_int;
    for rule in &plan.rules {
        // SAFETY: a NUL-terminated path from the plan.
        let fd = unsafe { libc::open(rule.path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        let beneath = PathBeneathAttr {
            allowed_access: rule.access,
            parent_fd: fd,
        };
        // SAFETY: `beneath` outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                RULE_PATH_BENEATH,
                &beneath as *const PathBeneathAttr,
                0u32,
            )
        };
        // SAFETY: closing the fd opened above.
        unsafe { libc::close(fd) };
        if rc < 0 {
            return Err(errno());
        }
    }
    let ports = plan
        .bind_ports
        .iter()
        .map(|p| (ACCESS_NET_BIND_TCP, p))
        .chain(
            plan.connect_ports
                .iter()
                .map(|p| (ACCESS_NET_CONNECT_TCP, p)),
        );
    for (access, port) in ports {
        let rule = NetPortAttr {
            allowed_access: access,
            port: u64::from(*port),
        };
        // SAFETY: `rule` outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset,
                RULE_NET_PORT,
                &rule as *const NetPortAttr,
                0u32,
            )
        };
        if rc < 0 {
            return Err(errno());
        }
    }
    // SAFETY: the ruleset fd from above.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    // SAFETY: closing our own fd.
    unsafe { libc::close(ruleset) };
    if rc < 0 { Err(errno()) } else { Ok(()) }
}

pub fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
