//! The runner: validate a `RunRequest`, run it in a fresh sandbox, collect and store the
//! files it made, clean up. Limits hit by the script are results, not errors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use skillbox_door::DoorConfig;
use skillbox_env::{
    BackendKind, CancellationToken, EnvError, ErrorCode, ExecRequest, ExecutionEnv, Limits, Mount,
    SandboxPolicy, SandboxSpec,
};
use skillbox_protocol::{
    ArtifactInfo, Encoding, FileInput, Language, MAX_TIMEOUT_MS, OutputSelection, PlacedSkill,
    RunRequest, RunResult, SkillsPlaced, SnapshotReport, WorkspacePath, WorkspaceRoot,
};
use skillbox_registry::{BackendRegistry, RegistryConfig};
use skillbox_skills::{HashCache, Projection, ProjectionConfig, Skill, SkillSet, Sources};
use skillbox_store::{
    ArtifactStore, CollectLimits, RecordsDb, SnapshotLimits, Snapshots, store_all,
};

use crate::runtime::{NodeRuntime, RuntimeError};

/// Where the preinstalled Node packages appear (Node walks up to it from /workspace).
pub const NODE_MODULES: &str = "/node_modules";
/// Inputs and the script together.
const MAX_INPUT_BYTES: usize = 32 * 1024 * 1024;
const MAX_FILES: usize = 1000;

/// Why a run did not happen. Each maps to a stable code (and an HTTP status).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The request is wrong; the message names the field.
    #[error("{0}")]
    Invalid(String),
    /// What the run needs is not there (a backend, the runtime); says how to fix it.
    #[error("{0}")]
    Unavailable(String),
    /// The run was cancelled.
    #[error("run cancelled")]
    Aborted,
    /// The run made more than may be kept.
    #[error("{0}")]
    TooLarge(String),
    /// The run's time went by before its script could start (restoring its scope,
    /// placing its skills).
    #[error("{0}")]
    Timeout(String),
    /// What the run made would take the artifact store past its budget; none of it
    /// was kept.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error("{0}")]
    Internal(String),
}

impl RunError {
    /// The code on the wire.
    pub fn code(&self) -> ErrorCode {
        match self {
            RunError::Invalid(_) => ErrorCode::Invalid,
            RunError::Unavailable(_) => ErrorCode::Unavailable,
            RunError::Aborted => ErrorCode::Aborted,
            RunError::TooLarge(_) => ErrorCode::ResourceExhausted,
            RunError::Timeout(_) => ErrorCode::Timeout,
            RunError::QuotaExceeded(_) => ErrorCode::QuotaExceeded,
            RunError::Internal(_) => ErrorCode::Unknown,
        }
    }

    pub fn from_env(error: EnvError) -> RunError {
        match error.code {
            ErrorCode::Invalid => RunError::Invalid(error.message),
            ErrorCode::Unavailable | ErrorCode::NotSupported => {
                RunError::Unavailable(error.message)
            }
            ErrorCode::Aborted => RunError::Aborted,
            ErrorCode::ResourceExhausted => RunError::TooLarge(error.message),
            _ => RunError::Internal(error.to_string()),
        }
    }
}

/// How runs are made.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub data_dir: PathBuf,
    /// Limits of every run; `timeoutMs` of a request replaces `limits.timeout_ms`.
    pub limits: Limits,
    /// Where the workspace is, what a collection may hold, the most a read hands out:
    /// the door's bounds, for runs, agent attempts, capability calls, sessions and MCP.
    pub door: DoorConfig,
    /// Started containers the docker and gvisor backends keep ready, each (once that
    /// backend has been used), so a run skips the container's create and start. 0: none.
    pub warm_containers: usize,
    /// Native sandboxes kept made ahead for the shape of the last native run, each with
    /// its init started and locked down, so a run pays only for its command. 0: none.
    pub warm_native: usize,
    /// The host directory whose `skills/` and `.skills-cache/` a run's `skills` name
    /// (the server's `--project`, the CLI's current directory); none: runs name none.
    pub skills_workspace: Option<PathBuf>,
    /// What one scope's snapshot may hold, how many are kept, and how many scopes a
    /// tenant keeps.
    pub snapshots: SnapshotLimits,
    /// Bytes the artifact store may hold (the server's `--store-budget`), given to the
    /// store when the binary opens it for this runner; none: not bounded by puts.
    pub store_budget: Option<u64>,
    /// Where the artifact store is, as a URL (the server's `--store`: `s3://bucket/prefix`,
    /// `file:///dir`), opened by the binary for this runner; none: `<data>/objects`.
    pub store_url: Option<String>,
    /// Where the records are, as a URL (the server's `--db`: `postgres://…`), opened by
    /// the binary for this runner; none: SQLite files in the data dir.
    pub db_url: Option<String>,
    /// A container run's sandbox is removed after the run has answered, not before
    /// (up to [`DETACHED_CLEANUPS`] at once; beyond that, before). Only for a process
    /// that calls [`Runner::shutdown`] before it exits (a server), which waits for them.
    pub detach_cleanup: bool,
    /// Roots the egress proxy also trusts, beyond the public web's, when it opens TLS to
    /// a host it adds a run's secrets for (`--egress-ca`: a private CA).
    pub upstream_roots: skillbox_egress::UpstreamRoots,
}

