//! Corrections: what the loop says back when a model turn is in a form it cannot act on,
//! instead of ending the run. A real model, a small one especially, answers in prose with
//! a fenced code block and no tool call, or sends a call whose arguments are not JSON;
//! told what was wrong and what to send, it usually sends it. Each correction is
//! recorded, and maxTurns bounds them.

use serde_json::Value;

use crate::provider::{ToolCall, ToolSpec};

/// The tool a correction for a turn without a tool call points to.
const RUN_TOOL: &str = "run_script";
/// Characters of what the model sent kept in a correction's record.
const RECEIVED_CHARS: usize = 500;
/// Characters of the JSON parser's error quoted back to the model.
const PARSER_ERROR_CHARS: usize = 200;
/// Characters of unparsable arguments quoted back on each side of where parsing failed.
const CONTEXT_CHARS: usize = 40;

pub use skillbox_protocol::{Correction, CorrectionKind};

/// How the loop answers a turn it cannot act on.
pub(crate) trait Corrects: Sized {
    /// The correction for a turn with no tool call; `ran` when a run has been tried.
    fn no_tool_call(turn: u32, text: &str, ran: bool, tools: &[ToolSpec]) -> Self;
    fn malformed_call(turn: u32, call: &ToolCall, tools: &[ToolSpec]) -> Option<Self>;
    /// The correction for a call that sends `script` (what the attempt records) again,
    /// unchanged since attempt `attempt` failed for `why`, with nothing changed in
    /// `root` since.
    fn repeated_script(
        turn: u32,
        call: &ToolCall,
        script: &str,
        attempt: u32,
        why: &str,
        root: &str,
    ) -> Self;
}

impl Corrects for Correction {
    fn no_tool_call(turn: u32, text: &str, ran: bool, tools: &[ToolSpec]) -> Self {
        let what = if text.trim().is_empty() {
            "You sent an empty answer and called no tool, so nothing ran."
        } else if text.contains("```") {
            "You answered with a code block but called no tool. Code in a message is not run, so nothing ran."
        } else {
            "You answered without calling a tool, so nothing ran."
        };
        let state = if ran {
            " No run has made verified files yet, so there is nothing to hand over."
        } else {
            ""
        };
        let how = match tools.iter().find(|t| t.name == RUN_TOOL) {
            Some(spec) => format!(
                "To run a script, call the tool {RUN_TOOL} with one JSON object as its arguments: {}. Its exit code, output and files come back to you.",
                shape(spec)
            ),
            None => format!("Call one of the tools: {}.", catalogue(tools)),
        };
        Correction {
            turn,
            kind: CorrectionKind::NoToolCall,
            tool: None,
            tool_call_id: None,
            received: cut(text, RECEIVED_CHARS),
            message: format!(
                "{what}{state} {how} Answer without a tool call only once a run has made the files."
            ),
        }
    }

    /// The correction for a call that cannot run, or `None` when it can: its tool
    /// exists and its arguments are a JSON object with each required property, of the
    /// schema's type and, for an enum, one of its values.
    fn malformed_call(turn: u32, call: &ToolCall, tools: &[ToolSpec]) -> Option<Self> {
        let message = match tools.iter().find(|t| t.name == call.name) {
            None => format!(
                "unknown tool {:?}; nothing ran. The tools, each with its arguments as one JSON object: {}.",
                call.name,
                catalogue(tools)
            ),
            Some(spec) => {
                let problem = problem(spec, call)?;
                let hint = if call.raw_arguments.is_some() {
                    " In a JSON string, write a newline as \\n and a double quote as \\\"."
                } else {
                    ""
                };
                format!(
                    "{}: {problem}; nothing ran. Call {} again with one JSON object as its arguments: {}.{hint}",
                    spec.name,
                    spec.name,
                    shape(spec)
                )
            }
        };
        let received = match &call.raw_arguments {
            Some(raw) => raw.clone(),
            None => call.arguments.to_string(),
        };
        Some(Correction {
            turn,
            kind: CorrectionKind::MalformedCall,
            tool: Some(call.name.clone()),
            tool_call_id: Some(call.id.clone()),
            received: cut(&received, RECEIVED_CHARS),
            message,
        })
    }

    fn repeated_script(
        turn: u32,
        call: &ToolCall,
        script: &str,
        attempt: u32,
        why: &str,
        root: &str,
    ) -> Self {
        Correction {
            turn,
            kind: CorrectionKind::RepeatedScript,
            tool: Some(call.name.clone()),
            tool_call_id: Some(call.id.clone()),
            received: cut(script, RECEIVED_CHARS),
            message: format!(
                "{}: this is the script of attempt {attempt}, which failed ({}), and nothing in {root} has changed since, so it would fail the same way; nothing ran. Change the script to fix that error. Sending it unchanged again ends the run.",
                call.name,
                cut(why, PARSER_ERROR_CHARS)
            ),
        }
    }
}

