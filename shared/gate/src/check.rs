//! How a step's output is judged (§1.7), the same live and under `--test`:
//! derived fields refused, `produces` checked without and then with them,
//! `let` evaluated in order, then every gate in file order.

use serde_json::{json, Map, Value};

use crate::error::GateError;
use crate::expr;
use crate::schema::{self, Schema};
use crate::stepfile::{Gate, Step};

/// What is left to judge after the checks that stop a submission at once.
pub enum Stage {
    /// One verdict decides it: `derive` or `produces`, with its diagnosis.
    Refused { gate: &'static str, diagnosis: String },
    /// The output with its derived fields, the `let` values, and whether
    /// anything was derived.
    Ready { full: Value, lets: Value, derived: bool },
}

/// What a gate said.
pub enum Verdict {
    Pass,
    Fail(String),
    /// A verifier or an approval: judged by the caller (or skipped offline).
    Elsewhere,
}

/// The context gates, `let` and `derive` read.
pub fn context(inputs: &Value, steps: &Value, output: &Value, calls: &Value, lets: &Value) -> Value {
    json!({"inputs": inputs, "steps": steps, "output": output, "calls": calls, "let": lets})
}

/// The checks before the gates: derived fields refused, `produces` without
/// them, `let`, the derived fields and `produces` with them.
pub fn prepare(step: &Step, defs: Option<&Value>, inputs: &Value, steps: &Value, output: &Value, calls: &Value) -> Result<Stage, GateError> {
    let derive = step.derive.clone().unwrap_or_default();
    let present: Vec<&str> = derive.keys().filter(|k| output.get(k.as_str()).is_some()).map(String::as_str).collect();
    if !present.is_empty() {
        let one = present.len() == 1;
        let diagnosis = format!("{} {} computed by Stepgate; submit the output without {}", present.join(", "), if one { "is" } else { "are" }, if one { "it" } else { "them" });
        return Ok(Stage::Refused { gate: "derive", diagnosis });
    }
    let keys: Vec<&String> = derive.keys().collect();
    let compile = |e: String| GateError::new("GateFailed", format!("step {}: produces does not compile: {e}", step.id));
    let problems = schema::problems(&schema::without(&step.produces, &keys), defs, output).map_err(compile)?;
    if !problems.is_empty() {
        return Ok(Stage::Refused { gate: "produces", diagnosis: problems.join("; ") });
    }
    let mut lets = Map::new();
    if let Some(Value::Object(defs)) = &step.let_ {
        for (name, rule) in defs {
            let ctx = context(inputs, steps, output, calls, &Value::Object(lets.clone()));
            lets.insert(name.clone(), expr::eval(rule, &ctx).unwrap_or(Value::Null));
        }
    }
    let lets = Value::Object(lets);
    let mut full = output.clone();
    if !derive.is_empty() {
        let ctx = context(inputs, steps, output, calls, &lets);
        for (k, rule) in &derive {
            let v = expr::eval(rule, &ctx).unwrap_or(Value::Null);
            if let Value::Object(m) = &mut full {
                m.insert(k.clone(), v);
            }
        }
        let problems = schema::problems(&step.produces, defs, &full).map_err(compile)?;
        if !problems.is_empty() {
            return Ok(Stage::Refused { gate: "produces", diagnosis: format!("a derived field breaks produces: {}", problems.join("; ")) });
        }
    }
    Ok(Stage::Ready { full, lets, derived: !derive.is_empty() })
}

/// A schema or predicate gate's verdict over `ctx` (its `output` the full one).
pub fn verdict(g: &Gate, defs: Option<&Value>, ctx: &Value) -> Result<Verdict, GateError> {
    if let Some(s) = &g.schema {
        let p = Schema::compile(s, defs).map_err(|e| GateError::new("GateFailed", format!("gate {}: its schema does not compile: {e}", g.id)))?.problems(&ctx["output"]);
        return Ok(if p.is_empty() { Verdict::Pass } else { Verdict::Fail(p.join("; ")) });
    }
    if let Some(pred) = &g.predicate {
        if expr::passes(pred, ctx).unwrap_or(false) {
            return Ok(Verdict::Pass);
        }
        let detail = expr::diagnosis(pred, ctx, g.explain.as_ref()).unwrap_or_default();
        let message = g.message.clone().unwrap_or_default();
        return Ok(Verdict::Fail(if detail.is_empty() { message } else { format!("{message} {detail}") }));
    }
    Ok(Verdict::Elsewhere)
}
