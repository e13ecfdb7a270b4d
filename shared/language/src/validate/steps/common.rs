//! Rules every kind of step shares: attempts, timeouts, `when:`, `to:`, verdicts, `assert:`.

use std::collections::HashSet;

use super::super::{check_artifact_names, check_container, first_segment, Container, Cx};
use super::*;
use crate::validate::flow::effective_outputs;
use crate::model::{AssertSpec, Inputs, Step, StepKind, Verdict};

pub(super) fn check_common(cx: &mut Cx, s: &Step, kind: StepKind, path: &str) {
    if let Some(a) = s.attempts {
        if a < 1 {
            cx.err(&format!("{path}.attempts"), "attempts must be at least 1 — unlike the other limits, 0 does not mean unlimited here");
        }
    }
    if let Some(t) = s.timeout {
        if t.as_nanos() < 0 || (t.is_zero() && kind != StepKind::Agent) {
            cx.err(&format!("{path}.timeout"), "timeout must be a positive duration (\"0\", for no deadline, is only valid on agent steps)");
        }
    }
    if let Some(m) = s.max_visits {
        if !(1..=1000).contains(&m) {
            cx.err(&format!("{path}.max_visits"), "max_visits must be between 1 and 1000");
        }
    }
    if matches!(kind, StepKind::Task | StepKind::Agent) {
        let entry_image = match kind {
            StepKind::Task if s.run.is_none() => s.task.as_deref().and_then(|t| cx.tasks.get(t)).and_then(|t| t.image.clone()),
            StepKind::Agent => s.agent.as_deref().and_then(|a| cx.agents.get(a)).and_then(|a| a.image.clone()),
            _ => None,
        };
        let image = s.image.clone().filter(|i| !i.is_empty()).or(entry_image);
        check_container(
            cx,
            &Container {
                image: s.image.as_deref(),
                user: s.user.as_deref(),
                network: s.network.as_deref(),
                privileged: s.privileged,
                limits: s.container_limits.as_ref(),
                env: s.env.as_deref(),
            },
            image.as_deref(),
            path,
        );
        // Container fields a task inherits from its entry obey the same rules
        // against the step's resolved image.
        if let Some(entry) = s.task.as_deref().filter(|_| kind == StepKind::Task && s.run.is_none()).and_then(|t| cx.tasks.get(t).copied()) {
            let inherited = Container {
                image: None,
                user: None,
                network: if s.network.is_none() { entry.network.as_deref() } else { None },
                privileged: if s.privileged != Some(true) { entry.privileged } else { None },
                limits: if s.container_limits.is_none() { entry.container_limits.as_ref() } else { None },
                env: None,
            };
            let mut sub = Vec::new();
            if let Some(n) = inherited.network {
                if image.is_none() {
                    sub.push(format!("network \"{n}\" requires image: (inherited from tasks: entry \"{}\")", entry.name));
                }
            }
            if inherited.privileged == Some(true) && image.is_none() {
                sub.push(format!("privileged requires image: (inherited from tasks: entry \"{}\")", entry.name));
            }
            if inherited.limits.is_some() && image.is_none() {
                sub.push(format!("container_limits requires image: (inherited from tasks: entry \"{}\")", entry.name));
            }
            for m in sub {
                cx.err(&format!("{path}.task"), m);
            }
        }
    } else {
        for (v, key) in [(&s.image, "image"), (&s.user, "user"), (&s.network, "network")] {
            if let Some(v) = v {
                if v.starts_with('-') {
                    cx.err(&format!("{path}.{key}"), format!("{key} \"{v}\" must not start with '-'"));
                }
            }
        }
        if let Some(env) = &s.env {
            crate::validate::check_env(cx, env, &format!("{path}.env"));
        }
    }
    match &s.inputs {
        Some(Inputs::Names(n)) => check_artifact_names(cx, n, &format!("{path}.inputs"), "input"),
        Some(Inputs::Other(w)) => cx.err(&format!("{path}.inputs"), format!("inputs must be a list of artifact names (or all, on a put), not \"{w}\"")),
        _ => {}
    }
    if let Some(o) = &s.outputs {
        check_artifact_names(cx, o, &format!("{path}.outputs"), "output");
    }
    if let Some(w) = &s.when {
        if w.run.trim().is_empty() {
            cx.err(&format!("{path}.when"), "when: needs a command to run");
        }
    }
    if let Some(to) = &s.to {
        for (t, key) in [(&to.success, "success"), (&to.failure, "failure")] {
            if t.as_deref().is_some_and(|t| t.trim().is_empty()) {
                cx.err(&format!("{path}.to.{key}"), format!("to.{key} names no step"));
            }
        }
        if to.success.is_none() && to.failure.is_none() {
            cx.err(&format!("{path}.to"), "to: sets neither success nor failure");
        }
        if s.verdicts.is_some() {
            cx.err(&format!("{path}.to"), "to: is not valid on a step with verdicts: (route with verdict targets instead)");
        }
    }
    if let Some(v) = &s.verdicts {
        check_verdicts(cx, v, &format!("{path}.verdicts"));
    }
    if let Some(ctx) = &s.context {
        if let Some(from) = &ctx.from {
            let job_names = cx.current_names.clone();
            let me = s.name();
            for (sender, level) in from {
                let p = format!("{path}.context.from.{sender}");
                match job_names.get(sender.as_str()) {
                    None => {
                        let sug = cx.suggest(sender, job_names.keys().map(String::as_str));
                        cx.err(&p, format!("context from: names \"{sender}\", which is not a step in this job{sug}"));
                    }
                    Some(_) if me == Some(sender.as_str()) => {
                        cx.err(&p, format!("context from: names \"{sender}\", the step itself"));
                    }
                    Some(false) => cx.err(&p, format!("context from: names \"{sender}\", which declares no verdicts: (context reads another step's decision)")),
                    Some(true) => {}
                }
                match level.as_str() {
                    Some("verdict" | "note" | "full") => {}
                    other => {
                        let w = other.map(str::to_string).unwrap_or_else(|| level.to_string());
                        let sug = cx.suggest(&w, ["verdict", "note", "full"]);
                        cx.err(&p, format!("context from: level \"{w}\" is not valid; use verdict, note or full{sug}"));
                    }
                }
            }
        } else {
            cx.err(&format!("{path}.context"), "context: needs from: {STEP: verdict|note|full}");
        }
    }
    if let Some(across) = &s.across {
        check_across(cx, s, across, path);
    }
    if let Some(b) = &s.budget {
        if s.across.is_some() {
            if b.usd.is_some() {
                cx.err(&format!("{path}.budget.usd"), "budget.usd is not valid on an across: step (an across budget counts tokens)");
            }
            if !b.tokens.is_some_and(|t| t > 0) && !b.usd.is_some_and(|u| u > 0.0) {
                cx.err(&format!("{path}.budget"), "budget must set tokens or usd to a positive ceiling (omit budget: entirely for no ceiling)");
            }
            if let Some(r) = b.reserve_per_cell {
                if r < 0 {
                    cx.err(&format!("{path}.budget.reserve_per_cell"), "budget.reserve_per_cell must not be negative");
                }
                if s.max_in_flight.is_none_or(|m| m <= 1) {
                    cx.err(&format!("{path}.budget.reserve_per_cell"), "budget.reserve_per_cell needs max_in_flight greater than 1 (serial cells need no reservation)");
                }
            }
        }
    }
    if s.max_in_flight.is_some_and(|m| m < 0) {
        cx.err(&format!("{path}.max_in_flight"), "max_in_flight must not be negative");
    }
    if let Some(a) = &s.assert {
        if matches!(kind, StepKind::Task | StepKind::Agent) {
            check_step_assert(cx, s, kind, a, &format!("{path}.assert"));
        } else if a.outcome.is_some() {
            cx.err(&format!("{path}.assert.outcome"), "outcome is only valid on a job assert");
        }
    }
}

