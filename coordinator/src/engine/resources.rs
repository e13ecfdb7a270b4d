//! get and put: resource stages rendered from their templates and run as
//! assignments (`check` in the pipeline's directory, `in` in the artifact's
//! own empty directory, `out` in a view of the put's inputs).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use steppe_runtime::assignment::{Assignment, Cwd, McpStage};
use steppe_language::model::{Inputs, McpConfig, Resource, ResourceType, Step, VersionSpec};
use steppe_runtime::outcome::StepError;
use steppe_language::expr::{compile, eval, Env, Stage};

use super::run::{Done, JobRun};
use super::containers::fields_of;

impl JobRun {
    pub(super) fn resource(&self, name: &str) -> Result<(&Resource, &ResourceType), StepError> {
        let p = &self.engine.pipeline;
        let r = p.resources.iter().find(|r| r.name == name).ok_or_else(|| StepError::errored(format!("resource \"{name}\" is not declared")))?;
        let t = p.resource_types.iter().find(|t| t.name == r.type_).ok_or_else(|| StepError::errored(format!("resource type \"{}\" is not declared", r.type_)))?;
        Ok((r, t))
    }

    fn env_of(r: &Resource, t: &ResourceType) -> Vec<String> {
        let mut env = t.env.clone().unwrap_or_default();
        env.extend(r.env.clone().unwrap_or_default());
        env
    }

    /// The versions a get chooses from: the resource's history after a fresh
    /// check (a failed check falls back to history recorded earlier, if any).
    /// Checked once per run (pipeline-language.md §5.4): every get of the
    /// resource, and the plan of the run's chain, choose from the same list.
    pub(super) async fn versions(self: &Arc<Self>, name: &str) -> Result<Vec<Value>, StepError> {
        if let Some(known) = self.checked.lock().ok().and_then(|c| c.get(name).cloned()) {
            return known;
        }
        let found = self.refresh(name).await;
        if let Ok(mut c) = self.checked.lock() {
            c.insert(name.to_string(), found.clone());
        }
        found
    }

    async fn refresh(self: &Arc<Self>, name: &str) -> Result<Vec<Value>, StepError> {
        let checked = self.check_versions(name).await;
        let Some(store) = self.engine.out.store() else { return checked };
        match checked {
            Ok(v) => {
                if let Err(e) = store.record_versions(&self.engine.scope, name, &v) {
                    self.engine.out.run_note(&self.run_id, &format!("steppe: recording versions of {name}: {e}"));
                    return Ok(v);
                }
                self.cap_versions(name, &v);
                store.history(&self.engine.scope, name).map_err(|e| StepError::errored(format!("history of {name}: {e}")))
            }
            Err(e) => {
                let h = store.history(&self.engine.scope, name).unwrap_or_default();
                if h.is_empty() || e.class == steppe_runtime::outcome::Class::Aborted {
                    return Err(e);
                }
                self.engine.out.run_note(&self.run_id, &format!("warning: could not refresh {name}; building from recorded history: {}", e.message));
                Ok(h)
            }
        }
    }

    /// A watcher's check: the resource's versions now, filed in its history.
    pub async fn check_resource(self: &Arc<Self>, name: &str) -> Result<Vec<Value>, StepError> {
        let v = self.check_versions(name).await?;
        if let Some(store) = self.engine.out.store() {
            store.record_versions(&self.engine.scope, name, &v).map_err(|e| StepError::errored(format!("recording versions of {name}: {e}")))?;
            self.cap_versions(name, &v);
        }
        Ok(v)
    }

