//! Snapshots of `/workspace`, keyed by scope: a run with a `scopeKey` starts from its
//! scope's last snapshot (installed packages, build outputs) and leaves a new one.
//!
//! A snapshot is content-addressed in the artifact store: every file's bytes under their
//! SHA-256, and a manifest (paths, kinds, modes, hashes) under its own, which is the
//! snapshot's id. The scope's list of snapshots is a table in `<data>/snapshots.sqlite`,
//! written only once every object is stored: a run killed while saving leaves the
//! previous snapshot as the latest. The last few are kept per scope; every object a
//! kept snapshot needs is listed, so store retention can spare it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use rusqlite::{Connection, OptionalExtension, params};
use serde::{Deserialize, Serialize};
use skillbox_env::{CancellationToken, ExecutionEnv, FileKind, FileRead, MAX_TREE_DEPTH, Tree};

use crate::error::StoreError;
use crate::records::{db_error, now_ms};
use crate::store::{ArtifactStore, sha256_hex};

/// Scopes one tenant keeps when nothing else is configured (`serve --tenant-max-scopes`).
pub const DEFAULT_SCOPES_PER_TENANT: usize = 16;

/// What one snapshot may hold.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotLimits {
    pub entries: usize,
    pub bytes: u64,
    /// Snapshots kept per scope (the latest first).
    pub keep: usize,
    /// Bytes read from the sandbox in one batch.
    pub batch_bytes: u64,
    /// Scopes one tenant keeps snapshots for: a save to a new scope past it is refused
    /// (each keeps `keep` snapshots of up to `bytes`).
    pub scopes_per_tenant: usize,
}

impl Default for SnapshotLimits {
    fn default() -> Self {
        SnapshotLimits {
            entries: 50_000,
            bytes: 512 * 1024 * 1024,
            keep: 3,
            batch_bytes: 64 * 1024 * 1024,
            scopes_per_tenant: DEFAULT_SCOPES_PER_TENANT,
        }
    }
}

/// One entry of a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum SnapshotEntry {
    Dir {
        path: String,
    },
    File {
        path: String,
        sha256: String,
        size: u64,
        executable: bool,
    },
}

impl SnapshotEntry {
    /// Its path, relative to the snapshot's root.
    pub fn path(&self) -> &str {
        match self {
            SnapshotEntry::Dir { path } | SnapshotEntry::File { path, .. } => path,
        }
    }
}

/// What a snapshot holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    pub entries: Vec<SnapshotEntry>,
    /// What was left out (a symlink, a special file), and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

/// How a save or a restore went (on a run's result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSummary {
    /// The manifest's SHA-256: the snapshot's id.
    pub id: String,
    pub files: usize,
    pub bytes: u64,
}

/// The scopes' snapshots, in SQLite.
#[derive(Debug, Clone)]
pub struct Snapshots {
    db: Arc<Mutex<Connection>>,
}

/// The key a scope is kept under: its tenant and its name, hashed.
pub fn scope_id(tenant: &str, scope: &str) -> String {
    sha256_hex(format!("{tenant}\0{scope}").as_bytes())
}

/// A scope key as a request gives it: 1..=128 printable ASCII characters.
pub fn check_scope_key(scope: &str) -> Result<(), String> {
    if scope.is_empty() || scope.len() > 128 || !scope.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "scopeKey {scope:?}: 1 to 128 printable ASCII characters, no spaces"
        ));
    }
    Ok(())
}

