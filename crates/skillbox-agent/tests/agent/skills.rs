//! Skills and scopes in agent runs, against the real native sandbox: the system prompt
//! lists the run's skills (name, folder, description cut) without their SKILL.md bodies,
//! `read_skill` hands a SKILL.md over, `run_skill` runs a script by its path in the
//! sandbox and only what it makes comes back, bad arguments go back to the model, and a
//! scope carries `/workspace` from one run to the next. Assertions are on the outcome
//! and on what the scripted OpenAI-compatible server received.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skillbox_agent::{
    Agent, AgentConfig, AgentOutcome, AgentStatus, CorrectionKind, LoopbackProvider, ModelProvider,
};
use skillbox_env::CancellationToken;
use skillbox_protocol::Language;
use skillbox_run::{Runner, RunnerConfig};
use skillbox_store::ArtifactStore;

use crate::loop_edges::{GENERIC, data_dir, quiet};
use crate::openai::{Answer, Server, completion, ok};

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

/// The tail of `notes`' description, past the 300 characters the prompt keeps.
const NOTES_TAIL: &str = "NOTES-TAIL-NOT-IN-THE-PROMPT";
/// A line of `report`'s SKILL.md body: read on demand, never in the prompt.
const REPORT_BODY: &str = "BODY-MARKER-7f3a: run scripts/make.sh with the title as arguments.";

/// A workspace with two skills: `report` (a script that writes report.txt from its
/// arguments, and a data file) and `notes` (only a SKILL.md, its description long).
fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    write(
        &ws.join("skills/report/SKILL.md"),
        &format!(
            "---\nname: report\ndescription: >\n  Writes a one-line report into report.txt.\n  Use it when asked for a report.\n---\n# report\n\n{REPORT_BODY}\n"
        ),
    );
    write(
        &ws.join("skills/report/scripts/make.sh"),
        "printf 'report: %s\\n' \"$*\" > report.txt\necho made report.txt\n",
    );
    write(&ws.join("skills/report/data.txt"), "42\n");
    write(
        &ws.join("skills/notes/SKILL.md"),
        &format!(
            "---\nname: notes\ndescription: Keeps notes. {} {NOTES_TAIL}\n---\n# notes\n",
            "Long words about notes. ".repeat(14)
        ),
    );
    dir
}

/// Where the workspace is in the sandboxes of the tests that run with each root: the
/// default, and another one that everything the model is told and collected follows.
const ROOTS: [&str; 2] = ["/workspace", "/home/agentscope/workspace"];

/// A runner whose runs name the skills of `workspace`, with a store of its own (where
/// the scopes' snapshots are kept too); `None` without the native sandbox (skipped).
async fn runner(workspace: &Path) -> Option<(Arc<Runner>, tempfile::TempDir)> {
    runner_at(workspace, ROOTS[0]).await
}

/// [`runner`] with its sandboxes' workspace at `root`.
async fn runner_at(workspace: &Path, root: &str) -> Option<(Arc<Runner>, tempfile::TempDir)> {
    let native = skillbox_native::probe();
    if !native.available {
        skillbox_env::testkit::skip("agent skills", &native.reason.unwrap_or_default());
        return None;
    }
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let mut config = RunnerConfig {
        skills_workspace: Some(workspace.to_path_buf()),
        ..RunnerConfig::new(data_dir())
    };
    config.door.root = skillbox_protocol::WorkspaceRoot::new(root).unwrap();
    // Each run of these tests scopes by keys of its own in the shared data dir: the
    // tenant's bound on scopes (tested in skillbox-store) would trip after a few runs.
    config.snapshots.scopes_per_tenant = usize::MAX;
    let runner = Runner::new(config, store);
    Some((Arc::new(runner), objects))
}

async fn run(agent: &Agent, config: &AgentConfig) -> AgentOutcome {
    tokio::time::timeout(
        Duration::from_secs(120),
        agent.run(
            "Make the report",
            &GENERIC,
            config,
            &CancellationToken::new(),
            &quiet,
        ),
    )
    .await
    .expect("a guard against a hang")
    .expect("the run happens")
}

fn with_skills(skills: &[&str]) -> AgentConfig {
    AgentConfig {
        skills: skills.iter().map(|s| s.to_string()).collect(),
        ..AgentConfig::default()
    }
}

fn calls(calls: &[(&str, &str, Value)]) -> Answer {
    let calls: Vec<Value> = calls
        .iter()
        .map(|(id, name, arguments)| {
            json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments.to_string()}})
        })
        .collect();
    ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": calls}),
    ))
}

