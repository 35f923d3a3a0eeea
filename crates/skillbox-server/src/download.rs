//! The headers of every file the server hands out as a download (a stored object, a
//! session's file): whatever the bytes are (a run's code chose them), a browser saves
//! them, never renders them as this origin's page.

use axum::http::{HeaderMap, HeaderValue, header};

/// A policy under which nothing of a download runs if a browser shows it anyway: no
/// script, no plugin, no fetch, a sandboxed unique origin.
const CSP: &str = "default-src 'none'; sandbox";

/// `Content-Type` (`content_type`, or `application/octet-stream` when it is not a
/// header value), `X-Content-Type-Options: nosniff`, `Content-Disposition: attachment`
/// with `name` (less what could end or break the quoted string), and a
/// `Content-Security-Policy` that runs nothing.
pub(crate) fn download_headers(content_type: &str, name: &str) -> HeaderMap {
    let name: String = name
        .chars()
        .filter(|c| !c.is_control() && !matches!(c, '"' | '\\' | '/' | ';'))
        .collect();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_str(content_type)
            .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream")),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_str(&format!("attachment; filename=\"{name}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("attachment")),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloads_are_attachments_that_run_nothing() {
        let headers = download_headers("text/html", "a\"b;c/d\\e\r\nX-Evil: 1.html");
        assert_eq!(headers[header::CONTENT_TYPE], "text/html");
        assert_eq!(headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        assert_eq!(
            headers[header::CONTENT_DISPOSITION],
            "attachment; filename=\"abcdeX-Evil: 1.html\""
        );
        assert_eq!(
            headers[header::CONTENT_SECURITY_POLICY],
            "default-src 'none'; sandbox"
        );
        let headers = download_headers("text/plain\r\nX-Evil: 1", "é.txt");
        assert_eq!(headers[header::CONTENT_TYPE], "application/octet-stream");
        assert_eq!(
            headers[header::CONTENT_DISPOSITION],
            "attachment; filename=\"é.txt\""
        );
    }
}
