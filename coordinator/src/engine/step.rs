//! A step: its `when:` guard, its kind, its hooks by outcome and `try:` tolerance.

use std::sync::Arc;

use steppe_language::model::{Step, StepKind};
use steppe_runtime::assignment::{Assignment, Cwd};
use steppe_runtime::outcome::{Class, Outcome, StepError};

use super::run::*;
use super::across::{render_cell, Cell};

impl JobRun {
    /// Runs one step with its `when:` guard, attempts, hooks and `try:`
    /// tolerance, in a span of its own.
    pub fn step<'a>(self: &'a Arc<Self>, s: &'a Step, cell: Cell, in_hook: bool) -> BoxFut<'a, Done> {
        let kind = s.kind().map(|k| k.key()).unwrap_or("step");
        // Blocks are named by their kind (a try's name is its step's).
        let name = match s.kind() {
            Some(StepKind::Do | StepKind::Try | StepKind::InParallel | StepKind::Race) | None => kind.to_string(),
            Some(_) => s.name().unwrap_or(kind).to_string(),
        };
        let label = if cell.is_empty() { name } else { super::across::cell_label(&name, &cell) };
        let cx = self.span(format!("step {label}"), vec![opentelemetry::KeyValue::new("step", label.clone()), opentelemetry::KeyValue::new("kind", kind), opentelemetry::KeyValue::new("hook", in_hook)]);
        Box::pin(async move {
            let d = opentelemetry::context::FutureExt::with_context(self.step_in_span(s, cell, in_hook), cx.clone()).await;
            super::spans::end_with(&cx, &d.result, d.skipped);
            // The store (and a dashboard watching) gets the step's spans as it ends.
            self.engine.out.record_spans(&self.run_id, steppe_worker::telemetry::take(&self.run_id));
            d
        })
    }

    fn step_in_span<'a>(self: &'a Arc<Self>, s: &'a Step, cell: Cell, in_hook: bool) -> BoxFut<'a, Done> {
        Box::pin(async move {
            let Some(kind) = s.kind() else {
                return Done::err(StepError::errored("step has no kind"), Vec::new());
            };
            if s.across.is_some() && cell.is_empty() {
                return Box::pin(self.across(s, kind)).await;
            }
            // Each kind's future is boxed apart: this one stays small, and
            // only the kind that runs is allocated (and moved) at all.
            if let Some(w) = &s.when {
                if kind != StepKind::Get {
                    match Box::pin(self.guard(s, &w.run, &cell)).await {
                        Ok(true) => {}
                        Ok(false) => return Done::skipped(),
                        Err(e) => return Done::err(e, Vec::new()),
                    }
                }
            }
            let mut d = match kind {
                StepKind::Task => Box::pin(self.task(s, &cell)).await,
                StepKind::Get => Box::pin(self.get(s)).await,
                StepKind::Put => Box::pin(self.put(s, &cell)).await,
                StepKind::LoadVar => Box::pin(self.load_var(s)).await,
                StepKind::Do => Box::pin(self.do_block(s.do_.as_deref().unwrap_or(&[]))).await,
                StepKind::Try => Box::pin(self.try_block(s)).await,
                StepKind::InParallel => {
                    let p = s.in_parallel.as_ref();
                    let steps = p.map(|p| p.steps.as_slice()).unwrap_or(&[]);
                    Box::pin(self.parallel(steps, p.and_then(|p| p.limit).filter(|l| *l > 0).map(|l| l as usize), p.and_then(|p| p.fail_fast).unwrap_or(false))).await
                }
                StepKind::Race => Box::pin(self.race(s.race.as_ref().map(|r| r.steps.as_slice()).unwrap_or(&[]))).await,
                StepKind::Agent => Box::pin(self.agent(s, &cell, None)).await,
                StepKind::Ensemble => Box::pin(self.ensemble(s)).await,
                StepKind::Approval => Box::pin(self.approval(s)).await,
            };
            if !d.outputs.is_empty() && d.result.is_ok() && cell.is_empty() {
                self.register(&d.outputs);
            }
            // Hooks see the step's real outcome.
            let hooks = s.hooks();
            if !hooks.is_empty() {
                let outcome = Outcome::of(&d.routed);
                let mut hook_err: Option<StepError> = None;
                for (key, h) in hooks.iter().filter(|(k, _)| *k == outcome.hook()) {
                    let hd = self.step(h, cell.clone(), true).await;
                    d.log.extend(hd.log);
                    if let Err(e) = hd.result {
                        if *key == "on_success" {
                            hook_err = Some(StepError::failed(format!("on_success hook: {}", e.message)));
                        } else {
                            self.engine.out.run_note(&self.run_id, &format!("{key} hook failed: {}", e.message));
                        }
                    }
                }
                for (_, h) in hooks.iter().filter(|(k, _)| *k == "ensure") {
                    let hd = self.step(h, cell.clone(), true).await;
                    d.log.extend(hd.log);
                    if let Err(e) = hd.result {
                        if hook_err.is_none() && d.routed.is_ok() {
                            hook_err = Some(StepError::failed(format!("ensure hook: {}", e.message)));
                        } else {
                            self.engine.out.run_note(&self.run_id, &format!("ensure hook failed: {}", e.message));
                        }
                    }
                }
                if let (Some(e), Ok(())) = (hook_err, &d.routed) {
                    d.result = Err(e.clone());
                    d.routed = Err(e);
                }
            }
            let _ = in_hook;
            if kind == StepKind::Try {
                if let Err(e) = &d.result {
                    if e.class != Class::Aborted {
                        let name = s.try_.as_deref().and_then(Step::name).unwrap_or("step");
                        let word = if e.class == Class::Failed { "failed" } else { "errored" };
                        self.engine.out.run_note(&self.run_id, &format!("try: {name} {word} (tried, continuing)"));
                        d.result = Ok(());
                    }
                }
            }
            d
        })
    }

    /// Runs a `when:` guard in a space holding the step's inputs.
    pub(super) async fn guard(self: &Arc<Self>, s: &Step, cmd: &str, cell: &Cell) -> Result<bool, StepError> {
        let inputs = self.input_refs(&self.step_inputs(s), s.input_mapping.as_ref());
        let (image, container) = self.resolved_image(s, cell)?;
        let a = Assignment {
            env: s.env.clone().unwrap_or_default(),
            cwd: Cwd::StepDir,
            inputs,
            stream: false,
            image,
            container,
            ..Assignment::command(&self.run_id, &format!("{} (when)", s.name().unwrap_or("step")), render_cell(&self.subst(cmd).map_err(StepError::errored)?, cell).map_err(StepError::errored)?)
        };
        let r = self.dispatch(a).await;
        match r.result {
            Ok(()) => Ok(true),
            Err(e) if e.class == Class::Aborted => Err(e),
            Err(_) if r.exit_code.is_some() => Ok(false),
            Err(e) => Err(StepError::errored(format!("when: could not run the guard: {}", e.message))),
        }
    }
}
