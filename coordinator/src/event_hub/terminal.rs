//! The terminal, a subscriber of the EventHub: lines printed as they come,
//! and on a live terminal a status line under them naming what runs.

use std::io::Write;
use std::time::Instant;

use steppe_runtime::printable::escape_controls;

use super::Subscriber;

pub struct Terminal {
    /// A terminal that redraws (not a pipe, not TERM=dumb): the status line is shown.
    live: bool,
    running: Vec<(String, Instant)>,
    status_shown: bool,
}

impl Terminal {
    pub fn new() -> Self {
        use std::io::IsTerminal;
        let live = std::io::stdout().is_terminal() && std::env::var_os("TERM").is_some_and(|t| t != "dumb");
        Terminal { live, running: Vec::new(), status_shown: false }
    }

    /// `… running: compile 3.2s, lint 0.4s` on the last terminal line.
    fn status(&mut self) {
        if !self.live || self.running.is_empty() {
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

    fn clear_status(&mut self) {
        if self.status_shown {
            let mut out = std::io::stdout().lock();
            let _ = write!(out, "\r\x1b[2K");
            let _ = out.flush();
            self.status_shown = false;
        }
    }
}

impl Default for Terminal {
    fn default() -> Self {
        Self::new()
    }
}

impl Subscriber for Terminal {
    fn line(&mut self, _run_id: &str, line: &str) {
        let mut out = std::io::stdout().lock();
        if self.status_shown {
            let _ = write!(out, "\r\x1b[2K");
            self.status_shown = false;
        }
        let _ = writeln!(out, "{line}");
        drop(out);
        self.status();
    }

    fn step_started(&mut self, _run_id: &str, step: &str) {
        self.running.push((step.to_string(), Instant::now()));
    }

    fn step_ended(&mut self, _run_id: &str, step: &str) {
        if let Some(i) = self.running.iter().position(|(s, _)| s == step) {
            self.running.remove(i);
        }
        if self.running.is_empty() {
            self.clear_status();
        }
    }

    fn tick(&mut self) {
        self.status();
    }

    fn flush(&mut self) {
        self.clear_status();
    }

    fn wants_ticks(&self) -> bool {
        self.live
    }
}
