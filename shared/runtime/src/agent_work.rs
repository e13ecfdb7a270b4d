//! An agent step resolved for a worker: everything the conversation needs,
//! with the agent definition, the step and the defaults already merged.
//! (Across processes it is the `steppe.v1.AgentWork` message: wire/agent.rs.)

use serde_json::{Map, Value};

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentWork {
    /// The agent's name (and the execution-log entry).
    pub agent: String,
    /// The model name sent on the wire (provider prefix removed).
    pub model: String,
    /// `…/v1/`: requests go to `<base_url>chat/completions`.
    pub base_url: String,
    pub api_key_env: Option<String>,
    pub key_required: bool,
    pub string_tool_choice: bool,
    /// The persona: the agent's `system:` or the default.
    pub persona: String,
    pub messages: Vec<AgentMessage>,
    pub dir: Option<String>,
    pub tools: Vec<ToolDef>,
    /// The verdict vocabulary (without `failure`); empty = no verdict tool.
    pub verdicts: Vec<String>,
    pub note_required: bool,
    /// 0 = no cap.
    pub max_turns: u32,
    pub attempts: u32,
    pub timeout_ms: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub reasoning_effort: Option<String>,
    pub context_paths: Vec<String>,
    /// 0 = whole file.
    pub max_context_bytes: u64,
    pub budget_tokens: Option<u64>,
    /// The job's token ceiling: (cap, already spent by earlier steps of the run).
    pub job_budget: Option<(u64, u64)>,
    /// The job's spending counter (`budget::job_counter`): with a ledger,
    /// each turn adds to it and the job budget holds against its total.
    pub job_counter: Option<String>,
    /// The spending counter of the budgeted across this is a cell of.
    pub across_counter: Option<String>,
    pub assert: AgentAssert,
    /// `context.from` deliveries, sorted by sender: (sender, rendered text).
    pub upstream: Vec<(String, String)>,
    /// Agents this one may delegate to, as tools taking one `request` string.
    pub sub_agents: Vec<SubAgent>,
    /// Sources to fail over to, in order, when the current one is unwell.
    pub fallbacks: Vec<Endpoint>,
    /// `--answer 'substring=answer'` presets for ask_user.
    pub answers: Vec<(String, String)>,
    /// How many ask_user calls the step may make (default 3).
    pub max_questions: u32,
    /// The ask_user grant's settings, when ask_user is granted.
    pub ask: Option<Box<AskSpec>>,
    /// Where its shell and custom tools run: one container of this image
    /// for the conversation; None: the worker's host.
    pub image: Option<String>,
    pub container: ContainerSettings,
    /// Host variables its tools' commands may read (`env:`).
    pub env: Vec<String>,
    /// The MCP servers its grant names (started or reached by the worker, for this step).
    pub mcp_servers: Vec<McpServerWork>,
    /// Tokens the conversation may hold before its older part is
    /// summarized (agent-steps §3.9); 0: never compacted.
    pub compact_budget: u64,
    /// The share (percent) of its remaining token allowance a sub-agent call gets.
    pub delegate_percent: u32,
    /// OpenRouter's `x-session-id` for its requests (prompt caching): the
    /// same for one agent throughout a run.
    pub session: String,
    /// A CLI-backed agent (`@claude/<model>`): the CLI holds the conversation
    /// and its tools are served to it over the loopback bridge.
    pub cli: Option<CliWork>,
}

/// How a CLI-backed agent's CLI is run (agent-steps §5.9).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CliWork {
    /// The program (`claude`), found on the worker's PATH.
    pub program: String,
    /// The model passed to it (`sonnet` of `@claude/sonnet`), untouched.
    pub model: String,
    /// `settings: project`: the repository's `.claude/` scope is loaded.
    pub project_settings: bool,
    /// `budget.usd`: the step's ceiling, handed down as what is left of it.
    pub budget_usd: Option<f64>,
}

