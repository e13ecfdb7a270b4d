//! The MCP surface (§1.9, §1.14): each stepfile a tool that starts a run,
//! `stepgate_call` and `stepgate_submit` to drive it, and the authoring
//! tools; served over stdio or streamable HTTP on loopback.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{json, Value};
use tokio::sync::Mutex;

use crate::error::GateError;
use crate::reply::{self, Reply};
use crate::run::{not_active, Approval, Approver, Options, Run, State};
use crate::stepfile::Loaded;

const INSTRUCTIONS: &str = "Each stepfile tool starts a run of a fixed procedure and returns its first step. Do each step as instructed: call the step's operations only through stepgate_call, then send the step's output to stepgate_submit. Stepgate checks the output with the step's gates; if it is rejected, fix every listed problem and submit again. Values must come from the operations' results, because gates compare them. Continue until the run finishes. To write a new stepfile, call stepgate_guide first: it explains the format and the other authoring tools.";

/// The stepfiles served and the runs going on, shared by every session.
pub struct Gate {
    stepfiles: Vec<Arc<Loaded>>,
    opts: Arc<Options>,
    /// Each run with the session that started it (only it may drive it).
    runs: Mutex<HashMap<String, (u64, Arc<Mutex<Run>>)>>,
    sessions: std::sync::atomic::AtomicU64,
    started: std::sync::atomic::AtomicU64,
}

impl Gate {
    pub fn new(stepfiles: Vec<Loaded>, opts: Options) -> Arc<Gate> {
        Arc::new(Gate { stepfiles: stepfiles.into_iter().map(Arc::new).collect(), opts: Arc::new(opts), runs: Mutex::new(HashMap::new()), sessions: Default::default(), started: Default::default() })
    }

    fn tools(&self) -> Vec<Tool> {
        let mut tools: Vec<Value> = self
            .stepfiles
            .iter()
            .map(|l| {
                let s = &l.stepfile;
                let lead = s.description.clone().or_else(|| s.title.clone()).unwrap_or_else(|| format!("Runs the {} stepfile.", s.id));
                let mut t = json!({"name": s.id, "description": format!("{lead} Starts a run and returns its first step; do each step with stepgate_call and stepgate_submit."), "inputSchema": s.inputs});
                if let Some(title) = &s.title {
                    t["title"] = json!(title);
                }
                t
            })
            .collect();
        let run = json!({"type": "string", "description": "The run id a stepfile tool returned."});
        tools.push(json!({"name": "stepgate_call", "title": "Call a step operation",
            "description": "Calls one of the current step's operations for a Stepgate run and returns its result. Stepgate makes the request and adds any credentials.",
            "inputSchema": {"type": "object", "properties": {"run": run, "operation": {"type": "string", "description": "An operation the current step lists."}, "arguments": {"type": "object", "description": "Arguments matching the operation's schema."}}, "required": ["run", "operation"]}}));
        tools.push(json!({"name": "stepgate_submit", "title": "Submit a step's output",
            "description": "Submits the current step's output for a Stepgate run. Returns the next step, the gate failures to fix, or the finished run's outputs.",
            "inputSchema": {"type": "object", "properties": {"run": run, "output": {"type": "object", "description": "The step's output, matching the schema the step gave."}}, "required": ["run", "output"]}}));
        if !self.opts.authoring {
            return tools.into_iter().filter_map(|t| serde_json::from_value(t).ok()).collect();
        }
        tools.push(json!({"name": "stepgate_guide", "title": "How to write a stepfile", "description": "Explains the stepfile format, the authoring workflow and the other authoring tools.", "inputSchema": {"type": "object", "properties": {}}}));
        tools.push(json!({"name": "stepgate_examples", "title": "Catalog stepfiles", "description": "Lists the catalog's stepfiles, or shows one (its YAML and README) to start from.",
            "inputSchema": {"type": "object", "properties": {"name": {"type": "string", "description": "A catalog entry's id; omitted: the list."}}}}));
        tools.push(json!({"name": "stepgate_validate", "title": "Check a stepfile", "description": "Loads a stepfile (YAML or JSON text) as the server would: its remaining TODO( markers, its problems with their paths, or its id, identity and steps.",
            "inputSchema": {"type": "object", "properties": {"stepfile": {"type": "string", "description": "The stepfile's text."}}, "required": ["stepfile"]}}));
        tools.push(json!({"name": "stepgate_inspect_api", "title": "Read a public API", "description": "Reads a public https API without credentials: an OpenAPI document's servers, security schemes, operationIds (filtered by search) and the schemas of the operations named; or an MCP server's tools with their schema_sha256 pins.",
            "inputSchema": {"type": "object", "properties": {"kind": {"type": "string", "enum": ["openapi", "mcp"]}, "url": {"type": "string"}, "search": {"type": "string"}, "operations": {"type": "array", "items": {"type": "string"}}}, "required": ["kind", "url"]}}));
        tools.push(json!({"name": "stepgate_outline", "title": "Outline a procedure", "description": "Turns a written procedure (markdown) into a stepfile skeleton: its steps, and a TODO(gate) for every sentence that says what must or must never happen.",
            "inputSchema": {"type": "object", "properties": {"procedure": {"type": "string", "description": "The procedure as markdown."}}, "required": ["procedure"]}}));
        tools.push(json!({"name": "stepgate_try", "title": "Try a draft stepfile", "description": "Runs a draft stepfile as its own tool would, when it reaches only public hosts and the credentials and settings this server grants drafts.",
            "inputSchema": {"type": "object", "properties": {"stepfile": {"type": "string", "description": "The draft's text."}, "inputs": {"type": "object"}}, "required": ["stepfile", "inputs"]}}));
        tools.into_iter().filter_map(|t| serde_json::from_value(t).ok()).collect()
    }

