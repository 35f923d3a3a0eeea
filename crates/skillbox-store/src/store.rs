//! [`ArtifactStore`]: content-addressed, write-once objects on any `object_store`
//! backend. The key of an object is the sha256 of its bytes, stored under
//! `objects/<first 2 hex digits>/<sha256>`, so the same bytes always land in the same
//! place and a put of bytes already there is a no-op.
//!
//! # Nothing is overwritten, nothing is half-written
//!
//! Every put uses [`PutMode::Create`]: the store refuses to replace an existing object,
//! and that refusal (`AlreadyExists`) means the same bytes are already there.
//!
//! On the local filesystem (`object_store::local::LocalFileSystem`, 0.14) a
//! `Create` put writes the whole payload to a staging file `<key>#<n>` beside the
//! object, closes it, and only then publishes it with `hard_link(staging, key)` — which
//! fails instead of replacing — and unlinks the staging file. A process that dies
//! mid-write therefore leaves at most a `<key>#<n>` file, which `object_store` never
//! lists and refuses to address (a name ending in `#` and digits is not a valid key),
//! so it is never served; the next put of the same bytes picks a fresh staging name.
//! We turn on `with_fsync(true)` so the content and the directory entry are on disk
//! before a put returns: after a power loss the object is whole or absent, never a
//! truncated file under its final name. As a last line, [`ArtifactStore::get`] and
//! [`ArtifactStore::get_stream`] rehash what they read and report
//! [`StoreError::Corrupt`] rather than hand out bytes that are not what the key names.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{Stream, StreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    ObjectStore, ObjectStoreExt, ObjectStoreScheme, PutMode, PutOptions, PutPayload,
};
use sha2::{Digest, Sha256};
use url::Url;

use crate::budget::Budget;
use crate::db::RecordsDb;
use crate::error::StoreError;

/// Write-once, content-addressed artifact storage.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    recent: crate::retention::RecentPuts,
    budget: Option<Arc<Budget>>,
}

/// An object being read in chunks; the stream ends with [`StoreError::Corrupt`] instead
/// of `None` when the bytes read do not hash to the key.
pub struct ArtifactStream {
    /// The object's size in bytes.
    pub size: u64,
    pub stream: BoxStream<'static, Result<Bytes, StoreError>>,
}

