//! Steps, resource types and agent tools in images, on the real Docker
//! engine: the image is made by the tests from this host's own binaries
//! (`tests/common::test_image`; there is no registry), tagged as the
//! pipelines name it. Each test names its steps with a prefix of its own,
//! and checks that no container of those steps is left.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;

/// No container of steps named with these prefixes is left. A process
/// waits for the engine to remove its steps' containers before it exits,
/// so this holds the moment it has (a run that did not wait could leave its
/// last step's container behind until some steppe process died).
fn no_container_left(prefixes: &[&str]) {
    let left: Vec<String> = prefixes.iter().flat_map(|p| steppe_containers(p)).collect();
    assert!(left.is_empty(), "containers left once the run had ended: {left:?}");
}

/// A task in an image sees only its inputs, its outputs reach the next step
/// on the host, its failure fails the step; a timeout stops it; an image the
/// engine lacks fails the run before it starts, naming how to make it;
/// `user:` and `network: none` hold; a `when:` guard runs in the image.
#[test]
fn tasks_run_in_an_image() {
    let image = test_image();
    let work = scratch("containers");
    std::fs::write(work.join("secret-on-host"), "not for containers").expect("write");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "jobs:\n- name: j\n  plan:\n  - task: t1-make\n    outputs: [o]\n    run: echo made-inside > o/f; ls\n  - task: t1-inside\n    image: {image}\n    inputs: [o]\n    outputs: [p]\n    run: cat o/f; ls /; cat o/f > p/g\n  - task: t1-host\n    inputs: [p]\n    run: cat p/g\n    assert:\n      stdout: made-inside\n\
             - name: quick\n  plan:\n  - task: t1-no-newline\n    image: {image}\n    run: printf no-newline\n    assert:\n      stdout: no-newline\n\
             - name: fails\n  plan:\n  - task: t1-boom\n    image: {image}\n    run: echo about to fail; exit 3\n\
             - name: slow\n  plan:\n  - task: t1-nap\n    image: {image}\n    timeout: 1s\n    run: sleep 30\n\
             - name: missing\n  plan:\n  - task: t1-before\n    run: echo ran-before-the-image-check\n  - task: t1-gone\n    image: steppe-no-such-image:0\n    run: echo never\n  on_failure:\n    task: t1-hook\n    run: echo job-hook-ran\n\
             - name: settings\n  plan:\n  - task: t1-cut-off\n    image: {image}\n    user: \"4321:4321\"\n    network: none\n    outputs: [w]\n    run: echo uid $(id -u); ls /sys/class/net; echo written > w/by-4321\n  - task: t1-connected\n    image: {image}\n    run: ls /sys/class/net\n\
             - name: limited\n  plan:\n  - task: t1-limits\n    image: {image}\n    container_limits: {{cpu: 512, memory: 64m}}\n    run: sleep 3\n\
             - name: guarded\n  plan:\n  - task: t1-guard-in-image\n    image: {image}\n    when: '[ ! -e {here}/p.yml ]'\n    run: echo the guard ran in the image\n  - task: t1-guard-on-host\n    when: '[ ! -e {here}/p.yml ]'\n    run: echo the guard ran in the image\n",
            here = work.display()
        ),
    )
    .expect("write");
    let out = steppe(&["run", "p.yml", "--job", "j"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("[t1-inside] made-inside") && said.contains("[t1-host] made-inside"), "{said}");
    assert!(!said.contains("secret-on-host"), "the container sees only its directory: {said}");
    // What a command that ends at once printed, its last line unfinished, is all there.
    let out = steppe(&["run", "p.yml", "--job", "quick"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let out = steppe(&["run", "p.yml", "--job", "fails"], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("[t1-boom] about to fail") && text(&out).contains("exit status 3"), "{}", text(&out));
    let out = steppe(&["run", "p.yml", "--job", "slow"], &work);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("timed out after 1s"), "{}", text(&out));
    // No registry answers here: the run fails before any step (or job hook) runs.
    let out = steppe(&["run", "p.yml", "--job", "missing"], &work);
    let said = text(&out);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("steppe-no-such-image:0") && said.contains("docker load") && said.contains("jobs[4].plan[1]"), "{said}");
    assert!(!said.contains("ran-before-the-image-check") && !said.contains("job-hook-ran"), "{said}");
    // user: and network: none: no interface but loopback; the default network has one.
    let out = steppe(&["run", "p.yml", "--job", "settings"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("[t1-cut-off] uid 4321"), "{said}");
    let interfaces = |step: &str| said.lines().filter_map(|l| l.strip_prefix(&format!("[{step}] "))).filter(|l| !l.starts_with("uid")).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(interfaces("t1-cut-off"), ["lo"], "{said}");
    assert!(interfaces("t1-connected").len() > 1, "{said}");
    // container_limits: reach the engine (read off the running container).
    // (This engine refuses privileged containers outright, so privileged: is not run here.)
    let mut limited = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "limited"]).current_dir(&work).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("run");
    let mut seen = String::new();
    wait_for("the limited step's container", Duration::from_secs(20), || {
        let id = Command::new("docker").args(["ps", "-q", "--filter", "label=steppe.step=t1-limits"]).output().expect("docker ps");
        let id = String::from_utf8_lossy(&id.stdout).lines().next().unwrap_or_default().to_string();
        if id.is_empty() {
            return false;
        }
        let o = Command::new("docker").args(["inspect", "-f", "{{.HostConfig.CpuShares}} {{.HostConfig.Memory}}", &id]).output().expect("docker inspect");
        seen = String::from_utf8_lossy(&o.stdout).trim().to_string();
        !seen.is_empty()
    });
    assert_eq!(seen, format!("512 {}", 64 << 20));
    assert_eq!(limited.wait().expect("wait").code(), Some(0));
    // A guard runs where its step does: in the image (no Debian there), and on this Debian host.
    let out = steppe(&["run", "p.yml", "--job", "guarded"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("the guard ran in the image"), "{said}");
    assert_eq!(said.matches("the guard ran in the image").count(), 1, "{said}");
    no_container_left(&["t1-"]);
}

