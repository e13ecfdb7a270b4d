//! Orchestration cost: a 1,000-cell `across:` of `true` (max_in_flight 64)
//! through the real `steppe run`, against spawning `true` 1,000 times
//! directly (64 at a time, the same concurrency) in the same run.
//! Run: `cargo bench -p steppe-coordinator --bench across`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CELLS: usize = 1000;
const IN_FLIGHT: usize = 64;

fn raw_spawns() -> Duration {
    let t = Instant::now();
    let mut running = Vec::new();
    for _ in 0..CELLS {
        if running.len() == IN_FLIGHT {
            let mut c: std::process::Child = running.remove(0);
            c.wait().expect("wait");
        }
        running.push(Command::new("sh").args(["-c", "true"]).stdout(Stdio::null()).spawn().expect("spawn"));
    }
    for mut c in running {
        c.wait().expect("wait");
    }
    t.elapsed()
}

fn steppe_across(dir: &std::path::Path) -> Duration {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["run", "across.yml", "-q", "--workers", &IN_FLIGHT.to_string()])
        .current_dir(dir)
        .output()
        .expect("run steppe");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let dir = std::env::temp_dir().join(format!("steppe-bench-across-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let values: Vec<String> = (0..CELLS).map(|i| i.to_string()).collect();
    std::fs::write(
        dir.join("across.yml"),
        format!(
            "jobs:\n- name: fan-out\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {IN_FLIGHT}\n    run: \"true\"\n",
            values.join(", ")
        ),
    )
    .expect("write");
    let runs = 5;
    let raw = median((0..runs).map(|_| raw_spawns()).collect());
    let steppe = median((0..runs).map(|_| steppe_across(&dir)).collect());
    println!("across: {CELLS} cells of `true`, {IN_FLIGHT} in flight, median of {runs} runs");
    println!("  baseline  sh -c true x{CELLS} (64 at a time)   {:>8.1} ms", raw.as_secs_f64() * 1e3);
    println!("  steppe    steppe run (whole process)      {:>8.1} ms", steppe.as_secs_f64() * 1e3);
    println!("  ratio     steppe / raw spawn              {:>8.2}x", steppe.as_secs_f64() / raw.as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}
