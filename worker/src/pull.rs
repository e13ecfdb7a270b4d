//! Taking from the shared queue (a worker started with `--queue`): an entry
//! whenever a slot is free and, while the worker's steps are short, one more
//! that already waits taken ahead, so that its pop (and its confirmation,
//! where it needs one) overlaps the step before it instead of following it.
//! One taken ahead that finds no slot within [`HOLD`] is handed back for
//! another worker; [`runs_unconfirmed`] says which run before a Confirm.
//! A worker whose coordinator hands over ([`Hands`]) does not wait on the
//! queue: it looks without waiting, then waits in the coordinator's line
//! until it is handed work, told to look, or [`QUIET`] passes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steppe_runtime::assignment::Assignment;
use steppe_runtime::queue::Queue;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

use crate::hands::Hands;

/// How long an entry taken ahead waits for a slot before it is handed back;
/// a worker whose steps run longer than half of it takes none ahead.
pub const HOLD: Duration = Duration::from_millis(250);

/// How soon a worker in its coordinator's line looks at the queue for what
/// the coordinator did not hand over (entries of other processes, entries
/// back after a lease ran out); what the coordinator queues, it says. Each
/// such look that finds nothing doubles the time to the next, up to
/// [`QUIET_MAX`]: an idle worker asks a cloud queue no more often than one
/// that waits on the queue itself.
pub const QUIET: Duration = Duration::from_millis(250);

/// The longest a worker in line goes without looking (as long as a worker
/// without a line waits on the queue in one pop).
pub const QUIET_MAX: Duration = Duration::from_secs(1);

/// A worker's slots and its one place ahead.
pub struct Slots {
    free: Arc<Semaphore>,
    ahead: Arc<Semaphore>,
    /// Whether the last step to end ran for less than half of [`HOLD`].
    short: AtomicBool,
    /// A slot was let go.
    freed: Notify,
    /// Entries taken ahead that wait for a slot.
    waiting_ahead: std::sync::atomic::AtomicUsize,
}

impl Slots {
    pub fn new(slots: usize) -> Arc<Slots> {
        Arc::new(Slots { free: Arc::new(Semaphore::new(slots.max(1))), ahead: Arc::new(Semaphore::new(1)), short: AtomicBool::new(true), freed: Notify::new(), waiting_ahead: Default::default() })
    }

    /// What an assignment handed over runs under: a slot free now, or the
    /// first to free within [`HOLD`].
    pub fn for_hand_over(self: &Arc<Self>) -> Claim {
        match self.free.clone().try_acquire_owned() {
            Ok(p) => Claim::Slot(Slot::new(p, self.clone())),
            Err(_) => Claim::Handed(self.clone()),
        }
    }

    /// Whether a slot is free.
    pub fn any_free(&self) -> bool {
        self.free.available_permits() > 0
    }
}

/// A slot a step runs in; when it is let go, how long the step held it
/// decides whether the next is taken ahead.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    slots: Arc<Slots>,
    since: Instant,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, slots: Arc<Slots>) -> Slot {
        Slot { _permit: permit, slots, since: Instant::now() }
    }

    /// Whether no entry taken ahead waits for the slot that frees next.
    pub fn none_ahead(&self) -> bool {
        self.slots.waiting_ahead.load(Ordering::SeqCst) == 0
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.short.store(self.since.elapsed() < HOLD / 2, Ordering::Relaxed);
        self.slots.freed.notify_one();
    }
}

/// What an entry was taken under.
pub enum Claim {
    /// A free slot.
    Slot(Slot),
    /// The place ahead, given up once the entry has a slot.
    Ahead(OwnedSemaphorePermit, Arc<Slots>, AheadMark),
    /// Handed over while no slot was free (one was about to be).
    Handed(Arc<Slots>),
}

/// Counts an entry taken ahead in [`Slots`] while its claim lives.
pub struct AheadMark(Arc<Slots>);

