//! `GET /v1/capabilities` and `POST /v1/capabilities/{name}/run`: the capabilities under
//! the server's roots, read from disk at each request as `skillbox cap` reads them, and
//! one call of one through the router, with the server's backends, the grants of its
//! data dir and its artifact store.
//!
//! Grants belong to a project, as in the CLI, not to a tenant: every tenant sees and uses
//! the same ones, and none can be given over HTTP. A `host` capability runs with no
//! boundary, as the server's user: it is listed, but never run from here, whatever is
//! granted.
//!
//! Persistent capabilities are started here too (`POST /v1/capabilities/{name}/start`)
//! and supervised by the server until stopped (`POST /v1/services/{name}/stop`) or the
//! server shuts down; `GET /v1/services` lists them with the records of those the CLI
//! started in the same project.

use std::path::PathBuf;

use axum::extract::{Path, Request, State};
use axum::{Extension, Json};
use base64::Engine;
use skillbox_capability::{
    Capability, CapabilityCall, CapabilityRegistry, Environment, Scope, TrustStore,
};
use skillbox_env::ExecOutput;
use skillbox_protocol::{
    ApiError, ArtifactInfo, CapabilityInfo, CapabilityList, CapabilityRun, CapabilityRunRequest,
    Encoding, ErrorCode, ServiceInfo, ServiceList,
};

use crate::auth::Tenant;
use crate::error::Failure;
use crate::runs::{admit, grant, read_json};
use crate::state::{AppState, Gauge};

/// Where the server's capabilities come from, and whose grants they run under.
#[derive(Debug, Clone, Default)]
pub struct CapabilityConfig {
    /// Roots loaded in order, each holding `<name>/manifest.yaml` (`--capabilities`);
    /// none: no capability.
    pub roots: Vec<PathBuf>,
    /// The project their grants hold in (`--project`, canonical): the one
    /// `skillbox cap --project` names.
    pub project: PathBuf,
}

impl CapabilityConfig {
    /// The `skillbox cap` flags that name this project and these roots.
    fn cli_flags(&self) -> String {
        let mut flags = format!("--project {}", self.project.display());
        for root in &self.roots {
            flags.push_str(&format!(" --root {}", root.display()));
        }
        flags
    }
}

/// Runs `work` off the async workers (it reads the filesystem).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        Failure::new(
            ErrorCode::Unknown,
            format!("reading the capabilities failed: {e}"),
        )
    })
}

async fn listed(
    registry: &CapabilityRegistry,
    trust: &TrustStore,
    project: &std::path::Path,
) -> CapabilityList {
    let mut unreadable = None;
    let mut capabilities = Vec::new();
    for c in registry.iter() {
        let grant = match trust.standing(c, project).await {
            Ok(standing) => standing.describe().to_string(),
            Err(e) => {
                unreadable.get_or_insert(e.message);
                "unknown".to_string()
            }
        };
        capabilities.push(CapabilityInfo {
            name: c.name().to_string(),
            description: c.manifest.description.clone(),
            version: c.manifest.version.clone(),
            environment: c.manifest.environment,
            lifecycle: c.manifest.lifecycle.as_str().to_string(),
            grant,
        });
    }
    let mut errors: Vec<String> = registry.errors().iter().map(ToString::to_string).collect();
    errors.extend(unreadable);
    CapabilityList {
        capabilities,
        errors,
    }
}

/// The capabilities this server knows, with where each stands in its project, and each
/// that did not load and why (as `skillbox cap list --json`).
#[utoipa::path(
    get,
    path = "/v1/capabilities",
    responses(
        (status = 200, description = "Every capability that loaded, by name, and what did not", body = CapabilityList),
    )
)]
pub(crate) async fn list(State(state): State<AppState>) -> Result<Json<CapabilityList>, Failure> {
    let config = state.config.capabilities.clone();
    let roots = config.roots.clone();
    let registry = blocking(move || CapabilityRegistry::load(&roots)).await?;
    Ok(Json(listed(&registry, &state.trust, &config.project).await))
}

