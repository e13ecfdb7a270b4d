//! The load-time rules about what a stepfile's parts may name (§1.2, §1.4,
//! §1.5): placeholders and `var steps.X` only to earlier steps, `let.X` only
//! to earlier lets (none in `when`), `responses.X` only to earlier calls,
//! `results` only where a client's calls exist, literal regexes that
//! compile, settings declared, used and only in hosts and ports, URLs that
//! are https (or http to loopback), a tool's host among its credential's.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::egress::loopback;
use crate::stepfile::{Step, Stepfile};

/// Every `var` path an expression reads (literal ones), and whether it uses `results`.
fn walk(rule: &Value, vars: &mut Vec<String>, results: &mut bool, regexes: &mut Vec<String>) {
    match rule {
        Value::Array(items) => items.iter().for_each(|r| walk(r, vars, results, regexes)),
        Value::Object(m) if m.len() == 1 => {
            let (op, arg) = m.iter().next().expect("one key");
            match op.as_str() {
                "literal" => {}
                "var" => match arg {
                    Value::String(p) => vars.push(p.clone()),
                    Value::Array(a) => {
                        if let Some(Value::String(p)) = a.first() {
                            vars.push(p.clone());
                        }
                        a.iter().skip(1).for_each(|r| walk(r, vars, results, regexes));
                    }
                    other => walk(other, vars, results, regexes),
                },
                "results" => {
                    *results = true;
                }
                "match_all" => {
                    if let Some(Value::String(re)) = arg.as_array().and_then(|a| a.get(1)) {
                        regexes.push(re.clone());
                    }
                    walk(arg, vars, results, regexes);
                }
                _ => walk(arg, vars, results, regexes),
            }
        }
        Value::Object(m) => m.values().for_each(|r| walk(r, vars, results, regexes)),
        _ => {}
    }
}

/// The scheme, authority and rest of a URL as written (placeholders kept).
fn split_url(url: &str) -> Option<(&str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some((scheme, &rest[..end], &rest[end..]))
}

/// Every broken rule, as (key path, message).
pub fn rules(doc: &Stepfile) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let declared: BTreeSet<&str> = doc.settings.iter().flat_map(|s| s.keys().map(String::as_str)).collect();
    let mut used: BTreeSet<String> = BTreeSet::new();
    let creds = doc.credentials.clone().unwrap_or_default();
    let url_rule = |path: String, url: &str, out: &mut Vec<(String, String)>, used: &mut BTreeSet<String>| -> Option<String> {
        let Some((scheme, authority, rest)) = split_url(url) else {
            out.push((path, format!("{url:?} is not a URL")));
            return None;
        };
        for p in crate::settings::placeholders(rest) {
            out.push((path.clone(), format!("setting {{{p}}} may fill a host or a port, never a path")));
        }
        for p in crate::settings::placeholders(authority) {
            if !declared.contains(p.as_str()) {
                out.push((path.clone(), format!("{{{p}}} is not a declared setting")));
            }
            used.insert(p);
        }
        match scheme {
            "https" => {}
            "http" if loopback(authority) => {}
            _ => out.push((path, format!("{url:?} must be https:// (http:// only to localhost, 127.0.0.1 or [::1])"))),
        }
        Some(authority.to_ascii_lowercase())
    };
    for (name, c) in &creds {
        for (j, h) in c.hosts.iter().enumerate() {
            for p in crate::settings::placeholders(h) {
                if !declared.contains(p.as_str()) {
                    out.push((format!("credentials.{name}.hosts[{j}]"), format!("{{{p}}} is not a declared setting")));
                }
                used.insert(p);
            }
        }
        if let Some(t) = &c.token_url {
            if !crate::settings::placeholders(t).is_empty() {
                out.push((format!("credentials.{name}.token_url"), "a token_url takes no settings".into()));
            }
            url_rule(format!("credentials.{name}.token_url"), t, &mut out, &mut used);
        }
    }
    for (name, t) in doc.tools.iter().flatten() {
        for (key, url) in t.urls() {
            let path = format!("tools.{name}.{key}");
            let authority = url_rule(path.clone(), url, &mut out, &mut used);
            // The endpoint is where the credential goes (a document's url is fetched without it).
            if let (true, Some(a), Some(c)) = (key != "openapi.url", authority, t.credential.as_ref().and_then(|c| creds.get(c))) {
                if !c.hosts.iter().any(|h| h.eq_ignore_ascii_case(&a)) {
                    out.push((path, format!("host {a} is not among the hosts of credential {}: {}", t.credential.as_deref().unwrap_or_default(), c.hosts.join(", "))));
                }
            }
        }
    }
    for (name, s) in doc.settings.iter().flatten() {
        if !used.contains(name) {
            out.push((format!("settings.{name}"), format!("setting {name} is declared but no host or port uses it")));
        }
        if let Some(p) = &s.pattern {
            if let Err(e) = crate::pattern::compile(p) {
                out.push((format!("settings.{name}.pattern"), format!("the pattern does not compile: {e}")));
            }
        }
    }
    for (i, step) in doc.steps.iter().enumerate() {
        step_rules(doc, i, step, &mut out);
    }
    out
}

