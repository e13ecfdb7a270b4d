//! A [`Store`] whose history writes survive an outage of its backend: a
//! write the backend cannot take now (Redis restarting, the network cut) is
//! kept, in order, and delivered before anything else once the backend
//! answers again. Writes that must answer at once (an approval's id, a
//! decision) and reads pass straight through. The outage is said once.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{ApprovalRecord, QuestionRecord, LogLine, PipelineSummary, RunEvent, RunFilter, RunRecord, Scope, StepRecord, Store, StoreError};

/// The most kept while the backend is away (bytes, about); more is refused.
const KEPT_MAX: usize = 64 << 20;

enum Write {
    StartRun(RunRecord),
    FinishRun(RunRecord),
    Step(StepRecord),
    Logs(String, Vec<LogLine>),
    Spans(String, Vec<crate::trace::SpanRecord>),
    Events(String, Vec<RunEvent>),
    Versions(Scope, String, Vec<serde_json::Value>),
    Green(Scope, String, String, serde_json::Value),
    Chain(Scope, String, String),
    Batch(super::Batch),
    Value(Scope, String, Option<String>),
    Forget(Scope, String, Vec<serde_json::Value>, Vec<String>),
    DeleteRun(RunRecord),
}

impl Write {
    /// About how much memory it takes.
    fn weight(&self) -> usize {
        64 + match self {
            Write::Logs(_, lines) => lines.iter().map(|l| l.line.len() + l.step.len() + 32).sum(),
            Write::Spans(_, spans) => spans.iter().map(|s| 128 + s.name.len() + s.attributes.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()).sum(),
            Write::Step(s) => s.message.len() + s.detail.as_ref().map_or(0, String::len),
            Write::FinishRun(r) => r.message.len(),
            Write::Events(_, events) => events.iter().map(|e| 48 + e.step.len() + e.message.len()).sum(),
            Write::Versions(_, _, v) => v.iter().map(|x| x.to_string().len()).sum(),
            Write::Value(_, _, v) => v.as_ref().map_or(0, String::len),
            Write::Forget(_, _, v, _) => v.iter().map(|x| x.to_string().len()).sum(),
            Write::Batch(b) => {
                b.events.iter().map(|(_, e)| 48 + e.step.len() + e.message.len()).sum::<usize>()
                    + b.logs.iter().map(|(_, l)| l.line.len() + l.step.len() + 32).sum::<usize>()
                    + b.steps.iter().map(|s| 64 + s.message.len() + s.detail.as_ref().map_or(0, String::len)).sum::<usize>()
                    + b.spans.iter().flat_map(|(_, s)| s).map(|s| 128 + s.name.len() + s.attributes.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()).sum::<usize>()
                    + b.chains.len() * 96
            }
            Write::StartRun(..) | Write::Green(..) | Write::Chain(..) | Write::DeleteRun(..) => 0,
        }
    }
}

pub struct Outbox<S> {
    inner: S,
    /// The writes waiting, and their weight.
    kept: Mutex<(VecDeque<Write>, usize)>,
}

impl<S: Store> Outbox<S> {
    pub fn new(inner: S) -> Self {
        Outbox { inner, kept: Mutex::new((VecDeque::new(), 0)) }
    }

    fn apply(&self, w: &Write) -> Result<(), StoreError> {
        match w {
            Write::StartRun(r) => self.inner.start_run(r),
            Write::FinishRun(r) => self.inner.finish_run(r),
            Write::Step(s) => self.inner.record_step(s),
            Write::Logs(r, l) => self.inner.append_logs(r, l),
            Write::Spans(r, s) => self.inner.add_spans(r, s),
            Write::Events(r, e) => self.inner.record_events(r, e),
            Write::Versions(sc, r, v) => self.inner.record_versions(sc, r, v),
            Write::Green(sc, j, r, v) => self.inner.record_green(sc, j, r, v),
            Write::Chain(sc, j, h) => self.inner.record_chain(sc, j, h),
            Write::Batch(b) => self.inner.record_batch(b),
            Write::Value(sc, k, v) => self.inner.set_value(sc, k, v.as_deref()),
            Write::Forget(sc, r, v, j) => self.inner.forget_versions(sc, r, v, j),
            Write::DeleteRun(r) => self.inner.delete_run(r),
        }
    }

