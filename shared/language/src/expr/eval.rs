//! Evaluating an expression over JSON values.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};

use super::budget::{elements, Budget};
pub use super::error::EvalError;
use super::parser::Expr;

/// Capabilities a stage grants: environment names it may read, and files of
/// the put's view (out only).
pub struct Env<'a> {
    pub vars: HashMap<&'a str, Value>,
    /// `env(NAME)`: only these names (the type's and resource's `env:`).
    pub env_allowed: Vec<String>,
    /// `env()` reads the host's environment at all: not for a submitted
    /// pipeline, whose stages run on a coordinator that is not its host.
    pub host_env: bool,
    /// `file(PATH)` (out only): reads a file of the put's inputs view.
    pub read_file: Option<&'a dyn Fn(&str) -> Result<String, String>>,
    /// Work done so far (see [`Budget`]).
    pub spent: Budget,
}

type R = Result<Value, EvalError>;

fn err<T>(m: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError(m.into()))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nil",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "map",
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => true,
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

fn int(i: i64) -> Value {
    Value::Number(Number::from(i))
}

fn float(f: f64) -> Value {
    if f.fract() == 0.0 && f.abs() < 9e15 {
        // Keep whole results of float maths printable as integers where they started as such.
        return Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null);
    }
    Number::from_f64(f).map(Value::Number).unwrap_or(Value::Null)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "nil".into(),
        other => other.to_string(),
    }
}

struct Frame {
    pointer: Value,
    index: i64,
    acc: Value,
}

pub fn eval(e: &Expr, env: &Env) -> R {
    let mut scope: Vec<(String, Value)> = Vec::new();
    let mut frames: Vec<Frame> = Vec::new();
    ev(e, env, &mut scope, &mut frames)
}

fn ev(e: &Expr, env: &Env, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>) -> R {
    let v = ev_here(e, env, scope, frames)?;
    env.spent.charge(&v)?;
    Ok(v)
}

