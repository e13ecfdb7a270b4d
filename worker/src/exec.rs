//! Executes one [`Assignment`]: a fresh directory holding only the declared
//! inputs, `sh -c` with the host environment allowlist, output streamed and
//! captured, success judged, outputs stored by content hash.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use steppe_runtime::artifacts::ArtifactStore;
use steppe_runtime::assignment::{Assignment, AssignmentResult, Cwd, Judge};
use steppe_runtime::budget::Ledger;
use steppe_runtime::outcome::StepError;
use futures::FutureExt;
use tokio::sync::watch;

use crate::command::run_command;
use crate::sink::{LineSink, Stream};



/// As [`execute`], a panic running the step (a bug) caught: that step
/// errors, and the loop that asked goes on taking work. Dropped (a session
/// lost, a worker stopping), the step is dropped too, its process group
/// with it.
pub async fn execute_isolated(a: &Assignment, store: Arc<dyn ArtifactStore>, work_root: &Path, sink: Arc<dyn LineSink>, ledger: Option<Arc<dyn Ledger>>, cancel: watch::Receiver<bool>) -> AssignmentResult {
    match std::panic::AssertUnwindSafe(execute(a, store, work_root, sink, ledger, cancel)).catch_unwind().await {
        Ok(r) => r,
        Err(p) => {
            let what = steppe_language::load::panic_text(p.as_ref());
            AssignmentResult::of(a, Err(StepError::errored(format!("{}: the worker failed running this step ({what}); it goes on with others", a.step))))
        }
    }
}

/// Runs `a` in spans of the run's trace (its queue wait, its execution)
/// under the attempt that dispatched it; its result carries this process's
/// spans of the run.
pub async fn execute(
    a: &Assignment,
    store: Arc<dyn ArtifactStore>,
    work_root: &Path,
    sink: Arc<dyn LineSink>,
    ledger: Option<Arc<dyn Ledger>>,
    cancel: watch::Receiver<bool>,
) -> AssignmentResult {
    use crate::telemetry;
    use opentelemetry::KeyValue;
    let parent = telemetry::remote(&a.trace_parent);
    let pool = KeyValue::new("pool", if a.pool.is_empty() { steppe_runtime::queue::DEFAULT_POOL.to_string() } else { a.pool.clone() });
    let worker = KeyValue::new("worker", telemetry::process());
    if a.enqueued_unix_ns > 0 {
        let waited = telemetry::start(&parent, &a.run_id, "queue wait", vec![pool.clone(), worker.clone()], Some(telemetry::at_unix_ns(a.enqueued_unix_ns)));
        telemetry::end(&waited, None);
    }
    let cx = telemetry::start(&parent, &a.run_id, format!("execute {}", a.step), vec![KeyValue::new("step", a.step.clone()), pool, worker, KeyValue::new("attempt", i64::from(a.attempt))], None);
    // The run's secrets held here are masked in everything this step sends back.
    steppe_runtime::secrets::remember_env(&a.masked_env);
    let mut r = opentelemetry::context::FutureExt::with_context(execute_untraced(a, store, work_root, sink, ledger, cancel), cx.clone()).await;
    mask_result(&mut r);
    let mut attrs = Vec::new();
    if let Some(code) = r.exit_code {
        attrs.push(KeyValue::new("exit_code", i64::from(code)));
    }
    if let Some(o) = &r.agent {
        attrs.push(KeyValue::new("tokens", i64::try_from(o.tokens).unwrap_or(i64::MAX)));
    }
    attrs.push(KeyValue::new("outcome", steppe_runtime::outcome::Outcome::of(&r.result).word().to_string()));
    telemetry::set(&cx, attrs);
    telemetry::end(&cx, r.result.as_ref().err().map(|e| e.message.as_str()));
    r.spans = telemetry::take(&a.run_id);
    r
}

