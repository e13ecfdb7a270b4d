//! Agent steps: the agent definition, the step and the defaults merged into
//! an [`AgentWork`] and dispatched like any other assignment.

use std::sync::Arc;

use serde_json::{Map, Value};
use steppe_runtime::agent_work::{AgentAssert, AgentMessage, AgentWork, Endpoint, McpServerWork, SubAgent, ToolDef};
use steppe_runtime::assignment::Assignment;
use steppe_language::builtins::{provider_of, DEFAULT_TOOLS};
use steppe_language::model::{AgentDef, McpServer, Message, Source, Step, ToolGrant, ToolSpec};
use steppe_runtime::outcome::StepError;

use super::across::{cell_label, render_cell, Cell};
use super::run::{Done, JobRun};

fn builtin(name: &str, spec: Option<&ToolSpec>) -> ToolDef {
    ToolDef::Builtin {
        name: name.to_string(),
        allow: spec.and_then(|s| s.allow.clone()).unwrap_or_default(),
        timeout_ms: spec.and_then(|s| s.timeout).and_then(|t| t.to_std()).map(|t| t.as_millis() as u64),
    }
}

fn custom(s: &ToolSpec) -> ToolDef {
    ToolDef::Custom {
        name: s.name.clone().unwrap_or_default(),
        description: s.description.clone().unwrap_or_default(),
        run: s.run.clone().unwrap_or_default(),
        required: s.required.unwrap_or(false),
        max_calls: s.max_calls.unwrap_or(0).max(0) as u64,
        pinned: s.args.clone().unwrap_or_default(),
        max_output_bytes: s.max_output_bytes.map(|m| m.max(0) as u64),
        timeout_ms: s.timeout.and_then(|t| t.to_std()).map(|t| t.as_millis() as u64),
        literal: false,
    }
}

/// An MCP grant: one tool, some, or every one the server lists.
fn mcp(server: &str, s: &ToolSpec) -> ToolDef {
    let single = s.tool.is_some();
    ToolDef::Mcp {
        server: server.to_string(),
        tool: s.tool.clone(),
        tools: s.tools.clone().unwrap_or_default(),
        description: s.description.clone().filter(|_| single),
        required: single && s.required.unwrap_or(false),
        max_calls: if single { s.max_calls.unwrap_or(0).max(0) as u64 } else { 0 },
        max_output_bytes: s.max_output_bytes.map(|m| m.max(0) as u64),
        timeout_ms: s.timeout.and_then(|t| t.to_std()).map(|t| t.as_millis() as u64),
    }
}

/// The agent's grant as tool definitions, each under the name a step's
/// `tools:` selects it by (an MCP grant of one tool as `server__tool`, of
/// several as the server's name).
fn grant(tools: Option<&[ToolGrant]>) -> Vec<(String, ToolDef)> {
    let mut out = Vec::new();
    match tools {
        Some(t) if !t.is_empty() => {
            for g in t {
                match g {
                    ToolGrant::Name(n) => out.push((n.clone(), builtin(n, None))),
                    ToolGrant::Spec(s) => {
                        if let Some(b) = &s.builtin {
                            out.push((b.clone(), builtin(b, Some(s))));
                        } else if s.name.is_some() {
                            out.push((s.name.clone().unwrap_or_default(), custom(s)));
                        } else if s.agent.is_some() {
                            // Served as a sub-agent (see `sub_agents`).
                        } else if let Some(m) = &s.mcp {
                            let key = match &s.tool {
                                Some(t) => steppe_runtime::agent_work::mcp_tool_name(m, t),
                                None => m.clone(),
                            };
                            out.push((key, mcp(m, s)));
                        }
                    }
                }
            }
        }
        _ => out.extend(DEFAULT_TOOLS.iter().map(|n| (n.to_string(), builtin(n, None)))),
    }
    out
}

