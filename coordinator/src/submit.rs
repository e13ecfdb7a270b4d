//! `steppe coordinator` serves submissions; `steppe submit` sends a pipeline
//! (with every file it reads) to one and follows the run: the same lines
//! `steppe run`/`steppe test` print, then the same exit code.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use steppe_proto::v1::runs_client::RunsClient;
use steppe_proto::v1::runs_server::Runs;
use steppe_proto::v1::{run_event, BundleFile, CancelReply, CancelRequest, RunEvent, RunFinished, SubmitRequest};
use steppe_shared::outcome::{Class, Outcome};
use steppe_shared::{load_file, LoadOptions};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
pub use steppe_worker::remote::WithToken;
use tonic::{Request, Response, Status};

use crate::engine::EventHub;
use crate::Services;

/// Checks the bearer token on every call when the coordinator has one.
#[derive(Clone)]
pub struct TokenCheck {
    token: Option<Arc<String>>,
    out: Arc<EventHub>,
}

impl TokenCheck {
    pub fn new(token: Option<String>, out: Arc<EventHub>) -> Self {
        TokenCheck { token: token.map(Arc::new), out }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.token else { return Ok(req) };
        let got = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        if got == Some(want.as_str()) {
            return Ok(req);
        }
        let peer = req.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        self.out.note(&format!("refused an unauthenticated call from {peer}"));
        Err(Status::unauthenticated("a valid token is required (steppe … --token-file F)"))
    }
}

pub fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let Some(f) = file else { return Ok(None) };
    let t = std::fs::read_to_string(f).map_err(|e| anyhow::anyhow!("--token-file {}: {e}", f.display()))?;
    let t = t.trim().to_string();
    if t.is_empty() {
        anyhow::bail!("--token-file {} is empty", f.display());
    }
    Ok(Some(t))
}

/// A coordinator as the client commands reach it (`--coordinator URL
/// [--token-file F] [--tls-ca F]`).
pub struct Remote {
    pub url: String,
    pub token: Option<String>,
    pub tls_ca: Option<PathBuf>,
}

impl Remote {
    pub fn new(url: &str, token_file: Option<&Path>, tls_ca: Option<&Path>) -> anyhow::Result<Remote> {
        Ok(Remote { url: url.to_string(), token: read_token(token_file)?, tls_ca: tls_ca.map(Path::to_path_buf) })
    }

    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        Ok(steppe_worker::remote::connect(&self.url, self.tls_ca.as_deref()).await?)
    }

    pub fn bearer(&self) -> anyhow::Result<WithToken> {
        Ok(WithToken::new(self.token.as_deref())?)
    }

    /// What to try when a call failed the way a TLS mismatch fails.
    pub fn hint(&self, s: &Status) -> &'static str {
        // A plain-http client talking to a TLS server fails below gRPC, in
        // one of these ways depending on timing.
        let transport = matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal)
            && (s.message().contains("transport error") || s.message().contains("h2 protocol error") || s.code() == tonic::Code::Cancelled);
        if self.url.starts_with("http://") && transport {
            " (does the coordinator serve TLS? then use an https:// URL)"
        } else {
            ""
        }
    }
}

/// Asks the coordinator to abort a run; false if no such run is going on.
pub async fn cancel(remote: &Remote, run_id: &str) -> anyhow::Result<bool> {
    let mut client = RunsClient::with_interceptor(remote.channel().await?, remote.bearer()?);
    let reply = client.cancel(CancelRequest { run_id: run_id.to_string() }).await.map_err(|s| anyhow::anyhow!("the coordinator refused: {}{}", s.message(), remote.hint(&s)))?;
    Ok(reply.into_inner().cancelled)
}

fn bundle_file(full: &Path, rel: &str) -> anyhow::Result<BundleFile> {
    use std::os::unix::fs::PermissionsExt;
    let content = std::fs::read(full).map_err(|e| anyhow::anyhow!("{}: {e}", full.display()))?;
    let executable = std::fs::metadata(full).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    Ok(BundleFile { path: rel.to_string(), content, executable })
}

/// How much of the pipeline's directory beyond the files the loader read
/// goes with a submission (at most; less when those files are large).
const DIRECTORY_BUDGET: usize = 3 << 20;

/// And at most this many of its files.
const DIRECTORY_FILES: usize = 2_000;

