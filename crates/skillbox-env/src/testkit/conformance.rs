//! The conformance suite: what every backend must do the same way — file operations,
//! error codes, exec, timeouts, cancellation and output caps. Each test takes an env made
//! from [`super::spec`] and uses relative paths, so it runs unchanged on the host (its
//! cwd) and in a sandbox (`/workspace`). Run it with `conformance_suite!(make_env)`.
//!
//! Checks that a process tree is really gone read the host's `/proc`: every sleeper a
//! test starts carries a fresh random number (see `marker`) that no other process has.

#![expect(
    clippy::expect_used,
    reason = "a conformance test reports a failure by panicking"
)]

use std::fmt::Debug;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{
    CancellationToken, EnvResult, ErrorCode, ExecEvent, ExecOutput, ExecRequest, ExecStream,
    ExecutionEnv, FileKind, FileRead, LimitKind, Tree,
};

/// Longest a test waits for one thing (an event, a file, a process to die) before it
/// fails. A bound against hangs, not a speed check.
const BOUND: Duration = Duration::from_secs(60);
/// Longest a test waits for killed processes to disappear. Well below the suite's exec
/// timeout ([`super::limits`]), so a timeout cannot pass for a cancel that did nothing.
const KILL_BOUND: Duration = Duration::from_secs(10);
/// A request timeout no test reaches: the exec must end by cancel or cleanup instead.
const NEVER: Duration = Duration::from_secs(3600);
/// Step of every bounded poll.
const POLL_STEP: Duration = Duration::from_millis(50);

// ---------------------------------------------------------------------------------------
// helpers

fn path(p: &str) -> &Path {
    Path::new(p)
}

fn live() -> CancellationToken {
    CancellationToken::new()
}

fn cancelled() -> CancellationToken {
    let token = CancellationToken::new();
    token.cancel();
    token
}

fn assert_code<T: Debug>(result: EnvResult<T>, expected: ErrorCode, what: &str) {
    match result {
        Ok(value) => panic!("{what}: expected {expected}, got Ok({value:?})"),
        Err(err) => assert_eq!(err.code, expected, "{what}: wrong code in {err}"),
    }
}

async fn write(env: &dyn ExecutionEnv, p: &str, data: impl AsRef<[u8]>) {
    env.write(path(p), data.as_ref(), &live())
        .await
        .unwrap_or_else(|e| panic!("write {p}: {e}"));
}

async fn read(env: &dyn ExecutionEnv, p: &str) -> String {
    env.read_text(path(p), &live())
        .await
        .unwrap_or_else(|e| panic!("read_text {p}: {e}"))
}

async fn exists(env: &dyn ExecutionEnv, p: &str) -> bool {
    env.exists(path(p), &live())
        .await
        .unwrap_or_else(|e| panic!("exists {p}: {e}"))
}

async fn mkdir(env: &dyn ExecutionEnv, p: &str) {
    env.create_dir(path(p), true, &live())
        .await
        .unwrap_or_else(|e| panic!("create_dir {p}: {e}"));
}

async fn run(env: &dyn ExecutionEnv, request: ExecRequest) -> ExecOutput {
    let what = format!("{:?}", request.command);
    within(&what, env.exec(request, &live()))
        .await
        .unwrap_or_else(|e| panic!("exec {what}: {e}"))
}

/// Runs a shell script that must succeed (helpers such as `ln -s`).
async fn sh_ok(env: &dyn ExecutionEnv, script: &str) -> ExecOutput {
    let output = run(env, ExecRequest::shell(script)).await;
    assert!(
        output.success(),
        "`{script}` failed: status {}, stderr {:?}",
        output.shell_status(),
        output.stderr_text()
    );
    output
}

async fn within<T>(what: &str, work: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, work).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: no result within {BOUND:?}"),
    }
}

/// A number no other process on the machine has in its command line: used as the
/// duration of the sleepers a test must see killed.
fn marker() -> String {
    let mut bytes = [0u8; 4];
    skillbox_protocol::random::fill(&mut bytes).expect("random bytes");
    format!("98{:08}", u32::from_le_bytes(bytes) % 100_000_000)
}

/// Host processes whose command line mentions `marker` (NULs read as spaces), as
/// `pid: cmdline`.
pub fn host_processes_with(marker: &str) -> Vec<String> {
    let entries = std::fs::read_dir("/proc").expect("read the host's /proc");
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // Gone between listing and reading, or not ours to read: not a match.
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(marker) {
            found.push(format!("{name}: {}", cmdline.trim_end()));
        }
    }
    found
}

/// Polls the host's `/proc` (bounded) until no process mentions `marker`; kills and
/// fails on survivors.
pub async fn assert_processes_gone(marker: &str, what: &str) {
    let deadline = tokio::time::Instant::now() + KILL_BOUND;
    loop {
        let left = host_processes_with(marker);
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            // Do not leave the survivors behind for the next run.
            for pid in left
                .iter()
                .filter_map(|p| p.split(':').next()?.parse::<i32>().ok())
            {
                // SAFETY: kill(2) on a process whose command line carries this test's
                // unique marker; it takes no pointers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            panic!("{what}: processes still alive after {KILL_BOUND:?}: {left:?}");
        }
        tokio::time::sleep(POLL_STEP).await;
    }
}

/// Polls (bounded) until `p` exists in the env.
async fn wait_for_file(env: &dyn ExecutionEnv, p: &str) {
    let deadline = tokio::time::Instant::now() + BOUND;
    while !exists(env, p).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{p} did not appear within {BOUND:?}"
        );
        tokio::time::sleep(POLL_STEP).await;
    }
}

/// Reads events until stdout contains `needle`; fails on exit, error or end of stream.
async fn read_until_stdout(stream: &mut ExecStream, needle: &str) {
    let mut stdout = Vec::new();
    loop {
        match within("waiting for output", stream.next()).await {
            Some(Ok(ExecEvent::Stdout(chunk))) => {
                stdout.extend_from_slice(&chunk);
                if String::from_utf8_lossy(&stdout).contains(needle) {
                    return;
                }
            }
            Some(Ok(ExecEvent::Stderr(_))) => {}
            Some(Ok(ExecEvent::Exit(output))) => {
                panic!("exited before printing {needle:?}: {output:?}, stdout {stdout:?}")
            }
            Some(Err(e)) => panic!("stream failed before printing {needle:?}: {e}"),
            None => panic!("stream ended before printing {needle:?}"),
        }
    }
}

/// Reads the rest of a stream that must end with an `aborted` error.
async fn expect_aborted(stream: &mut ExecStream) {
    loop {
        match within("waiting for the cancelled exec to end", stream.next()).await {
            Some(Ok(ExecEvent::Stdout(_) | ExecEvent::Stderr(_))) => {}
            Some(Ok(ExecEvent::Exit(output))) => {
                panic!("a cancelled exec must end with `aborted`, not an exit: {output:?}")
            }
            Some(Err(e)) => {
                assert_eq!(e.code, ErrorCode::Aborted, "cancelled exec: {e}");
                return;
            }
            None => panic!("a cancelled exec must end with `aborted`, the stream just ended"),
        }
    }
}

/// `(name, kind)` of each entry of a directory, in the order `list_dir` gives them.
async fn listing(env: &dyn ExecutionEnv, p: &str) -> Vec<(String, FileKind, Option<u64>)> {
    let entries = env
        .list_dir(path(p), &live())
        .await
        .unwrap_or_else(|e| panic!("list_dir {p}: {e}"));
    entries
        .into_iter()
        .map(|e| (e.name, e.kind, e.size))
        .collect()
}

/// A listed entry: a regular file with its size, anything else without one.
fn entry(name: &str, kind: FileKind) -> (String, FileKind, Option<u64>) {
    (name.to_string(), kind, None)
}

fn file_entry(name: &str, size: u64) -> (String, FileKind, Option<u64>) {
    (name.to_string(), FileKind::File, Some(size))
}

// ---------------------------------------------------------------------------------------
// file operations

