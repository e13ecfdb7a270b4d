//! A run's spans as the store keeps them and the dashboard and `steppe runs
//! --trace` draw them (whoever made them: the coordinator, a worker), and
//! the W3C `traceparent` that carries a span's context between processes
//! (gRPC metadata, every queue entry).

use serde::{Deserialize, Serialize};

/// One finished span.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpanRecord {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// Empty for the trace's root.
    pub parent_id: String,
    pub name: String,
    /// Unix time in nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    /// What an operator filters on (pipeline, team, job, step, worker, pool,
    /// outcome, tokens, model), in the order they were set.
    pub attributes: Vec<(String, String)>,
    /// Set when the span ended in error: why.
    pub error: Option<String>,
    /// The process that made it (`coordinator HOST:PID`, `worker NAME`).
    pub process: String,
}

impl SpanRecord {
    /// Spans as a store keeps them together: one JSON array.
    pub fn encode_many(spans: &[&SpanRecord]) -> String {
        serde_json::to_string(spans).unwrap_or_default()
    }

    /// What [`SpanRecord::encode_many`] wrote, or one span as stores kept
    /// each before; nothing from what is neither.
    pub fn decode_many(text: &str) -> Vec<SpanRecord> {
        if text.trim_start().starts_with('[') {
            serde_json::from_str(text).unwrap_or_default()
        } else {
            serde_json::from_str(text).map(|s| vec![s]).unwrap_or_default()
        }
    }

    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

/// The attribute every span of a run carries: the run's id (how the store
/// files a span, whichever process made it).
pub const RUN_ATTRIBUTE: &str = "steppe.run";

/// A span's context as W3C `traceparent` (`00-TRACE-SPAN-01`).
pub fn traceparent(trace_id: &str, span_id: &str, sampled: bool) -> String {
    format!("00-{trace_id}-{span_id}-{}", if sampled { "01" } else { "00" })
}

/// `traceparent` read back: (trace id, span id, sampled); None when it is
/// not one (a peer's garbage is ignored, never trusted).
pub fn parse_traceparent(s: &str) -> Option<(String, String, bool)> {
    let mut parts = s.trim().split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |x: &str, n: usize| x.len() == n && x.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if version == "ff" || !hex(version, 2) || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    if trace.bytes().all(|b| b == b'0') || span.bytes().all(|b| b == b'0') {
        return None;
    }
    let sampled = u8::from_str_radix(flags, 16).ok()? & 1 == 1;
    Some((trace.to_string(), span.to_string(), sampled))
}

/// The spans of one trace as a tree, in drawing order: (depth, span), each
/// parent before its children, siblings by start time; a span whose parent
/// is not among them is a root.
pub fn tree(spans: &[SpanRecord]) -> Vec<(usize, &SpanRecord)> {
    let ids: std::collections::HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: std::collections::HashMap<&str, Vec<&SpanRecord>> = std::collections::HashMap::new();
    let mut roots = Vec::new();
    for s in spans {
        if s.parent_id.is_empty() || !ids.contains(s.parent_id.as_str()) {
            roots.push(s);
        } else {
            children.entry(s.parent_id.as_str()).or_default().push(s);
        }
    }
    let by_start = |v: &mut Vec<&SpanRecord>| v.sort_by_key(|s| (s.start_ns, s.end_ns));
    by_start(&mut roots);
    for v in children.values_mut() {
        by_start(v);
    }
    let mut out = Vec::new();
    let mut stack: Vec<(usize, &SpanRecord)> = roots.into_iter().rev().map(|s| (0, s)).collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((depth, s)) = stack.pop() {
        if !seen.insert(s.span_id.as_str()) {
            continue;
        }
        out.push((depth, s));
        if let Some(kids) = children.get(s.span_id.as_str()) {
            stack.extend(kids.iter().rev().map(|k| (depth + 1, *k)));
        }
    }
    out
}

/// A trace's spans on one time line, as the waterfalls draw it (`steppe
/// runs --trace`, the dashboard): in drawing order, from the first start
/// to the last end (a span that ends before it starts, as clocks of two
/// machines can make it, counts as ending where it starts).
pub struct Timeline<'a> {
    pub start_ns: u64,
    /// At least 1 ns.
    pub length_ns: u64,
    /// (depth, span), as [`tree`] gives them.
    pub rows: Vec<(usize, &'a SpanRecord)>,
}

impl Timeline<'_> {
    /// A span's end, never before its start.
    pub fn end_of(s: &SpanRecord) -> u64 {
        s.end_ns.max(s.start_ns)
    }

    /// Where `ns` falls on the line: 0.0 at its start, 1.0 at its end.
    pub fn at(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.start_ns) as f64 / self.length_ns as f64
    }

    /// Where `ns` falls on a line `width` cells long (whole cells, rounded down).
    pub fn cell(&self, ns: u64, width: usize) -> usize {
        (ns.saturating_sub(self.start_ns) as u128 * width as u128 / self.length_ns as u128) as usize
    }
}

/// The time line of `spans`; None when there are none.
pub fn timeline(spans: &[SpanRecord]) -> Option<Timeline<'_>> {
    let start_ns = spans.iter().map(|s| s.start_ns).min()?;
    let end = spans.iter().map(Timeline::end_of).max().unwrap_or(start_ns).max(start_ns + 1);
    Some(Timeline { start_ns, length_ns: end - start_ns, rows: tree(spans) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_kept_together_read_back_as_do_spans_kept_one_by_one() {
        let a = SpanRecord { span_id: "a".into(), name: "step x".into(), attributes: vec![("k".into(), "v".into())], ..Default::default() };
        let b = SpanRecord { span_id: "b".into(), parent_id: "a".into(), error: Some("exit 3".into()), ..Default::default() };
        assert_eq!(SpanRecord::decode_many(&SpanRecord::encode_many(&[&a, &b])), [a.clone(), b]);
        assert_eq!(SpanRecord::decode_many(&serde_json::to_string(&a).unwrap()), [a], "a store written by an earlier build");
        assert!(SpanRecord::decode_many("not json").is_empty());
        assert!(SpanRecord::decode_many("[]").is_empty());
    }

    #[test]
    fn traceparents_round_trip_and_garbage_is_refused() {
        let t = "4bf92f3577b34da6a3ce929d0e0e4736";
        let s = "00f067aa0ba902b7";
        assert_eq!(parse_traceparent(&traceparent(t, s, true)), Some((t.to_string(), s.to_string(), true)));
        assert_eq!(parse_traceparent(&traceparent(t, s, false)).map(|p| p.2), Some(false));
        for bad in ["", "00-xyz-00f067aa0ba902b7-01", &format!("00-{}-{s}-01", "0".repeat(32)), &format!("ff-{t}-{s}-01"), &format!("00-{t}-{s}"), &format!("00-{}-{s}-01", t.to_uppercase())] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_tree_puts_parents_first_and_orphans_at_the_root() {
        let span = |id: &str, parent: &str, start: u64| SpanRecord { span_id: id.into(), parent_id: parent.into(), start_ns: start, end_ns: start + 10, name: id.into(), ..Default::default() };
        let spans = vec![span("c", "a", 5), span("a", "", 1), span("b", "a", 2), span("d", "b", 3), span("x", "gone", 0)];
        let drawn: Vec<(usize, &str)> = tree(&spans).into_iter().map(|(d, s)| (d, s.name.as_str())).collect();
        assert_eq!(drawn, [(0, "x"), (0, "a"), (1, "b"), (2, "d"), (1, "c")]);
    }
}
