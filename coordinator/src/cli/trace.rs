//! `steppe runs --trace`: a run's spans as a waterfall in the terminal —
//! each span under its parent, where it started, how long it took, which
//! process made it, and a bar on the run's time line.

use steppe_runtime::trace::{timeline, SpanRecord, Timeline};

use super::format::fmt_ms;
use crate::text::shown;

/// The waterfall's lines, bars `width` characters wide.
pub fn waterfall(spans: &[SpanRecord], width: usize) -> Vec<String> {
    let Some(line) = timeline(spans) else { return vec!["no spans recorded for this run".to_string()] };
    let ms = |ns: u64| i64::try_from(ns / 1_000_000).unwrap_or(i64::MAX);
    let mut out = vec![format!("trace {}  {} span(s) over {}", spans.first().map(|s| s.trace_id.as_str()).unwrap_or_default(), spans.len(), fmt_ms(ms(line.length_ns)))];
    out.push(format!("{:<48} {:>8} {:>8}  {:<w$}  {}", "SPAN", "START", "TOOK", "", "PROCESS", w = width));
    for &(depth, s) in &line.rows {
        let name: String = format!("{}{}", "  ".repeat(depth.min(12)), shown(&s.name)).chars().take(48).collect();
        let a = line.cell(s.start_ns, width);
        let b = line.cell(Timeline::end_of(s), width).max(a + 1).min(width);
        let bar = format!("{}{}{}", " ".repeat(a.min(width)), if s.error.is_some() { "x" } else { "█" }.repeat(b.saturating_sub(a)), " ".repeat(width.saturating_sub(b)));
        let mut row = format!("{name:<48} {:>8} {:>8}  {bar}  {}", format!("+{}", fmt_ms(ms(s.start_ns - line.start_ns))), fmt_ms(ms(s.end_ns.saturating_sub(s.start_ns))), shown(&s.process));
        let keep: Vec<String> = s.attributes.iter().filter(|(k, _)| matches!(k.as_str(), "outcome" | "worker" | "pool" | "tokens" | "model" | "exit_code")).filter(|(k, v)| k != "worker" || *v != s.process).map(|(k, v)| format!("{k}={}", shown(v))).collect();
        if !keep.is_empty() {
            row.push_str(&format!("  {}", keep.join(" ")));
        }
        if let Some(e) = &s.error {
            row.push_str(&format!("  error: {}", shown(e.lines().next().unwrap_or_default())));
        }
        out.push(row);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_draw_under_their_parents_on_one_time_line() {
        let span = |id: &str, parent: &str, name: &str, start: u64, end: u64| SpanRecord {
            trace_id: "t".repeat(32),
            span_id: id.into(),
            parent_id: parent.into(),
            name: name.into(),
            start_ns: start * 1_000_000,
            end_ns: end * 1_000_000,
            process: "run h:1".into(),
            ..Default::default()
        };
        let mut failed = span("c", "b", "execute boom", 50, 100);
        failed.error = Some("boom: exit status 3\nmore".into());
        let lines = waterfall(&[span("a", "", "run j", 0, 100), span("b", "a", "step boom", 10, 100), failed], 10);
        assert!(lines[0].contains("3 span(s) over 100ms"), "{lines:?}");
        assert!(lines[2].starts_with("run j") && lines[2].contains("██████████"), "{lines:?}");
        assert!(lines[3].starts_with("  step boom") && lines[3].contains(" █████████"), "{lines:?}");
        assert!(lines[4].starts_with("    execute boom") && lines[4].contains("+50ms") && lines[4].contains("xxxxx") && lines[4].ends_with("error: boom: exit status 3"), "{lines:?}");
        assert_eq!(waterfall(&[], 10), ["no spans recorded for this run"]);
    }
}
