//! Agent pipelines end to end: `steppe test PIPELINE --script SCENARIO`, the
//! scripted model answering on loopback over the real wire protocol.
//!
//! `tests/agents/NAME.yml` with `NAME.scenario.yaml` must pass;
//! `tests/agents/failing/` ones must fail with their `# expect:` fragments.

mod common;

use std::path::Path;
use std::process::Command;

use common::{agent_cases, repo};


fn run(pipeline: &Path, scenario: &Path, tag: &str) -> (i32, String) {
    let work = std::env::temp_dir().join(format!("steppe-agents-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::copy(pipeline, work.join("p.yml")).expect("copy");
    std::fs::copy(scenario, work.join("s.yaml")).unwrap_or_else(|_| panic!("{} needs {}", pipeline.display(), scenario.display()));
    let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["test", "p.yml", "--script", "s.yaml", "--dump-requests", "requests.jsonl"])
        .current_dir(&work)
        .env_remove("STEPPE_MODEL")
        .env_remove("STEPS_MODEL")
        .env_remove("OPENROUTER_API_KEY")
        .output()
        .expect("run steppe");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let dumped = std::fs::read_to_string(work.join("requests.jsonl")).unwrap_or_default();
    assert!(dumped.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "--dump-requests writes JSON lines");
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn scripted_agent_pipelines_pass() {
    let mut failures = Vec::new();
    for (p, s) in agent_cases("") {
        let tag = p.file_stem().and_then(|n| n.to_str()).unwrap_or("x").to_string();
        let (code, text) = run(&p, &s, &tag);
        if code != 0 || !text.contains("passed") {
            failures.push(format!("{}: exit {code}\n{text}", p.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn failing_agent_pipelines_fail_with_their_message() {
    for (p, s) in agent_cases("failing") {
        let body = std::fs::read_to_string(&p).expect("read");
        let tag = format!("f-{}", p.file_stem().and_then(|n| n.to_str()).unwrap_or("x"));
        let (code, text) = run(&p, &s, &tag);
        assert_eq!(code, 2, "{}: {text}", p.display());
        for e in body.lines().filter_map(|l| l.strip_prefix("# expect:")).map(str::trim) {
            assert!(text.contains(e), "{}: output lacks {e:?}:\n{text}", p.display());
        }
    }
}

/// Denials and spend are recorded on the step and shown by `steppe runs`.
#[test]
fn denials_and_tokens_are_recorded() {
    let base = repo("tests/agents/failing");
    let work = std::env::temp_dir().join(format!("steppe-agents-records-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::copy(base.join("sandbox-escape.yml"), work.join("p.yml")).expect("copy");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  turns:\n    - calls:\n        - {name: read_file, args: {path: /etc/hostname}}\n        - {name: write_file, args: {path: /etc/steppe-should-not-exist, content: x}}\n      usage: 1000\n    - say: nope\n      usage: 234\n",
    )
    .expect("write");
    let steppe = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).output().expect("run");
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    let t = steppe(&["test", "p.yml", "--script", "s.yaml"]);
    assert!(t.contains("usage: 1,234 tokens across 1 agent step(s)"), "{t}");
    assert!(t.contains("sandbox: 2 tool call(s) refused:"), "the run ends with its denials: {t}");
    assert!(!Path::new("/etc/steppe-should-not-exist").exists());
    let t = steppe(&["runs", "p.yml", "--steps"]);
    assert!(t.lines().any(|l| l.starts_with("snoop") && l.trim_end().ends_with("1,234")), "{t}");
    assert!(t.contains("denied: read_file /etc/hostname") && t.contains("reads are confined"), "{t}");
    assert!(t.contains("denied: write_file") && t.contains("not granted to this step"), "{t}");
    let t = steppe(&["runs", "p.yml", "--transcript"]);
    assert!(t.contains("call     read_file") && t.contains("result   read_file") && t.contains("text") && t.contains("nope"), "{t}");
    let t = steppe(&["runs", "p.yml", "--cost"]);
    assert!(t.contains("1,234") && t.contains("unpriced"), "{t}");
}

/// `--answer` answers ask_user ahead; with no answer and no default the step is aborted.
#[test]
fn ask_user_presets_and_the_unanswered_question() {
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "agents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [{builtin: ask_user}]\njobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Ask.]\n    assert:\n      stdout: patch\n",
    )
    .expect("write");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"source\":\"preset\"'}\n      say: The bump is patch.\n    - call: ask_user\n      args: {question: Which BUMP is this?}\n",
    )
    .expect("write");
    let steppe = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).output().expect("run");
        (o.status.code().unwrap_or(-1), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = steppe(&["test", "p.yml", "--script", "s.yaml", "--answer", "bump=patch"]);
    assert_eq!(code, 0, "{t}");
    assert!(t.contains("answer: patch"), "{t}");
    let (code, t) = steppe(&["run", "p.yml", "--script-free-run-is-not-a-flag"]);
    assert_eq!(code, 2, "unknown flags are usage errors: {t}");
    let (code, t) = steppe(&["test", "p.yml", "--script", "s.yaml"]);
    assert_eq!(code, 130, "{t}");
    assert!(t.contains("nobody answered") && t.contains("--answer"), "{t}");
}

/// An agent that asks for a container (`image:`) never has its tools run on
/// the worker's host instead: with its image on no engine and no registry
/// to pull it from, the run fails before it starts, naming the image and
/// how to make it, and nothing ran.
#[test]
fn an_agent_declared_in_a_container_never_runs_its_tools_on_the_host() {
    let work = std::env::temp_dir().join(format!("steppe-agents-contained-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let escaped = work.join("escaped-from-the-step");
    let step_level = "  - agent: w\n    image: steppe-test-absent:0\n    network: none\n";
    let agent_level = "  - agent: c\n";
    for (what, step) in [("on the step", step_level), ("on the agent", agent_level)] {
        std::fs::write(
            work.join("p.yml"),
            format!("agents:\n- name: w\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\n- name: c\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\n  image: steppe-test-absent:0\n  network: none\njobs:\n- name: contained\n  plan:\n{step}    messages: [Write the file.]\n"),
        )
        .expect("write");
        std::fs::write(work.join("s.yaml"), format!("model:\n  turns:\n    - calls:\n        - {{name: run_shell, args: {{command: 'echo out > {}'}}}}\n    - say: done\n", escaped.display())).expect("write");
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["test", "p.yml", "--script", "s.yaml"]).current_dir(&work).output().expect("run");
        let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_ne!(o.status.code(), Some(0), "{what}: {t}");
        assert!(t.contains("steppe-test-absent:0") && t.contains("docker load"), "{what}: {t}");
        assert!(t.contains("FAIL contained"), "{what}: {t}");
        assert!(!escaped.exists(), "{what}: the tool ran on the host");
    }
}

/// A web_fetch the allow list refuses names the host it refused and is a
/// sandbox denial like any other: listed at the end of the run and on the step.
#[test]
fn a_refused_web_fetch_is_a_recorded_denial() {
    let base = repo("tests/agents");
    let work = std::env::temp_dir().join(format!("steppe-agents-fence-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::copy(base.join("web-fetch-fence.yml"), work.join("p.yml")).expect("copy");
    std::fs::copy(base.join("web-fetch-fence.scenario.yaml"), work.join("s.yaml")).expect("copy");
    let steppe = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = steppe(&["test", "p.yml", "--script", "s.yaml"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("sandbox: 1 tool call(s) refused"), "{t}");
    let (_, t) = steppe(&["runs", "p.yml", "--steps"]);
    assert!(t.contains("denied: web_fetch https://issues.example/open — host \"issues.example\", which is not in this tool's allow: list (specification.website)"), "{t}");
}

/// A step granted tools this build cannot serve (an MCP server's) fails
/// before it starts, saying why, rather than run with fewer tools.
#[test]
fn a_grant_that_cannot_be_served_fails_before_the_step_starts() {
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "mcp_servers:\n- name: tracker\n  endpoint: http://127.0.0.1:9/mcp\nagents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [read_file, {mcp: tracker}]\njobs:\n- name: granted\n  plan:\n  - agent: w\n    messages: [Look.]\n- name: narrowed\n  plan:\n  - agent: w\n    tools: [read_file]\n    messages: [Look.]\n",
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - say: done\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["test", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("FAIL granted") && t.contains("MCP server(s) tracker, which this build of steppe cannot serve yet"), "{t}");
    assert!(t.contains("PASS narrowed"), "a step that leaves the server out runs: {t}");
    assert!(t.contains("mcp_servers: warning: mcp_servers: is not honoured"), "{t}");
}

/// A model that fails a request is retried, and the retry is said: why, the
/// wait and which attempt — not a silent pause.
#[test]
fn model_retries_are_said_with_their_reason_and_wait() {
    let work = std::env::temp_dir().join(format!("steppe-agents-retry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("p.yml"), "agents:\n- name: a\n  source: {model: openrouter/x/y}\n  tools: [read_file]\njobs:\n- name: j\n  plan:\n  - agent: a\n    messages: [Hello.]\n").expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  turns:\n    - status: 503\n    - say: recovered\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("model request failed (") && t.contains("HTTP 503") && t.contains("retrying in 500ms (attempt 2 of 3)"), "{t}");
    assert!(t.contains("recovered"), "{t}");
}
