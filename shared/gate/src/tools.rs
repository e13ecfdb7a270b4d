//! A run's operations (§1.4): each exposed name bound to an OpenAPI
//! operation or a remote MCP tool, prepared at preflight (documents read and
//! pinned, MCP servers connected and listed, argument schemas compiled) and
//! called through the run's egress.

use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use crate::egress::{credential_available, Answer, Credential, Egress, Placement, Retry};
use crate::error::{preflight, GateError};
use crate::reply::{head, parsed};
use crate::jcs::digest_json;
use crate::openapi::Operation;
use crate::schema::Schema;
use crate::settings::fill;
use crate::stepfile::Stepfile;

pub enum Backend {
    OpenApi { server: String, operation: Operation },
    Mcp { tool: String, name: String, host: String },
}

/// An exposed operation as a run calls it.
pub struct Op {
    pub name: String,
    /// The `tools` key it belongs to.
    pub tool: String,
    pub backend: Backend,
    pub description: String,
    pub input_schema: Value,
    pub schema: Schema,
    pub select: Option<Value>,
    /// `effect: read`: retried like a GET.
    pub read: bool,
    pub credential: Option<(Credential, Placement)>,
}

/// What a call brought back.
pub struct Outcome {
    /// The result as text: an OpenAPI body as received (an error as
    /// `HTTP <code>: <body>`), an MCP result's structured content as JSON or
    /// its text parts.
    pub content: String,
    /// The content parsed (JSON, else the text): what gates see.
    pub result: Value,
    /// The body as the API sent it, parsed (an accepted error's response).
    pub body: Value,
    pub is_error: bool,
    pub status: Option<u16>,
    pub host: String,
}

pub(crate) type McpClient = RunningService<RoleClient, ()>;

/// The operations of a run, and its connections.
pub struct Tools {
    pub ops: BTreeMap<String, Op>,
    pub verifiers: BTreeMap<String, (String, Option<Credential>)>,
    pub egress: Egress,
    mcp: BTreeMap<String, Arc<McpClient>>,
}



/// Every host the stepfile's tools name, settings filled: the allow-list.
pub fn declared_hosts(doc: &Stepfile, settings: &BTreeMap<String, String>) -> Vec<String> {
    let mut hosts = Vec::new();
    for t in doc.tools.iter().flat_map(|t| t.values()) {
        if let Some(h) = t.endpoint().and_then(|u| reqwest::Url::parse(&fill(u, settings)).ok()).and_then(|u| crate::egress::host_of(&u)) {
            hosts.push(h);
        }
    }
    hosts
}

