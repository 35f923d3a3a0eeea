//! Running one script: the preinstalled runtimes ([`NodeRuntime`]) and the [`Runner`]
//! that takes a `RunRequest`, runs it in a fresh sandbox, stores the files it left in
//! `/workspace` and answers with a `RunResult`. The CLI's `run` and the server's
//! `POST /v1/run` are both this.

mod runner;
mod runtime;

pub use runner::{
    NODE_MODULES, PlannedSkills, RunError, Runner, RunnerConfig, Scope, check_files,
    check_skill_names, object_url, registry_config, script_command, script_name, tighter,
};
pub use runtime::{NodeRuntime, RuntimeError};
