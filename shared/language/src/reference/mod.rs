//! docs/reference.md, the key reference: every key of the format rendered from the JSON Schema and the placement table.
//!
//! Each key's description, type, default and example come from the model's
//! doc comments and schema attributes (`crate::model`); which step kinds take
//! a step key comes from asking the placement table (`validate/steps/
//! placement.rs`) about a sample step of each kind. The prose sections are
//! the Markdown files beside this one; the built-in tables come from
//! `builtins` and `validate::unhonoured`. `UPDATE_REFERENCE=1 cargo test -p
//! steppe-language reference` rewrites docs/reference.md.

mod schema_view;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use crate::builtins;
use crate::model::StepKind;
use schema_view::{yaml, View};

const ENV: &str = include_str!("env.md");
const RUN: &str = include_str!("run.md");
const SCRIPTED: &str = include_str!("scripted.md");

/// The key reference as Markdown (what docs/reference.md holds).
pub fn markdown() -> String {
    let view = View::new();
    let sections = view.sections();
    let paths: BTreeMap<String, String> = sections.iter().cloned().collect();
    let mut out = String::new();
    out.push_str("# Key reference\n\n");
    out.push_str("<!-- Made from the model by `UPDATE_REFERENCE=1 cargo test -p steppe-language reference`: edit the doc comments in shared/language/src/model/ (and the notes in shared/language/src/reference/), not this file. -->\n\n");
    out.push_str("Every key of a pipeline file, with its type, default and meaning, as the loader decodes it ");
    out.push_str("(`steppe schema` prints the same as JSON Schema, for editors). A *duration* is Go-style (`30s`, `5m`, `1h30m`); ");
    out.push_str("a *size* is bytes or a number with `k`, `m`, `g` or `t` (`512m`). [language.md](language.md) introduces the language.\n\n");
    out.push_str("- [Top level](#top-level)\n");
    for (name, path) in &sections {
        let _ = writeln!(out, "- [{name}](#{}) — `{path}`", name.to_lowercase());
    }
    for extra in ["Built-in tools, profiles and providers", "Built-in resource types", "env:", "How run: runs", "The scripted model's when:", "Accepted, not yet acted on"] {
        let _ = writeln!(out, "- [{extra}](#{})", anchor(extra));
    }
    out.push('\n');

    out.push_str("## Top level\n\n");
    out.push_str("The keys of a pipeline file; anything else is an error.\n\n");
    table(&mut out, &view, &view.props(&view.root));

    for (name, _) in &sections {
        let Some(def) = view.def(name) else { continue };
        let _ = writeln!(out, "## {name}\n");
        if let Some(d) = def.get("description").and_then(Value::as_str) {
            let _ = write!(out, "{} ", one_line(d));
        }
        if name == "Step" {
            out.push_str("Steps are the items of `jobs[].plan`, the bodies of job and step hooks, and what `try`, `do`, `in_parallel`, `race` and `ensemble` hold.\n\n");
            steps(&mut out, &view, def);
            continue;
        }
        let places: Vec<String> = view.places(name, &paths).iter().map(|p| format!("`{p}`")).collect();
        let _ = writeln!(out, "Under {}.\n", places.join(", "));
        table(&mut out, &view, &view.props(def));
    }

    builtin_tables(&mut out);
    for (title, body) in [("env:", ENV), ("How run: runs", RUN), ("The scripted model's when:", SCRIPTED)] {
        let heading = match title {
            "env:" => "`env:`".to_string(),
            "How run: runs" => "How `run:` runs".to_string(),
            _ => "The scripted model's `when:`".to_string(),
        };
        let _ = writeln!(out, "## {heading}\n");
        out.push_str(&body.replace("{host_env}", &builtins::HOST_ENV.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")));
        out.push('\n');
    }
    out.push_str("## Accepted, not yet acted on\n\n");
    out.push_str("These keys load (so a pipeline written for the reference runner keeps working), and each one set is a warning at load; this build runs as if it were absent.\n\n");
    out.push_str("| key | what happens instead |\n|---|---|\n");
    for (key, why) in crate::validate::unhonoured::NOT_HONOURED {
        let _ = writeln!(out, "| `{key}` | {} |", cell(why));
    }
    out
}

/// The anchor GitHub gives a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Text made safe for a table cell.
fn cell(s: &str) -> String {
    one_line(s).replace('|', "\\|")
}

/// One row per key: type, default, meaning (with an example when the schema has one).
fn table(out: &mut String, view: &View, props: &[(&str, &Value)]) {
    out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
    for (key, p) in props {
        let _ = writeln!(out, "| `{key}` | {} | {} | {} |", cell(&view.type_of(p)), default_of(p), meaning(key, p));
    }
    out.push('\n');
}

fn default_of(p: &Value) -> String {
    p.get("default").map(|d| cell(&format!("`{}`", yaml(d)))).unwrap_or_default()
}

fn meaning(key: &str, p: &Value) -> String {
    let mut m = p.get("description").and_then(Value::as_str).map(one_line).unwrap_or_default();
    if let Some(e) = p.get("examples").and_then(Value::as_array).and_then(|e| e.first()) {
        let _ = write!(m, " Example: `{key}: {}`", yaml(e));
    }
    cell(&m)
}

/// The step keys: the kind keys, then every other key grouped by the kinds
/// the placement table lets take it.
fn steps(out: &mut String, view: &View, step: &Value) {
    let props = view.props(step);
    let kind_keys: Vec<&str> = StepKind::ALL.iter().map(|k| k.key()).collect();
    out.push_str("### Kinds\n\n");
    out.push_str("A step sets exactly one of these keys; the others modify it.\n\n");
    let kinds: Vec<(&str, &Value)> = props.iter().filter(|(k, _)| kind_keys.contains(k)).copied().collect();
    table(out, view, &kinds);
    out.push_str("Each group below lists the keys the placement table (`validate/steps/placement.rs`) lets those kinds take; ");
    out.push_str("set on a step of another kind, a key is a load error naming the rule. Where a step sits adds rules of its own ");
    out.push_str("(no get in a `do:`, a `try:` or a hook; no `context:` or `volatile:` on a hook; no `to:` on a member of a `do:` or an ensemble).\n\n");
    // Groups in the order their first key is declared.
    let mut groups: Vec<(Option<Vec<StepKind>>, Vec<String>, Vec<(&str, &Value)>)> = Vec::new();
    for (key, p) in props.iter().filter(|(k, _)| !kind_keys.contains(k)) {
        let (takes, said) = match view.placement(key) {
            Some((t, s)) => (Some(t), s),
            None => (None, Vec::new()),
        };
        // A key no kind takes alone means something only beside another key: its rule says which.
        let takes = takes.filter(|t| !t.is_empty());
        let said = if takes.is_none() { said } else { Vec::new() };
        // Every key that goes beside another is one group, its rules together.
        match groups.iter_mut().find(|(t, s, _)| *t == takes && (takes.is_none() || *s == said)) {
            Some((_, rules, keys)) => {
                for rule in said {
                    if !rules.contains(&rule) {
                        rules.push(rule);
                    }
                }
                keys.push((key, p));
            }
            None => groups.push((takes, said, vec![(key, p)])),
        }
    }
    for (takes, said, keys) in groups {
        let heading = match &takes {
            Some(t) => format!("Taken by {}", kinds_phrase(t)),
            None if !said.is_empty() => "Taken only beside another key".to_string(),
            None => "Placement not determined".to_string(),
        };
        let _ = writeln!(out, "### {heading}\n");
        if !said.is_empty() {
            out.push_str("The placement table says:\n\n");
            for rule in &said {
                let _ = writeln!(out, "- *{rule}*");
            }
            out.push('\n');
        }
        table(out, view, &keys);
    }
}

/// `get steps`, `task and agent steps`, `every kind of step but get`.
fn kinds_phrase(kinds: &[StepKind]) -> String {
    let all = StepKind::ALL;
    if kinds.len() == all.len() {
        return "every kind of step".into();
    }
    let missing: Vec<&str> = all.iter().filter(|k| !kinds.contains(k)).map(|k| k.key()).collect();
    if missing.len() < kinds.len() && missing.len() <= 2 {
        return format!("every kind of step but {}", list(&missing));
    }
    let names: Vec<&str> = kinds.iter().map(|k| k.key()).collect();
    format!("{} steps", list(&names))
}

fn list(words: &[&str]) -> String {
    match words {
        [] => String::new(),
        [one] => (*one).to_string(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// The built-in tools, profiles, providers and resource types, from `builtins`.
fn builtin_tables(out: &mut String) {
    out.push_str("## Built-in tools, profiles and providers\n\n");
    let _ = writeln!(
        out,
        "A bare name in a `tools:` grant is one of the built-in tools: {}. An agent without `tools:` (or with `tools: []`) is granted {}.\n",
        builtins::BUILTIN_TOOLS.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
        builtins::DEFAULT_TOOLS.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", "),
    );
    out.push_str("The built-in profiles are agents named `@builtin/<profile>`; an `agents:` entry of that name (which supplies the model) merges over one, its own keys winning.\n\n");
    out.push_str("| profile | what it is | max_turns | max_context_bytes | timeout | temperature | tools |\n|---|---|---|---|---|---|---|\n");
    for name in builtins::PROFILE_NAMES {
        let Some(p) = builtins::profile(name) else { continue };
        let tools: Vec<String> = p
            .tools
            .iter()
            .flatten()
            .map(|t| match t {
                crate::model::ToolGrant::Name(n) => format!("`{n}`"),
                crate::model::ToolGrant::Spec(s) => format!("sub-agent `{}`", s.agent.as_deref().unwrap_or("?")),
            })
            .collect();
        let num = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_else(|| "default".into());
        let _ = writeln!(
            out,
            "| `@builtin/{name}` | {} | {} | {} | {} | {} | {} |",
            cell(p.description.as_deref().unwrap_or_default()),
            num(p.max_turns),
            num(p.max_context_bytes),
            p.timeout.and_then(|t| t.to_std()).map(crate::duration::show).unwrap_or_else(|| "default".into()),
            p.temperature.map(|t| t.to_string()).unwrap_or_else(|| "—".into()),
            tools.join(", "),
        );
    }
    out.push('\n');
    out.push_str("`source.model` is `provider/model` (split at the first `/`), a bare model with `source.endpoint`, or `\"@claude/<model>\"` for the Claude CLI. The providers:\n\n");
    out.push_str("| prefix | base URL | API key variable | key required | `string_tool_choice` default |\n|---|---|---|---|---|\n");
    for p in builtins::PROVIDERS {
        let _ = writeln!(
            out,
            "| `{}/` | {} | {} | {} | {} |",
            p.prefix,
            p.base_url,
            p.key_env.map(|k| format!("`{k}`")).unwrap_or_else(|| "—".into()),
            if p.key_required { "yes" } else { "no" },
            p.string_tool_choice,
        );
    }
    out.push('\n');

    out.push_str("## Built-in resource types\n\n");
    out.push_str("These types exist in every pipeline unless a `resource_types:` entry of the same name replaces them. A resource of an unreplaced built-in type is checked at load: its `source:` takes only these keys, and the required ones must be set.\n\n");
    for t in builtins::BUILTIN_RESOURCE_TYPE_DOCS {
        let _ = writeln!(out, "### `{}`\n", t.name);
        let _ = write!(out, "{}", one_line(t.description));
        if let Some(def) = builtins::resource_type(t.name) {
            let c = def.config.clone().unwrap_or_default();
            let e = c.expr.clone().unwrap_or_default();
            let backend = if c.expr.is_some() { "`expr:`" } else { "shell" };
            let stages: Vec<&str> = [(c.check.is_some() || e.check.is_some(), "check"), (c.in_.is_some() || e.in_.is_some(), "in"), (c.out.is_some() || e.out.is_some(), "out")]
                .iter()
                .filter(|(set, _)| *set)
                .map(|(_, s)| *s)
                .collect();
            let env: Vec<String> = def.env.iter().flatten().map(|n| format!("`{n}`")).collect();
            let _ = write!(out, " Backend: {backend}; stages: {}; `env:` {}.", stages.join(", "), if env.is_empty() { "none".into() } else { env.join(", ") });
        }
        out.push_str("\n\n| `source:` key | required | meaning |\n|---|---|---|\n");
        for k in t.source {
            let _ = writeln!(out, "| `{}` | {} | {} |", k.key, if k.required { "yes" } else { "no" }, cell(k.description));
        }
        out.push('\n');
    }
}

#[cfg(test)]
mod tests;
