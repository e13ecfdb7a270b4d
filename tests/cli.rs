//! The `steppe` binary as a user meets it: help, schema, validate's outputs.

mod common;

use common::{run_steppe as steppe, scratch};

#[test]
fn help_teaches_the_commands() {
    let (code, out, _) = steppe(&["--help"], &std::env::temp_dir());
    assert_eq!(code, 0);
    assert!(out.contains("validate"), "{out}");
    assert!(out.contains("schema"), "{out}");
    assert!(out.contains("Run one job of a pipeline, on this machine."), "each command listed with what it does: {out}");
    let (code, out, _) = steppe(&["validate", "--help"], &std::env::temp_dir());
    assert_eq!(code, 0);
    assert!(out.contains("--syntax-only") && out.contains("--vars-file") && out.contains("Exit status"), "{out}");
}

#[test]
fn schema_is_json_and_rejects_unknown_keys() {
    let (code, out, _) = steppe(&["schema"], &std::env::temp_dir());
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("schema is JSON");
    assert_eq!(v["type"], "object");
    assert_eq!(v["additionalProperties"], false);
    for key in ["jobs", "resources", "resource_types", "agents", "tasks", "mcp_servers", "defaults", "workspace", "assert"] {
        assert!(v["properties"].get(key).is_some(), "schema lacks top-level {key}");
    }
    let step = &v["$defs"]["Step"]["properties"];
    for key in ["get", "task", "agent", "messages", "across", "verdicts", "ensemble", "approval", "load_var"] {
        assert!(step.get(key).is_some(), "schema Step lacks {key}");
    }
}

#[test]
fn validate_prints_a_summary_and_reports_every_error_with_positions() {
    let d = scratch("summary");
    std::fs::write(
        d.join("ok.yml"),
        "resource_types:\n- name: t\n  config:\n    check: echo '[]'\n    in: 'true'\nresources:\n- {name: r, type: t}\njobs:\n- name: build\n  plan:\n  - get: r\n  - task: hello\n    run: echo hi\n",
    )
    .expect("write");
    let (code, out, err) = steppe(&["validate", "--syntax-only", "ok.yml"], &d);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "ok: ok.yml (1 job(s), 1 resource(s), 0 agent(s))");

    std::fs::write(
        d.join("bad.yml"),
        "jobs:\n- name: build\n  plan:\n  - task: a\n    run: echo\n    promt: hi\n    attempts: 0\n  - task: b\n    run: echo\n    trigger: true\n",
    )
    .expect("write");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "bad.yml"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("bad.yml:6:5: jobs[0].plan[0].promt: unknown key \"promt\" (did you mean \"prompt\"?)"), "{err}");
    // Decoding problems stop the load (later rules would only echo them) …
    assert!(!err.contains("attempts must be at least 1"), "{err}");

    std::fs::write(
        d.join("rules.yml"),
        "jobs:\n- name: build\n  plan:\n  - task: a\n    run: echo\n    attempts: 0\n  - task: b\n    run: echo\n    trigger: true\n",
    )
    .expect("write");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "rules.yml"], &d);
    assert_eq!(code, 2);
    // … while every rule violation is reported together.
    assert!(err.contains("rules.yml:6:5: jobs[0].plan[0].attempts: attempts must be at least 1"), "{err}");
    assert!(err.contains("rules.yml:9:5: jobs[0].plan[1].trigger: trigger is only valid on get steps"), "{err}");
    assert!(err.contains("2 problem(s)"), "{err}");
}

#[test]
fn vars_are_substituted_and_unresolved_ones_named() {
    let d = scratch("vars");
    std::fs::write(d.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo ((greeting)) ((who))\n").expect("write");
    std::fs::write(d.join("vars.yml"), "greeting: hello\nwho: file\n").expect("write");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "p.yml"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("references ((greeting)), which is neither passed with --var/--vars-file"), "{err}");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "p.yml", "--vars-file", "vars.yml"], &d);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "p.yml", "--var", "greeting=hi"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("((who))") && !err.contains("((greeting))"), "{err}");
    let (code, _, err) = steppe(&["validate", "p.yml", "--var", "bad name=x"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("is not a variable name"), "{err}");
}

