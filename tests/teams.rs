//! One coordinator shared by two teams (`--auth`): each team's submit token
//! sees and acts on its own pipelines only, a worker token only serves, an
//! admin sees everyone, pools belong to their team, and an entry removed
//! from the file stops working at the next SIGHUP.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// `steppe ARGS --coordinator URL --token-file TOKEN` in `dir`: code and all it printed.
fn as_caller(dir: &Path, url: &str, token: &str, args: &[&str]) -> (i32, String) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--coordinator", url, "--token-file", token]);
    let out = steppe(&all, dir);
    (out.status.code().unwrap_or(-1), text(&out))
}

/// A token made by `steppe token new`, its entry appended to `auth`.
fn token(dir: &Path, file: &str, args: &[&str]) {
    let mut all = vec!["token", "new", "--append-to", "auth.yml"];
    all.extend(args);
    let out = steppe(&all, dir);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::write(dir.join(file), &out.stdout).expect("write token");
}

#[test]
fn two_teams_on_one_coordinator_never_see_each_other() {
    let work = scratch("teams");
    token(&work, "blue.token", &["--team", "blue", "--role", "submit"]);
    token(&work, "red.token", &["--team", "red", "--role", "submit", "--name", "red-ci"]);
    token(&work, "worker.token", &["--team", "ops", "--role", "worker"]);
    token(&work, "gpu.token", &["--team", "red", "--role", "worker", "--pools", "red-gpu"]);
    token(&work, "admin.token", &["--role", "admin"]);
    let (mut coord, url, lines) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state", "--auth", "auth.yml"], &work);
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--token-file", "worker.token", "--slots", "4"])
        .current_dir(&work)
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("worker");
    // Both teams submit a pipeline called `app` that parks on an approval.
    let app = "jobs:\n- name: ship\n  plan:\n  - approval:\n      message: Ship {team}?\n      timeout: 2m\n  - task: deploy\n    run: echo deployed for {team}\n";
    for team in ["blue", "red"] {
        std::fs::write(work.join(format!("{team}.yml")), app.replace("{team}", team)).expect("write");
    }
    let detach = |team: &str| {
        let (file, token) = (format!("{team}.yml"), format!("{team}.token"));
        let out = steppe(&["submit", &file, "--pipeline", "app", "--detach", "--coordinator", &url, "--token-file", &token], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (blue_run, red_run) = (detach("blue"), detach("red"));
    let pending = |token: &str| as_caller(&work, &url, token, &["approvals"]).1;
    wait_for("both approvals", Duration::from_secs(20), || pending("admin.token").matches("Ship").count() == 2);
    let blue_approval = pending("blue.token").lines().nth(1).and_then(|l| l.split_whitespace().next()).unwrap_or_default().to_string();
    // Red cannot see, approve or cancel blue's run, and is not told it exists.
    let red = |args: &[&str]| as_caller(&work, &url, "red.token", args);
    let runs = red(&["runs"]).1;
    assert!(runs.contains(&red_run) && !runs.contains(&blue_run), "{runs}");
    assert!(!pending("red.token").contains("Ship blue"), "{}", pending("red.token"));
    let (code, out) = red(&["runs", "--run", &blue_run, "--logs"]);
    assert_ne!(code, 0);
    assert!(out.contains(&format!("no run {blue_run}")), "{out}");
    let (code, out) = red(&["approve", &blue_approval]);
    assert_ne!(code, 0);
    assert!(out.contains(&format!("no approval {blue_approval}")), "{out}");
    let (code, out) = red(&["cancel", &blue_run]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("no run {blue_run} is going on")), "{out}");
    let (code, out) = red(&["cancel", "--pipeline", "app"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&red_run) && !out.contains(&blue_run), "red cancels its own app, not blue's: {out}");
    let pipelines = red(&["pipelines"]).1;
    for answer in [&runs, &pipelines] {
        assert!(!answer.contains("blue"), "nothing of blue's leaks to red: {answer}");
    }
    // A worker token serves; it does not submit or read.
    let (code, out) = as_caller(&work, &url, "worker.token", &["submit", "blue.yml"]);
    assert_ne!(code, 0);
    assert!(out.contains("a worker token cannot"), "{out}");
    let (code, out) = as_caller(&work, &url, "worker.token", &["runs"]);
    assert_ne!(code, 0);
    assert!(out.contains("a worker token cannot") || out.contains("reading history takes"), "{out}");
    // Pools belong to their team: red-gpu's worker serves only it, blue may not use it.
    let gpu = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["worker", "--coordinator", &url, "--token-file", "gpu.token", "--reconnect-for", "0s"]).current_dir(&work).output().expect("worker");
    assert_ne!(gpu.status.code(), Some(0));
    assert!(text(&gpu).contains("serves pool(s) red-gpu, not default"), "{}", text(&gpu));
    let (code, out) = as_caller(&work, &url, "blue.token", &["submit", "blue.yml", "--pool", "red-gpu", "--pipeline", "sneaky"]);
    assert_ne!(code, 0);
    assert!(out.contains("pool red-gpu is not your team's"), "{out}");
    // The admin sees both teams and approves blue's: blue's run goes on.
    let all = as_caller(&work, &url, "admin.token", &["pipelines"]).1;
    assert!(all.contains("blue") && all.contains("red"), "{all}");
    let (code, out) = as_caller(&work, &url, "blue.token", &["approve", &blue_approval]);
    assert_eq!(code, 0, "{out}");
    wait_for("blue's run to succeed", Duration::from_secs(30), || as_caller(&work, &url, "blue.token", &["runs", "--run", &blue_run]).1.contains("(succeeded)"));
    // Red's entry leaves the file; after SIGHUP its token is refused.
    let auth = std::fs::read_to_string(work.join("auth.yml")).expect("auth");
    let kept: Vec<&str> = auth.split("- ").filter(|e| !e.is_empty() && !e.contains("\"red-ci\"")).collect();
    std::fs::write(work.join("auth.yml"), kept.iter().map(|e| format!("- {e}")).collect::<String>()).expect("rewrite");
    assert!(std::process::Command::new("kill").args(["-HUP", &coord.id().to_string()]).status().expect("kill").success());
    wait_for("the reload", Duration::from_secs(10), || lines.lock().map(|l| l.contains("reloaded --auth")).unwrap_or(false));
    let (code, out) = red(&["runs"]);
    assert_ne!(code, 0);
    assert!(out.contains("the coordinator does not know this token: check --token-file"), "{out}");
    // The coordinator's log line may reach this test's reader a moment after the refusal reached the caller.
    wait_for("refusals logged with the caller's address", Duration::from_secs(10), || lines.lock().map(|l| l.contains("refused a call from 127.0.0.1")).unwrap_or(false));
    assert_eq!(as_caller(&work, &url, "blue.token", &["runs"]).0, 0, "blue is still in");
    stop([&mut worker, &mut coord]);
}
