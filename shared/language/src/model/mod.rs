//! The typed pipeline model: every key of the format, as decoded.
//!
//! Decoding is strict (unknown keys are errors, see `de.rs`) but lenient about
//! shapes that mean one thing (`fix: agent` and `fix: {agent: …}`). A step is
//! one flat struct holding every step key, like the reference's: which keys
//! may combine with which kind is the validator's business, so that a
//! misplaced key gets a message naming the rule rather than "unknown key".
//!
//! Every field's doc comment is its description in the JSON Schema (what an
//! editor shows) and in docs/reference.md; a test fails on a key without one.
//! The top level, jobs, defaults and the workspace are here; `resource.rs`
//! holds resource types, resources and MCP servers, `step.rs` a step with its
//! blocks and modifiers, `agent.rs` the `tasks:` and `agents:` entries.

mod agent;
mod forms;
mod kinds;
mod resource;
mod step;
pub mod walk;

pub use agent::*;
pub use forms::*;
pub use kinds::StepKind;
pub use resource::*;
pub use step::*;

use schemars::JsonSchema;
use serde::Deserialize;

use crate::de::lenient_vec;
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
    /// Jobs: named plans of steps (at least one). `steppe run --job NAME` runs one.
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
    /// Pipeline-wide defaults: the fallback model, history retention, preflight.
    pub defaults: Option<Defaults>,
    /// How step workspaces are made.
    pub workspace: Option<WorkspaceConfig>,
    /// Pipeline-level assertion, checked by `steppe test`: `execution` (job names in order).
    pub assert: Option<AssertSpec>,
}

/// A job: a named plan of steps, with its limits, hooks and assertion.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Job {
    /// The job's name, unique in the pipeline; `steppe run --job` and `passed:` name it.
    pub name: String,
    /// The steps the job runs, in order (at least one).
    #[serde(deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub plan: Vec<Step>,
    /// One build of the job at a time (default false).
    #[schemars(extend("default" = false))]
    pub serial: Option<bool>,
    /// Tags: jobs sharing one never run at the same time (no empty or repeated
    /// name; not with `max_in_flight`).
    pub serial_groups: Option<Vec<String>>,
    /// How many builds of the job may run at once (0 or omitted: unlimited; not
    /// with `serial` or `serial_groups`).
    pub max_in_flight: Option<i64>,
    /// Whether stopping the watcher cancels a running build instead of waiting
    /// for it (default false).
    #[schemars(extend("default" = false))]
    pub interruptible: Option<bool>,
    /// Pause the job after this many failed triggered runs in a row (0 or
    /// omitted: never); `steppe jobs --resume` clears it.
    pub max_consecutive_failures: Option<i64>,
    /// Wall-clock ceiling for the whole job, checked between steps; past it the
    /// job fails. Must be positive.
    pub timeout: Option<Duration>,
    /// Cumulative token ceiling over every agent step of the job (sub-agents and
    /// retries included; `tokens` only); a breach errors the step.
    pub budget: Option<Budget>,
    /// A step (task, put, agent or try) run after the job succeeds.
    pub on_success: Option<Box<Step>>,
    /// A step run after the job fails.
    pub on_failure: Option<Box<Step>>,
    /// A step run after the job errors (an infrastructure problem, a budget breach).
    pub on_error: Option<Box<Step>>,
    /// A step run after the job is aborted (cancelled).
    pub on_abort: Option<Box<Step>>,
    /// A step run after the job whatever its outcome, after the `on_*` hook.
    pub ensure: Option<Box<Step>>,
    /// Checked after the job's hooks: `execution` (step names in order) and
    /// `outcome` (`succeeded`, or `failed`, which a failed job then passes).
    pub assert: Option<AssertSpec>,
}

/// Pipeline-wide defaults.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// The model of an agent whose source names none, when `$STEPPE_MODEL` is not set.
    pub model: Option<String>,
    /// Percent (1–100) of a caller's remaining token allowance one sub-agent
    /// call may spend (default 10); an agent's own setting wins.
    #[schemars(extend("default" = 10))]
    pub delegate_budget_percent: Option<i64>,
    /// Versions kept per resource, newest first (default 1000; 0 keeps all).
    #[schemars(extend("default" = 1000))]
    pub version_history: Option<i64>,
    /// Runs kept per job (default 100; 0 keeps all).
    #[schemars(extend("default" = 100))]
    pub run_history: Option<i64>,
    /// Probing models and MCP servers before a run's first step.
    pub preflight: Option<PreflightDefaults>,
}

/// The probe of models and MCP servers before a run.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreflightDefaults {
    /// Skip the probe, as `--no-preflight` does (default false).
    #[schemars(extend("default" = false))]
    pub disabled: Option<bool>,
    /// Deadline of one probe (default 30s).
    #[schemars(extend("default" = "30s"))]
    pub timeout: Option<Duration>,
    /// How long a target that answered is trusted without a new probe (default 5m, at most 15m).
    #[schemars(extend("default" = "5m"))]
    pub cache: Option<Duration>,
}

/// How step workspaces are made.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceConfig {
    /// `copy` (default) or `btrfs` (copy-on-write snapshots; needs `root`).
    #[schemars(extend("default" = "copy"))]
    pub strategy: Option<String>,
    /// The directory workspaces are made under (required by btrfs and the
    /// resource cache; default: the system's temporary directory).
    pub root: Option<String>,
    /// Options of the strategy.
    pub options: Option<WorkspaceOptions>,
    /// What is cached across builds under `root`.
    pub cache: Option<WorkspaceCache>,
}

/// Options of the workspace strategy.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceOptions {
    /// btrfs only: `zstd`, `lzo`, `zlib` or `none`.
    pub compression: Option<String>,
}

/// Caches kept across builds.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceCache {
    /// Cache fetched resource versions across builds (needs `workspace.root`; default false).
    #[schemars(extend("default" = false))]
    pub resources: Option<bool>,
    /// Most cached versions kept, the least recently used dropped first (default 50; 0 means the default).
    #[schemars(extend("default" = 50))]
    pub max_entries: Option<i64>,
}
