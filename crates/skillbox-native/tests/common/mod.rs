//! Helpers shared by the native test files.

use std::path::PathBuf;

/// A fresh data dir for one test's backend (kept: the env's cleanup removes what the
/// sandbox made), or why the native sandbox cannot run here.
pub fn data_dir() -> Result<PathBuf, String> {
    let report = skillbox_native::probe();
    if !report.available {
        return Err(format!(
            "native sandbox unavailable here: {}",
            report.reason.unwrap_or_default()
        ));
    }
    Ok(tempfile::tempdir().map_err(|e| e.to_string())?.keep())
}

/// Starts `echo ready; exec sleep MARKER` in `env` and waits for the ready line: its
/// stream, and the host pid of that sleep.
#[allow(dead_code, reason = "not every test file uses it")]
pub async fn sleep_in(
    env: &dyn skillbox_env::ExecutionEnv,
    marker: &str,
) -> (skillbox_env::ExecStream, String) {
    use skillbox_env::{CancellationToken, ExecEvent, ExecRequest};
    let mut stream = env
        .exec_stream(
            ExecRequest::shell(format!("echo ready; exec sleep {marker}")),
            &CancellationToken::new(),
        )
        .await
        .expect("exec");
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(chunk))) => assert_eq!(&chunk[..], b"ready\n"),
        other => panic!("expected the ready line, got {other:?}"),
    }
    // The line comes before the shell has exec'd the sleep: look until it has.
    let find = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c == format!("sleep\0{marker}\0").as_bytes())
            })
    };
    for _ in 0..500 {
        if let Some(sleeper) = find() {
            return (stream, sleeper);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the sandbox's sleep: not after 10 s")
}

/// The parent pid of `pid`.
#[allow(dead_code, reason = "not every test file uses it")]
pub fn parent_of(pid: &str) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("PPid:"))?;
    line[5..].trim().parse().ok()
}

/// Asserts, from the host, that `pid` (a process of an exec with the default memory
/// and pids limits) is in that exec's own cgroup leaves, which this process made: on
/// v1 in the memory and the pids hierarchy, on v2 in the unified one.
#[allow(dead_code, reason = "not every test file uses it")]
pub fn assert_in_exec_cgroup(pid: &str) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let leaf = format!("skillbox-{}-", skillbox_env::owner::this_process());
    let path_of = |text: &str, controller: &str| -> Option<String> {
        text.lines().find_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, names, path) = (parts.next()?, parts.next()?, parts.next()?);
            names
                .split(',')
                .any(|n| n == controller)
                .then(|| path.to_string())
        })
    };
    let v1 = ["memory", "pids"]
        .into_iter()
        .filter(|c| path_of(&own, c).is_some())
        .collect::<Vec<_>>();
    let controllers = if v1.is_empty() { vec![""] } else { v1 };
    for controller in controllers {
        let path = path_of(&text, controller).unwrap_or_default();
        let last = path.rsplit('/').next().unwrap_or_default();
        assert!(
            last.starts_with(&leaf),
            "pid {pid} is in {controller:?} cgroup {path:?}, not a leaf {leaf}* of its exec:\n{text}"
        );
    }
}

/// Asserts that an exec in `env` sees its own cgroups as the root of its cgroup
/// namespace (`/proc/self/cgroup` names `/` on every hierarchy), not the host's names.
#[allow(dead_code, reason = "not every test file uses it")]
pub async fn assert_sees_its_cgroups_as_root(env: &dyn skillbox_env::ExecutionEnv) {
    use skillbox_env::{CancellationToken, ExecRequest};
    let out = env
        .exec(
            ExecRequest::shell("cat /proc/self/cgroup"),
            &CancellationToken::new(),
        )
        .await
        .expect("exec");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.exit_code, Some(0), "{text}");
    assert!(!text.is_empty(), "no cgroup lines");
    for line in text.lines() {
        assert!(
            line.ends_with(":/"),
            "the sandbox sees a cgroup path of the host's: {line:?} in\n{text}"
        );
    }
}

/// The exec cgroups this test process made that are still there: `skillbox-<owner>-…`
/// directories anywhere under `/sys/fs/cgroup` (v1 or v2; symlinked hierarchies are
/// walked once, under their real names).
#[allow(dead_code, reason = "not every test file uses it")]
pub fn exec_cgroups_left() -> Vec<PathBuf> {
    let prefix = format!("skillbox-{}-", skillbox_env::owner::this_process());
    let mut left = Vec::new();
    let mut dirs = vec![PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                left.push(path);
            } else {
                dirs.push(path);
            }
        }
    }
    left
}

/// This test binary again as uid 65534, with `args`: a copy in a directory nobody can
/// enter (the build's may not be), `HOME` and each of `dir_vars` a fresh directory that
/// user owns. Whether it exited 0, and all it printed.
#[allow(dead_code, reason = "not every test file uses it")]
pub fn run_self_as_nobody(args: &[&str], dir_vars: &[&str]) -> (bool, String) {
    use std::os::unix::fs::PermissionsExt;
    let place = tempfile::tempdir().unwrap();
    let bin = place.path().join("test-binary");
    std::fs::copy(std::env::current_exe().unwrap(), &bin).unwrap();
    let home = place.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(place.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&home, Some(65534), Some(65534)).unwrap();
    let mut command = std::process::Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(args)
        .env("HOME", &home);
    for name in dir_vars {
        command.env(name, &home);
    }
    let out = command.output().expect("run setpriv");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}
