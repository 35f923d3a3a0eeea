//! The proxy: HTTP `CONNECT host:port` (any TCP protocol, TLS included, passed
//! through untouched) and absolute-form `http://host/path` requests (forwarded as
//! origin-form, one request a connection). Each is checked against the [`Rules`],
//! resolved once, every resolved address judged by [`forbidden`], one of those left
//! connected, and the bytes counted against [`ProxyLimits::egress_bytes`].

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::addr::{forbidden, own_address};
use crate::rules::Rules;

/// The largest request head the proxy reads (request line and headers).
const MAX_HEAD: usize = 16 * 1024;
/// Most connections a proxy records; past it only the counts go on.
const MAX_RECORDS: usize = 1000;
/// Connections of one proxy logged one by one; the rest are counted in its audit only.
const MAX_LOGGED: u64 = 100;

/// Resolves a host name to the addresses the proxy may try (each judged afterwards).
pub trait Resolve: Send + Sync + fmt::Debug {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>>;
}

/// The host's own resolver (getaddrinfo).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>> {
        Box::pin(async move { Ok(tokio::net::lookup_host((host, port)).await?.collect()) })
    }
}

/// Names answered from a fixed table (a pinned name, a test's own servers); any other
/// name does not resolve. Every address is still judged before a connect.
#[derive(Debug, Clone, Default)]
pub struct StaticResolver(pub std::collections::HashMap<String, IpAddr>);

impl StaticResolver {
    /// The table from `(name, address)` pairs; an address that does not parse is the
    /// error, naming it.
    pub fn of(names: &[(&str, &str)]) -> Result<StaticResolver, String> {
        names
            .iter()
            .map(|(name, ip)| {
                ip.parse()
                    .map(|ip| (name.to_string(), ip))
                    .map_err(|e| format!("{name}: {ip:?}: {e}"))
            })
            .collect::<Result<_, _>>()
            .map(StaticResolver)
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(
        &'a self,
        host: &'a str,
        port: u16,
    ) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send + 'a>> {
        Box::pin(async move {
            match self.0.get(host) {
                Some(ip) => Ok(vec![SocketAddr::new(*ip, port)]),
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}: not in the table"),
                )),
            }
        })
    }
}

/// How much one proxy lets through.
#[derive(Debug, Clone, Copy)]
pub struct ProxyLimits {
    /// Bytes in both directions over all connections (`limits.egressBytes`); `None`:
    /// unbounded.
    pub egress_bytes: Option<u64>,
    /// A client must send its request head within this.
    pub head_timeout: Duration,
    /// Resolving and connecting, together.
    pub connect_timeout: Duration,
    /// Connections open at once; more wait.
    pub max_connections: usize,
    /// A connection with no byte either way for this long is closed (a tunnel the
    /// sandbox holds open and silent would otherwise keep one of `max_connections`).
    pub idle_timeout: Duration,
}

