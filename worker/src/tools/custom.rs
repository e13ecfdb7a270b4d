//! Custom tools: a pipeline's `run:` template with the model's arguments (pinned ones win), run in the step's space.

use super::*;

/// Renders a custom tool's `run:` over `.args` and runs it.
pub async fn custom(space: &Space, def: &ToolDef, model_args: &Value) -> Value {
    let ToolDef::Custom { name, run, pinned, max_output_bytes, timeout_ms, literal, .. } = def else {
        return error("not a custom tool");
    };
    let cap = max_output_bytes.map(|m| m.min(10 << 20) as usize).unwrap_or(INLINE_CAP);
    if *literal {
        return space.shell(run, timeout_ms.map(Duration::from_millis), cap).await;
    }
    let mut args: Map<String, Value> = model_args.as_object().cloned().unwrap_or_default();
    for (k, v) in pinned {
        args.insert(k.clone(), v.clone());
    }
    let wanted = custom_params(run);
    let missing: Vec<String> = wanted
        .iter()
        .filter(|p| !pinned.contains_key(*p))
        .filter(|p| args.get(*p).is_none_or(|v| v.is_null() || v.as_str() == Some("")))
        .map(|p| format!("\"{p}\""))
        .collect();
    if !missing.is_empty() {
        return error(format!("{name}: missing required argument(s): {} (expected: {})", missing.join(", "), wanted.join(", ")));
    }
    let cmd = match steppe_language::template::render(run, &json!({ "args": Value::Object(args) })) {
        Ok(c) => c,
        Err(e) => return error(format!("{name}: {e}")),
    };
    space.shell(&cmd, timeout_ms.map(Duration::from_millis), cap).await
}

/// Each distinct `{{ .args.NAME … }}`, in first-seen order.
pub fn custom_params(run: &str) -> Vec<String> {
    let mut out = Vec::new();
    let re = regex::Regex::new(r"\.args\.([A-Za-z_][A-Za-z0-9_]*)").expect("static regex");
    for block in run.split("{{").skip(1) {
        let inner = block.split("}}").next().unwrap_or_default();
        for c in re.captures_iter(inner) {
            let n = c[1].to_string();
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}
