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
        .filter(|name| !name.starts_with("etc-") && name != skillbox_env::owner::CLAIMS)
        .collect()
}

/// With a disk bound a temp workspace is the sandbox's own tmpfs: nothing on the host.
/// Without one it is the sandbox's one directory, gone after cleanup; with the caller's
/// workdir the sandbox makes no directory of its own at all (and a disk bound on it is
/// refused: it cannot be enforced there).
#[tokio::test]
async fn a_sandbox_leaves_no_directory_behind() {
    use skillbox_env::{CancellationToken, ErrorCode, ExecRequest, FileSystem, Shell};
    if !skillbox_native::probe().available {
        return skillbox_env::testkit::skip(
            "a_sandbox_leaves_no_directory_behind",
            "no native sandbox",
        );
    }
    let never = CancellationToken::new();
    let data = tempfile::tempdir().unwrap();
    let backend = NativeBackend::new(data.path());

    let bounded = backend
        .create_blocking(skillbox_env::testkit::spec())
        .unwrap();
    let out = bounded
        .exec(
            ExecRequest::shell("echo hi > /workspace/x; cat /workspace/x"),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(out.stdout_text(), "hi\n");
    assert_eq!(sandbox_dirs(data.path()), Vec::<String>::new());
    let seen = bounded
        .read_text(std::path::Path::new("/workspace/x"), &never)
        .await
        .unwrap();
    assert_eq!(seen, "hi\n", "the host-side view reads the sandbox's tmpfs");
    bounded.cleanup().await.unwrap();

    let unbounded = SandboxSpec {
        limits: skillbox_env::Limits {
            disk_bytes: None,
            disk_inodes: None,
            ..skillbox_env::testkit::limits()
        },
        ..skillbox_env::testkit::spec()
    };
    let temp = backend.create_blocking(unbounded.clone()).unwrap();
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
    let refused = SandboxSpec {
        workspace: Some(workdir.path().to_path_buf()),
        ..skillbox_env::testkit::spec()
    };
    let err = backend.create_blocking(refused).unwrap_err();
    assert_eq!(err.code, ErrorCode::Unavailable, "{err}");
    assert!(err.message.contains("disk limit"), "{err}");
    let spec = SandboxSpec {
        workspace: Some(workdir.path().to_path_buf()),
        ..unbounded
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

/// A workdir swapped on the host between create and exec (its name now a symlink to
/// `/etc`, the real directory moved away): the exec still sees the directory the
/// sandbox was made with, never what the path names now.
#[tokio::test]
async fn a_workdir_swapped_after_create_is_not_what_the_exec_sees() {
    use skillbox_env::{CancellationToken, ExecRequest, Shell};
    let report = skillbox_native::probe();
    if !report.available {
        return skillbox_env::testkit::skip("a_workdir_swapped_after_create", "no native sandbox");
    }
    if !report
        .layers
        .get("bind_sources")
        .is_some_and(|l| l.available)
    {
        let why = report
            .layers
            .get("bind_sources")
            .map(|l| l.detail.clone())
            .unwrap_or_default();
        return skillbox_env::testkit::skip("a_workdir_swapped_after_create", &why);
    }
    let data = tempfile::tempdir().unwrap();
    let parent = tempfile::tempdir().unwrap();
    let work = parent.path().join("work");
    std::fs::create_dir(&work).unwrap();
    std::fs::write(work.join("mine.txt"), "the real workdir\n").unwrap();
    std::os::unix::fs::chown(&work, Some(65534), Some(65534)).unwrap();
    let spec = SandboxSpec {
        workspace: Some(work.clone()),
        limits: skillbox_env::Limits {
            disk_bytes: None,
            ..skillbox_env::testkit::limits()
        },
        ..skillbox_env::testkit::spec()
    };
    let sandbox = NativeBackend::new(data.path())
        .create_blocking(spec)
        .unwrap();
    // Whoever controls the parent directory swaps the workdir for a link to /etc.
    std::fs::rename(&work, parent.path().join("moved")).unwrap();
    std::os::unix::fs::symlink("/etc", &work).unwrap();
    let never = CancellationToken::new();
    let out = sandbox
        .exec(
            ExecRequest::shell("cat /workspace/mine.txt; ls /workspace | head -5; test -e /workspace/passwd && echo HOST-ETC"),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_text(),
        "the real workdir\nmine.txt\n",
        "{}",
        out.stderr_text()
    );
    skillbox_env::FileSystem::cleanup(&sandbox).await.unwrap();
}

/// Volumes swapped on the host between create and exec (each name now a symlink to
/// another directory, the real one moved away): as root the exec writes in, and reads,
/// the directories the sandbox was made with, never where the paths point now. The
/// host-side file view reads the volume and never writes it.
#[tokio::test]
async fn volumes_swapped_after_create_are_not_what_the_exec_sees() {
    use skillbox_env::{CancellationToken, ExecRequest, Shell, Volume};
    let report = skillbox_native::probe();
    if !report.available {
        return skillbox_env::testkit::skip("volumes_swapped_after_create", "no native sandbox");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Unprivileged, the child looks the path up at each exec (a known limit).
        return skillbox_env::testkit::skip(
            "volumes_swapped_after_create",
            "volumes are held by fd as root only",
        );
    }
    let data = tempfile::tempdir().unwrap();
    let parent = tempfile::tempdir().unwrap();
    let volume = parent.path().join("volume");
    let decoy = parent.path().join("decoy");
    std::fs::create_dir(&volume).unwrap();
    std::fs::create_dir(&decoy).unwrap();
    let mut spec = skillbox_env::testkit::spec();
    std::os::unix::fs::chown(&volume, Some(4242), Some(4242)).unwrap();
    spec.policy.volumes.push(Volume {
        host: volume.clone(),
        sandbox: "/data".into(),
        rw: true,
    });
    // And a read-only one, swapped the same way: held by fd too.
    let shown = parent.path().join("shown");
    std::fs::create_dir(&shown).unwrap();
    std::fs::write(shown.join("mine.txt"), "the real one\n").unwrap();
    std::fs::write(decoy.join("mine.txt"), "the decoy\n").unwrap();
    spec.policy.volumes.push(Volume {
        host: shown.clone(),
        sandbox: "/ref".into(),
        rw: false,
    });
    let sandbox = NativeBackend::new(data.path())
        .create_blocking(spec)
        .unwrap();
    std::fs::rename(&volume, parent.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&decoy, &volume).unwrap();
    std::fs::rename(&shown, parent.path().join("shown-moved")).unwrap();
    std::os::unix::fs::symlink(&decoy, &shown).unwrap();
    let never = CancellationToken::new();
    let out = sandbox
        .exec(
            ExecRequest::shell("echo mine > /data/x && ls /data && cat /ref/mine.txt"),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(
        out.stdout_text(),
        "x\nthe real one\n",
        "{}",
        out.stderr_text()
    );
    assert_eq!(
        std::fs::read_to_string(parent.path().join("moved/x")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_dir(&decoy).unwrap().count(),
        1,
        "only its own file"
    );
    // The host-side file view reads the volume, and leaves writing it to the code.
    let fs: &dyn skillbox_env::FileSystem = &sandbox;
    assert_eq!(
        fs.read_bytes(std::path::Path::new("/data/x"), &never)
            .await
            .unwrap(),
        b"mine\n".to_vec()
    );
    let refused = fs
        .write(std::path::Path::new("/data/y"), b"host", &never)
        .await
        .unwrap_err();
    assert_eq!(refused.code, skillbox_env::ErrorCode::PermissionDenied);
    assert!(refused.message.contains("read-write volume"), "{refused}");
    assert!(!parent.path().join("moved/y").exists());
    skillbox_env::FileSystem::cleanup(&sandbox).await.unwrap();
}

/// A one-shot exec's init joins its cgroup itself (on v1, through the `tasks` files
/// the parent opened) before it makes anything: its command runs in the exec's leaves.
#[tokio::test]
async fn a_one_shot_exec_runs_in_its_own_cgroup() {
    let made = make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_one_shot_exec_runs_in_its_own_cgroup")
    else {
        return;
    };
    let marker = format!("920000001.{}", std::process::id());
    let (mut stream, sleeper) = common::sleep_in(env.as_ref(), &marker).await;
    common::assert_in_exec_cgroup(&sleeper);
    let init = common::parent_of(&sleeper).expect("the sleep's parent");
    common::assert_in_exec_cgroup(&init.to_string());
    // SAFETY: signalling a process of this test's sandbox.
    unsafe { libc::kill(init as i32, libc::SIGKILL) };
    while stream.next().await.is_some() {}
    env.cleanup().await.unwrap();
    // And from inside, its cgroups are the root of its cgroup namespace.
    let env = make_env(skillbox_env::testkit::spec()).await.unwrap();
    common::assert_sees_its_cgroups_as_root(env.as_ref()).await;
    env.cleanup().await.unwrap();
}
