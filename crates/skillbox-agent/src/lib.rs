//! The agent loop: a model writes a script, skillbox runs it in the sandbox, the exit
//! code, stdout and stderr go back to the model, and the loop repeats until a run
//! produces verified artifacts and the model stops, the model answers without a tool
//! call, or `maxAttempts` runs have failed.
//!
//! Measured on a real model: writing a pptxgenjs script once is not reliable (the
//! first try used `pres.ShapeType.RECTANGLE`, absent in pptxgenjs 4); with the error
//! fed back, the second try worked. Hence the loop.

mod agent;
mod loopback;
pub mod openai;
mod provider;
mod skills;

pub use agent::{Agent, AgentConfig, AgentError, AgentEvent, AgentOutcome};
pub use loopback::LoopbackProvider;
pub use provider::{Message, ModelProvider, ProviderError, Reply, Role, ToolCall, ToolSpec};
pub use skillbox_protocol::{AgentStatus, Attempt, Usage, Verification};
pub use skills::{SKILL_NAMES, Skill, builtin_skill};
