//! Several `skillbox serve` nodes sharing one Postgres database (`--db`, Debian's
//! PostgreSQL, a cluster of the test's own) and one bucket (`--store`, moto's S3): what
//! one node ran, every node serves, and each node's records name it.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};
use skillbox_env::testkit::postgres::PostgresServer;
use skillbox_env::testkit::s3::MotoServer;

use super::common::{BIN, Serving, http, native_or_skip, text};
use super::shared_data_dir;

/// A node without keys (a shared database otherwise has every node check them):
/// `skillbox serve` on the shared data dir with `--store`, `--node` and the database in
/// `SKILLBOX_DB` (what `--db` defaults to).
fn node(moto: &MotoServer, db: &str, name: &str, extra: &[&str]) -> (Serving, String) {
    let mut args = vec!["--insecure-no-auth"];
    args.extend_from_slice(extra);
    keyed_node(moto, db, name, &args)
}

/// [`node`] as it starts by default: answering the database's keys.
fn keyed_node(moto: &MotoServer, db: &str, name: &str, extra: &[&str]) -> (Serving, String) {
    let mut command = Command::new(BIN);
    command.arg("--data-dir").arg(shared_data_dir());
    command.envs(moto.aws_env());
    command.env("SKILLBOX_DB", db);
    let mut args = vec!["--store", "s3://shared/nodes", "--node", name];
    args.extend_from_slice(extra);
    let (child, addr) = super::common::start_serve(command, &args);
    (Serving(child), addr)
}

/// What the nodes share: moto with the bucket `shared`, and a Postgres; `None` (the test
/// skipped) when this host cannot run native sandboxes or either server.
fn shared(test: &str) -> Option<(MotoServer, PostgresServer)> {
    if !native_or_skip(test) {
        return None;
    }
    let moto = MotoServer::start(test, Path::new(env!("CARGO_TARGET_TMPDIR")))?;
    let postgres = PostgresServer::start(test)?;
    moto.create_bucket("shared");
    Some((moto, postgres))
}

