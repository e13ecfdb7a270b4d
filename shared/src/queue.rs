//! Where assignments wait for a worker. In-process for embedded mode; Redis
//! Streams for a cluster (a consumer group; an entry a worker took but never
//! acknowledged comes back to another after the lease). SQS and Pub/Sub
//! implement the same trait.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

use crate::assignment::Assignment;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("queue {url}: {message}")]
    Backend { url: String, message: String },
    #[error("queue: an entry that is not an assignment: {0}")]
    Corrupt(String),
}

pub trait Queue: Send + Sync {
    /// Adds an assignment at the back.
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>>;
    /// Takes the oldest assignment (or one whose taker's lease ran out),
    /// waiting until there is one.
    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>>;
    /// Like `pop`, but gives up after `wait` with None. Unlike a `pop`
    /// dropped half-way (which on Redis may leave a delivered entry with no
    /// taker until its lease runs out), this always runs to completion, so a
    /// consumer that wants to stop polls it and stops between calls.
    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>>;
    /// The assignment is done with: it will not come back.
    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>>;
    /// Removes an assignment nobody took yet; true if it was waiting.
    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>>;
    /// Renews the lease on everything this consumer took and has not
    /// acknowledged, so a step that runs longer than the lease is not handed
    /// to a second taker. Called by its holder well within every lease.
    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }
    /// How long a taken entry stays with its taker without an extension.
    fn lease(&self) -> Option<Duration> {
        None
    }
    /// Makes sure the queue's backend holds what it needs (a Redis that
    /// restarted empty lacks its consumer group); true when it had to be
    /// made again, so whatever waited in the queue before is gone.
    fn ensure(&self) -> BoxFuture<'_, Result<bool, QueueError>> {
        Box::pin(async { Ok(false) })
    }
}

/// The pool a step goes to unless its run names another.
pub const DEFAULT_POOL: &str = "default";

/// A pool name: letters, digits, `-`, `_`, `.`; at most 64 characters.
pub fn check_pool_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(format!("pool {name:?}: a pool name is 1 to 64 letters, digits, '-', '_' or '.'"));
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

type OpenPool = Box<dyn Fn(String) -> BoxFuture<'static, Result<std::sync::Arc<dyn Queue>, QueueError>> + Send + Sync>;

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

    /// Pools on Redis: a stream per pool under `base` (see [`pool_key`]).
    pub fn redis(default: std::sync::Arc<dyn Queue>, url: &str, base: &str, consumer: &str, lease: Duration) -> Self {
        let (url, base, consumer) = (url.to_string(), base.to_string(), consumer.to_string());
        Pools {
            default,
            open: Box::new(move |pool| {
                let (url, key, consumer) = (url.clone(), pool_key(&base, &pool), consumer.clone());
                Box::pin(async move { Ok(std::sync::Arc::new(RedisQueue::connect(&url, &key, &consumer, lease).await?) as std::sync::Arc<dyn Queue>) })
            }),
            others: Default::default(),
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

/// A FIFO in this process's memory (no leases: if the process dies, so does everything it held).
#[derive(Default)]
pub struct InProcessQueue {
    items: Mutex<VecDeque<Assignment>>,
    ready: Notify,
}

impl InProcessQueue {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Queue for InProcessQueue {
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        if let Ok(mut q) = self.items.lock() {
            q.push_back(a);
        }
        self.ready.notify_one();
        Box::pin(async { Ok(()) })
    }

    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                let notified = self.ready.notified();
                let (item, more) = match self.items.lock() {
                    Ok(mut q) => {
                        let item = q.pop_front();
                        (item, !q.is_empty())
                    }
                    Err(_) => (None, false),
                };
                if let Some(a) = item {
                    // Someone else may be waiting for the next item.
                    if more {
                        self.ready.notify_one();
                    }
                    return Ok(a);
                }
                notified.await;
            }
        })
    }

    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        // The in-process pop takes an item and returns without awaiting in
        // between, so cutting it short loses nothing.
        Box::pin(async move { Ok(tokio::time::timeout(wait, self.pop()).await.ok().transpose()?) })
    }

    fn ack(&self, _id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        let removed = match self.items.lock() {
            Ok(mut q) => {
                let before = q.len();
                q.retain(|a| a.id != id);
                q.len() != before
            }
            Err(_) => false,
        };
        Box::pin(async move { Ok(removed) })
    }
}