    /// Runs the resource's check: a JSON array of versions, oldest first.
    /// Its cursor, the newest version recorded, reaches it as `.version`.
    pub(super) async fn check_versions(self: &Arc<Self>, name: &str) -> Result<Vec<Value>, StepError> {
        let (r, t) = self.resource(name)?;
        let cursor = self.engine.out.store().and_then(|s| s.history(&self.engine.scope, name).ok()).and_then(|h| h.last().cloned()).unwrap_or(json!({}));
        if let Some(e) = t.config.as_ref().and_then(|c| c.expr.as_ref()) {
            let src = e.check.clone().ok_or_else(|| StepError::errored(format!("check {name}: type \"{}\" sets no expr.check", t.name)))?;
            let v = run_expr(&src, Stage::Check, json!({"source": r.source.clone().unwrap_or(json!({})), "version": cursor}), Self::env_of(r, t), self.engine.submission.is_none(), None)
                .map_err(|e| StepError::errored(format!("check {name}: {e}")))?;
            return match v {
                Value::Array(items) if items.iter().all(Value::is_object) => Ok(items),
                other => Err(StepError::errored(format!("check {name}: expr.check must give an array of objects, got {other}"))),
            };
        }
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": cursor});
        let a = match t.config.as_ref().and_then(|c| c.mcp.as_ref()) {
            Some(m) => {
                let stage = mcp_stage(&self.engine.pipeline, &self.engine.dir, m, "check", &data, data["source"].clone(), &Value::Null).map_err(|e| StepError::errored(format!("check {name}: {e}")))?;
                Assignment { cwd: Cwd::Host(self.engine.dir.clone()), stream: false, mcp: Some(stage), ..Assignment::command(&self.run_id, &format!("{name} (check)"), String::new()) }
            }
            None => {
                let Some(check) = t.config.as_ref().and_then(|c| c.check.clone()) else {
                    return Err(StepError::errored(format!("resource \"{name}\": could not parse JSON output of check (type \"{}\" declares no check:)", t.name)));
                };
                // Rendered by whoever runs it: a hostile template costs a worker.
                Assignment {
                    env: Self::env_of(r, t),
                    cwd: Cwd::Host(self.engine.dir.clone()),
                    image: t.image.clone(),
                    container: super::containers::settings(fields_of!(t), Default::default()),
                    stream: false,
                    template: Some(data),
                    ..Assignment::command(&self.run_id, &format!("{name} (check)"), check)
                }
            }
        };
        let res = match &self.engine.submission {
            // In the type's image: on a worker, in an empty directory (the
            // image holds what the check needs).
            _ if a.image.is_some() => self.dispatch(Assignment { cwd: Cwd::StepDir, ..a }).await,
            // A submitted pipeline's check runs on a worker, in a copy of
            // the submission: never on the coordinator's host.
            Some(sub) => {
                let tree = sub.snapshot().await.map_err(|e| StepError::errored(format!("check {name}: storing the pipeline's files: {e}")))?;
                self.dispatch(Assignment { cwd: Cwd::Snapshot { tree, dir: sub.dir.clone() }, ..a }).await
            }
            // Embedded: in the pipeline's own directory, in this process.
            None => {
                let sink: Arc<dyn steppe_worker::sink::LineSink> = self.engine.out.clone();
                let mut r = steppe_worker::exec::execute(&a, self.engine.store.clone(), &self.engine.dir, sink, None, self.engine.cancel.clone()).await;
                self.engine.out.record_spans(&self.run_id, std::mem::take(&mut r.spans));
                r
            }
        };
        if let Err(e) = res.result {
            let detail = res.stderr.trim();
            let msg = if detail.is_empty() { e.message.clone() } else { format!("{}: {detail}", e.message) };
            return Err(StepError { class: if e.class == steppe_runtime::outcome::Class::Aborted { e.class } else { steppe_runtime::outcome::Class::Errored }, ..e.with_message(format!("check {name}: {msg}")) });
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
        self.engine.out.start_step(&self.run_id, &name);
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
                    let stop = e.class == steppe_runtime::outcome::Class::Aborted || n == attempts;
                    last = Err(e);
                    if stop {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(500 * u64::from(n))).await;
                }
            }
        }
        self.ended(&name, &last, t0.elapsed(), None);
        Done { result: last.clone(), routed: last, log, skipped: false, outputs, agent: None }
    }

    /// The version a get fetches: its `every` set's, else chosen from the
    /// resource's history (`passed:` constraints, then `--pin`, the step's
    /// pin, or the newest).
    pub(super) async fn choose_version(self: &Arc<Self>, s: &Step, name: &str) -> Result<Value, StepError> {
        if let Some(v) = self.every.lock().ok().and_then(|e| e.get(name).cloned()) {
            return Ok(v);
        }
        let mut versions = self.versions(name).await?;
        if let Some(passed) = &s.passed {
            let store = self.engine.out.store().cloned();
            let mut greens = Vec::new();
            for j in passed {
                greens.push(store.as_ref().map(|st| st.green(&self.engine.scope, j, name).unwrap_or_default()).unwrap_or_default());
            }
            versions.retain(|v| greens.iter().all(|g| g.contains(v)));
            if versions.is_empty() {
                return Err(StepError::failed(format!("get {name}: no versions available (none has passed {})", passed.join(", "))));
            }
        }
        let flag_pins: serde_json::Map<String, Value> = self.engine.pins.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        let pin = if flag_pins.is_empty() {
            match &s.version {
                Some(VersionSpec::Pinned(pin)) => Some(pin),
                _ => None,
            }
        } else {
            Some(&flag_pins)
        };
        match pin {
            Some(pin) => versions
                .into_iter()
                .find(|v| pin.iter().all(|(k, want)| v.get(k).map(as_text) == Some(as_text(want))))
                .ok_or_else(|| StepError::failed(format!("get {name}: no version matches pin {}", Value::Object(pin.clone())))),
            None => versions.into_iter().last().ok_or_else(|| StepError::failed(format!("get {name}: no versions available"))),
        }
    }

    async fn fetch(self: &Arc<Self>, s: &Step, name: &str, artifact: &str) -> Result<Vec<(String, steppe_runtime::artifacts::ArtifactRef)>, StepError> {
        let (r, t) = self.resource(name)?;
        let version = self.choose_version(s, name).await?;
        self.engine.out.run_note(&self.run_id, &format!("{name}: version {version}"));
        if let Ok(mut f) = self.fetched.lock() {
            f.push((name.to_string(), version.clone()));
        }
        let params = s.params.as_ref().map(|p| self.subst_value(p)).transpose().map_err(|e| StepError::errored(format!("get {name}: {e}")))?.unwrap_or(json!({}));
        if let Some(e) = t.config.as_ref().and_then(|c| c.expr.as_ref()) {
            let mut files: Vec<(String, String)> = Vec::new();
            match &e.in_ {
                None => files.push(("version.json".into(), serde_json::to_string_pretty(&version).unwrap_or_default())),
                Some(src) => {
                    let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": version, "params": params});
                    let v = run_expr(src, Stage::In, data, Self::env_of(r, t), self.engine.submission.is_none(), None).map_err(|e| StepError::errored(format!("get {name}: {e}")))?;
                    let Value::Object(m) = v else {
                        return Err(StepError::errored(format!("get {name}: expr.in must give an object of path → contents, got {v}")));
                    };
                    for (path, content) in m {
                        let Value::String(content) = content else {
                            return Err(StepError::errored(format!("get {name}: expr.in: the contents of {path:?} must be a string")));
                        };
                        if path.starts_with('/') || path.split('/').any(|seg| seg == "..") || path.is_empty() {
                            return Err(StepError::errored(format!("get {name}: expr.in: path {path:?} must stay inside the artifact")));
                        }
                        files.push((path, content));
                    }
                }
            }
            let dir = self.temp("expr-in");
            let write = || -> std::io::Result<steppe_runtime::artifacts::ArtifactRef> {
                std::fs::create_dir_all(&dir.0)?;
                for (p, c) in &files {
                    let full = dir.0.join(p);
                    if let Some(parent) = full.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::write(full, c)?;
                }
                self.engine.store.put_dir(&dir.0)
            };
            let r = write().map_err(|e| StepError::errored(format!("get {name}: {e}")))?;
            return Ok(vec![(artifact.to_string(), r)]);
        }
        if let Some(m) = t.config.as_ref().and_then(|c| c.mcp.as_ref()).filter(|m| m.in_.is_some()) {
            let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": version, "params": params});
            let stage = mcp_stage(&self.engine.pipeline, &self.engine.dir, m, "in", &data, data["source"].clone(), &version).map_err(|e| StepError::errored(format!("get {name}: {e}")))?;
            let a = Assignment { cwd: Cwd::CaptureSelf, timeout: s.timeout.and_then(|t| t.to_std()), mcp: Some(stage), ..Assignment::command(&self.run_id, name, String::new()) };
            let res = self.dispatch(a).await;
            res.result?;
            return Ok(res.outputs.into_iter().map(|(_, r)| (artifact.to_string(), r)).collect());
        }
        let Some(in_cmd) = t.config.as_ref().and_then(|c| c.in_.clone()) else {
            let r = self.store_files(&[("version.json".to_string(), serde_json::to_string_pretty(&version).unwrap_or_default())]).map_err(|e| StepError::errored(e.to_string()))?;
            return Ok(vec![(artifact.to_string(), r)]);
        };
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "version": version, "params": params});
        let fetch_key = self.fetch_key(&json!({"in": in_cmd, "data": data, "image": t.image, "env": Self::env_of(r, t), "user": t.user, "network": t.network}));
        if let Some(hit) = fetch_key.as_deref().and_then(|k| self.cached_fetch(k)) {
            self.engine.out.run_note(&self.run_id, &format!("{name}: fetched before (workspace.cache.resources); in: not run"));
            return Ok(vec![(artifact.to_string(), hit)]);
        }
        let a = Assignment {
            env: Self::env_of(r, t),
            cwd: Cwd::CaptureSelf,
            timeout: s.timeout.and_then(|t| t.to_std()),
            image: t.image.clone(),
            container: super::containers::settings(fields_of!(t), Default::default()),
            template: Some(data),
            ..Assignment::command(&self.run_id, name, in_cmd)
        };
        let res = self.dispatch(a).await;
        res.result?;
        if let (Some(key), Some((_, r))) = (&fetch_key, res.outputs.first()) {
            self.keep_fetch(key, r);
        }
        Ok(res.outputs.into_iter().map(|(_, r)| (artifact.to_string(), r)).collect())
    }

    pub(super) async fn put(self: &Arc<Self>, s: &Step, cell: &super::across::Cell) -> Done {
        let name = s.put.clone().unwrap_or_default();
        let label = if cell.is_empty() { name.clone() } else { super::across::cell_label(&name, cell) };
        let (r, t) = match self.resource(&name) {
            Ok(x) => x,
            Err(e) => return self.finish_err(&label, e),
        };
        if let Some(e) = t.config.as_ref().and_then(|c| c.expr.as_ref()) {
            return self.put_expr(s, &name, &label, e.out.clone(), r, t).await;
        }
        if let Some(m) = t.config.as_ref().and_then(|c| c.mcp.as_ref()) {
            let a = match self.mcp_out(s, &name, &label, m, r) {
                Ok(a) => a,
                Err(e) => return self.finish_err(&label, e),
            };
            return self.attempts(&label, a, s.attempts.unwrap_or(1)).await;
        }
        let Some(out) = t.config.as_ref().and_then(|c| c.out.clone()) else {
            return self.finish_err(&label, StepError::errored(format!("put {name}: type declares no out:")));
        };
        let params = match s.params.as_ref().map(|p| self.subst_value(p)).transpose() {
            Ok(p) => p.unwrap_or(json!({})),
            Err(e) => return self.finish_err(&label, StepError::errored(format!("put {name}: {e}"))),
        };
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "params": params});
        let names = match &s.inputs {
            Some(Inputs::All) => self.artifacts.lock().map(|a| a.keys().cloned().collect()).unwrap_or_default(),
            _ => s.input_names().to_vec(),
        };
        let a = Assignment {
            env: Self::env_of(r, t),
            inputs: self.input_refs(&names, None),
            timeout: s.timeout.and_then(|t| t.to_std()),
            image: t.image.clone(),
            container: super::containers::settings(fields_of!(t), Default::default()),
            template: Some(data),
            ..Assignment::command(&self.run_id, &label, out)
        };
        self.attempts(&label, a, s.attempts.unwrap_or(1)).await
    }
}

