//! Saying once that a backend is down, and once that it is back: a Redis
//! that restarts must not fill a log with the same error ten times a
//! second from every loop that uses it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a long outage is mentioned again.
const REMIND: Duration = Duration::from_secs(60);

struct Down {
    since: Instant,
    last_said: Instant,
    failures: u64,
}

static DOWN: Mutex<Option<HashMap<String, Down>>> = Mutex::new(None);
static ANY: AtomicBool = AtomicBool::new(false);

/// A failure of `what` (a backend, by name): the line to log when it starts
/// an outage, or when a minute passed since the last reminder; None otherwise.
pub fn failed(what: &str, err: &dyn std::fmt::Display) -> Option<String> {
    let mut g = DOWN.lock().ok()?;
    let down = g.get_or_insert_with(HashMap::new);
    ANY.store(true, Ordering::Relaxed);
    let now = Instant::now();
    match down.get_mut(what) {
        None => {
            down.insert(what.to_string(), Down { since: now, last_said: now, failures: 1 });
            Some(format!("{what}: {err} (retrying; said once until it changes)"))
        }
        Some(d) => {
            d.failures += 1;
            if now.duration_since(d.last_said) < REMIND {
                return None;
            }
            d.last_said = now;
            Some(format!("{what}: still failing after {}s ({} attempts): {err}", now.duration_since(d.since).as_secs(), d.failures))
        }
    }
}

/// `what` worked: the line to log when that ends an outage.
pub fn recovered(what: &str) -> Option<String> {
    if !ANY.load(Ordering::Relaxed) {
        return None;
    }
    let mut g = DOWN.lock().ok()?;
    let down = g.as_mut()?;
    let d = down.remove(what)?;
    if down.is_empty() {
        ANY.store(false, Ordering::Relaxed);
    }
    Some(format!("{what}: back after {}s", d.since.elapsed().as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_once_and_its_end_once() {
        let what = "outage-test-backend";
        assert!(recovered(what).is_none(), "nothing to say while it works");
        let first = failed(what, &"connection refused");
        assert!(first.is_some_and(|l| l.contains("connection refused")));
        for _ in 0..100 {
            assert!(failed(what, &"connection refused").is_none(), "repeats are quiet");
        }
        assert!(recovered(what).is_some_and(|l| l.contains("back after")));
        assert!(recovered(what).is_none());
    }
}
