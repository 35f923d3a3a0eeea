//! `skillbox cap run` through the real binary: the examples run as declared, only after
//! a grant, in exactly their environment, and hand back only what they may write.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

mod common;

use common::{BIN, example, native_or_skip, text};

fn data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-cap-tests")
}

/// `skillbox cap …` on the examples, in `project`, with `env` set.
fn cap(data: &Path, project: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    cap_from(project, data, project, args, env)
}

/// [`cap`], run from `cwd`.
fn cap_from(
    cwd: &Path,
    data: &Path,
    project: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("--data-dir")
        .arg(data)
        .args(["cap", "--project"])
        .arg(project)
        .arg("--root")
        .arg(example("capabilities"))
        .args(args)
        .env("SKILLBOX_WASM_HOME", common::wasm_home())
        .current_dir(cwd);
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

#[test]
fn a_native_capability_runs_only_granted_and_hands_back_what_it_may_write() {
    if !native_or_skip("a_native_capability_runs_only_granted") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let notes = project.path().join("notes.txt");
    std::fs::write(&notes, "the cat and the dog and the cat\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let run = |data: &Path| {
        cap(
            data,
            project.path(),
            &[
                "run",
                "word-count",
                "--input",
                notes.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--json",
            ],
            &[],
        )
    };
    let refused = run(data.path());
    assert_eq!(refused.status.code(), Some(125));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("permission_denied") && stderr.contains("skillbox cap grant word-count"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "it ran ungranted"
    );

    assert!(
        cap(data.path(), project.path(), &["grant", "word-count"], &[])
            .status
            .success()
    );
    let ran = run(data.path());
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let json: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(json["grant"], "project");
    // Only the file its write_file permission names comes back: not the input.
    let files: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files, ["word-count.json"], "{json}");
    let counted: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("word-count.json")).unwrap())
            .unwrap();
    assert_eq!(counted[0], serde_json::json!({"word": "the", "count": 3}));
    // It ran in the sandbox: the capability dir read-only, no network.
    assert!(json["output"]["exitCode"] == 0, "{json}");
}

#[test]
fn a_host_capability_runs_once_per_once_grant() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let done = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .current_dir(project.path())
            .env("HOME", project.path())
            .output()
            .unwrap();
        assert!(done.status.success(), "{}", text(&done.stderr));
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "the first commit"]);
    let refused = cap(data.path(), project.path(), &["grant", "git-report"], &[]);
    assert_eq!(refused.status.code(), Some(2), "no project grant for host");
    assert!(
        cap(
            data.path(),
            project.path(),
            &["grant", "git-report", "--scope", "once"],
            &[]
        )
        .status
        .success()
    );
    let ran = cap(
        data.path(),
        project.path(),
        &["run", "git-report"],
        &[("HOME", project.path().to_str().unwrap())],
    );
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert!(
        text(&ran.stdout).contains("the first commit"),
        "{}",
        text(&ran.stdout)
    );
    let again = cap(data.path(), project.path(), &["run", "git-report"], &[]);
    assert_eq!(again.status.code(), Some(125), "a once grant ran twice");
}

/// The docker example runs in docker; with no daemon it is `unavailable`, never a
/// native run instead.
#[test]
fn a_docker_capability_runs_in_docker_or_not_at_all() {
    let data = data_dir();
    std::fs::create_dir_all(&data).unwrap();
    let project = tempfile::tempdir().unwrap();
    let csv = project.path().join("sales.csv");
    std::fs::write(&csv, "region,amount\nnorth,10\nsouth,30\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    assert!(
        cap(&data, project.path(), &["grant", "csv-summary"], &[])
            .status
            .success()
    );
    let args = [
        "run",
        "csv-summary",
        "--input",
        csv.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let nowhere = format!("unix://{}/no-daemon.sock", project.path().display());
    let down = cap(&data, project.path(), &args, &[("DOCKER_HOST", &nowhere)]);
    assert_eq!(down.status.code(), Some(125), "{}", text(&down.stderr));
    assert!(
        text(&down.stderr).contains("unavailable"),
        "{}",
        text(&down.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&out).unwrap().count(),
        0,
        "it ran somewhere else"
    );

    let doctor = Command::new(BIN)
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let docker = report["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "docker")
        .unwrap();
    if docker["available"] != true {
        skillbox_env::testkit::skip(
            "a_docker_capability_runs_in_docker",
            docker["reason"].as_str().unwrap_or(""),
        );
        return;
    }
    let ran = cap(&data, project.path(), &args, &[]);
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let summary: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["sales.csv"]["rows"], 2, "{summary}");
    assert_eq!(summary["sales.csv"]["means"]["amount"], 20.0, "{summary}");
}

/// The wasm examples: a Python word count (oneshot) and a JavaScript transform
/// (ondemand, stdin and arguments from the call), each a WASI guest.
#[test]
fn wasm_capabilities_run_python_and_javascript_guests() {
    if !common::wasm_guests_or_skip("wasm_capabilities") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let notes = project.path().join("notes.txt");
    std::fs::write(&notes, "the cat and the dog and the cat\n").unwrap();
    let out = project.path().join("out");
    std::fs::create_dir(&out).unwrap();
    for name in ["wasm-word-count", "json-transform"] {
        let granted = cap(data.path(), project.path(), &["grant", name], &[]);
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        assert!(
            text(&granted.stderr).contains("run_capability:wasm"),
            "{}",
            text(&granted.stderr)
        );
    }
    let counted = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "wasm-word-count",
            "--input",
            notes.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--json",
        ],
        &[],
    );
    assert!(counted.status.success(), "{}", text(&counted.stderr));
    let totals: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("word-totals.json")).unwrap())
            .unwrap();
    assert_eq!(
        totals["notes.txt"],
        serde_json::json!({"words": 8, "distinct": 4})
    );

    let rows = project.path().join("rows.json");
    std::fs::write(
        &rows,
        r#"[{"name":"a","price":3,"secret":1},{"name":"b","price":4}]"#,
    )
    .unwrap();
    let transformed = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "json-transform",
            "--stdin",
            rows.to_str().unwrap(),
            "--json",
            "--",
            "name",
            "price",
        ],
        &[],
    );
    assert!(
        transformed.status.success(),
        "{}",
        text(&transformed.stderr)
    );
    let json: Value = serde_json::from_slice(&transformed.stdout).unwrap();
    assert_eq!(
        json["output"]["stdout"], "[{\"name\":\"a\",\"price\":3},{\"name\":\"b\",\"price\":4}]\n",
        "{json}"
    );
    assert_eq!(json["files"][0]["path"], "transformed.json", "{json}");
    // Bad input is the capability's own error, fed back as its exit code and stderr.
    std::fs::write(&rows, "{not json").unwrap();
    let bad = cap(
        data.path(),
        project.path(),
        &[
            "run",
            "json-transform",
            "--stdin",
            rows.to_str().unwrap(),
            "--json",
            "--",
            "name",
        ],
        &[],
    );
    let json: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert_eq!(json["output"]["exitCode"], 1, "{json}");
    assert!(
        json["output"]["stderr"]
            .as_str()
            .unwrap()
            .contains("stdin is not JSON"),
        "{json}"
    );
}

