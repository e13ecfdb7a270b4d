//! One agent conversation: the tool-calling loop of agent-steps.md §3 against
//! an OpenAI-compatible provider, its tools executed under the sandbox policy.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};
use steppe_runtime::agent_work::{AgentMessage, AgentOutcome, AgentWork, ToolDef, TrajectoryEntry};
use steppe_runtime::budget::Ledger;
use steppe_runtime::outcome::StepError;
use tokio::sync::watch;

use crate::sink::{LineSink, Stream};
use crate::sandbox::SandboxPolicy;
use crate::tools::{custom_params, Space};

const DEFAULT_PERSONA: &str = "You are an automated agent running as one step of a CI pipeline job.";
const WRAP_UP: &str = "You have used your entire turn budget, and no further tool calls are possible. Answer now, using only what you have already gathered. If your investigation was incomplete, give your best answer and say plainly which parts you could not verify.";

/// `untrusted-` + 16 lowercase alphanumerics that do not occur in `text`.
fn untrusted_tag(text: &str) -> String {
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(7) as u64 ^ text.len() as u64;
    loop {
        let mut tag = String::from("untrusted-");
        for _ in 0..16 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let c = b"abcdefghijklmnopqrstuvwxyz0123456789"[(seed % 36) as usize];
            tag.push(c as char);
        }
        if !text.contains(&tag) {
            return tag;
        }
    }
}

/// sha256(name ‖ 0 ‖ args ‖ 0 ‖ result), each value written as JSON with
/// every object's keys in order (serde_json maps keep insertion order),
/// straight into the hash: a result is not copied to be sorted.
fn signature(name: &str, args: &Value, result: &Value) -> String {
    use sha2::Digest;
    // The hash is an `io::Write` (sha2's `std` feature).
    let mut h = sha2::Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    write_sorted(args, &mut h);
    h.update([0]);
    write_sorted(result, &mut h);
    format!("{:x}", h.finalize())
}

/// `v` as compact JSON, every object's keys in order.
fn write_sorted(v: &Value, out: &mut impl std::io::Write) {
    // A writer that cannot fail (the hash, a Vec): results are not checked.
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let _ = out.write_all(b"{");
            for (i, k) in keys.into_iter().enumerate() {
                let _ = out.write_all(if i == 0 { b"" } else { b"," });
                let _ = serde_json::to_writer(&mut *out, k);
                let _ = out.write_all(b":");
                write_sorted(&m[k], out);
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(a) => {
            let _ = out.write_all(b"[");
            for (i, e) in a.iter().enumerate() {
                let _ = out.write_all(if i == 0 { b"" } else { b"," });
                write_sorted(e, out);
            }
            let _ = out.write_all(b"]");
        }
        other => {
            let _ = serde_json::to_writer(out, other);
        }
    }
}

fn ok_result(r: &Value) -> bool {
    match r.get("exit_code").and_then(Value::as_i64) {
        Some(c) => c == 0,
        None => r.get("error").is_none(),
    }
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.as_f64().filter(|f| f.fract() == 0.0 && n.is_f64()).map(|f| format!("{f}")).unwrap_or_else(|| n.to_string()),
        other => other.to_string(),
    }
}

struct Conversation<'a> {
    work: &'a AgentWork,
    /// The source serving the conversation now (the primary, or a fallback after a failover).
    model: String,
    base_url: String,
    /// The HTTP client it talks to `base_url` with.
    client: crate::provider::Lease,
    string_tool_choice: bool,
    next_fallback: usize,
    /// The compaction budget of the fallback the conversation failed over to, not yet adopted.
    adopted_compact_budget: Option<u64>,
    /// When the step's deadline cuts the conversation off (a person is not waited on past it).
    deadline: Option<Instant>,
    label: String,
    sink: Arc<dyn LineSink>,
    /// Where each turn's tokens go, shared with the run's other steps.
    ledger: Option<Arc<dyn Ledger>>,
    /// This conversation's own turns' tokens, as added to the counters.
    charged: u64,
    run_id: String,
    key: Option<String>,
    tools: request::Offered,
    messages: Vec<Value>,
    out: AgentOutcome,
    /// The ledgers of the step's `stepgate:` servers, kept when they close.
    gate_ledgers: crate::tools::stepgate::Ledgers,
}

