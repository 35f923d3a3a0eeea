//! `skillbox serve` and `skillbox setup`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use skillbox_env::CancellationToken;
use skillbox_server::ServerConfig;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    addr: SocketAddr,
    /// Where the workspace is in every sandbox [default: /workspace]: the code's working
    /// directory, the paths the model and MCP clients are told, collection and
    /// snapshots follow it (beneath /workspace, /home, /srv, /work or /mnt).
    #[arg(long, value_name = "PATH", value_parser = crate::units::parse_root)]
    workspace_root: Option<skillbox_protocol::WorkspaceRoot>,

    /// Runs at once [default: 2 × the number of cores]
    #[arg(long)]
    max_concurrency: Option<usize>,
    /// Runs that may wait for a slot before new ones get 429 [default: 8 × max-concurrency]
    #[arg(long)]
    max_queue: Option<usize>,
    /// The model of agent runs (POST /v1/agent/runs).
    #[arg(long, value_enum, default_value = "loopback")]
    model: crate::agent::Model,
    /// With the loopback model: replay this transcript instead of each skill's own.
    #[arg(long, value_name = "FILE")]
    transcript: Option<std::path::PathBuf>,
    /// Started containers to keep ready per container backend (docker, gvisor) once it
    /// is used, so a run skips the container's create and start; 0 for none.
    #[arg(long, value_name = "N", default_value_t = 2)]
    warm_containers: usize,
    /// Native sandboxes to keep made ahead (for the shape of the last native run), each
    /// with its init started, in its cgroup and locked down, so a run pays only for its
    /// command; 0 for none.
    #[arg(long, value_name = "N", default_value_t = 2)]
    warm_sandboxes: usize,
    /// API keys: a file of `TENANT sha256:HEX` lines (`skillbox keys new` writes them);
    /// SKILLBOX_API_KEYS may add `TENANT=TOKEN` pairs. With keys, every request but
    /// /healthz and the web UI's files (/, /ui/…) needs `Authorization: Bearer TOKEN`;
    /// the UI asks for a key and sends it. With --db, keys are always checked (unless
    /// --insecure-no-auth and no keys here), and those kept in the database
    /// (`skillbox keys new TENANT --db URL`) count too: every node answers them.
    #[arg(long, value_name = "FILE", env = "SKILLBOX_API_KEYS_FILE")]
    api_keys: Option<std::path::PathBuf>,
    /// Serve a non-loopback --addr without API keys: anyone who can reach it runs code.
    #[arg(long)]
    insecure_no_auth: bool,
    /// A name a loopback server also answers in the Host header (repeatable); others get
    /// 403, which stops DNS rebinding from web pages.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Time a client gets to send a request's headers (and an idle connection before it
    /// is closed).
    #[arg(long, value_parser = crate::units::parse_duration, default_value = "10s")]
    header_timeout: std::time::Duration,
    /// Time a client gets to send a request's body.
    #[arg(long, value_parser = crate::units::parse_duration, default_value = "60s")]
    body_timeout: std::time::Duration,
    /// Time a client may take no byte of an answer the server is writing before its
    /// connection is closed (every answer).
    #[arg(long, value_parser = crate::units::parse_duration, default_value = "30s")]
    write_timeout: std::time::Duration,
    /// Open connections at most; more are closed at once.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Open connections of one peer (an IPv4 address, an IPv6 /64) at most; more are
    /// closed at once [default: half of --max-connections, at most 64]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_peer: Option<u32>,
    /// Bytes of request bodies, session file reads and listings, and MCP `read_file` and
    /// `list_dir` answers held in memory at once; past it a request is refused (429, or an MCP tool error) until
    /// some are sent. At least the 48M body limit.
    #[arg(long, value_parser = crate::units::parse_size, default_value = "256M")]
    max_body_bytes_in_flight: u64,
    /// Runs one tenant may have running or waiting [default: 4 × the number of cores]
    #[arg(long, value_name = "N")]
    tenant_max_runs: Option<usize>,
    /// Sessions (/v1/sessions) open at once on this server; one more gets 429.
    #[arg(long, value_name = "N", default_value_t = skillbox_server::SessionConfig::default().bounds.max_total)]
    max_sessions: usize,
    /// Sessions one tenant may have open at once on this server; one more gets 429.
    #[arg(long, value_name = "N", default_value_t = skillbox_server::SessionConfig::default().bounds.max_per_tenant)]
    tenant_max_sessions: usize,
    /// MCP sessions (/mcp) open at once on this server; one more `initialize` gets 429.
    #[arg(long, value_name = "N", default_value_t = skillbox_mcp::SessionBounds::default().max_total)]
    max_mcp_sessions: usize,
    /// MCP sessions one tenant may have open at once; one more `initialize` gets 429.
    #[arg(long, value_name = "N", default_value_t = skillbox_mcp::SessionBounds::default().max_per_tenant)]
    tenant_max_mcp_sessions: usize,
    /// Disk of each run's /workspace and /tmp together (512M, 2G): the default, and the
    /// most a request's limits.diskBytes may ask for; none: no bound unless a request
    /// asks for one.
    #[arg(long, value_parser = crate::units::parse_size_bound, default_value = "1G")]
    disk: crate::units::Bound,
    /// Files and directories of each run's /workspace and /tmp together [default: one per
    /// 16K of --disk, where the backend can hold it (not gvisor)]
    #[arg(long, value_name = "N")]
    inodes: Option<u64>,
    /// Where artifacts and snapshots' files are kept: `s3://BUCKET/PREFIX` (credentials,
    /// region and AWS_ENDPOINT_URL from the usual AWS_* variables) or `file:///DIR`
    /// [default: DATA_DIR/objects]. Several servers may share one bucket.
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Where records are kept (runs, agent runs, objects' owners, snapshots):
    /// `postgres://USER:PASSWORD@HOST:PORT/DB` [default: SQLite files in DATA_DIR];
    /// `?sslmode=require` for TLS, the server's certificate verified against the web
    /// roots and `&sslrootcert=CA.pem`. Several servers may share one database, each
    /// with its own --node.
    #[arg(long, value_name = "URL", env = "SKILLBOX_DB", hide_env_values = true)]
    db: Option<String>,
    /// This server's name among those sharing a --db (letters, digits, `-` and `_`, at
    /// most 63): the runs it left running when it stopped are the ones it closes when
    /// it starts, and its sessions' ids name it [default: the host name].
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// With --db: the URL the other servers reach this one at, to forward requests
    /// for its sessions [default: http:// and --addr, which must then not be 0.0.0.0].
    #[arg(long, value_name = "URL")]
    advertise: Option<String>,
    /// With --db: how long another node may be silent before this one takes it for
    /// dead and records its running agent runs failed (30s, 2m).
    #[arg(long, value_parser = crate::units::parse_duration, default_value = "30s")]
    node_silence: std::time::Duration,
    /// Bytes the artifact store keeps (or none): a run whose files would take it past
    /// fails (507 quota_exceeded), and retention removes the oldest objects past it.
    /// With --db, one count for every server sharing the database and the store (give
    /// each the same).
    #[arg(long, value_parser = crate::units::parse_size_bound, default_value = "10G")]
    store_budget: crate::units::Bound,
    /// Scopes (`scopeKey`) one tenant keeps snapshots of; a run's save to a new scope
    /// past it is refused (the run stands, `snapshot.error` says why). A scope unused
    /// for `--retain` is forgotten.
    #[arg(long, value_name = "N", default_value_t = skillbox_store::DEFAULT_SCOPES_PER_TENANT)]
    tenant_max_scopes: usize,
    /// How long an artifact is kept (7d, 12h, or none).
    #[arg(long, value_parser = parse_age, default_value = "7d")]
    retain: Age,
    /// How long the record of an ended agent run, or a plain run's summary, is kept (or
    /// none).
    #[arg(long, value_parser = parse_age, default_value = "30d")]
    retain_records: Age,
    /// Serve the capabilities under DIR (`DIR/<name>/manifest.yaml`; repeatable, loaded
    /// in order) at /v1/capabilities. None by default.
    #[arg(long = "capabilities", value_name = "DIR")]
    capability_roots: Vec<PathBuf>,
    /// The project: whose grants the capabilities run under (as `skillbox cap --project`
    /// names it; grant them there with `skillbox cap`), and whose skills (skills/,
    /// .skills-cache/) a run's `skills` may name [default for capabilities: the current
    /// directory; without it, runs name no workspace skill]
    #[arg(long, value_name = "DIR")]
    project: Option<PathBuf>,
    /// Also trust the CA certificates in FILE (PEM; at most 100 and 1 MiB) when the
    /// egress proxy opens TLS to the host of a run's secret: for private APIs whose
    /// certificates an internal CA signed. The public web roots stay trusted. Native,
    /// docker and gvisor runs.
    #[arg(long = "egress-ca", value_name = "FILE")]
    egress_ca: Option<PathBuf>,
}

