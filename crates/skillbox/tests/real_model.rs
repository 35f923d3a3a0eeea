//! The agent loop against a real small model (issue 43): SmolLM2-135M-Instruct behind
//! llama-cpp-python's OpenAI-compatible server, which `scripts/real-model.sh test`
//! builds, starts and names in `SKILLBOX_REAL_MODEL_URL`. Through the CLI
//! (`skillbox agent --model openai`), `POST /v1/agent/runs` of a
//! `skillbox serve --model openai`, and `skillbox doctor --model openai`. Between
//! skillbox and the server a recording proxy keeps every exchange: each request must be
//! accepted (200), whatever the model does with it.
//!
//! Ignored by a plain `cargo test`: the server is built by the script (it compiles
//! llama.cpp), which CI does not run (design.md §5.5.3).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

mod common;

use common::{BIN, native_or_skip, text};

/// Where the script's server is (`http://127.0.0.1:PORT/v1`) and the model's name.
const ENV_URL: &str = "SKILLBOX_REAL_MODEL_URL";
const ENV_NAME: &str = "SKILLBOX_REAL_MODEL";
/// The loop's turn bound (`AgentConfig::default().max_turns`): no run asks more.
const MAX_TURNS: usize = 12;
const PROMPT: &str = "Make a 2-slide deck about tea: a title slide and one slide of three facts. Save it as tea.pptx.";

/// One request through the proxy and what the server answered.
#[derive(Debug, Clone)]
struct Exchange {
    method: String,
    path: String,
    status: u16,
    request: Value,
    answer: String,
}

struct Recorder {
    upstream: String,
    http: reqwest::Client,
    seen: Mutex<Vec<Exchange>>,
}

/// A loopback proxy to the real server that records each exchange; its base URL (with
/// `/v1`) and what it saw.
struct Proxy {
    url: String,
    recorder: Arc<Recorder>,
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    fn start() -> Proxy {
        let real = std::env::var(ENV_URL)
            .unwrap_or_else(|_| panic!("{ENV_URL} is not set: run scripts/real-model.sh test"));
        let real = real.trim_end_matches('/');
        let upstream = real
            .strip_suffix("/v1")
            .unwrap_or_else(|| panic!("{ENV_URL}={real}: give the base ending in /v1"))
            .to_string();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let recorder = Arc::new(Recorder {
            upstream,
            http: reqwest::Client::new(),
            seen: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(recorder.clone());
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        runtime.spawn(async move { axum::serve(listener, app).await });
        Proxy {
            url: format!("http://{addr}/v1"),
            recorder,
            _runtime: runtime,
        }
    }

    fn seen(&self) -> Vec<Exchange> {
        self.recorder.seen.lock().unwrap().clone()
    }

    fn chats(&self) -> Vec<Exchange> {
        self.seen()
            .into_iter()
            .filter(|e| e.path.ends_with("/chat/completions"))
            .collect()
    }

    /// `skillbox` with the model variables pointing at this proxy.
    fn skillbox(&self, data: &std::path::Path) -> Command {
        let mut command = Command::new(BIN);
        command
            .env("SKILLBOX_MODEL_URL", &self.url)
            .env("SKILLBOX_MODEL", model_name())
            .env("SKILLBOX_API_KEY", "")
            .arg("--data-dir")
            .arg(data);
        command
    }
}

fn model_name() -> String {
    std::env::var(ENV_NAME).unwrap_or_else(|_| "smollm2".to_string())
}

async fn forward(
    State(recorder): State<Arc<Recorder>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let sent: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut request = recorder
        .http
        .request(method.clone(), format!("{}{path}", recorder.upstream))
        .body(body);
    for name in ["content-type", "authorization", "accept"] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value.as_bytes());
        }
    }
    let (status, content_type, answer) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/json")
                .to_string();
            let bytes = response.bytes().await.unwrap_or_default();
            (status, content_type, bytes)
        }
        Err(e) => (
            502,
            "text/plain".to_string(),
            Bytes::from(format!("proxy: {e}")),
        ),
    };
    recorder.seen.lock().unwrap().push(Exchange {
        method: method.to_string(),
        path,
        status,
        request: sent,
        answer: String::from_utf8_lossy(&answer)
            .chars()
            .take(2000)
            .collect(),
    });
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", content_type)],
        answer,
    )
        .into_response()
}

/// Every request was accepted; what was refused, named.
fn assert_all_accepted(exchanges: &[Exchange]) {
    let refused: Vec<String> = exchanges
        .iter()
        .filter(|e| e.status != 200)
        .map(|e| {
            format!(
                "{} {} -> {}: {}\nrequest: {}",
                e.method, e.path, e.status, e.answer, e.request
            )
        })
        .collect();
    assert!(refused.is_empty(), "refused:\n{}", refused.join("\n\n"));
}

/// What every real-model run must show, whatever the model did: it ended by its own
/// bounds with a clear status and reason, every attempt recorded in order, its model
/// turns within maxTurns, and every request accepted.
fn assert_bounded_run(outcome: &Value, chats: &[Exchange], max_attempts: u64) {
    let summary = summary(outcome, chats);
    eprintln!("{summary}");
    let status = outcome["status"].as_str().unwrap_or_default();
    assert!(
        status == "succeeded" || status == "failed",
        "{summary}\n{outcome:#}"
    );
    assert!(
        outcome["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{outcome:#}"
    );
    assert_eq!(
        outcome["error"],
        Value::Null,
        "the run ended on an error, not its bounds:\n{outcome:#}"
    );
    assert_eq!(outcome["scripted"], false);
    assert_eq!(outcome["model"], format!("openai:{}", model_name()));
    let attempts = outcome["attempts"].as_array().unwrap();
    for (i, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt["number"], i + 1, "{outcome:#}");
        assert!(attempt["script"].is_string(), "{attempt:#}");
        let ended = attempt["exitCode"].is_i64()
            || attempt["signal"].is_i64()
            || attempt["timedOut"] == true;
        assert!(ended, "{attempt:#}");
    }
    let failed = attempts.iter().filter(|a| a["succeeded"] != true).count() as u64;
    assert!(failed <= max_attempts, "{failed} failed: {outcome:#}");
    assert!(!chats.is_empty() && chats.len() <= MAX_TURNS, "{summary}");
    for correction in outcome["corrections"].as_array().into_iter().flatten() {
        let turn = correction["turn"].as_u64().unwrap();
        assert!(turn >= 1 && turn as usize <= chats.len(), "{correction:#}");
        assert!(correction["message"].is_string(), "{correction:#}");
    }
    assert_all_accepted(chats);
}