/// The ondemand native formatter: a fresh process per call, its stdin from the call.
#[test]
fn an_ondemand_formatter_gets_a_fresh_process_per_call() {
    if !native_or_skip("an_ondemand_formatter") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    assert!(
        cap(data.path(), project.path(), &["grant", "fmt-json"], &[])
            .status
            .success()
    );
    let doc = project.path().join("doc.json");
    for (input, expected) in [
        (
            r#"{"b":1,"a":[1,2]}"#,
            "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}\n",
        ),
        (r#"{"z":null}"#, "{\n  \"z\": null\n}\n"),
    ] {
        std::fs::write(&doc, input).unwrap();
        let ran = cap(
            data.path(),
            project.path(),
            &[
                "run",
                "fmt-json",
                "--stdin",
                doc.to_str().unwrap(),
                "--json",
            ],
            &[],
        );
        assert!(ran.status.success(), "{}", text(&ran.stderr));
        let json: Value = serde_json::from_slice(&ran.stdout).unwrap();
        assert_eq!(json["output"]["stdout"], expected, "{json}");
    }
}

/// One HTTP/1.0 exchange over the unix socket at `path`: the status line and the body.
fn http(path: &Path, method: &str, route: &str, body: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(path)
        .unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
    write!(
        stream,
        "{method} {route} HTTP/1.0\r\nHost: notes\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The parent of `pid`, from /proc.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The processes under `ancestor` whose command line mentions `needle`.
fn descendants_running(ancestor: i32, needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .filter(|pid| {
            let mut at = *pid;
            for _ in 0..16 {
                match parent_of(at) {
                    Some(parent) if parent == ancestor => return true,
                    Some(parent) if parent > 1 => at = parent,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

/// True once `pid` has exited (gone, or a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// The host socket a started service's `ServiceInfo` names.
fn socket_of(info: &Value) -> std::path::PathBuf {
    let endpoint = info["endpoint"].as_str().unwrap_or_default();
    let path = endpoint.strip_prefix("unix:");
    std::path::PathBuf::from(path.unwrap_or_else(|| panic!("not a unix endpoint: {info}")))
}

/// The pid of the supervisor `cap start` reported.
fn supervisor_of(info: &Value) -> i32 {
    info["owner"]
        .as_str()
        .unwrap()
        .rsplit("pid ")
        .next()
        .unwrap()
        .trim_end_matches(')')
        .parse()
        .unwrap()
}

/// Polls `check` every 50 ms for at most 20 s.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !check() {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "never: {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn service_status(data: &Path, project: &Path) -> Vec<Value> {
    let out = cap(data, project, &["status", "--json"], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    json["services"].as_array().unwrap().clone()
}

/// The persistent example: started once, reached through the socket skillbox forwards
/// (the sandbox has no network), listed while it runs; killed from outside it is
/// `failed` with how it ended and its stderr, and stays down; stop clears it, and
/// stopping a running one leaves nothing running; a killed supervisor takes the
/// sandbox with it.
#[test]
fn a_persistent_service_is_reached_through_its_forwarded_socket_and_stays_down_when_it_crashes() {
    if !native_or_skip("a_persistent_service") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let (data, project) = (data.path(), project.path());
    let marker = "/capability/server.py";
    let refused = cap(data, project, &["start", "http-notes"], &[]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(
        text(&refused.stderr).contains("skillbox cap grant http-notes"),
        "{}",
        text(&refused.stderr)
    );
    assert!(
        cap(data, project, &["grant", "http-notes"], &[])
            .status
            .success()
    );
    let ran = cap(data, project, &["run", "http-notes"], &[]);
    assert!(
        text(&ran.stderr).contains("cap start http-notes"),
        "a persistent capability is started, not run: {}",
        text(&ran.stderr)
    );

    let started = cap(data, project, &["start", "http-notes", "--json"], &[]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    let info: Value = serde_json::from_slice(&started.stdout).unwrap();
    assert_eq!(info["state"], "ready", "{info}");
    assert_eq!(info["serves"], "port 8080");
    assert_eq!(
        info["owner"].as_str().unwrap().split(" (").next(),
        Some("skillbox cap start")
    );
    let socket = socket_of(&info);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only its owner may connect");

    let (status, body) = http(&socket, "POST", "/notes", "buy milk");
    assert!(status.contains("201"), "{status} {body}");
    let (_, body) = http(&socket, "GET", "/notes", "");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["notes"],
        serde_json::json!(["buy milk"])
    );
    let twice = cap(data, project, &["start", "http-notes"], &[]);
    assert_eq!(twice.status.code(), Some(125));
    assert!(
        text(&twice.stderr).contains("already ready"),
        "{}",
        text(&twice.stderr)
    );

    let listed = service_status(data, project);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "ready");
    assert!(listed[0]["process"].as_str().unwrap().starts_with("pid "));

    // A crash: the service is killed from outside. It is failed, says how, and stays down.
    let supervisor = supervisor_of(&info);
    let servers = descendants_running(supervisor, marker);
    assert_eq!(servers.len(), 1, "one service process: {servers:?}");
    unsafe_kill(servers[0], libc::SIGKILL);
    eventually("the service is failed", || {
        service_status(data, project)[0]["state"] == "failed"
    });
    let failed = &service_status(data, project)[0];
    assert_eq!(failed["exit"]["signal"], 9, "{failed}");
    assert!(
        failed["stderrTail"]
            .as_str()
            .unwrap()
            .contains("POST /notes"),
        "{failed}"
    );
    eventually("the supervisor exits", || gone(supervisor));
    assert!(!socket.exists(), "the host socket goes with the service");
    assert_eq!(
        service_status(data, project)[0]["state"],
        "failed",
        "stays down"
    );
    let cleared = cap(data, project, &["stop", "http-notes"], &[]);
    assert!(cleared.status.success(), "{}", text(&cleared.stderr));
    assert!(
        text(&cleared.stderr).contains("cleared"),
        "{}",
        text(&cleared.stderr)
    );
    assert!(service_status(data, project).is_empty());

    // Started again and stopped: nothing left running, nothing listed.
    let again = cap(data, project, &["start", "http-notes", "--json"], &[]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let info: Value = serde_json::from_slice(&again.stdout).unwrap();
    let supervisor = supervisor_of(&info);
    let servers = descendants_running(supervisor, marker);
    assert_eq!(servers.len(), 1, "{servers:?}");
    let (_, body) = http(&socket, "GET", "/notes", "");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["notes"],
        serde_json::json!([]),
        "a fresh process"
    );
    let stopped = cap(data, project, &["stop", "http-notes", "--json"], &[]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    assert!(gone(servers[0]), "the stopped service still runs");
    // The lock goes before the supervisor's last breath.
    eventually("the supervisor exits", || gone(supervisor));
    assert!(service_status(data, project).is_empty());
    assert!(!socket.exists());

    // A killed supervisor (skillbox itself gone) leaves nothing running.
    let third = cap(data, project, &["start", "http-notes", "--json"], &[]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    let info: Value = serde_json::from_slice(&third.stdout).unwrap();
    let supervisor = supervisor_of(&info);
    let servers = descendants_running(supervisor, marker);
    assert_eq!(servers.len(), 1, "{servers:?}");
    unsafe_kill(supervisor, libc::SIGKILL);
    eventually("the sandbox dies with its supervisor", || gone(servers[0]));
    let left = service_status(data, project);
    assert_eq!(left[0]["state"], "failed", "{left:?}");
    assert!(
        left[0]["error"].as_str().unwrap().contains("supervisor"),
        "{left:?}"
    );
    // Clearing it says why it failed, as status did.
    let cleared = cap(data, project, &["stop", "http-notes"], &[]);
    assert!(cleared.status.success(), "{}", text(&cleared.stderr));
    assert!(
        text(&cleared.stderr).contains("which had failed: its supervisor"),
        "{}",
        text(&cleared.stderr)
    );
    assert!(service_status(data, project).is_empty());
}

fn unsafe_kill(pid: i32, signal: i32) {
    // SAFETY: signalling a process this test started (through skillbox).
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill {pid}");
}

/// Without root, reaching the port means joining the sandbox's user namespace first:
/// the same service, started, reached and stopped as uid 65534.
#[test]
fn a_persistent_service_works_for_an_unprivileged_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(
            "a_persistent_service_works_for_an_unprivileged_user",
            "needs root to switch to uid 65534",
        );
        return;
    }
    if !native_or_skip("a_persistent_service_works_for_an_unprivileged_user") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // Everything nobody needs, where nobody can read it.
    let place = tempfile::tempdir().unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = place.path().join("skillbox");
    std::fs::copy(BIN, &bin).unwrap();
    let roots = place.path().join("caps");
    let notes = roots.join("http-notes");
    std::fs::create_dir_all(&notes).unwrap();
    for file in ["manifest.yaml", "server.py"] {
        std::fs::copy(
            example("capabilities/http-notes").join(file),
            notes.join(file),
        )
        .unwrap();
    }
    for dir in [&roots, &notes] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let data = place.path().join("data");
    let project = place.path().join("project");
    for dir in [&data, &project] {
        std::fs::create_dir(dir).unwrap();
        std::os::unix::fs::chown(dir, Some(65534), Some(65534)).unwrap();
    }
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .arg("--data-dir")
            .arg(&data)
            .args(["cap", "--project"])
            .arg(&project)
            .arg("--root")
            .arg(&roots)
            .args(args)
            .env("HOME", &data)
            .output()
            .expect("run setpriv")
    };
    let granted = as_nobody(&["grant", "http-notes"]);
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    let started = as_nobody(&["start", "http-notes", "--json"]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    let info: Value = serde_json::from_slice(&started.stdout).unwrap();
    let socket = socket_of(&info);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&socket).unwrap().uid(), 65534);
    let (status, body) = http(&socket, "POST", "/notes", "from nobody");
    assert!(status.contains("201"), "{status} {body}");
    let supervisor = supervisor_of(&info);
    let stopped = as_nobody(&["stop", "http-notes"]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    eventually("the supervisor exits", || gone(supervisor));
    assert!(!socket.exists());
}

/// A persistent capability in an environment that cannot serve is refused, named, and
/// started nowhere else.
#[test]
fn a_persistent_host_capability_is_refused_not_moved() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let root = project.path().join("capabilities/web");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("manifest.yaml"),
        "name: web\ndescription: a web server on the host\nversion: 0.1.0\nenvironment: host\nlifecycle: persistent\nentry: web.py\nport: 8080\n",
    )
    .unwrap();
    std::fs::write(root.join("web.py"), "print('hi')\n").unwrap();
    let granted = cap(
        data.path(),
        project.path(),
        &["grant", "web", "--scope", "once"],
        &[],
    );
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    let refused = cap(data.path(), project.path(), &["start", "web"], &[]);
    assert_eq!(refused.status.code(), Some(125));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("not_supported") && stderr.contains("host"),
        "{stderr}"
    );
    assert!(service_status(data.path(), project.path()).is_empty());
    // The refused start left no supervisor's log behind.
    let logs: Vec<_> = std::fs::read_dir(data.path().join("services"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|key| std::fs::read_dir(key.path()).ok())
        .flatten()
        .flatten()
        .filter(|f| f.file_name() == "web.log")
        .collect();
    assert!(logs.is_empty(), "{logs:?}");
}

/// The notes example declared for `backend`: started in a container with no network,
/// reached through the socket skillbox forwards (a relay in the container, one per
/// connection), with an answer larger than the relay holds at once; stopped, its
/// container is gone.
fn a_persistent_service_serves_from(backend: &str) {
    let test = format!("a_persistent_service_serves_from_{backend}");
    if !common::backend_or_skip(backend, &test) {
        return;
    }
    let data = data_dir();
    std::fs::create_dir_all(&data).unwrap();
    let project = tempfile::tempdir().unwrap();
    let project = project.path();
    let name = format!("notes-{backend}");
    let root = project.join("capabilities").join(&name);
    std::fs::create_dir_all(&root).unwrap();
    let manifest = std::fs::read_to_string(example("capabilities/http-notes/manifest.yaml"))
        .unwrap()
        .replace("name: http-notes", &format!("name: {name}"))
        .replace("environment: native", &format!("environment: {backend}"));
    assert!(manifest.contains(&format!("environment: {backend}")));
    std::fs::write(root.join("manifest.yaml"), manifest).unwrap();
    std::fs::copy(
        example("capabilities/http-notes/server.py"),
        root.join("server.py"),
    )
    .unwrap();
    assert!(cap(&data, project, &["grant", &name], &[]).status.success());
    let started = cap(&data, project, &["start", &name, "--json"], &[]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    let info: Value = serde_json::from_slice(&started.stdout).unwrap();
    assert_eq!(info["state"], "ready", "{info}");
    assert_eq!(info["environment"], backend, "{info}");
    let container = info["process"]
        .as_str()
        .unwrap()
        .strip_prefix("container ")
        .unwrap_or_else(|| panic!("{info}"))
        .to_string();
    let socket = socket_of(&info);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only its owner may connect");

    let (status, body) = http(&socket, "POST", "/notes", "buy milk");
    assert!(status.contains("201"), "{status} {body}");
    // Two notes near the service's limit (64 KiB): the answer that lists them is more
    // than the relay holds at once.
    let long: String = (0..6000).map(|i| format!("{i:>9},")).collect();
    assert!(long.len() > 64 * 1024 - 10_000 && long.len() <= 64 * 1024);
    for _ in 0..2 {
        let (status, body) = http(&socket, "POST", "/notes", &long);
        assert!(status.contains("201"), "{status} {body}");
    }
    let (status, body) = http(&socket, "GET", "/notes", "");
    assert!(status.contains("200"), "{status} {body}");
    assert!(body.len() > 64 * 1024, "{}", body.len());
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["notes"],
        serde_json::json!(["buy milk", long, long])
    );
    let listed = service_status(&data, project);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["state"], "ready");

    let stopped = cap(&data, project, &["stop", &name], &[]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    assert!(!socket.exists());
    assert!(service_status(&data, project).is_empty());
    eventually("the service's container is removed", || {
        Command::new("docker")
            .args(["inspect", "--format", "{{.Id}}", &container])
            .output()
            .is_ok_and(|o| !o.status.success())
    });
}

#[test]
fn a_persistent_service_serves_from_docker() {
    a_persistent_service_serves_from("docker");
}

#[test]
fn a_persistent_service_serves_from_gvisor() {
    a_persistent_service_serves_from("gvisor");
}

/// The grant `cap list --json` shows for capability `name`.
fn grant_of(data: &Path, project: &Path, name: &str) -> Value {
    let listed = cap(data, project, &["list", "--json"], &[]);
    let json: Value = serde_json::from_slice(&listed.stdout).unwrap();
    json["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {json}"))["grant"]
        .clone()
}

/// A capability that cannot run as declared (a volume whose host directory is missing)
/// fails before the grant is checked: its `once` grant is still there for the run
/// after the fix.
#[test]
fn a_capability_that_cannot_run_does_not_spend_its_once_grant() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let shared = project.path().join("shared");
    let root = project.path().join("capabilities/peek");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("manifest.yaml"),
        format!(
            "name: peek\ndescription: reads a shared dir\nversion: 0.1.0\nenvironment: native\nlifecycle: oneshot\nentry: peek.sh\nvolumes:\n  - host: {}\n    sandbox: /shared\n",
            shared.display()
        ),
    )
    .unwrap();
    std::fs::write(root.join("peek.sh"), "ls /shared\n").unwrap();
    let granted = cap(
        data.path(),
        project.path(),
        &["grant", "peek", "--scope", "once"],
        &[],
    );
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    // The grant names the host directory it lets the sandbox see.
    assert!(
        text(&granted.stderr).contains(&format!("volume:ro:{}", shared.display())),
        "{}",
        text(&granted.stderr)
    );
    let failed = cap(data.path(), project.path(), &["run", "peek"], &[]);
    assert!(!failed.status.success());
    let stderr = text(&failed.stderr);
    assert!(
        stderr.contains("volumes[0].host") && stderr.contains("not a directory"),
        "{stderr}"
    );
    assert_eq!(grant_of(data.path(), project.path(), "peek"), "once");
}

/// A run whose sandbox cannot be made (no Docker daemon answers) gives its `once` grant
/// back: nothing ran. One that declares its own image is refused before the grant is
/// looked at, never run in skillbox's runtime image instead.
#[test]
fn a_run_whose_sandbox_cannot_be_made_gives_its_once_grant_back() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let root = project.path().join("capabilities/boxed");
    std::fs::create_dir_all(&root).unwrap();
    let manifest = root.join("manifest.yaml");
    let declared = "name: boxed\ndescription: needs a daemon\nversion: 0.1.0\nenvironment: docker\nlifecycle: oneshot\nentry: run.sh\n";
    std::fs::write(&manifest, declared).unwrap();
    std::fs::write(root.join("run.sh"), "echo ran\n").unwrap();
    let granted = cap(
        data.path(),
        project.path(),
        &["grant", "boxed", "--scope", "once"],
        &[],
    );
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    let no_daemon = [("DOCKER_HOST", "unix:///nonexistent/docker.sock")];
    let failed = cap(data.path(), project.path(), &["run", "boxed"], &no_daemon);
    let stderr = text(&failed.stderr);
    assert_eq!(failed.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("unavailable"), "{stderr}");
    // Its own image: refused, naming the field.
    std::fs::write(&manifest, format!("{declared}image: example/tools:1\n")).unwrap();
    let refused = cap(data.path(), project.path(), &["run", "boxed"], &[]);
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("not_supported") && stderr.contains("image example/tools:1"),
        "{stderr}"
    );
    assert_eq!(grant_of(data.path(), project.path(), "boxed"), "once");
}

