//! `loopback`: a deterministic, offline model. It replays a transcript of assistant
//! turns (text and tool calls) and checks that the tool results it is given match what
//! the transcript expects, so a test fails loudly when the sandbox behaves differently
//! from the session it replays.
//!
//! ```json
//! {"description": "…", "turns": [
//!   {"text": "…", "toolCalls": [{"name": "run_script", "arguments": {"language": "node", "script": "…"}}]},
//!   {"expect": {"exitCode": 1, "stderrContains": "…"}, "text": "…", "toolCalls": […]},
//!   {"expect": {"exitCode": 0, "filesInclude": "deck.pptx"}, "text": "Done."}
//! ]}
//! ```

use async_trait::async_trait;
use serde::Deserialize;
use skillbox_env::CancellationToken;

use crate::provider::{Message, ModelProvider, ProviderError, Reply, Role, ToolCall, ToolSpec};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Transcript {
    #[serde(default)]
    #[allow(dead_code, reason = "documentation inside the transcript file")]
    description: String,
    turns: Vec<Turn>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Turn {
    #[serde(default)]
    expect: Option<Expect>,
    #[serde(default)]
    text: String,
    #[serde(default)]
    tool_calls: Vec<ScriptedCall>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ScriptedCall {
    name: String,
    arguments: serde_json::Value,
}

/// What the tool result before a turn must show.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Expect {
    #[serde(default)]
    exit_code: Option<i32>,
    #[serde(default)]
    stderr_contains: Option<String>,
    #[serde(default)]
    files_include: Option<String>,
    /// A substring of the whole tool result (e.g. a verification or tool error).
    #[serde(default)]
    result_contains: Option<String>,
}

/// The scripted model.
#[derive(Debug, Clone)]
pub struct LoopbackProvider {
    transcript: Transcript,
}

impl LoopbackProvider {
    /// Parses a transcript; the error names what is wrong with it.
    pub fn from_json(text: &str) -> Result<Self, ProviderError> {
        let transcript: Transcript = serde_json::from_str(text)
            .map_err(|e| ProviderError::Transcript(format!("does not parse: {e}")))?;
        if transcript.turns.is_empty() {
            return Err(ProviderError::Transcript("has no turns".into()));
        }
        for (i, turn) in transcript.turns.iter().enumerate() {
            for call in &turn.tool_calls {
                if !call.arguments.is_object() {
                    return Err(ProviderError::Transcript(format!(
                        "turn {}: the arguments of {} must be a JSON object",
                        i + 1,
                        call.name
                    )));
                }
            }
        }
        Ok(LoopbackProvider { transcript })
    }
}

fn check(expect: &Expect, turn: usize, result: &serde_json::Value) -> Result<(), ProviderError> {
    let mismatch = |what: String| {
        ProviderError::Transcript(format!(
            "turn {turn} expected {what}, but the tool result was {}",
            result.to_string().chars().take(600).collect::<String>()
        ))
    };
    if let Some(code) = expect.exit_code
        && result["exitCode"].as_i64() != Some(i64::from(code))
    {
        return Err(mismatch(format!("exit code {code}")));
    }
    if let Some(needle) = &expect.stderr_contains
        && !result["stderr"]
            .as_str()
            .is_some_and(|s| s.contains(needle.as_str()))
    {
        return Err(mismatch(format!("stderr containing {needle:?}")));
    }
    if let Some(needle) = &expect.result_contains
        && !result.to_string().contains(needle.as_str())
    {
        return Err(mismatch(format!("a result containing {needle:?}")));
    }
    if let Some(name) = &expect.files_include {
        let listed = result["files"].as_array().is_some_and(|files| {
            files
                .iter()
                .any(|f| f["path"].as_str() == Some(name.as_str()))
        });
        if !listed {
            return Err(mismatch(format!("a file {name:?}")));
        }
    }
    Ok(())
}

#[async_trait]
impl ModelProvider for LoopbackProvider {
    fn name(&self) -> String {
        "loopback".into()
    }

    fn is_scripted(&self) -> bool {
        true
    }

    async fn complete(
        &self,
        messages: &[Message],
        _tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Reply, ProviderError> {
        if cancel.is_cancelled() {
            return Err(ProviderError::Cancelled);
        }
        let index = messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let turn = self.transcript.turns.get(index).ok_or_else(|| {
            ProviderError::Transcript(format!(
                "ran out of turns: the loop asked for turn {} of {}",
                index + 1,
                self.transcript.turns.len()
            ))
        })?;
        if let Some(expect) = &turn.expect {
            let last = messages
                .iter()
                .rev()
                .find(|m| m.role == Role::Tool)
                .ok_or_else(|| {
                    ProviderError::Transcript(format!(
                        "turn {} expects a tool result, but there is none",
                        index + 1
                    ))
                })?;
            let result: serde_json::Value =
                serde_json::from_str(&last.content).unwrap_or(serde_json::Value::Null);
            check(expect, index + 1, &result)?;
        }
        let tool_calls = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| ToolCall {
                id: format!("loopback-{}-{}", index + 1, i + 1),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                raw_arguments: None,
            })
            .collect();
        Ok(Reply {
            message: Message {
                role: Role::Assistant,
                content: turn.text.clone(),
                tool_calls,
                tool_call_id: None,
            },
            usage: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_transcripts_say_why() {
        for (text, needle) in [
            ("{", "does not parse"),
            (r#"{"turns": []}"#, "no turns"),
            (
                r#"{"turns": [{"toolCalls": [{"name": "run_script", "arguments": "x"}]}]}"#,
                "JSON object",
            ),
            (r#"{"turns": [{"txt": "typo"}]}"#, "does not parse"),
        ] {
            let err = LoopbackProvider::from_json(text).expect_err(text);
            assert!(err.to_string().contains(needle), "{text}: {err}");
        }
    }

    #[tokio::test]
    async fn replays_turns_and_checks_results() {
        let provider = LoopbackProvider::from_json(
            r#"{"turns": [
                {"toolCalls": [{"name": "run_script", "arguments": {"language": "sh", "script": "exit 1"}}]},
                {"expect": {"exitCode": 1, "stderrContains": "boom"}, "text": "done"}
            ]}"#,
        )
        .expect("parses");
        let cancel = CancellationToken::new();
        let mut messages = vec![Message::user("go")];
        let first = provider
            .complete(&messages, &[], &cancel)
            .await
            .expect("turn 1");
        assert_eq!(first.message.tool_calls[0].name, "run_script");
        messages.push(first.message);
        messages.push(Message::tool(
            "loopback-1-1",
            r#"{"exitCode": 1, "stderr": "it went boom"}"#,
        ));
        let second = provider
            .complete(&messages, &[], &cancel)
            .await
            .expect("turn 2");
        assert_eq!(second.message.content, "done");
        // A different result than the transcript expects is an error naming the turn.
        messages.truncate(2);
        messages.push(Message::tool(
            "loopback-1-1",
            r#"{"exitCode": 0, "stderr": ""}"#,
        ));
        let err = provider
            .complete(&messages, &[], &cancel)
            .await
            .expect_err("mismatch");
        assert!(
            err.to_string().contains("turn 2 expected exit code 1"),
            "{err}"
        );
        // Past the end.
        messages.push(second.message);
        let err = provider
            .complete(&messages, &[], &cancel)
            .await
            .expect_err("no turn 3");
        assert!(err.to_string().contains("ran out of turns"), "{err}");
    }

    #[test]
    fn the_pptx_skill_transcript_parses() {
        let skill = crate::builtin_skill("pptx").expect("pptx skill");
        LoopbackProvider::from_json(skill.transcript.expect("transcript")).expect("parses");
    }
}