/// Redis Streams: one stream, one consumer group; this process is one consumer.
pub struct RedisQueue {
    url: String,
    client: redis::Client,
    /// For commands that return at once (reconnects by itself after a drop
    /// or a Redis restart); a blocking read gets its own connection, since
    /// Redis serves one connection's commands in order.
    conn: redis::aio::ConnectionManager,
    key: String,
    group: String,
    consumer: String,
    lease: Duration,
    /// Assignment id → stream entry id, for entries this process pushed or took.
    entries: Mutex<HashMap<String, String>>,
    /// The ids among them this consumer took: the leases it renews. (An
    /// entry it only pushed is renewed by whoever took it, or comes back.)
    taken: Mutex<std::collections::HashSet<String>>,
    /// The generation of the stream this consumer last saw: whoever makes
    /// the consumer group (a Redis that restarted empty lost it) writes a
    /// new one beside it, so every consumer learns the queue was lost,
    /// whoever noticed first.
    generation: Mutex<Option<String>>,
}

/// A new generation mark for a stream.
fn new_generation() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{t}", std::process::id())
}

impl RedisQueue {
    /// Connects and makes sure the stream and its consumer group exist.
    pub async fn connect(url: &str, key: &str, consumer: &str, lease: Duration) -> Result<Self, QueueError> {
        // Messages name the queue without its password.
        let shown = crate::secrets::mask_urls(url).into_owned();
        let err = |e: redis::RedisError| QueueError::Backend { url: shown.clone(), message: crate::secrets::mask_urls(&e.to_string()).into_owned() };
        let client = redis::Client::open(url).map_err(err)?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(REDIS_CONNECT_TIMEOUT)
            .set_response_timeout(REDIS_RESPONSE_TIMEOUT)
            .set_number_of_retries(3)
            .set_max_delay(2_000);
        let mut conn = client.get_connection_manager_with_config(config).await.map_err(err)?;
        let group = "steppe-workers".to_string();
        let gen_key = format!("{key}:generation");
        if create_group(&mut conn, key, &group).await.map_err(err)? {
            let _: () = redis::cmd("SET").arg(&gen_key).arg(new_generation()).query_async(&mut conn).await.map_err(err)?;
        }
        let _: () = redis::cmd("SET").arg(&gen_key).arg(new_generation()).arg("NX").query_async(&mut conn).await.map_err(err)?;
        let seen: Option<String> = redis::cmd("GET").arg(&gen_key).query_async(&mut conn).await.map_err(err)?;
        Ok(RedisQueue {
            url: shown.clone(),
            client,
            conn,
            key: key.to_string(),
            group,
            consumer: consumer.to_string(),
            lease,
            entries: Mutex::new(HashMap::new()),
            taken: Default::default(),
            generation: Mutex::new(seen),
        })
    }

    fn err(&self, e: redis::RedisError) -> QueueError {
        QueueError::Backend { url: self.url.clone(), message: crate::secrets::mask_urls(&e.to_string()).into_owned() }
    }

    fn take(&self, entry: String, fields: HashMap<String, redis::Value>) -> Result<Assignment, QueueError> {
        let raw = match fields.get("a") {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(redis::Value::SimpleString(s)) => s.clone(),
            _ => return Err(QueueError::Corrupt(format!("entry {entry} has no assignment"))),
        };
        let a: Assignment = serde_json::from_str(&raw).map_err(|e| QueueError::Corrupt(format!("entry {entry}: {e}")))?;
        if let Ok(mut m) = self.entries.lock() {
            m.insert(a.id.clone(), entry);
        }
        if let Ok(mut t) = self.taken.lock() {
            t.insert(a.id.clone());
        }
        Ok(a)
    }