impl Snapshots {
    /// Opens (creating) `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                op: "create the snapshots dir",
                path: parent.display().to_string(),
                source,
            })?;
        }
        let db = Connection::open(path).map_err(db_error("open the snapshots"))?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS snapshots (
                 scope TEXT NOT NULL,
                 seq INTEGER NOT NULL,
                 manifest TEXT NOT NULL,
                 files INTEGER NOT NULL,
                 bytes INTEGER NOT NULL,
                 created_ms INTEGER NOT NULL,
                 PRIMARY KEY (scope, seq)
             );
             CREATE TABLE IF NOT EXISTS snapshot_objects (
                 manifest TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 PRIMARY KEY (manifest, sha256)
             );",
        )
        .map_err(db_error("create the snapshots tables"))?;
        // Whose scope a snapshot is, so a tenant's scopes can be counted (a table made
        // before that holds its rows under the tenant "").
        let has_tenant = db
            .prepare("SELECT 1 FROM pragma_table_info('snapshots') WHERE name = 'tenant'")
            .and_then(|mut query| query.exists([]))
            .map_err(db_error("read the snapshots table"))?;
        if !has_tenant {
            db.execute_batch("ALTER TABLE snapshots ADD COLUMN tenant TEXT NOT NULL DEFAULT ''")
                .map_err(db_error("add the snapshots' tenant"))?;
        }
        Ok(Snapshots {
            db: Arc::new(Mutex::new(db)),
        })
    }

    fn with<T>(
        &self,
        op: &str,
        f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let mut db = self.db.lock().map_err(|_| StoreError::Records {
            op: op.to_string(),
            detail: "lock poisoned".into(),
        })?;
        f(&mut db).map_err(db_error(op))
    }

    /// The scope's latest snapshot.
    pub fn latest(&self, scope: &str) -> Result<Option<SnapshotSummary>, StoreError> {
        self.with("read the latest snapshot", |db| {
            db.query_row(
                "SELECT manifest, files, bytes FROM snapshots WHERE scope = ?1 ORDER BY seq DESC LIMIT 1",
                params![scope],
                |row| {
                    Ok(SnapshotSummary {
                        id: row.get(0)?,
                        files: row.get::<_, i64>(1)? as usize,
                        bytes: row.get::<_, i64>(2)? as u64,
                    })
                },
            )
            .optional()
        })
    }

    /// Whether `tenant` may save a snapshot of `scope`: a scope it keeps already, or a
    /// new one while it keeps fewer than `max` scopes.
    fn may_save(&self, tenant: &str, scope: &str, max: usize) -> Result<(), StoreError> {
        let (known, scopes) = self.with("count the tenant's scopes", |db| {
            let known = db
                .prepare("SELECT 1 FROM snapshots WHERE scope = ?1 LIMIT 1")?
                .exists(params![scope])?;
            let scopes: i64 = db.query_row(
                "SELECT COUNT(DISTINCT scope) FROM snapshots WHERE tenant = ?1",
                params![tenant],
                |row| row.get(0),
            )?;
            Ok((known, scopes as usize))
        })?;
        if !known && scopes >= max {
            return Err(StoreError::TooManyScopes { max });
        }
        Ok(())
    }

    /// Forgets every scope whose latest snapshot is older than `max_age` (retention):
    /// its objects are then no longer kept. Returns how many scopes went.
    pub fn forget_unused(&self, max_age: std::time::Duration) -> Result<usize, StoreError> {
        let before = now_ms() - i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
        self.with("forget unused scopes", |db| {
            let tx = db.transaction()?;
            let unused = "SELECT scope FROM snapshots GROUP BY scope HAVING MAX(created_ms) < ?1";
            let scopes: i64 = tx.query_row(
                &format!("SELECT COUNT(*) FROM ({unused})"),
                params![before],
                |row| row.get(0),
            )?;
            tx.execute(
                &format!("DELETE FROM snapshots WHERE scope IN ({unused})"),
                params![before],
            )?;
            tx.execute(
                "DELETE FROM snapshot_objects WHERE manifest NOT IN (SELECT manifest FROM snapshots)",
                [],
            )?;
            tx.commit()?;
            Ok(scopes as usize)
        })
    }

    /// Makes `summary` (all of whose objects are stored) the scope's latest, in one
    /// transaction, and forgets all but its last `keep`.
    fn record(
        &self,
        tenant: &str,
        scope: &str,
        summary: &SnapshotSummary,
        objects: &HashSet<String>,
        keep: usize,
    ) -> Result<(), StoreError> {
        self.with("record a snapshot", |db| {
            let tx = db.transaction()?;
            let seq: i64 = tx.query_row(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM snapshots WHERE scope = ?1",
                params![scope],
                |row| row.get(0),
            )?;
            for sha in objects {
                tx.execute(
                    "INSERT OR IGNORE INTO snapshot_objects (manifest, sha256) VALUES (?1, ?2)",
                    params![summary.id, sha],
                )?;
            }
            tx.execute(
                "INSERT INTO snapshots (scope, seq, manifest, files, bytes, created_ms, tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    scope,
                    seq,
                    summary.id,
                    summary.files as i64,
                    summary.bytes as i64,
                    now_ms(),
                    tenant
                ],
            )?;
            tx.execute(
                "DELETE FROM snapshots WHERE scope = ?1 AND seq <= ?2",
                params![scope, seq - keep.max(1) as i64],
            )?;
            tx.execute(
                "DELETE FROM snapshot_objects WHERE manifest NOT IN (SELECT manifest FROM snapshots)",
                [],
            )?;
            tx.commit()
        })
    }

    /// Every object a kept snapshot needs (its manifest and its files): what store
    /// retention must not remove.
    pub fn referenced(&self) -> Result<HashSet<String>, StoreError> {
        self.with("list the snapshots' objects", |db| {
            let mut query = db.prepare(
                "SELECT manifest FROM snapshots UNION SELECT sha256 FROM snapshot_objects",
            )?;
            let rows = query.query_map([], |row| row.get::<_, String>(0))?;
            rows.collect()
        })
    }

    /// The number of snapshots kept for `scope`.
    pub fn count(&self, scope: &str) -> Result<usize, StoreError> {
        self.with("count snapshots", |db| {
            db.query_row(
                "SELECT COUNT(*) FROM snapshots WHERE scope = ?1",
                params![scope],
                |row| row.get::<_, i64>(0),
            )
            .map(|n| n as usize)
        })
    }
}

