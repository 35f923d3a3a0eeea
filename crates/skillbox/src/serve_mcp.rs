//! `/mcp` on `skillbox serve`: skillbox's MCP tools over streamable HTTP
//! (crates/skillbox-mcp) mounted on the HTTP API (crates/skillbox-server) as an
//! [`Extension`], so that neither crate names the other. It is served behind the same
//! Host check, API keys, body limit, body budget and body timeout as every other route
//! (the server's guard and body rule). Each MCP session acts as the tenant of the key
//! that opened it; its runs are admitted, stored and owned as `POST /v1/run`'s are, and
//! its capability calls go through the checks of `POST /v1/capabilities/{name}/run`.

use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::extract::Request;
use skillbox_env::CancellationToken;
use skillbox_mcp::{
    Admitted, Caller, Door, Held, HttpConfig, HttpService, McpConfig, McpServer, SessionBounds,
    ToolError,
};
use skillbox_protocol::{ArtifactInfo, CapabilityRun, CapabilityRunRequest};
use skillbox_server::{AppState, Extension, Failure, Tenant};

/// `/mcp` of the server whose state is `state`: its sandboxes bounded as its HTTP
/// sessions are, at most `sessions` MCP sessions open.
pub fn extension(state: &AppState, sessions: SessionBounds) -> Arc<dyn Extension> {
    let config = state.config();
    let server = McpServer::behind(
        state.runner().clone(),
        Arc::new(ServerDoor {
            state: state.clone(),
        }),
        McpConfig {
            sandboxes: config.sessions.bounds,
            ..McpConfig::default()
        },
    );
    // An MCP session idle for the HTTP sessions' idle time plus the longest run ends (a
    // running call never looks idle to a client that waits on it).
    let http = server.http_service(HttpConfig {
        max_body_bytes: config.body_limit,
        idle: config.sessions.default_idle
            + std::time::Duration::from_millis(skillbox_protocol::MAX_TIMEOUT_MS),
        sessions,
    });
    Arc::new(Mcp { server, http })
}

fn tool_error(failure: Failure) -> ToolError {
    ToolError::new(failure.code, failure.message)
}

/// What `/mcp`'s tools go through: this server's admission, object owners and
/// capabilities.
#[derive(Debug)]
struct ServerDoor {
    /// The server's state as it was made, without its extensions (no cycle).
    state: AppState,
}

#[async_trait]
impl Door for ServerDoor {
    async fn admit(&self, tenant: &str, bytes: usize) -> Result<Admitted, ToolError> {
        let admitted = self.state.admit_run(tenant, bytes).await;
        Ok(Box::new(admitted.map_err(tool_error)?))
    }

    fn hold_memory(&self, tenant: &str, bytes: usize) -> Result<Held, ToolError> {
        let held = self.state.hold_answer(tenant, bytes);
        Ok(Box::new(held.map_err(tool_error)?))
    }

    async fn grant(&self, tenant: &str, files: &[ArtifactInfo]) -> Result<(), ToolError> {
        self.state.grant(tenant, files).await.map_err(tool_error)
    }

    async fn owned(&self, tenant: &str, sha256: &str) -> Result<Option<String>, ToolError> {
        self.state.owned(tenant, sha256).await.map_err(tool_error)
    }

    fn serves_downloads(&self) -> bool {
        true
    }

    async fn capabilities(&self) -> Option<Vec<String>> {
        self.state.runnable_capabilities().await
    }

    async fn run_capability(
        &self,
        tenant: &str,
        name: &str,
        request: CapabilityRunRequest,
        cancel: &CancellationToken,
    ) -> Result<CapabilityRun, ToolError> {
        self.state
            .run_capability(tenant, name, request, cancel)
            .await
            .map_err(tool_error)
    }
}

/// `/mcp`: the MCP tools and the one HTTP service that serves them, so that what
/// `/metrics` counts is the sessions `/mcp` holds.
#[derive(Debug)]
struct Mcp {
    server: McpServer,
    http: HttpService,
}

#[async_trait]
impl Extension for Mcp {
    /// rmcp's own service, given the request's tenant (the server's key check put it
    /// in) as the [`Caller`] the MCP handler reads.
    fn routes(&self) -> Router {
        Router::new()
            .route_service("/mcp", self.http.clone())
            .layer(axum::middleware::map_request(caller))
    }

    async fn metrics(&self) -> String {
        format!(
            "# HELP skillbox_mcp_sessions_open MCP sessions (/mcp) open (or opening) now.\n\
             # TYPE skillbox_mcp_sessions_open gauge\nskillbox_mcp_sessions_open {}\n\
             # HELP skillbox_mcp_sandboxes_open MCP sessions' sandboxes open (or opening) now.\n\
             # TYPE skillbox_mcp_sandboxes_open gauge\nskillbox_mcp_sandboxes_open {}\n",
            self.http.sessions_open().await,
            self.server.sandboxes_open()
        )
    }

    /// MCP calls end, and the MCP sessions' streams with them.
    fn stop(&self) {
        self.server.stop();
    }

    async fn close(&self) {
        self.server.close().await;
    }
}

/// The request's [`Tenant`] as its [`Caller`].
async fn caller(mut request: Request) -> Request {
    if let Some(tenant) = request.extensions().get::<Tenant>().cloned() {
        request.extensions_mut().insert(Caller(tenant.0));
    }
    request
}