impl fmt::Debug for ArtifactStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactStream")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl ArtifactStore {
    /// A store over any `object_store` backend, with every key under `prefix`.
    pub fn new(store: Arc<dyn ObjectStore>, prefix: Path) -> Self {
        ArtifactStore {
            store,
            prefix,
            recent: Default::default(),
            budget: None,
        }
    }

    /// This store with a budget of `max_bytes` for all objects together (the server's
    /// `--store-budget`), counted in this process: a put of new bytes that would take it
    /// past is [`StoreError::QuotaExceeded`], and nothing of it is written. What is
    /// stored now is counted first, from a listing.
    pub async fn with_budget(mut self, max_bytes: u64) -> Result<Self, StoreError> {
        let used = self.stored_bytes().await?;
        self.budget = Some(Arc::new(Budget::local(max_bytes, used)));
        Ok(self)
    }

    /// This store with a budget of `max_bytes`, counted where `records` are: in this
    /// process on SQLite files (a data dir is one server's: [`Self::with_budget`]),
    /// and on Postgres in one row of the database for this store (its bucket or
    /// directory and its prefix), which every server sharing the database and the
    /// store takes from and gives back to, so their puts together cannot pass it.
    ///
    /// The row is set from a listing of the store here, as each server starts: the
    /// listing is the truth. It can miss by a put's size: a put another server has
    /// taken its bytes for but not yet written while this one lists is not counted
    /// (under by its size), and an object another server removes meanwhile still is
    /// (over). A server killed between a put's take and its write, or before a failed
    /// put gives back, leaves those bytes counted (over, never under: the store stays
    /// within its budget) until the next server start counts again. Every server
    /// sharing the store should have the same budget: each refuses a put past its own.
    pub async fn with_budget_in(
        mut self,
        max_bytes: u64,
        records: &RecordsDb,
    ) -> Result<Self, StoreError> {
        let RecordsDb::Postgres(db) = records else {
            return self.with_budget(max_bytes).await;
        };
        let used = self.stored_bytes().await?;
        let name = format!("{}/{}", self.store, self.prefix);
        let budget = Budget::shared(max_bytes, db.clone(), name, used).await?;
        self.budget = Some(Arc::new(budget));
        Ok(self)
    }

    /// The bytes of every object stored now, from a listing.
    async fn stored_bytes(&self) -> Result<u64, StoreError> {
        use futures_util::TryStreamExt;
        self.store
            .list(Some(&self.objects_prefix()))
            .map_err(|e| StoreError::backend("list", e))
            .try_fold(0u64, |total, meta| async move {
                let name = meta.location.filename().unwrap_or_default();
                Ok(if is_sha256_hex(name) {
                    total + meta.size
                } else {
                    total
                })
            })
            .await
    }

    /// Whether the contents not stored yet among `contents` would fit the budget now
    /// (always, without one): a caller about to store several objects asks first, so a
    /// set that cannot fit is refused before any of it is written.
    pub async fn check_room_for(
        &self,
        contents: impl Iterator<Item = &Bytes>,
    ) -> Result<(), StoreError> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        let mut bytes = 0u64;
        let mut seen = std::collections::HashSet::new();
        for content in contents {
            let sha256 = sha256_hex(content);
            if seen.insert(sha256.clone()) && self.head(&sha256).await?.is_none() {
                bytes += content.len() as u64;
            }
        }
        budget.fits(bytes).await
    }

    /// A store in the local directory `dir`, created if missing.
    pub async fn local(dir: &std::path::Path) -> Result<Self, StoreError> {
        let io_error = |op, source| StoreError::Io {
            op,
            path: dir.display().to_string(),
            source,
        };
        tokio::fs::create_dir_all(dir)
            .await
            .map_err(|e| io_error("create directory", e))?;
        let local = LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| StoreError::backend("open local store", e))?
            .with_fsync(true);
        Ok(Self::new(Arc::new(local), Path::default()))
    }

    /// A store named by a URL: `file:///abs/dir` is [`ArtifactStore::local`];
    /// `s3://bucket/prefix` an S3 bucket (`ArtifactStore::s3`) with this process's `AWS_*`
    /// variables; any other URL goes to `object_store::parse_url` (`memory://`).
    pub async fn from_url(url: &str) -> Result<Self, StoreError> {
        let vars = std::env::vars_os()
            .filter_map(|(key, value)| Some((key.into_string().ok()?, value.into_string().ok()?)));
        Self::from_url_with(url, vars).await
    }

    /// [`ArtifactStore::from_url`] with the `AWS_*` variables given, not this process's.
    pub async fn from_url_with(
        url: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, StoreError> {
        let parsed = Url::parse(url).map_err(|e| StoreError::InvalidUrl {
            url: url.to_string(),
            reason: e.to_string(),
        })?;
        let shown = redacted(&parsed);
        if parsed.scheme() == "file" {
            let dir = parsed.to_file_path().map_err(|()| StoreError::InvalidUrl {
                url: shown.clone(),
                reason: "a file URL needs an absolute path and no host, \
                             like file:///var/lib/skillbox/objects"
                    .to_string(),
            })?;
            return Self::local(&dir).await;
        }
        if parsed.scheme() == "s3" {
            return Self::s3(&parsed, &shown, vars).await;
        }
        match object_store::parse_url(&parsed) {
            Ok((store, prefix)) => Ok(Self::new(Arc::from(store), prefix)),
            // A scheme object_store knows, but whose feature is off in this build.
            Err(e) if ObjectStoreScheme::parse(&parsed).is_ok() => {
                Err(StoreError::UnsupportedUrl {
                    url: shown,
                    reason: e.to_string(),
                })
            }
            Err(e) => Err(StoreError::InvalidUrl {
                url: shown,
                reason: e.to_string(),
            }),
        }
    }

    /// A store in the S3 bucket of `url` (`s3://bucket/prefix`), every key under the
    /// prefix, with what the usual AWS variables in `vars` say: `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, and for a store that
    /// is not Amazon's, `AWS_ENDPOINT_URL` (with `AWS_ALLOW_HTTP=true` for a plain-HTTP
    /// one). Puts are conditional (`If-None-Match: *`), so a store must support S3's
    /// conditional writes (Amazon S3 since 2024, MinIO, R2, Garage, moto). The bucket
    /// is listed once before this returns: a bucket that is missing or refuses these
    /// credentials fails here, not at the first run's put.
    async fn s3(
        url: &Url,
        shown: &str,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, StoreError> {
        use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
        // The S3 client's TLS is rustls, which takes its provider from the process:
        // ring, as everywhere in skillbox. Installed once; a second install is refused
        // and harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // As `AmazonS3Builder::from_env` reads them, from the variables given.
        let mut builder = AmazonS3Builder::new();
        for (key, value) in vars {
            if key.starts_with("AWS_")
                && let Ok(key) = key.to_ascii_lowercase().parse::<AmazonS3ConfigKey>()
            {
                builder = builder.with_config(key, value);
            }
        }
        // Bounded: a store that does not answer fails a put, a download or the server's
        // start within seconds, not after object_store's default of three minutes.
        let retry = object_store::RetryConfig {
            max_retries: 4,
            retry_timeout: std::time::Duration::from_secs(30),
            ..object_store::RetryConfig::default()
        };
        let store = builder
            .with_retry(retry)
            .with_url(url.as_str())
            .build()
            .map_err(|e| StoreError::InvalidUrl {
                url: shown.to_string(),
                reason: e.to_string(),
            })?;
        let prefix = Path::from_url_path(url.path()).map_err(|e| StoreError::InvalidUrl {
            url: shown.to_string(),
            reason: e.to_string(),
        })?;
        let store = Self::new(Arc::new(store), prefix);
        store
            .store
            .list_with_delimiter(Some(&store.objects_prefix()))
            .await
            .map_err(|e| StoreError::Unreachable {
                url: shown.to_string(),
                source: e,
            })?;
        Ok(store)
    }

    /// Stores `bytes` under their sha256 and returns it (lowercase hex). Storing bytes
    /// that are already there is a no-op; an existing object is never replaced. With a
    /// budget, new bytes that would take the store past it are
    /// [`StoreError::QuotaExceeded`], and nothing is written. The budget counts what
    /// the puts and prunes of this store do (of every server's, for a budget counted in
    /// a shared database): another process writing the same directory (a CLI run on the
    /// server's data dir) is seen at the next open.
    pub async fn put_once(&self, bytes: Bytes) -> Result<String, StoreError> {
        let sha256 = sha256_hex(&bytes);
        // Before the put: retention never removes what a live run is storing.
        self.recent.note(&sha256);
        let path = self.object_path(&sha256);
        let size = bytes.len() as u64;
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        // Taken before the put, so puts at once cannot go past the budget together;
        // given back when the bytes were there already, or the put failed.
        if let Some(budget) = &self.budget
            && let Err(refused) = budget.take(size).await
        {
            // Bytes already stored cost nothing more: a put of them is no put.
            return match self.store.head(&path).await {
                Ok(meta) if meta.size == size => {
                    self.keep_fresh(&path, &meta, bytes).await?;
                    Ok(sha256)
                }
                _ => Err(refused),
            };
        }
        let put = self
            .store
            .put_opts(&path, PutPayload::from(bytes.clone()), create)
            .await;
        if let (Some(budget), Err(_)) = (&self.budget, &put) {
            budget.give_back(size).await;
        }
        match put {
            Ok(_) => {
                tracing::debug!(%sha256, size, "artifact stored");
                Ok(sha256)
            }
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Same key, so the same bytes, unless the object was damaged after it was
                // written: a size check costs one stat and catches a truncated file.
                let meta = self
                    .store
                    .head(&path)
                    .await
                    .map_err(|e| StoreError::backend("head", e))?;
                if meta.size != size {
                    return Err(StoreError::Corrupt {
                        sha256,
                        detail: format!("it holds {} bytes, the content has {size}", meta.size),
                    });
                }
                self.keep_fresh(&path, &meta, bytes).await?;
                tracing::debug!(%sha256, size, "artifact already stored");
                Ok(sha256)
            }
            Err(e) => Err(StoreError::backend("put", e)),
        }
    }

    /// Makes an object that a put found already stored look just put, to every
    /// process that shares the store: retention judges by the object's time, and
    /// another server on the same bucket (or a CLI run on the server's data dir) does
    /// not see this process's puts. Past [`REFRESH_AFTER`] the same bytes are written
    /// again over it (an atomic replace, by bytes whose hash is the key: the content
    /// cannot change); younger, it is left alone.
    async fn keep_fresh(
        &self,
        path: &Path,
        meta: &object_store::ObjectMeta,
        bytes: Bytes,
    ) -> Result<(), StoreError> {
        let age = age_of(meta);
        if age < REFRESH_AFTER {
            return Ok(());
        }
        self.store
            .put_opts(path, PutPayload::from(bytes), PutOptions::default())
            .await
            .map_err(|e| StoreError::backend("put", e))?;
        tracing::debug!(path = %path, age_s = age.as_secs(), "artifact refreshed");
        Ok(())
    }

    /// The whole object named by `sha256`.
    pub async fn get(&self, sha256: &str) -> Result<Bytes, StoreError> {
        let path = self.checked_path(sha256)?;
        let result = self
            .store
            .get(&path)
            .await
            .map_err(|e| missing_or(e, sha256, "get"))?;
        let bytes = result
            .bytes()
            .await
            .map_err(|e| missing_or(e, sha256, "get"))?;
        let actual = sha256_hex(&bytes);
        if actual != sha256 {
            return Err(StoreError::Corrupt {
                sha256: sha256.to_string(),
                detail: format!("its bytes hash to {actual}"),
            });
        }
        Ok(bytes)
    }

    /// The object named by `sha256`, in chunks, with its size up front (for a
    /// `Content-Length`). The hash is checked as the chunks pass: a corrupt object ends
    /// the stream with an error instead of a clean end.
    pub async fn get_stream(&self, sha256: &str) -> Result<ArtifactStream, StoreError> {
        let path = self.checked_path(sha256)?;
        let result = self
            .store
            .get(&path)
            .await
            .map_err(|e| missing_or(e, sha256, "get"))?;
        let size = result.meta.size;
        let verified = Verified {
            inner: result.into_stream(),
            sha256: sha256.to_string(),
            hasher: Some(Sha256::new()),
        };
        Ok(ArtifactStream {
            size,
            stream: Box::pin(verified),
        })
    }

    /// Bytes `range` (end exclusive, within the object) of the object named by
    /// `sha256`, in chunks. A part cannot be checked against the key: only whole reads
    /// ([`ArtifactStore::get`], [`ArtifactStore::get_stream`]) verify the hash.
    pub async fn get_range(
        &self,
        sha256: &str,
        range: std::ops::Range<u64>,
    ) -> Result<ArtifactStream, StoreError> {
        let path = self.checked_path(sha256)?;
        let options = object_store::GetOptions {
            range: Some(object_store::GetRange::Bounded(range.clone())),
            ..object_store::GetOptions::default()
        };
        let result = self
            .store
            .get_opts(&path, options)
            .await
            .map_err(|e| missing_or(e, sha256, "get"))?;
        let stream = result
            .into_stream()
            .map(|chunk| chunk.map_err(|e| StoreError::backend("get", e)));
        Ok(ArtifactStream {
            size: range.end - range.start,
            stream: Box::pin(stream),
        })
    }

    /// The size of the object named by `sha256`, or `None` when there is none.
    pub async fn head(&self, sha256: &str) -> Result<Option<u64>, StoreError> {
        let path = self.checked_path(sha256)?;
        match self.store.head(&path).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(StoreError::backend("head", e)),
        }
    }

    /// The key after checking it is a sha256, so nothing else reaches the store.
    fn checked_path(&self, sha256: &str) -> Result<Path, StoreError> {
        if !is_sha256_hex(sha256) {
            return Err(StoreError::InvalidKey {
                key: sha256.chars().take(80).collect(),
            });
        }
        Ok(self.object_path(sha256))
    }

    pub(crate) fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(crate) fn recent(&self) -> &crate::retention::RecentPuts {
        &self.recent
    }

    pub(crate) fn budget(&self) -> Option<&Budget> {
        self.budget.as_deref()
    }

    pub(crate) fn objects_prefix(&self) -> Path {
        self.prefix.clone().join("objects")
    }

    pub(crate) fn object_path(&self, sha256: &str) -> Path {
        self.prefix
            .clone()
            .join("objects")
            .join(&sha256[..2])
            .join(sha256)
    }
}

