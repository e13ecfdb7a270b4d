//! Near-miss suggestions: `promt` → `prompt`.

/// Levenshtein distance over characters.
pub fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The closest candidate, compared case-insensitively, if it is within
/// `len(written)/3 + 1` edits. Ties go to the first candidate.
pub fn nearest<'c>(written: &str, candidates: impl IntoIterator<Item = &'c str>) -> Option<&'c str> {
    let w = written.to_lowercase();
    let limit = written.chars().count() / 3 + 1;
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let d = levenshtein(&w, &c.to_lowercase());
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c)
}

/// ` (did you mean "x"?)`, or nothing when no candidate is close.
pub fn did_you_mean<'c>(written: &str, candidates: impl IntoIterator<Item = &'c str>) -> String {
    match nearest(written, candidates) {
        Some(c) if c != written => format!(" (did you mean \"{c}\"?)"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance() {
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("same", "same"), 0);
    }

    #[test]
    fn suggests_the_near_miss() {
        assert_eq!(nearest("promt", ["prompt", "params", "run"]), Some("prompt"));
        assert_eq!(nearest("RUN", ["run"]), Some("run"));
        assert_eq!(did_you_mean("succeded", ["succeeded", "failed"]), " (did you mean \"succeeded\"?)");
    }

    #[test]
    fn refuses_far_candidates_and_breaks_ties_by_order() {
        assert_eq!(nearest("xyz", ["prompt"]), None);
        // limit for a 2-char word is 1 edit
        assert_eq!(nearest("ab", ["abc", "abd"]), Some("abc"));
        assert_eq!(did_you_mean("zzzzzz", ["prompt"]), "");
    }
}