/// Masks the secrets this process holds in what a result carries back.
fn mask_result(r: &mut AssignmentResult) {
    use steppe_runtime::secrets::mask;
    let m = |t: &mut String| {
        if let std::borrow::Cow::Owned(masked) = mask(t) {
            *t = masked;
        }
    };
    m(&mut r.stdout);
    m(&mut r.stderr);
    if let Err(e) = &mut r.result {
        m(&mut e.message);
    }
    if let Some(o) = &mut r.agent {
        m(&mut o.response);
        if let Some(n) = &mut o.note {
            m(n);
        }
        for e in &mut o.transcript {
            m(&mut e.content);
        }
        for t in &mut o.trajectory {
            let text = t.args.to_string();
            if let std::borrow::Cow::Owned(masked) = mask(&text) {
                t.args = serde_json::from_str(&masked).unwrap_or(serde_json::Value::String(masked));
            }
        }
        for d in &mut o.denials {
            m(&mut d.path);
            m(&mut d.reason);
        }
    }
}

async fn execute_untraced(
    a: &Assignment,
    store: Arc<dyn ArtifactStore>,
    work_root: &Path,
    sink: Arc<dyn LineSink>,
    ledger: Option<Arc<dyn Ledger>>,
    cancel: watch::Receiver<bool>,
) -> AssignmentResult {
    let fail = |e: StepError| AssignmentResult::of(a, Err(e));
    if let Some(image) = a.image.as_ref().filter(|_| !crate::container::runs_in_image(a)) {
        return fail(StepError::errored(format!(
            "{}: image \"{image}\": only a command in a fresh step directory runs in an image (this assignment names a host directory)",
            a.step
        )));
    }
    let (dir, owned) = match &a.cwd {
        Cwd::Host(p) => (p.clone(), None),
        _ => match crate::step_dir::take(work_root) {
            Ok(d) => (d.path().to_path_buf(), Some(d)),
            Err(e) => return fail(StepError::errored(format!("{}: cannot create a step directory: {e}", a.step))),
        },
    };
    // What the step writes is recorded as it arrives (resource checks,
    // which print only their answer, are not).
    let recorder = a.stream.then(|| crate::output::Recorder::new(work_root, &format!("{}-{}", a.id, a.epoch), sink.clone()));
    let sink: Arc<dyn LineSink> = match &recorder {
        Some(r) => r.clone(),
        None => sink,
    };
    // Each kind's future is boxed apart (here and in run_in): a slot's task
    // holds only what the kind it runs needs, and an idle slot almost nothing.
    let mut result = Box::pin(run_in(a, &dir, store.clone(), sink, ledger, cancel)).await;
    if let Some(d) = owned {
        crate::step_dir::give_back(d);
    }
    if let Some(r) = recorder {
        if !r.stores() {
            result.output = r.finish(store.as_ref());
        } else if let Ok(record) = tokio::task::spawn_blocking(move || r.finish(store.as_ref())).await {
            result.output = record;
        }
    }
    result
}

