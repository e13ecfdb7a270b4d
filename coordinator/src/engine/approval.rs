//! `approval:` a run parked until someone decides (`steppe approve|reject`) or its deadline passes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use steppe_language::model::Step;
use steppe_runtime::outcome::StepError;

use super::run::*;

impl JobRun {
    /// Parks until a person decides (`steppe approve|reject`), polling the store every 2 s.
    /// Approved succeeds; rejected fails; no decision in time aborts.
    pub(super) async fn approval(self: &Arc<Self>, s: &Step) -> Done {
        let spec = s.approval.clone().unwrap_or_default();
        let message = match self.subst(spec.message.as_deref().unwrap_or("approve?")) {
            Ok(m) => m,
            Err(e) => return self.finish_err("approval", StepError::errored(format!("approval: {e}"))),
        };
        let timeout = spec.timeout.and_then(|t| t.to_std()).unwrap_or(Duration::from_secs(24 * 3600));
        let Some(store) = self.engine.out.store().cloned() else {
            return Done::err(StepError::errored("approval: no store to park the approval in"), Vec::new());
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        let id = match store.request_approval(&self.engine.scope, &self.run_id, &self.job.name, &message, now, now + timeout.as_millis() as i64) {
            Ok(id) => id,
            Err(e) => return Done::err(StepError::errored(format!("approval: {e}")), Vec::new()),
        };
        let p = &self.engine.decide_with;
        let wait = steppe_language::duration::show(timeout);
        self.engine.out.run_note(&self.run_id, &format!("approval {id}: {message}"));
        self.engine.out.run_note(&self.run_id, &format!("approval {id}: waiting up to {wait} — steppe approve {p} {id}   (or: steppe reject {p} {id} --reason …)"));
        let t0 = Instant::now();
        loop {
            match store.approval(id) {
                Ok(Some(rec)) => match rec.decision.as_deref() {
                    Some("approved") => {
                        self.engine.out.run_note(&self.run_id, &format!("approval {id}: approved by {}", rec.approver));
                        return Done::ok(Vec::new());
                    }
                    Some(_) => {
                        let why = if rec.reason.is_empty() { String::new() } else { format!(": {}", rec.reason) };
                        return Done::err(StepError::failed(format!("approval {id} rejected by {}{why}", rec.approver)), Vec::new());
                    }
                    None => {}
                },
                Ok(None) => return Done::err(StepError::errored(format!("approval {id} vanished from the store")), Vec::new()),
                Err(e) => return Done::err(StepError::errored(format!("approval {id}: {e}")), Vec::new()),
            }
            if t0.elapsed() >= timeout {
                return Done::err(StepError::aborted(format!("approval {id}: nobody decided within {wait}")), Vec::new());
            }
            if self.aborted() {
                return Done::err(StepError::aborted(format!("approval {id}: aborted")), Vec::new());
            }
            let mut cancel = self.engine.cancel.clone();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(2).min(timeout.saturating_sub(t0.elapsed()))) => {}
                _ = cancel.changed() => {}
            }
        }
    }
}