impl Default for ProxyLimits {
    fn default() -> Self {
        ProxyLimits {
            egress_bytes: None,
            head_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_connections: 64,
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// One connection, as the audit keeps it.
pub use skillbox_protocol::EgressConnection as Connection;
/// Whether a connection went through.
pub use skillbox_protocol::EgressVerdict as Verdict;

/// What a proxy let through and refused.
#[derive(Debug, Default)]
pub struct Audit {
    records: Mutex<Vec<Connection>>,
    /// Connections past [`MAX_RECORDS`], not recorded one by one.
    unrecorded: AtomicU64,
    /// Bytes through, both ways, all connections.
    bytes: AtomicU64,
    /// Connections logged one by one so far (at most [`MAX_LOGGED`]).
    logged: AtomicU64,
}

impl Audit {
    /// The connections recorded so far, in the order they ended.
    pub fn connections(&self) -> Vec<Connection> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Connections not recorded one by one (over the bound).
    pub fn unrecorded(&self) -> u64 {
        self.unrecorded.load(Ordering::Relaxed)
    }

    /// Bytes through, both ways.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    fn record(&self, connection: Connection) {
        // A sandbox asking again and again must not grow skillbox's log without bound:
        // the first connections are logged, the rest only counted in the audit.
        let logged = self.logged.fetch_add(1, Ordering::Relaxed);
        if logged < MAX_LOGGED {
            match connection.verdict {
                Verdict::Allowed => {
                    tracing::debug!(host = %connection.host, port = connection.port, bytes_out = connection.bytes_out, bytes_in = connection.bytes_in, reason = ?connection.reason, "egress: allowed")
                }
                Verdict::Refused => {
                    tracing::info!(host = %connection.host, port = connection.port, reason = ?connection.reason, "egress: refused")
                }
            }
        } else if logged == MAX_LOGGED {
            tracing::info!(
                "egress: {MAX_LOGGED} connections of this sandbox logged; the rest are not logged one by one"
            );
        }
        if let Ok(mut records) = self.records.lock()
            && records.len() < MAX_RECORDS
        {
            records.push(connection);
            return;
        }
        self.unrecorded.fetch_add(1, Ordering::Relaxed);
    }
}

/// One sandbox's proxy: its rules, its resolver, its bounds and its audit.
#[derive(Debug, Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    rules: Rules,
    resolver: Arc<dyn Resolve>,
    limits: ProxyLimits,
    audit: Arc<Audit>,
    stop: CancellationToken,
    open: Arc<Semaphore>,
    tasks: TaskTracker,
    /// The secrets and the TLS that adds them at egress (`None`: tunnels only).
    secrets: Option<(crate::Substitutions, crate::Interceptor)>,
}

/// What the client asked for.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    /// `None` for CONNECT; else the request head to send upstream (origin-form).
    forward: Option<Vec<u8>>,
}

/// A refusal: its status line and the reason sent and recorded.
struct Refusal {
    status: &'static str,
    reason: String,
}

/// How a connection the proxy adds secrets to ended.
enum Intercepted {
    /// Through to the real host (or ended before anything reached it): bytes out,
    /// bytes back, why it was cut.
    Through {
        out: u64,
        back: u64,
        cut: Option<String>,
    },
    /// The sandbox was answered with a refusal and the host got no request: the real
    /// host could not be had over verified TLS (`502`), or the request was not for the
    /// tunnel's host (`421`, `400`). Why.
    Refused(String),
}

impl Proxy {
    pub fn new(rules: Rules, resolver: Arc<dyn Resolve>, limits: ProxyLimits) -> Proxy {
        Proxy::with_secrets(rules, resolver, limits, None)
    }

    /// A proxy that also adds `secrets` at egress: a `CONNECT` to one of a secret's
    /// hosts is opened with TLS both ways (the sandbox's side with the interceptor's
    /// CA) and the placeholders in the request's headers become the values.
    pub fn with_secrets(
        rules: Rules,
        resolver: Arc<dyn Resolve>,
        limits: ProxyLimits,
        secrets: Option<(crate::Substitutions, crate::Interceptor)>,
    ) -> Proxy {
        Proxy {
            inner: Arc::new(Inner {
                rules,
                resolver,
                open: Arc::new(Semaphore::new(limits.max_connections.max(1))),
                limits,
                audit: Arc::default(),
                stop: CancellationToken::new(),
                tasks: TaskTracker::new(),
                secrets,
            }),
        }
    }

    pub fn audit(&self) -> Arc<Audit> {
        self.inner.audit.clone()
    }

    /// Serves every connection `listener` accepts until [`stop`](Self::stop).
    pub async fn serve(&self, listener: TcpListener) {
        self.serve_until(listener, self.inner.stop.clone()).await;
    }

