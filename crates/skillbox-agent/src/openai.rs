//! `OpenAiProvider`: a `ModelProvider` for any OpenAI-compatible
//! `POST {base}/chat/completions` endpoint with tool calling (OpenAI, vLLM, llama.cpp,
//! llama-cpp-python, Ollama, LM Studio, LiteLLM, …). Owns the wire format (the interop
//! rules of design.md §5.5.1: a request every such server accepts), which answers are
//! retried and which are the request's fault, timeouts and cancellation.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use skillbox_env::CancellationToken;

use crate::provider::{
    Message, ModelProvider, ProviderError, Reply, Role, ToolCall, ToolSpec, Usage,
};

/// Environment variable naming the endpoint base, e.g. `https://api.openai.com/v1`.
pub const ENV_MODEL_URL: &str = "SKILLBOX_MODEL_URL";
/// Environment variable naming the model, e.g. `gpt-4o`.
pub const ENV_MODEL: &str = "SKILLBOX_MODEL";
/// Environment variable holding the API key; unset or empty sends no `Authorization`.
pub const ENV_API_KEY: &str = "SKILLBOX_API_KEY";

/// First backoff delay; it doubles on each retry.
const INITIAL_BACKOFF: Duration = Duration::from_millis(250);
/// No wait between attempts is longer than this, whatever `Retry-After` asks for.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How much of an error body goes into `ProviderError::Http`.
const ERROR_BODY_CHARS: usize = 500;
/// A chat completion is small; a bigger answer is a broken or hostile endpoint.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// Where the model is and how patiently to talk to it.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// Base URL up to (not including) `/chat/completions`, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub model: String,
    /// Sent as `Authorization: Bearer …` when set.
    pub api_key: Option<String>,
    /// Bound on one HTTP attempt, from connect to the last byte of the answer.
    pub timeout: Duration,
    /// Extra attempts after a 429, a 5xx or a connect error.
    pub max_retries: u32,
}

impl OpenAiConfig {
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    pub const DEFAULT_MAX_RETRIES: u32 = 3;

