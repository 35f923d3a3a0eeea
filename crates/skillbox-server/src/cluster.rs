//! Several servers on one records database (`serve --db postgres://…`): each keeps its
//! row in the database's list of nodes alive, closes the runs of a node that went
//! silent, and answers a request for a session of another node by forwarding it there.
//!
//! A session lives in the memory of the node that made it (its sandbox is there). Its
//! id names that node (`ses_<hex>.<node>`), so any node a balancer picks knows where it
//! is without asking anyone: the request is forwarded, as it came (the client's key
//! and all), to the address that node gave (`--advertise`), and the answer streamed
//! back. A session whose node is no longer listed (it stopped, or died and another
//! node claimed it) answers 410 `gone`. Forwarding between nodes, rather than routing
//! in the balancer, works behind any balancer, with no per-node rule to keep in step.

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use skillbox_protocol::ErrorCode;
use skillbox_store::{Nodes, RunRecords, SilentNode};
use tokio_util::sync::CancellationToken;

use crate::error::Failure;
use crate::state::AppState;

/// Set on a forwarded request: the node that forwarded it. A request that carries it
/// is answered where it lands, never forwarded again.
pub(crate) const FORWARDED_BY: HeaderName = HeaderName::from_static("x-skillbox-forwarded-by");

/// This node among those sharing the database.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) nodes: Nodes,
    /// This node's name (`--node`).
    pub(crate) me: String,
    /// Where the others reach it (`--advertise`).
    pub(crate) address: String,
    client: reqwest::Client,
}

impl Cluster {
    pub(crate) fn new(nodes: Nodes, me: String, address: String) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("the client that forwards to other nodes: {e}"))?;
        Ok(Cluster {
            nodes,
            me,
            address,
            client,
        })
    }

    /// A new session's id: `id` with this node's name.
    pub(crate) fn session_id(&self, id: &str) -> String {
        format!("{id}.{}", self.me)
    }
}

/// The node a session id names, if it names one.
fn node_of(id: &str) -> Option<&str> {
    id.rsplit_once('.').map(|(_, node)| node)
}

