//! The disk bound for an ordinary user on a kernel that cannot clone a detached mount
//! into another mount namespace (before ~6.15: Debian 12, Ubuntu 24.04): the tmpfs is
//! kept attached in its helper's namespaces and each exec attaches a clone made there.
//! This kernel clones detached mounts, so the test forces that path
//! (`keep_in_namespaces_for_tests`) in a copy of this binary run as uid 65534; the
//! cgroup v2 guest (`crates/skillbox/tests/cgroup_v2.rs`, Debian's 6.1) takes it for
//! real.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use skillbox_env::{CancellationToken, ExecRequest, FileSystem, Limits, SandboxSpec, Shell};

const BODY: &str = "kept_tmpfs_body";

/// The body below as uid 65534.
#[test]
fn an_ordinary_users_disk_bound_where_detached_mounts_cannot_be_cloned() {
    const TEST: &str = "an_ordinary_users_disk_bound_where_detached_mounts_cannot_be_cloned";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skillbox_env::testkit::skip(TEST, "needs root to switch to uid 65534");
        return;
    }
    if let Err(reason) = common::data_dir() {
        skillbox_env::testkit::skip(TEST, &reason);
        return;
    }
    let (ok, said) = common::run_self_as_nobody(
        &["--exact", BODY, "--ignored", "--nocapture"],
        &["KEPT_TMPFS_DATA"],
    );
    assert!(ok, "the body as uid 65534 failed:\n{said}");
    assert!(said.contains("BODY DONE"), "the body did not run:\n{said}");
}

/// The children of this process, from every thread's list.
fn children() -> Vec<String> {
    let mut all = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        all.extend(list.split_whitespace().map(String::from));
    }
    all
}

#[test]
#[ignore = "the body of the test above, run by it as uid 65534"]
fn kept_tmpfs_body() {
    let Some(data) = std::env::var_os("KEPT_TMPFS_DATA") else {
        return;
    };
    skillbox_native::keep_in_namespaces_for_tests();
    // The forced path is the one taken (this kernel would clone a detached mount).
    let disk = &skillbox_native::probe().layers["disk_limit"];
    assert!(disk.available, "{disk:?}");
    assert!(
        disk.detail.contains("kept in a mount namespace of its own"),
        "{disk:?}"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let backend = skillbox_native::NativeBackend::new(std::path::Path::new(&data));
        let limits = Limits {
            disk_bytes: Some(8 * 1024 * 1024),
            ..skillbox_env::testkit::limits()
        };
        let sandbox = backend
            .create(SandboxSpec {
                workspace: None,
                limits: limits.clone(),
                ..SandboxSpec::default()
            })
            .await
            .expect("a sandbox with a disk bound, unprivileged");
        let cancel = CancellationToken::new();
        // /workspace gets 3/4 of the bound: 5 MB fit, 5 more do not.
        let first = sandbox
            .exec(
                ExecRequest::shell(
                    "head -c 5000000 /dev/zero > /workspace/a && echo fits; \
                     head -c 5000000 /dev/zero > /workspace/b || echo full; \
                     grep ' /workspace ' /proc/self/mountinfo | grep -c tmpfs",
                ),
                &cancel,
            )
            .await
            .expect("exec");
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        assert_eq!(text(&first.stdout), "fits\nfull\n1\n", "{first:?}");
        assert!(text(&first.stderr).contains("No space left"), "{first:?}");
        // A second exec attaches another clone of the same tmpfs: what the first wrote
        // is there, and so is the bound.
        let second = sandbox
            .exec(
                ExecRequest::shell(
                    "stat -c %s /workspace/a; rm /workspace/b; \
                     head -c 5000000 /dev/zero > /workspace/c || echo still full",
                ),
                &cancel,
            )
            .await
            .expect("exec");
        assert_eq!(text(&second.stdout), "5000000\nstill full\n", "{second:?}");
        // The host-side view reads it beneath the sandbox's own mount.
        let a = sandbox
            .read_bytes(std::path::Path::new("/workspace/a"), &cancel)
            .await
            .expect("read /workspace/a from the host side");
        assert_eq!(a.len(), 5_000_000);
        sandbox.cleanup().await.expect("cleanup");
        // Many made at once: a helper forked for one holds copies of the others'
        // sockets, and none of them waits on those.
        let many: Vec<_> = (0..8)
            .map(|_| {
                let backend = backend.clone();
                let limits = limits.clone();
                tokio::spawn(async move {
                    let sandbox = backend
                        .create(SandboxSpec {
                            workspace: None,
                            limits,
                            ..SandboxSpec::default()
                        })
                        .await
                        .expect("a sandbox made alongside others");
                    let out = sandbox
                        .exec(
                            ExecRequest::shell("echo x > /workspace/x && cat /workspace/x"),
                            &CancellationToken::new(),
                        )
                        .await
                        .expect("exec");
                    sandbox.cleanup().await.expect("cleanup");
                    out.stdout
                })
            })
            .collect();
        let all = tokio::time::timeout(std::time::Duration::from_secs(120), async {
            let mut outputs = Vec::new();
            for task in many {
                outputs.push(task.await.expect("a task"));
            }
            outputs
        })
        .await
        .expect("eight sandboxes made at once, within two minutes");
        for stdout in all {
            assert_eq!(stdout, b"x\n");
        }
        // The helpers (the one that made the tmpfs, one per exec) are gone, reaped.
        assert_eq!(children(), Vec::<String>::new(), "no helper left");
    });
    println!("BODY DONE");
}
