//! Where assignments wait for a worker. In-process for embedded mode; Redis
//! Streams for a cluster (a consumer group; an entry a worker took but never
//! acknowledged comes back to another after the lease).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::assignment::Assignment;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue {url}: {message}")]
    Backend { url: String, message: String },
    /// An entry this build cannot read (another encoding, or bytes that do
    /// not decode): it was moved aside, never misread.
    #[error("queue {key}: refused entry {entry}: {reason}; this steppe reads only entries with enc={encoding}; the entry was moved to {aside}")]
    Refused { key: String, entry: String, reason: String, encoding: &'static str, aside: String },
}

impl QueueError {
    /// The backend is away (worth waiting for), as opposed to one entry
    /// that could not be read (the next one may be fine).
    pub fn is_outage(&self) -> bool {
        match self {
            QueueError::Backend { .. } => true,
            QueueError::Refused { .. } => false,
        }
    }
}

pub trait Queue: Send + Sync {
    /// Adds an assignment at the back.
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>>;
    /// Gives the assignment, now and in this process's memory, to a taker
    /// of this process that waits for work, if the queue does that and one
    /// waits ([`Handoff`]); otherwise it comes back, for `push`.
    fn hand_over(&self, a: Assignment) -> Result<(), Assignment> {
        Err(a)
    }
    /// How many assignments this process has put on the remote queue of a
    /// [`Handoff`] (0 where nothing is handed over): a taker of another
    /// process waiting in [`Queue::await_hand_over`] looks at the remote
    /// queue again once it changes.
    fn pushes(&self) -> u64 {
        0
    }
    /// Waits in this process's line for a hand-over on behalf of a taker
    /// that looks at the remote queue itself (a pulling worker, through its
    /// session): the assignment handed over, or None once [`Queue::pushes`]
    /// is no longer `seen` (at once if it is not now) or `wait` ran out.
    /// Dropped, what was handed over meanwhile goes to another taker or onto
    /// the remote queue. A queue that hands nothing over waits out `wait`.
    fn await_hand_over(&self, seen: u64, wait: Duration) -> BoxFuture<'_, Option<Assignment>> {
        let _ = seen;
        Box::pin(async move {
            tokio::time::sleep(wait).await;
            None
        })
    }
    /// Takes the oldest assignment (or one whose taker's lease ran out),
    /// waiting until there is one: by default a `pop_within` of a second
    /// at a time until one comes.
    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                if let Some(a) = self.pop_within(Duration::from_secs(1)).await? {
                    return Ok(a);
                }
            }
        })
    }
    /// Like `pop`, but gives up after `wait` with None. Unlike a `pop`
    /// dropped half-way (which on Redis may leave a delivered entry with no
    /// taker until its lease runs out), this always runs to completion, so a
    /// consumer that wants to stop polls it and stops between calls. A zero
    /// `wait` looks without waiting.
    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>>;
    /// Like `pop_within`, but takes up to `max` when that many wait (one
    /// round trip on Redis, where a taker of many slots would otherwise pay
    /// one per slot): none only when `wait` ran out. Each entry this build
    /// cannot read is an `Err` among them (moved aside, as `pop_within`'s).
    fn pop_up_to(&self, max: usize, wait: std::time::Duration) -> BoxFuture<'_, Result<Batch, QueueError>> {
        let _ = max;
        Box::pin(async move { as_batch(self.pop_within(wait).await) })
    }
    /// The assignment is done with: it will not come back.
    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>>;
    /// Removes an assignment nobody took yet; true if it was waiting.
    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>>;
    /// Lets go of what this process keeps of an assignment it pushed whose
    /// taker acknowledges it itself (a pulling worker); nothing is sent.
    fn forget(&self, id: &str) {
        let _ = id;
    }
    /// Renews the lease on everything this consumer took and has not
    /// acknowledged, so a step that runs longer than the lease is not handed
    /// to a second taker. Called by its holder well within every lease.
    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }
    /// Whether a `pop` dropped before it returns loses nothing (it takes
    /// an entry and returns without waiting in between): then a consumer
    /// may wait on several queues at once and drop the pops that lose.
    fn pop_is_cancel_safe(&self) -> bool {
        false
    }
    /// How long a taken entry stays with its taker without an extension.
    /// None: the queue keeps nothing once an entry is taken, so its `ack`
    /// does nothing and callers may skip it.
    fn lease(&self) -> Option<Duration> {
        None
    }
    /// Makes sure the queue's backend holds what it needs (a Redis that
    /// restarted empty lacks its consumer group); true when it had to be
    /// made again, so whatever waited in the queue before is gone.
    fn ensure(&self) -> BoxFuture<'_, Result<bool, QueueError>> {
        Box::pin(async { Ok(false) })
    }
    /// Assignments the backend gave up on (delivered too often without an
    /// acknowledgement: moved to its dead-letter queue), not yet reported,
    /// each with what to tell its step.
    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<(Assignment, String)>, QueueError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// What a `pop_up_to` took, in queue order: each an assignment, or an
