//! Reading the generated JSON Schema for the reference: definitions, the
//! order they are documented in, type names, YAML renderings of values, and
//! sample values that let the placement table be asked about one key.

use std::collections::{BTreeMap, HashSet};

use serde_json::{Map, Value};

use crate::model::{Pipeline, Step, StepKind};

/// The schema of the format and its definitions.
pub(super) struct View {
    pub root: Value,
    empty: Map<String, Value>,
}

/// Definitions rendered as a word rather than linked (they hold no keys).
const SCALARS: &[(&str, &str)] = &[("Duration", "duration"), ("Memory", "size")];

impl View {
    pub fn new() -> View {
        View { root: schemars::schema_for!(Pipeline).to_value(), empty: Map::new() }
    }

    pub fn defs(&self) -> &Map<String, Value> {
        self.root.get("$defs").and_then(Value::as_object).unwrap_or(&self.empty)
    }

    pub fn def(&self, name: &str) -> Option<&Value> {
        self.defs().get(name)
    }

    /// The keys of an object schema, in declaration order.
    pub fn props<'v>(&self, schema: &'v Value) -> Vec<(&'v str, &'v Value)> {
        schema
            .get("properties")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.as_str(), v)).collect())
            .unwrap_or_default()
    }

    /// Whether a definition holds keys (and so gets a section of its own).
    pub fn has_props(&self, name: &str) -> bool {
        self.def(name).is_some_and(|d| d.get("properties").is_some())
    }

    /// Definitions with keys, in the order a reader meets them: a walk from
    /// the top level, each definition after the key that first leads to it,
    /// with the path of that key (`resource_types[].config`).
    pub fn sections(&self) -> Vec<(String, String)> {
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (key, prop) in self.props(&self.root) {
            for (r, list) in refs(prop) {
                self.visit(&r, format!("{key}{}", if list { "[]" } else { "" }), &mut seen, &mut out);
            }
        }
        out
    }

    fn visit(&self, name: &str, path: String, seen: &mut HashSet<String>, out: &mut Vec<(String, String)>) {
        if !seen.insert(name.to_string()) {
            return;
        }
        let Some(def) = self.def(name) else { return };
        // A step nests everywhere; its keys read `step.KEY`.
        let path = if name == "Step" { "step".to_string() } else { path };
        if self.has_props(name) {
            out.push((name.to_string(), path.clone()));
            for (key, prop) in self.props(def) {
                for (r, list) in refs(prop) {
                    self.visit(&r, format!("{path}.{key}{}", if list { "[]" } else { "" }), seen, out);
                }
            }
        } else {
            for (r, list) in refs(def) {
                self.visit(&r, format!("{path}{}", if list { "[]" } else { "" }), seen, out);
            }
        }
    }

    /// Every key path that leads to definition `target` (through definitions
    /// without keys of their own, such as `Fix` to `FixSpec`).
    pub fn places(&self, target: &str, paths: &BTreeMap<String, String>) -> Vec<String> {
        let mut out = Vec::new();
        self.places_into(target, paths, &mut out, 0);
        out
    }

    fn places_into(&self, target: &str, paths: &BTreeMap<String, String>, out: &mut Vec<String>, depth: usize) {
        if depth > 8 {
            return;
        }
        let add = |p: String, out: &mut Vec<String>| {
            if !out.contains(&p) {
                out.push(p);
            }
        };
        for (key, prop) in self.props(&self.root) {
            for (r, list) in refs(prop) {
                if r == target {
                    add(format!("{key}{}", if list { "[]" } else { "" }), out);
                }
            }
        }
        for (name, def) in self.defs() {
            if self.has_props(name) {
                let Some(base) = paths.get(name) else { continue };
                for (key, prop) in self.props(def) {
                    for (r, list) in refs(prop) {
                        if r == target {
                            add(format!("{base}.{key}{}", if list { "[]" } else { "" }), out);
                        }
                    }
                }
            } else {
                for (r, list) in refs(def) {
                    if r == target {
                        let mut via = Vec::new();
                        self.places_into(name, paths, &mut via, depth + 1);
                        for p in via {
                            add(format!("{p}{}", if list { "[]" } else { "" }), out);
                        }
                    }
                }
            }
        }
    }

    /// A schema's type in words, definitions with keys linked to their section.
    pub fn type_of(&self, s: &Value) -> String {
        self.type_at(s, 0)
    }

    fn type_at(&self, s: &Value, depth: usize) -> String {
        if depth > 6 {
            return "any".into();
        }
        let Some(o) = s.as_object() else { return "any".into() };
        if let Some(name) = o.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            if let Some((_, word)) = SCALARS.iter().find(|(n, _)| *n == name) {
                return (*word).to_string();
            }
            if self.has_props(name) {
                return format!("[{name}](#{})", name.to_lowercase());
            }
            return self.def(name).map(|d| self.type_at(d, depth + 1)).unwrap_or_else(|| name.to_string());
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(alts) = o.get(key).and_then(Value::as_array) {
                let mut words: Vec<String> = Vec::new();
                for a in alts.iter().filter(|a| a.get("type").and_then(Value::as_str) != Some("null")) {
                    let w = self.type_at(a, depth + 1);
                    if !words.contains(&w) {
                        words.push(w);
                    }
                }
                return words.join(" or ");
            }
        }
        if let Some(values) = o.get("enum").and_then(Value::as_array) {
            return values.iter().map(|v| format!("`{}`", yaml(v))).collect::<Vec<_>>().join(" or ");
        }
        if let Some(c) = o.get("const") {
            return format!("`{}`", yaml(c));
        }
        let types: Vec<&str> = match o.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        let words: Vec<String> = types
            .into_iter()
            .filter(|t| *t != "null")
            .map(|t| match t {
                "array" => match o.get("items") {
                    Some(items) => format!("list of {}", self.type_at(items, depth + 1)),
                    None => "list".into(),
                },
                "object" => match o.get("additionalProperties") {
                    Some(v @ Value::Object(_)) => format!("mapping to {}", self.type_at(v, depth + 1)),
                    _ => "mapping".into(),
                },
                other => other.to_string(),
            })
            .collect();
        if words.is_empty() {
            "any".into()
        } else {
            words.join(" or ")
        }
    }

    /// A value of the schema: its first example, else the simplest value of its type.
    pub fn sample(&self, s: &Value) -> Value {
        self.sample_at(s, 0)
    }

    fn sample_at(&self, s: &Value, depth: usize) -> Value {
        let Some(o) = s.as_object() else { return Value::String("x".into()) };
        if let Some(e) = o.get("examples").and_then(Value::as_array).and_then(|e| e.first()) {
            return e.clone();
        }
        if depth > 6 {
            return Value::Object(Map::new());
        }
        if let Some(name) = o.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
            return self.def(name).map(|d| self.sample_at(d, depth + 1)).unwrap_or(Value::Null);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(first) = o.get(key).and_then(Value::as_array).and_then(|a| a.iter().find(|a| a.get("type").and_then(Value::as_str) != Some("null"))) {
                return self.sample_at(first, depth + 1);
            }
        }
        if let Some(v) = o.get("enum").and_then(Value::as_array).and_then(|v| v.first()) {
            return v.clone();
        }
        if let Some(c) = o.get("const") {
            return c.clone();
        }
        let first = match o.get("type") {
            Some(Value::String(t)) => Some(t.as_str()),
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
            _ => None,
        };
        match first {
            Some("boolean") => Value::Bool(true),
            Some("integer") => Value::from(1),
            Some("number") => Value::from(1.5),
            Some("array") => Value::Array(o.get("items").map(|i| vec![self.sample_at(i, depth + 1)]).unwrap_or_default()),
            Some("object") => {
                let mut m = Map::new();
                for r in o.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
                    if let Some(p) = o.get("properties").and_then(|p| p.get(r)) {
                        m.insert(r.to_string(), self.sample_at(p, depth + 1));
                    }
                }
                Value::Object(m)
            }
            // A string, or a free-form value.
            _ => Value::String("x".into()),
        }
    }

    /// What the placement table says of step key `key` on each kind: the
    /// kinds that take it, and the messages of those that refuse it. `None`
    /// when no sample step could be made (a schema the samples do not fit).
    pub fn placement(&self, key: &str) -> Option<(Vec<StepKind>, Vec<String>)> {
        let step = self.def("Step")?;
        let props: BTreeMap<&str, &Value> = self.props(step).into_iter().collect();
        let value = self.sample(props.get(key)?);
        let mut takes = Vec::new();
        let mut refusals: Vec<String> = Vec::new();
        for kind in StepKind::ALL {
            let mut m = Map::new();
            m.insert(kind.key().to_string(), self.sample(props.get(kind.key())?));
            m.insert(key.to_string(), value.clone());
            let s = decode_step(&Value::Object(m))?;
            let said = crate::validate::misplaced(&s, kind, "step");
            if said.is_empty() {
                takes.push(kind);
            }
            for (_, msg) in said {
                if !refusals.contains(&msg) {
                    refusals.push(msg);
                }
            }
        }
        Some((takes, refusals))
    }
}

