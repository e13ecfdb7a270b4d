//! Agent steps granted tools of real MCP servers (the Python SDK's
//! `tests/support/mcp_server.py`, over stdio and over streamable HTTP):
//! the tools reaching the model embedded and through a cluster, preflight,
//! `steppe mcp`, MCP-backed resource types and grants that cannot be served.

mod common;

use std::process::Command;

use common::venv_python;

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

/// Preflight reaches the MCP servers a job's agents are granted: a granted
/// tool an HTTP server does not list, or a stdio server whose program is
/// nowhere, fails the job before its first step, naming the agent and the
/// server; `--no-preflight` leaves it to the step, which fails before its
/// first request.
#[test]
fn preflight_fails_a_job_whose_mcp_grant_cannot_be_served() {
    use std::io::BufRead;
    let work = std::env::temp_dir().join(format!("steppe-agents-mcp-preflight-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    let python = venv_python();
    let server = common::repo("tests/support/mcp_server.py").display().to_string();
    let mut http = common::child_of_this_test(&python).args([server.as_str(), "http", "tok"]).stdout(std::process::Stdio::piped()).spawn().expect("the HTTP MCP server");
    let mut first = String::new();
    std::io::BufReader::new(http.stdout.take().expect("stdout")).read_line(&mut first).expect("its port");
    let pipeline = |grant: &str| {
        format!(
            "mcp_servers:\n- name: remote\n  endpoint: http://127.0.0.1:{}/mcp\n  auth: {{type: bearer, api_key_env: FIXTURE_TOKEN}}\n- name: gone\n  command: steppe-no-such-mcp-server\n\
             agents:\n- name: researcher\n  source: {{model: openrouter/x/y}}\n  tools: [{grant}]\njobs:\n- name: j\n  plan:\n  - task: before\n    run: echo the first step ran\n  - agent: researcher\n    messages: [Look.]\n",
            first.trim()
        )
    };
    std::fs::write(work.join("wrong-tool.yml"), pipeline("{mcp: remote, tool: nosuch}")).expect("write");
    std::fs::write(work.join("no-program.yml"), pipeline("{mcp: gone}")).expect("write");
    std::fs::write(work.join("fine.yml"), pipeline("{mcp: remote, tool: lookup}")).expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - say: done\n").expect("write");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).env_remove("STEPPE_MODEL").env("FIXTURE_TOKEN", "tok").output().expect("run");
        (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    };
    let (code, t) = run(&["run", "wrong-tool.yml", "--script", "s.yaml"]);
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("preflight failed, no steps were run") && t.contains("agent \"researcher\": MCP server \"remote\" has no tool named \"nosuch\"") && t.contains("lookup"), "{t}");
    assert!(!t.contains("the first step ran"), "{t}");
    let (code, t) = run(&["run", "no-program.yml", "--script", "s.yaml"]);
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("agent \"researcher\": MCP server \"gone\" cannot start: \"steppe-no-such-mcp-server\" is not on PATH") && !t.contains("the first step ran"), "{t}");
    let (code, t) = run(&["preflight", "wrong-tool.yml"]);
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("has no tool named \"nosuch\""), "{t}");
    let (code, t) = run(&["run", "no-program.yml", "--script", "s.yaml", "--no-preflight"]);
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("the first step ran") && t.contains("MCP server \"gone\" could not start"), "the step itself refuses: {t}");
    let (code, t) = run(&["run", "fine.yml", "--script", "s.yaml"]);
    assert_eq!(code, Some(0), "{t}");
    let (code, t) = run(&["preflight", "fine.yml"]);
    assert!(code == Some(0) && t.contains("ok: agent \"researcher\": MCP server \"remote\""), "{t}");
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


/// An MCP server that signs in with OAuth (the Python SDK's auth server,
/// auto-approving, its access tokens living one second): a step on a machine
/// nobody signed in on fails before its first request, saying what to run;
/// `steppe mcp login` registers, sends the browser (curl here) to the
/// authorization URL and catches the redirect; the step then reaches the
/// server with the token, and a later run refreshes the expired token
/// without a word. The token is never printed.
#[test]
fn an_oauth_mcp_server_is_signed_in_to_and_its_token_refreshed() {
    use std::io::BufRead;
    let work = common::scratch("agents-mcp-oauth");
    let python = venv_python();
    let server = common::repo("tests/support/mcp_oauth_server.py").display().to_string();
    let mut oauth = common::child_of_this_test(&python).args([server.as_str(), "1"]).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn().expect("the OAuth MCP server");
    let mut first = String::new();
    std::io::BufReader::new(oauth.stdout.take().expect("stdout")).read_line(&mut first).expect("its port");
    let port = first.trim().to_string();
    std::fs::write(
        work.join("p.yml"),
        format!(
            "mcp_servers:\n- name: tracker\n  endpoint: http://127.0.0.1:{port}/mcp\n  auth: {{type: oauth}}\n\
             agents:\n- name: w\n  source: {{model: openrouter/x/y}}\n  tools: [{{mcp: tracker, tool: whoami}}]\njobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Who am I?]\n"
        ),
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  rules:\n    - when: {tool_result_contains: authorized as}\n      say: signed in fine\n    - call: tracker__whoami\n      args: {}\n").expect("write");
    let config = work.join("config");
    let run = || {
        let o = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--script", "s.yaml"]).current_dir(&work).env("XDG_CONFIG_HOME", &config).env_remove("STEPPE_MODEL").output().expect("run");
        (o.status.code(), common::text(&o))
    };
    let (code, t) = run();
    assert_ne!(code, Some(0), "{t}");
    assert!(t.contains("MCP server \"tracker\": nobody has signed in to it on this machine: run `steppe mcp login"), "{t}");
    // The sign-in: the URL printed, followed as a browser would (curl), the redirect caught.
    let mut login = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["mcp", "login", "p.yml", "tracker", "--no-browser"])
        .current_dir(&work)
        .env("XDG_CONFIG_HOME", &config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("login");
    let mut out = std::io::BufReader::new(login.stdout.take().expect("stdout"));
    let mut url = String::new();
    out.read_line(&mut url).expect("the URL");
    assert!(url.starts_with(&format!("http://127.0.0.1:{port}/authorize?")) && url.contains("code_challenge_method=S256"), "{url}");
    let browser = Command::new("curl").args(["-sS", "-L", "--max-time", "20", url.trim()]).output().expect("curl");
    assert!(String::from_utf8_lossy(&browser.stdout).contains("Signed in"), "{}", common::text(&browser));
    let status = login.wait().expect("login");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("the rest");
    assert!(status.success() && rest.contains("signed in to tracker"), "{rest}");
    let stored = config.join("steppe/mcp/tracker.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&stored).expect("credentials").permissions());
    assert_eq!(mode & 0o777, 0o600);
    let creds: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stored).expect("read")).expect("json");
    let token = creds.pointer("/credentials/token_response/access_token").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    assert!(token.len() > 8, "{creds}");
    let (code, t) = run();
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("signed in fine") && !t.contains(&token), "{t}");
    // The access token has expired by now: the next run refreshes it on its own.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (code, t) = run();
    assert_eq!(code, Some(0), "{t}");
    let stats = Command::new("curl").args(["-sS", &format!("http://127.0.0.1:{port}/stats")]).output().expect("curl");
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats");
    assert!(stats["refreshes"].as_u64().unwrap_or(0) >= 1 && stats["codes"].as_u64() == Some(1), "{stats}");
    let _ = oauth.kill();
    let _ = oauth.wait();
}
