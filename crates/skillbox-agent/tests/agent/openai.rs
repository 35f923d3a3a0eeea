//! `OpenAiProvider` against a loopback `/chat/completions` server started in each test:
//! the request it sends, the answers it accepts and rejects, retries, timeouts,
//! cancellation. No network.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use serde_json::{Value, json};
use skillbox_agent::openai::{OpenAiConfig, OpenAiProvider};
use skillbox_agent::{Message, ModelProvider, ProviderError, Role, ToolCall, ToolSpec, Usage};
use skillbox_env::CancellationToken;
use tokio::sync::Notify;

/// Bounds every wait in these tests; nothing should come near it.
const GUARD: Duration = Duration::from_secs(20);

/// What the loopback server does with the next request.
pub(crate) enum Answer {
    Reply {
        status: u16,
        retry_after: Option<&'static str>,
        body: String,
    },
    /// Holds the request open until the client goes away.
    Hang,
    /// Server-sent events, as a streaming server answers `stream: true`.
    Stream(&'static str),
}

pub(crate) fn ok(body: Value) -> Answer {
    Answer::Reply {
        status: 200,
        retry_after: None,
        body: body.to_string(),
    }
}

fn status(status: u16, retry_after: Option<&'static str>, body: &str) -> Answer {
    Answer::Reply {
        status,
        retry_after,
        body: body.to_string(),
    }
}

/// A request as the server saw it.
#[derive(Debug)]
pub(crate) struct Seen {
    authorization: Option<String>,
    content_type: Option<String>,
    pub(crate) body: Value,
}

#[derive(Default)]
struct Script {
    answers: Mutex<VecDeque<Answer>>,
    seen: Mutex<Vec<Seen>>,
    hit: Notify,
    /// Refuse requests that break the interop rules, as the strictest servers do.
    strict: bool,
    /// What the strict server refused, one line per request.
    refused: Mutex<Vec<String>>,
}

/// A scripted OpenAI-compatible server on loopback: it answers requests in order and
/// keeps what it received.
pub(crate) struct Server {
    base_url: String,
    script: Arc<Script>,
}

impl Server {
    pub(crate) async fn start(answers: Vec<Answer>) -> Server {
        Server::serve(answers, false).await
    }

    /// A server that refuses, as llama-cpp-python does (HTTP 500, `validation error`),
    /// every request that breaks a rule one of the servers people run enforces
    /// ([`interop_violations`]); the answers go out only to requests that keep them.
    pub(crate) async fn start_strict(answers: Vec<Answer>) -> Server {
        Server::serve(answers, true).await
    }

    async fn serve(answers: Vec<Answer>, strict: bool) -> Server {
        let script = Arc::new(Script {
            answers: Mutex::new(answers.into()),
            strict,
            ..Script::default()
        });
        let app = axum::Router::new()
            .route("/v1/chat/completions", post(chat))
            .route(
                "/v1/models",
                axum::routing::get(|| async {
                    axum::Json(json!({"object": "list", "data": [{"id": "test-model", "object": "model"}]}))
                }),
            )
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server {
            base_url: format!("http://{addr}/v1"),
            script,
        }
    }

    fn config(&self, max_retries: u32) -> OpenAiConfig {
        OpenAiConfig {
            base_url: self.base_url.clone(),
            model: "test-model".to_string(),
            api_key: None,
            timeout: Duration::from_secs(10),
            max_retries,
        }
    }

    pub(crate) fn provider(&self, max_retries: u32) -> OpenAiProvider {
        OpenAiProvider::new(self.config(max_retries)).unwrap()
    }

    pub(crate) fn seen(&self) -> std::sync::MutexGuard<'_, Vec<Seen>> {
        self.script.seen.lock().unwrap()
    }

    /// What the strict server refused (empty: every request kept the rules).
    pub(crate) fn refused(&self) -> Vec<String> {
        self.script.refused.lock().unwrap().clone()
    }
}

