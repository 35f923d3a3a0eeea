//! Helpers shared by the binary's test files.

#![allow(dead_code, reason = "each test file uses its own subset")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_skillbox");

/// Runs the real binary on `data` with `args`.
pub fn skillbox(data: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .output()
        .expect("run skillbox")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Starts `skillbox serve` on a free loopback port with `extra` flags; `skillbox` names
/// the binary and its data dir. Returns once it accepts connections.
pub fn start_serve(mut skillbox: Command, extra: &[&str]) -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut server = skillbox
        .args(["serve", "--addr", &addr])
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "skillbox serve did not start"
        );
        assert!(
            server.try_wait().unwrap().is_none(),
            "skillbox serve exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (server, addr)
}

/// One HTTP/1.1 exchange with a server at `addr` on a connection of its own: the
/// status, the headers (names lowercase) and the body as text (an SSE answer's `data:`
/// lines whole).
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = text(&answer);
    let (head, rest) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {answer:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let body = if chunked {
        unchunk(rest)
    } else {
        rest.to_string()
    };
    (status, headers, body)
}

/// A chunked body's chunks, joined.
fn unchunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        if after.len() < size {
            // A read cut short (a stream still open at the timeout): what came.
            body.push_str(after);
            break;
        }
        body.push_str(&after[..size]);
        rest = after[size..].strip_prefix("\r\n").unwrap_or(&after[size..]);
    }
    body
}

/// A server a test started, stopped (SIGTERM, and waited for) however the test ends.
pub struct Serving(pub std::process::Child);

impl Serving {
    /// Stops it now (SIGTERM) and says how it ended.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate().expect("wait for skillbox serve")
    }

    fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: signalling the server this test started.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        self.0.wait().ok()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.terminate();
        }
    }
}

/// A script from `examples/`.
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// The deck `examples/workspacex-deck.js` makes, checked by parsing it.
pub fn assert_workspacex_deck(path: &Path) {
    let deck = skillbox_pptx::verify_file(path).expect("a real pptx");
    assert_eq!(deck.slide_count(), 3);
    assert!(deck.contains(1, "WorkspaceX"), "{}", deck.text_of(1));
    assert!(
        deck.contains(2, "Pay only for the days you use"),
        "{}",
        deck.text_of(2)
    );
    assert!(
        deck.contains(3, "hello@workspacex.example"),
        "{}",
        deck.text_of(3)
    );
}

/// True when the native sandbox works here; otherwise skips (or fails under
/// SKILLBOX_REQUIRE_ALL=1) with the probe's reason.
pub fn native_or_skip(test: &str) -> bool {
    let report = skillbox_native::probe();
    if !report.available {
        skillbox_env::testkit::skip(test, &report.reason.unwrap_or_default());
    }
    report.available
}

/// The wasm guests and compile cache the tests share: `$SKILLBOX_WASM_HOME`
/// (scripts/test.sh installs the guests there), else one under target/.
pub fn wasm_home() -> PathBuf {
    std::env::var_os("SKILLBOX_WASM_HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_TARGET_TMPDIR")).join("../wasm-home"),
            PathBuf::from,
        )
}

/// True when the wasm guests (python3 and node) are installed in [`wasm_home`];
/// otherwise skips (or fails under SKILLBOX_REQUIRE_ALL=1).
pub fn wasm_guests_or_skip(test: &str) -> bool {
    let guests = skillbox_wasm::guests::Guests::load(&wasm_home().join("guests"));
    let installed = guests.as_ref().map(|g| g.commands()).unwrap_or_default();
    let ok = installed.contains(&"python3") && installed.contains(&"node");
    if !ok {
        skillbox_env::testkit::skip(
            test,
            &format!(
                "the wasm guests are not installed in {}/guests (scripts/wasm-guests.sh installs them)",
                wasm_home().display()
            ),
        );
    }
    ok && native_or_skip(test)
}

/// True when `doctor` says `backend` works here; otherwise skips (or fails under
/// SKILLBOX_REQUIRE_ALL=1) with doctor's reason.
pub fn backend_or_skip(backend: &str, test: &str) -> bool {
    let data = tempfile::tempdir().expect("a temp dir");
    let out = skillbox(data.path(), &["doctor", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor's JSON");
    let entry = json["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == backend).cloned())
        .unwrap_or_default();
    if entry["available"] == true {
        return true;
    }
    skillbox_env::testkit::skip(test, entry["reason"].as_str().unwrap_or("unavailable"));
    false
}
