//! The EventHub actor: every event of a run, in the order it happened, goes
//! to the store (step records, logs and the run's events in batches — live
//! output lines among them, so a follower sees a step's output before it
//! ends) and to its
//! subscribers — the terminal ([`terminal::Terminal`], unless quiet) and
//! whoever follows a run ([`watchers::Watchers`]). One inbox keeps them all
//! in order (the mailbox only wakes the hub for it: [`Event::Inbox`]); the
//! store's writes leave it for a thread of their own
//! ([`writer::Writer`]). [`EventHub`] is the handle every part of the process holds.

mod log;
mod terminal;
mod watchers;
mod writer;

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use steppe_runtime::outcome::{Outcome, StepError};
use steppe_runtime::printable::escape_controls;
use steppe_runtime::store::{LogLine, RunEvent, StepRecord, Store};
use steppe_worker::sink::{LineSink, Stream};

pub use log::Log;
pub use terminal::Terminal;
pub use watchers::Watchers;

/// What the hub shows: a subscriber gets every line, in order, and the
/// steps as they start and end.
pub trait Subscriber: Send + 'static {
    /// A line of a run (`run_id` empty: a note of the process itself).
    fn line(&mut self, run_id: &str, line: &str);
    /// A run of `pipeline`'s `job` began (its lines follow).
    fn run_began(&mut self, _run_id: &str, _pipeline: &str, _job: &str) {}
    /// A run ended with this outcome word.
    fn run_ended(&mut self, _run_id: &str, _outcome: &str) {}
    fn step_started(&mut self, _run_id: &str, _step: &str) {}
    fn step_ended(&mut self, _run_id: &str, _step: &str) {}
    /// How many of the process's steps wait in a queue for a worker (said when it changes).
    fn waiting(&mut self, _steps: usize) {}
    /// Half a second passed (only for a subscriber that [`wants_ticks`](Subscriber::wants_ticks)).
    fn tick(&mut self) {}
    /// Everything sent so far was shown.
    fn flush(&mut self) {}
    fn wants_ticks(&self) -> bool {
        false
    }
}

pub enum Event {
    /// A note of the process, for subscribers only.
    Say(String),
    /// A run began / ended (for subscribers that name runs).
    RunBegan { run_id: String, pipeline: String, job: String },
    RunEnded { run_id: String, outcome: String },
    /// A step of a run began.
    Started { run_id: String, step: String },
    /// A step ended: its outcome word and summary line.
    Ended { run_id: String, step: String, outcome: String, line: String },
    /// A note about a run (a retry, a failover, a verdict …).
    RunNote { run_id: String, line: String },
    /// Half a second passed (durations tick).
    Tick,
    /// How many steps wait for a worker now.
    Waiting(usize),
    /// A line of live output: shown, sent to watchers and kept with the
    /// run's events (the first [`LIVE_KEPT_MAX`] of a step's; its record
    /// keeps the rest when it ends).
    Line { run_id: String, line: LogLine },
    /// Enough records wait in [`Records`] to be written before the next tick.
    Records,
    /// Reply once everything before it is shown and in the store.
    Flush(RpcReplyPort<()>),
    /// Events wait in the inbox: the hub is woken once for all that gather
    /// there while it works (each in its own message cost more than
    /// handling it), and handles them in the order they were sent.
    Inbox,
    /// Also send a run's lines here (a `steppe submit` following it).
    Watch { run_id: String, tx: tokio::sync::mpsc::UnboundedSender<String> },
    Unwatch(String),
}

struct HubActor;

pub struct HubState {
    store: Option<writer::Writer>,
    /// Events not yet in the store, in order.
    events: Vec<(String, RunEvent)>,
    /// What the handle gathered for the store beside the mailbox; written
    /// with the events in one batch on each tick, at a flush, or when many.
    records: Arc<std::sync::Mutex<Records>>,
    /// Live lines kept so far of each running step (run id, step).
    live_kept: std::collections::HashMap<(String, String), usize>,
    watchers: Watchers,
    /// The terminal (none when quiet), and any other subscriber.
    subscribers: Vec<Box<dyn Subscriber>>,
    /// Live lines sent to the hub and not yet shown (shared with the handle).
    pending_lines: Arc<std::sync::atomic::AtomicUsize>,
    /// Events sent by the handle, not yet handled, in order.
    inbox: Inbox,
}

