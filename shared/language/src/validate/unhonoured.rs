//! Keys the language accepts that this build does not act on yet. Each one
//! set in a pipeline is a warning at load, naming the key and where it is,
//! so nothing accepted is silently ignored; an entry leaves [`NOT_HONOURED`]
//! when its feature lands.

use crate::load::report::Report;
use crate::model::Pipeline;

/// What is accepted but not acted on, and what happens instead.
pub const NOT_HONOURED: &[(&str, &str)] = &[
    ("workspace", "btrfs snapshots are not made: step directories are fresh copies of their inputs"),
    ("workspace.root", "step directories are made in the process's scratch directory; root only turns on the step output cache and the resource cache"),
];

fn why(key: &str) -> &'static str {
    NOT_HONOURED.iter().find(|(k, _)| *k == key).map(|(_, w)| *w).unwrap_or("")
}

/// Adds a warning for every key of [`NOT_HONOURED`] the pipeline sets.
pub fn warn(p: &Pipeline, r: &mut Report) {
    let mut say = |path: String, key: &str| {
        r.warn(&path, format!("{key}: is not honoured by this build yet: {}", why(key)));
    };
    if let Some(w) = &p.workspace {
        if w.strategy.as_deref().is_some_and(|s| s != "copy") || w.options.is_some() {
            say("workspace.strategy".into(), "workspace");
        }
        if w.root.is_some() {
            say("workspace.root".into(), "workspace.root");
        }
    }
}
