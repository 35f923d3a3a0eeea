//! [`SkillboxMcp`], the MCP handler of one MCP session: the tools, and the files its
//! runs made as resources.
//!
//! A session acts as one tenant: the tenant of the first request that reaches it (over
//! HTTP, the tenant of its API key; on stdio, the local one). A request of another
//! tenant is refused as if the session were not there.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use base64::Engine;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Extensions,
    Implementation, InitializeRequestParams, InitializeResult, ListResourcesResult,
    ListToolsResult, MetaObject, PaginatedRequestParams, ProtocolVersion,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde::Serialize;
use serde_json::json;
use skillbox_door::parse_path;
use skillbox_env::{CancellationToken, ErrorCode, ExecOutput, ExecRequest, json_string_len};
use skillbox_protocol::{
    ArtifactInfo, CapabilityRunRequest, MAX_TIMEOUT_MS, RunRequest, SandboxedKind,
};
use skillbox_run::Runner;
use skillbox_skills::{SkillSet, Sources};
use skillbox_store::is_sha256_hex;

use crate::door::{Door, Held, ToolError};
use crate::holds::AnswerHolds;
use crate::progress::Reporter;
use crate::sandboxes::{Running, Sandbox, Sandboxes};
use crate::tools::{self, parse};

/// The largest resource `resources/read` hands out (a larger one is downloaded over
/// HTTP); `read_file`'s is the runner's `ReadCaps::mcp`.
const MAX_RESOURCE_BYTES: u64 = 32 * 1024 * 1024;

/// The most an answer that carries `copies` of a content of `in_json` bytes as a JSON
/// string holds in memory at once while it is made and sent: the copies in the result
/// (`read_file`: its text and the structured content; `resources/read`: one), then the
/// JSON-RPC message serialized with them, then that message framed as an SSE event
/// (rmcp 3.11, sse-stream 0.2): twice the copies at most, and 4 KiB for the rest.
fn answer_bytes(copies: usize, in_json: usize) -> usize {
    in_json.saturating_mul(2 * copies).saturating_add(4096)
}

/// The length of `n` bytes in padded base64.
fn base64_len(n: usize) -> usize {
    n.div_ceil(3).saturating_mul(4)
}
/// What a session that is not the caller's is answered, as JSON-RPC (here, and by
/// `/mcp` before rmcp sees the request).
pub(crate) const NO_SUCH_SESSION: &str = "no such MCP session for this API key";

/// Where a made file's resource URI starts.
pub(crate) const OBJECTS_URI: &str = "skillbox://objects/";

/// The tenant an HTTP request acts as, put in its extensions by the server's key check
/// before the request reaches `/mcp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub Arc<str>);

/// What every session of one MCP server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) runner: Arc<Runner>,
    pub(crate) door: Arc<dyn Door>,
    pub(crate) sandboxes: Arc<Sandboxes>,
    /// A session's sandbox backend when its first call names none.
    pub(crate) default_backend: SandboxedKind,
    /// The tenant of a request that carries no HTTP parts (stdio); `None` refuses it.
    pub(crate) local_tenant: Option<Arc<str>>,
    /// Cancelled when the server stops: every call with it.
    pub(crate) stopping: CancellationToken,
}

/// A file a run of this session made, listed as a resource.
#[derive(Debug, Clone)]
struct Made {
    uri: String,
    file: ArtifactInfo,
}

/// The handler of one MCP session.
#[derive(Debug)]
pub struct SkillboxMcp {
    shared: Arc<Shared>,
    /// This session's key in the sandbox table.
    key: u64,
    tenant: OnceLock<Arc<str>>,
    /// Opened on first use; the lock makes two first calls open one sandbox.
    sandbox: tokio::sync::Mutex<Option<Arc<Sandbox>>>,
    made: Mutex<Vec<Made>>,
}

impl Drop for SkillboxMcp {
    /// The session ended (its transport closed, it was deleted or it idled out): its
    /// sandbox is removed.
    fn drop(&mut self) {
        self.shared.sandboxes.release(self.key);
    }
}

