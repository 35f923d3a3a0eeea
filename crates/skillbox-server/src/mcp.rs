//! `/mcp`: skillbox's MCP tools over streamable HTTP (crates/skillbox-mcp), behind the
//! same Host check and API keys as every other route. Each MCP session acts as the
//! tenant of the key that opened it; its runs are admitted, stored and owned as
//! `POST /v1/run`'s are, and its capability calls go through the checks of
//! `POST /v1/capabilities/{name}/run`.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Extension;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use skillbox_env::CancellationToken;
use skillbox_mcp::{
    Admitted, Caller, Door, Held, HttpConfig, HttpService, McpConfig, McpServer, ToolError,
};
use skillbox_protocol::{ArtifactInfo, CapabilityRun, CapabilityRunRequest, ErrorCode};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::state::AppState;

impl From<Failure> for ToolError {
    fn from(failure: Failure) -> Self {
        ToolError::new(failure.code, failure.message)
    }
}

/// What `/mcp`'s tools go through: this server's admission, object owners and
/// capabilities.
#[derive(Debug)]
struct ServerDoor {
    /// The server's state as it was made, without its MCP server (no cycle).
    state: AppState,
}

#[async_trait]
impl Door for ServerDoor {
    async fn admit(&self, tenant: &str, bytes: usize) -> Result<Admitted, ToolError> {
        let tenant = Tenant(tenant.into());
        Ok(Box::new(
            crate::runs::admit_bytes(&self.state, &tenant, bytes).await?,
        ))
    }

    fn hold_memory(&self, tenant: &str, bytes: usize) -> Result<Held, ToolError> {
        let budget = self.state.config.max_body_bytes_in_flight;
        let (most, whose) = match &self.state.body_shares {
            Some(shares) => (shares.limit, format!("one tenant's half of the {budget}")),
            None => (budget, format!("the {budget}")),
        };
        if bytes > most {
            return Err(ToolError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "its answer holds {bytes} bytes in memory, more than {whose} this server holds at once (--max-body-bytes-in-flight); serve with a larger --max-body-bytes-in-flight"
                ),
            ));
        }
        match crate::runs::hold_body_bytes(&self.state, &Tenant(tenant.into()), bytes) {
            Ok(held) => Ok(Box::new(held)),
            Err(_) => Err(ToolError::new(
                ErrorCode::Overloaded,
                format!(
                    "its answer holds {bytes} bytes in memory, and the server (or this tenant's share of it) holds as many request bodies, file reads and answers as it may now (--max-body-bytes-in-flight, {budget} bytes); retry later"
                ),
            )),
        }
    }

    fn grant(&self, tenant: &str, files: &[ArtifactInfo]) -> Result<(), ToolError> {
        Ok(crate::runs::grant(
            &self.state,
            &Tenant(tenant.into()),
            files,
        )?)
    }

    fn owned(&self, tenant: &str, sha256: &str) -> Result<Option<String>, ToolError> {
        Ok(self
            .state
            .owners
            .get(tenant, sha256)
            .map_err(Failure::from)?
            .map(|owned| owned.content_type))
    }

    fn serves_downloads(&self) -> bool {
        true
    }

    async fn capabilities(&self) -> Option<Vec<String>> {
        crate::capabilities::runnable(&self.state).await
    }

    async fn run_capability(
        &self,
        tenant: &str,
        name: &str,
        request: CapabilityRunRequest,
        cancel: &CancellationToken,
    ) -> Result<CapabilityRun, ToolError> {
        // Cancelled by the call's own cancel, and by the server stopping.
        let linked = self.state.runs_cancel().child_token();
        let (asked, link) = (cancel.clone(), linked.clone());
        let watch = tokio::spawn(async move {
            asked.cancelled().await;
            link.cancel();
        });
        let ran = crate::capabilities::run_for_mcp(
            &self.state,
            &Tenant(tenant.into()),
            name,
            request,
            linked,
        )
        .await;
        watch.abort();
        Ok(ran?)
    }
}

/// `/mcp`: the MCP tools and the one HTTP service that serves them, so that what
/// `/metrics` counts is the sessions `/mcp` holds.
#[derive(Debug, Clone)]
pub(crate) struct Mcp {
    pub(crate) server: McpServer,
    pub(crate) http: HttpService,
}

impl Mcp {
    pub(crate) fn of(state: &AppState) -> Mcp {
        let server = server(state);
        let http = service(state, &server);
        Mcp { server, http }
    }
}

/// The MCP server of `state`: its sandboxes bounded as its HTTP sessions are.
fn server(state: &AppState) -> McpServer {
    let sessions = state.config.sessions;
    McpServer::behind(
        state.runner.clone(),
        Arc::new(ServerDoor {
            state: state.clone(),
        }),
        McpConfig {
            sandboxes: sessions.bounds,
            ..McpConfig::default()
        },
    )
}

/// The `/mcp` service of `server`: an MCP session idle for the HTTP sessions' idle
/// time plus the longest run ends (a running call never looks idle to a client that
/// waits on it); at most `mcp_sessions` are open.
fn service(state: &AppState, server: &McpServer) -> HttpService {
    server.http_service(HttpConfig {
        max_body_bytes: state.config.body_limit,
        idle: state.config.sessions.default_idle
            + std::time::Duration::from_millis(skillbox_protocol::MAX_TIMEOUT_MS),
        sessions: state.config.mcp_sessions,
    })
}

/// Between the key check and rmcp: the request's tenant as the [`Caller`] the MCP
/// handler reads, and its body read whole within the body timeout and the server's
/// budget of bodies in memory (rmcp bounds only its size).
pub(crate) async fn caller(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    parts.extensions.insert(Caller(tenant.0.clone()));
    let limit = state.config.body_limit;
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let budget = match announced {
        Some(0) => None,
        Some(size) if size > limit => {
            return Failure::new(
                skillbox_protocol::ErrorCode::PayloadTooLarge,
                format!("request body: larger than {limit} bytes"),
            )
            .into_response();
        }
        Some(size) => Some(size),
        // A GET (its stream) has no body; a chunked POST is budgeted at the limit.
        None if parts.method == axum::http::Method::POST => Some(limit),
        None => None,
    };
    let _held = match budget {
        Some(bytes) => match crate::runs::hold_body_bytes(&state, &tenant, bytes) {
            Ok(held) => Some(held),
            Err(refused) => return refused.into_response(),
        },
        None => None,
    };
    let body = if budget.is_some() {
        let read =
            tokio::time::timeout(state.config.body_timeout, axum::body::to_bytes(body, limit))
                .await;
        match read {
            Err(_) => {
                return Failure::new(
                    skillbox_protocol::ErrorCode::Timeout,
                    format!(
                        "request body: not received within {} s",
                        state.config.body_timeout.as_secs()
                    ),
                )
                .into_response();
            }
            Ok(Err(e)) => {
                // A chunked body announces no length: past the limit is found here.
                let too_big = std::error::Error::source(&e)
                    .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
                let (code, message) = if too_big {
                    (
                        skillbox_protocol::ErrorCode::PayloadTooLarge,
                        format!("request body: larger than {limit} bytes"),
                    )
                } else {
                    (
                        skillbox_protocol::ErrorCode::Invalid,
                        format!("request body: {e}"),
                    )
                };
                return Failure::new(code, message).into_response();
            }
            Ok(Ok(bytes)) => Body::from(bytes),
        }
    } else {
        body
    };
    next.run(Request::from_parts(parts, body)).await
}