pub async fn write_then_read_round_trips(env: &dyn ExecutionEnv) {
    write(env, "hello.txt", "hello, world\nsecond line\n").await;
    assert_eq!(read(env, "hello.txt").await, "hello, world\nsecond line\n");

    let bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    env.write(path("bytes.bin"), &bytes, &live())
        .await
        .expect("write binary");
    assert_eq!(
        env.read_bytes(path("bytes.bin"), &live())
            .await
            .expect("read_bytes"),
        bytes
    );

    write(env, "empty.txt", "").await;
    assert_eq!(read(env, "empty.txt").await, "");

    // Absolute paths name the same files as relative ones.
    let absolute = env.absolute(path("hello.txt"));
    assert!(absolute.is_absolute(), "absolute() gave {absolute:?}");
    let text = env
        .read_text(&absolute, &live())
        .await
        .expect("read by absolute path");
    assert_eq!(text, "hello, world\nsecond line\n");
}

pub async fn write_replaces_the_whole_file(env: &dyn ExecutionEnv) {
    mkdir(env, "dir").await;
    write(
        env,
        "dir/f.txt",
        "a much longer first version of the file\n".repeat(100),
    )
    .await;
    write(env, "dir/f.txt", "short\n").await;
    assert_eq!(read(env, "dir/f.txt").await, "short\n");
    // Replacing goes through no leftover temporary file.
    assert_eq!(listing(env, "dir").await, vec![file_entry("f.txt", 6)]);
}

pub async fn write_keeps_the_mode_of_a_replaced_file(env: &dyn ExecutionEnv) {
    write(env, "script.sh", "#!/bin/sh\necho one\n").await;
    sh_ok(env, "chmod 750 script.sh").await;
    write(env, "script.sh", "#!/bin/sh\necho two\n").await;
    let info = env
        .file_info(path("script.sh"), &live())
        .await
        .expect("file_info");
    assert_eq!(
        info.mode & 0o777,
        0o750,
        "mode after replacing: {:o}",
        info.mode
    );
    // Checked by a process too, not only by the env's own stat (`test -x` does not need
    // an exec-mounted filesystem).
    let output = run(env, ExecRequest::argv(["test", "-x", "script.sh"])).await;
    assert!(
        output.success(),
        "the replaced script must stay executable: {output:?}"
    );
    assert_eq!(read(env, "script.sh").await, "#!/bin/sh\necho two\n");
}

pub async fn append_creates_then_appends(env: &dyn ExecutionEnv) {
    assert!(!exists(env, "log.txt").await);
    env.append(path("log.txt"), b"one\n", &live())
        .await
        .expect("append (create)");
    assert_eq!(read(env, "log.txt").await, "one\n");
    env.append(path("log.txt"), b"two\n", &live())
        .await
        .expect("append");
    assert_eq!(read(env, "log.txt").await, "one\ntwo\n");
}

pub async fn read_text_lines_stops_at_max(env: &dyn ExecutionEnv) {
    write(env, "lines.txt", "a\nb\nc\n").await;
    let lines = |max| async move {
        env.read_text_lines(path("lines.txt"), max, &live())
            .await
            .expect("read_text_lines")
    };
    let two = lines(2).await;
    assert_eq!(two.lines, ["a", "b"]);
    assert!(two.truncated, "2 of 3 lines must say truncated");
    let three = lines(3).await;
    assert_eq!(three.lines, ["a", "b", "c"]);
    assert!(!three.truncated, "all 3 lines must not say truncated");
    let ten = lines(10).await;
    assert_eq!(ten.lines, ["a", "b", "c"]);
    assert!(!ten.truncated);
    let none = lines(0).await;
    assert!(none.lines.is_empty());
    assert!(none.truncated, "0 of 3 lines must say truncated");

    write(env, "no-newline.txt", "x\ny").await;
    let last = env
        .read_text_lines(path("no-newline.txt"), 5, &live())
        .await
        .expect("read");
    assert_eq!(last.lines, ["x", "y"]);
    assert!(!last.truncated);
}

pub async fn list_dir_is_sorted_and_does_not_follow_symlinks(env: &dyn ExecutionEnv) {
    mkdir(env, "d").await;
    write(env, "d/b.txt", "bbb").await;
    write(env, "d/a.txt", "a").await;
    mkdir(env, "d/c").await;
    // FileSystem has no symlink operation; the env's processes make them.
    sh_ok(
        env,
        "cd d && ln -s a.txt e-file && ln -s c f-dir && ln -s missing g-dangling",
    )
    .await;
    assert_eq!(
        listing(env, "d").await,
        vec![
            file_entry("a.txt", 1),
            file_entry("b.txt", 3),
            entry("c", FileKind::Dir),
            entry("e-file", FileKind::Symlink),
            entry("f-dir", FileKind::Symlink),
            entry("g-dangling", FileKind::Symlink),
        ]
    );
    assert!(listing(env, "d/c").await.is_empty());
}

/// [`super::spec`] with room for more files than a listing gives: the suite's disk bound
/// holds 4096 inodes, this one 196,608 in the workspace (one per 16 KiB of its 3 GiB; not
/// asked for outright, which gVisor cannot hold).
pub fn roomy_spec() -> crate::SandboxSpec {
    let mut spec = super::spec();
    spec.limits.disk_bytes = Some(4 << 30);
    // 100,000 files are 100,000 syscalls, each slower under gVisor (seconds on a busy
    // machine): more than the suite's 20 s.
    spec.limits.timeout_ms = 120_000;
    spec.limits.cpu_seconds = Some(120);
    spec.limits.memory_bytes = Some(1 << 30);
    spec
}

/// A directory the sandboxed code filled with more entries than a listing gives: the
/// listing is refused, naming the directory, instead of growing with what is there; at
/// the bound it is whole.
pub async fn list_dir_refuses_more_than_its_bound(env: &dyn ExecutionEnv) {
    let bound = crate::MAX_LIST_ENTRIES;
    // Empty files made by mknod: one syscall an entry.
    sh_ok(
        env,
        &format!(
            "python3 -c \"import os; os.mkdir('full'); [os.mknod('full/%d' % i) for i in range({bound})]\""
        ),
    )
    .await;
    let cancel = CancellationToken::new();
    let listed = within("list_dir", env.list_dir(Path::new("full"), &cancel))
        .await
        .expect("a listing at the bound");
    assert_eq!(listed.len(), bound);
    sh_ok(env, "touch full/one-more").await;
    let err = within("list_dir", env.list_dir(Path::new("full"), &cancel))
        .await
        .expect_err("more than the bound");
    assert_eq!(err.code, ErrorCode::ResourceExhausted, "{err}");
    assert!(
        err.message.contains("full") && err.message.contains(&bound.to_string()),
        "{err}"
    );
}

pub async fn walk_lists_the_tree_without_following_symlinks(env: &dyn ExecutionEnv) {
    mkdir(env, "t/sub/deeper").await;
    write(env, "t/b.txt", "bb").await;
    write(env, "t/a.txt", "a").await;
    write(env, "t/sub/c.txt", "ccc").await;
    write(env, "t/sub/deeper/d.txt", "").await;
    mkdir(env, "t/skip").await;
    write(env, "t/skip/hidden.txt", "x").await;
    // A link to a directory outside the walked tree: listed as a link, never entered.
    sh_ok(
        env,
        "mkdir -p outside && echo o > outside/o.txt && ln -s ../outside t/link",
    )
    .await;
    let walked = env
        .walk(path("t"), &["skip"], 100, &live())
        .await
        .unwrap_or_else(|e| panic!("walk: {e}"));
    let shown: Vec<(&str, FileKind, u64)> = walked
        .iter()
        .map(|e| (e.path.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("a.txt", FileKind::File, 1),
            ("b.txt", FileKind::File, 2),
            ("link", FileKind::Symlink, 0),
            ("skip", FileKind::Dir, 0),
            ("sub", FileKind::Dir, 0),
            ("sub/c.txt", FileKind::File, 3),
            ("sub/deeper", FileKind::Dir, 0),
            ("sub/deeper/d.txt", FileKind::File, 0),
        ]
    );
    // Too many entries is an error, not a partial listing.
    assert_code(
        env.walk(path("t"), &[], 3, &live()).await,
        ErrorCode::ResourceExhausted,
        "walk over the limit",
    );
    // The root itself is not followed either.
    sh_ok(env, "ln -s t t-link").await;
    assert_code(
        env.walk(path("t-link"), &[], 100, &live()).await,
        ErrorCode::NotDirectory,
        "walk through a symlink",
    );
    assert_code(
        env.walk(path("t/a.txt"), &[], 100, &live()).await,
        ErrorCode::NotDirectory,
        "walk of a file",
    );
}

