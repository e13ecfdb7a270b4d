//! Agent steps and ensembles: prompt, the tools a step narrows its agent's grant to, members and their decision.

use std::collections::HashSet;

use crate::validate::agents::{effective_grant, GrantEntry};
use super::super::{first_segment, Cx};
use super::*;
use crate::model::{Message, Step, StepKind, ToolGrant};

pub(super) fn has_prompt(s: &Step) -> bool {
    s.prompt.is_some() || s.prompt_file.is_some() || s.messages.is_some() || s.message_files.is_some()
}

/// The grant an agent step runs with: the step's narrowing of its agent's grant.
pub(crate) fn step_grant(cx: &Cx, s: &Step) -> Vec<GrantEntry> {
    let Some(agent) = s.agent.as_deref().and_then(|a| cx.agents.get(a)) else { return Vec::new() };
    let full = effective_grant(agent.tools.as_deref());
    match &s.tools {
        None => full,
        Some(t) if t.is_empty() => full,
        Some(sel) => {
            let mut out = Vec::new();
            for g in sel {
                match g {
                    ToolGrant::Name(n) => out.extend(full.iter().filter(|e| &e.reference == n || &e.name == n).cloned()),
                    ToolGrant::Spec(spec) => out.extend(effective_grant(Some(&[ToolGrant::Spec(spec.clone())]))),
                }
            }
            out
        }
    }
}

/// A step's (or fix's) `tools:` may only select from the agent's grant.
pub(super) fn narrow_tools(cx: &mut Cx, agent: &str, grant: &[GrantEntry], sel: &[ToolGrant], path: &str) {
    for (i, g) in sel.iter().enumerate() {
        let p = format!("{path}[{i}]");
        match g {
            ToolGrant::Name(n) => {
                if !grant.iter().any(|e| &e.reference == n || &e.name == n) {
                    let refs: Vec<&str> = grant.iter().map(|e| e.reference.as_str()).collect();
                    let sug = cx.suggest(n, refs.iter().copied());
                    cx.err(&p, format!("tool \"{n}\" is not granted by agent \"{agent}\" ({}); a step's tools: may only narrow its agent's grant{sug}", refs.join(", ")));
                }
            }
            ToolGrant::Spec(spec) => {
                if spec.agent.is_some() {
                    cx.err(&p, "a step may not grant a sub-agent inline; grant it on the agent");
                } else if spec.mcp.is_some() {
                    cx.err(&p, "a step may not grant MCP tools inline; grant them on the agent");
                } else if spec.builtin.is_some() {
                    cx.err(&p, "a step selects built-in tools by name; allow:, timeout: and the other settings belong on the agent's grant");
                } else {
                    crate::validate::agents::check_grant_entry(cx, g, &p, agent);
                }
            }
        }
    }
}