async fn run_in(
    a: &Assignment,
    dir: &Path,
    store: Arc<dyn ArtifactStore>,
    sink: Arc<dyn LineSink>,
    ledger: Option<Arc<dyn Ledger>>,
    cancel: watch::Receiver<bool>,
) -> AssignmentResult {
    let fail = |e: StepError| AssignmentResult::of(a, Err(e));
    if *cancel.borrow() {
        // Cancelled before it started: nothing runs.
        return fail(StepError::aborted(format!("{}: cancelled before it started", a.step)));
    }
    if a.cwd == Cwd::StepDir {
        for (name, r) in &a.inputs {
            let s = store.clone();
            let (r, dest) = (r.clone(), dir.join(name));
            let done = tokio::task::spawn_blocking(move || s.materialize(&r, &dest)).await;
            if let Err(e) = done.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
                return fail(StepError::errored(format!("{}: materializing input \"{name}\": {e}", a.step)));
            }
        }
        for o in &a.outputs {
            if let Err(e) = std::fs::create_dir_all(dir.join(o)) {
                return fail(StepError::errored(format!("{}: creating output \"{o}\": {e}", a.step)));
            }
        }
    }
    if let Some(work) = &a.agent {
        let (r, outcome) = Box::pin(crate::agent::run(work, dir, &a.run_id, sink.clone(), ledger.clone(), cancel.clone())).await;
        let r = r.and_then(|()| crate::agent::judge(work, dir, &outcome));
        let mut res = AssignmentResult { stdout: outcome.response.clone(), agent: Some(outcome), ..AssignmentResult::of(a, r) };
        if res.result.is_ok() {
            capture(a, dir, store, &mut res).await;
        }
        return res;
    }
    if let Some(stage) = &a.mcp {
        let mut res = match Box::pin(crate::tools::mcp::run_stage(stage, dir)).await {
            Ok(stdout) => AssignmentResult { exit_code: Some(0), stdout, ..AssignmentResult::of(a, Ok(())) },
            Err(e) => return fail(StepError::errored(format!("{}: {e}", a.step))),
        };
        capture(a, dir, store, &mut res).await;
        return res;
    }
    let workdir = match &a.cwd {
        Cwd::Snapshot { tree, dir: sub } => {
            let (s, tree, dest) = (store.clone(), tree.clone(), dir.to_path_buf());
            let done = tokio::task::spawn_blocking(move || s.materialize(&tree, &dest)).await;
            if let Err(e) = done.map_err(|e| e.to_string()).and_then(|r| r.map_err(|e| e.to_string())) {
                return fail(StepError::errored(format!("{}: materializing the pipeline's files: {e}", a.step)));
            }
            match steppe_language::confine::check_relative(if sub.is_empty() { "." } else { sub }, "the snapshot") {
                Ok(0) => dir.join(sub),
                _ => return fail(StepError::errored(format!("{}: {sub:?} is not a directory inside the pipeline's files", a.step))),
            }
        }
        _ => dir.to_path_buf(),
    };
    let mut res = match Box::pin(run_command(a, &workdir, &sink, &cancel)).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    if res.result.is_err() {
        return res;
    }
    res.result = judge(a, &a.judge, dir, res.exit_code, &res.stdout);
    if let (Err(e), Some(fix)) = (&res.result, &a.fix) {
        if e.class == steppe_runtime::outcome::Class::Failed {
            res = Box::pin(repair(a, fix, dir, res, &sink, &ledger, &cancel)).await;
        }
    }
    if res.result.is_ok() {
        capture(a, dir, store, &mut res).await;
    }
    res
}

/// A task missed its success criteria and has a `fix:` agent: one fix
/// conversation in the task's own directory (with the task itself as a
/// zero-argument rerun tool), then one final run judged by the same rule.
async fn repair(
    a: &Assignment,
    fix: &steppe_runtime::agent_work::AgentWork,
    dir: &Path,
    failed: AssignmentResult,
    sink: &Arc<dyn LineSink>,
    ledger: &Option<Arc<dyn Ledger>>,
    cancel: &watch::Receiver<bool>,
) -> AssignmentResult {
    let exit = failed.exit_code.unwrap_or(-1);
    let reason = failed.result.as_ref().err().map(|e| e.message.clone()).unwrap_or_default();
    sink.line(&a.run_id, &a.step, Stream::Stdout, &format!("task \"{}\" failed (exit {exit}); invoking fix agent \"{}\"", a.step, fix.agent));
    let mut work = fix.clone();
    // Its shell, custom tools and rerun run in the failing task's image.
    if let Some(image) = &a.image {
        work.image = Some(image.clone());
        work.container = a.container.clone();
        work.env = a.env.clone();
    }
    let mut block = format!("exit code: {exit}\n");
    if a.judge.is_assert() {
        block.push_str(&format!("assert: {reason}\n"));
    }
    if !failed.stdout.is_empty() {
        block.push_str(&format!("stdout:\n{}\n", cap(&failed.stdout, 32_000)));
    }
    if !failed.stderr.is_empty() {
        block.push_str(&format!("stderr:\n{}\n", cap(&failed.stderr, 32_000)));
    }
    if let Some(steppe_runtime::agent_work::AgentMessage::Text(first)) = work.messages.first_mut() {
        first.push_str("\n\n--- failure output ---\n");
        first.push_str(&block);
    }
    let (r, outcome) = crate::agent::run(&work, dir, &a.run_id, sink.clone(), ledger.clone(), cancel.clone()).await;
    if let Err(e) = r {
        return AssignmentResult {
            result: Err(e.with_message(format!("fix agent \"{}\": {}", fix.agent, e.message))),
            agent: Some(outcome),
            ..failed
        };
    }
    let mut again = match run_command(a, dir, sink, cancel).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    again.agent = Some(outcome);
    if again.result.is_ok() {
        again.result = judge(a, &a.judge, dir, again.exit_code, &again.stdout);
    }
    if again.result.is_err() {
        let exit = again.exit_code.unwrap_or(-1);
        again.result = Err(StepError::failed(format!("task \"{}\": still failing after fix agent \"{}\" (exit {exit})", a.step, fix.agent)));
    }
    again
}

