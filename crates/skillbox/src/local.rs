//! The local `SkillSandbox`: the runner in this process, on the data dir.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use skillbox_client::{ClientError, RunRequest, RunResult, SkillSandbox};
use skillbox_env::CancellationToken;
use skillbox_run::{Runner, RunnerConfig};
use skillbox_store::{ArtifactStore, RecordsDb};

#[derive(Debug)]
pub struct LocalSandbox {
    runner: Arc<Runner>,
    cancel: CancellationToken,
}

/// The runner over `<data>/objects`; with `install_node`, the Node runtime is installed
/// first, with progress on stderr (a python or sh run does not need it).
pub async fn runner(data_dir: &Path, install_node: bool) -> Result<Runner, ClientError> {
    runner_with(RunnerConfig::new(data_dir), install_node).await
}

/// [`runner`] with a config of the caller's: the store its `store_url` names, else
/// `<data>/objects`.
pub async fn runner_with(config: RunnerConfig, install_node: bool) -> Result<Runner, ClientError> {
    let store = match &config.store_url {
        Some(url) => ArtifactStore::from_url(url).await,
        None => ArtifactStore::local(&config.data_dir.join("objects")).await,
    };
    let mut store = store.map_err(|e| ClientError::new(e.code(), e.to_string()))?;
    let records = match &config.db_url {
        Some(url) => RecordsDb::postgres(url)
            .await
            .map_err(|e| ClientError::new(e.code(), e.to_string()))?,
        None => RecordsDb::sqlite(&config.data_dir),
    };
    // Counted where the records are: shared by the servers on one Postgres database.
    if let Some(max) = config.store_budget {
        store = store
            .with_budget_in(max, &records)
            .await
            .map_err(|e| ClientError::new(e.code(), e.to_string()))?;
    }
    let runner = Runner::new(config, store).with_records(records);
    if install_node {
        runner
            .prepare(&|line| eprintln!("skillbox: {line}"))
            .await
            .map_err(|e| ClientError::new(e.code(), e.to_string()))?;
    }
    Ok(runner)
}

impl LocalSandbox {
    /// The runner on `data_dir`, its config changed by `configure` (the CLI's flags).
    pub async fn open(
        data_dir: &Path,
        install_node: bool,
        configure: impl FnOnce(&mut RunnerConfig),
        cancel: CancellationToken,
    ) -> Result<Self, ClientError> {
        let mut config = RunnerConfig::new(data_dir);
        configure(&mut config);
        let runner = Arc::new(runner_with(config, install_node).await?);
        let interrupt = cancel.clone();
        tokio::spawn(async move {
            stop_asked().await;
            interrupt.cancel();
        });
        Ok(LocalSandbox { runner, cancel })
    }
}

/// Resolves when this process is asked to stop: Ctrl-C (SIGINT), SIGTERM (`kill`,
/// `timeout`, a service manager) or SIGHUP (its terminal closed). A one-shot command
/// cancels its run then, so that its sandbox goes before it exits: a container would
/// otherwise run on, unbounded, until a later skillbox sweeps it. Never resolves where
/// no signal can be watched.
pub async fn stop_asked() {
    use tokio::signal::unix::{SignalKind, signal};
    let watch = |kind: SignalKind| async move {
        match signal(kind) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = watch(SignalKind::interrupt()) => {}
        () = watch(SignalKind::terminate()) => {}
        () = watch(SignalKind::hangup()) => {}
    }
}

#[async_trait]
impl SkillSandbox for LocalSandbox {
    async fn run(&self, request: RunRequest) -> Result<RunResult, ClientError> {
        self.runner
            .run(request, &self.cancel)
            .await
            .map_err(|e| ClientError::new(e.code(), e.to_string()))
    }

    async fn download(&self, sha256: &str) -> Result<Bytes, ClientError> {
        self.runner
            .store()
            .get(sha256)
            .await
            .map_err(|e| ClientError::new(e.code(), e.to_string()))
    }
}
