//! A YAML document as a tree of nodes that remember where they came from.
//!
//! Built from `saphyr-parser` events (see ARCHITECTURE.md for why), with
//! anchors, aliases and `<<` merge keys resolved here so that everything
//! downstream sees plain mappings, sequences and scalars.

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, Parser, ScalarStyle, Span, SpannedEventReceiver};

use crate::source::{FileId, Mark};

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub mark: Mark,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    Scalar(Scalar),
    Seq(Vec<Node>),
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Scalar {
    pub text: String,
    /// A plain (unquoted, non-block) scalar: only these resolve to null, bool or numbers.
    pub plain: bool,
    /// An explicit `!!str` (or other) tag, which turns off plain resolution.
    pub tagged: bool,
}

/// What a scalar means under the YAML 1.2 core schema.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resolved {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str,
}

impl Scalar {
    pub fn resolve(&self) -> Resolved {
        if !self.plain || self.tagged {
            return Resolved::Str;
        }
        resolve_plain(&self.text)
    }
}

pub fn resolve_plain(t: &str) -> Resolved {
    match t {
        "" | "~" | "null" | "Null" | "NULL" => return Resolved::Null,
        "true" | "True" | "TRUE" => return Resolved::Bool(true),
        "false" | "False" | "FALSE" => return Resolved::Bool(false),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Resolved::Float(f64::INFINITY)
        }
        "-.inf" | "-.Inf" | "-.INF" => return Resolved::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Resolved::Float(f64::NAN),
        _ => {}
    }
    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = t.parse::<i64>() {
            return Resolved::Int(i);
        }
    }
    if let Some(hex) = t.strip_prefix("0x") {
        if let Ok(i) = i64::from_str_radix(hex, 16) {
            return Resolved::Int(i);
        }
    }
    if let Some(oct) = t.strip_prefix("0o") {
        if let Ok(i) = i64::from_str_radix(oct, 8) {
            return Resolved::Int(i);
        }
    }
    let looks_float = digits.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && digits.chars().any(|c| c.is_ascii_digit())
        && digits
            .chars()
            .all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'));
    if looks_float {
        if let Ok(f) = t.parse::<f64>() {
            return Resolved::Float(f);
        }
    }
    Resolved::Str
}

impl Node {
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.kind {
            NodeKind::Scalar(s) => Some(s),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(&self.kind, NodeKind::Scalar(s) if s.resolve() == Resolved::Null)
    }

    /// The text of a scalar node, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        self.scalar().map(|s| s.text.as_str())
    }

    pub fn entries(&self) -> Option<&[(Node, Node)]> {
        match &self.kind {
            NodeKind::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn items(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Seq(v) => Some(v),
            _ => None,
        }
    }

    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entries()?
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    }

    /// A short name for the node's shape, for error messages.
    pub fn describe(&self) -> &'static str {
        match &self.kind {
            NodeKind::Seq(_) => "a list",
            NodeKind::Map(_) => "a mapping",
            NodeKind::Scalar(s) => match s.resolve() {
                Resolved::Null => "nothing (null)",
                Resolved::Bool(_) => "a boolean",
                Resolved::Int(_) | Resolved::Float(_) => "a number",
                Resolved::Str => "a string",
            },
        }
    }
}

/// A problem in the YAML itself, before any pipeline meaning is attached.
#[derive(Debug, Clone, PartialEq)]
pub struct YamlError {
    pub mark: Mark,
    pub message: String,
}

/// How deeply mappings and sequences may nest. Everything downstream
/// (decoding, validation, the plan walker) recurses over the tree, so this
/// bounds their stack; real pipelines stay far below it.
pub const MAX_DEPTH: usize = 128;

/// How many nodes a document may hold once its aliases are expanded: an
/// alias copies its anchor's whole tree, so a few hundred bytes of nested
/// aliases could otherwise ask for billions of nodes.
pub const MAX_NODES: usize = 500_000;

/// How much scalar text a document may hold once its aliases are expanded.
pub const MAX_TEXT: usize = 64 << 20;

/// What a subtree weighs: its nodes and the bytes of its scalars. A
/// [`Size`] carried from one parse to the next (a pipeline and the files it
/// includes) holds them to [`MAX_NODES`] and [`MAX_TEXT`] together.
#[derive(Debug, Clone, Copy, Default)]
pub struct Size {
    nodes: usize,
    bytes: usize,
}

impl std::ops::AddAssign for Size {
    fn add_assign(&mut self, o: Size) {
        self.nodes = self.nodes.saturating_add(o.nodes);
        self.bytes = self.bytes.saturating_add(o.bytes);
    }
}