#[test]
fn machine_checks_run_unless_syntax_only() {
    let d = scratch("machine");
    std::fs::write(
        d.join("p.yml"),
        "agents:\n- name: a\n  source: {model: openrouter/x/y, api_key_env: STEPPE_TEST_SURELY_UNSET_KEY}\n  tools: [{mcp: srv}]\nmcp_servers:\n- {name: srv, command: steppe-no-such-mcp-binary}\njobs:\n- name: j\n  plan:\n  - agent: a\n    messages: [hi]\n",
    )
    .expect("write");
    let (code, _, err) = steppe(&["validate", "--syntax-only", "p.yml"], &d);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = steppe(&["validate", "p.yml"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("STEPPE_TEST_SURELY_UNSET_KEY"), "{err}");
    assert!(err.contains("steppe-no-such-mcp-binary") && err.contains("not on PATH"), "{err}");
}

#[test]
fn unreadable_and_empty_files_are_clear_errors() {
    let d = scratch("empty");
    let (code, _, err) = steppe(&["validate", "missing.yml"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("missing.yml") && err.contains("cannot read"), "{err}");
    std::fs::write(d.join("empty.yml"), "# nothing\n").expect("write");
    let (code, _, err) = steppe(&["validate", "empty.yml"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("empty"), "{err}");
}

/// Nothing the language accepts is silently ignored: a key this build does
/// not act on loads with a warning that names it and where it is, on
/// validate, run and test alike, and the run still goes.
#[test]
fn keys_not_honoured_yet_are_warned_about_with_positions() {
    let d = scratch("unhonoured");
    std::fs::write(
        d.join("p.yml"),
        "resource_types:\n- name: t\n  config:\n    check: echo '[{\"v\":\"1\"}]'\n    in: 'true'\nresources:\n- {name: r, type: t, webhook_token_env: HOOK_TOKEN}\nworkspace:\n  strategy: btrfs\n  root: ws\njobs:\n- name: build\n  serial: true\n  plan:\n  - get: r\n    trigger: true\n  - task: hello\n    volatile: true\n    run: echo hi\n",
    )
    .expect("write");
    let (code, out, err) = steppe(&["validate", "--syntax-only", "p.yml"], &d);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("p.yml:9:3: workspace.strategy: warning: workspace: is not honoured by this build yet: btrfs"), "{err}");
    assert!(!err.contains("trigger:") && !err.contains("serial:") && !err.contains("webhook_token_env:") && !err.contains("volatile:"), "what steppe honours loads quietly: {err}");
    let (code, out, err) = steppe(&["run", "p.yml"], &d);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("workspace: is not honoured") && out.contains("[hello] hi"), "{out}{err}");
    std::fs::write(d.join("ok.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo\n").expect("write");
    let (_, _, err) = steppe(&["validate", "--syntax-only", "ok.yml"], &d);
    assert!(!err.contains("warning"), "a pipeline without such keys loads quietly: {err}");
}

/// `test --job` runs one job (the pipeline's assert.execution, which names
/// every job, is not checked then); an unknown job is named with the ones
/// there are; `steppe jobs` lists the jobs with their last run.
#[test]
fn one_job_tested_and_every_job_listed() {
    let d = scratch("jobs");
    std::fs::write(
        d.join("p.yml"),
        "jobs:\n- name: build\n  plan:\n  - task: hi\n    run: echo built\n- name: deploy\n  plan:\n  - task: no\n    run: exit 1\nassert:\n  execution: [build, deploy]\n",
    )
    .expect("write");
    let (code, out, err) = steppe(&["test", "p.yml", "--job", "build"], &d);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS build") && !out.contains("deploy") && out.contains("1/1 passed"), "{out}");
    let (code, _, err) = steppe(&["test", "p.yml", "--job", "ship"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("job \"ship\" is not in p.yml; its jobs: build, deploy"), "{err}");
    let (code, out, _) = steppe(&["jobs", "p.yml"], &d);
    assert_eq!(code, 0, "{out}");
    let line = |job: &str| out.lines().find(|l| l.starts_with(job)).unwrap_or_default().to_string();
    assert!(line("build").contains("succeeded") && line("build").contains("r-"), "{out}");
    assert!(line("deploy").contains("never run"), "{out}");
}

/// A coordinator's URL without its scheme says which to add, once.
#[test]
fn a_url_without_a_scheme_says_how_to_write_it() {
    let d = scratch("scheme");
    for args in [&["runs", "--coordinator", "127.0.0.1:9"][..], &["worker", "--coordinator", "127.0.0.1:9"][..]] {
        let (code, _, err) = steppe(args, &d);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("http://127.0.0.1:9") && err.matches("scheme").count() == 1, "{err}");
    }
}

/// A coordinator nobody listens at: the cause once, then what to try.
#[test]
fn an_unreachable_coordinator_says_what_to_check() {
    let d = scratch("unreachable");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [&["runs", "--coordinator", &url][..], &["submit", "p.yml", "--coordinator", &url][..]] {
        std::fs::write(d.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: 'true'\n").expect("write");
        let (code, _, err) = steppe(args, &d);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(&format!("cannot reach the coordinator at {url}")), "{err}");
        assert_eq!(err.matches("transport error").count(), 1, "the cause is said once: {err}");
        assert!(err.contains("steppe: hint: is a coordinator listening at") && err.contains("steppe coordinator --listen"), "{err}");
    }
    // A URL that is no URL is said to be one, without the listening hint.
    let (code, _, err) = steppe(&["runs", "--coordinator", "http://[::1"], &d);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--coordinator http://[::1 is not a URL steppe can dial") && !err.contains("hint"), "{err}");
}

/// A failed step comes first, the job assert's verdict after it, each on a line of its own.
#[test]
fn a_failing_jobs_last_lines_name_the_cause_first() {
    let d = scratch("cause");
    std::fs::write(d.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: boom\n    run: exit 3\n  assert:\n    execution: [boom, never]\n").expect("write");
    let (code, out, _) = steppe(&["run", "p.yml"], &d);
    assert_eq!(code, 1, "{out}");
    let tail: Vec<&str> = out.lines().rev().take(4).collect::<Vec<_>>().into_iter().rev().collect();
    assert_eq!(tail, ["job j failed: boom: exit status 3", "  assert.execution mismatch", "    want: [boom, never]", "    got:  [boom]"], "{out}");
}

/// `-q` through a coordinator prints the verdict only, as it does embedded.
#[test]
fn quiet_means_the_verdict_only_through_a_coordinator_too() {
    let d = scratch("quiet");
    std::fs::write(d.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: talk\n    run: echo chatty-output\n").expect("write");
    let (mut coord, url, _log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "1", "--state", "state"], &d);
    for args in [&["run", "p.yml", "-q", "--coordinator", &url][..], &["submit", "p.yml", "-q", "--coordinator", &url][..]] {
        let (code, out, err) = steppe(args, &d);
        assert_eq!(code, 0, "{out}{err}");
        assert_eq!(format!("{out}{err}").trim(), "job j succeeded", "{args:?}");
    }
    // --force: the same chain ran above, and would be skipped.
    let (_, out, _) = steppe(&["run", "p.yml", "--coordinator", &url, "--force"], &d);
    assert!(out.contains("chatty-output"), "without -q the steps show: {out}");
    common::stop([&mut coord]);
}

/// A step that prints `first`, waits for the file `go` in the test's
/// directory, prints `second`; then a step that fails with exit 3.
fn gated_pipeline(d: &std::path::Path) {
    let go = d.join("go");
    std::fs::write(
        d.join("gated.yml"),
        format!("jobs:\n- name: gated\n  plan:\n  - task: wait\n    run: echo first; while [ ! -e '{}' ]; do sleep 0.1; done; echo second\n  - task: last\n    run: exit 3\n", go.display()),
    )
    .expect("write");
}

/// Lines a child prints, as they come, for a test to wait on.
fn lines_of(child: &mut std::process::Child) -> common::Log {
    let log = common::Log::default();
    let out = child.stdout.take().expect("stdout");
    common::keep_lines(std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok), &log);
    log
}

/// Follows the gated run from another process while its first step runs:
/// the step's line arrives before it ends, --steps and --logs show it
/// running, and following ends with the run's exit code.
fn follow_the_gated_run(d: &std::path::Path, remote: &[&str]) {
    use std::time::Duration;
    fn joined<'a>(args: &[&'a str], remote: &[&'a str]) -> Vec<&'a str> {
        [args, remote].concat()
    }
    let with = |args: &[&'static str]| joined(args, remote);
    common::wait_for("the run's first step to run", Duration::from_secs(30), || steppe(&with(&["runs", "gated.yml", "--steps"]), d).1.lines().any(|l| l.starts_with("wait ") && l.contains("running")));
    let (_, steps, _) = steppe(&with(&["runs", "gated.yml", "--steps"]), d);
    let row = steps.lines().find(|l| l.starts_with("wait ")).unwrap_or_else(|| panic!("{steps}"));
    assert!(row.contains("running") && row.split_whitespace().any(|w| w.ends_with('s') && w.chars().next().is_some_and(|c| c.is_ascii_digit())), "running with its elapsed time: {steps}");
    common::wait_for("the first line to be recorded", Duration::from_secs(10), || steppe(&with(&["runs", "gated.yml", "--logs"]), d).1.contains("[wait] first"));
    let (_, logs, _) = steppe(&with(&["runs", "gated.yml", "--logs"]), d);
    assert!(logs.contains("wait is still running; its output so far:"), "{logs}");
    let mut from_start = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(with(&["runs", "gated.yml", "--follow"])).current_dir(d).stdout(std::process::Stdio::piped()).spawn().expect("follow");
    let mut from_now = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(with(&["runs", "gated.yml", "--follow", "--from-now"])).current_dir(d).stdout(std::process::Stdio::piped()).spawn().expect("follow");
    let (seen, seen_now) = (lines_of(&mut from_start), lines_of(&mut from_now));
    let has = |log: &common::Log, what: &str| log.lock().map(|l| l.contains(what)).unwrap_or(false);
    common::wait_for("the follower to print the running step's line", Duration::from_secs(10), || has(&seen, "[wait] first"));
    common::wait_for("the follower from now to list the running step", Duration::from_secs(10), || has(&seen_now, "… wait running for"));
    assert!(!has(&seen, "second") && !has(&seen, "✔ wait"), "the step has not ended yet");
    std::fs::write(d.join("go"), "").expect("go");
    for (mut child, log) in [(from_start, seen), (from_now, seen_now)] {
        let status = child.wait().expect("follow ends");
        common::wait_for("the follower's last line", Duration::from_secs(5), || has(&log, " failed in "));
        let text = log.lock().map(|l| l.clone()).unwrap_or_default();
        assert_eq!(status.code(), Some(1), "following exits as the run did: {text}");
        for want in ["[wait] second", "✔ wait (", "▶ last", "✘ last failed", "last: exit status 3"] {
            assert!(text.contains(want), "{want:?} in {text}");
        }
    }
}

/// `runs --follow` follows a run started elsewhere, embedded.
#[test]
fn a_detached_run_is_followed_live_on_its_own_store() {
    let d = scratch("follow-embedded");
    gated_pipeline(&d);
    let mut run = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "gated.yml"]).current_dir(&d).stdout(std::process::Stdio::null()).spawn().expect("run");
    follow_the_gated_run(&d, &[]);
    assert_eq!(run.wait().expect("run").code(), Some(1));
}

/// The same through a coordinator, whose log lines carry the run and pipeline.
#[test]
fn a_detached_run_is_followed_live_through_a_coordinator() {
    let d = scratch("follow-cluster");
    gated_pipeline(&d);
    let (mut coord, url, log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "1", "--state", "state", "--log-format", "json"], &d);
    let (code, out, err) = steppe(&["submit", "gated.yml", "--detach", "--coordinator", &url], &d);
    assert_eq!(code, 0, "{out}{err}");
    follow_the_gated_run(&d, &["--coordinator", &url]);
    common::stop([&mut coord]);
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a JSON line: {l:?}: {e}"))).collect();
    let run_id = out.trim();
    let about_run: Vec<&serde_json::Value> = lines.iter().filter(|l| l["run"] == run_id).collect();
    assert!(about_run.iter().any(|l| l["message"] == "[wait] first" && l["pipeline"] == "gated" && l["job"] == "gated"), "{log}");
    assert!(about_run.iter().any(|l| l["message"] == "run failed" && l["outcome"] == "failed"), "{log}");
    assert!(lines.iter().any(|l| l["level"] == "WARN" && l["message"].as_str().is_some_and(|m| m.contains("no --auth or --token-file"))), "{log}");
}

