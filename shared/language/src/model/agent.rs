//! The `tasks:` and `agents:` entries, model sources, tool grants and `fix:`.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{Budget, ContainerLimits, FileRef, Fix, Message, ToolGrant};
use crate::de::lenient_opt_vec;
use crate::duration::Duration;

/// A reusable task definition.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskDef {
    /// The entry's name, which `task: NAME` steps without `run:` use.
    pub name: String,
    /// A YAML document holding the rest of the definition (inline keys win).
    pub file: Option<String>,
    /// The shell script, run with `sh -c` in the step's own directory (required, or `run_file:`).
    pub run: Option<String>,
    /// A file (relative to the pipeline file) holding `run:`, read at load.
    pub run_file: Option<String>,
    /// An agent that repairs the task when it fails; a step's own `fix:` wins.
    pub fix: Option<Fix>,
    /// Run in a container of this image; a step's non-empty `image:` wins.
    pub image: Option<String>,
    /// The user the container runs as; a step's wins.
    pub user: Option<String>,
    /// The container's network (`none`: loopback only); a step's wins.
    pub network: Option<String>,
    /// Run the container privileged; true on the entry or on the step wins.
    pub privileged: Option<bool>,
    /// CPU share weight and memory limit of the container; a step's wins.
    pub container_limits: Option<ContainerLimits>,
    /// NAMES of host environment variables passed through; a step's `env:` (even `[]`) replaces them.
    pub env: Option<Vec<String>>,
    /// Deadline of one attempt; a step's wins.
    pub timeout: Option<Duration>,
    /// The artifacts the task reads; a step's `inputs:` replaces them.
    pub inputs: Option<Vec<String>>,
    /// The directories the task produces; a step's `outputs:` replaces them.
    pub outputs: Option<Vec<String>>,
}

/// An agent: a model source, a persona, dials and a tool grant.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    /// The agent's name, which `agent:` steps use; `@builtin/<profile>` merges over that profile.
    pub name: String,
    /// A YAML document holding the rest of the definition (inline keys win).
    pub file: Option<String>,
    /// Where the model is: `model`, `endpoint`, `api_key_env`, `string_tool_choice`.
    #[schemars(example = json!({"model": "openrouter/qwen/qwen3-coder"}))]
    pub source: Option<Source>,
    /// Alternate sources, tried in order when the primary is unavailable.
    pub fallback: Option<Vec<Fallback>>,
    /// A ceiling per step: `tokens` (hosted models) or `usd` (CLI agents); a breach errors the step.
    pub budget: Option<Budget>,
    /// Percent (1–100) of this agent's remaining allowance one sub-agent call
    /// gets (default: `defaults.delegate_budget_percent`, else 10).
    pub delegate_budget_percent: Option<i64>,
    /// Whether to probe this agent's model before a run (default: as `defaults.preflight` says).
    pub preflight: Option<bool>,
    /// What a parent sees when this agent is granted as a sub-agent.
    pub description: Option<String>,
    /// The persona: the opening of the system message.
    pub system: Option<String>,
    /// A file (relative to the pipeline file) holding `system:`, or
    /// `@builtin/<profile>` for a profile's persona.
    pub system_file: Option<String>,
    /// Sampling temperature sent to the model (unset: not sent).
    pub temperature: Option<f64>,
    /// Nucleus-sampling `top_p` sent to the model (unset: not sent).
    pub top_p: Option<f64>,
    /// Most tokens of one reply, sent to the model when above 0 (unset: not sent).
    pub max_tokens: Option<i64>,
    /// `low`, `medium` or `high`.
    pub reasoning_effort: Option<String>,
    /// Model requests one step's conversation may make (default 30; 0: no cap).
    #[schemars(extend("default" = 30))]
    pub max_turns: Option<i64>,
    /// Deadline of one step's whole conversation (default 30m; `"0"`: none).
    #[schemars(extend("default" = "30m"))]
    pub timeout: Option<Duration>,
    /// Times one failing model request is sent (connection errors, 408, 409,
    /// 429, 5xx; default 3; at least 1).
    #[schemars(extend("default" = 3))]
    pub attempts: Option<i64>,
    /// Compact the conversation once it holds this many tokens (0: never); outranks `context_window`.
    pub compact_after_tokens: Option<i64>,
    /// The model's context window in tokens; the conversation is compacted at 80% of it (default 128000).
    pub context_window: Option<i64>,
    /// Bytes of each `context_paths` file shown (default 100000; 0: the whole file).
    #[schemars(extend("default" = 100000))]
    pub max_context_bytes: Option<i64>,
    /// `ask_user` questions one step may ask (default 3).
    #[schemars(extend("default" = 3))]
    pub max_questions: Option<i64>,
    /// The tool grant: built-in names, custom tools, sub-agents, MCP tools
    /// (default: read_file, list_dir, search_files).
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    #[schemars(example = json!(["read_file", "search_files", {"builtin": "web_fetch", "allow": ["docs.rs"]}]))]
    pub tools: Option<Vec<ToolGrant>>,
    /// CLI agents only: `project` loads the repository's `.claude/` scope.
    pub settings: Option<String>,
    /// Run the agent's shell and custom tools in a container of this image (the
    /// conversation itself stays outside).
    pub image: Option<String>,
    /// NAMES of host environment variables its tools see; a step's `env:` wins.
    pub env: Option<Vec<String>>,
    /// The user its tools' container runs as; a step's wins.
    pub user: Option<String>,
    /// Its tools' container network (`none`: loopback only); a step's wins.
    pub network: Option<String>,
    /// Run its tools' container privileged; true on the agent or the step wins.
    pub privileged: Option<bool>,
    /// CPU share weight and memory limit of its tools' container; a step's wins.
    pub container_limits: Option<ContainerLimits>,
}

