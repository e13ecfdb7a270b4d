//! Steps: each step's kind, where it sits, and its kind's own rules (one
//! file per kind); which keys a kind takes is the table in `placement`.

mod across;
mod agent;
mod common;
mod get;
mod placement;
mod put;
mod task;

use std::collections::{HashMap, HashSet};

use super::{step_fields_off_step, Cx};
use crate::model::{Job, Step, StepKind};

use across::check_across;
use agent::{check_agent, check_ensemble};
pub(crate) use agent::step_grant;
use agent::narrow_tools;
use common::check_common;
pub(crate) use common::check_verdicts;
use get::check_get;
use put::check_put;
use task::check_task;
pub(crate) use task::check_fix;
pub(crate) use placement::misplaced;

/// Where a step sits, for placement rules.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Place {
    pub top_level: bool,
    pub in_do: bool,
    pub in_try: bool,
    pub hook: bool,
    /// Nested inside an across cell (its hooks or wrapped steps).
    pub in_cell: bool,
    pub member: bool,
}

pub(crate) fn check_job(cx: &mut Cx, job: &Job, path: &str) {
    if job.plan.is_empty() {
        cx.err(&format!("{path}.plan"), format!("job \"{}\" has no steps in plan:", job.name));
    }
    if let Some(groups) = &job.serial_groups {
        if groups.is_empty() {
            cx.err(&format!("{path}.serial_groups"), "serial_groups must name at least one group");
        }
        let mut seen = HashSet::new();
        for (i, g) in groups.iter().enumerate() {
            if g.trim().is_empty() {
                cx.err(&format!("{path}.serial_groups[{i}]"), "serial_groups contains an empty name");
            } else if !seen.insert(g.as_str()) {
                cx.err(&format!("{path}.serial_groups[{i}]"), format!("serial_groups names \"{g}\" twice"));
            }
        }
    }
    if let Some(m) = job.max_in_flight {
        if m < 0 {
            cx.err(&format!("{path}.max_in_flight"), "max_in_flight must not be negative (0 or omitted = unlimited)");
        }
        if job.serial == Some(true) {
            cx.err(&format!("{path}.max_in_flight"), "max_in_flight is set alongside serial: true (serial already means one at a time)");
        }
        if job.serial_groups.is_some() {
            cx.err(&format!("{path}.max_in_flight"), "max_in_flight is set alongside serial_groups (serial groups already run one at a time)");
        }
    }
    if job.max_consecutive_failures.is_some_and(|m| m < 0) {
        cx.err(&format!("{path}.max_consecutive_failures"), "max_consecutive_failures must not be negative (0 or omitted = off)");
    }
    if let Some(t) = job.timeout {
        if !t.is_positive() {
            cx.err(&format!("{path}.timeout"), format!("job \"{}\": timeout must be a positive duration", job.name));
        }
    }
    if let Some(b) = &job.budget {
        if b.usd.is_some() {
            cx.err(&format!("{path}.budget.usd"), format!("job \"{}\": budget.usd is not supported; a job budget counts tokens", job.name));
        }
        if b.reserve_per_cell.is_some() {
            cx.err(&format!("{path}.budget.reserve_per_cell"), "budget.reserve_per_cell is only valid on an across: step");
        }
        if !b.tokens.is_some_and(|t| t > 0) && b.usd.is_none() {
            cx.err(&format!("{path}.budget"), "budget must set tokens or usd to a positive ceiling (omit budget: entirely for no ceiling)");
        }
    }
    if let Some(a) = &job.assert {
        let ap = format!("{path}.assert");
        if let Some(o) = &a.outcome {
            if o != "succeeded" && o != "failed" {
                let s = cx.suggest(o, ["succeeded", "failed"]);
                cx.err(&format!("{ap}.outcome"), format!("outcome \"{o}\" is not valid; use \"succeeded\" or \"failed\"{s}"));
            }
        }
        step_fields_off_step(cx, a, &ap);
    }
    let names = step_names(job);
    cx.current_names = names.clone();
    for (i, s) in job.plan.iter().enumerate() {
        check_step(cx, job, &names, s, &format!("{path}.plan[{i}]"), Place { top_level: true, ..Default::default() });
    }
    for (key, h) in job.hooks() {
        let hp = format!("{path}.{key}");
        if h.inputs.is_some() || h.outputs.is_some() {
            cx.err(&hp, "inputs/outputs are not valid on job-level hooks (they run in an empty workspace)");
        }
        if h.get.is_some() {
            cx.err(&hp, "get is not valid in a hook");
            continue;
        }
        check_step(cx, job, &names, h, &hp, Place { hook: true, ..Default::default() });
    }
    super::flow::check_job(cx, job, path);
}