fn step_rules(doc: &Stepfile, i: usize, step: &Step, out: &mut Vec<(String, String)>) {
    let p = format!("steps[{i}]");
    let earlier: Vec<&str> = doc.steps[..i].iter().map(|s| s.id.as_str()).collect();
    let agent = step.do_.is_none();
    let lets: Vec<&String> = match &step.let_ {
        Some(Value::Object(m)) => m.keys().collect(),
        _ => Vec::new(),
    };
    // Where an expression reads from, checked against what exists there.
    let check = |path: String, rule: &Value, let_upto: Option<usize>, results_ok: bool, responses: Option<&[&str]>, out: &mut Vec<(String, String)>| {
        let (mut vars, mut results, mut regexes) = (Vec::new(), false, Vec::new());
        walk(rule, &mut vars, &mut results, &mut regexes);
        if results && !results_ok {
            out.push((path.clone(), "results reads a client's calls, so it belongs only in an agent step's gates, let and derive".into()));
        }
        for re in regexes {
            if let Err(e) = crate::pattern::compile(&re) {
                out.push((path.clone(), format!("the pattern {re:?} does not compile: {e}")));
            }
        }
        for v in vars {
            let mut seg = v.split('.');
            match (seg.next(), seg.next()) {
                (Some("steps"), Some(id)) if !earlier.contains(&id) => {
                    let why = if doc.steps.iter().any(|s| s.id == id) { "a later step (or this one)" } else { "no step" };
                    out.push((path.clone(), format!("{v} names {why}; steps.X reads only earlier steps")));
                }
                (Some("let"), Some(name)) => match let_upto {
                    None => out.push((path.clone(), format!("{v}: let values do not exist here"))),
                    Some(n) if !lets[..n.min(lets.len())].iter().any(|l| l.as_str() == name) => out.push((path.clone(), format!("{v} reads no let defined before it"))),
                    _ => {}
                },
                (Some("responses"), Some(id)) => {
                    if let Some(r) = responses {
                        if !r.contains(&id) {
                            out.push((path.clone(), format!("{v} reads no earlier call of this step")));
                        }
                    }
                }
                _ => {}
            }
        }
    };
    if let Some(text) = &step.instructions {
        for (_, ph) in crate::stepfile::placeholders(text) {
            let mut seg = ph.split('.');
            match (seg.next(), seg.next()) {
                (Some("inputs"), _) => {}
                (Some("steps"), Some(id)) if earlier.contains(&id) => {}
                _ => out.push((format!("{p}.instructions"), format!("placeholder {{{{{ph}}}}} must read inputs or an earlier step"))),
            }
        }
    }
    if let Some(w) = &step.when {
        check(format!("{p}.when"), w, None, false, None, out);
    }
    for (j, g) in step.gates.iter().flatten().enumerate() {
        for (k, r) in [("predicate", &g.predicate), ("explain", &g.explain)] {
            if let Some(r) = r {
                check(format!("{p}.gates[{j}].{k}"), r, Some(lets.len()), agent, None, out);
            }
        }
    }
    for (k, r) in step.derive.iter().flatten() {
        check(format!("{p}.derive.{k}"), r, Some(lets.len()), agent, None, out);
    }
    if let Some(Value::Object(m)) = &step.let_ {
        for (n, (k, r)) in m.iter().enumerate() {
            check(format!("{p}.let.{k}"), r, Some(n), agent, None, out);
        }
    }
    if let Some(d) = &step.do_ {
        let ids: Vec<&str> = d.calls.iter().flatten().map(|c| c.id.as_str()).collect();
        for (j, c) in d.calls.iter().flatten().enumerate() {
            for (k, r) in [("arguments", &c.arguments), ("each", &c.each)] {
                if let Some(r) = r {
                    check(format!("{p}.do.calls[{j}].{k}"), r, None, false, Some(&ids[..j]), out);
                }
            }
        }
        check(format!("{p}.do.output"), &d.output, None, false, Some(&ids), out);
    }
}

