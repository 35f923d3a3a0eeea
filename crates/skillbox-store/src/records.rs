//! Run records: agent runs, so they survive a restart of `skillbox serve` and can be
//! read from any node sharing the database. A record is its tenant, its node and its
//! status plus a JSON document. Plain runs (`POST /v1/run`) keep a short summary each in
//! a table of their own, the newest few hundred of each tenant, so a list can show them.

use std::sync::Arc;

use crate::db::{Db, Engine, Migration, RecordsDb, Row, Schema, Statement, Step, params};
use crate::error::StoreError;

/// The agent run records (and plain runs' summaries) of a data dir or a database.
#[derive(Debug, Clone)]
pub struct RunRecords {
    db: Db,
    /// The node this process is: its runs are the ones it closes when it starts.
    node: Arc<str>,
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

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "runs",
    sqlite: &[
        Migration {
            version: 1,
            steps: &[
                Step::Sql(
                    "CREATE TABLE IF NOT EXISTS agent_runs (
                         id TEXT PRIMARY KEY,
                         status TEXT NOT NULL,
                         created_ms INTEGER NOT NULL,
                         updated_ms INTEGER NOT NULL,
                         body TEXT NOT NULL
                     )",
                ),
                // Records from before tenants belong to the one tenant a keyless server has.
                Step::AddColumn {
                    table: "agent_runs",
                    column: "tenant",
                    decl: "tenant TEXT NOT NULL DEFAULT 'local'",
                },
                // A tenant's list, newest first, reads this index and nothing else.
                Step::Sql(
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
                ),
            ],
        },
        Migration {
            version: 2,
            steps: &[Step::Sql(
                "ALTER TABLE agent_runs ADD COLUMN node TEXT NOT NULL DEFAULT ''",
            )],
        },
    ],
    // Ids compare as bytes (`COLLATE "C"`), as SQLite's do, so pages are cut the same.
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            r#"CREATE TABLE agent_runs (
                   id TEXT COLLATE "C" PRIMARY KEY,
                   tenant TEXT NOT NULL,
                   node TEXT NOT NULL,
                   status TEXT NOT NULL,
                   created_ms BIGINT NOT NULL,
                   updated_ms BIGINT NOT NULL,
                   body TEXT NOT NULL
               );
               CREATE INDEX agent_runs_by_tenant ON agent_runs (tenant, created_ms DESC, id DESC);
               CREATE INDEX agent_runs_running ON agent_runs (node) WHERE status = 'running';
               CREATE TABLE plain_runs (
                   id TEXT COLLATE "C" PRIMARY KEY,
                   tenant TEXT NOT NULL,
                   created_ms BIGINT NOT NULL,
                   body TEXT NOT NULL
               );
               CREATE INDEX plain_runs_by_tenant ON plain_runs (tenant, created_ms DESC, id DESC);"#,
        )],
    }],
};

/// Pragmas of the records' SQLite file. WAL with `synchronous = NORMAL`: a commit is a
/// write to the log, not an fsync (one at each checkpoint). A crash of skillbox loses
/// nothing committed; a power cut may lose the last few records, never the file's
/// consistency. These are a list for people to look at, not the artifacts (those are
/// fsynced).
const PRAGMAS: &str = "PRAGMA journal_mode = WAL;
                       PRAGMA synchronous = NORMAL;
                       PRAGMA busy_timeout = 5000;";

const AGENT_COLUMNS: &str = "id, tenant, status, created_ms, updated_ms, body";

impl RunRecords {
    /// Opens the records (`agent-runs.sqlite` in a data dir), as the node `node`. Runs
    /// this node left `running` when it died are marked `failed`, with the reason in
    /// their body, so a client polling them gets an end. (On SQLite, one process's
    /// file, that is every run left running.)
    pub async fn open(at: &RecordsDb, node: &str) -> Result<Self, StoreError> {
        let db = at.open("agent-runs.sqlite", PRAGMAS, &SCHEMA)?;
        let records = RunRecords {
            db,
            node: node.into(),
        };
        // SQLite's file is one process's: every run left running there is its own,
        // whatever node name it ran under.
        let node = (records.db.engine() == Engine::Postgres).then_some(node);
        records
            .close(
                node,
                "interrupted: skillbox stopped while this run was running",
            )
            .await?;
        Ok(records)
    }

