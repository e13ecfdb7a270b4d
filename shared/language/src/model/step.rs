//! A step — one flat struct with every step key — and the blocks, routes,
//! assertions, matrix axes and budgets it carries.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{ContainerLimits, FileRef, Fix, InParallel, Inputs, Message, Race, ToolGrant, Verdict, VersionSpec, When};
use crate::de::{lenient_opt_vec, lenient_vec};
use crate::duration::Duration;

/// One step of a plan. Exactly one of the kind keys (`get`, `task`, `put`,
/// `agent`, `try`, `do`, `in_parallel`, `race`, `ensemble`, `load_var`,
/// `approval`) is set; the other keys modify it.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Step {
    // --- kinds ---
    /// Fetch a version of a resource; the artifact (and the resource, unless
    /// `resource:` says otherwise) takes this name.
    pub get: Option<String>,
    /// Run a command: the inline `run:`, or else the `tasks:` entry of this name.
    pub task: Option<String>,
    /// Publish to the resource of this name (its type's `out` stage).
    pub put: Option<String>,
    /// Hold a tool-calling conversation with this agent (an `agents:` entry or a `@builtin/` profile).
    pub agent: Option<String>,
    /// Run the wrapped step (not a get) and tolerate its failure or error; an abort still stops the job.
    #[serde(rename = "try")]
    pub try_: Option<Box<Step>>,
    /// Run steps in order; the first failure stops the block.
    #[serde(rename = "do", default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<Step>>")]
    pub do_: Option<Vec<Step>>,
    /// Run branches at the same time; the block fails if any branch fails.
    pub in_parallel: Option<InParallel>,
    /// Run branches at the same time; the first to succeed wins and the others are cancelled.
    pub race: Option<Race>,
    /// Ask several agent steps the same question and combine their votes.
    pub ensemble: Option<Ensemble>,
    /// Read a file into the run-scoped variable `((NAME))` (trimmed) for later steps.
    pub load_var: Option<String>,
    /// Wait until a person approves (go on) or rejects (the step fails).
    pub approval: Option<Approval>,

    // --- get ---
    /// The resource a get fetches when it is not the get's own name (the artifact keeps the get's name).
    pub resource: Option<String>,
    /// A watcher starts the job when the resource has a new version (default
    /// false; `run` and `test` ignore it).
    #[schemars(extend("default" = false))]
    pub trigger: Option<bool>,
    /// `latest` (default), `every` (one build per version not yet taken; top-level
    /// gets only), or a pin: a mapping of version fields.
    #[schemars(extend("default" = "latest"))]
    #[schemars(example = json!({"ref": "4f2a9c1"}))]
    pub version: Option<VersionSpec>,
    /// Jobs (at least one, not this one, each getting this resource) a version
    /// must have passed to be chosen.
    #[schemars(example = json!(["unit-tests"]))]
    pub passed: Option<Vec<String>>,
    /// Free-form data handed to the type's stage as `.params`: `in` on a get, `out` on a put.
    pub params: Option<Value>,

    // --- task ---
    /// The shell script of an inline task, run with `sh -c` in the step's own directory.
    #[schemars(example = &"make test")]
    pub run: Option<String>,
    /// A file (relative to the pipeline file) whose text is the task's `run:`, read at load.
    pub run_file: Option<String>,
    /// An agent that repairs the task when it fails (its `assert:`, else a
    /// non-zero exit); then the task runs once more.
    #[schemars(example = &"fixer")]
    pub fix: Option<Fix>,
    /// Artifacts copied into the step's directory, each under its name; on a
    /// put, `all` passes every artifact produced so far.
    #[schemars(example = json!(["repo"]))]
    pub inputs: Option<Inputs>,
    /// Directories made empty in the step's directory and stored as artifacts when the step succeeds.
    #[schemars(example = json!(["dist"]))]
    pub outputs: Option<Vec<String>>,
    /// Binds a task's input names to other artifacts: `{input: artifact}`.
    #[schemars(example = json!({"src": "repo"}))]
    pub input_mapping: Option<Map<String, Value>>,
    /// Stores a task's outputs under other artifact names: `{output: artifact}`.
    #[schemars(example = json!({"dist": "release"}))]
    pub output_mapping: Option<Map<String, Value>>,

    // --- container ---
    /// Run in a container of this image (on a worker that reaches a Docker engine);
    /// an agent's tools run there.
    #[schemars(example = &"alpine:3.20")]
    pub image: Option<String>,
    /// The user the container runs as (`UID:GID` or a name the image knows;
    /// default: the invoking user's uid:gid).
    pub user: Option<String>,
    /// The container's network; `none` leaves only loopback. Needs an image.
    #[schemars(example = &"none")]
    pub network: Option<String>,
    /// Run the container privileged (default false). Needs an image.
    #[schemars(extend("default" = false))]
    pub privileged: Option<bool>,
    /// CPU share weight and memory limit of the container (at least one). Needs an image.
    #[schemars(example = json!({"cpu": 512, "memory": "512m"}))]
    pub container_limits: Option<ContainerLimits>,
    /// NAMES of host environment variables the command sees besides the
    /// allowlist (into a container: these alone); never `NAME=value`.
    #[schemars(example = json!(["GITHUB_TOKEN"]))]
    pub env: Option<Vec<String>>,

    // --- modifiers ---
    /// Times the step is tried, at least 1 (default 1; an agent 3, which
    /// retries a failing model request within the conversation).
    pub attempts: Option<i64>,
    /// Deadline of one attempt (default none; an agent 30m). Positive; `"0"`
    /// (no deadline) only on agent steps.
    #[schemars(example = &"10m")]
    pub timeout: Option<Duration>,
    /// A guard run first, among the step's inputs: exit 0 runs the step,
    /// anything else skips it (no hooks, no record).
    #[schemars(example = &"test -f repo/Makefile")]
    pub when: Option<When>,
    /// Where the plan goes next by outcome: `{success: STEP, failure: STEP}`
    /// (`next`: the following step).
    #[schemars(example = json!({"failure": "notify"}))]
    pub to: Option<Routes>,
    /// Times this routing step may run in one walk of the plan (1–1000);
    /// required when one of its routes leads back to it or earlier.
    pub max_visits: Option<i64>,
    /// What the step must achieve, judged instead of its exit code: `stdout`,
    /// `code` (task), `verdict`, `tool_calls` (agent), `files`, `nudge` (agent).
    #[schemars(example = json!({"stdout": "ok"}))]
    pub assert: Option<AssertSpec>,
    /// Earlier decisions the step reads: `from: {STEP: verdict|note|full}`,
    /// STEP a step of this job that declares verdicts.
    #[schemars(example = json!({"from": {"reviewer": "note"}}))]
    pub context: Option<ContextSpec>,
    /// Never reuse the step's outputs from the step cache (default false); not on hooks.
    #[schemars(extend("default" = false))]
    pub volatile: Option<bool>,
    /// Run the step once per cell of these axes (their product, the last axis
    /// fastest); `{{ .vars.NAME }}` is filled in per cell.
    #[schemars(example = json!([{"var": "os", "values": ["linux", "darwin"]}]))]
    pub across: Option<Vec<AcrossVar>>,
    /// With `across:`: how many cells run at once (unset, 0 or 1: one after another).
    pub max_in_flight: Option<i64>,
    /// With `across:`: a token ceiling for the cells; once spent no more cells
    /// start, and the plan goes on.
    pub budget: Option<Budget>,

    // --- agent ---
    /// One user message (shorthand for a one-entry `messages:`; not beside it).
    pub prompt: Option<String>,
    /// A file holding the one user message: a path relative to the pipeline
    /// file (read at load) or `{artifact, path}` in an input (read at run time).
    pub prompt_file: Option<FileRef>,
    /// User turns, each sent after the model answered the previous one without a tool call.
    #[schemars(example = json!(["Review the change in repo/ and write review/notes.md."]))]
    pub messages: Option<Vec<String>>,
    /// Like `messages:`, from files: paths relative to the pipeline file (read
    /// at load) or `{artifact, path}` in an input (read at run time).
    pub message_files: Option<Vec<FileRef>>,
    /// The conversation's working directory, inside one of the step's inputs
    /// or outputs (default: the step's directory).
    pub dir: Option<String>,
    /// Narrows the agent's grant to these tools (inline custom tools allowed;
    /// absent: the whole grant).
    #[serde(default, deserialize_with = "lenient_opt_vec")]
    #[schemars(with = "Option<Vec<ToolGrant>>")]
    #[schemars(example = json!(["read_file", "search_files"]))]
    pub tools: Option<Vec<ToolGrant>>,
    /// Model requests the conversation may make (overrides the agent's; default 30; 0: no cap).
    pub max_turns: Option<i64>,
    /// Files (relative to the working directory) put into the conversation before
    /// the first message; needs read_file in the grant.
    pub context_paths: Option<Vec<String>>,
    /// Bytes of each `context_paths` file shown (overrides the agent's; default 100000; 0: whole).
    pub max_context_bytes: Option<i64>,
    /// `ask_user` questions the step may ask (overrides the agent's; default 3).
    pub max_questions: Option<i64>,
    /// The decisions the agent must choose among (a required `verdict` tool):
    /// `NAME`, or `{NAME: STEP}` to route; `failure: STEP` catches a failure.
    #[schemars(example = json!(["approve", {"revise": "editor"}]))]
    pub verdicts: Option<Vec<Verdict>>,

    // --- load_var ---
    /// The file a `load_var:` step reads: `ARTIFACT/path` inside one of its inputs.
    #[schemars(example = &"meta/version")]
    pub file: Option<String>,

    // --- hooks ---
    /// A step (task, put, agent or try) run after this one succeeds; its failure fails this step.
    pub on_success: Option<Box<Step>>,
    /// A step run after this one fails.
    pub on_failure: Option<Box<Step>>,
    /// A step run after this one errors (an infrastructure problem, a budget breach).
    pub on_error: Option<Box<Step>>,
    /// A step run after this one is aborted.
    pub on_abort: Option<Box<Step>>,
    /// A step run after this one whatever its outcome (after the `on_*` hook);
    /// its failure fails a step that succeeded.
    pub ensure: Option<Box<Step>>,

    /// The step's user messages once `prompt`/`prompt_file`/`message_files`
    /// are resolved (load-time files read; artifact files left for run time).
    #[serde(skip)]
    #[schemars(skip)]
    pub resolved_messages: Vec<Message>,
}