/// A resource URI of a made file: `skillbox://objects/{sha256}/{name}`.
pub(crate) fn object_uri(sha256: &str, path: &str) -> String {
    let name = path.rsplit('/').next().unwrap_or(path);
    format!("{OBJECTS_URI}{sha256}/{}", percent_encode(name))
}

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

/// The sha256 a resource URI names, if it is one of ours.
fn object_of(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix(OBJECTS_URI)?;
    let (sha256, _name) = rest.split_once('/').unwrap_or((rest, ""));
    is_sha256_hex(sha256).then_some(sha256)
}

/// A timeout the caller asked for, in 1..=600000 ms.
fn timeout(field: &str, asked: Option<u64>) -> Result<Option<Duration>, ToolError> {
    match asked {
        None => Ok(None),
        Some(ms) if ms == 0 || ms > MAX_TIMEOUT_MS => Err(ToolError::invalid(format!(
            "{field}: {ms} is out of range 1..={MAX_TIMEOUT_MS}"
        ))),
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
    }
}

/// A tool's answer: `value` as structured content and as text, an error when `failed`.
fn answer(value: serde_json::Value, mut extra: Vec<ContentBlock>, failed: bool) -> CallToolResult {
    let text = serde_json::to_string_pretty(&value).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.append(&mut extra);
    let mut result = if failed {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    result.structured_content = Some(value);
    result
}

fn failure(tool: &str, error: &ToolError) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{tool} failed ({}): {}",
        error.code.as_str(),
        error.message
    ))])
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MadeFile<'a> {
    path: &'a str,
    size: u64,
    sha256: &'a str,
    content_type: &'a str,
    uri: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
}

