//! Skills and scopes over HTTP: `GET /v1/skills` lists the server's workspace skills and
//! the calling tenant's own; `POST /v1/run` places the skills it names and keeps each
//! tenant's scopes apart; `POST /v1/agent/runs` places them for the model to run by name.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::{ApiKeys, ServerConfig};
use skillbox_store::ArtifactStore;
use tokio_util::sync::CancellationToken;

fn write(path: &Path, content: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_name_the_servers_skills_and_their_tenants_own_and_scopes_stay_apart() {
    let native = skillbox_native::probe();
    if !native.available {
        return skillbox_env::testkit::skip("skills over http", &native.reason.unwrap_or_default());
    }
    let workspace = tempfile::tempdir().unwrap();
    write(
        &workspace.path().join("skills/report/SKILL.md"),
        "---\nname: report\ndescription: Reports.\n---\n",
    );
    write(
        &workspace.path().join("skills/report/scripts/hello.py"),
        "print('hello from report')\n",
    );
    let data = tempfile::tempdir().unwrap();
    write(
        &data.path().join("users/ana/skills/mine/SKILL.md"),
        "---\nname: mine\ndescription: Ana's own.\n---\n",
    );
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let runner = Runner::new(
        RunnerConfig {
            skills_workspace: Some(workspace.path().to_path_buf()),
            ..RunnerConfig::new(data.path())
        },
        store,
    );
    let tokens = ["ana-token-0123456789abcdef", "bob-token-0123456789abcdef"];
    let keys = ApiKeys::from_pairs(&format!("ana={},bob={}", tokens[0], tokens[1])).unwrap();
    let config = ServerConfig {
        keys: Some(Arc::new(keys)),
        ..ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(skillbox_server::serve_on(
        listener,
        config,
        Arc::new(runner),
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    let get = |token: &str| {
        http.get(format!("{base}/v1/skills"))
            .bearer_auth(token)
            .send()
    };
    let post = |token: &str, body: Value| {
        http.post(format!("{base}/v1/run"))
            .bearer_auth(token)
            .json(&body)
            .send()
    };

    let anas: Value = get(tokens[0]).await.unwrap().json().await.unwrap();
    let names: Vec<&str> = anas["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mine", "report"], "{anas}");
    assert_eq!(
        anas["skills"][0]["path"],
        "/workspace/.skills-cache/user/mine"
    );
    let bobs: Value = get(tokens[1]).await.unwrap().json().await.unwrap();
    let names: Vec<&str> = bobs["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["report"], "bob sees no skill of ana's: {bobs}");

    let script = "import os\nprint(open('/workspace/skills/report/scripts/hello.py').read().strip())\nprint(os.path.exists('/workspace/.skills-cache/user/mine/SKILL.md'))\np='/workspace/state.txt'\nprint(open(p).read() if os.path.exists(p) else 'fresh')\nopen(p,'w').write('kept')\n";
    let ran = post(
        tokens[0],
        json!({"language": "python", "script": script, "skills": ["report", "mine"], "scopeKey": "k"}),
    )
    .await
    .unwrap();
    assert_eq!(ran.status(), 200);
    let ran: Value = ran.json().await.unwrap();
    assert_eq!(
        ran["stdout"], "print('hello from report')\nTrue\nfresh\n",
        "{ran}"
    );
    let again: Value = post(
        tokens[0],
        json!({"language": "python", "script": script, "skills": ["report"], "scopeKey": "k"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        again["stdout"].as_str().unwrap().lines().nth(2),
        Some("kept"),
        "{again}"
    );
    // Bob's scope of the same name is his own; ana's skill is not his to name.
    let bobs_run: Value = post(
        tokens[1],
        json!({"language": "python", "script": script, "skills": ["report"], "scopeKey": "k"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(
        bobs_run["stdout"].as_str().unwrap().lines().nth(2),
        Some("fresh"),
        "{bobs_run}"
    );
    let refused = post(
        tokens[1],
        json!({"language": "python", "script": "print(1)", "skills": ["mine"]}),
    )
    .await
    .unwrap();
    assert_eq!(refused.status(), 400);
    let refused: Value = refused.json().await.unwrap();
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("skills[0]: no skill mine"),
        "{refused}"
    );
    let bad_scope = post(
        tokens[0],
        json!({"language": "python", "script": "print(1)", "scopeKey": "has space"}),
    )
    .await
    .unwrap();
    assert_eq!(bad_scope.status(), 400);
    shutdown.cancel();
}

/// `POST /v1/agent/runs` with `skills` and a `scopeKey`: the skill is placed in the run's
/// sandbox, the model runs its script by name (`run_skill`), the deck the script makes
/// comes back verified and downloadable, and no file of the skill's own does; the record
/// keeps the skills, the scope, what was placed and the snapshot saved. A name that is
/// not there, or a bad key, is 400 before anything starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_place_their_skills_and_run_them_by_name() {
    let native = skillbox_native::probe();
    if !native.available {
        return skillbox_env::testkit::skip(
            "agent skills over http",
            &native.reason.unwrap_or_default(),
        );
    }
    let workspace = tempfile::tempdir().unwrap();
    write(
        &workspace.path().join("skills/deck/SKILL.md"),
        "---\nname: deck\ndescription: Makes a one-slide deck titled by its arguments.\n---\nRun scripts/make.js TITLE.\n",
    );
    write(
        &workspace.path().join("skills/deck/scripts/make.js"),
        "const pptxgen = require(\"pptxgenjs\");\nconst pres = new pptxgen();\npres.addSlide().addText(process.argv.slice(2).join(\" \"), { x: 0.5, y: 0.5, w: 9, h: 1, fontSize: 32 });\npres.writeFile({ fileName: \"/workspace/deck.pptx\" }).then((name) => console.log(\"wrote \" + name));\n",
    );
    let transcript = json!({"turns": [
        {"toolCalls": [{"name": "run_skill", "arguments": {"skill": "deck", "script": "scripts/make.js", "args": ["Skills over HTTP"]}}]},
        {"expect": {"exitCode": 0, "filesInclude": "deck.pptx"}, "text": "Made deck.pptx."}
    ]})
    .to_string();
    // The shared data dir has the Node runtime; the records and objects are this test's.
    let records = tempfile::tempdir().unwrap();
    let agents = skillbox_server::AgentRuns::open(
        &skillbox_store::RecordsDb::sqlite(records.path()),
        "test",
        skillbox_server::AgentModel::Transcript(transcript),
        2,
    )
    .await
    .unwrap();
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let runner = Runner::new(
        RunnerConfig {
            skills_workspace: Some(workspace.path().to_path_buf()),
            ..RunnerConfig::new(super::shared_data_dir())
        },
        store,
    );
    runner
        .prepare(&|line| eprintln!("{line}"))
        .await
        .expect("install the node runtime");
    let config = ServerConfig {
        agents: Some(agents),
        ..ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    tokio::spawn(skillbox_server::serve_on(
        listener,
        config,
        Arc::new(runner),
        shutdown.clone(),
    ));
    let http = reqwest::Client::new();
    let post = |body: Value| {
        http.post(format!("{base}/v1/agent/runs"))
            .json(&body)
            .send()
    };

    for (body, needle) in [
        (
            json!({"prompt": "x", "skills": ["nope"]}),
            "skills[0]: no skill nope (there are: deck)",
        ),
        (json!({"prompt": "x", "skills": ["../deck"]}), "skills[0]"),
        (json!({"prompt": "x", "scopeKey": "has space"}), "scopeKey"),
    ] {
        let refused = post(body.clone()).await.unwrap();
        assert_eq!(refused.status(), 400, "{body}");
        let refused: Value = refused.json().await.unwrap();
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains(needle),
            "{body} -> {refused}"
        );
    }

    let key = format!(
        "agent-{}",
        workspace.path().file_name().unwrap().to_str().unwrap()
    );
    let created = post(json!({"prompt": "Make a deck", "skills": ["deck"], "scopeKey": key}))
        .await
        .unwrap();
    assert_eq!(created.status(), 202);
    let created: Value = created.json().await.unwrap();
    let id = created["id"].as_str().unwrap();
    let mut record = Value::Null;
    for _ in 0..600 {
        record = http
            .get(format!("{base}/v1/agent/runs/{id}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if record["status"] != "running" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["skills"], json!(["deck"]), "{record}");
    assert_eq!(record["scopeKey"], key.as_str(), "{record}");
    assert_eq!(
        record["placed"]["skills"],
        json!([{"name": "deck", "path": "/workspace/skills/deck"}]),
        "{record}"
    );
    assert!(record["snapshot"]["saved"].is_string(), "{record}");
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{record}");
    assert_eq!(attempts[0]["language"], "sh");
    assert_eq!(
        attempts[0]["script"],
        "# run_skill deck scripts/make.js\nnode /workspace/skills/deck/scripts/make.js 'Skills over HTTP'\n"
    );
    let paths: Vec<&str> = record["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["deck.pptx"],
        "the skill's files are inputs: {record}"
    );
    let url = record["artifacts"][0]["url"].as_str().unwrap();
    let bytes = http
        .get(format!("{base}{url}"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let deck = skillbox_pptx::verify(&bytes).expect("a deck");
    assert_eq!(deck.slide_count(), 1);
    assert!(deck.contains(1, "Skills over HTTP"), "{}", deck.text_of(1));
    shutdown.cancel();
}
