//! What each native layer gets on this host, for `skillbox doctor` and for refusing
//! early with a precise reason.

use skillbox_env::{BackendKind, BackendReport, Layer};

use crate::cgroup;
use crate::landlock;

fn layer(available: bool, detail: impl Into<String>) -> Layer {
    Layer::new(available, detail)
}

fn namespace_layers() -> Vec<(&'static str, Layer)> {
    // One throwaway child in every namespace tells us more than reading sysctls.
    let flags = libc::CLONE_NEWUSER
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWNS
        | libc::CLONE_NEWNET
        | libc::CLONE_NEWIPC
        | libc::CLONE_NEWUTS;
    // SAFETY: plain fork-like clone; the child exits immediately without touching memory.
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    if pid == 0 {
        // SAFETY: child: exit at once.
        unsafe { libc::_exit(0) };
    }
    let result = if pid < 0 {
        Err(std::io::Error::last_os_error().to_string())
    } else {
        let mut status = 0;
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        Ok(())
    };
    let names = [
        "user_ns", "pid_ns", "net_ns", "mount_ns", "ipc_ns", "uts_ns",
    ];
    names
        .into_iter()
        .map(|name| match &result {
            Ok(()) => (name, layer(true, "new namespace per sandbox")),
            Err(e) => (name, layer(false, format!("cannot create namespaces: {e}"))),
        })
        .collect()
}

/// Probes every layer. Cheap enough to call once per CLI run.
pub fn probe() -> BackendReport {
    let mut layers: std::collections::BTreeMap<&'static str, Layer> =
        namespace_layers().into_iter().collect();
    match landlock::abi_version() {
        Ok(abi) => {
            let extra = if abi >= 6 {
                ", abstract-socket and signal scoping"
            } else {
                ""
            };
            layers.insert(
                "landlock",
                layer(
                    true,
                    format!("ABI {abi}: writes only under /workspace, /tmp{extra}"),
                ),
            );
        }
        Err(e) => {
            layers.insert("landlock", layer(false, e));
        }
    }
    // SAFETY: querying our own seccomp mode.
    let seccomp_mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
    layers.insert(
        "seccomp",
        if seccomp_mode >= 0 {
            layer(true, "BPF deny list (ptrace, mount, unshare/setns, bpf, io_uring, keyctl, TIOCSTI, non-native ABIs, …)")
        } else {
            layer(false, "prctl(PR_GET_SECCOMP) failed: kernel without seccomp")
        },
    );
    let host = cgroup::Host::get();
    layers.insert(
        "cgroup",
        layer(!matches!(host, cgroup::Host::None(_)), host.describe()),
    );
    let memory = if host.has("memory") {
        layer(true, "cgroup memory limit, no swap")
    } else {
        layer(true, "rlimit RLIMIT_AS (address space; no cgroup here)")
    };
    layers.insert("memory_limit", memory);
    let pids = if host.has("pids") {
        layer(true, "cgroup pids limit")
    } else {
        layer(
            true,
            "rlimit RLIMIT_NPROC per sandbox user namespace (no cgroup here)",
        )
    };
    layers.insert("pids_limit", pids);
    layers.insert(
        "cpu_limit",
        if host.has("cpu") {
            layer(true, "cgroup CPU bandwidth (cpus) + RLIMIT_CPU (seconds)")
        } else {
            layer(
                true,
                "RLIMIT_CPU (seconds) only; a `cpus` limit is refused without a cgroup",
            )
        },
    );
    layers.insert("rlimits", layer(true, "NOFILE, FSIZE, CPU, CORE=0"));
    layers.insert(
        "bind_sources",
        if crate::trees::captured_here() {
            layer(
                true,
                "captured once at create (detached mounts): an exec never looks a bind's path up again",
            )
        // SAFETY: geteuid has no preconditions.
        } else if unsafe { libc::geteuid() } == 0 {
            layer(
                false,
                "looked up by path at each exec: this kernel cannot clone a detached mount",
            )
        } else {
            layer(
                false,
                "looked up by path at each exec (unprivileged: no detached mounts in the host's namespace)",
            )
        },
    );
    // The same tmpfs a sandbox makes, made and dropped: proves the bound can be given.
    // SAFETY: geteuid/getegid have no preconditions.
    let owner = unsafe {
        crate::ids::HostIds {
            uid: libc::geteuid(),
            gid: libc::getegid(),
        }
    };
    layers.insert(
        "disk_limit",
        match crate::scratch::Scratch::create(1 << 20, 64, owner) {
            // Older kernel: each exec's clone comes from its helper's namespace; making
            // one proves that works too.
            Ok(scratch) if scratch.cloned_per_exec() => match scratch.exec_tree() {
                Ok(_) => layer(
                    true,
                    "a tmpfs per sandbox (bytes and inodes) for /workspace and /tmp, never mounted on the host (kept in a mount namespace of its own: this kernel cannot clone a detached one)",
                ),
                Err(e) => layer(false, e),
            },
            Ok(_) => layer(
                true,
                "a tmpfs per sandbox (bytes and inodes) for /workspace and /tmp, never mounted on the host",
            ),
            Err(e) => layer(false, e),
        },
    );
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    layers.insert(
        "user",
        layer(
            true,
            if root {
                "runs as uid 1000 inside, host uid 65534 (nobody)"
            } else {
                "runs as uid 1000 inside, mapped to the calling user"
            },
        ),
    );
    let missing: Vec<&str> = [
        "user_ns", "pid_ns", "net_ns", "mount_ns", "landlock", "seccomp",
    ]
    .into_iter()
    .filter(|name| !layers.get(name).is_some_and(|l| l.available))
    .collect();
    let reason = (!missing.is_empty()).then(|| {
        let details: Vec<String> = missing
            .iter()
            .map(|name| {
                format!(
                    "{name}: {}",
                    layers.get(name).map(|l| l.detail.as_str()).unwrap_or("")
                )
            })
            .collect();
        details.join("; ")
    });
    BackendReport {
        layers: layers
            .into_iter()
            .map(|(name, layer)| (name.to_string(), layer))
            .collect(),
        ..BackendReport::new(BackendKind::Native, reason)
    }
}