fn ev_here(e: &Expr, env: &Env, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>) -> R {
    use Expr::*;
    Ok(match e {
        Nil => Value::Null,
        Bool(b) => Value::Bool(*b),
        Int(i) => int(*i),
        Float(f) => float(*f),
        Str(s) => Value::String(s.clone()),
        Ident(name, _) => {
            if let Some((_, v)) = scope.iter().rev().find(|(n, _)| n == name) {
                env.spent.afford_copy(v)?;
                v.clone()
            } else if let Some(v) = env.vars.get(name.as_str()) {
                env.spent.afford_copy(v)?;
                v.clone()
            } else {
                return err(format!("unknown name {name}"));
            }
        }
        Pointer(p) => {
            let Some(f) = frames.last() else { return err(format!("{p} used outside a predicate")) };
            match p.as_str() {
                "#index" => int(f.index),
                "#acc" => {
                    env.spent.afford_copy(&f.acc)?;
                    f.acc.clone()
                }
                _ => {
                    env.spent.afford_copy(&f.pointer)?;
                    f.pointer.clone()
                }
            }
        }
        Array(items) => Value::Array(items.iter().map(|i| ev(i, env, scope, frames)).collect::<Result<_, _>>()?),
        Map(entries) => {
            let mut m = serde_json::Map::new();
            for (k, v) in entries {
                m.insert(k.clone(), ev(v, env, scope, frames)?);
            }
            Value::Object(m)
        }
        Member { target, name, optional } => {
            let t = ev(target, env, scope, frames)?;
            match t {
                Value::Object(mut m) => m.remove(name).unwrap_or(Value::Null),
                Value::Null if *optional => Value::Null,
                Value::Null => return err(format!("cannot fetch {name} from nil (use ?. for optional fields)")),
                other => return err(format!("cannot fetch {name} from {}", kind(&other))),
            }
        }
        Index { target, index, optional } => {
            let t = ev(target, env, scope, frames)?;
            let i = ev(index, env, scope, frames)?;
            match (&t, &i) {
                (Value::Object(m), k) => m.get(&text(k)).cloned().unwrap_or(Value::Null),
                (Value::Array(a), Value::Number(n)) => {
                    let n = n.as_i64().unwrap_or(0);
                    let idx = if n < 0 { a.len() as i64 + n } else { n };
                    a.get(idx as usize).cloned().ok_or_else(|| EvalError(format!("index {n} out of range (len {})", a.len())))?
                }
                (Value::String(s), Value::Number(n)) => {
                    let chars: Vec<char> = s.chars().collect();
                    let n = n.as_i64().unwrap_or(0);
                    let idx = if n < 0 { chars.len() as i64 + n } else { n };
                    Value::String(chars.get(idx as usize).map(|c| c.to_string()).ok_or_else(|| EvalError(format!("index {n} out of range")))?)
                }
                (Value::Null, _) if *optional => Value::Null,
                _ => return err(format!("cannot index {} with {}", kind(&t), kind(&i))),
            }
        }
        Slice { target, from, to } => {
            let t = ev(target, env, scope, frames)?;
            let len = match &t {
                Value::Array(a) => a.len(),
                Value::String(s) => s.chars().count(),
                other => return err(format!("cannot slice {}", kind(other))),
            } as i64;
            let bound = |b: &Option<Box<Expr>>, def: i64, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>| -> Result<i64, EvalError> {
                match b {
                    None => Ok(def),
                    Some(x) => {
                        let v = ev(x, env, scope, frames)?;
                        let n = v.as_i64().ok_or_else(|| EvalError("slice bounds must be integers".into()))?;
                        Ok((if n < 0 { len + n } else { n }).clamp(0, len))
                    }
                }
            };
            let a = bound(from, 0, scope, frames)?;
            let b = bound(to, len, scope, frames)?.max(a);
            match t {
                Value::Array(mut v) => {
                    v.truncate(b as usize);
                    Value::Array(v.split_off(a as usize))
                }
                Value::String(s) => Value::String(s.chars().skip(a as usize).take((b - a) as usize).collect()),
                _ => Value::Null,
            }
        }
        Unary(op, x) => {
            let v = ev(x, env, scope, frames)?;
            match *op {
                "!" => Value::Bool(!truthy(&v)),
                "-" => match &v {
                    Value::Number(n) if n.is_i64() => int(n.as_i64().unwrap_or(0).wrapping_neg()),
                    Value::Number(n) => float(-n.as_f64().unwrap_or(0.0)),
                    other => return err(format!("cannot negate {}", kind(other))),
                },
                _ => v,
            }
        }
        Binary(op, a, b) => binary(op, a, b, env, scope, frames)?,
        Ternary(c, a, b) => {
            if truthy(&ev(c, env, scope, frames)?) {
                ev(a, env, scope, frames)?
            } else {
                ev(b, env, scope, frames)?
            }
        }
        Let { name, value, body } => {
            let v = ev(value, env, scope, frames)?;
            scope.push((name.clone(), v));
            let r = ev(body, env, scope, frames);
            scope.pop();
            r?
        }
        Closure(body) => ev(body, env, scope, frames)?,
        Call { name, args, .. } => call(name, args, env, scope, frames)?,
    })
}

