//! The suites every backend must pass, run with one macro call from the backend's tests:
//!
//! ```ignore
//! async fn make_env(spec: skillbox_env::SandboxSpec) -> skillbox_env::testkit::Made { … }
//! skillbox_env::conformance_suite!(make_env);
//! skillbox_env::adversarial_suite!(make_env);
//! ```
//!
//! A factory that cannot build its env here (no root, no daemon) returns `Err(reason)`:
//! the test prints the reason and passes — unless `SKILLBOX_REQUIRE_ALL=1`, then it fails.

pub mod adversarial;
pub mod conformance;

use crate::{ExecutionEnv, Limits, SandboxSpec};

/// What a factory returns: an env, or why this host cannot make one.
pub type Made = Result<Box<dyn ExecutionEnv>, String>;

/// Limits the suites are written against (small, so the bombs end quickly).
pub fn limits() -> Limits {
    Limits {
        memory_bytes: Some(256 * 1024 * 1024),
        pids: Some(64),
        cpu_seconds: Some(30),
        cpus: None,
        file_size_bytes: Some(16 * 1024 * 1024),
        open_files: Some(256),
        timeout_ms: 20_000,
        output_bytes: 64 * 1024,
        tmp_bytes: 32 * 1024 * 1024,
    }
}

/// The spec every suite test asks its factory for: a temp workspace and [`limits`].
pub fn spec() -> SandboxSpec {
    SandboxSpec { workspace: None, limits: limits(), ..SandboxSpec::default() }
}

/// True when skips must fail (CI).
pub fn require_all() -> bool {
    std::env::var("SKILLBOX_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Unwraps a factory result, or skips (prints why) — panics under `SKILLBOX_REQUIRE_ALL=1`.
pub fn require(made: Made, test: &str) -> Option<Box<dyn ExecutionEnv>> {
    match made {
        Ok(env) => Some(env),
        Err(reason) => {
            skip(test, &reason);
            None
        }
    }
}

/// Prints a skip reason, or fails the test under `SKILLBOX_REQUIRE_ALL=1`.
pub fn skip(test: &str, reason: &str) {
    assert!(!require_all(), "{test}: cannot run here and SKILLBOX_REQUIRE_ALL=1: {reason}");
    eprintln!("SKIP {test}: {reason}");
}

#[doc(hidden)]
#[macro_export]
macro_rules! __testkit_tests {
    ($make:path, $module:ident, [$($name:ident),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let made = $make($crate::testkit::spec()).await;
                let Some(env) = $crate::testkit::require(made, stringify!($name)) else { return };
                $crate::testkit::$module::$name(env.as_ref()).await;
                env.cleanup().await.expect("cleanup");
            }
        )*
    };
}
