//! Per-step overhead embedded: 1,000 steps of `true` two at a time (an
//! `across:` with `max_in_flight: 2`) through the real `steppe run --workers
//! 2`, against spawning `sh -c true` 1,000 times two at a time in the same
//! run; and a one-step pipeline's whole `steppe run` (its store already
//! made, as on every run but a pipeline's first) against one `sh -c true`.
//! Every step runs (`--force`: nothing is skipped as unchanged).
//! Run: `cargo bench -p steppe-coordinator --bench embedded`.

mod support;

use std::time::Duration;
use support::{median, ms, raw_spawns, timed, Dir};

const STEPS: usize = 1000;
const SLOTS: usize = 2;
const RUNS: usize = 7;

fn main() {
    let dir = Dir::new("embedded");
    dir.write("many.yml", &support::across(STEPS, SLOTS, "true"));
    dir.write("one.yml", "jobs:\n- name: one\n  plan:\n  - task: only\n    run: \"true\"\n");
    let run = |file: &str, workers: usize| timed(&dir.0, &["run", file, "-q", "--force", "--workers", &workers.to_string()]);
    // Warm the page cache, the binary and the stores once.
    run("one.yml", 1);
    run("many.yml", SLOTS);
    // Floor and steppe interleaved, so a slow spell of the machine touches both.
    let (mut raw_many, mut steppe_many) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        raw_many.push(raw_spawns(STEPS, SLOTS, "true"));
        steppe_many.push(run("many.yml", SLOTS));
    }
    let (mut raw_one, mut steppe_one, mut fresh_one) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS * 4 {
        raw_one.push(raw_spawns(1, 1, "true"));
        steppe_one.push(run("one.yml", 1));
    }
    for _ in 0..RUNS {
        let _ = std::fs::remove_dir_all(dir.0.join(".steppe"));
        fresh_one.push(run("one.yml", 1));
    }
    let (raw_many, steppe_many) = (median(raw_many), median(steppe_many));
    let (raw_one, steppe_one, fresh_one): (Duration, Duration, Duration) = (median(raw_one), median(steppe_one), median(fresh_one));
    println!("embedded: median of {RUNS} runs ({} for one step)", RUNS * 4);
    println!("  floor     sh -c true x{STEPS}, {SLOTS} at a time       {:>9.1} ms", ms(raw_many));
    println!("  steppe    {STEPS} steps, {SLOTS} slots (whole run)       {:>9.1} ms", ms(steppe_many));
    println!("  ratio     steppe / floor                       {:>9.2}x   (target 1.3x)", steppe_many.as_secs_f64() / raw_many.as_secs_f64());
    println!("  overhead  per step                             {:>9.3} ms", (ms(steppe_many) - ms(raw_many)) / STEPS as f64 * SLOTS as f64);
    println!("  floor     one sh -c true                       {:>9.2} ms", ms(raw_one));
    println!("  steppe    one-step pipeline (whole run)        {:>9.2} ms   (target 10 ms)", ms(steppe_one));
    println!("  steppe    the same, its store made first       {:>9.2} ms", ms(fresh_one));
}
