//! skillbox's MCP server driven by MCP clients that skillbox did not write (DESIGN.md §4
//! `skillbox mcp`, §5.3 `/mcp`): the Python `mcp` package's client (PyPI) over stdio and
//! over streamable HTTP against a real `skillbox serve`, and the MCP Inspector's CLI mode
//! (npm) over stdio. The client scripts are tests/mcp_clients/; scripts/test.sh installs
//! the pinned clients under target/mcp-clients. Without a client a test skips, naming
//! what is missing (a failure under SKILLBOX_REQUIRE_ALL=1).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{BIN, assert_workspacex_deck, example, native_or_skip, skillbox, text};

/// Where scripts/test.sh installs the clients.
fn clients_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("../mcp-clients")
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp_clients")
        .join(name)
}

/// A python3 that imports `mcp`: `$SKILLBOX_MCP_PYTHON`, the venv scripts/test.sh makes,
/// or `python3` itself; otherwise skips.
fn python_with_mcp(test: &str) -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("SKILLBOX_MCP_PYTHON").map(PathBuf::from),
        Some(clients_dir().join("venv/bin/python3")),
        Some(PathBuf::from("python3")),
    ];
    let found = candidates.into_iter().flatten().find(|python| {
        Command::new(python)
            .args(["-c", "import mcp.client.stdio, mcp.client.streamable_http"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if found.is_none() {
        skillbox_env::testkit::skip(
            test,
            "no python3 with the `mcp` package (scripts/test.sh installs the pinned one into \
             target/mcp-clients/venv; or set SKILLBOX_MCP_PYTHON)",
        );
    }
    found
}

/// The directory the MCP Inspector is installed in (its node_modules) when npx is here;
/// otherwise skips.
fn inspector(test: &str) -> Option<PathBuf> {
    let dir = clients_dir().join("inspector");
    let installed = dir.join("node_modules/.bin/mcp-inspector").exists();
    let npx = Command::new("npx")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if installed && npx {
        return Some(dir);
    }
    skillbox_env::testkit::skip(
        test,
        &format!(
            "the MCP Inspector is not installed in {} (scripts/test.sh runs npm ci there from \
             tests/mcp_clients/inspector) or npx is missing",
            dir.display()
        ),
    );
    None
}

/// Waits for `child` for at most `limit`, its piped output collected; killed past it.
fn finish(mut child: Child, limit: Duration, what: &str) -> Output {
    let out = child.stdout.take();
    let err = child.stderr.take();
    let stdout = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut out) = out {
            let _ = out.read_to_end(&mut buf);
        }
        buf
    });
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut err) = err {
            let _ = err.read_to_end(&mut buf);
        }
        buf
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what}: still running after {limit:?}; stderr so far:\n{}",
                text(&stderr.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

fn run_bounded(command: &mut Command, limit: Duration, what: &str) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    finish(child, limit, what)
}