impl Tools {
    /// Prepares every tool of `doc` (§1.8 step 2), or says which item failed.
    pub async fn prepare(doc: &Stepfile, settings: &BTreeMap<String, String>, egress: Egress) -> Result<Tools, GateError> {
        let creds = crate::egress::credentials(doc, settings);
        let mut ops = BTreeMap::new();
        let mut mcp = BTreeMap::new();
        let mut verifiers = BTreeMap::new();
        for (key, t) in doc.tools.iter().flatten() {
            let credential = t.credential.as_ref().and_then(|c| creds.get(c)).cloned();
            if let Some(c) = &credential {
                credential_available(c).map_err(|e| preflight(format!("credential {}", c.name), e.message))?;
            }
            if let Some(v) = &t.verifier {
                let url = fill(v.get("url").and_then(Value::as_str).unwrap_or_default(), settings);
                verifiers.insert(key.clone(), (url, credential.clone()));
                continue;
            }
            let entries: Vec<(String, Option<String>, Option<Value>, bool)> = t
                .exposes
                .iter()
                .flatten()
                .map(|e| match e {
                    Value::String(n) => (n.clone(), None, None, false),
                    e => (
                        e.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                        e.get("schema_sha256").and_then(Value::as_str).map(str::to_string),
                        e.get("select").cloned(),
                        e.get("effect").and_then(Value::as_str) == Some("read"),
                    ),
                })
                .collect();
            if let Some(o) = &t.openapi {
                let server = fill(o.get("server").and_then(Value::as_str).unwrap_or_default(), settings);
                let document = openapi_document(o, &egress).await.map_err(|e| preflight(format!("tool {key}"), e))?;
                let found = crate::openapi::operations(&document).map_err(|e| preflight(format!("tool {key}"), e))?;
                for (name, _, select, read) in entries {
                    let operation = found.iter().find(|op| op.id == name).cloned().ok_or_else(|| preflight(format!("tool {key}"), format!("operationId {name} is not in the document")))?;
                    let placement = match (credential.as_ref().map(|c| c.kind.as_str()), &operation.key_place) {
                        (None, _) => None,
                        (Some("basic"), _) => Some(Placement::Basic),
                        (Some(_), Some(k)) => Some(Placement::Key(k.clone())),
                        (Some("api_key"), None) => return Err(preflight(format!("tool {key}"), format!("{name} names no apiKey security scheme for its api_key credential"))),
                        (Some(_), None) => Some(Placement::Bearer),
                    };
                    let input_schema = operation.input_schema();
                    let schema = Schema::compile(&input_schema, None).map_err(|e| preflight(format!("tool {key}"), format!("input schema of {name} does not compile: {e}")))?;
                    let description = operation.description.clone().unwrap_or_else(|| format!("{} {}", operation.method, operation.path));
                    let credential = credential.clone().zip(placement);
                    ops.insert(name.clone(), Op { name, tool: key.clone(), backend: Backend::OpenApi { server: server.clone(), operation }, description, input_schema, schema, select, read, credential });
                }
            } else if let Some(m) = &t.mcp {
                let url = fill(m.get("url").and_then(Value::as_str).unwrap_or_default(), settings);
                let host = reqwest::Url::parse(&url).ok().and_then(|u| crate::egress::host_of(&u)).unwrap_or_default();
                let client = connect(key, &url, credential.as_ref(), &egress).await.map_err(|e| preflight(format!("tool {key}"), format!("could not connect to {url} and list its tools: {e}")))?;
                let listed = client.list_all_tools().await.map_err(|e| preflight(format!("tool {key}"), format!("tools/list: {e}")))?;
                for (name, pin, select, read) in entries {
                    let tool = listed.iter().find(|x| x.name == name).ok_or_else(|| {
                        let offered: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
                        preflight(format!("tool {key}"), format!("server does not offer {name}; it offers {}", offered.join(", ")))
                    })?;
                    let input_schema = Value::Object((*tool.input_schema).clone());
                    if let Some(pin) = pin {
                        let got = digest_json(&input_schema);
                        if got != pin {
                            return Err(preflight(format!("tool {key}"), format!("{name} input schema is {got}, expected {pin}")));
                        }
                    }
                    let schema = Schema::compile(&input_schema, None).map_err(|e| preflight(format!("tool {key}"), format!("input schema of {name} does not compile: {e}")))?;
                    let description = tool.description.as_deref().unwrap_or(&name).to_string();
                    let credential = credential.clone().map(|c| (c, Placement::Bearer));
                    ops.insert(name.clone(), Op { name: name.clone(), tool: key.clone(), backend: Backend::Mcp { tool: key.clone(), name, host: host.clone() }, description, input_schema, schema, select, read, credential });
                }
                mcp.insert(key.clone(), Arc::new(client));
            }
        }
        Ok(Tools { ops, verifiers, egress, mcp })
    }

