//! The queue of embedded mode: a FIFO in this process's memory.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;

use super::{BoxFuture, Queue, QueueError};
use crate::assignment::Assignment;

/// A FIFO in this process's memory (no leases: if the process dies, so does everything it held).
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
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        if let Ok(mut q) = self.items.lock() {
            q.push_back(a);
        }
        self.ready.notify_one();
        Box::pin(async { Ok(()) })
    }

    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                let notified = self.ready.notified();
                let (item, more) = match self.items.lock() {
                    Ok(mut q) => {
                        let item = q.pop_front();
                        (item, !q.is_empty())
                    }
                    Err(_) => (None, false),
                };
                if let Some(a) = item {
                    // Someone else may be waiting for the next item.
                    if more {
                        self.ready.notify_one();
                    }
                    return Ok(a);
                }
                notified.await;
            }
        })
    }

    fn pop_within(&self, wait: std::time::Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        // The in-process pop takes an item and returns without awaiting in
        // between, so cutting it short loses nothing.
        Box::pin(async move {
            if wait.is_zero() {
                // A look: no timer for a queue that is in memory.
                let item = self.items.lock().ok().and_then(|mut q| q.pop_front());
                return Ok(item);
            }
            Ok(tokio::time::timeout(wait, self.pop()).await.ok().transpose()?)
        })
    }

    fn pop_is_cancel_safe(&self) -> bool {
        true
    }

    fn ack(&self, _id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        let removed = match self.items.lock() {
            Ok(mut q) => {
                let before = q.len();
                q.retain(|a| a.id != id);
                q.len() != before
            }
            Err(_) => false,
        };
        Box::pin(async move { Ok(removed) })
    }
}
