//! The process log, a subscriber of the EventHub for the long-running
//! commands: every line a `tracing` event, a run's carrying its run id,
//! pipeline and job (as fields, so a JSON log collector can filter on them).

use std::collections::HashMap;

use super::Subscriber;

#[derive(Default)]
pub struct Log {
    /// The pipeline and job of each run that has begun and not ended.
    runs: HashMap<String, (String, String)>,
}

impl Subscriber for Log {
    fn run_began(&mut self, run_id: &str, pipeline: &str, job: &str) {
        self.runs.insert(run_id.to_string(), (pipeline.to_string(), job.to_string()));
        tracing::info!(run = %run_id, pipeline = %pipeline, job = %job, "run began");
    }

    fn run_ended(&mut self, run_id: &str, outcome: &str) {
        let (pipeline, job) = self.runs.remove(run_id).unwrap_or_default();
        tracing::info!(run = %run_id, pipeline = %pipeline, job = %job, outcome = %outcome, "run {outcome}");
    }

    fn line(&mut self, run_id: &str, line: &str) {
        if run_id.is_empty() {
            if line.starts_with("WARNING") {
                tracing::warn!("{line}");
            } else {
                tracing::info!("{line}");
            }
            return;
        }
        let (pipeline, job) = self.runs.get(run_id).map(|(p, j)| (p.as_str(), j.as_str())).unwrap_or_default();
        tracing::info!(run = %run_id, pipeline = %pipeline, job = %job, "{line}");
    }
}
