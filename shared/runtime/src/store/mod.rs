//! The Store: runs, step records and logs. SQLite under `.steppe/` in
//! embedded mode (created on first use); Redis in a cluster.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store {path}: {source}")]
    Sqlite { path: String, source: rusqlite::Error },
    #[error("store {url}: {message}")]
    Redis { url: String, message: String },
    /// The backend cannot be reached now (a write may be kept and sent later).
    #[error("store {url} is unreachable: {message}")]
    Unavailable { url: String, message: String },
    #[error("coordinator {url}: {message}")]
    Remote { url: String, message: String },
    #[error("store {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

mod events;
mod questions;
mod scope;
pub use events::{now_ms, step_states, RunEvent, StepState};

pub use questions::{person_here, QuestionRecord};
pub use scope::{check_name, PipelineSummary, RunFilter, Scope};

/// This process as a run's owner: host, pid and start time, unique across
/// restarts and machines sharing a store.
pub fn this_owner() -> &'static str {
    static OWNER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    OWNER.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "host".into());
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        format!("{host}:{}:{started}", std::process::id())
    })
}

#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunRecord {
    pub id: String,
    /// The team it ran for ("" without `--auth`) and its pipeline's name.
    #[serde(default)]
    pub team: String,
    #[serde(default)]
    pub pipeline: String,
    pub job: String,
    pub started_ms: i64,
    pub finished_ms: Option<i64>,
    /// succeeded / failed / errored / aborted; None while running.
    pub outcome: Option<String>,
    pub message: String,
    /// The process running it (a coordinator, an embedded `steppe run`):
    /// while it says it is alive (`Store::heartbeat`), an unfinished run is
    /// going on; once it stops, the run is an orphan, marked aborted.
    #[serde(default)]
    pub owner: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StepRecord {
    pub run_id: String,
    pub seq: i64,
    pub name: String,
    pub outcome: String,
    pub message: String,
    pub duration_ms: i64,
    pub exit_code: Option<i32>,
    /// Provider-reported tokens of an agent step (None for other steps).
    pub tokens: Option<i64>,
    /// An agent step's record as JSON: verdict, note, turns, trajectory, denials.
    pub detail: Option<String>,
}

/// A parked `approval:` step.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalRecord {
    pub id: i64,
    /// The team and pipeline of the run it parks.
    #[serde(default)]
    pub team: String,
    #[serde(default)]
    pub pipeline: String,
    pub run_id: String,
    pub job: String,
    pub message: String,
    pub requested_ms: i64,
    pub deadline_ms: i64,
    /// `approved` or `rejected`; None while pending.
    pub decision: Option<String>,
    pub reason: String,
    pub approver: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LogLine {
    pub step: String,
    pub stderr: bool,
    pub line: String,
    /// On the line that stands for what a step's record left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<Omitted>,
}

/// What a step's record left out of the store: `lines` lines (`bytes`
/// bytes) after its first `head`, followed by `tail` more lines; all of it
/// is in the `output.log` of artifact `full`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Omitted {
    pub full: String,
    pub head: u64,
    pub lines: u64,
    pub bytes: u64,
    pub tail: u64,
}

impl LogLine {
    pub fn new(step: &str, stderr: bool, line: &str) -> Self {
        LogLine { step: step.to_string(), stderr, line: line.to_string(), omitted: None }
    }

    /// The lines a step's output record keeps: head, a line standing for
    /// what was left out (when anything was), tail.
    pub fn from_record(step: &str, r: &crate::assignment::OutputRecord) -> Vec<LogLine> {
        let mut out: Vec<LogLine> = r.head.iter().map(|l| LogLine::new(step, l.stderr, &l.line)).collect();
        if let Some(full) = &r.full {
            let line = if r.omitted_lines > 0 {
                format!("… {} line(s), {} byte(s) not kept here; `steppe runs --logs --full` shows them", r.omitted_lines, r.omitted_bytes)
            } else {
                "… long lines were cut here; `steppe runs --logs --full` shows them whole".to_string()
            };
            let omitted = Omitted { full: full.digest.clone(), head: r.head.len() as u64, lines: r.omitted_lines, bytes: r.omitted_bytes, tail: r.tail.len() as u64 };
            out.push(LogLine { omitted: Some(omitted), ..LogLine::new(step, false, &line) });
        }
        out.extend(r.tail.iter().map(|l| LogLine::new(step, l.stderr, &l.line)));
        out
    }
}

impl RunRecord {
    pub fn scope(&self) -> Scope {
        Scope { team: self.team.clone(), pipeline: self.pipeline.clone() }
    }
}

