//! The worker service: remote workers hold a session here and take
//! assignments from the same queue local workers pull from.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use steppe_proto::v1::coordinator_server::Coordinator;
use steppe_proto::v1::{coordinator_message, worker_message, CoordinatorMessage, SpendReply, SpendRequest, Welcome, WorkerMessage};
use steppe_worker::sink::{LineSink, Stream};
use steppe_runtime::queue::{check_pool_name, pool_key, DEFAULT_POOL};
use steppe_worker::local::Reporter;
use steppe_runtime::assignment::AssignmentResult;
use steppe_runtime::outcome::StepError;
use steppe_runtime::wire::{restore_payload, result_from_wire};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::dispatch::Dispatcher;
use crate::hand_over::InFlight;
use crate::registry::WorkerRegistry;

/// Most assignments a session's puller takes from the queue in one read.
const PULL_BATCH: usize = 64;

pub struct WorkerService {
    /// Who may serve which pools (worker and admin tokens).
    pub callers: steppe_runtime::auth::Callers,
    pub dispatcher: Arc<Dispatcher>,
    pub sink: Arc<crate::event_hub::EventHub>,
    pub artifact_dir: PathBuf,
    /// The id in the artifact directory's `.steppe-store-id`: a worker that
    /// reads it there shares the directory, any other streams artifacts.
    pub store_id: String,
    /// Where a large result's text (sent by reference) is read from.
    pub store: Arc<dyn steppe_runtime::artifacts::ArtifactStore>,
    pub registry: WorkerRegistry,
    /// A session silent this long (no heartbeat, no line, no result) is
    /// fenced: its assignments are requeued and whatever it says later is
    /// refused. Workers are told to heartbeat three times per lease.
    pub lease: std::time::Duration,
    /// The shared queue's stream key (of the default pool) and lease, which workers started with
    /// `--queue` take assignments from themselves (None: an in-process queue).
    pub pull_queue: Option<(String, std::time::Duration)>,
    /// This coordinator lives for one run (`steppe run --listen`): its
    /// workers exit when it goes, instead of waiting for it to come back.
    pub ephemeral: bool,
    /// Where large results are unpacked while they are read back.
    pub scratch: PathBuf,
    /// Artifacts' object store (s3://…), told to workers; "" for a directory.
    pub artifact_url: String,
}

