//! The watcher's build queue, kept in the run store: a row per job waiting
//! (a running job may have one more), claimed in order under `serial`,
//! `serial_groups` and `max_in_flight`; and each job's breaker
//! (`max_consecutive_failures`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use steppe_language::model::Job;
use steppe_runtime::store::{Scope, Store, StoreError};

const QUEUE: &str = "watch:queue";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Pending,
    Running,
}

/// A build of a job, waiting or running.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    pub job: String,
    pub state: State,
    pub queued_ms: i64,
    /// What queued it: a resource's new version, a webhook, an upstream job.
    pub why: String,
}

/// How many builds of a job may run at once, and the groups it shares a lock with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    pub max_in_flight: Option<usize>,
    pub groups: Vec<String>,
}

impl Limits {
    pub fn of(job: &Job) -> Self {
        let groups = job.serial_groups.clone().unwrap_or_default();
        let max_in_flight = if job.serial == Some(true) || !groups.is_empty() {
            Some(1)
        } else {
            job.max_in_flight.filter(|n| *n > 0).map(|n| n as usize)
        };
        Limits { max_in_flight, groups }
    }
}

pub fn load(store: &dyn Store, scope: &Scope) -> Result<Vec<Row>, StoreError> {
    Ok(store.value(scope, QUEUE)?.and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default())
}

pub fn save(store: &dyn Store, scope: &Scope, rows: &[Row]) -> Result<(), StoreError> {
    store.set_value(scope, QUEUE, Some(&serde_json::to_string(rows).unwrap_or_default()))
}

/// Queues a build of `job` unless one waits already. Whether it queued one.
pub fn enqueue(rows: &mut Vec<Row>, job: &str, why: &str, now_ms: i64) -> bool {
    if rows.iter().any(|r| r.job == job && r.state == State::Pending) {
        return false;
    }
    rows.push(Row { job: job.to_string(), state: State::Pending, queued_ms: now_ms, why: why.to_string() });
    true
}

/// Builds a watcher left running when it stopped wait again.
pub fn reset_interrupted(rows: &mut [Row]) -> usize {
    let mut n = 0;
    for r in rows.iter_mut().filter(|r| r.state == State::Running) {
        r.state = State::Pending;
        n += 1;
    }
    n
}

/// The first waiting build its limits let run now, marked running; else
/// what holds each waiting job back (job, the reason).
pub fn claim(rows: &mut [Row], limits: &HashMap<String, Limits>, paused: &dyn Fn(&str) -> bool) -> Result<String, Vec<(String, String)>> {
    let running: Vec<String> = rows.iter().filter(|r| r.state == State::Running).map(|r| r.job.clone()).collect();
    let mut held = Vec::new();
    let none = Limits::default();
    for i in 0..rows.len() {
        if rows[i].state != State::Pending {
            continue;
        }
        let job = rows[i].job.clone();
        if paused(&job) {
            held.push((job, "paused by its breaker (steppe jobs --resume)".to_string()));
            continue;
        }
        // A job no longer in the pipeline runs one at a time.
        let l = limits.get(&job).unwrap_or(&none);
        let cap = if limits.contains_key(&job) { l.max_in_flight } else { Some(1) };
        let mine = running.iter().filter(|r| **r == job).count();
        if cap.is_some_and(|c| mine >= c) {
            held.push((job, format!("{mine} build(s) running, max_in_flight {}", cap.unwrap_or(0))));
            continue;
        }
        let holder = running.iter().find_map(|r| {
            let theirs = limits.get(r).map(|o| o.groups.as_slice()).unwrap_or(&[]);
            l.groups.iter().find(|g| theirs.contains(g)).map(|g| (r.clone(), g.clone()))
        });
        if let Some((other, group)) = holder {
            held.push((job, format!("serial group {group} is held by {other}")));
            continue;
        }
        rows[i].state = State::Running;
        return Ok(job);
    }
    Err(held)
}

/// A build of `job` ended: its running row goes.
pub fn finish(rows: &mut Vec<Row>, job: &str) {
    if let Some(i) = rows.iter().position(|r| r.job == job && r.state == State::Running) {
        rows.remove(i);
    }
}

/// A job's consecutive failed triggered builds, and whether they paused it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Breaker {
    pub failures: u32,
    pub paused: bool,
}

fn breaker_key(job: &str) -> String {
    format!("watch:breaker:{job}")
}

pub fn breaker(store: &dyn Store, scope: &Scope, job: &str) -> Breaker {
    store.value(scope, &breaker_key(job)).ok().flatten().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default()
}