pub(crate) fn check_verdicts(cx: &mut Cx, v: &[Verdict], path: &str) {
    if v.is_empty() {
        cx.err(path, "verdicts: must list at least one verdict");
    }
    let mut seen = HashSet::new();
    for (i, e) in v.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if e.name.trim().is_empty() {
            cx.err(&p, "a verdict needs a name");
            continue;
        }
        if e.name == "success" {
            cx.err(&p, "\"success\" is not a verdict name: success is the route of a step without verdicts");
        }
        if e.name == "failure" && e.target.as_deref().is_none_or(str::is_empty) {
            cx.err(&p, "verdict \"failure\" is the reserved catch for an errored step and must name a target");
        }
        if !seen.insert(e.name.as_str()) {
            cx.err(&p, format!("verdict \"{}\" is declared twice", e.name));
        }
    }
}

/// The declared verdict vocabulary the model can choose from (without `failure`).
pub(crate) fn vocabulary(v: &[Verdict]) -> Vec<&str> {
    v.iter().map(|v| v.name.as_str()).filter(|n| *n != "failure").collect()
}

pub(super) fn check_step_assert(cx: &mut Cx, s: &Step, kind: StepKind, a: &AssertSpec, path: &str) {
    if a.execution.is_some() {
        cx.err(&format!("{path}.execution"), "execution is only valid on job/pipeline asserts");
    }
    if a.outcome.is_some() {
        cx.err(&format!("{path}.outcome"), "outcome is only valid on a job assert");
    }
    if kind == StepKind::Agent && a.code.is_some() {
        cx.err(&format!("{path}.code"), "assert.code is not valid on agent steps (an agent has no exit code; assert stdout, verdict, tool_calls or files)");
    }
    if let Some(v) = &a.verdict {
        let vocab: Vec<String> = s.verdicts.as_deref().map(vocabulary).unwrap_or_default().into_iter().map(String::from).collect();
        if kind != StepKind::Agent {
            cx.err(&format!("{path}.verdict"), "assert.verdict is only valid on agent steps with verdicts:");
        } else if !vocab.iter().any(|x| x == v) {
            let sug = cx.suggest(v, vocab.iter().map(String::as_str));
            cx.err(&format!("{path}.verdict"), format!("assert.verdict \"{v}\" is not one of the declared verdicts ({}){sug}", vocab.join(", ")));
        }
    }
    if let Some(calls) = &a.tool_calls {
        if kind != StepKind::Agent {
            cx.err(&format!("{path}.tool_calls"), "assert.tool_calls is only valid on agent steps");
        } else {
            let grant = step_grant(cx, s);
            for (i, c) in calls.iter().enumerate() {
                let p = format!("{path}.tool_calls[{i}]");
                let Some(name) = c.name.as_deref().filter(|n| !n.is_empty()) else {
                    cx.err(&p, "assert.tool_calls entry needs a name");
                    continue;
                };
                if let (Some(args), Some(entry)) = (&c.args, grant.iter().find(|g| g.name == name)) {
                    for k in args.keys() {
                        if entry.pinned.iter().any(|p| p == k) {
                            cx.err(&format!("{p}.args.{k}"), format!("assert.tool_calls names the pinned arg \"{k}\" of tool \"{name}\"; pinned args are invisible to the model, so only model-authored args are assertable"));
                        }
                    }
                }
            }
        }
    }
    if let Some(files) = &a.files {
        let outputs = effective_outputs(cx, s);
        for (i, f) in files.iter().enumerate() {
            let p = format!("{path}.files[{i}]");
            if f.starts_with('/') || f.split('/').any(|seg| seg == "..") {
                cx.err(&p, format!("assert.files: \"{f}\" must be a path inside one of the step's outputs (no absolute paths or ..)"));
                continue;
            }
            let first = first_segment(f);
            if !outputs.iter().any(|o| o == first) {
                cx.err(&p, format!("assert.files: \"{f}\" must start with one of the step's outputs ({})", outputs.join(", ")));
            } else if !f.trim_start_matches("./").contains('/') || f.trim_end_matches('/') == first {
                cx.err(&p, format!("assert.files: \"{f}\" names the artifact itself; name a file inside it ({first}/<file>)"));
            }
        }
    }
    if a.nudge == Some(true) {
        if a.stdout.is_some() || a.verdict.is_some() {
            cx.err(&format!("{path}.nudge"), "nudge: true may not sit beside stdout: or verdict: — a nudge may name an unmet obligation, never a wanted conclusion");
        }
        if kind != StepKind::Agent {
            cx.err(&format!("{path}.nudge"), "assert.nudge is only valid on agent steps");
        }
    }
}
