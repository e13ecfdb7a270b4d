//! Orchestration cost at width: a 1,000-cell `across:` of `true`
//! (max_in_flight 64) through the real `steppe run --workers 64`, against
//! spawning `sh -c true` 1,000 times 64 at a time in the same run.
//! Run: `cargo bench -p steppe-coordinator --bench across`.

mod support;

use support::{median, ms, raw_spawns, timed, Dir};

const CELLS: usize = 1000;
const IN_FLIGHT: usize = 64;
const RUNS: usize = 5;

fn main() {
    let dir = Dir::new("across");
    dir.write("across.yml", &support::across(CELLS, IN_FLIGHT, "true"));
    let run = || timed(&dir.0, &["run", "across.yml", "-q", "--force", "--workers", &IN_FLIGHT.to_string()]);
    run();
    let (mut raw, mut steppe) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        raw.push(raw_spawns(CELLS, IN_FLIGHT, "true"));
        steppe.push(run());
    }
    let (raw, steppe) = (median(raw), median(steppe));
    println!("across: {CELLS} cells of `true`, {IN_FLIGHT} in flight, median of {RUNS} runs");
    println!("  floor     sh -c true x{CELLS}, {IN_FLIGHT} at a time   {:>8.1} ms", ms(raw));
    println!("  steppe    steppe run (whole process)       {:>8.1} ms", ms(steppe));
    println!("  ratio     steppe / floor                   {:>8.2}x", steppe.as_secs_f64() / raw.as_secs_f64());
}
