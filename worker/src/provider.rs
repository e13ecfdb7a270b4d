//! OpenAI-compatible chat completions: one request, retried on connection
//! errors and 408/409/429/5xx (backoff attempt × 500 ms), nothing retried
//! underneath; 4xx other than those is final.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
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

/// The client a conversation talks to its model with, held for as long as
/// it talks: no retries of its own, a 10-minute response timeout. Over TLS a
/// provider that offers HTTP/2 gets it, and the conversations holding one
/// client share its one connection per host; a base URL this process itself
/// serves with HTTP/2 (its scripted model, [`serving_http2`]) is spoken to so
/// from the first byte; any other is HTTP/1.1, a connection per request in
/// flight.
pub struct Lease {
    shared: Arc<Shared>,
}

struct Shared {
    client: reqwest::Client,
    http2_only: bool,
    holders: AtomicUsize,
}

impl Lease {
    pub fn client(&self) -> &reqwest::Client {
        &self.shared.client
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.holders.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Conversations on one client at most: its HTTP/2 connection carries a
/// stream for each one's request in flight, and a server allows some number
/// at once (100 is common); past it requests would wait for another's to
/// end, so the next conversations get a client (a connection) of their own,
/// as Go's transport opens another connection where a server's limit is met.
pub const CONVERSATIONS_PER_CLIENT: usize = 64;

/// The clients conversations hold, made as more are needed at once.
pub struct Clients {
    per_client: usize,
    made: Mutex<Vec<Arc<Shared>>>,
}

impl Clients {
    pub const fn new(per_client: usize) -> Clients {
        Clients { per_client, made: Mutex::new(Vec::new()) }
    }

    /// A client for talking to `base_url`: one that fewer than its share of
    /// conversations hold, or a new one.
    pub fn lease(&self, base_url: &str) -> Lease {
        let http2_only = served_with_http2(base_url);
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        let free = made.iter().find(|s| s.http2_only == http2_only && s.holders.load(Ordering::Relaxed) < self.per_client).cloned();
        let shared = free.unwrap_or_else(|| {
            let s = Arc::new(Shared { client: build(http2_only), http2_only, holders: AtomicUsize::new(0) });
            made.push(s.clone());
            s
        });
        shared.holders.fetch_add(1, Ordering::Relaxed);
        Lease { shared }
    }

    /// How many clients have been made (each its own connections).
    pub fn made(&self) -> usize {
        self.made.lock().map(|m| m.len()).unwrap_or(0)
    }
}

fn build(http2_only: bool) -> reqwest::Client {
    let b = reqwest::Client::builder().timeout(Duration::from_secs(600));
    let b = if http2_only { b.http2_prior_knowledge() } else { b };
    b.build().unwrap_or_else(|_| reqwest::Client::new())
}

/// The process's clients for models.
pub fn lease(base_url: &str) -> Lease {
    static CLIENTS: Clients = Clients::new(CONVERSATIONS_PER_CLIENT);
    CLIENTS.lease(base_url)
}

/// Base URLs this process serves with HTTP/2 from the first byte.
static HTTP2_SERVED: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Says that this process serves `base_url` with HTTP/2 without TLS (its
/// scripted model): conversations here speak HTTP/2 to it, as they do to a
/// provider that negotiates it, until the guard is dropped.
pub fn serving_http2(base_url: &str) -> Http2Served {
    HTTP2_SERVED.lock().unwrap_or_else(|p| p.into_inner()).push(base_url.to_string());
    Http2Served(base_url.to_string())
}

fn served_with_http2(base_url: &str) -> bool {
    HTTP2_SERVED.lock().unwrap_or_else(|p| p.into_inner()).iter().any(|u| u == base_url)
}

pub struct Http2Served(String);

impl Drop for Http2Served {
    fn drop(&mut self) {
        let mut served = HTTP2_SERVED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = served.iter().position(|u| *u == self.0) {
            served.swap_remove(i);
        }
    }
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
    chat_with(&lease(base_url), base_url, key, &[], &body.to_string().into_bytes(), attempts, retrying).await
}

/// As [`chat`], on a client the caller holds, with extra request headers;
/// `body` is the request's JSON as written.
pub async fn chat_with(
    client: &Lease,
    base_url: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &[u8],
    attempts: u32,
    retrying: &(dyn Fn(&str) + Sync),
) -> Result<Value, ProviderError> {
    let url = format!("{base_url}chat/completions");
    let attempts = attempts.max(1);
    let mut last = String::new();
    for n in 1..=attempts {
        let mut req = client.client().post(&url).header(reqwest::header::CONTENT_TYPE, "application/json").body(body.to_vec());
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
    fn a_client_is_shared_by_its_share_of_conversations_and_no_more() {
        let clients = super::Clients::new(2);
        let url = "http://127.0.0.1:9/v1/";
        let (a, b) = (clients.lease(url), clients.lease(url));
        assert_eq!(clients.made(), 1, "two conversations share a client");
        let c = clients.lease(url);
        assert_eq!(clients.made(), 2, "the third gets one of its own");
        drop(a);
        let d = clients.lease(url);
        assert_eq!(clients.made(), 2, "a place given back is taken again");
        assert!(std::ptr::eq(d.client(), b.client()) || std::ptr::eq(d.client(), c.client()));
        // A base URL served with HTTP/2 from the first byte gets clients of its own kind.
        let served = super::serving_http2(url);
        let e = clients.lease(url);
        assert_eq!(clients.made(), 3);
        drop((b, c, d, e, served));
    }

    /// Six conversations at once, two per client, against an HTTP/2 server
    /// that allows two streams at once on a connection: three connections,
    /// every request answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conversations_past_a_clients_share_talk_over_connections_of_their_own() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1/", listener.local_addr().unwrap());
        let (connections, versions) = (Arc::new(AtomicUsize::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
        let (seen, heard) = (connections.clone(), versions.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
                let heard = heard.clone();
                let app = axum::Router::new().route(
                    "/v1/chat/completions",
                    axum::routing::post(move |version: axum::http::Version| {
                        let heard = heard.clone();
                        async move {
                            heard.lock().unwrap().push(version);
                            // Long enough that all six are in flight at once.
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                            r#"{"choices":[{"message":{"role":"assistant","content":"ok"}}]}"#
                        }
                    }),
                );
                tokio::spawn(async move {
                    let mut http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new()).http2_only();
                    http.http2().max_concurrent_streams(2);
                    let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), hyper_util::service::TowerToHyperService::new(app)).await;
                });
            }
        });
        let _served = super::serving_http2(&url);
        let clients = super::Clients::new(2);
        let leases: Vec<super::Lease> = (0..6).map(|_| clients.lease(&url)).collect();
        let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let body = body.to_string().into_bytes();
        let answers = futures::future::join_all(leases.iter().map(|l| super::chat_with(l, &url, None, &[], &body, 1, &|_| {}))).await;
        for a in &answers {
            assert_eq!(a.as_ref().ok().and_then(|v| v.pointer("/choices/0/message/content")).and_then(|c| c.as_str()), Some("ok"), "{a:?}");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 3, "a connection per client");
        assert!(versions.lock().unwrap().iter().all(|v| *v == axum::http::Version::HTTP_2));
    }

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
