//! What the benchmarks share: the floor they are measured against (raw
//! process spawning at the same concurrency), the binary, a Redis, a
//! cluster of a coordinator and worker processes, and readings of a
//! process's CPU time and resident memory from /proc.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn steppe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_steppe"))
}

/// `sh -c CMD` spawned `n` times, `at_once` at a time: the floor.
pub fn raw_spawns(n: usize, at_once: usize, cmd: &str) -> Duration {
    raw_execs(n, at_once, "sh", &["-c", cmd])
}

/// As [`raw_spawns`], `program ARGS` started directly (no shell).
pub fn raw_execs(n: usize, at_once: usize, program: &str, args: &[&str]) -> Duration {
    let t = Instant::now();
    let mut running = std::collections::VecDeque::new();
    for _ in 0..n {
        if running.len() == at_once {
            let mut c: Child = running.pop_front().expect("one running");
            c.wait().expect("wait");
        }
        running.push_back(Command::new(program).args(args).stdout(Stdio::null()).spawn().expect("spawn"));
    }
    for mut c in running {
        c.wait().expect("wait");
    }
    t.elapsed()
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A scratch directory for one benchmark, removed when dropped.
pub struct Dir(pub PathBuf);

impl Dir {
    pub fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("steppe-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        Dir(d)
    }
    pub fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).expect("write");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A pipeline of one job whose one task runs `run` once per value of an
/// `across:` of `n` values, `in_flight` at a time.
pub fn across(n: usize, in_flight: usize, run: &str) -> String {
    let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!("jobs:\n- name: many\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {in_flight}\n    run: \"{run}\"\n", values.join(", "))
}

/// Runs `steppe ARGS` in `dir`; panics with its output unless it succeeds.
pub fn timed(dir: &Path, args: &[&str]) -> Duration {
    let t = Instant::now();
    let out = steppe().args(args).current_dir(dir).output().expect("run steppe");
    let took = t.elapsed();
    assert!(out.status.success(), "steppe {args:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    took
}

/// A process's CPU time so far (user + system), from /proc/PID/stat.
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // The fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// A process's resident memory now, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// The highest resident memory of `pid` seen while `f` runs (sampled every 10 ms).
pub fn peak_rss_during<T>(pid: u32, f: impl FnOnce() -> T) -> (T, u64) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid));
                std::thread::sleep(Duration::from_millis(10));
            }
            peak
        })
    };
    let r = f();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sampler.join().expect("sampler");
    (r, peak)
}

/// A process's high-water resident memory (VmHWM), in KiB.
pub fn hwm_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

/// A redis-server on loopback, stopped when dropped.
pub struct Redis {
    child: Child,
    pub url: String,
}

impl Redis {
    pub fn start() -> Redis {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--maxclients", "10000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (scripts/test installs it)");
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(30), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { child, url: format!("redis://127.0.0.1:{port}/") }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A coordinator on a Redis (queue and store) and worker processes.
pub struct Cluster {
    pub redis: Redis,
    pub coordinator: Child,
    pub workers: Vec<Child>,
    pub url: String,
}

impl Cluster {
    /// `workers` processes of `slots` each; `pulling`: they take from the
    /// Redis queue themselves (`--queue`) instead of being handed steps.
    pub fn start(dir: &Path, workers: usize, slots: usize, pulling: bool) -> Cluster {
        let redis = Redis::start();
        let mut coordinator = steppe()
            .args(["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis.url, "--store", &redis.url])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn coordinator");
        let mut lines = BufReader::new(coordinator.stdout.take().expect("stdout")).lines();
        let first = lines.next().expect("address line").expect("utf8");
        let url = format!("http://{}", first.split_once("serving workers on ").expect("address line").1);
        let joined = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = joined.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if l.contains(" joined (") {
                    seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        let workers: Vec<Child> = (0..workers)
            .map(|_| {
                let mut w = steppe();
                w.args(["worker", "--coordinator", &url, "--slots", &slots.to_string()]);
                if pulling {
                    w.args(["--queue", &redis.url]);
                }
                w.current_dir(dir).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("spawn worker")
            })
            .collect();
        // Until every worker has joined (the coordinator says so on its log).
        let t = Instant::now();
        while joined.load(std::sync::atomic::Ordering::Relaxed) < workers.len() {
            assert!(t.elapsed() < Duration::from_secs(60), "workers did not join");
            std::thread::sleep(Duration::from_millis(20));
        }
        Cluster { redis, coordinator, workers, url }
    }

    /// A whole `steppe submit` of `file`, every step run (`--force`).
    pub fn submit(&self, dir: &Path, file: &str) -> Duration {
        timed(dir, &["submit", file, "--coordinator", &self.url, "-q", "--force"])
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self.workers.iter_mut().chain([&mut self.coordinator]) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
