//! Runs outlive no process: this one says it is alive in the store, and
//! runs left unfinished by one that stopped saying so are marked aborted —
//! except a coordinator's submitted runs, which the coordinator that keeps
//! their files takes over.

use std::sync::Arc;
use std::time::Duration;

use steppe_runtime::store::{this_owner, RunRecord, Store};

use crate::event_hub::EventHub;

/// How often this process says it is alive, and for how long each time.
const BEAT: Duration = Duration::from_secs(5);
const ALIVE_FOR: Duration = Duration::from_secs(15);
/// How often other processes' orphans are looked for: a process that died
/// just before this one started is found one ALIVE_FOR later.
const SWEEP: Duration = ALIVE_FOR;

/// What an orphan's record says happened.
pub const ORPHAN_MESSAGE: &str = "the coordinator (or steppe run) driving it stopped before it finished; marked aborted when another started";

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Says alive now, marks the orphans already there, and keeps doing both
/// for as long as the process runs.
pub fn start(store: Arc<dyn Store>, out: Arc<EventHub>) {
    if let Err(e) = store.heartbeat(this_owner(), now_ms(), ALIVE_FOR.as_millis() as i64) {
        out.note(&format!("steppe: saying this process is alive in the run store: {e}"));
    }
    sweep(store.as_ref(), &out);
    tokio::spawn(async move {
        // Said just now: the next beat is one BEAT away.
        let mut beat = tokio::time::interval_at(tokio::time::Instant::now() + BEAT, BEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = tokio::time::Instant::now();
        loop {
            beat.tick().await;
            let s = store.clone();
            let _ = tokio::task::spawn_blocking(move || s.heartbeat(this_owner(), now_ms(), ALIVE_FOR.as_millis() as i64)).await;
            if last_sweep.elapsed() >= SWEEP {
                last_sweep = tokio::time::Instant::now();
                let (s, o) = (store.clone(), out.clone());
                let _ = tokio::task::spawn_blocking(move || sweep(s.as_ref(), &o)).await;
            }
        }
    });
}

/// Marks every orphan aborted, saying why; returns how many.
pub fn sweep(store: &dyn Store, out: &EventHub) -> usize {
    let orphans = match store.orphaned_runs(now_ms()) {
        Ok(o) => o,
        Err(e) => {
            out.note(&format!("steppe: looking for runs left by a stopped coordinator: {e}"));
            return 0;
        }
    };
    let mut marked = 0;
    for r in orphans {
        // A submission a coordinator kept its files for: that coordinator
        // takes the run over (`RunService::take_over_orphans`).
        let kept = store.value(&steppe_runtime::store::Scope::new(&r.team, &r.pipeline), &format!("submission:{}", r.id)).ok().flatten();
        if kept.is_some_and(|root| std::path::Path::new(&root).is_dir()) {
            continue;
        }
        let rec = RunRecord { finished_ms: Some(now_ms()), outcome: Some("aborted".into()), message: ORPHAN_MESSAGE.into(), ..r };
        match store.finish_run(&rec) {
            Ok(()) => {
                marked += 1;
                out.note(&format!("steppe: run {} ({}/{}, job {}) was left running by {}, which stopped; marked aborted", rec.id, if rec.team.is_empty() { "-" } else { &rec.team }, rec.pipeline, rec.job, rec.owner));
            }
            Err(e) => out.note(&format!("steppe: marking run {} aborted: {e}", rec.id)),
        }
    }
    marked
}
