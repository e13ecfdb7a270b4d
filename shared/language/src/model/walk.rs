//! The one walk over a pipeline's steps: every step of every job's plan
//! and hooks, nested blocks and step hooks included, with its key path.

use super::{Job, Pipeline, Step};

/// Calls `f` on every step of `p` with its key path (`jobs[0].plan[2].do[1]`).
pub fn each_step<'p>(p: &'p Pipeline, f: &mut dyn FnMut(&'p Step, &str)) {
    for (j, job) in p.jobs.iter().enumerate() {
        each_step_of(job, &format!("jobs[{j}]"), f);
    }
}

/// As [`each_step`], for one job whose key path is `path`.
pub fn each_step_of<'p>(job: &'p Job, path: &str, f: &mut dyn FnMut(&'p Step, &str)) {
    for (i, s) in job.plan.iter().enumerate() {
        walk(s, &format!("{path}.plan[{i}]"), f);
    }
    for (key, h) in job.hooks() {
        walk(h, &format!("{path}.{key}"), f);
    }
}

/// As [`each_step_of`], without the job's own hooks: the steps of its plan
/// (paths relative to the job: `plan[2].do[1]`).
pub fn each_plan_step<'p>(job: &'p Job, f: &mut dyn FnMut(&'p Step, &str)) {
    for (i, s) in job.plan.iter().enumerate() {
        walk(s, &format!("plan[{i}]"), f);
    }
}

/// Calls `f` on each step nested directly in `s` (block children, ensemble
/// members, step hooks) with its key path, mutably: the loader's walk.
pub fn each_child_mut(s: &mut Step, path: &str, f: &mut dyn FnMut(&mut Step, &str)) {
    if let Some(t) = &mut s.try_ {
        f(t, &format!("{path}.try"));
    }
    if let Some(d) = &mut s.do_ {
        for (i, c) in d.iter_mut().enumerate() {
            f(c, &format!("{path}.do[{i}]"));
        }
    }
    if let Some(p) = &mut s.in_parallel {
        let paths: Vec<String> = (0..p.steps.len()).map(|i| p.step_path(i)).collect();
        for (c, sp) in p.steps.iter_mut().zip(paths) {
            f(c, &format!("{path}.{sp}"));
        }
    }
    if let Some(rc) = &mut s.race {
        let paths: Vec<String> = (0..rc.steps.len()).map(|i| rc.step_path(i)).collect();
        for (c, sp) in rc.steps.iter_mut().zip(paths) {
            f(c, &format!("{path}.{sp}"));
        }
    }
    if let Some(e) = &mut s.ensemble {
        for (i, c) in e.agents.iter_mut().enumerate() {
            f(c, &format!("{path}.ensemble.agents[{i}]"));
        }
    }
    for (key, h) in [
        ("on_success", &mut s.on_success),
        ("on_failure", &mut s.on_failure),
        ("on_error", &mut s.on_error),
        ("on_abort", &mut s.on_abort),
        ("ensure", &mut s.ensure),
    ] {
        if let Some(h) = h {
            f(h, &format!("{path}.{key}"));
        }
    }
}

fn walk<'p>(s: &'p Step, path: &str, f: &mut dyn FnMut(&'p Step, &str)) {
    f(s, path);
    for (key, c) in s.children() {
        walk(c, &format!("{path}.{key}"), f);
    }
    for (key, h) in s.hooks() {
        walk(h, &format!("{path}.{key}"), f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_is_visited_once_with_its_path() {
        let text = "jobs:\n- name: j\n  plan:\n  - task: a\n    run: echo\n    on_failure: {task: h, run: echo}\n  - in_parallel:\n    - task: b\n      run: echo\n    - try: {task: c, run: echo}\n  ensure: {task: e, run: echo}\n";
        let l = crate::load_str(text, std::path::Path::new("p.yml"), &Default::default()).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = Vec::new();
        each_step(&l.pipeline, &mut |_, p| seen.push(p.to_string()));
        assert_eq!(
            seen,
            [
                "jobs[0].plan[0]",
                "jobs[0].plan[0].on_failure",
                "jobs[0].plan[1]",
                "jobs[0].plan[1].in_parallel[0]",
                "jobs[0].plan[1].in_parallel[1]",
                "jobs[0].plan[1].in_parallel[1].try",
                "jobs[0].ensure",
            ]
        );
    }
}
