//! The CLI contract (DESIGN.md §4): `doctor` and `exec`, run as the real binary.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

mod common;
#[path = "cli/nodes.rs"]
mod nodes;
#[path = "cli/sessions.rs"]
mod sessions;
#[path = "cli/store.rs"]
mod store;

use common::{BIN, Serving, assert_workspacex_deck, example, native_or_skip, skillbox, text};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn exec_runs_as_non_root_writes_the_workspace_and_cannot_read_shadow() {
    if !native_or_skip("exec_runs_as_non_root") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    // As root the workspace must belong to an unprivileged user (see the next test).
    if is_root() {
        std::os::unix::fs::chown(work.path(), Some(65534), Some(65534)).unwrap();
    }
    let workdir = work.path().to_str().unwrap();
    let out = skillbox(
        data.path(),
        &[
            "exec",
            "--backend",
            "native",
            "--workdir",
            workdir,
            "--",
            "sh",
            "-c",
            "id -u; echo hi > /workspace/x; cat /etc/shadow",
        ],
    );
    let stdout = text(&out.stdout);
    let uid: u32 = stdout.lines().next().unwrap().trim().parse().unwrap();
    assert_ne!(uid, 0, "the sandbox must not run as uid 0");
    assert_eq!(
        std::fs::read_to_string(work.path().join("x")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "cat /etc/shadow must fail: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("/etc/shadow"),
        "{}",
        text(&out.stderr)
    );
    // Nothing of the sandbox is left in the data dir (the shared /etc stays, by design).
    let left: Vec<String> = std::fs::read_dir(data.path().join("native"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("etc-") && name != skillbox_env::owner::CLAIMS)
        .collect();
    assert!(left.is_empty(), "sandbox dirs left behind: {left:?}");
}

#[test]
fn exec_json_follows_the_contract() {
    if !native_or_skip("exec_json_follows_the_contract") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let out = skillbox(
        data.path(),
        &[
            "exec",
            "--json",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "durationMs",
            "exitCode",
            "limitHit",
            "signal",
            "stderr",
            "stdout",
            "timedOut",
            "truncated"
        ]
    );
    assert_eq!(json["exitCode"], 3);
    assert_eq!(json["signal"], Value::Null);
    assert_eq!(json["stdout"], "out\n");
    assert_eq!(json["stderr"], "err\n");
    assert_eq!(json["timedOut"], false);
    assert_eq!(json["limitHit"], Value::Null);
    assert_eq!(
        json["truncated"],
        serde_json::json!({"stdout": false, "stderr": false})
    );
    assert!(json["durationMs"].is_u64());
}

#[test]
fn exec_plain_mode_exits_with_the_command_status_and_124_on_timeout() {
    if !native_or_skip("exec_plain_mode_exit_status") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let out = skillbox(data.path(), &["exec", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = skillbox(
        data.path(),
        &["exec", "--timeout", "300ms", "--", "sleep", "30"],
    );
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    let out = skillbox(data.path(), &["exec", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(137));
    let out = skillbox(data.path(), &["exec", "--", "no-such-program-here"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("command not found"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn exec_memory_and_pids_flags_are_enforced() {
    if !native_or_skip("exec_memory_and_pids_flags") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let out = skillbox(
        data.path(),
        &[
            "exec",
            "--json",
            "--memory",
            "64M",
            "--",
            "python3",
            "-c",
            "x = bytearray(512 * 1024 * 1024); print('allocated')",
        ],
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !json["stdout"].as_str().unwrap().contains("allocated"),
        "{json}"
    );
    assert_ne!(json["exitCode"], 0, "{json}");
    let cgroup_memory = skillbox_native::probe().layers["memory_limit"]
        .detail
        .contains("cgroup");
    if cgroup_memory {
        assert_eq!(json["limitHit"], "memory", "{json}");
    }
    let out = skillbox(
        data.path(),
        &[
            "exec",
            "--json",
            "--pids",
            "8",
            "--",
            "sh",
            "-c",
            "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait",
        ],
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        json["stderr"].as_str().unwrap().contains("fork") || json["limitHit"] == "pids",
        "{json}"
    );
}

#[test]
fn doctor_json_lists_each_native_layer() {
    let data = tempfile::tempdir().unwrap();
    let out = skillbox(data.path(), &["doctor", "--json"]);
    assert!(out.status.success());
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    let backends = json["backends"].as_array().unwrap();
    let names: Vec<&str> = backends
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["native", "host", "docker", "gvisor", "wasm"]);
    for backend in backends {
        assert!(backend["available"].is_boolean());
        assert!(backend.get("reason").is_some());
        assert!(backend["layers"].is_object());
    }
    let layers = backends[0]["layers"].as_object().unwrap();
    for layer in [
        "user_ns",
        "pid_ns",
        "net_ns",
        "mount_ns",
        "ipc_ns",
        "uts_ns",
        "landlock",
        "seccomp",
        "cgroup",
        "rlimits",
        "memory_limit",
        "pids_limit",
    ] {
        let entry = layers
            .get(layer)
            .unwrap_or_else(|| panic!("layer {layer} missing"));
        assert!(
            entry["available"].is_boolean() && entry["detail"].is_string(),
            "{layer}: {entry}"
        );
    }
    // wasm lists its own layers and the native ones it runs inside.
    let wasm = backends[4]["layers"].as_object().unwrap();
    for layer in ["wasmtime", "guests", "native sandbox", "native: seccomp"] {
        assert!(wasm.contains_key(layer), "{layer}: {}", backends[4]);
    }
    // The container backends list what they checked.
    for backend in &backends[2..4] {
        let layers = backend["layers"].as_object().unwrap();
        assert!(layers.contains_key("daemon"), "{backend}");
    }
    // How serve previews slides here: PNG exactly when both programs are on PATH.
    let on_path = |name: &str| {
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|dir| dir.join(name).is_file())
    };
    let png = on_path("soffice") && on_path("pdftoppm");
    assert_eq!(json["previews"]["png"], png, "{}", json["previews"]);
    let detail = json["previews"]["detail"].as_str().unwrap();
    assert!(
        if png {
            detail.contains("soffice")
        } else {
            detail.contains("apt-get install")
        },
        "{detail}"
    );
}

/// One clear line on stderr and exit 2 for each kind of bad usage.
#[test]
fn bad_usage_is_one_line_and_exit_2() {
    let data = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["exec", "--backend", "bogus", "--", "true"], "bogus"),
        (&["exec", "--timeout", "soon", "--", "true"], "soon"),
        (&["exec", "--memory", "lots", "--", "true"], "lots"),
        (
            &["exec", "--workdir", "/no/such/dir", "--", "true"],
            "/no/such/dir",
        ),
        (&["exec"], "CMD"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, needle) in cases {
        let out = skillbox(data.path(), args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// As root, a root-owned `--workdir` is shown to the sandbox through an idmapped mount:
/// the sandbox is never root, yet reads and writes the directory as its owner; what it
/// makes is root-owned on the host, and it cannot make a setuid file there. A user's
/// directory of root's group runs as that user and nogroup, never root's group.
#[test]
fn a_root_owned_workdir_is_idmapped_never_root() {
    if !is_root() {
        skillbox_env::testkit::skip("a_root_owned_workdir_is_idmapped", "needs root");
        return;
    }
    if !native_or_skip("a_root_owned_workdir_is_idmapped") {
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("mine.txt"), "root's own\n").unwrap();
    std::fs::set_permissions(
        work.path().join("mine.txt"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    // Root with supplementary groups (adm, sudo): none of them may reach the sandbox.
    let out = Command::new("setpriv")
        .args(["--groups=4,27", "--"])
        .arg(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .args(["exec", "--workdir"])
        .arg(work.path())
        .args([
            "--",
            "sh",
            "-c",
            "id -u; id -G; cat mine.txt; echo made > new.txt; chmod u+s new.txt || echo no-setuid",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    // `id -G` is the sandbox's own group only: root's supplementary groups are dropped.
    assert_eq!(text(&out.stdout), "1000\n1000\nroot's own\nno-setuid\n");
    let made = std::fs::metadata(work.path().join("new.txt")).unwrap();
    assert_eq!(
        (made.uid(), made.gid()),
        (0, 0),
        "written as the directory's owner"
    );
    assert_eq!(made.mode() & 0o6000, 0);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(work.path().to_str().unwrap()),
        "no mount left on the host"
    );

    // A user's directory of root's group: the sandbox is that user, never of root's
    // group (it runs as nogroup, so a root-group file there stays closed to it).
    std::os::unix::fs::chown(work.path(), Some(4242), Some(0)).unwrap();
    std::fs::write(work.path().join("roots-group.txt"), "root's group\n").unwrap();
    std::fs::set_permissions(
        work.path().join("roots-group.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    let out = skillbox(
        data.path(),
        &[
            "exec",
            "--workdir",
            work.path().to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "cat roots-group.txt || echo closed; echo made > grouped.txt",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "closed\n", "{}", text(&out.stderr));
    let made = std::fs::metadata(work.path().join("grouped.txt")).unwrap();
    assert_eq!((made.uid(), made.gid()), (4242, 65534));
}

/// The sandbox as an ordinary user: no root, no cgroup delegation.
#[test]
fn exec_works_as_an_unprivileged_user() {
    if !is_root() {
        // Already unprivileged: the other tests cover this user.
        skillbox_env::testkit::skip(
            "exec_works_as_an_unprivileged_user",
            "needs root to switch to uid 65534",
        );
        return;
    }
    if !native_or_skip("exec_works_as_an_unprivileged_user") {
        return;
    }
    // The test binary may live under a directory nobody cannot enter: copy it out.
    let place = tempfile::tempdir().unwrap();
    let bin = place.path().join("skillbox");
    std::fs::copy(BIN, &bin).unwrap();
    let data = place.path().join("data");
    std::fs::create_dir(&data).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&data, Some(65534), Some(65534)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .arg("--data-dir")
        .arg(&data)
        .args([
            "exec",
            "--json",
            "--",
            "sh",
            "-c",
            "id -u; echo hi > /workspace/x && cat /workspace/x; cat /etc/shadow",
        ])
        .env("HOME", &data)
        .output()
        .expect("run setpriv");
    assert!(
        out.status.success(),
        "skillbox as uid 65534: {}",
        text(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["stdout"], "1000\nhi\n", "{json}");
    assert_eq!(json["exitCode"], 1, "{json}");
    // With no memory cgroup for this user the bound is RLIMIT_AS: node, which reserves
    // more address space than 256 MiB before it runs a line, crashes, and stderr says
    // why and what to do; a command that just fails gets no such note.
    let run = |memory: &str, argv: &[&str]| -> Value {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .arg("--data-dir")
            .arg(&data)
            .args(["exec", "--json", "--memory", memory, "--"])
            .args(argv)
            .env("HOME", &data)
            .output()
            .expect("run setpriv");
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}: {}", text(&out.stderr)))
    };
    let crashed = run("256M", &["node", "-e", "console.log(1)"]);
    assert_eq!(crashed["signal"], libc::SIGTRAP, "{crashed}");
    let said = crashed["stderr"].as_str().unwrap();
    assert!(
        said.contains("node crashed (SIGTRAP) under a memory bound of 256 MiB")
            && said.contains("RLIMIT_AS")
            && said.contains("raise --memory"),
        "{crashed}"
    );
    let failed = run("256M", &["python3", "-c", "import sys; sys.exit(3)"]);
    assert_eq!(failed["exitCode"], 3, "{failed}");
    assert!(
        !failed["stderr"].as_str().unwrap().contains("RLIMIT_AS"),
        "{failed}"
    );
    let fine = run("1G", &["node", "-e", "console.log(1)"]);
    assert_eq!(fine["stdout"], "1\n", "{fine}");
    assert_eq!(fine["stderr"], "", "{fine}");
    let doctor = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .arg("--data-dir")
        .arg(&data)
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let json: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let native = &json["backends"][0];
    assert_eq!(native["available"], true, "{native}");
    assert!(
        native["layers"]["memory_limit"]["detail"]
            .as_str()
            .unwrap()
            .contains("rlimit"),
        "{native}"
    );
}

/// The data dir is ours alone: no guessable fallback under /tmp, and one another user
/// owns, or can write to, is refused before anything is put in it.
#[test]
fn the_data_dir_is_ours_alone() {
    // Without HOME or SKILLBOX_DATA: an error that says what to set, and nothing made
    // under /tmp.
    let out = Command::new(BIN)
        .args(["exec", "--", "true"])
        .env_remove("HOME")
        .env_remove("SKILLBOX_DATA")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("SKILLBOX_DATA") && err.contains("--data-dir"),
        "{err}"
    );
    // SAFETY: getuid has no preconditions.
    let guess = std::env::temp_dir().join(format!("skillbox-{}", unsafe { libc::getuid() }));
    assert!(!guess.exists(), "{} was made", guess.display());

    // A new one is made 0700.
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let place = tempfile::tempdir().unwrap();
    let fresh = place.path().join("fresh/data");
    let out = skillbox(&fresh, &["doctor", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);

    // World-writable: refused, named, with the fix.
    let open = place.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = skillbox(&open, &["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("chmod go-w") && err.contains("open"), "{err}");
    assert_eq!(
        std::fs::read_dir(&open).unwrap().count(),
        0,
        "something was put in it"
    );

    if !is_root() {
        skillbox_env::testkit::skip(
            "the_data_dir_is_ours_alone (another user's dir)",
            "needs root to make a directory another user owns",
        );
        return;
    }
    // Pre-created by another user, with a planted subdir: refused, left as it was.
    let theirs = place.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::create_dir(theirs.join("native")).unwrap();
    for path in [theirs.clone(), theirs.join("native")] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    let out = skillbox(&theirs, &["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("uid 65534"), "{err}");
    let names: Vec<_> = std::fs::read_dir(&theirs)
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(names, ["native"], "something was put in it");
    // Ours, but a directory in it is another user's: refused too.
    let ours = place.path().join("ours");
    std::fs::create_dir(&ours).unwrap();
    std::fs::set_permissions(&ours, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(ours.join("objects")).unwrap();
    std::os::unix::fs::chown(ours.join("objects"), Some(65534), Some(65534)).unwrap();
    let out = skillbox(&ours, &["exec", "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("objects"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 38, row 7: a 0755 data dir was accepted and everything in it made 0644/0755,
/// so host uid 65534 (the user every sandbox runs as, under root) read a stored
/// artifact with `setpriv --reuid 65534 cat`. After a run in such a data dir, the dir is
/// 0700, what skillbox stored is 0600 in 0700 directories, and the same `cat` fails.
#[test]
fn a_stored_artifact_is_not_readable_by_the_sandbox_s_host_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let test = "a_stored_artifact_is_not_readable_by_the_sandbox_s_host_user";
    if !is_root() {
        skillbox_env::testkit::skip(test, "needs root to read as uid 65534 (setpriv)");
        return;
    }
    if !native_or_skip(test) {
        return;
    }
    let place = tempfile::tempdir().unwrap();
    let data = place.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = place.path().join("report.sh");
    std::fs::write(
        &script,
        "echo 'quarterly numbers: 42' > /workspace/report.txt\n",
    )
    .unwrap();
    let out = skillbox(&data, &["run", "--json", script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let sha256 = result["files"][0]["sha256"].as_str().unwrap().to_string();
    let object = data
        .join("objects/objects")
        .join(&sha256[..2])
        .join(&sha256);
    assert_eq!(
        std::fs::read_to_string(&object).unwrap(),
        "quarterly numbers: 42\n"
    );

    let as_nobody = |path: &Path| {
        Command::new("setpriv")
            .args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "cat",
            ])
            .arg(path)
            .output()
            .unwrap()
    };
    let read = as_nobody(&object);
    assert!(!read.status.success(), "uid 65534 read the artifact");
    assert!(!text(&read.stdout).contains("quarterly"));
    assert_eq!(std::fs::metadata(&data).unwrap().mode() & 0o7777, 0o700);
    // Opened again (an operator's chmod): what is in it is private still, and the next
    // command makes it 0700 again, saying so now that it holds something.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut open_to_others = Vec::new();
    let mut pending = vec![data.join("objects")];
    pending.extend(
        ["records.sqlite", "snapshots.sqlite", "object-owners.sqlite"]
            .iter()
            .map(|name| data.join(name))
            .filter(|path| path.exists()),
    );
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        if meta.mode() & 0o077 != 0 {
            open_to_others.push(format!("{} {:o}", path.display(), meta.mode() & 0o7777));
        }
        if meta.is_dir() {
            pending.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
    }
    assert_eq!(open_to_others, Vec::<String>::new());
    let read = as_nobody(&object);
    assert!(!read.status.success(), "uid 65534 read the artifact");
    let out = skillbox(&data, &["run", "--json", script.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("made 0700"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::metadata(&data).unwrap().mode() & 0o7777, 0o700);
}

/// `skillbox` killed mid-run: the sandbox dies with it, and the next run sweeps what the
/// dead process could not clean up (its sandbox dir and cgroups). Without a disk bound,
/// so that there is a host dir to sweep: with one, the workspace is a tmpfs on no host
/// path, freed by the kernel with the process.
#[test]
fn a_killed_skillbox_takes_its_sandbox_with_it_and_the_next_run_sweeps() {
    if !native_or_skip("a_killed_skillbox_takes_its_sandbox_with_it") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let marker = format!("{}", 970_000_000 + std::process::id());
    let mut child = Command::new(BIN)
        .arg("--data-dir")
        .arg(data.path())
        .args([
            "exec",
            "--disk",
            "none",
            "--",
            "sh",
            "-c",
            &format!("echo started; sleep {marker}"),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    read_started(&mut child);
    let skillbox_pid = child.id();
    child.kill().unwrap();
    child.wait().unwrap();
    // The sleeper must go (bounded poll: the kernel delivers the parent-death signal).
    let needle = format!("sleep {marker}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !skillbox_env::testkit::host_processes_with(&needle).is_empty()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let left = skillbox_env::testkit::host_processes_with(&needle);
    assert!(left.is_empty(), "the sandbox outlived skillbox: {left:?}");
    // The dead process left its sandbox dir; the next run removes it.
    let leftovers = |prefix: &str| -> Vec<String> {
        std::fs::read_dir(data.path().join("native"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect()
    };
    let prefix = format!("{skillbox_pid}.");
    assert!(
        !leftovers(&prefix).is_empty(),
        "expected the killed run's sandbox dir"
    );
    let out = skillbox(data.path(), &["exec", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        leftovers(&prefix).is_empty(),
        "the next run must sweep the dead run's dir"
    );
    // And its cgroups, where this host gives cgroups.
    let cgroup_name = format!("skillbox-{skillbox_pid}.");
    for controller in ["memory", "pids"] {
        let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
            continue;
        };
        let Some(path) = own.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            names
                .split(',')
                .any(|n| n == controller)
                .then(|| path.to_string())
        }) else {
            continue;
        };
        let dir = Path::new("/sys/fs/cgroup")
            .join(controller)
            .join(path.trim_start_matches('/'));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let stale: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&cgroup_name))
            .collect();
        assert!(stale.is_empty(), "stale {controller} cgroups: {stale:?}");
    }
}

/// SIGTERM (`kill`, `timeout`) and SIGHUP (a closed terminal) end `exec` and `run` as
/// Ctrl-C does: the sandbox is removed before skillbox exits, nothing is left to sweep.
#[test]
fn exec_and_run_stopped_by_sigterm_or_sighup_remove_their_sandbox() {
    if !native_or_skip("exec_and_run_stopped_by_sigterm_or_sighup_remove_their_sandbox") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let script = data.path().join("nap.sh");
    for (signal, command) in [
        (libc::SIGTERM, "exec"),
        (libc::SIGHUP, "exec"),
        (libc::SIGTERM, "run"),
    ] {
        let marker = format!("4.{}{signal}", std::process::id());
        std::fs::write(&script, format!("sleep {marker}")).unwrap();
        let mut skillbox = Command::new(BIN);
        skillbox.arg("--data-dir").arg(data.path()).arg(command);
        if command == "exec" {
            skillbox.args([
                "--disk",
                "none",
                "--",
                "sh",
                "-c",
                &format!("sleep {marker}"),
            ]);
        } else {
            skillbox.arg(&script).args(["--disk", "none"]);
        }
        let child = skillbox
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        wait_for("the command", || process_running(&["sleep", &marker]));
        // SAFETY: signalling the child this test started.
        unsafe { libc::kill(pid as i32, signal) };
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(125),
            "{command} after signal {signal}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("cancelled"),
            "{}",
            text(&out.stderr)
        );
        assert!(process_running(&["sleep", &marker]).is_none());
        let owner = format!("{pid}.");
        let dirs: Vec<String> = std::fs::read_dir(data.path().join("native"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&owner))
            .collect();
        assert_eq!(
            dirs,
            Vec::<String>::new(),
            "{command} after signal {signal}"
        );
        let cgroups = Command::new("find")
            .args(["/sys/fs/cgroup", "-maxdepth", "6", "-name"])
            .arg(format!("skillbox-{owner}*"))
            .output()
            .unwrap();
        assert_eq!(text(&cgroups.stdout), "", "{command} after signal {signal}");
    }
}

/// Reads the first line of `child`'s stdout: `started`, which its sandboxed command
/// prints once it runs.
fn read_started(child: &mut std::process::Child) {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "started\n");
}

/// `skillbox --data-dir DATA ARGS` as pid 1 of a pid namespace of its own (`unshare`).
fn as_pid_1(data: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--pid", "--fork", "--mount-proc", BIN, "--data-dir"])
        .arg(data)
        .args(args);
    command
}

/// The cgroup leaves of the owner `tag` on this machine, one path a line.
fn cgroups_named(tag: &str) -> String {
    let found = Command::new("find")
        .args(["/sys/fs/cgroup", "-maxdepth", "6", "-name"])
        .arg(format!("skillbox-{tag}-*"))
        .output()
        .unwrap();
    text(&found.stdout)
}

/// Waits until no host process has `needle` in its command line: a killed run's
/// sandbox dies with it (the kernel delivers the parent-death signal).
fn wait_for_none_with(needle: &str) {
    wait_for("the killed run's sandbox to end", || {
        skillbox_env::testkit::host_processes_with(needle)
            .is_empty()
            .then_some(())
    });
}

/// A skillbox that is pid 1 of its pid namespace (a server in a container) has the same
/// pid after every restart: killed mid-run, its sandbox dir and cgroups must still be
/// swept by the next one, not kept because a process with their pid runs (its own).
/// Each `unshare --pid` is a new namespace, mostly with another inode, so the next pid 1
/// mostly judges the killed one by its claim and locks; when the kernel hands out the
/// same inode again, by its start time (the unit tests of `skillbox_env::owner` pin
/// both ways).
#[test]
fn a_killed_pid_1_skillbox_is_swept_by_the_next_pid_1() {
    if !native_or_skip("a_killed_pid_1_skillbox_is_swept_by_the_next_pid_1") {
        return;
    }
    if !is_root() {
        skillbox_env::testkit::skip(
            "a_killed_pid_1_skillbox_is_swept_by_the_next_pid_1",
            "a pid namespace of its own needs root",
        );
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let marker = format!("{}", 950_000_000 + std::process::id());
    let mut unshare = as_pid_1(
        data.path(),
        &[
            "exec",
            "--disk",
            "none",
            "--",
            "sh",
            "-c",
            &format!("echo started; sleep {marker}"),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    read_started(&mut unshare);
    // skillbox is unshare's one child, pid 1 inside: killing it ends the namespace.
    let skillbox_pid = wait_for("skillbox under unshare", || {
        children_of(unshare.id()).first().map(|(pid, _)| *pid)
    });
    // SAFETY: signalling the child of the unshare this test started.
    unsafe { libc::kill(skillbox_pid as i32, libc::SIGKILL) };
    unshare.wait().unwrap();
    // The sandbox dies with it (the kernel delivers the parent-death signal); only then
    // are its cgroups empty enough to remove.
    let needle = format!("sleep {marker}");
    wait_for_none_with(&needle);
    // The killed run's owner tag, from its sandbox dir (this test's data dir alone):
    // other tests' live pid-1 skillboxes have cgroups named `skillbox-1.…` too.
    let tag = std::fs::read_dir(data.path().join("native"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("1."))
        .and_then(|n| n.split('-').next().map(str::to_string))
        .expect("the killed run's sandbox dir");
    let left_by_pid_1 = || -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir(data.path().join("native"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&format!("{tag}-")))
            .collect();
        left.extend(cgroups_named(&tag).lines().map(str::to_string));
        left
    };
    assert!(
        !left_by_pid_1().is_empty(),
        "expected the killed run's sandbox dir and cgroups"
    );
    let out = as_pid_1(data.path(), &["exec", "--disk", "none", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        left_by_pid_1(),
        Vec::<String>::new(),
        "the next pid 1 must sweep what the killed pid 1 left"
    );
}

/// A skillbox in a pid namespace of its own (a server in a container whose data dir is
/// a volume) and one on the host share a data dir. The host's pids say nothing of the
/// other's: its sandbox dir, named by pid 1 there, is kept while that skillbox runs
/// (judged by its claim, not by the host's pid 1), and swept once it is killed.
#[test]
fn a_live_skillbox_in_another_pid_namespace_keeps_its_sandbox_from_the_host_s_sweep() {
    let test = "a_live_skillbox_in_another_pid_namespace_keeps_its_sandbox";
    if !native_or_skip(test) {
        return;
    }
    if !is_root() {
        skillbox_env::testkit::skip(test, "a pid namespace of its own needs root");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let marker = format!("{}", 940_000_000 + std::process::id());
    let mut unshare = as_pid_1(
        data.path(),
        &[
            "exec",
            "--disk",
            "none",
            "--",
            "sh",
            "-c",
            &format!("echo started; sleep {marker}"),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    read_started(&mut unshare);
    // skillbox is unshare's one child, pid 1 inside: killing it ends the namespace,
    // which the guard does if an assertion fails first.
    struct Killed(u32);
    impl Drop for Killed {
        fn drop(&mut self) {
            // SAFETY: signalling the child of the unshare this test started.
            unsafe { libc::kill(self.0 as i32, libc::SIGKILL) };
        }
    }
    let skillbox_pid = Killed(wait_for("skillbox under unshare", || {
        children_of(unshare.id()).first().map(|(pid, _)| *pid)
    }));
    let left_by_pid_1 = || -> Vec<String> {
        std::fs::read_dir(data.path().join("native"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("1."))
            .collect()
    };
    let theirs = left_by_pid_1();
    assert_eq!(
        theirs.len(),
        1,
        "expected the running sandbox's dir: {theirs:?}"
    );
    let tag = theirs[0].split('-').next().unwrap().to_string();
    let cgroups = || cgroups_named(&tag);
    let needle = format!("sleep {marker}");
    let out = skillbox(data.path(), &["exec", "--disk", "none", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        left_by_pid_1(),
        theirs,
        "the host's run must not take a live sandbox of another pid namespace for a dead one's"
    );
    assert_ne!(cgroups(), "", "the live run's cgroups");
    assert!(
        !skillbox_env::testkit::host_processes_with(&needle).is_empty(),
        "the other namespace's run goes on"
    );
    // Killed, it is gone, and the host's next run sweeps what it left.
    drop(skillbox_pid);
    unshare.wait().unwrap();
    wait_for_none_with(&needle);
    let out = skillbox(data.path(), &["exec", "--disk", "none", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        left_by_pid_1(),
        Vec::<String>::new(),
        "the host's next run must sweep what the killed one left"
    );
    // Its cgroups too, judged by their own locks, which died with it.
    assert_eq!(cgroups(), "", "the killed run's cgroups");
}

/// Ctrl-C during the first install of the Node runtime (`npm ci`, seconds long) ends
/// skillbox before it can remove the install's temp dir; the next install removes it.
#[test]
fn an_interrupted_runtime_install_is_swept_by_the_next() {
    if !std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|dir| dir.join("npm").is_file())
    {
        skillbox_env::testkit::skip("an_interrupted_runtime_install_is_swept", "no npm");
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let staging = || -> Vec<String> {
        std::fs::read_dir(data.path().join("runtimes"))
            .map(|dir| {
                dir.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(".node-install-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let setup = || {
        let mut command = Command::new(BIN);
        command
            .arg("--data-dir")
            .arg(data.path())
            .args(["setup", "--no-wasm"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        command
    };
    // A group of its own, signalled whole, as a terminal's Ctrl-C does.
    let mut first = setup().process_group(0).spawn().unwrap();
    let npm = wait_for("npm ci under skillbox setup", || {
        children_of(first.id())
            .into_iter()
            .find(|(_, cmdline)| cmdline.starts_with("npm"))
            .map(|(pid, _)| pid)
    });
    // SAFETY: signalling the process group this test started.
    unsafe { libc::kill(-(first.id() as i32), libc::SIGINT) };
    assert!(!first.wait().unwrap().success());
    wait_for("npm to end", || (!running(npm)).then_some(()));
    assert!(
        !staging().is_empty(),
        "the interrupted install left nothing"
    );
    let out = setup().output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(staging(), Vec::<String>::new());
}

/// The Node runtime is installed once for these tests (npm ci), not per test.
fn shared_data_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("skillbox-cli-tests")
}

/// `--disk none` on run, agent and serve, as on exec: no bound, where `--disk 2M` stops
/// a 3 MB write; an inode bound without a disk bound is bad usage, as is
/// `run --remote --disk none`.
#[test]
fn run_agent_and_serve_take_disk_none() {
    if !native_or_skip("run_agent_and_serve_take_disk_none") {
        return;
    }
    // `run`: a 3 MB write fails under a 2 MB bound and not without one.
    let script = tempfile::Builder::new().suffix(".sh").tempfile().unwrap();
    std::fs::write(
        script.path(),
        "head -c 3000000 /dev/zero > /workspace/.big && echo wrote\n",
    )
    .unwrap();
    let script = script.path().to_str().unwrap();
    let run = |disk: &str| -> Value {
        let result = skillbox(
            &shared_data_dir(),
            &["run", "--json", script, "--disk", disk],
        );
        serde_json::from_slice(&result.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&result.stderr)))
    };
    let bounded = run("2M");
    assert_eq!(bounded["limitHit"], "disk", "{bounded}");
    let unbounded = run("none");
    assert_eq!(unbounded["exitCode"], 0, "{unbounded}");
    assert_eq!(unbounded["stdout"], "wrote\n", "{unbounded}");
    let result = skillbox(
        &shared_data_dir(),
        &[
            "run",
            script,
            "--disk",
            "none",
            "--remote",
            "http://127.0.0.1:9",
        ],
    );
    assert_eq!(result.status.code(), Some(2), "{}", text(&result.stderr));
    assert!(text(&result.stderr).contains("--disk none"));

    // `agent`: the demo's good script, after a 3 MB scratch file in the workspace (a
    // Node script writes nowhere else): a scripted model that gives up if that fails.
    let pptx = skillbox_agent::builtin_skill("pptx").unwrap();
    let demo: Value = serde_json::from_str(pptx.transcript.unwrap()).unwrap();
    let deck = demo["turns"][1]["toolCalls"][0]["arguments"]["script"]
        .as_str()
        .unwrap();
    let transcript = serde_json::json!({"turns": [
        {"text": "A big scratch file, then the deck.", "toolCalls": [{"name": "run_script", "arguments": {
            "language": "node",
            "script": format!("require('fs').writeFileSync('/workspace/.big', Buffer.alloc(3000000));\n{deck}"),
        }}]},
        {"expect": {"exitCode": 0, "filesInclude": "workspacex.pptx"}, "text": "Done."},
    ]});
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), transcript.to_string()).unwrap();
    let agent = |disk: &str| -> Value {
        let args = [
            "agent",
            "a deck",
            "--json",
            "--max-attempts",
            "1",
            "--disk",
            disk,
            "--transcript",
            file.path().to_str().unwrap(),
        ];
        let result = skillbox(&shared_data_dir(), &args);
        serde_json::from_slice(&result.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&result.stderr)))
    };
    let unbounded = agent("none");
    assert_eq!(unbounded["status"], "succeeded", "{unbounded}");
    let bounded = agent("2M");
    assert_ne!(bounded["status"], "succeeded", "{bounded}");
    assert!(
        bounded["attempts"][0]["stderr"]
            .as_str()
            .is_some_and(|e| e.contains("ENOSPC")),
        "{bounded}"
    );

    // `exec` and `serve`: an inode bound needs a disk bound.
    let result = skillbox(
        &shared_data_dir(),
        &["exec", "--disk", "none", "--inodes", "100", "--", "true"],
    );
    assert_eq!(result.status.code(), Some(2), "{}", text(&result.stderr));
    assert!(
        text(&result.stderr).contains("--inodes bounds a disk"),
        "{}",
        text(&result.stderr)
    );
    let result = skillbox(
        &shared_data_dir(),
        &[
            "serve",
            "--disk",
            "none",
            "--inodes",
            "100",
            "--addr",
            "127.0.0.1:0",
        ],
    );
    assert_eq!(result.status.code(), Some(2));
    assert!(
        text(&result.stderr).contains("diskInodes bounds a disk"),
        "{}",
        text(&result.stderr)
    );
}

/// The README's main command: a real deck out of `skillbox run`.
#[test]
fn run_makes_the_example_deck() {
    if !native_or_skip("run_makes_the_example_deck") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let result = skillbox(
        &shared_data_dir(),
        &[
            "run",
            example("workspacex-deck.js").to_str().unwrap(),
            "--out",
            out.path().to_str().unwrap(),
            "--outputs",
            "*.pptx",
        ],
    );
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert_eq!(text(&result.stdout), "wrote workspacex.pptx\n");
    assert!(
        text(&result.stderr).contains("made "),
        "{}",
        text(&result.stderr)
    );
    assert_workspacex_deck(&out.path().join("workspacex.pptx"));
    // --json is the same object as POST /v1/run.
    let result = skillbox(
        &shared_data_dir(),
        &[
            "run",
            "--json",
            example("workspacex-deck.js").to_str().unwrap(),
        ],
    );
    let json: Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(json["exitCode"], 0);
    assert_eq!(json["files"][0]["path"], "workspacex.pptx");
    assert!(
        json["files"][0]["url"]
            .as_str()
            .unwrap()
            .starts_with("/v1/objects/")
    );
    // A script error is the script's exit status, with its stderr.
    let bad = tempfile::Builder::new().suffix(".js").tempfile().unwrap();
    std::fs::write(bad.path(), "throw new Error('boom from the script')").unwrap();
    let result = skillbox(&shared_data_dir(), &["run", bad.path().to_str().unwrap()]);
    assert_eq!(result.status.code(), Some(1));
    assert!(
        text(&result.stderr).contains("boom from the script"),
        "{}",
        text(&result.stderr)
    );
    // Bad usage: one line, exit 2.
    let result = skillbox(&shared_data_dir(), &["run", "/no/such/script.js"]);
    assert_eq!(result.status.code(), Some(2));
    let result = skillbox(
        &shared_data_dir(),
        &["run", bad.path().to_str().unwrap(), "--lang", "cobol"],
    );
    assert_eq!(result.status.code(), Some(2));
}

/// A script names its files as it likes: a name with ESC, CR, a newline or a bidi
/// override is printed escaped in skillbox's own lines (so it cannot erase them or fake
/// one), copied out under its exact name, and given exactly in --json.
#[test]
fn run_prints_control_characters_in_file_names_escaped() {
    if !native_or_skip("run_prints_control_characters_in_file_names_escaped") {
        return;
    }
    let forged = "report\x1b[2K\rskillbox run: all files verified, nothing else written\x1b[8m.txt";
    let split = "two\nlines.txt";
    let reversed = "invoice\u{202e}fdp.txt";
    // The text of an escape, not an ESC: shown with its backslash doubled.
    let lookalike = "looks\\x1b[8m.txt";
    let script = tempfile::Builder::new().suffix(".sh").tempfile().unwrap();
    std::fs::write(
        script.path(),
        concat!(
            "cd /workspace\n",
            "printf x > \"$(printf 'report\\033[2K\\rskillbox run: all files verified, nothing else written\\033[8m.txt')\"\n",
            "printf x > \"$(printf 'two\\nlines.txt')\"\n",
            "printf x > \"$(printf 'invoice\\342\\200\\256fdp.txt')\"\n",
            "printf x > 'looks\\x1b[8m.txt'\n",
        ),
    )
    .unwrap();
    let script = script.path().to_str().unwrap();
    let out = tempfile::tempdir().unwrap();
    let result = skillbox(
        &shared_data_dir(),
        &[
            "run",
            script,
            "--out",
            out.path().to_str().unwrap(),
            "--outputs",
            "*",
        ],
    );
    let stderr = text(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(!stderr.contains(['\x1b', '\r', '\u{202e}']), "{stderr:?}");
    for shown in [
        "report\\x1b[2K\\rskillbox run: all files verified, nothing else written\\x1b[8m.txt",
        "two\\nlines.txt",
        "invoice\\u{202e}fdp.txt",
        "looks\\\\x1b[8m.txt",
    ] {
        let made = stderr
            .lines()
            .find(|line| line.contains(shown))
            .unwrap_or_else(|| panic!("no line shows {shown:?}: {stderr:?}"));
        assert!(made.starts_with("skillbox run: made "), "{made:?}");
    }
    assert!(
        !stderr.lines().any(|line| line.starts_with("lines.txt")),
        "a newline in a name starts no line: {stderr:?}"
    );
    for name in [forged, split, reversed, lookalike] {
        assert_eq!(
            std::fs::read(out.path().join(name)).unwrap(),
            b"x",
            "{name:?}"
        );
    }
    // --json: the exact names.
    let result = skillbox(&shared_data_dir(), &["run", "--json", script]);
    let json: Value = serde_json::from_slice(&result.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&result.stderr)));
    let mut paths: Vec<&str> = json["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    paths.sort_unstable();
    let mut expected = vec![forged, split, reversed, lookalike];
    expected.sort_unstable();
    assert_eq!(paths, expected);
}

/// `skillbox serve` on the shared data dir, a free loopback port and `extra` flags, once
/// it accepts.
fn start_serve(extra: &[&str]) -> (std::process::Child, String) {
    let mut skillbox = Command::new(BIN);
    skillbox.arg("--data-dir").arg(shared_data_dir());
    common::start_serve(skillbox, extra)
}

/// `skillbox serve` as a real process, and `skillbox run --remote` through the client.
#[test]
fn run_remote_goes_through_serve() {
    if !native_or_skip("run_remote_goes_through_serve") {
        return;
    }
    let (mut server, addr) = start_serve(&[]);
    let out = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let result = skillbox(
        other.path(),
        &[
            "run",
            example("workspacex-deck.js").to_str().unwrap(),
            "--remote",
            &format!("http://{addr}"),
            "--out",
            out.path().to_str().unwrap(),
            "--outputs",
            "*.pptx",
        ],
    );
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert_workspacex_deck(&out.path().join("workspacex.pptx"));
    assert!(
        status.success(),
        "serve should stop cleanly on SIGTERM: {status:?}"
    );
}

/// The pids whose parent is `parent`, with their command lines.
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let pids = std::fs::read_dir("/proc").unwrap().flatten();
    pids.filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(parent))
        .map(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            (pid, String::from_utf8_lossy(&cmdline).replace('\0', " "))
        })
        .collect()
}

/// Whether `pid` still runs (gone, or a zombie waiting for its reaper, is not running).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat[stat.rfind(')').unwrap()..].starts_with(") Z"))
}

fn wait_for<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "waited a minute for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The parent pid of `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(1)?.parse().ok()
}

/// The process running exactly `argv`.
fn process_running(argv: &[&str]) -> Option<u32> {
    let wanted: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            (std::fs::read(format!("/proc/{pid}/cmdline")).ok()? == wanted).then_some(pid)
        })
}

/// `serve` has its native sandboxes cloned by its spawner process (a small copy of the
/// binary, holding no fd but its stdio), as the server's own children (`CLONE_PARENT`).
/// The spawner process's death ends no run, and later runs are cloned by the server;
/// when the server is killed, the spawner process and every sandbox go with it.
#[test]
fn serve_clones_sandboxes_in_its_spawner_process_and_none_outlives_it() {
    if !native_or_skip("serve_clones_sandboxes_in_its_spawner_process") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A sleep no other test runs, found by its command line.
    let nap = format!("2.{}", std::process::id());
    let script = dir.path().join("nap.sh");
    std::fs::write(&script, format!("echo started; sleep {nap}; echo done")).unwrap();
    let remote_run = |addr: &str, script: &Path| {
        Command::new(BIN)
            .arg("--data-dir")
            .arg(dir.path().join("client"))
            .arg("run")
            .arg(script)
            .args(["--remote", &format!("http://{addr}")])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let spawner_of = |server: u32| {
        wait_for("the spawner process", || {
            children_of(server)
                .into_iter()
                .find(|(_, cmdline)| cmdline.contains("__skillbox-spawner"))
                .map(|(pid, _)| pid)
        })
    };
    // The run's init: the sleep's nearest ancestor that is a copy of the spawner process.
    let init_of_the_nap = || {
        wait_for("the run's sandbox", || {
            let mut pid = process_running(&["sleep", &nap])?;
            for _ in 0..4 {
                pid = parent_of(pid)?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                if String::from_utf8_lossy(&cmdline).contains("__skillbox-spawner") {
                    return Some(pid);
                }
            }
            None
        })
    };

    let (mut server, addr) = start_serve(&[]);
    let spawner = spawner_of(server.id());
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{spawner}/fd"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    fds.sort();
    assert_eq!(
        fds,
        ["0", "1", "2"],
        "the spawner process holds only its stdio"
    );
    // A run cloned by the spawner process is the server's child; killing the spawner
    // process ends nothing of it.
    let client = remote_run(&addr, &script);
    let init = init_of_the_nap();
    assert_eq!(
        parent_of(init),
        Some(server.id()),
        "init is the server's child"
    );
    // SAFETY: signalling a process this test found under its own server.
    unsafe { libc::kill(spawner as i32, libc::SIGKILL) };
    let result = client.wait_with_output().unwrap();
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert_eq!(text(&result.stdout), "started\ndone\n");
    // And the next run is cloned by the server.
    let result = remote_run(&addr, &script).wait_with_output().unwrap();
    assert!(result.status.success(), "{}", text(&result.stderr));
    assert_eq!(text(&result.stdout), "started\ndone\n");
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    server.wait().unwrap();

    // A killed server takes its spawner process and its sandboxes with it.
    let (mut server, addr) = start_serve(&[]);
    let spawner = spawner_of(server.id());
    let mut client = remote_run(&addr, &script);
    let init = init_of_the_nap();
    let sleeper = process_running(&["sleep", &nap]).unwrap();
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = client.wait();
    for (what, pid) in [
        ("spawner process", spawner),
        ("init", init),
        ("script", sleeper),
    ] {
        wait_for(
            &format!("the killed server's {what} ({pid}) to end"),
            || (!running(pid)).then_some(()),
        );
    }
}

/// A server killed mid-run leaves its sandbox dir (without a disk bound) and its exec
/// cgroups; the next server on the data dir removes them as it starts, before any run.
#[test]
fn a_killed_server_leaves_what_its_next_start_sweeps() {
    if !native_or_skip("a_killed_server_leaves_what_its_next_start_sweeps") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let nap = format!("3.{}", std::process::id());
    let script = dir.path().join("nap.sh");
    std::fs::write(&script, format!("echo started; sleep {nap}")).unwrap();
    let flags = ["--disk", "none", "--warm-sandboxes", "0"];
    let (mut server, addr) = start_serve(&flags);
    let mut client = Command::new(BIN)
        .arg("--data-dir")
        .arg(dir.path().join("client"))
        .arg("run")
        .arg(&script)
        .args(["--remote", &format!("http://{addr}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the run's sandbox", || process_running(&["sleep", &nap]));
    let owner = format!("{}.", server.id());
    let left = || -> Vec<String> {
        let mut left: Vec<String> = std::fs::read_dir(shared_data_dir().join("native"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(&owner))
            .collect();
        let found = Command::new("find")
            .args(["/sys/fs/cgroup", "-maxdepth", "6", "-name"])
            .arg(format!("skillbox-{owner}*"))
            .output()
            .unwrap();
        left.extend(text(&found.stdout).lines().map(str::to_string));
        left
    };
    server.kill().unwrap();
    server.wait().unwrap();
    let _ = client.wait();
    wait_for("the killed server's sandbox to end", || {
        process_running(&["sleep", &nap]).is_none().then_some(())
    });
    assert!(!left().is_empty(), "nothing was left to sweep");
    let _next = Serving(start_serve(&flags).0);
    wait_for("the next start's sweep", || left().is_empty().then_some(()));
}

/// `run --remote` against a server that has API keys: the key from `SKILLBOX_API_KEY`
/// gets the run through; without it the server's 401 is the error, named.
#[test]
fn run_remote_sends_the_api_key() {
    if !native_or_skip("run_remote_sends_the_api_key") {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let file = keys.path().join("keys");
    let made = skillbox(
        keys.path(),
        &["keys", "new", "ci", "--file", file.to_str().unwrap()],
    );
    assert!(made.status.success(), "{}", text(&made.stderr));
    let token = text(&made.stdout).trim().to_string();
    let (mut server, addr) = start_serve(&["--api-keys", file.to_str().unwrap()]);
    let script = keys.path().join("hi.sh");
    std::fs::write(&script, "echo made > out.txt; echo hi").unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let remote = |key: Option<&str>| {
        let mut command = Command::new(BIN);
        command
            .arg("--data-dir")
            .arg(keys.path().join("client"))
            .arg("run")
            .arg(&script)
            .args([
                "--remote",
                &format!("http://{addr}"),
                "--outputs",
                "*.txt",
                "--out",
            ])
            .arg(out_dir.path())
            .env_remove("SKILLBOX_API_KEY");
        if let Some(key) = key {
            command.env("SKILLBOX_API_KEY", key);
        }
        command.output().unwrap()
    };
    let refused = remote(None);
    let with_key = remote(Some(&token));
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    server.wait().unwrap();
    assert_eq!(
        refused.status.code(),
        Some(125),
        "{}",
        text(&refused.stderr)
    );
    assert!(
        text(&refused.stderr).contains("unauthenticated"),
        "{}",
        text(&refused.stderr)
    );
    assert!(with_key.status.success(), "{}", text(&with_key.stderr));
    assert_eq!(text(&with_key.stdout), "hi\n");
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("out.txt")).unwrap(),
        "made\n",
        "the download went through with the key too"
    );
}

const DEMO_PROMPT: &str = "Make a 3-slide pitch deck for WorkspaceX: a title slide, three selling points, and contact details.";

/// The README's main command: `skillbox agent` on the demo prompt with the default
/// (loopback) model prints two attempts, the first failing with the ShapeType error,
/// and writes a deck the verifier accepts.
#[test]
fn agent_on_the_demo_prompt_ships_a_verified_deck() {
    if !native_or_skip("agent_on_the_demo_prompt") {
        return;
    }
    let out = tempfile::tempdir().unwrap();
    let result = skillbox(
        &shared_data_dir(),
        &["agent", DEMO_PROMPT, "--out", out.path().to_str().unwrap()],
    );
    let stderr = text(&result.stderr);
    assert!(result.status.success(), "{stderr}");
    assert!(
        stderr.contains("scripted model"),
        "the output must say a scripted model is in use: {stderr}"
    );
    let attempts: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("attempt "))
        .collect();
    assert_eq!(attempts.len(), 2, "{stderr}");
    assert!(attempts[0].starts_with("attempt 1: exit 1"), "{stderr}");
    assert!(
        attempts[0].contains("Missing/Invalid shape parameter"),
        "{stderr}"
    );
    assert!(attempts[1].starts_with("attempt 2: ok"), "{stderr}");
    let deck =
        skillbox_pptx::verify_file(out.path().join("workspacex.pptx")).expect("a verified deck");
    assert_eq!(deck.slide_count(), 3);
    assert!(deck.contains(1, "WorkspaceX"));
    assert!(
        deck.contains(2, "Book a desk in ten seconds"),
        "{}",
        deck.text_of(2)
    );
    assert!(
        deck.contains(3, "hello@workspacex.example"),
        "{}",
        deck.text_of(3)
    );
    // --json: the outcome with every attempt recorded.
    let result = skillbox(&shared_data_dir(), &["agent", DEMO_PROMPT, "--json"]);
    let json: Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(json["status"], "succeeded");
    assert_eq!(json["attempts"].as_array().unwrap().len(), 2);
    assert_eq!(json["artifacts"][0]["path"], "workspacex.pptx");
}

#[test]
fn agent_bad_input_is_one_line_and_exit_2() {
    let data = tempfile::tempdir().unwrap();
    let bad_transcript = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(bad_transcript.path(), "{ not json").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["agent", "  "], "PROMPT"),
        (vec!["agent", "x", "--builtin", "excel"], "excel"),
        (vec!["agent", "x", "--skill", "excel"], "no skill excel"),
        (vec!["agent", "x", "--max-attempts", "0"], "max-attempts"),
        (
            vec![
                "agent",
                "x",
                "--transcript",
                bad_transcript.path().to_str().unwrap(),
            ],
            "does not parse",
        ),
        (
            vec!["agent", "x", "--transcript", "/no/such/file.json"],
            "/no/such/file.json",
        ),
    ];
    for (args, needle) in cases {
        let out = skillbox(data.path(), &args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

/// `skillbox cap`: the examples load, a host capability cannot be granted for a project
/// (only once), a sandboxed one can, and a deny wins over the grant.
#[test]
fn cap_lists_grants_and_holds_the_host_ceiling() {
    let data = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    let roots = example("capabilities");
    let cap = |args: &[&str]| {
        let mut all = vec![
            "cap",
            "--project",
            project.path().to_str().unwrap(),
            "--root",
        ];
        all.push(roots.to_str().unwrap());
        all.extend_from_slice(args);
        skillbox(data.path(), &all)
    };
    let listed = cap(&["list", "--json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let json: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let names: Vec<&str> = json["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "csv-summary",
            "fmt-json",
            "git-report",
            "http-notes",
            "json-transform",
            "wasm-word-count",
            "word-count"
        ],
        "{json}"
    );
    assert_eq!(json["errors"], serde_json::json!([]), "{json}");

    let refused = cap(&["grant", "git-report"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        text(&refused.stderr).contains("session at most"),
        "{}",
        text(&refused.stderr)
    );
    let once = cap(&["grant", "git-report", "--scope", "once"]);
    assert!(once.status.success(), "{}", text(&once.stderr));

    let granted = cap(&["grant", "word-count"]);
    assert!(granted.status.success(), "{}", text(&granted.stderr));
    let shown: Value = serde_json::from_slice(&cap(&["show", "word-count"]).stdout).unwrap();
    assert_eq!(shown["grant"], "project", "{shown}");
    assert_eq!(shown["ceiling"], "project");
    assert_eq!(shown["needs"][0], "run_capability:native", "{shown}");
    let shown: Value = serde_json::from_slice(&cap(&["show", "git-report"]).stdout).unwrap();
    assert_eq!(
        (&shown["grant"], &shown["ceiling"]),
        (&"once".into(), &"session".into())
    );

    assert!(cap(&["deny", "word-count"]).status.success());
    let shown: Value = serde_json::from_slice(&cap(&["show", "word-count"]).stdout).unwrap();
    assert_eq!(shown["grant"], "denied");
    assert!(cap(&["allow", "word-count"]).status.success());
    assert!(cap(&["revoke", "word-count"]).status.success());
    let shown: Value = serde_json::from_slice(&cap(&["show", "word-count"]).stdout).unwrap();
    assert_eq!(shown["grant"], "not granted");

    let missing = cap(&["show", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("word-count"),
        "names what there is"
    );
    let schema: Value = serde_json::from_slice(&cap(&["schema"]).stdout).unwrap();
    assert!(schema["properties"]["lifecycle"].is_object());
}

/// `skillbox warm` on `data`, once its socket answers.
fn start_warm(data: &Path, log: &Path) -> std::process::Child {
    let mut skillbox = Command::new(BIN);
    skillbox.arg("--data-dir").arg(data);
    start_warm_with(skillbox, &data.join("warm.sock"), log)
}

/// [`start_warm`] for `skillbox`, a command naming the binary and its data dir, whose
/// socket is `socket`.
fn start_warm_with(mut skillbox: Command, socket: &Path, log: &Path) -> std::process::Child {
    let mut server = skillbox
        .args(["warm", "--sandboxes", "2"])
        .env("SKILLBOX_LOG", "skillbox=debug")
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    wait_for("skillbox warm's socket", || {
        assert!(server.try_wait().unwrap().is_none(), "skillbox warm exited");
        std::os::unix::net::UnixStream::connect(socket).ok()
    });
    server
}

/// `exec` through `skillbox warm`: the same answers as without it (output, closing
/// lines, exit status, `--json`, limits, a timeout, a missing command), in sandboxes
/// the server made (init its child); a client killed ends its command; another user
/// is refused; SIGTERM leaves nothing behind.
#[test]
fn exec_through_skillbox_warm_answers_as_without_it() {
    if !native_or_skip("exec_through_skillbox_warm") {
        return;
    }
    let warm_data = tempfile::tempdir().unwrap();
    let cold_data = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("warm.log");
    let mut server = start_warm(warm_data.path(), &log);
    let cases: &[&[&str]] = &[
        &[
            "exec",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; id -u; exit 3",
        ],
        &[
            "exec",
            "--json",
            "--",
            "sh",
            "-c",
            "echo hi; echo there >&2",
        ],
        &["exec", "--timeout", "1s", "--", "sleep", "5"],
        &[
            "exec",
            "--memory",
            "64M",
            "--",
            "python3",
            "-c",
            "b = bytearray(256 << 20); print('not refused')",
        ],
        &["exec", "--pids", "none", "--", "sh", "-c", "kill -9 $$"],
        &["exec", "--", "no-such-command-here"],
        &["exec", "--timeout", "48h", "--", "true"],
    ];
    let without_duration = |out: &str| {
        let mut value: Value = serde_json::from_str(out).unwrap();
        value["durationMs"] = Value::Null;
        value
    };
    for args in cases {
        let warm = skillbox(warm_data.path(), args);
        let cold = skillbox(cold_data.path(), args);
        assert_eq!(warm.status.code(), cold.status.code(), "{args:?}");
        assert_eq!(text(&warm.stderr), text(&cold.stderr), "{args:?}");
        if args.contains(&"--json") {
            assert_eq!(
                without_duration(&text(&warm.stdout)),
                without_duration(&text(&cold.stdout)),
                "{args:?}"
            );
        } else {
            assert_eq!(text(&warm.stdout), text(&cold.stdout), "{args:?}");
        }
    }
    // Each was the server's to run (none fell back to making its own sandbox).
    let served = std::fs::read_to_string(&log)
        .unwrap()
        .matches("warm: an exec")
        .count();
    assert_eq!(
        served,
        cases.len(),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );

    // The sandbox is the server's: its init is the server's child.
    let nap = format!("3.{}", std::process::id());
    let mut client = Command::new(BIN)
        .arg("--data-dir")
        .arg(warm_data.path())
        .args(["exec", "--", "sleep", &nap])
        .spawn()
        .unwrap();
    let sleeper = wait_for("the sleep", || process_running(&["sleep", &nap]));
    let init = parent_of(sleeper).unwrap();
    assert_eq!(
        parent_of(init),
        Some(server.id()),
        "init is the server's child"
    );
    // A client that goes away ends its command.
    client.kill().unwrap();
    client.wait().unwrap();
    wait_for("the sleep ended", || (!running(sleeper)).then_some(()));
    // Ctrl-C on the client: the command ends, and the client says what it says without
    // the server.
    let interrupted = |data: &Path, nap: &str| {
        let client = Command::new(BIN)
            .arg("--data-dir")
            .arg(data)
            .args(["exec", "--", "sleep", nap])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let sleeper = wait_for("the sleep", || process_running(&["sleep", nap]));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(client.id() as i32, libc::SIGINT) };
        let out = client.wait_with_output().unwrap();
        wait_for("the sleep ended", || (!running(sleeper)).then_some(()));
        (out.status.code(), text(&out.stderr))
    };
    let warm = interrupted(warm_data.path(), &format!("4.{}", std::process::id()));
    let cold = interrupted(cold_data.path(), &format!("5.{}", std::process::id()));
    assert_eq!(warm, cold);
    assert_eq!(warm.0, Some(125), "{warm:?}");
    assert!(warm.1.contains("exec: cancelled"), "{warm:?}");

    // Another user cannot run anything through it, even where the socket is open to
    // them: the server asks the kernel who connected.
    if is_root() {
        let socket = warm_data.path().join("warm.sock");
        std::fs::set_permissions(
            warm_data.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o711),
        )
        .unwrap();
        std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let request = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "exec": {"limits": {}, "command": ["echo", "pwned"], "json": false},
        })
        .to_string();
        let probe = format!(
            "import os, socket, struct\n\
             os.setgid(65534); os.setuid(65534)\n\
             s = socket.socket(socket.AF_UNIX); s.connect({socket:?})\n\
             body = {request:?}.encode()\n\
             s.sendall(struct.pack('<I', len(body)) + body)\n\
             got = b''\n\
             while True:\n\
             \x20   b = s.recv(65536)\n\
             \x20   if not b: break\n\
             \x20   got += b\n\
             print(got)\n",
            socket = socket.to_str().unwrap()
        );
        let out = Command::new("python3")
            .args(["-c", &probe])
            .output()
            .unwrap();
        let said = text(&out.stdout);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(said.contains("serves uid 0 only"), "{said}");
        assert!(!said.contains("pwned"), "{said}");
        // Nor does a process of the same uid in another user namespace (a sandbox's
        // user is the caller's own uid when skillbox runs unprivileged).
        let nested = probe.replace("os.setgid(65534); os.setuid(65534)\n", "");
        let out = Command::new("unshare")
            .args(["--user", "--map-root-user", "python3", "-c", &nested])
            .output()
            .unwrap();
        let said = text(&out.stdout);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(said.contains("another user namespace"), "{said}");
        assert!(!said.contains("pwned"), "{said}");
    }

    // SIGTERM: the server stops, its socket and everything it made ahead go: the
    // prepared inits (and the spawner process) and their cgroups.
    let made_ahead: Vec<u32> = children_of(server.id())
        .into_iter()
        .map(|(pid, _)| pid)
        .collect();
    assert!(made_ahead.len() >= 2, "{made_ahead:?}");
    let cgroups_of = |pid: u32| {
        let found = Command::new("find")
            .args(["/sys/fs/cgroup", "-maxdepth", "6", "-name"])
            .arg(format!("skillbox-{pid}.*"))
            .output()
            .unwrap();
        text(&found.stdout)
    };
    assert_ne!(cgroups_of(server.id()), "", "the prepared inits' cgroups");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGTERM) };
    let status = server.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!warm_data.path().join("warm.sock").exists());
    wait_for("the server's sandboxes gone", || {
        (!made_ahead.iter().any(|&pid| running(pid))).then_some(())
    });
    assert_eq!(cgroups_of(server.id()), "", "cgroups left");
    let left: Vec<String> = std::fs::read_dir(warm_data.path().join("native"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("etc-") && name != skillbox_env::owner::CLAIMS)
        .collect();
    assert!(left.is_empty(), "{left:?}");
    // And exec, without it, makes its own sandbox again.
    let out = skillbox(warm_data.path(), &["exec", "--", "echo", "alone"]);
    assert_eq!(text(&out.stdout), "alone\n");
}

/// A relative `--data-dir` names the same dir for every process it reaches: `warm`
/// and `serve` clone inits in their spawner process, whose working directory is `/`,
/// and a relative path there named nothing (every exec through them failed).
#[test]
fn a_relative_data_dir_works_through_warm_and_serve() {
    if !native_or_skip("a_relative_data_dir_works_through_warm_and_serve") {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let in_base = || {
        let mut skillbox = Command::new(BIN);
        skillbox
            .current_dir(base.path())
            .args(["--data-dir", "data"]);
        skillbox
    };
    let log = base.path().join("warm.log");
    let mut warm = start_warm_with(in_base(), &base.path().join("data/warm.sock"), &log);
    for _ in 0..3 {
        let out = in_base()
            .args(["exec", "--", "echo", "through warm"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "through warm\n");
    }
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(warm.id() as i32, libc::SIGTERM) };
    assert!(warm.wait().unwrap().success());
    let served = std::fs::read_to_string(&log).unwrap();
    assert_eq!(served.matches("warm: an exec").count(), 3, "{served}");

    let (mut serve, addr) = common::start_serve(in_base(), &[]);
    std::fs::write(base.path().join("hi.sh"), "echo through serve > made.txt\n").unwrap();
    std::fs::create_dir(base.path().join("out")).unwrap();
    let out = in_base()
        .args([
            "run",
            "hi.sh",
            "--remote",
            &format!("http://{addr}"),
            "--out",
            "out",
            "--outputs",
            "made.txt",
        ])
        .output()
        .unwrap();
    // SAFETY: signalling the server we started.
    unsafe { libc::kill(serve.id() as i32, libc::SIGTERM) };
    assert!(serve.wait().unwrap().success());
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(base.path().join("out/made.txt")).unwrap(),
        "through serve\n"
    );
}
