//! Where everything is (`SourceMap`: key path → position) and the positioned
//! problems and warnings of one load (`Report`).

use std::collections::HashMap;

use crate::source::{Diagnostic, Mark, SourceFiles};
use crate::yaml::{Node, NodeKind};

/// Key path → position, for every key and list item of the loaded document.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    marks: HashMap<String, Mark>,
}

impl SourceMap {
    pub fn build(root: &Node) -> Self {
        let mut marks = HashMap::new();
        marks.insert(String::new(), root.mark);
        fn walk(n: &Node, path: &str, marks: &mut HashMap<String, Mark>) {
            match &n.kind {
                NodeKind::Map(entries) => {
                    for (k, v) in entries {
                        let key = k.as_str().unwrap_or_default();
                        let p = if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
                        marks.insert(p.clone(), k.mark);
                        walk(v, &p, marks);
                    }
                }
                NodeKind::Seq(items) => {
                    for (i, v) in items.iter().enumerate() {
                        let p = format!("{path}[{i}]");
                        marks.insert(p.clone(), v.mark);
                        walk(v, &p, marks);
                    }
                }
                NodeKind::Scalar(_) => {}
            }
        }
        walk(root, "", &mut marks);
        SourceMap { marks }
    }

    /// Whether the document itself holds `path` (what a load added, such as
    /// an unshadowed built-in, has no position).
    pub fn contains(&self, path: &str) -> bool {
        self.marks.contains_key(path)
    }

    /// The position of `path`, or of its nearest ancestor that has one.
    pub fn lookup(&self, path: &str) -> Mark {
        let mut p = path;
        loop {
            if let Some(m) = self.marks.get(p) {
                return *m;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return self.marks.get("").copied().unwrap_or_default(),
            }
        }
    }
}

/// Collects positioned diagnostics for one load: problems, and warnings
/// (which do not stop it).
pub struct Report<'a> {
    pub files: &'a SourceFiles,
    pub map: &'a SourceMap,
    pub diags: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

impl<'a> Report<'a> {
    pub fn new(files: &'a SourceFiles, map: &'a SourceMap) -> Self {
        Report { files, map, diags: Vec::new(), warnings: Vec::new() }
    }

    /// A warning at `path`: the message says what is not done.
    pub fn warn(&mut self, path: &str, message: impl Into<String>) {
        let mark = self.map.lookup(path);
        self.warnings.push(Diagnostic {
            file: self.files.path(mark.file).to_path_buf(),
            line: mark.line,
            col: mark.col,
            path: path.to_string(),
            message: format!("warning: {}", message.into()),
        });
    }

    pub fn at_mark(&mut self, mark: Mark, path: &str, message: impl Into<String>) {
        self.diags.push(Diagnostic {
            file: self.files.path(mark.file).to_path_buf(),
            line: mark.line,
            col: mark.col,
            path: path.to_string(),
            message: message.into(),
        });
    }

    pub fn err(&mut self, path: &str, message: impl Into<String>) {
        let mark = self.map.lookup(path);
        self.at_mark(mark, path, message);
    }
}
