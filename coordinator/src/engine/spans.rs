//! A run's spans in the coordinator: the run and its job (under the
//! submitter's span when it sent one), each step, each attempt — whose
//! context goes with the assignment, so a worker's spans join the run's
//! trace under it.

use opentelemetry::{Context, KeyValue};
use steppe_runtime::outcome::StepError;
use steppe_worker::telemetry;

use super::run::JobRun;

impl JobRun {
    /// A span of this run under the current one.
    pub(super) fn span(&self, name: String, attributes: Vec<KeyValue>) -> Context {
        telemetry::start(&Context::current(), &self.run_id, name, attributes, None)
    }

    /// The run's span and its job's, under the submitter's span when there is one.
    pub(super) fn run_spans(&self) -> (Context, Context) {
        let parent = match &self.engine.trace_parent {
            Some(tp) => telemetry::remote(tp),
            None => Context::current(),
        };
        let scope = &self.engine.scope;
        let attrs = vec![KeyValue::new("pipeline", scope.pipeline.clone()), KeyValue::new("team", scope.team.clone()), KeyValue::new("job", self.job.name.clone())];
        let run = telemetry::start(&parent, &self.run_id, format!("run {}", self.job.name), attrs.clone(), None);
        let job = telemetry::start(&run, &self.run_id, format!("job {}", self.job.name), attrs, None);
        (run, job)
    }

    /// Ends the run's spans with its outcome, and hands every span of the
    /// run this process still holds to the store.
    pub(super) fn end_run_spans(&self, (run, job): (Context, Context), outcome: &str, result: &Result<(), StepError>) {
        let error = result.as_ref().err().map(|e| e.message.as_str());
        for cx in [&job, &run] {
            telemetry::set(cx, vec![KeyValue::new("outcome", outcome.to_string())]);
            telemetry::end(cx, error);
        }
        self.engine.out.record_spans(&self.run_id, telemetry::take(&self.run_id));
    }
}

/// Ends a step's or attempt's span with its outcome.
pub(super) fn end_with(cx: &Context, result: &Result<(), StepError>, skipped: bool) {
    let outcome = if skipped { "skipped".to_string() } else { steppe_runtime::outcome::Outcome::of(result).word().to_string() };
    telemetry::set(cx, vec![KeyValue::new("outcome", outcome)]);
    telemetry::end(cx, result.as_ref().err().map(|e| e.message.as_str()));
}
