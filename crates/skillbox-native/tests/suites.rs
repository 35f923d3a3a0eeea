//! The shared conformance and adversarial suites, run against the native sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::NativeBackend;

/// Each test gets its own data dir, removed with the env's cleanup.
async fn make_env(spec: SandboxSpec) -> Made {
    // As the skillbox binary runs: what it makes is its user's alone (main.rs). The
    // sandbox must work all the same: what it reads is given its mode explicitly.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(skillbox_env::PRIVATE_UMASK) };
    let data = common::data_dir()?;
    let sandbox = NativeBackend::new(&data)
        .create(spec)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);

/// A sandbox dropped without `cleanup` (a caller that was cancelled) still kills what
/// runs in it and removes its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_sandbox_ends_its_execs_and_removes_its_dir() {
    use skillbox_env::{CancellationToken, ExecEvent, ExecRequest};
    let made = make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_dropped_sandbox") else {
        return;
    };
    let marker = format!("{}", 960_000_000 + std::process::id());
    let mut stream = env
        .exec_stream(
            ExecRequest::shell(format!("echo ready; sleep {marker}"))
                .timeout(std::time::Duration::from_secs(3600)),
            &CancellationToken::new(),
        )
        .await
        .expect("exec");
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(chunk))) => assert_eq!(&chunk[..], b"ready\n"),
        other => panic!("expected the ready line, got {other:?}"),
    }
    let dir = env
        .canonical(
            std::path::Path::new("/workspace"),
            &CancellationToken::new(),
        )
        .await
        .expect("canonical");
    assert_eq!(dir, std::path::Path::new("/workspace"));
    drop(env);
    skillbox_env::testkit::assert_processes_gone(&format!("sleep {marker}"), "a dropped sandbox")
        .await;
    // The stream ends (aborted) instead of hanging.
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while let Some(event) = stream.next().await {
            if event.is_err() {
                return true;
            }
        }
        false
    })
    .await
    .expect("the stream of a dropped sandbox must end");
    assert!(end, "the stream must end with an error");
}

/// Read-only mounts may not land at or under directories the sandbox owns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_mounts_under_workspace_or_tmp_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let host = tempfile::tempdir().unwrap();
    for target in [
        "/workspace/x",
        "/tmp/a",
        "/proc/sys",
        "/dev/shm/y",
        "/",
        "/workspace",
    ] {
        let mut spec = skillbox_env::testkit::spec();
        spec.policy.read_only_mounts.push(skillbox_env::Mount {
            host: host.path().to_path_buf(),
            sandbox: target.into(),
        });
        let err = NativeBackend::new(data.path())
            .create(spec)
            .await
            .expect_err(target);
        assert_eq!(
            err.code,
            skillbox_env::ErrorCode::Invalid,
            "{target}: {err}"
        );
        assert!(err.message.contains("readOnlyMounts"), "{target}: {err}");
    }
    let mut spec = skillbox_env::testkit::spec();
    spec.policy.read_only_mounts.push(skillbox_env::Mount {
        host: host.path().to_path_buf(),
        sandbox: "/opt/data".into(),
    });
    if skillbox_native::probe().available {
        let env = NativeBackend::new(data.path())
            .create(spec)
            .await
            .expect("/opt/data is fine");
        skillbox_env::FileSystem::cleanup(&env).await.unwrap();
    }
}

/// Issue 38, row 3: a tree placed from the host (a scope's snapshot restored, skills
/// projected) costs skillbox's own CPU, outside the sandbox's cgroup. Each entry used
/// to be made by walking its path again from the mount, component by component (depth³
/// for a deep tree: 103 s for 1,900 levels). A tree as deep as a tree may be, with
/// 5,000 directories at the bottom, is placed with each entry made from its parent's
/// fd, in well under the 2 s the issue allows (tens of seconds before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_wide_tree_is_placed_from_each_parent_s_fd() {
    use skillbox_env::{CancellationToken, ExecRequest, MAX_TREE_DEPTH, Tree};
    let mut spec = skillbox_env::testkit::spec();
    // Room for the tree's 5,300 entries (the suites' bound holds 4,096).
    spec.limits.disk_inodes = Some(16_384);
    let made = make_env(spec).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_deep_wide_tree_is_placed") else {
        return;
    };
    // The deepest entry, the last file, is as deep as a tree holds.
    let deep: std::path::PathBuf = std::iter::repeat_n("d", MAX_TREE_DEPTH - 2).collect();
    let mut tree = Tree::new();
    tree.dir(&deep).unwrap();
    for i in 0..5000 {
        tree.dir(deep.join(format!("w{i}"))).unwrap();
    }
    tree.file(deep.join("w4999/last.txt"), &b"placed\n"[..], false)
        .unwrap();
    let mut deeper = tree.clone();
    assert!(
        deeper
            .dir(deep.join("w0/one/more"))
            .unwrap_err()
            .message
            .contains(&MAX_TREE_DEPTH.to_string()),
        "a tree holds no deeper path"
    );
    let cancel = CancellationToken::new();
    let started = std::time::Instant::now();
    env.put_tree(std::path::Path::new("/workspace"), &tree, &cancel)
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(2),
        "placed in {took:?}"
    );
    let out = env
        .exec(
            ExecRequest::shell(format!(
                "cd /workspace/{} && ls | wc -l && cat w4999/last.txt",
                deep.display()
            )),
            &cancel,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "5000\nplaced\n", "{}", out.stderr_text());
    env.cleanup().await.unwrap();
}

mod connect;
