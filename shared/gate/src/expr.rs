//! Stepgate's expressions (§1.6): JSONLogic (json-logic-js 2.0's operators)
//! and Stepgate's own (`results`, `object`, `length`, `unique`, `subset`,
//! `difference`, `keys`, `lower`, `get`, `join`, `flatten`, `host`,
//! `match_all`, `assign`, `sort_by`, `time_add`, `time_diff`, `literal`),
//! evaluated over a JSON context.

use serde_json::{json, Map, Value};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ExprError(pub String);

/// JavaScript truthiness, as JSONLogic has it (an empty array is false).
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0 && !f.is_nan()),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(_) => true,
    }
}

/// A predicate passes only on exactly `true`.
pub fn passes(rule: &Value, data: &Value) -> Result<bool, ExprError> {
    Ok(eval(rule, data)? == Value::Bool(true))
}

/// The operator of a rule (a one-key object whose key is an operator).
fn operator(rule: &Value) -> Option<(&str, &Value)> {
    match rule {
        Value::Object(m) if m.len() == 1 => m.iter().next().map(|(k, v)| (k.as_str(), v)),
        _ => None,
    }
}

fn args(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    }
}

fn num(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse().ok(),
        Value::Bool(b) => Some(f64::from(u8::from(*b))),
        Value::Null => Some(0.0),
        _ => None,
    }
}

fn number(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9.0e15 {
        json!(f as i64)
    } else {
        json!(f)
    }
}

/// `a.b.0.c` looked up in `data` (numeric segments index arrays).
pub fn get_path(data: &Value, path: &str) -> Option<Value> {
    if path.is_empty() {
        return Some(data.clone());
    }
    let mut cur = data;
    for seg in path.split('.') {
        cur = match cur {
            Value::Object(m) => m.get(seg)?,
            Value::Array(a) => a.get(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur.clone())
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        Value::Number(n) => number(n.as_f64().unwrap_or(0.0)).to_string(),
        Value::Array(a) => a.iter().map(joined).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// A value as JavaScript's `Array.prototype.join` writes an element: null as nothing.
fn joined(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        other => text(other),
    }
}

/// JavaScript's `==`, as far as JSON values go.
fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null, Value::Null) => true,
        (Value::Null, _) | (_, Value::Null) => false,
        (Value::String(x), Value::String(y)) => x == y,
        (Value::Array(_) | Value::Object(_), _) | (_, Value::Array(_) | Value::Object(_)) => a == b || text(a) == text(b) && !(a.is_object() || b.is_object()),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        },
    }
}

fn strict_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => num(a)?.partial_cmp(&num(b)?),
    }
}

/// Evaluates `rule` over `data`: a one-key object with an operator is
/// applied, arrays and other objects are walked, scalars are themselves.
pub fn eval(rule: &Value, data: &Value) -> Result<Value, ExprError> {
    match rule {
        Value::Array(items) => items.iter().map(|r| eval(r, data)).collect::<Result<Vec<_>, _>>().map(Value::Array),
        Value::Object(m) if m.is_empty() => Ok(rule.clone()),
        Value::Object(_) => match operator(rule) {
            Some((op, a)) if is_operator(op) => apply(op, a, data),
            _ => Err(ExprError(format!("an expression object has exactly one key, an operator; {} is not one", rule))),
        },
        other => Ok(other.clone()),
    }
}

const OPERATORS: &[&str] = &[
    "var", "missing", "missing_some", "if", "?:", "==", "===", "!=", "!==", "!", "!!", "or", "and", ">", ">=", "<", "<=", "max", "min", "+", "-", "*", "/", "%", "map", "filter", "reduce", "all", "none", "some", "merge", "in", "cat", "substr",
    "log", "literal", "results", "object", "length", "unique", "subset", "difference", "keys", "lower", "get", "join", "flatten", "host", "match_all", "assign", "sort_by", "time_add", "time_diff",
];

