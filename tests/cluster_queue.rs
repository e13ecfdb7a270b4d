//! A cluster's queue end to end: workers that take from Redis themselves
//! (`--queue`: taking ahead, starting unconfirmed, acknowledging once), and
//! the coordinator's hand-over in memory to a worker that waits, pushed or
//! pulling.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// Redis and a coordinator that runs nothing itself, for pulling workers:
/// (redis, its URL, the coordinator, the URL workers join).
fn pulling_cluster(work: &Path) -> (std::process::Child, String, std::process::Child, String) {
    let (redis, queue_url, queue_args) = Backend::Redis.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--workers", "0"];
    args.extend(queue_args.iter().map(String::as_str));
    let (coord, url, mut lines) = serving(&args, work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    (redis, queue_url, coord, url)
}

/// `redis-cli ARGS` against the Redis at `queue_url`: what it printed.
fn redis_cli(queue_url: &str, args: &[&str]) -> String {
    let port = queue_url.trim_start_matches("redis://127.0.0.1:").trim_end_matches('/');
    String::from_utf8_lossy(&Command::new("redis-cli").args(["-p", port]).args(args).output().expect("redis-cli").stdout).to_string()
}

/// How many times the Redis at `queue_url` ran `cmd` since its stats were reset.
fn calls(queue_url: &str, cmd: &str) -> u32 {
    let stats = redis_cli(queue_url, &["INFO", "commandstats"]);
    stats.lines().find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls="))).and_then(|r| r.split(',').next()).and_then(|n| n.parse::<u32>().ok()).unwrap_or(0)
}

/// A pulling worker of one slot takes the next entry ahead while its steps
/// are short; one taken ahead behind a long step is handed back and runs on
/// the other worker, not after the long step: the long step finds every
/// short one done before it ends.
#[test]
fn a_step_taken_ahead_behind_a_long_one_runs_on_another_worker() {
    let work = scratch("ahead");
    let marks = work.join("marks");
    std::fs::create_dir_all(&marks).expect("mkdir");
    let m = marks.display();
    let mut plan = format!("jobs:\n- name: j\n  plan:\n  - in_parallel:\n    - task: long\n      run: sleep 5; ls {m}; test $(ls {m} | wc -l) -eq 6\n");
    for i in 1..=6 {
        plan.push_str(&format!("    - task: short{i}\n      run: sleep 0.05; touch {m}/short{i}\n"));
    }
    std::fs::write(work.join("p.yml"), plan).expect("write");
    let (mut redis, queue_url, mut coord, url) = pulling_cluster(&work);
    let mut a = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let mut b = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--force"], &work);
    assert_eq!(out.status.code(), Some(0), "a short step waited behind the long one: {}", text(&out));
    stop([&mut a, &mut b, &mut coord, &mut redis]);
}

/// What a pulling worker is the first to take from its own coordinator runs
/// before any Confirm; `steppe cancel` still reaches it and stops its process.
#[test]
fn cancel_stops_a_step_a_pulling_worker_started_unconfirmed() {
    let work = scratch("cancel-pulled");
    let started = work.join("started");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: long\n    run: echo $$ > {s}.pid; touch {s}; sleep 30\n", s = started.display())).expect("write");
    let (mut redis, queue_url, mut coord, url) = pulling_cluster(&work);
    let mut worker = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let out = steppe(&["submit", "p.yml", "--detach", "--coordinator", &url], &work);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for("the step to start", Duration::from_secs(20), || started.exists());
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let pid = std::fs::read_to_string(format!("{}.pid", started.display())).expect("pid");
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    wait_for("the step's process to be gone", Duration::from_secs(10), || !proc_dir.exists());
    wait_for("the run to show aborted", Duration::from_secs(15), || text(&steppe(&["runs", "--run", &id, "--coordinator", &url], &work)).contains("aborted"));
    stop([&mut worker, &mut coord, &mut redis]);
}

/// A pulled entry is acknowledged once, by the worker that took it (the
/// coordinator only forgets it), and none is left on the stream. The six
/// are queued before any worker joins, so all go through Redis.
#[test]
fn a_pulled_entry_is_acknowledged_once() {
    let work = scratch("acked-once");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    across:\n    - var: i\n      values: [1, 2, 3, 4, 5, 6]\n    max_in_flight: 6\n    run: \"true\"\n").expect("write");
    let (mut redis, queue_url, mut coord, url) = pulling_cluster(&work);
    let (coordinator, dir) = (url.clone(), work.clone());
    let submit = std::thread::spawn(move || child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["submit", "p.yml", "--coordinator", &coordinator]).current_dir(dir).output());
    wait_for("six entries on the stream", Duration::from_secs(20), || redis_cli(&queue_url, &["XLEN", "steppe:assignments"]).trim() == "6");
    let mut worker = spawn_worker(&url, &["--slots", "2", "--queue", &queue_url]);
    let out = submit.join().expect("submit").expect("run steppe submit");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // The worker acknowledges just after it reports; a second would follow as soon.
    let t0 = Instant::now();
    while calls(&queue_url, "xack") < 6 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!((calls(&queue_url, "xadd"), calls(&queue_url, "xack")), (6, 6), "six entries, each acknowledged once");
    assert_eq!(redis_cli(&queue_url, &["XLEN", "steppe:assignments"]).trim(), "0");
    stop([&mut worker, &mut coord, &mut redis]);
}