impl JobRun {
    /// A put's inputs materialized in a temporary directory (gone when dropped).
    fn put_view(&self, s: &Step) -> Result<super::temp::TempDir, StepError> {
        let names = match &s.inputs {
            Some(Inputs::All) => self.artifacts.lock().map(|a| a.keys().cloned().collect()).unwrap_or_default(),
            _ => s.input_names().to_vec(),
        };
        let tmp = self.temp("put-view");
        std::fs::create_dir_all(&tmp.0).map_err(|e| StepError::errored(e.to_string()))?;
        for (n, a) in self.input_refs(&names, None) {
            self.engine.store.materialize(&a, &tmp.0.join(n)).map_err(|e| StepError::errored(e.to_string()))?;
        }
        Ok(tmp)
    }

    /// An MCP-backed put's assignment: its params' `{file: PATH}` markers
    /// read from a view of its inputs, then the tool's arguments rendered.
    fn mcp_out(&self, s: &Step, name: &str, label: &str, m: &McpConfig, r: &Resource) -> Result<Assignment, StepError> {
        let tmp = self.put_view(s)?;
        let params = s.params.as_ref().map(|p| self.subst_value(p)).transpose().map_err(|e| StepError::errored(format!("put {name}: {e}")))?.unwrap_or(json!({}));
        let params = resolve_file_markers(params, &tmp.0).map_err(|e| StepError::errored(format!("put {name}: {e}")))?;
        drop(tmp);
        let data = json!({"source": r.source.clone().unwrap_or(json!({})), "params": params});
        let stage = mcp_stage(&self.engine.pipeline, &self.engine.dir, m, "out", &data, data["params"].clone(), &Value::Null).map_err(|e| StepError::errored(format!("put {name}: {e}")))?;
        Ok(Assignment { timeout: s.timeout.and_then(|t| t.to_std()), mcp: Some(stage), ..Assignment::command(&self.run_id, label, String::new()) })
    }

