//! The sandbox of each MCP session: opened on the first `exec`, `read_file`,
//! `write_file` or `list_dir`, kept while the MCP session lives, removed when it ends
//! (and every one at shutdown). A server holds a bounded number of them, in all and per
//! tenant, in the door's `SessionTable` as it does HTTP sessions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use skillbox_door::{SessionBounds, SessionTable};
use skillbox_env::{CancellationToken, ErrorCode, ExecutionEnv, SandboxPolicy, SandboxSpec};
use skillbox_protocol::SandboxedKind;
use skillbox_run::Runner;
use tokio_util::task::TaskTracker;

use crate::door::ToolError;

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

/// Every session sandbox of one server (or of one `skillbox mcp`): the door's one table
/// of kept sandboxes, bounded as the HTTP sessions are.
#[derive(Default)]
pub struct Sandboxes {
    table: SessionTable<u64, Sandbox>,
    next: AtomicU64,
    /// Removals still running (a session that ended), awaited at shutdown.
    removals: TaskTracker,
}

impl std::fmt::Debug for Sandboxes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandboxes")
            .field("table", &self.table)
            .field("open", &self.open())
            .finish_non_exhaustive()
    }
}

impl Sandboxes {
    pub fn new(bounds: SessionBounds) -> Self {
        Sandboxes {
            table: SessionTable::new(bounds),
            ..Sandboxes::default()
        }
    }

    /// Sandboxes open or being opened.
    pub fn open(&self) -> usize {
        self.table.len()
    }

    /// A new session's key in the table.
    pub(crate) fn key(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Opens the sandbox of session `key` for `tenant`: a fresh sandbox of `backend`
    /// with the runner's limits and the Node runtime at `/node_modules`, as an HTTP
    /// session opens one. Its place is taken first (or the bound reached is named).
    pub(crate) async fn open_for(
        &self,
        key: u64,
        tenant: &Arc<str>,
        backend: SandboxedKind,
        runner: &Runner,
    ) -> Result<Arc<Sandbox>, ToolError> {
        let place = self.table.reserve(key, tenant).map_err(|refused| {
            ToolError::new(
                refused.code(),
                refused.message("MCP sessions with a sandbox", "end one"),
            )
        })?;
        let started = Instant::now();
        let mut policy = SandboxPolicy::default();
        runner.runtime_mount(backend.kind(), &mut policy).await?;
        let spec = SandboxSpec {
            workspace: None,
            root: runner.root().clone(),
            limits: runner.limits().clone(),
            policy,
        };
        let env = runner.backends().create(backend.kind(), spec).await?;
        let sandbox = Arc::new(Sandbox {
            backend,
            env,
            ending: CancellationToken::new(),
            running: AtomicUsize::new(0),
        });
        if let Err(sandbox) = place.fill(sandbox.clone()) {
            // The session or the server ended while it opened.
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

    /// Session `key` ended: its sandbox (if it opened one) is removed, in a task that
    /// [`close_all`](Self::close_all) waits for.
    pub(crate) fn release(&self, key: u64) {
        let Some(sandbox) = self.table.remove(&key) else {
            return;
        };
        sandbox.ending.cancel();
        // A session that ends because the server stops says so, whichever of the two
        // removes its sandbox first.
        let why = if self.table.is_closed() {
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
        self.table.close();
    }

    /// Ends every sandbox (the server or `skillbox mcp` stopping) and waits until each
    /// is removed, those of sessions that ended before included. None opens afterwards.
    pub async fn close_all(&self) {
        for sandbox in self.table.drain() {
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
