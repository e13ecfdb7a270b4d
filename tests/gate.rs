//! `steppe gate --verify` through the real binary: an intact ledger passes,
//! a tampered copy does not, and the exit code says which.

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

    let serve = steppe(&["gate", "p.yaml"], &work);
    assert_eq!(serve.status.code(), Some(2));
    assert!(text(&serve).contains("not built yet"), "{}", text(&serve));
}