    /// An expr-backed put: evaluated here, with `file()` reading the put's inputs.
    async fn put_expr(self: &Arc<Self>, s: &Step, name: &str, label: &str, out: Option<String>, r: &Resource, t: &ResourceType) -> Done {
        self.engine.out.start_step(&self.run_id, label);
        let t0 = Instant::now();
        let result = async {
            let src = out.ok_or_else(|| StepError::errored(format!("put {name}: type sets no expr.out")))?;
            let tmp = self.put_view(s)?;
            let view = tmp.0.clone();
            let params = s.params.as_ref().map(|p| self.subst_value(p)).transpose().map_err(|e| StepError::errored(format!("put {name}: {e}")))?.unwrap_or(json!({}));
            let params = resolve_file_markers(params, &view).map_err(|e| StepError::errored(format!("put {name}: {e}")));
            let read = |p: &str| -> Result<String, String> {
                if !p.contains('/') {
                    return Err("must be <artifact>/<path> inside the put's inputs".into());
                }
                read_in_view(&view, p)
            };
            let r = params.and_then(|params| {
                run_expr(&src, Stage::Out, json!({"source": r.source.clone().unwrap_or(json!({})), "params": params}), Self::env_of(r, t), self.engine.submission.is_none(), Some(&read))
                    .map_err(|e| StepError::errored(format!("put {name}: {e}")))
            });
            drop(tmp);
            r.map(|_| ())
        }
        .await;
        self.ended(label, &result, t0.elapsed(), None);
        Done { result: result.clone(), routed: result, log: vec![label.to_string()], skipped: false, outputs: Vec::new(), agent: None }
    }
}