    /// Calls `op` with `args` (already checked against its schema).
    pub async fn call(&self, op: &Op, args: &Value, retries: &mut Vec<Retry>) -> Result<Outcome, GateError> {
        match &op.backend {
            Backend::OpenApi { server, operation } => {
                let req = operation.request(server, args).map_err(|e| GateError::new("ToolCallFailed", e))?;
                let idempotent = op.read || ["GET", "HEAD", "OPTIONS", "PUT", "DELETE"].contains(&req.method.as_str());
                let cred = op.credential.as_ref().map(|(c, p)| (c, p));
                let label = format!("{}.{}", op.tool, op.name);
                let a = self.egress.send(&req, cred, idempotent, &label, retries).await?;
                shape_http(&label, a)
            }
            Backend::Mcp { tool, name, host } => {
                let client = self.mcp.get(tool).ok_or_else(|| GateError::new("ToolCallFailed", format!("{name}: its server is not connected")))?;
                let host = host.clone();
                let mut params = CallToolRequestParams::new(name.clone());
                params.arguments = args.as_object().cloned();
                let r = tokio::time::timeout(self.egress.timeout, client.call_tool(params))
                    .await
                    .map_err(|_| GateError::new("ToolCallFailed", format!("mcp {tool}.{name} failed with status none: no answer within {} ms (--request-timeout-ms)", self.egress.timeout.as_millis())))?
                    .map_err(|e| GateError::new("ToolCallFailed", format!("mcp {tool}.{name} failed with status none: {e}")))?;
                let answer = serde_json::to_value(&r).unwrap_or(Value::Null);
                let content = match answer.get("structuredContent") {
                    Some(s) if !s.is_null() => s.to_string(),
                    _ => answer
                        .get("content")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .map(|c| match (c.get("type").and_then(Value::as_str), c.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(t)) => t.to_string(),
                            _ => c.to_string(),
                        })
                        .collect::<Vec<_>>()
                        .join("\n"),
                };
                let result = parsed(&content);
                let is_error = answer.get("isError").and_then(Value::as_bool).unwrap_or(false);
                Ok(Outcome { body: result.clone(), result, content, is_error, status: None, host })
            }
        }
    }

    /// Closes the run's MCP sessions.
    pub async fn close(&mut self) {
        for (_, c) in std::mem::take(&mut self.mcp) {
            if let Ok(c) = Arc::try_unwrap(c) {
                let _ = c.cancel().await;
            }
        }
    }
}

fn shape_http(label: &str, a: Answer) -> Result<Outcome, GateError> {
    let text = String::from_utf8_lossy(&a.body).to_string();
    if a.status == 401 || a.status == 403 {
        return Err(GateError::new("ToolCallFailed", format!("{label} failed with status {}: {}", a.status, head(&text))));
    }
    let ok = (200..300).contains(&a.status);
    let content = if ok { text.clone() } else { format!("HTTP {}: {text}", a.status) };
    Ok(Outcome { result: parsed(&content), body: parsed(&text), content, is_error: !ok, status: Some(a.status), host: a.host })
}

async fn openapi_document(o: &Value, egress: &Egress) -> Result<Value, String> {
    if let Some(d) = o.get("document") {
        return Ok(d.clone());
    }
    let url = o.get("url").and_then(Value::as_str).ok_or("openapi names a document or a url")?;
    let pin = o.get("sha256").and_then(Value::as_str).ok_or("a fetched document needs its sha256")?;
    let host = reqwest::Url::parse(url).ok().and_then(|u| crate::egress::host_of(&u)).ok_or_else(|| format!("{url} is not a URL"))?;
    let mut fetcher = egress.clone();
    fetcher.allow_also(&host);
    let req = crate::openapi::Request { method: "GET".into(), url: url.to_string(), headers: Vec::new(), body: None };
    let a = fetcher.send(&req, None, true, url, &mut Vec::new()).await.map_err(|e| e.to_string())?;
    if !(200..300).contains(&a.status) {
        return Err(format!("{url} answered HTTP {}", a.status));
    }
    let got = crate::jcs::digest(&a.body);
    if got != pin {
        return Err(format!("{url} is {got}, not the pinned {pin}"));
    }
    match crate::load::document(&String::from_utf8_lossy(&a.body)).map_err(|e| format!("{url}: {e}"))? {
        Value::Null => Err("the document is empty".into()),
        doc => Ok(doc),
    }
}

/// A client session with the remote MCP server at `url` (redirects refused).
pub(crate) async fn connect(label: &str, url: &str, credential: Option<&Credential>, egress: &Egress) -> Result<McpClient, String> {
    let u = egress.check(url, &format!("mcp {label}")).map_err(|e| e.to_string())?;
    let host = crate::egress::host_of(&u).unwrap_or_default();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_string());
    if let Some(c) = credential.filter(|c| c.hosts.iter().any(|h| h.eq_ignore_ascii_case(&host))) {
        config = config.auth_header(egress.secret(c, false).await.map_err(|e| e.message)?);
    }
    let client = mcp_reqwest::Client::builder()
        .redirect(mcp_reqwest::redirect::Policy::none())
        .user_agent(egress.user_agent.clone())
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let transport = StreamableHttpClientTransport::with_client(client, config);
    ().serve(transport).await.map_err(|e| format!("connecting to {url}: {e}"))
}
