//! `/mcp`'s HTTP service: rmcp's streamable HTTP service behind two checks of its
//! own: an MCP session answers only the tenant that opened it, and a server holds a
//! bounded number of MCP sessions, in all and per tenant.
//!
//! rmcp routes a request to a session by its `Mcp-Session-Id` alone, and handles some
//! requests without the handler ever seeing them: `DELETE` ends the session, `GET`
//! opens (or, with `Last-Event-ID`, replays) its stream, and a notification such as
//! `notifications/cancelled` reaches no tool. So the tenant is checked here, on every
//! request that names a session, before rmcp sees it: a session id of another tenant
//! (or of no session) is answered 404 as a session that is not there.
//!
//! rmcp keeps every session in memory until it ends, whatever its client does, so an
//! `initialize` is given a place within [`SessionBounds`] before rmcp sees it (429
//! past them). The places are the sessions still in rmcp's table: rmcp takes a session
//! out of it however it ends (a `DELETE`, its idle time, the server stopping, a failed
//! handshake), from the session's own task, so its place is free as soon as it is gone.

use std::collections::HashMap;
use std::convert::Infallible;
use std::fmt::Display;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use serde_json::Value;
use skillbox_env::CancellationToken;
use skillbox_pace::AnswerDeadline;

use crate::handler::{Caller, NO_SUCH_SESSION, SkillboxMcp};
use crate::holds::{AnswerHolds, holding};

const SESSION_ID: &str = "mcp-session-id";

/// Seconds an `initialize` past the bounds is told to wait (`Retry-After`), as a
/// session past the HTTP sessions' bounds is.
const RETRY_AFTER_SECONDS: u32 = 5;

/// How many MCP sessions a server keeps, in all and per tenant. Each costs little
/// (its sandbox is bounded apart, by [`SandboxBounds`](crate::SandboxBounds)), but
/// lives until it ends or idles out, so an `initialize` past either bound is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionBounds {
    pub max_total: usize,
    pub max_per_tenant: usize,
}

impl Default for SessionBounds {
    fn default() -> Self {
        SessionBounds {
            max_total: 256,
            max_per_tenant: 32,
        }
    }
}

/// Who holds each place: the tenant of each session rmcp made, and the `initialize`s
/// being answered.
#[derive(Debug, Default)]
struct Table {
    /// By session id. An entry whose session rmcp no longer has is dropped before
    /// anything is counted ([`Owners::reserve`]).
    owners: HashMap<Arc<str>, Arc<str>>,
    /// By tenant: `initialize`s being answered, each holding a place.
    opening: HashMap<Arc<str>, usize>,
}

impl Table {
    fn done_opening(&mut self, tenant: &Arc<str>) {
        if let Some(count) = self.opening.get_mut(tenant) {
            *count -= 1;
            if *count == 0 {
                self.opening.remove(tenant);
            }
        }
    }
}

/// The tenant of each live MCP session, and the places within the bounds.
#[derive(Debug)]
struct Owners {
    table: Mutex<Table>,
    /// rmcp's sessions: what is live.
    sessions: Arc<LocalSessionManager>,
    bounds: SessionBounds,
}

impl Owners {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Counts and owners only: a panic elsewhere leaves nothing half-written.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether session `id` is `caller`'s.
    fn is_callers(&self, id: &str, caller: Option<&Arc<str>>) -> bool {
        let Some(caller) = caller else {
            return false;
        };
        self.table
            .lock()
            .map(|table| table.owners.get(id).is_some_and(|owner| owner == caller))
            .unwrap_or(false)
    }

    /// Takes a place for a session `tenant` is opening, or says which bound is reached.
    async fn reserve(self: &Arc<Self>, tenant: &Arc<str>) -> Result<Place, String> {
        // rmcp's table stays read-locked while ours is pruned: a session it makes
        // meanwhile is written to ours only after it is in rmcp's, so it is never
        // taken for one that ended.
        let live = self.sessions.sessions.read().await;
        let mut table = self.table();
        table.owners.retain(|id, _| live.contains_key(&**id));
        drop(live);
        let opening: usize = table.opening.values().sum();
        if table.owners.len() + opening >= self.bounds.max_total {
            return Err(format!(
                "{} MCP sessions are open on this server, as many as it takes; end one (DELETE /mcp) or retry later",
                self.bounds.max_total
            ));
        }
        let theirs = table.owners.values().filter(|o| *o == tenant).count()
            + table.opening.get(tenant).copied().unwrap_or(0);
        if theirs >= self.bounds.max_per_tenant {
            return Err(format!(
                "tenant {tenant} has {} MCP sessions open, as many as one tenant may; end one (DELETE /mcp) first",
                self.bounds.max_per_tenant
            ));
        }
        *table.opening.entry(tenant.clone()).or_insert(0) += 1;
        Ok(Place {
            owners: Some(self.clone()),
            tenant: tenant.clone(),
        })
    }

