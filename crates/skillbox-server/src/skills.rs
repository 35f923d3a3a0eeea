//! `GET /v1/skills`: the skills a run of the calling tenant may name: the server's
//! workspace's (`--project`: `skills/`, `.skills-cache/`) and the tenant's own
//! (`<data>/users/<tenant>/skills`), read from the host at each request.

use axum::Extension;
use axum::Json;
use axum::extract::State;
use serde::Serialize;
use skillbox_protocol::ErrorCode;
use skillbox_skills::{SkillSet, Sources};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::state::AppState;

/// One skill, as a run names it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillInfo {
    pub name: String,
    pub description: String,
    /// `workspace`, `marketplace` or `user`.
    pub source: String,
    /// Its folder in a run's sandbox: `/workspace/skills/report`.
    pub path: String,
}

/// `GET /v1/skills`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkillList {
    /// By name.
    pub skills: Vec<SkillInfo>,
    /// What did not load, each naming its SKILL.md and line (the tenant's own, and the
    /// workspace's).
    pub errors: Vec<String>,
}

/// The skills a run of this tenant may name in `skills`.
#[utoipa::path(
    get,
    path = "/v1/skills",
    responses(
        (status = 200, description = "Every skill a run may name, and what did not load", body = SkillList),
    )
)]
pub(crate) async fn list(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<Json<SkillList>, Failure> {
    let workspace = state
        .runner
        .skills_workspace()
        .map(std::path::Path::to_path_buf);
    let data_dir = state.runner.data_dir().to_path_buf();
    let tenant = tenant.as_str().to_string();
    let set = tokio::task::spawn_blocking(move || {
        let user = skillbox_skills::skill::valid_name(&tenant)
            .then(|| (tenant.clone(), Sources::user_dir(&data_dir, &tenant)));
        SkillSet::load(&Sources { workspace, user })
    })
    .await
    .map_err(|e| {
        Failure::new(
            ErrorCode::Unknown,
            format!("reading the skills failed: {e}"),
        )
    })?;
    let skills = set
        .iter()
        .map(|skill| SkillInfo {
            name: skill.meta.name.clone(),
            description: skill.meta.description.clone(),
            source: match &skill.source {
                skillbox_skills::Source::Workspace => "workspace",
                skillbox_skills::Source::Marketplace { .. } => "marketplace",
                skillbox_skills::Source::User { .. } => "user",
            }
            .to_string(),
            path: skill
                .sandbox_dir(state.runner.root().as_path())
                .display()
                .to_string(),
        })
        .collect();
    let errors = set.errors().iter().map(ToString::to_string).collect();
    Ok(Json(SkillList { skills, errors }))
}
