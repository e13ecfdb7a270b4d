//! `@builtin/` agents merged over their profiles; the profiles and built-in resource types a file does not shadow, added.

use crate::builtins;
use crate::model::Pipeline;

use super::report::Report;

/// Merges `@builtin/` entries over their profiles and adds the profiles and
/// built-in resource types the file does not shadow.
pub(super) fn register_builtins(p: &mut Pipeline, r: &mut Report) {
    for (i, a) in p.agents.iter_mut().enumerate() {
        if let Some(name) = a.name.strip_prefix("@builtin/") {
            match builtins::profile(name) {
                Some(profile) => *a = builtins::merge_agent(profile, std::mem::take(a)),
                None => r.err(
                    &format!("agents[{i}].name"),
                    format!(
                        "\"{}\" names no built-in profile; the profiles are {}{}",
                        a.name,
                        builtins::PROFILE_NAMES.iter().map(|n| format!("@builtin/{n}")).collect::<Vec<_>>().join(", "),
                        crate::suggest::did_you_mean(name, builtins::PROFILE_NAMES.iter().copied())
                    ),
                ),
            }
        }
    }
    for name in builtins::PROFILE_NAMES {
        let full = format!("@builtin/{name}");
        if !p.agents.iter().any(|a| a.name == full) {
            if let Some(profile) = builtins::profile(name) {
                p.agents.push(profile);
            }
        }
    }
    for name in builtins::BUILTIN_RESOURCE_TYPES {
        if !p.resource_types.iter().any(|t| t.name == *name) {
            if let Some(t) = builtins::resource_type(name) {
                p.resource_types.push(t);
            }
        }
    }
}