/// A coordinator writes its log a batch at a time: every line still comes,
/// in order, a warning at once, and what is pending when it is told to stop
/// goes out before it ends.
#[test]
fn a_busy_coordinators_log_keeps_every_line_in_order() {
    use std::time::Duration;
    let d = scratch("log-batches");
    std::fs::write(d.join("many.yml"), common::across(60, 2, "true")).expect("write");
    let (mut coord, url, log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "2", "--state", "state"], &d);
    let seen = || log.lock().map(|l| l.clone()).unwrap_or_default();
    // A warning is written the moment it is logged.
    common::wait_for("the startup warning", Duration::from_secs(5), || seen().contains("no --auth or --token-file"));
    let (code, out, err) = steppe(&["submit", "many.yml", "--coordinator", &url, "-q"], &d);
    assert_eq!(code, 0, "{out}{err}");
    let term = std::process::Command::new("kill").args(["-TERM", &coord.id().to_string()]).status().expect("kill");
    assert!(term.success());
    assert!(coord.wait().expect("coordinator").success());
    common::wait_for("the last line", Duration::from_secs(5), || seen().contains("steppe coordinator: stopping"));
    let text = seen();
    let at = |line: &str| text.find(line).unwrap_or_else(|| panic!("{line:?} is in the log:\n{text}"));
    let mut last = 0;
    for i in 0..60 {
        let (began, ended) = (at(&format!("▶ cell [i={i}]")), at(&format!("✔ cell [i={i}]")));
        assert!(began < ended, "cell {i} began before it ended:\n{text}");
        last = last.max(ended);
    }
    assert!(last < at("run succeeded") && at("run succeeded") < at("steppe coordinator: stopping"), "{text}");
}

