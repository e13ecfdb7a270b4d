//! Store records (runs, steps, log lines, events, approvals, questions) ↔ the `steppe.v1` messages of history.proto.

use steppe_proto::v1;

use crate::store::{ApprovalRecord, LogLine, Omitted, PipelineSummary, QuestionRecord, RunEvent, RunRecord, StepRecord};

pub fn run_to_wire(r: RunRecord) -> v1::RunRecord {
    // Which process runs it stays with the store.
    let RunRecord { id, team, pipeline, job, started_ms, finished_ms, outcome, message, owner: _ } = r;
    v1::RunRecord { id, team, pipeline, job, started_ms, finished_ms, outcome, message }
}

pub fn run_from_wire(r: v1::RunRecord) -> RunRecord {
    let v1::RunRecord { id, team, pipeline, job, started_ms, finished_ms, outcome, message } = r;
    RunRecord { id, team, pipeline, job, started_ms, finished_ms, outcome, message, owner: String::new() }
}

pub fn pipeline_to_wire(p: PipelineSummary) -> v1::PipelineSummary {
    v1::PipelineSummary { team: p.team, pipeline: p.pipeline, last: Some(run_to_wire(p.last)) }
}

/// A summary without its run is none (it only exists for its run).
pub fn pipeline_from_wire(p: v1::PipelineSummary) -> Option<PipelineSummary> {
    Some(PipelineSummary { team: p.team, pipeline: p.pipeline, last: run_from_wire(p.last?) })
}

pub fn step_to_wire(s: StepRecord) -> v1::StepRecord {
    let StepRecord { run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail } = s;
    v1::StepRecord { run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail }
}

pub fn step_from_wire(s: v1::StepRecord) -> StepRecord {
    let v1::StepRecord { run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail } = s;
    StepRecord { run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail }
}

pub fn log_to_wire(l: LogLine) -> v1::LogLine {
    let LogLine { step, stderr, line, omitted } = l;
    v1::LogLine {
        step,
        stderr,
        line,
        omitted: omitted.map(|Omitted { full, head, lines, bytes, tail }| v1::Omitted { full, head, lines, bytes, tail }),
    }
}

pub fn log_from_wire(l: v1::LogLine) -> LogLine {
    let v1::LogLine { step, stderr, line, omitted } = l;
    LogLine {
        step,
        stderr,
        line,
        omitted: omitted.map(|v1::Omitted { full, head, lines, bytes, tail }| Omitted { full, head, lines, bytes, tail }),
    }
}

pub fn event_to_wire(e: RunEvent) -> v1::RunEventRecord {
    let RunEvent { at_ms, kind, step, message } = e;
    v1::RunEventRecord { kind, step, message, at_ms }
}

pub fn event_from_wire(e: v1::RunEventRecord) -> RunEvent {
    let v1::RunEventRecord { kind, step, message, at_ms } = e;
    RunEvent { at_ms, kind, step, message }
}

pub fn approval_to_wire(a: ApprovalRecord) -> v1::ApprovalRecord {
    let ApprovalRecord { id, team, pipeline, run_id, job, message, requested_ms, deadline_ms, decision, reason, approver } = a;
    v1::ApprovalRecord { id, team, pipeline, run_id, job, message, requested_ms, deadline_ms, decision, reason, approver }
}

pub fn approval_from_wire(a: v1::ApprovalRecord) -> ApprovalRecord {
    let v1::ApprovalRecord { id, team, pipeline, run_id, job, message, requested_ms, deadline_ms, decision, reason, approver } = a;
    ApprovalRecord { id, team, pipeline, run_id, job, message, requested_ms, deadline_ms, decision, reason, approver }
}

pub fn question_to_wire(q: QuestionRecord) -> v1::QuestionRecord {
    let QuestionRecord { id, team, pipeline, run_id, job, agent, question, options, asked_ms, deadline_ms, answer, source, answered_ms } = q;
    v1::QuestionRecord { id, team, pipeline, run_id, job, agent, question, options, asked_ms, deadline_ms, answer, source, answered_ms }
}

pub fn question_from_wire(q: v1::QuestionRecord) -> QuestionRecord {
    let v1::QuestionRecord { id, team, pipeline, run_id, job, agent, question, options, asked_ms, deadline_ms, answer, source, answered_ms } = q;
    QuestionRecord { id, team, pipeline, run_id, job, agent, question, options, asked_ms, deadline_ms, answer, source, answered_ms }
}

