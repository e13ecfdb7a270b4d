//! Preflight: before a job's first step, each model source its agents use is
//! asked for one token (an answer is trusted for a while); a primary that does
//! not answer gives way to the first fallback that does, pinned for the
//! process; when an agent has none, the job fails before any step runs. The
//! MCP servers they are granted are reached too (an HTTP server connected to
//! and its granted tool names checked; a stdio server's program looked for).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde_json::json;
use steppe_language::model::{AgentDef, ToolGrant};
use steppe_runtime::agent_work::Endpoint;
use steppe_runtime::outcome::StepError;

use super::run::JobRun;

const TIMEOUT: Duration = Duration::from_secs(30);
const TRUST: Duration = Duration::from_secs(5 * 60);
/// What `defaults.preflight.cache` may ask for at most.
const TRUST_MAX: Duration = Duration::from_secs(15 * 60);

/// Sources that answered, and when.
fn trusted() -> &'static Mutex<HashMap<String, Instant>> {
    static T: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Agents whose primary did not answer: the fallback that serves them
/// instead (its index), by pipeline and agent.
fn pinned() -> &'static Mutex<HashMap<(String, String), usize>> {
    static P: OnceLock<Mutex<HashMap<(String, String), usize>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// The fallback agent `agent` of `pipeline` was pinned to, if any.
pub(super) fn pinned_fallback(pipeline: &str, agent: &str) -> Option<usize> {
    pinned().lock().ok()?.get(&(pipeline.to_string(), agent.to_string())).copied()
}

fn key_of(e: &Endpoint) -> String {
    format!("model|{}|{}", e.base_url, e.model)
}