    /// Session `id` is `tenant`'s (opened without a place: see [`open`]).
    fn own(&self, id: &str, tenant: Arc<str>) {
        self.table().owners.insert(id.into(), tenant);
    }

    fn ended(&self, id: &str) {
        self.table().owners.remove(id);
    }
}

/// A place for a session being opened; given back when dropped unless it
/// [`opened`](Place::opened) one.
struct Place {
    owners: Option<Arc<Owners>>,
    tenant: Arc<str>,
}

impl Place {
    /// Session `id` opened: the place is its own now, with no moment in between when
    /// it is free.
    fn opened(mut self, id: &str) {
        if let Some(owners) = self.owners.take() {
            let mut table = owners.table();
            table.done_opening(&self.tenant);
            table.owners.insert(id.into(), self.tenant.clone());
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(owners) = self.owners.take() {
            owners.table().done_opening(&self.tenant);
        }
    }
}

/// The `/mcp` service: a tower service of HTTP requests, one handler per MCP session,
/// each session answering only the tenant ([`Caller`]) that opened it, as many
/// sessions as [`SessionBounds`] allow.
#[derive(Clone)]
pub struct HttpService {
    inner: StreamableHttpService<SkillboxMcp, LocalSessionManager>,
    owners: Arc<Owners>,
    max_body_bytes: usize,
    /// Cancelled as the server stops: no session opens from then on.
    stopping: CancellationToken,
}

impl std::fmt::Debug for HttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpService").finish_non_exhaustive()
    }
}

impl HttpService {
    pub(crate) fn new(
        inner: StreamableHttpService<SkillboxMcp, LocalSessionManager>,
        sessions: Arc<LocalSessionManager>,
        bounds: SessionBounds,
        max_body_bytes: usize,
        stopping: CancellationToken,
    ) -> Self {
        HttpService {
            inner,
            owners: Arc::new(Owners {
                table: Mutex::new(Table::default()),
                sessions,
                bounds,
            }),
            max_body_bytes,
            stopping,
        }
    }

    /// MCP sessions open, or being opened, now.
    pub async fn sessions_open(&self) -> usize {
        let live = self.owners.sessions.sessions.read().await;
        let mut table = self.owners.table();
        table.owners.retain(|id, _| live.contains_key(&**id));
        table.owners.len() + table.opening.values().sum::<usize>()
    }
}

type HttpResponse = Response<BoxBody<Bytes, Infallible>>;

