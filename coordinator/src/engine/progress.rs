//! A run's progress recorded after each top-level step, and put back when
//! a run continues another (`--resume`, `--replay`).

use steppe_runtime::artifacts::ArtifactRef;

use super::checkpoint::{Checkpoint, KIND};
use super::run::*;

impl JobRun {
    /// Records the state after the top-level step at `at`, going to `next`:
    /// after the step's own records are in the store, so a run taken over
    /// from it has them; with the next free record number, so records of a
    /// step that was running are written over when it runs again.
    pub(super) async fn checkpoint(&self, at: usize, next: usize, log: &[String]) {
        let Some(store) = self.engine.out.store() else { return };
        self.engine.out.flush().await;
        let seq = self.seq.load(std::sync::atomic::Ordering::SeqCst);
        let artifacts = self.artifacts.lock().map(|a| a.iter().map(|(k, v)| (k.clone(), v.digest.clone())).collect()).unwrap_or_default();
        let vars = self.vars.lock().map(|v| v.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        let cp = Checkpoint { at, next, log: log.to_vec(), artifacts, vars, seq };
        let step = self.job.plan.get(at).and_then(|s| s.name()).unwrap_or("step");
        if let Err(e) = store.record_event(&self.run_id, KIND, step, &serde_json::to_string(&cp).unwrap_or_default()) {
            self.engine.out.run_note(&self.run_id, &format!("steppe: recording the run's progress (for --resume): {e}"));
        }
    }

    /// Puts a checkpoint's artifacts and values back.
    pub(super) fn restore(&self, cp: &Checkpoint) {
        if let Ok(mut a) = self.artifacts.lock() {
            *a = cp.artifacts.iter().map(|(k, d)| (k.clone(), ArtifactRef { digest: d.clone() })).collect();
        }
        if let Ok(mut v) = self.vars.lock() {
            *v = cp.vars.clone().into_iter().collect();
        }
    }
}