/// A client script's run: it prints `ok` after its last check.
fn assert_client_passed(out: &Output, what: &str) {
    assert!(
        out.status.success() && text(&out.stdout).trim_end().ends_with("ok"),
        "{what} failed ({:?}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// The Python client over stdio: tools listed with their schemas, the pptxgenjs deck made
/// and read back as a resource (a zip with three slides; verified here again),
/// write_file/exec/read_file/list_dir in the session's one sandbox, bad input and a
/// failed run as tool errors, and the sandbox removed when the client closes stdin.
#[test]
fn python_client_over_stdio() {
    let test = "python_client_over_stdio";
    if !native_or_skip(test) {
        return;
    }
    let Some(python) = python_with_mcp(test) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let deck = out.path().join("deck.pptx");
    let ran = run_bounded(
        Command::new(&python)
            .arg(script("over_stdio.py"))
            .arg(BIN)
            .arg(data.path())
            .arg(example("workspacex-deck.js"))
            .arg(&deck),
        Duration::from_secs(600),
        "the Python MCP client over stdio",
    );
    assert_client_passed(&ran, "the Python MCP client over stdio");
    assert_workspacex_deck(&deck);
}

/// A `skillbox serve` with keys for alice and bob, serving examples/capabilities with
/// fmt-json granted; stopped (SIGTERM) when dropped.
struct Serve {
    child: Option<Child>,
    addr: String,
    _data: tempfile::TempDir,
    _project: tempfile::TempDir,
}

const ALICE: &str = "alice-mcp-token-0123456789";
const BOB: &str = "bob-mcp-token-0123456789";

impl Serve {
    fn start() -> Serve {
        Serve::start_with(&[])
    }

    /// With `extra` flags of `serve`.
    fn start_with(extra: &[&str]) -> Serve {
        let data = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let capabilities = example("capabilities");
        let granted = skillbox(
            data.path(),
            &[
                "cap",
                "--project",
                project.path().to_str().unwrap(),
                "--root",
                capabilities.to_str().unwrap(),
                "grant",
                "fmt-json",
            ],
        );
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(BIN)
            .arg("--data-dir")
            .arg(data.path())
            .args(["serve", "--addr", &addr, "--capabilities"])
            .arg(&capabilities)
            .arg("--project")
            .arg(project.path())
            .args(extra)
            .env("SKILLBOX_API_KEYS", format!("alice={ALICE},bob={BOB}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // It installs the Node runtime before it listens.
        let deadline = Instant::now() + Duration::from_secs(300);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "skillbox serve did not start");
            assert!(child.try_wait().unwrap().is_none(), "skillbox serve exited");
            std::thread::sleep(Duration::from_millis(50));
        }
        Serve {
            child: Some(child),
            addr,
            _data: data,
            _project: project,
        }
    }

    /// Stops it with SIGTERM and waits (bounded) for a clean exit.
    fn stop(mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().unwrap();
        // SAFETY: signalling the server this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("skillbox serve did not stop within 60 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Python client over streamable HTTP at /mcp: no key, an unknown key and a foreign
/// Host refused as on every route; alice's session makes the deck (read back as a
/// resource and downloaded at its link with her key), uses its sandbox, runs a granted
/// capability (an ungranted one, a host one and an unknown one are tool errors); bob
/// reads none of it, and cannot use her session; her sandbox is removed when her client
/// ends the session; the server still stops cleanly.
#[test]
fn python_client_over_http() {
    let test = "python_client_over_http";
    if !native_or_skip(test) {
        return;
    }
    let Some(python) = python_with_mcp(test) else {
        return;
    };
    let server = Serve::start();
    let out = tempfile::tempdir().unwrap();
    let deck = out.path().join("deck.pptx");
    let ran = run_bounded(
        Command::new(&python)
            .arg(script("over_http.py"))
            .arg(format!("http://{}", server.addr))
            .args([ALICE, BOB])
            .arg(example("workspacex-deck.js"))
            .arg(&deck),
        Duration::from_secs(600),
        "the Python MCP client over HTTP",
    );
    let status = server.stop();
    assert_client_passed(&ran, "the Python MCP client over HTTP");
    assert_workspacex_deck(&deck);
    assert!(status.success(), "serve did not stop cleanly: {status:?}");
}

/// One `mcp-inspector --cli` call against `skillbox mcp` on stdio (a session of its own).
fn inspect(dir: &Path, data: &Path, args: &[&str]) -> Output {
    run_bounded(
        Command::new("npx")
            .current_dir(dir)
            .args(["--no-install", "--prefix"])
            .arg(dir)
            .args(["mcp-inspector", "--cli", BIN, "--data-dir"])
            .arg(data)
            .arg("mcp")
            .args(args),
        Duration::from_secs(180),
        "mcp-inspector --cli",
    )
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "mcp-inspector failed ({:?}):\n{}\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: not JSON:\n{}", text(&out.stdout)))
}

/// The MCP Inspector's CLI mode (npm) over stdio: tools/list with each tool's schema,
/// tools/call of run_script (a made file with its resource URI) and exec, a bad argument
/// as a tool error, an unknown tool refused naming the tools.
#[test]
fn inspector_cli_over_stdio() {
    let test = "inspector_cli_over_stdio";
    if !native_or_skip(test) {
        return;
    }
    let Some(dir) = inspector(test) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();

    let listed = json_of(&inspect(&dir, data.path(), &["--method", "tools/list"]));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "run_script",
            "exec",
            "read_file",
            "write_file",
            "list_dir",
            "list_skills"
        ]
    );
    let exec = &listed["tools"][1];
    assert_eq!(exec["inputSchema"]["type"], "object", "{exec}");
    assert!(
        exec["inputSchema"]["properties"]["shell"].is_object(),
        "{exec}"
    );

    let ran = json_of(&inspect(
        &dir,
        data.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "run_script",
            "--tool-arg",
            "language=sh",
            "--tool-arg",
            "script=echo made > made.txt; echo hello",
        ],
    ));
    assert_eq!(ran["isError"], false, "{ran}");
    let result = &ran["structuredContent"];
    assert_eq!(result["exitCode"], 0, "{ran}");
    assert_eq!(result["stdout"], "hello\n", "{ran}");
    assert_eq!(result["files"][0]["path"], "made.txt", "{ran}");
    let sha = result["files"][0]["sha256"].as_str().unwrap();
    assert_eq!(
        result["files"][0]["uri"],
        format!("skillbox://objects/{sha}/made.txt")
    );
    assert!(
        ran["content"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "resource_link" && c["name"] == "made.txt"),
        "{ran}"
    );

    let exec = json_of(&inspect(
        &dir,
        data.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "exec",
            "--tool-arg",
            "shell=echo in $(pwd) as $(id -u)",
        ],
    ));
    assert_eq!(exec["isError"], false, "{exec}");
    let stdout = exec["structuredContent"]["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("in /workspace as "), "{exec}");
    assert_ne!(stdout.trim_end(), "in /workspace as 0", "{exec}");

    let bad = json_of(&inspect(
        &dir,
        data.path(),
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "run_script",
            "--tool-arg",
            "language=ruby",
            "--tool-arg",
            "script=puts 1",
        ],
    ));
    assert_eq!(bad["isError"], true, "{bad}");
    let message = bad["content"][0]["text"].as_str().unwrap();
    assert!(
        message.contains("run_script: language: unknown variant `ruby`"),
        "{message}"
    );

    let unknown = inspect(
        &dir,
        data.path(),
        &["--method", "tools/call", "--tool-name", "rm_rf"],
    );
    let said = format!("{}{}", text(&unknown.stdout), text(&unknown.stderr));
    assert!(
        said.contains("no tool \"rm_rf\"; the tools are run_script, exec"),
        "{said}"
    );
}

