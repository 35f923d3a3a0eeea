//! Sessions over HTTP (`/v1/sessions…`, design.md §5.3): a typed call for each route
//! ([`Sessions`]), and [`ExecStream`], an exec's NDJSON events read as they arrive.

use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;

use crate::{
    ClientError, Encoding, ErrorCode, ExecOutput, HttpSkillSandbox, SessionCreateRequest,
    SessionExecEvent, SessionExecRequest, SessionInfo, SessionList, SessionListing,
};

/// The longest an exec may run (a session's `timeoutMs` is at most 24 hours).
const MAX_EXEC: Duration = Duration::from_secs(24 * 3600);
/// Time past an exec's own limit for the server to end it and say so.
const EXEC_GRACE: Duration = Duration::from_secs(60);
/// The longest NDJSON line taken from a server (an output chunk is far smaller).
const MAX_LINE: usize = 16 * 1024 * 1024;

/// The session routes of one server, from [`HttpSkillSandbox::sessions`].
#[derive(Debug, Clone)]
pub struct Sessions {
    client: HttpSkillSandbox,
}

impl HttpSkillSandbox {
    /// The session routes of this server, with its key.
    pub fn sessions(&self) -> Sessions {
        Sessions {
            client: self.clone(),
        }
    }
}

/// `id` as one URL path segment. `.` and `..` are refused: a URL parser would resolve
/// them, and the request would go to another route.
fn id_segment(id: &str) -> Result<String, ClientError> {
    if id.is_empty() || id == "." || id == ".." {
        return Err(ClientError::new(
            ErrorCode::Invalid,
            format!("{id:?} is not a session id (they look like ses_…)"),
        ));
    }
    Ok(percent_encode(id))
}

/// A path of `/workspace` as URL path segments, each encoded. `..` is refused here for
/// the same reason as in [`id_segment`] (the server would refuse it too).
fn path_segments(path: &str) -> Result<String, ClientError> {
    let relative = path.trim_start_matches('/');
    if relative.split('/').any(|s| s == "..") {
        return Err(ClientError::new(
            ErrorCode::Invalid,
            format!("path {path:?}: give a path inside /workspace, without `..`"),
        ));
    }
    let segments: Vec<String> = relative
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .map(percent_encode)
        .collect();
    if segments.is_empty() {
        return Err(ClientError::new(
            ErrorCode::Invalid,
            format!("path {path:?}: names /workspace itself; give a file"),
        ));
    }
    Ok(segments.join("/"))
}

/// Everything but RFC 3986's unreserved characters as `%XX`.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `bytes` as an exec's `stdin` and its `stdinEncoding`: UTF-8 text as it is, anything
/// else in base64.
pub fn stdin_of(bytes: Vec<u8>) -> (String, Encoding) {
    use base64::Engine;
    match String::from_utf8(bytes) {
        Ok(text) => (text, Encoding::Utf8),
        Err(e) => (
            base64::engine::general_purpose::STANDARD.encode(e.into_bytes()),
            Encoding::Base64,
        ),
    }
}

impl Sessions {
    fn url(&self, rest: &str) -> String {
        format!("{}/v1/sessions{rest}", self.client.base())
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        let response = self
            .client
            .authorized(request)
            .send()
            .await
            .map_err(|e| self.client.transport(e))?;
        if !response.status().is_success() {
            return Err(HttpSkillSandbox::error_of(response).await);
        }
        Ok(response)
    }

    async fn json<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, ClientError> {
        self.send(request).await?.json::<T>().await.map_err(|e| {
            ClientError::new(
                ErrorCode::Invalid,
                format!("{}: the answer is not {what}: {e}", self.client.base()),
            )
        })
    }

    /// `POST /v1/sessions`: opens one.
    pub async fn create(&self, request: &SessionCreateRequest) -> Result<SessionInfo, ClientError> {
        let http = self.client.http().post(self.url("")).json(request);
        self.json(http, "a SessionInfo").await
    }

