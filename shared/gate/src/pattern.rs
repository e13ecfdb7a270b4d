//! Regexes as Stepgate runs them (§1.6): RE2's language with lookbehind —
//! lookahead and backreferences refused, as RE2 refuses them.

/// A compiled pattern.
#[derive(Debug)]
pub struct Pattern(fancy_regex::Regex);

/// Compiles `p`, or says why it is not one Stepgate runs.
pub fn compile(p: &str) -> Result<Pattern, String> {
    let mut escaped = false;
    let bytes = p.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if escaped {
            escaped = false;
            if b.is_ascii_digit() && b != b'0' || b == b'k' && bytes.get(i + 1) == Some(&b'<') {
                return Err(format!("{p:?} uses a backreference, which RE2 does not run"));
            }
            continue;
        }
        match b {
            b'\\' => escaped = true,
            b'(' if p[i..].starts_with("(?=") || p[i..].starts_with("(?!") => return Err(format!("{p:?} uses lookahead, which RE2 does not run")),
            _ => {}
        }
    }
    fancy_regex::Regex::new(p).map(Pattern).map_err(|e| e.to_string())
}

impl Pattern {
    /// Each match's first group (or the whole match), in order.
    pub fn all(&self, s: &str) -> Vec<String> {
        self.0.captures_iter(s).filter_map(Result::ok).map(|c| c.get(1).or_else(|| c.get(0)).map_or(String::new(), |m| m.as_str().to_string())).collect()
    }

    pub fn is_match(&self, s: &str) -> bool {
        self.0.is_match(s).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookbehind_runs_lookahead_and_backreferences_do_not() {
        let p = compile("(?<![0-9])([0-9]{7,})").expect("lookbehind");
        assert_eq!(p.all("x 1234567 y 12345678"), vec!["1234567", "12345678"]);
        assert!(compile("a(?=b)").unwrap_err().contains("lookahead"));
        assert!(compile("(a)\\1").unwrap_err().contains("backreference"));
        assert!(compile("\\\\1").is_ok(), "an escaped backslash before a digit is not a backreference");
        assert!(compile("(").is_err());
    }
}