type Inbox = Arc<std::sync::Mutex<std::collections::VecDeque<Event>>>;

/// The most events handled for one wake-up: the hub then lets other tasks
/// run and comes back for the rest.
const INBOX_TURN: usize = 64;

impl HubState {
    fn each(&mut self, mut f: impl FnMut(&mut dyn Subscriber)) {
        f(&mut self.watchers);
        for s in &mut self.subscribers {
            f(s.as_mut());
        }
    }

    fn event(&mut self, run_id: &str, kind: &str, step: &str, message: &str) {
        if self.store.is_some() {
            self.events.push((run_id.to_string(), RunEvent::now(kind, step, message)));
        }
    }

    /// A live line kept with the run's events, up to [`LIVE_KEPT_MAX`] a step.
    fn live_line(&mut self, run_id: &str, line: &LogLine) {
        if self.store.is_none() {
            return;
        }
        let kept = self.live_kept.entry((run_id.to_string(), line.step.clone())).or_default();
        *kept += 1;
        let kept = *kept;
        if kept <= LIVE_KEPT_MAX {
            self.event(run_id, if line.stderr { "stderr" } else { "stdout" }, &line.step, &line.line);
        } else if kept == LIVE_KEPT_MAX + 1 {
            let note = format!("… {} wrote more than {LIVE_KEPT_MAX} lines: the rest is in its record when it ends (`steppe runs --logs`)", escape_controls(&line.step));
            self.event(run_id, "note", &line.step, &note);
        }
    }

    /// Everything gathered, as one batch (one transaction where the store can).
    fn batch(&mut self) -> steppe_runtime::store::Batch {
        let r = std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()));
        steppe_runtime::store::Batch { events: std::mem::take(&mut self.events), logs: r.logs, steps: r.steps, spans: r.spans, chains: r.chains }
    }

    /// Hands everything gathered to the store's writer.
    async fn flush_all(&mut self) {
        let batch = self.batch();
        if let Some(w) = &mut self.store {
            w.write(batch).await;
        }
    }
}

impl Actor for HubActor {
    type Msg = Event;
    type State = HubState;
    type Arguments = (Vec<Box<dyn Subscriber>>, Option<Arc<dyn Store>>, Arc<std::sync::atomic::AtomicUsize>, Arc<std::sync::Mutex<Records>>, Inbox);

    async fn pre_start(&self, me: ActorRef<Event>, (subscribers, store, pending_lines, records, inbox): Self::Arguments) -> Result<HubState, ActorProcessingErr> {
        if store.is_some() || subscribers.iter().any(|s| s.wants_ticks()) {
            let _ = me.send_interval(Duration::from_millis(500), || Event::Tick);
        }
        Ok(HubState { store: store.map(writer::Writer::new), events: Vec::new(), records, live_kept: Default::default(), watchers: Watchers::default(), subscribers, pending_lines, inbox })
    }

    async fn handle(&self, me: ActorRef<Event>, ev: Event, st: &mut HubState) -> Result<(), ActorProcessingErr> {
        match ev {
            Event::Inbox => {
                if st.handle_inbox(INBOX_TURN).await {
                    let _ = me.cast(Event::Inbox);
                }
            }
            ev => st.handle(ev).await,
        }
        if st.events.len() >= EVENTS_FULL {
            st.flush_all().await;
        }
        Ok(())
    }
}

