//! A CLI-backed agent (`@claude/<model>`, agent-steps §5.9): the CLI holds
//! the conversation as a subprocess, every granted tool served to it by the
//! loopback bridge; its stream-json transcript is read as it comes, its init
//! event attested against the grant, and an attempt that dies without a
//! result is resumed in the same session.

use std::collections::{BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::{json, Value};
use steppe_runtime::agent_work::{CliWork, TrajectoryEntry, Usage};
use steppe_runtime::outcome::StepError;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

use super::bridge::{self, BridgeCall};
use super::{call_tool, unmet_files, unmet_tool_calls, Conversation, Toolset};

/// How a bridged tool is named to the CLI (`mcp__<server>__<tool>`).
const PREFIX: &str = "mcp__steps__";

/// How one invocation of the CLI ended.
enum Ended {
    /// It reported a result: its final text, and whether it says the task failed.
    Result { text: String, is_error: bool },
    /// It could not start, exited non-zero or died without a result: why.
    Crashed(String),
}

/// What the invocations of one step share.
struct Session {
    id: String,
    config: PathBuf,
    /// `mcp__steps__<tool>` for every tool the step is granted.
    bridged: Vec<String>,
    invocations: u32,
    cap: u32,
    turns: u32,
    spent_usd: f64,
    resumed: bool,
    key: Option<String>,
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
        forget_transcript(&self.id);
    }
}

/// A v4 UUID from the system's randomness.
fn uuid_v4() -> std::io::Result<String> {
    let mut h: Vec<char> = bridge::random_hex(16)?.chars().collect();
    h[12] = '4';
    h[16] = ['8', '9', 'a', 'b'][h[16].to_digit(16).unwrap_or(0) as usize % 4];
    let s: String = h.into_iter().collect();
    Ok(format!("{}-{}-{}-{}-{}", &s[0..8], &s[8..12], &s[12..16], &s[16..20], &s[20..32]))
}

/// The CLI keeps each session's transcript under `~/.claude/projects/*/`;
/// a step's is removed with the step.
fn forget_transcript(session: &str) {
    let Some(home) = std::env::var_os("HOME") else { return };
    let Ok(projects) = std::fs::read_dir(Path::new(&home).join(".claude").join("projects")) else { return };
    for p in projects.flatten() {
        let _ = std::fs::remove_file(p.path().join(format!("{session}.jsonl")));
    }
}

/// The bridge as the CLI's `--mcp-config` names it, in a file only this user reads.
fn write_config(bridge: &bridge::Bridge, session: &str) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = std::env::temp_dir().join(format!("steppe-mcp-{session}.json"));
    let config = json!({"mcpServers": {"steps": {"type": "http", "url": bridge.url, "headers": {"Authorization": format!("Bearer {}", bridge.token)}}}});
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path)?;
    f.write_all(config.to_string().as_bytes())?;
    Ok(path)
}

