//! One started sandbox container and what skillbox keeps about it while a sandbox uses
//! it: whose turn it is to exec, the gate file operations hold, and what the daemon said
//! about it (out-of-memory events, its death). Removing it ends every use.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{EventsOptions, InspectContainerOptions};
use futures_util::StreamExt;
use skillbox_env::{CancellationToken, DiskSplit, EnvError, Limits};
use tokio::sync::{Mutex, RwLock};

use crate::daemon::{LINE_BYTES, Live, collect_exec, is_running, remove_container, unavailable};
use crate::runtime::Runtime;

/// How long a death is waited for the daemon to report: it comes in milliseconds on
/// a quiet machine and was seen to trail by more than 500 ms under a full test run.
const DEATH_REPORT_BOUND: Duration = Duration::from_secs(5);

/// A sandbox's container.
#[derive(Debug)]
pub(crate) struct Container {
    pub(crate) docker: Docker,
    pub(crate) id: String,
    pub(crate) runtime: Runtime,
    pub(crate) limits: Limits,
    /// The container's pid 1 as `top` shows it (runc; under runsc the reset does not
    /// use it).
    pub(crate) init_pid: String,
    /// Execs run one at a time; see the crate docs.
    pub(crate) turn: Arc<Mutex<()>>,
    /// File operations hold it shared; a kill of the container's processes takes it
    /// exclusively (for a bounded time), so it does not hit a file operation mid-way.
    pub(crate) fs_gate: Arc<RwLock<()>>,
    /// Fired by cleanup or drop: running execs end as aborted.
    pub(crate) shutdown: CancellationToken,
    removed: AtomicBool,
    /// Fired when the daemon reports the container died (under gVisor, a memory bomb
    /// takes the sandbox's kernel with it).
    pub(crate) died: CancellationToken,
    /// Fired when the daemon's own `die` event arrives: the `oom` events it sends
    /// before it are counted by then.
    die_reported: CancellationToken,
    /// Out-of-memory events the daemon reported for the container.
    pub(crate) ooms: AtomicU64,
    /// The pid (seen from inside) of skillbox's egress bridge under runsc, which the
    /// in-container reset spares while it is root's; 0 for none.
    pub(crate) bridge_pid: std::sync::atomic::AtomicU32,
    live: Live,
}

impl Container {
    /// The state of a container that was just started (see `Warm`); `since` is when its
    /// events start, for the watch this spawns.
    pub(crate) fn started(
        docker: Docker,
        id: String,
        runtime: Runtime,
        limits: Limits,
        init_pid: String,
        live: Live,
        since: u64,
    ) -> Arc<Container> {
        let container = Arc::new(Container {
            docker,
            id,
            runtime,
            limits,
            init_pid,
            turn: Arc::new(Mutex::new(())),
            fs_gate: Arc::new(RwLock::new(())),
            shutdown: CancellationToken::new(),
            removed: AtomicBool::new(false),
            died: CancellationToken::new(),
            die_reported: CancellationToken::new(),
            ooms: AtomicU64::new(0),
            bridge_pid: std::sync::atomic::AtomicU32::new(0),
            live,
        });
        tokio::spawn(watch(Arc::downgrade(&container), since));
        container
    }