const TRANSCRIPT_CAP: usize = 256 * 1024;

impl Conversation<'_> {
    /// Appends to the transcript, each entry cut at 16 KiB, the whole at 256 KiB.
    fn record(&mut self, kind: &str, name: &str, content: &str) {
        let used: usize = self.out.transcript.iter().map(|e| e.content.len() + e.name.len()).sum();
        if used >= TRANSCRIPT_CAP {
            return;
        }
        let mut c = content.to_string();
        let limit = 16_384.min(TRANSCRIPT_CAP - used);
        if c.len() > limit {
            let mut cut = limit;
            while !c.is_char_boundary(cut) {
                cut -= 1;
            }
            c.truncate(cut);
        }
        self.out.transcript.push(steppe_runtime::agent_work::TranscriptEvent { kind: kind.into(), name: name.into(), content: c });
    }

    /// Narrates the conversation; the model chose these words and paths, so
    /// their control characters are shown, not passed to a terminal.
    fn say(&self, line: &str) {
        let line = steppe_runtime::secrets::mask(line);
        for l in line.lines() {
            self.sink.line(&self.run_id, &self.label, Stream::Stdout, &steppe_runtime::printable::escape_controls(l));
        }
    }

    /// With the job's shared counter: stops before a turn once the job's
    /// steps, here and on other workers, have spent its budget.
    async fn job_budget_left(&self) -> Result<(), StepError> {
        let (Some((cap, _)), Some(counter), Some(ledger)) = (self.work.job_budget, &self.work.job_counter, &self.ledger) else { return Ok(()) };
        let total = ledger.spend(counter, 0).await.map_err(|e| StepError::errored(format!("{}: reading the job's spending: {e}", self.label)))?;
        if total >= cap {
            return Err(StepError::errored(format!(
                "job budget exceeded: cap {cap} tokens, spent {total}\n  running total: earlier steps {} -> {} {} (stopped before its next turn)",
                total.saturating_sub(self.charged),
                self.work.agent,
                self.charged
            )));
        }
        Ok(())
    }

    /// Adds what a response (or a CLI invocation) spent to the step and the
    /// run's counters; errs when the step's or the job's budget is spent.
    async fn spend(&mut self, tokens: u64) -> Result<(), StepError> {
        self.out.tokens += tokens;
        let job_total = self.charge(tokens).await?;
        if let Some(cap) = self.work.budget_tokens {
            if self.out.tokens > cap {
                return Err(StepError::errored(format!("agent \"{}\": budget exceeded: cap {cap} tokens, spent {}", self.work.agent, self.out.tokens)));
            }
        }
        if let (Some((cap, _)), Some(total)) = (self.work.job_budget, job_total) {
            if total > cap {
                return Err(StepError::errored(format!(
                    "job budget exceeded: cap {cap} tokens, spent {total}\n  running total: earlier steps {} -> {} {} (tripped here)",
                    total.saturating_sub(self.charged),
                    self.work.agent,
                    self.charged
                )));
            }
        } else if let Some((cap, before)) = self.work.job_budget {
            let total = before + self.out.tokens;
            if total > cap {
                return Err(StepError::errored(format!(
                    "job budget exceeded: cap {cap} tokens, spent {total}\n  running total: earlier steps {before} -> {} {} (tripped here)",
                    self.work.agent, self.out.tokens
                )));
            }
        }
        Ok(())
    }

    /// Adds a turn's tokens to the run's counters; the job's new total, when
    /// it has a counter (None: the budget holds against the snapshot sent).
    async fn charge(&mut self, tokens: u64) -> Result<Option<u64>, StepError> {
        let Some(ledger) = self.ledger.clone() else { return Ok(None) };
        self.charged += tokens;
        let failed = |e: String| StepError::errored(format!("{}: recording the turn's {tokens} tokens: {e}", self.label));
        if let Some(counter) = &self.work.across_counter {
            if tokens > 0 {
                ledger.spend(counter, tokens).await.map_err(failed)?;
            }
        }
        match (&self.work.job_counter, self.work.job_budget) {
            (Some(counter), Some(_)) => ledger.spend(counter, tokens).await.map(Some).map_err(failed),
            _ => Ok(None),
        }
    }

}

