//! The work budget of one evaluation: what the values it makes and copies
//! hold, and the nodes it evaluates.

use std::cell::Cell;

use serde_json::Value;

use super::error::EvalError;

fn err<T>(m: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError(m.into()))
}

/// How much work one evaluation may do, in bytes: every node evaluated
/// costs [`STEP_COST`], and every value made or copied its whole size (a
/// `Value` per array or map element at any depth, a byte per byte of
/// string or key). Copies and results whose size is known are paid for
/// before they are made, so what an evaluation holds stays near this. An
/// expression runs in the coordinator; it may not hold it up or fill its
/// memory.
pub const BUDGET: u64 = 64 << 20;

/// What evaluating one node costs (about 8 million nodes in all).
const STEP_COST: u64 = 8;

/// What one array element or map entry holds beside its contents.
const ELEMENT: u64 = std::mem::size_of::<Value>() as u64;

/// How deeply a value an expression makes may nest (dropping, copying or
/// printing one recurses over it).
const MAX_VALUE_DEPTH: usize = 128;

/// What one evaluation has spent of [`BUDGET`].
#[derive(Debug, Default)]
pub struct Budget(Cell<u64>);

impl Budget {
    /// Adds a node's cost and the whole size of the value it made.
    pub(super) fn charge(&self, v: &Value) -> Result<(), EvalError> {
        let weight = STEP_COST + weigh(v, BUDGET.saturating_sub(self.0.get()))?;
        self.pay(weight)
    }

    fn pay(&self, weight: u64) -> Result<(), EvalError> {
        let spent = self.0.get().saturating_add(weight);
        self.0.set(spent);
        self.within(0)
    }

    /// Whether `weight` more would stay within the budget; nothing is added
    /// (what is made with it is charged when it is returned).
    pub(super) fn afford(&self, weight: u64) -> Result<(), EvalError> {
        self.within(weight)
    }

    fn within(&self, more: u64) -> Result<(), EvalError> {
        if self.0.get().saturating_add(more) > BUDGET {
            return err(format!("the expression does too much work (over {} MiB of values made and steps); simplify it", BUDGET >> 20));
        }
        Ok(())
    }

    /// Affords a copy of `v` before it is made.
    pub(super) fn afford_copy(&self, v: &Value) -> Result<(), EvalError> {
        self.afford(weigh(v, BUDGET.saturating_sub(self.0.get()))?)
    }
}

/// The size of `v` as [`BUDGET`] counts it, walked without recursion and
/// only until it passes `limit` (then something over `limit`).
fn weigh(v: &Value, limit: u64) -> Result<u64, EvalError> {
    let mut weight = 0u64;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 0)];
    while let Some((x, depth)) = stack.pop() {
        if depth > MAX_VALUE_DEPTH {
            return err(format!("the expression makes a value nested more than {MAX_VALUE_DEPTH} deep"));
        }
        // Scalars are in their element's size; only what holds more is walked further.
        match x {
            Value::Array(a) => {
                weight += elements(a.len());
                for c in a {
                    if holds_more(c, &mut weight) {
                        stack.push((c, depth + 1));
                    }
                }
            }
            Value::Object(m) => {
                weight += elements(m.len()) + m.keys().map(|k| k.len() as u64).sum::<u64>();
                for c in m.values() {
                    if holds_more(c, &mut weight) {
                        stack.push((c, depth + 1));
                    }
                }
            }
            Value::String(s) => weight += s.len() as u64,
            _ => {}
        }
        if weight > limit {
            return Ok(weight);
        }
    }
    Ok(weight)
}

/// Whether an element holds more than its size (and a string's bytes added).
fn holds_more(c: &Value, weight: &mut u64) -> bool {
    match c {
        Value::String(s) => *weight += s.len() as u64,
        Value::Array(_) | Value::Object(_) => return true,
        _ => {}
    }
    false
}

/// What a value of `n` elements holds, for paying before it is made.
pub(super) fn elements(n: usize) -> u64 {
    ELEMENT.saturating_mul(n as u64)
}

