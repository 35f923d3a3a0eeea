//! The server's doors, attacked for real: who may run code (keys, tenants, the Host
//! header), and HTTP a hostile client cannot tie up (slow headers and bodies, too many
//! connections, bodies held in memory), and downloads a browser cannot be tricked into
//! rendering.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::{AgentModel, AgentRuns, ApiKeys, ServerConfig};
use skillbox_store::ArtifactStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::{Server, is_error, metrics_text, shared_data_dir, start, start_with};

const KEY_A: &str = "tenant-a-token-0123456789";
const KEY_B: &str = "tenant-b-token-9876543210";

fn keys() -> Option<Arc<ApiKeys>> {
    Some(Arc::new(
        ApiKeys::from_pairs(&format!("a={KEY_A},b={KEY_B}")).unwrap(),
    ))
}

fn local() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 0))
}

impl Server {
    fn addr(&self) -> String {
        self.base.trim_start_matches("http://").to_string()
    }

    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> reqwest::Response {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.unwrap()
    }

    async fn run_as(&self, key: &str, script: &str) -> Value {
        self.run_body_as(key, json!({"script": script, "language": "sh"}))
            .await
    }

    /// `POST /v1/run` of `body` as `key`'s tenant: its answer, a 200.
    pub(crate) async fn run_body_as(&self, key: &str, body: Value) -> Value {
        let response = self
            .send(reqwest::Method::POST, "/v1/run", Some(key), Some(&body))
            .await;
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }
}

