//! Watchers, a subscriber of the EventHub: each run's lines also sent to
//! whoever follows that run (a `steppe submit` waiting on the coordinator).

use std::collections::HashMap;

use tokio::sync::mpsc::UnboundedSender;

use super::Subscriber;

#[derive(Default)]
pub struct Watchers {
    by_run: HashMap<String, UnboundedSender<String>>,
}

impl Watchers {
    pub fn watch(&mut self, run_id: String, tx: UnboundedSender<String>) {
        self.by_run.insert(run_id, tx);
    }

    pub fn unwatch(&mut self, run_id: &str) {
        self.by_run.remove(run_id);
    }
}

impl Subscriber for Watchers {
    fn line(&mut self, run_id: &str, line: &str) {
        if let Some(tx) = self.by_run.get(run_id) {
            let _ = tx.send(line.to_string());
        }
    }
}
