//! A run's state: the engine every run of a pipeline shares, one run of one
//! job (its artifacts, `load_var` values, decisions, usage, denials), and
//! what a step or a job ends with.


use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use steppe_runtime::artifacts::{ArtifactRef, ArtifactStore};
use steppe_language::model::{Inputs, Job, Pipeline, Step, TaskDef};
use steppe_runtime::outcome::{Class, StepError};
use steppe_language::vars::find_refs;
use crate::dispatch::Dispatcher;
use tokio::sync::watch;

use super::submission::Submission;


/// The most a `load_var:` step reads (its value is substituted into steps).
pub(super) const LOAD_VAR_CAP: u64 = 1 << 20;

/// The most text substituting `load_var` values may make of one field.
const SUBSTITUTED_CAP: usize = 16 << 20;

pub(super) type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Everything one process-wide engine shares between runs.
pub struct Engine {
    pub pipeline: Arc<Pipeline>,
    /// The pipeline's directory: resource checks run here.
    pub dir: PathBuf,
    /// The pipeline file, as the user named it (for the commands we print).
    /// What names this run's history in `steppe approve …` hints: the
    /// pipeline file, or `--coordinator URL` for a submitted run.
    pub decide_with: String,
    /// The worker pool this pipeline's steps go to ("": the default).
    pub pool: String,
    pub store: Arc<dyn ArtifactStore>,
    pub dispatcher: Arc<Dispatcher>,
    pub out: Arc<crate::event_hub::EventHub>,
    pub cancel: watch::Receiver<bool>,
    pub cancel_tx: Arc<watch::Sender<bool>>,
    /// `$STEPPE_MODEL`: the model of agents that name none.
    pub env_model: Option<String>,
    /// `steppe test --script`: every agent talks to this scripted model.
    pub scripted: Option<String>,
    /// The scenario's `fallback:` script: every agent's first fallback source.
    pub scripted_fallback: Option<String>,
    /// `--answer 'substring=answer'`: ask_user questions answered ahead.
    pub answers: Vec<(String, String)>,
    /// A pipeline submitted to a coordinator: its files there (resource
    /// checks run on workers in a snapshot of them).
    pub submission: Option<Arc<Submission>>,
    /// Where the engine's temporaries go (the process's scratch directory).
    pub scratch: PathBuf,
    /// Whose history its runs are: the team and the pipeline's name.
    pub scope: steppe_runtime::store::Scope,
    /// Where its steps with an image run.
    pub docker: super::docker::Docker,
    /// The submitter's span (W3C traceparent from its request): its runs'
    /// spans go under it.
    pub trace_parent: Option<String>,
    /// The variables holding the pipeline's secrets: every assignment asks
    /// its worker to mask their values (this process masks them already).
    pub masked_env: Vec<String>,
    /// Probe the models a job uses before its first step (off: `--no-preflight`).
    pub preflight: bool,
    /// `--force`: no chain is skipped (its success is still recorded).
    pub force: bool,
    /// `--pin k=v`: every get takes the oldest version holding these fields.
    pub pins: Vec<(String, String)>,
    /// `--version-history N` / `--run-history N` (`defaults:` wins; 0 keeps all).
    pub version_history: Option<u64>,
    pub run_history: Option<u64>,
    /// An ask_user question nobody can answer at once waits in the store for
    /// `steppe questions answer` (off under `steppe test`: nobody is there).
    pub park_questions: bool,
}

impl Engine {
    /// Ctrl-C: mark the run aborted and stop everything in flight.
    pub fn abort(&self) {
        let _ = self.cancel_tx.send(true);
        self.dispatcher.cancel_all();
    }

    /// Stops one run only (its client went away): this engine's runs see the
    /// abort flag, and only their own assignments are cancelled.
    pub fn abort_run(&self, run_id: &str) {
        let _ = self.cancel_tx.send(true);
        self.dispatcher.cancel_run(run_id);
    }
}

