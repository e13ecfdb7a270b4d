//! Per-step overhead through a cluster: a coordinator on Redis (queue and
//! store) and two `steppe worker` processes of one slot each run 1,000
//! steps of `true` (an `across:`, two in flight), handed to the workers
//! (pushed) and taken by them from the queue (pulling), against spawning
//! `sh -c true` 1,000 times two at a time in the same run; a one-step
//! submission's whole `steppe submit` against one spawn; and how long
//! `steppe cancel` takes to end a running step's process on a worker.
//! Every step runs (`--force`). Needs `redis-server` on PATH.
//! Run: `cargo bench -p steppe-coordinator --bench cluster`.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use support::{median, ms, raw_spawns, steppe, Cluster, Dir};

const STEPS: usize = 1000;
const RUNS: usize = 5;

/// From `steppe cancel` starting to the step's process being gone on
/// the worker, for a detached run whose step sleeps.
fn cancel_latency(c: &Cluster, dir: &Path, i: usize) -> Duration {
    let pidfile = dir.join(format!("cancel-{i}.pid"));
    let p = pidfile.display();
    std::fs::write(dir.join("cancel.yml"), format!("jobs:\n- name: c\n  plan:\n  - task: nap\n    run: echo $$ > {p}.tmp; mv {p}.tmp {p}; sleep 60\n")).expect("write");
    let out = steppe().args(["submit", "cancel.yml", "--detach", "--force", "--coordinator", &c.url]).current_dir(dir).output().expect("submit");
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let pid = loop {
        if let Ok(p) = std::fs::read_to_string(&pidfile) {
            break p.trim().to_string();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    let t = Instant::now();
    let out = steppe().args(["cancel", &id, "--coordinator", &c.url]).current_dir(dir).output().expect("cancel");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    while proc_dir.exists() {
        std::thread::sleep(Duration::from_millis(1));
    }
    t.elapsed()
}

fn main() {
    let dir = Dir::new("cluster");
    dir.write("many.yml", &support::across(STEPS, 2, "true"));
    dir.write("one.yml", "jobs:\n- name: one\n  plan:\n  - task: only\n    run: \"true\"\n");
    let mut rows = Vec::new();
    let mut one = Vec::new();
    let mut raw_one = Vec::new();
    let mut cancels = Vec::new();
    for pulling in [false, true] {
        let c = Cluster::start(&dir.0, 2, 1, pulling);
        c.submit(&dir.0, "one.yml");
        c.submit(&dir.0, "many.yml");
        let (mut raw, mut steppe) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            raw.push(raw_spawns(STEPS, 2, "true"));
            steppe.push(c.submit(&dir.0, "many.yml"));
        }
        rows.push((pulling, median(raw), median(steppe)));
        if !pulling {
            for _ in 0..RUNS * 4 {
                raw_one.push(raw_spawns(1, 1, "true"));
                one.push(c.submit(&dir.0, "one.yml"));
            }
            cancels = (0..7).map(|i| cancel_latency(&c, &dir.0, i)).collect();
        }
    }
    println!("cluster: Redis, a coordinator, 2 workers of 1 slot; {STEPS} steps of `true`, 2 in flight; median of {RUNS} runs");
    for (pulling, raw, steppe) in &rows {
        let how = if *pulling { "pulling (worker --queue)" } else { "pushed" };
        println!("  floor     sh -c true x{STEPS}, 2 at a time           {:>9.1} ms", ms(*raw));
        println!("  steppe    {how:<36} {:>9.1} ms", ms(*steppe));
        println!("  ratio     steppe / floor                       {:>9.2}x   (target 1.6x)", steppe.as_secs_f64() / raw.as_secs_f64());
    }
    let (raw_one, one) = (median(raw_one), median(one));
    println!("  floor     one sh -c true                       {:>9.2} ms", ms(raw_one));
    println!("  steppe    one-step submit (whole round trip)   {:>9.2} ms   (target 20 ms)", ms(one));
    cancels.sort();
    println!("  cancel    `steppe cancel` to the step's process gone: median {:.1} ms, max {:.1} ms of {}", ms(cancels[cancels.len() / 2]), ms(*cancels.last().expect("one")), cancels.len());
}
