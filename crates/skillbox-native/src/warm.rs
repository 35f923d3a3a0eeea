//! Sandboxes made ahead of the runs that take them (`NativeBackend::with_warm`): each
//! is created for the shape the last run asked for (its limits and policy, with no
//! caller's workspace and no egress) and has its first exec's init already started,
//! locked down and in its cgroup ([`NativeSandbox::prepare_exec`]), so a run that takes
//! one pays only for its command.
//!
//! Every sandbox is handed out once and never comes back; a place is refilled as soon
//! as it is taken. A run of another shape makes the pool start over for that shape.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use skillbox_env::{EnvResult, Limits, SandboxPolicy, SandboxSpec, WorkspaceRoot};

use crate::sandbox::NativeSandbox;

/// How long a drain waits for the sandboxes being made (each takes milliseconds).
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What a pooled sandbox was made for: two specs of one shape make the same sandbox
/// (the timeout is not part of it: it is the exec's, given when one is handed out).
#[derive(Debug, Clone, PartialEq)]
struct Shape {
    root: WorkspaceRoot,
    limits: Limits,
    policy: SandboxPolicy,
}

impl Shape {
    /// The shape of `spec`, if sandboxes of it can be made ahead: a temp workspace (a
    /// caller's directory is the caller's) and no egress (a proxy and its secrets are
    /// the run's own).
    fn of(spec: &SandboxSpec) -> Option<Shape> {
        let own = spec.workspace.is_none()
            && spec.policy.network.is_none()
            && spec.policy.secrets.is_empty();
        own.then(|| Shape {
            root: spec.root.clone(),
            limits: Limits {
                timeout_ms: 0,
                ..spec.limits.clone()
            },
            policy: spec.policy.clone(),
        })
    }