const ONE: Size = Size { nodes: 1, bytes: 0 };

/// Parses the first document of `text`. An empty document parses as `None`.
/// Duplicate keys are reported in `problems` and the first occurrence is kept.
/// A document nested deeper than [`MAX_DEPTH`] or larger than [`MAX_NODES`]
/// is an error at the node that crossed the limit.
pub fn parse(text: &str, file: FileId) -> Result<(Option<Node>, Vec<YamlError>), YamlError> {
    parse_within(text, file, &mut Size::default())
}

/// As [`parse`], counting against (and adding to) `spent`.
pub fn parse_within(text: &str, file: FileId, spent: &mut Size) -> Result<(Option<Node>, Vec<YamlError>), YamlError> {
    let mut builder = Builder {
        file,
        stack: Vec::new(),
        anchors: HashMap::new(),
        root: None,
        problems: Vec::new(),
        total: *spent,
        fatal: None,
    };
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| YamlError {
        mark: Mark {
            file,
            line: e.marker().line() as u32,
            col: e.marker().col() as u32 + 1,
        },
        message: e.info().to_string(),
    })?;
    *spent = builder.total;
    if let Some(f) = builder.fatal {
        return Err(f);
    }
    Ok((builder.root, builder.problems))
}

enum Frame {
    Seq {
        items: Vec<Node>,
        mark: Mark,
        anchor: usize,
        /// This collection's weight, itself included.
        size: Size,
    },
    Map {
        entries: Vec<(Node, Node)>,
        key: Option<Node>,
        mark: Mark,
        anchor: usize,
        size: Size,
    },
}

struct Builder {
    file: FileId,
    stack: Vec<Frame>,
    /// Anchored nodes and how many nodes each holds.
    anchors: HashMap<usize, (Node, Size)>,
    root: Option<Node>,
    problems: Vec<YamlError>,
    /// The document so far, alias copies included.
    total: Size,
    /// A limit was crossed: the rest of the document is ignored.
    fatal: Option<YamlError>,
}

impl Builder {
    fn mark(&self, span: &Span) -> Mark {
        Mark {
            file: self.file,
            line: span.start.line() as u32,
            col: span.start.col() as u32 + 1,
        }
    }

    /// Counts `n` more; false (and the document abandoned) past a limit.
    fn grow(&mut self, n: Size, mark: Mark, alias: bool) -> bool {
        self.total += n;
        if self.total.nodes <= MAX_NODES && self.total.bytes <= MAX_TEXT {
            return true;
        }
        let what = if self.total.nodes > MAX_NODES { format!("{MAX_NODES} nodes") } else { format!("{} MiB of text", MAX_TEXT >> 20) };
        let message = if alias {
            format!("this alias expands the document past {what} (an alias copies its anchor's whole tree); use fewer or smaller aliases")
        } else {
            format!("the document holds more than {what}; split the pipeline")
        };
        self.fatal = Some(YamlError { mark, message });
        false
    }

