//! Who may run code here: API keys bound to tenants, and the Host names a loopback
//! server answers to.
//!
//! - **Keys.** A key file holds one `TENANT sha256:HEX` line per key: the hash of a
//!   bearer token, never the token. `SKILLBOX_API_KEYS` may give `TENANT=TOKEN` pairs
//!   instead (hashed as they are read). A request names its key as
//!   `Authorization: Bearer TOKEN`; its hash is compared with every stored hash in
//!   constant time, and the request then acts as that key's tenant.
//! - **Keys in the records database.** A server on a shared database (`--db`) also
//!   answers the keys kept there (`skillbox keys new TENANT --db URL`), so every node
//!   answers the same keys and a revoked one is refused by all of them from their next
//!   request. A token not among the file's keys is looked up by its hash there.
//! - **Host.** A server bound to loopback is reachable from any web page the machine's
//!   browser opens, through DNS rebinding (a foreign name that resolves to 127.0.0.1).
//!   Such a request carries the foreign name in its `Host` header, so a loopback server
//!   answers only Host headers naming loopback or a name the operator lists.
//!
//! Without keys every request acts as the one tenant [`LOCAL_TENANT`].

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use skillbox_protocol::ErrorCode;
pub use skillbox_store::LOCAL_TENANT;

use crate::error::Failure;
use crate::state::AppState;

/// The tenant a request acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant(pub Arc<str>);

impl Tenant {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The API keys a server accepts, as hashes bound to tenants: its own (a file, the
/// environment), and those of the records database when it shares one.
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<(Tenant, [u8; 32])>,
    shared: Option<skillbox_store::KeyRecords>,
}

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hashes stay out of logs too.
        f.debug_struct("ApiKeys")
            .field("keys", &self.keys.len())
            .field("shared", &self.shared.is_some())
            .finish()
    }
}

fn check_tenant(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant {name:?}: use 1 to 64 of a-z, 0-9, '-' and '_'"
        ))
    }
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Equal without an early exit: the time taken does not say how much matched.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

impl ApiKeys {
    /// From a key file's text: `TENANT sha256:HEX` lines; `#` starts a comment.
    /// `source` names the file in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for (number, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let at = |why: String| format!("{source}:{}: {why}", number + 1);
            let mut fields = line.split_whitespace();
            let (Some(tenant), Some(digest), None) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(at("expected `TENANT sha256:HEX`".into()));
            };
            check_tenant(tenant).map_err(at)?;
            let hash = digest
                .strip_prefix("sha256:")
                .and_then(parse_hex32)
                .ok_or_else(|| {
                    at("the key must be `sha256:` and 64 hex digits (the hash of the token, not the token; `skillbox keys new` writes it)".into())
                })?;
            keys.push((Tenant(tenant.into()), hash));
        }
        Ok(ApiKeys { keys, shared: None })
    }

    /// From `TENANT=TOKEN` pairs separated by commas (`SKILLBOX_API_KEYS`).
    pub fn from_pairs(text: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (tenant, token) = pair
                .split_once('=')
                .ok_or_else(|| "SKILLBOX_API_KEYS: expected TENANT=TOKEN pairs".to_string())?;
            check_tenant(tenant).map_err(|e| format!("SKILLBOX_API_KEYS: {e}"))?;
            if token.len() < 16 {
                return Err(format!(
                    "SKILLBOX_API_KEYS: the token of {tenant} is shorter than 16 characters"
                ));
            }
            keys.push((Tenant(tenant.into()), hash(token)));
        }
        Ok(ApiKeys { keys, shared: None })
    }

    /// Both sets together.
    pub fn extend(&mut self, other: ApiKeys) {
        self.keys.extend(other.keys);
        self.shared = self.shared.take().or(other.shared);
    }

    /// These keys and those kept in a records database.
    pub fn with_shared(mut self, shared: skillbox_store::KeyRecords) -> Self {
        self.shared = Some(shared);
        self
    }

    /// Whether these keys are the server's own only, and none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.shared.is_none()
    }

    /// How many keys the server holds itself (those of a database are not counted).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The tenant whose key `token` is. Every one of the server's own hashes is
    /// compared, whatever matched; a token none of them holds is then looked up in the
    /// database, when keys are kept there too (whose failure is the error).
    pub async fn tenant_of(
        &self,
        token: &str,
    ) -> Result<Option<Tenant>, skillbox_store::StoreError> {
        let presented = hash(token);
        let mut found = None;
        for (tenant, stored) in &self.keys {
            if same(&presented, stored) && found.is_none() {
                found = Some(tenant.clone());
            }
        }
        match (found, &self.shared) {
            (Some(tenant), _) => Ok(Some(tenant)),
            (None, None) => Ok(None),
            (None, Some(shared)) => Ok(shared
                .tenant_of(&skillbox_store::sha256_hex(token.as_bytes()))
                .await?
                .map(|t| Tenant(t.into()))),
        }
    }

    /// A new random token for `tenant`, and its hash as 64 hex digits.
    pub fn new_token(tenant: &str) -> Result<(String, String), String> {
        check_tenant(tenant)?;
        let secret = skillbox_protocol::random::hex(32).map_err(|e| format!("a new key: {e}"))?;
        let token = format!("sbx_{secret}");
        let digest = skillbox_store::sha256_hex(token.as_bytes());
        Ok((token, digest))
    }

    /// A new random token for `tenant`, and the key file line that accepts it.
    pub fn new_key(tenant: &str) -> Result<(String, String), String> {
        let (token, digest) = Self::new_token(tenant)?;
        Ok((token, format!("{tenant} sha256:{digest}")))
    }
}