/// `skillbox mcp` ends on SIGTERM with its sandbox removed, even when its stdin is a
/// socket (as libuv gives a child) whose read nothing can cancel: the client never
/// closes it here. The requests are written by hand: this is the process's lifecycle,
/// not a client's view of MCP.
#[test]
fn mcp_stops_on_sigterm_with_its_sandbox_removed() {
    use std::io::{BufRead, BufReader, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;

    if !native_or_skip("mcp_stops_on_sigterm_with_its_sandbox_removed") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (ours, theirs) = UnixStream::pair().unwrap();
    let child = Command::new(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .arg("mcp")
        .env("SKILLBOX_LOG", "warn,skillbox_mcp=info")
        .stdin(OwnedFd::from(theirs.try_clone().unwrap()))
        .stdout(OwnedFd::from(theirs))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    ours.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut lines = BufReader::new(ours.try_clone().unwrap()).lines();
    let send = |message: Value| {
        let mut line = serde_json::to_vec(&message).unwrap();
        line.push(b'\n');
        (&ours).write_all(&line).unwrap();
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "by-hand", "version": "0"}}}),
    );
    let answer: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        answer["result"]["serverInfo"]["name"], "skillbox",
        "{answer}"
    );
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "exec", "arguments": {"shell": "echo here"}}}),
    );
    let answer: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(
        answer["result"]["structuredContent"]["stdout"], "here\n",
        "{answer}"
    );

    // SAFETY: signalling the process this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = finish(child, Duration::from_secs(30), "skillbox mcp after SIGTERM");
    assert!(
        out.status.success(),
        "{:?}: {}",
        out.status,
        text(&out.stderr)
    );
    let log = text(&out.stderr);
    let removed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("mcp: sandbox removed"))
        .collect();
    assert_eq!(removed.len(), 1, "{log}");
    assert!(removed[0].contains("skillbox is stopping"), "{log}");
}

/// One exchange with `serve`'s `/mcp` ([`common::http`]).
fn http(
    serve: &Serve,
    method: &str,
    headers: &[(&str, &str)],
    body: Option<&Value>,
) -> (u16, Vec<(String, String)>, String) {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    common::http(&serve.addr, method, "/mcp", headers, &body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// An MCP session opened by hand (initialize, then initialized): its id.
fn open_session(serve: &Serve, token: &str) -> String {
    let bearer = format!("Bearer {token}");
    let (status, headers, body) = initialize(serve, token);
    assert_eq!(status, 200, "{body}");
    let session = header(&headers, "mcp-session-id").unwrap().to_string();
    let (status, _, body) = http(
        serve,
        "POST",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        Some(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    );
    assert_eq!(status, 202, "{body}");
    session
}

/// Another tenant that knows an MCP session's id cannot end it (DELETE), open or replay
/// its stream (GET), nor send it a notification (cancelling its calls): rmcp serves
/// these without the handler, so the tenant is checked before rmcp sees the request.
/// The session goes on for its own tenant.
#[test]
fn another_tenant_cannot_end_stream_or_notify_an_mcp_session() {
    if !native_or_skip("another_tenant_cannot_end_stream_or_notify_an_mcp_session") {
        return;
    }
    let serve = Serve::start();
    let session = open_session(&serve, ALICE);
    let (alice, bob) = (format!("Bearer {ALICE}"), format!("Bearer {BOB}"));
    let of = |bearer: &str| -> Vec<(String, String)> {
        [
            ("Authorization", bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", session.as_str()),
            ("MCP-Protocol-Version", "2025-11-25"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
    };
    let send = |bearer: &str, method: &str, body: Option<Value>, extra: &[(&str, &str)]| {
        let mut headers = of(bearer);
        headers.extend(extra.iter().map(|(n, v)| (n.to_string(), v.to_string())));
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        http(&serve, method, &headers, body.as_ref())
    };

    let (status, _, body) = send(&bob, "DELETE", None, &[]);
    assert_eq!(status, 404, "bob ended alice's session: {body}");
    assert!(
        body.contains("no such MCP session for this API key"),
        "{body}"
    );
    for resume in [None, Some("0"), Some("0/0")] {
        let extra: Vec<(&str, &str)> = resume.map(|r| ("Last-Event-ID", r)).into_iter().collect();
        let (status, _, body) = send(&bob, "GET", None, &extra);
        assert_eq!(
            status, 404,
            "bob opened alice's stream ({resume:?}): {body}"
        );
    }
    let cancel = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 2}});
    let (status, _, body) = send(&bob, "POST", Some(cancel), &[]);
    assert_eq!(status, 404, "bob notified alice's session: {body}");

    let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "exec", "arguments": {"shell": "echo still hers"}}});
    let (status, _, body) = send(&alice, "POST", Some(call.clone()), &[]);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""stdout":"still hers\n""#), "{body}");
    let (status, _, body) = send(&alice, "DELETE", None, &[]);
    assert_eq!(status, 202, "{body}");
    let (status, _, body) = send(&alice, "POST", Some(call), &[]);
    assert_eq!(status, 404, "the ended session answered: {body}");
    assert!(serve.stop().success());
}

