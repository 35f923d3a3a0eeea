//! What is composed above the server. An [`Extension`] adds routes of its own
//! (`skillbox serve` adds `/mcp` this way: the server does not know MCP), served behind
//! the same guard as every other route (the Host check, then the key) and with their
//! bodies read by one rule ([`whole_body`]: within the body limit, the body timeout and
//! the budget of bodies in memory); it adds its lines to `/metrics` and has its part in
//! shutdown.
//!
//! What an extension may ask of the server is a method of [`AppState`] here: a run's
//! admission, bytes held in the budget of bodies in memory, object owners, the
//! capabilities, and the runs' cancel. Each goes through the same code as the server's
//! own routes.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use skillbox_protocol::{ArtifactInfo, CapabilityRun, CapabilityRunRequest, ErrorCode};
use skillbox_run::Runner;
use tokio_util::sync::CancellationToken;

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{Admission, BodyHold};
use crate::state::{AppState, ServerConfig};

/// Routes composed above the server, with their part in `/metrics` and in shutdown.
/// Every method but [`routes`](Extension::routes) has a body that adds nothing.
#[async_trait]
pub trait Extension: Send + Sync + fmt::Debug + 'static {
    /// Its routes. A request reaches them past the Host check and the key check (its
    /// [`Tenant`] in its extensions), with its body read whole ([`whole_body`]).
    fn routes(&self) -> Router;

    /// Its lines of `/metrics` (Prometheus text format, each ending in `\n`).
    async fn metrics(&self) -> String {
        String::new()
    }

    /// Shutdown began: it takes no new call, and what it runs is cancelled.
    fn stop(&self) {}

    /// The connections are drained: it removes what it holds (its sandboxes) and
    /// returns once that is gone.
    async fn close(&self) {}
}

/// The extensions of a server being started, made over its state (each keeps a copy:
/// that copy has no extensions of its own, so there is no cycle).
pub type Extensions = Box<dyn FnOnce(&AppState) -> Vec<Arc<dyn Extension>> + Send>;

impl AppState {
    /// How the server runs.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The runner every run of this server goes through.
    pub fn runner(&self) -> &Arc<Runner> {
        &self.runner
    }

    /// Admits a run of `tenant` holding `bytes` of input in memory (read already, by
    /// the extension), as `POST /v1/run` is admitted: the tenant's bound, a slot or a
    /// place in the queue, and the body budget, else `overloaded`. The run holds its
    /// place until the admission drops.
    pub async fn admit_run(&self, tenant: &str, bytes: usize) -> Result<Admission, Failure> {
        crate::runs::admit_bytes(self, &Tenant(tenant.into()), bytes).await
    }

