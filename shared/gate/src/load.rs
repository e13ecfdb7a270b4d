//! Loading a stepfile: its document decoded strictly (every unknown key an
//! error with its position), the load-time rules checked (§1.5; what parts
//! may name is references.rs), and its identity (the `sha256:` of its JCS form).

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;
use steppe_language::load::SourceMap;
use steppe_language::source::{Mark, SourceFiles};

use crate::jcs::digest_json;
use crate::stepfile::{Invalid, Loaded, Stepfile};

/// Loads a stepfile (YAML or JSON) from `text`, named `file` in messages.
pub fn load_str(text: &str, file: &Path) -> Result<Loaded, Invalid> {
    let mut files = SourceFiles::default();
    let id = files.add(file);
    let show = |m: Mark| format!("{}:{}:{}", files.path(m.file).display(), m.line, m.col);
    let (node, problems) = steppe_language::yaml::parse(text, id).map_err(|e| Invalid { issues: vec![format!("{}: {}", show(e.mark), e.message)] })?;
    let mut issues: Vec<String> = problems.iter().map(|p| format!("{}: {}", show(p.mark), p.message)).collect();
    let Some(node) = node else {
        return Err(Invalid { issues: vec![format!("{}: the stepfile is empty", file.display())] });
    };
    let (doc, decode_problems) = steppe_language::de::decode::<Stepfile>(&node, "");
    issues.extend(decode_problems.iter().map(|p| format!("{}: {}: {}", show(p.mark), if p.path.is_empty() { "(top)" } else { &p.path }, p.message)));
    let (json, _) = steppe_language::de::decode::<Value>(&node, "");
    let (Some(doc), Some(json), true) = (doc, json, issues.is_empty()) else {
        return Err(Invalid { issues });
    };
    let map = SourceMap::build(&node);
    let at = |path: &str| -> Mark { map.lookup(path) };
    for (path, message) in rules(&doc).into_iter().chain(crate::references::rules(&doc)) {
        issues.push(format!("{}: {path}: {message}", show(at(&path))));
    }
    if !issues.is_empty() {
        return Err(Invalid { issues });
    }
    Ok(Loaded { identity: digest_json(&json), stepfile: doc })
}

/// A YAML (1.2) or JSON document as a value (null when empty), or the
/// parser's complaint: an OpenAPI document, a cases file.
pub fn document(text: &str) -> Result<Value, String> {
    let node = steppe_language::yaml::parse(text, Default::default()).map_err(|e| e.message)?.0;
    match node {
        None => Ok(Value::Null),
        Some(n) => steppe_language::de::decode::<Value>(&n, "").0.ok_or_else(|| "it is not a JSON or YAML document".into()),
    }
}

pub fn load_file(path: &Path) -> Result<Loaded, Invalid> {
    let text = std::fs::read_to_string(path).map_err(|e| Invalid { issues: vec![format!("{}: cannot read it: {e}", path.display())] })?;
    load_str(&text, path)
}

fn exposed_name(e: &Value) -> Option<&str> {
    e.as_str().or_else(|| e.get("name").and_then(Value::as_str))
}

