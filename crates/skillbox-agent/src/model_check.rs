//! What an OpenAI-compatible server does with the loop's requests, found with a few tiny
//! ones: whether it lists the model, takes a request of the loop's shape (tools, an
//! earlier tool call and its result in the history), whether the model calls a tool,
//! whether `tool_choice` is taken and whether the server streams. For
//! `skillbox doctor --model openai`: a misconfigured endpoint found in one command.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::json;
use skillbox_env::CancellationToken;

use crate::openai::{OpenAiProvider, error_chain};
use crate::provider::{Message, ModelProvider, Role, ToolCall, ToolSpec};

/// How much of a model's text answer a report quotes.
const QUOTED_CHARS: usize = 120;
/// How much of a streamed answer is read before deciding (the first event is enough).
const STREAM_PEEK_BYTES: usize = 64 * 1024;

/// One thing checked: whether it holds, and what was seen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    pub ok: bool,
    pub detail: String,
}

impl Probe {
    fn ok(detail: impl Into<String>) -> Self {
        Probe {
            ok: true,
            detail: detail.into(),
        }
    }

    fn no(detail: impl Into<String>) -> Self {
        Probe {
            ok: false,
            detail: detail.into(),
        }
    }
}

/// What the server at `endpoint` did with each check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelReport {
    /// `openai:MODEL`, as agent runs record it.
    pub model: String,
    /// The completions endpoint.
    pub endpoint: String,
    /// True when the loop's request was accepted: agent runs can use this server.
    pub usable: bool,
    /// `GET {base}/models` lists the model (informational: many local servers serve
    /// whatever they loaded under any name).
    pub listed: Probe,
    /// A request of the loop's shape was answered with a chat completion.
    pub chat: Probe,
    /// The model answered that request with a tool call.
    pub tools: Probe,
    /// The server takes `tool_choice: "auto"` (else skillbox leaves it out).
    pub tool_choice: Probe,
    /// The server answers `stream: true` with server-sent events (skillbox does not
    /// stream; for information).
    pub streaming: Probe,
}

/// The tool the check offers: one string argument, so any grammar or parser copes.
fn ping() -> ToolSpec {
    ToolSpec {
        name: "ping".into(),
        description: "Answers pong with the message it is given.".into(),
        parameters: json!({"type": "object", "properties": {
            "message": {"type": "string"}
        }, "required": ["message"], "additionalProperties": false}),
    }
}

/// The loop's shape in five messages: a system prompt, a request, an earlier call
/// (content `""`, an id of nine letters and digits, as Mistral's API wants) and its
/// result, and a request for one more call.
fn history() -> Vec<Message> {
    vec![
        Message::system("You check that tool calls work. Answer by calling the tool ping."),
        Message::user("Call the tool ping with the message hello."),
        Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "check0001".into(),
                name: "ping".into(),
                arguments: json!({"message": "hello"}),
                raw_arguments: None,
            }],
            tool_call_id: None,
        },
        Message::tool("check0001", r#"{"pong":"hello"}"#),
        Message::user("Call ping once more, with the message again."),
    ]
}

/// Runs every check against `provider`'s server. Each request is bounded by the
/// provider's timeout and `cancel`; nothing here fails: what went wrong is in the report.
pub async fn check(provider: &OpenAiProvider, cancel: &CancellationToken) -> ModelReport {
    let listed = listed(provider, cancel).await;
    let started = Instant::now();
    let answer = provider.complete(&history(), &[ping()], cancel).await;
    let took = started.elapsed().as_millis();
    let (chat, tools) = match &answer {
        Ok(reply) => (
            Probe::ok(format!(
                "took the loop's request (tools, an earlier tool call and its result in the history) and answered in {took} ms"
            )),
            match reply.message.tool_calls.first() {
                Some(call) => Probe::ok(format!("the model called {}", call.name)),
                None => Probe::no(format!(
                    "the model answered in text, not with a tool call ({:?}): agent runs need a server that offers tools to the model (llama-cpp-python: --chat_format chatml-function-calling; vLLM: --enable-auto-tool-choice --tool-call-parser; llama.cpp: --jinja) and a model that calls them",
                    cut(&reply.message.content, QUOTED_CHARS)
                )),
            },
        ),
        Err(e) => (
            Probe::no(e.to_string()),
            Probe::no("not checked: no answer"),
        ),
    };
    let tool_choice = if !provider.sends_tool_choice() {
        Probe::no(
            "refused tool_choice \"auto\"; skillbox leaves it out, and the server decides alone whether the model may call a tool",
        )
    } else if answer.is_ok() {
        Probe::ok("takes tool_choice \"auto\"")
    } else {
        Probe::no("not checked: no answer")
    };
    let streaming = streaming(provider, cancel).await;
    ModelReport {
        model: provider.name(),
        endpoint: provider.endpoint().to_string(),
        usable: chat.ok,
        listed,
        chat,
        tools,
        tool_choice,
        streaming,
    }
}