    /// Serves every connection `listener` accepts until `until` (or [`stop`](Self::stop));
    /// connections already accepted go on (one exec's listener, within the sandbox's
    /// proxy).
    pub async fn serve_until(&self, listener: TcpListener, until: CancellationToken) {
        loop {
            // A slot before the accept: past `max_connections` the sandbox's connections
            // wait in the listen backlog (the kernel's, in the sandbox's namespace), not
            // as fds and tasks of skillbox's own process, which every sandbox shares.
            let slot = tokio::select! {
                () = self.inner.stop.cancelled() => break,
                () = until.cancelled() => break,
                slot = self.inner.open.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
            };
            let stream = tokio::select! {
                () = self.inner.stop.cancelled() => break,
                () = until.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "egress: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            let proxy = self.clone();
            self.inner.tasks.spawn(async move {
                proxy.handle_in(stream).await;
                drop(slot);
            });
        }
    }

    /// Ends every connection and waits until each is recorded.
    pub async fn stop(&self) {
        self.inner.stop.cancel();
        self.inner.tasks.close();
        self.inner.tasks.wait().await;
    }

    /// Serves one client connection in a task of the proxy's own (so [`stop`](Self::stop)
    /// waits for its record), once a slot is free: a sandbox's connection that reaches
    /// skillbox as a stream (gVisor's bridge), not through a listener.
    pub fn spawn<S>(&self, client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let proxy = self.clone();
        self.inner
            .tasks
            .spawn(async move { proxy.handle(client).await });
    }

    /// Whether [`stop`](Self::stop) was called: it serves nothing more.
    pub fn is_stopped(&self) -> bool {
        self.inner.stop.is_cancelled()
    }

    /// Serves one client connection to its end.
    pub async fn handle<S>(&self, client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let Ok(_slot) = self.inner.open.acquire().await else {
            return;
        };
        self.handle_in(client).await;
    }

    /// [`handle`](Self::handle) once a slot is held.
    async fn handle_in<S>(&self, mut client: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let inner = &self.inner;
        let opening = tokio::select! {
            () = inner.stop.cancelled() => return,
            read = read_opening(&mut client, inner.limits.head_timeout) => read,
        };
        let (door, target, rest) = match opening {
            Ok(opened) => opened,
            Err((door, refusal)) => {
                door.refuse(&mut client, &refusal).await;
                return;
            }
        };
        let mut record = Connection {
            host: target.host.clone(),
            port: target.port,
            verdict: Verdict::Refused,
            reason: None,
            address: None,
            bytes_out: 0,
            bytes_in: 0,
        };
        let upstream = tokio::select! {
            () = inner.stop.cancelled() => Err(Refusal { status: "503 Service Unavailable", reason: "the sandbox is ending".into() }),
            connected = self.connect(&target) => connected,
        };
        let (mut server, address) = match upstream {
            Ok(connected) => connected,
            Err(refusal) => {
                door.refuse(&mut client, &refusal).await;
                record.reason = Some(refusal.reason);
                inner.audit.record(record);
                return;
            }
        };
        let bindings = match (&target.forward, &inner.secrets) {
            (None, Some((secrets, _))) => secrets.for_host(&target.host, target.port),
            _ => Vec::new(),
        };
        if !bindings.is_empty() {
            record.address = Some(address.to_string());
            match self
                .intercept(client, server, door, &target, &bindings, &rest)
                .await
            {
                Intercepted::Through { out, back, cut } => {
                    record.verdict = Verdict::Allowed;
                    record.bytes_out += out;
                    record.bytes_in += back;
                    record.reason = cut;
                }
                Intercepted::Refused(why) => record.reason = Some(why),
            }
            inner.audit.record(record);
            return;
        }
        // The head forwarded and whatever followed it count against the bound as the
        // rest of the stream does: nothing of them is sent past it.
        let opening = target.forward.as_ref().map_or(0, Vec::len) + rest.len();
        if let Err(cut) = inner.charge(opening as u64) {
            drop(server);
            door.refuse(
                &mut client,
                &Refusal {
                    status: "403 Forbidden",
                    reason: cut.clone(),
                },
            )
            .await;
            record.reason = Some(cut);
            inner.audit.record(record);
            return;
        }
        record.verdict = Verdict::Allowed;
        record.address = Some(address.to_string());
        record.bytes_out = opening as u64;
        let opened = match &target.forward {
            None => client.write_all(door.established()).await,
            Some(forward) => server.write_all(forward).await,
        };
        if opened.is_ok() && !rest.is_empty() {
            let _ = server.write_all(&rest).await;
        }
        if opened.is_ok() {
            let (out, back, cut) = self.pump(&mut client, &mut server).await;
            record.bytes_out += out;
            record.bytes_in += back;
            record.reason = cut;
        }
        inner.audit.record(record);
    }

    /// A `CONNECT` to a host secrets are bound to: TLS with the sandbox (as `host`, the
    /// sandbox's CA), its first request's head read and checked to be for the target
    /// ([`rewrite_head`](crate::secrets::rewrite_head)), TLS with the real host, then
    /// that head with the values in place of the placeholders and `Connection: close`,
    /// then the rest both ways. A request for another host is answered `421` and the
    /// host gets nothing; so when the real host cannot be had over verified TLS (`502`,
    /// saying why).
    async fn intercept<S>(
        &self,
        mut client: S,
        server: TcpStream,
        door: Door,
        target: &Target,
        bindings: &[(String, String)],
        early: &[u8],
    ) -> Intercepted
    where
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let cut = |why: Option<String>| Intercepted::Through {
            out: 0,
            back: 0,
            cut: why,
        };
        let Some((_, interceptor)) = &self.inner.secrets else {
            return cut(None);
        };
        let host = target.host.as_str();
        if client.write_all(door.established()).await.is_err() {
            return cut(None);
        }
        if !early.is_empty() {
            return cut(Some("bytes sent before the tunnel was open".into()));
        }
        let limits = &self.inner.limits;
        let accepted = tokio::time::timeout(limits.head_timeout, interceptor.accept(client, host))
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "TLS with the sandbox for {host}: no handshake in time"
                ))
            });
        let mut client = match accepted {
            Ok(client) => client,
            Err(why) => return cut(Some(why)),
        };
        let head = tokio::time::timeout(limits.head_timeout, read_head(&mut client)).await;
        let (head, rest) = match head {
            Ok(Ok(read)) => read,
            Ok(Err(why)) => return cut(Some(why)),
            Err(_) => return cut(Some("no request in the tunnel in time".into())),
        };
        // Checked before anything goes to the host: a request for another site gets
        // neither the values nor a connection that carries them.
        let head = match crate::secrets::rewrite_head(&head, host, target.port, bindings) {
            Ok(head) => head,
            Err(misdirected) => {
                refuse(&mut client, misdirected.status, &misdirected.reason).await;
                return Intercepted::Refused(misdirected.reason);
            }
        };
        let connected =
            tokio::time::timeout(limits.connect_timeout, interceptor.connect(server, host))
                .await
                .unwrap_or_else(|_| Err(format!("TLS with {host}: no handshake in time")));
        let mut server = match connected {
            Ok(server) => server,
            Err(why) => {
                // The sandbox's TLS is up already: it is told in its own request's
                // answer, which a client shows, rather than by a connection that ends.
                let body = format!("{why}: the request was not sent to {host}");
                answer(&mut client, "502 Bad Gateway", UPSTREAM_TLS_FAILED, &body).await;
                return Intercepted::Refused(why);
            }
        };
        let sent = (head.len() + rest.len()) as u64;
        if let Err(why) = self.inner.charge(sent) {
            return cut(Some(why));
        }
        if server.write_all(&head).await.is_err() || server.write_all(&rest).await.is_err() {
            return Intercepted::Through {
                out: sent,
                back: 0,
                cut: None,
            };
        }
        let (out, back, cut) = self.pump(&mut client, &mut server).await;
        Intercepted::Through {
            out: sent + out,
            back,
            cut,
        }
    }

    /// Checks `target` against the rules, resolves it, and connects to the first
    /// address that is not forbidden.
    async fn connect(&self, target: &Target) -> Result<(TcpStream, SocketAddr), Refusal> {
        let inner = &self.inner;
        let refused = |reason: String| Refusal {
            status: "403 Forbidden",
            reason,
        };
        inner
            .rules
            .check(&target.host, target.port)
            .map_err(refused)?;
        if let Some(bound) = inner.limits.egress_bytes
            && inner.audit.bytes() >= bound
        {
            return Err(refused(format!(
                "limits.egressBytes ({bound} bytes) reached: no more connections"
            )));
        }
        let work = async {
            let addresses = match target.host.parse::<IpAddr>() {
                Ok(ip) => vec![SocketAddr::new(ip, target.port)],
                Err(_) => inner
                    .resolver
                    .resolve(&target.host, target.port)
                    .await
                    .map_err(|e| Refusal {
                        status: "502 Bad Gateway",
                        reason: format!("{}: cannot resolve: {e}", target.host),
                    })?,
            };
            let mut why = None;
            let mut last_error = None;
            for address in addresses {
                let bad = forbidden(address.ip())
                    .map(str::to_string)
                    .or_else(|| own_address(address.ip()));
                if let Some(bad) = bad {
                    why.get_or_insert_with(|| {
                        format!(
                            "{} resolves to {}, {bad}: never connected to",
                            target.host,
                            address.ip()
                        )
                    });
                    continue;
                }
                match TcpStream::connect(address).await {
                    Ok(stream) => {
                        let _ = stream.set_nodelay(true);
                        return Ok((stream, address));
                    }
                    Err(e) => last_error = Some(format!("{address}: {e}")),
                }
            }
            Err(match (last_error, why) {
                (Some(e), _) => Refusal {
                    status: "502 Bad Gateway",
                    reason: format!("{}: cannot connect: {e}", target.host),
                },
                (None, Some(why)) => refused(why),
                (None, None) => Refusal {
                    status: "502 Bad Gateway",
                    reason: format!("{}: no address", target.host),
                },
            })
        };
        tokio::time::timeout(inner.limits.connect_timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(Refusal {
                    status: "504 Gateway Timeout",
                    reason: format!("{}:{}: no connection in time", target.host, target.port),
                })
            })
    }

    /// Copies both ways until both sides are done, the proxy stops, the byte bound is
    /// reached, or no byte went either way for `idle_timeout`: (bytes out, bytes back,
    /// why it was cut).
    async fn pump<C, S>(&self, client: &mut C, server: &mut S) -> (u64, u64, Option<String>)
    where
        C: AsyncRead + AsyncWrite + Unpin + Send,
        S: AsyncRead + AsyncWrite + Unpin + Send,
    {
        let (mut client_read, mut client_write) = tokio::io::split(client);
        let (mut server_read, mut server_write) = tokio::io::split(server);
        let cut = CancellationToken::new();
        let started = Instant::now();
        let activity = Activity {
            started,
            last_ms: AtomicU64::new(0),
        };
        let (out_bytes, back_bytes) = (AtomicU64::new(0), AtomicU64::new(0));
        let out = copy(
            &self.inner,
            &mut client_read,
            &mut server_write,
            &cut,
            &out_bytes,
            &activity,
        );
        let back = copy(
            &self.inner,
            &mut server_read,
            &mut client_write,
            &cut,
            &back_bytes,
            &activity,
        );
        let idle = self.inner.limits.idle_timeout;
        let reason = tokio::select! {
            (out, back) = async { tokio::join!(out, back) } => out.or(back),
            () = self.inner.stop.cancelled() => Some("the sandbox ended".into()),
            () = activity.quiet_for(idle) => Some(format!(
                "no bytes either way for {} s (the idle timeout): the connection was closed",
                idle.as_secs_f64()
            )),
        };
        (
            out_bytes.load(Ordering::Relaxed),
            back_bytes.load(Ordering::Relaxed),
            reason,
        )
    }
}

