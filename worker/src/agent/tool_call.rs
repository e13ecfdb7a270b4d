//! One tool call of a conversation, hosted or bridged from a CLI: the
//! verdict, ask_user's answerers (filed, preset, agent, person, parked),
//! sub-agents, MCP tools, custom and built-in tools, each with its caps; the
//! call said, recorded and traced.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use steppe_runtime::agent_work::{AgentMessage, ToolDef, TrajectoryEntry};
use steppe_runtime::outcome::StepError;
use steppe_runtime::store::QuestionRecord;

use super::ask::{self, ask_person};
use super::{converse, ok_result, unmet_files, Conversation};
use crate::tools::{custom, error, Space};

/// What a conversation's tool calls run against, set up before its first
/// request: the step's space, its tools (built-in, custom, MCP), and what the
/// calls so far have used up and satisfied.
pub(super) struct Toolset<'r> {
    pub(super) root: &'r Path,
    pub(super) space: Space,
    pub(super) defs: HashMap<String, ToolDef>,
    pub(super) mcp: crate::tools::mcp::McpSessions,
    pub(super) calls_made: HashMap<String, u64>,
    /// ask_user answers of this conversation, by question and options.
    pub(super) asked: HashMap<String, Value>,
    /// Tools that must succeed before the conversation may end, and whether they have.
    pub(super) required: BTreeMap<String, bool>,
}

/// Runs one tool call the model (or a CLI, over the bridge) made: said,
/// recorded in the transcript and trajectory, its span ended; its result.
pub(super) async fn call_tool(conv: &mut Conversation<'_>, ts: &mut Toolset<'_>, name: &str, args: &Value, parent: &opentelemetry::Context) -> Result<Value, StepError> {
    let tool_cx = crate::telemetry::start(parent, &conv.run_id, format!("tool {name}"), vec![opentelemetry::KeyValue::new("tool", name.to_string())], None);
    conv.say(&format!("→ {name} {args}"));
    conv.record("call", name, &args.to_string());
    let result = run_tool(conv, ts, name, args).await;
    let result = match result {
        Ok(r) => r,
        Err(e) => {
            crate::telemetry::end(&tool_cx, Some(e.message.as_str()));
            return Err(e);
        }
    };
    let ok = ok_result(&result);
    crate::telemetry::end(&tool_cx, (!ok).then(|| result.get("error").and_then(Value::as_str).unwrap_or("the call failed")));
    if ok {
        if let Some(done) = ts.required.get_mut(name) {
            *done = true;
        }
    }
    conv.out.trajectory.push(TrajectoryEntry { name: name.to_string(), args: args.clone(), ok });
    conv.record("result", name, &result.to_string());
    Ok(result)
}

