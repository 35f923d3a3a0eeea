//! Persistent capabilities: started once, supervised, and reached by clients through an
//! endpoint on the host that skillbox forwards into the sandbox. The sandbox keeps no
//! network of its own: each client connection is opened by the backend's
//! [`ExecConnector`] (into the exec's own network namespace, or beneath the workspace's
//! directory fd) and relayed.
//!
//! The table of services is kept per project under `<data>/services/<key>/`: for each
//! started name a record (`NAME.json`, what `cap status` shows), a lock (`NAME.lock`,
//! held by the process that supervises it for as long as the record is its own) and, by
//! default, the host endpoint (`NAME.sock`, a unix socket only the owner may open). A
//! crash marks the service `failed`, with how it ended and the tail of its stderr; it is
//! never restarted. Stopping it, or ending its supervisor (skillbox's own shutdown, or
//! a kill: the sandbox dies with the process that made it), ends everything it started;
//! a record whose lock nobody holds is shown for what it is, and records from an
//! earlier boot are dropped.

mod listen;
mod records;
mod supervise;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use skillbox_env::{CancellationToken, Endpoint, EnvError, ErrorCode, ExecRequest};
use skillbox_protocol::{ServiceInfo, ServiceState};
use skillbox_registry::BackendRegistry;
use tokio::sync::watch;

use crate::manifest::{Environment, Lifecycle};
use crate::registry::Capability;
use crate::trust::TrustStore;

pub use listen::Listen;
use listen::{BIND_EXTRA, HostListener, SUN_PATH_MAX, SocketGuard, bind_unix, remove_socket};
pub use records::{CAP_START, Owner, SERVE, services_dir};
use records::{NameLock, boot_id, now_ms, read_record, try_lock};
pub use supervise::MAX_CONNECTIONS;
use supervise::{READY_POLL, Service, Supervised, supervise};

/// How long a service may take to answer at its endpoint when its manifest gives no
/// `limits.timeout` (for a persistent capability, the timeout is the time to be ready).
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `stop` waits for another process's supervisor to let go.
const STOP_WAIT: Duration = Duration::from_secs(20);
/// The persistent capabilities of one project that this process started, and the
/// records of those other processes started.
#[derive(Debug)]
pub struct ServiceTable {
    dir: PathBuf,
    owner: Owner,
    services: Mutex<BTreeMap<String, Arc<Service>>>,
    bounds: ServiceBounds,
    /// The tenant of each start under way (counted with the running ones).
    starting: Mutex<Vec<Option<String>>>,
}

/// How many services one table runs at once: in all, and for one tenant.
#[derive(Debug, Clone, Copy)]
pub struct ServiceBounds {
    pub total: usize,
    pub per_tenant: usize,
}

impl Default for ServiceBounds {
    fn default() -> Self {
        ServiceBounds {
            total: 32,
            per_tenant: 8,
        }
    }
}

/// A place taken for a start; given back when the start ends, however it ends.
struct Reservation<'a> {
    table: &'a ServiceTable,
    tenant: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Ok(mut starting) = self.table.starting.lock()
            && let Some(at) = starting.iter().position(|t| *t == self.tenant)
        {
            starting.remove(at);
        }
    }
}

fn table_error(message: String) -> EnvError {
    EnvError::new(ErrorCode::Unknown, message)
}

impl ServiceTable {
    /// The table of `project`'s services under `data_dir`, as `owner`.
    pub fn new(data_dir: &Path, project: &Path, owner: Owner) -> ServiceTable {
        ServiceTable {
            dir: services_dir(data_dir, project),
            owner,
            services: Mutex::new(BTreeMap::new()),
            bounds: ServiceBounds::default(),
            starting: Mutex::new(Vec::new()),
        }
    }

    /// The same table, running at most `bounds` at once.
    pub fn with_bounds(mut self, bounds: ServiceBounds) -> ServiceTable {
        self.bounds = bounds;
        self
    }