/// The call a request asks for: its stdin decoded, its files checked as `POST /v1/run`
/// checks them (stdin counts in their 32 MiB).
fn call_of(request: CapabilityRunRequest) -> Result<CapabilityCall, Failure> {
    let invalid = |message: String| Failure::new(ErrorCode::Invalid, message);
    if let Some(at) = request.args.iter().position(|a| a.contains('\0')) {
        return Err(invalid(format!("args[{at}]: contains a NUL byte")));
    }
    let stdin = match request.stdin {
        None => None,
        Some(text) => Some(match request.stdin_encoding {
            Encoding::Utf8 => text.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|e| invalid(format!("stdin: not valid base64: {e}")))?,
        }),
    };
    let inputs = skillbox_run::check_files(request.files, stdin.as_ref().map_or(0, Vec::len))?;
    Ok(CapabilityCall {
        args: request.args,
        inputs,
        stdin,
    })
}

/// The capability `name` under the server's roots; a host one is refused (before the
/// trust check, so that a `once` grant meant for the CLI stays).
async fn sandboxed(
    config: &CapabilityConfig,
    name: &str,
    verb: &str,
) -> Result<Capability, Failure> {
    let roots = config.roots.clone();
    let registry = blocking(move || CapabilityRegistry::load(&roots)).await?;
    let capability: Capability = registry
        .get(name)
        .cloned()
        .ok_or_else(|| Failure::new(ErrorCode::NotFound, registry.missing(name)))?;
    if capability.manifest.environment == Environment::Host {
        let flags = config.cli_flags();
        return Err(Failure::new(
            ErrorCode::PermissionDenied,
            format!(
                "{name} runs on the host, with no boundary, as the server's user: this server \
                 never runs a host capability over HTTP, whatever is granted; on the server's \
                 machine, `skillbox cap {flags} grant {name} --scope once` then \
                 `skillbox cap {flags} {verb} {name}` runs it once"
            ),
        ));
    }
    Ok(capability)
}

/// A refusal of the trust check, with where the server's grants come from.
fn with_grant_hint(e: skillbox_env::EnvError, config: &CapabilityConfig) -> Failure {
    match e.code {
        ErrorCode::PermissionDenied => Failure::new(
            e.code,
            format!(
                "{}; this server's grants are those of `skillbox cap {}` on its machine",
                e.message,
                config.cli_flags()
            ),
        ),
        _ => e.into(),
    }
}

