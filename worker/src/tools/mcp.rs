//! MCP servers an agent step is granted tools of: started (stdio) or reached
//! (streamable HTTP) for the step, their tools listed and narrowed to the
//! grant, each call made with its deadline and shaped as a tool result; and
//! the stages of MCP-backed resource types.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Map, Value};
use steppe_runtime::agent_work::{mcp_tool_name, McpServerWork, ToolDef};
use steppe_runtime::assignment::McpStage;

use crate::host_env::HOST_ENV;
use crate::tools::stepgate::{GateDir, Ledgers};

/// How long a server has to start and list its tools.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// A call with no `timeout:` of its own.
const CALL_TIMEOUT: Duration = Duration::from_secs(300);
/// What a result may hold inline without `max_output_bytes`.
const DEFAULT_OUTPUT_CAP: u64 = 32_000;
/// `max_output_bytes` above this is taken as this.
const MAX_OUTPUT_CAP: u64 = 10 * 1024 * 1024;

/// One tool of a server, as the model sees it.
#[derive(Debug, Clone)]
pub struct McpTool {
    /// `server__tool`.
    pub name: String,
    pub server: String,
    pub tool: String,
    pub description: String,
    pub input_schema: Value,
    pub required: bool,
    /// 0 = unlimited.
    pub max_calls: u64,
    pub output_cap: usize,
    pub timeout: Duration,
}

impl McpTool {
    /// The function the model is offered (the server's own input schema).
    pub fn schema(&self) -> Value {
        let mut params = self.input_schema.clone();
        if let Some(o) = params.as_object_mut() {
            o.entry("type").or_insert_with(|| json!("object"));
            o.entry("properties").or_insert_with(|| json!({}));
        } else {
            params = json!({"type": "object", "properties": {}});
        }
        json!({"type": "function", "function": {"name": self.name, "description": self.description, "parameters": params}})
    }
}

/// The step's connections, one per granted server, closed when dropped.
#[derive(Default)]
pub struct McpSessions {
    clients: HashMap<String, RunningService<RoleClient, ()>>,
    pub tools: Vec<McpTool>,
    /// The directories of `stepgate:` servers, and where their ledgers go when the step ends.
    gates: Vec<GateDir>,
    ledgers: Option<Ledgers>,
}

impl Drop for McpSessions {
    fn drop(&mut self) {
        if let Some(keep) = &self.ledgers {
            if let Ok(mut k) = keep.lock() {
                k.extend(self.gates.iter().flat_map(GateDir::ledgers));
            }
        }
    }
}

/// Why a grant cannot be served: said before the conversation starts.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("MCP server \"{0}\" is granted but not declared in mcp_servers:")]
    Undeclared(String),
    #[error("MCP server \"{server}\" could not start ({command}): {source}")]
    Spawn { server: String, command: String, source: std::io::Error },
    #[error("MCP server \"{server}\" did not answer its initialization within {secs}s")]
    Timeout { server: String, secs: u64 },
    #[error("MCP server \"{server}\": {message}")]
    Protocol { server: String, message: String },
    #[error("MCP server \"{server}\": the bearer token variable {var} is not set on this worker")]
    NoToken { server: String, var: String },
    #[error("MCP server \"{server}\" has no tool named \"{tool}\" (it lists: {listed})")]
    NoSuchTool { server: String, tool: String, listed: String },
}