/// The project's base image (`deploy/build-image.sh`: Debian by
/// debootstrap, nothing pulled) with this build's binary, tagged as the
/// pipelines here name it.
fn debian_image() -> &'static str {
    const NAME: &str = "steppe-test/debian:1";
    if Command::new("docker").args(["image", "inspect", NAME]).output().expect("docker").status.success() {
        return NAME;
    }
    let built = Command::new("sh").arg(repo("deploy/build-image.sh")).env("STEPPE_BINARY", env!("CARGO_BIN_EXE_steppe")).env("IMAGE", NAME).output().expect("sh");
    assert!(built.status.success(), "deploy/build-image.sh: {}", String::from_utf8_lossy(&built.stderr));
    NAME
}

/// The same pipeline in a Debian image made from the project's base and on
/// the host ends the same: outcomes, the execution log and what its
/// outputs held (real tools: sort, sed, grep, tar, sha256sum).
#[test]
fn the_same_pipeline_ends_the_same_in_an_image_and_on_the_host() {
    let image = debian_image();
    let work = scratch("containers-parity");
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: parity\n  plan:\n  - task: p6-make\n    image: ((image))\n    outputs: [a, b]\n    run: printf 'pear\\napple\\nfig\\n' > a/fruit; mkdir b/deep; echo two > b/deep/y\n  - in_parallel:\n    - task: p6-sort\n      image: ((image))\n      inputs: [a]\n      outputs: [c]\n      run: sort a/fruit | sed 's/^/- /' > c/sorted; grep -c . a/fruit\n    - try:\n        task: p6-fails\n        image: ((image))\n        run: echo failing; exit 4\n  - task: p6-show\n    image: ((image))\n    inputs: [b, c]\n    run: cat c/sorted b/deep/y; tar -cf - -C c sorted | tar -tf -; sha256sum c/sorted | cut -c1-16\n    assert:\n      stdout: \"- apple\\n- fig\\n- pear\\ntwo\\nsorted\\n\"\n  assert:\n    execution: [p6-make, p6-sort, p6-fails, p6-show]\n    outcome: succeeded\n",
    )
    .expect("write");
    let ends = |img: &str| {
        let out = steppe(&["test", "p.yml", "--var", &format!("image={img}")], &work);
        let said = text(&out);
        let mut shown: Vec<String> = said.lines().filter(|l| l.starts_with("[p6-") || l.starts_with("PASS") || l.starts_with("FAIL")).map(str::to_string).collect();
        // Parallel steps' lines interleave as they come; each step's stay in order.
        shown.sort_by_key(|l| l.split(']').next().unwrap_or_default().to_string());
        (out.status.code(), shown)
    };
    let (host, in_image) = (ends(""), ends(image));
    assert_eq!(host.0, Some(0), "{host:?}");
    assert!(host.1.iter().any(|l| l.starts_with("[p6-show] ") && l.len() == "[p6-show] ".len() + 16), "the digest line: {host:?}");
    assert_eq!(host, in_image);
    no_container_left(&["p6-"]);
}

