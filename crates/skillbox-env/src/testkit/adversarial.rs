//! The adversarial suite: every test performs a real attack from inside the sandbox —
//! writes outside the workspace, reads host secrets, reaches the host network or other
//! host processes, calls escape syscalls, bombs resources — and asserts that it fails
//! *and* that the host is unchanged, checking the host from the test process itself.
//!
//! For sandbox backends only: `HostEnv` fails it by design. The attacks need `sh`,
//! `bash`, `python3`, `node` and coreutils inside the sandbox; `curl`, `unshare` and
//! `ip` are used when present. Nothing here targets an address outside this machine:
//! network attacks aim at a listener the test itself starts on the host's 127.0.0.1.
//!
//! Syscall attacks run through a small Python harness ([`PY_HARNESS`]) that makes each
//! attempt in a forked child and reports `RESULT name ret errno` (or `KILLED name sig`
//! when seccomp kills the child), so an allowed call can never be mistaken for a
//! denied one and a successful attack stays contained in that child.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::ErrorKind;
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::path::temp_name;
use crate::{
    CancellationToken, EnvError, EnvResult, ErrorCode, ExecOutput, ExecRequest, ExecutionEnv,
    FileKind, LimitKind,
};

use super::limits;

const MIB: u64 = 1024 * 1024;

/// How long a test polls the host for something the sandbox should have ended.
const HOST_POLL_BOUND: Duration = Duration::from_secs(10);

/// The `RESULT`/`KILLED` harness the syscall attacks run in; see the module docs.
pub const PY_HARNESS: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    'x86_64': dict(ioctl=16, clone=56, clone3=435, bpf=321, io_uring_setup=425,
                   perf_event_open=298, userfaultfd=323, keyctl=250, add_key=248,
                   kexec_load=246, init_module=175, open_by_handle_at=304,
                   personality=135),
    'aarch64': dict(ioctl=29, clone=220, clone3=435, bpf=280, io_uring_setup=425,
                    perf_event_open=241, userfaultfd=282, keyctl=219, add_key=217,
                    kexec_load=104, init_module=105, open_by_handle_at=265,
                    personality=92),
}.get(os.uname().machine)
if NR is None:
    print('UNSUPPORTED_ARCH', os.uname().machine, flush=True)
    sys.exit(0)


def call(name, *args):
    return libc.syscall(ctypes.c_long(NR[name]), *args)


def attempt(name, fn):
    # In a child, so a seccomp kill or a successful attack stays contained.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            ctypes.set_errno(0)
            ret = fn()
            if isinstance(ret, tuple):
                ret, err = ret
            else:
                err = ctypes.get_errno() if ret == -1 else 0
            os.write(w, ('%d %d' % (ret, err)).encode())
        except BaseException as e:
            os.write(w, ('EXC %s: %s' % (type(e).__name__, e)).encode())
        os._exit(0)
    os.close(w)
    data = b''
    while True:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    text = data.decode(errors='replace').replace('\n', ' ')
    if text and not text.startswith('EXC'):
        print('RESULT', name, text, flush=True)
    elif os.WIFSIGNALED(status):
        print('KILLED', name, os.WTERMSIG(status), flush=True)
    else:
        print('ERROR', name, text or 'no result', flush=True)
"#;

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name no other test, run or process uses: pid, a counter and random hex.
fn marker(tag: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    temp_name(&format!("skillbox-adv-{tag}-{}-{n}-", std::process::id()))
        .unwrap_or_else(|e| panic!("a temp name: {e}"))
}

/// A number no other test or run uses (for argv that must be numeric, like `sleep`).
fn unique_number() -> u64 {
    let mut bytes = [0u8; 2];
    skillbox_protocol::random::fill(&mut bytes).unwrap_or_else(|e| panic!("random bytes: {e}"));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed) % 1000;
    let random = u64::from(u16::from_le_bytes(bytes)) % 1000;
    // pid < 2^22, so this stays well inside what `sleep` accepts.
    (u64::from(std::process::id()) * 1000 + n) * 1000 + random
}

/// Single-quotes `s` for `sh`.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn quote_path(path: &Path) -> String {
    quote(&path.display().to_string())
}

/// Everything worth seeing when an assertion about an exec fails.
fn describe(out: &ExecOutput) -> String {
    fn clip(text: String) -> String {
        const KEEP: usize = 3000;
        if text.len() <= KEEP {
            return text;
        }
        let mut end = KEEP;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &text[..end], text.len())
    }
    format!(
        "exit={:?} signal={:?} timed_out={} limit_hit={:?} truncated={:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.exit_code,
        out.signal,
        out.timed_out,
        out.limit_hit,
        out.truncated,
        clip(out.stdout_text()),
        clip(out.stderr_text()),
    )
}

async fn exec(env: &dyn ExecutionEnv, request: ExecRequest, test: &str) -> ExecOutput {
    match env.exec(request, &CancellationToken::new()).await {
        Ok(out) => out,
        Err(e) => panic!("{test}: the exec itself failed (the backend, not the attack): {e}"),
    }
}

async fn sh(env: &dyn ExecutionEnv, script: &str, test: &str) -> ExecOutput {
    exec(env, ExecRequest::shell(script), test).await
}

/// Runs `script` with `python3 -c`, passing it through the environment so no quoting
/// can break it; `args` is shell text appended to the command line.
async fn python(env: &dyn ExecutionEnv, script: &str, args: &str, test: &str) -> ExecOutput {
    let request = ExecRequest::shell(format!("exec python3 -c \"$SKILLBOX_ADV_PY\" {args}"))
        .env("SKILLBOX_ADV_PY", script);
    exec(env, request, test).await
}

/// Runs [`PY_HARNESS`] followed by `body` (which calls `attempt(name, fn)`).
async fn harness(env: &dyn ExecutionEnv, body: &str, args: &str, test: &str) -> ExecOutput {
    python(env, &format!("{PY_HARNESS}\n{body}\n"), args, test).await
}

/// A host path the sandbox must not create; removed (file or tree) when dropped.
#[derive(Debug)]
struct HostPath(PathBuf);

impl HostPath {
    fn new(path: impl Into<PathBuf>) -> Self {
        HostPath(path.into())
    }

    fn exists(&self) -> bool {
        self.0.symlink_metadata().is_ok()
    }
}

impl Drop for HostPath {
    fn drop(&mut self) {
        if let Ok(meta) = self.0.symlink_metadata() {
            let _ = if meta.is_dir() {
                std::fs::remove_dir_all(&self.0)
            } else {
                std::fs::remove_file(&self.0)
            };
        }
    }
}

fn assert_host_absent(paths: &[&HostPath], test: &str, out: &ExecOutput) {
    for path in paths {
        assert!(
            !path.exists(),
            "{test}: the sandbox created {} on the HOST\n{}",
            path.0.display(),
            describe(out)
        );
    }
}

/// A listener on the host's loopback the sandbox must not reach.
fn loopback_listener(test: &str) -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .unwrap_or_else(|e| panic!("{test}: bind a host loopback listener: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{test}: make the listener non-blocking: {e}"));
    let port = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{test}: listener address: {e}"))
        .port();
    (listener, port)
}

/// A connection the kernel completed sits in the accept queue by the time connect(2)
/// returned inside the sandbox, so one non-blocking accept after the exec is enough.
fn assert_tcp_accepted_nothing(listener: &TcpListener, test: &str, out: &ExecOutput) {
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, from)) => panic!(
            "{test}: the host loopback listener accepted a connection from {from}\n{}",
            describe(out)
        ),
        Err(e) => panic!("{test}: accept on the host listener: {e}"),
    }
}

fn assert_unix_accepted_nothing(listener: &UnixListener, test: &str, out: &ExecOutput) {
    match listener.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok(_) => panic!(
            "{test}: the host unix listener accepted a connection\n{}",
            describe(out)
        ),
        Err(e) => panic!("{test}: accept on the host unix listener: {e}"),
    }
}

/// The host's real `/etc/shadow` lines, when the test process may read them.
fn host_shadow_lines() -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/etc/shadow").ok()?;
    let lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains(':') && l.len() >= 4)
        .map(String::from)
        .collect();
    (!lines.is_empty()).then_some(lines)
}

/// True when `text` shows a line of the host's shadow file. Without the host's content
/// to compare (test not run as root), any `root:` line counts as a leak.
fn shows_host_shadow(text: &str, host: Option<&[String]>) -> bool {
    match host {
        Some(lines) => text
            .lines()
            .any(|t| lines.iter().any(|l| l == t.trim_end_matches('\r'))),
        None => text.lines().any(|t| t.starts_with("root:")),
    }
}