/// Every step name in a job → whether that step declares verdicts (for `context.from`).
pub(crate) fn step_names(job: &Job) -> HashMap<String, bool> {
    let mut m: HashMap<String, bool> = HashMap::new();
    crate::model::walk::each_plan_step(job, &mut |s, _| {
        if let Some(n) = s.name() {
            *m.entry(n.to_string()).or_insert(false) |= s.verdicts.is_some();
        }
        // An ensemble's members decide with verdicts of the ensemble's.
        for member in s.ensemble.iter().flat_map(|e| &e.agents) {
            if let Some(n) = member.name() {
                m.insert(n.to_string(), true);
            }
        }
    });
    m
}

pub(crate) fn check_step(cx: &mut Cx, job: &Job, names: &HashMap<String, bool>, s: &Step, path: &str, place: Place) {
    let kinds = s.kinds();
    let kind = match kinds.as_slice() {
        [] => {
            cx.err(path, "step names no kind, set one of get/task/put/agent (or try/do/in_parallel/race/ensemble/load_var/approval)");
            return;
        }
        [k] => *k,
        many => {
            let keys: Vec<&str> = many.iter().map(|k| k.key()).collect();
            cx.err(path, format!("step sets {}, but a step is exactly one of get/task/put/agent (or try/do/in_parallel/race/ensemble/load_var/approval)", keys.join(" and ")));
            return;
        }
    };
    for (p, m) in placement::misplaced(s, kind, path) {
        cx.err(&p, m);
    }

    // Placement.
    if kind == StepKind::Get {
        if place.hook {
            cx.err(path, "get is not valid in a hook");
        } else if place.in_try {
            cx.err(path, "try: cannot wrap a get step");
        } else if place.in_do {
            cx.err(path, "a get step is not valid inside do");
        }
    }
    if place.hook {
        if s.context.is_some() {
            cx.err(&format!("{path}.context"), "context is not valid on hook steps");
        }
        if s.volatile.is_some() {
            cx.err(&format!("{path}.volatile"), "volatile is not valid on hook steps");
        }
        if s.to.is_some() || s.verdicts.as_ref().is_some_and(|v| v.iter().any(|v| v.target.is_some())) {
            cx.err(path, "a hook step may not route (to:/verdict targets)");
        }
    }

    check_common(cx, s, kind, path);
    match kind {
        StepKind::Get => check_get(cx, job, s, path, place),
        StepKind::Task => check_task(cx, s, path),
        StepKind::Put => check_put(cx, s, path),
        StepKind::Agent => check_agent(cx, s, path, place),
        StepKind::LoadVar => {
            let name = s.load_var.as_deref().unwrap_or_default();
            if s.file.is_none() {
                cx.err(path, format!("load_var \"{name}\" needs a file:"));
            }
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
                cx.err(&format!("{path}.load_var"), format!("load_var \"{name}\" is not a variable name (letters, digits, _ . - only)"));
            }
        }
        StepKind::Approval => {
            if let Some(a) = &s.approval {
                if a.message.as_deref().is_none_or(|m| m.trim().is_empty()) {
                    cx.err(&format!("{path}.approval"), "approval.message is required");
                }
                if a.timeout.is_some_and(|t| !t.is_positive()) {
                    cx.err(&format!("{path}.approval.timeout"), "approval.timeout must be a positive duration");
                }
            }
        }
        StepKind::Try => {
            if let Some(inner) = &s.try_ {
                let ip = format!("{path}.try");
                if inner.to.is_some() {
                    cx.err(&format!("{ip}.to"), "to: belongs on the try: step, not the step it wraps");
                }
                if inner.max_visits.is_some() {
                    cx.err(&format!("{ip}.max_visits"), "max_visits belongs on the try: step, not the step it wraps");
                }
                if inner.assert.is_some() {
                    cx.err(&format!("{ip}.assert"), "assert is not valid on a try: step or the step it wraps");
                }
            }
        }
        StepKind::Do => {
            let steps = s.do_.as_deref().unwrap_or(&[]);
            if steps.is_empty() {
                cx.err(&format!("{path}.do"), "do must list at least one step");
            }
            for (i, c) in steps.iter().enumerate() {
                if c.to.is_some() {
                    cx.err(&format!("{path}.do[{i}].to"), format!("to: is not valid on do step {i} (route from the do: block itself)"));
                }
                if c.max_visits.is_some() {
                    cx.err(&format!("{path}.do[{i}].max_visits"), format!("max_visits: is not valid on do step {i}"));
                }
            }
        }
        StepKind::InParallel => {
            if let Some(p) = &s.in_parallel {
                if p.steps.is_empty() {
                    cx.err(&format!("{path}.in_parallel"), "in_parallel.steps must not be empty");
                }
                if p.limit.is_some_and(|l| l < 0) {
                    cx.err(&format!("{path}.in_parallel.limit"), "in_parallel.limit must not be negative");
                }
                let mut seen: HashMap<String, usize> = HashMap::new();
                for (i, b) in p.steps.iter().enumerate() {
                    for o in branch_outputs(b) {
                        if let Some(prev) = seen.insert(o.clone(), i) {
                            if prev != i {
                                cx.err(&format!("{path}.{}", p.step_path(i)), format!("duplicate output names across in_parallel branches: \"{o}\" (branches {prev} and {i})"));
                            }
                        }
                    }
                }
            }
        }
        StepKind::Race => {
            if let Some(r) = &s.race {
                if r.steps.len() < 2 {
                    cx.err(&format!("{path}.race"), "race.steps needs at least two branches");
                }
                let sets: Vec<Vec<String>> = r.steps.iter().map(|b| {
                    let mut o = branch_outputs(b);
                    o.sort();
                    o.dedup();
                    o
                }).collect();
                if sets.windows(2).any(|w| w[0] != w[1]) {
                    cx.err(&format!("{path}.race"), "every race branch must declare the same outputs (the winner's outputs become the block's)");
                }
            }
        }
        StepKind::Ensemble => check_ensemble(cx, s, path),
    }

    let child_place = Place {
        top_level: false,
        in_do: kind == StepKind::Do,
        in_try: kind == StepKind::Try,
        hook: place.hook,
        in_cell: place.in_cell || s.across.is_some(),
        member: kind == StepKind::Ensemble,
    };
    for (suffix, c) in s.children() {
        check_step(cx, job, names, c, &format!("{path}.{suffix}"), child_place);
    }
    check_hooks(cx, job, names, s, path, place);
}

fn check_hooks(cx: &mut Cx, job: &Job, names: &HashMap<String, bool>, s: &Step, path: &str, place: Place) {
    for (key, h) in s.hooks() {
        let hp = format!("{path}.{key}");
        if s.across.is_some() && !h.output_names().is_empty() {
            cx.err(&format!("{hp}.outputs"), "a matrix cell's hooks and nested steps must not declare outputs");
        }
        check_step(cx, job, names, h, &hp, Place { hook: true, in_cell: place.in_cell || s.across.is_some(), ..Default::default() });
    }
}

/// Outputs a branch makes visible, walking nested blocks and try wrappers.
pub(crate) fn branch_outputs(s: &Step) -> Vec<String> {
    let mut out: Vec<String> = s.output_names().to_vec();
    if let Some(g) = &s.get {
        out.push(g.clone());
    }
    if let Some(r) = &s.race {
        if let Some(first) = r.steps.first() {
            out.extend(branch_outputs(first));
        }
        return out;
    }
    for (_, c) in s.children() {
        out.extend(branch_outputs(c));
    }
    out
}