pub fn set_breaker(store: &dyn Store, scope: &Scope, job: &str, b: &Breaker) -> Result<(), StoreError> {
    let value = (b != &Breaker::default()).then(|| serde_json::to_string(b).unwrap_or_default());
    store.set_value(scope, &breaker_key(job), value.as_deref())
}

/// Counts a triggered build's end: a failure adds one (pausing the job at
/// `max`, when set), a success clears the count. Whether it paused the job now.
pub fn count(b: &mut Breaker, succeeded: bool, max: Option<i64>) -> bool {
    if succeeded {
        *b = Breaker::default();
        return false;
    }
    b.failures += 1;
    let trip = max.is_some_and(|m| m > 0 && i64::from(b.failures) >= m) && !b.paused;
    b.paused |= trip;
    trip
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(pairs: &[(&str, Option<usize>, &[&str])]) -> HashMap<String, Limits> {
        pairs.iter().map(|(j, m, g)| (j.to_string(), Limits { max_in_flight: *m, groups: g.iter().map(|s| s.to_string()).collect() })).collect()
    }

    #[test]
    fn one_waiting_build_per_job_and_a_running_one_may_have_one_more() {
        let mut rows = Vec::new();
        assert!(enqueue(&mut rows, "a", "v1", 1));
        assert!(!enqueue(&mut rows, "a", "v2", 2), "one waits already");
        let l = limits(&[("a", None, &[])]);
        assert_eq!(claim(&mut rows, &l, &|_| false), Ok("a".to_string()));
        assert!(enqueue(&mut rows, "a", "v3", 3), "a running job may have one more");
        assert_eq!(rows.len(), 2);
        finish(&mut rows, "a");
        assert_eq!(rows, vec![Row { job: "a".into(), state: State::Pending, queued_ms: 3, why: "v3".into() }]);
    }

    #[test]
    fn serial_groups_and_max_in_flight_hold_builds_back_and_say_who_holds_them() {
        let mut rows = Vec::new();
        for j in ["deploy", "migrate", "test", "deploy"] {
            rows.push(Row { job: j.into(), state: State::Pending, queued_ms: 0, why: String::new() });
        }
        let l = limits(&[("deploy", Some(1), &["prod"]), ("migrate", Some(1), &["prod"]), ("test", Some(2), &[])]);
        assert_eq!(claim(&mut rows, &l, &|_| false), Ok("deploy".into()));
        assert_eq!(claim(&mut rows, &l, &|_| false), Ok("test".into()), "migrate shares prod with the running deploy");
        let held = claim(&mut rows, &l, &|_| false).unwrap_err();
        assert!(held.contains(&("migrate".into(), "serial group prod is held by deploy".into())), "{held:?}");
        assert!(held.iter().any(|(j, why)| j == "deploy" && why.contains("max_in_flight 1")), "{held:?}");
        finish(&mut rows, "deploy");
        assert_eq!(claim(&mut rows, &l, &|_| false), Ok("migrate".into()));
        assert_eq!(claim(&mut rows, &l, &|j| j == "deploy").unwrap_err()[0].1, "paused by its breaker (steppe jobs --resume)");
        assert_eq!(reset_interrupted(&mut rows), 2);
    }

    #[test]
    fn the_breaker_trips_at_its_count_and_a_success_resets_it() {
        let mut b = Breaker::default();
        assert!(!count(&mut b, false, Some(2)));
        assert!(count(&mut b, false, Some(2)));
        assert!(b.paused && b.failures == 2);
        assert!(!count(&mut b, false, Some(2)), "trips once");
        count(&mut b, true, Some(2));
        assert_eq!(b, Breaker::default());
        assert!(!count(&mut b, false, None) && b.failures == 1, "counted even when off");
    }

    #[test]
    fn serial_and_groups_mean_one_at_a_time() {
        let job = |y: &str| -> Job {
            let text = format!("jobs:\n- name: j\n{y}  plan:\n  - task: t\n    run: 'true'\n");
            steppe_language::load_str(&text, std::path::Path::new("p.yml"), &Default::default()).expect("loads").pipeline.jobs[0].clone()
        };
        assert_eq!(Limits::of(&job("  serial: true\n")).max_in_flight, Some(1));
        assert_eq!(Limits::of(&job("  serial_groups: [a]\n")), Limits { max_in_flight: Some(1), groups: vec!["a".into()] });
        assert_eq!(Limits::of(&job("  max_in_flight: 3\n")).max_in_flight, Some(3));
        assert_eq!(Limits::of(&job("")).max_in_flight, None);
    }
}
