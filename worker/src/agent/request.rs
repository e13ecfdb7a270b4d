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
            let body = Body { model: &self.model, messages: &self.messages, tools: with_tools.then_some(self.tools.as_slice()), extra: &extra };
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

/// A chat completions request, in the order its keys are written.
#[derive(serde::Serialize)]
struct Body<'a> {
    model: &'a str,
    messages: &'a [Value],
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a [Value]>,
    #[serde(flatten)]
    extra: &'a serde_json::Map<String, Value>,
}
