//! Hand-overs to a pulling worker that waits: while its session says it
//! has a slot free and found its queue empty (`Waiting`), the coordinator
//! stands in the pool's line on its behalf ([`Queue::await_hand_over`]) and
//! sends what it is handed on the session, as to a pushed worker; when this
//! process puts something on the queue the worker may not have seen, it
//! tells the worker to `Look`. The worker still takes from the queue itself
//! whatever goes through it (a requeue, a backlog, another process's entry).

use std::sync::atomic::{AtomicBool, Ordering};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steppe_proto::v1::{coordinator_message, CoordinatorMessage, Look};
use steppe_runtime::assignment::Assignment;
use steppe_runtime::queue::Queue;
use steppe_runtime::wire::assignment_to_wire;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit};
use tonic::Status;

use crate::dispatch::Dispatcher;

/// What a session holds, by assignment id; the permit is the slot it
/// takes when the coordinator pushed it (a worker that pulls keeps count itself).
pub(crate) type InFlight = Arc<Mutex<HashMap<String, Option<OwnedSemaphorePermit>>>>;

/// Where a session's messages to its worker go.
pub(crate) type Session = mpsc::Sender<Result<CoordinatorMessage, Status>>;

/// How long one stand in line lasts before the stop flag is looked at again.
const STAND: Duration = Duration::from_secs(1);

/// What the session's reader and its hand-over task share.
pub(crate) struct Waiting {
    /// Whether the worker says it waits; set by the reader, cleared by a hand-over.
    said: watch::Sender<bool>,
}

impl Waiting {
    pub(crate) fn new() -> Arc<Waiting> {
        Arc::new(Waiting { said: watch::Sender::new(false) })
    }

    /// The worker said it waits (or no longer does).
    pub(crate) async fn said(&self, waiting: bool) {
        self.said.send_replace(waiting);
        if waiting {
            // The hand-over task gets in line before the reader goes on to
            // the result that usually follows: the step that result ends
            // hands out its next at once, and it should find the line.
            tokio::task::yield_now().await;
        }
    }
}

/// Stands in line for the worker of `session` while it waits, until `stop`
/// or until the session's reader lets go of `waiting`.
pub(crate) fn spawn(queue: Arc<dyn Queue>, d: Arc<Dispatcher>, session: Session, inflight: InFlight, waiting: &Arc<Waiting>, stop: Arc<AtomicBool>) {
    let mut said = waiting.said.subscribe();
    let waiting = Arc::downgrade(waiting);
    tokio::spawn(async move {
        // What was pushed when the worker was last told to look.
        let mut seen = queue.pushes();
        loop {
            while !*said.borrow_and_update() {
                if said.changed().await.is_err() {
                    return;
                }
            }
            if stop.load(Ordering::SeqCst) {
                return;
            }
            let pushed = queue.pushes();
            if pushed != seen {
                // Queued since it last looked (or while it was busy): it looks again.
                seen = pushed;
                let look = CoordinatorMessage { msg: Some(coordinator_message::Msg::Look(Look {})) };
                if session.send(Ok(look)).await.is_err() {
                    return;
                }
            }
            let handed = tokio::select! {
                a = queue.await_hand_over(seen, STAND) => a,
                // It no longer waits, or says so again: out of line (what was
                // handed meanwhile goes to another taker or onto the queue).
                changed = said.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => return,
                },
            };
            let Some(a) = handed else { continue };
            // The wait is spent; the worker says it again when it has a slot free.
            if let Some(w) = waiting.upgrade() {
                w.said.send_replace(false);
            }
            said.borrow_and_update();
            if !send_held(&a, None, &session, &inflight, &d, &stop).await {
                return;
            }
        }
    });
}

/// Sends an assignment taken for a session (pushed or handed over) to its
/// worker; false when the session stopped or is gone (it went back on the
/// queue). It is held before the stop is looked at, so a session that ends
/// from then on requeues it, or this does, never neither nor both; and it is
/// marked running remotely only once sent, so a cancel asked meanwhile
/// follows it on the session.
pub(crate) async fn send_held(a: &Assignment, slot: Option<OwnedSemaphorePermit>, session: &Session, inflight: &InFlight, d: &Dispatcher, stop: &AtomicBool) -> bool {
    if let Ok(mut m) = inflight.lock() {
        m.insert(a.id.clone(), slot);
    }
    let gone = stop.load(Ordering::SeqCst);
    let msg = CoordinatorMessage { msg: Some(coordinator_message::Msg::Assignment(assignment_to_wire(a))) };
    if gone || session.send(Ok(msg)).await.is_err() {
        if inflight.lock().ok().and_then(|mut m| m.remove(&a.id)).is_some() {
            d.requeue(&a.id);
        }
        return false;
    }
    d.running_remotely(&a.id, session.clone());
    true
}
