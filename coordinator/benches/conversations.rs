//! Many agent conversations on one worker: 2,000 at once (an `across:` of
//! agent cells, all in flight) in one `steppe test`, four turns each, the
//! scripted model answering every request after 50 ms, each turn but the
//! last calling a built-in tool. The whole run against the ideal wall time
//! (4 × 50 ms, every conversation overlapped), and the run's resident
//! memory per conversation beyond its transcript (its peak less a
//! one-conversation run's, less the mean size of a recorded transcript).
//! The same again with the model in a process of its own (`steppe
//! scripted-model`, the agents pointed at it, `steppe run`), as a provider
//! is: the worker's memory without the model's side of every connection.
//! Beside both, the floor of the wire itself: the very requests a
//! conversation sends (recorded from a run), each conversation's four in
//! turn, made by a bare HTTP client (reqwest, as steppe's) with as many
//! runtime threads as cores, against that same model process: over HTTP/2
//! as `steppe test` speaks to its scripted model (a client per 64
//! conversations, as steppe's), and over HTTP/1.1 as `steppe run` speaks to
//! a plain-http endpoint it does not serve itself.
//! Run: `cargo bench -p steppe-coordinator --bench conversations`
//! (STEPPE_BENCH_CONVERSATIONS=N for another count).

mod support;

use std::time::Duration;

use steppe_runtime::store::{RunFilter, SqliteStore, Store};
use support::{free_port, median, ms, peak_rss_during, steppe, Dir};

const SCENARIO: &str = include_str!("support/conversation-model.yaml");

const RUNS: usize = 3;

/// `n` conversations at once; `endpoint`: the model's address when it runs
/// apart (else `steppe test --script` serves it).
fn pipeline(n: usize, endpoint: Option<&str>) -> String {
    let values: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    let source = match endpoint {
        Some(e) => format!("{{model: x/y, endpoint: \"{e}\"}}"),
        None => "{model: openrouter/x/y}".to_string(),
    };
    format!(
        "agents:\n- name: a\n  source: {source}\njobs:\n- name: many\n  plan:\n  - agent: a\n    across:\n    - var: i\n      values: [{}]\n    max_in_flight: {n}\n    messages: [\"Conversation {{{{ .vars.i }}}}.\"]\n",
        values.join(", ")
    )
}

struct Figures {
    wall: Duration,
    /// The run as its store recorded it (started to finished).
    run: Duration,
    peak_kib: u64,
    /// Mean bytes of a conversation's recorded transcript.
    transcript: f64,
}

fn run(dir: &Dir, n: usize, endpoint: Option<&str>) -> Figures {
    run_keeping(dir, n, endpoint, None)
}

/// As [`run`]; `requests`: the scripted model's requests are written there.
fn run_keeping(dir: &Dir, n: usize, endpoint: Option<&str>, requests: Option<&str>) -> Figures {
    let file = format!("p{n}{}.yml", if endpoint.is_some() { "-apart" } else { "" });
    dir.write(&file, &pipeline(n, endpoint));
    let t = std::time::Instant::now();
    let workers = n.to_string();
    let mut args: Vec<&str> = match endpoint {
        Some(_) => vec!["run", &file, "-q", "--workers", &workers],
        None => vec!["test", &file, "--script", "s.yaml", "-q", "--workers", &workers],
    };
    if let Some(r) = requests {
        args.extend(["--dump-requests", r]);
    }
    let mut child = steppe().args(&args).current_dir(&dir.0).stdout(std::process::Stdio::null()).spawn().expect("spawn");
    let pid = child.id();
    let (status, peak_kib) = peak_rss_during(pid, || child.wait().expect("wait"));
    let wall = t.elapsed();
    assert!(status.success(), "steppe {} failed for {n} conversations", args[0]);
    let store = SqliteStore::open(&steppe_runtime::store::db_path(&dir.0.join(&file))).expect("store");
    let rec = store.runs(&RunFilter { limit: 1, ..Default::default() }).expect("runs").into_iter().next().expect("a run");
    let steps = store.steps(&rec.id).expect("steps");
    assert_eq!(steps.len(), n, "every conversation recorded");
    let transcript: usize = steps
        .iter()
        .filter_map(|s| s.detail.as_deref())
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .map(|d| d.get("transcript").map_or(0, |t| t.to_string().len()))
        .sum();
    let run = Duration::from_millis(rec.finished_ms.unwrap_or(rec.started_ms).saturating_sub(rec.started_ms) as u64);
    Figures { wall, run, peak_kib, transcript: transcript as f64 / n as f64 }
}

/// Per conversation beyond its transcript (the median run's peak over the
/// one-conversation baseline), KiB; and the median wall time.
fn figures(one: &[Figures], many: &[Figures], n: usize) -> (f64, f64, Duration, Duration) {
    let base_kib = one.iter().map(|f| f.peak_kib).min().unwrap_or(0);
    let transcript = many.iter().map(|f| f.transcript).sum::<f64>() / many.len() as f64 / 1024.0;
    let mut v: Vec<f64> = many.iter().map(|f| f.peak_kib.saturating_sub(base_kib) as f64 / n as f64).collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], transcript, median(many.iter().map(|f| f.wall).collect()), median(many.iter().map(|f| f.run).collect()))
}

