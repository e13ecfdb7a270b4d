//! A pulling worker's place in its coordinator's line: while it has a slot
//! free and found the queue empty it says so (`Waiting`), and the
//! coordinator hands it work on the session instead of queueing it, or
//! tells it to look at the queue again (`Look`). A hand-over spends the
//! wait; the worker says it again when a slot frees.

use steppe_proto::v1::{worker_message, Waiting, WorkerMessage};
use tokio::sync::{mpsc, Mutex, Notify};

pub struct Hands {
    session: mpsc::Sender<WorkerMessage>,
    /// Whether the coordinator was last told this worker waits, and how many
    /// times it was told since the last hand-over. Held across the send, so
    /// what the coordinator reads is the order it changed in.
    waiting: Mutex<(bool, u32)>,
    /// Told to look at the queue again.
    pub look: Notify,
}

impl Hands {
    pub fn new(session: mpsc::Sender<WorkerMessage>) -> Hands {
        Hands { session, waiting: Mutex::new((false, 0)), look: Notify::new() }
    }

    /// It waits with a slot free: in line (said once).
    pub async fn enter(&self) {
        self.say(true).await
    }

    /// It found work on the queue for its free slot: out of line.
    pub async fn leave(&self) {
        self.say(false).await
    }

    /// An assignment was handed over: that wait is spent (the coordinator
    /// left the line when it handed it), and the coordinator is told when
    /// it still waits (a slot free), or when what it was told since the
    /// last hand-over was more than the one `Waiting` this answers: one of
    /// those may reach it after the hand-over and leave it believing
    /// otherwise. Otherwise nothing is sent: a step handed over costs no
    /// message besides its result.
    pub async fn handed(&self, still_waiting: bool) {
        let mut said = self.waiting.lock().await;
        let told = std::mem::take(&mut said.1);
        said.0 = still_waiting;
        if still_waiting || told > 1 {
            said.1 = 1;
            self.tell(still_waiting).await;
        }
    }

    async fn say(&self, waiting: bool) {
        let mut said = self.waiting.lock().await;
        if said.0 != waiting {
            *said = (waiting, said.1 + 1);
            self.tell(waiting).await;
        }
    }

    /// Sends `Waiting` (the caller holds `waiting`, so sends keep its order).
    async fn tell(&self, waiting: bool) {
        let _ = self.session.send(WorkerMessage { msg: Some(worker_message::Msg::Waiting(Waiting { waiting })) }).await;
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
        assert!(said(&mut rx).is_empty(), "the one wait said was the one handed over: nothing to correct");
        hands.leave().await;
        assert!(said(&mut rx).is_empty(), "out of line already");
        hands.enter().await;
        hands.leave().await;
        assert_eq!(said(&mut rx), [true, false]);
    }

    #[tokio::test]
    async fn after_a_hand_over_the_coordinator_is_told_what_it_may_have_misread() {
        let (tx, mut rx) = mpsc::channel(8);
        let hands = Hands::new(tx);
        // In line, out (it found an entry), in again: the coordinator may
        // read the last after it handed this one over.
        hands.enter().await;
        hands.leave().await;
        hands.enter().await;
        assert_eq!(said(&mut rx), [true, false, true]);
        hands.handed(false).await;
        assert_eq!(said(&mut rx), [false], "slots full: told so after the hand-over");
        hands.enter().await;
        assert_eq!(said(&mut rx), [true]);
        hands.handed(true).await;
        assert_eq!(said(&mut rx), [true], "a slot still free: in line again, told so");
        hands.enter().await;
        assert!(said(&mut rx).is_empty(), "in line already");
        hands.handed(false).await;
        assert!(said(&mut rx).is_empty(), "the wait said last was the one handed over");
    }
}
