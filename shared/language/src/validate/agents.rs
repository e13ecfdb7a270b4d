//! Agents: sources and providers, CLI restrictions, dials, budgets and the
//! closed tool grant (deny by default: only known built-ins, declared custom
//! tools, declared agents and declared MCP servers).

use std::collections::{HashMap, HashSet};

use super::resources::url_parts;
use super::{check_container, is_env_name, Container, Cx};
use crate::builtins::{self, BUILTIN_TOOLS, CLIS, DEFAULT_TOOLS};
use crate::model::{AgentDef, Source, ToolGrant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantKind {
    Builtin,
    Custom,
    SubAgent,
    Mcp,
}

/// One tool as the model sees it.
#[derive(Debug, Clone)]
pub(crate) struct GrantEntry {
    pub kind: GrantKind,
    /// The model-facing name (`read_file`, `post_review`, `github__search`).
    pub name: String,
    /// What a step's `tools:` may select it by (a bare server for MCP subset/all grants).
    pub reference: String,
    /// Pinned argument names (custom tools).
    pub pinned: Vec<String>,
}

/// The tools a grant gives (the read-only default when it is absent or empty).
pub(crate) fn effective_grant(tools: Option<&[ToolGrant]>) -> Vec<GrantEntry> {
    let builtin = |n: &str| GrantEntry {
        kind: GrantKind::Builtin,
        name: n.to_string(),
        reference: n.to_string(),
        pinned: Vec::new(),
    };
    let tools = match tools {
        Some(t) if !t.is_empty() => t,
        _ => return DEFAULT_TOOLS.iter().map(|n| builtin(n)).collect(),
    };
    let mut out = Vec::new();
    for g in tools {
        match g {
            ToolGrant::Name(n) => out.push(builtin(n)),
            ToolGrant::Spec(s) => {
                if let Some(b) = &s.builtin {
                    out.push(builtin(b));
                } else if let Some(a) = &s.agent {
                    out.push(GrantEntry { kind: GrantKind::SubAgent, name: a.clone(), reference: a.clone(), pinned: Vec::new() });
                } else if let Some(m) = &s.mcp {
                    if let Some(t) = &s.tool {
                        let n = format!("{m}__{t}");
                        out.push(GrantEntry { kind: GrantKind::Mcp, name: n.clone(), reference: n, pinned: Vec::new() });
                    } else if let Some(ts) = &s.tools {
                        for t in ts {
                            out.push(GrantEntry { kind: GrantKind::Mcp, name: format!("{m}__{t}"), reference: m.clone(), pinned: Vec::new() });
                        }
                    } else {
                        out.push(GrantEntry { kind: GrantKind::Mcp, name: format!("{m}__*"), reference: m.clone(), pinned: Vec::new() });
                    }
                } else if let Some(n) = &s.name {
                    out.push(GrantEntry {
                        kind: GrantKind::Custom,
                        name: n.clone(),
                        reference: n.clone(),
                        pinned: s.args.as_ref().map(|a| a.keys().cloned().collect()).unwrap_or_default(),
                    });
                }
            }
        }
    }
    out
}

/// The model an agent runs on: its own, else `$STEPPE_MODEL`, else `defaults.model`.
pub(crate) fn resolved_model(cx: &Cx, a: &AgentDef) -> Option<String> {
    a.source
        .as_ref()
        .and_then(|s| s.model.clone())
        .filter(|m| !m.is_empty())
        .or_else(|| cx.opts.env_model.clone())
        .or_else(|| cx.p.defaults.as_ref().and_then(|d| d.model.clone()))
        .filter(|m| !m.is_empty())
}

fn is_cli(model: &str) -> bool {
    model.starts_with('@')
}

fn check_source(cx: &mut Cx, agent: &str, src: Option<&Source>, model: Option<&str>, path: &str) {
    let endpoint = src.and_then(|s| s.endpoint.as_deref());
    if let Some(m) = model {
        if let Some(cli_spec) = m.strip_prefix('@') {
            let (cli, rest) = cli_spec.split_once('/').unwrap_or((cli_spec, ""));
            if cli == "builtin" {
                cx.err(&format!("{path}.model"), format!("agent \"{agent}\": model \"{m}\" names a profile, not a model; a @builtin/ profile is an agent name"));
            } else if !CLIS.contains(&cli) {
                cx.err(&format!("{path}.model"), format!("agent \"{agent}\": model \"{m}\" names no known cli; supported: {}", CLIS.join(", ")));
            } else if rest.trim().is_empty() {
                cx.err(&format!("{path}.model"), format!("agent \"{agent}\": model \"{m}\" must name a model after the cli, e.g. @claude/sonnet"));
            }
            if endpoint.is_some() {
                cx.err(&format!("{path}.endpoint"), format!("agent \"{agent}\": model \"{m}\" is a cli source and has no endpoint to configure; remove source.endpoint"));
            }
        } else if builtins::provider_of(m).is_none() && endpoint.is_none() {
            cx.err(&format!("{path}.model"), format!("agent \"{agent}\": model \"{m}\" has no known provider prefix; set source.endpoint (known prefixes: {})", builtins::PROVIDERS.iter().map(|p| p.prefix).collect::<Vec<_>>().join(", ")));
        }
    }
    if let Some(e) = endpoint {
        match url_parts(e) {
            Err(msg) => cx.err(&format!("{path}.endpoint"), format!("agent \"{agent}\": source.endpoint {msg}")),
            Ok((_, true)) => cx.err(&format!("{path}.endpoint"), format!("agent \"{agent}\": source.endpoint must not carry credentials; name the key's variable in api_key_env")),
            _ => {}
        }
    }
    if let Some(k) = src.and_then(|s| s.api_key_env.as_deref()) {
        if !is_env_name(k) {
            cx.err(&format!("{path}.api_key_env"), format!("agent \"{agent}\": api_key_env must be the NAME of an environment variable, not \"{k}\""));
        }
    }
}

pub(crate) fn check(cx: &mut Cx) {
    let p = cx.p;
    // The answered_by responders and sub-agents of used agents are used too.
    let mut frontier: Vec<&str> = cx.used_agents.iter().copied().collect();
    while let Some(a) = frontier.pop() {
        let Some(def) = cx.agents.get(a).copied() else { continue };
        for g in def.tools.iter().flatten() {
            if let ToolGrant::Spec(s) = g {
                for target in [s.agent.as_deref(), s.answered_by.as_deref()].into_iter().flatten() {
                    if let Some(t) = cx.agents.get(target).copied() {
                        if cx.used_agents.insert(t.name.as_str()) {
                            frontier.push(t.name.as_str());
                        }
                    }
                }
            }
        }
    }
    for (i, a) in p.agents.iter().enumerate() {
        let used = cx.used_agents.contains(a.name.as_str());
        if a.name.starts_with("@builtin/") && !used && a.source.is_none() {
            continue;
        }
        check_agent(cx, a, &format!("agents[{i}]"), used);
    }
    check_sub_agent_graph(cx);
}

fn check_agent(cx: &mut Cx, a: &AgentDef, path: &str, used: bool) {
    let name = a.name.as_str();
    let model = resolved_model(cx, a);
    if model.is_none() && used {
        cx.err(path, format!("agent \"{name}\" has no model: set source.model, $STEPPE_MODEL, or defaults.model"));
    }
    check_source(cx, name, a.source.as_ref(), model.as_deref(), &format!("{path}.source"));
    let cli = model.as_deref().filter(|m| is_cli(m));
    if let Some(m) = cli {
        for (set, field, why) in [
            (a.temperature.is_some(), "temperature", "the cli chooses its own sampling"),
            (a.top_p.is_some(), "top_p", "the cli chooses its own sampling"),
            (a.max_tokens.is_some(), "max_tokens", "the cli chooses its own output limits"),
            (a.source.as_ref().is_some_and(|s| s.string_tool_choice.is_some()), "source.string_tool_choice", "there is no tool_choice on the wire to spell"),
            (a.compact_after_tokens.is_some(), "compact_after_tokens", "the cli compacts its own conversation"),
            (a.context_window.is_some(), "context_window", "the cli compacts its own conversation"),
            (a.budget.as_ref().is_some_and(|b| b.tokens.is_some()), "budget.tokens", "nothing counts tokens until the subprocess exits (use budget.usd)"),
        ] {
            if set {
                cx.err(path, format!("agent \"{name}\": {field} is not supported with a cli source ({m}); {why} — remove it or use a hosted provider"));
            }
        }
        for g in effective_grant(a.tools.as_deref()) {
            if g.kind == GrantKind::SubAgent {
                cx.err(&format!("{path}.tools"), format!("agent \"{name}\": tool \"{}\" grants a sub-agent, which is not supported with a cli source ({m})", g.name));
            }
        }
    } else {
        if a.budget.as_ref().is_some_and(|b| b.usd.is_some()) {
            cx.err(&format!("{path}.budget.usd"), format!("agent \"{name}\": budget.usd is only supported with a cli source; a hosted agent's budget counts tokens"));
        }
        if a.settings.is_some() {
            cx.err(&format!("{path}.settings"), format!("agent \"{name}\": settings is only supported with a cli source"));
        }
    }
    if let Some(s) = a.settings.as_deref() {
        if s != "project" {
            cx.err(&format!("{path}.settings"), format!("agent \"{name}\": settings \"{s}\" is not supported; the only value is \"project\""));
        }
    }
    if let Some(b) = &a.budget {
        if b.reserve_per_cell.is_some() {
            cx.err(&format!("{path}.budget.reserve_per_cell"), "budget.reserve_per_cell is only valid on an across: step");
        }
        if !b.tokens.is_some_and(|t| t > 0) && !b.usd.is_some_and(|u| u > 0.0) {
            cx.err(&format!("{path}.budget"), "budget must set tokens or usd to a positive ceiling (omit budget: entirely for no ceiling)");
        }
    }
    if let Some(r) = &a.reasoning_effort {
        if !["low", "medium", "high"].contains(&r.to_lowercase().as_str()) {
            let sug = cx.suggest(r, ["low", "medium", "high"]);
            cx.err(&format!("{path}.reasoning_effort"), format!("agent \"{name}\": reasoning_effort \"{r}\" is not valid; use low, medium or high{sug}"));
        }
    }
    for (v, key) in [
        (a.max_tokens, "max_tokens"),
        (a.max_turns, "max_turns"),
        (a.compact_after_tokens, "compact_after_tokens"),
        (a.context_window, "context_window"),
        (a.max_context_bytes, "max_context_bytes"),
        (a.max_questions, "max_questions"),
    ] {
        if v.is_some_and(|v| v < 0) {
            cx.err(&format!("{path}.{key}"), format!("agent \"{name}\": {key} must not be negative"));
        }
    }
    for (v, key) in [(a.temperature, "temperature"), (a.top_p, "top_p")] {
        if v.is_some_and(|v| v < 0.0) {
            cx.err(&format!("{path}.{key}"), format!("agent \"{name}\": {key} must not be negative"));
        }
    }
    if a.attempts.is_some_and(|n| n < 1) {
        cx.err(&format!("{path}.attempts"), "attempts must be at least 1 — unlike the other limits, 0 does not mean unlimited here");
    }
    if a.timeout.is_some_and(|t| t.as_nanos() < 0) {
        cx.err(&format!("{path}.timeout"), "timeout must be a positive duration (or \"0\" for none)");
    }
    if let Some(d) = a.delegate_budget_percent {
        if !(1..=100).contains(&d) {
            cx.err(&format!("{path}.delegate_budget_percent"), format!("delegate_budget_percent must be between 1 and 100, not {d}"));
        }
    }
    for (i, f) in a.fallback.iter().flatten().enumerate() {
        let fp = format!("{path}.fallback[{i}]");
        match &f.source {
            None => cx.err(&fp, "a fallback entry needs a source:"),
            Some(src) => {
                if src.model.is_none() && src.endpoint.is_none() {
                    cx.err(&fp, "a fallback source needs a model: (and an endpoint: unless the model has a known provider prefix)");
                }
                check_source(cx, name, Some(src), src.model.as_deref(), &format!("{fp}.source"));
            }
        }
    }
    check_container(
        cx,
        &Container {
            image: a.image.as_deref(),
            user: a.user.as_deref(),
            network: a.network.as_deref(),
            privileged: a.privileged,
            limits: a.container_limits.as_ref(),
            env: a.env.as_deref(),
        },
        a.image.as_deref(),
        path,
    );
    let mut seen = HashSet::new();
    for (i, g) in a.tools.iter().flatten().enumerate() {
        let gp = format!("{path}.tools[{i}]");
        check_grant_entry(cx, g, &gp, name);
        for e in effective_grant(Some(std::slice::from_ref(g))) {
            if !seen.insert(e.name.clone()) {
                cx.err(&gp, format!("agent \"{name}\" grants tool \"{}\" twice", e.name));
            }
        }
        if let ToolGrant::Spec(s) = g {
            if let Some(target) = s.agent.as_deref() {
                if let Some(child) = cx.agents.get(target).copied() {
                    if let Some(m) = resolved_model(cx, child).filter(|m| is_cli(m)) {
                        cx.err(&gp, format!("agent \"{name}\": tool \"{target}\" delegates to agent \"{target}\", which has a cli source ({m}); a cli agent cannot run as a sub-agent"));
                    }
                    if s.description.is_none() && child.description.is_none() {
                        cx.err(&gp, format!("agent \"{name}\": sub-agent \"{target}\" needs a description (on this grant or on the agent) so the model knows when to call it"));
                    }
                }
            }
        }
    }
}

/// The rules of one `tools:` entry (agent grants and a step's inline custom tools).
pub(crate) fn check_grant_entry(cx: &mut Cx, g: &ToolGrant, path: &str, agent: &str) {
    let s = match g {
        ToolGrant::Name(n) => {
            if !BUILTIN_TOOLS.contains(&n.as_str()) {
                let sug = cx.suggest(n, BUILTIN_TOOLS.iter().copied());
                cx.err(path, format!("unknown tool \"{n}\"; a bare name grants a built-in tool ({}){sug}. Custom tools, sub-agents and MCP tools are granted as mappings", BUILTIN_TOOLS.join(", ")));
            }
            return;
        }
        ToolGrant::Spec(s) => s,
    };
    let custom = s.name.is_some() || s.run.is_some();
    let forms: Vec<&str> = [
        (s.builtin.is_some(), "builtin:"),
        (custom, "name:/run:"),
        (s.agent.is_some(), "agent:"),
        (s.mcp.is_some(), "mcp:"),
    ]
    .iter()
    .filter(|(set, _)| *set)
    .map(|(_, k)| *k)
    .collect();
    if forms.len() > 1 {
        cx.err(path, format!("a tool entry is exactly one of builtin:, name:/run: (custom), agent: (sub-agent) or mcp:, but this one sets {}", forms.join(" and ")));
        return;
    }
    let field_errors = |cx: &mut Cx, allowed: &[&str], form: &str| {
        for (set, key) in [
            (s.required.is_some(), "required"),
            (s.max_calls.is_some(), "max_calls"),
            (s.args.is_some(), "args"),
            (s.max_output_bytes.is_some(), "max_output_bytes"),
            (s.timeout.is_some(), "timeout"),
            (s.allow.is_some(), "allow"),
            (s.answered_by.is_some(), "answered_by"),
            (s.default.is_some(), "default"),
            (s.options_required.is_some(), "options_required"),
            (s.tool.is_some(), "tool"),
            (s.tools.is_some(), "tools"),
        ] {
            if set && !allowed.contains(&key) {
                cx.err(&format!("{path}.{key}"), format!("{key} is not valid on {form}"));
            }
        }
    };
    if let Some(b) = &s.builtin {
        if !BUILTIN_TOOLS.contains(&b.as_str()) {
            let sug = cx.suggest(b, BUILTIN_TOOLS.iter().copied());
            cx.err(&format!("{path}.builtin"), format!("unknown built-in tool \"{b}\" ({}){sug}", BUILTIN_TOOLS.join(", ")));
        }
        let mut allowed = vec!["timeout"];
        if b == "web_fetch" {
            allowed.push("allow");
        }
        if b == "ask_user" {
            allowed.extend(["answered_by", "default", "options_required"]);
        }
        if s.allow.is_some() && b != "web_fetch" {
            cx.err(&format!("{path}.allow"), "allow is only valid on web_fetch");
        } else if s.required.is_some() {
            cx.err(&format!("{path}.required"), "required is only valid on custom and single MCP tools, not on a built-in tool");
        }
        for (set, key) in [(s.answered_by.is_some(), "answered_by"), (s.default.is_some(), "default"), (s.options_required.is_some(), "options_required")] {
            if set && b != "ask_user" {
                cx.err(&format!("{path}.{key}"), format!("{key} is only valid on ask_user"));
            }
        }
        let form = format!("the built-in tool {b}");
        let filtered: Vec<&str> = allowed.into_iter().chain(["allow", "answered_by", "default", "options_required", "required"]).collect();
        field_errors(cx, &filtered, &form);
        if let Some(hosts) = &s.allow {
            for (i, h) in hosts.iter().enumerate() {
                let bad = h.is_empty() || h.contains("://") || h.contains('/') || h.contains(':') || h.contains('*') || h.contains('?') || h.contains(char::is_whitespace);
                if bad {
                    cx.err(&format!("{path}.allow[{i}]"), format!("allow entry \"{h}\" must be a bare hostname or IPv4 address (no scheme, port, path or wildcard; subdomains are included)"));
                }
            }
        }
        if let Some(r) = &s.answered_by {
            match cx.agents.get(r.as_str()).copied() {
                Some(a) => {
                    cx.used_agents.insert(a.name.as_str());
                }
                None => {
                    let sug = cx.suggest(r, cx.agent_names());
                    cx.err(&format!("{path}.answered_by"), format!("answered_by names agent \"{r}\", which is not declared in agents:{sug}"));
                }
            }
        }
        return;
    }
    if custom {
        match (&s.name, &s.run) {
            (Some(n), Some(_)) => {
                if n.is_empty() || n.len() > 64 || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                    cx.err(&format!("{path}.name"), format!("tool name \"{n}\" must be 1–64 letters, digits, _ or -"));
                }
            }
            _ => cx.err(path, "a custom tool needs both name: and run:"),
        }
        field_errors(cx, &["required", "max_calls", "args", "max_output_bytes", "timeout"], "a custom tool");
        if s.max_calls.is_some_and(|m| m < 0) {
            cx.err(&format!("{path}.max_calls"), "max_calls must not be negative (0 = unlimited)");
        }
        if s.max_output_bytes.is_some_and(|m| m < 0) {
            cx.err(&format!("{path}.max_output_bytes"), "max_output_bytes must not be negative");
        }
        return;
    }
    if let Some(target) = &s.agent {
        field_errors(cx, &[], "a sub-agent tool (only description: is)");
        if !cx.agents.contains_key(target.as_str()) {
            let sug = cx.suggest(target, cx.agent_names());
            cx.err(&format!("{path}.agent"), format!("agent \"{agent}\" grants sub-agent \"{target}\", which is not declared in agents:{sug}"));
        }
        if target == agent {
            cx.err(&format!("{path}.agent"), format!("agent \"{agent}\" grants itself as a sub-agent"));
        }
        return;
    }
    if let Some(server) = &s.mcp {
        if !cx.servers.contains_key(server.as_str()) {
            let names: Vec<&str> = cx.p.mcp_servers.iter().map(|m| m.name.as_str()).collect();
            let sug = cx.suggest(server, names);
            cx.err(&format!("{path}.mcp"), format!("mcp grant names server \"{server}\", which is not declared in mcp_servers:{sug}"));
        }
        if s.tool.is_some() && s.tools.is_some() {
            cx.err(path, "an mcp grant sets tool: (one tool) or tools: (a subset), not both");
        }
        if s.tool.as_deref().is_some_and(str::is_empty) {
            cx.err(&format!("{path}.tool"), "mcp grant names an empty tool");
        }
        if s.tool.is_some() {
            field_errors(cx, &["required", "max_calls", "max_output_bytes", "timeout", "tool"], "a single-tool mcp grant");
        } else {
            field_errors(cx, &["max_output_bytes", "timeout", "tools"], "an mcp subset or whole-server grant (required/max_calls need a single tool:)");
        }
        if s.max_calls.is_some_and(|m| m < 0) {
            cx.err(&format!("{path}.max_calls"), "max_calls must not be negative (0 = unlimited)");
        }
        if s.max_output_bytes.is_some_and(|m| m < 0) {
            cx.err(&format!("{path}.max_output_bytes"), "max_output_bytes must not be negative");
        }
        return;
    }
    cx.err(path, "a tool entry needs builtin:, name: and run: (custom), agent: (sub-agent), or mcp:");
}

