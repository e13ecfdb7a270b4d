//! `steppe watch` through the real binary: trigger resources polled, builds
//! queued and run, `passed:` chains, the breaker and `jobs --resume`,
//! `serial_groups`, `every` from a cold start, webhooks with their token.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

const PIPELINE: &str = r#"
resource_types:
- name: file-versions
  config:
    check: cat ((dir))/versions.json
resources:
- name: repo
  type: file-versions
  source: {}
  webhook_token_env: HOOK_TOKEN
jobs:
- name: build
  max_consecutive_failures: 2
  plan:
  - get: repo
    trigger: true
  - task: compile
    inputs: [repo]
    run: |
      v=$(tr -dc 'a-z0-9' < repo/version.json | sed 's/^ref//')
      echo "build-$v" >> ((dir))/runs.log
      case "$v" in bad*) exit 1;; esac
- name: deploy
  plan:
  - get: repo
    trigger: true
    passed: [build]
  - task: ship
    inputs: [repo]
    run: |
      echo "deploy-$(tr -dc 'a-z0-9' < repo/version.json | sed 's/^ref//')" >> ((dir))/runs.log
"#;

fn runs(work: &Path) -> Vec<String> {
    lines_of(&work.join("runs.log"))
}

fn versions(work: &Path, refs: &[&str]) {
    let v: Vec<String> = refs.iter().map(|r| format!("{{\"ref\":\"{r}\"}}")).collect();
    std::fs::write(work.join("versions.json"), format!("[{}]", v.join(","))).expect("write");
}