/// Host pids whose `/proc/<pid>/cmdline` is exactly `argv`.
fn host_pids_running(argv: &[&str]) -> Vec<i32> {
    let mut want = Vec::new();
    for arg in argv {
        want.extend_from_slice(arg.as_bytes());
        want.push(0);
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// Polls the host (bounded) until no process runs `argv`; kills leftovers and fails.
async fn assert_gone_from_host(argv: &[&str], test: &str, out: &ExecOutput) {
    let deadline = Instant::now() + HOST_POLL_BOUND;
    loop {
        let pids = host_pids_running(argv);
        if pids.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for pid in &pids {
                // SAFETY: plain kill(2) on a pid whose cmdline is the unique argv this
                // test started; it is only cleanup of the escaped process.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!(
                "{test}: {argv:?} still runs on the HOST (pids {pids:?}) {}s after the exec \
                 returned\n{}",
                HOST_POLL_BOUND.as_secs(),
                describe(out)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Free bytes for unprivileged users on the filesystem holding `path`.
fn host_free_inodes(path: &Path) -> Option<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is NUL-terminated and `stat` is writable memory of the right type.
    if unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statvfs succeeded and filled it.
    Some(unsafe { stat.assume_init() }.f_favail)
}

fn host_free_bytes(path: &Path) -> Option<u64> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c_path` is NUL-terminated and `stat` is writable memory of the right type.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat` (which started zeroed anyway).
    let stat = unsafe { stat.assume_init() };
    #[allow(
        clippy::unnecessary_cast,
        reason = "the field types differ between targets"
    )]
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

/// A host fd opened *without* `O_CLOEXEC`, so every child of the test process
/// inherits it unless the backend closes it. Closed, then its file removed, on drop.
#[derive(Debug)]
struct LeakedFd {
    fd: i32,
    file: HostPath,
}

impl LeakedFd {
    fn open(test: &str) -> LeakedFd {
        let file = HostPath::new(Path::new("/tmp").join(marker("leaked-fd")));
        std::fs::write(&file.0, b"host secret behind a leaked fd\n")
            .unwrap_or_else(|e| panic!("{test}: create {}: {e}", file.0.display()));
        let c_path = CString::new(file.0.as_os_str().as_bytes())
            .unwrap_or_else(|e| panic!("{test}: path with NUL: {e}"));
        // SAFETY: `c_path` is NUL-terminated; the fd is owned by the returned value.
        let fd = unsafe { libc::open(c_path.as_ptr(), libc::O_RDONLY) };
        assert!(
            fd >= 0,
            "{test}: open {}: {}",
            file.0.display(),
            std::io::Error::last_os_error()
        );
        LeakedFd { fd, file }
    }
}

impl Drop for LeakedFd {
    fn drop(&mut self) {
        // SAFETY: closes the fd this value opened and owns.
        unsafe { libc::close(self.fd) };
    }
}

/// How one harness attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    Returned { ret: i64, errno: i32 },
    Killed { signal: i32 },
    Broken(String),
}

fn attempts(out: &ExecOutput) -> BTreeMap<String, Attempt> {
    let mut found = BTreeMap::new();
    for line in out.stdout_text().lines() {
        let mut words = line.split_whitespace();
        let (Some(kind), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        let rest: Vec<&str> = words.collect();
        let attempt = match (kind, rest.as_slice()) {
            ("RESULT", [ret, errno]) => match (ret.parse(), errno.parse()) {
                (Ok(ret), Ok(errno)) => Attempt::Returned { ret, errno },
                _ => Attempt::Broken(line.to_string()),
            },
            ("KILLED", [signal]) => match signal.parse() {
                Ok(signal) => Attempt::Killed { signal },
                Err(_) => Attempt::Broken(line.to_string()),
            },
            ("ERROR", _) => Attempt::Broken(line.to_string()),
            _ => continue,
        };
        found.insert(name.to_string(), attempt);
    }
    found
}

/// False (after printing why) when the harness cannot run on this CPU architecture.
fn harness_supported(out: &ExecOutput, test: &str) -> bool {
    if out.stdout_text().contains("UNSUPPORTED_ARCH") {
        super::skip(
            test,
            "the syscall harness knows only x86_64 and aarch64 numbers",
        );
        return false;
    }
    true
}

/// Every named attempt ran and was refused (returned -1 or was killed by a signal).
fn assert_denied(out: &ExecOutput, names: &[&str], test: &str) {
    let found = attempts(out);
    for name in names {
        match found.get(*name) {
            Some(Attempt::Returned { ret, .. }) if *ret < 0 => {}
            Some(Attempt::Killed { .. }) => {}
            Some(Attempt::Returned { ret, errno }) => panic!(
                "{test}: `{name}` SUCCEEDED inside the sandbox (returned {ret}, errno {errno})\n{}",
                describe(out)
            ),
            Some(Attempt::Broken(line)) => {
                panic!(
                    "{test}: `{name}` did not run as written: {line}\n{}",
                    describe(out)
                )
            }
            None => panic!(
                "{test}: `{name}` reported nothing (did python3 run?)\n{}",
                describe(out)
            ),
        }
    }
}

/// Every named attempt ran and succeeded: what a normal program needs still works, so
/// the refusals next to it are the policy's and not a broken harness.
fn assert_allowed(out: &ExecOutput, names: &[&str], test: &str) {
    let found = attempts(out);
    for name in names {
        match found.get(*name) {
            Some(Attempt::Returned { ret, .. }) if *ret >= 0 => {}
            other => panic!(
                "{test}: `{name}` should work inside the sandbox, got {other:?}\n{}",
                describe(out)
            ),
        }
    }
}

/// The names in the host's /proc/modules (none on a kernel without modules).
fn host_modules() -> Vec<String> {
    std::fs::read_to_string("/proc/modules")
        .map(|text| {
            text.lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The value after `key ` on the first line of stdout starting with it.
fn field<'a>(stdout: &'a str, key: &str) -> Option<&'a str> {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
}

fn host_can_spawn() -> bool {
    std::process::Command::new("true")
        .status()
        .is_ok_and(|s| s.success())
}

/// The sandbox still runs a trivial command (a bomb did not wedge it).
async fn assert_sandbox_alive(env: &dyn ExecutionEnv, test: &str) {
    let out = sh(env, "echo alive", test).await;
    assert!(
        out.success() && out.stdout_text().trim() == "alive",
        "{test}: the sandbox cannot run `echo alive` after the attack\n{}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------
// Writes outside the workspace
// ---------------------------------------------------------------------------------

/// Tries to create a file and a directory named `name` in each sandbox dir and asserts
/// none of the host paths appear. With `expect_denied`, the writes must also fail
/// inside (the dir is read-only or absent there).
async fn write_outside(
    env: &dyn ExecutionEnv,
    test: &str,
    targets: &[(&str, PathBuf)],
    expect_denied: bool,
) {
    let name = marker(test);
    let mut script = String::new();
    let mut guards = Vec::new();
    for (sandbox_dir, host_dir) in targets {
        let inside = Path::new(sandbox_dir).join(&name);
        let p = quote_path(&inside);
        script.push_str(&format!(
            "echo pwned > {p} && echo WROTE_FILE {p}; mkdir {p}.d && echo WROTE_DIR {p}\n"
        ));
        guards.push(HostPath::new(host_dir.join(&name)));
        guards.push(HostPath::new(host_dir.join(format!("{name}.d"))));
    }
    script.push_str("echo SCRIPT_DONE\n");
    let out = sh(env, &script, test).await;
    let stdout = out.stdout_text();
    assert_host_absent(&guards.iter().collect::<Vec<_>>(), test, &out);
    assert!(
        stdout.contains("SCRIPT_DONE"),
        "{test}: the script did not run\n{}",
        describe(&out)
    );
    if expect_denied {
        assert!(
            !stdout.contains("WROTE_"),
            "{test}: a write outside the workspace succeeded inside the sandbox\n{}",
            describe(&out)
        );
    }
}

fn host_home() -> PathBuf {
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map_or_else(|| PathBuf::from("/root"), PathBuf::from)
}

/// `echo > /etc/<marker>` fails and no such file appears in the host's /etc.
pub async fn write_host_etc(env: &dyn ExecutionEnv) {
    write_outside(
        env,
        "write_host_etc",
        &[("/etc", PathBuf::from("/etc"))],
        true,
    )
    .await;
}

/// Writing into /usr (and through the /bin -> usr/bin symlink) fails and the host's
/// read-only-bound /usr is unchanged.
pub async fn write_host_usr(env: &dyn ExecutionEnv) {
    write_outside(
        env,
        "write_host_usr",
        &[
            ("/usr", PathBuf::from("/usr")),
            ("/bin", PathBuf::from("/usr/bin")),
        ],
        true,
    )
    .await;
}

/// Writing into /root and into the host user's $HOME path fails; nothing appears there
/// on the host.
pub async fn write_host_home(env: &dyn ExecutionEnv) {
    let home = host_home();
    let mut targets = vec![("/root", PathBuf::from("/root"))];
    let home_str = home.display().to_string();
    if home != Path::new("/root") {
        targets.push((home_str.as_str(), home.clone()));
    }
    write_outside(env, "write_host_home", &targets, true).await;
}

/// The sandbox's /tmp is its own: a file written there never shows up in host /tmp.
pub async fn write_host_tmp(env: &dyn ExecutionEnv) {
    write_outside(
        env,
        "write_host_tmp",
        &[("/tmp", PathBuf::from("/tmp"))],
        false,
    )
    .await;
}

// ---------------------------------------------------------------------------------
// Reads of host secrets
// ---------------------------------------------------------------------------------

/// `cat /etc/shadow` (directly and through `/proc/<pid>/root`) shows nothing of the
/// host's shadow file.
pub async fn read_host_shadow(env: &dyn ExecutionEnv) {
    let test = "read_host_shadow";
    let host = host_shadow_lines();
    if host.is_none() {
        eprintln!("{test}: host /etc/shadow unreadable here; any `root:` line counts as a leak");
    }
    let pid = std::process::id();
    let script = format!(
        "cat /etc/shadow; echo \"CAT_EXIT $?\"\n\
         cat /proc/1/root/etc/shadow /proc/{pid}/root/etc/shadow 2>/dev/null\n\
         python3 -c 'print(open(\"/etc/shadow\").read())' 2>/dev/null\n\
         echo SCRIPT_DONE\n"
    );
    let out = sh(env, &script, test).await;
    let stdout = out.stdout_text();
    assert!(
        stdout.contains("SCRIPT_DONE"),
        "{test}: the script did not run\n{}",
        describe(&out)
    );
    assert!(
        !shows_host_shadow(&stdout, host.as_deref()),
        "{test}: the host's /etc/shadow is readable inside the sandbox\n{}",
        describe(&out)
    );
}

/// A secret the test plants in the host's $HOME (and /root) is not listable or
/// readable from inside.
pub async fn read_host_root(env: &dyn ExecutionEnv) {
    let test = "read_host_root";
    let name = format!(".{}", marker(test));
    let secret = marker("secret");
    let mut planted = Vec::new();
    for dir in [host_home(), PathBuf::from("/root")] {
        let path = dir.join(&name);
        if planted.iter().any(|p: &HostPath| p.0 == path) {
            continue;
        }
        if std::fs::write(&path, &secret).is_ok() {
            planted.push(HostPath::new(path));
        }
    }
    let mut script = String::new();
    for dir in [host_home(), PathBuf::from("/root")] {
        let d = quote_path(&dir);
        let f = quote_path(&dir.join(&name));
        script.push_str(&format!("ls -la {d}; cat {f}\n"));
    }
    script.push_str("echo SCRIPT_DONE\n");
    let out = sh(env, &script, test).await;
    let stdout = out.stdout_text();
    assert!(
        stdout.contains("SCRIPT_DONE"),
        "{test}: the script did not run\n{}",
        describe(&out)
    );
    if planted.is_empty() {
        // Cannot plant (not root, $HOME not writable): compare with the real listing.
        let host_names: Vec<String> = std::fs::read_dir(host_home())
            .map(|rd| {
                rd.flatten()
                    .filter_map(|e| e.file_name().to_str().map(String::from))
                    .filter(|n| n.len() >= 8)
                    .collect()
            })
            .unwrap_or_default();
        let listed: Vec<&String> = host_names
            .iter()
            .filter(|n| stdout.contains(n.as_str()))
            .collect();
        assert!(
            listed.is_empty(),
            "{test}: host $HOME entries {listed:?} are visible inside\n{}",
            describe(&out)
        );
        return;
    }
    assert!(
        !stdout.contains(&name) && !stdout.contains(&secret),
        "{test}: the secret planted in host {:?} is visible inside the sandbox\n{}",
        planted
            .iter()
            .map(|p| p.0.display().to_string())
            .collect::<Vec<_>>(),
        describe(&out)
    );
}

/// No process visible inside (pid 1 included) carries the test process's environment:
/// the value of `CARGO_MANIFEST_DIR` never appears in any /proc/*/environ.
pub async fn read_proc1_environ(env: &dyn ExecutionEnv) {
    let test = "read_proc1_environ";
    let Some(value) = std::env::var("CARGO_MANIFEST_DIR")
        .ok()
        .filter(|v| v.len() >= 4)
    else {
        super::skip(
            test,
            "CARGO_MANIFEST_DIR is not set (run the tests through cargo)",
        );
        return;
    };
    // The value goes in as an argument (cmdline, not environ), and grep prints only the
    // names of matching files, so a huge environment cannot hide a leak past the cap.
    let script = format!(
        "tr '\\0' '\\n' < /proc/1/environ | head -c 16384; echo\n\
         echo '--- matches'\n\
         grep -lF -- {} /proc/[0-9]*/environ 2>/dev/null\n\
         echo SCRIPT_DONE\n",
        quote(&value)
    );
    let out = sh(env, &script, test).await;
    let stdout = out.stdout_text();
    let matches: Vec<&str> = stdout
        .lines()
        .skip_while(|l| *l != "--- matches")
        .skip(1)
        .take_while(|l| *l != "SCRIPT_DONE")
        .filter(|l| !l.trim().is_empty())
        .collect();
    let pid1_environ = stdout.split("--- matches").next().unwrap_or("");
    assert!(
        matches.is_empty() && !pid1_environ.contains(&value),
        "{test}: the host test process's environment (CARGO_MANIFEST_DIR={value}) is visible \
         inside the sandbox in {matches:?}\n{}",
        describe(&out)
    );
    assert!(
        stdout.contains("SCRIPT_DONE"),
        "{test}: the script did not run\n{}",
        describe(&out)
    );
}

/// Host processes are invisible: /proc/1 is not the host's pid 1, the test process's
/// pid does not show the test's cmdline, and /proc lists only a handful of pids.
pub async fn see_host_processes(env: &dyn ExecutionEnv) {
    let test = "see_host_processes";
    let my_pid = std::process::id();
    let my_cmdline = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let host_pid1 = std::fs::read("/proc/1/cmdline").unwrap_or_default();
    let script = r#"
import os, sys
def hexof(path):
    try:
        return open(path, 'rb').read().hex() or 'EMPTY'
    except OSError as e:
        return 'ERR%d' % e.errno
pid = sys.argv[1]
print('PID1', hexof('/proc/1/cmdline'))
print('TESTPID', hexof('/proc/%s/cmdline' % pid))
print('TESTPID_EXISTS', os.path.exists('/proc/%s' % pid))
print('COUNT', sum(1 for n in os.listdir('/proc') if n.isdigit()))
"#;
    let out = python(env, script, &my_pid.to_string(), test).await;
    let stdout = out.stdout_text();
    let (Some(pid1), Some(testpid), Some(exists), Some(count)) = (
        field(&stdout, "PID1"),
        field(&stdout, "TESTPID"),
        field(&stdout, "TESTPID_EXISTS"),
        field(&stdout, "COUNT").and_then(|c| c.trim().parse::<usize>().ok()),
    ) else {
        panic!("{test}: the probe did not run\n{}", describe(&out));
    };
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    if !host_pid1.is_empty() && host_pid1 != my_cmdline {
        assert_ne!(
            pid1,
            hex(&host_pid1),
            "{test}: /proc/1 inside is the host's pid 1\n{}",
            describe(&out)
        );
    }
    assert_ne!(
        testpid,
        hex(&my_cmdline),
        "{test}: the test process (host pid {my_pid}) is visible inside\n{}",
        describe(&out)
    );
    // Sandbox pids are small; a larger one existing inside means the host's pid space.
    if my_pid > 64 {
        assert_eq!(
            exists,
            "False",
            "{test}: host pid {my_pid} exists inside the sandbox\n{}",
            describe(&out)
        );
    }
    assert!(
        count <= 16,
        "{test}: {count} processes visible inside; expected only the sandbox's own few\n{}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------
// Network
// ---------------------------------------------------------------------------------

/// `curl http://127.0.0.1:<port>` to a listener on the host fails and reaches nothing.
pub async fn loopback_curl(env: &dyn ExecutionEnv) {
    let test = "loopback_curl";
    let (listener, port) = loopback_listener(test);
    let script = format!(
        "if ! command -v curl >/dev/null 2>&1; then echo NO_CURL; exit 0; fi\n\
         curl -sS --max-time 5 http://127.0.0.1:{port}/ && echo CONNECTED\n\
         echo \"CURL_EXIT $?\"\n"
    );
    let out = sh(env, &script, test).await;
    assert_tcp_accepted_nothing(&listener, test, &out);
    let stdout = out.stdout_text();
    if stdout.contains("NO_CURL") {
        eprintln!("{test}: curl is not installed inside the sandbox; only the listener checked");
        return;
    }
    let code = field(&stdout, "CURL_EXIT");
    assert!(
        !stdout.contains("CONNECTED") && code.is_some_and(|c| c.trim() != "0"),
        "{test}: curl reached the host loopback\n{}",
        describe(&out)
    );
}

/// bash `/dev/tcp/127.0.0.1/<port>` to a listener on the host fails.
pub async fn loopback_bash_dev_tcp(env: &dyn ExecutionEnv) {
    let test = "loopback_bash_dev_tcp";
    let (listener, port) = loopback_listener(test);
    let script =
        format!("if : 3<>/dev/tcp/127.0.0.1/{port}; then echo CONNECTED; else echo FAILED; fi");
    let request =
        ExecRequest::argv(["bash", "-c", script.as_str()]).timeout(Duration::from_secs(15));
    let out = exec(env, request, test).await;
    assert_tcp_accepted_nothing(&listener, test, &out);
    let stdout = out.stdout_text();
    assert!(
        !stdout.contains("CONNECTED") && stdout.contains("FAILED"),
        "{test}: bash /dev/tcp did not fail as expected\n{}",
        describe(&out)
    );
}

/// Node `fetch('http://127.0.0.1:<port>')` to a listener on the host fails.
pub async fn loopback_node_fetch(env: &dyn ExecutionEnv) {
    let test = "loopback_node_fetch";
    let (listener, port) = loopback_listener(test);
    let script = format!(
        "fetch('http://127.0.0.1:{port}/', {{ signal: AbortSignal.timeout(5000) }}).then(\
           r => {{ console.log('CONNECTED ' + r.status); process.exit(0); }},\
           e => {{ console.log('FAILED ' + ((e.cause && e.cause.code) || e.name)); process.exit(3); }});"
    );
    let request = ExecRequest::argv(["node", "-e", script.as_str()]);
    let out = exec(env, request, test).await;
    assert_tcp_accepted_nothing(&listener, test, &out);
    let stdout = out.stdout_text();
    assert!(
        !stdout.contains("CONNECTED") && stdout.contains("FAILED"),
        "{test}: node fetch did not fail as expected (did node run?)\n{}",
        describe(&out)
    );
}

/// The sandbox's network namespace holds only `lo`: /proc/net/dev and `ip -o link`.
pub async fn interfaces_only_lo(env: &dyn ExecutionEnv) {
    let test = "interfaces_only_lo";
    let script = "echo '--- procnetdev'; cat /proc/net/dev\n\
                  echo '--- iplink'; if command -v ip >/dev/null 2>&1; then ip -o link show; fi\n\
                  echo '--- end'\n";
    let out = sh(env, script, test).await;
    let stdout = out.stdout_text();
    let mut section = "";
    let mut proc_names = Vec::new();
    let mut ip_names = Vec::new();
    for line in stdout.lines() {
        if let Some(name) = line.strip_prefix("--- ") {
            section = match name {
                "procnetdev" => "procnetdev",
                "iplink" => "iplink",
                _ => "",
            };
            continue;
        }
        match section {
            // "  eth0: 1234 ..." (the two header lines have no ':').
            "procnetdev" => {
                if let Some((name, _)) = line.split_once(':') {
                    proc_names.push(name.trim().to_string());
                }
            }
            // "2: eth0@if5: <BROADCAST,...> ..."
            "iplink" => {
                if let Some(name) = line.split(": ").nth(1) {
                    let name = name.split('@').next().unwrap_or(name);
                    ip_names.push(name.trim().to_string());
                }
            }
            _ => {}
        }
    }
    assert!(
        !proc_names.is_empty(),
        "{test}: /proc/net/dev listed nothing\n{}",
        describe(&out)
    );
    for names in [&proc_names, &ip_names] {
        assert!(
            names.iter().all(|n| n == "lo"),
            "{test}: interfaces other than lo are visible: {names:?}\n{}",
            describe(&out)
        );
    }
}

/// AF_PACKET and AF_INET/AF_INET6 raw sockets cannot be opened.
pub async fn raw_and_packet_sockets(env: &dyn ExecutionEnv) {
    let test = "raw_and_packet_sockets";
    let body = r#"
import socket
def sock(fam, typ, proto):
    def fn():
        try:
            s = socket.socket(fam, typ, proto)
        except OSError as e:
            return (-1, e.errno or 0)
        s.close()
        return (0, 0)
    return fn
attempt('packet_raw', sock(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3)))
attempt('packet_dgram', sock(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(3)))
attempt('inet_raw', sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt('inet_raw_tcp', sock(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
attempt('inet6_raw', sock(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))
# vsock is not namespaced: it could reach the hypervisor (CID 2) past an empty netns.
attempt('vsock_stream', sock(40, socket.SOCK_STREAM, 0))
attempt('vsock_dgram', sock(40, socket.SOCK_DGRAM, 0))
attempt('bluetooth', sock(31, socket.SOCK_RAW, 1))
attempt('can_raw', sock(29, socket.SOCK_RAW, 1))
"#;
    let out = harness(env, body, "", test).await;
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "packet_raw",
                "packet_dgram",
                "inet_raw",
                "inet_raw_tcp",
                "inet6_raw",
                "vsock_stream",
                "vsock_dgram",
                "bluetooth",
                "can_raw",
            ],
            test,
        );
    }
}

/// Inside IPv4/6 only TCP and UDP, and inside netlink only NETLINK_ROUTE: a socket of
/// any other protocol would make the host's kernel load that protocol's module (SCTP,
/// DCCP, generic netlink families) or reach surface nothing here needs (MPTCP,
/// UDP-Lite, ping sockets, audit, uevents, xfrm, netfilter, socket diagnostics). TCP,
/// UDP (protocol 0 or named, with SOCK_CLOEXEC/SOCK_NONBLOCK) and route netlink still
/// work. On the host, no module named here appears.
pub async fn socket_protocols_beyond_tcp_udp_refused(env: &dyn ExecutionEnv) {
    let test = "socket_protocols_beyond_tcp_udp_refused";
    let watched = [
        "sctp",
        "dccp",
        "dccp_ipv4",
        "dccp_ipv6",
        "udplite",
        "l2tp_ip",
        "l2tp_ip6",
    ];
    let before = host_modules();
    let body = r#"
import socket
def sock(fam, typ, proto):
    def fn():
        try:
            s = socket.socket(fam, typ, proto)
        except OSError as e:
            return (-1, e.errno or 0)
        s.close()
        return (0, 0)
    return fn
I4, I6, NL = socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK
ST, DG, SP, RAW = socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW
FLAGS = socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
attempt('tcp', sock(I4, ST, 0))
attempt('tcp_named', sock(I4, ST | FLAGS, socket.IPPROTO_TCP))
attempt('udp', sock(I4, DG | FLAGS, 0))
attempt('udp_named', sock(I4, DG, socket.IPPROTO_UDP))
attempt('tcp6', sock(I6, ST, socket.IPPROTO_TCP))
attempt('udp6', sock(I6, DG, 0))
attempt('netlink_route', sock(NL, RAW | socket.SOCK_CLOEXEC, 0))
attempt('sctp_stream', sock(I4, ST, 132))
attempt('sctp_seqpacket', sock(I4, SP, 132))
attempt('sctp6', sock(I6, ST, 132))
attempt('seqpacket_any', sock(I4, SP, 0))
attempt('dccp', sock(I4, 6, 33))
attempt('dccp_any', sock(I4, 6, 0))
attempt('mptcp', sock(I4, ST, 262))
attempt('mptcp6', sock(I6, ST | FLAGS, 262))
attempt('udplite', sock(I4, DG, 136))
attempt('udplite6', sock(I6, DG, 136))
attempt('l2tp_ip', sock(I4, DG, 115))
attempt('ping', sock(I4, DG, socket.IPPROTO_ICMP))
attempt('ping6', sock(I6, DG, socket.IPPROTO_ICMPV6))
attempt('stream_udp', sock(I4, ST, socket.IPPROTO_UDP))
attempt('netlink_generic', sock(NL, RAW, 16))
attempt('netlink_audit', sock(NL, RAW, 9))
attempt('netlink_uevent', sock(NL, DG, 15))
attempt('netlink_xfrm', sock(NL, RAW, 6))
attempt('netlink_netfilter', sock(NL, RAW, 12))
attempt('netlink_sock_diag', sock(NL, RAW, 4))
"#;
    let out = harness(env, body, "", test).await;
    if !harness_supported(&out, test) {
        return;
    }
    assert_allowed(
        &out,
        &[
            "tcp",
            "tcp_named",
            "udp",
            "udp_named",
            "tcp6",
            "udp6",
            "netlink_route",
        ],
        test,
    );
    assert_denied(
        &out,
        &[
            "sctp_stream",
            "sctp_seqpacket",
            "sctp6",
            "seqpacket_any",
            "dccp",
            "dccp_any",
            "mptcp",
            "mptcp6",
            "udplite",
            "udplite6",
            "l2tp_ip",
            "ping",
            "ping6",
            "stream_udp",
            "netlink_generic",
            "netlink_audit",
            "netlink_uevent",
            "netlink_xfrm",
            "netlink_netfilter",
            "netlink_sock_diag",
        ],
        test,
    );
    let after = host_modules();
    let loaded: Vec<&String> = after
        .iter()
        .filter(|m| watched.contains(&m.as_str()) && !before.contains(m))
        .collect();
    assert!(
        loaded.is_empty(),
        "{test}: the host's kernel loaded {loaded:?} during the attack\n{}",
        describe(&out)
    );
}

/// A setuid or setgid file left in the workspace could be run later on the host by
/// someone else: no call that sets a mode may set those bits, and none end up set.
pub async fn setuid_files_cannot_be_made(env: &dyn ExecutionEnv) {
    let test = "setuid_files_cannot_be_made";
    let body = r#"
import os
open('plain', 'w').write('x')
def call(f):
    def fn():
        try:
            f()
        except OSError as e:
            return (-1, e.errno or 0)
        return (0, 0)
    return fn
attempt('chmod_setuid', call(lambda: os.chmod('plain', 0o4755)))
attempt('chmod_setgid', call(lambda: os.chmod('plain', 0o2755)))
attempt('fchmod_setuid', call(lambda: os.fchmod(os.open('plain', os.O_RDONLY), 0o4755)))
attempt('open_setuid', call(lambda: os.close(os.open('made-suid', os.O_CREAT | os.O_WRONLY, 0o4755))))
attempt('mknod_setuid', call(lambda: os.mknod('made-node', 0o100000 | 0o4755)))
"#;
    let out = harness(env, body, "", test).await;
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "chmod_setuid",
                "chmod_setgid",
                "fchmod_setuid",
                "open_setuid",
                "mknod_setuid",
            ],
            test,
        );
    }
    // And nothing in the workspace carries the bits, whatever the calls answered.
    let never = CancellationToken::new();
    for name in ["plain", "made-suid", "made-node"] {
        if let Ok(info) = env.file_info(Path::new(name), &never).await {
            assert_eq!(
                info.mode & 0o6000,
                0,
                "{test}: {name} has mode {:o}",
                info.mode
            );
        }
    }
}

/// Python body that connects to every unix socket path in argv (`@name` = abstract).
const PY_UNIX_CONNECT: &str = r#"
import socket
def connect(target):
    def fn():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(target)
        except OSError as e:
            return (-1, e.errno or 0)
        finally:
            s.close()
        return (0, 0)
    return fn
for p in sys.argv[1:]:
    attempt(p, connect('\0' + p[1:] if p.startswith('@') else p))
"#;

/// A host abstract unix socket (abstract names are per network namespace) is
/// unreachable and accepts nothing.
pub async fn abstract_unix_socket(env: &dyn ExecutionEnv) {
    let test = "abstract_unix_socket";
    let name = marker(test);
    let addr = SocketAddr::from_abstract_name(name.as_bytes())
        .unwrap_or_else(|e| panic!("{test}: abstract address: {e}"));
    let listener = UnixListener::bind_addr(&addr)
        .unwrap_or_else(|e| panic!("{test}: bind host abstract socket: {e}"));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{test}: make the listener non-blocking: {e}"));
    let target = format!("@{name}");
    let out = harness(env, PY_UNIX_CONNECT, &quote(&target), test).await;
    assert_unix_accepted_nothing(&listener, test, &out);
    if harness_supported(&out, test) {
        assert_denied(&out, &[target.as_str()], test);
    }
}

/// Host unix sockets by path — the Docker/containerd/D-Bus sockets and one the test
/// binds under host /tmp — are unreachable.
pub async fn host_unix_sockets(env: &dyn ExecutionEnv) {
    let test = "host_unix_sockets";
    let path = HostPath::new(Path::new("/tmp").join(format!("{}.sock", marker(test))));
    let listener = UnixListener::bind(&path.0)
        .unwrap_or_else(|e| panic!("{test}: bind {}: {e}", path.0.display()));
    listener
        .set_nonblocking(true)
        .unwrap_or_else(|e| panic!("{test}: make the listener non-blocking: {e}"));
    let ours = path.0.display().to_string();
    let targets = [
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/dbus/system_bus_socket",
        "/run/systemd/private",
        ours.as_str(),
    ];
    let args: Vec<String> = targets.iter().map(|t| quote(t)).collect();
    let out = harness(env, PY_UNIX_CONNECT, &args.join(" "), test).await;
    assert_unix_accepted_nothing(&listener, test, &out);
    if harness_supported(&out, test) {
        assert_denied(&out, &targets, test);
    }
}

// ---------------------------------------------------------------------------------
// Escape syscalls
// ---------------------------------------------------------------------------------

/// PTRACE_TRACEME and PTRACE_ATTACH to a sibling process fail.
pub async fn ptrace_denied(env: &dyn ExecutionEnv) {
    let test = "ptrace_denied";
    let body = r#"
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
sibling = int(sys.argv[1])
attempt('ptrace_traceme', lambda: libc.ptrace(0, 0, None, None))
attempt('ptrace_attach_sibling', lambda: libc.ptrace(16, sibling, None, None))
attempt('ptrace_seize_sibling', lambda: libc.ptrace(0x4206, sibling, None, None))
"#;
    let script = "sleep 300 </dev/null >/dev/null 2>&1 &\n\
                  sibling=$!\n\
                  python3 -c \"$SKILLBOX_ADV_PY\" \"$sibling\"\n\
                  kill -9 \"$sibling\" 2>/dev/null\n";
    let request =
        ExecRequest::shell(script).env("SKILLBOX_ADV_PY", format!("{PY_HARNESS}\n{body}"));
    let out = exec(env, request, test).await;
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "ptrace_traceme",
                "ptrace_attach_sibling",
                "ptrace_seize_sibling",
            ],
            test,
        );
    }
}