/// How many removals of container sandboxes may go on after their runs answered.
pub const DETACHED_CLEANUPS: usize = 16;
/// How long [`Runner::shutdown`] waits for detached removals before it removes what is
/// left itself.
const DETACHED_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

impl RunnerConfig {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RunnerConfig {
            data_dir: data_dir.into(),
            limits: Limits::default(),
            door: DoorConfig::default(),
            warm_containers: 0,
            warm_native: 0,
            skills_workspace: None,
            snapshots: SnapshotLimits::default(),
            store_budget: None,
            store_url: None,
            db_url: None,
            detach_cleanup: false,
            upstream_roots: skillbox_egress::UpstreamRoots::default(),
        }
    }

    /// The skills `names` (checked as a request's `skills`) of the skills workspace and
    /// of `tenant`'s own, by name; a name that is not there is `Invalid`, naming those
    /// that are. Reads each SKILL.md from the host: blocking, and no sandbox needed.
    pub fn find_skills(&self, names: &[String], tenant: &str) -> Result<Vec<Skill>, RunError> {
        let names = check_skill_names(names)?;
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let Some(workspace) = self.skills_workspace.clone() else {
            return Err(RunError::Invalid(NO_SKILLS_WORKSPACE.into()));
        };
        let user = skillbox_skills::skill::valid_name(tenant).then(|| {
            (
                tenant.to_string(),
                Sources::user_dir(&self.data_dir, tenant),
            )
        });
        let set = SkillSet::load(&Sources {
            workspace: Some(workspace),
            user,
        });
        let missing =
            |i: usize, name: &str| RunError::Invalid(format!("skills[{i}]: {}", set.missing(name)));
        names
            .iter()
            .enumerate()
            .map(|(i, name)| set.get(name).cloned().ok_or_else(|| missing(i, name)))
            .collect()
    }
}

/// The registry every sandbox of `data_dir` comes from: its backends run the image
/// built from this build's Node runtime.
pub fn registry_config(data_dir: &Path) -> RegistryConfig {
    RegistryConfig::for_node_runtime(data_dir, &NodeRuntime::new(data_dir).id())
}

/// Runs scripts; one per call, each in its own sandbox.
#[derive(Debug)]
pub struct Runner {
    config: RunnerConfig,
    store: ArtifactStore,
    /// Container backends connect on first use, so a server without Docker still
    /// serves native runs.
    backends: Arc<BackendRegistry>,
    node: NodeRuntime,
    /// Where records are kept: the data dir's SQLite files, or a shared database.
    records: RecordsDb,
    /// The scopes' snapshots, opened on first use.
    snapshots: std::sync::OnceLock<Result<Snapshots, String>>,
    /// Removals of sandboxes whose runs have answered ([`RunnerConfig::detach_cleanup`]).
    cleanups: tokio_util::task::TaskTracker,
    cleanup_slots: Arc<tokio::sync::Semaphore>,
}

/// A request that passed validation.
struct Checked {
    language: Language,
    script: String,
    timeout_ms: u64,
    files: Vec<(PathBuf, Bytes)>,
    outputs: OutputSelection,
    limits: Option<skillbox_protocol::RunLimits>,
    skills: Vec<String>,
    scope_key: Option<String>,
    network: Option<skillbox_protocol::NetworkPolicy>,
    secrets: std::collections::BTreeMap<String, skillbox_protocol::SecretSpec>,
}

/// Why a runner without a skills workspace refuses `skills`.
const NO_SKILLS_WORKSPACE: &str = "skills: this runner has no skills workspace (skillbox serve --project DIR, or run from the workspace)";
/// Most skills one run may name.
const MAX_SKILLS: usize = 64;

/// Skills found and planned for a sandbox: which, and the tree that places them.
#[derive(Debug, Clone)]
pub struct PlannedSkills {
    /// By name.
    pub skills: Vec<Skill>,
    pub projection: Projection,
}

impl PlannedSkills {
    /// Each skill with its folder in the sandbox, whose workspace is at `root`.
    pub fn placed(&self, root: &WorkspaceRoot) -> Vec<PlacedSkill> {
        self.skills
            .iter()
            .map(|skill| PlacedSkill {
                name: skill.meta.name.clone(),
                path: skill.sandbox_dir(root.as_path()).display().to_string(),
            })
            .collect()
    }
}

/// One tenant's scope: where its snapshots are kept, and its id there.
#[derive(Debug, Clone)]
pub struct Scope {
    snapshots: Snapshots,
    tenant: String,
    id: String,
}