    /// A spec of this shape to make a sandbox from (the default timeout: the one it
    /// is handed out for sets its own).
    fn spec(&self) -> SandboxSpec {
        SandboxSpec {
            workspace: None,
            root: self.root.clone(),
            limits: Limits {
                timeout_ms: Limits::default().timeout_ms,
                ..self.limits.clone()
            },
            policy: self.policy.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct State {
    shape: Option<Shape>,
    /// Counts the shapes the pool was filled for: a fill of an older one stops.
    generation: u64,
    ready: Vec<NativeSandbox>,
    /// Sandboxes being made for `shape`.
    filling: usize,
    /// Drained for good: nothing is made or handed out any more.
    closed: bool,
}

/// The pool; shared by every clone of its backend.
#[derive(Debug)]
pub(crate) struct Warm {
    size: usize,
    state: Mutex<State>,
    /// The fills running: a drain waits for them.
    fills: tokio_util::task::TaskTracker,
    /// Creates that got a sandbox made ahead.
    taken: AtomicU64,
    /// Creates of a shape the pool makes that found none ready (made on the spot).
    missed: AtomicU64,
}

/// What a pool has done: for `/metrics`, and to tell whether it serves the runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmStats {
    /// Sandboxes ready now.
    pub ready: usize,
    /// Creates served by a sandbox made ahead.
    pub taken: u64,
    /// Creates of a shape the pool makes that found none ready.
    pub missed: u64,
}

/// How a pooled sandbox is made: the backend's own create.
pub(crate) type Make = Arc<
    dyn Fn(SandboxSpec) -> Pin<Box<dyn Future<Output = EnvResult<NativeSandbox>> + Send>>
        + Send
        + Sync,
>;

impl Warm {
    pub(crate) fn new(size: usize) -> Arc<Warm> {
        Arc::new(Warm {
            size,
            state: Mutex::new(State::default()),
            fills: tokio_util::task::TaskTracker::new(),
            taken: AtomicU64::new(0),
            missed: AtomicU64::new(0),
        })
    }

    /// A sandbox made ahead for `spec`'s shape, if one is ready. Either way the pool
    /// then fills up for that shape (dropping any made for another).
    pub(crate) fn take(self: &Arc<Self>, spec: &SandboxSpec, make: &Make) -> Option<NativeSandbox> {
        let mut taken = self.made_for(spec, make, true)?;
        taken.limits = spec.limits.clone();
        Some(taken)
    }

    /// Starts filling the pool for `spec`'s shape (dropping any made for another).
    pub(crate) fn prime(self: &Arc<Self>, spec: &SandboxSpec, make: &Make) {
        drop(self.made_for(spec, make, false));
    }

    fn made_for(
        self: &Arc<Self>,
        spec: &SandboxSpec,
        make: &Make,
        take: bool,
    ) -> Option<NativeSandbox> {
        let shape = Shape::of(spec)?;
        let (taken, stale, generation) = {
            let mut state = self.state.lock().ok()?;
            if state.closed {
                return None;
            }
            let stale = if state.shape.as_ref() != Some(&shape) {
                state.shape = Some(shape.clone());
                state.generation += 1;
                state.filling = 0;
                std::mem::take(&mut state.ready)
            } else {
                Vec::new()
            };
            let taken = if take { state.ready.pop() } else { None };
            if take {
                let counter = if taken.is_some() {
                    &self.taken
                } else {
                    &self.missed
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            (taken, stale, state.generation)
        };
        // Made for another shape: dropped (each kills its prepared init).
        drop(stale);
        self.fill(shape, generation, make);
        taken
    }

    pub(crate) fn stats(&self) -> WarmStats {
        WarmStats {
            ready: self.state.lock().map_or(0, |state| state.ready.len()),
            taken: self.taken.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
        }
    }

    /// Claims a place to fill for `generation`, if the pool still wants one.
    fn claim(&self, generation: u64) -> bool {
        let Ok(mut state) = self.state.lock() else {
            return false;
        };
        let wanted = !state.closed
            && state.generation == generation
            && state.ready.len() + state.filling < self.size;
        if wanted {
            state.filling += 1;
        }
        wanted
    }

    /// Makes sandboxes of `shape` until the pool is full, one at a time, in the
    /// background.
    fn fill(self: &Arc<Self>, shape: Shape, generation: u64, make: &Make) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Held from before the claim: a drain between the claim and the spawn still
        // waits for this fill.
        let token = self.fills.token();
        if !self.claim(generation) {
            return;
        }
        let (warm, make) = (self.clone(), make.clone());
        runtime.spawn(async move {
            let _token = token;
            loop {
                let made = match make(shape.spec()).await {
                    Ok(sandbox) => match sandbox.prepare_exec().await {
                        Ok(()) => Some(sandbox),
                        Err(e) => {
                            tracing::warn!(error = %e, "native: cannot prepare a pooled sandbox's exec");
                            None
                        }
                    },
                    Err(e) => {
                        tracing::warn!(error = %e, "native: cannot make a pooled sandbox");
                        None
                    }
                };
                let unwanted = {
                    let Ok(mut state) = warm.state.lock() else {
                        return;
                    };
                    if state.closed || state.generation != generation {
                        made
                    } else {
                        state.filling = state.filling.saturating_sub(1);
                        match made {
                            Some(sandbox) => state.ready.push(sandbox),
                            // Failed: stop here; the next take tries again.
                            None => return,
                        }
                        None
                    }
                };
                // Made for a shape no longer wanted (or a closed pool): cleaned up here,
                // where a drain waits for it.
                if let Some(sandbox) = unwanted {
                    use skillbox_env::FileSystem;
                    if let Err(e) = sandbox.cleanup().await {
                        tracing::warn!(error = %e, "native: cleaning up an unwanted pooled sandbox");
                    }
                    return;
                }
                if !warm.claim(generation) {
                    return;
                }
            }
        });
    }

    /// Hands back every ready sandbox and makes no more, for good (a server
    /// stopping): later takes get none. Returns once the fills still running have
    /// cleaned up what they made.
    pub(crate) async fn drain(&self) -> Vec<NativeSandbox> {
        let ready = match self.state.lock() {
            Ok(mut state) => {
                state.closed = true;
                state.shape = None;
                std::mem::take(&mut state.ready)
            }
            Err(_) => Vec::new(),
        };
        self.fills.close();
        if tokio::time::timeout(DRAIN_WAIT, self.fills.wait())
            .await
            .is_err()
        {
            tracing::warn!("native: pooled sandboxes still being made after {DRAIN_WAIT:?}");
        }
        ready
    }
}
