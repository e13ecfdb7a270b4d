//! An error and its causes in one line, each said once.

/// `error: cause: cause` down the chain, leaving out a cause whose words an
/// earlier part already holds (a transport error wrapping a transport
/// error, a URL error quoting itself) and empty ones.
pub fn said<'a>(chain: impl IntoIterator<Item = &'a (dyn std::error::Error + 'static)>) -> String {
    let mut parts: Vec<String> = Vec::new();
    for c in chain {
        let t = c.to_string();
        if t.is_empty() || parts.iter().any(|p| p.contains(&t)) {
            continue;
        }
        parts.push(t);
    }
    parts.join(": ")
}

/// [`said`] of `e` and the sources below it.
pub fn of(e: &(dyn std::error::Error + 'static)) -> String {
    said(std::iter::successors(Some(e), |e| e.source()))
}

#[cfg(test)]
mod tests {
    #[derive(Debug, thiserror::Error)]
    #[error("cannot reach {0}: {1}")]
    struct Reach(&'static str, #[source] Transport);

    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Transport(#[source] std::io::Error);

    #[test]
    fn each_cause_is_said_once() {
        let e = Reach("x", Transport(std::io::Error::other("connection refused")));
        assert_eq!(super::of(&e), "cannot reach x: transport error: connection refused");
    }
}