/// `read_files` after a `walk` reads the files as they are then: what an exec or a
/// write changed since the walk is seen (a backend may read a small tree along with
/// its listing, and must not answer with that once anything else began).
pub async fn read_files_after_a_walk_sees_later_changes(env: &dyn ExecutionEnv) {
    mkdir(env, "w").await;
    write(env, "w/a.txt", "first").await;
    write(env, "w/b.txt", "first").await;
    let read = |names: &'static [&'static str]| async move {
        let paths: Vec<PathBuf> = names.iter().map(|n| path(n).to_path_buf()).collect();
        env.read_files(&paths, 100, &live())
            .await
            .unwrap_or_else(|e| panic!("read_files: {e}"))
    };
    let walk = || async {
        env.walk(path("w"), &[], 100, &live())
            .await
            .unwrap_or_else(|e| panic!("walk: {e}"))
    };
    // Nothing between: the walk's view is the files' view.
    walk().await;
    assert_eq!(
        read(&["w/a.txt", "w/b.txt"]).await,
        [
            FileRead::Content(b"first".to_vec()),
            FileRead::Content(b"first".to_vec())
        ]
    );
    // Twice in a row after one walk: the second answer is as fresh as the first.
    walk().await;
    assert_eq!(
        read(&["w/a.txt"]).await,
        [FileRead::Content(b"first".to_vec())]
    );
    assert_eq!(
        read(&["w/a.txt"]).await,
        [FileRead::Content(b"first".to_vec())]
    );
    // An exec changes one, removes the other.
    walk().await;
    sh_ok(env, "echo exec > w/a.txt && rm w/b.txt").await;
    assert_eq!(
        read(&["w/a.txt", "w/b.txt"]).await,
        [FileRead::Content(b"exec\n".to_vec()), FileRead::Missing]
    );
    // A write through the file view.
    walk().await;
    write(env, "w/a.txt", "written").await;
    assert_eq!(
        read(&["w/a.txt"]).await,
        [FileRead::Content(b"written".to_vec())]
    );
}

pub async fn read_files_reads_only_regular_files_within_the_cap(env: &dyn ExecutionEnv) {
    mkdir(env, "r").await;
    write(env, "r/small.txt", "small").await;
    write(env, "r/empty.txt", "").await;
    write(env, "r/big.bin", [7u8; 20]).await;
    sh_ok(
        env,
        "cd r && ln -s small.txt link && mkdir dir && mkfifo fifo",
    )
    .await;
    let names = [
        "r/small.txt",
        "r/missing",
        "r/big.bin",
        "r/link",
        "r/dir",
        "r/fifo",
        "r/empty.txt",
    ];
    let paths: Vec<PathBuf> = names.iter().map(|n| env.absolute(path(n))).collect();
    // A FIFO is never opened: the call returns instead of waiting for a writer.
    let read = env
        .read_files(&paths, 10, &live())
        .await
        .unwrap_or_else(|e| panic!("read_files: {e}"));
    assert_eq!(
        read,
        vec![
            FileRead::Content(b"small".to_vec()),
            FileRead::Missing,
            FileRead::TooLarge(20),
            FileRead::NotFile,
            FileRead::NotFile,
            FileRead::NotFile,
            FileRead::Content(Vec::new()),
        ]
    );
    assert_code(
        env.read_files(&paths, 10, &cancelled()).await,
        ErrorCode::Aborted,
        "read_files cancelled",
    );
}

/// `read_bytes_max` hands out a regular file of at most its bound, and refuses one past
/// it (`resource_exhausted`), a symlink (never followed), a directory, a FIFO (at once)
/// and a missing path with the codes the other reads use.
pub async fn read_bytes_max_reads_at_most_the_bound(env: &dyn ExecutionEnv) {
    async fn read(env: &dyn ExecutionEnv, p: &str, max: u64) -> EnvResult<Vec<u8>> {
        tokio::time::timeout(BOUND, env.read_bytes_max(path(p), max, &live()))
            .await
            .unwrap_or_else(|_| panic!("read_bytes_max {p} is still waiting"))
    }
    mkdir(env, "m").await;
    write(env, "m/ten.bin", [1u8; 10]).await;
    write(env, "m/empty.txt", "").await;
    sh_ok(
        env,
        "cd m && ln -s ten.bin link && mkdir dir && mkfifo fifo",
    )
    .await;
    assert_eq!(read(env, "m/ten.bin", 10).await.ok(), Some(vec![1u8; 10]));
    assert_eq!(read(env, "m/ten.bin", 11).await.ok(), Some(vec![1u8; 10]));
    assert_eq!(read(env, "m/empty.txt", 0).await.ok(), Some(Vec::new()));
    assert_code(
        read(env, "m/ten.bin", 9).await,
        ErrorCode::ResourceExhausted,
        "read_bytes_max of 10 bytes with a bound of 9",
    );
    assert_code(
        read(env, "m/ten.bin", 0).await,
        ErrorCode::ResourceExhausted,
        "read_bytes_max of 10 bytes with a bound of 0",
    );
    assert_code(
        read(env, "m/link", 10).await,
        ErrorCode::Invalid,
        "read_bytes_max of a symlink",
    );
    assert_code(
        read(env, "m/dir", 10).await,
        ErrorCode::IsDirectory,
        "read_bytes_max of a directory",
    );
    assert_code(
        read(env, "m/fifo", 10).await,
        ErrorCode::Invalid,
        "read_bytes_max of a FIFO",
    );
    assert_code(
        read(env, "m/missing", 10).await,
        ErrorCode::NotFound,
        "read_bytes_max of a missing file",
    );
    assert_code(
        env.read_bytes_max(path("m/ten.bin"), 10, &cancelled())
            .await,
        ErrorCode::Aborted,
        "read_bytes_max cancelled",
    );
}

/// A FIFO (or any special file) planted where a file is expected fails every read and
/// append at once, with `invalid`: no tool, agent run or shutdown waits on a writer that
/// never comes.
pub async fn reads_and_appends_refuse_a_fifo_at_once(env: &dyn ExecutionEnv) {
    async fn at_once<T>(what: &str, op: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(10), op)
            .await
            .unwrap_or_else(|_| panic!("{what} of a FIFO is still waiting"))
    }
    mkdir(env, "f").await;
    sh_ok(env, "mkfifo f/pipe").await;
    let pipe = path("f/pipe");
    let read = at_once("read_bytes", env.read_bytes(pipe, &live())).await;
    assert_code(read, ErrorCode::Invalid, "read_bytes of a FIFO");
    let text = at_once("read_text", env.read_text(pipe, &live())).await;
    assert_code(text, ErrorCode::Invalid, "read_text of a FIFO");
    let lines = at_once("read_text_lines", env.read_text_lines(pipe, 10, &live())).await;
    assert_code(lines, ErrorCode::Invalid, "read_text_lines of a FIFO");
    let append = at_once("append", env.append(pipe, b"x", &live())).await;
    assert_code(append, ErrorCode::Invalid, "append to a FIFO");
}

pub async fn file_info_reports_kind_and_size(env: &dyn ExecutionEnv) {
    write(env, "f.txt", "12345").await;
    mkdir(env, "d").await;
    sh_ok(env, "ln -s f.txt link").await;
    let info = |p: &'static str| async move {
        env.file_info(path(p), &live())
            .await
            .unwrap_or_else(|e| panic!("file_info {p}: {e}"))
    };
    let file = info("f.txt").await;
    assert_eq!(file.kind, FileKind::File);
    assert_eq!(file.size, 5);
    assert!(!file.read_only, "a file the env just wrote is writable");
    assert_eq!(info("d").await.kind, FileKind::Dir);
    // The link itself, not its target.
    assert_eq!(info("link").await.kind, FileKind::Symlink);
}