/// Runs the conversation in `root` (the step's directory).
pub async fn run(work: &AgentWork, root: &Path, run_id: &str, sink: Arc<dyn LineSink>, ledger: Option<Arc<dyn Ledger>>, cancel: watch::Receiver<bool>) -> (Result<(), StepError>, AgentOutcome) {
    let label = work.agent.clone();
    let deadline = work.timeout_ms.map(Duration::from_millis);
    let fut = converse(work, root, run_id, sink, ledger, label.clone());
    let mut cancel = cancel;
    tokio::select! {
        r = fut => r,
        _ = crate::stop::deadline(deadline) => {
            let d = deadline.map(steppe_language::duration::show).unwrap_or_default();
            (Err(StepError::timed_out(format!("{label}: timed out after {d}"))), AgentOutcome::default())
        }
        _ = crate::stop::cancelled(&mut cancel) => (Err(StepError::aborted(format!("{label}: aborted"))), AgentOutcome::default()),
    }
}

type Conversing<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = (Result<(), StepError>, AgentOutcome)> + Send + 'a>>;

fn converse<'a>(work: &'a AgentWork, root: &'a Path, run_id: &'a str, sink: Arc<dyn LineSink>, ledger: Option<Arc<dyn Ledger>>, label: String) -> Conversing<'a> {
    Box::pin(converse_boxed(work, root, run_id, sink, ledger, label))
}

async fn converse_boxed(work: &AgentWork, root: &Path, run_id: &str, sink: Arc<dyn LineSink>, ledger: Option<Arc<dyn Ledger>>, label: String) -> (Result<(), StepError>, AgentOutcome) {
    let mut conv = Conversation {
        work,
        model: work.model.clone(),
        base_url: work.base_url.clone(),
        client: crate::provider::lease(&work.base_url),
        string_tool_choice: work.string_tool_choice,
        next_fallback: 0,
        adopted_compact_budget: None,
        deadline: work.timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms)),
        label: label.clone(),
        sink,
        ledger,
        charged: 0,
        run_id: run_id.to_string(),
        key: None,
        tools: Default::default(),
        messages: Vec::new(),
        out: AgentOutcome::default(),
        gate_ledgers: Default::default(),
    };
    let r = converse_inner(&mut conv, root).await;
    let mut out = std::mem::take(&mut conv.out);
    // Each gated procedure's ledger goes with the step's record, whole (it verifies only so).
    let ledgers = conv.gate_ledgers.lock().map(|mut l| std::mem::take(&mut *l)).unwrap_or_default();
    out.transcript.extend(ledgers.into_iter().map(|(name, content)| steppe_runtime::agent_work::TranscriptEvent { kind: "ledger".into(), name, content }));
    (r, out)
}

