//! The accept loop: HTTP/1.1 connections a hostile client cannot tie up. A client has
//! `header_timeout` to send each request's headers (an idle keep-alive connection is
//! closed after the same), every answer has a write deadline (a client that takes no
//! byte of what the server is writing for `write_timeout` has its connection closed),
//! at most `max_connections` are open at once and at most `max_per_peer` of them from
//! one peer (one more is closed as soon as it is accepted), and shutdown stops
//! accepting, lets each connection finish the request it is in, and closes it.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use skillbox_pace::AnswerDeadline;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::metrics::Metrics;

/// How long shutdown waits for connections to finish their requests.
const DRAIN: Duration = Duration::from_secs(30);

/// How long a client may be, and how many connections it may hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    /// To send a request's headers; an idle keep-alive connection is closed after it.
    pub header_timeout: Duration,
    /// To take something of an answer held in the budget of bytes in memory.
    pub answer_timeout: Duration,
    /// To take something of any answer the server is writing.
    pub write_timeout: Duration,
    pub max_connections: usize,
    /// Open connections from one peer (an IPv4 address, an IPv6 /64).
    pub max_per_peer: usize,
}

/// Serves `app` on `listener` until `shutdown` fires. Each connection has an
/// [`AnswerDeadline`] of `answer_timeout` in its requests' extensions: an answer that
/// holds bytes in the server's budget arms it, and a client that has not taken that
/// answer by then has its connection closed (which gives the bytes back). Every write
/// has `write_timeout` ([`WriteDeadline`]), whatever the answer.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let ConnectionLimits {
        header_timeout,
        answer_timeout,
        write_timeout,
        max_connections,
        max_per_peer,
    } = limits;
    let open = Arc::new(Semaphore::new(max_connections.max(1)));
    let peers = Peers::new(max_per_peer);
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
        // One peer never takes every connection: others still get in.
        let Some(peer_slot) = peers.enter(peer.ip()) else {
            metrics
                .connections_refused_per_peer
                .fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%peer, max_per_peer, "serve: a peer's connections are at their bound; closed");
            drop(stream);
            continue;
        };
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
        let stream = WriteDeadline::new(stream, write_timeout);
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
                            if is_write_timeout(&e) {
                                metrics.writes_timed_out.fetch_add(1, Ordering::Relaxed);
                                tracing::info!(
                                    "serve: a client took nothing of an answer for {write_timeout:?}; its connection is closed"
                                );
                            } else {
                                tracing::debug!(error = %e, "serve: connection ended with an error");
                            }
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
            drop(peer_slot);
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

/// Open connections by peer, each bounded.
#[derive(Clone)]
struct Peers {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One open connection of a peer, counted until dropped.
struct PeerSlot {
    peers: Peers,
    peer: IpAddr,
}

impl Peers {
    fn new(max: usize) -> Peers {
        Peers {
            open: Arc::default(),
            max: max.max(1),
        }
    }

    /// A slot for one more connection of `ip`, or `None` when it has `max` open.
    fn enter(&self, ip: IpAddr) -> Option<PeerSlot> {
        let peer = peer_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let count = open.entry(peer).or_default();
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: self.clone(),
            peer,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.peer) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// Who a connection is from, for the bound per peer: an IPv4 address (an IPv4-mapped
/// IPv6 one as IPv4), or an IPv6 /64, which one host or network typically holds whole.
fn peer_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

/// A connection's stream whose writes have a deadline: a write the kernel cannot take
/// (the client's window and the send buffer full, the client reading nothing) for
/// `limit` fails with [`io::ErrorKind::TimedOut`], which ends the connection. Each
/// write that goes through starts the clock again, so a client that reads slowly but
/// steadily is served whatever the answer's size.
struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// When the write that is waiting now gives up.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// The message of a write past its deadline.
const WRITE_TIMED_OUT: &str = "the client took nothing of the answer within the write timeout";

impl<S> WriteDeadline<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
        }
    }

    /// What a write that the stream could not take now answers: still waiting, or the
    /// deadline's error once it passed.
    fn wait<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                WRITE_TIMED_OUT,
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn went<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => self.wait(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.went(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.went(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.went(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.went(cx, polled)
    }
}

/// Whether a connection ended because a write passed its deadline.
fn is_write_timeout(error: &hyper::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<io::Error>().is_some_and(|e| {
            e.kind() == io::ErrorKind::TimedOut && e.to_string() == WRITE_TIMED_OUT
        }) {
            return true;
        }
        source = e.source();
    }
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_addresses_and_ipv6_networks_each_bounded() {
        let peers = Peers::new(2);
        let one: IpAddr = "198.51.100.1".parse().unwrap();
        let a = peers.enter(one).unwrap();
        let _b = peers.enter("::ffff:198.51.100.1".parse().unwrap()).unwrap();
        assert!(peers.enter(one).is_none(), "a third of one address");
        assert!(peers.enter("198.51.100.2".parse().unwrap()).is_some());
        drop(a);
        assert!(peers.enter(one).is_some(), "a place given back");

        let _c = peers.enter("2001:db8:1:2::1".parse().unwrap()).unwrap();
        let _d = peers
            .enter("2001:db8:1:2:ffff::9".parse().unwrap())
            .unwrap();
        assert!(
            peers
                .enter("2001:db8:1:2:abcd::1".parse().unwrap())
                .is_none(),
            "one /64 is one peer"
        );
        assert!(peers.enter("2001:db8:1:3::1".parse().unwrap()).is_some());
    }
}