/// An input file's path (`files[index].path`): relative to the workspace, by the one
/// rule every door parses paths with.
fn check_path(index: usize, path: &str) -> Result<PathBuf, RunError> {
    let field = format!("files[{index}].path");
    let parsed =
        WorkspacePath::relative(path).map_err(|e| RunError::Invalid(format!("{field}: {e}")))?;
    if parsed.is_root() {
        return Err(RunError::Invalid(format!(
            "{field}: {path:?} names no file"
        )));
    }
    Ok(PathBuf::from(parsed.as_str()))
}

/// A bound the request asks for: within the server's (`None` there: no bound to stay
/// under), and not below the least a sandbox can use.
pub fn tighter(
    field: &str,
    asked: Option<u64>,
    server: Option<u64>,
    least: u64,
) -> Result<Option<u64>, RunError> {
    let Some(asked) = asked else {
        return Ok(server);
    };
    if asked < least {
        return Err(RunError::Invalid(format!(
            "limits.{field}: {asked} is below the least a sandbox can use ({least})"
        )));
    }
    match server {
        Some(max) if asked > max => Err(RunError::Invalid(format!(
            "limits.{field}: {asked} is over this server's bound ({max}); ask for less"
        ))),
        _ => Ok(Some(asked)),
    }
}

fn check(request: RunRequest) -> Result<Checked, RunError> {
    if request.script.trim().is_empty() {
        return Err(RunError::Invalid(
            "script: empty; give the code to run".into(),
        ));
    }
    let timeout_ms = request.timeout_ms.unwrap_or(Limits::default().timeout_ms);
    if timeout_ms == 0 || timeout_ms > MAX_TIMEOUT_MS {
        return Err(RunError::Invalid(format!(
            "timeoutMs: {timeout_ms} is out of range 1..={MAX_TIMEOUT_MS}"
        )));
    }
    let outputs = OutputSelection::new(&request.outputs)
        .map_err(|e| RunError::Invalid(format!("outputs: {e}")))?;
    let files = check_files(request.files, request.script.len())?;
    let skills = check_skill_names(&request.skills)?;
    if let Some(scope) = &request.scope_key {
        skillbox_store::check_scope_key(scope).map_err(RunError::Invalid)?;
    }
    if let Some(network) = &request.network {
        skillbox_egress::Rules::new(network).map_err(|e| RunError::Invalid(e.to_string()))?;
    }
    if !request.secrets.is_empty() {
        if request.network.as_ref().is_none_or(|n| n.allow.is_empty()) {
            return Err(RunError::Invalid(
                "secrets: they go out through the egress proxy; give network.allow with their hosts"
                    .into(),
            ));
        }
        skillbox_egress::Secrets::new(&request.secrets).map_err(RunError::Invalid)?;
    }
    Ok(Checked {
        language: request.language,
        script: request.script,
        timeout_ms,
        files,
        outputs,
        limits: request.limits,
        skills,
        scope_key: request.scope_key,
        network: request.network,
        secrets: request.secrets,
    })
}

/// A request's `skills`: at most 64, each a skill's name; sorted, without repeats. An
/// error names the field (`skills[2]`).
pub fn check_skill_names(names: &[String]) -> Result<Vec<String>, RunError> {
    if names.len() > MAX_SKILLS {
        return Err(RunError::Invalid(format!(
            "skills: {} names, at most {MAX_SKILLS}",
            names.len()
        )));
    }
    for (i, name) in names.iter().enumerate() {
        if !skillbox_skills::skill::valid_name(name) {
            return Err(RunError::Invalid(format!(
                "skills[{i}]: {name:?} is not a skill's name (letters, digits, -, _ and .)"
            )));
        }
    }
    let mut names = names.to_vec();
    names.sort();
    names.dedup();
    Ok(names)
}

/// A request's input `files`, checked and decoded: at most 1000, each path relative to
/// `/workspace` without `..`, and at most 32 MiB with the `counted` bytes (the script)
/// that go in with them. An error names the field (`files[2].path`).
pub fn check_files(
    files: Vec<FileInput>,
    counted: usize,
) -> Result<Vec<(PathBuf, Bytes)>, RunError> {
    if files.len() > MAX_FILES {
        return Err(RunError::Invalid(format!(
            "files: {} files, at most {MAX_FILES}",
            files.len()
        )));
    }
    let mut total = counted;
    let mut checked = Vec::with_capacity(files.len());
    for (index, file) in files.into_iter().enumerate() {
        let path = check_path(index, &file.path)?;
        let bytes = match file.encoding {
            Encoding::Utf8 => Bytes::from(file.content.into_bytes()),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(file.content.trim())
                .map(Bytes::from)
                .map_err(|e| {
                    RunError::Invalid(format!("files[{index}].content: not valid base64: {e}"))
                })?,
        };
        total += bytes.len();
        if total > MAX_INPUT_BYTES {
            return Err(RunError::Invalid(format!(
                "files: more than {MAX_INPUT_BYTES} bytes of inputs"
            )));
        }
        checked.push((path, bytes));
    }
    Ok(checked)
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The script's file in the workspace (a dot-file: it is an input, not an artifact).
pub fn script_name(language: Language) -> &'static str {
    match language {
        Language::Node => ".skillbox-main.js",
        Language::Python => ".skillbox-main.py",
        Language::Sh => ".skillbox-main.sh",
    }
}

