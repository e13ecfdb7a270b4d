//! The queue of a cluster: Redis Streams, one stream per pool and one consumer
//! group; an entry whose taker's lease ran out comes back to another.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prost::Message;
use steppe_proto::v1;

use super::{Batch, BoxFuture, Queue, QueueError};
use crate::assignment::Assignment;
use crate::wire::{assignment_from_wire, assignment_to_wire};

/// What an entry's `enc` field names: the encoding of its `pb` field.
const ENCODING: &str = "steppe.v1.Assignment";
const ENC_FIELD: &str = "enc";
const BODY_FIELD: &str = "pb";

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
    /// Connections for blocking reads, kept between pops (a read that did
    /// not finish takes its connection with it).
    readers: Mutex<Vec<redis::aio::MultiplexedConnection>>,
    /// When this consumer last looked for entries whose taker's lease ran
    /// out: every quarter lease, not on every pop.
    claimed_at: Mutex<Option<std::time::Instant>>,
}

impl RedisQueue {
    /// Connects and makes sure the stream and its consumer group exist.
    pub async fn connect(url: &str, key: &str, consumer: &str, lease: Duration) -> Result<Self, QueueError> {
        // Messages name the queue without its password.
        let shown = crate::secrets::mask_urls(url).into_owned();
        let err = |e: redis::RedisError| QueueError::Backend { url: shown.clone(), message: crate::queue::redis_message(&e) };
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
            let _: () = redis::cmd("SET").arg(&gen_key).arg(super::process_mark()).query_async(&mut conn).await.map_err(err)?;
        }
        let _: () = redis::cmd("SET").arg(&gen_key).arg(super::process_mark()).arg("NX").query_async(&mut conn).await.map_err(err)?;
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
            readers: Mutex::new(Vec::new()),
            claimed_at: Mutex::new(None),
        })
    }

    fn err(&self, e: redis::RedisError) -> QueueError {
        QueueError::Backend { url: self.url.clone(), message: crate::queue::redis_message(&e) }
    }

    /// The assignment of an entry just read; one this build cannot read is
    /// moved to `<key>:refused` (with a reason) and refused.
    async fn take(&self, (entry, fields): Entry, first_delivery: bool) -> Result<Assignment, QueueError> {
        let mut a = match decode(&fields) {
            Ok(a) => a,
            Err(reason) => {
                self.refuse(&entry, &fields, &reason).await?;
                return Err(QueueError::Refused { key: self.key.clone(), entry, reason, encoding: ENCODING, aside: format!("the stream {}:refused", self.key) });
            }
        };
        a.first_delivery = first_delivery;
        if let Ok(mut m) = self.entries.lock() {
            m.insert(a.id.clone(), entry);
        }
        if let Ok(mut t) = self.taken.lock() {
            t.insert(a.id.clone());
        }
        Ok(a)
    }

    /// Moves an entry from the queue to `<key>:refused`, its fields as they
    /// were and a `reason` added, in one transaction.
    async fn refuse(&self, entry: &str, fields: &[(Vec<u8>, Vec<u8>)], reason: &str) -> Result<(), QueueError> {
        let refused = format!("{}:refused", self.key);
        self.retry(|mut c| {
            let mut add = redis::cmd("XADD");
            add.arg(&refused).arg("*");
            for (k, v) in fields {
                add.arg(k).arg(v);
            }
            add.arg("reason").arg(reason);
            async move {
                redis::pipe()
                    .atomic()
                    .add_command(add).ignore()
                    .cmd("XACK").arg(&self.key).arg(&self.group).arg(entry).ignore()
                    .cmd("XDEL").arg(&self.key).arg(entry).ignore()
                    .query_async(&mut c)
                    .await
            }
        })
        .await
    }

    fn entry_of(&self, id: &str) -> Option<String> {
        self.entries.lock().ok().and_then(|m| m.get(id).cloned())
    }

    /// One claim-or-read: an entry whose taker's lease ran out, else up to
    /// `max` new ones, waiting up to `wait` for the first.
    async fn pop_once(&self, max: usize, wait: std::time::Duration) -> Result<Batch, QueueError> {
        let (mut c, kept) = self.reader(wait).await?;
        let mut r = self.pop_on(&mut c, max, wait).await;
        if kept && r.is_err() {
            // A kept connection may have gone stale (Redis restarted): once more on a new one.
            (c, _) = self.reader_new(wait).await?;
            r = self.pop_on(&mut c, max, wait).await;
        }
        if r.is_ok() {
            // Answered in full: the connection is free for the next read.
            let mut readers = self.readers.lock().unwrap_or_else(|p| p.into_inner());
            if readers.len() < READERS_KEPT {
                readers.push(c);
            }
        }
        r
    }

    /// `pop_once`, making the consumer group again when a Redis that
    /// restarted empty lost it (whoever watches `ensure` learns the queue was lost).
    async fn pop_some(&self, max: usize, wait: std::time::Duration) -> Result<Batch, QueueError> {
        match self.pop_once(max, wait).await {
            Err(QueueError::Backend { message, .. }) if missing_group(&message) => {
                self.make_group().await?;
                self.pop_once(max, wait).await
            }
            r => r,
        }
    }

    /// Whether it is time to look for entries whose taker's lease ran out
    /// (such an entry waited a lease already; a quarter more is little).
    fn claim_due(&self) -> bool {
        let mut at = self.claimed_at.lock().unwrap_or_else(|p| p.into_inner());
        let due = at.is_none_or(|t| t.elapsed() >= self.lease / 4);
        if due {
            *at = Some(std::time::Instant::now());
        }
        due
    }

    async fn pop_on(&self, c: &mut redis::aio::MultiplexedConnection, max: usize, wait: std::time::Duration) -> Result<Batch, QueueError> {
        let c = &mut *c;
        if self.claim_due() {
            // An entry a consumer took and held past the lease comes back first.
            let claimed: redis::Value = redis::cmd("XAUTOCLAIM")
                .arg(&self.key)
                .arg(&self.group)
                .arg(&self.consumer)
                .arg(self.lease.as_millis() as u64)
                .arg("0-0")
                .arg("COUNT")
                .arg(1)
                .query_async(c)
                .await
                .map_err(|e| self.err(e))?;
            if let redis::Value::Array(parts) = &claimed {
                if let Some(entry) = parts.get(1).map(parse_entries).and_then(|v| v.into_iter().next()) {
                    // More may have run out: look again on the next pop.
                    *self.claimed_at.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    return Ok(vec![self.taken_or_refused(entry, false).await?]);
                }
            }
        }
        let mut read = redis::cmd("XREADGROUP");
        read.arg("GROUP").arg(&self.group).arg(&self.consumer).arg("COUNT").arg(max.max(1));
        if !wait.is_zero() {
            // No BLOCK is a look (BLOCK 0 would wait for ever).
            read.arg("BLOCK").arg(wait.as_millis().max(1) as u64);
        }
        let read: redis::Value = read
            .arg("STREAMS")
            .arg(&self.key)
            .arg(">")
            .query_async(c)
            .await
            .map_err(|e| self.err(e))?;
        let mut taken = Vec::new();
        if let redis::Value::Array(streams) = &read {
            for s in streams {
                if let redis::Value::Array(kv) = s {
                    for entry in kv.get(1).map(parse_entries).unwrap_or_default() {
                        taken.push(self.taken_or_refused(entry, true).await?);
                    }
                }
            }
        }
        Ok(taken)
    }

    /// `take`, an entry refused (moved aside) kept as its error beside the
    /// others; only a backend that is away fails the whole read.
    async fn taken_or_refused(&self, entry: Entry, first_delivery: bool) -> Result<Result<Assignment, QueueError>, QueueError> {
        match self.take(entry, first_delivery).await {
            Err(e) if e.is_outage() => Err(e),
            r => Ok(r),
        }
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
            let (gen_key, generation) = (format!("{}:generation", self.key), super::process_mark());
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
    /// A kept one when there is one (true), else a new one.
    async fn reader(&self, wait: Duration) -> Result<(redis::aio::MultiplexedConnection, bool), QueueError> {
        let kept = self.readers.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match kept {
            Some(mut c) => {
                c.set_response_timeout(wait + REDIS_RESPONSE_TIMEOUT);
                Ok((c, true))
            }
            None => self.reader_new(wait).await,
        }
    }

    async fn reader_new(&self, wait: Duration) -> Result<(redis::aio::MultiplexedConnection, bool), QueueError> {
        let config = redis::AsyncConnectionConfig::new().set_connection_timeout(REDIS_CONNECT_TIMEOUT).set_response_timeout(wait + REDIS_RESPONSE_TIMEOUT);
        let c = self.client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| self.err(e))?;
        Ok((c, false))
    }
}