impl HubState {
    /// Handles up to `most` events waiting in the inbox, in order; true
    /// when more wait.
    async fn handle_inbox(&mut self, most: usize) -> bool {
        let (turn, more): (Vec<Event>, bool) = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            let n = inbox.len().min(most);
            (inbox.drain(..n).collect(), !inbox.is_empty())
        };
        for ev in turn {
            self.handle(ev).await;
        }
        more
    }

    async fn handle(&mut self, ev: Event) {
        let st = self;
        match ev {
            // Only the mailbox carries it (the actor's `handle` above).
            Event::Inbox => {}
            Event::Say(l) => st.each(|s| s.line("", &l)),
            Event::RunBegan { run_id, pipeline, job } => st.each(|s| s.run_began(&run_id, &pipeline, &job)),
            Event::RunEnded { run_id, outcome } => st.each(|s| s.run_ended(&run_id, &outcome)),
            Event::Started { run_id, step } => {
                st.event(&run_id, "started", &step, "");
                let line = format!("▶ {}", escape_controls(&step));
                st.each(|s| {
                    s.step_started(&run_id, &step);
                    s.line(&run_id, &line);
                });
            }
            Event::Waiting(n) => st.each(|s| s.waiting(n)),
            Event::RunNote { run_id, line } => {
                st.event(&run_id, "note", "", &line);
                st.each(|s| s.line(&run_id, &line));
            }
            Event::Ended { run_id, step, outcome, line } => {
                st.live_kept.remove(&(run_id.clone(), step.clone()));
                st.event(&run_id, "ended", &step, &outcome);
                st.each(|s| {
                    s.step_ended(&run_id, &step);
                    s.line(&run_id, &line);
                });
            }
            Event::Tick => {
                st.flush_all().await;
                st.each(|s| {
                    if s.wants_ticks() {
                        s.tick()
                    }
                });
            }
            Event::Line { run_id, line } => {
                st.pending_lines.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                let text = format!("[{}] {}", escape_controls(&line.step), line.line);
                st.each(|s| s.line(&run_id, &text));
                st.live_line(&run_id, &line);
            }
            Event::Records => st.flush_all().await,
            Event::Watch { run_id, tx } => st.watchers.watch(run_id, tx),
            Event::Unwatch(run_id) => st.watchers.unwatch(&run_id),
            Event::Flush(reply) => {
                // What was sent before it is still in the inbox.
                Box::pin(st.handle_inbox(usize::MAX)).await;
                st.each(|s| s.flush());
                let batch = st.batch();
                if let Some(w) = &mut st.store {
                    w.write_and_wait(batch).await;
                }
                let _ = reply.send(());
            }
        }
    }
}

/// Everything the hub passes on has the credentials of its URLs masked.
fn masked(text: String) -> String {
    match steppe_runtime::secrets::mask(&text) {
        std::borrow::Cow::Borrowed(_) => text,
        std::borrow::Cow::Owned(m) => m,
    }
}

/// The handle to the EventHub actor.
pub struct EventHub {
    actor: ActorRef<Event>,
    store: Option<Arc<dyn Store>>,
    /// Live lines on their way to the terminal: a flood beyond
    /// [`LIVE_LINES_MAX`] is dropped from the live view (counted in
    /// `dropped`, said when the flood ends), never from a step's record.
    pending_lines: Arc<std::sync::atomic::AtomicUsize>,
    dropped: std::sync::atomic::AtomicU64,
    /// Records for the store only (nothing shows them): gathered here
    /// rather than sent through the mailbox one by one.
    records: Arc<std::sync::Mutex<Records>>,
    /// Events on their way to the hub, in order (see [`Event::Inbox`]).
    inbox: Inbox,
}

/// What waits to be stored beside the hub's own events.
#[derive(Default)]
pub struct Records {
    logs: Vec<(String, LogLine)>,
    steps: Vec<StepRecord>,
    spans: Vec<(String, Vec<steppe_runtime::trace::SpanRecord>)>,
    chains: Vec<(steppe_runtime::store::Scope, String, String)>,
    /// How many of the above, lines counted apart (they are many and small).
    count: usize,
    lines: usize,
}