    /// Answers one tool call.
    pub async fn call(&self, session: u64, name: &str, args: Value, approver: Option<Arc<dyn Approver>>) -> Reply {
        match name {
            "stepgate_call" | "stepgate_submit" => {
                let id = args.get("run").and_then(Value::as_str).unwrap_or("undefined").to_string();
                let Some(run) = self.runs.lock().await.get(&id).filter(|(owner, _)| *owner == session).map(|(_, r)| r.clone()) else {
                    return reply::failed(Some(&id), &not_active(&id));
                };
                let mut run = run.lock().await;
                let r = if name == "stepgate_call" {
                    let op = args.get("operation").and_then(Value::as_str).unwrap_or_default().to_string();
                    run.call(&op, args.get("arguments").cloned().unwrap_or_else(|| json!({}))).await
                } else {
                    run.submit(args.get("output").cloned().unwrap_or(Value::Null)).await
                };
                if run.state != State::Running {
                    self.runs.lock().await.remove(&id);
                }
                r
            }
            "stepgate_guide" | "stepgate_validate" | "stepgate_outline" | "stepgate_examples" | "stepgate_inspect_api" | "stepgate_try" if !self.opts.authoring => reply::unknown_tool(name),
            "stepgate_guide" => reply::plain(crate::guide::GUIDE.to_string(), false),
            "stepgate_validate" => crate::guide::validate(args.get("stepfile").and_then(Value::as_str).unwrap_or_default()),
            "stepgate_outline" => reply::plain(crate::authoring::outline(args.get("procedure").and_then(Value::as_str).unwrap_or_default()), false),
            "stepgate_examples" => match crate::authoring::examples(&self.opts.catalog, args.get("name").and_then(Value::as_str)) {
                Ok(text) => reply::plain(text, false),
                Err(e) => reply::plain(e.to_string(), true),
            },
            "stepgate_inspect_api" => match crate::inspect::inspect(&args, self.opts.request_timeout, self.opts.response_bytes).await {
                Ok(text) => reply::plain(text, false),
                Err(e) => reply::plain(e.to_string(), true),
            },
            "stepgate_try" => {
                let text = args.get("stepfile").and_then(Value::as_str).unwrap_or_default();
                let loaded = match crate::load::load_str(text, std::path::Path::new("draft")) {
                    Ok(l) => l,
                    Err(e) => return reply::failed(None, &GateError::new("StepfileInvalid", e.issues.join("; "))),
                };
                let problems = crate::authoring::draft_problems(&loaded.stepfile, &self.opts.draft);
                if !problems.is_empty() {
                    return reply::failed(None, &crate::authoring::refused(&problems));
                }
                self.start(session, Arc::new(loaded), args.get("inputs").cloned().unwrap_or_else(|| json!({})), approver).await
            }
            id => match self.stepfiles.iter().find(|l| l.stepfile.id == id) {
                None => reply::unknown_tool(id),
                Some(l) => self.start(session, l.clone(), args, approver).await,
            },
        }
    }

    /// Starts a run of `loaded` with `inputs`; it is kept while it goes on.
    async fn start(&self, session: u64, loaded: Arc<Loaded>, inputs: Value, approver: Option<Arc<dyn Approver>>) -> Reply {
        let n = self.started.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let id = if self.opts.sequential_runs { n.to_string() } else { crate::run::new_id() };
        let (run, r) = Run::start(id, loaded, self.opts.clone(), inputs, approver).await;
        if let Some(run) = run.filter(|r| r.state == State::Running) {
            self.runs.lock().await.insert(run.id.clone(), (session, Arc::new(Mutex::new(run))));
        }
        r
    }

