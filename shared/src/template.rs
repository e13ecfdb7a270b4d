//! Go text/template rendering for resource stages, custom tools and across
//! cells: `missingkey=error`, slim-sprig's common functions and `shellquote`.

use std::collections::HashMap;

use gtmpl::{Context, Template};
use gtmpl_value::{FuncError, Number, Value};

/// How deeply a template's blocks (`if`, `range`, `with`, `else if` chains)
/// and an action's parentheses may nest, and ranges inside ranges: the
/// renderer recurses over them, on the coordinator, with a pipeline's data.
const MAX_NESTING: usize = 32;
const MAX_RANGES: usize = 2;

/// The most a template may render, and a `replace` may make.
const MAX_OUTPUT: usize = 8 << 20;

/// Refuses what would make rendering recurse without bound or multiply
/// without bound: `define`/`template`/`block` (a template may call itself),
/// deep nesting, ranges in ranges in ranges.
fn check(text: &str) -> Result<(), String> {
    // Open blocks: (is a range, else-chain length).
    let mut open: Vec<(bool, usize)> = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else { break };
        let action = rest[start + 2..start + len].trim_matches(|c: char| c == '-' || c.is_whitespace());
        rest = &rest[start + len + 2..];
        if action.starts_with("/*") {
            continue;
        }
        let mut words = action.split_whitespace();
        let first = words.next().unwrap_or_default();
        let second = words.next().unwrap_or_default();
        match first {
            "define" | "template" | "block" => return Err(format!("template: {{{{{first}}}}} is not supported here (a template could call itself without end)")),
            "if" | "with" | "range" => open.push((first == "range", 0)),
            "else" if matches!(second, "if" | "with") => {
                if let Some(top) = open.last_mut() {
                    top.1 += 1;
                }
            }
            "end" => {
                open.pop();
            }
            _ => {}
        }
        let depth: usize = open.iter().map(|(_, chain)| 1 + chain).sum();
        if depth > MAX_NESTING {
            return Err(format!("template: blocks nest more than {MAX_NESTING} levels deep"));
        }
        if open.iter().filter(|(range, _)| *range).count() > MAX_RANGES {
            return Err(format!("template: a range may hold at most {} more range(s)", MAX_RANGES - 1));
        }
        let mut parens = 0usize;
        for c in action.chars() {
            match c {
                '(' => parens += 1,
                ')' => parens = parens.saturating_sub(1),
                _ => {}
            }
            if parens > MAX_NESTING {
                return Err(format!("template: parentheses nest more than {MAX_NESTING} levels deep"));
            }
        }
    }
    Ok(())
}

/// Renders `text` with `data` (a JSON object such as `{source, version, params}`).
pub fn render(text: &str, data: &serde_json::Value) -> Result<String, String> {
    if !text.contains("{{") {
        return Ok(text.to_string());
    }
    check(text)?;
    let mut t = Template::default();
    t.add_funcs(&FUNCS);
    t.parse(text).map_err(|e| format!("template: {e}"))?;
    let out = t.render(&Context::from(to_value(data))).map_err(|e| format!("template: {e}"))?;
    if out.len() > MAX_OUTPUT {
        return Err(format!("template: renders {} bytes, over the limit of {MAX_OUTPUT}", out.len()));
    }
    Ok(out)
}

/// JSON → template value. Objects become `Object`s, whose missing fields are
/// errors (Go's `missingkey=error`).
pub fn to_value(v: &serde_json::Value) -> Value {
    match v {
        serde_json::Value::Null => Value::Nil,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::Number(Number::from(i))
            } else if let Some(u) = n.as_u64() {
                Value::Number(Number::from(u))
            } else {
                Value::Number(Number::from(n.as_f64().unwrap_or(0.0)))
            }
        }
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(a) => Value::Array(a.iter().map(to_value).collect()),
        serde_json::Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect::<HashMap<_, _>>())
        }
    }
}

/// Go's `%v` of a template value.
pub fn print(v: &Value) -> String {
    match v {
        Value::NoValue | Value::Nil => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// POSIX single-word quoting, quoting only when needed.
pub fn shellquote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c)) {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn arg(args: &[Value], i: usize, name: &str) -> Result<String, FuncError> {
    args.get(i).map(print).ok_or_else(|| FuncError::AtLeastXArgs(name.into(), i + 1))
}

fn f_shellquote(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::String(shellquote(&arg(args, 0, "shellquote")?)))
}