fn valid_id(id: &str) -> bool {
    let mut c = id.chars();
    c.next().is_some_and(|f| f.is_ascii_lowercase()) && id.len() <= 64 && id.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

/// The load-time rules (§1.5): each broken one as (key path, message).
fn rules(doc: &Stepfile) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut bad = |path: String, m: String| out.push((path, m));
    if doc.stepgate != "1" {
        bad("stepgate".into(), format!("must be \"1\", not {:?}", doc.stepgate));
    }
    if !valid_id(&doc.id) {
        bad("id".into(), format!("{:?} must be lowercase letters, digits and '-', starting with a letter, at most 64", doc.id));
    }
    if doc.inputs.get("type").and_then(Value::as_str) != Some("object") {
        bad("inputs".into(), "must be a JSON Schema of type: object".into());
    }
    let creds = doc.credentials.clone().unwrap_or_default();
    for (name, c) in &creds {
        if !["api_key", "bearer", "oauth2", "basic"].contains(&c.kind.as_str()) {
            bad(format!("credentials.{name}.kind"), format!("{:?} is not api_key, bearer, oauth2 or basic", c.kind));
        }
        if c.hosts.is_empty() {
            bad(format!("credentials.{name}.hosts"), "names at least one host".into());
        }
        if (c.kind == "oauth2") != c.scopes.is_some() {
            bad(format!("credentials.{name}.scopes"), "scopes are required for oauth2 credentials and only for them".into());
        }
        if c.token_url.is_some() && c.kind != "oauth2" {
            bad(format!("credentials.{name}.token_url"), "token_url is for oauth2 credentials only".into());
        }
    }
    let tools = doc.tools.clone().unwrap_or_default();
    let mut exposed: HashSet<String> = HashSet::new();
    let mut verifiers: HashSet<&str> = HashSet::new();
    for (name, t) in &tools {
        let kinds = [t.openapi.is_some(), t.mcp.is_some(), t.verifier.is_some()].iter().filter(|k| **k).count();
        if kinds != 1 {
            bad(format!("tools.{name}"), "a tool is exactly one of openapi, mcp or verifier".into());
        }
        if t.verifier.is_some() {
            verifiers.insert(name);
            if t.exposes.is_some() {
                bad(format!("tools.{name}.exposes"), "a verifier exposes no operations".into());
            }
        } else if t.exposes.as_ref().is_none_or(Vec::is_empty) {
            bad(format!("tools.{name}.exposes"), "exposes at least one operation".into());
        }
        if let Some(c) = &t.credential {
            if !creds.contains_key(c) {
                bad(format!("tools.{name}.credential"), format!("credential {c:?} is not declared under credentials"));
            }
        }
        for (part, v, keys, needed) in [
            ("openapi", &t.openapi, &["server", "document", "url", "sha256"][..], &["server"][..]),
            ("mcp", &t.mcp, &["url"][..], &["url"][..]),
            ("verifier", &t.verifier, &["url"][..], &["url"][..]),
        ] {
            let Some(v) = v else { continue };
            let Some(m) = v.as_object() else {
                bad(format!("tools.{name}.{part}"), format!("{part} is a mapping of {}", keys.join(", ")));
                continue;
            };
            for k in m.keys().filter(|k| !keys.contains(&k.as_str())) {
                bad(format!("tools.{name}.{part}.{k}"), format!("{k:?} is not a key of {part} (it takes {})", keys.join(", ")));
            }
            for k in needed.iter().filter(|k| !m.contains_key(**k)) {
                bad(format!("tools.{name}.{part}"), format!("{part} needs {k}"));
            }
            if part == "openapi" && m.contains_key("document") == (m.contains_key("url") || m.contains_key("sha256")) {
                bad(format!("tools.{name}.openapi"), "openapi takes its document inline (document) or fetched and pinned (url and sha256), one of the two".into());
            }
            if part == "openapi" && m.contains_key("url") != m.contains_key("sha256") {
                bad(format!("tools.{name}.openapi"), "a fetched document (url) is pinned by its sha256".into());
            }
        }
        for (i, e) in t.exposes.iter().flatten().enumerate().filter_map(|(i, e)| e.as_object().map(|m| (i, m))) {
            for k in e.keys().filter(|k| !["name", "schema_sha256", "select", "effect"].contains(&k.as_str())) {
                bad(format!("tools.{name}.exposes[{i}].{k}"), format!("{k:?} is not a key of an exposed operation (name, schema_sha256, select, effect)"));
            }
            if e.get("effect").is_some_and(|x| x != "read") {
                bad(format!("tools.{name}.exposes[{i}].effect"), "effect is read (a non-GET that changes nothing) or absent".into());
            }
            if let Some(sel) = e.get("select") {
                if let Err(m) = crate::expr::check(sel) {
                    bad(format!("tools.{name}.exposes[{i}].select"), m);
                }
            }
        }
        for (i, n) in t.exposes.iter().flatten().enumerate().filter_map(|(i, e)| exposed_name(e).map(|n| (i, n))) {
            if n.is_empty() || n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                bad(format!("tools.{name}.exposes[{i}]"), format!("{n:?}: an exposed name is letters, digits, _ and -, at most 64"));
            }
        }
        for (i, e) in t.exposes.iter().flatten().enumerate() {
            match exposed_name(e) {
                Some("submit") => bad(format!("tools.{name}.exposes[{i}]"), "submit is reserved".into()),
                Some(n) if !exposed.insert(n.to_string()) => bad(format!("tools.{name}.exposes[{i}]"), format!("{n:?} is exposed twice in the file")),
                Some(_) => {}
                None => bad(format!("tools.{name}.exposes[{i}]"), "an exposed operation is a name or {name, …}".into()),
            }
        }
    }
    if doc.steps.is_empty() {
        bad("steps".into(), "a stepfile has at least one step".into());
    }
    let mut seen: Vec<&str> = Vec::new();
    for (i, s) in doc.steps.iter().enumerate() {
        let p = format!("steps[{i}]");
        if seen.contains(&s.id.as_str()) {
            bad(format!("{p}.id"), format!("step id {:?} is used twice", s.id));
        }
        seen.push(&s.id);
        match (&s.instructions, &s.do_) {
            (Some(_), Some(_)) | (None, None) => bad(p.clone(), "a step has instructions (an agent step) or do (a mechanical step), not both".into()),
            (Some(_), None) if s.gates.as_ref().is_none_or(Vec::is_empty) => bad(format!("{p}.gates"), "an agent step has at least one gate".into()),
            (None, Some(_)) if s.tools.is_some() || s.retries.is_some() || s.derive.is_some() || s.let_.is_some() => {
                bad(p.clone(), "a mechanical step takes no tools, retries, derive or let".into())
            }
            _ => {}
        }
        if s.retries.is_some_and(|r| !(0..=5).contains(&r)) {
            bad(format!("{p}.retries"), "retries is 0 to 5".into());
        }
        for (j, t) in s.tools.iter().flatten().enumerate() {
            if !exposed.contains(t) {
                bad(format!("{p}.tools[{j}]"), format!("{t:?} is not an operation any tool exposes"));
            }
        }
        let mut gate_ids: HashSet<&str> = HashSet::new();
        for (j, g) in s.gates.iter().flatten().enumerate() {
            if !gate_ids.insert(&g.id) {
                bad(format!("{p}.gates[{j}].id"), format!("gate id {:?} is used twice in the step", g.id));
            }
            let kinds = [g.schema.is_some(), g.predicate.is_some(), g.http.is_some(), g.approve.is_some()].iter().filter(|k| **k).count();
            if kinds != 1 {
                bad(format!("{p}.gates[{j}]"), "a gate is exactly one of schema, predicate, http or approve".into());
            }
            if g.predicate.is_some() && g.message.is_none() {
                bad(format!("{p}.gates[{j}].message"), "a predicate gate says its message".into());
            }
            if let Some(h) = &g.http {
                if !verifiers.contains(h.tool.as_str()) {
                    bad(format!("{p}.gates[{j}].http.tool"), format!("{:?} is not a verifier tool", h.tool));
                }
            }
        }
        let mut rules: Vec<(String, &Value)> = Vec::new();
        for (j, g) in s.gates.iter().flatten().enumerate() {
            rules.extend(g.predicate.iter().map(|r| (format!("{p}.gates[{j}].predicate"), r)));
            rules.extend(g.explain.iter().map(|r| (format!("{p}.gates[{j}].explain"), r)));
        }
        rules.extend(s.derive.iter().flatten().map(|(k, r)| (format!("{p}.derive.{k}"), r)));
        rules.extend(s.when.iter().map(|r| (format!("{p}.when"), r)));
        if let Some(Value::Object(lets)) = &s.let_ {
            rules.extend(lets.iter().map(|(k, r)| (format!("{p}.let.{k}"), r)));
        }
        for (path, r) in rules {
            if let Err(e) = crate::expr::check(r) {
                bad(path, e);
            }
        }
        let props = s.produces.get("properties").and_then(Value::as_object);
        for k in s.derive.iter().flat_map(|d| d.keys()) {
            if !props.is_some_and(|p| p.contains_key(k)) {
                bad(format!("{p}.derive.{k}"), format!("{k:?} is not a property of produces"));
            }
        }
        let mut call_ids: HashSet<&str> = HashSet::new();
        for (j, c) in s.do_.iter().flat_map(|d| d.calls.iter().flatten()).enumerate() {
            if !call_ids.insert(&c.id) {
                bad(format!("{p}.do.calls[{j}].id"), format!("call id {:?} is used twice", c.id));
            }
            if !exposed.contains(&c.operation) {
                bad(format!("{p}.do.calls[{j}].operation"), format!("{:?} is not an operation any tool exposes", c.operation));
            }
            if c.accept.iter().flatten().any(|a| !(400..=599).contains(a)) {
                bad(format!("{p}.do.calls[{j}].accept"), "accept names status codes 400 to 599".into());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
stepgate: "1"
id: shelf-audit
title: Audit a shelf
inputs: {type: object, required: [shelf], properties: {shelf: {type: string}}}
credentials:
  inv: {kind: bearer, hosts: ["inv.example.com"], description: Read-only inventory token.}
tools:
  inventory:
    openapi: {server: "https://inv.example.com/v2", url: "https://inv.example.com/openapi.json", sha256: "sha256:00"}
    credential: inv
    exposes: [listItems, {name: searchItems, effect: read}]
steps:
  - id: fetch
    do:
      calls: [{id: shelf, operation: listItems, arguments: {shelf: {var: inputs.shelf}}, accept: [404]}]
      output: {ids: {map: [{var: responses.shelf.items}, {var: id}]}}
    produces: {type: object, required: [ids], properties: {ids: {type: array}}}
  - id: report
    tools: [searchItems]
    instructions: "Describe shelf {{inputs.shelf}}"
    produces: {type: object, required: [text, count], properties: {text: {type: string}, count: {type: integer}}}
    derive: {count: {length: {var: steps.fetch.ids}}}
    gates: [{id: names-all, message: "Missing ids:", predicate: {subset: [{var: steps.fetch.ids}, {match_all: [{var: output.text}, "(K-[0-9]+)"]}]}}]
    retries: 2
"#;

    #[test]
    fn a_stepfile_loads_with_an_identity_that_ignores_its_form() {
        let a = load_str(GOOD, Path::new("shelf.yaml")).expect("loads");
        assert_eq!(a.stepfile.id, "shelf-audit");
        assert_eq!(a.stepfile.steps.len(), 2);
        assert!(a.identity.starts_with("sha256:") && a.identity.len() == 71);
        let reflowed = GOOD.replace("title: Audit a shelf\n", "").replace("stepgate: \"1\"\n", "stepgate: \"1\"\ntitle: Audit a shelf\n");
        assert_eq!(load_str(&reflowed, Path::new("b.yaml")).expect("loads").identity, a.identity, "key order is not identity");
        let json: Value = steppe_language::de::decode::<Value>(&steppe_language::yaml::parse(GOOD, Default::default()).unwrap().0.unwrap(), "").0.unwrap();
        assert_eq!(load_str(&json.to_string(), Path::new("c.json")).expect("json loads").identity, a.identity, "the JSON form is the same stepfile");
    }

    #[test]
    fn tool_parts_are_closed() {
        let bad = GOOD.replace("credential: inv\n    exposes: [listItems, {name: searchItems, effect: read}]", "credential: inv\n    exposes: [listItems, {name: searchItems, efect: read}, {name: x, effect: write}]").replace("openapi: {server:", "openapi: {documnet: {}, server:");
        let e = load_str(&bad, Path::new("s.yaml")).unwrap_err();
        for want in ["tools.inventory.openapi.documnet: \"documnet\" is not a key of openapi", "tools.inventory.exposes[1].efect: \"efect\" is not a key of an exposed operation", "tools.inventory.exposes[2].effect: effect is read"] {
            assert!(e.issues.iter().any(|i| i.contains(want)), "{want} in {e}");
        }
    }

    #[test]
    fn problems_are_positioned_and_all_reported() {
        let bad = GOOD.replace("title: Audit", "titel: Audit");
        let e = load_str(&bad, Path::new("shelf.yaml")).unwrap_err();
        assert!(e.to_string().starts_with("StepfileInvalid: shelf.yaml:4:1: "), "{e}");
        assert!(e.to_string().contains("titel") && e.to_string().contains("title"), "an unknown key, with the near miss: {e}");
        let bad = GOOD.replace("tools: [searchItems]", "tools: [searchItem]").replace("id: report", "id: fetch").replace("retries: 2", "retries: 9").replace("{length: {var", "{lenght: {var");
        let e = load_str(&bad, Path::new("shelf.yaml")).unwrap_err();
        assert_eq!(e.issues.len(), 4, "{e}");
        assert!(e.issues.iter().any(|i| i.contains("steps[1].derive.count: an expression object is one operator; {lenght} is not one")), "{e}");
        assert!(e.issues.iter().any(|i| i.contains("steps[1].tools[0]: \"searchItem\" is not an operation")), "{e}");
        assert!(e.issues.iter().any(|i| i.contains("steps[1].id: step id \"fetch\" is used twice")), "{e}");
        assert!(e.issues.iter().any(|i| i.contains("steps[1].retries: retries is 0 to 5")), "{e}");
    }
}
