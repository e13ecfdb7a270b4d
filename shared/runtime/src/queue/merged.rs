//! Two queues taken from as one: a worker that can run containers serves
//! its pool's queue and the pool's container queue. Two queues in memory
//! are waited on at once; otherwise the rarer queue is looked at first,
//! without waiting, then the other is waited on. What was taken is
//! acknowledged, renewed or put back on the queue it came from.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{Batch, BoxFuture, Queue, QueueError};
use crate::assignment::Assignment;

/// The container queue of a pool: a pool of its own (`<pool>.containers`),
/// served only by workers that reach a Docker engine.
pub fn container_pool(pool: &str) -> String {
    let pool = if pool.is_empty() { super::DEFAULT_POOL } else { pool };
    if pool.ends_with(CONTAINERS) {
        pool.to_string()
    } else {
        format!("{pool}{CONTAINERS}")
    }
}

/// The suffix of a container pool's name.
pub const CONTAINERS: &str = ".containers";

/// How long a pop waits on the busier queue before looking at the rarer
/// one again: a step on the rarer queue waits at most this long for an idle taker.
const TURN: Duration = Duration::from_millis(250);

/// How often the rarer queue is looked at while the busier one keeps
/// answering: a look on a remote queue is a round trip, paid by every step
/// taken when it is made on every pop.
const RARE_LOOK: Duration = Duration::from_millis(20);

pub struct Merged {
    /// Looked at first, without waiting.
    rare: Arc<dyn Queue>,
    busy: Arc<dyn Queue>,
    /// Which queue each taken assignment came from (true: the rare one).
    taken: Mutex<HashMap<String, bool>>,
    /// When the rarer queue was last looked at and found empty.
    rare_empty_at: Mutex<Option<std::time::Instant>>,
}

impl Merged {
    pub fn new(rare: Arc<dyn Queue>, busy: Arc<dyn Queue>) -> Merged {
        Merged { rare, busy, taken: Mutex::new(HashMap::new()), rare_empty_at: Mutex::new(None) }
    }

    fn came_from_rare(&self, id: &str, forget: bool) -> Option<bool> {
        let mut t = self.taken.lock().unwrap_or_else(|p| p.into_inner());
        if forget {
            t.remove(id)
        } else {
            t.get(id).copied()
        }
    }

    fn note(&self, a: &Assignment, rare: bool) {
        self.taken.lock().unwrap_or_else(|p| p.into_inner()).insert(a.id.clone(), rare);
    }
}