    fn complete(&mut self, node: Node, anchor: usize, size: Size) {
        // An anchor keeps a copy of its tree: that copy counts too.
        if anchor != 0 && self.grow(size, node.mark, false) {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Frame::Seq { items, size: s, .. }) => {
                *s += size;
                items.push(node);
            }
            Some(Frame::Map { entries, key, size: s, .. }) => {
                *s += size;
                match key.take() {
                    None => *key = Some(node),
                    Some(k) => entries.push((k, node)),
                }
            }
        }
    }

    /// Applies `<<` merge keys (explicit keys win, earlier merge sources win
    /// over later ones) and reports duplicate keys.
    fn finish_map(&mut self, entries: Vec<(Node, Node)>) -> Vec<(Node, Node)> {
        let is_merge = |k: &Node| matches!(&k.kind, NodeKind::Scalar(s) if s.plain && s.text == "<<");
        let has_merge = entries.iter().any(|(k, _)| is_merge(k));
        let mut out: Vec<(Node, Node)> = Vec::with_capacity(entries.len());
        let explicit: HashSet<String> = entries
            .iter()
            .filter(|(k, _)| !is_merge(k))
            .filter_map(|(k, _)| k.as_str().map(str::to_string))
            .collect();
        // Key → index in `out`, for duplicate reports.
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (k, v) in entries {
            if has_merge && is_merge(&k) {
                let sources: Vec<Node> = match v.kind {
                    NodeKind::Map(_) => vec![v],
                    NodeKind::Seq(items) => items,
                    _ => {
                        self.problems.push(YamlError {
                            mark: v.mark,
                            message: "a << merge key needs a mapping or a list of mappings".into(),
                        });
                        continue;
                    }
                };
                for src in sources {
                    let NodeKind::Map(src_entries) = src.kind else {
                        self.problems.push(YamlError {
                            mark: src.mark,
                            message: "a << merge key needs a mapping or a list of mappings".into(),
                        });
                        continue;
                    };
                    for (mk, mv) in src_entries {
                        let name = mk.as_str().unwrap_or_default().to_string();
                        if explicit.contains(&name) || seen.contains_key(&name) {
                            continue;
                        }
                        seen.insert(name, out.len());
                        out.push((mk, mv));
                    }
                }
                continue;
            }
            if let Some(name) = k.as_str() {
                // Merged keys never collide here: explicit keys are skipped when merging.
                if let Some(&first) = seen.get(name) {
                    let line = out.get(first).map(|(ok, _)| ok.mark.line).unwrap_or(0);
                    self.problems.push(YamlError {
                        mark: k.mark,
                        message: format!("duplicate key \"{name}\" (first set on line {line})"),
                    });
                    continue;
                }
                seen.insert(name.to_string(), out.len());
            }
            out.push((k, v));
        }
        out
    }

    /// Opens a collection, unless that nests too deep.
    fn open(&mut self, frame: Frame, mark: Mark) {
        if self.stack.len() >= MAX_DEPTH {
            self.fatal = Some(YamlError {
                mark,
                message: format!("mappings and lists nest more than {MAX_DEPTH} levels deep here; flatten the document"),
            });
            return;
        }
        if self.grow(ONE, mark, false) {
            self.stack.push(frame);
        }
    }
}

impl<'input> SpannedEventReceiver<'input> for Builder {
    fn on_event(&mut self, ev: Event<'input>, span: Span) {
        if self.fatal.is_some() {
            return;
        }
        let mark = self.mark(&span);
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let size = Size { nodes: 1, bytes: text.len() };
                if !self.grow(size, mark, false) {
                    return;
                }
                let node = Node {
                    kind: NodeKind::Scalar(Scalar {
                        text: text.into_owned(),
                        plain: style == ScalarStyle::Plain,
                        tagged: tag.is_some(),
                    }),
                    mark,
                };
                self.complete(node, anchor, size);
            }
            Event::SequenceStart(anchor, _) => self.open(
                Frame::Seq {
                    items: Vec::new(),
                    mark,
                    anchor,
                    size: ONE,
                },
                mark,
            ),
            Event::MappingStart(anchor, _) => self.open(
                Frame::Map {
                    entries: Vec::new(),
                    key: None,
                    mark,
                    anchor,
                    size: ONE,
                },
                mark,
            ),
            Event::SequenceEnd => {
                if let Some(Frame::Seq { items, mark, anchor, size }) = self.stack.pop() {
                    self.complete(
                        Node {
                            kind: NodeKind::Seq(items),
                            mark,
                        },
                        anchor,
                        size,
                    );
                }
            }
            Event::MappingEnd => {
                if let Some(Frame::Map {
                    entries,
                    mark,
                    anchor,
                    size,
                    ..
                }) = self.stack.pop()
                {
                    let entries = self.finish_map(entries);
                    self.complete(
                        Node {
                            kind: NodeKind::Map(entries),
                            mark,
                        },
                        anchor,
                        size,
                    );
                }
            }
            Event::Alias(id) => {
                let size = self.anchors.get(&id).map(|(_, size)| *size);
                // Counted before the copy is made.
                if size.is_some_and(|size| !self.grow(size, mark, true)) {
                    return;
                }
                let (node, size) = match self.anchors.get(&id) {
                    Some((n, size)) => (n.clone(), *size),
                    None => {
                        self.problems.push(YamlError {
                            mark,
                            message: "alias names an unknown anchor".into(),
                        });
                        let n = Node {
                            kind: NodeKind::Scalar(Scalar {
                                text: String::new(),
                                plain: true,
                                tagged: false,
                            }),
                            mark,
                        };
                        (n, ONE)
                    }
                };
                self.complete(node, 0, size);
            }
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart(_)
            | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Node {
        let (n, problems) = parse(s, 0).unwrap();
        assert!(problems.is_empty(), "{problems:?}");
        n.unwrap()
    }

