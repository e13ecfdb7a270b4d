//! Recorded cases (§1.15): each attempt a run made — the step, the calls
//! that reached a tool, the output and which gates failed — written by
//! `--record-cases` as `<stepfile>-<run>.cases.yaml`, for `--test` to replay.

use std::path::Path;

use serde_json::{json, Value};


/// A call that reached its tool, as gates see it.
#[derive(Debug, Clone)]
pub struct CallSeen {
    pub tool: String,
    pub arguments: Value,
    pub result: Value,
    pub is_error: bool,
}

/// Calls as gates read them (`calls`).
pub fn calls_json(calls: &[CallSeen]) -> Value {
    Value::Array(calls.iter().map(|c| json!({"tool": c.tool, "arguments": c.arguments, "result": c.result, "is_error": c.is_error})).collect())
}

/// One submission of one step (a mechanical step's computed output).
#[derive(Debug, Clone)]
pub struct Attempt {
    pub step: String,
    pub calls: Vec<CallSeen>,
    pub output: Value,
    /// The failing gate ids; empty when it passed.
    pub failed: Vec<String>,
}

/// The cases document of one run.
pub fn document(name: &str, inputs: &Value, attempts: &[Attempt]) -> Value {
    let steps: Vec<Value> = attempts
        .iter()
        .map(|a| {
            let expect = if a.failed.is_empty() { json!("pass") } else { json!({"fail": a.failed}) };
            json!({"step": a.step, "calls": calls_json(&a.calls), "output": a.output, "expect": expect})
        })
        .collect();
    json!({"cases": [{"name": name, "inputs": inputs, "steps": steps}]})
}

/// Writes a run's cases to `dir/<stepfile>-<run>.cases.yaml` (JSON, which is YAML).
pub fn write(dir: &Path, stepfile: &str, run: &str, inputs: &Value, attempts: &[Attempt]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let doc = document(&format!("run {run} of {stepfile}"), inputs, attempts);
    let header = format!("# Recorded by steppe gate --record-cases from run {run}. It holds the APIs' full responses; trim them before sharing.\n");
    std::fs::write(dir.join(format!("{stepfile}-{run}.cases.yaml")), format!("{header}{}\n", serde_json::to_string_pretty(&doc).unwrap_or_default()))
}
