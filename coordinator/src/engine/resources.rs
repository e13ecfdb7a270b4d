//! get and put: resource stages rendered from their templates and run as
//! assignments (`check` in the pipeline's directory, `in` in the artifact's
//! own empty directory, `out` in a view of the put's inputs).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use steppe_shared::assignment::{Assignment, Cwd, Judge};
use steppe_shared::model::{Inputs, Resource, ResourceType, Step, VersionSpec};
use steppe_shared::outcome::StepError;
use steppe_shared::template;

use super::{Done, JobRun};

impl JobRun {
    fn resource(&self, name: &str) -> Result<(&Resource, &ResourceType), StepError> {
        let p = &self.engine.pipeline;
        let r = p.resources.iter().find(|r| r.name == name).ok_or_else(|| StepError::errored(format!("resource \"{name}\" is not declared")))?;
        let t = p.resource_types.iter().find(|t| t.name == r.type_).ok_or_else(|| StepError::errored(format!("resource type \"{}\" is not declared", r.type_)))?;
        if t.config.as_ref().is_some_and(|c| c.expr.is_some() || c.mcp.is_some()) {
            return Err(StepError::errored(format!(
                "resource \"{name}\": expr- and mcp-backed resource types are not supported by this build of steppe yet"
            )));
        }
        Ok((r, t))
    }

    fn env_of(r: &Resource, t: &ResourceType) -> Vec<String> {
        let mut env = t.env.clone().unwrap_or_default();
        env.extend(r.env.clone().unwrap_or_default());
        env
    }

    /// Runs the resource's check: a JSON array of versions, oldest first.
    pub(super) async fn check_versions(self: &Arc<Self>, name: &str) -> Result<Vec<Value>, StepError> {
        let (r, t) = self.resource(name)?;
        let Some(check) = t.config.as_ref().and_then(|c| c.check.clone()) else {
            return Err(StepError::errored(format!("resource \"{name}\": could not parse JSON output of check (type \"{}\" declares no check:)", t.name)));
        };
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": {}});
        let command = template::render(&check, &data).map_err(|e| StepError::errored(format!("check {name}: {e}")))?;
        let a = Assignment {
            id: String::new(),
            run_id: self.run_id.clone(),
            step: format!("{name} (check)"),
            attempt: 1,
            command,
            env: Self::env_of(r, t),
            cwd: Cwd::Host(self.engine.dir.clone()),
            inputs: Vec::new(),
            outputs: Vec::new(),
            timeout: None,
            judge: Judge::default(),
            image: t.image.clone(),
            stream: false,
        };
        let res = self.dispatch(a).await;
        if let Err(e) = res.result {
            let detail = res.stderr.trim();
            let msg = if detail.is_empty() { e.message } else { format!("{}: {detail}", e.message) };
            return Err(StepError { class: if e.class == steppe_shared::outcome::Class::Aborted { e.class } else { steppe_shared::outcome::Class::Errored }, message: format!("check {name}: {msg}") });
        }
        let v: Value = serde_json::from_str(res.stdout.trim())
            .map_err(|e| StepError::errored(format!("check {name}: could not parse JSON output: {e}")))?;
        match v {
            Value::Array(items) => Ok(items),
            other => Err(StepError::errored(format!("check {name}: expected a JSON array of versions, got {other}"))),
        }
    }