/// The variables holding a pipeline's secrets — its agents' API keys (their
/// own `api_key_env` or their provider's), its fallbacks', and its MCP
/// servers' bearer tokens — whose values are masked wherever text goes.
pub(crate) fn secret_env_names(p: &steppe_language::model::Pipeline, env_model: Option<&str>) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let default_model = env_model.map(str::to_string).or_else(|| p.defaults.as_ref().and_then(|d| d.model.clone()));
    let mut source = |src: Option<&Source>| {
        let model = src.and_then(|s| s.model.clone()).or_else(|| default_model.clone()).unwrap_or_default();
        names.extend(key_env(src.and_then(|s| s.api_key_env.as_deref()), &model));
    };
    for a in &p.agents {
        source(a.source.as_ref());
        for f in a.fallback.iter().flatten() {
            source(f.source.as_ref());
        }
    }
    names.extend(p.mcp_servers.iter().filter_map(|m| m.auth.as_ref()).filter_map(|a| a.api_key_env.clone()));
    names.sort();
    names.dedup();
    names
}

/// The variable holding a source's API key: its own `api_key_env`, else its provider's.
fn key_env(api_key_env: Option<&str>, model: &str) -> Option<String> {
    api_key_env.map(str::to_string).or_else(|| provider_of(model).and_then(|p| p.key_env).map(str::to_string))
}

/// Context windows by model name (lowercase, `.` as `-`, most specific first).
const WINDOWS: &[(&str, u64)] = &[("gpt-oss", 131_072), ("gpt-5", 400_000), ("gemini", 1_000_000), ("qwen", 262_144), ("claude", 200_000)];
const WINDOW_UNKNOWN: u64 = 128_000;

/// When a conversation is compacted (agent-steps §3.9): `compact_after_tokens`
/// (0: never), else 80% of `context_window`, else 80% of the model's known window.
fn compaction_budget(def: &AgentDef, model: &str) -> u64 {
    if let Some(n) = def.compact_after_tokens {
        return n.max(0) as u64;
    }
    let window = match def.context_window {
        Some(w) if w > 0 => w as u64,
        _ => {
            let name = model.to_lowercase().replace('.', "-");
            WINDOWS.iter().find(|(k, _)| name.contains(k)).map(|(_, w)| *w).unwrap_or(WINDOW_UNKNOWN)
        }
    };
    window * 4 / 5
}

/// A declared MCP server as a worker reaches it; a `stepgate:` server's
/// stepfiles read from `dir` (the pipeline's directory) and checked here.
pub(crate) fn mcp_server_work(decl: &McpServer, dir: &std::path::Path) -> Result<McpServerWork, String> {
    let mut stepfiles = Vec::new();
    for f in decl.stepgate.iter().flat_map(|g| g.stepfiles.iter()) {
        let path = dir.join(f);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("MCP server \"{}\": stepfile {f}: {e}", decl.name))?;
        steppe_gate::load::load_str(&text, std::path::Path::new(f)).map_err(|e| format!("MCP server \"{}\": {e}", decl.name))?;
        let name = std::path::Path::new(f).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| f.clone());
        if stepfiles.iter().any(|(n, _): &(String, String)| *n == name) {
            return Err(format!("MCP server \"{}\": two stepfiles are named {name}", decl.name));
        }
        stepfiles.push((name, text));
    }
    let kind = decl.auth.as_ref().and_then(|a| a.type_.as_deref()).unwrap_or("none");
    let bearer_env = match kind {
        "bearer" => decl.auth.as_ref().and_then(|a| a.api_key_env.clone()),
        _ => None,
    };
    Ok(McpServerWork {
        name: decl.name.clone(),
        command: decl.command.iter().cloned().chain(decl.args.iter().flatten().cloned()).collect(),
        cwd: decl.cwd.clone(),
        endpoint: decl.endpoint.clone(),
        bearer_env,
        oauth: kind == "oauth",
        stepfiles,
        env: decl.stepgate.iter().flat_map(|g| g.env.iter().flatten().cloned()).collect(),
    })
}

