//! JSON values ↔ `steppe.v1.Json`: a flat list of pre-order nodes (see json.proto).

use serde_json::{Map, Number, Value};
use steppe_proto::v1;
use v1::json_node::Kind;

/// The deepest nesting of lists and objects a reader accepts.
pub const MAX_DEPTH: usize = 256;

/// Why a node list is not one JSON value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsonError {
    #[error("the nodes end before the value does (node {0})")]
    Truncated(usize),
    #[error("{0} node(s) left over after the value")]
    Leftover(usize),
    #[error("nested deeper than {MAX_DEPTH} (node {0})")]
    TooDeep(usize),
    #[error("node {0}: an object member without a key")]
    NoKey(usize),
    #[error("node {0}: a key outside an object")]
    StrayKey(usize),
    #[error("node {0}: key {1:?} twice in one object")]
    DuplicateKey(usize, String),
    #[error("node {0}: a node of no kind")]
    NoKind(usize),
    #[error("node {0}: {1} is not a finite number")]
    NotFinite(usize, f64),
}

/// A value as nodes. Iterative: a value of any depth is written (a reader
/// refuses one deeper than [`MAX_DEPTH`]).
pub fn json_to_wire(v: &Value) -> v1::Json {
    let mut nodes = Vec::new();
    write(&mut nodes, vec![(None, v)]);
    v1::Json { nodes }
}

/// An object as nodes, without copying it into a [`Value`] first.
pub fn object_to_wire(m: &Map<String, Value>) -> v1::Json {
    let mut nodes = vec![v1::JsonNode { key: None, kind: Some(Kind::ObjectLen(len(m.len()))) }];
    write(&mut nodes, m.iter().rev().map(|(k, v)| (Some(k.as_str()), v)).collect());
    v1::Json { nodes }
}

fn len(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// Writes the values on `stack` (the next one last) in pre-order.
fn write<'a>(nodes: &mut Vec<v1::JsonNode>, mut stack: Vec<(Option<&'a str>, &'a Value)>) {
    while let Some((key, v)) = stack.pop() {
        let kind = match v {
            Value::Null => Kind::NullValue(true),
            Value::Bool(b) => Kind::BoolValue(*b),
            Value::Number(n) => number(n),
            Value::String(s) => Kind::StringValue(s.clone()),
            Value::Array(items) => {
                stack.extend(items.iter().rev().map(|v| (None, v)));
                Kind::ListLen(len(items.len()))
            }
            Value::Object(m) => {
                stack.extend(m.iter().rev().map(|(k, v)| (Some(k.as_str()), v)));
                Kind::ObjectLen(len(m.len()))
            }
        };
        nodes.push(v1::JsonNode { key: key.map(str::to_string), kind: Some(kind) });
    }
}

fn number(n: &Number) -> Kind {
    if let Some(u) = n.as_u64() {
        Kind::UintValue(u)
    } else if let Some(i) = n.as_i64() {
        Kind::IntValue(i)
    } else {
        // Every other number is an f64 (serde_json without arbitrary_precision).
        Kind::FloatValue(n.as_f64().unwrap_or(f64::NAN))
    }
}

/// A list or object being filled: its key in its parent, and how many
/// elements or members it still waits for.
enum Open {
    List { key: Option<String>, items: Vec<Value>, left: usize },
    Object { key: Option<String>, members: Map<String, Value>, left: usize },
}