    pub(super) async fn get(self: &Arc<Self>, s: &Step) -> Done {
        let artifact = s.get.clone().unwrap_or_default();
        let name = s.resource.clone().unwrap_or_else(|| artifact.clone());
        let log = vec![name.clone()];
        self.engine.out.start(&name);
        let t0 = Instant::now();
        let attempts = s.attempts.unwrap_or(1).max(1) as u32;
        let mut last = Err(StepError::errored("no attempt ran"));
        let mut outputs = Vec::new();
        for n in 1..=attempts {
            match self.fetch(s, &name, &artifact).await {
                Ok(o) => {
                    outputs = o;
                    last = Ok(());
                    break;
                }
                Err(e) => {
                    let stop = e.class == steppe_shared::outcome::Class::Aborted || n == attempts;
                    last = Err(e);
                    if stop {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(n))).await;
                }
            }
        }
        self.ended(&name, &last, t0.elapsed(), None);
        Done { result: last.clone(), routed: last, log, skipped: false, outputs }
    }

    async fn fetch(self: &Arc<Self>, s: &Step, name: &str, artifact: &str) -> Result<Vec<(String, steppe_shared::artifacts::ArtifactRef)>, StepError> {
        let (r, t) = self.resource(name)?;
        let pinned = self.every.lock().ok().and_then(|e| e.get(name).cloned());
        let version = match pinned {
            Some(v) => v,
            None => {
                let versions = self.check_versions(name).await?;
                match &s.version {
                    Some(VersionSpec::Pinned(pin)) => versions
                        .into_iter()
                        .find(|v| pin.iter().all(|(k, want)| v.get(k).map(as_text) == Some(as_text(want))))
                        .ok_or_else(|| StepError::failed(format!("get {name}: no version matches pin {}", Value::Object(pin.clone()))))?,
                    _ => versions.into_iter().last().ok_or_else(|| StepError::failed(format!("get {name}: no versions available")))?,
                }
            }
        };
        self.engine.out.note(&format!("{name}: version {version}"));
        let Some(in_cmd) = t.config.as_ref().and_then(|c| c.in_.clone()) else {
            let dir = std::env::temp_dir().join(format!("steppe-version-{}-{}", std::process::id(), super::rand_suffix()));
            std::fs::create_dir_all(&dir).map_err(|e| StepError::errored(e.to_string()))?;
            std::fs::write(dir.join("version.json"), serde_json::to_string_pretty(&version).unwrap_or_default()).map_err(|e| StepError::errored(e.to_string()))?;
            let r = self.engine.store.put_dir(&dir).map_err(|e| StepError::errored(e.to_string()));
            let _ = std::fs::remove_dir_all(&dir);
            return Ok(vec![(artifact.to_string(), r?)]);
        };
        let params = s.params.as_ref().map(|p| self.subst_value(p)).unwrap_or(json!({}));
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": version, "params": params});
        let command = template::render(&in_cmd, &data).map_err(|e| StepError::errored(format!("get {name}: {e}")))?;
        let a = Assignment {
            id: String::new(),
            run_id: self.run_id.clone(),
            step: name.to_string(),
            attempt: 1,
            command,
            env: Self::env_of(r, t),
            cwd: Cwd::CaptureSelf,
            inputs: Vec::new(),
            outputs: Vec::new(),
            timeout: s.timeout.and_then(|t| t.to_std()),
            judge: Judge::default(),
            image: t.image.clone(),
            stream: true,
        };
        let res = self.dispatch(a).await;
        res.result?;
        Ok(res.outputs.into_iter().map(|(_, r)| (artifact.to_string(), r)).collect())
    }

    pub(super) async fn put(self: &Arc<Self>, s: &Step, cell: &super::Cell) -> Done {
        let name = s.put.clone().unwrap_or_default();
        let label = if cell.is_empty() { name.clone() } else { super::cell_label(&name, cell) };
        let (r, t) = match self.resource(&name) {
            Ok(x) => x,
            Err(e) => return self.finish_err(&label, e),
        };
        let Some(out) = t.config.as_ref().and_then(|c| c.out.clone()) else {
            return self.finish_err(&label, StepError::errored(format!("put {name}: type declares no out:")));
        };
        let params = s.params.as_ref().map(|p| self.subst_value(p)).unwrap_or(json!({}));
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "params": params});
        let command = match template::render(&out, &data) {
            Ok(c) => c,
            Err(e) => return self.finish_err(&label, StepError::errored(format!("put {name}: {e}"))),
        };
        let names = match &s.inputs {
            Some(Inputs::All) => self.artifacts.lock().map(|a| a.keys().cloned().collect()).unwrap_or_default(),
            _ => s.input_names().to_vec(),
        };
        let a = Assignment {
            id: String::new(),
            run_id: self.run_id.clone(),
            step: label.clone(),
            attempt: 1,
            command,
            env: Self::env_of(r, t),
            cwd: Cwd::StepDir,
            inputs: self.input_refs(&names, None),
            outputs: Vec::new(),
            timeout: s.timeout.and_then(|t| t.to_std()),
            judge: Judge::default(),
            image: t.image.clone(),
            stream: true,
        };
        self.attempts(&label, a, s.attempts.unwrap_or(1)).await
    }
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