impl SkillboxMcp {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        SkillboxMcp {
            key: shared.sandboxes.key(),
            shared,
            tenant: OnceLock::new(),
            sandbox: tokio::sync::Mutex::new(None),
            made: Mutex::new(Vec::new()),
        }
    }

    /// The tenant this request acts as, which must be the session's.
    fn caller(&self, extensions: &Extensions) -> Result<Arc<str>, ErrorData> {
        let asked = match extensions.get::<http::request::Parts>() {
            Some(parts) => parts.extensions.get::<Caller>().map(|c| c.0.clone()),
            None => self.shared.local_tenant.clone(),
        };
        let Some(asked) = asked else {
            return Err(ErrorData::invalid_request(
                "this request carries no tenant (the server must check its key before /mcp)",
                None,
            ));
        };
        let bound = self.tenant.get_or_init(|| asked.clone());
        if *bound != asked {
            return Err(ErrorData::invalid_request(NO_SUCH_SESSION, None));
        }
        Ok(asked)
    }

    fn downloads(&self) -> bool {
        self.shared.door.serves_downloads()
    }

    /// A token cancelled when the client cancels the call (`request`), when the session
    /// ends or when the server stops; and a guard that drops the link at the call's end.
    fn call_cancel(
        &self,
        request: &CancellationToken,
        ending: Option<&CancellationToken>,
    ) -> CancellationToken {
        let cancel = match ending {
            Some(ending) => ending.child_token(),
            None => self.shared.stopping.child_token(),
        };
        let (linked, asked, stopping) = (
            cancel.clone(),
            request.clone(),
            self.shared.stopping.clone(),
        );
        tokio::spawn(async move {
            tokio::select! {
                () = asked.cancelled() => linked.cancel(),
                () = stopping.cancelled() => linked.cancel(),
                () = linked.cancelled() => {}
            }
        });
        cancel
    }

    /// This session's sandbox, opened by the first call (of `backend`, else the
    /// server's default).
    async fn sandbox(
        &self,
        tenant: &Arc<str>,
        backend: Option<SandboxedKind>,
    ) -> Result<Arc<Sandbox>, ToolError> {
        let asked = backend;
        let mut slot = self.sandbox.lock().await;
        if let Some(sandbox) = slot.as_ref() {
            if let Some(asked) = asked.filter(|a| *a != sandbox.backend) {
                return Err(ToolError::invalid(format!(
                    "backend: this session's sandbox is {} (chosen by its first call); it cannot \
                     become {} (start another MCP session for that)",
                    sandbox.backend.as_str(),
                    asked.as_str()
                )));
            }
            return Ok(sandbox.clone());
        }
        let kind = asked.unwrap_or(self.shared.default_backend);
        let sandbox = self
            .shared
            .sandboxes
            .open_for(self.key, tenant, kind, &self.shared.runner)
            .await?;
        *slot = Some(sandbox.clone());
        Ok(sandbox)
    }

    async fn run_script(
        &self,
        tenant: &Arc<str>,
        arguments: tools::RunScript,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let request = RunRequest {
            language: arguments.language.into(),
            script: arguments.script,
            timeout_ms: arguments.timeout_ms,
            files: arguments.files.into_iter().map(Into::into).collect(),
            backend: arguments.backend.map(SandboxedKind::kind),
            outputs: Vec::new(),
            limits: None,
            skills: arguments.skills,
            scope_key: arguments.scope_key,
            network: arguments.network.map(Into::into),
            secrets: Default::default(),
        };
        let bytes =
            request.script.len() + request.files.iter().map(|f| f.content.len()).sum::<usize>();
        let admission = self.shared.door.admit(tenant, bytes).await?;
        // The run lives in its own task, as a `POST /v1/run` does: a call dropped midway
        // cancels it, and it still ends properly and removes its sandbox.
        let cancel = self.call_cancel(&context.ct, None);
        let _cancel_on_drop = cancel.clone().drop_guard();
        let runner = self.shared.runner.clone();
        let task_tenant = tenant.clone();
        let task = tokio::spawn(async move {
            let result = runner.run_as(request, &task_tenant, &cancel).await;
            drop(admission);
            result
        });
        let result = task
            .await
            .map_err(|e| ToolError::new(ErrorCode::Unknown, format!("the run failed: {e}")))??;
        self.shared.door.grant(tenant, &result.files).await?;
        let mut links = Vec::new();
        let mut files = Vec::new();
        for file in &result.files {
            let uri = object_uri(&file.sha256, &file.path);
            let url = self.downloads().then_some(file.url.as_str());
            links.push(ContentBlock::resource_link(self.resource(&uri, file)));
            files.push(MadeFile {
                path: &file.path,
                size: file.size,
                sha256: &file.sha256,
                content_type: &file.content_type,
                uri: uri.clone(),
                url,
            });
        }
        let mut value = json!({
            "exitCode": result.exit_code,
            "signal": result.signal,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timedOut": result.timed_out,
            "limitHit": result.limit_hit,
            "durationMs": result.duration_ms,
            "truncated": result.truncated,
            "files": files,
        });
        // With skills or a scope only, as in `RunResult`.
        if let Some(skills) = &result.skills {
            value["skills"] = json!(skills);
        }
        if let Some(snapshot) = &result.snapshot {
            value["snapshot"] = json!(snapshot);
        }
        // With a network policy only, as in `RunResult`.
        if !result.egress.is_empty() {
            value["egress"] = json!(result.egress);
        }
        let failed = result.exit_code != Some(0) || result.timed_out || result.limit_hit.is_some();
        if let Ok(mut made) = self.made.lock() {
            for file in &result.files {
                made.push(Made {
                    uri: object_uri(&file.sha256, &file.path),
                    file: file.clone(),
                });
            }
        }
        if !result.files.is_empty() {
            let _ = context.peer.notify_resource_list_changed().await;
        }
        Ok(answer(value, links, failed))
    }

    /// A made file as an MCP resource (with its download link over HTTP).
    fn resource(&self, uri: &str, file: &ArtifactInfo) -> Resource {
        let name = file.path.rsplit('/').next().unwrap_or(&file.path);
        let mut resource = Resource::new(uri, name)
            .with_title(file.path.clone())
            .with_mime_type(file.content_type.clone())
            .with_size(file.size);
        if self.downloads() {
            let mut meta = MetaObject::new();
            meta.0
                .insert("skillbox/downloadUrl".into(), json!(file.url));
            resource = resource
                .with_description(format!("made by a run; download: {}", file.url))
                .with_meta(meta);
        } else {
            resource = resource.with_description("made by a run");
        }
        resource
    }

    async fn exec(
        &self,
        tenant: &Arc<str>,
        arguments: tools::Exec,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let mut exec = match (arguments.command, arguments.shell) {
            (Some(argv), None) if !argv.is_empty() => ExecRequest::argv(argv),
            (None, Some(script)) => ExecRequest::shell(script),
            _ => {
                return Err(ToolError::invalid(
                    "exec: give exactly one of command (an argv, not empty) and shell (a script for /bin/sh -c)",
                ));
            }
        };
        let root = self.shared.runner.root();
        exec.cwd = Some(match &arguments.cwd {
            Some(cwd) => root.join(&parse_path(root, cwd, "cwd")?),
            None => root.as_path().to_path_buf(),
        });
        exec.stdin = arguments.stdin.map(String::into_bytes);
        exec.timeout = timeout("timeoutMs", arguments.timeout_ms)?;
        exec.validate()?;
        let sandbox = self.sandbox(tenant, arguments.backend).await?;
        let _running = Running::start(&sandbox)?;
        let cancel = self.call_cancel(&context.ct, Some(&sandbox.ending));
        let _cancel_on_drop = cancel.clone().drop_guard();
        let output: ExecOutput = match context.meta.get_progress_token() {
            None => sandbox.env.exec(exec, &cancel).await?,
            Some(token) => {
                let reporter = Reporter::start(context.peer.clone(), token);
                let collected = match sandbox.env.exec_stream(exec, &cancel).await {
                    Ok(stream) => stream.collect_seeing(|_, chunk| reporter.saw(chunk)).await,
                    Err(e) => Err(e),
                };
                reporter.finish().await;
                collected?
            }
        };
        let failed = !output.success() || output.limit_hit.is_some();
        let value = serde_json::to_value(&output).unwrap_or_default();
        Ok(answer(value, Vec::new(), failed))
    }

    async fn read_file(
        &self,
        tenant: &Arc<str>,
        arguments: tools::ReadFile,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let root = self.shared.runner.root();
        let path = parse_path(root, &arguments.path, "path")?;
        let sandbox = self.sandbox(tenant, arguments.backend).await?;
        let _running = Running::start(&sandbox)?;
        let cancel = self.call_cancel(&context.ct, Some(&sandbox.ending));
        let _cancel_on_drop = cancel.clone().drop_guard();
        let door = self.shared.runner.workspace(sandbox.env.as_ref());
        let cap = self.shared.runner.read_caps().mcp;
        let instead = "read a part with exec (head -c, tail -c)";
        let size = door
            .sized_file(
                &path,
                cap,
                &format!("list a directory with list_dir, {instead}"),
                &cancel,
            )
            .await?;
        // The answer stays in memory until it is sent, so it is held within the budget
        // of bytes in memory from before the read (as a file of that size in plain
        // text needs) until the answer's last byte is sent. The read itself holds
        // that size, against a file that grew or was swapped for a bigger one since.
        let shown = door.absolute(&path).display().to_string();
        let mut held = vec![self.hold_answer(
            context,
            answer_bytes(2, usize::try_from(size).unwrap_or(usize::MAX)),
            &shown,
            instead,
        )?];
        let bytes = door.read(&path, size, &cancel).await.map_err(|e| match e.code {
            ErrorCode::ResourceExhausted => ToolError::new(
                ErrorCode::ResourceExhausted,
                format!(
                    "{shown}: grew past the {size} bytes it had when read_file looked at it (it hands out at most {cap}); call read_file again, or {instead}"
                ),
            ),
            _ => e.into(),
        })?;
        let size = bytes.len();
        let text = String::from_utf8(bytes);
        // Escaped text, or base64, is longer in JSON than the file: the rest is held
        // before the answer is made.
        let in_json = match &text {
            Ok(text) => json_string_len(text),
            Err(binary) => base64_len(binary.as_bytes().len()),
        };
        if let Some(more) = answer_bytes(2, in_json).checked_sub(answer_bytes(2, size))
            && more > 0
        {
            held.push(self.hold_answer(context, more, &shown, instead)?);
        }
        Ok(match text {
            Ok(text) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(text.clone())]);
                result.structured_content = Some(json!({
                    "path": shown, "size": size, "encoding": "utf8", "content": text,
                }));
                result
            }
            Err(binary) => answer(
                json!({
                    "path": shown,
                    "size": size,
                    "encoding": "base64",
                    "content": base64::engine::general_purpose::STANDARD.encode(binary.as_bytes()),
                }),
                Vec::new(),
                false,
            ),
        })
    }

    /// Holds `bytes` of memory for this request's answer (what `what` is read into),
    /// kept until the answer is sent when the request came over HTTP
    /// ([`AnswerHolds`]), else until the returned guard is dropped. Refused, the error
    /// names `what`, and what to do `instead`.
    fn hold_answer(
        &self,
        context: &RequestContext<RoleServer>,
        bytes: usize,
        what: &str,
        instead: &str,
    ) -> Result<Option<Held>, ToolError> {
        // The session's tenant (its first call bound it): its share of the budget.
        let tenant = self.tenant.get().cloned().unwrap_or_else(|| Arc::from(""));
        let held = self.shared.door.hold_memory(&tenant, bytes).map_err(|e| {
            ToolError::new(e.code, format!("{what}: {e}, or {instead}", e = e.message))
        })?;
        let holds = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.extensions.get::<AnswerHolds>());
        Ok(match holds {
            Some(holds) => {
                holds.keep(held);
                None
            }
            None => Some(held),
        })
    }

    async fn write_file(
        &self,
        tenant: &Arc<str>,
        arguments: tools::WriteFile,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let root = self.shared.runner.root();
        let path = parse_path(root, &arguments.path, "path")?;
        if path.is_root() {
            return Err(ToolError::invalid(format!(
                "path: names {root} itself; give a file"
            )));
        }
        let content = match arguments.encoding {
            tools::ContentEncoding::Utf8 => arguments.content.into_bytes(),
            tools::ContentEncoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(arguments.content.trim())
                .map_err(|e| ToolError::invalid(format!("content: not valid base64: {e}")))?,
        };
        let size = content.len();
        let sandbox = self.sandbox(tenant, arguments.backend).await?;
        let _running = Running::start(&sandbox)?;
        let cancel = self.call_cancel(&context.ct, Some(&sandbox.ending));
        let _cancel_on_drop = cancel.clone().drop_guard();
        let door = self.shared.runner.workspace(sandbox.env.as_ref());
        door.write(&path, content.into(), arguments.executable, &cancel)
            .await?;
        Ok(answer(
            json!({"written": door.absolute(&path).display().to_string(), "bytes": size}),
            Vec::new(),
            false,
        ))
    }

    async fn list_dir(
        &self,
        tenant: &Arc<str>,
        arguments: tools::ListDir,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let path = parse_path(
            self.shared.runner.root(),
            arguments.path.as_deref().unwrap_or(""),
            "path",
        )?;
        let sandbox = self.sandbox(tenant, arguments.backend).await?;
        let _running = Running::start(&sandbox)?;
        let cancel = self.call_cancel(&context.ct, Some(&sandbox.ending));
        let _cancel_on_drop = cancel.clone().drop_guard();
        let door = self.shared.runner.workspace(sandbox.env.as_ref());
        let listed = door.list(&path, &cancel).await?;
        let path = door.absolute(&path);
        // A listing of many long names is megabytes: held in the budget until it is
        // sent, as a read_file answer is: its JSON (each entry, pretty-printed, its name
        // and at most about 80 bytes more) as answer_bytes counts it, and the structured
        // content's tree of values, about 768 bytes an entry besides its name.
        let in_json = listed
            .iter()
            .map(|entry| json_string_len(&entry.name) + 80)
            .sum();
        let tree = listed
            .iter()
            .map(|entry| entry.name.len() + 768)
            .sum::<usize>();
        let shown = path.display().to_string();
        let _held = self.hold_answer(
            context,
            answer_bytes(2, in_json).saturating_add(tree),
            &shown,
            "list a directory beneath it",
        )?;
        // The sizes come with the listing: no look per file (on a container backend, a
        // process each).
        let entries: Vec<serde_json::Value> = listed
            .into_iter()
            .map(|entry| {
                json!({"name": entry.name, "kind": entry.kind.as_str(), "size": entry.size})
            })
            .collect();
        // Moved in, not copied (as `json!` would copy a variable).
        let mut value = serde_json::Map::new();
        value.insert("path".into(), path.display().to_string().into());
        value.insert("entries".into(), serde_json::Value::Array(entries));
        Ok(answer(serde_json::Value::Object(value), Vec::new(), false))
    }

    /// As `GET /v1/skills`: the server's workspace's skills and the tenant's own.
    async fn list_skills(&self, tenant: &Arc<str>) -> Result<CallToolResult, ToolError> {
        let root = self.shared.runner.root();
        let workspace = self.shared.runner.skills_workspace().map(Path::to_path_buf);
        let data_dir = self.shared.runner.data_dir().to_path_buf();
        let tenant = tenant.to_string();
        let set = tokio::task::spawn_blocking(move || {
            let user = skillbox_skills::skill::valid_name(&tenant)
                .then(|| (tenant.clone(), Sources::user_dir(&data_dir, &tenant)));
            SkillSet::load(&Sources { workspace, user })
        })
        .await
        .map_err(|e| {
            ToolError::new(
                ErrorCode::Unknown,
                format!("reading the skills failed: {e}"),
            )
        })?;
        let skills: Vec<serde_json::Value> = set
            .iter()
            .map(|skill| {
                json!({
                    "name": skill.meta.name,
                    "description": skill.meta.description,
                    "source": match &skill.source {
                        skillbox_skills::Source::Workspace => "workspace",
                        skillbox_skills::Source::Marketplace { .. } => "marketplace",
                        skillbox_skills::Source::User { .. } => "user",
                    },
                    "path": skill.sandbox_dir(root.as_path()).display().to_string(),
                })
            })
            .collect();
        let errors: Vec<String> = set.errors().iter().map(ToString::to_string).collect();
        Ok(answer(
            json!({"skills": skills, "errors": errors}),
            Vec::new(),
            false,
        ))
    }

    async fn run_capability(
        &self,
        tenant: &Arc<str>,
        arguments: tools::RunCapability,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ToolError> {
        let request = CapabilityRunRequest {
            args: arguments.args,
            files: Vec::new(),
            stdin: arguments.stdin,
            stdin_encoding: Default::default(),
        };
        let cancel = self.call_cancel(&context.ct, None);
        let _cancel_on_drop = cancel.clone().drop_guard();
        let run = self
            .shared
            .door
            .run_capability(tenant, &arguments.name, request, &cancel)
            .await?;
        let mut links = Vec::new();
        let mut files = Vec::new();
        for file in &run.files {
            let uri = object_uri(&file.sha256, &file.path);
            links.push(ContentBlock::resource_link(self.resource(&uri, file)));
            files.push(MadeFile {
                path: &file.path,
                size: file.size,
                sha256: &file.sha256,
                content_type: &file.content_type,
                uri,
                url: self.downloads().then_some(file.url.as_str()),
            });
        }
        if let Ok(mut made) = self.made.lock() {
            for file in &run.files {
                made.push(Made {
                    uri: object_uri(&file.sha256, &file.path),
                    file: file.clone(),
                });
            }
        }
        let failed = !run.output.success() || run.output.limit_hit.is_some();
        let value = json!({
            "capability": run.capability,
            "grant": run.grant,
            "output": run.output,
            "files": files,
        });
        Ok(answer(value, links, failed))
    }
}