/// A step's selection `server__tool` out of an agent's grant of that
/// server's tools (some or all): the grant narrowed to the one tool.
fn narrowed(all: &[(String, ToolDef)], name: &str) -> Option<ToolDef> {
    let (server, tool) = name.split_once("__")?;
    all.iter().find_map(|(_, d)| match d {
        ToolDef::Mcp { server: s, tool: None, tools, max_output_bytes, timeout_ms, .. } if s == server && (tools.is_empty() || tools.iter().any(|t| t == tool)) => Some(ToolDef::Mcp {
            server: s.clone(),
            tool: Some(tool.to_string()),
            tools: Vec::new(),
            description: None,
            required: false,
            max_calls: 0,
            max_output_bytes: *max_output_bytes,
            timeout_ms: *timeout_ms,
        }),
        _ => None,
    })
}

impl JobRun {
    /// The declared servers `tools` grants tools of, as a worker reaches them.
    fn mcp_servers(&self, agent: &str, tools: &[ToolDef]) -> Result<Vec<McpServerWork>, StepError> {
        let mut out: Vec<McpServerWork> = Vec::new();
        for t in tools {
            let ToolDef::Mcp { server, .. } = t else { continue };
            if out.iter().any(|m| &m.name == server) {
                continue;
            }
            let decl = self.engine.pipeline.mcp_servers.iter().find(|m| &m.name == server).ok_or_else(|| StepError::errored(format!("agent \"{agent}\": MCP server \"{server}\" is not declared in mcp_servers:")))?;
            out.push(mcp_server_work(decl, &self.engine.dir).map_err(|e| StepError::errored(format!("agent \"{agent}\": {e}")))?);
        }
        Ok(out)
    }

    pub(super) fn agent_def(&self, name: &str) -> Option<&AgentDef> {
        self.engine.pipeline.agents.iter().find(|a| a.name == name)
    }

    /// Whether a later step reads `name`'s note (so the verdict tool requires one).
    fn note_read(&self, name: &str) -> bool {
        let mut reads = false;
        steppe_language::model::walk::each_plan_step(&self.job, &mut |s, _| {
            reads |= s.context.as_ref().and_then(|c| c.from.as_ref()).and_then(|f| f.get(name)).and_then(Value::as_str).is_some_and(|l| l == "note" || l == "full");
        });
        reads
    }

    fn resolve(&self, s: &Step, cell: &Cell, vocab: Option<&[String]>) -> Result<AgentWork, StepError> {
        self.resolve_at(s, cell, vocab, 0)
    }

