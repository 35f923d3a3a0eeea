//! What every handler shares: the server's config, the runner, the run slots, metrics.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skillbox_capability::{Owner, SERVE, ServiceTable, TrustStore};
use skillbox_run::Runner;
use skillbox_store::ObjectOwners;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::agent_runs::AgentRuns;
use crate::auth::{ApiKeys, HostPolicy, Tenant};
use crate::capabilities::CapabilityConfig;
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
    /// API keys; `None` runs code for anyone who can reach the server, which `serve`
    /// allows on loopback only, or with `insecure_no_auth`.
    pub keys: Option<Arc<ApiKeys>>,
    /// Serve a non-loopback address without keys (logged loudly at every start).
    pub insecure_no_auth: bool,
    /// Names a loopback server answers besides loopback's own (`--allowed-host`).
    pub allowed_hosts: Vec<String>,
    /// A client gets this long to send a request's headers (and an idle connection
    /// this long to start its next request).
    pub header_timeout: Duration,
    /// ... and this long to send a request's body.
    pub body_timeout: Duration,
    /// A client that takes no byte of an answer the server is writing for this long
    /// has its connection closed (every answer, whatever it holds).
    pub write_timeout: Duration,
    /// Open connections at most; further ones are closed at once.
    pub max_connections: usize,
    /// Open connections of one peer (an IPv4 address, an IPv6 /64) at most; further
    /// ones are closed at once. `None`: [`ServerConfig::connections_per_peer`]'s
    /// default.
    pub max_connections_per_peer: Option<usize>,
    /// Request bodies held in memory at once, in bytes, across all requests; a request
    /// whose body would pass it is refused with 429 before its body is read.
    pub max_body_bytes_in_flight: usize,
    /// Runs (running or waiting) one tenant may have at once before it gets 429.
    pub tenant_max_runs: usize,
    /// What the artifact store keeps (an age and a byte budget, oldest out first).
    pub retention: skillbox_store::Retention,
    /// Agent run records that ended longer ago than this are removed.
    pub records_max_age: Option<Duration>,
    /// On a shared database: how long another node may be silent before this one
    /// takes it for dead and closes the runs it left running.
    pub node_silence: Duration,
    /// On a shared database: the URL other nodes reach this one at (`--advertise`);
    /// none: `http://` and the address it listens on.
    pub advertise: Option<String>,
    /// The capabilities of `/v1/capabilities` (none by default).
    pub capabilities: CapabilityConfig,
    /// How many sessions stay open, and for how long.
    pub sessions: crate::sessions::SessionConfig,
    /// Render slide previews as PNG when LibreOffice and pdftoppm are installed (else,
    /// or when false, previews are text outlines).
    pub png_previews: bool,
}

/// The most connections one peer may hold by default.
pub const MAX_CONNECTIONS_PER_PEER: usize = 64;