fn empty(v: &Value) -> bool {
    match v {
        Value::NoValue | Value::Nil => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Map(m) | Value::Object(m) => m.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::Function(_) => false,
    }
}

/// `default DEFAULT VALUE`: VALUE unless it is empty.
fn f_default(args: &[Value]) -> Result<Value, FuncError> {
    match args {
        [d] => Ok(d.clone()),
        [d, v, ..] => Ok(if empty(v) { d.clone() } else { v.clone() }),
        [] => Err(FuncError::AtLeastXArgs("default".into(), 1)),
    }
}

/// `index COLLECTION KEY…`: a missing key yields nothing (so `default` applies).
fn f_index(args: &[Value]) -> Result<Value, FuncError> {
    let Some(mut cur) = args.first().cloned() else {
        return Err(FuncError::AtLeastXArgs("index".into(), 2));
    };
    for k in &args[1..] {
        cur = match (&cur, k) {
            (Value::Object(m) | Value::Map(m), key) => m.get(&print(key)).cloned().unwrap_or(Value::NoValue),
            (Value::Array(a), Value::Number(n)) => {
                let i = n.as_i64().unwrap_or(-1);
                a.get(usize::try_from(i).map_err(|_| FuncError::Generic(format!("index {i} out of range")))?)
                    .cloned()
                    .ok_or_else(|| FuncError::Generic(format!("index {i} out of range")))?
            }
            (Value::NoValue | Value::Nil, _) => Value::NoValue,
            _ => return Err(FuncError::Generic("index of a value that has no keys".into())),
        };
    }
    Ok(cur)
}

macro_rules! str_fn {
    ($name:ident, $label:expr, |$s:ident| $body:expr) => {
        fn $name(args: &[Value]) -> Result<Value, FuncError> {
            let $s = arg(args, 0, $label)?;
            Ok(Value::String($body))
        }
    };
}

str_fn!(f_upper, "upper", |s| s.to_uppercase());
str_fn!(f_lower, "lower", |s| s.to_lowercase());
str_fn!(f_trim, "trim", |s| s.trim().to_string());
str_fn!(f_quote, "quote", |s| format!("{s:?}"));
str_fn!(f_squote, "squote", |s| format!("'{s}'"));

fn f_trim_prefix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, s) = (arg(args, 0, "trimPrefix")?, arg(args, 1, "trimPrefix")?);
    Ok(Value::String(s.strip_prefix(&p).unwrap_or(&s).to_string()))
}

fn f_trim_suffix(args: &[Value]) -> Result<Value, FuncError> {
    let (p, s) = (arg(args, 0, "trimSuffix")?, arg(args, 1, "trimSuffix")?);
    Ok(Value::String(s.strip_suffix(&p).unwrap_or(&s).to_string()))
}

fn f_replace(args: &[Value]) -> Result<Value, FuncError> {
    let (old, new, s) = (arg(args, 0, "replace")?, arg(args, 1, "replace")?, arg(args, 2, "replace")?);
    // Checked before it is made: nested replaces could multiply without bound.
    let count = if old.is_empty() { s.chars().count() + 1 } else { s.matches(old.as_str()).count() };
    if s.len().saturating_add(count.saturating_mul(new.len())) > MAX_OUTPUT {
        return Err(FuncError::Generic(format!("replace would make over {MAX_OUTPUT} bytes")));
    }
    Ok(Value::String(s.replace(&old, &new)))
}

fn f_join(args: &[Value]) -> Result<Value, FuncError> {
    let sep = arg(args, 0, "join")?;
    match args.get(1) {
        Some(Value::Array(a)) => Ok(Value::String(a.iter().map(print).collect::<Vec<_>>().join(&sep))),
        Some(other) => Ok(Value::String(print(other))),
        None => Err(FuncError::AtLeastXArgs("join".into(), 2)),
    }
}

fn f_split_list(args: &[Value]) -> Result<Value, FuncError> {
    let (sep, s) = (arg(args, 0, "splitList")?, arg(args, 1, "splitList")?);
    Ok(Value::Array(s.split(sep.as_str()).map(|p| Value::String(p.to_string())).collect()))
}

fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::NoValue | Value::Nil | Value::Function(_) => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Number(n) => n
            .as_i64()
            .map(serde_json::Value::from)
            .or_else(|| n.as_f64().map(serde_json::Value::from))
            .unwrap_or(serde_json::Value::Null),
        Value::Array(a) => serde_json::Value::Array(a.iter().map(to_json).collect()),
        Value::Map(m) | Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            serde_json::Value::Object(keys.into_iter().map(|k| (k.clone(), to_json(&m[k]))).collect())
        }
    }
}

