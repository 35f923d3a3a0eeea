//! Egress from docker and gvisor sandboxes through skillbox's proxy (DESIGN.md §8),
//! against real servers in network namespaces this test makes (never any outside
//! address; `skillbox_egress::testkit`): the test's thread stands for the host, and
//! `api.test` and `other.test` serve at 203.0.113.7 behind a veth. The containers keep
//! `NetworkMode none`. Needs root and a daemon (skipped otherwise; a failure under
//! SKILLBOX_REQUIRE_ALL=1).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::sync::Arc;
use std::time::Duration;

use skillbox_docker::{DockerBackend, Runtime, image_tag};
use skillbox_egress::testkit::{self, PUBLIC};
use skillbox_egress::{NetworkPolicy, SecretSpec, StaticResolver};
use skillbox_env::testkit::{limits, skip};
use skillbox_env::{
    CancellationToken, ExecRequest, ExecutionEnv, FileSystem, SandboxPolicy, SandboxSpec,
};

const SECRET: &str = "real-key-7d21c4b90e";

fn image() -> String {
    image_tag(&skillbox_run::NodeRuntime::new(std::path::Path::new("/")).id())
}

/// Runs `body` in the test's namespaces with a backend for `runtime` whose proxy
/// resolves `api.test` and `other.test` to [`PUBLIC`] and trusts `roots` upstream;
/// skipped where it cannot run.
fn with_backend<F, Fut>(
    test: &'static str,
    runtime: Runtime,
    roots: Vec<rustls_pki_types::CertificateDer<'static>>,
    body: F,
) where
    F: FnOnce(DockerBackend) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    if let Some(why) = testkit::cannot_run() {
        skip(test, why);
        return;
    }
    testkit::in_netns(move || async move {
        let backend = match DockerBackend::connect(runtime, image()).await {
            Ok(backend) => backend,
            Err(e) => {
                skip(test, &e.to_string());
                return;
            }
        };
        let names = StaticResolver::of(&[("api.test", PUBLIC), ("other.test", PUBLIC)]).unwrap();
        body(
            backend
                .with_resolver(Arc::new(names))
                .with_upstream_roots(roots),
        )
        .await;
    });
}

fn spec(network: Vec<String>, secrets: &[(&str, &str)]) -> SandboxSpec {
    SandboxSpec {
        limits: limits(),
        policy: SandboxPolicy {
            network: Some(NetworkPolicy {
                allow: network,
                deny: vec![],
            }),
            secrets: secrets
                .iter()
                .map(|(name, host)| {
                    (
                        name.to_string(),
                        SecretSpec {
                            value: SECRET.into(),
                            hosts: vec![host.to_string()],
                        },
                    )
                })
                .collect(),
            ..SandboxPolicy::default()
        },
        ..SandboxSpec::default()
    }
}

async fn python(env: &dyn ExecutionEnv, script: &str, last: bool) -> (i32, String, String) {
    let mut request = ExecRequest::argv(["python3", "-c", script]).timeout(Duration::from_secs(60));
    if last {
        request = request.last();
    }
    let out = env.exec(request, &CancellationToken::new()).await.unwrap();
    (
        out.exit_code.unwrap_or(-1),
        out.stdout_text(),
        out.stderr_text(),
    )
}

