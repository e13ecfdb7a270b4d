//! RunActor: one per run, owning the walk of its job's plan. A panic while
//! walking ends this run as errored; the process and other runs go on.

use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use steppe_runtime::outcome::StepError;

use crate::engine::{JobResult, JobRun};

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
