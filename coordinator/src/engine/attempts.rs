//! Attempts: a step's assignment dispatched again after a failure, with backoff,
//! until it passes, times out, is aborted or runs out of attempts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use steppe_runtime::assignment::Assignment;
use steppe_runtime::outcome::Class;

use super::run::*;

impl JobRun {
    /// Dispatches with retries: the whole operation again, backoff attempt × 500 ms;
    /// the step's own timeout ends the attempts.
    pub(super) async fn attempts(self: &Arc<Self>, label: &str, mut a: Assignment, attempts: i64) -> Done {
        let attempts = attempts.max(1) as u32;
        self.engine.out.start_step(&self.run_id, label);
        let t0 = Instant::now();
        let mut last = None;
        for n in 1..=attempts {
            a.attempt = n;
            let cx = self.span(format!("attempt {n}"), vec![opentelemetry::KeyValue::new("attempt", i64::from(n))]);
            let r = opentelemetry::context::FutureExt::with_context(self.dispatch(a.clone()), cx.clone()).await;
            super::spans::end_with(&cx, &r.result, false);
            let timed_out = matches!(&r.result, Err(e) if e.timed_out);
            let aborted = matches!(&r.result, Err(e) if e.class == Class::Aborted);
            let ok = r.result.is_ok();
            last = Some(r);
            if ok || timed_out || aborted || n == attempts || self.aborted() {
                break;
            }
            self.engine.out.run_note(&self.run_id, &format!("{label}: attempt {n} of {attempts} failed; retrying"));
            tokio::time::sleep(Duration::from_millis(500 * u64::from(n))).await;
        }
        let r = last.expect("at least one attempt");
        if let (Some(o), Ok(mut dn)) = (&r.agent, self.denials.lock()) {
            dn.extend(o.denials.iter().map(|d| (label.to_string(), d.clone())));
        }
        if let (Some(o), Ok(mut u)) = (&r.agent, self.usage.lock()) {
            // A task's agent outcome is its fixer's conversation.
            let who = a.fix.as_ref().map(|f| f.agent.clone()).unwrap_or_else(|| label.to_string());
            u.push((who, o.tokens));
        }
        self.ended_with(label, &r.result, t0.elapsed(), r.exit_code, r.agent.as_ref());
        Done { result: r.result.clone(), routed: r.result, log: vec![label.to_string()], skipped: false, outputs: r.outputs, agent: r.agent }
    }
}
