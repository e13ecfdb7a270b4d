//! What the steps of a run share wherever they run: token spending, one
//! counter per job budget (and per budgeted across) in the store, added to by
//! each model turn on whichever worker it runs, read before the next; and
//! the run's `ask_user` questions, filed where anyone can answer them.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use crate::store::{QuestionRecord, Store};

pub type SpendFuture<'a> = Pin<Box<dyn Future<Output = Result<u64, String>> + Send + 'a>>;
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, String>> + Send + 'a>>;

/// Where a step's spending goes: the store (embedded, the coordinator) or
/// the coordinator (a remote worker).
pub trait Ledger: Send + Sync {
    /// Adds `tokens` to `counter`; its new total. Adding 0 reads it.
    fn spend<'a>(&'a self, counter: &'a str, tokens: u64) -> SpendFuture<'a>;
    /// Files a question of run `q.run_id` (its team, pipeline and job are
    /// the run's), or finds the same one the run asked already: it, and
    /// whether it was filed now.
    fn ask<'a>(&'a self, q: QuestionRecord) -> LedgerFuture<'a, (QuestionRecord, bool)>;
    /// A question as it stands now.
    fn question(&self, id: i64) -> LedgerFuture<'_, Option<QuestionRecord>>;
    /// Records who answered it (None: nobody, it expired); false if it was settled already.
    fn settle<'a>(&'a self, id: i64, answer: Option<&'a str>, source: &'a str) -> LedgerFuture<'a, bool>;
}

/// Files `q` in `store`, under its run's team, pipeline and job.
pub fn file_question(store: &dyn Store, mut q: QuestionRecord) -> Result<(QuestionRecord, bool), String> {
    let run = store.run(&q.run_id).map_err(|e| e.to_string())?.ok_or_else(|| format!("no run {} to file a question under", q.run_id))?;
    (q.team, q.pipeline, q.job) = (run.team, run.pipeline, run.job);
    q.asked_ms = crate::store::now_ms();
    store.ask_question(&q).map_err(|e| e.to_string())
}

/// The counter of a run's job budget.
pub fn job_counter(run_id: &str) -> String {
    format!("{run_id}:job")
}

/// The counter of the `n`th budgeted across of a run.
pub fn across_counter(run_id: &str, n: usize) -> String {
    format!("{run_id}:across:{n}")
}

/// A counter names a run: `RUN:job` or `RUN:across:N`.
pub fn check_counter(counter: &str) -> Result<(), String> {
    let ok = match counter.split_once(':') {
        Some((run, "job")) => !run.is_empty(),
        Some((run, rest)) => !run.is_empty() && rest.strip_prefix("across:").is_some_and(|n| n.parse::<usize>().is_ok()),
        None => false,
    };
    if ok && counter.len() <= 256 {
        Ok(())
    } else {
        Err(format!("{counter:?} is not a spending counter (RUN:job or RUN:across:N)"))
    }
}

/// Counters kept in a store, or in memory when there is none.
pub struct StoreLedger {
    store: Option<Arc<dyn Store>>,
    memory: Mutex<HashMap<String, u64>>,
}

impl StoreLedger {
    pub fn new(store: Option<Arc<dyn Store>>) -> Self {
        StoreLedger { store, memory: Mutex::default() }
    }
}

impl Ledger for StoreLedger {
    fn spend<'a>(&'a self, counter: &'a str, tokens: u64) -> SpendFuture<'a> {
        Box::pin(async move {
            check_counter(counter)?;
            match &self.store {
                Some(store) => {
                    let (store, counter) = (store.clone(), counter.to_string());
                    tokio::task::spawn_blocking(move || store.add_spend(&counter, tokens)).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
                }
                None => {
                    let mut m = self.memory.lock().unwrap_or_else(|p| p.into_inner());
                    let total = m.entry(counter.to_string()).or_default();
                    *total += tokens;
                    Ok(*total)
                }
            }
        })
    }

    fn ask<'a>(&'a self, q: QuestionRecord) -> LedgerFuture<'a, (QuestionRecord, bool)> {
        Box::pin(async move {
            let store = self.store.clone().ok_or("no store to file a question in")?;
            tokio::task::spawn_blocking(move || file_question(store.as_ref(), q)).await.map_err(|e| e.to_string())?
        })
    }

    fn question(&self, id: i64) -> LedgerFuture<'_, Option<QuestionRecord>> {
        Box::pin(async move {
            let store = self.store.clone().ok_or("no store to read a question from")?;
            tokio::task::spawn_blocking(move || store.question(id)).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        })
    }

    fn settle<'a>(&'a self, id: i64, answer: Option<&'a str>, source: &'a str) -> LedgerFuture<'a, bool> {
        Box::pin(async move {
            let store = self.store.clone().ok_or("no store to record an answer in")?;
            let (answer, source) = (answer.map(str::to_string), source.to_string());
            tokio::task::spawn_blocking(move || store.settle_question(id, answer.as_deref(), &source, crate::store::now_ms())).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_name_a_run() {
        assert!(check_counter(&job_counter("r-1")).is_ok());
        assert!(check_counter(&across_counter("r-1", 3)).is_ok());
        for bad in ["", "job", ":job", "r-1:other", "r-1:across:x", "r-1:across:"] {
            assert!(check_counter(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn memory_counters_add_up() {
        let l = StoreLedger::new(None);
        assert_eq!(l.spend("r:job", 5).await, Ok(5));
        assert_eq!(l.spend("r:job", 0).await, Ok(5));
        assert!(l.spend("nonsense", 1).await.is_err());
    }
}
