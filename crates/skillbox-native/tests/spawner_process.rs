//! The shared conformance and adversarial suites again, with every sandbox cloned by a
//! spawner process, as `skillbox serve` has them: this test binary, started again, is
//! that process (the ignored test below is its body).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::sync::OnceLock;

use skillbox_env::SandboxSpec;
use skillbox_env::testkit::Made;
use skillbox_native::spawner_process;
use skillbox_native::{NativeBackend, NativeSandbox};

/// This binary as the spawner process: the ignored test [`spawner_process_body`], found
/// by its exact name.
fn start_spawner_process() {
    static STARTED: OnceLock<u32> = OnceLock::new();
    STARTED.get_or_init(|| {
        let args = [
            "--exact",
            "spawner_process_body",
            "--ignored",
            "--nocapture",
        ]
        .map(String::from);
        let program = std::env::current_exe().unwrap();
        spawner_process::start(&program, &args).expect("the spawner process starts")
    });
}

/// Each test gets its own data dir, removed with the env's cleanup.
async fn make_sandbox(spec: SandboxSpec) -> Result<NativeSandbox, String> {
    let data = common::data_dir()?;
    start_spawner_process();
    NativeBackend::new(&data)
        .create(spec)
        .await
        .map_err(|e| e.to_string())
}

async fn make_env(spec: SandboxSpec) -> Made {
    Ok(Box::new(make_sandbox(spec).await?))
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);

#[test]
#[ignore = "the spawner process's body: run by the tests above in a process of its own"]
fn spawner_process_body() {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|a| a == spawner_process::SUBCOMMAND) else {
        return;
    };
    std::process::exit(spawner_process::main(&args[at + 1..]));
}

/// A sandbox's init is this process's child (`CLONE_PARENT`), not the spawner
/// process's: reaped by us, and its pid ours until then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_is_the_callers_child_not_the_spawner_processes() {
    check_init_origin(false).await;
}

/// The same for an init prepared ahead of its command (a pooled sandbox's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_init_is_the_callers_child_too() {
    check_init_origin(true).await;
}

async fn check_init_origin(prepared: bool) {
    use skillbox_env::ExecutionEnv;
    let made = match make_sandbox(skillbox_env::testkit::spec()).await {
        Ok(sandbox) => {
            if prepared {
                sandbox.prepare_exec().await.expect("prepare_exec");
            }
            Ok(Box::new(sandbox) as Box<dyn ExecutionEnv>)
        }
        Err(e) => Err(e),
    };
    let Some(env) = skillbox_env::testkit::require(made, "init_is_the_callers_child") else {
        return;
    };
    let marker = format!("{}", 970_000_000 + std::process::id());
    let (_stream, sleeper) = common::sleep_in(env.as_ref(), &marker).await;
    let parent_of = common::parent_of;
    let init = parent_of(&sleeper).expect("the sleep's parent");
    // The leaves to join crossed the socket with the plan: init is in them.
    common::assert_in_exec_cgroup(&sleeper);
    common::assert_in_exec_cgroup(&init.to_string());
    assert_eq!(
        parent_of(&init.to_string()),
        Some(std::process::id()),
        "init's parent is the process that asked for it"
    );
    // And the spawner process made it: init is a copy of it, its command line too.
    let cmdline = std::fs::read(format!("/proc/{init}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains(spawner_process::SUBCOMMAND),
        "init was not cloned by the spawner process: {}",
        String::from_utf8_lossy(&cmdline)
    );
    env.cleanup().await.unwrap();
}