/// The mapping form of `in_parallel:`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InParallelSpec {
    /// The branches (at least one); no two may declare the same output.
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub steps: Vec<Step>,
    /// How many branches run at once, at least 1 (unbounded when omitted).
    pub limit: Option<i64>,
    /// Cancel the other branches on the first failure (default false).
    #[schemars(extend("default" = false))]
    pub fail_fast: Option<bool>,
}

/// The mapping form of `race:`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RaceSpec {
    /// The branches (at least two), each declaring the same outputs.
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub steps: Vec<Step>,
}

/// An ensemble: agent steps voting, and the rule that decides.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Ensemble {
    /// Two or more agent steps, asked the same question, voting independently.
    #[serde(default, deserialize_with = "lenient_vec")]
    #[schemars(with = "Vec<Step>")]
    pub agents: Vec<Step>,
    /// The vocabulary every member votes in, and where the block's decision routes.
    pub verdicts: Option<Vec<Verdict>>,
    /// `majority`, `unanimous`, `any`, or the name of a judge agent (required).
    pub decide: Option<String>,
    /// `fail` (default): a member that errs or does not vote fails the block;
    /// `exclude`: decide among the voters.
    #[schemars(extend("default" = "fail"))]
    pub member_errors: Option<String>,
}

/// What an approval step asks, and how long it waits.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// What the approver is asked (required).
    pub message: Option<String>,
    /// How long to wait (default 24h).
    #[schemars(extend("default" = "24h"))]
    pub timeout: Option<Duration>,
}

