//! RunActor: one per run, owning the walk of its job's plan. A panic while
//! walking ends this run as errored; the process and other runs go on.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use steppe_runtime::outcome::StepError;

use crate::engine::{Engine, JobResult, JobRun};

pub struct RunActor;

pub enum RunMsg {
    /// Walk the plan; reply with the job's result.
    Start(RpcReplyPort<JobResult>),
}

impl Actor for RunActor {
    type Msg = RunMsg;
    type State = Arc<JobRun>;
    type Arguments = Arc<JobRun>;

    async fn pre_start(&self, _me: ActorRef<RunMsg>, run: Arc<JobRun>) -> Result<Arc<JobRun>, ActorProcessingErr> {
        Ok(run)
    }

    async fn handle(&self, me: ActorRef<RunMsg>, msg: RunMsg, run: &mut Arc<JobRun>) -> Result<(), ActorProcessingErr> {
        match msg {
            RunMsg::Start(reply) => {
                let r = run.run().await;
                let _ = reply.send(r);
                me.stop(None);
            }
        }
        Ok(())
    }
}

/// Runs `run` in its own RunActor and waits for its result.
pub async fn run_in_actor(run: Arc<JobRun>) -> JobResult {
    let internal = |m: String| JobResult { result: Err(StepError::errored(m)), build_ok: false, log: Vec::new() };
    let (actor, handle) = match Actor::spawn(None, RunActor, run).await {
        Ok(x) => x,
        Err(e) => return internal(format!("internal error: could not start the run: {e}")),
    };
    let r = actor.call(RunMsg::Start, None).await;
    let _ = handle.await;
    match r {
        Ok(ractor::rpc::CallResult::Success(r)) => r,
        Ok(_) | Err(_) => internal("internal error: the run's actor stopped (a panic while walking the plan); see stderr".into()),
    }
}

/// A run's id: its start time, this process, and a count, so two runs begun
/// in the same millisecond (two submissions at once) never share one.
pub fn run_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("r-{t:x}-{}-{n}", std::process::id())
}

/// Runs one job in its actor, turning Ctrl-C and SIGTERM into an abort
/// (steps killed, hooks get their grace).
pub async fn run_until_signal(engine: &Arc<Engine>, job: &steppe_language::model::Job, id: String) -> JobResult {
    run_until_signal_from(engine, JobRun::new(engine.clone(), job.clone(), id)).await
}

/// As [`run_until_signal`], for a run made already (one that continues another).
pub async fn run_until_signal_from(engine: &Arc<Engine>, run: Arc<JobRun>) -> JobResult {
    let fut = run_in_actor(run);
    tokio::pin!(fut);
    // Ctrl-C and SIGTERM abort alike: steps are killed (their process
    // groups whole), hooks get their grace.
    tokio::select! {
        r = &mut fut => r,
        _ = tokio::signal::ctrl_c() => {
            warn!("steppe: interrupted; stopping (hooks get their grace)");
            engine.abort();
            fut.await
        }
        _ = terminated() => {
            warn!("steppe: terminated; stopping (hooks get their grace)");
            engine.abort();
            fut.await
        }
    }
}

/// Resolves at the first Ctrl-C or SIGTERM.
pub async fn stopped() {
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated() => {}
    }
}

/// Resolves when this process gets SIGTERM.
pub async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut t) => {
            t.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}
