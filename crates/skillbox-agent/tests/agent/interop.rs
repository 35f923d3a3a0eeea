//! The loop's requests against a server that enforces the interop rules
//! (design.md §5.5.1) the way the strictest server does (`Server::start_strict`): the
//! session that broke against llama-cpp-python in issue 43, and a refusal reported as
//! the request's fault with the server's words.

use serde_json::{Value, json};
use skillbox_agent::{AgentStatus, CorrectionKind};
use skillbox_env::ErrorCode;

use crate::corrections::{calls, prose, run, run_script};
use crate::openai::{Answer, Server, interop_violations};

/// Issue 43: a tool call, answered; then every later request carries an assistant turn
/// that is only tool calls. Every request of a session with each kind of turn (a call
/// with a nonsense path, a failing script, the same script again, prose, a good script)
/// keeps the rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_of_a_long_session_keeps_the_interop_rules() {
    let failing = run_script("exit 3");
    let server = Server::start_strict(vec![
        calls(&[(
            "call__0_write_file_cmpl-1",
            "write_file",
            r#"{"path": "/path/to/file.txt", "content": "x"}"#,
        )]),
        calls(&[("call__0_run_script_cmpl-2", "run_script", &failing)]),
        calls(&[("call__0_run_script_cmpl-3", "run_script", &failing)]),
        prose("I think it is done."),
        calls(&[(
            "call__0_run_script_cmpl-5",
            "run_script",
            &run_script("echo ok > made.txt"),
        )]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(server.refused(), Vec::<String>::new());
    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.error, None);
    assert_eq!(outcome.attempts.len(), 2);
    let kinds: Vec<CorrectionKind> = outcome.corrections.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [CorrectionKind::RepeatedScript, CorrectionKind::NoToolCall]
    );
    let seen = server.seen();
    assert_eq!(seen.len(), 6);
    for request in seen.iter() {
        assert_eq!(interop_violations(&request.body), Vec::<String>::new());
    }
    // The ids went back as the server made them, and the call-only turns as "".
    let last = &seen[5].body["messages"];
    let ids: Vec<&Value> = last
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["tool_calls"].as_array())
        .map(|calls| &calls[0]["id"])
        .collect();
    assert_eq!(
        ids,
        [
            "call__0_write_file_cmpl-1",
            "call__0_run_script_cmpl-2",
            "call__0_run_script_cmpl-3",
            "call__0_run_script_cmpl-5"
        ]
    );
    assert_eq!(last[2]["content"], "");
}

/// A refusal (here llama-cpp-python's answer when the conversation outgrows the
/// context window) ends the run at once with the server's words and `invalid`: not
/// retried, not `unavailable`, and the attempts until then kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_ends_the_run_as_the_requests_fault() {
    let refusal = json!({"error": {
        "message": "This model's maximum context length is 2048 tokens. However, you requested 2301 tokens (2301 in the messages, None in the completion). Please reduce the length of the messages or completion.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
    }});
    let server = Server::start(vec![
        calls(&[("call_1", "run_script", &run_script("exit 3"))]),
        Answer::Reply {
            status: 400,
            retry_after: Some("0"),
            body: refusal.to_string(),
        },
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:#?}");
    let error = outcome.error.expect("ended on the refusal");
    assert_eq!(error.code, ErrorCode::Invalid);
    assert!(
        error.message.starts_with(
            "the model server refused skillbox's request (HTTP 400): This model's maximum context length is 2048 tokens."
        ),
        "{}",
        error.message
    );
    assert_eq!(outcome.reason, error.message);
    assert_eq!(outcome.attempts.len(), 1, "the attempt before it is kept");
    assert_eq!(server.seen().len(), 2, "not retried");
}

/// Seen with SmolLM2 (issue 43): a `write_file` with a path of thousands of characters,
/// refused, came back in every later request as the model sent it and filled a small
/// context. A refused call's long arguments are cut in the history; a script that ran
/// stays as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_calls_long_arguments_are_cut_in_the_history() {
    let nonsense = "a/".repeat(2500);
    let script = format!("echo {} > made.txt", "x".repeat(600));
    let server = Server::start_strict(vec![
        calls(&[(
            "call_1",
            "write_file",
            &json!({"path": nonsense, "content": "y"}).to_string(),
        )]),
        calls(&[("call_2", "run_script", &run_script(&script))]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(server.refused(), Vec::<String>::new());
    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    let arguments = |request: usize, id: &str| -> Value {
        let messages = seen[request].body["messages"].as_array().unwrap().clone();
        let call = messages
            .iter()
            .filter_map(|m| m["tool_calls"].as_array())
            .flatten()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("no call {id} in request {request}"))
            .clone();
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
    };
    for request in [1, 2] {
        let path = arguments(request, "call_1")["path"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(path.len() < 300, "{} bytes", path.len());
        assert!(path.starts_with("a/a/a/"), "{path}");
        assert!(path.contains("5000 bytes in all"), "{path}");
    }
    let sent = arguments(2, "call_2");
    assert!(
        sent.to_string().contains(&"x".repeat(600)),
        "the script that ran is kept whole"
    );
}
