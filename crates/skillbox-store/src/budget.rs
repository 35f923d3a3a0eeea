//! [`Budget`]: the bytes all of a store's objects may take together (`serve
//! --store-budget`), and what they take now. A server on its data dir counts in its own
//! memory; servers sharing a Postgres database (and through it one bucket) count in one
//! row of that database, so that their puts together cannot pass the budget.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::db::{Db, Migration, Schema, Step, params};
use crate::error::StoreError;
use crate::records::now_ms;

/// How long the claim of a removal is kept: far longer than a retention pass lasts, so
/// two passes that listed the same object never both give it back.
const REMOVALS_KEPT: Duration = Duration::from_secs(24 * 3600);

pub(crate) const SCHEMA: Schema = Schema {
    component: "store_budget",
    // A data dir's store is counted in its process (`Count::Local`): no table.
    sqlite: &[],
    postgres: &[Migration {
        version: 1,
        steps: &[Step::Sql(
            "CREATE TABLE store_budget (
                 store TEXT PRIMARY KEY,
                 used BIGINT NOT NULL
             );
             CREATE TABLE store_budget_removals (
                 store TEXT NOT NULL,
                 sha256 TEXT NOT NULL,
                 modified_ms BIGINT NOT NULL,
                 removed_ms BIGINT NOT NULL,
                 PRIMARY KEY (store, sha256, modified_ms)
             );",
        )],
    }],
};

/// The bytes all objects may take together, and what they take now: counted from a
/// listing when the budget is set, then kept by every put and every removal.
#[derive(Debug)]
pub(crate) struct Budget {
    max: u64,
    count: Count,
}

#[derive(Debug)]
enum Count {
    /// In this process: the store is one server's.
    Local(AtomicU64),
    /// The row of `store_budget` named `store`, which every server sharing the database
    /// and the store takes from and gives back to.
    Shared { db: Db, store: String },
}

impl Budget {
    /// A budget counted in this process, `used` bytes taken already.
    pub(crate) fn local(max: u64, used: u64) -> Budget {
        Budget {
            max,
            count: Count::Local(used.into()),
        }
    }

    /// A budget counted in `db`'s row for `store`, set to `used` (what a listing of the
    /// store found just now): the listing is the truth, whatever the row said before.
    pub(crate) async fn shared(
        max: u64,
        db: Db,
        store: String,
        used: u64,
    ) -> Result<Budget, StoreError> {
        db.execute(
            "count the store's bytes",
            "INSERT INTO store_budget (store, used) VALUES (?1, ?2)
             ON CONFLICT (store) DO UPDATE SET used = EXCLUDED.used",
            params![store.as_str(), to_i64(used)],
        )
        .await?;
        Ok(Budget {
            max,
            count: Count::Shared { db, store },
        })
    }