impl Inner {
    /// Counts `n` bytes about to go through against `limits.egressBytes`: `Err` with
    /// the reason when they would pass it (then they are not sent).
    fn charge(&self, n: u64) -> Result<(), String> {
        let total = self.audit.bytes.fetch_add(n, Ordering::Relaxed) + n;
        match self.limits.egress_bytes {
            Some(bound) if total > bound => Err(format!(
                "limits.egressBytes ({bound} bytes) reached: the connection was cut"
            )),
            _ => Ok(()),
        }
    }
}

/// When a connection last carried a byte, either way.
struct Activity {
    started: Instant,
    /// Milliseconds from `started` to the last byte read.
    last_ms: AtomicU64,
}

impl Activity {
    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_ms.store(now, Ordering::Relaxed);
    }

    /// Ends once no byte went either way for `limit`.
    async fn quiet_for(&self, limit: Duration) {
        loop {
            let last = self.started + Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let quiet = last.elapsed();
            if quiet >= limit {
                return;
            }
            tokio::time::sleep(limit - quiet).await;
        }
    }
}

/// Copies `from` to `to` until end of file (then shuts `to` down), an error, or the
/// bound, adding each byte copied to `copied`: why it was cut.
async fn copy<R, W>(
    inner: &Inner,
    from: &mut R,
    to: &mut W,
    cut: &CancellationToken,
    copied: &AtomicU64,
    activity: &Activity,
) -> Option<String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            () = cut.cancelled() => return None,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return None;
                }
                Ok(n) => n,
            },
        };
        activity.touch();
        if let Err(why) = inner.charge(n as u64) {
            cut.cancel();
            return Some(why);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            cut.cancel();
            return None;
        }
        copied.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// How a client asked: an HTTP request (`CONNECT` or an absolute `http://` URL) or
