//! The agent loop against the real native sandbox, driven by loopback transcripts:
//! the shipped pptx session, the retry limit, cancellation mid-run, malformed tool
//! calls, a provider that never answers, and a verification failure fed back.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;
use skillbox_agent::{
    Agent, AgentConfig, AgentError, AgentEvent, AgentStatus, CorrectionKind, LoopbackProvider,
    Message, ModelProvider, ProviderError, Reply, Skill, ToolSpec, builtin_skill,
};
use skillbox_env::CancellationToken;
use skillbox_run::{Runner, RunnerConfig};
use skillbox_store::ArtifactStore;

/// The Node runtime is installed once for these tests, not per test.
pub(crate) fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-agent-tests")
}

pub(crate) async fn agent(provider: Arc<dyn ModelProvider>) -> Option<(Agent, tempfile::TempDir)> {
    agent_with_budget(provider, None).await
}

/// [`agent`] on a store with a byte budget (`--store-budget`), or none.
async fn agent_with_budget(
    provider: Arc<dyn ModelProvider>,
    budget: Option<u64>,
) -> Option<(Agent, tempfile::TempDir)> {
    let native = skillbox_native::probe();
    if !native.available {
        skillbox_env::testkit::skip("agent", &native.reason.unwrap_or_default());
        return None;
    }
    let objects = tempfile::tempdir().unwrap();
    let mut store = ArtifactStore::local(objects.path()).await.unwrap();
    if let Some(max) = budget {
        store = store.with_budget(max).await.unwrap();
    }
    let runner = Runner::new(RunnerConfig::new(data_dir()), store);
    Some((Agent::new(provider, Arc::new(runner)), objects))
}

fn loopback(turns: serde_json::Value) -> Arc<dyn ModelProvider> {
    Arc::new(LoopbackProvider::from_json(&json!({"turns": turns}).to_string()).expect("transcript"))
}

fn run_script(language: &str, script: &str) -> serde_json::Value {
    json!({"name": "run_script", "arguments": {"language": language, "script": script}})
}