pub async fn rename_moves_and_replaces(env: &dyn ExecutionEnv) {
    write(env, "a.txt", "first").await;
    env.rename(path("a.txt"), path("b.txt"), &live())
        .await
        .expect("rename");
    assert!(
        !exists(env, "a.txt").await,
        "rename leaves no source behind"
    );
    assert_eq!(read(env, "b.txt").await, "first");

    write(env, "c.txt", "old content that is longer").await;
    env.rename(path("b.txt"), path("c.txt"), &live())
        .await
        .expect("rename over a file");
    assert!(!exists(env, "b.txt").await);
    assert_eq!(read(env, "c.txt").await, "first");

    mkdir(env, "sub").await;
    env.rename(path("c.txt"), path("sub/moved.txt"), &live())
        .await
        .expect("rename into dir");
    assert_eq!(read(env, "sub/moved.txt").await, "first");
}

pub async fn remove_deletes_files_and_symlinks_not_targets(env: &dyn ExecutionEnv) {
    write(env, "f.txt", "x").await;
    env.remove(path("f.txt"), false, &live())
        .await
        .expect("remove file");
    assert!(!exists(env, "f.txt").await);

    write(env, "target.txt", "kept").await;
    mkdir(env, "target-dir/inner").await;
    write(env, "target-dir/inner/kept.txt", "kept").await;
    sh_ok(
        env,
        "ln -s target.txt file-link && ln -s target-dir dir-link",
    )
    .await;
    env.remove(path("file-link"), false, &live())
        .await
        .expect("remove symlink to file");
    env.remove(path("dir-link"), true, &live())
        .await
        .expect("remove symlink to dir");
    assert!(!exists(env, "file-link").await);
    assert!(!exists(env, "dir-link").await);
    assert_eq!(read(env, "target.txt").await, "kept");
    assert_eq!(read(env, "target-dir/inner/kept.txt").await, "kept");
}

pub async fn remove_dir_needs_recursive_when_not_empty(env: &dyn ExecutionEnv) {
    mkdir(env, "empty").await;
    env.remove(path("empty"), false, &live())
        .await
        .expect("remove empty dir");
    assert!(!exists(env, "empty").await);

    mkdir(env, "tree/a/b").await;
    write(env, "tree/a/b/f.txt", "x").await;
    write(env, "tree/g.txt", "y").await;
    assert_code(
        env.remove(path("tree"), false, &live()).await,
        ErrorCode::AlreadyExists,
        "remove a non-empty dir without recursive",
    );
    assert_eq!(
        read(env, "tree/a/b/f.txt").await,
        "x",
        "a refused remove deletes nothing"
    );
    env.remove(path("tree"), true, &live())
        .await
        .expect("remove recursive");
    assert!(!exists(env, "tree").await);
}

pub async fn remove_recursive_does_not_follow_symlinks(env: &dyn ExecutionEnv) {
    mkdir(env, "keep").await;
    write(env, "keep/precious.txt", "precious").await;
    mkdir(env, "tree").await;
    sh_ok(
        env,
        "ln -s ../keep tree/out && ln -s ../keep/precious.txt tree/file",
    )
    .await;
    env.remove(path("tree"), true, &live())
        .await
        .expect("remove recursive");
    assert!(!exists(env, "tree").await);
    assert_eq!(read(env, "keep/precious.txt").await, "precious");
}

pub async fn create_dir_recursive_and_not(env: &dyn ExecutionEnv) {
    env.create_dir(path("one"), false, &live())
        .await
        .expect("create_dir");
    assert_eq!(listing(env, ".").await, vec![entry("one", FileKind::Dir)]);

    assert_code(
        env.create_dir(path("x/y"), false, &live()).await,
        ErrorCode::NotFound,
        "create_dir without recursive under a missing parent",
    );
    assert!(
        !exists(env, "x").await,
        "a refused create_dir creates nothing"
    );

    env.create_dir(path("x/y/z"), true, &live())
        .await
        .expect("create_dir recursive");
    assert_eq!(listing(env, "x/y").await, vec![entry("z", FileKind::Dir)]);
    // Like `mkdir -p`: an existing dir is fine.
    env.create_dir(path("x/y/z"), true, &live())
        .await
        .expect("create_dir recursive again");
}

pub async fn exists_reports_presence_without_following(env: &dyn ExecutionEnv) {
    assert!(!exists(env, "nothing-here").await);
    assert!(!exists(env, "nothing/here/either").await);
    write(env, "f.txt", "x").await;
    mkdir(env, "d").await;
    assert!(exists(env, "f.txt").await);
    assert!(exists(env, "d").await);
    assert!(exists(env, ".").await);
    sh_ok(env, "ln -s missing dangling").await;
    assert!(
        exists(env, "dangling").await,
        "a dangling symlink is itself an entry"
    );
}

pub async fn canonical_resolves_a_relative_symlink(env: &dyn ExecutionEnv) {
    mkdir(env, "real/deeper").await;
    write(env, "real/deeper/f.txt", "x").await;
    sh_ok(env, "ln -s real link && ln -s real/deeper/f.txt file-link").await;
    let canonical = |p: &'static str| async move {
        env.canonical(path(p), &live())
            .await
            .unwrap_or_else(|e| panic!("canonical {p}: {e}"))
    };
    let real = canonical("real").await;
    assert_eq!(real, canonical(".").await.join("real"));
    assert_eq!(canonical("link").await, real);
    assert_eq!(
        canonical("link/deeper/f.txt").await,
        real.join("deeper/f.txt")
    );
    assert_eq!(canonical("file-link").await, real.join("deeper/f.txt"));
    assert_eq!(
        canonical("link/deeper/../deeper").await,
        real.join("deeper")
    );
}

pub async fn temp_entries_are_distinct_and_visible_to_exec(env: &dyn ExecutionEnv) {
    let dir_a = env
        .create_temp_dir("conformance-", &live())
        .await
        .expect("create_temp_dir");
    let dir_b = env
        .create_temp_dir("conformance-", &live())
        .await
        .expect("create_temp_dir");
    let file_a = env
        .create_temp_file("conformance-", &live())
        .await
        .expect("create_temp_file");
    let file_b = env
        .create_temp_file("conformance-", &live())
        .await
        .expect("create_temp_file");
    let all = [&dir_a, &dir_b, &file_a, &file_b];
    for (i, a) in all.iter().enumerate() {
        assert!(a.is_absolute(), "temp path {a:?} must be absolute");
        let name = a
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        assert!(
            name.starts_with("conformance-"),
            "temp name {name:?} keeps its prefix"
        );
        for b in &all[i + 1..] {
            assert_ne!(a, b, "temp paths must differ");
        }
    }
    for (p, kind, test) in [
        (&dir_a, FileKind::Dir, "-d"),
        (&dir_b, FileKind::Dir, "-d"),
        (&file_a, FileKind::File, "-f"),
        (&file_b, FileKind::File, "-f"),
    ] {
        let info = env
            .file_info(p, &live())
            .await
            .expect("file_info of a temp entry");
        assert_eq!(info.kind, kind, "{p:?}");
        let shown = p.to_string_lossy().into_owned();
        let output = run(env, ExecRequest::argv(["test", test, &shown])).await;
        assert!(
            output.success(),
            "exec `test {test} {shown}` must see it: {output:?}"
        );
    }
    assert!(listing(env, &dir_a.to_string_lossy()).await.is_empty());
    assert_eq!(
        env.file_info(&file_a, &live())
            .await
            .expect("file_info")
            .size,
        0
    );

    env.write(&file_a, b"in a temp file", &live())
        .await
        .expect("write temp file");
    let inside: PathBuf = dir_a.join("inner.txt");
    env.write(&inside, b"in a temp dir", &live())
        .await
        .expect("write in temp dir");
    let shown = file_a.to_string_lossy().into_owned();
    assert_eq!(
        run(env, ExecRequest::argv(["cat", &shown]))
            .await
            .stdout_text(),
        "in a temp file"
    );
}