/// The rules a chat request must keep for every OpenAI-compatible server in
/// design.md §5.5.1, checked as the strictest of them does; each break, named.
/// - llama-cpp-python (its pydantic schema): every message's `content` is a string
///   (an assistant turn with only tool calls included); a tool message has a string
///   `tool_call_id`.
/// - OpenAI: each tool call of an assistant turn is answered by the tool messages right
///   after it, under its id; `tool_choice` only with `tools`, and `tools` never empty.
/// - vLLM: an earlier call's `arguments` are a string holding a JSON object.
/// - every server: no field beyond `model`, `messages`, `tools`, `tool_choice`
///   (`parallel_tool_calls`, `stream`, `max_tokens` are each refused by one).
pub(crate) fn interop_violations(body: &Value) -> Vec<String> {
    let mut broken = Vec::new();
    let Some(request) = body.as_object() else {
        return vec!["the body is not a JSON object".into()];
    };
    for key in request.keys() {
        if !["model", "messages", "tools", "tool_choice"].contains(&key.as_str()) {
            broken.push(format!("field {key:?} is not one every server takes"));
        }
    }
    if !request.get("model").is_some_and(Value::is_string) {
        broken.push("model: not a string".into());
    }
    match request.get("tools") {
        Some(Value::Array(tools)) if tools.is_empty() => broken.push("tools: empty".into()),
        None if request.contains_key("tool_choice") => {
            broken.push("tool_choice without tools".into());
        }
        _ => {}
    }
    if let Some(choice) = request.get("tool_choice")
        && choice != "auto"
    {
        broken.push(format!("tool_choice: {choice}, not \"auto\""));
    }
    let messages = request
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if messages.is_empty() {
        broken.push("messages: none".into());
    }
    for (i, message) in messages.iter().enumerate() {
        if !message["content"].is_string() {
            broken.push(format!(
                "messages.{i}.content: {}, not a string",
                message["content"]
            ));
        }
        match message["role"].as_str() {
            Some("system" | "user") => {}
            Some("tool") => {
                if !message["tool_call_id"].is_string() {
                    broken.push(format!("messages.{i}.tool_call_id: not a string"));
                }
            }
            Some("assistant") => {
                let calls = message
                    .get("tool_calls")
                    .map(|calls| calls.as_array().cloned().unwrap_or_default());
                if calls.as_ref().is_some_and(Vec::is_empty) {
                    broken.push(format!("messages.{i}.tool_calls: empty"));
                }
                for (j, call) in calls.iter().flatten().enumerate() {
                    let at = format!("messages.{i}.tool_calls.{j}");
                    if call["id"].as_str().is_none_or(str::is_empty) {
                        broken.push(format!("{at}.id: missing"));
                    }
                    if call["type"] != "function" {
                        broken.push(format!("{at}.type: not \"function\""));
                    }
                    let object = call["function"]["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                        .is_some_and(|a| a.is_object());
                    if !object {
                        broken.push(format!(
                            "{at}.function.arguments: not a JSON object in a string"
                        ));
                    }
                    let answer = messages.get(i + 1 + j);
                    if answer.is_none_or(|m| m["role"] != "tool" || m["tool_call_id"] != call["id"])
                    {
                        broken.push(format!(
                            "{at}: not answered by messages.{} under its id",
                            i + 1 + j
                        ));
                    }
                }
            }
            other => broken.push(format!("messages.{i}.role: {other:?}")),
        }
    }
    broken
}

async fn chat(State(script): State<Arc<Script>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_string());
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let broken = if script.strict {
        interop_violations(&body)
    } else {
        Vec::new()
    };
    script.seen.lock().unwrap().push(Seen {
        authorization: header("authorization"),
        content_type: header("content-type"),
        body,
    });
    if !broken.is_empty() {
        let message = format!(
            "{} validation errors for CreateChatCompletionRequest\n{}",
            broken.len(),
            broken.join("\n")
        );
        script.refused.lock().unwrap().push(message.clone());
        script.hit.notify_one();
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            [("content-type", "application/json")],
            json!({"error": {"message": message, "type": "internal_server_error", "param": null, "code": null}}).to_string(),
        )
            .into_response();
    }
    let answer = script.answers.lock().unwrap().pop_front();
    script.hit.notify_one();
    match answer {
        Some(Answer::Reply {
            status,
            retry_after,
            body,
        }) => {
            let status = StatusCode::from_u16(status).unwrap();
            let mut response =
                (status, [("content-type", "application/json")], body).into_response();
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert("retry-after", seconds.parse().unwrap());
            }
            response
        }
        Some(Answer::Hang) => std::future::pending().await,
        Some(Answer::Stream(events)) => (
            StatusCode::OK,
            [("content-type", "text/event-stream")],
            events,
        )
            .into_response(),
        // 418 is not retried, so a test that sends too many requests fails loudly.
        None => (StatusCode::IM_A_TEAPOT, "unscripted request").into_response(),
    }
}

