//! A coordinator under hostile submissions, sent over its real gRPC API the
//! way an attacker with a valid token would (not through `steppe submit`,
//! which refuses most of them before they leave): nothing reads the
//! coordinator's files, no document crashes or exhausts it, and it goes on
//! serving afterwards.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use steppe_proto::v1::runs_client::RunsClient;
use steppe_proto::v1::{run_event, BundleFile, SubmitRequest};

const SECRET: &str = "TOPSECRET-coordinator-only";

/// Sends `req` and collects what comes back: (exit code, every line).
fn submit_raw(url: &str, token: &str, req: SubmitRequest) -> (i32, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string()).expect("url").connect().await.expect("connect");
        let bearer: tonic::metadata::MetadataValue<_> = format!("Bearer {token}").parse().expect("token");
        let mut client = RunsClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", bearer.clone());
            Ok(r)
        });
        let mut stream = match client.submit(req).await {
            Ok(s) => s.into_inner(),
            Err(s) => return (-1, format!("refused: {}", s.message())),
        };
        let mut out = String::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(60), stream.message()).await {
                Ok(Ok(Some(ev))) => match ev.event {
                    Some(run_event::Event::Line(l)) => {
                        out.push_str(&l);
                        out.push('\n');
                    }
                    Some(run_event::Event::Finished(f)) => return (f.exit_code, out),
                    _ => {}
                },
                Ok(Ok(None)) => return (-2, format!("{out}[stream ended without a verdict]")),
                Ok(Err(s)) => return (-3, format!("{out}[stream failed: {}]", s.message())),
                Err(_) => return (-4, format!("{out}[no verdict within 60 s]")),
            }
        }
    })
}

fn file(path: &str, content: &str) -> BundleFile {
    BundleFile { path: path.into(), content: content.as_bytes().to_vec(), executable: false }
}

fn request(pipeline: &str, files: Vec<BundleFile>) -> SubmitRequest {
    let mut all = vec![file("p.yml", pipeline)];
    all.extend(files);
    SubmitRequest { pipeline: "p.yml".into(), files: all, test: true, ..Default::default() }
}

/// Peak resident memory of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()).map(|kb| kb / 1024).unwrap_or(0)
}

struct Cluster {
    coord: std::process::Child,
    worker: std::process::Child,
    url: String,
    work: std::path::PathBuf,
    /// What the coordinator printed, for failure messages.
    log: Log,
}

impl Cluster {
    fn log(&self) -> String {
        let worker = std::fs::read_to_string(self.work.join("worker.log")).unwrap_or_default();
        format!("coordinator:\n{}\nworker:\n{worker}", self.log.lock().map(|l| l.clone()).unwrap_or_default())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        stop([&mut self.coord, &mut self.worker]);
    }
}

