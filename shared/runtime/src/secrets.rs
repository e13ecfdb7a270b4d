//! Secrets kept out of sight: a URL's user information (`redis://:pw@host`,
//! `https://token@github.com`) and the values of the secrets this process
//! holds (API keys, bearer tokens: [`remember`]) are masked wherever text
//! reaches a terminal, a log, a store or a client; passwords come from
//! files, so they never appear in a command line (`ps`).

use std::borrow::Cow;
use std::sync::{OnceLock, RwLock};

/// Values shorter than this are not masked (they would mask ordinary words).
const SHORTEST: usize = 8;

fn remembered() -> &'static RwLock<Vec<String>> {
    static VALUES: OnceLock<RwLock<Vec<String>>> = OnceLock::new();
    VALUES.get_or_init(|| RwLock::new(Vec::new()))
}

/// From now on `value` is shown as `***` wherever [`mask`] is applied.
pub fn remember(value: &str) {
    let value = value.trim();
    if value.len() < SHORTEST {
        return;
    }
    let mut values = remembered().write().unwrap_or_else(|p| p.into_inner());
    if !values.iter().any(|v| v == value) {
        values.push(value.to_string());
        // The longest first, so a secret holding another is masked whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
    }
}

/// Remembers the values of the variables `names` that are set here.
pub fn remember_env(names: &[String]) {
    for n in names {
        if let Ok(v) = std::env::var(n) {
            remember(&v);
        }
    }
}

/// `text` with every remembered secret and every URL's credentials masked.
pub fn mask(text: &str) -> Cow<'_, str> {
    let values = remembered().read().unwrap_or_else(|p| p.into_inner());
    let mut out: Cow<'_, str> = Cow::Borrowed(text);
    for v in values.iter() {
        if out.contains(v.as_str()) {
            out = Cow::Owned(out.replace(v.as_str(), "***"));
        }
    }
    match out {
        Cow::Borrowed(t) => mask_urls(t),
        Cow::Owned(t) => Cow::Owned(mask_urls(&t).into_owned()),
    }
}

fn pattern() -> &'static regex::Regex {
    static RE: OnceLock<regex::Regex> = OnceLock::new();
    // scheme://userinfo@ — userinfo runs to the last @ before whitespace,
    // a quote or a path, so an unescaped @ in a password is masked too.
    RE.get_or_init(|| regex::Regex::new(r#"(?i)\b([a-z][a-z0-9+.\-]*://)([^\s/"'<>]+)@"#).unwrap_or_else(|_| unreachable!("a fixed pattern")))
}

/// `text` with the credentials of every URL in it masked: `user:***@` when
/// a user name is given, `***@` otherwise.
pub fn mask_urls(text: &str) -> Cow<'_, str> {
    if !text.contains("://") {
        return Cow::Borrowed(text);
    }
    pattern().replace_all(text, |c: &regex::Captures<'_>| {
        let user = &c[2];
        match user.split_once(':') {
            Some((name, _)) => format!("{}{name}:***@", &c[1]),
            None => format!("{}***@", &c[1]),
        }
    })
}

/// Reads a secret (a token, a password) from a file: trimmed, never empty.
pub fn read_file(path: &std::path::Path, flag: &str) -> Result<String, String> {
    use std::io::Read;
    // A file, or a pipe (`--token-file <(pass show steppe)`); 64 KiB at most.
    let mut bytes = Vec::new();
    std::fs::File::open(path).and_then(|f| f.take(64 << 10).read_to_end(&mut bytes)).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{flag} {}: not UTF-8 text", path.display()))?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err(format!("{flag} {} is empty", path.display()));
    }
    Ok(text)
}

/// `url` with `password` in its user information, unless it carries one
/// already (`redis://host/` → `redis://:PASSWORD@host/`).
pub fn with_password(url: &str, password: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let host_end = rest.find('/').unwrap_or(rest.len());
    if rest[..host_end].contains('@') {
        return url.to_string();
    }
    let encoded: String = password
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() || b"-._~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    format!("{scheme}://:{encoded}@{rest}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_goes_into_a_url_that_has_none() {
        assert_eq!(with_password("redis://10.0.0.5:6379/", "p@ss w"), "redis://:p%40ss%20w@10.0.0.5:6379/");
        assert_eq!(with_password("redis://:other@h/", "x"), "redis://:other@h/");
    }

    #[test]
    fn remembered_values_are_masked_wherever_they_appear() {
        remember("sk-or-planted-0123456789");
        remember("short");
        assert_eq!(mask("key=sk-or-planted-0123456789; again sk-or-planted-0123456789"), "key=***; again ***");
        assert_eq!(mask("a short word stays"), "a short word stays");
        assert_eq!(mask("https://sk-or-planted-0123456789@h/ x"), "https://***@h/ x");
    }

    #[test]
    fn credentials_in_urls_are_masked() {
        assert_eq!(mask_urls("connecting to redis://:hunter2@10.0.0.5:6379/0 failed"), "connecting to redis://:***@10.0.0.5:6379/0 failed");
        assert_eq!(mask_urls("rediss://default:p%40ss@h/"), "rediss://default:***@h/");
        assert_eq!(mask_urls("git clone https://ghp_abc123@github.com/o/r.git"), "git clone https://***@github.com/o/r.git");
        assert_eq!(mask_urls("see https://example.com/a@b and me@example.com"), "see https://example.com/a@b and me@example.com");
        assert_eq!(mask_urls("no urls here"), "no urls here");
        assert_eq!(mask_urls("\"http://u:p@h\""), "\"http://u:***@h\"");
        assert_eq!(mask_urls("redis://:p@ss@h:1/"), "redis://:***@h:1/");
    }
}
