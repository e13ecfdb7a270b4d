//! Pipelines run end to end through the real `steppe` binary.
//!
//! `tests/run/*.yml` check themselves: every job carries `assert:` blocks, so
//! `steppe test` passing means the engine did what the language says.
//! `tests/run/failing/*.yml` must make `steppe test` fail with their
//! `# expect:` fragments (the suite can fail).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

fn fixtures(sub: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/run").join(sub);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/run")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .collect();
    v.sort();
    assert!(!v.is_empty());
    v
}

#[test]
fn self_checking_pipelines_pass() {
    let mut failures = Vec::new();
    for f in fixtures("") {
        let name = f.file_stem().and_then(|s| s.to_str()).unwrap_or("x").to_string();
        let work = scratch(&name);
        // The pipeline runs from a copy, so its .steppe/ state stays out of the tree.
        let copy = work.join(f.file_name().expect("name"));
        std::fs::copy(&f, &copy).expect("copy");
        let counter = work.join("counter").to_string_lossy().into_owned();
        let lp = work.join("loop").to_string_lossy().into_owned();
        let out = steppe(
            &["test", copy.to_str().expect("utf8"), "--var", &format!("counter={counter}"), "--var", &format!("loop={lp}")],
            &work,
        );
        let t = text(&out);
        if out.status.code() != Some(0) || !t.lines().any(|l| l.ends_with(" passed") && l.contains('/')) {
            failures.push(format!("{}: exit {:?}\n{t}", f.display(), out.status.code()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn failing_pipelines_fail_with_their_message() {
    for f in fixtures("failing") {
        let body = std::fs::read_to_string(&f).expect("read");
        let work = scratch("failing");
        let out = steppe(&["test", f.to_str().expect("utf8")], &work);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{}: {t}", f.display());
        for e in body.lines().filter_map(|l| l.strip_prefix("# expect:")).map(str::trim) {
            assert!(t.contains(e), "{}: output lacks {e:?}:\n{t}", f.display());
        }
    }
}

#[test]
fn run_exit_codes_follow_the_outcome() {
    let d = scratch("exit");
    let write = |name: &str, body: &str| std::fs::write(d.join(name), body).expect("write");
    write("ok.yml", "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo hi\n");
    write("failed.yml", "jobs:\n- name: j\n  plan:\n  - task: t\n    run: exit 7\n");
    write(
        "errored.yml",
        "resource_types:\n- name: t\n  config:\n    check: echo not-json\n    in: 'true'\nresources:\n- {name: r, type: t}\njobs:\n- name: j\n  plan:\n  - get: r\n",
    );
    write("two.yml", "jobs:\n- name: a\n  plan:\n  - task: t\n    run: 'true'\n- name: b\n  plan:\n  - task: t\n    run: 'true'\n");
    let out = steppe(&["run", "ok.yml"], &d);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("▶ t") && t.contains("[t] hi") && t.contains("✔ t ("), "{t}");
    let out = steppe(&["run", "failed.yml"], &d);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("exit status 7"), "{}", text(&out));
    let out = steppe(&["run", "errored.yml"], &d);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("could not parse JSON output"), "{}", text(&out));
    let out = steppe(&["run", "two.yml"], &d);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("pick one with --job (a, b)"), "{}", text(&out));
    let out = steppe(&["run", "two.yml", "--job", "bb"], &d);
    assert!(text(&out).contains("did you mean \"b\""), "{}", text(&out));
    assert_eq!(steppe(&["run", "two.yml", "--job", "b"], &d).status.code(), Some(0));
}

#[test]
fn ctrl_c_aborts_with_130_and_hooks_get_their_grace() {
    let d = scratch("abort");
    let marker = d.join("hook-ran");
    std::fs::write(
        d.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: long\n    run: sleep 30\n    on_abort:\n      task: note\n      run: echo aborted > {}\n",
            marker.display()
        ),
    )
    .expect("write");
    let mut child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["run", "p.yml"])
        .current_dir(&d)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    std::thread::sleep(Duration::from_millis(800));
    let t0 = Instant::now();
    let status = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let code = child.wait().expect("wait").code();
    assert_eq!(code, Some(130));
    assert!(t0.elapsed() < Duration::from_secs(10), "abort took {:?}", t0.elapsed());
    assert_eq!(std::fs::read_to_string(&marker).unwrap_or_default().trim(), "aborted");
}

/// The coordinator/worker split is real: the same self-checking pipelines,
/// with no local worker slots, run on a `steppe worker` in another process
/// connected over loopback gRPC.
#[test]
fn pipelines_run_on_a_separate_worker_process() {
    let work = scratch("split");
    for name in ["blocks.yml", "workspace.yml", "resources.yml"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/run").join(name);
        std::fs::copy(&src, work.join(name)).expect("copy");
        let (mut coord, url, lines) = serving(&["test", name, "--workers", "0", "--listen", "127.0.0.1:0"], &work);
        let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
            .args(["worker", "--coordinator", &url, "--slots", "2"])
            .current_dir(std::env::temp_dir())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn worker");
        let rest: Vec<String> = lines.map_while(Result::ok).collect();
        let status = coord.wait().expect("wait coordinator");
        let all = rest.join("\n");
        assert_eq!(status.code(), Some(0), "{name} through a remote worker:\n{all}");
        assert!(all.contains("worker ") && all.contains("joined"), "{all}");
        assert!(rest.iter().any(|l| l.ends_with(" passed")), "{all}");
        let wstatus = worker.wait().expect("wait worker");
        assert_eq!(wstatus.code(), Some(0), "the worker exits cleanly when the coordinator goes");
    }
}