#[cfg(test)]
mod tests {

    fn problems(yaml: &str) -> Vec<String> {
        match crate::load::load_str(yaml, std::path::Path::new("s.yaml")) {
            Ok(_) => Vec::new(),
            Err(e) => e.issues,
        }
    }

    const HEAD: &str = "stepgate: \"1\"\nid: t\ninputs: {type: object}\n";

    #[test]
    fn steps_lets_and_calls_are_read_only_where_they_exist() {
        let y = format!("{HEAD}steps:\n  - id: a\n    instructions: \"Use {{{{steps.b.x}}}}\"\n    produces: {{type: object}}\n    when: {{var: let.q}}\n    let: {{one: {{var: let.two}}, two: 1}}\n    gates: [{{id: g, message: m, predicate: {{var: steps.b.x}}}}]\n  - id: b\n    do:\n      calls: [{{id: c1, operation: op, arguments: {{x: {{var: responses.c2}}}}}}, {{id: c2, operation: op}}]\n      output: {{n: {{results: [op]}}}}\n    produces: {{type: object}}\ntools:\n  api:\n    openapi: {{server: \"https://api.example.com\", document: {{}}}}\n    exposes: [op]\n");
        let p = problems(&y);
        for want in [
            "steps[0].instructions: placeholder {{steps.b.x}} must read inputs or an earlier step",
            "steps[0].when: let.q: let values do not exist here",
            "steps[0].let.one: let.two reads no let defined before it",
            "steps[0].gates[0].predicate: steps.b.x names a later step (or this one)",
            "steps[1].do.calls[0].arguments: responses.c2 reads no earlier call of this step",
            "steps[1].do.output: results reads a client's calls",
        ] {
            assert!(p.iter().any(|i| i.contains(want)), "{want} in {p:#?}");
        }
    }

    #[test]
    fn settings_urls_and_credential_hosts_are_held_to_their_places() {
        let y = format!("{HEAD}settings:\n  site: {{description: d}}\n  unused: {{description: d}}\ncredentials:\n  k: {{kind: bearer, hosts: [\"{{site}}.example.com\"], description: d}}\ntools:\n  api:\n    openapi: {{server: \"https://other.example.com/{{site}}\", document: {{}}}}\n    credential: k\n    exposes: [op]\n  plain:\n    openapi: {{server: \"http://api.example.com\", document: {{}}}}\n    exposes: [op2]\n  local:\n    openapi: {{server: \"http://127.0.0.1:8080\", document: {{}}}}\n    exposes: [op3]\nsteps:\n  - id: a\n    instructions: Go.\n    produces: {{type: object}}\n    gates: [{{id: g, schema: {{type: object}}}}]\n");
        let p = problems(&y);
        for want in [
            "tools.api.openapi.server: setting {site} may fill a host or a port, never a path",
            "tools.api.openapi.server: host other.example.com is not among the hosts of credential k",
            "settings.unused: setting unused is declared but no host or port uses it",
            "tools.plain.openapi.server: \"http://api.example.com\" must be https://",
        ] {
            assert!(p.iter().any(|i| i.contains(want)), "{want} in {p:#?}");
        }
        assert!(!p.iter().any(|i| i.contains("tools.local")), "http to loopback is fine: {p:#?}");
    }
}
