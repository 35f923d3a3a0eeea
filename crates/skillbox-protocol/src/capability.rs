//! `GET /v1/capabilities` and `POST /v1/capabilities/{name}/run`: the capabilities a
//! server loads, and one call of one of them.

use serde::{Deserialize, Serialize};

use crate::backend::BackendKind;
use crate::exec::ExecOutput;
use crate::run::{ArtifactInfo, Encoding, FileInput};

/// One capability that loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityInfo {
    pub name: String,
    pub description: String,
    pub version: String,
    /// Where it runs.
    pub environment: BackendKind,
    /// `oneshot`, `ondemand` or `persistent`.
    pub lifecycle: String,
    /// Where it stands in the server's project: `project`, `session`, `once`,
    /// `denied`, `not granted`, or `unknown` (the grants file cannot be read: see
    /// `errors`).
    pub grant: String,
}

/// `GET /v1/capabilities`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityList {
    /// By name.
    pub capabilities: Vec<CapabilityInfo>,
    /// What did not load, each naming its manifest file, line and field.
    pub errors: Vec<String>,
}

/// `POST /v1/capabilities/{name}/run`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CapabilityRunRequest {
    /// After the manifest's own `args`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Put in `/workspace` first, as `POST /v1/run`'s `files`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileInput>,
    /// Fed to the process's stdin (none: it reads end of file at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// How `stdin` is encoded.
    #[serde(default)]
    pub stdin_encoding: Encoding,
}

/// How a call ended. Hitting a limit is a normal answer, as for `POST /v1/run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct CapabilityRun {
    pub capability: String,
    /// The grant it ran under: `project`, `session` or `once` (used up by this call).
    pub grant: String,
    pub output: ExecOutput,
    /// What it made that its `write_file` permissions name, stored and downloadable.
    pub files: Vec<ArtifactInfo>,
}

/// Where a persistent capability stands. It is never restarted by skillbox: `failed`
/// stays down until it is stopped (which clears it) and started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ServiceState {
    /// Its process runs; nothing answers at its endpoint yet.
    Starting,
    /// Something answers at its endpoint: clients are forwarded to it.
    Ready,
    /// It ended by itself, was never ready, or lost its supervisor.
    Failed,
    /// Stopped on request (or by skillbox's own shutdown).
    Stopped,
}

impl ServiceState {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceState::Starting => "starting",
            ServiceState::Ready => "ready",
            ServiceState::Failed => "failed",
            ServiceState::Stopped => "stopped",
        }
    }
}

/// How a service's process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub limit_hit: Option<crate::exec::LimitKind>,
}

/// One persistent capability skillbox started (`skillbox cap status`, `GET /v1/services`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceInfo {
    pub name: String,
    pub environment: BackendKind,
    pub state: ServiceState,
    /// The process that serves, as the host names it (`pid 1234`); none before it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    /// What supervises it and forwards its clients: `skillbox serve (pid 77)`.
    pub owner: String,
    /// Milliseconds since the Unix epoch.
    pub started_at_ms: u64,
    /// Where clients connect, on the host: `unix:PATH` (a socket only its owner may
    /// open) or `tcp:127.0.0.1:PORT`.
    pub endpoint: String,
    /// What it listens on inside its sandbox: `port 8080` or `socket /workspace/app.sock`.
    pub serves: String,
    /// How its process ended (`failed`, `stopped`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ServiceExit>,
    /// Why it failed when that is not only how its process ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The last lines it wrote to stderr (at most 4 KiB).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
    /// The tenant that started it over HTTP (none from the command line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// `GET /v1/services`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceList {
    /// By name.
    pub services: Vec<ServiceInfo>,
}
