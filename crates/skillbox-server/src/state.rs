//! What every handler shares: the server's config, the runner, the run slots, metrics.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use skillbox_run::Runner;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::agent_runs::AgentRuns;
use crate::metrics::Metrics;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Runs at once (default: the number of cores).
    pub max_concurrency: usize,
    /// Runs that may wait for a slot before new ones get 429.
    pub max_queue: usize,
    /// Largest request body (413 above).
    pub body_limit: usize,
    /// Agent runs (`/v1/agent/runs`); `None` answers 503 there.
    pub agents: Option<AgentRuns>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_concurrency: cores,
            max_queue: cores * 8,
            body_limit: 48 * 1024 * 1024,
            agents: None,
        }
    }
}

/// Shared by every handler.
#[derive(Debug, Clone)]
pub struct AppState {
    pub(crate) runner: Arc<Runner>,
    pub(crate) slots: Arc<Semaphore>,
    pub(crate) config: ServerConfig,
    pub(crate) metrics: Arc<Metrics>,
    runs: CancellationToken,
}

impl AppState {
    pub fn new(config: ServerConfig, runner: Arc<Runner>, runs: CancellationToken) -> Self {
        AppState {
            runner,
            slots: Arc::new(Semaphore::new(config.max_concurrency.max(1))),
            config,
            metrics: Arc::new(Metrics::default()),
            runs,
        }
    }

    /// Cancelled at shutdown: every running run is cancelled and its sandbox removed.
    pub fn runs_cancel(&self) -> &CancellationToken {
        &self.runs
    }

    pub(crate) fn agents(&self) -> Option<&AgentRuns> {
        self.config.agents.as_ref()
    }
}

/// Counts one up while alive.
pub(crate) struct Gauge<'a> {
    counter: &'a AtomicU64,
    /// The value before this one was counted.
    pub(crate) before: u64,
}

impl<'a> Gauge<'a> {
    pub(crate) fn up(counter: &'a AtomicU64) -> Self {
        let before = counter.fetch_add(1, Ordering::SeqCst);
        Gauge { counter, before }
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.counter.fetch_sub(1, Ordering::SeqCst);
    }
}
