//! Keys the language accepts that this build does not act on yet. Each one
//! set in a pipeline is a warning at load, naming the key and where it is,
//! so nothing accepted is silently ignored; an entry leaves [`NOT_HONOURED`]
//! when its feature lands.

use crate::load::report::Report;
use crate::model::walk::each_step;
use crate::model::Pipeline;

/// What is accepted but not acted on, and what happens instead.
pub const NOT_HONOURED: &[(&str, &str)] = &[
    ("volatile", "steppe has no step output cache (workspace.root) yet; the chain cache already reruns what changed"),
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
    each_step(p, &mut |s, path| {
        if s.volatile.is_some() {
            say(format!("{path}.volatile"), "volatile");
        }
    });
}
