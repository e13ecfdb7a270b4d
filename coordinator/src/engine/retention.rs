//! History caps (pipeline-language.md §5.4, §6): a resource keeps its newest
//! `version_history` versions (never one its check still reports), a job
//! its newest `run_history` runs; `defaults:` wins over the flags.

use serde_json::Value;
use steppe_runtime::store::RunFilter;

use super::run::*;

const VERSIONS: u64 = 1000;
const RUNS: u64 = 100;

impl JobRun {
    fn cap(&self, from_pipeline: Option<i64>, from_flag: Option<u64>, default: u64) -> Option<usize> {
        let n = from_pipeline.map(|n| n.max(0) as u64).or(from_flag).unwrap_or(default);
        (n > 0).then_some(n as usize)
    }

    /// Drops the oldest versions of `resource` past its cap, but none the
    /// check just reported; their `passed:` records go with them.
    pub(super) fn cap_versions(&self, resource: &str, reported: &[Value]) {
        let Some(store) = self.engine.out.store() else { return };
        let Some(cap) = self.cap(self.engine.pipeline.defaults.as_ref().and_then(|d| d.version_history), self.engine.version_history, VERSIONS) else { return };
        let Ok(history) = store.history(&self.engine.scope, resource) else { return };
        if history.len() <= cap {
            return;
        }
        let old: Vec<Value> = history[..history.len() - cap].iter().filter(|v| !reported.contains(v)).cloned().collect();
        if old.is_empty() {
            return;
        }
        let jobs: Vec<String> = self.engine.pipeline.jobs.iter().map(|j| j.name.clone()).collect();
        if let Err(e) = store.forget_versions(&self.engine.scope, resource, &old, &jobs) {
            self.engine.out.run_note(&self.run_id, &format!("steppe: dropping old versions of {resource}: {e}"));
        }
    }

    /// Removes this job's finished runs past its cap, oldest first.
    pub(super) fn cap_runs(&self) {
        let Some(store) = self.engine.out.store() else { return };
        let Some(cap) = self.cap(self.engine.pipeline.defaults.as_ref().and_then(|d| d.run_history), self.engine.run_history, RUNS) else { return };
        // Only the runs past the cap are read (at most 64 a run: a job whose
        // history was capped lower since loses the rest over its next runs).
        let filter = RunFilter { team: Some(&self.engine.scope.team), pipeline: Some(&self.engine.scope.pipeline), job: Some(&self.job.name), skip: cap, limit: 64 };
        let Ok(runs) = store.runs(&filter) else { return };
        for r in runs.iter().filter(|r| r.outcome.is_some() && r.id != self.run_id) {
            if let Err(e) = store.delete_run(r) {
                self.engine.out.run_note(&self.run_id, &format!("steppe: removing run {} past run_history: {e}", r.id));
                return;
            }
        }
    }
}
