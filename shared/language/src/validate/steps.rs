//! Steps: kind, which keys combine with which kind, and each kind's own rules.

use std::collections::{HashMap, HashSet};

use super::agents::{effective_grant, GrantEntry};
use super::resources::{backend, has_out, Backend};
use super::{check_artifact_names, check_container, first_segment, is_artifact_name, step_fields_off_step, Container, Cx};
use crate::model::{AssertSpec, Fix, Inputs, Job, Message, Step, StepKind, ToolGrant, Verdict, VersionSpec};

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
    let mut m = HashMap::new();
    fn walk(s: &Step, m: &mut HashMap<String, bool>, member: bool) {
        if let Some(n) = s.name() {
            let v = member || s.verdicts.is_some();
            let e = m.entry(n.to_string()).or_insert(false);
            *e |= v;
        }
        for (_, c) in s.children() {
            walk(c, m, s.ensemble.is_some());
        }
        for (_, h) in s.hooks() {
            walk(h, m, false);
        }
    }
    for s in &job.plan {
        walk(s, &mut m, false);
    }
    m
}

fn article(kind: StepKind) -> &'static str {
    match kind {
        StepKind::InParallel | StepKind::Ensemble => "an",
        _ => "a",
    }
}

fn block_label(kind: StepKind) -> String {
    match kind {
        StepKind::Try => "a try: step".to_string(),
        k => format!("{} {} step", article(k), k.key()),
    }
}

fn has_prompt(s: &Step) -> bool {
    s.prompt.is_some() || s.prompt_file.is_some() || s.messages.is_some() || s.message_files.is_some()
}

