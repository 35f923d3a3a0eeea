//! `skillbox serve`: the HTTP API of DESIGN.md §5 on axum.
//!
//! Every error is `{"error":{"code","message"}}` with a fitting status; a run that hits
//! a limit is a normal 200 answer. Runs are bounded: `max_concurrency` at once, up to
//! `max_queue` more waiting, then 429 with `Retry-After`.

mod agent_runs;
mod agents;
mod auth;
mod capabilities;
mod cluster;
mod download;
mod error;
mod extension;
mod listen;
mod metrics;
mod previews;
mod routes;
mod runs;
mod sessions;
mod skills;
mod state;
mod ui;

pub use agent_runs::{AgentModel, AgentRuns};
pub use auth::{ApiKeys, LOCAL_TENANT, Tenant};
pub use capabilities::CapabilityConfig;
pub use error::{Failure, status_of};
pub use extension::{Extension, Extensions};
pub use previews::{Renderer, preview_report};
pub use routes::{ApiDoc, router};
pub use runs::{Admission, BodyHold};
pub use sessions::SessionConfig;
pub use state::{AppState, ServerConfig};

use std::net::SocketAddr;
use std::sync::Arc;

use skillbox_run::Runner;
use skillbox_store::ObjectOwners;
use tokio_util::sync::CancellationToken;

/// Serves until `shutdown` fires; then stops taking requests, cancels running runs
/// (their sandboxes are removed) and returns.
///
/// A server that anyone on the network could reach runs code for them: an address
/// that is not loopback is refused without API keys, unless the config says
/// `insecure_no_auth` (which is logged at every start).
pub async fn serve(
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(config, runner, shutdown, Box::new(|_| Vec::new())).await
}

/// As [`serve`], with what `extensions` makes over the server's state mounted too
/// (`skillbox serve`'s `/mcp`).
pub async fn serve_with(
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> std::io::Result<()> {
    let config = with_shared_keys(config, runner.records())?;
    check_exposure(config.addr, &config)?;
    let listener = tokio::net::TcpListener::bind(config.addr).await?;
    serve_on_with(listener, config, runner, shutdown, extensions).await
}

/// On a shared records database, keys are checked (unless `insecure_no_auth` and the
/// server has no keys of its own), and the database's keys count beside the server's
/// own: the nodes of one database answer the same keys, and a node on loopback is no
/// less shared than one that is not.
fn with_shared_keys(
    mut config: ServerConfig,
    records: &skillbox_store::RecordsDb,
) -> std::io::Result<ServerConfig> {
    if matches!(records, skillbox_store::RecordsDb::Postgres(_))
        && (config.keys.is_some() || !config.insecure_no_auth)
    {
        let shared = skillbox_store::KeyRecords::open(records)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let own = config.keys.as_deref().cloned().unwrap_or_default();
        tracing::info!(
            own = own.len(),
            "API keys: the database's, and {} of this server's own",
            own.len()
        );
        config.keys = Some(Arc::new(own.with_shared(shared)));
    }
    Ok(config)
}

/// Refuses to serve a non-loopback address without keys, unless told to.
fn check_exposure(addr: SocketAddr, config: &ServerConfig) -> std::io::Result<()> {
    if addr.ip().is_loopback() || config.keys.is_some() {
        return Ok(());
    }
    if config.insecure_no_auth {
        tracing::warn!(
            %addr,
            "skillbox serve: NO AUTHENTICATION on a non-loopback address: anyone who can reach \
             {addr} can run code on this machine (--insecure-no-auth)"
        );
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "{addr} is not a loopback address and no API keys are set: anyone who can reach it \
             could run code here. Give keys (--api-keys FILE or SKILLBOX_API_KEYS; \
             `skillbox keys new TENANT` makes one), bind 127.0.0.1, or pass --insecure-no-auth"
        ),
    ))
}

/// As [`serve`], on a listener the caller bound (tests bind port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_on_with(listener, config, runner, shutdown, Box::new(|_| Vec::new())).await
}

