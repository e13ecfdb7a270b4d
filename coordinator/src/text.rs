//! How names and a model's words are shown on a terminal.

/// A name or a model's words, with control characters shown, not obeyed.
pub fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    steppe_runtime::printable::escape_controls(s)
}

/// A message of several lines (an error and an assert's verdict after it):
/// each line shown, the ones after the first indented under it.
pub fn shown_lines(s: &str) -> String {
    s.lines().map(|l| shown(l).into_owned()).collect::<Vec<_>>().join("\n  ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_shown_each_and_escapes_stay_inside_them() {
        assert_eq!(shown_lines("boom: exit 3\nassert.execution mismatch\n  want: [a]"), "boom: exit 3\n  assert.execution mismatch\n    want: [a]");
        assert_eq!(shown_lines("a\u{1b}[2Jb"), "a\\x1b[2Jb");
    }
}
