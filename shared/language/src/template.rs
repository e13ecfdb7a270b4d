//! Go text/template rendering for resource stages, custom tools and across
//! cells: `missingkey=error`, slim-sprig's common functions and `shellquote`.

use std::collections::HashMap;
use std::sync::Arc;

use gtmpl::{Context, Template};
use gtmpl_value::{FuncError, Number, Value};

/// How deeply a template's blocks (`if`, `range`, `with`, `else if` chains)
/// and an action's parentheses may nest, how many actions it may hold, and
/// whether a range may hold another: the renderer recurses over blocks and
/// a range multiplies what it holds by its data.
const MAX_NESTING: usize = 32;
const MAX_ACTIONS: usize = 10_000;

/// The most a template may render, and a `replace` may make.
const MAX_OUTPUT: usize = 8 << 20;

/// The actions of a template (`{{ … }}`), read the way the renderer reads
/// them: a `}}` inside a string or a comment does not end one.
fn actions(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let body = &rest[start + 2..];
        let bytes = body.as_bytes();
        let mut i = 0;
        let end = loop {
            match bytes.get(i) {
                None => return Err("template: an action is not closed with }}".into()),
                Some(b'}') if bytes.get(i + 1) == Some(&b'}') => break i,
                Some(q @ (b'"' | b'\'' | b'`')) => {
                    let q = *q;
                    i += 1;
                    while let Some(&c) = bytes.get(i) {
                        if c == b'\\' && q != b'`' {
                            i += 2;
                            continue;
                        }
                        i += 1;
                        if c == q {
                            break;
                        }
                    }
                }
                Some(b'/') if bytes.get(i + 1) == Some(&b'*') => {
                    i = body[i + 2..].find("*/").map(|j| i + 2 + j + 2).unwrap_or(bytes.len());
                }
                Some(_) => i += 1,
            }
        };
        out.push(body[..end].trim_matches(|c: char| c == '-' || c.is_whitespace()));
        rest = &body[end + 2..];
    }
    Ok(out)
}

/// Refuses what would make rendering recurse or multiply without bound:
/// `define`/`template`/`block` (a template may call itself), deep nesting,
/// a range inside a range, very many actions.
fn check(text: &str) -> Result<(), String> {
    let actions = actions(text)?;
    if actions.len() > MAX_ACTIONS {
        return Err(format!("template: {} actions; at most {MAX_ACTIONS}", actions.len()));
    }
    // Open blocks: (is a range, else-chain length).
    let mut open: Vec<(bool, usize)> = Vec::new();
    for action in actions {
        if action.starts_with("/*") {
            continue;
        }
        let mut words = action.split(|c: char| c.is_whitespace() || c == '(').filter(|w| !w.is_empty());
        let first = words.next().unwrap_or_default();
        let second = words.next().unwrap_or_default();
        match first {
            "define" | "template" | "block" => return Err(format!("template: {{{{{first}}}}} is not supported here (a template could call itself without end)")),
            "range" if open.iter().any(|(range, _)| *range) => return Err("template: a range may not hold another range".into()),
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

/// Where a render goes: refuses to grow past [`MAX_OUTPUT`], so a template
/// stops as soon as it would.
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + b.len() > MAX_OUTPUT {
            return Err(std::io::Error::other(format!("renders over {MAX_OUTPUT} bytes")));
        }
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Templates parsed so far, by their text, at most [`PARSED_MAX`] of them:
/// an across renders one text once per cell, and gtmpl's parser starts a
/// thread of its own for its lexer each time it parses.
static PARSED: std::sync::Mutex<Option<HashMap<String, Arc<Template>>>> = std::sync::Mutex::new(None);
const PARSED_MAX: usize = 512;

/// `text` checked and parsed, or as parsed before.
fn parsed(text: &str) -> Result<Arc<Template>, String> {
    if let Some(t) = PARSED.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|m| m.get(text)) {
        return Ok(t.clone());
    }
    check(text)?;
    let mut t = Template::default();
    t.add_funcs(&FUNCS);
    t.parse(text).map_err(|e| format!("template: {e}"))?;
    let t = Arc::new(t);
    let mut cache = PARSED.lock().unwrap_or_else(|p| p.into_inner());
    let m = cache.get_or_insert_with(HashMap::new);
    if m.len() >= PARSED_MAX {
        m.clear();
    }
    m.insert(text.to_string(), t.clone());
    Ok(t)
}

/// Renders `text` with `data` (a JSON object such as `{source, version, params}`).
pub fn render(text: &str, data: &serde_json::Value) -> Result<String, String> {
    if !text.contains("{{") {
        return Ok(text.to_string());
    }
    let t = parsed(text)?;
    let mut out = Bounded(Vec::new());
    t.execute(&mut out, &Context::from(to_value(data))).map_err(|e| format!("template: {e}"))?;
    String::from_utf8(out.0).map_err(|e| format!("template: {e}"))
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
        let deep = format!("{}x{}", "{{if true}}".repeat(100), "{{end}}".repeat(100));
        assert!(render(&deep, &d).unwrap_err().contains("nest more than"));
        let chain = format!("{{{{if false}}}}{}x{{{{end}}}}", "{{else if false}}".repeat(100));
        assert!(render(&chain, &d).unwrap_err().contains("nest more than"));
        let parens = format!("{{{{ {}1{} }}}}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(render(&parens, &d).unwrap_err().contains("parentheses nest"));
        let ranges = "{{range .source.l}}{{range $.source.l}}x{{end}}{{end}}";
        assert!(render(ranges, &d).unwrap_err().contains("may not hold another range"));
        assert_eq!(render("{{range .source.l}}x{{end}}{{range .source.l}}y{{end}}", &d).unwrap(), "xxxyyy", "ranges one after another are fine");
        // A `}}` inside a string or a comment does not hide a block from the count.
        let hidden = format!("{}x{}", r#"{{if 1}}{{"}}{{end}}"}}"#.repeat(100), "{{end}}".repeat(100));
        assert!(render(&hidden, &d).unwrap_err().contains("nest more than"));
        let commented = format!("{}x{}", "{{if 1}}{{/* }} */}}".repeat(100), "{{end}}".repeat(100));
        assert!(render(&commented, &d).unwrap_err().contains("nest more than"));
        let many = "{{ .vars.x }}".repeat(20_000);
        assert!(render(&many, &d).unwrap_err().contains("actions; at most"));
        let big = json!({"source": {"l": vec!["y".repeat(1 << 20); 16]}});
        assert!(render("{{range .source.l}}{{.}}{{.}}{{end}}", &big).unwrap_err().contains("renders over"), "stopped as it grows, not after");
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
