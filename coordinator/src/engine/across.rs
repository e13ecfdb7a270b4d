//! `across`: a step run once per matrix cell (values, from_file, max_in_flight,
//! fail_fast), cell labels and templates, outputs collected per cell.

use std::sync::Arc;

use serde_json::{json, Value};
use steppe_language::model::{AcrossVar, Step, StepKind};
use steppe_runtime::artifacts::ArtifactRef;
use steppe_runtime::outcome::StepError;

use super::run::*;
use super::temp::{rand_suffix, TempDir};
use futures::future::join_all;
use steppe_language::template;

impl JobRun {
    /// An `across:` step: one cell per combination (last axis fastest).
    pub(super) async fn across(self: &Arc<Self>, s: &Step, kind: StepKind) -> Done {
        let axes = s.across.as_deref().unwrap_or(&[]);
        let mut values: Vec<(String, Vec<String>)> = Vec::new();
        for ax in axes {
            match self.axis_values(ax).await {
                Ok(v) => values.push((ax.var.clone().unwrap_or_default(), v)),
                Err(e) => return Done::err(e, Vec::new()),
            }
        }
        // Collected outputs land in <out>/<v1>/<v2>/…: every value, those
        // read from a file too, must be one plain directory name.
        if !s.output_names().is_empty() {
            let mut seen = std::collections::HashSet::new();
            for (var, vals) in &values {
                for v in vals {
                    if !steppe_language::validate::is_artifact_name(v) || !seen.insert((var.clone(), v.clone())) {
                        return Done::err(
                            StepError::failed(format!("across: value {v:?} of {var} cannot name a collected output directory (letters, digits, . _ - only, unique per axis)")),
                            Vec::new(),
                        );
                    }
                }
            }
        }
        let count = values.iter().map(|(_, v)| v.len()).fold(1usize, usize::saturating_mul);
        if count > steppe_language::validate::MAX_ACROSS_CELLS {
            return Done::err(
                StepError::failed(format!("across: its axes make {count} cells; one across step runs at most {}", steppe_language::validate::MAX_ACROSS_CELLS)),
                Vec::new(),
            );
        }
        let mut cells: Vec<Cell> = vec![Vec::new()];
        for (var, vals) in &values {
            let mut next = Vec::new();
            for c in &cells {
                for v in vals {
                    let mut c = c.clone();
                    c.push((var.clone(), v.clone()));
                    next.push(c);
                }
            }
            cells = next;
        }
        if cells.is_empty() || values.iter().any(|(_, v)| v.is_empty()) {
            self.engine.out.run_note(&self.run_id, &format!("across: 0 cells ({} is empty); nothing to run", s.name().unwrap_or("step")));
            return Done::ok(Vec::new());
        }
        // Cells of a top-level task without outputs are hashed one by one
        // (on the step before the block): one that succeeded before is skipped.
        let cell_parent = if kind == StepKind::Task && s.output_names().is_empty() && !self.engine.force { self.cell_parent(s) } else { None };
        // A cell is the step without its axes and with its own values: a
        // value added or removed rehashes no other cell. The step is written
        // once; each cell's hash adds its values.
        let cell_hashes: Vec<Option<String>> = match cell_parent.as_deref() {
            Some(parent) => {
                let mut content = self.content(s, None);
                if let Value::Object(m) = &mut content {
                    m.remove("across");
                }
                let content = steppe_runtime::store::canonical(&content);
                cells.iter().map(|c| Some(cell_hash(&content, c, parent))).collect()
            }
            None => vec![None; cells.len()],
        };
        // Which cells succeeded before: asked of the store at once.
        let succeeded = match self.engine.out.store() {
            Some(st) if cell_parent.is_some() => {
                let hashes: Vec<String> = cell_hashes.iter().flatten().cloned().collect();
                st.chains_succeeded(&self.engine.scope, &self.job.name, &hashes).unwrap_or_default()
            }
            _ => Default::default(),
        };
        let succeeded = &succeeded;
        let limit = s.max_in_flight.filter(|m| *m > 1).map(|m| m as usize).unwrap_or(1);
        let gate = Arc::new(tokio::sync::Semaphore::new(limit));
        // budget: checked before each cell against the across's counter in
        // the store (every cell's turns add to it, on whichever worker);
        // when spent, start no more (the plan goes on).
        let budget = s.budget.as_ref().and_then(|b| b.tokens).map(|t| t.max(0) as u64);
        let counter = budget.map(|_| {
            let mut counters = self.across_counters.lock().unwrap_or_else(|p| p.into_inner());
            let c = steppe_runtime::budget::across_counter(&self.run_id, counters.len());
            counters.insert(s as *const Step as usize, c.clone());
            c
        });
        let ledger = self.engine.dispatcher.ledger.clone();
        // The most the counter ever read, and what finished cells reported:
        // a counter that could not be read (a busy store) never looks like room.
        let (most_read, finished) = (Arc::new(std::sync::atomic::AtomicU64::new(0)), Arc::new(std::sync::atomic::AtomicU64::new(0)));
        let spent = || {
            let (ledger, counter, most_read, finished) = (ledger.clone(), counter.clone(), most_read.clone(), finished.clone());
            async move {
                let read = match counter {
                    Some(c) => ledger.spend(&c, 0).await.unwrap_or(0),
                    None => 0,
                };
                let most = most_read.fetch_max(read, std::sync::atomic::Ordering::Relaxed).max(read);
                most.max(finished.load(std::sync::atomic::Ordering::Relaxed))
            }
        };
        // What each cell holds of the budget while it runs (reserve_per_cell,
        // else the cell agent's own budget): a cell starts only when what is
        // spent and held leaves room for it, else waits for a cell to end.
        let reserve = s.budget.as_ref().and_then(|b| b.reserve_per_cell).or_else(|| s.agent.as_deref().and_then(|a| self.agent_def(a)).and_then(|d| d.budget.as_ref()).and_then(|b| b.tokens));
        let reserve = reserve.filter(|_| limit > 1).map(|r| r.max(0) as u64).unwrap_or(0);
        let held = Arc::new((std::sync::Mutex::new(0u64), tokio::sync::Notify::new()));
        // Cells are admitted in order: one waits for room, those after it queue (tokio's Mutex is FIFO).
        let admission = Arc::new(tokio::sync::Mutex::new(()));
        let stopped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let futs = cells.iter().zip(cell_hashes).map(|(c, cell_hash)| {
            let gate = gate.clone();
            let stopped = stopped.clone();
            let held = held.clone();
            let admission = admission.clone();
            let finished = finished.clone();
            async move {
                let _p = gate.acquire_owned().await;
                if let Some(b) = budget {
                    let _turn = admission.lock().await;
                    loop {
                        let now = spent().await;
                        if now >= b {
                            stopped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            return None;
                        }
                        let freed = held.1.notified();
                        {
                            let mut h = held.0.lock().unwrap_or_else(|p| p.into_inner());
                            if *h == 0 || now + *h + reserve <= b {
                                *h += reserve;
                                break;
                            }
                        }
                        // Spending moves without a cell ending: look again now and then.
                        let _ = tokio::time::timeout(std::time::Duration::from_millis(250), freed).await;
                    }
                }
                if let Some(h) = &cell_hash {
                    if succeeded.contains(h) {
                        let name = s.name().unwrap_or("step");
                        self.engine.out.run_note(&self.run_id, &format!("skip: {} (unchanged)", cell_label(name, c)));
                        return Some((c.clone(), Done::ok(Vec::new())));
                    }
                }
                let done = self.step(s, c.clone(), false).await;
                if let (Some(h), Ok(())) = (&cell_hash, &done.result) {
                    self.record_chain(h);
                }
                if let Some(o) = &done.agent {
                    finished.fetch_add(o.tokens, std::sync::atomic::Ordering::Relaxed);
                }
                if budget.is_some() {
                    let mut h = held.0.lock().unwrap_or_else(|p| p.into_inner());
                    *h = h.saturating_sub(reserve);
                    held.1.notify_waiters();
                }
                Some((c.clone(), done))
            }
        });
        let results: Vec<(Cell, Done)> = join_all(futs).await.into_iter().flatten().collect();
        let skipped = stopped.load(std::sync::atomic::Ordering::Relaxed);
        if let (Some(b), true) = (budget, skipped > 0) {
            let total = spent().await;
            self.engine.out.run_note(&self.run_id, &format!("budget: across stopped after {} of {} cells (spent {total} of {b} tokens)", cells.len() - skipped, cells.len()));
        }
        let mut log = Vec::new();
        let mut errors = Vec::new();
        let mut collected: Vec<(Cell, Vec<(String, ArtifactRef)>)> = Vec::new();
        for (c, d) in results {
            log.extend(d.log);
            match d.result {
                Ok(()) => collected.push((c, d.outputs)),
                Err(e) => errors.push(e),
            }
        }
        // Collected outputs: <out>/<v1>/<v2>/… from the cells that succeeded.
        let outs = s.output_names().to_vec();
        if !outs.is_empty() {
            let (store, scratch) = (self.engine.store.clone(), self.engine.scratch.clone());
            let res = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<(String, ArtifactRef)>> {
                let mut regs = Vec::new();
                for o in outs {
                    let tmp = TempDir(scratch.join(format!("collect-{o}-{}", rand_suffix())));
                    std::fs::create_dir_all(&tmp.0)?;
                    for (c, outputs) in &collected {
                        if let Some((_, r)) = outputs.iter().find(|(n, _)| n == &o) {
                            let mut dest = tmp.0.clone();
                            for (_, v) in c {
                                dest.push(v);
                            }
                            store.materialize(r, &dest)?;
                        }
                    }
                    regs.push((o, store.put_dir(&tmp.0)?));
                }
                Ok(regs)
            })
            .await;
            match res {
                Ok(Ok(regs)) => self.register(&regs),
                Ok(Err(e)) => errors.push(StepError::errored(format!("across: collecting outputs: {e}"))),
                Err(e) => errors.push(StepError::errored(format!("across: collecting outputs: {e}"))),
            }
        }
        if errors.is_empty() {
            Done::ok(log)
        } else {
            Done::err(combined(&errors, ""), log)
        }
    }

    /// The hash of the top-level step before `s` in this run's chain (""
    /// when `s` is first); none when `s` is not a top-level step.
    fn cell_parent(&self, s: &Step) -> Option<String> {
        let i = self.job.plan.iter().position(|p| std::ptr::eq(p, s))?;
        let bound: Vec<(String, Value)> = self.every.lock().map(|e| e.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
        let chains = self.chains.lock().ok()?;
        let chain = chains.iter().find(|c| c.set.as_ref().is_none_or(|set| set.iter().all(|kv| bound.contains(kv))))?;
        Some(if i == 0 { String::new() } else { chain.nodes.get(i - 1)?.hash.clone() })
    }

    pub(super) async fn axis_values(self: &Arc<Self>, ax: &AcrossVar) -> Result<Vec<String>, StepError> {
        if let Some(v) = &ax.values {
            return Ok(v.iter().map(|x| match x {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }).collect());
        }
        let Some(f) = &ax.from_file else { return Ok(Vec::new()) };
        let first = f.split('/').next().unwrap_or_default();
        let rest = f.splitn(2, '/').nth(1).unwrap_or_default().to_string();
        let r = self.artifact(first).ok_or_else(|| StepError::failed(format!("across from_file {f}: artifact \"{first}\" was not produced")))?;
        let tmp = self.temp("across");
        let store = self.engine.store.clone();
        let dest = tmp.0.clone();
        tokio::task::spawn_blocking(move || store.materialize(&r, &dest))
            .await
            .map_err(|e| StepError::errored(e.to_string()))?
            .map_err(|e| StepError::errored(format!("across from_file {f}: {e}")))?;
        let text = steppe_language::confine::resolve(&tmp.0, &rest, Some(&tmp.0), "the artifact").and_then(|p| steppe_language::confine::read_capped(&p, 1 << 20));
        drop(tmp);
        let text = text.map_err(|e| match e {
            steppe_language::confine::PathError::TooLarge { .. } => StepError::failed(format!("across from_file {f}: larger than 1 MiB")),
            e => StepError::failed(format!("across from_file {f}: \"{rest}\" {e}")),
        })?;
        let v: Vec<Value> = serde_json::from_slice(&text).map_err(|e| StepError::failed(format!("across from_file {f}: not a JSON array of strings: {e}")))?;
        if v.len() > 1000 {
            return Err(StepError::failed(format!("across from_file {f}: {} items; the limit is 1000", v.len())));
        }
        v.into_iter()
            .map(|x| x.as_str().map(str::to_string).ok_or_else(|| StepError::failed(format!("across from_file {f}: every item must be a string"))))
            .collect()
    }
}