    fn entry_of(&self, id: &str) -> Option<String> {
        self.entries.lock().ok().and_then(|m| m.get(id).cloned())
    }

    /// One claim-or-read: an entry whose taker's lease ran out, else a new
    /// one, waiting up to `wait`.
    async fn pop_once(&self, wait: std::time::Duration) -> Result<Option<Assignment>, QueueError> {
        let mut c = self.reader(wait).await?;
        // An entry a consumer took and held past the lease comes back first.
        let claimed: redis::Value = redis::cmd("XAUTOCLAIM")
            .arg(&self.key)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(self.lease.as_millis() as u64)
            .arg("0-0")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        if let redis::Value::Array(parts) = &claimed {
            if let Some((entry, fields)) = parts.get(1).map(parse_entries).and_then(|v| v.into_iter().next()) {
                return self.take(entry, fields).map(Some);
            }
        }
        let read: redis::Value = redis::cmd("XREADGROUP")
            .arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(1)
            .arg("BLOCK")
            .arg(wait.as_millis().max(1) as u64)
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(&mut c)
            .await
            .map_err(|e| self.err(e))?;
        if let redis::Value::Array(streams) = &read {
            for s in streams {
                if let redis::Value::Array(kv) = s {
                    if let Some((entry, fields)) = kv.get(1).map(parse_entries).and_then(|v| v.into_iter().next()) {
                        return self.take(entry, fields).map(Some);
                    }
                }
            }
        }
        Ok(None)
    }

    /// Runs a command that answers at once on the managed connection; a
    /// lost connection is retried with backoff (about six seconds of waiting
    /// in all) while it comes back, so one dropped connection or a quick
    /// Redis restart fails nothing.
    async fn retry<T, F, Fut>(&self, f: F) -> Result<T, QueueError>
    where
        F: Fn(redis::aio::ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let mut wait = Duration::from_millis(100);
        loop {
            match f(self.conn.clone()).await {
                Err(e) if connection_lost(&e) && wait <= Duration::from_millis(3200) => {
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                }
                r => return r.map_err(|e| self.err(e)),
            }
        }
    }

    /// Makes the consumer group (and the stream) if it is missing, marking
    /// a new generation when it was; true if it was.
    async fn make_group(&self) -> Result<bool, QueueError> {
        let created = self.retry(|mut c| async move { create_group(&mut c, &self.key, &self.group).await }).await?;
        if created {
            let (gen_key, generation) = (format!("{}:generation", self.key), new_generation());
            let _: () = self
                .retry(|mut c| {
                    let (gen_key, generation) = (&gen_key, &generation);
                    async move { redis::cmd("SET").arg(gen_key).arg(generation).query_async(&mut c).await }
                })
                .await?;
        }
        Ok(created)
    }

    /// A connection for one read that blocks up to `wait`.
    async fn reader(&self, wait: Duration) -> Result<redis::aio::MultiplexedConnection, QueueError> {
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(REDIS_CONNECT_TIMEOUT).set_response_timeout(wait + REDIS_RESPONSE_TIMEOUT);
        self.client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| self.err(e))
    }
}

/// The connection was lost before the command could be answered (dropped,
/// refused, Redis restarting): worth sending again once connected. Not a
/// timeout: that command may have been carried out, and a second XADD
/// would queue a step twice.
pub(crate) fn connection_lost(e: &redis::RedisError) -> bool {
    !e.is_timeout() && (e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal())
}