impl McpSessions {
    /// Connects to every server `grants` name and expands the grants into
    /// tools. A server that cannot be reached, or a granted tool it does not
    /// list, is an error: the step never runs with fewer tools than granted.
    pub async fn open(servers: &[McpServerWork], grants: &[&ToolDef], step_dir: &Path) -> Result<McpSessions, McpError> {
        let mut sessions = McpSessions::default();
        let mut listed: HashMap<String, Vec<Value>> = HashMap::new();
        for g in grants {
            let ToolDef::Mcp { server, .. } = g else { continue };
            if sessions.clients.contains_key(server) {
                continue;
            }
            let spec = servers.iter().find(|s| &s.name == server).ok_or_else(|| McpError::Undeclared(server.clone()))?;
            let gated;
            let spec = if spec.stepfiles.is_empty() {
                spec
            } else {
                let gate = GateDir::make(spec).map_err(|source| McpError::Spawn { server: server.clone(), command: "steppe gate".into(), source })?;
                let command = gate.command().map_err(|source| McpError::Spawn { server: server.clone(), command: "steppe gate".into(), source })?;
                gated = McpServerWork { command, cwd: Some(gate.dir.display().to_string()), ..spec.clone() };
                sessions.gates.push(gate);
                &gated
            };
            let client = tokio::time::timeout(CONNECT_TIMEOUT, connect(spec, step_dir))
                .await
                .map_err(|_| McpError::Timeout { server: server.clone(), secs: CONNECT_TIMEOUT.as_secs() })??;
            let tools = tokio::time::timeout(CONNECT_TIMEOUT, client.list_all_tools())
                .await
                .map_err(|_| McpError::Timeout { server: server.clone(), secs: CONNECT_TIMEOUT.as_secs() })?
                .map_err(|e| McpError::Protocol { server: server.clone(), message: format!("listing its tools: {e}") })?;
            listed.insert(server.clone(), tools.iter().filter_map(|t| serde_json::to_value(t).ok()).collect());
            sessions.clients.insert(server.clone(), client);
        }
        for g in grants {
            let ToolDef::Mcp { server, tool, tools, description, required, max_calls, max_output_bytes, timeout_ms } = g else { continue };
            let offered = listed.get(server).map(Vec::as_slice).unwrap_or_default();
            let names: Vec<&str> = offered.iter().filter_map(|t| t.get("name").and_then(Value::as_str)).collect();
            let wanted: Vec<String> = match (tool, tools.is_empty()) {
                (Some(t), _) => vec![t.clone()],
                (None, false) => tools.clone(),
                (None, true) => names.iter().map(|n| n.to_string()).collect(),
            };
            for w in wanted {
                let Some(t) = offered.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(w.as_str())) else {
                    return Err(McpError::NoSuchTool { server: server.clone(), tool: w, listed: names.join(", ") });
                };
                let cap = max_output_bytes.unwrap_or(DEFAULT_OUTPUT_CAP).min(MAX_OUTPUT_CAP) as usize;
                sessions.tools.push(McpTool {
                    name: mcp_tool_name(server, &w),
                    server: server.clone(),
                    description: description.clone().filter(|_| tool.is_some()).or_else(|| t.get("description").and_then(Value::as_str).map(str::to_string)).unwrap_or_default(),
                    input_schema: t.get("inputSchema").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
                    tool: w,
                    required: *required && tool.is_some(),
                    max_calls: if tool.is_some() { *max_calls } else { 0 },
                    output_cap: cap,
                    timeout: timeout_ms.map(Duration::from_millis).unwrap_or(CALL_TIMEOUT),
                });
            }
        }
        Ok(sessions)
    }

    pub fn tool(&self, name: &str) -> Option<&McpTool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Calls `tool` with the model's arguments: `{structured_content,
    /// content}` on success, `{error}` when the server says the call failed,
    /// the transport fails or the deadline passes.
    pub async fn call(&self, tool: &McpTool, args: &Value) -> Value {
        let arguments: Map<String, Value> = match args {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            _ => return error(format!("{}: arguments must be a JSON object", tool.name)),
        };
        match self.call_raw(tool, arguments).await {
            Ok(result) => shaped(&tool.name, &result, tool.output_cap),
            Err(e) => error(e),
        }
    }

    /// Calls `tool` and gives the server's whole answer (as MCP's JSON), or
    /// why no answer came.
    pub async fn call_raw(&self, tool: &McpTool, args: Map<String, Value>) -> Result<Value, String> {
        let client = self.clients.get(&tool.server).ok_or_else(|| format!("{}: its server is not connected", tool.name))?;
        let mut params = CallToolRequestParams::new(tool.tool.clone());
        params.arguments = Some(args);
        match tokio::time::timeout(tool.timeout, client.call_tool(params)).await {
            Err(_) => Err(format!("{}: no answer within {}", tool.name, steppe_language::duration::show(tool.timeout))),
            Ok(Err(e)) => Err(format!("{}: {}", tool.name, plain(e.to_string()))),
            Ok(Ok(r)) => Ok(serde_json::to_value(&r).unwrap_or(Value::Null)),
        }
    }

    /// Hands the ledgers of its `stepgate:` servers to `keep` when the step's sessions end.
    pub fn keep_ledgers(&mut self, keep: Ledgers) {
        self.ledgers = Some(keep);
    }

    /// Ends every session (a stdio server's process with it).
    pub async fn close(mut self) {
        for (_, client) in std::mem::take(&mut self.clients) {
            let _ = client.cancel().await;
        }
    }
}

