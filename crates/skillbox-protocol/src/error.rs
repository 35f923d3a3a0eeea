//! The stable error codes, and the body of every HTTP error answer.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A stable, portable error code, serialized snake_case. Most come from sandbox
/// operations (`EnvError`); `payload_too_large` to `unauthenticated` name what an HTTP
/// server may refuse, `quota_exceeded` what the artifact store has no room for. New
/// codes may be added: a client reads a code it does not know as `unknown`.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    Aborted,
    Timeout,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    NotDirectory,
    IsDirectory,
    Invalid,
    NotSupported,
    ResourceExhausted,
    Unavailable,
    /// The request body is larger than the server takes.
    PayloadTooLarge,
    /// The request body is not JSON.
    UnsupportedMediaType,
    /// Too much is running or waiting; retry after `Retry-After`.
    Overloaded,
    /// The route exists, the method does not.
    MethodNotAllowed,
    /// No API key, or one the server does not know.
    Unauthenticated,
    /// Storing it would take the artifact store past its byte budget.
    QuotaExceeded,
    /// What the request names lived on a node of the cluster that is no longer there
    /// (a session whose server died): it will not come back.
    Gone,
    /// Anything else; also what a code this version does not know reads as.
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::Aborted,
        ErrorCode::Timeout,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::PermissionDenied,
        ErrorCode::NotDirectory,
        ErrorCode::IsDirectory,
        ErrorCode::Invalid,
        ErrorCode::NotSupported,
        ErrorCode::ResourceExhausted,
        ErrorCode::Unavailable,
        ErrorCode::PayloadTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::Overloaded,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Unauthenticated,
        ErrorCode::QuotaExceeded,
        ErrorCode::Gone,
        ErrorCode::Unknown,
    ];

    /// The snake_case name used on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Aborted => "aborted",
            ErrorCode::Timeout => "timeout",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotDirectory => "not_directory",
            ErrorCode::IsDirectory => "is_directory",
            ErrorCode::Invalid => "invalid",
            ErrorCode::NotSupported => "not_supported",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Unknown => "unknown",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::Gone => "gone",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{"error":{"code","message"}}`, the body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApiError {
    pub error: ApiErrorBody,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ApiErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            error: ApiErrorBody {
                code,
                message: message.into(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_under_its_own_name() {
        for code in ErrorCode::ALL {
            let text = serde_json::to_string(&code).expect("serializes");
            assert_eq!(text, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&text).expect("parses");
            assert_eq!(back, code);
        }
    }

    #[test]
    fn a_code_from_a_newer_server_reads_as_unknown() {
        let code: ErrorCode = serde_json::from_str("\"quota_spent\"").expect("parses");
        assert_eq!(code, ErrorCode::Unknown);
    }
}
