//! The accept loop: HTTP/1.1 connections a hostile client cannot tie up. A client has
//! `header_timeout` to send each request's headers (an idle keep-alive connection is
//! closed after the same), at most `max_connections` are open at once (one more is
//! closed as soon as it is accepted), and shutdown stops accepting, lets each
//! connection finish the request it is in, and closes it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use skillbox_mcp::AnswerDeadline;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::metrics::Metrics;

/// How long shutdown waits for connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` fires. Each connection has an
/// [`AnswerDeadline`] of `answer_timeout` in its requests' extensions: an answer that
/// holds bytes in the server's budget arms it, and a client that has not taken that
/// answer by then has its connection closed (which gives the bytes back).
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    header_timeout: Duration,
    answer_timeout: Duration,
    max_connections: usize,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let open = Arc::new(Semaphore::new(max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before accept: the
                    // listener itself is fine. A pause keeps EMFILE from spinning.
                    tracing::warn!(error = %e, "serve: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        // Streamed answers (a session's exec events, MCP's) are many small writes: with
        // Nagle's algorithm each waits for the client's delayed ACK, 40 ms on Linux.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "serve: TCP_NODELAY not set");
        }
        let Ok(slot) = open.clone().try_acquire_owned() else {
            metrics.connections_refused.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(true);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        let deadline = AnswerDeadline::new(answer_timeout);
        let service = {
            let deadline = deadline.clone();
            app.clone()
                .map_request(move |mut request: hyper::Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(deadline.clone());
                    request
                })
        };
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service));
        let connection = graceful.watch(connection);
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _open = Gauge::up(&metrics);
            tokio::pin!(connection);
            // What the client had acknowledged when the deadline was last looked at.
            let mut acked = bytes_acked(fd);
            loop {
                tokio::select! {
                    ended = &mut connection => {
                        if let Err(e) = ended {
                            tracing::debug!(error = %e, "serve: connection ended with an error");
                        }
                        break;
                    }
                    () = deadline.passed() => {
                        // Bytes the kernel had buffered were taken meanwhile: progress.
                        let now = bytes_acked(fd);
                        if now.is_some() && now > acked {
                            acked = now;
                            deadline.extend();
                            continue;
                        }
                        // Dropping the connection closes it, and drops the answer it
                        // was sending.
                        metrics.answers_abandoned.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            "serve: a client took nothing of its answer for {answer_timeout:?}; its connection is closed"
                        );
                        break;
                    }
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("serve: some connections were still open {DRAIN:?} after shutdown");
    }
}

/// Counts an open connection while alive.
struct Gauge<'a>(&'a Metrics);

impl<'a> Gauge<'a> {
    fn up(metrics: &'a Metrics) -> Self {
        metrics.connections_open.fetch_add(1, Ordering::Relaxed);
        Gauge(metrics)
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The bytes the peer of TCP socket `fd` has acknowledged (`TCP_INFO`); `None` if the
/// kernel does not say.
fn bytes_acked(fd: std::os::fd::RawFd) -> Option<u64> {
    // SAFETY: a zeroed tcp_info is a valid value; getsockopt writes at most `len` bytes
    // of it, and `fd` is the connection's socket, open while its connection future is.
    unsafe {
        let mut info: libc::tcp_info = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
        let rc = libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::from_mut(&mut info).cast(),
            &mut len,
        );
        let reaches = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
        (rc == 0 && len as usize >= reaches).then_some(info.tcpi_bytes_acked)
    }
}
