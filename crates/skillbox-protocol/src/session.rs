//! Sessions: one sandbox kept open across many steps (`/v1/sessions…`): create it, exec
//! in it with streamed output, read and write its files, delete it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::exec::{LimitKind, Truncated};
use crate::run::{Encoding, SkillsPlaced, SnapshotReport};

/// Bounds a session may ask for, each at most the server's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionLimits {
    /// Each exec's wall-clock limit unless the exec gives its own (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Memory for the whole process tree of an exec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u32>,
    /// Bytes of `/workspace` and `/tmp` together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Bytes through the egress proxy, both ways, over the session's life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<u64>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionCreateRequest {
    /// Which sandbox (default `native`; `host` is refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<SessionLimits>,
    /// Skills placed in `/workspace` when it opens, as `POST /v1/run`'s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Start from this scope's last snapshot of `/workspace`; a new one is saved when
    /// the session is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    /// Ended after this long without a call (default 600000: 10 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Ended this long after it opened, whatever it is doing (default 3600000: 1 hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lifetime_ms: Option<u64>,
    /// What its commands may reach through skillbox's egress proxy (native backend):
    /// none without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkPolicy>,
}

/// A session, as `POST /v1/sessions` and `GET /v1/sessions/{id}` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionInfo {
    pub id: String,
    pub backend: BackendKind,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    pub last_used_at_ms: u64,
    /// When it ends whatever it is doing.
    pub expires_at_ms: u64,
    pub idle_timeout_ms: u64,
    /// Execs running now.
    pub execs_running: usize,
    /// How long opening it took (sandbox, snapshot, skills).
    pub open_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<SkillsPlaced>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotReport>,
    /// The connections its commands asked the egress proxy for, with a network policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::EgressConnection>,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionList {
    pub sessions: Vec<SessionInfo>,
}

/// `POST /v1/sessions/{id}/exec`: exactly one of `command` (an argv, no shell) and
/// `shell` (a script for `/bin/sh -c`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionExecRequest {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<String>,
    /// Working directory (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Fed to the command's stdin (none: it reads end of file at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    #[serde(default)]
    pub stdin_encoding: Encoding,
    /// This exec's wall-clock limit (default: the session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// One line of an exec's stream (`application/x-ndjson`), in order: `started`, any
/// number of `stdout`/`stderr` chunks as the command writes them, then `exit` (or
/// `error`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum SessionExecEvent {
    /// The exec's id, for `POST /v1/sessions/{id}/execs/{execId}/cancel`.
    Started {
        #[serde(rename = "execId")]
        exec_id: String,
    },
    /// UTF-8 text (invalid bytes replaced; a character split between chunks is kept
    /// whole).
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    /// How it ended.
    Exit {
        #[serde(rename = "exitCode")]
        exit_code: Option<i32>,
        signal: Option<i32>,
        #[serde(rename = "timedOut")]
        timed_out: bool,
        #[serde(rename = "limitHit")]
        limit_hit: Option<LimitKind>,
        #[serde(rename = "durationMs")]
        duration_ms: u64,
        truncated: Truncated,
        /// Cancelled by a cancel request or the session's end.
        cancelled: bool,
    },
    /// It could not run, or the stream broke; no `exit` follows.
    Error {
        code: String,
        message: String,
    },
}

/// One entry of `GET /v1/sessions/{id}/ls`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionFileEntry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Bytes, for a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// `GET /v1/sessions/{id}/ls`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SessionListing {
    /// Relative to `/workspace`.
    pub path: String,
    pub entries: Vec<SessionFileEntry>,
}
