//! The plan walk: a job's top-level steps in order, routing (`to:`, verdicts)
//! within a segment, `every` gets fanning the rest out per version, the job's
//! hooks and its assert.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use steppe_language::model::Step;
use steppe_runtime::outcome::{Class, Outcome, StepError};

use super::run::*;
use super::record::group;
use super::chain::{is_every, Chain};

impl JobRun {
    /// Runs the job: plan (with routing), job hooks, job assert.
    pub async fn run(self: &Arc<Self>) -> JobResult {
        let now_ms = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let started_ms = self.start.as_ref().and_then(|s| s.taken_over).map_or_else(now_ms, |(t, _)| t);
        let rec = self.record(started_ms);
        self.engine.out.run_began(&self.run_id, &rec.pipeline, &rec.job);
        if let Some(s) = self.engine.out.store() {
            if let Err(e) = s.start_run(&self.record(started_ms)) {
                self.engine.out.run_note(&self.run_id, &format!("steppe: recording the run: {e}"));
            }
        }
        // The job's runs past its cap go while this one runs (this one is
        // among the newest already): deleting a large run takes tens of ms.
        let capping = self.engine.out.store().is_some().then(|| {
            let me = self.clone();
            tokio::task::spawn_blocking(move || me.cap_runs())
        });
        let spans = self.run_spans();
        let r = opentelemetry::context::FutureExt::with_context(self.run_inner(), spans.1.clone()).await;
        let usage = self.usage.lock().map(|u| u.clone()).unwrap_or_default();
        if !usage.is_empty() {
            let total: u64 = usage.iter().map(|(_, t)| t).sum();
            self.engine.out.run_note(&self.run_id, &format!("usage: {} tokens across {} agent step(s)", group(total), usage.len()));
            for (name, t) in &usage {
                self.engine.out.run_note(&self.run_id, &format!("  {name:<16} {}", group(*t)));
            }
        }
        let denials = self.denials.lock().map(|d| d.clone()).unwrap_or_default();
        if !denials.is_empty() {
            self.engine.out.run_note(&self.run_id, &format!("sandbox: {} tool call(s) refused:", denials.len()));
            for (step, d) in &denials {
                self.engine.out.run_note(&self.run_id, &format!("  {step}: {} {} — {}", d.tool, d.path, d.reason));
            }
        }
        self.end_run_spans(spans, Outcome::of(&r.result).word(), &r.result);
        self.engine.out.flush().await;
        if let (Some(s), true) = (self.engine.out.store(), r.build_ok) {
            for (res, v) in self.fetched.lock().map(|f| f.clone()).unwrap_or_default() {
                if let Err(e) = s.record_green(&self.engine.scope, &self.job.name, &res, &v) {
                    self.engine.out.run_note(&self.run_id, &format!("steppe: recording {res} as passed: {e}"));
                }
            }
        }
        if let (Some(s), Ok(())) = (self.engine.out.store(), &r.result) {
            // Any success, triggered or not, clears the job's breaker.
            let b = crate::watch::queue::breaker(s.as_ref(), &self.engine.scope, &self.job.name);
            if b != crate::watch::queue::Breaker::default() {
                let _ = crate::watch::queue::set_breaker(s.as_ref(), &self.engine.scope, &self.job.name, &Default::default());
            }
        }
        if let Some(s) = self.engine.out.store() {
            let (word, msg) = match &r.result {
                Ok(()) => ("succeeded", String::new()),
                Err(e) => (Outcome::of(&r.result).word(), e.message.clone()),
            };
            let rec = steppe_runtime::store::RunRecord { finished_ms: Some(now_ms()), outcome: Some(word.to_string()), message: msg, ..self.record(started_ms) };
            if let Err(e) = s.finish_run(&rec) {
                self.engine.out.run_note(&self.run_id, &format!("steppe: recording the run: {e}"));
            }
            if let Some(c) = capping {
                let _ = c.await;
            }
        }
        self.engine.out.run_ended(&self.run_id, Outcome::of(&r.result).word());
        r
    }

    /// This run's record as it starts.
    fn record(&self, started_ms: i64) -> steppe_runtime::store::RunRecord {
        let scope = &self.engine.scope;
        steppe_runtime::store::RunRecord {
            id: self.run_id.clone(),
            team: scope.team.clone(),
            pipeline: scope.pipeline.clone(),
            job: self.job.name.clone(),
            started_ms,
            finished_ms: None,
            outcome: None,
            message: String::new(),
            owner: steppe_runtime::store::this_owner().to_string(),
        }
    }