#[test]
fn runs_are_recorded_and_shown() {
    let d = scratch("runs");
    std::fs::write(d.join("p.yml"), "jobs:\n- name: build\n  plan:\n  - task: compile\n    run: echo compiled; echo warn >&2\n  - task: broken\n    run: exit 5\n").expect("write");
    let out = steppe(&["runs", "p.yml"], &d);
    assert!(text(&out).contains("no runs recorded"), "{}", text(&out));
    assert!(!d.join(".steppe").exists(), "a read-only view must not create the store");
    assert_eq!(steppe(&["run", "p.yml"], &d).status.code(), Some(1));
    assert_eq!(steppe(&["run", "p.yml"], &d).status.code(), Some(1));
    let t = text(&steppe(&["runs", "p.yml"], &d));
    assert_eq!(t.lines().filter(|l| l.contains(" build ") && l.contains("failed")).count(), 2, "{t}");
    let t = text(&steppe(&["runs", "p.yml", "--steps"], &d));
    assert!(t.lines().any(|l| l.starts_with("compile") && l.contains("succeeded")), "{t}");
    assert!(
        t.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"broken") && cols.get(1) == Some(&"failed") && cols.get(3) == Some(&"5")
        }),
        "{t}"
    );
    let t = text(&steppe(&["runs", "p.yml", "--events"], &d));
    assert!(t.lines().any(|l| l.starts_with("started") && l.contains("compile")), "{t}");
    assert!(t.lines().any(|l| l.starts_with("ended") && l.contains("broken") && l.contains("failed")), "{t}");
    let t = text(&steppe(&["runs", "p.yml", "--logs"], &d));
    assert!(t.contains("[compile] compiled") && t.contains("[compile] (stderr) warn"), "{t}");
}

#[test]
fn approvals_park_until_decided() {
    let d = scratch("approvals");
    std::fs::write(
        d.join("p.yml"),
        "jobs:\n- name: ship\n  plan:\n  - approval:\n      message: Ship it?\n      timeout: 1m\n  - task: deploy\n    run: echo deployed\n- name: gate\n  plan:\n  - approval:\n      message: Again?\n  - task: never\n    run: echo no\n- name: expire\n  plan:\n  - approval:\n      message: Anyone?\n      timeout: 1s\n",
    )
    .expect("write");
    let wait_pending = |want: &str| {
        let t0 = Instant::now();
        loop {
            let t = text(&steppe(&["approvals", "p.yml"], &d));
            if let Some(line) = t.lines().find(|l| l.contains(want)) {
                return line.split_whitespace().next().expect("id").to_string();
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "no pending approval {want:?}: {t}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Approved: the run continues and succeeds.
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "ship"]).current_dir(&d).stdout(std::process::Stdio::piped()).spawn().expect("spawn");
    let id = wait_pending("Ship it?");
    let t = text(&steppe(&["approve", "p.yml", &id], &d));
    assert!(t.contains(&format!("approved approval {id}")), "{t}");
    let out = child.wait_with_output().expect("wait");
    let t = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("[deploy] deployed") && t.contains("steppe approve p.yml"), "{t}");
    let again = text(&steppe(&["reject", "p.yml", &id], &d));
    assert!(again.contains("already approved"), "re-deciding is an error: {again}");
    // Rejected: the approval step fails (exit 1).
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "gate"]).current_dir(&d).stdout(std::process::Stdio::piped()).spawn().expect("spawn");
    let id = wait_pending("Again?");
    steppe(&["reject", "p.yml", &id, "--reason", "not today"], &d);
    let out = child.wait_with_output().expect("wait");
    let t = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("rejected") && t.contains("not today"), "{t}");
    // Nobody decides: aborted (130).
    let out = steppe(&["run", "p.yml", "--job", "expire"], &d);
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(text(&out).contains("nobody decided within 1s"), "{}", text(&out));
}

/// A worker killed with SIGKILL mid-step loses nothing: its session drops, its
/// assignment goes back on the queue, and another worker runs it.
#[test]
fn a_killed_worker_hands_its_step_to_another() {
    let work = scratch("kill9");
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: j\n  plan:\n  - task: slow\n    outputs: [out]\n    run: echo started; sleep 2; echo done > out/x\n  - task: after\n    inputs: [out]\n    run: cat out/x\n    assert:\n      stdout: done\n  assert:\n    execution: [slow, after]\n",
    )
    .expect("write");
    let (mut coord, url, mut lines) = serving(&["run", "p.yml", "--workers", "0", "--listen", "127.0.0.1:0"], &work);
    let spawn_worker = || {
        child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
            .args(["worker", "--coordinator", &url, "--slots", "1"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn worker")
    };
    let mut first_worker = spawn_worker();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.expect("utf8");
        seen.push(l.clone());
        if l.contains("[slow] started") {
            break;
        }
    }
    first_worker.kill().expect("kill -9");
    let _ = first_worker.wait();
    let mut second = spawn_worker();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    seen.extend(rest);
    let all = seen.join("\n");
    let status = coord.wait().expect("wait");
    assert_eq!(status.code(), Some(0), "{all}");
    assert!(all.contains("requeued"), "{all}");
    assert_eq!(all.matches("[slow] started").count(), 2, "the step ran again on the second worker: {all}");
    assert_eq!(all.matches("✔ slow").count(), 1, "recorded once: {all}");
    let _ = second.wait();
}