/// A retention age, or none.
#[derive(Debug, Clone, Copy)]
pub struct Age(Option<std::time::Duration>);

fn parse_age(text: &str) -> Result<Age, String> {
    if text == "none" {
        return Ok(Age(None));
    }
    match text.strip_suffix('d') {
        Some(days) => days
            .parse::<u64>()
            .map(|d| Age(Some(std::time::Duration::from_secs(d * 24 * 3600))))
            .map_err(|_| format!("{text:?} is not an age (try 7d, 12h, or none)")),
        None => crate::units::parse_duration(text).map(|d| Age(Some(d))),
    }
}

/// The keys of `--api-keys` and SKILLBOX_API_KEYS together; `None` when neither gives any.
fn api_keys(file: Option<&Path>) -> Result<Option<skillbox_server::ApiKeys>, String> {
    let mut keys = skillbox_server::ApiKeys::default();
    if let Some(path) = file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--api-keys {}: {e}", path.display()))?;
        keys.extend(skillbox_server::ApiKeys::parse(
            &text,
            &path.display().to_string(),
        )?);
        if keys.is_empty() {
            return Err(format!("--api-keys {}: holds no key", path.display()));
        }
    }
    if let Some(pairs) = std::env::var_os("SKILLBOX_API_KEYS").filter(|v| !v.is_empty()) {
        let pairs = pairs
            .into_string()
            .map_err(|_| "SKILLBOX_API_KEYS: not UTF-8".to_string())?;
        keys.extend(skillbox_server::ApiKeys::from_pairs(&pairs)?);
    }
    Ok((!keys.is_empty()).then_some(keys))
}

