//! The `--auth` file: who may call a coordinator — entries of a team, a
//! role and the SHA-256 of a token (never the token) — read, checked with
//! positions, and matched against a presented token in constant time.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{Identity, Role};
use crate::store::check_name;

/// One entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Written {
    /// A label for logs (`ci-bot`, `alice`); not secret.
    #[serde(default)]
    name: Option<String>,
    team: String,
    role: String,
    /// Hex SHA-256 of the token (`steppe token new` prints it).
    sha256: String,
    /// Worker pools the entry's team owns (for a worker token: the only
    /// pools it may serve).
    #[serde(default)]
    pools: Vec<String>,
}

/// One caller the file lets in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub identity: Identity,
    pub pools: Vec<String>,
    digest: [u8; 32],
}

/// The callers a coordinator lets in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthFile {
    entries: Vec<Entry>,
}

/// The SHA-256 of a token, as the file holds it.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.trim().as_bytes()).into()
}

pub fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

pub fn role_of(word: &str) -> Option<Role> {
    match word {
        "submit" => Some(Role::Submit),
        "worker" => Some(Role::Worker),
        "admin" => Some(Role::Admin),
        _ => None,
    }
}

pub fn role_word(r: Role) -> &'static str {
    match r {
        Role::Submit => "submit",
        Role::Worker => "worker",
        Role::Admin => "admin",
    }
}

impl AuthFile {
    /// Reads and checks `path`; every problem is named with its line.
    pub fn read(path: &Path) -> Result<AuthFile, String> {
        let shown = path.display();
        let bytes = steppe_language::confine::read_capped(path, 1 << 20).map_err(|e| format!("--auth {shown}: {e}"))?;
        let text = String::from_utf8(bytes).map_err(|_| format!("--auth {shown}: not UTF-8 text"))?;
        Self::parse(&text).map_err(|problems| problems.iter().map(|p| format!("{shown}:{p}")).collect::<Vec<_>>().join("\n"))
    }

    /// Parses the text of an auth file: problems as `LINE:COL: message`.
    pub fn parse(text: &str) -> Result<AuthFile, Vec<String>> {
        let at = |m: steppe_language::source::Mark, msg: String| format!("{}:{}: {msg}", m.line, m.col);
        let (node, yaml_problems) = steppe_language::yaml::parse(text, 0).map_err(|e| vec![at(e.mark, format!("invalid YAML: {}", e.message))])?;
        if !yaml_problems.is_empty() {
            return Err(yaml_problems.into_iter().map(|p| at(p.mark, p.message)).collect());
        }
        let Some(node) = node else { return Ok(AuthFile::default()) };
        let (written, problems) = steppe_language::de::decode::<Vec<Written>>(&node, "");
        if !problems.is_empty() {
            return Err(problems.into_iter().map(|p| at(p.mark, format!("{}: {}", p.path, p.message))).collect());
        }
        let mut errors = Vec::new();
        let mut entries = Vec::new();
        let items = node.items().unwrap_or_default();
        for (i, w) in written.unwrap_or_default().into_iter().enumerate() {
            let mark = items.get(i).map(|n| n.mark).unwrap_or_default();
            let mut bad = |m: String| errors.push(at(mark, format!("[{i}]: {m}")));
            let Some(role) = role_of(&w.role) else {
                bad(format!("role {:?} is not one of submit, worker, admin", w.role));
                continue;
            };
            if role != Role::Admin || !w.team.is_empty() {
                if let Err(e) = check_name("team", &w.team) {
                    bad(e);
                    continue;
                }
            }
            let Some(digest) = unhex(&w.sha256) else {
                bad("sha256 must be the 64 hex digits of the token's SHA-256 (`steppe token new` prints the entry)".into());
                continue;
            };
            if let Some(p) = w.pools.iter().find(|p| crate::queue::check_pool_name(p).is_err()) {
                bad(format!("pool {p:?} is not a pool name"));
                continue;
            }
            let name = w.name.unwrap_or_else(|| format!("{} {} #{i}", w.team, role_word(role)));
            entries.push(Entry { name, identity: Identity { team: w.team, role, pools: w.pools.clone() }, pools: w.pools, digest });
        }
        let file = AuthFile { entries };
        if let Err(e) = file.pool_owners() {
            errors.push(e);
        }
        if errors.is_empty() {
            Ok(file)
        } else {
            Err(errors)
        }
    }

