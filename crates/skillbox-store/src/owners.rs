//! [`ObjectOwners`]: which tenant may read which stored object, and as what content
//! type. The store is content-addressed and shared, so the same bytes are stored once
//! whoever made them; this index is what keeps one tenant from reading (or learning of)
//! another's: a tenant sees an object only once one of its own runs produced it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::StoreError;
use crate::records::{db_error, now_ms};

/// The object index of one data dir (`<data>/object-owners.sqlite`).
#[derive(Debug, Clone)]
pub struct ObjectOwners {
    db: Arc<Mutex<Connection>>,
}

/// An object as one tenant owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedObject {
    pub size: u64,
    /// The content type recorded when it was stored (from the artifact's path).
    pub content_type: String,
}

impl ObjectOwners {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = Connection::open(path).map_err(db_error("open the object index"))?;
        db.execute_batch(
            "PRAGMA journal_mode = WAL;
             PRAGMA busy_timeout = 5000;
             CREATE TABLE IF NOT EXISTS object_owners (
                 tenant TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 size INTEGER NOT NULL,
                 content_type TEXT NOT NULL,
                 created_ms INTEGER NOT NULL,
                 PRIMARY KEY (tenant, sha256)
             );",
        )
        .map_err(db_error("create the object index"))?;
        Ok(ObjectOwners {
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

    /// Records that `tenant` made the object `sha256`. The first content type stays.
    pub fn grant(
        &self,
        tenant: &str,
        sha256: &str,
        size: u64,
        content_type: &str,
    ) -> Result<(), StoreError> {
        let now = now_ms();
        self.with("record an object's owner", |db| {
            db.execute(
                "INSERT OR IGNORE INTO object_owners (tenant, sha256, size, content_type, created_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![tenant, sha256, size as i64, content_type, now],
            )
            .map(drop)
        })
    }

    /// Forgets the objects retention removed: no tenant owns them any more.
    pub fn forget(&self, removed: &[String]) -> Result<(), StoreError> {
        self.with("forget removed objects", |db| {
            let mut statement = db.prepare("DELETE FROM object_owners WHERE sha256 = ?1")?;
            for sha256 in removed {
                statement.execute(params![sha256])?;
            }
            Ok(())
        })
    }

    /// The object as `tenant` owns it; `None` when its runs never made it (whether or
    /// not another tenant did).
    pub fn get(&self, tenant: &str, sha256: &str) -> Result<Option<OwnedObject>, StoreError> {
        self.with("read an object's owner", |db| {
            db.query_row(
                "SELECT size, content_type FROM object_owners WHERE tenant = ?1 AND sha256 = ?2",
                params![tenant, sha256],
                |row| {
                    Ok(OwnedObject {
                        size: row.get::<_, i64>(0)?.max(0) as u64,
                        content_type: row.get(1)?,
                    })
                },
            )
            .optional()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_sees_only_what_its_runs_made() {
        let dir = tempfile::tempdir().expect("tempdir");
        let owners = ObjectOwners::open(&dir.path().join("o.sqlite")).expect("open");
        owners.grant("a", "abc", 3, "text/plain").expect("grant");
        assert_eq!(
            owners.get("a", "abc").expect("get"),
            Some(OwnedObject {
                size: 3,
                content_type: "text/plain".into()
            })
        );
        assert_eq!(owners.get("b", "abc").expect("get"), None);
        // The same bytes made by b: b owns them too, with its own type; a's stays.
        owners
            .grant("b", "abc", 3, "application/json")
            .expect("grant");
        owners
            .grant("a", "abc", 3, "image/png")
            .expect("grant again");
        assert_eq!(
            owners.get("b", "abc").expect("get").map(|o| o.content_type),
            Some("application/json".into())
        );
        assert_eq!(
            owners.get("a", "abc").expect("get").map(|o| o.content_type),
            Some("text/plain".into())
        );
    }
}