// ---------------------------------------------------------------------------------------
// put_tree

fn tree(entries: &[(&str, Option<(&str, bool)>)]) -> Tree {
    let mut tree = Tree::new();
    for (p, file) in entries {
        match file {
            None => tree.dir(*p),
            Some((data, executable)) => tree.file(*p, data.as_bytes().to_vec(), *executable),
        }
        .unwrap_or_else(|e| panic!("tree entry {p}: {e}"));
    }
    tree
}

async fn put_tree(env: &dyn ExecutionEnv, dir: &str, tree: &Tree) {
    env.put_tree(path(dir), tree, &live())
        .await
        .unwrap_or_else(|e| panic!("put_tree {dir}: {e}"));
}

async fn mode(env: &dyn ExecutionEnv, p: &str) -> u32 {
    let info = env
        .file_info(path(p), &live())
        .await
        .unwrap_or_else(|e| panic!("file_info {p}: {e}"));
    assert_eq!(info.kind, FileKind::File, "{p}");
    info.mode & 0o7777
}

/// Directories (an empty one too) and files with their content and modes, beneath a
/// directory made with its parents; nothing else left there (no temp names).
pub async fn put_tree_places_dirs_and_files_with_their_modes(env: &dyn ExecutionEnv) {
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let mut placed = tree(&[
        ("SKILL.md", Some(("# a skill\n", false))),
        ("scripts/run.sh", Some(("#!/bin/sh\necho ran\n", true))),
        ("scripts/lib/data.json", Some(("{}", false))),
        ("empty/inner", None),
    ]);
    placed
        .file("bin/tool", binary.clone(), true)
        .expect("tree entry");
    put_tree(env, "skills/one", &placed).await;
    assert_eq!(read(env, "skills/one/SKILL.md").await, "# a skill\n");
    assert_eq!(
        read(env, "skills/one/scripts/run.sh").await,
        "#!/bin/sh\necho ran\n"
    );
    assert_eq!(read(env, "skills/one/scripts/lib/data.json").await, "{}");
    let tool = env
        .read_bytes(path("skills/one/bin/tool"), &live())
        .await
        .expect("read_bytes");
    assert_eq!(tool, binary);
    for (p, expected) in [
        ("skills/one/SKILL.md", 0o644),
        ("skills/one/scripts/run.sh", 0o755),
        ("skills/one/scripts/lib/data.json", 0o644),
        ("skills/one/bin/tool", 0o755),
    ] {
        assert_eq!(mode(env, p).await, expected, "mode of {p}");
    }
    let walked = env
        .walk(path("skills"), &[], 100, &live())
        .await
        .expect("walk");
    let shown: Vec<(&str, FileKind, bool)> = walked
        .iter()
        .map(|e| (e.path.as_str(), e.kind, e.executable))
        .collect();
    assert_eq!(
        shown,
        vec![
            ("one", FileKind::Dir, false),
            ("one/SKILL.md", FileKind::File, false),
            ("one/bin", FileKind::Dir, false),
            ("one/empty", FileKind::Dir, false),
            ("one/scripts", FileKind::Dir, false),
            ("one/bin/tool", FileKind::File, true),
            ("one/empty/inner", FileKind::Dir, false),
            ("one/scripts/lib", FileKind::Dir, false),
            ("one/scripts/run.sh", FileKind::File, true),
            ("one/scripts/lib/data.json", FileKind::File, false),
        ],
        "walk says which files are executable"
    );
    // An empty tree still makes its directory.
    put_tree(env, "skills/none", &Tree::new()).await;
    assert!(listing(env, "skills/none").await.is_empty());
}

/// Placing a tree again replaces its files, with the new tree's modes (not those of the
/// files replaced), and leaves what the tree does not name.
pub async fn put_tree_replaces_files_with_the_tree_s_mode(env: &dyn ExecutionEnv) {
    let first = tree(&[
        ("a.sh", Some(("a first version that is longer\n", true))),
        ("d/b.txt", Some(("b one\n", false))),
    ]);
    put_tree(env, "t", &first).await;
    write(env, "t/d/kept.txt", "not in the tree").await;
    let second = tree(&[
        ("a.sh", Some(("second\n", false))),
        ("d/b.txt", Some(("b two\n", true))),
    ]);
    put_tree(env, "t", &second).await;
    assert_eq!(read(env, "t/a.sh").await, "second\n");
    assert_eq!(read(env, "t/d/b.txt").await, "b two\n");
    assert_eq!(mode(env, "t/a.sh").await, 0o644);
    assert_eq!(mode(env, "t/d/b.txt").await, 0o755);
    assert_eq!(read(env, "t/d/kept.txt").await, "not in the tree");
    assert_eq!(
        listing(env, "t/d").await,
        vec![file_entry("b.txt", 6), file_entry("kept.txt", 15)]
    );
}

/// An executable file of a tree runs by its path, as a skill's script would.
pub async fn put_tree_scripts_run_by_their_path(env: &dyn ExecutionEnv) {
    let placed = tree(&[
        (
            "bin/greet.sh",
            Some(("#!/bin/sh\necho \"hello $1\"\n", true)),
        ),
        ("notes.txt", Some(("not a program\n", false))),
    ]);
    put_tree(env, "tools", &placed).await;
    let output = run(env, ExecRequest::argv(["tools/bin/greet.sh", "tree"])).await;
    assert!(output.success(), "run by a relative path: {output:?}");
    assert_eq!(output.stdout_text(), "hello tree\n");
    let absolute = env.absolute(path("tools/bin/greet.sh"));
    let shown = absolute.to_string_lossy().into_owned();
    let output = run(env, ExecRequest::argv([shown.as_str(), "again"])).await;
    assert!(output.success(), "run by its absolute path: {output:?}");
    assert_eq!(output.stdout_text(), "hello again\n");
    let output = run(env, ExecRequest::argv(["test", "-x", "tools/notes.txt"])).await;
    assert!(
        !output.success(),
        "a 0644 file is not executable: {output:?}"
    );
}

/// A symlink at a file's path (to a file the host made outside the env, and to a file
/// of the workspace) is replaced by the file; neither target changes.
pub async fn put_tree_replaces_a_symlink_never_writes_through(env: &dyn ExecutionEnv) {
    let outside = std::env::temp_dir()
        .join(crate::path::temp_name("skillbox-put-tree-").expect("a temp name"));
    std::fs::write(&outside, "the host's own\n").expect("write a host file");
    let script = format!(
        "mkdir -p t/d && echo keep > keep.txt && ln -s '{}' t/out && ln -s ../../keep.txt t/d/in",
        outside.display()
    );
    let planted = run(env, ExecRequest::shell(script)).await;
    let placed = tree(&[
        ("out", Some(("new out\n", false))),
        ("d/in", Some(("new in\n", true))),
    ]);
    let result = env.put_tree(path("t"), &placed, &live()).await;
    let host = std::fs::read_to_string(&outside);
    let _ = std::fs::remove_file(&outside);
    assert!(
        planted.success(),
        "planting the links failed: {}",
        planted.stderr_text()
    );
    result.unwrap_or_else(|e| panic!("put_tree over symlinks: {e}"));
    assert_eq!(
        host.expect("the host file is still there"),
        "the host's own\n",
        "the host file was written through a symlink"
    );
    assert_eq!(
        read(env, "keep.txt").await,
        "keep\n",
        "written through a link"
    );
    for (p, text, expected) in [("t/out", "new out\n", 0o644), ("t/d/in", "new in\n", 0o755)] {
        assert_eq!(
            mode(env, p).await,
            expected,
            "{p} is a file now, of the tree's mode"
        );
        assert_eq!(read(env, p).await, text);
    }
}

