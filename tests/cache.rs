//! The step cache, resume and replay, through the real binary: a rerun of an
//! unchanged pipeline skips its chain, a change reruns it, `--force` and the
//! uncacheable kinds run anyway, `steppe plan` says why; a failed run is
//! resumed where it stopped and replayed from a step, embedded and through
//! a coordinator.

mod common;

use std::path::Path;

use common::*;

/// A pipeline whose steps count their executions in `runs.log` (outside the
/// step's directory, named by a var) and whose resource reads its versions
/// from `versions.json`.
const PIPELINE: &str = r#"
resource_types:
- name: file-versions
  config:
    check: cat ((dir))/versions.json
resources:
- name: repo
  type: file-versions
  source: {}
jobs:
- name: build
  plan:
  - get: repo
  - task: compile
    inputs: [repo]
    outputs: [bin]
    run: echo compile >> ((dir))/runs.log && cat repo/version.json > bin/built
  - task: check
    inputs: [bin]
    run: echo check >> ((dir))/runs.log && grep -q ref bin/built
"#;

fn runs(work: &Path) -> Vec<String> {
    lines_of(&work.join("runs.log"))
}

fn run(work: &Path, extra: &[&str]) -> String {
    let dir = format!("dir={}", work.display());
    let out = steppe(&[&["run", "p.yml", "--var", &dir][..], extra].concat(), work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    t
}

#[test]
fn a_rerun_skips_its_chain_and_a_change_reruns_it() {
    let work = scratch("cache-chain");
    std::fs::write(work.join("p.yml"), PIPELINE).expect("write");
    std::fs::write(work.join("versions.json"), r#"[{"ref":"a"}]"#).expect("write");

    let first = run(&work, &[]);
    assert!(!first.contains("skip:"), "{first}");
    assert_eq!(runs(&work), ["compile", "check"]);

    // Unchanged: the chain is skipped whole, the get says its version.
    let second = run(&work, &[]);
    assert!(second.contains(r#"skip: repo (version: {"ref":"a"})"#), "{second}");
    assert!(second.contains("skip: compile (chain)") && second.contains("skip: check (chain)"), "{second}");
    assert!(second.contains("execution: []"), "chain skips add nothing to the execution log: {second}");
    assert_eq!(runs(&work), ["compile", "check"], "nothing ran");

    let dir = format!("dir={}", work.display());
    let plan = steppe(&["plan", "p.yml", "--var", &dir], &work);
    let p = text(&plan);
    assert_eq!(plan.status.code(), Some(0), "{p}");
    assert!(p.lines().next().is_some_and(|l| l.starts_with("ACTION") && l.contains("STEP") && l.contains("HASH") && l.contains("WHY")), "{p}");
    assert!(p.contains("3 step(s): 0 would run, 3 cached"), "{p}");
    assert!(p.lines().any(|l| l.starts_with("skip") && l.contains("compile") && l.contains("chain")), "{p}");

    // --force runs it all again.
    let forced = run(&work, &["--force"]);
    assert!(!forced.contains("skip:"), "{forced}");
    assert_eq!(runs(&work).len(), 4);

    // A new version is a new chain: everything after the get runs.
    std::fs::write(work.join("versions.json"), r#"[{"ref":"a"},{"ref":"b"}]"#).expect("write");
    let plan = text(&steppe(&["plan", "p.yml", "--var", &dir], &work));
    assert!(plan.contains("3 step(s): 3 would run, 0 cached") && plan.contains("no run succeeded through this chain"), "{plan}");
    let newer = run(&work, &[]);
    assert!(!newer.contains("skip:"), "{newer}");
    assert_eq!(runs(&work).len(), 6);
    // Pinned back to the old version: that chain succeeded before.
    let pinned = run(&work, &["--pin", "ref=a"]);
    assert!(pinned.contains(r#"skip: repo (version: {"ref":"a"})"#), "{pinned}");
    assert_eq!(runs(&work).len(), 6);

    // A changed command changes its hash and every hash after it.
    std::fs::write(work.join("p.yml"), PIPELINE.replace("grep -q ref", "grep -q '\"ref\"'")).expect("write");
    let changed = run(&work, &[]);
    assert!(!changed.contains("skip:"), "{changed}");
    assert_eq!(runs(&work).len(), 8);
    assert!(run(&work, &[]).contains("skip: compile (chain)"));
}

#[test]
fn uncacheable_steps_say_so_and_always_run() {
    let work = scratch("cache-uncacheable");
    let dir = format!("dir={}", work.display());
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: j\n  plan:\n  - task: first\n    run: echo first >> ((dir))/runs.log\n  - task: guarded\n    when: {run: 'true'}\n    run: echo guarded >> ((dir))/runs.log\n",
    )
    .expect("write");
    for n in 1..=2 {
        let out = steppe(&["run", "p.yml", "--var", &dir], &work);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{t}");
        assert!(t.contains("note: guarded makes this chain uncacheable (when: decides at run time)"), "{t}");
        assert_eq!(runs(&work).len(), 2 * n, "{t}");
    }
    let plan = text(&steppe(&["plan", "p.yml", "--var", &dir], &work));
    assert!(plan.contains("2 step(s): 2 would run, 0 cached") && plan.contains("guarded makes this chain uncacheable"), "{plan}");
    // `steppe test` never skips.
    std::fs::write(work.join("t.yml"), "jobs:\n- name: j\n  plan:\n  - task: once\n    run: echo once >> ((dir))/runs.log\n").expect("write");
    for _ in 0..2 {
        assert_eq!(steppe(&["test", "t.yml", "--var", &dir], &work).status.code(), Some(0));
    }
    assert_eq!(runs(&work).iter().filter(|l| *l == "once").count(), 2);
}

/// A job whose middle step fails until `ok` exists beside the pipeline.
const FLAKY: &str = r#"
jobs:
- name: ship
  plan:
  - task: prepare
    outputs: [out]
    run: echo prepare >> ((dir))/runs.log && echo made-by-prepare > out/file
  - load_var: flavour
    file: out/file
    inputs: [out]
  - task: flaky
    run: echo flaky >> ((dir))/runs.log && test -e ((dir))/ok
  - task: finish
    inputs: [out]
    run: echo finish-((flavour)) >> ((dir))/runs.log && grep -q made-by-prepare out/file
"#;

fn run_id_in(text: &str, prefix: &str) -> String {
    let line = text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line in {text}"));
    line.rsplit(' ').next().unwrap_or_default().to_string()
}

#[test]
fn a_failed_run_resumes_where_it_stopped_and_replays_from_a_step() {
    let work = scratch("cache-resume");
    let dir = format!("dir={}", work.display());
    std::fs::write(work.join("p.yml"), FLAKY).expect("write");
    let failed = steppe(&["run", "p.yml", "--var", &dir], &work);
    let t = text(&failed);
    assert_eq!(failed.status.code(), Some(1), "{t}");
    assert!(t.contains("resume with: steppe run p.yml --resume "), "the hint after a failed run: {t}");
    let id = run_id_in(&t, "resume with:");
    assert_eq!(runs(&work), ["prepare", "flaky"]);

    std::fs::write(work.join("ok"), "").expect("write");
    let resumed = steppe(&["run", "p.yml", "--var", &dir, "--resume", &id], &work);
    let t = text(&resumed);
    assert_eq!(resumed.status.code(), Some(0), "{t}");
    assert!(t.contains("skip: prepare (already succeeded)") && t.contains("skip: flavour (already succeeded)"), "{t}");
    assert!(t.contains("execution: [prepare, flavour, flaky, finish]"), "resumed steps count in the execution log: {t}");
    assert_eq!(runs(&work), ["prepare", "flaky", "flaky", "finish-made-by-prepare"], "the artifact and the value came back");

    // A succeeded run has nothing to resume; a replay starts where it is told.
    let runs_out = text(&steppe(&["runs", "p.yml"], &work));
    let latest = runs_out.lines().nth(1).and_then(|l| l.split_whitespace().next()).unwrap_or_default().to_string();
    let ok = steppe(&["run", "p.yml", "--var", &dir, "--resume", &latest], &work);
    assert!(text(&ok).contains("nothing to resume"), "{runs_out}\n{}", text(&ok));
    let replay = steppe(&["run", "p.yml", "--var", &dir, "--replay", &latest, "--from", "finish"], &work);
    let t = text(&replay);
    assert_eq!(replay.status.code(), Some(0), "{t}");
    assert!(t.contains("skip: flaky (from the replayed run)"), "{t}");
    assert_eq!(runs(&work).last().map(String::as_str), Some("finish-made-by-prepare"));
    assert_eq!(runs(&work).len(), 5, "only finish ran");
    let bad = steppe(&["run", "p.yml", "--var", &dir, "--replay", &latest, "--from", "finnish"], &work);
    let t = text(&bad);
    assert_eq!(bad.status.code(), Some(2), "{t}");
    assert!(t.contains("no top-level step of that name") && t.contains("did you mean \"finish\""), "{t}");
    let both = steppe(&["run", "p.yml", "--resume", &latest, "--replay", &latest, "--from", "finish"], &work);
    assert_eq!(both.status.code(), Some(2), "{}", text(&both));
}

#[test]
fn a_cluster_skips_for_every_submitter_and_resumes_a_submitted_run() {
    let work = scratch("cache-cluster");
    std::fs::write(work.join("token"), "cache-cluster-token\n").expect("write");
    let (mut coord, url, mut lines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--token-file", "token", "--state", "state"], &work);
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let token = work.join("token").display().to_string();
    let mut worker = spawn_worker(&url, &["--token-file", &token, "--slots", "2"]);
    let dir = format!("dir={}", work.display());
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: once\n    run: echo once >> ((dir))/runs.log\n").expect("write");
    let submit = |extra: &[&str]| {
        let out = steppe(&[&["submit", "p.yml", "--coordinator", &url, "--token-file", "token", "--var", &dir][..], extra].concat(), &work);
        (out.status.code(), text(&out))
    };
    let (code, t) = submit(&[]);
    assert_eq!(code, Some(0), "{t}");
    let (code, t) = submit(&[]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("skip: once (cached)"), "{t}");
    assert_eq!(runs(&work), ["once"]);
    let (code, t) = submit(&["--force"]);
    assert_eq!(code, Some(0), "{t}");
    assert_eq!(runs(&work).len(), 2);

    std::fs::write(work.join("f.yml"), FLAKY).expect("write");
    let out = steppe(&["submit", "f.yml", "--coordinator", &url, "--token-file", "token", "--var", &dir], &work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let id = run_id_in(&t, "resume with:");
    std::fs::write(work.join("ok"), "").expect("write");
    let out = steppe(&["submit", "f.yml", "--coordinator", &url, "--token-file", "token", "--var", &dir, "--resume", &id], &work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("skip: prepare (already succeeded)") && t.contains("execution: [prepare, flavour, flaky, finish]"), "{t}");
    assert_eq!(runs(&work).iter().filter(|l| l.starts_with("prepare")).count(), 1, "{:?}", runs(&work));
    stop([&mut worker, &mut coord]);
}

#[test]
fn with_a_workspace_root_outputs_and_fetches_are_reused_across_builds() {
    let work = scratch("cache-outputs");
    std::fs::write(work.join("versions.json"), r#"[{"ref":"a"}]"#).expect("write");
    std::fs::write(
        work.join("p.yml"),
        r#"
workspace:
  root: ws
  cache: {resources: true}
resource_types:
- name: file-versions
  config:
    check: cat ((dir))/versions.json
    in: echo fetched >> ((dir))/runs.log && echo {{ .version.ref }} > ref
resources:
- {name: repo, type: file-versions, source: {}}
jobs:
- name: j
  plan:
  - get: repo
  - task: build
    inputs: [repo]
    outputs: [bin]
    run: echo build >> ((dir))/runs.log && cp repo/ref bin/ref
  - task: stamp
    inputs: [bin]
    outputs: [stamped]
    volatile: true
    run: echo stamp >> ((dir))/runs.log && cp bin/ref stamped/ref
  - task: report
    inputs: [stamped]
    run: echo report-((n))-$(cat stamped/ref) >> ((dir))/runs.log
"#,
    )
    .expect("write");
    let go = |n: &str| {
        let out = steppe(&["run", "p.yml", "--var", &format!("dir={}", work.display()), "--var", &format!("n={n}")], &work);
        let t = text(&out);
        assert_eq!(out.status.code(), Some(0), "{t}");
        t
    };
    go("1");
    assert_eq!(runs(&work), ["fetched", "build", "stamp", "report-1-a"]);
    // Another chain (the report changed): build's outputs come back, the
    // volatile stamp runs, the fetch is not made again.
    let t = go("2");
    assert!(t.contains("skip: build (reused)") && t.contains("fetched before"), "{t}");
    assert!(t.contains("execution: [repo, build, stamp, report]"), "a reused step counts: {t}");
    assert_eq!(runs(&work)[4..], ["stamp", "report-2-a"]);
    // A new version is new input: build runs again.
    std::fs::write(work.join("versions.json"), r#"[{"ref":"a"},{"ref":"b"}]"#).expect("write");
    go("3");
    assert_eq!(runs(&work)[6..], ["fetched", "build", "stamp", "report-3-b"]);
}

#[test]
fn history_is_capped_by_defaults_and_flags() {
    let work = scratch("cache-history");
    let dir = format!("dir={}", work.display());
    std::fs::write(
        work.join("p.yml"),
        "defaults:\n  version_history: 2\nresource_types:\n- name: file-versions\n  config:\n    check: cat ((dir))/versions.json\nresources:\n- {name: repo, type: file-versions, source: {}}\njobs:\n- name: j\n  plan:\n  - get: repo\n  - task: t\n    inputs: [repo]\n    run: cat repo/version.json\n",
    )
    .expect("write");
    for (i, refs) in [r#"[{"ref":"a"}]"#, r#"[{"ref":"b"}]"#, r#"[{"ref":"c"}]"#, r#"[{"ref":"d"}]"#].iter().enumerate() {
        std::fs::write(work.join("versions.json"), refs).expect("write");
        let out = steppe(&["run", "p.yml", "--var", &dir, "--run-history", "3"], &work);
        assert_eq!(out.status.code(), Some(0), "run {i}: {}", text(&out));
    }
    // Pinned to a version the history no longer holds: it is gone.
    let out = steppe(&["run", "p.yml", "--var", &dir, "--pin", "ref=a"], &work);
    assert!(text(&out).contains("no version matches pin"), "{}", text(&out));
    let out = steppe(&["run", "p.yml", "--var", &dir, "--pin", "ref=c", "--run-history", "3"], &work);
    assert_eq!(out.status.code(), Some(0), "the newest two stay: {}", text(&out));
    let listed = text(&steppe(&["runs", "p.yml"], &work));
    assert_eq!(listed.lines().filter(|l| l.starts_with("r-")).count(), 3, "three runs kept: {listed}");
}

#[test]
fn matrix_cells_that_succeeded_before_are_skipped_one_by_one() {
    let work = scratch("cache-cells");
    let dir = format!("dir={}", work.display());
    let write = |values: &str| {
        std::fs::write(
            work.join("p.yml"),
            format!("jobs:\n- name: j\n  plan:\n  - task: test\n    across:\n    - var: os\n      values: [{values}]\n    run: echo {{{{ .vars.os }}}} >> ((dir))/runs.log\n"),
        )
        .expect("write");
    };
    write("linux, mac");
    let run = || {
        let out = steppe(&["run", "p.yml", "--var", &dir], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        text(&out)
    };
    run();
    assert_eq!(runs(&work), ["linux", "mac"]);
    write("linux, mac, windows");
    let t = run();
    assert!(t.contains("skip: test [os=linux] (unchanged)") && t.contains("skip: test [os=mac] (unchanged)"), "{t}");
    assert_eq!(runs(&work)[2..], ["windows"], "only the new cell ran");
}