fn json_of(status: u16, body: &str) -> Value {
    assert!((200..300).contains(&status), "{status}: {body}");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn two_nodes_on_one_database_and_bucket_serve_each_others_runs() {
    let test = "two_nodes_on_one_database_and_bucket_serve_each_others_runs";
    let Some((moto, postgres)) = shared(test) else {
        return;
    };
    let (a, addr_a) = node(&moto, &postgres.url(), "node-a", &[]);
    let (b, addr_b) = node(&moto, &postgres.url(), "node-b", &[]);
    let json_header = [("Content-Type", "application/json")];

    // A plain run on node a: its file, its owner and its summary are b's to serve too.
    let nonce = format!(
        "{:x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let request = json!({
        "language": "sh",
        "script": format!("printf 'made %s\\n' {nonce} > report.txt; env"),
    });
    let (status, _, body) = http(
        &addr_a,
        "POST",
        "/v1/run",
        &json_header,
        &request.to_string(),
    );
    let run = json_of(status, &body);
    // The server's database URL is its own, never in a sandbox's environment.
    let env = run["stdout"].as_str().unwrap_or_default();
    assert!(
        env.contains("PATH=") && !env.contains("SKILLBOX_DB") && !env.contains("postgres://"),
        "{env}"
    );
    let sha256 = run["files"][0]["sha256"]
        .as_str()
        .expect("a file")
        .to_string();
    let (status, _, got) = http(&addr_b, "GET", &format!("/v1/objects/{sha256}"), &[], "");
    assert_eq!(status, 200, "node b serves node a's file: {got}");
    assert_eq!(got, format!("made {nonce}\n"));
    let (status, _, body) = http(&addr_b, "GET", "/v1/runs", &[], "");
    let listed = json_of(status, &body);
    assert!(
        listed["runs"].as_array().is_some_and(|runs| runs
            .iter()
            .any(|r| r["files"][0]["sha256"] == sha256.as_str())),
        "node b lists node a's run: {listed}"
    );

    // An agent run started on node b is read, to its end, from node a.
    let (status, _, body) = http(
        &addr_b,
        "POST",
        "/v1/agent/runs",
        &json_header,
        &json!({"prompt": "a deck", "maxAttempts": 3}).to_string(),
    );
    let created = json_of(status, &body);
    let id = created["id"].as_str().expect("an id").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    let ended = loop {
        let (status, _, body) = http(&addr_a, "GET", &format!("/v1/agent/runs/{id}"), &[], "");
        let record = json_of(status, &body);
        if record["status"] != "running" {
            break record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {record}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert_eq!(
        postgres.psql(&format!("SELECT node FROM agent_runs WHERE id = '{id}'")),
        "node-b",
        "the record names the node that ran it"
    );
    // The owners are in the shared database, where either node finds them.
    assert!(
        postgres
            .psql("SELECT count(*) FROM object_owners")
            .parse::<u32>()
            .unwrap()
            >= 2,
        "the plain run's file and the deck are owned in the shared database"
    );

    // A session opened on node a is used 50 times, through either node alike: its id
    // names node a, and node b forwards what it gets for it there.
    let (status, _, body) = http(&addr_a, "POST", "/v1/sessions", &json_header, "{}");
    let session = json_of(status, &body);
    let sid = session["id"].as_str().expect("an id").to_string();
    assert!(sid.ends_with(".node-a"), "{sid}");
    // Either node lists it: each asks the others for the tenant's sessions.
    for addr in [&addr_a, &addr_b] {
        let (status, _, body) = http(addr, "GET", "/v1/sessions", &[], "");
        let listed = json_of(status, &body);
        let ids: Vec<&str> = listed["sessions"]
            .as_array()
            .map(|all| all.iter().filter_map(|s| s["id"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(ids, [sid.as_str()], "{addr}: {listed}");
    }
    for round in 0..50 {
        let (write_to, read_from) = if round % 2 == 0 {
            (&addr_b, &addr_a)
        } else {
            (&addr_a, &addr_b)
        };
        let path = format!("/v1/sessions/{sid}/files/round-{round}.txt");
        let (status, _, body) = http(write_to, "PUT", &path, &[], &format!("round {round}"));
        assert!((200..300).contains(&status), "{round}: {status} {body}");
        let exec = json!({"shell": format!("cat round-{round}.txt; ls | wc -l")}).to_string();
        let (status, _, events) = http(
            read_from,
            "POST",
            &format!("/v1/sessions/{sid}/exec"),
            &json_header,
            &exec,
        );
        assert_eq!(status, 200, "{round}: {events}");
        let output: String = events
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|event| event["data"].as_str().map(str::to_string))
            .collect();
        assert_eq!(output, format!("round {round}{}\n", round + 1), "{events}");
    }
    let (status, _, body) = http(&addr_b, "DELETE", &format!("/v1/sessions/{sid}"), &[], "");
    assert!((200..300).contains(&status), "{status}: {body}");
    let (status, _, _) = http(&addr_a, "GET", &format!("/v1/sessions/{sid}"), &[], "");
    assert_eq!(status, 404, "deleted through node b, gone from node a");

    for server in [a, b] {
        let status = server.stop();
        assert!(status.success(), "serve should stop cleanly: {status:?}");
    }
}

/// Node b is killed (SIGKILL) in the middle of an agent run: node a, which shares its
/// database, finds it silent and records the run failed, saying why, and goes on
/// serving; b's name is off the list of nodes.
#[test]
fn a_node_killed_mid_run_has_its_run_closed_by_another() {
    let test = "a_node_killed_mid_run_has_its_run_closed_by_another";
    let Some((moto, postgres)) = shared(test) else {
        return;
    };
    // A model whose one script waits far longer than the test.
    let transcript = tempfile::NamedTempFile::new().unwrap();
    let turns = json!({"turns": [
        {"text": "Waiting.", "toolCalls": [{"name": "run_script", "arguments": {
            "language": "node", "script": "setTimeout(() => {}, 600000);"}}]},
        {"text": "Done."},
    ]});
    std::fs::write(transcript.path(), turns.to_string()).unwrap();
    let silence = ["--node-silence", "2s"];
    let (a, addr_a) = node(&moto, &postgres.url(), "node-a", &silence);
    let mut with_transcript = silence.to_vec();
    with_transcript.extend(["--transcript", transcript.path().to_str().unwrap()]);
    let (mut b, addr_b) = node(&moto, &postgres.url(), "node-b", &with_transcript);
    let (status, _, body) = http(
        &addr_b,
        "POST",
        "/v1/agent/runs",
        &[("Content-Type", "application/json")],
        &json!({"prompt": "wait", "maxAttempts": 1}).to_string(),
    );
    let id = json_of(status, &body)["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let record = |addr: &str| {
        let (status, _, body) = http(addr, "GET", &format!("/v1/agent/runs/{id}"), &[], "");
        json_of(status, &body)
    };
    assert_eq!(record(&addr_a)["status"], "running");
    let (status, _, body) = http(
        &addr_b,
        "POST",
        "/v1/sessions",
        &[("Content-Type", "application/json")],
        "{}",
    );
    let sid = json_of(status, &body)["id"]
        .as_str()
        .expect("an id")
        .to_string();
    let (status, _, _) = http(&addr_a, "GET", &format!("/v1/sessions/{sid}"), &[], "");
    assert_eq!(status, 200, "node b's session, through node a");
    b.0.kill().unwrap();
    b.0.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let closed = loop {
        let now = record(&addr_a);
        if now["status"] != "running" {
            break now;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node a never closed the dead node's run: {now}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(closed["status"], "failed", "{closed}");
    assert!(
        closed["reason"]
            .as_str()
            .is_some_and(|r| r.contains("node node-b stopped answering")),
        "{closed}"
    );
    assert_eq!(
        postgres.psql("SELECT name FROM nodes ORDER BY name"),
        "node-a"
    );
    let (status, _, _) = http(&addr_a, "GET", "/healthz", &[], "");
    assert_eq!(status, 200, "node a goes on serving");
    // The session lived on node b: it is gone, and says so.
    let (status, _, body) = http(&addr_a, "GET", &format!("/v1/sessions/{sid}"), &[], "");
    assert_eq!(status, 410, "{body}");
    let error = json_of(200, &body);
    assert_eq!(error["error"]["code"], "gone", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("node-b") && m.contains("open a new session")),
        "{error}"
    );
    let status = a.stop();
    assert!(status.success(), "serve should stop cleanly: {status:?}");
    assert_eq!(
        postgres.psql("SELECT count(*) FROM nodes"),
        "0",
        "a node that stops takes itself off the list"
    );
}

/// `skillbox keys` on the database: a key made once is answered by every node, acts as
/// its tenant on each, and once revoked is refused by all of them at their next request.
#[test]
fn keys_kept_in_the_database_are_answered_by_every_node() {
    let test = "keys_kept_in_the_database_are_answered_by_every_node";
    let Some((moto, postgres)) = shared(test) else {
        return;
    };
    let keys = |args: &[&str]| {
        let out = Command::new(BIN)
            .arg("keys")
            .args(args)
            .env("SKILLBOX_DB", postgres.url())
            .output()
            .expect("skillbox keys");
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let (code, acme, said) = keys(&["new", "acme"]);
    assert_eq!(code, Some(0), "{said}");
    let acme = acme.trim().to_string();
    assert!(
        acme.starts_with("sbx_") && said.contains("to the database"),
        "{said}"
    );
    let (code, globex, said) = keys(&["new", "globex"]);
    assert_eq!(code, Some(0), "{said}");
    let globex = globex.trim().to_string();
    let (code, listed, said) = keys(&["list", "--json"]);
    assert_eq!(code, Some(0), "{said}");
    let listed: Vec<Value> = listed
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert_eq!(listed[0]["tenant"], "acme");
    // Neither token nor whole hash is ever listed.
    let all = format!("{listed:?}");
    assert!(
        !all.contains(&acme[4..]) && !all.contains(&globex[4..]),
        "{all}"
    );
    let acme_id = listed[0]["id"].as_str().expect("an id").to_string();

    let (a, addr_a) = keyed_node(&moto, &postgres.url(), "node-a", &[]);
    let (b, addr_b) = keyed_node(&moto, &postgres.url(), "node-b", &[]);
    let bearer = |token: &str| format!("Bearer {token}");
    for addr in [&addr_a, &addr_b] {
        let (status, _, body) = http(addr, "GET", "/v1/runs", &[], "");
        assert_eq!(status, 401, "no key on a shared database: {body}");
        assert!(body.contains("keys new TENANT --db"), "{body}");
        let (status, _, body) = http(
            addr,
            "GET",
            "/v1/runs",
            &[("Authorization", "Bearer sbx_not-a-key-anyone-made")],
            "",
        );
        assert_eq!(status, 401, "{body}");
    }
    // acme's run on a is acme's on b, and not globex's on either.
    let request = json!({"language": "sh", "script": "echo made > mine.txt"});
    let (status, _, body) = http(
        &addr_a,
        "POST",
        "/v1/run",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &bearer(&acme)),
        ],
        &request.to_string(),
    );
    let run = json_of(status, &body);
    let sha256 = run["files"][0]["sha256"].as_str().expect("a file");
    let object = format!("/v1/objects/{sha256}");
    let (status, _, got) = http(
        &addr_b,
        "GET",
        &object,
        &[("Authorization", &bearer(&acme))],
        "",
    );
    assert_eq!((status, got.as_str()), (200, "made\n"));
    let (status, _, body) = http(
        &addr_b,
        "GET",
        "/v1/runs",
        &[("Authorization", &bearer(&acme))],
        "",
    );
    assert!(
        json_of(status, &body).to_string().contains(sha256),
        "{body}"
    );
    for addr in [&addr_a, &addr_b] {
        let (status, _, body) = http(
            addr,
            "GET",
            "/v1/runs",
            &[("Authorization", &bearer(&globex))],
            "",
        );
        assert!(
            !json_of(status, &body).to_string().contains(sha256),
            "{body}"
        );
        let (status, _, _) = http(
            addr,
            "GET",
            &object,
            &[("Authorization", &bearer(&globex))],
            "",
        );
        assert_eq!(status, 404, "another tenant's file is not globex's");
    }

    // Revoked once, refused by both nodes from the next request; globex still answered.
    let (code, _, said) = keys(&["revoke", "0123"]);
    assert_eq!(code, Some(2), "an id that is no id: {said}");
    assert!(said.contains("16 hex digits"), "{said}");
    let (code, _, said) = keys(&["revoke", &acme_id]);
    assert_eq!(code, Some(0), "{said}");
    let (code, _, said) = keys(&["revoke", &acme_id]);
    assert_eq!(code, Some(2), "revoked twice: {said}");
    assert!(said.contains("no key"), "{said}");
    for addr in [&addr_a, &addr_b] {
        let (status, _, body) = http(
            addr,
            "GET",
            "/v1/runs",
            &[("Authorization", &bearer(&acme))],
            "",
        );
        assert_eq!(status, 401, "{body}");
        let (status, _, body) = http(
            addr,
            "GET",
            "/v1/runs",
            &[("Authorization", &bearer(&globex))],
            "",
        );
        assert_eq!(status, 200, "{body}");
    }
    drop((a, b));
}

#[test]
fn serve_with_a_database_that_does_not_answer_stops_at_its_start_saying_why() {
    let out = Command::new(BIN)
        .arg("--data-dir")
        .arg(shared_data_dir())
        .args(["serve", "--addr", "127.0.0.1:0", "--db"])
        .arg("postgres://skillbox:hunter2@127.0.0.1:1/records")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("postgres://skillbox@127.0.0.1:1/records") && !stderr.contains("hunter2"),
        "{stderr}"
    );
}
