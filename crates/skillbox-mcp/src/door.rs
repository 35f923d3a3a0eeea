//! What the MCP tools are served through: [`Door`], the part that differs between
//! `skillbox serve`'s `/mcp` (the HTTP API's admission, object owners, capabilities and
//! download links) and `skillbox mcp` on stdio ([`LocalDoor`]: one local user).

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use skillbox_env::{CancellationToken, EnvError};
use skillbox_protocol::{ArtifactInfo, CapabilityRun, CapabilityRunRequest, ErrorCode};
use skillbox_run::RunError;

/// Why a tool call failed: a stable code and a message that names what failed and what
/// to do. It reaches the client as a tool error result, never as a protocol error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ToolError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError::new(ErrorCode::Invalid, message)
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl From<RunError> for ToolError {
    fn from(error: RunError) -> Self {
        ToolError::new(error.code(), error.to_string())
    }
}

impl From<EnvError> for ToolError {
    fn from(error: EnvError) -> Self {
        ToolError::new(error.code, error.message)
    }
}

/// What a run holds from its admission until it ends (dropped: its place is free).
pub type Admitted = Box<dyn Send + Sync>;

/// Bytes of memory a call holds until the answer they are for is sent (dropped: free).
pub type Held = Box<dyn Send + Sync>;

/// What the tools need from where they are served. Every method has a body that fits a
/// single local user, so a door states only what it adds.
#[async_trait]
pub trait Door: Send + Sync + fmt::Debug + 'static {
    /// Admits one run of `tenant` (`run_script`, `run_capability`) that carries `bytes`
    /// of input, as the HTTP API admits a `POST /v1/run`; refused with `overloaded`.
    async fn admit(&self, tenant: &str, bytes: usize) -> Result<Admitted, ToolError> {
        let _ = (tenant, bytes);
        Ok(Box::new(()))
    }

    /// Holds `bytes` of memory for an answer being made (`read_file`'s) of `tenant`,
    /// from before what it carries is read until it is sent, in the budget the HTTP API
    /// holds request bodies and file reads in (and the tenant's share of it); refused
    /// with `overloaded` while that is taken, `resource_exhausted` past all of it. The
    /// message says what to do.
    fn hold_memory(&self, tenant: &str, bytes: usize) -> Result<Held, ToolError> {
        let _ = (tenant, bytes);
        Ok(Box::new(()))
    }

    /// Records that runs of `tenant` made `files`: it may read them from now on.
    async fn grant(&self, tenant: &str, files: &[ArtifactInfo]) -> Result<(), ToolError>;

    /// The content type of object `sha256` when `tenant` may read it; `None` when it may
    /// not (or there is no such object), which a caller reports as not found.
    async fn owned(&self, tenant: &str, sha256: &str) -> Result<Option<String>, ToolError>;

    /// Whether `/v1/objects/{sha256}` serves downloads beside the tools, so that results
    /// and resources carry the link.
    fn serves_downloads(&self) -> bool {
        false
    }

    /// The capabilities `run_capability` may name; `None` (the default) when this door
    /// has none, and the tool is not offered.
    async fn capabilities(&self) -> Option<Vec<String>> {
        None
    }

    /// One call of capability `name` for `tenant`, through the same trust check,
    /// environment and admission as `POST /v1/capabilities/{name}/run`.
    async fn run_capability(
        &self,
        tenant: &str,
        name: &str,
        request: CapabilityRunRequest,
        cancel: &CancellationToken,
    ) -> Result<CapabilityRun, ToolError> {
        let _ = (tenant, request, cancel);
        Err(ToolError::new(
            ErrorCode::NotSupported,
            format!("{name}: this MCP server runs no capabilities"),
        ))
    }
}

/// The door of `skillbox mcp`: one local user on their own data dir. Runs are not
/// admitted beyond the sandbox's own limits (as `skillbox run`), and the objects a
/// client may read are those this process's runs made.
#[derive(Debug, Default)]
pub struct LocalDoor {
    /// sha256 → content type.
    made: Mutex<HashMap<String, String>>,
}

#[async_trait]
impl Door for LocalDoor {
    async fn grant(&self, _tenant: &str, files: &[ArtifactInfo]) -> Result<(), ToolError> {
        let mut made = self
            .made
            .lock()
            .map_err(|_| ToolError::new(ErrorCode::Unknown, "the object list is poisoned"))?;
        for file in files {
            made.insert(file.sha256.clone(), file.content_type.clone());
        }
        Ok(())
    }

    async fn owned(&self, _tenant: &str, sha256: &str) -> Result<Option<String>, ToolError> {
        Ok(self
            .made
            .lock()
            .map_err(|_| ToolError::new(ErrorCode::Unknown, "the object list is poisoned"))?
            .get(sha256)
            .cloned())
    }
}