/// entry this build could not read (moved aside).
pub type Batch = Vec<Result<Assignment, QueueError>>;

/// A `pop_within`'s answer as a `pop_up_to`'s: an entry refused is one
/// among the batch, only an outage fails it.
pub(crate) fn as_batch(popped: Result<Option<Assignment>, QueueError>) -> Result<Batch, QueueError> {
    match popped {
        Ok(a) => Ok(a.into_iter().map(Ok).collect()),
        Err(e) if !e.is_outage() => Ok(vec![Err(e)]),
        Err(e) => Err(e),
    }
}

/// The pool a step goes to unless its run names another.
pub const DEFAULT_POOL: &str = "default";

/// This process and this moment (`<pid>-<Unix ns>`): a mark no other
/// process that ever used a queue makes (a stream's generation, a
/// coordinator's incarnation).
pub fn process_mark() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{t}", std::process::id())
}

/// A pool name: letters, digits, `-`, `_`, `.`; at most 64 characters;
/// not `refused` (the default pool's stream of refused entries is `base:refused`).
pub fn check_pool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(format!("pool {name:?}: a pool name is 1 to 64 letters, digits, '-', '_' or '.'"));
    }
    if name.ends_with(CONTAINERS) {
        return Err(format!("pool {name:?}: names ending in \"{CONTAINERS}\" are the container queues of pools (a worker that reaches a Docker engine serves its pool's)"));
    }
    if name == "refused" {
        return Err("pool \"refused\": the name is taken by the queue's stream of refused entries".to_string());
    }
    Ok(())
}

/// The Redis stream of a pool: `base` for the default pool, `base:pool` otherwise.
pub fn pool_key(base: &str, pool: &str) -> String {
    if pool.is_empty() || pool == DEFAULT_POOL {
        base.to_string()
    } else {
        format!("{base}:{pool}")
    }
}

/// Lease extension for a taker that lives: every third of `lease`, renews
/// what it took from each of `queues()` (asked afresh each time: pools open
/// as they are used); `report` hears of each failure. Runs until the process ends.
pub fn keep_leases<F>(lease: Duration, queues: F, report: impl Fn(QueueError) + Send + 'static)
where
    F: Fn() -> BoxFuture<'static, Vec<std::sync::Arc<dyn Queue>>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(lease / 3).await;
            for q in queues().await {
                if let Err(e) = q.extend_held().await {
                    report(e);
                }
            }
        }
    });
}

pub type OpenPool = Box<dyn Fn(String) -> BoxFuture<'static, Result<std::sync::Arc<dyn Queue>, QueueError>> + Send + Sync>;

/// One queue per worker pool, opened when first used. Workers serve one
/// pool each (`steppe worker --pool NAME`); a run's steps go to the pool it
/// was submitted to (`steppe submit --pool NAME`), the default one otherwise.
pub struct Pools {
    default: std::sync::Arc<dyn Queue>,
    open: OpenPool,
    others: tokio::sync::Mutex<HashMap<String, std::sync::Arc<dyn Queue>>>,
}

impl Pools {
    /// Pools in this process's memory.
    pub fn in_process(default: std::sync::Arc<dyn Queue>) -> Self {
        Pools {
            default,
            open: Box::new(|_| Box::pin(async { Ok(std::sync::Arc::new(InProcessQueue::new()) as std::sync::Arc<dyn Queue>) })),
            others: Default::default(),
        }
    }

    /// Pools opened by `open` (a pool's name → its queue), `default` first.
    pub fn with(default: std::sync::Arc<dyn Queue>, open: OpenPool) -> Self {
        Pools { default, open, others: Default::default() }
    }

