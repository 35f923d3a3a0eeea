//! A session's files through the door (`skillbox_door::Workspace`): read (bounded,
//! paced), write, remove and list, by paths parsed once.

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use skillbox_pace::{AnswerDeadline, DeadlineSlot, Paced};
use skillbox_protocol::{ApiError, ErrorCode, SessionFileEntry, SessionListing};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{BodyHold, body_size, hold_body_bytes, read_body};
use crate::state::AppState;

/// Read a file of the session's `/workspace`.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
    ),
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream"),
        (status = 404, description = "No such session, or no such file", body = ApiError),
        (status = 429, description = "As many request bodies and file reads held as the server may", body = ApiError),
    )
)]
pub(crate) async fn read_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    deadline: Option<Extension<AnswerDeadline>>,
    UrlPath((id, path)): UrlPath<(String, String)>,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.parse_url(&path, "path")?;
    let shown = door.absolute(&path);
    let cancel = session.ending.child_token();
    let size = door
        .sized_file(
            &path,
            state.runner.read_caps().http,
            &format!("list a directory with GET /v1/sessions/{id}/ls, read a part of a file with an exec (head -c, tail -c)"),
            &cancel,
        )
        .await?;
    // The bytes stay in memory until they are sent, so they are held within the budget
    // of bytes in memory that request bodies count against, from before the read until
    // the last of them is sent; as many as the size above, which the read itself holds
    // against a file that grew or was swapped for a bigger one since.
    let held = hold_answer(
        &state,
        &tenant,
        usize::try_from(size).unwrap_or(usize::MAX),
        |budget| {
            format!(
                "{}: {size} bytes, more than the {budget} this server holds in memory at once (--max-body-bytes-in-flight)",
                shown.display()
            )
        },
    )?;
    let bytes = door.read(&path, size, &cancel).await?;
    // A download, as a stored object is: never rendered as this origin's page.
    let name = path.file_name().unwrap_or_default();
    let headers = crate::download::download_headers("application/octet-stream", name);
    Ok(held_response(headers, bytes, held, deadline))
}

/// Holds `size` bytes of an answer in the budget of bytes in memory that request bodies
/// count against, until the returned hold goes with the answer's last byte (429 while
/// the budget, or `tenant`'s share of it, is taken). An answer larger than all a tenant
/// may hold could never be held: `resource_exhausted`, saying `too_large(most)`.
fn hold_answer(
    state: &AppState,
    tenant: &Tenant,
    size: usize,
    too_large: impl FnOnce(String) -> String,
) -> Result<BodyHold, Failure> {
    let budget = state.config.max_body_bytes_in_flight;
    let most = match &state.body_shares {
        Some(shares) => (
            shares.limit,
            format!("{} bytes, one tenant's half of the {budget}", shares.limit),
        ),
        None => (budget, format!("{budget}")),
    };
    if size > most.0 {
        return Err(Failure::new(
            ErrorCode::ResourceExhausted,
            too_large(most.1),
        ));
    }
    hold_body_bytes(state, tenant, size)
}

/// A 200 of `bytes` with `headers`, which gives their place in the budget (`held`)
/// back when the response is done with them. With the connection's `deadline` the
/// body goes in pieces, each arming it again: a client that takes nothing for the body
/// timeout has its connection closed, which gives the bytes back; one that reads
/// steadily is served however slowly.
fn held_response(
    headers: HeaderMap,
    bytes: Vec<u8>,
    held: BodyHold,
    deadline: Option<Extension<AnswerDeadline>>,
) -> Response {
    let slot = DeadlineSlot::default();
    let owned = Bytes::from_owner(HeldBytes {
        bytes,
        _held: held,
        _slot: slot.clone(),
    });
    let body = http_body_util::Full::new(owned);
    let body = match deadline {
        Some(Extension(deadline)) => Body::new(Paced::new(body, deadline, slot, Box::new(|| true))),
        None => Body::new(body),
    };
    (headers, body).into_response()
}

/// An answer's bytes with their place in the budget of bytes in memory, given back when
/// the response is done with them, and the last arming of the connection's deadline,
/// kept until then.
struct HeldBytes {
    bytes: Vec<u8>,
    _held: BodyHold,
    _slot: DeadlineSlot,
}

