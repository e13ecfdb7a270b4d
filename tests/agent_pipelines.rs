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
    // Conversations speak HTTP/2 to the scripted model, as to a provider that offers it.
    let versions: Vec<String> = dumped.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).map(|r| r["http"].as_str().unwrap_or("none").to_string()).collect();
    assert!(versions.iter().all(|v| v == "HTTP/2.0"), "{}: requests made over {versions:?}", pipeline.display());
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
    assert!(t.contains("1,234") && t.contains("unpriced"), "a model with no price is unpriced, not $0.00: {t}");
    // Priced by a price file: 1,234 tokens split 80/20 by the scripted model, at $1 in and $2 out per million.
    std::fs::write(work.join("prices.json"), r#"{"qwen/qwen3.7-flash": {"input": 1, "output": 2}}"#).expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["test", "p.yml", "--script", "s.yaml"]).env("STEPPE_PRICES", work.join("prices.json")).current_dir(&work).output().expect("run");
    assert!(String::from_utf8_lossy(&o.stdout).contains("usage: 1,234 tokens"), "{}", String::from_utf8_lossy(&o.stdout));
    let t = steppe(&["runs", "p.yml", "--cost"]);
    let newest = t.lines().nth(1).unwrap_or_default();
    assert!(newest.contains("1,234") && newest.contains("$0.0015"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("total") && l.contains("2,468") && l.contains("≥$0.0015")), "one run priced, one not: {t}");
    let run = newest.split_whitespace().next().unwrap_or_default().to_string();
    let t = steppe(&["runs", "p.yml", "--cost", "--run", &run]);
    assert!(t.lines().any(|l| l.starts_with("snoop") && l.contains("$0.0015") && l.contains("stop")), "{t}");
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

const PLANTED: &str = "sk-planted-7f3c9a1e5b2d4c6e";

/// A pipeline that prints its API key every way it can: a task's stdout and
/// stderr, an agent's shell tool, an assert's verdict quoting the output.
fn leaky_pipeline(work: &Path) {
    std::fs::write(
        work.join("p.yml"),
        "agents:\n- name: leaky\n  source: {model: openrouter/x/y, api_key_env: PLANTED_KEY}\n  tools: [run_shell]\n  env: [PLANTED_KEY]\n\
         jobs:\n- name: leak\n  plan:\n  - task: shout\n    env: [PLANTED_KEY]\n    run: echo \"task sees $PLANTED_KEY\"; echo \"stderr $PLANTED_KEY\" >&2\n\
         \x20 - agent: leaky\n    messages: [Print the key.]\n\
         \x20 - task: judged\n    env: [PLANTED_KEY]\n    run: echo \"judged $PLANTED_KEY\"\n    assert: {stdout: something else}\n",
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - when: {has_tool_results: true}\n      say: done\n    - call: run_shell\n      args: {command: 'echo \"agent sees $PLANTED_KEY\"'}\n").expect("write");
}

/// Everything under `dir`, as text.
fn every_file(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(bytes) = std::fs::read(&p) {
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    out
}

/// Runs the leaky pipeline and reads back everything a person could: what
/// it printed, every history view, and every file of `stored`.
fn leaked(work: &Path, remote: &[&str], stored: &Path, key_here: bool) -> (String, String) {
    let run = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_steppe"));
        c.args(args).args(remote).current_dir(work).env_remove("STEPPE_MODEL");
        if key_here {
            c.env("PLANTED_KEY", PLANTED);
        }
        let o = c.output().expect("run");
        format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
    };
    let printed = run(&["run", "p.yml", "--script", "s.yaml"]);
    let mut seen = printed.clone();
    for view in [&["runs", "p.yml", "--steps"][..], &["runs", "p.yml", "--logs", "--full"], &["runs", "p.yml", "--transcript"], &["runs", "p.yml", "--events"], &["runs", "p.yml", "--trace"]] {
        seen.push_str(&run(view));
    }
    seen.push_str(&every_file(stored));
    (printed, seen)
}

/// A planted API key appears nowhere in what a run prints or stores: the
/// engine masks the values of the pipeline's key variables as `***`.
#[test]
fn a_planted_key_appears_nowhere_a_run_prints_or_stores() {
    let work = std::env::temp_dir().join(format!("steppe-agents-planted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    leaky_pipeline(&work);
    let (printed, seen) = leaked(&work, &[], &work.join(".steppe"), true);
    assert!(printed.contains("task sees ***") && printed.contains("stderr ***") && printed.contains("job leak failed: judged"), "{printed}");
    assert!(seen.contains("agent sees ***") && seen.contains("judged ***"), "the masked lines are there: {seen}");
    assert!(!seen.contains(PLANTED), "the key leaked: {}", seen.lines().filter(|l| l.contains(PLANTED)).take(5).collect::<Vec<_>>().join("\n"));
}

/// The same through a coordinator: the key is the worker's alone, and the
/// worker masks it before anything leaves it.
#[test]
fn a_planted_key_stays_on_its_worker_masked() {
    let dir = common::scratch("agents-planted-cluster");
    let (mut coord, url, log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"], &dir);
    let mut worker = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--slots", "1"])
        .env("PLANTED_KEY", PLANTED)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    let work = dir.join("p");
    std::fs::create_dir_all(&work).expect("mkdir");
    leaky_pipeline(&work);
    let (printed, seen) = leaked(&work, &["--coordinator", &url], &dir.join("state"), false);
    common::stop([&mut worker, &mut coord]);
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(printed.contains("task sees ***") && printed.contains("job leak failed: judged"), "{printed}");
    assert!(seen.contains("agent sees ***"), "{seen}");
    for (what, text) in [("printed or stored", &seen), ("the coordinator's log", &log)] {
        assert!(!text.contains(PLANTED), "the key leaked into {what}: {}", text.lines().filter(|l| l.contains(PLANTED)).take(5).collect::<Vec<_>>().join("\n"));
    }
}

/// A free loopback port (nothing listens on it once this returns).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

/// Preflight: a primary that does not answer gives way to its first
/// fallback that does, said once, before any step; an agent with none fails
/// its job before any step runs; --no-preflight skips the probe.
#[test]
fn preflight_pins_a_fallback_or_fails_the_job_before_its_steps() {
    let work = std::env::temp_dir().join(format!("steppe-agents-preflight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - say: hello from the fallback\n").expect("write");
    let (live, dead) = (free_port(), free_port());
    let mut model = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["scripted-model", "--script", "s.yaml", "--listen", &format!("127.0.0.1:{live}")])
        .current_dir(&work)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("scripted model");
    common::wait_for("the scripted model to listen", std::time::Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", live)).is_ok());
    std::fs::write(
        work.join("p.yml"),
        format!(
            "agents:\n- name: a\n  source: {{model: dead-model, endpoint: 'http://127.0.0.1:{dead}/v1/'}}\n  fallback:\n  - source: {{model: live-model, endpoint: 'http://127.0.0.1:{live}/v1/'}}\n\
             - name: b\n  source: {{model: dead-model, endpoint: 'http://127.0.0.1:{dead}/v1/'}}\n\
             jobs:\n- name: ok\n  plan:\n  - agent: a\n    messages: [Say hello.]\n- name: down\n  plan:\n  - agent: b\n    messages: [Say hello.]\n"
        ),
    )
    .expect("write");
    let steppe = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    // The command: every job probed, nothing run or recorded.
    let (code, t) = steppe(&["preflight", "p.yml"]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("job ok:\n  fallback: agent a runs on its fallback live-model — dead-model is unavailable"), "{t}");
    assert!(t.contains(&format!("job down:\n  failed: agent \"b\": dead-model at http://127.0.0.1:{dead}/v1/:")), "{t}");
    assert!(!work.join(".steppe").exists(), "preflight records nothing");
    let (code, t) = steppe(&["preflight", "p.yml", "--job", "ok"]);
    assert_eq!(code, Some(0), "{t}");
    let (code, t) = steppe(&["run", "p.yml", "--job", "ok"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("preflight: agent a runs on its fallback live-model — dead-model is unavailable"), "{t}");
    assert!(t.contains("agent: a (fallback: live-model — dead-model is unavailable)"), "the step's banner: {t}");
    assert!(t.contains("hello from the fallback") && !t.contains("model request failed"), "the step asked the fallback only: {t}");
    let (code, t) = steppe(&["run", "p.yml", "--job", "down"]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("job \"down\": preflight failed, no steps were run:") && t.contains(&format!("agent \"b\": dead-model at http://127.0.0.1:{dead}/v1/:")), "{t}");
    assert!(!t.contains("▶ b"), "no step ran: {t}");
    let (code, t) = steppe(&["run", "p.yml", "--job", "down", "--no-preflight"]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("▶ b") && !t.contains("preflight failed"), "without preflight the step starts and meets the dead model itself: {t}");
    // Through a coordinator, the same, --no-preflight carried by the submission.
    let (mut coord, url, _log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "1", "--state", "state"], &work);
    let (code, t) = steppe(&["run", "p.yml", "--job", "down", "--coordinator", &url]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("job \"down\": preflight failed, no steps were run:") && !t.contains("▶ b"), "{t}");
    let (code, t) = steppe(&["submit", "p.yml", "--job", "down", "--no-preflight", "--coordinator", &url]);
    assert_eq!(code, Some(2), "{t}");
    assert!(t.contains("▶ b") && !t.contains("preflight failed"), "{t}");
    common::stop([&mut coord]);
    let _ = model.kill();
    let _ = model.wait();
}

/// ask_user on a terminal asks the person at it (through a pseudo-terminal
/// made by `script`): an answer outside the options is asked again, the
/// one typed reaches the model.
#[test]
fn ask_user_asks_the_person_at_the_terminal() {
    use std::io::Write;
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-tty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "agents:\n- name: painter\n  source: {model: openrouter/x/y}\n  tools:\n  - builtin: ask_user\n    options_required: true\njobs:\n- name: paint\n  plan:\n  - agent: painter\n    messages: [Ask which colour to use, then say it.]\n",
    )
    .expect("write");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"source\":\"person\"'}\n      say: painting it as told\n    - call: ask_user\n      args: {question: Which colour?, options: [red, blue]}\n",
    )
    .expect("write");
    let command = format!("'{}' run p.yml --script s.yaml", env!("CARGO_BIN_EXE_steppe"));
    let mut child = common::child_of_this_test("script")
        .args(["-q", "-e", "-c", &command, "/dev/null"])
        .current_dir(&work)
        .env_remove("STEPPE_MODEL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("script (util-linux)");
    // Typed as a person would: each answer once its prompt is on the screen.
    let mut stdin = child.stdin.take().expect("stdin");
    let seen = common::Log::default();
    let mut stdout = child.stdout.take().expect("stdout");
    let kept = seen.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut stdout, &mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut g) = kept.lock() {
                g.push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        }
    });
    let has = |what: &str| seen.lock().map(|l| l.contains(what)).unwrap_or(false);
    let wait = |what: &str| {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !has(what) {
            assert!(std::time::Instant::now() < until, "{what:?} never showed; the terminal showed:\n{}", seen.lock().map(|l| l.clone()).unwrap_or_default());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    wait("? Which colour?");
    stdin.write_all(b"green\n").expect("type");
    wait("(answer with one of: red, blue)");
    stdin.write_all(b"blue\n").expect("type");
    let status = child.wait().expect("the run");
    drop(stdin);
    let _ = reader.join();
    let t = seen.lock().map(|l| l.replace('\r', "")).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{t}");
    assert!(t.contains("? Which colour? [red | blue]") && t.contains("(answer with one of: red, blue)"), "{t}");
    assert!(t.contains("[painter] answer: blue") && t.contains("painting it as told"), "{t}");
}

/// With nobody at a terminal, `steppe run` parks an ask_user question in the
/// pipeline's store: `steppe questions` lists it, `steppe questions answer`
/// answers it and the run goes on; a second step asking the same question
/// in the run gets the same answer without asking anyone. An answered
/// question cannot be answered again.
#[test]
fn ask_user_parks_the_question_until_steppe_questions_answers_it() {
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-parked-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "agents:\n- name: writer\n  source: {model: openrouter/x/y}\n  tools:\n  - builtin: ask_user\n    timeout: 2m\njobs:\n- name: release\n  plan:\n  - agent: writer\n    messages: [Ask which bump this is.]\n    assert: {stdout: minor}\n  - agent: writer\n    messages: [Ask again.]\n    assert: {stdout: minor}\n",
    )
    .expect("write");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"answer\":\"minor\"'}\n      say: minor\n    - call: ask_user\n      args: {question: Which bump is this release?, options: [major, minor, patch]}\n",
    )
    .expect("write");
    let (mut child, log) = common::spawn_logged(&["run", "p.yml", "--script", "s.yaml"], &work);
    common::wait_in_log(&log, "question 1: waiting up to 2m0s — steppe questions answer 1 <answer> -p p.yml", std::time::Duration::from_secs(60));
    let (code, out, err) = common::run_steppe(&["questions", "-p", "p.yml"], &work);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("Which bump is this release?") && out.contains("options: major | minor | patch") && out.contains("writer") && out.contains("release"), "{out}");
    let (code, out, err) = common::run_steppe(&["questions", "answer", "1", "minor", "-p", "p.yml"], &work);
    assert_eq!((code, out.trim()), (0, "answered: question 1"), "{err}");
    let status = child.wait().expect("the run");
    let t = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{t}");
    assert!(t.contains("question 1: answered by") && t.contains("answered earlier in this run"), "{t}");
    assert_eq!(t.matches("waiting up to").count(), 1, "the second step was not parked: {t}");
    let (code, out, err) = common::run_steppe(&["questions", "answer", "1", "major", "-p", "p.yml"], &work);
    assert!(code != 0 && err.contains("already answered") && err.contains("minor"), "{out}{err}");
    let (code, out, _) = common::run_steppe(&["questions", "-p", "p.yml"], &work);
    assert!(code == 0 && out.contains("no questions waiting"), "{out}");
    let (code, _, err) = common::run_steppe(&["questions", "answer", "99", "x", "-p", "p.yml"], &work);
    assert!(code != 0 && err.contains("no question 99"), "{err}");
}

/// A parked question nobody answers expires: with `default:` the model is
/// told the default was used; without one the step is aborted.
#[test]
fn an_unanswered_parked_question_expires() {
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-expiry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let pipeline = |default: &str| format!("agents:\n- name: w\n  source: {{model: openrouter/x/y}}\n  tools:\n  - builtin: ask_user\n    timeout: 1s\n{default}jobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Ask.]\n");
    std::fs::write(work.join("d.yml"), pipeline("    default: patch\n")).expect("write");
    std::fs::write(work.join("n.yml"), pipeline("")).expect("write");
    std::fs::write(
        work.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"source\":\"default\"'}\n      say: going with the default\n    - call: ask_user\n      args: {question: Which bump?}\n",
    )
    .expect("write");
    let run = |file: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", file, "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").stdin(std::process::Stdio::null()).output().expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = run("d.yml");
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("waiting up to 1s") && t.contains("answer: patch") && t.contains("going with the default"), "{t}");
    let (code, t) = run("n.yml");
    assert_eq!(code, Some(130), "aborted, not failed: {t}");
    assert!(t.contains("nobody answered"), "{t}");
    let (_, out, _) = common::run_steppe(&["questions", "-p", "n.yml"], &work);
    assert!(out.contains("no questions waiting"), "an expired question is not left waiting: {out}");
}