    /// These pools, each queue a [`Handoff`]: what is handed out while a
    /// taker of this process waits for work goes to it in memory (the
    /// coordinator's, whose sessions take for pushed workers).
    pub fn handing_off(self) -> Self {
        let Pools { default, open, others } = self;
        let hand = |q: std::sync::Arc<dyn Queue>| std::sync::Arc::new(Handoff::new(q)) as std::sync::Arc<dyn Queue>;
        let others = others.into_inner().into_iter().map(|(pool, q)| (pool, hand(q))).collect();
        Pools {
            default: hand(default),
            open: Box::new(move |pool| {
                let opening = open(pool);
                Box::pin(async move { Ok(hand(opening.await?)) })
            }),
            others: tokio::sync::Mutex::new(others),
        }
    }

    pub fn default_pool(&self) -> &std::sync::Arc<dyn Queue> {
        &self.default
    }

    /// The queue of `pool` ("" is the default pool).
    pub async fn get(&self, pool: &str) -> Result<std::sync::Arc<dyn Queue>, QueueError> {
        if pool.is_empty() || pool == DEFAULT_POOL {
            return Ok(self.default.clone());
        }
        let mut others = self.others.lock().await;
        if let Some(q) = others.get(pool) {
            return Ok(q.clone());
        }
        let q = (self.open)(pool.to_string()).await?;
        others.insert(pool.to_string(), q.clone());
        Ok(q)
    }

    /// Every queue opened so far (for lease extension).
    pub async fn all(&self) -> Vec<std::sync::Arc<dyn Queue>> {
        self.named().await.into_iter().map(|(_, q)| q).collect()
    }

    /// Every queue opened so far, with its pool's name.
    pub async fn named(&self) -> Vec<(String, std::sync::Arc<dyn Queue>)> {
        let mut v = vec![(DEFAULT_POOL.to_string(), self.default.clone())];
        v.extend(self.others.lock().await.iter().map(|(n, q)| (n.clone(), q.clone())));
        v
    }
}

#[doc(hidden)]
pub mod conformance;
mod handoff;
mod in_process;
mod merged;
mod redis;

pub use handoff::Handoff;
pub use in_process::InProcessQueue;
pub use merged::{container_pool, Merged, CONTAINERS};
pub(crate) use self::redis::connection_lost;
pub use self::redis::RedisQueue;

/// What a Redis error says, credentials masked, with the way out when it
/// is a private CA or a wrong password.
pub fn redis_message(e: &::redis::RedisError) -> String {
    let text = crate::secrets::mask_urls(&e.to_string()).into_owned();
    let hint = if text.contains("UnknownIssuer") {
        " (a private CA? point SSL_CERT_FILE at its certificate)"
    } else if text.contains("AuthenticationFailed") || text.contains("WRONGPASS") || text.contains("NOAUTH") {
        " (check the user and password: redis://USER:PASSWORD@HOST:PORT/, or --redis-password-file)"
    } else {
        ""
    };
    format!("{text}{hint}")
}
#[cfg(test)]
pub(crate) use self::redis::tests::redis_server;

#[cfg(test)]
mod tests {
    use super::*;

    use super::conformance::{a, basics};

    #[tokio::test]
    async fn pools_keep_their_assignments_apart() {
        let pools = Pools::in_process(std::sync::Arc::new(InProcessQueue::new()));
        let gpu = pools.get("gpu").await.unwrap();
        gpu.push(a("g1")).await.unwrap();
        pools.get("").await.unwrap().push(a("d1")).await.unwrap();
        assert_eq!(pools.default_pool().pop().await.unwrap().id, "d1", "the default pool gets only its own");
        assert_eq!(pools.get("gpu").await.unwrap().pop().await.unwrap().id, "g1", "the same queue each time");
        assert_eq!(pools.all().await.len(), 2);
        assert!(check_pool_name("gpu-a100.x").is_ok());
        assert!(check_pool_name("../etc").is_err() && check_pool_name("").is_err() && check_pool_name("refused").is_err());
        assert_eq!(pool_key("steppe:assignments", "default"), "steppe:assignments");
        assert_eq!(pool_key("steppe:assignments", "gpu"), "steppe:assignments:gpu");
    }

    #[tokio::test]
    async fn in_process_queue_conforms() {
        basics(std::sync::Arc::new(InProcessQueue::new())).await;
    }
}