/// Runs the step's conversation on its CLI: `system` appended to the CLI's
/// own system prompt, `prompts` sent in order (each after the last
/// answered), obligations checked when it is done.
pub(super) async fn converse(conv: &mut Conversation<'_>, ts: &mut Toolset<'_>, cli: &CliWork, system: &str, prompts: Vec<String>, parent: &opentelemetry::Context) -> Result<(), StepError> {
    let work = conv.work;
    let label = conv.label.clone();
    let program = cli.program.clone();
    let offered = conv.tools.values();
    let bridged: Vec<String> = offered.iter().filter_map(|t| t.pointer("/function/name").and_then(Value::as_str)).map(|n| format!("{PREFIX}{n}")).collect();
    let (calls_tx, mut calls) = mpsc::channel::<BridgeCall>(8);
    let bridge = bridge::start(&offered, calls_tx).await.map_err(|e| StepError::errored(format!("{label}: the tool bridge for {program} could not start: {e}")))?;
    steppe_runtime::secrets::remember(&bridge.token);
    let id = uuid_v4().map_err(|e| StepError::errored(format!("{label}: no randomness for the CLI's session id: {e}")))?;
    let config = write_config(&bridge, &id).map_err(|e| StepError::errored(format!("{label}: writing the CLI's MCP config: {e}")))?;
    let key = work.api_key_env.as_deref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
    if let Some(k) = &key {
        steppe_runtime::secrets::remember(k);
    } else if let (Some(var), true) = (&work.api_key_env, work.key_required) {
        return Err(StepError::errored(format!("{label}: the API key variable {var} is not set")));
    }
    // Each message, each retry and each nudge is one invocation: attempts+5 of them beyond the messages.
    let cap = work.attempts.max(1) + 5 + prompts.len() as u32;
    let mut session = Session { id, config, bridged, invocations: 0, cap, turns: 0, spent_usd: 0.0, resumed: false, key };
    let mut queue: VecDeque<String> = prompts.into();
    let mut prompt = queue.pop_front().unwrap_or_default();
    // What a session that never started is asked again.
    let mut unstarted = prompt.clone();
    let mut nudges = 0u32;
    let mut crashes = 0u32;
    loop {
        match invoke(conv, ts, cli, &mut session, &mut calls, &prompt, system, parent).await? {
            Ended::Result { text, is_error } => {
                session.resumed = true;
                if is_error {
                    return Err(StepError::failed(format!("{label}: {program} reported the task failed: {}", text.trim())));
                }
                conv.out.response = text;
                if let Some(next) = queue.pop_front() {
                    prompt = next;
                    unstarted = prompt.clone();
                    continue;
                }
                let unmet_f = unmet_files(ts.root, &work.assert.files);
                let unmet_t = unmet_tool_calls(&work.assert.tool_calls, &conv.out.trajectory);
                if work.assert.nudge && nudges < 5 && (!unmet_f.is_empty() || unmet_t.is_some()) {
                    nudges += 1;
                    conv.say(&format!("nudge {nudges}/5: the agent finished before its asserted {}", if unmet_f.is_empty() { "tool calls were made" } else { "files were written" }));
                    prompt = if unmet_f.is_empty() {
                        format!("You finished, but this step declared calls it must make and they have not happened: {}. Make them now using the tools you have, then finish.", unmet_t.unwrap_or_default())
                    } else {
                        format!("You finished, but this step declared files it must leave behind and they are not there: {}. Write them now using the tools you have, then finish.", unmet_f.join("; "))
                    };
                    continue;
                }
                break;
            }
            Ended::Crashed(why) => {
                crashes += 1;
                if crashes >= work.attempts.max(1) {
                    return Err(StepError::errored(format!("{label}: {program} ended without a result {crashes} time(s); the last: {why}")));
                }
                let made = conv.out.trajectory.len();
                if !session.resumed {
                    // It never held a session: the same request again, in a fresh one.
                    conv.say(&format!("{program} ended before its session began ({why}); starting it again (attempt {} of {})", crashes + 1, work.attempts.max(1)));
                    prompt = unstarted.clone();
                    continue;
                }
                conv.say(&format!("{program} ended without a result ({why}); resuming its session (attempt {} of {})", crashes + 1, work.attempts.max(1)));
                prompt = format!(
                    "You did not finish: your previous run in this session ended before it reported a result ({why}). {made} tool call(s) were already made and their effects are in place. Continue from where you stopped; do not restart the task."
                );
                let unmet_f = unmet_files(ts.root, &work.assert.files);
                if !unmet_f.is_empty() {
                    prompt.push_str(&format!(" This step must still leave behind: {}.", unmet_f.join("; ")));
                }
            }
        }
    }
    // What a hosted agent is forced into is checked at the exit here.
    if !work.verdicts.is_empty() && conv.out.verdict.is_none() {
        return Err(StepError::failed(format!("{label}: ended without calling the verdict tool (one of: {})", work.verdicts.join(", "))));
    }
    let missing: Vec<&str> = ts.required.iter().filter(|(n, done)| !**done && n.as_str() != "verdict").map(|(n, _)| n.as_str()).collect();
    if !missing.is_empty() {
        return Err(StepError::failed(format!("{label}: required tool(s) never succeeded: {}", missing.join(", "))));
    }
    Ok(())
}