    /// `GET /v1/sessions`: this tenant's open sessions, oldest first.
    pub async fn list(&self) -> Result<Vec<SessionInfo>, ClientError> {
        let http = self.client.http().get(self.url(""));
        let list: SessionList = self.json(http, "a SessionList").await?;
        Ok(list.sessions)
    }

    /// `GET /v1/sessions/{id}`.
    pub async fn get(&self, id: &str) -> Result<SessionInfo, ClientError> {
        let http = self
            .client
            .http()
            .get(self.url(&format!("/{}", id_segment(id)?)));
        self.json(http, "a SessionInfo").await
    }

    /// `DELETE /v1/sessions/{id}`: ends it; answers how it was last (with the scope's
    /// saved snapshot, if it has a scope).
    pub async fn delete(&self, id: &str) -> Result<SessionInfo, ClientError> {
        let http = self
            .client
            .http()
            .delete(self.url(&format!("/{}", id_segment(id)?)));
        self.json(http, "a SessionInfo").await
    }

    /// `POST /v1/sessions/{id}/exec`: starts a command and hands back its events as the
    /// server sends them (nothing is buffered past the current line). Dropping the
    /// stream closes the connection, which cancels the exec.
    pub async fn exec(
        &self,
        id: &str,
        request: &SessionExecRequest,
    ) -> Result<ExecStream, ClientError> {
        let limit = request
            .timeout_ms
            .map_or(MAX_EXEC, Duration::from_millis)
            .min(MAX_EXEC);
        let http = self
            .client
            .http()
            .post(self.url(&format!("/{}/exec", id_segment(id)?)))
            .timeout(limit + EXEC_GRACE)
            .json(request);
        let response = self.send(http).await?;
        Ok(ExecStream {
            base: self.client.base().to_string(),
            response,
            lines: NdjsonLines::default(),
            exec_id: None,
            ended: false,
        })
    }

    /// `POST /v1/sessions/{id}/execs/{exec_id}/cancel`: the exec's whole process tree
    /// dies; its stream ends with an `exit` whose `cancelled` is true.
    pub async fn cancel(&self, id: &str, exec_id: &str) -> Result<(), ClientError> {
        let http = self.client.http().post(self.url(&format!(
            "/{}/execs/{}/cancel",
            id_segment(id)?,
            id_segment(exec_id)?
        )));
        self.send(http).await.map(drop)
    }

    /// `GET /v1/sessions/{id}/files/{path}`: a regular file's bytes (`path` relative to
    /// `/workspace`).
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Bytes, ClientError> {
        let http = self.client.http().get(self.url(&format!(
            "/{}/files/{}",
            id_segment(id)?,
            path_segments(path)?
        )));
        self.send(http)
            .await?
            .bytes()
            .await
            .map_err(|e| self.client.transport(e))
    }

    /// `PUT /v1/sessions/{id}/files/{path}`: writes `bytes` (its directories made), mode
    /// 0755 when `executable`, else 0644.
    pub async fn write_file(
        &self,
        id: &str,
        path: &str,
        bytes: impl Into<Bytes>,
        executable: bool,
    ) -> Result<(), ClientError> {
        let mut http = self
            .client
            .http()
            .put(self.url(&format!(
                "/{}/files/{}",
                id_segment(id)?,
                path_segments(path)?
            )))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes.into());
        if executable {
            http = http.query(&[("executable", "true")]);
        }
        self.send(http).await.map(drop)
    }

    /// `DELETE /v1/sessions/{id}/files/{path}`: removes a file, or a directory tree when
    /// `recursive`.
    pub async fn remove_file(
        &self,
        id: &str,
        path: &str,
        recursive: bool,
    ) -> Result<(), ClientError> {
        let mut http = self.client.http().delete(self.url(&format!(
            "/{}/files/{}",
            id_segment(id)?,
            path_segments(path)?
        )));
        if recursive {
            http = http.query(&[("recursive", "true")]);
        }
        self.send(http).await.map(drop)
    }

    /// `GET /v1/sessions/{id}/ls?path=`: a directory's entries (`None`: `/workspace`).
    pub async fn ls(&self, id: &str, path: Option<&str>) -> Result<SessionListing, ClientError> {
        let mut http = self
            .client
            .http()
            .get(self.url(&format!("/{}/ls", id_segment(id)?)));
        if let Some(path) = path {
            http = http.query(&[("path", path)]);
        }
        self.json(http, "a SessionListing").await
    }
}