/// The result of one tool call; Err only when the step must end (an
/// unanswered question with no default).
async fn run_tool(conv: &mut Conversation<'_>, ts: &mut Toolset<'_>, name: &str, args: &Value) -> Result<Value, StepError> {
    let (name, args) = (name.to_string(), args.clone());
    let work = conv.work;
    let label = conv.label.clone();
    let Toolset { root, space, defs, mcp, calls_made, asked, .. } = ts;
    let root: &Path = root;
    Ok(if name == "verdict" && !work.verdicts.is_empty() {
        let choice = args.get("choice").and_then(Value::as_str).unwrap_or_default().to_string();
        if !work.verdicts.contains(&choice) {
            error(format!("verdict: choice \"{choice}\" is not one of: {}", work.verdicts.join(", ")))
        } else {
            let unmet = unmet_files(root, &work.assert.files);
            if !unmet.is_empty() {
                error(format!("verdict: this step declared files it must leave behind and they are not there: {}. Write them first.", unmet.join("; ")))
            } else {
                conv.out.verdict = Some(choice.clone());
                let note = args.get("note").and_then(Value::as_str).filter(|n| !n.is_empty()).map(str::to_string);
                conv.out.note = note.clone();
                let mut r = json!({"exit_code": 0, "verdict": choice});
                if let Some(n) = note {
                    r["note"] = json!(n);
                }
                r
            }
        }
    } else {
        match defs.get(&name) {
            None if name == "ask_user" && work.ask.is_some() => {
                let ask = work.ask.as_deref().expect("checked above");
                let question = args.get("question").and_then(Value::as_str).unwrap_or_default().to_string();
                let options: Vec<String> = args.get("options").and_then(Value::as_array).map(|o| o.iter().filter_map(Value::as_str).map(str::to_string).collect()).unwrap_or_default();
                let key = format!("{question}\u{0}{}", options.join("\u{0}"));
                let used = calls_made.entry("ask_user".into()).or_insert(0);
                let max = if work.max_questions == 0 { 3 } else { work.max_questions as u64 };
                if question.trim().is_empty() {
                    error("ask_user: missing required argument \"question\"")
                } else if let Some(memo) = asked.get(&key) {
                    memo.clone()
                } else if *used >= max {
                    error(format!("ask_user: question budget ({max}) spent for this step; continue with what you know"))
                } else {
                    *used += 1;
                    conv.say(&format!("question: {question}{}", if options.is_empty() { String::new() } else { format!(" (options: {})", options.join(" | ")) }));
                    // The row is filed before any channel is tried (the run's memo, the record of who answered).
                    let wait = ask.timeout_ms.map(Duration::from_millis);
                    // Nobody is waited on past the step's own deadline: the default (or the abort) comes first.
                    let declared = wait.unwrap_or(ask::PARKED_WAIT);
                    let wait_for = match conv.deadline {
                        Some(d) => declared.min(d.saturating_duration_since(std::time::Instant::now()).saturating_sub(Duration::from_secs(5))),
                        None => declared,
                    };
                    let row = QuestionRecord {
                        run_id: conv.run_id.clone(),
                        agent: label.clone(),
                        question: question.clone(),
                        options: options.clone(),
                        deadline_ms: if ask.park { steppe_runtime::store::now_ms() + wait_for.as_millis() as i64 } else { 0 },
                        ..Default::default()
                    };
                    let filed = match &conv.ledger {
                        Some(l) => match l.ask(row).await {
                            Ok(f) => Some(f),
                            Err(e) => {
                                conv.say(&format!("note: ask_user: the question could not be filed ({e}); it is asked without a record"));
                                None
                            }
                        },
                        None => None,
                    };
                    // A step ended while its question waits (aborted, timed out) leaves nobody waiting on it.
                    let mut abandoned = match (&filed, &conv.ledger) {
                        (Some((q, true)), Some(l)) => Some(ask::Abandoned::new(l.clone(), q.id)),
                        _ => None,
                    };
                    let mut answer: Option<Value>;
                    let mut source_of_record = String::new();
                    match &filed {
                        // The run asked it already: its answer, or wait with the step asking it now.
                        Some((earlier, false)) => {
                            let settled = match (earlier.pending(), &conv.ledger) {
                                (true, Some(l)) => ask::wait_parked(l.as_ref(), earlier.id, wait_for).await.ok().flatten(),
                                _ => Some(earlier.clone()),
                            };
                            answer = settled.as_ref().and_then(ask::recorded);
                            if answer.is_some() {
                                conv.say(&format!("question {}: answered earlier in this run", earlier.id));
                            }
                        }
                        _ => {
                            answer = work
                                .answers
                                .iter()
                                .find(|(sub, _)| question.to_lowercase().contains(&sub.to_lowercase()))
                                .map(|(_, a)| json!({"answered": true, "answer": a, "source": "preset"}));
                            if answer.is_none() {
                                if let Some(resp) = &ask.answered_by {
                                    let mut child = resp.work.clone();
                                    let opts = if options.is_empty() { String::new() } else { format!("\nAnswer with one of: {}.", options.join(", ")) };
                                    child.messages = vec![AgentMessage::Text(format!("{question}{opts}"))];
                                    child.verdicts.clear();
                                    let (r, o) = converse(&child, root, &conv.run_id, conv.sink.clone(), conv.ledger.clone(), resp.name.clone()).await;
                                    conv.out.tokens += o.tokens;
                                    conv.out.usage.absorb(&o.usage);
                                    if r.is_ok() && !o.response.trim().is_empty() {
                                        answer = Some(json!({"answered": true, "answer": o.response.trim(), "source": format!("agent:{}", resp.name)}));
                                    }
                                }
                            }
                            if let Some(a) = &answer {
                                let text = a["answer"].as_str().unwrap_or_default().to_string();
                                if ask.options_required && !options.is_empty() && !options.contains(&text) {
                                    answer = None;
                                }
                            }
                            if answer.is_none() && ask.inline {
                                answer = ask_person(&question, &options, ask.options_required, Some(wait_for).filter(|_| wait.is_some() || conv.deadline.is_some())).await;
                                if answer.is_some() {
                                    source_of_record = format!("person:{}", steppe_runtime::store::person_here());
                                }
                            }
                            if let (None, true, Some((q, true)), Some(l)) = (&answer, ask.park && !ask.inline, &filed, &conv.ledger) {
                                let shown = wait_for;
                                conv.say(&format!("question {}: waiting up to {} — steppe questions answer {} <answer> {}", q.id, steppe_language::duration::show(shown), q.id, ask.answer_with));
                                match ask::wait_parked(l.as_ref(), q.id, shown).await {
                                    Ok(Some(settled)) => {
                                        answer = ask::recorded(&settled);
                                        source_of_record = settled.source.clone();
                                        if answer.is_some() {
                                            conv.say(&format!("question {}: answered by {}", q.id, settled.source.strip_prefix("person:").unwrap_or(&settled.source)));
                                        }
                                    }
                                    Ok(None) => {}
                                    Err(e) => conv.say(&format!("note: ask_user: question {}: {e}", q.id)),
                                }
                            }
                        }
                    }
                    // Nobody answered: the row says so first; an answer that landed
                    // just as the wait ended wins over the default.
                    let mut settled = false;
                    if let (None, Some((q, true)), Some(l)) = (&answer, &filed, &conv.ledger) {
                        let (value, source) = match &ask.default {
                            Some(d) => (Some(d.as_str()), "default"),
                            None => (None, "expired"),
                        };
                        if let Ok(false) = l.settle(q.id, value, source).await {
                            if let Ok(Some(row)) = l.question(q.id).await {
                                answer = ask::recorded(&row).filter(|_| row.source != "default");
                                source_of_record = row.source.clone();
                            }
                        }
                        settled = true;
                        if let Some(a) = abandoned.as_mut() {
                            a.disarm();
                        }
                    }
                    let result = match (answer, &ask.default) {
                        (Some(a), _) => a,
                        (None, Some(d)) => {
                            let within = if ask.park || ask.inline { format!(" within {}", steppe_language::duration::show(wait_for)) } else { String::new() };
                            json!({"answered": false, "answer": d, "source": "default", "note": format!("nobody answered{within}; the declared default was used")})
                        }
                        (None, None) => {
                            return Err(StepError::aborted(format!(
                                "{label}: ask_user: nobody answered {question:?} (answer ahead with --answer 'substring=answer', or declare default: on the grant)"
                            )));
                        }
                    };
                    if let Some(a) = abandoned.as_mut() {
                        a.disarm();
                    }
                    // Who answered goes on the row (a parked question's answerer recorded it already).
                    if let (false, Some((q, true)), Some(l)) = (settled, &filed, &conv.ledger) {
                        let src = if source_of_record.is_empty() { result["source"].as_str().unwrap_or_default().to_string() } else { source_of_record.clone() };
                        let _ = l.settle(q.id, result["answer"].as_str(), &src).await;
                    }
                    conv.say(&format!("answer: {}", result["answer"].as_str().unwrap_or_default()));
                    asked.insert(key, result.clone());
                    result
                }
            }
            None if work.sub_agents.iter().any(|s| s.name == name) => {
                let sub = work.sub_agents.iter().find(|s| s.name == name).expect("checked above");
                match args.get("request").and_then(Value::as_str).filter(|r| !r.trim().is_empty()) {
                    None => error(format!("{name}: missing required argument \"request\"")),
                    Some(request) => {
                        conv.say(&format!("agent: {name} (sub-agent)"));
                        let mut child = sub.work.clone();
                        child.messages = vec![AgentMessage::Text(request.to_string())];
                        child.dir = work.dir.clone();
                        child.verdicts.clear();
                        // Its allowance: a share of what the caller has left (or its own, if smaller).
                        let allowance = work.budget_tokens.map(|cap| cap.saturating_sub(conv.out.tokens) * u64::from(work.delegate_percent.max(1)) / 100);
                        if allowance == Some(0) {
                            return Ok(error(format!("{name}: the delegating agent has no token allowance left for a sub-agent; finish without this helper")));
                        }
                        if let Some(a) = allowance {
                            child.budget_tokens = Some(child.budget_tokens.map_or(a, |own| own.min(a)));
                        }
                        let (r, o) = converse(&child, root, &conv.run_id, conv.sink.clone(), conv.ledger.clone(), name.clone()).await;
                        conv.out.tokens += o.tokens;
                        conv.out.usage.absorb(&o.usage);
                        conv.out.denials.extend(o.denials);
                        let nested = serde_json::to_string(&o.transcript).unwrap_or_default();
                        conv.record("subagent", &name, &nested);
                        match r {
                            Ok(()) => json!({"result": crate::tools::spill_cap(&o.response)}),
                            Err(e) => error(e.message),
                        }
                    }
                }
            }
            None if mcp.tool(&name).is_some() => {
                let tool = mcp.tool(&name).expect("checked above");
                let used = calls_made.entry(name.clone()).or_insert(0);
                if tool.max_calls > 0 && *used >= tool.max_calls {
                    error(format!("{name}: call budget ({}) exhausted for this attempt", tool.max_calls))
                } else {
                    *used += 1;
                    mcp.call(tool, &args).await
                }
            }
            None => {
                conv.out.denials.push(steppe_runtime::agent_work::DenialRecord {
                    tool: name.clone(),
                    path: String::new(),
                    reason: format!("tool \"{name}\" is not granted to this step"),
                });
                error(format!("unknown tool \"{name}\""))
            }
            Some(def @ ToolDef::Custom { max_calls, .. }) => {
                let used = calls_made.entry(name.clone()).or_insert(0);
                if *max_calls > 0 && *used >= *max_calls {
                    error(format!("{name}: call budget ({max_calls}) exhausted for this attempt"))
                } else {
                    *used += 1;
                    custom(&space, def, &args).await
                }
            }
            Some(def) => space.builtin(def, &args, &mut conv.out.denials).await,
        }
    })
}
