//! RFC 8785 (JCS) canonical JSON, and the `sha256:` digests the ledger uses.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical form of a JSON value: keys sorted by UTF-16 code units,
/// numbers as ECMAScript prints them, no insignificant whitespace.
pub fn canonical(v: &Value) -> String {
    // A serde_json::Value always serializes; the fallback is never taken.
    serde_json_canonicalizer::to_string(v).unwrap_or_else(|_| v.to_string())
}

/// `sha256:` and the hex SHA-256 of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    let d = Sha256::digest(bytes);
    let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The digest of a JSON value's canonical form.
pub fn digest_json(v: &Value) -> String {
    digest(canonical(v).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_sorts_keys_and_prints_numbers_as_ecmascript() {
        assert_eq!(canonical(&json!({"b": 1, "a": [true, null, "x"]})), r#"{"a":[true,null,"x"],"b":1}"#);
        assert_eq!(canonical(&json!(1.0)), "1");
        assert_eq!(canonical(&json!(1e21)), "1e+21");
        assert_eq!(canonical(&json!(0.000001)), "0.000001");
        // Keys sort by UTF-16 code units: U+1F600 (a surrogate pair) before U+FB33.
        assert_eq!(canonical(&json!({"\u{fb33}": 1, "\u{1f600}": 2})), "{\"\u{1f600}\":2,\"\u{fb33}\":1}");
        assert_eq!(canonical(&json!("\u{7f}é\n")), "\"\u{7f}é\\n\"");
        assert_eq!(digest(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
