//! What a service leaves on disk: who supervises it (`Owner`), its record (`NAME.json`)
//! and its lock (`NAME.lock`), under the project's services directory.

use std::fmt;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use skillbox_env::{EnvError, ErrorCode};
use skillbox_protocol::ServiceInfo;

/// Who supervises a service: the process that holds its lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Owner {
    pub pid: u32,
    /// `skillbox serve` or `skillbox cap start`.
    pub command: String,
    /// When the process started (clock ticks after boot, `/proc/<pid>/stat`), so a pid
    /// used again by another process is not taken for it.
    #[serde(default)]
    pub started: u64,
}

/// When `pid` started, in clock ticks after boot; none when there is no such process.
pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: count from the last `)`.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

impl Owner {
    /// This process, as `command`.
    pub fn this_process(command: &str) -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            command: command.to_string(),
            started: start_time(pid).unwrap_or(0),
        }
    }

    /// The owner is still the process that wrote the record.
    pub(super) fn alive(&self) -> bool {
        self.started != 0 && start_time(self.pid) == Some(self.started)
    }

    /// Stopped by a signal (`cap start`'s supervisor), not by asking (`serve`).
    pub(super) fn answers_sigterm(&self) -> bool {
        self.command == CAP_START
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (pid {})", self.command, self.pid)
    }
}

/// The owner command of `skillbox cap start`'s supervisor.
pub const CAP_START: &str = "skillbox cap start";
/// The owner command of `skillbox serve`.
pub const SERVE: &str = "skillbox serve";

/// What `NAME.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct Record {
    pub(super) info: ServiceInfo,
    pub(super) owner: Owner,
    pub(super) boot_id: String,
    /// The host socket this service made (removed with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) socket: Option<PathBuf>,
}

pub(super) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The services directory of `project` under `data_dir`.
pub fn services_dir(data_dir: &Path, project: &Path) -> PathBuf {
    let key = skillbox_store::sha256_hex(project.as_os_str().as_encoded_bytes());
    data_dir.join("services").join(&key[..16])
}

/// An exclusive lock on `NAME.lock`, held for as long as the record is ours.
#[derive(Debug)]
pub(super) struct NameLock {
    pub(super) _file: std::fs::File,
}

pub(super) fn open_lock(path: &Path) -> Result<std::fs::File, EnvError> {
    crate::trust::open_lock_file(path).map_err(|e| EnvError::io(&e, "open", path))
}

/// Takes `path`'s lock if nobody holds it.
pub(super) fn try_lock(path: &Path, exclusive: bool) -> Result<Option<NameLock>, EnvError> {
    let file = open_lock(path)?;
    let how = if exclusive {
        rustix::fs::FlockOperation::NonBlockingLockExclusive
    } else {
        rustix::fs::FlockOperation::NonBlockingLockShared
    };
    match rustix::fs::flock(file.as_fd(), how) {
        Ok(()) => Ok(Some(NameLock { _file: file })),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(EnvError::io(&e.into(), "lock", path)),
    }
}

/// Writes `record` to `path` whole or not at all.
pub(super) fn write_record(path: &Path, record: &Record) -> Result<(), EnvError> {
    let text = serde_json::to_vec_pretty(record)
        .map_err(|e| EnvError::new(ErrorCode::Unknown, format!("service record: {e}")))?;
    let temp = path.with_extension("json.tmp");
    std::fs::write(&temp, text).map_err(|e| EnvError::io(&e, "write", &temp))?;
    std::fs::rename(&temp, path).map_err(|e| EnvError::io(&e, "rename", path))
}

pub(super) fn read_record(path: &Path) -> Option<Record> {
    let text = std::fs::read(path).ok()?;
    match serde_json::from_slice(&text) {
        Ok(record) => Some(record),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "services: unreadable record");
            None
        }
    }
}
