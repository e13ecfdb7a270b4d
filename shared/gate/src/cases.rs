//! Recorded cases (§1.15): each attempt a run made — the step, the calls
//! that reached a tool, the output and which gates failed — written by
//! `--record-cases` as `<stepfile>-<run>.cases.yaml`, for `--test` to replay.

use std::path::Path;

use serde_json::{json, Value};

use crate::run::CallSeen;

/// One submission of one step.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub step: String,
    pub calls: Vec<CallSeen>,
    pub output: Value,
    /// The failing gate ids; empty when it passed.
    pub failed: Vec<String>,
}

const WARNING: &str = "# Recorded by steppe gate --record-cases. It holds the tools' real results:\n# read it for secrets and personal data before you share or commit it.\n";

/// The cases document of one run.
pub fn document(name: &str, inputs: &Value, attempts: &[Attempt]) -> Value {
    let steps: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let calls: Vec<Value> = a.calls.iter().map(|c| json!({"tool": c.tool, "arguments": c.arguments, "result": c.result, "is_error": c.is_error})).collect();
            let expect = if a.failed.is_empty() { json!("pass") } else { json!({"fail": a.failed}) };
            json!({"step": a.step, "calls": calls, "output": a.output, "expect": expect})
        })
        .collect();
    json!({"cases": [{"name": name, "inputs": inputs, "steps": steps}]})
}

/// Writes a run's cases into `dir`.
pub fn append(dir: &Path, stepfile: &str, run: &str, name: &str, inputs: &Value, attempts: &[Attempt]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let doc = document(name, inputs, attempts);
    let text = format!("{WARNING}{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default());
    std::fs::write(dir.join(format!("{stepfile}-{run}.cases.yaml")), text)
}