/// How long to wait for Redis to accept a connection, and to answer a
/// command that returns at once (a blocking read waits longer on purpose).
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Creates the stream's consumer group (and the stream); true if it was
/// missing, false if it existed.
async fn create_group<C: redis::aio::ConnectionLike + Send>(conn: &mut C, key: &str, group: &str) -> Result<bool, redis::RedisError> {
    let created: Result<(), redis::RedisError> = redis::cmd("XGROUP").arg("CREATE").arg(key).arg(group).arg("0").arg("MKSTREAM").query_async(conn).await;
    match created {
        Ok(()) => Ok(true),
        Err(e) if e.to_string().contains("BUSYGROUP") => Ok(false),
        Err(e) => Err(e),
    }
}

/// A Redis that restarted empty answers reads of the group this way.
fn missing_group(message: &str) -> bool {
    message.contains("NOGROUP")
}

type Entry = (String, HashMap<String, redis::Value>);

fn parse_entries(v: &redis::Value) -> Vec<Entry> {
    let redis::Value::Array(items) = v else { return Vec::new() };
    items
        .iter()
        .filter_map(|e| {
            let redis::Value::Array(pair) = e else { return None };
            let id = match pair.first()? {
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                redis::Value::SimpleString(s) => s.clone(),
                _ => return None,
            };
            let redis::Value::Array(kv) = pair.get(1)? else { return None };
            let mut fields = HashMap::new();
            for chunk in kv.chunks(2) {
                if let [redis::Value::BulkString(k), v] = chunk {
                    fields.insert(String::from_utf8_lossy(k).into_owned(), v.clone());
                }
            }
            Some((id, fields))
        })
        .collect()
}