async fn converse_inner(conv: &mut Conversation<'_>, root: &Path) -> Result<(), StepError> {
    let work = conv.work;
    let label = conv.label.clone();
    // Preparation: working directory, messages, key, tools.
    let cwd = match &work.dir {
        Some(d) => root.join(d),
        None => root.to_path_buf(),
    };
    if !cwd.is_dir() {
        return Err(StepError::errored(format!("{label}: dir {} does not exist", work.dir.as_deref().unwrap_or("."))));
    }
    let policy = SandboxPolicy::new(root, &[]).map_err(|e| StepError::errored(format!("{label}: {e}")))?;
    // With an image, one container for every shell and custom tool call of
    // this conversation, holding the step's directory (removed with it).
    let toolbox = match &work.image {
        Some(image) => {
            let host_root = policy.write_root().to_path_buf();
            let say = |line: &str| conv.say(line);
            let tb = Box::pin(crate::container::toolbox::Toolbox::start(&label, &conv.run_id, image, &work.container, &work.env, &host_root, &say)).await;
            Some(std::sync::Arc::new(tb.map_err(|e| StepError::errored(format!("{label}: {e}")))?))
        }
        None => None,
    };
    // The policy resolved the step's directory once; a `dir:` below it may
    // hold a symlink of its own.
    let cwd = match &work.dir {
        Some(_) => cwd.canonicalize().unwrap_or(cwd),
        None => policy.write_root().to_path_buf(),
    };
    let space = Space { policy, cwd, env: work.env.clone(), toolbox };
    let mut user_messages = Vec::new();
    for m in &work.messages {
        match m {
            AgentMessage::Text(t) => user_messages.push(t.clone()),
            AgentMessage::Artifact { artifact, path } => {
                let p = format!("{artifact}/{path}");
                let full = space.policy.check_path("message_files", &p, root, crate::sandbox::Access::Read).map_err(|d| StepError::errored(format!("{label}: message file {p}: {}", d.reason)))?;
                let t = space.policy.read_text(&full).map_err(|e| StepError::errored(format!("{label}: message file {p}: {e}")))?;
                if t.trim().is_empty() {
                    return Err(StepError::errored(format!("{label}: message file {p} is empty")));
                }
                user_messages.push(t);
            }
        }
    }
    if user_messages.is_empty() {
        return Err(StepError::errored(format!("{label}: no messages to send")));
    }
    if let Some(var) = &work.api_key_env {
        match std::env::var(var).ok().filter(|v| !v.is_empty()) {
            Some(k) => {
                steppe_runtime::secrets::remember(&k);
                conv.key = Some(k)
            }
            None if work.key_required => return Err(StepError::errored(format!("{label}: the API key variable {var} is not set"))),
            None => {}
        }
    }
    // MCP servers granted to the step: connected now, or the step errs before its first request.
    let mcp_grants: Vec<&ToolDef> = work.tools.iter().filter(|t| matches!(t, ToolDef::Mcp { .. })).collect();
    let mcp = if mcp_grants.is_empty() {
        crate::tools::mcp::McpSessions::default()
    } else {
        let mut sessions = Box::pin(crate::tools::mcp::McpSessions::open(&work.mcp_servers, &mcp_grants, &space.cwd)).await.map_err(|e| StepError::errored(format!("{label}: {e}")))?;
        sessions.keep_ledgers(conv.gate_ledgers.clone());
        sessions
    };
    let defs: HashMap<String, ToolDef> = work.tools.iter().filter(|t| !matches!(t, ToolDef::Mcp { .. })).map(|t| (t.name().to_string(), t.clone())).collect();
    // Written once for every request; the values go when this block ends.
    conv.tools = {
        let mut tools: Vec<Value> = work.tools.iter().filter(|t| !matches!(t, ToolDef::Mcp { .. })).map(|t| schema_for(t, &work.verdicts)).collect();
        tools.extend(mcp.tools.iter().map(|t| t.schema()));
        if work.ask.is_some() {
            tools.push(json!({"type": "function", "function": {"name": "ask_user", "description": "Ask the person running the pipeline a question and wait for the answer. Offer options when the answer is one of a few.", "parameters": {"type": "object", "properties": {"question": {"type": "string"}, "options": {"type": "array", "items": {"type": "string"}}}, "required": ["question"]}}}));
        }
        for sub in &work.sub_agents {
            tools.push(json!({"type": "function", "function": {"name": sub.name, "description": sub.description, "parameters": {"type": "object", "properties": {"request": {"type": "string", "description": "The natural-language instruction or question to send to the sub-agent."}}, "required": ["request"]}}}));
        }
        if !work.verdicts.is_empty() {
            if defs.contains_key("verdict") {
                return Err(StepError::errored(format!("{label}: declares verdicts: but already defines a tool named \"verdict\"")));
            }
            tools.push(verdict_schema(&work.verdicts, work.note_required));
        }
        request::Offered::new(&tools)
    };
    let mut required: BTreeMap<String, bool> = work
        .tools
        .iter()
        .filter_map(|t| match t {
            ToolDef::Custom { name, required: true, .. } => Some((name.clone(), false)),
            _ => None,
        })
        .chain(mcp.tools.iter().filter(|t| t.required).map(|t| (t.name.clone(), false)))
        .collect();
    if !work.verdicts.is_empty() {
        required.insert("verdict".into(), false);
    }
    // The first request: one system message, synthetic context reads, the first user message.
    let mut system = format!(
        "{}\n\nYour working directory is {}. Use the tools available to you (all scoped to that directory) to complete the task described below. When finished, reply with a final plain-text message and no further tool calls.",
        if work.persona.trim().is_empty() { DEFAULT_PERSONA } else { work.persona.as_str() },
        space.cwd.display()
    );
    if let Some(ms) = work.timeout_ms {
        system.push_str(&format!("\nDeadline: this step has {} of wall-clock time in total; it is cut off when that runs out.", steppe_language::duration::show(Duration::from_millis(ms))));
    }
    conv.messages.push(json!({"role": "system", "content": system}));
    for (i, (sender, text)) in work.upstream.iter().enumerate() {
        let fence = untrusted_tag(text);
        let id = format!("upstream_{i}");
        conv.messages.push(json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_step", "arguments": json!({"step": sender}).to_string()}}]}));
        conv.messages.push(json!({"role": "tool", "tool_call_id": id, "content": json!({"content": format!("<{fence}>\n{text}\n</{fence}>")}).to_string()}));
    }
    for (i, p) in work.context_paths.iter().enumerate() {
        let full = space.policy.check_path("read_file", p, &space.cwd, crate::sandbox::Access::Read).map_err(|d| StepError::errored(format!("{label}: context path \"{p}\": {}", d.reason)))?;
        let mut text = space.policy.read_text(&full).map_err(|e| StepError::errored(format!("{label}: context path \"{p}\": {e}")))?;
        let max = work.max_context_bytes as usize;
        if max > 0 && text.len() > max {
            let n = text.len();
            let mut cut = max;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(&format!("\n\n[truncated: {p} is {n} bytes, and the first {cut} are shown. Use read_file with start_line/end_line to page through the rest.]"));
        }
        let id = format!("ctx_{i}");
        conv.messages.push(json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": json!({"path": p}).to_string()}}]}));
        conv.messages.push(json!({"role": "tool", "tool_call_id": id, "content": json!({"content": text}).to_string()}));
    }
    // The original request, restated after a compaction.
    let prompt = user_messages.first().cloned().unwrap_or_default();
    let mut pending_messages = user_messages.into_iter();
    if let Some(first) = pending_messages.next() {
        conv.messages.push(json!({"role": "user", "content": first}));
    }
    let started = Instant::now();
    let mut deadline_nudged = false;
    let mut forced: Option<String> = None;
    let (mut ignored_forces, mut nudges) = (0u32, 0u32);
    let mut toolset = Toolset { root, space, defs, mcp, calls_made: HashMap::new(), asked: HashMap::new(), required };
    // A CLI holds the conversation itself: the same system text, the
    // synthetic reads as context before the first message, the tools bridged.
    if let Some(cli) = &work.cli {
        let system = conv.messages.first().and_then(|m| m["content"].as_str()).unwrap_or_default().to_string();
        let mut first = cli::context_text(&conv.messages);
        first.push_str(&prompt);
        let mut prompts = vec![first];
        prompts.extend(pending_messages);
        let cx = opentelemetry::Context::current();
        return Box::pin(cli::converse(conv, &mut toolset, cli, &system, prompts, &cx)).await;
    }
    // Loop detection: signatures of the last 10 tool-executing turns.
    let mut window: std::collections::VecDeque<Vec<(String, String)>> = std::collections::VecDeque::new();
    let mut warned_loop = false;
    let mut turn = 0u32;
    let mut last_message = pending_messages.len() == 0;
    let mut compaction = compact::Compaction { budget: work.compact_budget, ..Default::default() };
    loop {
        if work.max_turns > 0 && turn >= work.max_turns {
            break;
        }
        if let (Some(ms), false) = (work.timeout_ms, deadline_nudged) {
            let total = Duration::from_millis(ms);
            if started.elapsed() > total.mul_f64(0.8) {
                deadline_nudged = true;
                let left = total.saturating_sub(started.elapsed());
                conv.say(&format!("nudge: four fifths of the {} deadline spent; asking the agent to wrap up", steppe_language::duration::show(total)));
                conv.messages.push(json!({"role": "user", "content": format!("Less than a fifth of this step's {} deadline is left (about {}). Wrap up: finish with what you have.", steppe_language::duration::show(total), steppe_language::duration::show(left))}));
            }
        }
        if let Some(budget) = conv.adopted_compact_budget.take() {
            compaction.budget = budget;
        }
        Box::pin(conv.maybe_compact(&mut compaction, &prompt)).await;
        turn += 1;
        conv.out.turns = turn;
        // The turn's span ends with this iteration (its context dropped).
        let turn_cx = crate::telemetry::start(&opentelemetry::Context::current(), &conv.run_id, format!("agent turn {turn}"), vec![opentelemetry::KeyValue::new("agent", conv.work.agent.clone())], None);
        let msg = opentelemetry::context::FutureExt::with_context(conv.request(true, forced.as_deref()), turn_cx.clone()).await?;
        let text = msg.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
        let calls: Vec<Value> = msg.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
        let mut assistant = json!({"role": "assistant"});
        if !text.is_empty() {
            assistant["content"] = json!(text);
        }
        let parsed: Vec<(String, String, Value)> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let id = c.get("id").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| format!("call_{}", i + 1));
                let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default().to_string();
                let raw = c.pointer("/function/arguments");
                let args = match raw {
                    Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object).unwrap_or_else(|| json!({})),
                    Some(v @ Value::Object(_)) => v.clone(),
                    _ => json!({}),
                };
                (id, name, args)
            })
            .collect();
        if !parsed.is_empty() {
            assistant["tool_calls"] = json!(parsed
                .iter()
                .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
                .collect::<Vec<_>>());
        }
        if !text.is_empty() || !parsed.is_empty() {
            conv.messages.push(assistant);
        }
        if !text.is_empty() {
            conv.say(&text);
            conv.record("text", "", &text);
        }
        if parsed.is_empty() {
            if !last_message {
                if let Some(next) = pending_messages.next() {
                    conv.messages.push(json!({"role": "user", "content": next}));
                }
                last_message = pending_messages.len() == 0;
                continue;
            }
            let unmet_f = unmet_files(root, &work.assert.files);
            let unmet_t = unmet_tool_calls(&work.assert.tool_calls, &conv.out.trajectory);
            if work.assert.nudge && nudges < 5 && (!unmet_f.is_empty() || unmet_t.is_some()) {
                nudges += 1;
                let nudge = if !unmet_f.is_empty() {
                    format!("You are trying to finish, but this step declared files it must leave behind and they are not there: {}. Your final message is not the deliverable — a later step of this pipeline reads these files, and text you write in this conversation reaches nobody. Write them now using the tools you have, then finish.", unmet_f.join("; "))
                } else {
                    format!("You are trying to finish, but this step declared calls it must make and they have not happened: {}. Make them now using the tools you have, then finish.", unmet_t.unwrap_or_default())
                };
                conv.say(&format!("nudge {nudges}/5: the agent tried to finish before its asserted {}", if unmet_f.is_empty() { "tool calls were made" } else { "files were written" }));
                conv.messages.push(json!({"role": "user", "content": nudge}));
                continue;
            }
            match toolset.required.iter().find(|(_, done)| !**done).map(|(n, _)| n.clone()) {
                None => {
                    conv.out.response = text;
                    return Ok(());
                }
                Some(n) => {
                    if forced.is_some() {
                        ignored_forces += 1;
                        if ignored_forces >= 5 {
                            let missing: Vec<&str> = toolset.required.iter().filter(|(_, d)| !**d).map(|(n, _)| n.as_str()).collect();
                            return Err(StepError::failed(format!("{label}: agent ignored a forced tool call 5 turns running; required tool(s) never succeeded: {}", missing.join(", "))));
                        }
                    }
                    conv.say(&format!("nudge: the agent tried to finish without a successful {n} call; forcing it"));
                    forced = Some(n);
                    continue;
                }
            }
        }
        forced = None;
        ignored_forces = 0;
        let mut turn_sigs: Vec<(String, String)> = Vec::new();
        for (id, name, args) in parsed {
            let result = Box::pin(call_tool(conv, &mut toolset, &name, &args, &turn_cx)).await?;
            turn_sigs.push((name.clone(), signature(&name, &args, &result)));
            conv.messages.push(json!({"role": "tool", "tool_call_id": id, "content": result.to_string()}));
        }
        window.push_back(turn_sigs);
        if window.len() > 10 {
            window.pop_front();
        }
        let mut counts: HashMap<&(String, String), usize> = HashMap::new();
        for sig in window.iter().flatten() {
            *counts.entry(sig).or_insert(0) += 1;
        }
        if let Some(((tool, _), _)) = counts.into_iter().find(|(_, n)| *n > 5) {
            if warned_loop {
                return Err(StepError::failed(format!("{label}: agent stuck in a loop: kept repeating an identical \"{tool}\" call after being warned")));
            }
            warned_loop = true;
            conv.say(&format!("nudge: the agent repeated an identical {tool} call more than 5 times in 10 turns; warning it once"));
            conv.messages.push(json!({"role": "user", "content": format!("You have called {tool} with identical arguments and received an identical result more than 5 times within the last 10 turns — you are stuck in a loop. Do something materially different, or finish with a final message explaining what is blocking you.")}));
        }
    }
    // Turn budget spent.
    let missing: Vec<&str> = toolset.required.iter().filter(|(_, d)| !**d).map(|(n, _)| n.as_str()).collect();
    if !missing.is_empty() {
        return Err(StepError::failed(format!("{label}: agent exceeded {} turns; required tool(s) never succeeded: {}", work.max_turns, missing.join(", "))));
    }
    conv.messages.push(json!({"role": "user", "content": WRAP_UP}));
    let msg = conv.request(false, None).await.map_err(|e| StepError::errored(format!("{label}: agent exceeded {} turns, and the request asking it to answer from what it had failed: {}", work.max_turns, e.message)))?;
    let text = msg.get("content").and_then(Value::as_str).unwrap_or_default().to_string();
    if text.trim().is_empty() {
        return Err(StepError::failed(format!("{label}: agent exceeded {} turns and produced none when asked to answer from what it had", work.max_turns)));
    }
    conv.say(&text);
    conv.record("text", "", &text);
    conv.out.response = text;
    conv.out.wrapped_up = true;
    Ok(())
}


