//! Agent pipelines through a cluster: `steppe test --script SCENARIO
//! --coordinator URL`, the coordinator serving the scenario's scripted model
//! to two workers over a Redis queue and store.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::*;


/// A cluster with no slots of its own: every step runs on one of two workers
/// (one pulling from the Redis queue, one sent work over its session).
struct Cluster {
    children: Vec<std::process::Child>,
    url: String,
    log: Log,
}

impl Cluster {
    fn start(dir: &Path, worker_slots: &str) -> Cluster {
        let (redis, redis_url) = redis_server();
        let (coord, url, log) = serving_logged(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url, "--store", &redis_url], dir);
        let workers = [spawn_worker(&url, &["--slots", worker_slots, "--queue", &redis_url]), spawn_worker(&url, &["--slots", worker_slots])];
        let mut children = vec![redis, coord];
        children.extend(workers);
        Cluster { children, url, log }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        stop(self.children.iter_mut());
    }
}


/// Each scripted model listens on a port of its own.
fn without_ports(line: &str) -> String {
    let mut out = String::new();
    let mut parts = line.split("127.0.0.1:");
    out.push_str(parts.next().unwrap_or_default());
    for p in parts {
        out.push_str("127.0.0.1:PORT");
        out.push_str(p.trim_start_matches(|c: char| c.is_ascii_digit()));
    }
    out
}

/// What a user compares: the exit code, each step's outcome and each job's verdict.
fn summary(o: &Output) -> (Option<i32>, Vec<String>) {
    let mut lines: Vec<String> = text(o)
        .lines()
        .filter(|l| l.starts_with('✔') || l.starts_with('✘') || l.starts_with("PASS ") || l.starts_with("FAIL "))
        .map(|l| without_ports(&without_durations(l)))
        .collect();
    lines.sort();
    (o.status.code(), lines)
}

fn test_in(work: &Path, pipeline: &Path, scenario: &Path, coordinator: Option<&str>) -> Output {
    std::fs::create_dir_all(work).expect("mkdir");
    std::fs::copy(pipeline, work.join("p.yml")).expect("copy");
    std::fs::copy(scenario, work.join("s.yaml")).unwrap_or_else(|_| panic!("{} needs {}", pipeline.display(), scenario.display()));
    let mut args = vec!["test", "p.yml", "--script", "s.yaml", "--dump-requests", "requests.jsonl"];
    if let Some(url) = coordinator {
        args.extend(["--coordinator", url]);
    }
    let out = steppe(&args, work);
    let dumped = std::fs::read_to_string(work.join("requests.jsonl")).unwrap_or_default();
    assert!(dumped.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "--dump-requests writes JSON lines: {dumped}");
    out
}

/// Every agent pipeline of the suite, passing and failing, ends the same
/// through the cluster as embedded: exit code, steps, verdicts and, for the
/// failing ones, the message each expects. Submitted two at a time.
#[test]
fn every_agent_pipeline_ends_the_same_through_a_cluster() {
    let base = scratch("agent-parity");
    let cluster = Cluster::start(&base, "4");
    let mut all = agent_cases("");
    all.extend(agent_cases("failing"));
    assert!(all.len() >= 30, "{all:?}");
    let compare = |(i, (p, s)): (usize, &(PathBuf, PathBuf))| -> Option<String> {
        let embedded = test_in(&base.join(format!("{i}-embedded")), p, s, None);
        let through = test_in(&base.join(format!("{i}-cluster")), p, s, Some(&cluster.url));
        let (e, c) = (summary(&embedded), summary(&through));
        let said = text(&through);
        let body = std::fs::read_to_string(p).expect("read");
        let missing: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("# expect:")).map(str::trim).filter(|x| !said.contains(x)).collect();
        let dumped = |mode: &str| std::fs::read_to_string(base.join(format!("{i}-{mode}")).join("requests.jsonl")).unwrap_or_default().lines().count();
        (e != c || !missing.is_empty() || dumped("embedded") != dumped("cluster")).then(|| {
            format!(
                "{}:\n  embedded {e:?}\n  cluster  {c:?}\n  lacks {missing:?}; requests {} embedded, {} cluster\n{said}",
                p.display(),
                dumped("embedded"),
                dumped("cluster")
            )
        })
    };
    let numbered: Vec<(usize, &(PathBuf, PathBuf))> = all.iter().enumerate().collect();
    let differ: Vec<String> = std::thread::scope(|s| {
        let halves: Vec<_> = numbered.chunks(numbered.len().div_ceil(2)).map(|half| s.spawn(|| half.iter().copied().filter_map(compare).collect::<Vec<_>>())).collect();
        halves.into_iter().flat_map(|h| h.join().expect("a half")).collect()
    });
    assert!(differ.is_empty(), "{} of {} differ:\n{}\n--- coordinator log ---\n{}", differ.len(), all.len(), differ.join("\n\n"), cluster.log.lock().expect("log"));
}