fn binary(op: &str, a: &Expr, b: &Expr, env: &Env, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>) -> R {
    match op {
        "&&" => {
            let l = ev(a, env, scope, frames)?;
            return Ok(Value::Bool(truthy(&l) && truthy(&ev(b, env, scope, frames)?)));
        }
        "||" => {
            let l = ev(a, env, scope, frames)?;
            return Ok(Value::Bool(truthy(&l) || truthy(&ev(b, env, scope, frames)?)));
        }
        "??" => {
            let l = ev(a, env, scope, frames)?;
            return if l.is_null() { ev(b, env, scope, frames) } else { Ok(l) };
        }
        _ => {}
    }
    let l = ev(a, env, scope, frames)?;
    let r = ev(b, env, scope, frames)?;
    let both_int = l.is_i64() && r.is_i64();
    Ok(match op {
        "==" => Value::Bool(eq(&l, &r)),
        "!=" => Value::Bool(!eq(&l, &r)),
        "<" | "<=" | ">" | ">=" => {
            let ord = match (&l, &r) {
                (Value::String(x), Value::String(y)) => x.cmp(y),
                _ => match (num(&l), num(&r)) {
                    (Some(x), Some(y)) => x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal),
                    _ => return err(format!("cannot compare {} {op} {}", kind(&l), kind(&r))),
                },
            };
            Value::Bool(match op {
                "<" => ord.is_lt(),
                "<=" => ord.is_le(),
                ">" => ord.is_gt(),
                _ => ord.is_ge(),
            })
        }
        "+" => match (l, r) {
            (Value::String(mut x), Value::String(y)) => {
                env.spent.afford((x.len() + y.len()) as u64)?;
                x.push_str(&y);
                Value::String(x)
            }
            (Value::Array(mut x), Value::Array(y)) => {
                env.spent.afford(elements(x.len() + y.len()))?;
                x.extend(y);
                Value::Array(x)
            }
            (l, r) if both_int => int(l.as_i64().unwrap_or(0).wrapping_add(r.as_i64().unwrap_or(0))),
            (l, r) => match (num(&l), num(&r)) {
                (Some(x), Some(y)) => float(x + y),
                _ => return err(format!("cannot add {} and {}", kind(&l), kind(&r))),
            },
        },
        "-" | "*" | "%" | "**" | "/" => {
            if both_int && op != "/" && op != "**" {
                let (x, y) = (l.as_i64().unwrap_or(0), r.as_i64().unwrap_or(0));
                match op {
                    "-" => int(x.wrapping_sub(y)),
                    "*" => int(x.wrapping_mul(y)),
                    _ => {
                        if y == 0 {
                            return err("modulo by zero");
                        }
                        int(x.wrapping_rem(y))
                    }
                }
            } else {
                let (Some(x), Some(y)) = (num(&l), num(&r)) else {
                    return err(format!("cannot apply {op} to {} and {}", kind(&l), kind(&r)));
                };
                match op {
                    "-" => float(x - y),
                    "*" => float(x * y),
                    "%" => float(x % y),
                    "**" => float(x.powf(y)),
                    _ => {
                        if y == 0.0 {
                            return err("division by zero");
                        }
                        float(x / y)
                    }
                }
            }
        }
        "in" => Value::Bool(match &r {
            Value::Array(a) => a.iter().any(|x| eq(x, &l)),
            Value::Object(m) => m.contains_key(&text(&l)),
            Value::String(s) => s.contains(&text(&l)),
            Value::Null => false,
            other => return err(format!("cannot use in with {}", kind(other))),
        }),
        "contains" => Value::Bool(text(&l).contains(&text(&r))),
        "startsWith" => Value::Bool(text(&l).starts_with(&text(&r))),
        "endsWith" => Value::Bool(text(&l).ends_with(&text(&r))),
        "matches" => {
            let re = regex::Regex::new(&text(&r)).map_err(|e| EvalError(format!("matches: {e}")))?;
            Value::Bool(re.is_match(&text(&l)))
        }
        ".." => {
            let (Some(x), Some(y)) = (l.as_i64(), r.as_i64()) else { return err("a..b needs integers") };
            if y.checked_sub(x).is_none_or(|n| n > 1_000_000) {
                return err("range too large");
            }
            env.spent.afford(elements(y.saturating_sub(x).saturating_add(1).max(0) as usize))?;
            Value::Array((x..=y).map(int).collect())
        }
        other => return err(format!("unknown operator {other}")),
    })
}

