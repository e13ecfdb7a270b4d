//! Strict serde decoding of a [`Node`] tree that keeps going after a mistake.
//!
//! Three properties the pipeline loader relies on:
//! - an unknown key is recorded with a near-miss suggestion and skipped, so
//!   every unknown key in a file is reported, not just the first;
//! - every error is recorded once, at the innermost node it arose in, with
//!   that node's position and key path;
//! - list fields decoded with [`lenient_vec`] drop a broken element and go on
//!   with its siblings, so one bad step does not hide the problems of the next.
//!
//! Records go to a thread-local sink opened by [`decode`]; the serde error
//! that propagates afterwards only says "already recorded".

use std::cell::RefCell;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    VariantAccess, Visitor,
};
use serde::Deserialize;

use crate::source::Mark;
use crate::suggest::did_you_mean;
use crate::yaml::{Node, NodeKind, Resolved};

mod shapes;

pub use shapes::{fields_of, lenient_opt_vec, lenient_vec, scalar_or_map, seq_or_map};

/// One decoding problem, positioned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeProblem {
    pub mark: Mark,
    pub path: String,
    pub message: String,
}

thread_local! {
    static SINK: RefCell<Option<Vec<DecodeProblem>>> = const { RefCell::new(None) };
}

fn record(mark: Mark, path: &str, message: String) {
    SINK.with(|s| {
        if let Some(v) = s.borrow_mut().as_mut() {
            v.push(DecodeProblem {
                mark,
                path: path.to_string(),
                message,
            });
        }
    });
}

/// Decodes `node` into `T`, returning the value (when decoding got that far)
/// and every problem found on the way.
pub fn decode<T: for<'de> Deserialize<'de>>(node: &Node, path: &str) -> (Option<T>, Vec<DecodeProblem>) {
    let outer = SINK.with(|s| s.borrow_mut().replace(Vec::new()));
    let result = T::deserialize(NodeDe::new(node, path.to_string()));
    let problems = SINK.with(|s| std::mem::replace(&mut *s.borrow_mut(), outer)).unwrap_or_default();
    match result {
        Ok(v) => (Some(v), problems),
        Err(e) => {
            let mut problems = problems;
            if !e.recorded {
                problems.push(DecodeProblem {
                    mark: e.mark.unwrap_or(node.mark),
                    path: path.to_string(),
                    message: e.message,
                });
            }
            (None, problems)
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeError {
    message: String,
    mark: Option<Mark>,
    recorded: bool,
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: humanize(&msg.to_string()),
            mark: None,
            recorded: false,
        }
    }
}

/// Rewrites serde's wording into the loader's (`missing field `x`` → `missing required key "x"`).
fn humanize(m: &str) -> String {
    if let Some(rest) = m.strip_prefix("missing field `") {
        return format!("missing required key \"{}\"", rest.trim_end_matches('`'));
    }
    if let Some(rest) = m.strip_prefix("invalid type: ") {
        return format!("wrong type: got {}", rest.replace('`', "\""));
    }
    m.replace('`', "\"")
}

/// Deserializes one node; carries its key path for error messages.
pub struct NodeDe<'a> {
    node: &'a Node,
    path: String,
}

impl<'a> NodeDe<'a> {
    pub fn new(node: &'a Node, path: String) -> Self {
        NodeDe { node, path }
    }

    fn locate(&self, mut e: DeError) -> DeError {
        if !e.recorded {
            let mark = e.mark.unwrap_or(self.node.mark);
            record(mark, &self.path, e.message.clone());
            e.mark = Some(mark);
            e.recorded = true;
        }
        e
    }

    fn wrong(&self, want: &str) -> DeError {
        self.locate(DeError {
            message: format!("expected {want}, got {}", self.node.describe()),
            mark: Some(self.node.mark),
            recorded: false,
        })
    }

    fn child(&self, seg: &str) -> String {
        if self.path.is_empty() {
            seg.to_string()
        } else {
            format!("{}.{}", self.path, seg)
        }
    }

    fn scalar_text(&self) -> Option<&'a str> {
        self.node.as_str()
    }

    fn int(&self) -> Result<i64, DeError> {
        match &self.node.kind {
            NodeKind::Scalar(s) => {
                let t = s.text.trim();
                t.parse::<i64>().map_err(|_| self.wrong("a whole number"))
            }
            _ => Err(self.wrong("a whole number")),
        }
    }

    fn float(&self) -> Result<f64, DeError> {
        match &self.node.kind {
            NodeKind::Scalar(s) => match s.resolve() {
                Resolved::Float(f) => Ok(f),
                Resolved::Int(i) => Ok(i as f64),
                _ => s.text.trim().parse::<f64>().map_err(|_| self.wrong("a number")),
            },
            _ => Err(self.wrong("a number")),
        }
    }
}

macro_rules! de_int {
    ($($m:ident => $v:ident as $t:ty),*) => {$(
        fn $m<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let i = self.int()?;
            let r = visitor.$v(i as $t);
            r.map_err(|e| self.locate(e))
        }
    )*};
}

