//! The Runs service: `steppe coordinator` takes submissions (a bundle
//! unpacked under its state dir, loaded confined to it, run on the shared
//! services, output streamed back), and cancels runs by id.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use steppe_proto::v1::runs_server::Runs;
use steppe_proto::v1::{run_event, CancelReply, CancelRequest, RunEvent, RunFinished, SubmitRequest};
use steppe_runtime::auth::{Identity, Role};
use steppe_runtime::outcome::{Class, Outcome};
use steppe_runtime::store::{RunRecord, Scope};
use steppe_language::{load_file, LoadOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::services::Services;
use crate::text::shown;

pub struct RunService {
    pub svc: Arc<Services>,
    /// Which pools belong to which team.
    pub callers: steppe_runtime::auth::Callers,
    /// The runs going on, by id, for `Cancel`.
    pub active: Arc<std::sync::Mutex<HashMap<String, Arc<crate::engine::Engine>>>>,
    /// Where a submission's scripted model listens: the address workers
    /// reach this coordinator on (an unspecified one is taken by each
    /// worker as the host it dialled).
    pub model_host: std::net::IpAddr,
    /// The submitter's span (W3C `traceparent` of its request), for the
    /// runs of the submission being handled.
    pub trace_parent: Option<String>,
}

type Lines = mpsc::UnboundedSender<String>;

impl RunService {
    /// Runs one submission; with a scenario, its scripted model serves the
    /// run's agents for as long as it lasts. Returns the exit code and the
    /// requests the model received (when the submitter asked for them).
    async fn handle_scripted(&self, req: SubmitRequest, who: Identity, root: &Path, lines: &Lines, started: &Lines, taken: Option<RunRecord>) -> (i32, Vec<String>) {
        if req.scenario.is_empty() {
            return (self.handle(req, who, root, lines, started, None, taken).await, Vec::new());
        }
        let scenario = match crate::scripted::parse(&req.scenario, Path::new("--script")) {
            Ok(s) => s,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return (2, Vec::new());
            }
        };
        let at = std::net::SocketAddr::new(self.model_host, 0);
        let keep = req.dump_requests;
        let serve = |script| crate::scripted::serve(script, at, keep);
        let model = match serve(scenario.model.clone()).await {
            Ok(m) => m,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: the coordinator could not serve the scripted model: {e}"));
                return (2, Vec::new());
            }
        };
        let fallback = match scenario.fallback.clone() {
            Some(f) => match serve(Some(f)).await {
                Ok(m) => Some(m),
                Err(e) => {
                    let _ = lines.send(format!("steppe: error: the coordinator could not serve the scripted fallback: {e}"));
                    return (2, Vec::new());
                }
            },
            None => None,
        };
        let dump = req.dump_requests;
        let targets = (model.base_url.clone(), fallback.as_ref().map(|f| f.base_url.clone()));
        let mut code = self.handle(req, who, root, lines, started, Some(targets), taken).await;
        let mut problems = model.failures();
        problems.extend(fallback.iter().flat_map(|f| f.failures()).map(|p| format!("fallback {p}")));
        if !problems.is_empty() && code != 130 {
            for p in &problems {
                let _ = lines.send(format!("FAIL scenario: {p}"));
            }
            let _ = lines.send(format!("steppe: error: the scenario could not answer {} request(s)", problems.len()));
            code = 2;
        }
        let requests = if dump { model.requests().iter().chain(fallback.iter().flat_map(|f| f.requests()).collect::<Vec<_>>().iter()).map(|r| r.to_string()).collect() } else { Vec::new() };
        (code, requests)
    }

    /// Runs one submission of `team` whose files go under `root`, its agents
    /// pointed at `scripted` (a model's and a fallback's URL) when given.
    /// `taken`: a run of this submission whose coordinator died, taken over.
    async fn handle(&self, mut req: SubmitRequest, who: Identity, root: &Path, lines: &Lines, started: &Lines, scripted: Option<(String, Option<String>)>, taken: Option<RunRecord>) -> i32 {
        let team = who.team.clone();
        let given = Some(req.name.as_str()).filter(|n| !n.is_empty());
        let scope = match crate::services::pipeline_name(given, Path::new(&req.pipeline)) {
            Ok(pipeline) => Scope { team, pipeline },
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
        };
        let id = root.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (r, i, p, f) = (root.to_path_buf(), id.clone(), req.pipeline.clone(), std::mem::take(&mut req.files));
        let unpacked = match &taken {
            Some(_) => kept(root).map(|k| (k.path, k.sub_dir)),
            None => tokio::task::spawn_blocking(move || crate::bundle::unpack(&r, &i, &p, &f)).await.unwrap_or_else(|e| Err(e.to_string())),
        };
        // What a coordinator taking over a run of this submission needs.
        if let (None, Ok((path, sub_dir)), false) = (&taken, &unpacked, req.test) {
            keep(root, &req, &who, path, sub_dir);
        }
        let (path, sub_dir) = match unpacked {
            Ok(p) => p,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
        };
        // Every path the pipeline names must stay inside what was sent.
        let opts = LoadOptions { vars: req.vars.clone().into_iter().collect(), submission: true, root: Some(root.to_path_buf()), ..LoadOptions::from_env(Default::default()) };
        let loaded = match tokio::task::spawn_blocking(move || load_file(&path, &opts)).await {
            Ok(Ok(l)) => l,
            Ok(Err(diags)) => {
                // Named as the submitter knows them, not where they sit here.
                let base = root.join(&sub_dir);
                for d in diags.iter() {
                    let mut d = d.clone();
                    if let Ok(rel) = d.file.strip_prefix(&base) {
                        d.file = rel.to_path_buf();
                    }
                    let _ = lines.send(d.to_string());
                }
                let _ = lines.send(format!("steppe: error: {} problem(s) in {}", diags.len(), req.pipeline));
                return 2;
            }
            Err(e) => {
                let _ = lines.send(format!("steppe: error: loading {}: {e}", req.pipeline));
                return 2;
            }
        };
        let answers = match crate::services::parse_answers(&req.answers) {
            Ok(a) => a,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
        };
        let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
        let mut engine = crate::services::make_engine_with(&self.svc, &loaded, scope, answers, scripted, Arc::new(cancel_tx), cancel_rx);
        engine.decide_with = "--coordinator URL".into();
        engine.trace_parent = self.trace_parent.clone();
        engine.preflight = !req.no_preflight;
        engine.force = req.force || req.test;
        engine.pins = if req.test { Vec::new() } else {
            match crate::cli::args::parse_pins(&req.pins) {
                Ok(p) => p,
                Err(e) => {
                    let _ = lines.send(format!("steppe: error: {e}"));
                    return 2;
                }
            }
        };
        engine.park_questions = !req.test;
        engine.submission = Some(Arc::new(crate::engine::Submission::new(root.to_path_buf(), sub_dir, self.svc.store.clone())));
        if !req.pool.is_empty() {
            if let Err(e) = steppe_runtime::queue::check_pool_name(&req.pool) {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
            if let Err(e) = who.may_submit_to(&req.pool, steppe_runtime::auth::pool_owner(&self.callers, &req.pool).as_deref()) {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
            if !self.svc.registry.list().await.iter().any(|w| w.pool == req.pool) {
                let _ = lines.send(format!("note: no worker serves pool {} yet: the steps wait for one (steppe worker --pool {})", req.pool, req.pool));
            }
            engine.pool = req.pool.clone();
        }
        let engine = Arc::new(engine);
        let jobs = loaded.pipeline.jobs.clone();
        let taken_id = taken.as_ref().map(|r| r.id.clone());
        let root_text = root.display().to_string();
        let run = |job: steppe_language::model::Job, begin: Option<crate::engine::checkpoint::Start>| {
            let (taken_id, root_text) = (taken_id.clone(), root_text.clone());
            let engine = engine.clone();
            let lines = lines.clone();
            let (detach, quiet) = (req.detach, req.quiet);
            let active = self.active.clone();
            async move {
                let run_id = taken_id.unwrap_or_else(crate::run_actor::run_id);
                // Found by a coordinator that takes over when this one dies.
                let submission_key = format!("submission:{run_id}");
                if let Some(store) = engine.out.store() {
                    let _ = store.set_value(&engine.scope, &submission_key, Some(&root_text));
                }
                if let Ok(mut a) = active.lock() {
                    a.insert(run_id.clone(), engine.clone());
                }
                // Quiet: the verdict lines only, not the steps' progress and output.
                if !quiet {
                    engine.out.watch(&run_id, lines.clone());
                }
                let _ = started.send(run_id.clone());
                let r = {
                    let fut = crate::run_actor::run_until_signal_from(&engine, crate::engine::JobRun::starting(engine.clone(), job.clone(), run_id.clone(), begin));
                    tokio::pin!(fut);
                    tokio::select! {
                        r = &mut fut => r,
                        // The submitter went away (Ctrl-C): abort this run, hooks keep their grace.
                        _ = lines.closed(), if !detach => {
                            engine.abort_run(&run_id);
                            fut.await
                        }
                    }
                };
                engine.out.flush().await;
                engine.out.unwatch(&run_id);
                if let Ok(mut a) = active.lock() {
                    a.remove(&run_id);
                }
                if let Some(store) = engine.out.store() {
                    let _ = store.set_value(&engine.scope, &submission_key, None);
                }
                (r, run_id)
            }
        };
        if req.test {
            let only = Some(req.job.as_str()).filter(|j| !j.is_empty());
            let jobs = match crate::services::pick_jobs(&jobs, only, &req.pipeline) {
                Ok(j) => j,
                Err(e) => {
                    let _ = lines.send(format!("steppe: error: {e}"));
                    return 2;
                }
            };
            let mut failures = Vec::new();
            for job in &jobs {
                let (r, _) = run(job.clone(), None).await;
                match r.result {
                    Ok(()) => drop(lines.send(format!("PASS {}", shown(&job.name)))),
                    Err(e) => {
                        let _ = lines.send(format!("FAIL {}: {}", shown(&job.name), crate::text::shown_lines(&e.message)));
                        if e.class == Class::Aborted {
                            return 130;
                        }
                        failures.push((job.name.clone(), e.message));
                    }
                }
            }
            if let Some(want) = loaded.pipeline.assert.as_ref().and_then(|a| a.execution.as_ref()).filter(|_| only.is_none()) {
                let got: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
                if want != &got {
                    let _ = lines.send(format!("steppe: error: pipeline assert.execution mismatch\n  want: [{}]\n  got:  [{}]", want.join(", "), got.join(", ")));
                    return 2;
                }
            }
            if !failures.is_empty() {
                let _ = lines.send(format!("steppe: error: test: {} job(s) failed:", failures.len()));
                for (j, e) in &failures {
                    let _ = lines.send(format!("  {}: {}", shown(j), shown(e)));
                }
                return 2;
            }
            let _ = lines.send(format!("{}/{} passed", jobs.len(), jobs.len()));
            return 0;
        }
        let from = match (req.resume.as_str(), req.replay.as_str(), req.from.as_str()) {
            ("", "", _) => None,
            (r, "", _) => Some(crate::engine::checkpoint::StartFrom::Resume(r.to_string())),
            ("", run, from) if !from.is_empty() => Some(crate::engine::checkpoint::StartFrom::Replay { run: run.to_string(), from: from.to_string() }),
            _ => {
                let _ = lines.send("steppe: error: --resume and --replay do not go together, and --replay needs --from STEP".to_string());
                return 2;
            }
        };
        let begin = match &from {
            None => None,
            Some(from) => match engine.out.store().ok_or_else(|| "this coordinator keeps no run store".to_string()).and_then(|st| crate::engine::checkpoint::resolve(st.as_ref(), &engine.scope, &jobs, from)) {
                Ok((j, b)) if req.job.is_empty() || req.job == j.name => Some((j, b)),
                Ok((j, _)) => {
                    let _ = lines.send(format!("steppe: error: --job {}: run {} ran job {}", req.job, from.run_id(), j.name));
                    return 2;
                }
                Err(e) => {
                    let _ = lines.send(format!("steppe: error: {e}"));
                    return 2;
                }
            },
        };
        let begin = match &taken {
            Some(run) => match engine.out.store().ok_or_else(|| "no run store".to_string()).and_then(|st| crate::engine::checkpoint::take_over(st.as_ref(), run).map_err(|e| e.to_string())) {
                Ok(b) => match jobs.iter().find(|j| j.name == run.job) {
                    Some(j) => Some((j.clone(), b)),
                    None => return 2,
                },
                Err(e) => {
                    self.svc.out.note(&format!("steppe coordinator: taking over run {}: {e}", run.id));
                    return 2;
                }
            },
            None => begin,
        };
        let (job, begin) = match begin {
            Some((j, b)) => (j, Some(b)),
            None => match self.pick_job(&req, &jobs, &lines) {
                Some(j) => (j, None),
                None => return 2,
            },
        };
        let (r, run_id) = run(job.clone(), begin).await;
        if !req.quiet {
            let _ = lines.send(format!("execution: [{}]", shown(&r.log.join(", "))));
        }
        let outcome = Outcome::of(&r.result);
        match &r.result {
            Ok(()) => drop(lines.send(format!("job {} succeeded", shown(&job.name)))),
            Err(e) => {
                let _ = lines.send(format!("resume with: steppe submit {} --coordinator URL --resume {run_id}", shown(&req.pipeline)));
                let _ = lines.send(format!("job {} {}: {}", shown(&job.name), outcome.word(), crate::text::shown_lines(&e.message)));
            }
        }
        i32::from(outcome.exit_code())
    }

    /// The job a submission names, or its only job.
    fn pick_job(&self, req: &SubmitRequest, jobs: &[steppe_language::model::Job], lines: &Lines) -> Option<steppe_language::model::Job> {
        match (req.job.as_str(), jobs.len()) {
            ("", 1) => Some(jobs[0].clone()),
            ("", _) => {
                let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
                let _ = lines.send(format!("steppe: error: {} has {} jobs; pick one with --job ({})", req.pipeline, jobs.len(), names.join(", ")));
                None
            }
            (name, _) => match jobs.iter().find(|j| j.name == name) {
                Some(j) => Some(j.clone()),
                None => {
                    let _ = lines.send(format!("steppe: error: job \"{name}\" is not in {}", req.pipeline));
                    None
                }
            },
        }
    }
}

/// Who may submit and cancel: a submit or admin token.
fn submitter(who: Option<&Identity>) -> Result<Identity, Status> {
    steppe_runtime::auth::require(who, &[Role::Submit, Role::Admin], "submit or cancel runs")
}

#[tonic::async_trait]
impl Runs for RunService {
    type SubmitStream = ReceiverStream<Result<RunEvent, Status>>;

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        let who = submitter(Identity::of(&req))?;
        let CancelRequest { run_id, pipeline } = req.into_inner();
        // Runs of another team are not there, as far as the caller can tell.
        let chosen: Vec<(String, Arc<crate::engine::Engine>)> = match self.active.lock() {
            Ok(a) => a
                .iter()
                .filter(|(id, e)| (run_id.is_empty() || **id == run_id) && (pipeline.is_empty() || e.scope.pipeline == pipeline) && who.sees(&e.scope.team))
                .filter(|_| !(run_id.is_empty() && pipeline.is_empty()))
                .map(|(id, e)| (id.clone(), e.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        for (id, e) in &chosen {
            e.out.note(&format!("run {id}: cancelled by request"));
            e.abort_run(id);
        }
        Ok(Response::new(CancelReply { cancelled: !chosen.is_empty(), run_ids: chosen.into_iter().map(|(id, _)| id).collect() }))
    }

    async fn submit(&self, req: Request<SubmitRequest>) -> Result<Response<Self::SubmitStream>, Status> {
        let who = submitter(Identity::of(&req))?;
        // Its runs join the submitter's trace (a malformed one is ignored).
        let trace_parent = req.metadata().get("traceparent").and_then(|v| v.to_str().ok()).filter(|t| steppe_runtime::trace::parse_traceparent(t).is_some()).map(str::to_string);
        let req = req.into_inner();
        let (tx, rx) = mpsc::channel(1024);
        let (ltx, mut lrx) = mpsc::unbounded_channel::<String>();
        let (stx, mut srx) = mpsc::unbounded_channel::<String>();
        let forward_tx = tx.clone();
        let forward = tokio::spawn(async move {
            loop {
                tokio::select! {
                    // Biased: a run's id goes out before its first line.
                    biased;
                    Some(id) = srx.recv() => {
                        if forward_tx.send(Ok(RunEvent { event: Some(run_event::Event::Started(id)) })).await.is_err() {
                            return;
                        }
                    }
                    l = lrx.recv() => {
                        let Some(l) = l else { return };
                        // Everything a submitter reads has its URLs' credentials masked.
                        let l = steppe_runtime::secrets::mask_urls(&l).into_owned();
                        if forward_tx.send(Ok(RunEvent { event: Some(run_event::Event::Line(l)) })).await.is_err() {
                            // Dropping the receiver tells the run its submitter is gone.
                            return;
                        }
                    }
                    _ = forward_tx.closed() => return,
                }
            }
        });
        let me = RunService { svc: self.svc.clone(), active: self.active.clone(), callers: self.callers.clone(), model_host: self.model_host, trace_parent };
        tokio::spawn(async move {
            use futures::FutureExt;
            let root = me.svc.state.join("submissions").join(crate::run_actor::run_id());
            // A panic handling this submission fails it, and only it.
            let (code, requests) = match std::panic::AssertUnwindSafe(me.handle_scripted(req, who, &root, &ltx, &stx, None)).catch_unwind().await {
                Ok(done) => done,
                Err(panic) => {
                    let what = steppe_language::load::panic_text(panic.as_ref());
                    me.svc.out.note(&format!("steppe coordinator: a submission failed inside the coordinator: {what}"));
                    let _ = ltx.send(format!("steppe: error: the coordinator failed handling this submission ({what}); it goes on serving others"));
                    (2, Vec::new())
                }
            };
            // Its files go with it (history stays); usually the engine took them already.
            let _ = std::fs::remove_dir_all(&root);
            drop((ltx, stx));
            let _ = forward.await;
            for r in requests {
                if tx.send(Ok(RunEvent { event: Some(run_event::Event::ModelRequest(r)) })).await.is_err() {
                    return;
                }
            }
            let fin = RunFinished { exit_code: code, message: String::new() };
            let _ = tx.send(Ok(RunEvent { event: Some(run_event::Event::Finished(fin)) })).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// What a coordinator keeps of a submission beside its files, so that one
/// started after it died can take its run over.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    /// The request as it came (without its files), prost-encoded.
    request: Vec<u8>,
    team: String,
    admin: bool,
    path: std::path::PathBuf,
    sub_dir: String,
}

const KEPT: &str = "submission.json";

/// Removes the submissions under `dir` no run can be taken over from.
pub fn sweep_submissions(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let day = std::time::Duration::from_secs(24 * 3600);
    for e in entries.flatten() {
        let kept = e.path().join(KEPT);
        let fresh = std::fs::metadata(&kept).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age < day);
        if !fresh {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn keep(root: &Path, req: &SubmitRequest, who: &Identity, path: &Path, sub_dir: &str) {
    let k = Kept { request: prost::Message::encode_to_vec(req), team: who.team.clone(), admin: who.role == Role::Admin, path: path.to_path_buf(), sub_dir: sub_dir.to_string() };
    if let Ok(text) = serde_json::to_string(&k) {
        let _ = std::fs::write(root.join(KEPT), text);
    }
}

fn kept(root: &Path) -> Result<Kept, String> {
    let text = std::fs::read_to_string(root.join(KEPT)).map_err(|e| format!("reading {}: {e}", root.join(KEPT).display()))?;
    serde_json::from_str(&text).map_err(|e| format!("reading {}: {e}", root.join(KEPT).display()))
}

impl RunService {
    /// Takes over, now and every few seconds, the runs of submissions whose
    /// coordinator stopped (their files still under this one's state
    /// directory): each goes on from its last checkpoint under its own id.
    pub fn take_over_orphans(&self) {
        let me = RunService { svc: self.svc.clone(), active: self.active.clone(), callers: self.callers.clone(), model_host: self.model_host, trace_parent: None };
        let me = Arc::new(me);
        let taking: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
        tokio::spawn(async move {
            loop {
                let Some(store) = me.svc.out.store().cloned() else { return };
                let orphans = tokio::task::spawn_blocking(move || store.orphaned_runs(steppe_runtime::store::now_ms()).unwrap_or_default()).await.unwrap_or_default();
                for run in orphans {
                    let Some(root) = me.kept_root(&run) else { continue };
                    if !taking.lock().is_ok_and(|mut t| t.insert(run.id.clone())) {
                        continue;
                    }
                    let (me, taking) = (me.clone(), taking.clone());
                    tokio::spawn(async move {
                        me.take_over(run.clone(), root).await;
                        if let Ok(mut t) = taking.lock() {
                            t.remove(&run.id);
                        }
                    });
                }
                tokio::time::sleep(std::time::Duration::from_secs(3)).await;
            }
        });
    }

    /// Where an orphan's submission is kept here, if it is.
    fn kept_root(&self, run: &RunRecord) -> Option<std::path::PathBuf> {
        let store = self.svc.out.store()?;
        let root = store.value(&Scope::new(&run.team, &run.pipeline), &format!("submission:{}", run.id)).ok()??;
        let root = std::path::PathBuf::from(root);
        (root.starts_with(self.svc.state.join("submissions")) && root.join(KEPT).is_file()).then_some(root)
    }

    async fn take_over(&self, run: RunRecord, root: std::path::PathBuf) {
        let k = match kept(&root) {
            Ok(k) => k,
            Err(e) => return self.svc.out.note(&format!("steppe coordinator: taking over run {}: {e}", run.id)),
        };
        let Ok(mut req) = <SubmitRequest as prost::Message>::decode(k.request.as_slice()) else {
            return self.svc.out.note(&format!("steppe coordinator: taking over run {}: its request does not decode", run.id));
        };
        // Nobody is attached: the run goes on alone, followers read its history.
        req.detach = true;
        req.resume.clear();
        req.replay.clear();
        let who = Identity { team: k.team, role: if k.admin { Role::Admin } else { Role::Submit }, pools: Vec::new() };
        self.svc.out.note(&format!("steppe coordinator: taking over run {} ({}, job {}) from {}, which stopped", run.id, run.pipeline, run.job, run.owner));
        let (ltx, _) = mpsc::unbounded_channel::<String>();
        let (stx, _) = mpsc::unbounded_channel::<String>();
        let (code, _) = self.handle_scripted(req, who, &root, &ltx, &stx, Some(run.clone())).await;
        self.svc.out.note(&format!("steppe coordinator: run {} taken over ended ({code})", run.id));
        let _ = std::fs::remove_dir_all(&root);
    }
}