impl AsRef<[u8]> for HeldBytes {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct PutQuery {
    #[serde(default)]
    executable: bool,
}

/// Write a file of the session's `/workspace` (its directories made as needed): the
/// request body is its content.
#[utoipa::path(
    put,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
        ("executable" = Option<bool>, Query, description = "Mode 0755 instead of 0644"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 200, description = "Written"),
        (status = 404, description = "No such session of this tenant", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 429, description = "As many request bodies held as the server may", body = ApiError),
        (status = 504, description = "The body was not received within --body-timeout", body = ApiError),
    )
)]
pub(crate) async fn write_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, path)): UrlPath<(String, String)>,
    Query(query): Query<PutQuery>,
    request: Request,
) -> Result<Json<serde_json::Value>, Failure> {
    // The session and the path are checked, and the announced size, before any of the
    // body is read; it is read within the body timeout and held within the budget of
    // bodies in memory until it is written.
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.file(door.parse_url(&path, "path")?, "path")?;
    let (parts, body) = request.into_parts();
    let limit = state.config.body_limit;
    let announced = body_size(&parts.headers, limit)?;
    let _held = hold_body_bytes(&state, &tenant, announced)?;
    let body = read_body(body, limit, state.config.body_timeout).await?;
    session.touch();
    let size = body.len();
    let cancel = session.ending.child_token();
    door.write(&path, body, query.executable, &cancel).await?;
    Ok(Json(
        serde_json::json!({"written": door.absolute(&path), "bytes": size}),
    ))
}

#[derive(Debug, Deserialize)]
pub(crate) struct DeleteQuery {
    #[serde(default)]
    recursive: bool,
}

/// Remove a file (or, with `recursive=true`, a directory tree) of the session's
/// `/workspace`.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/files/{path}",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = String, Path, description = "Relative to /workspace"),
        ("recursive" = Option<bool>, Query, description = "Remove a directory and all it holds"),
    ),
    responses(
        (status = 200, description = "Removed"),
        (status = 404, description = "No such session, or no such file", body = ApiError),
    )
)]
pub(crate) async fn remove_file(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, path)): UrlPath<(String, String)>,
    Query(query): Query<DeleteQuery>,
) -> Result<Json<serde_json::Value>, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.file(door.parse_url(&path, "path")?, "path")?;
    let cancel = session.ending.child_token();
    door.remove(&path, query.recursive, &cancel).await?;
    Ok(Json(serde_json::json!({"removed": door.absolute(&path)})))
}

#[derive(Debug, Deserialize)]
pub(crate) struct LsQuery {
    #[serde(default)]
    path: Option<String>,
}

/// List a directory of the session's `/workspace` (symlinks listed, never followed).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/ls",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("path" = Option<String>, Query, description = "Relative to /workspace (default: /workspace itself)"),
    ),
    responses(
        (status = 200, description = "The entries, by name", body = SessionListing),
        (status = 404, description = "No such session, or no such directory", body = ApiError),
        (status = 429, description = "As many request bodies and answers held as the server may", body = ApiError),
        (status = 422, description = "More entries than a listing gives (100,000), or a listing larger than the server holds in memory at once: list a directory beneath", body = ApiError),
    )
)]
pub(crate) async fn ls(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    deadline: Option<Extension<AnswerDeadline>>,
    UrlPath(id): UrlPath<String>,
    Query(query): Query<LsQuery>,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let door = state.runner.workspace(session.env.as_ref());
    let path = door.parse(query.path.as_deref().unwrap_or(""), "path")?;
    let cancel = session.ending.child_token();
    let listed = door.list(&path, &cancel).await?;
    // A listing of many long names is megabytes (a control byte in a name is six in
    // JSON): held within the budget of bytes in memory, as a file read is, from before
    // its JSON is made until it is sent; one larger than the whole budget is refused.
    let size = skillbox_env::listing_json_len(&listed).saturating_add(256);
    let held = hold_answer(&state, &tenant, size, |budget| {
        format!(
            "list {}: its answer takes about {size} bytes, more than the {budget} this server holds in memory at once (--max-body-bytes-in-flight); list a directory beneath it",
            door.absolute(&path).display()
        )
    })?;
    // The sizes come with the listing: no look per file (on a container backend, a
    // process each).
    let entries = listed
        .into_iter()
        .map(|entry| SessionFileEntry {
            name: entry.name,
            kind: entry.kind.as_str().to_string(),
            size: entry.size,
        })
        .collect::<Vec<_>>();
    let body = serde_json::to_vec(&SessionListing {
        path: path.as_str().to_string(),
        entries,
    })
    .map_err(|e| Failure::new(ErrorCode::Unknown, format!("listing: {e}")))?;
    let headers = HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )]);
    Ok(held_response(headers, body, held, deadline))
}
