//! A stepfile (§1.1–§1.5) as loaded: its top level, settings, credentials,
//! tools and steps, and its identity.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Clone, Deserialize)]
pub struct Stepfile {
    pub stepgate: String,
    pub id: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub inputs: Value,
    pub settings: Option<BTreeMap<String, Setting>>,
    pub credentials: Option<BTreeMap<String, Credential>>,
    pub tools: Option<BTreeMap<String, Tool>>,
    pub steps: Vec<Step>,
    #[serde(rename = "$defs")]
    pub defs: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Setting {
    pub description: Option<String>,
    pub pattern: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Credential {
    pub kind: String,
    pub hosts: Vec<String>,
    pub description: String,
    pub scopes: Option<Vec<String>>,
    pub token_url: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    pub openapi: Option<Value>,
    pub mcp: Option<Value>,
    pub verifier: Option<Value>,
    pub credential: Option<String>,
    /// Names, or `{name, schema_sha256?, select?, effect?}` entries.
    pub exposes: Option<Vec<Value>>,
}

impl Tool {
    /// The URLs the tool names, each with its key (`openapi.server`,
    /// `openapi.url`, `mcp.url`, `verifier.url`), where requests go first.
    pub fn urls(&self) -> Vec<(&'static str, &str)> {
        fn at<'a>(part: &'a Option<Value>, key: &str) -> Option<&'a str> {
            part.as_ref().and_then(|p| p.get(key)).and_then(Value::as_str)
        }
        [("openapi.server", at(&self.openapi, "server")), ("openapi.url", at(&self.openapi, "url")), ("mcp.url", at(&self.mcp, "url")), ("verifier.url", at(&self.verifier, "url"))]
            .into_iter()
            .filter_map(|(k, u)| u.map(|u| (k, u)))
            .collect()
    }

    /// Where its requests go: the OpenAPI server, the MCP or verifier URL.
    pub fn endpoint(&self) -> Option<&str> {
        self.urls().into_iter().find(|(k, _)| *k != "openapi.url").map(|(_, u)| u)
    }
}

/// The `{{path}}` placeholders of instructions: each one's span in `text`
/// and its path.
pub fn placeholders(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = text[from..].find("{{").map(|i| from + i) {
        let Some(j) = text[i + 2..].find("}}").map(|j| i + 2 + j) else { break };
        out.push((i..j + 2, text[i + 2..j].trim()));
        from = j + 2;
    }
    out
}

#[derive(Debug, Clone, Deserialize)]
pub struct Step {
    pub id: String,
    pub instructions: Option<String>,
    #[serde(rename = "do")]
    pub do_: Option<Do>,
    pub tools: Option<Vec<String>>,
    pub produces: Value,
    pub gates: Option<Vec<Gate>>,
    pub retries: Option<i64>,
    pub derive: Option<serde_json::Map<String, Value>>,
    #[serde(rename = "let")]
    pub let_: Option<Value>,
    pub when: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Do {
    pub calls: Option<Vec<Call>>,
    pub output: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Call {
    pub id: String,
    pub operation: String,
    pub arguments: Option<Value>,
    pub each: Option<Value>,
    pub accept: Option<Vec<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Gate {
    pub id: String,
    pub message: Option<String>,
    pub explain: Option<Value>,
    pub schema: Option<Value>,
    pub predicate: Option<Value>,
    pub http: Option<HttpGate>,
    pub approve: Option<Approve>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HttpGate {
    pub tool: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Approve {
    pub message: String,
}

/// A loaded stepfile and its identity.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub stepfile: Stepfile,
    pub identity: String,
}

/// `StepfileInvalid`: every problem, each `file:line:col: path: message`.
#[derive(Debug, thiserror::Error)]
#[error("StepfileInvalid: {}", .issues.join("\n  "))]
pub struct Invalid {
    pub issues: Vec<String>,
}