    /// True once the container is removed (or being removed): nothing may use it.
    pub(crate) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }

    /// Removes the container, once; running execs and file operations end as aborted.
    pub(crate) async fn remove(&self) {
        if self.removed.swap(true, Ordering::SeqCst) {
            return;
        }
        self.shutdown.cancel();
        // A container that could not be removed stays on the backend's list, for its
        // shutdown (and the next start's sweep) to try again.
        if remove_container(&self.docker, &self.id).await
            && let Ok(mut set) = self.live.lock()
        {
            set.remove(&self.id);
        }
    }

    /// Why a removed sandbox cannot be used: cleaned up by its owner, or its container
    /// died.
    pub(crate) fn gone(&self) -> EnvError {
        if self.died.is_cancelled() {
            let why = if self.ooms.load(Ordering::SeqCst) > 0 {
                " (out of memory: under gVisor the memory limit ends the sandbox's kernel with the code that hit it)"
            } else {
                ""
            };
            unavailable(format!(
                "backend {}: the sandbox's container died{why}; start a new sandbox",
                self.runtime.backend()
            ))
        } else {
            EnvError::aborted("the sandbox was cleaned up")
        }
    }

    /// True when the daemon recorded that the container was killed for memory.
    pub(crate) async fn oom_killed(&self) -> bool {
        match self
            .docker
            .inspect_container(&self.id, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => info.state.and_then(|s| s.oom_killed).unwrap_or(false),
            Err(_) => false,
        }
    }

    /// False once the container has stopped (or is gone).
    pub(crate) async fn is_running(&self) -> bool {
        is_running(&self.docker, &self.id).await
    }

    /// Whether the sandbox's bounded `/workspace` or `/tmp` is full (or as good as: less
    /// left than a failed write would leave, or no inodes). False without a disk bound.
    pub(crate) async fn disk_full(&self) -> bool {
        let Some(split) = self.limits.disk_split() else {
            return false;
        };
        const STATFS: &str = "import os\nfor p in ('/workspace', '/tmp'):\n    s = os.statvfs(p)\n    print(s.f_bavail * s.f_frsize, s.f_favail)\n";
        let argv = [self.runtime.python(), "-I", "-S", "-c", STATFS]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let backend = self.runtime.backend();
        let Ok(out) = collect_exec(
            &self.docker,
            &self.id,
            backend,
            "disk check",
            argv,
            None,
            LINE_BYTES,
        )
        .await
        else {
            return false;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let sizes = [split.workspace_bytes, split.tmp_bytes];
        text.lines().zip(sizes).any(|(line, size)| {
            let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
            let (Some(Some(free)), Some(Some(inodes))) = (fields.next(), fields.next()) else {
                return false;
            };
            // gVisor reports no inode counts (0 of 0): its inodes are not bounded there.
            let inodes = (self.runtime != Runtime::Runsc).then_some(inodes);
            DiskSplit::is_full(size, free, inodes)
        })
    }

    /// Whether the container, which skillbox did not kill, has stopped: at once by the
    /// daemon's state, else once its death is reported within [`DEATH_REPORT_BOUND`]
    /// (an exec's stream can end before a loaded daemon has seen its container die).
    pub(crate) async fn stopped(&self) -> bool {
        if !self.is_running().await {
            return true;
        }
        let _ = tokio::time::timeout(DEATH_REPORT_BOUND, self.died.cancelled()).await;
        self.died.is_cancelled() || !self.is_running().await
    }

    /// Whether the memory limit ended a container that died, by the daemon's record.
    /// Waits (bounded) for the daemon's `die` event, since it sends any `oom` event
    /// first: a fixed wait for the `oom` event was too short on a loaded machine.
    pub(crate) async fn died_of_memory(&self, ooms_before: u64) -> bool {
        let _ = tokio::time::timeout(DEATH_REPORT_BOUND, self.die_reported.cancelled()).await;
        self.ooms.load(Ordering::SeqCst) > ooms_before || self.oom_killed().await
    }

    /// True when an out-of-memory event for the container arrives after the first
    /// `before` (events may trail the kill they explain by a moment).
    pub(crate) async fn oom_after(&self, before: u64) -> bool {
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            if self.ooms.load(Ordering::SeqCst) > before {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Follows the daemon's events for the container: counts out-of-memory events, and
/// fires `died` when it dies. Ends with the sandbox.
async fn watch(container: Weak<Container>, since: u64) {
    let (id, docker, shutdown) = match container.upgrade() {
        Some(container) => (
            container.id.clone(),
            container.docker.clone(),
            container.shutdown.clone(),
        ),
        None => return,
    };
    let options = EventsOptions {
        since: Some(since.to_string()),
        until: None,
        filters: Some(HashMap::from([
            ("container".to_string(), vec![id]),
            (
                "event".to_string(),
                vec!["oom".to_string(), "die".to_string()],
            ),
        ])),
    };
    let mut events = docker.events(Some(options)).boxed();
    loop {
        let event = tokio::select! {
            event = events.next() => event,
            () = shutdown.cancelled() => return,
        };
        let Some(Ok(event)) = event else { return };
        let Some(container) = container.upgrade() else {
            return;
        };
        match event.action.as_deref() {
            Some("oom") => {
                container.ooms.fetch_add(1, Ordering::SeqCst);
            }
            Some("die") => {
                tracing::warn!(container = %container.id, "docker: the sandbox container died");
                container.die_reported.cancel();
                container.died.cancel();
                return;
            }
            _ => {}
        }
    }
}
