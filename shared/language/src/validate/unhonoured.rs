//! Keys the language accepts that this build does not act on yet. Each one
//! set in a pipeline is a warning at load, naming the key and where it is,
//! so nothing accepted is silently ignored; an entry leaves [`NOT_HONOURED`]
//! when its feature lands.

use crate::load::report::Report;
use crate::model::walk::each_step;
use crate::model::Pipeline;

/// What is accepted but not acted on, and what happens instead.
pub const NOT_HONOURED: &[(&str, &str)] = &[
    ("trigger", "steppe does not watch resources yet; the get runs when the plan reaches it"),
    ("volatile", "steppe has no step cache yet; every step runs"),
    ("serial", "runs of a job are not serialised yet"),
    ("serial_groups", "runs of a job are not serialised yet"),
    ("max_in_flight", "concurrent runs of a job are not limited yet"),
    ("interruptible", "a new run does not interrupt an older one yet"),
    ("max_consecutive_failures", "a job is not paused after failures yet"),
    ("webhook_token_env", "steppe serves no webhooks yet"),
    ("version_history", "resource versions are all kept"),
    ("run_history", "runs are all kept"),
    ("workspace", "step directories are always fresh copies of their inputs"),
];

fn why(key: &str) -> &'static str {
    NOT_HONOURED.iter().find(|(k, _)| *k == key).map(|(_, w)| *w).unwrap_or("")
}

/// Adds a warning for every key of [`NOT_HONOURED`] the pipeline sets.
pub fn warn(p: &Pipeline, r: &mut Report) {
    let mut say = |path: String, key: &str| {
        r.warn(&path, format!("{key}: is not honoured by this build yet: {}", why(key)));
    };
    if let Some(d) = &p.defaults {
        for (set, key) in [
            (d.version_history.is_some(), "version_history"),
            (d.run_history.is_some(), "run_history"),
        ] {
            if set {
                say(format!("defaults.{key}"), key);
            }
        }
    }
    if let Some(w) = &p.workspace {
        if w.strategy.as_deref().is_some_and(|s| s != "copy") || w.root.is_some() || w.options.is_some() || w.cache.is_some() {
            say("workspace".into(), "workspace");
        }
    }
    for (i, res) in p.resources.iter().enumerate() {
        if res.webhook_token_env.is_some() {
            say(format!("resources[{i}].webhook_token_env"), "webhook_token_env");
        }
    }
    for (j, job) in p.jobs.iter().enumerate() {
        for (set, key) in [
            (job.serial.is_some(), "serial"),
            (job.serial_groups.is_some(), "serial_groups"),
            (job.max_in_flight.is_some(), "max_in_flight"),
            (job.interruptible.is_some(), "interruptible"),
            (job.max_consecutive_failures.is_some(), "max_consecutive_failures"),
        ] {
            if set {
                say(format!("jobs[{j}].{key}"), key);
            }
        }
    }
    each_step(p, &mut |s, path| {
        if s.trigger.is_some() {
            say(format!("{path}.trigger"), "trigger");
        }
        if s.volatile.is_some() {
            say(format!("{path}.volatile"), "volatile");
        }
    });
}
