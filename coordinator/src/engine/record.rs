//! What gets recorded: a step's end (terminal, store record with an agent's
//! detail), its output record, usage; and the dispatch every step goes through.

use std::time::Duration;

use serde_json::{json, Value};
use steppe_runtime::assignment::Assignment;
use steppe_runtime::outcome::{Outcome, StepError};

use super::run::*;

impl JobRun {
    /// A step ended: tell the terminal and record it.
    pub(super) fn ended(&self, label: &str, r: &Result<(), StepError>, took: Duration, exit_code: Option<i32>) {
        self.ended_with(label, r, took, exit_code, None);
    }

    pub(super) fn ended_with(&self, label: &str, r: &Result<(), StepError>, took: Duration, exit_code: Option<i32>, agent: Option<&steppe_runtime::agent_work::AgentOutcome>) {
        self.engine.out.end(&self.run_id, label, r, took);
        self.engine.out.record_step(steppe_runtime::store::StepRecord {
            run_id: self.run_id.clone(),
            seq: self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            name: label.to_string(),
            outcome: Outcome::of(r).word().to_string(),
            message: r.as_ref().err().map(|e| e.message.clone()).unwrap_or_default(),
            duration_ms: took.as_millis() as i64,
            exit_code,
            tokens: agent.map(|o| o.tokens as i64),
            detail: agent.map(|o| {
                let mut trajectory = o.trajectory.clone();
                for t in &mut trajectory {
                    // Recorded string arguments are capped at 16 KiB.
                    if let Some(obj) = t.args.as_object_mut() {
                        for v in obj.values_mut() {
                            if let Some(s) = v.as_str().filter(|s| s.len() > 16_384) {
                                let mut cut = 16_384;
                                while !s.is_char_boundary(cut) {
                                    cut -= 1;
                                }
                                *v = Value::String(s[..cut].to_string());
                            }
                        }
                    }
                }
                let mut response = o.response.clone();
                if response.len() > 256 * 1024 {
                    let mut cut = 256 * 1024;
                    while !response.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    response.truncate(cut);
                }
                json!({"verdict": o.verdict, "note": o.note, "turns": o.turns, "wrapped_up": o.wrapped_up, "fallback_model": o.fallback_model, "response": response, "trajectory": trajectory, "denials": o.denials, "transcript": o.transcript, "usage": usage_record(&o.usage)}).to_string()
            }),
        });
    }

    /// Hands an assignment to the Dispatcher. After Ctrl-C only hooks still
    /// run, for at most 60 s each (the cancel reached what was already running).
    pub(super) async fn dispatch(&self, mut a: Assignment) -> steppe_runtime::assignment::AssignmentResult {
        if self.aborted() {
            let grace = Duration::from_secs(60);
            a.timeout = Some(a.timeout.map_or(grace, |t| t.min(grace)));
        }
        // Steps with an image go to the pool's container queue, which only
        // workers that reach a Docker engine take from.
        a.pool = if a.uses_containers() { steppe_runtime::queue::container_pool(&self.engine.pool) } else { self.engine.pool.clone() };
        // The worker's spans join the run's trace under the current span (the attempt's).
        a.trace_parent = steppe_worker::telemetry::parent_of(&opentelemetry::Context::current());
        a.enqueued_unix_ns = steppe_worker::telemetry::now_ns();
        a.masked_env = self.engine.masked_env.clone();
        let step = a.step.clone();
        let mut r = self.engine.dispatcher.dispatch(a).await;
        self.engine.out.record_spans(&self.run_id, std::mem::take(&mut r.spans));
        self.engine.out.record_output(&self.run_id, &step, &r.output);
        r
    }

    pub(super) fn finish_err(&self, label: &str, e: StepError) -> Done {
        self.engine.out.start_step(&self.run_id, label);
        self.ended(label, &Err(e.clone()), Duration::ZERO, None);
        Done::err(e, vec![label.to_string()])
    }

    /// Tokens this run's agent conversations spent so far.
    pub(crate) fn spent(&self) -> u64 {
        self.usage.lock().map(|u| u.iter().map(|(_, t)| t).sum()).unwrap_or(0)
    }
}

/// 1234567 → "1,234,567".
pub(super) fn group(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The price table: shipped, with `$STEPPE_PRICES`'s overrides (a file that
/// does not load is said once, and the shipped prices serve).
fn prices() -> &'static steppe_runtime::prices::Prices {
    static PRICES: std::sync::OnceLock<steppe_runtime::prices::Prices> = std::sync::OnceLock::new();
    PRICES.get_or_init(|| {
        steppe_runtime::prices::Prices::from_env().unwrap_or_else(|e| {
            eprintln!("warning: {e}; the shipped prices are used");
            steppe_runtime::prices::Prices::shipped()
        })
    })
}

/// An agent step's usage as its record keeps it, priced: the provider's own
/// cost when it reported one, else the price table's, else none (unpriced).
fn usage_record(u: &steppe_runtime::agent_work::Usage) -> Value {
    let (cost, priced_by) = match u.cost_usd {
        Some(c) => (Some(c), Some("provider")),
        None if u.responses > 0 => match prices().cost(&u.model, u) {
            Some(c) => (Some(c), Some("table")),
            None => (None, None),
        },
        None => (None, None),
    };
    json!({"prompt": u.prompt, "completion": u.completion, "cached": u.cached, "reasoning": u.reasoning, "finish": u.finish, "model": u.model, "responses": u.responses, "cost_usd": cost, "priced_by": priced_by})
}
