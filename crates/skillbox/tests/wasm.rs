//! The wasm backend: the shared suites where WASI can express them, modules in text
//! form, and the installed guests (CPython, QuickJS) run for real, attacks included.
//! The runner is this build's skillbox binary.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use skillbox_env::testkit::{Made, limits};
use skillbox_env::{
    Backend, CancellationToken, ErrorCode, ExecOutput, ExecRequest, ExecutionEnv, LimitKind,
    SandboxSpec,
};
use skillbox_wasm::{WasmBackend, WasmConfig};

use common::wasm_home;

fn backend(data: &Path) -> WasmBackend {
    WasmBackend::new(
        WasmConfig {
            home: wasm_home(),
            runner: Some(PathBuf::from(common::BIN)),
        },
        std::sync::Arc::new(skillbox_native::NativeBackend::new(data)),
    )
}

async fn make_env(spec: SandboxSpec) -> Made {
    let report = skillbox_native::probe();
    if !report.available {
        return Err(format!(
            "wasm runs inside the native sandbox, unavailable here: {}",
            report.reason.unwrap_or_default()
        ));
    }
    let data = tempfile::tempdir().map_err(|e| e.to_string())?.keep();
    backend(&data).create(spec).await.map_err(|e| e.to_string())
}

// The file operations are the native sandbox's own file view, so they run from the
// shared suite. Left out, because WASI cannot express them: the tests that set up
// with `sh` (symlinks, FIFOs, modes: a WASI guest has no shell and no processes), the
// exec tests written with `sh`, `echo` or `kill` (below, each has a wasm form), and the
// adversarial suite (process, socket and kernel attacks a WASI guest has no call for;
// the guest attacks below are its wasm form).
mod conformance {
    #[allow(unused_imports, reason = "brings the factory into scope")]
    use super::*;

    skillbox_env::__testkit_tests!(
        make_env,
        conformance,
        [
            write_then_read_round_trips,
            write_replaces_the_whole_file,
            put_tree_places_dirs_and_files_with_their_modes,
            put_tree_replaces_files_with_the_tree_s_mode,
            put_tree_refuses_what_is_in_the_way,
            put_tree_places_many_files_in_one_call,
            append_creates_then_appends,
            read_text_lines_stops_at_max,
            rename_moves_and_replaces,
            remove_dir_needs_recursive_when_not_empty,
            create_dir_recursive_and_not,
            error_not_found,
            error_already_exists,
            error_not_directory,
            error_is_directory,
            error_invalid,
            error_aborted_file_ops,
            error_aborted_exec,
        ]
    );
}

fn live() -> CancellationToken {
    CancellationToken::new()
}

async fn env_or_skip(test: &str, spec: SandboxSpec) -> Option<Box<dyn ExecutionEnv>> {
    skillbox_env::testkit::require(make_env(spec).await, test)
}

async fn run(env: &dyn ExecutionEnv, argv: &[&str]) -> ExecOutput {
    env.exec(ExecRequest::argv(argv.iter().copied()), &live())
        .await
        .expect("exec")
}

const HELLO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello from wasm\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 16))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $exit (i32.const 3))))"#;

const SPIN: &str = r#"(module (func (export "_start") (loop $l (br $l))))"#;