/// Which `Host` headers a server answers: `None` answers any (a server that is not
/// bound to loopback: its keys guard it).
#[derive(Debug, Clone, Default)]
pub struct HostPolicy {
    /// Names besides loopback's (`localhost`, `127.0.0.1`, `[::1]`), lowercase.
    pub extra: Vec<String>,
}

impl HostPolicy {
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let Some(name) = host_name(&host) else {
            return false;
        };
        name == "localhost"
            || name == "[::1]"
            || name
                .parse::<std::net::Ipv4Addr>()
                .is_ok_and(|ip| ip.is_loopback())
            || self.extra.iter().any(|e| e == name)
    }
}

/// The name part of a `Host` value (`[v6]` keeps its brackets); `None` when the value
/// is not a name with an optional numeric port.
fn host_name(host: &str) -> Option<&str> {
    if host.starts_with('[') {
        let end = host.find(']')?;
        let (name, rest) = host.split_at(end + 1);
        (rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port)).then_some(name)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => is_port(port).then_some(name),
            None => Some(host),
        }
    }
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// The guard in front of every route: the Host check, then the key. `/healthz` (load
/// balancers probe it) and the UI's static files need no key, but the Host check still
/// applies.
pub(crate) async fn guard(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    if let Some(policy) = &state.hosts {
        let host = request
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        if !policy.allows(host) {
            let response = Failure::new(
                ErrorCode::PermissionDenied,
                format!(
                    "Host {host:?} is not allowed: this server listens on loopback and answers \
                     only loopback names; start it with --allowed-host NAME to serve NAME"
                ),
            )
            .into_response();
            return closing_if_unread(&request, response);
        }
    }
    // Without keys only: a browser never attaches a bearer key by itself, so a keyed
    // server is not reachable this way, and a proxy in front of it that rewrites Host
    // keeps working.
    if state.config.keys.is_none()
        && let Some(refusal) = cross_origin(&request)
    {
        return closing_if_unread(&request, refusal);
    }
    let tenant = match &state.config.keys {
        None => Tenant(LOCAL_TENANT.into()),
        // The UI's static files hold no data; what they fetch sends the key.
        Some(_)
            if request.uri().path() == "/healthz"
                || crate::ui::is_ui_path(request.uri().path()) =>
        {
            Tenant(LOCAL_TENANT.into())
        }
        Some(keys) => {
            let token = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.strip_prefix("Bearer "))
                .map(str::trim);
            let found = match token {
                Some(token) => keys.tenant_of(token).await,
                None => Ok(None),
            };
            match found {
                Ok(Some(tenant)) => tenant,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot look up an API key");
                    let response =
                        Failure::new(e.code(), format!("cannot check the API key now: {e}"))
                            .into_response();
                    return closing_if_unread(&request, response);
                }
                Ok(None) => {
                    let why = match (token, &keys.shared) {
                        (Some(_), _) => "this API key is not known here",
                        (None, Some(_)) => {
                            "send an API key as `Authorization: Bearer TOKEN` (`skillbox keys \
                             new TENANT --db URL` makes one every node answers)"
                        }
                        (None, None) => "send an API key as `Authorization: Bearer TOKEN`",
                    };
                    let mut response =
                        Failure::new(ErrorCode::Unauthenticated, why).into_response();
                    response
                        .headers_mut()
                        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                    return closing_if_unread(&request, response);
                }
            }
        }
    };
    request.extensions_mut().insert(tenant);
    next.run(request).await
}