pub(super) fn check_agent(cx: &mut Cx, s: &Step, path: &str, place: Place) {
    let name = s.agent.as_deref().unwrap_or_default();
    let Some(agent) = cx.agents.get(name).copied() else {
        let sug = cx.suggest(name, cx.agent_names());
        cx.err(&format!("{path}.agent"), format!("agent step names \"{name}\", which is not declared in agents: (nor a @builtin/ profile){sug}"));
        return;
    };
    cx.used_agents.insert(agent.name.as_str());
    if s.resolved_messages.is_empty() && !has_prompt(s) {
        cx.err(path, format!("agent step \"{name}\" has no messages: (the user turns the agent answers)"));
    }
    if s.resolved_messages.iter().any(|m| matches!(m, Message::Text(t) if t.trim().is_empty())) {
        cx.err(path, "an agent step's message is empty");
    }
    let inputs = s.input_names();
    let outputs = s.output_names();
    for (i, m) in s.resolved_messages.iter().enumerate() {
        if let Message::Artifact { artifact, path: p } = m {
            if !inputs.iter().any(|n| n == artifact) {
                cx.err(&format!("{path}.message_files[{i}]"), format!("message file names artifact \"{artifact}\", which is not one of the step's inputs"));
            }
            if p.starts_with('/') || p.split('/').any(|seg| seg == "..") {
                cx.err(&format!("{path}.message_files[{i}]"), format!("message file path \"{p}\" must stay inside the artifact"));
            }
        }
    }
    if let Some(dir) = &s.dir {
        let first = first_segment(dir);
        if dir.starts_with('/') || dir.split('/').any(|seg| seg == "..") {
            cx.err(&format!("{path}.dir"), format!("dir \"{dir}\" must be a path inside one of the step's inputs or outputs"));
        } else if !first.contains("{{") && !inputs.iter().chain(outputs).any(|n| n == first) {
            cx.err(&format!("{path}.dir"), format!("dir \"{dir}\" must start with one of the step's inputs or outputs ({})", inputs.iter().chain(outputs).cloned().collect::<Vec<_>>().join(", ")));
        }
    }
    for (v, key) in [(s.max_turns, "max_turns"), (s.max_context_bytes, "max_context_bytes"), (s.max_questions, "max_questions")] {
        if v.is_some_and(|v| v < 0) {
            cx.err(&format!("{path}.{key}"), format!("{key} must not be negative"));
        }
    }
    let grant = effective_grant(agent.tools.as_deref());
    if let Some(sel) = &s.tools {
        narrow_tools(cx, name, &grant, sel, &format!("{path}.tools"));
    }
    if let Some(paths) = &s.context_paths {
        for (i, p) in paths.iter().enumerate() {
            if p.trim().is_empty() {
                cx.err(&format!("{path}.context_paths[{i}]"), "context_paths entries must be non-empty paths");
            } else if p.starts_with('/') {
                cx.err(&format!("{path}.context_paths[{i}]"), format!("context_paths entry \"{p}\" is an absolute path; name it relative to the step's working directory (a step reads only its own inputs)"));
            }
        }
        if !paths.is_empty() && !step_grant(cx, s).iter().any(|g| g.name == "read_file") {
            cx.err(&format!("{path}.context_paths"), "context_paths requires read_file in the tool grant");
        }
    }
    if place.member {
        if s.verdicts.is_some() {
            cx.err(&format!("{path}.verdicts"), "verdicts belong on the ensemble, not on a member");
        }
        if s.to.is_some() {
            cx.err(&format!("{path}.to"), "to: is not valid on an ensemble member; the ensemble routes on its decision");
        }
    }
    if s.across.is_some() && s.context.is_some() {
        cx.err(&format!("{path}.context"), "context is not valid on an agent across: step (each cell would read the same decision)");
    }
}

pub(super) fn check_ensemble(cx: &mut Cx, s: &Step, path: &str) {
    let Some(e) = &s.ensemble else { return };
    let ep = format!("{path}.ensemble");
    if e.agents.len() < 2 {
        cx.err(&format!("{ep}.agents"), "ensemble.agents needs at least two members");
    }
    let mut members = HashSet::new();
    for (i, m) in e.agents.iter().enumerate() {
        if m.kind() != Some(StepKind::Agent) {
            cx.err(&format!("{ep}.agents[{i}]"), "every ensemble member is an agent step ({agent: NAME, messages: [...]})");
        }
        if let Some(a) = &m.agent {
            members.insert(a.as_str());
        }
    }
    match &e.verdicts {
        None => cx.err(&ep, "ensemble needs verdicts: (the vocabulary every member votes in)"),
        Some(v) => check_verdicts(cx, v, &format!("{ep}.verdicts")),
    }
    match e.decide.as_deref() {
        None => cx.err(&ep, "ensemble needs decide: (majority, unanimous, any, or the name of a judge agent)"),
        Some("majority" | "unanimous" | "any") => {}
        Some(judge) => {
            if members.contains(judge) {
                cx.err(&format!("{ep}.decide"), format!("ensemble.decide names \"{judge}\", which is also a voting member; a judge must not mark its own vote"));
            } else if let Some(a) = cx.agents.get(judge).copied() {
                cx.used_agents.insert(a.name.as_str());
            } else {
                let mut cands = vec!["majority", "unanimous", "any"];
                cands.extend(cx.agent_names());
                let sug = cx.suggest(judge, cands);
                cx.err(&format!("{ep}.decide"), format!("ensemble.decide \"{judge}\" is not majority, unanimous, any, or a declared agent{sug}"));
            }
        }
    }
    if let Some(me) = e.member_errors.as_deref() {
        if me != "fail" && me != "exclude" {
            let sug = cx.suggest(me, ["fail", "exclude"]);
            cx.err(&format!("{ep}.member_errors"), format!("ensemble.member_errors \"{me}\" is not valid; use fail or exclude{sug}"));
        }
    }
}