/// The members of an ensemble, and the cells of an `across:` over an agent
/// step, run on different workers at the same time: two workers of one slot
/// each, every conversation's one shell call stamping which worker ran it
/// and when, for a second.
#[test]
fn ensemble_members_and_across_cells_run_on_different_workers_at_once() {
    let base = scratch("agent-spread");
    let cluster = Cluster::start(&base, "1");
    let stamps = base.join("stamps");
    let command = format!("echo \"$PPID $(date +%s%N) start\" >> {0}; sleep 1; echo \"$PPID $(date +%s%N) end\" >> {0}", stamps.display());
    std::fs::write(
        base.join("p.yml"),
        "agents:\n- name: a\n  source: {model: openrouter/x/y}\n  tools: [{builtin: run_shell}]\n- name: b\n  source: {model: openrouter/x/y}\n  tools: [{builtin: run_shell}]\n\
         jobs:\n- name: vote\n  plan:\n  - ensemble:\n      verdicts: [approve, reject]\n      decide: unanimous\n      agents:\n      - {agent: a, messages: [Look.]}\n      - {agent: b, messages: [Look.]}\n\
         - name: cells\n  plan:\n  - agent: a\n    across:\n    - var: n\n      values: [\"1\", \"2\"]\n    max_in_flight: 2\n    messages: [\"Cell {{ .vars.n }}.\"]\n",
    )
    .expect("write");
    std::fs::write(
        base.join("s.yaml"),
        [
            "model:",
            "  rules:",
            "    - when: {called: verdict}",
            "      say: Voted.",
            "    - when: {all: [{called: run_shell}, {user_contains: Cell}]}",
            "      say: Done.",
            "    - when: {called: run_shell}",
            "      call: verdict",
            "      args: {choice: approve}",
            "    - call: run_shell",
            &format!("      args: {{command: {}}}", serde_json::to_string(&command).expect("json")),
        ]
        .join("\n"),
    )
    .expect("write");
    for job in ["vote", "cells"] {
        let _ = std::fs::remove_file(&stamps);
        let out = steppe(&["run", "p.yml", "--job", job, "--script", "s.yaml", "--coordinator", &cluster.url], &base);
        assert_eq!(out.status.code(), Some(0), "{job}: {}", text(&out));
        let stamped = std::fs::read_to_string(&stamps).expect("stamps");
        let rows: Vec<(String, u128, String)> = stamped
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].to_string(), f[1].parse().expect("nanoseconds"), f[2].to_string())
            })
            .collect();
        let workers: std::collections::BTreeSet<&String> = rows.iter().map(|r| &r.0).collect();
        assert_eq!(workers.len(), 2, "{job}: two workers ran the conversations' shells: {stamped}");
        let at = |w: &String, what: &str| rows.iter().find(|r| &r.0 == w && r.2 == what).map(|r| r.1).expect("stamp");
        let [w1, w2] = [workers.iter().next().copied(), workers.iter().nth(1).copied()].map(|w| w.expect("worker"));
        assert!(at(w1, "start") < at(w2, "end") && at(w2, "start") < at(w1, "end"), "{job}: the two ran at the same time: {stamped}");
    }
}

/// `--answer` presets reach a question asked on a worker; unanswered, the
/// step is aborted there as it is embedded. (`answered_by:` and `fix:` are
/// among the parity pipelines.)
#[test]
fn ask_user_presets_through_the_cluster() {
    let base = scratch("agent-ask");
    let cluster = Cluster::start(&base, "2");
    std::fs::write(
        base.join("p.yml"),
        "agents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [{builtin: ask_user}]\njobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Ask.]\n    assert:\n      stdout: patch\n",
    )
    .expect("write");
    std::fs::write(
        base.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"source\":\"preset\"'}\n      say: The bump is patch.\n    - call: ask_user\n      args: {question: Which BUMP is this?}\n",
    )
    .expect("write");
    let out = steppe(&["test", "p.yml", "--script", "s.yaml", "--answer", "bump=patch", "--coordinator", &cluster.url], &base);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("answer: patch"), "{}", text(&out));
    let out = steppe(&["test", "p.yml", "--script", "s.yaml", "--coordinator", &cluster.url], &base);
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    assert!(text(&out).contains("nobody answered") && text(&out).contains("--answer"), "{}", text(&out));
}