/// A chunked body (no Content-Length) past the server's body limit (48 MiB) is 413
/// `payload_too_large` on `/mcp`, as on `POST /v1/run`, not a 400.
#[test]
fn a_chunked_mcp_body_past_the_limit_is_413() {
    use std::io::Write;
    if !native_or_skip("a_chunked_mcp_body_past_the_limit_is_413") {
        return;
    }
    let serve = Serve::start();
    let mut stream = std::net::TcpStream::connect(&serve.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        serve.addr
    );
    stream.write_all(head.as_bytes()).unwrap();
    let chunk = vec![b' '; 1 << 20];
    let mut chunked = format!("{:x}\r\n", chunk.len()).into_bytes();
    chunked.extend_from_slice(&chunk);
    chunked.extend_from_slice(b"\r\n");
    // The server may answer once the limit is passed and stop reading.
    for _ in 0..49 {
        if stream.write_all(&chunked).is_err() {
            break;
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains(r#""code":"payload_too_large""#), "{answer}");
    assert!(serve.stop().success());
}

/// An `initialize` by hand: its status, headers and body.
fn initialize(serve: &Serve, token: &str) -> (u16, Vec<(String, String)>, String) {
    let bearer = format!("Bearer {token}");
    http(
        serve,
        "POST",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ],
        Some(
            &serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "by-hand", "version": "0"}}}),
        ),
    )
}