pub(crate) fn completion(message: Value) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    })
}

fn write_file_tool() -> ToolSpec {
    ToolSpec {
        name: "write_file".to_string(),
        description: "Write a file in the workspace".to_string(),
        parameters: json!({
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
        }),
    }
}

fn tool_call_answer(id: Value, arguments: Value) -> Value {
    completion(json!({
        "role": "assistant",
        "content": null,
        "tool_calls": [{
            "id": id,
            "type": "function",
            "function": {"name": "write_file", "arguments": arguments},
        }],
    }))
}

async fn complete(
    provider: &OpenAiProvider,
    messages: &[Message],
    tools: &[ToolSpec],
) -> Result<skillbox_agent::Reply, ProviderError> {
    tokio::time::timeout(
        GUARD,
        provider.complete(messages, tools, &CancellationToken::new()),
    )
    .await
    .expect("the provider answered within the guard")
}

#[tokio::test]
async fn tool_call_is_parsed_and_request_has_the_wire_shape() {
    let server = Server::start(vec![ok(tool_call_answer(
        json!("call_2"),
        json!(r#"{"path": "deck.js", "content": "console.log(1)"}"#),
    ))])
    .await;
    let provider = OpenAiProvider::new(OpenAiConfig {
        api_key: Some("sk-test".to_string()),
        ..server.config(0)
    })
    .unwrap();
    let history = vec![
        Message::system("You write scripts."),
        Message::user("Make a deck."),
        Message {
            role: Role::Assistant,
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: "call_1".to_string(),
                name: "write_file".to_string(),
                arguments: json!({"path": "a.js", "content": "x"}),
                raw_arguments: None,
            }],
            tool_call_id: None,
        },
        Message::tool("call_1", "written"),
    ];

    let reply = complete(&provider, &history, &[write_file_tool()])
        .await
        .unwrap();

    assert_eq!(reply.message.role, Role::Assistant);
    assert_eq!(reply.message.content, "");
    assert_eq!(
        reply.message.tool_calls,
        vec![ToolCall {
            id: "call_2".to_string(),
            name: "write_file".to_string(),
            arguments: json!({"path": "deck.js", "content": "console.log(1)"}),
            raw_arguments: None,
        }]
    );
    assert_eq!(reply.usage, None);

    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let request = &seen[0];
    assert_eq!(request.authorization.as_deref(), Some("Bearer sk-test"));
    assert_eq!(request.content_type.as_deref(), Some("application/json"));
    let body = &request.body;
    assert_eq!(body["model"], "test-model");
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    assert_eq!(body["messages"][0]["content"], "You write scripts.");
    assert_eq!(body["messages"][1]["content"], "Make a deck.");
    let assistant = &body["messages"][2];
    // A string, never null: llama-cpp-python refuses null (issue 43).
    assert_eq!(assistant["content"], "");
    assert_eq!(interop_violations(body), Vec::<String>::new());
    let call = &assistant["tool_calls"][0];
    assert_eq!(call["id"], "call_1");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "write_file");
    let arguments = call["function"]["arguments"]
        .as_str()
        .expect("arguments travel as a JSON string");
    assert_eq!(
        serde_json::from_str::<Value>(arguments).unwrap(),
        json!({"path": "a.js", "content": "x"})
    );
    assert_eq!(body["messages"][3]["tool_call_id"], "call_1");
    assert_eq!(body["messages"][3]["content"], "written");
    assert!(body["messages"][1].get("tool_call_id").is_none());
    assert!(body["messages"][1].get("tool_calls").is_none());
    assert_eq!(
        body["tools"],
        json!([{
            "type": "function",
            "function": {
                "name": "write_file",
                "description": "Write a file in the workspace",
                "parameters": write_file_tool().parameters,
            },
        }])
    );
    assert_eq!(body["tool_choice"], "auto");
}

