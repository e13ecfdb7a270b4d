//! A run's chains planned (pipeline-language.md §6): gets choose their
//! versions, each top-level step's content is hashed with its parent's, and
//! the store says which chains a run of the job succeeded through.

use std::fmt::Debug;
use std::sync::Arc;

use serde_json::{json, Map, Value};
use steppe_language::model::{Inputs, Step, StepKind};
use steppe_runtime::merkle::node_hash;

use super::chain::{is_every, uncacheable, Chain, Node};
use super::run::*;

fn debug(x: &impl Debug) -> Value {
    Value::String(format!("{x:?}"))
}

/// Sets `key` unless the value is unset or empty: a key a step does not use
/// leaves its hash as it was before the key existed.
fn set(m: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    match v {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::Array(a)) if a.is_empty() => {}
        Some(Value::Object(o)) if o.is_empty() => {}
        Some(v) => {
            m.insert(key.to_string(), v);
        }
    }
}

fn names(v: &[String]) -> Value {
    Value::Array(v.iter().cloned().map(Value::String).collect())
}

impl JobRun {
    /// Whether the step's resource has its version bound by an input set.
    pub(super) fn bound(&self, s: &Step) -> bool {
        let r = s.resource.as_ref().or(s.get.as_ref());
        r.is_some_and(|r| self.every.lock().is_ok_and(|e| e.contains_key(r)))
    }
}

impl JobRun {
    /// The chains of this run's plan: one, or one per input set of its
    /// `every` get. Gets choose their versions here (each resource checked
    /// once per run), so the walk fetches what was planned.
    pub async fn plan_chains(self: &Arc<Self>) -> Vec<Chain> {
        let pinned = !self.engine.pins.is_empty();
        let mut prefix = Chain::default();
        for (i, s) in self.job.plan.iter().enumerate() {
            if is_every(s, pinned) {
                let sets = match self.input_sets(i).await {
                    Ok(Ok(sets)) => sets,
                    Ok(Err(_)) => return vec![self.settled(prefix)],
                    Err(e) => {
                        prefix.unresolved = Some(e.message);
                        return vec![self.settled(prefix)];
                    }
                };
                let mut chains = Vec::new();
                for set in sets {
                    self.bind(&set);
                    let mut c = Chain { set: Some(set), every_at: i, ..prefix.clone() };
                    for s in &self.job.plan[i..] {
                        self.extend(&mut c, s).await;
                    }
                    chains.push(self.settled(c));
                }
                if let Ok(mut e) = self.every.lock() {
                    e.clear();
                }
                return chains;
            }
            self.extend(&mut prefix, s).await;
        }
        vec![self.settled(prefix)]
    }

    /// Looks up whether a run succeeded through the chain.
    fn settled(&self, mut c: Chain) -> Chain {
        if let (Some(leaf), Some(store)) = (c.cacheable_leaf(), self.engine.out.store()) {
            c.succeeded = store.chain_succeeded(&self.engine.scope, &self.job.name, leaf).unwrap_or(false);
        }
        c
    }

    async fn extend(self: &Arc<Self>, c: &mut Chain, s: &Step) {
        let step = s.name().unwrap_or("step").to_string();
        let mut version = None;
        if s.get.is_some() {
            let resource = s.resource.clone().or(s.get.clone()).unwrap_or_default();
            match self.choose_version(s, &resource).await {
                Ok(v) => version = Some(v),
                Err(e) => {
                    c.unresolved.get_or_insert(e.message);
                }
            }
        }
        if c.uncacheable.is_none() {
            let inherited = self.entry(s).is_some_and(|e| e.fix.is_some());
            if let Some(why) = uncacheable(s, inherited) {
                c.uncacheable = Some((step.clone(), why));
            }
        }
        let kind = s.kind().map_or("step", StepKind::key);
        let parent = c.leaf().unwrap_or("").to_string();
        let hash = node_hash(kind, &self.content(s, version.as_ref()), &parent);
        c.nodes.push(Node { step, hash, version });
    }