/// A batch's spans, each run's together (in the order they came), for one
/// record per run: a trace is read whole, never a span at a time.
pub(crate) fn spans_by_run(spans: &[(String, Vec<crate::trace::SpanRecord>)]) -> Vec<(&str, Vec<&crate::trace::SpanRecord>)> {
    let mut out: Vec<(&str, Vec<&crate::trace::SpanRecord>)> = Vec::new();
    for (run_id, list) in spans {
        match out.iter_mut().find(|(r, _)| *r == run_id) {
            Some((_, v)) => v.extend(list),
            None => out.push((run_id, list.iter().collect())),
        }
    }
    out.retain(|(_, v)| !v.is_empty());
    out
}

/// What the event hub writes to the store at once, in order within each kind.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub events: Vec<(String, RunEvent)>,
    pub logs: Vec<(String, LogLine)>,
    pub steps: Vec<StepRecord>,
    pub spans: Vec<(String, Vec<crate::trace::SpanRecord>)>,
    /// Chains runs succeeded through (the step cache): scope, job, leaf hash.
    pub chains: Vec<(Scope, String, String)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.logs.is_empty() && self.steps.is_empty() && self.spans.is_empty() && self.chains.is_empty()
    }
}

/// Consecutive items of one run together, in order.
pub fn group<T: Clone>(items: &[(String, T)]) -> Vec<(String, Vec<T>)> {
    let mut out: Vec<(String, Vec<T>)> = Vec::new();
    for (run, item) in items {
        match out.last_mut() {
            Some((r, v)) if r == run => v.push(item.clone()),
            _ => out.push((run.clone(), vec![item.clone()])),
        }
    }
    out
}

