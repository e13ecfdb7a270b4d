//! What the end-to-end tests share: processes that die with their test,
//! the real binary, scratch directories, a coordinator, a Redis.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// A process that dies with the test's thread: a test that panics leaves no
/// coordinator, worker or Redis running behind it.
pub fn child_of_this_test(program: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(program);
    // SAFETY: prctl is async-signal-safe and only sets the child's own death signal.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    c
}

/// `steppe worker --coordinator URL` with `args`, its stderr dropped.
pub fn spawn_worker(url: &str, args: &[&str]) -> std::process::Child {
    child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", url]).args(args).stderr(std::process::Stdio::null()).spawn().expect("spawn worker")
}

/// Kills and reaps every process given (what a test started and is done with).
pub fn stop<'a>(children: impl IntoIterator<Item = &'a mut std::process::Child>) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

pub fn steppe(args: &[&str], dir: &Path) -> Output {
    child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(args)
        .current_dir(dir)
        .env_remove("STEPPE_MODEL")
        .env_remove("STEPS_MODEL")
        .output()
        .expect("run steppe")
}

pub fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A pipeline of one job `many` whose task `cell` runs `run` once for each
/// of `cells` values of `i`, `in_flight` at a time.
pub fn across(cells: usize, in_flight: usize, run: &str) -> String {
    let values: Vec<String> = (0..cells).map(|i| i.to_string()).collect();
    format!("jobs:\n- name: many\n  plan:\n  - task: cell\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {in_flight}\n    run: \"{run}\"\n", values.join(", "))
}

pub fn scratch(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_dead_tests_scratch);
    let d = std::env::temp_dir().join(format!("steppe-run-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("mkdir");
    d
}

/// Removes the scratch directories of test processes that are gone (each
/// test is a process of its own: without this, every suite run leaves its
/// hundreds behind in the temp dir).
fn sweep_dead_tests_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("steppe-run-")).and_then(|n| n.rsplit_once('-')).and_then(|(_, pid)| pid.parse::<i32>().ok()) else { continue };
        if pid > 0 && !steppe_runtime::scratch::alive(pid) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Starts `steppe ARGS` in `dir` (a coordinator, or a run with `--listen`)
/// and reads from its first line the URL it serves workers on; the rest of
/// its output is the caller's.
pub fn serving(args: &[&str], dir: &Path) -> (std::process::Child, String, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn steppe");
    serving_child(child)
}

/// As [`serving`], for a child the caller started (stdout piped).
pub fn serving_child(mut child: std::process::Child) -> (std::process::Child, String, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    use std::io::{BufRead, BufReader};
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a first line").expect("utf8");
    // A coordinator's first log line (text or JSON) or `run --listen`'s plain one.
    let addr = first.split_once("serving workers on ").map(|(_, a)| a.split('"').next().unwrap_or(a)).unwrap_or_else(|| panic!("unexpected first line {first:?}"));
    let url = match addr.strip_suffix(" (TLS)") {
        Some(addr) => format!("https://{addr}"),
        None => format!("http://{addr}"),
    };
    (child, url, lines)
}

/// A throwaway redis-server on a free loopback port (scripts/test installs it).
pub fn redis_server() -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let child = child_of_this_test("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, format!("redis://127.0.0.1:{port}/"))
}


/// What a process printed (stdout and stderr, in arrival order), kept for
/// failure messages.
pub type Log = std::sync::Arc<std::sync::Mutex<String>>;

/// As [`serving`], with everything the process prints kept in a [`Log`].
pub fn serving_logged(args: &[&str], dir: &Path) -> (std::process::Child, String, Log) {
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn steppe");
    serving_child_logged(child)
}

/// As [`serving_logged`], for a child the caller started (stdout and stderr piped).
pub fn serving_child_logged(child: std::process::Child) -> (std::process::Child, String, Log) {
    let (mut child, url, lines) = serving_child(child);
    let log = Log::default();
    let stderr = child.stderr.take().expect("stderr");
    keep_lines(lines.map_while(Result::ok), &log);
    keep_lines(std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok), &log);
    (child, url, log)
}