impl<'de, 'a> Deserializer<'de> for NodeDe<'a> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Scalar(s) => match s.resolve() {
                Resolved::Null => visitor.visit_unit(),
                Resolved::Bool(b) => visitor.visit_bool(b),
                Resolved::Int(i) => visitor.visit_i64(i),
                Resolved::Float(f) => visitor.visit_f64(f),
                Resolved::Str => visitor.visit_str(&s.text),
            },
            NodeKind::Seq(items) => visitor.visit_seq(Seq {
                items: items.iter().enumerate(),
                path: &self.path,
            }),
            NodeKind::Map(entries) => visitor.visit_map(FreeMap {
                entries: entries.iter(),
                value: None,
                path: &self.path,
            }),
        };
        r.map_err(|e| self.locate(e))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let b = match self.scalar_text() {
            Some("true" | "True" | "TRUE" | "yes" | "Yes" | "on" | "On") => true,
            Some("false" | "False" | "FALSE" | "no" | "No" | "off" | "Off") => false,
            _ => return Err(self.wrong("true or false")),
        };
        visitor.visit_bool(b).map_err(|e| self.locate(e))
    }

    de_int!(deserialize_i8 => visit_i64 as i64, deserialize_i16 => visit_i64 as i64,
            deserialize_i32 => visit_i64 as i64, deserialize_i64 => visit_i64 as i64,
            deserialize_u8 => visit_i64 as i64, deserialize_u16 => visit_i64 as i64,
            deserialize_u32 => visit_i64 as i64, deserialize_u64 => visit_i64 as i64);

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let f = self.float()?;
        visitor.visit_f64(f).map_err(|e| self.locate(e))
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let f = self.float()?;
        visitor.visit_f64(f).map_err(|e| self.locate(e))
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.kind {
            NodeKind::Scalar(s) => {
                let text = if s.resolve() == Resolved::Null { "" } else { s.text.as_str() };
                visitor.visit_str(text).map_err(|e| self.locate(e))
            }
            _ => Err(self.wrong("a string")),
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        if self.node.is_null() {
            visitor.visit_none().map_err(|e| self.locate(e))
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit().map_err(|e| self.locate(e))
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Seq(items) => visitor.visit_seq(Seq {
                items: items.iter().enumerate(),
                path: &self.path,
            }),
            _ if self.node.is_null() => visitor.visit_seq(Seq {
                items: [].iter().enumerate(),
                path: &self.path,
            }),
            _ => return Err(self.wrong("a list")),
        };
        r.map_err(|e| self.locate(e))
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Map(entries) => visitor.visit_map(FreeMap {
                entries: entries.iter(),
                value: None,
                path: &self.path,
            }),
            _ if self.node.is_null() => visitor.visit_map(FreeMap {
                entries: [].iter(),
                value: None,
                path: &self.path,
            }),
            _ => return Err(self.wrong("a mapping")),
        };
        r.map_err(|e| self.locate(e))
    }

    /// Mappings are checked against `fields` (unknown keys recorded and
    /// skipped); anything else goes to `deserialize_any`, so types that accept
    /// "a string or a mapping" can be written as ordinary visitors.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let r = match &self.node.kind {
            NodeKind::Map(entries) => visitor.visit_map(Struct {
                entries: entries.iter(),
                value: None,
                path: &self.path,
                fields,
            }),
            _ if self.node.is_null() => visitor.visit_map(Struct {
                entries: [].iter(),
                value: None,
                path: &self.path,
                fields,
            }),
            _ => return self.deserialize_any(visitor),
        };
        r.map_err(|e| self.locate(e))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let (tag, value) = match &self.node.kind {
            NodeKind::Scalar(s) => (s.text.as_str(), None),
            NodeKind::Map(entries) if entries.len() == 1 => match entries[0].0.as_str() {
                Some(k) => (k, Some(&entries[0].1)),
                None => return Err(self.wrong(&format!("one of {}", variants.join(", ")))),
            },
            _ => return Err(self.wrong(&format!("one of {}", variants.join(", ")))),
        };
        if !variants.contains(&tag) {
            let msg = format!(
                "\"{tag}\" is not one of {}{}",
                variants.join(", "),
                did_you_mean(tag, variants.iter().copied())
            );
            return Err(self.locate(DeError {
                message: msg,
                mark: Some(self.node.mark),
                recorded: false,
            }));
        }
        let path = self.child(tag);
        let r = visitor.visit_enum(Enum { tag, value, path });
        r.map_err(|e| self.locate(e))
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct Seq<'a, I: Iterator<Item = (usize, &'a Node)>> {
    items: I,
    path: &'a str,
}

impl<'de, 'a, I: Iterator<Item = (usize, &'a Node)>> SeqAccess<'de> for Seq<'a, I> {
    type Error = DeError;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            None => Ok(None),
            Some((i, n)) => seed
                .deserialize(NodeDe::new(n, format!("{}[{i}]", self.path)))
                .map(Some),
        }
    }
}

fn key_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

struct FreeMap<'a> {
    entries: std::slice::Iter<'a, (Node, Node)>,
    value: Option<(&'a Node, String)>,
    path: &'a str,
}