/// Run a capability once (`oneshot`, `ondemand`) in its declared environment, if the
/// server's project grants it.
///
/// Admitted like `POST /v1/run` (the tenant's bound, a run slot or the queue, the body
/// budget). What comes back is what its `write_file` permissions name, stored like a
/// run's artifacts and downloadable by this tenant.
#[utoipa::path(
    post,
    path = "/v1/capabilities/{name}/run",
    params(("name" = String, Path, description = "The capability's name")),
    request_body = CapabilityRunRequest,
    responses(
        (status = 200, description = "It ran (it may have failed or hit a limit)", body = CapabilityRun),
        (status = 400, description = "Bad request: the message names the field", body = ApiError),
        (status = 403, description = "Not granted in the server's project, denied there, or a host capability (never run over HTTP); the message names the grant and the `skillbox cap` command", body = ApiError),
        (status = 404, description = "No such capability; the message says why one of that name did not load", body = ApiError),
        (status = 413, description = "Body too large", body = ApiError),
        (status = 415, description = "Not `Content-Type: application/json`", body = ApiError),
        (status = 429, description = "Too many runs queued; retry after Retry-After", body = ApiError),
        (status = 501, description = "A persistent capability: it is started, not run", body = ApiError),
        (status = 503, description = "Its environment is not available here (a docker capability with no daemon); never run in another", body = ApiError),
    )
)]
pub(crate) async fn run(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Json<CapabilityRun>, Failure> {
    let (parts, body) = request.into_parts();
    let config = state.config.capabilities.clone();
    let capability = sandboxed(&config, &name, "run").await?;
    let admission = admit(&state, &tenant, &parts.headers).await?;
    let request: CapabilityRunRequest =
        read_json(body, state.config.body_limit, state.config.body_timeout).await?;
    let cancel = state.runs_cancel().child_token();
    Ok(Json(
        call(
            &state, &tenant, name, capability, admission, request, cancel,
        )
        .await?,
    ))
}

/// The capabilities an extension's call (MCP's `run_capability`) may run: none without
/// `--capabilities`, else those that load and could be run over HTTP (not `host`, not
/// persistent).
pub(crate) async fn runnable(state: &AppState) -> Option<Vec<String>> {
    let roots = state.config.capabilities.roots.clone();
    if roots.is_empty() {
        return None;
    }
    blocking(move || {
        CapabilityRegistry::load(&roots)
            .iter()
            .filter(|c| {
                c.manifest.environment != Environment::Host
                    && c.manifest.lifecycle != skillbox_capability::Lifecycle::Persistent
            })
            .map(|c| c.name().to_string())
            .collect()
    })
    .await
    .ok()
}

/// An extension's call of a capability (MCP's `run_capability`): the checks and
/// admission of `POST /v1/capabilities/{name}/run`, with the input bytes the call carries.
pub(crate) async fn run_for_extension(
    state: &AppState,
    tenant: &Tenant,
    name: &str,
    request: CapabilityRunRequest,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<CapabilityRun, Failure> {
    let capability = sandboxed(&state.config.capabilities, name, "run").await?;
    let bytes = request.stdin.as_ref().map_or(0, String::len)
        + request.files.iter().map(|f| f.content.len()).sum::<usize>();
    let admission = crate::runs::admit_bytes(state, tenant, bytes).await?;
    call(
        state,
        tenant,
        name.to_string(),
        capability,
        admission,
        request,
        cancel,
    )
    .await
}

/// One admitted call of `capability` for `tenant`, cancelled by `cancel`.
async fn call(
    state: &AppState,
    tenant: &Tenant,
    name: String,
    capability: Capability,
    admission: crate::runs::Admission,
    request: CapabilityRunRequest,
    cancel: tokio_util::sync::CancellationToken,
) -> Result<CapabilityRun, Failure> {
    let config = state.config.capabilities.clone();
    let call = call_of(request)?;
    // As for `POST /v1/run`: the call lives in its own task, and a client that goes
    // away cancels it, which still ends it properly and removes its sandbox.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let runner = state.runner.clone();
    let trust = state.trust.clone();
    let metrics = state.metrics.clone();
    let project = config.project.clone();
    let task = tokio::spawn(async move {
        let _running = Gauge::up(&metrics.in_flight);
        let ran = skillbox_capability::run(
            &capability,
            call,
            &project,
            &trust,
            runner.backends(),
            runner.collect_limits(),
            &cancel,
        )
        .await;
        let stored = match ran {
            Ok(outcome) => skillbox_store::store_all(runner.store(), outcome.files)
                .await
                .map(|files| Ok((outcome.scope, outcome.output, files))),
            Err(e) => Ok(Err(e)),
        };
        drop(admission);
        stored
    });
    let (scope, output, stored): (Scope, ExecOutput, _) = task
        .await
        .map_err(|e| Failure::new(ErrorCode::Unknown, format!("the call failed: {e}")))??
        .map_err(|e| with_grant_hint(e, &config))?;
    let files: Vec<ArtifactInfo> = stored
        .into_iter()
        .map(|a| ArtifactInfo {
            url: skillbox_run::object_url(&a.sha256, &a.path),
            path: a.path,
            size: a.size,
            sha256: a.sha256,
            content_type: a.content_type,
        })
        .collect();
    grant(state, tenant, &files).await?;
    Ok(CapabilityRun {
        capability: name,
        grant: scope.as_str().to_string(),
        output,
        files,
    })
}

/// Start a persistent capability in its declared environment, if the server's project
/// grants it, and answer once something answers at its endpoint.
///
/// The server supervises it until it is stopped or the server shuts down: its clients
/// connect to `endpoint`, a unix socket on the server's machine that only the server's
/// user may open, which the server forwards into the sandbox (which keeps no network
/// of its own). If it ends by itself it is `failed` and stays down.
#[utoipa::path(
    post,
    path = "/v1/capabilities/{name}/start",
    params(("name" = String, Path, description = "The capability's name")),
    responses(
        (status = 200, description = "It is ready", body = ServiceInfo),
        (status = 400, description = "Not a persistent capability (it is run instead)", body = ApiError),
        (status = 403, description = "Not granted in the server's project, denied there, or a host capability", body = ApiError),
        (status = 404, description = "No such capability; the message says why one of that name did not load", body = ApiError),
        (status = 409, description = "Already started (by this server or by `skillbox cap start`)", body = ApiError),
        (status = 429, description = "The server runs as many services as it takes, in all (32) or for this tenant (8)", body = ApiError),
        (status = 501, description = "A persistent capability in an environment that cannot serve yet", body = ApiError),
        (status = 503, description = "It did not become ready (how it ended is in the message and in GET /v1/services/{name}), or its environment is not available here", body = ApiError),
    )
)]
pub(crate) async fn start(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(name): Path<String>,
) -> Result<Json<ServiceInfo>, Failure> {
    let config = state.config.capabilities.clone();
    let capability = sandboxed(&config, &name, "start").await?;
    let info = state
        .services
        .start(
            &capability,
            &config.project,
            &state.trust,
            state.runner.backends(),
            None,
            Some(tenant.as_str()),
        )
        .await
        .map_err(|e| match e.code {
            // The server's bound on services, in all or for this tenant.
            ErrorCode::ResourceExhausted => Failure::new(ErrorCode::Overloaded, e.message),
            _ => with_grant_hint(e, &config),
        })?;
    Ok(Json(info))
}

