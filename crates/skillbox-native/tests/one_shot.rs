//! The shared suites again, against sandboxes made for a one-shot caller
//! (`NativeBackend::create_blocking`, as `skillbox exec` makes them): those clone on
//! the thread that polls the exec and do their housekeeping in place, so they get the
//! same attacks and the same checks that nothing is left behind.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::NativeBackend;

async fn make_env(spec: SandboxSpec) -> Made {
    let data = common::data_dir()?;
    let sandbox = NativeBackend::new(&data)
        .create_blocking(spec)
        .map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);

/// What a sandbox keeps under `<data>/native` besides the shared `/etc`.
fn sandbox_dirs(data: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(data.join("native"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("etc-"))
        .collect()
}

/// A temp workspace is the sandbox's one directory, gone after cleanup; with the
/// caller's workdir the sandbox makes no directory of its own at all.
#[tokio::test]
async fn a_sandbox_leaves_no_directory_behind() {
    use skillbox_env::{CancellationToken, ExecRequest, FileSystem, Shell};
    if !skillbox_native::probe().available {
        return skillbox_env::testkit::skip(
            "a_sandbox_leaves_no_directory_behind",
            "no native sandbox",
        );
    }
    let never = CancellationToken::new();
    let data = tempfile::tempdir().unwrap();
    let backend = NativeBackend::new(data.path());

    let temp = backend
        .create_blocking(skillbox_env::testkit::spec())
        .unwrap();
    let out = temp
        .exec(
            ExecRequest::shell("echo hi > /workspace/x; cat /workspace/x"),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "hi\n");
    let dirs = sandbox_dirs(data.path());
    assert_eq!(
        dirs.len(),
        1,
        "one directory for the temp workspace: {dirs:?}"
    );
    let host_file = data.path().join("native").join(&dirs[0]).join("x");
    assert_eq!(std::fs::read_to_string(&host_file).unwrap(), "hi\n");
    temp.cleanup().await.unwrap();
    assert_eq!(sandbox_dirs(data.path()), Vec::<String>::new());

    let workdir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(workdir.path(), Some(65534), Some(65534)).ok();
    let spec = SandboxSpec {
        workspace: Some(workdir.path().to_path_buf()),
        ..skillbox_env::testkit::spec()
    };
    let given = backend.create_blocking(spec).unwrap();
    let out = given
        .exec(ExecRequest::shell("echo there > /workspace/y"), &never)
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr_text());
    assert_eq!(sandbox_dirs(data.path()), Vec::<String>::new());
    given.cleanup().await.unwrap();
    assert_eq!(
        std::fs::read_to_string(workdir.path().join("y")).unwrap(),
        "there\n"
    );
}
