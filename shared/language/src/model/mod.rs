//! The typed pipeline model: every key of the format, as decoded.
//!
//! Decoding is strict (unknown keys are errors, see `de.rs`) but lenient about
//! shapes that mean one thing (`fix: agent` and `fix: {agent: …}`). A step is
//! one flat struct holding every step key, like the reference's: which keys
//! may combine with which kind is the validator's business, so that a
//! misplaced key gets a message naming the rule rather than "unknown key".

mod forms;
mod kinds;
pub mod walk;

pub use forms::*;
pub use kinds::StepKind;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::de::{lenient_opt_vec, lenient_vec};
use crate::duration::Duration;

/// A whole pipeline file.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "steppe pipeline")]
pub struct Pipeline {
    /// Resource types: how to check, fetch (`in`) and publish (`out`) a kind of resource.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub resource_types: Vec<ResourceType>,
    /// Resources: named, configured instances of a resource type.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub resources: Vec<Resource>,
    /// Jobs: named plans of steps. `steppe run --job NAME` runs one.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub jobs: Vec<Job>,
    /// Reusable task definitions, referenced by `task:` steps that carry no `run:`.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub tasks: Vec<TaskDef>,
    /// Agent definitions, referenced by `agent:` steps.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub agents: Vec<AgentDef>,
    /// MCP servers whose tools agents may be granted.
    #[serde(default, deserialize_with = "lenient_vec")]
    pub mcp_servers: Vec<McpServer>,
    /// Pipeline-wide defaults.
    pub defaults: Option<Defaults>,
    /// How step workspaces are made.
    pub workspace: Option<WorkspaceConfig>,
    /// Pipeline-level assertion, checked by `steppe test`: `execution` (job names in order).
    pub assert: Option<AssertSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceType {
    pub name: String,
    /// Exactly one backend: shell `check`/`in`/`out`, `expr:`, or `mcp:`.
    pub config: Option<TypeConfig>,
    pub image: Option<String>,
    pub user: Option<String>,
    pub network: Option<String>,
    pub privileged: Option<bool>,
    pub container_limits: Option<ContainerLimits>,
    /// Names of host environment variables the stages may read.
    pub env: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeConfig {
    /// Shell template printing a JSON array of versions, oldest first.
    pub check: Option<String>,
    /// Shell template that writes the fetched version into its working directory.
    #[serde(rename = "in")]
    pub in_: Option<String>,
    /// Shell template that publishes; may print one JSON object (the new version).
    pub out: Option<String>,
    pub check_file: Option<String>,
    pub in_file: Option<String>,
    pub out_file: Option<String>,
    /// In-process expression backend.
    pub expr: Option<ExprConfig>,
    /// MCP tool backend.
    pub mcp: Option<McpConfig>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExprConfig {
    pub check: Option<String>,
    #[serde(rename = "in")]
    pub in_: Option<String>,
    pub out: Option<String>,
    pub check_file: Option<String>,
    pub in_file: Option<String>,
    pub out_file: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    pub server: Option<String>,
    pub check: Option<McpStage>,
    #[serde(rename = "in")]
    pub in_: Option<McpStage>,
    pub out: Option<McpStage>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpStage {
    pub tool: Option<String>,
    pub args: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    pub name: String,
    #[serde(rename = "type")]
    pub type_: String,
    /// Free-form configuration handed to the type's stages as `.source`.
    pub source: Option<Value>,
    pub env: Option<Vec<String>>,
    /// NAME of the environment variable holding the webhook token.
    pub webhook_token_env: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContainerLimits {
    /// CPU share weight (1024 = docker's default).
    pub cpu: Option<i64>,
    /// Memory limit in bytes (or a size such as `512m`).
    pub memory: Option<Memory>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub name: String,
    #[serde(deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub plan: Vec<Step>,
    /// One build at a time.
    pub serial: Option<bool>,
    pub serial_groups: Option<Vec<String>>,
    pub max_in_flight: Option<i64>,
    pub interruptible: Option<bool>,
    pub max_consecutive_failures: Option<i64>,
    /// Wall-clock ceiling for the whole job.
    pub timeout: Option<Duration>,
    /// Cumulative token ceiling over every agent step of the job.
    pub budget: Option<Budget>,
    pub on_success: Option<Box<Step>>,
    pub on_failure: Option<Box<Step>>,
    pub on_error: Option<Box<Step>>,
    pub on_abort: Option<Box<Step>>,
    pub ensure: Option<Box<Step>>,
    /// `execution` (step names in order) and `outcome` (succeeded|failed).
    pub assert: Option<AssertSpec>,
}

/// One step of a plan. Exactly one of the kind keys (`get`, `task`, `put`,
/// `agent`, `try`, `do`, `in_parallel`, `race`, `ensemble`, `load_var`,
/// `approval`) is set; the other keys modify it.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    // --- kinds ---
    /// Fetch a version of a resource; the artifact takes this name.
    pub get: Option<String>,
    /// Run a command (inline `run:`) or a `tasks:` entry of this name.
    pub task: Option<String>,
    /// Publish to a resource.
    pub put: Option<String>,
    /// Hold a tool-calling conversation with this agent.
    pub agent: Option<String>,
    /// Run the wrapped step and tolerate its failure.
    #[serde(rename = "try")]
    pub try_: Option<Box<Step>>,
    /// Run steps in order; the first failure stops the block.
    #[serde(rename = "do", default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<Step>>")]
    pub do_: Option<Vec<Step>>,
    pub in_parallel: Option<InParallel>,
    pub race: Option<Race>,
    pub ensemble: Option<Ensemble>,
    /// Read a file into a run-scoped `((var))`.
    pub load_var: Option<String>,
    /// Park until a person approves or rejects.
    pub approval: Option<Approval>,

    // --- get ---
    pub resource: Option<String>,
    pub trigger: Option<bool>,
    pub version: Option<VersionSpec>,
    pub passed: Option<Vec<String>>,
    pub params: Option<Value>,

    // --- task ---
    pub run: Option<String>,
    pub run_file: Option<String>,
    pub fix: Option<Fix>,
    pub inputs: Option<Inputs>,
    pub outputs: Option<Vec<String>>,
    pub input_mapping: Option<Map<String, Value>>,
    pub output_mapping: Option<Map<String, Value>>,

    // --- container ---
    pub image: Option<String>,
    pub user: Option<String>,
    pub network: Option<String>,
    pub privileged: Option<bool>,
    pub container_limits: Option<ContainerLimits>,
    pub env: Option<Vec<String>>,

    // --- modifiers ---
    pub attempts: Option<i64>,
    pub timeout: Option<Duration>,
    pub when: Option<When>,
    pub to: Option<Routes>,
    pub max_visits: Option<i64>,
    pub assert: Option<AssertSpec>,
    pub context: Option<ContextSpec>,
    pub volatile: Option<bool>,
    pub across: Option<Vec<AcrossVar>>,
    pub max_in_flight: Option<i64>,
    pub budget: Option<Budget>,

    // --- agent ---
    /// One user message (shorthand for a one-entry `messages:`).
    pub prompt: Option<String>,
    pub prompt_file: Option<FileRef>,
    /// User turns, each sent after the model answered the previous one.
    pub messages: Option<Vec<String>>,
    pub message_files: Option<Vec<FileRef>>,
    pub dir: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    pub tools: Option<Vec<ToolGrant>>,
    pub max_turns: Option<i64>,
    pub context_paths: Option<Vec<String>>,
    pub max_context_bytes: Option<i64>,
    pub max_questions: Option<i64>,
    pub verdicts: Option<Vec<Verdict>>,

    // --- load_var ---
    pub file: Option<String>,

    // --- hooks ---
    pub on_success: Option<Box<Step>>,
    pub on_failure: Option<Box<Step>>,
    pub on_error: Option<Box<Step>>,
    pub on_abort: Option<Box<Step>>,
    pub ensure: Option<Box<Step>>,

    /// The step's user messages once `prompt`/`prompt_file`/`message_files`
    /// are resolved (load-time files read; artifact files left for run time).
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_messages: Vec<Message>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InParallelSpec {
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub steps: Vec<Step>,
    /// How many branches run at once (unbounded when omitted).
    pub limit: Option<i64>,
    /// Cancel the other branches on the first failure.
    pub fail_fast: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RaceSpec {
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub steps: Vec<Step>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ensemble {
    /// Two or more agent steps, asked the same question, voting independently.
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub agents: Vec<Step>,
    /// The vocabulary every member votes in, and where the block's decision routes.
    pub verdicts: Option<Vec<Verdict>>,
    /// `majority`, `unanimous`, `any`, or the name of a judge agent.
    pub decide: Option<String>,
    /// `fail` (default) or `exclude`.
    pub member_errors: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    pub message: Option<String>,
    /// How long to wait (default 24h).
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Routes {
    pub success: Option<String>,
    pub failure: Option<String>,
}

/// Step, job and pipeline assertions (which fields are valid where is checked at load).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AssertSpec {
    /// Ordered names in the execution log (job: step names; pipeline: job names).
    pub execution: Option<Vec<String>>,
    /// Job only: `succeeded` or `failed`.
    pub outcome: Option<String>,
    /// Substring of stdout (task) or of the final response (agent).
    pub stdout: Option<String>,
    /// Exact exit code (task only).
    pub code: Option<i64>,
    /// The verdict an agent step must reach.
    pub verdict: Option<String>,
    /// Files (`<output>/<path>`) the step must leave behind, non-empty.
    pub files: Option<Vec<String>>,
    /// Calls the agent must have made, as an ordered subsequence.
    pub tool_calls: Option<Vec<ToolCallAssert>>,
    /// Tell the model about unmet `files:`/`tool_calls:` while it can still act.
    pub nudge: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallAssert {
    pub name: Option<String>,
    pub args: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextSpec {
    /// Step name → `verdict`, `note` or `full`.
    pub from: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcrossVar {
    pub var: Option<String>,
    /// Values for this axis (scalars, taken as strings).
    pub values: Option<Vec<Value>>,
    /// A JSON array of strings inside an artifact produced earlier.
    pub from_file: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    pub tokens: Option<i64>,
    pub usd: Option<f64>,
    /// across only: tokens held back for each in-flight cell.
    pub reserve_per_cell: Option<i64>,
}

/// A reusable task definition.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskDef {
    pub name: String,
    /// A YAML document holding the rest of the definition (inline keys win).
    pub file: Option<String>,
    pub run: Option<String>,
    pub run_file: Option<String>,
    pub fix: Option<Fix>,
    pub image: Option<String>,
    pub user: Option<String>,
    pub network: Option<String>,
    pub privileged: Option<bool>,
    pub container_limits: Option<ContainerLimits>,
    pub env: Option<Vec<String>>,
    pub timeout: Option<Duration>,
    pub inputs: Option<Vec<String>>,
    pub outputs: Option<Vec<String>>,
}

/// An agent: a model source, a persona, dials and a tool grant.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    pub name: String,
    /// A YAML document holding the rest of the definition (inline keys win).
    pub file: Option<String>,
    pub source: Option<Source>,
    /// Alternate sources, tried in order when the primary is unavailable.
    pub fallback: Option<Vec<Fallback>>,
    pub budget: Option<Budget>,
    pub delegate_budget_percent: Option<i64>,
    pub preflight: Option<bool>,
    /// What a parent sees when this agent is granted as a sub-agent.
    pub description: Option<String>,
    pub system: Option<String>,
    pub system_file: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub max_tokens: Option<i64>,
    /// `low`, `medium` or `high`.
    pub reasoning_effort: Option<String>,
    pub max_turns: Option<i64>,
    pub timeout: Option<Duration>,
    pub attempts: Option<i64>,
    pub compact_after_tokens: Option<i64>,
    pub context_window: Option<i64>,
    pub max_context_bytes: Option<i64>,
    pub max_questions: Option<i64>,
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    pub tools: Option<Vec<ToolGrant>>,
    /// CLI agents only: `project` loads the repository's `.claude/` scope.
    pub settings: Option<String>,
    pub image: Option<String>,
    pub env: Option<Vec<String>>,
    pub user: Option<String>,
    pub network: Option<String>,
    pub privileged: Option<bool>,
    pub container_limits: Option<ContainerLimits>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// `provider/model`, `@claude/<model>`, or a bare model with `endpoint`.
    pub model: Option<String>,
    pub endpoint: Option<String>,
    /// NAME of the environment variable holding the API key.
    pub api_key_env: Option<String>,
    pub string_tool_choice: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Fallback {
    pub source: Option<Source>,
}

/// The mapping form of a tool grant. Which keys are valid depends on the
/// form (builtin, custom, sub-agent, MCP); that is checked at load.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// A built-in tool: read_file, list_dir, search_files, run_shell, write_file, edit_file, web_fetch, ask_user.
    pub builtin: Option<String>,
    /// A custom tool's name.
    pub name: Option<String>,
    pub description: Option<String>,
    /// A custom tool's templated shell command (`{{ .args.X }}`).
    pub run: Option<String>,
    pub required: Option<bool>,
    pub max_calls: Option<i64>,
    /// Pinned arguments, invisible to the model.
    pub args: Option<Map<String, Value>>,
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
    pub tool: Option<String>,
    pub tools: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FixSpec {
    pub agent: Option<String>,
    pub prompt: Option<String>,
    pub prompt_file: Option<FileRef>,
    pub messages: Option<Vec<String>>,
    pub message_files: Option<Vec<FileRef>>,
    pub dir: Option<String>,
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    pub tools: Option<Vec<ToolGrant>>,
    pub attempts: Option<i64>,
    pub timeout: Option<Duration>,
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_messages: Vec<Message>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    pub name: String,
    /// Streamable HTTP endpoint (exclusive with `command`).
    pub endpoint: Option<String>,
    /// A stdio server's program (argv, never a shell).
    pub command: Option<String>,
    pub args: Option<Vec<String>>,
    pub cwd: Option<String>,
    pub auth: Option<McpAuth>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpAuth {
    /// `none`, `bearer` or `oauth`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    pub api_key_env: Option<String>,
    pub client_id: Option<String>,
    pub client_secret_env: Option<String>,
    pub callback_port: Option<i64>,
    pub scopes: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The model of every agent whose source names none.
    pub model: Option<String>,
    pub delegate_budget_percent: Option<i64>,
    pub version_history: Option<i64>,
    pub run_history: Option<i64>,
    pub preflight: Option<PreflightDefaults>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreflightDefaults {
    pub disabled: Option<bool>,
    pub timeout: Option<Duration>,
    pub cache: Option<Duration>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// `copy` (default) or `btrfs`.
    pub strategy: Option<String>,
    pub root: Option<String>,
    pub options: Option<WorkspaceOptions>,
    pub cache: Option<WorkspaceCache>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceOptions {
    /// btrfs only: `zstd`, `lzo`, `zlib` or `none`.
    pub compression: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceCache {
    pub resources: Option<bool>,
    pub max_entries: Option<i64>,
}
