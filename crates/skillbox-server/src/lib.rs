//! `skillbox serve`: the HTTP API of DESIGN.md §5 on axum.
//!
//! Every error is `{"error":{"code","message"}}` with a fitting status; a run that hits
//! a limit is a normal 200 answer. Runs are bounded: `max_concurrency` at once, up to
//! `max_queue` more waiting, then 429 with `Retry-After`.

mod agent_runs;
mod agents;
mod error;
mod metrics;
mod routes;
mod runs;
mod state;

pub use agent_runs::{AgentModel, AgentRuns};
pub use error::status_of;
pub use routes::{ApiDoc, router};
pub use state::{AppState, ServerConfig};

use std::net::SocketAddr;
use std::sync::Arc;

use skillbox_run::Runner;
use tokio_util::sync::CancellationToken;

/// Serves until `shutdown` fires; then stops taking requests, cancels running runs
/// (their sandboxes are removed) and returns.
pub async fn serve(
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    serve_on(listener, config, runner, shutdown).await
}

/// As [`serve`], on a listener the caller bound (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let config_agents = config.agents.clone();
    let state = AppState::new(config, runner, shutdown.child_token());
    let app = router(state.clone());
    tracing::info!(%addr, "skillbox serve: listening");
    let graceful = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { graceful.cancelled().await })
        .await?;
    state.runs_cancel().cancel();
    // Agent runs end on the cancel; give them a moment to record how they ended.
    if let Some(agents) = &config_agents {
        agents.wait(std::time::Duration::from_secs(30)).await;
    }
    Ok(())
}
