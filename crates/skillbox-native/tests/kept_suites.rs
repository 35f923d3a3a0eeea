//! The shared conformance and adversarial suites with every sandbox's tmpfs made as it
//! is on a kernel that cannot clone a detached mount into another mount namespace
//! (before ~6.15): kept attached in its helper's namespaces, each exec attaching a clone
//! made there. This kernel can, so the path is forced (`keep_in_namespaces_for_tests`,
//! in this test binary only).
//!
//! Root's kept path (a mount namespace alone) differs from an ordinary user's (a user
//! namespace too): as root (CI) the suite tests below take root's, and
//! `an_ordinary_user_passes_both_suites_on_the_kept_path` runs them all again in a copy
//! of this binary as uid 65534. The cgroup v2 guest takes both for real, on Debian's
//! 6.1.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::NativeBackend;

/// Each test gets its own data dir, removed with the env's cleanup.
async fn make_env(spec: SandboxSpec) -> Made {
    skillbox_native::keep_in_namespaces_for_tests();
    let data = common::data_dir()?;
    // The forced path is the one taken (this kernel would clone a detached mount).
    let disk = &skillbox_native::probe().layers["disk_limit"];
    assert!(
        disk.detail.contains("kept in a mount namespace of its own"),
        "{disk:?}"
    );
    let sandbox = NativeBackend::new(&data)
        .create(spec)
        .await
        .map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);

#[test]
fn an_ordinary_user_passes_both_suites_on_the_kept_path() {
    const TEST: &str = "an_ordinary_user_passes_both_suites_on_the_kept_path";
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Already an ordinary user: the suite tests above took the kept path.
        return;
    }
    if let Err(reason) = common::data_dir() {
        skillbox_env::testkit::skip(TEST, &reason);
        return;
    }
    // Without a cgroup an ordinary user's memory bound is RLIMIT_AS, and the suites'
    // 256 MiB is too little address space for V8: node dies of it on any path.
    let (ok, said) = common::run_self_as_nobody(
        &[
            "--skip",
            TEST,
            "--skip",
            "loopback_node_fetch",
            "--test-threads=2",
        ],
        &[],
    );
    assert!(ok, "the suites as uid 65534:\n{said}");
    assert!(said.contains("test result: ok"), "{said}");
    assert!(
        !said.contains("SKIP"),
        "a suite test skipped as uid 65534:\n{said}"
    );
}
