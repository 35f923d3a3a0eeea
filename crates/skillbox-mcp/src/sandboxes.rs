//! The sandbox of each MCP session: opened on the first `exec`, `read_file`,
//! `write_file` or `list_dir`, kept while the MCP session lives, removed when it ends
//! (and every one at shutdown). A server holds a bounded number of them, in all and per
//! tenant, as it does HTTP sessions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use skillbox_env::{CancellationToken, ErrorCode, ExecutionEnv, SandboxPolicy, SandboxSpec};
use skillbox_protocol::SandboxedKind;
use skillbox_run::Runner;
use tokio_util::task::TaskTracker;

use crate::door::ToolError;

/// How many session sandboxes a server keeps open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxBounds {
    pub max_total: usize,
    pub max_per_tenant: usize,
}

impl Default for SandboxBounds {
    /// The HTTP sessions' own bounds (`SessionConfig`'s defaults).
    fn default() -> Self {
        SandboxBounds {
            max_total: 64,
            max_per_tenant: 8,
        }
    }
}

/// Commands running at once in one session's sandbox, as in an HTTP session.
pub(crate) const MAX_EXECS: usize = 4;

/// One MCP session's sandbox.
pub(crate) struct Sandbox {
    pub(crate) backend: SandboxedKind,
    pub(crate) env: Box<dyn ExecutionEnv>,
    /// Cancelled when the session ends: every running call with it.
    pub(crate) ending: CancellationToken,
    pub(crate) running: AtomicUsize,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// A running call in a sandbox, counted while alive.
pub(crate) struct Running(Arc<Sandbox>);

impl Running {
    /// Counts one more call, or refuses past [`MAX_EXECS`].
    pub(crate) fn start(sandbox: &Arc<Sandbox>) -> Result<Running, ToolError> {
        if sandbox.running.fetch_add(1, Ordering::SeqCst) >= MAX_EXECS {
            sandbox.running.fetch_sub(1, Ordering::SeqCst);
            return Err(ToolError::new(
                ErrorCode::Overloaded,
                format!(
                    "{MAX_EXECS} calls are running in this session's sandbox; wait for one to end"
                ),
            ));
        }
        Ok(Running(sandbox.clone()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Entry {
    tenant: Arc<str>,
    /// `None` while it is being opened (it counts against the bounds already).
    sandbox: Option<Arc<Sandbox>>,
}

/// Every session sandbox of one server (or of one `skillbox mcp`).
#[derive(Default)]
pub struct Sandboxes {
    table: Mutex<HashMap<u64, Entry>>,
    bounds: SandboxBounds,
    next: AtomicU64,
    /// Set at shutdown: no sandbox opens after it.
    closed: AtomicBool,
    /// Removals still running (a session that ended), awaited at shutdown.
    removals: TaskTracker,
}

impl std::fmt::Debug for Sandboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandboxes")
            .field("bounds", &self.bounds)
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

impl Sandboxes {
    pub fn new(bounds: SandboxBounds) -> Self {
        Sandboxes {
            bounds,
            ..Sandboxes::default()
        }
    }

    /// Sandboxes open or being opened.
    pub fn open(&self) -> usize {
        self.table.lock().map(|t| t.len()).unwrap_or(0)
    }

    /// A new session's key in the table.
    pub(crate) fn key(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Takes a place for session `key` of `tenant`, or says which bound is reached.
    fn reserve(&self, key: u64, tenant: &Arc<str>) -> Result<(), ToolError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(ToolError::new(
                ErrorCode::Unavailable,
                "the server is shutting down; no sandbox opens now",
            ));
        }
        let mut table = self
            .table
            .lock()
            .map_err(|_| ToolError::new(ErrorCode::Unknown, "the sandbox table is poisoned"))?;
        if table.len() >= self.bounds.max_total {
            return Err(ToolError::new(
                ErrorCode::Overloaded,
                format!(
                    "{} MCP sessions have a sandbox open on this server, as many as it takes; end one or retry later",
                    self.bounds.max_total
                ),
            ));
        }
        let theirs = table.values().filter(|e| e.tenant == *tenant).count();
        if theirs >= self.bounds.max_per_tenant {
            return Err(ToolError::new(
                ErrorCode::Overloaded,
                format!(
                    "tenant {tenant} has {} MCP sessions with a sandbox open, as many as one tenant may; end one first",
                    self.bounds.max_per_tenant
                ),
            ));
        }
        table.insert(
            key,
            Entry {
                tenant: tenant.clone(),
                sandbox: None,
            },
        );
        Ok(())
    }

    /// Opens the sandbox of session `key` for `tenant`: a fresh sandbox of `backend`
    /// with the runner's limits and the Node runtime at `/node_modules`, as an HTTP
    /// session opens one.
    pub(crate) async fn open_for(
        &self,
        key: u64,
        tenant: &Arc<str>,
        backend: SandboxedKind,
        runner: &Runner,
    ) -> Result<Arc<Sandbox>, ToolError> {
        self.reserve(key, tenant)?;
        let started = Instant::now();
        let made = async {
            let mut policy = SandboxPolicy::default();
            runner.runtime_mount(backend.kind(), &mut policy).await?;
            let spec = SandboxSpec {
                workspace: None,
                limits: runner.limits().clone(),
                policy,
            };
            Ok::<_, ToolError>(runner.backends().create(backend.kind(), spec).await?)
        }
        .await;
        let env = match made {
            Ok(env) => env,
            Err(e) => {
                self.forget(key);
                return Err(e);
            }
        };
        let sandbox = Arc::new(Sandbox {
            backend,
            env,
            ending: CancellationToken::new(),
            running: AtomicUsize::new(0),
        });
        let kept = self.table.lock().ok().and_then(|mut table| {
            table.get_mut(&key).map(|entry| {
                entry.sandbox = Some(sandbox.clone());
            })
        });
        if kept.is_none() || self.closed.load(Ordering::SeqCst) {
            // The session or the server ended while it opened.
            self.forget(key);
            remove(sandbox, "its session ended while it opened").await;
            return Err(ToolError::new(
                ErrorCode::Aborted,
                "the session ended while its sandbox opened",
            ));
        }
        tracing::info!(
            backend = backend.as_str(),
            open_ms = started.elapsed().as_millis() as u64,
            "mcp: sandbox opened"
        );
        Ok(sandbox)
    }

    fn forget(&self, key: u64) -> Option<Entry> {
        self.table.lock().ok().and_then(|mut t| t.remove(&key))
    }

    /// Session `key` ended: its sandbox (if it opened one) is removed, in a task that
    /// [`close_all`](Self::close_all) waits for.
    pub(crate) fn release(&self, key: u64) {
        let Some(sandbox) = self.forget(key).and_then(|e| e.sandbox) else {
            return;
        };
        sandbox.ending.cancel();
        // A session that ends because the server stops says so, whichever of the two
        // removes its sandbox first.
        let why = if self.closed.load(Ordering::SeqCst) {
            "skillbox is stopping"
        } else {
            "its MCP session ended"
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                self.removals.spawn_on(remove(sandbox, why), &handle);
            }
            // No runtime to clean up on (a process ending): the env's own drop is all
            // that runs.
            Err(_) => tracing::warn!("mcp: a session ended outside the runtime"),
        }
    }

    /// No sandbox opens from now on (the server is stopping); those open stay until
    /// [`close_all`](Self::close_all) or their session's end.
    pub fn refuse_new(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Ends every sandbox (the server or `skillbox mcp` stopping) and waits until each
    /// is removed, those of sessions that ended before included. None opens afterwards.
    pub async fn close_all(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let drained: Vec<Arc<Sandbox>> = self
            .table
            .lock()
            .map(|mut t| t.drain().filter_map(|(_, e)| e.sandbox).collect())
            .unwrap_or_default();
        for sandbox in drained {
            sandbox.ending.cancel();
            remove(sandbox, "skillbox is stopping").await;
        }
        self.removals.close();
        self.removals.wait().await;
    }
}

/// Removes a sandbox once its calls have returned (they end on its `ending` cancel).
async fn remove(sandbox: Arc<Sandbox>, why: &str) {
    let waited = Instant::now();
    while sandbox.running.load(Ordering::SeqCst) > 0 && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Err(e) = sandbox.env.cleanup().await {
        tracing::warn!(error = %e, "mcp: sandbox cleanup failed");
    }
    tracing::info!(
        backend = sandbox.backend.as_str(),
        why,
        "mcp: sandbox removed"
    );
}
