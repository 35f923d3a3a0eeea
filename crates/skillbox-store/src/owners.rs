//! [`ObjectOwners`]: which tenant may read which stored object, and as what content
//! type. The store is content-addressed and shared, so the same bytes are stored once
//! whoever made them; this index is what keeps one tenant from reading (or learning of)
//! another's: a tenant sees an object only once one of its own runs produced it.

use crate::db::{Db, Migration, RecordsDb, Schema, Step, params};
use crate::error::StoreError;
use crate::records::now_ms;

/// The object index (`<data>/object-owners.sqlite`, or a table of the shared database).
#[derive(Debug, Clone)]
pub struct ObjectOwners {
    db: Db,
}

/// An object as one tenant owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedObject {
    pub size: u64,
    /// The content type recorded when it was stored (from the artifact's path).
    pub content_type: String,
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "owners",
    sqlite: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE IF NOT EXISTS object_owners (
                 tenant TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 size INTEGER NOT NULL,
                 content_type TEXT NOT NULL,
                 created_ms INTEGER NOT NULL,
                 PRIMARY KEY (tenant, sha256)
             )",
        )],
    }],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE object_owners (
                 tenant TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 size BIGINT NOT NULL,
                 content_type TEXT NOT NULL,
                 created_ms BIGINT NOT NULL,
                 PRIMARY KEY (tenant, sha256)
             );
             CREATE INDEX object_owners_by_sha256 ON object_owners (sha256);",
        )],
    }],
};

impl ObjectOwners {
    pub fn open(at: &RecordsDb) -> Result<Self, StoreError> {
        let db = at.open(
            "object-owners.sqlite",
            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;",
            &SCHEMA,
        )?;
        Ok(ObjectOwners { db })
    }

    /// Records that `tenant` made the object `sha256`. The first content type stays.
    pub async fn grant(
        &self,
        tenant: &str,
        sha256: &str,
        size: u64,
        content_type: &str,
    ) -> Result<(), StoreError> {
        self.db
            .execute(
                "record an object's owner",
                "INSERT INTO object_owners (tenant, sha256, size, content_type, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                params![
                    tenant,
                    sha256,
                    i64::try_from(size).unwrap_or(i64::MAX),
                    content_type,
                    now_ms()
                ],
            )
            .await
            .map(drop)
    }

    /// Forgets the objects retention removed: no tenant owns them any more.
    pub async fn forget(&self, removed: &[String]) -> Result<(), StoreError> {
        for sha256 in removed {
            self.db
                .execute(
                    "forget removed objects",
                    "DELETE FROM object_owners WHERE sha256 = ?1",
                    params![sha256],
                )
                .await?;
        }
        Ok(())
    }

    /// The object as `tenant` owns it; `None` when its runs never made it (whether or
    /// not another tenant did).
    pub async fn get(&self, tenant: &str, sha256: &str) -> Result<Option<OwnedObject>, StoreError> {
        let Some(row) = self
            .db
            .query_one(
                "read an object's owner",
                "SELECT size, content_type FROM object_owners WHERE tenant = ?1 AND sha256 = ?2",
                params![tenant, sha256],
            )
            .await?
        else {
            return Ok(None);
        };
        Ok(Some(OwnedObject {
            size: row.int(0)?.max(0) as u64,
            content_type: row.text(1)?,
        }))
    }
}