/// A task in an image with a `fix:` agent: the fixer's shell and its rerun
/// of the task run in the task's image, and the final run passes there.
#[test]
fn a_fix_agent_works_in_the_failing_tasks_image() {
    let image = test_image();
    let work = scratch("containers-fix");
    std::fs::write(
        work.join("p.yml"),
        format!("agents:\n- name: f7-fixer\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\njobs:\n- name: mend\n  plan:\n  - task: f7-check\n    image: {image}\n    run: '[ -e made-in-image ]'\n    fix: f7-fixer\n"),
    )
    .expect("write");
    // Made only where this test's directory is not: in the image, never on this host.
    std::fs::write(
        work.join("s.yaml"),
        format!("model:\n  turns:\n    - calls:\n        - {{name: run_shell, args: {{command: '[ -e {}/p.yml ] || touch made-in-image'}}}}\n    - calls:\n        - {{name: f7-check, args: {{}}}}\n    - say: mended\n", work.display()),
    )
    .expect("write");
    let out = steppe(&["run", "p.yml", "--script", "s.yaml"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    no_container_left(&["f7-"]);
}

/// An image the engine lacks is pulled before the job starts when a
/// registry answers (a registry of the suite's image on loopback,
/// `tests/support/registry.py`), its progress said; the step then runs in it.
#[test]
fn a_missing_image_is_pulled_when_a_registry_answers() {
    test_image();
    let work = scratch("containers-pull");
    let saved = work.join("saved.tar");
    let out = Command::new("docker").args(["save", TEST_IMAGE, "-o"]).arg(&saved).output().expect("docker save");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut registry = child_of_this_test("python3").arg(repo("tests/support/registry.py")).arg(&saved).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn().expect("python3");
    let mut port = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(registry.stdout.take().expect("stdout")), &mut port).expect("the registry's port");
    let image = format!("localhost:{}/steppe-pulled-{}:1", port.trim(), std::process::id());
    let _ = Command::new("docker").args(["rmi", &image]).output();
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: u8-pulled\n    image: {image}\n    run: echo ran in the pulled image\n")).expect("write");
    let out = steppe(&["validate", "p.yml"], &work);
    assert!(text(&out).contains("a run pulls it if a registry answers"), "{}", text(&out));
    let out = steppe(&["run", "p.yml"], &work);
    let said = text(&out);
    let _ = Command::new("docker").args(["rmi", &image]).output();
    stop([&mut registry]);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains(&format!("pulling image {image}")) && said.contains("[u8-pulled] ran in the pulled image"), "{said}");
    no_container_left(&["u8-"]);
}