/// The capability roots, each a directory, and the project their grants hold in
/// (canonical, as `skillbox cap --project` makes it); none without roots.
fn capabilities(
    roots: &[PathBuf],
    project: Option<&Path>,
) -> Result<skillbox_server::CapabilityConfig, String> {
    if roots.is_empty() {
        return Ok(skillbox_server::CapabilityConfig::default());
    }
    let mut checked = Vec::with_capacity(roots.len());
    for root in roots {
        let real = root
            .canonicalize()
            .map_err(|e| format!("--capabilities {}: {e}", root.display()))?;
        if !real.is_dir() {
            return Err(format!(
                "--capabilities {}: not a directory",
                root.display()
            ));
        }
        checked.push(real);
    }
    let project = match project {
        Some(dir) => dir.to_path_buf(),
        None => std::env::current_dir().map_err(|e| format!("the current directory: {e}"))?,
    };
    let project = project
        .canonicalize()
        .map_err(|e| format!("--project {}: {e}", project.display()))?;
    Ok(skillbox_server::CapabilityConfig {
        roots: checked,
        project,
    })
}

pub async fn serve(args: ServeArgs, data_dir: &Path) -> ExitCode {
    // Native sandboxes are cloned by a small copy of this program, not by the server,
    // whose address space each clone would copy. Without it they are cloned here, as
    // the one-shot commands do: slower, nothing weaker.
    // (`/proc/self/exe` still names this program after an upgrade replaced its file.)
    match skillbox_native::spawner_process::start(Path::new("/proc/self/exe"), &[]) {
        Ok(pid) => tracing::debug!(pid, "the spawner process started"),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot start the spawner process; native sandboxes are cloned by the server"
        ),
    }
    let keys = match api_keys(args.api_keys.as_deref()) {
        Ok(keys) => keys,
        Err(e) => {
            eprintln!("skillbox serve: {e}");
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    let mut config = ServerConfig {
        addr: args.addr,
        insecure_no_auth: args.insecure_no_auth,
        allowed_hosts: args.allowed_hosts.clone(),
        header_timeout: args.header_timeout,
        body_timeout: args.body_timeout,
        write_timeout: args.write_timeout,
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer.map(|n| n as usize),
        ..ServerConfig::default()
    };
    let least = config.body_limit;
    config.max_body_bytes_in_flight = match usize::try_from(args.max_body_bytes_in_flight) {
        Ok(bytes) if bytes >= least => bytes,
        _ => {
            eprintln!(
                "skillbox serve: --max-body-bytes-in-flight: at least the body limit, {least} bytes (48M), or no request body could ever be held"
            );
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    if let Some(keys) = keys {
        eprintln!(
            "skillbox serve: {} API key(s); requests need `Authorization: Bearer TOKEN`",
            keys.len()
        );
        config.keys = Some(Arc::new(keys));
    } else if args.insecure_no_auth && !args.addr.ip().is_loopback() {
        eprintln!(
            "skillbox serve: WARNING: no authentication on {}: anyone who can reach it can run code on this machine",
            args.addr
        );
    }
    if let Some(n) = args.tenant_max_runs {
        config.tenant_max_runs = n.max(1);
    }
    config.sessions.bounds.max_total = args.max_sessions.max(1);
    config.sessions.bounds.max_per_tenant = args.tenant_max_sessions.max(1);
    let mcp_sessions = skillbox_mcp::SessionBounds {
        max_total: args.max_mcp_sessions.max(1),
        max_per_tenant: args.tenant_max_mcp_sessions.max(1),
    };
    config.retention = skillbox_store::Retention {
        max_bytes: args.store_budget.0,
        max_age: args.retain.0,
    };
    config.records_max_age = args.retain_records.0;
    if args.node_silence < std::time::Duration::from_secs(1) {
        eprintln!("skillbox serve: --node-silence must be at least 1s");
        return ExitCode::from(crate::EXIT_USAGE);
    }
    config.node_silence = args.node_silence;
    if args.db.is_some() && args.advertise.is_none() && args.addr.ip().is_unspecified() {
        eprintln!(
            "skillbox serve: --db with --addr {}: give --advertise URL, where the other \
             servers reach this one (http://HOST:PORT)",
            args.addr
        );
        return ExitCode::from(crate::EXIT_USAGE);
    }
    if let Some(url) = &args.advertise
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        eprintln!("skillbox serve: --advertise {url}: an http:// or https:// URL");
        return ExitCode::from(crate::EXIT_USAGE);
    }
    config.advertise = args.advertise.clone();
    config.capabilities = match capabilities(&args.capability_roots, args.project.as_deref()) {
        Ok(capabilities) => capabilities,
        Err(e) => {
            eprintln!("skillbox serve: {e}");
            return ExitCode::from(crate::EXIT_USAGE);
        }
    };
    // With --db the database's keys are checked (the server's start adds them).
    if config.keys.is_none()
        && args.db.is_none()
        && !args.insecure_no_auth
        && !args.addr.ip().is_loopback()
    {
        eprintln!(
            "skillbox serve: {} is not a loopback address and no API keys are set: anyone who \
             can reach it could run code here. Give keys (--api-keys FILE, made with \
             `skillbox keys new TENANT --file FILE`), bind 127.0.0.1, or pass --insecure-no-auth",
            args.addr
        );
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let mut runner_config = skillbox_run::RunnerConfig {
        warm_containers: args.warm_containers,
        warm_native: args.warm_sandboxes,
        // serve waits for them at shutdown (runner.shutdown()).
        detach_cleanup: true,
        ..skillbox_run::RunnerConfig::new(data_dir)
    };
    runner_config.limits.disk_bytes = args.disk.0;
    if let Some(root) = &args.workspace_root {
        runner_config.door.root = root.clone();
    }
    runner_config.store_budget = args.store_budget.0;
    runner_config.store_url = args.store.clone();
    runner_config.db_url = args.db.clone();
    runner_config.snapshots.scopes_per_tenant = args.tenant_max_scopes.max(1);
    if let Some(project) = &args.project {
        match project.canonicalize() {
            Ok(dir) if dir.is_dir() => runner_config.skills_workspace = Some(dir),
            _ => {
                eprintln!(
                    "skillbox serve: --project {}: not a directory",
                    project.display()
                );
                return ExitCode::from(crate::EXIT_USAGE);
            }
        }
    }
    if let Some(path) = &args.egress_ca {
        match skillbox_egress::UpstreamRoots::read(path) {
            Ok(roots) => {
                eprintln!(
                    "skillbox serve: the egress proxy also trusts the {} certificate(s) of {} upstream",
                    roots.len(),
                    path.display()
                );
                runner_config.upstream_roots = roots;
            }
            Err(e) => {
                eprintln!("skillbox serve: --egress-ca {}: {e}", path.display());
                return ExitCode::from(crate::EXIT_USAGE);
            }
        }
    }
    runner_config.limits.disk_inodes = args.inodes;
    if let Err(e) = runner_config.limits.validate() {
        eprintln!("skillbox serve: --disk/--inodes: {e}");
        return ExitCode::from(crate::EXIT_USAGE);
    }
    let runner = match crate::local::runner_with(runner_config, true).await {
        Ok(runner) => Arc::new(runner),
        Err(e) => {
            eprintln!("skillbox serve: {e}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    };
    // What a killed server left (sandbox dirs, cgroups, containers) goes now, beside
    // the first requests, not when a run first uses that backend.
    tokio::spawn({
        let runner = runner.clone();
        async move { runner.backends().sweep_leftovers().await }
    });
    if let Some(n) = args.max_concurrency {
        if n == 0 {
            eprintln!("skillbox serve: --max-concurrency must be at least 1");
            return ExitCode::from(crate::EXIT_USAGE);
        }
        config.max_concurrency = n;
        config.max_queue = n * 8;
    }
    if let Some(n) = args.max_queue {
        config.max_queue = n;
    }
    let model = match (args.model, &args.transcript) {
        (crate::agent::Model::Loopback, Some(path)) => {
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(e) => {
                    eprintln!("skillbox serve: --transcript {}: {e}", path.display());
                    return ExitCode::from(crate::EXIT_USAGE);
                }
            };
            if let Err(e) = skillbox_agent::LoopbackProvider::from_json(&text) {
                eprintln!("skillbox serve: --transcript {}: {e}", path.display());
                return ExitCode::from(crate::EXIT_USAGE);
            }
            skillbox_server::AgentModel::Transcript(text)
        }
        (crate::agent::Model::Openai, Some(_)) => {
            eprintln!("skillbox serve: --transcript goes with --model loopback");
            return ExitCode::from(crate::EXIT_USAGE);
        }
        (crate::agent::Model::Loopback, None) => skillbox_server::AgentModel::Loopback,
        (crate::agent::Model::Openai, None) => {
            match skillbox_agent::openai::OpenAiConfig::from_env() {
                Ok(config) => skillbox_server::AgentModel::OpenAi(config),
                Err(e) => {
                    eprintln!("skillbox serve: --model openai: {e}");
                    return ExitCode::from(crate::EXIT_USAGE);
                }
            }
        }
    };
    let node = match &args.node {
        Some(node) if !is_node_name(node) => {
            eprintln!(
                "skillbox serve: --node {node:?}: letters, digits, `-` and `_`, 1 to 63 of them"
            );
            return ExitCode::from(crate::EXIT_USAGE);
        }
        Some(node) => node.clone(),
        None => {
            node_of_host(&std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default())
        }
    };
    match skillbox_server::AgentRuns::open(runner.records(), &node, model, config.max_concurrency)
        .await
    {
        Ok(agents) => config.agents = Some(agents),
        Err(e) => {
            eprintln!("skillbox serve: agent runs: {e}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    }
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(_) => return,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        trigger.cancel();
    });
    if !config.capabilities.roots.is_empty() {
        eprintln!(
            "skillbox serve: capabilities from {} with the grants of project {} (host capabilities are listed, never run over HTTP)",
            config
                .capabilities
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            config.capabilities.project.display()
        );
    }
    eprintln!(
        "skillbox serve: listening on http://{} (the web UI at /; POST /v1/run, /mcp, GET /openapi.json)",
        config.addr
    );
    let (png, why) = skillbox_server::preview_report();
    if !png {
        eprintln!("skillbox serve: slide previews are text outlines: {why}");
    }
    let mcp = Box::new(move |state: &skillbox_server::AppState| {
        vec![crate::serve_mcp::extension(state, mcp_sessions)]
    });
    let served = skillbox_server::serve_with(config, runner.clone(), shutdown, mcp).await;
    // Containers of runs that were still in flight go with the server.
    runner.shutdown().await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skillbox serve: {}: {e}", args.addr);
            ExitCode::from(crate::EXIT_SETUP_FAILED)
        }
    }
}

/// Installs what runs need, with progress; later runs start at once.
/// `skillbox setup`.
#[derive(Debug, Args)]
pub struct SetupArgs {
    /// Leave the wasm guests out (they take a download, a C build and a compile).
    #[arg(long)]
    no_wasm: bool,
}

/// The installer of the wasm guests (pinned downloads, checked by SHA-256, and a
/// QuickJS build), run with bash.
const WASM_GUESTS_SCRIPT: &str = include_str!("../../../scripts/wasm-guests.sh");

pub async fn setup(args: SetupArgs, data_dir: &Path) -> ExitCode {
    let runner = match crate::local::runner(data_dir, true).await {
        Ok(runner) => runner,
        Err(e) => {
            eprintln!("skillbox setup: {e}");
            return ExitCode::from(crate::EXIT_SETUP_FAILED);
        }
    };
    eprintln!(
        "skillbox setup: node runtime at {}",
        runner.node_runtime().node_modules().display()
    );
    let native = skillbox_native::probe();
    if native.available {
        eprintln!("skillbox setup: native sandbox available");
    } else {
        eprintln!(
            "skillbox setup: native sandbox unavailable: {}",
            native.reason.unwrap_or_default()
        );
    }
    if args.no_wasm {
        return ExitCode::SUCCESS;
    }
    match setup_wasm(data_dir).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("skillbox setup: wasm guests: {e}");
            ExitCode::from(crate::EXIT_SETUP_FAILED)
        }
    }
}

/// Installs the wasm guests (or finds them up to date) and compiles each for this host.
async fn setup_wasm(data_dir: &Path) -> Result<(), String> {
    let home = skillbox_wasm::default_home(data_dir);
    let guests = home.join("guests");
    // The script as an argument, not on stdin: a step that reads stdin (a prompt)
    // must not swallow the rest of the script.
    let mut child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(WASM_GUESTS_SCRIPT)
        .arg("wasm-guests.sh")
        .arg(&guests)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start bash: {e}"))?;
    let status = child.wait().await.map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!(
            "the installer failed ({status}); its messages are above"
        ));
    }
    let backend = skillbox_wasm::WasmBackend::new(
        skillbox_wasm::WasmConfig {
            home,
            runner: skillbox_wasm::runner::guest_runner(),
        },
        Arc::new(skillbox_native::NativeBackend::new(data_dir)),
    );
    let names: Vec<String> = backend
        .guests()
        .map_err(|e| e.to_string())?
        .guests
        .iter()
        .map(|g| g.name.clone())
        .collect();
    eprintln!(
        "skillbox setup: compiling the wasm guests for this host ({}; once, a few seconds each)",
        names.join(", ")
    );
    for (name, fresh) in backend.precompile().await.map_err(|e| e.to_string())? {
        let how = if fresh {
            "compiled"
        } else {
            "already compiled"
        };
        eprintln!("skillbox setup: wasm guest {name}: {how}");
    }
    Ok(())
}