fn eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn predicate(
    name: &str,
    args: &[Expr],
    env: &Env,
    scope: &mut Vec<(String, Value)>,
    frames: &mut Vec<Frame>,
) -> R {
    let Some(first) = args.first() else { return err(format!("{name}() needs a collection")) };
    let coll = ev(first, env, scope, frames)?;
    let items: Vec<Value> = match coll {
        Value::Array(a) => a,
        Value::Object(m) => m.into_iter().map(|(k, v)| serde_json::json!({"key": k, "value": v})).collect(),
        Value::Null => Vec::new(),
        other => return err(format!("{name}() needs an array, got {}", kind(&other))),
    };
    let Some(pred) = args.get(1) else {
        return if name == "count" { Ok(int(items.iter().filter(|v| truthy(v)).count() as i64)) } else { err(format!("{name}() needs a predicate")) };
    };
    let run = |item: &Value, i: usize, acc: Value, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>| -> R {
        frames.push(Frame { pointer: item.clone(), index: i as i64, acc });
        let r = ev(pred, env, scope, frames);
        frames.pop();
        r
    };
    Ok(match name {
        "map" => Value::Array(items.iter().enumerate().map(|(i, x)| run(x, i, Value::Null, scope, frames)).collect::<Result<_, _>>()?),
        "filter" => {
            let mut out = Vec::new();
            for (i, x) in items.iter().enumerate() {
                if truthy(&run(x, i, Value::Null, scope, frames)?) {
                    out.push(x.clone());
                }
            }
            Value::Array(out)
        }
        "all" | "any" | "none" | "one" | "count" => {
            let mut n = 0usize;
            for (i, x) in items.iter().enumerate() {
                if truthy(&run(x, i, Value::Null, scope, frames)?) {
                    n += 1;
                }
            }
            match name {
                "all" => Value::Bool(n == items.len()),
                "any" => Value::Bool(n > 0),
                "none" => Value::Bool(n == 0),
                "one" => Value::Bool(n == 1),
                _ => int(n as i64),
            }
        }
        "find" | "findIndex" => {
            for (i, x) in items.iter().enumerate() {
                if truthy(&run(x, i, Value::Null, scope, frames)?) {
                    return Ok(if name == "find" { x.clone() } else { int(i as i64) });
                }
            }
            if name == "find" { Value::Null } else { int(-1) }
        }
        "sortBy" => {
            let mut keyed = Vec::new();
            for (i, x) in items.iter().enumerate() {
                keyed.push((run(x, i, Value::Null, scope, frames)?, x.clone()));
            }
            let desc = match args.get(2) {
                Some(o) => text(&ev(o, env, scope, frames)?) == "desc",
                None => false,
            };
            keyed.sort_by(|(a, _), (b, _)| {
                let o = match (a, b) {
                    (Value::String(x), Value::String(y)) => x.cmp(y),
                    _ => num(a).partial_cmp(&num(b)).unwrap_or(std::cmp::Ordering::Equal),
                };
                if desc { o.reverse() } else { o }
            });
            Value::Array(keyed.into_iter().map(|(_, v)| v).collect())
        }
        "groupBy" => {
            let mut m = Map::new();
            for (i, x) in items.iter().enumerate() {
                let k = text(&run(x, i, Value::Null, scope, frames)?);
                if let Value::Array(a) = m.entry(k).or_insert_with(|| Value::Array(Vec::new())) {
                    a.push(x.clone());
                }
            }
            Value::Object(m)
        }
        "reduce" => {
            let mut acc = match args.get(2) {
                Some(init) => ev(init, env, scope, frames)?,
                None => items.first().cloned().unwrap_or(Value::Null),
            };
            let skip = usize::from(args.get(2).is_none());
            for (i, x) in items.iter().enumerate().skip(skip) {
                acc = run(x, i, acc, scope, frames)?;
            }
            acc
        }
        _ => return err(format!("unknown predicate function {name}")),
    })
}