    /// The node this process is.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Marks `failed` the runs `node` left running (a node found dead), with `reason`
    /// in their body. Returns how many.
    pub async fn close_running(&self, node: &str, reason: &str) -> Result<u64, StoreError> {
        self.close(Some(node), reason).await
    }

    /// Marks `failed` the runs of `node` (of every node: `None`) left running.
    async fn close(&self, node: Option<&str>, reason: &str) -> Result<u64, StoreError> {
        let patch = self.db.pick(
            "json_patch(body, ?2)",
            "(body::jsonb || ?2::text::jsonb)::text",
        );
        let mut params = params![
            now_ms(),
            serde_json::json!({ "reason": reason }).to_string()
        ];
        let mut sql = format!(
            "UPDATE agent_runs SET status = 'failed', updated_ms = ?1, body = {patch}
             WHERE status = 'running'"
        );
        if let Some(node) = node {
            sql.push_str(" AND node = ?3");
            params.push(node.into());
        }
        self.db
            .execute("close interrupted runs", &sql, params)
            .await
    }

    /// Inserts a new record of `tenant`, run by this node.
    pub async fn insert(
        &self,
        id: &str,
        tenant: &str,
        status: &str,
        body: &str,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "insert a run record",
                "INSERT INTO agent_runs (id, tenant, node, status, created_ms, updated_ms, body)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6)",
                params![id, tenant, &*self.node, status, now_ms(), body],
            )
            .await
            .map(drop)
    }

    /// Replaces a record's status and body.
    pub async fn update(&self, id: &str, status: &str, body: &str) -> Result<(), StoreError> {
        let changed = self
            .db
            .execute(
                "update a run record",
                "UPDATE agent_runs SET status = ?2, updated_ms = ?3, body = ?4 WHERE id = ?1",
                params![id, status, now_ms(), body],
            )
            .await?;
        if changed == 0 {
            return Err(StoreError::Records {
                op: "update a run record".into(),
                detail: format!("no run {id}"),
            });
        }
        Ok(())
    }

    /// Replaces a running record's body (its progress); a record that has ended is
    /// left as it is.
    pub async fn update_running(&self, id: &str, body: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "save a run's progress",
                "UPDATE agent_runs SET updated_ms = ?2, body = ?3 WHERE id = ?1 AND status = 'running'",
                params![id, now_ms(), body],
            )
            .await
            .map(drop)
    }

    /// Removes records of runs that ended more than `max_age` ago; a running one stays
    /// whatever its age. Returns how many went.
    pub async fn prune(&self, max_age: std::time::Duration) -> Result<usize, StoreError> {
        let cutoff =
            now_ms().saturating_sub(i64::try_from(max_age.as_millis()).unwrap_or(i64::MAX));
        let done = self
            .db
            .transaction(
                "remove old run records",
                &[
                    Statement {
                        sql: "DELETE FROM agent_runs WHERE status != 'running' AND updated_ms < ?1",
                        params: params![cutoff],
                    },
                    Statement {
                        sql: "DELETE FROM plain_runs WHERE created_ms < ?1",
                        params: params![cutoff],
                    },
                ],
            )
            .await?;
        Ok(done.iter().map(|d| d.changed as usize).sum())
    }

    /// Records a plain run of `tenant`, then forgets its oldest beyond the newest `keep`.
    pub async fn insert_plain(
        &self,
        id: &str,
        tenant: &str,
        body: &str,
        keep: usize,
    ) -> Result<(), StoreError> {
        let keep = i64::try_from(keep).unwrap_or(i64::MAX);
        // One transaction: the insert and the forgetting commit together. The forgetting
        // finds the tenant's newest run past `keep` on its index and deletes it and what
        // is older (one row, in the steady state), rather than testing every row against
        // a set of `keep`.
        self.db
            .transaction(
                "record a plain run",
                &[
                    Statement {
                        sql: "INSERT INTO plain_runs (id, tenant, created_ms, body)
                              VALUES (?1, ?2, ?3, ?4)",
                        params: params![id, tenant, now_ms(), body],
                    },
                    Statement {
                        sql: "DELETE FROM plain_runs WHERE tenant = ?1 AND (created_ms, id) <= (
                                  SELECT created_ms, id FROM plain_runs WHERE tenant = ?1
                                  ORDER BY created_ms DESC, id DESC LIMIT 1 OFFSET ?2)",
                        params: params![tenant, keep],
                    },
                ],
            )
            .await
            .map(drop)
    }

    pub async fn get_plain(&self, id: &str) -> Result<Option<PlainRunRecord>, StoreError> {
        self.db
            .query_one(
                "read a plain run",
                "SELECT id, tenant, created_ms, body FROM plain_runs WHERE id = ?1",
                params![id],
            )
            .await?
            .map(|row| plain_from(&row))
            .transpose()
    }

    /// At most `limit` plain runs of `tenant`, newest first, older than `before` if
    /// given (as [`RunRecords::list`]).
    pub async fn list_plain(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<&PlainRunRecord>,
    ) -> Result<Vec<PlainRunRecord>, StoreError> {
        let (created, id) = match before {
            Some(record) => (record.created_ms, record.id.as_str()),
            None => (i64::MAX, ""),
        };
        self.db
            .query(
                "list plain runs",
                "SELECT id, tenant, created_ms, body FROM plain_runs
                 WHERE tenant = ?1 AND (?2 = '' OR created_ms < ?3 OR (created_ms = ?3 AND id < ?2))
                 ORDER BY created_ms DESC, id DESC LIMIT ?4",
                params![
                    tenant,
                    id,
                    created,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
            )
            .await?
            .iter()
            .map(plain_from)
            .collect()
    }

    pub async fn get(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.db
            .query_one(
                "read a run record",
                &format!("SELECT {AGENT_COLUMNS} FROM agent_runs WHERE id = ?1"),
                params![id],
            )
            .await?
            .map(|row| record_from(&row))
            .transpose()
    }

    /// At most `limit` records of `tenant`, newest first. With `before` (a record of
    /// the same tenant), only those older than it: the next page after a page that
    /// ended with `before`. Ties in `created_ms` are ordered by id, so no record is
    /// skipped or shown twice across pages.
    pub async fn list(
        &self,
        tenant: &str,
        limit: usize,
        before: Option<&RunRecord>,
    ) -> Result<Vec<RunRecord>, StoreError> {
        let (created, id) = match before {
            Some(record) => (record.created_ms, record.id.as_str()),
            None => (i64::MAX, ""),
        };
        self.db
            .query(
                "list run records",
                &format!(
                    "SELECT {AGENT_COLUMNS} FROM agent_runs
                     WHERE tenant = ?1 AND (?2 = '' OR created_ms < ?3 OR (created_ms = ?3 AND id < ?2))
                     ORDER BY created_ms DESC, id DESC LIMIT ?4"
                ),
                params![tenant, id, created, i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await?
            .iter()
            .map(record_from)
            .collect()
    }
}

fn plain_from(row: &Row) -> Result<PlainRunRecord, StoreError> {
    Ok(PlainRunRecord {
        id: row.text(0)?,
        tenant: row.text(1)?,
        created_ms: row.int(2)?,
        body: row.text(3)?,
    })
}

fn record_from(row: &Row) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        id: row.text(0)?,
        tenant: row.text(1)?,
        status: row.text(2)?,
        created_ms: row.int(3)?,
        updated_ms: row.int(4)?,
        body: row.text(5)?,
    })
}