    /// Takes a place for a start by `tenant`, or says why there is none.
    fn reserve(&self, tenant: Option<&str>) -> Result<Reservation<'_>, EnvError> {
        let running: Vec<Option<String>> = self
            .services
            .lock()
            .map(|services| {
                services
                    .values()
                    .map(|s| s.snapshot())
                    .filter(|i| matches!(i.state, ServiceState::Starting | ServiceState::Ready))
                    .map(|i| i.tenant)
                    .collect()
            })
            .unwrap_or_default();
        let mut starting = self
            .starting
            .lock()
            .map_err(|_| table_error("the table of starts is poisoned".into()))?;
        let all = running.len() + starting.len();
        let theirs = running
            .iter()
            .chain(starting.iter())
            .filter(|t| t.as_deref() == tenant)
            .count();
        if all >= self.bounds.total || theirs >= self.bounds.per_tenant {
            return Err(EnvError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "{} services run here ({theirs} of them yours): at most {} in all and {} each; stop one first",
                    all, self.bounds.total, self.bounds.per_tenant
                ),
            ));
        }
        starting.push(tenant.map(str::to_string));
        Ok(Reservation {
            table: self,
            tenant: tenant.map(str::to_string),
        })
    }

    /// Where this table keeps its records and sockets.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn ensure_dir(&self) -> Result<(), EnvError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| EnvError::io(&e, "create", &self.dir))
    }

    fn running(&self, name: &str) -> Option<Arc<Service>> {
        self.services
            .lock()
            .ok()
            .and_then(|services| services.get(name).cloned())
    }

    /// A service is named as its capability is: nothing else reaches a path here.
    fn check_name(name: &str) -> Result<(), EnvError> {
        let ok = !name.is_empty()
            && name.len() <= 63
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(())
        } else {
            Err(EnvError::invalid(format!(
                "service {name:?}: a service is named as its capability (a-z, 0-9 and -)"
            )))
        }
    }

    fn paths(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{name}.json")),
            self.dir.join(format!("{name}.lock")),
        )
    }

    /// The default host socket of `name`: `NAME.sock` here, or a shorter name when the
    /// path would not fit a socket address.
    fn default_socket(&self, name: &str) -> PathBuf {
        let named = self.dir.join(format!("{name}.sock"));
        if named.as_os_str().len() <= SUN_PATH_MAX
            && self.dir.as_os_str().len() + BIND_EXTRA <= SUN_PATH_MAX
        {
            return named;
        }
        let hash = skillbox_store::sha256_hex(name.as_bytes());
        self.dir.join(format!("{}.sock", &hash[..12]))
    }

    /// Starts `capability` (persistent) in `project` if trust allows it, and returns
    /// once something answers at its endpoint, or with why it never did (the service
    /// then stays in the table as `failed`).
    pub async fn start(
        &self,
        capability: &Capability,
        project: &Path,
        trust: &TrustStore,
        backends: &BackendRegistry,
        listen: Option<Listen>,
        tenant: Option<&str>,
    ) -> Result<ServiceInfo, EnvError> {
        let manifest = &capability.manifest;
        let name = capability.name().to_string();
        Self::check_name(&name)?;
        if manifest.lifecycle != Lifecycle::Persistent {
            return Err(EnvError::invalid(format!(
                "{name} is {}: run it with skillbox cap run {name}; only a persistent capability is started",
                manifest.lifecycle.as_str()
            )));
        }
        let serves = match (manifest.port, &manifest.socket) {
            (Some(port), _) => Endpoint::Port(port),
            (None, Some(socket)) => Endpoint::Socket(socket.clone()),
            (None, None) => {
                return Err(EnvError::invalid(format!(
                    "{}: a persistent capability gives port or socket",
                    capability.manifest_file().display()
                )));
            }
        };
        if !matches!(
            manifest.environment,
            Environment::Native | Environment::Docker | Environment::Gvisor
        ) {
            return Err(EnvError::new(
                ErrorCode::NotSupported,
                format!(
                    "{name}: a persistent {} capability cannot be started (persistent capabilities run on native, docker or gvisor); it is not started anywhere else",
                    manifest.environment
                ),
            ));
        }
        self.ensure_dir()?;
        let _reservation = self.reserve(tenant)?;
        let (record_path, lock_path) = self.paths(&name);
        let lock = match try_lock(&lock_path, true)? {
            Some(lock) => lock,
            None => {
                let held = read_record(&record_path);
                let message = match held {
                    Some(record) => format!(
                        "{name} is already {} under {}; stop it first: skillbox cap stop {name}",
                        record.info.state.as_str(),
                        record.owner
                    ),
                    None => format!("{name} is being started or stopped by another process"),
                };
                return Err(EnvError::new(ErrorCode::AlreadyExists, message));
            }
        };
        if self.running(&name).is_some() {
            return Err(EnvError::new(
                ErrorCode::AlreadyExists,
                format!("{name} is already started here; stop it first: skillbox cap stop {name}"),
            ));
        }
        // Worked out before the grant is checked: one that cannot start does not spend a
        // `once` grant.
        let mut spec = crate::router::sandbox_spec(capability, project, trust.data_dir())?;
        trust
            .authorize(capability, project)
            .await
            .map_err(|e| EnvError::new(e.code, e.message))?;

        let listen = listen.unwrap_or_else(|| Listen::Unix(self.default_socket(&name)));
        let (listener, socket) = match &listen {
            Listen::Unix(path) => {
                let listener = bind_unix(path)?;
                let listener = tokio::net::UnixListener::from_std(listener)
                    .map_err(|e| EnvError::io(&e, "listen", path))?;
                (HostListener::Unix(listener), Some(path.clone()))
            }
            Listen::Tcp(address) => {
                let listener = tokio::net::TcpListener::bind(address).await.map_err(|e| {
                    EnvError::new(
                        skillbox_env::errno_code(e.raw_os_error().unwrap_or(0)),
                        format!("listen on {address}: {e}"),
                    )
                })?;
                (HostListener::Tcp(listener), None)
            }
        };
        let endpoint = match &listener {
            HostListener::Tcp(l) => l
                .local_addr()
                .map(|a| Listen::Tcp(a).to_string())
                .unwrap_or_else(|_| listen.to_string()),
            HostListener::Unix(_) => listen.to_string(),
        };
        // Whatever ends this start before the supervisor has the socket removes it.
        let mut socket_guard = SocketGuard(socket.clone());

        let ready_within = manifest
            .bounds()
            .ok()
            .and_then(|b| b.timeout)
            .unwrap_or(DEFAULT_READY_TIMEOUT);
        // The service runs until stopped (at most the longest exec there is); its output
        // is streamed and only a tail kept, so nothing is cut off after a cap.
        spec.limits.timeout_ms = skillbox_env::MAX_TIMEOUT.as_millis() as u64;
        if let Endpoint::Port(port) = serves {
            spec.policy.listen_ports.push(port);
        }
        spec.limits.output_bytes = u64::MAX;
        let kind = manifest.environment;
        let env = match backends.create(kind, spec).await {
            Ok(env) => env,
            Err(e) => {
                return Err(e);
            }
        };
        let exec_cancel = CancellationToken::new();
        let mut request = ExecRequest::argv(crate::router::entry_argv(capability, kind))
            .cwd(skillbox_protocol::DEFAULT_WORKSPACE_ROOT)
            .timeout(skillbox_env::MAX_TIMEOUT);
        for variable in &manifest.env {
            if let Ok(value) = std::env::var(variable) {
                request = request.env(variable, value);
            }
        }
        let started = env.exec_stream(request, &exec_cancel).await;
        let (stream, connector) = match started {
            Ok(stream) => match stream.connector() {
                Some(connector) => (stream, connector),
                None => {
                    exec_cancel.cancel();
                    drop(stream);
                    let _ = env.cleanup().await;
                    return Err(EnvError::new(
                        ErrorCode::NotSupported,
                        format!("{name}: the {kind} backend cannot reach what an exec serves"),
                    ));
                }
            },
            Err(e) => {
                let _ = env.cleanup().await;
                return Err(e);
            }
        };
        let info = ServiceInfo {
            name: name.clone(),
            environment: kind,
            state: ServiceState::Starting,
            process: Some(connector.process()),
            owner: self.owner.to_string(),
            started_at_ms: now_ms(),
            endpoint,
            serves: match &serves {
                Endpoint::Port(port) => format!("port {port}"),
                Endpoint::Socket(path) => format!("socket {}", path.display()),
            },
            exit: None,
            error: None,
            stderr_tail: String::new(),
            tenant: tenant.map(str::to_string),
        };
        let (state, mut watch_state) = watch::channel(ServiceState::Starting);
        let (finished, _) = watch::channel(false);
        let service = Arc::new(Service {
            info: Mutex::new(info),
            state,
            stop: CancellationToken::new(),
            finished,
            record: record_path,
            socket,
            owner: self.owner.clone(),
            boot_id: boot_id(),
            lock: Mutex::new(Some(lock)),
        });
        service.update(|_| {});
        if let Ok(mut services) = self.services.lock() {
            services.insert(name.clone(), service.clone());
        }
        tracing::info!(service = %name, process = %connector.process(), "services: started");
        socket_guard.disarm();
        tokio::spawn(supervise(Supervised {
            service: service.clone(),
            env,
            stream,
            connector,
            listener,
            serves,
            ready_within,
            exec_cancel,
        }));
        // Ready, or ended before it was.
        let _ = watch_state
            .wait_for(|state| *state != ServiceState::Starting)
            .await;
        let info = service.snapshot();
        match info.state {
            ServiceState::Ready => Ok(info),
            _ => Err(EnvError::unavailable(format!(
                "{name} did not start: {}",
                describe_failure(&info)
            ))),
        }
    }

    /// Every service of this project: the ones this process supervises as they are now,
    /// and the records of other processes', each checked against its lock.
    pub fn list(&self) -> Vec<ServiceInfo> {
        let mut found: BTreeMap<String, ServiceInfo> = BTreeMap::new();
        if let Ok(services) = self.services.lock() {
            for (name, service) in services.iter() {
                found.insert(name.clone(), service.snapshot());
            }
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return found.into_values().collect();
        };
        let boot = boot_id();
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if found.contains_key(name) || Self::check_name(name).is_err() {
                continue;
            }
            if let Some(info) = self.inspect(name, &boot) {
                found.insert(name.to_string(), info);
            }
        }
        found.into_values().collect()
    }

    /// One service, as [`list`](Self::list) shows it (none for a name no service can
    /// have).
    pub fn status(&self, name: &str) -> Option<ServiceInfo> {
        Self::check_name(name).ok()?;
        if let Some(service) = self.running(name) {
            return Some(service.snapshot());
        }
        self.inspect(name, &boot_id())
    }

    /// A record another process wrote: as it says while its owner holds the lock;
    /// `failed` (supervisor gone) when nobody does; dropped when from an earlier boot.
    fn inspect(&self, name: &str, boot: &str) -> Option<ServiceInfo> {
        let (record_path, lock_path) = self.paths(name);
        let record = read_record(&record_path)?;
        let held = match try_lock(&lock_path, false) {
            Ok(Some(_free)) => false,
            Ok(None) => true,
            Err(_) => true,
        };
        if held {
            return Some(record.info);
        }
        if record.boot_id != boot {
            let _ = std::fs::remove_file(&record_path);
            if let Some(socket) = &record.socket {
                remove_socket(socket);
            }
            return None;
        }
        let mut info = record.info;
        if matches!(info.state, ServiceState::Starting | ServiceState::Ready) {
            info.state = ServiceState::Failed;
            info.error = Some(format!(
                "its supervisor, {}, ended without stopping it (its sandbox ended with it)",
                record.owner
            ));
        }
        Some(info)
    }

    /// Stops `name` and clears it from the table: a service this process supervises is
    /// ended here; one `skillbox cap start` supervises is sent SIGTERM and waited for; a
    /// record nobody holds (failed, or left by a supervisor that is gone) is removed.
    /// Returns the service as it was last seen.
    pub async fn stop(&self, name: &str) -> Result<ServiceInfo, EnvError> {
        Self::check_name(name)?;
        if let Some(info) = self.stop_own(name).await {
            return Ok(info);
        }
        let (record_path, lock_path) = self.paths(name);
        let Some(record) = read_record(&record_path) else {
            return Err(EnvError::new(
                ErrorCode::NotFound,
                format!(
                    "{name} is not started in this project (skillbox cap status lists what is)"
                ),
            ));
        };
        let seen = self
            .inspect(name, &boot_id())
            .unwrap_or(record.info.clone());
        let owner = record.owner.clone();
        let stopped_it = owner.alive() && try_lock(&lock_path, true)?.is_none();
        if stopped_it {
            if !owner.answers_sigterm() {
                return Err(EnvError::new(
                    ErrorCode::PermissionDenied,
                    format!(
                        "{name} is supervised by {owner}: stop it there (POST /v1/services/{name}/stop)"
                    ),
                ));
            }
            let lock_path = lock_path.clone();
            tokio::task::spawn_blocking(move || stop_supervisor(&owner, &lock_path))
                .await
                .map_err(|e| table_error(format!("stop {name}: {e}")))??;
        } else {
            // Its supervisor is gone; a reader may hold the lock for a moment.
            let lock_path = lock_path.clone();
            tokio::task::spawn_blocking(move || {
                wait_for_lock(&lock_path, Duration::from_secs(2)).map(drop)
            })
            .await
            .map_err(|e| table_error(format!("stop {name}: {e}")))??;
        }
        // Whoever held it is gone; what it left goes too. A supervisor that stopped it
        // wrote how it ended; one that was already gone left what `inspect` made of its
        // record (failed, and why).
        let last = if stopped_it {
            read_record(&record_path).map(|r| r.info).unwrap_or(seen)
        } else {
            seen
        };
        let _ = std::fs::remove_file(&record_path);
        if let Some(socket) = &record.socket {
            remove_socket(socket);
        }
        let mut last = last;
        if matches!(last.state, ServiceState::Starting | ServiceState::Ready) {
            // Stopped by us, or found without its supervisor (which `inspect` says).
            last.state = if stopped_it {
                ServiceState::Stopped
            } else {
                ServiceState::Failed
            };
        }
        Ok(last)
    }

    /// Removes the records of `command`'s services whose supervisor is gone: a server
    /// that starts again starts with an empty table (what the last one started died
    /// with it). Returns how many it removed.
    pub fn forget_dead(&self, command: &str) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut forgotten = 0;
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            let Some(name) = file_name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if Self::check_name(name).is_err() {
                continue;
            }
            let (record_path, lock_path) = self.paths(name);
            let Some(record) = read_record(&record_path) else {
                continue;
            };
            if record.owner.command != command {
                continue;
            }
            if let Ok(Some(_free)) = try_lock(&lock_path, true) {
                let _ = std::fs::remove_file(&record_path);
                if let Some(socket) = &record.socket {
                    remove_socket(socket);
                }
                forgotten += 1;
            }
        }
        forgotten
    }

    /// Stops `name` if this process supervises it, and clears it from the table;
    /// `None` when it does not (nothing is sent to anyone else).
    pub async fn stop_own(&self, name: &str) -> Option<ServiceInfo> {
        let service = self.running(name)?;
        service.stop.cancel();
        let mut finished = service.finished.subscribe();
        let _ = finished.wait_for(|done| *done).await;
        let info = service.snapshot();
        let _ = std::fs::remove_file(&service.record);
        if let Ok(mut services) = self.services.lock() {
            services.remove(name);
        }
        if let Ok(mut lock) = service.lock.lock() {
            lock.take();
        }
        Some(info)
    }

    /// Stops every service this process supervises (skillbox's own shutdown).
    pub async fn stop_all(&self) {
        let names: Vec<String> = self
            .services
            .lock()
            .map(|services| services.keys().cloned().collect())
            .unwrap_or_default();
        for name in names {
            if let Err(e) = self.stop(&name).await {
                tracing::warn!(service = %name, error = %e, "services: stop at shutdown failed");
            }
        }
    }

    /// Waits until `name`, supervised here, is no longer `starting` or `ready`.
    pub async fn ended(&self, name: &str) -> Option<ServiceInfo> {
        let service = self.running(name)?;
        let mut state = service.state.subscribe();
        let _ = state
            .wait_for(|s| matches!(s, ServiceState::Failed | ServiceState::Stopped))
            .await;
        let mut finished = service.finished.subscribe();
        let _ = finished.wait_for(|done| *done).await;
        Some(service.snapshot())
    }
}

