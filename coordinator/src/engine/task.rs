//! A task step: its command, inputs, outputs, image, timeout, assert and `fix:` agent, as an assignment.

use std::sync::Arc;

use serde_json::Value;
use steppe_language::model::Step;
use steppe_runtime::assignment::{Assignment, Judge};
use steppe_runtime::outcome::StepError;

use super::run::*;
use super::across::{cell_label, render_cell, Cell};

impl JobRun {
    pub(super) async fn task(self: &Arc<Self>, s: &Step, cell: &Cell) -> Done {
        let name = s.task.clone().unwrap_or_default();
        let label = if cell.is_empty() { name.clone() } else { cell_label(&name, cell) };
        let entry = self.entry(s);
        let run = s.run.clone().or_else(|| entry.and_then(|e| e.run.clone())).unwrap_or_default();
        let command = match self.subst(&run).and_then(|r| render_cell(&r, cell)) {
            Ok(c) => c,
            Err(e) => return self.finish_err(&label, StepError::errored(format!("{label}: {e}"))),
        };
        let outputs = s.outputs.clone().or_else(|| entry.and_then(|e| e.outputs.clone())).unwrap_or_default();
        let (image, container) = match self.resolved_image(s, cell) {
            Ok(i) => i,
            Err(e) => return self.finish_err(&label, StepError::errored(format!("{label}: {}", e.message))),
        };
        let env = s.env.clone().or_else(|| entry.and_then(|e| e.env.clone())).unwrap_or_default();
        let timeout = s.timeout.or_else(|| entry.and_then(|e| e.timeout)).and_then(|t| t.to_std());
        let judge = s.assert.as_ref().map(|a| Judge { stdout: a.stdout.clone(), code: a.code, files: a.files.clone().unwrap_or_default() }).unwrap_or_default();
        let fix = match s.fix.as_ref().or_else(|| entry.and_then(|e| e.fix.as_ref())) {
            Some(f) => match self.resolve_fix(f, &name, &command) {
                Ok(w) => Some(Box::new(w)),
                Err(e) => return self.finish_err(&label, e),
            },
            None => None,
        };
        let mut inputs = self.input_refs(&self.step_inputs(s), s.input_mapping.as_ref());
        let upstream = self.upstream(s);
        if !upstream.is_empty() {
            match self.store_files(&upstream) {
                Ok(r) => inputs.push(("upstream".to_string(), r)),
                Err(e) => return self.finish_err(&label, StepError::errored(format!("{label}: context.from: {e}"))),
            }
        }
        let reuse_key = self.output_key(s, &inputs, !cell.is_empty());
        if let Some(outputs) = reuse_key.as_deref().and_then(|k| self.reused_outputs(k)) {
            // Its outputs from an earlier success with the same content and inputs.
            self.engine.out.run_note(&self.run_id, &format!("skip: {label} (reused)"));
            let mut d = Done::ok(vec![label.clone()]);
            d.outputs = outputs;
            return mapped(s, d);
        }
        let a = Assignment {
            env,
            inputs,
            outputs: outputs.clone(),
            timeout,
            judge,
            image,
            container,
            fix,
            ..Assignment::command(&self.run_id, &label, command)
        };
        let mut d = self.attempts(&label, a, s.attempts.unwrap_or(1)).await;
        if let Some(o) = d.agent.take() {
            // The fixer ran: it lands in the execution log before the task it rescued.
            let fixer = s.fix.as_ref().or_else(|| entry.and_then(|e| e.fix.as_ref())).and_then(|f| f.agent()).unwrap_or_default().to_string();
            let mut log = vec![fixer];
            log.append(&mut d.log);
            d.log = log;
            let _ = o;
        }
        if let (Some(key), Ok(())) = (&reuse_key, &d.result) {
            self.keep_outputs(key, &d.outputs);
        }
        mapped(s, d)
    }
}

/// Outputs renamed as the step's `output_mapping` says.
fn mapped(s: &Step, mut d: Done) -> Done {
    if let Some(m) = &s.output_mapping {
        for (n, _) in d.outputs.iter_mut() {
            if let Some(to) = m.get(n.as_str()).and_then(Value::as_str) {
                *n = to.to_string();
            }
        }
    }
    d
}