/// SOCKS5 (`CONNECT`, no authentication), told apart by the first byte (SOCKS5's is 5,
/// which no HTTP method starts with). Each answers in its own words; what is allowed
/// is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    Http,
    Socks,
}

/// SOCKS5's reply codes (RFC 1928 §6).
const SOCKS_FAILURE: u8 = 1;
const SOCKS_NOT_ALLOWED: u8 = 2;
const SOCKS_HOST_UNREACHABLE: u8 = 4;
const SOCKS_COMMAND: u8 = 7;
const SOCKS_ADDRESS_TYPE: u8 = 8;

impl Door {
    /// What a client is told when its tunnel is open.
    fn established(self) -> &'static [u8] {
        match self {
            Door::Http => b"HTTP/1.1 200 Connection established\r\n\r\n",
            Door::Socks => &[5, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        }
    }

    /// Refuses, then closes: HTTP says the status and the reason; SOCKS5 has only a
    /// code for it (the reason is in the record).
    async fn refuse<S: AsyncWrite + Unpin>(self, client: &mut S, refusal: &Refusal) {
        match self {
            Door::Http => refuse(client, refusal.status, &refusal.reason).await,
            Door::Socks => {
                if refusal.status.starts_with("406") {
                    // Answered in the greeting already.
                    let _ = client.shutdown().await;
                    return;
                }
                let code = match refusal.status.split(' ').next() {
                    Some("403") => SOCKS_NOT_ALLOWED,
                    Some("502" | "504") => SOCKS_HOST_UNREACHABLE,
                    Some("405") => SOCKS_COMMAND,
                    Some("415") => SOCKS_ADDRESS_TYPE,
                    _ => SOCKS_FAILURE,
                };
                let _ = client.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]).await;
                let _ = client.shutdown().await;
            }
        }
    }
}