/// The command that runs the script in a sandbox of `kind` whose workspace is at
/// `root`. Node runs under its permission model too (a second layer inside the sandbox,
/// never instead of it): reads only the runtime and the workspace, writes only the
/// workspace (not `/tmp`, and so not `$HOME`, which is `/tmp`: pptxgenjs writes only the
/// deck it is given), no child processes, no workers. On wasm, `node` is QuickJS and
/// `python3` CPython for WASI.
pub fn script_command(
    kind: BackendKind,
    root: &WorkspaceRoot,
    language: Language,
    script: &str,
) -> Vec<String> {
    if kind == BackendKind::Wasm {
        let program = match language {
            Language::Node => "node",
            Language::Python => "python3",
            Language::Sh => "/bin/sh",
        };
        return vec![program.into(), script.into()];
    }
    match language {
        Language::Node => vec![
            "node".into(),
            "--experimental-permission".into(),
            // `dir/*` covers the dir itself too; naming both crashes node 20.
            format!("--allow-fs-read={root}/*"),
            format!("--allow-fs-read={NODE_MODULES}/*"),
            format!("--allow-fs-write={root}/*"),
            "--disable-warning=ExperimentalWarning".into(),
            "--experimental-detect-module".into(),
            script.into(),
        ],
        Language::Python => vec!["python3".into(), "-I".into(), script.into()],
        Language::Sh => vec!["/bin/sh".into(), script.into()],
    }
}

impl Runner {
    pub fn new(config: RunnerConfig, store: ArtifactStore) -> Self {
        let mut registry = registry_config(&config.data_dir);
        registry.warm_containers = config.warm_containers;
        registry.warm_native = config.warm_native;
        registry.upstream_roots = config.upstream_roots.clone();
        // The spec of every container run (see `run`): no workdir, no mounts.
        registry.warm_spec = SandboxSpec {
            workspace: None,
            root: config.door.root.clone(),
            limits: config.limits.clone(),
            policy: SandboxPolicy::default(),
        };
        Runner {
            node: NodeRuntime::new(&config.data_dir),
            records: RecordsDb::sqlite(&config.data_dir),
            backends: Arc::new(BackendRegistry::new(registry)),
            config,
            store,
            snapshots: std::sync::OnceLock::new(),
            cleanups: tokio_util::task::TaskTracker::new(),
            cleanup_slots: Arc::new(tokio::sync::Semaphore::new(DETACHED_CLEANUPS)),
        }
    }

    /// This runner with its records in `records` (a shared database) rather than in
    /// its data dir.
    pub fn with_records(mut self, records: RecordsDb) -> Self {
        self.records = records;
        self.snapshots = std::sync::OnceLock::new();
        self
    }

    /// Where this runner's records are: what a server opens its own tables in.
    pub fn records(&self) -> &RecordsDb {
        &self.records
    }

    /// The scopes' snapshots (`<data>/snapshots.sqlite`, or the shared database).
    pub fn snapshots(&self) -> Result<&Snapshots, RunError> {
        self.snapshots
            .get_or_init(|| Snapshots::open(&self.records).map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| RunError::Unavailable(format!("snapshots: {e}")))
    }

    /// The skills `names` of `tenant` ([`RunnerConfig::find_skills`]), planned for a
    /// sandbox (on a blocking thread: it hashes files); `None` when there are none.
    pub async fn plan_skills(
        &self,
        names: &[String],
        tenant: &str,
    ) -> Result<Option<PlannedSkills>, RunError> {
        if names.is_empty() {
            return Ok(None);
        }
        let config = self.config.clone();
        let tenant = tenant.to_string();
        let names = names.to_vec();
        tokio::task::spawn_blocking(move || {
            let skills = config.find_skills(&names, &tenant)?;
            let cache_dir = config.data_dir.join("skills");
            let _ = std::fs::create_dir_all(&cache_dir);
            let mut cache = HashCache::open(&cache_dir.join("hash-cache"));
            let chosen: Vec<&Skill> = skills.iter().collect();
            let projection =
                skillbox_skills::plan_skills(&chosen, &mut cache).map_err(RunError::from_env)?;
            Ok(Some(PlannedSkills { skills, projection }))
        })
        .await
        .map_err(|e| RunError::Internal(format!("planning the skills failed: {e}")))?
    }

