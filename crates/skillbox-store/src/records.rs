//! Run records: agent runs persisted in SQLite in the data dir, so they survive a
//! restart of `skillbox serve`. A record is its tenant and status plus a JSON document.
//! Plain runs (`POST /v1/run`) keep a short summary each in a table of their own, the
//! newest few hundred of each tenant, so a list can show them.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::StoreError;

/// The agent run records of one data dir.
#[derive(Debug, Clone)]
pub struct RunRecords {
    db: Arc<Mutex<Connection>>,
}

/// One stored record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    pub id: String,
    /// Who started the run: only this tenant may read it.
    pub tenant: String,
    pub status: String,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// The record's JSON document.
    pub body: String,
}

/// One plain run's stored summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainRunRecord {
    pub id: String,
    pub tenant: String,
    pub created_ms: i64,
    /// The summary's JSON document.
    pub body: String,
}

/// The tenant of a server without API keys, and of records made before tenants.
pub const LOCAL_TENANT: &str = "local";

pub(crate) fn db_error(op: &str) -> impl FnOnce(rusqlite::Error) -> StoreError + '_ {
    move |e| StoreError::Records {
        op: op.to_string(),
        detail: e.to_string(),
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl RunRecords {
    /// Opens (creating) `path`. Runs left `running` by a process that died are marked
    /// `failed`, with the reason in their body, so a client polling them gets an end.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| StoreError::Io {
                op: "create the records dir",
                path: parent.display().to_string(),
                source,
            })?;
        }
        let db = Connection::open(path).map_err(db_error("open the run records"))?;
        // WAL with `synchronous = NORMAL`: a commit is a write to the log, not an fsync
        // (one at each checkpoint). A crash of skillbox loses nothing committed; a power
        // cut may lose the last few records, never the file's consistency. These are a
        // list for people to look at, not the artifacts (those are fsynced).
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA synchronous = NORMAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS agent_runs (
                 id TEXT PRIMARY KEY,
                 status TEXT NOT NULL,
                 created_ms INTEGER NOT NULL,
                 updated_ms INTEGER NOT NULL,
                 body TEXT NOT NULL
             );",
        )
        .map_err(db_error("create the run records table"))?;
        // Records from before tenants belong to the one tenant a keyless server has.
        let has_tenant = db
            .prepare("SELECT 1 FROM pragma_table_info('agent_runs') WHERE name = 'tenant'")
            .and_then(|mut query| query.exists([]))
            .map_err(db_error("read the run records table"))?;
        if !has_tenant {
            db.execute_batch(&format!(
                "ALTER TABLE agent_runs ADD COLUMN tenant TEXT NOT NULL DEFAULT '{LOCAL_TENANT}'"
            ))
            .map_err(db_error("add the tenant column"))?;
        }
        // A tenant's list, newest first, reads this index and nothing else.
        db.execute_batch(
            "CREATE INDEX IF NOT EXISTS agent_runs_by_tenant
                 ON agent_runs (tenant, created_ms DESC, id DESC);
             CREATE TABLE IF NOT EXISTS plain_runs (
                 id TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 created_ms INTEGER NOT NULL,
                 body TEXT NOT NULL
             );
             CREATE INDEX IF NOT EXISTS plain_runs_by_tenant
                 ON plain_runs (tenant, created_ms DESC, id DESC);",
        )
        .map_err(db_error("index the run records"))?;
        let interrupted = serde_json::json!({"reason": "interrupted: skillbox stopped while this run was running"}).to_string();
        db.execute(
            "UPDATE agent_runs SET status = 'failed', updated_ms = ?1, body = json_patch(body, ?2) WHERE status = 'running'",
            params![now_ms(), interrupted],
        )
        .map_err(db_error("close interrupted runs"))?;
        Ok(RunRecords {
            db: Arc::new(Mutex::new(db)),
        })
    }

    fn with<T>(
        &self,
        op: &str,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let db = self.db.lock().map_err(|_| StoreError::Records {
            op: op.to_string(),
            detail: "lock poisoned".into(),
        })?;
        f(&db).map_err(db_error(op))
    }

    /// Inserts a new record of `tenant`.
    pub fn insert(
        &self,
        id: &str,
        tenant: &str,
        status: &str,
        body: &str,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        self.with("insert a run record", |db| {
            db.execute(
                "INSERT INTO agent_runs (id, tenant, status, created_ms, updated_ms, body) VALUES (?1, ?2, ?3, ?4, ?4, ?5)",
                params![id, tenant, status, now, body],
            )
            .map(|_| ())
        })
    }

    /// Replaces a record's status and body.
    pub fn update(&self, id: &str, status: &str, body: &str) -> Result<(), StoreError> {
        let now = now_ms();
        let changed = self.with("update a run record", |db| {
            db.execute(
                "UPDATE agent_runs SET status = ?2, updated_ms = ?3, body = ?4 WHERE id = ?1",
                params![id, status, now, body],
            )
        })?;
        if changed == 0 {
            return Err(StoreError::Records {
                op: "update a run record".into(),
                detail: format!("no run {id}"),
            });
        }
        Ok(())
    }

    /// Removes records of runs that ended more than `max_age` ago; a running one stays
    /// whatever its age. Returns how many went.
    pub fn prune(&self, max_age: std::time::Duration) -> Result<usize, StoreError> {
        let cutoff =
            now_ms().saturating_sub(i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX));
        self.with("remove old run records", |db| {
            let agent = db.execute(
                "DELETE FROM agent_runs WHERE status != 'running' AND updated_ms < ?1",
                params![cutoff],
            )?;
            let plain = db.execute(
                "DELETE FROM plain_runs WHERE created_ms < ?1",
                params![cutoff],
            )?;
            Ok(agent + plain)
        })
    }

    /// Records a plain run of `tenant`, then forgets its oldest beyond the newest `keep`.
    pub fn insert_plain(
        &self,
        id: &str,
        tenant: &str,
        body: &str,
        keep: usize,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        // One transaction: the insert and the forgetting commit together. The forgetting
        // walks the tenant's index past its newest `keep` and deletes what is left (one
        // row, in the steady state), rather than testing every row against a set of `keep`.
        self.with("record a plain run", |db| {
            let tx = db.unchecked_transaction()?;
            tx.execute(
                "INSERT INTO plain_runs (id, tenant, created_ms, body) VALUES (?1, ?2, ?3, ?4)",
                params![id, tenant, now, body],
            )?;
            tx.execute(
                "DELETE FROM plain_runs WHERE id IN (
                     SELECT id FROM plain_runs WHERE tenant = ?1
                     ORDER BY created_ms DESC, id DESC LIMIT -1 OFFSET ?2)",
                params![tenant, keep],
            )?;
            tx.commit()
        })
    }

    pub fn get_plain(&self, id: &str) -> Result<Option<PlainRunRecord>, StoreError> {
        self.with("read a plain run", |db| {
            db.query_row(
                "SELECT id, tenant, created_ms, body FROM plain_runs WHERE id = ?1",
                params![id],
                row_to_plain,
            )
            .optional()
        })
    }

    /// At most `limit` plain runs of `tenant`, newest first, older than `before` if
    /// given (as [`RunRecords::list`]).
    pub fn list_plain(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<&PlainRunRecord>,
    ) -> Result<Vec<PlainRunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with("list plain runs", |db| {
            let (created, id) = match before {
                Some(record) => (record.created_ms, record.id.as_str()),
                None => (i64::MAX, ""),
            };
            let mut query = db.prepare(
                "SELECT id, tenant, created_ms, body FROM plain_runs
                 WHERE tenant = ?1 AND (?2 = '' OR created_ms < ?3 OR (created_ms = ?3 AND id < ?2))
                 ORDER BY created_ms DESC, id DESC LIMIT ?4",
            )?;
            let rows = query.query_map(params![tenant, id, created, limit], row_to_plain)?;
            rows.collect()
        })
    }

    pub fn get(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.with("read a run record", |db| {
            db.query_row(
                "SELECT id, tenant, status, created_ms, updated_ms, body FROM agent_runs WHERE id = ?1",
                params![id],
                row_to_record,
            )
            .optional()
        })
    }

    /// At most `limit` records of `tenant`, newest first. With `before` (a record of
    /// the same tenant), only those older than it: the next page after a page that
    /// ended with `before`. Ties in `created_ms` are ordered by id, so no record is
    /// skipped or shown twice across pages.
    pub fn list(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<&RunRecord>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with("list run records", |db| {
            let (created, id) = match before {
                Some(record) => (record.created_ms, record.id.as_str()),
                None => (i64::MAX, ""),
            };
            let mut query = db.prepare(
                "SELECT id, tenant, status, created_ms, updated_ms, body FROM agent_runs
                 WHERE tenant = ?1 AND (?2 = '' OR created_ms < ?3 OR (created_ms = ?3 AND id < ?2))
                 ORDER BY created_ms DESC, id DESC LIMIT ?4",
            )?;
            let rows = query.query_map(params![tenant, id, created, limit], row_to_record)?;
            rows.collect()
        })
    }
}

