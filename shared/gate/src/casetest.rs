//! `steppe gate --test` (§1.15): a stepfile's recorded cases replayed
//! offline — mechanical steps recomputed from their recorded calls, every
//! output judged again by the step's checks and gates (verifiers and
//! approvals named and skipped), the failing gates compared with the record.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::check::{self, Stage, Verdict};
use crate::error::GateError;
use crate::expr;
use crate::stepfile::{Loaded, Step};

/// The strict shape of a cases file.
fn cases_schema() -> Value {
    let call = json!({"type": "object", "additionalProperties": false, "required": ["tool", "result"],
        "properties": {"tool": {"type": "string"}, "arguments": {"type": "object"}, "result": true, "is_error": {"type": "boolean"}}});
    let expect = json!({"oneOf": [{"const": "pass"}, {"type": "object", "additionalProperties": false, "required": ["fail"],
        "properties": {"fail": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}]});
    let step = json!({"type": "object", "additionalProperties": false, "required": ["step", "output", "expect"],
        "properties": {"step": {"type": "string"}, "calls": {"type": "array", "items": call}, "output": true, "expect": expect}});
    let case = json!({"type": "object", "additionalProperties": false, "required": ["name", "inputs", "steps"],
        "properties": {"name": {"type": "string", "minLength": 1}, "inputs": {"type": "object"}, "steps": {"type": "array", "minItems": 1, "items": step}}});
    json!({"type": "object", "additionalProperties": false, "required": ["cases"], "properties": {"cases": {"type": "array", "minItems": 1, "items": case}}})
}

fn invalid(problems: Vec<String>) -> GateError {
    GateError::new("CasesInvalid", format!("cases invalid: {}", problems.join("; ")))
}

/// Where a stepfile's cases are by default: `<its id>.cases.yaml` beside it.
pub fn default_cases(stepfile: &Path, id: &str) -> PathBuf {
    stepfile.parent().unwrap_or(Path::new(".")).join(format!("{id}.cases.yaml"))
}

/// Reads and checks a cases file against `loaded`.
pub fn load(path: &Path, loaded: &Loaded) -> Result<Vec<Value>, GateError> {
    let text = std::fs::read_to_string(path).map_err(|e| GateError::new("CasesInvalid", format!("{}: cannot read it: {e}", path.display())))?;
    let doc = crate::load::document(&text).map_err(|e| invalid(vec![format!("does not parse as YAML or JSON: {e}")]))?;
    let problems = crate::schema::problems(&cases_schema(), None, &doc).map_err(|e| invalid(vec![e]))?;
    if !problems.is_empty() {
        return Err(invalid(vec![problems.join("; ")]));
    }
    let mut problems = Vec::new();
    let cases = doc["cases"].as_array().cloned().unwrap_or_default();
    let id = &loaded.stepfile.id;
    for c in &cases {
        let name = c["name"].as_str().unwrap_or_default();
        for s in c["steps"].as_array().into_iter().flatten() {
            let sid = s["step"].as_str().unwrap_or_default();
            let Some(step) = loaded.stepfile.steps.iter().find(|x| x.id == sid) else {
                problems.push(format!("case {name:?}: {sid} is not a step of {id}"));
                continue;
            };
            for g in s["expect"]["fail"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                if g != "produces" && g != "derive" && !step.gates.iter().flatten().any(|x| x.id == g) {
                    problems.push(format!("case {name:?}, step {sid}: {g} is not one of its gates"));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(invalid(problems));
    }
    Ok(cases)
}

/// JSON equality as the cases were recorded: numbers by value (1 is 1.0).
pub fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w))),
        _ => a == b,
    }
}

