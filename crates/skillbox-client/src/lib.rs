//! The contract of `POST /v1/run` (DESIGN.md §5) as Rust types, the `SkillSandbox`
//! trait every way of running a script implements, and `HttpSkillSandbox`, which talks
//! to a `skillbox serve` over HTTP.

mod http;
mod types;

pub use http::HttpSkillSandbox;
pub use types::{
    ApiError, ApiErrorBody, ArtifactInfo, Encoding, FileInput, Language, MAX_TIMEOUT_MS,
    RunRequest, RunResult,
};

use async_trait::async_trait;
use bytes::Bytes;

/// Why a run could not happen (a run that hits a limit is a normal `RunResult`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ClientError {
    /// An `ErrorCode` name or an HTTP kind (`payload_too_large`, `overloaded`, …).
    pub code: String,
    pub message: String,
}

impl ClientError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        ClientError {
            code: code.into(),
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