/// A service that never accepts (its socket's queue filled by itself) cannot hold the
/// start, stop or status: the start fails at its ready timeout, naming why.
#[test]
fn a_service_that_never_accepts_fails_at_its_timeout_without_hanging() {
    if !native_or_skip("a_service_that_never_accepts") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let root = project.path().join("capabilities/stuck");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("manifest.yaml"),
        "name: stuck\ndescription: listens, never accepts\nversion: 0.1.0\nenvironment: native\nlifecycle: persistent\nentry: stuck.py\nsocket: /workspace/app.sock\nlimits:\n  timeout: 3s\n",
    )
    .unwrap();
    std::fs::write(
        root.join("stuck.py"),
        "import os, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.bind('/workspace/app.tmp')\ns.listen(0)\nfor _ in range(4):\n    c = socket.socket(socket.AF_UNIX)\n    c.setblocking(False)\n    try:\n        c.connect('/workspace/app.tmp')\n    except OSError:\n        pass\nos.rename('/workspace/app.tmp', '/workspace/app.sock')\ntime.sleep(600)\n",
    )
    .unwrap();
    assert!(
        cap(data.path(), project.path(), &["grant", "stuck"], &[])
            .status
            .success()
    );
    let started = std::time::Instant::now();
    let refused = cap(data.path(), project.path(), &["start", "stuck"], &[]);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the start hung: {:?}",
        started.elapsed()
    );
    assert_eq!(refused.status.code(), Some(125));
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("nothing answered at socket /workspace/app.sock within 3 s"),
        "{stderr}"
    );
    let listed = service_status(data.path(), project.path());
    assert_eq!(listed[0]["state"], "failed", "{listed:?}");
    assert!(
        cap(data.path(), project.path(), &["stop", "stuck"], &[])
            .status
            .success()
    );
    assert!(service_status(data.path(), project.path()).is_empty());
}

