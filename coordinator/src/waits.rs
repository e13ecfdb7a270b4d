//! Steps waiting in a queue longer than a second, said on their run — and
//! when no connected worker serves their pool, said so with what to start;
//! how many wait at all, for the terminal's status line.

use std::sync::Arc;
use std::time::Duration;

use crate::dispatch::{Dispatcher, LongWait};
use crate::event_hub::EventHub;
use crate::registry::{WorkerInfo, WorkerRegistry};

/// How long a step waits for a worker before its run is told.
const TELL_AFTER: Duration = Duration::from_secs(1);

/// Tells each run of its steps' long waits (and the EventHub how many
/// steps wait), until the process ends.
pub fn tell_long_waits(dispatcher: Arc<Dispatcher>, registry: WorkerRegistry, hub: Arc<EventHub>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_millis(250), Duration::from_millis(250));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut told_waiting = 0;
        loop {
            every.tick().await;
            let waiting = dispatcher.figures().await.iter().map(|f| usize::try_from(f.waiting).unwrap_or(0)).sum::<usize>();
            if waiting != told_waiting {
                hub.waiting(waiting);
                told_waiting = waiting;
            }
            let waits = dispatcher.long_waits(TELL_AFTER).await;
            if waits.is_empty() {
                continue;
            }
            let workers = registry.list().await;
            // One line per run and pool: a matrix that waits says so once.
            let mut grouped: std::collections::BTreeMap<(String, String), Vec<LongWait>> = Default::default();
            for w in waits {
                grouped.entry((w.run_id.clone(), w.pool.clone())).or_default().push(w);
            }
            for ((run_id, _), group) in grouped {
                hub.run_note(&run_id, &line(&group, &workers));
            }
        }
    });
}

/// `⧗ compile has waited 1.0s for a worker of pool gpu …` (the first of
/// `waits`, all of one run and pool, naming how many more).
fn line(waits: &[LongWait], workers: &[WorkerInfo]) -> String {
    let Some(w) = waits.first() else { return String::new() };
    let (pool, containers) = match w.pool.strip_suffix(steppe_runtime::queue::CONTAINERS) {
        Some(p) => (p, true),
        None => (w.pool.as_str(), false),
    };
    let serving: Vec<&WorkerInfo> = workers.iter().filter(|i| i.serves(&w.pool)).collect();
    let what = if containers { format!("a worker of pool {pool} that runs containers") } else { format!("a worker of pool {pool}") };
    let waited = format!("{:.1}s", w.waited.as_secs_f64());
    let mut step = steppe_runtime::printable::escape_controls(&w.step).into_owned();
    if waits.len() > 1 {
        step = format!("{step} (and {} more step(s))", waits.len() - 1);
    }
    if serving.is_empty() {
        let start = if pool == steppe_runtime::queue::DEFAULT_POOL { "steppe worker --coordinator URL".to_string() } else { format!("steppe worker --coordinator URL --pool {pool}") };
        let docker = if containers { " on a host with a Docker engine" } else { "" };
        format!("⧗ {step} has waited {waited} for {what}, and none is connected: it waits until one is (start one with `{start}`{docker})")
    } else {
        let slots: u32 = serving.iter().map(|i| i.slots).sum();
        format!("⧗ {step} has waited {waited} for {what} ({} connected, {slots} slot(s), all busy)", serving.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(pool: &str, containers: bool) -> WorkerInfo {
        WorkerInfo { name: "w".into(), slots: 2, remote: true, pool: pool.into(), containers, last_seen_ago: Duration::ZERO }
    }

    #[test]
    fn a_long_wait_names_the_pool_and_says_when_no_worker_serves_it() {
        let wait = |pool: &str| [LongWait { run_id: "r".into(), step: "compile".into(), pool: pool.into(), waited: Duration::from_millis(1500) }];
        let none = line(&wait("gpu"), &[worker("default", true)]);
        assert!(none.contains("compile has waited 1.5s for a worker of pool gpu, and none is connected"), "{none}");
        assert!(none.contains("steppe worker --coordinator URL --pool gpu"), "{none}");
        let busy = line(&wait("gpu"), &[worker("gpu", false)]);
        assert!(busy.contains("(1 connected, 2 slot(s), all busy)"), "{busy}");
        let image = line(&wait("gpu.containers"), &[worker("gpu", false)]);
        assert!(image.contains("a worker of pool gpu that runs containers, and none is connected"), "{image}");
        assert!(image.contains("on a host with a Docker engine"), "{image}");
        let many = [wait("gpu")[0].clone(), wait("gpu")[0].clone(), wait("gpu")[0].clone()];
        let matrix = line(&many, &[worker("gpu", false)]);
        assert!(matrix.contains("compile (and 2 more step(s)) has waited 1.5s"), "{matrix}");
    }
}
