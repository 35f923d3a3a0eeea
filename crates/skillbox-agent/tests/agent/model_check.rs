//! `model_check::check` (`skillbox doctor --model openai`) against the scripted server:
//! a server that works, one whose model answers in text, one that refuses the request.

use serde_json::{Value, json};
use skillbox_agent::model_check::check;
use skillbox_env::CancellationToken;

use crate::openai::{Answer, Server, completion, interop_violations, ok};

const EVENTS: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\ndata: [DONE]\n\n";

fn ping_call() -> Answer {
    ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_7", "type": "function", "function": {"name": "ping", "arguments": "{\"message\": \"again\"}"}}
        ]}),
    ))
}

#[tokio::test]
async fn a_working_server_is_usable_and_each_check_says_so() {
    let server = Server::start(vec![ping_call(), Answer::Stream(EVENTS)]).await;

    let report = check(&server.provider(0), &CancellationToken::new()).await;

    assert!(report.usable, "{report:#?}");
    assert_eq!(report.model, "openai:test-model");
    assert!(
        report.endpoint.ends_with("/v1/chat/completions"),
        "{}",
        report.endpoint
    );
    for probe in [
        &report.listed,
        &report.chat,
        &report.tools,
        &report.tool_choice,
        &report.streaming,
    ] {
        assert!(probe.ok, "{report:#?}");
    }
    assert_eq!(report.tools.detail, "the model called ping");
    let seen = server.seen();
    assert_eq!(seen.len(), 2);
    // The first request is the loop's shape: tools, and an earlier call with its result.
    let loop_shape = &seen[0].body;
    assert_eq!(interop_violations(loop_shape), Vec::<String>::new());
    let roles: Vec<&str> = loop_shape["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(loop_shape["tool_choice"], "auto");
    assert_eq!(seen[1].body["stream"], true);
}

#[tokio::test]
async fn a_model_that_answers_in_text_is_usable_but_says_it_called_no_tool() {
    let server = Server::start(vec![
        ok(completion(json!({"role": "assistant", "content": "pong!"}))),
        ok(completion(json!({"role": "assistant", "content": "ok"}))),
    ])
    .await;

    let report = check(&server.provider(0), &CancellationToken::new()).await;

    assert!(report.usable, "{report:#?}");
    assert!(!report.tools.ok);
    assert!(
        report.tools.detail.contains("\"pong!\""),
        "{}",
        report.tools.detail
    );
    assert!(
        report.tools.detail.contains("chatml-function-calling"),
        "{}",
        report.tools.detail
    );
    // A JSON answer to stream: true is not a stream.
    assert!(!report.streaming.ok);
    assert!(
        report
            .streaming
            .detail
            .contains("not answered with server-sent events"),
        "{}",
        report.streaming.detail
    );
}

#[tokio::test]
async fn a_refused_request_makes_the_server_unusable_with_its_message() {
    let refusal = json!({"error": {"message": "The model `gpt-9` does not exist", "type": "invalid_request_error", "code": "model_not_found"}});
    let server = Server::start(vec![
        Answer::Reply {
            status: 400,
            retry_after: None,
            body: refusal.to_string(),
        },
        Answer::Reply {
            status: 400,
            retry_after: None,
            body: refusal.to_string(),
        },
    ])
    .await;

    let report = check(&server.provider(0), &CancellationToken::new()).await;

    assert!(!report.usable, "{report:#?}");
    assert!(!report.chat.ok);
    assert!(
        report
            .chat
            .detail
            .contains("(HTTP 400): The model `gpt-9` does not exist"),
        "{}",
        report.chat.detail
    );
    assert_eq!(report.tools.detail, "not checked: no answer");
    assert!(!report.streaming.ok);
    assert!(
        report.streaming.detail.contains("HTTP 400"),
        "{}",
        report.streaming.detail
    );
    let json: Value = serde_json::to_value(&report).unwrap();
    assert_eq!(json["usable"], false);
    assert_eq!(json["toolChoice"]["ok"], false);
}

#[tokio::test]
async fn a_closed_port_is_reported_not_raised() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let provider =
        skillbox_agent::openai::OpenAiProvider::new(skillbox_agent::openai::OpenAiConfig {
            max_retries: 0,
            ..skillbox_agent::openai::OpenAiConfig::new(format!("http://127.0.0.1:{port}/v1"), "m")
        })
        .unwrap();

    let report = check(&provider, &CancellationToken::new()).await;

    assert!(!report.usable);
    assert!(
        report.chat.detail.starts_with("model provider unreachable"),
        "{}",
        report.chat.detail
    );
    assert!(!report.listed.ok && !report.streaming.ok, "{report:#?}");
}
