//! The unit of work a coordinator hands a worker, and what comes back.
//! (Across processes they are `steppe.v1.Assignment` and `AssignmentResult`:
//! wire/assignment.rs.)

use std::path::PathBuf;

use std::time::Duration;

use crate::agent_work::{AgentOutcome, AgentWork};
use crate::artifacts::ArtifactRef;
use crate::outcome::StepError;

/// Where the command runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Cwd {
    /// A fresh directory holding the inputs and an empty directory per output.
    StepDir,
    /// A fresh empty directory that is itself captured as output `"."` (a get's `in`).
    CaptureSelf,
    /// An existing host directory (a resource `check` in embedded mode, in
    /// the pipeline's own directory). Only ever run in the coordinator's
    /// own process: a remote worker refuses it.
    Host(PathBuf),
    /// A fresh directory holding a stored tree, the command running in
    /// `dir` inside it: a resource `check` of a submitted pipeline, run on a
    /// worker in a copy of the submission (never on the coordinator's host).
    Snapshot { tree: ArtifactRef, dir: String },
}

/// How success is judged: by exit code 0, or (when any field is set) by the
/// step's assert, which then takes over completely.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Judge {
    pub stdout: Option<String>,
    pub code: Option<i64>,
    pub files: Vec<String>,
}

impl Judge {
    pub fn is_assert(&self) -> bool {
        self.stdout.is_some() || self.code.is_some() || !self.files.is_empty()
    }
}

#[derive(Debug, Clone)]
pub struct Assignment {
    /// Unique per dispatch; results are matched to it.
    pub id: String,
    pub run_id: String,
    /// The step's label; output lines are prefixed with it.
    pub step: String,
    pub attempt: u32,
    /// The worker pool it waits for ("" or "default": the default pool).
    pub pool: String,
    /// Raised each time the coordinator hands the assignment out again (a
    /// requeue); a result carrying an older epoch is refused (fencing).
    pub epoch: u32,
    /// Run with `sh -c`.
    pub command: String,
    /// When set, `command` is a template rendered with this data by the
    /// worker that runs it (a resource stage's: `{source, version, params}`),
    /// so a hostile template costs a worker, not the coordinator.
    pub template: Option<serde_json::Value>,
    /// Declared environment variable names passed through from the host.
    pub env: Vec<String>,
    pub cwd: Cwd,
    pub inputs: Vec<(String, ArtifactRef)>,
    pub outputs: Vec<String>,
    pub timeout: Option<Duration>,
    pub judge: Judge,
    pub image: Option<String>,
    /// Echo output lines live (resource checks stay quiet).
    pub stream: bool,
    /// An agent conversation instead of a command.
    pub agent: Option<Box<AgentWork>>,
    /// A task's `fix:` agent, run in the task's directory when it fails.
    pub fix: Option<Box<AgentWork>>,
    /// A stand-in for an assignment too large for its queue's messages: only
    /// id, run, step, pool and epoch; the whole comes from the coordinator.
    pub by_reference: bool,
    /// How its container runs (with `image`).
    pub container: ContainerSettings,
    /// W3C traceparent of the span that dispatched it (its attempt);
    /// empty: not traced.
    pub trace_parent: String,
    /// When it was handed to the queue (Unix ns; 0: unknown).
    pub enqueued_unix_ns: u64,
    /// Variables whose values the worker masks as `***` in everything it
    /// writes or sends (the run's API keys and bearer tokens).
    pub masked_env: Vec<String>,
    /// A resource stage served by an MCP tool (then there is no command).
    pub mcp: Option<Box<McpStage>>,
    /// The coordinator process that queued it (its incarnation; "": not said).
    pub pushed_by: String,
    /// Set by the queue that delivered it, never sent: no one took this entry
    /// before (not one come back after another taker's lease ran out).
    pub first_delivery: bool,
}

pub use crate::agent_work::ContainerSettings;

