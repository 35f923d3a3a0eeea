//! The exec connector of a container sandbox: what a process in the container serves is
//! reached from the host through a relay in the container, on the container's own
//! loopback (gVisor's under runsc) or a socket in its `/workspace`, and nowhere else.
//! The container keeps no network.

use std::io::Read;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use skillbox_docker::Runtime;
use skillbox_env::testkit::{host_listener_tcp, host_listener_unix};
use skillbox_env::{
    CancellationToken, Endpoint, ErrorCode, ExecConnector, ExecEvent, ExecRequest, ExecStream,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connects until something answers (bounded), sends a line, reads the answer to its
/// end.
async fn answer(connector: &dyn ExecConnector, endpoint: &Endpoint, line: &[u8]) -> Vec<u8> {
    let never = CancellationToken::new();
    let started = Instant::now();
    let mut stream = loop {
        match connector.connect(endpoint, &never).await {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                assert!(
                    matches!(e.code, ErrorCode::Unavailable | ErrorCode::NotFound),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("nothing answered at {endpoint}: {e}"),
        }
    };
    stream.write_all(line).await.unwrap();
    stream.write_all(b"\n").await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    answer
}

/// Serves one line per connection: answers `sandbox got <line>` (and, for a line that
/// is a number, that many bytes after it), then closes.
const SERVER: &str = r#"
import os, socket, sys
where = sys.argv[1]
if where.isdigit():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(where)))
else:
    s = socket.socket(socket.AF_UNIX)
    s.bind(where)
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    got = c.makefile("rb").readline().strip().decode()
    c.sendall(f"sandbox got {got}\n".encode())
    if got.isdigit():
        c.sendall(b"z" * int(got))
    c.close()
"#;

/// A service that, on each connection, finds its relays (the container's processes that
/// are skillbox's relay). `attack` (argv[2]): it tries to open each one's memory for
/// writing, as code that wants to shed the relay's filter would, reports that and its
/// filters beside its own, and closes. `hold`: it says how many there are and keeps the
/// connection open, never reading.
const RELAY_WATCHER: &str = r##"
import os, socket, sys
def relays():
    found = []
    for p in os.listdir("/proc"):
        try:
            args = open(f"/proc/{p}/cmdline", "rb").read().split(b"\0") if p.isdigit() else []
            if args[1:2] == [b"-e"] and args[2].startswith(b"# skillbox's relay"):
                found.append(p)
        except OSError:
            pass
    return found
def filters(p):
    for line in open(f"/proc/{p}/status"):
        if line.startswith("Seccomp_filters:"):
            return line.split()[1]
    return "?"
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
held = []
while True:
    c, _ = s.accept()
    found = relays()
    out = [f"relays {len(found)}"]
    if sys.argv[2] == "hold":
        c.sendall((" ".join(out) + "\n").encode())
        held.append(c)
        continue
    for p in found:
        # The relay's seccomp filters, beside the service's own (Docker's and skillbox's).
        out.append(f"filters {filters(p)}/{filters('self')}")
        try:
            open(f"/proc/{p}/mem", "r+b")
            out.append("mem WORKED")
        except OSError:
            out.append("mem refused")
    c.sendall((" ".join(out) + "\n").encode())
    c.close()
"##;

async fn ended(mut stream: ExecStream) {
    while let Some(event) = stream.next().await {
        if let Ok(ExecEvent::Exit(_)) = event {
            break;
        }
    }
}