/// How old an object a put finds already stored may be before the put writes it again
/// ([`ArtifactStore::keep_fresh`]): well inside retention's grace time, so every object
/// a live run put or found looks less than [`crate::GRACE`] old to every process.
pub const REFRESH_AFTER: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// How long ago the object was last written (zero for a time ahead of this host's
/// clock).
fn age_of(meta: &object_store::ObjectMeta) -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::from(meta.last_modified))
        .unwrap_or_default()
}

/// The sha256 of `bytes` as 64 lowercase hex digits: an artifact's key.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// True for exactly 64 lowercase hex digits.
pub fn is_sha256_hex(key: &str) -> bool {
    key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in digest {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
    }
    out
}

fn missing_or(err: object_store::Error, sha256: &str, op: &'static str) -> StoreError {
    match err {
        object_store::Error::NotFound { .. } => StoreError::NotFound {
            sha256: sha256.to_string(),
        },
        other => StoreError::backend(op, other),
    }
}

/// The URL as it may appear in an error: without a password.
fn redacted(url: &Url) -> String {
    let mut shown = url.clone();
    if shown.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    shown.to_string()
}

/// Hashes the chunks as they pass and turns a wrong hash at the end into an error.
struct Verified {
    inner: BoxStream<'static, object_store::Result<Bytes>>,
    sha256: String,
    /// `None` once the stream has ended (or failed).
    hasher: Option<Sha256>,
}