/// No new user namespace: `unshare -U true`, unshare(CLONE_NEWUSER), and clone/clone3
/// with CLONE_NEWUSER all fail.
pub async fn user_namespace_denied(env: &dyn ExecutionEnv) {
    let test = "user_namespace_denied";
    let body = r#"
CLONE_NEWUSER = 0x10000000
attempt('unshare_newuser', lambda: libc.unshare(CLONE_NEWUSER))
attempt('unshare_newuser_newns', lambda: libc.unshare(CLONE_NEWUSER | 0x00020000))
def finish_clone(r):
    if r == 0:
        os._exit(0)
    if r > 0:
        os.waitpid(r, 0)
    return r
attempt('clone_newuser', lambda: finish_clone(call('clone', ctypes.c_ulong(CLONE_NEWUSER | 17),
    ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0), ctypes.c_void_p(0))))
def clone3_newuser():
    args = ctypes.create_string_buffer(struct.pack('11Q', CLONE_NEWUSER, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0), 88)
    return finish_clone(call('clone3', args, ctypes.c_size_t(88)))
attempt('clone3_newuser', clone3_newuser)
"#;
    let script = "if command -v unshare >/dev/null 2>&1; then\n\
                    unshare -U true </dev/null >/dev/null 2>&1; echo \"UNSHARE_CLI $?\"\n\
                  else echo 'UNSHARE_CLI missing'; fi\n\
                  python3 -c \"$SKILLBOX_ADV_PY\"\n";
    let request =
        ExecRequest::shell(script).env("SKILLBOX_ADV_PY", format!("{PY_HARNESS}\n{body}"));
    let out = exec(env, request, test).await;
    let stdout = out.stdout_text();
    match field(&stdout, "UNSHARE_CLI").map(str::trim) {
        Some("missing") => eprintln!("{test}: unshare(1) is not installed inside; ctypes only"),
        Some(code) => assert_ne!(
            code,
            "0",
            "{test}: `unshare -U true` succeeded\n{}",
            describe(&out)
        ),
        None => panic!("{test}: the script did not run\n{}", describe(&out)),
    }
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "unshare_newuser",
                "unshare_newuser_newns",
                "clone_newuser",
                "clone3_newuser",
            ],
            test,
        );
    }
}

