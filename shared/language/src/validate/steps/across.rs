//! `across:` matrix axes (values or from_file, max_in_flight, budget) and the `{{ .vars.X }}` they fill.

use std::collections::HashSet;

use super::super::{is_artifact_name, Cx};
use crate::model::Step;

pub(super) fn check_across(cx: &mut Cx, s: &Step, across: &[crate::model::AcrossVar], path: &str) {
    let ap = format!("{path}.across");
    if across.is_empty() {
        cx.err(&ap, "across: must declare at least one var");
    }
    let mut vars = HashSet::new();
    let cells = across.iter().filter_map(|a| a.values.as_ref().map(Vec::len)).fold(1usize, usize::saturating_mul);
    if cells > crate::validate::MAX_ACROSS_CELLS {
        cx.err(&ap, format!("across: its values make {cells} cells; one across step runs at most {} (split it, or feed the values from a file in steps)", crate::validate::MAX_ACROSS_CELLS));
    }
    for (i, a) in across.iter().enumerate() {
        let p = format!("{ap}[{i}]");
        let Some(v) = a.var.as_deref().filter(|v| !v.is_empty()) else {
            cx.err(&p, format!("across[{i}] needs a var:"));
            continue;
        };
        if !vars.insert(v) {
            cx.err(&format!("{p}.var"), format!("across declares var \"{v}\" twice"));
        }
        match (&a.values, &a.from_file) {
            (None, None) => cx.err(&p, format!("across[{i}] ({v}) has no values: and no from_file:")),
            (Some(_), Some(_)) => cx.err(&p, format!("across[{i}] ({v}) sets both values: and from_file:; pick one")),
            (Some(vals), None) => {
                if vals.is_empty() {
                    cx.err(&format!("{p}.values"), format!("across[{i}] ({v}) has no values: (the list is empty)"));
                }
                for (k, val) in vals.iter().enumerate() {
                    if val.is_array() || val.is_object() || val.is_null() {
                        cx.err(&format!("{p}.values[{k}]"), format!("across[{i}] ({v}) values must be scalars"));
                    }
                }
                if !s.output_names().is_empty() {
                    let mut seen = HashSet::new();
                    for (k, val) in vals.iter().enumerate() {
                        let text = match val {
                            serde_json::Value::String(t) => t.clone(),
                            other => other.to_string(),
                        };
                        if !is_artifact_name(&text) {
                            cx.err(&format!("{p}.values[{k}]"), format!("across value \"{text}\" cannot name a collected output directory (letters, digits, . _ - only)"));
                        }
                        if !seen.insert(text.clone()) {
                            cx.err(&format!("{p}.values[{k}]"), format!("across value \"{text}\" appears twice; collected outputs need unique values per axis"));
                        }
                    }
                }
            }
            (None, Some(f)) => {
                if f.starts_with('/') || f.split('/').any(|seg| seg == "..") {
                    cx.err(&format!("{p}.from_file"), format!("from_file \"{f}\" must be a path inside an artifact produced earlier (no absolute paths or ..)"));
                }
            }
        }
    }
    let mut fields: Vec<(String, &str)> = Vec::new();
    if let Some(r) = &s.run { fields.push(("run".into(), r)); }
    if let Some(r) = &s.image { fields.push(("image".into(), r)); }
    if let Some(r) = &s.prompt { fields.push(("prompt".into(), r)); }
    if let Some(ms) = &s.messages { for (i, m) in ms.iter().enumerate() { fields.push((format!("messages[{i}]"), m)); } }
    if let Some(r) = &s.dir { fields.push(("dir".into(), r)); }
    if let Some(n) = s.name() { fields.push((s.kinds().first().map(|k| k.key()).unwrap_or("task").to_string(), n)); }
    if let Some(cp) = &s.context_paths { for (i, c) in cp.iter().enumerate() { fields.push((format!("context_paths[{i}]"), c)); } }
    for (key, text) in fields {
        for v in template_vars(text) {
            if !vars.contains(&v.as_str()) {
                cx.err(&format!("{path}.{}", key.split('[').next().unwrap_or(&key)), format!("{key} references {{{{ .vars.{v} }}}}, but across declares no var \"{v}\""));
            }
        }
    }
    let outputs = s.output_names();
    for o in outputs {
        if s.input_names().iter().any(|i| i == o) {
            cx.err(&format!("{path}.outputs"), format!("\"{o}\" is both an input and a collected output"));
        }
    }
    if s.outputs.is_none() && s.run.is_none() {
        if let Some(t) = s.task.as_deref().and_then(|t| cx.tasks.get(t)) {
            if t.outputs.as_ref().is_some_and(|o| !o.is_empty()) {
                cx.err(path, "an across: step collects only the outputs it declares itself; declare outputs: on the step (its tasks: entry's outputs are not collected)");
            }
        }
    }
    if s.max_in_flight.is_some_and(|m| m < 0) {
        cx.err(&format!("{path}.max_in_flight"), "max_in_flight must not be negative");
    }
}

/// `{{ .vars.X }}` names used in templated text.
pub(crate) fn template_vars(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else { break };
        let inner = &after[..close];
        let mut s = inner;
        while let Some(i) = s.find(".vars.") {
            let name: String = s[i + 6..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
            s = &s[i + 6..];
        }
        rest = &after[close + 2..];
    }
    out
}