impl ServerConfig {
    /// Open connections one peer may hold: `max_connections_per_peer`, or by default
    /// half of `max_connections` (so one peer never holds them all) and at most
    /// [`MAX_CONNECTIONS_PER_PEER`]; at least 1.
    pub fn connections_per_peer(&self) -> usize {
        self.max_connections_per_peer
            .unwrap_or_else(|| (self.max_connections / 2).min(MAX_CONNECTIONS_PER_PEER))
            .max(1)
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        // Two runs a core: a run waits on the kernel (namespaces, the cgroup move) long
        // enough that one a core leaves the CPU idle. Measured on 2 cores (POST /v1/run
        // of `node 0` at concurrency 8, against bare spawns): 57% with 2 slots, 68%
        // with 4, 70% with 8 (docs/benchmarks.md).
        let runs = cores * 2;
        ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_concurrency: runs,
            max_queue: runs * 8,
            body_limit: 48 * 1024 * 1024,
            agents: None,
            keys: None,
            insecure_no_auth: false,
            allowed_hosts: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_connections_per_peer: None,
            max_body_bytes_in_flight: 256 * 1024 * 1024,
            tenant_max_runs: cores * 4,
            retention: skillbox_store::Retention {
                max_bytes: Some(10 << 30),
                max_age: Some(Duration::from_secs(7 * 24 * 3600)),
            },
            records_max_age: Some(Duration::from_secs(30 * 24 * 3600)),
            node_silence: Duration::from_secs(30),
            advertise: None,
            capabilities: CapabilityConfig::default(),
            sessions: crate::sessions::SessionConfig::default(),
            png_previews: true,
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
    /// Which tenant may read which stored object.
    pub(crate) owners: ObjectOwners,
    /// Bytes of request bodies being read or held, as permits.
    pub(crate) body_bytes: Arc<Semaphore>,
    /// Each tenant's share of those bytes, on a server with API keys (`None`: one
    /// tenant, or any caller is the same one).
    pub(crate) body_shares: Option<Arc<crate::runs::BodyShares>>,
    /// Runs each tenant has running or waiting.
    pub(crate) tenant_runs: Arc<Mutex<HashMap<Arc<str>, usize>>>,
    /// The Host names answered; `None` answers any (see [`HostPolicy`]).
    pub(crate) hosts: Option<HostPolicy>,
    /// The capability grants of the data dir (`<data>/trust.json`), shared by every
    /// request so that one `once` grant runs one call.
    pub(crate) trust: Arc<TrustStore>,
    /// The persistent capabilities this server started, in its capabilities' project.
    pub(crate) services: Arc<ServiceTable>,
    /// The sessions open on this server.
    pub(crate) sessions: Arc<crate::sessions::Sessions>,
    /// The slide previews' cache and render slot.
    pub(crate) previews: Arc<crate::previews::Previews>,
    /// What is composed above the server (`/mcp`); none in the copies the extensions
    /// hold.
    pub(crate) extensions: Vec<Arc<dyn crate::Extension>>,
    /// This node among those sharing a records database (`serve --db`); none alone.
    pub(crate) cluster: Option<Arc<crate::cluster::Cluster>>,
    runs: CancellationToken,
}

impl AppState {
    pub fn new(
        config: ServerConfig,
        runner: Arc<Runner>,
        owners: ObjectOwners,
        runs: CancellationToken,
    ) -> Self {
        AppState {
            trust: Arc::new(TrustStore::open(runner.data_dir())),
            sessions: Arc::new(crate::sessions::Sessions::new(config.sessions)),
            previews: Arc::new(crate::previews::Previews::new(
                runner.data_dir(),
                runner.backends(),
                config.png_previews,
            )),
            services: Arc::new(ServiceTable::new(
                runner.data_dir(),
                &config.capabilities.project,
                Owner::this_process(SERVE),
            )),
            runner,
            slots: Arc::new(Semaphore::new(config.max_concurrency.max(1))),
            body_bytes: Arc::new(Semaphore::new(
                config
                    .max_body_bytes_in_flight
                    .clamp(1, Semaphore::MAX_PERMITS),
            )),
            body_shares: config.keys.as_ref().map(|_| {
                crate::runs::BodyShares::new(config.max_body_bytes_in_flight, config.body_limit)
            }),
            config,
            metrics: Arc::new(Metrics::default()),
            owners,
            tenant_runs: Arc::default(),
            hosts: None,
            extensions: Vec::new(),
            cluster: None,
            runs,
        }
    }

    /// Counts a run of `tenant` while the guard lives; `None` when the tenant is at
    /// its bound.
    pub(crate) fn tenant_run(&self, tenant: &Tenant) -> Option<TenantRun> {
        let mut runs = self.tenant_runs.lock().ok()?;
        let count = runs.entry(tenant.0.clone()).or_insert(0);
        if *count >= self.config.tenant_max_runs.max(1) {
            return None;
        }
        *count += 1;
        Some(TenantRun {
            runs: self.tenant_runs.clone(),
            tenant: tenant.0.clone(),
        })
    }

    /// Cancelled at shutdown: every running run is cancelled and its sandbox removed.
    pub fn runs_cancel(&self) -> &CancellationToken {
        &self.runs
    }

    /// How this server's services name their owner.
    pub(crate) fn services_owner(&self) -> String {
        Owner::this_process(SERVE).to_string()
    }

    /// Stops every service this server started (at shutdown).
    pub async fn stop_services(&self) {
        self.services.stop_all().await;
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

/// One run of a tenant, counted until dropped.
#[derive(Debug)]
pub(crate) struct TenantRun {
    runs: Arc<Mutex<HashMap<Arc<str>, usize>>>,
    tenant: Arc<str>,
}

impl Drop for TenantRun {
    fn drop(&mut self) {
        if let Ok(mut runs) = self.runs.lock()
            && let Some(count) = runs.get_mut(&self.tenant)
        {
            *count -= 1;
            if *count == 0 {
                runs.remove(&self.tenant);
            }
        }
    }
}
