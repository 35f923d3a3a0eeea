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