/// Records (or lines) waiting past these are written before the next tick.
const RECORDS_FULL: usize = 256;
const LINES_FULL: usize = 500;
/// The hub's own events waiting past this are written before the next tick.
const EVENTS_FULL: usize = 500;

/// The most live lines waiting to be printed.
const LIVE_LINES_MAX: usize = 10_000;

/// The most live lines of one step kept with the run's events.
const LIVE_KEPT_MAX: usize = 1_000;

impl EventHub {
    /// Starts the hub: the terminal shows everything unless `quiet`.
    pub async fn start(quiet: bool, store: Option<Arc<dyn Store>>) -> Result<Self, ractor::SpawnErr> {
        let subscribers: Vec<Box<dyn Subscriber>> = if quiet { Vec::new() } else { vec![Box::new(Terminal::new())] };
        Self::start_with(subscribers, store).await
    }

    /// Starts the hub with these subscribers (watchers are always there).
    pub async fn start_with(subscribers: Vec<Box<dyn Subscriber>>, store: Option<Arc<dyn Store>>) -> Result<Self, ractor::SpawnErr> {
        let pending_lines = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let records = Arc::new(std::sync::Mutex::new(Records::default()));
        let inbox = Inbox::default();
        let (actor, _) = Actor::spawn(None, HubActor, (subscribers, store.clone(), pending_lines.clone(), records.clone(), inbox.clone())).await?;
        Ok(EventHub { actor, store, pending_lines, dropped: Default::default(), records, inbox })
    }

    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Puts the event in the inbox, waking the hub if it was empty.
    fn send(&self, ev: Event) {
        let first = {
            let mut inbox = self.inbox.lock().unwrap_or_else(|p| p.into_inner());
            inbox.push_back(ev);
            inbox.len() == 1
        };
        if first {
            let _ = self.actor.cast(Event::Inbox);
        }
    }

    fn say(&self, line: String) {
        self.send(Event::Say(masked(line)));
    }

    pub fn run_began(&self, run_id: &str, pipeline: &str, job: &str) {
        self.send(Event::RunBegan { run_id: run_id.to_string(), pipeline: pipeline.to_string(), job: job.to_string() });
    }

    pub fn run_ended(&self, run_id: &str, outcome: &str) {
        self.send(Event::RunEnded { run_id: run_id.to_string(), outcome: outcome.to_string() });
    }

    pub fn start_step(&self, run_id: &str, step: &str) {
        self.send(Event::Started { run_id: run_id.to_string(), step: step.to_string() });
    }

    pub fn end(&self, run_id: &str, step: &str, r: &Result<(), StepError>, took: Duration) {
        let secs = took.as_secs_f64();
        let shown = escape_controls(step);
        let line = masked(match r {
            Ok(()) => format!("✔ {shown} ({secs:.2}s)"),
            Err(e) => format!("✘ {shown} {} ({secs:.2}s): {}", Outcome::of(r).word(), escape_controls(&e.message)),
        });
        self.send(Event::Ended { run_id: run_id.to_string(), step: step.to_string(), outcome: Outcome::of(r).word().to_string(), line });
    }

    /// Sends `run_id`'s lines to `tx` as well, until [`EventHub::unwatch`].
    pub fn watch(&self, run_id: &str, tx: tokio::sync::mpsc::UnboundedSender<String>) {
        self.send(Event::Watch { run_id: run_id.to_string(), tx });
    }

    pub fn unwatch(&self, run_id: &str) {
        self.send(Event::Unwatch(run_id.to_string()));
    }

    /// A note that belongs to a run: printed and kept with the run's events.
    pub fn run_note(&self, run_id: &str, msg: &str) {
        self.send(Event::RunNote { run_id: run_id.to_string(), line: masked(msg.to_string()) });
    }

    pub fn note(&self, msg: &str) {
        self.say(msg.to_string());
    }

    /// How many steps wait in a queue for a worker (for the status line).
    pub fn waiting(&self, steps: usize) {
        self.send(Event::Waiting(steps));
    }