/// `steppe validate` checks the images a file names against this machine's
/// engine, positioned at the key naming each.
#[test]
fn validate_reports_images_the_engine_lacks() {
    let image = test_image();
    let work = scratch("containers-validate");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: here\n    image: {image}\n    run: 'true'\n  - task: absent\n    image: steppe-no-such-image:1\n    run: 'true'\n")).expect("write");
    let out = steppe(&["validate", "p.yml"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("p.yml:8") && said.contains("jobs[0].plan[1].image") && said.contains("steppe-no-such-image:1") && said.contains("docker load"), "{said}");
    assert!(!said.contains(&format!("\"{image}\"")), "the present image is fine: {said}");
    assert_eq!(steppe(&["validate", "p.yml", "--syntax-only"], &work).status.code(), Some(0));
}

/// A resource type in an image: check, in and out run there, with the
/// type's user and network, on a worker of the run.
#[test]
fn resource_types_run_in_their_image() {
    let image = test_image();
    let work = scratch("containers-resources");
    // The stages exit 9 wherever this test's directory is: on the host.
    let guard = format!("[ -e {}/p.yml ] && exit 9", work.display());
    std::fs::write(
        work.join("p.yml"),
        format!(
            "resource_types:\n- name: boxed\n  image: {image}\n  user: \"2345:2345\"\n  network: none\n  config:\n    check: |\n      {guard}; printf '[{{\"n\": \"1\"}}, {{\"n\": \"%s\"}}]' $(id -u)\n    in: |\n      {guard}; echo {{{{ .version.n }}}} > number; id -u > uid; ls /sys/class/net > nets\n    out: |\n      {guard}; cat numbers/number >&2; echo '{{\"n\": \"7\"}}'\n\
             resources:\n- name: numbers\n  type: boxed\n  source: {{}}\njobs:\n- name: r2-j\n  plan:\n  - get: numbers\n  - task: r2-read\n    inputs: [numbers]\n    run: cat numbers/number numbers/uid numbers/nets\n    assert:\n      stdout: |\n        2345\n        2345\n        lo\n  - put: numbers\n    inputs: all\n"
        ),
    )
    .expect("write");
    let out = steppe(&["run", "p.yml"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("2345"), "{said}");
    no_container_left(&["numbers", "r2-"]);
}

/// An agent with an image: one container holds its shell tools, the step's
/// directory the only thing of the host in it and the only place it can
/// write. Writing elsewhere, reading a host file and (under `network:
/// none`) reaching a server on the host all fail, each shown by `steppe
/// runs --steps`; a file tool's escape is a sandbox denial as on the host.
#[test]
fn agent_tools_run_in_the_steps_container() {
    let image = test_image();
    let work = scratch("containers-agent");
    let secret = work.join("host-secret.txt");
    std::fs::write(&secret, "the host's secret").expect("write");
    // A server on the host that a container on the default network reaches at its gateway.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        for c in listener.incoming().flatten() {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(c);
        }
    });
    // The default bridge's gateway: its subnet's first address unless the engine names another.
    let gw = Command::new("docker").args(["network", "inspect", "bridge", "-f", "{{(index .IPAM.Config 0).Gateway}} {{(index .IPAM.Config 0).Subnet}}"]).output().expect("docker network inspect");
    let said = String::from_utf8_lossy(&gw.stdout).to_string();
    let gateway = match said.split_whitespace().collect::<Vec<_>>()[..] {
        [gw, _] if gw.contains('.') => gw.to_string(),
        [.., subnet] => {
            let base = subnet.split('/').next().expect("subnet");
            let octets: Vec<&str> = base.split('.').collect();
            format!("{}.{}.{}.1", octets[0], octets[1], octets[2])
        }
        _ => panic!("no bridge network: {said}"),
    };
    let reach = format!("bash -c 'echo hi > /dev/tcp/{gateway}/{port}' && echo reached");
    std::fs::write(
        work.join("p.yml"),
        format!(
            "agents:\n- name: prober\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell, write_file]\n  image: {image}\n  network: none\n\
             - name: dialer\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\n  image: {image}\n\
             - name: sleeper\n  source: {{model: openrouter/x/y}}\n  tools: [{{builtin: run_shell, timeout: 1s}}]\n  image: {image}\n\
             - name: maker\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell, read_file]\n  image: {image}\n\
             jobs:\n- name: a3-probe\n  plan:\n  - agent: prober\n    outputs: [out]\n    messages: [Probe the sandbox.]\n  - task: a3-after\n    inputs: [out]\n    run: cat out/made\n    assert:\n      stdout: made-inside\n\
             - name: a3-dial\n  plan:\n  - agent: dialer\n    messages: [Dial the host.]\n\
             - name: a3-slow\n  plan:\n  - agent: sleeper\n    messages: [Take your time.]\n\
             - name: a3-device\n  plan:\n  - agent: maker\n    messages: [Make a device.]\n"
        ),
    )
    .expect("write");
    let call = |cmd: &str| format!("    - calls:\n        - {{name: run_shell, args: {{command: {}}}}}\n", serde_json::to_string(cmd).expect("json"));
    let scenario = format!(
        "model:\n  turns:\n{}{}{}{}    - calls:\n        - {{name: write_file, args: {{path: ../outside.txt, content: x}}}}\n    - say: probed\n",
        call(&format!("echo made-inside > out/made; [ -e {}/p.yml ] || echo in-the-image", work.display())),
        call("touch /etc/steppe-escape"),
        call(&format!("cat {}", secret.display())),
        call(&reach),
    );
    std::fs::write(work.join("s.yaml"), scenario).expect("write");
    let out = steppe(&["run", "p.yml", "--job", "a3-probe", "--script", "s.yaml"], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 0, "network: none reached the host: {said}");
    assert!(!said.contains("the host's secret"), "{said}");
    let steps = text(&steppe(&["runs", "p.yml", "--job", "a3-probe", "--steps"], &work));
    assert!(steps.contains("tool failed: run_shell touch /etc/steppe-escape") && steps.contains("Read-only file system"), "{steps}");
    assert!(steps.contains(&format!("tool failed: run_shell cat {}", secret.display())) && steps.contains("No such file"), "{steps}");
    assert!(steps.contains("tool failed: run_shell bash -c") && steps.contains("Network is unreachable"), "{steps}");
    assert!(!steps.contains("tool failed: write_file"), "a refusal is listed once, as a denial: {steps}");
    assert!(steps.contains("denied: write_file"), "{steps}");
    assert!(!work.join("outside.txt").exists());
    let transcript = text(&steppe(&["runs", "p.yml", "--job", "a3-probe", "--transcript"], &work));
    assert!(transcript.contains("in-the-image"), "the shell ran in the image: {transcript}");
    // The same call on the default network reaches the host: the fence above was the container's.
    std::fs::write(work.join("dial.yaml"), format!("model:\n  turns:\n{}    - say: dialed\n", call(&reach))).expect("write");
    let out = steppe(&["run", "p.yml", "--job", "a3-dial", "--script", "dial.yaml"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for("the host's server reached", Duration::from_secs(5), || accepted.load(std::sync::atomic::Ordering::SeqCst) > 0);
    // A call past its timeout restarts the container: what it started is
    // gone, the step's files stay, and the next call runs.
    std::fs::write(work.join("slow.yaml"), format!("model:\n  turns:\n{}{}    - say: rested\n", call("echo kept > kept; sleep 30 & sleep 20"), call("cat kept; echo after-restart"))).expect("write");
    let out = steppe(&["run", "p.yml", "--job", "a3-slow", "--script", "slow.yaml"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let transcript = text(&steppe(&["runs", "p.yml", "--job", "a3-slow", "--transcript"], &work));
    assert!(transcript.contains("timed out after 1s") && transcript.contains("restarted") && transcript.contains("kept\\nafter-restart"), "{transcript}");
    // A root shell in the container may not make a device node (one left
    // in the step's directory would be the host's device to whatever opens
    // it there); the host's file tools refuse one made anyway (where the
    // container is privileged: worker::sandbox's tests make one as root).
    std::fs::write(work.join("device.yaml"), format!("model:\n  turns:\n{}    - calls:\n        - {{name: read_file, args: {{path: null-dev}}}}\n    - say: looked\n", call("mknod null-dev c 1 3 && echo made-a-device"))).expect("write");
    let out = steppe(&["run", "p.yml", "--job", "a3-device", "--script", "device.yaml"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let transcript = text(&steppe(&["runs", "p.yml", "--job", "a3-device", "--transcript"], &work));
    assert!(transcript.contains("mknod: null-dev: Operation not permitted") && transcript.contains("null-dev: No such file"), "{transcript}");
    no_container_left(&["prober", "dialer", "sleeper", "maker"]);
}

/// Through a cluster: steps with an image, and agents whose tools run in
/// one, go only to a worker that reaches a Docker engine (here a pulling
/// one); one that reaches none (its DOCKER_HOST leads nowhere) and one
/// started with --no-containers say so when they join and get none of
/// them. With no such worker connected, a run says so.
#[test]
fn container_steps_go_only_to_workers_that_run_containers() {
    let image = test_image();
    let work = scratch("containers-cluster");
    let (redis, redis_url) = redis_server();
    let (coord, url, log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url, "--store", &redis_url], &work);
    let worker = |tag: &str, extra: &[&str], docker_host: &str| {
        let mut c = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
        c.args(["worker", "--coordinator", &url, "--slots", "2"]).args(extra).env("WORKER_TAG", tag).stderr(std::process::Stdio::null());
        if !docker_host.is_empty() {
            c.env("DOCKER_HOST", docker_host);
        }
        c.spawn().expect("spawn worker")
    };
    let mut plain = worker("plain", &[], "unix:///nonexistent/docker.sock");
    let mut opted_out = worker("plain", &["--no-containers"], "");
    let mut boxed = worker("boxed", &["--queue", &redis_url], "");
    let joined = || log.lock().map(|l| l.matches(" joined (").count()).unwrap_or(0);
    wait_for("the workers joined", Duration::from_secs(30), || joined() == 3);
    let said = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(said.matches("runs containers").count(), 1, "{said}");
    assert_eq!(said.matches("no Docker engine: steps with an image go to other workers").count(), 2, "{said}");
    let mut plan = String::from("  - in_parallel:\n");
    for i in 0..6 {
        plan.push_str(&format!("    - task: c5-host-{i}\n      env: [WORKER_TAG]\n      run: sleep 0.3; echo on-$WORKER_TAG\n"));
        plan.push_str(&format!("    - task: c5-boxed-{i}\n      image: {image}\n      env: [WORKER_TAG]\n      run: sleep 0.3; echo on-$WORKER_TAG\n"));
    }
    plan.push_str("    - agent: c5-agent\n      messages: [Say where.]\n");
    std::fs::write(
        work.join("p.yml"),
        format!("agents:\n- name: c5-agent\n  source: {{model: openrouter/x/y}}\n  tools: [run_shell]\n  image: {image}\n  env: [WORKER_TAG]\njobs:\n- name: spread\n  plan:\n{plan}- name: lonely\n  plan:\n  - task: c5-waits\n    image: {image}\n    run: echo never\n"),
    )
    .expect("write");
    std::fs::write(work.join("s.yaml"), "model:\n  turns:\n    - calls:\n        - {name: run_shell, args: {command: 'echo agent-on-$WORKER_TAG'}}\n    - say: done\n").expect("write");
    let out = steppe(&["run", "p.yml", "--job", "spread", "--script", "s.yaml", "--coordinator", &url], &work);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for i in 0..6 {
        assert!(said.contains(&format!("[c5-boxed-{i}] on-boxed")), "{said}");
    }
    let transcript = text(&steppe(&["runs", "--coordinator", &url, "--job", "spread", "--transcript"], &work));
    assert!(transcript.contains("agent-on-boxed") && !transcript.contains("agent-on-plain"), "{transcript}");
    // Without a worker that runs containers, the run says why its step waits.
    stop([&mut boxed]);
    let mut submit = child_of_this_test("sh")
        .args(["-c", "exec \"$0\" submit p.yml --job lonely --coordinator \"$1\" 2>&1", env!("CARGO_BIN_EXE_steppe"), &url])
        .current_dir(&work)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("submit");
    let lines = std::io::BufRead::lines(std::io::BufReader::new(submit.stdout.take().expect("stdout")));
    let note = lines.map_while(Result::ok).find(|l| l.contains("no connected worker of pool default reaches a Docker engine"));
    assert!(note.is_some_and(|n| n.contains("c5-waits") || n.contains(image)), "the run says why it waits");
    stop([&mut submit, &mut plain, &mut opted_out]);
    let mut rest = [redis, coord];
    stop(rest.iter_mut());
    wait_for("no container of these steps left", Duration::from_secs(10), || steppe_containers("c5-").is_empty());
}

/// Ctrl-C stops a run's container and removes it; a run killed with -9
/// while its step's container runs leaves it running, and the next steppe
/// on this host removes it.
#[test]
fn a_dead_runs_container_is_removed_by_the_next() {
    let image = test_image();
    let work = scratch("containers-orphan");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: long\n  plan:\n  - task: o4-nap\n    image: {image}\n    run: sleep 120\n- name: quick\n  plan:\n  - task: o4-t\n    run: echo quick\n")).expect("write");
    let start = || child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["run", "p.yml", "--job", "long"]).current_dir(&work).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("run");
    let of = |pid: &str| {
        let out = Command::new("docker").args(["ps", "-a", "--filter", "label=steppe.owner", "--format", "{{.ID}} {{.Label \"steppe.owner\"}}"]).output().expect("docker ps");
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.split(' ').nth(1).and_then(|o| o.split(':').nth(1)) == Some(pid)).count()
    };
    // Ctrl-C: the run ends, its container with it.
    let mut interrupted = start();
    let pid = interrupted.id().to_string();
    wait_for("the step's container", Duration::from_secs(30), || of(&pid) == 1);
    // SAFETY: signalling a child this test started.
    unsafe { libc::kill(interrupted.id() as i32, libc::SIGINT) };
    let status = interrupted.wait().expect("wait");
    assert_ne!(status.code(), Some(0));
    wait_for("the interrupted run's container removed", Duration::from_secs(10), || of(&pid) == 0);
    let mut doomed = start();
    let pid = doomed.id().to_string();
    wait_for("the step's container", Duration::from_secs(30), || of(&pid) == 1);
    doomed.kill().expect("kill -9");
    let _ = doomed.wait();
    // Killed with -9 it could not remove its container (which would sleep
    // on for two minutes); the next steppe on this host removes it (so may
    // one of another test running at the same time).
    let out = steppe(&["run", "p.yml", "--job", "quick"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    wait_for("the orphan removed by the next run", Duration::from_secs(20), || of(&pid) == 0);
}
