//! `stepgate_inspect_api`: what a stepfile author needs of a public API,
//! read without credentials — an OpenAPI document's digest, servers,
//! security schemes and operations, or an MCP server's tools and their pins.

use std::time::Duration;

use serde_json::Value;

use crate::egress::{host_of, Egress};
use crate::error::GateError;
use crate::jcs::{digest, digest_json};

/// Most operationIds listed.
const LISTED: usize = 150;

/// Answers `stepgate_inspect_api {kind, url, search?, operations?}`.
pub async fn inspect(args: &Value, timeout: Duration, response_bytes: usize) -> Result<String, GateError> {
    let kind = args.get("kind").and_then(Value::as_str).unwrap_or_default();
    let url = args.get("url").and_then(Value::as_str).unwrap_or_default();
    crate::authoring::public(url).map_err(|e| GateError::new("UrlNotPublic", format!("{e}; stepgate_inspect_api reads public https APIs only")))?;
    let host = reqwest::Url::parse(url).ok().and_then(|u| host_of(&u)).unwrap_or_default();
    let egress = Egress::new(vec![host], timeout, response_bytes, None)?;
    match kind {
        "openapi" => {
            let req = crate::openapi::Request { method: "GET".into(), url: url.to_string(), headers: Vec::new(), body: None };
            let a = egress.send(&req, None, true, url, &mut Vec::new()).await?;
            if !(200..300).contains(&a.status) {
                return Err(GateError::new("ApiDocumentInvalid", format!("{url} answered HTTP {}", a.status)));
            }
            let doc = crate::load::document(&String::from_utf8_lossy(&a.body))
                .ok()
                .filter(|d| !d.is_null())
                .ok_or_else(|| GateError::new("ApiDocumentInvalid", format!("{url} is not a JSON or YAML document")))?;
            Ok(describe_openapi(&doc, &digest(&a.body), args))
        }
        "mcp" => {
            let client = crate::tools::connect("inspected", url, None, &egress).await.map_err(|e| GateError::new("ToolCallFailed", e))?;
            let listed = client.list_all_tools().await.map_err(|e| GateError::new("ToolCallFailed", format!("tools/list: {e}")))?;
            let _ = client.cancel().await;
            let lines: Vec<String> = listed
                .iter()
                .map(|t| format!("- {}: {}\n  schema_sha256: {}", t.name, t.description.as_deref().unwrap_or_default(), digest_json(&Value::Object((*t.input_schema).clone()))))
                .collect();
            Ok(format!("MCP server {url}: {} tool(s)\n{}", listed.len(), lines.join("\n")))
        }
        other => Err(GateError::new("ToolCallFailed", format!("kind {other:?} is not openapi or mcp"))),
    }
}

/// An OpenAPI document as an author reads it.
pub fn describe_openapi(doc: &Value, sha256: &str, args: &Value) -> String {
    let mut out = vec![format!("sha256: {sha256}")];
    let servers: Vec<&str> = doc.get("servers").and_then(Value::as_array).into_iter().flatten().filter_map(|s| s.get("url").and_then(Value::as_str)).collect();
    out.push(format!("servers: {}", if servers.is_empty() { "none (set tools.X.openapi.server)".into() } else { servers.join(", ") }));
    let schemes: Vec<String> = doc
        .pointer("/components/securitySchemes")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k} ({}{})", v.get("type").and_then(Value::as_str).unwrap_or("?"), v.get("in").and_then(Value::as_str).map(|i| format!(" in {i}")).unwrap_or_default()))
        .collect();
    out.push(format!("security schemes: {}", if schemes.is_empty() { "none".into() } else { schemes.join(", ") }));
    let ops = crate::openapi::operations(doc).unwrap_or_default();
    let search = args.get("search").and_then(Value::as_str).map(str::to_lowercase);
    let found: Vec<&crate::openapi::Operation> = ops
        .iter()
        .filter(|o| search.as_ref().is_none_or(|s| o.id.to_lowercase().contains(s) || o.path.to_lowercase().contains(s) || o.description.as_deref().unwrap_or_default().to_lowercase().contains(s)))
        .collect();
    out.push(format!("operations ({} of {}{}):", found.len().min(LISTED), ops.len(), search.as_ref().map(|s| format!(" matching {s:?}")).unwrap_or_default()));
    out.extend(found.iter().take(LISTED).map(|o| format!("- {} ({} {}){}", o.id, o.method, o.path, o.description.as_deref().map(|d| format!(": {d}")).unwrap_or_default())));
    let mut unnamed = Vec::new();
    for (path, item) in doc.get("paths").and_then(Value::as_object).into_iter().flatten() {
        for m in ["get", "put", "post", "delete", "options", "head", "patch", "trace"] {
            if item.get(m).is_some_and(|op| op.get("operationId").is_none()) {
                unnamed.push(format!("{} {path}", m.to_uppercase()));
            }
        }
    }
    if !unnamed.is_empty() {
        out.push(format!("without an operationId (not exposable): {}", unnamed.join(", ")));
    }
    for name in args.get("operations").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str) {
        match ops.iter().find(|o| o.id == name) {
            Some(o) => out.push(format!("{name} arguments: {}", o.input_schema())),
            None => out.push(format!("{name}: no such operationId")),
        }
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_document_is_described_with_what_an_author_exposes() {
        let doc = json!({"servers": [{"url": "https://api.example.com/v1"}], "components": {"securitySchemes": {"key": {"type": "apiKey", "in": "header", "name": "X-Key"}}},
            "paths": {"/items/{id}": {"get": {"operationId": "getItem", "summary": "One item.", "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]}},
                      "/health": {"get": {}}}});
        let d = describe_openapi(&doc, "sha256:ab", &json!({"search": "item", "operations": ["getItem", "nope"]}));
        assert!(d.contains("servers: https://api.example.com/v1") && d.contains("security schemes: key (apiKey in header)"), "{d}");
        assert!(d.contains("- getItem (GET /items/{id}): One item.") && d.contains("without an operationId (not exposable): GET /health"), "{d}");
        assert!(d.contains("getItem arguments: {\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\"}},\"required\":[\"id\"]}") && d.contains("nope: no such operationId"), "{d}");
    }
}
