//! The dashboard in a real browser: headless Chromium driven over WebDriver
//! (chromedriver, from Debian; `scripts/test` installs both). Runs watched
//! live without a reload, a transcript opened, an approval decided from
//! the page, hostile names kept as text, and a coordinator's pages behind
//! a sign-in scoped to the token's team. Screenshots go to
//! `$CARGO_TARGET_TMPDIR/screenshots`.

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use fantoccini::{Client, ClientBuilder, Locator};

/// chromedriver on a free port, and a headless Chromium session through it.
struct Browser {
    driver: std::process::Child,
    client: Client,
    rt: tokio::runtime::Runtime,
}

impl Browser {
    fn start() -> Browser {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
        let driver = child_of_this_test("chromedriver").arg(format!("--port={port}")).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("chromedriver (scripts/test installs it)");
        wait_for("chromedriver", Duration::from_secs(20), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        let mut caps = serde_json::Map::new();
        caps.insert("goog:chromeOptions".into(), serde_json::json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"]}));
        let client = rt
            .block_on(ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new()).capabilities(caps).connect(&format!("http://127.0.0.1:{port}")))
            .expect("a Chromium session");
        Browser { driver, client, rt }
    }

    fn goto(&self, url: &str) {
        self.rt.block_on(self.client.goto(url)).expect("goto");
    }

    fn js(&self, script: &str) -> serde_json::Value {
        self.rt.block_on(self.client.execute(script, vec![])).expect("script")
    }

    fn text_of(&self, css: &str) -> String {
        self.rt.block_on(async { self.client.find(Locator::Css(css)).await?.text().await }).unwrap_or_default()
    }

    fn click(&self, css: &str) {
        self.rt.block_on(async { self.client.find(Locator::Css(css)).await?.click().await }).unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    fn type_into(&self, css: &str, text: &str) {
        self.rt.block_on(async { self.client.find(Locator::Css(css)).await?.send_keys(text).await }).unwrap_or_else(|e| panic!("type into {css}: {e}"));
    }

    fn shot(&self, name: &str) -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let png = self.rt.block_on(self.client.screenshot()).expect("screenshot");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let client = self.client.clone();
        let _ = self.rt.block_on(client.close());
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `steppe web` (or any serving command) and the URL its first line names.
fn dashboard(args: &[&str], dir: &std::path::Path) -> (std::process::Child, String) {
    let mut child = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(dir).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("steppe web");
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().expect("stdout")), &mut first).expect("its first line");
    let url = first.split_whitespace().find(|w| w.starts_with("http://")).unwrap_or_else(|| panic!("no URL in {first:?}")).trim_end_matches('/').to_string();
    (child, url)
}

#[test]
fn a_pipelines_dashboard_in_a_browser() {
    let work = scratch("dashboard");
    let hostile = "<script>window.__pwned=1</script>";
    std::fs::write(
        work.join("p.yml"),
        format!(
            "agents:\n- name: helper\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\n- name: asker\n  source: {{model: openrouter/x/y}}\n  tools: [{{builtin: ask_user, timeout: 2m}}]\njobs:\n\
             - name: asks\n  plan:\n  - agent: asker\n    messages: [Ask which colour.]\n\
             - name: slow\n  plan:\n  - task: first\n    run: sleep 1; echo one\n  - in_parallel:\n    - {{task: left, run: sleep 1}}\n    - {{task: right, run: sleep 1.5}}\n  - task: last\n    run: sleep 0.5; echo done\n\
             - name: gated\n  plan:\n  - approval:\n      message: Ship it?\n      timeout: 2m\n  - task: deploy\n    run: echo deployed\n\
             - name: talk\n  plan:\n  - agent: helper\n    messages: [Look around.]\n\
             - name: hostile\n  plan:\n  - task: \"{hostile}\"\n    run: echo '<img src=x onerror=\"window.__pwned=2\">'\n"
        ),
    )
    .expect("write");
    // Runs to look at: an agent's transcript, a hostile one.
    std::fs::write(work.join("s.yaml"), "model:\n  turns:\n    - calls:\n        - {name: run_shell, args: {command: echo tool-output-here}}\n    - say: looked around\n").expect("write");
    assert_eq!(steppe(&["run", "p.yml", "--job", "talk", "--script", "s.yaml"], &work).status.code(), Some(0));
    assert_eq!(steppe(&["run", "p.yml", "--job", "hostile"], &work).status.code(), Some(0));
    let (mut web, url) = dashboard(&["web", "p.yml", "--listen", "127.0.0.1:0"], &work);
    let b = Browser::start();

    // A live run: its page updates without a reload until every step is green.
    let mut slow = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "slow"]).current_dir(&work).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("run");
    b.goto(&format!("{url}/"));
    wait_for("the slow run listed", Duration::from_secs(20), || {
        b.goto(&format!("{url}/?job=slow"));
        b.text_of("#runs").contains("slow")
    });
    b.click("#runs a");
    wait_for("a running run's page, live", Duration::from_secs(10), || b.js("return !!document.querySelector('[data-live]')").as_bool().unwrap_or(false));
    b.js("window.__same_page = 1; return 0");
    b.shot("run-live");
    wait_for("every step green, live", Duration::from_secs(30), || b.text_of("#state").contains("succeeded"));
    assert_eq!(b.js("return window.__same_page || 0").as_i64(), Some(1), "the page was never reloaded");
    let steps = b.text_of("#steps");
    for s in ["first", "left", "right", "last"] {
        assert!(steps.contains(s), "{steps}");
    }
    assert_eq!(b.js("return document.querySelectorAll('#graph .node.ok').length").as_i64().map(|n| n >= 5), Some(true), "the plan graph: {}", b.text_of("#graph"));
    assert!(b.text_of("#waterfall").contains("execute left"), "{}", b.text_of("#waterfall"));
    b.shot("run-done");
    assert_eq!(slow.wait().expect("wait").code(), Some(0));

    // A transcript.
    b.goto(&format!("{url}/?job=talk"));
    b.click("#runs a");
    wait_for("the run's steps", Duration::from_secs(10), || !b.text_of("#steps").is_empty());
    b.click("#steps a");
    wait_for("the transcript", Duration::from_secs(10), || b.text_of("#transcript").contains("looked around"));
    let transcript = b.text_of("#transcript");
    assert!(transcript.contains("run_shell") && transcript.contains("tool-output-here") && transcript.contains("looked around"), "{transcript}");
    b.shot("transcript");

    // An approval decided from the page: the run goes on.
    let gated = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "gated"]).current_dir(&work).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("run");
    wait_for("the approval listed", Duration::from_secs(20), || {
        b.goto(&format!("{url}/approvals"));
        b.text_of("#approvals").contains("Ship it?")
    });
    b.shot("approvals");
    b.click("#approvals button[value=approve]");
    let out = gated.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("deployed"));
    b.goto(&format!("{url}/approvals"));
    assert!(!b.text_of("#approvals").contains("Ship it?"));

    // A parked question answered from the page: the agent reads the answer.
    std::fs::write(work.join("q.yaml"), "model:\n  rules:\n    - when: {tool_result_contains: '\"answer\":\"teal\"'}\n      say: painting it teal\n    - call: ask_user\n      args: {question: 'Which colour? <b>not bold</b>', options: [teal, red]}\n").expect("write");
    let asks = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "asks", "--script", "q.yaml"]).current_dir(&work).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("run");
    wait_for("the question listed", Duration::from_secs(20), || {
        b.goto(&format!("{url}/approvals"));
        b.text_of("#questions").contains("Which colour? <b>not bold</b>")
    });
    assert!(b.text_of("#questions").contains("options: teal | red") && b.text_of("#questions").contains("asker"), "{}", b.text_of("#questions"));
    b.type_into("#questions input[name=answer]", "teal");
    b.shot("questions");
    b.click("#questions button");
    let out = asks.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("painting it teal"), "{}", String::from_utf8_lossy(&out.stdout));
    b.goto(&format!("{url}/approvals"));
    assert!(b.text_of("#questions").contains("no question waits"), "{}", b.text_of("#questions"));

    // Hostile names and output stay text, on the runs list, the run and the step.
    b.goto(&format!("{url}/?job=hostile"));
    b.click("#runs a");
    wait_for("the hostile run's steps", Duration::from_secs(10), || b.text_of("#steps").contains(hostile));
    b.click("#steps a");
    wait_for("the hostile step's log", Duration::from_secs(10), || b.text_of("#log").contains("<img src=x onerror="));
    assert!(b.js("return window.__pwned === undefined").as_bool().unwrap_or(false), "a pipeline's text ran as script");
    b.shot("hostile");

    // A forged form (no CSRF token) is refused.
    let forged = std::process::Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST", "-d", "decision=approve", &format!("{url}/approvals/1")]).output().expect("curl");
    assert_eq!(String::from_utf8_lossy(&forged.stdout), "403");
    // A page of another name that resolves here (DNS rebinding) is refused.
    let rebound = std::process::Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Host: evil.example", &format!("{url}/")]).output().expect("curl");
    assert_eq!(String::from_utf8_lossy(&rebound.stdout), "403");
    drop(b);
    stop([&mut web]);
}