    /// Stores what a step wrote, as its record keeps it.
    pub fn record_output(&self, run_id: &str, step: &str, record: &steppe_runtime::assignment::OutputRecord) {
        if self.store.is_none() || (record.head.is_empty() && record.full.is_none()) {
            return;
        }
        let lines: Vec<(String, LogLine)> = LogLine::from_record(step, record)
            .into_iter()
            .map(|mut l| {
                l.line = masked(l.line);
                (run_id.to_string(), l)
            })
            .collect();
        self.keep(|r| {
            r.lines += lines.len();
            r.logs.extend(lines);
        });
    }

    /// Adds to what waits for the store; asks the hub to write it when much waits.
    fn keep(&self, add: impl FnOnce(&mut Records)) {
        let full = {
            let mut r = self.records.lock().unwrap_or_else(|p| p.into_inner());
            let was_full = r.count >= RECORDS_FULL || r.lines >= LINES_FULL;
            add(&mut r);
            !was_full && (r.count >= RECORDS_FULL || r.lines >= LINES_FULL)
        };
        if full {
            self.send(Event::Records);
        }
    }

    /// Keeps spans of a run (credentials in their words masked).
    pub fn record_spans(&self, run_id: &str, mut spans: Vec<steppe_runtime::trace::SpanRecord>) {
        if self.store.is_none() || spans.is_empty() {
            return;
        }
        for s in &mut spans {
            s.name = masked(std::mem::take(&mut s.name));
            s.error = s.error.take().map(masked);
            for (_, v) in &mut s.attributes {
                *v = masked(std::mem::take(v));
            }
        }
        self.keep(|r| {
            r.count += 1;
            r.spans.push((run_id.to_string(), spans));
        });
    }

    pub fn record_step(&self, mut rec: StepRecord) {
        if self.store.is_none() {
            return;
        }
        rec.message = masked(rec.message);
        rec.detail = rec.detail.map(masked);
        self.keep(|r| {
            r.count += 1;
            r.steps.push(rec);
        });
    }

    /// Records that a run of `job` succeeded through the chain whose leaf is
    /// `hash` (the step cache), with the next batch: a checkpoint or the
    /// run's end flushes it.
    pub fn record_chain(&self, scope: &steppe_runtime::store::Scope, job: &str, hash: &str) {
        if self.store.is_some() {
            self.keep(|r| {
                r.count += 1;
                r.chains.push((scope.clone(), job.to_string(), hash.to_string()));
            });
        }
    }

    /// Waits until every event sent so far is printed and stored.
    pub async fn flush(&self) {
        let _ = self.actor.call(Event::Flush, Some(Duration::from_secs(30))).await;
    }
}

impl LineSink for EventHub {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str) {
        use std::sync::atomic::Ordering;
        if self.pending_lines.load(Ordering::Relaxed) >= LIVE_LINES_MAX {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            self.run_note(run_id, &format!("… {dropped} line(s) of live output not shown (a flood); each step's record keeps its first and last lines, `steppe runs --logs --full` all of them"));
        }
        self.pending_lines.fetch_add(1, Ordering::Relaxed);
        let line = LogLine::new(step, stream == Stream::Stderr, &masked(line.to_string()));
        self.send(Event::Line { run_id: run_id.to_string(), line });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A subscriber that keeps what it was told.
    struct Recording(Arc<Mutex<Vec<String>>>);

    impl Subscriber for Recording {
        fn line(&mut self, run_id: &str, line: &str) {
            self.0.lock().unwrap().push(format!("{run_id}|{line}"));
        }
        fn step_started(&mut self, run_id: &str, step: &str) {
            self.0.lock().unwrap().push(format!("{run_id}|started {step}"));
        }
        fn step_ended(&mut self, run_id: &str, step: &str) {
            self.0.lock().unwrap().push(format!("{run_id}|ended {step}"));
        }
    }

