//! Whole-job rules: `((var))` references (and Concourse's `((.:var))`), routing segments, and artifact flow
//! (every input names something fetched or produced earlier).

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::Value;

use super::{first_segment, Cx};
use crate::model::{Job, Message, Step, StepKind, VersionSpec};
use crate::vars::{scan, Ref};

pub(crate) fn check_job(cx: &mut Cx, job: &Job, path: &str) {
    check_refs(cx, job, path);
    check_routing(cx, job, path);
    check_every(cx, job, path);
    let mut avail = Scope { layers: vec![BTreeSet::new()] };
    for (i, s) in job.plan.iter().enumerate() {
        flow_step(cx, job, s, &format!("{path}.plan[{i}]"), &mut avail);
    }
}

/// The artifacts available at a point of the plan, as layers so a branch or
/// hook can add names that vanish when it ends without copying the whole set.
struct Scope {
    layers: Vec<BTreeSet<String>>,
}

impl Scope {
    fn contains(&self, name: &str) -> bool {
        self.layers.iter().any(|l| l.contains(name))
    }
    fn insert(&mut self, name: String) {
        if let Some(top) = self.layers.last_mut() {
            top.insert(name);
        }
    }
    fn push(&mut self) {
        self.layers.push(BTreeSet::new());
    }
    fn pop(&mut self) -> BTreeSet<String> {
        self.layers.pop().unwrap_or_default()
    }
    fn names(&self) -> impl Iterator<Item = &str> {
        self.layers.iter().flat_map(|l| l.iter().map(String::as_str))
    }
}

/// One text field of a step where a reference may be written.
struct Text<'s> {
    key: String,
    text: &'s str,
    /// The load check of `((var))` covers it (run, prompt, messages, image, dir, file, params).
    vars_checked: bool,
    /// An across cell renders `{{ .vars.X }}` in it.
    per_cell: bool,
}

/// The text fields of `s`, each scanned once for `((var))` and `((.:var))`.
fn texts(s: &Step) -> Vec<Text<'_>> {
    let mut out = Vec::new();
    for (v, key) in [(&s.run, "run"), (&s.prompt, "prompt"), (&s.image, "image"), (&s.dir, "dir")] {
        if let Some(v) = v {
            out.push(Text { key: key.into(), text: v, vars_checked: true, per_cell: true });
        }
    }
    for m in &s.resolved_messages {
        if let Message::Text(t) = m {
            if s.prompt.as_deref() != Some(t.as_str()) {
                out.push(Text { key: "messages".into(), text: t, vars_checked: true, per_cell: true });
            }
        }
    }
    if let Some(f) = &s.file {
        out.push(Text { key: "file".into(), text: f, vars_checked: true, per_cell: false });
    }
    if let Some(p) = &s.params {
        strings(p, &mut |t| out.push(Text { key: "params".into(), text: t, vars_checked: true, per_cell: false }));
    }
    if let Some(w) = &s.when {
        out.push(Text { key: "when".into(), text: &w.run, vars_checked: false, per_cell: true });
    }
    for (i, c) in s.context_paths.iter().flatten().enumerate() {
        out.push(Text { key: format!("context_paths[{i}]"), text: c, vars_checked: false, per_cell: true });
    }
    if let (Some(n), Some(k)) = (s.name(), s.kinds().first()) {
        out.push(Text { key: k.key().into(), text: n, vars_checked: false, per_cell: true });
    }
    out
}

/// References in the job's steps: a `((x))` left after substitution must
/// come from an earlier top-level `load_var:`; a `((.:x))` (Concourse's
/// local variable) is an error that says what steppe writes instead.
fn check_refs(cx: &mut Cx, job: &Job, path: &str) {
    let load_vars: HashSet<&str> = job.plan.iter().filter_map(|s| s.load_var.as_deref()).collect();
    let mut produced: HashSet<&str> = HashSet::new();
    for (i, s) in job.plan.iter().enumerate() {
        refs_in(cx, s, &format!("{path}.plan[{i}]"), Some(&produced), &[], &load_vars);
        if let Some(n) = &s.load_var {
            produced.insert(n.as_str());
        }
    }
    for (key, h) in job.hooks() {
        refs_in(cx, h, &format!("{path}.{key}"), None, &[], &load_vars);
    }
}

