//! Cluster throughput: 2,000 trivial steps (an `across:` of `true`) through
//! a coordinator on Redis (queue and store) with two `steppe worker`
//! processes, beside the same pipeline in embedded mode, in the same run.
//! Reports steps per second (whole client process, wall clock) and the
//! dispatch latency of a step as the coordinator recorded it (queued →
//! result back, which for `true` is almost all dispatch), p50 and p99.
//! Needs `redis-server` on PATH (scripts/test installs it).
//! Run: `cargo bench -p steppe-coordinator --bench cluster`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use steppe_runtime::store::{SqliteStore, Store};
use steppe_runtime::store::RedisStore;

const STEPS: usize = 2000;
const SLOTS_PER_WORKER: usize = 8;
const IN_FLIGHT: usize = 2 * SLOTS_PER_WORKER;

struct Figures {
    wall: Duration,
    p50_ms: i64,
    p99_ms: i64,
}

fn figures(wall: Duration, store: &dyn Store) -> Figures {
    let run = store.runs(&steppe_runtime::store::RunFilter { limit: 1, ..Default::default() }).expect("runs").into_iter().next().expect("a recorded run");
    assert_eq!(run.outcome.as_deref(), Some("succeeded"), "{run:?}");
    let mut ms: Vec<i64> = store.steps(&run.id).expect("steps").iter().map(|s| s.duration_ms).collect();
    assert_eq!(ms.len(), STEPS, "every cell recorded once");
    ms.sort_unstable();
    Figures { wall, p50_ms: ms[ms.len() / 2], p99_ms: ms[ms.len() * 99 / 100] }
}

fn steppe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_steppe"))
}

fn embedded(dir: &Path) -> Figures {
    let _ = std::fs::remove_dir_all(dir.join(".steppe"));
    let t = Instant::now();
    let out = steppe().args(["run", "bench.yml", "-q", "--workers", &IN_FLIGHT.to_string()]).current_dir(dir).output().expect("run steppe");
    let wall = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let store = SqliteStore::open(&steppe_runtime::store::db_path(&dir.join("bench.yml"))).expect("open store");
    figures(wall, &store)
}

struct Cluster {
    redis: Child,
    coordinator: Child,
    workers: Vec<Child>,
    redis_url: String,
    url: String,
}

impl Cluster {
    /// `pulling`: the workers take from the Redis queue themselves (`--queue`).
    fn start(dir: &Path, pulling: bool) -> Cluster {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
        let redis = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/test installs it)");
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let redis_url = format!("redis://127.0.0.1:{port}/");
        let mut coordinator = steppe()
            .args(["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url, "--store", &redis_url])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn coordinator");
        let mut lines = BufReader::new(coordinator.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("address line").expect("utf8");
        let url = format!("http://{}", first.split_once("serving workers on ").expect("address line").1);
        std::thread::spawn(move || for _ in lines.by_ref() {});
        let workers = (0..2)
            .map(|_| {
                let mut w = steppe();
                w.args(["worker", "--coordinator", &url, "--slots", &SLOTS_PER_WORKER.to_string()]);
                if pulling {
                    w.args(["--queue", &redis_url]);
                }
                w.current_dir(dir)
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn worker")
            })
            .collect();
        Cluster { redis, coordinator, workers, redis_url, url }
    }

    fn submit(&self, dir: &Path) -> Figures {
        let t = Instant::now();
        let out = steppe().args(["submit", "bench.yml", "--coordinator", &self.url]).current_dir(dir).output().expect("submit");
        let wall = t.elapsed();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
        let store = RedisStore::connect(&self.redis_url, "steppe").expect("redis store");
        figures(wall, &store)
    }
}

impl Cluster {
    /// From `steppe cancel` starting to the step's process being gone on
    /// the worker, for a detached run whose step sleeps.
    fn cancel_latency(&self, dir: &Path, i: usize) -> Duration {
        let pidfile = dir.join(format!("cancel-{i}.pid"));
        std::fs::write(dir.join("cancel.yml"), format!("jobs:\n- name: c\n  plan:\n  - task: nap\n    run: echo $$ > {}.tmp; mv {}.tmp {}; sleep 60\n", pidfile.display(), pidfile.display(), pidfile.display()))
            .expect("write");
        let out = steppe().args(["submit", "cancel.yml", "--detach", "--coordinator", &self.url]).current_dir(dir).output().expect("submit");
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let pid = loop {
            if let Ok(p) = std::fs::read_to_string(&pidfile) {
                break p.trim().to_string();
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let t = Instant::now();
        let out = steppe().args(["cancel", &id, "--coordinator", &self.url]).current_dir(dir).output().expect("cancel");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        while proc_dir.exists() {
            std::thread::sleep(Duration::from_millis(1));
        }
        t.elapsed()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.workers.iter_mut().chain([&mut self.coordinator, &mut self.redis]) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn median_by_wall(mut v: Vec<Figures>) -> Figures {
    v.sort_by_key(|f| f.wall);
    v.swap_remove(v.len() / 2)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("steppe-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let values: Vec<String> = (0..STEPS).map(|i| i.to_string()).collect();
    std::fs::write(
        dir.join("bench.yml"),
        format!(
            "jobs:\n- name: fan-out\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {IN_FLIGHT}\n    run: \"true\"\n",
            values.join(", ")
        ),
    )
    .expect("write");
    let runs = 3;
    let local = median_by_wall((0..runs).map(|_| embedded(&dir)).collect());
    let cluster = Cluster::start(&dir, false);
    // A fresh Redis per measurement would hide nothing; the store keeps
    // every run, and `figures` reads the newest.
    let remote = median_by_wall((0..runs).map(|_| cluster.submit(&dir)).collect());
    drop(cluster);
    let cluster = Cluster::start(&dir, true);
    let pulled = median_by_wall((0..runs).map(|_| cluster.submit(&dir)).collect());
    let mut cancels: Vec<Duration> = (0..7).map(|i| cluster.cancel_latency(&dir, i)).collect();
    cancels.sort();
    drop(cluster);
    let rate = |f: &Figures| STEPS as f64 / f.wall.as_secs_f64();
    println!("cluster: {STEPS} steps of `true`, {IN_FLIGHT} in flight, median of {runs} runs");
    let embedded_label = format!("embedded  steppe run --workers {IN_FLIGHT}");
    let cluster_label = format!("cluster   submit, Redis, 2 workers x{SLOTS_PER_WORKER}");
    let pulled_label = "cluster   the same, workers --queue".to_string();
    println!("  {:<40} {:>8} {:>8} {:>8}", "", "steps/s", "p50", "p99");
    for (label, f) in [(embedded_label, &local), (cluster_label, &remote), (pulled_label, &pulled)] {
        println!("  {label:<40} {:>8.0} {:>5} ms {:>5} ms", rate(f), f.p50_ms, f.p99_ms);
    }
    println!("  {:<40} {:>7.2}x", "ratio     cluster / embedded steps/s", rate(&remote) / rate(&local));
    println!("  {:<40} {:>7.2}x", "ratio     pulling / embedded steps/s", rate(&pulled) / rate(&local));
    println!(
        "cancel: `steppe cancel` to the step's process gone on a worker, {} runs: median {} ms, max {} ms",
        cancels.len(),
        cancels[cancels.len() / 2].as_millis(),
        cancels.last().map_or(0, |d| d.as_millis())
    );
    let _ = std::fs::remove_dir_all(&dir);
}
