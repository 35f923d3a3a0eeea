//! [`KeyRecords`]: the API keys of a records database, which every node sharing it
//! answers. A key is kept as the SHA-256 of its token (64 hex digits), never the
//! token, with the tenant it acts as. Its id is the first 16 digits of that hash: enough
//! to name it in `skillbox keys list` and `revoke`, and nothing a caller could sign in
//! with.

use crate::db::{Db, Migration, RecordsDb, Schema, Step, params};
use crate::error::StoreError;
use crate::records::now_ms;

/// How many hex digits of a key's hash name it.
pub const KEY_ID_DIGITS: usize = 16;

/// The keys of a records database.
#[derive(Debug, Clone)]
pub struct KeyRecords {
    db: Db,
}

/// A key as listed: never its hash whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// The first [`KEY_ID_DIGITS`] hex digits of the token's hash.
    pub id: String,
    pub tenant: String,
    pub created_ms: i64,
}

pub(crate) const SCHEMA: Schema = Schema {
    component: "api_keys",
    sqlite: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE IF NOT EXISTS api_keys (
                 digest TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 created_ms INTEGER NOT NULL
             )",
        )],
    }],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE api_keys (
                 digest TEXT PRIMARY KEY,
                 tenant TEXT NOT NULL,
                 created_ms BIGINT NOT NULL
             )",
        )],
    }],
};

impl KeyRecords {
    /// The keys' table (`<data>/keys.sqlite` on SQLite).
    pub fn open(at: &RecordsDb) -> Result<Self, StoreError> {
        let db = at.open(
            "keys.sqlite",
            "PRAGMA journal_mode = WAL; PRAGMA busy_timeout = 5000;",
            &SCHEMA,
        )?;
        Ok(KeyRecords { db })
    }

    /// Keeps the key whose token hashes to `digest` (64 lowercase hex digits) for
    /// `tenant`, and returns its id.
    pub async fn add(&self, tenant: &str, digest: &str) -> Result<String, StoreError> {
        if !crate::is_sha256_hex(digest) {
            return Err(StoreError::InvalidRecord {
                what: "an API key's hash".into(),
                reason: "not 64 lowercase hex digits".into(),
            });
        }
        self.db
            .execute(
                "add an API key",
                "INSERT INTO api_keys (digest, tenant, created_ms) VALUES (?1, ?2, ?3)",
                params![digest, tenant, now_ms()],
            )
            .await?;
        Ok(digest[..KEY_ID_DIGITS].to_string())
    }

    /// The tenant of the key whose token hashes to `digest`, if it is kept: one lookup
    /// by primary key. (Looked up by hash, not compared one by one: the hash of a token
    /// of 256 random bits gives a caller nothing to steer by the time the lookup takes.)
    pub async fn tenant_of(&self, digest: &str) -> Result<Option<String>, StoreError> {
        self.db
            .query_one(
                "look up an API key",
                "SELECT tenant FROM api_keys WHERE digest = ?1",
                params![digest],
            )
            .await?
            .map(|row| row.text(0))
            .transpose()
    }

    /// Every key, oldest first.
    pub async fn list(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.db
            .query(
                "list the API keys",
                "SELECT digest, tenant, created_ms FROM api_keys ORDER BY created_ms, digest",
                params![],
            )
            .await?
            .iter()
            .map(|row| {
                let digest = row.text(0)?;
                Ok(KeyRecord {
                    id: digest.get(..KEY_ID_DIGITS).unwrap_or(&digest).to_string(),
                    tenant: row.text(1)?,
                    created_ms: row.int(2)?,
                })
            })
            .collect()
    }

    /// Removes the key `id` names ([`KEY_ID_DIGITS`] hex digits, as listed): true when
    /// one went. Every node refuses it from its next request on.
    pub async fn revoke(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.trim().to_ascii_lowercase();
        if id.len() != KEY_ID_DIGITS || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(StoreError::InvalidRecord {
                what: format!("key id {id:?}"),
                reason: format!(
                    "an id is {KEY_ID_DIGITS} hex digits, as `skillbox keys list` shows it"
                ),
            });
        }
        // Compared on the prefix itself, not with LIKE: the id is all hex digits, and
        // substr reads the same on both engines. Its length is KEY_ID_DIGITS:
        const _: () = assert!(KEY_ID_DIGITS == 16, "the statement below takes 16 digits");
        let removed = self
            .db
            .execute(
                "revoke an API key",
                "DELETE FROM api_keys WHERE substr(digest, 1, 16) = ?1",
                params![id.as_str()],
            )
            .await?;
        Ok(removed > 0)
    }
}