    #[tokio::test]
    async fn subscribers_see_every_event_in_order_and_watchers_only_their_run() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hub = EventHub::start_with(vec![Box::new(Recording(seen.clone()))], None).await.unwrap();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        hub.watch("a", tx);
        hub.start_step("a", "build");
        hub.line("a", "build", Stream::Stdout, "compiling http://u:secret@host/x");
        hub.run_note("b", "another run's note");
        hub.end("a", "build", &Ok(()), Duration::from_millis(1500));
        hub.note("process note");
        hub.flush().await;
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                "a|started build".to_string(),
                "a|▶ build".into(),
                "a|[build] compiling http://u:***@host/x".into(),
                "b|another run's note".into(),
                "a|ended build".into(),
                "a|✔ build (1.50s)".into(),
                "|process note".into(),
            ]
        );
        let mut watched = Vec::new();
        while let Ok(l) = rx.try_recv() {
            watched.push(l);
        }
        assert_eq!(watched, vec!["▶ build", "[build] compiling http://u:***@host/x", "✔ build (1.50s)"]);
    }

    /// Events sent faster than the hub handles them gather in its inbox and
    /// come out in the order sent, across its turns of [`INBOX_TURN`], from
    /// tasks on every thread; a flush returns once all before it are shown.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_flood_of_events_comes_out_in_order_across_the_hubs_turns() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hub = Arc::new(EventHub::start_with(vec![Box::new(Recording(seen.clone()))], None).await.unwrap());
        let senders: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|run| {
                let hub = hub.clone();
                tokio::spawn(async move {
                    for i in 0..INBOX_TURN * 5 {
                        hub.run_note(run, &format!("{i}"));
                        if i % 50 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for s in senders {
            s.await.unwrap();
        }
        // The hub comes back for what its turns left, with no flush to ask it.
        let all = INBOX_TURN * 5 * 2;
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while seen.lock().unwrap().len() < all && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(seen.lock().unwrap().len(), all, "every event handled without a flush");
        hub.flush().await;
        let seen = seen.lock().unwrap().clone();
        for run in ["a", "b"] {
            let of_run: Vec<String> = seen.iter().filter_map(|l| l.strip_prefix(&format!("{run}|")).map(str::to_string)).collect();
            let sent: Vec<String> = (0..INBOX_TURN * 5).map(|i| i.to_string()).collect();
            assert_eq!(of_run, sent, "run {run}'s notes in the order sent");
        }
    }

    #[tokio::test]
    async fn a_running_steps_lines_reach_the_store_before_it_ends_up_to_a_cap() {
        let dir = std::env::temp_dir().join(format!("steppe-hub-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store: Arc<dyn Store> = Arc::new(steppe_runtime::store::SqliteStore::open(&dir.join("s.db")).unwrap());
        let hub = EventHub::start_with(Vec::new(), Some(store.clone())).await.unwrap();
        hub.start_step("r", "build");
        for i in 0..LIVE_KEPT_MAX + 5 {
            hub.line("r", "build", if i == 1 { Stream::Stderr } else { Stream::Stdout }, &format!("line {i}"));
        }
        // Before the step ends, a follower reading the store sees its lines (within a tick).
        let mut seen = Vec::new();
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            seen = store.events("r").unwrap();
            if seen.len() > LIVE_KEPT_MAX {
                break;
            }
        }
        assert_eq!((seen[0].kind.as_str(), seen[1].message.as_str(), seen[2].kind.as_str()), ("started", "line 0", "stderr"));
        assert_eq!(seen.iter().filter(|e| e.is_output()).count(), LIVE_KEPT_MAX, "a step's live lines are kept up to the cap");
        let note = seen.last().unwrap();
        assert!(note.kind == "note" && note.message.contains("more than 1000 lines"), "{note:?}");
        hub.end("r", "build", &Ok(()), Duration::from_millis(5));
        hub.start_step("r", "build");
        hub.line("r", "build", Stream::Stdout, "again");
        hub.flush().await;
        let all = store.events("r").unwrap();
        assert_eq!(all.iter().rev().take(3).map(|e| e.kind.as_str()).collect::<Vec<_>>(), ["stdout", "started", "ended"], "a step run again is counted afresh");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
