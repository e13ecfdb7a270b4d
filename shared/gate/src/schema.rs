//! JSON Schema checks of inputs, arguments and outputs (draft 2020-12), with
//! the stepfile's `$defs` in reach of every schema's `$ref`s.

use serde_json::{Map, Value};

/// A schema ready to check instances against.
pub struct Schema(jsonschema::Validator);

impl Schema {
    /// Compiles `schema`, giving it the stepfile's `defs` where it has none of its own.
    pub fn compile(schema: &Value, defs: Option<&Value>) -> Result<Schema, String> {
        let mut schema = schema.clone();
        if let (Value::Object(m), Some(defs)) = (&mut schema, defs) {
            m.entry("$defs").or_insert_with(|| defs.clone());
        }
        jsonschema::validator_for(&schema).map(Schema).map_err(|e| e.to_string())
    }

    /// Every way `instance` breaks the schema, each `<path> <message>` (path
    /// `/` for the whole value) in the words other Stepgate runtimes use
    /// (`/count must be integer`); empty when it passes.
    pub fn problems(&self, instance: &Value) -> Vec<String> {
        self.0
            .iter_errors(instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                format!("{} {}", if path.is_empty() { "/" } else { &path }, message(&e))
            })
            .collect()
    }
}

fn message(e: &jsonschema::ValidationError) -> String {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    match e.kind() {
        K::Required { property } => format!("must have required property '{}'", property.as_str().map_or_else(|| property.to_string(), str::to_string)),
        K::Type { kind: TypeKind::Single(t) } => format!("must be {t}"),
        K::Minimum { limit } => format!("must be >= {limit}"),
        K::Maximum { limit } => format!("must be <= {limit}"),
        K::ExclusiveMinimum { limit } => format!("must be > {limit}"),
        K::ExclusiveMaximum { limit } => format!("must be < {limit}"),
        K::MinLength { limit } => format!("must NOT have fewer than {limit} characters"),
        K::MaxLength { limit } => format!("must NOT have more than {limit} characters"),
        K::MinItems { limit } => format!("must NOT have fewer than {limit} items"),
        K::MaxItems { limit } => format!("must NOT have more than {limit} items"),
        K::MinProperties { limit } => format!("must NOT have fewer than {limit} properties"),
        K::MaxProperties { limit } => format!("must NOT have more than {limit} properties"),
        K::Pattern { pattern } => format!("must match pattern \"{pattern}\""),
        K::Format { format } => format!("must match format \"{format}\""),
        K::Enum { .. } => "must be equal to one of the allowed values".into(),
        K::Constant { .. } => "must be equal to constant".into(),
        K::AdditionalProperties { unexpected } => format!("must NOT have additional properties ({})", unexpected.join(", ")),
        K::UnevaluatedProperties { unexpected } => format!("must NOT have unevaluated properties ({})", unexpected.join(", ")),
        K::UniqueItems => "must NOT have duplicate items".into(),
        K::AnyOf { .. } => "must match a schema in anyOf".into(),
        K::OneOfNotValid { .. } | K::OneOfMultipleValid { .. } => "must match exactly one schema in oneOf".into(),
        K::Not { .. } => "must NOT be valid".into(),
        K::MultipleOf { multiple_of } => format!("must be multiple of {multiple_of}"),
        K::FalseSchema => "must NOT be present".into(),
        _ => e.to_string(),
    }
}

/// Checks `instance` against `schema` at once.
pub fn problems(schema: &Value, defs: Option<&Value>, instance: &Value) -> Result<Vec<String>, String> {
    Ok(Schema::compile(schema, defs)?.problems(instance))
}

/// `produces` without the properties Stepgate derives: what the client is
/// shown and what a submission is first checked against.
pub fn without(produces: &Value, derived: &[&String]) -> Value {
    let mut out = produces.clone();
    if derived.is_empty() {
        return out;
    }
    if let Some(Value::Object(props)) = out.get_mut("properties") {
        props.retain(|k, _| !derived.contains(&k));
    }
    if let Some(Value::Array(req)) = out.get_mut("required") {
        req.retain(|k| !k.as_str().is_some_and(|k| derived.iter().any(|d| d.as_str() == k)));
    }
    out
}

/// Inlines local `$ref`s (`#/…`) of `doc` into `v`, as a client is shown them.
pub fn inline_refs(v: &Value, doc: &Value, depth: usize) -> Value {
    match v {
        Value::Object(m) => {
            if let (Some(Value::String(r)), true) = (m.get("$ref"), depth < 32) {
                if let Some(target) = r.strip_prefix('#').and_then(|p| doc.pointer(p)) {
                    let mut merged: Map<String, Value> = match inline_refs(target, doc, depth + 1) {
                        Value::Object(t) => t,
                        other => return other,
                    };
                    for (k, x) in m.iter().filter(|(k, _)| k.as_str() != "$ref") {
                        merged.insert(k.clone(), inline_refs(x, doc, depth + 1));
                    }
                    return Value::Object(merged);
                }
            }
            Value::Object(m.iter().map(|(k, x)| (k.clone(), inline_refs(x, doc, depth + 1))).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| inline_refs(x, doc, depth + 1)).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn problems_name_where_and_what() {
        let s = json!({"type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}});
        assert!(problems(&s, None, &json!({"count": 2})).unwrap().is_empty());
        let p = problems(&s, None, &json!({"count": "x"})).unwrap();
        assert_eq!(p.len(), 1);
        assert_eq!(p, vec!["/count must be integer"]);
        let p = problems(&s, None, &json!({})).unwrap();
        assert_eq!(p, vec!["/ must have required property 'count'"]);
        let s = json!({"type": "object", "properties": {"n": {"minimum": 1}, "s": {"pattern": "^K-"}}});
        assert_eq!(problems(&s, None, &json!({"n": 0, "s": "X"})).unwrap(), vec!["/n must be >= 1", "/s must match pattern \"^K-\""]);
    }

    #[test]
    fn defs_reach_refs_and_derived_properties_leave_the_shown_schema() {
        let defs = json!({"id": {"type": "string", "pattern": "^K-"}});
        let s = json!({"type": "array", "items": {"$ref": "#/$defs/id"}});
        assert!(problems(&s, Some(&defs), &json!(["K-1"])).unwrap().is_empty());
        assert_eq!(problems(&s, Some(&defs), &json!(["X"])).unwrap().len(), 1);
        let produces = json!({"type": "object", "required": ["ids", "count"], "properties": {"ids": {}, "count": {}}});
        let count = "count".to_string();
        assert_eq!(without(&produces, &[&count]), json!({"type": "object", "required": ["ids"], "properties": {"ids": {}}}));
        let doc = json!({"components": {"schemas": {"Item": {"type": "object"}}}});
        assert_eq!(inline_refs(&json!({"items": {"$ref": "#/components/schemas/Item"}}), &doc, 0), json!({"items": {"type": "object"}}));
    }
}
