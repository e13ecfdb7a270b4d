//! The EventHub actor: every event of a run goes to the terminal (each step as
//! it starts and ends, with its duration; output streamed, prefixed by step)
//! and to the Store (step records and logs, written in batches). One mailbox
//! keeps the two in the order events happened. [`EventHub`] is the handle.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use steppe_runtime::outcome::{Outcome, StepError};
use steppe_runtime::printable::escape_controls;
use steppe_runtime::store::{LogLine, StepRecord, Store};
use steppe_worker::exec::{LineSink, Stream};

pub enum Event {
    /// A line for the terminal only.
    Say(String),
    /// A step of a run began (shown in the live status line on a terminal).
    Started { run_id: String, step: String },
    /// A step ended: its outcome word and summary line.
    Ended { run_id: String, step: String, outcome: String, line: String },
    /// A note about a run (a retry, a failover, a verdict …).
    RunNote { run_id: String, line: String },
    /// Redraw the status line (durations tick).
    Tick,
    /// A line of live output: printed and sent to watchers, not stored
    /// (a step's record is, when it ends).
    Line { run_id: String, line: LogLine },
    /// A step's output record, for the store.
    Output { run_id: String, lines: Vec<LogLine> },
    Step(StepRecord),
    /// Reply once everything before it is in the store.
    Flush(RpcReplyPort<()>),
    /// Also send a run's lines here (a `steppe submit` following it).
    Watch { run_id: String, tx: tokio::sync::mpsc::UnboundedSender<String> },
    Unwatch(String),
}

struct HubActor;

pub struct HubState {
    quiet: bool,
    store: Option<Arc<dyn Store>>,
    batch: Vec<(String, LogLine)>,
    /// On a terminal: a live status line under the output naming what runs.
    live: bool,
    running: Vec<(String, std::time::Instant)>,
    status_shown: bool,
    watchers: std::collections::HashMap<String, tokio::sync::mpsc::UnboundedSender<String>>,
    /// Live lines sent to the hub and not yet printed (shared with the handle).
    pending_lines: Arc<std::sync::atomic::AtomicUsize>,
}

impl HubState {
    fn say(&mut self, line: &str) {
        if self.quiet {
            return;
        }
        let mut out = std::io::stdout().lock();
        if self.status_shown {
            let _ = write!(out, "\r\x1b[2K");
            self.status_shown = false;
        }
        let _ = writeln!(out, "{line}");
        drop(out);
        self.status();
    }

    /// `… running: compile 3.2s, lint 0.4s` on the last terminal line.
    fn status(&mut self) {
        if !self.live || self.quiet || self.running.is_empty() {
            return;
        }
        let parts: Vec<String> = self.running.iter().take(6).map(|(s, t)| format!("{} {:.1}s", escape_controls(s), t.elapsed().as_secs_f64())).collect();
        let more = if self.running.len() > 6 { format!(" +{}", self.running.len() - 6) } else { String::new() };
        let mut line = format!("… running: {}{more}", parts.join(", "));
        if line.chars().count() > 120 {
            line = line.chars().take(119).collect::<String>() + "…";
        }
        let mut out = std::io::stdout().lock();
        let _ = write!(out, "\r\x1b[2K{line}");
        let _ = out.flush();
        self.status_shown = true;
    }

    /// A line of a run: printed here and sent to whoever follows the run.
    fn emit(&mut self, run_id: &str, line: &str) {
        if let Some(tx) = self.watchers.get(run_id) {
            let _ = tx.send(line.to_string());
        }
        self.say(line);
    }

    fn event(&self, run_id: &str, kind: &str, step: &str, message: &str) {
        if let Some(s) = &self.store {
            if let Err(e) = s.record_event(run_id, kind, step, message) {
                store_failed(&e);
            } else {
                store_ok();
            }
        }
    }

    fn clear_status(&mut self) {
        if self.status_shown {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
            self.status_shown = false;
        }
    }

    fn flush(&mut self) {
        let Some(s) = &self.store else {
            self.batch.clear();
            return;
        };
        let mut by_run: std::collections::BTreeMap<String, Vec<LogLine>> = Default::default();
        for (r, l) in self.batch.drain(..) {
            by_run.entry(r).or_default().push(l);
        }
        for (r, lines) in by_run {
            if let Err(e) = s.append_logs(&r, &lines) {
                store_failed(&e);
            } else {
                store_ok();
            }
        }
    }
}

impl Actor for HubActor {
    type Msg = Event;
    type State = HubState;
    type Arguments = (bool, Option<Arc<dyn Store>>, Arc<std::sync::atomic::AtomicUsize>);

    async fn pre_start(&self, me: ActorRef<Event>, (quiet, store, pending_lines): Self::Arguments) -> Result<HubState, ActorProcessingErr> {
        use std::io::IsTerminal;
        let live = std::io::stdout().is_terminal() && std::env::var_os("TERM").is_some_and(|t| t != "dumb");
        if live && !quiet {
            let _ = me.send_interval(Duration::from_millis(500), || Event::Tick);
        }
        Ok(HubState { quiet, store, batch: Vec::new(), live, running: Vec::new(), status_shown: false, watchers: Default::default(), pending_lines })
    }

