//! A remote queue with a short cut: an assignment handed out for the first
//! time while one of this process's takers waits for work goes to that
//! taker in memory, with no round trip; everything else goes through the
//! remote queue.
//!
//! The coordinator's sessions with pushed workers take from the queue the
//! way any taker does; when one waits with a slot free, the push and the
//! read of a remote queue (two round trips and the backend's own work)
//! carry nothing another process could need, since nobody else would take
//! the entry before it. A taker gets in line, looks at the remote queue
//! without waiting (unless a look found it empty within `QUIET` and this
//! process pushed nothing there since), then waits in this process for a
//! hand-over, for a push of this process to the remote queue, or for its
//! time, and looks again: what other processes put there (an entry whose
//! taker's lease ran out) reaches it on a later look.
//!
//! What is handed in memory has no lease: the session that holds it
//! answers for it (a worker lost is requeued by the coordinator). A
//! requeue (a later epoch) and an assignment whose entry this process took
//! from the remote queue always go through the remote queue, which counts
//! deliveries and retires the old entry.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::{Batch, BoxFuture, Queue, QueueError};
use crate::assignment::Assignment;

pub struct Handoff {
    remote: Arc<dyn Queue>,
    /// Takers waiting for work, the longest waiting first.
    waiters: Mutex<VecDeque<(u64, oneshot::Sender<Assignment>)>>,
    next_waiter: std::sync::atomic::AtomicU64,
    /// Ids handed over in memory: not in the remote queue, so neither
    /// acknowledged nor removed there.
    handed: Mutex<HashSet<String>>,
    /// Ids taken from the remote queue through here and not yet done with:
    /// put back, they go there (their entry is retired with the push).
    from_remote: Mutex<HashSet<String>>,
    /// Counts this process's pushes to the remote queue, so a taker that
    /// looked there just before one wakes for it.
    pushed: Arc<watch::Sender<u64>>,
    /// When a look at the remote queue last found nothing, and the count of
    /// pushes then: until one more push or QUIET, nobody looks again.
    found_empty: Mutex<Option<(tokio::time::Instant, u64)>>,
}

/// How long a look at the remote queue that found nothing stands for
/// every taker here, unless this process pushes there meanwhile; a taker
/// waiting looks again after it. What other processes put there (an entry
/// whose taker's lease ran out, which waited a lease already) waits about
/// this much longer. (On SQS a look is a short poll, which may miss a
/// message: one this process pushed may then wait this long.)
const QUIET: Duration = Duration::from_millis(250);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Handoff {
    pub fn new(remote: Arc<dyn Queue>) -> Handoff {
        Handoff { remote, waiters: Mutex::new(VecDeque::new()), next_waiter: Default::default(), handed: Mutex::new(HashSet::new()), from_remote: Mutex::new(HashSet::new()), pushed: Arc::new(watch::Sender::new(0)), found_empty: Mutex::new(None) }
    }

    /// To the taker that has waited longest, if one waits; otherwise back.
    fn give_to_waiter(&self, mut a: Assignment) -> Result<(), Assignment> {
        let mut waiters = lock(&self.waiters);
        while let Some((_, taker)) = waiters.pop_front() {
            // Booked before it can be reported on.
            lock(&self.handed).insert(a.id.clone());
            match taker.send(a) {
                Ok(()) => return Ok(()),
                // That taker is gone: the next one.
                Err(back) => {
                    lock(&self.handed).remove(&back.id);
                    a = back;
                }
            }
        }
        Err(a)
    }

    /// Handed over to a taker that could not take it: to another waiting,
    /// or onto the remote queue, tried until it is there (the step waits
    /// for it; nobody else knows of it).
    fn put_back(&self, a: Assignment) {
        let a = match self.give_to_waiter(a) {
            Ok(()) => return,
            Err(a) => a,
        };
        lock(&self.handed).remove(&a.id);
        let (remote, pushed) = (self.remote.clone(), self.pushed.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                while remote.push(a.clone()).await.is_err() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                pushed.send_modify(|n| *n = n.wrapping_add(1));
            });
        }
    }

    /// In line for a hand-over until the returned place is left.
    fn wait_in_line(&self) -> Place<'_> {
        let id = self.next_waiter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        lock(&self.waiters).push_back((id, tx));
        Place { queue: self, id, rx: Some(rx) }
    }
}