    pub(super) async fn run_inner(self: &Arc<Self>) -> JobResult {
        if let Err(e) = self.containers_ready().await {
            return JobResult { result: Err(e), build_ok: false, log: Vec::new() };
        }
        if let Err(e) = self.preflight().await {
            return JobResult { result: Err(e), build_ok: false, log: Vec::new() };
        }
        let job_timeout = self.job.timeout.and_then(|t| t.to_std());
        let started = Instant::now();
        // A resumed or replayed run neither skips nor records chains.
        let chains = if self.start.is_some() { Vec::new() } else { self.plan_chains().await };
        if !self.engine.force {
            if let Some((step, why)) = chains.iter().find_map(|c| c.uncacheable.clone()) {
                self.engine.out.run_note(&self.run_id, &format!("note: {step} makes this chain uncacheable ({why})"));
            }
        }
        let skip_all = !self.engine.force && !chains.is_empty() && chains.iter().all(Chain::skippable);
        let single = chains.len() == 1 && chains[0].set.is_none();
        if let Ok(mut c) = self.chains.lock() {
            *c = chains.clone();
        }
        let (mut result, mut log) = if let Some(st) = &self.start {
            if st.taken_over.is_some() {
                self.engine.out.run_note(&self.run_id, "continuing the run where it was when its coordinator stopped");
            } else {
                self.engine.out.run_note(&self.run_id, &format!("continuing run {}", st.from_run));
            }
            if let Some(cp) = &st.checkpoint {
                self.restore(cp);
            }
            // The job's budget goes on from what the run it continues spent.
            if st.taken_over.is_none() {
                let ledger = &self.engine.dispatcher.ledger;
                let spent = ledger.spend(&steppe_runtime::budget::job_counter(&st.from_run), 0).await.unwrap_or(0);
                if spent > 0 {
                    let _ = ledger.spend(&steppe_runtime::budget::job_counter(&self.run_id), spent).await;
                }
            }
            for name in &st.done {
                self.engine.out.run_note(&self.run_id, &format!("skip: {name} ({})", st.word));
            }
            // The steps it continues count as this run's.
            let carried = if st.done.is_empty() && st.taken_over.is_none() { Vec::new() } else { st.checkpoint.as_ref().map(|c| c.log.clone()).unwrap_or_default() };
            self.walk_plan(st.next, job_timeout, started, Some(carried)).await
        } else if skip_all {
            self.skip_chains(&chains);
            (Ok(()), Vec::new())
        } else {
            self.walk_plan(0, job_timeout, started, Some(Vec::new())).await
        };
        // Job hooks.
        let outcome = Outcome::of(&result);
        let hooks = self.job.hooks();
        let pick: Vec<&Step> = hooks
            .iter()
            .filter(|(k, _)| *k == outcome.hook() || *k == "ensure")
            .map(|(_, s)| *s)
            .collect();
        for h in pick {
            let d = self.step(h, Vec::new(), true).await;
            log.extend(d.log);
            if let Err(e) = d.result {
                if result.is_ok() {
                    result = Err(StepError::failed(format!("job hook: {}", e.message)));
                } else {
                    self.engine.out.run_note(&self.run_id, &format!("job hook failed: {}", e.message));
                }
            }
        }
        let build_ok = result.is_ok();
        if build_ok && single && !skip_all {
            if let Some(leaf) = chains[0].cacheable_leaf() {
                self.record_chain(leaf);
            }
        }
        // Job assert.
        if let Some(a) = &self.job.assert {
            if let Some(want) = &a.execution {
                if want != &log {
                    let mismatch = format!("assert.execution mismatch\n  want: [{}]\n  got:  [{}]", want.join(", "), log.join(", "));
                    // The cause first: the step that failed, then what the assert made of it.
                    let message = match &result {
                        Err(cause) => format!("{}\n{mismatch}", cause.message),
                        Ok(()) => mismatch,
                    };
                    return JobResult { result: Err(StepError::failed(message)), build_ok, log };
                }
                if a.outcome.as_deref() != Some("succeeded") {
                    result = Ok(());
                }
            }
            match a.outcome.as_deref() {
                Some("failed") => {
                    result = match result {
                        Err(_) => Ok(()),
                        Ok(()) if a.execution.is_some() => Ok(()),
                        Ok(()) => Err(StepError::failed("assert.outcome: want failed, got succeeded")),
                    };
                }
                Some("succeeded") => {
                    if let Err(e) = &result {
                        result = Err(e.with_message(format!("assert.outcome: want succeeded, got {}: {}", Outcome::of(&result).word(), e.message)));
                    }
                }
                _ => {}
            }
        }
        JobResult { result, build_ok, log }
    }

