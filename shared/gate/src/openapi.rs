//! An OpenAPI document's operations (§1.4): the arguments each takes (its
//! parameters and `body`, as the client is shown them) and the request a
//! call's arguments make.

use serde_json::{json, Map, Value};

use crate::schema::inline_refs;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    Path,
    Query,
    Header,
    Cookie,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub place: Place,
    pub required: bool,
    pub schema: Value,
    pub description: Option<String>,
    /// Query arrays repeat the name unless `explode: false` (comma-joined).
    pub explode: bool,
    /// A parameter that admits one value: hidden from the client, always sent.
    pub fixed: Option<Value>,
}

#[derive(Debug, Clone)]
pub struct Body {
    pub content_type: String,
    pub schema: Value,
    pub required: bool,
}

/// Where an operation's security puts an API key (`apiKey` schemes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPlace {
    Header(String),
    Query(String),
}

#[derive(Debug, Clone)]
pub struct Operation {
    pub id: String,
    pub method: String,
    pub path: String,
    pub description: Option<String>,
    pub params: Vec<Param>,
    pub body: Option<Body>,
    /// The API-key placement its security names, if any.
    pub key_place: Option<KeyPlace>,
}

/// An HTTP request a call makes, before egress control and credentials.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<(String, Vec<u8>)>,
}

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// Every operation with an `operationId` in `doc`, local `$ref`s inlined.
pub fn operations(doc: &Value) -> Result<Vec<Operation>, String> {
    let paths = doc.get("paths").and_then(Value::as_object).ok_or("the document has no paths")?;
    let schemes = doc.pointer("/components/securitySchemes").cloned().unwrap_or(Value::Null);
    let mut out = Vec::new();
    for (path, item) in paths {
        let item = inline_refs(item, doc, 0);
        let shared: Vec<Value> = item.get("parameters").and_then(Value::as_array).cloned().unwrap_or_default();
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let Some(id) = op.get("operationId").and_then(Value::as_str) else { continue };
            let mut params: Vec<Param> = Vec::new();
            for p in shared.iter().chain(op.get("parameters").and_then(Value::as_array).into_iter().flatten()) {
                let param = param(p).map_err(|e| format!("{id}: {e}"))?;
                params.retain(|q| !(q.name == param.name && q.place == param.place));
                params.push(param);
            }
            let body = op.get("requestBody").and_then(|b| {
                let content = b.get("content")?.as_object()?;
                let (ct, media) = content.iter().find(|(ct, _)| ct.contains("json")).or_else(|| content.iter().next())?;
                Some(Body { content_type: ct.clone(), schema: media.get("schema").cloned().unwrap_or(json!({})), required: b.get("required").and_then(Value::as_bool).unwrap_or(false) })
            });
            let security = op.get("security").or_else(|| doc.get("security"));
            let key_place = security.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_object).flat_map(|req| req.keys()).find_map(|name| {
                let s = schemes.get(name)?;
                if s.get("type").and_then(Value::as_str) != Some("apiKey") {
                    return None;
                }
                let n = s.get("name").and_then(Value::as_str)?.to_string();
                match s.get("in").and_then(Value::as_str)? {
                    "header" => Some(KeyPlace::Header(n)),
                    "query" => Some(KeyPlace::Query(n)),
                    _ => None,
                }
            });
            let description = op.get("description").or_else(|| op.get("summary")).and_then(Value::as_str).map(str::to_string);
            out.push(Operation { id: id.to_string(), method: method.to_uppercase(), path: path.clone(), description, params, body, key_place });
        }
    }
    Ok(out)
}

fn param(p: &Value) -> Result<Param, String> {
    let name = p.get("name").and_then(Value::as_str).ok_or("a parameter without a name")?.to_string();
    let place = match p.get("in").and_then(Value::as_str) {
        Some("path") => Place::Path,
        Some("query") => Place::Query,
        Some("header") => Place::Header,
        Some("cookie") => Place::Cookie,
        other => return Err(format!("parameter {name} is in {other:?}, not path, query, header or cookie")),
    };
    let schema = p.get("schema").cloned().unwrap_or(json!({}));
    let fixed = schema.get("const").cloned().or_else(|| match schema.get("enum").and_then(Value::as_array) {
        Some(one) if one.len() == 1 => Some(one[0].clone()),
        _ => None,
    });
    Ok(Param {
        required: place == Place::Path || p.get("required").and_then(Value::as_bool).unwrap_or(false),
        explode: p.get("explode").and_then(Value::as_bool).unwrap_or(true),
        description: p.get("description").and_then(Value::as_str).map(str::to_string),
        name,
        place,
        schema,
        fixed,
    })
}