/// What the coordinator records and the `runs` views read. History is kept
/// per [`Scope`] (team and pipeline): runs, approvals, versions and `passed:`
/// records of one scope are never seen from another. Records found by run id
/// carry their scope, for the caller to check.
pub trait Store: Send + Sync {
    /// Records a run as started (`rec` with no outcome yet).
    fn start_run(&self, rec: &RunRecord) -> Result<(), StoreError>;
    /// Records a run as finished (`rec` whole, so a backend that lost its
    /// start, a Redis restarted empty, still gets the run).
    fn finish_run(&self, rec: &RunRecord) -> Result<(), StoreError>;
    fn record_step(&self, s: &StepRecord) -> Result<(), StoreError>;
    fn append_logs(&self, run_id: &str, lines: &[LogLine]) -> Result<(), StoreError>;
    /// Runs the filter admits, newest first.
    fn runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError>;
    /// The pipelines with runs (of `team`, or every team's), each with its newest run.
    fn pipelines(&self, team: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError>;
    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError>;
    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;
    fn logs(&self, run_id: &str) -> Result<Vec<LogLine>, StoreError>;
    /// Adds finished spans of a run, whichever process made them.
    fn add_spans(&self, run_id: &str, spans: &[crate::trace::SpanRecord]) -> Result<(), StoreError>;
    /// A run's spans, in the order they were added.
    fn spans(&self, run_id: &str) -> Result<Vec<crate::trace::SpanRecord>, StoreError>;
    /// Appends events of a run (steps started and ended, notes, live
    /// output lines), in order.
    fn record_events(&self, run_id: &str, events: &[RunEvent]) -> Result<(), StoreError>;
    /// A run's events from the `after`-th on (0: all of them), in order:
    /// what a follower has not seen yet.
    fn events_after(&self, run_id: &str, after: usize) -> Result<Vec<RunEvent>, StoreError>;
    /// Writes what the event hub gathered, at once: a backend that can
    /// makes it one transaction (a few per second instead of several per step).
    fn record_batch(&self, b: &Batch) -> Result<(), StoreError> {
        let mut result = Ok(());
        for (run_id, events) in group(&b.events) {
            result = result.and(self.record_events(&run_id, &events));
        }
        for (run_id, lines) in group(&b.logs) {
            result = result.and(self.append_logs(&run_id, &lines));
        }
        for s in &b.steps {
            result = result.and(self.record_step(s));
        }
        for (run_id, spans) in &b.spans {
            result = result.and(self.add_spans(run_id, spans));
        }
        for (scope, job, hash) in &b.chains {
            result = result.and(self.record_chain(scope, job, hash));
        }
        result
    }
    /// Appends one run event, stamped now.
    fn record_event(&self, run_id: &str, kind: &str, step: &str, message: &str) -> Result<(), StoreError> {
        self.record_events(run_id, &[RunEvent::now(kind, step, message)])
    }
    /// A run's events in order.
    fn events(&self, run_id: &str) -> Result<Vec<RunEvent>, StoreError> {
        self.events_after(run_id, 0)
    }
    /// Parks an approval of a run of `scope`; returns its id.
    fn request_approval(&self, scope: &Scope, run_id: &str, job: &str, message: &str, requested_ms: i64, deadline_ms: i64) -> Result<i64, StoreError>;
    fn approval(&self, id: i64) -> Result<Option<ApprovalRecord>, StoreError>;
    /// Approvals waiting for a decision (of `team` / `pipeline` when given), oldest first.
    fn pending_approvals(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError>;
    /// Adds `tokens` to the spending counter `counter` (a job's or an
    /// across's budget, shared by every worker) atomically; returns its new
    /// total. Adding 0 reads it.
    fn add_spend(&self, counter: &str, tokens: u64) -> Result<u64, StoreError>;
    /// Says `owner` is alive until `now_ms + ttl_ms`.
    fn heartbeat(&self, owner: &str, now_ms: i64, ttl_ms: i64) -> Result<(), StoreError>;
    /// Unfinished runs whose owner has stopped saying it is alive (as of `now_ms`).
    fn orphaned_runs(&self, now_ms: i64) -> Result<Vec<RunRecord>, StoreError>;
    /// Records a decision; false if the approval was already decided (or does not exist).
    fn decide_approval(&self, id: i64, approved: bool, reason: &str, approver: &str) -> Result<bool, StoreError>;
    /// Files a question (`q.id` is assigned) unless its run already asked it
    /// (same text and options) and it did not expire: then that one, and false.
    fn ask_question(&self, q: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError>;
    fn question(&self, id: i64) -> Result<Option<QuestionRecord>, StoreError>;
    /// Questions waiting for an answer (of `team` / `pipeline` when given)
    /// and not past their deadline, oldest first.
    fn pending_questions(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError>;
    /// Records who answered (`answer` None: it expired unanswered); false if
    /// it was already settled (or does not exist).
    fn settle_question(&self, id: i64, answer: Option<&str>, source: &str, at_ms: i64) -> Result<bool, StoreError>;
    /// Files versions a check reported into the resource's history (first-seen order kept).
    fn record_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value]) -> Result<(), StoreError>;
    /// Every version ever reported, oldest first.
    fn history(&self, scope: &Scope, resource: &str) -> Result<Vec<serde_json::Value>, StoreError>;
    /// A successful build of `job` fetched `version` of `resource`.
    fn record_green(&self, scope: &Scope, job: &str, resource: &str, version: &serde_json::Value) -> Result<(), StoreError>;
    /// Versions of `resource` that passed through a successful build of `job`.
    fn green(&self, scope: &Scope, job: &str, resource: &str) -> Result<Vec<serde_json::Value>, StoreError>;
    /// A build of `job` took `version` of `resource` for a `version: every`
    /// get (its cursor is the newest taken, in discovery order). Kept beside
    /// the `passed:` records, under a name no job can have.
    fn record_taken(&self, scope: &Scope, job: &str, resource: &str, version: &serde_json::Value) -> Result<(), StoreError> {
        self.record_green(scope, &format!("{job}\u{0}every"), resource, version)
    }
    /// The versions of `resource` that builds of `job` took for `every`.
    fn taken(&self, scope: &Scope, job: &str, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        self.green(scope, &format!("{job}\u{0}every"), resource)
    }
    /// Drops versions from a resource's history, and `jobs`' `passed:`
    /// records of them (`version_history`).
    fn forget_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value], jobs: &[String]) -> Result<(), StoreError>;
    /// Removes a finished run with its steps, logs, spans and events (`run_history`).
    fn delete_run(&self, run: &RunRecord) -> Result<(), StoreError>;
    /// A pipeline's own small records by key (a watcher's cursors, build
    /// queue and breakers, as JSON); `None` removes one.
    fn set_value(&self, scope: &Scope, key: &str, value: Option<&str>) -> Result<(), StoreError>;
    fn value(&self, scope: &Scope, key: &str) -> Result<Option<String>, StoreError>;
    /// A run of `job` succeeded through the chain whose leaf is `hash` (the step cache).
    fn record_chain(&self, scope: &Scope, job: &str, hash: &str) -> Result<(), StoreError>;
    /// Whether a run of `job` succeeded through the chain whose leaf is `hash`.
    fn chain_succeeded(&self, scope: &Scope, job: &str, hash: &str) -> Result<bool, StoreError>;
    /// Which of `hashes` runs of `job` succeeded through, asked at once (an
    /// `across:` step's cells); a backend that can answers in one round trip.
    fn chains_succeeded(&self, scope: &Scope, job: &str, hashes: &[String]) -> Result<std::collections::HashSet<String>, StoreError> {
        let mut found = std::collections::HashSet::new();
        for h in hashes {
            if self.chain_succeeded(scope, job, h)? {
                found.insert(h.clone());
            }
        }
        Ok(found)
    }
}

