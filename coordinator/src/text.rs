//! How names and a model's words are shown on a terminal.

/// A name or a model's words, with control characters shown, not obeyed.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    steppe_runtime::printable::escape_controls(s)
}
