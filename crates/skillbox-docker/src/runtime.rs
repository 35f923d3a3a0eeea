//! Which OCI runtime runs a sandbox container, and what skillbox's own helpers run with
//! under each: the interpreter and the syscall numbers they call by number.

use skillbox_env::BackendKind;

/// Execute-only (0711, root) copies of the interpreters skillbox's own helpers run
/// under runc: see [`Runtime::perl`]. The image build puts them there.
pub(crate) const PRIVATE_PERL: &str = "/usr/lib/skillbox/perl";
pub(crate) const PRIVATE_PYTHON: &str = "/usr/lib/skillbox/python3";

/// prctl and seccomp, which the perl helpers call by number (`syscall`).
#[cfg(target_arch = "x86_64")]
pub(crate) const NR_PRCTL: u32 = 157;
/// exit_group, by which the exec wrapper ends itself (`_exit` without loading perl's
/// POSIX module, which costs ~18 ms an exec under gVisor).
#[cfg(target_arch = "x86_64")]
pub(crate) const NR_EXIT_GROUP: u32 = 231;
#[cfg(target_arch = "aarch64")]
pub(crate) const NR_EXIT_GROUP: u32 = 94;
#[cfg(target_arch = "x86_64")]
pub(crate) const NR_SECCOMP: u32 = 317;
#[cfg(target_arch = "aarch64")]
pub(crate) const NR_PRCTL: u32 = 167;
#[cfg(target_arch = "aarch64")]
pub(crate) const NR_SECCOMP: u32 = 277;

/// Which OCI runtime runs the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// Docker's default (`runc`): the host kernel behind namespaces, cgroups, seccomp.
    Runc,
    /// gVisor (`runsc`): a user-space kernel between the code and the host kernel.
    Runsc,
}

impl Runtime {
    /// The skillbox backend kind.
    pub fn backend(self) -> BackendKind {
        match self {
            Runtime::Runc => BackendKind::Docker,
            Runtime::Runsc => BackendKind::Gvisor,
        }
    }

    /// The runtime name the daemon knows.
    pub fn docker_name(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }

    /// The perl that runs skillbox's init, exec wrapper and killer.
    ///
    /// Under runc, the image's execute-only copy: the sandbox user cannot read it, so
    /// the kernel makes every process started from it non-dumpable from its first
    /// instruction. The sandbox's code (the same uid) never gets a moment in which it
    /// could write a helper's memory through `/proc/<pid>/mem`, before the helper's
    /// own `prctl` or its filter. gVisor cannot load a binary it cannot read: there,
    /// the plain interpreter, which makes itself undumpable as its first act.
    pub(crate) fn perl(self) -> &'static str {
        match self {
            Runtime::Runc => PRIVATE_PERL,
            Runtime::Runsc => "/usr/bin/perl",
        }
    }

    /// The python that runs skillbox's file helper, as [`Runtime::perl`].
    pub(crate) fn python(self) -> &'static str {
        match self {
            Runtime::Runc => PRIVATE_PYTHON,
            Runtime::Runsc => "/usr/bin/python3",
        }
    }
}

/// skillbox's file helper (`helpers/fs.py`), run by the runtime's python.
pub(crate) const FS_PY: &str = include_str!("helpers/fs.py");
/// A walk whose regular files come to at most this many bytes reads them too, in the
/// same helper run, for the `read_files` that follows (a run's collection).
pub(crate) const READ_AHEAD_BYTES: u64 = 8 * 1024 * 1024;

/// The file helper's command line under `runtime`: operation `op` with `args`.
pub(crate) fn helper_argv(runtime: Runtime, op: &str, args: &[String]) -> Vec<String> {
    let mut argv: Vec<String> = [runtime.python(), "-I", "-S", "-c", FS_PY, op]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.extend(args.iter().cloned());
    argv
}

/// The arguments of the helper's `walkread` of `root` (absolute, as the helper takes
/// it): the same walk whether it runs on its own or at the end of an exec.
pub(crate) fn walkread_args(root: &str, max_entries: usize, prune: &[&str]) -> Vec<String> {
    let mut args = vec![
        root.to_string(),
        max_entries.to_string(),
        READ_AHEAD_BYTES.to_string(),
    ];
    args.extend(prune.iter().map(|p| p.to_string()));
    args
}