fn f_to_json(args: &[Value]) -> Result<Value, FuncError> {
    let v = args.first().ok_or_else(|| FuncError::AtLeastXArgs("toJson".into(), 1))?;
    Ok(Value::String(to_json(v).to_string()))
}

fn f_list(args: &[Value]) -> Result<Value, FuncError> {
    Ok(Value::Array(args.to_vec()))
}

fn f_dict(args: &[Value]) -> Result<Value, FuncError> {
    let mut m = HashMap::new();
    for pair in args.chunks(2) {
        m.insert(print(&pair[0]), pair.get(1).cloned().unwrap_or(Value::String(String::new())));
    }
    Ok(Value::Map(m))
}

fn f_has_key(args: &[Value]) -> Result<Value, FuncError> {
    let key = arg(args, 1, "hasKey")?;
    Ok(Value::Bool(matches!(args.first(), Some(Value::Map(m) | Value::Object(m)) if m.contains_key(&key))))
}

static FUNCS: [(&str, gtmpl_value::Func); 17] = [
    ("shellquote", f_shellquote),
    ("default", f_default),
    ("index", f_index),
    ("upper", f_upper),
    ("lower", f_lower),
    ("trim", f_trim),
    ("trimPrefix", f_trim_prefix),
    ("trimSuffix", f_trim_suffix),
    ("replace", f_replace),
    ("quote", f_quote),
    ("squote", f_squote),
    ("join", f_join),
    ("splitList", f_split_list),
    ("toJson", f_to_json),
    ("list", f_list),
    ("dict", f_dict),
    ("hasKey", f_has_key),
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn templates_that_would_recurse_or_multiply_are_refused() {
        let d = json!({"source": {"l": [1, 2, 3]}, "vars": {"x": "a"}});
        let recursive = r#"{{define "a"}}x{{template "a"}}{{end}}{{template "a"}}"#;
        assert!(render(recursive, &d).unwrap_err().contains("is not supported here"));
        let deep = format!("{}x{}", "{{if true}}".repeat(20_000), "{{end}}".repeat(20_000));
        assert!(render(&deep, &d).unwrap_err().contains("nest more than"));
        let chain = format!("{{{{if false}}}}{}x{{{{end}}}}", "{{else if false}}".repeat(20_000));
        assert!(render(&chain, &d).unwrap_err().contains("nest more than"));
        let parens = format!("{{{{ {}1{} }}}}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(render(&parens, &d).unwrap_err().contains("parentheses nest"));
        let ranges = "{{range .source.l}}{{range $.source.l}}{{range $.source.l}}x{{end}}{{end}}{{end}}";
        assert!(render(ranges, &d).unwrap_err().contains("at most 1 more range"));
        assert_eq!(render("{{range .source.l}}{{range $.source.l}}x{{end}}{{end}}", &d).unwrap(), "x".repeat(9), "a range in a range is fine");
        let grow = format!("{{{{ {}.vars.x{} }}}}", r#"replace "a" "aaaaaaaaaaaaaaaa" ("#.repeat(12), ")".repeat(12));
        let e = render(&grow, &d).unwrap_err();
        assert!(e.contains("replace would make over"), "nested replaces multiply: refused: {e}");
    }

    #[test]
    fn renders_fields_and_functions() {
        let d = json!({"source": {"uri": "git@x:a b", "n": 3}, "version": {}});
        assert_eq!(render("{{ .source.uri | shellquote }}", &d).unwrap(), "'git@x:a b'");
        assert_eq!(render("n={{ .source.n }}", &d).unwrap(), "n=3");
        assert_eq!(render(r#"{{ index .source "branch" | default "main" }}"#, &d).unwrap(), "main");
        assert_eq!(render("{{ if .source.n }}yes{{ else }}no{{ end }}", &d).unwrap(), "yes");
        assert_eq!(render("plain text", &d).unwrap(), "plain text");
    }

    #[test]
    fn a_missing_key_is_an_error() {
        let d = json!({"source": {}});
        assert!(render("{{ .source.uri }}", &d).is_err());
        assert!(render("{{ .nope }}", &d).is_err());
    }

    #[test]
    fn shellquote_quotes_only_when_needed() {
        assert_eq!(shellquote("abc-1.2"), "abc-1.2");
        assert_eq!(shellquote(""), "''");
        assert_eq!(shellquote("it's"), "'it'\\''s'");
    }
}