/// `to:` — the step the plan goes to by outcome.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Routes {
    /// The step to go to when this one succeeds (`next`: the following step).
    pub success: Option<String>,
    /// The step to go to when this one fails (not when it errors or is
    /// aborted); the route consumes the failure.
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

/// One call `assert.tool_calls` expects.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolCallAssert {
    /// The tool's name (required).
    pub name: Option<String>,
    /// Arguments the call must have carried, compared as strings (others are ignored; not a pinned one).
    pub args: Option<Map<String, Value>>,
}

/// `context:` — decisions of earlier steps a step reads.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContextSpec {
    /// Step name → `verdict`, `note` or `full`.
    pub from: Option<Map<String, Value>>,
}

/// One axis of an `across:` matrix.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcrossVar {
    /// The variable's name, written `{{ .vars.NAME }}`.
    pub var: Option<String>,
    /// Values for this axis (scalars, taken as strings).
    pub values: Option<Vec<Value>>,
    /// A JSON array of strings inside an artifact produced earlier (at most 1000 items, 1 MiB).
    pub from_file: Option<String>,
}

/// A spending ceiling.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// A ceiling in tokens, as the provider reports them (`total_tokens`).
    pub tokens: Option<i64>,
    /// A ceiling in US dollars (CLI agents only).
    pub usd: Option<f64>,
    /// across only: tokens held back for each in-flight cell (needs `max_in_flight` above 1).
    pub reserve_per_cell: Option<i64>,
}
