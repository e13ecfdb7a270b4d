//! An agent step judged after its conversation: its assert (stdout, verdict, files, tool calls).

use super::*;

/// `files:` obligations not met yet, as the nudge and the failure name them.
pub(super) fn unmet_files(root: &Path, files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter_map(|f| match std::fs::metadata(root.join(f)) {
            Err(_) => Some(format!("{f} does not exist")),
            Ok(m) if m.is_dir() => Some(format!("{f} is a directory, not a file")),
            Ok(m) if m.len() == 0 => Some(format!("{f} is empty")),
            Ok(_) => None,
        })
        .collect()
}

/// The first `tool_calls` entry not matched as an ordered subsequence, if any.
pub(super) fn unmet_tool_calls(want: &[(String, Map<String, Value>)], got: &[TrajectoryEntry]) -> Option<String> {
    let mut i = 0;
    for (name, args) in want {
        let found = got[i..].iter().position(|t| {
            t.name == *name && args.iter().all(|(k, v)| t.args.get(k).map(as_text) == Some(as_text(v)))
        });
        match found {
            Some(p) => i += p + 1,
            None => {
                let with: Vec<String> = args.iter().map(|(k, v)| format!(" with {k}={:?}", as_text(v))).collect();
                let names: Vec<&str> = got.iter().map(|t| t.name.as_str()).collect();
                return Some(format!("no call matching \"{name}\"{} after the previously matched calls; got [{}]", with.join(""), names.join(", ")));
            }
        }
    }
    None
}

/// The step's assert, judged once the conversation ended well.
pub fn judge(work: &AgentWork, root: &Path, out: &AgentOutcome) -> Result<(), StepError> {
    let label = &work.agent;
    let a = &work.assert;
    if let Some(s) = &a.stdout {
        if !out.response.contains(s.as_str()) {
            return Err(StepError::failed(format!("{label}: assert.stdout: response does not contain {s:?}")));
        }
    }
    if let Some(v) = &a.verdict {
        let got = out.verdict.clone().unwrap_or_default();
        if &got != v {
            return Err(StepError::failed(format!("{label}: assert.verdict: want {v:?}, got {got:?}")));
        }
    }
    let hint = if a.nudge { "" } else { " (assert.nudge: true would have told the model while it could still act)" };
    if let Some(m) = unmet_tool_calls(&a.tool_calls, &out.trajectory) {
        return Err(StepError::failed(format!("{label}: assert.tool_calls: {m}{hint}")));
    }
    if let Some(f) = unmet_files(root, &a.files).first() {
        return Err(StepError::failed(format!("{label}: assert.files: {f}{hint}")));
    }
    Ok(())
}
