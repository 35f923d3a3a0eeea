//! A service from start to end: its supervisor watches the output (a stderr tail),
//! readiness, the clients it relays into the sandbox, and how it ends; then cleans up.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skillbox_env::{
    CancellationToken, Duplex, Endpoint, EnvError, ErrorCode, ExecConnector, ExecEvent, ExecOutput,
    ExecStream, ExecutionEnv,
};
use skillbox_protocol::{ServiceExit, ServiceInfo, ServiceState};
use tokio::sync::{Semaphore, watch};

use super::listen::{HostListener, remove_socket};
use super::records::{NameLock, Owner, Record, write_record};

/// Clients connected to one service at once; more wait for a place.
pub const MAX_CONNECTIONS: usize = 256;
/// What is kept of a service's stderr.
pub(super) const STDERR_TAIL: usize = 4096;
/// How often readiness is checked while a service starts.
pub(super) const READY_POLL: Duration = Duration::from_millis(50);
/// The pause after a failed accept (no fd left, say), so a supervisor never spins.
pub(super) const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// The last bytes of a stream, cut at a line start when one is in reach.
#[derive(Debug, Default)]
pub(super) struct Tail(Vec<u8>);

impl Tail {
    pub(super) fn push(&mut self, chunk: &[u8]) {
        self.0.extend_from_slice(chunk);
        if self.0.len() > STDERR_TAIL {
            let cut = self.0.len() - STDERR_TAIL;
            let cut = self.0[cut..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(cut, |at| cut + at + 1);
            self.0.drain(..cut);
        }
    }

    pub(super) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

/// How a supervised service came to an end.
pub(super) enum Ending {
    Exited(ExecOutput),
    NotReady(Duration),
    Stopped,
    Broken(EnvError),
}

/// One service this process supervises.
#[derive(Debug)]
pub(super) struct Service {
    pub(super) info: Mutex<ServiceInfo>,
    pub(super) state: watch::Sender<ServiceState>,
    pub(super) stop: CancellationToken,
    /// Set once the supervisor has cleaned up everything.
    pub(super) finished: watch::Sender<bool>,
    pub(super) record: PathBuf,
    pub(super) socket: Option<PathBuf>,
    pub(super) owner: Owner,
    pub(super) boot_id: String,
    /// Held until the service is cleared from the table (a failed one keeps it).
    pub(super) lock: Mutex<Option<NameLock>>,
}

impl Service {
    pub(super) fn snapshot(&self) -> ServiceInfo {
        self.info
            .lock()
            .map(|info| info.clone())
            .unwrap_or_else(|poisoned| poisoned.into_inner().clone())
    }

    pub(super) fn update(&self, change: impl FnOnce(&mut ServiceInfo)) {
        let info = {
            let mut info = self
                .info
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            change(&mut info);
            info.clone()
        };
        self.state.send_replace(info.state);
        let record = Record {
            info,
            owner: self.owner.clone(),
            boot_id: self.boot_id.clone(),
            socket: self.socket.clone(),
        };
        if let Err(e) = write_record(&self.record, &record) {
            tracing::warn!(error = %e, "services: cannot write the record");
        }
    }
}

pub(super) struct Supervised {
    pub(super) service: Arc<Service>,
    pub(super) env: Box<dyn ExecutionEnv>,
    pub(super) stream: ExecStream,
    pub(super) connector: Arc<dyn ExecConnector>,
    pub(super) listener: HostListener,
    pub(super) serves: Endpoint,
    pub(super) ready_within: Duration,
    pub(super) exec_cancel: CancellationToken,
}

/// Watches one service from start to end: its output (a stderr tail), readiness, the
/// clients it is sent, and how it ends; then cleans up everything it started.
pub(super) async fn supervise(supervised: Supervised) {
    let Supervised {
        service,
        env,
        mut stream,
        connector,
        listener,
        serves,
        ready_within,
        exec_cancel,
    } = supervised;
    let relays_stop = CancellationToken::new();
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut tail = Tail::default();
    let ready_by = tokio::time::Instant::now() + ready_within;
    let mut ready = false;
    let mut poll = tokio::time::interval(READY_POLL);
    let mut accept_errors: u64 = 0;
    let ending = loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(ExecEvent::Stderr(chunk))) => tail.push(&chunk),
                Some(Ok(ExecEvent::Stdout(_))) => {}
                Some(Ok(ExecEvent::Exit(output))) => break Ending::Exited(output),
                Some(Err(e)) => break Ending::Broken(e),
                None => break Ending::Broken(EnvError::new(
                    ErrorCode::Unknown,
                    "the exec's stream ended without an exit status",
                )),
            },
            _ = poll.tick(), if !ready => {
                // A stop cuts the probe short; each connect is bounded by the backend.
                match connector.connect(&serves, &service.stop).await {
                    Ok(_) => {
                        ready = true;
                        service.update(|info| info.state = ServiceState::Ready);
                        tracing::info!(service = %service.snapshot().name, "services: ready");
                    }
                    Err(e) if tokio::time::Instant::now() >= ready_by => {
                        tracing::info!(error = %e, "services: not ready in time");
                        break Ending::NotReady(ready_within);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "services: not ready yet");
                        // The next try a period after this one ended, however long it
                        // took (a relay started in a container), not at once.
                        poll.reset();
                    }
                }
            }
            accepted = listener.accept(), if ready => match accepted {
                Ok(client) => {
                    let Ok(place) = places.clone().try_acquire_owned() else {
                        tracing::warn!("services: {MAX_CONNECTIONS} clients already; one refused");
                        continue;
                    };
                    tokio::spawn(relay(client, connector.clone(), serves.clone(), relays_stop.clone(), place));
                }
                Err(e) => {
                    // Out of fds, say: back off rather than spin, and say so now and then.
                    accept_errors += 1;
                    if accept_errors.is_power_of_two() {
                        tracing::warn!(error = %e, count = accept_errors, "services: accept failed");
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            () = service.stop.cancelled() => break Ending::Stopped,
        }
    };
    // Nothing new comes in; what runs is ended and cleaned up.
    drop(listener);
    if let Some(path) = &service.socket {
        remove_socket(path);
    }
    relays_stop.cancel();
    exec_cancel.cancel();
    while let Some(event) = stream.next().await {
        if let Ok(ExecEvent::Stderr(chunk)) = event {
            tail.push(&chunk);
        }
    }
    if let Err(e) = env.cleanup().await {
        tracing::warn!(error = %e, "services: sandbox cleanup failed");
    }
    let stderr_tail = tail.text();
    service.update(|info| {
        info.stderr_tail = stderr_tail;
        match ending {
            Ending::Stopped => info.state = ServiceState::Stopped,
            Ending::Exited(output) => {
                info.state = ServiceState::Failed;
                info.exit = Some(ServiceExit {
                    exit_code: output.exit_code,
                    signal: output.signal,
                    timed_out: output.timed_out,
                    limit_hit: output.limit_hit,
                });
                if !ready {
                    info.error = Some("it ended before anything answered at its endpoint".into());
                }
            }
            Ending::NotReady(within) => {
                info.state = ServiceState::Failed;
                info.error = Some(format!(
                    "nothing answered at {} within {} s (limits.timeout is the time a persistent capability has to be ready)",
                    info.serves,
                    within.as_secs()
                ));
            }
            Ending::Broken(e) => {
                info.state = ServiceState::Failed;
                info.error = Some(e.to_string());
            }
        }
    });
    tracing::info!(service = %service.snapshot().name, state = service.snapshot().state.as_str(), "services: ended");
    service.finished.send_replace(true);
}

/// One client, relayed to a new connection into the sandbox until either side closes.
pub(super) async fn relay(
    mut client: Box<dyn Duplex>,
    connector: Arc<dyn ExecConnector>,
    serves: Endpoint,
    stop: CancellationToken,
    _place: tokio::sync::OwnedSemaphorePermit,
) {
    let mut upstream = match connector.connect(&serves, &stop).await {
        Ok(upstream) => upstream,
        Err(e) => {
            tracing::warn!(error = %e, "services: a client could not be forwarded");
            return;
        }
    };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {
            if let Err(e) = copied {
                tracing::debug!(error = %e, "services: a relay ended");
            }
        }
        () = stop.cancelled() => {}
    }
}