/// mount(2) fails: a fresh tmpfs, a bind of /, remounting the read-only /usr bind
/// read-write, and detaching /usr.
pub async fn mount_denied(env: &dyn ExecutionEnv) {
    let test = "mount_denied";
    let body = r#"
target = b'/tmp/skillbox-adv-mnt'
os.makedirs(target, exist_ok=True)
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
attempt('mount_tmpfs', lambda: libc.mount(b'none', target, b'tmpfs', ctypes.c_ulong(0), None))
attempt('mount_bind_root', lambda: libc.mount(b'/', target, None, ctypes.c_ulong(MS_BIND | MS_REC), None))
attempt('remount_usr_rw', lambda: libc.mount(None, b'/usr', None, ctypes.c_ulong(MS_REMOUNT | MS_BIND), None))
attempt('umount_usr', lambda: libc.umount2(b'/usr', ctypes.c_int(2)))
"#;
    let out = harness(env, body, "", test).await;
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "mount_tmpfs",
                "mount_bind_root",
                "remount_usr_rw",
                "umount_usr",
            ],
            test,
        );
    }
}

/// io_uring_setup (a large, often-exploited kernel surface) and bpf(BPF_MAP_CREATE)
/// fail, with arguments that succeed where they are allowed.
pub async fn io_uring_and_bpf_denied(env: &dyn ExecutionEnv) {
    let test = "io_uring_and_bpf_denied";
    let body = r#"
params = ctypes.create_string_buffer(120)
attempt('io_uring_setup', lambda: call('io_uring_setup', ctypes.c_uint(8), params))
attr = ctypes.create_string_buffer(struct.pack('4I', 2, 4, 4, 1), 128)
attempt('bpf_map_create', lambda: call('bpf', ctypes.c_int(0), attr, ctypes.c_uint(128)))
"#;
    let out = harness(env, body, "", test).await;
    if harness_supported(&out, test) {
        assert_denied(&out, &["io_uring_setup", "bpf_map_create"], test);
    }
}

