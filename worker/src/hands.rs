//! A pulling worker's place in its coordinator's line: while it has a slot
//! free and found the queue empty it says so (`Waiting`), and the
//! coordinator hands it work on the session instead of queueing it, or
//! tells it to look at the queue again (`Look`). A hand-over spends the
//! wait; the worker says it again when a slot frees.

use steppe_proto::v1::{worker_message, Waiting, WorkerMessage};
use tokio::sync::{mpsc, Mutex, Notify};

pub struct Hands {
    session: mpsc::Sender<WorkerMessage>,
    /// Whether the coordinator was last told this worker waits. Held across
    /// the send, so what the coordinator reads is the order it changed in.
    waiting: Mutex<bool>,
    /// Told to look at the queue again.
    pub look: Notify,
}

impl Hands {
    pub fn new(session: mpsc::Sender<WorkerMessage>) -> Hands {
        Hands { session, waiting: Mutex::new(false), look: Notify::new() }
    }

    /// It waits with a slot free: in line (said once).
    pub async fn enter(&self) {
        self.say(true).await
    }

    /// It found work on the queue for its free slot: out of line.
    pub async fn leave(&self) {
        self.say(false).await
    }

    /// An assignment was handed over: that wait is spent, and the
    /// coordinator is told afresh whether it still waits (a slot free).
    /// Said even when unchanged here: a `Waiting` the coordinator read just
    /// after it handed this one over may have left it believing otherwise.
    pub async fn handed(&self, still_waiting: bool) {
        let mut said = self.waiting.lock().await;
        *said = still_waiting;
        let _ = self.session.send(WorkerMessage { msg: Some(worker_message::Msg::Waiting(Waiting { waiting: still_waiting })) }).await;
    }

    async fn say(&self, waiting: bool) {
        let mut said = self.waiting.lock().await;
        if *said != waiting {
            *said = waiting;
            let _ = self.session.send(WorkerMessage { msg: Some(worker_message::Msg::Waiting(Waiting { waiting })) }).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(rx: &mut mpsc::Receiver<WorkerMessage>) -> Vec<bool> {
        let mut v = Vec::new();
        while let Ok(WorkerMessage { msg: Some(worker_message::Msg::Waiting(w)) }) = rx.try_recv() {
            v.push(w.waiting);
        }
        v
    }

    #[tokio::test]
    async fn a_wait_is_said_once_and_a_hand_over_spends_it() {
        let (tx, mut rx) = mpsc::channel(8);
        let hands = Hands::new(tx);
        hands.enter().await;
        hands.enter().await;
        assert_eq!(said(&mut rx), [true], "said once while it waits");
        hands.handed(false).await;
        assert_eq!(said(&mut rx), [false], "after a hand-over, said whatever it was");
        hands.leave().await;
        assert!(said(&mut rx).is_empty(), "out of line already");
        hands.handed(true).await;
        hands.enter().await;
        assert_eq!(said(&mut rx), [true], "a slot still free: in line again, said once");
        hands.leave().await;
        assert_eq!(said(&mut rx), [false]);
        hands.enter().await;
        hands.leave().await;
        assert_eq!(said(&mut rx), [true, false]);
    }
}
