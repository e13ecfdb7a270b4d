//! The dashboard's pages and the live parts of a run's page, rendered from
//! what the run store holds (runs, steps, events, logs, spans, approvals).

use std::collections::HashMap;

use steppe_runtime::store::{step_states, ApprovalRecord, LogLine, QuestionRecord, RunEvent, RunRecord, StepRecord};
use steppe_runtime::trace::SpanRecord;

use super::html::{badge, esc, url};
use crate::cli::format::{fmt_ms, fmt_time};

fn outcome_of(r: &RunRecord) -> &str {
    r.outcome.as_deref().unwrap_or("running")
}

fn took(r: &RunRecord, now_ms: i64) -> String {
    fmt_ms(r.finished_ms.unwrap_or(now_ms) - r.started_ms)
}

/// The runs list with its filters.
pub fn runs(list: &[(RunRecord, i64, String)], pipeline: &str, job: &str, outcome: &str, now_ms: i64) -> String {
    let opt = |v: &str| format!(r#"<option{}>{}</option>"#, if v == outcome { " selected" } else { "" }, esc(v));
    let outcomes: String = ["", "running", "succeeded", "failed", "errored", "aborted"].iter().map(|v| opt(v)).collect();
    let mut rows = String::new();
    for (r, tokens, cost) in list {
        rows.push_str(&format!(
            r#"<tr><td><a href="/runs/{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class="cost">{}</td></tr>"#,
            url(&r.id),
            esc(&r.id),
            esc(&r.pipeline),
            esc(&r.job),
            badge(outcome_of(r)),
            esc(&fmt_time(r.started_ms)),
            took(r, now_ms),
            if *tokens > 0 { tokens.to_string() } else { "-".into() },
            esc(cost),
        ));
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="8" class="muted">no runs</td></tr>"#.into();
    }
    format!(
        r#"<h1>Runs</h1><form class="filters" method="get" action="/">Pipeline <input name="pipeline" value="{}"> Job <input name="job" value="{}"> Outcome <select name="outcome">{outcomes}</select><button>Filter</button></form>
<table id="runs"><tr><th>Run</th><th>Pipeline</th><th>Job</th><th>Status</th><th>Started</th><th>Duration</th><th>Tokens</th><th>Cost</th></tr>{rows}</table>"#,
        esc(pipeline),
        esc(job)
    )
}

/// What a run's live parts show, by element id (the SSE stream sends the same).
pub fn run_parts(run: &RunRecord, steps: &[StepRecord], events: &[RunEvent], spans: &[SpanRecord], now_ms: i64) -> Vec<(&'static str, String)> {
    vec![
        ("state", format!("{} {}", badge(outcome_of(run)), if run.message.is_empty() { String::new() } else { format!(r#"<span class="error">{}</span>"#, esc(&run.message)) })),
        ("graph", graph(spans, events, steps)),
        ("steps", steps_table(run, steps, events, now_ms)),
        ("waterfall", waterfall(spans)),
        ("took", took(run, now_ms)),
    ]
}

/// A run's page: its state, the plan as a graph, the steps, the trace; live
/// while it runs.
pub fn run(run: &RunRecord, parts: &[(&'static str, String)]) -> String {
    let part = |id: &str| parts.iter().find(|(k, _)| *k == id).map(|(_, v)| v.clone()).unwrap_or_default();
    let live = if run.outcome.is_none() { format!(r#" data-live="/runs/{}/live""#, url(&run.id)) } else { String::new() };
    format!(
        r#"<div{live}><h1>Run {id}</h1><p>Pipeline {pipeline} · job {job} · started {started} · <span id="took">{took}</span></p>
<p id="state">{state}</p><h2>Plan</h2><div id="graph">{graph}</div><h2>Steps</h2><div id="steps">{steps}</div><h2>Trace</h2><div id="waterfall">{waterfall}</div></div>"#,
        id = esc(&run.id),
        pipeline = esc(&run.pipeline),
        job = esc(&run.job),
        started = esc(&fmt_time(run.started_ms)),
        took = part("took"),
        state = part("state"),
        graph = part("graph"),
        steps = part("steps"),
        waterfall = part("waterfall"),
    )
}

/// Each step's latest state from the events (`started`, `ended`).
fn states(events: &[RunEvent]) -> Vec<(String, String)> {
    step_states(events).into_iter().map(|s| (s.step, s.state)).collect()
}

fn node_class(state: &str) -> &'static str {
    match state {
        "succeeded" => "ok",
        "failed" | "errored" => "bad",
        "aborted" => "warn",
        "running" => "run",
        _ => "",
    }
}

/// The plan as the run walked it: steps in order, blocks holding theirs
/// (an in_parallel's side by side), each coloured by its outcome; steps
/// still running are added from the events.
pub fn graph(spans: &[SpanRecord], events: &[RunEvent], steps: &[StepRecord]) -> String {
    let states = states(events);
    let by_id: HashMap<&str, &SpanRecord> = spans.iter().map(|x| (x.span_id.as_str(), x)).collect();
    let mut children: HashMap<&str, Vec<&SpanRecord>> = HashMap::new();
    for s in spans.iter().filter(|s| s.name.starts_with("step ")) {
        // A step's parent step: the nearest step (or the job) up its chain.
        let mut p = s.parent_id.as_str();
        while let Some(parent) = by_id.get(p) {
            if parent.name.starts_with("step ") || parent.name.starts_with("job ") {
                break;
            }
            p = parent.parent_id.as_str();
        }
        children.entry(p).or_default().push(s);
    }
    for v in children.values_mut() {
        v.sort_by_key(|s| s.start_ns);
    }
    fn render(s: &SpanRecord, children: &HashMap<&str, Vec<&SpanRecord>>) -> String {
        let label = s.attribute("step").unwrap_or(&s.name);
        let kind = s.attribute("kind").unwrap_or("");
        let outcome = s.attribute("outcome").unwrap_or(if s.error.is_some() { "failed" } else { "succeeded" });
        let kids: Vec<String> = children.get(s.span_id.as_str()).map(|v| v.iter().map(|c| render(c, children)).collect()).unwrap_or_default();
        if kids.is_empty() {
            return format!(r#"<div class="node {}" title="{}"><span class="kind">{}</span> {}</div>"#, node_class(outcome), esc(outcome), esc(kind), esc(label));
        }
        let layout = if kind == "in_parallel" || kind == "race" || kind == "ensemble" { "par" } else { "seq" };
        format!(r#"<div class="node {}"><span class="kind">{}</span> {}<div class="{layout}">{}</div></div>"#, node_class(outcome), esc(kind), esc(label), kids.join(""))
    }
    let job = spans.iter().find(|s| s.name.starts_with("job "));
    let mut top: Vec<String> = job.and_then(|j| children.get(j.span_id.as_str())).map(|v| v.iter().map(|c| render(c, &children)).collect()).unwrap_or_default();
    // Steps the spans do not show yet: running ones, or a run whose spans are not in.
    let drawn: std::collections::HashSet<&str> = spans.iter().filter_map(|s| s.attribute("step")).collect();
    for (step, state) in &states {
        if !drawn.contains(step.as_str()) && (state == "running" || job.is_none()) {
            top.push(format!(r#"<div class="node {}" title="{}">{}</div>"#, node_class(state), esc(state), esc(step)));
        }
    }
    if top.is_empty() && !steps.is_empty() {
        top = steps.iter().map(|s| format!(r#"<div class="node {}">{}</div>"#, node_class(&s.outcome), esc(&s.name))).collect();
    }
    format!(r#"<div class="graph"><div class="seq">{}</div></div>"#, top.join(""))
}

fn steps_table(run: &RunRecord, steps: &[StepRecord], events: &[RunEvent], now_ms: i64) -> String {
    let mut rows = String::new();
    for s in steps {
        rows.push_str(&format!(
            r#"<tr><td><a href="/runs/{}/steps/{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            url(&run.id),
            s.seq,
            esc(&s.name),
            badge(&s.outcome),
            fmt_ms(s.duration_ms),
            s.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            s.tokens.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
            esc(&s.message),
        ));
    }
    for st in step_states(events).iter().filter(|st| st.running()) {
        if !steps.iter().any(|s| s.name == st.step) {
            let elapsed = if st.started_ms > 0 { fmt_ms(now_ms.saturating_sub(st.started_ms)) } else { String::new() };
            rows.push_str(&format!(r#"<tr><td>{}</td><td>{}</td><td>{}</td><td colspan="3"></td></tr>"#, esc(&st.step), badge(&st.state), esc(&elapsed)));
        }
    }
    format!(r#"<table><tr><th>Step</th><th>Outcome</th><th>Duration</th><th>Exit</th><th>Tokens</th><th>Message</th></tr>{rows}</table>"#)
}

/// The trace as a waterfall: each span under its parent, a bar on the run's time line.
pub fn waterfall(spans: &[SpanRecord]) -> String {
    use steppe_runtime::trace::{timeline, Timeline};
    let Some(line) = timeline(spans) else { return r#"<p class="muted">no spans yet</p>"#.into() };
    let mut rows = String::new();
    for &(depth, s) in &line.rows {
        let (left, width) = (line.at(s.start_ns) * 100.0, ((line.at(Timeline::end_of(s)) - line.at(s.start_ns)) * 100.0).max(0.3));
        rows.push_str(&format!(
            r#"<tr><td style="padding-left:{}px">{}</td><td class="muted">{}</td><td>{}</td><td class="bar"><div class="track"><div class="fill{}" style="left:{left:.2}%;width:{width:.2}%"></div></div></td></tr>"#,
            8 + depth.min(12) * 14,
            esc(&s.name),
            esc(&s.process),
            fmt_ms(i64::try_from(s.end_ns.saturating_sub(s.start_ns) / 1_000_000).unwrap_or(i64::MAX)),
            if s.error.is_some() { " bad" } else { "" },
        ));
    }
    format!(r#"<table class="wf"><tr><th>Span</th><th>Process</th><th>Took</th><th></th></tr>{rows}</table>"#)
}

/// One step: its record, the agent's transcript (calls, results, verdict,
/// denials) and its output lines.
pub fn step(run: &RunRecord, s: &StepRecord, logs: &[LogLine]) -> String {
    let detail: serde_json::Value = s.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
    let mut body = format!(
        r#"<p><a href="/runs/{}">← run {}</a></p><h1>{}</h1><p>{} · {} · exit {}</p>"#,
        url(&run.id),
        esc(&run.id),
        esc(&s.name),
        badge(&s.outcome),
        fmt_ms(s.duration_ms),
        s.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into())
    );
    if !s.message.is_empty() {
        body.push_str(&format!(r#"<p class="error">{}</p>"#, esc(&s.message)));
    }
    if let Some(v) = detail.get("verdict").and_then(|v| v.as_str()) {
        body.push_str(&format!(r#"<p>Verdict: <b id="verdict">{}</b></p>"#, esc(v)));
    }
    let denials: Vec<String> = detail.get("denials").and_then(|d| d.as_array()).into_iter().flatten().map(|d| {
        let f = |k: &str| esc(d.get(k).and_then(|v| v.as_str()).unwrap_or_default());
        format!("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", f("tool"), f("path"), f("reason"))
    }).collect();
    if !denials.is_empty() {
        body.push_str(&format!(r#"<h2>Sandbox denials</h2><table id="denials"><tr><th>Tool</th><th>Path</th><th>Reason</th></tr>{}</table>"#, denials.join("")));
    }
    let transcript: Vec<String> = detail.get("transcript").and_then(|t| t.as_array()).into_iter().flatten().map(|e| {
        let f = |k: &str| esc(e.get(k).and_then(|v| v.as_str()).unwrap_or_default());
        format!("<tr><td>{}</td><td>{}</td><td><pre>{}</pre></td></tr>", f("kind"), f("name"), f("content"))
    }).collect();
    if !transcript.is_empty() {
        body.push_str(&format!(r#"<h2>Transcript</h2><table id="transcript"><tr><th>Kind</th><th>Tool</th><th>Content</th></tr>{}</table>"#, transcript.join("")));
    }
    let lines: String = logs.iter().filter(|l| l.step == s.name).map(|l| format!("{}{}\n", if l.stderr { "! " } else { "" }, esc(&l.line))).collect();
    body.push_str(&format!(r#"<h2>Output</h2><pre id="log">{}</pre>"#, if lines.is_empty() { "(none)".to_string() } else { lines }));
    body
}

/// Approvals waiting for a decision, each with its two buttons.
pub fn approvals(list: &[ApprovalRecord], csrf: &str) -> String {
    let mut rows = String::new();
    for a in list {
        rows.push_str(&format!(
            r#"<tr><td>{id}</td><td>{}</td><td>{}</td><td><a href="/runs/{}">{}</a></td><td>{}</td><td><form method="post" action="/approvals/{id}" class="inline"><input type="hidden" name="csrf" value="{csrf}"><input name="reason" placeholder="reason"><button name="decision" value="approve" id="approve-{id}">Approve</button><button name="decision" value="reject" id="reject-{id}">Reject</button></form></td></tr>"#,
            esc(&a.pipeline),
            esc(&a.job),
            url(&a.run_id),
            esc(&a.run_id),
            esc(&a.message),
            id = a.id,
            csrf = esc(csrf),
        ));
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="6" class="muted">nothing waits for a decision</td></tr>"#.into();
    }
    format!(r#"<h1>Approvals</h1><table id="approvals"><tr><th>ID</th><th>Pipeline</th><th>Job</th><th>Run</th><th>Message</th><th>Decide</th></tr>{rows}</table>"#)
}

/// ask_user questions waiting for a person, each with its answer field.
pub fn questions(list: &[QuestionRecord], csrf: &str) -> String {
    let mut rows = String::new();
    for q in list {
        let options = if q.options.is_empty() { String::new() } else { format!(r#"<div class="muted">options: {}</div>"#, esc(&q.options.join(" | "))) };
        rows.push_str(&format!(
            r#"<tr><td>{id}</td><td>{}</td><td>{}</td><td><a href="/runs/{}">{}</a></td><td>{}{options}</td><td><form method="post" action="/questions/{id}" class="inline"><input type="hidden" name="csrf" value="{csrf}"><input name="answer" id="answer-{id}" placeholder="answer"><button id="send-{id}">Answer</button></form></td></tr>"#,
            esc(&q.pipeline),
            esc(&q.agent),
            url(&q.run_id),
            esc(&q.run_id),
            esc(&q.question),
            id = q.id,
            csrf = esc(csrf),
        ));
    }
    if rows.is_empty() {
        rows = r#"<tr><td colspan="6" class="muted">no question waits for an answer</td></tr>"#.into();
    }
    format!(r#"<h1>Questions</h1><table id="questions"><tr><th>ID</th><th>Pipeline</th><th>Agent</th><th>Run</th><th>Question</th><th>Answer</th></tr>{rows}</table>"#)
}

/// The sign-in form (a token, as the CLI's).
pub fn login(error: &str) -> String {
    let e = if error.is_empty() { String::new() } else { format!(r#"<p class="error">{}</p>"#, esc(error)) };
    format!(r#"<h1>Sign in</h1>{e}<form method="post" action="/login"><p>Token <input type="password" name="token" autofocus></p><p><button>Sign in</button></p></form><p class="muted">The same token as the CLI's (--token-file).</p>"#)
}
