//! The JSON Schema of the pipeline format, derived from the model types.

use crate::model::Pipeline;

/// The schema as pretty JSON, for editors (`# yaml-language-server: $schema=…`).
pub fn pipeline_schema_json() -> String {
    let schema = schemars::schema_for!(Pipeline);
    serde_json::to_string_pretty(&schema).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    /// Every key (a property of an object schema, at any depth) whose schema
    /// carries no description, as `where.key` paths.
    fn undescribed(schema: &Value, at: &str, out: &mut Vec<String>) {
        let Some(o) = schema.as_object() else { return };
        if let Some(props) = o.get("properties").and_then(Value::as_object) {
            for (key, p) in props {
                let path = format!("{at}.{key}");
                if p.get("description").and_then(Value::as_str).is_none_or(|d| d.trim().is_empty()) {
                    out.push(path.clone());
                }
                undescribed(p, &path, out);
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(s) = o.get(key) {
                undescribed(s, &format!("{at}[]"), out);
            }
        }
        for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
            for s in o.get(key).and_then(Value::as_array).into_iter().flatten() {
                undescribed(s, at, out);
            }
        }
    }

    /// Editors show a key's description: every key of the schema has one.
    #[test]
    fn every_key_of_the_schema_has_a_description() {
        let schema: Value = serde_json::from_str(&super::pipeline_schema_json()).expect("the schema is JSON");
        let mut missing = Vec::new();
        let mut top = schema.clone();
        let defs = top.as_object_mut().and_then(|o| o.remove("$defs")).unwrap_or_default();
        undescribed(&top, "(top level)", &mut missing);
        let defs = defs.as_object().cloned().unwrap_or_default();
        assert!(defs.len() > 30, "the definitions were read: {defs:?}");
        let keys: usize = defs.values().filter_map(|d| d.get("properties").and_then(Value::as_object)).map(|p| p.len()).sum();
        assert!(keys > 200, "the keys were read ({keys})");
        for (name, def) in &defs {
            undescribed(def, name, &mut missing);
        }
        assert!(missing.is_empty(), "keys without a description (write a doc comment on the field): {missing:#?}");
    }

    #[test]
    fn an_undescribed_key_is_found_at_any_depth() {
        let schema = json!({"properties": {
            "a": {"description": "fine", "type": "object", "properties": {"b": {"type": "string"}}},
            "c": {"description": "  "},
            "d": {"description": "fine", "anyOf": [{"items": {"properties": {"e": true}}}, {"type": "null"}]}
        }});
        let mut missing = Vec::new();
        undescribed(&schema, "x", &mut missing);
        assert_eq!(missing, vec!["x.a.b", "x.c", "x.d[].e"]);
    }
}
