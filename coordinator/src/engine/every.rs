//! `version: every` (pipeline-language.md §5.3): the versions a job has not
//! taken yet, as input sets that advance in lockstep — every `every` get one
//! new version per set, one with no more holding its last — and one build of
//! the rest of the plan per set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use steppe_language::model::Step;
use steppe_runtime::outcome::StepError;

use super::chain::{is_every, Chain, InputSet};
use super::run::*;

/// Why there is no input set to build (the job ends without error).
pub struct NoSets(pub String);

impl JobRun {
    /// The `every` gets of the plan from `at` on, by resource, once each.
    fn every_resources(&self, at: usize) -> Vec<String> {
        let pinned = !self.engine.pins.is_empty();
        let mut out: Vec<String> = Vec::new();
        for s in self.job.plan.iter().skip(at).filter(|s| is_every(s, pinned)) {
            let r = s.resource.clone().or(s.get.clone()).unwrap_or_default();
            if !out.contains(&r) {
                out.push(r);
            }
        }
        out
    }

    /// The input sets of the `every` get at plan index `at`: versions past
    /// each resource's cursor (every version in history under `--force`).
    pub(super) async fn input_sets(self: &Arc<Self>, at: usize) -> Result<Result<Vec<InputSet>, NoSets>, StepError> {
        let store = self.engine.out.store().cloned();
        let mut columns: Vec<(String, Vec<Value>, Option<Value>)> = Vec::new();
        for r in self.every_resources(at) {
            let history = self.versions(&r).await?;
            if history.is_empty() {
                return Ok(Err(NoSets(format!("get {r}: cannot build; no versions exist for: {r}"))));
            }
            let taken = store.as_ref().map(|s| s.taken(&self.engine.scope, &self.job.name, &r).unwrap_or_default()).unwrap_or_default();
            // The cursor: the newest taken version in discovery order.
            let cursor = history.iter().rposition(|v| taken.contains(v));
            let fresh: Vec<Value> = match cursor {
                Some(c) if !self.engine.force => history[c + 1..].to_vec(),
                _ => history.clone(),
            };
            let covered = cursor.map(|c| history[c].clone()).or_else(|| history.last().cloned());
            columns.push((r, fresh, covered));
        }
        let n = columns.iter().map(|(_, f, _)| f.len()).max().unwrap_or(0);
        if n == 0 {
            let (r, _, _) = &columns[0];
            let all = self.versions(r).await.map(|h| h.len()).unwrap_or(0);
            return Ok(Err(NoSets(format!("get {r}: has no new versions; all {all} already taken"))));
        }
        Ok(Ok((0..n)
            .map(|k| {
                columns
                    .iter()
                    .map(|(r, fresh, covered)| {
                        // An exhausted resource holds: its last new version, else the newest it covered.
                        let v = fresh.get(k).or(fresh.last()).or(covered.as_ref()).cloned().unwrap_or(Value::Null);
                        (r.clone(), v)
                    })
                    .collect()
            })
            .collect()))
    }

    /// Binds an input set's versions: the gets of its resources fetch them.
    pub(super) fn bind(&self, set: &InputSet) {
        if let Ok(mut e) = self.every.lock() {
            for (r, v) in set {
                e.insert(r.clone(), v.clone());
            }
        }
    }

    /// Marks a set's versions taken by this job: its build has started.
    fn take(&self, set: &InputSet) {
        let Some(store) = self.engine.out.store() else { return };
        for (r, v) in set {
            if let Err(e) = store.record_taken(&self.engine.scope, &self.job.name, r, v) {
                self.engine.out.run_note(&self.run_id, &format!("steppe: recording {r}'s version as taken: {e}"));
            }
        }
    }

    /// The `every` get at plan index `i`: one build of the rest of the plan
    /// per input set, each from the artifacts the run had before it; a
    /// failing set does not stop the later ones.
    pub(super) async fn every_get(self: &Arc<Self>, s: &Step, i: usize, job_timeout: Option<Duration>, started: Instant, mut log: Vec<String>) -> (Result<(), StepError>, Vec<String>) {
        let sets = match self.input_sets(i).await {
            Ok(Ok(sets)) => sets,
            Ok(Err(NoSets(why))) => {
                self.engine.out.run_note(&self.run_id, &why);
                return (Ok(()), log);
            }
            Err(e) => return (Err(e), log),
        };
        let snapshot = self.artifacts.lock().map(|a| a.clone()).unwrap_or_default();
        let chains = self.chains.lock().map(|c| c.clone()).unwrap_or_default();
        let mut errors = Vec::new();
        for set in sets {
            self.take(&set);
            let chain = chains.iter().find(|c| c.set.as_ref() == Some(&set));
            if let Some(c) = chain.filter(|c| c.skippable() && !self.engine.force) {
                self.skip_set(c, i);
                continue;
            }
            if let Ok(mut a) = self.artifacts.lock() {
                *a = snapshot.clone();
            }
            self.bind(&set);
            let d = self.step(s, Vec::new(), false).await;
            log.extend(d.log);
            if let Err(e) = d.result {
                errors.push(e);
                continue;
            }
            let (r, l) = self.walk_plan(i + 1, job_timeout, started, None).await;
            log.extend(l);
            match r {
                Err(e) => errors.push(e),
                Ok(()) => {
                    if let Some(leaf) = chain.and_then(Chain::cacheable_leaf) {
                        self.record_chain(leaf);
                    }
                }
            }
        }
        if let Ok(mut e) = self.every.lock() {
            e.clear();
        }
        if errors.is_empty() {
            (Ok(()), log)
        } else {
            (Err(combined(&errors, "")), log)
        }
    }
}
