//! What a run says back to the client (§1.9): every reply as text and the
//! identical facts as `structuredContent`.

use serde_json::{json, Map, Value};

use crate::error::GateError;
use crate::expr::compact;

/// A tool reply: its text, its structured content and whether it is an error.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub text: String,
    pub structured: Option<Value>,
    pub is_error: bool,
}

/// What the client is shown of its current step.
pub struct StepView<'a> {
    pub step: &'a str,
    pub number: usize,
    pub total: usize,
    pub instructions: &'a str,
    pub operations: &'a [Value],
    pub produces: &'a Value,
    pub attempts_left: u32,
    pub completed: &'a [String],
}

/// JSON if the text is JSON, else the text.
pub fn parsed(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| json!(text))
}

/// The first 500 characters of a body, as errors quote it.
pub fn head(text: &str) -> String {
    text.chars().take(500).collect()
}

/// Length as JavaScript counts it (UTF-16 code units): how lengths are
/// recorded and limits applied, so ledgers agree across runtimes.
pub fn js_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// `text` cut to `limit` UTF-16 units, with the note saying so.
pub fn cut(text: &str, limit: usize) -> String {
    let len = js_len(text);
    if len <= limit {
        return text.to_string();
    }
    let mut units = 0;
    let mut end = 0;
    for (i, c) in text.char_indices() {
        if units + c.len_utf16() > limit {
            break;
        }
        units += c.len_utf16();
        end = i + c.len_utf8();
    }
    format!("{}\n[truncated: the result was {len} characters; only the first {limit} are shown]", &text[..end])
}

pub fn step(run: &str, v: &StepView) -> Reply {
    let mut parts: Vec<String> = Vec::new();
    if !v.completed.is_empty() {
        parts.push(format!("Stepgate did these steps itself: {}.", v.completed.join(", ")));
    }
    parts.push(format!("Run {run}, step {} of {}: {}.", v.number, v.total, v.step));
    parts.push(format!("Instructions:\n{}", v.instructions.trim()));
    if v.operations.is_empty() {
        parts.push("This step has no operations; work from the instructions and what earlier steps returned.".into());
    } else {
        let ops: Vec<String> = v
            .operations
            .iter()
            .map(|o| format!("- {}: {}\n  arguments: {}", compact(&o["name"]), compact(&o["description"]), o["inputSchema"]))
            .collect();
        parts.push(format!("Operations for this step, called with stepgate_call:\n{}", ops.join("\n")));
    }
    parts.push(format!("When the step is done, call stepgate_submit with run \"{run}\" and an output matching this JSON Schema:\n{}", v.produces));
    parts.push(format!("Attempts: {}.", v.attempts_left));
    let structured = json!({"run": run, "state": "running", "step": {
        "step": v.step, "number": v.number, "total": v.total, "instructions": v.instructions,
        "operations": v.operations, "produces": v.produces, "attempts_left": v.attempts_left, "completed": v.completed,
    }});
    Reply { text: parts.join("\n\n"), structured: Some(structured), is_error: false }
}

/// A call's result as the client is shown it.
pub fn call(run: &str, shown: String, is_error: bool) -> Reply {
    Reply { structured: Some(json!({"run": run, "state": "running", "result": shown})), text: shown, is_error }
}

/// An operation the step does not list: refused, the run goes on.
pub fn refused(run: &str, operation: &str) -> Reply {
    call(run, format!("{operation} is not available in this step."), true)
}

/// Arguments that break the operation's schema: refused, the run goes on.
pub fn invalid_arguments(run: &str, operation: &str, problems: &[String]) -> Reply {
    let why = if problems.is_empty() { "arguments must be an object".to_string() } else { problems.join("; ") };
    call(run, format!("Invalid arguments for {operation}: {why}"), true)
}

pub fn rejected(run: &str, failures: &[(String, String)], attempts_left: u32) -> Reply {
    let lines: Vec<String> = failures.iter().map(|(g, d)| format!("- {g}: {d}")).collect();
    let text = format!("The output was rejected. Fix every problem below and call stepgate_submit again ({attempts_left} attempts left).\n{}", lines.join("\n"));
    let failures: Vec<Value> = failures.iter().map(|(g, d)| json!({"gate": g, "diagnosis": d})).collect();
    Reply { text, structured: Some(json!({"run": run, "state": "running", "failures": failures, "attempts_left": attempts_left})), is_error: true }
}

pub fn finished(run: &str, identity: &str, outputs: &Map<String, Value>) -> Reply {
    let outputs = Value::Object(outputs.clone());
    let text = format!("The run finished. Every step passed its gates. Outputs:\n{}", serde_json::to_string_pretty(&outputs).unwrap_or_default());
    Reply { text, structured: Some(json!({"run": run, "state": "finished", "identity": identity, "outputs": outputs})), is_error: false }
}

/// A run that ended with `e` (or never started, `run` none).
pub fn failed(run: Option<&str>, e: &GateError) -> Reply {
    let mut text = format!("{}: {}", e.name, e.message);
    if run.is_some() && e.name != "RunNotActive" {
        text.push_str("\nThe run has ended.");
    }
    Reply { text, structured: Some(json!({"run": run, "state": "failed", "error": e.name, "message": e.message})), is_error: true }
}

pub fn unknown_tool(name: &str) -> Reply {
    Reply { text: format!("no tool named {name}"), structured: Some(json!({"run": null, "state": "failed", "error": "UnknownTool"})), is_error: true }
}

/// A reply of an authoring tool: text only.
pub fn plain(text: String, is_error: bool) -> Reply {
    Reply { text, structured: None, is_error }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_count_utf16_and_say_so() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("a😀b", 2), "a\n[truncated: the result was 4 characters; only the first 2 are shown]");
    }

    #[test]
    fn a_failed_reply_says_the_run_ended_only_for_a_run() {
        let e = GateError::new("GateFailed", "step s failed gates: g: no");
        assert_eq!(failed(Some("r"), &e).text, "GateFailed: step s failed gates: g: no\nThe run has ended.");
        assert_eq!(failed(None, &e).text, "GateFailed: step s failed gates: g: no");
        assert_eq!(failed(None, &e).structured.unwrap()["run"], Value::Null);
    }
}