/// What is in the way refuses the tree with the right code, and what was placed before
/// it stays: a file where a directory goes is `not_directory` (also for the tree's own
/// directory), a directory where a file goes `is_directory`. A cancelled call places
/// nothing.
pub async fn put_tree_refuses_what_is_in_the_way(env: &dyn ExecutionEnv) {
    mkdir(env, "w/dir").await;
    write(env, "w/file", "x").await;
    let cases = [
        (
            "w",
            tree(&[
                ("first.txt", Some(("placed", false))),
                ("file/inner.txt", Some(("y", false))),
            ]),
            ErrorCode::NotDirectory,
            "a file where a file's parent goes",
        ),
        (
            "w",
            tree(&[("file", None)]),
            ErrorCode::NotDirectory,
            "a file where a directory goes",
        ),
        (
            "w",
            tree(&[("file/sub", None)]),
            ErrorCode::NotDirectory,
            "a file where a directory's parent goes",
        ),
        (
            "w/file",
            tree(&[("a.txt", Some(("y", false)))]),
            ErrorCode::NotDirectory,
            "a file where the tree goes",
        ),
        (
            "w",
            tree(&[("dir", Some(("y", false)))]),
            ErrorCode::IsDirectory,
            "a directory where a file goes",
        ),
    ];
    for (dir, placed, code, what) in cases {
        assert_code(env.put_tree(path(dir), &placed, &live()).await, code, what);
    }
    assert_eq!(
        read(env, "w/first.txt").await,
        "placed",
        "what came first stays"
    );
    let later = tree(&[("cancelled.txt", Some(("z", false)))]);
    assert_code(
        env.put_tree(path("w"), &later, &cancelled()).await,
        ErrorCode::Aborted,
        "put_tree cancelled",
    );
    assert_eq!(read(env, "w/file").await, "x");
    assert_eq!(
        listing(env, "w").await,
        vec![
            entry("dir", FileKind::Dir),
            file_entry("file", 1),
            file_entry("first.txt", 6),
        ],
        "nothing else was left (a cancelled call places nothing)"
    );
    assert!(listing(env, "w/dir").await.is_empty());
}

/// 2,000 files in 20 directories, in one call; the time it took is printed.
pub async fn put_tree_places_many_files_in_one_call(env: &dyn ExecutionEnv) {
    const FILES: usize = 2_000;
    let mut many = Tree::new();
    for i in 0..FILES {
        let content = format!("file {i}\n").repeat(1 + i % 7);
        many.file(format!("d{:02}/f{i:04}.txt", i % 20), content, i % 10 == 0)
            .expect("tree entry");
    }
    let started = std::time::Instant::now();
    within(
        "put_tree of 2,000 files",
        env.put_tree(path("many"), &many, &live()),
    )
    .await
    .unwrap_or_else(|e| panic!("put_tree of {FILES} files: {e}"));
    eprintln!(
        "put_tree: {FILES} files ({} bytes) on {} in {:?}",
        many.bytes(),
        env.kind(),
        started.elapsed()
    );
    let walked = env
        .walk(path("many"), &[], 3 * FILES, &live())
        .await
        .expect("walk");
    assert_eq!(
        walked.len(),
        FILES + 20,
        "every file and directory, nothing else"
    );
    let paths: Vec<PathBuf> = many
        .entries()
        .iter()
        .map(|e| env.absolute(&Path::new("many").join(&e.path)))
        .collect();
    let read = env
        .read_files(&paths, 1024, &live())
        .await
        .expect("read_files");
    for (i, (got, entry)) in read.iter().zip(many.entries()).enumerate() {
        let crate::TreeKind::File { data, .. } = &entry.kind else {
            panic!("only files were added");
        };
        assert_eq!(got, &FileRead::Content(data.to_vec()), "file {i}");
    }
    assert_eq!(mode(env, "many/d00/f0000.txt").await, 0o755);
    assert_eq!(mode(env, "many/d01/f0001.txt").await, 0o644);
}

// ---------------------------------------------------------------------------------------
// error codes

pub async fn error_not_found(env: &dyn ExecutionEnv) {
    let nf = ErrorCode::NotFound;
    assert_code(
        env.read_text(path("missing.txt"), &live()).await,
        nf,
        "read_text missing",
    );
    assert_code(
        env.read_bytes(path("missing.txt"), &live()).await,
        nf,
        "read_bytes missing",
    );
    assert_code(
        env.read_text_lines(path("missing.txt"), 3, &live()).await,
        nf,
        "lines missing",
    );
    assert_code(
        env.remove(path("missing.txt"), false, &live()).await,
        nf,
        "remove missing",
    );
    assert_code(
        env.remove(path("missing"), true, &live()).await,
        nf,
        "remove -r missing",
    );
    assert_code(
        env.file_info(path("missing"), &live()).await,
        nf,
        "file_info missing",
    );
    assert_code(
        env.list_dir(path("missing"), &live()).await,
        nf,
        "list_dir missing",
    );
    assert_code(
        env.canonical(path("missing"), &live()).await,
        nf,
        "canonical missing",
    );
    assert_code(
        env.rename(path("missing"), path("to"), &live()).await,
        nf,
        "rename missing",
    );
    assert_code(
        env.write(path("no/such/dir/f"), b"x", &live()).await,
        nf,
        "write under missing",
    );
    let err = env
        .read_text(path("missing.txt"), &live())
        .await
        .expect_err("read missing");
    assert!(
        err.message.contains("missing.txt"),
        "the message names the file: {err}"
    );
}

pub async fn error_already_exists(env: &dyn ExecutionEnv) {
    mkdir(env, "d").await;
    write(env, "f.txt", "x").await;
    let ae = ErrorCode::AlreadyExists;
    assert_code(
        env.create_dir(path("d"), false, &live()).await,
        ae,
        "create_dir on a dir",
    );
    assert_code(
        env.create_dir(path("f.txt"), false, &live()).await,
        ae,
        "create_dir on a file",
    );
    assert_eq!(read(env, "f.txt").await, "x");
}

pub async fn error_not_directory(env: &dyn ExecutionEnv) {
    write(env, "f.txt", "x").await;
    let nd = ErrorCode::NotDirectory;
    assert_code(
        env.list_dir(path("f.txt"), &live()).await,
        nd,
        "list_dir on a file",
    );
    assert_code(
        env.read_text(path("f.txt/inner"), &live()).await,
        nd,
        "read through a file",
    );
    assert_code(
        env.create_dir(path("f.txt/sub"), true, &live()).await,
        nd,
        "mkdir in a file",
    );
}

pub async fn error_is_directory(env: &dyn ExecutionEnv) {
    mkdir(env, "d").await;
    let id = ErrorCode::IsDirectory;
    assert_code(
        env.read_bytes(path("d"), &live()).await,
        id,
        "read_bytes on a dir",
    );
    assert_code(
        env.read_text(path("d"), &live()).await,
        id,
        "read_text on a dir",
    );
    assert_code(
        env.append(path("d"), b"x", &live()).await,
        id,
        "append to a dir",
    );
    assert_code(
        env.write(path("d"), b"x", &live()).await,
        id,
        "write over a dir",
    );
    assert_eq!(
        listing(env, ".").await,
        vec![entry("d", FileKind::Dir)],
        "nothing was left"
    );
}

pub async fn error_invalid(env: &dyn ExecutionEnv) {
    env.write(path("latin1.txt"), b"caf\xe9 \xff\xfe", &live())
        .await
        .expect("write bytes");
    assert_code(
        env.read_text(path("latin1.txt"), &live()).await,
        ErrorCode::Invalid,
        "non-UTF-8",
    );
    let bytes = env
        .read_bytes(path("latin1.txt"), &live())
        .await
        .expect("read_bytes");
    assert_eq!(bytes, b"caf\xe9 \xff\xfe");

    let empty = ExecRequest::argv(Vec::<String>::new());
    assert_code(
        env.exec(empty, &live()).await,
        ErrorCode::Invalid,
        "exec with an empty argv",
    );
    let blank = ExecRequest::argv([""]);
    assert_code(
        env.exec(blank, &live()).await,
        ErrorCode::Invalid,
        "exec with an empty program",
    );
}

