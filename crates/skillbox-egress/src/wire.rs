//! The proxy's wire: what a client's opening bytes ask for, by either door (an HTTP
//! request head, `CONNECT host:port` or an absolute `http://` URL; or a SOCKS5
//! greeting and `CONNECT`), and how a refusal is said at each. Parsing only: generic
//! over any byte stream (an in-memory one in tests), nothing here connects, resolves or
//! judges; the proxy ([`crate::proxy`]) decides what is allowed.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest request head the proxy reads (request line and headers).
pub(crate) const MAX_HEAD: usize = 16 * 1024;

/// What the client asked for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// `None` for CONNECT; else the request head to send upstream (origin-form).
    pub(crate) forward: Option<Vec<u8>>,
}

/// A refusal: its status line and the reason sent and recorded.
pub(crate) struct Refusal {
    pub(crate) status: &'static str,
    pub(crate) reason: String,
}

/// How a client asked: an HTTP request (`CONNECT` or an absolute `http://` URL) or
/// SOCKS5 (`CONNECT`, no authentication), told apart by the first byte (SOCKS5's is 5,
/// which no HTTP method starts with). Each answers in its own words; what is allowed
/// is the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
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
    pub(crate) fn established(self) -> &'static [u8] {
        match self {
            Door::Http => b"HTTP/1.1 200 Connection established\r\n\r\n",
            Door::Socks => &[5, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        }
    }

    /// Refuses, then closes: HTTP says the status and the reason; SOCKS5 has only a
    /// code for it (the reason is in the record).
    pub(crate) async fn refuse<S: AsyncWrite + Unpin>(self, client: &mut S, refusal: &Refusal) {
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

pub(crate) fn bad_request(reason: impl Into<String>) -> Refusal {
    Refusal {
        status: "400 Bad Request",
        reason: reason.into(),
    }
}

/// What a client asks for, by either door, within `limit`: (the door, the target,
/// bytes read past the request), or how to refuse it (at the door it came to).
pub(crate) async fn read_opening<S: AsyncRead + AsyncWrite + Unpin>(
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
pub(crate) async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
) -> Result<(Vec<u8>, Vec<u8>), String> {
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
pub(crate) const REFUSED: &str = "refused";
/// `X-Skillbox-Egress` when a secret's host could not be had over verified TLS.
pub(crate) const UPSTREAM_TLS_FAILED: &str = "upstream-tls-failed";

/// Answers with `status` and `reason` (the body, and `X-Skillbox-Egress: refused`),
/// then closes.
pub(crate) async fn refuse<S: AsyncWrite + Unpin>(client: &mut S, status: &str, reason: &str) {
    answer(client, status, REFUSED, reason).await;
}

/// Answers with `status`, `X-Skillbox-Egress: {kind}` and `reason` as the body, then
/// closes.
pub(crate) async fn answer<S: AsyncWrite + Unpin>(
    client: &mut S,
    status: &str,
    kind: &str,
    reason: &str,
) {
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

    /// What a client sends first, read over an in-memory stream: the door it came by,
    /// the target, or a refusal; never a hang or a panic on bytes cut short.
    #[tokio::test]
    async fn openings_are_read_from_any_stream() {
        async fn open(bytes: &[u8]) -> Result<(Door, String, u16), (Door, &'static str)> {
            let (mut client, mut proxy) = tokio::io::duplex(64 * 1024);
            client.write_all(bytes).await.unwrap();
            client.shutdown().await.unwrap();
            read_opening(&mut proxy, Duration::from_secs(5))
                .await
                .map(|(door, t, _)| (door, t.host, t.port))
                .map_err(|(door, r)| (door, r.status))
        }
        let mut socks = vec![5, 1, 0, 5, 1, 0, 3, 11];
        socks.extend_from_slice(b"Example.ORG");
        socks.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(
            open(&socks).await,
            Ok((Door::Socks, "example.org".into(), 443))
        );
        assert_eq!(
            open(&[5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 1, 0, 80]).await,
            Ok((Door::Socks, "10.0.0.1".into(), 80))
        );
        assert_eq!(
            open(b"CONNECT a.test:22 HTTP/1.1\r\n\r\n").await,
            Ok((Door::Http, "a.test".into(), 22))
        );
        for (bytes, said) in [
            (&[5, 1, 2][..], (Door::Socks, "406 Not Acceptable")),
            (
                &[5, 1, 0, 5, 2, 0, 1],
                (Door::Socks, "405 Method Not Allowed"),
            ),
            (
                &[5, 1, 0, 5, 1, 0, 9],
                (Door::Socks, "415 Unsupported Media Type"),
            ),
            (
                &[5, 1, 0, 5, 1, 0, 1, 10, 0, 0, 1, 0, 0],
                (Door::Socks, "400 Bad Request"),
            ),
            (
                &[5, 1, 0, 5, 1, 0, 3, 200, 1],
                (Door::Socks, "400 Bad Request"),
            ),
            (&[5], (Door::Socks, "400 Bad Request")),
            (&[], (Door::Http, "400 Bad Request")),
            (
                b"GET http://a.test/ HTTP/1.1\r\n",
                (Door::Http, "400 Bad Request"),
            ),
        ] {
            assert_eq!(open(bytes).await, Err(said), "{bytes:?}");
        }
    }
}
