//! `steppe gate` through the real binary: stepfiles served to the Python
//! `mcp` SDK's client over stdio and HTTP, every conformance case and the
//! repository's own replayed with their fixtures on loopback, the HTTP
//! server's refusals, and `--verify` telling an intact ledger from a
//! tampered one.

mod common;

use common::*;
use serde_json::json;

#[test]
fn verify_tells_an_intact_ledger_from_a_tampered_one() {
    let work = scratch("gate-verify");
    let mut l = steppe_gate::ledger::Ledger::create(&work.join("ledgers"), "shelf-audit", "0b5e").expect("ledger");
    for (kind, fields) in [
        ("run_started", json!({"identity": "sha256:00", "inputs": "sha256:11"})),
        ("step_started", json!({"step": "report"})),
        ("submit", json!({"step": "report", "attempt": 1, "output": {"sha256": "sha256:22", "length": 40}})),
        ("gate", json!({"step": "report", "attempt": 1, "gate": "names-all", "verdict": "pass", "diagnosis": null})),
        ("step_passed", json!({"step": "report", "attempt": 1})),
        ("run_finished", json!({"outcome": "passed"})),
    ] {
        l.record(kind, "2026-12-02T00:00:00Z", fields).expect("record");
    }
    let good = l.path().to_path_buf();
    let out = steppe(&["gate", "--verify", good.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("shelf-audit-0b5e.jsonl: intact, 6 records"), "{}", text(&out));

    let text_of = std::fs::read_to_string(&good).expect("read");
    let bad = work.join("tampered.jsonl");
    std::fs::write(&bad, text_of.replace("\"verdict\":\"pass\"", "\"verdict\":\"fail\"")).expect("write");
    let out = steppe(&["gate", "--verify", good.to_str().expect("path"), bad.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("tampered.jsonl: broken at seq 4"), "{}", text(&out));
    assert!(text(&out).contains("intact, 6 records"), "every file is reported: {}", text(&out));

    let missing = steppe(&["gate", "nowhere.yaml"], &work);
    assert_eq!(missing.status.code(), Some(2));
    assert!(text(&missing).contains("StepfileInvalid: nowhere.yaml: cannot read it"), "{}", text(&missing));
    std::fs::write(
        work.join("p.yaml"),
        "stepgate: \"1\"\nid: hello\ninputs: {type: object}\nsteps:\n  - id: greet\n    instructions: Say hello.\n    produces: {type: object, required: [text], properties: {text: {type: string}}}\n    gates: [{id: said, message: 'Say it:', predicate: {in: [hello, {var: output.text}]}}]\n",
    )
    .expect("write");
    let listed = steppe(&["gate", "--list", "p.yaml"], &work);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed));
    assert!(text(&listed).starts_with("hello") && text(&listed).contains("1 step(s)  sha256:"), "{}", text(&listed));
    std::fs::write(work.join("bad.yaml"), std::fs::read_to_string(work.join("p.yaml")).expect("read").replace("gates:", "gatez:")).expect("write");
    let bad = steppe(&["gate", "--list", "bad.yaml"], &work);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("StepfileInvalid: bad.yaml:8:5: steps[0].gatez"), "{}", text(&bad));
}

/// Every stepfile of `../shared/stepgate/conformance/` loads (its fixtures'
/// addresses filled in), through `steppe gate --list`; skipped with a note
/// where `../shared` is absent (a newcomer's clone).
#[test]
fn every_conformance_stepfile_loads() {
    let dir = repo("../shared/stepgate/conformance");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("note: {} is absent; the conformance stepfiles are not loaded", dir.display());
        return;
    };
    let work = scratch("gate-conformance");
    let mut files = Vec::new();
    for e in entries.flatten() {
        let path = e.path();
        if !path.to_string_lossy().ends_with(".case.yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("read case");
        let text = text.replace("${api.origin}", "http://127.0.0.1:9").replace("${api.host}", "127.0.0.1:9").replace("${mcp.origin}", "http://127.0.0.1:10").replace("${mcp.host}", "127.0.0.1:10");
        let node = steppe_language::yaml::parse(&text, 0).expect("yaml").0.expect("a document");
        let case: serde_json::Value = steppe_language::de::decode(&node, "").0.expect("json");
        let name = path.file_name().expect("name").to_string_lossy().replace(".case.yaml", ".json");
        std::fs::write(work.join(&name), case["stepfile"].to_string()).expect("write");
        files.push(name);
    }
    assert!(files.len() >= 30, "{files:?}");
    let args: Vec<&str> = ["gate", "--list"].into_iter().chain(files.iter().map(String::as_str)).collect();
    let out = steppe(&args, &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(text(&out).lines().filter(|l| l.contains("sha256:")).count(), files.len(), "{}", text(&out));
}

/// Runs the conformance harness (tests/support/stepgate_conformance.py) on
/// the cases of `dir` over `transport`; panics with its report.
fn harness(dir: &std::path::Path, transport: &str) {
    let out = child_of_this_test(&venv_python())
        .arg(repo("tests/support/stepgate_conformance.py"))
        .args(["--steppe", env!("CARGO_BIN_EXE_steppe"), "--cases"])
        .arg(dir)
        .args(["--transport", transport])
        .output()
        .expect("run the harness");
    let report = text(&out);
    assert_eq!(out.status.code(), Some(0), "cases of {} over {transport}:\n{report}", dir.display());
    let summary = report.lines().rev().find(|l| l.contains(" passed, ")).unwrap_or_default();
    assert!(summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 "), "{report}");
}

/// Every case of `../shared/stepgate/conformance/`, driven by the Python
/// `mcp` client over stdio and over HTTP, its ledger verified and a
/// tampered copy refused; skipped with a note where `../shared` is absent.
#[test]
fn every_conformance_case_passes_through_an_mcp_client() {
    let dir = repo("../shared/stepgate/conformance");
    if !dir.is_dir() {
        eprintln!("note: {} is absent; the conformance cases are not run", dir.display());
        return;
    }
    harness(&dir, "stdio");
    harness(&dir, "http");
}

/// The repository's own cases (tests/gate/): the example of docs/gate.md,
/// verifiers, credentials on their hosts, rate limits, refusals.
#[test]
fn the_repositorys_own_gate_cases_pass() {
    harness(&repo("tests/gate"), "stdio");
    harness(&repo("tests/gate"), "http");
}