    /// The skills `names` of `tenant`, found without a sandbox (on a blocking thread):
    /// a request naming one that is not there can be refused before anything starts.
    pub async fn find_skills(
        &self,
        names: &[String],
        tenant: &str,
    ) -> Result<Vec<Skill>, RunError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let config = self.config.clone();
        let tenant = tenant.to_string();
        let names = names.to_vec();
        tokio::task::spawn_blocking(move || config.find_skills(&names, &tenant))
            .await
            .map_err(|e| RunError::Internal(format!("reading the skills failed: {e}")))?
    }

    /// `tenant`'s scope `key` (1 to 128 printable ASCII characters): another tenant's
    /// key of the same name is another scope.
    pub fn scope(&self, tenant: &str, key: &str) -> Result<Scope, RunError> {
        skillbox_store::check_scope_key(key).map_err(RunError::Invalid)?;
        Ok(Scope {
            snapshots: self.snapshots()?.clone(),
            tenant: tenant.to_string(),
            id: skillbox_store::scope_id(tenant, key),
        })
    }

    /// Places the scope's last snapshot of `/workspace` in `env` (nothing when it has
    /// none). Returns the report to fill in when saving, and the restored files by path
    /// and SHA-256: inputs, so they come back as outputs only when changed.
    pub async fn restore_scope(
        &self,
        env: &dyn ExecutionEnv,
        scope: &Scope,
        cancel: &CancellationToken,
    ) -> Result<(SnapshotReport, BTreeMap<PathBuf, String>), RunError> {
        let restored = skillbox_store::restore_snapshot(
            env,
            self.root().as_path(),
            &self.store,
            &scope.snapshots,
            &scope.id,
            cancel,
        )
        .await
        .map_err(|e| match e.code() {
            ErrorCode::Aborted => RunError::Aborted,
            _ => RunError::Unavailable(format!(
                "scopeKey: the scope's last snapshot could not be restored: {e}"
            )),
        })?;
        let report = SnapshotReport {
            restored: restored.as_ref().map(|r| r.summary.id.clone()),
            ..SnapshotReport::default()
        };
        Ok((report, restored.map(|r| r.files).unwrap_or_default()))
    }

    /// Saves `/workspace` of `env` as the scope's new latest snapshot, into `report`. A
    /// save that fails leaves the previous one the latest and says why in
    /// `report.error`; only a cancel is an error.
    pub async fn save_scope(
        &self,
        env: &dyn ExecutionEnv,
        scope: &Scope,
        report: &mut SnapshotReport,
        cancel: &CancellationToken,
    ) -> Result<(), RunError> {
        match skillbox_store::save_snapshot(
            env,
            self.root().as_path(),
            &self.store,
            &scope.snapshots,
            &scope.tenant,
            &scope.id,
            self.config.snapshots,
            cancel,
        )
        .await
        {
            Ok(saved) => {
                report.saved = Some(saved.id);
                report.files = saved.files;
                report.bytes = saved.bytes;
            }
            Err(e) if e.code() == ErrorCode::Aborted => return Err(RunError::Aborted),
            Err(e) => report.error = Some(e.to_string()),
        }
        Ok(())
    }

    /// Places planned skills in `/workspace` of `env` as one tree (nothing is copied
    /// when the workspace already has them). Their files are inputs:
    /// `skills.projection.inputs()`.
    pub async fn place_skills(
        &self,
        env: &dyn ExecutionEnv,
        skills: &PlannedSkills,
        cancel: &CancellationToken,
    ) -> Result<SkillsPlaced, RunError> {
        let config = ProjectionConfig {
            sandbox_root: self.root().as_path().to_path_buf(),
            ..ProjectionConfig::default()
        };
        let applied = skillbox_skills::apply(env, &skills.projection, &config, cancel)
            .await
            .map_err(RunError::from_env)?;
        Ok(SkillsPlaced {
            skills: skills.placed(self.root()),
            files: applied.files,
            bytes: applied.bytes,
            copied: applied.copied,
            fingerprint: applied.fingerprint,
        })
    }

    /// The registry runs take their sandboxes from (the agent takes its own from it too).
    pub fn backends(&self) -> &Arc<BackendRegistry> {
        &self.backends
    }

    /// Removes the containers of runs still in flight and of runs that answered (a
    /// server shutting down), then waits for the removals already going.
    pub async fn shutdown(&self) {
        self.cleanups.close();
        // The backends first: their pools close (a removal still going refills nothing)
        // and every container they made goes, those of detached removals too.
        self.backends.shutdown().await;
        if tokio::time::timeout(DETACHED_WAIT, self.cleanups.wait())
            .await
            .is_err()
        {
            tracing::warn!("run: sandbox removals still going after {DETACHED_WAIT:?}");
        }
    }

    /// Removes a run's sandbox: after the run answers when that is allowed and a slot
    /// is free, else now.
    async fn cleanup(&self, env: Box<dyn ExecutionEnv>) {
        let container = matches!(env.kind(), BackendKind::Docker | BackendKind::Gvisor);
        if self.config.detach_cleanup
            && container
            && !self.cleanups.is_closed()
            && let Ok(slot) = self.cleanup_slots.clone().try_acquire_owned()
        {
            self.cleanups.spawn(async move {
                if let Err(e) = env.cleanup().await {
                    tracing::warn!(error = %e, "run: sandbox cleanup failed");
                }
                drop(slot);
            });
            return;
        }
        if let Err(e) = env.cleanup().await {
            tracing::warn!(error = %e, "run: sandbox cleanup failed");
        }
    }

    /// The data dir runs keep their state in.
    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// The limits every run starts from.
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// The door's bounds: where the workspace is, what a collection may hold, the most
    /// a read hands out.
    pub fn door(&self) -> &DoorConfig {
        &self.config.door
    }

    /// What one collection may hold (runs, agent attempts, capability calls).
    pub fn collect_limits(&self) -> CollectLimits {
        self.config.door.collect
    }

    /// The most one read hands out, by door.
    pub fn read_caps(&self) -> skillbox_door::ReadCaps {
        self.config.door.read_caps
    }

    /// Where the workspace is in every sandbox.
    pub fn root(&self) -> &WorkspaceRoot {
        &self.config.door.root
    }

    /// `env` through its door: paths parsed against this runner's root.
    pub fn workspace<'a>(&'a self, env: &'a dyn ExecutionEnv) -> skillbox_door::Workspace<'a> {
        skillbox_door::Workspace::new(env, self.root())
    }

    /// The workspace whose skills runs may name, if any.
    pub fn skills_workspace(&self) -> Option<&Path> {
        self.config.skills_workspace.as_deref()
    }

    pub fn store(&self) -> &ArtifactStore {
        &self.store
    }

    pub fn node_runtime(&self) -> &NodeRuntime {
        &self.node
    }

    /// Installs what runs need (the Node runtime), reporting progress.
    pub async fn prepare(&self, progress: &(dyn Fn(&str) + Send + Sync)) -> Result<(), RunError> {
        self.node
            .ensure(progress)
            .await
            .map_err(|e| RunError::Unavailable(e.to_string()))
    }

    /// Runs one request in a fresh sandbox. The sandbox is removed whatever happens.
    pub async fn run(
        &self,
        request: RunRequest,
        cancel: &CancellationToken,
    ) -> Result<RunResult, RunError> {
        self.run_as(request, skillbox_store::LOCAL_TENANT, cancel)
            .await
    }

    /// [`run`](Self::run) for `tenant`: its own skills, its own scopes.
    pub async fn run_as(
        &self,
        request: RunRequest,
        tenant: &str,
        cancel: &CancellationToken,
    ) -> Result<RunResult, RunError> {
        let kind = skillbox_door::sandboxed(request.backend)
            .map_err(RunError::from_env)?
            .kind();
        let checked = check(request)?;
        if kind == BackendKind::Wasm && checked.language == Language::Sh {
            return Err(RunError::Invalid(
                "language: sh cannot run on the wasm backend (a WASI guest has no shell); use python or node".into(),
            ));
        }
        let mut policy = SandboxPolicy::default();
        // Whatever the script's language: a Python or shell script that calls `node`
        // finds pptxgenjs as a Node script does.
        if checked.language == Language::Node {
            self.runtime_mount(kind, &mut policy).await?;
        } else {
            self.runtime_mount_where_node_is(kind, &mut policy).await?;
        }
        let skills = self.plan_skills(&checked.skills, tenant).await?;
        let scope = match &checked.scope_key {
            Some(key) => Some(self.scope(tenant, key)?),
            None => None,
        };
        let base = &self.config.limits;
        let asked = checked.limits.clone().unwrap_or_default();
        let limits = Limits {
            timeout_ms: checked.timeout_ms,
            disk_bytes: tighter(
                "diskBytes",
                asked.disk_bytes,
                base.disk_bytes,
                skillbox_env::MIN_DISK_BYTES,
            )?,
            disk_inodes: tighter(
                "diskInodes",
                asked.disk_inodes,
                base.disk_inodes,
                skillbox_env::MIN_DISK_INODES,
            )?,
            ..base.clone()
        };
        policy.network = checked.network.clone();
        policy.secrets = checked.secrets.clone();
        policy.egress_bytes = asked.egress_bytes;
        let spec = SandboxSpec {
            workspace: None,
            root: self.root().clone(),
            limits,
            policy,
        };
        let env = self
            .backends
            .create(kind, spec)
            .await
            .map_err(RunError::from_env)?;
        let result = self
            .run_in(env.as_ref(), checked, skills, scope, cancel)
            .await;
        self.cleanup(env).await;
        result
    }

    /// Shows the Node runtime at `/node_modules` in a sandbox of `kind`, installing it
    /// first if needed. A container image carries its own copy.
    pub async fn runtime_mount(
        &self,
        kind: BackendKind,
        policy: &mut SandboxPolicy,
    ) -> Result<(), RunError> {
        self.mount_runtime(kind, policy, true).await
    }

    /// [`runtime_mount`](Self::runtime_mount) for a sandbox whose script is not Node's:
    /// the same, except on a host without Node or npm, where the sandbox has no `node`
    /// to call and gets no runtime (rather than the run failing for what it never
    /// asked).
    pub async fn runtime_mount_where_node_is(
        &self,
        kind: BackendKind,
        policy: &mut SandboxPolicy,
    ) -> Result<(), RunError> {
        self.mount_runtime(kind, policy, false).await
    }

    async fn mount_runtime(
        &self,
        kind: BackendKind,
        policy: &mut SandboxPolicy,
        required: bool,
    ) -> Result<(), RunError> {
        if kind != BackendKind::Native {
            return Ok(());
        }
        if !self.node.is_installed() {
            match self.node.ensure(&|line| tracing::info!("{line}")).await {
                Ok(()) => {}
                Err(RuntimeError::Missing(what)) if !required => {
                    tracing::debug!(what, "run: no Node on this host; no runtime shown");
                    return Ok(());
                }
                Err(e) => return Err(RunError::Unavailable(e.to_string())),
            }
        }
        policy.read_only_mounts.push(Mount {
            host: self.node.node_modules(),
            sandbox: NODE_MODULES.into(),
        });
        Ok(())
    }

    async fn run_in(
        &self,
        env: &dyn ExecutionEnv,
        checked: Checked,
        skills: Option<PlannedSkills>,
        scope: Option<Scope>,
        cancel: &CancellationToken,
    ) -> Result<RunResult, RunError> {
        let workspace = self.root().as_path();
        // Restoring the scope and placing the skills is work skillbox does outside the
        // sandbox for the run: it is counted against the run's own timeout, and the
        // script gets what is left.
        let timeout = std::time::Duration::from_millis(checked.timeout_ms);
        let started = tokio::time::Instant::now();
        let preparing = cancel.child_token();
        let prepared = tokio::time::timeout(timeout, async {
            let mut inputs: BTreeMap<PathBuf, String> = BTreeMap::new();
            let mut snapshot = None;
            // The scope's last workspace first, then the skills over it: changed skill
            // code wins, what the earlier runs installed stays.
            if let Some(scope) = &scope {
                let (report, restored) = self.restore_scope(env, scope, &preparing).await?;
                snapshot = Some(report);
                inputs.extend(restored);
            }
            let placed = match &skills {
                Some(skills) => {
                    let placed = self.place_skills(env, skills, &preparing).await?;
                    inputs.extend(skills.projection.inputs());
                    Some(placed)
                }
                None => None,
            };
            Ok::<_, RunError>((inputs, snapshot, placed))
        })
        .await;
        let out_of_time = || {
            RunError::Timeout(format!(
                "timeoutMs: the run's {} ms went by restoring its scope's snapshot and placing its skills, before its script started",
                checked.timeout_ms
            ))
        };
        let (mut inputs, mut snapshot, placed) = match prepared {
            Ok(prepared) => prepared?,
            Err(_) => {
                // The placing stops at its next entry.
                preparing.cancel();
                return Err(out_of_time());
            }
        };
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(out_of_time());
        }
        let door = self.workspace(env);
        door.place_inputs(&checked.files, &mut inputs, cancel)
            .await
            .map_err(|(index, e)| match e.code {
                // A clash between inputs (`a` and `a/b`, a file over a dir) is the
                // request's fault.
                ErrorCode::NotDirectory
                | ErrorCode::IsDirectory
                | ErrorCode::AlreadyExists
                | ErrorCode::Invalid => RunError::Invalid(format!(
                    "files[{index}].path: {}: {}",
                    checked.files[index].0.display(),
                    e.message
                )),
                _ => RunError::from_env(e),
            })?;
        let script = script_name(checked.language);
        inputs.insert(PathBuf::from(script), sha256_hex(checked.script.as_bytes()));

        let mut request = ExecRequest::argv(script_command(
            env.kind(),
            self.root(),
            checked.language,
            &self.root().join_str(script).display().to_string(),
        ))
        .timeout(left);
        // Nothing execs after the script, and its files are collected as they are: what
        // it leaves in the background may go with the sandbox. A scope's snapshot wants
        // the workspace still.
        if scope.is_none() {
            request = request.last();
        }
        // The script is written in the same round trip as it runs.
        let collection = skillbox_door::Collection {
            inputs: &inputs,
            outputs: &checked.outputs,
            limits: self.config.door.collect,
        };
        let (output, collected) = door
            .run_and_collect(
                vec![(workspace.join(script), checked.script.into_bytes())],
                request,
                collection,
                cancel,
            )
            .await
            .map_err(RunError::from_env)?;
        let collected = collected.map_err(|e| match e.code() {
            ErrorCode::ResourceExhausted => RunError::TooLarge(e.to_string()),
            ErrorCode::Aborted => RunError::Aborted,
            _ => RunError::Internal(e.to_string()),
        })?;
        let stored = store_all(&self.store, collected)
            .await
            .map_err(|e| match e.code() {
                ErrorCode::QuotaExceeded => RunError::QuotaExceeded(e.to_string()),
                _ => RunError::Internal(e.to_string()),
            })?;
        if let (Some(scope), Some(report)) = (&scope, snapshot.as_mut()) {
            self.save_scope(env, scope, report, cancel).await?;
        }
        let files = stored
            .into_iter()
            .map(|a| ArtifactInfo {
                url: object_url(&a.sha256, &a.path),
                path: a.path,
                size: a.size,
                sha256: a.sha256,
                content_type: a.content_type,
            })
            .collect();
        Ok(RunResult {
            exit_code: output.exit_code,
            signal: output.signal,
            stdout: output.stdout_text(),
            stderr: output.stderr_text(),
            timed_out: output.timed_out,
            limit_hit: output.limit_hit,
            duration_ms: output.duration_ms,
            truncated: output.truncated,
            files,
            skills: placed,
            snapshot,
            egress: env.egress(),
        })
    }
}

