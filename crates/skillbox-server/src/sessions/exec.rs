//! A session's execs: `POST …/exec` streams a command's output as NDJSON while it
//! runs; `POST …/execs/{execId}/cancel`, or the client going away, ends it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::response::Response;
use axum::{Extension, Json};
use base64::Engine;
use skillbox_env::{ExecEvent, ExecRequest};
use skillbox_protocol::{
    ApiError, Encoding, ErrorCode, MAX_TIMEOUT_MS, SessionExecEvent, SessionExecRequest,
};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{hold_body_bytes, json_body_size, read_json};
use crate::state::AppState;

use super::*;

/// Text from output chunks, never splitting a UTF-8 character between two events.
#[derive(Default)]
struct Utf8Carry(Vec<u8>);

impl Utf8Carry {
    fn push(&mut self, chunk: &[u8]) -> String {
        self.0.extend_from_slice(chunk);
        let cut = match std::str::from_utf8(&self.0) {
            Ok(_) => self.0.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.0.len(),
        };
        let rest = self.0.split_off(cut);
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0 = rest;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.0).into_owned();
        self.0.clear();
        text
    }
}

fn ndjson(event: &SessionExecEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// Counts a running exec while alive.
struct Running(Arc<Session>, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut execs) = self.0.execs.lock() {
            execs.remove(&self.1);
        }
        self.0.touch();
    }
}