pub fn is_operator(op: &str) -> bool {
    OPERATORS.contains(&op)
}

fn apply(op: &str, raw: &Value, data: &Value) -> Result<Value, ExprError> {
    let list = args(raw);
    // Operators that decide what of their arguments to evaluate.
    match op {
        "literal" => return Ok(raw.clone()),
        "if" | "?:" => {
            let mut i = 0;
            while i + 1 < list.len() {
                if truthy(&eval(&list[i], data)?) {
                    return eval(&list[i + 1], data);
                }
                i += 2;
            }
            return if i < list.len() { eval(&list[i], data) } else { Ok(Value::Null) };
        }
        "or" => {
            let mut last = Value::Null;
            for a in &list {
                last = eval(a, data)?;
                if truthy(&last) {
                    return Ok(last);
                }
            }
            return Ok(last);
        }
        "and" => {
            let mut last = Value::Null;
            for a in &list {
                last = eval(a, data)?;
                if !truthy(&last) {
                    return Ok(last);
                }
            }
            return Ok(last);
        }
        "map" | "filter" | "all" | "none" | "some" => {
            let items = match list.first().map(|a| eval(a, data)).transpose()? {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            let scope = list.get(1).cloned().unwrap_or(Value::Null);
            return Ok(match op {
                "map" => Value::Array(items.iter().map(|i| eval(&scope, i)).collect::<Result<_, _>>()?),
                "filter" => Value::Array(items.into_iter().filter_map(|i| eval(&scope, &i).map(|r| truthy(&r).then_some(i)).transpose()).collect::<Result<_, _>>()?),
                "all" => Value::Bool(!items.is_empty() && items.iter().map(|i| eval(&scope, i).map(|r| truthy(&r))).collect::<Result<Vec<_>, _>>()?.into_iter().all(|b| b)),
                "none" => Value::Bool(!items.iter().map(|i| eval(&scope, i).map(|r| truthy(&r))).collect::<Result<Vec<_>, _>>()?.into_iter().any(|b| b)),
                _ => Value::Bool(items.iter().map(|i| eval(&scope, i).map(|r| truthy(&r))).collect::<Result<Vec<_>, _>>()?.into_iter().any(|b| b)),
            });
        }
        "reduce" => {
            let items = match list.first().map(|a| eval(a, data)).transpose()? {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            let scope = list.get(1).cloned().unwrap_or(Value::Null);
            let mut acc = list.get(2).map(|a| eval(a, data)).transpose()?.unwrap_or(Value::Null);
            for i in items {
                acc = eval(&scope, &json!({"current": i, "accumulator": acc}))?;
            }
            return Ok(acc);
        }
        _ => {}
    }
    let v: Vec<Value> = list.iter().map(|a| eval(a, data)).collect::<Result<_, _>>()?;
    let arg = |i: usize| v.get(i).cloned().unwrap_or(Value::Null);
    let arr = |i: usize| match v.get(i) {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    Ok(match op {
        "var" => {
            let path = match arg(0) {
                Value::Null => String::new(),
                Value::String(s) => s,
                other => text(&other),
            };
            get_path(data, &path).filter(|x| !x.is_null()).unwrap_or_else(|| arg(1))
        }
        "missing" => {
            let names: Vec<Value> = if let Some(Value::Array(a)) = v.first() { a.clone() } else { v.clone() };
            Value::Array(names.into_iter().filter(|n| get_path(data, &text(n)).is_none_or(|x| x.is_null() || x == "")).collect())
        }
        "missing_some" => {
            let need = num(&arg(0)).unwrap_or(0.0) as usize;
            let names = arr(1);
            let missing: Vec<Value> = names.iter().filter(|n| get_path(data, &text(n)).is_none_or(|x| x.is_null() || x == "")).cloned().collect();
            if names.len() - missing.len() >= need {
                json!([])
            } else {
                Value::Array(missing)
            }
        }
        "==" => Value::Bool(loose_eq(&arg(0), &arg(1))),
        "!=" => Value::Bool(!loose_eq(&arg(0), &arg(1))),
        "===" => Value::Bool(strict_eq(&arg(0), &arg(1))),
        "!==" => Value::Bool(!strict_eq(&arg(0), &arg(1))),
        "!" => Value::Bool(!truthy(&arg(0))),
        "!!" => Value::Bool(truthy(&arg(0))),
        ">" | ">=" | "<" | "<=" => {
            let ok = |a: &Value, b: &Value| {
                compare(a, b).is_some_and(|o| match op {
                    ">" => o.is_gt(),
                    ">=" => o.is_ge(),
                    "<" => o.is_lt(),
                    _ => o.is_le(),
                })
            };
            // `between`: a < b < c.
            Value::Bool(ok(&arg(0), &arg(1)) && (v.len() < 3 || ok(&arg(1), &arg(2))))
        }
        "max" | "min" => {
            let ns: Option<Vec<f64>> = v.iter().map(num).collect();
            match ns.filter(|n| !n.is_empty()) {
                Some(n) => number(if op == "max" { n.into_iter().fold(f64::MIN, f64::max) } else { n.into_iter().fold(f64::MAX, f64::min) }),
                None => Value::Null,
            }
        }
        "+" => number(v.iter().map(|x| num(x).unwrap_or(f64::NAN)).sum()),
        "*" => number(v.iter().map(|x| num(x).unwrap_or(f64::NAN)).product()),
        "-" => match v.len() {
            1 => number(-num(&arg(0)).unwrap_or(f64::NAN)),
            _ => number(num(&arg(0)).unwrap_or(f64::NAN) - num(&arg(1)).unwrap_or(f64::NAN)),
        },
        "/" => number(num(&arg(0)).unwrap_or(f64::NAN) / num(&arg(1)).unwrap_or(f64::NAN)),
        "%" => number(num(&arg(0)).unwrap_or(f64::NAN) % num(&arg(1)).unwrap_or(f64::NAN)),
        "merge" => Value::Array(v.iter().flat_map(|x| if let Value::Array(a) = x { a.clone() } else { vec![x.clone()] }).collect()),
        "in" => match arg(1) {
            Value::String(s) => Value::Bool(s.contains(&text(&arg(0)))),
            Value::Array(a) => Value::Bool(a.iter().any(|x| strict_eq(x, &arg(0)))),
            _ => Value::Bool(false),
        },
        "cat" => Value::String(v.iter().map(joined).collect()),
        "substr" => {
            let s: Vec<char> = text(&arg(0)).chars().collect();
            let n = s.len() as i64;
            let start = num(&arg(1)).unwrap_or(0.0) as i64;
            let start = if start < 0 { (n + start).max(0) } else { start.min(n) } as usize;
            let end = match v.get(2).and_then(num) {
                Some(l) if l < 0.0 => (n + l as i64).max(start as i64) as usize,
                Some(l) => (start + l as usize).min(s.len()),
                None => s.len(),
            };
            Value::String(s[start..end.max(start)].iter().collect())
        }
        "log" => arg(0),
        "results" => results(data, &text(&arg(0)), v.get(1).map(text).as_deref()),
        // `object: [[k, v], …]` lists its pairs as its arguments; a single
        // expression gives them. A pair whose key is not a string makes null.
        "object" => {
            let pairs = match (raw.is_array(), v.first()) {
                (false, Some(Value::Array(p))) => p.clone(),
                _ => v.clone(),
            };
            let mut out = Map::new();
            for p in &pairs {
                match p {
                    Value::Array(kv) if kv.len() == 2 && kv[0].is_string() => _ = out.insert(text(&kv[0]), kv[1].clone()),
                    _ => return Ok(Value::Null),
                }
            }
            Value::Object(out)
        }
        "length" => match arg(0) {
            Value::Array(a) => json!(a.len()),
            Value::String(s) => json!(s.chars().count()),
            _ => Value::Null,
        },
        "unique" => {
            let mut out: Vec<Value> = Vec::new();
            for x in arr(0) {
                if !out.iter().any(|o| strict_eq(o, &x)) {
                    out.push(x);
                }
            }
            Value::Array(out)
        }
        "subset" => {
            let b = arr(1);
            Value::Bool(arr(0).iter().all(|x| b.iter().any(|y| strict_eq(x, y))))
        }
        "difference" => {
            let b = arr(1);
            Value::Array(arr(0).into_iter().filter(|x| !b.iter().any(|y| strict_eq(x, y))).collect())
        }
        "keys" => match arg(0) {
            Value::Object(m) => Value::Array(m.keys().map(|k| json!(k)).collect()),
            _ => json!([]),
        },
        "lower" => match arg(0) {
            Value::String(s) => Value::String(s.to_lowercase()),
            other => other,
        },
        "get" => match (arg(0), arg(1)) {
            (Value::Object(m), k) => m.get(&text(&k)).cloned().unwrap_or(Value::Null),
            (Value::Array(a), k) => num(&k).and_then(|i| a.get(i as usize).cloned()).unwrap_or(Value::Null),
            _ => Value::Null,
        },
        "join" => {
            let (lp, rp) = (text(&arg(2)), text(&arg(3)));
            let right = arr(1);
            Value::Array(
                arr(0)
                    .into_iter()
                    .map(|l| {
                        let key = get_path(&l, &lp);
                        let r = right.iter().find(|r| key.is_some() && get_path(r, &rp) == key).cloned().unwrap_or(Value::Null);
                        json!({"left": l, "right": r})
                    })
                    .collect(),
            )
        }
        "flatten" => Value::Array(arr(0).into_iter().flat_map(|x| if let Value::Array(a) = x { a } else { vec![x] }).collect()),
        "host" => host(&text(&arg(0))).map_or(Value::Null, Value::String),
        "match_all" => {
            let re = crate::pattern::compile(&text(&arg(1))).map_err(|e| ExprError(format!("match_all: the pattern does not compile: {e}")))?;
            Value::Array(re.all(&text(&arg(0))).into_iter().map(Value::String).collect())
        }
        "assign" => {
            let mut out = Map::new();
            for x in &v {
                match x {
                    Value::Object(m) => out.extend(m.clone()),
                    _ => return Ok(Value::Null),
                }
            }
            Value::Object(out)
        }
        "sort_by" => {
            let path = text(&arg(1));
            let desc = text(&arg(2)) == "desc";
            let mut items = arr(0);
            items.sort_by(|a, b| {
                let (x, y) = (get_path(a, &path).filter(|x| !x.is_null()), get_path(b, &path).filter(|x| !x.is_null()));
                match (x, y) {
                    (None, None) => std::cmp::Ordering::Equal,
                    (None, Some(_)) => std::cmp::Ordering::Greater,
                    (Some(_), None) => std::cmp::Ordering::Less,
                    (Some(x), Some(y)) => {
                        let o = compare(&x, &y).unwrap_or(std::cmp::Ordering::Equal);
                        if desc {
                            o.reverse()
                        } else {
                            o
                        }
                    }
                }
            });
            Value::Array(items)
        }
        "time_add" => match (time::parse(&text(&arg(0))), num(&arg(1))) {
            (Some(t), Some(s)) => Value::String(time::format(t + s as i64)),
            _ => Value::Null,
        },
        "time_diff" => match (time::parse(&text(&arg(0))), time::parse(&text(&arg(1)))) {
            (Some(a), Some(b)) => json!(a - b),
            _ => Value::Null,
        },
        other => return Err(ExprError(format!("unknown operator {other}"))),
    })
}

/// A mechanical step's template (§1.5): a one-key object whose key is an
/// operator is evaluated, `{literal: x}` is x, other objects and arrays are
/// walked, scalars are themselves.
pub fn template(t: &Value, data: &Value) -> Result<Value, ExprError> {
    match t {
        Value::Object(m) => match operator(t) {
            Some((op, _)) if is_operator(op) => eval(t, data),
            _ => m.iter().map(|(k, v)| Ok((k.clone(), template(v, data)?))).collect::<Result<Map<_, _>, _>>().map(Value::Object),
        },
        Value::Array(items) => items.iter().map(|x| template(x, data)).collect::<Result<Vec<_>, _>>().map(Value::Array),
        other => Ok(other.clone()),
    }
}

/// Checks a rule before it runs: every object in it is one known operator
/// (or `{}`); what `literal` holds is data.
pub fn check(rule: &Value) -> Result<(), String> {
    match rule {
        Value::Array(items) => items.iter().try_for_each(check),
        Value::Object(m) if m.is_empty() => Ok(()),
        Value::Object(m) => match operator(rule) {
            Some(("literal", _)) => Ok(()),
            Some((op, a)) if is_operator(op) => check(a),
            _ => {
                let keys: Vec<&str> = m.keys().map(String::as_str).collect();
                Err(format!("an expression object is one operator; {{{}}} is not one", keys.join(", ")))
            }
        },
        _ => Ok(()),
    }
}

/// Most a diagnosis says.
const DIAGNOSIS_CHARS: usize = 2000;

/// Compact JSON, a string as itself.
pub fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// What a failed predicate says after its message (§1.7): its `explain`
/// evaluated, or else what the predicate shows by itself — a `subset`'s
/// missing items, the offending `left`s of a `none` over a `join`, an
/// equality's expected and got, the failing parts of an `and` joined by
/// ` | ` — at most 2,000 characters; empty when there is nothing to add.
pub fn diagnosis(predicate: &Value, data: &Value, explain: Option<&Value>) -> Result<String, ExprError> {
    let detail = match explain {
        Some(e) => compact(&eval(e, data)?),
        None => auto_detail(predicate, data)?,
    };
    Ok(detail.chars().take(DIAGNOSIS_CHARS).collect())
}

fn auto_detail(rule: &Value, data: &Value) -> Result<String, ExprError> {
    let Some((op, raw)) = operator(rule) else { return Ok(String::new()) };
    let list = args(raw);
    Ok(match op {
        "subset" if list.len() == 2 => {
            let missing = apply("difference", raw, data)?;
            if missing.as_array().is_some_and(|a| !a.is_empty()) { missing.to_string() } else { String::new() }
        }
        "none" if list.len() == 2 && operator(&list[0]).is_some_and(|(o, _)| o == "join") => {
            let rows = match eval(&list[0], data)? {
                Value::Array(a) => a,
                _ => Vec::new(),
            };
            let mut bad = Vec::new();
            for r in rows {
                if truthy(&eval(&list[1], &r)?) {
                    bad.push(r.get("left").cloned().unwrap_or(Value::Null));
                }
            }
            if bad.is_empty() { String::new() } else { Value::Array(bad).to_string() }
        }
        "==" | "===" if list.len() == 2 => format!("expected {}, got {}", eval(&list[1], data)?, eval(&list[0], data)?),
        "and" => {
            let mut parts = Vec::new();
            for part in &list {
                if !passes(part, data)? {
                    let d = auto_detail(part, data)?;
                    if !d.is_empty() {
                        parts.push(d);
                    }
                }
            }
            parts.join(" | ")
        }
        _ => String::new(),
    })
}

/// `results [op, path?]`: the flattened `result.path` of every call to
/// `op` that did not fail.
fn results(data: &Value, op: &str, path: Option<&str>) -> Value {
    let calls = data.get("calls").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut out = Vec::new();
    for c in calls.iter().filter(|c| c.get("tool").and_then(Value::as_str) == Some(op) && c.get("is_error") != Some(&Value::Bool(true))) {
        let r = c.get("result").cloned().unwrap_or(Value::Null);
        let got = match path {
            Some(p) if !p.is_empty() => get_path(&r, p).unwrap_or(Value::Null),
            _ => r,
        };
        match got {
            Value::Array(a) => out.extend(a),
            Value::Null => {}
            other => out.push(other),
        }
    }
    Value::Array(out)
}

/// The lowercase `host[:port]` of a URL.
fn host(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    (!authority.is_empty()).then(|| authority.to_lowercase())
}

/// RFC 3339 times in UTC, to and from Unix seconds.
mod time {
    use steppe_language::calendar::{civil_from_days, days_from_civil, days_in_month};

    pub fn parse(s: &str) -> Option<i64> {
        let b = s.as_bytes();
        if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') || b[13] != b':' || b[16] != b':' {
            return None;
        }
        let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
        let (y, mo, d, h, mi, se) = (n(0..4)?, n(5..7)?, n(8..10)?, n(11..13)?, n(14..16)?, n(17..19)?);
        if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || se > 60 {
            return None;
        }
        let mut rest = &s[19..];
        if let Some(frac) = rest.strip_prefix('.') {
            let digits = frac.chars().take_while(char::is_ascii_digit).count();
            if digits == 0 {
                return None;
            }
            rest = &frac[digits..];
        }
        let offset = match rest {
            "Z" | "z" => 0,
            _ => {
                let sign = match rest.chars().next()? {
                    '+' => 1,
                    '-' => -1,
                    _ => return None,
                };
                let (oh, om) = rest.get(1..)?.split_once(':')?;
                sign * (oh.parse::<i64>().ok()? * 3600 + om.parse::<i64>().ok()? * 60)
            }
        };
        Some(days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se - offset)
    }

    pub fn format(t: i64) -> String {
        let (days, secs) = (t.div_euclid(86400), t.rem_euclid(86400));
        let (y, m, d) = civil_from_days(days);
        format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(rule: Value, data: Value) -> Value {
        eval(&rule, &data).expect("evaluates")
    }

    #[test]
    fn jsonlogic_operators() {
        let data = json!({"inputs": {"shelf": "A", "items": [{"id": "K-1", "n": 4}, {"id": "K-2", "n": 0}]}});
        assert_eq!(ev(json!({"var": "inputs.shelf"}), data.clone()), json!("A"));
        assert_eq!(ev(json!({"var": ["inputs.nothing", 7]}), data.clone()), json!(7));
        assert_eq!(ev(json!({"var": "inputs.items.1.id"}), data.clone()), json!("K-2"));
        assert_eq!(ev(json!({"map": [{"var": "inputs.items"}, {"var": "id"}]}), data.clone()), json!(["K-1", "K-2"]));
        assert_eq!(ev(json!({"filter": [{"var": "inputs.items"}, {">": [{"var": "n"}, 0]}]}), data.clone()), json!([{"id": "K-1", "n": 4}]));
        assert_eq!(ev(json!({"reduce": [{"var": "inputs.items"}, {"+": [{"var": "current.n"}, {"var": "accumulator"}]}, 0]}), data.clone()), json!(4));
        assert_eq!(ev(json!({"if": [false, 1, {"==": [1, "1"]}, "loose", "no"]}), json!({})), json!("loose"));
        assert_eq!(ev(json!({"===": [1, "1"]}), json!({})), json!(false));
        assert_eq!(ev(json!({"and": [true, [], 3]}), json!({})), json!([]), "an empty array is false");
        assert_eq!(ev(json!({"or": [0, "", "x"]}), json!({})), json!("x"));
        assert_eq!(ev(json!({"all": [[], true]}), json!({})), json!(false));
        assert_eq!(ev(json!({"<": [1, 2, 3]}), json!({})), json!(true));
        assert_eq!(ev(json!({"cat": ["a", 1, null]}), json!({})), json!("a1"), "json-logic's cat joins, and a join writes null as nothing");
        assert_eq!(ev(json!({"cat": ["SKU: ", {"var": "sku"}, " ", [1, null, 2]]}), json!({"sku": null})), json!("SKU:  1,,2"));
        assert_eq!(ev(json!({"in": ["K", "OK-1"]}), json!({})), json!(true));
        assert_eq!(ev(json!({"/": [7, 2]}), json!({})), json!(3.5));
        assert_eq!(ev(json!({"substr": ["steppe", -3]}), json!({})), json!("ppe"));
        assert_eq!(ev(json!({"literal": {"var": "x"}}), json!({})), json!({"var": "x"}));
        assert!(eval(&json!({"nope": 1}), &json!({})).is_err(), "an unknown operator is an error");
        assert!(passes(&json!({"==": [1, 1]}), &json!({})).unwrap() && !passes(&json!({"+": [1, 0]}), &json!({})).unwrap(), "only true passes");
    }

    #[test]
    fn stepgates_own_operators() {
        let data = json!({"calls": [
            {"tool": "list", "arguments": {}, "result": {"items": [1, 2]}, "is_error": false},
            {"tool": "list", "arguments": {}, "result": {"items": [3]}, "is_error": false},
            {"tool": "list", "arguments": {}, "result": "HTTP 500", "is_error": true}
        ]});
        assert_eq!(ev(json!({"results": ["list", "items"]}), data), json!([1, 2, 3]));
        assert_eq!(ev(json!({"object": [["a", 1], ["b", {"+": [1, 1]}]]}), json!({})), json!({"a": 1, "b": 2}));
        assert_eq!(ev(json!({"object": {"var": "pairs"}}), json!({"pairs": [["a", 1]]})), json!({"a": 1}));
        assert_eq!(ev(json!({"object": [[5, 1]]}), json!({})), Value::Null, "a key that is not a string");
        assert_eq!(ev(json!({"assign": [{"literal": {"a": 1}}, "x"]}), json!({})), Value::Null, "an argument that is not an object");
        assert_eq!(ev(json!({"length": "héllo"}), json!({})), json!(5));
        assert_eq!(ev(json!({"unique": [[1, 2, 1, "1"]]}), json!({})), json!([1, 2, "1"]));
        assert_eq!(ev(json!({"subset": [[1, 2], [2, 1, 3]]}), json!({})), json!(true));
        assert_eq!(ev(json!({"difference": [[1, 2, 3], [2]]}), json!({})), json!([1, 3]));
        assert_eq!(ev(json!({"host": "https://User@API.Example.com:8443/v1?x"}), json!({})), json!("api.example.com:8443"));
        assert_eq!(ev(json!({"match_all": ["K-1 and K-22, k-3", "(K-[0-9]+)"]}), json!({})), json!(["K-1", "K-22"]));
        assert_eq!(ev(json!({"assign": [{"literal": {"a": 1, "b": 1}}, {"object": [["b", 2]]}]}), json!({})), json!({"a": 1, "b": 2}));
        assert_eq!(ev(json!({"join": [{"literal": [{"id": 1}, {"id": 2}]}, {"literal": [{"k": 2, "v": "x"}]}, "id", "k"]}), json!({})), json!([{"left": {"id": 1}, "right": null}, {"left": {"id": 2}, "right": {"k": 2, "v": "x"}}]));
        assert!(eval(&json!({"a": 1, "b": 2}), &json!({})).is_err(), "in a rule, an object is an operator");
        assert_eq!(check(&json!({"and": [{"var": "x"}, {"literal": {"a": 1, "b": 2}}]})), Ok(()));
        assert_eq!(check(&json!({"and": [{"vra": "x"}]})), Err("an expression object is one operator; {vra} is not one".to_string()));
        assert_eq!(template(&json!({"rows": {"map": [{"var": "xs"}, {"+": [{"var": ""}, 1]}]}, "fixed": {"literal": {"var": "x"}}}), &json!({"xs": [1, 2]})).unwrap(), json!({"rows": [2, 3], "fixed": {"var": "x"}}));
        let items = json!({"literal": [{"id": "a", "s": 2}, {"id": "b"}, {"id": "c", "s": 1}]});
        assert_eq!(ev(json!({"map": [{"sort_by": [items.clone(), "s", "asc"]}, {"var": "id"}]}), json!({})), json!(["c", "a", "b"]), "nulls last");
        assert_eq!(ev(json!({"map": [{"sort_by": [items, "s", "desc"]}, {"var": "id"}]}), json!({})), json!(["a", "c", "b"]), "nulls last either way");
    }

    #[test]
    fn failed_predicates_say_what_failed() {
        let sources = json!({"inputs": {"sources": ["S-01", "S-02"]}, "output": {"cited": ["S-01", "S-07", "S-09"], "count": 3}});
        let subset = json!({"subset": [{"var": "output.cited"}, {"var": "inputs.sources"}]});
        assert_eq!(diagnosis(&subset, &sources, None).unwrap(), r#"["S-07","S-09"]"#);
        let equal = json!({"==": [{"var": "output.count"}, {"length": {"var": "inputs.sources"}}]});
        assert_eq!(diagnosis(&equal, &sources, None).unwrap(), "expected 2, got 3");
        let data = json!({"inputs": {"sources": ["S-01", "S-02"]}, "output": {"cited": ["S-01", "S-09"], "count": 1}});
        let both = json!({"and": [subset, {"==": [{"var": "output.count"}, {"length": {"var": "output.cited"}}]}]});
        assert_eq!(diagnosis(&both, &data, None).unwrap(), r#"["S-09"] | expected 2, got 1"#);
        let explain = json!({"cat": ["unknown", " ", {"length": {"difference": [{"var": "output.cited"}, {"var": "inputs.sources"}]}}]});
        assert_eq!(diagnosis(&both, &data, Some(&explain)).unwrap(), "unknown 1");
        let stock = json!({"inputs": {"catalogue": [{"id": "K-1", "stock": 4}, {"id": "K-2", "stock": 0}]}, "output": {"rows": [{"id": "K-1", "stock": 4}, {"id": "K-2", "stock": 3}]}});
        let none = json!({"none": [{"join": [{"var": "output.rows"}, {"var": "inputs.catalogue"}, "id", "id"]}, {"!=": [{"var": "left.stock"}, {"var": "right.stock"}]}]});
        assert!(!passes(&none, &stock).unwrap());
        assert_eq!(diagnosis(&none, &stock, None).unwrap(), r#"[{"id":"K-2","stock":3}]"#);
        assert_eq!(diagnosis(&json!({"!": true}), &stock, None).unwrap(), "", "nothing to add");
    }

    #[test]
    fn time_operators_cross_months_years_and_leap_days() {
        let t = |r: Value| ev(r, json!({}));
        assert_eq!(t(json!({"time_add": ["2026-01-31T23:59:59Z", 1]})), json!("2026-02-01T00:00:00Z"));
        assert_eq!(t(json!({"time_add": ["2026-12-31T23:59:59Z", 1]})), json!("2027-01-01T00:00:00Z"));
        assert_eq!(t(json!({"time_add": ["2028-02-28T12:00:00Z", 86400]})), json!("2028-02-29T12:00:00Z"));
        assert_eq!(t(json!({"time_add": ["2026-02-28T12:00:00Z", 86400]})), json!("2026-03-01T12:00:00Z"));
        assert_eq!(t(json!({"time_diff": ["2028-02-29T12:00:00Z", "2028-02-28T12:00:00Z"]})), json!(86400));
        assert_eq!(t(json!({"time_diff": ["2026-02-01T00:00:00+01:00", "2026-01-31T23:00:00Z"]})), json!(0));
        assert_eq!(t(json!({"time_add": ["2026-02-29T00:00:00Z", 10]})), Value::Null, "no such day");
        assert_eq!(t(json!({"time_diff": ["yesterday", "2026-02-28T00:00:00Z"]})), Value::Null);
    }
}
