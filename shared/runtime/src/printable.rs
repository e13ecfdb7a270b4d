//! Text a pipeline or a model chose, on its way to a terminal (step and job
//! names, paths and words a model wrote): its control characters are shown
//! as escapes, never obeyed, so nobody can rewrite a screen with them.

use std::borrow::Cow;

/// `s` with every control character written out (`\x1b`, `\u{9b}`).
pub fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if (c as u32) < 0x80 && c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_obeyed() {
        assert_eq!(escape_controls("build"), "build");
        assert_eq!(escape_controls("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(escape_controls("x\ny\r"), "x\\x0ay\\x0d");
        assert_eq!(escape_controls("c1\u{9b}31m"), "c1\\u{9b}31m");
        assert_eq!(escape_controls("héllo ✔"), "héllo ✔");
    }
}