/// A few lines on what happened, for the log of the script.
fn summary(outcome: &Value, chats: &[Exchange]) -> String {
    let attempts: Vec<String> = outcome["attempts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            format!(
                "  attempt {}: {} exit {} {}",
                a["number"],
                a["language"],
                a["exitCode"],
                a["stderr"]
                    .as_str()
                    .unwrap_or_default()
                    .lines()
                    .last()
                    .unwrap_or_default()
            )
        })
        .collect();
    let corrections: Vec<String> = outcome["corrections"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "  turn {} {}: {}",
                c["turn"],
                c["kind"],
                c["message"]
                    .as_str()
                    .unwrap_or_default()
                    .chars()
                    .take(140)
                    .collect::<String>()
            )
        })
        .collect();
    let statuses: Vec<u16> = chats.iter().map(|e| e.status).collect();
    format!(
        "status {} ({})\nrequests {} statuses {statuses:?}\n{} attempts\n{}\n{} corrections\n{}",
        outcome["status"],
        outcome["reason"].as_str().unwrap_or_default(),
        chats.len(),
        attempts.len(),
        attempts.join("\n"),
        corrections.len(),
        corrections.join("\n"),
    )
}

fn data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-real-model")
}

#[test]
#[ignore = "needs the real model's server: scripts/real-model.sh test"]
fn doctor_finds_the_real_server_usable() {
    let proxy = Proxy::start();
    let out = proxy
        .skillbox(&data_dir())
        .args(["doctor", "--model", "openai", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", text(&out.stdout), text(&out.stderr)));
    eprintln!("{report:#}");
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["usable"], true, "{report:#}");
    assert_eq!(report["chat"]["ok"], true, "{report:#}");
    assert_eq!(report["toolChoice"]["ok"], true, "{report:#}");
    assert_eq!(report["streaming"]["ok"], true, "{report:#}");
    // Every request of the check was accepted, the streaming one included.
    assert_all_accepted(&proxy.seen());
}

#[test]
#[ignore = "needs the real model's server: scripts/real-model.sh test"]
fn a_cli_run_ends_within_its_bounds_and_every_request_is_accepted() {
    if !native_or_skip("a_cli_run_against_the_real_model") {
        return;
    }
    let proxy = Proxy::start();
    let max_attempts = 3;
    let out = proxy
        .skillbox(&data_dir())
        .args([
            "agent",
            PROMPT,
            "--model",
            "openai",
            "--json",
            "--max-attempts",
            &max_attempts.to_string(),
        ])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    let outcome: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", text(&out.stdout)));
    eprintln!("{stderr}");
    // 0 succeeded, 1 failed: never 125 (the run could not happen) or a crash.
    let expected = if outcome["status"] == "succeeded" {
        0
    } else {
        1
    };
    assert_eq!(out.status.code(), Some(expected), "{stderr}\n{outcome:#}");
    assert_bounded_run(&outcome, &proxy.chats(), max_attempts);
    // The live lines name each attempt.
    let lines = stderr.lines().filter(|l| l.starts_with("attempt ")).count();
    assert_eq!(
        lines,
        outcome["attempts"].as_array().unwrap().len(),
        "{stderr}"
    );
}

#[test]
#[ignore = "needs the real model's server: scripts/real-model.sh test"]
fn an_http_agent_run_ends_within_its_bounds_and_every_request_is_accepted() {
    if !native_or_skip("an_http_agent_run_against_the_real_model") {
        return;
    }
    let proxy = Proxy::start();
    let (mut serve, addr) =
        common::start_serve(proxy.skillbox(&data_dir()), &["--model", "openai"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let http = reqwest::Client::new();
    let base = format!("http://{addr}");
    let max_attempts = 2;
    let outcome = runtime.block_on(async {
        let info: Value = http
            .get(format!("{base}/v1/agent"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(info["model"], format!("openai:{}", model_name()), "{info}");
        assert_eq!(info["scripted"], false, "{info}");
        let created = http
            .post(format!("{base}/v1/agent/runs"))
            .json(&json!({"prompt": PROMPT, "maxAttempts": max_attempts}))
            .send()
            .await
            .unwrap();
        assert_eq!(created.status().as_u16(), 202);
        let created: Value = created.json().await.unwrap();
        let id = created["id"].as_str().unwrap().to_string();
        // The run's own deadline is 10 minutes; this only guards against a hang.
        let guard = Instant::now() + Duration::from_secs(15 * 60);
        loop {
            let record: Value = http
                .get(format!("{base}/v1/agent/runs/{id}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if record["status"] != "running" {
                return record;
            }
            assert!(
                Instant::now() < guard,
                "agent run {id} still running: {record:#}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // SAFETY: signalling the server this test started.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    let stopped = serve.wait().unwrap();
    assert_bounded_run(&outcome, &proxy.chats(), max_attempts);
    assert!(stopped.success(), "serve stops cleanly: {stopped:?}");
}