impl Operation {
    /// The arguments the client passes: each parameter that is not fixed,
    /// and `body`.
    pub fn input_schema(&self) -> Value {
        let mut props = Map::new();
        let mut required = Vec::new();
        for p in self.params.iter().filter(|p| p.fixed.is_none()) {
            let mut s = p.schema.clone();
            if let (Some(d), Value::Object(m)) = (&p.description, &mut s) {
                m.entry("description").or_insert_with(|| json!(d));
            }
            props.insert(p.name.clone(), s);
            if p.required {
                required.push(json!(p.name));
            }
        }
        if let Some(b) = &self.body {
            props.insert("body".into(), b.schema.clone());
            if b.required {
                required.push(json!("body"));
            }
        }
        let mut s = json!({"type": "object", "properties": props});
        if !required.is_empty() {
            s["required"] = Value::Array(required);
        }
        s
    }

    /// The request `args` make against `server`.
    pub fn request(&self, server: &str, args: &Value) -> Result<Request, String> {
        let mut path = self.path.clone();
        let mut query: Vec<(String, String)> = Vec::new();
        let mut headers: Vec<(String, String)> = Vec::new();
        let mut cookies: Vec<String> = Vec::new();
        for p in &self.params {
            let Some(v) = p.fixed.as_ref().or_else(|| args.get(&p.name)).filter(|v| !v.is_null()) else {
                if p.required {
                    return Err(format!("{} needs {}", self.id, p.name));
                }
                continue;
            };
            match p.place {
                Place::Path => path = path.replace(&format!("{{{}}}", p.name), &encode_segment(&scalar(v))),
                Place::Query => match v {
                    Value::Array(items) if p.explode => query.extend(items.iter().map(|i| (p.name.clone(), scalar(i)))),
                    Value::Array(items) => query.push((p.name.clone(), items.iter().map(scalar).collect::<Vec<_>>().join(","))),
                    v => query.push((p.name.clone(), scalar(v))),
                },
                Place::Header => headers.push((p.name.clone(), scalar(v))),
                Place::Cookie => cookies.push(format!("{}={}", p.name, scalar(v))),
            }
        }
        if !cookies.is_empty() {
            headers.push(("cookie".into(), cookies.join("; ")));
        }
        let mut url = reqwest::Url::parse(&format!("{}{}", server.trim_end_matches('/'), path)).map_err(|e| format!("{}: {e}", self.id))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query.iter());
        }
        let body = match (&self.body, args.get("body")) {
            (Some(b), Some(v)) => {
                let raw = (b.content_type.starts_with("text/") || b.content_type.starts_with("message/")) && v.is_string();
                let bytes = if raw { v.as_str().unwrap_or_default().as_bytes().to_vec() } else { v.to_string().into_bytes() };
                Some((b.content_type.clone(), bytes))
            }
            _ => None,
        };
        Ok(Request { method: self.method.clone(), url: url.to_string(), headers, body })
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        json!({"openapi": "3.1.0", "paths": {
            "/items/{id}": {"get": {"operationId": "getItem", "security": [{"key": []}],
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}},
                               {"name": "tag", "in": "query", "schema": {"type": "array"}},
                               {"name": "v", "in": "query", "schema": {"const": "2"}}]}},
            "/notes": {"post": {"operationId": "addNote", "requestBody": {"required": true, "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "components": {"securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Api-Key"}}}})
    }

    #[test]
    fn operations_take_parameters_and_body_and_hide_fixed_ones() {
        let ops = operations(&doc()).unwrap();
        let get = ops.iter().find(|o| o.id == "getItem").unwrap();
        assert_eq!(get.key_place, Some(KeyPlace::Header("X-Api-Key".into())));
        assert_eq!(get.input_schema(), json!({"type": "object", "properties": {"id": {"type": "string"}, "tag": {"type": "array"}}, "required": ["id"]}));
        let r = get.request("http://127.0.0.1:9/v1/", &json!({"id": "K 1/2", "tag": ["a", "b"]})).unwrap();
        assert_eq!(r.url, "http://127.0.0.1:9/v1/items/K%201%2F2?tag=a&tag=b&v=2");
        let post = ops.iter().find(|o| o.id == "addNote").unwrap();
        let r = post.request("https://x.example", &json!({"body": "hello"})).unwrap();
        assert_eq!((r.method.as_str(), r.body), ("POST", Some(("text/plain".to_string(), b"hello".to_vec()))));
    }
}