/// One run of the CLI: spawned with the documented flags, the prompt on its
/// stdin, its events read and its bridged calls served until it exits.
#[allow(clippy::too_many_arguments)]
async fn invoke(
    conv: &mut Conversation<'_>,
    ts: &mut Toolset<'_>,
    cli: &CliWork,
    session: &mut Session,
    calls: &mut mpsc::Receiver<BridgeCall>,
    prompt: &str,
    system: &str,
    parent: &opentelemetry::Context,
) -> Result<Ended, StepError> {
    let work = conv.work;
    let label = conv.label.clone();
    let program = &cli.program;
    // A job budget already spent by other steps stops the CLI before it starts.
    conv.job_budget_left().await?;
    session.invocations += 1;
    if session.invocations > session.cap {
        return Err(StepError::errored(format!("{label}: {program} did not finish within {} invocations", session.cap)));
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(["--print", "--output-format", "stream-json", "--verbose", "--model", &cli.model]);
    if work.max_turns > 0 {
        let left = work.max_turns.saturating_sub(session.turns);
        if left == 0 {
            return Err(StepError::failed(format!("{label}: agent exceeded {} turns", work.max_turns)));
        }
        cmd.args(["--max-turns", &left.to_string()]);
    }
    if session.resumed {
        cmd.args(["--resume", &session.id]);
    } else {
        cmd.args(["--session-id", &session.id]);
        if !system.trim().is_empty() {
            cmd.args(["--append-system-prompt", system]);
        }
    }
    if let Some(cap) = cli.budget_usd {
        let left = cap - session.spent_usd;
        if left <= 0.0 {
            return Err(StepError::errored(format!("agent \"{}\": budget exceeded: cap ${cap:.2}, spent ${:.4}", work.agent, session.spent_usd)));
        }
        cmd.args(["--max-budget-usd", &format!("{left:.4}")]);
    }
    let config = session.config.display().to_string();
    cmd.args(["--tools", "", "--allowedTools", &session.bridged.join(","), "--mcp-config", &config, "--strict-mcp-config", "--setting-sources", if cli.project_settings { "project" } else { "" }]);
    if let Some(k) = &session.key {
        cmd.env("ANTHROPIC_API_KEY", k);
    }
    // The one generation dial a CLI takes: its thinking budget.
    if let Some(tokens) = work.reasoning_effort.as_deref().and_then(thinking_tokens) {
        cmd.env("MAX_THINKING_TOKENS", tokens.to_string());
    }
    cmd.current_dir(&ts.space.cwd).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StepError::errored(format!("{label}: {program} is not on this worker's PATH; install the {program} CLI there, or give the agent a hosted model")));
        }
        Err(e) => return Ok(Ended::Crashed(format!("it could not start: {e}"))),
    };
    // Written beside the reading, so a CLI that talks before it has read
    // the whole prompt cannot stall on a full pipe; closed when written.
    if let Some(mut stdin) = child.stdin.take() {
        let prompt = prompt.to_string();
        tokio::spawn(async move {
            let _ = stdin.write_all(prompt.as_bytes()).await;
        });
    }
    // Drained to the end (a full pipe would stall the CLI); its last 8 KiB kept for the error.
    let mut stderr = child.stderr.take();
    let stderr_tail = tokio::spawn(async move {
        let (mut tail, mut chunk) = (Vec::new(), [0u8; 4096]);
        if let Some(e) = stderr.as_mut() {
            while let Ok(n) = e.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                tail.extend_from_slice(&chunk[..n]);
                if tail.len() > 8192 {
                    tail.drain(..tail.len() - 8192);
                }
            }
        }
        String::from_utf8_lossy(&tail).into_owned()
    });
    let Some(stdout) = child.stdout.take() else { return Ok(Ended::Crashed("no output stream".into())) };
    let mut lines = BufReader::new(stdout).lines();
    let mut result: Option<Ended> = None;
    let mut streamed = Usage::default();
    let mut attested = false;
    loop {
        tokio::select! {
            // The stream first: its init event is checked before any bridged call runs.
            biased;
            line = lines.next_line() => {
                let line = match line {
                    Ok(Some(line)) => line,
                    Ok(None) => break,
                    Err(e) => {
                        let _ = child.kill().await;
                        return Ok(Ended::Crashed(format!("its output could not be read: {e}")));
                    }
                };
                let Ok(event) = serde_json::from_str::<Value>(&line) else { continue };
                match event.get("type").and_then(Value::as_str) {
                    Some("system") if event.get("subtype").and_then(Value::as_str) == Some("init") => {
                        let offered: BTreeSet<String> = event.get("tools").and_then(Value::as_array).map(|t| t.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
                        let granted: BTreeSet<String> = session.bridged.iter().cloned().collect();
                        if offered != granted {
                            let _ = child.kill().await;
                            let extra: Vec<&String> = offered.difference(&granted).collect();
                            let missing: Vec<&String> = granted.difference(&offered).collect();
                            return Err(StepError::errored(format!(
                                "{label}: {program}'s session does not hold exactly the granted tools (not granted: {}; missing: {}); it was stopped",
                                if extra.is_empty() { "none".to_string() } else { extra.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ") },
                                if missing.is_empty() { "none".to_string() } else { missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ") },
                            )));
                        }
                        attested = true;
                    }
                    Some("assistant") => {
                        let message = event.get("message").cloned().unwrap_or_default();
                        streamed.add_response(&cli.model, message.get("usage").map(claude_usage).as_ref(), None);
                        for block in message.get("content").and_then(Value::as_array).into_iter().flatten() {
                            match block.get("type").and_then(Value::as_str) {
                                Some("text") => {
                                    let text = block.get("text").and_then(Value::as_str).unwrap_or_default();
                                    if !text.trim().is_empty() {
                                        conv.say(text);
                                        conv.record("text", "", text);
                                    }
                                }
                                // Bridged calls are recorded as the bridge runs them; any other
                                // name is kept verbatim, a sign the fence did not hold.
                                Some("tool_use") => {
                                    let name = block.get("name").and_then(Value::as_str).unwrap_or_default();
                                    if !name.starts_with(PREFIX) {
                                        let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                                        conv.say(&format!("→ {name} (not a bridged tool) {input}"));
                                        conv.record("call", name, &input.to_string());
                                        conv.out.trajectory.push(TrajectoryEntry { name: name.to_string(), args: input, ok: false });
                                        // A tool of its own: the fence did not hold.
                                        let _ = child.kill().await;
                                        return Err(StepError::errored(format!("{label}: {program} called {name}, which is not a granted tool; it was stopped")));
                                    }
                                }
                                _ => {}
                            }
                        }
                    }
                    Some("result") if !attested => {
                        let _ = child.kill().await;
                        return Err(StepError::errored(format!("{label}: {program} reported a result without first listing its session's tools, so its tools could not be checked against the grant (is it run with --verbose?)")));
                    }
                    Some("result") => {
                        let text = event.get("result").and_then(Value::as_str).unwrap_or_default().to_string();
                        let is_error = event.get("is_error").and_then(Value::as_bool).unwrap_or(false);
                        let turns = event.get("num_turns").and_then(Value::as_u64).unwrap_or(1) as u32;
                        session.turns += turns;
                        conv.out.turns = session.turns;
                        let cost = event.get("total_cost_usd").and_then(Value::as_f64);
                        let mut u = Usage::default();
                        u.add_response(&cli.model, event.get("usage").map(claude_usage).as_ref(), event.get("subtype").and_then(Value::as_str));
                        u.cost_usd = cost;
                        u.responses = turns.max(1);
                        session.spent_usd += cost.unwrap_or(0.0);
                        conv.spend(u.prompt + u.completion).await?;
                        conv.out.usage.absorb(&u);
                        result = Some(Ended::Result { text, is_error });
                    }
                    _ => {}
                }
            }
            Some(call) = calls.recv() => {
                if !attested {
                    let _ = call.reply.send(json!({"error": "this session's tools have not been checked yet"}));
                    continue;
                }
                let name = call.name.clone();
                let r = call_tool(conv, ts, &name, &call.args, parent).await;
                match r {
                    Ok(v) => {
                        let _ = call.reply.send(v);
                    }
                    Err(e) => {
                        let _ = child.kill().await;
                        return Err(e);
                    }
                }
            }
        }
    }
    let status = child.wait().await;
    let stderr = stderr_tail.await.unwrap_or_default();
    if let Some(r) = result {
        return Ok(r);
    }
    // A crashed child never reports its spend: what it streamed is priced for the budget only.
    if let Some(est) = steppe_runtime::prices::Prices::shipped().cost(&cli.model, &streamed) {
        session.spent_usd += est;
    }
    session.resumed |= attested;
    let code = match status {
        Ok(s) => s.code().map_or_else(|| "killed by a signal".to_string(), |c| format!("exit {c}")),
        Err(e) => e.to_string(),
    };
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
    Ok(Ended::Crashed(if last.is_empty() { code } else { format!("{code}: {}", steppe_runtime::secrets::mask(last.trim())) }))
}

/// The CLI's usage object in the shape `Usage::add_response` reads (its
/// prompt counts cached reads and cache writes).
fn claude_usage(u: &Value) -> Value {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let cached = n("cache_read_input_tokens");
    let prompt = n("input_tokens") + cached + n("cache_creation_input_tokens");
    json!({"prompt_tokens": prompt, "completion_tokens": n("output_tokens"), "prompt_tokens_details": {"cached_tokens": cached}})
}

/// The synthetic reads a hosted agent's first request carries (earlier
/// steps' decisions, `context_paths` files), as text ahead of a CLI's first
/// prompt: `read_file {"path":"x"}` and what it returned.
pub(super) fn context_text(messages: &[Value]) -> String {
    let mut out = String::new();
    let mut calls: std::collections::HashMap<String, String> = Default::default();
    for m in messages {
        match m.get("role").and_then(Value::as_str) {
            Some("assistant") => {
                for c in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                    let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_string();
                    let call = format!("{} {}", c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default(), c.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default());
                    calls.insert(id, call);
                }
            }
            Some("tool") => {
                let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or_default();
                let raw = m.get("content").and_then(Value::as_str).unwrap_or_default();
                let content = serde_json::from_str::<Value>(raw).ok().and_then(|v| v.get("content").and_then(Value::as_str).map(str::to_string)).unwrap_or_else(|| raw.to_string());
                out.push_str(&format!("{}:\n{content}\n\n", calls.get(id).map(String::as_str).unwrap_or("context")));
            }
            _ => {}
        }
    }
    if out.is_empty() {
        out
    } else {
        format!("Context this pipeline gives you, read for you before you start:\n\n{out}---\n\n")
    }
}

/// `reasoning_effort` as the claude CLI's thinking budget (`MAX_THINKING_TOKENS`).
fn thinking_tokens(effort: &str) -> Option<u32> {
    match effort.to_ascii_lowercase().as_str() {
        "minimal" | "low" => Some(4_096),
        "medium" => Some(16_384),
        "high" => Some(31_999),
        _ => None,
    }
}