/// A resource stage served by an MCP tool: the worker reaches the server,
/// calls the tool and answers as a shell stage would.
#[derive(Debug, Clone, PartialEq)]
pub struct McpStage {
    pub server: crate::agent_work::McpServerWork,
    /// `check`, `in` or `out`.
    pub stage: String,
    pub tool: String,
    /// The arguments, rendered (a JSON object).
    pub args: serde_json::Value,
    /// `in`: the version fetched (written as `version.json`).
    pub version: serde_json::Value,
}

impl Assignment {
    /// Whether running it needs a Docker engine: a command in an image, or
    /// an agent (or one it delegates to) whose tools run in one.
    pub fn uses_containers(&self) -> bool {
        self.image.is_some() || self.agent.as_deref().is_some_and(AgentWork::uses_containers)
    }

    /// A command in a fresh step directory, judged by exit code, output streamed;
    /// callers set what differs with struct update syntax.
    pub fn command(run_id: &str, step: &str, command: String) -> Self {
        Assignment {
            id: String::new(),
            run_id: run_id.to_string(),
            step: step.to_string(),
            attempt: 1,
            epoch: 0,
            pool: String::new(),
            command,
            template: None,
            env: Vec::new(),
            cwd: Cwd::StepDir,
            inputs: Vec::new(),
            outputs: Vec::new(),
            timeout: None,
            judge: Judge::default(),
            image: None,
            stream: true,
            agent: None,
            fix: None,
            by_reference: false,
            container: ContainerSettings::default(),
            trace_parent: String::new(),
            enqueued_unix_ns: 0,
            masked_env: Vec::new(),
            mcp: None,
            pushed_by: String::new(),
            first_delivery: false,
        }
    }

    /// What travels on a queue in place of this assignment when it is too
    /// large for the queue's messages.
    pub fn stand_in(&self) -> Self {
        Assignment { id: self.id.clone(), attempt: self.attempt, epoch: self.epoch, pool: self.pool.clone(), by_reference: true, ..Assignment::command(&self.run_id, &self.step, String::new()) }
    }
}

/// One line a step wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputLine {
    pub stderr: bool,
    pub line: String,
}

/// A step's output as the store keeps it: its first and last lines (at
/// most [`OutputRecord::HEAD`] and [`OutputRecord::TAIL`]), and where the
/// rest is, whatever the step printed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputRecord {
    pub head: Vec<OutputLine>,
    pub tail: Vec<OutputLine>,
    /// Lines between head and tail, not in the record, and their bytes.
    pub omitted_lines: u64,
    pub omitted_bytes: u64,
    /// The whole output (its `output.log`: a line per line, `o ` or `e `
    /// before each), stored when anything was omitted.
    pub full: Option<ArtifactRef>,
}

impl OutputRecord {
    /// Lines kept from the start of a step's output, and from its end.
    pub const HEAD: usize = 500;
    pub const TAIL: usize = 500;
    /// The most bytes of one line the record keeps.
    pub const LINE: usize = 8 << 10;
}

#[derive(Debug, Clone)]
pub struct AssignmentResult {
    pub assignment_id: String,
    /// The epoch of the assignment this result answers.
    pub epoch: u32,
    pub exit_code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Captured outputs (only when the step passed).
    pub outputs: Vec<(String, ArtifactRef)>,
    pub result: Result<(), StepError>,
    pub agent: Option<AgentOutcome>,
    /// What the step wrote, as the store keeps it.
    pub output: OutputRecord,
    /// The worker's spans of it (for the run's store).
    pub spans: Vec<crate::trace::SpanRecord>,
}

impl AssignmentResult {
    /// A result for `a` with nothing captured (it did not get to run, or
    /// its outcome was decided before it did).
    pub fn of(a: &Assignment, result: Result<(), StepError>) -> Self {
        AssignmentResult::with_id(&a.id, a.epoch, result)
    }

    pub fn with_id(id: &str, epoch: u32, result: Result<(), StepError>) -> Self {
        AssignmentResult {
            assignment_id: id.to_string(),
            epoch,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            outputs: Vec::new(),
            result,
            agent: None,
            output: OutputRecord::default(),
            spans: Vec::new(),
        }
    }
}