/// A name is a capability's name: a path through it is refused, never followed.
#[test]
fn a_service_name_that_is_a_path_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let victim = project.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    for name in ["../../x", "a/b", "..", "UPPER"] {
        let out = cap(data.path(), project.path(), &["stop", name], &[]);
        assert_eq!(out.status.code(), Some(125), "{name}");
        assert!(
            text(&out.stderr).contains("a service is named as its capability"),
            "{name}: {}",
            text(&out.stderr)
        );
    }
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
}

/// What a scribe capability's script does in its read-write volume at `/data`: writes
/// a file and a directory, tries to make the file setuid and to write beside the volume,
/// and says who owns what it wrote (by perl's stat: coreutils' statx is EINVAL under
/// this runsc).
const SCRIBE_SH: &str = r#"echo written > /data/out.txt
mkdir -p /data/sub && echo deep > /data/sub/deep.txt
if chmod 4755 /data/out.txt 2>/dev/null; then echo setuid-kept; else echo setuid-refused; fi
if echo x > /data/../escape.txt 2>/dev/null; then echo escaped; else echo parent-refused; fi
echo "owner $(perl -e 'print((stat shift)[4])' /data/out.txt) me $(id -u)"
"#;

/// A capability `name` in `project`'s own capabilities dir, on `environment`, with
/// `volume` shown read-write (or read-only) at `/data`; its entry is `entry` (file name
/// and text).
fn scribe(
    project: &Path,
    name: &str,
    environment: &str,
    volume: &Path,
    rw: bool,
    entry: (&str, &str),
) {
    let root = project.join("capabilities").join(name);
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(
        root.join("manifest.yaml"),
        format!(
            "name: {name}\ndescription: writes a shared dir\nversion: 0.1.0\nenvironment: {environment}\nlifecycle: oneshot\nentry: {}\nvolumes:\n  - host: {}\n    sandbox: /data\n    rw: {rw}\n",
            entry.0,
            volume.display()
        ),
    )
    .unwrap();
    std::fs::write(root.join(entry.0), entry.1).unwrap();
}

