//! Who said a capability may run. A grant covers one capability in one project: running
//! in its environment (`run_capability:<environment>`) and the permissions its manifest
//! declared when it was granted. It is `once` (used up by one run), `session` (held by
//! the process that serves the session) or `project` (kept in the data dir, per project
//! root). Each environment has a ceiling: `host` runs with no boundary and never rises
//! above `session`, however often it ran; a sandboxed environment may reach `project`.
//! A deny is kept like a project grant and wins over any grant: the most restrictive
//! rule decides.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use skillbox_protocol::ErrorCode;

use crate::manifest::{Environment, NETWORK_DENY};
use crate::registry::Capability;

/// How long a grant holds. Ordered: `Once < Session < Project`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Once,
    Session,
    Project,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Session => "session",
            Scope::Project => "project",
        }
    }
}

/// Whether a grant that covers `covers` holds for a manifest that needs `needs`: each
/// need was granted, and each `network.deny` entry the grant was given with is still
/// declared (dropping one lets the capability reach more than was granted).
fn holds(covers: &BTreeSet<String>, needs: &BTreeSet<String>) -> bool {
    needs
        .iter()
        .filter(|n| !n.starts_with(NETWORK_DENY))
        .all(|n| covers.contains(n))
        && covers
            .iter()
            .filter(|c| c.starts_with(NETWORK_DENY))
            .all(|c| needs.contains(c))
}

/// The widest grant an environment may have.
pub fn ceiling(environment: Environment) -> Scope {
    match environment {
        // No boundary: trusted for a session at most, never remembered.
        Environment::Host => Scope::Session,
        _ => Scope::Project,
    }
}

/// Where a capability stands in a project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Denied,
    /// Granted, with the widest grant that covers what it needs now.
    Granted(Scope),
    NotGranted,
}

impl Standing {
    pub fn describe(self) -> &'static str {
        match self {
            Standing::Denied => "denied",
            Standing::Granted(scope) => scope.as_str(),
            Standing::NotGranted => "not granted",
        }
    }
}

/// One grant (or deny) as it is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grant {
    pub capability: String,
    /// The project root it holds in (canonical).
    pub project: PathBuf,
    pub scope: Scope,
    /// What it covers: `run_capability:<environment>` and each permission.
    pub covers: BTreeSet<String>,
    pub granted_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Kept {
    #[serde(default)]
    grants: Vec<Grant>,
    /// (capability, project) pairs that may not run, whatever is granted.
    #[serde(default)]
    denied: Vec<(String, PathBuf)>,
}

/// Why a capability may not run, or a grant not be given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TrustError {
    pub code: ErrorCode,
    pub message: String,
}