/// What a tenant may see of a service: only one this server started for it (the CLI's
/// and other tenants' are not its business, and their stderr may hold secrets).
fn theirs(state: &AppState, tenant: &Tenant, info: &ServiceInfo) -> bool {
    info.owner == state.services_owner() && info.tenant.as_deref() == Some(tenant.as_str())
}

/// The persistent capabilities this server started for the calling tenant.
#[utoipa::path(
    get,
    path = "/v1/services",
    responses(
        (status = 200, description = "Every service, by name", body = ServiceList),
    )
)]
pub(crate) async fn services(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
) -> Result<Json<ServiceList>, Failure> {
    let table = state.services.clone();
    let services = blocking(move || table.list())
        .await?
        .into_iter()
        .filter(|info| theirs(&state, &tenant, info))
        .collect();
    Ok(Json(ServiceList { services }))
}

/// One service.
#[utoipa::path(
    get,
    path = "/v1/services/{name}",
    params(("name" = String, Path, description = "The capability's name")),
    responses(
        (status = 200, description = "Where it stands; for a failed one, how it ended and the tail of its stderr", body = ServiceInfo),
        (status = 404, description = "Not started in this project", body = ApiError),
    )
)]
pub(crate) async fn service(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(name): Path<String>,
) -> Result<Json<ServiceInfo>, Failure> {
    let table = state.services.clone();
    let looked = name.clone();
    blocking(move || table.status(&looked))
        .await?
        .filter(|info| theirs(&state, &tenant, info))
        .map(Json)
        .ok_or_else(|| {
            Failure::new(
                ErrorCode::NotFound,
                format!("{name} is not started in this server's project"),
            )
        })
}

/// Stop a service and everything it started; a failed one is cleared.
#[utoipa::path(
    post,
    path = "/v1/services/{name}/stop",
    params(("name" = String, Path, description = "The capability's name")),
    responses(
        (status = 200, description = "Stopped (or cleared); as it was last seen", body = ServiceInfo),
        (status = 404, description = "Not started in this project", body = ApiError),
    )
)]
pub(crate) async fn stop(
    State(state): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(name): Path<String>,
) -> Result<Json<ServiceInfo>, Failure> {
    let not_found = || {
        Failure::new(
            ErrorCode::NotFound,
            format!("{name} is not started in this server's project"),
        )
    };
    let table = state.services.clone();
    let looked = name.clone();
    let seen = blocking(move || table.status(&looked)).await?;
    if !seen.is_some_and(|info| theirs(&state, &tenant, &info)) {
        return Err(not_found());
    }
    // Only what this server supervises: never a signal to another process.
    state
        .services
        .stop_own(&name)
        .await
        .map(Json)
        .ok_or_else(not_found)
}
