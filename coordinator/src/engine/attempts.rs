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
        let mut last: Option<steppe_runtime::assignment::AssignmentResult> = None;
        // What failed attempts' conversations spent is the step's spend too.
        let (mut spent_before, mut usage_before) = (0u64, steppe_runtime::agent_work::Usage::default());
        for n in 1..=attempts {
            if let Some(o) = last.as_ref().and_then(|r| r.agent.as_ref()) {
                spent_before += o.tokens;
                usage_before.absorb(&o.usage);
            }
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
        let mut r = last.expect("at least one attempt");
        if let Some(o) = r.agent.as_mut() {
            o.tokens += spent_before;
            let mut all = usage_before;
            all.absorb(&o.usage);
            // How the step ended, and on which model, is the last attempt's.
            (all.model, all.finish) = (o.usage.model.clone(), o.usage.finish.clone());
            o.usage = all;
        }
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