impl ServerHandler for SkillboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_list_changed()
                .build(),
        )
        .with_server_info(
            Implementation::new("skillbox", env!("CARGO_PKG_VERSION"))
                .with_title("skillbox: code that agents write, run behind a real boundary"),
        )
        .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
        .with_instructions(
            "run_script runs one script in a fresh sandbox and returns the files it made as \
             resources (skillbox://objects/…). exec, read_file, write_file and list_dir share one \
             sandbox per MCP session, kept until the session ends. No sandbox has a network.",
        )
    }

    /// The tools keep a sandbox per MCP session, so only the revisions that have
    /// sessions (an `initialize` handshake) are spoken.
    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // The session is its opener's: bound here when the transport says who that is.
        if context.extensions.get::<http::request::Parts>().is_some() {
            self.caller(&context.extensions)?;
        }
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.caller(&context.extensions)?;
        let capabilities = self.shared.door.capabilities().await;
        Ok(ListToolsResult::with_all_items(tools::all(
            capabilities.as_deref(),
            self.shared.runner.root(),
            self.shared.runner.read_caps().mcp,
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tenant = self.caller(&context.extensions)?;
        let name = request.name.as_ref();
        let arguments = request.arguments;
        let done = match name {
            tools::RUN_SCRIPT => match parse(name, arguments) {
                Ok(a) => self.run_script(&tenant, a, &context).await,
                Err(e) => Err(e),
            },
            tools::EXEC => match parse(name, arguments) {
                Ok(a) => self.exec(&tenant, a, &context).await,
                Err(e) => Err(e),
            },
            tools::READ_FILE => match parse(name, arguments) {
                Ok(a) => self.read_file(&tenant, a, &context).await,
                Err(e) => Err(e),
            },
            tools::WRITE_FILE => match parse(name, arguments) {
                Ok(a) => self.write_file(&tenant, a, &context).await,
                Err(e) => Err(e),
            },
            tools::LIST_DIR => match parse(name, arguments) {
                Ok(a) => self.list_dir(&tenant, a, &context).await,
                Err(e) => Err(e),
            },
            tools::LIST_SKILLS => match parse::<tools::ListSkills>(name, arguments) {
                Ok(_) => self.list_skills(&tenant).await,
                Err(e) => Err(e),
            },
            tools::RUN_CAPABILITY if self.shared.door.capabilities().await.is_some() => {
                match parse(name, arguments) {
                    Ok(a) => self.run_capability(&tenant, a, &context).await,
                    Err(e) => Err(e),
                }
            }
            _ => {
                let names: Vec<String> = tools::all(
                    self.shared.door.capabilities().await.as_deref(),
                    self.shared.runner.root(),
                    self.shared.runner.read_caps().mcp,
                )
                .into_iter()
                .map(|t| t.name.into_owned())
                .collect();
                return Err(ErrorData::invalid_params(
                    format!("no tool {name:?}; the tools are {}", names.join(", ")),
                    None,
                ));
            }
        };
        Ok(match done {
            Ok(result) => result,
            Err(error) => {
                tracing::debug!(tool = name, %error, "mcp: tool error");
                failure(name, &error)
            }
        }
        .into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.caller(&context.extensions)?;
        // Each made file once, newest last.
        let made = self.made.lock().map(|m| m.clone()).unwrap_or_default();
        let mut seen = BTreeMap::new();
        let mut resources = Vec::new();
        for item in made {
            if seen.insert(item.uri.clone(), ()).is_none() {
                resources.push(self.resource(&item.uri, &item.file));
            }
        }
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let tenant = self.caller(&context.extensions)?;
        let uri = request.uri;
        let not_found = || {
            ErrorData::resource_not_found(
                format!("no resource {uri} (not a file a run of yours made)"),
                Some(json!({"uri": uri})),
            )
        };
        let Some(sha256) = object_of(&uri) else {
            return Err(ErrorData::resource_not_found(
                format!(
                    "{uri}: not a skillbox resource (they are {OBJECTS_URI}{{sha256}}/{{name}})"
                ),
                Some(json!({"uri": uri})),
            ));
        };
        let internal = |e: ToolError| ErrorData::internal_error(e.to_string(), None);
        let content_type = self
            .shared
            .door
            .owned(&tenant, sha256)
            .await
            .map_err(internal)?
            .ok_or_else(not_found)?;
        let store = self.shared.runner.store();
        let size = store
            .head(sha256)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .ok_or_else(not_found)?;
        if size > MAX_RESOURCE_BYTES {
            let how = if self.downloads() {
                format!("; download it at /v1/objects/{sha256}")
            } else {
                String::new()
            };
            return Err(ErrorData::invalid_request(
                format!(
                    "{uri}: {size} bytes, more than the {MAX_RESOURCE_BYTES} resources/read hands out{how}"
                ),
                None,
            ));
        }
        // Held in the budget of bytes in memory until the answer is sent, as read_file's.
        let instead = if self.downloads() {
            format!("download it at /v1/objects/{sha256}")
        } else {
            "read it with read_file in parts".to_string()
        };
        let busy = |e: ToolError| {
            ErrorData::new(
                rmcp::model::ErrorCode(-32000),
                e.message,
                Some(json!({"code": e.code.as_str()})),
            )
        };
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        let mut held = vec![
            self.hold_answer(&context, answer_bytes(1, size), &uri, &instead)
                .map_err(busy)?,
        ];
        let bytes = store
            .get(sha256)
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        let texty = content_type.starts_with("text/")
            || content_type.contains("json")
            || content_type.contains("xml");
        let in_json = match std::str::from_utf8(&bytes) {
            Ok(text) if texty => json_string_len(text),
            _ => base64_len(bytes.len()),
        };
        if let Some(more) = answer_bytes(1, in_json).checked_sub(answer_bytes(1, size))
            && more > 0
        {
            held.push(
                self.hold_answer(&context, more, &uri, &instead)
                    .map_err(busy)?,
            );
        }
        let contents = match std::str::from_utf8(&bytes) {
            Ok(text) if texty => ResourceContents::text(text, uri.clone()),
            _ => ResourceContents::blob(
                base64::engine::general_purpose::STANDARD.encode(&bytes),
                uri.clone(),
            ),
        }
        .with_mime_type(content_type);
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_uris_name_their_object() {
        let sha = "a".repeat(64);
        let uri = object_uri(&sha, "out/deck 1.pptx");
        assert_eq!(uri, format!("skillbox://objects/{sha}/deck%201.pptx"));
        assert_eq!(object_of(&uri), Some(sha.as_str()));
        assert_eq!(
            object_of(&format!("skillbox://objects/{sha}")),
            Some(sha.as_str())
        );
        assert_eq!(object_of("skillbox://objects/abc/x"), None);
        assert_eq!(object_of(&format!("file:///{sha}")), None);
        assert_eq!(
            object_of(&format!("skillbox://objects/{}/x", "A".repeat(64))),
            None
        );
    }

    #[test]
    fn timeouts_are_bounded_as_runs_are() {
        assert_eq!(timeout("timeoutMs", None).expect("none"), None);
        assert!(timeout("timeoutMs", Some(0)).is_err());
        assert!(timeout("timeoutMs", Some(MAX_TIMEOUT_MS + 1)).is_err());
        assert_eq!(
            timeout("timeoutMs", Some(1500)).expect("ok"),
            Some(Duration::from_millis(1500))
        );
    }
}
