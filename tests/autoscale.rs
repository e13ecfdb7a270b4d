//! Workers that come and go with the work: the figures an autoscaler reads
//! (`--metrics`) against the real queue while a run goes, workers that leave
//! when idle (`--exit-when-idle`), and a run of hundreds of steps through
//! workers started, drained and killed throughout.

mod common;

use std::io::{Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

/// GET `path` from `addr` (HTTP/1.0): the status line and the body.
fn get(addr: &str, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// The value of the sample `name` (with its labels, as written) in Prometheus text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// Waiting entries on the Redis stream: its length less what a consumer holds.
fn redis_waiting(port: &str, key: &str) -> i64 {
    let cli = |args: &[&str]| String::from_utf8_lossy(&Command::new("redis-cli").args(["-p", port]).args(args).output().expect("redis-cli").stdout).into_owned();
    let len: i64 = cli(&["XLEN", key]).trim().parse().unwrap_or(0);
    let pending: i64 = cli(&["XPENDING", key, "steppe-workers"]).lines().next().and_then(|l| l.trim().parse().ok()).unwrap_or(0);
    len - pending
}

#[test]
fn metrics_match_the_queue_while_a_run_goes() {
    let work = scratch("metrics");
    let tasks: String = (0..6).map(|i| format!("    - task: t{i}\n      run: sleep 1\n")).collect();
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - in_parallel:\n{tasks}")).expect("write");
    let (mut redis, redis_url) = redis_server();
    let redis_port = redis_url.trim_start_matches("redis://127.0.0.1:").trim_end_matches('/').to_string();
    let (mut coord, url, log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url, "--store", &redis_url, "--metrics", "127.0.0.1:0"], &work);
    let mut metrics = String::new();
    wait_for("the coordinator's metrics address", Duration::from_secs(10), || {
        metrics = log.lock().expect("log").lines().find_map(|l| l.split("metrics on http://").nth(1).map(|a| a.trim_end_matches("/metrics").to_string())).unwrap_or_default();
        !metrics.is_empty()
    });
    assert_eq!(get(&metrics, "/healthz").0, "HTTP/1.0 200 OK");
    assert_eq!(get(&metrics, "/readyz").0, "HTTP/1.0 200 OK");
    let worker_metrics = format!("127.0.0.1:{}", free_port());
    let mut worker = spawn_worker(&url, &["--slots", "1", "--metrics", &worker_metrics]);
    wait_for("the worker's readiness", Duration::from_secs(10), || std::net::TcpStream::connect(&worker_metrics).is_ok() && get(&worker_metrics, "/readyz").0.ends_with("200 OK"));
    let run = steppe(&["submit", "p.yml", "--detach", "--coordinator", &url], &work);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run));
    // One slot, six one-second steps: one runs, the rest wait on the stream.
    let mut seen = Vec::new();
    let consistent = (0..100).find_map(|_| {
        std::thread::sleep(Duration::from_millis(100));
        let before = redis_waiting(&redis_port, "steppe:assignments");
        let (_, body) = get(&metrics, "/metrics");
        let after = redis_waiting(&redis_port, "steppe:assignments");
        let backlog = sample(&body, "steppe_queue_backlog{pool=\"default\"}")?;
        let in_flight = sample(&body, "steppe_queue_in_flight{pool=\"default\"}")?;
        seen.push((before, backlog, in_flight, after));
        (before == after && backlog as i64 == before && backlog >= 1.0 && in_flight == 1.0).then_some(body)
    });
    let body = consistent.unwrap_or_else(|| panic!("the backlog never matched the stream while steps waited: (stream, backlog, in flight, stream) {seen:?}"));
    assert_eq!(sample(&body, "steppe_workers_connected{pool=\"default\"}"), Some(1.0), "{body}");
    assert_eq!(sample(&body, "steppe_worker_slots_free{pool=\"default\"}"), Some(0.0), "{body}");
    assert!(sample(&body, "steppe_queue_oldest_waiting_seconds{pool=\"default\"}").is_some_and(|s| s > 0.0), "{body}");
    let (_, w) = get(&worker_metrics, "/metrics");
    assert_eq!(sample(&w, "steppe_queue_in_flight{pool=\"default\"}"), Some(1.0), "the worker runs one: {w}");
    // When the run is over: six started, six succeeded, nothing waits.
    wait_for("the run to end", Duration::from_secs(30), || sample(&get(&metrics, "/metrics").1, "steppe_steps_finished_total{outcome=\"succeeded\"}") == Some(6.0));
    let (_, body) = get(&metrics, "/metrics");
    assert_eq!(sample(&body, "steppe_steps_started_total"), Some(6.0), "{body}");
    assert_eq!(sample(&body, "steppe_queue_backlog{pool=\"default\"}"), Some(0.0), "{body}");
    assert!(sample(&body, "steppe_queue_wait_seconds_count").is_some_and(|n| n >= 6.0), "{body}");
    assert_eq!(sample(&get(&worker_metrics, "/metrics").1, "steppe_steps_finished_total{outcome=\"succeeded\"}"), Some(6.0));
    stop([&mut worker, &mut coord, &mut redis]);
}

