//! The exec connector: what a sandboxed process serves is reached from the host side,
//! in the exec's own network namespace (a port) or beneath the workspace's directory fd
//! (a socket), and nowhere else.

use std::io::Read;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use skillbox_env::testkit::{host_listener_tcp, host_listener_unix};
use skillbox_env::{CancellationToken, Endpoint, ErrorCode, ExecConnector, ExecEvent, ExecRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connects until something answers (bounded), then reads one line.
async fn first_line(connector: &dyn ExecConnector, endpoint: &Endpoint) -> String {
    let never = CancellationToken::new();
    let started = Instant::now();
    let mut stream = loop {
        match connector.connect(endpoint, &never).await {
            Ok(stream) => break stream,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                assert!(
                    matches!(e.code, ErrorCode::Unavailable | ErrorCode::NotFound),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("nothing answered at {endpoint}: {e}"),
        }
    };
    stream.write_all(b"ping\n").await.unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while stream.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

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
while True:
    c, _ = s.accept()
    got = c.makefile("rb").readline().strip().decode()
    c.sendall(f"sandbox got {got}\n".encode())
    c.close()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_is_reached_in_the_execs_own_network_only() {
    // The host listens on the same port number: the connector must not reach it.
    let (port, host_hits) = host_listener_tcp();
    let mut spec = skillbox_env::testkit::spec();
    spec.policy.listen_ports.push(port);
    let made = super::make_env(spec).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_port_is_reached") else {
        return;
    };
    // Only the declared port may be listened on (Landlock handles binds from ABI 4 on;
    // below that the namespace's lone `lo` is all there is).
    let abi: u32 = skillbox_native::probe().layers["landlock"]
        .detail
        .strip_prefix("ABI ")
        .and_then(|rest| rest.split(':').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let other_port = if port == u16::MAX { port - 1 } else { port + 1 };
    let refused = env
        .exec(
            ExecRequest::argv([
                "python3",
                "-c",
                "import socket, sys; socket.socket().bind(('127.0.0.1', int(sys.argv[1])))",
                &other_port.to_string(),
            ]),
            &CancellationToken::new(),
        )
        .await
        .unwrap();
    if abi >= 4 {
        assert_ne!(refused.exit_code, Some(0), "an undeclared port was bound");
        assert!(
            refused.stderr_text().contains("PermissionError"),
            "{}",
            refused.stderr_text()
        );
    }
    let stop = CancellationToken::new();
    let mut stream = env
        .exec_stream(
            ExecRequest::argv(["python3", "-c", SERVER, &port.to_string()])
                .timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let connector = stream.connector().expect("native execs have a connector");
    assert!(connector.process().starts_with("pid "));
    let endpoint = Endpoint::Port(port);
    assert_eq!(
        first_line(connector.as_ref(), &endpoint).await,
        "sandbox got ping"
    );
    assert_eq!(
        first_line(connector.as_ref(), &endpoint).await,
        "sandbox got ping"
    );
    assert_eq!(
        host_hits.load(Ordering::SeqCst),
        0,
        "the host's listener was reached"
    );

    // Another exec of the same sandbox has a network of its own: nothing listens there.
    let mut other = env
        .exec_stream(
            ExecRequest::argv(["sleep", "30"]).timeout(Duration::from_secs(60)),
            &stop,
        )
        .await
        .unwrap();
    let other_connector = other.connector().unwrap();
    let refused = other_connector
        .connect(&endpoint, &CancellationToken::new())
        .await
        .err()
        .expect("the other exec serves nothing");
    assert_eq!(refused.code, ErrorCode::Unavailable, "{refused}");

    stop.cancel();
    while stream.next().await.is_some() {}
    while other.next().await.is_some() {}
    let gone = connector
        .connect(&endpoint, &CancellationToken::new())
        .await
        .err()
        .expect("an ended exec serves nothing");
    assert_eq!(gone.code, ErrorCode::Unavailable, "{gone}");
    assert_eq!(host_hits.load(Ordering::SeqCst), 0);
    env.cleanup().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_under_the_workspace_is_reached_and_a_link_out_is_not() {
    let made = super::make_env(skillbox_env::testkit::spec()).await;
    let Some(env) = skillbox_env::testkit::require(made, "a_socket_is_reached") else {
        return;
    };
    let never = CancellationToken::new();
    let host = tempfile::tempdir().unwrap();
    let host_socket = host.path().join("host.sock");
    let host_hits = host_listener_unix(&host_socket);

    let stop = CancellationToken::new();
    let mut stream = env
        .exec_stream(
            ExecRequest::argv(["python3", "-c", SERVER, "/workspace/app.sock"])
                .timeout(Duration::from_secs(120)),
            &stop,
        )
        .await
        .unwrap();
    let connector = stream.connector().unwrap();
    let endpoint = Endpoint::Socket("/workspace/app.sock".into());
    assert_eq!(
        first_line(connector.as_ref(), &endpoint).await,
        "sandbox got ping"
    );

    // The code points names at the host's socket, at its own socket through a link,
    // and at a plain file: the connector follows none of them.
    let out = env
        .exec(
            ExecRequest::shell(format!(
                "ln -s {} /workspace/out.sock; ln -s app.sock /workspace/inner.sock; \
                 mkdir /workspace/d; ln -s {} /workspace/d/s; echo x > /workspace/file",
                host_socket.display(),
                host.path().display()
            )),
            &never,
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{}", out.stderr_text());
    for (path, code) in [
        ("/workspace/out.sock", ErrorCode::Invalid),
        ("/workspace/inner.sock", ErrorCode::Invalid),
        ("/workspace/d/s/host.sock", ErrorCode::PermissionDenied),
        ("/workspace/file", ErrorCode::Invalid),
        ("/workspace/../tmp/x.sock", ErrorCode::Invalid),
        ("/tmp/app.sock", ErrorCode::Invalid),
        ("/workspace/missing.sock", ErrorCode::NotFound),
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
    // The host's socket is still there and still answers its own clients.
    let mut direct = std::os::unix::net::UnixStream::connect(&host_socket).unwrap();
    let mut answer = String::new();
    direct.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "host\n");
    assert!(
        env.exists(Path::new("/workspace/app.sock"), &never)
            .await
            .unwrap()
    );

    stop.cancel();
    while let Some(event) = stream.next().await {
        if let Ok(ExecEvent::Exit(_)) = event {
            break;
        }
    }
    env.cleanup().await.unwrap();
}
