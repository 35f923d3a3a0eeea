//! Secrets added at egress (DESIGN.md §3.8): the sandbox holds a placeholder; for a
//! `CONNECT` to one of a secret's hosts the proxy terminates TLS with a certificate of
//! the sandbox's own CA (which the sandbox trusts), opens TLS to the real host
//! (verified against the public roots), and replaces the placeholder with the value in
//! the request's headers. Nowhere else is the value sent, and it is never logged.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use skillbox_protocol::SecretSpec;

use crate::rules::Rule;

/// Most secrets one run may have.
pub const MAX_SECRETS: usize = 32;
/// Leaf certificates one sandbox's interceptor keeps.
const MAX_CACHED_LEAVES: usize = 256;
/// The longest secret value.
pub const MAX_SECRET_BYTES: usize = 8 * 1024;

/// One secret, checked: its name, its value (never printed), its hosts.
struct Secret {
    name: String,
    value: String,
    hosts: Vec<Rule>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("value", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// A run's secrets, checked once; each error names the secret and the field. No
/// placeholder is drawn yet: [`Secrets::with_placeholders`] does, for a sandbox.
#[derive(Debug, Default)]
pub struct Secrets {
    list: Vec<Secret>,
}

/// A sandbox's secrets, each with the placeholder the sandbox holds for it: what the
/// proxy puts in its place, and for which hosts.
#[derive(Debug, Default)]
pub struct Substitutions {
    list: Vec<(String, Secret)>,
}

impl Secrets {
    pub fn new(specs: &BTreeMap<String, SecretSpec>) -> Result<Secrets, String> {
        if specs.len() > MAX_SECRETS {
            return Err(format!(
                "secrets: {} of them, at most {MAX_SECRETS}",
                specs.len()
            ));
        }
        let mut list = Vec::new();
        for (name, spec) in specs {
            let valid_name = !name.is_empty()
                && name.len() <= 64
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            if !valid_name {
                return Err(format!(
                    "secrets.{name}: the name of an environment variable (A-Z, 0-9, _; not starting with a digit)"
                ));
            }
            if spec.value.is_empty() || spec.value.len() > MAX_SECRET_BYTES {
                return Err(format!(
                    "secrets.{name}.value: 1 to {MAX_SECRET_BYTES} bytes"
                ));
            }
            if spec.value.bytes().any(|b| b.is_ascii_control()) {
                return Err(format!(
                    "secrets.{name}.value: control characters cannot go in a header"
                ));
            }
            if spec.hosts.is_empty() {
                return Err(format!(
                    "secrets.{name}.hosts: at least one host it is sent to"
                ));
            }
            let hosts = spec
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| {
                    Rule::parse_secret_host(h)
                        .map_err(|why| format!("secrets.{name}.hosts[{i}]: {h:?}: {why}"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            list.push(Secret {
                name: name.clone(),
                value: spec.value.clone(),
                hosts,
            });
        }
        Ok(Secrets { list })
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Each secret with a placeholder of its own, from 16 bytes `fill` draws (the
    /// system's: `skillbox_protocol::random::fill`). A source that fails is the error, naming the
    /// secret: a placeholder that is not random could be guessed, or be another's.
    pub fn with_placeholders(
        self,
        mut fill: impl FnMut(&mut [u8]) -> io::Result<()>,
    ) -> Result<Substitutions, String> {
        let list = self
            .list
            .into_iter()
            .map(|secret| {
                let mut bytes = [0u8; PLACEHOLDER_BYTES];
                fill(&mut bytes).map_err(|e| format!("a placeholder for {}: {e}", secret.name))?;
                Ok((placeholder(bytes), secret))
            })
            .collect::<Result<_, String>>()?;
        Ok(Substitutions { list })
    }
}

impl Substitutions {
    /// The sandbox's side: each secret's name and its placeholder.
    pub fn env(&self) -> Vec<(String, String)> {
        self.list
            .iter()
            .map(|(placeholder, s)| (s.name.clone(), placeholder.clone()))
            .collect()
    }

    /// (placeholder, value) of every secret bound to `host:port`.
    pub(crate) fn for_host(&self, host: &str, port: u16) -> Vec<(String, String)> {
        self.list
            .iter()
            .filter(|(_, s)| s.hosts.iter().any(|r| r.matches(host, port)))
            .map(|(placeholder, s)| (placeholder.clone(), s.value.clone()))
            .collect()
    }
}

/// Random bytes in a placeholder.
const PLACEHOLDER_BYTES: usize = 16;

/// What the sandbox sees instead of the value: `skillbox-secret-` and `random` in hex.
fn placeholder(random: [u8; PLACEHOLDER_BYTES]) -> String {
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    format!("skillbox-secret-{hex}")
}

/// The sandbox's CA and the TLS both ways for the hosts of its secrets.
pub struct Interceptor {
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_pem: String,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstream: Arc<rustls::ClientConfig>,
}

impl fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Interceptor {
    /// A fresh CA for one sandbox; upstream servers are verified against the public
    /// web roots and `extra_roots`.
    pub fn new(extra_roots: &[CertificateDer<'static>]) -> Result<Interceptor, String> {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "skillbox egress (this sandbox only)");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().map_err(|e| format!("egress CA key: {e}"))?;
        let ca =
            CertifiedIssuer::self_signed(params, key).map_err(|e| format!("egress CA: {e}"))?;
        let ca_pem = ca.pem();
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for root in extra_roots {
            roots
                .add(root.clone())
                .map_err(|e| format!("egress upstream root: {e}"))?;
        }
        let upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Interceptor {
            ca,
            ca_pem,
            leaves: Mutex::default(),
            upstream: Arc::new(upstream),
        })
    }

    /// The CA certificate the sandbox trusts (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The TLS server side for `host`: a certificate for it signed by the CA.
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, String> {
        if let Some(config) = self.leaves.lock().ok().and_then(|l| l.get(host).cloned()) {
            return Ok(config);
        }
        let key = KeyPair::generate().map_err(|e| format!("leaf key: {e}"))?;
        let params = CertificateParams::new(vec![host.to_string()])
            .map_err(|e| format!("leaf for {host}: {e}"))?;
        let leaf = params
            .signed_by(&key, &self.ca)
            .map_err(|e| format!("leaf for {host}: {e}"))?;
        let chain = vec![leaf.der().clone(), self.ca.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| format!("leaf for {host}: {e}"))?;
        let config = Arc::new(config);
        // A wildcard host lets the sandbox name any number of hosts: the cache stays
        // bounded, and a host past it gets a fresh leaf each time.
        if let Ok(mut leaves) = self.leaves.lock()
            && leaves.len() < MAX_CACHED_LEAVES
        {
            leaves.insert(host.to_string(), config.clone());
        }
        Ok(config)
    }

    /// TLS with the sandbox on `client`, as `host` (a certificate the sandbox's CA
    /// signed).
    pub(crate) async fn accept<C>(
        &self,
        client: C,
        host: &str,
    ) -> Result<tokio_rustls::server::TlsStream<C>, String>
    where
        C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config(host)?);
        acceptor
            .accept(client)
            .await
            .map_err(|e| format!("TLS with the sandbox for {host}: {e}"))
    }

    /// TLS with the real `host` on `server`, its certificate verified against the
    /// public web roots and the extra ones.
    pub(crate) async fn connect<S>(
        &self,
        server: S,
        host: &str,
    ) -> Result<tokio_rustls::client::TlsStream<S>, String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let name = ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
        let connector = tokio_rustls::TlsConnector::from(self.upstream.clone());
        connector
            .connect(name, server)
            .await
            .map_err(|e| format!("TLS with {host}: {e}"))
    }
}

/// Why a request head in a tunnel to a secret's host is not sent: the status the
/// sandbox is answered with, and the reason (answered and recorded).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Misdirected {
    pub(crate) status: &'static str,
    pub(crate) reason: String,
}

fn bad_head(reason: impl Into<String>) -> Misdirected {
    Misdirected {
        status: "400 Bad Request",
        reason: reason.into(),
    }
}

/// `head`, the first request in a tunnel to `host:port` (the `CONNECT`'s), with every
/// placeholder in its header lines but `Host` replaced by its value, and `Connection:
/// close` (one request a connection: a later request on it goes without the values).
///
/// The request must be for the tunnel's own host: its target in origin-form (`/…`),
/// and exactly one `Host`, equal to `host:port` (`:443` may be left out). A bound host
/// that serves other sites by their `Host` or an absolute URL (a CDN's, a gateway's)
/// would otherwise carry the value to a site it is not bound to. The request line and
/// `Host` never get a value: a server logs and routes by them.
pub(crate) fn rewrite_head(
    head: &[u8],
    host: &str,
    port: u16,
    bindings: &[(String, String)],
) -> Result<Vec<u8>, Misdirected> {
    let text =
        std::str::from_utf8(head).map_err(|_| bad_head("a request head that is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let request = lines.next().unwrap_or_default();
    let parts: Vec<&str> = request.split(' ').collect();
    let [_, target, version] = parts[..] else {
        return Err(bad_head(format!(
            "not an HTTP request line: {:?}",
            crate::wire::cut(request)
        )));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(bad_head(format!("{version:?}: the tunnel speaks HTTP/1.x")));
    }
    let tunnel = if port == 443 {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    if !target.starts_with('/') {
        return Err(Misdirected {
            status: "421 Misdirected Request",
            reason: format!(
                "{:?}: a request in the tunnel to {tunnel} names a path (/…), never a URL, and has Host: {tunnel}",
                crate::wire::cut(target)
            ),
        });
    }
    let mut out = format!("{request}\r\n");
    let mut hosts = Vec::new();
    for line in lines.filter(|l| !l.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Err(bad_head(format!(
                "a header line without a colon: {:?}",
                crate::wire::cut(line)
            )));
        };
        // A name of token characters only: no folded line, no space before the colon,
        // so the host reads the same headers as checked here (RFC 9112 §5.1).
        let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        if name.is_empty() || !name.bytes().all(token) {
            return Err(bad_head(format!(
                "not a header name: {:?}",
                crate::wire::cut(name)
            )));
        }
        if ["connection", "keep-alive", "proxy-connection"]
            .iter()
            .any(|d| name.eq_ignore_ascii_case(d))
        {
            continue;
        }
        if name.eq_ignore_ascii_case("host") {
            hosts.push(value.trim_matches([' ', '\t']));
            out.push_str(line);
            out.push_str("\r\n");
            continue;
        }
        let mut line = line.to_string();
        for (placeholder, value) in bindings {
            line = line.replace(placeholder.as_str(), value);
        }
        out.push_str(&line);
        out.push_str("\r\n");
    }
    let named = match hosts[..] {
        [one] => crate::wire::split_host_port(one, Some(443)).ok(),
        _ => None,
    };
    if named
        .as_ref()
        .is_none_or(|(h, p)| (h.as_str(), *p) != (host, port))
    {
        let said = match hosts[..] {
            [] => "no Host".to_string(),
            [one] => format!("Host {:?}", crate::wire::cut(one)),
            _ => format!("{} Host headers", hosts.len()),
        };
        return Err(Misdirected {
            status: "421 Misdirected Request",
            reason: format!("{said}: a request in the tunnel to {tunnel} has Host: {tunnel}"),
        });
    }
    out.push_str("Connection: close\r\n\r\n");
    Ok(out.into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: &str, hosts: &[&str]) -> SecretSpec {
        SecretSpec {
            value: value.into(),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
        }
    }

    #[test]
    fn secrets_are_checked_and_bound_to_their_hosts() {
        let secrets = Secrets::new(&BTreeMap::from([
            ("API_KEY".to_string(), spec("s3cret", &["api.example.com"])),
            ("OTHER".to_string(), spec("x", &["*.other.example:8443"])),
        ]))
        .unwrap();
        assert!(!format!("{secrets:?}").contains("s3cret"));
        let secrets = secrets
            .with_placeholders(skillbox_protocol::random::fill)
            .unwrap();
        let env = secrets.env();
        assert_eq!(env.len(), 2);
        assert!(
            env.iter()
                .all(|(_, p)| p.starts_with("skillbox-secret-") && p.len() == 48)
        );
        assert_ne!(env[0].1, env[1].1);
        let bound = secrets.for_host("api.example.com", 443);
        assert_eq!(bound.len(), 1);
        assert_eq!(bound[0].1, "s3cret");
        assert!(
            secrets.for_host("api.example.com", 80).is_empty(),
            "443 only without a port"
        );
        assert!(secrets.for_host("evil.example", 443).is_empty());
        assert_eq!(secrets.for_host("a.other.example", 8443).len(), 1);
        assert!(!format!("{secrets:?}").contains("s3cret"));

        for (name, value, hosts, said) in [
            (
                "lower",
                "v",
                vec!["a.example"],
                "the name of an environment variable",
            ),
            (
                "1X",
                "v",
                vec!["a.example"],
                "the name of an environment variable",
            ),
            ("K", "", vec!["a.example"], "secrets.K.value"),
            (
                "K",
                "a\r\nX-Evil: 1",
                vec!["a.example"],
                "control characters",
            ),
            ("K", "v", vec![], "secrets.K.hosts"),
            ("K", "v", vec!["https://a.example"], "secrets.K.hosts[0]"),
        ] {
            let err = Secrets::new(&BTreeMap::from([(name.to_string(), spec(value, &hosts))]))
                .unwrap_err();
            assert!(err.contains(said), "{name} {value:?}: {err}");
            assert!(!err.contains("a\r\n"), "{err}");
        }
    }

    #[test]
    fn placeholders_are_the_random_bytes_in_hex_or_an_error() {
        let bytes: [u8; PLACEHOLDER_BYTES] = std::array::from_fn(|i| (i * 17) as u8);
        assert_eq!(
            placeholder(bytes),
            "skillbox-secret-00112233445566778899aabbccddeeff"
        );
        let specs = BTreeMap::from([
            ("A".to_string(), spec("a", &["a.example"])),
            ("B".to_string(), spec("b", &["b.example"])),
        ]);
        // Each secret gets bytes of its own, in the order of their names.
        let mut next = 0u8;
        let counting = |buf: &mut [u8]| {
            next += 1;
            buf.fill(next);
            Ok(())
        };
        let placed = Secrets::new(&specs)
            .unwrap()
            .with_placeholders(counting)
            .unwrap();
        assert_eq!(
            placed.env(),
            vec![
                (
                    "A".to_string(),
                    format!("skillbox-secret-{}", "01".repeat(16))
                ),
                (
                    "B".to_string(),
                    format!("skillbox-secret-{}", "02".repeat(16))
                ),
            ]
        );
        // A source that fails is the error, naming the secret and the failure: no
        // placeholder of zeros (one every sandbox would share) stands in.
        let mut calls = 0;
        let failing = |_: &mut [u8]| {
            calls += 1;
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                "/dev/urandom: No such file or directory",
            ))
        };
        let err = Secrets::new(&specs)
            .unwrap()
            .with_placeholders(failing)
            .unwrap_err();
        assert_eq!(
            err,
            "a placeholder for A: /dev/urandom: No such file or directory"
        );
        assert_eq!(calls, 1, "no placeholder after the first failure");
        // The system's source: two draws differ.
        let (mut one, mut two) = ([0u8; 16], [0u8; 16]);
        skillbox_protocol::random::fill(&mut one).unwrap();
        skillbox_protocol::random::fill(&mut two).unwrap();
        assert_ne!(one, two);
    }

    #[test]
    fn heads_get_values_in_headers_only_and_close() {
        let bindings = vec![("skillbox-secret-ab".to_string(), "REAL".to_string())];
        let head = b"GET /skillbox-secret-ab HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer skillbox-secret-ab\r\nConnection: keep-alive\r\n\r\n";
        let out = String::from_utf8(rewrite_head(head, "api.example.com", 443, &bindings).unwrap())
            .unwrap();
        assert_eq!(
            out,
            "GET /skillbox-secret-ab HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer skillbox-secret-ab\r\n"
                .replace("Bearer skillbox-secret-ab", "Bearer REAL")
                + "Connection: close\r\n\r\n"
        );
        // The tunnel's host in the forms a client writes it.
        for (host, port, named) in [
            ("api.example.com", 443, "API.example.com:443"),
            ("api.example.com", 443, "api.example.com."),
            ("api.example.com", 8443, "api.example.com:8443"),
            ("2001:db8::1", 443, "[2001:db8::1]"),
        ] {
            let head = format!(
                "POST /v1 HTTP/1.1\r\nhost:\t{named} \r\nX-Key: skillbox-secret-ab\r\n\r\n"
            );
            let out = rewrite_head(head.as_bytes(), host, port, &bindings).unwrap();
            assert!(
                String::from_utf8(out).unwrap().contains("X-Key: REAL\r\n"),
                "{named}"
            );
        }
        // A Host that is the tunnel's and holds a placeholder (a wildcard binding) keeps
        // the placeholder: Host never gets a value.
        let placeholder_host = "skillbox-secret-ab.api.example.com";
        let head = format!("GET / HTTP/1.1\r\nHost: {placeholder_host}\r\n\r\n");
        let out = String::from_utf8(
            rewrite_head(head.as_bytes(), placeholder_host, 443, &bindings).unwrap(),
        )
        .unwrap();
        assert!(!out.contains("REAL"), "{out}");
    }

    /// A request in a tunnel to a secret's host that names another site, by its URL or
    /// its `Host`, or that a host could read otherwise than checked here, is refused:
    /// the value goes to no site the secret is not bound to.
    #[test]
    fn heads_for_another_host_are_refused() {
        let bindings = vec![("skillbox-secret-ab".to_string(), "REAL".to_string())];
        for (head, status, said) in [
            (
                "GET https://evil.test/C HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer skillbox-secret-ab\r\n\r\n",
                "421",
                "\"https://evil.test/C\": a request in the tunnel to api.example.com names a path (/…), never a URL",
            ),
            (
                "GET https://api.example.com/C HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "421",
                "never a URL",
            ),
            (
                "OPTIONS * HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "421",
                "never a URL",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: evil.test\r\nAuthorization: Bearer skillbox-secret-ab\r\n\r\n",
                "421",
                "Host \"evil.test\": a request in the tunnel to api.example.com has Host: api.example.com",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: skillbox-secret-ab.evil.test\r\n\r\n",
                "421",
                "Host \"skillbox-secret-ab.evil.test\"",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: api.example.com:8443\r\n\r\n",
                "421",
                "has Host: api.example.com",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: user@api.example.com\r\n\r\n",
                "421",
                "has Host",
            ),
            (
                "GET /C HTTP/1.1\r\nX-Key: skillbox-secret-ab\r\n\r\n",
                "421",
                "no Host",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: api.example.com\r\nHost: evil.test\r\n\r\n",
                "421",
                "2 Host headers",
            ),
            (
                "GET /C HTTP/1.1\r\nHost : evil.test\r\nHost: api.example.com\r\n\r\n",
                "400",
                "not a header name",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: api.example.com\r\n evil.test\r\n\r\n",
                "400",
                "without a colon",
            ),
            (
                "GET /C HTTP/1.1\r\nHost: api.example.com\r\nno colon\r\n\r\n",
                "400",
                "without a colon",
            ),
            (
                "GET /C HTTP/2\r\nHost: api.example.com\r\n\r\n",
                "400",
                "HTTP/1.x",
            ),
            (
                "GET  /C HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
                "400",
                "not an HTTP request line",
            ),
        ] {
            let err = rewrite_head(head.as_bytes(), "api.example.com", 443, &bindings).unwrap_err();
            assert!(err.status.starts_with(status), "{head:?}: {err:?}");
            assert!(err.reason.contains(said), "{head:?}: {err:?}");
            assert!(!err.reason.contains("REAL"), "{err:?}");
        }
        // Another port than the tunnel's.
        let err = rewrite_head(
            b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
            "api.example.com",
            8443,
            &bindings,
        )
        .unwrap_err();
        assert!(
            err.reason.contains("has Host: api.example.com:8443"),
            "{err:?}"
        );
    }

    #[test]
    fn the_ca_signs_leaves_for_hosts() {
        let interceptor = Interceptor::new(&[]).unwrap();
        assert!(
            interceptor
                .ca_pem()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        assert!(interceptor.server_config("api.example.com").is_ok());
        assert!(interceptor.server_config("api.example.com").is_ok());
    }
}