/// A parked question is not waited on past its step's deadline: with no
/// `timeout:` on the grant and an 8 s step, the default comes in time.
#[test]
fn a_parked_question_ends_before_its_step_does() {
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-deadline-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "agents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools:\n  - builtin: ask_user\n    default: patch\njobs:\n- name: j\n  plan:\n  - agent: w\n    timeout: 8s\n    messages: [Ask.]\n",
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - when: {tool_result_contains: '\"source\":\"default\"'}\n      say: going with the default\n    - call: ask_user\n      args: {question: Which bump?}\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").stdin(std::process::Stdio::null()).output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("answer: patch") && t.contains("going with the default") && !t.contains("timed out"), "{t}");
}

/// What a failed attempt's fixer spent is the step's spend too: a task with
/// `attempts: 2` and a `fix:` agent that cannot mend it counts both repairs.
#[test]
fn failed_attempts_spend_counts() {
    let work = std::env::temp_dir().join(format!("steppe-agents-attempt-spend-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("p.yml"), "agents:\n- name: mender\n  source: {model: openrouter/x/y}\njobs:\n- name: j\n  plan:\n  - task: check\n    attempts: 2\n    fix: mender\n    run: test -f fixed\n").expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  turns:\n    - say: could not mend it\n      usage: 100\n    - say: still could not\n      usage: 50\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("attempt 1 of 2 failed") && t.contains("usage: 150 tokens across 1 agent step(s)"), "{t}");
}

/// A run stopped while its question waits leaves nobody answering it: the
/// question is settled as expired and no longer listed.
#[test]
fn a_question_whose_run_stops_is_not_left_waiting() {
    let work = std::env::temp_dir().join(format!("steppe-agents-ask-stopped-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("p.yml"), "agents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [{builtin: ask_user, timeout: 10m}]\njobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Ask.]\n").expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - call: ask_user\n      args: {question: Which bump?}\n").expect("write");
    let (mut child, log) = common::spawn_logged(&["run", "p.yml", "--script", "s.yaml"], &work);
    common::wait_in_log(&log, "question 1: waiting up to 10m0s", std::time::Duration::from_secs(60));
    let (_, out, _) = common::run_steppe(&["questions", "-p", "p.yml"], &work);
    assert!(out.contains("Which bump?"), "{out}");
    // SAFETY: signalling the run this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().expect("the run");
    assert_eq!(status.code(), Some(130), "{}", log.lock().map(|l| l.clone()).unwrap_or_default());
    let (_, out, _) = common::run_steppe(&["questions", "-p", "p.yml"], &work);
    assert!(out.contains("no questions waiting"), "{out}");
}