impl Stream for Verified {
    type Item = Result<Bytes, StoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(hasher) = this.hasher.as_mut() else {
            return Poll::Ready(None);
        };
        match futures_util::ready!(this.inner.as_mut().poll_next(cx)) {
            Some(Ok(chunk)) => {
                hasher.update(&chunk);
                Poll::Ready(Some(Ok(chunk)))
            }
            Some(Err(e)) => {
                this.hasher = None;
                Poll::Ready(Some(Err(missing_or(e, &this.sha256, "get"))))
            }
            None => {
                let actual = this
                    .hasher
                    .take()
                    .map(|h| hex(&h.finalize()))
                    .unwrap_or_default();
                if actual == this.sha256 {
                    Poll::Ready(None)
                } else {
                    Poll::Ready(Some(Err(StoreError::Corrupt {
                        sha256: this.sha256.clone(),
                        detail: format!("its bytes hash to {actual}"),
                    })))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn keys_must_be_lowercase_sha256_hex() {
        assert!(is_sha256_hex(&sha256_hex(b"")));
        assert!(!is_sha256_hex(&sha256_hex(b"").to_uppercase()));
        assert!(!is_sha256_hex("abc"));
        assert!(!is_sha256_hex(&format!("../{}", &sha256_hex(b"")[3..])));
        assert!(!is_sha256_hex(&format!("{}g", &sha256_hex(b"")[1..])));
    }
}
