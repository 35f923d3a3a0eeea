//! The `SkillSandbox` trait every way of running a script implements, and
//! `HttpSkillSandbox`, which talks to a `skillbox serve` over HTTP (with
//! [`HttpSkillSandbox::sessions`] for its session routes). The wire types come from
//! `skillbox-protocol`; nothing here pulls in a sandbox.

mod http;
pub mod outdir;
mod session;

pub use http::HttpSkillSandbox;
pub use session::{ExecStream, Sessions, event_error, exit_output, stdin_of};
pub use skillbox_protocol::{
    ApiError, ApiErrorBody, ArtifactInfo, BackendKind, Encoding, ErrorCode, ExecOutput, FileInput,
    Language, LimitKind, MAX_TIMEOUT_MS, OutputSelection, RunLimits, RunRequest, RunResult,
    SessionCreateRequest, SessionExecEvent, SessionExecRequest, SessionFileEntry, SessionInfo,
    SessionLimits, SessionList, SessionListing, SkillsPlaced, SnapshotReport,
};

use async_trait::async_trait;
use bytes::Bytes;

/// Why a run could not happen (a run that hits a limit is a normal `RunResult`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ClientError {
    pub code: ErrorCode,
    pub message: String,
}

impl ClientError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ClientError {
            code,
            message: message.into(),
        }
    }
}

/// Runs one script behind a boundary and hands back what it produced.
#[async_trait]
pub trait SkillSandbox: Send + Sync {
    async fn run(&self, request: RunRequest) -> Result<RunResult, ClientError>;

    /// The bytes of an artifact by its sha256.
    async fn download(&self, sha256: &str) -> Result<Bytes, ClientError>;
}