#[tokio::test]
async fn plain_text_answer_maps_content_and_usage_and_sends_no_key_or_tools() {
    let mut answer = completion(json!({"role": "assistant", "content": "All done."}));
    answer["usage"] = json!({"prompt_tokens": 120, "completion_tokens": 7, "total_tokens": 127});
    let server = Server::start(vec![ok(answer)]).await;
    let provider = server.provider(0);

    let reply = complete(&provider, &[Message::user("hi")], &[])
        .await
        .unwrap();

    assert_eq!(reply.message.role, Role::Assistant);
    assert_eq!(reply.message.content, "All done.");
    assert!(reply.message.tool_calls.is_empty());
    assert_eq!(
        reply.usage,
        Some(Usage {
            prompt_tokens: 120,
            completion_tokens: 7
        })
    );
    let seen = server.seen();
    assert_eq!(seen[0].authorization, None);
    let body = seen[0].body.as_object().unwrap();
    assert!(
        !body.contains_key("tools"),
        "an empty tools array is rejected by the API: {body:?}"
    );
    assert!(!body.contains_key("tool_choice"), "{body:?}");
}

#[tokio::test]
async fn name_says_openai_and_the_model() {
    let server = Server::start(vec![]).await;
    assert_eq!(server.provider(0).name(), "openai:test-model");
    assert!(!server.provider(0).is_scripted());
}