pub async fn error_aborted_file_ops(env: &dyn ExecutionEnv) {
    write(env, "f.txt", "x").await;
    let ab = ErrorCode::Aborted;
    assert_code(
        env.read_text(path("f.txt"), &cancelled()).await,
        ab,
        "read_text cancelled",
    );
    assert_code(
        env.list_dir(path("."), &cancelled()).await,
        ab,
        "list_dir cancelled",
    );
    assert_code(
        env.write(path("new.txt"), b"x", &cancelled()).await,
        ab,
        "write cancelled",
    );
    assert_code(
        env.create_dir(path("new-dir"), true, &cancelled()).await,
        ab,
        "mkdir cancelled",
    );
    assert_code(
        env.remove(path("f.txt"), false, &cancelled()).await,
        ab,
        "remove cancelled",
    );
    // Cancelled before it started: nothing happened.
    assert!(
        !exists(env, "new.txt").await,
        "a cancelled write must not write"
    );
    assert!(
        !exists(env, "new-dir").await,
        "a cancelled create_dir must not create"
    );
    assert!(
        exists(env, "f.txt").await,
        "a cancelled remove must not remove"
    );
}

pub async fn error_aborted_exec(env: &dyn ExecutionEnv) {
    let request = ExecRequest::shell("touch ran.txt");
    assert_code(
        env.exec(request.clone(), &cancelled()).await,
        ErrorCode::Aborted,
        "exec",
    );
    let streamed = match env.exec_stream(request, &cancelled()).await {
        Err(e) => Err(e),
        Ok(stream) => within("a cancelled exec_stream", stream.collect()).await,
    };
    assert_code(streamed, ErrorCode::Aborted, "exec_stream");
    assert!(
        !exists(env, "ran.txt").await,
        "an exec cancelled before it started must not run"
    );
}

// ---------------------------------------------------------------------------------------
// exec

pub async fn exec_runs_an_argv(env: &dyn ExecutionEnv) {
    let output = run(
        env,
        ExecRequest::argv(["echo", "hello", "two words", "$HOME"]),
    )
    .await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.exit_code, Some(0));
    assert_eq!(output.signal, None);
    assert!(!output.timed_out);
    assert_eq!(output.limit_hit, None);
    // No shell: `$HOME` stays as written.
    assert_eq!(output.stdout_text(), "hello two words $HOME\n");
    assert_eq!(output.stderr_text(), "");
}

/// `write_and_exec` writes its files before the command starts, and a write that fails
/// runs nothing and names its file.
pub async fn write_and_exec_writes_before_it_runs(env: &dyn ExecutionEnv) {
    mkdir(env, "in").await;
    let files = vec![
        (PathBuf::from("in/a.txt"), b"alpha ".to_vec()),
        (PathBuf::from("b.txt"), b"beta".to_vec()),
    ];
    let output = within(
        "write_and_exec",
        env.write_and_exec(files, ExecRequest::shell("cat in/a.txt b.txt"), &live()),
    )
    .await
    .unwrap_or_else(|e| panic!("write_and_exec: {e}"));
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "alpha beta");
    assert_eq!(read(env, "b.txt").await, "beta");
    // Replacing a file the sandbox has is a write like any other.
    let files = vec![(PathBuf::from("b.txt"), b"gamma".to_vec())];
    let output = within(
        "write_and_exec over a file",
        env.write_and_exec(files, ExecRequest::shell("cat b.txt"), &live()),
    )
    .await
    .unwrap_or_else(|e| panic!("write_and_exec over a file: {e}"));
    assert_eq!(output.stdout_text(), "gamma");
    let files = vec![(PathBuf::from("missing/x.txt"), b"x".to_vec())];
    let error = within(
        "write_and_exec into a missing dir",
        env.write_and_exec(files, ExecRequest::shell("touch ran"), &live()),
    )
    .await
    .expect_err("a write into a missing directory succeeded");
    assert_eq!(error.code, ErrorCode::NotFound, "{error}");
    assert!(error.to_string().contains("missing/x.txt"), "{error}");
    assert!(
        !exists(env, "ran").await,
        "the command ran after its write failed"
    );
}

/// An exec that announces the walk to come ([`ExecRequest::walk_after`]) changes
/// nothing of what that walk and the reads after it answer, and the command's stderr is
/// kept whole, even where it looks like the frame a container backend sends a walk in.
pub async fn walk_after_an_exec_answers_as_a_walk_would(env: &dyn ExecutionEnv) {
    mkdir(env, "w").await;
    let root = env.absolute(path("w"));
    let walk = crate::WalkAfter {
        root: root.clone(),
        prune: vec![".tmp".into()],
        max_entries: 100,
    };
    let script = "mkdir -p sub .tmp && printf one > a.txt && printf two > sub/b.txt \
                  && printf x > .tmp/c && printf '\\000skillbox-walk:5\\nhello' >&2";
    let output = run(env, ExecRequest::shell(script).cwd("w").walk_after(walk)).await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stderr, b"\0skillbox-walk:5\nhello", "{output:?}");
    let walked = within("walk", env.walk(&root, &[".tmp"], 100, &live()))
        .await
        .unwrap_or_else(|e| panic!("walk: {e}"));
    let read = within(
        "read_files",
        env.read_files(&[root.join("a.txt"), root.join("sub/b.txt")], 1024, &live()),
    )
    .await
    .unwrap_or_else(|e| panic!("read_files: {e}"));
    assert_eq!(
        read,
        vec![
            FileRead::Content(b"one".to_vec()),
            FileRead::Content(b"two".to_vec())
        ]
    );
    // The same walk made afresh answers the same.
    let again = within("walk", env.walk(&root, &[".tmp"], 100, &live()))
        .await
        .unwrap_or_else(|e| panic!("walk again: {e}"));
    assert_eq!(walked, again);
    let mut paths: Vec<&str> = walked.iter().map(|e| e.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(paths, [".tmp", "a.txt", "sub", "sub/b.txt"]);
    // Only that walk: another one (a bound of its own) is made as it asks.
    let error = within("walk", env.walk(&root, &[".tmp"], 2, &live()))
        .await
        .expect_err("4 entries passed a bound of 2");
    assert_eq!(error.code, ErrorCode::ResourceExhausted, "{error}");
}

pub async fn exec_runs_a_shell_script(env: &dyn ExecutionEnv) {
    let output = run(
        env,
        ExecRequest::shell("x=4; echo $((x * 10 + 2)) | tr 4 5"),
    )
    .await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "52\n");
}

pub async fn exec_and_files_share_the_cwd(env: &dyn ExecutionEnv) {
    write(env, "from-fs.txt", "written by the file API").await;
    let output = sh_ok(
        env,
        "cat from-fs.txt; printf 'written by exec' > from-exec.txt",
    )
    .await;
    assert_eq!(output.stdout_text(), "written by the file API");
    assert_eq!(read(env, "from-exec.txt").await, "written by exec");
}

pub async fn exec_feeds_stdin(env: &dyn ExecutionEnv) {
    let output = run(
        env,
        ExecRequest::argv(["cat"]).stdin("line one\nline two\n"),
    )
    .await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "line one\nline two\n");
    // More than a pipe holds: all of it arrives, and stdin then ends.
    let big = vec![b'x'; 1_000_000];
    let output = run(env, ExecRequest::shell("wc -c | tr -d ' '").stdin(big)).await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "1000000\n");
    // Without stdin, a reader sees end of input at once.
    let output = run(env, ExecRequest::argv(["cat"])).await;
    assert!(output.success(), "{output:?}");
    assert!(output.stdout.is_empty());
}

pub async fn exec_passes_env_vars(env: &dyn ExecutionEnv) {
    let request = ExecRequest::shell("printf '%s|%s' \"$SKILLBOX_ONE\" \"$SKILLBOX_TWO\"")
        .env("SKILLBOX_ONE", "hello world")
        .env("SKILLBOX_TWO", "a=b;c");
    let output = run(env, request).await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "hello world|a=b;c");
}