/// Reads `<artifact>/<path>` inside a put's view of its inputs: no climbing
/// out, no symlink to this host's files, a regular file of at most 1 MiB.
fn read_in_view(view: &std::path::Path, p: &str) -> Result<String, String> {
    steppe_language::confine::read_text(view, p, Some(view), "the put's inputs", 1 << 20).map_err(|e| format!("{p:?} {e}"))
}

/// `{file: PATH}` markers in put params become the file's trimmed contents.
fn resolve_file_markers(v: Value, view: &std::path::Path) -> Result<Value, String> {
    match v {
        Value::Object(m) if m.len() == 1 && m.get("file").is_some_and(Value::is_string) => {
            let p = m.get("file").and_then(Value::as_str).unwrap_or_default().to_string();
            if !p.contains('/') {
                return Err(format!("params file {p:?} must be <artifact>/<path> inside the put's inputs"));
            }
            read_in_view(view, &p).map(|t| Value::String(t.trim().to_string())).map_err(|e| format!("params file {e}"))
        }
        Value::Object(m) => Ok(Value::Object(m.into_iter().map(|(k, v)| resolve_file_markers(v, view).map(|v| (k, v))).collect::<Result<_, _>>()?)),
        Value::Array(a) => Ok(Value::Array(a.into_iter().map(|v| resolve_file_markers(v, view)).collect::<Result<_, _>>()?)),
        other => Ok(other),
    }
}

