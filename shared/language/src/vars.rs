//! `((var))` pipeline variables: textual substitution before the YAML parse.

use std::collections::BTreeMap;

/// Variable values from `--vars-file` and `--var` (flags win).
pub type Vars = BTreeMap<String, String>;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// Every `((name))` in `text`, as (byte range, name), in order.
pub fn find_refs(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = text[i..].find("((") {
        let start = i + off;
        let name_start = start + 2;
        let name_len = text[name_start..]
            .find(|c: char| !is_name_char(c))
            .unwrap_or(text.len() - name_start);
        let name_end = name_start + name_len;
        if name_len > 0 && text[name_end..].starts_with("))") {
            out.push((start..name_end + 2, &text[name_start..name_end]));
            i = name_end + 2;
        } else {
            i = start + 1;
        }
    }
    out
}

/// Replaces each `((name))` that `vars` defines; unknown references stay verbatim.
pub fn substitute(text: &str, vars: &Vars) -> String {
    if vars.is_empty() {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for (range, name) in find_refs(text) {
        if let Some(v) = vars.get(name) {
            out.push_str(&text[last..range.start]);
            out.push_str(v);
            last = range.end;
        }
    }
    out.push_str(&text[last..]);
    out
}

/// As [`substitute`], refusing to make more than `cap` bytes (a variable
/// holding a large value, used many times).
pub fn substitute_within(text: &str, vars: &Vars, cap: usize) -> Result<String, String> {
    let grown: usize = find_refs(text).iter().filter_map(|(_, name)| vars.get(*name).map(String::len)).fold(text.len(), usize::saturating_add);
    if grown > cap {
        return Err(format!("substituting ((vars)) would make {grown} bytes, over the limit of {cap}: a variable holding a large value is used many times"));
    }
    Ok(substitute(text, vars))
}

/// Parses a `--var k=v` flag.
pub fn parse_var_flag(flag: &str) -> Result<(String, String), String> {
    match flag.split_once('=') {
        Some((k, v)) if !k.is_empty() && k.chars().all(is_name_char) => {
            Ok((k.to_string(), v.to_string()))
        }
        Some((k, _)) if !k.is_empty() => Err(format!(
            "--var {flag}: \"{k}\" is not a variable name (letters, digits, _ . - only)"
        )),
        _ => Err(format!("--var {flag}: expected NAME=VALUE")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn substitutes_known_and_keeps_unknown() {
        let v = vars(&[("repo", "acme/app"), ("a.b-c_1", "x")]);
        assert_eq!(
            substitute("uri: ((repo)) ((a.b-c_1)) ((missing))", &v),
            "uri: acme/app x ((missing))"
        );
    }

    #[test]
    fn finds_references_and_ignores_near_forms() {
        let refs: Vec<_> = find_refs("((a)) (( b )) ((c) (((d))) ((e f))")
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(refs, vec!["a", "d"]);
    }

    #[test]
    fn values_are_textual() {
        let v = vars(&[("list", "[1, 2]")]);
        assert_eq!(substitute("x: ((list))", &v), "x: [1, 2]");
    }

    #[test]
    fn var_flags() {
        assert_eq!(parse_var_flag("k=v=w").unwrap(), ("k".into(), "v=w".into()));
        assert_eq!(parse_var_flag("k=").unwrap(), ("k".into(), "".into()));
        assert!(parse_var_flag("novalue").is_err());
        assert!(parse_var_flag("bad name=x").is_err());
    }
}
