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
use crate::wire::{
    Door, Refusal, Target, UPSTREAM_TLS_FAILED, answer, read_head, read_opening, refuse,
};

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