    /// A config with no key and the default timeout and retries.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            max_retries: Self::DEFAULT_MAX_RETRIES,
        }
    }

    /// Reads `SKILLBOX_MODEL_URL`, `SKILLBOX_MODEL` and `SKILLBOX_API_KEY`.
    pub fn from_env() -> Result<Self, ProviderError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Like [`from_env`](Self::from_env), reading variables through `lookup`; an empty
    /// value counts as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ProviderError> {
        let get = |name: &str| {
            lookup(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let required = |name: &str, example: &str| {
            get(name).ok_or_else(|| {
                ProviderError::Config(format!("{name} is not set: set it to {example}"))
            })
        };
        let base_url = required(
            ENV_MODEL_URL,
            "the endpoint base, e.g. https://api.openai.com/v1",
        )?;
        let model = required(ENV_MODEL, "the model name, e.g. gpt-4o")?;
        let config = OpenAiConfig {
            api_key: get(ENV_API_KEY),
            ..OpenAiConfig::new(base_url, model)
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the URL (http or https, a host, no query or fragment), the model and the
    /// timeout; returns the completions endpoint.
    pub fn validate(&self) -> Result<reqwest::Url, ProviderError> {
        let base = self.base_url.trim().trim_end_matches('/');
        let url = reqwest::Url::parse(base).map_err(|e| {
            ProviderError::Config(format!(
                "model URL {base:?} is not a URL ({e}): use e.g. https://api.openai.com/v1"
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(ProviderError::Config(format!(
                "model URL {base:?} has scheme {:?}: use http:// or https://",
                url.scheme()
            )));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(ProviderError::Config(format!(
                "model URL {base:?} has no host"
            )));
        }
        // Credentials in the URL would end up in errors and records: the key goes in
        // SKILLBOX_API_KEY. (The message names the host only.)
        if !url.username().is_empty() || url.password().is_some() {
            return Err(ProviderError::Config(format!(
                "the model URL for host {:?} carries credentials: remove them and set SKILLBOX_API_KEY",
                url.host_str().unwrap_or("")
            )));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(ProviderError::Config(format!(
                "model URL {base:?} has a query or fragment: give only the base, e.g. https://api.openai.com/v1"
            )));
        }
        if self.model.trim().is_empty() {
            return Err(ProviderError::Config("model name is empty".to_string()));
        }
        if self.timeout.is_zero() {
            return Err(ProviderError::Config("model timeout is zero".to_string()));
        }
        reqwest::Url::parse(&format!("{base}/chat/completions")).map_err(|e| {
            ProviderError::Config(format!(
                "model URL {base:?}: cannot append /chat/completions: {e}"
            ))
        })
    }
}

// The key must not reach logs through `{:?}`.
impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .finish()
    }
}

/// A chat model behind an OpenAI-compatible `/chat/completions` endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    endpoint: reqwest::Url,
    http: reqwest::Client,
    /// False once the server refused `tool_choice` (vLLM started without
    /// `--enable-auto-tool-choice` does): from then on it is left out.
    tool_choice: Arc<AtomicBool>,
}

impl OpenAiProvider {
    /// Validates `config` and builds the HTTP client; sends nothing yet.
    pub fn new(config: OpenAiConfig) -> Result<Self, ProviderError> {
        let endpoint = config.validate()?;
        let http = reqwest::Client::builder()
            // A redirected POST becomes a GET, and a bearer key should not follow it.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(config.timeout)
            .build()
            .map_err(|e| ProviderError::Config(format!("http client: {}", error_chain(&e))))?;
        Ok(OpenAiProvider {
            config,
            endpoint,
            http,
            tool_choice: Arc::new(AtomicBool::new(true)),
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The completions endpoint requests go to.
    pub fn endpoint(&self) -> &reqwest::Url {
        &self.endpoint
    }

    /// Whether requests with tools still carry `tool_choice: "auto"` (false once the
    /// server refused it).
    pub fn sends_tool_choice(&self) -> bool {
        self.tool_choice.load(Ordering::Relaxed)
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn timeout_ms(&self) -> u64 {
        u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX)
    }

    /// One POST, the answer read in full, bounded by the caller's timeout.
    async fn attempt(&self, body: Bytes) -> Result<Bytes, Failure> {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| self.transport(&e))?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let bytes = read_capped(response)
            .await
            .map_err(|e| self.transport(&e))?;
        if status.is_success() {
            let Some(bytes) = bytes else {
                return Err(Failure::Stop(ProviderError::Malformed(format!(
                    "the answer is larger than {MAX_ANSWER_BYTES} bytes"
                ))));
            };
            return Ok(bytes);
        }
        let text = bytes
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        Err(match classify(status.as_u16(), &text) {
            Verdict::Retry => Failure::Retry {
                error: ProviderError::Http {
                    status: status.as_u16(),
                    body: cut(text.trim(), ERROR_BODY_CHARS),
                },
                after: retry_after,
            },
            Verdict::Refused(message) => Failure::Stop(ProviderError::Refused {
                status: status.as_u16(),
                message: cut(&message, ERROR_BODY_CHARS),
            }),
        })
    }

    fn transport(&self, e: &reqwest::Error) -> Failure {
        let error =
            ProviderError::Unreachable(format!("{}: {}", self.config.base_url, error_chain(e)));
        if e.is_connect() {
            Failure::Retry { error, after: None }
        } else {
            Failure::Stop(error)
        }
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    fn name(&self) -> String {
        format!("openai:{}", self.config.model)
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        cancel: &CancellationToken,
    ) -> Result<Reply, ProviderError> {
        let with_choice = self.sends_tool_choice() && !tools.is_empty();
        match self.post(messages, tools, with_choice, cancel).await {
            // Refused over `tool_choice` alone: once more without it, and never again.
            Err(ProviderError::Refused { message, .. })
                if with_choice && names_tool_choice(&message) =>
            {
                tracing::warn!(
                    provider = %self.name(),
                    "the server refused tool_choice ({message}); sending requests without it"
                );
                self.tool_choice.store(false, Ordering::Relaxed);
                self.post(messages, tools, false, cancel).await
            }
            other => other,
        }
    }
}

impl OpenAiProvider {
    /// One chat request, retried after a 429, a 5xx that is not the request's fault
    /// or a connect error.
    async fn post(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        tool_choice: bool,
        cancel: &CancellationToken,
    ) -> Result<Reply, ProviderError> {
        let request = ChatRequest::new(&self.config.model, messages, tools, tool_choice);
        let body = serde_json::to_vec(&request)
            .map_err(|e| ProviderError::Malformed(format!("cannot encode the request: {e}")))?;
        let body = Bytes::from(body);
        let mut retries = 0u32;
        loop {
            if cancel.is_cancelled() {
                return Err(ProviderError::Cancelled);
            }
            let attempt = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(ProviderError::Cancelled),
                outcome = tokio::time::timeout(self.config.timeout, self.attempt(body.clone())) => {
                    outcome.map_err(|_| ProviderError::Timeout(self.timeout_ms()))?
                }
            };
            let (error, after) = match attempt {
                Ok(bytes) => return parse_answer(&bytes),
                Err(Failure::Stop(error)) => return Err(error),
                Err(Failure::Retry { error, after }) => (error, after),
            };
            if retries >= self.config.max_retries {
                return Err(error);
            }
            let delay = retry_delay(after, retries);
            tracing::warn!(
                provider = %self.name(),
                retry = retries + 1,
                of = self.config.max_retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                "{error}; retrying"
            );
            sleep_or_cancel(delay, cancel).await?;
            retries += 1;
        }
    }
}

/// How one attempt failed: worth another try (after `after`, if the server said), or not.
enum Failure {
    Retry {
        error: ProviderError,
        after: Option<Duration>,
    },
    Stop(ProviderError),
}

impl From<Failure> for ProviderError {
    fn from(failure: Failure) -> Self {
        match failure {
            Failure::Retry { error, .. } | Failure::Stop(error) => error,
        }
    }
}

/// Whether a refusal is about `tool_choice` (vLLM: `"auto" tool choice requires
/// --enable-auto-tool-choice …`).
fn names_tool_choice(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("tool_choice") || lower.contains("tool choice")
}

/// What an error answer means for the request that got it.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The server is busy or broken: the same request may go through later.
    Retry,
    /// The request's own fault (its shape, the model's name, the key, the context
    /// window): the same request would be refused again. The server's message.
    Refused(String),
}

/// Which error answers are worth another try: a 408, a 429 and a 5xx, except a 5xx
/// whose body says the request failed validation (llama-cpp-python answers a request
/// its schema refuses with a 500 that says `validation error`). Every other status is
/// the request's fault.
fn classify(status: u16, body: &str) -> Verdict {
    let message = server_message(body);
    let validation = {
        let lower = message.to_ascii_lowercase();
        lower.contains("validation error") || lower.contains("validationerror")
    };
    match status {
        408 | 429 => Verdict::Retry,
        500..=599 if !validation => Verdict::Retry,
        401 | 403 => Verdict::Refused(format!(
            "{message} (check {ENV_API_KEY}: the server did not take the key it was sent)"
        )),
        404 => Verdict::Refused(format!(
            "{message} (check {ENV_MODEL_URL}, the base up to /chat/completions such as http://127.0.0.1:8000/v1, and {ENV_MODEL})"
        )),
        300..=399 => Verdict::Refused(format!(
            "the model URL redirects ({message}): set {ENV_MODEL_URL} to where it leads"
        )),
        _ => Verdict::Refused(message),
    }
}

/// The message in an error body: OpenAI's `{"error":{"message"}}` (vLLM, llama.cpp,
/// llama-cpp-python, LiteLLM), Ollama's `{"error":"…"}`, FastAPI's
/// `{"detail":[{"loc","msg"}]}`, a bare `{"message"}`, else the text itself.
fn server_message(body: &str) -> String {
    let text = body.trim();
    let Ok(json) = serde_json::from_str::<serde_json::Value>(text) else {
        return if text.is_empty() {
            "(no body)".to_string()
        } else {
            text.to_string()
        };
    };
    let found = json["error"]["message"]
        .as_str()
        .or_else(|| json["error"].as_str())
        .or_else(|| json["message"].as_str())
        .or_else(|| json["detail"].as_str())
        .map(str::to_string)
        .or_else(|| {
            let details = json["detail"].as_array()?;
            let lines: Vec<String> = details
                .iter()
                .map(|d| {
                    let at: Vec<String> = d["loc"]
                        .as_array()
                        .map(|loc| {
                            loc.iter()
                                .map(|part| match part {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    format!(
                        "{}: {}",
                        at.join("."),
                        d["msg"].as_str().unwrap_or("invalid")
                    )
                })
                .collect();
            Some(format!("validation error: {}", lines.join("; ")))
        });
    found.unwrap_or_else(|| text.to_string())
}

fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The wait before retry number `retries + 1`: the server's `Retry-After` when it
/// sent one, else exponential backoff; never more than `MAX_BACKOFF`.
fn retry_delay(after: Option<Duration>, retries: u32) -> Duration {
    after.unwrap_or_else(|| backoff(retries)).min(MAX_BACKOFF)
}

fn backoff(retries: u32) -> Duration {
    INITIAL_BACKOFF
        .saturating_mul(2u32.saturating_pow(retries))
        .min(MAX_BACKOFF)
}

async fn sleep_or_cancel(delay: Duration, cancel: &CancellationToken) -> Result<(), ProviderError> {
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(ProviderError::Cancelled),
        () = tokio::time::sleep(delay) => Ok(()),
    }
}

/// `Retry-After` in seconds; the HTTP-date form is rare from model APIs and falls back
/// to exponential backoff.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    value.parse::<u64>().ok().map(Duration::from_secs)
}

/// The whole body, or `None` past `MAX_ANSWER_BYTES`.
async fn read_capped(mut response: reqwest::Response) -> Result<Option<Bytes>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if out.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Ok(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Some(Bytes::from(out)))
}

/// reqwest's top-level message hides the cause (`connection refused`, `dns error`, …).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

// ---- wire format: request ----

/// The request: `model`, `messages`, and with tools `tools` and `tool_choice: "auto"`;
/// nothing else (no `parallel_tool_calls`, `stream`, `max_tokens`, sampling fields):
/// each of those is refused by some server or model (o-series models refuse
/// `max_tokens`, several servers `parallel_tool_calls`), and their defaults suit.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    // OpenAI rejects an empty `tools` array, and `tool_choice` without tools.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    // "auto" is OpenAI's default with tools, but llama-cpp-python's
    // chatml-function-calling offers the tools only when it is sent; vLLM without
    // --enable-auto-tool-choice refuses it, and then it is left out (`complete`).
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
}

impl<'a> ChatRequest<'a> {
    fn new(
        model: &'a str,
        messages: &'a [Message],
        tools: &'a [ToolSpec],
        tool_choice: bool,
    ) -> Self {
        ChatRequest {
            model,
            messages: messages.iter().map(WireMessage::from).collect(),
            tools: tools
                .iter()
                .map(|t| WireTool {
                    kind: "function",
                    function: WireFunctionSpec {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
            tool_choice: (tool_choice && !tools.is_empty()).then_some("auto"),
        }
    }
}

#[derive(Serialize)]
struct WireMessage<'a> {
    role: &'static str,
    /// Always a string, `""` for an assistant turn that is only tool calls: OpenAI
    /// takes `null` there, but llama-cpp-python's schema (and others) want a string
    /// and answer `null` with an error.
    content: &'a str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireCallOut<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
}

impl<'a> From<&'a Message> for WireMessage<'a> {
    fn from(m: &'a Message) -> Self {
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        WireMessage {
            role,
            content: m.content.as_str(),
            tool_calls: m
                .tool_calls
                .iter()
                // The id as the server gave it: some check the ids of a history
                // against the calls they made (Mistral's nine characters, for one).
                .map(|c| WireCallOut {
                    id: &c.id,
                    kind: "function",
                    function: WireFunctionOut {
                        name: &c.name,
                        // The API wants the arguments as a JSON string, not an object.
                        // A call whose arguments did not parse goes back as `{}` (its
                        // `arguments`), not as the model sent it: vLLM, for one, parses
                        // the arguments of earlier calls and would refuse the request.
                        arguments: c.arguments.to_string(),
                    },
                })
                .collect(),
            tool_call_id: m.tool_call_id.as_deref(),
        }
    }
}

#[derive(Serialize)]
struct WireCallOut<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionOut<'a>,
}

#[derive(Serialize)]
struct WireFunctionOut<'a> {
    name: &'a str,
    arguments: String,
}

#[derive(Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionSpec<'a>,
}

#[derive(Serialize)]
struct WireFunctionSpec<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a serde_json::Value,
}