    /// Takes `bytes` of the budget, or none of it when they do not fit.
    pub(crate) async fn take(&self, bytes: u64) -> Result<(), StoreError> {
        match &self.count {
            Count::Local(used) => used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                    used.checked_add(bytes).filter(|total| *total <= self.max)
                })
                .map(drop)
                .map_err(|used| self.exceeded(bytes, used)),
            Count::Shared { db, store } => {
                // One conditional statement: takes at once from several nodes are
                // serialized by the row, and none takes past the budget.
                if let Some(room) = self.max.checked_sub(bytes) {
                    let taken = db
                        .execute(
                            "take from the store budget",
                            "UPDATE store_budget SET used = used + ?2
                             WHERE store = ?1 AND used <= ?3",
                            params![store.as_str(), to_i64(bytes), to_i64(room)],
                        )
                        .await?;
                    if taken == 1 {
                        return Ok(());
                    }
                }
                Err(self.exceeded(bytes, self.used().await?))
            }
        }
    }

    /// Whether `bytes` more would fit now, taking nothing: a caller about to store
    /// several objects asks first.
    pub(crate) async fn fits(&self, bytes: u64) -> Result<(), StoreError> {
        let used = self.used().await?;
        if used.saturating_add(bytes) > self.max {
            return Err(self.exceeded(bytes, used));
        }
        Ok(())
    }

    /// Gives back `bytes` taken for a put that stored nothing new.
    pub(crate) async fn give_back(&self, bytes: u64) {
        match &self.count {
            Count::Local(used) => {
                let _ = used.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                    Some(used.saturating_sub(bytes))
                });
            }
            Count::Shared { db, store } => {
                let given = db
                    .execute(
                        "give back to the store budget",
                        "UPDATE store_budget SET used = GREATEST(used - ?2, 0) WHERE store = ?1",
                        params![store.as_str(), to_i64(bytes)],
                    )
                    .await;
                if let Err(e) = given {
                    tracing::warn!(error = %e, bytes, "store budget: cannot give back; counted until a server starts");
                }
            }
        }
    }

    /// Gives back the `size` bytes of object `sha256`, last written at `modified`, that
    /// a retention pass listed and then removed (or found removed). A shared count gives
    /// each removal back once, to the first node to claim it: two nodes' passes may
    /// list and delete the same object at once, and S3's delete does not say whether
    /// the object was still there.
    pub(crate) async fn give_back_removed(&self, sha256: &str, modified: SystemTime, size: u64) {
        let Count::Shared { db, store } = &self.count else {
            // This process counted every object it listed.
            return self.give_back(size).await;
        };
        let modified_ms = modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let given = db
            .execute(
                "give back a removed object to the store budget",
                "WITH claimed AS (
                     INSERT INTO store_budget_removals (store, sha256, modified_ms, removed_ms)
                     VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT DO NOTHING
                     RETURNING 1
                 )
                 UPDATE store_budget SET used = GREATEST(used - ?5, 0)
                 WHERE store = ?1 AND EXISTS (SELECT 1 FROM claimed)",
                params![store.as_str(), sha256, modified_ms, now_ms(), to_i64(size)],
            )
            .await;
        if let Err(e) = given {
            tracing::warn!(error = %e, %sha256, size, "store budget: cannot give back a removed object; counted until a server starts");
        }
    }

    /// Forgets the claims of removals older than [`REMOVALS_KEPT`] (a retention pass
    /// begins: no pass still running listed what they name).
    pub(crate) async fn forget_old_removals(&self) {
        let Count::Shared { db, store } = &self.count else {
            return;
        };
        let cutoff = now_ms() - i64::try_from(REMOVALS_KEPT.as_millis()).unwrap_or(i64::MAX);
        if let Err(e) = db
            .execute(
                "forget old removals of the store budget",
                "DELETE FROM store_budget_removals WHERE store = ?1 AND removed_ms < ?2",
                params![store.as_str(), cutoff],
            )
            .await
        {
            tracing::warn!(error = %e, "store budget: cannot forget old removals");
        }
    }

    /// The bytes taken now.
    async fn used(&self) -> Result<u64, StoreError> {
        match &self.count {
            Count::Local(used) => Ok(used.load(Ordering::SeqCst)),
            Count::Shared { db, store } => {
                let op = "read the store budget";
                let row = db
                    .query_one(
                        op,
                        "SELECT used FROM store_budget WHERE store = ?1",
                        params![store.as_str()],
                    )
                    .await?
                    .ok_or_else(|| StoreError::Records {
                        op: op.into(),
                        detail: format!(
                            "no row for {store} in store_budget (a server sets it when it \
                             starts with --store-budget): restart a server"
                        ),
                    })?;
                Ok(u64::try_from(row.int(0)?).unwrap_or(0))
            }
        }
    }

    fn exceeded(&self, needed: u64, used: u64) -> StoreError {
        StoreError::QuotaExceeded {
            needed,
            used,
            budget: self.max,
        }
    }
}

/// A byte count as a Postgres `BIGINT` (no store holds 8 EiB).
fn to_i64(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}