/// A step from a JSON value, through the loader's own decoder (JSON is YAML).
fn decode_step(v: &Value) -> Option<Step> {
    let (node, problems) = crate::yaml::parse(&v.to_string(), 0).ok()?;
    if !problems.is_empty() {
        return None;
    }
    let (step, problems) = crate::de::decode::<Step>(&node?, "");
    step.filter(|_| problems.is_empty())
}

/// The definitions a schema refers to, in order, each with whether it is
/// reached as a list's items.
pub(super) fn refs(s: &Value) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    collect_refs(s, false, &mut out);
    out
}

fn collect_refs(s: &Value, list: bool, out: &mut Vec<(String, bool)>) {
    let Some(o) = s.as_object() else { return };
    if let Some(name) = o.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
        out.push((name.to_string(), list));
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for alt in o.get(key).and_then(Value::as_array).into_iter().flatten() {
            collect_refs(alt, list, out);
        }
    }
    if let Some(items) = o.get("items") {
        collect_refs(items, true, out);
    }
    if let Some(v @ Value::Object(_)) = o.get("additionalProperties") {
        collect_refs(v, list, out);
    }
}

/// A value in YAML flow style, on one line (`[a, b]`, `{k: v}`).
pub(super) fn yaml(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) if plain(s) => s.clone(),
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Array(a) => format!("[{}]", a.iter().map(yaml).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!("{{{}}}", m.iter().map(|(k, v)| format!("{}: {}", yaml(&Value::String(k.clone())), yaml(v))).collect::<Vec<_>>().join(", ")),
    }
}

/// Whether a string can be written unquoted in a flow collection and read back as the same string.
fn plain(s: &str) -> bool {
    let Some(first) = s.chars().next() else { return false };
    let reserved = ["true", "false", "null", "yes", "no", "on", "off", "~"];
    (first.is_ascii_alphanumeric() || matches!(first, '.' | '/' | '_' | '$' | '('))
        && !s.chars().any(|c| matches!(c, '{' | '}' | '[' | ']' | ',' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%' | '@' | '`' | '#' | '\n'))
        && !s.contains(": ")
        && !s.ends_with(':')
        && !s.ends_with(' ')
        && !reserved.contains(&s.to_ascii_lowercase().as_str())
        && s.parse::<f64>().is_err()
}