pub async fn exec_honours_cwd(env: &dyn ExecutionEnv) {
    mkdir(env, "sub/dir").await;
    write(env, "sub/dir/here.txt", "found it").await;
    let output = run(env, ExecRequest::argv(["cat", "here.txt"]).cwd("sub/dir")).await;
    assert!(output.success(), "relative cwd: {output:?}");
    assert_eq!(output.stdout_text(), "found it");
    let absolute = env.absolute(path("sub/dir"));
    let output = run(env, ExecRequest::argv(["cat", "here.txt"]).cwd(absolute)).await;
    assert!(output.success(), "absolute cwd: {output:?}");
    assert_eq!(output.stdout_text(), "found it");
}

pub async fn exec_reports_exit_code(env: &dyn ExecutionEnv) {
    let output = run(env, ExecRequest::shell("echo partial; exit 3")).await;
    assert_eq!(output.exit_code, Some(3));
    assert_eq!(output.signal, None);
    assert_eq!(output.shell_status(), 3);
    assert!(!output.success());
    assert!(!output.timed_out);
    assert_eq!(output.stdout_text(), "partial\n");
    let output = run(env, ExecRequest::argv(["false"])).await;
    assert_eq!(output.exit_code, Some(1));
}

pub async fn exec_reports_death_by_signal(env: &dyn ExecutionEnv) {
    let output = run(
        env,
        ExecRequest::shell("echo before; kill -9 $$; echo after"),
    )
    .await;
    assert_eq!(output.exit_code, None, "{output:?}");
    assert_eq!(output.signal, Some(9), "{output:?}");
    assert_eq!(output.shell_status(), 137);
    assert!(!output.timed_out);
    assert!(!output.success());
    assert_eq!(output.stdout_text(), "before\n");
}

pub async fn exec_stream_yields_chunks_then_exit(env: &dyn ExecutionEnv) {
    let request = ExecRequest::shell("echo one; echo two >&2; echo three; exit 5");
    let mut stream = env
        .exec_stream(request, &live())
        .await
        .expect("exec_stream");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let exit = loop {
        match within("exec_stream events", stream.next()).await {
            Some(Ok(ExecEvent::Stdout(chunk))) => stdout.extend_from_slice(&chunk),
            Some(Ok(ExecEvent::Stderr(chunk))) => stderr.extend_from_slice(&chunk),
            Some(Ok(ExecEvent::Exit(output))) => break output,
            Some(Err(e)) => panic!("exec_stream failed: {e}"),
            None => panic!("exec_stream ended without an Exit event"),
        }
    };
    assert_eq!(String::from_utf8_lossy(&stdout), "one\nthree\n");
    assert_eq!(String::from_utf8_lossy(&stderr), "two\n");
    assert_eq!(exit.exit_code, Some(5));
    assert!(
        exit.stdout.is_empty() && exit.stderr.is_empty(),
        "Exit carries no output: {exit:?}"
    );
    let after = within("the end of the stream", stream.next()).await;
    assert!(after.is_none(), "nothing may follow Exit: {after:?}");
}

pub async fn exec_separates_stdout_and_stderr(env: &dyn ExecutionEnv) {
    let output = run(
        env,
        ExecRequest::shell("echo out1; echo err1 >&2; echo out2; echo err2 >&2"),
    )
    .await;
    assert!(output.success(), "{output:?}");
    assert_eq!(output.stdout_text(), "out1\nout2\n");
    assert_eq!(output.stderr_text(), "err1\nerr2\n");
    assert_eq!(output.truncated, crate::Truncated::default());
}

// ---------------------------------------------------------------------------------------
// timeouts and cancellation

pub async fn timeout_ends_the_exec(env: &dyn ExecutionEnv) {
    let request = ExecRequest::argv(["sleep", "30"]).timeout(Duration::from_millis(300));
    // Bounded below the env's default timeout, so a backend that ignores the request's
    // own timeout fails here instead of passing on the default.
    let bound = super::limits().timeout() * 3 / 4;
    let output = match tokio::time::timeout(bound, env.exec(request, &live())).await {
        Ok(result) => result.expect("a timed-out exec is a result, not an error"),
        Err(_) => panic!("the request's 300 ms timeout was not applied ({bound:?} passed)"),
    };
    assert!(output.timed_out, "{output:?}");
    assert_eq!(output.shell_status(), 124);
    assert!(!output.success());
}

pub async fn timeout_kills_the_process_tree(env: &dyn ExecutionEnv) {
    let marker = marker();
    let script = format!("sleep {marker} & sleep {marker} & echo ready; wait");
    let request = ExecRequest::shell(script).timeout(Duration::from_secs(5));
    let output = run(env, request).await;
    assert!(output.timed_out, "{output:?}");
    assert_eq!(output.shell_status(), 124);
    // The sleepers had started before the timeout, so there was a tree to kill.
    assert_eq!(
        output.stdout_text(),
        "ready\n",
        "stderr: {}",
        output.stderr_text()
    );
    assert_processes_gone(&marker, "after a timeout").await;
}

pub async fn cancel_kills_the_process_tree(env: &dyn ExecutionEnv) {
    let marker = marker();
    let script = format!("sleep {marker} & sleep {marker} & echo ready; wait");
    let request = ExecRequest::shell(script).timeout(NEVER);
    let cancel = CancellationToken::new();
    let mut stream = env.exec_stream(request, &cancel).await.expect("exec");
    read_until_stdout(&mut stream, "ready").await;
    cancel.cancel();
    expect_aborted(&mut stream).await;
    assert_processes_gone(&marker, "after cancel").await;
}

pub async fn cancel_ends_a_running_exec(env: &dyn ExecutionEnv) {
    let marker = marker();
    let script = format!("sleep {marker} & sleep {marker} & touch started; wait");
    let cancel = CancellationToken::new();
    let exec = env.exec(ExecRequest::shell(script).timeout(NEVER), &cancel);
    let trigger = async {
        wait_for_file(env, "started").await;
        cancel.cancel();
    };
    let (result, ()) = within("a cancelled exec", async { tokio::join!(exec, trigger) }).await;
    assert_code(result, ErrorCode::Aborted, "exec cancelled while running");
    assert_processes_gone(&marker, "after cancel").await;
}

pub async fn cleanup_ends_running_execs(env: &dyn ExecutionEnv) {
    let marker = marker();
    let script = format!("sleep {marker} & sleep {marker} & echo ready; wait");
    let request = ExecRequest::shell(script).timeout(NEVER);
    let mut stream = env.exec_stream(request, &live()).await.expect("exec");
    read_until_stdout(&mut stream, "ready").await;
    within("cleanup", env.cleanup())
        .await
        .expect("cleanup with an exec running");
    assert_processes_gone(&marker, "after cleanup").await;
}

// ---------------------------------------------------------------------------------------
// output caps

pub async fn output_cap_truncates_stdout(env: &dyn ExecutionEnv) {
    let cap = super::limits().output_bytes;
    let output = run(
        env,
        ExecRequest::shell("head -c 3000000 /dev/zero; echo done >&2"),
    )
    .await;
    assert_eq!(output.stdout.len() as u64, cap, "stdout is cut at the cap");
    assert!(output.stdout.iter().all(|&b| b == 0));
    assert!(output.truncated.stdout);
    assert!(!output.truncated.stderr);
    assert_eq!(output.limit_hit, Some(LimitKind::Output));
    // The rest was drained, not blocked on: the command ran to its end.
    assert_eq!(output.stderr_text(), "done\n");
    assert!(output.success(), "{:?}", output.exit_code);
}

pub async fn output_cap_truncates_stderr(env: &dyn ExecutionEnv) {
    let cap = super::limits().output_bytes;
    let output = run(
        env,
        ExecRequest::shell("head -c 3000000 /dev/zero >&2; echo done"),
    )
    .await;
    assert_eq!(output.stderr.len() as u64, cap, "stderr is cut at the cap");
    assert!(output.truncated.stderr);
    assert!(!output.truncated.stdout);
    assert_eq!(output.limit_hit, Some(LimitKind::Output));
    assert_eq!(output.stdout_text(), "done\n");
    assert!(output.success(), "{:?}", output.exit_code);
}
