//! Where assignments wait for a worker. In-process here; Redis Streams, SQS
//! and Pub/Sub backends implement the same trait (with leases) for clusters.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use tokio::sync::Notify;

use crate::assignment::Assignment;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait Queue: Send + Sync {
    /// Adds an assignment at the back.
    fn push(&self, a: Assignment);
    /// Takes the oldest assignment, waiting until there is one.
    fn pop(&self) -> BoxFuture<'_, Assignment>;
    /// Removes a waiting assignment (a cancelled run); true if it was waiting.
    fn remove(&self, id: &str) -> bool;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A FIFO in this process's memory.
#[derive(Default)]
pub struct InProcessQueue {
    items: Mutex<VecDeque<Assignment>>,
    ready: Notify,
}

impl InProcessQueue {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Queue for InProcessQueue {
    fn push(&self, a: Assignment) {
        if let Ok(mut q) = self.items.lock() {
            q.push_back(a);
        }
        self.ready.notify_one();
    }

    fn pop(&self) -> BoxFuture<'_, Assignment> {
        Box::pin(async move {
            loop {
                let notified = self.ready.notified();
                if let Some(a) = self.items.lock().ok().and_then(|mut q| q.pop_front()) {
                    // Someone else may be waiting for the next item.
                    if !self.is_empty() {
                        self.ready.notify_one();
                    }
                    return a;
                }
                notified.await;
            }
        })
    }

    fn remove(&self, id: &str) -> bool {
        let Ok(mut q) = self.items.lock() else { return false };
        let before = q.len();
        q.retain(|a| a.id != id);
        q.len() != before
    }

    fn len(&self) -> usize {
        self.items.lock().map(|q| q.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::{Cwd, Judge};

    fn a(id: &str) -> Assignment {
        Assignment {
            id: id.into(),
            run_id: "r".into(),
            step: "s".into(),
            attempt: 1,
            command: "true".into(),
            env: vec![],
            cwd: Cwd::StepDir,
            inputs: vec![],
            outputs: vec![],
            timeout: None,
            judge: Judge::default(),
            image: None,
            stream: false,
            agent: None,
            fix: None,
        }
    }

    #[tokio::test]
    async fn fifo_waits_and_removes() {
        let q = std::sync::Arc::new(InProcessQueue::new());
        q.push(a("1"));
        q.push(a("2"));
        q.push(a("3"));
        assert!(q.remove("2"));
        assert!(!q.remove("2"));
        assert_eq!(q.pop().await.id, "1");
        assert_eq!(q.pop().await.id, "3");
        let q2 = q.clone();
        let waiter = tokio::spawn(async move { q2.pop().await.id });
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        q.push(a("4"));
        assert_eq!(waiter.await.unwrap(), "4");
        assert!(q.is_empty());
    }
}