/// Where an agent's model is reached.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// `provider/model`, `@claude/<model>`, or a bare model with `endpoint`.
    pub model: Option<String>,
    /// Base URL of an OpenAI-compatible API, overriding the provider's (no credentials in it).
    pub endpoint: Option<String>,
    /// NAME of the environment variable holding the API key (default: the provider's, such as OPENAI_API_KEY).
    pub api_key_env: Option<String>,
    /// Force a tool call with `tool_choice: "required"` rather than by name
    /// (default: true for lmstudio and ollama, false otherwise).
    pub string_tool_choice: Option<bool>,
}

/// An alternate model source.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    /// The alternate source (the keys of `source:`; a model is required).
    pub source: Option<Source>,
}

/// The mapping form of a tool grant. Which keys are valid depends on the
/// form (builtin, custom, sub-agent, MCP); that is checked at load.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// A built-in tool: read_file, list_dir, search_files, run_shell, write_file, edit_file, web_fetch, ask_user.
    pub builtin: Option<String>,
    /// A custom tool's name as the model sees it (1–64 letters, digits, `_` or `-`).
    pub name: Option<String>,
    /// What the model is told the tool does (custom tools, sub-agents, single MCP tools).
    pub description: Option<String>,
    /// A custom tool's templated shell command (`{{ .args.X }}`).
    pub run: Option<String>,
    /// The tool must have succeeded before the conversation may end (custom and single MCP tools; default false).
    #[schemars(extend("default" = false))]
    pub required: Option<bool>,
    /// Calls allowed per attempt (custom and single MCP tools; 0: unlimited).
    #[schemars(extend("default" = 0))]
    pub max_calls: Option<i64>,
    /// Pinned arguments, invisible to the model.
    pub args: Option<Map<String, Value>>,
    /// Bytes of a result shown inline before the rest is spilled to a file
    /// (custom and MCP tools; default 32000, at most 10 MiB).
    #[schemars(extend("default" = 32000))]
    pub max_output_bytes: Option<i64>,
    /// Deadline for one call.
    pub timeout: Option<Duration>,
    /// web_fetch only: hosts (and their subdomains) it may reach.
    pub allow: Option<Vec<String>>,
    /// ask_user only: an agent asked before a person is.
    pub answered_by: Option<String>,
    /// ask_user only: the answer used when nobody answers in time.
    pub default: Option<String>,
    /// ask_user only: refuse answers outside the offered options.
    pub options_required: Option<bool>,
    /// A sub-agent grant: the agent's name.
    pub agent: Option<String>,
    /// An MCP grant: the server's name.
    pub mcp: Option<String>,
    /// An MCP grant of one tool: its name on the server (the model sees `server__tool`).
    pub tool: Option<String>,
    /// An MCP grant of a subset: tool names on the server.
    pub tools: Option<Vec<String>>,
}

/// The mapping form of `fix:`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixSpec {
    /// The fix agent (required; not a CLI agent, no image, sub-agents or MCP tools).
    pub agent: Option<String>,
    /// One user message (shorthand for a one-entry `messages:`).
    pub prompt: Option<String>,
    /// A file holding the one user message (a path, or `{artifact, path}`).
    pub prompt_file: Option<FileRef>,
    /// The fix conversation's user turns (default: one asking for the smallest
    /// change that makes the command pass); the failure's output follows the first.
    pub messages: Option<Vec<String>>,
    /// Like `messages:`, from files (paths, or `{artifact, path}`).
    pub message_files: Option<Vec<FileRef>>,
    /// Working directory inside the failing task's directory.
    pub dir: Option<String>,
    /// Narrows the fix agent's grant; the rerun tool (named after the task) is always added.
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    pub tools: Option<Vec<ToolGrant>>,
    /// Times one failing model request is sent (default 1).
    #[schemars(extend("default" = 1))]
    pub attempts: Option<i64>,
    /// Deadline of the fix conversation (default: the agent's `timeout`, else 30m).
    pub timeout: Option<Duration>,
    /// The fix's user messages once resolved (see `Step::resolved_messages`).
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_messages: Vec<Message>,
}
