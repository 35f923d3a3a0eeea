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

fn denied_error(message: String) -> TrustError {
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

/// The grants a process decides by: project and once grants kept in the data dir
/// (`<data>/trust.json`) or in the records database servers share, and session grants
/// held by this process.
#[derive(Debug)]
pub struct TrustStore {
    data_dir: PathBuf,
    kept: Keeper,
    session: Mutex<Vec<Grant>>,
}

/// Where project and once grants are kept.
#[derive(Debug)]
enum Keeper {
    File(GrantsFile),
    /// The tables of a records database (`serve --db`, `cap --db`): every node of it
    /// decides by the same grants, and a `once` grant is used up by one run of all.
    Records(skillbox_store::GrantRecords),
}

/// `<data>/trust.json`, changed under `<data>/trust.lock`.
#[derive(Debug)]
struct GrantsFile {
    file: PathBuf,
    /// `<data>/trust.lock`: its `flock` is held across each read-modify-write of the
    /// file, so processes sharing the data dir (the CLI beside a server) take turns.
    lock: PathBuf,
    /// Held across each read-modify-write of the file: two calls at once in one process
    /// (a server's requests) must not both use up one `once` grant, or lose a grant.
    kept: Mutex<()>,
}

/// The file to this caller, until it drops: this process's other callers wait on
/// the mutex, other processes on the lock file's `flock`.
struct Held<'a> {
    _turn: std::sync::MutexGuard<'a, ()>,
    _lock: std::fs::File,
}

/// What [`decide`] found lets a capability run.
enum Decision {
    Session,
    Project,
    /// The `once` grant at this index of the kept grants, to be used up.
    Once(usize),
}

/// How often a `once` grant another node used up first is looked for again.
const ONCE_RACES: usize = 8;

fn store_failed(e: skillbox_store::StoreError) -> TrustError {
    TrustError {
        code: e.code(),
        message: format!("capability grants: {e}"),
    }
}

/// A project root as the records database keeps it: its path, which must be UTF-8.
fn project_key(project: &Path) -> Result<&str, TrustError> {
    project.to_str().ok_or_else(|| TrustError {
        code: ErrorCode::Invalid,
        message: format!(
            "{}: a project whose path is not UTF-8 cannot have grants in a database",
            project.display()
        ),
    })
}

impl GrantsFile {
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

    /// Reads the file, changes it with `change` and writes it back when `change` says
    /// so, all under the lock: what `change` returns is the answer.
    fn change<T>(
        &self,
        change: impl FnOnce(&mut Kept) -> Result<(T, bool), TrustError>,
    ) -> Result<T, TrustError> {
        crate::router::off_the_runtime(|| {
            let _held = self.hold()?;
            let mut kept = self.read()?;
            let (answer, changed) = change(&mut kept)?;
            if changed {
                self.write(&kept)?;
            }
            Ok(answer)
        })
    }
}

impl Kept {
    /// The grants and denied names of one project.
    fn of(self, project: &Path) -> (Vec<Grant>, Vec<String>) {
        let grants = self
            .grants
            .into_iter()
            .filter(|g| g.project == project)
            .collect();
        let denied = self
            .denied
            .into_iter()
            .filter(|(_, p)| p == project)
            .map(|(n, _)| n)
            .collect();
        (grants, denied)
    }
}

