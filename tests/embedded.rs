//! Embedded mode end to end: `steppe run` and `steppe test` on one machine
//! (their own worker slots, or `steppe worker`s of their `--listen`).
//!
//! `tests/run/*.yml` check themselves: every job carries `assert:` blocks, so
//! `steppe test` passing means the engine did what the language says.
//! `tests/run/failing/*.yml` must make `steppe test` fail with their
//! `# expect:` fragments (the suite can fail).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

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
        let src = repo("tests/run").join(name);
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
    let examples = repo("examples");
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

/// Out of open files (a low `ulimit -n`), the steps that cannot start say
/// why and what to do, the run errors, and the ones that could start ran.
#[test]
fn steps_past_the_open_file_limit_say_so_and_how_to_raise_it() {
    let dir = scratch("nofile");
    std::fs::write(dir.join("wide.yml"), across(30, 30, "sleep 0.5")).unwrap();
    let out = child_of_this_test("sh")
        .args(["-c", "ulimit -n 50 && exec \"$0\" run wide.yml --force --workers 30", env!("CARGO_BIN_EXE_steppe")])
        .current_dir(&dir)
        .output()
        .expect("run steppe under sh");
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "errored, not failed: {all}");
    assert!(all.contains("Too many open files") && all.contains("raise it (`ulimit -n`) or run fewer steps at once"), "{all}");
    assert!(all.contains("✔ cell"), "the cells that could start ran: {all}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `scripts/bench-ab` (how a change is measured on these noisy VMs) runs
/// binaries on one pipeline round by round and prints each one's medians
/// against the first's; a binary whose run fails stops it, named.
#[test]
fn bench_ab_compares_binaries_round_by_round() {
    let work = scratch("bench-ab");
    std::fs::write(work.join("one.yml"), "jobs:\n- name: one\n  plan:\n  - task: only\n    run: \"true\"\n").expect("write");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench-ab");
    let bin = env!("CARGO_BIN_EXE_steppe");
    let dir = work.to_str().expect("utf8");
    let out = Command::new(&script).args(["--rounds", "2", "--dir", dir, bin, bin, "--", "run", "one.yml", "-q"]).output().expect("run scripts/bench-ab");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with(bin) && l.contains("wall median") && l.contains("CPU median")).collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[1].contains("x the first's wall"), "{stdout}");
    assert!(stderr.contains("round 2/2"), "{stderr}");
    let out = Command::new(&script).args(["--rounds", "1", "--dir", dir, bin, "/bin/false", "--", "run", "one.yml"]).output().expect("run scripts/bench-ab");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/bin/false run one.yml failed in round 1"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The runtime's threads ask for the kernel's shortest slice (so one woken
/// to reap a command is not kept behind another), and the commands they
/// start do not inherit it: a step reads the slices of its parent's
/// threads and its own.
#[test]
fn runtime_threads_take_short_slices_and_their_commands_do_not() {
    let dir = scratch("slices");
    let run = "for f in /proc/$PPID/task/*/sched; do grep se.slice $f; done | sed s/^/parent/; grep se.slice /proc/self/sched | sed s/^/self/";
    std::fs::write(dir.join("slices.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: look\n    run: '{run}'\n")).expect("write");
    let out = steppe(&["run", "slices.yml", "--force"], &dir);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let slices = |who: &str| -> Vec<u64> { all.lines().filter_map(|l| l.split_once(who)).filter_map(|(_, r)| r.split(':').nth(1)).filter_map(|v| v.trim().parse().ok()).collect() };
    let (parent, own) = (slices("parentse.slice"), slices("selfse.slice"));
    if parent.is_empty() {
        eprintln!("this kernel shows no se.slice (before EEVDF's slices): skipped");
        return;
    }
    assert!(parent.contains(&100_000), "a runtime thread of steppe has the 0.1 ms slice: {all}");
    assert!(own.len() == 1 && own[0] > 100_000, "the step's own process keeps the default slice: {all}");
    let _ = std::fs::remove_dir_all(&dir);
}