/// What running one step produced.
#[derive(Debug, Clone)]
pub struct Done {
    /// The outcome after `try:` tolerance and hooks.
    pub result: Result<(), StepError>,
    /// The outcome routing sees (before `try:` tolerance).
    pub routed: Result<(), StepError>,
    /// Execution-log entries, in order.
    pub log: Vec<String>,
    /// Skipped by its `when:` guard: no outcome at all.
    pub skipped: bool,
    /// Outputs the step produced (registered by the caller).
    pub outputs: Vec<(String, ArtifactRef)>,
    /// What an agent step's conversation produced.
    pub agent: Option<steppe_runtime::agent_work::AgentOutcome>,
}

impl Done {
    pub(super) fn ok(log: Vec<String>) -> Self {
        Done { result: Ok(()), routed: Ok(()), log, skipped: false, outputs: Vec::new(), agent: None }
    }
    pub(super) fn err(e: StepError, log: Vec<String>) -> Self {
        Done { result: Err(e.clone()), routed: Err(e), log, skipped: false, outputs: Vec::new(), agent: None }
    }
    pub(super) fn skipped() -> Self {
        Done { result: Ok(()), routed: Ok(()), log: Vec::new(), skipped: true, outputs: Vec::new(), agent: None }
    }
}

/// The result of one job run.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub result: Result<(), StepError>,
    /// The build itself (plan and job hooks) succeeded, whatever the job assert
    /// made of it: only then do its fetched versions count for `passed:`.
    pub build_ok: bool,
    /// The execution log: what `assert.execution` compares against.
    pub log: Vec<String>,
}

/// One run of one job.
pub struct JobRun {
    pub(super) engine: Arc<Engine>,
    pub(super) job: Job,
    pub(super) run_id: String,
    pub(super) artifacts: Mutex<HashMap<String, ArtifactRef>>,
    /// Values captured by `load_var:` steps.
    pub(super) vars: Mutex<HashMap<String, String>>,
    /// Versions pinned for this input set by an `every` get.
    pub(super) every: Mutex<HashMap<String, Value>>,
    /// Order of step records in the store.
    pub(super) seq: std::sync::atomic::AtomicI64,
    /// (resource, version) fetched by this run: recorded green for `passed:` when it succeeds.
    pub(super) fetched: Mutex<Vec<(String, Value)>>,
    /// What agent steps with verdicts decided, by step name (for `context.from`).
    pub(super) decisions: Mutex<HashMap<String, Decision>>,
    /// Tokens each agent conversation spent, in the order they ended.
    pub(super) usage: Mutex<Vec<(String, u64)>>,
    /// Tool calls the sandbox refused: (step, denial).
    pub(super) denials: Mutex<Vec<(String, steppe_runtime::agent_work::DenialRecord)>>,
    /// The spending counter of each budgeted across, by the step's address.
    pub(super) across_counters: Mutex<HashMap<usize, String>>,
    /// Each resource's versions, checked once per run.
    pub(super) checked: Mutex<HashMap<String, Result<Vec<Value>, StepError>>>,
    /// The plan's chains, as planned before the walk.
    pub(super) chains: Mutex<Vec<super::chain::Chain>>,
    /// `--resume`/`--replay`: the earlier run's progress it starts from.
    pub(super) start: Option<super::checkpoint::Start>,
}

/// Several failures as one: the most severe class, the messages joined.
pub(super) fn combined(errors: &[StepError], prefix: &str) -> StepError {
    let msg = errors.iter().map(|e| e.message.clone()).collect::<Vec<_>>().join("; ");
    StepError { class: classify_all(errors), message: format!("{prefix}{msg}"), timed_out: false }
}

pub(super) fn classify_all(errors: &[StepError]) -> Class {
    if errors.iter().any(|e| e.class == Class::Aborted) {
        Class::Aborted
    } else if errors.iter().any(|e| e.class == Class::Errored) {
        Class::Errored
    } else {
        Class::Failed
    }
}

impl JobRun {
    pub fn new(engine: Arc<Engine>, job: Job, run_id: String) -> Arc<Self> {
        Self::starting(engine, job, run_id, None)
    }

