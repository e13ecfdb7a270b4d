//! The outcome model: succeeded, failed, errored, aborted — and the exit codes.

use std::fmt;

/// How a step that did not succeed ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A task-level failure: non-zero exit, assert mismatch, own timeout, …
    Failed,
    /// Anything unmarked: infrastructure, render errors, resource checks, …
    Errored,
    /// The run was cancelled (Ctrl-C); overrides everything.
    Aborted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub class: Class,
    pub message: String,
    /// It ran out of time (its own `timeout:`, an agent's deadline, the
    /// job's): attempts stop here, whatever the message says.
    pub timed_out: bool,
}

impl StepError {
    pub fn failed(m: impl Into<String>) -> Self {
        StepError { class: Class::Failed, message: m.into(), timed_out: false }
    }
    pub fn errored(m: impl Into<String>) -> Self {
        StepError { class: Class::Errored, message: m.into(), timed_out: false }
    }
    pub fn aborted(m: impl Into<String>) -> Self {
        StepError { class: Class::Aborted, message: m.into(), timed_out: false }
    }
    /// A step that ran out of time: it failed.
    pub fn timed_out(m: impl Into<String>) -> Self {
        StepError { class: Class::Failed, message: m.into(), timed_out: true }
    }
    /// The same outcome, told differently (a wrapper naming where it happened).
    pub fn with_message(&self, m: impl Into<String>) -> Self {
        StepError { message: m.into(), ..self.clone() }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StepError {}

/// The four outcomes a step or job can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Succeeded,
    Failed,
    Errored,
    Aborted,
}

impl Outcome {
    pub fn of(r: &Result<(), StepError>) -> Outcome {
        match r {
            Ok(()) => Outcome::Succeeded,
            Err(e) => match e.class {
                Class::Failed => Outcome::Failed,
                Class::Errored => Outcome::Errored,
                Class::Aborted => Outcome::Aborted,
            },
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Errored => "errored",
            Outcome::Aborted => "aborted",
        }
    }

    /// The outcome a word names, as [`Outcome::word`] writes it.
    pub fn from_word(word: &str) -> Option<Outcome> {
        [Outcome::Succeeded, Outcome::Failed, Outcome::Errored, Outcome::Aborted].into_iter().find(|o| o.word() == word)
    }

    /// The hook that fires for this outcome.
    pub fn hook(self) -> &'static str {
        match self {
            Outcome::Succeeded => "on_success",
            Outcome::Failed => "on_failure",
            Outcome::Errored => "on_error",
            Outcome::Aborted => "on_abort",
        }
    }

    /// The process exit code: 0 ok, 1 failed, 130 aborted, 2 anything else.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Succeeded => 0,
            Outcome::Failed => 1,
            Outcome::Aborted => 130,
            Outcome::Errored => 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_is_known_by_its_kind_not_its_words() {
        let t = StepError::timed_out("compile: timed out after 5s");
        assert!(t.timed_out && t.class == Class::Failed);
        let wrapped = t.with_message("fix agent \"f\": compile: timed out after 5s");
        assert!(wrapped.timed_out, "a wrapper keeps what happened");
        assert!(!StepError::failed("the log says: timed out after 5s").timed_out, "words alone are not a timeout");
    }
}