/// Tells a session's puller to take nothing more (also when the session's
/// reader ends and drops it).
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl StopOnDrop {
    fn stop(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

impl WorkerService {
    /// A worker of a team files questions only under that team's runs.
    async fn check_run_team(&self, who: &steppe_runtime::auth::Identity, run_id: &str) -> Result<(), Status> {
        let Some(store) = self.sink.store().cloned() else { return Ok(()) };
        let id = run_id.to_string();
        let run = tokio::task::spawn_blocking(move || store.run(&id)).await.map_err(|e| Status::internal(e.to_string()))?.map_err(|e| Status::unavailable(e.to_string()))?;
        match run {
            Some(r) if who.sees(&r.team) => Ok(()),
            _ => Err(Status::not_found(format!("no run {run_id} for your team"))),
        }
    }
}

#[tonic::async_trait]
impl Coordinator for WorkerService {
    type SessionStream = ReceiverStream<Result<CoordinatorMessage, Status>>;

    async fn spend(&self, req: Request<SpendRequest>) -> Result<Response<SpendReply>, Status> {
        steppe_runtime::auth::require(steppe_runtime::auth::Identity::of(&req), &[steppe_runtime::auth::Role::Worker, steppe_runtime::auth::Role::Admin], "report token spending")?;
        let SpendRequest { counter, tokens } = req.into_inner();
        steppe_runtime::budget::check_counter(&counter).map_err(Status::invalid_argument)?;
        match self.dispatcher.ledger.spend(&counter, tokens).await {
            Ok(total) => Ok(Response::new(SpendReply { total })),
            Err(e) => Err(Status::unavailable(format!("recording spending on {counter}: {e}"))),
        }
    }

    async fn ask(&self, req: Request<steppe_proto::v1::QuestionRecord>) -> Result<Response<steppe_proto::v1::AskReply>, Status> {
        let who = steppe_runtime::auth::require(steppe_runtime::auth::Identity::of(&req), &[steppe_runtime::auth::Role::Worker, steppe_runtime::auth::Role::Admin], "ask a question")?;
        let q = steppe_runtime::wire::history::question_from_wire(req.into_inner());
        self.check_run_team(&who, &q.run_id).await?;
        match self.dispatcher.ledger.ask(q).await {
            Ok((q, filed)) => Ok(Response::new(steppe_proto::v1::AskReply { question: Some(steppe_runtime::wire::history::question_to_wire(q)), filed })),
            Err(e) => Err(Status::unavailable(format!("filing a question: {e}"))),
        }
    }

    async fn question(&self, req: Request<steppe_proto::v1::QuestionRef>) -> Result<Response<steppe_proto::v1::FoundQuestion>, Status> {
        let who = steppe_runtime::auth::require(steppe_runtime::auth::Identity::of(&req), &[steppe_runtime::auth::Role::Worker, steppe_runtime::auth::Role::Admin], "read a question")?;
        match self.dispatcher.ledger.question(req.into_inner().id).await {
            // Another team's question is answered as one that does not exist.
            Ok(q) => Ok(Response::new(steppe_proto::v1::FoundQuestion { question: q.filter(|q| who.sees(&q.team)).map(steppe_runtime::wire::history::question_to_wire) })),
            Err(e) => Err(Status::unavailable(format!("reading a question: {e}"))),
        }
    }

    async fn settle(&self, req: Request<steppe_proto::v1::SettleRequest>) -> Result<Response<steppe_proto::v1::SettleReply>, Status> {
        let who = steppe_runtime::auth::require(steppe_runtime::auth::Identity::of(&req), &[steppe_runtime::auth::Role::Worker, steppe_runtime::auth::Role::Admin], "answer a question")?;
        let r = req.into_inner();
        match self.dispatcher.ledger.question(r.id).await {
            Ok(Some(q)) if who.sees(&q.team) => {}
            Ok(_) => return Err(Status::not_found(format!("no question {} for your team", r.id))),
            Err(e) => return Err(Status::unavailable(format!("reading a question: {e}"))),
        }
        match self.dispatcher.ledger.settle(r.id, r.answer.as_deref(), &r.source).await {
            Ok(settled) => Ok(Response::new(steppe_proto::v1::SettleReply { settled })),
            Err(e) => Err(Status::unavailable(format!("recording an answer: {e}"))),
        }
    }

    async fn session(&self, req: Request<Streaming<WorkerMessage>>) -> Result<Response<Self::SessionStream>, Status> {
        let peer = req.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        let who = steppe_runtime::auth::require(steppe_runtime::auth::Identity::of(&req), &[steppe_runtime::auth::Role::Worker, steppe_runtime::auth::Role::Admin], "serve assignments")?;
        let mut inbound = req.into_inner();
        let hello = match inbound.message().await? {
            Some(WorkerMessage { msg: Some(worker_message::Msg::Hello(h)) }) => h,
            _ => return Err(Status::invalid_argument("a session starts with Hello")),
        };
        let slots = hello.slots.clamp(1, 1024) as usize;
        let name = if hello.worker.is_empty() { peer.clone() } else { hello.worker };
        let pool = if hello.pool.is_empty() { DEFAULT_POOL.to_string() } else { hello.pool };
        check_pool_name(&pool).map_err(Status::invalid_argument)?;
        if let Err(e) = who.may_serve(&pool, steppe_runtime::auth::pool_owner(&self.callers, &pool).as_deref()) {
            self.sink.note(&format!("refused worker {name} from {peer}: {e}"));
            return Err(Status::permission_denied(e));
        }
        let queue = self.dispatcher.pools.get(&pool).await.map_err(|e| Status::unavailable(e.to_string()))?;
        // A worker that reaches a Docker engine also takes its pool's steps with an image.
        // (A pulling one is told the container queue's stream, made here.)
        let queue: Arc<dyn steppe_runtime::queue::Queue> = if hello.containers {
            let boxed = self.dispatcher.pools.get(&steppe_runtime::queue::container_pool(&pool)).await.map_err(|e| Status::unavailable(e.to_string()))?;
            Arc::new(steppe_runtime::queue::Merged::new(boxed, queue))
        } else {
            queue
        };
        let (queue_key, queue_lease_ms) = match (&self.pull_queue, hello.pulls) {
            (Some((base, lease)), true) => (pool_key(base, &pool), u64::try_from(lease.as_millis()).unwrap_or(60_000)),
            (None, true) => {
                return Err(Status::failed_precondition(
                    "this coordinator's queue is in its own memory: start it with --queue redis://… or sqs://…, or start the worker without --queue",
                ))
            }
            (_, false) => (String::new(), 0),
        };
        self.registry.joined(&name, slots as u32, true, &pool, hello.containers);
        // A pulling worker that takes hand-overs is handed work while it waits.
        let hands_over = hello.pulls && hello.takes_hand_overs;
        let (tx, rx) = mpsc::channel(256);
        let welcome = CoordinatorMessage {
            msg: Some(coordinator_message::Msg::Welcome(Welcome {
                artifact_dir: self.artifact_dir.to_string_lossy().into_owned(),
                store_id: self.store_id.clone(),
                heartbeat_ms: u64::try_from(self.lease.as_millis() / 3).unwrap_or(5000),
                queue_key,
                queue_lease_ms,
                ephemeral: self.ephemeral,
                artifact_url: self.artifact_url.clone(),
                container_queue_key: match (&self.pull_queue, hello.pulls && hello.containers) {
                    (Some((base, _)), true) => pool_key(base, &steppe_runtime::queue::container_pool(&pool)),
                    _ => String::new(),
                },
                incarnation: self.dispatcher.incarnation.clone(),
                hands_over,
            })),
        };
        tx.send(Ok(welcome)).await.map_err(|_| Status::aborted("session closed"))?;

        let inflight: InFlight = Arc::new(Mutex::new(HashMap::new()));
        let slots_sem = Arc::new(Semaphore::new(slots));
        let d = self.dispatcher.clone();
        let (ptx, pflight, hub) = (tx.clone(), inflight.clone(), self.sink.clone());
        // The puller is stopped by this flag, never aborted: a pop cut short
        // could leave a Redis entry delivered to nobody until its lease ends.
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_seen = stopping.clone();
        let puller = StopOnDrop(stopping.clone());
        let waiting = crate::hand_over::Waiting::new();
        if hands_over {
            crate::hand_over::spawn(queue.clone(), d.clone(), ptx.clone(), pflight.clone(), &waiting, stopping.clone());
        }
        // A pulling worker takes from the queue itself.
        let pushes_to_worker = !hello.pulls;
        tokio::spawn(async move {
            if !pushes_to_worker {
                return;
            }
            use std::sync::atomic::Ordering;
            loop {
                let Ok(permit) = slots_sem.clone().acquire_owned().await else { return };
                // As many as are free, taken in one read: a worker of many
                // slots is not filled one round trip at a time.
                let mut permits = vec![permit];
                while permits.len() < PULL_BATCH {
                    match slots_sem.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                if stop_seen.load(Ordering::SeqCst) {
                    return;
                }
                let taken = match queue.pop_up_to(permits.len(), std::time::Duration::from_secs(1)).await {
                    Ok(taken) if taken.is_empty() => {
                        if let Some(l) = steppe_runtime::outage::recovered("taking from the queue") {
                            hub.note(&format!("steppe: {l}"));
                        }
                        continue;
                    }
                    Ok(taken) => taken,
                    Err(e) => {
                        if let Some(l) = steppe_runtime::outage::failed("taking from the queue", &e) {
                            hub.note(&format!("steppe: {l}"));
                        }
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let mut stopped = false;
                for a in taken {
                    let a = match a {
                        Ok(a) => a,
                        Err(e) => {
                            // One entry it could not read (moved aside): on to the next.
                            hub.note(&format!("steppe: {e}"));
                            continue;
                        }
                    };
                    if stopped {
                        d.requeue(&a.id);
                        continue;
                    }
                    if !d.wanted(&a.id, a.epoch) {
                        // Left on a shared queue by a coordinator that is gone.
                        hub.note(&format!("dropped assignment {} ({}): no run here waits for it", a.id, a.step));
                        let _ = queue.ack(&a.id).await;
                        continue;
                    }
                    let Some(permit) = permits.pop() else {
                        // More than asked for (a queue that ignores the count): back it goes.
                        d.requeue(&a.id);
                        continue;
                    };
                    stopped = !crate::hand_over::send_held(&a, Some(permit), &ptx, &pflight, &d, &stop_seen).await;
                }
                if stopped {
                    return;
                }
            }
        });
        let (d, sink, registry, lease, store, scratch) = (self.dispatcher.clone(), self.sink.clone(), self.registry.clone(), self.lease, self.store.clone(), self.scratch.clone());
        // The reader owns the session's sender: the worker's stream stays open
        // exactly as long as the coordinator reads it (a fenced worker must
        // still be able to report, and be refused).
        let session_tx = tx;
        let pulls = hello.pulls;
        tokio::spawn(async move {
            // Everything this session holds goes back on the queue; the ids it held.
            let requeue_all = || -> std::collections::HashSet<String> {
                let lost: std::collections::HashSet<String> = inflight.lock().map(|mut m| m.drain().map(|(id, _)| id).collect()).unwrap_or_default();
                for id in &lost {
                    d.requeue(id);
                }
                lost
            };
            // Once fenced: the assignments it held, which it may still report on.
            let mut fenced: Option<std::collections::HashSet<String>> = None;
            let mut silent_leases = 0u32;
            let reader = async {
                loop {
                    let m = match tokio::time::timeout(lease, inbound.message()).await {
                        Err(_silent) if fenced.is_some() => {
                            silent_leases += 1;
                            if silent_leases >= 10 {
                                break;
                            }
                            continue;
                        }
                        Err(_silent) => {
                            // Cut off or frozen: its work goes to others, and the
                            // session is fenced so a late result cannot count twice.
                            puller.stop();
                            let held = requeue_all();
                            registry.lease_ended(&name, held.len(), lease);
                            fenced = Some(held);
                            continue;
                        }
                        Ok(m) => m,
                    };
                    match m {
                        Ok(Some(WorkerMessage { msg: Some(m) })) if fenced.is_some() => {
                            // Heard from again: nothing it says counts; the session
                            // closes once it has reported on what it held.
                            silent_leases = 0;
                            if let (worker_message::Msg::Result(r), Some(held)) = (m, fenced.as_mut()) {
                                registry.refused(&name, &r.assignment_id);
                                held.remove(&r.assignment_id);
                                if held.is_empty() {
                                    break;
                                }
                            }
                        }
                        Ok(Some(WorkerMessage { msg: Some(m) })) => match m {
                            worker_message::Msg::Line(l) => {
                                sink.line(&l.run_id, &l.step, if l.stderr { Stream::Stderr } else { Stream::Stdout }, &l.line);
                            }
                            worker_message::Msg::Result(mut r) => {
                                // Fencing by assignment id: only what this session holds counts.
                                let held = inflight.lock().ok().and_then(|mut m| m.remove(&r.assignment_id));
                                if let Some(slot) = held {
                                    if slot.is_some() {
                                        // The slot is free: the session's puller gets in line
                                        // for it before the result goes on, as a pulling worker's
                                        // hand-over does (`Waiting::said`), so the step this
                                        // result ends hands its next to it, not through the queue.
                                        drop(slot);
                                        tokio::task::yield_now().await;
                                    }
                                    if r.payload.is_some() {
                                        let (store, id, epoch, scratch) = (store.clone(), r.assignment_id.clone(), r.epoch, scratch.clone());
                                        let unreadable = |e: &dyn std::fmt::Display| format!("the step's output could not be read back: {e}");
                                        r = match tokio::task::spawn_blocking(move || {
                                            if let Err(e) = restore_payload(&mut r, store.as_ref(), &scratch) {
                                                r.class = steppe_proto::v1::OutcomeClass::Errored as i32;
                                                r.message = unreadable(&e);
                                            }
                                            r
                                        })
                                        .await
                                        {
                                            Ok(r) => r,
                                            Err(e) => steppe_proto::v1::AssignmentResult {
                                                assignment_id: id,
                                                epoch,
                                                class: steppe_proto::v1::OutcomeClass::Errored as i32,
                                                message: unreadable(&e),
                                                ..Default::default()
                                            },
                                        };
                                    }
                                    let (id, epoch) = (r.assignment_id.clone(), r.epoch);
                                    d.complete(result_from_wire(r).unwrap_or_else(|e| {
                                        let message = format!("the result from worker {name} could not be read: {e}");
                                        AssignmentResult::with_id(&id, epoch, Err(StepError::errored(message)))
                                    }));
                                } else {
                                    registry.refused(&name, &r.assignment_id);
                                }
                            }
                            worker_message::Msg::Heartbeat(_) => registry.heartbeat(&name),
                            worker_message::Msg::Drain(_) => {
                                // Nothing more for this worker; what it runs still reports here.
                                puller.stop();
                                waiting.said(false).await;
                            }
                            worker_message::Msg::Release(r) => {
                                if inflight.lock().ok().and_then(|mut m| m.remove(&r.assignment_id)).is_some() {
                                    d.requeue(&r.assignment_id);
                                }
                            }
                            worker_message::Msg::Taken(t) if pulls && !d.wanted(&t.assignment_id, t.epoch) => {
                                // Nobody here waits for it: the worker drops it unrun.
                                sink.note(&format!("dropped assignment {}: no run here waits for it", t.assignment_id));
                                let cancel = CoordinatorMessage { msg: Some(coordinator_message::Msg::Cancel(steppe_proto::v1::Cancel { assignment_id: t.assignment_id })) };
                                let _ = session_tx.send(Ok(cancel)).await;
                            }
                            worker_message::Msg::Taken(t) if pulls => {
                                d.taken_by_worker(&t.assignment_id, session_tx.clone());
                                if let Ok(mut m) = inflight.lock() {
                                    m.insert(t.assignment_id.clone(), None);
                                }
                                if t.started {
                                    continue;
                                }
                                // A stand-in taken off the queue: the whole assignment goes with the Confirm.
                                let assignment = if t.by_reference { d.whole(&t.assignment_id).await.map(|a| steppe_runtime::wire::assignment_to_wire(&a)) } else { None };
                                let confirm = CoordinatorMessage { msg: Some(coordinator_message::Msg::Confirm(steppe_proto::v1::Confirm { assignment_id: t.assignment_id, assignment })) };
                                let _ = session_tx.send(Ok(confirm)).await;
                            }
                            worker_message::Msg::Taken(_) => {}
                            worker_message::Msg::Waiting(w) if hands_over => waiting.said(w.waiting).await,
                            worker_message::Msg::Waiting(_) | worker_message::Msg::Hello(_) => {}
                        },
                        Ok(Some(WorkerMessage { msg: None })) => {}
                        Ok(None) | Err(_) => break,
                    }
                }
            };
            // A panic handling this session ends this session only; what it
            // held goes back on the queue like any lost worker's.
            if futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(reader)).await.is_err() {
                sink.note(&format!("the session of worker {name} failed inside the coordinator; what it held goes back on the queue"));
            }
            // The worker is gone (or fenced and heard from again, and now
            // told to go): what it held goes back on the queue.
            puller.stop();
            registry.left(&name, requeue_all().len());
            drop(session_tx);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
