//! The one error type of this crate, and its mapping to the stable [`ErrorCode`]s that
//! callers put on the wire.

use std::fmt;

use skillbox_env::{EnvError, ErrorCode};

/// Which of the [`CollectLimits`](crate::CollectLimits) a collection ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectLimit {
    MaxFiles,
    MaxTotalBytes,
    MaxFileBytes,
}

impl CollectLimit {
    /// The field name, as a caller configures it.
    pub fn as_str(self) -> &'static str {
        match self {
            CollectLimit::MaxFiles => "max_files",
            CollectLimit::MaxTotalBytes => "max_total_bytes",
            CollectLimit::MaxFileBytes => "max_file_bytes",
        }
    }
}

impl fmt::Display for CollectLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything that can go wrong storing, fetching or collecting artifacts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The key is not a sha256: the store was not touched.
    #[error("invalid artifact key {key:?}: expected a sha256 as 64 lowercase hex digits")]
    InvalidKey { key: String },

    /// The store URL cannot be parsed or names no store at all.
    #[error("invalid artifact store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// The URL names a store this build has no support for (a cloud store whose
    /// `object_store` feature is off).
    #[error(
        "artifact store URL {url:?} is not supported by this build \
         (file://, s3:// and memory:// are): {reason}"
    )]
    UnsupportedUrl { url: String, reason: String },

    /// The store named by a URL did not answer a listing when it was opened: no such
    /// bucket, credentials it refuses, or nothing listening.
    #[error(
        "artifact store {url}: cannot list it ({source}); check that the bucket exists, \
         the AWS_* credentials, and AWS_ENDPOINT_URL for a store that is not Amazon's"
    )]
    Unreachable {
        url: String,
        source: object_store::Error,
    },

    #[error("artifact {sha256} is not in the store")]
    NotFound { sha256: String },

    /// What the store holds under a key is not the content that key names.
    #[error(
        "artifact {sha256} is corrupt in the store ({detail}); \
         remove the object so the next put writes it again"
    )]
    Corrupt { sha256: String, detail: String },

    /// A file, or all files together, are larger than a limit allows.
    #[error(
        "collect {path}: {size} bytes is over the limit {limit} = {max}; \
         have the code write less, or ask only for the files you need \
         (outputs: `--outputs GLOB`, or \"outputs\" in the request)"
    )]
    TooLarge {
        path: String,
        limit: CollectLimit,
        size: u64,
        max: u64,
    },

    /// More files than `max_files`.
    #[error(
        "collect {path}: more than {max} files to collect (limit max_files); \
         ask only for the files you need (outputs: `--outputs GLOB`, or \"outputs\" \
         in the request) or have the code write fewer files"
    )]
    TooMany { path: String, max: usize },

    /// The object store backend failed.
    #[error("artifact store: {op} failed: {source}")]
    Backend {
        op: &'static str,
        #[source]
        source: object_store::Error,
    },

    /// Preparing the local store directory failed.
    #[error("artifact store: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },

    /// The env failed while collecting (cancellation included: code `aborted`).
    #[error(transparent)]
    Env(#[from] EnvError),

    /// The run records database failed.
    #[error("run records: {op}: {detail}")]
    Records { op: String, detail: String },

    /// The records' database did not answer (no connection to be had, or it went).
    #[error(
        "run records: {op}: the database does not answer ({detail}); check that it is up \
         and reachable (serve --db)"
    )]
    RecordsUnavailable { op: String, detail: String },

    /// The `--db` URL cannot be parsed.
    #[error("invalid records database URL {url}: {reason}")]
    InvalidDbUrl { url: String, reason: String },

    /// The database the URL names did not answer when it was opened.
    #[error(
        "records database {url}: cannot connect or set up its tables ({detail}); check \
         that Postgres is up, the user and password, and that the database exists"
    )]
    DbUnreachable { url: String, detail: String },

    /// A workspace snapshot could not be saved or restored; the message says why.
    #[error("snapshot: {0}")]
    Snapshot(String),

    /// Storing `needed` more bytes would take the store past its budget.
    #[error(
        "artifact store: {needed} more bytes would take it past its budget of {budget} \
         ({used} in use; the server's --store-budget); nothing of it was kept: have the \
         code write less, or wait for retention to remove old objects"
    )]
    QuotaExceeded { needed: u64, used: u64, budget: u64 },

    /// A tenant has as many scopes as it may keep; a new one is not saved.
    #[error(
        "snapshot: scope limit: this tenant keeps {max} scopes already (the server's \
         --tenant-max-scopes); reuse a scopeKey, or wait until one unused for the \
         store's --retain is forgotten"
    )]
    TooManyScopes { max: usize },

    /// A value given to a record that cannot be one (a key id of the wrong length).
    #[error("{what}: {reason}")]
    InvalidRecord { what: String, reason: String },
}

