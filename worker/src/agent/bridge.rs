//! The loopback MCP bridge of a CLI-backed agent: every tool the step is
//! granted, served over streamable HTTP on 127.0.0.1 to whoever holds this
//! attempt's single-use token; each call is handed to the conversation that
//! runs it, so the sandbox, caps, pinned arguments and timeouts of a hosted
//! agent's tools hold for the CLI's too.

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

/// A tool call the CLI made, waiting for the conversation to run it.
pub struct BridgeCall {
    pub name: String,
    pub args: Value,
    pub reply: oneshot::Sender<Value>,
}

#[derive(Clone)]
struct Handler {
    tools: Arc<Vec<Tool>>,
    calls: mpsc::Sender<BridgeCall>,
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(&self, _: Option<PaginatedRequestParams>, _: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.as_ref().clone()))
    }

    async fn call_tool(&self, request: CallToolRequestParams, _: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let (reply, answer) = oneshot::channel();
        let args = request.arguments.map(Value::Object).unwrap_or_else(|| json!({}));
        let call = BridgeCall { name: request.name.to_string(), args, reply };
        self.calls.send(call).await.map_err(|_| ErrorData::internal_error("the step this bridge served has ended", None))?;
        let result = answer.await.map_err(|_| ErrorData::internal_error("the step this bridge served has ended", None))?;
        let failed = result.get("error").is_some();
        let text = ContentBlock::text(result.to_string());
        Ok(if failed { CallToolResult::error(vec![text]) } else { CallToolResult::success(vec![text]) }.into())
    }
}

/// A bridge serving one attempt; it stops when dropped.
pub struct Bridge {
    pub url: String,
    pub token: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Random bytes from the system, as hex (a token nobody else can guess, or none).
pub fn random_hex(bytes: usize) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Serves `tools` (OpenAI function schemas, as the model would be offered
/// them) on a free loopback port; calls arrive on `calls`.
pub async fn start(tools: &[Value], calls: mpsc::Sender<BridgeCall>) -> std::io::Result<Bridge> {
    let tools: Vec<Tool> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let schema = f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            serde_json::from_value(json!({"name": f.get("name")?, "description": f.get("description").cloned().unwrap_or(json!("")), "inputSchema": schema})).ok()
        })
        .collect();
    let handler = Handler { tools: Arc::new(tools), calls };
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(false).with_json_response(true);
    let service = StreamableHttpService::new(move || Ok(handler.clone()), Arc::new(LocalSessionManager::default()), config);
    let token = random_hex(24)?;
    let expected = format!("Bearer {token}");
    let app = axum::Router::new().nest_service("/mcp", service).layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
        let allowed = req.headers().get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(expected.as_str());
        async move {
            if allowed {
                next.run(req).await
            } else {
                axum::response::IntoResponse::into_response((axum::http::StatusCode::UNAUTHORIZED, "this bridge serves one step's CLI, which holds its token"))
            }
        }
    }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/mcp", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(Bridge { url, token, server })
}
