//! Workers inside the coordinator's process (embedded mode): the same
//! pull-execute-report loop a remote worker runs, over in-process transports.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use steppe_runtime::artifacts::ArtifactStore;
use steppe_runtime::assignment::AssignmentResult;
use steppe_runtime::queue::Queue;
use tokio::sync::watch;

use crate::exec::execute_isolated;
use crate::sink::LineSink;

/// Cancellation switches of the assignments running in this process, by id.
#[derive(Clone, Default)]
pub struct Cancels(Arc<Mutex<HashMap<String, watch::Sender<bool>>>>);

impl Cancels {
    pub(crate) fn register(&self, id: &str) -> watch::Receiver<bool> {
        let (tx, rx) = watch::channel(false);
        if let Ok(mut m) = self.0.lock() {
            m.insert(id.to_string(), tx);
        }
        rx
    }
    pub(crate) fn done(&self, id: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(id);
        }
    }
    /// Whether the assignment runs in this process.
    pub fn is_running(&self, id: &str) -> bool {
        self.0.lock().is_ok_and(|m| m.contains_key(id))
    }

    /// Kills the assignment's command if it runs here; true if it did.
    pub fn cancel(&self, id: &str) -> bool {
        self.0.lock().ok().and_then(|m| m.get(id).map(|tx| tx.send(true).is_ok())).unwrap_or(false)
    }
}

/// Where finished assignments are reported.
pub trait Reporter: Send + Sync {
    fn complete(&self, r: AssignmentResult);
    /// Whether anyone waits for this assignment. One nobody waits for was
    /// left on a shared queue by a coordinator that is gone: it is not run.
    fn wanted(&self, _id: &str, _epoch: u32) -> bool {
        true
    }
    /// A loop of this process began running it.
    fn started(&self, _id: &str) {}
    /// Where agent turns add their tokens (a run's shared budget counters).
    fn ledger(&self) -> Option<Arc<dyn steppe_runtime::budget::Ledger>> {
        None
    }
}

/// Starts `slots` loops that take assignments from `queue`, run them and report.
pub fn spawn_local_workers(
    slots: usize,
    queue: Arc<dyn Queue>,
    store: Arc<dyn ArtifactStore>,
    work_root: PathBuf,
    sink: Arc<dyn LineSink>,
    reporter: Arc<dyn Reporter>,
    cancels: Cancels,
) {
    for _ in 0..slots {
        let (queue, store, work_root, sink, reporter, cancels) =
            (queue.clone(), store.clone(), work_root.clone(), sink.clone(), reporter.clone(), cancels.clone());
        tokio::spawn(async move {
            loop {
                let a = match queue.pop().await {
                    Ok(a) => {
                        if let Some(l) = steppe_runtime::outage::recovered("taking from the queue") {
                            eprintln!("steppe: {l}");
                        }
                        a
                    }
                    Err(e) if !e.is_outage() => {
                        // One entry it could not read (moved aside): on to the next.
                        eprintln!("steppe: {e}");
                        continue;
                    }
                    Err(e) => {
                        if let Some(l) = steppe_runtime::outage::failed("taking from the queue", &e) {
                            eprintln!("steppe: {l}");
                        }
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                if !reporter.wanted(&a.id, a.epoch) {
                    eprintln!("steppe: dropped assignment {} ({}): no run here waits for it", a.id, a.step);
                    let _ = queue.ack(&a.id).await;
                    continue;
                }
                let cancel = cancels.register(&a.id);
                reporter.started(&a.id);
                let r = execute_isolated(&a, store.clone(), &work_root, sink.clone(), reporter.ledger(), cancel).await;
                cancels.done(&a.id);
                reporter.complete(r);
            }
        });
    }
}
