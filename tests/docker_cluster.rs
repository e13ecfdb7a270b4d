//! The cluster as containers on a private Docker network: Redis, a
//! coordinator and two workers that share no directory with it, built from
//! `deploy/` without pulling anything. A worker running a step is cut off
//! with `docker network disconnect`: the step runs again on the other, the
//! run succeeds, and the cut-off worker's late result is refused.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{repo, wait_for};

fn docker(args: &[&str]) -> Output {
    Command::new("docker").args(args).output().expect("docker on PATH (the machine's Docker engine)")
}

fn ok(args: &[&str]) -> String {
    let out = docker(args);
    assert!(out.status.success(), "docker {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Removes what the test made, whatever happens to it.
struct Cleanup {
    containers: Vec<String>,
    network: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = docker(&["rm", "-f", "-v", c]);
        }
        let _ = docker(&["network", "rm", &self.network]);
        let _ = docker(&["image", "rm", &self.image]);
    }
}

/// `deploy/build-image.sh` as `image`: the base made by debootstrap (once
/// per engine), with this build's binary.
fn build_image(root: &Path, image: &str) {
    let built = Command::new("sh")
        .arg(root.join("deploy/build-image.sh"))
        .env("STEPPE_BINARY", env!("CARGO_BIN_EXE_steppe"))
        .env("IMAGE", image)
        .output()
        .expect("sh");
    assert!(built.status.success(), "deploy/build-image.sh: {}", String::from_utf8_lossy(&built.stderr));
}

fn logs(container: &str) -> String {
    let out = docker(&["logs", container]);
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

#[test]
fn a_worker_cut_off_the_network_mid_step_loses_its_step_to_the_other() {
    let root = repo("");
    let id = std::process::id();
    let (image, network) = (format!("steppe-test:{id}"), format!("steppe-test-{id}"));
    let name = |role: &str| format!("steppe-test-{id}-{role}");
    let mut cleanup = Cleanup { containers: Vec::new(), network: network.clone(), image: image.clone() };

    build_image(&root, &image);

    let work: PathBuf = std::env::temp_dir().join(format!("steppe-docker-{id}"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("mkdir");
    std::fs::write(work.join("token"), "d0cker-t0ken\n").expect("token");
    let token = work.join("token").to_string_lossy().into_owned();
    let token_mount = format!("{token}:/run/steppe/token:ro");

    ok(&["network", "create", &network]);
    let run = |role: &str, args: &[&str], extra: &[&str]| {
        let c = name(role);
        let mut all = vec!["run", "-d", "--name", &c, "--hostname", &c, "--network", &network, "-v", &token_mount];
        all.extend_from_slice(extra);
        all.push(&image);
        all.extend_from_slice(args);
        ok(&all);
        c
    };
    // `--protected-mode no`: Redis listens beyond loopback, on the private network only.
    let redis = run("redis", &["--bind", "0.0.0.0", "--protected-mode", "no", "--save", "", "--appendonly", "no"], &["--entrypoint", "redis-server"]);
    cleanup.containers.push(redis.clone());
    let redis_url = format!("redis://{redis}:6379/");
    // Its port is published on the host's loopback, for the submitter.
    let coordinator = run(
        "coordinator",
        &[
            "coordinator", "--listen", "0.0.0.0:7070", "--queue", &redis_url, "--store", &redis_url, "--state", "/var/lib/steppe/state",
            "--token-file", "/run/steppe/token", "--worker-lease", "3s",
        ],
        &["-p", "127.0.0.1::7070"],
    );
    cleanup.containers.push(coordinator.clone());
    let port = ok(&["port", &coordinator, "7070/tcp"]);
    let url = format!("http://{}", port.lines().next().expect("a published port"));
    let coordinator_url = format!("http://{coordinator}:7070");
    wait_for("the coordinator to serve", Duration::from_secs(30), || logs(&coordinator).contains("serving workers on"));
    // One worker takes from the Redis queue itself, the other is sent work by
    // the coordinator; neither shares a directory with it.
    let pulling = run("w1", &["worker", "--coordinator", &coordinator_url, "--token-file", "/run/steppe/token", "--slots", "1", "--queue", &redis_url], &[]);
    cleanup.containers.push(pulling.clone());
    let pushed = run("w2", &["worker", "--coordinator", &coordinator_url, "--token-file", "/run/steppe/token", "--slots", "1"], &[]);
    cleanup.containers.push(pushed.clone());
    wait_for("both workers to join", Duration::from_secs(30), || logs(&coordinator).matches("joined").count() >= 2);

    std::fs::write(
        work.join("p.yml"),
        r#"jobs:
- name: j
  plan:
  - task: make
    outputs: [o]
    run: echo payload > o/f
  - task: slow
    inputs: [o]
    outputs: [r]
    run: echo "on $(hostname)"; sleep 6; cp o/f r/f
  - task: check
    inputs: [r]
    run: cat r/f
"#,
    )
    .expect("write");
    let mut submit = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["submit", "p.yml", "--coordinator", &url, "--token-file", &token])
        .current_dir(&work)
        .stdout(Stdio::piped())
        .spawn()
        .expect("submit");
    let mut lines = BufReader::new(submit.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let mut cut: Option<String> = None;
    let t0 = Instant::now();
    for line in lines.by_ref() {
        let line = line.expect("utf8");
        if let (None, Some(host)) = (&cut, line.strip_prefix("[slow] on ")) {
            ok(&["network", "disconnect", &network, host]);
            cut = Some(host.to_string());
        }
        seen.push(line);
        assert!(t0.elapsed() < Duration::from_secs(120), "the run took too long:\n{}", seen.join("\n"));
    }
    let status = submit.wait().expect("wait");
    let out = seen.join("\n");
    let cut = cut.unwrap_or_else(|| panic!("the slow step never said where it ran:\n{out}"));
    eprintln!("cut off {cut} ({}) mid-step", if cut == pulling { "the worker pulling from Redis" } else { "the worker the coordinator sends work to" });
    assert_eq!(status.code(), Some(0), "the run succeeds without the cut-off worker:\n{out}\n{}", logs(&coordinator));
    let hosts: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("[slow] on ")).collect();
    assert_eq!(hosts.len(), 2, "ran again after the cut:\n{out}");
    assert_ne!(hosts[1], cut, "on the other worker:\n{out}");
    assert_eq!(out.matches("✔ slow").count(), 1, "recorded once:\n{out}");
    assert!(out.contains("[check] payload"), "its output reached the next step:\n{out}");
    assert!(logs(&coordinator).contains(&format!("worker {cut}")), "{}", logs(&coordinator));
    assert!(logs(&coordinator).contains("its lease ended"), "{}", logs(&coordinator));

    // Back on the network, the cut-off worker reports; its result is refused.
    ok(&["network", "connect", &network, &cut]);
    wait_for("the late result to be refused", Duration::from_secs(60), || logs(&coordinator).contains("refused a late result"));
    let records = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["runs", "--steps", "--coordinator", &url, "--token-file", &token])
        .current_dir(&work)
        .output()
        .expect("runs");
    let records = String::from_utf8_lossy(&records.stdout).into_owned();
    assert_eq!(records.matches("\nslow ").count(), 1, "one step record:\n{records}");
    let _ = std::fs::remove_dir_all(&work);
}

/// `deploy/compose.yml` comes up as it is (Redis, a coordinator, two
/// workers sharing an artifact volume) and runs the example pipeline.
#[test]
fn the_compose_file_comes_up_and_runs_the_example() {
    let root = repo("");
    let id = std::process::id();
    let image = format!("steppe-test-compose:{id}");
    let project = format!("steppe-test-{id}");
    build_image(&root, &image);
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port").to_string();
    // `docker compose` where the plugin is installed, `docker-compose` otherwise.
    let compose = |args: &[&str]| -> Output {
        let file = root.join("deploy/compose.yml");
        let file = file.to_str().expect("utf8");
        let plugin = Command::new("docker").args(["compose", "version"]).output().is_ok_and(|o| o.status.success());
        let mut c = if plugin {
            let mut c = Command::new("docker");
            c.arg("compose");
            c
        } else {
            Command::new("docker-compose")
        };
        c.args(["-f", file, "-p", &project]).args(args).env("STEPPE_IMAGE", &image).env("STEPPE_PORT", &port).output().expect("docker compose")
    };
    struct Down<F: Fn()>(F);
    impl<F: Fn()> Drop for Down<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    let _down = Down(|| {
        let _ = compose(&["down", "-v", "--remove-orphans"]);
        let _ = docker(&["image", "rm", &image]);
    });
    let up = compose(&["up", "-d"]);
    assert!(up.status.success(), "compose up: {}", String::from_utf8_lossy(&up.stderr));
    let url = format!("http://127.0.0.1:{port}");
    let token = root.join("deploy/token");
    let token = token.to_str().expect("utf8");
    wait_for("both workers to join", Duration::from_secs(60), || {
        let l = compose(&["logs", "coordinator"]);
        String::from_utf8_lossy(&l.stdout).matches("joined").count() >= 2
    });
    let out = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["test", "ci.yml", "--coordinator", &url, "--token-file", token])
        .current_dir(root.join("examples"))
        .output()
        .expect("steppe test");
    let t = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{t}\n{}", String::from_utf8_lossy(&compose(&["logs"]).stdout));
    assert!(t.lines().any(|l| l.ends_with(" passed")), "{t}");
}

