//! What a live run prints: each step as it starts and ends (with its
//! duration), and its output streamed line by line, prefixed by step.

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use steppe_shared::outcome::{Outcome, StepError};
use steppe_worker::exec::{LineSink, Stream};

#[derive(Default)]
pub struct Output {
    lock: Mutex<()>,
    quiet: bool,
}

impl Output {
    pub fn new(quiet: bool) -> Self {
        Output { lock: Mutex::new(()), quiet }
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
}

impl LineSink for Output {
    fn line(&self, step: &str, _stream: Stream, line: &str) {
        self.say(&format!("[{step}] {line}"));
    }
}