/// Blocking-read connections kept for reuse (about the readers of one process).
const READERS_KEPT: usize = 64;

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

/// A stream entry: its id, and its fields in order.
type Entry = (String, Vec<(Vec<u8>, Vec<u8>)>);

fn bytes(v: &redis::Value) -> Option<Vec<u8>> {
    match v {
        redis::Value::BulkString(b) => Some(b.clone()),
        redis::Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn parse_entries(v: &redis::Value) -> Vec<Entry> {
    let redis::Value::Array(items) = v else { return Vec::new() };
    items
        .iter()
        .filter_map(|e| {
            let redis::Value::Array(pair) = e else { return None };
            let id = String::from_utf8_lossy(&bytes(pair.first()?)?).into_owned();
            let redis::Value::Array(kv) = pair.get(1)? else { return None };
            let fields = kv.chunks(2).filter_map(|c| match c {
                [k, v] => Some((bytes(k)?, bytes(v)?)),
                _ => None,
            });
            Some((id, fields.collect()))
        })
        .collect()
}

/// An entry's assignment, or why this build cannot read it.
fn decode(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<Assignment, String> {
    let field = |name: &str| fields.iter().find(|(k, _)| k == name.as_bytes()).map(|(_, v)| v.as_slice());
    match (field(ENC_FIELD), field(BODY_FIELD)) {
        (Some(enc), Some(body)) if enc == ENCODING.as_bytes() => {
            let wire = v1::Assignment::decode(body).map_err(|e| format!("its {ENCODING} bytes do not decode ({e})"))?;
            assignment_from_wire(wire).map_err(|e| format!("its {ENCODING} cannot be read ({e})"))
        }
        (Some(enc), None) if enc == ENCODING.as_bytes() => Err(format!("enc={ENCODING} without the field {BODY_FIELD:?}")),
        (Some(enc), _) => Err(format!("an entry in the encoding {:?}", String::from_utf8_lossy(enc))),
        (None, _) if field("a").is_some() => Err("an assignment as JSON in the field \"a\" (written by an earlier steppe)".to_string()),
        (None, _) => {
            let names: Vec<String> = fields.iter().map(|(k, _)| format!("{:?}", String::from_utf8_lossy(k))).collect();
            Err(format!("an entry without the field {ENC_FIELD:?} (fields: {})", names.join(", ")))
        }
    }
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
            let body = assignment_to_wire(&a).encode_to_vec();
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
                                    .cmd("XADD").arg(key).arg("*").arg(ENC_FIELD).arg(ENCODING).arg(BODY_FIELD).arg(body)
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
                        async move { redis::cmd("XADD").arg(key).arg("*").arg(ENC_FIELD).arg(ENCODING).arg(BODY_FIELD).arg(body).query_async(&mut c).await }
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

    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move { self.pop_some(1, wait).await?.into_iter().next().transpose() })
    }

    fn pop_up_to(&self, max: usize, wait: std::time::Duration) -> BoxFuture<'_, Result<Batch, QueueError>> {
        Box::pin(async move { self.pop_some(max, wait).await })
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
            self.forget(&id);
            Ok(())
        })
    }

    fn forget(&self, id: &str) {
        if let Ok(mut m) = self.entries.lock() {
            m.remove(id);
        }
        if let Ok(mut t) = self.taken.lock() {
            t.remove(id);
        }
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
pub(crate) mod tests;
