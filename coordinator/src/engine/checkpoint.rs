//! A run's progress through its plan, recorded after each top-level step:
//! where the walk goes next, the artifacts and `load_var` values it holds and
//! its execution log — what `--resume` and `--replay` start from.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use steppe_runtime::store::Store;

/// The event kind a checkpoint is kept as, among the run's events.
pub const KIND: &str = "checkpoint";

/// The state after one top-level step.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The plan index of the step that ended, and where the walk goes next.
    pub at: usize,
    pub next: usize,
    /// The execution log so far.
    pub log: Vec<String>,
    /// Every artifact the run holds: name → digest.
    pub artifacts: BTreeMap<String, String>,
    /// `load_var` values captured so far.
    pub vars: BTreeMap<String, String>,
    /// The first step-record number not used yet.
    #[serde(default)]
    pub seq: i64,
}

/// Where a run starts from another run's progress.
#[derive(Debug, Clone)]
pub struct Start {
    /// The run whose progress it continues.
    pub from_run: String,
    /// What it continues from; `None` starts at the plan's top (a replay
    /// from the first step).
    pub checkpoint: Option<Checkpoint>,
    /// Where the walk begins.
    pub next: usize,
    /// The steps said to be done already, and the word said of them.
    pub done: Vec<String>,
    pub word: &'static str,
    /// Taking over a run whose coordinator died: its start time, and the
    /// first step-record number it has not used (its id is the new run's).
    pub taken_over: Option<(i64, i64)>,
}

/// A run's checkpoints, oldest first.
pub fn checkpoints(store: &dyn Store, run_id: &str) -> Result<Vec<Checkpoint>, steppe_runtime::store::StoreError> {
    Ok(store.events(run_id)?.into_iter().filter(|e| e.kind == KIND).filter_map(|e| serde_json::from_str(&e.message).ok()).collect())
}

/// What a run asks to start from: `--resume ID`, or `--replay ID --from STEP`.
#[derive(Debug, Clone, PartialEq)]
pub enum StartFrom {
    Resume(String),
    Replay { run: String, from: String },
}

impl StartFrom {
    pub fn run_id(&self) -> &str {
        match self {
            StartFrom::Resume(r) | StartFrom::Replay { run: r, .. } => r,
        }
    }
}

/// Finds the earlier run and its progress: the job it ran (in the pipeline
/// as it is now) and where the new run starts. `team`: a coordinator's
/// caller may only continue its own team's runs.
pub fn resolve(store: &dyn Store, scope: &steppe_runtime::store::Scope, jobs: &[steppe_language::model::Job], from: &StartFrom) -> Result<(steppe_language::model::Job, Start), String> {
    let id = from.run_id();
    let run = store.run(id).map_err(|e| format!("reading run {id}: {e}"))?;
    let run = run.filter(|r| r.team == scope.team && r.pipeline == scope.pipeline).ok_or_else(|| format!("no run {id} of pipeline {} here (steppe runs lists them)", scope.pipeline))?;
    let job = jobs.iter().find(|j| j.name == run.job).cloned().ok_or_else(|| format!("run {id} ran job {}, which the pipeline no longer has", run.job))?;
    let cps = checkpoints(store, id).map_err(|e| format!("reading the progress of run {id}: {e}"))?;
    let name = |i: usize| job.plan.get(i).and_then(|s| s.name()).unwrap_or("step").to_string();
    match from {
        StartFrom::Resume(_) => {
            match run.outcome.as_deref() {
                Some("succeeded") => return Err(format!("run {id} succeeded: there is nothing to resume (run the job again, or --replay {id} --from STEP)")),
                None => return Err(format!("run {id} has not ended: resume it once it has (steppe cancel {id} stops it)")),
                Some(_) => {}
            }
            let last = cps.last().cloned();
            let done = cps.iter().map(|c| name(c.at)).collect();
            let next = last.as_ref().map_or(0, |c| c.next);
            Ok((job, Start { from_run: id.to_string(), checkpoint: last, next, done, word: "already succeeded", taken_over: None }))
        }
        StartFrom::Replay { from: step, .. } => {
            let names: Vec<String> = (0..job.plan.len()).map(name).collect();
            let at = names.iter().position(|n| n == step).ok_or_else(|| {
                format!("--from {step}: job {} has no top-level step of that name; its steps: {}{}", job.name, names.join(", "), steppe_language::suggest::did_you_mean(step, names.iter().map(String::as_str)))
            })?;
            if at == 0 {
                return Ok((job, Start { from_run: id.to_string(), checkpoint: None, next: 0, done: Vec::new(), word: "replayed", taken_over: None }));
            }
            let cp = cps.iter().rev().find(|c| c.next == at).cloned().ok_or_else(|| {
                let reached: Vec<String> = cps.iter().map(|c| name(c.at)).collect();
                format!(
                    "run {id} did not complete every step before {step} (it completed: {}); replay from a step after one it completed",
                    if reached.is_empty() { "none".to_string() } else { reached.join(", ") }
                )
            })?;
            let word = "from the replayed run";
            Ok((job, Start { from_run: id.to_string(), checkpoint: Some(cp), next: at, done: names[..at].to_vec(), word, taken_over: None }))
        }
    }
}

/// Taking over run `id` of a coordinator that died: the same run, from its
/// last checkpoint (the step it was in runs again), its records continued.
pub fn take_over(store: &dyn Store, run: &steppe_runtime::store::RunRecord) -> Result<Start, steppe_runtime::store::StoreError> {
    let cps = checkpoints(store, &run.id)?;
    let last = cps.last().cloned();
    // Records after the checkpoint are of the step that was running: it
    // runs again and writes over them.
    let seq = last.as_ref().map_or(0, |c| c.seq);
    let next = last.as_ref().map_or(0, |c| c.next);
    Ok(Start { from_run: run.id.clone(), checkpoint: last, next, done: Vec::new(), word: "", taken_over: Some((run.started_ms, seq)) })
}