/// Scans `s` and the steps in it. `produced` is set on top-level steps (the
/// load_var names available to them); `across` holds the across variables of
/// the cell `s` runs in (its hooks run in their step's cell).
fn refs_in<'p>(cx: &mut Cx, s: &'p Step, path: &str, produced: Option<&HashSet<&str>>, across: &[&'p str], load_vars: &HashSet<&str>) {
    let mut cell: Vec<&str> = across.to_vec();
    cell.extend(s.across.iter().flatten().filter_map(|a| a.var.as_deref()));
    for t in texts(s) {
        for (_, r) in scan(t.text) {
            match r {
                Ref::Var(name) => {
                    if t.vars_checked && produced.is_some_and(|p| !p.contains(name)) {
                        cx.err(
                            &format!("{path}.{}", t.key),
                            format!("{} references (({name})), which is neither passed with --var/--vars-file nor produced by an earlier load_var: step", t.key),
                        );
                    }
                }
                Ref::ConcourseLocal(name) => {
                    let p = format!("{path}.{}", t.key.split('[').next().unwrap_or(&t.key));
                    let hint = concourse_local(name, &t.key, t.per_cell, &cell, load_vars);
                    cx.err(&p, hint);
                }
            }
        }
    }
    for (suffix, c) in s.children() {
        refs_in(cx, c, &format!("{path}.{suffix}"), None, &[], load_vars);
    }
    for (key, h) in s.hooks() {
        refs_in(cx, h, &format!("{path}.{key}"), None, &cell, load_vars);
    }
}

/// What to write instead of `((.:name))` in the field `key`: Concourse's
/// local variables are steppe's across variables (`{{ .vars.name }}`, in the
/// fields a cell renders) or load_var values (`((name))`).
pub(crate) fn concourse_local(name: &str, key: &str, per_cell: bool, across: &[&str], load_vars: &HashSet<&str>) -> String {
    let what = format!("{key} uses ((.:{name})), Concourse's local-variable syntax, which steppe does not read");
    let rendered = "run, when, image, prompt, messages, dir, the step's name and context_paths";
    if across.contains(&name) {
        if per_cell {
            format!("{what}: write {{{{ .vars.{name} }}}} for the across variable \"{name}\"")
        } else {
            format!("{what}; an across cell fills {{{{ .vars.{name} }}}} only in {rendered}, not in {key}: use the variable in one of those")
        }
    } else if load_vars.contains(name) {
        format!("{what}: write (({name})) for the value of load_var: {name}")
    } else {
        let near = crate::suggest::nearest(name, across.iter().copied());
        match near {
            Some(v) if per_cell => format!("{what}: write {{{{ .vars.{v} }}}} for the across variable \"{v}\" (across declares no var \"{name}\")"),
            _ => format!("{what}: write {{{{ .vars.{name} }}}} for a variable declared under across: (in {rendered}), or (({name})) for a --var or load_var: value"),
        }
    }
}