/// The store file of a pipeline: `<dir>/.steppe/<file name>.db`, one per file.
pub fn db_path(pipeline: &Path) -> PathBuf {
    let dir = pipeline.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = pipeline.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "pipeline".into());
    dir.join(".steppe").join(format!("{name}.db"))
}

/// A version as stored: JSON with sorted keys, so equal versions compare equal.
pub fn canonical(v: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(v, &mut out);
    out
}

/// Appends `v` as [`canonical`] writes it (compact, object keys sorted).
pub fn write_canonical(v: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json_str(k, out);
                out.push(':');
                write_canonical(&m[k.as_str()], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        Value::String(s) => write_json_str(s, out),
        other => out.push_str(&other.to_string()),
    }
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
pub fn write_json_str(s: &str, out: &mut String) {
    // serde_json writes valid UTF-8 only; its output of a &str is a String.
    if let Ok(quoted) = serde_json::to_string(s) {
        out.push_str(&quoted);
    }
}

#[cfg(test)]
mod canonical_tests {
    use super::canonical;
    use serde_json::{json, Value};

    /// What `canonical` wrote before it wrote directly: the value rebuilt
    /// with sorted keys, then serialized. Stored versions and chain hashes
    /// depend on the bytes staying the same.
    fn rebuilt(v: &Value) -> String {
        fn sort(v: &Value) -> Value {
            match v {
                Value::Object(m) => {
                    let mut keys: Vec<&String> = m.keys().collect();
                    keys.sort();
                    Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&m[k]))).collect())
                }
                Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
                other => other.clone(),
            }
        }
        sort(v).to_string()
    }

    #[test]
    fn canonical_writes_the_same_bytes_as_the_rebuilt_value() {
        let cases = [
            json!({"z": 1, "a": {"y": [3, {"b": null, "a": true}], "x": "q\"uote\n\u{1}"}, "m": -1.5e300}),
            json!([]),
            json!({}),
            json!("ünïcode ✓"),
            json!([{"b": 1, "a": 2}, [], {}, 0, 18446744073709551615u64, -9223372036854775808i64]),
        ];
        for v in &cases {
            assert_eq!(canonical(v), rebuilt(v), "{v}");
        }
        assert_eq!(canonical(&json!({"b": 1, "a": 2})), r#"{"a":2,"b":1}"#);
    }
}

mod outbox;
mod redis;
mod sqlite;