/// What is wrong with the arguments of a call to `spec`, if anything: a required
/// argument missing, of the wrong type, not one of its enum, or shorter than its
/// `minLength` (blank counts as empty), then an argument the tool does not take (with
/// `additionalProperties: false`). A missing argument names what was sent instead, the
/// commonest way a small model gets the names wrong (`code` for `script`).
fn problem(spec: &ToolSpec, call: &ToolCall) -> Option<String> {
    if let Some(raw) = &call.raw_arguments {
        return Some(unreadable(raw));
    }
    let properties = spec.parameters["properties"].as_object();
    let unknown: Vec<&str> = match (call.arguments.as_object(), properties) {
        (Some(sent), Some(known)) => sent
            .keys()
            .filter(|name| !known.contains_key(name.as_str()))
            .map(String::as_str)
            .collect(),
        _ => Vec::new(),
    };
    let takes = || {
        let names: Vec<String> = properties
            .map(|known| known.keys().map(|k| format!("{k:?}")).collect())
            .unwrap_or_default();
        names.join(", ")
    };
    let sent_instead = if unknown.is_empty() {
        String::new()
    } else {
        format!(
            " (you sent {}; {} takes {})",
            quoted(&unknown),
            spec.name,
            takes()
        )
    };
    let required = spec.parameters["required"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let wrong = required.iter().filter_map(Value::as_str).find_map(|name| {
        let property = &spec.parameters["properties"][name];
        let value = match call.arguments.get(name) {
            None | Some(Value::Null) => {
                return Some(format!("argument {name:?} is missing{sent_instead}"));
            }
            Some(value) => value,
        };
        if let Some(expected) = property["type"].as_str()
            && json_type(value) != expected
        {
            return Some(format!(
                "argument {name:?} must be {}, not {}",
                article(expected),
                article(json_type(value))
            ));
        }
        if let (Some(min), Some(text)) = (property["minLength"].as_u64(), value.as_str())
            && (text.trim().chars().count() as u64) < min
        {
            return Some(if min == 1 {
                format!("argument {name:?} is empty")
            } else {
                format!("argument {name:?} is shorter than {min} characters")
            });
        }
        let allowed = property["enum"].as_array()?;
        (!allowed.contains(value)).then(|| {
            format!(
                "argument {name:?} is {}, not one of {}",
                cut(&value.to_string(), RECEIVED_CHARS),
                join(allowed, ", ")
            )
        })
    });
    wrong.or_else(|| {
        let closed = spec.parameters["additionalProperties"] == Value::Bool(false);
        (closed && !unknown.is_empty()).then(|| {
            format!(
                "{} does not take {} (it takes {})",
                spec.name,
                quoted(&unknown),
                takes()
            )
        })
    })
}

/// `"a"`, `"a" and "b"`, `"a", "b" and "c"`.
fn quoted(names: &[&str]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
    }
}

/// Why arguments sent as `raw` are not a JSON object: the parser's error and the text
/// around where it stopped, or what they are instead.
fn unreadable(raw: &str) -> String {
    if raw.trim().is_empty() {
        return "the arguments are empty".to_string();
    }
    match serde_json::from_str::<Value>(raw) {
        Ok(value) => format!(
            "the arguments must be a JSON object, not {}: {}",
            article(json_type(&value)),
            cut(raw, CONTEXT_CHARS * 2)
        ),
        Err(e) => format!(
            "the arguments are not valid JSON ({}), near: {}",
            cut(&e.to_string(), PARSER_ERROR_CHARS),
            around(raw, e.line(), e.column())
        ),
    }
}

/// `CONTEXT_CHARS` on each side of 1-based `line`, `column` (serde_json's, in bytes).
fn around(text: &str, line: usize, column: usize) -> String {
    let start_of_line: usize = text
        .split('\n')
        .take(line.saturating_sub(1))
        .map(|l| l.len() + 1)
        .sum();
    let mut at = (start_of_line + column).min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let (before, after) = text.split_at(at);
    let kept_before = before.chars().count().saturating_sub(CONTEXT_CHARS);
    let head: String = before.chars().skip(kept_before).collect();
    let tail: String = after.chars().take(CONTEXT_CHARS).collect();
    let open = if kept_before > 0 { "…" } else { "" };
    let close = if after.chars().count() > CONTEXT_CHARS {
        "…"
    } else {
        ""
    };
    format!("{open}{head}{tail}{close}")
}

