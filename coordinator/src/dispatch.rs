//! The Dispatcher actor: puts every assignment on the queue, matches results
//! back to whoever waits, and reaches running assignments to cancel them.
//! [`Dispatcher`] is the handle the rest of the coordinator holds.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use steppe_proto::v1::{coordinator_message, Cancel, CoordinatorMessage};
use steppe_runtime::assignment::{Assignment, AssignmentResult};
use steppe_runtime::outcome::StepError;
use steppe_runtime::queue::{Pools, Queue};
use steppe_worker::local::{Cancels, Reporter};
use tokio::sync::{mpsc, oneshot};

use crate::queue_writer::QueueWriter;

pub type SessionTx = mpsc::Sender<Result<CoordinatorMessage, tonic::Status>>;

pub enum DispatchMsg {
    /// Queue this assignment on its remote queue (its books are in [`Wanted`]).
    Submit(Assignment),
    /// The result of this epoch of a remotely run or remotely queued
    /// assignment was reported (and went to whoever waited): its
    /// acknowledgement and the session that ran it are closed.
    Finished(String, u32),
    /// Stop one assignment: off the queue if it waits, killed if it runs.
    Cancel(String),
    /// Ctrl-C: stop everything in flight.
    CancelAll,
    /// Stop what one run has in flight (its assignment ids start with `<run id>-`).
    CancelRun(String),
    /// A remote session took this assignment (so a cancel can reach it);
    /// true: a pulling worker took it off the queue and acknowledges it.
    RunningRemotely(String, SessionTx, bool),
    /// A lost worker held this assignment: back on the queue (at least once).
    Requeue(String),
    /// A pool's queue lost what waited in it (a Redis that restarted
    /// empty): everything of that pool not running somewhere goes back on it.
    QueueLost(String),
    /// The queue gave up on these (its dead-letter queue): their steps error, saying why.
    Dead(Vec<(Assignment, String)>),
    /// A push to a remote queue failed (the id, why): its step errors.
    NotQueued(String, String),
}

/// An assignment that has waited in its queue past the time to say so.
#[derive(Debug, Clone)]
pub struct LongWait {
    pub run_id: String,
    pub step: String,
    /// The pool whose queue it waits in (its container queue's, for a step with an image).
    pub pool: String,
    pub waited: std::time::Duration,
}

/// What the Dispatcher knows of one pool's assignments.
#[derive(Debug, Clone, Default)]
pub struct PoolFigures {
    pub pool: String,
    pub waiting: i64,
    pub in_flight: i64,
    pub oldest_waiting: std::time::Duration,
}

struct DispatcherActor;

pub struct DispatcherState {
    pools: Arc<Pools>,
    local: Cancels,
    remote: HashMap<String, SessionTx>,
    /// Taken off the queue by a pulling worker, which acknowledges its entry
    /// itself: the coordinator only forgets it.
    acked_by_taker: std::collections::HashSet<String>,
    /// Every assignment waited for, with its books.
    wanted: Wanted,
    metrics: Arc<steppe_worker::metrics::Metrics>,
    /// Where notes about the queue go.
    hub: Option<Arc<crate::event_hub::EventHub>>,
    /// Pushes and acknowledgements of remote queues, off the actor's path.
    writer: QueueWriter,
}

/// The assignments someone here waits for, with their books, shared by the
/// Dispatcher's handle (which books what it queues), the workers that report
/// (a result goes straight to its waiter) and the actor (which reaches queues
/// and remote sessions). An entry outside it (left on a shared queue by a
/// coordinator that died) belongs to no run: it is not run.
pub type Wanted = Arc<std::sync::Mutex<HashMap<String, Wait>>>;