/// `deploy/build-image.sh` takes its Debian mirror from the host's apt
/// sources, in either format, for the suite itself (not -updates or
/// -security), so the image builds wherever the host's apt works.
#[test]
fn the_image_build_reads_its_mirror_from_the_hosts_apt_sources() {
    let apt = std::env::temp_dir().join(format!("steppe-apt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&apt);
    std::fs::create_dir_all(apt.join("sources.list.d")).expect("mkdir");
    let script = repo("deploy/build-image.sh");
    let mirror = |suite: &str| {
        let sh = format!("eval \"$(sed -n '/^host_mirror() {{/,/^}}/p' {})\"; host_mirror {suite} | head -n 1", script.display());
        let out = std::process::Command::new("sh").args(["-c", &sh]).env("APT_ETC", &apt).output().expect("sh");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    std::fs::write(
        apt.join("sources.list.d/debian.sources"),
        "Types: deb\nURIs: http://security.example/debian-security\nSuites: trixie-security\nComponents: main\n\nTypes: deb deb-src\nURIs: http://mirror.example/debian\nSuites: trixie trixie-updates\nComponents: main\n",
    )
    .expect("write");
    assert_eq!(mirror("trixie"), "http://mirror.example/debian", "deb822, the suite's own stanza");
    std::fs::write(apt.join("sources.list"), "# a comment\ndeb [arch=amd64 signed-by=/k.gpg] http://old.example/debian bookworm main\ndeb http://old.example/debian bookworm-updates main\n").expect("write");
    assert_eq!(mirror("bookworm"), "http://old.example/debian", "one-line entries, options skipped");
    assert_eq!(mirror("sid"), "", "no source for the suite: the script asks for MIRROR");
}