/// A tool's arguments as the model should send them, from its schema:
/// `{"language": "node" | "python" | "sh", "script": "<string>"}`.
fn shape(spec: &ToolSpec) -> String {
    let Some(properties) = spec.parameters["properties"].as_object() else {
        return "{}".to_string();
    };
    let fields: Vec<String> = properties
        .iter()
        .map(|(name, property)| {
            let value = match (property["enum"].as_array(), property["type"].as_str()) {
                (Some(allowed), _) => join(allowed, " | "),
                (None, Some(kind)) => format!("\"<{kind}>\""),
                (None, None) => "<any>".to_string(),
            };
            format!("{}: {value}", Value::from(name.as_str()))
        })
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// Every tool with its shape, for a call to a tool that does not exist.
fn catalogue(tools: &[ToolSpec]) -> String {
    tools
        .iter()
        .map(|t| format!("{} {}", t.name, shape(t)))
        .collect::<Vec<_>>()
        .join("; ")
}

fn join(values: &[Value], separator: &str) -> String {
    values
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join(separator)
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// `a string`, `an array`, `null`.
fn article(kind: &str) -> String {
    match kind {
        "null" => kind.to_string(),
        _ if kind.starts_with(['a', 'e', 'i', 'o', 'u']) => format!("an {kind}"),
        _ => format!("a {kind}"),
    }
}

/// The first `max` characters of `text`, marked when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        format!("{}…", text.chars().take(max).collect::<String>())
    }
}

/// The corrected turns at the end of the run so far, all of one kind: what the reason
/// says when maxTurns ends the run.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Streak {
    kind: Option<CorrectionKind>,
    turns: u32,
}

impl Streak {
    /// After each turn: the kind of correction that turn got, `None` if it ran something.
    pub(crate) fn push(&mut self, kind: Option<CorrectionKind>) {
        match kind {
            Some(kind) if self.kind == Some(kind) => self.turns += 1,
            Some(kind) => {
                *self = Streak {
                    kind: Some(kind),
                    turns: 1,
                }
            }
            None => *self = Streak::default(),
        }
    }

    /// Why the run ended after `turns` turns, all of maxTurns.
    pub(crate) fn turn_limit_reason(self, turns: u32) -> String {
        let unfinished = format!("the model took {turns} turns without finishing (maxTurns)");
        match (self.kind, self.turns) {
            (Some(CorrectionKind::NoToolCall), n) if n == turns => {
                format!("the model did not call a tool in {turns} turns (maxTurns)")
            }
            (Some(CorrectionKind::NoToolCall), n) => {
                format!("{unfinished}; it called no tool in the last {n}")
            }
            (Some(CorrectionKind::MalformedCall), n) if n == turns => format!(
                "malformed tool calls until the turn limit: none of the model's {turns} turns had a call that could run (maxTurns)"
            ),
            (Some(CorrectionKind::MalformedCall), n) => {
                format!("{unfinished}; its tool calls were malformed in the last {n}")
            }
            (Some(CorrectionKind::RepeatedScript), n) => {
                format!("{unfinished}; it sent a failed script again, unchanged, in the last {n}")
            }
            (None, _) => unfinished,
        }
    }
}

/// Corrected turns the same as the one before, in a row, that end a run: the model was
/// told twice what was wrong and sent the same thing a third time.
pub(crate) const SAME_TURN_LIMIT: u32 = 3;

/// The model's corrected turns, to stop one that sends the same turn again and again
/// (a small model at a low temperature does): what it sent (text and calls, ids left
/// out) and how many times in a row.
#[derive(Debug, Default)]
pub(crate) struct Echo {
    last: Option<String>,
    times: u32,
}

impl Echo {
    /// After each turn: what a turn that was corrected sent, `None` if anything in it
    /// ran. Returns how many times in a row the same corrected turn has come.
    pub(crate) fn push(&mut self, corrected: Option<String>) -> u32 {
        match corrected {
            Some(turn) if self.last.as_ref() == Some(&turn) => self.times += 1,
            Some(turn) => {
                self.last = Some(turn);
                self.times = 1;
            }
            None => *self = Echo::default(),
        }
        self.times
    }
}

