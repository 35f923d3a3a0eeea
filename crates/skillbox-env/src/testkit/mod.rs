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
pub mod postgres;
pub mod s3;

pub use conformance::{assert_processes_gone, host_processes_with};

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{ExecutionEnv, Limits, SandboxSpec};

/// What a factory returns: an env, or why this host cannot make one.
pub type Made = Result<Box<dyn ExecutionEnv>, String>;

/// A TCP listener on the host's `127.0.0.1` that counts who reaches it (an attack on
/// an exec's connector asserts none does), answering each `host`: its port and count.
pub fn host_listener_tcp() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("bind 127.0.0.1:0: {e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    (
        port,
        count_clients(move || listener.accept().map(|(s, _)| s)),
    )
}

/// A unix socket listener on the host at `path`, counting who reaches it as
/// [`host_listener_tcp`] does.
pub fn host_listener_unix(path: &std::path::Path) -> Arc<AtomicUsize> {
    let listener = std::os::unix::net::UnixListener::bind(path)
        .unwrap_or_else(|e| panic!("bind {}: {e}", path.display()));
    count_clients(move || listener.accept().map(|(s, _)| s))
}

/// Accepts in a thread of its own, counting each client and answering it `host`.
fn count_clients<S: Write>(
    mut accept: impl FnMut() -> std::io::Result<S> + Send + 'static,
) -> Arc<AtomicUsize> {
    let hits = Arc::new(AtomicUsize::new(0));
    let counted = hits.clone();
    std::thread::spawn(move || {
        loop {
            let accepted = accept();
            counted.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut stream) = accepted {
                let _ = stream.write_all(b"host\n");
            }
        }
    });
    hits
}

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
        // /tmp gets 16 MiB of it, /workspace 48 MiB; 4096 inodes (one per 16 KiB),
        // where the backend can hold an inode bound.
        disk_bytes: Some(64 * 1024 * 1024),
        disk_inodes: None,
    }
}

/// The spec every suite test asks its factory for: a temp workspace and [`limits`].
pub fn spec() -> SandboxSpec {
    SandboxSpec {
        workspace: None,
        limits: limits(),
        ..SandboxSpec::default()
    }
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
    assert!(
        !require_all(),
        "{test}: cannot run here and SKILLBOX_REQUIRE_ALL=1: {reason}"
    );
    eprintln!("SKIP {test}: {reason}");
}

#[doc(hidden)]
#[macro_export]
macro_rules! __testkit_tests {
    ($make:path, $module:ident, [$($name:ident $(($spec:path))?),* $(,)?]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let made = $make($crate::__testkit_spec!($($spec)?)).await;
                let Some(env) = $crate::testkit::require(made, stringify!($name)) else { return };
                $crate::testkit::$module::$name(env.as_ref()).await;
                env.cleanup().await.expect("cleanup");
            }
        )*
    };
}

/// The spec of a suite's test: [`spec`], or the one its entry names (`name(spec_fn)`).
#[doc(hidden)]
#[macro_export]
macro_rules! __testkit_spec {
    () => {
        $crate::testkit::spec()
    };
    ($spec:path) => {
        $spec()
    };
}

