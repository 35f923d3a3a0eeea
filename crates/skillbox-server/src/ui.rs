//! The web UI at `/` (DESIGN.md §5.3, the UI): four static files embedded in the
//! binary, so the server needs no build step and no network to serve it.
//!
//! The files hold no data and need no key; everything they show comes from the API
//! with the key the person typed in, so the UI sees exactly what that key's tenant
//! may. Every answer carries a Content-Security-Policy that allows this origin only
//! (no inline script, no other origin, not framed) and `nosniff`.

use axum::extract::Path;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use skillbox_protocol::ErrorCode;

use crate::error::Failure;

const INDEX: &str = include_str!("../ui/index.html");
const SCRIPT: &str = include_str!("../ui/app.js");
const STYLE: &str = include_str!("../ui/app.css");
const ICON: &str = include_str!("../ui/icon.svg");

/// Self only: scripts, styles, fetches; images also from `blob:` (slides are fetched
/// with the key, then shown from memory).
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// Whether `path` is one of the UI's files (served without a key).
pub(crate) fn is_ui_path(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub(crate) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

pub(crate) async fn asset(Path(name): Path<String>) -> Result<Response, Failure> {
    match name.as_str() {
        "app.js" => Ok(file("text/javascript; charset=utf-8", SCRIPT)),
        "app.css" => Ok(file("text/css; charset=utf-8", STYLE)),
        "icon.svg" => Ok(file("image/svg+xml", ICON)),
        _ => Err(Failure::new(
            ErrorCode::NotFound,
            format!("no UI file {name:?}"),
        )),
    }
}