    /// What of a step is hashed: what it runs and with what, never how often
    /// it is tried, how long it may take, or secret values.
    pub(super) fn content(&self, s: &Step, version: Option<&Value>) -> Value {
        let mut m = Map::new();
        match s.kind() {
            Some(StepKind::Get) => self.get_content(s, version, &mut m),
            Some(StepKind::Put) => self.put_content(s, &mut m),
            Some(StepKind::Task) => self.task_content(s, &mut m),
            Some(StepKind::Agent) => {
                set(&mut m, "agent", s.agent.clone().map(Value::String));
                set(&mut m, "definition", s.agent.as_deref().and_then(|a| self.agent_def(a)).map(debug));
                set(&mut m, "prompt", s.prompt.as_deref().map(|p| Value::String(self.subst(p).unwrap_or_else(|_| p.to_string()))));
                set(&mut m, "messages", s.messages.as_ref().map(|v| names(v)));
                set(&mut m, "dir", s.dir.clone().map(Value::String));
                set(&mut m, "tools", s.tools.as_ref().map(debug));
                set(&mut m, "max_turns", s.max_turns.map(Value::from));
                set(&mut m, "context_paths", s.context_paths.as_ref().map(|v| names(v)));
                set(&mut m, "inputs", s.inputs.as_ref().map(debug));
                set(&mut m, "outputs", s.outputs.as_ref().map(|v| names(v)));
                set(&mut m, "image", s.image.clone().map(Value::String));
            }
            Some(StepKind::Try) => set(&mut m, "try", s.try_.as_deref().map(|t| self.child(t))),
            Some(StepKind::Do) => set(&mut m, "steps", s.do_.as_ref().map(|v| Value::Array(v.iter().map(|c| self.child(c)).collect()))),
            Some(StepKind::InParallel) => {
                let p = s.in_parallel.as_ref();
                set(&mut m, "steps", p.map(|p| Value::Array(p.steps.iter().map(|c| self.child(c)).collect())));
                set(&mut m, "limit", p.and_then(|p| p.limit).map(Value::from));
                set(&mut m, "fail_fast", p.and_then(|p| p.fail_fast).filter(|f| *f).map(Value::from));
            }
            Some(StepKind::Race) => set(&mut m, "steps", s.race.as_ref().map(|r| Value::Array(r.steps.iter().map(|c| self.child(c)).collect()))),
            Some(StepKind::Ensemble) => set(&mut m, "ensemble", s.ensemble.as_ref().map(debug)),
            Some(StepKind::LoadVar) => {
                set(&mut m, "load_var", s.load_var.clone().map(Value::String));
                set(&mut m, "file", s.file.clone().map(Value::String));
            }
            Some(StepKind::Approval) => set(&mut m, "message", s.approval.as_ref().and_then(|a| a.message.clone()).map(Value::String)),
            None => {}
        }
        set(&mut m, "across", s.across.as_ref().map(debug));
        set(&mut m, "assert", s.assert.as_ref().map(debug));
        set(&mut m, "when", s.when.as_ref().map(|w| Value::String(w.run.clone())));
        if let Some(to) = &s.to {
            set(&mut m, "to", Some(debug(to)));
            set(&mut m, "max_visits", s.max_visits.map(Value::from));
        }
        set(&mut m, "verdicts", s.verdicts.as_ref().map(debug));
        set(&mut m, "context_from", s.context.as_ref().and_then(|c| c.from.as_ref()).map(|f| Value::Object(f.clone())));
        let hooks: Map<String, Value> = s.hooks().into_iter().map(|(k, h)| (k.to_string(), self.child(h))).collect();
        set(&mut m, "hooks", Some(Value::Object(hooks)));
        Value::Object(m)
    }

    /// A nested step's kind and content.
    fn child(&self, s: &Step) -> Value {
        json!({"kind": s.kind().map_or("step", StepKind::key), "content": self.content(s, None)})
    }