fn cap(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut cut = n;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    &s[..cut]
}

/// Stores the declared outputs (or, for a get's `in`, the directory itself).
async fn capture(a: &Assignment, dir: &Path, store: Arc<dyn ArtifactStore>, res: &mut AssignmentResult) {
    let targets: Vec<(String, PathBuf)> = match a.cwd {
        Cwd::CaptureSelf => vec![(".".to_string(), dir.to_path_buf())],
        _ => a.outputs.iter().map(|o| (o.clone(), dir.join(o))).collect(),
    };
    for (name, path) in targets {
        let s = store.clone();
        match tokio::task::spawn_blocking(move || s.put_dir(&path)).await {
            Ok(Ok(r)) => res.outputs.push((name, r)),
            Ok(Err(e)) => {
                res.result = Err(StepError::errored(format!("{}: capturing output \"{name}\": {e}", a.step)));
                return;
            }
            Err(e) => {
                res.result = Err(StepError::errored(format!("{}: capturing output \"{name}\": {e}", a.step)));
                return;
            }
        }
    }
}

/// Success by exit code, or — when the step asserts anything — by every set
/// assert field (the exit code then only counts if `code:` is set).
fn judge(a: &Assignment, j: &Judge, dir: &Path, exit: Option<i32>, stdout: &str) -> Result<(), StepError> {
    let code = exit.unwrap_or(-1);
    if !j.is_assert() {
        return if code == 0 { Ok(()) } else { Err(StepError::failed(format!("{}: exit status {code}", a.step))) };
    }
    if let Some(want) = j.code {
        if i64::from(code) != want {
            return Err(StepError::failed(format!("{}: assert.code: want {want}, got {code}", a.step)));
        }
    }
    if let Some(s) = &j.stdout {
        if !stdout.contains(s.as_str()) {
            return Err(StepError::failed(format!("{}: assert.stdout: output does not contain {s:?}", a.step)));
        }
    }
    for f in &j.files {
        let p = dir.join(f);
        match std::fs::metadata(&p) {
            Err(_) => return Err(StepError::failed(format!("{}: assert.files: {f} does not exist", a.step))),
            Ok(m) if m.is_dir() => return Err(StepError::failed(format!("{}: assert.files: {f} is a directory, not a file", a.step))),
            Ok(m) if m.len() == 0 => return Err(StepError::failed(format!("{}: assert.files: {f} is empty", a.step))),
            Ok(_) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink with a bug: it panics on the first line.
    struct Broken;

    impl LineSink for Broken {
        fn line(&self, _run_id: &str, _step: &str, _stream: Stream, _line: &str) {
            panic!("the sink broke");
        }
    }

    fn setup(name: &str) -> (PathBuf, Arc<dyn ArtifactStore>, watch::Receiver<bool>) {
        let root = std::env::temp_dir().join(format!("steppe-exec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let store: Arc<dyn ArtifactStore> = Arc::new(steppe_runtime::artifacts::LocalArtifactStore::new(&root.join("store")).unwrap());
        let (tx, cancel) = watch::channel(false);
        std::mem::forget(tx);
        (root, store, cancel)
    }

    #[tokio::test]
    async fn a_panic_running_a_step_errors_that_step_only() {
        let (root, store, cancel) = setup("isolated");
        // The task fails, so its fix is announced on the sink, which panics in the step's own task.
        let fix = Box::new(steppe_runtime::agent_work::AgentWork { agent: "mender".into(), ..Default::default() });
        let a = Assignment { id: "a1".into(), stream: false, fix: Some(fix), ..Assignment::command("r", "build", "exit 1".into()) };
        let r = execute_isolated(&a, store.clone(), &root, Arc::new(Broken), None, cancel.clone()).await;
        let e = r.result.expect_err("the step must not pass");
        assert_eq!(e.class, steppe_runtime::outcome::Class::Errored);
        assert!(e.message.contains("the worker failed running this step") && e.message.contains("the sink broke"), "{}", e.message);
        assert_eq!(r.assignment_id, "a1");
        // The same worker goes on: the next step runs.
        let quiet = Assignment { id: "a2".into(), stream: false, ..Assignment::command("r", "quiet", "true".into()) };
        assert!(execute_isolated(&quiet, store, &root, Arc::new(Broken), None, cancel).await.result.is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[tokio::test]
    async fn a_step_whose_output_could_not_be_read_errors_instead_of_passing() {
        let (root, store, cancel) = setup("unread");
        let a = Assignment { id: "a1".into(), ..Assignment::command("r", "speak", "echo hi".into()) };
        let r = execute_isolated(&a, store, &root, Arc::new(Broken), None, cancel).await;
        let e = r.result.expect_err("half an output must not pass");
        assert!(e.message.contains("reading its output failed") && e.message.contains("the sink broke"), "{}", e.message);
        let _ = std::fs::remove_dir_all(&root);
    }

    struct Quiet;

    impl LineSink for Quiet {
        fn line(&self, _run_id: &str, _step: &str, _stream: Stream, _line: &str) {}
    }

    #[tokio::test]
    async fn a_command_sees_only_its_three_streams_and_all_it_wrote_is_kept() {
        let (root, store, cancel) = setup("pipes");
        // Started directly (plain words): what it lists is its own descriptors,
        // the directory it reads being the fourth. The ends of the output
        // pipes this process holds must not be among them.
        let a = Assignment { id: "a1".into(), stream: false, ..Assignment::command("r", "fds", "ls /proc/self/fd".into()) };
        let r = execute_isolated(&a, store.clone(), &root, Arc::new(Quiet), None, cancel.clone()).await;
        assert!(r.result.is_ok(), "{:?}", r.result);
        // Beside those, only what this process lets every child inherit (a
        // test runner's jobserver, say) may be there.
        let inherited: Vec<String> = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|&fd| fd > 2 && unsafe { libc::fcntl(fd, libc::F_GETFD) } & libc::FD_CLOEXEC == 0)
            .map(|fd| fd.to_string())
            .collect();
        let mut own: Vec<u32> = r.stdout.split_whitespace().filter(|fd| !inherited.iter().any(|i| i == fd)).filter_map(|fd| fd.parse().ok()).collect();
        own.sort_unstable();
        assert!(own.len() == 4 && own[..3] == [0, 1, 2], "its three streams and the one it lists with: {} (inherited: {inherited:?})", r.stdout);
        // A process that closes its output before it ends: what it wrote is
        // kept, and its step ends when it does.
        let a = Assignment { id: "a2".into(), stream: false, ..Assignment::command("r", "closes", "echo out; echo err >&2; exec >&- 2>&-; sleep 0.2; exit 3".into()) };
        let r = execute_isolated(&a, store.clone(), &root, Arc::new(Quiet), None, cancel.clone()).await;
        assert_eq!((r.stdout.as_str(), r.stderr.as_str(), r.exit_code), ("out\n", "err\n", Some(3)));
        // One that writes up to the moment it ends.
        let a = Assignment { id: "a3".into(), stream: false, ..Assignment::command("r", "last", "seq 1 20000; printf tail >&2".into()) };
        let r = execute_isolated(&a, store, &root, Arc::new(Quiet), None, cancel).await;
        assert_eq!((r.stdout.lines().count(), r.stdout.lines().last(), r.stderr.as_str()), (20000, Some("20000"), "tail"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