fn snapshot_error(message: String) -> StoreError {
    StoreError::Snapshot(message)
}

/// A path from a manifest: relative and plain, or refused (a manifest is ours, but the
/// store it lives in may be shared).
fn plain(path: &str) -> Result<PathBuf, StoreError> {
    let p = Path::new(path);
    if path.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_))) {
        return Err(snapshot_error(format!(
            "a snapshot names {path:?}, which is not a plain relative path"
        )));
    }
    Ok(p.to_path_buf())
}

/// Saves `root` of `env` as `scope`'s new latest snapshot, a scope of `tenant`'s.
/// Symlinks and special files are left out (and named); more than `limits` (a new
/// scope past the tenant's `scopes_per_tenant` too) is refused, and the latest stays.
/// Its objects count against the store's budget like any.
#[expect(
    clippy::too_many_arguments,
    reason = "where from, where to, whose and how much: each borrowed from the run"
)]
pub async fn save(
    env: &dyn ExecutionEnv,
    root: &Path,
    store: &ArtifactStore,
    snapshots: &Snapshots,
    tenant: &str,
    scope: &str,
    limits: SnapshotLimits,
    cancel: &CancellationToken,
) -> Result<SnapshotSummary, StoreError> {
    // Refused before anything is read or stored.
    snapshots.may_save(tenant, scope, limits.scopes_per_tenant)?;
    let walked = env
        .walk(root, &[crate::collect::SCRATCH_DIR], limits.entries, cancel)
        .await
        .map_err(|e| snapshot_error(format!("listing {}: {e}", root.display())))?;
    let mut manifest = Manifest {
        version: 1,
        ..Manifest::default()
    };
    let mut files: Vec<(String, u64, bool)> = Vec::new();
    let mut total = 0u64;
    for entry in walked {
        // A restore places the manifest as one tree, which holds no deeper path: refused
        // here, before anything is stored, it never becomes a snapshot to restore.
        let depth = entry.path.split('/').count();
        if depth > MAX_TREE_DEPTH {
            let start: Vec<&str> = entry.path.split('/').take(4).collect();
            return Err(snapshot_error(format!(
                "{}/{}/...: {depth} directories deep, more than the {MAX_TREE_DEPTH} a snapshot keeps: not saved (the previous snapshot stays the latest)",
                root.display(),
                start.join("/")
            )));
        }
        match entry.kind {
            FileKind::Dir => manifest
                .entries
                .push(SnapshotEntry::Dir { path: entry.path }),
            FileKind::File => {
                total += entry.size;
                if total > limits.bytes {
                    return Err(snapshot_error(format!(
                        "{} holds more than {} bytes: not saved (the previous snapshot stays the latest)",
                        root.display(),
                        limits.bytes
                    )));
                }
                files.push((entry.path, entry.size, entry.executable));
            }
            FileKind::Symlink | FileKind::Other => manifest
                .left_out
                .push(format!("{}: not a file or a directory", entry.path)),
        }
    }
    let mut objects = HashSet::new();
    let mut bytes = 0u64;
    let mut batch: Vec<(String, bool)> = Vec::new();
    let mut batch_bytes = 0u64;
    let mut pending = files.into_iter().peekable();
    while pending.peek().is_some() || !batch.is_empty() {
        if let Some((_, size, _)) = pending.peek()
            && (batch.is_empty() || batch_bytes + size <= limits.batch_bytes)
        {
            let Some((path, size, executable)) = pending.next() else {
                break;
            };
            batch_bytes += size;
            batch.push((path, executable));
            continue;
        }
        let paths: Vec<PathBuf> = batch.iter().map(|(p, _)| root.join(p)).collect();
        let read = env
            .read_files(&paths, limits.bytes, cancel)
            .await
            .map_err(|e| snapshot_error(format!("reading {}: {e}", root.display())))?;
        for ((path, executable), content) in batch.drain(..).zip(read) {
            match content {
                FileRead::Content(data) => {
                    bytes += data.len() as u64;
                    if bytes > limits.bytes {
                        return Err(snapshot_error(format!(
                            "{} holds more than {} bytes: not saved",
                            root.display(),
                            limits.bytes
                        )));
                    }
                    let size = data.len() as u64;
                    let sha256 = store.put_once(Bytes::from(data)).await?;
                    objects.insert(sha256.clone());
                    manifest.entries.push(SnapshotEntry::File {
                        path,
                        sha256,
                        size,
                        executable,
                    });
                }
                // Gone or changed kind since the listing: as if it were not there.
                FileRead::Missing | FileRead::NotFile => {
                    manifest
                        .left_out
                        .push(format!("{path}: changed while saved"));
                }
                FileRead::TooLarge(size) => {
                    return Err(snapshot_error(format!(
                        "{path}: {size} bytes, over the snapshot's {}",
                        limits.bytes
                    )));
                }
            }
        }
        batch_bytes = 0;
    }
    let body =
        serde_json::to_vec(&manifest).map_err(|e| snapshot_error(format!("the manifest: {e}")))?;
    let files = manifest
        .entries
        .iter()
        .filter(|e| matches!(e, SnapshotEntry::File { .. }))
        .count();
    let id = store.put_once(Bytes::from(body)).await?;
    let summary = SnapshotSummary { id, files, bytes };
    // Only now, with every object stored, does it become the latest.
    snapshots.record(tenant, scope, &summary, &objects, limits.keep)?;
    Ok(summary)
}