/// Every string inside `v`, recursively.
fn strings<'v>(v: &'v Value, out: &mut dyn FnMut(&'v str)) {
    match v {
        Value::String(s) => out(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
        Value::Object(o) => o.values().for_each(|x| strings(x, out)),
        _ => {}
    }
}

/// Routing: targets resolve within the step's segment (the run of non-get
/// top-level steps between gets); backward targets need `max_visits`.
fn check_routing(cx: &mut Cx, job: &Job, path: &str) {
    let mut segments: Vec<Vec<usize>> = vec![Vec::new()];
    for (i, s) in job.plan.iter().enumerate() {
        if s.get.is_some() {
            segments.push(Vec::new());
        } else if let Some(seg) = segments.last_mut() {
            seg.push(i);
        }
    }
    for seg in segments {
        let routes = |s: &Step| -> Vec<(String, String)> {
            let mut r = Vec::new();
            if let Some(to) = &s.to {
                for (t, k) in [(&to.success, "to.success"), (&to.failure, "to.failure")] {
                    if let Some(t) = t {
                        r.push((k.to_string(), t.clone()));
                    }
                }
            }
            // A try: wrapper routes on its inner agent's verdicts.
            let verdicts = s
                .verdicts
                .as_ref()
                .or(s.ensemble.as_ref().and_then(|e| e.verdicts.as_ref()))
                .or(s.try_.as_ref().and_then(|t| t.verdicts.as_ref()));
            for (vi, v) in verdicts.into_iter().flatten().enumerate() {
                if let Some(t) = &v.target {
                    let key = if s.ensemble.is_some() {
                        format!("ensemble.verdicts[{vi}]")
                    } else if s.verdicts.is_none() {
                        format!("try.verdicts[{vi}]")
                    } else {
                        format!("verdicts[{vi}]")
                    };
                    r.push((key, t.clone()));
                }
            }
            r
        };
        let uses_routing = seg.iter().any(|&i| !routes(&job.plan[i]).is_empty());
        if !uses_routing {
            continue;
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        for &i in &seg {
            if let Some(n) = job.plan[i].name() {
                if n == "next" {
                    cx.err(&format!("{path}.plan[{i}]"), "step \"next\" collides with the reserved to: target (next = the following step)");
                }
                if let Some(prev) = names.insert(n, i) {
                    cx.err(&format!("{path}.plan[{i}]"), format!("step name \"{n}\" appears twice in one routing segment (plan[{prev}] and plan[{i}]); to: targets must be unambiguous"));
                }
            }
        }
        for &i in &seg {
            let s = &job.plan[i];
            let mut backward = false;
            for (key, target) in routes(s) {
                if target == "next" {
                    continue;
                }
                match names.get(target.as_str()) {
                    None => {
                        let sug = cx.suggest(&target, names.keys().copied());
                        cx.err(&format!("{path}.plan[{i}].{key}"), format!("route target \"{target}\" is not a step in this part of the plan (targets resolve among the steps between gets){sug}"));
                    }
                    Some(&t) if t <= i => backward = true,
                    Some(_) => {}
                }
            }
            if backward && s.max_visits.is_none() {
                cx.err(&format!("{path}.plan[{i}]"), "a route back to this step or an earlier one needs max_visits (1..1000) to bound the loop");
            }
        }
    }
    // Routing keys off the top level (inside blocks) have no segment to resolve in.
    for (i, s) in job.plan.iter().enumerate() {
        for (suffix, c) in s.children() {
            nested_routes(cx, c, &format!("{path}.plan[{i}].{suffix}"), s.kind());
        }
    }
}

fn nested_routes(cx: &mut Cx, s: &Step, path: &str, parent: Option<StepKind>) {
    let has_targets = s.to.is_some() || s.verdicts.as_ref().is_some_and(|v| v.iter().any(|v| v.target.is_some()));
    if has_targets && matches!(parent, Some(StepKind::InParallel | StepKind::Race)) {
        cx.err(path, "a step inside in_parallel/race may not route (to:/verdict targets); route from the block");
    }
    for (suffix, c) in s.children() {
        nested_routes(cx, c, &format!("{path}.{suffix}"), s.kind());
    }
}

fn check_every(cx: &mut Cx, job: &Job, path: &str) {
    let mut seen: HashSet<String> = HashSet::new();
    for (i, s) in job.plan.iter().enumerate() {
        if s.get.is_some() && matches!(s.version, Some(VersionSpec::Every)) {
            let r = s.resource.clone().or(s.get.clone()).unwrap_or_default();
            if !seen.insert(r.clone()) {
                cx.err(&format!("{path}.plan[{i}].version"), format!("version: every is set twice on resource \"{r}\" in one job"));
            }
        }
    }
}

fn need(cx: &mut Cx, avail: &Scope, name: &str, path: &str, what: &str) {
    if !avail.contains(name) {
        let sug = cx.suggest(name, avail.names());
        cx.err(path, format!("{what} \"{name}\" is not fetched or produced by any earlier step{sug}"));
    }
}

/// Walks one step in plan order, checking its inputs against `avail` and adding its outputs.
fn flow_step(cx: &mut Cx, job: &Job, s: &Step, path: &str, avail: &mut Scope) {
    let Some(kind) = s.kind() else { return };
    match kind {
        StepKind::Get => {
            avail.insert(s.get.clone().unwrap_or_default());
        }
        StepKind::Task | StepKind::Agent | StepKind::Put | StepKind::LoadVar => {
            let inputs = effective_inputs(cx, s);
            let mapping = s.input_mapping.as_ref();
            for (i, name) in inputs.iter().enumerate() {
                let source = mapping
                    .and_then(|m| m.get(name))
                    .and_then(Value::as_str)
                    .unwrap_or(name);
                let p = if s.inputs.is_some() { format!("{path}.inputs[{i}]") } else { format!("{path}.task") };
                need(cx, avail, source, &p, "input");
            }
            if let Some(f) = &s.file {
                let first = first_segment(f);
                if !s.input_names().iter().any(|n| n == first) {
                    cx.err(&format!("{path}.file"), format!("load_var file \"{f}\" must lie inside one of the step's inputs ({})", s.input_names().join(", ")));
                }
            }
            for a in s.across.iter().flatten() {
                if let Some(f) = &a.from_file {
                    need(cx, avail, first_segment(f), &format!("{path}.across"), "from_file artifact");
                }
            }
            let outputs = effective_outputs(cx, s);
            let omap = s.output_mapping.as_ref();
            for o in outputs {
                let name = omap.and_then(|m| m.get(&o)).and_then(Value::as_str).map(str::to_string).unwrap_or(o);
                avail.insert(name);
            }
        }
        StepKind::Try | StepKind::Do => {
            for (suffix, c) in s.children() {
                flow_step(cx, job, c, &format!("{path}.{suffix}"), avail);
            }
        }
        StepKind::InParallel | StepKind::Race | StepKind::Ensemble => {
            let mut added = BTreeSet::new();
            for (suffix, c) in s.children() {
                avail.push();
                flow_step(cx, job, c, &format!("{path}.{suffix}"), avail);
                added.extend(avail.pop());
            }
            for name in added {
                avail.insert(name);
            }
        }
        StepKind::Approval => {}
    }
    for (key, h) in s.hooks() {
        avail.push();
        flow_step(cx, job, h, &format!("{path}.{key}"), avail);
        avail.pop();
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
