//! `POST /v1/run` end to end over real HTTP against a real sandbox: the seed case (a
//! pptxgenjs deck, downloaded and parsed), the ShapeType mistake, attacks, bad input,
//! limits, downloads, health, metrics, OpenAPI and overload.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod capabilities;
mod doors;
mod extension;
mod sessions;
mod skills;
mod ui;

use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::ServerConfig;
use skillbox_store::ArtifactStore;
use tokio_util::sync::CancellationToken;

/// The Node runtime is installed once for every test here (npm ci), not per test.
fn shared_data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-server-tests")
}

struct Server {
    base: String,
    http: reqwest::Client,
    shutdown: CancellationToken,
    _objects: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn start(config: ServerConfig) -> Option<Server> {
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    start_with(config, store, objects).await
}

async fn start_with(
    config: ServerConfig,
    store: ArtifactStore,
    objects: tempfile::TempDir,
) -> Option<Server> {
    // Native sandboxes made ahead, as `serve` has them: most runs here take one.
    let runner = RunnerConfig {
        warm_native: 2,
        ..RunnerConfig::new(shared_data_dir())
    };
    start_with_runner(config, runner, store, objects).await
}

async fn start_with_runner(
    config: ServerConfig,
    runner: RunnerConfig,
    store: ArtifactStore,
    objects: tempfile::TempDir,
) -> Option<Server> {
    let native = skillbox_native::probe();
    if !native.available {
        skillbox_env::testkit::skip("server api", &native.reason.unwrap_or_default());
        return None;
    }
    let runner = Runner::new(runner, store);
    runner
        .prepare(&|line| eprintln!("{line}"))
        .await
        .expect("install the node runtime");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let serving = shutdown.clone();
    tokio::spawn(skillbox_server::serve_on(
        listener,
        config,
        Arc::new(runner),
        serving,
    ));
    Some(Server {
        base,
        http: reqwest::Client::new(),
        shutdown,
        _objects: objects,
    })
}

async fn default_server() -> Option<Server> {
    start(ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..ServerConfig::default()
    })
    .await
}

impl Server {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn run(&self, body: Value) -> Value {
        let (status, json) = self.post("/v1/run", &body).await;
        assert_eq!(status, 200, "{json}");
        json
    }