/// Appends each line of `src` to `log` as it comes, on a thread of its own.
pub fn keep_lines(src: impl Iterator<Item = String> + Send + 'static, log: &Log) {
    let log = log.clone();
    std::thread::spawn(move || {
        for l in src {
            if let Ok(mut g) = log.lock() {
                g.push_str(&l);
                g.push('\n');
            }
        }
    });
}

/// `steppe ARGS` in `dir` started in the background with no terminal
/// (stdin closed), everything it prints kept in a [`Log`].
pub fn spawn_logged(args: &[&str], dir: &Path) -> (std::process::Child, Log) {
    let mut child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(args)
        .current_dir(dir)
        .env_remove("STEPPE_MODEL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn steppe");
    let log = Log::default();
    let (stdout, stderr) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    keep_lines(std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok), &log);
    keep_lines(std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok), &log);
    (child, log)
}

/// Waits up to `limit` for `log` to hold `what`; panics showing the log.
pub fn wait_in_log(log: &Log, what: &str, limit: Duration) {
    let t0 = Instant::now();
    while !log.lock().map(|l| l.contains(what)).unwrap_or(false) {
        assert!(t0.elapsed() < limit, "{what:?} never showed; the process printed:\n{}", log.lock().map(|l| l.clone()).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The Python interpreter of the suite's venv (scripts/test installs the `mcp` SDK there).
pub fn venv_python() -> String {
    std::env::var_os("STEPPE_VENV").map(|v| std::path::PathBuf::from(v).join("bin/python")).filter(|p| p.exists()).map(|p| p.display().to_string()).unwrap_or_else(|| "python3".into())
}

/// A path of this repository (`tests/run`, `docs`, `deploy/build-image.sh`).
pub fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The files directly in the repository's directory `rel` whose names end in
/// one of `exts`, sorted; there must be some.
pub fn files_in(rel: &str, exts: &[&str]) -> Vec<PathBuf> {
    let dir = repo(rel);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| exts.iter().any(|e| x == *e)))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no {exts:?} files in {}", dir.display());
    v
}

/// The self-checking pipelines of `tests/run/SUB`.
pub fn fixtures(sub: &str) -> Vec<PathBuf> {
    files_in(&format!("tests/run/{sub}"), &["yml"])
}

/// `steppe ARGS` in `dir`: its exit code, stdout and stderr.
pub fn run_steppe(args: &[&str], dir: &Path) -> (i32, String, String) {
    let out = steppe(args, dir);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Waits up to `limit` for `check` to hold, polling; panics naming `what`.
/// The lines of a file a test's steps append to (none while it does not exist).
pub fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_string).collect()
}

pub fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !check() {
        assert!(t0.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Where a test cluster's queue lives: Redis (queue and history), or SQS on
/// a moto server (history in the coordinator's SQLite).
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Redis,
    Sqs,
    PubSub,
}

impl Backend {
    /// Starts the service; its process, the queue URL, and the coordinator's
    /// arguments for it. For SQS the AWS environment of this test (and the
    /// processes it starts) points at the moto server.
    pub fn start(self) -> (std::process::Child, String, Vec<String>) {
        match self {
            Backend::Redis => {
                let (child, url) = redis_server();
                let args = vec!["--queue".into(), url.clone(), "--store".into(), url.clone()];
                (child, url, args)
            }
            Backend::Sqs => {
                let (child, endpoint) = moto_server();
                // Each test is a process of its own under nextest: its environment is its own.
                for (k, v) in [("AWS_ENDPOINT_URL", endpoint.as_str()), ("AWS_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")] {
                    std::env::set_var(k, v);
                }
                let url = "sqs://steppe".to_string();
                (child, url.clone(), vec!["--queue".into(), url])
            }
            Backend::PubSub => {
                let (child, host) = pubsub_emulator();
                std::env::set_var("PUBSUB_EMULATOR_HOST", host);
                let url = "pubsub://steppe-test/steppe".to_string();
                (child, url.clone(), vec!["--queue".into(), url])
            }
        }
    }
}

/// The Pub/Sub emulator of the Google Cloud SDK (in the machine image) on a
/// free port; its host:port.
pub fn pubsub_emulator() -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let sdk = Command::new("gcloud").args(["info", "--format=value(installation.sdk_root)"]).output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).filter(|s| !s.is_empty());
    let bin = std::env::var_os("PUBSUB_EMULATOR_BIN").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(sdk.unwrap_or_else(|| "/usr/lib/google-cloud-sdk".into())).join("platform/pubsub-emulator/bin/cloud-pubsub-emulator"));
    let child = child_of_this_test(bin.to_str().expect("utf8"))
        .args(["--host=127.0.0.1", &format!("--port={port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{} ({e}): the Pub/Sub emulator ships with the Google Cloud SDK", bin.display()));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the Pub/Sub emulator did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    (child, format!("127.0.0.1:{port}"))
}

