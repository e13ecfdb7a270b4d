//! A cluster under faults: workers drained, killed with SIGKILL, silent past
//! their lease; submitters that vanish; steps longer than the queue lease;
//! queue entries and runs a dead coordinator left behind.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

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
/// The same drain through a coordinator on each distributed queue: the
/// drained worker finishes its step and reports it, the next step goes to a
/// worker started after it, nothing runs twice.
#[test]
fn sigterm_drains_a_worker_on_redis() {
    drains_on(Backend::Redis);
}

#[test]
fn sigterm_drains_a_worker_on_sqs() {
    drains_on(Backend::Sqs);
}

#[test]
fn sigterm_drains_a_worker_on_pubsub() {
    drains_on(Backend::PubSub);
}

fn drains_on(backend: Backend) {
    let work = scratch(&format!("drain-{backend:?}"));
    let begun = work.join("begun");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: long\n    outputs: [o]\n    run: echo begun >> {}; sleep 2; echo finished > o/x\n  - task: next\n    inputs: [o]\n    run: cat o/x\n    assert:\n      stdout: finished\n",
            begun.display()
        ),
    )
    .expect("write");
    let (mut service, queue_url, queue_args) = backend.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, mut lines) = serving(&args, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut first = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["submit", "p.yml", "--coordinator", &url]).current_dir(&work).stdout(std::process::Stdio::piped()).spawn().expect("submit");
    wait_for("the long step to begin", Duration::from_secs(30), || begun.exists());
    let t0 = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &first.id().to_string()]).status().expect("kill").success());
    assert_eq!(first.wait().expect("wait").code(), Some(0), "a drained worker exits cleanly");
    assert!(t0.elapsed() >= Duration::from_millis(1000), "it finished the running step before exiting");
    let mut second = spawn_worker(&url, &["--slots", "1"]);
    let out = submitter.wait_with_output().expect("submit");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(std::fs::read_to_string(&begun).expect("begun").lines().count(), 1, "the drained step ran once: {said}");
    assert!(said.contains("✔ long") && said.contains("✔ next"), "{said}");
    stop([&mut second, &mut coord, &mut service]);
}

#[test]
fn a_silent_worker_is_fenced_and_its_late_result_refused() {
    silent_worker_fenced(Backend::Redis);
}

#[test]
fn a_silent_worker_is_fenced_on_sqs() {
    silent_worker_fenced(Backend::Sqs);
}

#[test]
fn a_silent_worker_is_fenced_on_pubsub() {
    silent_worker_fenced(Backend::PubSub);
}

fn silent_worker_fenced(backend: Backend) {
    use std::sync::{Arc, Mutex};
    let work = scratch(&format!("fence-{backend:?}"));
    let attempts = work.join("attempts");
    std::fs::write(
        work.join("p.yml"),
        format!("jobs:\n- name: j\n  plan:\n  - task: nap\n    run: echo try >> {}; sleep 3; echo rested\n", attempts.display()),
    )
    .expect("write");
    // On Redis, with a free slot on the frozen worker: its session is waiting
    // on the queue when it is fenced, and that wait must not swallow the
    // requeued step.
    let (mut service, _, queue_args) = backend.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--worker-lease", "2s"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, lines) = serving(&args, &work);
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
    stop([&mut frozen, &mut coord, &mut second, &mut service]);
}

/// The cluster version of kill -9: Redis queue and store, a coordinator, two
/// workers, `steppe submit`; the worker running the step is killed with
/// SIGKILL mid-step. The run succeeds, the step ran again on the other
/// worker, and it is recorded once.
#[test]
fn kill_9_a_cluster_worker_mid_step() {
    kill_9_mid_step(false, Backend::Redis);
}

#[test]
fn kill_9_a_worker_mid_step_on_sqs() {
    kill_9_mid_step(false, Backend::Sqs);
}

#[test]
fn kill_9_a_pulling_worker_mid_step_on_sqs() {
    kill_9_mid_step(true, Backend::Sqs);
}