fn once(work: &Path) -> String {
    let dir = format!("dir={}", work.display());
    let out = steppe(&["watch", "p.yml", "--once", "--var", &dir], work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

#[test]
fn watch_builds_new_versions_down_a_passed_chain_and_pauses_a_failing_job() {
    let work = scratch("watch-chain");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    versions(&work, &["a0", "a"]);
    // Cold start: the newest version builds once, then what waits on it.
    let t = once(&work);
    assert!(t.contains("watching repo"), "{t}");
    assert_eq!(runs(&work), ["build-a", "deploy-a"], "{t}");
    // Nothing new: nothing runs.
    once(&work);
    assert_eq!(runs(&work).len(), 2);
    versions(&work, &["a0", "a", "b"]);
    once(&work);
    assert_eq!(runs(&work)[2..], ["build-b", "deploy-b"]);
    let q = text(&steppe(&["runs", "p.yml", "--queue"], &work));
    assert!(q.contains("no builds queued"), "{q}");

    // Two failed builds in a row pause build; deploy never sees them.
    versions(&work, &["a0", "a", "b", "bad1"]);
    once(&work);
    versions(&work, &["a0", "a", "b", "bad1", "bad2"]);
    let t = once(&work);
    assert!(t.contains("trigger.job_paused: build paused after 2 consecutive failed builds"), "{t}");
    assert_eq!(runs(&work)[4..], ["build-bad1", "build-bad2"]);
    let dir = format!("dir={}", work.display());
    let jobs = text(&steppe(&["jobs", "p.yml", "--var", &dir], &work));
    assert!(jobs.lines().any(|l| l.starts_with("build") && l.contains("(paused)")), "{jobs}");
    // A new version waits while the job is paused.
    versions(&work, &["a0", "a", "b", "bad1", "bad2", "c"]);
    once(&work);
    assert_eq!(runs(&work).len(), 6, "a paused job does not build");
    let q = text(&steppe(&["runs", "p.yml", "--queue"], &work));
    assert!(q.lines().any(|l| l.starts_with("build") && l.contains("pending")), "{q}");
    let resumed = text(&steppe(&["jobs", "p.yml", "--resume", "build", "--var", &dir], &work));
    assert!(resumed.contains("build: resumed"), "{resumed}");
    let wrong = steppe(&["jobs", "p.yml", "--resume", "biuld", "--var", &dir], &work);
    assert!(text(&wrong).contains("did you mean \"build\""), "{}", text(&wrong));
    once(&work);
    assert_eq!(runs(&work)[6..], ["build-c", "deploy-c"]);

    std::fs::write(work.join("plain.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: 'true'\n").expect("write");
    let none = steppe(&["watch", "plain.yml", "--once"], &work);
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none).contains("no get has trigger: true"), "{}", text(&none));
}

#[test]
fn a_serial_group_runs_one_build_at_a_time_and_every_starts_from_the_newest() {
    let work = scratch("watch-serial");
    versions(&work, &["v1", "v2", "v3"]);
    let job = |name: &str| {
        format!("- name: {name}\n  serial_groups: [deploys]\n  plan:\n  - get: repo\n    trigger: true\n  - task: t-{name}\n    run: echo start-{name} >> ((dir))/runs.log && sleep 0.3 && echo end-{name} >> ((dir))/runs.log\n")
    };
    let every = "- name: each\n  plan:\n  - get: repo\n    trigger: true\n    version: every\n  - task: show\n    inputs: [repo]\n    run: cat repo/version.json | tr -d ' \\n' >> ((dir))/each.log; echo >> ((dir))/each.log\n";
    std::fs::write(
        work.join("p.yml"),
        format!("resource_types:\n- name: file-versions\n  config:\n    check: cat ((dir))/versions.json\nresources:\n- name: repo\n  type: file-versions\n  source: {{}}\njobs:\n{}{}{}", job("one"), job("two"), every),
    )
    .expect("write");
    let dir = format!("dir={}", work.display());
    let out = steppe(&["watch", "p.yml", "--once", "--max-concurrent", "3", "--var", &dir], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let log = runs(&work);
    assert_eq!(log.len(), 4, "{log:?}\n{said}");
    assert!(log[0].starts_with("start-") && log[1].starts_with("end-") && log[2].starts_with("start-"), "never two builds of one group at once: {log:?}\n{said}");
    let each = std::fs::read_to_string(work.join("each.log")).unwrap_or_default();
    assert_eq!(each.lines().collect::<Vec<_>>(), [r#"{"ref":"v3"}"#], "a cold start takes the newest only:\n{said}");
    versions(&work, &["v1", "v2", "v3", "v4", "v5"]);
    let out = steppe(&["watch", "p.yml", "--once", "--max-concurrent", "3", "--var", &dir], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let each = std::fs::read_to_string(work.join("each.log")).unwrap_or_default();
    assert_eq!(each.lines().collect::<Vec<_>>(), [r#"{"ref":"v3"}"#, r#"{"ref":"v4"}"#, r#"{"ref":"v5"}"#], "every new version once:\n{}", text(&out));
}

#[test]
fn a_webhook_with_its_token_queues_a_build_and_a_wrong_one_is_refused() {
    let work = scratch("watch-hook");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    versions(&work, &["a"]);
    let port = std::net::TcpListener::bind("127.0.0.1:0").expect("port").local_addr().expect("addr").port();
    let addr = format!("127.0.0.1:{port}");
    let dir = format!("dir={}", work.display());
    let mut watcher = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["watch", "p.yml", "--interval", "1h", "--listen", &addr, "--var", &dir])
        .env("HOOK_TOKEN", "s3cret-hook")
        .current_dir(&work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("watch");
    wait_for("the first build", Duration::from_secs(20), || runs(&work).len() >= 2);
    let post = |url: &str, extra: &[&str]| {
        let out = std::process::Command::new("curl").args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"]).args(extra).arg(url).output().expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    wait_for("the webhook server", Duration::from_secs(10), || std::net::TcpStream::connect(&addr).is_ok());
    assert_eq!(post(&format!("http://{addr}/check/repo?token=wrong"), &[]), "401");
    assert_eq!(post(&format!("http://{addr}/check/nothing?token=s3cret-hook"), &[]), "401", "an unknown resource looks like a wrong token");
    versions(&work, &["a", "b"]);
    assert_eq!(post(&format!("http://{addr}/check/repo"), &["-H", "Authorization: Bearer s3cret-hook"]), "202");
    wait_for("the build the webhook queued", Duration::from_secs(20), || runs(&work).contains(&"deploy-b".to_string()));
    assert_eq!(runs(&work), ["build-a", "deploy-a", "build-b", "deploy-b"]);
    stop([&mut watcher]);
}

#[test]
fn a_coordinator_watches_a_pipeline_and_runs_its_builds_on_its_workers() {
    let work = scratch("watch-coordinator");
    versions(&work, &["a"]);
    let log = work.join("runs.log");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "resource_types:\n- name: file-versions\n  config:\n    check: cat versions.json\nresources:\n- {{name: repo, type: file-versions, source: {{}}}}\njobs:\n- name: build\n  plan:\n  - get: repo\n    trigger: true\n  - task: t\n    inputs: [repo]\n    run: tr -dc 'a-z0-9' < repo/version.json >> {} && echo >> {}\n",
            log.display(),
            log.display()
        ),
    )
    .expect("write");
    let (mut coord, url, _log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--watch", "p.yml", "--watch-interval", "1s"], &work);
    let mut worker = spawn_worker(&url, &["--slots", "1"]);
    wait_for("the first build", Duration::from_secs(30), || runs(&work).contains(&"refa".to_string()));
    versions(&work, &["a", "b"]);
    wait_for("the build of the new version", Duration::from_secs(30), || runs(&work).contains(&"refb".to_string()));
    assert_eq!(runs(&work), ["refa", "refb"]);
    let listed = text(&steppe(&["runs", "--coordinator", &url, "--pipeline", "p"], &work));
    assert!(listed.matches("succeeded").count() >= 2, "{listed}");
    stop([&mut worker, &mut coord]);
}

#[test]
fn stopping_interrupts_an_interruptible_build_and_queues_it_for_the_next_start() {
    let work = scratch("watch-interrupt");
    versions(&work, &["a"]);
    let started = work.join("started");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "resource_types:\n- name: file-versions\n  config:\n    check: cat versions.json\nresources:\n- {{name: repo, type: file-versions, source: {{}}}}\njobs:\n- name: slow\n  interruptible: true\n  plan:\n  - get: repo\n    trigger: true\n  - task: wait\n    run: echo go >> {} && sleep 30\n",
            started.display()
        ),
    )
    .expect("write");
    let mut watcher = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["watch", "p.yml", "--interval", "1h"]).current_dir(&work).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("watch");
    wait_for("the build to start", Duration::from_secs(20), || started.exists());
    let t0 = std::time::Instant::now();
    let _ = std::process::Command::new("kill").args(["-TERM", &watcher.id().to_string()]).status();
    let status = watcher.wait().expect("wait");
    assert!(t0.elapsed() < Duration::from_secs(15), "an interruptible build is not waited for");
    assert_eq!(status.code(), Some(130));
    let q = text(&steppe(&["runs", "p.yml", "--queue"], &work));
    assert!(q.lines().any(|l| l.starts_with("slow") && l.contains("pending")), "it waits for the next start: {q}");
}
