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

/// The Python interpreter of the suite's venv (scripts/test installs the `mcp` SDK there).
fn venv_python() -> String {
    std::env::var_os("STEPPE_VENV").map(|v| std::path::PathBuf::from(v).join("bin/python")).filter(|p| p.exists()).map(|p| p.display().to_string()).unwrap_or_else(|| "python3".into())
}

/// Tools of real MCP servers (the Python SDK's), over stdio and over
/// streamable HTTP with a bearer token: listed, narrowed to the grant,
/// called, their results and errors reaching the model; the stdio server
/// sees the host allowlist only, never the worker's secrets.
#[test]
fn mcp_tools_over_stdio_and_http_reach_the_model() {
    mcp_tools_reach_the_model(None);
}

/// The same through a coordinator: the worker starts the stdio server and
/// holds the token, the coordinator neither.
#[test]
fn mcp_tools_reach_the_model_through_a_cluster() {
    let dir = common::scratch("agents-mcp-cluster");
    let (mut coord, url, _log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"], &dir);
    let mut worker = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--slots", "1"])
        .env("FIXTURE_TOKEN", "s3cr3t-fixture-token")
        .env("FIXTURE_PRIVATE_KEY", "never-passed-to-the-server")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    mcp_tools_reach_the_model(Some(&url));
    common::stop([&mut worker, &mut coord]);
}

fn mcp_tools_reach_the_model(coordinator: Option<&str>) {
    use std::io::BufRead;
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-{}-{}", std::process::id(), coordinator.is_some()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let python = venv_python();
    let server = common::repo("tests/support/mcp_server.py").display().to_string();
    let mut http = common::child_of_this_test(&python).args([server.as_str(), "http", "s3cr3t-fixture-token"]).stdout(std::process::Stdio::piped()).spawn().expect("the HTTP MCP server");
    let mut first = String::new();
    std::io::BufReader::new(http.stdout.take().expect("stdout")).read_line(&mut first).expect("its port");
    let endpoint = format!("http://127.0.0.1:{}/mcp", first.trim());
    std::fs::write(
        work.join("p.yml"),
        "mcp_servers:\n- name: fixture\n  command: ((python))\n  args: [((server)), stdio]\n- name: remote\n  endpoint: ((endpoint))\n  auth: {type: bearer, api_key_env: FIXTURE_TOKEN}\n\
         agents:\n- name: researcher\n  source: {model: openrouter/x/y}\n  tools:\n  - {mcp: fixture, tool: lookup, required: true}\n  - {mcp: fixture, tools: [add, boom, env_names]}\n  - {mcp: remote}\n\
         jobs:\n- name: look\n  plan:\n  - agent: researcher\n    messages: [Look up alpha.]\n    assert:\n      tool_calls:\n      - name: fixture__lookup\n        args: {key: alpha}\n\
         - name: narrowed\n  plan:\n  - agent: researcher\n    tools: [fixture__lookup]\n    messages: [Look up alpha.]\n",
    )
    .expect("write");
    // Each rule answers the newest result: lookup → add → boom → the remote lookup → env_names → done.
    std::fs::write(
        work.join("s.yaml"),
        r#"model:
  rules:
    - when: {tool_result_contains: "env: "}
      say: done
    - when: {tool_result_contains: "remote: last letter"}
      call: fixture__env_names
      args: {}
    - when: {tool_result_contains: "failed on purpose"}
      call: remote__lookup
      args: {key: omega}
    - when: {tool_result_contains: '"result":5'}
      call: fixture__boom
      args: {}
    - when: {tool_result_contains: "local: first letter"}
      call: fixture__add
      args: {a: 2, b: 3}
    - when: {offers_tool: fixture__add}
      call: fixture__lookup
      args: {key: alpha}
    - when: {has_tool_results: false}
      call: fixture__lookup
      args: {key: omega}
    - say: only lookup here
"#,
    )
    .expect("write");
    let remote: Vec<&str> = coordinator.map(|u| vec!["--coordinator", u]).unwrap_or_default();
    let steppe = |job: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe"))
            .args(["run", "p.yml", "--job", job, "--script", "s.yaml", "--var", &format!("python={python}"), "--var", &format!("server={server}"), "--var", &format!("endpoint={endpoint}")])
            .args(&remote)
            .current_dir(&work)
            .env_remove("STEPPE_MODEL")
            .env("FIXTURE_TOKEN", "s3cr3t-fixture-token")
            .env("FIXTURE_PRIVATE_KEY", "never-passed-to-the-server")
            .output()
            .expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = steppe("look");
    assert_eq!(code, Some(0), "{t}");
    for call in ["→ fixture__lookup", "→ fixture__add", "→ fixture__boom", "→ remote__lookup", "→ fixture__env_names"] {
        assert!(t.contains(call), "{call} in {t}");
    }
    let transcript = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["runs", "p.yml", "--transcript"]).args(&remote).current_dir(&work).output().expect("runs");
    let transcript = String::from_utf8_lossy(&transcript.stdout).to_string();
    assert!(transcript.contains("local: first letter") && transcript.contains("remote: last letter"), "{transcript}");
    assert!(transcript.contains("the fixture failed on purpose"), "a failed call reaches the model as an error: {transcript}");
    assert!(transcript.contains("PATH") && !transcript.contains("FIXTURE_PRIVATE_KEY") && !transcript.contains("FIXTURE_TOKEN"), "the stdio server sees the host allowlist only: {transcript}");
    // A step that narrows the grant to one tool is offered that tool only.
    let (code, t) = steppe("narrowed");
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("→ fixture__lookup {\"key\":\"omega\"}") && t.contains("only lookup here") && !t.contains("→ fixture__add"), "{t}");
    let _ = http.kill();
    let _ = http.wait();
}