/// A taker's place in line; left by `leave` or when dropped (a hand-over
/// that reached a taker who went is put on the remote queue).
struct Place<'a> {
    queue: &'a Handoff,
    id: u64,
    rx: Option<oneshot::Receiver<Assignment>>,
}

impl Place<'_> {
    /// Out of line; whatever was handed over meanwhile.
    fn leave(&mut self) -> Option<Assignment> {
        lock(&self.queue.waiters).retain(|(id, _)| *id != self.id);
        // Nothing is handed over once out of line.
        self.rx.take().and_then(|mut rx| rx.try_recv().ok())
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if self.rx.is_none() {
            return;
        }
        if let Some(a) = self.leave() {
            self.queue.put_back(a);
        }
    }
}

impl Queue for Handoff {
    fn hand_over(&self, a: Assignment) -> Result<(), Assignment> {
        if a.epoch == 0 && !lock(&self.from_remote).contains(&a.id) {
            self.give_to_waiter(a)
        } else {
            Err(a)
        }
    }

    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        let a = match self.hand_over(a) {
            Ok(()) => return Box::pin(async { Ok(()) }),
            Err(a) => a,
        };
        lock(&self.handed).remove(&a.id);
        // Once there, its entry is the remote queue's to retire.
        lock(&self.from_remote).remove(&a.id);
        Box::pin(async move {
            self.remote.push(a).await?;
            self.pushed.send_modify(|n| *n = n.wrapping_add(1));
            Ok(())
        })
    }

    fn pop_within(&self, wait: Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move { self.pop_up_to(1, wait).await?.into_iter().next().transpose() })
    }

    fn pop_up_to(&self, max: usize, wait: Duration) -> BoxFuture<'_, Result<Batch, QueueError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + wait;
            let mut pushes = self.pushed.subscribe();
            loop {
                // Marked before the look: a push that lands after it wakes the wait below.
                let mark = *pushes.borrow_and_update();
                // In line before the look: a hand-over meanwhile is not missed.
                let mut place = self.wait_in_line();
                let quiet_until = lock(&self.found_empty).filter(|(_, pushed)| *pushed == mark).map(|(at, _)| at + QUIET).filter(|t| *t > tokio::time::Instant::now());
                let mut found = Vec::new();
                let mut next_look = quiet_until;
                if quiet_until.is_none() {
                    let at = tokio::time::Instant::now();
                    found = match self.remote.pop_up_to(max, Duration::ZERO).await {
                        Ok(found) => found,
                        // What was handed over meanwhile needs no remote queue.
                        Err(e) => return place.leave().map(|a| vec![Ok(a)]).ok_or(e),
                    };
                    lock(&self.from_remote).extend(found.iter().flatten().map(|a| a.id.clone()));
                    *lock(&self.found_empty) = found.is_empty().then_some((at, mark));
                    next_look = Some(at + QUIET);
                }
                if !found.is_empty() || tokio::time::Instant::now() >= deadline {
                    if let Some(a) = place.leave() {
                        if found.len() < max.max(1) {
                            self.remote.forget(&a.id);
                            found.push(Ok(a));
                        } else {
                            self.put_back(a);
                        }
                    }
                    return Ok(found);
                }
                let handed = tokio::select! {
                    Some(a) = async { match place.rx.as_mut() { Some(rx) => rx.await.ok(), None => None } } => Some(a),
                    _ = pushes.changed() => None,
                    _ = tokio::time::sleep_until(next_look.map_or(deadline, |t| t.min(deadline))) => None,
                };
                if let Some(a) = handed.or_else(|| place.leave()) {
                    self.remote.forget(&a.id);
                    return Ok(vec![Ok(a)]);
                }
            }
        })
    }

    fn pushes(&self) -> u64 {
        *self.pushed.borrow()
    }

    fn await_hand_over(&self, seen: u64, wait: Duration) -> BoxFuture<'_, Option<Assignment>> {
        Box::pin(async move {
            let mut pushes = self.pushed.subscribe();
            let mut place = self.wait_in_line();
            if *pushes.borrow_and_update() == seen {
                let handed = tokio::select! {
                    Some(a) = async { match place.rx.as_mut() { Some(rx) => rx.await.ok(), None => None } } => Some(a),
                    _ = pushes.changed() => None,
                    _ = tokio::time::sleep(wait) => None,
                };
                if handed.is_some() {
                    return handed;
                }
            }
            place.leave()
        })
    }

    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        lock(&self.from_remote).remove(id);
        if lock(&self.handed).remove(id) {
            return Box::pin(async { Ok(()) });
        }
        self.remote.ack(id)
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        if lock(&self.handed).contains(id) {
            // Handed over: taken, not waiting.
            return Box::pin(async { Ok(false) });
        }
        self.remote.remove(id)
    }

    fn forget(&self, id: &str) {
        lock(&self.handed).remove(id);
        lock(&self.from_remote).remove(id);
        self.remote.forget(id);
    }

    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        self.remote.extend_held()
    }

    fn lease(&self) -> Option<Duration> {
        self.remote.lease()
    }

    fn ensure(&self) -> BoxFuture<'_, Result<bool, QueueError>> {
        self.remote.ensure()
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<(Assignment, String)>, QueueError>> {
        self.remote.dead_letters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::conformance::a;
    use crate::queue::InProcessQueue;

    fn over_memory() -> (Arc<InProcessQueue>, Arc<Handoff>) {
        let remote = Arc::new(InProcessQueue::new());
        (remote.clone(), Arc::new(Handoff::new(remote)))
    }

    /// A taker that waits up to 30 s for one assignment.
    fn taker(h: &Arc<Handoff>) -> tokio::task::JoinHandle<Result<Option<Assignment>, QueueError>> {
        let h = h.clone();
        tokio::spawn(async move { h.pop_within(Duration::from_secs(30)).await })
    }

    async fn until_one_waits(h: &Handoff) {
        for _ in 0..500 {
            if !lock(&h.waiters).is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("no taker got in line");
    }

    #[tokio::test]
    async fn a_push_while_a_taker_waits_is_handed_over_in_memory() {
        let (remote, h) = over_memory();
        let taker = taker(&h);
        until_one_waits(&h).await;
        h.push(a("first")).await.unwrap();
        assert_eq!(taker.await.unwrap().unwrap().map(|a| a.id).as_deref(), Some("first"));
        assert!(remote.pop_within(Duration::ZERO).await.unwrap().is_none(), "a hand-over leaves nothing on the remote queue");
        assert!(!h.remove("first").await.unwrap(), "handed over is taken, not waiting");
        h.ack("first").await.unwrap();
        assert!(lock(&h.handed).is_empty(), "acknowledged: nothing kept of it");
        assert!(lock(&h.waiters).is_empty(), "the taker left the line");
    }

    #[tokio::test]
    async fn with_nobody_waiting_a_push_goes_to_the_remote_queue() {
        let (remote, h) = over_memory();
        h.push(a("queued")).await.unwrap();
        assert_eq!(remote.pop_within(Duration::ZERO).await.unwrap().map(|a| a.id).as_deref(), Some("queued"));
    }

    #[tokio::test]
    async fn a_requeue_goes_through_the_remote_queue_and_wakes_a_waiting_taker() {
        let (remote, h) = over_memory();
        let taker = taker(&h);
        until_one_waits(&h).await;
        h.push(Assignment { epoch: 1, ..a("again") }).await.unwrap();
        // Not handed over: the waiting taker found it on the remote queue,
        // long before its own time ran out.
        let taken = tokio::time::timeout(Duration::from_secs(10), taker).await.expect("found before the taker's time ran out");
        assert_eq!(taken.unwrap().unwrap().map(|a| a.id).as_deref(), Some("again"));
        assert!(lock(&h.handed).is_empty());
        assert!(remote.pop_within(Duration::ZERO).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn what_was_taken_from_the_remote_queue_goes_back_there() {
        let (remote, h) = over_memory();
        h.push(a("boomerang")).await.unwrap();
        let taken = h.pop_within(Duration::from_secs(1)).await.unwrap().expect("taken");
        let taker = taker(&h);
        until_one_waits(&h).await;
        h.push(taken).await.unwrap();
        let taken = tokio::time::timeout(Duration::from_secs(10), taker).await.expect("found before the taker's time ran out");
        assert_eq!(taken.unwrap().unwrap().map(|a| a.id).as_deref(), Some("boomerang"));
        assert!(lock(&h.handed).is_empty(), "put back through the remote queue, not handed over");
        assert!(remote.pop_within(Duration::ZERO).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_hand_over_to_a_taker_that_went_is_not_lost() {
        let (remote, h) = over_memory();
        let mut pop = h.pop_within(Duration::from_secs(30));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(pop.as_mut().poll(&mut cx).is_pending(), "nothing to take yet");
        h.push(a("orphan")).await.unwrap();
        assert_eq!(lock(&h.handed).len(), 1, "handed over to the waiting taker");
        drop(pop);
        let back = remote.pop_within(Duration::from_secs(10)).await.unwrap();
        assert_eq!(back.map(|a| a.id).as_deref(), Some("orphan"), "the taker went: onto the remote queue");
        assert!(lock(&h.handed).is_empty());
    }

    #[tokio::test]
    async fn a_taker_whose_time_runs_out_takes_nothing_and_leaves_the_line() {
        let (_remote, h) = over_memory();
        assert!(h.pop_up_to(4, Duration::from_millis(20)).await.unwrap().is_empty());
        assert!(lock(&h.waiters).is_empty());
        h.push(a("later")).await.unwrap();
        assert!(lock(&h.handed).is_empty(), "nobody in line: not handed over");
    }

    #[tokio::test]
    async fn a_wait_for_a_hand_over_takes_one_and_ends_when_this_process_queues_one() {
        let (remote, h) = over_memory();
        let stand = |seen: u64| {
            let h = h.clone();
            tokio::spawn(async move { h.await_hand_over(seen, Duration::from_secs(30)).await })
        };
        let waiting = stand(h.pushes());
        until_one_waits(&h).await;
        h.push(a("handed")).await.unwrap();
        assert_eq!(waiting.await.unwrap().map(|a| a.id).as_deref(), Some("handed"));
        assert!(remote.pop_within(Duration::ZERO).await.unwrap().is_none(), "handed over, not queued");
        // A requeue goes onto the remote queue and ends the wait: whoever
        // waited looks there.
        let seen = h.pushes();
        let waiting = stand(seen);
        until_one_waits(&h).await;
        h.push(Assignment { epoch: 1, ..a("again") }).await.unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("ended by the push, long before its time");
        assert!(ended.unwrap().is_none());
        assert_ne!(h.pushes(), seen, "the push is counted");
        assert!(lock(&h.waiters).is_empty(), "out of line");
        // A count already stale: at once, out of line, and nothing handed to it.
        let stale = tokio::time::timeout(Duration::from_secs(1), h.await_hand_over(seen, Duration::from_secs(30))).await;
        assert!(stale.expect("returns at once").is_none());
        assert!(lock(&h.waiters).is_empty());
        assert_eq!(remote.pop_within(Duration::ZERO).await.unwrap().map(|a| a.id).as_deref(), Some("again"));
    }

    #[tokio::test]
    async fn a_wait_given_up_after_a_hand_over_loses_nothing() {
        let (remote, h) = over_memory();
        let mut wait = h.await_hand_over(h.pushes(), Duration::from_secs(30));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(wait.as_mut().poll(&mut cx).is_pending(), "nothing handed over yet");
        h.push(a("caught")).await.unwrap();
        assert_eq!(lock(&h.handed).len(), 1, "handed over to the wait in line");
        drop(wait);
        let back = remote.pop_within(Duration::from_secs(10)).await.unwrap();
        assert_eq!(back.map(|a| a.id).as_deref(), Some("caught"), "the wait went: onto the remote queue");
    }

    /// A remote queue whose looks fail after a while (a Redis away).
    struct Away(InProcessQueue);

    impl Queue for Away {
        fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
            self.0.push(a)
        }
        fn pop_within(&self, _wait: Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Err(QueueError::Backend { url: "redis://away".into(), message: "connection refused".into() })
            })
        }
        fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
            self.0.ack(id)
        }
        fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
            self.0.remove(id)
        }
    }

    #[tokio::test]
    async fn a_hand_over_during_a_failed_look_is_taken_all_the_same() {
        let h = Arc::new(Handoff::new(Arc::new(Away(InProcessQueue::new()))));
        let taker = taker(&h);
        until_one_waits(&h).await;
        h.push(a("kept")).await.unwrap();
        let taken = taker.await.unwrap();
        assert_eq!(taken.expect("the hand-over, not the remote queue's error").map(|a| a.id).as_deref(), Some("kept"));
    }
}
