//! The authoring tools beyond the guide (§1.17): `stepgate_outline` (a
//! written procedure → a stepfile skeleton with `TODO(…)` markers),
//! `stepgate_examples` (the catalog), `stepgate_inspect_api` (a public API's
//! operations, credential-less) and the draft rules `stepgate_try` checks.

use std::path::Path;

use serde_json::json;

use crate::error::GateError;
use crate::stepfile::Stepfile;

/// A slug: lowercase letters, digits and single dashes, starting with a letter, at most 64.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    for c in text.to_lowercase().chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let mut s: String = out.trim_matches('-').chars().skip_while(|c| !c.is_ascii_lowercase()).take(64).collect();
    while s.ends_with('-') {
        s.pop();
    }
    if s.is_empty() {
        "procedure".into()
    } else {
        s
    }
}

/// Lines outside code fences.
fn prose(body: &str) -> Vec<&str> {
    let mut fenced = false;
    body.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") || l.trim_start().starts_with("~~~") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The numbered item a line starts (`1.` or `1)` at the margin), if any.
fn numbered(line: &str) -> Option<&str> {
    let digits = line.chars().take_while(char::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let rest = &line[digits..];
    rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")).map(str::trim)
}

/// The sentences of `text` that say what must or must never happen.
fn obligations(text: &str) -> Vec<String> {
    text.split(['.', '!', '?', '\n'])
        .map(str::trim)
        .filter(|s| s.split(|c: char| !c.is_alphanumeric()).any(|x| ["MUST", "SHALL", "REQUIRED"].contains(&x) || ["must", "never"].contains(&x.to_lowercase().as_str())))
        .map(str::to_string)
        .collect()
}

/// `stepgate_outline`: a markdown procedure as a stepfile skeleton.
pub fn outline(procedure: &str) -> String {
    let (mut name, mut description, mut body) = (None::<String>, None::<String>, procedure);
    if let Some(rest) = procedure.strip_prefix("---\n") {
        if let Some((front, after)) = rest.split_once("\n---") {
            for line in front.lines() {
                if let Some(v) = line.strip_prefix("name:") {
                    name = Some(v.trim().trim_matches('"').to_string());
                }
                if let Some(v) = line.strip_prefix("description:") {
                    description = Some(v.trim().trim_matches('"').to_string());
                }
            }
            body = after.trim_start_matches(['-', '\n']);
        }
    }
    let lines = prose(body);
    let title = lines.iter().find_map(|l| l.strip_prefix("# ")).map(|t| t.trim().to_string());
    let id = slug(name.as_deref().or(title.as_deref()).unwrap_or("procedure"));
    // Steps: two or more top-level numbered items, else `##` sections, else the whole body.
    let mut steps: Vec<(String, String)> = Vec::new();
    for l in &lines {
        if let Some(item) = numbered(l) {
            let first = item.split(['.', ':', ';']).next().unwrap_or(item).trim();
            steps.push((first.to_string(), item.to_string()));
        } else if let Some(last) = steps.last_mut().filter(|_| l.starts_with("   ") || l.starts_with('\t')) {
            last.1.push('\n');
            last.1.push_str(l.trim());
        }
    }
    if steps.len() < 2 {
        steps.clear();
        for l in &lines {
            if let Some(h) = l.strip_prefix("## ") {
                steps.push((h.trim().to_string(), String::new()));
            } else if let Some(last) = steps.last_mut() {
                if !l.trim().is_empty() {
                    last.1.push_str(l.trim());
                    last.1.push('\n');
                }
            }
        }
    }
    if steps.is_empty() {
        let text: Vec<&str> = lines.iter().copied().filter(|l| !l.starts_with("# ") && !l.trim().is_empty()).collect();
        steps.push(("do the procedure".into(), text.join("\n")));
    }
    let mut out = String::from("stepgate: \"1\"\n");
    out.push_str(&format!("id: {id}\n"));
    if let Some(t) = title.as_ref().or(name.as_ref()) {
        out.push_str(&format!("title: {}\n", json!(t)));
    }
    if let Some(d) = &description {
        out.push_str(&format!("description: {}\n", json!(d)));
    }
    out.push_str("inputs: \"TODO(inputs): a JSON Schema of type object for what the caller gives\"\nsteps:\n");
    let mut ids: Vec<String> = Vec::new();
    for (title, text) in &steps {
        let mut sid = slug(title);
        while ids.contains(&sid) {
            sid.push_str("-2");
        }
        ids.push(sid.clone());
        let instructions = if text.trim().is_empty() { title.clone() } else { text.trim().to_string() };
        out.push_str(&format!("  - id: {sid}\n    instructions: {}\n", json!(instructions)));
        out.push_str("    produces: \"TODO(produces): the JSON Schema of what this step hands on\"\n    gates:\n");
        let musts = obligations(&instructions);
        if musts.is_empty() {
            out.push_str("      - \"TODO(gate): what proves this step was done right\"\n");
        }
        for m in musts {
            out.push_str(&format!("      - {}\n", json!(format!("TODO(gate): {m}"))));
        }
    }
    out
}

/// "Public" as drafts need it (§1.17): https, a dotted name that is not
/// `.local`, `.localhost` or `.internal`, no IP literal of a private,
/// loopback, link-local or shared range, no IPv6 literal. Names only, no DNS.
pub fn public(url: &str) -> Result<(), String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("{url} is not a URL: {e}"))?;
    if u.scheme() != "https" {
        return Err(format!("{url} is not https"));
    }
    match u.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.to_ascii_lowercase();
            if !d.contains('.') || [".local", ".localhost", ".internal"].iter().any(|s| d.ends_with(s)) || d == "localhost" {
                return Err(format!("{url} does not name a public host"));
            }
            Ok(())
        }
        Some(url::Host::Ipv4(ip)) => {
            let o = ip.octets();
            let shared = o[0] == 100 && (64..128).contains(&o[1]);
            if ip.is_private() || ip.is_loopback() || ip.is_link_local() || ip.is_unspecified() || ip.is_broadcast() || shared {
                return Err(format!("{url} is a private address"));
            }
            Ok(())
        }
        Some(url::Host::Ipv6(_)) => Err(format!("{url} is an IPv6 literal")),
        None => Err(format!("{url} names no host")),
    }
}