/// The response a recorded call gave a mechanical step: an accepted error's body without its `HTTP <code>: ` prefix.
fn response_of(call: &Value) -> Value {
    if call["is_error"] == json!(true) {
        if let Some(s) = call["result"].as_str() {
            if let Some(body) = s.strip_prefix("HTTP ").and_then(|r| r.get(5..).filter(|_| r.as_bytes().get(3..5) == Some(b": ".as_slice()))) {
                return crate::reply::parsed(body);
            }
        }
    }
    call["result"].clone()
}

/// Recomputes a mechanical step from its recorded calls: a problem, or none.
fn replay(step: &Step, inputs: &Value, steps: &Value, calls: &[Value], output: &Value) -> Option<String> {
    let d = step.do_.as_ref()?;
    let mut queue = calls.iter();
    let mut responses = Map::new();
    for call in d.calls.iter().flatten() {
        let base = json!({"inputs": inputs, "steps": steps, "responses": responses});
        let items = match &call.each {
            None => None,
            Some(each) => match expr::template(each, &base) {
                Ok(Value::Array(a)) => Some(a),
                Ok(other) => return Some(format!("call {}'s each gives {other}, not an array", call.id)),
                Err(e) => return Some(format!("call {}'s each: {e}", call.id)),
            },
        };
        let mut got = Vec::new();
        for (i, item) in items.clone().unwrap_or_else(|| vec![Value::Null]).into_iter().enumerate() {
            let mut data = base.clone();
            if items.is_some() {
                data["item"] = item;
            }
            let args = match expr::template(call.arguments.as_ref().unwrap_or(&json!({})), &data) {
                Ok(a) => a,
                Err(e) => return Some(format!("call {}'s arguments: {e}", call.id)),
            };
            let n = i + 1;
            let Some(rec) = queue.next().filter(|r| r["tool"].as_str() == Some(call.operation.as_str())) else {
                let seen = calls.get(got.len()).and_then(|r| r["tool"].as_str()).map_or("no more calls".to_string(), str::to_string);
                return Some(format!("call {} would make {} call {n}, but the case recorded {seen}", call.id, call.operation));
            };
            let recorded = rec.get("arguments").cloned().unwrap_or_else(|| json!({}));
            if !same(&args, &recorded) {
                return Some(format!("call {} would send {args} as {} call {n}, but the case recorded {recorded}", call.id, call.operation));
            }
            got.push(response_of(rec));
        }
        responses.insert(call.id.clone(), if items.is_some() { Value::Array(got) } else { got.pop().unwrap_or(Value::Null) });
    }
    let left = queue.count();
    if left > 0 {
        return Some(format!("the case recorded {left} more call(s) than the step makes"));
    }
    let computed = match expr::template(&d.output, &json!({"inputs": inputs, "steps": steps, "responses": responses})) {
        Ok(v) => v,
        Err(e) => return Some(format!("its output: {e}")),
    };
    (!same(&computed, output)).then(|| format!("Stepgate computes output {computed} from these calls, not the case's {output}"))
}

/// One step of one case, judged.
pub struct Report {
    pub case: String,
    pub step: String,
    pub ok: bool,
    /// Verifier and approval gates, not run offline.
    pub skipped: Vec<String>,
    pub problem: Option<String>,
    pub failures: Vec<(String, String)>,
}

