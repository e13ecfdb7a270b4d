//! The Dispatcher's writes to remote queues, off its path: a push or an
//! acknowledgement there is a round trip, and the actor awaiting each one
//! served every other message (a worker's result, the next step) only after
//! it. Writes are taken in the order they were asked for and those waiting
//! together go out together (one pipelined round trip on Redis).

use std::sync::Arc;

use steppe_runtime::assignment::Assignment;
use steppe_runtime::queue::Queue;
use tokio::sync::mpsc;

/// Told of a push that failed: the assignment's id and why.
pub type OnFailed = Arc<dyn Fn(String, String) + Send + Sync>;

enum Write {
    Push(Arc<dyn Queue>, Assignment),
    Ack(Arc<dyn Queue>, String),
}

/// Most writes sent in one go.
const BATCH: usize = 256;

#[derive(Clone)]
pub struct QueueWriter {
    tx: mpsc::UnboundedSender<Write>,
}

impl QueueWriter {
    /// Starts the writer; a push that fails is told to `failed` (so the
    /// step waiting for it errors).
    pub fn start(failed: OnFailed) -> QueueWriter {
        let (tx, mut rx) = mpsc::unbounded_channel::<Write>();
        tokio::spawn(async move {
            let mut batch = Vec::with_capacity(BATCH);
            while rx.recv_many(&mut batch, BATCH).await > 0 {
                // Each write's command is sent when its future is first
                // polled, in order; they are answered together.
                let writes = batch.drain(..).map(|w| {
                    let failed = failed.clone();
                    async move {
                        match w {
                            Write::Push(q, a) => {
                                let id = a.id.clone();
                                if let Err(e) = q.push(a).await {
                                    failed(id, e.to_string());
                                }
                            }
                            // An entry acknowledged late that comes back is no
                            // longer wanted, and is dropped: nothing waits on it.
                            Write::Ack(q, id) => {
                                let _ = q.ack(&id).await;
                            }
                        }
                    }
                });
                futures::future::join_all(writes).await;
            }
        });
        QueueWriter { tx }
    }

    /// Queues a push; false when the writer is gone (the runtime is
    /// stopping), and the step is not queued.
    pub fn push(&self, q: Arc<dyn Queue>, a: Assignment) -> bool {
        self.tx.send(Write::Push(q, a)).is_ok()
    }

    pub fn ack(&self, q: Arc<dyn Queue>, id: String) {
        let _ = self.tx.send(Write::Ack(q, id));
    }
}
