//! Sandboxes whose exec was prepared ahead (`NativeSandbox::prepare_exec`, and the pool
//! of `NativeBackend::with_warm`): the shared conformance and adversarial suites again,
//! with every sandbox's first exec run by an init started before its command was known,
//! then the pool itself.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::time::Duration;

use skillbox_env::testkit::Made;
use skillbox_env::{CancellationToken, ExecRequest, ExecutionEnv, SandboxSpec};
use skillbox_native::{NativeBackend, NativeSandbox};

/// Each test's sandbox has its first exec's init started, locked down and waiting
/// before the test runs anything in it.
async fn make_env(spec: SandboxSpec) -> Made {
    let sandbox = create(spec).await?;
    sandbox.prepare_exec().await.map_err(|e| e.to_string())?;
    Ok(Box::new(sandbox))
}

/// How many sandboxes `backend`'s pool has ready.
fn ready(backend: &NativeBackend) -> usize {
    backend.warm_stats().map_or(0, |stats| stats.ready)
}

/// A sandbox of `spec` in the tests' data dir, with nothing prepared yet.
async fn create(spec: SandboxSpec) -> Result<NativeSandbox, String> {
    let data = common::data_dir()?;
    NativeBackend::new(&data)
        .create(spec)
        .await
        .map_err(|e| e.to_string())
}

skillbox_env::conformance_suite!(make_env);
skillbox_env::adversarial_suite!(make_env);

/// The processes whose parent is this one (prepared inits are our children).
fn children() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .map(|task| std::fs::read_to_string(task.path().join("children")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(" ")
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .filter(|&pid| pid != me)
        .collect()
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what}: not after 10 s");
}

async fn run(env: &dyn ExecutionEnv, script: &str) -> (Option<i32>, String) {
    let out = env
        .exec(ExecRequest::shell(script), &CancellationToken::new())
        .await
        .expect("exec");
    (
        out.exit_code,
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The pool: sandboxes are made ahead for the last shape asked for, each handed out
/// once, each with its own workspace and processes; drained, nothing of them is left
/// (no init, no directory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_sandboxes_are_made_ahead_handed_out_once_and_leave_nothing() {
    let data = match common::data_dir() {
        Ok(data) => data,
        Err(why) => {
            skillbox_env::testkit::skip("pooled_sandboxes", &why);
            return;
        }
    };
    let before = children().len();
    let backend = NativeBackend::new(&data).with_warm(2);
    let spec = skillbox_env::testkit::spec();
    // The first of a shape is made now; the pool then fills for that shape.
    let first = backend.create(spec.clone()).await.unwrap();
    // (taken, missed): how many creates the pool served, and how many found none.
    let counts = || backend.warm_stats().map(|s| (s.taken, s.missed));
    assert_eq!(counts(), Some((0, 1)), "the first is made on the spot");
    wait_for("the pool filled", || ready(&backend) == 2).await;
    // Each ready sandbox holds its prepared init: two, beside the first's.
    assert_eq!(children().len(), before + 3);
    let second = backend.create(spec.clone()).await.unwrap();
    assert!(ready(&backend) <= 1, "a ready sandbox was taken");
    assert_eq!(counts(), Some((1, 1)), "the second was made ahead");
    let (first, second): (Box<dyn ExecutionEnv>, Box<dyn ExecutionEnv>) =
        (Box::new(first), Box::new(second));
    // Each is its own: a file written in one is not in the other, and each runs.
    assert_eq!(
        run(first.as_ref(), "echo one > mine; cat mine").await,
        (Some(0), "one\n".into())
    );
    assert_eq!(
        run(second.as_ref(), "cat mine 2>/dev/null || echo none").await,
        (Some(0), "none\n".into())
    );
    // A second exec in a pooled sandbox starts its own init, as any exec does.
    assert_eq!(
        run(second.as_ref(), "echo again; id -u").await,
        (Some(0), "again\n1000\n".into())
    );
    first.cleanup().await.unwrap();
    second.cleanup().await.unwrap();
    wait_for("the pool refilled", || ready(&backend) == 2).await;

    // Another shape: the ones made for the first are dropped, the pool fills anew.
    let mut other = spec.clone();
    other.limits.pids = Some(77);
    let third = backend.create(other).await.unwrap();
    assert_eq!(counts(), Some((1, 2)), "none was ready for the new shape");
    let third: Box<dyn ExecutionEnv> = Box::new(third);
    wait_for("the pool refilled for the new shape", || {
        ready(&backend) == 2
    })
    .await;
    third.cleanup().await.unwrap();

    // Drained: every prepared init is killed and reaped, every sandbox's directory
    // removed (the shared `/etc` stays, as it does for every sandbox), and every exec
    // cgroup gone by the time the drain returns (a server exits right after).
    backend.drain_warm().await;
    assert_eq!(
        common::exec_cgroups_left(),
        Vec::<std::path::PathBuf>::new()
    );
    wait_for("the prepared inits gone", || children().len() == before).await;
    let left: Vec<_> = std::fs::read_dir(data.join("native"))
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| !name.starts_with("etc-") && name != skillbox_env::owner::CLAIMS)
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "left in the data dir: {left:?}");
}

