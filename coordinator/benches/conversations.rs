//! 500 concurrent agent conversations on one worker, 4 turns each, the
//! scripted model answering every request after 50 ms. Reports wall time
//! against the ideal (4 × 50 ms: every conversation fully overlapped) and the
//! peak resident memory per in-flight conversation, with a one-conversation
//! run in the same session as the baseline.
//! Run: `cargo bench -p steppe-coordinator --bench conversations`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str = "model:
  rules:
    - when: {called: search_files}
      say: done
      delay: 50ms
    - when: {called: read_file}
      call: search_files
      args: {pattern: x}
      delay: 50ms
    - when: {called: list_dir}
      call: read_file
      args: {path: missing.txt}
      delay: 50ms
    - call: list_dir
      delay: 50ms
";

fn pipeline(n: usize) -> String {
    let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!(
        "agents:\n- name: a\n  source: {{model: openrouter/x/y}}\njobs:\n- name: many\n  plan:\n  - agent: a\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {n}\n    messages: [\"Conversation {{{{ .vars.i }}}}.\"]\n",
        values.join(", ")
    )
}

/// Runs `steppe test` on n conversations; returns wall time and peak RSS (KiB).
fn run(dir: &std::path::Path, n: usize) -> (Duration, u64) {
    std::fs::write(dir.join("p.yml"), pipeline(n)).expect("write");
    std::fs::write(dir.join("s.yaml"), SCENARIO).expect("write");
    let _ = std::fs::remove_dir_all(dir.join(".steppe"));
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_steppe"))
        .args(["test", "p.yml", "--script", "s.yaml", "-q", "--workers", &n.max(1).to_string()])
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let status_path = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    loop {
        if let Ok(s) = std::fs::read_to_string(&status_path) {
            if let Some(kb) = s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse().ok()) {
                peak = peak.max(kb);
            }
        }
        if let Some(st) = child.try_wait().expect("wait") {
            assert!(st.success(), "steppe test failed for {n} conversations");
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (t.elapsed(), peak)
}

fn main() {
    let dir = std::env::temp_dir().join(format!("steppe-bench-conv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("mkdir");
    let (t1, m1) = run(&dir, 1);
    let (t500, m500) = run(&dir, 500);
    let ideal = Duration::from_millis(4 * 50);
    println!("conversations: 4 turns each, the scripted model answering after 50 ms");
    println!("  baseline  1 conversation          {:>8.0} ms   peak RSS {:>7} KiB", t1.as_secs_f64() * 1e3, m1);
    println!("  steppe    500 conversations       {:>8.0} ms   peak RSS {:>7} KiB", t500.as_secs_f64() * 1e3, m500);
    println!("  ideal     (4 x 50 ms, overlapped) {:>8.0} ms", ideal.as_secs_f64() * 1e3);
    println!("  ratio     500 / 1 conversation    {:>8.2}x", t500.as_secs_f64() / t1.as_secs_f64());
    println!("  memory    per in-flight conversation  {:>6.1} KiB", (m500.saturating_sub(m1)) as f64 / 500.0);
    let _ = std::fs::remove_dir_all(&dir);
}
