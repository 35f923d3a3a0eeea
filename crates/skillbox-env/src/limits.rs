//! What a sandbox may use and see: [`Limits`] (resources) and [`SandboxPolicy`]
//! (extra mounts), bundled with a workspace into a [`SandboxSpec`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

const MIB: u64 = 1024 * 1024;

/// The longest wall-clock limit anything accepts.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Resource limits of a sandbox. `None` means "not limited by this layer"; a backend
/// that cannot enforce a `Some` limit refuses with `unavailable` rather than dropping it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct Limits {
    /// Memory (RAM, no swap) for the whole process tree.
    pub memory_bytes: Option<u64>,
    /// Number of processes and threads.
    pub pids: Option<u32>,
    /// CPU seconds per process (RLIMIT_CPU).
    pub cpu_seconds: Option<u64>,
    /// CPU bandwidth in cores (e.g. 0.5); needs a cgroup.
    pub cpus: Option<f64>,
    /// Largest file a process may write (RLIMIT_FSIZE).
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors per process (RLIMIT_NOFILE).
    pub open_files: Option<u64>,
    /// Wall-clock time of one exec, in milliseconds.
    pub timeout_ms: u64,
    /// Bytes kept per output stream; the rest is drained and dropped.
    pub output_bytes: u64,
    /// Size of the sandbox's private `/tmp`.
    pub tmp_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: Some(1024 * MIB),
            pids: Some(256),
            cpu_seconds: Some(300),
            cpus: None,
            file_size_bytes: Some(512 * MIB),
            open_files: Some(1024),
            timeout_ms: 60_000,
            output_bytes: MIB,
            tmp_bytes: 256 * MIB,
        }
    }
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    /// Checks the values once, so backends can take them as they are.
    pub fn validate(&self) -> Result<(), String> {
        if self.timeout_ms == 0 || Duration::from_millis(self.timeout_ms) > MAX_TIMEOUT {
            return Err("timeoutMs must be between 1 and 86400000 (24 hours)".into());
        }
        if self.memory_bytes == Some(0) {
            return Err("memoryBytes must be greater than 0".into());
        }
        if self.pids == Some(0) {
            return Err("pids must be greater than 0".into());
        }
        if let Some(cpus) = self.cpus
            && !(cpus.is_finite() && cpus > 0.0)
        {
            return Err("cpus must be a positive number of cores".into());
        }
        if self.tmp_bytes < 4096 {
            return Err("tmpBytes must be at least 4096".into());
        }
        Ok(())
    }
}

/// A host path shown read-only inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Mount {
    /// Absolute path on the host.
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub sandbox: PathBuf,
}

/// What the sandbox may see beyond its defaults. Deny by default: no network, no host
/// paths other than the system directories and the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SandboxPolicy {
    /// Extra read-only mounts (e.g. a runtime's packages).
    pub read_only_mounts: Vec<Mount>,
}

/// Everything a backend needs to create a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// Host directory shown read-write as `/workspace`; `None` makes a temporary one
    /// that `cleanup` removes.
    pub workspace: Option<PathBuf>,
    pub limits: Limits,
    pub policy: SandboxPolicy,
}