/// A cell's chain hash: its step's content (canonical, without its axes)
/// and its values, as `{"cell": …, "content": …}`, under `parent`.
fn cell_hash(content: &str, cell: &Cell, parent: &str) -> String {
    let mut text = String::with_capacity(content.len() + 32 * cell.len() + 24);
    text.push_str("{\"cell\":");
    steppe_runtime::store::write_canonical(&json!(cell), &mut text);
    text.push_str(",\"content\":");
    text.push_str(content);
    text.push('}');
    steppe_runtime::merkle::node_hash_of_canonical("task", &text, parent)
}

/// A matrix cell's variables, in axis order.
pub(super) type Cell = Vec<(String, String)>;

pub(super) fn cell_label(name: &str, cell: &Cell) -> String {
    if name.contains("{{") {
        return render_cell(name, cell).unwrap_or_else(|_| name.to_string());
    }
    let pairs: Vec<String> = cell.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name} [{}]", pairs.join(" "))
}

pub(super) fn render_cell(text: &str, cell: &Cell) -> Result<String, String> {
    if cell.is_empty() || !text.contains("{{") {
        return Ok(text.to_string());
    }
    let vars: serde_json::Map<String, Value> = cell.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
    template::render(text, &json!({ "vars": vars }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell's hash is the step cache's node hash of `{content, cell}`,
    /// byte for byte what it was when each cell rebuilt the whole value:
    /// cells that succeeded before are still known after an upgrade.
    #[test]
    fn a_cells_hash_is_the_node_hash_of_its_content_and_values() {
        let content = json!({"task": "cell", "run": "echo {{ .vars.i }}", "env": {"B": "2", "A": "1"}});
        let cell: Cell = vec![("os".into(), "linux".into()), ("i".into(), "3\"".into())];
        let whole = steppe_runtime::merkle::node_hash("task", &json!({"content": content, "cell": cell}), "parent-hash");
        assert_eq!(cell_hash(&steppe_runtime::store::canonical(&content), &cell, "parent-hash"), whole);
        assert_ne!(cell_hash(&steppe_runtime::store::canonical(&content), &vec![("os".into(), "mac".into())], "parent-hash"), whole);
    }
}