/// A moto server (the AWS APIs; scripts/test installs moto[server] in $STEPPE_VENV) on a free port.
pub fn moto_server() -> (std::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let bin = std::env::var_os("STEPPE_VENV").map(|v| PathBuf::from(v).join("bin/moto_server")).filter(|p| p.exists()).unwrap_or_else(|| "moto_server".into());
    let child = child_of_this_test(bin.to_str().expect("utf8"))
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{} ({e}): scripts/test installs moto[server] in $STEPPE_VENV", bin.display()));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(30), "moto_server did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, format!("http://127.0.0.1:{port}"))
}

/// A step line without its duration (`✔ build (0.02s)` → `✔ build`), to compare runs.
pub fn without_durations(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find(" (") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        match after.find(')') {
            Some(j) if after[..j].ends_with('s') && after[..j].trim_end_matches(['s', 'm']).parse::<f64>().is_ok() => rest = &after[j + 1..],
            _ => {
                out.push_str(" (");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// `tests/agents/SUB/*.yml`, each with its scenario (`NAME.scenario.yaml`), sorted.
pub fn agent_cases(sub: &str) -> Vec<(PathBuf, PathBuf)> {
    let dir = repo("tests/agents").join(sub);
    let mut v: Vec<(PathBuf, PathBuf)> = std::fs::read_dir(&dir)
        .expect("tests/agents")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yml"))
        .map(|p| {
            let s = p.with_extension("scenario.yaml");
            (p, s)
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no pipelines in {}", dir.display());
    v
}

/// The image container tests and the docs' container examples run in:
/// made from this host's own `sh`, `bash`, coreutils it needs and their
/// libraries (`docker import`; there is no registry), once per engine.
pub const TEST_IMAGE: &str = "steppe-test-sh:4";

pub fn test_image() -> &'static str {
    let present = Command::new("docker").args(["image", "inspect", TEST_IMAGE]).output().expect("docker (the machine's engine)");
    if present.status.success() {
        return TEST_IMAGE;
    }
    let root = scratch("image-root");
    let script = "set -e; for b in /bin/sh /bin/bash /bin/cat /bin/ls /bin/mkdir /bin/echo /bin/id /bin/sleep /usr/bin/touch /usr/bin/mknod; do \
        mkdir -p \"root$(dirname $b)\"; cp -L $b \"root$b\"; \
        for l in $(ldd $b | grep -o '/[^ ]*'); do mkdir -p \"root$(dirname $l)\"; cp -L $l \"root$l\"; done; done; \
        mkdir -p root/tmp root/workspace root/etc; tar -C root -cf rootfs.tar .";
    let made = Command::new("sh").args(["-c", script]).current_dir(&root).output().expect("sh");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let imported = Command::new("docker").args(["import", "rootfs.tar", TEST_IMAGE]).current_dir(&root).output().expect("docker import");
    // Another test may have imported it at the same time.
    assert!(imported.status.success() || Command::new("docker").args(["image", "inspect", TEST_IMAGE]).output().expect("docker").status.success(), "{}", String::from_utf8_lossy(&imported.stderr));
    let _ = std::fs::remove_dir_all(&root);
    TEST_IMAGE
}

/// Containers of steppe's still on the engine whose step's name starts
/// with `prefix` (tests name their steps so; others run at the same time).
pub fn steppe_containers(prefix: &str) -> Vec<String> {
    let out = Command::new("docker").args(["ps", "-a", "--filter", "label=steppe.assignment", "--format", "{{.Label \"steppe.step\"}}\t{{.ID}} {{.Status}}"]).output().expect("docker ps");
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with(prefix)).map(str::to_string).collect()
}
