//! Settings (§1.2): values from the environment (`jira-site` → `JIRA_SITE`),
//! each matching its pattern, filled into hosts and ports before a run's
//! allow-list is made.

use std::collections::BTreeMap;

use crate::error::GateError;

const ONE_LABEL: &str = "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$";

pub fn var(name: &str) -> String {
    name.to_uppercase().replace('-', "_")
}

/// Every declared setting's value, or `PreflightFailed` naming the first missing or invalid one.
pub fn resolve(doc: &crate::stepfile::Stepfile) -> Result<BTreeMap<String, String>, GateError> {
    let mut out = BTreeMap::new();
    for (name, s) in doc.settings.iter().flatten() {
        let var = var(name);
        let value = std::env::var(&var).ok().filter(|v| !v.is_empty()).ok_or_else(|| crate::error::preflight(format!("setting {name}"), format!("{var} is not set")))?;
        let pattern = s.pattern.as_deref().unwrap_or(ONE_LABEL);
        let re = crate::pattern::compile(pattern).map_err(|e| crate::error::preflight(format!("setting {name}"), format!("its pattern does not compile: {e}")))?;
        if !re.is_match(&value) {
            return Err(crate::error::preflight(format!("setting {name}"), format!("{var} must match {pattern}")));
        }
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// `text` with each `{setting}` replaced by its value.
pub fn fill(text: &str, settings: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (k, v) in settings {
        out = out.replace(&format!("{{{k}}}"), v);
    }
    out
}

/// The `{name}` placeholders in `text`.
pub fn placeholders(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find('{') {
        let after = &rest[i + 1..];
        match after.find('}') {
            Some(j) if j > 0 && after[..j].chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_') => {
                out.push(after[..j].to_string());
                rest = &after[j + 1..];
            }
            _ => rest = after,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_and_filled() {
        assert_eq!(placeholders("https://{jira-site}.atlassian.net:{port}/x"), vec!["jira-site", "port"]);
        let s: BTreeMap<String, String> = [("jira-site".to_string(), "acme".to_string())].into();
        assert_eq!(fill("https://{jira-site}.atlassian.net", &s), "https://acme.atlassian.net");
        assert_eq!(var("jira-site"), "JIRA_SITE");
    }
}
