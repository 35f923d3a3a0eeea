//! Snapshots of `/workspace`, keyed by scope: a run with a `scopeKey` starts from its
//! scope's last snapshot (installed packages, build outputs) and leaves a new one.
//!
//! A snapshot is content-addressed in the artifact store: every file's bytes under their
//! SHA-256, and a manifest (paths, kinds, modes, hashes) under its own, which is the
//! snapshot's id. The scope's list of snapshots is a table in `<data>/snapshots.sqlite`
//! (or in the shared database),
//! written only once every object is stored: a run killed while saving leaves the
//! previous snapshot as the latest. The last few are kept per scope; every object a
//! kept snapshot needs is listed, so store retention can spare it.

use std::collections::{BTreeMap, HashSet};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use skillbox_env::{CancellationToken, ExecutionEnv, FileKind, FileRead, MAX_TREE_DEPTH, Tree};

use crate::db::{Db, Migration, RecordsDb, Schema, Statement, Step, params};
use crate::error::StoreError;
use crate::records::now_ms;
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

/// The scopes' snapshots, in the records' database.
#[derive(Debug, Clone)]
pub struct Snapshots {
    db: Db,
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "snapshots",
    sqlite: &[Migration {
        version: 1,
        steps: &[
            Step::Sql(
                "CREATE TABLE IF NOT EXISTS snapshots (
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
            ),
            // Whose scope a snapshot is, so a tenant's scopes can be counted (a table
            // made before that holds its rows under the tenant "").
            Step::AddColumn {
                table: "snapshots",
                column: "tenant",
                decl: "tenant TEXT NOT NULL DEFAULT ''",
            },
        ],
    }],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE snapshots (
                 scope TEXT NOT NULL,
                 seq BIGINT NOT NULL,
                 manifest TEXT NOT NULL,
                 files BIGINT NOT NULL,
                 bytes BIGINT NOT NULL,
                 created_ms BIGINT NOT NULL,
                 tenant TEXT NOT NULL,
                 PRIMARY KEY (scope, seq)
             );
             CREATE INDEX snapshots_by_tenant ON snapshots (tenant);
             CREATE TABLE snapshot_objects (
                 manifest TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 PRIMARY KEY (manifest, sha256)
             );",
        )],
    }],
};

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
    /// Opens (creating) `<data>/snapshots.sqlite`, or the shared database's tables.
    pub fn open(at: &RecordsDb) -> Result<Self, StoreError> {
        let db = at.open(
            "snapshots.sqlite",
            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;",
            &SCHEMA,
        )?;
        Ok(Snapshots { db })
    }

    /// The scope's latest snapshot.
    pub async fn latest(&self, scope: &str) -> Result<Option<SnapshotSummary>, StoreError> {
        let Some(row) = self
            .db
            .query_one(
                "read the latest snapshot",
                "SELECT manifest, files, bytes FROM snapshots WHERE scope = ?1
                 ORDER BY seq DESC LIMIT 1",
                params![scope],
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(SnapshotSummary {
            id: row.text(0)?,
            files: row.int(1)?.max(0) as usize,
            bytes: row.int(2)?.max(0) as u64,
        }))
    }

    /// Whether `tenant` may save a snapshot of `scope`: a scope it keeps already, or a
    /// new one while it keeps fewer than `max` scopes.
    async fn may_save(&self, tenant: &str, scope: &str, max: usize) -> Result<(), StoreError> {
        let row = self
            .db
            .query_one(
                "count the tenant's scopes",
                "SELECT
                     (SELECT COUNT(*) FROM snapshots WHERE scope = ?1),
                     (SELECT COUNT(DISTINCT scope) FROM snapshots WHERE tenant = ?2)",
                params![scope, tenant],
            )
            .await?;
        let (known, scopes) = match row {
            Some(row) => (row.int(0)? > 0, row.int(1)?.max(0) as usize),
            None => (false, 0),
        };
        if !known && scopes >= max {
            return Err(StoreError::TooManyScopes { max });
        }
        Ok(())
    }

    /// Forgets every scope whose latest snapshot is older than `max_age` (retention):
    /// its objects are then no longer kept. Returns how many scopes went.
    pub async fn forget_unused(&self, max_age: std::time::Duration) -> Result<usize, StoreError> {
        let before = now_ms() - i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX);
        const UNUSED: &str =
            "SELECT scope FROM snapshots GROUP BY scope HAVING MAX(created_ms) < ?1";
        let count = format!("SELECT COUNT(*) FROM ({UNUSED}) AS unused");
        let delete = format!("DELETE FROM snapshots WHERE scope IN ({UNUSED})");
        let done = self
            .db
            .transaction(
                "forget unused scopes",
                &[
                    Statement {
                        sql: &count,
                        params: params![before],
                    },
                    Statement {
                        sql: &delete,
                        params: params![before],
                    },
                    Statement {
                        sql: FORGET_UNREFERENCED,
                        params: params![],
                    },
                ],
            )
            .await?;
        match done.first().and_then(|d| d.rows.first()) {
            Some(row) => Ok(row.int(0)?.max(0) as usize),
            None => Ok(0),
        }
    }

    /// Makes `summary` (all of whose objects are stored) the scope's latest, in one
    /// transaction, and forgets all but its last `keep`.
    async fn record(
        &self,
        tenant: &str,
        scope: &str,
        summary: &SnapshotSummary,
        objects: &HashSet<String>,
        keep: usize,
    ) -> Result<(), StoreError> {
        // The objects go as one JSON array, spread into rows by the engine: one
        // statement however many files the snapshot holds.
        let objects = serde_json::to_string(&objects.iter().collect::<Vec<_>>())
            .map_err(|e| snapshot_error(format!("list a snapshot's objects: {e}")))?;
        let spread = self.db.pick(
            "SELECT ?1, value FROM json_each(?2)",
            "SELECT ?1::text, jsonb_array_elements_text(?2::text::jsonb)",
        );
        // `WHERE true` keeps SQLite from reading `ON CONFLICT` as a join's `ON`.
        let insert_objects = format!(
            "INSERT INTO snapshot_objects (manifest, sha256) {spread} WHERE true
             ON CONFLICT DO NOTHING"
        );
        self.db
            .transaction(
                "record a snapshot",
                &[
                    Statement {
                        sql: &insert_objects,
                        params: params![&summary.id, objects],
                    },
                    Statement {
                        sql: "INSERT INTO snapshots (scope, seq, manifest, files, bytes, created_ms, tenant)
                              VALUES (?1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM snapshots WHERE scope = ?1),
                                      ?2, ?3, ?4, ?5, ?6)",
                        params: params![
                            scope,
                            &summary.id,
                            i64::try_from(summary.files).unwrap_or(i64::MAX),
                            i64::try_from(summary.bytes).unwrap_or(i64::MAX),
                            now_ms(),
                            tenant
                        ],
                    },
                    Statement {
                        sql: "DELETE FROM snapshots WHERE scope = ?1
                              AND seq <= (SELECT MAX(seq) FROM snapshots WHERE scope = ?1) - ?2",
                        params: params![scope, i64::try_from(keep.max(1)).unwrap_or(i64::MAX)],
                    },
                    Statement {
                        sql: FORGET_UNREFERENCED,
                        params: params![],
                    },
                ],
            )
            .await
            .map(drop)
    }

    /// Every object a kept snapshot needs (its manifest and its files): what store
    /// retention must not remove.
    pub async fn referenced(&self) -> Result<HashSet<String>, StoreError> {
        self.db
            .query(
                "list the snapshots' objects",
                "SELECT manifest FROM snapshots UNION SELECT sha256 FROM snapshot_objects",
                params![],
            )
            .await?
            .iter()
            .map(|row| row.text(0))
            .collect()
    }

    /// The number of snapshots kept for `scope`.
    pub async fn count(&self, scope: &str) -> Result<usize, StoreError> {
        let row = self
            .db
            .query_one(
                "count snapshots",
                "SELECT COUNT(*) FROM snapshots WHERE scope = ?1",
                params![scope],
            )
            .await?;
        Ok(row.map(|r| r.int(0)).transpose()?.unwrap_or(0).max(0) as usize)
    }
}

/// Forgets the objects of snapshots no longer kept.
const FORGET_UNREFERENCED: &str =
    "DELETE FROM snapshot_objects WHERE manifest NOT IN (SELECT manifest FROM snapshots)";

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
    snapshots
        .may_save(tenant, scope, limits.scopes_per_tenant)
        .await?;
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
    snapshots
        .record(tenant, scope, &summary, &objects, limits.keep)
        .await?;
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
    let Some(latest) = snapshots.latest(scope).await? else {
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