impl AheadMark {
    fn new(slots: &Arc<Slots>) -> AheadMark {
        slots.waiting_ahead.fetch_add(1, Ordering::SeqCst);
        AheadMark(slots.clone())
    }
}

impl Drop for AheadMark {
    fn drop(&mut self) {
        self.0.waiting_ahead.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Claim {
    /// The slot to run in: at once, or for an entry taken ahead the first
    /// to free within [`HOLD`]; None when none did (it goes back).
    pub async fn slot(self) -> Option<Slot> {
        match self {
            Claim::Slot(s) => Some(s),
            Claim::Ahead(place, slots, _mark) => {
                let Ok(Ok(permit)) = tokio::time::timeout(HOLD, slots.free.clone().acquire_owned()).await else {
                    // None ahead again until a step ends and says it was short.
                    slots.short.store(false, Ordering::Relaxed);
                    return None;
                };
                drop(place);
                Some(Slot::new(permit, slots))
            }
            Claim::Handed(slots) => {
                let Ok(Ok(permit)) = tokio::time::timeout(HOLD, slots.free.clone().acquire_owned()).await else { return None };
                Some(Slot::new(permit, slots))
            }
        }
    }
}

/// Whether what was taken runs at once, before the coordinator confirms it:
/// the first taking of an entry queued by the coordinator of this session
/// (`incarnation`, from its Welcome), and not a stand-in (whose whole comes
/// with the Confirm). An entry back after its taker's lease ran out, or left
/// by a coordinator before this one, waits: only the coordinator knows
/// whether a run still waits for it.
pub fn runs_unconfirmed(a: &Assignment, incarnation: &str) -> bool {
    a.first_delivery && !a.by_reference && !incarnation.is_empty() && a.pushed_by == incarnation
}

/// Takes assignments from the shared queue while a slot is free and hands
/// each to the run loop (which tells the coordinator it took it). While the
/// steps are short it takes one more ahead of its slots, but only one that
/// already waits: the second of a read that found two, or, while the queue
/// keeps a backlog, one looked for without waiting. Waiting on the queue
/// for it would take an entry from a worker with a free slot and hold it
/// behind a running step. Stopped by `stop` (never cut short mid-pop: the
/// entry would sit with nobody until its lease ran out). With `hands` it
/// waits in the coordinator's line instead of on the queue.
pub async fn pull(q: Arc<dyn Queue>, slots: Arc<Slots>, out: mpsc::Sender<(Assignment, Claim)>, stop: Arc<AtomicBool>, hands: Option<Arc<Hands>>) {
    // Whether the last read found as many waiting as it asked for.
    let mut backlog = false;
    // In the coordinator's line: whether to look before waiting there.
    let mut look_now = true;
    // Until the next look of its own.
    let mut quiet = QUIET;
    loop {
        // Whether this look is one of its own (no word of work came first).
        let mut quiet_look = false;
        if let Some(h) = &hands {
            if !look_now {
                tokio::select! {
                    _ = h.look.notified() => quiet = QUIET,
                    _ = slots.freed.notified(), if backlog => {}
                    _ = tokio::time::sleep(quiet) => quiet_look = true,
                }
            }
            look_now = false;
            if stop.load(Ordering::SeqCst) {
                return;
            }
        }
        // Nothing else is taken while one taken ahead waits: the slot that
        // frees first is its own.
        let Ok(place) = slots.ahead.clone().acquire_owned().await else { return };
        let short = slots.short.load(Ordering::Relaxed);
        let free = match slots.free.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) if backlog && short => None,
            // Busy: what it is handed or told to look for waits for a slot.
            Err(_) if hands.is_some() => continue,
            Err(_) => match slots.free.clone().acquire_owned().await {
                Ok(p) => Some(p),
                Err(_) => return,
            },
        };
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let wait = if hands.is_some() { Duration::ZERO } else { Duration::from_secs(1) };
        if let (Some(h), Some(_)) = (&hands, &free) {
            // In line before the look: what is queued meanwhile, it is told of.
            h.enter().await;
        }
        let (max, wait) = match free {
            Some(_) if short => (2, wait),
            Some(_) => (1, wait),
            None => (1, Duration::ZERO),
        };
        let batch = match q.pop_up_to(max, wait).await {
            Ok(b) => b,
            Err(e) => {
                if let Some(l) = steppe_runtime::outage::failed("taking from the queue", &e) {
                    tracing::warn!("steppe worker: {l}");
                }
                // The slot stays free for what is handed over meanwhile.
                drop((free, place));
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Some(l) = steppe_runtime::outage::recovered("taking from the queue") {
            tracing::warn!("steppe worker: {l}");
        }
        backlog = batch.len() == max;
        if let Some(h) = &hands {
            if batch.is_empty() {
                if quiet_look {
                    quiet = (quiet * 2).min(QUIET_MAX);
                }
                continue;
            }
            quiet = QUIET;
            if free.is_some() {
                h.leave().await;
            }
            // More waits and a slot is still free: look again at once.
            look_now = backlog && slots.any_free();
        }
        let ahead = std::iter::once_with(|| Claim::Ahead(place, slots.clone(), AheadMark::new(&slots)));
        let mut claims = free.map(|p| Claim::Slot(Slot::new(p, slots.clone()))).into_iter().chain(ahead);
        for taken in batch {
            let a = match taken {
                Ok(a) => a,
                Err(e) => {
                    // One entry it could not read (moved aside): on to the next.
                    tracing::warn!("steppe worker: {e}");
                    continue;
                }
            };
            let Some(claim) = claims.next() else {
                // More than asked for: back for another taker.
                let _ = q.push(a).await;
                continue;
            };
            if stop.load(Ordering::SeqCst) {
                // Taken just as the worker stopped taking work: straight back on
                // the queue (the push retires the entry this worker took).
                let _ = q.push(a).await;
                continue;
            }
            if out.send((a, claim)).await.is_err() {
                return;
            }
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steppe_proto::v1::{worker_message, Waiting, WorkerMessage};

    #[test]
    fn only_a_first_taking_of_this_coordinators_entry_runs_unconfirmed() {
        let mine = Assignment { pushed_by: "7-1".into(), first_delivery: true, ..Assignment::command("r", "s", "true".into()) };
        assert!(runs_unconfirmed(&mine, "7-1"));
        assert!(!runs_unconfirmed(&mine, "8-2"), "queued by a coordinator before this one");
        assert!(!runs_unconfirmed(&mine, ""), "a coordinator that names no incarnation");
        assert!(!runs_unconfirmed(&Assignment { first_delivery: false, ..mine.clone() }, "7-1"), "back after a lease ran out");
        assert!(!runs_unconfirmed(&Assignment { by_reference: true, ..mine.clone() }, "7-1"), "a stand-in");
        assert!(!runs_unconfirmed(&Assignment { pushed_by: String::new(), ..mine }, ""), "neither says");
    }

    #[tokio::test]
    async fn one_taken_ahead_runs_when_a_slot_frees_and_goes_back_when_none_does() {
        let slots = Slots::new(1);
        let first = Claim::Slot(Slot::new(slots.free.clone().acquire_owned().await.unwrap(), slots.clone()));
        let running = first.slot().await.expect("a slot's claim runs at once");
        let ahead = slots.ahead.clone().acquire_owned().await.unwrap();
        assert!(running.none_ahead());
        let waiting = tokio::spawn(Claim::Ahead(ahead, slots.clone(), AheadMark::new(&slots)).slot());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(slots.ahead.available_permits(), 0, "the place ahead is held while it waits");
        assert!(!running.none_ahead(), "the slot that frees next is the one taken ahead's: the worker does not say it waits");
        drop(running);
        let second = waiting.await.unwrap().expect("the slot let go is the one taken ahead's");
        assert!(second.none_ahead());
        assert_eq!(slots.ahead.available_permits(), 1, "the place ahead is free again once it runs");
        assert!(slots.short.load(Ordering::Relaxed), "a step of 20 ms is short");
        // Nothing frees within the hold: handed back, its place ahead free.
        let ahead = slots.ahead.clone().acquire_owned().await.unwrap();
        assert!(Claim::Ahead(ahead, slots.clone(), AheadMark::new(&slots)).slot().await.is_none());
        assert_eq!(slots.ahead.available_permits(), 1);
        assert!(!slots.short.load(Ordering::Relaxed), "after one goes back, none is taken ahead until a step ends");
        drop(second);
        let slot = || async { Claim::Slot(Slot::new(slots.free.clone().acquire_owned().await.unwrap(), slots.clone())).slot().await.unwrap() };
        drop(slot().await);
        assert!(slots.short.load(Ordering::Relaxed), "the step that ended at once was short");
        let long = slot().await;
        tokio::time::sleep(HOLD).await;
        drop(long);
        assert!(!slots.short.load(Ordering::Relaxed), "a step that held its slot past half the hold is not short");
    }

    #[tokio::test]
    async fn a_hand_over_runs_in_a_free_slot_or_the_first_to_free_within_the_hold() {
        let slots = Slots::new(1);
        let Claim::Slot(first) = slots.for_hand_over() else { panic!("a slot was free: it is taken at once") };
        assert!(!slots.any_free());
        let second = tokio::spawn(slots.for_hand_over().slot());
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        let second = second.await.unwrap().expect("the slot let go within the hold");
        // None frees within the hold: it goes back.
        let t = std::time::Instant::now();
        assert!(slots.for_hand_over().slot().await.is_none());
        assert!(t.elapsed() >= HOLD);
        drop(second);
        assert!(slots.any_free());
    }

    /// Counts its looks and never has anything.
    struct Empty(std::sync::atomic::AtomicUsize);

    impl Queue for Empty {
        fn push(&self, _: Assignment) -> futures::future::BoxFuture<'_, Result<(), steppe_runtime::queue::QueueError>> {
            Box::pin(async { Ok(()) })
        }
        fn pop_within(&self, _: Duration) -> futures::future::BoxFuture<'_, Result<Option<Assignment>, steppe_runtime::queue::QueueError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(None) })
        }
        fn ack(&self, _: &str) -> futures::future::BoxFuture<'_, Result<(), steppe_runtime::queue::QueueError>> {
            Box::pin(async { Ok(()) })
        }
        fn remove(&self, _: &str) -> futures::future::BoxFuture<'_, Result<bool, steppe_runtime::queue::QueueError>> {
            Box::pin(async { Ok(false) })
        }
    }

