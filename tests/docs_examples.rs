//! Every ```yaml example in docs/ is a test: it goes through the real
//! `steppe validate --syntax-only`. An example whose first lines are
//! `# expect: <fragment>` must be rejected with each fragment in the output;
//! every other example must be accepted. An example marked `# test: passes`
//! is also run with `steppe test` and must pass.
//!
//! Every ```console block is a transcript: each `$ steppe …` line is run
//! (in one directory per doc, holding the doc's examples whose leading
//! comments say `# file: NAME`, blocks in order) and must print the lines under it —
//! durations, dates and run ids aside; a line `…` stands for any lines.

mod common;

use std::process::Command;

use common::repo;

fn examples() -> Vec<(String, usize, String)> {
    blocks("yaml")
}

/// Every block fenced as ```LANG in docs/*.md: (doc, first line, body).
fn blocks(lang: &str) -> Vec<(String, usize, String)> {
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
                None if line.trim_start().strip_prefix("```") == Some(lang) => block = Some((i + 1, String::new())),
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

/// What may differ from one run to the next: durations, dates, run ids
/// (and so the widths of columns).
fn normalized(line: &str) -> String {
    let dur = regex::Regex::new(r"\b\d+(\.\d+)?(ns|µs|ms|s|m|h)(\d+(\.\d+)?(ns|µs|ms|s|m|h))*\b").expect("regex");
    let date = regex::Regex::new(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2})?").expect("regex");
    let run = regex::Regex::new(r"\br-[0-9a-z][0-9a-z-]*").expect("regex");
    let line = run.replace_all(line, "r-ID");
    let line = date.replace_all(&line, "DATE");
    // Columns widen with their values: spacing is not compared.
    dur.replace_all(&line, "T").split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `got` holds `want` in order, `…` lines standing for any lines.
fn transcript_matches(want: &[String], got: &[String]) -> bool {
    match want.split_first() {
        None => got.is_empty(),
        Some((w, rest)) if w == "…" => (0..=got.len()).any(|i| transcript_matches(rest, &got[i..])),
        Some((w, rest)) => got.first().is_some_and(|g| g == w) && transcript_matches(rest, &got[1..]),
    }
}

#[test]
fn doc_transcripts_show_what_the_binary_prints() {
    let consoles = blocks("console");
    assert!(consoles.len() >= 3, "expected console transcripts in docs/, found {}", consoles.len());
    let root = std::env::temp_dir().join(format!("steppe-docs-console-{}", std::process::id()));
    let mut failures = Vec::new();
    for (doc, line, body) in &consoles {
        let dir = root.join(doc);
        if !dir.exists() {
            std::fs::create_dir_all(&dir).expect("mkdir");
            for (d, _, yaml) in examples().iter().filter(|(d, _, _)| d == doc) {
                if let Some(name) = yaml.lines().take_while(|l| l.starts_with('#')).find_map(|l| l.strip_prefix("# file:")).map(str::trim) {
                    std::fs::write(dir.join(name), yaml).unwrap_or_else(|e| panic!("{d}: writing {name}: {e}"));
                }
            }
        }
        // Each command and the lines it is shown to print.
        let mut commands: Vec<(String, Vec<String>)> = Vec::new();
        for l in body.lines() {
            match l.strip_prefix("$ ") {
                Some(cmd) => commands.push((cmd.to_string(), Vec::new())),
                None => match commands.last_mut() {
                    Some((_, want)) => want.push(normalized(l)),
                    None => failures.push(format!("{doc}:{line}: a transcript starts with `$ steppe …`")),
                },
            }
        }
        for (cmd, want) in commands {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            assert_eq!(words.first(), Some(&"steppe"), "{doc}:{line}: only steppe commands are run: {cmd}");
            let out = Command::new(env!("CARGO_BIN_EXE_steppe")).args(&words[1..]).current_dir(&dir).env_remove("STEPPE_MODEL").env("NO_COLOR", "1").output().expect("run steppe");
            let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let got: Vec<String> = text.lines().map(normalized).collect();
            let mut want = want;
            while want.last().is_some_and(|w| w.is_empty()) {
                want.pop();
            }
            if !transcript_matches(&want, &got) {
                failures.push(format!("{doc}:{line}: `{cmd}` printed\n{}\n--- the doc shows (normalized) ---\n{}", text.trim_end(), want.join("\n")));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&root);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn transcripts_match_in_order_with_gaps() {
    let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert!(transcript_matches(&v(&["a", "…", "d"]), &v(&["a", "b", "c", "d"])));
    assert!(transcript_matches(&v(&["…"]), &v(&[])));
    assert!(!transcript_matches(&v(&["a", "d"]), &v(&["a", "b", "d"])));
    assert!(!transcript_matches(&v(&["a"]), &v(&["a", "b"])), "a transcript shows every line unless it says …");
    assert_eq!(normalized("✔ greet (0.01s) r-18c2f0a9-3 1m4s 2026-12-01 11:40"), "✔ greet (T) r-ID T DATE");
    assert_eq!(normalized("hello      2  12ms  r-1a2333ead30-1242-0  "), normalized("hello 2      6ms r-1a2333ead18-1228-0"));
}
