//! Runs the corpus under tests/validate/ through the real `steppe validate` binary.
//!
//! - every `valid/*.yml` must exit 0 and print `ok:`;
//! - every `invalid/*.yml` carries `# expect: <fragment>` lines and must exit 2
//!   with each fragment somewhere in its output.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::files_in;

fn corpus(kind: &str) -> Vec<PathBuf> {
    files_in(&format!("tests/validate/{kind}"), &["yml", "yaml"])
}

fn validate(file: &Path) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .arg("validate")
        .arg("--syntax-only")
        .arg(file.file_name().expect("file name"))
        .current_dir(file.parent().expect("parent"))
        .env_remove("STEPPE_MODEL").env_remove("STEPS_MODEL")
        .output()
        .expect("run steppe");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn valid_pipelines_are_accepted() {
    let mut failures = Vec::new();
    let files = corpus("valid");
    for f in &files {
        let (code, out) = validate(f);
        if code != 0 || !out.contains("ok: ") {
            failures.push(format!("{} (exit {code}):\n{out}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{} of {} valid pipelines rejected:\n{}", failures.len(), files.len(), failures.join("\n"));
}

#[test]
fn invalid_pipelines_are_rejected_with_their_message() {
    let mut failures = Vec::new();
    let files = corpus("invalid");
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        let expects: Vec<&str> = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("# expect:"))
            .map(str::trim)
            .collect();
        if expects.is_empty() {
            failures.push(format!("{}: no `# expect:` line", f.display()));
            continue;
        }
        let (code, out) = validate(f);
        if code != 2 {
            failures.push(format!("{} exited {code}, want 2:\n{out}", f.display()));
            continue;
        }
        for e in expects {
            if !out.contains(e) {
                failures.push(format!("{}: output lacks {e:?}:\n{out}", f.display()));
            }
        }
        // Every problem names file, line and column.
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !out.lines().any(|l| l.starts_with(&format!("{name}:"))) {
            failures.push(format!("{}: no `{name}:line:col:` position in:\n{out}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{} of {} invalid pipelines mishandled:\n{}", failures.len(), files.len(), failures.join("\n"));
}