    #[tokio::test]
    async fn a_worker_in_line_looks_less_often_while_it_finds_nothing_and_at_once_when_told() {
        let q = Arc::new(Empty(Default::default()));
        let (session, mut said) = mpsc::channel(64);
        let hands = Arc::new(Hands::new(session));
        let (out, _taken) = mpsc::channel(4);
        let stop = Arc::new(AtomicBool::new(false));
        let puller = tokio::spawn(pull(q.clone(), Slots::new(1), out, stop.clone(), Some(hands.clone())));
        // Looks at 0, 250, 750 and 1,750 ms; every 250 ms it would be eleven.
        tokio::time::sleep(Duration::from_millis(2600)).await;
        let quiet = q.0.load(Ordering::SeqCst);
        assert!((3..=5).contains(&quiet), "{quiet} looks in 2.6 s of nothing");
        assert!(matches!(said.try_recv(), Ok(WorkerMessage { msg: Some(worker_message::Msg::Waiting(Waiting { waiting: true })) })), "in line while it looks");
        // Told to look: at once, and again 250 ms later.
        hands.look.notify_one();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(q.0.load(Ordering::SeqCst) - quiet, 2);
        stop.store(true, Ordering::SeqCst);
        hands.look.notify_one();
        tokio::time::timeout(Duration::from_secs(2), puller).await.expect("stops when told").unwrap();
    }

}
