//! Blocks: `do`, `try`, `in_parallel` (limit, fail_fast) and `race`.

use std::sync::Arc;

use steppe_language::model::Step;

use super::run::*;
use futures::future::join_all;

impl JobRun {
    pub(super) async fn do_block(self: &Arc<Self>, steps: &[Step]) -> Done {
        let mut log = Vec::new();
        for s in steps {
            let d = self.step(s, Vec::new(), false).await;
            log.extend(d.log);
            if let Err(e) = d.result {
                return Done::err(e, log);
            }
        }
        Done::ok(log)
    }

    pub(super) async fn try_block(self: &Arc<Self>, s: &Step) -> Done {
        match &s.try_ {
            Some(inner) => self.step(inner, Vec::new(), false).await,
            None => Done::ok(Vec::new()),
        }
    }

    pub(super) async fn parallel(self: &Arc<Self>, steps: &[Step], limit: Option<usize>, fail_fast: bool) -> Done {
        let gate = Arc::new(tokio::sync::Semaphore::new(limit.unwrap_or(steps.len().max(1))));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let futs = steps.iter().map(|s| {
            let gate = gate.clone();
            let stop = stop.clone();
            async move {
                let _permit = gate.acquire_owned().await;
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return None;
                }
                let d = self.step(s, Vec::new(), false).await;
                if fail_fast && d.result.is_err() {
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                Some(d)
            }
        });
        let results = join_all(futs).await;
        let mut log = Vec::new();
        let mut errors = Vec::new();
        for d in results.into_iter().flatten() {
            log.extend(d.log);
            if let Err(e) = d.result {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Done::ok(log)
        } else {
            Done::err(combined(&errors, ""), log)
        }
    }

    pub(super) async fn race(self: &Arc<Self>, steps: &[Step]) -> Done {
        let mut futs: Vec<BoxFut<'_, Done>> = steps.iter().map(|s| self.step(s, Vec::new(), false)).collect();
        let mut errors = Vec::new();
        while !futs.is_empty() {
            let (d, _, rest) = select_all(futs).await;
            futs = rest;
            if d.result.is_ok() {
                // Losers are dropped: their commands are killed and record nothing.
                return Done { log: d.log, ..Done::ok(Vec::new()) };
            }
            if let Err(e) = d.result {
                errors.push(e);
            }
        }
        Done::err(combined(&errors, "race: every branch failed: "), Vec::new())
    }
}

/// Waits for the first future to finish; returns it, its index and the rest.
pub(super) async fn select_all<'a, T>(futs: Vec<BoxFut<'a, T>>) -> (T, usize, Vec<BoxFut<'a, T>>) {
    futures::future::select_all(futs).await
}