fn bad_request(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: "400 Bad Request",
        reason: reason.into(),
    }
}

/// What a client asks for, by either door, within `limit`: (the door, the target,
/// bytes read past the request), or how to refuse it (at the door it came to).
async fn read_opening<S: AsyncRead + AsyncWrite + Unpin>(
    client: &mut S,
    limit: Duration,
) -> Result<(Door, Target, Vec<u8>), (Door, Refusal)> {
    let deadline = tokio::time::Instant::now() + limit;
    let late = |door: Door| {
        (
            door,
            Refusal {
                status: "408 Request Timeout",
                reason: "no request head in time".into(),
            },
        )
    };
    let mut first = [0u8; 1];
    let n = tokio::time::timeout_at(deadline, client.read(&mut first))
        .await
        .map_err(|_| late(Door::Http))?
        .map_err(|e| (Door::Http, bad_request(format!("reading the request: {e}"))))?;
    if n == 0 {
        return Err((
            Door::Http,
            bad_request("the client closed before a whole request head"),
        ));
    }
    if first[0] == 5 {
        let target = tokio::time::timeout_at(deadline, read_socks(client))
            .await
            .map_err(|_| late(Door::Socks))?
            .map_err(|refusal| (Door::Socks, refusal))?;
        return Ok((Door::Socks, target, Vec::new()));
    }
    let (head, rest) = tokio::time::timeout_at(deadline, read_head_after(client, first.to_vec()))
        .await
        .map_err(|_| late(Door::Http))?
        .map_err(|why| (Door::Http, bad_request(why)))?;
    let target = parse_head(&head).map_err(|why| (Door::Http, bad_request(why)))?;
    Ok((Door::Http, target, rest))
}

