//! Model providers behind one trait: chat messages and tool definitions in, an
//! assistant message (text and/or tool calls) out.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use skillbox_env::CancellationToken;

/// Who said a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    Tool,
}

/// A tool the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// A JSON object; `{}` when the model's arguments were not one (see `raw_arguments`).
    pub arguments: serde_json::Value,
    /// What the model sent as arguments when it is not a JSON object (text that does
    /// not parse, an array, nothing at all: empty). A provider hands such a call over
    /// rather than failing the whole answer, and the loop answers it with a correction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub role: Role,
    #[serde(default)]
    pub content: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `Role::Tool`: the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: Role::System,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: Role::Tool,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: Some(call_id.into()),
        }
    }
}

/// A tool offered to the model: name, description and a JSON schema of its arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: serde_json::Value,
}

pub use skillbox_protocol::Usage;

/// The model's answer: an assistant message, and usage if known.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub message: Message,
    pub usage: Option<Usage>,
}

/// Why a provider gave no usable answer. Each names its cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("model provider unreachable: {0}")]
    Unreachable(String),
    #[error("model provider timed out after {0} ms")]
    Timeout(u64),
    /// The server failed (a 5xx, a 429) and kept failing through the retries.
    #[error("model provider answered HTTP {status}: {body}")]
    Http { status: u16, body: String },
    /// The server refused the request as the request's fault (a 4xx, or a 5xx whose
    /// body says validation): sending it again would not help. The server's message.
    #[error("the model server refused skillbox's request (HTTP {status}): {message}")]
    Refused { status: u16, message: String },
    #[error("model provider returned a malformed answer: {0}")]
    Malformed(String),
    #[error("loopback transcript: {0}")]
    Transcript(String),
    #[error("model provider misconfigured: {0}")]
    Config(String),
    #[error("cancelled")]
    Cancelled,
}

/// A chat model with tool calling.
#[async_trait]
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// A name for logs and records (`loopback`, `openai:gpt-4o`, …).
    fn name(&self) -> String;

    /// True for a scripted model (the loopback provider): output must say so.
    fn is_scripted(&self) -> bool {
        false
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Reply, ProviderError>;
}