/// Adds the other files of the pipeline's directory (resource `check`s run
/// there, and may read them), smallest first, within [`DIRECTORY_BUDGET`];
/// hidden entries, symlinks and build output are left out. Returns how many
/// files did not fit.
fn bundle_directory(dir: &Path, files: &mut Vec<BundleFile>) -> usize {
    let have: std::collections::HashSet<PathBuf> = files.iter().map(|f| dir.join(&f.path)).filter_map(|p| p.canonicalize().ok()).collect();
    let mut found: Vec<(u64, PathBuf, String)> = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&rel)) else { continue };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') || matches!(name.as_ref(), "target" | "node_modules") {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
            let r = rel.join(&*name);
            if meta.is_dir() {
                // Bounded: a huge tree is not walked to the bottom.
                if found.len() < 10_000 {
                    stack.push(r);
                }
            } else if meta.is_file() && !e.path().canonicalize().is_ok_and(|p| have.contains(&p)) {
                found.push((meta.len(), e.path(), r.to_string_lossy().into_owned()));
            }
        }
    }
    found.sort();
    let read: usize = files.iter().map(|f| f.content.len() + f.path.len()).sum();
    let mut budget = DIRECTORY_BUDGET.min((SUBMISSION_MAX - (512 << 10)).saturating_sub(read));
    let mut left_out = 0;
    let mut added = 0;
    for (len, full, rel) in found {
        // What a file costs in the message: its bytes, its path, the framing.
        let cost = usize::try_from(len).unwrap_or(usize::MAX).saturating_add(rel.len() + 16);
        match Some(cost).filter(|c| *c <= budget && added < DIRECTORY_FILES).and_then(|_| bundle_file(&full, &rel).ok()) {
            Some(f) => {
                budget -= (f.content.len() + rel.len() + 16).min(budget);
                added += 1;
                files.push(f);
            }
            None => left_out += 1,
        }
    }
    left_out
}

/// The gRPC message limit.
const SUBMISSION_MAX: usize = 4 << 20;

pub struct RunService {
    pub svc: Arc<Services>,
    /// The runs going on, by id, for `Cancel`.
    pub active: Arc<std::sync::Mutex<HashMap<String, Arc<crate::engine::Engine>>>>,
}

type Lines = mpsc::UnboundedSender<String>;

/// Where a bundle unpacks: nested deep enough that `..` paths stay inside `root`.
fn unpack(root: &Path, pipeline: &str, files: &[BundleFile]) -> Result<PathBuf, String> {
    let mut depth = 0usize;
    for f in files {
        let p = Path::new(&f.path);
        if p.is_absolute() {
            return Err(format!("bundle path {:?} must be relative", f.path));
        }
        let mut level: isize = 0;
        for c in p.components() {
            match c {
                Component::ParentDir => level -= 1,
                Component::Normal(_) => level += 1,
                Component::CurDir => {}
                _ => return Err(format!("bundle path {:?} is not a plain relative path", f.path)),
            }
            depth = depth.max((-level).max(0) as usize);
        }
    }
    if depth > 16 {
        return Err("bundle paths climb more than 16 directories".into());
    }
    let mut dir = root.to_path_buf();
    for i in 0..depth {
        dir.push(format!("d{i}"));
    }
    for f in files {
        let full = dir.join(&f.path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::fs::write(&full, &f.content).map_err(|e| format!("{}: {e}", full.display()))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755)).map_err(|e| format!("{}: {e}", full.display()))?;
        }
    }
    if Path::new(pipeline).components().count() != 1 {
        return Err(format!("pipeline name {pipeline:?} must be a file name"));
    }
    Ok(dir.join(pipeline))
}

