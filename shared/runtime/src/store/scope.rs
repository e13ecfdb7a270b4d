//! Whose history a record is: a team and a pipeline, and the filters the
//! views list runs with.

use super::RunRecord;

/// A team ("" when the coordinator has no `--auth`) and a pipeline's name:
/// the unit history is kept in.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    pub team: String,
    pub pipeline: String,
}

impl Scope {
    pub fn new(team: &str, pipeline: &str) -> Self {
        Scope { team: team.to_string(), pipeline: pipeline.to_string() }
    }
}

/// Which runs a listing shows, newest first: `None` admits any; the newest
/// `skip` admitted are passed over, then at most `limit` are listed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunFilter<'a> {
    pub team: Option<&'a str>,
    pub pipeline: Option<&'a str>,
    pub job: Option<&'a str>,
    pub skip: usize,
    pub limit: usize,
}

impl RunFilter<'_> {
    pub fn admits(&self, r: &RunRecord) -> bool {
        self.team.is_none_or(|t| t == r.team) && self.pipeline.is_none_or(|p| p == r.pipeline) && self.job.is_none_or(|j| j == r.job)
    }
}

/// A pipeline with runs, and its newest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSummary {
    pub team: String,
    pub pipeline: String,
    pub last: RunRecord,
}

/// A name a user gives (a pipeline, a team, a pool): letters, digits, `.`,
/// `_`, `-`, starting with a letter or digit, at most 64 — so it is the same
/// word in a store key, a file name and a message.
pub fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(format!("{what} {name:?}: use letters, digits, '.', '_' and '-' (starting with a letter or digit, at most 64)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_words() {
        for good in ["ci", "web-app", "team_1", "v1.2"] {
            assert!(check_name("pipeline", good).is_ok(), "{good}");
        }
        for bad in ["", "-x", "a:b", "a/b", "..", "ünï", &"x".repeat(65)] {
            assert!(check_name("pipeline", bad).is_err(), "{bad}");
        }
    }
}