/// The download URL of an artifact: `/v1/objects/{sha256}?name={file name}`.
pub fn object_url(sha256: &str, path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    format!("/v1/objects/{sha256}?name={}", percent_encode(name))
}

/// Percent-encodes everything but unreserved characters (for the `name` query value).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use skillbox_protocol::FileInput;

    fn request(files: Vec<FileInput>) -> RunRequest {
        RunRequest {
            files,
            ..RunRequest::new(Language::Sh, "true")
        }
    }

    fn file(path: &str, content: &str, encoding: Encoding) -> FileInput {
        FileInput {
            path: path.into(),
            content: content.into(),
            encoding,
        }
    }

    fn invalid(req: RunRequest) -> String {
        match check(req) {
            Err(RunError::Invalid(message)) => message,
            Err(other) => panic!("expected invalid, got {other:?}"),
            Ok(_) => panic!("expected invalid, got ok"),
        }
    }

    #[test]
    fn bad_requests_name_the_field() {
        assert!(invalid(RunRequest::new(Language::Node, "  ")).starts_with("script"));
        let mut req = request(vec![]);
        req.timeout_ms = Some(0);
        assert!(invalid(req.clone()).starts_with("timeoutMs"));
        req.timeout_ms = Some(MAX_TIMEOUT_MS + 1);
        assert!(invalid(req).starts_with("timeoutMs"));
        assert!(
            invalid(request(vec![file("/etc/passwd", "x", Encoding::Utf8)]))
                .starts_with("files[0].path")
        );
        assert!(
            invalid(request(vec![
                file("ok.txt", "x", Encoding::Utf8),
                file("a/../../x", "x", Encoding::Utf8)
            ]))
            .starts_with("files[1].path")
        );
        assert!(invalid(request(vec![file("", "x", Encoding::Utf8)])).starts_with("files[0].path"));
        assert!(
            invalid(request(vec![file(
                "b.bin",
                "not base64!",
                Encoding::Base64
            )]))
            .starts_with("files[0].content")
        );
        let mut req = request(vec![]);
        req.network = Some(skillbox_protocol::NetworkPolicy {
            allow: vec!["ok.example".into(), "*".into()],
            deny: vec![],
        });
        assert!(invalid(req).starts_with("network.allow[1]"));
        let secret = skillbox_protocol::SecretSpec {
            value: "v".into(),
            hosts: vec!["api.example.com".into()],
        };
        let mut req = request(vec![]);
        req.secrets.insert("API_KEY".into(), secret.clone());
        assert!(invalid(req.clone()).starts_with("secrets: they go out through the egress proxy"));
        req.network = Some(skillbox_protocol::NetworkPolicy {
            allow: vec!["api.example.com".into()],
            deny: vec![],
        });
        req.secrets.insert("bad-name".into(), secret);
        assert!(invalid(req).starts_with("secrets.bad-name"));
    }

    #[test]
    fn good_requests_decode_their_files() {
        let checked = check(request(vec![
            file("a/b.txt", "hi", Encoding::Utf8),
            file("c.bin", "AAE=", Encoding::Base64),
        ]))
        .expect("valid");
        assert_eq!(
            checked.files[0],
            (PathBuf::from("a/b.txt"), Bytes::from_static(b"hi"))
        );
        assert_eq!(
            checked.files[1],
            (PathBuf::from("c.bin"), Bytes::from_static(&[0, 1]))
        );
        assert_eq!(checked.timeout_ms, 60_000);
    }

    #[test]
    fn names_are_percent_encoded() {
        assert_eq!(percent_encode("deck 1.pptx"), "deck%201.pptx");
        assert_eq!(percent_encode("a&b=c"), "a%26b%3Dc");
    }
}