/// An exec's events in order (`started`, `stdout`/`stderr` chunks, then `exit` or
/// `error`), each read off the connection as the server sends it.
#[derive(Debug)]
pub struct ExecStream {
    base: String,
    response: reqwest::Response,
    lines: NdjsonLines,
    exec_id: Option<String>,
    ended: bool,
}

impl ExecStream {
    /// The next event; `None` after `exit` or `error` (or an error of the stream
    /// itself, which is handed out once).
    pub async fn next(&mut self) -> Option<Result<SessionExecEvent, ClientError>> {
        loop {
            if self.ended {
                return None;
            }
            match self.lines.next_event(&self.base) {
                Ok(Some(event)) => {
                    match &event {
                        SessionExecEvent::Started { exec_id } => {
                            self.exec_id = Some(exec_id.clone());
                        }
                        SessionExecEvent::Exit { .. } | SessionExecEvent::Error { .. } => {
                            self.ended = true;
                        }
                        SessionExecEvent::Stdout { .. } | SessionExecEvent::Stderr { .. } => {}
                    }
                    return Some(Ok(event));
                }
                Ok(None) => {}
                Err(e) => {
                    self.ended = true;
                    return Some(Err(e));
                }
            }
            let failure = match self.response.chunk().await {
                Ok(Some(chunk)) => {
                    self.lines.push(&chunk);
                    continue;
                }
                Ok(None) => ClientError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "{}: the exec's stream ended before it said how the command ended",
                        self.base
                    ),
                ),
                Err(e) => ClientError::new(ErrorCode::Unavailable, format!("{}: {e}", self.base)),
            };
            self.ended = true;
            return Some(Err(failure));
        }
    }

    /// The exec's id, once its `started` event has been read (for
    /// [`Sessions::cancel`]).
    pub fn exec_id(&self) -> Option<&str> {
        self.exec_id.as_deref()
    }

    /// Reads the stream to its end: everything the command wrote and how it ended (a
    /// cancelled exec as killed by SIGKILL). An `error` event is the error.
    pub async fn output(mut self) -> Result<ExecOutput, ClientError> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(event) = self.next().await {
            let event = event?;
            if let Some(ended) = exit_output(&event) {
                return Ok(ExecOutput {
                    stdout,
                    stderr,
                    ..ended
                });
            }
            match event {
                SessionExecEvent::Stdout { data } => stdout.extend(data.into_bytes()),
                SessionExecEvent::Stderr { data } => stderr.extend(data.into_bytes()),
                SessionExecEvent::Error { code, message } => {
                    return Err(event_error(&code, message));
                }
                SessionExecEvent::Started { .. } | SessionExecEvent::Exit { .. } => {}
            }
        }
        Err(ClientError::new(
            ErrorCode::Unavailable,
            format!("{}: the exec ended without an exit", self.base),
        ))
    }
}

/// An `error` event as a [`ClientError`] (a code this client does not know reads as
/// `unknown`).
pub fn event_error(code: &str, message: String) -> ClientError {
    let code = serde_json::from_value(serde_json::Value::String(code.to_string()))
        .unwrap_or(ErrorCode::Unknown);
    ClientError::new(code, message)
}

/// How an exec ended, as its `exit` event says.
pub fn exit_output(event: &SessionExecEvent) -> Option<ExecOutput> {
    match event {
        SessionExecEvent::Exit {
            exit_code,
            signal,
            timed_out,
            limit_hit,
            duration_ms,
            truncated,
            cancelled: _,
        } => Some(ExecOutput {
            exit_code: *exit_code,
            signal: *signal,
            timed_out: *timed_out,
            limit_hit: *limit_hit,
            duration_ms: *duration_ms,
            truncated: *truncated,
            ..ExecOutput::default()
        }),
        _ => None,
    }
}

