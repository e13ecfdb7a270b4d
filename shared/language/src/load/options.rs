//! What a load needs besides the file: `((vars))`, the model from the
//! environment, and (for a submission) the directory every path must stay in.

use std::path::PathBuf;

use crate::vars::Vars;

/// What a load needs besides the file.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub vars: Vars,
    /// `$STEPPE_MODEL` (or `$STEPS_MODEL`): the model of agents that name none (before `defaults.model`).
    pub env_model: Option<String>,
    /// The pipeline goes to a coordinator (`steppe submit`) or came from a
    /// submitter: paths of the host that loads it (an MCP server's
    /// absolute `cwd`) are refused, as the coordinator refuses them.
    pub submission: bool,
    /// Every file the pipeline names must lie inside this directory, by
    /// text and through symlinks (a coordinator's unpacked submission).
    pub root: Option<PathBuf>,
}

impl LoadOptions {
    pub fn from_env(vars: Vars) -> Self {
        LoadOptions {
            vars,
            // STEPS_MODEL is the reference runner's spelling; accepted so its setups carry over.
            env_model: ["STEPPE_MODEL", "STEPS_MODEL"]
                .iter()
                .find_map(|v| std::env::var(v).ok().filter(|m| !m.is_empty())),
            submission: false,
            root: None,
        }
    }
}

/// The most text `((vars))` substitution may make of a pipeline.
const SUBSTITUTED_CAP: usize = 16 << 20;

impl LoadOptions {
    /// `text` with this load's `((vars))` substituted, within [`SUBSTITUTED_CAP`].
    pub(crate) fn substitute(&self, text: &str) -> Result<String, String> {
        crate::vars::substitute_within(text, &self.vars, SUBSTITUTED_CAP)
    }
}
