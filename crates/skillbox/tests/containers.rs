//! The docker and gvisor backends through the real binary: the network boundary, gVisor's
//! own kernel, the same verified deck as native, and no container left behind by a
//! one-shot run, a killed skillbox or a server that shuts down.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

use common::{BIN, Serving, assert_workspacex_deck, example, skillbox, text};

/// The Node runtime and image are shared by these tests.
fn data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-container-tests")
}

/// True when `doctor` says the backend works here; otherwise skips (or fails under
/// SKILLBOX_REQUIRE_ALL=1) with doctor's reason.
fn available(backend: &str, test: &str) -> bool {
    let out = skillbox(&data_dir(), &["doctor", "--json"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = json["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == backend)
        .unwrap()
        .clone();
    if entry["available"] == true {
        return true;
    }
    skillbox_env::testkit::skip(test, entry["reason"].as_str().unwrap_or("unavailable"));
    false
}

/// Sandbox containers (any state) whose owner is the process `pid`.
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "-a",
            "--filter",
            "label=dev.skillbox.sandbox",
            "--format",
            "{{.ID}} {{.Label \"dev.skillbox.owner\"}}",
        ])
        .output()
        .expect("docker ps");
    assert!(out.status.success(), "docker ps: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("/{pid}/")))
        .map(|l| l.split(' ').next().unwrap().to_string())
        .collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A one-shot `skillbox exec` that leaves no container behind.
fn exec_in(backend: &str, script: &str) -> Output {
    let child = Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir())
        .args(["exec", "--backend", backend, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(
        containers_of(pid).is_empty(),
        "skillbox exec --backend {backend} left its container behind"
    );
    out
}

#[test]
fn containers_cannot_reach_a_host_listener_and_see_only_lo() {
    for backend in ["docker", "gvisor"] {
        if !available(backend, "containers_cannot_reach_a_host_listener") {
            continue;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let script = format!(
            "curl -sS --max-time 3 http://127.0.0.1:{port}/ && echo CONNECTED; \
             (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo CONNECTED_BASH; \
             python3 -c 'import socket; print(\"IFACES\", sorted(n for _, n in socket.if_nameindex()))'"
        );
        let out = exec_in(
            backend,
            &format!("exec bash -c '{}'", script.replace('\'', "'\\''")),
        );
        let stdout = text(&out.stdout);
        assert!(
            !stdout.contains("CONNECTED"),
            "{backend}: reached the host: {stdout}"
        );
        assert!(
            stdout.contains("IFACES ['lo']"),
            "{backend}: interfaces other than lo: {stdout}{}",
            text(&out.stderr)
        );
        match listener.accept() {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{backend}: the host listener saw a connection: {other:?}"),
        }
    }
}

#[test]
fn gvisor_reports_its_own_kernel() {
    if !available("gvisor", "gvisor_reports_its_own_kernel") {
        return;
    }
    let mut host = String::new();
    std::fs::File::open("/proc/sys/kernel/osrelease")
        .unwrap()
        .read_to_string(&mut host)
        .unwrap();
    let out = exec_in("gvisor", "uname -r");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let inside = text(&out.stdout);
    assert!(!inside.trim().is_empty());
    assert_ne!(inside.trim(), host.trim(), "gvisor shows the host's kernel");
    // And docker (runc) shares the host kernel, which is the difference.
    if available("docker", "gvisor_reports_its_own_kernel") {
        let out = exec_in("docker", "uname -r");
        assert_eq!(text(&out.stdout).trim(), host.trim());
    }
}

#[test]
fn run_makes_the_same_verified_deck_in_containers() {
    for backend in ["gvisor", "docker"] {
        if !available(backend, "run_makes_the_same_verified_deck_in_containers") {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        let result = skillbox(
            &data_dir(),
            &[
                "run",
                example("workspacex-deck.js").to_str().unwrap(),
                "--backend",
                backend,
                "--out",
                out.path().to_str().unwrap(),
                "--outputs",
                "*.pptx",
            ],
        );
        assert!(
            result.status.success(),
            "{backend}: {}",
            text(&result.stderr)
        );
        assert_workspacex_deck(&out.path().join("workspacex.pptx"));
    }
}

/// The agent demo behind a container: `skillbox agent --backend docker|gvisor` on the
/// demo prompt (loopback model) fails once with pptxgenjs's own error, then ships the
/// deck, verified by parsing it.
#[test]
fn the_agent_demo_ships_a_verified_deck_in_containers() {
    for backend in ["docker", "gvisor"] {
        if !available(
            backend,
            "the_agent_demo_ships_a_verified_deck_in_containers",
        ) {
            continue;
        }
        let out = tempfile::tempdir().unwrap();
        let result = skillbox(
            &data_dir(),
            &[
                "agent",
                "Make a 3-slide pitch deck for WorkspaceX: a title slide, three selling points, and contact details.",
                "--backend",
                backend,
                "--out",
                out.path().to_str().unwrap(),
            ],
        );
        let stderr = text(&result.stderr);
        assert!(result.status.success(), "{backend}: {stderr}");
        let attempts: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("attempt "))
            .collect();
        assert_eq!(attempts.len(), 2, "{backend}: {stderr}");
        assert!(
            attempts[0].contains("Missing/Invalid shape parameter"),
            "{backend}: {stderr}"
        );
        assert!(
            attempts[1].starts_with("attempt 2: ok"),
            "{backend}: {stderr}"
        );
        let deck = skillbox_pptx::verify_file(out.path().join("workspacex.pptx"))
            .unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(deck.slide_count(), 3, "{backend}");
        assert!(deck.contains(3, "hello@workspacex.example"), "{backend}");
    }
}

/// A projection marker the run made unreadable (mode 000: the docker backend's file
/// helper reads as the sandbox's user) is no fingerprint: the skills are projected
/// again over it, not refused.
#[test]
fn docker_projects_again_over_a_marker_it_cannot_read() {
    if !available(
        "docker",
        "docker_projects_again_over_a_marker_it_cannot_read",
    ) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(
            "docker_projects_again_over_a_marker_it_cannot_read",
            "needs root to chown",
        );
        return;
    }
    let skills = tempfile::tempdir().unwrap();
    let skill = skills.path().join("skills/report");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: report\ndescription: Writes a report.\n---\n# report\n",
    )
    .unwrap();
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(work.path(), Some(65534), Some(65534)).unwrap();
    let project = || {
        let out = skillbox(
            &data_dir(),
            &[
                "skills",
                "--workspace",
                skills.path().to_str().unwrap(),
                "project",
                "--backend",
                "docker",
                "--workdir",
                work.path().to_str().unwrap(),
                "--json",
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    assert_eq!(project()["copied"], true);
    let marker = work.path().join(".skillbox/projection");
    std::fs::set_permissions(&marker, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    assert_eq!(project()["copied"], true);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&marker).unwrap().permissions());
    assert_ne!(mode & 0o444, 0, "the marker is whole again: {mode:o}");
}

/// A docker workdir runs as its owner, never root: a root-owned one is refused, and one
/// of root's group runs as nogroup.
#[test]
fn docker_workdir_runs_as_its_owner_never_root() {
    if !available("docker", "docker_workdir_runs_as_its_owner") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip("docker_workdir_runs_as_its_owner", "needs root to chown");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().to_str().unwrap();
    // `exec --backend docker --workdir DIR -- COMMAND…`.
    let exec_in = |command: &[&str]| {
        let mut args = vec!["exec", "--backend", "docker", "--workdir", dir, "--"];
        args.extend(command);
        skillbox(&data_dir(), &args)
    };
    let out = exec_in(&["true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("owned by root"),
        "{}",
        text(&out.stderr)
    );
    std::os::unix::fs::chown(work.path(), Some(65534), Some(65534)).unwrap();
    let out = exec_in(&["sh", "-c", "id -u; echo hi > /workspace/made"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "65534");
    use std::os::unix::fs::MetadataExt;
    let made = std::fs::metadata(work.path().join("made")).unwrap();
    assert_eq!((made.uid(), made.gid()), (65534, 65534));
    // Of root's group: the container runs as nogroup, never gid 0.
    std::os::unix::fs::chown(work.path(), Some(4242), Some(0)).unwrap();
    let out = exec_in(&["sh", "-c", "id -u; id -g; id -G"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "4242\n65534\n65534\n");
}

/// skillbox killed with SIGKILL cannot remove its container; the next skillbox that
/// uses docker does.
/// A one-shot `skillbox exec --backend docker -- sleep 600`, its stderr to `stderr`.
fn docker_sleep(stderr: Stdio) -> std::process::Child {
    Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir())
        .args([
            "exec",
            "--backend",
            "docker",
            "--timeout",
            "10m",
            "--",
            "sleep",
            "600",
        ])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

#[test]
fn a_killed_skillbox_leaves_a_container_the_next_run_sweeps() {
    if !available("docker", "a_killed_skillbox_leaves_a_container") {
        return;
    }
    let mut child = docker_sleep(Stdio::null());
    let pid = child.id();
    wait_for("the sandbox container", || !containers_of(pid).is_empty());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!containers_of(pid).is_empty(), "nothing was left to sweep");
    let out = exec_in("docker", "true");
    assert!(out.status.success(), "{}", text(&out.stderr));
    wait_for("the sweep", || containers_of(pid).is_empty());
}

/// skillbox stopped by SIGTERM (`timeout`, `kill`) removes its container before it
/// exits, as after Ctrl-C: nothing is left running until a later sweep.
#[test]
fn a_skillbox_stopped_by_sigterm_removes_its_container() {
    if !available(
        "docker",
        "a_skillbox_stopped_by_sigterm_removes_its_container",
    ) {
        return;
    }
    let child = docker_sleep(Stdio::piped());
    let pid = child.id();
    wait_for("the sandbox container", || !containers_of(pid).is_empty());
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert_eq!(containers_of(pid), Vec::<String>::new(), "left running");
}

/// Ctrl-C during the minute of debootstrap ends `image build` before it can remove the
/// partial root; the next build removes it. A stand-in debootstrap on PATH (the real one
/// takes a minute and a mirror) makes a root and waits, or fails at once.
#[test]
fn an_interrupted_image_build_leaves_a_root_the_next_build_removes() {
    if !available("docker", "an_interrupted_image_build_leaves_a_root") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(
            "an_interrupted_image_build_leaves_a_root",
            "image build needs root",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let fake = bin.join("debootstrap");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ -n \"$FAIL_AT_ONCE\" ] && exit 1\n\
         for a; do case \"$a\" in /*) target=\"$a\"; break;; esac; done\n\
         mkdir -p \"$target/usr/bin\" && echo partial > \"$target/usr/bin/made\"\nsleep 300\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let data = dir.path().join("data");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let build = || {
        let mut command = Command::new(BIN);
        command
            .arg("--data-dir")
            .arg(&data)
            .args(["image", "build", "--force"])
            .env("PATH", &path)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    };
    let roots = || -> Vec<String> {
        std::fs::read_dir(data.join("images"))
            .map(|dir| {
                dir.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(".rootfs-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    // A group of its own, signalled whole, as a terminal's Ctrl-C does.
    let mut first = std::os::unix::process::CommandExt::process_group(&mut build(), 0)
        .spawn()
        .unwrap();
    wait_for("the stand-in debootstrap's root", || {
        roots()
            .iter()
            .any(|r| data.join("images").join(r).join("usr/bin/made").exists())
    });
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(first.id() as i32), libc::SIGINT) };
    assert!(!first.wait().unwrap().success());
    let left = roots();
    assert_eq!(left.len(), 1, "the interrupted build's root: {left:?}");
    let second = build().env("FAIL_AT_ONCE", "1").status().unwrap();
    assert!(!second.success(), "the stand-in debootstrap fails");
    assert_eq!(roots(), Vec::<String>::new());
}

/// `skillbox serve` on the shared data dir and a free loopback port, once it accepts.
fn start_serve(extra: &[&str]) -> (std::process::Child, String) {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let server = Command::new(BIN)
        .arg("--data-dir")
        .arg(data_dir())
        .args(["serve", "--addr", &addr])
        .args(extra)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("skillbox serve", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    (server, addr)
}

/// Sends a docker run of `sleep 600` to the server at `addr`; the connection stays open
/// (dropping it cancels the run).
fn start_docker_sleep(addr: &str) -> std::net::TcpStream {
    let body = r#"{"script":"sleep 600","language":"sh","backend":"docker","timeoutMs":600000}"#;
    let request = format!(
        "POST /v1/run HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut client = std::net::TcpStream::connect(addr).unwrap();
    std::io::Write::write_all(&mut client, request.as_bytes()).unwrap();
    client
}

/// `skillbox serve` removes the containers of runs in flight when it shuts down.
#[test]
fn serve_shutdown_removes_containers_of_runs_in_flight() {
    if !available("docker", "serve_shutdown_removes_containers") {
        return;
    }
    let (mut server, addr) = start_serve(&[]);
    let pid = server.id();
    let client = start_docker_sleep(&addr);
    wait_for("the run's container", || !containers_of(pid).is_empty());
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(status.success(), "serve should stop cleanly: {status:?}");
    assert!(
        containers_of(pid).is_empty(),
        "serve left the container of an in-flight run"
    );
    drop(client);
}

/// A server killed with SIGKILL leaves its runs' and its pool's containers running;
/// the next server removes them as it starts, before any run uses docker again.
#[test]
fn a_killed_server_leaves_containers_its_next_start_sweeps() {
    if !available("docker", "a_killed_server_leaves_containers") {
        return;
    }
    let (mut server, addr) = start_serve(&["--warm-containers", "1"]);
    let pid = server.id();
    let client = start_docker_sleep(&addr);
    // The run's container and the one the pool keeps ready after the first use.
    wait_for("the run's and the pool's containers", || {
        containers_of(pid).len() >= 2
    });
    server.kill().unwrap();
    server.wait().unwrap();
    drop(client);
    assert!(!containers_of(pid).is_empty(), "nothing was left to sweep");
    let _next = Serving(start_serve(&[]).0);
    wait_for("the next start's sweep", || containers_of(pid).is_empty());
}

/// A user who may not use the daemon's socket gets `unavailable` naming the socket and
/// the fix, and nothing runs (no fallback to another backend).
#[test]
fn an_inaccessible_socket_is_unavailable_not_a_fallback() {
    let test = "an_inaccessible_socket_is_unavailable";
    if !available("docker", test) {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(test, "needs root to run as another user");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(data.path(), Some(65534), Some(65534)).unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            BIN,
        ])
        .arg("--data-dir")
        .arg(data.path())
        .args(["exec", "--backend", "docker", "--", "sh", "-c", "echo RAN"])
        .env_remove("DOCKER_HOST")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(!text(&out.stdout).contains("RAN"));
    assert!(stderr.contains("unavailable"), "{stderr}");
    assert!(stderr.contains("docker.sock"), "{stderr}");
    assert!(stderr.contains("not accessible"), "{stderr}");
}
