//! Sessions over real HTTP: open one, write a file, stream a command's output while it
//! runs, cancel a long command (nothing left running), read a produced file back,
//! delete it; the idle reaper ends an abandoned one; tenants see only their own; the
//! bounds answer 429.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::{ApiKeys, ServerConfig, SessionConfig};
use skillbox_store::ArtifactStore;
use tokio_util::sync::CancellationToken;

const ANA: &str = "ana-token-0123456789abcdef";
const BOB: &str = "bob-token-0123456789abcdef";

struct Served {
    base: String,
    http: reqwest::Client,
    shutdown: CancellationToken,
    /// The server's task: it ends once shutdown has drained the connections.
    serving: tokio::task::JoinHandle<std::io::Result<()>>,
    _data: tempfile::TempDir,
    _objects: tempfile::TempDir,
}

async fn serve(sessions: SessionConfig) -> Option<Served> {
    serve_with(ServerConfig {
        sessions,
        ..ServerConfig::default()
    })
    .await
}

/// A server of `config` with ana's and bob's keys.
async fn serve_with(config: ServerConfig) -> Option<Served> {
    serve_with_limits(config, skillbox_env::Limits::default()).await
}

/// As [`serve_with`], with `limits` for the server's sandboxes (and its bounds).
async fn serve_with_limits(config: ServerConfig, limits: skillbox_env::Limits) -> Option<Served> {
    let native = skillbox_native::probe();
    if !native.available {
        skillbox_env::testkit::skip("sessions over http", &native.reason.unwrap_or_default());
        return None;
    }
    let data = tempfile::tempdir().unwrap();
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let runner = Runner::new(
        RunnerConfig {
            limits,
            ..RunnerConfig::new(data.path())
        },
        store,
    );
    let keys = ApiKeys::from_pairs(&format!("ana={ANA},bob={BOB}")).unwrap();
    let config = ServerConfig {
        keys: Some(Arc::new(keys)),
        ..config
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(skillbox_server::serve_on(
        listener,
        config,
        Arc::new(runner),
        shutdown.clone(),
    ));
    Some(Served {
        base,
        http: reqwest::Client::new(),
        shutdown,
        serving,
        _data: data,
        _objects: objects,
    })
}

impl Served {
    /// Opens a session of ANA's that has run `shell` (which must end by printing
    /// `made`), and gives its id.
    async fn open_having_run(&self, shell: &str) -> String {
        let (status, opened) = self.create(ANA, json!({})).await;
        assert_eq!(status, 201, "{opened}");
        let id = opened["id"].as_str().unwrap().to_string();
        let events = self
            .exec(ANA, &id, json!({"shell": shell}))
            .await
            .rest()
            .await;
        assert!(events.iter().any(|e| e["data"] == "made\n"), "{events:?}");
        id
    }

    async fn create(&self, token: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}/v1/sessions", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, token: &str, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
    }

    async fn put(&self, token: &str, path: &str, body: &'static [u8]) -> reqwest::Response {
        self.http
            .put(format!("{}{path}", self.base))
            .bearer_auth(token)
            .body(body)
            .send()
            .await
            .unwrap()
    }

    /// Starts an exec; its NDJSON events come one at a time from the returned reader.
    async fn exec(&self, token: &str, id: &str, body: Value) -> Events {
        let response = self
            .http
            .post(format!("{}/v1/sessions/{id}/exec", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["content-type"], "application/x-ndjson");
        Events {
            response,
            buffer: Vec::new(),
        }
    }
}

/// A request whose head, and `sent` of its body, is all a client sends: the server
/// must answer it without the rest. [`Stalled::answer`] reads that answer.
struct Stalled(tokio::net::TcpStream);

impl Served {
    /// Sends `method path` as ana with `content_type`, announcing `length` bytes of body
    /// (chunked when `None`), then `sent` of them, and never the rest.
    async fn stall(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        length: Option<usize>,
        sent: &[u8],
    ) -> Stalled {
        use tokio::io::AsyncWriteExt;
        let addr = self.base.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let framing = match length {
            Some(length) => format!("Content-Length: {length}"),
            None => "Transfer-Encoding: chunked".to_string(),
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ANA}\r\n\
             Content-Type: {content_type}\r\n{framing}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(sent).await.unwrap();
        Stalled(stream)
    }
}

impl Stalled {
    /// The status and JSON body of the server's answer, read for at most `within`.
    async fn answer(mut self, within: Duration) -> (u16, Value) {
        use tokio::io::AsyncReadExt;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(within, async {
            let mut buf = [0u8; 4096];
            loop {
                match self.0.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
                let text = String::from_utf8_lossy(&got).to_lowercase();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let length = head
                        .lines()
                        .find_map(|line| line.strip_prefix("content-length:"))
                        .and_then(|value| value.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= length {
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
            .unwrap_or_else(|| panic!("no answer within {within:?}: {text:?}"));
        let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        (status, serde_json::from_str(body).unwrap_or(Value::Null))
    }
}

/// The lines of an NDJSON response, read as they arrive.
struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Events {
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.buffer.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return Some(serde_json::from_slice(&line).unwrap());
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("an event within 30 s")
                .unwrap()?;
            self.buffer.extend_from_slice(&chunk);
        }
    }

    /// Every remaining event, through `exit` or `error`.
    async fn rest(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

impl Served {
    /// Polls ANA's session `id` until it counts `n` execs running; fails with `what`
    /// and the session's info if that takes longer than `bound`.
    async fn wait_execs_running(&self, id: &str, n: u64, bound: Duration, what: &str) {
        let began = Instant::now();
        loop {
            let info: Value = self
                .get(ANA, &format!("/v1/sessions/{id}"))
                .await
                .json()
                .await
                .unwrap();
            if info["execsRunning"] == n {
                return;
            }
            assert!(began.elapsed() < bound, "{what}: {info}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// True once no host process's command line holds `needle`.
fn gone(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().all(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| !String::from_utf8_lossy(&c).contains(needle))
            .unwrap_or(true)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_streams_cancels_reads_and_ends_leaving_nothing() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    let (status, session) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["backend"], "native");

    // Write a file, then run a command that reads it, says it is ready, and waits for a
    // second file the test writes only after it has seen that line: the output is
    // streamed while the command runs, or this never ends.
    let written = served
        .put(
            ANA,
            &format!("/v1/sessions/{id}/files/in/name.txt"),
            b"skillbox",
        )
        .await;
    assert_eq!(written.status(), 200);
    let mut events = served
        .exec(
            ANA,
            &id,
            json!({"shell": "echo \"hello $(cat in/name.txt)\"; echo ready; while [ ! -e go ]; do sleep 0.05; done; echo done > out.txt; echo finished >&2"}),
        )
        .await;
    let started = events.next().await.unwrap();
    assert_eq!(started["type"], "started", "{started}");
    let mut seen = String::new();
    while !seen.contains("ready\n") {
        let event = events.next().await.expect("more output");
        assert_eq!(event["type"], "stdout", "{event}");
        seen.push_str(event["data"].as_str().unwrap());
    }
    assert_eq!(seen, "hello skillbox\nready\n");
    let go = served
        .put(ANA, &format!("/v1/sessions/{id}/files/go"), b"")
        .await;
    assert_eq!(go.status(), 200);
    let rest = events.rest().await;
    assert_eq!(rest.last().unwrap()["type"], "exit", "{rest:?}");
    assert_eq!(rest.last().unwrap()["exitCode"], 0, "{rest:?}");
    assert!(
        rest.iter()
            .any(|e| e["type"] == "stderr" && e["data"] == "finished\n"),
        "{rest:?}"
    );
    let out = served
        .get(ANA, &format!("/v1/sessions/{id}/files/out.txt"))
        .await;
    assert_eq!(out.status(), 200);
    assert_eq!(out.text().await.unwrap(), "done\n");
    let listing: Value = served
        .get(ANA, &format!("/v1/sessions/{id}/ls"))
        .await
        .json()
        .await
        .unwrap();
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["go", "in", "out.txt"], "{listing}");
    // A file's size comes with the listing.
    assert_eq!(listing["entries"][2]["size"], 5, "{listing}");

    // Cancel a long command: its whole process tree dies.
    let marker = format!("{}", 970_000_000 + std::process::id());
    let mut long = served
        .exec(
            ANA,
            &id,
            json!({"shell": format!("sleep {marker} & sleep {marker}; echo never")}),
        )
        .await;
    let started = long.next().await.unwrap();
    let exec_id = started["execId"].as_str().unwrap().to_string();
    let began = Instant::now();
    while gone(&marker) {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ran_ms = began.elapsed().as_millis() as u64;
    let cancelled = served
        .http
        .post(format!(
            "{}/v1/sessions/{id}/execs/{exec_id}/cancel",
            served.base
        ))
        .bearer_auth(ANA)
        .send()
        .await
        .unwrap();
    assert_eq!(cancelled.status(), 200);
    let rest = long.rest().await;
    let exit = rest.last().unwrap();
    assert_eq!(exit["type"], "exit", "{rest:?}");
    assert_eq!(exit["cancelled"], true, "{rest:?}");
    // Its duration is how long it ran until the cancel, not zero.
    assert!(
        exit["durationMs"].as_u64().unwrap() >= ran_ms,
        "ran {ran_ms} ms: {exit}"
    );
    let began = Instant::now();
    while !gone(&marker) {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the cancelled command still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The session goes on after a cancel.
    let mut again = served
        .exec(ANA, &id, json!({"command": ["cat", "out.txt"]}))
        .await;
    let rest = again.rest().await;
    assert!(rest.iter().any(|e| e["data"] == "done\n"), "{rest:?}");

    // Another tenant sees nothing of it.
    assert_eq!(
        served
            .get(BOB, &format!("/v1/sessions/{id}"))
            .await
            .status(),
        404
    );
    assert_eq!(
        served
            .get(BOB, &format!("/v1/sessions/{id}/files/out.txt"))
            .await
            .status(),
        404
    );
    let bobs: Value = served.get(BOB, "/v1/sessions").await.json().await.unwrap();
    assert_eq!(bobs["sessions"], json!([]));
    // Paths stay in /workspace.
    let escaped = served
        .get(
            ANA,
            &format!("/v1/sessions/{id}/files/..%2F..%2Fetc%2Fpasswd"),
        )
        .await;
    assert_eq!(escaped.status(), 400);
    // A path the kernel would refuse part-way is refused whole: no directory of it is
    // left behind.
    let deep = vec!["b".repeat(200); 30].join("/");
    let refused = served
        .put(ANA, &format!("/v1/sessions/{id}/files/{deep}/f"), b"x")
        .await;
    assert_eq!(refused.status(), 400);
    let listed: Value = served
        .get(ANA, &format!("/v1/sessions/{id}/ls"))
        .await
        .json()
        .await
        .unwrap();
    assert!(!listed.to_string().contains("bbbb"), "{listed}");
    // An exec's timeout is bounded as a run's is.
    let long = served
        .http
        .post(format!("{}/v1/sessions/{id}/exec", served.base))
        .bearer_auth(ANA)
        .json(&json!({"shell": "true", "timeoutMs": 86400000}))
        .send()
        .await
        .unwrap();
    assert_eq!(long.status(), 400);
    let error: Value = long.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("timeoutMs: between 1 and 600000"),
        "{error}"
    );

    let deleted = served
        .http
        .delete(format!("{}/v1/sessions/{id}", served.base))
        .bearer_auth(ANA)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    assert_eq!(
        served
            .get(ANA, &format!("/v1/sessions/{id}"))
            .await
            .status(),
        404
    );
    served.shutdown.cancel();
}

/// The attack: code in a session writes `evil.html` (a page with a script) and the
/// tenant's browser is sent to `GET /v1/sessions/{id}/files/evil.html` on the server's
/// origin. It comes back as a download, as a stored object does: `nosniff`, an
/// `attachment` named after the file, and a policy that runs nothing, the same headers
/// as the object of a run that wrote the same file. Before, it was
/// `application/octet-stream` alone, which a browser may sniff as HTML.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_file_is_a_download_as_an_object_is() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    let page: &[u8] = b"<html><script>fetch(\"/v1/runs\")</script></html>";
    let (status, session) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap();
    let written = served
        .put(ANA, &format!("/v1/sessions/{id}/files/evil.html"), page)
        .await;
    assert_eq!(written.status(), 200);
    let file = served
        .get(ANA, &format!("/v1/sessions/{id}/files/evil.html"))
        .await;
    assert_eq!(file.status(), 200);
    let headers = file.headers().clone();
    assert_eq!(file.bytes().await.unwrap(), page);
    assert_eq!(headers["content-type"], "application/octet-stream");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"evil.html\""
    );
    assert_eq!(
        headers["content-security-policy"],
        "default-src 'none'; sandbox"
    );

    // A run's object of the same file: the same three, from the same place.
    let ran: Value = served
        .http
        .post(format!("{}/v1/run", served.base))
        .bearer_auth(ANA)
        .json(&json!({
            "language": "sh",
            "script": format!("printf '%s' '{}' > evil.html", String::from_utf8_lossy(page)),
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sha = ran["files"][0]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("{ran}"));
    let object = served
        .get(ANA, &format!("/v1/objects/{sha}?name=evil.html"))
        .await;
    assert_eq!(object.status(), 200);
    for name in [
        "x-content-type-options",
        "content-disposition",
        "content-security-policy",
    ] {
        assert_eq!(object.headers()[name], headers[name], "{name}");
    }
    served.shutdown.cancel();
}

/// pptxgenjs is there for every exec of a session that has Node, whatever runs it (a
/// shell here, from `/tmp`), on native and on docker, whose image carries it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_s_execs_find_pptxgenjs() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    for backend in ["native", "docker"] {
        let (status, session) = served.create(ANA, json!({"backend": backend})).await;
        if status == 503 && backend != "native" {
            skillbox_env::testkit::skip("a_session_s_execs_find_pptxgenjs", &session.to_string());
            continue;
        }
        assert_eq!(status, 201, "{backend}: {session}");
        let id = session["id"].as_str().unwrap().to_string();
        let events = served
            .exec(
                ANA,
                &id,
                json!({"shell": "cd /tmp && node -e 'new (require(\"pptxgenjs\"))(); console.log(\"pptxgenjs ok\")'"}),
            )
            .await
            .rest()
            .await;
        assert!(
            events
                .iter()
                .any(|e| e["type"] == "stdout" && e["data"] == "pptxgenjs ok\n"),
            "{backend}: {events:?}"
        );
        assert_eq!(
            events.last().unwrap()["exitCode"],
            0,
            "{backend}: {events:?}"
        );
        let ended = served
            .http
            .delete(format!("{}/v1/sessions/{id}", served.base))
            .bearer_auth(ANA)
            .send()
            .await
            .unwrap();
        assert!(ended.status().is_success(), "{backend}");
    }
    served.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_cancels_an_exec_that_writes_nothing() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    let (status, session) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    // Silent: the server never sends after `started`, so only the connection's close
    // can tell it the client left.
    let marker = format!("{}", 972_000_000 + std::process::id());
    let mut silent = served
        .exec(
            ANA,
            &id,
            json!({"shell": format!("sleep {marker} & sleep {marker}")}),
        )
        .await;
    assert_eq!(silent.next().await.unwrap()["type"], "started");
    let began = Instant::now();
    while gone(&marker) {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(silent);
    let began = Instant::now();
    while !gone(&marker) {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the command of a client that went away still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served
        .wait_execs_running(&id, 0, Duration::from_secs(20), "the exec is still counted")
        .await;
    served.shutdown.cancel();
}

/// A shutdown ends the sessions as it begins: an exec whose client still reads its
/// stream is ended (its command killed), so the connection closes and the server stops
/// at once, not after the 30 s drain of open connections (a service manager's grace
/// period is often 10 s, and a server killed then leaves its containers running).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_session_execs_at_once() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    let (status, session) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    let marker = format!("{}", 973_000_000 + std::process::id());
    let mut events = served
        .exec(ANA, &id, json!({"shell": format!("sleep {marker}")}))
        .await;
    assert_eq!(events.next().await.unwrap()["type"], "started");
    served
        .wait_execs_running(&id, 1, Duration::from_secs(20), "the exec never ran")
        .await;
    served.shutdown.cancel();
    // Well inside the drain's 30 s: the server is done, and so is the stream.
    let stopped = tokio::time::timeout(Duration::from_secs(15), served.serving).await;
    assert!(
        matches!(stopped, Ok(Ok(Ok(())))),
        "the server was still draining a session's exec 15 s after its shutdown: {stopped:?}"
    );
    // The exec's stream ends (its last events, then the close), not hangs.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = events.response.chunk().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the exec's stream was still open after the server stopped"
    );
    assert!(gone(&marker), "the session's command outlived the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_session_is_reaped_and_the_bounds_answer_429() {
    let config = SessionConfig {
        bounds: skillbox_door::SessionBounds {
            max_per_tenant: 2,
            ..skillbox_door::SessionBounds::default()
        },
        ..SessionConfig::default()
    };
    let Some(served) = serve(config).await else {
        return;
    };
    let (status, short) = served.create(ANA, json!({"idleTimeoutMs": 300})).await;
    assert_eq!(status, 201, "{short}");
    let short = short["id"].as_str().unwrap().to_string();
    let (status, kept) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{kept}");
    let (status, refused) = served.create(ANA, json!({})).await;
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ana"),
        "{refused}"
    );
    let (status, _) = served.create(BOB, json!({})).await;
    assert_eq!(status, 201, "another tenant has its own bound");

    let began = Instant::now();
    while served
        .get(ANA, &format!("/v1/sessions/{short}"))
        .await
        .status()
        != 404
    {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the idle session was never reaped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its place is free again.
    let (status, _) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201);
    for (body, words) in [
        (json!({"backend": "host"}), "host"),
        (json!({"idleTimeoutMs": 0}), "idleTimeoutMs"),
        (json!({"limits": {"diskBytes": 10}}), "diskBytes"),
        // No looser than a run's: 1..=600000 ms.
        (
            json!({"limits": {"timeoutMs": 86400000}}),
            "limits.timeoutMs",
        ),
        (json!({"limits": {"timeoutMs": 600001}}), "limits.timeoutMs"),
        (json!({"nope": 1}), "nope"),
    ] {
        let (status, error) = served.create(BOB, body.clone()).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(words),
            "{body}: {error}"
        );
    }
    served.shutdown.cancel();
}

/// A session with a network policy: its commands find the proxy in their environment,
/// a host not on the list is refused with the reason, and the session's record lists
/// the refusal; a bad entry is 400 naming it; a backend with no proxy is 503 naming
/// egress, never a session with less or more network than asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_a_network_policy_reaches_only_what_it_allows() {
    let Some(served) = serve(SessionConfig::default()).await else {
        return;
    };
    let (status, info) = served
        .create(ANA, json!({"network": {"allow": ["files.example.org"]}}))
        .await;
    assert_eq!(status, 201, "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let script = r#"
import os, urllib.request, urllib.error
print(os.environ["HTTPS_PROXY"])
try:
    urllib.request.urlopen("http://not-listed.example/", timeout=10)
    print("REACHED")
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode().strip())
"#;
    let mut events = served
        .exec(ANA, &id, json!({"command": ["python3", "-c", script]}))
        .await;
    let events = events.rest().await;
    let stdout: String = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["data"].as_str().unwrap_or_default())
        .collect();
    assert!(stdout.starts_with("http://127.0.0.1:3128\n"), "{events:?}");
    assert!(
        stdout.contains(
            "HTTP 403 skillbox egress: not-listed.example:80 is not on the run's network.allow"
        ),
        "{events:?}"
    );
    let info: Value = served
        .get(ANA, &format!("/v1/sessions/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(info["egress"][0]["host"], "not-listed.example", "{info}");
    assert_eq!(info["egress"][0]["verdict"], "refused", "{info}");

    let (status, answer) = served
        .create(ANA, json!({"network": {"allow": ["ok.example", "*"]}}))
        .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("network.allow[1]"),
        "{answer}"
    );
    let (status, answer) = served
        .create(
            ANA,
            json!({"backend": "wasm", "network": {"allow": ["ok.example"]}}),
        )
        .await;
    assert_eq!(status, 503, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("egress"),
        "{answer}"
    );
    served.shutdown.cancel();
}

/// A session request's body is refused by what can refuse it before any of it is read
/// (no such session, too large by its length, not JSON, the session's execs all taken),
/// and one that never finishes is ended by the body timeout, its exec's place freed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_bodies_are_refused_before_they_are_read_and_timed_out() {
    let Some(served) = serve_with(ServerConfig {
        body_timeout: Duration::from_secs(1),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let soon = Duration::from_secs(5);
    // No such session: 404 without waiting for the 48 MiB announced.
    let began = Instant::now();
    let (status, error) = served
        .stall(
            "PUT",
            "/v1/sessions/ses_00000000000000000000000000000000/files/big.bin",
            "application/octet-stream",
            Some(48 * 1024 * 1024),
            b"",
        )
        .await
        .answer(soon)
        .await;
    assert_eq!(status, 404, "{error}");
    assert!(began.elapsed() < soon);

    // Not JSON: 415, before the body and before a sandbox is made.
    for (path, what) in [
        ("/v1/sessions", "create"),
        (
            "/v1/sessions/ses_00000000000000000000000000000000/exec",
            "exec",
        ),
    ] {
        let response = served
            .http
            .post(format!("{}{path}", served.base))
            .bearer_auth(ANA)
            .header("content-type", "text/plain")
            .body("{}")
            .send()
            .await
            .unwrap();
        let (status, error) = (response.status().as_u16(), response.text().await.unwrap());
        let expected = if what == "create" { 415 } else { 404 };
        assert_eq!(status, expected, "{what}: {error}");
    }

    let (status, opened) = served.create(ANA, json!({})).await;
    assert_eq!(status, 201, "{opened}");
    let id = opened["id"].as_str().unwrap().to_string();
    let response = served
        .http
        .post(format!("{}/v1/sessions/{id}/exec", served.base))
        .bearer_auth(ANA)
        .header("content-type", "text/plain")
        .body(r#"{"shell": "echo ran > ran.txt"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 415);
    assert_eq!(
        served
            .get(ANA, &format!("/v1/sessions/{id}/files/ran.txt"))
            .await
            .status(),
        404,
        "a text/plain exec ran"
    );

    // Announced over the body limit: 413 without the body.
    let files = format!("/v1/sessions/{id}/files/big.bin");
    let (status, error) = served
        .stall(
            "PUT",
            &files,
            "application/octet-stream",
            Some(49 * 1024 * 1024),
            b"",
        )
        .await
        .answer(soon)
        .await;
    assert_eq!(status, 413, "{error}");

    // A body that never finishes is ended by the body timeout (1 s here), announced or
    // chunked, and nothing is written.
    for length in [Some(100), None] {
        let began = Instant::now();
        let sent: &[u8] = if length.is_some() {
            b"0123456789"
        } else {
            b"a\r\n0123456789\r\n"
        };
        let (status, error) = served
            .stall("PUT", &files, "application/octet-stream", length, sent)
            .await
            .answer(soon)
            .await;
        assert_eq!(status, 504, "{length:?}: {error}");
        assert!(began.elapsed() >= Duration::from_secs(1), "{length:?}");
    }
    assert_eq!(served.get(ANA, &files).await.status(), 404);

    // Execs whose bodies are still coming hold the session's places: the fifth is 429 at
    // once, and the places are free again once the body timeout ends them.
    let exec = format!("/v1/sessions/{id}/exec");
    let mut stalled = Vec::new();
    for _ in 0..4 {
        stalled.push(
            served
                .stall("POST", &exec, "application/json", Some(100), b"{")
                .await,
        );
    }
    served
        .wait_execs_running(&id, 4, soon, "the stalled execs never counted")
        .await;
    let (status, error) = served
        .stall("POST", &exec, "application/json", Some(100), b"")
        .await
        .answer(Duration::from_millis(900))
        .await;
    assert_eq!(status, 429, "{error}");
    for waiting in stalled {
        let (status, error) = waiting.answer(soon).await;
        assert_eq!(status, 504, "{error}");
    }
    let mut events = served.exec(ANA, &id, json!({"shell": "echo after"})).await;
    let events = events.rest().await;
    assert_eq!(events.last().unwrap()["type"], "exit", "{events:?}");
    served.shutdown.cancel();
}

/// The peak resident memory of this test process (`VmHWM`), in bytes.
fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// A file read is held in the server's memory until it is sent, so it counts against
/// the budget of bytes in memory that request bodies count against: six clients that
/// ask for a 48 MiB file at once, and read none of it yet, make the server hold at most
/// the 64 MiB budget (the others are 429 until the held read is sent), not 288 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_file_reads_are_held_within_the_memory_budget() {
    const MIB: u64 = 1024 * 1024;
    let Some(served) = serve_with(ServerConfig {
        max_body_bytes_in_flight: 64 * MIB as usize,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let id = served
        .open_having_run("head -c 48M /dev/zero > big && echo made")
        .await;

    let before = peak_memory();
    let path = format!("/v1/sessions/{id}/files/big");
    let asked = (0..6).map(|_| served.get(ANA, &path));
    let answers = futures_util::future::join_all(asked).await;
    let grown = peak_memory().saturating_sub(before);
    let (mut read, mut refused) = (0, 0);
    for mut answer in answers {
        match answer.status().as_u16() {
            200 => {
                let mut got = 0;
                while let Some(chunk) = answer.chunk().await.unwrap() {
                    got += chunk.len() as u64;
                }
                assert_eq!(got, 48 * MIB);
                read += 1;
            }
            429 => {
                let error: Value = answer.json().await.unwrap();
                assert_eq!(error["error"]["code"], "overloaded", "{error}");
                refused += 1;
            }
            other => panic!("{other}: {}", answer.text().await.unwrap()),
        }
    }
    eprintln!(
        "6 reads of 48 MiB: {read} read, {refused} refused, peak memory grew {} MiB",
        grown / MIB
    );
    assert!(read >= 1);
    assert!(
        grown < 160 * MIB,
        "reads of 48 MiB held {} MiB at once ({read} read, {refused} refused)",
        grown / MIB
    );
    // Once the held read is sent (its bytes dropped just after the last is written),
    // the next one is served.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut again = served.get(ANA, &path).await;
    while again.status() == 429 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        again = served.get(ANA, &path).await;
    }
    assert_eq!(again.status(), 200);
    let mut got = 0;
    while let Some(chunk) = again.chunk().await.unwrap() {
        got += chunk.len() as u64;
    }
    assert_eq!(got, 48 * MIB);
    served.shutdown.cancel();
}

/// A client that asks for a file and stops reading it holds the file's place in the
/// budget of bytes in memory only until the body timeout: then its connection is
/// closed and the place given back, so another tenant's request is served again (it was
/// 429 while the place was held).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_an_answer_holds_the_budget_only_until_the_body_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: usize = 1024 * 1024;
    let Some(served) = serve_with(ServerConfig {
        max_body_bytes_in_flight: 64 * MIB,
        body_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let id = served
        .open_having_run("head -c 40M /dev/zero > big && echo made")
        .await;
    let (status, bobs) = served.create(BOB, json!({})).await;
    assert_eq!(status, 201, "{bobs}");
    let bobs = bobs["id"].as_str().unwrap().to_string();

    // Ana asks for the file on a socket with a small receive buffer, reads the head,
    // and stops.
    let addr: std::net::SocketAddr = served.base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let head = format!(
        "GET /v1/sessions/{id}/files/big HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ANA}\r\n\r\n"
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    let mut start = [0u8; 300];
    stalled.read_exact(&mut start).await.unwrap();
    assert!(
        start.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&start)
    );
    let stalled_at = Instant::now();

    // Bob's 32 MiB write does not fit beside the held 40 MiB: 429 (announced, refused
    // before its body is sent), until the stalled connection is closed at the body
    // timeout.
    let bobs_put = || async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "PUT /v1/sessions/{bobs}/files/x HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {BOB}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            32 * MIB
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        Stalled(stream).answer(Duration::from_secs(5)).await
    };
    let (status, refused) = bobs_put().await;
    assert_eq!(status, 429, "the read was not held: {refused}");
    while bobs_put().await.0 == 429 {
        assert!(
            stalled_at.elapsed() < Duration::from_secs(20),
            "a stalled reader still holds the budget after {:?}",
            stalled_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let written = served
        .http
        .put(format!("{}/v1/sessions/{bobs}/files/x", served.base))
        .bearer_auth(BOB)
        .body(vec![b'x'; 32 * MIB])
        .send()
        .await
        .unwrap();
    assert_eq!(written.status(), 200, "{}", written.text().await.unwrap());
    assert!(
        stalled_at.elapsed() >= Duration::from_millis(1500),
        "the hold went before the body timeout: {:?}",
        stalled_at.elapsed()
    );
    // Ana's connection was closed: what is left to read ends (EOF or a reset), well
    // short of the 40 MiB.
    let mut rest = 0usize;
    let mut buf = vec![0u8; 64 * 1024];
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => rest += n,
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stalled connection is still open");
    assert!(rest < 40 * MIB, "the whole file was sent after all");
    served.shutdown.cancel();
}

/// The body timeout cuts off a client that stops taking an answer, not one that takes it
/// slowly: a 20 MiB file read at about 6 MB/s (64 KiB every 10 ms) for longer than the
/// 2 s timeout arrives whole. And a long exec after a read, on the same keep-alive
/// connection, is not cut by the read's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_slowly_but_steadily_is_served_whole() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: usize = 1024 * 1024;
    let Some(served) = serve_with(ServerConfig {
        body_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let id = served
        .open_having_run("head -c 20M /dev/zero > big && echo made")
        .await;
    let addr: std::net::SocketAddr = served.base.trim_start_matches("http://").parse().unwrap();
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /v1/sessions/{id}/files/big HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ANA}\r\nConnection: close\r\n\r\n"
    );
    slow.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let mut piece = vec![0u8; 64 * 1024];
    loop {
        match slow.read(&mut piece).await {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&piece[..n]),
            Err(e) => panic!(
                "cut off after {} bytes in {:?}: {e}",
                got.len(),
                started.elapsed()
            ),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let body = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |at| got.len() - at - 4);
    assert_eq!(
        body,
        20 * MIB,
        "cut off after {:?} ({} bytes in all)",
        started.elapsed(),
        got.len()
    );
    assert!(
        started.elapsed() > Duration::from_secs(2),
        "the read was not slower than the timeout: {:?}",
        started.elapsed()
    );

    // A read, then a 3 s exec on the client's (pooled, kept-alive) connection.
    let mut read = served
        .get(ANA, &format!("/v1/sessions/{id}/files/big"))
        .await;
    while read.chunk().await.unwrap().is_some() {}
    let events = served
        .exec(ANA, &id, json!({"shell": "sleep 3; echo done"}))
        .await
        .rest()
        .await;
    assert!(events.iter().any(|e| e["data"] == "done\n"), "{events:?}");
    assert_eq!(events.last().unwrap()["type"], "exit", "{events:?}");
    served.shutdown.cancel();
}

/// On a server with API keys each tenant holds at most half of the budget of bytes in
/// memory (or one body limit, if that is more): a tenant whose reads stall cannot hold
/// another tenant's reads off. Ana's second 40 MiB read is 429 naming her share while
/// her first is unread, and bob's is served from the other half; a read larger than a
/// tenant's share could never be held: refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_share_of_the_memory_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const MIB: usize = 1024 * 1024;
    let Some(served) = serve_with(ServerConfig {
        max_body_bytes_in_flight: 128 * MIB,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let anas = served
        .open_having_run("head -c 40M /dev/zero > big && head -c 70M /dev/zero > huge && echo made")
        .await;
    let (status, bobs) = served.create(BOB, json!({})).await;
    assert_eq!(status, 201, "{bobs}");
    let bobs = bobs["id"].as_str().unwrap().to_string();
    let made = served
        .exec(
            BOB,
            &bobs,
            json!({"shell": "head -c 40M /dev/zero > big && echo made"}),
        )
        .await
        .rest()
        .await;
    assert!(made.iter().any(|e| e["data"] == "made\n"), "{made:?}");

    // Ana's first read, unread.
    let addr: std::net::SocketAddr = served.base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stalled = socket.connect(addr).await.unwrap();
    let head = format!(
        "GET /v1/sessions/{anas}/files/big HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {ANA}\r\n\r\n"
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    let mut start = [0u8; 300];
    stalled.read_exact(&mut start).await.unwrap();
    assert!(start.starts_with(b"HTTP/1.1 200"));

    let again = served
        .get(ANA, &format!("/v1/sessions/{anas}/files/big"))
        .await;
    assert_eq!(again.status(), 429);
    let error: Value = again.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("tenant ana holds its share"),
        "{error}"
    );
    let mut bobs_read = served
        .get(BOB, &format!("/v1/sessions/{bobs}/files/big"))
        .await;
    assert_eq!(bobs_read.status(), 200, "another tenant was held off");
    let mut got = 0;
    while let Some(chunk) = bobs_read.chunk().await.unwrap() {
        got += chunk.len();
    }
    assert_eq!(got, 40 * MIB);
    let huge = served
        .get(ANA, &format!("/v1/sessions/{anas}/files/huge"))
        .await;
    let error: Value = huge.json().await.unwrap();
    assert_eq!(error["error"]["code"], "resource_exhausted", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("one tenant's half"),
        "{error}"
    );
    drop(stalled);
    served.shutdown.cancel();
}

/// A directory the session's code filled: its listing is held within the budget of
/// bytes in memory, counted before its JSON is made (names of control bytes are six
/// times as long in JSON); one larger than the whole budget, or of more entries than a
/// listing gives, is refused naming the directory, never answered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_listings_are_bounded_and_held_within_the_memory_budget() {
    // Room for more files than a listing gives: 1 GiB of disk holds 65,536 inodes.
    let roomy = skillbox_env::Limits {
        disk_bytes: Some(4 << 30),
        ..skillbox_env::Limits::default()
    };
    let config = ServerConfig {
        max_body_bytes_in_flight: 64 * 1024,
        ..ServerConfig::default()
    };
    let Some(served) = serve_with_limits(config, roomy).await else {
        return;
    };
    let id = served
        .open_having_run("mkdir some full odd && (cd some && seq 1 3000 | xargs touch) && (cd full && seq 1 100001 | xargs touch) && (cd odd && for i in $(seq 1 200); do touch \"$(printf '\\001%.0s' $(seq 1 200))$i\"; done) && echo made")
        .await;
    // 3000 entries are about 120 KB of JSON, and 200 names of 200 control bytes (40 KB
    // on disk) 240 KB: more than the 64 KiB this server holds at once.
    for dir in ["some", "odd"] {
        let refused = served
            .get(ANA, &format!("/v1/sessions/{id}/ls?path={dir}"))
            .await;
        assert_eq!(refused.status(), 422, "{dir}");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["code"], "resource_exhausted", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("/workspace/{dir}"))
                && message.contains("--max-body-bytes-in-flight")
                && message.ends_with("list a directory beneath it"),
            "{error}"
        );
    }
    let full = served
        .get(ANA, &format!("/v1/sessions/{id}/ls?path=full"))
        .await;
    assert_eq!(full.status(), 422);
    let error: Value = full.json().await.unwrap();
    assert_eq!(error["error"]["code"], "resource_exhausted", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("/workspace/full") && message.contains("100000"),
        "{error}"
    );
    // A listing that fits is answered, and its place given back once sent.
    for _ in 0..3 {
        let listing: Value = served
            .get(ANA, &format!("/v1/sessions/{id}/ls"))
            .await
            .json()
            .await
            .unwrap();
        let names: Vec<&str> = listing["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["full", "odd", "some"], "{listing}");
    }
    served.shutdown.cancel();
}

/// A session asked for before the shutdown began, whose body arrives after it (sessions
/// are closed as the shutdown begins), is refused 503, not opened: its sandbox would be
/// made for a server that no longer keeps it, and its client told it is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_not_opened_once_shutdown_began() {
    use tokio::io::AsyncWriteExt;
    // The budget of bodies is one create's: while the stalled create holds it (it is in
    // the handler, reading its body), another request's body is refused 429.
    const BODY: usize = 64 * 1024;
    let Some(served) = serve_with(ServerConfig {
        max_body_bytes_in_flight: BODY,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let body = format!("{{}}{}", " ".repeat(BODY - 2));
    let mut stalled = served
        .stall("POST", "/v1/sessions", "application/json", Some(BODY), b"{")
        .await;
    // A bound on a hang, not a timing: on a loaded 2-core machine the stalled create
    // took more than 10 s to reach its handler.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Not JSON: 400 once read, 429 while the budget is held (before it is read).
        let probe = served
            .http
            .post(format!("{}/v1/sessions", served.base))
            .bearer_auth(BOB)
            .header("content-type", "application/json")
            .body("not json")
            .send()
            .await
            .unwrap();
        let status = probe.status().as_u16();
        if status == 429 {
            break;
        }
        assert_eq!(status, 400);
        assert!(
            Instant::now() < deadline,
            "the stalled create never held the budget"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    served.shutdown.cancel();
    stalled.0.write_all(&body.as_bytes()[1..]).await.unwrap();
    let (status, answer) = stalled.answer(Duration::from_secs(30)).await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
    assert_eq!(
        answer["error"]["message"],
        "the server is shutting down; no session opens now (open one once it is back)",
        "{answer}"
    );
    let stopped = tokio::time::timeout(Duration::from_secs(15), served.serving).await;
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
}