/// Grants `name` for the session's project, and checks the grant names the volume as
/// read-write.
fn grant_rw(data: &Path, project: &Path, name: &str, volume: &Path) {
    let granted = cap(data, project, &["grant", name], &[]);
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    assert!(
        text(&granted.stderr).contains(&format!("volume:rw:{}", volume.display())),
        "{}",
        text(&granted.stderr)
    );
}

/// Grants `scribe` once and runs it, with `roots` as further `--root`s for both, and
/// returns its stderr once it is seen refused (exit 125: nothing ran).
fn scribe_refused(data: &Path, project: &Path, roots: &[&str]) -> String {
    let mut args: Vec<&str> = Vec::new();
    for root in roots {
        args.extend(["--root", root]);
    }
    let mut grant = args.clone();
    grant.extend(["grant", "scribe", "--scope", "once"]);
    let granted = cap(data, project, &grant, &[]);
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    args.extend(["run", "scribe"]);
    let refused = cap(data, project, &args, &[]);
    assert_eq!(
        refused.status.code(),
        Some(125),
        "{}",
        text(&refused.stderr)
    );
    text(&refused.stderr)
}

/// `project/volume`, owned by `owner` (uid and gid) when this is root.
fn volume_owned_by(project: &Path, owner: u32) -> (std::path::PathBuf, u32) {
    use std::os::unix::fs::MetadataExt;
    let volume = project.join("volume");
    std::fs::create_dir(&volume).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&volume, Some(owner), Some(owner)).unwrap();
    }
    let uid = std::fs::metadata(&volume).unwrap().uid();
    (volume, uid)
}