    /// Walks the top-level plan from `start`, following routes. `carried`:
    /// the run's own walk (not an input set's), with the execution log it
    /// carries in; its progress is recorded after each step.
    pub(super) fn walk_plan(self: &Arc<Self>, start: usize, job_timeout: Option<Duration>, started: Instant, carried: Option<Vec<String>>) -> BoxFut<'_, (Result<(), StepError>, Vec<String>)> {
        Box::pin(async move {
            let plan = &self.job.plan;
            let outer = carried.is_some();
            let mut log = carried.unwrap_or_default();
            let mut visits: HashMap<usize, i64> = HashMap::new();
            let mut i = start;
            while i < plan.len() {
                if self.aborted() {
                    return (Err(StepError::aborted("aborted")), log);
                }
                if let Some(t) = job_timeout {
                    if started.elapsed() > t {
                        return (Err(StepError::timed_out(format!("job \"{}\" timed out", self.job.name))), log);
                    }
                }
                let s = &plan[i];
                // An `every` get fans the rest of the plan out per version.
                if is_every(s, !self.engine.pins.is_empty()) && !self.bound(s) {
                    return self.every_get(s, i, job_timeout, started, log).await;
                }
                let v = visits.entry(i).or_insert(0);
                *v += 1;
                if let Some(max) = s.max_visits {
                    if *v > max {
                        let name = s.name().unwrap_or("step");
                        return (Err(StepError::failed(format!("{name}: max_visits {max} exceeded"))), log);
                    }
                }
                let d = self.step(s, Vec::new(), false).await;
                log.extend(d.log.clone());
                let next = if d.skipped {
                    i + 1
                } else {
                    match self.route(i, s, &d) {
                        Some(Route::Next) => i + 1,
                        Some(Route::To(j)) => j,
                        None => {
                            if let Err(e) = d.result {
                                return (Err(e), log);
                            }
                            i + 1
                        }
                    }
                };
                if outer {
                    self.checkpoint(i, next, &log).await;
                }
                i = next;
            }
            (Ok(()), log)
        })
    }

    /// Where a finished top-level step sends the plan, if it routes: by its
    /// verdict when it declares verdicts, else by `to:` on success/failure.
    pub(super) fn route(&self, i: usize, s: &Step, d: &Done) -> Option<Route> {
        let failed = matches!(&d.routed, Err(e) if e.class == Class::Failed);
        if d.routed.as_ref().is_err_and(|e| e.class != Class::Failed) {
            return None;
        }
        let verdicts = s
            .verdicts
            .as_ref()
            .or(s.ensemble.as_ref().and_then(|e| e.verdicts.as_ref()))
            .or(s.try_.as_ref().and_then(|t| t.verdicts.as_ref()));
        let target = match verdicts {
            Some(vs) => {
                let key = if failed { Some("failure".to_string()) } else { d.agent.as_ref().and_then(|o| o.verdict.clone()) };
                let key = key?;
                vs.iter().find(|v| v.name == key).and_then(|v| v.target.clone())
            }
            None => match &s.to {
                Some(to) => if failed { to.failure.clone() } else { to.success.clone() },
                None => None,
            },
        }?;
        if target == "next" {
            return Some(Route::Next);
        }
        // Targets resolve within the segment: the steps between gets.
        let plan = &self.job.plan;
        let lo = plan[..i].iter().rposition(|s| s.get.is_some()).map_or(0, |g| g + 1);
        let hi = plan[i..].iter().position(|s| s.get.is_some()).map_or(plan.len(), |g| i + g);
        (lo..hi).find(|&j| plan[j].name() == Some(target.as_str())).map(Route::To)
    }
}

impl JobRun {
    /// A chain a run succeeded through before: its first step says so, the
    /// rest of the plan is skipped with it.
    fn skip_chains(&self, chains: &[Chain]) {
        let Some(first) = chains.first() else { return };
        let prefix = first.shared();
        for (n, node) in first.nodes.iter().take(prefix).enumerate() {
            self.say_skip(node, n == 0);
        }
        for c in chains.iter().filter(|c| c.set.is_some()) {
            self.skip_set(c, prefix);
        }
    }

    /// One input set of an `every` get (at plan index `at`) skipped.
    pub(super) fn skip_set(&self, c: &Chain, at: usize) {
        for (n, node) in c.nodes.iter().skip(at).enumerate() {
            self.say_skip(node, n == 0);
        }
    }

    fn say_skip(&self, node: &super::chain::Node, first: bool) {
        let why = match (&node.version, first) {
            (Some(v), true) => format!("version: {v}"),
            (None, true) => "cached".to_string(),
            (_, false) => "chain".to_string(),
        };
        self.engine.out.run_note(&self.run_id, &format!("skip: {} ({why})", node.step));
    }

    /// With the hub's next batch (flushed at each checkpoint and at the run's end).
    pub(super) fn record_chain(&self, leaf: &str) {
        self.engine.out.record_chain(&self.engine.scope, &self.job.name, leaf);
    }
}

pub(super) enum Route {
    Next,
    To(usize),
}