/// On a server without keys, a request that may change something (any method but GET,
/// HEAD and OPTIONS) sent by a web page of another origin is refused: a browser sends `Origin` with it, and lets a
/// page send a form-like POST to any address without asking first, so a page the user
/// visits could otherwise start runs, sessions or services on a server on loopback
/// without keys (the Host check does not stop it: the browser names the server's own
/// host). The server sends no CORS headers, so such a page could never read an answer;
/// clients that are not browsers send no `Origin` and are not affected.
fn cross_origin(request: &Request) -> Option<Response> {
    use axum::http::Method;
    if matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    ) {
        return None;
    }
    let origin = request.headers().get(header::ORIGIN)?;
    let origin = origin
        .to_str()
        .unwrap_or("null")
        .trim()
        .to_ascii_lowercase();
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    if authority.is_some_and(|a| !host.is_empty() && a == host) {
        return None;
    }
    Some(
        Failure::new(
            ErrorCode::PermissionDenied,
            format!(
                "Origin {origin:?} is not this server ({host:?}): a request from another site's page is refused"
            ),
        )
        .into_response(),
    )
}

/// A refusal sent before the request's body is read ends the connection, and says so:
/// hyper cannot reuse a connection with a body left in it, and a client that sent its
/// next request on it would see the connection close with no answer.
fn closing_if_unread(request: &Request, mut response: Response) -> Response {
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    if has_body {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tenant `keys` gives `token`, by name.
    async fn tenant(keys: &ApiKeys, token: &str) -> Option<String> {
        keys.tenant_of(token)
            .await
            .expect("no database")
            .map(|t| t.0.to_string())
    }

    #[tokio::test]
    async fn a_new_key_is_accepted_by_its_line_and_nothing_else() {
        let (token, line) = ApiKeys::new_key("acme").expect("key");
        let (other, other_line) = ApiKeys::new_key("globex").expect("key");
        let keys = ApiKeys::parse(
            &format!("# keys\n{line}\n\n{other_line} # second\n"),
            "keys",
        )
        .expect("parses");
        assert_eq!(keys.len(), 2);
        assert_eq!(tenant(&keys, &token).await, Some("acme".to_string()));
        assert_eq!(tenant(&keys, &other).await, Some("globex".to_string()));
        assert_eq!(tenant(&keys, "sbx_nope").await, None);
        assert_eq!(tenant(&keys, "").await, None);
        // The file holds the hash, not the token.
        assert!(!line.contains(&token[4..]));
    }

    #[test]
    fn bad_key_files_name_the_line() {
        for (text, needle) in [
            ("acme", "keys:1: expected"),
            ("acme sha256:00", "keys:1: the key must be"),
            ("\nACME sha256:00", "keys:2: tenant \"ACME\""),
            ("acme sbx_plaintexttoken", "the hash of the token"),
        ] {
            let error = ApiKeys::parse(text, "keys").expect_err(text);
            assert!(error.contains(needle), "{text}: {error}");
        }
    }

    #[tokio::test]
    async fn env_pairs_are_hashed_on_read() {
        let keys = ApiKeys::from_pairs("a=0123456789abcdef, b=fedcba9876543210").expect("pairs");
        assert_eq!(
            tenant(&keys, "0123456789abcdef").await,
            Some("a".to_string())
        );
        assert!(ApiKeys::from_pairs("a=short").is_err());
        assert!(ApiKeys::from_pairs("justatoken").is_err());
        assert!(format!("{keys:?}").contains("keys: 2"));
    }

    #[test]
    fn loopback_names_pass_and_foreign_ones_do_not() {
        let policy = HostPolicy {
            extra: vec!["sandbox.internal".into()],
        };
        for host in [
            "localhost",
            "localhost:8080",
            "127.0.0.1:8080",
            "127.5.0.1",
            "[::1]:8080",
            "[::1]",
            "LOCALHOST:1",
            "sandbox.internal:9",
        ] {
            assert!(policy.allows(host), "{host}");
        }
        for host in [
            "",
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:8080",
            "[::2]:80",
            "localhost:80:80",
            "localhost:port",
        ] {
            assert!(!policy.allows(host), "{host}");
        }
    }
}