/// What a scribe run left on the host: its two files, owned by the volume's owner, no
/// setuid bit, and nothing beside the volume.
fn assert_scribed(volume: &Path, owner: u32, stdout: &str) {
    use std::os::unix::fs::MetadataExt;
    assert!(stdout.contains("parent-refused"), "{stdout}");
    let out = volume.join("out.txt");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "written\n");
    let deep = volume.join("sub/deep.txt");
    assert_eq!(std::fs::read_to_string(&deep).unwrap(), "deep\n");
    for path in [&out, &deep, &volume.join("sub")] {
        let meta = std::fs::metadata(path).unwrap();
        assert_eq!(
            meta.uid(),
            owner,
            "{} is not the volume owner's",
            path.display()
        );
        assert_eq!(
            meta.gid(),
            owner,
            "{} is not the volume group's",
            path.display()
        );
        assert_eq!(
            meta.mode() & 0o6000,
            0,
            "{} is setuid or setgid",
            path.display()
        );
    }
    assert!(!volume.parent().unwrap().join("escape.txt").exists());
    assert!(!Path::new("/escape.txt").exists());
}

/// A read-write volume on native: what the code writes lands in the host directory,
/// owned by the directory's owner (another user than the sandbox's: an idmapped mount as
/// root; the sandbox's host user: a plain bind), never setuid, and nothing lands beside
/// it. A grant for the volume read-only does not cover it read-write.
#[test]
fn a_read_write_volume_on_native_is_written_as_its_owner_and_nothing_beside_it() {
    if !native_or_skip("a_read_write_volume_on_native") {
        return;
    }
    for owner in [4242, 65534] {
        let data = tempfile::tempdir().unwrap();
        let project = tempfile::tempdir().unwrap();
        let (volume, owner) = volume_owned_by(project.path(), owner);
        scribe(
            project.path(),
            "scribe",
            "native",
            &volume,
            false,
            ("scribe.sh", SCRIBE_SH),
        );
        let granted = cap(data.path(), project.path(), &["grant", "scribe"], &[]);
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        // Now read-write: the read-only grant does not cover it.
        scribe(
            project.path(),
            "scribe",
            "native",
            &volume,
            true,
            ("scribe.sh", SCRIBE_SH),
        );
        let refused = cap(data.path(), project.path(), &["run", "scribe"], &[]);
        assert_eq!(
            refused.status.code(),
            Some(125),
            "{}",
            text(&refused.stderr)
        );
        assert!(
            text(&refused.stderr).contains(&format!("volume:rw:{}", volume.display())),
            "{}",
            text(&refused.stderr)
        );
        assert_eq!(
            std::fs::read_dir(&volume).unwrap().count(),
            0,
            "it ran ungranted"
        );

        grant_rw(data.path(), project.path(), "scribe", &volume);
        let ran = cap(data.path(), project.path(), &["run", "scribe"], &[]);
        assert!(ran.status.success(), "{}", text(&ran.stderr));
        let stdout = text(&ran.stdout);
        // Inside, the sandbox's user owns what it wrote.
        assert!(stdout.contains("owner 1000 me 1000"), "{stdout}");
        assert!(stdout.contains("setuid-refused"), "{stdout}");
        assert_scribed(&volume, owner, &stdout);
    }
}

