//! `steppe runs`, `approvals`, `approve` and `reject`: the recorded history, read
//! from a pipeline's own store or a coordinator's.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::args::RemoteArgs;
use super::format::{fmt_ms, fmt_time, thousands};
use super::history_source::History;
use crate::text::shown;

/// Show recorded runs of a pipeline (read-only; never creates the store).
///
/// Without flags: the newest runs, one per line. --steps: the steps of the
/// newest run (or of --run ID), those still running with their time so
/// far. --logs: its output lines (a running step's as far as it got).
/// --follow: the run's lines as they happen, until it ends.
///
/// Examples:
///   steppe runs ci.yml --job build --limit 5
///   steppe runs ci.yml --steps
///   steppe runs ci.yml --run r-18c2… --logs
///   steppe runs ci.yml --follow
///   steppe runs --coordinator http://10.0.0.5:7070 --run r-18c2… --follow
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunsArgs {
    /// The pipeline file (its store is .steppe/<file>.db beside it);
    /// not needed with --coordinator.
    #[arg(required_unless_present = "coordinator")]
    pipeline: Option<PathBuf>,
    /// Only runs of this job.
    #[arg(long)]
    job: Option<String>,
    /// How many runs to list.
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Show the steps of one run.
    #[arg(long)]
    steps: bool,
    /// The run to show (default: the newest).
    #[arg(long, value_name = "ID")]
    run: Option<String>,
    /// Show the run's output lines: each step's first and last lines,
    /// and how much was left out between them.
    #[arg(long)]
    logs: bool,
    /// With --logs (implied): each step's whole output, fetched from
    /// where it was stored (through the coordinator with --coordinator).
    #[arg(long)]
    full: bool,
    /// With --logs: only this step's lines.
    #[arg(long, value_name = "NAME")]
    step: Option<String>,
    /// Spend: tokens per run (or, with --run, per step). Unpriced is not $0.00.
    #[arg(long)]
    cost: bool,
    /// Show agent steps' transcripts (text, calls, results) with --steps.
    #[arg(long)]
    transcript: bool,
    /// Write the ledgers of the gated procedures (`stepgate:` servers) the
    /// run's agent steps followed into DIR, as `STEP/<stepfile>-<run>.jsonl`,
    /// for `steppe gate --verify DIR/*/*.jsonl`.
    #[arg(long, value_name = "DIR")]
    ledgers: Option<PathBuf>,
    /// Show the run's events (steps started and ended, notes) in order.
    #[arg(long)]
    events: bool,
    /// Show the run's trace as a waterfall: every span (the run, its job,
    /// steps, attempts, queue waits, executions on workers, agent turns,
    /// model and tool calls) under its parent, on one time line.
    #[arg(long)]
    trace: bool,
    /// Show the build queue of `steppe watch`: jobs waiting and running.
    #[arg(long, conflicts_with_all = ["steps", "logs", "full", "cost", "transcript", "events", "trace"])]
    queue: bool,
    /// Follow the run live (--run ID, or the newest while it runs, or else
    /// the next to start): its lines and steps as they happen, until it
    /// ends; exits as `steppe run` would have (0, 1, 2 or 130).
    #[arg(long, short = 'f', conflicts_with_all = ["steps", "logs", "full", "cost", "transcript", "events", "trace"])]
    follow: bool,
    /// With --follow: start from what happens next (the steps running now
    /// are listed first) rather than from the run's start.
    #[arg(long, requires = "follow")]
    from_now: bool,
    /// The pipeline whose runs to show (default: the file's own, named
    /// after it; with --coordinator, every pipeline your token sees).
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl RunsArgs {
    pub fn run(self) -> Result<ExitCode> {
        let RunsArgs { pipeline, job, limit, steps, run, logs, full, step, cost, transcript, ledgers, events, trace, queue, follow, from_now, name, remote } = self;
        let mut h = History::open(pipeline.as_deref(), name.as_deref(), &remote)?;
        if queue {
            runs_queue(&h)
        } else if follow {
            let from = if from_now { super::follow::From::Now } else { super::follow::From::Start };
            super::follow::follow(&mut h, job.as_deref(), run.as_deref(), from)
        } else if trace {
            runs_trace(&h, job.as_deref(), run.as_deref())
        } else if events {
            runs_events(&h, job.as_deref(), run.as_deref())
        } else if cost {
            runs_cost(&h, job.as_deref(), limit, run.as_deref())
        } else {
            let logs = (logs || full || step.is_some()).then_some(LogsView { full, step });
            runs(&h, job.as_deref(), limit, steps || transcript || ledgers.is_some(), run.as_deref(), logs, transcript, ledgers.as_deref())
        }
    }
}

/// List approvals waiting for a decision (ID JOB REQUESTED MESSAGE).
#[derive(Args, Debug)]
pub struct ApprovalsArgs {
    /// The pipeline file (not needed with --coordinator).
    #[arg(required_unless_present = "coordinator")]
    pipeline: Option<PathBuf>,
    /// Only this pipeline's (default: the file's own; with --coordinator, every one your token sees).
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl ApprovalsArgs {
    pub fn run(self) -> Result<ExitCode> {
        approvals(&History::open(self.pipeline.as_deref(), self.name.as_deref(), &self.remote)?)
    }
}

/// List the pipelines with recorded runs, each with its newest run.
///
/// A coordinator keeps the history of every pipeline submitted to it, each
/// under its name (`--pipeline NAME`, or the file's stem); a submit token
/// sees its own team's, an admin token every team's.
///
/// Examples:
///   steppe pipelines --coordinator http://10.0.0.5:7070 --token-file token
///   steppe pipelines ci.yml
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct PipelinesArgs {
    /// The pipeline file whose store to read (not needed with --coordinator).
    #[arg(required_unless_present = "coordinator")]
    pipeline: Option<PathBuf>,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl PipelinesArgs {
    pub fn run(self) -> Result<ExitCode> {
        let h = History::open(self.pipeline.as_deref(), None, &self.remote)?;
        let list = match &h.store {
            Some(store) => store.pipelines(None)?,
            None => Vec::new(),
        };
        if list.is_empty() {
            say!("no runs recorded for {}", h.label);
            return Ok(ExitCode::SUCCESS);
        }
        let teams = list.iter().any(|p| !p.team.is_empty());
        if teams {
            say!("{:<16} {:<24} {:<26} {:<20} {:<21} OUTCOME", "TEAM", "PIPELINE", "LAST RUN", "JOB", "STARTED");
        } else {
            say!("{:<24} {:<26} {:<20} {:<21} OUTCOME", "PIPELINE", "LAST RUN", "JOB", "STARTED");
        }
        for p in list {
            let r = &p.last;
            let outcome = r.outcome.as_deref().unwrap_or("running");
            let row = format!("{:<24} {:<26} {:<20} {:<21} {outcome}", shown(&p.pipeline), r.id, shown(&r.job), fmt_time(r.started_ms));
            if teams {
                say!("{:<16} {row}", shown(&p.team));
            } else {
                say!("{row}");
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// `approve` and `reject`.
#[derive(Args, Debug)]
pub struct DecideArgs {
    /// The pipeline file (left out with --coordinator), then the
    /// approval's id from `steppe approvals`.
    #[arg(value_name = "PIPELINE> <ID", num_args = 1..=2, required = true)]
    target: Vec<String>,
    /// Why (kept in the record; a rejection shows it in the failure).
    #[arg(long, default_value = "")]
    reason: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl DecideArgs {
    pub fn run(self, approve: bool) -> Result<ExitCode> {
        decide(&self, approve)
    }
}

/// `runs --logs`: all of each step's output or only its record, one step or all.
struct LogsView {
    full: bool,
    step: Option<String>,
}

/// One line a step wrote, as `--logs` shows it (`line` already made printable).
fn say_output(step: &str, stderr: bool, line: &str) {
    say!("[{}]{} {}", shown(step), if stderr { " (stderr)" } else { "" }, line);
}

/// Prints a run's logs: each step's record, or (`full`) its whole output in
/// place of head, gap and tail.
fn print_logs(h: &History, lines: &[steppe_runtime::store::LogLine], view: &LogsView) -> Result<()> {
    let lines: Vec<&steppe_runtime::store::LogLine> = lines.iter().filter(|l| view.step.as_deref().is_none_or(|s| s == l.step)).collect();
    // With --full, a step's head, gap line and tail make way for its whole output.
    let mut replaced: std::collections::HashMap<usize, (usize, &str)> = Default::default();
    if view.full {
        for (i, l) in lines.iter().enumerate() {
            if let Some(o) = &l.omitted {
                let start = i.saturating_sub(o.head as usize);
                let end = (i + o.tail as usize).min(lines.len().saturating_sub(1));
                replaced.insert(start, (end, o.full.as_str()));
            }
        }
    }
    let mut i = 0;
    while i < lines.len() {
        if let Some((end, digest)) = replaced.get(&i) {
            let step = &lines[i].step;
            for (stderr, line) in h.full_output(digest)? {
                say_output(step, stderr, &line);
            }
            i = end + 1;
            continue;
        }
        say_output(&lines[i].step, lines[i].stderr, &lines[i].line);
        i += 1;
    }
    if let (Some(step), true) = (&view.step, lines.is_empty()) {
        say!("no output recorded for step {}", shown(step));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn runs(h: &History, job: Option<&str>, limit: usize, steps: bool, run: Option<&str>, logs: Option<LogsView>, transcript: bool, ledgers: Option<&Path>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    if !steps && logs.is_none() && run.is_none() {
        let rows = h.runs(store.as_ref(), job, limit)?;
        if rows.is_empty() {
            say!("no runs recorded for {}", h.label);
            return Ok(ExitCode::SUCCESS);
        }
        // Runs of several pipelines name theirs.
        let named = h.pipeline.is_none();
        let lead = |p: &str| if named { format!("{:<20} ", shown(p)) } else { String::new() };
        say!("{}{:<26} {:<20} {:<21} {:>9}  OUTCOME", lead("PIPELINE"), "RUN", "JOB", "STARTED", "DURATION");
        for r in rows {
            let dur = r.finished_ms.map(|f| fmt_ms(f - r.started_ms)).unwrap_or_else(|| "-".into());
            let outcome = r.outcome.clone().unwrap_or_else(|| "running".into());
            let msg = if r.message.is_empty() { String::new() } else { format!(": {}", r.message.lines().next().unwrap_or_default()) };
            say!("{}{:<26} {:<20} {:<21} {:>9}  {outcome}{}", lead(&r.pipeline), r.id, shown(&r.job), fmt_time(r.started_ms), dur, shown(&msg));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let record = h.run_or_newest(store.as_ref(), job, run)?;
    say!("run {} of job {} ({}) in pipeline {}", record.id, shown(&record.job), record.outcome.as_deref().unwrap_or("running"), shown(&record.pipeline));
    for line in record.message.lines() {
        say!("  {}", shown(line));
    }
    let recorded = store.steps(&record.id)?;
    // A run still going: its events tell which steps run and what they wrote so far.
    let live = if record.outcome.is_none() { store.events(&record.id)? } else { Vec::new() };
    let running: Vec<steppe_runtime::store::StepState> = steppe_runtime::store::step_states(&live).into_iter().filter(|s| s.running()).collect();
    if steps || logs.is_none() {
        say!("{:<40} {:<10} {:>9} {:>5} {:>9}", "STEP", "OUTCOME", "DURATION", "EXIT", "TOKENS");
        let now = steppe_runtime::store::now_ms();
        for s in &running {
            say!("{:<40} {:<10} {:>9} {:>5} {:>9}", shown(&s.step), "running", fmt_ms(now.saturating_sub(s.started_ms)), "-", "-");
        }
        for s in recorded {
            let exit = s.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into());
            let tokens = s.tokens.map(thousands).unwrap_or_else(|| "-".into());
            say!("{:<40} {:<10} {:>9} {:>5} {:>9}", shown(&s.name), s.outcome, fmt_ms(s.duration_ms), exit, tokens);
            let detail: serde_json::Value = s.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
            if let Some(v) = detail.get("verdict").and_then(|v| v.as_str()) {
                say!("    verdict: {}", shown(v));
            }
            if transcript {
                for e in detail.get("transcript").and_then(|t| t.as_array()).into_iter().flatten() {
                    let kind = e.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
                    let name = e.get("name").and_then(|v| v.as_str()).unwrap_or_default();
                    let content = e.get("content").and_then(|v| v.as_str()).unwrap_or_default();
                    if kind == "ledger" {
                        say!("    {kind:<8} {} ({} records; --ledgers DIR writes it)", shown(name), content.lines().count());
                        continue;
                    }
                    let short: String = content.chars().take(300).collect();
                    say!("    {kind:<8} {} {}", shown(name), shown(&short));
                }
            }
            if let Some(dir) = ledgers {
                for e in detail.get("transcript").and_then(|t| t.as_array()).into_iter().flatten().filter(|e| e.get("kind").and_then(|k| k.as_str()) == Some("ledger")) {
                    let name = e.get("name").and_then(|v| v.as_str()).unwrap_or_default();
                    let file = name.rsplit('/').next().filter(|f| !f.is_empty() && !f.starts_with('.')).unwrap_or("ledger.jsonl");
                    // One directory per step: two steps' gates both number their runs from 1.
                    let step_dir: String = s.name.chars().map(|c| if c.is_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect();
                    let dir = dir.join(step_dir.trim_start_matches('.'));
                    std::fs::create_dir_all(&dir).with_context(|| format!("making {}", dir.display()))?;
                    let path = dir.join(file);
                    std::fs::write(&path, e.get("content").and_then(|v| v.as_str()).unwrap_or_default()).with_context(|| format!("writing {}", path.display()))?;
                    say!("    ledger   {} written to {}", shown(name), path.display());
                }
            }
            for d in detail.get("denials").and_then(|d| d.as_array()).into_iter().flatten() {
                let field = |k: &str| shown(d.get(k).and_then(|v| v.as_str()).unwrap_or_default()).into_owned();
                say!("    denied: {} {} — {}", field("tool"), field("path"), field("reason"));
            }
            for (tool, what, why) in failed_tool_calls(&detail) {
                say!("    tool failed: {} {} — {}", shown(&tool), shown(&what), shown(&why));
            }
        }
    }
    if let Some(view) = &logs {
        print_logs(h, &store.logs(&record.id)?, view)?;
        for s in running.iter().filter(|s| view.step.as_deref().is_none_or(|v| v == s.step)) {
            say!("… {} is still running; its output so far:", shown(&s.step));
            // Its lines since it (last) started.
            for e in live.iter().filter(|e| e.is_output() && e.step == s.step && e.at_ms >= s.started_ms) {
                say_output(&e.step, e.kind == "stderr", &shown(&e.message));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn approvals(h: &History) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no approvals pending for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let pending = store.pending_approvals(None, h.pipeline.as_deref())?;
    if pending.is_empty() {
        say!("no approvals pending for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    }
    say!("{:<4} {:<20} {:<20} {:<21} MESSAGE", "ID", "PIPELINE", "JOB", "REQUESTED");
    for a in pending {
        say!("{:<4} {:<20} {:<20} {:<21} {}", a.id, shown(&a.pipeline), shown(&a.job), fmt_time(a.requested_ms), shown(&a.message));
    }
    Ok(ExitCode::SUCCESS)
}

/// `approve|reject [PIPELINE] ID`: the pipeline is needed unless --coordinator.
fn approval_target(target: &[String], remote: &RemoteArgs) -> Result<(Option<PathBuf>, i64)> {
    let (pipeline, id) = match target {
        [id] => (None, id),
        [pipeline, id] => (Some(PathBuf::from(pipeline)), id),
        _ => anyhow::bail!("give the pipeline file and the approval id, e.g. `steppe approve ci.yml 3`"),
    };
    if pipeline.is_none() && remote.coordinator.is_none() {
        anyhow::bail!("give the pipeline file before the id (`steppe approve ci.yml {id}`), or --coordinator URL");
    }
    let id = id.parse().with_context(|| format!("{id:?} is not an approval id: `steppe approvals` lists them"))?;
    Ok((pipeline, id))
}

fn decide(args: &DecideArgs, approve: bool) -> Result<ExitCode> {
    let (pipeline, id) = approval_target(&args.target, &args.remote)?;
    let h = History::open(pipeline.as_deref(), None, &args.remote)?;
    let reason = args.reason.as_str();
    let store = h.store.as_ref().with_context(|| format!("nothing has run yet for {}", h.label))?;
    let approver = steppe_runtime::store::person_here();
    let Some(rec) = store.approval(id)? else {
        anyhow::bail!("no approval {id} for {}", h.label);
    };
    if let Some(d) = &rec.decision {
        anyhow::bail!("approval {id} was already {d} by {}", rec.approver);
    }
    if !store.decide_approval(id, approve, reason, &approver)? {
        anyhow::bail!("approval {id} was decided by someone else just now");
    }
    say!("{} approval {id}", if approve { "approved" } else { "rejected" });
    Ok(ExitCode::SUCCESS)
}

fn runs_cost(h: &History, job: Option<&str>, limit: usize, run: Option<&str>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    use steppe_runtime::prices::{show_cost, Spend};
    match run {
        None => {
            say!("{:<26} {:<16} {:>12} {:>7} {:>11} {:>6}", "RUN", "JOB", "TOKENS", "CACHED", "COST", "STEPS");
            let (mut all, mut all_steps, mut all_priced) = (Spend::default(), 0, 0);
            for r in h.runs(store.as_ref(), job, limit)? {
                let (spend, steps, priced) = Spend::total(&store.steps(&r.id)?);
                // Unpriced (no provider cost, no price for the model) is not $0.00.
                say!("{:<26} {:<16} {:>12} {:>7} {:>11} {:>6}", r.id, shown(&r.job), thousands(spend.tokens), spend.cached_share(), show_cost(spend.cost_usd, steps, priced), steps);
                all.tokens += spend.tokens;
                all.prompt += spend.prompt;
                all.cached += spend.cached;
                all.cost_usd = match (all.cost_usd, spend.cost_usd) {
                    (Some(a), Some(b)) => Some(a + b),
                    (a, b) => a.or(b),
                };
                (all_steps, all_priced) = (all_steps + steps, all_priced + priced);
            }
            say!("{:<26} {:<16} {:>12} {:>7} {:>11} {:>6}", "total", "", thousands(all.tokens), all.cached_share(), show_cost(all.cost_usd, all_steps, all_priced), all_steps);
        }
        Some(id) => {
            say!("{:<40} {:>12} {:>7} {:>11} {:>9}  FINISH", "STEP", "TOKENS", "CACHED", "COST", "DURATION");
            for s in store.steps(id)? {
                let Some(spend) = Spend::of(&s) else { continue };
                let finish = if spend.finish == "length" { "length <-- truncated".to_string() } else { spend.finish.clone() };
                say!("{:<40} {:>12} {:>7} {:>11} {:>9}  {}", shown(&s.name), thousands(spend.tokens), spend.cached_share(), show_cost(spend.cost_usd, 1, usize::from(spend.cost_usd.is_some())), fmt_ms(s.duration_ms), finish);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_events(h: &History, job: Option<&str>, run: Option<&str>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let id = match run {
        Some(id) => id.to_string(),
        None => h.runs(store.as_ref(), job, 1)?.into_iter().next().map(|r| r.id).with_context(|| format!("no runs recorded for {}", h.label))?,
    };
    for e in store.events(&id)? {
        say!("{:<8} {:<30} {}", e.kind, shown(&e.step), shown(&e.message));
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_queue(h: &History) -> Result<ExitCode> {
    let (Some(store), Some(pipeline)) = (&h.store, &h.pipeline) else {
        say!("no builds queued for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let rows = crate::watch::queue::load(store.as_ref(), &steppe_runtime::store::Scope::new("", pipeline))?;
    if rows.is_empty() {
        say!("no builds queued for {}", h.label);
    }
    for line in crate::watch::queue_table(&rows) {
        say!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_trace(h: &History, job: Option<&str>, run: Option<&str>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let record = h.run_or_newest(store.as_ref(), job, run)?;
    say!("run {} of job {} ({})", record.id, shown(&record.job), record.outcome.as_deref().unwrap_or("running"));
    for line in super::trace::waterfall(&store.spans(&record.id)?, 40) {
        say!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The tool calls of an agent step's transcript that failed (an error, or
/// a command's non-zero exit — what a container refused shows up here):
/// (tool, its command or arguments, the first line of why).
fn failed_tool_calls(detail: &serde_json::Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut last_args = String::new();
    // A refusal of the sandbox is listed as its denial, not again here.
    let refusals: Vec<&str> = detail.get("denials").and_then(|d| d.as_array()).into_iter().flatten().filter_map(|d| d.get("reason").and_then(|r| r.as_str())).filter(|r| !r.is_empty()).collect();
    for e in detail.get("transcript").and_then(|t| t.as_array()).into_iter().flatten() {
        let field = |k: &str| e.get(k).and_then(|v| v.as_str()).unwrap_or_default();
        match field("kind") {
            "call" => {
                let args: serde_json::Value = serde_json::from_str(field("content")).unwrap_or_default();
                last_args = args.get("command").and_then(|c| c.as_str()).map(str::to_string).unwrap_or_else(|| field("content").to_string());
            }
            "result" => {
                let r: serde_json::Value = serde_json::from_str(field("content")).unwrap_or_default();
                let first_line = |v: Option<&serde_json::Value>| v.and_then(|s| s.as_str()).and_then(|s| s.lines().find(|l| !l.trim().is_empty())).map(str::to_string);
                let why = match (r.get("error"), r.get("exit_code").and_then(|c| c.as_i64())) {
                    (Some(err), _) => Some(err.as_str().map(str::to_string).unwrap_or_else(|| err.to_string())),
                    (None, Some(code)) if code != 0 => Some(format!("exit {code}: {}", first_line(r.get("stderr")).or_else(|| first_line(r.get("stdout"))).unwrap_or_default())),
                    _ => None,
                };
                if let Some(why) = why.filter(|w| !refusals.iter().any(|r| w.contains(r))) {
                    let what: String = last_args.chars().take(120).collect();
                    out.push((field("name").to_string(), what, why.lines().next().unwrap_or_default().chars().take(200).collect()));
                }
            }
            _ => {}
        }
    }
    out
}