/// `steppe mcp list` probes every declared server (exit 0 whatever they
/// say); `steppe mcp tools` lists one server's tools as they are granted.
#[test]
fn mcp_list_and_tools_probe_the_declared_servers() {
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-list-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let server = common::repo("tests/support/mcp_server.py").display().to_string();
    std::fs::write(
        work.join("p.yml"),
        format!("mcp_servers:\n- name: fixture\n  command: {}\n  args: [{server}, stdio]\n- name: down\n  endpoint: http://127.0.0.1:9/mcp\njobs:\n- name: j\n  plan:\n  - task: t\n    run: 'true'\n", venv_python()),
    )
    .expect("write");
    let steppe = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).output().expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = steppe(&["mcp", "list", "p.yml"]);
    assert_eq!(code, Some(0), "{t}");
    let row = |name: &str| t.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
    assert!(row("fixture").contains("stdio") && row("fixture").ends_with("ok: 7 tool(s)"), "{t}");
    assert!(row("down").contains("unreachable: MCP server \"down\": connecting to http://127.0.0.1:9/mcp") && !row("down").contains("rmcp::"), "{t}");
    let (_, t) = steppe(&["mcp", "list", "p.yml", "--offline"]);
    assert_eq!(t.matches("not probed (--offline)").count(), 2, "{t}");
    let (code, t) = steppe(&["mcp", "tools", "p.yml", "fixture"]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("fixture__lookup\n    Look up a key in the fixture's table.") && t.contains("fixture__boom"), "{t}");
    let (code, t) = steppe(&["mcp", "tools", "p.yml", "nope"]);
    assert_eq!(code, Some(2));
    assert!(t.contains("no MCP server \"nope\" in p.yml (it declares: fixture, down)"), "{t}");
}

/// An MCP-backed resource type: check lists the versions, in fetches the
/// newest (version.json beside the tool's text), out publishes with params
/// read from the put's inputs ({file: PATH}) and rendered into the tool's args.
#[test]
fn an_mcp_backed_resource_type_checks_fetches_and_publishes() {
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-resource-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let server = common::repo("tests/support/mcp_server.py").display().to_string();
    let log = work.join("published.log");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "mcp_servers:\n- name: tracker\n  command: {}\n  args: [{server}, stdio]\n\
             resource_types:\n- name: issue\n  config:\n    mcp:\n      server: tracker\n      check: {{tool: versions}}\n      in: {{tool: fetch, args: {{id: '{{{{ .version.id }}}}'}}}}\n      out: {{tool: publish, args: {{title: '{{{{ .params.title }}}}', body: '{{{{ .params.body }}}}', log: {}}}}}\n\
             resources:\n- name: bugs\n  type: issue\n  source: {{project: demo}}\n\
             jobs:\n- name: sync\n  plan:\n  - get: bugs\n  - task: read\n    inputs: [bugs]\n    run: cat bugs/version.json bugs/content-0.txt\n\
             \x20 - task: write\n    outputs: [note]\n    run: echo 'from the pipeline' > note/body.txt\n\
             \x20 - put: bugs\n    inputs: [note]\n    params: {{title: Nightly, body: {{file: note/body.txt}}}}\n",
            venv_python(),
            log.display()
        ),
    )
    .expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml"]).current_dir(&work).output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("[read]   \"id\": \"2\",") && t.contains("}issue 2 text"), "the newest version (version.json, no newline added) and its text: {t}");
    assert_eq!(std::fs::read_to_string(&log).unwrap_or_default(), "Nightly: from the pipeline\n", "{t}");
}

/// A grant that cannot be served fails its step before the conversation
/// starts, naming the server — never a step run with fewer tools.
#[test]
fn a_grant_that_cannot_be_served_fails_before_the_step_starts() {
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-down-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(
        work.join("p.yml"),
        "mcp_servers:\n- name: tracker\n  endpoint: http://127.0.0.1:9/mcp\n- name: missing\n  command: ./no-such-server\nagents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [read_file, {mcp: tracker}]\n- name: v\n  source: {model: openrouter/x/y}\n  tools: [{mcp: missing}]\n\
         jobs:\n- name: granted\n  plan:\n  - agent: w\n    messages: [Look.]\n- name: narrowed\n  plan:\n  - agent: w\n    tools: [read_file]\n    messages: [Look.]\n- name: unstartable\n  plan:\n  - agent: v\n    messages: [Look.]\n",
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - say: done\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["test", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("FAIL granted") && t.contains("MCP server \"tracker\": connecting to http://127.0.0.1:9/mcp"), "{t}");
    assert!(t.contains("FAIL unstartable") && t.contains("MCP server \"missing\" could not start (./no-such-server)"), "{t}");
    assert!(t.contains("PASS narrowed"), "a step that leaves the server out runs: {t}");
    assert!(!t.contains("MCP server(s)") && !t.contains("not honoured"), "{t}");
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
/// one typed reaches the model. Without a terminal nobody is asked.
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
    // No terminal: nobody to ask, no default — the step is aborted, saying how to answer ahead.
    let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--script", "s.yaml"]).current_dir(&work).env_remove("STEPPE_MODEL").stdin(std::process::Stdio::null()).output().expect("run");
    let t = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(130), "{t}");
    assert!(t.contains("nobody answered") && !t.contains("? Which colour?"), "{t}");
}