    async fn raw(&self, body: &'static str) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/run", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// Sends only the head of a POST announcing `length` bytes of JSON, and reads the
    /// answer the server gives without waiting for the body.
    async fn head_only(&self, path: &str, length: usize) -> (u16, String, Value) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let addr = self.base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {length}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                if let Some(at) = find(&got, b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&got[..at]).to_lowercase();
                    let length = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|value| value.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if got.len() >= at + 4 + length {
                        return;
                    }
                }
            }
        })
        .await;
        let text = String::from_utf8_lossy(&got).to_string();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("no HTTP status in {text:?}"));
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        (
            status,
            head.to_lowercase(),
            serde_json::from_str(body).unwrap_or(Value::Null),
        )
    }

    async fn download(&self, url: &str) -> Vec<u8> {
        let response = self
            .http
            .get(format!("{}{url}", self.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap().to_vec()
    }
}

const DECK: &str = r#"
const pptxgen = require("pptxgenjs");
const pres = new pptxgen();
const title = pres.addSlide();
title.addText("WorkspaceX", { x: 0.5, y: 1.5, w: 9, h: 1.2, fontSize: 40, bold: true });
title.addText("Desks that follow your team", { x: 0.5, y: 2.8, w: 9, h: 0.8, fontSize: 20 });
const points = pres.addSlide();
points.addText("Why WorkspaceX", { x: 0.5, y: 0.3, w: 9, h: 0.8, fontSize: 28 });
points.addText(
  ["Book a desk in ten seconds", "Pay only for the days you use", "Every office in one app"].map(
    (text) => ({ text, options: { bullet: true, breakLine: true } })),
  { x: 0.5, y: 1.3, w: 9, h: 3 });
const contact = pres.addSlide();
contact.addText("Contact", { x: 0.5, y: 0.3, w: 9, h: 0.8, fontSize: 28 });
contact.addText("hello@workspacex.example · +1 555 0100", { x: 0.5, y: 1.5, w: 9, h: 1 });
pres.writeFile({ fileName: "workspacex.pptx" }).then((name) => console.log("wrote " + name));
"#;

/// The text of `GET /metrics`.
async fn metrics_text(server: &Server) -> String {
    let response = server
        .http
        .get(format!("{}/metrics", server.base))
        .send()
        .await;
    response.unwrap().text().await.unwrap()
}

fn is_error(json: &Value, code: &str) -> bool {
    json["error"]["code"] == code
        && json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_deck_is_made_downloaded_and_verified() {
    let Some(server) = default_server().await else {
        return;
    };
    let result = server
        .run(json!({"script": DECK, "language": "node"}))
        .await;
    assert_eq!(result["exitCode"], 0, "{result}");
    assert_eq!(result["stdout"], "wrote workspacex.pptx\n");
    let files = result["files"].as_array().unwrap();
    assert_eq!(
        files.len(),
        1,
        "only the deck: the script itself is not an artifact: {result}"
    );
    let file = &files[0];
    assert_eq!(file["path"], "workspacex.pptx");
    assert_eq!(
        file["contentType"],
        "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    );
    let bytes = server.download(file["url"].as_str().unwrap()).await;
    assert_eq!(bytes.len() as u64, file["size"].as_u64().unwrap());
    let deck = skillbox_pptx::verify(&bytes).expect("a real pptx");
    assert_eq!(deck.slide_count(), 3);
    assert!(deck.contains(1, "WorkspaceX"), "{}", deck.text_of(1));
    for point in [
        "Book a desk in ten seconds",
        "Pay only for the days you use",
        "Every office in one app",
    ] {
        assert!(
            deck.contains(2, point),
            "slide 2 lacks {point:?}: {}",
            deck.text_of(2)
        );
    }
    assert!(
        deck.contains(3, "hello@workspacex.example"),
        "{}",
        deck.text_of(3)
    );
    assert!(!deck.contains(1, "hello@workspacex.example"));
    // The download is named and typed.
    let response = server
        .http
        .get(format!("{}{}", server.base, file["url"].as_str().unwrap()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.headers()["content-disposition"],
        "attachment; filename=\"workspacex.pptx\""
    );
    let head = server
        .http
        .head(format!(
            "{}/v1/objects/{}",
            server.base,
            file["sha256"].as_str().unwrap()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(head.status(), 200);
    assert_eq!(
        head.headers()["content-length"],
        file["size"].to_string().as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shapetype_mistake_fails_with_pptxgenjs_own_message() {
    let Some(server) = default_server().await else {
        return;
    };
    let script = r#"
const pptxgen = require("pptxgenjs");
const pres = new pptxgen();
pres.addSlide().addShape(pres.ShapeType.RECTANGLE, { x: 1, y: 1, w: 2, h: 1 });
pres.writeFile({ fileName: "never.pptx" });
"#;
    let result = server.run(json!({"script": script})).await;
    assert_eq!(result["exitCode"], 1, "{result}");
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("Missing/Invalid shape parameter"),
        "{result}"
    );
    assert_eq!(result["files"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacks_over_the_api_are_denied_and_the_host_is_unchanged() {
    let Some(server) = default_server().await else {
        return;
    };
    let listener = StdListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let marker = format!("skillbox-api-attack-{}", std::process::id());
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let script = format!(
        r#"
const fs = require("fs");
const attempt = (name, f) => {{ try {{ const r = f(); console.log(name + " ALLOWED " + String(r).slice(0, 40)); }} catch (e) {{ console.log(name + " denied " + (e.code || e.message)); }} }};
attempt("home", () => fs.writeFileSync("{home}/{marker}", "x"));
attempt("tmp", () => fs.writeFileSync("/tmp/{marker}", "x") || fs.readFileSync("/etc/hostname", "utf8"));
attempt("exec", () => require("child_process").execSync("id").toString());
attempt("passwd", () => fs.readFileSync("/etc/passwd", "utf8"));
fetch("http://127.0.0.1:{port}/").then(() => console.log("fetch ALLOWED"), (e) => console.log("fetch denied " + (e.cause && e.cause.code)));
"#
    );
    let result = server.run(json!({"script": script})).await;
    let stdout = result["stdout"].as_str().unwrap();
    for name in ["home", "exec", "passwd", "fetch"] {
        assert!(
            stdout.contains(&format!("{name} denied")),
            "{name} was not denied: {result}"
        );
    }
    assert!(
        !stdout.contains("ALLOWED\n") && !stdout.contains("passwd ALLOWED"),
        "{result}"
    );
    assert!(
        !std::path::Path::new(&format!("{home}/{marker}")).exists(),
        "wrote the host's $HOME"
    );
    assert!(
        !std::path::Path::new(&format!("/tmp/{marker}")).exists(),
        "wrote the host's /tmp"
    );
    assert!(listener.accept().is_err(), "the host listener was reached");
}

/// Node's permission model, the second layer inside the sandbox, against the attack
/// table of the skill-sandbox design (run there with `--allow-fs-write=` empty), over
/// `POST /v1/run` on every backend that runs Node: a write to `$HOME`
/// (`os.homedir()`, `/tmp`, outside the workspace) and to `/tmp`, `child_process` and
/// a read of `/etc/passwd` are each `ERR_ACCESS_DENIED`, while a write to the
/// workspace and `require("pptxgenjs")` work, and the run hands back only what the
/// workspace holds. Before, `/tmp/*` was writable, and with it `$HOME`. On wasm,
/// `node` is QuickJS with no Node APIs: none of these calls exists there, and the
/// guest sees only `/workspace` (`crates/skillbox/tests/wasm.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_denies_the_attack_table_on_every_backend() {
    let test = "node_denies_the_attack_table_on_every_backend";
    let Some(server) = default_server().await else {
        return;
    };
    let script = r#"
const fs = require("fs"), os = require("os");
const attempt = (name, f) => { try { f(); console.log(name + " ALLOWED"); } catch (e) { console.log(name + " denied " + (e.code || e.message)); } };
console.log("home " + os.homedir());
attempt("home", () => fs.writeFileSync(os.homedir() + "/PWNED.txt", "x"));
attempt("tmp", () => fs.writeFileSync("/tmp/PWNED.txt", "x"));
attempt("exec", () => require("child_process").execSync("id"));
attempt("passwd", () => fs.readFileSync("/etc/passwd", "utf8"));
attempt("workspace", () => fs.writeFileSync("/workspace/ok.txt", "ok"));
attempt("pptxgenjs", () => new (require("pptxgenjs"))());
"#;
    for backend in ["native", "docker", "gvisor"] {
        let (status, result) = server
            .post(
                "/v1/run",
                &json!({"script": script, "language": "node", "backend": backend}),
            )
            .await;
        if status == 503 && backend != "native" {
            skillbox_env::testkit::skip(test, &format!("{backend}: {result}"));
            continue;
        }
        assert_eq!(status, 200, "{backend}: {result}");
        let stdout = result["stdout"].as_str().unwrap_or_default();
        assert_eq!(
            stdout,
            "home /tmp\n\
             home denied ERR_ACCESS_DENIED\n\
             tmp denied ERR_ACCESS_DENIED\n\
             exec denied ERR_ACCESS_DENIED\n\
             passwd denied ERR_ACCESS_DENIED\n\
             workspace ALLOWED\n\
             pptxgenjs ALLOWED\n",
            "{backend}: {result}"
        );
        let files: Vec<&str> = result["files"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["path"].as_str())
            .collect();
        assert_eq!(files, ["ok.txt"], "{backend}: {result}");
    }
}

/// The skill says pptxgenjs is preinstalled: a Python or shell run that calls `node`
/// finds it as a Node run does, from the workspace and from anywhere else (`/tmp`), on
/// every backend that has Node. Before, on native, only a Node run had it
/// (`MODULE_NOT_FOUND`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_in_any_language_finds_pptxgenjs_with_node() {
    let test = "a_run_in_any_language_finds_pptxgenjs_with_node";
    let Some(server) = default_server().await else {
        return;
    };
    let node = r#"new (require("pptxgenjs"))(); console.log("pptxgenjs ok")"#;
    let python = format!(
        "import subprocess\n\
         for cwd in ('/workspace', '/tmp'):\n\
         \x20   done = subprocess.run(['node', '-e', '{node}'], cwd=cwd, capture_output=True, text=True)\n\
         \x20   print(cwd, done.returncode, done.stdout.strip() or done.stderr[-300:])\n"
    );
    let sh = format!(
        "cd /workspace && printf '/workspace ' && node -e '{node}'\n\
         cd /tmp && printf '/tmp ' && node -e '{node}'\n"
    );
    for backend in ["native", "docker", "gvisor"] {
        for (language, script, said) in [
            (
                "python",
                &python,
                "/workspace 0 pptxgenjs ok\n/tmp 0 pptxgenjs ok\n",
            ),
            ("sh", &sh, "/workspace pptxgenjs ok\n/tmp pptxgenjs ok\n"),
        ] {
            let (status, result) = server
                .post(
                    "/v1/run",
                    &json!({"script": script, "language": language, "backend": backend}),
                )
                .await;
            if status == 503 && backend != "native" {
                skillbox_env::testkit::skip(test, &format!("{backend}: {result}"));
                break;
            }
            assert_eq!(status, 200, "{backend} {language}: {result}");
            assert_eq!(
                (result["exitCode"].as_i64(), result["stdout"].as_str()),
                (Some(0), Some(said)),
                "{backend} {language}: {result}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_out_skips_symlinks_and_special_files_and_never_leaves_the_workspace() {
    let Some(server) = default_server().await else {
        return;
    };
    let script = "echo ok > real.txt; ln real.txt hard.txt; ln -s /etc/passwd leak; \
                  ln -s ../../../../etc/hostname leak2; mkfifo pipe; mkdir -p sub; ln -s / sub/root; \
                  ln /etc/passwd stolen 2>/dev/null || echo no-cross-mount-link";
    let result = server
        .run(json!({"script": script, "language": "sh"}))
        .await;
    assert_eq!(result["exitCode"], 0, "{result}");
    assert_eq!(
        result["stdout"], "no-cross-mount-link\n",
        "a hard link to a file outside /workspace must fail"
    );
    let paths: Vec<&str> = result["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["hard.txt", "real.txt"], "{result}");
}

/// Hidden files (`.git/config`, `.envrc`) do not come back unless `outputs` asks for
/// them by a glob that spells the dot; with `outputs`, only what it selects comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_files_come_back_only_when_outputs_ask_for_them() {
    let Some(server) = default_server().await else {
        return;
    };
    let script = "mkdir -p .git out && echo '[core] fsmonitor = evil' > .git/config && \
                  echo evil > .envrc && echo deck > out/deck.pptx && echo notes > notes.txt";
    let paths = |result: &Value| -> Vec<String> {
        result["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    };
    let result = server
        .run(json!({"script": script, "language": "sh"}))
        .await;
    assert_eq!(paths(&result), ["notes.txt", "out/deck.pptx"], "{result}");
    let result = server
        .run(json!({"script": script, "language": "sh", "outputs": ["out/*.pptx", ".envrc"]}))
        .await;
    assert_eq!(paths(&result), [".envrc", "out/deck.pptx"], "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_4xx() {
    let Some(server) = default_server().await else {
        return;
    };
    let cases: Vec<(Value, &str)> = vec![
        (json!({"language": "node"}), "script"),
        (json!({"script": "1", "lang": "node"}), "lang"),
        (json!({"script": "1", "language": "cobol"}), "cobol"),
        (json!({"script": "1", "timeoutMs": -5}), "timeoutMs"),
        (json!({"script": "1", "timeoutMs": 99_999_999}), "timeoutMs"),
        (
            json!({"script": "1", "files": [{"path": "/etc/passwd", "content": "x"}]}),
            "files[0].path",
        ),
        (
            json!({"script": "1", "files": [{"path": "../x", "content": "x"}]}),
            "files[0].path",
        ),
        (
            json!({"script": "1", "files": [{"path": "a.bin", "content": "!!", "encoding": "base64"}]}),
            "files[0].content",
        ),
        (json!({"script": "   "}), "script"),
        (json!({"script": "1", "backend": "vmware"}), "backend"),
        (json!({"script": "1", "outputs": ["../x"]}), "outputs"),
        (json!({"script": "1", "outputs": ["/etc/*"]}), "outputs"),
    ];
    for (body, needle) in cases {
        let (status, json) = server.post("/v1/run", &body).await;
        assert_eq!(status, 400, "{body} -> {json}");
        assert!(is_error(&json, "invalid"), "{body} -> {json}");
        assert!(
            json["error"]["message"].as_str().unwrap().contains(needle),
            "{body} -> {json}"
        );
    }
    let (status, json) = server.raw("{not json").await;
    assert_eq!(status, 400);
    assert!(is_error(&json, "invalid"), "{json}");
    // A body over the limit is refused from its announced size, before a byte of it
    // is read: the client gets the 413 having sent only the head.
    let (status, _, json) = server.head_only("/v1/run", 49 * 1024 * 1024).await;
    assert_eq!(status, 413, "{json}");
    assert!(is_error(&json, "payload_too_large"), "{json}");
    let (status, json) = server
        .post("/v1/run", &json!({"script": "1", "backend": "wasm"}))
        .await;
    // A test process cannot start wasm guests (only the skillbox binary can): the
    // backend says so, and the run does not fall back to another.
    assert_eq!(status, 503, "{json}");
    assert!(is_error(&json, "unavailable"), "{json}");
    assert!(
        json["error"]["message"].as_str().unwrap().contains("wasm"),
        "{json}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_results_not_errors_and_inputs_arrive() {
    let Some(server) = default_server().await else {
        return;
    };
    let result = server
        .run(json!({"script": "sleep 30", "language": "sh", "timeoutMs": 300}))
        .await;
    assert_eq!(result["timedOut"], true, "{result}");
    let result = server
        .run(json!({
            "script": "cat in/a.txt; cat b.bin | od -An -tx1; echo made > out.txt; echo changed > in/a.txt",
            "language": "sh",
            "files": [{"path": "in/a.txt", "content": "hello\n"}, {"path": "b.bin", "content": "AAH/", "encoding": "base64"}]
        }))
        .await;
    assert_eq!(result["exitCode"], 0, "{result}");
    assert_eq!(result["stdout"], "hello\n 00 01 ff\n");
    let paths: Vec<&str> = result["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        ["in/a.txt", "out.txt"],
        "changed inputs and new files, not unchanged inputs"
    );
    let result = server
        .run(json!({"script": "import sys; print(sys.version_info[0])", "language": "python"}))
        .await;
    assert_eq!(result["stdout"], "3\n", "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_health_metrics_and_openapi() {
    let Some(server) = default_server().await else {
        return;
    };
    let get = |path: &str| server.http.get(format!("{}{path}", server.base)).send();
    let response = get("/v1/objects/not-a-sha").await.unwrap();
    assert_eq!(response.status(), 400);
    assert!(is_error(&response.json().await.unwrap(), "invalid"));
    let response = get(&format!("/v1/objects/{}", "0".repeat(64)))
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    assert!(is_error(&response.json().await.unwrap(), "not_found"));
    let response = get("/healthz").await.unwrap();
    assert_eq!(response.status(), 200);
    server
        .run(json!({"script": "true", "language": "sh"}))
        .await;
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("skillbox_runs_total{outcome=\"ok\"} 1"),
        "{metrics}"
    );
    // The native pool: the first run of its shape found none ready; once the pool
    // has filled, the next run takes one made ahead.
    assert!(
        metrics.contains("skillbox_warm_sandboxes_total{outcome=\"missed\"} 1"),
        "{metrics}"
    );
    let mut filled = false;
    for _ in 0..200 {
        let metrics = get("/metrics").await.unwrap().text().await.unwrap();
        if metrics.contains("skillbox_warm_sandboxes_ready 2") {
            filled = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(filled, "the native pool did not fill");
    server
        .run(json!({"script": "true", "language": "sh"}))
        .await;
    let metrics = get("/metrics").await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("skillbox_warm_sandboxes_total{outcome=\"taken\"} 1")
            && metrics.contains("skillbox_warm_sandboxes_total{outcome=\"missed\"} 1"),
        "{metrics}"
    );
    let openapi: Value = get("/openapi.json").await.unwrap().json().await.unwrap();
    assert!(openapi["paths"]["/v1/run"]["post"].is_object(), "{openapi}");
    assert!(openapi["components"]["schemas"]["RunRequest"].is_object());
    // The manifest schema, the same document as the checked-in one.
    let schema: Value = get("/v1/capabilities/schema")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let checked_in: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs/capability-manifest.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(schema, checked_in);
    assert!(schema["properties"]["environment"].is_object(), "{schema}");
    let response = get("/no/such/thing").await.unwrap();
    assert_eq!(response.status(), 404);
    assert!(is_error(&response.json().await.unwrap(), "not_found"));
    let (status, json) = server
        .post("/run", &json!({"script": "echo alias", "language": "sh"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(json["stdout"], "alias\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let Some(server) = start(ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        max_concurrency: 1,
        max_queue: 0,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let slow = {
        let http = server.http.clone();
        let url = format!("{}/v1/run", server.base);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"script": "sleep 60", "language": "sh"}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    // Wait until the slow run holds the only slot (bounded poll on /metrics).
    let mut busy = false;
    for _ in 0..200 {
        let metrics = metrics_text(&server).await;
        if metrics.contains("skillbox_runs_in_flight 1") {
            busy = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(busy, "the slow run never started");
    let response = server
        .http
        .post(format!("{}/v1/run", server.base))
        .json(&json!({"script": "true", "language": "sh"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    assert!(is_error(&response.json().await.unwrap(), "overloaded"));
    // The slow run holds its slot for a minute (no timing window for the 429 above);
    // dropping its request cancels it, and the server removes its sandbox.
    slow.abort();
    assert!(slow.await.unwrap_err().is_cancelled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clashing_inputs_are_the_requests_fault() {
    let Some(server) = default_server().await else {
        return;
    };
    let (status, json) = server
        .post("/v1/run", &json!({"script": "true", "language": "sh", "files": [{"path": "a", "content": "x"}, {"path": "a/b", "content": "y"}]}))
        .await;
    assert_eq!(status, 400, "{json}");
    assert!(is_error(&json, "invalid"), "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("files[1].path"),
        "{json}"
    );
}

async fn agent_server(data: &std::path::Path) -> Option<Server> {
    agent_server_with(data, skillbox_server::AgentModel::Loopback).await
}

async fn agent_server_with(
    data: &std::path::Path,
    model: skillbox_server::AgentModel,
) -> Option<Server> {
    // One store for runs and agent runs, under the data dir, as `skillbox serve` has it.
    let store = ArtifactStore::local(&data.join("objects")).await.unwrap();
    let agents = skillbox_server::AgentRuns::open(
        &skillbox_store::RecordsDb::sqlite(data),
        "test",
        model,
        2,
    )
    .await
    .unwrap();
    let config = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        agents: Some(agents),
        ..ServerConfig::default()
    };
    start_with(config, store, tempfile::tempdir().unwrap()).await
}

async fn wait_done(server: &Server, id: &str) -> Value {
    for _ in 0..600 {
        let record: Value = server
            .http
            .get(format!("{}/v1/agent/runs/{id}", server.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if record["status"] != "running" {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("agent run {id} did not finish");
}

/// Agent runs take the server's disk bound (`serve --disk`): a script that writes a
/// 3 MB scratch file (in the workspace: a Node script writes nowhere else) fails under
/// a 2 MB bound and succeeds with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_take_the_servers_disk_bound() {
    let pptx = skillbox_agent::builtin_skill("pptx").unwrap();
    let demo: Value = serde_json::from_str(pptx.transcript.unwrap()).unwrap();
    let deck = demo["turns"][1]["toolCalls"][0]["arguments"]["script"]
        .as_str()
        .unwrap();
    let transcript = json!({"turns": [
        {"text": "A big scratch file, then the deck.", "toolCalls": [{"name": "run_script", "arguments": {
            "language": "node",
            "script": format!("require('fs').writeFileSync('/workspace/.big', Buffer.alloc(3000000));\n{deck}"),
        }}]},
        {"expect": {"exitCode": 0, "filesInclude": "workspacex.pptx"}, "text": "Done."},
    ]});
    for (disk, succeeds) in [(None, true), (Some(2 << 20), false)] {
        let data = tempfile::tempdir().unwrap();
        let store = ArtifactStore::local(&data.path().join("objects"))
            .await
            .unwrap();
        let model = skillbox_server::AgentModel::Transcript(transcript.to_string());
        let config = ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            agents: Some(
                skillbox_server::AgentRuns::open(
                    &skillbox_store::RecordsDb::sqlite(data.path()),
                    "test",
                    model,
                    2,
                )
                .await
                .unwrap(),
            ),
            ..ServerConfig::default()
        };
        let mut runner = RunnerConfig::new(shared_data_dir());
        runner.limits.disk_bytes = disk;
        let objects = tempfile::tempdir().unwrap();
        let Some(server) = start_with_runner(config, runner, store, objects).await else {
            return;
        };
        let (status, created) = server
            .post(
                "/v1/agent/runs",
                &json!({"prompt": "a deck", "maxAttempts": 1}),
            )
            .await;
        assert_eq!(status, 202, "{created}");
        let record = wait_done(&server, created["id"].as_str().unwrap()).await;
        assert_eq!(
            record["status"] == "succeeded",
            succeeds,
            "disk {disk:?}: {record}"
        );
        if !succeeds {
            assert!(
                record["attempts"][0]["stderr"]
                    .as_str()
                    .is_some_and(|e| e.contains("ENOSPC")),
                "{record}"
            );
        }
    }
}

/// `"backend"` in `POST /v1/agent/runs`: the same demo on docker and gvisor, each
/// attempt behind that boundary, and the verified deck downloadable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_over_http_on_container_backends() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = agent_server(data.path()).await else {
        return;
    };
    for backend in ["docker", "gvisor"] {
        let (status, created) = server
            .post(
                "/v1/agent/runs",
                &json!({"prompt": "Make a 3-slide pitch deck for WorkspaceX.", "backend": backend}),
            )
            .await;
        assert_eq!(status, 202, "{backend}: {created}");
        let id = created["id"].as_str().unwrap().to_string();
        let record = wait_done(&server, &id).await;
        if record["status"] == "failed" && record["error"]["code"] == "unavailable" {
            skillbox_env::testkit::skip(
                "agent_runs_over_http_on_container_backends",
                record["error"]["message"].as_str().unwrap_or(backend),
            );
            continue;
        }
        assert_eq!(record["status"], "succeeded", "{backend}: {record}");
        assert_eq!(record["backend"], backend, "{record}");
        assert_eq!(record["attempts"].as_array().unwrap().len(), 2, "{record}");
        let url = record["artifacts"][0]["url"].as_str().unwrap().to_string();
        let deck = skillbox_pptx::verify(&server.download(&url).await)
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(deck.slide_count(), 3, "{backend}");
    }
}

/// The agent loop over HTTP: two attempts (the first with the ShapeType error), a
/// verified deck downloadable from its url, and the record still there after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_runs_over_http_ship_a_deck_and_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = agent_server(data.path()).await else {
        return;
    };
    let (status, created) = server
        .post(
            "/v1/agent/runs",
            &json!({"prompt": "Make a 3-slide pitch deck for WorkspaceX.", "skill": "pptx"}),
        )
        .await;
    assert_eq!(status, 202, "{created}");
    assert_eq!(created["status"], "running");
    let id = created["id"].as_str().unwrap().to_string();
    let record = wait_done(&server, &id).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    assert_eq!(record["scripted"], true);
    let attempts = record["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{record}");
    assert_eq!(attempts[0]["exitCode"], 1);
    assert!(
        attempts[0]["stderr"]
            .as_str()
            .unwrap()
            .contains("Missing/Invalid shape parameter")
    );
    assert!(
        attempts[0]["script"]
            .as_str()
            .unwrap()
            .contains("pres.ShapeType")
    );
    assert!(attempts[1]["durationMs"].is_u64());
    let url = record["artifacts"][0]["url"].as_str().unwrap().to_string();
    let deck = skillbox_pptx::verify(&server.download(&url).await).expect("the deck from its url");
    assert_eq!(deck.slide_count(), 3);
    assert!(deck.contains(1, "WorkspaceX"));
    assert!(
        deck.contains(3, "hello@workspacex.example"),
        "{}",
        deck.text_of(3)
    );
    drop(server);
    let Some(server) = agent_server(data.path()).await else {
        return;
    };
    let again: Value = server
        .http
        .get(format!("{}/v1/agent/runs/{id}", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again, record, "the record survives a restart");
    let sha = record["artifacts"][0]["sha256"].as_str().unwrap();
    let store = ArtifactStore::local(&data.path().join("objects"))
        .await
        .unwrap();
    let bytes = store.get(sha).await.unwrap();
    let deck = skillbox_pptx::verify(&bytes).unwrap();
    assert_eq!(deck.slide_count(), 3);
    assert!(deck.contains(1, "WorkspaceX"));
    assert!(url.starts_with(&format!("/v1/objects/{sha}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_run_bad_input() {
    let data = tempfile::tempdir().unwrap();
    let Some(server) = agent_server(data.path()).await else {
        return;
    };
    for (body, needle) in [
        (json!({"prompt": "  "}), "prompt"),
        (json!({"prompt": "x", "skill": "excel"}), "skill"),
        (json!({"prompt": "x", "maxAttempts": 0}), "maxAttempts"),
        (json!({"prompt": "x", "temperature": 2}), "temperature"),
        (
            json!({"prompt": "x", "network": {"allow": ["https://x.example/"]}}),
            "network.allow[0]",
        ),
    ] {
        let (status, json) = server.post("/v1/agent/runs", &body).await;
        assert_eq!(status, 400, "{body} -> {json}");
        assert!(
            json["error"]["message"].as_str().unwrap().contains(needle),
            "{body} -> {json}"
        );
    }
    let response = server
        .http
        .get(format!("{}/v1/agent/runs/nope", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    // A server without agent runs says so.
    let Some(plain) = default_server().await else {
        return;
    };
    let (status, json) = plain.post("/v1/agent/runs", &json!({"prompt": "x"})).await;
    assert_eq!(status, 503, "{json}");
}

/// Shutting the server down mid-run ends the run and records it as failed, with the
/// attempt that was running; nothing is left "running".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_mid_run_records_the_run_as_failed() {
    // The shared data dir: its Node runtime is already installed.
    let data = shared_data_dir();
    let marker = 940_000_000 + std::process::id();
    let transcript = json!({"turns": [
        {"toolCalls": [{"name": "run_script", "arguments": {"language": "sh", "script": format!("echo started; sleep {marker}")}}]},
        {"text": "never reached"}
    ]})
    .to_string();
    let Some(server) =
        agent_server_with(&data, skillbox_server::AgentModel::Transcript(transcript)).await
    else {
        return;
    };
    let (status, created) = server
        .post("/v1/agent/runs", &json!({"prompt": "go"}))
        .await;
    assert_eq!(status, 202, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let needle = format!("sleep {marker}");
    let mut started = false;
    for _ in 0..3000 {
        if !skillbox_env::testkit::host_processes_with(&needle).is_empty() {
            started = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(started, "the run's script never started");
    // Stop the server and wait until its agent runs are recorded (serve_on returns then).
    server.shutdown.cancel();
    skillbox_env::testkit::assert_processes_gone(&needle, "after shutdown").await;
    drop(server);
    let records =
        skillbox_store::RunRecords::open(&skillbox_store::RecordsDb::sqlite(&data), "test")
            .await
            .unwrap();
    let mut record = None;
    for _ in 0..500 {
        let r = records.get(&id).await.unwrap().expect("the record");
        if r.status != "running" {
            record = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let record = record.expect("the run must not stay running after a shutdown");
    assert_eq!(record.status, "failed", "{}", record.body);
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