    #[test]
    fn marks_are_one_based() {
        let n = p("a: 1\nb:\n  c: x\n");
        let b = n.get("b").unwrap();
        let (k, _) = &b.entries().unwrap()[0];
        assert_eq!((k.mark.line, k.mark.col), (3, 3));
    }

    #[test]
    fn anchors_aliases_and_merge_keys() {
        let n = p("base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\nlist: [*b]\n");
        let u = n.get("use").unwrap();
        assert_eq!(u.get("x").unwrap().as_str(), Some("1"));
        assert_eq!(u.get("y").unwrap().as_str(), Some("3"));
        assert_eq!(u.entries().unwrap().len(), 2);
        assert!(matches!(&n.get("list").unwrap().kind, NodeKind::Seq(v) if v.len() == 1));
    }

    #[test]
    fn duplicate_keys_are_reported() {
        let (_, problems) = parse("a: 1\na: 2\n", 0).unwrap();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("duplicate key \"a\""));
        assert_eq!(problems[0].mark.line, 2);
    }

    #[test]
    fn plain_scalars_resolve_by_core_schema() {
        assert_eq!(resolve_plain("~"), Resolved::Null);
        assert_eq!(resolve_plain("true"), Resolved::Bool(true));
        assert_eq!(resolve_plain("-12"), Resolved::Int(-12));
        assert_eq!(resolve_plain("1.25"), Resolved::Float(1.25));
        assert_eq!(resolve_plain("1.2.3"), Resolved::Str);
        assert_eq!(resolve_plain("30s"), Resolved::Str);
        assert_eq!(resolve_plain("yes"), Resolved::Str);
    }

    #[test]
    fn nesting_past_the_limit_is_an_error_in_block_and_flow_style() {
        let flow = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        let e = parse(&flow, 0).unwrap_err();
        assert!(e.message.contains("nest more than"), "{e:?}");
        assert_eq!((e.mark.line, e.mark.col), (1, MAX_DEPTH as u32 + 1));
        let mut block = String::new();
        for i in 0..=MAX_DEPTH {
            block.push_str(&format!("{}k{i}:\n", "  ".repeat(i)));
        }
        let e = parse(&block, 0).unwrap_err();
        assert!(e.message.contains("nest more than"), "{e:?}");
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(&ok, 0).is_ok(), "at the limit is fine");
    }

    #[test]
    fn an_alias_bomb_is_refused_before_it_is_expanded() {
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            doc.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        let e = parse(&doc, 0).unwrap_err();
        assert!(e.message.contains("alias expands the document past"), "{e:?}");
        // Text counts too: one large scalar copied many times.
        let big = "y".repeat(1 << 20);
        let mut doc = format!("a: &a {big}\nb: [");
        doc.push_str(&vec!["*a"; 100].join(", "));
        doc.push_str("]\n");
        let e = parse(&doc, 0).unwrap_err();
        assert!(e.message.contains("MiB of text"), "{e:?}");
    }

    #[test]
    fn anchored_copies_and_several_documents_count_together() {
        // Each anchor keeps a copy of its tree: nested anchors around a large
        // list hold as many copies as there are anchors.
        let mut doc = format!("[{}]", vec!["x"; 10_000].join(", "));
        for i in 0..100 {
            doc = format!("[&a{i} {doc}]");
        }
        let e = parse(&doc, 0).unwrap_err();
        assert!(e.message.contains("more than"), "{e:?}");
        // A pipeline and its includes share one allowance.
        let part = format!("[{}]", vec!["x"; MAX_NODES / 3].join(","));
        let mut spent = Size::default();
        assert!(parse_within(&part, 0, &mut spent).is_ok());
        assert!(parse_within(&part, 1, &mut spent).is_ok());
        assert!(parse_within(&part, 2, &mut spent).is_err(), "the third third crosses the pipeline's allowance");
    }

    #[test]
    fn a_wide_mapping_parses_in_linear_time() {
        // Quadratic duplicate detection would take minutes here.
        let mut doc = String::new();
        for i in 0..200_000 {
            doc.push_str(&format!("k{i}: v\n"));
        }
        doc.push_str("k7: again\n");
        let (n, problems) = parse(&doc, 0).unwrap();
        assert_eq!(n.unwrap().entries().unwrap().len(), 200_000);
        assert_eq!(problems.len(), 1);
        assert!(problems[0].message.contains("duplicate key \"k7\" (first set on line 8)"), "{problems:?}");
    }

    #[test]
    fn syntax_errors_carry_a_position() {
        let e = parse("a: [1, 2\nb: 3\n", 0).unwrap_err();
        assert!(e.mark.line >= 1);
    }
}
