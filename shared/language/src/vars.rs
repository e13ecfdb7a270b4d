//! `((var))` pipeline variables: textual substitution before the YAML parse.

use std::collections::BTreeMap;

/// Variable values from `--vars-file` and `--var` (flags win).
pub type Vars = BTreeMap<String, String>;

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
}

/// A `((…))` reference in text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ref<'t> {
    /// `((name))`: a pipeline variable (`--var`, `--vars-file`, `load_var:`).
    Var(&'t str),
    /// `((.:name))`: Concourse's local-variable form (its `across:` and
    /// `load_var:` values), which steppe does not have; the name after `.:`.
    ConcourseLocal(&'t str),
}

/// Every `((name))` and `((.:name))` in `text`, as (byte range, reference), in order.
pub fn scan(text: &str) -> Vec<(std::ops::Range<usize>, Ref<'_>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(off) = text[i..].find("((") {
        let start = i + off;
        let local = text[start + 2..].starts_with(".:");
        let name_start = start + if local { 4 } else { 2 };
        let name_len = text[name_start..]
            .find(|c: char| !is_name_char(c))
            .unwrap_or(text.len() - name_start);
        let name_end = name_start + name_len;
        if name_len > 0 && text[name_end..].starts_with("))") {
            let name = &text[name_start..name_end];
            out.push((start..name_end + 2, if local { Ref::ConcourseLocal(name) } else { Ref::Var(name) }));
            i = name_end + 2;
        } else {
            i = start + 1;
        }
    }
    out
}

/// Every `((name))` in `text`, as (byte range, name), in order.
pub fn find_refs(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    scan(text)
        .into_iter()
        .filter_map(|(range, r)| match r {
            Ref::Var(name) => Some((range, name)),
            Ref::ConcourseLocal(_) => None,
        })
        .collect()
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
    fn concourse_local_references_are_told_apart() {
        let refs: Vec<_> = scan("((.:a)) ((b)) ((.:)) ((.c)) (((.:d)))").into_iter().map(|(_, r)| r).collect();
        assert_eq!(refs, vec![Ref::ConcourseLocal("a"), Ref::Var("b"), Ref::Var(".c"), Ref::ConcourseLocal("d")]);
        assert_eq!(find_refs("((.:a)) ((b))").into_iter().map(|(_, n)| n).collect::<Vec<_>>(), vec!["b"]);
        let v = vars(&[("a", "x")]);
        assert_eq!(substitute("((.:a)) ((a))", &v), "((.:a)) x");
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