/// Reads until the server closes the connection (or `bound` passes: then the server
/// kept it open, which the caller asserts against).
async fn read_to_close(stream: &mut TcpStream, bound: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(bound, async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_bind_without_keys_is_refused() {
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let runner = Arc::new(Runner::new(RunnerConfig::new(shared_data_dir()), store));
    let everywhere = || async { tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap() };
    let refused = skillbox_server::serve_on(
        everywhere().await,
        ServerConfig::default(),
        runner.clone(),
        CancellationToken::new(),
    )
    .await
    .expect_err("a non-loopback address without keys is refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(
        refused.to_string().contains("--insecure-no-auth"),
        "{refused}"
    );
    // `serve` refuses before it binds anything.
    let refused = skillbox_server::serve(
        ServerConfig {
            addr: "0.0.0.0:0".parse().unwrap(),
            ..ServerConfig::default()
        },
        runner.clone(),
        CancellationToken::new(),
    )
    .await
    .expect_err("refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::PermissionDenied);
    // With keys, or told to, it serves (until its shutdown fires).
    for config in [
        ServerConfig {
            keys: keys(),
            ..ServerConfig::default()
        },
        ServerConfig {
            insecure_no_auth: true,
            ..ServerConfig::default()
        },
    ] {
        let shutdown = CancellationToken::new();
        let serving = tokio::spawn(skillbox_server::serve_on(
            everywhere().await,
            config,
            runner.clone(),
            shutdown.clone(),
        ));
        tokio::task::yield_now().await;
        shutdown.cancel();
        serving.await.unwrap().expect("serves");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_host_header_is_refused_before_anything_runs() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        allowed_hosts: vec!["Sandbox.Internal".into()],
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let with_host = |host: &str, path: &str| {
        server
            .http
            .post(format!("{}{path}", server.base))
            .header("host", host)
            .json(&json!({"script": "echo ran", "language": "sh"}))
            .send()
    };
    // DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
    for host in [
        "evil.example",
        "evil.example:8080",
        "localhost.evil.example",
    ] {
        let response = with_host(host, "/v1/run").await.unwrap();
        assert_eq!(response.status(), 403, "{host}");
        let json: Value = response.json().await.unwrap();
        assert!(is_error(&json, "permission_denied"), "{json}");
    }
    let metrics = metrics_text(&server).await;
    assert!(
        metrics.contains("skillbox_runs_total{outcome=\"ok\"} 0"),
        "a refused request ran nothing: {metrics}"
    );
    for host in [
        server.addr(),
        "localhost".to_string(),
        "sandbox.internal:80".to_string(),
    ] {
        let response = with_host(&host, "/v1/run").await.unwrap();
        assert_eq!(response.status(), 200, "{host}");
    }
}

/// A web page of another site can make the browser send a simple POST (`text/plain`,
/// no preflight) to a server on loopback without keys, with the server's own Host: the
/// browser's `Origin` gives it away, and every request that could change something is
/// refused by it (a run, a session, a service start) before anything happens. The
/// server's own page (same origin) and clients that send no `Origin` go on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_from_another_sites_page_changes_nothing() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let post = |path: &str, origin: Option<&str>, content_type: &str, body: &str| {
        let mut request = server
            .http
            .post(format!("{}{path}", server.base))
            .header("content-type", content_type)
            .body(body.to_string());
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let run = r#"{"script": "echo ran", "language": "sh"}"#;
    for origin in [
        "http://evil.example",
        "null",
        "https://127.0.0.1.evil.example",
    ] {
        for (path, content_type, body) in [
            ("/v1/run", "application/json", run),
            ("/v1/sessions", "text/plain", "{}"),
            ("/v1/capabilities/anything/start", "text/plain", ""),
        ] {
            let response = post(path, Some(origin), content_type, body).await.unwrap();
            assert_eq!(response.status(), 403, "{origin} {path}");
            let json: Value = response.json().await.unwrap();
            assert!(is_error(&json, "permission_denied"), "{json}");
            assert!(json.to_string().contains("Origin"), "{json}");
        }
    }
    let metrics = metrics_text(&server).await;
    assert!(
        metrics.contains("skillbox_runs_total{outcome=\"ok\"} 0"),
        "a refused request ran nothing: {metrics}"
    );
    let sessions: Value = server
        .http
        .get(format!("{}/v1/sessions", server.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(sessions["sessions"], json!([]), "{sessions}");
    // The server's own page, and a client that sends no Origin.
    let own = format!("http://{}", server.addr());
    for origin in [Some(own.as_str()), None] {
        let response = post("/v1/run", origin, "application/json", run)
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{origin:?}");
    }

    // With keys a page cannot send one (a browser attaches no bearer key by itself): the
    // key decides, whatever the Origin (a proxy that rewrites Host keeps working).
    let Some(keyed) = start(ServerConfig {
        addr: local(),
        keys: keys(),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let response = keyed
        .http
        .post(format!("{}/v1/run", keyed.base))
        .header("origin", "https://skillbox.example")
        .bearer_auth(KEY_A)
        .header("content-type", "application/json")
        .body(run.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_gate_every_route_but_healthz() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        keys: keys(),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let body = json!({"script": "echo ran", "language": "sh"});
    for key in [None, Some("tenant-a-token-012345678"), Some("")] {
        let response = server
            .send(reqwest::Method::POST, "/v1/run", key, Some(&body))
            .await;
        assert_eq!(response.status(), 401, "{key:?}");
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        let json: Value = response.json().await.unwrap();
        assert!(is_error(&json, "unauthenticated"), "{json}");
    }
    for path in ["/metrics", "/openapi.json", "/v1/agent/runs/x"] {
        let response = server.send(reqwest::Method::GET, path, None, None).await;
        assert_eq!(response.status(), 401, "{path}");
    }
    let response = server
        .send(reqwest::Method::GET, "/healthz", None, None)
        .await;
    assert_eq!(response.status(), 200);
    let result = server.run_as(KEY_A, "echo ran").await;
    assert_eq!(result["stdout"], "ran\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_own_runs_and_objects() {
    let data = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(&data.path().join("objects"))
        .await
        .unwrap();
    let agents = AgentRuns::open(
        &skillbox_store::RecordsDb::sqlite(data.path()),
        "test",
        AgentModel::Loopback,
        2,
    )
    .await
    .unwrap();
    let Some(server) = start_with(
        ServerConfig {
            addr: local(),
            keys: keys(),
            agents: Some(agents),
            ..ServerConfig::default()
        },
        store,
        tempfile::tempdir().unwrap(),
    )
    .await
    else {
        return;
    };
    // Bytes no other test makes, so only this run of tenant a can own them.
    let secret = format!("secret of a {:?}", data.path());
    let script = format!("printf '%s' '{secret}' > a.txt");
    let result = server.run_as(KEY_A, &script).await;
    let url = result["files"][0]["url"].as_str().unwrap().to_string();
    let sha = result["files"][0]["sha256"].as_str().unwrap().to_string();
    let fetch =
        |key: &'static str, method: reqwest::Method| server.send(method, &url, Some(key), None);
    let response = fetch(KEY_A, reqwest::Method::GET).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), secret);
    // Tenant b gets exactly the answer for an object that does not exist.
    let theirs = fetch(KEY_B, reqwest::Method::GET).await;
    assert_eq!(theirs.status(), 404);
    let theirs: Value = theirs.json().await.unwrap();
    let nobodys = server
        .send(
            reqwest::Method::GET,
            &format!("/v1/objects/{}", "e".repeat(64)),
            Some(KEY_B),
            None,
        )
        .await;
    assert_eq!(nobodys.status(), 404);
    let nobodys: Value = nobodys.json().await.unwrap();
    assert_eq!(
        theirs["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&sha, "X"),
        nobodys["error"]["message"]
            .as_str()
            .unwrap()
            .replace(&"e".repeat(64), "X")
    );
    assert_eq!(fetch(KEY_B, reqwest::Method::HEAD).await.status(), 404);
    // Once b's own run makes the same bytes, b may read them: it learns nothing new.
    let again = server.run_as(KEY_B, &script).await;
    assert_eq!(again["files"][0]["sha256"], sha.as_str());
    assert_eq!(fetch(KEY_B, reqwest::Method::GET).await.status(), 200);

    // Agent runs: tenant b cannot see tenant a's.
    let created = server
        .send(
            reqwest::Method::POST,
            "/v1/agent/runs",
            Some(KEY_A),
            Some(&json!({"prompt": "a deck about WorkspaceX"})),
        )
        .await;
    assert_eq!(created.status(), 202);
    let id = created.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/v1/agent/runs/{id}");
    let theirs = server
        .send(reqwest::Method::GET, &path, Some(KEY_B), None)
        .await;
    assert_eq!(theirs.status(), 404);
    let record = wait_done_as(&server, &path, KEY_A).await;
    assert_eq!(record["status"], "succeeded", "{record}");
    let deck = record["artifacts"][0]["url"].as_str().unwrap();
    assert_eq!(
        server
            .send(reqwest::Method::GET, deck, Some(KEY_A), None)
            .await
            .status(),
        200
    );
    assert_eq!(
        server
            .send(reqwest::Method::GET, deck, Some(KEY_B), None)
            .await
            .status(),
        404
    );
}

async fn wait_done_as(server: &Server, path: &str, key: &str) -> Value {
    for _ in 0..600 {
        let record: Value = server
            .send(reqwest::Method::GET, path, Some(key), None)
            .await
            .json()
            .await
            .unwrap();
        if record["status"] != "running" {
            return record;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{path} did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_is_dropped_after_the_header_timeout() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        header_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    // Slowloris: headers begun and never finished.
    let mut slow = TcpStream::connect(server.addr()).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        .await
        .unwrap();
    let answer = read_to_close(&mut slow, Duration::from_secs(20))
        .await
        .expect("the server closed the slow connection");
    let text = String::from_utf8_lossy(&answer);
    assert!(!text.contains("200 OK"), "{text}");
    // A connection that sends nothing at all goes the same way.
    let mut idle = TcpStream::connect(server.addr()).await.unwrap();
    assert!(
        read_to_close(&mut idle, Duration::from_secs(20))
            .await
            .is_some()
    );
    // Others are served meanwhile and after.
    let response = server
        .send(reqwest::Method::GET, "/healthz", None, None)
        .await;
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_times_out_and_holds_nothing() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        // Long enough that, on a busy machine, the stalled body still holds its budget
        // when the second head arrives (CI once saw it time out first at 300 ms).
        body_timeout: Duration::from_secs(3),
        max_body_bytes_in_flight: 4 * 1024 * 1024,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    // A client announces 3 MiB and stalls after a few bytes: its budget is taken...
    let head = format!(
        "POST /v1/run HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"scr",
        server.addr(),
        3 * 1024 * 1024
    );
    let big =
        json!({"script": format!("true #{}", "x".repeat(3 * 1024 * 1024 - 40)), "language": "sh"});
    let mut stalled = None;
    for _ in 0..5 {
        let mut conn = TcpStream::connect(server.addr()).await.unwrap();
        conn.write_all(head.as_bytes()).await.unwrap();
        // Time for the server to take the stalled body's budget.
        tokio::time::sleep(Duration::from_millis(300)).await;
        // ... so another 3 MiB body is refused before a byte of it is read (only the
        // head is sent: the refusal comes before the body is read).
        let (status, answer_head, json) = server.head_only("/v1/run", 3 * 1024 * 1024).await;
        if status == 429 {
            assert!(answer_head.contains("retry-after"), "{answer_head}");
            assert!(is_error(&json, "overloaded"), "{json}");
            stalled = Some(conn);
            break;
        }
        // On a busy machine the probe was taken in first (and held the budget until
        // its own body timed out): the stalled one is let go, and the two try again.
        drop(conn);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut stalled = stalled.expect("a second large body was admitted past the budget");
    // The stalled body times out with 504 and gives its budget back.
    let answer = read_to_close(&mut stalled, Duration::from_secs(20))
        .await
        .expect("the stalled request was answered");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 504"), "{text}");
    assert!(text.contains("\"timeout\""), "{text}");
    let response = server
        .send(reqwest::Method::POST, "/v1/run", None, Some(&big))
        .await;
    assert_eq!(response.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_at_once() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        max_connections: 2,
        // All from one peer: the server's bound, not the peer's, is tested here.
        max_connections_per_peer: Some(2),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr()).await.unwrap();
        // A full request proves the connection was taken in, then it stays open.
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr());
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = [0u8; 512];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut third = TcpStream::connect(server.addr()).await.unwrap();
    let answer = read_to_close(&mut third, Duration::from_secs(20))
        .await
        .expect("the connection past the cap was closed");
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    drop(held);
    // The slots come back when those close.
    let mut served = false;
    for _ in 0..100 {
        let fresh = reqwest::Client::new();
        if let Ok(response) = fresh.get(format!("{}/healthz", server.base)).send().await
            && response.status() == 200
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served);
}

/// `GET path` as `key` on a connection of its own, opened from `from` (a loopback
/// address: each is another peer), within 10 s: the status, or `None` when the
/// connection was refused, closed or not answered.
async fn status_from(
    server: &Server,
    from: std::net::Ipv4Addr,
    path: &str,
    key: &str,
) -> Option<u16> {
    let attempt = async {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket.bind((from, 0).into()).ok()?;
        let mut stream = socket.connect(server.addr().parse().ok()?).await.ok()?;
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n",
            server.addr()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        String::from_utf8_lossy(&answer)
            .strip_prefix("HTTP/1.1 ")?
            .get(..3)?
            .parse()
            .ok()
    };
    tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .ok()
        .flatten()
}

/// The attack: with keys and `max_connections 8`, eight sockets with a 1 KiB receive
/// buffer pipeline 200 `GET /ui/app.js` (no key needed) and never read, so the
/// server's writes stall with every connection held. Before, `/healthz` was refused
/// for as long as the attacker kept them (70 s and more, past every timeout). Now every
/// answer has a write deadline: each stalled connection is closed once it took nothing
/// for `write_timeout`, and `/healthz` answers. The per-peer bound is set out of the
/// way (8), so this is the deadline's doing alone. The wait for `/healthz` is bounded
/// at the deadline plus 30 s, generous on a loaded machine: without the deadline it
/// never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_that_take_nothing_are_closed_at_the_write_deadline() {
    let write_timeout = Duration::from_secs(1);
    let Some(server) = start(ServerConfig {
        addr: local(),
        keys: keys(),
        max_connections: 8,
        max_connections_per_peer: Some(8),
        write_timeout,
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let one = format!("GET /ui/app.js HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr());
    let mut attackers = Vec::new();
    for _ in 0..8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(1024).unwrap();
        let mut stream = socket
            .connect(server.addr().parse().unwrap())
            .await
            .unwrap();
        stream.write_all(one.repeat(200).as_bytes()).await.unwrap();
        attackers.push(stream);
    }
    let started = std::time::Instant::now();
    let bound = write_timeout + Duration::from_secs(30);
    loop {
        if status_from(&server, std::net::Ipv4Addr::LOCALHOST, "/healthz", KEY_A).await == Some(200)
        {
            break;
        }
        assert!(
            started.elapsed() < bound,
            "/healthz did not answer within {bound:?} of the attack"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each attacker's connection was closed by the server long before its 200 answers
    // were sent (what the socket still holds is read, then the end).
    let mut got = Vec::new();
    for mut attacker in attackers {
        let read = read_to_close(&mut attacker, Duration::from_secs(30))
            .await
            .expect("the server closed the attacker's connection");
        got.push(read.len());
    }
    // One answer's size, asked once the attackers' places are free.
    let whole = {
        let mut stream = TcpStream::connect(server.addr()).await.unwrap();
        let close = one.replace("\r\n\r\n", "\r\nConnection: close\r\n\r\n");
        stream.write_all(close.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        answer.len()
    };
    assert!(
        got.iter().all(|&n| n < 200 * whole),
        "{got:?} of {}",
        200 * whole
    );
    // The deadline did it. On a loaded machine (CI's builds beside it) one of the eight
    // was once seen to end by another of hyper's errors, not counted here; it was closed
    // all the same, and the assertions above hold for all eight.
    let metrics = metrics_text_as(&server, KEY_A).await;
    assert!(
        metrics.lines().any(|l| l
            .strip_prefix("skillbox_writes_timed_out_total ")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1)),
        "{metrics}"
    );
}

/// `GET /metrics` as `key`.
async fn metrics_text_as(server: &Server, key: &str) -> String {
    server
        .send(reqwest::Method::GET, "/metrics", Some(key), None)
        .await
        .text()
        .await
        .unwrap()
}

/// One peer holds at most `max_connections_per_peer` connections: past it its next is
/// closed at once, while another peer (127.0.0.2) is still served, and a place comes
/// back when one of its connections closes. The default is half of
/// `max_connections`, at most 64.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_hold_every_connection() {
    let config = ServerConfig {
        max_connections: 8,
        ..ServerConfig::default()
    };
    assert_eq!(config.connections_per_peer(), 4);
    assert_eq!(ServerConfig::default().connections_per_peer(), 64);
    let Some(server) = start(ServerConfig {
        addr: local(),
        keys: keys(),
        max_connections: 4,
        max_connections_per_peer: Some(2),
        // Past the reads' bound below: a connection closed within it was refused, not
        // timed out idle.
        header_timeout: Duration::from_secs(60),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(server.addr()).await.unwrap();
        // A full request proves the connection was taken in, then it stays open.
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr());
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut buf = [0u8; 512];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        held.push(stream);
    }
    let mut third = TcpStream::connect(server.addr()).await.unwrap();
    let answer = read_to_close(&mut third, Duration::from_secs(20))
        .await
        .expect("the peer's third connection was closed");
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    let other = std::net::Ipv4Addr::new(127, 0, 0, 2);
    let metrics = status_from(&server, other, "/metrics", KEY_A).await;
    assert_eq!(metrics, Some(200), "another peer is served");
    drop(held);
    let mut served = false;
    for _ in 0..100 {
        if status_from(&server, std::net::Ipv4Addr::LOCALHOST, "/healthz", KEY_A).await == Some(200)
        {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served, "the peer's places came back");
    let metrics = metrics_text_as(&server, KEY_A).await;
    // The third, and any of the polls above that came before the places were back.
    assert!(
        metrics.lines().any(|l| l
            .strip_prefix("skillbox_connections_refused_per_peer_total ")
            .and_then(|n| n.parse::<u64>().ok())
            .is_some_and(|n| n >= 1)),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_are_attachments_of_their_stored_type_with_ranges() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let result = server
        .run_as("", "printf '<script>alert(1)</script>' > note.txt")
        .await;
    let sha = result["files"][0]["sha256"].as_str().unwrap();
    // The query names the file; it cannot make the browser render it as HTML.
    let path = format!("/v1/objects/{sha}?name=page.html");
    let response = server.send(reqwest::Method::GET, &path, None, None).await;
    assert_eq!(response.status(), 200);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/plain");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"page.html\""
    );
    assert_eq!(headers["accept-ranges"], "bytes");
    let ranged = |range: &'static str| {
        server
            .http
            .get(format!("{}{path}", server.base))
            .header("range", range)
            .send()
    };
    let part = ranged("bytes=1-6").await.unwrap();
    assert_eq!(part.status(), 206);
    assert_eq!(part.headers()["content-range"], "bytes 1-6/25");
    assert_eq!(part.text().await.unwrap(), "script");
    let tail = ranged("bytes=-9").await.unwrap();
    assert_eq!(tail.status(), 206);
    assert_eq!(tail.text().await.unwrap(), "</script>");
    let outside = ranged("bytes=25-").await.unwrap();
    assert_eq!(outside.status(), 416);
    assert_eq!(outside.headers()["content-range"], "bytes */25");
    // Several ranges are not read: the whole object, whole.
    let whole = ranged("bytes=0-1,3-4").await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.text().await.unwrap().len(), 25);
}

/// A refusal sent before the body is read says `Connection: close`, so a client does not
/// send its next request on a connection the server is about to close (it would see
/// the connection end with no answer); a refusal of a bodiless request keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_before_the_body_closes_the_connection_and_says_so() {
    let Some(server) = start(ServerConfig {
        addr: local(),
        keys: keys(),
        ..ServerConfig::default()
    })
    .await
    else {
        return;
    };
    let body = r#"{"script":"echo ran","language":"sh"}"#;
    let mut stream = TcpStream::connect(server.addr()).await.unwrap();
    let request = format!(
        "POST /v1/run HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.addr(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let got = read_to_close(&mut stream, Duration::from_secs(10))
        .await
        .expect("the server closes the connection");
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert!(text.starts_with("http/1.1 401"), "{text}");
    assert!(text.contains("\r\nconnection: close\r\n"), "{text}");

    let response = server
        .send(reqwest::Method::GET, "/metrics", None, None)
        .await;
    assert_eq!(response.status(), 401);
    assert!(response.headers().get("connection").is_none());
}

/// Issue 38, row 6: puts never checked `--store-budget`, so one tenant could fill the
/// disk between retention passes (and keep it full). A run whose files would take the
/// store past its budget fails 507 `quota_exceeded`, and nothing of it is kept; a run
/// within it, before, is stored as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_the_store_budget_fails_quota_exceeded_and_keeps_nothing() {
    let objects = tempfile::tempdir().unwrap();
    let objects_dir = objects.path().to_path_buf();
    let store = ArtifactStore::local(objects.path())
        .await
        .unwrap()
        .with_budget(1 << 20)
        .await
        .unwrap();
    let config = ServerConfig {
        addr: local(),
        ..ServerConfig::default()
    };
    let Some(server) = start_with(config, store, objects).await else {
        return;
    };
    let stored = || {
        let mut files = Vec::new();
        let mut pending = vec![objects_dir.clone()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        files
    };
    let within = server
        .run(json!({"language": "sh", "script": "head -c 100000 /dev/urandom > small.bin"}))
        .await;
    assert_eq!(within["files"].as_array().unwrap().len(), 1, "{within}");
    assert_eq!(stored().len(), 1);
    let (status, refused) = server
        .post(
            "/v1/run",
            &json!({"language": "sh", "script":
                "head -c 600000 /dev/urandom > a.bin && head -c 600000 /dev/urandom > b.bin"}),
        )
        .await;
    assert_eq!(status, 507, "{refused}");
    assert_eq!(refused["error"]["code"], "quota_exceeded", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{refused}"
    );
    assert_eq!(stored().len(), 1, "nothing of the refused run is kept");
}
