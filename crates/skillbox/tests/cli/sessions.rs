//! `skillbox session …` and `skillbox exec --session` as the real binary against a real
//! `skillbox serve`: output streamed while the command runs, exit statuses passed
//! through, files in and out, Ctrl-C cancelling through the server, clear errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::common::{BIN, native_or_skip, text};
use super::start_serve;

/// The binary as a client of the server at `url` (no key, a data dir of its own).
fn client(data: &Path, url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("SKILLBOX_URL", url)
        .env_remove("SKILLBOX_API_KEY");
    command
}

fn output(data: &Path, url: &str, args: &[&str]) -> Output {
    client(data, url, args).output().unwrap()
}

fn stop(mut server: Child) {
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    server.wait().unwrap();
}

/// The lines `reader` yields, on a channel, so a test can wait for one with a bound.
fn lines_of(reader: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for `child` to exit, at most `within`.
fn wait_for(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "still running after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn assert_status(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: stdout {:?} stderr {:?}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn session_commands_drive_one_sandbox_through_serve() {
    if !native_or_skip("session_commands_drive_one_sandbox_through_serve") {
        return;
    }
    let (server, addr) = start_serve(&[]);
    let url = format!("http://{addr}");
    let data = tempfile::tempdir().unwrap();
    let local = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| output(data.path(), &url, args);

    let created = run(&["session", "create"]);
    assert_status(&created, 0, "create");
    let id = text(&created.stdout).trim().to_string();
    assert!(id.starts_with("ses_"), "{id:?}");
    let listed = run(&["session", "list"]);
    assert!(
        text(&listed.stdout).contains(&id),
        "{}",
        text(&listed.stdout)
    );
    let listed: Value =
        serde_json::from_slice(&run(&["session", "list", "--json"]).stdout).unwrap();
    assert!(
        listed["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == id.as_str())
    );
    let shown = run(&["session", "show", &id]);
    assert!(
        text(&shown.stdout).contains("backend: native"),
        "{}",
        text(&shown.stdout)
    );

    // A script put executable runs by its path.
    let script = local.path().join("greet.sh");
    std::fs::write(&script, "#!/bin/sh\necho \"hello, $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    assert_status(
        &run(&[
            "session",
            "put",
            &id,
            script.to_str().unwrap(),
            "bin/greet.sh",
        ]),
        0,
        "put",
    );
    let greeted = run(&["session", "exec", &id, "--", "./bin/greet.sh", "you"]);
    assert_status(&greeted, 0, "the put script");
    assert_eq!(text(&greeted.stdout), "hello, you\n");

    // Streaming: the first line is on our stdout while the command still waits for a
    // file that only this test makes; then it ends with its own status.
    let mut streaming = client(
        data.path(),
        &url,
        &[
            "session",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second; echo warn >&2; exit 3",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let lines = lines_of(streaming.stdout.take().unwrap());
    let first = lines.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(first, "first");
    assert!(
        streaming.try_wait().unwrap().is_none(),
        "the first line came before the command ended"
    );
    let go = local.path().join("go");
    std::fs::write(&go, "").unwrap();
    assert_status(
        &run(&["session", "put", &id, go.to_str().unwrap()]),
        0,
        "put go",
    );
    let status = wait_for(&mut streaming, Duration::from_secs(60));
    assert_eq!(status.code(), Some(3), "the command's own status");
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(10)).unwrap(),
        "second"
    );
    let mut stderr = String::new();
    streaming
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(stderr, "warn\n");

    // --stdin from a file, and from our own stdin with `-`.
    let input = local.path().join("input.txt");
    std::fs::write(&input, "one\ntwo\n").unwrap();
    let fed = run(&[
        "session",
        "exec",
        &id,
        "--stdin",
        input.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "cat > got.txt; wc -l < got.txt",
    ]);
    assert_status(&fed, 0, "--stdin FILE");
    assert_eq!(text(&fed.stdout).trim(), "2");
    let mut piped = client(
        data.path(),
        &url,
        &[
            "session", "exec", &id, "--stdin", "-", "--", "tr", "a-z", "A-Z",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    piped.stdin.take().unwrap().write_all(b"shout\n").unwrap();
    let piped = piped.wait_with_output().unwrap();
    assert_status(&piped, 0, "--stdin -");
    assert_eq!(text(&piped.stdout), "SHOUT\n");

    // The file back: to stdout, and with --out.
    let got = run(&["session", "get", &id, "got.txt"]);
    assert_status(&got, 0, "get");
    assert_eq!(text(&got.stdout), "one\ntwo\n");
    let back = local.path().join("back.txt");
    assert_status(
        &run(&[
            "session",
            "get",
            &id,
            "got.txt",
            "--out",
            back.to_str().unwrap(),
        ]),
        0,
        "get --out",
    );
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "one\ntwo\n");

    let ls = run(&["session", "ls", &id]);
    assert_status(&ls, 0, "ls");
    let ls = text(&ls.stdout);
    assert!(ls.contains("got.txt") && ls.contains("bin/"), "{ls}");
    let ls: Value =
        serde_json::from_slice(&run(&["session", "ls", &id, "bin", "--json"]).stdout).unwrap();
    assert_eq!(ls["entries"][0]["name"], "greet.sh");
    assert_eq!(ls["entries"][0]["kind"], "file");

    assert_status(&run(&["session", "rm", &id, "got.txt"]), 0, "rm");
    assert!(!text(&run(&["session", "ls", &id]).stdout).contains("got.txt"));
    let gone = run(&["session", "get", &id, "got.txt"]);
    assert_status(&gone, 125, "get after rm");
    assert!(
        text(&gone.stderr).contains("not_found"),
        "{}",
        text(&gone.stderr)
    );
    assert_status(
        &run(&["session", "rm", &id, "bin", "--recursive"]),
        0,
        "rm -r",
    );

    // `exec --session` runs in the same sandbox: the file put before is there.
    let mut via_exec = client(
        data.path(),
        &url,
        &[
            "exec",
            "--session",
            &id,
            "--remote",
            &url,
            "--",
            "sh",
            "-c",
            "test -e go && echo via exec; exit 5",
        ],
    );
    let via_exec = via_exec.env_remove("SKILLBOX_URL").output().unwrap();
    assert_status(&via_exec, 5, "exec --session");
    assert_eq!(text(&via_exec.stdout), "via exec\n");

    // Timeouts and signals as the shell says them; --json as `exec --json`.
    let slow = run(&[
        "session",
        "exec",
        &id,
        "--timeout",
        "300ms",
        "--",
        "sleep",
        "30",
    ]);
    assert_status(&slow, 124, "timeout");
    assert!(
        text(&slow.stderr).contains("timed out"),
        "{}",
        text(&slow.stderr)
    );
    assert_status(
        &run(&["exec", "--session", &id, "--", "sh", "-c", "kill -9 $$"]),
        137,
        "a signal",
    );
    let json = run(&[
        "session",
        "exec",
        &id,
        "--json",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 4",
    ]);
    assert_status(&json, 0, "--json");
    let json: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["exitCode"], 4);
    assert_eq!(json["stdout"], "out\n");
    assert_eq!(json["stderr"], "err\n");

    assert_status(&run(&["session", "delete", &id]), 0, "delete");
    for args in [
        &["session", "show", id.as_str()][..],
        &["session", "exec", id.as_str(), "--", "true"],
        &["exec", "--session", id.as_str(), "--", "true"],
    ] {
        let after = run(args);
        assert_status(&after, 125, "after delete");
        let stderr = text(&after.stderr);
        assert!(stderr.contains(&format!("no session {id}")), "{stderr}");
    }
    // A made-up id: one line naming it, exit 125.
    let bad = run(&["session", "exec", "ses_nope", "--", "true"]);
    assert_status(&bad, 125, "a bad id");
    let stderr = text(&bad.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("not_found") && stderr.contains("ses_nope"),
        "{stderr}"
    );
    stop(server);
}

/// Ctrl-C on `session exec` cancels the command through the server (nothing left
/// running in the session) and exits 130.
#[test]
fn session_exec_interrupted_cancels_the_command_and_exits_130() {
    if !native_or_skip("session_exec_interrupted_cancels_the_command_and_exits_130") {
        return;
    }
    let (server, addr) = start_serve(&[]);
    let url = format!("http://{addr}");
    let data = tempfile::tempdir().unwrap();
    let created = output(data.path(), &url, &["session", "create"]);
    assert_status(&created, 0, "create");
    let id = text(&created.stdout).trim().to_string();
    let mut exec = client(
        data.path(),
        &url,
        &[
            "session",
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "echo ready; sleep 60",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let lines = lines_of(exec.stdout.take().unwrap());
    assert_eq!(
        lines.recv_timeout(Duration::from_secs(60)).unwrap(),
        "ready"
    );
    // SAFETY: signalling the client we started.
    unsafe { libc::kill(exec.id() as i32, libc::SIGINT) };
    let status = wait_for(&mut exec, Duration::from_secs(20));
    assert_eq!(status.code(), Some(130));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let shown = output(data.path(), &url, &["session", "show", &id, "--json"]);
        let info: Value = serde_json::from_slice(&shown.stdout).unwrap();
        if info["execsRunning"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "still running: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = output(
        data.path(),
        &url,
        &["session", "exec", &id, "--", "echo", "still here"],
    );
    assert_status(&after, 0, "the session goes on");
    assert_eq!(text(&after.stdout), "still here\n");
    assert_status(
        &output(data.path(), &url, &["session", "delete", &id]),
        0,
        "delete",
    );
    stop(server);
}

/// Bad usage is one line and exit 2 before any request; a server that is not there is
/// one line and exit 125.
#[test]
fn session_bad_usage_and_an_unreachable_server() {
    let data = tempfile::tempdir().unwrap();
    let nowhere = "http://127.0.0.1:9";
    let cases: &[(&[&str], &str)] = &[
        (&["session", "create", "--idle", "soon"], "soon"),
        (&["session", "create", "--memory", "lots"], "lots"),
        (&["session", "create", "--backend", "bogus"], "bogus"),
        (&["session", "exec", "ses_x"], "CMD"),
        (
            &[
                "session",
                "exec",
                "ses_x",
                "--timeout",
                "later",
                "--",
                "true",
            ],
            "later",
        ),
        (
            &[
                "session",
                "exec",
                "ses_x",
                "--stdin",
                "/no/such/file",
                "--",
                "cat",
            ],
            "/no/such/file",
        ),
        (&["session", "put", "ses_x", "-"], "REMOTE"),
        (
            &["session", "put", "ses_x", "/no/such/file"],
            "/no/such/file",
        ),
        (&["session", "--remote", "ftp://x", "list"], "ftp://x"),
        (&["session", "frobnicate"], "frobnicate"),
        (
            &[
                "exec",
                "--session",
                "ses_x",
                "--backend",
                "docker",
                "--",
                "true",
            ],
            "--backend",
        ),
        (&["exec", "--remote", nowhere, "--", "true"], "--session"),
    ];
    for (args, needle) in cases {
        let out = output(data.path(), nowhere, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
    for args in [
        &["session", "list"][..],
        &["session", "exec", "ses_x", "--", "true"],
        &["exec", "--session", "ses_x", "--", "true"],
    ] {
        let out = output(data.path(), nowhere, args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(
            stderr.contains("unavailable") && stderr.contains(nowhere),
            "{args:?}: {stderr}"
        );
    }
}