#[test]
fn kill_9_a_worker_mid_step_on_pubsub() {
    kill_9_mid_step(false, Backend::PubSub);
}

#[test]
fn kill_9_a_pulling_worker_mid_step_on_pubsub() {
    kill_9_mid_step(true, Backend::PubSub);
}

/// As above, with workers that take from the Redis queue themselves.
#[test]
fn kill_9_a_pulling_worker_mid_step() {
    kill_9_mid_step(true, Backend::Redis);
}

fn kill_9_mid_step(pulling: bool, backend: Backend) {
    let work = scratch(&format!("cluster-kill9-{pulling}-{backend:?}"));
    let pids = work.join("pids");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: slow\n    outputs: [out]\n    run: echo $PPID >> {}; sleep 2; echo done > out/x\n  - task: after\n    inputs: [out]\n    run: cat out/x\n    assert:\n      stdout: done\n",
            pids.display()
        ),
    )
    .expect("write");
    let (mut service, queue_url, queue_args) = backend.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, mut lines) = serving(&args, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let pull: &[&str] = if pulling { &["--slots", "1", "--queue", &queue_url] } else { &["--slots", "1"] };
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
    stop(workers.iter_mut().chain([&mut coord, &mut service]));
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

/// A coordinator killed with -9 mid-run, started again on the same state
/// and Redis: it takes both runs over (a detached one and one whose
/// submitter stays), each from its last finished step, under its own id;
/// the submitter reattaches and sees the run end; every step is recorded once.
#[test]
fn a_dead_coordinators_runs_are_taken_over_by_the_next() {
    let work = scratch("ghosts");
    let started = work.join("started");
    let log = work.join("log");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: first\n    run: echo first >> {log}\n  - task: long\n    run: echo $$ >> {started}; sleep 2; echo long >> {log}\n  - task: last\n    run: echo last >> {log}\n",
            log = log.display(),
            started = started.display()
        ),
    )
    .expect("write");
    let (mut redis, redis_url) = redis_server();
    // It comes back where it was: the submitter reattaches to the same address.
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let listen = format!("127.0.0.1:{port}");
    let cluster = ["coordinator", "--listen", &listen, "--workers", "2", "--state", "state", "--queue", &redis_url, "--store", &redis_url];
    let (mut first, url, mut lines) = serving(&cluster, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let detached = steppe(&["submit", "p.yml", "--detach", "--coordinator", &url], &work);
    assert_eq!(detached.status.code(), Some(0), "{}", text(&detached));
    let detached_id = String::from_utf8_lossy(&detached.stdout).trim().to_string();
    let attached = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "p.yml", "--coordinator", &url, "--force"])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    wait_for("both long steps to start", Duration::from_secs(20), || std::fs::read_to_string(&started).map(|t| t.lines().count() >= 2).unwrap_or(false));
    first.kill().expect("kill -9 the coordinator");
    let _ = first.wait();

    let (mut second, url, mut lines) = serving(&cluster, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let out = attached.wait_with_output().expect("the submitter ends");
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "the submitter follows the run to its end: {said}");
    assert!(said.contains("lost the coordinator") && said.contains("succeeded"), "{said}");
    wait_for("the detached run to end", Duration::from_secs(60), || text(&steppe(&["runs", "--run", &detached_id, "--coordinator", &url], &work)).contains("succeeded"));
    let steps = text(&steppe(&["runs", "--run", &detached_id, "--coordinator", &url, "--steps"], &work));
    for step in ["first", "long", "last"] {
        assert_eq!(steps.lines().filter(|l| l.split_whitespace().next() == Some(step)).count(), 1, "{step} is recorded once: {steps}");
    }
    let done = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(done.lines().filter(|l| *l == "first").count(), 2, "a finished step is not run again: {done}");
    assert_eq!(done.lines().filter(|l| *l == "last").count(), 2, "{done}");
    let listed = text(&steppe(&["runs", "--coordinator", &url], &work));
    assert!(!listed.contains("running") && !listed.contains("aborted"), "{listed}");
    stop([&mut second, &mut redis]);
}