impl Queue for RedisQueue {
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        let taken = self.entry_of(&a.id);
        // Before the XADD: once it is in, a consumer of this process may
        // take it at once, and its take must stay recorded.
        if let Ok(mut t) = self.taken.lock() {
            t.remove(&a.id);
        }
        Box::pin(async move {
            let body = serde_json::to_string(&a).map_err(|e| QueueError::Corrupt(e.to_string()))?;
            let entry: String = match &taken {
                // Pushing back what this consumer took (a requeue): the old
                // entry goes in the same transaction, or its lease would
                // later deliver the assignment a second time.
                Some(old) => {
                    let (entry,): (String,) = self
                        .retry(|mut c| {
                            let (key, group, body) = (&self.key, &self.group, &body);
                            async move {
                                redis::pipe()
                                    .atomic()
                                    .cmd("XACK").arg(key).arg(group).arg(old).ignore()
                                    .cmd("XDEL").arg(key).arg(old).ignore()
                                    .cmd("XADD").arg(key).arg("*").arg("a").arg(body)
                                    .query_async(&mut c)
                                    .await
                            }
                        })
                        .await?;
                    entry
                }
                None => {
                    self.retry(|mut c| {
                        let (key, body) = (&self.key, &body);
                        async move { redis::cmd("XADD").arg(key).arg("*").arg("a").arg(body).query_async(&mut c).await }
                    })
                    .await?
                }
            };
            if let Ok(mut m) = self.entries.lock() {
                m.insert(a.id.clone(), entry);
            }
            Ok(())
        })
    }

    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                if let Some(a) = self.pop_within(std::time::Duration::from_secs(1)).await? {
                    return Ok(a);
                }
            }
        })
    }

    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move {
            match self.pop_once(wait).await {
                // The group went with a Redis that restarted empty: make it
                // again (whoever watches `ensure` learns the queue was lost).
                Err(QueueError::Backend { message, .. }) if missing_group(&message) => {
                    self.make_group().await?;
                    self.pop_once(wait).await
                }
                r => r,
            }
        })
    }

    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        let entry = self.entry_of(id);
        let id = id.to_string();
        Box::pin(async move {
            let Some(entry) = entry else { return Ok(()) };
            let entry = &entry;
            let _: () = self
                .retry(|mut c| async move {
                    redis::pipe()
                        .cmd("XACK").arg(&self.key).arg(&self.group).arg(entry).ignore()
                        .cmd("XDEL").arg(&self.key).arg(entry).ignore()
                        .query_async(&mut c)
                        .await
                })
                .await?;
            if let Ok(mut m) = self.entries.lock() {
                m.remove(&id);
            }
            if let Ok(mut t) = self.taken.lock() {
                t.remove(&id);
            }
            Ok(())
        })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        let entry = self.entry_of(id);
        let id = id.to_string();
        Box::pin(async move {
            let Some(entry) = entry else { return Ok(false) };
            let entry = &entry;
            // Taken entries are in the group's pending list; only untaken ones are removed.
            let pending: redis::Value = self.retry(|mut c| async move { redis::cmd("XPENDING").arg(&self.key).arg(&self.group).arg(entry).arg(entry).arg(1).query_async(&mut c).await }).await?;
            if matches!(&pending, redis::Value::Array(v) if !v.is_empty()) {
                return Ok(false);
            }
            let n: i64 = self.retry(|mut c| async move { redis::cmd("XDEL").arg(&self.key).arg(entry).query_async(&mut c).await }).await?;
            if let Ok(mut m) = self.entries.lock() {
                m.remove(&id);
            }
            Ok(n == 1)
        })
    }

    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        let taken = self.taken.lock().map(|t| t.clone()).unwrap_or_default();
        let held: Vec<String> = self.entries.lock().map(|m| m.iter().filter(|(id, _)| taken.contains(*id)).map(|(_, e)| e.clone()).collect()).unwrap_or_default();
        Box::pin(async move {
            if held.is_empty() {
                return Ok(());
            }
            // XCLAIM with no minimum idle time resets an entry's idle clock.
            for ids in held.chunks(512) {
                let _: redis::Value = self
                    .retry(|mut c| async move { redis::cmd("XCLAIM").arg(&self.key).arg(&self.group).arg(&self.consumer).arg(0).arg(ids).arg("JUSTID").query_async(&mut c).await })
                    .await?;
            }
            Ok(())
        })
    }

    fn lease(&self) -> Option<Duration> {
        Some(self.lease)
    }

    fn ensure(&self) -> BoxFuture<'_, Result<bool, QueueError>> {
        Box::pin(async move {
            let created = self.make_group().await?;
            let gen_key = format!("{}:generation", self.key);
            let now: Option<String> = self.retry(|mut c| {
                let gen_key = &gen_key;
                async move { redis::cmd("GET").arg(gen_key).query_async(&mut c).await }
            })
            .await?;
            let mut seen = self.generation.lock().unwrap_or_else(|p| p.into_inner());
            let changed = now.is_some() && *seen != now;
            *seen = now;
            Ok(created || changed)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn a(id: &str) -> Assignment {
        Assignment { id: id.into(), ..Assignment::command("r", "s", "true".into()) }
    }

    /// The behaviour every backend shares.
    pub(crate) async fn conformance(q: std::sync::Arc<dyn Queue>) {
        q.push(a("1")).await.unwrap();
        q.push(a("2")).await.unwrap();
        q.push(a("3")).await.unwrap();
        assert!(q.remove("2").await.unwrap(), "a waiting assignment can be removed");
        assert!(!q.remove("2").await.unwrap());
        let first = q.pop().await.unwrap();
        assert_eq!(first.id, "1", "first in, first out");
        assert!(!q.remove("1").await.unwrap(), "a taken assignment is not removed");
        q.ack("1").await.unwrap();
        assert_eq!(q.pop().await.unwrap().id, "3");
        q.ack("3").await.unwrap();
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.pop().await.unwrap().id });
        tokio::time::sleep(Duration::from_millis(50)).await;
        q.push(a("4")).await.unwrap();
        assert_eq!(waiter.await.unwrap(), "4", "pop waits for a push");
        q.ack("4").await.unwrap();
    }

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
        assert!(check_pool_name("../etc").is_err() && check_pool_name("").is_err());
        assert_eq!(pool_key("steppe:assignments", "default"), "steppe:assignments");
        assert_eq!(pool_key("steppe:assignments", "gpu"), "steppe:assignments:gpu");
    }

    #[tokio::test]
    async fn in_process_queue_conforms() {
        conformance(std::sync::Arc::new(InProcessQueue::new())).await;
    }
}

