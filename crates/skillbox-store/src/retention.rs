//! Retention: the artifact store and the agent run records do not grow for ever. Objects
//! go oldest first once they pass an age or the store passes a byte budget; never one
//! put within [`GRACE`] (by this process, a dedup hit included, or by its file's time),
//! which covers every live run (a run or agent run lasts at most 10 minutes) and the
//! download right after it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures_util::TryStreamExt;
use object_store::ObjectStoreExt;

use crate::error::StoreError;
use crate::store::{ArtifactStore, is_sha256_hex};

/// How long a freshly put object is never removed.
pub const GRACE: Duration = Duration::from_secs(15 * 60);

/// What may stay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    /// Bytes of all objects together; the oldest go first past it.
    pub max_bytes: Option<u64>,
    /// Objects older than this go.
    pub max_age: Option<Duration>,
}

/// What one pass removed and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The sha256 of each object removed, oldest first.
    pub removed: Vec<String>,
    pub removed_bytes: u64,
    pub kept: usize,
    pub kept_bytes: u64,
}

/// The objects this process put recently (a put of bytes already there too, which
/// leaves the file's time as it was).
#[derive(Debug, Clone, Default)]
pub(crate) struct RecentPuts(Arc<Mutex<HashMap<String, Instant>>>);

impl RecentPuts {
    pub(crate) fn note(&self, sha256: &str) {
        if let Ok(mut recent) = self.0.lock() {
            let now = Instant::now();
            recent.retain(|_, at| now.duration_since(*at) < GRACE);
            recent.insert(sha256.to_string(), now);
        }
    }

    fn holds(&self, sha256: &str) -> bool {
        self.0
            .lock()
            .is_ok_and(|recent| recent.get(sha256).is_some_and(|at| at.elapsed() < GRACE))
    }
}

impl ArtifactStore {
    /// Removes objects past `retention`, oldest first, never one in its grace time.
    pub async fn prune(&self, retention: Retention) -> Result<Pruned, StoreError> {
        self.prune_keeping(retention, &std::collections::HashSet::new())
            .await
    }

    /// As [`prune`](Self::prune), never removing an object in `keep` (what a kept
    /// workspace snapshot needs).
    pub async fn prune_keeping(
        &self,
        retention: Retention,
        keep: &std::collections::HashSet<String>,
    ) -> Result<Pruned, StoreError> {
        if let Some(budget) = self.budget() {
            budget.forget_old_removals().await;
        }
        let mut objects: Vec<(SystemTime, String, u64)> = self
            .inner()
            .list(Some(&self.objects_prefix()))
            .map_err(|e| StoreError::backend("list", e))
            .try_filter_map(|meta| async move {
                let name = meta.location.filename().unwrap_or_default().to_string();
                Ok(is_sha256_hex(&name)
                    .then(|| (SystemTime::from(meta.last_modified), name, meta.size)))
            })
            .try_collect()
            .await?;
        objects.sort();
        let mut total: u64 = objects.iter().map(|(_, _, size)| *size).sum();
        let now = SystemTime::now();
        let mut pruned = Pruned::default();
        for (modified, sha256, size) in objects {
            let age = now.duration_since(modified).unwrap_or_default();
            let over_age = retention.max_age.is_some_and(|max| age > max);
            let over_budget = retention.max_bytes.is_some_and(|max| total > max);
            let in_grace = age < GRACE || self.recent().holds(&sha256) || keep.contains(&sha256);
            if (over_age || over_budget) && !in_grace {
                match self.inner().delete(&self.object_path(&sha256)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                        if let Some(budget) = self.budget() {
                            budget.give_back_removed(&sha256, modified, size).await;
                        }
                        total -= size;
                        pruned.removed_bytes += size;
                        pruned.removed.push(sha256);
                        continue;
                    }
                    Err(e) => return Err(StoreError::backend("delete", e)),
                }
            }
            pruned.kept += 1;
            pruned.kept_bytes += size;
        }
        if !pruned.removed.is_empty() {
            tracing::info!(
                removed = pruned.removed.len(),
                bytes = pruned.removed_bytes,
                kept_bytes = pruned.kept_bytes,
                "store: retention removed old objects"
            );
        }
        Ok(pruned)
    }
}