mod ask;
mod bridge;
mod cli;
mod tool_call;
mod compact;
mod judge;
mod request;
mod schema;

pub use judge::judge;
pub use ask::person_is_answering;
use judge::{unmet_files, unmet_tool_calls};
use tool_call::{call_tool, Toolset};
use schema::{schema_for, verdict_schema};

#[cfg(test)]
mod tests {
    use super::*;

    /// A value is written as serializing it through sorted maps writes
    /// it, so a call's signature does not depend on its keys' order.
    #[test]
    fn a_signature_reads_values_with_their_keys_in_order() {
        fn through_sorted_maps(v: &Value) -> Value {
            match v {
                Value::Object(m) => serde_json::to_value(m.iter().map(|(k, v)| (k, through_sorted_maps(v))).collect::<BTreeMap<_, _>>()).unwrap(),
                Value::Array(a) => Value::Array(a.iter().map(through_sorted_maps).collect()),
                other => other.clone(),
            }
        }
        let v = json!({"z": [3, {"b": "\"q\"\n", "a": null}], "a": 1.5, "é": {"y": true, "x": -2}, "": []});
        let mut written = Vec::new();
        write_sorted(&v, &mut written);
        assert_eq!(String::from_utf8(written).unwrap(), through_sorted_maps(&v).to_string());
        let reordered = json!({"": [], "é": {"x": -2, "y": true}, "a": 1.5, "z": [3, {"a": null, "b": "\"q\"\n"}]});
        assert_eq!(signature("t", &v, &json!({"ok": 1})), signature("t", &reordered, &json!({"ok": 1})));
        assert_ne!(signature("t", &v, &json!({"ok": 1})), signature("t", &v, &json!({"ok": 2})));
        assert_ne!(signature("t", &json!({"a": "b"}), &json!({})), signature("t", &json!({"a": ""}), &json!({"b": {}})));
    }

    #[test]
    fn tool_call_subsequence_matching() {
        let t = |n: &str, a: Value| TrajectoryEntry { name: n.into(), args: a, ok: true };
        let got = vec![t("read_file", json!({"path": "a"})), t("write_file", json!({"path": "b", "n": 3})), t("read_file", json!({"path": "c"}))];
        let want = |v: Vec<(&str, Value)>| v.into_iter().map(|(n, a)| (n.to_string(), a.as_object().cloned().unwrap_or_default())).collect::<Vec<_>>();
        assert!(unmet_tool_calls(&want(vec![("read_file", json!({})), ("read_file", json!({"path": "c"}))]), &got).is_none());
        assert!(unmet_tool_calls(&want(vec![("write_file", json!({"n": 3}))]), &got).is_none());
        let m = unmet_tool_calls(&want(vec![("read_file", json!({"path": "c"})), ("write_file", json!({}))]), &got).unwrap();
        assert!(m.contains("no call matching \"write_file\"") && m.contains("got [read_file, write_file, read_file]"), "{m}");
    }
}