/// `<job>-<run>-<agent>`, each part kept to `[A-Za-z0-9._-]` (others become
/// `-`) and 64 characters, the whole to 256: OpenRouter's session id.
pub fn session_label(job: &str, run_id: &str, agent: &str) -> String {
    let clean = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' }).take(64).collect::<String>();
    let mut label = format!("{}-{}-{}", clean(job), clean(run_id), clean(agent));
    label.truncate(256);
    label
}

/// An MCP server as the worker reaches it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct McpServerWork {
    pub name: String,
    /// stdio: the program and its arguments (no shell).
    pub command: Vec<String>,
    /// stdio: the working directory, relative to the step's or absolute.
    pub cwd: Option<String>,
    /// Streamable HTTP: the endpoint URL.
    pub endpoint: Option<String>,
    /// HTTP `bearer`: the variable holding the token on the worker.
    pub bearer_env: Option<String>,
    /// HTTP `oauth`: signed in with `steppe mcp login` on the worker (its
    /// token read from the worker's credentials, refreshed when expired).
    pub oauth: bool,
    /// `stepgate:`: the stepfiles (file name, text) `steppe gate` serves on the worker.
    pub stepfiles: Vec<(String, String)>,
    /// `stepgate:`: the worker's variables the gate may read.
    pub env: Vec<String>,
}

impl AgentWork {
    /// Whether its tools, or those of an agent it delegates to (or that
    /// answers its questions), run in a container.
    pub fn uses_containers(&self) -> bool {
        self.image.is_some()
            || self.sub_agents.iter().any(|s| s.work.uses_containers())
            || self.ask.as_ref().and_then(|a| a.answered_by.as_ref()).is_some_and(|s| s.work.uses_containers())
    }
}

