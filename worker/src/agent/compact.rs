//! Compaction (agent-steps §3.9): once a conversation holds more tokens
//! than its budget, the older part is summarized by the agent's own model
//! and replaced by the summary; the newest messages stay as they were.

use serde_json::{json, Value};

use super::Conversation;

/// The newest messages kept whole: at least this share of the budget.
const RECENT_SHARE: f64 = 0.3;
/// A tool result is cut to this many bytes in what the summarizer reads.
const RESULT_CAP: usize = 4_000;
/// Each text part of the fallback summary (when the model gives none).
const FALLBACK_PART: usize = 200;

const SUMMARIZER: &str = "You compress an agent's working conversation so it can continue with less context. Write a summary with three sections:\n\
## Current State\nWhat has been done and what is true now.\n\
## Key Information\nFacts, file names, values and results the agent will need again, exactly.\n\
## Exact Next Steps\nWhat the agent must do next to finish its task.\n\
Be complete but brief; do not invent anything.";

/// What compaction keeps across turns (and across a failover).
#[derive(Default)]
pub(super) struct Compaction {
    /// Tokens the conversation may hold before it is compacted; 0: never.
    pub budget: u64,
    /// Turned off: the newest messages alone were over the budget.
    pub off: bool,
    pub summary: Option<String>,
}

/// Tokens of one message, as chars/4: its text, its calls, its result.
fn tokens(m: &Value) -> u64 {
    let mut chars = m.get("content").and_then(Value::as_str).map(str::len).unwrap_or(0);
    for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
        chars += c.pointer("/function/name").and_then(Value::as_str).map(str::len).unwrap_or(0);
        chars += c.pointer("/function/arguments").and_then(Value::as_str).map(str::len).unwrap_or(0);
    }
    (chars / 4) as u64
}

/// The conversation's tokens, its system message aside.
pub(super) fn estimate(messages: &[Value]) -> u64 {
    messages.iter().skip(1).map(tokens).sum()
}

fn role(m: &Value) -> &str {
    m.get("role").and_then(Value::as_str).unwrap_or_default()
}

/// Where the kept newest messages start: at least `keep` tokens, never
/// between a call and its result (None: nothing older to summarize).
fn recent_start(messages: &[Value], keep: u64) -> Option<usize> {
    let mut k = messages.len();
    let mut held = 0;
    while k > 1 && held < keep {
        k -= 1;
        held += tokens(&messages[k]);
    }
    // A tool result belongs with the call before it.
    while k > 1 && role(&messages[k]) == "tool" {
        k -= 1;
    }
    (k > 1).then_some(k)
}

/// How the summarizer reads the older messages.
fn transcript(messages: &[Value], previous: Option<&str>) -> String {
    let mut out = String::new();
    if let Some(p) = previous {
        out.push_str(&format!("Summary of what came before:\n{p}\n\n"));
    }
    // A result names the tool its call asked for.
    let mut called: std::collections::HashMap<&str, &str> = Default::default();
    for m in messages {
        let r = role(m);
        let text = m.get("content").and_then(Value::as_str).unwrap_or_default();
        if r == "tool" {
            let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
            out.push_str(&format!("[{} returned: {}]\n", called.get(id).copied().unwrap_or("tool"), cut(text, RESULT_CAP)));
            continue;
        }
        for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            if let (Some(id), Some(name)) = (c.get("id").and_then(Value::as_str), c.pointer("/function/name").and_then(Value::as_str)) {
                called.insert(id, name);
            }
        }
        if !text.is_empty() {
            out.push_str(&format!("{r}: {text}\n"));
        }
        for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
            let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
            let args = c.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default();
            out.push_str(&format!("[called {name} with args {args}]\n"));
        }
    }
    out
}

fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl Conversation<'_> {
    /// Before a turn: compacts the conversation when it is over its budget.
    pub(super) async fn maybe_compact(&mut self, state: &mut Compaction, prompt: &str) {
        if state.off || state.budget == 0 {
            return;
        }
        let before = estimate(&self.messages);
        if before <= state.budget {
            return;
        }
        let keep = (state.budget as f64 * RECENT_SHARE) as u64;
        let Some(k) = recent_start(&self.messages, keep) else { return };
        if self.messages[k..].iter().map(tokens).sum::<u64>() > state.budget {
            state.off = true;
            self.say(&format!("compaction: the newest messages alone are over the {}-token budget; not compacting this conversation", state.budget));
            return;
        }
        let older = transcript(&self.messages[1..k], state.summary.as_deref());
        let saved = std::mem::replace(&mut self.messages, vec![json!({"role": "system", "content": SUMMARIZER}), json!({"role": "user", "content": older})]);
        let answer = self.request(false, None).await;
        self.messages = saved;
        let summary = match answer {
            Err(e) => {
                self.say(&format!("compaction: the summary request failed ({}); going on uncompacted", e.message));
                return;
            }
            Ok(m) => m.get("content").and_then(Value::as_str).map(str::trim).unwrap_or_default().to_string(),
        };
        // No summary from the model: the older text parts, each cut short.
        let summary = if summary.is_empty() {
            self.messages[1..k].iter().filter_map(|m| m.get("content").and_then(Value::as_str)).filter(|t| !t.is_empty()).map(|t| cut(t, FALLBACK_PART).to_string()).collect::<Vec<_>>().join("\n")
        } else {
            summary
        };
        let recent = self.messages.split_off(k);
        self.messages.truncate(1);
        self.messages.push(json!({"role": "user", "content": format!("Summary of the conversation so far:\n{summary}")}));
        self.messages.extend(recent);
        self.messages.push(json!({"role": "user", "content": format!("This conversation was compacted: the summary above holds the earlier context. The original request was: {prompt}\nContinue from where you are.")}));
        self.say(&format!("compacted: {} earlier message(s) summarized (about {before} tokens, over the budget of {})", k - 1, state.budget));
        self.record("text", "compaction", &summary);
        state.summary = Some(summary);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_part_never_starts_between_a_call_and_its_result() {
        let m = vec![
            json!({"role": "system", "content": "s"}),
            json!({"role": "user", "content": "x".repeat(400)}),
            json!({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "read_file", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "y".repeat(400)}),
        ];
        assert_eq!(estimate(&m), 100 + (9 + 2) / 4 + 100, "chars/4 per message: the text, the call's name and arguments, the result");
        assert_eq!(recent_start(&m, 50), Some(2), "the result's call comes with it");
        assert_eq!(recent_start(&m, 1_000), None, "nothing older is left to summarize");
        let t = transcript(&m[1..], Some("before"));
        assert!(t.starts_with("Summary of what came before:\nbefore") && t.contains("[called read_file with args {}]") && t.contains("[read_file returned: yyyy"), "{t}");
    }
}