    /// A run that continues another's progress (`--resume`, `--replay`).
    pub fn starting(engine: Arc<Engine>, job: Job, run_id: String, start: Option<super::checkpoint::Start>) -> Arc<Self> {
        Arc::new(JobRun {
            engine,
            job,
            run_id,
            artifacts: Mutex::new(HashMap::new()),
            vars: Mutex::new(HashMap::new()),
            every: Mutex::new(HashMap::new()),
            seq: std::sync::atomic::AtomicI64::new(start.as_ref().and_then(|s| s.taken_over).map_or(0, |(_, seq)| seq)),
            fetched: Mutex::new(Vec::new()),
            decisions: Mutex::new(HashMap::new()),
            usage: Mutex::new(Vec::new()),
            denials: Mutex::new(Vec::new()),
            across_counters: Mutex::default(),
            checked: Mutex::default(),
            chains: Mutex::default(),
            start,
        })
    }

    pub(super) fn aborted(&self) -> bool {
        *self.engine.cancel.borrow()
    }

    pub(super) fn artifact(&self, name: &str) -> Option<ArtifactRef> {
        self.artifacts.lock().ok()?.get(name).cloned()
    }

    pub(super) fn register(&self, outputs: &[(String, ArtifactRef)]) {
        if let Ok(mut a) = self.artifacts.lock() {
            for (n, r) in outputs {
                a.insert(n.clone(), r.clone());
            }
        }
    }

    /// Replaces `((name))` captured by earlier `load_var:` steps.
    pub(super) fn subst(&self, text: &str) -> Result<String, String> {
        if find_refs(text).is_empty() {
            return Ok(text.to_string());
        }
        let vars = match self.vars.lock() {
            Ok(v) => v.clone(),
            Err(_) => return Ok(text.to_string()),
        };
        if vars.is_empty() {
            return Ok(text.to_string());
        }
        let map = vars.into_iter().collect();
        steppe_language::vars::substitute_within(text, &map, SUBSTITUTED_CAP)
    }

    pub(super) fn subst_value(&self, v: &Value) -> Result<Value, String> {
        Ok(match v {
            Value::String(s) => Value::String(self.subst(s)?),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.subst_value(x)).collect::<Result<_, _>>()?),
            Value::Object(o) => Value::Object(o.iter().map(|(k, x)| Ok((k.clone(), self.subst_value(x)?))).collect::<Result<_, String>>()?),
            other => other.clone(),
        })
    }

    pub(super) fn entry(&self, s: &Step) -> Option<&TaskDef> {
        if s.run.is_some() {
            return None;
        }
        let name = s.task.as_deref()?;
        self.engine.pipeline.tasks.iter().find(|t| t.name == name)
    }

    pub(super) fn step_inputs(&self, s: &Step) -> Vec<String> {
        match &s.inputs {
            Some(Inputs::Names(n)) => n.clone(),
            Some(Inputs::All) => self.artifacts.lock().map(|a| a.keys().cloned().collect()).unwrap_or_default(),
            _ => self.entry(s).and_then(|e| e.inputs.clone()).unwrap_or_default(),
        }
    }

    /// Input names → stored artifacts (mapped names read their plan artifact).
    /// Inputs nothing produced (a skipped or tolerated producer) are just absent.
    pub(super) fn input_refs(&self, names: &[String], mapping: Option<&serde_json::Map<String, Value>>) -> Vec<(String, ArtifactRef)> {
        names
            .iter()
            .filter_map(|n| {
                let source = mapping.and_then(|m| m.get(n)).and_then(Value::as_str).unwrap_or(n);
                self.artifact(source).map(|r| (n.clone(), r))
            })
            .collect()
    }

}

#[derive(Debug, Clone)]
/// What an agent step with verdicts decided, for the steps that read it.
pub(crate) struct Decision {
    pub(super) verdict: String,
    pub(super) note: Option<String>,
    pub(super) response: String,
}
