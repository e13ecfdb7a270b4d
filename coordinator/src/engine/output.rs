//! The EventHub: every event of a run goes to the terminal (each step as it
//! starts and ends, with its duration; output streamed, prefixed by step) and
//! to the Store (runs, step records, logs).

use std::io::Write;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use steppe_shared::outcome::{Outcome, StepError};
use steppe_shared::store::{LogLine, StepRecord, Store};
use steppe_worker::exec::{LineSink, Stream};

enum Write_ {
    Log(String, LogLine),
    Step(StepRecord),
    Flush(mpsc::Sender<()>),
}

pub struct EventHub {
    lock: Mutex<()>,
    quiet: bool,
    store: Option<Arc<dyn Store>>,
    logs: Option<Mutex<mpsc::Sender<Write_>>>,
}

/// Kept for the name the rest of the engine uses for the terminal side.
pub type Output = EventHub;

impl EventHub {
    pub fn new(quiet: bool) -> Self {
        EventHub { lock: Mutex::new(()), quiet, store: None, logs: None }
    }

    /// Also records into `store`; log lines are written in batches by a thread of their own.
    pub fn with_store(mut self, store: Arc<dyn Store>) -> Self {
        let (tx, rx) = mpsc::channel::<Write_>();
        let s = store.clone();
        std::thread::spawn(move || {
            let mut batch: Vec<(String, LogLine)> = Vec::new();
            let flush = |batch: &mut Vec<(String, LogLine)>| {
                let mut by_run: std::collections::BTreeMap<String, Vec<LogLine>> = Default::default();
                for (r, l) in batch.drain(..) {
                    by_run.entry(r).or_default().push(l);
                }
                for (r, lines) in by_run {
                    if let Err(e) = s.append_logs(&r, &lines) {
                        eprintln!("steppe: recording logs: {e}");
                    }
                }
            };
            loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(Write_::Log(r, l)) => {
                        batch.push((r, l));
                        if batch.len() >= 500 {
                            flush(&mut batch);
                        }
                    }
                    Ok(Write_::Step(rec)) => {
                        flush(&mut batch);
                        if let Err(e) = s.record_step(&rec) {
                            eprintln!("steppe: recording step {}: {e}", rec.name);
                        }
                    }
                    Ok(Write_::Flush(done)) => {
                        flush(&mut batch);
                        let _ = done.send(());
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => flush(&mut batch),
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        flush(&mut batch);
                        return;
                    }
                }
            }
        });
        self.store = Some(store);
        self.logs = Some(Mutex::new(tx));
        self
    }

    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    fn say(&self, line: &str) {
        if self.quiet {
            return;
        }
        let _g = self.lock.lock();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
    }

    pub fn start(&self, step: &str) {
        self.say(&format!("▶ {step}"));
    }

    pub fn end(&self, step: &str, r: &Result<(), StepError>, took: Duration) {
        let secs = took.as_secs_f64();
        match r {
            Ok(()) => self.say(&format!("✔ {step} ({secs:.2}s)")),
            Err(e) => self.say(&format!("✘ {step} {} ({secs:.2}s): {}", Outcome::of(r).word(), e.message)),
        }
    }

    pub fn note(&self, msg: &str) {
        self.say(msg);
    }

    /// Queues a step record for the writer thread (in order with the logs).
    pub fn record_step(&self, rec: StepRecord) {
        if let Some(tx) = &self.logs {
            if let Ok(t) = tx.lock() {
                let _ = t.send(Write_::Step(rec));
            }
        }
    }

    /// Waits until every log line sent so far is in the store.
    pub fn flush(&self) {
        let Some(tx) = &self.logs else { return };
        let (done_tx, done_rx) = mpsc::channel();
        if tx.lock().map(|t| t.send(Write_::Flush(done_tx)).is_ok()).unwrap_or(false) {
            let _ = done_rx.recv_timeout(Duration::from_secs(10));
        }
    }
}

impl LineSink for EventHub {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str) {
        self.say(&format!("[{step}] {line}"));
        if let Some(tx) = &self.logs {
            let l = LogLine { step: step.to_string(), stderr: stream == Stream::Stderr, line: line.to_string() };
            if let Ok(t) = tx.lock() {
                let _ = t.send(Write_::Log(run_id.to_string(), l));
            }
        }
    }
}
