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