// ---- wire format: answer ----
// Every field is optional here so that a missing one is reported by name below,
// instead of as a serde error about the whole body.

#[derive(Deserialize)]
struct ChatAnswer {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    message: Option<WireAnswerMessage>,
}

#[derive(Deserialize)]
struct WireAnswerMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireCallIn>>,
}

#[derive(Deserialize)]
struct WireCallIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunctionIn>,
}

#[derive(Deserialize)]
struct WireFunctionIn {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

fn parse_answer(bytes: &[u8]) -> Result<Reply, ProviderError> {
    let answer: ChatAnswer = serde_json::from_slice(bytes).map_err(|e| {
        let start: String = String::from_utf8_lossy(bytes).chars().take(200).collect();
        ProviderError::Malformed(format!(
            "the answer is not a chat completion ({e}): {start}"
        ))
    })?;
    let message = answer
        .choices
        .into_iter()
        .next()
        .ok_or_else(|| ProviderError::Malformed("the answer has no choices".to_string()))?
        .message
        .ok_or_else(|| ProviderError::Malformed("choices[0] has no message".to_string()))?;
    let tool_calls = message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(index, call)| tool_call(index, call))
        .collect::<Result<Vec<_>, _>>()?;
    let usage = answer
        .usage
        .and_then(|u| match (u.prompt_tokens, u.completion_tokens) {
            (None, None) => None,
            (prompt, completion) => Some(Usage {
                prompt_tokens: prompt.unwrap_or(0),
                completion_tokens: completion.unwrap_or(0),
            }),
        });
    Ok(Reply {
        message: Message {
            role: Role::Assistant,
            content: message.content.unwrap_or_default(),
            tool_calls,
            tool_call_id: None,
        },
        usage,
    })
}

