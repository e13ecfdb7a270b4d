//! The hub's store writer: batches go to the store in order from a thread of
//! their own, so the store's round trips never hold up the hub's actor (the
//! only runtime thread of a one-thread coordinator).

use std::sync::Arc;

use steppe_runtime::store::{Batch, Store};
use tokio::sync::{mpsc, oneshot};

/// Batches waiting for the store past which the hub waits for it.
const WAITING_MAX: usize = 8;

type Job = (Batch, Option<oneshot::Sender<()>>);

pub struct Writer {
    store: Arc<dyn Store>,
    /// The thread, started with the first batch nobody waits for: a short
    /// process that only flushes at its end writes in place and starts none.
    thread: Option<mpsc::Sender<Job>>,
}

impl Writer {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Writer { store, thread: None }
    }

    /// Hands a batch to the thread (waiting only while [`WAITING_MAX`] are in line).
    pub async fn write(&mut self, batch: Batch) {
        if batch.is_empty() {
            return;
        }
        if self.thread.is_none() {
            self.thread = self.start();
        }
        match &self.thread {
            Some(tx) => {
                if let Err(mpsc::error::SendError((batch, _))) = tx.send((batch, None)).await {
                    write(self.store.as_ref(), &batch);
                }
            }
            None => write(self.store.as_ref(), &batch),
        }
    }

    /// Writes a batch and returns once it and every batch before it is in the store.
    pub async fn write_and_wait(&mut self, batch: Batch) {
        let Some(tx) = &self.thread else {
            write(self.store.as_ref(), &batch);
            return;
        };
        let (done, written) = oneshot::channel();
        match tx.send((batch, Some(done))).await {
            Ok(()) => {
                let _ = written.await;
            }
            Err(mpsc::error::SendError((batch, _))) => write(self.store.as_ref(), &batch),
        }
    }

    fn start(&self) -> Option<mpsc::Sender<Job>> {
        let (tx, mut rx) = mpsc::channel::<Job>(WAITING_MAX);
        let store = self.store.clone();
        let spawned = std::thread::Builder::new().name("steppe-store-writer".into()).spawn(move || {
            while let Some((batch, done)) = rx.blocking_recv() {
                write(store.as_ref(), &batch);
                if let Some(done) = done {
                    let _ = done.send(());
                }
            }
        });
        // Without a thread (none to be had) the hub writes in place, as it waits.
        spawned.ok().map(|_| tx)
    }
}

fn write(store: &dyn Store, batch: &Batch) {
    if batch.is_empty() {
        return;
    }
    match store.record_batch(batch) {
        Err(e) => store_failed(&e),
        Ok(()) => store_ok(),
    }
}

/// The store failing (Redis down) is said once, and its return once.
fn store_failed(e: &dyn std::fmt::Display) {
    if let Some(l) = steppe_runtime::outage::failed("recording history in the store", e) {
        eprintln!("steppe: {l}");
    }
}

fn store_ok() {
    if let Some(l) = steppe_runtime::outage::recovered("recording history in the store") {
        eprintln!("steppe: {l}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use steppe_runtime::store::{RunEvent, SqliteStore};

    fn batch(message: &str) -> Batch {
        Batch { events: vec![("r".into(), RunEvent::now("note", "", message))], ..Batch::default() }
    }

    #[tokio::test]
    async fn batches_reach_the_store_in_order_and_a_wait_covers_every_earlier_one() {
        let dir = std::env::temp_dir().join(format!("steppe-writer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&dir.join("s.db")).unwrap());
        let mut w = Writer::new(store.clone());
        // Only a flush so far: written in place, no thread started.
        w.write_and_wait(batch("first")).await;
        assert!(w.thread.is_none());
        for i in 0..50 {
            w.write(batch(&format!("{i}"))).await;
        }
        assert!(w.thread.is_some());
        w.write_and_wait(Batch::default()).await;
        let seen: Vec<String> = store.events("r").unwrap().into_iter().map(|e| e.message).collect();
        let expected: Vec<String> = std::iter::once("first".to_string()).chain((0..50).map(|i| i.to_string())).collect();
        assert_eq!(seen, expected);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