/// Generates one `#[tokio::test]` per conformance test (in a module `conformance`), each
/// with its own env from `$make` (an `async fn(SandboxSpec) -> Made`). See [`conformance`].
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        mod conformance {
            #[allow(unused_imports, reason = "brings the caller's factory into scope")]
            use super::*;

            $crate::__testkit_tests!(
                $make,
                conformance,
                [
                    write_then_read_round_trips,
                    write_replaces_the_whole_file,
                    write_keeps_the_mode_of_a_replaced_file,
                    append_creates_then_appends,
                    read_text_lines_stops_at_max,
                    list_dir_is_sorted_and_does_not_follow_symlinks,
                    list_dir_refuses_more_than_its_bound($crate::testkit::conformance::roomy_spec),
                    walk_lists_the_tree_without_following_symlinks,
                    read_files_reads_only_regular_files_within_the_cap,
                    read_files_after_a_walk_sees_later_changes,
                    read_bytes_max_reads_at_most_the_bound,
                    put_tree_places_dirs_and_files_with_their_modes,
                    put_tree_replaces_files_with_the_tree_s_mode,
                    put_tree_scripts_run_by_their_path,
                    put_tree_replaces_a_symlink_never_writes_through,
                    put_tree_refuses_what_is_in_the_way,
                    put_tree_places_many_files_in_one_call,
                    reads_and_appends_refuse_a_fifo_at_once,
                    file_info_reports_kind_and_size,
                    rename_moves_and_replaces,
                    remove_deletes_files_and_symlinks_not_targets,
                    remove_dir_needs_recursive_when_not_empty,
                    remove_recursive_does_not_follow_symlinks,
                    create_dir_recursive_and_not,
                    exists_reports_presence_without_following,
                    canonical_resolves_a_relative_symlink,
                    temp_entries_are_distinct_and_visible_to_exec,
                    error_not_found,
                    error_already_exists,
                    error_not_directory,
                    error_is_directory,
                    error_invalid,
                    error_aborted_file_ops,
                    error_aborted_exec,
                    exec_runs_an_argv,
                    exec_runs_a_shell_script,
                    write_and_exec_writes_before_it_runs,
                    walk_after_an_exec_answers_as_a_walk_would,
                    exec_and_files_share_the_cwd,
                    exec_feeds_stdin,
                    exec_passes_env_vars,
                    exec_honours_cwd,
                    exec_reports_exit_code,
                    exec_reports_death_by_signal,
                    exec_stream_yields_chunks_then_exit,
                    exec_separates_stdout_and_stderr,
                    timeout_ends_the_exec,
                    timeout_kills_the_process_tree,
                    cancel_kills_the_process_tree,
                    cancel_ends_a_running_exec,
                    cleanup_ends_running_execs,
                    output_cap_truncates_stdout,
                    output_cap_truncates_stderr,
                ]
            );
        }
    };
}

/// Generates one `#[tokio::test]` per adversarial test (in a module `adversarial`), each
/// with its own env from `$make` (an `async fn(SandboxSpec) -> Made`). For sandbox
/// backends only: `HostEnv` fails it by design. See [`adversarial`].
#[macro_export]
macro_rules! adversarial_suite {
    ($make:path) => {
        mod adversarial {
            #[allow(unused_imports, reason = "brings the caller's factory into scope")]
            use super::*;

            $crate::__testkit_tests!(
                $make,
                adversarial,
                [
                    write_host_etc,
                    write_host_usr,
                    write_host_home,
                    write_host_tmp,
                    read_host_shadow,
                    read_host_root,
                    read_proc1_environ,
                    see_host_processes,
                    loopback_curl,
                    loopback_bash_dev_tcp,
                    loopback_node_fetch,
                    interfaces_only_lo,
                    raw_and_packet_sockets,
                    socket_protocols_beyond_tcp_udp_refused,
                    setuid_files_cannot_be_made,
                    abstract_unix_socket,
                    host_unix_sockets,
                    ptrace_denied,
                    user_namespace_denied,
                    mount_denied,
                    io_uring_and_bpf_denied,
                    tiocsti_denied,
                    tiocsetd_denied,
                    personality_flags_denied,
                    kernel_surface_syscalls_denied,
                    fork_bomb,
                    memory_bomb,
                    workspace_disk_fill,
                    tmp_disk_fill,
                    disk_bound_holds,
                    disk_inodes_bound,
                    output_flood,
                    timeout_kills,
                    daemon_does_not_survive,
                    last_exec_leftovers_die_before_the_next_exec,
                    last_exec_ends_though_a_leftover_holds_its_output,
                    host_fd_not_inherited,
                    privileges_dropped,
                    workspace_symlink_read,
                    workspace_symlink_write,
                    workspace_symlink_put_tree,
                ]
            );
        }
    };
}

/// A TCP port of 127.0.0.1 free now, for a server a test starts.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("a free port: {e}"))
}