/// rmcp's transport errors name their Rust types; what a person needs is the cause after them.
fn plain(text: String) -> String {
    match text.find("Client error: ") {
        Some(i) => text[i + "Client error: ".len()..].to_string(),
        None => text,
    }
}

/// The text blocks of a `tools/call` answer, in order.
fn texts(answer: &Value) -> Vec<&str> {
    answer.get("content").and_then(Value::as_array).into_iter().flatten().filter_map(|c| c.get("text").and_then(Value::as_str)).collect()
}

/// A resource stage served by an MCP tool, as a shell stage would answer:
/// check prints the versions, in writes `version.json` (and the result's
/// `result.json` and `content-<i>` files) into `dir`, out prints the new
/// version (or nothing). An error the tool reports is the stage's error.
pub async fn run_stage(s: &McpStage, dir: &Path) -> Result<String, String> {
    let grant = ToolDef::Mcp { server: s.server.name.clone(), tool: Some(s.tool.clone()), tools: Vec::new(), description: None, required: false, max_calls: 0, max_output_bytes: None, timeout_ms: None };
    let sessions = McpSessions::open(std::slice::from_ref(&s.server), &[&grant], dir).await.map_err(|e| steppe_runtime::causes::of(&e))?;
    let args = match &s.args {
        Value::Object(m) => m.clone(),
        other => return Err(format!("{}: arguments must be a JSON object, not {other}", s.tool)),
    };
    let answer = match sessions.tools.first() {
        Some(tool) => sessions.call_raw(tool, args).await,
        None => Err(format!("{}: not listed by the server", s.tool)),
    };
    sessions.close().await;
    let answer = answer?;
    let blocks: Vec<&Value> = answer.get("content").and_then(Value::as_array).into_iter().flatten().collect();
    let texts = texts(&answer);
    if answer.get("isError").and_then(Value::as_bool).unwrap_or(false) {
        return Err(texts.first().map(|t| t.to_string()).unwrap_or_else(|| format!("{}: the tool reported an error", s.tool)));
    }
    let structured = answer.get("structuredContent").filter(|v| !v.is_null());
    // The structured content if it is of the wanted shape, else the first text block that parses as one.
    let shaped = |ok: &dyn Fn(&Value) -> bool| -> Option<Value> {
        structured.filter(|v| ok(v)).cloned().or_else(|| texts.iter().find_map(|t| serde_json::from_str::<Value>(t).ok().filter(|v| ok(v))))
    };
    match s.stage.as_str() {
        "check" => {
            let versions = shaped(&|v| v.as_array().is_some_and(|a| a.iter().all(Value::is_object))).ok_or_else(|| format!("{}: the tool's answer holds no JSON array of versions (objects)", s.tool))?;
            Ok(versions.to_string())
        }
        "in" => {
            let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).map_err(|e| format!("writing {name}: {e}"));
            write("version.json", serde_json::to_string_pretty(&s.version).unwrap_or_default().as_bytes())?;
            if let Some(v) = structured {
                write("result.json", serde_json::to_string_pretty(v).unwrap_or_default().as_bytes())?;
            }
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("text").and_then(Value::as_str), b.get("data").and_then(Value::as_str)) {
                    (Some(t), _) => write(&format!("content-{i}.txt"), t.as_bytes())?,
                    (None, Some(data)) => {
                        use base64::Engine as _;
                        let bytes = base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| format!("content {i}: {e}"))?;
                        let ext = b.get("mimeType").and_then(Value::as_str).and_then(|m| m.split('/').nth(1)).filter(|e| e.chars().all(|c| c.is_ascii_alphanumeric())).unwrap_or("bin");
                        write(&format!("content-{i}.{ext}"), &bytes)?;
                    }
                    _ => write(&format!("content-{i}.json"), serde_json::to_string_pretty(b).unwrap_or_default().as_bytes())?,
                }
            }
            Ok(String::new())
        }
        _ => Ok(shaped(&Value::is_object).map(|v| v.to_string()).unwrap_or_default()),
    }
}