    async fn handle(&self, _me: ActorRef<Event>, ev: Event, st: &mut HubState) -> Result<(), ActorProcessingErr> {
        match ev {
            Event::Say(l) => st.say(&l),
            Event::Started { run_id, step } => {
                st.event(&run_id, "started", &step, "");
                st.running.push((step.clone(), std::time::Instant::now()));
                st.emit(&run_id, &format!("▶ {}", escape_controls(&step)));
            }
            Event::RunNote { run_id, line } => {
                st.event(&run_id, "note", "", &line);
                st.emit(&run_id, &line);
            }
            Event::Ended { run_id, step, outcome, line } => {
                st.event(&run_id, "ended", &step, &outcome);
                if let Some(i) = st.running.iter().position(|(s, _)| *s == step) {
                    st.running.remove(i);
                }
                st.emit(&run_id, &line);
                if st.running.is_empty() {
                    st.clear_status();
                }
            }
            Event::Tick => st.status(),
            Event::Line { run_id, line } => {
                st.pending_lines.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                st.emit(&run_id, &format!("[{}] {}", escape_controls(&line.step), line.line));
            }
            Event::Output { run_id, lines } => {
                if st.store.is_some() {
                    st.batch.extend(lines.into_iter().map(|l| (run_id.clone(), l)));
                    if st.batch.len() >= 500 {
                        st.flush();
                    }
                }
            }
            Event::Step(rec) => {
                st.flush();
                if let Some(s) = &st.store {
                    if let Err(e) = s.record_step(&rec) {
                        store_failed(&e);
                    } else {
                        store_ok();
                    }
                }
            }
            Event::Watch { run_id, tx } => {
                st.watchers.insert(run_id, tx);
            }
            Event::Unwatch(run_id) => {
                st.watchers.remove(&run_id);
            }
            Event::Flush(reply) => {
                st.clear_status();
                st.flush();
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

/// The store failing (Redis down) is said once, and its return once.
fn store_failed(e: &dyn std::fmt::Display) {
    if let Some(l) = steppe_runtime::outage::failed("recording history in the store", e) {
        eprintln!("steppe: {l}");
    }
}

fn store_ok() {
    if let Some(l) = steppe_runtime::outage::recovered("recording history in the store") {
        eprintln!("steppe: {l}");
    }
}

/// Everything the hub passes on has the credentials of its URLs masked.
fn masked(text: String) -> String {
    match steppe_runtime::secrets::mask_urls(&text) {
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
}

/// The most live lines waiting to be printed.
const LIVE_LINES_MAX: usize = 10_000;

/// The name the engine uses for the terminal side of the hub.
pub type Output = EventHub;

impl EventHub {
    pub async fn start(quiet: bool, store: Option<Arc<dyn Store>>) -> Result<Self, ractor::SpawnErr> {
        let pending_lines = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (actor, _) = Actor::spawn(None, HubActor, (quiet, store.clone(), pending_lines.clone())).await?;
        Ok(EventHub { actor, store, pending_lines, dropped: Default::default() })
    }

    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    fn say(&self, line: String) {
        let _ = self.actor.cast(Event::Say(masked(line)));
    }

    pub fn start_step(&self, run_id: &str, step: &str) {
        let _ = self.actor.cast(Event::Started { run_id: run_id.to_string(), step: step.to_string() });
    }

    pub fn end(&self, run_id: &str, step: &str, r: &Result<(), StepError>, took: Duration) {
        let secs = took.as_secs_f64();
        let shown = escape_controls(step);
        let line = masked(match r {
            Ok(()) => format!("✔ {shown} ({secs:.2}s)"),
            Err(e) => format!("✘ {shown} {} ({secs:.2}s): {}", Outcome::of(r).word(), escape_controls(&e.message)),
        });
        let _ = self.actor.cast(Event::Ended { run_id: run_id.to_string(), step: step.to_string(), outcome: Outcome::of(r).word().to_string(), line });
    }

    /// Sends `run_id`'s lines to `tx` as well, until [`EventHub::unwatch`].
    pub fn watch(&self, run_id: &str, tx: tokio::sync::mpsc::UnboundedSender<String>) {
        let _ = self.actor.cast(Event::Watch { run_id: run_id.to_string(), tx });
    }

    pub fn unwatch(&self, run_id: &str) {
        let _ = self.actor.cast(Event::Unwatch(run_id.to_string()));
    }

    /// A note that belongs to a run: printed and kept with the run's events.
    pub fn run_note(&self, run_id: &str, msg: &str) {
        let _ = self.actor.cast(Event::RunNote { run_id: run_id.to_string(), line: masked(msg.to_string()) });
    }

    pub fn note(&self, msg: &str) {
        self.say(msg.to_string());
    }

    /// Stores what a step wrote, as its record keeps it.
    pub fn record_output(&self, run_id: &str, step: &str, record: &steppe_runtime::assignment::OutputRecord) {
        if self.store.is_none() || (record.head.is_empty() && record.full.is_none()) {
            return;
        }
        let lines = LogLine::from_record(step, record).into_iter().map(|mut l| {
            l.line = masked(l.line);
            l
        });
        let _ = self.actor.cast(Event::Output { run_id: run_id.to_string(), lines: lines.collect() });
    }

    pub fn record_step(&self, mut rec: StepRecord) {
        rec.message = masked(rec.message);
        let _ = self.actor.cast(Event::Step(rec));
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
        let _ = self.actor.cast(Event::Line { run_id: run_id.to_string(), line });
    }
}