#[cfg(test)]
pub(crate) mod redis_tests {
    use super::tests::{a, conformance};
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// A throwaway redis-server on a free loopback port (scripts/test installs it).
    pub(crate) struct Server {
        child: Child,
        pub(crate) url: String,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    pub(crate) fn redis() -> Server {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port");
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/test installs it)");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, url: format!("redis://127.0.0.1:{port}/") }
    }

    #[tokio::test]
    async fn redis_queue_conforms() {
        let s = redis();
        let q = RedisQueue::connect(&s.url, "steppe:test", "c1", Duration::from_secs(30)).await.expect("connect");
        conformance(std::sync::Arc::new(q)).await;
    }

    #[tokio::test]
    async fn a_lost_consumers_entry_comes_back_after_the_lease() {
        let s = redis();
        let lease = Duration::from_millis(300);
        let first = RedisQueue::connect(&s.url, "steppe:lease", "doomed", lease).await.expect("connect");
        let second = RedisQueue::connect(&s.url, "steppe:lease", "survivor", lease).await.expect("connect");
        first.push(a("job-1")).await.unwrap();
        assert_eq!(first.pop().await.unwrap().id, "job-1");
        // `first` dies without acknowledging; after the lease, `second` gets it.
        drop(first);
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let again = second.pop().await.unwrap();
        assert_eq!(again.id, "job-1");
        second.ack("job-1").await.unwrap();
        // Acknowledged: nothing comes back.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let none = tokio::time::timeout(Duration::from_millis(1500), second.pop()).await;
        assert!(none.is_err(), "an acknowledged entry must not be delivered again");
    }

    #[tokio::test]
    async fn an_extended_lease_keeps_an_entry_with_its_taker() {
        let s = redis();
        let lease = Duration::from_millis(300);
        let holder = RedisQueue::connect(&s.url, "steppe:extend", "holder", lease).await.expect("connect");
        let other = RedisQueue::connect(&s.url, "steppe:extend", "other", lease).await.expect("connect");
        holder.push(a("long")).await.unwrap();
        assert_eq!(holder.pop().await.unwrap().id, "long");
        // Held three leases long, extended every third of one: nobody else gets it.
        for _ in 0..9 {
            tokio::time::sleep(lease / 3).await;
            holder.extend_held().await.unwrap();
        }
        assert!(other.pop_within(Duration::from_millis(50)).await.unwrap().is_none(), "an extended entry must stay with its taker");
        // No more extensions: the lease runs out and it comes back.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        assert_eq!(other.pop_within(Duration::from_millis(50)).await.unwrap().map(|a| a.id).as_deref(), Some("long"));
    }

    #[tokio::test]
    async fn a_requeued_entry_is_delivered_once() {
        let s = redis();
        let lease = Duration::from_millis(300);
        let q = RedisQueue::connect(&s.url, "steppe:requeue", "c1", lease).await.expect("connect");
        q.push(a("job-1")).await.unwrap();
        let taken = q.pop().await.unwrap();
        // Its worker was lost: back on the queue, taken again, done.
        q.push(taken).await.unwrap();
        assert_eq!(q.pop().await.unwrap().id, "job-1");
        q.ack("job-1").await.unwrap();
        // The first taking does not come back when its lease runs out.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        let ghost = q.pop_within(Duration::from_millis(500)).await.unwrap();
        assert!(ghost.is_none(), "a requeued assignment was delivered again: {ghost:?}");
    }
}
