//! `/mcp`'s HTTP service: rmcp's streamable HTTP service behind a check that an MCP
//! session answers only the tenant that opened it.
//!
//! rmcp routes a request to a session by its `Mcp-Session-Id` alone, and handles some
//! requests without the handler ever seeing them: `DELETE` ends the session, `GET`
//! opens (or, with `Last-Event-ID`, replays) its stream, and a notification such as
//! `notifications/cancelled` reaches no tool. So the tenant is checked here, on every
//! request that names a session, before rmcp sees it: a session id of another tenant
//! (or of no session) is answered 404 as a session that is not there.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body::Body;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use rmcp::transport::StreamableHttpService;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;

use crate::handler::{Caller, SkillboxMcp};

const SESSION_ID: &str = "mcp-session-id";

/// What a session that is not the caller's is answered, as JSON-RPC.
pub(crate) const NO_SUCH_SESSION: &str = "no such MCP session for this API key";

/// The tenant of each live MCP session, by session id.
#[derive(Debug)]
struct Owners {
    owners: Mutex<HashMap<Arc<str>, Arc<str>>>,
    /// rmcp's sessions: an owner whose session is gone (ended, idled out) is dropped.
    sessions: Arc<LocalSessionManager>,
}

impl Owners {
    /// Whether session `id` is `caller`'s.
    fn is_callers(&self, id: &str, caller: Option<&Arc<str>>) -> bool {
        let Some(caller) = caller else {
            return false;
        };
        self.owners
            .lock()
            .map(|owners| owners.get(id).is_some_and(|owner| owner == caller))
            .unwrap_or(false)
    }

    /// Session `id` was just opened by `caller`; owners of sessions that ended go.
    async fn opened(&self, id: &str, caller: Arc<str>) {
        let live: HashSet<Arc<str>> = self
            .sessions
            .sessions
            .read()
            .await
            .keys()
            .cloned()
            .collect();
        if let Ok(mut owners) = self.owners.lock() {
            owners.retain(|id, _| live.contains(id));
            owners.insert(id.into(), caller);
        }
    }

    fn ended(&self, id: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.remove(id);
        }
    }
}

/// The `/mcp` service: a tower service of HTTP requests, one handler per MCP session,
/// each session answering only the tenant ([`Caller`]) that opened it.
#[derive(Clone)]
pub struct HttpService {
    inner: StreamableHttpService<SkillboxMcp, LocalSessionManager>,
    owners: Arc<Owners>,
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
    ) -> Self {
        HttpService {
            inner,
            owners: Arc::new(Owners {
                owners: Mutex::new(HashMap::new()),
                sessions,
            }),
        }
    }
}

type HttpResponse = Response<BoxBody<Bytes, Infallible>>;

/// 404, as rmcp answers a session that is not there, with a JSON-RPC error body.
fn no_such_session() -> HttpResponse {
    let body = serde_json::json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": {"code": -32600, "message": NO_SUCH_SESSION},
    });
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())).boxed());
    *response.status_mut() = StatusCode::NOT_FOUND;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

impl<B> tower_service::Service<Request<B>> for HttpService
where
    B: Body + Send + 'static,
    B::Error: Display,
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
        let deleting = request.method() == Method::DELETE;
        let mut inner = self.inner.clone();
        let owners = self.owners.clone();
        Box::pin(async move {
            if let Some(id) = &session
                && !owners.is_callers(id, caller.as_ref())
            {
                return Ok(no_such_session());
            }
            let response = inner.call(request).await?;
            match (&session, caller) {
                (Some(id), _) if deleting && response.status().is_success() => owners.ended(id),
                // Only an initialize opens a session: its answer names it.
                (None, Some(caller)) if response.status().is_success() => {
                    if let Some(id) = response.headers().get(SESSION_ID)
                        && let Ok(id) = id.to_str()
                    {
                        owners.opened(id, caller).await;
                    }
                }
                _ => {}
            }
            Ok(response)
        })
    }
}
