//! The loader against documents nobody meant to write: corpus pipelines
//! mutated byte by byte and structure by structure, and YAML trees generated
//! from the language's own keys, anchors and aliases included. Every one must
//! end in a loaded pipeline or positioned diagnostics, on a thread with the
//! stack a tokio worker has (2 MiB): never a panic, never a stack overflow.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use steppe_language::{load_str, LoadOptions};

fn corpus() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/validate");
    let mut out = Vec::new();
    for kind in ["valid", "invalid"] {
        let Ok(rd) = std::fs::read_dir(root.join(kind)) else { continue };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "yml")).collect();
        files.sort();
        for f in files {
            if let Ok(t) = std::fs::read_to_string(&f) {
                out.push((f, t));
            }
        }
    }
    assert!(out.len() > 100, "the corpus under tests/validate is missing");
    out
}

/// Loads `text` as if it were `path` on a 2 MiB stack; the loader's verdict
/// must be a pipeline or positioned diagnostics.
fn check(path: &Path, text: String) -> Result<(), TestCaseError> {
    let path = path.to_path_buf();
    let shown = text.chars().take(400).collect::<String>();
    let outcome = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || std::panic::catch_unwind(|| load_str(&text, &path, &LoadOptions::default()).map(|_| ()).map_err(|d| d.0)))
        .expect("spawn")
        .join()
        .expect("the loader thread");
    match outcome {
        Err(_) => Err(TestCaseError::fail(format!("the loader panicked on:\n{shown}"))),
        Ok(Ok(())) => Ok(()),
        Ok(Err(diags)) => {
            prop_assert!(!diags.is_empty(), "an error with no diagnostics on:\n{shown}");
            for d in &diags {
                prop_assert!(!d.message.trim().is_empty(), "an empty message on:\n{shown}");
                let whole_file = d.message.contains("empty") || d.message.contains("((vars))") || d.message.starts_with("cannot read");
                prop_assert!(d.line > 0 || whole_file, "an unpositioned diagnostic {d} on:\n{shown}");
            }
            Ok(())
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    FlipByte(usize, u8),
    Delete(usize, usize),
    Insert(usize, &'static str),
    Duplicate(usize, usize),
    Swap(usize, usize),
}

const FRAGMENTS: &[&str] = &[
    "[", "]", "{", "}", ":", "- ", "\n", "\n  ", "\t", "&a ", "*a", "<<: *a\n", "!!str ", "|\n", ">-\n", "'", "\"", "#",
    "((v))", "\u{0}", "é", "---\n", "...\n", "? ", ",", "&b [*a, *a, *a]", "do:\n- do:\n  - ", "{{ .vars.x }}",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(p, b)| Mutation::FlipByte(p, b)),
        (any::<usize>(), 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        (any::<usize>(), prop::sample::select(FRAGMENTS)).prop_map(|(p, f)| Mutation::Insert(p, f)),
        (any::<usize>(), 1usize..200).prop_map(|(p, n)| Mutation::Duplicate(p, n)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::Swap(a, b)),
    ]
}

fn apply(text: &str, ms: &[Mutation]) -> String {
    let mut b = text.as_bytes().to_vec();
    for m in ms {
        let len = b.len().max(1);
        match *m {
            Mutation::FlipByte(p, x) => {
                if !b.is_empty() {
                    b[p % len] = x;
                }
            }
            Mutation::Delete(p, n) => {
                let s = p % len;
                let e = (s + n).min(b.len());
                if s < e {
                    b.drain(s..e);
                }
            }
            Mutation::Insert(p, f) => {
                let at = (p % len).min(b.len());
                b.splice(at..at, f.bytes());
            }
            Mutation::Duplicate(p, n) => {
                let s = (p % len).min(b.len());
                let e = (s + n).min(b.len());
                let chunk = b[s..e].to_vec();
                b.splice(e..e, chunk);
            }
            Mutation::Swap(x, y) => {
                if !b.is_empty() {
                    b.swap(x % len, y % len);
                }
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// A YAML tree drawn from the language's own vocabulary.
#[derive(Debug, Clone)]
enum Tree {
    Scalar(&'static str),
    Seq(Vec<Tree>),
    Map(Vec<(&'static str, Tree)>),
    Anchored(&'static str, Box<Tree>),
    Alias(&'static str),
}

const KEYS: &[&str] = &[
    "jobs", "name", "plan", "task", "run", "do", "try", "in_parallel", "race", "steps", "across", "var", "values", "agent", "agents",
    "prompt", "messages", "tools", "resources", "resource_types", "type", "source", "get", "put", "inputs", "outputs", "on_success",
    "on_failure", "ensure", "attempts", "timeout", "when", "to", "verdicts", "ensemble", "fix", "assert", "execution", "file",
    "run_file", "config", "check", "tasks", "defaults", "model", "max_in_flight", "load_var", "<<",
];
const SCALARS: &[&str] = &["echo hi", "true", "3", "1m", "~", "\"\"", "a", "../x", "/etc/passwd", "{}", "[]", "ollama/llama3", "- x"];
const ANCHORS: &[&str] = &["a", "b", "c"];

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = prop_oneof![
        prop::sample::select(SCALARS).prop_map(Tree::Scalar),
        prop::sample::select(ANCHORS).prop_map(Tree::Alias),
    ];
    leaf.prop_recursive(12, 400, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Tree::Seq),
            prop::collection::vec((prop::sample::select(KEYS), inner.clone()), 0..6).prop_map(Tree::Map),
            (prop::sample::select(ANCHORS), inner).prop_map(|(a, t)| Tree::Anchored(a, Box::new(t))),
        ]
    })
}

fn render(t: &Tree, out: &mut String) {
    match t {
        Tree::Scalar(s) => out.push_str(s),
        Tree::Alias(a) => {
            out.push('*');
            out.push_str(a);
        }
        Tree::Anchored(a, inner) => {
            out.push('&');
            out.push_str(a);
            out.push(' ');
            render(inner, out);
        }
        Tree::Seq(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                render(x, out);
            }
            out.push(']');
        }
        Tree::Map(entries) => {
            out.push('{');
            for (i, (k, v)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(k);
                out.push_str(": ");
                render(v, out);
            }
            out.push('}');
        }
    }
}

/// A generated tree as a pipeline: under `jobs:` most of the time, so the
/// decoder and the rules see it, not only the parser.
fn as_pipeline(t: &Tree, wrap: bool) -> String {
    let mut body = String::new();
    render(t, &mut body);
    if wrap {
        format!("jobs:\n- name: j\n  plan:\n  - do: [{body}]\n")
    } else {
        body
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_corpus_pipelines_load_or_are_positioned(pick in any::<prop::sample::Index>(), ms in prop::collection::vec(mutation(), 1..8)) {
        let files = corpus();
        let (path, text) = &files[pick.index(files.len())];
        check(path, apply(text, &ms))?;
    }

    #[test]
    fn generated_documents_load_or_are_positioned(t in tree(), wrap in any::<bool>()) {
        check(Path::new("generated.yml"), as_pipeline(&t, wrap))?;
    }
}

#[test]
fn hostile_shapes_end_in_positioned_errors() {
    let depth = steppe_language::yaml::MAX_DEPTH;
    let mut nested_plan = String::from("jobs:\n- name: j\n  plan:\n");
    for i in 0..depth {
        nested_plan.push_str(&format!("{}- do:\n", "  ".repeat(i + 1)));
    }
    let cases: Vec<(&str, String)> = vec![
        ("flow brackets", "[".repeat(1_000_000)),
        ("flow maps", "{a: ".repeat(100_000)),
        ("nested do blocks", nested_plan),
        ("alias bomb", {
            let mut d = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
            for i in 1..10 {
                d.push_str(&format!("a{i}: &a{i} [{}]\n", vec![format!("*a{}", i - 1); 9].join(", ")));
            }
            d + "jobs: []\n"
        }),
        ("merge bomb", {
            let mut d = String::from("x0: &x0 {k: v}\n");
            for i in 1..40 {
                d.push_str(&format!("x{i}: &x{i}\n  <<: [*x{p}, *x{p}]\n  k{i}: v\n", p = i - 1));
            }
            d
        }),
    ];
    for (what, text) in cases {
        check(Path::new(what), text).unwrap_or_else(|e| panic!("{what}: {e}"));
    }
}

#[test]
fn a_pipeline_nested_near_the_limit_loads_on_a_small_stack() {
    // Each step level is two YAML levels (a list, then the step's mapping).
    let levels = (steppe_language::yaml::MAX_DEPTH - 6) / 2;
    let mut text = String::from("jobs:\n- name: j\n  plan:\n");
    for i in 0..levels {
        text.push_str(&format!("{}- do:\n", "  ".repeat(i + 1)));
    }
    text.push_str(&format!("{}- task: leaf\n{}  run: echo\n", "  ".repeat(levels + 1), "  ".repeat(levels + 1)));
    let r = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || load_str(&text, Path::new("deep.yml"), &LoadOptions::default()).map(|_| ()).map_err(|d| d.to_string()))
        .expect("spawn")
        .join()
        .expect("no stack overflow");
    assert!(r.is_ok(), "{r:?}");
}
