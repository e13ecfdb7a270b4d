//! One request to the model: the conversation so far, its tools and dials,
//! failover to the next source when the current one is unwell, tokens
//! charged to the step's and the job's budgets.

use serde_json::{json, Value};
use steppe_runtime::outcome::StepError;

use super::Conversation;
use crate::provider::ProviderError;

impl Conversation<'_> {
    pub(super) async fn request(&mut self, with_tools: bool, forced: Option<&str>) -> Result<Value, StepError> {
        // The body is written from the conversation as it stands (never
        // copied into a value of its own): model, messages, tools, dials.
        let mut extra = serde_json::Map::new();
        if let Some(f) = forced {
            extra.insert("tool_choice".into(), if self.string_tool_choice { json!("required") } else { json!({"type": "function", "function": {"name": f}}) });
        }
        if let Some(t) = self.work.temperature {
            extra.insert("temperature".into(), json!(t));
        }
        if let Some(t) = self.work.top_p {
            extra.insert("top_p".into(), json!(t));
        }
        if let Some(t) = self.work.max_tokens.filter(|t| *t > 0) {
            extra.insert("max_tokens".into(), json!(t));
        }
        if let Some(r) = &self.work.reasoning_effort {
            extra.insert("reasoning_effort".into(), json!(r.to_lowercase()));
        }
        let with_tools = with_tools && !self.tools.is_empty();
        self.job_budget_left().await?;
        let call_cx = crate::telemetry::start(&opentelemetry::Context::current(), &self.run_id, format!("model call {}", self.model), vec![opentelemetry::KeyValue::new("model", self.model.clone())], None);
        let resp = loop {
            // OpenRouter's prompt caching: a session per agent and run, a cache marker for Anthropic models.
            let openrouter = crate::provider::is_openrouter(&self.base_url);
            if openrouter && (self.model.starts_with("anthropic/") || self.model.starts_with("~anthropic/")) {
                extra.insert("cache_control".into(), json!({"type": "ephemeral"}));
            }
            let headers: Vec<(&str, &str)> = if openrouter && !self.work.session.is_empty() { vec![("x-session-id", self.work.session.as_str())] } else { Vec::new() };
            let say = |line: &str| self.say(line);
            let body = body(&self.model, &self.messages, with_tools.then_some(self.tools.json.as_str()), &extra);
            let answer = crate::provider::chat_with(&self.client, &self.base_url, self.key.as_deref(), &headers, &body, self.work.attempts, &say).await;
            match answer {
                Ok(r) => break r,
                // A CLI entry ends the cascade: a conversation cannot move into a CLI.
                Err(ProviderError::Unwell(m)) if self.work.fallbacks.get(self.next_fallback).is_some_and(|f| !f.model.starts_with('@')) => {
                    // Resume the same conversation on the next source: same history, same tools.
                    let fb = self.work.fallbacks[self.next_fallback].clone();
                    self.next_fallback += 1;
                    self.say(&format!("agent: {} failed over mid-run to {} ({m})", self.work.agent, fb.model));
                    self.model = fb.model.clone();
                    self.base_url = fb.base_url.clone();
                    self.client = crate::provider::lease(&self.base_url);
                    self.string_tool_choice = fb.string_tool_choice;
                    if fb.compact_budget > 0 {
                        self.adopted_compact_budget = Some(fb.compact_budget);
                    }
                    self.key = fb.api_key_env.as_ref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
                    if let Some(k) = &self.key {
                        steppe_runtime::secrets::remember(k);
                    }
                    if fb.key_required && self.key.is_none() {
                        return Err(StepError::errored(format!("{}: fallback {}: its API key variable is not set", self.label, fb.model)));
                    }
                    self.out.fallback_model = Some(self.model.clone());
                }
                Err(ProviderError::Unwell(m) | ProviderError::Refused(m) | ProviderError::Malformed(m)) => {
                    return Err(StepError::errored(format!("{}: model request failed: {m}", self.label)));
                }
            }
        };
        let usage = resp.get("usage");
        let tokens = usage
            .and_then(|u| u.get("total_tokens").and_then(Value::as_u64))
            .or_else(|| usage.map(|u| u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0) + u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0)))
            .unwrap_or(0);
        let finish = resp.pointer("/choices/0/finish_reason").and_then(Value::as_str);
        let served = self.model.clone();
        self.out.usage.add_response(&served, usage, finish);
        crate::telemetry::set(&call_cx, vec![opentelemetry::KeyValue::new("model", self.model.clone()), opentelemetry::KeyValue::new("tokens", i64::try_from(tokens).unwrap_or(i64::MAX))]);
        crate::telemetry::end(&call_cx, None);
        self.spend(tokens).await?;
        let msg = resp.pointer("/choices/0/message").cloned().ok_or_else(|| StepError::errored(format!("{}: the model's response has no choices", self.label)))?;
        Ok(msg)
    }
}