/// One assignment waited for.
pub struct Wait {
    /// As last handed out: an older epoch that comes back (a queue that
    /// cannot retire it, SQS) is not run, and its result is refused.
    assignment: Assignment,
    /// Taken by the result of the current epoch that comes first.
    reply: Option<oneshot::Sender<AssignmentResult>>,
    queued_at: std::time::Instant,
    /// When a worker began it.
    started_at: Option<std::time::Instant>,
    /// Its long wait was told.
    told_waiting: bool,
    /// Cancelled while a worker was taking it: the cancel is sent as soon
    /// as the worker says it took it.
    cancel_asked: bool,
    /// Its queue keeps nothing once taken (in-process): whoever reports its
    /// result closes its books, with no word to the actor...
    unleased: bool,
    /// ...unless a remote session runs it (a worker of `--listen`), which
    /// the actor holds.
    remote: bool,
}

impl Wait {
    fn new(assignment: Assignment, reply: oneshot::Sender<AssignmentResult>, unleased: bool) -> Self {
        Wait { assignment, reply: Some(reply), queued_at: std::time::Instant::now(), started_at: None, told_waiting: false, cancel_asked: false, unleased, remote: false }
    }

    /// Its pool as figures and notes name it.
    fn pool(&self) -> String {
        let pool = &self.assignment.pool;
        if pool.is_empty() { steppe_runtime::queue::DEFAULT_POOL.to_string() } else { pool.clone() }
    }

    /// A worker began it: its wait in the queue is over.
    fn began(&mut self, metrics: &steppe_worker::metrics::Metrics) {
        let now = std::time::Instant::now();
        metrics.queue_wait_seconds.observe(now.duration_since(self.queued_at).as_secs_f64());
        self.started_at = Some(now);
    }
}

fn send_cancel(tx: &SessionTx, id: &str) {
    let msg = CoordinatorMessage { msg: Some(coordinator_message::Msg::Cancel(Cancel { assignment_id: id.to_string() })) };
    let _ = tx.try_send(Ok(msg));
}

fn aborted(id: &str, why: &str) -> AssignmentResult {
    AssignmentResult::with_id(id, 0, Err(StepError::aborted(why)))
}

/// The books, locked (the actor's and the handle's one way in).
fn books(wanted: &Wanted) -> std::sync::MutexGuard<'_, HashMap<String, Wait>> {
    // A panic holding the lock (a bug) leaves the books as they were.
    wanted.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DispatcherState {
    fn books(&self) -> std::sync::MutexGuard<'_, HashMap<String, Wait>> {
        books(&self.wanted)
    }

    /// Nobody waits for it any more: whoever did, if no result reached
    /// them yet, is handed back.
    fn forget(&mut self, id: &str) -> Option<oneshot::Sender<AssignmentResult>> {
        self.acked_by_taker.remove(id);
        self.books().remove(id).and_then(|w| w.reply)
    }

    /// Its push failed: the step waiting for it errors.
    fn not_queued(&mut self, id: &str, why: &str) {
        if let Some(p) = self.forget(id) {
            let mut r = aborted(id, "");
            r.result = Err(StepError::errored(format!("could not queue the step: {why}")));
            let _ = p.send(r);
        }
    }

    /// The queue of a pending assignment's pool.
    async fn queue_of(&self, id: &str) -> Option<Arc<dyn Queue>> {
        let pool = self.books().get(id).map(|w| w.assignment.pool.clone())?;
        self.pools.get(&pool).await.ok()
    }

    /// Back on the queue with the next epoch (a result of an earlier one is refused).
    async fn requeue(&mut self, id: &str) {
        self.remote.remove(id);
        self.acked_by_taker.remove(id);
        let again = self.books().get_mut(id).map(|w| {
            w.assignment.epoch += 1;
            w.started_at = None;
            w.assignment.clone()
        });
        if let Some(a) = again {
            if let Ok(q) = self.pools.get(&a.pool).await {
                let _ = q.push(a).await;
            }
        }
    }

    async fn cancel(&mut self, id: &str) {
        let removed = match self.queue_of(id).await {
            Some(q) => q.remove(id).await.unwrap_or(false),
            None => false,
        };
        if removed {
            if let Some(p) = self.forget(id) {
                let _ = p.send(aborted(id, "cancelled before it started"));
            }
            return;
        }
        if self.local.cancel(id) {
            return;
        }
        match self.remote.get(id) {
            Some(tx) => send_cancel(tx, id),
            // A worker is taking it: told as soon as it says so (kept with
            // its books, so it goes with them however they close).
            None => {
                if let Some(w) = self.books().get_mut(id) {
                    w.cancel_asked = true;
                }
            }
        }
    }

    /// The ids waited for that `keep` picks.
    fn ids(&self, keep: impl Fn(&str, &Wait) -> bool) -> Vec<String> {
        self.books().iter().filter(|(id, w)| keep(id, w)).map(|(id, _)| id.clone()).collect()
    }
}

