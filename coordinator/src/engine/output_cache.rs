//! Reuse across builds (pipeline-language.md §6), kept in the run store:
//! the step output cache (on when `workspace.root` is set) gives a task
//! whose content and inputs match an earlier success that success's outputs
//! without running it; the resource cache (`workspace.cache.resources`)
//! gives a get a version fetched before, without running `in:`.

use serde_json::{json, Value};
use steppe_language::model::Step;
use steppe_runtime::artifacts::ArtifactRef;
use steppe_runtime::merkle::node_hash;

use super::run::*;

/// Resource-cache entries kept when `max_entries` is not set.
const RESOURCE_ENTRIES: usize = 50;

impl JobRun {
    /// The key a task's outputs are kept under, when it may reuse them: its
    /// own content and its inputs' contents (not its place in the chain).
    pub(super) fn output_key(&self, s: &Step, inputs: &[(String, ArtifactRef)], in_cell: bool) -> Option<String> {
        let ws = self.engine.pipeline.workspace.as_ref()?;
        ws.root.as_ref()?;
        let entry = self.entry(s);
        let outputs = s.outputs.as_ref().or_else(|| entry.and_then(|e| e.outputs.as_ref()))?;
        let excluded = outputs.is_empty()
            || in_cell
            || s.volatile == Some(true)
            || s.to.is_some()
            || s.verdicts.is_some()
            || s.context.as_ref().is_some_and(|c| c.from.is_some())
            || !s.hooks().is_empty()
            || s.fix.is_some()
            || entry.is_some_and(|e| e.fix.is_some());
        if excluded {
            return None;
        }
        let inputs: Vec<Value> = inputs.iter().map(|(n, r)| json!([n, r.digest])).collect();
        Some(node_hash("outputs", &json!({"content": self.content(s, None), "inputs": inputs}), ""))
    }

    /// Outputs kept under `key` by an earlier success.
    pub(super) fn reused_outputs(&self, key: &str) -> Option<Vec<(String, ArtifactRef)>> {
        let store = self.engine.out.store()?;
        let text = store.value(&self.engine.scope, &format!("outputs:{key}")).ok()??;
        let kept: serde_json::Map<String, Value> = serde_json::from_str(&text).ok()?;
        kept.into_iter().map(|(n, d)| d.as_str().filter(|d| steppe_runtime::artifacts::is_digest(d)).map(|d| (n, ArtifactRef { digest: d.to_string() }))).collect()
    }

    pub(super) fn keep_outputs(&self, key: &str, outputs: &[(String, ArtifactRef)]) {
        let Some(store) = self.engine.out.store() else { return };
        let kept: serde_json::Map<String, Value> = outputs.iter().map(|(n, r)| (n.clone(), Value::String(r.digest.clone()))).collect();
        if let Err(e) = store.set_value(&self.engine.scope, &format!("outputs:{key}"), Some(&Value::Object(kept).to_string())) {
            self.engine.out.run_note(&self.run_id, &format!("steppe: keeping outputs for reuse: {e}"));
        }
    }

    /// The resource cache's key for a fetch, when the cache is on.
    pub(super) fn fetch_key(&self, what: &Value) -> Option<String> {
        let ws = self.engine.pipeline.workspace.as_ref()?;
        ws.root.as_ref()?;
        ws.cache.as_ref().and_then(|c| c.resources).filter(|on| *on)?;
        Some(node_hash("fetch", what, ""))
    }

    /// A fetch cached under `key`, marked most recently used.
    pub(super) fn cached_fetch(&self, key: &str) -> Option<ArtifactRef> {
        let store = self.engine.out.store()?;
        let digest = store.value(&self.engine.scope, &format!("fetch:{key}")).ok()??;
        steppe_runtime::artifacts::is_digest(&digest).then(|| {
            self.touch_fetch(key);
            ArtifactRef { digest }
        })
    }

    /// Keeps a fetch, dropping the least recently used past `max_entries`.
    pub(super) fn keep_fetch(&self, key: &str, r: &ArtifactRef) {
        let Some(store) = self.engine.out.store() else { return };
        if store.set_value(&self.engine.scope, &format!("fetch:{key}"), Some(&r.digest)).is_ok() {
            self.touch_fetch(key);
        }
    }

    fn touch_fetch(&self, key: &str) {
        let Some(store) = self.engine.out.store() else { return };
        let max = self.engine.pipeline.workspace.as_ref().and_then(|w| w.cache.as_ref()).and_then(|c| c.max_entries).filter(|n| *n > 0).map_or(RESOURCE_ENTRIES, |n| n as usize);
        let mut order: Vec<String> = store.value(&self.engine.scope, "fetch:order").ok().flatten().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
        order.retain(|k| k != key);
        order.push(key.to_string());
        while order.len() > max {
            let old = order.remove(0);
            let _ = store.set_value(&self.engine.scope, &format!("fetch:{old}"), None);
        }
        let _ = store.set_value(&self.engine.scope, "fetch:order", Some(&serde_json::to_string(&order).unwrap_or_default()));
    }
}