/// One stage of an MCP-backed type for a worker: its server, its tool and
/// the arguments — `args:` with every string rendered over `data`, or else
/// the stage's payload (the source; the put's params).
fn mcp_stage(p: &steppe_language::model::Pipeline, dir: &std::path::Path, m: &McpConfig, stage: &str, data: &Value, payload: Value, version: &Value) -> Result<Box<McpStage>, String> {
    let cfg = match stage {
        "check" => m.check.as_ref(),
        "in" => m.in_.as_ref(),
        _ => m.out.as_ref(),
    };
    let tool = cfg.and_then(|c| c.tool.clone()).filter(|t| !t.is_empty()).ok_or_else(|| format!("the type sets no mcp.{stage}.tool"))?;
    let server = m.server.as_deref().unwrap_or_default();
    let decl = p.mcp_servers.iter().find(|s| s.name == server).ok_or_else(|| format!("MCP server \"{server}\" is not declared in mcp_servers:"))?;
    let args = match cfg.and_then(|c| c.args.as_ref()) {
        Some(a) => rendered(&Value::Object(a.clone()), data)?,
        None => payload,
    };
    let args = if args.is_object() { args } else { json!({}) };
    Ok(Box::new(McpStage { server: super::mcp_server_work(decl, dir)?, stage: stage.to_string(), tool, args, version: version.clone() }))
}

/// `v` with every string rendered as a template over `data`; other values as they are.
fn rendered(v: &Value, data: &Value) -> Result<Value, String> {
    Ok(match v {
        Value::String(t) => Value::String(steppe_language::template::render(t, data)?),
        Value::Array(a) => Value::Array(a.iter().map(|x| rendered(x, data)).collect::<Result<_, _>>()?),
        Value::Object(m) => Value::Object(m.iter().map(|(k, x)| rendered(x, data).map(|x| (k.clone(), x))).collect::<Result<_, _>>()?),
        other => other.clone(),
    })
}

/// Compiles and evaluates one expr stage over `data` (`{source, version, params}`).
fn run_expr(src: &str, stage: Stage, data: Value, env_allowed: Vec<String>, host_env: bool, read_file: Option<&dyn Fn(&str) -> Result<String, String>>) -> Result<Value, String> {
    let e = compile(src, stage).map_err(|e| e.to_string())?;
    let mut vars = std::collections::HashMap::new();
    if let Value::Object(m) = &data {
        for k in ["source", "version", "params"] {
            if let Some(v) = m.get(k) {
                vars.insert(k, v.clone());
            }
        }
    }
    eval(&e, &Env { vars, env_allowed, host_env, read_file, spent: Default::default() }).map_err(|e| e.to_string())
}

fn as_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