/// A step no worker can take is said on its run, with the command that
/// starts one; started, the worker takes it and the run ends.
#[test]
fn a_pool_without_workers_is_said_with_what_to_start() {
    use std::time::Duration;
    let d = scratch("pool-wait");
    std::fs::write(d.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo ran\n").expect("write");
    let (mut coord, url, _log) = common::serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"], &d);
    let mut submit = common::child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["submit", "p.yml", "--pool", "gpu", "--coordinator", &url]).current_dir(&d).stdout(std::process::Stdio::piped()).spawn().expect("submit");
    let seen = lines_of(&mut submit);
    let has = |what: &str| seen.lock().map(|l| l.contains(what)).unwrap_or(false);
    common::wait_for("the wait to be said", Duration::from_secs(15), || has("has waited"));
    let text = seen.lock().map(|l| l.clone()).unwrap_or_default();
    assert!(text.contains("⧗ t has waited") && text.contains("for a worker of pool gpu, and none is connected"), "{text}");
    assert!(text.contains("steppe worker --coordinator URL --pool gpu"), "{text}");
    // The note is an event of the run, as --events shows.
    common::wait_for("the note among the run's events", Duration::from_secs(5), || steppe(&["runs", "--coordinator", &url, "--events"], &d).1.contains("for a worker of pool gpu"));
    let mut worker = common::spawn_worker(&url, &["--pool", "gpu", "--slots", "1"]);
    assert_eq!(submit.wait().expect("submit").code(), Some(0));
    assert!(seen.lock().map(|l| l.contains("[t] ran")).unwrap_or(false));
    common::stop([&mut worker, &mut coord]);
}

/// `steppe completions SHELL` prints a script that knows the commands and flags.
#[test]
fn completions_know_the_commands_and_flags() {
    let d = scratch("completions");
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = steppe(&["completions", shell], &d);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("steppe") && out.contains("follow") && out.contains("validate"), "{shell}: {out}");
    }
    let (code, _, err) = steppe(&["completions", "tcsh"], &d);
    assert_eq!(code, 2);
    assert!(err.contains("bash") && err.contains("zsh"), "the shells it knows are named: {err}");
}
