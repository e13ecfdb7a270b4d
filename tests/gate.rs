//! `steppe gate` through the real binary: stepfiles served to the Python
//! `mcp` SDK's client over stdio and HTTP, every conformance case and the
//! repository's own replayed with their fixtures on loopback, the HTTP
//! server's refusals, and `--verify` telling an intact ledger from a
//! tampered one.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

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
    let good = l.path().expect("a ledger file").to_path_buf();
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

/// One HTTP/1.1 request to 127.0.0.1:`port` with exactly these headers:
/// the status and the body.
fn raw(port: u16, method: &str, path: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let out = String::from_utf8_lossy(&out).to_string();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, out)
}

/// `--http` serves 127.0.0.1 only, at /mcp only, and refuses what a
/// DNS-rebinding page or a confused client would send.
#[test]
fn http_refuses_foreign_hosts_and_origins_other_paths_and_bad_bodies() {
    let work = scratch("gate-http");
    std::fs::write(
        work.join("p.yaml"),
        "stepgate: \"1\"\nid: hello\ninputs: {type: object}\nsteps:\n  - id: greet\n    instructions: Say hello.\n    produces: {type: object}\n    gates: [{id: any, schema: {type: object}}]\n",
    )
    .expect("write");
    let (mut child, log) = spawn_logged(&["gate", "p.yaml", "--http", "0", "--ledger-dir", "ledgers"], &work);
    wait_in_log(&log, "/mcp", Duration::from_secs(20));
    let shown = log.lock().map(|l| l.clone()).unwrap_or_default();
    let port: u16 = shown.split("http://127.0.0.1:").nth(1).and_then(|r| r.split('/').next()).and_then(|p| p.parse().ok()).expect("the port it serves on");
    let host = ("Host", format!("127.0.0.1:{port}"));
    let json = ("Content-Type", "application/json".to_string());
    let accept = ("Accept", "application/json, text/event-stream".to_string());
    let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

    let (code, body) = raw(port, "POST", "/mcp", &[("Host", "evil.example".into()), json.clone(), accept.clone()], init);
    assert_eq!(code, 403, "a Host that is not loopback (DNS rebinding): {body}");
    assert!(body.contains("{\"error\":"), "{body}");
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), ("Origin", "https://attacker.example".into()), json.clone(), accept.clone()], init);
    assert_eq!(code, 403, "an Origin that is not loopback: {body}");
    let (code, body) = raw(port, "GET", "/other", &[host.clone()], b"");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("only /mcp"), "{body}");
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone()], b"{not json");
    assert_eq!(code, 400, "{body}");
    let list = br#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone()], list);
    assert_eq!(code, 400, "no session: {body}");
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone(), ("Mcp-Session-Id", "made-up".into())], list);
    assert_eq!(code, 400, "an unknown session: {body}");
    let big = vec![b' '; 5 * 1024 * 1024];
    let (code, _) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone()], &big);
    assert_eq!(code, 413);
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), ("Origin", "http://localhost:3000".into()), json.clone(), accept.clone()], init);
    assert_eq!(code, 200, "a loopback client initializes: {body}");
    assert!(body.to_ascii_lowercase().contains("mcp-session-id:"), "a session is issued: {body}");
    assert!(body.contains("\"name\":\"stepgate\""), "{body}");
    // A run belongs to its session: closing the session abandons it.
    let session = body.lines().find_map(|l| l.to_ascii_lowercase().starts_with("mcp-session-id:").then(|| l[15..].trim().to_string())).expect("a session id");
    let sid = ("Mcp-Session-Id", session.clone());
    let version = ("Mcp-Protocol-Version", "2025-06-18".to_string());
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone(), sid.clone(), version.clone()], br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    assert!(code == 202 || code == 200, "{body}");
    let call = br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"hello","arguments":{}}}"#;
    let (code, body) = raw(port, "POST", "/mcp", &[host.clone(), json.clone(), accept.clone(), sid.clone(), version.clone()], call);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("step 1 of 1: greet"), "{body}");
    let (code, body) = raw(port, "DELETE", "/mcp", &[host.clone(), sid.clone(), version.clone()], b"");
    assert_eq!(code, 200, "{body}");
    wait_for("the closed session's run abandoned in its ledger", Duration::from_secs(10), || {
        std::fs::read_dir(work.join("ledgers")).into_iter().flatten().flatten().any(|e| std::fs::read_to_string(e.path()).is_ok_and(|t| t.contains("\"type\":\"run_abandoned\"")))
    });
    stop([&mut child]);
}