/// A model turn as [`Echo`] compares it: its text and each call's name and arguments
/// as sent.
pub(crate) fn fingerprint(text: &str, calls: &[ToolCall]) -> String {
    let mut print = text.trim().to_string();
    for call in calls {
        print.push('\n');
        print.push_str(&call.name);
        print.push(' ');
        match &call.raw_arguments {
            Some(raw) => print.push_str(raw),
            None => print.push_str(&call.arguments.to_string()),
        }
    }
    print
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn run_script() -> ToolSpec {
        ToolSpec {
            name: "run_script".into(),
            description: String::new(),
            parameters: json!({"type": "object", "properties": {
                "language": {"type": "string", "enum": ["node", "python", "sh"]},
                "script": {"type": "string"}
            }, "required": ["language", "script"]}),
        }
    }

    fn call(arguments: Value, raw: Option<&str>) -> ToolCall {
        ToolCall {
            id: "call_1".into(),
            name: "run_script".into(),
            arguments,
            raw_arguments: raw.map(str::to_string),
        }
    }

    fn message(call: &ToolCall) -> Option<String> {
        Correction::malformed_call(1, call, &[run_script()]).map(|c| c.message)
    }

    #[test]
    fn the_shape_comes_from_the_schema() {
        assert_eq!(
            shape(&run_script()),
            r#"{"language": "node" | "python" | "sh", "script": "<string>"}"#
        );
    }

    #[test]
    fn a_call_of_the_right_shape_is_not_corrected() {
        assert_eq!(
            message(&call(json!({"language": "sh", "script": "true"}), None)),
            None
        );
    }

    #[test]
    fn each_problem_is_named_with_the_shape_to_send() {
        let shape = shape(&run_script());
        for (arguments, raw, needle) in [
            (
                json!({}),
                Some(r#"{"language": "sh", "script": "echo "hi""}"#),
                "not valid JSON (expected `,` or `}` at line 1 column 37), near: {\"language\": \"sh\", \"script\": \"echo \"hi\"\"}",
            ),
            (json!({}), Some(""), "the arguments are empty"),
            (
                json!({}),
                Some("[1, 2]"),
                "must be a JSON object, not an array: [1, 2]",
            ),
            (
                json!({"language": "sh"}),
                None,
                "argument \"script\" is missing",
            ),
            (
                json!({"language": "sh", "script": ["a", "b"]}),
                None,
                "argument \"script\" must be a string, not an array",
            ),
            (
                json!({"language": "ruby", "script": "x"}),
                None,
                "argument \"language\" is \"ruby\", not one of \"node\", \"python\", \"sh\"",
            ),
        ] {
            let text = message(&call(arguments, raw)).expect("corrected");
            assert!(text.starts_with("run_script: "), "{text}");
            assert!(text.contains(needle), "{needle:?} in {text}");
            assert!(text.contains(&shape), "{text}");
        }
    }

    #[test]
    fn long_unparsable_arguments_are_quoted_around_the_error_only() {
        // Newlines escaped, but the quotes of the last line not: it breaks at the end.
        let script = format!("{}print(\"done\")", "x = 1\\n".repeat(500));
        let raw = format!(r#"{{"language": "python", "script": "{script}"}}"#);
        let text = message(&call(json!({}), Some(&raw))).expect("corrected");
        assert!(text.contains("at line 1 column 3542"), "{text}");
        assert!(text.contains("near: … 1\\nx = 1"), "{text}");
        assert!(
            text.contains(r#"x = 1\nprint("done")"}; nothing ran"#),
            "{text}"
        );
        assert!(text.len() < 700, "{} chars: {text}", text.len());
    }

    #[test]
    fn an_unknown_tool_lists_the_tools() {
        let mut bad = call(json!({"code": "print(1)"}), None);
        bad.name = "python".into();
        let correction = Correction::malformed_call(3, &bad, &[run_script()]).expect("corrected");
        assert!(
            correction.message.starts_with("unknown tool \"python\""),
            "{}",
            correction.message
        );
        assert!(correction.message.contains("run_script {"));
        assert_eq!(correction.received, r#"{"code":"print(1)"}"#);
        assert_eq!(correction.tool_call_id.as_deref(), Some("call_1"));
    }

    #[test]
    fn a_code_block_is_named_in_the_correction() {
        let prose = Correction::no_tool_call(2, "I would do it like this.", false, &[run_script()]);
        let code = Correction::no_tool_call(2, "```python\nprint(1)\n```", true, &[run_script()]);
        assert!(
            prose
                .message
                .starts_with("You answered without calling a tool")
        );
        assert!(code.message.contains("code block"), "{}", code.message);
        assert!(code.message.contains("No run has made verified files yet"));
        for c in [&prose, &code] {
            assert!(
                c.message.contains("call the tool run_script"),
                "{}",
                c.message
            );
            assert_eq!(c.kind, CorrectionKind::NoToolCall);
        }
    }

    #[test]
    fn the_reason_names_the_streak_that_hit_the_limit() {
        let mut streak = Streak::default();
        for _ in 0..3 {
            streak.push(Some(CorrectionKind::NoToolCall));
        }
        assert_eq!(
            streak.turn_limit_reason(3),
            "the model did not call a tool in 3 turns (maxTurns)"
        );
        streak.push(Some(CorrectionKind::MalformedCall));
        assert!(
            streak
                .turn_limit_reason(4)
                .ends_with("its tool calls were malformed in the last 1"),
            "{}",
            streak.turn_limit_reason(4)
        );
        streak.push(None);
        assert_eq!(
            streak.turn_limit_reason(5),
            "the model took 5 turns without finishing (maxTurns)"
        );
    }
}
