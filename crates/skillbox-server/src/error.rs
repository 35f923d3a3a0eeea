//! Every error answer: `{"error":{"code","message"}}`, with the one HTTP status its
//! [`ErrorCode`] maps to ([`status_of`]).

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use skillbox_protocol::{ApiError, ErrorCode};
use skillbox_run::RunError;

/// The HTTP status of an error code: the one mapping the server uses.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::Invalid | ErrorCode::NotDirectory | ErrorCode::IsDirectory => {
            StatusCode::BAD_REQUEST
        }
        ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Gone => StatusCode::GONE,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::AlreadyExists => StatusCode::CONFLICT,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        // A run whose artifacts exceed what may be kept.
        ErrorCode::ResourceExhausted => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Overloaded => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::NotSupported => StatusCode::NOT_IMPLEMENTED,
        // A cancelled run is the server going away.
        ErrorCode::Unavailable | ErrorCode::Aborted => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Timeout => StatusCode::GATEWAY_TIMEOUT,
        // The store's budget is spent: the server has no room to keep it.
        ErrorCode::QuotaExceeded => StatusCode::INSUFFICIENT_STORAGE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error answer: what the server refused or failed, as a stable code and a message
/// that says what to do.
#[derive(Debug)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
    /// Seconds for `Retry-After` (with `overloaded`).
    retry_after: Option<u32>,
}

impl Failure {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 429: too much is running or waiting; retry after `seconds`.
    pub(crate) fn overloaded(message: impl Into<String>, seconds: u32) -> Self {
        Failure {
            retry_after: Some(seconds),
            ..Failure::new(ErrorCode::Overloaded, message)
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut response = (
            status_of(self.code),
            Json(ApiError::new(self.code, self.message)),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

impl From<RunError> for Failure {
    fn from(error: RunError) -> Self {
        Failure::new(error.code(), error.to_string())
    }
}

impl From<skillbox_env::EnvError> for Failure {
    fn from(error: skillbox_env::EnvError) -> Self {
        let message = match error.path {
            Some(path) if !error.message.contains(&path) => format!("{path}: {}", error.message),
            _ => error.message,
        };
        Failure::new(error.code, message)
    }
}

impl From<skillbox_store::StoreError> for Failure {
    fn from(error: skillbox_store::StoreError) -> Self {
        Failure::new(error.code(), error.to_string())
    }
}

pub(crate) fn json_rejection(rejection: JsonRejection) -> Failure {
    let code = match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::PayloadTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
        _ => ErrorCode::Invalid,
    };
    Failure::new(code, format!("request body: {}", rejection.body_text()))
}

pub(crate) async fn not_found() -> Failure {
    Failure::new(ErrorCode::NotFound, "no such endpoint; see /openapi.json")
}

pub(crate) async fn method_not_allowed(method: Method) -> Failure {
    Failure::new(
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed here; see /openapi.json"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_status_and_only_unknown_is_a_500() {
        for code in ErrorCode::ALL {
            let status = status_of(code);
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{code}: {status}"
            );
            assert_eq!(
                status == StatusCode::INTERNAL_SERVER_ERROR,
                code == ErrorCode::Unknown,
                "{code}: {status}"
            );
        }
    }

    #[test]
    fn the_contracts_statuses() {
        for (code, status) in [
            (ErrorCode::Invalid, 400),
            (ErrorCode::Unauthenticated, 401),
            (ErrorCode::PermissionDenied, 403),
            (ErrorCode::NotFound, 404),
            (ErrorCode::MethodNotAllowed, 405),
            (ErrorCode::PayloadTooLarge, 413),
            (ErrorCode::UnsupportedMediaType, 415),
            (ErrorCode::ResourceExhausted, 422),
            (ErrorCode::QuotaExceeded, 507),
            (ErrorCode::Gone, 410),
            (ErrorCode::Overloaded, 429),
            (ErrorCode::Unavailable, 503),
        ] {
            assert_eq!(status_of(code).as_u16(), status, "{code}");
        }
    }
}
