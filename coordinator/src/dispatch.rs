//! The Dispatcher: puts every assignment on the queue, matches results back
//! to whoever is waiting, and reaches running assignments to cancel them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use steppe_proto::v1::{coordinator_message, Cancel, CoordinatorMessage};
use steppe_shared::assignment::{Assignment, AssignmentResult};
use steppe_shared::outcome::StepError;
use steppe_shared::queue::Queue;
use steppe_worker::local::{Cancels, Reporter};
use tokio::sync::{mpsc, oneshot};

pub type SessionTx = mpsc::Sender<Result<CoordinatorMessage, tonic::Status>>;

pub struct Dispatcher {
    pub queue: Arc<dyn Queue>,
    pending: Mutex<HashMap<String, oneshot::Sender<AssignmentResult>>>,
    /// Assignments running in this process's workers.
    pub local: Cancels,
    /// Assignments running on remote workers: the session that holds each.
    remote: Mutex<HashMap<String, SessionTx>>,
    seq: AtomicU64,
}

impl Dispatcher {
    pub fn new(queue: Arc<dyn Queue>) -> Arc<Self> {
        Arc::new(Dispatcher {
            queue,
            pending: Mutex::new(HashMap::new()),
            local: Cancels::default(),
            remote: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
        })
    }

    /// Queues the assignment and waits for its result. Dropping the returned
    /// future (a race loser) cancels the assignment wherever it runs.
    pub async fn dispatch(self: &Arc<Self>, mut a: Assignment) -> AssignmentResult {
        a.id = format!("{}-{}", a.run_id, self.seq.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(a.id.clone(), tx);
        }
        let guard = InFlight { d: self.clone(), id: a.id.clone(), done: false };
        let id = a.id.clone();
        self.queue.push(a);
        let r = rx.await;
        let mut guard = guard;
        guard.done = true;
        r.unwrap_or_else(|_| AssignmentResult {
            assignment_id: id,
            exit_code: None,
            stdout: String::new(),
            stderr: String::new(),
            outputs: Vec::new(),
            result: Err(StepError::errored("the worker running this step went away")),
        })
    }

    /// Records which session runs an assignment (so a cancel can reach it).
    pub fn running_remotely(&self, id: &str, tx: SessionTx) {
        if let Ok(mut m) = self.remote.lock() {
            m.insert(id.to_string(), tx);
        }
    }

    /// Puts an assignment a lost worker held back on the queue (at-least-once).
    pub fn requeue(&self, a: Assignment) {
        if let Ok(mut m) = self.remote.lock() {
            m.remove(&a.id);
        }
        let still_wanted = self.pending.lock().map(|p| p.contains_key(&a.id)).unwrap_or(false);
        if still_wanted {
            self.queue.push(a);
        }
    }

    /// Stops one assignment: off the queue if it waits, killed if it runs.
    pub fn cancel(&self, id: &str) {
        if self.queue.remove(id) {
            self.complete(AssignmentResult {
                assignment_id: id.to_string(),
                exit_code: None,
                stdout: String::new(),
                stderr: String::new(),
                outputs: Vec::new(),
                result: Err(StepError::aborted("cancelled before it started")),
            });
            return;
        }
        if self.local.cancel(id) {
            return;
        }
        let tx = self.remote.lock().ok().and_then(|m| m.get(id).cloned());
        if let Some(tx) = tx {
            let msg = CoordinatorMessage { msg: Some(coordinator_message::Msg::Cancel(Cancel { assignment_id: id.to_string() })) };
            let _ = tx.try_send(Ok(msg));
        }
    }

    /// Cancels everything in flight (Ctrl-C).
    pub fn cancel_all(&self) {
        let ids: Vec<String> = self.pending.lock().map(|p| p.keys().cloned().collect()).unwrap_or_default();
        for id in ids {
            self.cancel(&id);
        }
    }
}

impl Reporter for Dispatcher {
    fn complete(&self, r: AssignmentResult) {
        if let Ok(mut m) = self.remote.lock() {
            m.remove(&r.assignment_id);
        }
        // A result nobody waits for any more (a cancelled race loser, a duplicate) is dropped.
        let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(&r.assignment_id));
        if let Some(tx) = waiter {
            let _ = tx.send(r);
        }
    }
}

struct InFlight {
    d: Arc<Dispatcher>,
    id: String,
    done: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            self.d.cancel(&self.id);
            if let Ok(mut p) = self.d.pending.lock() {
                p.remove(&self.id);
            }
        }
    }
}