pub use outbox::Outbox;
pub use self::redis::RedisStore;
pub use sqlite::SqliteStore;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What every Store backend must do alike.
    fn run(id: &str, scope: &Scope, job: &str, started_ms: i64) -> RunRecord {
        RunRecord { id: id.into(), team: scope.team.clone(), pipeline: scope.pipeline.clone(), job: job.into(), started_ms, owner: "p1".into(), ..Default::default() }
    }

    fn all(limit: usize) -> RunFilter<'static> {
        RunFilter { limit, ..Default::default() }
    }

    pub(crate) fn conformance(s: &dyn Store) {
        let ci = Scope::new("", "ci");
        s.start_run(&run("r1", &ci, "build", 10)).unwrap();
        s.start_run(&run("r2", &ci, "test", 20)).unwrap();
        s.record_step(&StepRecord { run_id: "r1".into(), seq: 0, name: "compile".into(), outcome: "succeeded".into(), message: String::new(), duration_ms: 5, exit_code: Some(0), tokens: None, detail: None }).unwrap();
        s.record_step(&StepRecord { run_id: "r1".into(), seq: 1, name: "agent".into(), outcome: "failed".into(), message: "no".into(), duration_ms: 7, exit_code: None, tokens: Some(12), detail: Some("{}".into()) }).unwrap();
        let omitted = Some(Omitted { full: "f".repeat(64), head: 1, lines: 10, bytes: 100, tail: 0 });
        s.append_logs("r1", &[LogLine::new("compile", false, "ok"), LogLine::new("compile", true, "warn"), LogLine { omitted: omitted.clone(), ..LogLine::new("compile", false, "…") }]).unwrap();
        s.finish_run(&RunRecord { finished_ms: Some(30), outcome: Some("succeeded".into()), ..run("r1", &ci, "build", 10) }).unwrap();
        // Spans of a run, from any process, in the order they came.
        let span = |id: &str, parent: &str| crate::trace::SpanRecord {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            span_id: id.into(),
            parent_id: parent.into(),
            name: format!("span {id}"),
            start_ns: 1,
            end_ns: 2,
            attributes: vec![("steppe.run".into(), "r1".into()), ("worker".into(), "w<1>".into())],
            error: (id == "b").then(|| "exit 3".to_string()),
            process: "worker w1".into(),
        };
        s.add_spans("r1", &[span("a", ""), span("b", "a")]).unwrap();
        s.add_spans("r1", &[span("c", "a")]).unwrap();
        s.add_spans("r1", &[]).unwrap();
        assert_eq!(s.spans("r1").unwrap(), [span("a", ""), span("b", "a"), span("c", "a")]);
        assert!(s.spans("r2").unwrap().is_empty());
        let runs = s.runs(&all(10)).unwrap();
        assert_eq!(runs.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["r2", "r1"], "newest first");
        assert_eq!(s.runs(&all(1)).unwrap().len(), 1);
        let skipping = |skip, limit| s.runs(&RunFilter { skip, ..all(limit) }).unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!((skipping(1, 10), skipping(1, 1), skipping(2, 10)), (vec!["r1".to_string()], vec!["r1".to_string()], vec![]), "the newest passed over");
        assert_eq!(s.runs(&RunFilter { job: Some("build"), ..all(10) }).unwrap().len(), 1);
        let r1 = s.run("r1").unwrap().unwrap();
        assert_eq!((r1.outcome.as_deref(), r1.finished_ms, r1.job.as_str(), r1.pipeline.as_str()), (Some("succeeded"), Some(30), "build", "ci"));
        assert_eq!(s.run("r2").unwrap().unwrap().outcome, None);
        assert!(s.run("nope").unwrap().is_none());
        let steps = s.steps("r1").unwrap();
        assert_eq!(steps.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["compile", "agent"]);
        assert_eq!(steps[1].tokens, Some(12));
        let logs = s.logs("r1").unwrap();
        assert_eq!(logs.iter().map(|l| (l.line.as_str(), l.stderr)).collect::<Vec<_>>(), [("ok", false), ("warn", true), ("…", false)]);
        assert_eq!(logs[2].omitted, omitted, "the omission travels with its line");
        s.record_event("r1", "started", "compile", "").unwrap();
        s.record_event("r1", "ended", "compile", "succeeded").unwrap();
        s.record_events("r1", &[RunEvent::now("stdout", "compile", "line 1"), RunEvent { at_ms: 7, ..RunEvent::now("stderr", "compile", "line 2") }]).unwrap();
        let events = s.events("r1").unwrap();
        assert_eq!(events.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), ["started", "ended", "stdout", "stderr"]);
        assert!(events[0].at_ms > 0, "stamped");
        assert_eq!((events[3].at_ms, events[3].message.as_str()), (7, "line 2"));
        assert_eq!(s.events_after("r1", 2).unwrap(), events[2..], "a follower's next events");
        assert!(s.events_after("r1", 4).unwrap().is_empty());
        assert!(s.events_after("r1", 99).unwrap().is_empty());
        let a = s.request_approval(&ci, "r1", "build", "Ship it?", 40, 50).unwrap();
        let b = s.request_approval(&ci, "r2", "test", "Again?", 41, 51).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.pending_approvals(None, None).unwrap().iter().map(|p| p.id).collect::<Vec<_>>(), [a, b]);
        assert!(s.decide_approval(a, false, "not today", "ana").unwrap());
        assert!(!s.decide_approval(a, true, "", "bo").unwrap(), "re-deciding is refused");
        assert!(!s.decide_approval(9999, true, "", "bo").unwrap(), "deciding nothing is refused");
        let rec = s.approval(a).unwrap().unwrap();
        assert_eq!((rec.decision.as_deref(), rec.reason.as_str(), rec.approver.as_str(), rec.message.as_str(), rec.pipeline.as_str()), (Some("rejected"), "not today", "ana", "Ship it?", "ci"));
        assert_eq!(s.pending_approvals(None, None).unwrap().len(), 1);
        // Questions: filed once per run and text+options; settled once.
        let q = QuestionRecord { team: ci.team.clone(), pipeline: ci.pipeline.clone(), run_id: "r1".into(), job: "build".into(), agent: "writer".into(), question: "Which bump?".into(), options: vec!["minor".into(), "patch".into()], asked_ms: 60, deadline_ms: 0, ..Default::default() };
        let (first, filed) = s.ask_question(&q).unwrap();
        assert!(filed && first.pending() && first.id > 0);
        let (again, filed) = s.ask_question(&q).unwrap();
        assert_eq!((again.id, filed), (first.id, false), "the run asked it already");
        let (other_options, filed) = s.ask_question(&QuestionRecord { options: vec![], ..q.clone() }).unwrap();
        assert!(filed && other_options.id != first.id, "other options are another question");
        let (other_run, filed) = s.ask_question(&QuestionRecord { run_id: "r2".into(), ..q.clone() }).unwrap();
        assert!(filed && other_run.id != first.id, "the memo is per run");
        assert_eq!(s.pending_questions(None, Some("ci")).unwrap().iter().map(|q| q.id).collect::<Vec<_>>(), [first.id, other_options.id, other_run.id]);
        assert!(s.pending_questions(Some("other-team"), None).unwrap().is_empty());
        assert!(s.settle_question(first.id, Some("minor"), "person:ana", 65).unwrap());
        assert!(!s.settle_question(first.id, Some("patch"), "person:bo", 66).unwrap(), "answering twice is refused");
        assert!(!s.settle_question(9999, Some("x"), "person:bo", 66).unwrap());
        let got = s.question(first.id).unwrap().unwrap();
        assert_eq!((got.answer.as_deref(), got.source.as_str(), got.answered_ms, got.options.len(), got.agent.as_str()), (Some("minor"), "person:ana", Some(65), 2, "writer"));
        assert_eq!(s.ask_question(&q).unwrap().0.answer.as_deref(), Some("minor"), "an answered question is remembered in its run");
        assert!(s.settle_question(other_run.id, None, "expired", 80).unwrap());
        let (fresh, filed) = s.ask_question(&QuestionRecord { run_id: "r2".into(), ..q.clone() }).unwrap();
        assert!(filed && fresh.id != other_run.id, "an expired question is asked again");
        assert!(s.question(9999).unwrap().is_none());
        let (stale, _) = s.ask_question(&QuestionRecord { run_id: "r3".into(), deadline_ms: 1, ..q.clone() }).unwrap();
        assert!(!s.pending_questions(None, None).unwrap().iter().any(|p| p.id == stale.id), "past its deadline, nobody is waiting on it");
        let v = |n: &str| serde_json::json!({"ref": n, "n": 1});
        s.record_versions(&ci, "repo", &[v("a"), v("b")]).unwrap();
        s.record_versions(&ci, "repo", &[serde_json::json!({"n": 1, "ref": "b"}), v("c")]).unwrap();
        assert_eq!(s.history(&ci, "repo").unwrap(), vec![v("a"), v("b"), v("c")], "first-seen order; key order does not matter");
        s.record_green(&ci, "build", "repo", &v("b")).unwrap();
        s.record_green(&ci, "build", "repo", &v("b")).unwrap();
        assert_eq!(s.green(&ci, "build", "repo").unwrap(), vec![v("b")]);
        assert!(s.green(&ci, "test", "repo").unwrap().is_empty());
        s.record_taken(&ci, "build", "repo", &v("a")).unwrap();
        assert_eq!(s.taken(&ci, "build", "repo").unwrap(), vec![v("a")]);
        assert_eq!(s.green(&ci, "build", "repo").unwrap(), vec![v("b")], "taken is not passed");
        s.record_versions(&ci, "repo", &[v("d")]).unwrap();
        s.record_green(&ci, "build", "repo", &v("a")).unwrap();
        s.forget_versions(&ci, "repo", &[v("a"), v("c")], &["build".to_string()]).unwrap();
        assert_eq!(s.history(&ci, "repo").unwrap(), vec![v("b"), v("d")], "forgotten versions leave the history, the order stays");
        assert_eq!(s.green(&ci, "build", "repo").unwrap(), vec![v("b")], "and their passed: records go");
        assert_eq!(s.value(&ci, "queue").unwrap(), None);
        s.set_value(&ci, "queue", Some("[1]")).unwrap();
        s.set_value(&ci, "queue", Some("[1,2]")).unwrap();
        assert_eq!(s.value(&ci, "queue").unwrap().as_deref(), Some("[1,2]"));
        assert_eq!(s.value(&Scope::new("other", "ci"), "queue").unwrap(), None, "a value is its scope's");
        s.set_value(&ci, "queue", None).unwrap();
        assert_eq!(s.value(&ci, "queue").unwrap(), None);
        assert!(!s.chain_succeeded(&ci, "build", "abc").unwrap());
        s.record_chain(&ci, "build", "abc").unwrap();
        s.record_chain(&ci, "build", "abc").unwrap();
        assert!(s.chain_succeeded(&ci, "build", "abc").unwrap());
        assert!(!s.chain_succeeded(&ci, "test", "abc").unwrap(), "a chain is its job's");
        assert!(!s.chain_succeeded(&Scope::new("other", "ci"), "build", "abc").unwrap(), "and its scope's");
        // Chains arrive in the hub's batches too, and are asked for many at once.
        s.record_batch(&Batch { chains: vec![(ci.clone(), "build".into(), "def".into()), (ci.clone(), "test".into(), "ghi".into())], ..Default::default() }).unwrap();
        let asked: Vec<String> = ["abc", "def", "ghi", "nope"].map(String::from).to_vec();
        let mut found: Vec<String> = s.chains_succeeded(&ci, "build", &asked).unwrap().into_iter().collect();
        found.sort();
        assert_eq!(found, ["abc", "def"], "the job's own chains among those asked");
        assert!(s.chains_succeeded(&ci, "build", &[]).unwrap().is_empty());
        // A run whose start the backend lost is still recorded when it finishes.
        s.finish_run(&RunRecord { finished_ms: Some(6), outcome: Some("failed".into()), message: "m".into(), ..run("r0", &ci, "lost", 5) }).unwrap();
        assert_eq!(s.run("r0").unwrap().map(|r| (r.job, r.outcome)), Some(("lost".into(), Some("failed".into()))));
        assert_eq!(s.runs(&RunFilter { job: Some("lost"), ..all(10) }).unwrap().len(), 1);
        let r0 = s.run("r0").unwrap().expect("r0");
        s.record_event("r0", "note", "", "kept until the run goes").unwrap();
        s.delete_run(&r0).unwrap();
        assert!(s.run("r0").unwrap().is_none() && s.events("r0").unwrap().is_empty(), "a deleted run goes with its events");
        assert!(s.runs(&RunFilter { job: Some("lost"), ..all(10) }).unwrap().is_empty(), "and from every listing");
        scopes_keep_apart(s);
        orphans_are_found(s);
        spending_adds_up(s);
        // The hub's batches: two runs' records at once, each run's in order.
        let step = |run: &str, seq: i64| StepRecord { run_id: run.into(), seq, name: format!("s{seq}"), outcome: "succeeded".into(), message: String::new(), duration_ms: 1, exit_code: Some(0), tokens: None, detail: None };
        s.record_batch(&Batch {
            events: vec![("rb".into(), RunEvent::now("started", "s0", "")), ("rc".into(), RunEvent::now("note", "", "x")), ("rb".into(), RunEvent::now("ended", "s0", "succeeded"))],
            logs: vec![("rb".into(), LogLine::new("s0", false, "one")), ("rb".into(), LogLine::new("s0", true, "two"))],
            steps: vec![step("rb", 0), step("rc", 0), step("rb", 1)],
            spans: vec![("rb".into(), vec![span("d", "")]), ("rb".into(), vec![span("e", "d"), span("f", "d")]), ("rb".into(), vec![])],
            chains: Vec::new(),
        })
        .unwrap();
        assert_eq!(s.steps("rb").unwrap(), [step("rb", 0), step("rb", 1)]);
        assert_eq!(s.events("rb").unwrap().iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(), ["started", "ended"]);
        assert_eq!(s.events("rc").unwrap().len(), 1);
        assert_eq!(s.logs("rb").unwrap().iter().map(|l| l.line.as_str()).collect::<Vec<_>>(), ["one", "two"]);
        assert_eq!(s.spans("rb").unwrap(), [span("d", ""), span("e", "d"), span("f", "d")]);
        assert_eq!(s.steps("rc").unwrap(), [step("rc", 0)]);
        s.record_batch(&Batch::default()).unwrap();
    }

    /// Spending counters add exactly, whoever adds at the same time.
    fn spending_adds_up(s: &dyn Store) {
        assert_eq!(s.add_spend("r1:job", 0).unwrap(), 0);
        std::thread::scope(|t| {
            for _ in 0..4 {
                t.spawn(|| {
                    for _ in 0..25 {
                        s.add_spend("r1:job", 10).unwrap();
                    }
                });
            }
        });
        assert_eq!(s.add_spend("r1:job", 0).unwrap(), 1000);
        assert_eq!(s.add_spend("r1:job", 5).unwrap(), 1005);
        assert_eq!(s.add_spend("r2:job", 7).unwrap(), 7, "counters are apart");
    }

    /// A run whose owner stopped its heartbeat is an orphan; one whose owner
    /// lives, or that finished, is not.
    fn orphans_are_found(s: &dyn Store) {
        let sc = Scope::new("", "ghosts");
        s.heartbeat("alive", 1_000, 10_000).unwrap();
        s.heartbeat("dead", 1_000, 10_000).unwrap();
        s.start_run(&RunRecord { owner: "alive".into(), ..run("g1", &sc, "j", 500) }).unwrap();
        s.start_run(&RunRecord { owner: "dead".into(), ..run("g2", &sc, "j", 600) }).unwrap();
        s.start_run(&RunRecord { owner: "dead".into(), ..run("g3", &sc, "j", 700) }).unwrap();
        s.finish_run(&RunRecord { owner: "dead".into(), finished_ms: Some(800), outcome: Some("succeeded".into()), ..run("g3", &sc, "j", 700) }).unwrap();
        // Both alive until 11,000; then only `alive` says so again.
        assert!(s.orphaned_runs(5_000).unwrap().iter().all(|r| r.pipeline != "ghosts"));
        s.heartbeat("alive", 11_000, 10_000).unwrap();
        let orphans: Vec<String> = s.orphaned_runs(12_000).unwrap().into_iter().filter(|r| r.pipeline == "ghosts").map(|r| r.id).collect();
        assert_eq!(orphans, ["g2"]);
        // A run started by an owner that never said anything is an orphan too.
        s.start_run(&RunRecord { owner: "silent".into(), ..run("g4", &sc, "j", 900) }).unwrap();
        assert!(s.orphaned_runs(12_000).unwrap().iter().any(|r| r.id == "g4"));
    }

    /// Two pipelines (and two teams) with the same job and resource names
    /// never see each other's history.
    fn scopes_keep_apart(s: &dyn Store) {
        let (web, web_b, other_team) = (Scope::new("", "web"), Scope::new("", "web-b"), Scope::new("blue", "web"));
        for (i, sc) in [&web, &web_b, &other_team].into_iter().enumerate() {
            let id = format!("w{i}");
            s.start_run(&run(&id, sc, "build", 100 + i as i64)).unwrap();
            s.record_versions(sc, "repo", &[serde_json::json!({"ref": format!("v{i}")})]).unwrap();
            s.record_green(sc, "build", "repo", &serde_json::json!({"ref": format!("v{i}")})).unwrap();
            s.request_approval(sc, &id, "build", "ok?", 100, 200).unwrap();
        }
        let only = |f: RunFilter| s.runs(&f).unwrap().into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(only(RunFilter { team: Some(""), pipeline: Some("web"), ..all(10) }), ["w0"]);
        assert_eq!(only(RunFilter { team: Some(""), pipeline: Some("web-b"), job: Some("build"), ..all(10) }), ["w1"]);
        assert_eq!(only(RunFilter { team: Some("blue"), ..all(10) }), ["w2"]);
        assert_eq!(only(RunFilter { pipeline: Some("web"), ..all(10) }), ["w2", "w0"], "an admin sees both teams' web");
        assert_eq!(only(RunFilter { pipeline: Some("web"), skip: 1, ..all(10) }), ["w0"], "skipping counts only the runs admitted");
        assert_eq!(only(RunFilter { team: Some(""), pipeline: Some("web-b"), job: Some("build"), skip: 1, ..all(10) }), Vec::<String>::new());
        for (i, sc) in [&web, &web_b, &other_team].into_iter().enumerate() {
            let want = serde_json::json!({"ref": format!("v{i}")});
            assert_eq!(s.history(sc, "repo").unwrap(), vec![want.clone()], "{sc:?}");
            assert_eq!(s.green(sc, "build", "repo").unwrap(), vec![want], "{sc:?}");
        }
        let pending = |t: Option<&str>, p: Option<&str>| s.pending_approvals(t, p).unwrap().into_iter().map(|a| a.run_id).collect::<Vec<_>>();
        assert_eq!(pending(Some("blue"), None), ["w2"]);
        assert_eq!(pending(Some(""), Some("web")), ["w0"]);
        let mut ps: Vec<(String, String, String)> = s.pipelines(None).unwrap().into_iter().map(|p| (p.team, p.pipeline, p.last.id)).collect();
        ps.sort();
        assert_eq!(ps, [("".into(), "ci".into(), "r2".into()), ("".into(), "web".into(), "w0".into()), ("".into(), "web-b".into(), "w1".into()), ("blue".into(), "web".into(), "w2".into())]);
        assert_eq!(s.pipelines(Some("blue")).unwrap().len(), 1);
    }
}