    /// Abandons runs idle longer than `--run-idle-ms` (after any call in flight).
    pub async fn sweep(&self) {
        let idle: Vec<(String, Arc<Mutex<Run>>)> = self.runs.lock().await.iter().map(|(k, (_, v))| (k.clone(), v.clone())).collect();
        for (id, run) in idle {
            let Ok(mut r) = run.try_lock() else { continue };
            if r.last_used.elapsed() >= self.opts.run_idle {
                r.abandon().await;
                self.runs.lock().await.remove(&id);
            }
        }
    }

    /// Abandons the runs of `session` (it closed), or every run.
    pub async fn abandon(&self, session: Option<u64>) {
        let mut runs = self.runs.lock().await;
        let ids: Vec<String> = runs.iter().filter(|(_, (owner, _))| session.is_none_or(|s| s == *owner)).map(|(k, _)| k.clone()).collect();
        let gone: Vec<Arc<Mutex<Run>>> = ids.iter().filter_map(|id| runs.remove(id)).map(|(_, r)| r).collect();
        drop(runs);
        for run in gone {
            run.lock().await.abandon().await;
        }
    }

    /// A new session's number.
    pub(crate) fn session(&self) -> u64 {
        self.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    pub(crate) fn sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let gate = self.clone();
        let every = self.opts.run_idle.min(Duration::from_secs(1)).max(Duration::from_millis(10));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                gate.sweep().await;
            }
        })
    }
}

fn result(r: Reply) -> CallToolResult {
    let mut out = if r.is_error { CallToolResult::error(vec![ContentBlock::text(r.text)]) } else { CallToolResult::success(vec![ContentBlock::text(r.text)]) };
    out.structured_content = r.structured;
    out
}

/// One MCP session's handler: the runs it starts are its own, abandoned
/// when it closes (the handler dropped with the session).
#[derive(Clone)]
pub(crate) struct Handler(Arc<Gate>, Arc<Session>);

pub(crate) struct Session {
    id: u64,
    gate: Arc<Gate>,
}

impl Drop for Session {
    fn drop(&mut self) {
        let (gate, id) = (self.gate.clone(), self.id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { gate.abandon(Some(id)).await });
        }
    }
}

/// The handler of a new session.
pub(crate) fn handler(gate: Arc<Gate>) -> Handler {
    let id = gate.session();
    Handler(gate.clone(), Arc::new(Session { id, gate }))
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_tool_list_changed().build())
            .with_server_info(Implementation::new("stepgate", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(&self, _: Option<PaginatedRequestParams>, _: RequestContext<RoleServer>) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.0.tools()))
    }

    async fn call_tool(&self, request: CallToolRequestParams, cx: RequestContext<RoleServer>) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.map(Value::Object).unwrap_or_else(|| json!({}));
        let approver: Arc<dyn Approver> = Arc::new(PeerApprover(cx.peer.clone()));
        Ok(result(self.0.call(self.1.id, request.name.as_ref(), args, Some(approver)).await).into())
    }
}

/// Approvals asked of the client's person by MCP form elicitation.
struct PeerApprover(rmcp::Peer<RoleServer>);

impl Approver for PeerApprover {
    fn form(&self) -> bool {
        self.0.supported_elicitation_modes().contains(&rmcp::service::ElicitationMode::Form)
    }

    fn ask(&self, message: String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Approval> + Send + '_>> {
        Box::pin(async move {
            let schema = match rmcp::model::ElicitationSchema::builder().optional_string("reason").build() {
                Ok(s) => s,
                Err(e) => return Approval::Unavailable(e.to_string()),
            };
            let params = rmcp::model::ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema: schema };
            match self.0.create_elicitation(params).await {
                Err(e) => Approval::Unavailable(e.to_string()),
                Ok(r) => match r.action {
                    rmcp::model::ElicitationAction::Accept => Approval::Accepted,
                    rmcp::model::ElicitationAction::Decline => Approval::Declined(r.content.as_ref().and_then(|c| c.get("reason")).and_then(Value::as_str).map(str::to_string)),
                    _ => Approval::Dismissed,
                },
            }
        })
    }
}

/// Serves over standard input and output until the client closes them;
/// the session's runs are abandoned then.
pub async fn serve_stdio(gate: Arc<Gate>) -> Result<(), String> {
    let sweeper = gate.sweeper();
    let service = handler(gate.clone()).serve((tokio::io::stdin(), tokio::io::stdout())).await.map_err(|e| format!("starting the MCP session: {e}"))?;
    let _ = service.waiting().await;
    sweeper.abort();
    gate.abandon(None).await;
    Ok(())
}
