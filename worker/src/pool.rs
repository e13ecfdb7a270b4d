//! The in-process worker pool of embedded mode: N slots executing assignments.

use std::path::PathBuf;
use std::sync::Arc;

use steppe_shared::artifacts::ArtifactStore;
use steppe_shared::assignment::{Assignment, AssignmentResult};
use tokio::sync::{watch, Semaphore};

use crate::exec::{execute, LineSink};

#[derive(Clone)]
pub struct WorkerPool {
    slots: Arc<Semaphore>,
    store: Arc<dyn ArtifactStore>,
    work_root: PathBuf,
    sink: Arc<dyn LineSink>,
    cancel: watch::Receiver<bool>,
}

impl WorkerPool {
    pub fn new(slots: usize, store: Arc<dyn ArtifactStore>, work_root: PathBuf, sink: Arc<dyn LineSink>, cancel: watch::Receiver<bool>) -> Self {
        WorkerPool { slots: Arc::new(Semaphore::new(slots.max(1))), store, work_root, sink, cancel }
    }

    /// Waits for a free slot, then runs the assignment.
    pub async fn dispatch(&self, a: Assignment) -> AssignmentResult {
        let _permit = self.slots.clone().acquire_owned().await;
        execute(&a, self.store.clone(), &self.work_root, self.sink.clone(), self.cancel.clone()).await
    }
}
