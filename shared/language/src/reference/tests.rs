use std::path::PathBuf;

use super::schema_view::{yaml, View};
use super::*;

fn reference_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference.md")
}

/// docs/reference.md is what `markdown()` renders; `UPDATE_REFERENCE=1` rewrites it.
#[test]
fn reference_md_is_up_to_date() {
    let want = markdown();
    let path = reference_path();
    if std::env::var_os("UPDATE_REFERENCE").is_some() {
        std::fs::write(&path, &want).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    if have != want {
        let line = have.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/reference.md is not what the model renders (first difference at line {}):\n  file:      {:?}\n  generated: {:?}\nrun `UPDATE_REFERENCE=1 cargo test -p steppe-language reference` to rewrite it",
            line + 1,
            have.lines().nth(line).unwrap_or("<end of file>"),
            want.lines().nth(line).unwrap_or("<end of file>"),
        );
    }
}

/// Every step key could be put on a sample step of each kind, so each row
/// of the step tables says what the placement table says.
#[test]
fn every_step_key_is_placed_by_the_table() {
    let view = View::new();
    let step = view.def("Step").expect("Step is in the schema");
    let keys: Vec<&str> = view.props(step).into_iter().map(|(k, _)| k).collect();
    assert!(keys.len() > 50, "the step's keys were read: {keys:?}");
    let unplaced: Vec<&str> = keys.iter().copied().filter(|k| view.placement(k).is_none()).collect();
    assert!(unplaced.is_empty(), "no sample step could carry these keys (give them a #[schemars(example)]): {unplaced:?}");
    assert!(!markdown().contains("Placement not determined"));
}

/// The reference reads the table, not a copy of it.
#[test]
fn placement_comes_from_the_table() {
    use StepKind::*;
    let view = View::new();
    let takes = |key: &str| view.placement(key).map(|(t, _)| t).unwrap_or_default();
    assert_eq!(takes("trigger"), vec![Get]);
    assert_eq!(takes("params"), vec![Get, Put]);
    assert_eq!(takes("run_file"), vec![Task]);
    assert_eq!(takes("prompt_file"), vec![Agent]);
    assert_eq!(takes("outputs"), vec![Task, Agent]);
    assert_eq!(takes("file"), vec![LoadVar]);
    assert_eq!(takes("ensure"), StepKind::ALL.to_vec());
    let (none, said) = view.placement("max_in_flight").unwrap_or_default();
    assert!(none.is_empty());
    assert_eq!(said, vec!["max_in_flight is only valid on an across: step".to_string()]);
}

/// Every ```yaml block of the reference is a whole pipeline that loads
/// (tests/docs_examples.rs runs them through `steppe validate` too).
#[test]
fn yaml_blocks_in_the_reference_load() {
    let text = markdown();
    let dir = std::env::temp_dir();
    let mut block: Option<String> = None;
    let mut n = 0;
    for line in text.lines() {
        match &mut block {
            None if line.trim_start() == "```yaml" => block = Some(String::new()),
            Some(body) if line.trim_start() == "```" => {
                n += 1;
                if let Err(e) = crate::load_str(body, &dir.join("reference.yml"), &crate::LoadOptions::default()) {
                    panic!("a yaml block of the reference does not load:\n{body}\n{e}");
                }
                block = None;
            }
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    assert!(block.is_none(), "an unclosed ```yaml block");
    let _ = n;
}

#[test]
fn values_render_as_yaml_flow() {
    let v = serde_json::json!({"a": ["linux", "0", "x y", "@claude/sonnet", true, 3], "b c": {"k": "v: w"}});
    assert_eq!(yaml(&v), r#"{a: [linux, "0", x y, "@claude/sonnet", true, 3], b c: {k: "v: w"}}"#);
}

#[test]
fn headings_link_as_github_makes_them() {
    assert_eq!(anchor("How run: runs"), "how-run-runs");
    assert_eq!(anchor("Built-in tools, profiles and providers"), "built-in-tools-profiles-and-providers");
    assert_eq!(anchor("The scripted model's when:"), "the-scripted-models-when");
}
