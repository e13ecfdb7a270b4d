//! Per-step overhead embedded: 1,000 steps of `true` two at a time (an
//! `across:` with `max_in_flight: 2`) through the real `steppe run`, against
//! spawning `sh -c true` 1,000 times two at a time in the same run; and a
//! one-step pipeline's whole `steppe run` against one `sh -c true`.
//! Run: `cargo bench -p steppe-coordinator --bench embedded`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const STEPS: usize = 1000;
const SLOTS: usize = 2;
const RUNS: usize = 5;

fn raw_spawns(n: usize, at_once: usize) -> Duration {
    let t = Instant::now();
    let mut running = std::collections::VecDeque::new();
    for _ in 0..n {
        if running.len() == at_once {
            let mut c: std::process::Child = running.pop_front().expect("one running");
            c.wait().expect("wait");
        }
        running.push_back(Command::new("sh").args(["-c", "true"]).stdout(Stdio::null()).spawn().expect("spawn"));
    }
    for mut c in running {
        c.wait().expect("wait");
    }
    t.elapsed()
}

fn steppe_run(dir: &std::path::Path, file: &str, workers: usize) -> Duration {
    let _ = std::fs::remove_dir_all(dir.join(".steppe"));
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_steppe")).args(["run", file, "-q", "--workers", &workers.to_string()]).current_dir(dir).output().expect("run steppe");
    let took = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let dir = std::env::temp_dir().join(format!("steppe-bench-embedded-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let values: Vec<String> = (0..STEPS).map(|i| i.to_string()).collect();
    std::fs::write(dir.join("many.yml"), format!("jobs:\n- name: many\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {SLOTS}\n    run: \"true\"\n", values.join(", "))).expect("write");
    std::fs::write(dir.join("one.yml"), "jobs:\n- name: one\n  plan:\n  - task: only\n    run: \"true\"\n").expect("write");
    // Warm the page cache and the binary once.
    steppe_run(&dir, "one.yml", 1);
    let raw_many = median((0..RUNS).map(|_| raw_spawns(STEPS, SLOTS)).collect());
    let steppe_many = median((0..RUNS).map(|_| steppe_run(&dir, "many.yml", SLOTS)).collect());
    let raw_one = median((0..RUNS * 4).map(|_| raw_spawns(1, 1)).collect());
    let steppe_one = median((0..RUNS * 4).map(|_| steppe_run(&dir, "one.yml", 1)).collect());
    println!("embedded: median of {RUNS} runs ({} for one step)", RUNS * 4);
    println!("  floor     sh -c true x{STEPS}, {SLOTS} at a time   {:>9.1} ms", ms(raw_many));
    println!("  steppe    {STEPS} steps, {SLOTS} slots (whole run)   {:>9.1} ms", ms(steppe_many));
    println!("  ratio     steppe / floor                   {:>9.2}x   (target 1.3x)", steppe_many.as_secs_f64() / raw_many.as_secs_f64());
    println!("  overhead  per step                         {:>9.2} ms", (ms(steppe_many) - ms(raw_many)) / STEPS as f64 * SLOTS as f64);
    println!("  floor     one sh -c true                   {:>9.2} ms", ms(raw_one));
    println!("  steppe    one-step pipeline (whole run)    {:>9.2} ms   (target 10 ms)", ms(steppe_one));
    let _ = std::fs::remove_dir_all(&dir);
}
