//! The layout ARCHITECTURE.md promises, read from the code: no source file
//! over 700 lines, and no two files that import each other, however far
//! round (a module may use its own children and they it; anything else that
//! loops is a cycle).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use common::repo;

/// The crates whose files are checked: (name in paths, source directory).
const CRATES: &[(&str, &str)] = &[
    ("steppe_language", "shared/language/src"),
    ("steppe_runtime", "shared/runtime/src"),
    ("steppe_proto", "proto/src"),
    ("steppe_worker", "worker/src"),
    ("steppe_coordinator", "coordinator/src"),
    ("steppe_gate", "shared/gate/src"),
    ("steppe_cloud", "shared/cloud/src"),
];

const MAX_LINES: usize = 700;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_source_file_is_over_700_lines() {
    let mut files = Vec::new();
    for dir in ["shared", "proto", "worker", "coordinator", "tests"] {
        rust_files(&repo(dir), &mut files);
    }
    assert!(files.len() > 50, "the sources were found");
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split these by concept (at most {MAX_LINES} lines a file): {long:#?}");
}

/// A module of a crate: its crate and path (`["engine", "plan"]`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
struct Module {
    krate: &'static str,
    path: Vec<String>,
}

impl std::fmt::Display for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}::{}", self.krate, if self.path.is_empty() { "(root)".to_string() } else { self.path.join("::") })
    }
}

fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut m = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).expect("under src").with_extension("");
        let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let last = parts.last().cloned().unwrap_or_default();
        if last == "main" && parts.len() == 1 {
            continue; // the binary: nothing imports it
        }
        if matches!(last.as_str(), "mod" | "lib") {
            parts.pop();
        }
        m.insert(parts, f);
    }
    m
}

/// `a::{b, c::{d}}` → `a::b`, `a::c::d`.
fn expand_use(body: &str) -> Vec<String> {
    let body = body.trim();
    let Some(open) = body.find('{') else { return vec![body.to_string()] };
    let prefix = &body[..open];
    let inner = &body[open + 1..body.rfind('}').unwrap_or(body.len())];
    let (mut parts, mut depth, mut cur) = (Vec::new(), 0, String::new());
    for ch in inner.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    parts.push(cur);
    parts.iter().filter(|p| !p.trim().is_empty()).flat_map(|p| expand_use(p)).map(|p| format!("{prefix}{p}")).collect()
}

/// The code of a file that counts: comments and its test module left out.
fn code_of(text: &str) -> String {
    let no_comments: String = text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
    let test_mod = regex::Regex::new(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod \w+ \{").expect("regex");
    match test_mod.find(&no_comments) {
        Some(m) => no_comments[..m.start()].to_string(),
        None => no_comments,
    }
}

/// Every file-to-file import of the workspace's crates.
fn imports() -> BTreeMap<Module, BTreeSet<Module>> {
    let use_re = regex::Regex::new(r"(?m)^\s*(pub(\([^)]*\))?\s+)?use\s+([^;]+);").expect("regex");
    let path_re = regex::Regex::new(r"(^|[^\w:])((?:[a-z_][a-z0-9_]*)(?:::\w+)+)").expect("regex");
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (krate, src) in CRATES {
        let mods = modules(&repo(src));
        for (path, file) in &mods {
            let text = code_of(&std::fs::read_to_string(file).expect("read"));
            let mut named: Vec<String> = Vec::new();
            // Re-exports (`pub use`) are a module's interface, not its use.
            for c in use_re.captures_iter(&text) {
                if c.get(1).is_none() {
                    named.extend(expand_use(&c[3]));
                }
            }
            let body = use_re.replace_all(&text, "");
            named.extend(path_re.captures_iter(&body).map(|c| c[2].to_string()));
            let here = Module { krate, path: path.clone() };
            for n in named {
                let segs: Vec<&str> = n.split(" as ").next().unwrap_or_default().split("::").map(str::trim).collect();
                let (mut base, rest): (Vec<String>, &[&str]) = match segs.first().copied() {
                    Some("crate") => (Vec::new(), &segs[1..]),
                    Some("self") => (path.clone(), &segs[1..]),
                    Some("super") => {
                        let mut b = path.clone();
                        b.pop();
                        let mut r = &segs[1..];
                        while r.first() == Some(&"super") {
                            b.pop();
                            r = &r[1..];
                        }
                        (b, r)
                    }
                    Some(first) => {
                        // Relative: a child module of this file's module.
                        let mut child = path.clone();
                        child.push(first.to_string());
                        if !mods.contains_key(&child) {
                            continue;
                        }
                        (path.clone(), &segs[..])
                    }
                    None => continue,
                };
                base.extend(rest.iter().map(|s| s.to_string()));
                let target = (0..=base.len()).rev().map(|k| base[..k].to_vec()).find(|p| mods.contains_key(p));
                let Some(target) = target else { continue };
                // A module may use its own descendants.
                if target.starts_with(path) {
                    continue;
                }
                edges.entry(here.clone()).or_default().insert(Module { krate, path: target });
            }
        }
    }
    edges
}

/// Strongly connected groups of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct T<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: HashMap<&'a Module, usize>,
        low: HashMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    impl<'a> T<'a> {
        fn visit(&mut self, v: &'a Module) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut group = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    group.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if group.len() > 1 {
                    self.out.push(group);
                }
            }
        }
    }
    let mut t = T { edges, index: HashMap::new(), low: HashMap::new(), stack: Vec::new(), on: BTreeSet::new(), next: 0, out: Vec::new() };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out
}

#[test]
fn no_two_files_import_each_other() {
    let edges = imports();
    assert!(edges.len() > 40, "imports were found: {}", edges.len());
    let found = cycles(&edges);
    let shown: Vec<String> = found
        .iter()
        .map(|g| {
            let members: BTreeSet<&Module> = g.iter().collect();
            let inner: Vec<String> = g.iter().flat_map(|a| edges[a].iter().filter(|b| members.contains(b)).map(move |b| format!("{a} → {b}"))).collect();
            inner.join(", ")
        })
        .collect();
    assert!(found.is_empty(), "files that import each other (move what both need into a file of its own): {shown:#?}");
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let m = |p: &str| Module { krate: "k", path: p.split("::").map(str::to_string).collect() };
    let mut edges = BTreeMap::new();
    edges.insert(m("a"), BTreeSet::from([m("b")]));
    edges.insert(m("b"), BTreeSet::from([m("c")]));
    edges.insert(m("c"), BTreeSet::from([m("a")]));
    edges.insert(m("d"), BTreeSet::from([m("a")]));
    let found = cycles(&edges);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].len(), 3);
    assert_eq!(expand_use("a::{b, c::{d, e as f}}"), ["a::b", "a::c::d", "a::c::e as f"]);
}
