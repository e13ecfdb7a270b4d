//! A run's events: what happened in it, in order, as the store keeps them
//! for followers (`steppe runs --follow`, the dashboard's live view).

/// Something that happened in a run, in the order it happened: `kind` is
/// `started` / `ended` (a step; `ended`'s message is its outcome word),
/// `note` (a retry, a failover, a wait …), or `stdout` / `stderr` (a line a
/// running step wrote, kept so a follower sees it before the step ends).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunEvent {
    /// When (Unix milliseconds).
    pub at_ms: i64,
    pub kind: String,
    pub step: String,
    pub message: String,
}

impl RunEvent {
    pub fn now(kind: &str, step: &str, message: &str) -> Self {
        RunEvent { at_ms: now_ms(), kind: kind.to_string(), step: step.to_string(), message: message.to_string() }
    }

    /// A line of live output.
    pub fn is_output(&self) -> bool {
        self.kind == "stdout" || self.kind == "stderr"
    }
}

/// The time now in Unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A step's latest state as the events tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepState {
    pub step: String,
    /// `running`, or the outcome word it ended with.
    pub state: String,
    /// When it (last) started, Unix milliseconds (0 when unknown).
    pub started_ms: i64,
}

impl StepState {
    pub fn running(&self) -> bool {
        self.state == "running"
    }
}

/// Each step's latest state, in the order the steps first started.
pub fn step_states(events: &[RunEvent]) -> Vec<StepState> {
    let mut order: Vec<StepState> = Vec::new();
    for e in events {
        let state = match e.kind.as_str() {
            "started" => "running",
            "ended" => e.message.split_whitespace().next().unwrap_or("ended"),
            _ => continue,
        };
        let at = order.iter().position(|s| s.step == e.step);
        let s = match at {
            Some(i) => &mut order[i],
            None => {
                order.push(StepState { step: e.step.clone(), state: String::new(), started_ms: 0 });
                order.last_mut().expect("just pushed")
            }
        };
        s.state = state.to_string();
        if e.kind == "started" {
            s.started_ms = e.at_ms;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_running_from_its_start_until_it_ends_and_a_retry_starts_it_again() {
        let at = |ms, kind: &str, step: &str, message: &str| RunEvent { at_ms: ms, ..RunEvent::now(kind, step, message) };
        let events = [at(1, "started", "a", ""), at(2, "stdout", "a", "hi"), at(3, "started", "b", ""), at(4, "ended", "a", "failed"), at(5, "note", "", "retrying"), at(6, "started", "a", "")];
        let got: Vec<(String, String, i64)> = step_states(&events).into_iter().map(|s| (s.step, s.state, s.started_ms)).collect();
        assert_eq!(got, [("a".into(), "running".into(), 6), ("b".into(), "running".into(), 3)]);
        let ended = step_states(&events[..4]);
        assert_eq!(ended[0].state, "failed");
        assert!(!ended[0].running() && ended[1].running());
    }
}