/// TIOCSTI (push bytes into a terminal's input queue) fails on fd 0 — also with bits
/// above 32 set in the request, which a filter comparing the full 64-bit argument would
/// miss while the kernel truncates it to 0x5412. When the sandbox has /dev/ptmx, the
/// same is tried on a pty that is the caller's controlling terminal (where it works
/// without a filter).
pub async fn tiocsti_denied(env: &dyn ExecutionEnv) {
    let test = "tiocsti_denied";
    let body = r#"
import fcntl, termios
def setup_pty():
    m, s = os.openpty()
    os.setsid()
    fcntl.ioctl(s, termios.TIOCSCTTY, 0)
    os.dup2(s, 0)
def probe():
    pid = os.fork()
    if pid == 0:
        try:
            setup_pty()
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    return os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0
has_pty = probe()
print('PTY', 'yes' if has_pty else 'no', flush=True)
def sti(cmd, pty):
    def fn():
        if pty:
            setup_pty()
        ch = ctypes.c_char(b'x')
        return call('ioctl', ctypes.c_int(0), ctypes.c_ulong(cmd), ctypes.byref(ch))
    return fn
attempt('tiocsti_fd0', sti(0x5412, False))
attempt('tiocsti_fd0_high_bits', sti(0x100005412, False))
if has_pty:
    attempt('tiocsti_pty', sti(0x5412, True))
    attempt('tiocsti_pty_high_bits', sti(0x100005412, True))
"#;
    let out = harness(env, body, "", test).await;
    if !harness_supported(&out, test) {
        return;
    }
    assert_denied(&out, &["tiocsti_fd0", "tiocsti_fd0_high_bits"], test);
    match field(&out.stdout_text(), "PTY") {
        Some("yes") => assert_denied(&out, &["tiocsti_pty", "tiocsti_pty_high_bits"], test),
        Some(_) => eprintln!(
            "{test}: no usable pty inside (/dev/ptmx + devpts); only fd 0 was tried, which is \
             not a terminal"
        ),
        None => panic!("{test}: the pty probe did not run\n{}", describe(&out)),
    }
}

/// TIOCSETD (set a terminal's line discipline) fails on the sandbox's own pty, also
/// with bits above 32 set in the request. On a kernel that autoloads line disciplines
/// it would load the module of the one asked for (n_gsm and n_hdlc have had local root
/// bugs); the attempt here asks for N_TTY, which every pty already has, so a filter
/// that let it through fails this test without loading anything on the host.
pub async fn tiocsetd_denied(env: &dyn ExecutionEnv) {
    let test = "tiocsetd_denied";
    let body = r#"
def setd(cmd):
    def fn():
        m, s = os.openpty()
        disc = ctypes.c_int(0)   # N_TTY
        return call('ioctl', ctypes.c_int(s), ctypes.c_ulong(cmd), ctypes.byref(disc))
    return fn
def has_pty():
    try:
        m, s = os.openpty()
        return True
    except OSError:
        return False
print('PTY', 'yes' if has_pty() else 'no', flush=True)
if has_pty():
    attempt('tiocsetd', setd(0x5423))
    attempt('tiocsetd_high_bits', setd(0x100005423))
"#;
    let out = harness(env, body, "", test).await;
    if !harness_supported(&out, test) {
        return;
    }
    match field(&out.stdout_text(), "PTY") {
        Some("yes") => assert_denied(&out, &["tiocsetd", "tiocsetd_high_bits"], test),
        Some(_) => eprintln!(
            "{test}: no usable pty inside (/dev/ptmx + devpts), so there is no terminal to \
             change the line discipline of"
        ),
        None => panic!("{test}: the pty probe did not run\n{}", describe(&out)),
    }
}

/// personality(2) may only ask for the current persona or set plain PER_LINUX: the
/// flags that switch off mitigations for the process (READ_IMPLIES_EXEC makes every
/// readable mapping executable, ADDR_NO_RANDOMIZE turns off ASLR, MMAP_PAGE_ZERO maps
/// page zero) and the personas of other systems are refused.
pub async fn personality_flags_denied(env: &dyn ExecutionEnv) {
    let test = "personality_flags_denied";
    let body = r#"
def persona(value):
    return lambda: call('personality', ctypes.c_ulong(value))
attempt('read_implies_exec', persona(0x0400000))
attempt('addr_no_randomize', persona(0x0040000))
attempt('mmap_page_zero', persona(0x0100000))
attempt('per_linux32', persona(0x0008))
attempt('read_implies_exec_high_bits', persona(0x100400000))
# Asking for the current persona is allowed.
attempt('query', persona(0xffffffff))
"#;
    let out = harness(env, body, "", test).await;
    if !harness_supported(&out, test) {
        return;
    }
    assert_denied(
        &out,
        &[
            "read_implies_exec",
            "addr_no_randomize",
            "mmap_page_zero",
            "per_linux32",
            "read_implies_exec_high_bits",
        ],
        test,
    );
    // gVisor's own kernel answers the query with EINVAL; a host kernel answers it.
    if env.boundary() != crate::Boundary::UserSpaceKernel {
        assert_allowed(&out, &["query"], test);
    }
}

/// Kernel interfaces container runtimes' default seccomp profiles also refuse, because
/// they are not namespaced or are frequent exploit paths: perf_event_open, userfaultfd,
/// the keyring (keyctl/add_key), and — needing capabilities the sandbox must not have —
/// kexec_load, init_module and open_by_handle_at (the "shocker" escape).
pub async fn kernel_surface_syscalls_denied(env: &dyn ExecutionEnv) {
    let test = "kernel_surface_syscalls_denied";
    let body = r#"
pattr = ctypes.create_string_buffer(128)
struct.pack_into('IIQ', pattr, 0, 1, 128, 0)              # software cpu-clock, size 128
struct.pack_into('Q', pattr, 40, (1 << 5) | (1 << 6))     # exclude_kernel | exclude_hv
attempt('perf_event_open', lambda: call('perf_event_open', pattr, ctypes.c_int(0),
    ctypes.c_int(-1), ctypes.c_int(-1), ctypes.c_ulong(0)))
attempt('userfaultfd', lambda: call('userfaultfd', ctypes.c_int(1)))   # UFFD_USER_MODE_ONLY
attempt('keyctl_join_session', lambda: call('keyctl', ctypes.c_int(1), ctypes.c_void_p(0)))
attempt('add_key', lambda: call('add_key', b'user', b'skillbox-adv', b'x', ctypes.c_size_t(1),
    ctypes.c_int(-2)))
attempt('kexec_load', lambda: call('kexec_load', ctypes.c_ulong(0), ctypes.c_ulong(0),
    ctypes.c_void_p(0), ctypes.c_ulong(0)))
attempt('init_module', lambda: call('init_module', ctypes.c_void_p(0), ctypes.c_ulong(0), b''))
handle = ctypes.create_string_buffer(struct.pack('Ii', 8, 1) + b'\0' * 8, 16)
attempt('open_by_handle_at', lambda: call('open_by_handle_at', ctypes.c_int(-100), handle,
    ctypes.c_int(0)))
"#;
    let out = harness(env, body, "", test).await;
    if harness_supported(&out, test) {
        assert_denied(
            &out,
            &[
                "perf_event_open",
                "userfaultfd",
                "keyctl_join_session",
                "add_key",
                "kexec_load",
                "init_module",
                "open_by_handle_at",
            ],
            test,
        );
    }
}

