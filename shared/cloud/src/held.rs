//! What a consumer of a queue that cannot retire or remove a message by id
//! (SQS, Pub/Sub) keeps itself: the handle of each message it took (by
//! assignment id, with the epoch), what it pushed and nobody took yet, what
//! was removed meanwhile, and the dead letters it reported.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use steppe_runtime::assignment::Assignment;

pub struct Held<H> {
    taken: Mutex<HashMap<String, (u32, H)>>,
    pushed: Mutex<HashSet<String>>,
    removed: Mutex<HashSet<String>>,
    reported: Mutex<HashSet<String>>,
    /// Assignments too large for a message, pushed here as stand-ins: a
    /// consumer in this process gets them whole, one elsewhere from the
    /// coordinator with its Confirm.
    whole: Mutex<HashMap<String, Assignment>>,
}

impl<H> Default for Held<H> {
    fn default() -> Self {
        Held { taken: Mutex::default(), pushed: Mutex::default(), removed: Mutex::default(), reported: Mutex::default(), whole: Mutex::default() }
    }
}

/// What to do with a message just received.
pub enum Received<H> {
    /// Run it: its handle is kept.
    Run,
    /// Delete it unrun: removed while it waited, or an earlier handing-out
    /// of an assignment requeued since.
    Drop(H),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<H: Clone> Held<H> {
    /// Files a received message's assignment and handle.
    pub fn received(&self, a: &Assignment, handle: H) -> Received<H> {
        if lock(&self.removed).remove(&a.id) {
            return Received::Drop(handle);
        }
        let mut taken = lock(&self.taken);
        if taken.get(&a.id).is_some_and(|(epoch, _)| *epoch > a.epoch) {
            return Received::Drop(handle);
        }
        taken.insert(a.id.clone(), (a.epoch, handle));
        drop(taken);
        lock(&self.pushed).remove(&a.id);
        Received::Run
    }

    /// About to push `id`: the handle of its earlier taking here, to retire.
    pub fn pushing(&self, id: &str) -> Option<H> {
        let old = lock(&self.taken).remove(id).map(|(_, h)| h);
        lock(&self.pushed).insert(id.to_string());
        old
    }

    /// Done with `id`: its handle, if this consumer took it.
    pub fn release(&self, id: &str) -> Option<H> {
        lock(&self.whole).remove(id);
        lock(&self.taken).remove(id).map(|(_, h)| h)
    }

    /// What goes on the queue for `a`: itself, or a stand-in when its
    /// encoding (`size` bytes) is over `limit` (`a` is then kept here whole).
    pub fn to_send(&self, a: Assignment, size: usize, limit: usize) -> Assignment {
        if size <= limit {
            return a;
        }
        let stand_in = a.stand_in();
        lock(&self.whole).insert(a.id.clone(), a);
        stand_in
    }

    /// A received stand-in made whole, when this process pushed it.
    pub fn made_whole(&self, a: Assignment) -> Assignment {
        if !a.by_reference {
            return a;
        }
        match lock(&self.whole).get(&a.id) {
            Some(w) => Assignment { epoch: a.epoch, ..w.clone() },
            None => a,
        }
    }

    /// Marks `id` removed if it waits (pushed here, not taken here); whoever
    /// here takes it later deletes it unrun, and a worker elsewhere runs
    /// nothing the coordinator does not confirm.
    pub fn remove(&self, id: &str) -> bool {
        let waiting = !lock(&self.taken).contains_key(id) && lock(&self.pushed).remove(id);
        if waiting {
            lock(&self.removed).insert(id.to_string());
        }
        waiting
    }

    /// The handles of everything taken and not yet released (to extend).
    pub fn handles(&self) -> Vec<H> {
        lock(&self.taken).values().map(|(_, h)| h.clone()).collect()
    }

    /// True the first time a dead letter of this handing-out is seen.
    pub fn first_report(&self, a: &Assignment) -> bool {
        lock(&self.reported).insert(format!("{}#{}", a.id, a.epoch))
    }

    /// Forgets a taken message (a test stands in for a consumer that died).
    #[cfg(test)]
    pub fn forget(&self, id: &str) {
        lock(&self.taken).remove(id);
    }
}