/// A worker with --exit-when-idle runs what comes, then leaves on its own
/// (exit 0) once nothing has come for that long; one started later takes
/// the next run as well, needing nothing from the first.
#[test]
fn idle_workers_leave_and_new_ones_pick_up() {
    let work = scratch("idle");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo done\n").expect("write");
    let (mut redis, redis_url) = redis_server();
    let (mut coord, url, _log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url], &work);
    for round in 0..2 {
        let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--slots", "1", "--exit-when-idle", "1s"]).stderr(std::process::Stdio::piped()).spawn().expect("worker");
        let out = steppe(&["submit", "p.yml", "--coordinator", &url], &work);
        assert_eq!(out.status.code(), Some(0), "round {round}: {}", text(&out));
        let t0 = Instant::now();
        let status = loop {
            if let Some(s) = worker.try_wait().expect("wait") {
                break s;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "round {round}: the idle worker did not leave");
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut said = String::new();
        worker.stderr.take().expect("stderr").read_to_string(&mut said).expect("read");
        assert_eq!(status.code(), Some(0), "{said}");
        assert!(said.contains("nothing to run for 1s; leaving (--exit-when-idle)"), "{said}");
    }
    stop([&mut coord, &mut redis]);
}

/// Hundreds of steps while workers come and go: started throughout, some
/// drained with SIGTERM, some killed with -9. Every step is recorded once
/// and the run ends as it does embedded.
#[test]
fn a_run_survives_workers_coming_and_going() {
    let work = scratch("churn");
    let n = 300;
    let values: Vec<String> = (0..n).map(|i| format!("\"{i}\"")).collect();
    std::fs::write(
        work.join("p.yml"),
        format!("jobs:\n- name: j\n  plan:\n  - task: cell\n    across:\n    - var: v\n      values: [{}]\n    max_in_flight: 8\n    run: sleep 0.05; echo cell-{{{{ .vars.v }}}}\n", values.join(", ")),
    )
    .expect("write");
    let embedded = steppe(&["run", "p.yml", "--workers", "4", "-q"], &work);
    assert_eq!(embedded.status.code(), Some(0), "{}", text(&embedded));
    let (mut redis, redis_url) = redis_server();
    let (mut coord, url, _log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url, "--store", &redis_url, "--worker-lease", "2s"], &work);
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["submit", "p.yml", "--coordinator", &url]).current_dir(&work).stdout(std::process::Stdio::piped()).spawn().expect("submit");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let (url, redis_url, done) = (url.clone(), redis_url.clone(), done.clone());
        std::thread::spawn(move || {
            let mut workers: Vec<std::process::Child> = Vec::new();
            let (mut started, mut drained, mut killed) = (0, 0, 0);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let pull: &[&str] = if started % 2 == 0 { &["--slots", "2"] } else { &["--slots", "2", "--queue", &redis_url] };
                workers.push(spawn_worker(&url, pull));
                started += 1;
                std::thread::sleep(Duration::from_millis(700));
                if workers.len() > 2 {
                    let mut w = workers.remove(0);
                    if started % 3 == 0 {
                        let _ = w.kill();
                        killed += 1;
                    } else {
                        let _ = Command::new("kill").args(["-TERM", &w.id().to_string()]).status();
                        drained += 1;
                    }
                    let _ = w.wait();
                }
            }
            stop(workers.iter_mut());
            (started, drained, killed)
        })
    };
    let out = submitter.wait_with_output().expect("submit");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (started, drained, killed) = churn.join().expect("churn");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), embedded.status.code(), "{said}");
    assert!(drained >= 1 && killed >= 1, "workers came and went: {started} started, {drained} drained, {killed} killed");
    let runs = text(&steppe(&["runs", "--coordinator", &url, "--steps"], &work));
    for i in 0..n {
        assert_eq!(runs.matches(&format!("cell [v={i}] ")).count(), 1, "cell {i} recorded once:\n{runs}");
    }
    stop([&mut coord, &mut redis]);
}
