//! `POST /v1/run`: one script in a fresh sandbox, and the files it made.

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::exec::{LimitKind, Truncated, shell_status};

/// The longest `timeoutMs` a run may ask for (10 minutes).
pub const MAX_TIMEOUT_MS: u64 = 600_000;

/// The script's language.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Node.js with pptxgenjs preinstalled.
    #[default]
    Node,
    Python,
    Sh,
}

impl Language {
    pub fn as_str(self) -> &'static str {
        match self {
            Language::Node => "node",
            Language::Python => "python",
            Language::Sh => "sh",
        }
    }

    /// From a script's file name: `.js/.mjs/.cjs` node, `.py` python, `.sh` sh.
    pub fn from_extension(name: &str) -> Option<Language> {
        match name.rsplit_once('.')?.1 {
            "js" | "mjs" | "cjs" => Some(Language::Node),
            "py" => Some(Language::Python),
            "sh" => Some(Language::Sh),
            _ => None,
        }
    }
}

/// How a file's `content` is encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// An input file placed in `/workspace` before the script runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FileInput {
    /// Relative to `/workspace`; no `..`, not absolute.
    pub path: String,
    pub content: String,
    #[serde(default)]
    pub encoding: Encoding,
}

/// `POST /v1/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRequest {
    pub script: String,
    #[serde(default)]
    pub language: Language,
    /// Wall-clock limit, 1..=600000 ms (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileInput>,
    /// Which sandbox (default `native`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<BackendKind>,
    /// Which files come back, as globs relative to `/workspace` (`*.pptx`, `out/**`).
    /// Default: every file with no path component that starts with `.`; a hidden file
    /// comes back only when a glob spells its dot (`.config/*.json`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<String>,
    /// Tighter bounds than the server's own (never looser).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
    /// Skills placed in `/workspace` first, by name: the workspace's (`skills/<name>`),
    /// the staged ones (`.skills-cache/<source>/<name>`) and the tenant's own
    /// (`.skills-cache/user/<name>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Start from this scope's last snapshot of `/workspace` (what an earlier run with
    /// the same key installed or built), and save a new one after the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_key: Option<String>,
    /// What the code may reach, through skillbox's proxy (native backend): none
    /// without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::NetworkPolicy>,
    /// Secrets by environment variable name (§3.8): the code sees a placeholder, the
    /// proxy sends the value to the secret's hosts only. Needs `network`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub secrets: std::collections::BTreeMap<String, crate::SecretSpec>,
}

/// Bounds a run may ask for, each at most the server's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunLimits {
    /// Bytes of `/workspace` and `/tmp` together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// Files and directories in `/workspace` and `/tmp` together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_inodes: Option<u64>,
    /// Bytes through the egress proxy, both ways, over all connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_bytes: Option<u64>,
}

impl RunRequest {
    pub fn new(language: Language, script: impl Into<String>) -> Self {
        RunRequest {
            script: script.into(),
            language,
            timeout_ms: None,
            files: Vec::new(),
            backend: None,
            outputs: Vec::new(),
            limits: None,
            skills: Vec::new(),
            scope_key: None,
            network: None,
            secrets: std::collections::BTreeMap::new(),
        }
    }
}

/// A file the script left in `/workspace`, stored and downloadable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ArtifactInfo {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub content_type: String,
    /// `/v1/objects/{sha256}?name=…`, relative to the server.
    pub url: String,
}

/// What happened: the exec result plus the artifacts. Hitting a limit is a normal
/// result (`timedOut` / `limitHit`), not an error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunResult {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
    pub limit_hit: Option<LimitKind>,
    pub duration_ms: u64,
    pub truncated: Truncated,
    pub files: Vec<ArtifactInfo>,
    /// The skills placed in `/workspace`, when the request named some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skills: Option<SkillsPlaced>,
    /// The scope's snapshots, when the request gave a `scopeKey`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotReport>,
    /// Every connection the code asked the egress proxy for, with a network policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<crate::EgressConnection>,
}

/// What a run's skills projection placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SkillsPlaced {
    /// By name, each with its folder in the sandbox.
    pub skills: Vec<PlacedSkill>,
    pub files: usize,
    pub bytes: u64,
    /// False when the workspace already had them (restored with a snapshot): nothing
    /// was copied.
    pub copied: bool,
    pub fingerprint: String,
}

/// One skill a run could use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacedSkill {
    pub name: String,
    /// `/workspace/skills/report`.
    pub path: String,
}

/// What a run did with its scope's snapshots.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotReport {
    /// The snapshot it started from (none: the scope had none yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored: Option<String>,
    /// The snapshot it left, now the scope's latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved: Option<String>,
    /// Files and bytes in the saved one.
    #[serde(default)]
    pub files: usize,
    #[serde(default)]
    pub bytes: u64,
    /// Why none was saved (the previous one stays the latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunResult {
    /// The shell convention: the exit code, 124 on timeout, 128+N on signal N.
    pub fn shell_status(&self) -> i32 {
        shell_status(self.timed_out, self.exit_code, self.signal)
    }
}