/// Takes `lock_path`'s lock within `within`, polling; `timeout` if it stays held.
fn wait_for_lock(lock_path: &Path, within: Duration) -> Result<NameLock, EnvError> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(lock) = try_lock(lock_path, true)? {
            return Ok(lock);
        }
        if std::time::Instant::now() >= deadline {
            return Err(EnvError::new(
                ErrorCode::Timeout,
                format!(
                    "{} stayed locked for {} s",
                    lock_path.display(),
                    within.as_secs()
                ),
            ));
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Sends SIGTERM to `owner` (a `cap start` supervisor) through a pidfd opened while its
/// start time still matches, waits for it to let go of its lock, and kills it past
/// [`STOP_WAIT`].
fn stop_supervisor(owner: &Owner, lock_path: &Path) -> Result<(), EnvError> {
    let Some(pid) = rustix::process::Pid::from_raw(owner.pid as i32) else {
        return Err(table_error(format!("{owner}: not a pid")));
    };
    let pidfd = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
        Ok(fd) => fd,
        // Gone since it was checked.
        Err(rustix::io::Errno::SRCH) => return wait_for_lock(lock_path, STOP_WAIT).map(drop),
        Err(e) => return Err(EnvError::io(&e.into(), "pidfd_open", Path::new("/proc"))),
    };
    // The pidfd names one process for good: check it is still the owner, then signal.
    if !owner.alive() {
        return wait_for_lock(lock_path, STOP_WAIT).map(drop);
    }
    let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::TERM);
    match wait_for_lock(lock_path, STOP_WAIT) {
        Ok(_) => Ok(()),
        Err(_) => {
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
            wait_for_lock(lock_path, Duration::from_secs(5)).map(drop)?;
            Err(EnvError::new(
                ErrorCode::Timeout,
                format!(
                    "{owner} did not stop within {} s of SIGTERM and was killed",
                    STOP_WAIT.as_secs()
                ),
            ))
        }
    }
}