/// Until `shutdown`: says every `silence / 3` that this node is alive, and closes, as
/// `failed`, the runs of any other node silent for `silence` (a node killed, or cut
/// off): their clients get an end. One node closes each (the one that removes it).
pub(crate) async fn watch_nodes(
    cluster: std::sync::Arc<Cluster>,
    records: RunRecords,
    silence: Duration,
    shutdown: CancellationToken,
) {
    let me = cluster.me.as_str();
    let every = (silence / 3).max(Duration::from_millis(100));
    let mut starting = true;
    loop {
        match cluster.nodes.beat(me, &cluster.address, starting).await {
            Ok(()) => starting = false,
            Err(e) => {
                tracing::warn!(error = %e, node = %me, "nodes: cannot say this node is alive")
            }
        }
        match cluster.nodes.silent(me, silence).await {
            Ok(silent) => {
                for node in silent {
                    close_dead(&cluster.nodes, &records, &node, silence).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "nodes: cannot list silent nodes"),
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

async fn close_dead(nodes: &Nodes, records: &RunRecords, node: &SilentNode, silence: Duration) {
    match nodes.claim_dead(node).await {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(error = %e, node = %node.name, "nodes: cannot remove a silent node");
            return;
        }
    }
    let reason = format!(
        "interrupted: node {} stopped answering (silent for more than {} s)",
        node.name,
        silence.as_secs_f64()
    );
    match records.close_running(&node.name, &reason).await {
        Ok(closed) => tracing::warn!(
            node = %node.name,
            closed,
            "nodes: a node went silent; its running agent runs are recorded failed"
        ),
        Err(e) => {
            tracing::error!(error = %e, node = %node.name, "nodes: cannot close a dead node's runs");
        }
    }
}

/// Middleware of the session routes (`/v1/sessions/{id}…`, after the key check): a
/// session of another node is forwarded there; one of a node no longer listed is
/// 410 `gone`; this node's (and every one without a cluster) goes on to the handler.
pub(crate) async fn forward(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(cluster) = state.cluster.as_deref() else {
        return next.run(request).await;
    };
    let id = request
        .uri()
        .path()
        .strip_prefix("/v1/sessions/")
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default()
        .to_string();
    let Some(node) = node_of(&id).filter(|node| *node != cluster.me) else {
        return next.run(request).await;
    };
    if request.headers().contains_key(&FORWARDED_BY) {
        // Forwarded here by a node that took this one for `node`: never onwards.
        return Failure::new(
            ErrorCode::NotFound,
            format!(
                "no session {id} on node {} (it names node {node})",
                cluster.me
            ),
        )
        .into_response();
    }
    match cluster.nodes.address(node).await {
        Ok(Some(address)) => relay(cluster, node, &address, request).await,
        Ok(None) => Failure::new(
            ErrorCode::Gone,
            format!(
                "session {id} lived on node {node}, which is no longer serving (it stopped, or \
                 stopped answering): its sandbox is gone; open a new session"
            ),
        )
        .into_response(),
        Err(e) => Failure::from(e).into_response(),
    }
}

/// The sessions of the tenant whose key is in `headers` on every other listed node
/// (`GET /v1/sessions` asked of each, marked as forwarded so none asks further). A node
/// that does not answer within 5 s is left out, and logged.
pub(crate) async fn sessions_elsewhere(
    cluster: &Cluster,
    headers: &axum::http::HeaderMap,
) -> Vec<skillbox_protocol::SessionInfo> {
    let nodes = match cluster.nodes.all().await {
        Ok(nodes) => nodes,
        Err(e) => {
            tracing::warn!(error = %e, "sessions: cannot list the other nodes");
            return Vec::new();
        }
    };
    let asks = nodes
        .into_iter()
        .filter(|(name, _)| *name != cluster.me)
        .map(|(name, address)| async move {
            let mut ask = cluster
                .client
                .get(format!("{}/v1/sessions", address.trim_end_matches('/')))
                .timeout(Duration::from_secs(5))
                .header(&FORWARDED_BY, cluster.me.as_str());
            if let Some(key) = headers.get(header::AUTHORIZATION) {
                ask = ask.header(header::AUTHORIZATION, key);
            }
            let answer = async {
                ask.send()
                    .await?
                    .error_for_status()?
                    .json::<skillbox_protocol::SessionList>()
                    .await
            };
            match answer.await {
                Ok(list) => list.sessions,
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "sessions: a node did not list its sessions");
                    Vec::new()
                }
            }
        });
    futures_util::future::join_all(asks)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// Sends `request` to the node at `address` and streams its answer back.
async fn relay(cluster: &Cluster, node: &str, address: &str, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let target = format!(
        "{}{}",
        address.trim_end_matches('/'),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut headers = parts.headers;
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::HOST);
    let forwarded = cluster
        .client
        .request(parts.method, &target)
        .headers(headers)
        .header(&FORWARDED_BY, cluster.me.as_str())
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    let answer = match forwarded {
        Ok(answer) => answer,
        Err(e) => {
            return Failure::new(
                ErrorCode::Unavailable,
                format!("the session's node {node} ({address}) did not answer: {e}"),
            )
            .into_response();
        }
    };
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !HOP_BY_HOP.contains(name) {
            response = response.header(name, value);
        }
    }
    response
        .body(Body::from_stream(answer.bytes_stream()))
        .unwrap_or_else(|e| {
            Failure::new(
                ErrorCode::Unknown,
                format!("relay the answer of node {node}: {e}"),
            )
            .into_response()
        })
}

/// Headers of one connection, not of the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_names_its_node() {
        assert_eq!(node_of("ses_0123abcd.node-a"), Some("node-a"));
        assert_eq!(node_of("ses_0123abcd"), None);
    }
}