    /// Holds `bytes` of memory for an answer of `tenant` being made, from before what
    /// it carries is read until it is sent (dropped: free), in the budget request bodies
    /// and file reads are held in (and the tenant's share of it): `overloaded` while
    /// that is taken, `resource_exhausted` past all of it.
    pub fn hold_answer(&self, tenant: &str, bytes: usize) -> Result<BodyHold, Failure> {
        let budget = self.config.max_body_bytes_in_flight;
        let (most, whose) = match &self.body_shares {
            Some(shares) => (shares.limit, format!("one tenant's half of the {budget}")),
            None => (budget, format!("the {budget}")),
        };
        if bytes > most {
            return Err(Failure::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "its answer holds {bytes} bytes in memory, more than {whose} this server holds at once (--max-body-bytes-in-flight); serve with a larger --max-body-bytes-in-flight"
                ),
            ));
        }
        crate::runs::hold_body_bytes(self, &Tenant(tenant.into()), bytes).map_err(|_| {
            Failure::new(
                ErrorCode::Overloaded,
                format!(
                    "its answer holds {bytes} bytes in memory, and the server (or this tenant's share of it) holds as many request bodies, file reads and answers as it may now (--max-body-bytes-in-flight, {budget} bytes); retry later"
                ),
            )
        })
    }

    /// Records that runs of `tenant` made `files`: it may download them from now on.
    pub async fn grant(&self, tenant: &str, files: &[ArtifactInfo]) -> Result<(), Failure> {
        crate::runs::grant(self, &Tenant(tenant.into()), files).await
    }

    /// The content type of object `sha256` when `tenant` may read it; `None` when it
    /// may not (or there is no such object).
    pub async fn owned(&self, tenant: &str, sha256: &str) -> Result<Option<String>, Failure> {
        Ok(self
            .owners
            .get(tenant, sha256)
            .await?
            .map(|owned| owned.content_type))
    }

    /// The capabilities a call may name: `None` without `--capabilities`, else those
    /// that load and may run over HTTP (not `host`, not persistent).
    pub async fn runnable_capabilities(&self) -> Option<Vec<String>> {
        crate::capabilities::runnable(self).await
    }

    /// One call of capability `name` for `tenant`, through the trust check, environment
    /// and admission of `POST /v1/capabilities/{name}/run`; cancelled by `cancel`, and
    /// by the server stopping.
    pub async fn run_capability(
        &self,
        tenant: &str,
        name: &str,
        request: CapabilityRunRequest,
        cancel: &CancellationToken,
    ) -> Result<CapabilityRun, Failure> {
        let linked = self.runs_cancel().child_token();
        let (asked, link) = (cancel.clone(), linked.clone());
        let watch = tokio::spawn(async move {
            asked.cancelled().await;
            link.cancel();
        });
        let ran = crate::capabilities::run_for_extension(
            self,
            &Tenant(tenant.into()),
            name,
            request,
            linked,
        )
        .await;
        watch.abort();
        ran
    }
}

/// Between the key check and an extension's route: its body read whole within the body
/// timeout and the server's budget of bodies in memory (held until the route answers),
/// and within the body limit, a chunked one too.
pub(crate) async fn whole_body(
    State(state): State<AppState>,
    axum::Extension(tenant): axum::Extension<Tenant>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let limit = state.config.body_limit;
    let announced = parts
        .headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    let budget = match announced {
        Some(0) => None,
        Some(size) if size > limit => {
            return Failure::new(
                ErrorCode::PayloadTooLarge,
                format!("request body: larger than {limit} bytes"),
            )
            .into_response();
        }
        Some(size) => Some(size),
        // A GET (its stream) has no body; a chunked POST is budgeted at the limit.
        None if parts.method == axum::http::Method::POST => Some(limit),
        None => None,
    };
    let _held = match budget {
        Some(bytes) => match crate::runs::hold_body_bytes(&state, &tenant, bytes) {
            Ok(held) => Some(held),
            Err(refused) => return refused.into_response(),
        },
        None => None,
    };
    let body = if budget.is_some() {
        let read =
            tokio::time::timeout(state.config.body_timeout, axum::body::to_bytes(body, limit))
                .await;
        match read {
            Err(_) => {
                return Failure::new(
                    ErrorCode::Timeout,
                    format!(
                        "request body: not received within {} s",
                        state.config.body_timeout.as_secs()
                    ),
                )
                .into_response();
            }
            Ok(Err(e)) => {
                // A chunked body announces no length: past the limit is found here.
                let too_big = std::error::Error::source(&e)
                    .is_some_and(|source| source.is::<http_body_util::LengthLimitError>());
                let (code, message) = if too_big {
                    (
                        ErrorCode::PayloadTooLarge,
                        format!("request body: larger than {limit} bytes"),
                    )
                } else {
                    (ErrorCode::Invalid, format!("request body: {e}"))
                };
                return Failure::new(code, message).into_response();
            }
            Ok(Ok(bytes)) => Body::from(bytes),
        }
    } else {
        body
    };
    next.run(Request::from_parts(parts, body)).await
}