/// Through a cluster a parked question goes worker → coordinator → whoever
/// answers with `steppe questions answer --coordinator`, and the answer back
/// to the worker holding the conversation.
#[test]
fn a_parked_question_is_answered_through_the_coordinator() {
    let base = scratch("agent-ask-parked");
    let cluster = Cluster::start(&base, "2");
    std::fs::write(
        base.join("p.yml"),
        "agents:\n- name: w\n  source: {model: openrouter/x/y}\n  tools: [{builtin: ask_user, timeout: 2m}]\njobs:\n- name: j\n  plan:\n  - agent: w\n    messages: [Ask.]\n    assert:\n      stdout: minor\n",
    )
    .expect("write");
    std::fs::write(
        base.join("s.yaml"),
        "model:\n  rules:\n    - when: {tool_result_contains: '\"answer\":\"minor\"'}\n      say: minor\n    - call: ask_user\n      args: {question: Which bump?}\n",
    )
    .expect("write");
    let (mut run, log) = spawn_logged(&["run", "p.yml", "--script", "s.yaml", "--coordinator", &cluster.url], &base);
    wait_in_log(&log, "steppe questions answer 1 <answer> --coordinator URL", std::time::Duration::from_secs(60));
    let listed = steppe(&["questions", "--coordinator", &cluster.url], &base);
    assert!(listed.status.success() && text(&listed).contains("Which bump?") && text(&listed).contains(" p "), "{}", text(&listed));
    let answered = steppe(&["questions", "answer", "1", "minor", "--coordinator", &cluster.url], &base);
    assert!(answered.status.success() && text(&answered).contains("answered: question 1"), "{}", text(&answered));
    let status = run.wait().expect("the run");
    let t = log.lock().map(|l| l.clone()).unwrap_or_default();
    assert_eq!(status.code(), Some(0), "{t}\ncoordinator:\n{}", cluster.log.lock().map(|l| l.clone()).unwrap_or_default());
    assert!(t.contains("answer: minor"), "{t}");
    let again = steppe(&["questions", "answer", "1", "major", "--coordinator", &cluster.url], &base);
    assert!(!again.status.success() && text(&again).contains("already answered"), "{}", text(&again));
}

/// A job budget is one counter for every worker: four ensemble members on
/// two workers, each turn 500 tokens, against a 3,000-token job budget.
/// Alone, each member would spend up to the whole budget (12,000 together);
/// sharing the counter, they stop within the turns in flight when it ran out.
#[test]
fn an_ensemble_on_two_workers_holds_a_tight_job_budget() {
    let base = scratch("agent-budget");
    let cluster = Cluster::start(&base, "2");
    let members: String = ["a", "b", "c", "d"].iter().map(|m| format!("      - {{agent: {m}, messages: [Look around.]}}\n")).collect();
    let agents: String = ["a", "b", "c", "d"].iter().map(|m| format!("- name: {m}\n  source: {{model: openrouter/x/y}}\n")).collect();
    std::fs::write(
        base.join("p.yml"),
        format!("agents:\n{agents}jobs:\n- name: j\n  budget: {{tokens: 3000}}\n  plan:\n  - ensemble:\n      verdicts: [approve, reject]\n      decide: any\n      agents:\n{members}"),
    )
    .expect("write");
    // Turns are handed out in order to whoever asks: each a different read.
    let turns: String = (0..60).map(|i| format!("    - calls: [{{name: read_file, args: {{path: f{i}.txt}}}}]\n      usage: 500\n      delay: 100ms\n")).collect();
    std::fs::write(base.join("s.yaml"), format!("model:\n  turns:\n{turns}")).expect("write");
    let out = steppe(&["run", "p.yml", "--script", "s.yaml", "--coordinator", &cluster.url], &base);
    let said = text(&out);
    assert_ne!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("job budget exceeded: cap 3000 tokens"), "{said}");
    let spent: u64 = said
        .lines()
        .find_map(|l| l.strip_prefix("usage: ").and_then(|r| r.split(" tokens").next()))
        .map(|n| n.replace(',', "").parse().expect("a number"))
        .unwrap_or_else(|| panic!("no usage line: {said}"));
    // At most one turn in flight per member when it ran out.
    assert!((3000..=3000 + 4 * 500).contains(&spent), "spent {spent} against a 3,000 budget:\n{said}");
}

/// A scenario's `files` travel with the submission whether or not the
/// pipeline names them: a resource check reading one finds it on the worker.
#[test]
fn scenario_files_travel_with_the_submission() {
    let base = scratch("agent-scenario-files");
    let cluster = Cluster::start(&base, "1");
    std::fs::write(
        base.join("p.yml"),
        "resource_types:\n- name: release\n  config:\n    check: cat data/releases.json\n    in: echo {{ .version.v | shellquote }} > v\nresources:\n- name: rel\n  type: release\n  source: {}\n\
         agents:\n- name: a\n  source: {model: openrouter/x/y}\njobs:\n- name: j\n  plan:\n  - get: rel\n  - task: show\n    inputs: [rel]\n    run: cat rel/v\n    assert:\n      stdout: \"7.1\"\n  - agent: a\n    messages: [Done?]\n",
    )
    .expect("write");
    std::fs::write(base.join("s.yaml"), "files:\n  data/releases.json: '[{\"v\": \"7.1\"}]'\nmodel:\n  turns:\n    - say: done\n").expect("write");
    let out = steppe(&["test", "p.yml", "--script", "s.yaml", "--coordinator", &cluster.url], &base);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("[show] 7.1") && text(&out).contains("1 included file(s)"), "{}", text(&out));
}