    pub(super) fn resolve_at(&self, s: &Step, cell: &Cell, vocab: Option<&[String]>, depth: usize) -> Result<AgentWork, StepError> {
        let name = s.agent.clone().unwrap_or_default();
        let def = self.agent_def(&name).ok_or_else(|| StepError::errored(format!("agent \"{name}\" is not declared")))?;
        let (primary, mut fallbacks) = self.sources_of(def)?;
        // A primary that did not answer preflight: the fallback pinned for it serves.
        let primary = match super::preflight::pinned_fallback(&self.engine.scope.pipeline, &name).filter(|i| *i < fallbacks.len()) {
            Some(i) => {
                let rest = fallbacks.split_off(i + 1);
                let served = fallbacks.pop().unwrap_or(primary);
                fallbacks = rest;
                served
            }
            None => primary,
        };
        let wire_model_for_budget = primary.model.clone();
        // `@claude/sonnet`: the claude CLI, asked for sonnet (the rest passed through untouched).
        let cli = primary.model.strip_prefix('@').map(|spec| {
            let (program, model) = spec.split_once('/').unwrap_or((spec, ""));
            steppe_runtime::agent_work::CliWork {
                program: program.to_string(),
                model: model.to_string(),
                project_settings: def.settings.as_deref() == Some("project"),
                budget_usd: def.budget.as_ref().and_then(|b| b.usd),
            }
        });
        let (wire_model, base_url, key_env, key_required, string_choice) =
            (primary.model, primary.base_url, primary.api_key_env, primary.key_required, primary.string_tool_choice);
        let render = |t: &str| self.subst(t).and_then(|t| render_cell(&t, cell)).map_err(|e| StepError::errored(format!("{name}: {e}")));
        let (image, container) = self.resolved_image(s, cell).map_err(|e| StepError::errored(format!("{name}: {}", e.message)))?;
        let mut messages = Vec::new();
        for m in &s.resolved_messages {
            messages.push(match m {
                Message::Text(t) => AgentMessage::Text(render(t)?),
                Message::Artifact { artifact, path } => AgentMessage::Artifact { artifact: artifact.clone(), path: path.clone() },
            });
        }
        let all = grant(def.tools.as_deref());
        let tools: Vec<ToolDef> = match &s.tools {
            Some(sel) if !sel.is_empty() => {
                let mut out = Vec::new();
                for g in sel {
                    match g {
                        ToolGrant::Name(n) => {
                            if let Some((_, d)) = all.iter().find(|(k, _)| k == n) {
                                out.push(d.clone());
                            } else if let Some(d) = narrowed(&all, n) {
                                out.push(d);
                            }
                        }
                        ToolGrant::Spec(spec) if spec.name.is_some() => out.push(custom(spec)),
                        ToolGrant::Spec(_) => {}
                    }
                }
                out
            }
            _ => all.into_iter().map(|(_, d)| d).collect(),
        };
        let tools: Vec<ToolDef> = tools.into_iter().filter(|t| t.name() != "ask_user").collect();
        let mcp_servers = self.mcp_servers(&name, &tools)?;
        let verdicts: Vec<String> = match vocab {
            Some(v) => v.to_vec(),
            None => s.verdicts.iter().flatten().map(|v| v.name.clone()).filter(|n| n != "failure").collect(),
        };
        let timeout = s.timeout.or(def.timeout).map(|t| t.to_std().unwrap_or_default()).unwrap_or(std::time::Duration::from_secs(1800));
        let assert = s.assert.as_ref().map(|a| AgentAssert {
            stdout: a.stdout.clone(),
            verdict: a.verdict.clone(),
            files: a.files.clone().unwrap_or_default(),
            tool_calls: a.tool_calls.iter().flatten().map(|c| (c.name.clone().unwrap_or_default(), c.args.clone().unwrap_or_else(Map::new))).collect(),
            nudge: a.nudge.unwrap_or(false),
        });
        Ok(AgentWork {
            agent: name.clone(),
            model: wire_model,
            base_url,
            api_key_env: key_env,
            key_required,
            string_tool_choice: string_choice,
            persona: def.system.clone().unwrap_or_default(),
            messages,
            dir: s.dir.as_deref().map(render).transpose()?,
            tools,
            verdicts,
            note_required: self.note_read(&name),
            // A CLI agent's turns are uncapped unless it says otherwise (seed 000).
            max_turns: s.max_turns.or(def.max_turns).unwrap_or(if cli.is_some() { 0 } else { 30 }).max(0) as u32,
            attempts: s.attempts.or(def.attempts).unwrap_or(3).max(1) as u32,
            timeout_ms: if timeout.is_zero() { None } else { Some(timeout.as_millis() as u64) },
            temperature: def.temperature,
            top_p: def.top_p,
            max_tokens: def.max_tokens,
            reasoning_effort: def.reasoning_effort.clone(),
            context_paths: s.context_paths.iter().flatten().map(|p| render(p)).collect::<Result<_, _>>()?,
            max_context_bytes: s.max_context_bytes.or(def.max_context_bytes).unwrap_or(100_000).max(0) as u64,
            budget_tokens: def.budget.as_ref().and_then(|b| b.tokens).map(|t| t.max(0) as u64),
            job_budget: self.job.budget.as_ref().and_then(|b| b.tokens).map(|cap| (cap.max(0) as u64, self.spent())),
            job_counter: self.job.budget.as_ref().and_then(|b| b.tokens).map(|_| steppe_runtime::budget::job_counter(&self.run_id)),
            across_counter: self.across_counters.lock().ok().and_then(|c| c.get(&(s as *const Step as usize)).cloned()),
            assert: assert.unwrap_or_default(),
            upstream: self.upstream(s),
            sub_agents: self.sub_agents(def, s, depth)?,
            fallbacks,
            answers: self.engine.answers.clone(),
            max_questions: s.max_questions.or(def.max_questions).unwrap_or(3).max(0) as u32,
            ask: self.ask_spec(def, s, depth)?,
            image,
            container,
            env: s.env.clone().or_else(|| def.env.clone()).unwrap_or_default(),
            mcp_servers,
            compact_budget: compaction_budget(def, &wire_model_for_budget),
            delegate_percent: def
                .delegate_budget_percent
                .or_else(|| self.engine.pipeline.defaults.as_ref().and_then(|d| d.delegate_budget_percent))
                .unwrap_or(10)
                .clamp(1, 100) as u32,
            session: steppe_runtime::agent_work::session_label(&self.job.name, &self.run_id, &name),
            cli,
        })
    }