/// A JSON-RPC error answer (`id` null when the request's is not known); `data`, when
/// given, carries skillbox's error code.
fn jsonrpc_error(
    status: StatusCode,
    id: Value,
    code: i32,
    message: &str,
    skillbox_code: Option<&str>,
) -> HttpResponse {
    let mut error = serde_json::json!({"code": code, "message": message});
    if let Some(skillbox_code) = skillbox_code {
        error["data"] = serde_json::json!({"code": skillbox_code});
    }
    let body = serde_json::json!({"jsonrpc": "2.0", "id": id, "error": error});
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// 404, as rmcp answers a session that is not there, with a JSON-RPC error body.
fn no_such_session() -> HttpResponse {
    jsonrpc_error(
        StatusCode::NOT_FOUND,
        Value::Null,
        -32600,
        NO_SUCH_SESSION,
        None,
    )
}

/// 429 to an `initialize` past a bound (`message` names which), with `Retry-After`.
fn too_many_sessions(id: Value, message: &str) -> HttpResponse {
    let mut response = jsonrpc_error(
        StatusCode::TOO_MANY_REQUESTS,
        id,
        -32000,
        message,
        Some("overloaded"),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    response
}

/// 503 to a request for a new session once the server is stopping.
fn shutting_down() -> HttpResponse {
    jsonrpc_error(
        StatusCode::SERVICE_UNAVAILABLE,
        Value::Null,
        -32000,
        "the server is shutting down; no MCP session opens now (open one once it is back)",
        Some("unavailable"),
    )
}

/// What a body with no session says it is: enough to tell an `initialize`.
#[derive(serde::Deserialize)]
struct Probe {
    method: Option<String>,
    id: Option<Value>,
}

/// A POST naming no session, of `caller`: an `initialize` (or anything rmcp might take
/// for one) gets a place within the bounds first, 429 past them, and the session it
/// opens is `caller`'s.
async fn open<B>(
    inner: StreamableHttpService<SkillboxMcp, LocalSessionManager>,
    owners: Arc<Owners>,
    caller: Arc<str>,
    request: Request<B>,
    max_body_bytes: usize,
) -> HttpResponse
where
    B: Body + Send + 'static,
    B::Error: Display + std::error::Error + Send + Sync + 'static,
    B::Data: Send + 'static,
{
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, max_body_bytes).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<LengthLimitError>() => {
            return jsonrpc_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                Value::Null,
                -32600,
                &format!("request body: larger than {max_body_bytes} bytes"),
                Some("payload_too_large"),
            );
        }
        Err(e) => {
            return jsonrpc_error(
                StatusCode::BAD_REQUEST,
                Value::Null,
                -32600,
                &format!("request body: {e}"),
                Some("invalid"),
            );
        }
    };
    // Only a body that plainly is something else (a `server/discover`, a response)
    // goes without a place; one that does not parse here takes one, and rmcp refuses it.
    let place = match serde_json::from_slice::<Probe>(&body) {
        Ok(Probe {
            method: Some(method),
            ..
        }) if method != "initialize" => None,
        Ok(Probe { method: None, .. }) => None,
        probed => match owners.reserve(&caller).await {
            Ok(place) => Some(place),
            Err(message) => {
                let id = probed.ok().and_then(|p| p.id).unwrap_or(Value::Null);
                tracing::debug!(tenant = %caller, "mcp: initialize refused: {message}");
                return too_many_sessions(id, &message);
            }
        },
    };
    let request = Request::from_parts(parts, Full::new(body));
    // Answered in a task of its own: a client gone mid-initialize must not leave rmcp a
    // session that holds no place.
    let answered = tokio::spawn(async move {
        let response = inner.handle(request).await;
        let id = response
            .headers()
            .get(SESSION_ID)
            .and_then(|id| id.to_str().ok())
            .filter(|_| response.status().is_success());
        match (id, place) {
            (Some(id), Some(place)) => place.opened(id),
            (Some(id), None) => owners.own(id, caller),
            (None, _) => {}
        }
        response
    });
    match answered.await {
        Ok(response) => response,
        Err(e) => jsonrpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            Value::Null,
            -32603,
            &format!("initialize: {e}"),
            Some("unknown"),
        ),
    }
}