impl Report {
    /// Its lines as `--test` prints them.
    pub fn lines(&self) -> Vec<String> {
        let skipped = if self.skipped.is_empty() { String::new() } else { format!(" (verifier and approve gates not run offline: {})", self.skipped.join(", ")) };
        let mut out = vec![format!("{}  {} / {}{skipped}", if self.ok { "ok" } else { "FAIL" }, self.case, self.step)];
        if !self.ok {
            out.extend(self.problem.iter().map(|p| format!("      {p}")));
            out.extend(self.failures.iter().map(|(g, d)| format!("      {g}: {d}")));
        }
        out
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Every case of `cases` against `loaded`, offline.
pub fn run(loaded: &Loaded, cases: &[Value]) -> Result<Vec<Report>, GateError> {
    let defs = loaded.stepfile.defs.as_ref();
    let mut reports = Vec::new();
    for c in cases {
        let name = c["name"].as_str().unwrap_or_default().to_string();
        let inputs = c["inputs"].clone();
        let mut accepted = Map::new();
        for s in c["steps"].as_array().into_iter().flatten() {
            let sid = s["step"].as_str().unwrap_or_default();
            let Some(step) = loaded.stepfile.steps.iter().find(|x| x.id == sid) else { continue };
            let calls: Vec<Value> = s["calls"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|mut call| {
                    call.as_object_mut().map(|m| {
                        m.entry("arguments").or_insert_with(|| json!({}));
                        m.entry("is_error").or_insert(json!(false));
                    });
                    call
                })
                .collect();
            let output = s["output"].clone();
            let steps = Value::Object(accepted.clone());
            let expect_pass = s["expect"] == json!("pass");
            if let Some(problem) = replay(step, &inputs, &steps, &calls, &output) {
                reports.push(Report { case: name.clone(), step: sid.to_string(), ok: false, skipped: Vec::new(), problem: Some(problem), failures: Vec::new() });
                continue;
            }
            let skipped: Vec<String> = step.gates.iter().flatten().filter(|g| g.http.is_some() || g.approve.is_some()).map(|g| g.id.clone()).collect();
            let calls = Value::Array(calls);
            let (fed, failures) = match check::prepare(step, defs, &inputs, &steps, &output, &calls)? {
                Stage::Refused { gate, diagnosis } => (Value::Null, vec![(gate.to_string(), diagnosis)]),
                Stage::Ready { full, lets, .. } => {
                    let ctx = check::context(&inputs, &steps, &full, &calls, &lets);
                    let mut failures = Vec::new();
                    for g in step.gates.iter().flatten() {
                        if let Verdict::Fail(d) = check::verdict(g, defs, &ctx)? {
                            failures.push((g.id.clone(), d));
                        }
                    }
                    (full, failures)
                }
            };
            let expected = sorted(s["expect"]["fail"].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect());
            let actual = sorted(failures.iter().map(|(g, _)| g.clone()).collect());
            let ok = expected == actual;
            let problem = (!ok).then(|| {
                let want = if expected.is_empty() { "every gate to pass".to_string() } else { format!("{} to fail", expected.join(", ")) };
                let got = if actual.is_empty() { "every gate passed".to_string() } else { format!("{} failed", actual.join(", ")) };
                format!("expected {want}, but {got}")
            });
            reports.push(Report { case: name.clone(), step: sid.to_string(), ok, skipped, problem, failures });
            if expect_pass {
                accepted.insert(sid.to_string(), fed);
            }
        }
    }
    Ok(reports)
}

/// A stepfile named on the command line: a path (`.yaml`, `.yml`, `.json`),
/// or a catalog name looked up as `<catalog>/<domain>/<name>/<name>.stepfile.yaml`.
pub fn resolve(target: &str, catalog: &Path) -> Result<PathBuf, GateError> {
    let lower = target.to_ascii_lowercase();
    if [".yaml", ".yml", ".json"].iter().any(|x| lower.ends_with(x)) {
        return Ok(PathBuf::from(target));
    }
    let mut names = Vec::new();
    let mut domains: Vec<PathBuf> = std::fs::read_dir(catalog).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    domains.sort();
    for d in domains {
        let candidate = d.join(target).join(format!("{target}.stepfile.yaml"));
        if candidate.is_file() {
            return Ok(candidate);
        }
        names.extend(std::fs::read_dir(&d).into_iter().flatten().flatten().filter(|e| e.path().is_dir()).map(|e| e.file_name().to_string_lossy().to_string()));
    }
    names.sort();
    let available = if names.is_empty() { format!("none (no catalog at {})", catalog.display()) } else { names.join(", ") };
    Err(GateError::new("UnknownStepfile", format!("no catalog stepfile named {target}; available: {available}")))
}