/// One line on why a service is not serving.
pub fn describe_failure(info: &ServiceInfo) -> String {
    let mut parts = Vec::new();
    if let Some(exit) = &info.exit {
        parts.push(match (exit.timed_out, exit.exit_code, exit.signal) {
            (true, _, _) => "its time ran out".to_string(),
            (_, Some(code), _) => format!("it exited with {code}"),
            (_, _, Some(signal)) => format!("it was killed by signal {signal}"),
            _ => "it ended".to_string(),
        });
        if let Some(limit) = exit.limit_hit {
            parts.push(format!("limit hit: {}", limit_name(limit)));
        }
    }
    if let Some(error) = &info.error {
        parts.push(error.clone());
    }
    if !info.stderr_tail.is_empty() {
        let last: Vec<&str> = info.stderr_tail.lines().rev().take(3).collect();
        let last: Vec<&str> = last.into_iter().rev().collect();
        parts.push(format!("stderr: {}", last.join(" | ")));
    }
    if parts.is_empty() {
        parts.push(info.state.as_str().to_string());
    }
    parts.join("; ")
}

fn limit_name(limit: skillbox_protocol::LimitKind) -> String {
    serde_json::to_value(limit)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::records::{Record, write_record};
    use super::supervise::{STDERR_TAIL, Tail};
    use super::*;

    #[test]
    fn listen_takes_unix_paths_and_loopback_only() {
        assert_eq!(
            "unix:/run/x.sock".parse::<Listen>(),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            "/run/x.sock".parse::<Listen>(),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            "127.0.0.1:8080".parse::<Listen>(),
            Ok(Listen::Tcp(
                "127.0.0.1:8080".parse().unwrap_or_else(|_| unreachable!())
            ))
        );
        assert!("tcp:[::1]:0".parse::<Listen>().is_ok());
        for bad in [
            "0.0.0.0:8080",
            "10.0.0.1:80",
            "unix:rel.sock",
            "x.sock",
            "localhost:80",
        ] {
            assert!(bad.parse::<Listen>().is_err(), "{bad}");
        }
        let long = format!("/{}", "a".repeat(200));
        assert!(long.parse::<Listen>().is_err());
    }

    fn record(name: &str, command: &str, boot: &str) -> Record {
        Record {
            info: ServiceInfo {
                name: name.into(),
                environment: skillbox_protocol::BackendKind::Native,
                state: ServiceState::Ready,
                process: Some("pid 4242".into()),
                owner: format!("{command} (pid 4241)"),
                started_at_ms: 1,
                endpoint: "unix:/nowhere.sock".into(),
                serves: "port 8080".into(),
                exit: None,
                error: None,
                stderr_tail: String::new(),
                tenant: None,
            },
            owner: Owner {
                pid: 4241,
                command: command.into(),
                started: 1,
            },
            boot_id: boot.into(),
            socket: None,
        }
    }

    #[test]
    fn records_without_a_supervisor_are_failed_and_a_new_server_forgets_its_own() {
        let data = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let table = ServiceTable::new(data.path(), Path::new("/p"), Owner::this_process(SERVE));
        table.ensure_dir().unwrap_or_else(|e| panic!("{e}"));
        let write = |name: &str, command: &str, boot: &str| {
            write_record(&table.paths(name).0, &record(name, command, boot))
                .unwrap_or_else(|e| panic!("{e}"));
        };
        write("from-serve", SERVE, &boot_id());
        write("from-cli", CAP_START, &boot_id());
        write("last-boot", CAP_START, "another boot");
        let listed = table.list();
        let names: Vec<&str> = listed.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(
            names,
            ["from-cli", "from-serve"],
            "an earlier boot's record is dropped"
        );
        for info in &listed {
            assert_eq!(info.state, ServiceState::Failed);
            assert!(
                info.error.as_deref().unwrap_or("").contains("supervisor"),
                "{info:?}"
            );
        }
        // A held lock: the owner is alive, and the record is what it says.
        let held = try_lock(&table.paths("from-cli").1, true)
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("free"));
        assert_eq!(
            table.status("from-cli").map(|i| i.state),
            Some(ServiceState::Ready)
        );
        drop(held);
        assert_eq!(table.forget_dead(SERVE), 1);
        let names: Vec<String> = table.list().into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["from-cli"]);
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let mut tail = Tail::default();
        for i in 0..2000 {
            tail.push(format!("line {i}\n").as_bytes());
        }
        let text = tail.text();
        assert!(text.len() <= STDERR_TAIL);
        assert!(text.starts_with("line "), "{text:.40}");
        assert!(text.ends_with("line 1999\n"));
    }
}