/// Whether `capability` may run in `project` by `session`'s and `kept`'s grants (the
/// project's own) unless `denied` names it; without a grant, `permission_denied` names
/// what is missing and the command that grants it. One rule for the file and for the
/// database.
fn decide(
    capability: &Capability,
    project: &Path,
    session: &[Grant],
    kept: &[Grant],
    denied: &[String],
) -> Result<Decision, TrustError> {
    let name = capability.name();
    let needs: BTreeSet<String> = capability.manifest.needs().into_iter().collect();
    let environment = capability.manifest.environment;
    if denied.iter().any(|n| n == name) {
        return Err(denied_error(format!(
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
    if session.iter().any(covers) {
        return Ok(Decision::Session);
    }
    if kept.iter().any(|g| covers(g) && g.scope == Scope::Project) {
        return Ok(Decision::Project);
    }
    if let Some(at) = kept
        .iter()
        .position(|g| covers(g) && g.scope == Scope::Once)
    {
        return Ok(Decision::Once(at));
    }
    // Granted before its manifest asked for more: say what is new.
    let granted: BTreeSet<String> = kept
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
    Err(denied_error(format!(
        "{name} is not granted in {}: it needs {}; grant it with `skillbox cap grant {name} --scope {scope}`",
        project.display(),
        missing.join(", ")
    )))
}

impl TrustStore {
    /// Grants kept in `<data_dir>/trust.json`.
    pub fn open(data_dir: &Path) -> TrustStore {
        TrustStore {
            data_dir: data_dir.to_path_buf(),
            kept: Keeper::File(GrantsFile {
                file: data_dir.join("trust.json"),
                lock: data_dir.join("trust.lock"),
                kept: Mutex::new(()),
            }),
            session: Mutex::new(Vec::new()),
        }
    }

    /// Grants kept in a records database (`data_dir` is still this process's, where no
    /// sandbox may write).
    pub fn in_records(data_dir: &Path, grants: skillbox_store::GrantRecords) -> TrustStore {
        TrustStore {
            data_dir: data_dir.to_path_buf(),
            kept: Keeper::Records(grants),
            session: Mutex::new(Vec::new()),
        }
    }

    /// The data dir of this process: no sandbox may ever write there.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn session(&self) -> std::sync::MutexGuard<'_, Vec<Grant>> {
        self.session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Grants `capability` in `project` for `scope`, covering what it needs now.
    pub async fn grant(
        &self,
        capability: &Capability,
        scope: Scope,
        project: &Path,
    ) -> Result<Grant, TrustError> {
        let environment = capability.manifest.environment;
        if scope > ceiling(environment) {
            return Err(denied_error(format!(
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
            self.session().push(grant.clone());
            return Ok(grant);
        }
        match &self.kept {
            Keeper::File(file) => file.change(|kept| {
                kept.grants.retain(|g| {
                    !(g.capability == grant.capability
                        && g.project == grant.project
                        && g.scope == scope)
                });
                kept.grants.push(grant.clone());
                Ok(((), true))
            })?,
            Keeper::Records(records) => {
                let covers: Vec<String> = grant.covers.iter().cloned().collect();
                records
                    .put(
                        &grant.capability,
                        project_key(project)?,
                        scope.as_str(),
                        &covers,
                        i64::try_from(grant.granted_ms).unwrap_or(i64::MAX),
                    )
                    .await
                    .map_err(store_failed)?;
            }
        }
        Ok(grant)
    }

    /// Removes every grant of `name` in `project`; returns how many went.
    pub async fn revoke(&self, name: &str, project: &Path) -> Result<usize, TrustError> {
        let matches = |g: &Grant| g.capability == name && g.project == project;
        let count = {
            let mut session = self.session();
            let before = session.len();
            session.retain(|g| !matches(g));
            before - session.len()
        };
        let removed = match &self.kept {
            Keeper::File(file) => file.change(|kept| {
                let before = kept.grants.len();
                kept.grants.retain(|g| !matches(g));
                let removed = before - kept.grants.len();
                Ok((removed, removed > 0))
            })?,
            Keeper::Records(records) => records
                .remove(name, project_key(project)?)
                .await
                .map_err(store_failed)? as usize,
        };
        Ok(count + removed)
    }

    /// Denies `name` in `project`: no grant makes it run until [`TrustStore::allow`].
    pub async fn deny(&self, name: &str, project: &Path) -> Result<(), TrustError> {
        match &self.kept {
            Keeper::File(file) => file.change(|kept| {
                let pair = (name.to_string(), project.to_path_buf());
                let new = !kept.denied.contains(&pair);
                if new {
                    kept.denied.push(pair);
                }
                Ok(((), new))
            }),
            Keeper::Records(records) => records
                .deny(name, project_key(project)?)
                .await
                .map_err(store_failed),
        }
    }

    /// Lifts a deny.
    pub async fn allow(&self, name: &str, project: &Path) -> Result<(), TrustError> {
        match &self.kept {
            Keeper::File(file) => file.change(|kept| {
                kept.denied.retain(|(n, p)| !(n == name && p == project));
                Ok(((), true))
            }),
            Keeper::Records(records) => records
                .allow(name, project_key(project)?)
                .await
                .map_err(store_failed),
        }
    }

    /// The kept grants of `project` (each with its row's id in a database) and the
    /// names denied there.
    async fn kept(&self, project: &Path) -> Result<(Vec<(Grant, i64)>, Vec<String>), TrustError> {
        match &self.kept {
            Keeper::File(file) => {
                let kept = crate::router::off_the_runtime(|| file.read())?;
                let (grants, denied) = kept.of(project);
                Ok((grants.into_iter().map(|g| (g, 0)).collect(), denied))
            }
            Keeper::Records(records) => {
                let (rows, denied) = records
                    .list(project_key(project)?)
                    .await
                    .map_err(store_failed)?;
                let grants = rows
                    .into_iter()
                    .filter_map(|row| {
                        let scope = match row.scope.as_str() {
                            "once" => Scope::Once,
                            "project" => Scope::Project,
                            // A scope this build does not know grants nothing.
                            _ => return None,
                        };
                        let grant = Grant {
                            capability: row.capability,
                            project: PathBuf::from(row.project),
                            scope,
                            covers: row.covers.into_iter().collect(),
                            granted_ms: u64::try_from(row.granted_ms).unwrap_or(0),
                        };
                        Some((grant, row.id))
                    })
                    .collect();
                Ok((grants, denied))
            }
        }
    }

    /// The grants that hold in `project` (session ones first), and the denied names.
    pub async fn list(&self, project: &Path) -> Result<(Vec<Grant>, Vec<String>), TrustError> {
        let mut grants: Vec<Grant> = self
            .session()
            .iter()
            .filter(|g| g.project == project)
            .cloned()
            .collect();
        let (kept, denied) = self.kept(project).await?;
        grants.extend(kept.into_iter().map(|(g, _)| g));
        Ok((grants, denied))
    }

    /// Where `capability` stands in `project`, without using up a `once` grant.
    pub async fn standing(
        &self,
        capability: &Capability,
        project: &Path,
    ) -> Result<Standing, TrustError> {
        let (grants, denied) = self.list(project).await?;
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
    /// grant is used up by the answer, by one caller of all: in the file under its
    /// lock, in a database by removing its row, which only one node's removal does.
    /// Without one, `permission_denied` names what is missing and the command that
    /// grants it.
    pub async fn authorize(
        &self,
        capability: &Capability,
        project: &Path,
    ) -> Result<Scope, TrustError> {
        let session = self.session().clone();
        match &self.kept {
            Keeper::File(file) => file.change(|kept| {
                let (grants, denied) = kept.clone().of(project);
                match decide(capability, project, &session, &grants, &denied)? {
                    Decision::Session => Ok((Scope::Session, false)),
                    Decision::Project => Ok((Scope::Project, false)),
                    Decision::Once(at) => {
                        let used = &grants[at];
                        if let Some(i) = kept.grants.iter().position(|g| g == used) {
                            kept.grants.remove(i);
                        }
                        Ok((Scope::Once, true))
                    }
                }
            }),
            Keeper::Records(records) => {
                for _ in 0..ONCE_RACES {
                    let (kept, denied) = self.kept(project).await?;
                    let grants: Vec<Grant> = kept.iter().map(|(g, _)| g.clone()).collect();
                    match decide(capability, project, &session, &grants, &denied)? {
                        Decision::Session => return Ok(Scope::Session),
                        Decision::Project => return Ok(Scope::Project),
                        Decision::Once(at) => {
                            if records.use_up(kept[at].1).await.map_err(store_failed)? {
                                return Ok(Scope::Once);
                            }
                            // Another node's run used it first: look again.
                        }
                    }
                }
                Err(TrustError {
                    code: ErrorCode::Unavailable,
                    message: format!(
                        "{}: its once grants were used up by other runs at the same time {ONCE_RACES} times over; try again",
                        capability.name()
                    ),
                })
            }
        }
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