    /// The ask_user grant (when the agent grants it and the step keeps it).
    fn ask_spec(&self, def: &AgentDef, s: &Step, depth: usize) -> Result<Option<Box<steppe_runtime::agent_work::AskSpec>>, StepError> {
        let grant = def.tools.iter().flatten().find_map(|g| match g {
            ToolGrant::Name(n) if n == "ask_user" => Some(None),
            ToolGrant::Spec(spec) if spec.builtin.as_deref() == Some("ask_user") => Some(Some(spec.as_ref())),
            _ => None,
        });
        let Some(spec) = grant else { return Ok(None) };
        if let Some(sel) = s.tools.as_ref().filter(|t| !t.is_empty()) {
            if !sel.iter().any(|t| matches!(t, ToolGrant::Name(n) if n == "ask_user")) {
                return Ok(None);
            }
        }
        let answered_by = match spec.and_then(|sp| sp.answered_by.clone()) {
            Some(name) if depth < 8 => {
                let step = Step { agent: Some(name.clone()), ..Default::default() };
                Some(SubAgent { name: name.clone(), description: String::new(), work: self.resolve_at(&step, &Vec::new(), None, depth + 1)? })
            }
            _ => None,
        };
        Ok(Some(Box::new(steppe_runtime::agent_work::AskSpec {
            answered_by,
            default: spec.and_then(|sp| sp.default.clone()),
            options_required: spec.and_then(|sp| sp.options_required).unwrap_or(false),
            // A person is asked at this process's terminal when the step runs here.
            inline: self.engine.submission.is_none() && matches!(self.engine.docker, super::docker::Docker::Local) && std::io::IsTerminal::is_terminal(&std::io::stdin()),
            timeout_ms: spec.and_then(|sp| sp.timeout).and_then(|t| t.to_std()).map(|t| t.as_millis() as u64),
            park: self.engine.park_questions,
            // `-p FILE` names an embedded run's store; a submitted run's is `--coordinator URL`.
            answer_with: if self.engine.submission.is_some() { self.engine.decide_with.clone() } else { format!("-p {}", self.engine.decide_with) },
        })))
    }