#[test]
fn a_coordinators_dashboard_signs_in_by_token_and_shows_a_team_its_own() {
    let work = scratch("dashboard-cluster");
    let token = |file: &str, args: &[&str]| {
        let out = steppe(&[&["token", "new", "--append-to", "auth.yml"][..], args].concat(), &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        std::fs::write(work.join(file), &out.stdout).expect("write token");
    };
    token("blue.token", &["--team", "blue", "--role", "submit"]);
    token("red.token", &["--team", "red", "--role", "submit"]);
    token("worker.token", &["--team", "ops", "--role", "worker"]);
    let web_port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let web_addr = format!("127.0.0.1:{web_port}");
    let (mut coord, url, _log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--auth", "auth.yml", "--web", &web_addr], &work);
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--token-file", "worker.token", "--slots", "2"]).current_dir(&work).stderr(Stdio::null()).spawn().expect("worker");
    for team in ["blue", "red"] {
        std::fs::write(work.join(format!("{team}.yml")), format!("jobs:\n- name: {team}-job\n  plan:\n  - task: hello\n    run: echo {team}\n")).expect("write");
        let out = steppe(&["submit", &format!("{team}.yml"), "--coordinator", &url, "--token-file", &format!("{team}.token")], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let site = format!("http://{web_addr}");
    wait_for("the dashboard", Duration::from_secs(10), || std::net::TcpStream::connect(&web_addr).is_ok());
    let b = Browser::start();
    b.goto(&format!("{site}/"));
    assert!(b.rt.block_on(b.client.current_url()).expect("url").path().ends_with("/login"), "signed out: to the sign-in page");
    b.type_into("input[name=token]", "not-a-token");
    b.click("button");
    // The click's navigation may not have landed when the page is first read.
    wait_for("the refusal of an unknown token", Duration::from_secs(10), || b.text_of("main").contains("not known"));
    let blue = std::fs::read_to_string(work.join("blue.token")).expect("token");
    b.goto(&format!("{site}/login"));
    b.type_into("input[name=token]", blue.trim());
    b.click("button");
    // The runs page after signing in (under load the click's navigation can take a moment).
    wait_for("blue's runs page", Duration::from_secs(10), || b.text_of("#runs").contains("blue-job"));
    let runs = b.text_of("#runs");
    assert!(runs.contains("blue-job") && !runs.contains("red-job"), "blue sees its own runs only: {runs}");
    let cookie = b.js("return document.cookie").as_str().unwrap_or_default().to_string();
    assert!(!cookie.contains("steppe_session"), "the session cookie is HttpOnly: {cookie}");
    b.goto(&format!("{site}/fleet"));
    wait_for("the worker on the fleet page", Duration::from_secs(10), || {
        b.goto(&format!("{site}/fleet"));
        b.text_of("#workers").contains("ops") || b.text_of("#workers").contains("remote")
    });
    b.shot("fleet");
    drop(b);
    stop([&mut worker, &mut coord]);
}