/// Replays `turns` within `max_turns` and checks the run ended on the transcript's
/// "done": every expectation in it held, since a mismatch ends the run with an error.
async fn replays_to_done(turns: serde_json::Value, max_turns: u32) {
    let Some((agent, _objects)) = agent(loopback(turns)).await else {
        return;
    };
    let config = AgentConfig {
        max_turns,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run("go", &GENERIC, &config, &CancellationToken::new(), &quiet)
        .await
        .unwrap();
    assert_eq!(outcome.error, None, "{outcome:?}");
    assert_eq!(outcome.answer, "done");
}

pub(crate) fn quiet(_: AgentEvent<'_>) {}

/// A skill that asks for no particular file, for the loop's generic edges.
pub(crate) const GENERIC: Skill = Skill {
    name: "test",
    instructions: "Run scripts in /workspace.",
    transcript: None,
    requires: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_pptx_session_fails_once_then_ships_a_verified_deck() {
    let skill = builtin_skill("pptx").unwrap();
    let provider = Arc::new(LoopbackProvider::from_json(skill.transcript.unwrap()).unwrap());
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let outcome = agent
        .run(
            "Make a 3-slide pitch deck for WorkspaceX.",
            &skill,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .expect("agent run");
    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:?}");
    assert!(outcome.scripted);
    assert_eq!(outcome.attempts.len(), 2);
    let first = &outcome.attempts[0];
    assert_eq!(first.exit_code, Some(1));
    assert!(
        first.stderr.contains("Missing/Invalid shape parameter"),
        "{}",
        first.stderr
    );
    assert!(!first.succeeded);
    let second = &outcome.attempts[1];
    assert!(second.succeeded, "{second:?}");
    assert_eq!(second.verification[0].slides, Some(3));
    assert_eq!(outcome.artifacts.len(), 1);
    assert_eq!(outcome.artifacts[0].path, "workspacex.pptx");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_runs_stop_at_max_attempts() {
    // A different script each time: the same failed script again is not run (it is
    // corrected, `corrections.rs`).
    let failing = |n: u32| run_script("sh", &format!("echo nope {n} >&2; exit 3"));
    let provider = loopback(json!([
        {"toolCalls": [failing(1)]},
        {"expect": {"exitCode": 3}, "toolCalls": [failing(2)]},
        {"expect": {"exitCode": 3}, "toolCalls": [failing(3)]},
        {"text": "never reached"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let config = AgentConfig {
        max_attempts: 2,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run("go", &GENERIC, &config, &CancellationToken::new(), &quiet)
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert_eq!(
        outcome.attempts.len(),
        2,
        "stopped after maxAttempts failed runs"
    );
    assert!(outcome.reason.contains("maxAttempts"), "{}", outcome.reason);
    assert!(outcome.artifacts.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_mid_run_stops_the_script_and_the_loop() {
    let marker = 950_000_000 + std::process::id();
    let provider = loopback(
        json!([{"toolCalls": [run_script("sh", &format!("sleep {marker}"))]}, {"text": "unreachable"}]),
    );
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let cancel = CancellationToken::new();
    let needle = format!("sleep {marker}");
    let trigger = {
        let cancel = cancel.clone();
        let needle = needle.clone();
        let running = move || !skillbox_env::testkit::host_processes_with(&needle).is_empty();
        tokio::spawn(async move {
            for _ in 0..1000 {
                if running() {
                    cancel.cancel();
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            false
        })
    };
    let result = agent
        .run("go", &GENERIC, &AgentConfig::default(), &cancel, &quiet)
        .await;
    assert!(trigger.await.unwrap(), "the script never started");
    assert!(matches!(result, Err(AgentError::Cancelled)), "{result:?}");
    // Cancel reaps the namespace before it returns: nothing may be left.
    let left = skillbox_env::testkit::host_processes_with(&needle);
    assert!(
        left.is_empty(),
        "the script outlived the cancelled run: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tool_calls_are_fed_back_not_fatal() {
    let provider = loopback(json!([
        {"toolCalls": [{"name": "launch_missiles", "arguments": {}}]},
        {"expect": {"resultContains": "unknown tool"}, "toolCalls": [{"name": "run_script", "arguments": {"language": "node"}}]},
        {"expect": {"resultContains": "\\\"script\\\" is missing"}, "toolCalls": [{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}]},
        {"expect": {"resultContains": "without `..`"}, "toolCalls": [run_script("sh", "echo ok > made.txt")]},
        {"expect": {"exitCode": 0, "filesInclude": "made.txt"}, "text": "done"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let outcome = agent
        .run(
            "go",
            &GENERIC,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:?}");
    assert_eq!(
        outcome.attempts.len(),
        1,
        "only run_script with a script is an attempt"
    );
    assert_eq!(outcome.artifacts[0].path, "made.txt");
    // The unknown tool and the missing argument were corrected; the path with `..` is an
    // ordinary tool error (the call had the right shape).
    let corrected: Vec<(u32, Option<&str>)> = outcome
        .corrections
        .iter()
        .map(|c| (c.turn, c.tool.as_deref()))
        .collect();
    assert_eq!(
        corrected,
        [(1, Some("launch_missiles")), (2, Some("run_script"))]
    );
    assert!(
        outcome
            .corrections
            .iter()
            .all(|c| c.kind == CorrectionKind::MalformedCall)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verification_failure_counts_as_a_failed_attempt_and_is_fed_back() {
    let provider = loopback(json!([
        {"toolCalls": [run_script("sh", "echo 'not a zip' > broken.pptx")]},
        {"expect": {"exitCode": 0, "resultContains": "\"ok\":false"}, "toolCalls": [run_script("sh", "rm broken.pptx; echo fixed > notes.txt")]},
        {"expect": {"exitCode": 0, "filesInclude": "notes.txt"}, "text": "fixed"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let outcome = agent
        .run(
            "go",
            &GENERIC,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap();
    let first = &outcome.attempts[0];
    assert!(
        !first.succeeded,
        "a broken .pptx fails the attempt even with exit 0"
    );
    assert!(
        first.verification[0]
            .error
            .as_deref()
            .unwrap_or("")
            .contains("zip"),
        "{first:?}"
    );
    assert_eq!(outcome.status, AgentStatus::Succeeded);
    assert_eq!(
        outcome
            .artifacts
            .iter()
            .map(|a| a.path.as_str())
            .collect::<Vec<_>>(),
        ["notes.txt"]
    );
}

/// A provider that never answers.
#[derive(Debug)]
struct Silent;

#[async_trait]
impl ModelProvider for Silent {
    fn name(&self) -> String {
        "silent".into()
    }

    async fn complete(
        &self,
        _: &[Message],
        _: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Reply, ProviderError> {
        cancel.cancelled().await;
        Err(ProviderError::Cancelled)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_answers_is_bounded_by_the_deadline() {
    let Some((agent, _objects)) = agent(Arc::new(Silent)).await else {
        return;
    };
    let config = AgentConfig {
        deadline: Duration::from_millis(300),
        ..AgentConfig::default()
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        agent.run("go", &GENERIC, &config, &CancellationToken::new(), &quiet),
    )
    .await
    .expect("the deadline must end the run")
    .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert!(outcome.reason.contains("deadline"), "{}", outcome.reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_prompt_and_a_model_that_never_runs_anything() {
    let provider = loopback(json!([{"text": "I would rather not."}, {"text": "Still no."}]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let skill = builtin_skill("pptx").unwrap();
    let err = agent
        .run(
            "   ",
            &skill,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::EmptyPrompt), "{err:?}");
    let config = AgentConfig {
        max_turns: 2,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run("go", &skill, &config, &CancellationToken::new(), &quiet)
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert_eq!(outcome.error, None, "{outcome:?}");
    assert_eq!(
        outcome.reason,
        "the model did not call a tool in 2 turns (maxTurns)"
    );
    assert_eq!(outcome.corrections.len(), 2);
    assert_eq!(outcome.answer, "Still no.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pptx_skill_needs_a_verified_pptx_to_succeed() {
    let provider = loopback(json!([
        {"toolCalls": [run_script("sh", "echo hi > notes.txt")]},
        {"expect": {"exitCode": 0, "resultContains": "made no .pptx"}, "text": "done"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let config = AgentConfig {
        max_turns: 2,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run(
            "go",
            &builtin_skill("pptx").unwrap(),
            &config,
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed, "{outcome:?}");
    assert_eq!(outcome.error, None, "{outcome:?}");
    assert!(!outcome.attempts[0].succeeded);
    assert!(outcome.artifacts.is_empty());
    // "done" without a verified file is not the end: it is corrected.
    assert_eq!(outcome.corrections.len(), 1);
    assert!(
        outcome.corrections[0]
            .message
            .contains("No run has made verified files yet"),
        "{}",
        outcome.corrections[0].message
    );
    assert!(
        outcome.reason.ends_with("it called no tool in the last 1"),
        "{}",
        outcome.reason
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_calls_in_one_turn_still_stop_at_max_attempts() {
    let failing = |n: u32| run_script("sh", &format!("exit {n}"));
    let provider = loopback(json!([
        {"toolCalls": [failing(5), failing(6), failing(7), failing(8), failing(9)]},
        {"text": "never reached"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let config = AgentConfig {
        max_attempts: 2,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run("go", &GENERIC, &config, &CancellationToken::new(), &quiet)
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert_eq!(
        outcome.attempts.len(),
        2,
        "the calls after maxAttempts are skipped, not run"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_script_is_cut_at_the_runs_deadline() {
    let provider = loopback(
        json!([{"toolCalls": [run_script("sh", "sleep 300")]}, {"text": "never reached"}]),
    );
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let config = AgentConfig {
        deadline: Duration::from_secs(1),
        ..AgentConfig::default()
    };
    let outcome = tokio::time::timeout(
        Duration::from_secs(120),
        agent.run("go", &GENERIC, &config, &CancellationToken::new(), &quiet),
    )
    .await
    .expect("a guard against a hang")
    .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert!(
        outcome.attempts[0].timed_out,
        "the script must be stopped by the run's deadline"
    );
    assert!(outcome.reason.contains("deadline"), "{}", outcome.reason);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_error_ends_the_run_but_keeps_the_attempts() {
    let provider = loopback(json!([
        {"toolCalls": [run_script("sh", "echo made > a.txt")]},
        {"expect": {"exitCode": 7}, "text": "the transcript expected another result"}
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let outcome = agent
        .run(
            "go",
            &GENERIC,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Failed);
    assert_eq!(
        outcome.attempts.len(),
        1,
        "the attempt before the error is kept"
    );
    let error = outcome.error.expect("the error is recorded");
    assert!(
        error.message.contains("turn 2 expected exit code 7"),
        "{}",
        error.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_cannot_follow_a_symlink_out_of_the_workspace() {
    // Both reads answered permission_denied. The run made no file, so "done" is
    // corrected: the turn limit ends it there.
    replays_to_done(
        json!([
            {"toolCalls": [run_script("sh", "ln -s /etc/passwd leak; ln -s ../../../../etc/hostname leak2; echo ok")]},
            {"expect": {"exitCode": 0}, "toolCalls": [{"name": "read_file", "arguments": {"path": "leak"}}]},
            {"expect": {"resultContains": "permission_denied"}, "toolCalls": [{"name": "read_file", "arguments": {"path": "/workspace/leak2"}}]},
            {"expect": {"resultContains": "permission_denied"}, "text": "done"}
        ]),
        4,
    )
    .await;
}

/// `read_file` hands the model a file's text, refuses a file past its 256 KiB cap (by
/// its size, and by the read itself) and one that is not UTF-8 text, and the run goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_hands_out_text_within_its_cap() {
    replays_to_done(
        json!([
            {"toolCalls": [run_script("sh", "echo hello-from-the-sandbox > note.txt; head -c 262145 /dev/zero | tr '\\0' a > big.txt; printf '\\377\\376' > binary.bin; echo ok")]},
            {"expect": {"exitCode": 0}, "toolCalls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
            {"expect": {"resultContains": "hello-from-the-sandbox"}, "toolCalls": [{"name": "read_file", "arguments": {"path": "big.txt"}}]},
            {"expect": {"resultContains": "262145 bytes, more than the 262144 bytes"}, "toolCalls": [{"name": "read_file", "arguments": {"path": "binary.bin"}}]},
            {"expect": {"resultContains": "not UTF-8 text"}, "text": "done"}
        ]),
        5,
    )
    .await;
}

/// `list_dir` hands the model a small directory whole, and of a directory of thousands
/// of files only as many entries as a tool result holds, saying how many more there are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dir_hands_out_at_most_a_result_s_worth() {
    replays_to_done(
        json!([
            {"toolCalls": [run_script("sh", "mkdir small many && echo hi > small/a.txt && cd many && seq 1 3000 | xargs touch; echo ok")]},
            {"expect": {"exitCode": 0}, "toolCalls": [{"name": "list_dir", "arguments": {"path": "small"}}]},
            {"expect": {"resultContains": "[{\"kind\":\"file\",\"name\":\"a.txt\",\"size\":3}]"}, "toolCalls": [{"name": "list_dir", "arguments": {"path": "many"}}]},
            {"expect": {"resultContains": "\"more\":"}, "text": "done"}
        ]),
        4,
    )
    .await;
}

/// A good run on the last allowed turn is the run's result: the model had no turn left
/// to say it was done, and the run still succeeds with its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_run_on_the_last_turn_succeeds() {
    let provider = loopback(json!([
        {"text": "Let me think."},
        {"toolCalls": [run_script("sh", "echo done > result.txt")]},
        {"text": "never asked"},
    ]));
    let Some((agent, _objects)) = agent(provider).await else {
        return;
    };
    let config = AgentConfig {
        max_turns: 2,
        ..AgentConfig::default()
    };
    let outcome = agent
        .run("go", &GENERIC, &config, &CancellationToken::new(), &quiet)
        .await
        .unwrap();
    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:?}");
    assert!(
        outcome.reason.contains("no turn left"),
        "{}",
        outcome.reason
    );
    assert_eq!(outcome.artifacts.len(), 1, "{outcome:?}");
    assert_eq!(outcome.artifacts[0].path, "result.txt");
}

/// A store past its budget fails the agent run as it fails a plain run: the error is
/// `quota_exceeded` (507 over HTTP), not an unknown error, and nothing is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_past_its_budget_fails_the_run_quota_exceeded() {
    let provider = loopback(json!([
        {"toolCalls": [run_script("sh", "head -c 5000 /dev/urandom > big.bin")]},
        {"text": "done"},
    ]));
    let Some((agent, objects)) = agent_with_budget(provider, Some(1000)).await else {
        return;
    };
    let err = agent
        .run(
            "go",
            &GENERIC,
            &AgentConfig::default(),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), skillbox_env::ErrorCode::QuotaExceeded, "{err}");
    assert!(err.to_string().contains("budget"), "{err}");
    let kept = std::fs::read_dir(objects.path().join("objects"))
        .map(|entries| entries.count())
        .unwrap_or(0);
    assert_eq!(kept, 0, "nothing of the run is kept");
}

/// With a network policy the model's scripts find the egress proxy, a host not on the
/// list is refused with the reason (fed back as the script's output), and the outcome
/// lists the connection; without one, the same script has no proxy at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_runs_scripts_behind_its_network_policy() {
    let script = r#"
import os, urllib.request, urllib.error
print("proxy", os.environ.get("HTTPS_PROXY"))
try:
    urllib.request.urlopen("http://not-listed.example/", timeout=10)
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode().strip())
except Exception as e:
    print("ERROR", type(e).__name__)
"#;
    let turns = json!([
        {"toolCalls": [run_script("python", script)]},
        {"text": "done"}
    ]);
    for network in [
        Some(skillbox_protocol::NetworkPolicy {
            allow: vec!["files.example.org".into()],
            deny: vec![],
        }),
        None,
    ] {
        let Some((agent, _objects)) = agent(loopback(turns.clone())).await else {
            return;
        };
        let config = AgentConfig {
            network: network.clone(),
            ..AgentConfig::default()
        };
        let outcome = agent
            .run(
                "fetch",
                &GENERIC,
                &config,
                &CancellationToken::new(),
                &quiet,
            )
            .await
            .expect("agent run");
        let stdout = &outcome.attempts[0].stdout;
        if network.is_some() {
            assert!(
                stdout.starts_with("proxy http://127.0.0.1:3128\n"),
                "{stdout}"
            );
            assert!(
                stdout.contains("HTTP 403 skillbox egress: not-listed.example:80 is not on the run's network.allow"),
                "{stdout}"
            );
            assert_eq!(outcome.egress.len(), 1, "{:?}", outcome.egress);
            assert_eq!(outcome.egress[0].host, "not-listed.example");
        } else {
            assert!(stdout.starts_with("proxy None\nERROR"), "{stdout}");
            assert!(outcome.egress.is_empty());
        }
    }
}