fn row_to_plain(row: &rusqlite::Row<'_>) -> rusqlite::Result<PlainRunRecord> {
    Ok(PlainRunRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        created_ms: row.get(2)?,
        body: row.get(3)?,
    })
}

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        status: row.get(2)?,
        created_ms: row.get(3)?,
        updated_ms: row.get(4)?,
        body: row.get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_survive_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("runs.sqlite");
        let records = RunRecords::open(&path).expect("open");
        records
            .insert("a", "t1", "running", r#"{"prompt":"x"}"#)
            .expect("insert");
        records
            .insert("b", "t2", "running", r#"{"prompt":"y"}"#)
            .expect("insert");
        records
            .update("b", "succeeded", r#"{"prompt":"y","attempts":[]}"#)
            .expect("update");
        assert!(
            records.insert("a", "t2", "running", "{}").is_err(),
            "ids are unique"
        );
        assert!(records.update("zzz", "failed", "{}").is_err());
        assert_eq!(
            records.get("b").expect("get").expect("b").status,
            "succeeded"
        );
        assert_eq!(records.get("nope").expect("get"), None);
        drop(records);
        // A restart: the run that was running is closed as failed, the finished one kept.
        let records = RunRecords::open(&path).expect("reopen");
        let a = records.get("a").expect("get").expect("a");
        assert_eq!(a.status, "failed");
        assert_eq!(a.tenant, "t1");
        assert!(a.body.contains("interrupted"), "{}", a.body);
        assert!(a.body.contains("\"prompt\":\"x\""), "{}", a.body);
        assert_eq!(
            records.get("b").expect("get").expect("b").body,
            r#"{"prompt":"y","attempts":[]}"#
        );
    }

    #[test]
    fn a_tenants_list_is_newest_first_paged_and_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = RunRecords::open(&dir.path().join("runs.sqlite")).expect("open");
        // Five of t1's and one of t2's; several share a millisecond, as quick inserts do.
        for id in ["r1", "r2", "r3", "r4", "r5"] {
            records.insert(id, "t1", "running", "{}").expect("insert");
        }
        records
            .insert("other", "t2", "running", "{}")
            .expect("insert");
        let ids = |page: &[RunRecord]| page.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        let all = records.list("t1", 100, None).expect("list");
        assert_eq!(ids(&all), ["r5", "r4", "r3", "r2", "r1"]);
        let first = records.list("t1", 2, None).expect("list");
        assert_eq!(ids(&first), ["r5", "r4"]);
        let second = records.list("t1", 2, first.last()).expect("list");
        assert_eq!(ids(&second), ["r3", "r2"]);
        let third = records.list("t1", 2, second.last()).expect("list");
        assert_eq!(ids(&third), ["r1"]);
        assert!(
            records
                .list("t1", 2, third.last())
                .expect("list")
                .is_empty()
        );
        assert_eq!(ids(&records.list("t2", 10, None).expect("list")), ["other"]);
        assert!(records.list("t3", 10, None).expect("list").is_empty());
    }

    #[test]
    fn plain_runs_are_paged_per_tenant_and_only_the_newest_are_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = RunRecords::open(&dir.path().join("runs.sqlite")).expect("open");
        for id in ["p1", "p2", "p3", "p4"] {
            records.insert_plain(id, "t1", "{}", 3).expect("insert");
        }
        records.insert_plain("q1", "t2", "{}", 3).expect("insert");
        let ids = |page: &[PlainRunRecord]| page.iter().map(|r| r.id.clone()).collect::<Vec<_>>();
        // The oldest of t1 went past the bound of 3; t2's own is untouched.
        assert_eq!(records.get_plain("p1").expect("get"), None);
        let first = records.list_plain("t1", 2, None).expect("list");
        assert_eq!(ids(&first), ["p4", "p3"]);
        let second = records.list_plain("t1", 2, first.last()).expect("list");
        assert_eq!(ids(&second), ["p2"]);
        assert_eq!(
            ids(&records.list_plain("t2", 9, None).expect("list")),
            ["q1"]
        );
        assert_eq!(
            records.get_plain("q1").expect("get").expect("q1").tenant,
            "t2"
        );
        // Retention takes them by age, as it takes ended agent runs.
        let day = std::time::Duration::from_secs(24 * 3600);
        assert_eq!(records.prune(day).expect("prune"), 0);
        Connection::open(dir.path().join("runs.sqlite"))
            .expect("open")
            .execute(
                "UPDATE plain_runs SET created_ms = 1 WHERE tenant = 't1'",
                [],
            )
            .expect("age t1's runs");
        assert_eq!(records.prune(day).expect("prune"), 3);
        assert!(records.list_plain("t1", 9, None).expect("list").is_empty());
        assert_eq!(records.list_plain("t2", 9, None).expect("list").len(), 1);
    }

    #[test]
    fn records_from_before_tenants_belong_to_the_local_tenant() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("runs.sqlite");
        let old = Connection::open(&path).expect("open");
        old.execute_batch(
            "CREATE TABLE agent_runs (id TEXT PRIMARY KEY, status TEXT NOT NULL,
                 created_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, body TEXT NOT NULL);
             INSERT INTO agent_runs VALUES ('old', 'succeeded', 1, 1, '{}');",
        )
        .expect("old schema");
        drop(old);
        let records = RunRecords::open(&path).expect("open");
        assert_eq!(
            records.get("old").expect("get").expect("old").tenant,
            LOCAL_TENANT
        );
        records.insert("new", "t", "running", "{}").expect("insert");
        assert_eq!(records.get("new").expect("get").expect("new").tenant, "t");
    }
}
