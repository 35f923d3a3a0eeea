//! What a sandbox may use and see: [`Limits`] (resources) and [`SandboxPolicy`]
//! (extra mounts), bundled with a workspace into a [`SandboxSpec`].

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use skillbox_protocol::WorkspaceRoot;

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

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
    /// Size of the sandbox's private `/tmp` (less when `disk_bytes` is smaller; see
    /// [`Limits::disk_split`]).
    pub tmp_bytes: u64,
    /// Bytes of `/workspace` and `/tmp` together. Only a workspace the sandbox owns can
    /// be bounded (a temp one, never a caller's `--workdir` on the host's filesystem):
    /// a backend refuses this with a workdir rather than drop it.
    pub disk_bytes: Option<u64>,
    /// Files and directories in `/workspace` and `/tmp` together. `None` with a disk
    /// bound: one per 16 KiB of it, where the backend can hold an inode bound (gVisor's
    /// runsc cannot; one asked for there is refused).
    pub disk_inodes: Option<u64>,
}

/// How a disk bound is shared between `/workspace` and `/tmp`: one rule for every
/// backend, so the two together never exceed the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskSplit {
    pub workspace_bytes: u64,
    pub workspace_inodes: u64,
    pub tmp_bytes: u64,
    pub tmp_inodes: u64,
    /// The inode bound was asked for (not derived from the bytes).
    pub inodes_asked: bool,
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
            disk_bytes: Some(GIB),
            disk_inodes: None,
        }
    }
}

impl DiskSplit {
    /// Whether a bounded filesystem of `size` bytes is full, or as good as: less left
    /// than a failed write leaves behind (1/64 of it, between 64 KiB and 1 MiB), or no
    /// inodes left. What a backend reads after a failed exec to say `limitHit: disk`.
    pub fn is_full(size: u64, free_bytes: u64, free_inodes: Option<u64>) -> bool {
        // Some kernels (gVisor's) report no inode counts at all: `None` then.
        free_bytes < (size / 64).clamp(64 * 1024, 1 << 20) || free_inodes == Some(0)
    }
}

/// Smallest disk bound: room for a script, its inputs and a few files.
pub const MIN_DISK_BYTES: u64 = MIB;
/// Fewest inodes a disk bound may allow.
pub const MIN_DISK_INODES: u64 = 64;
/// Bytes of disk bound per inode when no inode bound is given.
pub const BYTES_PER_INODE: u64 = 16 * 1024;

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
        if self.disk_bytes.is_some_and(|b| b < MIN_DISK_BYTES) {
            return Err(format!("diskBytes must be at least {MIN_DISK_BYTES} (1M)"));
        }
        if self.disk_inodes.is_some_and(|n| n < MIN_DISK_INODES) {
            return Err(format!("diskInodes must be at least {MIN_DISK_INODES}"));
        }
        // Without a disk there is nothing for an inode bound to hold: refused, not
        // dropped.
        if self.disk_inodes.is_some() && self.disk_bytes.is_none() {
            return Err("diskInodes bounds a disk: it needs diskBytes (a disk bound)".into());
        }
        Ok(())
    }

    /// The sizes of `/workspace` and `/tmp` under the disk bound: `/tmp` gets at most a
    /// quarter of it (and never more than `tmp_bytes`), `/workspace` the rest; inodes
    /// likewise. `None`: no disk bound (`/tmp` is still `tmp_bytes`).
    pub fn disk_split(&self) -> Option<DiskSplit> {
        let disk = self.disk_bytes?;
        let tmp_bytes = self.tmp_bytes.min(disk / 4).max(4096);
        let inodes = self
            .disk_inodes
            .unwrap_or(disk / BYTES_PER_INODE)
            .max(MIN_DISK_INODES);
        let tmp_inodes = (inodes / 4).max(16);
        Some(DiskSplit {
            workspace_bytes: disk - tmp_bytes,
            workspace_inodes: inodes - tmp_inodes,
            tmp_bytes,
            tmp_inodes,
            inodes_asked: self.disk_inodes.is_some(),
        })
    }

    /// The size `/tmp` gets, with or without a disk bound.
    pub fn tmp_size(&self) -> u64 {
        self.disk_split()
            .map_or(self.tmp_bytes, |split| split.tmp_bytes)
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

/// A host directory a capability declared (DESIGN.md §3.1: `policy.volumes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    /// Absolute path on the host, without a symlink on the way.
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub sandbox: PathBuf,
    /// The sandbox may write there.
    #[serde(default)]
    pub rw: bool,
}