/// Keys set on a step that its kind does not take.
fn misplaced(cx: &mut Cx, s: &Step, kind: StepKind, path: &str) {
    use StepKind::*;
    let mut e = |key: &str, msg: String| cx.err(&format!("{path}.{key}"), msg);
    let is = |ks: &[StepKind]| ks.contains(&kind);
    let get_or_put_label = |k: StepKind| if k == Get { "get steps" } else { "put steps" };

    if s.trigger.is_some() && !is(&[Get]) { e("trigger", "trigger is only valid on get steps".into()); }
    if s.version.is_some() && !is(&[Get]) { e("version", "version is only valid on get steps".into()); }
    if s.passed.is_some() && !is(&[Get]) { e("passed", "passed is only valid on get steps".into()); }
    if s.resource.is_some() && !is(&[Get]) { e("resource", "resource: is only valid on get steps".into()); }
    if s.params.is_some() && !is(&[Get, Put]) { e("params", "params is only valid on get and put steps".into()); }
    if matches!(s.inputs, Some(Inputs::All)) && !is(&[Put]) { e("inputs", "inputs: all is only valid on put steps".into()); }
    if (s.input_mapping.is_some() || s.output_mapping.is_some()) && !is(&[Task]) {
        let k = if s.input_mapping.is_some() { "input_mapping" } else { "output_mapping" };
        e(k, "input_mapping/output_mapping are only valid on task steps".into());
    }
    if s.run.is_some() && s.run_file.is_none() && !is(&[Task]) { e("run", "run is only valid on task steps".into()); }
    if s.fix.is_some() && !is(&[Task]) { e("fix", "fix is only valid on task steps".into()); }
    for (set, key) in [
        (s.max_turns.is_some(), "max_turns"),
        (s.prompt.is_some(), "prompt"),
        (s.messages.is_some(), "messages"),
        (s.dir.is_some(), "dir"),
        (s.tools.is_some(), "tools"),
        (s.context_paths.is_some(), "context_paths"),
        (s.max_context_bytes.is_some(), "max_context_bytes"),
        (s.max_questions.is_some(), "max_questions"),
    ] {
        if set && !is(&[Agent]) {
            e(key, format!("{key} is only valid on agent steps"));
        }
    }
    if s.verdicts.is_some() && !is(&[Agent]) {
        if kind == Ensemble {
            e("verdicts", "verdicts belong inside the ensemble: block (ensemble.verdicts)".into());
        } else if !kind.is_container() && kind != Try {
            e("verdicts", format!("verdicts is only valid on agent steps and ensemble blocks, not on {}", block_label(kind)));
        }
    }
    if s.context.is_some() && !is(&[Agent, Task]) { e("context", "context is only valid on agent and task steps".into()); }
    if s.volatile.is_some() && !is(&[Task, Agent]) { e("volatile", "volatile is only valid on task and agent steps".into()); }
    if s.file.is_some() && !is(&[LoadVar]) { e("file", "file: without load_var: has no meaning here".into()); }
    if s.across.is_some() && !is(&[Task, Put, Agent]) { e("across", "across is only valid on task, put and agent steps".into()); }
    if s.across.is_none() {
        if s.max_in_flight.is_some() { e("max_in_flight", "max_in_flight is only valid on an across: step".into()); }
        if s.budget.is_some() { e("budget", "budget is only valid on an across: step".into()); }
    }
    match kind {
        Get | Put => {
            let label = get_or_put_label(kind);
            if kind == Get && (s.inputs.is_some() || s.outputs.is_some()) {
                e(if s.inputs.is_some() { "inputs" } else { "outputs" }, "inputs/outputs are not valid on get steps".into());
            }
            if kind == Put && s.outputs.is_some() { e("outputs", "outputs are not valid on put steps".into()); }
            for (set, key) in [
                (s.image.is_some(), "image"),
                (s.env.is_some(), "env"),
                (s.user.is_some(), "user"),
                (s.network.is_some(), "network"),
                (s.privileged.is_some(), "privileged"),
                (s.container_limits.is_some(), "container_limits"),
                (s.assert.is_some(), "assert"),
            ] {
                if set { e(key, format!("{key} is not valid on {label}")); }
            }
            if kind == Get {
                for (set, key) in [
                    (s.when.is_some(), "when"),
                    (s.to.is_some(), "to"),
                    (s.max_visits.is_some(), "max_visits"),
                    (s.verdicts.is_some(), "verdicts"),
                    (s.volatile.is_some(), "volatile"),
                    (s.context.is_some(), "context"),
                ] {
                    if set { e(key, format!("{key} is not valid on get steps")); }
                }
            }
        }
        LoadVar | Approval => {
            for (set, key) in [
                (s.outputs.is_some(), "outputs"),
                (s.image.is_some(), "image"),
                (s.env.is_some(), "env"),
                (s.user.is_some(), "user"),
                (s.network.is_some(), "network"),
                (s.privileged.is_some(), "privileged"),
                (s.container_limits.is_some(), "container_limits"),
                (s.assert.is_some(), "assert"),
            ] {
                if set { e(key, format!("{key} is only valid on task and agent steps, not on {} step", kind.key())); }
            }
            if kind == Approval && s.inputs.is_some() { e("inputs", "inputs is not valid on approval steps".into()); }
        }
        Try | Do | InParallel | Race | Ensemble => {
            let label = block_label(kind);
            let ops = [
                (s.inputs.is_some(), "inputs"),
                (s.outputs.is_some(), "outputs"),
                (s.image.is_some(), "image"),
                (s.run.is_some(), "run"),
                (has_prompt(s), "prompt"),
                (s.params.is_some(), "params"),
                (s.trigger.is_some(), "trigger"),
                (s.version.is_some(), "version"),
                (s.verdicts.is_some(), "verdicts"),
                (s.assert.is_some(), "assert"),
            ];
            if let Some((_, key)) = ops.iter().find(|(set, _)| *set) {
                if kind == Try && *key == "assert" {
                    e("assert", "assert is not valid on a try: step or the step it wraps".into());
                } else {
                    e(key, format!("{key} is not valid on {label}"));
                }
            }
            if kind == Try {
                for (set, key) in [
                    (s.env.is_some(), "env"),
                    (s.user.is_some(), "user"),
                    (s.network.is_some(), "network"),
                    (s.privileged.is_some(), "privileged"),
                    (s.container_limits.is_some(), "container_limits"),
                ] {
                    if set { e(key, format!("{key} is not valid on a try: step")); }
                }
                if s.image.is_some() && ops.iter().find(|(set, _)| *set).is_some_and(|(_, k)| *k != "image") {
                    e("image", "image is not valid on a try: step".into());
                }
            }
            if kind == Ensemble && s.to.is_some() {
                e("to", "to: is not valid on a step with verdicts: (the ensemble routes by its verdicts)".into());
            }
        }
        Task | Agent => {}
    }
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
    misplaced(cx, s, kind, path);

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

fn check_common(cx: &mut Cx, s: &Step, kind: StepKind, path: &str) {
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
            super::check_env(cx, env, &format!("{path}.env"));
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

fn check_step_assert(cx: &mut Cx, s: &Step, kind: StepKind, a: &AssertSpec, path: &str) {
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

/// A step's outputs, falling back to its tasks: entry's.
pub(crate) fn effective_outputs(cx: &Cx, s: &Step) -> Vec<String> {
    if let Some(o) = &s.outputs {
        return o.clone();
    }
    if s.run.is_none() {
        if let Some(t) = s.task.as_deref().and_then(|t| cx.tasks.get(t)) {
            return t.outputs.clone().unwrap_or_default();
        }
    }
    Vec::new()
}

/// A step's inputs, falling back to its tasks: entry's.
pub(crate) fn effective_inputs(cx: &Cx, s: &Step) -> Vec<String> {
    if s.inputs.is_some() {
        return s.input_names().to_vec();
    }
    if s.run.is_none() {
        if let Some(t) = s.task.as_deref().and_then(|t| cx.tasks.get(t)) {
            return t.inputs.clone().unwrap_or_default();
        }
    }
    Vec::new()
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

fn check_get(cx: &mut Cx, job: &Job, s: &Step, path: &str, place: Place) {
    let name = s.get.as_deref().unwrap_or_default();
    let res_name = s.resource.as_deref().unwrap_or(name);
    let res = cx.resources.get(res_name).copied();
    match res {
        None => {
            let names: Vec<&str> = cx.p.resources.iter().map(|r| r.name.as_str()).collect();
            let sug = cx.suggest(res_name, names);
            let key = if s.resource.is_some() { "resource" } else { "get" };
            cx.err(&format!("{path}.{key}"), format!("get \"{name}\" names resource \"{res_name}\", which is not declared in resources:{sug}"));
        }
        Some(r) => {
            if let Some(t) = cx.types.get(r.type_.as_str()).copied() {
                let c = t.config.as_ref();
                match backend(t) {
                    Backend::Expr if c.and_then(|c| c.expr.as_ref()).is_none_or(|e| e.check.is_none()) => {
                        cx.err(path, format!("get \"{name}\" targets expr-backed resource type \"{}\", which sets no expr.check", t.name));
                    }
                    Backend::Mcp if c.and_then(|c| c.mcp.as_ref()).and_then(|m| m.check.as_ref()).and_then(|c| c.tool.as_deref()).is_none_or(str::is_empty) => {
                        cx.err(path, format!("get \"{name}\" targets mcp-backed resource type \"{}\", which sets no mcp.check.tool", t.name));
                    }
                    _ => {}
                }
            }
        }
    }
    match &s.version {
        Some(VersionSpec::Other(w)) => {
            let sug = cx.suggest(w, ["latest", "every"]);
            cx.err(&format!("{path}.version"), format!("version \"{w}\" is not valid; use latest, every, or a mapping of version fields{sug}"));
        }
        Some(VersionSpec::Every) if !place.top_level => {
            cx.err(&format!("{path}.version"), "version: every is only valid on a top-level get");
        }
        _ => {}
    }
    if let Some(passed) = &s.passed {
        if passed.is_empty() {
            cx.err(&format!("{path}.passed"), "passed must name at least one job");
        }
        let mut seen = HashSet::new();
        for (i, j) in passed.iter().enumerate() {
            let p = format!("{path}.passed[{i}]");
            if !seen.insert(j.as_str()) {
                cx.err(&p, format!("passed names job \"{j}\" twice"));
                continue;
            }
            if j == &job.name {
                cx.err(&p, "passed names its own job");
                continue;
            }
            match cx.jobs.get(j.as_str()).copied() {
                None => {
                    let names: Vec<&str> = cx.p.jobs.iter().map(|j| j.name.as_str()).collect();
                    let sug = cx.suggest(j, names);
                    cx.err(&p, format!("passed names job \"{j}\", which does not exist{sug}"));
                }
                Some(other) => {
                    if !job_gets(other, res_name) {
                        cx.err(&p, format!("passed names job \"{j}\", which never gets resource \"{res_name}\""));
                    }
                }
            }
        }
    }
}

/// Whether any get in `job` (at any depth) fetches `resource`.
fn job_gets(job: &Job, resource: &str) -> bool {
    fn walk(s: &Step, r: &str) -> bool {
        if s.get.is_some() && s.resource.as_deref().or(s.get.as_deref()) == Some(r) {
            return true;
        }
        s.children().iter().any(|(_, c)| walk(c, r))
    }
    job.plan.iter().any(|s| walk(s, resource))
}

fn check_task(cx: &mut Cx, s: &Step, path: &str) {
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
    if let Some(m) = super::agents::resolved_model(cx, agent) {
        if let Some(cli) = m.strip_prefix('@') {
            cx.err(path, format!("fix: names agent \"{agent_name}\", which has a cli source (@{cli}); a cli agent cannot run as a fix agent"));
        }
    }
    if agent.image.is_some() {
        cx.err(path, format!("fix: names agent \"{agent_name}\", which sets image:; a fix agent runs in the failing task's own image"));
    }
    let grant = effective_grant(agent.tools.as_deref());
    for g in &grant {
        if g.kind == super::agents::GrantKind::SubAgent {
            cx.err(path, format!("fix: agent \"{agent_name}\" grants sub-agent \"{}\"; a fix agent may not delegate", g.name));
        }
        if g.kind == super::agents::GrantKind::Mcp {
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

/// A step's (or fix's) `tools:` may only select from the agent's grant.
fn narrow_tools(cx: &mut Cx, agent: &str, grant: &[GrantEntry], sel: &[ToolGrant], path: &str) {
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
                    super::agents::check_grant_entry(cx, g, &p, agent);
                }
            }
        }
    }
}

fn check_put(cx: &mut Cx, s: &Step, path: &str) {
    let name = s.put.as_deref().unwrap_or_default();
    match cx.resources.get(name).copied() {
        None => {
            let names: Vec<&str> = cx.p.resources.iter().map(|r| r.name.as_str()).collect();
            let sug = cx.suggest(name, names);
            cx.err(&format!("{path}.put"), format!("put \"{name}\" names a resource that is not declared in resources:{sug}"));
        }
        Some(r) => {
            if let Some(t) = cx.types.get(r.type_.as_str()).copied() {
                if !has_out(t) {
                    let msg = match backend(t) {
                        Backend::Expr => format!("put \"{name}\" targets expr-backed resource type \"{}\", which sets no expr.out", t.name),
                        Backend::Mcp => format!("put \"{name}\" targets mcp-backed resource type \"{}\", which sets no mcp.out.tool", t.name),
                        _ => format!("put \"{name}\" targets resource type \"{}\", which declares no out: command", t.name),
                    };
                    cx.err(path, msg);
                }
            }
        }
    }
}

fn check_agent(cx: &mut Cx, s: &Step, path: &str, place: Place) {
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

fn check_ensemble(cx: &mut Cx, s: &Step, path: &str) {
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

/// `{{ .vars.X }}` names used in templated text.
pub(crate) fn template_vars(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else { break };
        let inner = &after[..close];
        let mut s = inner;
        while let Some(i) = s.find(".vars.") {
            let name: String = s[i + 6..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
            s = &s[i + 6..];
        }
        rest = &after[close + 2..];
    }
    out
}

fn check_across(cx: &mut Cx, s: &Step, across: &[crate::model::AcrossVar], path: &str) {
    let ap = format!("{path}.across");
    if across.is_empty() {
        cx.err(&ap, "across: must declare at least one var");
    }
    let mut vars = HashSet::new();
    let cells = across.iter().filter_map(|a| a.values.as_ref().map(Vec::len)).fold(1usize, usize::saturating_mul);
    if cells > crate::validate::MAX_ACROSS_CELLS {
        cx.err(&ap, format!("across: its values make {cells} cells; one across step runs at most {} (split it, or feed the values from a file in steps)", crate::validate::MAX_ACROSS_CELLS));
    }
    for (i, a) in across.iter().enumerate() {
        let p = format!("{ap}[{i}]");
        let Some(v) = a.var.as_deref().filter(|v| !v.is_empty()) else {
            cx.err(&p, format!("across[{i}] needs a var:"));
            continue;
        };
        if !vars.insert(v) {
            cx.err(&format!("{p}.var"), format!("across declares var \"{v}\" twice"));
        }
        match (&a.values, &a.from_file) {
            (None, None) => cx.err(&p, format!("across[{i}] ({v}) has no values: and no from_file:")),
            (Some(_), Some(_)) => cx.err(&p, format!("across[{i}] ({v}) sets both values: and from_file:; pick one")),
            (Some(vals), None) => {
                if vals.is_empty() {
                    cx.err(&format!("{p}.values"), format!("across[{i}] ({v}) has no values: (the list is empty)"));
                }
                for (k, val) in vals.iter().enumerate() {
                    if val.is_array() || val.is_object() || val.is_null() {
                        cx.err(&format!("{p}.values[{k}]"), format!("across[{i}] ({v}) values must be scalars"));
                    }
                }
                if !s.output_names().is_empty() {
                    let mut seen = HashSet::new();
                    for (k, val) in vals.iter().enumerate() {
                        let text = match val {
                            serde_json::Value::String(t) => t.clone(),
                            other => other.to_string(),
                        };
                        if !is_artifact_name(&text) {
                            cx.err(&format!("{p}.values[{k}]"), format!("across value \"{text}\" cannot name a collected output directory (letters, digits, . _ - only)"));
                        }
                        if !seen.insert(text.clone()) {
                            cx.err(&format!("{p}.values[{k}]"), format!("across value \"{text}\" appears twice; collected outputs need unique values per axis"));
                        }
                    }
                }
            }
            (None, Some(f)) => {
                if f.starts_with('/') || f.split('/').any(|seg| seg == "..") {
                    cx.err(&format!("{p}.from_file"), format!("from_file \"{f}\" must be a path inside an artifact produced earlier (no absolute paths or ..)"));
                }
            }
        }
    }
    let mut fields: Vec<(String, &str)> = Vec::new();
    if let Some(r) = &s.run { fields.push(("run".into(), r)); }
    if let Some(r) = &s.image { fields.push(("image".into(), r)); }
    if let Some(r) = &s.prompt { fields.push(("prompt".into(), r)); }
    if let Some(ms) = &s.messages { for (i, m) in ms.iter().enumerate() { fields.push((format!("messages[{i}]"), m)); } }
    if let Some(r) = &s.dir { fields.push(("dir".into(), r)); }
    if let Some(n) = s.name() { fields.push((s.kinds().first().map(|k| k.key()).unwrap_or("task").to_string(), n)); }
    if let Some(cp) = &s.context_paths { for (i, c) in cp.iter().enumerate() { fields.push((format!("context_paths[{i}]"), c)); } }
    for (key, text) in fields {
        for v in template_vars(text) {
            if !vars.contains(&v.as_str()) {
                cx.err(&format!("{path}.{}", key.split('[').next().unwrap_or(&key)), format!("{key} references {{{{ .vars.{v} }}}}, but across declares no var \"{v}\""));
            }
        }
    }
    let outputs = s.output_names();
    for o in outputs {
        if s.input_names().iter().any(|i| i == o) {
            cx.err(&format!("{path}.outputs"), format!("\"{o}\" is both an input and a collected output"));
        }
    }
    if s.outputs.is_none() && s.run.is_none() {
        if let Some(t) = s.task.as_deref().and_then(|t| cx.tasks.get(t)) {
            if t.outputs.as_ref().is_some_and(|o| !o.is_empty()) {
                cx.err(path, "an across: step collects only the outputs it declares itself; declare outputs: on the step (its tasks: entry's outputs are not collected)");
            }
        }
    }
    if s.max_in_flight.is_some_and(|m| m < 0) {
        cx.err(&format!("{path}.max_in_flight"), "max_in_flight must not be negative");
    }
}
