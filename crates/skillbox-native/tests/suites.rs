//! The shared conformance and adversarial suites, run against the native sandbox.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::NativeBackend;

/// Each test gets its own data dir, removed with the env's cleanup.
async fn make_env(spec: SandboxSpec) -> Made {
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

mod connect;