/// One tool call, checked: an id and a name, without which it cannot be answered.
/// Arguments that are not a JSON object are the model's mistake, not the server's: the
/// call is handed over with them raw, and the loop answers it with a correction.
fn tool_call(index: usize, call: WireCallIn) -> Result<ToolCall, ProviderError> {
    let name = call
        .function
        .as_ref()
        .and_then(|f| f.name.clone())
        .filter(|n| !n.is_empty());
    let label = match (&name, &call.id) {
        (Some(name), Some(id)) => format!("tool call {index} ({name}, id {id})"),
        (Some(name), None) => format!("tool call {index} ({name})"),
        (None, Some(id)) => format!("tool call {index} (id {id})"),
        (None, None) => format!("tool call {index}"),
    };
    let malformed = |what: &str| ProviderError::Malformed(format!("{label}: {what}"));
    let id = call
        .id
        .clone()
        .filter(|id| !id.is_empty())
        .ok_or_else(|| malformed("has no id"))?;
    let name = name.ok_or_else(|| malformed("has no function name"))?;
    let (arguments, raw_arguments) = match call.function.and_then(|f| f.arguments) {
        Some(serde_json::Value::String(text)) => {
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(value @ serde_json::Value::Object(_)) => (value, None),
                _ => (no_arguments(), Some(text)),
            }
        }
        // Some compatible servers send the object itself rather than a string.
        Some(value @ serde_json::Value::Object(_)) => (value, None),
        Some(other) => (no_arguments(), Some(other.to_string())),
        None => (no_arguments(), Some(String::new())),
    };
    Ok(ToolCall {
        id,
        name,
        arguments,
        raw_arguments,
    })
}