/// A secret bound to one host: the sandbox sees only a placeholder and trusts the
/// sandbox's CA through the usual variables; the proxy puts the value in the request's
/// headers for that host (the server sees it) and nowhere else (another allowed host
/// gets the placeholder); the value is in no output, record or file of the sandbox; the
/// CA's files are root's, so the sandbox's user cannot swap them.
async fn check_secrets(backend: DockerBackend, test_ca: String, seen: testkit::Seen, port: u16) {
    let env = backend
        .create(spec(
            vec![format!("api.test:{port}"), format!("other.test:{port}")],
            &[("API_KEY", &format!("api.test:{port}"))],
        ))
        .await
        .unwrap();
    let script = testkit::secret_script(&["api.test", "other.test"], port, &test_ca);
    let (code, out, err) = python(&env, &script, false).await;
    testkit::assert_secret_only_for_its_host(SECRET, code, &out, &err, &seen);

    // The CA's files cannot be replaced by the sandbox's user.
    let (_, out, _) = python(
        &env,
        r#"
import os
d = os.environ["SSL_CERT_FILE"].rsplit("/", 1)[0]
print("roots", open(d + "/ca-bundle.pem").read().count("BEGIN CERTIFICATE") > 100)
for attempt in (lambda: open(d + "/ca.pem", "w"), lambda: os.rename(d + "/ca.pem", "/tmp/x"), lambda: os.rmdir(d)):
    try:
        attempt()
        print("CHANGED")
    except OSError as e:
        print("refused", e.errno)
"#,
        false,
    )
    .await;
    assert!(!out.contains("CHANGED"), "{out}");
    // The bundle has the image's public roots too, not only the sandbox's CA.
    assert!(out.starts_with("roots True\n"), "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");

    let connections = env.egress();
    // Both hosts, and the two requests smuggled into api.test's tunnel, refused.
    assert_eq!(connections.len(), 4, "{connections:#?}");
    let refused = connections
        .iter()
        .filter(|c| c.verdict == skillbox_egress::Verdict::Refused);
    assert_eq!(refused.count(), 2, "{connections:#?}");
    assert!(!format!("{connections:?}").contains(SECRET));
    let found = python(
        &env,
        &format!("import subprocess\nprint(subprocess.run(['grep', '-rl', '{SECRET}', '/workspace', '/tmp']).returncode)"),
        false,
    )
    .await;
    assert_eq!(found.1, "1\n", "{found:?}");
    env.cleanup().await.unwrap();
}

fn secrets_test(test: &'static str, runtime: Runtime) {
    let (ca, test_ca, config) = testkit::test_tls(&["api.test", "other.test"]);
    with_backend(test, runtime, vec![ca], move |backend| async move {
        let seen = testkit::Seen::default();
        let port = testkit::https_server(config, seen.clone()).await;
        check_secrets(backend, test_ca, seen, port).await;
    });
}

#[test]
fn docker_secrets_are_added_at_egress_for_their_hosts_only() {
    secrets_test(
        "docker_secrets_are_added_at_egress_for_their_hosts_only",
        Runtime::Runc,
    );
}

/// What a last exec leaves running keeps no network: the proxy stops when the exec
/// ends. The leftover tries a fetch a second later and writes what happened; the server
/// never sees it.
async fn check_last_exec_leftovers(backend: DockerBackend) {
    let port = testkit::http_server(PUBLIC).await;
    let env = backend
        .create(spec(vec![format!("api.test:{port}")], &[]))
        .await
        .unwrap();
    let fetch = format!(
        r#"
import urllib.request
try:
    print(urllib.request.urlopen("http://api.test:{port}/now", timeout=10).read().decode())
except Exception as e:
    print("ERROR", type(e).__name__)
"#
    );
    // While the sandbox's exec runs, the proxy serves it.
    let (_, out, err) = python(&env, &fetch, false).await;
    assert_eq!(out, "served GET /now HTTP/1.1\n", "{err}");
    let later = format!(
        r#"
import os, subprocess, sys
script = """
import time, urllib.request
time.sleep(1)
try:
    body = urllib.request.urlopen("http://api.test:{port}/later", timeout=5).read().decode()
except Exception as e:
    body = "ERROR " + type(e).__name__
open("/workspace/later.txt", "w").write(body)
"""
subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
print("left")
"#
    );
    let (code, out, err) = python(&env, &later, true).await;
    assert_eq!((code, out.as_str()), (0, "left\n"), "{err}");
    // The leftover runs on (until the next exec or the cleanup): it has its try.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let said = loop {
        let read = env
            .read_text(
                std::path::Path::new("/workspace/later.txt"),
                &CancellationToken::new(),
            )
            .await;
        match read {
            Ok(said) if !said.is_empty() => break said,
            _ if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("the leftover wrote nothing in time: {other:?}"),
        }
    };
    assert!(said.starts_with("ERROR"), "{said}");
    let connections = env.egress();
    assert_eq!(connections.len(), 1, "{connections:#?}");
    env.cleanup().await.unwrap();
}

#[test]
fn a_docker_last_execs_leftovers_get_no_network() {
    with_backend(
        "a_docker_last_execs_leftovers_get_no_network",
        Runtime::Runc,
        vec![],
        check_last_exec_leftovers,
    );
}

#[test]
fn gvisor_secrets_are_added_at_egress_for_their_hosts_only() {
    secrets_test(
        "gvisor_secrets_are_added_at_egress_for_their_hosts_only",
        Runtime::Runsc,
    );
}