/// What `--draft-credential` and `--draft-setting` grant drafts.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Credential name → the hosts it may be sent to.
    pub credentials: Vec<(String, Vec<String>)>,
    pub settings: Vec<String>,
}

/// Why a draft may not run (`DraftRefused`), or nothing.
pub fn draft_problems(doc: &Stepfile, grants: &Grants) -> Vec<String> {
    let mut out = Vec::new();
    for (name, t) in doc.tools.iter().flatten() {
        for (_, u) in t.urls() {
            if let Err(e) = public(u) {
                out.push(format!("tool {name}: {e}"));
            }
        }
    }
    for (name, c) in doc.credentials.iter().flatten() {
        match grants.credentials.iter().find(|(n, _)| n == name) {
            None => out.push(format!("credential {name} is not granted to drafts (--draft-credential {name}=HOST)")),
            Some((_, hosts)) => {
                if c.hosts.iter().any(|h| !hosts.iter().any(|g| g.eq_ignore_ascii_case(h))) {
                    out.push(format!("credential {name} names hosts {} beyond its grant {}", c.hosts.join(", "), hosts.join(", ")));
                }
                if c.token_url.is_some() {
                    out.push(format!("credential {name} has a token_url, which drafts may not use"));
                }
            }
        }
    }
    for name in doc.settings.iter().flat_map(|s| s.keys()) {
        if !grants.settings.contains(name) {
            out.push(format!("setting {name} is not granted to drafts (--draft-setting {name})"));
        }
    }
    out
}

/// `DraftRefused` from its problems.
pub fn refused(problems: &[String]) -> GateError {
    GateError::new("DraftRefused", format!("draft refused: {}", problems.join("; ")))
}

/// `stepgate_examples`: the catalog's entries, or one entry's stepfile and README.
pub fn examples(catalog: &Path, name: Option<&str>) -> Result<String, GateError> {
    let mut entries: Vec<(String, String, std::path::PathBuf)> = Vec::new();
    let mut domains: Vec<_> = std::fs::read_dir(catalog).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    domains.sort();
    for d in domains {
        let mut ids: Vec<_> = std::fs::read_dir(&d).into_iter().flatten().flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
        ids.sort();
        for dir in ids {
            let id = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
            entries.push((d.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default(), id, dir));
        }
    }
    match name {
        None if entries.is_empty() => Ok(format!("No catalog here ({} has no entries); start from stepgate_outline or stepgate_guide.", catalog.display())),
        None => Ok(entries.iter().map(|(d, id, _)| format!("{d}/{id}")).collect::<Vec<_>>().join("\n")),
        Some(n) => {
            let (_, id, dir) = entries.iter().find(|(_, id, _)| id == n).ok_or_else(|| {
                let names: Vec<&str> = entries.iter().map(|(_, id, _)| id.as_str()).collect();
                GateError::new("UnknownStepfile", format!("no catalog stepfile named {n}; available: {}", if names.is_empty() { "none".into() } else { names.join(", ") }))
            })?;
            let stepfile = std::fs::read_to_string(dir.join(format!("{id}.stepfile.yaml"))).unwrap_or_default();
            let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
            Ok(format!("{stepfile}\n---\n{readme}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outline_takes_numbered_steps_and_their_musts() {
        let md = "---\nname: Refund Check\ndescription: Check a refund.\n---\n# Refunds\n\n1. Find the order. The order MUST exist.\n2. Compare the amounts.\n   Never refund more than was paid.\n\n```\n3. not a step\n```\n";
        let o = outline(md);
        assert!(o.contains("id: refund-check\n"), "{o}");
        assert!(o.contains("  - id: find-the-order\n") && o.contains("  - id: compare-the-amounts\n"), "{o}");
        assert!(o.contains("TODO(gate): The order MUST exist"), "{o}");
        assert!(o.contains("TODO(gate): Never refund more than was paid"), "{o}");
        assert_eq!(o.matches("  - id: ").count(), 2, "{o}");
        assert!(o.contains("TODO(inputs)") && o.contains("TODO(produces)"), "{o}");
        let sections = outline("# Triage\n\n## Read the ticket\nRead it.\n\n## Label it\nIt must get a label.\n");
        assert!(sections.contains("id: triage") && sections.contains("  - id: read-the-ticket\n") && sections.contains("TODO(gate): It must get a label"), "{sections}");
    }

    #[test]
    fn public_means_https_to_a_public_name() {
        assert!(public("https://api.example.com/v1").is_ok());
        for bad in ["http://api.example.com", "https://localhost/x", "https://10.0.0.2/", "https://127.0.0.1:8443/", "https://printer.local/", "https://[::1]/", "https://100.64.0.1/", "https://intranet/"] {
            assert!(public(bad).is_err(), "{bad}");
        }
    }
}
