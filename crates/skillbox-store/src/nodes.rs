//! [`Nodes`]: the servers sharing one records database, each with the time it was last
//! seen. Every node says it is alive now and then ([`Nodes::beat`]); a node silent
//! for longer than a bound is taken for dead by the first other node to notice, which
//! removes it ([`Nodes::claim_dead`]) and closes the runs it left running.

use crate::db::{Db, Migration, RecordsDb, Schema, Step, params};
use crate::error::StoreError;
use crate::records::now_ms;

/// The nodes of a shared database.
#[derive(Debug, Clone)]
pub struct Nodes {
    db: Db,
}

/// A node found silent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SilentNode {
    pub name: String,
    /// When it was last seen (milliseconds since the epoch).
    pub seen_ms: i64,
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "nodes",
    sqlite: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE IF NOT EXISTS nodes (
                 name TEXT PRIMARY KEY,
                 address TEXT NOT NULL,
                 started_ms INTEGER NOT NULL,
                 seen_ms INTEGER NOT NULL
             )",
        )],
    }],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE nodes (
                 name TEXT PRIMARY KEY,
                 address TEXT NOT NULL,
                 started_ms BIGINT NOT NULL,
                 seen_ms BIGINT NOT NULL
             )",
        )],
    }],
};

impl Nodes {
    /// The nodes' table (`<data>/nodes.sqlite` on SQLite, where a data dir is one
    /// node's and nobody else looks).
    pub fn open(at: &RecordsDb) -> Result<Self, StoreError> {
        let db = at.open(
            "nodes.sqlite",
            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;",
            &SCHEMA,
        )?;
        Ok(Nodes { db })
    }

    /// `name`, reached at `address`, is alive now (the first beat of a process starts
    /// it anew).
    pub async fn beat(&self, name: &str, address: &str, starting: bool) -> Result<(), StoreError> {
        let sql = if starting {
            "INSERT INTO nodes (name, address, started_ms, seen_ms) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (name) DO UPDATE SET address = ?2, started_ms = ?3, seen_ms = ?3"
        } else {
            "INSERT INTO nodes (name, address, started_ms, seen_ms) VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (name) DO UPDATE SET address = ?2, seen_ms = ?3"
        };
        self.db
            .execute(
                "say this node is alive",
                sql,
                params![name, address, now_ms()],
            )
            .await
            .map(drop)
    }

    /// Every listed node: its name and where it is reached, by name.
    pub async fn all(&self) -> Result<Vec<(String, String)>, StoreError> {
        self.db
            .query(
                "list the nodes",
                "SELECT name, address FROM nodes ORDER BY name",
                params![],
            )
            .await?
            .iter()
            .map(|row| Ok((row.text(0)?, row.text(1)?)))
            .collect()
    }

    /// Where node `name` is reached, while it is listed.
    pub async fn address(&self, name: &str) -> Result<Option<String>, StoreError> {
        self.db
            .query_one(
                "find a node",
                "SELECT address FROM nodes WHERE name = ?1",
                params![name],
            )
            .await?
            .map(|row| row.text(0))
            .transpose()
    }

    /// The nodes other than `me` not seen for `silent` or longer.
    pub async fn silent(
        &self,
        me: &str,
        silent: std::time::Duration,
    ) -> Result<Vec<SilentNode>, StoreError> {
        let cutoff = now_ms() - i64::try_from(silent.as_millis()).unwrap_or(i64::MAX);
        self.db
            .query(
                "list silent nodes",
                "SELECT name, seen_ms FROM nodes WHERE seen_ms <= ?1 AND name != ?2 ORDER BY name",
                params![cutoff, me],
            )
            .await?
            .iter()
            .map(|row| {
                Ok(SilentNode {
                    name: row.text(0)?,
                    seen_ms: row.int(1)?,
                })
            })
            .collect()
    }

    /// Removes `node` if it is still as silent as when it was found: true for the one
    /// caller that removed it (so one node closes its runs), false when another did,
    /// or it has spoken since.
    pub async fn claim_dead(&self, node: &SilentNode) -> Result<bool, StoreError> {
        let removed = self
            .db
            .execute(
                "remove a dead node",
                "DELETE FROM nodes WHERE name = ?1 AND seen_ms = ?2",
                params![&node.name, node.seen_ms],
            )
            .await?;
        Ok(removed == 1)
    }

    /// `name` is leaving (a server stopping, its runs recorded): nobody need close them.
    pub async fn leave(&self, name: &str) -> Result<(), StoreError> {
        self.db
            .execute(
                "remove this node",
                "DELETE FROM nodes WHERE name = ?1",
                params![name],
            )
            .await
            .map(drop)
    }
}