/// As [`serve_with`], on a listener the caller bound.
pub async fn serve_on_with(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    runner: Arc<Runner>,
    shutdown: CancellationToken,
    extensions: Extensions,
) -> std::io::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    let config = with_shared_keys(config, runner.records())?;
    check_exposure(addr, &config)?;
    // Names a browser may reach a loopback server under, against DNS rebinding.
    let hosts =
        (addr.ip().is_loopback() || !config.allowed_hosts.is_empty()).then(|| auth::HostPolicy {
            extra: config
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        });
    let owners =
        ObjectOwners::open(runner.records()).map_err(|e| std::io::Error::other(e.to_string()))?;
    let config_agents = config.agents.clone();
    let limits = listen::ConnectionLimits {
        header_timeout: config.header_timeout,
        answer_timeout: config.body_timeout,
        write_timeout: config.write_timeout,
        max_connections: config.max_connections,
        max_per_peer: config.connections_per_peer(),
    };
    let mut state = AppState::new(config, runner, owners, shutdown.child_token());
    state.extensions = extensions(&state);
    tokio::spawn(keep_within_retention(state.clone(), shutdown.clone()));
    // On a shared database, capability grants are the database's: every node decides
    // alike, and a `once` grant is used up by one run of all.
    if let records @ skillbox_store::RecordsDb::Postgres(_) = state.runner.records() {
        let grants = skillbox_store::GrantRecords::open(records)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        state.trust = Arc::new(skillbox_capability::TrustStore::in_records(
            state.runner.data_dir(),
            grants,
        ));
    }
    // Beside other nodes on a shared database: say this one is alive, close the runs
    // of one that has gone silent, forward requests for another's sessions.
    if let (Some(agents), records @ skillbox_store::RecordsDb::Postgres(_)) =
        (state.agents(), state.runner.records())
    {
        let nodes = skillbox_store::Nodes::open(records)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let address = match &state.config.advertise {
            Some(address) => address.clone(),
            None => format!("http://{addr}"),
        };
        let cluster = Arc::new(
            cluster::Cluster::new(nodes, agents.records.node().to_string(), address)
                .map_err(std::io::Error::other)?,
        );
        tokio::spawn(cluster::watch_nodes(
            cluster.clone(),
            agents.records.clone(),
            state.config.node_silence,
            shutdown.clone(),
        ));
        state.cluster = Some(cluster);
    }
    state.hosts = hosts;
    // A server starts with an empty table: what an earlier one started died with it.
    let forgotten = state.services.forget_dead(skillbox_capability::SERVE);
    if forgotten > 0 {
        tracing::info!(
            forgotten,
            "skillbox serve: cleared the records of an earlier server's services"
        );
    }
    tokio::spawn(sessions::reap(state.clone(), shutdown.clone()));
    let app = router(state.clone());
    tracing::info!(%addr, "skillbox serve: listening");
    // Runs in flight are cancelled as soon as shutdown begins (their sandboxes go with
    // them), so connections waiting on a run answer at once and the drain is short.
    // Sessions end then too: an exec streaming to its client would otherwise hold its
    // connection open through the whole drain.
    let ending = state.clone();
    let cancel_runs = shutdown.clone();
    tokio::spawn(async move {
        cancel_runs.cancelled().await;
        ending.runs_cancel().cancel();
        // An extension's calls end too (MCP's, and its sessions' streams with them).
        for extension in &ending.extensions {
            extension.stop();
        }
        sessions::close_all(&ending).await;
    });
    listen::accept_loop(listener, app, limits, state.metrics.clone(), shutdown).await;
    state.runs_cancel().cancel();
    // Every session ends with it (one made during the drain too): nothing of one is
    // left behind.
    sessions::close_all(&state).await;
    for extension in &state.extensions {
        extension.close().await;
    }
    // The services it supervises end with it: nothing it started is left running.
    state.stop_services().await;
    // Agent runs end on the cancel; give them a moment to record how they ended.
    if let Some(agents) = &config_agents {
        agents.wait(std::time::Duration::from_secs(30)).await;
    }
    // Its runs are recorded: no other node need close them.
    if let Some(cluster) = &state.cluster
        && let Err(e) = cluster.nodes.leave(&cluster.me).await
    {
        tracing::warn!(error = %e, "skillbox serve: cannot take this node off the database's list");
    }
    Ok(())
}

/// How often retention runs (and once at start).
const RETENTION_EVERY: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Removes what is past retention, now and then every [`RETENTION_EVERY`], until shutdown:
/// old objects (their owners, so a download is a clean 404, and their slide previews;
/// never what a kept workspace snapshot needs) and old agent records.
async fn keep_within_retention(state: AppState, shutdown: CancellationToken) {
    let store = state.runner.store();
    let snapshots = state.runner.snapshots().ok().cloned();
    let (retention, records_max_age) = (state.config.retention, state.config.records_max_age);
    loop {
        // A scope unused for the objects' age is forgotten: its snapshots are kept
        // from retention no longer.
        if let (Some(snapshots), Some(max_age)) = (&snapshots, retention.max_age) {
            match snapshots.forget_unused(max_age).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(scopes = n, "retention: unused scopes forgotten"),
                Err(e) => tracing::warn!(error = %e, "retention: cannot forget unused scopes"),
            }
        }
        // What a kept workspace snapshot needs stays, whatever its age.
        let keep = match &snapshots {
            Some(snapshots) => Some(snapshots.referenced().await),
            None => None,
        };
        let keep = match keep {
            Some(Ok(keep)) => keep,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "retention: cannot list the snapshots' objects; nothing removed this pass");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RETENTION_EVERY) => {}
                }
                continue;
            }
            None => std::collections::HashSet::new(),
        };
        match store.prune_keeping(retention, &keep).await {
            Ok(pruned) => {
                if let Err(e) = state.owners.forget(&pruned.removed).await {
                    tracing::warn!(error = %e, "retention: cannot forget removed objects");
                }
                state.previews.forget(&pruned.removed);
            }
            Err(e) => tracing::warn!(error = %e, "retention: the store pass failed"),
        }
        if let (Some(agents), Some(max_age)) = (state.agents(), records_max_age) {
            match agents.records.prune(max_age).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(removed = n, "retention: old agent run records removed"),
                Err(e) => tracing::warn!(error = %e, "retention: the records pass failed"),
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETENTION_EVERY) => {}
        }
    }
}