impl<'de, 'a> MapAccess<'de> for FreeMap<'a> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        match self.entries.next() {
            None => Ok(None),
            Some((k, v)) => {
                let key = k.as_str().unwrap_or_default();
                let path = key_path(self.path, key);
                self.value = Some((v, path.clone()));
                seed.deserialize(NodeDe::new(k, path)).map(Some)
            }
        }
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let (v, path) = self.value.take().ok_or_else(|| de::Error::custom("value without a key"))?;
        seed.deserialize(NodeDe::new(v, path))
    }
}

struct Struct<'a> {
    entries: std::slice::Iter<'a, (Node, Node)>,
    value: Option<(&'a Node, String)>,
    path: &'a str,
    fields: &'static [&'static str],
}

impl<'de, 'a> MapAccess<'de> for Struct<'a> {
    type Error = DeError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, DeError> {
        for (k, v) in self.entries.by_ref() {
            let Some(key) = k.as_str().filter(|_| !matches!(k.kind, NodeKind::Map(_) | NodeKind::Seq(_))) else {
                record(k.mark, self.path, format!("a key must be a plain name, not {}", k.describe()));
                continue;
            };
            let path = key_path(self.path, key);
            if !self.fields.contains(&key) {
                record(
                    k.mark,
                    &path,
                    format!(
                        "unknown key \"{key}\"{}",
                        did_you_mean(key, self.fields.iter().copied())
                    ),
                );
                continue;
            }
            self.value = Some((v, path));
            let key_de: de::value::StrDeserializer<'_, DeError> = key.into_deserializer();
            return seed.deserialize(key_de).map(Some);
        }
        Ok(None)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let (v, path) = self.value.take().ok_or_else(|| de::Error::custom("value without a key"))?;
        seed.deserialize(NodeDe::new(v, path))
    }
}

struct Enum<'a> {
    tag: &'a str,
    value: Option<&'a Node>,
    path: String,
}

impl<'de, 'a> EnumAccess<'de> for Enum<'a> {
    type Error = DeError;
    type Variant = Self;
    fn variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<(S::Value, Self), DeError> {
        let tag_de: de::value::StrDeserializer<'_, DeError> = self.tag.into_deserializer();
        let v = seed.deserialize(tag_de)?;
        Ok((v, self))
    }
}

impl<'de, 'a> VariantAccess<'de> for Enum<'a> {
    type Error = DeError;
    fn unit_variant(self) -> Result<(), DeError> {
        match self.value {
            None => Ok(()),
            Some(n) if n.is_null() => Ok(()),
            Some(_) => Err(de::Error::custom(format!("\"{}\" takes no value", self.tag))),
        }
    }
    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, DeError> {
        match self.value {
            Some(n) => seed.deserialize(NodeDe::new(n, self.path)),
            None => Err(de::Error::custom(format!("\"{}\" needs a value", self.tag))),
        }
    }
    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        match self.value {
            Some(n) => NodeDe::new(n, self.path).deserialize_seq(visitor),
            None => Err(de::Error::custom(format!("\"{}\" needs a list", self.tag))),
        }
    }
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match self.value {
            Some(n) => NodeDe::new(n, self.path).deserialize_struct("", fields, visitor),
            None => Err(de::Error::custom(format!("\"{}\" needs a mapping", self.tag))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::parse;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        name: String,
        #[serde(default)]
        count: Option<i64>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Outer {
        #[serde(deserialize_with = "lenient_vec")]
        items: Vec<Inner>,
    }

    fn run<T: for<'de> Deserialize<'de>>(y: &str) -> (Option<T>, Vec<DecodeProblem>) {
        let (n, _) = parse(y, 0).unwrap();
        decode::<T>(&n.unwrap(), "")
    }

    #[test]
    fn every_unknown_key_is_reported_with_a_suggestion() {
        let (v, p) = run::<Outer>("items:\n- name: a\n  cuont: 1\n- name: b\n  nmae: x\n");
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].message, "unknown key \"cuont\" (did you mean \"count\"?)");
        assert_eq!(p[0].path, "items[0].cuont");
        assert_eq!((p[0].mark.line, p[0].mark.col), (3, 3));
        assert_eq!(p[1].path, "items[1].nmae");
        assert_eq!(v.unwrap().items.len(), 2);
    }

    #[test]
    fn a_broken_element_does_not_hide_its_siblings() {
        let (v, p) = run::<Outer>("items:\n- count: 1\n- name: b\n  count: lots\n- name: c\n");
        let msgs: Vec<_> = p.iter().map(|p| (p.path.as_str(), p.message.as_str())).collect();
        assert_eq!(msgs.len(), 2, "{msgs:?}");
        assert_eq!(msgs[0], ("items[0]", "missing required key \"name\""));
        assert_eq!(msgs[1].0, "items[1].count");
        assert!(msgs[1].1.contains("whole number"), "{msgs:?}");
        assert_eq!(v.unwrap().items, vec![Inner { name: "c".into(), count: None }]);
    }

    #[test]
    fn fields_of_reports_declared_names() {
        assert_eq!(fields_of::<Inner>(), &["name", "count"]);
    }
}