/// Grows its memory 1 MiB at a time until refused, then traps.
const BOMB: &str = r#"(module (memory 1)
  (func (export "_start")
    (loop $l (br_if $l (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
    unreachable))"#;

/// Writes 64 KiB to stdout 64 times (4 MiB).
const FLOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start") (local $i i32)
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop $l
      (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 64))))))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_in_the_workspace_runs_and_exits_with_its_code() {
    let Some(env) = env_or_skip("wasm_module_runs", skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(Path::new("hello.wat"), HELLO.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["hello.wat"]).await;
    assert_eq!(output.exit_code, Some(3), "{output:?}");
    assert_eq!(output.stdout_text(), "hello from wasm\n");
    // The same module by its absolute path, from a subdirectory.
    env.create_dir(Path::new("sub"), false, &live())
        .await
        .unwrap();
    let output = env
        .exec(
            ExecRequest::argv(["/workspace/hello.wat"]).cwd("/workspace/sub"),
            &live(),
        )
        .await
        .unwrap();
    assert_eq!(output.exit_code, Some(3), "{output:?}");
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_run_says_why() {
    let Some(env) = env_or_skip("wasm_cannot_run", skillbox_env::testkit::spec()).await else {
        return;
    };
    let shell = env.exec(ExecRequest::shell("echo hi"), &live()).await;
    let error = shell.expect_err("no shell in wasm");
    assert_eq!(error.code, ErrorCode::Invalid);
    assert!(error.message.contains("no shell"), "{error}");

    let missing = run(env.as_ref(), &["ruby", "-e", "1"]).await;
    assert_eq!(missing.exit_code, Some(127), "{missing:?}");
    assert!(
        missing.stderr_text().contains("ruby: no such guest"),
        "{missing:?}"
    );

    let absent = run(env.as_ref(), &["absent.wasm"]).await;
    assert_eq!(absent.exit_code, Some(127), "{absent:?}");

    env.write(
        Path::new("fake.wasm"),
        b"#!/bin/sh\necho escaped\n",
        &live(),
    )
    .await
    .unwrap();
    let fake = run(env.as_ref(), &["fake.wasm"]).await;
    assert_eq!(fake.exit_code, Some(126), "{fake:?}");
    assert!(!fake.stdout_text().contains("escaped"), "{fake:?}");
    assert!(
        fake.stderr_text().contains("not a WebAssembly module"),
        "{fake:?}"
    );
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_loop_times_out_at_its_deadline() {
    let Some(env) = env_or_skip("wasm_loop", skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(Path::new("spin.wat"), SPIN.as_bytes(), &live())
        .await
        .unwrap();
    let output = env
        .exec(
            ExecRequest::argv(["spin.wat"]).timeout(Duration::from_millis(800)),
            &live(),
        )
        .await
        .unwrap();
    assert!(output.timed_out, "{output:?}");
    assert_eq!(
        (output.exit_code, output.signal),
        (None, Some(libc::SIGKILL))
    );
    assert!(
        output.stderr_text().contains("past its deadline"),
        "{output:?}"
    );
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_hits_the_memory_limit() {
    let spec = SandboxSpec {
        limits: skillbox_env::Limits {
            memory_bytes: Some(64 * 1024 * 1024),
            ..limits()
        },
        ..skillbox_env::testkit::spec()
    };
    let Some(env) = env_or_skip("wasm_memory_bomb", spec).await else {
        return;
    };
    env.write(Path::new("bomb.wat"), BOMB.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["bomb.wat"]).await;
    assert_eq!(output.limit_hit, Some(LimitKind::Memory), "{output:?}");
    assert_eq!(output.signal, Some(libc::SIGKILL), "{output:?}");
    assert!(!output.timed_out);
    env.cleanup().await.unwrap();
}

/// Four memories and a table, each under the bound alone, over it together.
const SPLIT_BOMB: &str = r#"(module
  (memory $a 1) (memory $b 1) (memory $c 1) (memory $d 1)
  (table $t 1 funcref)
  (func (export "_start")
    (drop (memory.grow $a (i32.const 300)))
    (drop (memory.grow $b (i32.const 300)))
    (drop (memory.grow $c (i32.const 300)))
    (if (i32.eq (memory.grow $d (i32.const 300)) (i32.const -1)) (then unreachable))
    (if (i32.eq (table.grow $t (ref.null func) (i32.const 10000000)) (i32.const -1)) (then unreachable))))"#;

/// A module with no `_start`.
const LIBRARY: &str = r#"(module (func (export "add") (param i32 i32) (result i32) (i32.add (local.get 0) (local.get 1))))"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memories_and_tables_count_together_against_the_bound() {
    let spec = SandboxSpec {
        limits: skillbox_env::Limits {
            memory_bytes: Some(64 * 1024 * 1024),
            ..limits()
        },
        ..skillbox_env::testkit::spec()
    };
    let Some(env) = env_or_skip("wasm_split_bomb", spec).await else {
        return;
    };
    env.write(Path::new("split.wat"), SPLIT_BOMB.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["split.wat"]).await;
    assert_eq!(output.limit_hit, Some(LimitKind::Memory), "{output:?}");
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_up_to_255_come_back_and_a_library_is_not_a_command() {
    let Some(env) = env_or_skip("wasm_exit_codes", skillbox_env::testkit::spec()).await else {
        return;
    };
    for code in [126, 200, 255] {
        let module = HELLO.replace("(i32.const 3)", &format!("(i32.const {code})"));
        env.write(Path::new("code.wat"), module.as_bytes(), &live())
            .await
            .unwrap();
        let output = run(env.as_ref(), &["code.wat"]).await;
        assert_eq!(output.exit_code, Some(code), "{output:?}");
    }
    env.write(Path::new("lib.wat"), LIBRARY.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["lib.wat"]).await;
    assert_eq!(output.exit_code, Some(126), "{output:?}");
    assert!(
        output.stderr_text().contains("not a WASI command"),
        "{output:?}"
    );
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_past_the_cap_is_cut() {
    let Some(env) = env_or_skip("wasm_output_flood", skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(Path::new("flood.wat"), FLOOD.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["flood.wat"]).await;
    assert_eq!(output.exit_code, Some(0), "{:?}", output.stderr_text());
    assert!(output.truncated.stdout);
    assert_eq!(output.stdout.len() as u64, limits().output_bytes);
    assert_eq!(output.limit_hit, Some(LimitKind::Output));
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_a_running_guest_and_its_runner() {
    let Some(env) = env_or_skip("wasm_cancel", skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(Path::new("spin.wat"), SPIN.as_bytes(), &live())
        .await
        .unwrap();
    let marker = format!("wasm-cancel-{}", std::process::id());
    let cancel = CancellationToken::new();
    let fire = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        fire.cancel();
    });
    let ended = env
        .exec(ExecRequest::argv(["spin.wat", marker.as_str()]), &cancel)
        .await;
    assert_eq!(ended.expect_err("cancelled").code, ErrorCode::Aborted);
    skillbox_env::testkit::assert_processes_gone(&marker, "a cancelled wasm exec").await;
    env.cleanup().await.unwrap();
}

/// Prints its environment (`NAME=value`, each ended by a NUL) to stdout, then spins
/// until it is stopped.
const PRINT_ENV_THEN_SPIN: &str = r#"(module
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $sizes (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 4)
  (func (export "_start")
    (drop (call $sizes (i32.const 0) (i32.const 4)))
    (drop (call $get (i32.const 1024) (i32.const 65536)))
    (i32.store (i32.const 16) (i32.const 65536))
    (i32.store (i32.const 20) (i32.load (i32.const 4)))
    (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
    (loop $l (br $l))))"#;

/// The attack: a guest's environment (a capability's `env: [MYTOKEN]`, a session
/// exec's `env`) holds a token, and any user of the host can read every process's
/// command line. While the guest runs (it has printed the token, so it has it), its
/// runner's `/proc/<pid>/cmdline` and `environ` hold no byte of it. Before, the
/// runner's argv carried the whole spec, the token in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_s_environment_is_never_on_its_runner_s_command_line() {
    let test = "a_guest_s_environment_is_never_on_its_runner_s_command_line";
    let Some(env) = env_or_skip(test, skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(
        Path::new("env.wat"),
        PRINT_ENV_THEN_SPIN.as_bytes(),
        &live(),
    )
    .await
    .unwrap();
    let marker = format!("wasm-env-{}", std::process::id());
    let token = format!("tok3n-{}-9f1c2e", std::process::id());
    let cancel = CancellationToken::new();
    let mut stream = env
        .exec_stream(
            ExecRequest::argv(["env.wat", marker.as_str()])
                .env("MYTOKEN", token.as_str())
                .timeout(Duration::from_secs(300)),
            &cancel,
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut err = Vec::new();
    while !String::from_utf8_lossy(&out).contains(&format!("MYTOKEN={token}")) {
        let event = tokio::time::timeout(Duration::from_secs(120), stream.next())
            .await
            .expect("the guest prints its environment within 120 s");
        match event {
            Some(Ok(skillbox_env::ExecEvent::Stdout(chunk))) => out.extend_from_slice(&chunk),
            Some(Ok(skillbox_env::ExecEvent::Stderr(chunk))) => err.extend_from_slice(&chunk),
            other => panic!(
                "{other:?} before the guest printed its environment: {} {}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            ),
        }
    }
    // The guest spins now: its runner is there to be read.
    let runners: Vec<String> = skillbox_env::testkit::host_processes_with(&marker)
        .into_iter()
        .filter(|p| p.contains(skillbox_wasm::runner::SUBCOMMAND))
        .collect();
    assert_eq!(runners.len(), 1, "{runners:?}");
    let pid = runners[0].split(':').next().unwrap();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    cancel.cancel();
    for (what, bytes) in [("cmdline", &cmdline), ("environ", &environ)] {
        assert!(
            !String::from_utf8_lossy(bytes).contains(&token),
            "the runner's {what} holds the token: {}",
            String::from_utf8_lossy(bytes).replace('\0', " ")
        );
    }
    assert!(
        String::from_utf8_lossy(&cmdline).contains(&marker),
        "the runner read is this guest's"
    );
    while stream.next().await.is_some() {}
    skillbox_env::testkit::assert_processes_gone(&marker, "a cancelled wasm exec").await;
    env.cleanup().await.unwrap();
}

/// Copies stdin to stdout until end of file.
const CAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $l
      (i32.store (i32.const 0) (i32.const 64))
      (i32.store (i32.const 4) (i32.const 4096))
      (i32.store (i32.const 8) (i32.const 0))
      (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
      (if (i32.gt_u (i32.load (i32.const 8)) (i32.const 0))
        (then
          (i32.store (i32.const 16) (i32.const 64))
          (i32.store (i32.const 20) (i32.load (i32.const 8)))
          (drop (call $write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
          (br $l))))))"#;

/// The runner reads its spec off stdin first: the guest's stdin is exactly what the
/// caller sent, not a byte of the spec, and empty when the caller sent none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_s_stdin_is_what_the_caller_sent() {
    let Some(env) = env_or_skip("wasm_stdin", skillbox_env::testkit::spec()).await else {
        return;
    };
    env.write(Path::new("cat.wat"), CAT.as_bytes(), &live())
        .await
        .unwrap();
    let input = "line one\n{\"module\": 1}\n".repeat(2500); // 57,500 bytes, under the output cap
    let output = env
        .exec(
            ExecRequest::argv(["cat.wat"])
                .env("MYTOKEN", "x")
                .stdin(input.as_str()),
            &live(),
        )
        .await
        .unwrap();
    assert_eq!(output.exit_code, Some(0), "{}", output.stderr_text());
    assert!(
        output.stdout_text() == input,
        "{} bytes back",
        output.stdout.len()
    );
    let output = run(env.as_ref(), &["cat.wat"]).await;
    assert_eq!(
        (output.exit_code, output.stdout_text()),
        (Some(0), String::new())
    );
    env.cleanup().await.unwrap();
}

// ---------------------------------------------------------------------------------------
// The installed guests.

/// A wasm sandbox with the guests installed, or a skip naming what is missing.
async fn guests_env(test: &str, spec: SandboxSpec) -> Option<Box<dyn ExecutionEnv>> {
    if !common::wasm_guests_or_skip(test) {
        return None;
    }
    env_or_skip(test, spec).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_runs_scripts_with_args_env_stdin_and_files() {
    let Some(env) = guests_env("wasm_python", skillbox_env::testkit::spec()).await else {
        return;
    };
    let output = run(env.as_ref(), &["python3", "-c", "print(1+1)"]).await;
    assert_eq!(output.stdout_text(), "2\n", "{output:?}");
    assert_eq!(output.exit_code, Some(0));

    env.create_dir(Path::new("data"), false, &live())
        .await
        .unwrap();
    env.write(
        Path::new("data/words.txt"),
        b"to be or not to be\n",
        &live(),
    )
    .await
    .unwrap();
    let script = "import os, sys\n\
        words = open('data/words.txt').read().split()\n\
        with open('/workspace/count.txt', 'w') as f:\n\
        \x20   f.write(f\"{len(words)} {sys.argv[1]} {os.environ['GREETING']} {sys.stdin.read().strip()}\")\n\
        sys.exit(4)\n";
    env.write(Path::new("count.py"), script.as_bytes(), &live())
        .await
        .unwrap();
    let output = env
        .exec(
            ExecRequest::argv(["python3", "count.py", "arg-one"])
                .env("GREETING", "hello")
                .stdin("from stdin\n"),
            &live(),
        )
        .await
        .unwrap();
    assert_eq!(output.exit_code, Some(4), "{}", output.stderr_text());
    let written = env
        .read_text(Path::new("count.txt"), &live())
        .await
        .unwrap();
    assert_eq!(written, "6 arg-one hello from stdin");

    let failed = run(
        env.as_ref(),
        &["python3", "-c", "raise ValueError('bad input')"],
    )
    .await;
    assert_eq!(failed.exit_code, Some(1));
    assert!(
        failed.stderr_text().contains("ValueError: bad input"),
        "{failed:?}"
    );
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_runs_under_quickjs_with_files() {
    let Some(env) = guests_env("wasm_quickjs", skillbox_env::testkit::spec()).await else {
        return;
    };
    let output = run(env.as_ref(), &["node", "-e", "console.log(6*7)"]).await;
    assert_eq!(output.stdout_text(), "42\n", "{output:?}");
    env.write(Path::new("in.json"), br#"{"items":[3,4,5]}"#, &live())
        .await
        .unwrap();
    let script = "import * as std from 'qjs:std';\n\
        const data = JSON.parse(std.loadFile('in.json'));\n\
        const f = std.open('/workspace/out.txt', 'w');\n\
        f.puts(String(data.items.reduce((a, b) => a + b, 0)));\n\
        f.close();\n";
    env.write(Path::new("sum.mjs"), script.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["node", "--module", "sum.mjs"]).await;
    assert_eq!(output.exit_code, Some(0), "{output:?}");
    assert_eq!(
        env.read_text(Path::new("out.txt"), &live()).await.unwrap(),
        "12"
    );
    let thrown = run(env.as_ref(), &["node", "-e", "throw new TypeError('nope')"]).await;
    assert_ne!(thrown.exit_code, Some(0), "{thrown:?}");
    assert!(thrown.stderr_text().contains("TypeError"), "{thrown:?}");
    env.cleanup().await.unwrap();
}

/// The guest's escapes: a parent path, an absolute host path, a symlink out of the
/// preopen, a socket. Each must fail inside the guest, and the host must be unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_cannot_leave_its_workspace_or_open_a_socket() {
    let Some(env) = guests_env("wasm_escapes", skillbox_env::testkit::spec()).await else {
        return;
    };
    let outside = tempfile::tempdir().unwrap();
    let planted = outside.path().join("planted.txt");
    let script = format!(
        "import os, socket\n\
        def attempt(name, f):\n\
        \x20   try:\n\
        \x20       f()\n\
        \x20       print(name, 'ESCAPED')\n\
        \x20   except Exception as e:\n\
        \x20       print(name, 'refused', type(e).__name__)\n\
        attempt('parent', lambda: open('../../../../etc/hostname').read())\n\
        attempt('absolute', lambda: open('/etc/passwd').read())\n\
        attempt('write-host', lambda: open({planted:?}, 'w').write('x'))\n\
        def via_link():\n\
        \x20   os.symlink('/etc', '/workspace/etc-link')\n\
        \x20   return open('/workspace/etc-link/passwd').read()\n\
        attempt('symlink', via_link)\n\
        def rel_link():\n\
        \x20   os.symlink('../../../../etc', '/workspace/up-link')\n\
        \x20   return open('/workspace/up-link/passwd').read()\n\
        attempt('relative-symlink', rel_link)\n\
        attempt('socket', lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(('127.0.0.1', 22)))\n\
        print('root:', sorted(os.listdir('/')))\n",
        planted = planted.to_str().unwrap()
    );
    env.write(Path::new("escape.py"), script.as_bytes(), &live())
        .await
        .unwrap();
    let output = run(env.as_ref(), &["python3", "escape.py"]).await;
    let stdout = output.stdout_text();
    assert!(
        !stdout.contains("ESCAPED"),
        "{stdout}\n{}",
        output.stderr_text()
    );
    for name in [
        "parent",
        "absolute",
        "write-host",
        "symlink",
        "relative-symlink",
        "socket",
    ] {
        assert!(
            stdout.contains(&format!("{name} refused")),
            "{name}: {stdout}\n{}",
            output.stderr_text()
        );
    }
    assert!(!planted.exists(), "the guest wrote a host file");
    // `/` is the workspace (its `.` preopen): none of the host's or the sandbox's own
    // top-level directories.
    let root = stdout.lines().find(|l| l.starts_with("root:")).unwrap();
    for host in ["'proc'", "'etc'", "'home'", "'skillbox-wasm'", "'tmp'"] {
        assert!(!root.contains(host), "{root}");
    }
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_loops_time_out_and_bombs_hit_the_memory_limit() {
    let spec = SandboxSpec {
        limits: skillbox_env::Limits {
            memory_bytes: Some(128 * 1024 * 1024),
            ..limits()
        },
        ..skillbox_env::testkit::spec()
    };
    let Some(env) = guests_env("wasm_python_limits", spec).await else {
        return;
    };
    let output = env
        .exec(
            ExecRequest::argv(["python3", "-c", "while True: pass"])
                .timeout(Duration::from_secs(2)),
            &live(),
        )
        .await
        .unwrap();
    assert!(output.timed_out, "{output:?}");

    let bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(8 * 1024 * 1024))\n";
    let output = run(env.as_ref(), &["python3", "-c", bomb]).await;
    assert_eq!(output.limit_hit, Some(LimitKind::Memory), "{output:?}");
    assert!(output.stderr_text().contains("MemoryError"), "{output:?}");
    env.cleanup().await.unwrap();
}

/// The disk bound is the native sandbox's: a guest that fills its workspace gets an
/// error, and the host's disk is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_cannot_fill_the_disk() {
    let Some(env) = guests_env("wasm_disk_fill", skillbox_env::testkit::spec()).await else {
        return;
    };
    // 4 MiB files (under the 16 MiB file-size limit) until the 64 MiB disk is full.
    let fill = "import sys\n\
        try:\n\
        \x20   for i in range(50):\n\
        \x20       with open(f'/workspace/fill-{i}.bin', 'wb') as f:\n\
        \x20           f.write(b'x' * (4 * 1024 * 1024))\n\
        except OSError as e:\n\
        \x20   print('refused', e.errno)\n\
        \x20   sys.exit(0)\n\
        print('wrote 200 MiB')\n";
    let output = run(env.as_ref(), &["python3", "-c", fill]).await;
    assert!(output.stdout_text().starts_with("refused"), "{output:?}");
    let written: u64 = env
        .walk(Path::new("/workspace"), &[], 1000, &live())
        .await
        .unwrap()
        .iter()
        .map(|e| e.size)
        .sum();
    assert!(written <= limits().disk_bytes.unwrap(), "{written}");
    env.cleanup().await.unwrap();
}

/// `skillbox exec --backend wasm` and `doctor` from the binary.
#[test]
fn the_cli_runs_a_guest_and_doctor_lists_the_backend() {
    if !common::native_or_skip("wasm_cli") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let home = wasm_home();
    let cli = |args: &[&str]| {
        std::process::Command::new(common::BIN)
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .env("SKILLBOX_WASM_HOME", &home)
            .output()
            .unwrap()
    };
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("hello.wat"), HELLO).unwrap();
    let out = cli(&[
        "exec",
        "--backend",
        "wasm",
        "--workdir",
        work.path().to_str().unwrap(),
        "--",
        "hello.wat",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", common::text(&out.stderr));
    assert_eq!(common::text(&out.stdout), "hello from wasm\n");

    let doctor = cli(&["doctor", "--json"]);
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let wasm = report["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["name"] == "wasm")
        .cloned()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(wasm["available"], true, "{wasm}");
    assert!(wasm["layers"]["wasmtime"]["available"] == true, "{wasm}");
    assert!(
        wasm["layers"]["native: seccomp"].is_object()
            || wasm["layers"]
                .as_object()
                .unwrap()
                .keys()
                .any(|k| k.starts_with("native: ")),
        "{wasm}"
    );
}

/// `skillbox run x.py --backend wasm`: the script runs under CPython for WASI, and the
/// file it makes comes back through the copy-out door; `sh` is refused by name.
#[test]
fn run_collects_what_a_python_guest_made() {
    if !common::wasm_guests_or_skip("wasm_run") {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let script = work.path().join("report.py");
    std::fs::write(
        &script,
        "import json\nwith open('report.json', 'w') as f:\n    json.dump({'sum': sum(range(10))}, f)\nprint('done')\n",
    )
    .unwrap();
    let cli = |args: &[&str]| {
        std::process::Command::new(common::BIN)
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .env("SKILLBOX_WASM_HOME", wasm_home())
            .output()
            .unwrap()
    };
    let ran = cli(&[
        "run",
        script.to_str().unwrap(),
        "--backend",
        "wasm",
        "--out",
        out.path().to_str().unwrap(),
        "--outputs",
        "*.json",
    ]);
    assert!(ran.status.success(), "{}", common::text(&ran.stderr));
    let report = std::fs::read_to_string(out.path().join("report.json")).unwrap();
    assert_eq!(report, r#"{"sum": 45}"#);

    let sh = work.path().join("x.sh");
    std::fs::write(&sh, "echo hi\n").unwrap();
    let refused = cli(&["run", sh.to_str().unwrap(), "--backend", "wasm"]);
    assert!(!refused.status.success());
    assert!(
        common::text(&refused.stderr).contains("no shell"),
        "{}",
        common::text(&refused.stderr)
    );
}
