//! The WorkerRegistry actor: which workers are connected, their capacity,
//! and when each was last heard from.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::event_hub::EventHub;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerInfo {
    pub name: String,
    pub slots: u32,
    pub remote: bool,
    pub pool: String,
    /// It reached a Docker engine when it started (serves container steps).
    pub containers: bool,
    pub last_seen_ago: Duration,
}

impl WorkerInfo {
    /// Whether it takes from the queue of `pool`: its pool's, or — a worker
    /// that runs containers — its pool's container queue (`POOL.containers`).
    pub fn serves(&self, pool: &str) -> bool {
        match pool.strip_suffix(steppe_runtime::queue::CONTAINERS) {
            Some(base) => self.pool == base && self.containers,
            None => self.pool == pool,
        }
    }
}

pub enum RegistryMsg {
    Joined { name: String, slots: u32, remote: bool, pool: String, containers: bool },
    Heartbeat { name: String },
    Left { name: String, requeued: usize },
    /// Silent past its lease: fenced off, what it held requeued.
    LeaseEnded { name: String, requeued: usize, lease: Duration },
    /// A fenced worker reported a result: not recorded.
    Refused { name: String, assignment: String },
    List(RpcReplyPort<Vec<WorkerInfo>>),
}

struct RegistryActor;

pub struct RegistryState {
    workers: BTreeMap<String, (WorkerInfo, Instant)>,
    hub: Arc<EventHub>,
}

impl Actor for RegistryActor {
    type Msg = RegistryMsg;
    type State = RegistryState;
    type Arguments = Arc<EventHub>;

    async fn pre_start(&self, _me: ActorRef<RegistryMsg>, hub: Arc<EventHub>) -> Result<RegistryState, ActorProcessingErr> {
        Ok(RegistryState { workers: BTreeMap::new(), hub })
    }

    async fn handle(&self, _me: ActorRef<RegistryMsg>, msg: RegistryMsg, st: &mut RegistryState) -> Result<(), ActorProcessingErr> {
        match msg {
            RegistryMsg::Joined { name, slots, remote, pool, containers } => {
                if remote {
                    let in_pool = if pool == steppe_runtime::queue::DEFAULT_POOL { String::new() } else { format!(", pool {pool}") };
                    let docker = if containers { ", runs containers" } else { ", no Docker engine: steps with an image go to other workers" };
                    st.hub.note(&format!("worker {name} joined ({slots} slot(s){in_pool}{docker})"));
                }
                let info = WorkerInfo { name: name.clone(), slots, remote, pool, containers, last_seen_ago: Duration::ZERO };
                st.workers.insert(name, (info, Instant::now()));
            }
            RegistryMsg::Heartbeat { name } => {
                if let Some(w) = st.workers.get_mut(&name) {
                    w.1 = Instant::now();
                }
            }
            RegistryMsg::Left { name, requeued } => {
                st.workers.remove(&name);
                let extra = if requeued > 0 { format!("; {requeued} assignment(s) requeued") } else { String::new() };
                st.hub.note(&format!("worker {name} left{extra}"));
            }
            RegistryMsg::LeaseEnded { name, requeued, lease } => {
                st.workers.remove(&name);
                st.hub.note(&format!("worker {name} silent for {}s: its lease ended; {requeued} assignment(s) requeued", lease.as_secs()));
            }
            RegistryMsg::Refused { name, assignment } => {
                st.hub.note(&format!("refused a late result for {assignment} from worker {name}: its lease had ended"));
            }
            RegistryMsg::List(reply) => {
                let list = st
                    .workers
                    .iter()
                    .map(|(_, (info, seen))| WorkerInfo { last_seen_ago: seen.elapsed(), ..info.clone() })
                    .collect();
                let _ = reply.send(list);
            }
        }
        Ok(())
    }
}

/// The handle to the WorkerRegistry actor.
#[derive(Clone)]
pub struct WorkerRegistry {
    actor: ActorRef<RegistryMsg>,
}

impl WorkerRegistry {
    pub async fn start(hub: Arc<EventHub>) -> Result<Self, ractor::SpawnErr> {
        let (actor, _) = Actor::spawn(None, RegistryActor, hub).await?;
        Ok(WorkerRegistry { actor })
    }

    pub fn joined(&self, name: &str, slots: u32, remote: bool, pool: &str, containers: bool) {
        let _ = self.actor.cast(RegistryMsg::Joined { name: name.to_string(), slots, remote, pool: pool.to_string(), containers });
    }

    pub fn heartbeat(&self, name: &str) {
        let _ = self.actor.cast(RegistryMsg::Heartbeat { name: name.to_string() });
    }

    pub fn left(&self, name: &str, requeued: usize) {
        let _ = self.actor.cast(RegistryMsg::Left { name: name.to_string(), requeued });
    }

    pub fn lease_ended(&self, name: &str, requeued: usize, lease: Duration) {
        let _ = self.actor.cast(RegistryMsg::LeaseEnded { name: name.to_string(), requeued, lease });
    }

    pub fn refused(&self, name: &str, assignment: &str) {
        let _ = self.actor.cast(RegistryMsg::Refused { name: name.to_string(), assignment: assignment.to_string() });
    }

    pub async fn list(&self) -> Vec<WorkerInfo> {
        match self.actor.call(RegistryMsg::List, Some(Duration::from_secs(5))).await {
            Ok(ractor::rpc::CallResult::Success(v)) => v,
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tracks_joins_heartbeats_and_leaves() {
        let hub = Arc::new(EventHub::start(true, None).await.unwrap());
        let r = WorkerRegistry::start(hub).await.unwrap();
        r.joined("local", 2, false, "default", false);
        r.joined("w1", 4, true, "gpu", true);
        r.heartbeat("w1");
        let list = r.list().await;
        assert_eq!(
            list.iter().map(|w| (w.name.as_str(), w.slots, w.remote, w.pool.as_str(), w.containers)).collect::<Vec<_>>(),
            [("local", 2, false, "default", false), ("w1", 4, true, "gpu", true)]
        );
        r.left("w1", 1);
        assert_eq!(r.list().await.len(), 1);
    }
}
