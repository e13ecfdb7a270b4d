//! The errors that end a run or refuse a stepfile (§1.12): a name the client
//! can match on and a message a person can act on.

/// An error by its Stepgate name (`EgressDenied`, `ToolCallFailed`, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}: {message}")]
pub struct GateError {
    pub name: &'static str,
    pub message: String,
}

impl GateError {
    pub fn new(name: &'static str, message: impl Into<String>) -> GateError {
        GateError { name, message: message.into() }
    }
}

/// `PreflightFailed` for `item` (`inputs`, `setting X`, `credential X`, `tool X`, `approval`).
pub fn preflight(item: impl std::fmt::Display, why: impl std::fmt::Display) -> GateError {
    GateError::new("PreflightFailed", format!("preflight failed for {item}: {why}"))
}