impl RunService {
    async fn handle(&self, req: SubmitRequest, lines: &Lines, started: &Lines) -> i32 {
        let id = crate::run_id();
        let root = self.svc.state.join("submissions").join(&id);
        let path = match unpack(&root, &req.pipeline, &req.files) {
            Ok(p) => p,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
        };
        let opts = LoadOptions { vars: req.vars.clone().into_iter().collect(), ..LoadOptions::from_env(Default::default()) };
        let loaded = match load_file(&path, &opts) {
            Ok(l) => l,
            Err(diags) => {
                for d in diags.iter() {
                    let _ = lines.send(d.to_string());
                }
                let _ = lines.send(format!("steppe: error: {} problem(s) in {}", diags.len(), req.pipeline));
                return 2;
            }
        };
        let answers = match crate::parse_answers(&req.answers) {
            Ok(a) => a,
            Err(e) => {
                let _ = lines.send(format!("steppe: error: {e}"));
                return 2;
            }
        };
        let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
        let mut engine = crate::make_engine_with(&self.svc, &loaded, answers, None, Arc::new(cancel_tx), cancel_rx);
        engine.decide_with = "--coordinator URL".into();
        if !req.pool.is_empty() {
            if let Err(e) = steppe_shared::queue::check_pool_name(&req.pool) {
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
        let run = |job: steppe_shared::model::Job| {
            let engine = engine.clone();
            let lines = lines.clone();
            let detach = req.detach;
            let active = self.active.clone();
            async move {
                let run_id = crate::run_id();
                if let Ok(mut a) = active.lock() {
                    a.insert(run_id.clone(), engine.clone());
                }
                engine.out.watch(&run_id, lines.clone());
                let _ = started.send(run_id.clone());
                let r = {
                    let fut = crate::run_one_as(&engine, &job, run_id.clone());
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
                r
            }
        };
        if req.test {
            let mut failures = Vec::new();
            for job in &jobs {
                let r = run(job.clone()).await;
                match r.result {
                    Ok(()) => drop(lines.send(format!("PASS {}", job.name))),
                    Err(e) => {
                        let _ = lines.send(format!("FAIL {}: {}", job.name, e.message));
                        if e.class == Class::Aborted {
                            return 130;
                        }
                        failures.push((job.name.clone(), e.message));
                    }
                }
            }
            if let Some(want) = loaded.pipeline.assert.as_ref().and_then(|a| a.execution.as_ref()) {
                let got: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
                if want != &got {
                    let _ = lines.send(format!("steppe: error: pipeline assert.execution mismatch\n  want: [{}]\n  got:  [{}]", want.join(", "), got.join(", ")));
                    return 2;
                }
            }
            if !failures.is_empty() {
                let _ = lines.send(format!("steppe: error: test: {} job(s) failed:", failures.len()));
                for (j, e) in &failures {
                    let _ = lines.send(format!("  {j}: {e}"));
                }
                return 2;
            }
            let _ = lines.send(format!("{}/{} passed", jobs.len(), jobs.len()));
            return 0;
        }
        let job = match (req.job.as_str(), jobs.len()) {
            ("", 1) => jobs[0].clone(),
            ("", _) => {
                let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
                let _ = lines.send(format!("steppe: error: {} has {} jobs; pick one with --job ({})", req.pipeline, jobs.len(), names.join(", ")));
                return 2;
            }
            (name, _) => match jobs.iter().find(|j| j.name == name) {
                Some(j) => j.clone(),
                None => {
                    let _ = lines.send(format!("steppe: error: job \"{name}\" is not in {}", req.pipeline));
                    return 2;
                }
            },
        };
        let r = run(job.clone()).await;
        let _ = lines.send(format!("execution: [{}]", r.log.join(", ")));
        let outcome = Outcome::of(&r.result);
        match &r.result {
            Ok(()) => drop(lines.send(format!("job {} succeeded", job.name))),
            Err(e) => drop(lines.send(format!("job {} {}: {}", job.name, outcome.word(), e.message))),
        }
        i32::from(outcome.exit_code())
    }
}

#[tonic::async_trait]
impl Runs for RunService {
    type SubmitStream = ReceiverStream<Result<RunEvent, Status>>;

    async fn cancel(&self, req: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        let id = req.into_inner().run_id;
        let engine = self.active.lock().ok().and_then(|a| a.get(&id).cloned());
        if let Some(e) = &engine {
            e.out.note(&format!("run {id}: cancelled by request"));
            e.abort_run(&id);
        }
        Ok(Response::new(CancelReply { cancelled: engine.is_some() }))
    }

    async fn submit(&self, req: Request<SubmitRequest>) -> Result<Response<Self::SubmitStream>, Status> {
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
                        if forward_tx.send(Ok(RunEvent { event: Some(run_event::Event::Line(l)) })).await.is_err() {
                            // Dropping the receiver tells the run its submitter is gone.
                            return;
                        }
                    }
                    _ = forward_tx.closed() => return,
                }
            }
        });
        let me = RunService { svc: self.svc.clone(), active: self.active.clone() };
        tokio::spawn(async move {
            let code = me.handle(req, &ltx, &stx).await;
            drop((ltx, stx));
            let _ = forward.await;
            let fin = RunFinished { exit_code: code, message: String::new() };
            let _ = tx.send(Ok(RunEvent { event: Some(run_event::Event::Finished(fin)) })).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// `steppe submit`: loads the pipeline here (so problems show before anything
/// is sent), sends it with every file it reads, prints what comes back.
/// With `detach`, returns as soon as the run has begun, printing its id.
#[allow(clippy::too_many_arguments)]
pub async fn submit(remote: &Remote, path: &Path, job: Option<&str>, test: bool, detach: bool, pool: Option<&str>, vars: HashMap<String, String>, answers: Vec<String>) -> anyhow::Result<i32> {
    let opts = LoadOptions::from_env(vars.clone().into_iter().collect());
    let loaded = match load_file(path, &opts) {
        Ok(l) => l,
        Err(diags) => {
            for d in diags.iter() {
                eprintln!("{d}");
            }
            eprintln!("steppe: error: {} problem(s) in {}", diags.len(), path.display());
            return Ok(2);
        }
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut files = vec![bundle_file(path, &name)?];
    for rel in &loaded.read_files {
        files.push(bundle_file(&loaded.dir.join(rel), rel)?);
    }
    let left_out = bundle_directory(&loaded.dir, &mut files);
    if left_out > 0 {
        eprintln!(
            "steppe: note: {left_out} file(s) of {} not sent (a submission carries at most {} MiB); a resource check that reads them will not find them on the coordinator",
            loaded.dir.display(),
            DIRECTORY_BUDGET >> 20
        );
    }
    let mut client = RunsClient::with_interceptor(remote.channel().await?, remote.bearer()?);
    if let Some(p) = pool {
        steppe_shared::queue::check_pool_name(p).map_err(|e| anyhow::anyhow!("--pool {e}"))?;
    }
    let req = SubmitRequest { pipeline: name, files, job: job.unwrap_or_default().to_string(), vars, test, answers, detach, pool: pool.unwrap_or_default().to_string() };
    let size = prost::Message::encoded_len(&req);
    if size > SUBMISSION_MAX {
        anyhow::bail!(
            "{}: the pipeline and the files it reads come to {:.1} MiB; a submission carries at most 4 MiB (fetch large inputs with a resource or produce them in a step)",
            path.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    // The first Ctrl-C cancels the run and stays to show how it ends (its
    // hooks run with their grace); a second one leaves at once. Caught from
    // before the submission goes, so none falls to the default handler.
    let mut ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut stream = client.submit(req).await.map_err(|s| anyhow::anyhow!("the coordinator refused the submission: {}{}", s.message(), remote.hint(&s)))?.into_inner();
    let mut started: Vec<String> = Vec::new();
    let mut interrupted = false;
    loop {
        let ev = tokio::select! {
            ev = stream.message() => ev,
            _ = ctrl_c.recv() => {
                if interrupted {
                    return Ok(130);
                }
                interrupted = true;
                eprintln!("steppe: cancelling {} on the coordinator (Ctrl-C again to leave it to finish alone)", if started.is_empty() { "the submission".to_string() } else { started.join(", ") });
                let mut c = client.clone();
                for id in &started {
                    let _ = c.cancel(CancelRequest { run_id: id.clone() }).await;
                }
                continue;
            }
        };
        let Some(ev) = ev.map_err(|s| anyhow::anyhow!("the coordinator went away: {}", s.message()))? else { break };
        match ev.event {
            Some(run_event::Event::Line(l)) => {
                if l.starts_with("steppe: error:") || l.starts_with("  ") && l.contains(": ") && !l.starts_with("  [") {
                    eprintln!("{l}");
                } else {
                    println!("{l}");
                }
            }
            Some(run_event::Event::Finished(f)) => return Ok(f.exit_code),
            Some(run_event::Event::Started(id)) if detach => {
                println!("{id}");
                return Ok(0);
            }
            Some(run_event::Event::Started(id)) => {
                if interrupted {
                    let _ = client.clone().cancel(CancelRequest { run_id: id.clone() }).await;
                }
                started.push(id);
            }
            None => {}
        }
    }
    anyhow::bail!("the coordinator ended the run's stream without saying how it finished")
}
