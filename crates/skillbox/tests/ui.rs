//! The web UI (DESIGN.md §5.3, the UI) in a real browser: Debian's chromium driven by
//! Python Playwright (PyPI), against a real `skillbox serve` with a fresh data dir, a
//! free loopback port and a key from `skillbox keys new`. The browser script is
//! tests/ui_browser/check_ui.py; scripts/test.sh installs the pinned Playwright under
//! target/ui-browser (never its own browser download). Without Playwright or chromium
//! the test skips, naming what is missing (a failure under SKILLBOX_REQUIRE_ALL=1).
//!
//! Screenshots of each page go to `$SKILLBOX_UI_SCREENSHOTS`, else target/ui-screenshots;
//! `SKILLBOX_UI_SCREENSHOTS=$PWD/docs/ui` refreshes the ones the README shows.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{BIN, assert_workspacex_deck, native_or_skip, text};

const TEST: &str = "the_ui_starts_a_run_shows_its_attempts_and_slides_and_downloads_the_deck";

/// A python3 that imports playwright: `$SKILLBOX_UI_PYTHON`, the venv scripts/test.sh
/// makes, or `python3` itself.
fn python_with_playwright() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../ui-browser/venv/bin/python3");
    [
        std::env::var_os("SKILLBOX_UI_PYTHON").map(PathBuf::from),
        Some(venv),
        Some(PathBuf::from("python3")),
    ]
    .into_iter()
    .flatten()
    .find(|python| {
        Command::new(python)
            .args(["-c", "import playwright.sync_api"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Debian's chromium (`$SKILLBOX_CHROMIUM`, else on PATH).
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("SKILLBOX_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    on_path("chromium")
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// `skillbox serve` on a free port, stopped when dropped.
struct Serve {
    child: Child,
    addr: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `keys`, a server that needs them; without, a loopback server that needs none.
fn serve(data: &Path, keys: Option<&Path>, transcript: Option<&Path>) -> Serve {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = Command::new(BIN)
        .arg("--data-dir")
        .arg(data)
        .args(["serve", "--addr", &addr])
        .args(
            keys.map(|k| [Path::new("--api-keys"), k])
                .into_iter()
                .flatten(),
        )
        .args(
            transcript
                .map(|t| [Path::new("--transcript"), t])
                .into_iter()
                .flatten(),
        )
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
    Serve { child, addr }
}

/// The pptx skill's recorded session, its second script made to wait 3 s first.
fn slow_demo() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/pptx/loopback.json");
    let mut demo: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let script = &mut demo["turns"][1]["toolCalls"][0]["arguments"]["script"];
    let held = format!(
        "Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 3000);\n{}",
        script.as_str().expect("the second turn runs a script")
    );
    *script = serde_json::Value::String(held);
    demo.to_string()
}

#[test]
fn the_ui_starts_a_run_shows_its_attempts_and_slides_and_downloads_the_deck() {
    if !native_or_skip(TEST) {
        return;
    }
    let Some(python) = python_with_playwright() else {
        skillbox_env::testkit::skip(
            TEST,
            "no python3 with `playwright` (scripts/test.sh installs the pinned one into \
             target/ui-browser/venv; or set SKILLBOX_UI_PYTHON)",
        );
        return;
    };
    let Some(chromium) = chromium() else {
        skillbox_env::testkit::skip(
            TEST,
            "no chromium on PATH (apt-get install chromium; or set SKILLBOX_CHROMIUM)",
        );
        return;
    };
    // PNG previews where LibreOffice and pdftoppm are installed, else outlines: the
    // server decides by the same look at PATH.
    let (png, why) = skillbox_server::preview_report();
    let expected = if png { "png" } else { "outline" };
    if !png {
        eprintln!("{TEST}: previews will be outlines: {why}");
    }

    let data = tempfile::tempdir().unwrap();
    let keys = data.path().join("api-keys");
    let made = Command::new(BIN)
        .args(["keys", "new", "alice", "--file"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let key = text(&made.stdout).trim().to_string();
    let server = serve(&data.path().join("data"), Some(&keys), None);
    // A loopback server without keys, replaying the demo with its second script held
    // for 3 s, so the page shows the first attempt while the run still goes.
    let slow = data.path().join("slow-demo.json");
    std::fs::write(&slow, slow_demo()).unwrap();
    let keyless = serve(&data.path().join("keyless"), None, Some(&slow));

    let shots = std::env::var_os("SKILLBOX_UI_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("../ui-screenshots"));
    let downloads = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui_browser/check_ui.py");
    let mut child = Command::new(&python)
        .arg(&script)
        .arg(format!("http://{}", server.addr))
        .arg(&key)
        .arg(&chromium)
        .arg(&shots)
        .arg(downloads.path())
        .arg(expected)
        .arg(format!("http://{}", keyless.addr))
        // Playwright's own browsers are never fetched: the test drives Debian's.
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let err = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the browser test ran past 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (out, err) = (text(&out.join().unwrap()), text(&err.join().unwrap()));
    assert!(
        status.success() && out.trim_end().ends_with("ok"),
        "the browser test failed ({status:?}):\nstdout:\n{out}\nstderr:\n{err}"
    );
    // The deck the browser downloaded, verified here again by skillbox's own reader.
    assert_workspacex_deck(&downloads.path().join("workspacex.pptx"));
    for page in ["login", "new-run", "run", "run-narrow", "runs"] {
        let shot = shots.join(format!("{page}.png"));
        let bytes = std::fs::read(&shot).unwrap_or_else(|e| panic!("{}: {e}", shot.display()));
        assert!(
            bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
            "{}",
            shot.display()
        );
    }
}