fn call(name: &str, args: &[Expr], env: &Env, scope: &mut Vec<(String, Value)>, frames: &mut Vec<Frame>) -> R {
    if matches!(name, "map" | "filter" | "all" | "any" | "none" | "one" | "find" | "findIndex" | "count" | "sortBy" | "groupBy" | "reduce") {
        return predicate(name, args, env, scope, frames);
    }
    let vals: Vec<Value> = args.iter().map(|a| ev(a, env, scope, frames)).collect::<Result<_, _>>()?;
    let a0 = vals.first().unwrap_or(&Value::Null);
    let arr = |v| array_arg(name, v);
    Ok(match name {
        "len" => int(match a0 {
            Value::Array(a) => a.len(),
            Value::Object(m) => m.len(),
            Value::String(s) => s.chars().count(),
            Value::Null => 0,
            other => return err(format!("len() of {}", kind(other))),
        } as i64),
        "flatten" => {
            let mut out = Vec::new();
            for x in arr(a0)? {
                match x {
                    Value::Array(inner) => out.extend(inner.iter().cloned()),
                    other => out.push(other.clone()),
                }
            }
            Value::Array(out)
        }
        "concat" => Value::Array(vals.iter().map(arr).collect::<Result<Vec<_>, _>>()?.concat()),
        "take" => Value::Array(arr(a0)?.iter().take(vals.get(1).and_then(Value::as_u64).unwrap_or(0) as usize).cloned().collect()),
        "uniq" => {
            let mut out: Vec<Value> = Vec::new();
            for x in arr(a0)? {
                if !out.iter().any(|y| eq(y, x)) {
                    out.push(x.clone());
                }
            }
            Value::Array(out)
        }
        "first" => arr(a0)?.first().cloned().unwrap_or(Value::Null),
        "last" => arr(a0)?.last().cloned().unwrap_or(Value::Null),
        "reverse" => Value::Array(arr(a0)?.iter().rev().cloned().collect()),
        "keys" => match a0 {
            Value::Object(m) => Value::Array(m.keys().map(|k| Value::String(k.clone())).collect()),
            _ => Value::Array(Vec::new()),
        },
        "values" => match a0 {
            Value::Object(m) => Value::Array(m.values().cloned().collect()),
            _ => Value::Array(Vec::new()),
        },
        "get" => match (&a0, vals.get(1)) {
            (Value::Object(m), Some(k)) => m.get(&text(k)).cloned().unwrap_or(Value::Null),
            (Value::Array(a), Some(Value::Number(n))) => a.get(n.as_u64().unwrap_or(u64::MAX) as usize).cloned().unwrap_or(Value::Null),
            _ => Value::Null,
        },
        "toJSON" => Value::String(serde_json::to_string_pretty(a0).map_err(|e| EvalError(e.to_string()))?),
        "fromJSON" => serde_json::from_str(&text(a0)).map_err(|e| EvalError(format!("fromJSON: {e}")))?,
        "float" => float(match a0 {
            Value::String(s) => s.trim().parse().map_err(|_| EvalError(format!("float(): {s:?} is not a number")))?,
            v => num(v).unwrap_or(0.0),
        }),
        "int" => int(match a0 {
            Value::String(s) => s.trim().parse().map_err(|_| EvalError(format!("int(): {s:?} is not an integer")))?,
            v => num(v).unwrap_or(0.0) as i64,
        }),
        "string" => Value::String(text(a0)),
        "trim" => Value::String(text(a0).trim().to_string()),
        "upper" => Value::String(text(a0).to_uppercase()),
        "lower" => Value::String(text(a0).to_lowercase()),
        "split" => Value::Array(text(a0).split(&text(vals.get(1).unwrap_or(&Value::Null))).map(|s| Value::String(s.to_string())).collect()),
        "join" => Value::String(arr(a0)?.iter().map(text).collect::<Vec<_>>().join(&vals.get(1).map(text).unwrap_or_default())),
        "sum" => {
            let xs = arr(a0)?;
            if xs.iter().all(Value::is_i64) {
                int(xs.iter().filter_map(Value::as_i64).sum())
            } else {
                float(xs.iter().filter_map(num).sum())
            }
        }
        "min" | "max" => {
            let xs = if vals.len() == 1 { arr(a0)? } else { &vals[..] };
            let mut best: Option<&Value> = None;
            for x in xs {
                let better = match &best {
                    None => true,
                    Some(b) => {
                        let (x_, b_) = (num(x).unwrap_or(f64::NAN), num(b).unwrap_or(f64::NAN));
                        if name == "min" { x_ < b_ } else { x_ > b_ }
                    }
                };
                if better {
                    best = Some(x);
                }
            }
            best.cloned().unwrap_or(Value::Null)
        }
        "abs" => match a0 {
            Value::Number(n) if n.is_i64() => int(n.as_i64().unwrap_or(0).abs()),
            v => float(num(v).unwrap_or(0.0).abs()),
        },
        "env" => {
            let n = text(a0);
            if !env.host_env {
                return err(format!("env(\"{n}\"): a submitted pipeline's expr stages run on the coordinator, whose environment is not the pipeline's to read; read credentials in a shell resource type, whose stages run on workers"));
            }
            if !env.env_allowed.iter().any(|x| x == &n) {
                return err(format!("env(\"{n}\"): only names declared in env: may be read"));
            }
            match std::env::var(&n) {
                Ok(v) => Value::String(v),
                Err(_) => match vals.get(1) {
                    Some(d) => d.clone(),
                    None => return err(format!("env(\"{n}\"): not set")),
                },
            }
        }
        "file" => {
            let Some(read) = env.read_file else { return err("file() is only available in the out stage") };
            match read(&text(a0)) {
                Ok(t) => Value::String(t),
                Err(e) => match vals.get(1) {
                    Some(d) => d.clone(),
                    None => return err(format!("file(\"{}\"): {e}", text(a0))),
                },
            }
        }
        "fail" => return err(text(a0)),
        "now" => {
            let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
            int(secs as i64)
        }
        "http" | "date" | "duration" | "timezone" => return err(format!("{name}() is not supported by this build of steppe yet")),
        other => return err(format!("unknown function {other}")),
    })
}