/// Sub-agent grants form no cycle and nest at most 8 deep.
fn check_sub_agent_graph(cx: &mut Cx) {
    let p = cx.p;
    let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
    for a in &p.agents {
        let targets = a
            .tools
            .iter()
            .flatten()
            .filter_map(|g| match g {
                ToolGrant::Spec(s) => s.agent.as_deref(),
                _ => None,
            })
            .filter(|t| *t != a.name)
            .collect();
        edges.insert(a.name.as_str(), targets);
    }
    let mut reported = HashSet::new();
    for (i, a) in p.agents.iter().enumerate() {
        let mut stack = vec![a.name.as_str()];
        if let Some(cycle) = find_cycle(&edges, &mut stack) {
            let key: Vec<&str> = {
                let mut k = cycle.clone();
                k.sort();
                k
            };
            if reported.insert(key) {
                cx.err(&format!("agents[{i}].tools"), format!("sub-agent cycle: {}", cycle.join(" → ")));
            }
            continue;
        }
        let depth = depth(&edges, a.name.as_str(), 0);
        if depth > 8 {
            cx.err(&format!("agents[{i}].tools"), format!("agent \"{}\": sub-agents nest {depth} levels deep; the limit is 8", a.name));
        }
    }
}

fn find_cycle<'a>(edges: &HashMap<&'a str, Vec<&'a str>>, stack: &mut Vec<&'a str>) -> Option<Vec<&'a str>> {
    let cur = *stack.last()?;
    for &next in edges.get(cur).map(Vec::as_slice).unwrap_or(&[]) {
        if let Some(pos) = stack.iter().position(|s| *s == next) {
            let mut c: Vec<&str> = stack[pos..].to_vec();
            c.push(next);
            return Some(c);
        }
        if stack.len() > 64 {
            return None;
        }
        stack.push(next);
        if let Some(c) = find_cycle(edges, stack) {
            return Some(c);
        }
        stack.pop();
    }
    None
}

fn depth(edges: &HashMap<&str, Vec<&str>>, from: &str, d: usize) -> usize {
    if d > 10 {
        return d;
    }
    edges
        .get(from)
        .map(|ts| ts.iter().map(|t| depth(edges, t, d + 1)).max().unwrap_or(d))
        .unwrap_or(d)
}
