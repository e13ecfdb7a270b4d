//! The tool schemas a model is offered: each granted tool's parameters, and the verdict tool.

use super::*;

pub(super) fn schema_for(def: &ToolDef, verdicts: &[String]) -> Value {
    // A built-in tool's schema is the same for every conversation: made once.
    if let ToolDef::Builtin { name, allow, .. } = def {
        if name != "web_fetch" || allow.is_empty() {
            static MADE: std::sync::Mutex<Option<std::collections::HashMap<String, Value>>> = std::sync::Mutex::new(None);
            let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
            let made = made.get_or_insert_with(Default::default);
            if let Some(v) = made.get(name) {
                return v.clone();
            }
            let v = make_schema(def, verdicts);
            made.insert(name.clone(), v.clone());
            return v;
        }
    }
    make_schema(def, verdicts)
}

fn make_schema(def: &ToolDef, verdicts: &[String]) -> Value {
    let (name, description, params): (String, String, Value) = match def {
        ToolDef::Custom { name, description, run, pinned, literal, .. } => {
            let ps: Vec<String> = if *literal { Vec::new() } else { custom_params(run) }.into_iter().into_iter().filter(|p| !pinned.contains_key(p)).collect();
            let props: Map<String, Value> = ps.iter().map(|p| (p.clone(), json!({"type": "string"}))).collect();
            let mut schema = json!({"type": "object", "properties": props});
            if !ps.is_empty() {
                schema["required"] = json!(ps);
            }
            (name.clone(), description.clone(), schema)
        }
        ToolDef::Builtin { name, allow, .. } => {
            let (d, p) = match name.as_str() {
                "read_file" => ("Read a file in the working directory. Returns raw text (no line numbers); use start_line/end_line (1-based, inclusive) to page through a large file.", json!({"type":"object","properties":{"path":{"type":"string"},"start_line":{"type":"integer"},"end_line":{"type":"integer"}},"required":["path"]})),
                "list_dir" => ("List a directory (default: the working directory).", json!({"type":"object","properties":{"path":{"type":"string"}}})),
                "search_files" => ("Search files: pattern is a regular expression matched against lines, glob a shell pattern matched against paths (a slash-less glob matches the file name; ** only as a leading **/). output_mode: files_with_matches (default), content (path, line, text) or count.", json!({"type":"object","properties":{"pattern":{"type":"string"},"glob":{"type":"string"},"path":{"type":"string"},"output_mode":{"type":"string","enum":["files_with_matches","content","count"]},"head_limit":{"type":"integer"},"case_insensitive":{"type":"boolean"}}})),
                "run_shell" => ("Run a shell command (sh -c) in the working directory. Returns stdout, stderr and exit_code.", json!({"type":"object","properties":{"command":{"type":"string"}},"required":["command"]})),
                "write_file" => ("Write a UTF-8 text file (missing parent directories are created); with append: true, append to it.", json!({"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},"append":{"type":"boolean"}},"required":["path","content"]})),
                "edit_file" => ("Replace old_string (which must occur exactly once unless replace_all) with new_string in an existing file. Copy old_string from read_file output exactly.", json!({"type":"object","properties":{"path":{"type":"string"},"old_string":{"type":"string"},"new_string":{"type":"string"},"replace_all":{"type":"boolean"}},"required":["path","old_string","new_string"]})),
                "web_fetch" => ("HTTP GET a URL (http or https) and return {status, content_type, body, truncated}.", json!({"type":"object","properties":{"url":{"type":"string"}},"required":["url"]})),
                _ => ("", json!({"type":"object","properties":{}})),
            };
            let mut d = d.to_string();
            if name == "web_fetch" && !allow.is_empty() {
                d.push_str(&format!(" Only these hosts (and their subdomains) can be fetched: {}.", allow.join(", ")));
            }
            (name.clone(), d, p)
        }
        // Offered as the server's own tools once it is connected (tools/mcp.rs).
        ToolDef::Mcp { server, .. } => (server.clone(), String::new(), json!({"type": "object", "properties": {}})),
    };
    let _ = verdicts;
    json!({"type": "function", "function": {"name": name, "description": description, "parameters": params}})
}

pub(super) fn verdict_schema(vocab: &[String], note_required: bool) -> Value {
    let note = if note_required { "Required: a short reason. A later step of this pipeline reads it." } else { "Optional: a short reason for the audit log." };
    let mut required = vec!["choice"];
    if note_required {
        required.push("note");
    }
    json!({"type": "function", "function": {
        "name": "verdict",
        "description": "Emit your decision. Call this exactly once with your final verdict — it is how the pipeline decides which step runs next.",
        "parameters": {"type": "object", "properties": {
            "choice": {"type": "string", "enum": vocab, "description": "Your verdict — must be one of the allowed values."},
            "note": {"type": "string", "description": note}
        }, "required": required}
    }})
}