/// The README's first command: the example pipelines load, and examples/ci.yml passes `steppe test`.
#[test]
fn readme_examples_work() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let work = scratch("examples");
    // Only the pipelines: running the README's first command leaves its
    // history in examples/.steppe/, which is no example.
    for e in std::fs::read_dir(&examples).expect("examples/").filter_map(|e| e.ok()).filter(|e| e.path().is_file()) {
        std::fs::copy(e.path(), work.join(e.file_name())).expect("copy");
        let name = e.file_name().to_string_lossy().into_owned();
        let out = steppe(&["validate", "--syntax-only", &name], &work);
        assert_eq!(out.status.code(), Some(0), "{name}: {}", text(&out));
    }
    let out = steppe(&["test", "ci.yml"], &work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("PASS build") && t.contains("PASS deploy") && t.contains("2/2 passed"), "{t}");
}

/// `steppe coordinator` + two `steppe worker`s + `steppe submit`: the
/// self-checking pipelines pass through a coordinator exactly as through
/// `steppe test`, and every call must carry the coordinator's token.
#[test]
fn submit_through_a_coordinator_and_two_workers() {
    let work = scratch("coordinator");
    std::fs::write(work.join("token"), "t0ken\n").expect("token");
    // The queue is a real Redis (Streams, leased); scripts/test installs redis-server.
    let (mut redis, redis_url) = redis_server();
    let start_coordinator = || {
        let args = ["coordinator", "--listen", "127.0.0.1:0", "--token-file", "token", "--state", "state", "--queue", &redis_url, "--store", &redis_url, "--artifacts", "shared"];
        let (coord, url, mut lines) = serving(&args, &work);
        std::thread::spawn(move || for _ in lines.by_ref() {});
        (coord, url)
    };
    let (mut coord, url) = start_coordinator();
    let worker = |url: &str, token: bool| {
        let mut args = vec!["worker", "--coordinator", url, "--slots", "2"];
        if token {
            args.extend(["--token-file", "token"]);
        }
        child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(&args).current_dir(&work).stderr(std::process::Stdio::piped()).spawn().expect("spawn worker")
    };
    let mut workers = [worker(&url, true), worker(&url, true)];
    let intruder = worker(&url, false).wait_with_output().expect("intruder");
    assert_ne!(intruder.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&intruder.stderr).contains("valid token is required"));
    for name in ["blocks.yml", "workspace.yml", "resources.yml", "modifiers.yml", "passed.yml", "expr-resources.yml"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/run").join(name);
        std::fs::copy(&src, work.join(name)).expect("copy");
        let c = work.join(format!("counter-{name}")).to_string_lossy().into_owned();
        let out = steppe(&["submit", name, "--test", "--coordinator", &url, "--token-file", "token", "--var", &format!("counter={c}"), "--var", "loop=unused"], &work);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{name} through the coordinator:\n{t}");
        assert!(t.lines().any(|l| l.ends_with(" passed")), "{t}");
    }
    // Outputs went to the --artifacts directory the workers share.
    let blobs = std::fs::read_dir(work.join("shared")).map(|d| d.count()).unwrap_or(0);
    assert!(blobs > 0, "no artifacts under --artifacts shared");
    // `steppe test --coordinator` is the same as `steppe submit --test`.
    let out = steppe(&["test", "blocks.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Exit codes carry over: a failing job is 1, a missing token is refused.
    std::fs::write(work.join("fail.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: exit 3\n").expect("write");
    let out = steppe(&["run", "fail.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("exit status 3"), "{}", text(&out));
    let out = steppe(&["submit", "fail.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("refused the submission"), "{}", text(&out));
    // The store is Redis: a restarted coordinator still knows what passed.
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/run/passed.yml"), work.join("again.yml")).expect("copy");
    let out = steppe(&["submit", "again.yml", "--job", "build", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Workers of a `steppe coordinator` wait for it to come back: stop them.
    stop(workers.iter_mut().chain([&mut coord]));
    let (mut coord, url) = start_coordinator();
    let mut w = worker(&url, true);
    let out = steppe(&["submit", "again.yml", "--job", "deploy", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "after a restart, deploy's passed: [build] finds what build recorded:\n{}", text(&out));
    // --detach prints the run id and returns; the run goes on without its submitter.
    std::fs::write(work.join("slow.yml"), "jobs:\n- name: slow\n  plan:\n  - task: nap\n    run: sleep 3; echo rested\n").expect("write");
    let out = steppe(&["submit", "slow.yml", "--detach", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("r-") && !id.contains('\n'), "only the run id: {id:?}");
    let shown = |id: &str| text(&steppe(&["runs", "--run", id, "--coordinator", &url, "--token-file", "token"], &work));
    assert!(shown(&id).contains("of job slow (running)"), "{}", shown(&id));
    let t0 = Instant::now();
    while !shown(&id).contains("of job slow (succeeded)") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the detached run never finished: {}", shown(&id));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The history and approvals, read and decided through the coordinator.
    let runs = |extra: &[&str]| text(&steppe(&[&["runs", "--coordinator", &url, "--token-file", "token"][..], extra].concat(), &work));
    let t = runs(&[]);
    assert!(t.lines().any(|l| l.contains(" deploy ") && l.ends_with("succeeded")) && t.contains(" build "), "{t}");
    let t = runs(&["--steps", "--job", "deploy"]);
    assert!(t.starts_with("run ") && t.contains("of job deploy (succeeded)"), "{t}");
    let out = steppe(&["runs", "--coordinator", &url], &work);
    assert_ne!(out.status.code(), Some(0), "no token, no history: {}", text(&out));
    std::fs::write(work.join("ship.yml"), "jobs:\n- name: ship\n  plan:\n  - approval:\n      message: Ship it?\n      timeout: 1m\n  - task: deploy\n    run: echo deployed\n").expect("write");
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "ship.yml", "--coordinator", &url, "--token-file", "token"])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn submit");
    let t0 = Instant::now();
    let id = loop {
        let t = text(&steppe(&["approvals", "--coordinator", &url, "--token-file", "token"], &work));
        if let Some(line) = t.lines().find(|l| l.contains("Ship it?")) {
            break line.split_whitespace().next().expect("id").to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no pending approval on the coordinator: {t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let t = text(&steppe(&["approve", &id, "--coordinator", &url, "--token-file", "token"], &work));
    assert!(t.contains(&format!("approved approval {id}")), "{t}");
    let out = child.wait_with_output().expect("wait");
    let t = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("[deploy] deployed") && t.contains("steppe approve --coordinator URL"), "{t}");
    stop([&mut coord, &mut w, &mut redis]);
}

/// SIGTERM drains a worker: it takes nothing new, finishes what it runs and
/// reports it, then exits 0; the next step goes to another worker.
#[test]
fn sigterm_drains_a_worker() {
    let work = scratch("drain");
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: j\n  plan:\n  - task: long\n    outputs: [o]\n    run: echo begun; sleep 2; echo finished > o/x\n  - task: next\n    inputs: [o]\n    run: cat o/x\n    assert:\n      stdout: finished\n  assert:\n    execution: [long, next]\n",
    )
    .expect("write");
    let (mut coord, url, mut lines) = serving(&["run", "p.yml", "--workers", "0", "--listen", "127.0.0.1:0"], &work);
    let spawn = || child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--slots", "1"]).stderr(std::process::Stdio::null()).spawn().expect("worker");
    let mut first_worker = spawn();
    let mut seen = Vec::new();
    for l in lines.by_ref() {
        let l = l.expect("utf8");
        seen.push(l.clone());
        if l.contains("[long] begun") {
            break;
        }
    }
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &first_worker.id().to_string()]).status().expect("kill").success());
    let drained = first_worker.wait().expect("wait");
    assert_eq!(drained.code(), Some(0), "a drained worker exits cleanly");
    assert!(t0.elapsed() >= Duration::from_millis(1000), "it finished the running step before exiting");
    let mut second = spawn();
    seen.extend(lines.map_while(Result::ok));
    let all = seen.join("\n");
    assert_eq!(coord.wait().expect("wait").code(), Some(0), "{all}");
    assert_eq!(all.matches("[long] begun").count(), 1, "the drained step was not run twice: {all}");
    assert!(all.contains("✔ long") && all.contains("✔ next"), "{all}");
    let _ = second.wait();
}

/// A submitter that goes away (Ctrl-C, killed) aborts its run on the
/// coordinator: the cancel reaches the worker running the step within a
/// second, and the step's on_abort hook still runs.
#[test]
fn a_vanished_submitter_aborts_its_run_on_the_worker() {
    let work = scratch("vanish");
    let marker = work.join("aborted");
    let started = work.join("started");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: long\n    run: touch {}; sleep 30\n    on_abort:\n      task: note\n      run: echo aborted > {}\n",
            started.display(),
            marker.display()
        ),
    )
    .expect("write");
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = spawn_worker(&url, &["--slots", "2"]);
    let mut submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "p.yml", "--coordinator", &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("submit");
    let t0 = Instant::now();
    while !started.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    submitter.kill().expect("kill the submitter");
    let _ = submitter.wait();
    let t1 = Instant::now();
    while !marker.exists() {
        assert!(t1.elapsed() < Duration::from_secs(10), "the run was not aborted on the coordinator");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(t1.elapsed() < Duration::from_secs(3), "abort took {:?}", t1.elapsed());
    stop([&mut coord, &mut worker]);
}

/// A worker cut off mid-step (frozen with SIGSTOP: its connection stays open
/// and it says nothing) loses its lease: its step runs on another worker, and
/// when it wakes, its late result is refused. The step is recorded once.
#[test]
fn a_silent_worker_is_fenced_and_its_late_result_refused() {
    use std::sync::{Arc, Mutex};
    let work = scratch("fence");
    let attempts = work.join("attempts");
    std::fs::write(
        work.join("p.yml"),
        format!("jobs:\n- name: j\n  plan:\n  - task: nap\n    run: echo try >> {}; sleep 3; echo rested\n", attempts.display()),
    )
    .expect("write");
    // On Redis, with a free slot on the frozen worker: its session is waiting
    // on the queue when it is fenced, and that wait must not swallow the
    // requeued step.
    let (mut redis, redis_url) = redis_server();
    let (mut coord, url, lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--worker-lease", "2s", "--queue", &redis_url, "--store", &redis_url], &work);
    let log = Arc::new(Mutex::new(Vec::<String>::new()));
    let sink = log.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            sink.lock().expect("log").push(l);
        }
    });
    let worker = || spawn_worker(&url, &["--slots", "2"]);
    let mut frozen = worker();
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "p.yml", "--coordinator", &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    let t0 = Instant::now();
    while !attempts.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let signal = |sig: &str, pid: u32| assert!(Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill").success());
    signal("-STOP", frozen.id());
    let mut second = worker();
    let out = submitter.wait_with_output().expect("wait submit");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert_eq!(t.matches("✔ nap").count(), 1, "recorded once: {t}");
    // Wake it: it finishes its copy of the step and reports; that is refused.
    signal("-CONT", frozen.id());
    let t1 = Instant::now();
    let joined = || log.lock().expect("log").join("\n");
    while !joined().contains("refused a late result") {
        assert!(t1.elapsed() < Duration::from_secs(20), "no refusal logged:\n{}", joined());
        std::thread::sleep(Duration::from_millis(100));
    }
    let all = joined();
    assert!(all.contains("its lease ended; 1 assignment(s) requeued"), "{all}");
    assert_eq!(std::fs::read_to_string(&attempts).expect("attempts").lines().count(), 2, "ran on both workers");
    let runs = text(&steppe(&["runs", "--coordinator", &url, "--steps"], &work));
    assert_eq!(runs.matches("\nnap ").count(), 1, "one step record: {runs}");
    stop([&mut frozen, &mut coord, &mut second, &mut redis]);
}

/// The cluster version of kill -9: Redis queue and store, a coordinator, two
/// workers, `steppe submit`; the worker running the step is killed with
/// SIGKILL mid-step. The run succeeds, the step ran again on the other
/// worker, and it is recorded once.
#[test]
fn kill_9_a_cluster_worker_mid_step() {
    kill_9_mid_step(false);
}

/// As above, with workers that take from the Redis queue themselves.
#[test]
fn kill_9_a_pulling_worker_mid_step() {
    kill_9_mid_step(true);
}

fn kill_9_mid_step(pulling: bool) {
    let work = scratch(if pulling { "cluster-kill9-pull" } else { "cluster-kill9" });
    let pids = work.join("pids");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: slow\n    outputs: [out]\n    run: echo $PPID >> {}; sleep 2; echo done > out/x\n  - task: after\n    inputs: [out]\n    run: cat out/x\n    assert:\n      stdout: done\n",
            pids.display()
        ),
    )
    .expect("write");
    let (mut redis, redis_url) = redis_server();
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url, "--store", &redis_url], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let pull: &[&str] = if pulling { &["--slots", "1", "--queue", &redis_url] } else { &["--slots", "1"] };
    let mut workers = [spawn_worker(&url, pull), spawn_worker(&url, pull)];
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "p.yml", "--coordinator", &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    let t0 = Instant::now();
    let first_pid = loop {
        if let Some(pid) = std::fs::read_to_string(&pids).ok().and_then(|t| t.lines().next().map(str::to_string)) {
            break pid;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let victim = workers.iter_mut().find(|w| w.id().to_string() == first_pid).expect("the step runs under one of our workers");
    victim.kill().expect("kill -9");
    let out = submitter.wait_with_output().expect("wait submit");
    let t = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{t}");
    let ran: Vec<String> = std::fs::read_to_string(&pids).expect("pids").lines().map(str::to_string).collect();
    assert_eq!(ran.len(), 2, "ran again after the kill: {ran:?}");
    assert_ne!(ran[0], ran[1], "on the other worker: {ran:?}");
    assert_eq!(t.matches("✔ slow").count(), 1, "recorded once: {t}");
    assert!(t.contains("[after] done"), "{t}");
    let runs = text(&steppe(&["runs", "--coordinator", &url, "--steps"], &work));
    assert_eq!(runs.matches("\nslow ").count(), 1, "one step record: {runs}");
    stop(workers.iter_mut().chain([&mut coord, &mut redis]));
}

#[test]
fn a_step_longer_than_the_queue_lease_runs_once() {
    long_step_runs_once(false);
}

/// As above, with workers that take from the queue and renew their own leases.
#[test]
fn a_pulled_step_longer_than_the_queue_lease_runs_once() {
    long_step_runs_once(true);
}

fn long_step_runs_once(pulling: bool) {
    let work = scratch(if pulling { "cluster-long-step-pull" } else { "cluster-long-step" });
    let ran = work.join("ran");
    std::fs::write(
        work.join("p.yml"),
        format!("jobs:\n- name: j\n  plan:\n  - task: long\n    run: echo $PPID >> {}; sleep 4\n", ran.display()),
    )
    .expect("write");
    let (mut redis, redis_url) = redis_server();
    // A 1s queue lease under a 4s step: only the coordinator's renewals keep
    // the entry from going to the second worker.
    let (mut coord, url, lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url, "--queue-lease", "1s"], &work);
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = log.clone();
    std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| keep.lock().expect("log").push(l)));
    let pull: &[&str] = if pulling { &["--slots", "1", "--queue", &redis_url] } else { &["--slots", "1"] };
    let mut workers = [spawn_worker(&url, pull), spawn_worker(&url, pull)];
    let out = steppe(&["submit", "p.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let runs: Vec<String> = std::fs::read_to_string(&ran).expect("ran").lines().map(str::to_string).collect();
    assert_eq!(runs.len(), 1, "the step ran once, not again when its lease would have run out: {runs:?}\n{}", log.lock().expect("log").join("\n"));
    stop(workers.iter_mut().chain([&mut coord, &mut redis]));
}

#[test]
fn artifacts_and_large_results_travel_through_the_coordinator() {
    let work = scratch("cluster-streamed");
    std::fs::write(
        work.join("p.yml"),
        r#"jobs:
- name: j
  plan:
  - task: make
    outputs: [out]
    run: |
      head -c 5000000 /dev/urandom > out/big
      mkdir -p out/sub; echo hi > out/sub/f; printf '#!/bin/sh\necho ran\n' > out/run.sh; chmod +x out/run.sh; ln -s sub/f out/link
      sha256sum out/big | cut -c1-64 > out/big.sum
  - task: use
    inputs: [out]
    run: test "$(sha256sum out/big | cut -c1-64)" = "$(cat out/big.sum)" && out/run.sh && cat out/link
  - task: loud
    run: |
      head -c 6000000 /dev/zero | tr '\0' b
      echo
      head -c 12000000 /dev/zero | tr '\0' a | fold -w 100 >&2
  - task: after
    run: echo still here
"#,
    )
    .expect("write");
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // --stream-artifacts: as if on another host, sharing nothing with the coordinator.
    let mut workers = vec![spawn_worker(&url, &["--slots", "1", "--stream-artifacts"]), spawn_worker(&url, &["--slots", "1", "--stream-artifacts"])];
    // Bounded: a result too large for its message used to kill each worker
    // in turn and leave the run waiting for one.
    let out = child_of_this_test("timeout").args(["120", env!("CARGO_BIN_EXE_steppe"), "submit", "p.yml", "--coordinator", &url]).current_dir(&work).output().expect("submit");
    let t = text(&out);
    let shown: String = t.lines().filter(|l| l.len() < 300).collect::<Vec<_>>().join("\n");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(t.contains("[use] ran\n") && t.contains("[use] hi\n"), "the tree arrived whole (bytes, exec bit, symlink): {shown}");
    assert!(t.lines().all(|l| l.len() <= (64 << 10) + 16), "a 6 MB line travels in pieces of at most 64 KiB: {shown}");
    assert!(t.lines().filter(|l| l.starts_with("[loud] bbbb")).count() >= 90, "all of it: {shown}");
    assert!(t.contains("✔ loud") && t.contains("[after] still here"), "an 18 MB result travelled by reference and the workers lived on: {shown}");
    let stored = std::fs::read_dir(work.join("state/artifacts")).expect("artifacts").filter_map(Result::ok).filter(|e| e.file_name().len() == 64).count();
    assert!(stored >= 2, "the output tree and the large result were stored with the coordinator: {stored}");
    for w in &mut workers {
        assert!(w.try_wait().expect("try_wait").is_none(), "no worker died");
    }
    // A submission over the message limit is refused here, by name.
    std::fs::write(work.join("big.sh"), "#".repeat(5 << 20)).expect("write");
    std::fs::write(work.join("big.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run_file: big.sh\n").expect("write");
    let out = steppe(&["submit", "big.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("big.yml: the pipeline and the files it sends come to 5.0 MiB; a submission carries at most 4 MiB"), "{}", text(&out));
    stop(workers.iter_mut().chain([&mut coord]));
}

/// A private CA and a certificate for 127.0.0.1 it signed, made with openssl.
fn private_ca(dir: &Path) {
    let sh = "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=steppe test CA' -keyout ca.key -out ca.pem \
        && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr \
        && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext \
        && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext -out server.pem";
    let out = Command::new("sh").args(["-c", sh]).current_dir(dir).output().expect("openssl (scripts/test installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn tls_between_every_part() {
    let work = scratch("cluster-tls");
    private_ca(&work);
    std::fs::write(work.join("token"), "t0ken\n").expect("token");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [o]\n    run: echo sealed > o/f\n  - task: read\n    inputs: [o]\n    run: cat o/f\n").expect("write");
    let (mut coord, url, mut lines) = serving(
        &["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--token-file", "token", "--tls-cert", "server.pem", "--tls-key", "server.key"],
        &work,
    );
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem", "--slots", "2", "--stream-artifacts"])
        .current_dir(&work)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("[read] sealed"), "{}", text(&out));
    let runs = steppe(&["runs", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem"], &work);
    assert!(text(&runs).contains("succeeded"), "{}", text(&runs));
    // Not trusting the CA, or not speaking TLS: refused, with the way out named.
    let untrusted = steppe(&["submit", "p.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(untrusted.status.code(), Some(2));
    assert!(text(&untrusted).contains("not signed by a CA this host trusts (a private CA? pass --tls-ca FILE)"), "{}", text(&untrusted));
    let plain = steppe(&["submit", "p.yml", "--coordinator", &url.replace("https://", "http://"), "--token-file", "token"], &work);
    assert_eq!(plain.status.code(), Some(2));
    assert!(text(&plain).contains("use an https:// URL"), "{}", text(&plain));
    stop([&mut coord, &mut worker]);
}

/// A line with its "(0.01s)"-style timings taken out.
fn without_durations(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find(" (") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) if after[..j].ends_with('s') && after[..j].trim_end_matches(['s', 'm']).parse::<f64>().is_ok() => rest = &after[j + 1..],
            _ => {
                out.push_str(" (");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every pipeline of the suite (self-checking, failing, examples) ends the
/// same through a Redis-backed coordinator and two workers as it does
/// embedded: same exit code, same steps with the same outcomes.
#[test]
fn every_fixture_runs_the_same_through_a_cluster() {
    let (mut redis, redis_url) = redis_server();
    let base = scratch("parity");
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url, "--store", &redis_url], &base);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // One worker takes from the Redis queue itself, the other is sent work
    // over its session: both kinds share the one queue.
    let mut workers = [spawn_worker(&url, &["--slots", "4", "--queue", &redis_url]), spawn_worker(&url, &["--slots", "4"])];
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut pipelines: Vec<PathBuf> = fixtures("");
    pipelines.extend(fixtures("failing"));
    pipelines.extend(std::fs::read_dir(&examples).expect("examples").filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "yml")));
    assert!(pipelines.len() >= 12, "{pipelines:?}");
    // What a user compares: the exit code and each step's outcome, in order of finishing.
    let summary = |o: &Output| -> (Option<i32>, Vec<String>) {
        let mut steps: Vec<String> = text(o)
            .lines()
            .filter(|l| l.starts_with('✔') || l.starts_with('✘'))
            .map(without_durations)
            .collect();
        steps.sort();
        (o.status.code(), steps)
    };
    let (mut differ, mut compared_steps) = (Vec::new(), 0);
    for (i, f) in pipelines.iter().enumerate() {
        let mut runs = Vec::new();
        for mode in ["embedded", "cluster"] {
            let work = base.join(format!("{i}-{mode}"));
            std::fs::create_dir_all(&work).expect("mkdir");
            let copy = work.join(f.file_name().expect("name"));
            std::fs::copy(f, &copy).expect("copy");
            let (counter, lp) = (work.join("counter").to_string_lossy().into_owned(), work.join("loop").to_string_lossy().into_owned());
            let (cv, lv) = (format!("counter={counter}"), format!("loop={lp}"));
            let mut args = vec!["test", copy.to_str().expect("utf8"), "--var", &cv, "--var", &lv];
            if mode == "cluster" {
                args.extend(["--coordinator", &url]);
            }
            runs.push(steppe(&args, &work));
        }
        let (embedded, cluster) = (summary(&runs[0]), summary(&runs[1]));
        assert!(embedded.0.is_some(), "{}", f.display());
        compared_steps += embedded.1.len();
        if embedded != cluster {
            differ.push(format!("{}:\n  embedded {embedded:?}\n  cluster  {cluster:?}\n{}", f.display(), text(&runs[1])));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    assert!(compared_steps >= 40, "only {compared_steps} step outcomes compared");
    stop(workers.iter_mut().chain([&mut coord, &mut redis]));
}

/// `steppe cancel` aborts a detached run; Ctrl-C on a submitter cancels its
/// run and stays to show the abort hooks; neither leaves the step running.
#[test]
fn cancel_and_ctrl_c_abort_a_run_at_the_coordinator() {
    let work = scratch("cancel");
    let pipeline = |name: &str| {
        let started = work.join(format!("{name}.started"));
        std::fs::write(
            work.join(format!("{name}.yml")),
            format!(
                "jobs:\n- name: j\n  plan:\n  - task: long\n    run: echo $$ > {}.pid; touch {}; sleep 30\n    on_abort:\n      task: note\n      run: echo hook ran for {name}\n",
                started.display(),
                started.display()
            ),
        )
        .expect("write");
        started
    };
    let wait_for = |f: &Path| {
        let t0 = Instant::now();
        while !f.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = spawn_worker(&url, &["--slots", "2"]);

    let started = pipeline("detached");
    let out = steppe(&["submit", "detached.yml", "--detach", "--coordinator", &url], &work);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for(&started);
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(&format!("cancelled {id}")), "{}", text(&out));
    let t0 = Instant::now();
    loop {
        let shown = text(&steppe(&["runs", "--run", &id, "--coordinator", &url, "--logs"], &work));
        if shown.contains("(aborted)") {
            assert!(shown.contains("hook ran for detached"), "the abort hook ran: {shown}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "not aborted: {shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The cancel reached the worker: the step's process is gone, not left to finish its sleep.
    let pid = std::fs::read_to_string(format!("{}.pid", started.display())).expect("pid");
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let t0 = Instant::now();
    while proc_dir.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the step's process {} still runs", pid.trim());
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("no run"), "{}", text(&again));

    let started = pipeline("followed");
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "followed.yml", "--coordinator", &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    wait_for(&started);
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(submitter.id() as i32, libc::SIGINT);
    }
    let out = submitter.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(text(&out).contains("[note] hook ran for followed"), "the submitter stayed to see the hook: {}", text(&out));
    stop([&mut coord, &mut worker]);
}

/// A run submitted with --pool runs on that pool's workers only; a pool no
/// worker serves is named when the run starts.
#[test]
fn pools_route_runs_to_their_workers() {
    let work = scratch("pools");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: where\n    run: echo ran under $PPID\n").expect("write");
    let (mut redis, redis_url) = redis_server();
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // The default pool's worker is sent work; the special pool's takes it from Redis itself.
    let mut plain = spawn_worker(&url, &["--slots", "2"]);
    let mut special = spawn_worker(&url, &["--slots", "2", "--pool", "special", "--queue", &redis_url]);
    let ran_under = |args: &[&str]| {
        let mut all = vec!["submit", "p.yml", "--coordinator", &url];
        all.extend_from_slice(args);
        let out = steppe(&all, &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let t = text(&out);
        t.lines().find_map(|l| l.strip_prefix("[where] ran under ")).map(str::to_string).unwrap_or_else(|| panic!("{t}"))
    };
    for _ in 0..3 {
        assert_eq!(ran_under(&["--pool", "special"]), special.id().to_string());
        assert_eq!(ran_under(&[]), plain.id().to_string());
    }
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--pool", "nobody", "--detach"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "the run waited for a worker of its pool: {}", text(&out));
    let bad = steppe(&["submit", "p.yml", "--coordinator", &url, "--pool", "../x"], &work);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("a pool name is 1 to 64 letters"), "{}", text(&bad));
    stop([&mut plain, &mut special, &mut coord, &mut redis]);
}

/// Assignments a coordinator left on the Redis queue when it died belong to
/// no run of its successor: they are dropped, not run.
#[test]
fn a_dead_coordinators_queue_entries_are_not_run() {
    let work = scratch("orphans");
    let ran = work.join("ran");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: orphan\n    run: echo ran >> {}\n", ran.display())).expect("write");
    let (mut redis, redis_url) = redis_server();
    let port = redis_url.trim_start_matches("redis://127.0.0.1:").trim_end_matches('/').to_string();
    let queued = || {
        let out = Command::new("redis-cli").args(["-p", &port, "XLEN", "steppe:assignments"]).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().unwrap_or(0)
    };
    let (mut first, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    for _ in 0..2 {
        let out = steppe(&["submit", "p.yml", "--detach", "--coordinator", &url], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    let t0 = Instant::now();
    while queued() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the steps never reached the queue");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop([&mut first]);
    let (mut second, url, lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state2", "--queue", &redis_url], &work);
    let (seen_tx, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let _ = seen_tx.send(l);
        }
    });
    let mut workers = [spawn_worker(&url, &["--slots", "1", "--queue", &redis_url]), spawn_worker(&url, &["--slots", "1"])];
    let mut dropped = 0;
    let t0 = Instant::now();
    while dropped < 2 {
        let l = seen.recv_timeout(Duration::from_secs(20)).expect("the second coordinator's log");
        dropped += usize::from(l.contains("dropped assignment") && l.contains("no run here waits for it"));
        assert!(t0.elapsed() < Duration::from_secs(20), "the orphans were not dropped");
    }
    assert!(!ran.exists(), "an orphaned step ran: {:?}", std::fs::read_to_string(&ran));
    // The successor runs its own work as usual.
    std::fs::write(work.join("mine.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo mine\n").expect("write");
    let out = steppe(&["submit", "mine.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!ran.exists());
    stop(workers.iter_mut().chain([&mut second, &mut redis]));
}

/// A resource `check` runs in the pipeline's directory. Submitted, it runs
/// on a worker in a copy of what was sent: the files the pipeline reads and
/// what `--include` or `.steppe-include` name (executable bits kept), never
/// the rest of the directory, and never on the coordinator's host.
#[test]
fn a_submitted_check_runs_on_a_worker_in_what_was_sent() {
    let work = scratch("check-dir");
    std::fs::create_dir_all(work.join("scripts")).expect("mkdir");
    std::fs::write(work.join("scripts/versions.sh"), "#!/bin/sh\necho \"$PWD\" > \"$CHECK_WHERE\"\nprintf '[{\"v\": \"%s\"}]' \"$(cat releases.txt)\"\n").expect("write");
    std::fs::set_permissions(work.join("scripts/versions.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    std::fs::write(work.join("releases.txt"), "7.1").expect("write");
    std::fs::write(work.join("deploy-token"), "s3cret").expect("write");
    std::fs::write(
        work.join("p.yml"),
        "resource_types:\n- name: release\n  env: [CHECK_WHERE]\n  config:\n    check: ./scripts/versions.sh\n    in: echo {{ .version.v | shellquote }} > v\nresources:\n- name: rel\n  type: release\n  source: {}\njobs:\n- name: j\n  plan:\n  - get: rel\n  - task: show\n    inputs: [rel]\n    run: cat rel/v\n",
    )
    .expect("write");
    let where_file = work.join("check-ran-in");
    let embedded = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml"]).current_dir(&work).env("CHECK_WHERE", &where_file).output().expect("run");
    assert_eq!(embedded.status.code(), Some(0), "{}", text(&embedded));
    let state = work.join(".state");
    let coordinator = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["coordinator", "--listen", "127.0.0.1:0", "--state", ".state"])
        .current_dir(&work)
        .env_remove("CHECK_WHERE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("coordinator");
    let (mut coord, url, mut lines) = serving_child(coordinator);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--slots", "1"]).env("CHECK_WHERE", &where_file).stderr(std::process::Stdio::null()).spawn().expect("worker");
    let submit = |extra: &[&str]| steppe(&[&["submit", "p.yml", "--coordinator", &url][..], extra].concat(), &work);
    // Without naming them, the script and its data stay home: the check fails, saying so.
    let out = submit(&[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("sending p.yml, 0 file(s) it reads and 0 included file(s)"), "{t}");
    let out = submit(&["--include", "scripts", "--include", "releases.txt"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("[show] 7.1") && t.contains("and 2 included file(s)"), "{t}");
    let ran_in = std::fs::read_to_string(&where_file).expect("the check ran");
    assert!(!ran_in.starts_with(&*state.to_string_lossy()), "the check ran on the worker, not in the coordinator's state: {ran_in}");
    // A checked-in .steppe-include does the same.
    std::fs::write(work.join(".steppe-include"), "# what the check needs\nscripts/*.sh\nreleases.txt\n").expect("write");
    let out = submit(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Nothing of the submissions is left on the coordinator, and the token never went.
    let left: Vec<_> = std::fs::read_dir(state.join("submissions")).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "submissions left behind: {left:?}");
    let found = std::process::Command::new("grep").args(["-r", "-l", "s3cret", "."]).current_dir(&state).output().expect("grep");
    assert!(found.stdout.is_empty(), "the token reached the coordinator: {}", String::from_utf8_lossy(&found.stdout));
    stop([&mut coord, &mut worker]);
}
