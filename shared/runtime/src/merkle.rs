//! Merkle chain hashes of a job's plan: a node's hash folds its parent's, so
//! one hash names every step before it (pipeline-language.md §6).

use sha2::{Digest, Sha256};
use serde_json::{json, Value};

/// The hash of one node: SHA-256 of `{kind, content, parent}` as canonical
/// JSON (keys sorted), in hex. The root's parent is "".
pub fn node_hash(kind: &str, content: &Value, parent: &str) -> String {
    let text = crate::store::canonical(&json!({"kind": kind, "content": content, "parent": parent}));
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// A hash as views print it: its first 12 hex digits.
pub fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