fn cluster(name: &str) -> Cluster {
    let work = scratch(name);
    std::fs::write(work.join("token"), "t0ken").expect("token");
    std::fs::write(work.join("secret.txt"), SECRET).expect("secret");
    let (coord, url, log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--token-file", "token", "--state", "state"], &work);
    // The worker runs in `work` too: the same host, as in a one-machine cluster.
    let worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--slots", "2", "--token-file", "token"])
        .current_dir(&work)
        .stderr(std::fs::File::create(work.join("worker.log")).expect("worker.log"))
        .spawn()
        .expect("worker");
    Cluster { coord, worker, url, work, log }
}

fn assert_refused(what: &str, (code, out): &(i32, String), fragment: &str) {
    assert_eq!(*code, 2, "{what}: {out}");
    assert!(out.contains(fragment), "{what}: wanted {fragment:?} in:\n{out}");
    assert!(!out.contains(SECRET), "{what}: the secret leaked:\n{out}");
}

#[test]
fn submitted_paths_never_reach_the_coordinators_files() {
    let c = cluster("hostile-paths");
    let secret = c.work.join("secret.txt");
    let abs = secret.to_string_lossy().into_owned();
    let task = |key: &str, value: &str| format!("jobs:\n- name: j\n  plan:\n  - task: t\n    {key}: {value}\n");
    let agent = |key: &str, value: &str| {
        format!("agents:\n- name: a\n  source: {{model: ollama/llama3}}\n  {key}: {value}\njobs:\n- name: j\n  plan:\n  - agent: a\n    prompt: hi\n")
    };
    let climb = "../".repeat(12) + &abs[1..];
    let cases: Vec<(&str, String, &str)> = vec![
        ("absolute run_file", task("run_file", &abs), "must be relative to the pipeline directory"),
        ("climbing run_file", task("run_file", &climb), "leads outside the submission"),
        ("climbing past the limit", task("run_file", &("../".repeat(40) + "etc/hostname")), "climbs 40 directories up"),
        ("absolute system_file", agent("system_file", &abs), "must be relative to the pipeline directory"),
        ("climbing system_file", agent("system_file", &climb), "leads outside the submission"),
        ("absolute include", format!("tasks:\n- name: t\n  file: {abs}\njobs:\n- name: j\n  plan:\n  - task: t\n"), "must be relative"),
        ("climbing include", format!("tasks:\n- name: t\n  file: {climb}\njobs:\n- name: j\n  plan:\n  - task: t\n"), "leads outside the submission"),
        ("absolute prompt_file", format!("agents:\n- name: a\n  source: {{model: ollama/llama3}}\njobs:\n- name: j\n  plan:\n  - agent: a\n    prompt_file: {abs}\n"), "must be relative"),
        ("device as run_file", task("run_file", &("../".repeat(12) + "dev/zero")), "leads outside the submission"),
        ("absolute mcp cwd", format!("mcp_servers:\n- name: m\n  command: cat\n  cwd: {}\njobs:\n- name: j\n  plan:\n  - task: t\n    run: echo\n", c.work.display()), "may not name paths of the hosts"),
        ("check_file escape", format!("resource_types:\n- name: r\n  config:\n    check_file: {climb}\nresources:\n- name: x\n  type: r\njobs:\n- name: j\n  plan:\n  - get: x\n"), "leads outside the submission"),
    ];
    for (what, pipeline, fragment) in cases {
        let r = submit_raw(&c.url, "t0ken", request(&pipeline, vec![]));
        assert_refused(what, &r, fragment);
        assert!(r.1.contains("\np.yml:") || r.1.starts_with("p.yml:"), "{what}: the error names the file as sent, and a position:\n{}", r.1);
        assert!(!r.1.contains("submissions/"), "{what}: the coordinator's own paths stay hidden:\n{}", r.1);
    }
    // A FIFO or a device inside the submission is refused without blocking:
    // the bundle cannot carry one, so the pipeline names a path inside the
    // submission that was sent as a regular file, and one that is missing.
    let r = submit_raw(&c.url, "t0ken", request(&task("run_file", "scripts/missing.sh"), vec![]));
    assert_refused("missing run_file", &r, "no such file relative to the pipeline directory: scripts/missing.sh");
    // Bundle paths of their own.
    for bad in ["/etc/cron.d/x", &("../".repeat(17) + "x"), "a/\0/b"] {
        let r = submit_raw(&c.url, "t0ken", request(&task("run", "echo"), vec![file(bad, "x")]));
        assert_eq!(r.0, 2, "bundle path {bad:?}: {}", r.1);
        assert!(r.1.contains("bundle path"), "{}", r.1);
    }
    let r = submit_raw(&c.url, "t0ken", SubmitRequest { pipeline: "../p.yml".into(), files: vec![file("../p.yml", &task("run", "echo"))], ..Default::default() });
    assert_refused("pipeline name", &r, "must be a file name");
    // Artifacts that point out of themselves: a step's output holding a
    // symlink to the coordinator's secret, read by load_var and across on
    // the coordinator.
    let link_out = format!("jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [out]\n    run: ln -s {abs} out/link && echo '[\"a\"]' > out/list.json\n  - load_var: v\n    file: out/link\n    inputs: [out]\n  - task: show\n    run: echo ((v))\n");
    let r = submit_raw(&c.url, "t0ken", request(&link_out, vec![]));
    assert!(r.0 != 0 && r.1.contains("leads outside the artifact"), "load_var through a symlink: {}", r.1);
    assert!(!r.1.contains(SECRET), "{}", r.1);
    let link_across = format!("jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [out]\n    run: ln -s {abs} out/cells.json\n  - task: cell\n    across:\n    - var: x\n      from_file: out/cells.json\n    run: echo {{{{ .vars.x }}}}\n");
    let r = submit_raw(&c.url, "t0ken", request(&link_across, vec![]));
    assert!(r.0 != 0 && r.1.contains("leads outside the artifact"), "across from_file through a symlink: {}", r.1);
    // Cell values read from a file name directories of a collected output:
    // one that climbs (or is absolute) would write outside the coordinator's
    // scratch directory.
    let planted = c.work.join("planted");
    let collect = format!("jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [out]\n    run: printf '[\"../../../../../../../../..{}\"]' > out/cells.json\n  - task: cell\n    outputs: [built]\n    across:\n    - var: x\n      from_file: out/cells.json\n    run: echo planted > built/file\n", planted.display());
    let r = submit_raw(&c.url, "t0ken", request(&collect, vec![]));
    assert!(r.0 != 0 && r.1.contains("cannot name a collected output directory"), "{}", r.1);
    assert!(!planted.exists(), "a cell value wrote outside the coordinator's scratch");
    // A load_var value used many times may not grow a step's text without bound.
    let big_var = format!("jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [out]\n    run: head -c 1000000 /dev/zero | tr '\\\\0' x > out/v\n  - load_var: v\n    file: out/v\n    inputs: [out]\n  - task: use\n    run: echo {}\n", "((v))".repeat(20));
    let r = submit_raw(&c.url, "t0ken", request(&big_var, vec![]));
    assert!(r.0 != 0 && r.1.contains("substituting ((vars)) would make"), "{}", r.1);
    // Still serving, and a submission's files do not outlive it.
    let r = submit_raw(&c.url, "t0ken", request(&task("run", "echo fine"), vec![]));
    assert_eq!(r.0, 0, "{}", r.1);
    let left = std::fs::read_dir(c.work.join("state/submissions")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "submission files left on the coordinator");
}

#[test]
fn hostile_documents_fail_their_submission_and_the_coordinator_stays_up() {
    let c = cluster("hostile-docs");
    let deep_block = {
        let mut d = String::from("jobs:\n- name: j\n  plan:\n");
        for i in 0..2_000 {
            d.push_str(&format!("{}- do:\n", "  ".repeat(i + 1)));
        }
        d
    };
    assert!(deep_block.len() > 40_000);
    let alias_bomb = {
        let mut d = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (name, prev) in ["b", "c", "d", "e", "f", "g", "h", "i"].iter().zip(["a", "b", "c", "d", "e", "f", "g", "h"]) {
            d.push_str(&format!("{name}: &{name} [{}]\n", vec![format!("*{prev}"); 9].join(",")));
        }
        d + "jobs: []\n"
    };
    assert!(alias_bomb.len() < 400, "{}", alias_bomb.len());
    let vars_bomb = format!("jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo {}\n", "((v))".repeat(100_000));
    let cases: Vec<(&str, String, &str)> = vec![
        ("nested block lists", deep_block, "nest more than"),
        // saphyr's own limit meets flow style first; block style meets ours.
        ("nested flow lists", format!("jobs: {}", "[".repeat(100_000)), "recursion limit exceeded"),
        ("alias bomb", alias_bomb, "alias expands the document"),
        ("wide across", "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo\n    across:\n    - {var: a, values: [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100]}\n    - {var: b, values: [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100]}\n    - {var: c, values: [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56,57,58,59,60,61,62,63,64,65,66,67,68,69,70,71,72,73,74,75,76,77,78,79,80,81,82,83,84,85,86,87,88,89,90,91,92,93,94,95,96,97,98,99,100]}\n".into(), "one across step runs at most"),
    ];
    for (what, pipeline, fragment) in cases {
        let r = submit_raw(&c.url, "t0ken", request(&pipeline, vec![]));
        assert_refused(what, &r, fragment);
        assert!(r.1.starts_with("p.yml:"), "{what}: positioned:\n{}", r.1);
    }
    // What the coordinator itself evaluates (templates of resource stages and
    // across cells, expr: resource types) ends in an error, never in a crash
    // or a stuck coordinator, and reads none of its environment.
    let expr_type = |check: &str| format!("resource_types:\n- name: t\n  env: [HOME]\n  config:\n    expr:\n      check: {check:?}\nresources:\n- name: r\n  type: t\njobs:\n- name: j\n  plan:\n  - get: r\n");
    let template_type = |check: &str| format!("resource_types:\n- name: t\n  config:\n    check: {check:?}\nresources:\n- name: r\n  type: t\n  source: {{a: b}}\njobs:\n- name: j\n  plan:\n  - get: r\n");
    let evaluated: Vec<(&str, String, &str)> = vec![
        ("deep expr", expr_type(&format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000))), "nests too deeply"),
        ("doubling expr", expr_type(&format!("let a = 1..1000000; {}[{{v: string(len(a))}}]", "let a = a + a; ".repeat(30))), "too much work"),
        ("env in a submitted expr", expr_type("[{v: env('HOME')}]"), "not the pipeline's to read"),
        ("recursive template", template_type(r#"{{define "a"}}x{{template "a"}}{{end}}{{template "a"}}{{ .source.a }}"#), "is not supported here"),
        ("deep template", template_type(&format!("{}{{{{ .source.a }}}}{}", "{{if true}}".repeat(100), "{{end}}".repeat(100))), "nest more than"),
    ];
    for (what, pipeline, fragment) in evaluated {
        let r = submit_raw(&c.url, "t0ken", request(&pipeline, vec![]));
        assert_eq!(r.0, 2, "{what}: {}\n{}", r.1, c.log());
        assert!(r.1.contains(fragment), "{what}: wanted {fragment:?} in:\n{}", r.1);
    }
    let mut req = request(&vars_bomb, vec![]);
    req.vars.insert("v".into(), "x".repeat(4096));
    let r = submit_raw(&c.url, "t0ken", req);
    assert_refused("((vars)) bomb", &r, "substituting ((vars)) would make");
    // As deep as the loader allows is fine: the plan walker has the stack for it.
    let mut deep = String::from("{task: leaf, run: echo deep}");
    for _ in 0..(steppe_language::yaml::MAX_DEPTH - 8) {
        deep = format!("{{try: {deep}}}");
    }
    let r = submit_raw(&c.url, "t0ken", request(&format!("jobs:\n- name: j\n  plan:\n  - {deep}\n"), vec![]));
    assert_eq!(r.0, 0, "{}\n{}", r.1, c.log());
    assert!(r.1.contains("[leaf] deep"), "{}", r.1);
    let rss = peak_rss_mib(c.coord.id());
    // About 100 MiB here: an expression pays for what it holds before making it.
    assert!(rss > 0 && rss < 200, "the coordinator peaked at {rss} MiB");
    // Two identical submissions at once: their own ids, directories and runs.
    let (url, url2) = (c.url.clone(), c.url.clone());
    let ok = "jobs:\n- name: j\n  plan:\n  - task: t\n    run: sleep 1; echo twin\n";
    let a = std::thread::spawn(move || submit_raw(&url, "t0ken", request(ok, vec![])));
    let b = std::thread::spawn(move || submit_raw(&url2, "t0ken", request(ok, vec![])));
    for r in [a.join().expect("a"), b.join().expect("b")] {
        assert_eq!(r.0, 0, "{}\n{}", r.1, c.log());
        assert!(r.1.contains("[t] twin"), "{}", r.1);
    }
}

/// `steppe submit` and `steppe run` agree: what one refuses the other does.
#[test]
fn run_and_submit_refuse_the_same_paths() {
    let work = scratch("agree");
    let abs = work.join("x.sh");
    std::fs::write(&abs, "echo x\n").expect("write");
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: t\n    run_file: {}\n", abs.display())).expect("write");
    let run = steppe(&["run", "p.yml"], &work);
    let submit = steppe(&["submit", "p.yml", "--coordinator", "http://127.0.0.1:9"], &work);
    for (what, out) in [("run", &run), ("submit", &submit)] {
        assert_eq!(out.status.code(), Some(2), "{what}: {}", text(out));
        assert!(text(out).contains("p.yml:5:5: jobs[0].plan[0].run_file: ") && text(out).contains("must be relative to the pipeline directory"), "{what}: {}", text(out));
    }
    let dir = Path::new(&work);
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir");
    std::fs::write(dir.join("sub/p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run_file: ../x.sh\n").expect("write");
    let run = steppe(&["run", "sub/p.yml"], &work);
    assert_eq!(run.status.code(), Some(0), "a climb to a sibling is allowed (and sent along): {}", text(&run));
}

/// A stored artifact changed behind the store's back is an error when a
/// step would use it, never silently used; an output holding a FIFO is
/// refused when stored, without waiting on it.
#[test]
fn tampered_artifacts_and_special_files_are_refused() {
    let work = scratch("tamper");
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [out]\n    run: echo original > out/f\n  - task: tamper\n    run: for d in ((store))/*/; do if [ -f \"$d/f\" ]; then echo evil > \"$d/f\"; fi; done\n  - task: use\n    inputs: [out]\n    run: cat out/f\n",
    )
    .expect("write");
    let store = format!("store={}", work.join(".steppe/artifacts").display());
    let out = steppe(&["run", "p.yml", "--var", &store], &work);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("does not match its digest"), "{t}");
    assert!(!t.contains("[use] evil") && !t.contains("[use] original"), "the step never ran on the changed input: {t}");
    std::fs::write(work.join("fifo.yml"), "jobs:\n- name: j\n  plan:\n  - task: pipe\n    outputs: [out]\n    run: mkfifo out/p && echo made\n").expect("write");
    let out = child_of_this_test("timeout").args(["60", env!("CARGO_BIN_EXE_steppe"), "run", "fifo.yml"]).current_dir(&work).output().expect("run");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("capturing output \"out\"") && t.contains("cannot be stored"), "{t}");
}

/// Names a pipeline chose reach the terminal with their control characters
/// shown, never obeyed: no escape sequence of theirs can rewrite a screen.
#[test]
fn control_characters_in_names_are_shown_escaped() {
    let work = scratch("controls");
    std::fs::write(work.join("c.yml"), "jobs:\n- name: \"j\\e[2J\"\n  plan:\n  - task: \"t\\e]0;owned\\a\"\n    run: echo hi\n").expect("write");
    for args in [&["run", "c.yml"][..], &["test", "c.yml"], &["runs", "c.yml"], &["runs", "c.yml", "--steps", "--logs"]] {
        let out = steppe(args, &work);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert!(!out.stdout.contains(&0x1b) && !out.stdout.contains(&0x07), "{args:?} let a control character through: {:?}", text(&out));
        assert!(text(&out).contains("\\x1b"), "{args:?}: {}", text(&out));
    }
}

/// `steppe runs --logs | head -1`: the rest of the output goes nowhere, quietly.
#[test]
fn a_closed_stdout_ends_quietly() {
    use std::io::{BufRead, BufReader};
    let work = scratch("closed-stdout");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: t\n    run: seq 1 20000\n").expect("write");
    assert_eq!(steppe(&["run", "p.yml", "--quiet"], &work).status.code(), Some(0));
    for args in [&["runs", "p.yml", "--logs"][..], &["run", "p.yml"]] {
        let mut child = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(args).current_dir(&work).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("a line");
        // The reader went away after one line, as `head -1` does.
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// Step directories and temporaries go when a run ends; a run killed before
/// it could clean up has its directory swept by the next one.
#[test]
fn scratch_directories_go_when_runs_end_or_die() {
    let work = scratch("tmpdirs");
    let tmp = work.join("tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir");
    std::fs::write(work.join("p.yml"), "jobs:\n- name: j\n  plan:\n  - task: a\n    outputs: [o]\n    run: echo x > o/f\n  - load_var: v\n    file: o/f\n    inputs: [o]\n  - task: b\n    inputs: [o]\n    run: sleep ((nap)); cat o/f\n").expect("write");
    // The pools of spare step directories and spare scratch directories may
    // stay: shelves holding only empty ones, scratches holding only an
    // empty `steps`.
    let leftovers = || {
        let entries = std::fs::read_dir(&tmp).expect("tmp").filter_map(|e| e.ok());
        let mut left = Vec::new();
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("steppe-spares.") {
                for shelf in std::fs::read_dir(e.path()).expect("the pool").filter_map(|s| s.ok()) {
                    for spare in std::fs::read_dir(shelf.path()).expect("a shelf").filter_map(|s| s.ok()) {
                        assert_eq!(std::fs::read_dir(spare.path()).map(|d| d.count()).ok(), Some(0), "a spare step directory holds something: {}", spare.path().display());
                    }
                }
            } else if name.starts_with("steppe-scratch-spares.") {
                for spare in std::fs::read_dir(e.path()).expect("the spares").filter_map(|s| s.ok()) {
                    let held: Vec<_> = std::fs::read_dir(spare.path()).expect("a spare").filter_map(|s| s.ok()).map(|s| s.file_name()).collect();
                    assert!(held.iter().all(|n| n == "steps"), "a spare scratch holds {held:?}: {}", spare.path().display());
                    assert_eq!(std::fs::read_dir(spare.path().join("steps")).map(|d| d.count()).unwrap_or(0), 0, "a spare scratch's steps hold something: {}", spare.path().display());
                }
            } else if name.starts_with("steppe-") {
                left.push(name);
            }
        }
        left
    };
    let run = |nap: &str| {
        let mut c = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
        c.args(["run", "p.yml", "--var", &format!("nap={nap}")]).current_dir(&work).env("TMPDIR", &tmp).stdout(std::process::Stdio::null());
        c
    };
    assert!(run("0").status().expect("run").success());
    assert!(leftovers().is_empty(), "left behind: {:?}", leftovers());
    let mut killed = run("30").spawn().expect("spawn");
    let t0 = std::time::Instant::now();
    while !std::fs::read_dir(&tmp).expect("tmp").filter_map(|e| e.ok()).any(|e| std::fs::read_dir(e.path().join("steps")).is_ok_and(|mut d| d.next().is_some())) {
        assert!(t0.elapsed() < Duration::from_secs(20), "the step never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    killed.kill().expect("kill");
    killed.wait().expect("wait");
    assert_eq!(leftovers().len(), 1, "SIGKILL leaves its scratch: {:?}", leftovers());
    assert!(run("0").status().expect("run").success());
    assert!(leftovers().is_empty(), "the next run swept the dead one's scratch: {:?}", leftovers());
}

/// A redis-server on `port` with a password, no persistence: a restart comes back empty.
fn redis_on(port: u16, password: &str) -> std::process::Child {
    let child = child_of_this_test("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--requirepass", password])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// Redis killed and restarted empty under a coordinator and its workers: the
/// coordinator says so once (not ten times a second), puts back the step
/// that waited in the lost queue, keeps the history written meanwhile, and
/// serves the next submission; the Redis password shows in no command
/// line, reply or log.
#[test]
fn a_redis_restart_is_survived_and_its_password_never_shown() {
    redis_restart(false);
}

/// The same with a worker that takes from the Redis queue itself: it finds
/// the lost queue first, and the coordinator still learns of it.
#[test]
fn a_redis_restart_under_a_pulling_worker_is_survived() {
    redis_restart(true);
}

fn redis_restart(pulling: bool) {
    let work = scratch(if pulling { "redis-restart-pull" } else { "redis-restart" });
    let password = "s3cret-redis-pw";
    std::fs::write(work.join("token"), "t0ken").expect("token");
    std::fs::write(work.join("redis-password"), format!("{password}\n")).expect("password");
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let mut redis = redis_on(port, password);
    let url = format!("redis://127.0.0.1:{port}/");
    let (mut coord, curl, log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--token-file", "token", "--state", "state", "--queue", &url, "--store", &url, "--redis-password-file", "redis-password"], &work);
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", coord.id())).expect("cmdline");
    assert!(!String::from_utf8_lossy(&cmdline).contains(password), "the password is on the command line");
    // One slot: of two parallel steps one waits in the queue.
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &curl, "--slots", "1", "--token-file", "token"])
        .args(if pulling { vec!["--queue", url.as_str(), "--redis-password-file", "redis-password"] } else { vec![] })
        .current_dir(&work)
        .stderr(std::fs::File::create(work.join("worker.log")).expect("log"))
        .spawn()
        .expect("worker");
    std::fs::write(work.join("two.yml"), "jobs:\n- name: two\n  plan:\n  - in_parallel:\n    - task: first\n      run: touch ((dir))/first-started; sleep 4; echo first done\n    - task: second\n      run: touch ((dir))/second-started; sleep 4; echo second done\n").expect("write");
    let dir = format!("dir={}", work.display());
    let submit = {
        let (curl, work, dir) = (curl.clone(), work.clone(), dir.clone());
        std::thread::spawn(move || steppe(&["submit", "two.yml", "--coordinator", &curl, "--token-file", "token", "--var", &dir], &work))
    };
    let t0 = std::time::Instant::now();
    while !work.join("first-started").exists() && !work.join("second-started").exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no step started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Redis dies with one step running and one waiting in it, and comes back empty.
    redis.kill().expect("kill redis");
    redis.wait().expect("reap");
    let errors_before = log.lock().map(|l| l.lines().count()).unwrap_or(0);
    std::thread::sleep(Duration::from_secs(3));
    let during = log.lock().map(|l| l.lines().skip(errors_before).collect::<Vec<_>>().join("\n")).unwrap_or_default();
    assert!(during.lines().count() <= 6, "an outage of 3 s said more than once per loop:\n{during}");
    let while_down = steppe(&["runs", "--coordinator", &curl, "--token-file", "token"], &work);
    assert!(!text(&while_down).contains(password), "{}", text(&while_down));
    let mut redis = redis_on(port, password);
    let out = submit.join().expect("submit");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "the run survived the restart:\n{t}\ncoordinator:\n{}", log.lock().map(|l| l.clone()).unwrap_or_default());
    assert!(t.contains("[first] first done") && t.contains("[second] second done"), "{t}");
    // The next submission is served, and the history written meanwhile is there.
    std::fs::write(work.join("after.yml"), "jobs:\n- name: after\n  plan:\n  - task: t\n    run: echo after\n").expect("write");
    let out = steppe(&["submit", "after.yml", "--coordinator", &curl, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let runs = text(&steppe(&["runs", "--coordinator", &curl, "--token-file", "token"], &work));
    assert!(runs.contains(" two ") && runs.contains(" after "), "{runs}");
    // Every client connection dropped at once (Redis alive): the next submission is served.
    let killed = std::process::Command::new("redis-cli").args(["-p", &port.to_string(), "--no-auth-warning", "-a", password, "CLIENT", "KILL", "TYPE", "normal"]).output().expect("redis-cli");
    assert!(killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    let out = steppe(&["submit", "after.yml", "--coordinator", &curl, "--token-file", "token"], &work);
    assert_eq!(out.status.code(), Some(0), "after the connections dropped: {}", text(&out));
    let all = log.lock().map(|l| l.clone()).unwrap_or_default() + &std::fs::read_to_string(work.join("worker.log")).unwrap_or_default();
    assert!(all.contains("came back empty"), "{all}");
    assert!(!all.contains(password), "the password reached a log:\n{all}");
    stop([&mut coord, &mut worker, &mut redis]);
}

/// Live (not zombie) processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat.rsplit(") ").next().is_some_and(|r| r.starts_with('Z'));
        if cmd.contains(marker) && !zombie {
            found.push(format!("{name}: {cmd}"));
        }
    }
    found
}

fn gone_within(marker: &str, limit: Duration) -> Result<(), Vec<String>> {
    let t0 = std::time::Instant::now();
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_for_file(p: &Path) {
    let t0 = std::time::Instant::now();
    while !p.exists() {
        assert!(t0.elapsed() < Duration::from_secs(30), "{} never appeared", p.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A step's background processes, its grandchildren included, die with it
/// however it ends: finished, timed out, cancelled through the coordinator,
/// its worker interrupted, or its coordinator gone. The worker outlives the
/// coordinator's restart and serves the new one.
#[test]
fn steps_die_whole_and_workers_outlive_a_coordinator_restart() {
    let work = scratch("trees");
    let tree = |marker: &str, flag: &str| format!("sleep {marker} & (sleep {marker} &); sh -c 'sleep {marker}' & touch {}; wait", work.join(flag).display());
    // Embedded: what a finished step left in the background, and a timeout.
    std::fs::write(work.join("bg.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: leaves\n    run: sleep 314.71 & (sleep 314.71 &); echo done\n  - task: slow\n    timeout: 1s\n    run: \"{}\"\n", tree("314.72", "slow-started"))).expect("write");
    let out = steppe(&["run", "bg.yml"], &work);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("timed out after 1s"), "{}", text(&out));
    gone_within("314.71", Duration::from_secs(5)).expect("what a finished step left running");
    gone_within("314.72", Duration::from_secs(5)).expect("a timed-out step's tree");
    // A coordinator on a port it keeps across restarts, and one worker.
    let (mut redis, redis_url) = redis_server();
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port");
    let listen = format!("127.0.0.1:{port}");
    let start = || {
        let (c, url, mut lines) = serving(&["coordinator", "--listen", &listen, "--state", "state", "--queue", &redis_url, "--store", &redis_url], &work);
        std::thread::spawn(move || for _ in lines.by_ref() {});
        (c, url)
    };
    let (mut coord, url) = start();
    let mut worker = child_of_this_test(env!("CARGO_BIN_EXE_steppe"))
        .args(["worker", "--coordinator", &url, "--slots", "2", "--reconnect-for", "60s"])
        .stderr(std::fs::File::create(work.join("worker.log")).expect("log"))
        .spawn()
        .expect("worker");
    let detach = |name: &str, marker: &str, flag: &str| {
        std::fs::write(work.join(name), format!("jobs:\n- name: j\n  plan:\n  - task: tree\n    run: \"{}\"\n", tree(marker, flag))).expect("write");
        let out = steppe(&["submit", name, "--detach", "--coordinator", &url], &work);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    // Cancelled through the coordinator.
    let id = detach("cancel.yml", "314.73", "cancel-started");
    wait_for_file(&work.join("cancel-started"));
    assert!(!processes_with("314.73").is_empty());
    let out = steppe(&["cancel", &id, "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    gone_within("314.73", Duration::from_secs(5)).expect("a cancelled step's tree");
    // The coordinator dies mid-step: the worker stops the step (it would run
    // again elsewhere) and waits for the coordinator to come back.
    detach("lost.yml", "314.74", "lost-started");
    wait_for_file(&work.join("lost-started"));
    coord.kill().expect("kill coordinator");
    coord.wait().expect("reap");
    gone_within("314.74", Duration::from_secs(5)).expect("the tree of a step whose coordinator died");
    let (mut coord, url2) = start();
    assert_eq!(url, url2);
    std::fs::write(work.join("again.yml"), "jobs:\n- name: again\n  plan:\n  - task: t\n    run: echo served by the same worker\n").expect("write");
    let out = child_of_this_test("timeout").args(["60", env!("CARGO_BIN_EXE_steppe"), "submit", "again.yml", "--coordinator", &url]).current_dir(&work).output().expect("submit");
    let log = std::fs::read_to_string(work.join("worker.log")).unwrap_or_default();
    assert_eq!(out.status.code(), Some(0), "{}\nworker:\n{log}", text(&out));
    assert!(text(&out).contains("[t] served by the same worker"), "{}", text(&out));
    // The worker's log goes out in batches (5 ms apart): its line may
    // follow the step it served.
    let log_now = || std::fs::read_to_string(work.join("worker.log")).unwrap_or_default();
    wait_for("the worker's log of its reconnection", Duration::from_secs(5), || log_now().contains("reconnected"));
    let log = log_now();
    assert!(log.contains("reconnecting for up to 1m0s"), "{log}");
    assert!(worker.try_wait().expect("try_wait").is_none(), "the worker lived through the restart");
    // Ctrl-C on the worker stops it at once, its step's tree with it.
    detach("int.yml", "314.75", "int-started");
    wait_for_file(&work.join("int-started"));
    assert!(std::process::Command::new("kill").args(["-INT", &worker.id().to_string()]).status().expect("kill").success());
    let status = worker.wait().expect("worker exits");
    assert_eq!(status.code(), Some(0), "{}", std::fs::read_to_string(work.join("worker.log")).unwrap_or_default());
    gone_within("314.75", Duration::from_secs(5)).expect("the tree of an interrupted worker's step");
    stop([&mut coord, &mut redis]);
}

/// Runs `cmd` to its end, its output drained, and reports the peak
/// resident memory of the process (MiB) with its output.
fn run_measured(mut cmd: std::process::Command) -> (i32, String, u64) {
    use std::io::Read;
    let mut child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().expect("spawn");
    let pid = child.id();
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    // Keep the first and last bits of what it printed, not all of it.
    let reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0usize;
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            if kept.len() < 1 << 20 {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        (String::from_utf8_lossy(&kept).into_owned(), total)
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut peak = 0;
    loop {
        peak = peak.max(peak_rss_mib(pid));
        if child.try_wait().expect("try_wait").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let code = child.wait().expect("wait").code().unwrap_or(-1);
    let (out, _) = reader.join().expect("reader");
    (code, out + &err_reader.join().expect("stderr reader"), peak)
}

/// A step that floods its output: memory stays bounded embedded and through
/// a cluster, the store keeps its head and tail (the same both ways), and
/// `--full` prints every line, from the coordinator too.
#[test]
fn a_flood_of_output_is_kept_bounded_and_whole() {
    let work = scratch("flood");
    let lines = 2_000_000;
    std::fs::write(work.join("flood.yml"), format!("jobs:\n- name: j\n  plan:\n  - task: flood\n    run: seq 1 {lines}\n  - task: after\n    run: echo after\n  - task: err\n    run: echo to stderr >&2\n")).expect("write");
    let mut cmd = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
    cmd.args(["run", "flood.yml"]).current_dir(&work);
    let (code, out, peak) = run_measured(cmd);
    assert_eq!(code, 0, "{}", out.chars().take(2000).collect::<String>());
    assert!(peak < 300, "embedded: {peak} MiB for {lines} lines");
    let logs = |extra: &[&str]| text(&steppe(&[&["runs", "flood.yml", "--logs"][..], extra].concat(), &work));
    let record = logs(&[]);
    assert!(record.starts_with("run ") && record.contains("[flood] 1\n") && record.contains("[flood] 500\n") && !record.contains("[flood] 501\n"), "the head: {}", record.chars().take(500).collect::<String>());
    assert!(record.contains(&format!("[flood] {lines}\n")), "the tail");
    assert!(record.contains("line(s),") && record.contains("not kept here; `steppe runs --logs --full` shows them"), "the gap is said");
    assert!(record.lines().count() < 1_100, "the store keeps a head and a tail: {} lines", record.lines().count());
    let full = logs(&["--full", "--step", "flood"]);
    assert_eq!(full.lines().filter(|l| l.starts_with("[flood] ")).count(), lines, "every line");
    assert!(full.contains("[flood] 1234567\n"));
    assert!(record.contains("[err] (stderr) to stderr\n"), "stderr is marked");
    // The same through a coordinator and a worker on another "host" (streamed artifacts).
    let (mut coord, url, mut clines) = serving(&["coordinator", "--listen", "127.0.0.1:0", "--state", "state"], &work);
    std::thread::spawn(move || for _ in clines.by_ref() {});
    let mut worker = spawn_worker(&url, &["--slots", "2", "--stream-artifacts"]);
    let mut cmd = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
    cmd.args(["submit", "flood.yml", "--coordinator", &url]).current_dir(&work);
    let (code, out, _) = run_measured(cmd);
    assert_eq!(code, 0, "{}", out.chars().take(2000).collect::<String>());
    let coordinator_peak = peak_rss_mib(coord.id());
    let worker_peak = peak_rss_mib(worker.id());
    assert!(coordinator_peak < 300 && worker_peak < 300, "coordinator {coordinator_peak} MiB, worker {worker_peak} MiB");
    let remote = |extra: &[&str]| text(&steppe(&[&["runs", "--coordinator", &url, "--logs"][..], extra].concat(), &work));
    let strip = |t: &str| t.lines().skip(1).collect::<Vec<_>>().join("\n");
    let (through, here) = (strip(&remote(&[])), strip(&record));
    let differ = through.lines().zip(here.lines()).find(|(a, b)| a != b);
    assert!(through.lines().count() == here.lines().count() && differ.is_none(), "the cluster keeps what embedded keeps; first difference: {differ:?}");
    let full = remote(&["--full", "--step", "flood"]);
    assert_eq!(full.lines().filter(|l| l.starts_with("[flood] ")).count(), lines, "every line, through the coordinator");
    stop([&mut coord, &mut worker]);
}
