//! A cluster end to end: `steppe coordinator`, `steppe worker`s (pushed to
//! or pulling from Redis; the queue's own cases are in `cluster_queue.rs`), `steppe submit`; TLS, pools, artifacts through the
//! coordinator, and every run fixture giving the same result as embedded.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

/// `steppe coordinator` + two `steppe worker`s + `steppe submit`: the
/// self-checking pipelines pass through a coordinator exactly as through
/// `steppe test`, and every call must carry the coordinator's token.
#[test]
fn submit_through_a_coordinator_and_two_workers() {
    let work = scratch("coordinator");
    std::fs::write(work.join("token"), "t0ken\n").expect("token");
    // The queue is a real Redis (Streams, leased); scripts/test installs redis-server.
    let (mut redis, redis_url) = redis_server();
    let start_coordinator = || {
        let args = ["coordinator", "--listen", "127.0.0.1:0", "--token-file", "token", "--state", "state", "--queue", &redis_url, "--store", &redis_url, "--artifacts", "shared"];
        let (coord, url, mut lines) = serving(&args, &work);
        std::thread::spawn(move || for _ in lines.by_ref() {});
        (coord, url)
    };
    let (mut coord, url) = start_coordinator();
    let worker = |url: &str, token: bool| {
        let mut args = vec!["worker", "--coordinator", url, "--slots", "2"];
        if token {
            args.extend(["--token-file", "token"]);
        }
        child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(&args).current_dir(&work).stderr(std::process::Stdio::piped()).spawn().expect("spawn worker")
    };
    let mut workers = [worker(&url, true), worker(&url, true)];
    let intruder = worker(&url, false).wait_with_output().expect("intruder");
    assert_ne!(intruder.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&intruder.stderr).contains("this coordinator requires a token: pass --token-file F"));
    for name in ["blocks.yml", "workspace.yml", "resources.yml", "modifiers.yml", "passed.yml", "expr-resources.yml"] {
        let src = repo("tests/run").join(name);
        std::fs::copy(&src, work.join(name)).expect("copy");
        let c = work.join(format!("counter-{name}")).to_string_lossy().into_owned();
        let out = steppe(&["submit", name, "--test", "--coordinator", &url, "--token-file", "token", "--var", &format!("counter={c}"), "--var", "loop=unused"], &work);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{name} through the coordinator:\n{t}");
        assert!(t.lines().any(|l| l.ends_with(" passed")), "{t}");
    }
    // Outputs went to the --artifacts directory the workers share.
    let blobs = std::fs::read_dir(work.join("shared")).map(|d| d.count()).unwrap_or(0);
    assert!(blobs > 0, "no artifacts under --artifacts shared");
    // `steppe test --coordinator` is the same as `steppe submit --test`.
    let out = steppe(&["test", "blocks.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Exit codes carry over: a failing job is 1, a missing token is refused.
    std::fs::write(work.join("fail.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: exit 3\n").expect("write");
    let out = steppe(&["run", "fail.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("exit status 3"), "{}", text(&out));
    let out = steppe(&["submit", "fail.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("refused the submission"), "{}", text(&out));
    // The store is Redis: a restarted coordinator still knows what passed.
    std::fs::copy(repo("tests/run/passed.yml"), work.join("again.yml")).expect("copy");
    let out = steppe(&["submit", "again.yml", "--job", "build", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Workers of a `steppe coordinator` wait for it to come back: stop them.
    stop(workers.iter_mut().chain([&mut coord]));
    let (mut coord, url) = start_coordinator();
    let mut w = worker(&url, true);
    let out = steppe(&["submit", "again.yml", "--job", "deploy", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "after a restart, deploy's passed: [build] finds what build recorded:\n{}", text(&out));
    // --detach prints the run id and returns; the run goes on without its submitter.
    std::fs::write(work.join("slow.yml"), "jobs:\n- name: slow\n  plan:\n  - task: nap\n    run: sleep 3; echo rested\n").expect("write");
    let out = steppe(&["submit", "slow.yml", "--detach", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(id.starts_with("r-") && !id.contains('\n'), "only the run id: {id:?}");
    let shown = |id: &str| text(&steppe(&["runs", "--run", id, "--coordinator", &url, "--token-file", "token"], &work));
    assert!(shown(&id).contains("of job slow (running)"), "{}", shown(&id));
    let t0 = Instant::now();
    while !shown(&id).contains("of job slow (succeeded)") {
        assert!(t0.elapsed() < Duration::from_secs(30), "the detached run never finished: {}", shown(&id));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The history and approvals, read and decided through the coordinator.
    let runs = |extra: &[&str]| text(&steppe(&[&["runs", "--coordinator", &url, "--token-file", "token"][..], extra].concat(), &work));
    let t = runs(&[]);
    assert!(t.lines().any(|l| l.contains(" deploy ") && l.ends_with("succeeded")) && t.contains(" build "), "{t}");
    let t = runs(&["--steps", "--job", "deploy"]);
    assert!(t.starts_with("run ") && t.contains("of job deploy (succeeded)"), "{t}");
    let out = steppe(&["runs", "--coordinator", &url], &work);
    assert_ne!(out.status.code(), Some(0), "no token, no history: {}", text(&out));
    std::fs::write(work.join("ship.yml"), "jobs:\n- name: ship\n  plan:\n  - approval:\n      message: Ship it?\n      timeout: 1m\n  - task: deploy\n    run: echo deployed\n").expect("write");
    let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "ship.yml", "--coordinator", &url, "--token-file", "token"])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn submit");
    let t0 = Instant::now();
    let id = loop {
        let t = text(&steppe(&["approvals", "--coordinator", &url, "--token-file", "token"], &work));
        if let Some(line) = t.lines().find(|l| l.contains("Ship it?")) {
            break line.split_whitespace().next().expect("id").to_string();
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "no pending approval on the coordinator: {t}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let t = text(&steppe(&["approve", &id, "--coordinator", &url, "--token-file", "token"], &work));
    assert!(t.contains(&format!("approved approval {id}")), "{t}");
    let out = child.wait_with_output().expect("wait");
    let t = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("[deploy] deployed") && t.contains("steppe approve --coordinator URL"), "{t}");
    stop([&mut coord, &mut w, &mut redis]);
}

#[test]
fn artifacts_and_large_results_travel_through_the_coordinator() {
    let work = scratch("cluster-streamed");
    std::fs::write(
        work.join("p.yml"),
        r#"jobs:
- name: j
  plan:
  - task: make
    outputs: [out]
    run: |
      head -c 5000000 /dev/urandom > out/big
      mkdir -p out/sub; echo hi > out/sub/f; printf '#!/bin/sh\necho ran\n' > out/run.sh; chmod +x out/run.sh; ln -s sub/f out/link
      sha256sum out/big | cut -c1-64 > out/big.sum
  - task: use
    inputs: [out]
    run: test "$(sha256sum out/big | cut -c1-64)" = "$(cat out/big.sum)" && out/run.sh && cat out/link
  - task: loud
    run: |
      head -c 6000000 /dev/zero | tr '\0' b
      echo
      head -c 12000000 /dev/zero | tr '\0' a | fold -w 100 >&2
  - task: after
    run: echo still here
"#,
    )
    .expect("write");
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // --stream-artifacts: as if on another host, sharing nothing with the coordinator.
    let mut workers = vec![spawn_worker(&url, &["--slots", "1", "--stream-artifacts"]), spawn_worker(&url, &["--slots", "1", "--stream-artifacts"])];
    // Bounded: a result too large for its message used to kill each worker
    // in turn and leave the run waiting for one.
    let out = child_of_this_test("timeout").args(["120", env!("CARGO_BIN_EXE_steppe"), "submit", "p.yml", "--coordinator", &url]).current_dir(&work).output().expect("submit");
    let t = text(&out);
    let shown: String = t.lines().filter(|l| l.len() < 300).collect::<Vec<_>>().join("\n");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert!(t.contains("[use] ran\n") && t.contains("[use] hi\n"), "the tree arrived whole (bytes, exec bit, symlink): {shown}");
    assert!(t.lines().all(|l| l.len() <= (64 << 10) + 16), "a 6 MB line travels in pieces of at most 64 KiB: {shown}");
    assert!(t.lines().filter(|l| l.starts_with("[loud] bbbb")).count() >= 90, "all of it: {shown}");
    assert!(t.contains("✔ loud") && t.contains("[after] still here"), "an 18 MB result travelled by reference and the workers lived on: {shown}");
    let stored = std::fs::read_dir(work.join("state/artifacts")).expect("artifacts").filter_map(Result::ok).filter(|e| e.file_name().len() == 64).count();
    assert!(stored >= 2, "the output tree and the large result were stored with the coordinator: {stored}");
    for w in &mut workers {
        assert!(w.try_wait().expect("try_wait").is_none(), "no worker died");
    }
    // A submission over the message limit is refused here, by name.
    std::fs::write(work.join("big.sh"), "#".repeat(5 << 20)).expect("write");
    std::fs::write(work.join("big.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run_file: big.sh\n").expect("write");
    let out = steppe(&["submit", "big.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("big.yml: the pipeline and the files it sends come to 5.0 MiB; a submission carries at most 4 MiB"), "{}", text(&out));
    stop(workers.iter_mut().chain([&mut coord]));
}

/// A private CA and a certificate for 127.0.0.1 it signed, made with openssl.
fn private_ca(dir: &Path) {
    let sh = "openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj '/CN=steppe test CA' -keyout ca.key -out ca.pem \
        && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr \
        && printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ext \
        && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext -out server.pem";
    let out = Command::new("sh").args(["-c", sh]).current_dir(dir).output().expect("openssl (scripts/test installs it)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn tls_between_every_part() {
    let work = scratch("cluster-tls");
    private_ca(&work);
    std::fs::write(work.join("token"), "t0ken\n").expect("token");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [o]\n    run: echo sealed > o/f\n  - task: read\n    inputs: [o]\n    run: cat o/f\n").expect("write");
    let (mut coord, url, mut lines) = serving(
        &["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--token-file", "token", "--tls-cert", "server.pem", "--tls-key", "server.key"],
        &work,
    );
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem", "--slots", "2", "--stream-artifacts"])
        .current_dir(&work)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("[read] sealed"), "{}", text(&out));
    let runs = steppe(&["runs", "--coordinator", &url, "--token-file", "token", "--tls-ca", "ca.pem"], &work);
    assert!(text(&runs).contains("succeeded"), "{}", text(&runs));
    // Not trusting the CA, or not speaking TLS: refused, with the way out named.
    let untrusted = steppe(&["submit", "p.yml", "--coordinator", &url, "--token-file", "token"], &work);
    assert_eq!(untrusted.status.code(), Some(2));
    assert!(text(&untrusted).contains("not signed by a CA this host trusts (a private CA? pass --tls-ca FILE)"), "{}", text(&untrusted));
    let plain = steppe(&["submit", "p.yml", "--coordinator", &url.replace("https://", "http://"), "--token-file", "token"], &work);
    assert_eq!(plain.status.code(), Some(2));
    assert!(text(&plain).contains("use an https:// URL"), "{}", text(&plain));
    stop([&mut coord, &mut worker]);
}

/// A line with its "(0.01s)"-style timings taken out.

/// Every pipeline of the suite (self-checking, failing, examples) ends the
/// same through a Redis-backed coordinator and two workers as it does
/// embedded, submitted two at a time: same exit code, same steps with the
/// same outcomes.
#[test]
fn every_fixture_runs_the_same_through_a_cluster() {
    fixtures_run_the_same(Backend::Redis);
}

/// As above, on SQS (a moto server).
#[test]
fn every_fixture_runs_the_same_through_an_sqs_cluster() {
    fixtures_run_the_same(Backend::Sqs);
}

/// As above, on Pub/Sub (the emulator).
#[test]
fn every_fixture_runs_the_same_through_a_pubsub_cluster() {
    fixtures_run_the_same(Backend::PubSub);
}

fn fixtures_run_the_same(backend: Backend) {
    let (mut service, queue_url, queue_args) = backend.start();
    let base = scratch(&format!("parity-{backend:?}"));
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, mut lines) = serving(&args, &base);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // One worker takes from the queue itself, the other is sent work over
    // its session: both kinds share the one queue.
    let mut workers = [spawn_worker(&url, &["--slots", "4", "--queue", &queue_url]), spawn_worker(&url, &["--slots", "4"])];
    let examples = repo("examples");
    let mut pipelines: Vec<PathBuf> = fixtures("");
    pipelines.extend(fixtures("failing"));
    pipelines.extend(std::fs::read_dir(&examples).expect("examples").filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "yml")));
    assert!(pipelines.len() >= 12, "{pipelines:?}");
    // What a user compares: the exit code and each step's outcome, in order of finishing.
    let summary = |o: &Output| -> (Option<i32>, Vec<String>) {
        let mut steps: Vec<String> = text(o)
            .lines()
            .filter(|l| l.starts_with('✔') || l.starts_with('✘'))
            .map(without_durations)
            .collect();
        steps.sort();
        (o.status.code(), steps)
    };
    // Each pipeline embedded, then through the cluster; two at a time, as
    // people share a coordinator.
    let compare = |(i, f): (usize, &PathBuf)| -> (usize, Option<String>) {
        let mut runs = Vec::new();
        for mode in ["embedded", "cluster"] {
            let work = base.join(format!("{i}-{mode}"));
            std::fs::create_dir_all(&work).expect("mkdir");
            let copy = work.join(f.file_name().expect("name"));
            std::fs::copy(f, &copy).expect("copy");
            let (counter, lp) = (work.join("counter").to_string_lossy().into_owned(), work.join("loop").to_string_lossy().into_owned());
            let (cv, lv) = (format!("counter={counter}"), format!("loop={lp}"));
            let mut args = vec!["test", copy.to_str().expect("utf8"), "--var", &cv, "--var", &lv];
            if mode == "cluster" {
                args.extend(["--coordinator", &url]);
            }
            runs.push(steppe(&args, &work));
        }
        let (embedded, cluster) = (summary(&runs[0]), summary(&runs[1]));
        assert!(embedded.0.is_some(), "{}", f.display());
        let differ = (embedded != cluster).then(|| format!("{}:\n  embedded {embedded:?}\n  cluster  {cluster:?}\n{}", f.display(), text(&runs[1])));
        (embedded.1.len(), differ)
    };
    let numbered: Vec<(usize, &PathBuf)> = pipelines.iter().enumerate().collect();
    let done: Vec<(usize, Option<String>)> = std::thread::scope(|s| {
        let halves: Vec<_> = numbered.chunks(numbered.len().div_ceil(2)).map(|half| s.spawn(|| half.iter().copied().map(compare).collect::<Vec<_>>())).collect();
        halves.into_iter().flat_map(|h| h.join().expect("a half")).collect()
    });
    let compared_steps: usize = done.iter().map(|(n, _)| n).sum();
    let differ: Vec<String> = done.into_iter().filter_map(|(_, d)| d).collect();
    assert!(differ.is_empty(), "{}", differ.join("\n\n"));
    assert!(compared_steps >= 40, "only {compared_steps} step outcomes compared");
    stop(workers.iter_mut().chain([&mut coord, &mut service]));
}

/// `steppe cancel` aborts a detached run; Ctrl-C on a submitter cancels its
/// run and stays to show the abort hooks; neither leaves the step running.
#[test]
fn cancel_and_ctrl_c_abort_a_run_at_the_coordinator() {
    let work = scratch("cancel");
    let pipeline = |name: &str| {
        let started = work.join(format!("{name}.started"));
        std::fs::write(
            work.join(format!("{name}.yml")),
            format!(
                "jobs:\n- name: j\n  plan:\n  - task: long\n    run: echo $$ > {}.pid; touch {}; sleep 30\n    on_abort:\n      task: note\n      run: echo hook ran for {name}\n",
                started.display(),
                started.display()
            ),
        )
        .expect("write");
        started
    };
    let wait_for = |f: &Path| {
        let t0 = Instant::now();
        while !f.exists() {
            assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = spawn_worker(&url, &["--slots", "2"]);

    let started = pipeline("detached");
    let out = steppe(&["submit", "detached.yml", "--detach", "--coordinator", &url], &work);
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for(&started);
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(&format!("cancelled {id}")), "{}", text(&out));
    let t0 = Instant::now();
    loop {
        let shown = text(&steppe(&["runs", "--run", &id, "--coordinator", &url, "--logs"], &work));
        if shown.contains("(aborted)") {
            assert!(shown.contains("hook ran for detached"), "the abort hook ran: {shown}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(15), "not aborted: {shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The cancel reached the worker: the step's process is gone, not left to finish its sleep.
    let pid = std::fs::read_to_string(format!("{}.pid", started.display())).expect("pid");
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let t0 = Instant::now();
    while proc_dir.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the step's process {} still runs", pid.trim());
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again));
    assert!(text(&again).contains("no run"), "{}", text(&again));

    let started = pipeline("followed");
    let submitter = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "followed.yml", "--coordinator", &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    wait_for(&started);
    // SAFETY: signalling our own child.
    unsafe {
        libc::kill(submitter.id() as i32, libc::SIGINT);
    }
    let out = submitter.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(text(&out).contains("[note] hook ran for followed"), "the submitter stayed to see the hook: {}", text(&out));
    stop([&mut coord, &mut worker]);
}

/// A run submitted with --pool runs on that pool's workers only; a pool no
/// worker serves is named when the run starts.
#[test]
fn pools_route_runs_to_their_workers() {
    pools_route(Backend::Redis);
}

/// Pools on SQS (a queue each) and Pub/Sub (a topic and subscription each).
#[test]
fn pools_route_runs_to_their_workers_on_sqs_and_pubsub() {
    pools_route(Backend::Sqs);
    pools_route(Backend::PubSub);
}

fn pools_route(backend: Backend) {
    let work = scratch(&format!("pools-{backend:?}"));
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: where\n    run: echo ran under $PPID\n").expect("write");
    let (mut redis, queue_url, queue_args) = backend.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--state", "state"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, mut lines) = serving(&args, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    // The default pool's worker is sent work; the special pool's takes it from the queue itself.
    let mut plain = spawn_worker(&url, &["--slots", "2"]);
    let mut special = spawn_worker(&url, &["--slots", "2", "--pool", "special", "--queue", &queue_url]);
    let ran_under = |args: &[&str]| {
        // --force: each submission runs, though an earlier one ran the same chain.
        let mut all = vec!["submit", "p.yml", "--coordinator", &url, "--force"];
        all.extend_from_slice(args);
        let out = steppe(&all, &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let t = text(&out);
        t.lines().find_map(|l| l.strip_prefix("[where] ran under ")).map(str::to_string).unwrap_or_else(|| panic!("{t}"))
    };
    for _ in 0..3 {
        assert_eq!(ran_under(&["--pool", "special"]), special.id().to_string());
        assert_eq!(ran_under(&[]), plain.id().to_string());
    }
    let out = steppe(&["submit", "p.yml", "--coordinator", &url, "--pool", "nobody", "--detach", "--force"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let id = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "the run waited for a worker of its pool: {}", text(&out));
    let bad = steppe(&["submit", "p.yml", "--coordinator", &url, "--pool", "../x"], &work);
    assert_eq!(bad.status.code(), Some(2));
    assert!(text(&bad).contains("a pool name is 1 to 64 letters"), "{}", text(&bad));
    stop([&mut plain, &mut special, &mut coord, &mut redis]);
}

/// A resource `check` runs in the pipeline's directory. Submitted, it runs
/// on a worker in a copy of what was sent: the files the pipeline reads and
/// what `--include` or `.steppe-include` name (executable bits kept), never
/// the rest of the directory, and never on the coordinator's host.
#[test]
fn a_submitted_check_runs_on_a_worker_in_what_was_sent() {
    let work = scratch("check-dir");
    std::fs::create_dir_all(work.join("scripts")).expect("mkdir");
    std::fs::write(work.join("scripts/versions.sh"), "#!/bin/sh\necho \"$PWD\" > \"$CHECK_WHERE\"\nprintf '[{\"v\": \"%s\"}]' \"$(cat releases.txt)\"\n").expect("write");
    std::fs::set_permissions(work.join("scripts/versions.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    std::fs::write(work.join("releases.txt"), "7.1").expect("write");
    std::fs::write(work.join("deploy-token"), "s3cret").expect("write");
    std::fs::write(
        work.join("p.yml"),
        "resource_types:\n- name: release\n  env: [CHECK_WHERE]\n  config:\n    check: ./scripts/versions.sh\n    in: echo {{ .version.v | shellquote }} > v\nresources:\n- name: rel\n  type: release\n  source: {}\njobs:\n- name: j\n  plan:\n  - get: rel\n  - task: show\n    inputs: [rel]\n    run: cat rel/v\n",
    )
    .expect("write");
    let where_file = work.join("check-ran-in");
    let embedded = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml"]).current_dir(&work).env("CHECK_WHERE", &where_file).output().expect("run");
    assert_eq!(embedded.status.code(), Some(0), "{}", text(&embedded));
    let state = work.join(".state");
    let coordinator = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["coordinator", "--listen", "127.0.0.1:0", "--state", ".state"])
        .current_dir(&work)
        .env_remove("CHECK_WHERE")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("coordinator");
    let (mut coord, url, mut lines) = serving_child(coordinator);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--slots", "1"]).env("CHECK_WHERE", &where_file).stderr(std::process::Stdio::null()).spawn().expect("worker");
    let submit = |extra: &[&str]| steppe(&[&["submit", "p.yml", "--coordinator", &url][..], extra].concat(), &work);
    // Without naming them, the script and its data stay home: the check fails, saying so.
    let out = submit(&[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("sending p.yml, 0 file(s) it reads and 0 included file(s)"), "{t}");
    let out = submit(&["--include", "scripts", "--include", "releases.txt"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("[show] 7.1") && t.contains("and 2 included file(s)"), "{t}");
    let ran_in = std::fs::read_to_string(&where_file).expect("the check ran");
    assert!(!ran_in.starts_with(&*state.to_string_lossy()), "the check ran on the worker, not in the coordinator's state: {ran_in}");
    // A checked-in .steppe-include does the same.
    std::fs::write(work.join(".steppe-include"), "# what the check needs\nscripts/*.sh\nreleases.txt\n").expect("write");
    let out = submit(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // Nothing of the submissions is left on the coordinator, and the token never went.
    let left: Vec<_> = std::fs::read_dir(state.join("submissions")).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "submissions left behind: {left:?}");
    let found = std::process::Command::new("grep").args(["-r", "-l", "s3cret", "."]).current_dir(&state).output().expect("grep");
    assert!(found.stdout.is_empty(), "the token reached the coordinator: {}", String::from_utf8_lossy(&found.stdout));
    stop([&mut coord, &mut worker]);
}

/// Fifty pipelines, every one from a file called `pipeline.yml` with the same
/// job and resource names, submitted at once under fifty names: each keeps
/// its own versions and `passed:` records and ends as it does embedded.
#[test]
fn fifty_pipelines_with_the_same_names_keep_their_own_history() {
    let work = scratch("fifty");
    let (mut redis, redis_url) = redis_server();
    let args = ["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--queue", &redis_url, "--store", &redis_url];
    let (mut coord, url, mut lines) = serving(&args, &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let mut workers = [spawn_worker(&url, &["--slots", "4"]), spawn_worker(&url, &["--slots", "4"])];
    // Pipeline i's resource has versions i-a and i-b; build passes i-b, and
    // deploy must get exactly that: another pipeline's record would be wrong.
    let pipeline = |i: usize| {
        format!(
            "resource_types:\n- name: list\n  config:\n    check: |\n      printf '[{{\"v\": \"{i}-a\"}}, {{\"v\": \"{i}-b\"}}]'\n    in: |\n      echo {{{{ .version.v }}}} > v\nresources:\n- name: src\n  type: list\n  source: {{}}\njobs:\n- name: build\n  plan:\n  - get: src\n    version: {{v: \"{i}-b\"}}\n- name: deploy\n  plan:\n  - get: src\n    passed: [build]\n  - task: show\n    inputs: [src]\n    run: cat src/v\n    assert:\n      stdout: \"{i}-b\"\n"
        )
    };
    let dirs: Vec<PathBuf> = (0..50)
        .map(|i| {
            let d = work.join(format!("p{i}"));
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join("pipeline.yml"), pipeline(i)).expect("write");
            d
        })
        .collect();
    // Embedded, each passes on its own.
    let embedded = steppe(&["test", "pipeline.yml"], &dirs[7]);
    assert_eq!(embedded.status.code(), Some(0), "{}", text(&embedded));
    // Through the coordinator, all at once.
    let submits: Vec<std::process::Child> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
                .args(["submit", "pipeline.yml", "--test", "--pipeline", &format!("p{i}"), "--coordinator", &url])
                .current_dir(d)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("submit")
        })
        .collect();
    for (i, s) in submits.into_iter().enumerate() {
        let out = s.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0), "pipeline p{i}:\n{}", text(&out));
    }
    // Each pipeline's history is its own two runs; the list names all fifty.
    for i in [0, 23, 49] {
        let out = steppe(&["runs", "--pipeline", &format!("p{i}"), "--coordinator", &url], &work);
        let rows = String::from_utf8_lossy(&out.stdout).lines().skip(1).count();
        assert_eq!(rows, 2, "p{i}: {}", text(&out));
    }
    let out = steppe(&["pipelines", "--coordinator", &url], &work);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().skip(1).count(), 50, "{}", text(&out));
    stop(workers.iter_mut().chain([&mut coord, &mut redis]));
}

/// Redis as people run it: an ACL user with a password, TLS (`rediss://`,
/// the private CA trusted through $SSL_CERT_FILE), and two installations
/// sharing the one Redis under their own `--redis-prefix`, each with its
/// own pulling worker, neither dropping the other's entries as orphans.
#[test]
fn two_coordinators_share_one_redis_over_tls_with_a_user() {
    let work = scratch("redis-shared");
    private_ca(&work);
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let mut redis = child_of_this_test("redis-server")
        .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .args(["--tls-cert-file", "server.pem", "--tls-key-file", "server.key", "--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
        .args(["--user", "default", "off", "--user", "ci", "on", ">s3cret", "~*", "&*", "+@all"])
        .current_dir(&work)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    wait_for("redis to listen", Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let url = format!("rediss://ci:s3cret@127.0.0.1:{port}/");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo fine\n").expect("write");
    let ca = work.join("ca.pem");
    let start = |prefix: &str| {
        let child = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
            .args(["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", prefix, "--queue", &url, "--store", &url, "--redis-prefix", prefix])
            .env("SSL_CERT_FILE", &ca)
            .current_dir(&work)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("coordinator");
        let (coord, curl, lines) = serving_child(child);
        let log: Log = Default::default();
        let keep = log.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|l| keep.lock().expect("log").push_str(&(l + "\n"))));
        let worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
            .args(["worker", "--coordinator", &curl, "--slots", "2", "--queue", &url])
            .env("SSL_CERT_FILE", &ca)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("worker");
        (coord, worker, curl, log)
    };
    let (mut c1, mut w1, u1, log1) = start("blue");
    let (mut c2, mut w2, u2, log2) = start("green");
    let outs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = [&u1, &u2, &u1, &u2].into_iter().map(|u| s.spawn(|| steppe(&["submit", "p.yml", "--coordinator", u], &work))).collect();
        runs.into_iter().map(|r| r.join().expect("submit")).collect()
    });
    for o in &outs {
        assert_eq!(o.status.code(), Some(0), "{}\n--- blue ---\n{}\n--- green ---\n{}", text(o), log1.lock().expect("log"), log2.lock().expect("log"));
    }
    for (u, log) in [(&u1, &log1), (&u2, &log2)] {
        let listed = text(&steppe(&["runs", "--coordinator", u], &work));
        assert_eq!(listed.matches("succeeded").count(), 2, "each sees its own two runs: {listed}");
        assert!(!log.lock().expect("log").contains("dropped assignment"), "{}", log.lock().expect("log"));
    }
    // Without the CA, TLS is refused and said so.
    let out = steppe(&["coordinator", "--listen", "127.0.0.1:0", "--state", "x", "--queue", &url], &work);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("SSL_CERT_FILE") && !text(&out).contains("s3cret"), "the way out, never the password: {}", text(&out));
    stop([&mut w1, &mut w2, &mut c1, &mut c2, &mut redis]);
}