/// A step queued while a pushed worker's session waits for work is handed
/// to it in the coordinator's memory: it never becomes a Redis entry. What
/// does go through Redis is acknowledged, and nothing is left there.
#[test]
fn a_step_for_a_waiting_session_skips_the_redis_stream() {
    let work = scratch("handed-over");
    std::fs::write(work.join("one.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: \"true\"\n").expect("write");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    across:\n    - var: i\n      values: [1, 2, 3, 4, 5, 6]\n    run: echo cell-{{ .vars.i }}-ran\n").expect("write");
    let (mut redis, queue_url, mut coord, url) = pulling_cluster(&work);
    let mut worker = spawn_worker(&url, &["--slots", "1"]);
    // Once a step has run, the worker's session is waiting for the next.
    let out = steppe(&["submit", "one.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    redis_cli(&queue_url, &["CONFIG", "RESETSTAT"]);
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--force"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for i in 1..=6 {
        assert!(text(&out).contains(&format!("cell-{i}-ran")), "cell {i} ran: {}", text(&out));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (xadd, xack) = (calls(&queue_url, "xadd"), calls(&queue_url, "xack"));
    assert!(xadd < 6, "the first cell, queued while the session waited, went through Redis too: {xadd} XADDs for 6 cells");
    assert_eq!(xack, xadd, "every entry that went through Redis is acknowledged");
    assert_eq!(redis_cli(&queue_url, &["XLEN", "steppe:assignments"]).trim(), "0");
    stop([&mut worker, &mut coord, &mut redis]);
}

/// A pulling worker with a slot free that found its queue empty says it
/// waits, and the coordinator hands it what it would have queued: the cells
/// of a run on two such workers never become Redis entries. What does go
/// through Redis is acknowledged, and nothing is left there.
#[test]
fn a_step_for_a_waiting_pulling_worker_skips_the_redis_stream() {
    let work = scratch("handed-to-puller");
    std::fs::write(work.join("one.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: \"true\"\n").expect("write");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    across:\n    - var: i\n      values: [1, 2, 3, 4, 5, 6, 7, 8]\n    max_in_flight: 2\n    run: echo cell-{{ .vars.i }}-ran\n").expect("write");
    let (mut redis, queue_url, mut coord, url) = pulling_cluster(&work);
    let mut a = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let mut b = spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]);
    let out = steppe(&["submit", "one.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Both workers have looked and wait.
    std::thread::sleep(Duration::from_millis(600));
    redis_cli(&queue_url, &["CONFIG", "RESETSTAT"]);
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--force"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    for i in 1..=8 {
        assert!(text(&out).contains(&format!("cell-{i}-ran")), "cell {i} ran: {}", text(&out));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (xadd, xack) = (calls(&queue_url, "xadd"), calls(&queue_url, "xack"));
    assert!(xadd < 4, "cells went through Redis though a worker waited: {xadd} XADDs for 8 cells");
    assert_eq!(xack, xadd, "every entry that went through Redis is acknowledged");
    assert_eq!(redis_cli(&queue_url, &["XLEN", "steppe:assignments"]).trim(), "0");
    stop([&mut a, &mut b, &mut coord, &mut redis]);
}

/// Two pushed workers of one slot, a run of many short steps two at a time:
/// each result frees its slot, and the session's puller gets in line for
/// it before the result goes on, so the cell that result lets start is
/// handed over in memory. Hardly any goes through Redis (it was one in
/// twelve when the result went on first).
#[test]
fn the_next_cell_after_a_pushed_result_skips_the_redis_stream() {
    let work = scratch("pushed-next");
    std::fs::write(work.join("one.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: \"true\"\n").expect("write");
    std::fs::write(work.join("p.yml"), across(200, 2, "true")).expect("write");
    let (mut redis, queue_url, queue_args) = Backend::Redis.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--workers", "0"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, log) = serving_logged(&args, &work);
    let mut a = spawn_worker(&url, &["--slots", "1"]);
    let mut b = spawn_worker(&url, &["--slots", "1"]);
    // Both in before the warm-up, or one cell of each pair would wait in Redis for the late one.
    wait_for("both workers to join", Duration::from_secs(30), || log.lock().map(|l| l.matches(" joined (").count() >= 2).unwrap_or(false));
    for _ in 0..2 {
        let out = steppe(&["submit", "one.yml", "--coordinator", &url, "--force"], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    }
    redis_cli(&queue_url, &["CONFIG", "RESETSTAT"]);
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--force", "-q"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::thread::sleep(Duration::from_millis(500));
    let (xadd, xack) = (calls(&queue_url, "xadd"), calls(&queue_url, "xack"));
    assert!(xadd < 8, "cells went through Redis though a session was freed for them: {xadd} XADDs for 200 cells");
    assert_eq!(xack, xadd, "every entry that went through Redis is acknowledged");
    assert_eq!(redis_cli(&queue_url, &["XLEN", "steppe:assignments"]).trim(), "0");
    stop([&mut a, &mut b, &mut coord, &mut redis]);
}