impl Queue for Merged {
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        let rare = self.came_from_rare(&a.id, true).unwrap_or(a.pool.ends_with(CONTAINERS));
        if rare {
            self.rare.push(a)
        } else {
            self.busy.push(a)
        }
    }

    fn pushes(&self) -> u64 {
        self.rare.pushes().wrapping_add(self.busy.pushes())
    }

    fn await_hand_over(&self, seen: u64, wait: Duration) -> BoxFuture<'_, Option<Assignment>> {
        Box::pin(async move {
            let (rare, busy) = (self.rare.pushes(), self.busy.pushes());
            if rare.wrapping_add(busy) != seen {
                return None;
            }
            // The wait that loses leaves its line (what it was handed meanwhile is put back).
            tokio::select! {
                a = self.rare.await_hand_over(rare, wait) => a,
                a = self.busy.await_hand_over(busy, wait) => a,
            }
        })
    }

    fn pop_within(&self, wait: Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move {
            if self.pop_is_cancel_safe() {
                // Both in memory: waited on at once, the rarer first when
                // both have one (the pop that loses took nothing).
                let either = async {
                    tokio::select! {
                        biased;
                        a = self.rare.pop() => a.map(|a| (a, true)),
                        a = self.busy.pop() => a.map(|a| (a, false)),
                    }
                };
                return match tokio::time::timeout(wait, either).await {
                    Ok(taken) => {
                        let (a, rare) = taken?;
                        self.note(&a, rare);
                        Ok(Some(a))
                    }
                    Err(_) => Ok(None),
                };
            }
            self.pop_up_to(1, wait).await?.into_iter().next().transpose()
        })
    }

    fn pop_up_to(&self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Batch, QueueError>> {
        Box::pin(async move {
            if self.pop_is_cancel_safe() {
                return super::as_batch(self.pop_within(wait).await);
            }
            // A look, not a wait (a wait here is paid by every step taken),
            // and not more often than RARE_LOOK while it finds nothing.
            let since = *self.rare_empty_at.lock().unwrap_or_else(|p| p.into_inner());
            let until_look = since.map_or(Duration::ZERO, |t| RARE_LOOK.saturating_sub(t.elapsed()));
            let look = until_look.is_zero();
            if look {
                let rare = self.rare.pop_up_to(max, Duration::ZERO).await?;
                if !rare.is_empty() {
                    rare.iter().flatten().for_each(|a| self.note(a, true));
                    return Ok(rare);
                }
                *self.rare_empty_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
            }
            // Waiting on the busier one: at most until the rarer is due a look.
            let busy = self.busy.pop_up_to(max, wait.min(if look { TURN } else { until_look })).await?;
            busy.iter().flatten().for_each(|a| self.note(a, false));
            Ok(busy)
        })
    }

    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        match self.came_from_rare(id, true) {
            Some(true) => self.rare.ack(id),
            _ => self.busy.ack(id),
        }
    }

    fn forget(&self, id: &str) {
        self.rare.forget(id);
        self.busy.forget(id);
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        let id = id.to_string();
        Box::pin(async move { Ok(self.rare.remove(&id).await? | self.busy.remove(&id).await?) })
    }

    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            self.rare.extend_held().await?;
            self.busy.extend_held().await
        })
    }

    fn lease(&self) -> Option<Duration> {
        self.busy.lease()
    }

    fn pop_is_cancel_safe(&self) -> bool {
        self.rare.pop_is_cancel_safe() && self.busy.pop_is_cancel_safe()
    }

    fn ensure(&self) -> BoxFuture<'_, Result<bool, QueueError>> {
        Box::pin(async move { Ok(self.rare.ensure().await? | self.busy.ensure().await?) })
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<(Assignment, String)>, QueueError>> {
        Box::pin(async move {
            let mut all = self.rare.dead_letters().await?;
            all.extend(self.busy.dead_letters().await?);
            Ok(all)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::in_process::InProcessQueue;

    #[tokio::test]
    async fn takes_from_both_and_puts_back_where_it_came_from() {
        let (rare, busy): (Arc<dyn Queue>, Arc<dyn Queue>) = (Arc::new(InProcessQueue::default()), Arc::new(InProcessQueue::default()));
        let m = Merged::new(rare.clone(), busy.clone());
        busy.push(Assignment { id: "plain".into(), ..Assignment::command("r", "p", "true".into()) }).await.unwrap();
        rare.push(Assignment { id: "boxed".into(), pool: container_pool(""), ..Assignment::command("r", "c", "true".into()) }).await.unwrap();
        // The rarer queue first.
        assert_eq!(m.pop_within(Duration::from_millis(50)).await.unwrap().unwrap().id, "boxed");
        let plain = m.pop_within(Duration::from_millis(50)).await.unwrap().unwrap();
        assert_eq!(plain.id, "plain");
        assert!(m.pop_within(Duration::from_millis(10)).await.unwrap().is_none());
        // Put back: onto its own queue.
        m.push(plain).await.unwrap();
        assert_eq!(busy.pop_within(Duration::from_millis(50)).await.unwrap().unwrap().id, "plain");
        assert!(rare.pop_within(Duration::from_millis(10)).await.unwrap().is_none());
    }

    #[test]
    fn a_pools_container_queue_is_named_after_it() {
        assert_eq!(container_pool(""), "default.containers");
        assert_eq!(container_pool("gpu"), "gpu.containers");
        assert_eq!(container_pool("gpu.containers"), "gpu.containers");
    }
}