/// The host listens on the port the container's service uses: the connector reaches
/// the service, never the host; before the service listens it is refused; the service
/// cannot open its relay's memory; once the exec ended, a listener left behind on the
/// port is not reached through its connector.
async fn a_port_is_reached_in_the_containers_own_network_only(runtime: Runtime) {
    let (port, host_hits) = host_listener_tcp();
    let mut spec = skillbox_env::testkit::spec();
    spec.policy.listen_ports.push(port);
    let made = super::make(runtime, spec).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_port_is_reached") else {
        return;
    };
    let stop = CancellationToken::new();
    // Nothing listens yet: the relay is refused, and the host is not asked instead.
    let idle = env
        .exec_stream(
            ExecRequest::argv(["sleep", "60"]).timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let refused = idle
        .connector()
        .expect("container execs have a connector")
        .connect(&Endpoint::Port(port), &CancellationToken::new())
        .await
        .err()
        .expect("nothing listens in the container");
    assert_eq!(refused.code, ErrorCode::Unavailable, "{refused}");
    stop.cancel();
    ended(idle).await;

    let stop = CancellationToken::new();
    let stream = env
        .exec_stream(
            ExecRequest::argv(["python3", "-c", SERVER, &port.to_string()])
                .timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let connector = stream
        .connector()
        .expect("container execs have a connector");
    assert!(connector.process().starts_with("container "));
    let endpoint = Endpoint::Port(port);
    assert_eq!(
        answer(connector.as_ref(), &endpoint, b"ping").await,
        b"sandbox got ping\n"
    );
    // More than the relay holds at once, back to the host.
    let big = answer(connector.as_ref(), &endpoint, b"300000").await;
    assert_eq!(big.len(), "sandbox got 300000\n".len() + 300_000);
    assert_eq!(
        host_hits.load(Ordering::SeqCst),
        0,
        "the host's listener was reached"
    );

    stop.cancel();
    ended(stream).await;

    // The service goes for its relay's memory: refused.
    let stop = CancellationToken::new();
    let stream = env
        .exec_stream(
            ExecRequest::argv(["python3", "-c", RELAY_WATCHER, &port.to_string(), "attack"])
                .timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let attacked = answer(stream.connector().unwrap().as_ref(), &endpoint, b"take it").await;
    let attacked = String::from_utf8_lossy(&attacked).to_string();
    let words: Vec<&str> = attacked.split_whitespace().collect();
    assert_eq!(words.len(), 6, "{attacked}");
    assert_eq!(&words[..3], ["relays", "1", "filters"], "{attacked}");
    assert_eq!(
        &words[4..],
        ["mem", "refused"],
        "the relay's memory was opened"
    );
    // Where the kernel counts filters (not gVisor's), the relay has the service's.
    let (relay, own) = words[3].split_once('/').unwrap();
    assert!(
        relay == own || relay == "?",
        "the relay's filters: {attacked}"
    );
    stop.cancel();
    ended(stream).await;

    // The last exec leaves a listener on the port behind: an ended exec's connector
    // reaches nothing, though something listens there now.
    let left = env
        .exec(
            ExecRequest::argv([
                "sh",
                "-c",
                "python3 -c \"$0\" \"$1\" > /tmp/ready & \
                 while [ ! -s /tmp/ready ]; do sleep 0.05; done",
                SERVER,
                &port.to_string(),
            ])
            .last(),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(left.exit_code, Some(0), "{}", left.stderr_text());
    let gone = connector
        .connect(&endpoint, &CancellationToken::new())
        .await
        .err()
        .expect("an ended exec serves nothing");
    assert_eq!(gone.code, ErrorCode::Unavailable, "{gone}");
    assert!(gone.message.contains("the exec has ended"), "{gone}");
    assert_eq!(host_hits.load(Ordering::SeqCst), 0);
    env.cleanup().await.unwrap();
}

/// A socket the service made under `/workspace` is reached; a link the code made to
/// the host's socket leads nowhere (the host's path is not in the container), and
/// `..` or a path outside the workspace is refused before anything runs.
async fn a_socket_under_the_workspace_is_reached_and_a_link_out_is_not(runtime: Runtime) {
    let made = super::make(runtime, skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_socket_is_reached") else {
        return;
    };
    let never = CancellationToken::new();
    let host = tempfile::tempdir().unwrap();
    let host_socket = host.path().join("host.sock");
    let host_hits = host_listener_unix(&host_socket);

    let stop = CancellationToken::new();
    let script = format!(
        "ln -s {} /workspace/out.sock && exec python3 -c \"$0\" /workspace/app.sock",
        host_socket.display()
    );
    let stream = env
        .exec_stream(
            ExecRequest::argv(["sh", "-c", &script, SERVER]).timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let connector = stream.connector().unwrap();
    let endpoint = Endpoint::Socket("/workspace/app.sock".into());
    assert_eq!(
        answer(connector.as_ref(), &endpoint, b"ping").await,
        b"sandbox got ping\n"
    );
    for (path, code) in [
        ("/workspace/out.sock", ErrorCode::NotFound),
        ("/workspace/missing.sock", ErrorCode::NotFound),
        ("/workspace/../tmp/x.sock", ErrorCode::Invalid),
        ("/tmp/app.sock", ErrorCode::Invalid),
    ] {
        let e = connector
            .connect(&Endpoint::Socket(path.into()), &never)
            .await
            .err()
            .unwrap_or_else(|| panic!("{path} was connected"));
        assert_eq!(e.code, code, "{path}: {e}");
    }
    assert_eq!(
        host_hits.load(Ordering::SeqCst),
        0,
        "the host's socket was reached"
    );
    // The host's socket still answers its own clients.
    let mut direct = std::os::unix::net::UnixStream::connect(&host_socket).unwrap();
    let mut text = String::new();
    direct.read_to_string(&mut text).unwrap();
    assert_eq!(text, "host\n");

    stop.cancel();
    ended(stream).await;
    env.cleanup().await.unwrap();
}

/// A connection the host drops ends its relay, though the service keeps its side open
/// (as closing a socket would end the connection): a service cannot pile up relays
/// (processes and memory of its container) by holding what its clients left.
async fn a_dropped_connection_ends_its_relay(runtime: Runtime) {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let made = super::make(runtime, skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_dropped_connection_ends") else {
        return;
    };
    let stop = CancellationToken::new();
    let stream = env
        .exec_stream(
            ExecRequest::argv(["python3", "-c", RELAY_WATCHER, &port.to_string(), "hold"])
                .timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let connector = stream.connector().unwrap();
    let endpoint = Endpoint::Port(port);
    let never = CancellationToken::new();
    let started = Instant::now();
    let mut counts = Vec::new();
    loop {
        let mut held = match connector.connect(&endpoint, &never).await {
            Ok(held) => held,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => panic!("nothing answered: {e}"),
        };
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while held.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        let line = String::from_utf8(line).unwrap();
        counts.push(line.clone());
        // Dropped with the service's side still open.
        drop(held);
        if counts.len() > 1 && line == "relays 1" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "dropped connections' relays stay: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.cancel();
    ended(stream).await;
    env.cleanup().await.unwrap();
}

/// Each test above, once on runc (`docker`) and once on runsc (`gvisor`).
macro_rules! on_each_runtime {
    ($($test:ident),* $(,)?) => {
        mod docker {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(skillbox_docker::Runtime::Runc).await;
                }
            )*
        }

        mod gvisor {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(skillbox_docker::Runtime::Runsc).await;
                }
            )*
        }
    };
}

on_each_runtime!(
    a_port_is_reached_in_the_containers_own_network_only,
    a_socket_under_the_workspace_is_reached_and_a_link_out_is_not,
    a_dropped_connection_ends_its_relay,
);