/// What a reply holds, for a message saying it was not what was asked for.
pub fn reply_kind(r: &v1::history_reply::Reply) -> &'static str {
    use v1::history_reply::Reply;
    match r {
        Reply::Runs(_) => "runs",
        Reply::Run(_) => "a run",
        Reply::Steps(_) => "steps",
        Reply::Logs(_) => "logs",
        Reply::Events(_) => "events",
        Reply::Approval(_) => "an approval",
        Reply::Approvals(_) => "approvals",
        Reply::Pipelines(_) => "pipelines",
        Reply::Spans(_) => "spans",
        Reply::Question(_) => "a question",
        Reply::Questions(_) => "questions",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::through_bytes;

    #[test]
    fn records_round_trip() {
        for r in [
            RunRecord { id: "r1".into(), team: "blue".into(), pipeline: "web".into(), job: "build".into(), started_ms: 10, finished_ms: Some(30), outcome: Some("failed".into()), message: "m".into(), owner: String::new() },
            RunRecord { id: "r2".into(), team: String::new(), pipeline: String::new(), job: "j".into(), started_ms: -1, finished_ms: None, outcome: None, message: String::new(), owner: String::new() },
        ] {
            assert_eq!(run_from_wire(through_bytes(run_to_wire(r.clone()))), r);
        }
        for s in [
            StepRecord { run_id: "r".into(), seq: 3, name: "agent".into(), outcome: "failed".into(), message: "no".into(), duration_ms: 7, exit_code: Some(-1), tokens: Some(12), detail: Some("{\"verdict\":null}".into()) },
            StepRecord { run_id: "r".into(), seq: 0, name: "c".into(), outcome: "succeeded".into(), message: String::new(), duration_ms: 0, exit_code: None, tokens: None, detail: Some(String::new()) },
            StepRecord { run_id: "r".into(), seq: 0, name: "c".into(), outcome: "succeeded".into(), message: String::new(), duration_ms: 0, exit_code: Some(0), tokens: Some(0), detail: None },
        ] {
            assert_eq!(step_from_wire(through_bytes(step_to_wire(s.clone()))), s);
        }
        for l in [
            LogLine::new("s", true, "warn"),
            LogLine { omitted: Some(Omitted { full: "f".repeat(64), head: 1, lines: 10, bytes: 100, tail: 0 }), ..LogLine::new("s", false, "…") },
            LogLine { omitted: Some(Omitted { full: String::new(), head: 0, lines: 0, bytes: 0, tail: 0 }), ..LogLine::new("s", false, "") },
        ] {
            assert_eq!(log_from_wire(through_bytes(log_to_wire(l.clone()))), l);
        }
        let e = RunEvent { at_ms: 17, ..RunEvent::now("ended", "compile", "succeeded") };
        assert_eq!(event_from_wire(through_bytes(event_to_wire(e.clone()))), e);
        for a in [
            ApprovalRecord { id: 4, team: "blue".into(), pipeline: "web".into(), run_id: "r".into(), job: "j".into(), message: "Ship?".into(), requested_ms: 40, deadline_ms: 50, decision: Some("rejected".into()), reason: "no".into(), approver: "ana".into() },
            ApprovalRecord { id: 5, team: String::new(), pipeline: String::new(), run_id: "r".into(), job: "j".into(), message: String::new(), requested_ms: 0, deadline_ms: 0, decision: None, reason: String::new(), approver: String::new() },
        ] {
            assert_eq!(approval_from_wire(through_bytes(approval_to_wire(a.clone()))), a);
        }
        for q in [
            QuestionRecord { id: 3, team: "blue".into(), pipeline: "web".into(), run_id: "r".into(), job: "j".into(), agent: "writer".into(), question: "Which?".into(), options: vec!["a".into(), "b".into()], asked_ms: 5, deadline_ms: 9, answer: Some("a".into()), source: "person:ana".into(), answered_ms: Some(7) },
            QuestionRecord { id: 4, run_id: "r".into(), question: "Why?".into(), ..Default::default() },
            QuestionRecord { id: 5, answer: Some(String::new()), source: "expired".into(), answered_ms: Some(0), ..Default::default() },
        ] {
            assert_eq!(question_from_wire(through_bytes(question_to_wire(q.clone()))), q);
        }
        let last = RunRecord { id: "r9".into(), team: "blue".into(), pipeline: "web".into(), job: "j".into(), started_ms: 1, finished_ms: None, outcome: None, message: String::new(), owner: String::new() };
        let p = PipelineSummary { team: "blue".into(), pipeline: "web".into(), last };
        assert_eq!(pipeline_from_wire(through_bytes(pipeline_to_wire(p.clone()))), Some(p));
        assert_eq!(pipeline_from_wire(v1::PipelineSummary::default()), None);
    }

    #[test]
    fn a_missing_record_is_told_apart_from_a_present_one() {
        use v1::history_reply::Reply;
        let none = v1::HistoryReply { reply: Some(Reply::Run(v1::FoundRun { run: None })) };
        let some = v1::HistoryReply { reply: Some(Reply::Run(v1::FoundRun { run: Some(v1::RunRecord::default()) })) };
        assert!(matches!(through_bytes(none).reply, Some(Reply::Run(v1::FoundRun { run: None }))));
        assert!(matches!(through_bytes(some).reply, Some(Reply::Run(v1::FoundRun { run: Some(_) }))));
        let none = v1::HistoryReply { reply: Some(Reply::Approval(v1::FoundApproval { approval: None })) };
        assert!(matches!(through_bytes(none).reply, Some(Reply::Approval(v1::FoundApproval { approval: None }))));
    }
}