/// What the sandbox may see beyond its defaults. Deny by default: no network, no host
/// paths other than the system directories and the workspace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct SandboxPolicy {
    /// Extra read-only mounts (e.g. a runtime's packages).
    pub read_only_mounts: Vec<Mount>,
    /// A capability's volumes: host directories shown exactly, each reached without a
    /// symlink on its path and held from then on (native, as root: by fd), alone at its
    /// place in the sandbox. A read-write one is never bounded by `diskBytes` (it is the
    /// host's filesystem), never gets a setuid file (seccomp), and is written as the
    /// directory's owner, never root. A backend that cannot show one refuses the spec;
    /// none drops it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// TCP ports the code may listen on, on the sandbox's own loopback (a persistent
    /// service's port). The sandbox still has no network: only skillbox's connector
    /// reaches them. Nothing else may be bound.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub listen_ports: Vec<u16>,
    /// Egress through skillbox's proxy on the host side, on an allowlist (DESIGN.md
    /// §8): the sandbox still has no interface but `lo`, where the proxy listens.
    /// `None`: no network at all. A backend without a proxy refuses it (`unavailable`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<skillbox_protocol::NetworkPolicy>,
    /// Bytes through the proxy, both ways, over all connections (`limits.egressBytes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<u64>,
    /// Secrets added at egress, by environment variable name (§3.8): the sandbox sees
    /// placeholders; their values are never serialized (nor printed).
    #[serde(skip)]
    pub secrets: std::collections::BTreeMap<String, skillbox_protocol::SecretSpec>,
}

impl SandboxPolicy {
    /// Whether the sandbox gets egress: a network policy with an allow entry (one
    /// without is no network, as no policy is).
    pub fn wants_egress(&self) -> bool {
        self.network.as_ref().is_some_and(|n| !n.allow.is_empty())
    }

    /// The refusal of a backend that has no egress proxy, when this policy asks for one
    /// (a network policy, or secrets, which go out through the proxy).
    pub fn refuse_egress(&self, backend: &str) -> Result<(), crate::EnvError> {
        if !self.secrets.is_empty() {
            return Err(crate::EnvError::unavailable(format!(
                "egress secrets: the {backend} backend has no egress proxy to add them at; \
                 use the native, docker or gvisor backend"
            )));
        }
        if self.wants_egress() {
            return Err(crate::EnvError::unavailable(format!(
                "egress: the {backend} backend has no egress proxy yet, and a sandbox with a \
                 network policy never runs with more network or less than it asked; use the \
                 native, docker or gvisor backend"
            )));
        }
        Ok(())
    }
}

/// Everything a backend needs to create a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// Host directory shown read-write as the workspace; `None` makes a temporary one
    /// that `cleanup` removes.
    pub workspace: Option<PathBuf>,
    /// Where the workspace is in the sandbox (`/workspace` unless configured): its
    /// mount, the default working directory and the writable place a file operation
    /// may write. Every backend puts it there or refuses the spec.
    pub root: WorkspaceRoot,
    pub limits: Limits,
    pub policy: SandboxPolicy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_split_never_exceeds_the_bound() {
        for (disk, tmp, inodes) in [
            (GIB, 256 * MIB, Some(65_536)),
            (MIB, 256 * MIB, Some(64)),
            (64 * MIB, 32 * MIB, None),
            (10 * GIB, 256 * MIB, Some(1_000_000)),
        ] {
            let limits = Limits {
                disk_bytes: Some(disk),
                disk_inodes: inodes,
                tmp_bytes: tmp,
                ..Limits::default()
            };
            limits.validate().unwrap();
            let split = limits.disk_split().unwrap();
            assert_eq!(split.workspace_bytes + split.tmp_bytes, disk);
            assert!(split.tmp_bytes <= tmp && split.tmp_bytes <= disk / 4);
            let sum = split.workspace_inodes + split.tmp_inodes;
            match inodes {
                Some(inodes) => assert_eq!(sum, inodes),
                None => assert_eq!(sum, (disk / BYTES_PER_INODE).max(MIN_DISK_INODES)),
            }
            assert_eq!(split.inodes_asked, inodes.is_some());
            assert_eq!(limits.tmp_size(), split.tmp_bytes);
        }
        let unbounded = Limits {
            disk_bytes: None,
            ..Limits::default()
        };
        assert_eq!(unbounded.disk_split(), None);
        assert_eq!(unbounded.tmp_size(), unbounded.tmp_bytes);
    }

    #[test]
    fn a_disk_bound_too_small_to_use_is_refused() {
        let tiny = Limits {
            disk_bytes: Some(4096),
            ..Limits::default()
        };
        assert!(tiny.validate().unwrap_err().contains("diskBytes"));
        let few = Limits {
            disk_inodes: Some(3),
            ..Limits::default()
        };
        assert!(few.validate().unwrap_err().contains("diskInodes"));
        let no_disk = Limits {
            disk_bytes: None,
            disk_inodes: Some(MIN_DISK_INODES),
            ..Limits::default()
        };
        assert!(no_disk.validate().unwrap_err().contains("needs diskBytes"));
    }
}