/// A function's array argument (nil is an empty one).
fn array_arg<'a>(name: &str, v: &'a Value) -> Result<&'a [Value], EvalError> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Null => Ok(&[]),
        other => err(format!("{name}() needs an array, got {}", kind(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{compile, Stage};
    use super::*;
    use serde_json::json;

    fn run(src: &str, vars: Value) -> R {
        let e = compile(src, Stage::In).map_err(|e| EvalError(e.to_string()))?;
        let mut m = HashMap::new();
        for (k, v) in vars.as_object().cloned().unwrap_or_default() {
            m.insert(Box::leak(k.into_boxed_str()) as &str, v);
        }
        eval(&e, &Env { vars: m, env_allowed: vec![], host_env: true, read_file: None, spent: Default::default() })
    }

    #[test]
    fn hostile_expressions_end_in_errors_not_in_a_stuck_or_crashed_coordinator() {
        let v = json!({"source": {}, "version": {}, "params": {}});
        let doubling = format!("let a = 1..1000000; {}len(a)", (0..30).map(|_| "let a = a + a; ").collect::<String>());
        let e = run(&doubling, v.clone()).unwrap_err();
        assert!(e.0.contains("too much work"), "{e}");
        let nested = "reduce(1..1000000, reduce(1..1000000, #acc + 1, 0), 0)";
        assert!(run(nested, v.clone()).unwrap_err().0.contains("too much work"));
        let strings = format!("let s = 'xxxxxxxxxxxxxxxx'; {}len(s)", (0..40).map(|_| "let s = s + s; ").collect::<String>());
        assert!(run(&strings, v.clone()).unwrap_err().0.contains("too much work"));
        // Nesting doubles the whole size at little top-level cost; deep values are refused.
        let nested = format!("let a = 1..100000; {}len(a)", (0..30).map(|_| "let a = [a, a]; ").collect::<String>());
        assert!(run(&nested, v.clone()).unwrap_err().0.contains("too much work"));
        let deep = run("reduce(1..400000, [#acc], [])", v.clone()).unwrap_err();
        assert!(deep.0.contains("nested more than") || deep.0.contains("too much work"), "{deep}");
        // The budget is of what is held: a copy that would pass it is refused
        // before it is made; what fits well inside it runs.
        let twice = run("let a = 1..500000; len(a + a)", v.clone()).unwrap_err();
        assert!(twice.0.contains("too much work") && twice.0.contains("MiB"), "{twice}");
        assert_eq!(run("len(filter(map(1..100000, # * 2), # % 3 == 0))", v.clone()), Ok(json!(33333)));
        assert_eq!(run("let a = 1..100000; len(a + a + a)", v.clone()), Ok(json!(300000)));
        assert_eq!(run("let s = 'ab'; len(s + s + s)", v.clone()), Ok(json!(6)));
        assert!(run("(-9223372036854775807 - 1) % -1", v.clone()).is_ok(), "no overflow panic");
        assert!(run("-(-9223372036854775807 - 1)", v.clone()).is_ok());
        assert!(run("(-9223372036854775807)..9223372036854775807", v.clone()).unwrap_err().0.contains("range too large"));
    }

    #[test]
    fn a_submitted_pipeline_reads_no_environment_of_the_coordinator() {
        let e = compile("env('HOME')", Stage::Check).unwrap();
        let env = Env { vars: HashMap::new(), env_allowed: vec!["HOME".into()], host_env: false, read_file: None, spent: Default::default() };
        let r = eval(&e, &env).unwrap_err();
        assert!(r.0.contains("not the pipeline's to read"), "{r}");
    }

    #[test]
    fn evaluates_the_language() {
        let v = json!({"source": {"items": [{"n": 1, "ok": true}, {"n": 2, "ok": false}, {"n": 3, "ok": true}], "name": "x"}, "version": {}, "params": {}});
        assert_eq!(run("source.items | filter(#.ok) | map(#.n)", v.clone()).unwrap(), json!([1, 3]));
        assert_eq!(run("source.items | map(({v: string(#.n), i: #index}))", v.clone()).unwrap()[1], json!({"v": "2", "i": 1}));
        assert_eq!(run("reduce(1..4, #acc + #, 0)", v.clone()).unwrap(), json!(10));
        assert_eq!(run("source.missing?.deep ?? 'd'", v.clone()).unwrap(), json!("d"));
        assert_eq!(run("let n = len(source.items); n > 2 ? 'many' : 'few'", v.clone()).unwrap(), json!("many"));
        assert_eq!(run("source.name + '-' + upper('y') in ['x-Y']", v.clone()).unwrap(), json!(true));
        assert_eq!(run("{\"version.json\": toJSON({a: 1})}", v.clone()).unwrap(), json!({"version.json": "{\n  \"a\": 1\n}"}));
        assert_eq!(run("source.items[-1].n * 2 + 1", v.clone()).unwrap(), json!(7));
        assert_eq!(run("'abc' matches '^a.c$' && not ('b' in ['a'])", v.clone()).unwrap(), json!(true));
        assert!(run("source.name.nope.deeper", v.clone()).is_err());
        assert_eq!(run("fail('boom')", v).unwrap_err().0, "boom");
    }
}