impl<B> tower_service::Service<Request<B>> for HttpService
where
    B: Body + Send + 'static,
    B::Error: Display + std::error::Error + Send + Sync + 'static,
    B::Data: Send + 'static,
{
    type Response = HttpResponse;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<HttpResponse, Infallible>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let caller = request.extensions().get::<Caller>().map(|c| c.0.clone());
        let session = request
            .headers()
            .get(SESSION_ID)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        let method = request.method().clone();
        let mut inner = self.inner.clone();
        let owners = self.owners.clone();
        if let (None, Some(_)) = (&session, &caller)
            && method == Method::POST
            && self.stopping.is_cancelled()
        {
            // rmcp would answer 500 (its session service is gone); no session is made.
            return Box::pin(async { Ok(shutting_down()) });
        }
        if let (None, Some(caller)) = (&session, &caller)
            && method == Method::POST
        {
            let (caller, max_body_bytes) = (caller.clone(), self.max_body_bytes);
            return Box::pin(async move {
                Ok(open(inner, owners, caller, request, max_body_bytes).await)
            });
        }
        let mut request = request;
        let deadline = request.extensions().get::<AnswerDeadline>().cloned();
        let holds = (method == Method::POST).then(AnswerHolds::default);
        if let Some(holds) = &holds {
            request.extensions_mut().insert(holds.clone());
        }
        Box::pin(async move {
            if let Some(id) = &session
                && !owners.is_callers(id, caller.as_ref())
            {
                return Ok(no_such_session());
            }
            let response = inner.call(request).await?;
            let response = match holds {
                Some(holds) => holding(response, holds, deadline),
                None => response,
            };
            if let Some(id) = &session
                && method == Method::DELETE
                && response.status().is_success()
            {
                owners.ended(id);
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tower_service::Service as _;

    use super::*;
    use crate::{HttpConfig, McpConfig, McpServer};

    /// `/mcp` of a local server whose sessions idle out after `idle`.
    async fn service(dir: &std::path::Path, bounds: SessionBounds, idle: Duration) -> HttpService {
        let store = skillbox_store::ArtifactStore::local(&dir.join("objects"))
            .await
            .unwrap();
        let runner = skillbox_run::Runner::new(skillbox_run::RunnerConfig::new(dir), store);
        McpServer::local(Arc::new(runner), McpConfig::default()).http_service(HttpConfig {
            max_body_bytes: 1 << 20,
            idle,
            sessions: bounds,
        })
    }

    fn post(tenant: &str, body: Value) -> Request<Full<Bytes>> {
        let mut request = Request::post("/mcp")
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        request.extensions_mut().insert(Caller(tenant.into()));
        request
    }

    fn initialize(tenant: &str) -> Request<Full<Bytes>> {
        post(
            tenant,
            serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "bounds", "version": "0"}}}),
        )
    }

    /// Its status, and its body when it is not a stream (a stream is not read).
    async fn answer(service: &mut HttpService, request: Request<Full<Bytes>>) -> (u16, Value) {
        let response = service.call(request).await.unwrap();
        let status = response.status().as_u16();
        if status == 200 {
            assert!(response.headers().contains_key(SESSION_ID));
            return (status, Value::Null);
        }
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let body = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        if status == 429 {
            assert_eq!(retry_after.unwrap(), "5", "{body}");
        }
        (status, body)
    }

    /// Past either bound an `initialize` is 429 naming the bound, and nothing else is;
    /// a session that idles out gives its place back (rmcp takes it out of its table).
    #[tokio::test]
    async fn initialize_past_a_bound_is_429_and_idle_sessions_free_their_place() {
        let dir = std::env::temp_dir().join(format!("skillbox-mcp-bounds-{}", std::process::id()));
        let bounds = SessionBounds {
            max_total: 2,
            max_per_tenant: 1,
        };
        let mut mcp = service(&dir, bounds, Duration::from_millis(300)).await;

        let (status, body) = answer(&mut mcp, initialize("alice")).await;
        assert_eq!(status, 200, "{body}");
        let (status, body) = answer(&mut mcp, initialize("alice")).await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(body["id"], 7, "{body}");
        assert_eq!(body["error"]["data"]["code"], "overloaded", "{body}");
        assert_eq!(
            body["error"]["message"],
            "tenant alice has 1 MCP sessions open, as many as one tenant may; end one (DELETE /mcp) first"
        );
        assert_eq!(answer(&mut mcp, initialize("bob")).await.0, 200);
        let (status, body) = answer(&mut mcp, initialize("carol")).await;
        assert_eq!(status, 429, "{body}");
        assert_eq!(
            body["error"]["message"],
            "2 MCP sessions are open on this server, as many as it takes; end one (DELETE /mcp) or retry later"
        );
        // Not an initialize: rmcp's own answer, no place taken.
        let ping = serde_json::json!({"jsonrpc": "2.0", "id": 8, "method": "ping"});
        let (status, body) = answer(&mut mcp, post("carol", ping)).await;
        assert_ne!(status, 429, "{body}");
        assert_eq!(mcp.sessions_open().await, 2);

        // Both idle out; the places follow rmcp's table, bounded in time.
        let deadline = Instant::now() + Duration::from_secs(10);
        while mcp.sessions_open().await > 0 {
            assert!(
                Instant::now() < deadline,
                "idle MCP sessions kept their places"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(answer(&mut mcp, initialize("carol")).await.0, 200);
        assert_eq!(answer(&mut mcp, initialize("alice")).await.0, 200);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Once the server stops, an `initialize` is 503 saying so (rmcp's own answer would
    /// be a 500 naming its session service), and no session is made.
    #[tokio::test]
    async fn initialize_once_stopping_is_503() {
        let dir = std::env::temp_dir().join(format!("skillbox-mcp-stop-{}", std::process::id()));
        let store = skillbox_store::ArtifactStore::local(&dir.join("objects"))
            .await
            .unwrap();
        let runner = skillbox_run::Runner::new(skillbox_run::RunnerConfig::new(&dir), store);
        let server = McpServer::local(Arc::new(runner), McpConfig::default());
        let mut mcp = server.http_service(HttpConfig {
            max_body_bytes: 1 << 20,
            idle: Duration::from_secs(60),
            sessions: SessionBounds::default(),
        });
        server.stop();
        let (status, body) = answer(&mut mcp, initialize("alice")).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["data"]["code"], "unavailable", "{body}");
        assert_eq!(
            body["error"]["message"],
            "the server is shutting down; no MCP session opens now (open one once it is back)"
        );
        assert_eq!(mcp.sessions_open().await, 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
