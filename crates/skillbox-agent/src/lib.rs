//! The agent loop: a model writes a script, skillbox runs it in the sandbox, the exit
//! code, stdout and stderr go back to the model, and the loop repeats until a run
//! produces verified artifacts and the model stops, or a bound is reached (`maxAttempts`
//! failed runs, `maxTurns` model turns, the deadline). A turn it cannot act on (no tool
//! call before a verified run, a tool call with malformed arguments) is answered with a
//! correction saying what to send instead. A run may name skills (placed in the sandbox
//! first, listed in the system prompt, read and run by name) and a scope (its last
//! snapshot of `/workspace` restored first, a new one saved after).
//!
//! Measured on a real model: writing a pptxgenjs script once is not reliable (the
//! first try used `pres.ShapeType.RECTANGLE`, absent in pptxgenjs 4); with the error
//! fed back, the second try worked. Hence the loop.

mod agent;
mod correction;
mod loopback;
pub mod model_check;
pub mod openai;
mod provider;
mod skills;

pub use agent::{Agent, AgentConfig, AgentError, AgentEvent, AgentOutcome};
pub use correction::{Correction, CorrectionKind};
pub use loopback::LoopbackProvider;
pub use provider::{Message, ModelProvider, ProviderError, Reply, Role, ToolCall, ToolSpec};
pub use skillbox_protocol::{AgentStatus, Attempt, Usage, Verification};
pub use skills::{SKILL_NAMES, Skill, builtin_skill};