/// The rest of a SOCKS5 greeting (its version byte read), the method answered (no
/// authentication), then the request: a `CONNECT` to an IPv4 or IPv6 address or a name.
async fn read_socks<S: AsyncRead + AsyncWrite + Unpin>(client: &mut S) -> Result<Target, Refusal> {
    let io = |e: std::io::Error| bad_request(format!("reading the SOCKS5 request: {e}"));
    let count = client.read_u8().await.map_err(io)?;
    let mut methods = vec![0u8; usize::from(count)];
    client.read_exact(&mut methods).await.map_err(io)?;
    if !methods.contains(&0) {
        // No acceptable method: said in the greeting's own answer (no reply follows).
        let _ = client.write_all(&[5, 0xff]).await;
        return Err(Refusal {
            status: "406 Not Acceptable",
            reason: "SOCKS5 without the no-authentication method".into(),
        });
    }
    client.write_all(&[5, 0]).await.map_err(io)?;
    let mut request = [0u8; 4];
    client.read_exact(&mut request).await.map_err(io)?;
    let [version, command, _, kind] = request;
    if version != 5 {
        return Err(bad_request(format!(
            "a SOCKS5 request of version {version}"
        )));
    }
    if command != 1 {
        return Err(Refusal {
            status: "405 Method Not Allowed",
            reason: format!("SOCKS5 command {command}: only CONNECT is served"),
        });
    }
    let host = match kind {
        1 => {
            let mut v4 = [0u8; 4];
            client.read_exact(&mut v4).await.map_err(io)?;
            std::net::Ipv4Addr::from(v4).to_string()
        }
        4 => {
            let mut v6 = [0u8; 16];
            client.read_exact(&mut v6).await.map_err(io)?;
            std::net::Ipv6Addr::from(v6).to_string()
        }
        3 => {
            let len = client.read_u8().await.map_err(io)?;
            let mut name = vec![0u8; usize::from(len)];
            client.read_exact(&mut name).await.map_err(io)?;
            String::from_utf8(name)
                .ok()
                .filter(|n| {
                    !n.is_empty() && !n.chars().any(|c| c.is_whitespace() || c.is_control())
                })
                .ok_or_else(|| bad_request("a SOCKS5 name that is not a host name"))?
        }
        other => {
            return Err(Refusal {
                status: "415 Unsupported Media Type",
                reason: format!("SOCKS5 address type {other}"),
            });
        }
    };
    let port = client.read_u16().await.map_err(io)?;
    if port == 0 {
        return Err(bad_request("a SOCKS5 request for port 0"));
    }
    Ok(Target {
        host: host.trim_end_matches('.').to_ascii_lowercase(),
        port,
        forward: None,
    })
}

/// Reads up to the end of the request head: (head, bytes read past it).
async fn read_head<S: AsyncRead + Unpin>(client: &mut S) -> Result<(Vec<u8>, Vec<u8>), String> {
    read_head_after(client, Vec::with_capacity(1024)).await
}

/// [`read_head`] when `buf` was read already.
async fn read_head_after<S: AsyncRead + Unpin>(
    client: &mut S,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut chunk = [0u8; 2048];
    loop {
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the client closed before a whole request head".into());
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf[from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = from + end + 4;
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("a request head over {MAX_HEAD} bytes"));
        }
    }
}

/// The target of a request head: CONNECT's `host:port`, or an absolute `http://` URL
/// (then the head to forward, in origin-form, with the URL's `Host`, `Connection:
/// close` and without the proxy's own headers).
fn parse_head(head: &[u8]) -> Result<Target, String> {
    let text =
        std::str::from_utf8(head).map_err(|_| "a request head that is not UTF-8".to_string())?;
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let mut parts = request.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("not an HTTP request line: {:?}", cut(request)));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(format!("{version:?}: the proxy speaks HTTP/1.x"));
    }
    if method == "CONNECT" {
        let (host, port) = split_host_port(target, None)?;
        return Ok(Target {
            host,
            port,
            forward: None,
        });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(format!(
            "{:?}: send CONNECT host:port, or an absolute http:// URL",
            cut(target)
        ));
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let path = if path.starts_with('?') {
        format!("/{path}")
    } else {
        path.to_string()
    };
    if authority.contains('@') {
        return Err("credentials in the URL are not passed on".into());
    }
    let (host, port) = split_host_port(authority, Some(80))?;
    // The Host sent is the URL's (RFC 9112 §3.2.2): a Host of the client's own naming
    // another site behind the allowed host's address (a CDN's) would reach that site.
    let mut forward = format!("{method} {path} {version}\r\nHost: {authority}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        let dropped = [
            "host",
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ];
        if dropped.iter().any(|d| name.eq_ignore_ascii_case(d)) {
            continue;
        }
        forward.push_str(line);
        forward.push_str("\r\n");
    }
    forward.push_str("Connection: close\r\n\r\n");
    Ok(Target {
        host,
        port,
        forward: Some(forward.into_bytes()),
    })
}