/// Run a command in the session, streaming its output as NDJSON.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/exec",
    params(("id" = String, Path, description = "The session's id")),
    request_body = SessionExecRequest,
    responses(
        (status = 200, description = "NDJSON, one SessionExecEvent a line: started, stdout/stderr chunks as they come, then exit (or error)", body = SessionExecEvent, content_type = "application/x-ndjson"),
        (status = 400, description = "Bad request: the message names the field", body = ApiError),
        (status = 404, description = "No such session of this tenant", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 415, description = "Not `Content-Type: application/json`", body = ApiError),
        (status = 429, description = "As many execs running in this session as it takes, or as many request bodies held as the server may", body = ApiError),
        (status = 504, description = "The body was not received within --body-timeout", body = ApiError),
    )
)]
pub(crate) async fn exec(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath(id): UrlPath<String>,
    request: Request,
) -> Result<Response, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    let (parts, body) = request.into_parts();
    // Everything that can refuse the exec without its body does so before any of it is
    // read: the headers, the session's bound on execs, the budget of bodies in memory.
    let announced = json_body_size(&parts.headers, state.config.body_limit)?;
    if session.running.fetch_add(1, Ordering::SeqCst) >= MAX_EXECS {
        session.running.fetch_sub(1, Ordering::SeqCst);
        return Err(Failure::overloaded(
            format!("{MAX_EXECS} execs are running in this session; wait for one to end"),
            1,
        ));
    }
    let exec_id = match new_id("exe_", 8) {
        Ok(id) => id,
        Err(e) => {
            session.running.fetch_sub(1, Ordering::SeqCst);
            return Err(e);
        }
    };
    // Counted from here: a body still arriving holds its place among the session's execs.
    let running = Running(session.clone(), exec_id.clone());
    let held = hold_body_bytes(&state, &tenant, announced)?;
    let request: SessionExecRequest =
        read_json(body, state.config.body_limit, state.config.body_timeout).await?;
    drop(held);
    let mut exec = match (request.command.is_empty(), &request.shell) {
        (false, None) => ExecRequest::argv(request.command.clone()),
        (true, Some(script)) => ExecRequest::shell(script.clone()),
        _ => {
            return Err(Failure::new(
                ErrorCode::Invalid,
                "give exactly one of command (an argv) and shell (a script for /bin/sh -c)",
            ));
        }
    };
    let door = state.runner.workspace(session.env.as_ref());
    exec.cwd = Some(match &request.cwd {
        Some(cwd) => door.absolute(&door.parse(cwd, "cwd")?),
        None => door.root().as_path().to_path_buf(),
    });
    exec.env = request.env.clone();
    if let Some(stdin) = request.stdin {
        exec.stdin = Some(match request.stdin_encoding {
            Encoding::Utf8 => stdin.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(stdin.trim())
                .map_err(|e| {
                    Failure::new(ErrorCode::Invalid, format!("stdin: not valid base64: {e}"))
                })?,
        });
    }
    if let Some(ms) = request.timeout_ms {
        if ms == 0 || ms > MAX_TIMEOUT_MS {
            return Err(Failure::new(
                ErrorCode::Invalid,
                format!("timeoutMs: between 1 and {MAX_TIMEOUT_MS}"),
            ));
        }
        exec.timeout = Some(Duration::from_millis(ms));
    }
    exec.validate().map_err(env_failure)?;
    session.touch();
    let cancel = session.ending.child_token();
    if let Ok(mut execs) = session.execs.lock() {
        execs.insert(exec_id.clone(), cancel.clone());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    let after = session.clone();
    let relay = async move {
        let _running = running;
        // The client going away drops the body, and with it the receiver: the exec is
        // cancelled then, its whole process tree with it.
        let send = |bytes: Bytes| {
            let tx = tx.clone();
            let cancel = cancel.clone();
            async move {
                if tx.send(Ok(bytes)).await.is_err() {
                    cancel.cancel();
                }
            }
        };
        send(ndjson(&SessionExecEvent::Started {
            exec_id: exec_id.clone(),
        }))
        .await;
        let started = Instant::now();
        // A cancel ends the stream with exit, cancelled: whether it came while the
        // command was being started or once it ran (its duration is until the cancel
        // ended it).
        let cancelled = || {
            ndjson(&SessionExecEvent::Exit {
                exit_code: None,
                signal: Some(libc_sigkill()),
                timed_out: false,
                limit_hit: None,
                duration_ms: started.elapsed().as_millis() as u64,
                truncated: skillbox_protocol::Truncated::default(),
                cancelled: true,
            })
        };
        let env = &session.env;
        let mut stream = match env.exec_stream(exec, &cancel).await {
            Ok(stream) => stream,
            Err(e) if e.code == ErrorCode::Aborted => {
                send(cancelled()).await;
                return;
            }
            Err(e) => {
                send(ndjson(&SessionExecEvent::Error {
                    code: e.code.as_str().to_string(),
                    message: e.to_string(),
                }))
                .await;
                return;
            }
        };
        let (mut out, mut err) = (Utf8Carry::default(), Utf8Carry::default());
        // A command that writes nothing never learns from a send that its client went
        // away: the receiver's drop (the body's) cancels it too.
        let mut watching = true;
        loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = tx.closed(), if watching => {
                    watching = false;
                    cancel.cancel();
                    continue;
                }
            };
            let Some(event) = event else {
                return;
            };
            match event {
                Ok(ExecEvent::Stdout(chunk)) => {
                    let data = out.push(&chunk);
                    if !data.is_empty() {
                        send(ndjson(&SessionExecEvent::Stdout { data })).await;
                    }
                }
                Ok(ExecEvent::Stderr(chunk)) => {
                    let data = err.push(&chunk);
                    if !data.is_empty() {
                        send(ndjson(&SessionExecEvent::Stderr { data })).await;
                    }
                }
                Ok(ExecEvent::Exit(output)) => {
                    for (carry, stdout) in [(&mut out, true), (&mut err, false)] {
                        let data = carry.finish();
                        if !data.is_empty() {
                            let event = if stdout {
                                SessionExecEvent::Stdout { data }
                            } else {
                                SessionExecEvent::Stderr { data }
                            };
                            send(ndjson(&event)).await;
                        }
                    }
                    send(ndjson(&SessionExecEvent::Exit {
                        exit_code: output.exit_code,
                        signal: output.signal,
                        timed_out: output.timed_out,
                        limit_hit: output.limit_hit,
                        duration_ms: output.duration_ms,
                        truncated: output.truncated,
                        cancelled: false,
                    }))
                    .await;
                    return;
                }
                Err(e) if e.code == ErrorCode::Aborted => {
                    send(cancelled()).await;
                    return;
                }
                Err(e) => {
                    send(ndjson(&SessionExecEvent::Error {
                        code: e.code.as_str().to_string(),
                        message: e.to_string(),
                    }))
                    .await;
                    return;
                }
            }
        }
    };
    tokio::spawn(async move {
        relay.await;
        // The answer is complete (its body ended with the relay): the session's next
        // exec gets ready now, so it pays only for its command.
        after.env.prepare_next().await;
    });
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

fn libc_sigkill() -> i32 {
    9
}

/// Cancel one running exec: its whole process tree inside the sandbox dies.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/execs/{exec_id}/cancel",
    params(
        ("id" = String, Path, description = "The session's id"),
        ("exec_id" = String, Path, description = "The exec's id, from its `started` event"),
    ),
    responses(
        (status = 200, description = "Cancelled (its stream ends with exit, cancelled true)"),
        (status = 404, description = "No such session of this tenant, or no such exec running", body = ApiError),
    )
)]
pub(crate) async fn cancel(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    UrlPath((id, exec_id)): UrlPath<(String, String)>,
) -> Result<Json<serde_json::Value>, Failure> {
    let session = state.sessions.get(&tenant, &id)?;
    session.touch();
    let token = session
        .execs
        .lock()
        .ok()
        .and_then(|execs| execs.get(&exec_id).cloned())
        .ok_or_else(|| {
            Failure::new(
                ErrorCode::NotFound,
                format!("no exec {exec_id} running in session {id}"),
            )
        })?;
    token.cancel();
    Ok(Json(serde_json::json!({"cancelled": exec_id})))
}