fn denied(message: String) -> TrustError {
    TrustError {
        code: ErrorCode::PermissionDenied,
        message,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How long a change to the grants waits for another process's change to finish.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The grants of one data dir (project and once grants in `<data>/trust.json`) and of
/// this process (session grants).
#[derive(Debug)]
pub struct TrustStore {
    file: PathBuf,
    /// `<data>/trust.lock`: its `flock` is held across each read-modify-write of the
    /// file, so processes sharing the data dir (the CLI beside a server) take turns.
    lock: PathBuf,
    session: Mutex<Vec<Grant>>,
    /// Held across each read-modify-write of the file: two calls at once in one process
    /// (a server's requests) must not both use up one `once` grant, or lose a grant.
    kept: Mutex<()>,
}

/// The grants file to this caller, until it drops: this process's other callers wait on
/// the mutex, other processes on the lock file's `flock`.
struct Held<'a> {
    _turn: std::sync::MutexGuard<'a, ()>,
    _lock: std::fs::File,
}

impl TrustStore {
    pub fn open(data_dir: &Path) -> TrustStore {
        TrustStore {
            file: data_dir.join("trust.json"),
            lock: data_dir.join("trust.lock"),
            session: Mutex::new(Vec::new()),
            kept: Mutex::new(()),
        }
    }

    /// The file to itself, until the guard drops: read, change and write it under this.
    /// Another process's change takes milliseconds; one that holds the lock for
    /// [`LOCK_WAIT`] (stopped, say) makes this fail, naming the lock, rather than wait.
    fn hold(&self) -> Result<Held<'_>, TrustError> {
        use std::os::fd::AsFd;
        let turn = self
            .kept
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let failed = |e: std::io::Error| TrustError {
            code: ErrorCode::Unknown,
            message: format!("{}: {e}", self.lock.display()),
        };
        let lock = open_lock_file(&self.lock).map_err(failed)?;
        let deadline = std::time::Instant::now() + LOCK_WAIT;
        loop {
            match rustix::fs::flock(
                lock.as_fd(),
                rustix::fs::FlockOperation::NonBlockingLockExclusive,
            ) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                    if std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    return Err(TrustError {
                        code: ErrorCode::Unavailable,
                        message: format!(
                            "{}: another skillbox process has held it for {} s while changing the grants; try again (or end that process)",
                            self.lock.display(),
                            LOCK_WAIT.as_secs()
                        ),
                    });
                }
                Err(rustix::io::Errno::NOTSUP | rustix::io::Errno::NOLCK) => {
                    return Err(TrustError {
                        code: ErrorCode::Unavailable,
                        message: format!(
                            "{}: this file system takes no file locks (flock), which keep two processes from losing each other's grants; put the data dir (--data-dir) on a local file system",
                            self.lock.display()
                        ),
                    });
                }
                Err(e) => return Err(failed(e.into())),
            }
        }
        Ok(Held {
            _turn: turn,
            _lock: lock,
        })
    }

    fn read(&self) -> Result<Kept, TrustError> {
        match std::fs::read_to_string(&self.file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| TrustError {
                code: ErrorCode::Invalid,
                message: format!(
                    "{}: not a grants file ({e}); fix or remove it (every grant in it is lost)",
                    self.file.display()
                ),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kept::default()),
            Err(e) => Err(TrustError {
                code: ErrorCode::Unknown,
                message: format!("{}: {e}", self.file.display()),
            }),
        }
    }

    /// Writes through a temp file renamed into place, 0600: never half a grants file.
    fn write(&self, kept: &Kept) -> Result<(), TrustError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let failed = |e: std::io::Error| TrustError {
            code: ErrorCode::Unknown,
            message: format!("{}: {e}", self.file.display()),
        };
        let text =
            serde_json::to_string_pretty(kept).map_err(|e| failed(std::io::Error::other(e)))?;
        // Random, not only this process's pid: a process killed between this create
        // and the rename leaves its file, and a later one with its pid (a server that
        // is pid 1 of its container, restarted) would find it there on every write.
        let random = skillbox_protocol::random::hex(8).map_err(failed)?;
        let temp = self
            .file
            .with_extension(format!("tmp-{}-{random}", std::process::id()));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .map_err(failed)?;
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all());
        if let Err(e) = written.and_then(|()| std::fs::rename(&temp, &self.file)) {
            let _ = std::fs::remove_file(&temp);
            return Err(failed(e));
        }
        Ok(())
    }

    /// Grants `capability` in `project` for `scope`, covering what it needs now.
    /// The data dir the grants are kept in: no sandbox may ever write there.
    pub fn data_dir(&self) -> &Path {
        self.file.parent().unwrap_or(Path::new("/"))
    }

    pub fn grant(
        &self,
        capability: &Capability,
        scope: Scope,
        project: &Path,
    ) -> Result<Grant, TrustError> {
        let environment = capability.manifest.environment;
        if scope > ceiling(environment) {
            return Err(denied(format!(
                "{}: a {environment} capability can be granted for a {} at most ({} runs with no boundary); grant it --scope once or for a session",
                capability.name(),
                ceiling(environment).as_str(),
                environment
            )));
        }
        let grant = Grant {
            capability: capability.name().to_string(),
            project: project.to_path_buf(),
            scope,
            covers: capability.manifest.needs().into_iter().collect(),
            granted_ms: now_ms(),
        };
        if scope == Scope::Session {
            if let Ok(mut session) = self.session.lock() {
                session.push(grant.clone());
            }
            return Ok(grant);
        }
        let _held = self.hold()?;
        let mut kept = self.read()?;
        kept.grants.retain(|g| {
            !(g.capability == grant.capability && g.project == grant.project && g.scope == scope)
        });
        kept.grants.push(grant.clone());
        self.write(&kept)?;
        Ok(grant)
    }

    /// Removes every grant of `name` in `project`; returns how many went.
    pub fn revoke(&self, name: &str, project: &Path) -> Result<usize, TrustError> {
        let matches = |g: &Grant| g.capability == name && g.project == project;
        let mut count = 0;
        if let Ok(mut session) = self.session.lock() {
            let before = session.len();
            session.retain(|g| !matches(g));
            count += before - session.len();
        }
        let _held = self.hold()?;
        let mut kept = self.read()?;
        let before = kept.grants.len();
        kept.grants.retain(|g| !matches(g));
        let removed = before - kept.grants.len();
        if removed > 0 {
            self.write(&kept)?;
        }
        Ok(count + removed)
    }

    /// Denies `name` in `project`: no grant makes it run until [`TrustStore::allow`].
    pub fn deny(&self, name: &str, project: &Path) -> Result<(), TrustError> {
        let _held = self.hold()?;
        let mut kept = self.read()?;
        let pair = (name.to_string(), project.to_path_buf());
        if !kept.denied.contains(&pair) {
            kept.denied.push(pair);
            self.write(&kept)?;
        }
        Ok(())
    }

    /// Lifts a deny.
    pub fn allow(&self, name: &str, project: &Path) -> Result<(), TrustError> {
        let _held = self.hold()?;
        let mut kept = self.read()?;
        kept.denied.retain(|(n, p)| !(n == name && p == project));
        self.write(&kept)
    }

    /// The grants that hold in `project` (session ones first), and the denied names.
    pub fn list(&self, project: &Path) -> Result<(Vec<Grant>, Vec<String>), TrustError> {
        let mut grants: Vec<Grant> = self
            .session
            .lock()
            .map(|s| s.iter().filter(|g| g.project == project).cloned().collect())
            .unwrap_or_default();
        let kept = self.read()?;
        grants.extend(kept.grants.into_iter().filter(|g| g.project == project));
        let denied = kept
            .denied
            .into_iter()
            .filter(|(_, p)| p == project)
            .map(|(n, _)| n)
            .collect();
        Ok((grants, denied))
    }

    /// Where `capability` stands in `project`, without using up a `once` grant.
    pub fn standing(
        &self,
        capability: &Capability,
        project: &Path,
    ) -> Result<Standing, TrustError> {
        let (grants, denied) = self.list(project)?;
        if denied.iter().any(|d| d == capability.name()) {
            return Ok(Standing::Denied);
        }
        let needs: BTreeSet<String> = capability.manifest.needs().into_iter().collect();
        let ceiling = ceiling(capability.manifest.environment);
        Ok(grants
            .iter()
            .filter(|g| {
                g.capability == capability.name() && g.scope <= ceiling && holds(&g.covers, &needs)
            })
            .map(|g| g.scope)
            .max()
            .map_or(Standing::NotGranted, Standing::Granted))
    }

    /// Whether `capability` may run in `project` now, and under which grant. A `once`
    /// grant is used up by the answer. Without one, `permission_denied` names what is
    /// missing and the command that grants it.
    pub fn authorize(&self, capability: &Capability, project: &Path) -> Result<Scope, TrustError> {
        let name = capability.name();
        let needs: BTreeSet<String> = capability.manifest.needs().into_iter().collect();
        let environment = capability.manifest.environment;
        let _held = self.hold()?;
        let mut kept = self.read()?;
        if kept.denied.iter().any(|(n, p)| n == name && p == project) {
            return Err(denied(format!(
                "{name}: denied in {}; lift it with `skillbox cap allow {name}`",
                project.display()
            )));
        }
        // A grant above the ceiling (a hand-edited file) counts for nothing.
        let covers = |g: &Grant| {
            g.capability == name
                && g.project == project
                && g.scope <= ceiling(environment)
                && holds(&g.covers, &needs)
        };
        if let Ok(session) = self.session.lock()
            && session.iter().any(covers)
        {
            return Ok(Scope::Session);
        }
        if kept
            .grants
            .iter()
            .any(|g| covers(g) && g.scope == Scope::Project)
        {
            return Ok(Scope::Project);
        }
        if let Some(at) = kept
            .grants
            .iter()
            .position(|g| covers(g) && g.scope == Scope::Once)
        {
            kept.grants.remove(at);
            self.write(&kept)?;
            return Ok(Scope::Once);
        }
        // Granted before its manifest asked for more: say what is new.
        let granted: BTreeSet<String> = kept
            .grants
            .iter()
            .filter(|g| g.capability == name && g.project == project)
            .flat_map(|g| g.covers.iter().cloned())
            .collect();
        let dropped = granted
            .iter()
            .filter(|c| c.starts_with(NETWORK_DENY) && !needs.contains(*c))
            .map(|c| format!("{c} no longer declared"));
        let missing: Vec<String> = needs
            .iter()
            .filter(|n| !n.starts_with(NETWORK_DENY) && !granted.contains(*n))
            .cloned()
            .chain(dropped)
            .collect();
        let scope = match ceiling(environment) {
            Scope::Project => "project",
            _ => "once",
        };
        Err(denied(format!(
            "{name} is not granted in {}: it needs {}; grant it with `skillbox cap grant {name} --scope {scope}`",
            project.display(),
            missing.join(", ")
        )))
    }
}

/// A lock file (made 0600 if missing, never through a symlink, left as it is) to
/// `flock`: the grants' and each service name's.
pub(crate) fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}