/// A snapshot placed back: which, and its files by path and SHA-256 (inputs of the run
/// that starts from it, so they come back only when it changes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub summary: SnapshotSummary,
    pub files: BTreeMap<PathBuf, String>,
}

/// Restores `scope`'s latest snapshot into `root` of `env` (placed as one tree over
/// what is there); `None` when the scope has none.
pub async fn restore(
    env: &dyn ExecutionEnv,
    root: &Path,
    store: &ArtifactStore,
    snapshots: &Snapshots,
    scope: &str,
    cancel: &CancellationToken,
) -> Result<Option<Restored>, StoreError> {
    let Some(latest) = snapshots.latest(scope)? else {
        return Ok(None);
    };
    let body = store.get(&latest.id).await?;
    let manifest: Manifest = serde_json::from_slice(&body)
        .map_err(|e| snapshot_error(format!("snapshot {}: {e}", latest.id)))?;
    let mut tree = Tree::new();
    let mut files = BTreeMap::new();
    let mut contents: BTreeMap<String, Bytes> = BTreeMap::new();
    // In path order (a save lists a level at a time), so each directory's entries come
    // together and the env places each directory once.
    let mut entries: Vec<&SnapshotEntry> = manifest.entries.iter().collect();
    entries.sort_by(|a, b| Path::new(a.path()).cmp(Path::new(b.path())));
    for entry in entries {
        match entry {
            SnapshotEntry::Dir { path } => tree.dir(plain(path)?),
            SnapshotEntry::File {
                path,
                sha256,
                executable,
                ..
            } => {
                let data = match contents.get(sha256) {
                    Some(data) => data.clone(),
                    None => {
                        let data = store.get(sha256).await?;
                        contents.insert(sha256.clone(), data.clone());
                        data
                    }
                };
                files.insert(plain(path)?, sha256.clone());
                tree.file(plain(path)?, data, *executable)
            }
        }
        .map_err(|e| snapshot_error(format!("snapshot {}: {e}", latest.id)))?;
    }
    env.put_tree(root, &tree, cancel)
        .await
        .map_err(|e| snapshot_error(format!("restoring into {}: {e}", root.display())))?;
    Ok(Some(Restored {
        summary: latest,
        files,
    }))
}