#[test]
fn a_gvisor_last_execs_leftovers_get_no_network() {
    with_backend(
        "a_gvisor_last_execs_leftovers_get_no_network",
        Runtime::Runsc,
        vec![],
        check_last_exec_leftovers,
    );
}

/// The sandbox's code cannot take over or stop gVisor's egress bridge (root's, in the
/// container): no signal, no write to its output, no trace; the network still works
/// after the tries. And the reset, which spares the bridge, is not fooled by leftovers
/// dressed as it or as zombies (non-dumpable, a name with a fake `Uid: 0` line, a name
/// with `) Z `): they die with the exec that left them.
async fn check_bridge_holds(backend: DockerBackend) {
    let port = testkit::http_server(PUBLIC).await;
    let env = backend
        .create(spec(vec![format!("api.test:{port}")], &[]))
        .await
        .unwrap();
    let attack = r#"
import ctypes, os, signal
def uid(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[1])
bridge = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid()) and uid(p) == 0]
print("bridges", len(bridge))
for pid in bridge:
    for name, attempt in (
        ("kill", lambda: os.kill(int(pid), signal.SIGKILL)),
        ("stop", lambda: os.kill(int(pid), signal.SIGSTOP)),
        ("write", lambda: open(f"/proc/{pid}/fd/1", "wb").write(b"\0\0\0\1\1\0\0\0\0")),
        ("mem", lambda: open(f"/proc/{pid}/mem", "r+b")),
        ("trace", lambda: ctypes.CDLL(None, use_errno=True).ptrace(16, int(pid), 0, 0) == 0 or (_ for _ in ()).throw(OSError(ctypes.get_errno(), "ptrace"))),
    ):
        try:
            attempt()
            print(name, "WORKED")
        except OSError as e:
            print(name, "refused")
"#;
    let (code, out, err) = python(&env, attack, false).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("bridges 1\n"), "{out}");
    assert_eq!(out.matches("refused").count(), 5, "{out}");
    let fetch = format!(
        "import urllib.request\nprint(urllib.request.urlopen('http://api.test:{port}/after', timeout=10).read().decode())"
    );
    let (_, out, err) = python(&env, &fetch, false).await;
    assert_eq!(out, "served GET /after HTTP/1.1\n", "{err}");

    // Leftovers that dress up for the reset: non-dumpable (its `/proc` entry turns
    // root's on Linux), named with a fake `Uid: 0` line for `status`, named to look like
    // a zombie in `stat`. Each writes its pid, then waits; the exec's reset must kill
    // them (the next exec kills nothing first: it sees what the reset left).
    let leftover = r#"
import os, subprocess, sys, time
script = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
if sys.argv[1] == "undumpable":
    libc.prctl(4, 0, 0, 0, 0)
else:
    libc.prctl(15, ctypes.c_char_p(sys.argv[1].encode()), 0, 0, 0)