/// NDJSON lines cut from chunks that may split a line anywhere.
#[derive(Debug, Default)]
struct NdjsonLines {
    buffer: Vec<u8>,
}

impl NdjsonLines {
    fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole line's event, if a whole line has come.
    fn next_event(&mut self, base: &str) -> Result<Option<SessionExecEvent>, ClientError> {
        loop {
            let Some(end) = self.buffer.iter().position(|b| *b == b'\n') else {
                if self.buffer.len() > MAX_LINE {
                    return Err(ClientError::new(
                        ErrorCode::Invalid,
                        format!("{base}: an exec event longer than {MAX_LINE} bytes"),
                    ));
                }
                return Ok(None);
            };
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let event: SessionExecEvent = serde_json::from_slice(line).map_err(|e| {
                ClientError::new(
                    ErrorCode::Invalid,
                    format!(
                        "{base}: an exec event that does not parse ({e}): {}",
                        String::from_utf8_lossy(&line[..line.len().min(200)])
                    ),
                )
            })?;
            return Ok(Some(event));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_anywhere_come_out_whole() {
        let stream = concat!(
            r#"{"type":"started","execId":"exe_1"}"#,
            "\n",
            r#"{"type":"stdout","data":"h\u00e9llo\n"}"#,
            "\n\n",
            r#"{"type":"exit","exitCode":3,"signal":null,"timedOut":false,"limitHit":null,"durationMs":5,"truncated":{"stdout":false,"stderr":false},"cancelled":false}"#,
            "\n"
        )
        .as_bytes();
        for cut in 1..stream.len() {
            let mut lines = NdjsonLines::default();
            let mut events = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                lines.push(part);
                while let Some(event) = lines.next_event("test").unwrap() {
                    events.push(event);
                }
            }
            assert_eq!(events.len(), 3, "cut at {cut}");
            assert_eq!(
                events[1],
                SessionExecEvent::Stdout {
                    data: "héllo\n".into()
                }
            );
            assert_eq!(exit_output(&events[2]).unwrap().shell_status(), 3);
        }
    }

    #[test]
    fn a_line_that_does_not_parse_is_an_error_naming_it() {
        let mut lines = NdjsonLines::default();
        lines.push(b"{\"type\":\"launched\"}\n");
        let error = lines.next_event("http://x").unwrap_err();
        assert_eq!(error.code, ErrorCode::Invalid);
        assert!(error.message.contains("launched"), "{error}");
    }

    #[test]
    fn ids_and_paths_stay_in_their_segments() {
        assert_eq!(id_segment("ses_ab12").unwrap(), "ses_ab12");
        assert_eq!(id_segment("a/b?c").unwrap(), "a%2Fb%3Fc");
        for bad in ["", ".", ".."] {
            assert_eq!(id_segment(bad).unwrap_err().code, ErrorCode::Invalid);
        }
        assert_eq!(
            path_segments("/workspace/a b/c#1.txt").unwrap(),
            "workspace/a%20b/c%231.txt"
        );
        assert_eq!(path_segments("./x//y").unwrap(), "x/y");
        assert_eq!(path_segments("é").unwrap(), "%C3%A9");
        for bad in ["a/../../b", "..", "", "/", "."] {
            assert_eq!(
                path_segments(bad).unwrap_err().code,
                ErrorCode::Invalid,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn stdin_is_text_when_it_can_be() {
        assert_eq!(stdin_of(b"hi\n".to_vec()), ("hi\n".into(), Encoding::Utf8));
        assert_eq!(
            stdin_of(vec![0xff, 0x00]),
            ("/wA=".into(), Encoding::Base64)
        );
    }

    #[test]
    fn an_error_event_keeps_its_code() {
        assert_eq!(
            event_error("not_found", "gone".into()),
            ClientError::new(ErrorCode::NotFound, "gone")
        );
        assert_eq!(event_error("new_code", "x".into()).code, ErrorCode::Unknown);
    }
}
