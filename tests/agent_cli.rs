//! CLI-backed agents (`@claude/<model>`): the step's CLI spawned with the
//! documented flags, its tools served by the loopback MCP bridge, its init
//! event attested, a crashed attempt resumed in the same session. The CLI
//! is `tests/support/fake_claude.py`, which speaks the claude CLI's
//! stream-json protocol and calls the bridge with the Python `mcp` client.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{repo, scratch, text, venv_python};

/// A directory holding `claude` (the fake), to put first on PATH.
fn fake_cli(work: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let script = format!("#!/bin/sh\nexec '{}' '{}' \"$@\"\n", venv_python(), repo("tests/support/fake_claude.py").display());
    std::fs::write(bin.join("claude"), script).expect("write");
    std::fs::set_permissions(bin.join("claude"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

fn path_with(bin: &Path) -> String {
    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
}

const PIPELINE: &str = r#"agents:
- name: reviewer
  source: { model: "@claude/sonnet" }
  reasoning_effort: high
  tools:
  - write_file
  - builtin: ask_user
  budget: { usd: 0.5 }
jobs:
- name: review
  plan:
  - agent: reviewer
    outputs: [review]
    dir: review
    messages: [Review this.]
    verdicts: [approve, reject]
    assert:
      verdict: approve
      files: [review/note.txt]
      tool_calls:
      - name: write_file
"#;

/// `steppe ARGS` in `work` with the fake CLI on PATH, in `mode`, its
/// invocations logged to `work/cli.log`.
fn steppe(work: &Path, mode: &str, path: Option<&str>, args: &[&str]) -> Output {
    let bin = fake_cli(work);
    let path = path.map(str::to_string).unwrap_or_else(|| path_with(&bin));
    Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(args)
        .current_dir(work)
        .env("PATH", path)
        .env("FAKE_CLAUDE_MODE", mode)
        .env("FAKE_CLAUDE_LOG", work.join("cli.log"))
        .env_remove("STEPPE_MODEL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run")
}

/// Each invocation of the CLI the run made: its argv and stdin.
fn invocations(work: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(work.join("cli.log")).unwrap_or_default().lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn argv(inv: &serde_json::Value) -> Vec<String> {
    inv["argv"].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

fn flag_value(argv: &[String], name: &str) -> Option<String> {
    argv.iter().position(|a| a == name).and_then(|i| argv.get(i + 1)).cloned()
}

/// The CLI is spawned as the spec says, reaches every granted tool over the
/// bridge (files written where the step's other tools write them, the
/// question answered by steppe, the verdict captured by steppe), and its
/// reported cost and turns are the step's.
#[test]
fn a_cli_agent_runs_its_tools_through_the_bridge() {
    let work = scratch("agent-cli");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let o = steppe(&work, "work", None, &["run", "p.yml", "--answer", "colour=teal"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("done (fresh)") && t.contains("colour teal"), "{t}");
    assert!(t.contains("→ write_file") && t.contains("→ verdict"), "bridged calls are said as a hosted agent's are: {t}");
    let runs = invocations(&work);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let a = argv(&runs[0]);
    for f in ["--print", "--verbose", "--strict-mcp-config"] {
        assert!(a.contains(&f.to_string()), "{f} in {a:?}");
    }
    assert_eq!(flag_value(&a, "--output-format").as_deref(), Some("stream-json"));
    assert_eq!(flag_value(&a, "--model").as_deref(), Some("sonnet"));
    assert_eq!(flag_value(&a, "--tools").as_deref(), Some(""), "no built-in of its own: {a:?}");
    assert_eq!(flag_value(&a, "--setting-sources").as_deref(), Some(""));
    assert_eq!(flag_value(&a, "--max-budget-usd").as_deref(), Some("0.5000"));
    assert!(flag_value(&a, "--session-id").is_some_and(|u| u.len() == 36 && u.as_bytes()[14] == b'4'), "a v4 session id: {a:?}");
    let allowed = flag_value(&a, "--allowedTools").unwrap_or_default();
    let mut allowed: Vec<&str> = allowed.split(',').collect();
    allowed.sort();
    assert_eq!(allowed, ["mcp__steps__ask_user", "mcp__steps__verdict", "mcp__steps__write_file"]);
    assert!(runs[0]["stdin"].as_str().unwrap_or_default().contains("Review this."), "the prompt goes on stdin: {runs:?}");
    assert_eq!(runs[0]["thinking"].as_str(), Some("31999"), "reasoning_effort: high");
    assert!(flag_value(&a, "--append-system-prompt").is_some_and(|s| s.contains("working directory")));
    // The bridge's config is gone with the step; its token was for this attempt only.
    let config = flag_value(&a, "--mcp-config").unwrap_or_default();
    assert!(!config.is_empty() && !Path::new(&config).exists(), "{config}");
    // Recorded as a hosted step is: trajectory, transcript, the provider's cost.
    let t = text(&Command::new(env!("CARGO_BIN_EXE_steppe")).args(["runs", "p.yml", "--transcript"]).current_dir(&work).output().expect("runs"));
    assert!(t.contains("call     write_file") && t.contains("result   ask_user") && t.contains("\"source\":\"preset\""), "{t}");
    let t = text(&Command::new(env!("CARGO_BIN_EXE_steppe")).args(["runs", "p.yml", "--cost"]).current_dir(&work).output().expect("runs"));
    assert!(t.contains("$0.0125") && t.contains("1,600"), "the CLI's own cost and tokens: {t}");
}

/// A CLI whose init event lists a tool it was not granted is stopped at
/// once: an infrastructure error naming the tool, not retried.
#[test]
fn a_cli_that_lies_in_its_init_event_is_stopped() {
    let work = scratch("agent-cli-lie");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let o = steppe(&work, "lie", None, &["run", "p.yml", "--answer", "colour=teal"]);
    let t = text(&o);
    assert_ne!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("does not hold exactly the granted tools (not granted: Bash; missing: none)") && t.contains("errored"), "{t}");
    assert_eq!(invocations(&work).len(), 1, "never retried");
}

/// A CLI that dies mid-run is resumed in the same session, told what
/// happened and that its calls are in place; the step finishes.
#[test]
fn a_cli_that_dies_mid_run_is_resumed_in_its_session() {
    let work = scratch("agent-cli-die");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let o = steppe(&work, "die-once", None, &["run", "p.yml", "--answer", "colour=teal"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("ended without a result (exit 3: fake claude: dying on purpose); resuming its session (attempt 2 of 3)") && t.contains("done (resumed)"), "{t}");
    let runs = invocations(&work);
    assert_eq!(runs.len(), 2, "{runs:?}");
    let (first, second) = (argv(&runs[0]), argv(&runs[1]));
    assert_eq!(flag_value(&first, "--session-id"), flag_value(&second, "--resume"), "the same session: {first:?} {second:?}");
    assert!(flag_value(&second, "--session-id").is_none() && flag_value(&second, "--append-system-prompt").is_none());
    let prompt = runs[1]["stdin"].as_str().unwrap_or_default();
    assert!(prompt.contains("did not finish") && prompt.contains("1 tool call(s) were already made") && prompt.contains("do not restart"), "{prompt}");
    assert!(work.join(".steppe").exists());
}

/// A CLI that reports the task failed fails the step (an answer, not an
/// outage: not retried); one that is not installed fails preflight.
#[test]
fn a_failed_task_fails_and_a_missing_cli_fails_preflight() {
    let work = scratch("agent-cli-fail");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let o = steppe(&work, "fail", None, &["run", "p.yml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("claude reported the task failed: the task could not be done"), "{t}");
    assert_eq!(invocations(&work).len(), 1);
    let o = steppe(&work, "work", Some("/usr/bin:/bin"), &["run", "p.yml"]);
    let t = text(&o);
    assert_ne!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("preflight failed") && t.contains("agent \"reviewer\": @claude/sonnet: claude is not on PATH"), "{t}");
}

/// Through a coordinator: the worker spawns the CLI and serves its bridge;
/// the verdict and the files come back as from any step.
#[test]
fn a_cli_agent_runs_on_a_worker() {
    let work = scratch("agent-cli-cluster");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let bin = fake_cli(&work);
    let (mut coord, url, log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"], &work);
    let mut worker = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--slots", "1"])
        .current_dir(&work)
        .env("PATH", path_with(&bin))
        .env("FAKE_CLAUDE_MODE", "work")
        .env("FAKE_CLAUDE_LOG", work.join("cli.log"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    // Neither the submitter nor the coordinator has claude: the worker that runs the step does.
    let o = steppe(&work, "work", Some("/usr/bin:/bin"), &["run", "p.yml", "--answer", "colour=teal", "--coordinator", &url]);
    let t = text(&o);
    common::stop([&mut worker, &mut coord]);
    assert_eq!(o.status.code(), Some(0), "{t}\ncoordinator:\n{}", log.lock().map(|l| l.clone()).unwrap_or_default());
    assert!(t.contains("done (fresh)") && t.contains("colour teal"), "{t}");
    assert_eq!(invocations(&work).len(), 1);
}

/// `fallback:` both ways at preflight: a hosted agent whose model does not
/// answer runs on its CLI fallback, and says so.
#[test]
fn a_hosted_agent_falls_back_to_a_cli() {
    let work = scratch("agent-cli-fallback");
    let dead = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "agents:\n- name: writer\n  source: {{model: dead-model, endpoint: 'http://127.0.0.1:{dead}/v1/'}}\n  fallback:\n  - source: {{model: \"@claude/haiku\"}}\n  tools: [write_file]\n\
             jobs:\n- name: j\n  plan:\n  - agent: writer\n    messages: [Write a note.]\n"
        ),
    )
    .expect("write");
    let o = steppe(&work, "work", None, &["run", "p.yml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("agent: writer (fallback: @claude/haiku — dead-model is unavailable)") && t.contains("done (fresh)"), "{t}");
    let runs = invocations(&work);
    assert_eq!(runs.len(), 1);
    assert_eq!(flag_value(&argv(&runs[0]), "--model").as_deref(), Some("haiku"));
}

/// `image:` places a CLI agent's tools, never the CLI: its shell command runs
/// in the step's container (another hostname), the CLI on the host.
#[test]
fn a_cli_agents_tools_run_in_its_image() {
    let image = common::test_image();
    let work = scratch("agent-cli-image");
    std::fs::write(
        work.join("p.yml"),
        format!("agents:\n- name: sandboxed\n  source: {{model: \"@claude/sonnet\"}}\n  tools: [run_shell]\n  image: {image}\n  network: none\njobs:\n- name: j\n  plan:\n  - agent: sandboxed\n    messages: [Where are you?]\n"),
    )
    .expect("write");
    let o = steppe(&work, "work", None, &["run", "p.yml"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_string();
    let shell = t.lines().find_map(|l| l.split("shell on ").nth(1)).unwrap_or_default().trim().to_string();
    assert!(!shell.is_empty() && shell != host && shell.chars().all(|c| c.is_ascii_hexdigit()), "the shell ran in a container ({shell:?}, host {host:?}): {t}");
}

/// A CLI that dies before its session begins is asked the same request
/// again in a fresh session (not told to continue a session it never had).
#[test]
fn a_cli_that_dies_before_its_session_is_asked_again() {
    let work = scratch("agent-cli-die-early");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    let o = steppe(&work, "die-early", None, &["run", "p.yml", "--answer", "colour=teal"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    assert!(t.contains("ended before its session began (exit 4: fake claude: no session today); starting it again (attempt 2 of 3)"), "{t}");
    let runs = invocations(&work);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for r in &runs {
        assert!(flag_value(&argv(r), "--session-id").is_some() && r["stdin"].as_str().unwrap_or_default().contains("Review this."), "{r}");
    }
}