    /// Delivers what was kept, oldest first; stops at the first that fails.
    fn drain(&self, kept: &mut (VecDeque<Write>, usize)) -> Result<(), StoreError> {
        while let Some(w) = kept.0.front() {
            match self.apply(w) {
                Ok(()) => {}
                Err(e @ StoreError::Unavailable { .. }) => return Err(e),
                // The backend is back but refuses this one: it would block the rest.
                Err(e) => eprintln!("steppe: a kept history write was refused and dropped: {e}"),
            }
            if let Some(w) = kept.0.pop_front() {
                kept.1 -= w.weight();
            }
        }
        if let Some(l) = crate::outage::recovered("the history store") {
            eprintln!("steppe: {l}");
        }
        Ok(())
    }

    /// Writes now, after whatever waits; keeps it if the backend is away.
    fn write(&self, w: Write) -> Result<(), StoreError> {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let r = if kept.0.is_empty() { self.apply(&w) } else { self.drain(&mut kept).and_then(|()| self.apply(&w)) };
        match r {
            Ok(()) => Ok(()),
            Err(e @ StoreError::Unavailable { .. }) => {
                if let Some(l) = crate::outage::failed("the history store", &format!("{e}; keeping its writes until it is back")) {
                    eprintln!("steppe: {l}");
                }
                if kept.1 + w.weight() > KEPT_MAX {
                    return Err(e);
                }
                kept.1 += w.weight();
                kept.0.push_back(w);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Reads see what was written: what waits goes first (if it can).
    fn settle(&self) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if !kept.0.is_empty() {
            let _ = self.drain(&mut kept);
        }
    }
}

impl<S: Store> Store for Outbox<S> {
    fn start_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.write(Write::StartRun(rec.clone()))
    }
    fn finish_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.write(Write::FinishRun(rec.clone()))
    }
    fn record_step(&self, s: &StepRecord) -> Result<(), StoreError> {
        self.write(Write::Step(s.clone()))
    }
    fn record_batch(&self, b: &super::Batch) -> Result<(), StoreError> {
        {
            // Nothing waiting: written as it is, copied only to be kept.
            let kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            if kept.0.is_empty() {
                match self.inner.record_batch(b) {
                    Err(StoreError::Unavailable { .. }) => {}
                    done => return done,
                }
            }
        }
        self.write(Write::Batch(b.clone()))
    }
    fn append_logs(&self, run_id: &str, lines: &[LogLine]) -> Result<(), StoreError> {
        self.write(Write::Logs(run_id.into(), lines.to_vec()))
    }
    fn add_spans(&self, run_id: &str, spans: &[crate::trace::SpanRecord]) -> Result<(), StoreError> {
        self.write(Write::Spans(run_id.into(), spans.to_vec()))
    }
    fn record_events(&self, run_id: &str, events: &[RunEvent]) -> Result<(), StoreError> {
        self.write(Write::Events(run_id.into(), events.to_vec()))
    }
    fn record_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value]) -> Result<(), StoreError> {
        self.write(Write::Versions(scope.clone(), resource.into(), versions.to_vec()))
    }
    fn record_green(&self, scope: &Scope, job: &str, resource: &str, version: &serde_json::Value) -> Result<(), StoreError> {
        self.write(Write::Green(scope.clone(), job.into(), resource.into(), version.clone()))
    }
    fn runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        self.settle();
        self.inner.runs(f)
    }
    fn pipelines(&self, team: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError> {
        self.settle();
        self.inner.pipelines(team)
    }
    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.settle();
        self.inner.run(id)
    }
    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.settle();
        self.inner.steps(run_id)
    }
    fn logs(&self, run_id: &str) -> Result<Vec<LogLine>, StoreError> {
        self.settle();
        self.inner.logs(run_id)
    }
    fn spans(&self, run_id: &str) -> Result<Vec<crate::trace::SpanRecord>, StoreError> {
        self.settle();
        self.inner.spans(run_id)
    }
    fn events_after(&self, run_id: &str, after: usize) -> Result<Vec<RunEvent>, StoreError> {
        self.settle();
        self.inner.events_after(run_id, after)
    }
    fn request_approval(&self, scope: &Scope, run_id: &str, job: &str, message: &str, requested_ms: i64, deadline_ms: i64) -> Result<i64, StoreError> {
        self.settle();
        self.inner.request_approval(scope, run_id, job, message, requested_ms, deadline_ms)
    }
    fn approval(&self, id: i64) -> Result<Option<ApprovalRecord>, StoreError> {
        self.inner.approval(id)
    }
    fn pending_approvals(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.inner.pending_approvals(team, pipeline)
    }
    fn add_spend(&self, counter: &str, tokens: u64) -> Result<u64, StoreError> {
        // A total is needed now: not kept for later.
        self.inner.add_spend(counter, tokens)
    }
    fn heartbeat(&self, owner: &str, now_ms: i64, ttl_ms: i64) -> Result<(), StoreError> {
        // Only worth saying when it is heard: not kept for later.
        self.inner.heartbeat(owner, now_ms, ttl_ms)
    }
    fn orphaned_runs(&self, now_ms: i64) -> Result<Vec<RunRecord>, StoreError> {
        // Not while this process's own writes wait: its finished runs may be among them.
        self.settle();
        if !self.kept.lock().unwrap_or_else(|p| p.into_inner()).0.is_empty() {
            return Ok(Vec::new());
        }
        self.inner.orphaned_runs(now_ms)
    }
    fn decide_approval(&self, id: i64, approved: bool, reason: &str, approver: &str) -> Result<bool, StoreError> {
        self.inner.decide_approval(id, approved, reason, approver)
    }
    fn ask_question(&self, q: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError> {
        // Its id is needed now: not kept for later.
        self.inner.ask_question(q)
    }
    fn question(&self, id: i64) -> Result<Option<QuestionRecord>, StoreError> {
        self.inner.question(id)
    }
    fn pending_questions(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError> {
        self.inner.pending_questions(team, pipeline)
    }
    fn settle_question(&self, id: i64, answer: Option<&str>, source: &str, at_ms: i64) -> Result<bool, StoreError> {
        self.inner.settle_question(id, answer, source, at_ms)
    }
    fn history(&self, scope: &Scope, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        self.settle();
        self.inner.history(scope, resource)
    }
    fn green(&self, scope: &Scope, job: &str, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        self.settle();
        self.inner.green(scope, job, resource)
    }
    fn record_chain(&self, scope: &Scope, job: &str, hash: &str) -> Result<(), StoreError> {
        self.write(Write::Chain(scope.clone(), job.into(), hash.into()))
    }
    fn forget_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value], jobs: &[String]) -> Result<(), StoreError> {
        self.write(Write::Forget(scope.clone(), resource.into(), versions.to_vec(), jobs.to_vec()))
    }
    fn delete_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.write(Write::DeleteRun(run.clone()))
    }
    fn set_value(&self, scope: &Scope, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        self.write(Write::Value(scope.clone(), key.into(), value.map(str::to_string)))
    }
    fn value(&self, scope: &Scope, key: &str) -> Result<Option<String>, StoreError> {
        self.settle();
        self.inner.value(scope, key)
    }
    fn chain_succeeded(&self, scope: &Scope, job: &str, hash: &str) -> Result<bool, StoreError> {
        self.settle();
        self.inner.chain_succeeded(scope, job, hash)
    }
    fn chains_succeeded(&self, scope: &Scope, job: &str, hashes: &[String]) -> Result<std::collections::HashSet<String>, StoreError> {
        self.settle();
        self.inner.chains_succeeded(scope, job, hashes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A store that is down while `down` is set, recording what it took.
    #[derive(Default)]
    struct Flaky {
        down: AtomicBool,
        events: Mutex<Vec<String>>,
    }

    impl Flaky {
        fn up(&self) -> Result<(), StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable { url: "redis://x".into(), message: "refused".into() });
            }
            Ok(())
        }
    }

    impl Store for Flaky {
        fn start_run(&self, _: &RunRecord) -> Result<(), StoreError> { self.up() }
        fn finish_run(&self, _: &RunRecord) -> Result<(), StoreError> { self.up() }
        fn record_step(&self, _: &StepRecord) -> Result<(), StoreError> { self.up() }
        fn append_logs(&self, _: &str, _: &[LogLine]) -> Result<(), StoreError> { self.up() }
        fn runs(&self, _: &RunFilter) -> Result<Vec<RunRecord>, StoreError> { Ok(vec![]) }
        fn pipelines(&self, _: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError> { Ok(vec![]) }
        fn run(&self, _: &str) -> Result<Option<RunRecord>, StoreError> { Ok(None) }
        fn steps(&self, _: &str) -> Result<Vec<StepRecord>, StoreError> { Ok(vec![]) }
        fn logs(&self, _: &str) -> Result<Vec<LogLine>, StoreError> { Ok(vec![]) }
        fn add_spans(&self, _: &str, _: &[crate::trace::SpanRecord]) -> Result<(), StoreError> { self.up() }
        fn spans(&self, _: &str) -> Result<Vec<crate::trace::SpanRecord>, StoreError> { Ok(vec![]) }
        fn record_events(&self, _: &str, events: &[RunEvent]) -> Result<(), StoreError> {
            self.up()?;
            self.events.lock().unwrap().extend(events.iter().map(|e| e.kind.clone()));
            Ok(())
        }
        fn events_after(&self, _: &str, after: usize) -> Result<Vec<RunEvent>, StoreError> {
            Ok(self.events.lock().unwrap().iter().skip(after).map(|k| RunEvent::now(k, "", "")).collect())
        }
        fn request_approval(&self, _: &Scope, _: &str, _: &str, _: &str, _: i64, _: i64) -> Result<i64, StoreError> { self.up().map(|()| 1) }
        fn approval(&self, _: i64) -> Result<Option<ApprovalRecord>, StoreError> { Ok(None) }
        fn pending_approvals(&self, _: Option<&str>, _: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> { Ok(vec![]) }
        fn decide_approval(&self, _: i64, _: bool, _: &str, _: &str) -> Result<bool, StoreError> { self.up().map(|()| true) }
        fn ask_question(&self, q: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError> { self.up().map(|()| (q.clone(), true)) }
        fn question(&self, _: i64) -> Result<Option<QuestionRecord>, StoreError> { Ok(None) }
        fn pending_questions(&self, _: Option<&str>, _: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError> { Ok(vec![]) }
        fn settle_question(&self, _: i64, _: Option<&str>, _: &str, _: i64) -> Result<bool, StoreError> { self.up().map(|()| true) }
        fn heartbeat(&self, _: &str, _: i64, _: i64) -> Result<(), StoreError> { self.up() }
        fn add_spend(&self, _: &str, _: u64) -> Result<u64, StoreError> { self.up().map(|()| 0) }
        fn orphaned_runs(&self, _: i64) -> Result<Vec<RunRecord>, StoreError> { Ok(vec![]) }
        fn record_versions(&self, _: &Scope, _: &str, _: &[serde_json::Value]) -> Result<(), StoreError> { self.up() }
        fn history(&self, _: &Scope, _: &str) -> Result<Vec<serde_json::Value>, StoreError> { Ok(vec![]) }
        fn record_green(&self, _: &Scope, _: &str, _: &str, _: &serde_json::Value) -> Result<(), StoreError> { self.up() }
        fn green(&self, _: &Scope, _: &str, _: &str) -> Result<Vec<serde_json::Value>, StoreError> { Ok(vec![]) }
        fn record_chain(&self, _: &Scope, _: &str, _: &str) -> Result<(), StoreError> { self.up() }
        fn chain_succeeded(&self, _: &Scope, _: &str, _: &str) -> Result<bool, StoreError> { Ok(false) }
        fn set_value(&self, _: &Scope, _: &str, _: Option<&str>) -> Result<(), StoreError> { self.up() }
        fn forget_versions(&self, _: &Scope, _: &str, _: &[serde_json::Value], _: &[String]) -> Result<(), StoreError> { self.up() }
        fn delete_run(&self, _: &RunRecord) -> Result<(), StoreError> { self.up() }
        fn value(&self, _: &Scope, _: &str) -> Result<Option<String>, StoreError> { Ok(None) }
    }

    #[test]
    fn writes_made_while_the_backend_is_away_arrive_in_order_when_it_is_back() {
        let o = Outbox::new(Flaky::default());
        o.record_event("r", "a", "", "").unwrap();
        o.inner.down.store(true, Ordering::SeqCst);
        o.record_event("r", "b", "", "").unwrap();
        o.record_event("r", "c", "", "").unwrap();
        assert!(o.request_approval(&Scope::default(), "r", "j", "m", 0, 1).is_err(), "what must answer now is not kept");
        o.inner.down.store(false, Ordering::SeqCst);
        o.record_event("r", "d", "", "").unwrap();
        let kinds: Vec<String> = o.events("r").unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec!["a", "b", "c", "d"]);
    }

    #[test]
    fn a_batch_written_while_the_backend_is_away_is_kept_whole_and_in_order() {
        let batch = |kinds: &[&str]| super::super::Batch { events: kinds.iter().map(|k| ("r".to_string(), RunEvent::now(k, "", ""))).collect(), ..Default::default() };
        let o = Outbox::new(Flaky::default());
        o.record_batch(&batch(&["a", "b"])).unwrap();
        o.inner.down.store(true, Ordering::SeqCst);
        o.record_batch(&batch(&["c", "d"])).unwrap();
        o.record_event("r", "e", "", "").unwrap();
        assert_eq!(o.inner.events.lock().unwrap().len(), 2, "nothing reaches a backend that is away");
        o.inner.down.store(false, Ordering::SeqCst);
        o.record_batch(&batch(&["f"])).unwrap();
        let kinds: Vec<String> = o.events("r").unwrap().into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec!["a", "b", "c", "d", "e", "f"]);
    }
}
