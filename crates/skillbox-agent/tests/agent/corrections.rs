//! The loop with a model that answers like a small real one, served by the scripted
//! OpenAI-compatible server on loopback: prose with a code block and no tool call, a
//! tool call whose arguments are not JSON. Each goes back to the model as a correction,
//! and only maxTurns ends the run. Assertions are on the outcome and on what the server
//! received.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skillbox_agent::{AgentConfig, AgentOutcome, AgentStatus, CorrectionKind};
use skillbox_env::CancellationToken;

use crate::loop_edges::{GENERIC, agent, quiet};
use crate::openai::{Answer, Server, completion, ok};

pub(crate) fn prose(text: &str) -> Answer {
    ok(completion(json!({"role": "assistant", "content": text})))
}

/// An answer with one tool call per `(id, name, arguments)`; `arguments` is sent as is,
/// so a string that is not JSON reaches the provider like a small model's output.
pub(crate) fn calls(calls: &[(&str, &str, &str)]) -> Answer {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        })
        .collect();
    ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
    ))
}

pub(crate) fn run_script(script: &str) -> String {
    json!({"language": "sh", "script": script}).to_string()
}

/// Runs the agent against `server`; `None` when the native sandbox is not here (skipped).
pub(crate) async fn run(server: &Server, max_turns: u32) -> Option<AgentOutcome> {
    run_with(
        server,
        AgentConfig {
            max_turns,
            ..AgentConfig::default()
        },
    )
    .await
}

/// [`run`] with `config`.
pub(crate) async fn run_with(server: &Server, config: AgentConfig) -> Option<AgentOutcome> {
    let (agent, _objects) = agent(Arc::new(server.provider(0))).await?;
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        agent.run(
            "Make made.txt",
            &GENERIC,
            &config,
            &CancellationToken::new(),
            &quiet,
        ),
    )
    .await
    .expect("a guard against a hang")
    .expect("the run happens");
    Some(outcome)
}