// ---------------------------------------------------------------------------------
// Resource exhaustion
// ---------------------------------------------------------------------------------

/// Forking without end is stopped by the pids limit (a counted loop first, then a
/// classic `:(){ :|:& };:`); the exec returns, the sandbox recovers, and the HOST can
/// still spawn processes.
pub async fn fork_bomb(env: &dyn ExecutionEnv) {
    let test = "fork_bomb";
    let pids = u64::from(limits().pids.unwrap_or(64));
    // Capped, so a sandbox without a pids limit fails this test instead of the host.
    let counted = r#"
import os, signal, sys
kids, err = [], None
while len(kids) < 1000:
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        signal.pause()
        os._exit(0)
    kids.append(pid)
print('FORKED', len(kids), 'ERRNO', err, flush=True)
for k in kids:
    os.kill(k, 9)
for k in kids:
    os.waitpid(k, 0)
sys.exit(1 if err is not None else 0)
"#;
    let out = python(env, counted, "", test).await;
    let stdout = out.stdout_text();
    let forked = field(&stdout, "FORKED")
        .and_then(|f| f.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    let contained = out.limit_hit == Some(LimitKind::Pids)
        || (forked.is_some_and(|n| n <= pids) && !stdout.contains("ERRNO None"));
    let kernel_ended = ended_by_memory(env, &out);
    assert!(
        contained || kernel_ended,
        "{test}: forking was not stopped by a pids limit of {pids}\n{}",
        describe(&out)
    );
    assert!(
        host_can_spawn(),
        "{test}: the HOST cannot spawn a process after the counted bomb"
    );
    if kernel_ended {
        assert_sandbox_gone(env, test).await;
        return;
    }

    let classic = ExecRequest::argv(["bash", "-c", ":(){ :|:& };:; sleep 3"])
        .timeout(Duration::from_secs(10));
    match env.exec(classic, &CancellationToken::new()).await {
        Ok(_) => {}
        Err(e) if e.code == ErrorCode::ResourceExhausted => {}
        Err(e) => panic!("{test}: the classic fork bomb broke the exec: {e}"),
    }
    assert!(
        host_can_spawn(),
        "{test}: the HOST cannot spawn a process after the fork bomb"
    );
    assert_sandbox_alive(env, test).await;
}

/// Allocating (and touching) 2 GiB is stopped by the 256 MiB memory limit.
pub async fn memory_bomb(env: &dyn ExecutionEnv) {
    let test = "memory_bomb";
    let script = r#"
chunks = []
for i in range(128):
    chunks.append(b'\x01' * (16 << 20))
print('ALLOCATED_ALL', len(chunks) * 16, 'MiB', flush=True)
"#;
    let out = python(env, script, "", test).await;
    assert!(
        !out.stdout_text().contains("ALLOCATED_ALL")
            && (out.limit_hit == Some(LimitKind::Memory) || !out.success()),
        "{test}: 2 GiB were allocated under a 256 MiB limit\n{}",
        describe(&out)
    );
    if ended_by_memory(env, &out) {
        assert_sandbox_gone(env, test).await;
        return;
    }
    assert_sandbox_alive(env, test).await;
}

/// A user-space kernel without an OOM killer of its own (gVisor's runsc as Debian ships
/// it) is itself what the container's memory cgroup kills: the bomb ends, and the
/// sandbox with it. Only that case, reported as a memory limit, may end the sandbox.
fn ended_by_memory(env: &dyn ExecutionEnv, out: &ExecOutput) -> bool {
    env.boundary() == crate::Boundary::UserSpaceKernel && out.limit_hit == Some(LimitKind::Memory)
}

/// A sandbox whose kernel the memory limit ended refuses further work with
/// `unavailable` (it does not hang or pretend to run).
async fn assert_sandbox_gone(env: &dyn ExecutionEnv, test: &str) {
    let result = tokio::time::timeout(
        HOST_POLL_BOUND,
        env.exec(ExecRequest::argv(["true"]), &CancellationToken::new()),
    )
    .await;
    match result {
        Ok(Err(e)) if e.code == ErrorCode::Unavailable => {}
        other => panic!("{test}: after its kernel was ended, the sandbox answered {other:?}"),
    }
}

/// What a fill script reported on its `KEY total errno size` line, and what the host's
/// `/tmp` filesystem lost meanwhile.
struct Fill {
    out: ExecOutput,
    total: u64,
    errno: String,
    size: u64,
    host_lost: Option<u64>,
}

async fn fill(env: &dyn ExecutionEnv, script: &str, key: &str, test: &str) -> Fill {
    let host_tmp = Path::new("/tmp");
    let before = host_free_bytes(host_tmp);
    let out = python(env, script, "", test).await;
    let after = host_free_bytes(host_tmp);
    let stdout = out.stdout_text();
    let fields: Vec<&str> = field(&stdout, key)
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    let [total, errno, size] = fields.as_slice() else {
        panic!("{test}: the fill did not report\n{}", describe(&out));
    };
    let (Ok(total), Ok(size)) = (total.parse::<u64>(), size.parse::<u64>()) else {
        panic!("{test}: unreadable report\n{}", describe(&out));
    };
    let errno = errno.to_string();
    Fill {
        host_lost: before.zip(after).map(|(b, a)| b.saturating_sub(a)),
        out,
        total,
        errno,
        size,
    }
}

/// Writing 100 MiB into the workspace stops at the 16 MiB file size limit.
pub async fn workspace_disk_fill(env: &dyn ExecutionEnv) {
    let test = "workspace_disk_fill";
    let cap = limits().file_size_bytes.unwrap_or(16 * MIB);
    let out = sh(env, "head -c 104857600 /dev/zero > big", test).await;
    let cancel = CancellationToken::new();
    let size = match env.file_info(Path::new("big"), &cancel).await {
        Ok(info) => info.size,
        Err(e) if e.code == ErrorCode::NotFound => 0,
        Err(e) => panic!("{test}: file_info big: {e}"),
    };
    let _ = env.remove(Path::new("big"), false, &cancel).await;
    assert!(
        out.limit_hit == Some(LimitKind::FileSize) || !out.success(),
        "{test}: writing 100 MiB succeeded\n{}",
        describe(&out)
    );
    assert!(
        size <= cap,
        "{test}: the workspace file grew to {size} bytes (limit {cap})"
    );
}

/// Filling /tmp (in files under the file size limit) ends in ENOSPC at the tmp size;
/// /tmp is no bigger than that, and the host's /tmp filesystem did not lose the space.
pub async fn tmp_disk_fill(env: &dyn ExecutionEnv) {
    let test = "tmp_disk_fill";
    let tmp_bytes = limits().tmp_size();
    let script = r#"
import os
total, err = 0, None
chunk = b'\0' * (1 << 20)
try:
    for i in range(12):
        fd = os.open('/tmp/skillbox-adv-fill%d' % i, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for j in range(8):
                total += os.write(fd, chunk)
        finally:
            os.close(fd)
except OSError as e:
    err = e.errno
st = os.statvfs('/tmp')
print('TMPFILL', total, err, st.f_blocks * st.f_frsize, flush=True)
for i in range(12):
    try:
        os.unlink('/tmp/skillbox-adv-fill%d' % i)
    except OSError:
        pass
"#;
    let Fill {
        out,
        total,
        errno,
        size,
        host_lost,
    } = fill(env, script, "TMPFILL", test).await;
    assert_eq!(
        errno,
        libc::ENOSPC.to_string(),
        "{test}: filling /tmp did not end in ENOSPC after {total} bytes\n{}",
        describe(&out)
    );
    assert!(
        total <= tmp_bytes,
        "{test}: wrote {total} bytes into a {tmp_bytes}-byte /tmp"
    );
    assert!(
        size <= tmp_bytes,
        "{test}: /tmp is {size} bytes, more than {tmp_bytes}"
    );
    if let Some(lost) = host_lost {
        // The attempt writes 96 MiB; a /tmp on host disk would show it. Unrelated host
        // activity stays well under this slack.
        assert!(
            lost < 48 * MIB,
            "{test}: host /tmp filesystem lost {lost} bytes during the fill\n{}",
            describe(&out)
        );
    }
}

/// Many files, each under the file size limit, reserved with `posix_fallocate` and
/// written, stop at the disk bound with ENOSPC: `/workspace` holds no more than its
/// share, the run that failed from it says `limitHit: "disk"`, and the host's disk did
/// not pay for it.
pub async fn disk_bound_holds(env: &dyn ExecutionEnv) {
    let test = "disk_bound_holds";
    let Some(split) = limits().disk_split() else {
        panic!("{test}: the suite's limits carry a disk bound");
    };
    let script = r#"
import os, sys
total, err = 0, None
try:
    for i in range(64):
        fd = os.open('/workspace/fill%d' % i, os.O_WRONLY | os.O_CREAT)
        try:
            os.posix_fallocate(fd, 0, 12 << 20)
            total += 12 << 20
        finally:
            os.close(fd)
except OSError as e:
    err = e.errno
if err is None:
    try:
        with open('/workspace/tail', 'wb') as f:
            for i in range(64):
                f.write(b'\0' * (1 << 20))
                f.flush()
                total += 1 << 20
    except OSError as e:
        err = e.errno
st = os.statvfs('/workspace')
print('DISKFILL', total, err, st.f_blocks * st.f_frsize, flush=True)
sys.exit(1 if err else 0)
"#;
    let Fill {
        out,
        total,
        errno,
        size,
        host_lost,
    } = fill(env, script, "DISKFILL", test).await;
    assert_eq!(
        errno,
        libc::ENOSPC.to_string(),
        "{test}: filling /workspace did not end in ENOSPC after {total} bytes\n{}",
        describe(&out)
    );
    assert!(
        total <= split.workspace_bytes && size <= split.workspace_bytes,
        "{test}: /workspace took {total} bytes ({size} in all), its share is {}",
        split.workspace_bytes
    );
    assert_eq!(
        out.limit_hit,
        Some(LimitKind::Disk),
        "{test}: the run failed from a full disk\n{}",
        describe(&out)
    );
    if let Some(lost) = host_lost {
        assert!(
            lost < split.workspace_bytes / 2,
            "{test}: the host's /tmp filesystem lost {lost} bytes during the fill"
        );
    }
    // The space comes back when the files go, and the sandbox goes on.
    let out = sh(env, "rm -f /workspace/fill* /workspace/tail && echo ok > /workspace/after && cat /workspace/after", test).await;
    assert_eq!(
        out.stdout_text(),
        "ok\n",
        "{test}: after the fill\n{}",
        describe(&out)
    );
}

/// Files by the thousand (empty ones: no bytes, only inodes) stop at the inode bound.
/// A user-space kernel (gVisor) keeps its files in its own memory and holds no inode
/// bound: there the files must cost the host's filesystem no inodes at all.
pub async fn disk_inodes_bound(env: &dyn ExecutionEnv) {
    let test = "disk_inodes_bound";
    let Some(split) = limits().disk_split() else {
        panic!("{test}: the suite's limits carry a disk bound");
    };
    let script = r#"
import os, sys
made, err = 0, None
os.mkdir('/workspace/many')
try:
    for i in range(20000):
        os.close(os.open('/workspace/many/%d' % i, os.O_WRONLY | os.O_CREAT))
        made += 1
except OSError as e:
    err = e.errno
print('INODES', made, err, flush=True)
sys.exit(1 if err else 0)
"#;
    let host_tmp = Path::new("/tmp");
    let before = host_free_inodes(host_tmp);
    let out = python(env, script, "", test).await;
    let after = host_free_inodes(host_tmp);
    let stdout = out.stdout_text();
    let fields: Vec<&str> = field(&stdout, "INODES")
        .map(|f| f.split_whitespace().collect())
        .unwrap_or_default();
    let [made, errno] = fields.as_slice() else {
        panic!("{test}: the run did not report\n{}", describe(&out));
    };
    let made: u64 = made.parse().unwrap_or(u64::MAX);
    if let (Some(before), Some(after)) = (before, after) {
        let lost = before.saturating_sub(after);
        assert!(
            lost < 2000,
            "{test}: the host's /tmp filesystem lost {lost} inodes to {made} files"
        );
    }
    if env.boundary() == crate::Boundary::UserSpaceKernel && *errno == "None" {
        assert_eq!(made, 20000, "{test}\n{}", describe(&out));
    } else {
        assert_eq!(
            *errno,
            libc::ENOSPC.to_string(),
            "{test}: {made} files and no ENOSPC\n{}",
            describe(&out)
        );
        assert!(
            made <= split.workspace_inodes,
            "{test}: {made} files, the bound is {}",
            split.workspace_inodes
        );
        assert_eq!(
            out.limit_hit,
            Some(LimitKind::Disk),
            "{test}\n{}",
            describe(&out)
        );
    }
    let cancel = CancellationToken::new();
    let _ = env
        .remove(Path::new("/workspace/many"), true, &cancel)
        .await;
}

/// 1 GB on stdout returns with exactly the 64 KiB cap kept and `truncated.stdout`.
pub async fn output_flood(env: &dyn ExecutionEnv) {
    let test = "output_flood";
    let cap = limits().output_bytes;
    let out = sh(env, "head -c 1000000000 /dev/zero", test).await;
    assert_eq!(
        out.stdout.len() as u64,
        cap,
        "{test}: stdout kept {} bytes, cap is {cap}\n{}",
        out.stdout.len(),
        describe(&out)
    );
    assert!(
        out.truncated.stdout,
        "{test}: truncated.stdout not set\n{}",
        describe(&out)
    );
}

/// A 1000 s sleep with a 500 ms request timeout ends as `timed_out`, and the sleep is
/// gone from the host.
pub async fn timeout_kills(env: &dyn ExecutionEnv) {
    let test = "timeout_kills";
    let seconds = format!("1000.{}", unique_number());
    let request =
        ExecRequest::argv(["sleep", seconds.as_str()]).timeout(Duration::from_millis(500));
    let out = exec(env, request, test).await;
    assert!(
        out.timed_out && !out.success(),
        "{test}: not timed out\n{}",
        describe(&out)
    );
    assert_gone_from_host(&["sleep", &seconds], test, &out).await;
}

/// A double-forked, setsid'd daemon does not outlive its exec on the host.
pub async fn daemon_does_not_survive(env: &dyn ExecutionEnv) {
    let test = "daemon_does_not_survive";
    let seconds = unique_number().to_string();
    // Waits (bounded) until the daemon runs, so the test knows it really started.
    let script = format!(
        "(setsid sleep {seconds} </dev/null >/dev/null 2>&1 &)\n\
         i=0\n\
         while [ $i -lt 200 ]; do\n\
           for f in /proc/[0-9]*/cmdline; do\n\
             if [ \"$(tr '\\0' ' ' < \"$f\" 2>/dev/null)\" = 'sleep {seconds} ' ]; then\n\
               echo DAEMON_STARTED; exit 0\n\
             fi\n\
           done\n\
           i=$((i+1)); sleep 0.05\n\
         done\n\
         echo DAEMON_NOT_SEEN; exit 1\n"
    );
    let out = sh(env, &script, test).await;
    assert!(
        out.stdout_text().contains("DAEMON_STARTED"),
        "{test}: the daemon never started inside\n{}",
        describe(&out)
    );
    assert_gone_from_host(&["sleep", &seconds], test, &out).await;
}

/// A sandbox's last exec ([`ExecRequest::last`]) may leave its background processes to
/// cleanup, but an exec after it must not run beside them (an exec's wrapper reads its
/// secret key before it protects itself): they are dead before the next one starts, and
/// gone from the host.
pub async fn last_exec_leftovers_die_before_the_next_exec(env: &dyn ExecutionEnv) {
    let test = "last_exec_leftovers_die_before_the_next_exec";
    let seconds = unique_number().to_string();
    let seen = format!(
        "for f in /proc/[0-9]*/cmdline; do\n\
           if [ \"$(tr '\\0' ' ' < \"$f\" 2>/dev/null)\" = 'sleep {seconds} ' ]; then echo FOUND; fi\n\
         done\n"
    );
    let script = format!(
        "(setsid sleep {seconds} </dev/null >/dev/null 2>&1 &)\n\
         i=0\n\
         while [ $i -lt 200 ]; do\n\
           if [ -n \"$({seen})\" ]; then echo DAEMON_STARTED; exit 0; fi\n\
           i=$((i+1)); sleep 0.05\n\
         done\n\
         echo DAEMON_NOT_SEEN; exit 1\n"
    );
    let out = exec(env, ExecRequest::shell(script).last(), test).await;
    assert!(
        out.stdout_text().contains("DAEMON_STARTED"),
        "{test}: the daemon never started inside\n{}",
        describe(&out)
    );
    let out = sh(env, &format!("{seen}echo CHECKED"), test).await;
    assert_eq!(
        out.stdout_text(),
        "CHECKED\n",
        "{test}: the next exec ran beside what the last one left\n{}",
        describe(&out)
    );
    assert_gone_from_host(&["sleep", &seconds], test, &out).await;
}

/// A last exec still ends when its command does, though what it started in the
/// background holds its output open.
pub async fn last_exec_ends_though_a_leftover_holds_its_output(env: &dyn ExecutionEnv) {
    let test = "last_exec_ends_though_a_leftover_holds_its_output";
    let seconds = unique_number().to_string();
    let request = ExecRequest::shell(format!("sleep {seconds} & echo done")).last();
    let out = exec(env, request, test).await;
    assert!(out.success(), "{test}\n{}", describe(&out));
    assert_eq!(out.stdout_text(), "done\n", "{test}\n{}", describe(&out));
    assert!(!out.timed_out, "{test}: it ended only at the deadline");
}

// ---------------------------------------------------------------------------------
// Inherited state and privileges
// ---------------------------------------------------------------------------------

/// A host fd opened without O_CLOEXEC by the test process is not open in the sandbox:
/// only 0, 1, 2 and the listing's own fd.
pub async fn host_fd_not_inherited(env: &dyn ExecutionEnv) {
    let test = "host_fd_not_inherited";
    let leaked = LeakedFd::open(test);
    let host_path = leaked.file.0.display().to_string();
    let script = r#"
import os
fds = os.listdir('/proc/self/fd')
for fd in sorted(fds, key=int):
    try:
        target = os.readlink('/proc/self/fd/' + fd)
    except OSError:
        target = 'GONE'
    print('FD', fd, target)
print('FDS_DONE')
"#;
    let out = python(env, script, "", test).await;
    let stdout = out.stdout_text();
    assert!(
        stdout.contains("FDS_DONE"),
        "{test}: the listing did not run\n{}",
        describe(&out)
    );
    assert!(
        !stdout.contains(&host_path) && !stdout.contains("skillbox-adv-leaked-fd"),
        "{test}: host fd {} ({host_path}) is open inside the sandbox\n{}",
        leaked.fd,
        describe(&out)
    );
    let extra: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("FD "))
        .filter_map(|l| l.split_once(' '))
        .filter(|(fd, _)| !matches!(*fd, "0" | "1" | "2"))
        .collect();
    // The one extra fd is the directory listdir opened, closed by the time of readlink.
    let only_listing = extra.len() <= 1
        && extra
            .iter()
            .all(|(_, t)| *t == "GONE" || t.starts_with("/proc/"));
    assert!(
        only_listing,
        "{test}: fds beyond 0, 1, 2 are open inside (host fd was {}): {extra:?}\n{}",
        leaked.fd,
        describe(&out)
    );
}

/// The code runs with no_new_privs, a seccomp filter, no effective capabilities and a
/// non-root uid. A kernel whose /proc/self/status has no NoNewPrivs line (gVisor's) is
/// asked with prctl(PR_GET_NO_NEW_PRIVS) instead.
pub async fn privileges_dropped(env: &dyn ExecutionEnv) {
    let test = "privileges_dropped";
    let out = sh(
        env,
        "cat /proc/self/status; echo \"UID $(id -u)\"; echo \"GROUPS $(id -g): $(id -G)\"; \
         python3 -c 'import ctypes; print(\"PRCTL_NNP\", ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'",
        test,
    )
    .await;
    let stdout = out.stdout_text();
    if stdout.lines().any(|l| l.starts_with("NoNewPrivs:")) {
        assert!(
            stdout.lines().any(|l| l == "NoNewPrivs:\t1"),
            "{test}: /proc/self/status shows no_new_privs unset\n{}",
            describe(&out)
        );
    } else {
        assert_eq!(
            field(&stdout, "PRCTL_NNP").map(str::trim),
            Some("1"),
            "{test}: prctl(PR_GET_NO_NEW_PRIVS) is not 1\n{}",
            describe(&out)
        );
    }
    for want in ["Seccomp:\t2", "CapEff:\t0000000000000000"] {
        assert!(
            stdout.lines().any(|l| l == want),
            "{test}: /proc/self/status lacks {want:?}\n{}",
            describe(&out)
        );
    }
    // No supplementary group of the host's (the root of a test run has some): only
    // the sandbox's own gid, if anything.
    let groups = field(&stdout, "GROUPS").unwrap_or("");
    let (primary, all) = groups.split_once(':').unwrap_or(("", ""));
    assert!(
        !primary.trim().is_empty() && all.split_whitespace().all(|g| g == primary.trim()),
        "{test}: supplementary groups inside: {groups:?}\n{}",
        describe(&out)
    );
    let uid = field(&stdout, "UID").map(str::trim).unwrap_or("");
    assert!(
        !uid.is_empty() && uid != "0",
        "{test}: `id -u` inside is {uid:?}, must be a non-root uid\n{}",
        describe(&out)
    );
}

// ---------------------------------------------------------------------------------
// Symlinks through the env's own file operations
// ---------------------------------------------------------------------------------

/// The outcome of an env read through a planted symlink: refused, or not the host's
/// shadow. `not_directory` is the code for a symlink the operation refuses to follow.
fn check_read(result: EnvResult<String>, what: &str, host: Option<&[String]>, test: &str) {
    match result {
        Ok(text) => assert!(
            !shows_host_shadow(&text, host),
            "{test}: {what} returned the HOST's /etc/shadow:\n{text}"
        ),
        Err(EnvError {
            code: ErrorCode::PermissionDenied | ErrorCode::NotFound | ErrorCode::NotDirectory,
            ..
        }) => {}
        Err(e) => panic!(
            "{test}: {what} failed with {e}; expected permission_denied, not_found or \
             not_directory"
        ),
    }
}

/// Workspace symlinks to /etc/shadow (absolute, `../../../../`, and via a link to `/`)
/// do not let read_text / read_bytes / read_text_lines / file_info / canonical reach
/// the host's shadow file.
pub async fn workspace_symlink_read(env: &dyn ExecutionEnv) {
    let test = "workspace_symlink_read";
    let host = host_shadow_lines();
    let out = sh(
        env,
        "ln -s /etc/shadow leak && ln -s ../../../../etc/shadow leak2 && ln -s / rootlink && echo LINKED",
        test,
    )
    .await;
    assert!(
        out.stdout_text().contains("LINKED"),
        "{test}: could not create symlinks in the workspace\n{}",
        describe(&out)
    );
    let cancel = CancellationToken::new();
    for path in ["leak", "leak2", "rootlink/etc/shadow"] {
        let p = Path::new(path);
        check_read(
            env.read_text(p, &cancel).await,
            &format!("read_text({path})"),
            host.as_deref(),
            test,
        );
        check_read(
            env.read_bytes(p, &cancel)
                .await
                .map(|b| String::from_utf8_lossy(&b).into_owned()),
            &format!("read_bytes({path})"),
            host.as_deref(),
            test,
        );
        check_read(
            env.read_text_lines(p, 1000, &cancel)
                .await
                .map(|t| t.lines.join("\n")),
            &format!("read_text_lines({path})"),
            host.as_deref(),
            test,
        );
        if let Ok(info) = env.file_info(p, &cancel).await {
            if path != "rootlink/etc/shadow" {
                assert_eq!(
                    info.kind,
                    FileKind::Symlink,
                    "{test}: file_info({path}) followed the symlink"
                );
            }
            check_read(
                env.read_text(p, &cancel).await,
                &format!("file_info then read_text({path})"),
                host.as_deref(),
                test,
            );
        }
        if let Ok(resolved) = env.canonical(p, &cancel).await {
            check_read(
                env.read_text(&resolved, &cancel).await,
                &format!("read_text(canonical({path}) = {})", resolved.display()),
                host.as_deref(),
                test,
            );
        }
    }
}

/// Writes through workspace symlinks that point outside (absolute, relative, and via
/// links to `/` and `/tmp`) never create anything on the host.
pub async fn workspace_symlink_write(env: &dyn ExecutionEnv) {
    let test = "workspace_symlink_write";
    let names: Vec<String> = (0..6).map(|i| marker(&format!("{test}{i}"))).collect();
    let guards = [
        HostPath::new(Path::new("/etc").join(&names[0])),
        HostPath::new(Path::new("/etc").join(&names[1])),
        HostPath::new(Path::new("/etc").join(&names[2])),
        HostPath::new(Path::new("/etc").join(&names[3])),
        HostPath::new(Path::new("/tmp").join(&names[4])),
        HostPath::new(Path::new("/etc").join(&names[5])),
    ];
    let script = format!(
        "ln -s {} wlink1 && ln -s {} wlink2 && ln -s / rootlink && ln -s /tmp tmplink && \
         echo data > src && echo LINKED",
        quote(&format!("/etc/{}", names[0])),
        quote(&format!("../../../../etc/{}", names[1])),
    );
    let out = sh(env, &script, test).await;
    assert!(
        out.stdout_text().contains("LINKED"),
        "{test}: could not create symlinks in the workspace\n{}",
        describe(&out)
    );
    let cancel = CancellationToken::new();
    let data = b"pwned by skillbox adversarial test\n";
    // Outcomes inside do not matter (a write may replace the link or land in the
    // sandbox's own /tmp); only the host is checked.
    let _ = env.append(Path::new("wlink1"), data, &cancel).await;
    let _ = env.write(Path::new("wlink1"), data, &cancel).await;
    let _ = env.append(Path::new("wlink2"), data, &cancel).await;
    let _ = env.write(Path::new("wlink2"), data, &cancel).await;
    let _ = env
        .write(&Path::new("rootlink/etc").join(&names[2]), data, &cancel)
        .await;
    let _ = env
        .create_dir(&Path::new("rootlink/etc").join(&names[3]), true, &cancel)
        .await;
    let _ = env
        .write(&Path::new("tmplink").join(&names[4]), data, &cancel)
        .await;
    let _ = env
        .rename(
            Path::new("src"),
            &Path::new("rootlink/etc").join(&names[5]),
            &cancel,
        )
        .await;
    assert_host_absent(&guards.iter().collect::<Vec<_>>(), test, &out);
}

/// Symlinked directories planted in a tree's path (`/`, `/etc`, `/tmp`, and `..` up out
/// of the workspace) never take a `put_tree` to the host. Native refuses each with
/// `permission_denied` (every path is opened beneath the workspace's mount); docker and
/// gvisor place the tree inside the container as the sandbox user, so `/etc` is refused
/// (a read-only root) and `/tmp` is the container's own, which that user may write
/// anyway. Either way the host is unchanged.
pub async fn workspace_symlink_put_tree(env: &dyn ExecutionEnv) {
    let test = "workspace_symlink_put_tree";
    let names: Vec<String> = (0..5).map(|i| marker(&format!("{test}{i}"))).collect();
    let guards = [
        HostPath::new(Path::new("/etc").join(&names[0])),
        HostPath::new(Path::new("/etc").join(&names[1])),
        HostPath::new(Path::new("/etc").join(&names[2])),
        HostPath::new(Path::new("/tmp").join(&names[3])),
        HostPath::new(Path::new("/etc").join(&names[4])),
    ];
    let out = sh(
        env,
        "ln -s / rootlink && ln -s /etc etclink && ln -s /tmp tmplink && \
         ln -s ../../../../../../etc uplink && mkdir skills && ln -s /etc skills/linked && \
         echo LINKED",
        test,
    )
    .await;
    assert!(
        out.stdout_text().contains("LINKED"),
        "{test}: could not create symlinks in the workspace\n{}",
        describe(&out)
    );
    let file = |name: &str| {
        let mut tree = crate::Tree::new();
        tree.file(name, &b"pwned by skillbox adversarial test\n"[..], true)
            .unwrap_or_else(|e| panic!("{test}: tree entry {name}: {e}"));
        tree
    };
    let mut dir_tree = crate::Tree::new();
    dir_tree
        .dir(Path::new(&names[1]).join("sub"))
        .unwrap_or_else(|e| panic!("{test}: tree entry: {e}"));
    let host_etc = [
        ("rootlink/etc", file(&names[0])),
        ("etclink", dir_tree),
        ("uplink", file(&names[2])),
        ("skills", file(&format!("linked/{}", names[4]))),
    ];
    let cancel = CancellationToken::new();
    let native = env.kind() == crate::BackendKind::Native;
    for (dir, tree) in &host_etc {
        let result = env.put_tree(Path::new(dir), tree, &cancel).await;
        if native {
            assert_refused(result, ErrorCode::PermissionDenied, test, dir);
        } else {
            // The container's /etc: its read-only root, not writable by the sandbox user.
            assert!(result.is_err(), "{test}: put_tree through {dir} wrote /etc");
        }
    }
    let tmp = env
        .put_tree(Path::new("tmplink"), &file(&names[3]), &cancel)
        .await;
    if native {
        assert_refused(tmp, ErrorCode::PermissionDenied, test, "tmplink");
    } else if tmp.is_ok() {
        // The container's own /tmp, where the sandbox user writes anyway.
        let seen = sh(env, &format!("test -f /tmp/{}", names[3]), test).await;
        assert!(
            seen.success(),
            "{test}: the tree placed through tmplink is not in the sandbox's /tmp"
        );
    }
    assert_host_absent(&guards.iter().collect::<Vec<_>>(), test, &out);
}

fn assert_refused(result: EnvResult<()>, expected: ErrorCode, test: &str, what: &str) {
    match result {
        Ok(()) => panic!("{test}: put_tree through {what} succeeded"),
        Err(e) => assert_eq!(e.code, expected, "{test}: put_tree through {what}: {e}"),
    }
}