    /// Where an agent's model is reached, and its fallbacks in order.
    pub(super) fn sources_of(&self, def: &AgentDef) -> Result<(Endpoint, Vec<Endpoint>), StepError> {
        let name = &def.name;
        let model = def
            .source
            .as_ref()
            .and_then(|s| s.model.clone())
            .or_else(|| self.engine.env_model.clone())
            .or_else(|| self.engine.pipeline.defaults.as_ref().and_then(|d| d.model.clone()))
            .ok_or_else(|| StepError::errored(format!("agent \"{name}\" has no model")))?;
        let src = def.source.clone().unwrap_or_default();
        // A CLI source (`@claude/…`) holds its own conversation: no endpoint. It
        // may be a fallback pinned by preflight, and have fallbacks of its own
        // there, but no conversation fails over to or from it mid-run (§5.8).
        let source = |s: &Source, m: &str, scripted: Option<&str>| {
            if m.starts_with('@') {
                Endpoint { model: m.to_string(), base_url: String::new(), api_key_env: s.api_key_env.clone(), key_required: s.api_key_env.is_some(), ..Default::default() }
            } else {
                self.endpoint(s, m, scripted)
            }
        };
        let primary = source(&src, &model, self.engine.scripted.as_deref());
        let fallbacks: Vec<Endpoint> = match (&self.engine.scripted, &self.engine.scripted_fallback) {
            // Under a scenario only the first fallback is pointed at the scenario's fallback script.
            (Some(_), Some(fb_url)) => def
                .fallback
                .iter()
                .flatten()
                .take(1)
                .filter_map(|f| f.source.as_ref())
                .map(|fs| source(fs, fs.model.as_deref().unwrap_or(&model), Some(fb_url)))
                .collect(),
            (Some(_), None) => Vec::new(),
            (None, _) => def
                .fallback
                .iter()
                .flatten()
                .filter_map(|f| f.source.as_ref())
                .map(|fs| source(fs, fs.model.as_deref().unwrap_or(&model), None))
                .collect(),
        };
        // Each fallback brings the compaction budget of its own model (adopted on failover).
        let fallbacks = fallbacks.into_iter().map(|f| Endpoint { compact_budget: if f.model.starts_with('@') { 0 } else { compaction_budget(def, &f.model) }, ..f }).collect();
        Ok((primary, fallbacks))
    }

    /// Where a source is reached: its provider prefix or endpoint, or the scripted model.
    fn endpoint(&self, src: &Source, model: &str, scripted: Option<&str>) -> Endpoint {
        let provider = provider_of(model);
        let wire = match provider {
            Some(p) => model[p.prefix.len() + 1..].to_string(),
            None => model.to_string(),
        };
        if let Some(url) = scripted {
            return Endpoint { model: wire, base_url: url.to_string(), ..Default::default() };
        }
        let mut base = src.endpoint.clone().or(provider.map(|p| p.base_url.to_string())).unwrap_or_default();
        if !base.ends_with('/') {
            base.push('/');
        }
        Endpoint {
            model: wire,
            base_url: base,
            api_key_env: key_env(src.api_key_env.as_deref(), model),
            key_required: src.api_key_env.is_some() || provider.is_some_and(|p| p.key_required),
            string_tool_choice: src.string_tool_choice.unwrap_or(provider.is_some_and(|p| p.string_tool_choice)),
            compact_budget: 0,
        }
    }

