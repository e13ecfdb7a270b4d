//! The terminal, a subscriber of the EventHub: lines printed as they come,
//! and on a live terminal a status line under them: steps done, what runs
//! and for how long, the time since the first step began.

use std::io::Write;
use std::time::Instant;

use steppe_runtime::printable::escape_controls;

use super::Subscriber;

pub struct Terminal {
    /// A terminal that redraws (not a pipe, not TERM=dumb): the status line is shown.
    live: bool,
    running: Vec<(String, Instant)>,
    /// Of those, how many wait in a queue for a worker.
    waiting: usize,
    /// Steps ended since the first began.
    done: usize,
    /// When the first step began.
    since: Option<Instant>,
    status_shown: bool,
}

impl Terminal {
    pub fn new() -> Self {
        use std::io::IsTerminal;
        let live = std::io::stdout().is_terminal() && std::env::var_os("TERM").is_some_and(|t| t != "dumb");
        Terminal { live, running: Vec::new(), waiting: 0, done: 0, since: None, status_shown: false }
    }

    /// `… 12 done · 6 running (4 waiting for a worker): compile 3.2s, … · 1m4s` on the last terminal line.
    fn status(&mut self) {
        if !self.live || self.running.is_empty() || steppe_worker::agent::person_is_answering() {
            return;
        }
        let line = status_line(&self.running, self.waiting, self.done, self.since.map(|s| s.elapsed()).unwrap_or_default());
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

/// The status line: steps done, those running (and how many of them still
/// wait for a worker), the oldest of them with their time so far, the time
/// since the first began — 120 characters at most.
fn status_line(running: &[(String, Instant)], waiting: usize, done: usize, elapsed: std::time::Duration) -> String {
    let parts: Vec<String> = running.iter().take(4).map(|(s, t)| format!("{} {:.1}s", escape_controls(s), t.elapsed().as_secs_f64())).collect();
    let more = if running.len() > 4 { format!(" +{}", running.len() - 4) } else { String::new() };
    let waiting = if waiting > 0 { format!(" ({} waiting for a worker)", waiting.min(running.len())) } else { String::new() };
    let mut line = format!("… {done} done · {} running{waiting}: {}{more} · {}", running.len(), parts.join(", "), steppe_language::duration::show(std::time::Duration::from_secs(elapsed.as_secs())));
    if line.chars().count() > 120 {
        line = line.chars().take(119).collect::<String>() + "…";
    }
    line
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
        self.since.get_or_insert_with(Instant::now);
        self.running.push((step.to_string(), Instant::now()));
    }

    fn step_ended(&mut self, _run_id: &str, step: &str) {
        if let Some(i) = self.running.iter().position(|(s, _)| s == step) {
            self.running.remove(i);
            self.done += 1;
        }
        if self.running.is_empty() {
            self.clear_status();
        }
    }

    fn tick(&mut self) {
        self.status();
    }

    fn waiting(&mut self, steps: usize) {
        self.waiting = steps;
    }

    fn flush(&mut self) {
        self.clear_status();
    }

    fn wants_ticks(&self) -> bool {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_counts_what_is_done_and_running_and_stays_short() {
        let now = Instant::now();
        let running: Vec<(String, Instant)> = (0..6).map(|i| (format!("cell-{i}"), now)).collect();
        let line = status_line(&running, 0, 12, std::time::Duration::from_secs(64));
        assert!(line.starts_with("… 12 done · 6 running: cell-0 0.0s, cell-1 0.0s, cell-2 0.0s, cell-3 0.0s +2 · 1m4s"), "{line}");
        let queued = status_line(&running[..2], 4, 12, std::time::Duration::from_secs(3));
        assert!(queued.starts_with("… 12 done · 2 running (2 waiting for a worker): cell-0 0.0s, cell-1 0.0s · 3s"), "{queued}");
        let long: Vec<(String, Instant)> = vec![("x".repeat(300), now)];
        assert_eq!(status_line(&long, 0, 0, std::time::Duration::ZERO).chars().count(), 120);
    }
}