fn no_arguments() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_wins_over_backoff_and_is_capped() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(
            reqwest::header::RETRY_AFTER,
            reqwest::header::HeaderValue::from_static("0"),
        );
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        assert_eq!(retry_delay(retry_after(&headers), 4), Duration::ZERO);
        headers.insert(
            reqwest::header::RETRY_AFTER,
            reqwest::header::HeaderValue::from_static("3"),
        );
        assert_eq!(
            retry_delay(retry_after(&headers), 0),
            Duration::from_secs(3)
        );
        headers.insert(
            reqwest::header::RETRY_AFTER,
            reqwest::header::HeaderValue::from_static("3600"),
        );
        assert_eq!(retry_delay(retry_after(&headers), 0), MAX_BACKOFF);
        headers.insert(
            reqwest::header::RETRY_AFTER,
            reqwest::header::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_delay(retry_after(&headers), 1), backoff(1));
        assert_eq!(retry_delay(None, 2), backoff(2));
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_echoing_them() {
        let config = OpenAiConfig::new("https://user:hunter2@api.example.com/v1", "m");
        let err = config.validate().expect_err("credentials in the URL");
        assert!(err.to_string().contains("credentials"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn backoff_doubles_from_250ms_and_stops_at_10s() {
        assert_eq!(backoff(0), Duration::from_millis(250));
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_millis(1000));
        assert_eq!(backoff(6), MAX_BACKOFF);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    // The integration tests cannot tell a cancelled backoff from a cancelled request.
    #[tokio::test]
    async fn cancel_ends_a_backoff_sleep() {
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        let sleep = tokio::spawn(async move { sleep_or_cancel(MAX_BACKOFF * 6, &cancel).await });
        trigger.cancel();
        let result = tokio::time::timeout(Duration::from_secs(5), sleep).await;
        assert_eq!(
            result.ok().and_then(Result::ok),
            Some(Err(ProviderError::Cancelled))
        );
    }
}
