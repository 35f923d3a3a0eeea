//! What is composed above the server (`skillbox serve`'s `/mcp`) through a real
//! [`Extension`]: its route is behind the same Host check and API keys as every other
//! route, its bodies are read by the server's rule (the body limit, the body timeout,
//! the budget of bodies in memory), its lines are in `/metrics`, and shutdown stops it,
//! then closes it once the connections are drained.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::routing::post;
use skillbox_run::{Runner, RunnerConfig};
use skillbox_server::{ApiKeys, AppState, Extension, ServerConfig, Tenant};
use skillbox_store::ArtifactStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::shared_data_dir;

const KEY: &str = "tenant-a-token-0123456789";
const BODY_LIMIT: usize = 4096;

/// What the extension saw of the server's shutdown, in order.
#[derive(Debug, Default)]
struct Seen {
    events: Mutex<Vec<&'static str>>,
    calls: AtomicUsize,
}

/// `POST /ext/echo` answers its tenant and its body's length.
#[derive(Debug)]
struct Echo {
    seen: Arc<Seen>,
}

#[async_trait]
impl Extension for Echo {
    fn routes(&self) -> Router {
        let seen = self.seen.clone();
        Router::new().route(
            "/ext/echo",
            post(
                move |axum::Extension(tenant): axum::Extension<Tenant>, body: bytes::Bytes| async move {
                    seen.calls.fetch_add(1, Ordering::SeqCst);
                    format!("{} {}", tenant.as_str(), body.len())
                },
            ),
        )
    }

    async fn metrics(&self) -> String {
        format!(
            "# HELP skillbox_ext_calls Calls of the test extension.\n\
             # TYPE skillbox_ext_calls counter\nskillbox_ext_calls {}\n",
            self.seen.calls.load(Ordering::SeqCst)
        )
    }

    fn stop(&self) {
        self.seen.events.lock().unwrap().push("stop");
    }

    async fn close(&self) {
        self.seen.events.lock().unwrap().push("close");
    }
}

/// One raw HTTP/1.1 exchange: the status and the body.
async fn exchange(addr: &str, request: String, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {answer:?}"));
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

fn request(method: &str, path: &str, host: &str, key: Option<&str>, length: usize) -> String {
    let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
    format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Length: {length}\r\nConnection: close\r\n\r\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extension_is_served_behind_the_servers_doors_and_stopped_with_it() {
    let objects = tempfile::tempdir().unwrap();
    let store = ArtifactStore::local(objects.path()).await.unwrap();
    let runner = Arc::new(Runner::new(RunnerConfig::new(shared_data_dir()), store));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let config = ServerConfig {
        keys: Some(Arc::new(
            ApiKeys::from_pairs(&format!("alice={KEY}")).unwrap(),
        )),
        body_limit: BODY_LIMIT,
        body_timeout: Duration::from_secs(1),
        // One body at the limit at a time: a tenant's share is the larger of half of
        // it and one body.
        max_body_bytes_in_flight: BODY_LIMIT,
        ..ServerConfig::default()
    };
    let seen = Arc::new(Seen::default());
    let mounted = seen.clone();
    let shutdown = CancellationToken::new();
    let serving = tokio::spawn(skillbox_server::serve_on_with(
        listener,
        config,
        runner,
        shutdown.clone(),
        Box::new(move |_: &AppState| vec![Arc::new(Echo { seen: mounted }) as Arc<dyn Extension>]),
    ));

    // Served, with the key's tenant.
    let (status, body) = exchange(
        &addr,
        request("POST", "/ext/echo", &addr, Some(KEY), 5),
        b"hello",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "alice 5"));

    // Refused as every route is: no key, an unknown key, a Host that is not loopback's.
    for (host, key, expected) in [
        (addr.as_str(), None, 401),
        (addr.as_str(), Some("not-a-key-0123456789"), 401),
        ("evil.example", Some(KEY), 403),
    ] {
        let (status, body) =
            exchange(&addr, request("POST", "/ext/echo", host, key, 5), b"hello").await;
        assert_eq!(status, expected, "{body}");
        let (route, _) = exchange(&addr, request("GET", "/v1/runs", host, key, 0), b"").await;
        assert_eq!(
            route, expected,
            "a route of the server's own answers otherwise"
        );
    }

    // A body past the limit, announced or chunked, is 413 before the extension sees it.
    let (status, body) = exchange(
        &addr,
        request("POST", "/ext/echo", &addr, Some(KEY), BODY_LIMIT + 1),
        &vec![b'x'; BODY_LIMIT + 1],
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains(r#""code":"payload_too_large""#), "{body}");
    let chunk = vec![b'x'; BODY_LIMIT];
    let mut chunked = format!("{:x}\r\n", chunk.len()).into_bytes();
    chunked.extend_from_slice(&chunk);
    chunked.extend_from_slice(b"\r\n");
    chunked.extend_from_slice(&chunked.clone());
    chunked.extend_from_slice(b"0\r\n\r\n");
    let head = format!(
        "POST /ext/echo HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {KEY}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    let (status, body) = exchange(&addr, head, &chunked).await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains(r#""code":"payload_too_large""#), "{body}");

    // A body not sent within the body timeout is 504, and meanwhile it holds its bytes
    // in the budget: another body that would pass it is 429.
    let mut slow = TcpStream::connect(&addr).await.unwrap();
    slow.write_all(request("POST", "/ext/echo", &addr, Some(KEY), BODY_LIMIT).as_bytes())
        .await
        .unwrap();
    slow.write_all(b"only a few bytes").await.unwrap();
    let mut refused = None;
    for _ in 0..100 {
        let (status, body) = exchange(
            &addr,
            request("POST", "/ext/echo", &addr, Some(KEY), 5),
            b"hello",
        )
        .await;
        if status == 429 {
            refused = Some(body);
            break;
        }
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let refused = refused.expect("a body past the budget was taken");
    assert!(refused.contains(r#""code":"overloaded""#), "{refused}");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), slow.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(answer.contains(r#""code":"timeout""#), "{answer}");

    // Its lines are in /metrics, once; the calls it counted are those it answered.
    let answered = seen.calls.load(Ordering::SeqCst);
    let (status, metrics) =
        exchange(&addr, request("GET", "/metrics", &addr, Some(KEY), 0), b"").await;
    assert_eq!(status, 200, "{metrics}");
    assert_eq!(
        metrics
            .matches("# TYPE skillbox_ext_calls counter\n")
            .count(),
        1,
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("\nskillbox_ext_calls {answered}\n")),
        "{metrics}"
    );

    // Shutdown stops it, and closes it once the connections are drained.
    assert!(seen.events.lock().unwrap().is_empty());
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), serving)
        .await
        .expect("the server stopped")
        .unwrap()
        .unwrap();
    assert!(seen.events.lock().unwrap().contains(&"close"));
    // Stopped from a task of its own as shutdown begins.
    for _ in 0..1000 {
        if seen.events.lock().unwrap().contains(&"stop") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "the extension was not stopped: {:?}",
        seen.events.lock().unwrap()
    );
}
