//! The one error type of every env operation, and the one place that maps OS errors
//! to portable [`ErrorCode`]s.

use std::io;
use std::path::Path;

pub use skillbox_protocol::ErrorCode;

/// Result of every env operation.
pub type EnvResult<T> = Result<T, EnvError>;

/// Maps an errno to a code; anything unlisted is `unknown`. The one errno table: every
/// backend and the store go through it.
pub fn errno_code(errno: i32) -> ErrorCode {
    match errno {
        libc::ENOENT => ErrorCode::NotFound,
        libc::EEXIST | libc::ENOTEMPTY => ErrorCode::AlreadyExists,
        // EXDEV: openat2 refused to leave the root it was confined to.
        libc::EACCES | libc::EPERM | libc::EROFS | libc::EXDEV => ErrorCode::PermissionDenied,
        // ELOOP: a symlink where the operation does not follow symlinks.
        libc::ENOTDIR | libc::ELOOP => ErrorCode::NotDirectory,
        libc::EISDIR => ErrorCode::IsDirectory,
        // ENXIO: opening a FIFO with no reader, or a socket, as a file.
        libc::EINVAL | libc::ENAMETOOLONG | libc::EBADF | libc::ENXIO => ErrorCode::Invalid,
        libc::ENOSYS | libc::EOPNOTSUPP => ErrorCode::NotSupported,
        libc::ENOSPC
        | libc::EDQUOT
        | libc::EFBIG
        | libc::EMFILE
        | libc::ENFILE
        | libc::ENOMEM
        | libc::EAGAIN => ErrorCode::ResourceExhausted,
        libc::ETIMEDOUT => ErrorCode::Timeout,
        // Nothing listens there (yet): a service that is starting or gone.
        libc::ECONNREFUSED => ErrorCode::Unavailable,
        libc::ECANCELED | libc::EINTR => ErrorCode::Aborted,
        _ => ErrorCode::Unknown,
    }
}

/// An env operation failed: a stable code, a message that names the thing that failed
/// and what to do, and the path involved when there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize)]
#[error("{code}: {message}")]
pub struct EnvError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

impl EnvError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        EnvError {
            code,
            message: message.into(),
            path: None,
        }
    }

    /// Attaches the path the operation was about.
    pub fn with_path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().display().to_string());
        self
    }

    /// An I/O error on `path` (a path as the env's user sees it), with the OS wording
    /// replaced by a stable code.
    pub fn io(err: &io::Error, op: &str, path: impl AsRef<Path>) -> Self {
        let path = path.as_ref();
        let code = match err.raw_os_error() {
            Some(errno) => errno_code(errno),
            None => match err.kind() {
                io::ErrorKind::NotFound => ErrorCode::NotFound,
                io::ErrorKind::PermissionDenied => ErrorCode::PermissionDenied,
                io::ErrorKind::AlreadyExists => ErrorCode::AlreadyExists,
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => ErrorCode::Invalid,
                io::ErrorKind::TimedOut => ErrorCode::Timeout,
                io::ErrorKind::Interrupted => ErrorCode::Aborted,
                _ => ErrorCode::Unknown,
            },
        };
        let what = match code {
            ErrorCode::NotFound => "no such file or directory".to_string(),
            ErrorCode::AlreadyExists => "already exists (or is a non-empty directory)".to_string(),
            ErrorCode::PermissionDenied => {
                "permission denied (outside what this env may touch, read-only, or reached through a symlink, which is not followed)".to_string()
            }
            ErrorCode::NotDirectory => {
                "a path component is not a directory (or is a symlink, which is not followed)"
                    .to_string()
            }
            ErrorCode::IsDirectory => "is a directory".to_string(),
            ErrorCode::ResourceExhausted => "out of space, file size or file handles".to_string(),
            _ => err.to_string(),
        };
        EnvError::new(code, format!("{op} {}: {what}", path.display())).with_path(path)
    }

    pub fn aborted(what: &str) -> Self {
        EnvError::new(ErrorCode::Aborted, format!("{what}: cancelled"))
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        EnvError::new(ErrorCode::Invalid, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        EnvError::new(ErrorCode::Unavailable, message)
    }

    pub fn not_supported(message: impl Into<String>) -> Self {
        EnvError::new(ErrorCode::NotSupported, message)
    }
}
