//! Acknowledgements made soon (`Queue::ack_soon`): sent in the same write as
//! the consumer's next read, or by one flusher within [`ACK_WITHIN`] when no
//! read takes them, so a step costs one write to Redis fewer and no timer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

/// How long an acknowledgement waits for a read to go with.
pub(super) const ACK_WITHIN: Duration = Duration::from_millis(20);

/// How many times the flusher sends what failed before it gives up (its
/// waits doubling from [`ACK_WITHIN`]: some five seconds in all).
const FLUSH_ATTEMPTS: u32 = 8;

/// What a waiter is told: sent, or why it could not be.
pub(super) type Answer = Result<(), String>;

#[derive(Default)]
struct Due {
    entries: Vec<(String, oneshot::Sender<Answer>)>,
    /// A flusher runs (one at a time).
    armed: bool,
}

/// The entries of one consumer due an acknowledgement.
#[derive(Clone, Default)]
pub(super) struct AcksDue(Arc<Mutex<Due>>);

impl AcksDue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Due> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `entry` due, the answer told once it is sent; true when no
    /// flusher runs and the caller should start one.
    pub(super) fn add(&self, entry: String) -> (oneshot::Receiver<Answer>, bool) {
        let (tx, rx) = oneshot::channel();
        let mut due = self.lock();
        due.entries.push((entry, tx));
        let arm = !due.armed;
        due.armed = true;
        (rx, arm)
    }

    /// What a read takes along.
    pub(super) fn entries(&self) -> Vec<String> {
        self.lock().entries.iter().map(|(e, _)| e.clone()).collect()
    }

    /// `entries` were acknowledged: their waiters are told.
    pub(super) fn sent(&self, entries: &[String]) {
        let done: Vec<_> = {
            let mut due = self.lock();
            let (done, left) = std::mem::take(&mut due.entries).into_iter().partition(|(e, _)| entries.contains(e));
            due.entries = left;
            done
        };
        for (_, tx) in done {
            let _ = tx.send(Ok(()));
        }
    }

    /// Whether any is due.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    /// Sends, every [`ACK_WITHIN`], what no read took, until nothing is due.
    pub(super) async fn flush(self, mut conn: redis::aio::ConnectionManager, key: String, group: String) {
        let mut failed = 0;
        loop {
            tokio::time::sleep(ACK_WITHIN * 2u32.pow(failed)).await;
            let taken = {
                let mut due = self.lock();
                if due.entries.is_empty() {
                    due.armed = false;
                    return;
                }
                std::mem::take(&mut due.entries)
            };
            let entries: Vec<String> = taken.iter().map(|(e, _)| e.clone()).collect();
            match acknowledge(&mut conn, &key, &group, &entries).await {
                Ok(()) => {
                    failed = 0;
                    for (_, tx) in taken {
                        let _ = tx.send(Ok(()));
                    }
                }
                Err(_) if failed + 1 < FLUSH_ATTEMPTS => {
                    failed += 1;
                    let mut due = self.lock();
                    let later = std::mem::take(&mut due.entries);
                    due.entries = taken.into_iter().chain(later).collect();
                }
                Err(e) => {
                    // Left to their lease: whoever takes one again is told
                    // by the coordinator that nobody waits for it.
                    failed = 0;
                    let message = crate::queue::redis_message(&e);
                    for (_, tx) in taken {
                        let _ = tx.send(Err(message.clone()));
                    }
                }
            }
        }
    }
}

/// XACK and XDEL of `entries`, one pipeline.
pub(super) async fn acknowledge<C: redis::aio::ConnectionLike>(c: &mut C, key: &str, group: &str, entries: &[String]) -> redis::RedisResult<()> {
    redis::pipe().cmd("XACK").arg(key).arg(group).arg(entries).ignore().cmd("XDEL").arg(key).arg(entries).ignore().query_async(c).await
}
