//! Every ```yaml example in docs/ is a test: it goes through the real
//! `steppe validate --syntax-only`. An example whose first lines are
//! `# expect: <fragment>` must be rejected with each fragment in the output;
//! every other example must be accepted. An example marked `# test: passes`
//! is also run with `steppe test` and must pass.

mod common;

use std::process::Command;

use common::repo;

fn examples() -> Vec<(String, usize, String)> {
    let docs = repo("docs");
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&docs).expect("docs/").filter_map(|e| e.ok().map(|e| e.path())).collect();
    files.sort();
    for f in files.into_iter().filter(|p| p.extension().is_some_and(|x| x == "md")) {
        let text = std::fs::read_to_string(&f).expect("read doc");
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let mut block: Option<(usize, String)> = None;
        for (i, line) in text.lines().enumerate() {
            match &mut block {
                None if line.trim_start() == "```yaml" => block = Some((i + 1, String::new())),
                Some((start, body)) if line.trim_start() == "```" => {
                    out.push((name.clone(), *start, std::mem::take(body)));
                    block = None;
                }
                Some((_, body)) => {
                    body.push_str(line);
                    body.push('\n');
                }
                None => {}
            }
        }
    }
    out
}

#[test]
fn doc_examples_behave_as_documented() {
    let all = examples();
    assert!(all.len() >= 10, "expected the docs to hold examples, found {}", all.len());
    let dir = std::env::temp_dir().join(format!("steppe-docs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut failures = Vec::new();
    let mut ran = 0;
    for (doc, line, body) in &all {
        let dir = dir.join(format!("{doc}-{line}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let file = dir.join("example.yml");
        std::fs::write(&file, body).expect("write");
        let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
            .args(["validate", "--syntax-only", "example.yml"])
            .current_dir(&dir)
            .env_remove("STEPPE_MODEL").env_remove("STEPS_MODEL")
            .output()
            .expect("run steppe");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let expects: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("# expect:")).map(str::trim).collect();
        let code = out.status.code().unwrap_or(-1);
        if expects.is_empty() {
            if code != 0 {
                failures.push(format!("{doc}:{line}: documented as valid, rejected:\n{text}"));
            }
            if body.lines().any(|l| l.trim() == "# test: passes") {
                // The images an example names are the suite's own small image, tagged so.
                for name in body.lines().filter_map(|l| l.trim().strip_prefix("image:")).map(str::trim) {
                    let tagged = Command::new("docker").args(["tag", common::test_image(), name]).output().expect("docker tag");
                    assert!(tagged.status.success(), "{}", String::from_utf8_lossy(&tagged.stderr));
                }
                let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
                    .args(["test", "example.yml", "-q"])
                    .current_dir(&dir)
                    .env_remove("STEPPE_MODEL")
                    .output()
                    .expect("run steppe test");
                let t = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                if out.status.code() != Some(0) {
                    failures.push(format!("{doc}:{line}: documented to pass `steppe test`, exit {:?}:\n{t}", out.status.code()));
                }
                ran += 1;
            }
        } else if code != 2 {
            failures.push(format!("{doc}:{line}: documented as invalid, exit {code}:\n{text}"));
        } else {
            for e in expects.iter().filter(|e| !text.contains(*e)) {
                failures.push(format!("{doc}:{line}: output lacks {e:?}:\n{text}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(ran >= 6, "expected runnable examples in docs/, ran {ran}");
}