/// The wire's floor: `n` conversations at once, each sending `bodies` in
/// turn to `url`, by bare clients on a runtime of as many threads as cores;
/// `http2`: from the first byte, a client per 64 conversations.
fn bare_requests(url: &str, bodies: &[String], n: usize, http2: bool) -> Duration {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let per_client = if http2 { steppe_worker::provider::CONVERSATIONS_PER_CLIENT } else { n.max(1) };
        let clients: Vec<reqwest::Client> = (0..n.div_ceil(per_client).max(1))
            .map(|_| {
                let b = reqwest::Client::builder();
                if http2 { b.http2_prior_knowledge() } else { b }.build().expect("a client")
            })
            .collect();
        let bodies = std::sync::Arc::new(bodies.to_vec());
        let t = std::time::Instant::now();
        let conversations: Vec<_> = (0..n)
            .map(|i| {
                let (client, url, bodies) = (clients[i / per_client].clone(), url.to_string(), bodies.clone());
                tokio::spawn(async move {
                    for b in bodies.iter() {
                        let r = client.post(&url).header("content-type", "application/json").body(b.clone()).send().await.expect("request");
                        assert!(r.status().is_success(), "the model answered {}", r.status());
                        let v: serde_json::Value = serde_json::from_str(&r.text().await.expect("body")).expect("a JSON answer");
                        assert!(v.pointer("/choices/0/message").is_some(), "a completion: {v}");
                    }
                })
            })
            .collect();
        for c in conversations {
            c.await.expect("a conversation");
        }
        t.elapsed()
    })
}

fn main() {
    let n: usize = std::env::var("STEPPE_BENCH_CONVERSATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let dir = Dir::new("conversations");
    dir.write("s.yaml", SCENARIO);
    // One conversation's requests, as sent: the floor sends the same.
    run_keeping(&dir, 1, None, Some("requests.jsonl"));
    let bodies: Vec<String> = std::fs::read_to_string(dir.0.join("requests.jsonl"))
        .expect("the recorded requests")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a recorded request")["raw"].as_str().expect("its body").to_string())
        .collect();
    assert_eq!(bodies.len(), 4, "a conversation of four turns");
    let one: Vec<Figures> = (0..RUNS).map(|_| run(&dir, 1, None)).collect();
    let many: Vec<Figures> = (0..RUNS).map(|_| run(&dir, n, None)).collect();
    let (per, transcript, wall, run_time) = figures(&one, &many, n);
    let one_wall = median(one.iter().map(|f| f.wall).collect());
    let ideal = Duration::from_millis(4 * 50);
    println!("conversations: {n} at once on one worker, 4 turns each, the scripted model answering after 50 ms; median of {RUNS}");
    println!("  ideal     4 x 50 ms, every one overlapped      {:>9.0} ms", ms(ideal));
    println!("  steppe    one conversation (whole test)        {:>9.0} ms", ms(one_wall));
    println!("  steppe    {n} conversations (whole test)     {:>9.0} ms", ms(wall));
    println!("  steppe    the same, the run as recorded        {:>9.0} ms", ms(run_time));
    println!("  ratio     whole test / ideal                   {:>9.2}x   (target 1.3x)", wall.as_secs_f64() / ideal.as_secs_f64());
    println!("  memory    per conversation (peak RSS over one) {:>9.1} KiB   (the model in the same process)", per);
    println!("  memory    of which its transcript (recorded)   {:>9.1} KiB", transcript);
    println!("  memory    per conversation beyond transcript   {:>9.1} KiB", per - transcript);

    // The model apart, as a provider is: what the worker itself holds.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut model = steppe().args(["scripted-model", "--script", "s.yaml", "--listen", &addr]).current_dir(&dir.0).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().expect("spawn the model");
    let t = std::time::Instant::now();
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(t.elapsed() < Duration::from_secs(30), "the scripted model did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let endpoint = format!("http://{addr}/v1/");
    let url = format!("{endpoint}chat/completions");
    bare_requests(&url, &bodies, 1, false);
    let floor = median((0..RUNS).map(|_| bare_requests(&url, &bodies, n, false)).collect());
    let floor_h2 = median((0..RUNS).map(|_| bare_requests(&url, &bodies, n, true)).collect());
    run(&dir, 1, Some(&endpoint));
    let one: Vec<Figures> = (0..RUNS).map(|_| run(&dir, 1, Some(&endpoint))).collect();
    let many: Vec<Figures> = (0..RUNS).map(|_| run(&dir, n, Some(&endpoint))).collect();
    let _ = model.kill();
    let _ = model.wait();
    let (per, transcript, apart, _) = figures(&one, &many, n);
    println!("  the model in a process of its own (`steppe scripted-model`; `steppe run`, HTTP/1.1):");
    println!("  floor     the same {n}x4 requests, HTTP/2      {:>9.0} ms   (as `steppe test` speaks)", ms(floor_h2));
    println!("  floor     the same {n}x4 requests, HTTP/1.1    {:>9.0} ms   (as `steppe run` speaks here)", ms(floor));
    println!("  steppe    {n} conversations (whole run)      {:>9.0} ms", ms(apart));
    println!("  ratio     whole run / ideal                    {:>9.2}x   (target 1.3x)", apart.as_secs_f64() / ideal.as_secs_f64());
    println!("  ratio     HTTP/2 floor / ideal                 {:>9.2}x   (the wire alone)", floor_h2.as_secs_f64() / ideal.as_secs_f64());
    println!("  ratio     HTTP/1.1 floor / ideal               {:>9.2}x   (the wire alone)", floor.as_secs_f64() / ideal.as_secs_f64());
    println!("  ratio     whole test (model inside) / HTTP/2 floor {:>5.2}x", wall.as_secs_f64() / floor_h2.as_secs_f64());
    println!("  ratio     whole run / HTTP/1.1 floor           {:>9.2}x", apart.as_secs_f64() / floor.as_secs_f64());
    println!("  memory    the worker's, per conversation       {:>9.1} KiB", per);
    println!("  memory    the worker's, beyond its transcript  {:>9.1} KiB   (target under 100 KiB)", per - transcript);
}
