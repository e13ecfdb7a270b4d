//! The distributed queues side by side: 2,000 trivial steps (an `across:` of
//! `true`) through a coordinator and two workers on Redis, SQS (a local
//! moto server) and Pub/Sub (the SDK's emulator), beside embedded mode, in
//! the same run: steps per second and the dispatch latency the store
//! recorded, p50 and p99. Then each queue alone, no steppe around it:
//! push, take and acknowledge one assignment at a time, which is what the
//! local server itself costs per step.
//! Needs redis-server, moto_server ($STEPPE_VENV) and the Pub/Sub emulator.
//! Run: `cargo bench -p steppe-coordinator --bench cloud_queues` (STEPPE_BENCH_STEPS=N for fewer).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use steppe_runtime::store::{RunFilter, SqliteStore, Store};

fn steps() -> usize {
    std::env::var("STEPPE_BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000)
}
const SLOTS_PER_WORKER: usize = 8;
const IN_FLIGHT: usize = 2 * SLOTS_PER_WORKER;

fn steppe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_steppe"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

fn wait_port(port: u16) {
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t.elapsed() < Duration::from_secs(60), "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A queue service: its process and the coordinator's --queue URL.
fn service(kind: &str) -> (Child, String) {
    let port = free_port();
    let (child, url) = match kind {
        "redis" => (Command::new("redis-server").args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]).stdout(Stdio::null()).spawn().expect("redis-server"), format!("redis://127.0.0.1:{port}/")),
        "sqs" => {
            let bin = std::env::var_os("STEPPE_VENV").map(|v| PathBuf::from(v).join("bin/moto_server")).unwrap_or_else(|| "moto_server".into());
            let c = Command::new(bin).args(["-H", "127.0.0.1", "-p", &port.to_string()]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("moto_server");
            for (k, v) in [("AWS_ENDPOINT_URL", format!("http://127.0.0.1:{port}")), ("AWS_REGION", "us-east-1".into()), ("AWS_ACCESS_KEY_ID", "test".into()), ("AWS_SECRET_ACCESS_KEY", "test".into())] {
                std::env::set_var(k, v);
            }
            (c, format!("sqs://bench{port}"))
        }
        _ => {
            let bin = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator";
            let c = Command::new(bin).args(["--host=127.0.0.1", &format!("--port={port}")]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("pubsub emulator");
            std::env::set_var("PUBSUB_EMULATOR_HOST", format!("127.0.0.1:{port}"));
            (c, format!("pubsub://bench/bench{port}"))
        }
    };
    wait_port(port);
    (child, url)
}

struct Figures {
    wall: Duration,
    p50_ms: i64,
    p99_ms: i64,
}

fn figures(wall: Duration, store: &dyn Store, n: usize) -> Figures {
    let run = store.runs(&RunFilter { limit: 1, ..Default::default() }).expect("runs").into_iter().next().expect("a run");
    assert_eq!(run.outcome.as_deref(), Some("succeeded"), "{run:?}");
    let mut ms: Vec<i64> = store.steps(&run.id).expect("steps").iter().map(|s| s.duration_ms).collect();
    assert_eq!(ms.len(), n, "every cell recorded once");
    ms.sort_unstable();
    Figures { wall, p50_ms: ms[ms.len() / 2], p99_ms: ms[ms.len() * 99 / 100] }
}

fn embedded(dir: &Path, n: usize) -> Figures {
    let _ = std::fs::remove_dir_all(dir.join(".steppe"));
    let t = Instant::now();
    let out = steppe().args(["run", "bench.yml", "-q", "--workers", &IN_FLIGHT.to_string()]).current_dir(dir).output().expect("run");
    let wall = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    figures(wall, &SqliteStore::open(&steppe_runtime::store::db_path(&dir.join("bench.yml"))).expect("store"), n)
}

/// A coordinator and two pushed workers on `queue`; one submission.
fn through(dir: &Path, kind: &str, queue: &str, n: usize) -> Figures {
    let state = dir.join(format!("state-{kind}"));
    let _ = std::fs::remove_dir_all(&state);
    let mut coordinator = steppe()
        .args(["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", state.to_str().expect("utf8"), "--queue", queue])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .spawn()
        .expect("coordinator");
    let mut lines = BufReader::new(coordinator.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("address").expect("utf8");
    let url = format!("http://{}", first.split_once("serving workers on ").expect("address line").1);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut workers: Vec<Child> = (0..2).map(|_| steppe().args(["worker", "--coordinator", &url, "--slots", &SLOTS_PER_WORKER.to_string()]).stderr(Stdio::null()).spawn().expect("worker")).collect();
    let t = Instant::now();
    let out = steppe().args(["submit", "bench.yml", "--coordinator", &url]).current_dir(dir).output().expect("submit");
    let wall = t.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    for c in workers.iter_mut().chain([&mut coordinator]) {
        let _ = c.kill();
        let _ = c.wait();
    }
    figures(wall, &SqliteStore::open(&state.join("steppe.db")).expect("store"), n)
}

/// The queue alone: `n` assignments pushed, taken and acknowledged one at a time.
fn queue_alone(url: &str, n: usize) -> Duration {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let q: Arc<dyn steppe_runtime::queue::Queue> = steppe_cloud::queues::connect(url, &format!("{}-alone", steppe_cloud::queues::base_key(url, "steppe:alone")), "bench", Duration::from_secs(60), &Default::default()).await.expect("queue");
        let t = Instant::now();
        for i in 0..n {
            q.push(steppe_runtime::queue::conformance::a(&format!("a{i}"))).await.expect("push");
            let got = q.pop().await.expect("pop");
            q.ack(&got.id).await.expect("ack");
        }
        t.elapsed()
    })
}

fn main() {
    let n = steps();
    let dir = std::env::temp_dir().join(format!("steppe-bench-queues-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    std::fs::write(dir.join("bench.yml"), format!("jobs:\n- name: fan-out\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {IN_FLIGHT}\n    run: \"true\"\n", values.join(", "))).expect("write");
    let base = embedded(&dir, n);
    let rate = |f: &Figures| n as f64 / f.wall.as_secs_f64();
    println!("queues: {n} steps of `true`, {IN_FLIGHT} in flight, 2 workers x{SLOTS_PER_WORKER} pushed, history in SQLite");
    println!("  {:<34} {:>8} {:>8} {:>8} {:>10} {:>16}", "", "steps/s", "p50", "p99", "/embedded", "queue alone/op");
    println!("  {:<34} {:>8.0} {:>5} ms {:>5} ms {:>9.2}x", "embedded", rate(&base), base.p50_ms, base.p99_ms, 1.0);
    for kind in ["redis", "sqs", "pubsub"] {
        let (mut svc, url) = service(kind);
        let f = through(&dir, kind, &url, n);
        let alone = queue_alone(&url, 200.min(n));
        println!(
            "  {:<34} {:>8.0} {:>5} ms {:>5} ms {:>9.2}x {:>13.2} ms",
            format!("{kind} ({url})"),
            rate(&f),
            f.p50_ms,
            f.p99_ms,
            rate(&f) / rate(&base),
            alone.as_secs_f64() * 1000.0 / 200.min(n) as f64
        );
        let _ = svc.kill();
        let _ = svc.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
