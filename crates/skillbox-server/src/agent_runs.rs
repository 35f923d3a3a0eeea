//! [`AgentRuns`]: what the server keeps for agent runs: the records (SQLite, so they
//! survive a restart), the model, and the bounds on how many run at once.

use std::sync::Arc;

use skillbox_agent::{LoopbackProvider, ModelProvider};
use skillbox_store::{RecordsDb, RunRecords};
use tokio::sync::Semaphore;

/// Which model agent runs use.
#[derive(Debug, Clone)]
pub enum AgentModel {
    /// The skill's recorded session (offline, deterministic).
    Loopback,
    /// A given loopback transcript (JSON) for every run, whatever the skill.
    Transcript(String),
    /// An OpenAI-compatible endpoint.
    OpenAi(skillbox_agent::openai::OpenAiConfig),
}

/// What agent runs need: their records and the model (the runner gives the sandboxes
/// and the artifact store).
#[derive(Debug, Clone)]
pub struct AgentRuns {
    pub(crate) records: RunRecords,
    model: AgentModel,
    pub(crate) slots: Arc<Semaphore>,
    /// Runs started and not yet recorded as ended (running or waiting for a slot).
    pub(crate) in_system: Arc<std::sync::atomic::AtomicUsize>,
    /// Most runs in the system before new ones get 429.
    pub(crate) max_in_system: usize,
    /// The background runs, so shutdown can wait for their records.
    pub(crate) tasks: tokio_util::task::TaskTracker,
}

impl AgentRuns {
    /// Records live in `records` (`<data_dir>/agent-runs.sqlite`, or a shared
    /// database), kept as the node `node`'s.
    pub async fn open(
        records: &RecordsDb,
        node: &str,
        model: AgentModel,
        max_concurrency: usize,
    ) -> Result<Self, String> {
        let records = RunRecords::open(records, node)
            .await
            .map_err(|e| e.to_string())?;
        let max_concurrency = max_concurrency.max(1);
        Ok(AgentRuns {
            records,
            model,
            slots: Arc::new(Semaphore::new(max_concurrency)),
            in_system: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            max_in_system: max_concurrency * 8,
            tasks: tokio_util::task::TaskTracker::new(),
        })
    }

    /// Waits (at most `limit`) for the background runs to record how they ended.
    pub async fn wait(&self, limit: std::time::Duration) {
        self.tasks.close();
        if tokio::time::timeout(limit, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("shutdown: some agent runs did not finish recording in time");
        }
    }

    /// The model's name as records will read it, and whether it is scripted.
    pub(crate) fn model_name(&self) -> (String, bool) {
        match &self.model {
            AgentModel::Loopback | AgentModel::Transcript(_) => ("loopback".into(), true),
            AgentModel::OpenAi(config) => (format!("openai:{}", config.model), false),
        }
    }

    pub(crate) fn provider(
        &self,
        skill: &skillbox_agent::Skill,
    ) -> Result<Arc<dyn ModelProvider>, String> {
        match &self.model {
            AgentModel::Loopback => {
                let transcript = skill
                    .transcript
                    .ok_or_else(|| format!("skill {} has no loopback transcript", skill.name))?;
                Ok(Arc::new(
                    LoopbackProvider::from_json(transcript).map_err(|e| e.to_string())?,
                ))
            }
            AgentModel::Transcript(text) => Ok(Arc::new(
                LoopbackProvider::from_json(text).map_err(|e| e.to_string())?,
            )),
            AgentModel::OpenAi(config) => Ok(Arc::new(
                skillbox_agent::openai::OpenAiProvider::new(config.clone())
                    .map_err(|e| e.to_string())?,
            )),
        }
    }
}
