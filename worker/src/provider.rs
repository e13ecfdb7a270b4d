//! OpenAI-compatible chat completions: one request, retried on connection
//! errors and 408/409/429/5xx (backoff attempt × 500 ms), nothing retried
//! underneath; 4xx other than those is final.

use std::time::Duration;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
pub enum ProviderError {
    /// Transport failures and retryable statuses, after every attempt.
    Unwell(String),
    /// A status no retry would change.
    Refused(String),
    /// A 2xx whose body is not a usable completion.
    Malformed(String),
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProviderError::Unwell(m) | ProviderError::Refused(m) | ProviderError::Malformed(m) => f.write_str(m),
        }
    }
}

/// The process-wide client: no retries of its own, 10-minute response timeout.
pub fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .timeout(Duration::from_secs(600))
                .build()
                .unwrap_or_else(|_| reqwest::Client::new())
        })
        .clone()
}

/// Whether `base_url` is OpenRouter's (its host or a subdomain), whose
/// requests carry a session id and, for Anthropic models, a cache marker.
pub fn is_openrouter(base_url: &str) -> bool {
    steppe_runtime::agent_work::url_host(base_url).is_some_and(|h| h == "openrouter.ai" || h.ends_with(".openrouter.ai"))
}

fn retryable(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || (500..600).contains(&status)
}

/// POSTs `body` to `<base_url>chat/completions`; returns the parsed response.
/// `retrying` hears each retry: why, and how long it waits first.
pub async fn chat(base_url: &str, key: Option<&str>, body: &Value, attempts: u32, retrying: &(dyn Fn(&str) + Sync)) -> Result<Value, ProviderError> {
    chat_with(base_url, key, &[], body, attempts, retrying).await
}

/// As [`chat`], with extra request headers.
pub async fn chat_with<B: serde::Serialize + ?Sized + Sync>(base_url: &str, key: Option<&str>, headers: &[(&str, &str)], body: &B, attempts: u32, retrying: &(dyn Fn(&str) + Sync)) -> Result<Value, ProviderError> {
    let url = format!("{base_url}chat/completions");
    let attempts = attempts.max(1);
    let mut last = String::new();
    for n in 1..=attempts {
        let mut req = client().post(&url).json(body);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        match req.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap_or_default();
                if (200..300).contains(&status) {
                    let mut v: Value = serde_json::from_str(&text).map_err(|e| ProviderError::Malformed(format!("{url}: the response is not JSON ({e}): {}", snippet(&text))))?;
                    repair_tool_arguments_in(&mut v);
                    return Ok(v);
                }
                last = format!("{url}: HTTP {status}: {}", snippet(&text));
                if !retryable(status) {
                    return Err(ProviderError::Refused(last));
                }
            }
            Err(e) => last = format!("{url}: {e}"),
        }
        if n < attempts {
            let wait = Duration::from_millis(500 * u64::from(n));
            retrying(&format!("model request failed ({}); retrying in {} (attempt {} of {attempts})", last, steppe_language::duration::show(wait), n + 1));
            tokio::time::sleep(wait).await;
        }
    }
    Err(ProviderError::Unwell(last))
}

fn snippet(s: &str) -> String {
    let s = s.trim();
    if s.len() > 300 {
        format!("{}…", &s[..s.char_indices().take_while(|(i, _)| *i < 300).last().map_or(0, |(i, c)| i + c.len_utf8())])
    } else {
        s.to_string()
    }
}

/// Repairs tool-call `arguments` strings that do not parse (a model that cut
/// its JSON short or wrapped it in prose): keep from the first `{`, close what
/// is open, drop trailing commas. Valid bodies pass through unchanged.
pub fn repair_tool_arguments(body: &str) -> String {
    let Ok(mut v) = serde_json::from_str::<Value>(body) else { return body.to_string() };
    if repair_tool_arguments_in(&mut v) { v.to_string() } else { body.to_string() }
}

/// As [`repair_tool_arguments`], on a parsed response; whether it changed.
pub fn repair_tool_arguments_in(v: &mut Value) -> bool {
    let mut changed = false;
    if let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) {
        for c in choices {
            let Some(calls) = c.pointer_mut("/message/tool_calls").and_then(Value::as_array_mut) else { continue };
            for call in calls {
                let Some(args) = call.pointer_mut("/function/arguments") else { continue };
                let Some(s) = args.as_str() else { continue };
                if serde_json::from_str::<Value>(s).is_ok() {
                    continue;
                }
                if let Some(fixed) = repair_json(s) {
                    *args = Value::String(fixed);
                    changed = true;
                }
            }
        }
    }
    changed
}

fn repair_json(s: &str) -> Option<String> {
    let start = s.find('{')?;
    let mut out = String::new();
    let mut stack = Vec::new();
    let (mut in_str, mut esc) = (false, false);
    for ch in s[start..].chars() {
        out.push(ch);
        if in_str {
            match (esc, ch) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match ch {
            '"' => in_str = true,
            '{' => stack.push('}'),
            '[' => stack.push(']'),
            '}' | ']' => {
                stack.pop();
                if stack.is_empty() {
                    break;
                }
            }
            _ => {}
        }
    }
    if in_str {
        out.push('"');
    }
    let trimmed = out.trim_end();
    let mut out = trimmed.to_string();
    if out.ends_with(':') {
        out.push_str("null");
    }
    while out.ends_with(',') {
        out.pop();
    }
    while let Some(c) = stack.pop() {
        out.push(c);
    }
    let out = regex::Regex::new(r",\s*([}\]])").ok()?.replace_all(&out, "$1").into_owned();
    serde_json::from_str::<Value>(&out).ok().filter(Value::is_object).map(|_| out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn openrouter_is_its_host_or_a_subdomain() {
        assert!(super::is_openrouter("https://openrouter.ai/api/v1/"));
        assert!(super::is_openrouter("https://eu.openrouter.ai/api/v1/"));
        assert!(!super::is_openrouter("https://notopenrouter.ai/v1/"));
        assert!(!super::is_openrouter("http://127.0.0.1:9/v1/"));
    }

    use super::*;

    #[test]
    fn repairs_truncated_and_wrapped_arguments() {
        assert_eq!(repair_json(r#"{"path": "a.txt""#).as_deref(), Some(r#"{"path": "a.txt"}"#));
        assert_eq!(repair_json(r#"Sure: {"a": [1, 2,"#).as_deref(), Some(r#"{"a": [1, 2]}"#));
        assert_eq!(repair_json(r#"{"a": "#).as_deref(), Some(r#"{"a":null}"#));
        let body = r#"{"choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"x","arguments":"{\"k\": 1,"}}]}}]}"#;
        let fixed: Value = serde_json::from_str(&repair_tool_arguments(body)).unwrap();
        assert_eq!(fixed.pointer("/choices/0/message/tool_calls/0/function/arguments").unwrap(), "{\"k\": 1}");
        let valid = r#"{"choices":[{"message":{"content":"hi"}}]}"#;
        assert_eq!(repair_tool_arguments(valid), valid);
    }
}