/// `host:port`, `[v6]:port`, or a host alone when a default port is given.
pub(crate) fn split_host_port(
    authority: &str,
    default: Option<u16>,
) -> Result<(String, u16), String> {
    let bad = || format!("{:?}: not host:port", cut(authority));
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(bad()),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(bad)?,
        None => default.ok_or_else(bad)?,
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad());
    }
    Ok((host.trim_end_matches('.').to_ascii_lowercase(), port))
}

pub(crate) fn cut(text: &str) -> &str {
    match text.char_indices().nth(200) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// `X-Skillbox-Egress` on a refusal by the rules, the address checks or the bounds.
const REFUSED: &str = "refused";
/// `X-Skillbox-Egress` when a secret's host could not be had over verified TLS.
const UPSTREAM_TLS_FAILED: &str = "upstream-tls-failed";

/// Answers with `status` and `reason` (the body, and `X-Skillbox-Egress: refused`),
/// then closes.
async fn refuse<S: AsyncWrite + Unpin>(client: &mut S, status: &str, reason: &str) {
    answer(client, status, REFUSED, reason).await;
}

/// Answers with `status`, `X-Skillbox-Egress: {kind}` and `reason` as the body, then
/// closes.
async fn answer<S: AsyncWrite + Unpin>(client: &mut S, status: &str, kind: &str, reason: &str) {
    let body = format!("skillbox egress: {reason}\n");
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nX-Skillbox-Egress: {kind}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(answer.as_bytes()).await;
    let _ = client.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_parsed_into_their_target() {
        let t = parse_head(b"CONNECT Files.Example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.forward),
            ("files.example.org", 443, None)
        );
        let t = parse_head(b"CONNECT [2606:4700::1]:8443 HTTP/1.1\r\n\r\n").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("2606:4700::1", 8443));
        let t = parse_head(
            b"GET http://example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\nProxy-Authorization: x\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n",
        )
        .unwrap();
        assert_eq!((t.host.as_str(), t.port), ("example.com", 80));
        assert_eq!(
            String::from_utf8(t.forward.unwrap()).unwrap(),
            "GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        // A Host naming another site is not passed on: the URL's is.
        for head in [
            &b"GET http://Example.com:8080/ HTTP/1.1\r\nHost: other.site\r\n\r\n"[..],
            b"GET http://Example.com:8080/ HTTP/1.1\r\nHOST : other.site\r\nHost: x\r\n\r\n",
            b"GET http://Example.com:8080/ HTTP/1.1\r\n\r\n",
        ] {
            let forward = String::from_utf8(parse_head(head).unwrap().forward.unwrap()).unwrap();
            assert_eq!(
                forward,
                "GET / HTTP/1.1\r\nHost: Example.com:8080\r\nConnection: close\r\n\r\n"
            );
        }
        let t = parse_head(b"POST http://example.com:8080?q HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(t.port, 8080);
        assert!(
            String::from_utf8(t.forward.unwrap())
                .unwrap()
                .starts_with("POST /?q HTTP/1.0\r\n")
        );
    }

    #[test]
    fn bad_heads_say_what_is_wrong() {
        for (head, said) in [
            (&b"GET /local HTTP/1.1\r\n\r\n"[..], "absolute http:// URL"),
            (
                b"GET https://example.com/ HTTP/1.1\r\n\r\n",
                "absolute http:// URL",
            ),
            (b"CONNECT example.com HTTP/1.1\r\n\r\n", "not host:port"),
            (b"CONNECT example.com:0 HTTP/1.1\r\n\r\n", "not host:port"),
            (b"CONNECT :443 HTTP/1.1\r\n\r\n", "not host:port"),
            (
                b"GET http://u:p@example.com/ HTTP/1.1\r\n\r\n",
                "credentials",
            ),
            (b"CONNECT example.com:443 HTTP/2\r\n\r\n", "HTTP/1.x"),
            (b"hello\r\n\r\n", "not an HTTP request line"),
            (b"\xff\xfe\r\n\r\n", "not UTF-8"),
        ] {
            let err = parse_head(head).unwrap_err();
            assert!(
                err.contains(said),
                "{:?}: {err}",
                String::from_utf8_lossy(head)
            );
        }
    }
}