fn error(message: String) -> Value {
    json!({ "error": message })
}

/// A `tools/call` result as the model reads it: its text blocks joined by
/// newlines (cut at `cap`) and its structured content; `isError` → `{error}`.
fn shaped(name: &str, result: &Value, cap: usize) -> Value {
    let text = cut(&texts(result).join("\n"), cap);
    if result.get("isError").and_then(Value::as_bool).unwrap_or(false) {
        return error(if text.is_empty() { format!("{name}: the server reported an error") } else { text });
    }
    let structured = result.get("structuredContent").cloned().unwrap_or(Value::Null);
    let structured = if structured.to_string().len() > cap { json!(format!("[structured content of {} bytes left out: over the {cap}-byte limit]", structured.to_string().len())) } else { structured };
    json!({"structured_content": structured, "content": text})
}

fn cut(text: &str, cap: usize) -> String {
    if text.len() <= cap {
        return text.to_string();
    }
    let mut end = cap;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[truncated: {} bytes, the first {end} shown]", &text[..end], text.len())
}

async fn connect(spec: &McpServerWork, step_dir: &Path) -> Result<RunningService<RoleClient, ()>, McpError> {
    let server = spec.name.clone();
    let protocol = |e: String| McpError::Protocol { server: server.clone(), message: e };
    match (&spec.endpoint, spec.command.split_first()) {
        (Some(url), _) => {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
            if let Some(var) = &spec.bearer_env {
                let token = std::env::var(var).ok().filter(|t| !t.is_empty()).ok_or_else(|| McpError::NoToken { server: server.clone(), var: var.clone() })?;
                steppe_runtime::secrets::remember(&token);
                config = config.auth_header(token);
            }
            if spec.oauth {
                let token = crate::tools::mcp_oauth::access_token(&spec.name, url, "<pipeline>").await.map_err(|e| McpError::Protocol { server: server.clone(), message: e })?;
                config = config.auth_header(token);
            }
            steppe_cloud::install_crypto();
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| protocol(format!("connecting to {url}: {}", plain(e.to_string()))))
        }
        (None, Some((program, args))) => {
            let mut cmd = tokio::process::Command::new(program);
            cmd.args(args).env_clear().kill_on_drop(true);
            for name in HOST_ENV.iter().copied().chain(spec.env.iter().map(String::as_str)) {
                if let Some(v) = std::env::var_os(name) {
                    if spec.env.iter().any(|e| e == name) {
                        steppe_runtime::secrets::remember(&v.to_string_lossy());
                    }
                    cmd.env(name, v);
                }
            }
            cmd.current_dir(match &spec.cwd {
                Some(c) => step_dir.join(c),
                None => step_dir.to_path_buf(),
            });
            let shown = spec.command.join(" ");
            let (transport, stderr) = TokioChildProcess::builder(cmd).stderr(std::process::Stdio::piped()).spawn().map_err(|source| McpError::Spawn { server: server.clone(), command: shown.clone(), source })?;
            // What the server says on stderr goes to the debug log, not to the step.
            if let Some(stderr) = stderr {
                let name = server.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncBufReadExt;
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::debug!(server = %name, "MCP server stderr: {}", steppe_runtime::secrets::mask(&line));
                    }
                });
            }
            ().serve(transport).await.map_err(|e| protocol(format!("starting {shown}: {e}")))
        }
        (None, None) => Err(protocol("it has neither an endpoint nor a command".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_shaped_as_the_model_reads_them() {
        let ok = json!({"content": [{"type": "text", "text": "a"}, {"type": "image", "data": "…"}, {"type": "text", "text": "b"}], "structuredContent": {"n": 1}});
        assert_eq!(shaped("s__t", &ok, 100), json!({"structured_content": {"n": 1}, "content": "a\nb"}));
        let failed = json!({"content": [{"type": "text", "text": "no such issue"}], "isError": true});
        assert_eq!(shaped("s__t", &failed, 100), json!({"error": "no such issue"}));
        let long = json!({"content": [{"type": "text", "text": "x".repeat(50)}]});
        let cut = shaped("s__t", &long, 10);
        assert!(cut["content"].as_str().is_some_and(|c| c.starts_with("xxxxxxxxxx\n[truncated: 50 bytes")), "{cut}");
    }
}