/// The messages of the `n`th request (from 0) the server received.
pub(crate) fn messages(server: &Server, n: usize) -> Vec<Value> {
    server.seen()[n].body["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

/// The OpenAI rule every request must keep: an assistant message's tool calls are each
/// answered, in order, by the tool messages right after it, under their ids.
pub(crate) fn assert_every_call_answered(messages: &[Value]) {
    for (i, message) in messages.iter().enumerate() {
        let Some(calls) = message["tool_calls"].as_array() else {
            continue;
        };
        let ids: Vec<&Value> = calls.iter().map(|c| &c["id"]).collect();
        let answers: Vec<&Value> = messages[i + 1..]
            .iter()
            .take_while(|m| m["role"] == "tool")
            .map(|m| &m["tool_call_id"])
            .collect();
        assert_eq!(answers, ids, "message {i} of {messages:#?}");
    }
}

pub(crate) fn error_of(tool_message: &Value) -> String {
    let content: Value =
        serde_json::from_str(tool_message["content"].as_str().expect("content")).expect("JSON");
    content["error"].as_str().expect("an error").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prose_with_a_code_block_is_corrected_and_the_run_then_succeeds() {
    let server = Server::start(vec![
        prose("Here is the script:\n\n```sh\necho ok > made.txt\n```\n\nRun it and you are done."),
        calls(&[("call_1", "run_script", &run_script("echo ok > made.txt"))]),
        prose("Done: made.txt is in /workspace."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.answer, "Done: made.txt is in /workspace.");
    assert_eq!(outcome.attempts.len(), 1);
    assert_eq!(outcome.artifacts[0].path, "made.txt");
    let [correction] = outcome.corrections.as_slice() else {
        panic!("one correction: {:#?}", outcome.corrections)
    };
    assert_eq!(correction.turn, 1);
    assert_eq!(correction.kind, CorrectionKind::NoToolCall);
    assert!(correction.received.contains("```sh"), "{correction:?}");
    // What the model was told: what was wrong, and the real tool with its arguments.
    for needle in [
        "code block but called no tool",
        "nothing ran",
        "call the tool run_script",
        r#"{"language": "node" | "python" | "sh", "script": "<string>"}"#,
    ] {
        assert!(
            correction.message.contains(needle),
            "{needle:?} in {correction:?}"
        );
    }

    assert_eq!(server.seen().len(), 3);
    let second = messages(&server, 1);
    let roles: Vec<&str> = second.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "user"]);
    assert_eq!(second[3]["content"], correction.message.as_str());
    assert_every_call_answered(&messages(&server, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_with_arguments_that_are_not_json_is_answered_under_its_id() {
    // Quotes left unescaped inside the script: the commonest way a small model breaks it.
    let broken = r#"{"language": "sh", "script": "echo "ok" > made.txt"}"#;
    let server = Server::start(vec![
        calls(&[("call_bad", "run_script", broken)]),
        calls(&[("call_good", "run_script", &run_script("echo ok > made.txt"))]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.attempts.len(), 1, "the broken call did not run");
    assert_eq!(outcome.artifacts[0].path, "made.txt");
    let [correction] = outcome.corrections.as_slice() else {
        panic!("one correction: {:#?}", outcome.corrections)
    };
    assert_eq!(correction.turn, 1);
    assert_eq!(correction.kind, CorrectionKind::MalformedCall);
    assert_eq!(correction.tool.as_deref(), Some("run_script"));
    assert_eq!(correction.tool_call_id.as_deref(), Some("call_bad"));
    assert_eq!(correction.received, broken);

    assert_eq!(server.seen().len(), 3);
    let second = messages(&server, 1);
    assert_every_call_answered(&second);
    let roles: Vec<&str> = second.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool"]);
    // The broken call goes back as `{}`, answered by the correction under its id.
    assert_eq!(second[2]["tool_calls"][0]["id"], "call_bad");
    assert_eq!(second[2]["tool_calls"][0]["function"]["arguments"], "{}");
    assert_eq!(second[3]["tool_call_id"], "call_bad");
    let error = error_of(&second[3]);
    assert_eq!(error, correction.message);
    for needle in [
        "run_script: the arguments are not valid JSON (expected `,` or `}` at line 1 column",
        "near: ",
        "nothing ran",
        r#"Call run_script again with one JSON object as its arguments: {"language": "node" | "python" | "sh", "script": "<string>"}"#,
        r#"a double quote as \""#,
    ] {
        assert!(error.contains(needle), "{needle:?} in {error}");
    }
    let third = messages(&server, 2);
    assert_every_call_answered(&third);
    let result: Value = serde_json::from_str(third[5]["content"].as_str().unwrap()).unwrap();
    assert_eq!(third[5]["tool_call_id"], "call_good");
    assert_eq!(result["exitCode"], 0, "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_call_beside_a_good_one_is_corrected_and_the_good_one_runs() {
    let server = Server::start(vec![
        calls(&[
            ("call_a", "run_script", r#"{"language": "sh", "script": "#),
            ("call_b", "run_script", &run_script("echo ok > made.txt")),
            ("call_c", "python", r#"{"code": "print(1)"}"#),
        ]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.attempts.len(), 1);
    let corrected: Vec<Option<&str>> = outcome
        .corrections
        .iter()
        .map(|c| c.tool_call_id.as_deref())
        .collect();
    assert_eq!(corrected, [Some("call_a"), Some("call_c")]);
    let second = messages(&server, 1);
    assert_every_call_answered(&second);
    assert!(
        error_of(&second[3]).contains("EOF while parsing"),
        "{}",
        second[3]
    );
    assert!(
        second[4]["content"]
            .as_str()
            .unwrap()
            .contains("\"exitCode\":0")
    );
    assert!(
        error_of(&second[5]).starts_with("unknown tool \"python\""),
        "{}",
        second[5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prose_every_turn_fails_at_max_turns_with_each_turn_recorded() {
    let max_turns = 3;
    // One answer more than the bound allows: a loop that asked again would get it.
    let answers = (1..=max_turns + 1)
        .map(|n| prose(&format!("Try this ({n}):\n```python\nprint('hi')\n```")))
        .collect();
    let server = Server::start(answers).await;
    let Some(outcome) = run(&server, max_turns).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:#?}");
    assert_eq!(outcome.error, None, "the bound ended it, not an error");
    assert_eq!(
        outcome.reason,
        "the model did not call a tool in 3 turns (maxTurns)"
    );
    assert_eq!(server.seen().len(), max_turns as usize);
    assert!(outcome.attempts.is_empty());
    let turns: Vec<u32> = outcome.corrections.iter().map(|c| c.turn).collect();
    assert_eq!(turns, [1, 2, 3]);
    assert!(
        outcome
            .corrections
            .iter()
            .all(|c| c.kind == CorrectionKind::NoToolCall)
    );
    assert_eq!(outcome.answer, "Try this (3):\n```python\nprint('hi')\n```");
    // The last request carried the first two turns and their corrections.
    let last = messages(&server, 2);
    let roles: Vec<&str> = last.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "user", "assistant", "user"]
    );
    assert_eq!(last[5]["content"], outcome.corrections[1].message.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_calls_every_turn_fail_at_max_turns() {
    let max_turns = 3;
    let answers = (1..=max_turns + 1)
        // Each a little different: the same turn three times would end the run early.
        .map(|n| {
            calls(&[(
                &format!("call_{n}"),
                "run_script",
                &format!("{{'language': 'sh', 'script': 'echo {n}'}}"),
            )])
        })
        .collect();
    let server = Server::start(answers).await;
    let Some(outcome) = run(&server, max_turns).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:#?}");
    assert_eq!(outcome.error, None, "the bound ended it, not an error");
    assert!(
        outcome
            .reason
            .starts_with("malformed tool calls until the turn limit"),
        "{}",
        outcome.reason
    );
    assert!(outcome.reason.contains("3 turns"), "{}", outcome.reason);
    assert_eq!(server.seen().len(), max_turns as usize);
    assert!(outcome.attempts.is_empty());
    let ids: Vec<Option<&str>> = outcome
        .corrections
        .iter()
        .map(|c| c.tool_call_id.as_deref())
        .collect();
    assert_eq!(ids, [Some("call_1"), Some("call_2"), Some("call_3")]);
    let last = messages(&server, 2);
    assert_every_call_answered(&last);
    assert_eq!(last.len(), 6);
    assert!(
        error_of(&last[5]).contains("key must be a string"),
        "{}",
        last[5]
    );
}

/// What a small model sends when it empties a script: blank is empty, answered by the
/// schema's `minLength`, and nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_script_is_corrected_and_runs_nothing() {
    let server = Server::start(vec![
        calls(&[("call_empty", "run_script", &run_script("  \n"))]),
        calls(&[("call_good", "run_script", &run_script("echo ok > made.txt"))]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.attempts.len(), 1, "the empty script did not run");
    let [correction] = outcome.corrections.as_slice() else {
        panic!("one correction: {:#?}", outcome.corrections)
    };
    assert_eq!(correction.kind, CorrectionKind::MalformedCall);
    assert!(
        correction
            .message
            .starts_with("run_script: argument \"script\" is empty; nothing ran."),
        "{}",
        correction.message
    );
    assert_eq!(error_of(&messages(&server, 1)[3]), correction.message);
}

/// Arguments under the wrong names: what was sent is named beside what the tool takes;
/// an argument the tool does not take is refused (the schema says
/// `additionalProperties: false`), not silently dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_argument_names_are_named_beside_the_ones_to_send() {
    let server = Server::start(vec![
        calls(&[(
            "call_names",
            "run_script",
            r#"{"lang": "sh", "code": "echo ok > made.txt"}"#,
        )]),
        calls(&[(
            "call_extra",
            "run_script",
            r#"{"language": "sh", "script": "echo ok > made.txt", "timeout": 5}"#,
        )]),
        calls(&[("call_good", "run_script", &run_script("echo ok > made.txt"))]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.attempts.len(), 1);
    let messages: Vec<&str> = outcome
        .corrections
        .iter()
        .map(|c| c.message.as_str())
        .collect();
    let [names, extra] = messages.as_slice() else {
        panic!("two corrections: {messages:#?}")
    };
    assert!(
        names.starts_with(
            r#"run_script: argument "language" is missing (you sent "code" and "lang"; run_script takes "language", "script"); nothing ran."#
        ),
        "{names}"
    );
    assert!(
        extra.starts_with(
            r#"run_script: run_script does not take "timeout" (it takes "language", "script"); nothing ran."#
        ),
        "{extra}"
    );
}

/// Paths a small model makes up: outside the workspace, `..`, a folder that is not
/// there. Each is answered under the call's id with what to give instead, and the run
/// goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_paths_are_answered_and_the_run_goes_on() {
    let write = |path: &str| json!({"path": path, "content": "x"}).to_string();
    let server = Server::start(vec![
        calls(&[
            ("call_abs", "write_file", &write("/path/to/file.txt")),
            ("call_up", "write_file", &write("../escape.txt")),
            ("call_read", "read_file", r#"{"path": "no/such/file.txt"}"#),
            ("call_deep", "write_file", &write("made/deep/a.txt")),
        ]),
        calls(&[(
            "call_good",
            "run_script",
            &run_script("cat made/deep/a.txt > made.txt"),
        )]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    let second = messages(&server, 1);
    assert_every_call_answered(&second);
    let abs = error_of(&second[3]);
    assert!(
        abs.contains("/path/to/file.txt") && abs.contains("outside /workspace"),
        "{abs}"
    );
    let up = error_of(&second[4]);
    assert!(up.contains("../escape.txt"), "{up}");
    let read = error_of(&second[5]);
    assert!(read.contains("no/such/file.txt"), "{read}");
    let deep: Value = serde_json::from_str(second[6]["content"].as_str().unwrap()).unwrap();
    assert_eq!(deep["written"], "/workspace/made/deep/a.txt", "{deep}");
    assert_eq!(outcome.attempts.len(), 1);
    assert_eq!(outcome.attempts[0].exit_code, Some(0), "{outcome:#?}");
}

/// A model that loops on the same failing script: the second time it is not run (it
/// would fail the same way) and the model is told so; the third time ends the run,
/// well before maxAttempts, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_failing_script_is_not_run_again_and_a_third_time_ends_the_run() {
    let failing = run_script("echo boom >&2; exit 3");
    let server = Server::start(vec![
        calls(&[("call_1", "run_script", &failing)]),
        calls(&[("call_2", "run_script", &failing)]),
        calls(&[("call_3", "run_script", &failing)]),
        prose("never asked for"),
    ])
    .await;
    let Some(outcome) = run_with(
        &server,
        AgentConfig {
            max_attempts: 10,
            ..AgentConfig::default()
        },
    )
    .await
    else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:#?}");
    assert_eq!(outcome.error, None, "a clean stop, not an error");
    assert_eq!(
        outcome.reason,
        "stopped early: the model sent the failed script of attempt 1 again, unchanged, 2 times, told each time that it would fail the same way"
    );
    assert_eq!(outcome.attempts.len(), 1, "run once");
    assert_eq!(server.seen().len(), 3);
    let kinds: Vec<CorrectionKind> = outcome.corrections.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            CorrectionKind::RepeatedScript,
            CorrectionKind::RepeatedScript
        ]
    );
    let told = &outcome.corrections[0];
    assert_eq!(told.tool_call_id.as_deref(), Some("call_2"));
    assert_eq!(told.received, "echo boom >&2; exit 3");
    for needle in [
        "run_script: this is the script of attempt 1, which failed (exit 3: boom)",
        "nothing in /workspace has changed since",
        "nothing ran",
        "Sending it unchanged again ends the run.",
    ] {
        assert!(
            told.message.contains(needle),
            "{needle:?} in {}",
            told.message
        );
    }
    assert_eq!(error_of(&messages(&server, 2)[5]), told.message);
}

/// The same script after a file was written is a new try, and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_script_after_a_write_runs_again() {
    let script = run_script("cat input.txt > made.txt");
    let server = Server::start(vec![
        calls(&[("call_1", "run_script", &script)]),
        calls(&[(
            "call_2",
            "write_file",
            r#"{"path": "input.txt", "content": "in"}"#,
        )]),
        calls(&[("call_3", "run_script", &script)]),
        prose("Done."),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.corrections, []);
    let exits: Vec<Option<i32>> = outcome.attempts.iter().map(|a| a.exit_code).collect();
    assert_eq!(exits, [Some(1), Some(0)]);
}

/// A model that never calls a tool and sends the same answer each time: the third
/// identical turn ends the run, before maxTurns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_answer_three_times_ends_the_run_early() {
    let same = "I cannot run scripts, but here is one:\n```sh\necho hi\n```";
    let server = Server::start(vec![
        prose(same),
        prose(same),
        prose(same),
        prose("never asked for"),
    ])
    .await;
    let Some(outcome) = run(&server, 12).await else {
        return;
    };

    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:#?}");
    assert_eq!(outcome.error, None);
    assert_eq!(
        outcome.reason,
        "stopped early: the model sent the same turn 3 times in a row (no tool call), corrected each time"
    );
    assert_eq!(server.seen().len(), 3);
    assert_eq!(outcome.corrections.len(), 3);
}
