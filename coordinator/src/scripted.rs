//! The scripted model (scripted-model.md): a real HTTP server on loopback
//! speaking OpenAI-compatible chat completions, answering from a scenario —
//! positional `turns`, or `rules` routed on what each request contains.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use steppe_language::duration::Duration as GoDuration;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Written into the pipeline's directory before the run.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// As if passed with --var.
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
    pub model: Option<Script>,
    pub fallback: Option<Script>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    pub turns: Option<Vec<Reply>>,
    pub rules: Option<Vec<Rule>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallSpec {
    pub name: String,
    pub args: Option<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reply {
    pub say: Option<String>,
    pub call: Option<String>,
    pub args: Option<Value>,
    pub calls: Option<Vec<CallSpec>>,
    pub status: Option<u16>,
    pub body: Option<String>,
    pub usage: Option<u64>,
    pub delay: Option<GoDuration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub when: Option<Cond>,
    pub say: Option<String>,
    pub call: Option<String>,
    pub args: Option<Value>,
    pub calls: Option<Vec<CallSpec>>,
    pub status: Option<u16>,
    pub body: Option<String>,
    pub usage: Option<u64>,
    pub delay: Option<GoDuration>,
}

impl Rule {
    fn reply(&self) -> Reply {
        Reply {
            say: self.say.clone(),
            call: self.call.clone(),
            args: self.args.clone(),
            calls: self.calls.clone(),
            status: self.status,
            body: self.body.clone(),
            usage: self.usage,
            delay: self.delay,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cond {
    pub tool_result_contains: Option<String>,
    pub has_tool_results: Option<bool>,
    pub last_role: Option<String>,
    pub called: Option<String>,
    pub offers_tool: Option<String>,
    pub forced_tool: Option<String>,
    pub user_contains: Option<String>,
    pub system_contains: Option<String>,
    pub request_contains: Option<String>,
    pub model: Option<String>,
    pub all: Option<Vec<Cond>>,
}

impl Cond {
    fn holds(&self, req: &Seen, raw: &str) -> bool {
        let msgs = req.messages();
        fn content(m: &SeenMessage) -> &str {
            m.content.as_ref().and_then(Value::as_str).unwrap_or_default()
        }
        fn role(m: &SeenMessage) -> &str {
            m.role.as_deref().unwrap_or_default()
        }
        let checks: [Option<bool>; 11] = [
            self.tool_result_contains.as_ref().map(|s| msgs.iter().any(|m| role(m) == "tool" && content(m).contains(s.as_str()))),
            self.has_tool_results.map(|want| msgs.iter().any(|m| role(m) == "tool") == want),
            self.last_role.as_ref().map(|r| msgs.last().is_some_and(|m| role(m) == r)),
            self.called.as_ref().map(|n| msgs.iter().any(|m| role(m) == "assistant" && m.tool_calls.iter().flatten().any(|c| c.function.as_ref().and_then(|f| f.name.as_deref()) == Some(n)))),
            self.offers_tool.as_ref().map(|n| req.tools.iter().flatten().any(|t| t.function.as_ref().and_then(|f| f.name.as_deref()) == Some(n))),
            self.forced_tool.as_ref().map(|n| req.tool_choice.as_ref().and_then(|c| c.pointer("/function/name")).and_then(Value::as_str) == Some(n)),
            self.user_contains.as_ref().map(|s| msgs.iter().any(|m| role(m) == "user" && content(m).contains(s.as_str()))),
            self.system_contains.as_ref().map(|s| msgs.iter().any(|m| role(m) == "system" && content(m).contains(s.as_str()))),
            self.request_contains.as_ref().map(|s| raw.contains(s.as_str())),
            self.model.as_ref().map(|m| req.model.as_deref() == Some(m)),
            self.all.as_ref().map(|all| all.iter().all(|c| c.holds(req, raw))),
        ];
        checks.iter().flatten().all(|b| *b)
    }
}

/// What the rules read of a request: the messages' roles, texts and calls'
/// names, the offered and forced tools' names, the model. The rest (the
/// tools' schemas, the calls' arguments) is passed over unbuilt: with
/// thousands of conversations the model parses thousands of requests a
/// second.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Seen {
    model: Option<String>,
    messages: Option<Vec<SeenMessage>>,
    tools: Option<Vec<SeenTool>>,
    tool_choice: Option<Value>,
    max_tokens: Option<Value>,
}

impl Seen {
    fn messages(&self) -> &[SeenMessage] {
        self.messages.as_deref().unwrap_or_default()
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SeenMessage {
    role: Option<String>,
    /// Text, or parts (then no rule's text matches it), or null.
    content: Option<Value>,
    tool_calls: Option<Vec<SeenTool>>,
}

/// A call or an offered tool: its function's name.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SeenTool {
    function: Option<SeenFunction>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SeenFunction {
    name: Option<String>,
}

/// Reads and strictly decodes a scenario file.
pub fn load(path: &Path) -> anyhow::Result<Scenario> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read scenario {}: {e}", path.display()))?;
    parse(&text, path)
}

/// A scenario from its text; `path` names it in errors.
pub fn parse(text: &str, path: &Path) -> anyhow::Result<Scenario> {
    let (node, problems) = steppe_language::yaml::parse(text, 0)
        .map_err(|e| anyhow::anyhow!("{}:{}:{}: invalid YAML: {}", path.display(), e.mark.line, e.mark.col, e.message))?;
    if let Some(p) = problems.first() {
        anyhow::bail!("{}:{}:{}: {}", path.display(), p.mark.line, p.mark.col, p.message);
    }
    let Some(node) = node else { return Ok(Scenario::default()) };
    let (s, problems) = steppe_language::de::decode::<Scenario>(&node, "");
    if !problems.is_empty() {
        let lines: Vec<String> = problems.iter().map(|p| format!("{}:{}:{}: {}: {}", path.display(), p.mark.line, p.mark.col, p.path, p.message)).collect();
        anyhow::bail!("invalid scenario:\n{}", lines.join("\n"));
    }
    s.ok_or_else(|| anyhow::anyhow!("invalid scenario {}", path.display()))
}

/// What a scripted model answers from and what it saw. The script is read
/// by every request at once; only the counters and the records change.
struct ServerState {
    script: Option<Script>,
    next_turn: AtomicUsize,
    served: AtomicUsize,
    /// Every request, kept only when they will be written out (`--dump-requests`).
    keep_requests: bool,
    requests: Mutex<Vec<Value>>,
    failures: Mutex<Vec<String>>,
}

/// A running scripted model: its URL and what it saw. It stops serving
/// when the last clone is dropped.
#[derive(Clone)]
pub struct ScriptedModel {
    pub base_url: String,
    state: Arc<ServerState>,
    _stop: Arc<StopOnDrop>,
}

struct StopOnDrop {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Conversations speak HTTP/2 to it while it serves.
    _http2: steppe_worker::provider::Http2Served,
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

impl ScriptedModel {
    /// Problems that make the scenario fail (exhaustion, unmatched requests).
    pub fn failures(&self) -> Vec<String> {
        self.state.failures.lock().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn requests(&self) -> Vec<Value> {
        self.state.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// `steppe preflight`'s probe (a one-token "hi" and nothing else), told
/// from a request by its whole body only when its parts look like one.
fn is_probe(req: &Seen, raw: &str) -> bool {
    let looks = req.max_tokens.as_ref().and_then(Value::as_i64) == Some(1)
        && req.tools.is_none()
        && req.tool_choice.is_none()
        && matches!(req.messages(), [m] if m.role.as_deref() == Some("user") && m.content.as_ref().and_then(Value::as_str) == Some("hi"));
    looks
        && serde_json::from_str::<Value>(raw).is_ok_and(|v| {
            v.as_object().is_some_and(|o| o.len() == 3 && o.get("messages") == Some(&json!([{"role": "user", "content": "hi"}])))
        })
}

fn summary(req: &Seen) -> String {
    let last_user = req.messages().iter().rev().find(|m| m.role.as_deref() == Some("user")).and_then(|m| m.content.as_ref()).and_then(Value::as_str).unwrap_or_default();
    let short: String = last_user.chars().take(80).collect();
    format!("model {}, {} message(s), last user message {:?}", req.model.as_deref().unwrap_or("?"), req.messages().len(), short)
}

fn usage(n: u64) -> Value {
    let prompt = n * 8 / 10;
    json!({"prompt_tokens": prompt, "completion_tokens": n - prompt, "total_tokens": n})
}

async fn answer(reply: Reply, model: &str, n: usize) -> Response {
    if let Some(d) = reply.delay.and_then(|d| d.to_std()) {
        tokio::time::sleep(d).await;
    }
    if let Some(status) = reply.status {
        let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return (code, axum::Json(json!({"error": {"message": format!("scripted status {status}"), "code": status}}))).into_response();
    }
    if let Some(body) = reply.body {
        return (StatusCode::OK, [("content-type", "application/json")], body).into_response();
    }
    let mut message = json!({"role": "assistant", "content": Value::Null});
    let mut finish = "stop";
    let calls: Vec<CallSpec> = match (reply.call, reply.calls) {
        (Some(name), _) => vec![CallSpec { name, args: reply.args }],
        (None, Some(cs)) => cs,
        _ => Vec::new(),
    };
    if !calls.is_empty() {
        finish = "tool_calls";
        message["tool_calls"] = json!(calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let args = match &c.args {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => v.to_string(),
                    None => "{}".into(),
                };
                json!({"id": format!("call_{}", i + 1), "type": "function", "function": {"name": c.name, "arguments": args}})
            })
            .collect::<Vec<_>>());
    } else {
        message["content"] = json!(reply.say.unwrap_or_default());
    }
    let mut body = json!({"id": format!("scripted-{n}"), "object": "chat.completion", "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}]});
    if let Some(u) = reply.usage {
        body["usage"] = usage(u);
    }
    (StatusCode::OK, axum::Json(body)).into_response()
}

async fn completions(State(st): State<Arc<ServerState>>, version: axum::http::Version, raw: String) -> Response {
    let req: Seen = match serde_json::from_str(&raw) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, axum::Json(json!({"error": format!("not a chat completions request in JSON: {e}")}))).into_response(),
    };
    let model = req.model.clone().unwrap_or_default();
    if is_probe(&req, &raw) {
        return answer(Reply { say: Some("ok".into()), ..Default::default() }, &model, 0).await;
    }
    if st.keep_requests {
        let whole: Value = serde_json::from_str(&raw).unwrap_or_default();
        if let Ok(mut kept) = st.requests.lock() {
            kept.push(json!({"model": model, "messages": whole.get("messages"), "tools": whole.get("tools"), "tool_choice": whole.get("tool_choice"), "raw": raw, "http": format!("{version:?}")}));
        }
    }
    let n = st.served.fetch_add(1, Ordering::Relaxed) + 1;
    let reply = match &st.script {
        None => Err("the scenario has no model: section, so no request was expected"),
        Some(Script { turns: Some(turns), .. }) => turns.get(st.next_turn.fetch_add(1, Ordering::Relaxed)).cloned().ok_or("scenario exhausted"),
        Some(Script { rules: Some(rules), .. }) => rules.iter().find(|r| r.when.as_ref().is_none_or(|c| c.holds(&req, &raw))).map(Rule::reply).ok_or("no rule matched"),
        Some(_) => Err("the scenario's model: has neither turns: nor rules:"),
    };
    let reply = match reply {
        Ok(r) => r,
        Err(why) => {
            if let Ok(mut f) = st.failures.lock() {
                f.push(format!("request {n} ({}): {why}", summary(&req)));
            }
            return (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(json!({"error": {"message": why}}))).into_response();
        }
    };
    // Not held through the reply's delay: thousands may wait at once.
    drop((req, raw));
    answer(reply, &model, n).await
}

/// Starts a scripted model on `addr` (port 0 for any free port);
/// `keep_requests`: every request is kept for [`ScriptedModel::requests`].
/// It speaks HTTP/1.1 and HTTP/2 without TLS (told apart by the first bytes
/// a connection sends), and this process's conversations speak HTTP/2 to
/// it, as they do to a provider that offers it over TLS.
pub async fn serve(script: Option<Script>, addr: std::net::SocketAddr, keep_requests: bool) -> anyhow::Result<ScriptedModel> {
    let state = Arc::new(ServerState { script, next_turn: AtomicUsize::new(0), served: AtomicUsize::new(0), keep_requests, requests: Mutex::new(Vec::new()), failures: Mutex::new(Vec::new()) });
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/chat/completions", post(completions))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("scripted model: binding {addr}: {e}"))?;
    let bound = listener.local_addr()?;
    let base_url = format!("http://{bound}/v1/");
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let http = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = &mut rx => break,
            };
            let stream = match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors, say: a moment before the next.
                Err(_) => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let (http, service) = (http.clone(), hyper_util::service::TowerToHyperService::new(app.clone()));
            tokio::spawn(async move {
                let _ = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service).await;
            });
        }
    });
    let _http2 = steppe_worker::provider::serving_http2(&base_url);
    Ok(ScriptedModel { base_url, state, _stop: Arc::new(StopOnDrop { stop: Some(tx), _http2 }) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cond(v: &Value) -> Cond {
        serde_json::from_value(v.clone()).expect("a condition")
    }

    fn seen(v: Value) -> (Seen, String) {
        let raw = v.to_string();
        (serde_json::from_str(&raw).expect("read as a request"), raw)
    }

    /// Rules see the shapes a provider accepts, not only steppe's own: text
    /// in parts, a null content or call list, a tool of another type, a
    /// forced tool named as an object or the word "required".
    #[test]
    fn rules_read_what_they_route_on_from_any_chat_request() {
        let (req, raw) = seen(json!({
            "model": "x/y",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "parts"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "the file's text"},
                {"role": "assistant", "content": "so", "tool_calls": null}
            ],
            "tools": [{"type": "web_search"}, {"type": "function", "function": {"name": "list_dir", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}],
            "tool_choice": {"type": "function", "function": {"name": "list_dir"}},
            "temperature": 0.2
        }));
        for (c, want) in [
            (json!({"called": "read_file"}), true),
            (json!({"called": "list_dir"}), false),
            (json!({"offers_tool": "list_dir"}), true),
            (json!({"offers_tool": "web_search"}), false),
            (json!({"forced_tool": "list_dir"}), true),
            (json!({"tool_result_contains": "file's"}), true),
            (json!({"has_tool_results": false}), false),
            (json!({"last_role": "assistant"}), true),
            (json!({"system_contains": "brief"}), true),
            (json!({"user_contains": "parts"}), false),
            (json!({"request_contains": "temperature"}), true),
            (json!({"model": "x/y"}), true),
            (json!({"all": [{"called": "read_file"}, {"model": "other"}]}), false),
        ] {
            assert_eq!(cond(&c).holds(&req, &raw), want, "{c}");
        }
        let (req, raw) = seen(json!({"model": "x/y", "messages": null, "tool_choice": "required"}));
        assert!(!cond(&json!({"forced_tool": "list_dir"})).holds(&req, &raw));
        assert!(cond(&json!({"has_tool_results": false})).holds(&req, &raw), "no messages: no tool results");
    }

    #[test]
    fn a_probe_is_its_three_keys_and_nothing_more() {
        let (req, raw) = seen(json!({"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}));
        assert!(is_probe(&req, &raw));
        let (req, raw) = seen(json!({"model": "x", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}));
        assert!(!is_probe(&req, &raw), "a fourth key: a request");
        let (req, raw) = seen(json!({"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}));
        assert!(!is_probe(&req, &raw));
    }

    #[test]
    fn a_body_that_is_no_chat_request_is_refused_not_matched() {
        for body in ["not json", "{\"messages\": \"text\"}", "{\"model\": 5}"] {
            assert!(serde_json::from_str::<Seen>(body).is_err(), "{body}");
        }
    }
}