/// `--test` replays recorded cases offline: the repository's cases of the
/// docs example pass; a record whose verdicts or calls no longer hold
/// fails with the reason; a case naming a gate the step lacks is refused.
#[test]
fn recorded_cases_replay_offline_and_say_what_no_longer_holds() {
    let dir = repo("tests/gate/offline");
    let work = scratch("gate-test");
    let stepfile = dir.join("shelf-audit.stepfile.yaml");
    let sf = stepfile.to_str().expect("path");
    let out = steppe(&["gate", "--test", sf], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lines: Vec<String> = text(&out).lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 6, "one line per step of each case: {lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("ok  ")), "{lines:?}");
    assert!(lines[1].ends_with("/ report (verifier and approve gates not run offline: audited)"), "{lines:?}");

    let cases = std::fs::read_to_string(dir.join("shelf-audit.cases.yaml")).expect("read");
    let changed = work.join("changed.cases.yaml");
    std::fs::write(&changed, cases.replace("expect: { fail: [names-all] }", "expect: pass").replace("arguments: { shelf: B }", "arguments: { shelf: C }")).expect("write");
    let out = steppe(&["gate", "--test", sf, changed.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(shown.contains("FAIL  a report that misses an item, then one that names both / report"), "{shown}");
    assert!(shown.contains("      expected every gate to pass, but names-all failed\n      names-all: name every item; missing: [\"K-1\"]"), "{shown}");
    assert!(shown.contains("      call shelf would send {\"shelf\":\"B\"} as listItems call 1, but the case recorded {\"shelf\":\"C\"}"), "{shown}");

    std::fs::write(&changed, cases.replace("expect: { fail: [derive] }", "expect: { fail: [no-such-gate] }")).expect("write");
    let out = steppe(&["gate", "--test", sf, changed.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("CasesInvalid: cases invalid: case \"a count the client sends is refused, a stock nobody fetched fails\", step report: no-such-gate is not one of its gates"), "{}", text(&out));
    std::fs::write(&changed, cases.replace("expect: pass", "expected: pass")).expect("write");
    let out = steppe(&["gate", "--test", sf, changed.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("CasesInvalid: cases invalid: /cases/0/steps/0 must have required property 'expect'"), "{}", text(&out));
    let out = steppe(&["gate", "--test", "no-such-entry", "--catalog", work.to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("UnknownStepfile: no catalog stepfile named no-such-entry"), "{}", text(&out));
}

/// A run served with `--record-cases` leaves a cases file that `--test`
/// replays as it happened (the run of the docs example, against its
/// fixture API).
#[test]
fn a_recorded_run_replays_under_test() {
    let work = scratch("gate-record");
    let case = std::fs::read_to_string(repo("tests/gate/shelf-audit.case.yaml")).expect("read");
    std::fs::write(work.join("shelf-audit.case.yaml"), format!("args: [--record-cases, {}]\n{case}", work.join("recorded").display())).expect("write");
    let keep = work.join("kept");
    let out = child_of_this_test(&venv_python())
        .arg(repo("tests/support/stepgate_conformance.py"))
        .args(["--steppe", env!("CARGO_BIN_EXE_steppe"), "--cases"])
        .arg(&work)
        .arg("--keep")
        .arg(&keep)
        .output()
        .expect("run the harness");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let recorded: Vec<_> = std::fs::read_dir(work.join("recorded")).expect("recorded").flatten().map(|e| e.path()).collect();
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    let body = std::fs::read_to_string(&recorded[0]).expect("read");
    assert!(body.starts_with("# Recorded by steppe gate --record-cases from run "), "{body}");
    let stepfile = keep.join("shelf-audit").join("shelf-audit.json");
    let out = steppe(&["gate", "--test", stepfile.to_str().expect("path"), recorded[0].to_str().expect("path")], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let shown = text(&out);
    let steps: Vec<&str> = shown.lines().map(|l| l.split(" of shelf-audit / ").nth(1).unwrap_or(l)).collect();
    assert_eq!(steps, ["fetch", "report", "report"], "the mechanical step and both attempts: {shown}");
}

/// An agent step granted a `stepgate:` server follows the gated procedure:
/// the stepfile served by `steppe gate` on the worker that runs the step,
/// its gate rejecting the first output, the run finishing on the second;
/// the ledger kept with the step's record, written out by `steppe runs
/// --ledgers` and verified. Embedded, and through a coordinator's worker.
#[test]
fn a_pipeline_agent_follows_a_gated_procedure() {
    agent_follows_a_gated_procedure(None);
}

#[test]
fn a_pipeline_agent_follows_a_gated_procedure_on_a_cluster_worker() {
    let dir = scratch("gate-pipeline-cluster");
    let (mut coord, url, _log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"], &dir);
    let mut worker = spawn_worker(&url, &["--slots", "1"]);
    agent_follows_a_gated_procedure(Some(&url));
    stop([&mut worker, &mut coord]);
}

fn agent_follows_a_gated_procedure(coordinator: Option<&str>) {
    let work = scratch(if coordinator.is_some() { "gate-pipeline-remote" } else { "gate-pipeline" });
    std::fs::create_dir_all(work.join("procedures")).expect("mkdir");
    std::fs::write(
        work.join("procedures/release-note.yaml"),
        "stepgate: \"1\"\nid: release-note\ninputs: {type: object, required: [version], properties: {version: {type: string}}}\nsteps:\n  - id: draft\n    instructions: \"Draft the release note of {{inputs.version}}.\"\n    produces: {type: object, required: [note], properties: {note: {type: string}}}\n    gates:\n      - {id: names-version, message: the note must name the version, predicate: {in: [{var: inputs.version}, {var: output.note}]}}\n    retries: 1\n",
    )
    .expect("write");
    std::fs::write(
        work.join("p.yml"),
        "mcp_servers:\n- name: procedures\n  stepgate:\n    stepfiles: [procedures/release-note.yaml]\nagents:\n- name: writer\n  source: {model: openrouter/x/y}\n  tools:\n  - {mcp: procedures}\njobs:\n- name: note\n  plan:\n  - agent: writer\n    messages: [Write the release note of 1.2 by following the release-note procedure.]\n    assert:\n      tool_calls:\n      - name: procedures__release-note\n      - name: procedures__stepgate_submit\n        args: {run: \"1\"}\n",
    )
    .expect("write");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  turns:\n    - call: procedures__release-note\n      args: {version: \"1.2\"}\n    - call: procedures__stepgate_submit\n      args: {run: \"1\", output: {note: Fixes the login page.}}\n    - call: procedures__stepgate_submit\n      args: {run: \"1\", output: {note: 1.2 fixes the login page.}}\n    - say: The release note passed its gate.\n",
    )
    .expect("write");
    let remote: Vec<&str> = coordinator.map(|u| vec!["--coordinator", u]).unwrap_or_default();
    let mut args = vec!["run", "p.yml", "--script", "s.yaml"];
    args.extend(&remote);
    let out = steppe(&args, &work);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("→ procedures__release-note") && shown.contains("→ procedures__stepgate_submit"), "{shown}");
    let mut args = vec!["runs", "p.yml", "--transcript", "--ledgers", "ledgers"];
    args.extend(&remote);
    let out = steppe(&args, &work);
    let shown = text(&out);
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(shown.contains("The output was rejected. Fix every problem below"), "the gate's rejection reached the model: {shown}");
    assert!(shown.contains("procedures/release-note-1.jsonl (8 records; --ledgers DIR writes it)"), "{shown}");
    let ledger = work.join("ledgers/writer/release-note-1.jsonl");
    let types: Vec<String> = std::fs::read_to_string(&ledger).expect("the ledger").lines().map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json")["type"].as_str().unwrap_or_default().to_string()).collect();
    assert_eq!(types, ["run_started", "step_started", "submit", "gate", "submit", "gate", "step_passed", "run_finished"], "{shown}");
    let verify = steppe(&["gate", "--verify", ledger.to_str().expect("path")], &work);
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(text(&verify).contains("intact, 8 records"), "{}", text(&verify));
}

/// A `stepgate:` server is checked at load: a stepfile path that leaves the
/// pipeline's directory, none at all, or beside a command, each an error
/// with its place; a stepfile that does not load fails the step naming it.
#[test]
fn stepgate_servers_are_checked_where_they_are_declared() {
    let work = scratch("gate-validate");
    let pipeline = |server: &str| format!("mcp_servers:\n- name: procedures\n{server}agents:\n- name: writer\n  source: {{model: openrouter/x/y}}\n  tools: [{{mcp: procedures}}]\njobs:\n- name: j\n  plan:\n  - agent: writer\n    messages: [Go.]\n");
    for (server, said) in [
        ("  stepgate: {stepfiles: [../elsewhere.yaml]}\n", "mcp_servers[0].stepgate.stepfiles[0]"),
        ("  stepgate: {stepfiles: []}\n", "stepgate: serves at least one stepfile"),
        ("  command: python3\n  stepgate: {stepfiles: [a.yaml]}\n", "stepgate: is served by steppe itself, so it takes no endpoint or command"),
        ("  stepgate: {stepfiles: [a.yaml], env: [\"not a name\"]}\n", "env lists the NAMEs of variables"),
    ] {
        std::fs::write(work.join("p.yml"), pipeline(server)).expect("write");
        let out = steppe(&["validate", "p.yml"], &work);
        assert_ne!(out.status.code(), Some(0), "{server}: {}", text(&out));
        assert!(text(&out).contains(said), "{server}: {}", text(&out));
    }
    std::fs::write(work.join("a.yaml"), "stepgate: \"1\"\nid: broken\ninputs: {type: object}\nsteps: []\n").expect("write");
    std::fs::write(work.join("p.yml"), pipeline("  stepgate: {stepfiles: [a.yaml]}\n")).expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  turns:\n    - say: never asked\n").expect("write");
    let out = steppe(&["run", "p.yml", "--script", "s.yaml"], &work);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("MCP server \"procedures\": StepfileInvalid: a.yaml"), "{}", text(&out));
}

/// The authoring tools through the Python `mcp` client: an outline with a
/// TODO(gate) per obligation, a draft that reaches a private host or an
/// ungranted credential refused, a public-only draft run, inspect_api
/// refusing a private URL, the catalog listed and shown, an unknown tool.
#[test]
fn authoring_tools_outline_try_inspect_and_show_examples() {
    let work = scratch("gate-authoring");
    std::fs::create_dir_all(work.join("cat/ops/hello")).expect("mkdir");
    std::fs::write(work.join("cat/ops/hello/hello.stepfile.yaml"), "stepgate: \"1\"\nid: hello\ninputs: {type: object}\nsteps:\n  - id: greet\n    instructions: Say hello.\n    produces: {type: object}\n    gates: [{id: any, schema: {type: object}}]\n").expect("write");
    std::fs::write(work.join("cat/ops/hello/README.md"), "# Hello\n").expect("write");
    let draft = |tools: &str| format!("stepgate: \"1\"\nid: draft\ninputs: {{type: object}}\n{tools}steps:\n  - id: s\n    instructions: Do it.\n    produces: {{type: object}}\n    gates: [{{id: any, schema: {{type: object}}}}]\n");
    let private = draft("credentials:\n  k: {kind: bearer, hosts: [\"api.example.com\"], description: d}\ntools:\n  api:\n    openapi: {server: \"http://127.0.0.1:9\", document: {openapi: 3.1.0, paths: {/x: {get: {operationId: getX}}}}}\n    exposes: [getX]\n");
    let calls = json!([
        {"tool": "stepgate_outline", "arguments": {"procedure": "# Refunds\n\n1. Find the order. It MUST exist.\n2. Refund it; never more than was paid.\n"}},
        {"tool": "stepgate_try", "arguments": {"stepfile": private, "inputs": {}}},
        {"tool": "stepgate_try", "arguments": {"stepfile": draft(""), "inputs": {}}},
        {"tool": "stepgate_inspect_api", "arguments": {"kind": "openapi", "url": "https://127.0.0.1:9/openapi.json"}},
        {"tool": "stepgate_examples", "arguments": {}},
        {"tool": "stepgate_examples", "arguments": {"name": "hello"}},
        {"tool": "nope", "arguments": {}},
    ]);
    std::fs::write(work.join("calls.json"), calls.to_string()).expect("write");
    let out = child_of_this_test(&venv_python())
        .arg(repo("tests/support/mcp_calls.py"))
        .arg("calls.json")
        .args(["--", env!("CARGO_BIN_EXE_steppe"), "gate", "--catalog", "cat", "--ledger-dir", "ledgers"])
        .current_dir(&work)
        .output()
        .expect("the client");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let replies: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(replies[0]["server"], "stepgate");
    let tools = replies[1]["tools"].to_string();
    for t in ["stepgate_call", "stepgate_submit", "stepgate_guide", "stepgate_examples", "stepgate_validate", "stepgate_inspect_api", "stepgate_outline", "stepgate_try"] {
        assert!(tools.contains(t), "{t} in {tools}");
    }
    let outline = replies[2]["text"].as_str().unwrap_or_default();
    assert!(outline.contains("id: refunds") && outline.contains("TODO(gate): It MUST exist") && outline.contains("TODO(gate): Refund it; never more than was paid") && outline.contains("  - id: find-the-order\n"), "{outline}");
    assert_eq!(replies[3]["structured"]["error"], "DraftRefused", "{}", replies[3]);
    let refused = replies[3]["text"].as_str().unwrap_or_default();
    assert!(refused.contains("http://127.0.0.1:9 is not https") && refused.contains("credential k is not granted to drafts"), "{refused}");
    assert_eq!(replies[4]["structured"]["state"], "running", "a public-only draft runs: {}", replies[4]);
    assert!(replies[5]["text"].as_str().unwrap_or_default().starts_with("UrlNotPublic: "), "{}", replies[5]);
    assert_eq!(replies[6]["text"], "ops/hello");
    assert!(replies[7]["text"].as_str().unwrap_or_default().contains("id: hello") && replies[7]["text"].as_str().unwrap_or_default().contains("# Hello"), "{}", replies[7]);
    assert_eq!(replies[8]["structured"]["error"], "UnknownTool");
}

/// An `approve` gate asks the client's person by MCP form elicitation: a
/// decline with a reason is a failure to fix, an accept passes; a client
/// that cannot show a form fails preflight with item `approval`.
#[test]
fn approve_gates_ask_the_person_behind_the_client() {
    let work = scratch("gate-approve");
    std::fs::write(
        work.join("announce.yaml"),
        "stepgate: \"1\"\nid: announce\ninputs: {type: object}\nsteps:\n  - id: draft\n    instructions: Draft the announcement.\n    produces: {type: object, required: [text], properties: {text: {type: string}}}\n    gates:\n      - {id: signed-off, approve: {message: May this announcement go out?}}\n    retries: 1\n",
    )
    .expect("write");
    let calls = json!([
        {"tool": "announce", "arguments": {}},
        {"tool": "stepgate_submit", "arguments": {"run": "1", "output": {"text": "We ship on Friday!!!"}}},
        {"tool": "stepgate_submit", "arguments": {"run": "1", "output": {"text": "We ship on Friday."}}},
    ]);
    std::fs::write(work.join("calls.json"), calls.to_string()).expect("write");
    let client = |elicit: Option<&str>| {
        let mut c = child_of_this_test(&venv_python());
        c.arg(repo("tests/support/mcp_calls.py")).arg("calls.json");
        if let Some(e) = elicit {
            c.args(["--elicit", e]);
        }
        let out = c.args(["--", env!("CARGO_BIN_EXE_steppe"), "gate", "announce.yaml", "--ledger-dir", "ledgers", "--sequential-runs"]).current_dir(&work).output().expect("the client");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str::<serde_json::Value>(l).expect("JSON")).filter(|v| v.get("text").is_some() || v.get("elicited").is_some()).collect::<Vec<_>>()
    };
    let r = client(Some("decline:too loud,accept"));
    assert_eq!(r[0]["structured"]["state"], "running", "{r:?}");
    assert!(r[1]["elicited"].as_str().unwrap_or_default().starts_with("May this announcement go out?\n\n{"), "the message and the output: {r:?}");
    assert_eq!(r[2]["structured"]["failures"][0]["diagnosis"], "a person declined to approve this output: too loud", "{r:?}");
    assert_eq!(r[4]["structured"]["state"], "finished", "{r:?}");
    let r = client(None);
    assert_eq!(r[0]["structured"]["error"], "PreflightFailed", "{r:?}");
    assert!(r[0]["text"].as_str().unwrap_or_default().contains("preflight failed for approval"), "{r:?}");
}
