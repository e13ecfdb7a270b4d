//! A task step: its command or `tasks:` entry, and its `fix:` agent.


use crate::validate::agents::effective_grant;
use super::super::{is_artifact_name, Cx};
use super::*;
use crate::validate::flow::{effective_inputs, effective_outputs};
use crate::model::{Fix, Step};

pub(super) fn check_task(cx: &mut Cx, s: &Step, path: &str) {
    let name = s.task.as_deref().unwrap_or_default();
    if s.run.is_none() && !cx.tasks.contains_key(name) {
        let names: Vec<&str> = cx.p.tasks.iter().map(|t| t.name.as_str()).collect();
        let sug = cx.suggest(name, names);
        cx.err(&format!("{path}.task"), format!("task \"{name}\" has no run: and there is no tasks: entry of that name{sug}"));
    }
    let inputs = effective_inputs(cx, s);
    let outputs = effective_outputs(cx, s);
    for (m, key, names, what) in [
        (&s.input_mapping, "input_mapping", &inputs, "inputs"),
        (&s.output_mapping, "output_mapping", &outputs, "outputs"),
    ] {
        if let Some(m) = m {
            for (k, v) in m {
                if !names.iter().any(|n| n == k) {
                    cx.err(&format!("{path}.{key}.{k}"), format!("{key} maps \"{k}\", which is not one of the task's {what} ({})", names.join(", ")));
                }
                if !v.as_str().is_some_and(is_artifact_name) {
                    cx.err(&format!("{path}.{key}.{k}"), format!("{key}.{k} must name an artifact, not {v}"));
                }
            }
        }
    }
    if let Some(f) = &s.fix {
        check_fix(cx, f, &format!("{path}.fix"));
    }
}

pub(crate) fn check_fix(cx: &mut Cx, f: &Fix, path: &str) {
    let Some(agent_name) = f.agent().filter(|a| !a.is_empty()) else {
        cx.err(path, "fix: needs an agent");
        return;
    };
    let Some(agent) = cx.agents.get(agent_name).copied() else {
        let sug = cx.suggest(agent_name, cx.agent_names());
        cx.err(path, format!("fix: names agent \"{agent_name}\", which is not declared in agents:{sug}"));
        return;
    };
    cx.used_agents.insert(agent.name.as_str());
    if let Some(m) = crate::validate::agents::resolved_model(cx, agent) {
        if let Some(cli) = m.strip_prefix('@') {
            cx.err(path, format!("fix: names agent \"{agent_name}\", which has a cli source (@{cli}); a cli agent cannot run as a fix agent"));
        }
    }
    if agent.image.is_some() {
        cx.err(path, format!("fix: names agent \"{agent_name}\", which sets image:; a fix agent runs in the failing task's own image"));
    }
    let grant = effective_grant(agent.tools.as_deref());
    for g in &grant {
        if g.kind == crate::validate::agents::GrantKind::SubAgent {
            cx.err(path, format!("fix: agent \"{agent_name}\" grants sub-agent \"{}\"; a fix agent may not delegate", g.name));
        }
        if g.kind == crate::validate::agents::GrantKind::Mcp {
            cx.err(path, format!("fix: agent \"{agent_name}\" grants MCP tool \"{}\"; a fix agent may not use MCP tools", g.reference));
        }
    }
    if let Some(spec) = f.spec() {
        if spec.attempts.is_some_and(|a| a < 1) {
            cx.err(&format!("{path}.attempts"), "attempts must be at least 1 — unlike the other limits, 0 does not mean unlimited here");
        }
        if spec.timeout.is_some_and(|t| t.as_nanos() < 0) {
            cx.err(&format!("{path}.timeout"), "timeout must be a positive duration");
        }
        if let Some(tools) = &spec.tools {
            narrow_tools(cx, agent_name, &grant, tools, &format!("{path}.tools"));
        }
    }
}