/// `serve`'s `/metrics`, read with alice's key.
fn metrics_text(serve: &Serve) -> String {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(&serve.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {ALICE}\r\nConnection: close\r\n\r\n",
        serve.addr
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// The gauges `/metrics` reads from `/mcp`'s own session table and sandboxes.
fn mcp_gauges(serve: &Serve) -> (String, String) {
    let metrics = metrics_text(serve);
    let value = |name: &str| -> String {
        let lines: Vec<&str> = metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name} ")))
            .collect();
        assert_eq!(lines.len(), 1, "{metrics}");
        assert!(
            metrics.contains(&format!("# TYPE {name} gauge\n")),
            "{metrics}"
        );
        assert!(metrics.contains(&format!("# HELP {name} ")), "{metrics}");
        lines[0][name.len() + 1..].to_string()
    };
    (
        value("skillbox_mcp_sessions_open"),
        value("skillbox_mcp_sandboxes_open"),
    )
}

/// `skillbox_mcp_sessions_open` counts the MCP sessions open at `/mcp`: one after a
/// client's handshake, none once it ends the session (DELETE); opening no sandbox.
#[test]
fn metrics_count_the_mcp_sessions_open() {
    if !native_or_skip("metrics_count_the_mcp_sessions_open") {
        return;
    }
    let serve = Serve::start();
    assert_eq!(mcp_gauges(&serve), ("0".into(), "0".into()));
    let (status, headers, answer) = initialize(&serve, ALICE);
    assert_eq!(status, 200, "{answer}");
    let session = header(&headers, "mcp-session-id").unwrap().to_string();
    assert!(answer.contains("serverInfo"), "{answer}");
    let bearer = format!("Bearer {ALICE}");
    let (status, _, body) = http(
        &serve,
        "POST",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        Some(&serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"})),
    );
    assert_eq!(status, 202, "{body}");
    assert_eq!(mcp_gauges(&serve), ("1".into(), "0".into()));

    let (status, _, body) = http(
        &serve,
        "DELETE",
        &[
            ("Authorization", &bearer),
            ("Mcp-Session-Id", &session),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        None,
    );
    assert_eq!(status, 202, "{body}");
    // rmcp takes the session out of its table from the session's own task.
    let mut gauges = mcp_gauges(&serve);
    for _ in 0..200 {
        if gauges.0 == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
        gauges = mcp_gauges(&serve);
    }
    assert_eq!(gauges, ("0".into(), "0".into()));
    assert!(serve.stop().success());
}

/// `initialize` past a bound on MCP sessions is 429, a JSON-RPC error naming the bound
/// (with `Retry-After`): past a tenant's, while another tenant still opens one; past
/// the server's, whoever asks. A session ended by DELETE gives its place back.
#[test]
fn mcp_sessions_are_bounded_per_tenant_and_per_server() {
    if !native_or_skip("mcp_sessions_are_bounded_per_tenant_and_per_server") {
        return;
    }
    let serve = Serve::start_with(&["--max-mcp-sessions", "3", "--tenant-max-mcp-sessions", "2"]);
    let refused = |token: &str, bound: &str| {
        let (status, headers, body) = initialize(&serve, token);
        assert_eq!(status, 429, "{body}");
        assert_eq!(header(&headers, "retry-after"), Some("5"));
        assert_eq!(header(&headers, "mcp-session-id"), None);
        let error: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["id"], 1, "{body}");
        assert_eq!(error["error"]["data"]["code"], "overloaded", "{body}");
        assert_eq!(error["error"]["message"], bound, "{body}");
    };
    let tenant_bound = "tenant alice has 2 MCP sessions open, as many as one tenant may; end one (DELETE /mcp) first";
    let server_bound = "3 MCP sessions are open on this server, as many as it takes; end one (DELETE /mcp) or retry later";

    let first = open_session(&serve, ALICE);
    open_session(&serve, ALICE);
    refused(ALICE, tenant_bound);
    open_session(&serve, BOB);
    refused(BOB, server_bound);
    refused(ALICE, server_bound);

    let bearer = format!("Bearer {ALICE}");
    let (status, _, body) = http(
        &serve,
        "DELETE",
        &[
            ("Authorization", &bearer),
            ("Mcp-Session-Id", &first),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        None,
    );
    assert_eq!(status, 202, "{body}");
    open_session(&serve, BOB);
    refused(ALICE, server_bound);
    assert!(serve.stop().success());
}

/// One `tools/call` of `name` in alice's MCP `session`, by hand: the JSON-RPC result.
/// Each call has an id of its own (calls may overlap).
fn call_tool(serve: &Serve, session: &str, name: &str, arguments: Value) -> Value {
    static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(100);
    let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let bearer = format!("Bearer {ALICE}");
    let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": name, "arguments": arguments}});
    let (status, _, body) = http(
        serve,
        "POST",
        &[
            ("Authorization", &bearer),
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", session),
            ("MCP-Protocol-Version", "2025-11-25"),
        ],
        Some(&call),
    );
    assert_eq!(status, 200, "{name}: {body:.500}");
    let answer = body
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|message| message["id"] == id)
        .unwrap_or_else(|| panic!("{name}: no answer in {body:.500}"));
    answer["result"].clone()
}

/// The message of a tool error (`isError`), or `None` for a result.
fn tool_error(result: &Value) -> Option<String> {
    (result["isError"] == true).then(|| result["content"][0]["text"].as_str().unwrap().into())
}

/// `read_file` hands out at most 16 MiB, held by the read itself: a file one byte past
/// the cap is a tool error naming its size and what to do instead, one at the cap is
/// read whole, and a file swapped for a 20 MB one between `read_file`'s look at it and
/// its read (an exec renames the two over each other while `read_file` is called again
/// and again) is refused by the read (bounded by the size looked at, which the answer's
/// memory is held for), never handed out, whole or cut.
#[test]
fn mcp_read_file_hands_out_at_most_its_cap() {
    if !native_or_skip("mcp_read_file_hands_out_at_most_its_cap") {
        return;
    }
    const CAP: usize = 16 * 1024 * 1024;
    let serve = Serve::start();
    let session = open_session(&serve, ALICE);
    let made = call_tool(
        &serve,
        &session,
        "exec",
        serde_json::json!({"shell": format!(
            "head -c {over} /dev/zero > over && head -c {CAP} /dev/zero | tr '\\0' a > at && \
             head -c 100 /dev/zero | tr '\\0' s > small && head -c 20000000 /dev/zero > big && \
             cp small grow && echo made",
            over = CAP + 1
        )}),
    );
    assert_eq!(made["structuredContent"]["stdout"], "made\n", "{made}");

    let over = call_tool(
        &serve,
        &session,
        "read_file",
        serde_json::json!({"path": "over"}),
    );
    assert_eq!(
        tool_error(&over).as_deref(),
        Some(
            "read_file failed (resource_exhausted): /workspace/over: 16777217 bytes, more than \
             the 16777216 a read hands out; list a directory with list_dir, \
             read a part with exec (head -c, tail -c)"
        ),
        "{over:.500}"
    );
    let at = call_tool(
        &serve,
        &session,
        "read_file",
        serde_json::json!({"path": "at"}),
    );
    assert_eq!(tool_error(&at), None, "{at:.500}");
    assert_eq!(at["structuredContent"]["size"], CAP);
    assert_eq!(
        at["structuredContent"]["content"].as_str().unwrap().len(),
        CAP
    );

    // The swapper: each rename is atomic, so `grow` is always one of the two files.
    let (small, by_look, by_read) = std::thread::scope(|scope| {
        let swapper = scope.spawn(|| {
            call_tool(
                &serve,
                &session,
                "exec",
                serde_json::json!({"shell":
                    "end=$(($(date +%s) + 40)); \
                     while [ ! -e stop ] && [ $(date +%s) -lt $end ]; do \
                       ln -f small s && mv s grow && ln -f big b && mv b grow; done; echo swapped",
                    "timeoutMs": 50000}),
            )
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let (mut small, mut by_look, mut by_read) = (0, 0, 0);
        while by_read == 0 && Instant::now() < deadline {
            let read = call_tool(
                &serve,
                &session,
                "read_file",
                serde_json::json!({"path": "grow"}),
            );
            match tool_error(&read) {
                None => {
                    assert_eq!(read["structuredContent"]["size"], 100, "{read:.500}");
                    small += 1;
                }
                Some(e)
                    if e.contains("20000000 bytes, more than the 16777216 a read hands out") =>
                {
                    by_look += 1
                }
                Some(e) => {
                    assert_eq!(
                        e,
                        "read_file failed (resource_exhausted): /workspace/grow: grew past the \
                         100 bytes it had when read_file looked at it (it hands out at most \
                         16777216); call read_file again, or read a part with exec (head -c, tail -c)"
                    );
                    by_read += 1;
                }
            }
        }
        let stop = call_tool(
            &serve,
            &session,
            "write_file",
            serde_json::json!({"path": "stop", "content": ""}),
        );
        assert_eq!(tool_error(&stop), None, "{stop}");
        let swapped = swapper.join().unwrap();
        assert_eq!(
            swapped["structuredContent"]["stdout"], "swapped\n",
            "{swapped}"
        );
        (small, by_look, by_read)
    });
    eprintln!(
        "read_file of the swapped file: {small} small, {by_look} refused by the look, {by_read} by the read"
    );
    assert!(
        by_read > 0,
        "the swap never came between read_file's look and its read ({small} small, {by_look} refused by the look)"
    );
    assert!(serve.stop().success());
}

/// Sends one request (`method`, `params`, JSON-RPC id `id`) in alice's MCP `session`,
/// by hand, and reads nothing of its answer: the stream to read it from.
fn start_request(
    serve: &Serve,
    session: &str,
    id: u64,
    method: &str,
    params: Value,
) -> std::net::TcpStream {
    use std::io::Write;
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        .to_string();
    let mut stream = std::net::TcpStream::connect(&serve.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n\
         Authorization: Bearer {ALICE}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nMcp-Session-Id: {session}\r\n\
         MCP-Protocol-Version: 2025-11-25\r\n\r\n{body}",
        serve.addr,
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    stream
}

/// Reads `stream` into `got` until `done` holds of what was read, or the stream ends.
fn read_until(stream: &mut std::net::TcpStream, got: &mut Vec<u8>, done: impl Fn(&[u8]) -> bool) {
    let mut chunk = vec![0u8; 64 * 1024];
    while !done(got) {
        match stream.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) => panic!("reading an answer: {e} (read {} bytes)", got.len()),
        }
    }
}

/// The JSON-RPC answer to request `id` in a whole SSE stream.
fn answer_of(stream: &[u8], id: u64) -> Value {
    let stream = text(stream);
    stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|message| message["id"] == id)
        .unwrap_or_else(|| panic!("no answer to {id} in {stream:.500}"))
}

/// The resident memory of process `pid` (`VmRSS`, or its peak: `VmHWM`), in bytes.
fn memory_of(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Makes `requests` one after another, each answer's start read but no more (an answer
/// is made whole before its first byte is sent, so one handed out is held whole in the
/// server while its client reads no more, and the requests after it find it still
/// held); one handed out carries text starting `aaaa`. Then reads the rest of every
/// answer. The ids handed out, the answers, and how much the server's peak memory grew
/// while none was read.
fn hand_out_in_turn(
    serve: &Serve,
    requests: &[(&str, &str, Value)],
) -> (Vec<u64>, Vec<Value>, u64) {
    let pid = serve.child.as_ref().unwrap().id();
    // The server's peak from now on (`5` resets VmHWM to the present VmRSS).
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
    let before = memory_of(pid, "VmRSS:");
    let (mut streams, mut handed) = (Vec::new(), Vec::new());
    for (n, (session, method, params)) in requests.iter().enumerate() {
        let id = 9000 + n as u64;
        let mut stream = start_request(serve, session, id, method, params.clone());
        let mut got = Vec::new();
        let result = format!(r#""id":{id},"result":"#);
        let error = format!(r#""id":{id},"error":"#);
        let text_at = |got: &[u8]| -> Option<usize> {
            let got = String::from_utf8_lossy(got);
            let at = got.find(&result)?;
            got[at..]
                .find(r#""text":""#)
                .map(|t| at + t + r#""text":""#.len())
        };
        read_until(&mut stream, &mut got, |g| {
            text_at(g).is_some_and(|at| g.len() >= at + 16)
                || String::from_utf8_lossy(g).contains(&error)
        });
        if text_at(&got).is_some_and(|at| got[at..].starts_with(b"aaaaaaaaaaaaaaaa")) {
            handed.push(id);
        }
        streams.push((id, stream, got));
    }
    let grown = memory_of(pid, "VmHWM:").saturating_sub(before);
    let answers = streams
        .into_iter()
        .map(|(id, mut stream, mut got)| {
            read_until(&mut stream, &mut got, |_| false);
            answer_of(&got, id)
        })
        .collect();
    (handed, answers, grown)
}

const MIB: u64 = 1024 * 1024;

/// How much the server's peak memory may grow while one answer is held within a
/// tenant's 64 MiB (half of a 128 MiB budget): the budget counts the bytes live at once,
/// and the allocator keeps pages one copy of the answer freed while the next is made (in
/// another thread's arena), so the peak passes the hold by a copy or two; six answers
/// at once are hundreds of MiB.
const HELD_AT_MOST: u64 = 160 * MIB;

/// A `read_file` answer stays in the server's memory until it is sent, so it is held
/// in the budget of bytes in memory that request bodies and session file reads are
/// (`--max-body-bytes-in-flight`): six calls, one after another, to read a 15 MiB
/// file, whose clients read only the start of the answer, make the server hold one
/// answer (as much as four copies of the file: the content twice in the result, then
/// twice in the JSON sent) within its tenant's 64 MiB (half of the 128 MiB), the calls
/// after it refused with a tool error that names the flag while that answer is unread;
/// not six answers at once.
/// Once the held answer is read, the next call is answered.
#[test]
fn mcp_read_file_answers_are_held_within_the_memory_budget() {
    if !native_or_skip("mcp_read_file_answers_are_held_within_the_memory_budget") {
        return;
    }
    let serve = Serve::start_with(&["--max-body-bytes-in-flight", "128M"]);
    // Two sessions (a sandbox runs four calls at once), each with the file.
    let sessions = [open_session(&serve, ALICE), open_session(&serve, ALICE)];
    for session in &sessions {
        let made = call_tool(
            &serve,
            session,
            "exec",
            serde_json::json!({"shell": "head -c 15M /dev/zero | tr '\\0' a > big && echo made"}),
        );
        assert_eq!(made["structuredContent"]["stdout"], "made\n", "{made}");
    }
    let read = serde_json::json!({"name": "read_file", "arguments": {"path": "big"}});
    let requests: Vec<_> = (0..6)
        .map(|n| (sessions[n % 2].as_str(), "tools/call", read.clone()))
        .collect();
    let (handed, answers, grown) = hand_out_in_turn(&serve, &requests);
    eprintln!(
        "6 read_file calls of 15 MiB: {} handed out at once, the server's peak memory grew {} MiB",
        handed.len(),
        grown / MIB
    );
    assert!(
        grown < HELD_AT_MOST,
        "read_file answers of 15 MiB held {} MiB at once ({} handed out)",
        grown / MIB,
        handed.len()
    );
    assert_eq!(handed.len(), 1, "{handed:?}");
    for answer in &answers {
        let result = &answer["result"];
        if handed.contains(&answer["id"].as_u64().unwrap()) {
            assert_eq!(tool_error(result), None);
            assert_eq!(result["structuredContent"]["size"], 15 * MIB);
        } else {
            let message = tool_error(result).unwrap();
            assert!(
                message.starts_with("read_file failed (overloaded): /workspace/big: ")
                    && message.contains("--max-body-bytes-in-flight")
                    && message
                        .ends_with("retry later, or read a part with exec (head -c, tail -c)"),
                "{message}"
            );
        }
    }
    // The answers read, their place in the budget is free again (given back as the
    // server drops the last of their bytes, just after it sends them).
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        let again = call_tool(
            &serve,
            &sessions[0],
            "read_file",
            serde_json::json!({"path": "big"}),
        );
        match tool_error(&again) {
            Some(e) if e.contains("(overloaded)") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => break again,
        }
    };
    assert_eq!(tool_error(&again), None, "{again:.500}");
    assert_eq!(again["structuredContent"]["size"], 15 * MIB);
    assert!(serve.stop().success());
}

/// A client that stops reading a `read_file` answer holds its place in the budget only
/// until the body timeout: then the server closes its connection and gives the place
/// back, and the next read is answered (it was refused, overloaded, meanwhile).
#[test]
fn mcp_a_client_that_stops_reading_holds_the_budget_only_until_the_body_timeout() {
    use std::io::Read;
    if !native_or_skip("mcp_a_client_that_stops_reading_holds_the_budget") {
        return;
    }
    let serve = Serve::start_with(&["--max-body-bytes-in-flight", "128M", "--body-timeout", "3s"]);
    let session = open_session(&serve, ALICE);
    let made = call_tool(
        &serve,
        &session,
        "exec",
        serde_json::json!({"shell": "head -c 15M /dev/zero | tr '\\0' a > big && echo made"}),
    );
    assert_eq!(made["structuredContent"]["stdout"], "made\n", "{made}");
    let read = serde_json::json!({"name": "read_file", "arguments": {"path": "big"}});
    let mut stalled = start_request(&serve, &session, 9100, "tools/call", read);
    let mut got = Vec::new();
    read_until(&mut stalled, &mut got, |g| g.len() >= 4096);
    let stalled_at = Instant::now();
    let held = call_tool(
        &serve,
        &session,
        "read_file",
        serde_json::json!({"path": "big"}),
    );
    assert!(
        tool_error(&held).is_some_and(|e| e.contains("(overloaded)")),
        "the first answer was not held: {held:.300}"
    );
    let answered = loop {
        let again = call_tool(
            &serve,
            &session,
            "read_file",
            serde_json::json!({"path": "big"}),
        );
        match tool_error(&again) {
            Some(e) if e.contains("(overloaded)") => {
                assert!(
                    stalled_at.elapsed() < Duration::from_secs(30),
                    "a stalled reader still holds the budget after {:?}",
                    stalled_at.elapsed()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
            _ => break again,
        }
    };
    assert_eq!(tool_error(&answered), None, "{answered:.300}");
    assert_eq!(answered["structuredContent"]["size"], 15 * MIB);
    assert!(
        stalled_at.elapsed() >= Duration::from_secs(2),
        "the hold went before the body timeout: {:?}",
        stalled_at.elapsed()
    );
    // The stalled connection was closed: reading it ends (EOF or a reset) short of the
    // whole answer.
    stalled
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut chunk = vec![0u8; 64 * 1024];
    let ended = loop {
        match stalled.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                break false;
            }
            Err(_) => break true,
        }
    };
    assert!(ended, "the stalled connection is still open");
    assert!(
        got.len() < 15 * MIB as usize,
        "{} bytes of the answer came",
        got.len()
    );
    assert!(serve.stop().success());
}

/// A `list_dir` answer is held in the same budget: a directory of 60,000 files with
/// names of 250 characters (an answer of about 80 MiB as made and sent) is more than
/// all a tenant may hold (half of 128 MiB): refused with a tool error that names the flag and what to do
/// instead, not made; a small one is listed.
#[test]
fn mcp_list_dir_answers_are_held_within_the_memory_budget() {
    if !native_or_skip("mcp_list_dir_answers_are_held_within_the_memory_budget") {
        return;
    }
    // Room for the files: 1 GiB of disk holds 65,536 inodes.
    let serve = Serve::start_with(&["--max-body-bytes-in-flight", "128M", "--disk", "4G"]);
    let session = open_session(&serve, ALICE);
    let made = call_tool(
        &serve,
        &session,
        "exec",
        serde_json::json!({"shell": "mkdir many && cd many && seq -f '%0250g' 1 60000 | xargs touch && echo made"}),
    );
    assert_eq!(
        made["structuredContent"]["stdout"], "made\n",
        "{made:.2000}"
    );
    let listed = call_tool(
        &serve,
        &session,
        "list_dir",
        serde_json::json!({"path": "many"}),
    );
    let message = tool_error(&listed).unwrap_or_else(|| panic!("answered: {listed:.500}"));
    assert!(
        message.starts_with(
            "list_dir failed (resource_exhausted): /workspace/many: its answer holds "
        ) && message.contains(
            "more than one tenant's half of the 134217728 this server holds at once (--max-body-bytes-in-flight)"
        ) && message.ends_with("list a directory beneath it"),
        "{message}"
    );
    let listed = call_tool(&serve, &session, "list_dir", serde_json::json!({}));
    assert_eq!(tool_error(&listed), None, "{listed:.500}");
    assert_eq!(
        listed["structuredContent"]["entries"][0]["name"], "many",
        "{listed:.500}"
    );
    assert!(serve.stop().success());
}

/// `resources/read` of a made file is held in the same budget until its answer is
/// sent: of six reads of a 30 MiB text file in turn, whose clients read only the start
/// of the answer, one is handed out within the tenant's 64 MiB (half of the budget), the others are refused
/// (a JSON-RPC error naming the flag and the download link) while it is unread.
#[test]
fn mcp_resource_reads_are_held_within_the_memory_budget() {
    if !native_or_skip("mcp_resource_reads_are_held_within_the_memory_budget") {
        return;
    }
    let serve = Serve::start_with(&["--max-body-bytes-in-flight", "128M"]);
    let session = open_session(&serve, ALICE);
    let ran = call_tool(
        &serve,
        &session,
        "run_script",
        serde_json::json!({"language": "sh",
            "script": "head -c 30M /dev/zero | tr '\\0' a > big.txt"}),
    );
    let file = &ran["structuredContent"]["files"][0];
    assert_eq!(file["path"], "big.txt", "{ran:.500}");
    let (uri, sha) = (
        file["uri"].as_str().unwrap(),
        file["sha256"].as_str().unwrap(),
    );
    let requests: Vec<_> = (0..6)
        .map(|_| {
            (
                session.as_str(),
                "resources/read",
                serde_json::json!({"uri": uri}),
            )
        })
        .collect();
    let (handed, answers, grown) = hand_out_in_turn(&serve, &requests);
    eprintln!(
        "6 resources/read of 30 MiB: {} handed out at once, the server's peak memory grew {} MiB",
        handed.len(),
        grown / MIB
    );
    assert!(
        grown < HELD_AT_MOST,
        "resource answers of 30 MiB held {} MiB at once ({} handed out)",
        grown / MIB,
        handed.len()
    );
    assert_eq!(handed.len(), 1, "{handed:?}");
    for answer in &answers {
        if handed.contains(&answer["id"].as_u64().unwrap()) {
            let text = answer["result"]["contents"][0]["text"].as_str().unwrap();
            assert_eq!(text.len() as u64, 30 * MIB);
        } else {
            assert_eq!(answer["error"]["data"]["code"], "overloaded", "{answer}");
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with(&format!("{uri}: "))
                    && message.contains("--max-body-bytes-in-flight")
                    && message
                        .ends_with(&format!("retry later, or download it at /v1/objects/{sha}")),
                "{message}"
            );
        }
    }
    assert!(serve.stop().success());
}