fn prose(text: &str) -> Answer {
    ok(completion(json!({"role": "assistant", "content": text})))
}

/// The messages of the `n`th request (from 0) the server received.
fn messages(server: &Server, n: usize) -> Vec<Value> {
    server.seen()[n].body["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

/// The content of the tool message answering `id` in `messages`, as JSON.
fn answer_to(messages: &[Value], id: &str) -> Value {
    let message = messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {messages:#?}"));
    serde_json::from_str(message["content"].as_str().unwrap()).unwrap()
}

async fn artifact(runner: &Runner, outcome: &AgentOutcome, path: &str) -> String {
    let info = outcome
        .artifacts
        .iter()
        .find(|a| a.path == path)
        .unwrap_or_else(|| panic!("no artifact {path}: {outcome:#?}"));
    let bytes = runner.store().get(&info.sha256).await.unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// With each root: the prompt, the tools and the answers name the skills where they
/// are, and what the skill makes there comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_is_listed_then_read_and_run_and_only_what_it_makes_comes_back() {
    for root in ROOTS {
        listed_read_and_run(root).await;
    }
}

async fn listed_read_and_run(root: &str) {
    let ws = workspace();
    let server = Server::start(vec![
        calls(&[("call_read", "read_skill", json!({"name": "report"}))]),
        calls(&[(
            "call_run",
            "run_skill",
            json!({"skill": "report", "script": "scripts/make.sh", "args": ["Q3 sales", "it's fine"]}),
        )]),
        prose("Done: report.txt is in /workspace."),
    ])
    .await;
    let Some((runner, _objects)) = runner_at(ws.path(), root).await else {
        return;
    };
    let agent = Agent::new(Arc::new(server.provider(0)), runner.clone());
    let outcome = run(&agent, &with_skills(&["report", "notes"])).await;

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    let [attempt] = outcome.attempts.as_slice() else {
        panic!("one attempt: {outcome:#?}")
    };
    assert_eq!(attempt.language, Language::Sh);
    assert_eq!(
        attempt.script,
        format!(
            "# run_skill report scripts/make.sh\nsh {root}/skills/report/scripts/make.sh 'Q3 sales' 'it'\\''s fine'\n"
        )
    );
    assert_eq!(attempt.stdout, "made report.txt\n");
    let paths: Vec<&str> = outcome.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(paths, ["report.txt"], "the skills' own files are inputs");
    assert_eq!(
        artifact(&runner, &outcome, "report.txt").await,
        "report: Q3 sales it's fine\n"
    );
    let placed = outcome.placed.as_ref().expect("the skills were placed");
    let folders: Vec<(&str, &str)> = placed
        .skills
        .iter()
        .map(|s| (s.name.as_str(), s.path.as_str()))
        .collect();
    assert_eq!(
        folders,
        [
            ("notes", format!("{root}/skills/notes").as_str()),
            ("report", format!("{root}/skills/report").as_str())
        ]
    );
    assert!(outcome.snapshot.is_none(), "no scope, no snapshot");

    // The first request: the built-in instructions, then each skill by name, folder and
    // description (the long one cut), and how to use them; no SKILL.md body.
    assert_eq!(server.seen().len(), 3);
    let first = messages(&server, 0);
    let system = first[0]["content"].as_str().unwrap();
    assert!(system.starts_with(GENERIC.instructions), "{system}");
    assert!(
        system.contains(&format!("\n- report ({root}/skills/report): Writes a one-line report into report.txt. Use it when asked for a report.\n")),
        "{system}"
    );
    assert!(
        system.contains(&format!(
            "\n- notes ({root}/skills/notes): Keeps notes. Long words about notes."
        )),
        "{system}"
    );
    let notes_line = system.lines().find(|l| l.starts_with("- notes")).unwrap();
    let description = notes_line.split_once("): ").unwrap().1;
    assert_eq!(description.chars().count(), 301, "{description}");
    assert!(description.ends_with('…'), "{description}");
    assert!(!system.contains(NOTES_TAIL), "{system}");
    assert!(
        !system.contains("BODY-MARKER"),
        "bodies load on demand: {system}"
    );
    for needle in ["call read_skill", "call run_skill"] {
        assert!(system.contains(needle), "{needle:?} in {system}");
    }
    let tools = server.seen()[0].body["tools"].as_array().unwrap().clone();
    let described = tools[0]["function"]["description"].as_str().unwrap();
    assert!(described.contains(&format!("(cwd {root})")), "{described}");
    let names: Vec<&str> = tools
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_script",
            "read_file",
            "write_file",
            "list_dir",
            "read_skill",
            "run_skill"
        ]
    );
    assert_eq!(
        tools[5]["function"]["parameters"]["properties"]["skill"]["enum"],
        json!(["notes", "report"])
    );

    // read_skill: the front matter, the body, the folder and the scripts.
    let read = answer_to(&messages(&server, 1), "call_read");
    assert_eq!(read["folder"], format!("{root}/skills/report"), "{read}");
    assert_eq!(read["frontMatter"]["name"], "report", "{read}");
    assert!(
        read["body"].as_str().unwrap().contains(REPORT_BODY),
        "{read}"
    );
    assert_eq!(read["scripts"], json!(["scripts/make.sh"]), "{read}");
    // run_skill: what run_script answers, with only the file it made.
    let ran = answer_to(&messages(&server, 2), "call_run");
    assert_eq!(ran["exitCode"], 0, "{ran}");
    assert_eq!(
        ran["files"],
        json!([{"path": "report.txt", "size": 27}]),
        "{ran}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_skill_or_a_script_outside_its_folder_is_answered_and_the_run_goes_on() {
    let ws = workspace();
    let server = Server::start(vec![
        calls(&[(
            "call_nope",
            "run_skill",
            json!({"skill": "nope", "script": "scripts/make.sh"}),
        )]),
        calls(&[(
            "call_out",
            "run_skill",
            json!({"skill": "report", "script": "../../../etc/passwd"}),
        )]),
        calls(&[(
            "call_missing",
            "run_skill",
            json!({"skill": "report", "script": "scripts/missing.sh"}),
        )]),
        calls(&[(
            "call_args",
            "run_skill",
            json!({"skill": "report", "script": "scripts/make.sh", "args": "Q3"}),
        )]),
        calls(&[(
            "call_ok",
            "run_skill",
            json!({"skill": "report", "script": "scripts/make.sh", "args": ["Q3"]}),
        )]),
        prose("Done."),
    ])
    .await;
    let Some((runner, _objects)) = runner(ws.path()).await else {
        return;
    };
    let agent = Agent::new(Arc::new(server.provider(0)), runner.clone());
    // One failed run would end it: none of the refused calls may count as one.
    let config = AgentConfig {
        max_attempts: 1,
        ..with_skills(&["report"])
    };
    let outcome = run(&agent, &config).await;

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert_eq!(outcome.attempts.len(), 1, "only the good call ran");
    assert_eq!(
        artifact(&runner, &outcome, "report.txt").await,
        "report: Q3\n"
    );
    // The unknown skill is corrected against the schema, naming the skills there are.
    let [correction] = outcome.corrections.as_slice() else {
        panic!("one correction: {:#?}", outcome.corrections)
    };
    assert_eq!(correction.kind, CorrectionKind::MalformedCall);
    assert_eq!(correction.tool_call_id.as_deref(), Some("call_nope"));
    assert!(
        correction
            .message
            .contains(r#"argument "skill" is "nope", not one of "report""#),
        "{correction:?}"
    );
    let last = messages(&server, 5);
    assert_eq!(
        answer_to(&last, "call_nope")["error"].as_str(),
        Some(correction.message.as_str())
    );
    // The others are tool errors saying what to give instead.
    let error = |id: &str| answer_to(&last, id)["error"].as_str().unwrap().to_string();
    let out = error("call_out");
    assert!(
        out.contains("give the script's path inside the skill's folder"),
        "{out}"
    );
    let missing = error("call_missing");
    assert!(
        missing.contains("skill report has no scripts/missing.sh"),
        "{missing}"
    );
    assert!(
        missing.contains("its scripts: scripts/make.sh"),
        "{missing}"
    );
    let args = error("call_args");
    assert!(
        args.contains("\"args\" must be an array of strings"),
        "{args}"
    );
    assert_eq!(answer_to(&last, "call_ok")["exitCode"], 0);
}

/// With each root: what one run left in the workspace is where the next finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_with_the_scope_sees_what_the_first_left_in_workspace() {
    for root in ROOTS {
        scoped_runs(root).await;
    }
}

async fn scoped_runs(root: &str) {
    let ws = workspace();
    // A key of this test's own: the snapshots live in the shared data dir.
    let key = format!("agent-{}", ws.path().file_name().unwrap().to_str().unwrap());
    let scripted = |script: &str, made: &str| -> Arc<dyn ModelProvider> {
        let turns = json!({"turns": [
            {"toolCalls": [{"name": "run_script", "arguments": {"language": "sh", "script": script}}]},
            {"expect": {"exitCode": 0, "filesInclude": made}, "text": "done"}
        ]});
        Arc::new(LoopbackProvider::from_json(&turns.to_string()).unwrap())
    };
    let scoped = |key: &str| AgentConfig {
        scope_key: Some(key.to_string()),
        ..with_skills(&["report"])
    };

    let Some((runner, _objects)) = runner_at(ws.path(), root).await else {
        return;
    };
    let made = scripted(
        "mkdir -p deps && echo 'pkg 1.0' > deps/installed.txt",
        "deps/installed.txt",
    );
    let first = run(&Agent::new(made, runner.clone()), &scoped(&key)).await;
    assert_eq!(first.status, AgentStatus::Succeeded, "{first:#?}");
    let snapshot = first.snapshot.as_ref().expect("a snapshot report");
    assert_eq!(snapshot.restored, None, "{snapshot:?}");
    assert_eq!(snapshot.error, None, "{snapshot:?}");
    let saved = snapshot.saved.clone().expect("saved");

    let look = format!(
        "test \"$PWD\" = {root} && cat {root}/deps/installed.txt > seen.txt || echo fresh > seen.txt"
    );
    let look = look.as_str();
    let agent = Agent::new(scripted(look, "seen.txt"), runner.clone());
    let second = run(&agent, &scoped(&key)).await;
    assert_eq!(second.status, AgentStatus::Succeeded, "{second:#?}");
    let snapshot = second.snapshot.as_ref().unwrap();
    assert_eq!(snapshot.restored.as_deref(), Some(saved.as_str()));
    assert!(snapshot.saved.is_some(), "{snapshot:?}");
    // The restored workspace had this very skill: nothing copied.
    assert!(!second.placed.as_ref().unwrap().copied);
    let paths: Vec<&str> = second.artifacts.iter().map(|a| a.path.as_str()).collect();
    assert_eq!(
        paths,
        ["seen.txt"],
        "restored and unchanged files are inputs, not outputs"
    );
    assert_eq!(artifact(&runner, &second, "seen.txt").await, "pkg 1.0\n");

    // Another scope starts from nothing.
    let agent = Agent::new(scripted(look, "seen.txt"), runner.clone());
    let other = run(&agent, &scoped(&format!("{key}-other"))).await;
    assert_eq!(other.status, AgentStatus::Succeeded, "{other:#?}");
    assert_eq!(other.snapshot.as_ref().unwrap().restored, None);
    assert_eq!(artifact(&runner, &other, "seen.txt").await, "fresh\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_that_is_not_there_ends_the_run_before_a_sandbox_naming_those_that_are() {
    let ws = workspace();
    let Some((runner, _objects)) = runner(ws.path()).await else {
        return;
    };
    let provider = LoopbackProvider::from_json(r#"{"turns": [{"text": "unreached"}]}"#).unwrap();
    let agent = Agent::new(Arc::new(provider), runner);
    let error = agent
        .run(
            "go",
            &GENERIC,
            &with_skills(&["report", "nope"]),
            &CancellationToken::new(),
            &quiet,
        )
        .await
        .expect_err("refused");
    assert_eq!(error.code(), skillbox_env::ErrorCode::Invalid);
    assert_eq!(
        error.to_string(),
        "skills[0]: no skill nope (there are: notes, report)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_skills_there_is_no_listing_and_no_skill_tool() {
    let ws = workspace();
    let server = Server::start(vec![
        calls(&[(
            "call_skill",
            "run_skill",
            json!({"skill": "report", "script": "scripts/make.sh"}),
        )]),
        calls(&[(
            "call_run",
            "run_script",
            json!({"language": "sh", "script": "echo ok > made.txt"}),
        )]),
        prose("Done."),
    ])
    .await;
    let Some((runner, _objects)) = runner(ws.path()).await else {
        return;
    };
    let agent = Agent::new(Arc::new(server.provider(0)), runner);
    let outcome = run(&agent, &AgentConfig::default()).await;

    assert_eq!(outcome.status, AgentStatus::Succeeded, "{outcome:#?}");
    assert!(outcome.placed.is_none());
    assert_eq!(messages(&server, 0)[0]["content"], GENERIC.instructions);
    let names: Vec<String> = server.seen()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["run_script", "read_file", "write_file", "list_dir"]);
    let [correction] = outcome.corrections.as_slice() else {
        panic!("one correction: {:#?}", outcome.corrections)
    };
    assert!(
        correction.message.starts_with("unknown tool \"run_skill\""),
        "{correction:?}"
    );
}