    fn task_content(&self, s: &Step, m: &mut Map<String, Value>) {
        let entry = self.entry(s);
        let run = s.run.clone().or_else(|| entry.and_then(|e| e.run.clone())).unwrap_or_default();
        set(m, "task", s.task.clone().map(Value::String));
        set(m, "run", Some(Value::String(self.subst(&run).unwrap_or(run))));
        let inputs = match &s.inputs {
            Some(Inputs::Names(n)) => Some(names(n)),
            Some(Inputs::All) => Some(Value::String("all".into())),
            _ => entry.and_then(|e| e.inputs.as_ref()).map(|v| names(v)),
        };
        set(m, "inputs", inputs);
        set(m, "outputs", s.outputs.as_ref().or_else(|| entry.and_then(|e| e.outputs.as_ref())).map(|v| names(v)));
        set(m, "input_mapping", s.input_mapping.clone().map(Value::Object));
        set(m, "output_mapping", s.output_mapping.clone().map(Value::Object));
        set(m, "image", self.resolved_image(s, &Default::default()).ok().and_then(|(i, _)| i).map(Value::String));
        let mut env = s.env.clone().or_else(|| entry.and_then(|e| e.env.clone())).unwrap_or_default();
        env.sort();
        set(m, "env", Some(names(&env)));
        set(m, "user", s.user.clone().or_else(|| entry.and_then(|e| e.user.clone())).map(Value::String));
        set(m, "network", s.network.clone().or_else(|| entry.and_then(|e| e.network.clone())).map(Value::String));
        set(m, "privileged", s.privileged.or_else(|| entry.and_then(|e| e.privileged)).filter(|p| *p).map(Value::from));
        set(m, "limits", s.container_limits.as_ref().or_else(|| entry.and_then(|e| e.container_limits.as_ref())).map(debug));
        set(m, "fix", s.fix.as_ref().or_else(|| entry.and_then(|e| e.fix.as_ref())).map(debug));
    }

    fn get_content(&self, s: &Step, version: Option<&Value>, m: &mut Map<String, Value>) {
        let artifact = s.get.clone().unwrap_or_default();
        let resource = s.resource.clone().unwrap_or_else(|| artifact.clone());
        if s.resource.is_some() {
            set(m, "artifact", Some(Value::String(artifact)));
        }
        set(m, "resource", Some(Value::String(resource.clone())));
        set(m, "version", version.cloned());
        set(m, "params", s.params.as_ref().map(|p| self.subst_value(p).unwrap_or_else(|_| p.clone())));
        if let Ok((r, t)) = self.resource(&resource) {
            set(m, "source", r.source.clone());
            let config = t.config.as_ref();
            set(m, "in_template", config.and_then(|c| c.in_.clone()).map(Value::String));
            set(m, "expr_in", config.and_then(|c| c.expr.as_ref()).and_then(|e| e.in_.clone()).map(Value::String));
            set(m, "mcp_in", config.and_then(|c| c.mcp.as_ref()).filter(|c| c.in_.is_some()).map(|c| json!({"server": c.server, "stage": debug(&c.in_)})));
            type_fields(t, m);
        }
    }

    fn put_content(&self, s: &Step, m: &mut Map<String, Value>) {
        let resource = s.resource.clone().or(s.put.clone()).unwrap_or_default();
        set(m, "resource", Some(Value::String(resource.clone())));
        set(m, "params", s.params.as_ref().map(|p| self.subst_value(p).unwrap_or_else(|_| p.clone())));
        set(m, "inputs", s.inputs.as_ref().map(debug));
        if let Ok((r, t)) = self.resource(&resource) {
            set(m, "source", r.source.clone());
            let config = t.config.as_ref();
            set(m, "out_template", config.and_then(|c| c.out.clone()).map(Value::String));
            set(m, "expr_out", config.and_then(|c| c.expr.as_ref()).and_then(|e| e.out.clone()).map(Value::String));
            set(m, "mcp_out", config.and_then(|c| c.mcp.as_ref()).filter(|c| c.out.is_some()).map(|c| json!({"server": c.server, "stage": debug(&c.out)})));
            type_fields(t, m);
        }
    }
}

/// A resource type's runtime fields: where and as whom its stages run.
fn type_fields(t: &steppe_language::model::ResourceType, m: &mut Map<String, Value>) {
    set(m, "image", t.image.clone().map(Value::String));
    let mut env = t.env.clone().unwrap_or_default();
    env.sort();
    set(m, "env", Some(names(&env)));
    set(m, "user", t.user.clone().map(Value::String));
    set(m, "network", t.network.clone().map(Value::String));
    set(m, "privileged", t.privileged.filter(|p| *p).map(Value::from));
    set(m, "limits", t.container_limits.as_ref().map(debug));
}