impl StoreError {
    /// The stable code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::InvalidKey { .. }
            | StoreError::InvalidUrl { .. }
            | StoreError::InvalidDbUrl { .. }
            | StoreError::InvalidRecord { .. } => ErrorCode::Invalid,
            StoreError::UnsupportedUrl { .. } => ErrorCode::NotSupported,
            StoreError::RecordsUnavailable { .. } | StoreError::DbUnreachable { .. } => {
                ErrorCode::Unavailable
            }
            StoreError::NotFound { .. } => ErrorCode::NotFound,
            StoreError::Corrupt { .. } => ErrorCode::Unknown,
            StoreError::TooLarge { .. } | StoreError::TooMany { .. } => {
                ErrorCode::ResourceExhausted
            }
            StoreError::Backend { source, .. } => backend_code(source),
            StoreError::Unreachable { .. } => ErrorCode::Unavailable,
            StoreError::Io { source, .. } => io_code(source),
            StoreError::Env(e) => e.code,
            StoreError::Records { .. } | StoreError::Snapshot(_) => ErrorCode::Unknown,
            StoreError::QuotaExceeded { .. } | StoreError::TooManyScopes { .. } => {
                ErrorCode::QuotaExceeded
            }
        }
    }

    pub(crate) fn backend(op: &'static str, source: object_store::Error) -> Self {
        StoreError::Backend { op, source }
    }
}

/// Maps an `object_store` error to a code: by its kind where that says enough, else by
/// the OS error somewhere in its source chain (a full disk is `resource_exhausted`).
fn backend_code(err: &object_store::Error) -> ErrorCode {
    use object_store::Error as E;
    match err {
        E::NotFound { .. } => ErrorCode::NotFound,
        E::AlreadyExists { .. } | E::Precondition { .. } => ErrorCode::AlreadyExists,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => ErrorCode::PermissionDenied,
        E::NotSupported { .. } | E::NotImplemented { .. } => ErrorCode::NotSupported,
        E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => ErrorCode::Invalid,
        _ => source_io_code(err).unwrap_or(ErrorCode::Unknown),
    }
}

fn source_io_code(err: &(dyn std::error::Error + 'static)) -> Option<ErrorCode> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return Some(io_code(io));
        }
        next = e.source();
    }
    None
}

/// The env crate owns the errno → code table; reuse it rather than keep a second one.
fn io_code(err: &std::io::Error) -> ErrorCode {
    EnvError::io(err, "", "").code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_map_by_kind_and_by_os_error() {
        let not_found = object_store::Error::NotFound {
            path: "x".into(),
            source: "gone".into(),
        };
        assert_eq!(
            StoreError::backend("get", not_found).code(),
            ErrorCode::NotFound
        );
        let full = object_store::Error::Generic {
            store: "LocalFileSystem",
            // ENOSPC on Linux.
            source: Box::new(std::io::Error::from_raw_os_error(28)),
        };
        assert_eq!(
            StoreError::backend("put", full).code(),
            ErrorCode::ResourceExhausted
        );
        let odd = object_store::Error::Generic {
            store: "x",
            source: "something".into(),
        };
        assert_eq!(StoreError::backend("put", odd).code(), ErrorCode::Unknown);
    }

    #[test]
    fn limit_errors_name_the_limit_and_the_file() {
        let e = StoreError::TooLarge {
            path: "out/big.bin".into(),
            limit: CollectLimit::MaxFileBytes,
            size: 10,
            max: 5,
        };
        assert_eq!(e.code(), ErrorCode::ResourceExhausted);
        let text = e.to_string();
        assert!(
            text.contains("out/big.bin") && text.contains("max_file_bytes"),
            "{text}"
        );
    }
}
