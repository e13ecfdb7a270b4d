//! The authoring tools' texts: `stepgate_guide`'s workflow and reference,
//! and `stepgate_validate`'s verdict on a draft.

use std::path::Path;

use crate::reply::{self, Reply};

pub const GUIDE: &str = r#"Writing a stepfile

Workflow: write the procedure as steps, each with what it must produce and the gates that prove it; call stepgate_validate with the draft until it loads; then run it through its own tool.

Top level: stepgate: "1"; id (lowercase, digits, '-'; the tool's name); title; description; inputs (a JSON Schema of type object); settings (id -> {description, pattern}: values from the environment, only in hosts and ports as {id}); credentials (id -> {kind: api_key|bearer|oauth2|basic, hosts, description}); tools (id -> {openapi: {server, document | url + sha256} | mcp: {url} | verifier: {url}, credential, exposes}); steps; $defs.

Steps, in order: id; instructions (an agent step: the client does it) or do (a mechanical step: Stepgate does it: calls [{id, operation, arguments, each, accept}] and an output template); tools (the exposed operations the step may call); produces (the JSON Schema of its output); gates (schema, predicate + message [+ explain], http: {tool} a verifier, approve: {message}); retries (0-5); derive (produces properties Stepgate computes); let (named expressions, in order); when (skip the step unless exactly true).

Placeholders in instructions: {{inputs.x}} and {{steps.<earlier step>.x}}.

Expressions are JSONLogic (var, if, ==, ===, !=, !, and, or, <, >, +, -, map, filter, reduce, all, none, some, merge, in, cat, substr) and Stepgate's own: results [op, path], object, length, unique, subset, difference, keys, lower, get, join, flatten, host, match_all, assign, sort_by, time_add, time_diff, literal. Gates see {inputs, steps, output, calls, let}; a predicate passes only on exactly true.

Every request goes only to the hosts the tools declare; credentials come from <NAME>_API_KEY and are attached only to their own hosts. Every event of a run is in its ledger; `steppe gate --verify` checks it."#;

/// `stepgate_validate`: the draft's problems, or what it is.
pub fn validate(text: &str) -> Reply {
    let todos: Vec<&str> = text.lines().filter(|l| l.contains("TODO(")).map(str::trim).collect();
    match crate::load::load_str(text, Path::new("stepfile")) {
        Err(e) => {
            let mut lines: Vec<String> = e.issues.iter().map(|i| format!("- {i}")).collect();
            lines.extend(todos.iter().map(|t| format!("- still to do: {t}")));
            reply::plain(format!("The stepfile does not load:\n{}", lines.join("\n")), true)
        }
        Ok(l) => {
            let steps: Vec<String> = l.stepfile.steps.iter().map(|s| format!("- {} ({})", s.id, if s.do_.is_some() { "mechanical" } else { "agent" })).collect();
            let mut text = format!("The stepfile loads: id {}, identity {}.\nSteps:\n{}", l.stepfile.id, l.identity, steps.join("\n"));
            if !todos.is_empty() {
                text.push_str(&format!("\nStill to do:\n{}", todos.iter().map(|t| format!("- {t}")).collect::<Vec<_>>().join("\n")));
            }
            reply::plain(text, !todos.is_empty())
        }
    }
}