impl Actor for DispatcherActor {
    type Msg = DispatchMsg;
    type State = DispatcherState;
    type Arguments = (Arc<Pools>, Cancels, Wanted, Option<Arc<crate::event_hub::EventHub>>, Arc<steppe_worker::metrics::Metrics>);

    async fn pre_start(&self, me: ActorRef<Self::Msg>, (pools, local, wanted, hub, metrics): Self::Arguments) -> Result<Self::State, ActorProcessingErr> {
        let writer = QueueWriter::start(Arc::new(move |id, why| {
            let _ = me.cast(DispatchMsg::NotQueued(id, why));
        }));
        Ok(DispatcherState {
            writer,
            pools,
            local,
            remote: HashMap::new(),
            acked_by_taker: Default::default(),
            wanted,
            metrics,
            hub,
        })
    }

    async fn handle(&self, _me: ActorRef<Self::Msg>, msg: Self::Msg, st: &mut Self::State) -> Result<(), ActorProcessingErr> {
        match msg {
            DispatchMsg::Submit(a) => {
                let id = a.id.clone();
                let pushed = match st.pools.get(&a.pool).await {
                    // A remote queue's push is a round trip: off the actor's path.
                    Ok(q) if q.lease().is_some() => {
                        if st.writer.push(q, a) {
                            Ok(())
                        } else {
                            Err("the coordinator is stopping".to_string())
                        }
                    }
                    Ok(q) => q.push(a).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                if let Err(e) = pushed {
                    st.not_queued(&id, &e);
                }
            }
            DispatchMsg::NotQueued(id, why) => st.not_queued(&id, &why),
            DispatchMsg::Finished(id, epoch) => {
                if st.books().get(&id).is_some_and(|w| w.assignment.epoch != epoch) {
                    // Fencing: an earlier handing-out of a requeued assignment
                    // answered late; the current one still runs and counts.
                    return Ok(());
                }
                st.remote.remove(&id);
                let taker_acks = st.acked_by_taker.remove(&id);
                if let Some(q) = st.queue_of(&id).await {
                    if taker_acks {
                        q.forget(&id);
                    } else if q.lease().is_some() {
                        st.writer.ack(q, id.clone());
                    }
                }
                st.forget(&id);
            }
            DispatchMsg::Cancel(id) => st.cancel(&id).await,
            DispatchMsg::CancelAll => {
                for id in st.ids(|_, _| true) {
                    st.cancel(&id).await;
                }
            }
            DispatchMsg::CancelRun(run) => {
                let prefix = format!("{run}-");
                for id in st.ids(|id, _| id.starts_with(&prefix)) {
                    st.cancel(&id).await;
                }
            }
            DispatchMsg::RunningRemotely(id, tx, taker_acks) => {
                let waited = match st.books().get_mut(&id) {
                    Some(w) => {
                        w.began(&st.metrics);
                        w.remote = true;
                        Some(std::mem::take(&mut w.cancel_asked))
                    }
                    None => None,
                };
                if let Some(cancel_asked) = waited {
                    if cancel_asked {
                        send_cancel(&tx, &id);
                    }
                    if taker_acks {
                        st.acked_by_taker.insert(id.clone());
                    }
                    st.remote.insert(id, tx);
                }
            }
            DispatchMsg::QueueLost(pool) => {
                let same = |p: &str| p == pool || (p.is_empty() && pool == steppe_runtime::queue::DEFAULT_POOL);
                let waiting = st.ids(|id, w| same(&w.assignment.pool) && !st.remote.contains_key(id) && !st.local.is_running(id));
                for id in &waiting {
                    st.requeue(id).await;
                }
                if let Some(hub) = &st.hub {
                    hub.note(&format!("the queue of pool {pool} came back empty (restarted without its data): {} waiting step(s) put back on it", waiting.len()));
                }
            }
            DispatchMsg::Requeue(id) => st.requeue(&id).await,
            DispatchMsg::Dead(dead) => {
                for (a, why) in dead {
                    // Only the current handing-out: an older one's letter says nothing of it.
                    if st.books().get(&a.id).is_some_and(|w| w.assignment.epoch == a.epoch) {
                        st.remote.remove(&a.id);
                        let r = AssignmentResult::with_id(&a.id, a.epoch, Err(StepError::errored(why)));
                        if let Some(p) = st.forget(&a.id) {
                            st.metrics.finished(&r);
                            let _ = p.send(r);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Per pool: what waits, what runs, the oldest wait.
fn figures(books: &HashMap<String, Wait>) -> Vec<PoolFigures> {
    let mut by_pool: std::collections::BTreeMap<String, PoolFigures> = std::collections::BTreeMap::new();
    let now = std::time::Instant::now();
    for w in books.values() {
        let pool = w.pool();
        let f = by_pool.entry(pool.clone()).or_insert_with(|| PoolFigures { pool, ..Default::default() });
        if w.started_at.is_some() {
            f.in_flight += 1;
        } else {
            f.waiting += 1;
            f.oldest_waiting = f.oldest_waiting.max(now.duration_since(w.queued_at));
        }
    }
    by_pool.into_values().collect()
}

/// How often the queues are checked for having lost what waited in them.
const QUEUE_CHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks every pool's queue for a backend that came back empty (a Redis
/// restarted without persistence) and tells the actor, which puts back
/// what waited there; says once when a queue cannot be reached.
fn watch_queues(pools: Arc<Pools>, actor: ActorRef<DispatchMsg>) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(QUEUE_CHECK).await;
            for (pool, q) in pools.named().await {
                match q.ensure().await {
                    Ok(lost) => {
                        if let Some(l) = steppe_runtime::outage::recovered("the queue") {
                            eprintln!("steppe: {l}");
                        }
                        if lost && actor.cast(DispatchMsg::QueueLost(pool)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        if let Some(l) = steppe_runtime::outage::failed("the queue", &e) {
                            eprintln!("steppe: {l}");
                        }
                    }
                }
                if let Ok(dead) = q.dead_letters().await {
                    if !dead.is_empty() && actor.cast(DispatchMsg::Dead(dead)).is_err() {
                        return;
                    }
                }
            }
        }
    });
}

/// The handle to the Dispatcher actor.
pub struct Dispatcher {
    actor: ActorRef<DispatchMsg>,
    pub pools: Arc<Pools>,
    /// Assignments running in this process's workers.
    pub local: Cancels,
    seq: AtomicU64,
    wanted: Wanted,
    /// Runs' spending counters (in the run store), for every worker's agent turns.
    pub ledger: Arc<dyn steppe_runtime::budget::Ledger>,
    /// The figures `--metrics` serves.
    pub metrics: Arc<steppe_worker::metrics::Metrics>,
    /// This dispatcher among every one that ever served its queues (the
    /// process and when it started): what it queues carries it as
    /// `pushed_by`, and a pulling worker runs such an entry, first taken,
    /// without waiting for a Confirm.
    pub incarnation: String,
}

impl Dispatcher {
    pub async fn start(pools: Arc<Pools>, hub: Option<Arc<crate::event_hub::EventHub>>) -> Result<Arc<Self>, ractor::SpawnErr> {
        let local = Cancels::default();
        let wanted = Wanted::default();
        let ledger = Arc::new(steppe_runtime::budget::StoreLedger::new(hub.as_ref().and_then(|h| h.store().cloned())));
        let metrics = Arc::new(steppe_worker::metrics::Metrics::default());
        let (actor, _) = Actor::spawn(None, DispatcherActor, (pools.clone(), local.clone(), wanted.clone(), hub, metrics.clone())).await?;
        watch_queues(pools.clone(), actor.clone());
        let incarnation = steppe_runtime::queue::process_mark();
        Ok(Arc::new(Dispatcher { actor, pools, local, seq: AtomicU64::new(0), wanted, ledger, metrics, incarnation }))
    }

    fn books(&self) -> std::sync::MutexGuard<'_, HashMap<String, Wait>> {
        books(&self.wanted)
    }

    /// Queues the assignment and waits for its result. Dropping the returned
    /// future (a race loser) cancels the assignment wherever it runs.
    pub async fn dispatch(&self, mut a: Assignment) -> AssignmentResult {
        a.id = format!("{}-{}", a.run_id, self.seq.fetch_add(1, Ordering::Relaxed));
        a.pushed_by.clone_from(&self.incarnation);
        let id = a.id.clone();
        let (reply, result) = oneshot::channel();
        let queue = self.pools.get(&a.pool).await.ok();
        let in_process = queue.as_ref().is_some_and(|q| q.lease().is_none());
        self.books().insert(id.clone(), Wait::new(a.clone(), reply, in_process));
        self.metrics.steps_started.inc();
        let mut guard = InFlight { actor: self.actor.clone(), id: id.clone(), done: false };
        // An in-process queue is pushed to here: its worker begins, runs and
        // reports it with no word to the actor. So is a remote queue's
        // hand-over to a session waiting in this process; its push is the
        // actor's (its writer pipelines them and tells a failure).
        let sent = match queue {
            Some(q) if in_process => q.push(a).await.map_err(|e| format!("could not queue the step: {e}")),
            Some(q) => q.hand_over(a).or_else(|a| self.submit(a)),
            None => self.submit(a),
        };
        let r = match sent {
            Ok(()) => result.await.map_err(|_| "the dispatcher stopped before this step finished".to_string()),
            Err(e) => Err(e),
        };
        guard.done = true;
        r.unwrap_or_else(|why| {
            self.books().remove(&id);
            AssignmentResult::with_id(&id, 0, Err(StepError::errored(why)))
        })
    }

    /// Has the actor put it on its remote queue.
    fn submit(&self, a: Assignment) -> Result<(), String> {
        self.actor.cast(DispatchMsg::Submit(a)).map_err(|_| "the dispatcher stopped before this step was queued".to_string())
    }

    /// The whole of a waited-for assignment, as last handed out.
    pub async fn whole(&self, id: &str) -> Option<Assignment> {
        self.books().get(id).map(|w| w.assignment.clone())
    }

    /// Per pool: what waits, what runs, the oldest wait.
    pub async fn figures(&self) -> Vec<PoolFigures> {
        figures(&self.books())
    }

    /// Assignments no worker has begun after `longer_than`, each told once.
    pub async fn long_waits(&self, longer_than: std::time::Duration) -> Vec<LongWait> {
        let now = std::time::Instant::now();
        let mut long = Vec::new();
        for w in self.books().values_mut() {
            let waited = now.duration_since(w.queued_at);
            if waited >= longer_than && w.started_at.is_none() && !w.told_waiting {
                w.told_waiting = true;
                let a = &w.assignment;
                long.push(LongWait { run_id: a.run_id.clone(), step: a.step.clone(), pool: w.pool(), waited });
            }
        }
        long
    }

    /// A pushed session's worker runs it (the coordinator took it off the queue).
    pub fn running_remotely(&self, id: &str, tx: SessionTx) {
        let _ = self.actor.cast(DispatchMsg::RunningRemotely(id.to_string(), tx, false));
    }

    /// A pulling worker took it off the queue (and acknowledges it there itself).
    pub fn taken_by_worker(&self, id: &str, tx: SessionTx) {
        let _ = self.actor.cast(DispatchMsg::RunningRemotely(id.to_string(), tx, true));
    }

    /// Puts a pending assignment back on the queue with the next epoch.
    pub fn requeue(&self, id: &str) {
        let _ = self.actor.cast(DispatchMsg::Requeue(id.to_string()));
    }

    pub fn cancel_all(&self) {
        let _ = self.actor.cast(DispatchMsg::CancelAll);
    }

    pub fn cancel_run(&self, run_id: &str) {
        let _ = self.actor.cast(DispatchMsg::CancelRun(run_id.to_string()));
    }
}

impl Reporter for Dispatcher {
    /// The result goes straight to whoever waits for its epoch (once: a
    /// duplicate finds the waiter gone). An in-process queue's books close
    /// here; the actor closes the rest (a remote queue's acknowledgement,
    /// the session that ran it).
    fn complete(&self, r: AssignmentResult) {
        let (id, epoch) = (r.assignment_id.clone(), r.epoch);
        let mut books = self.books();
        let (reply, closed) = match books.get_mut(&id) {
            // Fencing: an earlier handing-out of a requeued assignment
            // answered late; the current one still runs and counts.
            Some(w) if w.assignment.epoch != epoch => return,
            Some(w) => {
                let began = w.started_at.unwrap_or(w.queued_at);
                self.metrics.run_seconds.observe(began.elapsed().as_secs_f64());
                (w.reply.take(), w.unleased && !w.remote)
            }
            // Nobody waits for it (a cancelled race loser, a duplicate).
            None => (None, false),
        };
        if closed {
            books.remove(&id);
        }
        drop(books);
        if let Some(reply) = reply {
            self.metrics.finished(&r);
            let _ = reply.send(r);
        }
        if !closed {
            let _ = self.actor.cast(DispatchMsg::Finished(id, epoch));
        }
    }

    fn wanted(&self, id: &str, epoch: u32) -> bool {
        self.books().get(id).map(|w| w.assignment.epoch) == Some(epoch)
    }

    fn ledger(&self) -> Option<Arc<dyn steppe_runtime::budget::Ledger>> {
        Some(self.ledger.clone())
    }

    fn started(&self, id: &str) {
        if let Some(w) = self.books().get_mut(id) {
            w.began(&self.metrics);
        }
    }
}

struct InFlight {
    actor: ActorRef<DispatchMsg>,
    id: String,
    done: bool,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.actor.cast(DispatchMsg::Cancel(self.id.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steppe_runtime::queue::InProcessQueue;

    fn result(id: &str, epoch: u32, stdout: &str) -> AssignmentResult {
        AssignmentResult { exit_code: Some(0), stdout: stdout.into(), ..AssignmentResult::with_id(id, epoch, Ok(())) }
    }

    /// A dispatcher over an in-process queue, one step dispatched on it and
    /// waited for, and that step as its worker takes it.
    async fn one_dispatched() -> (Arc<Dispatcher>, tokio::task::JoinHandle<AssignmentResult>, Assignment) {
        let d = Dispatcher::start(Arc::new(Pools::in_process(Arc::new(InProcessQueue::new()))), None).await.expect("dispatcher");
        let d2 = d.clone();
        let waiter = tokio::spawn(async move { d2.dispatch(Assignment::command("r", "s", "true".into())).await });
        let taken = d.pools.default_pool().pop().await.expect("handed out");
        (d, waiter, taken)
    }

    #[tokio::test]
    async fn a_result_from_an_earlier_epoch_is_refused() {
        let (d, waiter, first) = one_dispatched().await;
        assert_eq!(first.epoch, 0);
        // Its worker was lost: handed out again, with the next epoch.
        d.requeue(&first.id);
        let second = d.pools.default_pool().pop().await.expect("handed out again");
        assert_eq!((second.id.as_str(), second.epoch), (first.id.as_str(), 1));
        // The lost worker answers late: refused; the current holder's answer counts.
        d.complete(result(&first.id, 0, "stale"));
        d.complete(result(&second.id, 1, "current"));
        let r = waiter.await.expect("join");
        assert_eq!(r.stdout, "current");
    }

    /// A result reaches its waiter once: a second of the same epoch (a
    /// worker that reported twice) is neither delivered nor counted, and the
    /// books of an assignment the step's own task queued close with it.
    #[tokio::test]
    async fn a_result_is_delivered_and_counted_once() {
        let (d, waiter, a) = one_dispatched().await;
        let figures = d.figures().await;
        assert_eq!(figures.iter().map(|f| f.waiting + f.in_flight).sum::<i64>(), 1, "the step's own task booked what it queued");
        d.complete(result(&a.id, 0, "first"));
        d.complete(result(&a.id, 0, "second"));
        let r = waiter.await.expect("join");
        assert_eq!(r.stdout, "first");
        let ok = d.metrics.steps_finished.get_or_create(&steppe_worker::metrics::OutcomeLabel { outcome: "succeeded".into() }).get();
        assert_eq!(ok, 1);
        assert!(d.figures().await.iter().all(|f| f.waiting + f.in_flight == 0), "its books are closed");
        assert!(!d.wanted(&a.id, 0), "nobody waits for it any more");
    }

    /// A queue that gives up on everything pushed to it, once taken, as a
    /// dead-letter queue would after its deliveries ran out.
    struct GivesUp {
        inner: InProcessQueue,
        dead: std::sync::Mutex<Vec<Assignment>>,
    }

    impl Queue for GivesUp {
        fn push(&self, a: Assignment) -> steppe_runtime::queue::BoxFuture<'_, Result<(), steppe_runtime::queue::QueueError>> {
            self.inner.push(a)
        }
        fn pop(&self) -> steppe_runtime::queue::BoxFuture<'_, Result<Assignment, steppe_runtime::queue::QueueError>> {
            Box::pin(async move {
                let a = self.inner.pop().await?;
                self.dead.lock().expect("dead").push(a.clone());
                Ok(a)
            })
        }
        fn pop_within(&self, wait: std::time::Duration) -> steppe_runtime::queue::BoxFuture<'_, Result<Option<Assignment>, steppe_runtime::queue::QueueError>> {
            self.inner.pop_within(wait)
        }
        fn ack(&self, id: &str) -> steppe_runtime::queue::BoxFuture<'_, Result<(), steppe_runtime::queue::QueueError>> {
            self.inner.ack(id)
        }
        fn remove(&self, id: &str) -> steppe_runtime::queue::BoxFuture<'_, Result<bool, steppe_runtime::queue::QueueError>> {
            self.inner.remove(id)
        }
        fn dead_letters(&self) -> steppe_runtime::queue::BoxFuture<'_, Result<Vec<(Assignment, String)>, steppe_runtime::queue::QueueError>> {
            let dead: Vec<(Assignment, String)> = self.dead.lock().expect("dead").drain(..).map(|a| (a, "went to the dead-letter queue q-dead".to_string())).collect();
            Box::pin(async move { Ok(dead) })
        }
    }

    /// A dead letter of the current handing-out errors its step with the
    /// queue's words, counted as an errored step.
    #[tokio::test]
    async fn a_dead_letter_errors_its_step_naming_the_queue() {
        let q = Arc::new(GivesUp { inner: InProcessQueue::new(), dead: Default::default() });
        let d = Dispatcher::start(Arc::new(Pools::in_process(q.clone())), None).await.expect("dispatcher");
        let d2 = d.clone();
        let waiter = tokio::spawn(async move { d2.dispatch(Assignment::command("r", "s", "true".into())).await });
        let taken = q.pop().await.expect("taken");
        let r = tokio::time::timeout(std::time::Duration::from_secs(10), waiter).await.expect("within the queue check").expect("join");
        assert_eq!(r.assignment_id, taken.id);
        let e = r.result.expect_err("errored");
        assert_eq!(e.class, steppe_runtime::outcome::Class::Errored);
        assert!(e.message.contains("dead-letter queue q-dead"), "{}", e.message);
        assert_eq!(d.metrics.steps_finished.get_or_create(&steppe_worker::metrics::OutcomeLabel { outcome: "errored".into() }).get(), 1);
    }
}