/// Asks `e` for one token. A key variable not set here is not a failure:
/// the worker that runs the step may hold it (and says so if not).
pub(super) async fn probe(e: &Endpoint, timeout: Duration) -> Result<(), String> {
    // A CLI agent (`@claude/…`): its program must be on PATH; it is a host subprocess wherever its tools run.
    if let Some(spec) = e.model.strip_prefix('@') {
        let program = spec.split_once('/').map_or(spec, |(p, _)| p);
        return if steppe_language::machine::on_path(program).is_some() { Ok(()) } else { Err(format!("{program} is not on PATH (install the {program} CLI, or give the agent a hosted model)")) };
    }
    let key = e.api_key_env.as_deref().and_then(|v| std::env::var(v).ok()).filter(|k| !k.is_empty());
    if key.is_none() && e.key_required {
        return Ok(());
    }
    let body = json!({"model": e.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    match tokio::time::timeout(timeout, steppe_worker::provider::chat(&e.base_url, key.as_deref(), &body, 1, &|_| {})).await {
        Err(_) => Err(format!("no answer within {}", steppe_language::duration::show(timeout))),
        Ok(Err(err)) => Err(steppe_runtime::secrets::mask(&err.to_string()).into_owned()),
        Ok(Ok(_)) => Ok(()),
    }
}

impl JobRun {
    /// The agents this job's plan, its hooks and its fix agents reach, and
    /// the sub-agents they grant, each once.
    fn reached_agents(&self) -> Vec<&AgentDef> {
        let p = &self.engine.pipeline;
        let mut names: BTreeSet<String> = BTreeSet::new();
        steppe_language::model::walk::each_step_of(&self.job, "", &mut |s, _| {
            names.extend(s.agent.clone());
            names.extend(s.fix.as_ref().and_then(|f| f.agent()).map(str::to_string));
        });
        let mut queue: Vec<String> = names.iter().cloned().collect();
        while let Some(n) = queue.pop() {
            let Some(def) = p.agents.iter().find(|a| a.name == n) else { continue };
            for g in def.tools.iter().flatten() {
                if let ToolGrant::Spec(spec) = g {
                    if let Some(child) = spec.agent.clone().filter(|c| names.insert(c.clone())) {
                        queue.push(child);
                    }
                }
            }
        }
        names.iter().filter_map(|n| p.agents.iter().find(|a| &a.name == n)).collect()
    }

    /// Probes what the job's agents use; pins fallbacks for primaries that
    /// do not answer. Err: the job fails, naming each agent and source.
    pub(super) async fn preflight(self: &Arc<Self>) -> Result<(), StepError> {
        let defaults = self.engine.pipeline.defaults.as_ref().and_then(|d| d.preflight.as_ref());
        if !self.engine.preflight || defaults.and_then(|d| d.disabled).unwrap_or(false) {
            return Ok(());
        }
        let report = self.probe_sources().await;
        for p in &report.pinned {
            self.engine.out.run_note(&self.run_id, &format!("preflight: {p}"));
        }
        if report.problems.is_empty() {
            return Ok(());
        }
        Err(StepError::errored(format!("job \"{}\": preflight failed, no steps were run:\n  {}", self.job.name, report.problems.join("\n  "))))
    }

    /// Probes every source the job's agents use (those that opted out
    /// aside) and pins fallbacks: what answered, what was pinned, what failed.
    pub async fn probe_sources(self: &Arc<Self>) -> Report {
        let defaults = self.engine.pipeline.defaults.as_ref().and_then(|d| d.preflight.as_ref());
        let timeout = defaults.and_then(|d| d.timeout).and_then(|t| t.to_std()).unwrap_or(TIMEOUT);
        let trust = defaults.and_then(|d| d.cache).and_then(|t| t.to_std()).unwrap_or(TRUST).min(TRUST_MAX);
        let mut report = Report::default();
        // One probe per source, whoever uses it.
        let mut answered: HashMap<String, Result<(), String>> = HashMap::new();
        for def in self.reached_agents() {
            let Ok((primary, fallbacks)) = self.sources_of(def) else { continue };
            if !def.preflight.unwrap_or(true) || primary.model.is_empty() {
                continue;
            }
            let mut failed: Vec<String> = Vec::new();
            let mut served = None;
            for (i, e) in std::iter::once(&primary).chain(fallbacks.iter()).enumerate() {
                let key = key_of(e);
                let fresh = trusted().lock().ok().and_then(|t| t.get(&key).copied()).is_some_and(|at| at.elapsed() < trust);
                let r = match answered.get(&key) {
                    _ if fresh => Ok(()),
                    // A submitted run's CLI is looked for by the worker that runs it, not here.
                    _ if e.model.starts_with('@') && self.engine.submission.is_some() => Ok(()),
                    Some(r) => r.clone(),
                    None => {
                        let r = probe(e, timeout).await;
                        if r.is_ok() {
                            if let Ok(mut t) = trusted().lock() {
                                t.insert(key.clone(), Instant::now());
                            }
                        }
                        answered.insert(key.clone(), r.clone());
                        r
                    }
                };
                match r {
                    Ok(()) => {
                        served = Some(i);
                        break;
                    }
                    Err(why) => failed.push(format!("agent \"{}\": {}: {why}", def.name, source_shown(e))),
                }
            }
            match served {
                Some(0) => report.ok.push(format!("agent \"{}\": {}", def.name, source_shown(&primary))),
                Some(i) => {
                    let fb = &fallbacks[i - 1];
                    report.pinned.push(format!("agent {} runs on its fallback {} — {} is unavailable", def.name, fb.model, primary.model));
                    if let Ok(mut p) = pinned().lock() {
                        p.insert((self.engine.scope.pipeline.clone(), def.name.clone()), i - 1);
                    }
                }
                None => report.problems.extend(failed),
            }
        }
        // The MCP servers of each agent step as the step narrows its grant.
        let mut reached: HashMap<String, Result<(), String>> = HashMap::new();
        let mut steps: Vec<steppe_language::model::Step> = Vec::new();
        steppe_language::model::walk::each_step_of(&self.job, "", &mut |s, _| {
            if s.agent.is_some() {
                steps.push(s.clone());
            }
        });
        let mut said: BTreeSet<String> = BTreeSet::new();
        // A submitted run's MCP servers are the workers' to reach (their
        // programs, networks and tokens), not this coordinator's.
        if self.engine.submission.is_some() {
            steps.clear();
        }
        for step in steps {
            let agent = step.agent.clone().unwrap_or_default();
            if self.agent_def(&agent).is_some_and(|d| !d.preflight.unwrap_or(true)) {
                continue;
            }
            // What does not resolve is said by the step itself.
            let Ok(work) = self.resolve_at(&step, &Vec::new(), None, 0) else { continue };
            for (name, r) in self.probe_mcp(&work, trust, &mut reached).await {
                let (line, bad) = match r {
                    Ok(server) => (format!("agent \"{name}\": MCP server \"{server}\""), false),
                    Err(problem) => (format!("agent \"{name}\": {problem}"), true),
                };
                if said.insert(line.clone()) {
                    if bad { report.problems.push(line) } else { report.ok.push(line) }
                }
            }
        }
        report
    }

    /// Reaches the MCP servers a resolved agent step (and the agents it
    /// delegates to or is answered by) is granted tools of, each once per
    /// preflight (`reached`): per agent, each server's name or why it cannot
    /// serve the grant.
    async fn probe_mcp(self: &Arc<Self>, work: &steppe_runtime::agent_work::AgentWork, trust: Duration, reached: &mut HashMap<String, Result<(), String>>) -> Vec<(String, Result<String, String>)> {
        use steppe_runtime::agent_work::{AgentWork, ToolDef};
        let mut works: Vec<&AgentWork> = vec![work];
        let mut out = Vec::new();
        while let Some(w) = works.pop() {
            works.extend(w.sub_agents.iter().map(|s| &s.work));
            works.extend(w.ask.as_ref().and_then(|a| a.answered_by.as_ref()).map(|s| &s.work));
            for server in &w.mcp_servers {
                let grants: Vec<&ToolDef> = w.tools.iter().filter(|t| matches!(t, ToolDef::Mcp { server: s, .. } if s == &server.name)).collect();
                if grants.is_empty() {
                    continue;
                }
                let key = format!("mcp|{}|{}|{}|{:?}", server.name, server.endpoint.as_deref().unwrap_or_default(), server.command.join(" "), grants);
                let fresh = trusted().lock().ok().and_then(|t| t.get(&key).copied()).is_some_and(|at| at.elapsed() < trust);
                let r = match reached.get(&key) {
                    _ if fresh => Ok(()),
                    Some(r) => r.clone(),
                    None => {
                        let r = probe_mcp_server(server, &grants, &self.engine.dir).await;
                        if r.is_ok() {
                            if let Ok(mut t) = trusted().lock() {
                                t.insert(key.clone(), Instant::now());
                            }
                        }
                        reached.insert(key, r.clone());
                        r
                    }
                };
                out.push((w.agent.clone(), r.map(|()| server.name.clone())));
            }
        }
        out
    }
}

/// An HTTP server is connected to and its tools listed against the grant
/// (a token variable not set here is the worker's to hold); a stdio server,
/// started on the worker in the step's directory, has its program looked for.
async fn probe_mcp_server(server: &steppe_runtime::agent_work::McpServerWork, grants: &[&steppe_runtime::agent_work::ToolDef], dir: &std::path::Path) -> Result<(), String> {
    if server.endpoint.is_some() {
        if server.bearer_env.as_deref().is_some_and(|v| std::env::var(v).map_or(true, |t| t.is_empty())) {
            return Ok(());
        }
        // Signed in on the machines that run the steps, perhaps not here.
        if server.oauth && !steppe_worker::tools::mcp_oauth::credentials_path(&server.name).exists() {
            return Ok(());
        }
        return match steppe_worker::tools::mcp::McpSessions::open(std::slice::from_ref(server), grants, dir).await {
            Ok(sessions) => {
                sessions.close().await;
                Ok(())
            }
            Err(e) => Err(steppe_runtime::secrets::mask(&e.to_string()).into_owned()),
        };
    }
    if !server.stepfiles.is_empty() {
        // Served by this binary's `steppe gate`; its stepfiles loaded when the work was made.
        return Ok(());
    }
    let Some(program) = server.command.first() else { return Err(format!("MCP server \"{}\" has no command", server.name)) };
    // A relative path names a file in the step's directory, on the worker.
    let found = (program.contains('/') && !program.starts_with('/')) || steppe_language::machine::on_path(program).is_some();
    if found {
        Ok(())
    } else {
        Err(format!("MCP server \"{}\" cannot start: {program:?} is not on PATH (install it, or name it by its path in command:)", server.name))
    }
}

/// What a preflight found.
#[derive(Debug, Default)]
pub struct Report {
    /// Agents whose primary answered.
    pub ok: Vec<String>,
    /// Agents that run on a fallback, and why.
    pub pinned: Vec<String>,
    /// Agents none of whose sources answered: one line per source.
    pub problems: Vec<String>,
}

/// A source as preflight names it: `model at URL`, or a CLI agent's `@cli/model`.
fn source_shown(e: &Endpoint) -> String {
    if e.base_url.is_empty() {
        e.model.clone()
    } else {
        format!("{} at {}", e.model, e.base_url)
    }
}