    /// An admin entry for the token of `--token-file`.
    pub fn with_admin_token(mut self, token: &str) -> Self {
        self.entries.push(Entry { name: "--token-file".into(), identity: Identity::admin(), pools: Vec::new(), digest: digest(token) });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry `token` is, compared against every entry in constant time
    /// (no early exit: how long it took says nothing about which matched).
    pub fn lookup(&self, token: &str) -> Option<&Entry> {
        let d = digest(token);
        let mut found = None;
        for e in &self.entries {
            if bool::from(e.digest.ct_eq(&d)) && found.is_none() {
                found = Some(e);
            }
        }
        found
    }

    /// Which team owns each pool an entry names (one team per pool).
    pub fn pool_owners(&self) -> Result<HashMap<String, String>, String> {
        let mut owners: HashMap<String, String> = HashMap::new();
        for e in &self.entries {
            for p in &e.pools {
                if let Some(other) = owners.insert(p.clone(), e.identity.team.clone()) {
                    if other != e.identity.team {
                        return Err(format!("pool {p} is named by two teams' entries; a pool belongs to one team"));
                    }
                }
            }
        }
        Ok(owners)
    }
}

/// A fresh token: 32 bytes from the system's random source, hex, with a
/// prefix secret scanners know.
pub fn new_token() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!("steppe_{}", hex(&bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_and_matched_by_digest() {
        let t = "steppe_blue";
        let text = format!("- name: ci\n  team: blue\n  role: submit\n  sha256: {}\n- team: blue\n  role: worker\n  sha256: {}\n  pools: [blue-gpu]\n", hex(&digest(t)), hex(&digest("w")));
        let f = AuthFile::parse(&text).unwrap();
        let e = f.lookup(t).expect("the token matches");
        assert_eq!((e.name.as_str(), e.identity.team.as_str(), e.identity.role), ("ci", "blue", Role::Submit));
        assert_eq!(f.lookup("w").map(|e| e.identity.role), Some(Role::Worker));
        assert!(f.lookup("steppe_blu").is_none() && f.lookup("").is_none());
        assert_eq!(f.pool_owners().unwrap().get("blue-gpu").map(String::as_str), Some("blue"));
    }

    #[test]
    fn mistakes_are_named_with_their_line() {
        let bad = "- team: blue\n  role: owner\n  sha256: 00\n- team: a:b\n  role: submit\n  sha256: 00\n- team: red\n  role: submit\n  sha256: xyz\n  colour: red\n";
        let errs = AuthFile::parse(bad).unwrap_err().join("\n");
        assert!(errs.contains("colour"), "{errs}");
        let errs = AuthFile::parse("- team: blue\n  role: owner\n  sha256: 00\n").unwrap_err().join("\n");
        assert!(errs.starts_with("1:") && errs.contains("not one of submit, worker, admin"), "{errs}");
        let errs = AuthFile::parse(&format!("- team: a:b\n  role: submit\n  sha256: {}\n", "0".repeat(64))).unwrap_err().join("\n");
        assert!(errs.contains("team"), "{errs}");
        let errs = AuthFile::parse("- team: blue\n  role: submit\n  sha256: 1234\n").unwrap_err().join("\n");
        assert!(errs.contains("64 hex digits"), "{errs}");
        let two = format!("- team: a\n  role: worker\n  sha256: {z}\n  pools: [p]\n- team: b\n  role: worker\n  sha256: {z}\n  pools: [p]\n", z = "0".repeat(64));
        assert!(AuthFile::parse(&two).unwrap_err().join("\n").contains("belongs to one team"));
    }

    #[test]
    fn new_tokens_differ_and_hash_as_written() {
        let (a, b) = (new_token().unwrap(), new_token().unwrap());
        assert_ne!(a, b);
        assert!(a.starts_with("steppe_") && a.len() == 7 + 64);
        assert_eq!(digest(&format!("{a}\n")), digest(&a), "a token read from a file with its newline is the same token");
    }
}
