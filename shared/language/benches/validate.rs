//! Validating a generated 10,000-step pipeline.
//!
//! Reports the full load (parse + decode + every rule) beside a baseline
//! measured in the same run: parsing the same text into the YAML tree only.
//! Run: `cargo bench -p steppe-language --bench validate`.

use std::path::Path;
use std::time::{Duration, Instant};

use steppe_language::{load_str, yaml, LoadOptions};

/// 10 jobs × 1,000 steps: chained tasks with inputs/outputs, agent steps,
/// in_parallel blocks and hooks, so every rule family has work to do.
fn generate(steps_per_job: usize, jobs: usize) -> String {
    let mut y = String::from(
        "agents:\n- name: reviewer\n  source: {model: openrouter/qwen/qwen3-flash}\n  tools: [read_file, write_file]\n\
resource_types:\n- name: stamp\n  config:\n    check: |\n      echo '[{\"v\": \"1\"}]'\n    in: echo fetched > v\n    out: echo '{}'\n\
resources:\n- name: src\n  type: stamp\n  source: {uri: example}\njobs:\n",
    );
    for j in 0..jobs {
        y.push_str(&format!("- name: job-{j}\n  plan:\n  - get: src\n"));
        let mut prev = "src".to_string();
        let mut i = 0;
        while i < steps_per_job {
            match i % 10 {
                3 => {
                    y.push_str(&format!(
                        "  - agent: reviewer\n    inputs: [{prev}]\n    outputs: [review-{i}]\n    messages: [\"Review {prev}.\"]\n    assert:\n      files: [review-{i}/notes.md]\n"
                    ));
                    prev = format!("review-{i}");
                }
                7 => {
                    y.push_str(&format!(
                        "  - in_parallel:\n      limit: 2\n      steps:\n      - task: left-{i}\n        run: echo left\n        inputs: [{prev}]\n        outputs: [left-{i}]\n      - task: right-{i}\n        run: echo right\n        inputs: [{prev}]\n        outputs: [right-{i}]\n"
                    ));
                    prev = format!("left-{i}");
                    i += 1;
                }
                _ => {
                    y.push_str(&format!(
                        "  - task: step-{i}\n    run: echo {i} > out-{i}/f\n    inputs: [{prev}]\n    outputs: [out-{i}]\n    attempts: 2\n    timeout: 5m\n    on_failure:\n      task: report-{i}\n      run: echo failed\n"
                    ));
                    prev = format!("out-{i}");
                }
            }
            i += 1;
        }
    }
    y
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let text = generate(1_000, 10);
    let steps = text.matches("\n  - ").count() + text.matches("\n      - task").count();
    let path = Path::new("bench.yml");
    let opts = LoadOptions::default();
    if let Err(e) = load_str(&text, path, &opts) {
        panic!("generated pipeline must be valid:\n{e}");
    }
    let runs = 7;
    let mut parse = Vec::new();
    let mut full = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let (root, _) = yaml::parse(&text, 0).expect("parse");
        std::hint::black_box(root);
        parse.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(load_str(&text, path, &opts).is_ok());
        full.push(t.elapsed());
    }
    let (p, f) = (median(parse), median(full));
    println!("validate: {steps} steps, {} KiB of YAML, median of {runs} runs", text.len() / 1024);
    println!("  baseline  yaml parse only          {:>8.1} ms", p.as_secs_f64() * 1e3);
    println!("  steppe    load + every rule        {:>8.1} ms", f.as_secs_f64() * 1e3);
    println!("  ratio     full / parse             {:>8.2}x", f.as_secs_f64() / p.as_secs_f64());
}
