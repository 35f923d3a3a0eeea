//! The router and the OpenAPI document: every route, in one place.

use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{get, post};
use axum::{Json, Router};
use utoipa::OpenApi;

use crate::error::{method_not_allowed, not_found};
use crate::state::AppState;
use crate::{agents, auth, capabilities, extension, previews, runs, sessions, skills, ui};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "skillbox",
        description = "Run code that AI agents write behind a real boundary."
    ),
    paths(
        runs::run,
        runs::list,
        runs::get_object,
        runs::healthz,
        runs::metrics,
        agents::create,
        agents::get,
        agents::list,
        agents::info,
        previews::slides,
        previews::slide,
        capabilities::list,
        capabilities::run,
        capabilities::start,
        capabilities::services,
        capabilities::service,
        capabilities::stop,
        skills::list,
        sessions::create,
        sessions::list,
        sessions::get,
        sessions::delete,
        sessions::exec::exec,
        sessions::exec::cancel,
        sessions::files::read_file,
        sessions::files::write_file,
        sessions::files::remove_file,
        sessions::files::ls
    ),
    components(schemas(
        // The backends a client may ask a sandbox of: its SDKs' own lists follow it.
        skillbox_protocol::SandboxedKind,
        skillbox_protocol::AgentRunRequest,
        skillbox_protocol::AgentRunCreated,
        skillbox_protocol::AgentRun,
        skillbox_protocol::AgentRunList,
        skillbox_protocol::AgentRunSummary,
        skillbox_protocol::AgentInfo,
        skillbox_protocol::PlainRunList,
        skillbox_protocol::PlainRunSummary,
        skillbox_protocol::SlidePreviews,
        skillbox_protocol::SlidePreview,
        skillbox_protocol::PreviewFormat,
        skillbox_protocol::Correction,
        skillbox_protocol::CorrectionKind,
        skillbox_protocol::RunRequest,
        skillbox_protocol::RunResult,
        skillbox_protocol::ApiError,
        skillbox_protocol::ApiErrorBody,
        skillbox_protocol::ErrorCode,
        skillbox_protocol::FileInput,
        skillbox_protocol::ArtifactInfo,
        skillbox_protocol::Language,
        skillbox_protocol::Encoding,
        skillbox_protocol::BackendKind,
        skillbox_protocol::CapabilityList,
        skillbox_protocol::CapabilityInfo,
        skillbox_protocol::CapabilityRunRequest,
        skillbox_protocol::CapabilityRun,
        skillbox_protocol::ServiceList,
        skills::SkillList,
        skillbox_protocol::SessionCreateRequest,
        skillbox_protocol::SessionLimits,
        skillbox_protocol::SessionInfo,
        skillbox_protocol::SessionList,
        skillbox_protocol::SessionExecRequest,
        skillbox_protocol::SessionExecEvent,
        skillbox_protocol::SessionFileEntry,
        skillbox_protocol::SessionListing,
        skills::SkillInfo,
        skillbox_protocol::SkillsPlaced,
        skillbox_protocol::PlacedSkill,
        skillbox_protocol::SnapshotReport,
        skillbox_protocol::ServiceInfo,
        skillbox_protocol::ServiceState,
        skillbox_protocol::ServiceExit,
        skillbox_protocol::LimitKind,
        skillbox_protocol::ExecOutput
    ))
)]
#[derive(Debug)]
pub struct ApiDoc;

pub fn router(state: AppState) -> Router {
    let limit = state.config.body_limit;
    // What is composed above the server (`/mcp`): the key check (the guard below) runs
    // before it, and its bodies are read by the server's rule.
    let extensions = state
        .extensions
        .iter()
        .fold(Router::new(), |routes, extension| {
            routes.merge(extension.routes())
        })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            extension::whole_body,
        ))
        .with_state::<AppState>(());
    Router::new()
        .route("/v1/run", post(runs::run))
        .route("/v1/runs", get(runs::list))
        .route("/run", post(runs::run))
        .route(
            "/v1/objects/{sha256}",
            get(runs::get_object).head(runs::get_object),
        )
        // An agent request is a prompt: it gets a small body limit of its own.
        .route("/v1/objects/{sha256}/slides", get(previews::slides))
        .route("/v1/objects/{sha256}/slides/{number}", get(previews::slide))
        .route(
            "/v1/agent/runs",
            post(agents::create)
                .layer(DefaultBodyLimit::max(64 * 1024))
                .get(agents::list),
        )
        .route("/v1/agent", get(agents::info))
        .route("/v1/agent/runs/{id}", get(agents::get))
        .route("/", get(ui::index))
        .route("/ui/{name}", get(ui::asset))
        .route("/healthz", get(runs::healthz))
        .route("/metrics", get(runs::metrics))
        .route("/openapi.json", get(openapi))
        .route("/v1/capabilities", get(capabilities::list))
        .route("/v1/capabilities/schema", get(capability_schema))
        .route("/v1/capabilities/{name}/run", post(capabilities::run))
        .route("/v1/capabilities/{name}/start", post(capabilities::start))
        .route("/v1/skills", get(skills::list))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .merge(one_session(&state))
        .route("/v1/services", get(capabilities::services))
        .route("/v1/services/{name}", get(capabilities::service))
        .route("/v1/services/{name}/stop", post(capabilities::stop))
        .merge(extensions)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(state.clone(), auth::guard))
        .with_state(state)
}

/// The routes of one session, `/v1/sessions/{id}…`: a session of another node (on a
/// shared database) is forwarded there before any handler runs.
fn one_session(state: &AppState) -> Router<AppState> {
    Router::new()
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route("/v1/sessions/{id}/exec", post(sessions::exec::exec))
        .route(
            "/v1/sessions/{id}/execs/{exec_id}/cancel",
            post(sessions::exec::cancel),
        )
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(sessions::files::read_file)
                .put(sessions::files::write_file)
                .delete(sessions::files::remove_file),
        )
        .route("/v1/sessions/{id}/ls", get(sessions::files::ls))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            crate::cluster::forward,
        ))
}

async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}

/// The JSON Schema of a capability's `manifest.yaml`, generated from its types.
async fn capability_schema() -> Json<serde_json::Value> {
    Json(skillbox_capability::schema())
}
