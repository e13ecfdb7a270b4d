//! `steppe runs --follow`: a run's lines and step states as they happen,
//! read from the store it is recorded in (a pipeline's own, or a
//! coordinator's), so a run started elsewhere can be followed from anywhere.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use steppe_runtime::outcome::Outcome;
use steppe_runtime::store::{RunEvent, RunRecord, StepRecord, Store};

use super::format::fmt_ms;
use super::history_source::History;
use crate::text::shown;

/// How often the store is asked for what is new.
const POLL: Duration = Duration::from_millis(300);

/// Where following starts.
pub(super) enum From {
    /// The run's first event.
    Start,
    /// What happens next (the steps running now are listed first).
    Now,
}

/// Follows run `run` (or the newest of `job` while it runs, or else the
/// next one to start) until it ends; exits as `steppe run` would have.
pub(super) fn follow(h: &mut History, job: Option<&str>, run: Option<&str>, from: From) -> Result<ExitCode> {
    let record = target(h, job, run)?;
    let store = h.store.as_deref().context("the store went away")?;
    say!("following run {} of job {} in pipeline {}", record.id, shown(&record.job), shown(&record.pipeline));
    let mut seen = 0;
    if let From::Now = from {
        let events = store.events(&record.id)?;
        seen = events.len();
        let now = steppe_runtime::store::now_ms();
        for s in steppe_runtime::store::step_states(&events).into_iter().filter(|s| s.running()) {
            say!("… {} running for {}", shown(&s.step), fmt_ms(now.saturating_sub(s.started_ms)));
        }
    }
    loop {
        // The run's state is read before its events: once it has ended, the
        // events read after it are its last.
        let now = store.run(&record.id)?.with_context(|| format!("run {} is no longer in the history of {}", record.id, h.label))?;
        let events = store.events_after(&record.id, seen)?;
        seen += events.len();
        print_events(store, &record.id, &events)?;
        if let Some(outcome) = now.outcome.as_deref() {
            return Ok(ended(&now, outcome));
        }
        std::thread::sleep(POLL);
    }
}

/// The run to follow: the one named, the newest while it runs, or the
/// next to start (waited for).
fn target(h: &mut History, job: Option<&str>, run: Option<&str>) -> Result<RunRecord> {
    if let Some(id) = run {
        let store = h.store.as_deref().with_context(|| format!("no runs recorded for {}", h.label))?;
        return store.run(id)?.with_context(|| format!("no run {id} in the history of {}", h.label));
    }
    let newest = |h: &History| -> Result<Option<RunRecord>> {
        match h.store.as_deref() {
            Some(store) => Ok(h.runs(store, job, 1)?.into_iter().next()),
            None => Ok(None),
        }
    };
    let before = newest(h)?;
    if let Some(r) = before.as_ref().filter(|r| r.outcome.is_none()) {
        return Ok(r.clone());
    }
    eprintln!("steppe: no run of {} is running; waiting for the next to start (Ctrl-C to stop)", h.label);
    loop {
        std::thread::sleep(POLL);
        if h.store.is_none() {
            h.reopen()?;
        }
        if let Some(r) = newest(h)?.filter(|r| before.as_ref().is_none_or(|b| b.id != r.id)) {
            return Ok(r);
        }
    }
}

/// Prints events as the terminal of the run printed them.
fn print_events(store: &dyn Store, run_id: &str, events: &[RunEvent]) -> Result<()> {
    let records: Vec<StepRecord> = if events.iter().any(|e| e.kind == "ended") { store.steps(run_id)? } else { Vec::new() };
    for e in events {
        match e.kind.as_str() {
            "started" => say!("▶ {}", shown(&e.step)),
            "stdout" | "stderr" => say!("[{}] {}", shown(&e.step), shown(&e.message)),
            // The run's progress, for --resume: not something it printed.
            crate::engine::checkpoint::KIND => {}
            "ended" => {
                // The step's last record of that name carries its duration and error.
                let rec = records.iter().rev().find(|r| r.name == e.step);
                let took = rec.map(|r| format!(" ({})", fmt_ms(r.duration_ms))).unwrap_or_default();
                match (e.message.as_str(), rec) {
                    ("succeeded", _) => say!("✔ {}{took}", shown(&e.step)),
                    (outcome, Some(r)) if !r.message.is_empty() => say!("✘ {} {outcome}{took}: {}", shown(&e.step), shown(&r.message)),
                    (outcome, _) => say!("✘ {} {outcome}{took}", shown(&e.step)),
                }
            }
            _ => say!("{}", shown(&e.message)),
        }
    }
    Ok(())
}

/// The run's last line, and the exit code `steppe run` gives that outcome.
fn ended(run: &RunRecord, outcome: &str) -> ExitCode {
    let took = run.finished_ms.map(|f| format!(" in {}", fmt_ms(f - run.started_ms))).unwrap_or_default();
    let mut lines = run.message.lines();
    match lines.next() {
        None => say!("run {} {outcome}{took}", run.id),
        Some(first) => say!("run {} {outcome}{took}: {}", run.id, shown(first)),
    }
    for line in lines {
        say!("  {}", shown(line));
    }
    ExitCode::from(Outcome::from_word(outcome).unwrap_or(Outcome::Errored).exit_code())
}

/// How long a submitter waits for a coordinator that went away to come
/// back and take its run over.
pub const REATTACH_FOR: Duration = Duration::from_secs(600);

/// Follows run `id` at a coordinator whose stream broke: from the events
/// after `seen_lines`' worth, reconnecting while the coordinator is away,
/// until the run ends; the exit code `steppe run` gives its outcome.
pub fn reattach(remote: &crate::remote::Remote, id: &str) -> Result<u8> {
    let deadline = std::time::Instant::now() + REATTACH_FOR;
    let mut seen: Option<usize> = None;
    let mut said_away = false;
    loop {
        let attempt = (|| -> Result<Option<u8>> {
            let store = crate::history::RemoteStore::connect(remote)?;
            loop {
                let run = store.run(id)?.with_context(|| format!("run {id} is not in the history of the coordinator at {}", remote.url))?;
                // On the first contact, only what happens from now on is new.
                let events = match seen {
                    None => {
                        seen = Some(store.events(id)?.len());
                        Vec::new()
                    }
                    Some(n) => store.events_after(id, n)?,
                };
                seen = Some(seen.unwrap_or(0) + events.len());
                print_events(&store, id, &events)?;
                if let Some(outcome) = run.outcome.as_deref() {
                    let _ = ended(&run, outcome);
                    return Ok(Some(Outcome::from_word(outcome).unwrap_or(Outcome::Errored).exit_code()));
                }
                std::thread::sleep(POLL);
            }
        })();
        match attempt {
            Ok(Some(code)) => return Ok(code),
            Ok(None) => {}
            Err(e) if std::time::Instant::now() < deadline => {
                if !said_away {
                    warn!("steppe: waiting for the coordinator at {} to come back ({})", remote.url, format!("{e:#}"));
                    said_away = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => return Err(e.context(format!("run {id}: the coordinator at {} did not come back in {}", remote.url, steppe_language::duration::show(REATTACH_FOR)))),
        }
    }
}