/// A container's `user:`, `network:`, `privileged:` and `container_limits:`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerSettings {
    /// `uid[:gid]` or a name; None: the invoking user's ids.
    pub user: Option<String>,
    /// `none` cuts every connection; None: the engine's default.
    pub network: Option<String>,
    pub privileged: bool,
    pub cpu_shares: Option<i64>,
    pub memory_bytes: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AskSpec {
    /// An agent asked before a person is.
    pub answered_by: Option<SubAgent>,
    pub default: Option<String>,
    pub options_required: bool,
    /// A person at the run's terminal is asked (the step runs in that process).
    pub inline: bool,
    /// How long a person is waited on; None: as long as it takes.
    pub timeout_ms: Option<u64>,
    /// With nobody at a terminal, the question waits in the store until
    /// it is answered (`steppe questions answer`) or expires.
    pub park: bool,
    /// How `steppe questions answer` reaches this run's store: the
    /// pipeline file, or `--coordinator URL`.
    pub answer_with: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubAgent {
    pub name: String,
    pub description: String,
    pub work: AgentWork,
}

/// Where a model is reached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Endpoint {
    pub model: String,
    pub base_url: String,
    pub api_key_env: Option<String>,
    pub key_required: bool,
    pub string_tool_choice: bool,
    /// A fallback's compaction budget, adopted when the conversation fails
    /// over to it (§5.8); 0: the conversation keeps its own.
    pub compact_budget: u64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentAssert {
    pub stdout: Option<String>,
    pub verdict: Option<String>,
    pub files: Vec<String>,
    pub tool_calls: Vec<(String, Map<String, Value>)>,
    pub nudge: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AgentMessage {
    Text(String),
    Artifact { artifact: String, path: String },
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToolDef {
    Builtin {
        name: String,
        /// web_fetch: hosts (and subdomains) it may reach; empty = any.
        allow: Vec<String>,
        timeout_ms: Option<u64>,
    },
    Custom {
        name: String,
        description: String,
        run: String,
        required: bool,
        /// 0 = unlimited.
        max_calls: u64,
        /// Pinned arguments, merged over the model's.
        pinned: Map<String, Value>,
        max_output_bytes: Option<u64>,
        timeout_ms: Option<u64>,
        /// `run` is a plain command, not a template (a fix agent's rerun tool).
        literal: bool,
    },
    /// Tools of an MCP server: one (`tool`), some (`tools`) or every one it
    /// lists (neither); the model sees each as `server__tool`.
    Mcp {
        server: String,
        tool: Option<String>,
        tools: Vec<String>,
        /// The single tool's description in place of the server's.
        description: Option<String>,
        required: bool,
        /// 0 = unlimited (the single form only).
        max_calls: u64,
        max_output_bytes: Option<u64>,
        timeout_ms: Option<u64>,
    },
}

/// The name the model calls an MCP server's tool by.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("{server}__{tool}")
}

impl AgentWork {
    /// Points models served on an unspecified address (`0.0.0.0`, `[::]`: a
    /// coordinator's scripted model, listening wherever it is reached) at
    /// `host`, the coordinator's as this worker dialled it; sub-agents and
    /// fallbacks alike.
    pub fn reach_unspecified_at(&mut self, host: &str) {
        reach_at(&mut self.base_url, host);
        for f in &mut self.fallbacks {
            reach_at(&mut f.base_url, host);
        }
        for s in &mut self.sub_agents {
            s.work.reach_unspecified_at(host);
        }
    }
}

fn reach_at(url: &mut String, host: &str) {
    for unspecified in ["0.0.0.0", "[::]"] {
        for scheme in ["http://", "https://"] {
            let prefix = format!("{scheme}{unspecified}");
            if let Some(rest) = url.strip_prefix(&prefix).filter(|r| r.is_empty() || r.starts_with([':', '/'])) {
                *url = format!("{scheme}{host}{rest}");
                return;
            }
        }
    }
}

/// The host part of a URL (`http://10.0.0.5:7070` → `10.0.0.5`; `[::1]` kept bracketed).
pub fn url_host(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map(|(_, r)| r)?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map(|(_, a)| a).unwrap_or(authority);
    let host = if authority.starts_with('[') { authority.split_inclusive(']').next()? } else { authority.split(':').next()? };
    Some(host).filter(|h| !h.is_empty())
}

#[cfg(test)]
mod reach_tests {
    use super::*;

    #[test]
    fn unspecified_model_hosts_become_the_coordinators() {
        let mut w = AgentWork { base_url: "http://0.0.0.0:4000/v1/".into(), ..Default::default() };
        w.fallbacks.push(Endpoint { base_url: "http://[::]:4001/v1/".into(), ..Default::default() });
        w.sub_agents.push(SubAgent { name: "s".into(), description: String::new(), work: AgentWork { base_url: "http://0.0.0.0:4002/".into(), ..Default::default() } });
        w.reach_unspecified_at("10.1.2.3");
        assert_eq!(w.base_url, "http://10.1.2.3:4000/v1/");
        assert_eq!(w.fallbacks[0].base_url, "http://10.1.2.3:4001/v1/");
        assert_eq!(w.sub_agents[0].work.base_url, "http://10.1.2.3:4002/");
        for kept in ["https://openrouter.ai/api/v1/", "http://0.0.0.01.example/v1/", "http://127.0.0.1:9/"] {
            let mut w = AgentWork { base_url: kept.into(), ..Default::default() };
            w.reach_unspecified_at("10.1.2.3");
            assert_eq!(w.base_url, kept);
        }
    }

    #[test]
    fn session_labels_keep_to_openrouters_alphabet_and_length() {
        assert_eq!(session_label("build app", "r-1a2-3", "réviewer"), "build-app-r-1a2-3-r-viewer");
        assert_eq!(session_label(&"j".repeat(100), "r", "a").len(), 64 + 1 + 1 + 1 + 1);
    }

    #[test]
    fn url_hosts() {
        assert_eq!(url_host("http://10.0.0.5:7070"), Some("10.0.0.5"));
        assert_eq!(url_host("https://user:pw@coord.example/x"), Some("coord.example"));
        assert_eq!(url_host("http://[::1]:7070/"), Some("[::1]"));
        assert_eq!(url_host("nonsense"), None);
    }
}

impl ToolDef {
    pub fn name(&self) -> &str {
        match self {
            ToolDef::Builtin { name, .. } | ToolDef::Custom { name, .. } => name,
            // A grant of several tools goes by its server's name.
            ToolDef::Mcp { server, .. } => server,
        }
    }
}

/// One call the model requested, as `assert.tool_calls` reads it.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TrajectoryEntry {
    pub name: String,
    pub args: Value,
    pub ok: bool,
}

/// A refused tool call, as recorded on the step.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DenialRecord {
    pub tool: String,
    pub path: String,
    pub reason: String,
}