/// A command too large for a prepared init is started the usual way, and the prepared
/// init waits for the next exec; one that died meanwhile (killed from outside) is
/// passed over for a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_init_takes_what_fits_and_a_dead_one_is_passed_over() {
    let made = make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_prepared_init_takes_what_fits") else {
        return;
    };
    let before = children().len();
    // 40 KiB of arguments: more than a prepared init reads.
    let big = "x".repeat(40 * 1024);
    let out = env
        .exec(
            ExecRequest::argv(["/bin/sh", "-c", "echo ${#1}", "sh", big.as_str()]),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        (out.exit_code, String::from_utf8_lossy(&out.stdout).trim()),
        (Some(0), "40960")
    );
    // The prepared one is still there (the cold init is reaped just after the exit is
    // reported) and runs the next command.
    wait_for("the cold init reaped", || children().len() == before).await;
    assert_eq!(
        run(env.as_ref(), "echo next").await,
        (Some(0), "next\n".into())
    );
    env.cleanup().await.unwrap();

    let others = children();
    let made = make_env(skillbox_env::testkit::spec()).await;
    let env = skillbox_env::testkit::require(made, "a_dead_one_is_passed_over").unwrap();
    let prepared: Vec<u32> = children()
        .into_iter()
        .filter(|pid| !others.contains(pid))
        .collect();
    assert_eq!(prepared.len(), 1, "one prepared init: {prepared:?}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(prepared[0] as i32, libc::SIGKILL) };
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let after = stat.rsplit_once(") ")?.1.to_string();
                after.chars().next()
            })
    };
    wait_for("the killed init exited", || state(prepared[0]) == Some('Z')).await;
    assert_eq!(
        run(env.as_ref(), "echo fresh").await,
        (Some(0), "fresh\n".into())
    );
    env.cleanup().await.unwrap();
}

/// The first exec runs in the init that was prepared for it (the command is its
/// child), and the next one in an init of its own; both in the exec's cgroup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_exec_runs_in_the_prepared_init() {
    let others = children();
    let made = make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "the_first_exec_runs_in_the_prepared")
    else {
        return;
    };
    let prepared: Vec<u32> = children()
        .into_iter()
        .filter(|pid| !others.contains(pid))
        .collect();
    assert_eq!(prepared.len(), 1, "one prepared init: {prepared:?}");
    for (round, marker) in ["910000001", "910000002"].into_iter().enumerate() {
        let marker = format!("{marker}.{}", std::process::id());
        let (mut stream, sleeper) = common::sleep_in(env.as_ref(), &marker).await;
        let init = common::parent_of(&sleeper).expect("the sleep's parent");
        // A prepared init joined its cgroup before its command came, and a fresh one
        // as it started: the command runs under the exec's limits either way.
        common::assert_in_exec_cgroup(&sleeper);
        common::assert_in_exec_cgroup(&init.to_string());
        if round == 0 {
            assert_eq!(
                init, prepared[0],
                "the first exec runs in the prepared init"
            );
        } else {
            assert_ne!(init, prepared[0], "a later exec has an init of its own");
        }
        // SAFETY: signalling a process of this test's sandbox.
        unsafe { libc::kill(init as i32, libc::SIGKILL) };
        while stream.next().await.is_some() {}
    }
    env.cleanup().await.unwrap();
}

/// A prepared init's command sees the cgroups it joined as its namespace's root.
#[tokio::test]
async fn a_prepared_exec_sees_its_cgroups_as_root() {
    let made = make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_prepared_exec_sees_its_cgroups") else {
        return;
    };
    common::assert_sees_its_cgroups_as_root(env.as_ref()).await;
    env.cleanup().await.unwrap();
}

/// `prepare_next` (what a session asks for after each exec): the next exec runs in the
/// init it started, and a second call while one waits starts no other; `cleanup` then
/// leaves no init behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_next_readies_the_next_exec_and_cleanup_ends_it() {
    let others = children();
    let made = create(skillbox_env::testkit::spec())
        .await
        .map(|sandbox| Box::new(sandbox) as Box<dyn ExecutionEnv>);
    let Some(env) = skillbox_env::testkit::require(made, "prepare_next_readies_the_next_exec")
    else {
        return;
    };
    let new_children = || -> Vec<u32> {
        children()
            .into_iter()
            .filter(|pid| !others.contains(pid))
            .collect()
    };
    assert_eq!(
        run(env.as_ref(), "echo one").await,
        (Some(0), "one\n".into())
    );
    wait_for("the first exec's init reaped", || new_children().is_empty()).await;
    env.prepare_next().await;
    env.prepare_next().await;
    let prepared = new_children();
    assert_eq!(prepared.len(), 1, "one prepared init: {prepared:?}");
    let marker = format!("910000003.{}", std::process::id());
    let (mut stream, sleeper) = common::sleep_in(env.as_ref(), &marker).await;
    assert_eq!(
        common::parent_of(&sleeper),
        Some(prepared[0]),
        "the next exec runs in the init prepare_next started"
    );
    // SAFETY: signalling a process of this test's sandbox.
    unsafe { libc::kill(prepared[0] as i32, libc::SIGKILL) };
    while stream.next().await.is_some() {}
    env.prepare_next().await;
    wait_for("a new init waiting", || new_children().len() == 1).await;
    env.cleanup().await.unwrap();
    wait_for("no init left", || new_children().is_empty()).await;
}
