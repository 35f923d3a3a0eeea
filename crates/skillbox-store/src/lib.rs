//! skillbox-store: where the files a run produced go. [`ArtifactStore`] keeps them
//! content-addressed and write-once on any `object_store` backend (the local filesystem
//! by default); [`collect_artifacts`] finds them in a workspace through the env, and
//! [`store_all`] puts them in the store.

mod budget;
mod collect;
mod db;
mod error;
mod grants;
mod keys;
mod nodes;
mod owners;
mod pg_tls;
mod records;
mod retention;
mod snapshots;
mod store;

pub use collect::{
    CollectLimits, CollectedFile, StoredArtifact, collect_artifacts, collection_walk, content_type,
    store_all,
};
pub use db::{Db, Engine, RecordsDb};
pub use error::{CollectLimit, StoreError};
pub use grants::{GrantRecords, KeptGrant};
pub use keys::{KEY_ID_DIGITS, KeyRecord, KeyRecords};
pub use nodes::{Nodes, SilentNode};
pub use owners::{ObjectOwners, OwnedObject};
pub use records::{LOCAL_TENANT, PlainRunRecord, RunRecord, RunRecords};
pub use retention::{GRACE, Pruned, Retention};
pub use snapshots::{
    DEFAULT_SCOPES_PER_TENANT, Manifest as SnapshotManifest, Restored as RestoredSnapshot,
    SnapshotEntry, SnapshotLimits, SnapshotSummary, Snapshots, check_scope_key,
    restore as restore_snapshot, save as save_snapshot, scope_id,
};
/// Every component's schema: what a Postgres database is brought up to when connected.
pub(crate) const ALL_SCHEMAS: [&db::Schema; 7] = [
    &records::SCHEMA,
    &grants::SCHEMA,
    &keys::SCHEMA,
    &owners::SCHEMA,
    &snapshots::SCHEMA,
    &nodes::SCHEMA,
    &budget::SCHEMA,
];

pub use store::{ArtifactStore, ArtifactStream, REFRESH_AFTER, is_sha256_hex, sha256_hex};