    /// The sub-agents an agent grants (and the step does not narrow away).
    fn sub_agents(&self, def: &AgentDef, s: &Step, depth: usize) -> Result<Vec<SubAgent>, StepError> {
        if depth >= 8 {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        for g in def.tools.iter().flatten() {
            let ToolGrant::Spec(spec) = g else { continue };
            let Some(child) = &spec.agent else { continue };
            let selected = match &s.tools {
                Some(sel) if !sel.is_empty() => sel.iter().any(|t| matches!(t, ToolGrant::Name(n) if n == child)),
                _ => true,
            };
            if !selected {
                continue;
            }
            let child_def = self.agent_def(child).ok_or_else(|| StepError::errored(format!("sub-agent \"{child}\" is not declared")))?;
            let step = Step { agent: Some(child.clone()), ..Default::default() };
            let work = self.resolve_at(&step, &Vec::new(), None, depth + 1)?;
            out.push(SubAgent {
                name: child.clone(),
                description: spec.description.clone().or(child_def.description.clone()).unwrap_or_default(),
                work,
            });
        }
        Ok(out)
    }

    /// A task's `fix:` as the conversation the worker runs when the task fails:
    /// the fix agent's grant (narrowed by `fix.tools`) plus the task itself as a
    /// zero-argument rerun tool, one attempt per request unless set.
    pub(super) fn resolve_fix(&self, fix: &steppe_language::model::Fix, task: &str, command: &str) -> Result<AgentWork, StepError> {
        let agent = fix.agent().unwrap_or_default().to_string();
        let spec = fix.spec();
        let default = format!(
            "A command that must pass has just failed; its output is below. Investigate the working directory, make the smallest change that resolves the failure, then call the \"{task}\" tool to re-run the command and confirm it passes. Repeat until it passes, then reply with a brief summary and stop."
        );
        let messages = match spec.map(|s| s.resolved_messages.clone()).filter(|m| !m.is_empty()) {
            Some(m) => m,
            None => vec![Message::Text(default)],
        };
        let step = Step {
            agent: Some(agent),
            resolved_messages: messages,
            tools: spec.and_then(|s| s.tools.clone()),
            dir: spec.and_then(|s| s.dir.clone()),
            attempts: Some(spec.and_then(|s| s.attempts).unwrap_or(1)),
            timeout: spec.and_then(|s| s.timeout),
            ..Default::default()
        };
        let mut work = self.resolve(&step, &Vec::new(), None)?;
        work.tools.push(ToolDef::Custom {
            name: task.to_string(),
            description: format!("Re-run the \"{task}\" task's command. Returns exit_code, stdout, stderr."),
            run: command.to_string(),
            required: false,
            max_calls: 0,
            pinned: Map::new(),
            max_output_bytes: None,
            timeout_ms: None,
            literal: true,
        });
        Ok(work)
    }

    /// An agent step: resolved here, conversed on a worker.
    /// `vocab` overrides the step's verdicts (an ensemble member votes in the block's).
    pub(super) async fn agent(self: &Arc<Self>, s: &Step, cell: &Cell, vocab: Option<&[String]>) -> Done {
        let name = s.agent.clone().unwrap_or_default();
        let label = if cell.is_empty() { name.clone() } else { cell_label(&name, cell) };
        let work = match self.resolve(s, cell, vocab) {
            Ok(w) => w,
            Err(e) => return self.finish_err(&label, e),
        };
        // A primary preflight found down: the step says which fallback serves it, and records it.
        let pinned = super::preflight::pinned_fallback(&self.engine.scope.pipeline, &name).is_some();
        if pinned {
            let primary = self.agent_def(&name).and_then(|d| self.sources_of(d).ok()).map(|(p, _)| p.model).unwrap_or_default();
            self.engine.out.run_note(&self.run_id, &format!("agent: {label} (fallback: {} — {primary} is unavailable)", work.model));
        }
        let served_by = work.model.clone();
        let outputs = s.outputs.clone().unwrap_or_default();
        let a = Assignment {
            env: s.env.clone().unwrap_or_default(),
            inputs: self.input_refs(s.input_names(), None),
            outputs,
            agent: Some(Box::new(work)),
            ..Assignment::command(&self.run_id, &label, String::new())
        };
        let mut d = self.attempts(&label, a, 1).await;
        if let (true, Some(o)) = (pinned, d.agent.as_mut()) {
            o.fallback_model.get_or_insert(served_by);
        }
        if let Some(o) = &d.agent {
            if let Some(v) = &o.verdict {
                self.engine.out.run_note(&self.run_id, &format!("verdict: {v}"));
            }
            if let Some(n) = &o.note {
                self.engine.out.run_note(&self.run_id, &format!("note: {n}"));
            }
            for den in &o.denials {
                self.engine.out.run_note(&self.run_id, &format!("denied: {} {} — {}", den.tool, den.path, den.reason));
            }
        }
        if d.result.is_err() {
            // A failed step carries no verdict.
            if let Some(o) = d.agent.as_mut() {
                o.verdict = None;
            }
        }
        self.decided(&label, &d);
        d
    }

    /// An ensemble: members vote concurrently in the block's vocabulary, then
    /// the decide rule (or a judge agent) picks the block's verdict.
    pub(super) async fn ensemble(self: &Arc<Self>, s: &Step) -> Done {
        let Some(e) = &s.ensemble else { return Done::ok(Vec::new()) };
        let vocab: Vec<String> = e.verdicts.iter().flatten().map(|v| v.name.clone()).filter(|n| n != "failure").collect();
        let rule = e.decide.clone().unwrap_or_else(|| "majority".into());
        let exclude = e.member_errors.as_deref() == Some("exclude");
        self.engine.out.run_note(&self.run_id, &format!("ensemble: {} agents, decide {rule}", e.agents.len()));
        let results = futures::future::join_all(e.agents.iter().map(|m| self.step_as_member(m, &vocab))).await;
        let mut log = Vec::new();
        let mut votes: Vec<(String, String, Option<String>)> = Vec::new();
        let mut errors = Vec::new();
        for (m, d) in e.agents.iter().zip(results) {
            log.extend(d.log.clone());
            let name = m.agent.clone().unwrap_or_default();
            match (&d.result, d.agent.as_ref().and_then(|o| o.verdict.clone())) {
                (Ok(()), Some(v)) => votes.push((name, v, d.agent.as_ref().and_then(|o| o.note.clone()))),
                (Err(err), _) => errors.push(err.clone()),
                (Ok(()), None) => errors.push(StepError::failed(format!("{name} did not vote"))),
            }
        }
        if !errors.is_empty() && (!exclude || votes.is_empty()) {
            return Done::err(super::run::combined(&errors, "ensemble: "), log);
        }
        let count = |v: &str| votes.iter().filter(|(_, x, _)| x == v).count();
        let decision: Result<String, String> = match rule.as_str() {
            "majority" => vocab.iter().find(|v| count(v) * 2 > votes.len()).cloned().ok_or_else(|| {
                let tally: Vec<String> = vocab.iter().filter(|v| count(v) > 0).map(|v| format!("{v}={}", count(v))).collect();
                format!("ensemble: decide: majority, but no verdict has one ({} of {} voters); name an agent in decide: to break ties", tally.join(" "), votes.len())
            }),
            "unanimous" => {
                let first = votes.first().map(|(_, v, _)| v.clone()).unwrap_or_default();
                if votes.iter().all(|(_, v, _)| *v == first) { Ok(first) } else { Err("ensemble: decide: unanimous, but the members disagree".into()) }
            }
            "any" => vocab.iter().find(|v| count(v) > 0).cloned().ok_or_else(|| "ensemble: decide: any, but nobody voted".into()),
            judge => {
                let mut text = String::from("Several agents were asked the same question and voted independently. Decide the final verdict, using their reasoning as evidence rather than as a tally.\n\n");
                for (a, v, n) in &votes {
                    text.push_str(&format!("- {a} voted \"{v}\"{}\n", n.as_ref().filter(|n| !n.is_empty()).map(|n| format!(": {n}")).unwrap_or_default()));
                }
                text.push_str(&format!("\nThe verdicts available to you are: {}.\n", vocab.join(", ")));
                let judge_step = Step { agent: Some(judge.to_string()), resolved_messages: vec![Message::Text(text)], ..Default::default() };
                let d = self.agent(&judge_step, &Vec::new(), Some(&vocab)).await;
                log.extend(d.log.clone());
                match (&d.result, d.agent.as_ref().and_then(|o| o.verdict.clone())) {
                    (Ok(()), Some(v)) => Ok(v),
                    (Err(e), _) => return Done::err(e.with_message(format!("ensemble judge {judge}: {}", e.message)), log),
                    _ => Err(format!("ensemble judge {judge} gave no verdict")),
                }
            }
        };
        match decision {
            Ok(v) => {
                self.engine.out.run_note(&self.run_id, &format!("ensemble decide: {rule} → {v}"));
                let mut d = Done::ok(log);
                d.agent = Some(steppe_runtime::agent_work::AgentOutcome { verdict: Some(v), ..Default::default() });
                d
            }
            Err(m) => Done::err(StepError::errored(m), log),
        }
    }

    fn step_as_member<'a>(self: &'a Arc<Self>, m: &'a Step, vocab: &'a [String]) -> super::run::BoxFut<'a, Done> {
        Box::pin(async move { self.agent(m, &Vec::new(), Some(vocab)).await })
    }
}