/// A volume written relative (`host: volume`) is the project's own: one capability in a
/// root every project uses writes into the `volume` of the project it runs for, under
/// that project's grant; a `volume` that is a symlink (here to another project's) is
/// refused.
#[test]
fn a_relative_volume_is_each_project_s_own() {
    if !native_or_skip("a_relative_volume_is_each_project_s_own") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let shared = tempfile::tempdir().unwrap();
    scribe(
        shared.path(),
        "scribe",
        "native",
        Path::new("volume"),
        true,
        ("scribe.sh", SCRIBE_SH),
    );
    let root = shared.path().join("capabilities");
    let root = root.to_str().unwrap();
    // `cap COMMAND scribe` for `project`, with the shared root, run from `cwd`.
    let scribe_in = |cwd: &Path, project: &Path, command: &str| {
        cap_from(
            cwd,
            data.path(),
            project,
            &["--root", root, command, "scribe"],
            &[],
        )
    };
    let projects = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    for project in &projects {
        let (volume, owner) = volume_owned_by(project.path(), 4242);
        // Another project's grant does not cover this one.
        let refused = scribe_in(project.path(), project.path(), "run");
        assert_eq!(
            refused.status.code(),
            Some(125),
            "{}",
            text(&refused.stderr)
        );
        let granted = scribe_in(project.path(), project.path(), "grant");
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        assert!(
            text(&granted.stderr).contains("volume:rw:volume"),
            "{}",
            text(&granted.stderr)
        );
        // Run from elsewhere: the project is what counts, not the working directory.
        let ran = scribe_in(shared.path(), project.path(), "run");
        assert!(ran.status.success(), "{}", text(&ran.stderr));
        assert_scribed(&volume, owner, &text(&ran.stdout));
    }
    // The first project's volume has its own run's files and no more.
    let first = projects[0].path().join("volume");
    let mut names: Vec<String> = std::fs::read_dir(&first)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["out.txt", "sub"]);
    std::fs::remove_file(first.join("out.txt")).unwrap();
    // A project whose `volume` is a link to the first project's reaches nothing.
    let linked = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&first, linked.path().join("volume")).unwrap();
    let granted = scribe_in(linked.path(), linked.path(), "grant");
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    let refused = scribe_in(linked.path(), linked.path(), "run");
    assert_eq!(
        refused.status.code(),
        Some(125),
        "{}",
        text(&refused.stderr)
    );
    assert!(
        text(&refused.stderr).contains("goes through a symlink"),
        "{}",
        text(&refused.stderr)
    );
    assert!(!first.join("out.txt").exists(), "it wrote through the link");
}

/// A read-write volume on docker and gVisor: the container runs as the volume's owner,
/// so what it writes is theirs; a root-owned volume is refused (never written as root),
/// before its grant is spent.
fn a_read_write_volume_in_a_container(backend: &str) {
    if !common::backend_or_skip(backend, &format!("a_read_write_volume_on_{backend}")) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let (volume, owner) = volume_owned_by(project.path(), 0);
    scribe(
        project.path(),
        "scribe",
        backend,
        &volume,
        true,
        ("scribe.sh", SCRIBE_SH),
    );
    if root {
        let granted = cap(
            data.path(),
            project.path(),
            &["grant", "scribe", "--scope", "once"],
            &[],
        );
        assert!(granted.status.success(), "{}", text(&granted.stderr));
        let refused = cap(data.path(), project.path(), &["run", "scribe"], &[]);
        assert!(!refused.status.success());
        assert!(
            text(&refused.stderr).contains("never as root"),
            "{}",
            text(&refused.stderr)
        );
        assert_eq!(grant_of(data.path(), project.path(), "scribe"), "once");
        std::os::unix::fs::chown(&volume, Some(4242), Some(4242)).unwrap();
    }
    let owner = if root { 4242 } else { owner };
    grant_rw(data.path(), project.path(), "scribe", &volume);
    let ran = cap(data.path(), project.path(), &["run", "scribe"], &[]);
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    let stdout = text(&ran.stdout);
    assert!(
        stdout.contains(&format!("owner {owner} me {owner}")),
        "{stdout}"
    );
    assert!(stdout.contains("setuid-refused"), "{stdout}");
    assert_scribed(&volume, owner, &stdout);
}

#[test]
fn a_read_write_volume_on_docker_is_written_as_its_owner() {
    a_read_write_volume_in_a_container("docker");
}

#[test]
fn a_read_write_volume_on_gvisor_is_written_as_its_owner() {
    a_read_write_volume_in_a_container("gvisor");
}

/// A wasm guest gets a read-write volume preopened writable: CPython for WASI writes
/// there, and cannot leave it.
#[test]
fn a_read_write_volume_on_wasm_is_preopened_writable() {
    if !common::wasm_guests_or_skip("a_read_write_volume_on_wasm") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let (volume, owner) = volume_owned_by(project.path(), 4242);
    let script = "import os\nopen('/data/out.txt', 'w').write('written\\n')\nos.mkdir('/data/sub')\nopen('/data/sub/deep.txt', 'w').write('deep\\n')\ntry:\n    open('/data/../escape.txt', 'w').write('x')\n    print('escaped')\nexcept OSError:\n    print('parent-refused')\n";
    scribe(
        project.path(),
        "scribe",
        "wasm",
        &volume,
        true,
        ("scribe.py", script),
    );
    grant_rw(data.path(), project.path(), "scribe", &volume);
    let ran = cap(data.path(), project.path(), &["run", "scribe"], &[]);
    assert!(ran.status.success(), "{}", text(&ran.stderr));
    assert_scribed(&volume, owner, &text(&ran.stdout));
}