/// What `--node` takes: 1 to 63 letters, digits, `-` and `_`.
fn is_node_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The default `--node`: the host name made a node name (its first label, any other
/// character `-`, at most 63), or `local` when nothing is left of it (a machine whose
/// host name was never set reads `(none)`).
fn node_of_host(host: &str) -> String {
    let label = host.trim().split('.').next().unwrap_or_default();
    let name: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    let name = name.trim_matches('-');
    if name.is_empty() {
        "local".into()
    } else {
        name.to_string()
    }
}

#[cfg(test)]
mod node_name_tests {
    use super::*;

    /// Whatever the host name, the default is a node name: serve never refuses to
    /// start for it (a VM without one reads `(none)`).
    #[test]
    fn every_host_name_gives_a_node_name() {
        for (host, node) in [
            ("worker-7\n", "worker-7"),
            ("worker-7.eu.internal", "worker-7"),
            ("(none)\n", "none"),
            ("", "local"),
            ("((()))", "local"),
            ("ünïcode", "n-code"),
        ] {
            assert_eq!(node_of_host(host), node, "{host:?}");
            assert!(is_node_name(&node_of_host(host)), "{host:?}");
        }
        assert!(is_node_name(&node_of_host(&"a".repeat(200))));
        assert!(!is_node_name("a b") && !is_node_name("") && !is_node_name(&"a".repeat(64)));
    }
}
