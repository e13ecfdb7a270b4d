//! A coordinator that keeps up: 5,000 steps that each sleep one second,
//! 1,000 in flight, across ten `steppe worker` processes of 100 slots, on
//! Redis (queue and store); the whole `steppe submit` against the ideal
//! 5 s (five waves of a second). Reported beside it: the coordinator's CPU
//! time per step and its resident memory per step in flight (its peak
//! during the run less its size before), and the workers' CPU per step.
//! Beside the ideal, the floor of this machine: `sh -c "sleep 1"` spawned
//! 5,000 times, 1,000 at a time, in the same run (the spawns themselves
//! take the two cores a while), and `sleep 1` itself spawned directly the
//! same way (what starting 5,000 `sleep`s costs this machine with no shell:
//! the ideal's distance that no runner can take back).
//! Every step runs (`--force`). Needs `redis-server` on PATH.
//! Run: `cargo bench -p steppe-coordinator --bench keep_up`.

mod support;

use std::time::Duration;

use support::{cpu_time, median, ms, peak_rss_during, raw_execs, raw_spawns, rss_kib, Cluster, Dir};

const STEPS: usize = 5000;
const IN_FLIGHT: usize = 1000;
const WORKERS: usize = 10;
const RUNS: usize = 5;

fn main() {
    let dir = Dir::new("keep-up");
    dir.write("wide.yml", &support::across(STEPS, IN_FLIGHT, "sleep 1"));
    dir.write("warm.yml", &support::across(IN_FLIGHT, IN_FLIGHT, "true"));
    let c = Cluster::start(&dir.0, WORKERS, IN_FLIGHT / WORKERS, false);
    // Every slot used once before measuring (connections, buffers).
    c.submit(&dir.0, "warm.yml");
    let coordinator = c.coordinator.id();
    let workers: Vec<u32> = c.workers.iter().map(|w| w.id()).collect();
    let (mut walls, mut coord_cpu, mut worker_cpu, mut per_flight, mut floors, mut direct) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        floors.push(raw_spawns(STEPS, IN_FLIGHT, "sleep 1"));
        direct.push(raw_execs(STEPS, IN_FLIGHT, "sleep", &["1"]));
        let before = rss_kib(coordinator);
        let (cpu0, wcpu0) = (cpu_time(coordinator), workers.iter().map(|w| cpu_time(*w)).sum::<Duration>());
        let (wall, peak) = peak_rss_during(coordinator, || c.submit(&dir.0, "wide.yml"));
        coord_cpu.push(cpu_time(coordinator) - cpu0);
        worker_cpu.push(workers.iter().map(|w| cpu_time(*w)).sum::<Duration>() - wcpu0);
        per_flight.push(peak.saturating_sub(before) as f64 / IN_FLIGHT as f64);
        walls.push(wall);
    }
    let ideal = Duration::from_secs((STEPS / IN_FLIGHT) as u64);
    let wall = median(walls);
    let floor = median(floors);
    let direct = median(direct);
    let (coord_cpu, worker_cpu) = (median(coord_cpu), median(worker_cpu));
    per_flight.sort_by(f64::total_cmp);
    println!("keep-up: {STEPS} steps of `sleep 1`, {IN_FLIGHT} in flight, {WORKERS} workers x{} slots, Redis; median of {RUNS} runs", IN_FLIGHT / WORKERS);
    println!("  ideal     five waves of one second             {:>9.0} ms", ms(ideal));
    println!("  floor     sh -c \"sleep 1\" x{STEPS}, {IN_FLIGHT} at a time  {:>9.0} ms", ms(floor));
    println!("  floor     sleep 1 x{STEPS} spawned directly         {:>9.0} ms", ms(direct));
    println!("  steppe    whole submit                         {:>9.0} ms", ms(wall));
    println!("  ratio     steppe / ideal                       {:>9.2}x   (target 1.2x)", wall.as_secs_f64() / ideal.as_secs_f64());
    println!("  ratio     steppe / floor                       {:>9.2}x", wall.as_secs_f64() / floor.as_secs_f64());
    println!("  ratio     steppe / direct spawning             {:>9.2}x   (direct spawning / ideal {:.2}x)", wall.as_secs_f64() / direct.as_secs_f64(), direct.as_secs_f64() / ideal.as_secs_f64());
    println!("  coordinator CPU per step                       {:>9.3} ms", ms(coord_cpu) / STEPS as f64);
    println!("  coordinator memory per step in flight          {:>9.1} KiB", per_flight[per_flight.len() / 2]);
    println!("  workers' CPU per step (all ten)                {:>9.3} ms", ms(worker_cpu) / STEPS as f64);
}