/// `GET {base}/models`: whether the model is among those listed.
async fn listed(provider: &OpenAiProvider, cancel: &CancellationToken) -> Probe {
    let config = provider.config();
    let url = format!("{}/models", config.base_url.trim().trim_end_matches('/'));
    let mut request = provider.http().get(&url).timeout(config.timeout);
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key);
    }
    let answer = tokio::select! {
        biased;
        () = cancel.cancelled() => return Probe::no("cancelled"),
        answer = async { request.send().await?.error_for_status()?.json::<serde_json::Value>().await } => answer,
    };
    match answer {
        Ok(json) => {
            let ids: Vec<&str> = json["data"]
                .as_array()
                .map(|models| models.iter().filter_map(|m| m["id"].as_str()).collect())
                .unwrap_or_default();
            if ids.contains(&config.model.as_str()) {
                Probe::ok(format!("GET /models lists {}", config.model))
            } else {
                Probe::no(format!(
                    "GET /models lists {}, not {} (some servers answer any name with the model they loaded)",
                    if ids.is_empty() {
                        "nothing".to_string()
                    } else {
                        ids.join(", ")
                    },
                    config.model
                ))
            }
        }
        Err(e) => Probe::no(format!("GET /models: {}", error_chain(&e))),
    }
}

/// One `stream: true` request, read up to its first event.
async fn streaming(provider: &OpenAiProvider, cancel: &CancellationToken) -> Probe {
    let config = provider.config();
    let body = json!({
        "model": config.model,
        "messages": [{"role": "user", "content": "Say ok."}],
        "stream": true,
    });
    let mut request = provider
        .http()
        .post(provider.endpoint().clone())
        .json(&body)
        .timeout(config.timeout);
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key);
    }
    let peek = async {
        let mut response = request.send().await.map_err(|e| error_chain(&e))?;
        let status = response.status();
        let event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut head = Vec::new();
        while head.len() < STREAM_PEEK_BYTES && !String::from_utf8_lossy(&head).contains("data:") {
            match response.chunk().await.map_err(|e| error_chain(&e))? {
                Some(chunk) => head.extend_from_slice(&chunk),
                None => break,
            }
        }
        Ok::<_, String>((
            status,
            event_stream,
            String::from_utf8_lossy(&head).into_owned(),
        ))
    };
    let outcome = tokio::select! {
        biased;
        () = cancel.cancelled() => return Probe::no("cancelled"),
        outcome = tokio::time::timeout(config.timeout + Duration::from_secs(1), peek) => outcome,
    };
    match outcome {
        Err(_) => Probe::no(format!("no event within {} s", config.timeout.as_secs())),
        Ok(Err(e)) => Probe::no(e),
        Ok(Ok((status, _, head))) if !status.is_success() => Probe::no(format!(
            "stream: true answered HTTP {}: {}",
            status.as_u16(),
            cut(head.trim(), QUOTED_CHARS)
        )),
        Ok(Ok((_, true, head))) if head.contains("data:") => {
            Probe::ok("answers stream: true with server-sent events (skillbox does not stream)")
        }
        Ok(Ok((_, _, head))) => Probe::no(format!(
            "stream: true was not answered with server-sent events: {}",
            cut(head.trim(), QUOTED_CHARS)
        )),
    }
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}
