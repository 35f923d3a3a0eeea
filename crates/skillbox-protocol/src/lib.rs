//! skillbox's wire types, at the bottom of the crate graph: what crosses between a client
//! and a server, or between a backend and the code that drives it, as serde data.
//!
//! - [`ErrorCode`] and [`ApiError`]: the stable codes every error carries;
//! - [`BackendKind`], [`Boundary`], [`BackendReport`]: which sandbox, what isolates it,
//!   and what `doctor` found;
//! - [`ExecOutput`], [`LimitKind`], [`Truncated`]: how one exec ended;
//! - [`RunRequest`], [`RunResult`], [`ArtifactInfo`]: `POST /v1/run`, and
//!   [`OutputSelection`]: which of a run's files come back;
//! - [`AgentRun`] and its parts: `POST`/`GET /v1/agent/runs`;
//! - [`CapabilityList`], [`CapabilityRunRequest`], [`CapabilityRun`]:
//!   `GET /v1/capabilities` and `POST /v1/capabilities/{name}/run`;
//! - [`random`]: the one source of random ids and names;
//! - [`WorkspaceRoot`] and [`WorkspacePath`]: a path inside a sandbox's workspace,
//!   parsed once by one rule for every door.
//!
//! JSON is camelCase; request types refuse unknown fields (a typo is an error). With the
//! `openapi` feature every type also has a utoipa schema.

mod agent;
mod backend;
mod capability;
mod egress;
mod error;
mod exec;
mod outputs;
pub mod random;
mod run;
mod session;
pub mod units;
mod workspace;
pub use session::{
    SessionCreateRequest, SessionExecEvent, SessionExecRequest, SessionFileEntry, SessionInfo,
    SessionLimits, SessionList, SessionListing,
};

pub use agent::{
    AgentInfo, AgentRun, AgentRunCreated, AgentRunList, AgentRunRequest, AgentRunSummary,
    AgentStatus, Attempt, Correction, CorrectionKind, ErrorInfo, PlainRunList, PlainRunSummary,
    PreviewFormat, SlidePreview, SlidePreviews, Usage, Verification,
};
pub use backend::{
    BackendKind, BackendReport, Boundary, HostIsNoSandbox, Layer, SandboxedKind, UnknownBackend,
};
pub use capability::{
    CapabilityInfo, CapabilityList, CapabilityRun, CapabilityRunRequest, ServiceExit, ServiceInfo,
    ServiceList, ServiceState,
};
pub use egress::{EgressConnection, EgressVerdict, NetworkPolicy, SecretSpec};
pub use error::{ApiError, ApiErrorBody, ErrorCode};
pub use exec::{ExecOutput, LimitKind, Truncated};
pub use outputs::{InvalidGlob, MAX_GLOB_LEN, MAX_OUTPUT_GLOBS, OutputSelection};
pub use run::{
    ArtifactInfo, Encoding, FileInput, Language, MAX_TIMEOUT_MS, PlacedSkill, RunLimits,
    RunRequest, RunResult, SkillsPlaced, SnapshotReport,
};
pub use workspace::{
    DEFAULT_WORKSPACE_ROOT, InvalidPath, NAME_MAX, PATH_MAX, ROOT_PLACES, WorkspacePath,
    WorkspaceRoot,
};
