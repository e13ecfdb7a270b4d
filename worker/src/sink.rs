//! Where a step's live output lines go, and which stream each came from.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// Where live output lines go.
pub trait LineSink: Send + Sync {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str);
}