/// The value the nodes stand for; an error (never a panic, and in bounded
/// stack) when they are not exactly one value.
pub fn json_from_wire(json: v1::Json) -> Result<Value, JsonError> {
    let total = json.nodes.len();
    let mut nodes = json.nodes.into_iter().enumerate();
    let mut open: Vec<Open> = Vec::new();
    loop {
        let Some((i, node)) = nodes.next() else { return Err(JsonError::Truncated(total)) };
        let key = match (matches!(open.last(), Some(Open::Object { .. })), node.key) {
            (true, Some(k)) => Some(k),
            (true, None) => return Err(JsonError::NoKey(i)),
            (false, Some(_)) => return Err(JsonError::StrayKey(i)),
            (false, None) => None,
        };
        let remaining = total - i - 1;
        let mut value = match node.kind.ok_or(JsonError::NoKind(i))? {
            Kind::NullValue(_) => Value::Null,
            Kind::BoolValue(b) => Value::Bool(b),
            Kind::IntValue(n) => Value::from(n),
            Kind::UintValue(n) => Value::from(n),
            Kind::FloatValue(f) => Value::Number(Number::from_f64(f).ok_or(JsonError::NotFinite(i, f))?),
            Kind::StringValue(s) => Value::String(s),
            Kind::ListLen(0) => Value::Array(Vec::new()),
            Kind::ObjectLen(0) => Value::Object(Map::new()),
            Kind::ListLen(n) | Kind::ObjectLen(n) if n as usize > remaining => return Err(JsonError::Truncated(i)),
            _ if open.len() >= MAX_DEPTH => return Err(JsonError::TooDeep(i)),
            Kind::ListLen(n) => {
                open.push(Open::List { key, items: Vec::with_capacity(n as usize), left: n as usize });
                continue;
            }
            Kind::ObjectLen(n) => {
                open.push(Open::Object { key, members: Map::with_capacity(n as usize), left: n as usize });
                continue;
            }
        };
        // A whole value: into its parent, closing every parent it completes.
        let mut key = key;
        loop {
            match open.last_mut() {
                None => {
                    return match total - i - 1 {
                        0 => Ok(value),
                        left => Err(JsonError::Leftover(left)),
                    }
                }
                Some(Open::List { items, left, .. }) => {
                    items.push(value);
                    *left -= 1;
                }
                Some(Open::Object { members, left, .. }) => {
                    let k = key.take().ok_or(JsonError::NoKey(i))?;
                    if members.contains_key(&k) {
                        return Err(JsonError::DuplicateKey(i, k));
                    }
                    members.insert(k, value);
                    *left -= 1;
                }
            }
            let full = match open.last() {
                Some(Open::List { left: 0, .. } | Open::Object { left: 0, .. }) => open.pop(),
                _ => None,
            };
            (key, value) = match full {
                Some(Open::List { key, items, .. }) => (key, Value::Array(items)),
                Some(Open::Object { key, members, .. }) => (key, Value::Object(members)),
                None => break,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn node(key: Option<&str>, kind: Kind) -> v1::JsonNode {
        v1::JsonNode { key: key.map(str::to_string), kind: Some(kind) }
    }

    fn round_trip(v: &Value) -> Value {
        json_from_wire(crate::wire::through_bytes(json_to_wire(v))).expect("a written value reads back")
    }

    /// Values equal and alike: object keys in the same order, integers of
    /// the same kind (serde_json's `==` ignores key order).
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().zip(y).all(|((k1, v1), (k2, v2))| k1 == k2 && same(v1, v2)),
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q)),
            (Value::Number(x), Value::Number(y)) => (x.as_u64(), x.as_i64(), x.is_f64()) == (y.as_u64(), y.as_i64(), y.is_f64()) && x.as_f64() == y.as_f64(),
            _ => a == b,
        }
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
            ".{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                // A Vec of pairs, not a map: the order is arbitrary, not sorted.
                prop::collection::vec((".{0,6}", inner), 0..8).prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_value_round_trips_exactly(v in any_json()) {
            let back = round_trip(&v);
            prop_assert!(same(&v, &back), "{v} came back as {back}");
        }

        #[test]
        fn any_node_list_reads_or_is_refused(nodes in prop::collection::vec(
            (prop::option::of(".{0,3}"), prop::option::of(prop_oneof![
                any::<bool>().prop_map(Kind::NullValue),
                any::<bool>().prop_map(Kind::BoolValue),
                any::<i64>().prop_map(Kind::IntValue),
                any::<u64>().prop_map(Kind::UintValue),
                any::<f64>().prop_map(Kind::FloatValue),
                ".{0,3}".prop_map(Kind::StringValue),
                (0u32..4).prop_map(Kind::ListLen),
                (0u32..4).prop_map(Kind::ObjectLen),
                any::<u32>().prop_map(Kind::ListLen),
            ])).prop_map(|(key, kind)| v1::JsonNode { key, kind }),
            0..24,
        )) {
            // Whatever it is, reading it returns (the test is that it does not panic),
            // and what reads back is written back to the same nodes.
            let json = v1::Json { nodes };
            if let Ok(v) = json_from_wire(json.clone()) {
                let again = json_to_wire(&v);
                prop_assert!(same(&json_from_wire(again).unwrap(), &v));
            }
        }
    }

    #[test]
    fn key_order_and_number_kinds_survive() {
        let v = json!({"z": 1, "a": -1, "m": u64::MAX, "b": i64::MIN, "f": 1.5, "g": -0.0, "e": 1e300, "": {"": []}});
        let back = round_trip(&v);
        assert!(same(&v, &back), "{back}");
        assert_eq!(back.as_object().unwrap().keys().collect::<Vec<_>>(), ["z", "a", "m", "b", "f", "g", "e", ""]);
        assert_eq!(back["m"].as_u64(), Some(u64::MAX));
        assert_eq!(back["b"].as_i64(), Some(i64::MIN));
        assert!(back["f"].is_f64() && back["g"].is_f64());
    }

    #[test]
    fn the_encoding_is_as_documented() {
        let nodes = json_to_wire(&json!({"a": [1, true], "b": null})).nodes;
        let want = vec![
            node(None, Kind::ObjectLen(2)),
            node(Some("a"), Kind::ListLen(2)),
            node(None, Kind::UintValue(1)),
            node(None, Kind::BoolValue(true)),
            node(Some("b"), Kind::NullValue(true)),
        ];
        assert_eq!(nodes, want);
        assert_eq!(object_to_wire(json!({"a": [1, true], "b": null}).as_object().unwrap()).nodes, want);
    }

    fn nested(depth: usize) -> Value {
        let mut v = json!("bottom");
        for i in 0..depth {
            v = if i % 2 == 0 { json!([v]) } else { json!({ "k": v }) };
        }
        v
    }

    #[test]
    fn deep_values_read_up_to_the_bound_and_are_refused_beyond() {
        let v = nested(200);
        assert!(same(&round_trip(&v), &v));
        assert!(json_from_wire(json_to_wire(&nested(MAX_DEPTH))).is_ok());
        // Far deeper than any stack would take if reading recursed.
        let mut nodes = vec![node(None, Kind::ListLen(1)); 100_000];
        nodes.push(node(None, Kind::NullValue(true)));
        assert_eq!(json_from_wire(v1::Json { nodes }), Err(JsonError::TooDeep(MAX_DEPTH)));
        assert_eq!(json_from_wire(json_to_wire(&nested(MAX_DEPTH + 1))), Err(JsonError::TooDeep(MAX_DEPTH)));
    }

    #[test]
    fn malformed_node_lists_are_errors() {
        let read = |nodes: Vec<v1::JsonNode>| json_from_wire(v1::Json { nodes });
        assert_eq!(read(vec![]), Err(JsonError::Truncated(0)));
        assert_eq!(read(vec![node(None, Kind::ListLen(3)), node(None, Kind::BoolValue(true))]), Err(JsonError::Truncated(0)));
        assert_eq!(read(vec![node(None, Kind::ListLen(u32::MAX))]), Err(JsonError::Truncated(0)));
        assert_eq!(read(vec![node(None, Kind::ListLen(2)), node(None, Kind::ListLen(1)), node(None, Kind::NullValue(true))]), Err(JsonError::Truncated(3)));
        assert_eq!(read(vec![node(None, Kind::NullValue(true)), node(None, Kind::NullValue(true))]), Err(JsonError::Leftover(1)));
        assert_eq!(read(vec![node(None, Kind::ObjectLen(1)), node(None, Kind::NullValue(true))]), Err(JsonError::NoKey(1)));
        assert_eq!(read(vec![node(Some("k"), Kind::NullValue(true))]), Err(JsonError::StrayKey(0)));
        assert_eq!(read(vec![node(None, Kind::ListLen(1)), node(Some("k"), Kind::NullValue(true))]), Err(JsonError::StrayKey(1)));
        assert_eq!(read(vec![v1::JsonNode { key: None, kind: None }]), Err(JsonError::NoKind(0)));
        assert!(matches!(read(vec![node(None, Kind::FloatValue(f64::NAN))]), Err(JsonError::NotFinite(0, _))));
        assert!(matches!(read(vec![node(None, Kind::FloatValue(f64::INFINITY))]), Err(JsonError::NotFinite(0, _))));
        assert_eq!(
            read(vec![node(None, Kind::ObjectLen(2)), node(Some("k"), Kind::NullValue(true)), node(Some("k"), Kind::BoolValue(true))]),
            Err(JsonError::DuplicateKey(2, "k".into()))
        );
    }
}