/// What an agent conversation produced. (Its trajectory, denials and
/// transcript are serializable: a step's record stores them as JSON.)
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentOutcome {
    pub response: String,
    pub verdict: Option<String>,
    pub note: Option<String>,
    pub trajectory: Vec<TrajectoryEntry>,
    pub tokens: u64,
    pub turns: u32,
    pub wrapped_up: bool,
    pub denials: Vec<DenialRecord>,
    /// The fallback model that served the end of the conversation, if any.
    pub fallback_model: Option<String>,
    /// What happened, in order: the model's text, its calls, the results
    /// (each cut at 16 KiB; the whole capped at 256 KiB).
    pub transcript: Vec<TranscriptEvent>,
    /// The providers' usage reports, added up (sub-agents' included).
    pub usage: Usage,
}

/// Token counts as providers report them (`tokens` is what budgets compare).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    /// Prompt tokens read from the provider's cache (part of `prompt`).
    pub cached: u64,
    pub reasoning: u64,
    /// What the provider said the requests cost (OpenRouter's `usage.cost`),
    /// when every response said so.
    pub cost_usd: Option<f64>,
    /// How the last response ended (`stop`, `tool_calls`, `length`, …).
    pub finish: String,
    /// The model that served the last response (as the agent named it).
    pub model: String,
    /// Model responses counted.
    pub responses: u32,
}

impl Usage {
    /// Adds one response's `usage` object and finish reason.
    pub fn add_response(&mut self, model: &str, usage: Option<&serde_json::Value>, finish: Option<&str>) {
        self.model = model.to_string();
        let n = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_u64).unwrap_or(0);
        let u = usage.unwrap_or(&serde_json::Value::Null);
        self.prompt += n(u.get("prompt_tokens"));
        self.completion += n(u.get("completion_tokens"));
        self.cached += n(u.pointer("/prompt_tokens_details/cached_tokens"));
        self.reasoning += n(u.pointer("/completion_tokens_details/reasoning_tokens"));
        let cost = u.get("cost").and_then(serde_json::Value::as_f64);
        self.cost_usd = match (self.responses, self.cost_usd, cost) {
            (0, _, c) => c,
            (_, Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        if let Some(f) = finish {
            self.finish = f.to_string();
        }
        self.responses += 1;
    }

    /// Adds a sub-agent's (or an earlier attempt's) usage.
    pub fn absorb(&mut self, other: &Usage) {
        if other.responses == 0 {
            return;
        }
        self.prompt += other.prompt;
        self.completion += other.completion;
        self.cached += other.cached;
        self.reasoning += other.reasoning;
        self.cost_usd = match (self.responses, self.cost_usd, other.cost_usd) {
            (0, _, c) => c,
            (_, Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        self.responses += other.responses;
        if self.model.is_empty() {
            self.model = other.model.clone();
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TranscriptEvent {
    /// `text`, `call`, `result` or `subagent`.
    pub kind: String,
    pub name: String,
    pub content: String,
}
