//! skillbox's MCP server (DESIGN.md §4 `skillbox mcp`, §5.3 `/mcp`): the tools an agent
//! calls over a [`Runner`] (`run_script`, `exec`, `read_file`, `write_file`, `list_dir`,
//! `list_skills`, and `run_capability` where capabilities are served), and the files
//! runs made as resources (`skillbox://objects/{sha256}/{name}`).
//!
//! One handler serves both transports: stdio ([`McpServer::serve_stdio`], `skillbox
//! mcp`) and streamable HTTP ([`McpServer::http_service`], mounted at `/mcp` by
//! `skillbox serve` behind its API keys). What differs between them (admission, who
//! reads which object, capabilities, download links) is the [`Door`] it is given.
//! `exec` and the file tools share one sandbox per MCP session ([`Sandboxes`]).

mod door;
mod handler;
mod holds;
mod http;
mod progress;
mod sandboxes;
mod tools;

pub use door::{Admitted, Door, Held, LocalDoor, ToolError};
pub use handler::{Caller, SkillboxMcp};
pub use http::{HttpService, SessionBounds};
pub use sandboxes::Sandboxes;

use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpServerConfig;
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use skillbox_env::CancellationToken;
use skillbox_protocol::SandboxedKind;
use skillbox_run::Runner;

use crate::handler::Shared;

/// How an MCP server opens its session sandboxes.
#[derive(Debug, Clone, Copy)]
pub struct McpConfig {
    /// A session's sandbox backend when its first call names none.
    pub default_backend: SandboxedKind,
    pub sandboxes: skillbox_door::SessionBounds,
}

impl Default for McpConfig {
    fn default() -> Self {
        McpConfig {
            default_backend: SandboxedKind::Native,
            sandboxes: skillbox_door::SessionBounds::default(),
        }
    }
}

/// How `/mcp` serves HTTP.
#[derive(Debug, Clone, Copy)]
pub struct HttpConfig {
    /// The largest request body (a `run_script` with its files).
    pub max_body_bytes: usize,
    /// An MCP session with no request for this long ends, and its sandbox with it.
    pub idle: Duration,
    /// MCP sessions at once, in all and per tenant; an `initialize` past either is 429.
    pub sessions: SessionBounds,
}

/// The MCP tools over one runner, for any number of MCP sessions.
#[derive(Debug, Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
}

impl McpServer {
    /// The server of `skillbox mcp`: one local user ([`LocalDoor`]); every request acts
    /// as the local tenant.
    pub fn local(runner: Arc<Runner>, config: McpConfig) -> Self {
        McpServer::build(
            runner,
            Arc::new(LocalDoor::default()),
            config,
            Some(skillbox_store::LOCAL_TENANT.into()),
        )
    }

    /// The server behind `door` (`skillbox serve`): every request must carry its
    /// [`Caller`], or it is refused.
    pub fn behind(runner: Arc<Runner>, door: Arc<dyn Door>, config: McpConfig) -> Self {
        McpServer::build(runner, door, config, None)
    }

    fn build(
        runner: Arc<Runner>,
        door: Arc<dyn Door>,
        config: McpConfig,
        local_tenant: Option<Arc<str>>,
    ) -> Self {
        McpServer {
            shared: Arc::new(Shared {
                runner,
                door,
                sandboxes: Arc::new(Sandboxes::new(config.sandboxes)),
                default_backend: config.default_backend,
                local_tenant,
                stopping: CancellationToken::new(),
            }),
        }
    }

    /// The handler of a new MCP session.
    pub fn handler(&self) -> SkillboxMcp {
        SkillboxMcp::new(self.shared.clone())
    }

    /// Session sandboxes open or being opened.
    pub fn sandboxes_open(&self) -> usize {
        self.shared.sandboxes.open()
    }

    /// Serves one MCP session on this process's stdin and stdout until the client
    /// closes stdin or [`stop`](Self::stop) is called; then removes its sandbox.
    /// Nothing else may write to stdout meanwhile.
    pub async fn serve_stdio(&self) -> std::io::Result<()> {
        let served = self
            .handler()
            .serve_with_ct(
                rmcp::transport::stdio_pipes(),
                self.shared.stopping.child_token(),
            )
            .await;
        let outcome = match served {
            Ok(running) => running
                .waiting()
                .await
                .map(|_| ())
                .map_err(std::io::Error::other),
            Err(e) => Err(std::io::Error::other(format!(
                "the MCP client did not complete its initialize handshake: {e}"
            ))),
        };
        self.close().await;
        outcome
    }

    /// The streamable HTTP service (`/mcp`): one handler per MCP session, sessions in
    /// memory, each answering only the [`Caller`] that opened it, within
    /// `config.sessions`; no Host check of its own (the server's guard does it, before
    /// the key).
    pub fn http_service(&self, config: HttpConfig) -> HttpService {
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(config.idle);
        let sessions = Arc::new(sessions);
        let http = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_cancellation_token(self.shared.stopping.child_token())
            .with_max_request_body_bytes(config.max_body_bytes);
        let server = self.clone();
        let inner =
            StreamableHttpService::new(move || Ok(server.handler()), sessions.clone(), http);
        HttpService::new(
            inner,
            sessions,
            config.sessions,
            config.max_body_bytes,
            self.shared.stopping.clone(),
        )
    }

    /// Stops taking calls: every running one is cancelled, and sessions end.
    pub fn stop(&self) {
        self.shared.sandboxes.refuse_new();
        self.shared.stopping.cancel();
    }

    /// Stops, then removes every session's sandbox and waits until each is gone.
    pub async fn close(&self) {
        self.stop();
        self.shared.sandboxes.close_all().await;
    }
}