open("/workspace/pid-" + str(len(sys.argv[1])), "w").write(str(os.getpid()))
time.sleep(120)
"""
for name in ["undumpable", "a\nUid:\t0\n", "x) Z "]:
    subprocess.Popen([sys.executable, "-c", script, name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
deadline = time.monotonic() + 20
while len([f for f in os.listdir("/workspace") if f.startswith("pid-")]) < 3 and time.monotonic() < deadline:
    time.sleep(0.05)
print("left")
"#;
    let (_, out, err) = python(&env, leftover, false).await;
    assert_eq!(out, "left\n", "{err}");
    let (_, out, err) = python(
        &env,
        r#"
import glob
alive = []
for f in sorted(glob.glob("/workspace/pid-*")):
    pid = open(f).read()
    try:
        st = open("/proc/" + pid + "/stat").read()
    except OSError:
        continue
    if st[st.rindex(")") + 2] != "Z":
        alive.append(f)
print(len(glob.glob("/workspace/pid-*")), alive)
"#,
        false,
    )
    .await;
    assert_eq!(out, "3 []\n", "{err}");
    env.cleanup().await.unwrap();
}

#[test]
fn the_gvisor_bridge_holds_against_the_sandbox() {
    with_backend(
        "the_gvisor_bridge_holds_against_the_sandbox",
        Runtime::Runsc,
        vec![],
        check_bridge_holds,
    );
}

/// A download larger than every buffer on the way (the bridge's, the streams' queues,
/// the proxy's) arrives whole, and an upload too: through gVisor's bridge and through
/// docker's listener. Prints the download's rate (no bar: a test times nothing).
async fn check_large_transfers(backend: DockerBackend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SIZE: usize = 24 * 1024 * 1024;
    let listener = testkit::listen(PUBLIC);
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let answer = if head.starts_with("POST") {
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("Content-Length: "))
                        .unwrap()
                        .trim()
                        .parse()
                        .unwrap();
                    let mut body = vec![0u8; len];
                    stream.read_exact(&mut body).await.unwrap();
                    let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
                    format!("{len} {sum}").into_bytes()
                } else {
                    (0..SIZE).map(|i| (i % 251) as u8).collect()
                };
                let _ = stream
                    .write_all(
                        format!(
                            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n",
                            answer.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    let env = backend
        .create(spec(vec![format!("api.test:{port}")], &[]))
        .await
        .unwrap();
    let script = format!(
        r#"
import time, urllib.request
start = time.monotonic()
body = urllib.request.urlopen("http://api.test:{port}/big", timeout=60).read()
took = time.monotonic() - start
print(len(body), all(b == i % 251 for i, b in enumerate(body[:100000])), sum(body) % 1000003)
up = bytes(i % 7 for i in range({SIZE}))
print(urllib.request.urlopen(urllib.request.Request("http://api.test:{port}/up", data=up), timeout=60).read().decode(), sum(up))
print("download MB/s", round(len(body) / took / 1e6))
"#
    );
    let (code, out, err) = python(&env, &script, false).await;
    let expected: u64 = (0..SIZE).map(|i| (i % 251) as u64).sum::<u64>() % 1_000_003;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(lines[0], format!("{SIZE} True {expected}"), "{out}{err}");
    let (sent, sum) = lines[1].rsplit_once(' ').unwrap();
    assert_eq!(sent, format!("{SIZE} {sum}"), "{out}");
    eprintln!("{}", lines[2]);
    env.cleanup().await.unwrap();
}

#[test]
fn large_transfers_through_the_gvisor_bridge_arrive_whole() {
    with_backend(
        "large_transfers_through_the_gvisor_bridge_arrive_whole",
        Runtime::Runsc,
        vec![],
        check_large_transfers,
    );
}

#[test]
fn large_transfers_through_the_docker_proxy_arrive_whole() {
    with_backend(
        "large_transfers_through_the_docker_proxy_arrive_whole",
        Runtime::Runc,
        vec![],
        check_large_transfers,
    );
}

/// A connection whose upstream stops reading holds back only itself: while one upload
/// is stuck (the server reads its head, then nothing), another request through the
/// bridge is answered.
async fn check_stalled_upload(backend: DockerBackend) {
    use tokio::io::AsyncReadExt;
    let sink = testkit::listen(PUBLIC);
    let sink_port = sink.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut stream, _) = sink.accept().await.unwrap();
            let mut byte = [0u8; 1];
            let _ = stream.read(&mut byte).await;
            held.push(stream);
        }
    });
    let port = testkit::http_server(PUBLIC).await;
    let env = backend
        .create(spec(
            vec![format!("api.test:{port}"), format!("api.test:{sink_port}")],
            &[],
        ))
        .await
        .unwrap();
    let script = format!(
        r#"
import threading, time, urllib.request
def upload():
    try:
        urllib.request.urlopen(urllib.request.Request("http://api.test:{sink_port}/up", data=b"x" * (48 << 20)), timeout=30)
    except Exception:
        pass
threading.Thread(target=upload, daemon=True).start()
time.sleep(2)
print(urllib.request.urlopen("http://api.test:{port}/beside", timeout=10).read().decode())
"#
    );
    let (code, out, err) = python(&env, &script, false).await;
    assert_eq!(
        (code, out.as_str()),
        (0, "served GET /beside HTTP/1.1\n"),
        "{err}"
    );
    env.cleanup().await.unwrap();
}

#[test]
fn a_stalled_upload_through_the_gvisor_bridge_holds_back_only_itself() {
    with_backend(
        "a_stalled_upload_through_the_gvisor_bridge_holds_back_only_itself",
        Runtime::Runsc,
        vec![],
        check_stalled_upload,
    );
}
