//! [`GrantRecords`]: capability grants and denies kept in a records database, so every
//! node sharing it decides alike. The rules (what a grant covers, ceilings, which grant
//! wins) are `skillbox-capability`'s; this keeps rows: a grant is a capability, the
//! project root it holds in, its scope (`once` or `project`), what it covers (a JSON
//! array of strings) and when it was given.

use crate::db::{Db, Migration, RecordsDb, Schema, Statement, Step, params};
use crate::error::StoreError;

/// The grants of a records database.
#[derive(Debug, Clone)]
pub struct GrantRecords {
    db: Db,
}

/// A grant as kept: `id` names its row (a `once` grant is used up by it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptGrant {
    pub id: i64,
    pub capability: String,
    pub project: String,
    pub scope: String,
    pub covers: Vec<String>,
    pub granted_ms: i64,
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "grants",
    sqlite: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE IF NOT EXISTS capability_grants (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 capability TEXT NOT NULL,
                 project TEXT NOT NULL,
                 scope TEXT NOT NULL,
                 covers TEXT NOT NULL,
                 granted_ms INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS capability_grants_project
                 ON capability_grants (project, capability);
             CREATE TABLE IF NOT EXISTS capability_denies (
                 capability TEXT NOT NULL,
                 project TEXT NOT NULL,
                 PRIMARY KEY (capability, project)
             )",
        )],
    }],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE capability_grants (
                 id BIGSERIAL PRIMARY KEY,
                 capability TEXT NOT NULL,
                 project TEXT NOT NULL,
                 scope TEXT NOT NULL,
                 covers TEXT NOT NULL,
                 granted_ms BIGINT NOT NULL
             );
             CREATE INDEX capability_grants_project
                 ON capability_grants (project, capability);
             CREATE TABLE capability_denies (
                 capability TEXT NOT NULL,
                 project TEXT NOT NULL,
                 PRIMARY KEY (capability, project)
             )",
        )],
    }],
};

impl GrantRecords {
    /// The grants' tables (`<data>/grants.sqlite` on SQLite).
    pub fn open(at: &RecordsDb) -> Result<Self, StoreError> {
        let db = at.open(
            "grants.sqlite",
            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;",
            &SCHEMA,
        )?;
        Ok(GrantRecords { db })
    }

    /// Keeps a grant of `capability` in `project` for `scope`, in place of any of the
    /// same scope there: one transaction, so no node sees neither or both.
    pub async fn put(
        &self,
        capability: &str,
        project: &str,
        scope: &str,
        covers: &[String],
        granted_ms: i64,
    ) -> Result<(), StoreError> {
        let covers = serde_json::to_string(covers).map_err(|e| StoreError::Records {
            op: "keep a grant".into(),
            detail: e.to_string(),
        })?;
        self.db
            .transaction(
                "keep a grant",
                &[
                    Statement {
                        sql: "DELETE FROM capability_grants
                         WHERE capability = ?1 AND project = ?2 AND scope = ?3",
                        params: params![capability, project, scope],
                    },
                    Statement {
                        sql: "INSERT INTO capability_grants
                             (capability, project, scope, covers, granted_ms)
                         VALUES (?1, ?2, ?3, ?4, ?5)",
                        params: params![capability, project, scope, covers, granted_ms],
                    },
                ],
            )
            .await
            .map(drop)
    }

    /// Removes every grant of `capability` in `project`; how many went.
    pub async fn remove(&self, capability: &str, project: &str) -> Result<u64, StoreError> {
        self.db
            .execute(
                "revoke grants",
                "DELETE FROM capability_grants WHERE capability = ?1 AND project = ?2",
                params![capability, project],
            )
            .await
    }

    /// Uses up the grant `id`: true for the one caller that removed it, false when it
    /// was gone already (another node's run took it).
    pub async fn use_up(&self, id: i64) -> Result<bool, StoreError> {
        let removed = self
            .db
            .execute(
                "use up a grant",
                "DELETE FROM capability_grants WHERE id = ?1",
                params![id],
            )
            .await?;
        Ok(removed == 1)
    }

    pub async fn deny(&self, capability: &str, project: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "deny a capability",
                "INSERT INTO capability_denies (capability, project) VALUES (?1, ?2)
                 ON CONFLICT (capability, project) DO NOTHING",
                params![capability, project],
            )
            .await
            .map(drop)
    }

    pub async fn allow(&self, capability: &str, project: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "lift a deny",
                "DELETE FROM capability_denies WHERE capability = ?1 AND project = ?2",
                params![capability, project],
            )
            .await
            .map(drop)
    }

    /// The grants kept for `project`, oldest first, and the names denied there.
    pub async fn list(&self, project: &str) -> Result<(Vec<KeptGrant>, Vec<String>), StoreError> {
        let grants = self
            .db
            .query(
                "list grants",
                "SELECT id, capability, project, scope, covers, granted_ms
                 FROM capability_grants WHERE project = ?1 ORDER BY id",
                params![project],
            )
            .await?
            .iter()
            .map(|row| {
                let covers = row.text(4)?;
                Ok(KeptGrant {
                    id: row.int(0)?,
                    capability: row.text(1)?,
                    project: row.text(2)?,
                    scope: row.text(3)?,
                    covers: serde_json::from_str(&covers).map_err(|e| StoreError::Records {
                        op: "list grants".into(),
                        detail: format!("a grant's covers: {e}"),
                    })?,
                    granted_ms: row.int(5)?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let denied = self
            .db
            .query(
                "list denies",
                "SELECT capability FROM capability_denies WHERE project = ?1 ORDER BY capability",
                params![project],
            )
            .await?
            .iter()
            .map(|row| row.text(0))
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok((grants, denied))
    }
}