/// A read-write volume that could reach what decides what runs is refused before
/// anything runs or a grant is spent: one over the capabilities' own directory or any
/// other directory capabilities are loaded from (another capability's code, a host
/// one's included), one over skillbox's data dir (the grants), one whose path goes
/// through a symlink (which could be changed after the grant), one root owns, one
/// that holds another volume's directory, and one at a place the sandbox's system
/// holds.
#[test]
fn a_read_write_volume_that_reaches_what_decides_what_runs_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let real = project.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = project.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let examples = example("capabilities").canonicalize().unwrap();
    let mut cases: Vec<(&Path, &str, &str)> = vec![
        (
            project.path(),
            "permission_denied",
            "the capabilities are in",
        ),
        (data.path(), "permission_denied", "data dir"),
        (
            &examples,
            "permission_denied",
            "capabilities are loaded from",
        ),
        (&link, "invalid", "symlink"),
    ];
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // Root's: the sandbox would be root in it (a setuid-root file there its to change).
        cases.push((&real, "invalid", "never as root"));
    }
    for (volume, code, why) in cases {
        scribe(
            project.path(),
            "scribe",
            "native",
            volume,
            true,
            ("scribe.sh", SCRIBE_SH),
        );
        let stderr = scribe_refused(data.path(), project.path(), &[]);
        assert!(
            stderr.contains(code) && stderr.contains(why) && stderr.contains("volumes[0].host"),
            "{}: {stderr}",
            volume.display()
        );
        assert_eq!(grant_of(data.path(), project.path(), "scribe"), "once");
        assert!(!real.join("out.txt").exists());
        assert!(!project.path().join("out.txt").exists());
        cap(data.path(), project.path(), &["revoke", "scribe"], &[]);
    }
    // Over another volume's host directory: the code could swap that one for a link.
    let inner = real.join("inner");
    std::fs::create_dir(&inner).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(&real, Some(4242), Some(4242)).unwrap();
    }
    let manifest = project.path().join("capabilities/scribe/manifest.yaml");
    std::fs::write(
        &manifest,
        format!(
            "name: scribe\ndescription: w\nversion: 0.1.0\nenvironment: native\nlifecycle: oneshot\nentry: scribe.sh\nvolumes:\n  - host: {}\n    sandbox: /data\n    rw: true\n  - host: {}\n    sandbox: /ref\n",
            real.display(),
            inner.display()
        ),
    )
    .unwrap();
    let stderr = scribe_refused(data.path(), project.path(), &[]);
    assert!(
        stderr.contains("another volume's host directory"),
        "{stderr}"
    );
    assert_eq!(grant_of(data.path(), project.path(), "scribe"), "once");
    assert!(!real.join("out.txt").exists());
    // At /usr/local/data: the manifest itself is refused, naming the field.
    let root = project.path().join("capabilities/scribe/manifest.yaml");
    let manifest = std::fs::read_to_string(&root).unwrap();
    std::fs::write(
        &root,
        manifest.replace("sandbox: /data", "sandbox: /usr/local/data"),
    )
    .unwrap();
    let shown = cap(data.path(), project.path(), &["show", "scribe"], &[]);
    assert!(!shown.status.success());
    assert!(
        text(&shown.stderr).contains("volumes[0].sandbox") && text(&shown.stderr).contains("/usr"),
        "{}",
        text(&shown.stderr)
    );
}

/// A read-write volume may reach no capability's code however it is named: not the real
/// directory of a capability that is a symlink in its root, not where a root that does
/// not exist yet would be made (named through a symlink, or relative), and not a
/// guarded directory under another name (a bind mount of it).
#[test]
fn a_read_write_volume_over_any_capability_s_code_is_refused() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let base = tempfile::tempdir().unwrap();
    let mine = |dir: &Path| {
        std::fs::create_dir_all(dir).unwrap();
        if root {
            std::os::unix::fs::chown(dir, Some(4242), Some(4242)).unwrap();
        }
    };
    // A host capability whose directory is a symlink in its root.
    let ext = base.path().join("ext");
    mine(&ext);
    let real = ext.join("lc");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::write(
        real.join("manifest.yaml"),
        "name: lc\ndescription: h\nversion: 0.1.0\nenvironment: host\nlifecycle: oneshot\nentry: run.sh\n",
    )
    .unwrap();
    std::fs::write(real.join("run.sh"), "echo original\n").unwrap();
    let other = base.path().join("roots/other");
    std::fs::create_dir_all(&other).unwrap();
    std::os::unix::fs::symlink(&real, other.join("lc")).unwrap();
    // A root that does not exist yet, named through a symlink.
    let real2 = base.path().join("real2");
    mine(&real2);
    let link = base.path().join("lnk");
    std::os::unix::fs::symlink(&real2, &link).unwrap();
    // A relative root, under the project's sub directory (cap runs in the project).
    let sub = project.path().join("sub");
    mine(&sub);

    let refused = |volume: &Path, roots: &[&str], how: &str| {
        scribe(
            project.path(),
            "scribe",
            "native",
            volume,
            true,
            ("scribe.sh", SCRIBE_SH),
        );
        let stderr = scribe_refused(data.path(), project.path(), roots);
        assert!(
            stderr.contains("permission_denied") && stderr.contains("reaches"),
            "{how}: {stderr}"
        );
        cap(data.path(), project.path(), &["revoke", "scribe"], &[]);
    };
    let other_root = other.to_str().unwrap().to_string();
    refused(
        &ext,
        &[&other_root],
        "a symlinked capability's real directory",
    );
    let missing = link.join("newroot");
    refused(
        &real2,
        &[missing.to_str().unwrap()],
        "a missing root through a symlink",
    );
    refused(&sub, &["sub/newcaps"], "a missing relative root");
    assert_eq!(
        std::fs::read_to_string(real.join("run.sh")).unwrap(),
        "echo original\n"
    );
    assert!(!real2.join("newroot").exists() && !sub.join("newcaps").exists());

    // A bind mount of a root under another name, in a mount namespace of this run's own.
    if root && native_or_skip("a_read_write_volume_over_a_bind_mount_of_a_root") {
        let alias = base.path().join("alias");
        mine(&alias);
        scribe(
            project.path(),
            "scribe",
            "native",
            &alias,
            true,
            ("scribe.sh", SCRIBE_SH),
        );
        assert!(
            cap(
                data.path(),
                project.path(),
                &["--root", &other_root, "grant", "scribe", "--scope", "once"],
                &[]
            )
            .status
            .success()
        );
        let ran = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind {} {} && exec \"$0\" --data-dir {} cap --project {} --root {} run scribe",
                other.display(),
                alias.display(),
                data.path().display(),
                project.path().display(),
                other.display()
            ))
            .arg(BIN)
            .current_dir(project.path())
            .output()
            .unwrap();
        assert_eq!(ran.status.code(), Some(125), "{}", text(&ran.stderr));
        assert!(
            text(&ran.stderr).contains("reaches"),
            "{}",
            text(&ran.stderr)
        );
        assert_eq!(
            std::fs::read_to_string(real.join("run.sh")).unwrap(),
            "echo original\n"
        );
    }
}
