//! Task steps in an image, on the real Docker engine: the image here is
//! made by the test from this host's own `sh`, `cat`, `ls`, `mkdir` and
//! their libraries (`docker import`; there is no registry), tagged as the
//! pipelines name it.

mod common;

use std::process::Command;

use common::*;

const IMAGE: &str = "steppe-test-sh:2";

/// The test image, made once per engine.
fn test_image() {
    let present = Command::new("docker").args(["image", "inspect", IMAGE]).output().expect("docker (the machine's engine)");
    if present.status.success() {
        return;
    }
    let root = scratch("image-root");
    let script = "set -e; for b in /bin/sh /bin/cat /bin/ls /bin/mkdir /bin/echo /bin/id /bin/sleep; do \
        mkdir -p \"root$(dirname $b)\"; cp -L $b \"root$b\"; \
        for l in $(ldd $b | grep -o '/[^ ]*'); do mkdir -p \"root$(dirname $l)\"; cp -L $l \"root$l\"; done; done; \
        mkdir -p root/tmp root/workspace; tar -C root -cf rootfs.tar .";
    let made = Command::new("sh").args(["-c", script]).current_dir(&root).output().expect("sh");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let imported = Command::new("docker").args(["import", "rootfs.tar", IMAGE]).current_dir(&root).output().expect("docker import");
    assert!(imported.status.success() || Command::new("docker").args(["image", "inspect", IMAGE]).output().expect("docker").status.success(), "{}", String::from_utf8_lossy(&imported.stderr));
}

/// Containers of ours still on the engine.
fn our_containers() -> String {
    let out = Command::new("docker").args(["ps", "-a", "--filter", "label=steppe.assignment", "--format", "{{.ID}} {{.Status}}"]).output().expect("docker ps");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A task in an image sees only its inputs, its outputs reach the next step
/// on the host, its failure fails the step; a timeout stops it; an image the
/// engine lacks fails naming how to make it; `user:` and `network: none`
/// hold; nothing is left on the engine.
#[test]
fn tasks_run_in_an_image() {
    test_image();
    let work = scratch("containers");
    std::fs::write(work.join("secret-on-host"), "not for containers").expect("write");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [o]\n    run: echo made-inside > o/f; ls\n  - task: inside\n    image: {IMAGE}\n    inputs: [o]\n    outputs: [p]\n    run: cat o/f; ls /; cat o/f > p/g\n  - task: host\n    inputs: [p]\n    run: cat p/g\n    assert:\n      stdout: made-inside\n- name: fails\n  plan:\n  - task: boom\n    image: {IMAGE}\n    run: echo about to fail; exit 3\n- name: slow\n  plan:\n  - task: nap\n    image: {IMAGE}\n    timeout: 1s\n    run: sleep 30\n- name: missing\n  plan:\n  - task: gone\n    image: steppe-no-such-image:0\n    run: echo never\n\
             - name: settings\n  plan:\n  - task: cut-off\n    image: {IMAGE}\n    user: \"4321:4321\"\n    network: none\n    run: echo uid $(id -u); ls /sys/class/net\n  - task: connected\n    image: {IMAGE}\n    run: ls /sys/class/net\n"
        ),
    )
    .expect("write");
    let out = steppe(&["run", "p.yml", "--job", "j"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("[inside] made-inside") && said.contains("[host] made-inside"), "{said}");
    assert!(!said.contains("secret-on-host"), "the container sees only its directory: {said}");
    let out = steppe(&["run", "p.yml", "--job", "fails"], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("[boom] about to fail") && text(&out).contains("exit status 3"), "{}", text(&out));
    let out = steppe(&["run", "p.yml", "--job", "slow"], &work);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("timed out after 1s"), "{}", text(&out));
    let out = steppe(&["run", "p.yml", "--job", "missing"], &work);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("steppe-no-such-image:0") && text(&out).contains("docker load"), "{}", text(&out));
    // user: and network: none: no interface but loopback; the default network has one.
    let out = steppe(&["run", "p.yml", "--job", "settings"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("[cut-off] uid 4321"), "{said}");
    let interfaces = |step: &str| said.lines().filter_map(|l| l.strip_prefix(&format!("[{step}] "))).filter(|l| !l.starts_with("uid")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(interfaces("cut-off"), ["lo"], "{said}");
    assert!(interfaces("connected").len() > 1, "{said}");
    wait_for("no container of ours left", std::time::Duration::from_secs(10), || our_containers().trim().is_empty());
}

/// A run killed with -9 while its step's container runs leaves it running;
/// the next steppe on this host removes it.
#[test]
fn a_dead_runs_container_is_removed_by_the_next() {
    test_image();
    let work = scratch("containers-orphan");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: long\n  plan:\n  - task: nap\n    image: {IMAGE}\n    run: sleep 120\n- name: quick\n  plan:\n  - task: t\n    run: echo quick\n")).expect("write");
    let mut doomed = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "long"]).current_dir(&work).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("run");
    let pid = doomed.id().to_string();
    let mine = || {
        let out = Command::new("docker").args(["ps", "-a", "--filter", "label=steppe.owner", "--format", "{{.ID}} {{.Label \"steppe.owner\"}}"]).output().expect("docker ps");
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.split(' ').nth(1).and_then(|o| o.split(':').nth(1)) == Some(pid.as_str())).count()
    };
    wait_for("the step's container", std::time::Duration::from_secs(30), || mine() == 1);
    doomed.kill().expect("kill -9");
    let _ = doomed.wait();
    // Killed with -9 it could not remove its container (which would sleep
    // on for two minutes); the next steppe on this host removes it (so may
    // one of another test running at the same time).
    let out = steppe(&["run", "p.yml", "--job", "quick"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for("the orphan removed by the next run", std::time::Duration::from_secs(20), || mine() == 0);
}