/// The tools a conversation offers its model, written once as the JSON
/// array every request carries (not kept as values: a conversation's
/// turns would walk them again, and 2,000 conversations hold them at once).
#[derive(Default)]
pub(super) struct Offered {
    pub(super) json: String,
}

impl Offered {
    pub(super) fn new(tools: &[Value]) -> Offered {
        // Values always serialize.
        Offered { json: serde_json::to_string(tools).unwrap_or_else(|_| "[]".into()) }
    }

    /// None offered: `[]`, or nothing written yet.
    pub(super) fn is_empty(&self) -> bool {
        self.json.len() <= 2
    }

    /// The tools as values again (the CLI's tool bridge lists them).
    pub(super) fn values(&self) -> Vec<Value> {
        serde_json::from_str(&self.json).unwrap_or_default()
    }
}

/// A chat completions request's body, its keys in this order: the model,
/// the messages, the tools (as written once), the dials.
fn body(model: &str, messages: &[Value], tools: Option<&str>, extra: &serde_json::Map<String, Value>) -> Vec<u8> {
    let mut b = Vec::with_capacity(64 + model.len() + tools.map_or(0, str::len) + 256 * messages.len());
    // Writing strings and values into a Vec cannot fail.
    b.extend_from_slice(b"{\"model\":");
    let _ = serde_json::to_writer(&mut b, model);
    b.extend_from_slice(b",\"messages\":");
    let _ = serde_json::to_writer(&mut b, messages);
    if let Some(t) = tools {
        b.extend_from_slice(b",\"tools\":");
        b.extend_from_slice(t.as_bytes());
    }
    for (k, v) in extra {
        b.push(b',');
        let _ = serde_json::to_writer(&mut b, k);
        b.push(b':');
        let _ = serde_json::to_writer(&mut b, v);
    }
    b.push(b'}');
    b
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    /// The body is the JSON a serializer would write of the same request,
    /// its keys in order, with and without tools and dials.
    #[test]
    fn a_body_is_the_request_as_json() {
        let messages = vec![json!({"role": "system", "content": "be \"brief\"\n"}), json!({"role": "user", "content": "héllo"})];
        let tools = vec![json!({"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})];
        let offered = super::Offered::new(&tools);
        assert!(!offered.is_empty());
        assert_eq!(offered.values(), tools);
        let mut extra = serde_json::Map::new();
        extra.insert("tool_choice".into(), json!("required"));
        extra.insert("temperature".into(), json!(0.5));
        let body = super::body("m/x", &messages, Some(&offered.json), &extra);
        let text = std::str::from_utf8(&body).unwrap();
        assert_eq!(serde_json::from_str::<Value>(text).unwrap(), json!({"model": "m/x", "messages": messages, "tools": tools, "tool_choice": "required", "temperature": 0.5}));
        assert!(text.starts_with(r#"{"model":"m/x","messages":[{"role":"system""#), "{text}");
        let keys: Vec<String> = serde_json::from_str::<serde_json::Map<String, Value>>(text).unwrap().keys().cloned().collect();
        assert_eq!(keys, ["model", "messages", "tools", "tool_choice", "temperature"]);
        let bare = super::body("m", &messages[1..], None, &serde_json::Map::new());
        assert_eq!(std::str::from_utf8(&bare).unwrap(), r#"{"model":"m","messages":[{"role":"user","content":"héllo"}]}"#);
        assert!(super::Offered::new(&[]).is_empty());
        assert!(super::Offered::default().is_empty());
    }
}