#[tokio::test]
async fn a_429_is_retried_honouring_retry_after() {
    // Which delay `Retry-After` selects is checked by a unit test (no timing here);
    // this checks the retries happen and the sixth answer comes through.
    let mut answers: Vec<Answer> = (0..5)
        .map(|_| status(429, Some("0"), r#"{"error":{"message":"slow down"}}"#))
        .collect();
    answers.push(ok(completion(
        json!({"role": "assistant", "content": "sixth try"}),
    )));
    let server = Server::start(answers).await;
    let provider = server.provider(5);

    let reply = tokio::time::timeout(
        Duration::from_secs(120),
        provider.complete(&[Message::user("hi")], &[], &CancellationToken::new()),
    )
    .await
    .expect("a guard against a hang, not a speed check")
    .unwrap();

    assert_eq!(reply.message.content, "sixth try");
    assert_eq!(server.seen().len(), 6);
}

#[tokio::test]
async fn a_503_without_retry_after_is_retried_after_backoff() {
    let server = Server::start(vec![
        status(503, None, "overloaded"),
        ok(completion(json!({"role": "assistant", "content": "back"}))),
    ])
    .await;

    let reply = complete(&server.provider(1), &[Message::user("hi")], &[])
        .await
        .unwrap();

    assert_eq!(reply.message.content, "back");
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn persistent_500_gives_up_after_max_retries_with_the_http_error() {
    let max_retries = 2;
    let answers = (0..=max_retries)
        .map(|_| status(500, Some("0"), "upstream broke"))
        .collect();
    let server = Server::start(answers).await;

    let error = complete(&server.provider(max_retries), &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    assert_eq!(
        error,
        ProviderError::Http {
            status: 500,
            body: "upstream broke".to_string()
        }
    );
    assert_eq!(server.seen().len(), max_retries as usize + 1);
}

#[tokio::test]
async fn a_400_is_refused_not_retried_with_the_servers_message_cut_to_500_chars() {
    let long = format!(
        r#"{{"error":{{"message":"bad request {}","type":"invalid_request_error"}}}}"#,
        "é".repeat(2000)
    );
    let server = Server::start(vec![status(400, Some("0"), &long)]).await;

    let error = complete(&server.provider(3), &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    let ProviderError::Refused { status, message } = error else {
        panic!("expected Refused, got {error:?}")
    };
    assert_eq!(status, 400);
    assert_eq!(message.chars().count(), 500);
    assert!(message.starts_with("bad request éé"), "{message}");
    assert_eq!(server.seen().len(), 1);
}

/// llama-cpp-python answers a request its schema refuses with a 500 whose message
/// says `validation error`: the request's fault, so not retried as if the server were
/// down, and reported with the server's words (issue 43's run ended `unavailable`).
#[tokio::test]
async fn a_500_that_says_validation_is_refused_not_retried() {
    let body = json!({"error": {
        "message": "1 validation error for CreateChatCompletionRequest\nmessages.2.ChatCompletionRequestAssistantMessage.content\n  Input should be a valid string [type=string_type, input_value=None, input_type=NoneType]",
        "type": "internal_server_error", "param": null, "code": null,
    }});
    let server = Server::start(vec![status(500, Some("0"), &body.to_string())]).await;

    let error = complete(&server.provider(3), &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    let ProviderError::Refused { status, message } = &error else {
        panic!("expected Refused, got {error:?}")
    };
    assert_eq!(*status, 500);
    assert!(
        message.starts_with("1 validation error for CreateChatCompletionRequest"),
        "{message}"
    );
    assert!(
        message.contains("Input should be a valid string"),
        "{message}"
    );
    assert!(
        error
            .to_string()
            .starts_with("the model server refused skillbox's request (HTTP 500): "),
        "{error}"
    );
    assert_eq!(server.seen().len(), 1, "not retried");
}

/// Each server family's error body gives its message; the statuses that point at the
/// configuration say which variable to check.
#[tokio::test]
async fn refusals_carry_the_servers_message_and_what_to_check() {
    let cases: Vec<(u16, Value, &[&str])> = vec![
        (
            401,
            json!({"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}),
            &["Incorrect API key provided", "SKILLBOX_API_KEY"],
        ),
        (
            404,
            json!({"error": "model \"llama9\" not found, try pulling it first"}),
            &[
                "model \"llama9\" not found",
                "SKILLBOX_MODEL_URL",
                "SKILLBOX_MODEL",
            ],
        ),
        (
            422,
            json!({"detail": [{"loc": ["body", "messages", 2, "content"], "msg": "Input should be a valid string", "type": "string_type"}]}),
            &["validation error: body.messages.2.content: Input should be a valid string"],
        ),
        (
            400,
            json!({"message": "tools are not supported by this model"}),
            &["tools are not supported by this model"],
        ),
    ];
    for (code, body, needles) in cases {
        let server = Server::start(vec![status(code, None, &body.to_string())]).await;
        let error = complete(&server.provider(3), &[Message::user("hi")], &[])
            .await
            .unwrap_err();
        let ProviderError::Refused { status, message } = &error else {
            panic!("{code}: expected Refused, got {error:?}")
        };
        assert_eq!(*status, code);
        for needle in needles {
            assert!(message.contains(needle), "{code}: {needle:?} in {message}");
        }
        assert_eq!(server.seen().len(), 1, "{code}: not retried");
    }
    // A 500 that does not say validation is the server's trouble: retried.
    let server = Server::start(vec![
        status(
            500,
            Some("0"),
            r#"{"error":{"message":"CUDA out of memory"}}"#,
        ),
        ok(completion(json!({"role": "assistant", "content": "back"}))),
    ])
    .await;
    let reply = complete(&server.provider(1), &[Message::user("hi")], &[])
        .await
        .unwrap();
    assert_eq!(reply.message.content, "back");
}

/// vLLM started without --enable-auto-tool-choice refuses `tool_choice: "auto"`: the
/// same request goes once more without it, and later ones leave it out.
#[tokio::test]
async fn a_refused_tool_choice_is_left_out_from_then_on() {
    let refusal = json!({"object": "error", "message": "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set", "type": "BadRequestError", "code": 400});
    let server = Server::start(vec![
        status(400, None, &refusal.to_string()),
        ok(completion(json!({"role": "assistant", "content": "one"}))),
        ok(completion(json!({"role": "assistant", "content": "two"}))),
    ])
    .await;
    let provider = server.provider(0);
    assert!(provider.sends_tool_choice());

    let first = complete(&provider, &[Message::user("hi")], &[write_file_tool()])
        .await
        .unwrap();
    let second = complete(&provider, &[Message::user("hi")], &[write_file_tool()])
        .await
        .unwrap();

    assert_eq!(
        (
            first.message.content.as_str(),
            second.message.content.as_str()
        ),
        ("one", "two")
    );
    assert!(!provider.sends_tool_choice());
    let seen = server.seen();
    let choices: Vec<&Value> = seen.iter().map(|s| &s.body["tool_choice"]).collect();
    assert_eq!(choices, [&json!("auto"), &Value::Null, &Value::Null]);
    assert!(seen.iter().all(|s| s.body["tools"].is_array()));
}

/// The strict server's rules can fail: each break in a request is named.
#[test]
fn the_interop_rules_name_each_break() {
    let good = json!({
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
    });
    assert_eq!(interop_violations(&good), Vec::<String>::new());
    let mut bad = good.clone();
    bad["messages"][1]["content"] = Value::Null;
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{\"a\": ");
    bad["messages"][2]["tool_call_id"] = json!("other");
    bad["parallel_tool_calls"] = json!(true);
    bad.as_object_mut().unwrap().remove("tools");
    assert_eq!(
        interop_violations(&bad),
        [
            "field \"parallel_tool_calls\" is not one every server takes",
            "tool_choice without tools",
            "messages.1.content: null, not a string",
            "messages.1.tool_calls.0.function.arguments: not a JSON object in a string",
            "messages.1.tool_calls.0: not answered by messages.2 under its id",
        ]
    );
}

// Arguments that are not a JSON object are the model's mistake: the call comes through,
// with what was sent, for the loop to correct; the rest of the answer is not lost.
#[tokio::test]
async fn unparsable_arguments_are_handed_over_raw_and_go_back_as_an_empty_object() {
    let raw = r#"{"path": "deck.js", "content": "say "hi""}"#;
    let server = Server::start(vec![
        ok(tool_call_answer(json!("call_9"), json!(raw))),
        ok(completion(json!({"role": "assistant", "content": "ok"}))),
    ])
    .await;
    let provider = server.provider(0);

    let reply = complete(&provider, &[Message::user("hi")], &[write_file_tool()])
        .await
        .unwrap();

    assert_eq!(
        reply.message.tool_calls,
        vec![ToolCall {
            id: "call_9".to_string(),
            name: "write_file".to_string(),
            arguments: json!({}),
            raw_arguments: Some(raw.to_string()),
        }]
    );
    // Sent back in the history, the call carries `{}`: servers that parse earlier
    // calls' arguments (vLLM) would refuse the request over the model's broken JSON.
    let history = vec![
        Message::user("hi"),
        reply.message,
        Message::tool("call_9", "corrected"),
    ];
    complete(&provider, &history, &[write_file_tool()])
        .await
        .unwrap();
    let seen = server.seen();
    let call = &seen[1].body["messages"][1]["tool_calls"][0];
    assert_eq!(call["id"], "call_9");
    assert_eq!(call["function"]["arguments"], "{}");
}

#[tokio::test]
async fn arguments_that_are_not_an_object_or_missing_are_handed_over_raw() {
    let mut answer = tool_call_answer(json!("call_3"), json!("[1, 2]"));
    answer["choices"][0]["message"]["tool_calls"]
        .as_array_mut()
        .unwrap()
        .extend([
            json!({"id": "call_4", "type": "function", "function": {"name": "write_file", "arguments": 7}}),
            json!({"id": "call_5", "type": "function", "function": {"name": "write_file"}}),
            json!({"id": "call_6", "type": "function", "function": {"name": "write_file", "arguments": {"path": "a"}}}),
        ]);
    let server = Server::start(vec![ok(answer)]).await;

    let reply = complete(
        &server.provider(0),
        &[Message::user("hi")],
        &[write_file_tool()],
    )
    .await
    .unwrap();

    let calls: Vec<(&str, &Value, Option<&str>)> = reply
        .message
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), &c.arguments, c.raw_arguments.as_deref()))
        .collect();
    assert_eq!(
        calls,
        [
            ("call_3", &json!({}), Some("[1, 2]")),
            ("call_4", &json!({}), Some("7")),
            ("call_5", &json!({}), Some("")),
            ("call_6", &json!({"path": "a"}), None),
        ]
    );
}

#[tokio::test]
async fn a_tool_call_without_id_is_malformed() {
    let server = Server::start(vec![ok(tool_call_answer(Value::Null, json!("{}")))]).await;

    let error = complete(
        &server.provider(0),
        &[Message::user("hi")],
        &[write_file_tool()],
    )
    .await
    .unwrap_err();

    let ProviderError::Malformed(message) = error else {
        panic!("expected Malformed, got {error:?}")
    };
    assert!(
        message.contains("write_file") && message.contains("no id"),
        "{message}"
    );
}

#[tokio::test]
async fn an_answer_without_choices_is_malformed() {
    let server = Server::start(vec![ok(json!({"choices": []}))]).await;

    let error = complete(&server.provider(0), &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    assert!(
        matches!(&error, ProviderError::Malformed(m) if m.contains("no choices")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out_without_retry() {
    let server = Server::start(vec![Answer::Hang, Answer::Hang]).await;
    let provider = OpenAiProvider::new(OpenAiConfig {
        timeout: Duration::from_millis(300),
        ..server.config(3)
    })
    .unwrap();

    let error = complete(&provider, &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    assert_eq!(error, ProviderError::Timeout(300));
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn cancel_aborts_an_in_flight_request() {
    let server = Server::start(vec![Answer::Hang]).await;
    let provider = OpenAiProvider::new(OpenAiConfig {
        timeout: Duration::from_secs(600),
        ..server.config(3)
    })
    .unwrap();
    let cancel = CancellationToken::new();
    let request = tokio::spawn({
        let cancel = cancel.clone();
        async move {
            provider
                .complete(&[Message::user("hi")], &[], &cancel)
                .await
        }
    });

    tokio::time::timeout(GUARD, server.script.hit.notified())
        .await
        .expect("the request arrived");
    cancel.cancel();
    let result = tokio::time::timeout(GUARD, request)
        .await
        .expect("cancel ended the request")
        .unwrap();

    assert_eq!(result.unwrap_err(), ProviderError::Cancelled);
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_cancelled_token_sends_nothing() {
    let server = Server::start(vec![]).await;
    let cancel = CancellationToken::new();
    cancel.cancel();

    let error = server
        .provider(0)
        .complete(&[Message::user("hi")], &[], &cancel)
        .await
        .unwrap_err();

    assert_eq!(error, ProviderError::Cancelled);
    assert_eq!(server.seen().len(), 0);
}

#[tokio::test]
async fn a_closed_port_is_unreachable_naming_the_url() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let base_url = format!("http://127.0.0.1:{port}/v1");
    let provider = OpenAiProvider::new(OpenAiConfig {
        max_retries: 1,
        ..OpenAiConfig::new(base_url.clone(), "test-model")
    })
    .unwrap();

    let error = complete(&provider, &[Message::user("hi")], &[])
        .await
        .unwrap_err();

    let ProviderError::Unreachable(message) = error else {
        panic!("expected Unreachable, got {error:?}")
    };
    assert!(message.starts_with(&base_url), "{message}");
    assert!(
        message.len() > base_url.len() + 2,
        "the cause is missing: {message}"
    );
}

fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

#[test]
fn from_lookup_reads_url_model_and_key() {
    let config = OpenAiConfig::from_lookup(lookup(&[
        ("SKILLBOX_MODEL_URL", "https://api.openai.com/v1/"),
        ("SKILLBOX_MODEL", "gpt-4o"),
        ("SKILLBOX_API_KEY", "sk-abc"),
    ]))
    .unwrap();

    assert_eq!(config.base_url, "https://api.openai.com/v1/");
    assert_eq!(config.model, "gpt-4o");
    assert_eq!(config.api_key.as_deref(), Some("sk-abc"));
    assert_eq!(config.timeout, Duration::from_secs(120));
    assert_eq!(config.max_retries, 3);
    assert!(
        !format!("{config:?}").contains("sk-abc"),
        "the key leaks through Debug"
    );
    let provider = OpenAiProvider::new(config).unwrap();
    assert_eq!(provider.name(), "openai:gpt-4o");
}

#[test]
fn from_lookup_treats_an_empty_key_as_none() {
    let config = OpenAiConfig::from_lookup(lookup(&[
        ("SKILLBOX_MODEL_URL", "http://127.0.0.1:8000/v1"),
        ("SKILLBOX_MODEL", "local"),
        ("SKILLBOX_API_KEY", ""),
    ]))
    .unwrap();
    assert_eq!(config.api_key, None);
}

#[test]
fn from_lookup_names_each_missing_variable() {
    let missing_url =
        OpenAiConfig::from_lookup(lookup(&[("SKILLBOX_MODEL", "gpt-4o")])).unwrap_err();
    assert!(
        matches!(&missing_url, ProviderError::Config(m) if m.contains("SKILLBOX_MODEL_URL")),
        "{missing_url:?}"
    );

    let missing_model = OpenAiConfig::from_lookup(lookup(&[(
        "SKILLBOX_MODEL_URL",
        "https://api.openai.com/v1",
    )]))
    .unwrap_err();
    assert!(
        matches!(&missing_model, ProviderError::Config(m) if m.contains("SKILLBOX_MODEL ")),
        "{missing_model:?}"
    );

    let empty_model = OpenAiConfig::from_lookup(lookup(&[
        ("SKILLBOX_MODEL_URL", "https://api.openai.com/v1"),
        ("SKILLBOX_MODEL", "  "),
    ]))
    .unwrap_err();
    assert!(
        matches!(&empty_model, ProviderError::Config(m) if m.contains("SKILLBOX_MODEL ")),
        "{empty_model:?}"
    );
}

#[test]
fn from_lookup_rejects_a_url_that_is_not_http() {
    for url in [
        "ftp://example.com/v1",
        "file:///etc/passwd",
        "api.openai.com/v1",
        "https://example.com/v1?x=1",
    ] {
        let error = OpenAiConfig::from_lookup(lookup(&[
            ("SKILLBOX_MODEL_URL", url),
            ("SKILLBOX_MODEL", "m"),
        ]))
        .unwrap_err();
        assert!(
            matches!(&error, ProviderError::Config(m) if m.contains(url)),
            "{url}: {error:?}"
        );
    }
}

#[test]
fn new_rejects_a_zero_timeout() {
    let error = OpenAiProvider::new(OpenAiConfig {
        timeout: Duration::ZERO,
        ..OpenAiConfig::new("https://api.openai.com/v1", "gpt-4o")
    })
    .unwrap_err();
    assert!(
        matches!(&error, ProviderError::Config(m) if m.contains("timeout")),
        "{error:?}"
    );
}
