//! Merkle chain hashes of a job's plan: a node's hash folds its parent's, so
//! one hash names every step before it (pipeline-language.md §6).

use sha2::{Digest, Sha256};
use serde_json::Value;

use crate::store::{write_canonical, write_json_str};

/// The hash of one node: SHA-256 of `{kind, content, parent}` as canonical
/// JSON (keys sorted), in hex. The root's parent is "".
pub fn node_hash(kind: &str, content: &Value, parent: &str) -> String {
    let mut text = String::new();
    write_canonical(content, &mut text);
    node_hash_of_canonical(kind, &text, parent)
}

/// As [`node_hash`], for content already written canonically (a matrix
/// cell's step, written once for all its cells).
pub fn node_hash_of_canonical(kind: &str, content: &str, parent: &str) -> String {
    // `{"content":…,"kind":…,"parent":…}`: the keys in sorted order.
    let mut text = String::with_capacity(content.len() + parent.len() + kind.len() + 40);
    text.push_str("{\"content\":");
    text.push_str(content);
    text.push_str(",\"kind\":");
    write_json_str(kind, &mut text);
    text.push_str(",\"parent\":");
    write_json_str(parent, &mut text);
    text.push('}');
    hex(&Sha256::digest(text.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// A hash as views print it: its first 12 hex digits.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_hash_names_its_content_kind_and_whole_prefix() {
        let a = node_hash("task", &json!({"run": "make", "outputs": ["bin"]}), "");
        assert_eq!(a.len(), 64);
        assert_eq!(a, node_hash("task", &json!({"outputs": ["bin"], "run": "make"}), ""), "key order is not content");
        assert_ne!(a, node_hash("task", &json!({"run": "make test", "outputs": ["bin"]}), ""));
        assert_ne!(a, node_hash("get", &json!({"run": "make", "outputs": ["bin"]}), ""));
        let child = node_hash("task", &json!({"run": "test"}), &a);
        assert_ne!(child, node_hash("task", &json!({"run": "test"}), &node_hash("task", &json!({"run": "make"}), "")), "a changed parent changes every hash after it");
        assert_eq!(short(&a).len(), 12);
        // The bytes hashed are the canonical JSON of the whole node, as they always were.
        let whole = crate::store::canonical(&serde_json::json!({"kind": "task", "content": {"run": "make", "outputs": ["bin"]}, "parent": ""}));
        let digest = Sha256::digest(whole.as_bytes());
        assert_eq!(a, digest.iter().map(|b| format!("{b:02x}")).collect::<String>());
    }
}
