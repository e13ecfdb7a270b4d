//! `steppe submit` and `steppe cancel`: a run handed to a coordinator, followed, or stopped.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;
use steppe_proto::v1::runs_client::RunsClient;
use steppe_proto::v1::{run_event, CancelRequest, SubmitRequest};

use super::args::{CacheArgs, ExecArgs, RemoteArgs, StartArgs, VarArgs};
use super::scenario::{Prepared, ScriptArgs};
use super::{load_reporting, runtime, runtime_with};
use crate::engine::checkpoint::StartFrom;
use crate::remote::Remote;

/// Run a pipeline on a coordinator and follow it like `steppe run`.
///
/// Loads the pipeline here first (so problems show before anything is sent),
/// sends it with every file it reads (includes, run_file:, prompt files …)
/// and nothing else of its directory unless you name it: --include GLOB, or
/// a checked-in .steppe-include listing one glob per line (resource checks
/// run in a copy of what was sent). Says how many files and bytes go, then
/// prints the run's output as it happens. Exits like `steppe run` (or, with
/// --test, like `steppe test`). The coordinator deletes the files when the
/// run ends; its history stays.
///
/// Examples:
///   steppe submit ci.yml --job build --coordinator http://10.0.0.5:7070 --token-file token
///   steppe submit ci.yml --include 'scripts/*.sh' --include fixtures --coordinator …
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SubmitArgs {
    /// The pipeline file (sent with the files it reads).
    pipeline: PathBuf,
    /// The job to run (required when the pipeline has more than one).
    #[arg(long)]
    job: Option<String>,
    /// Run every job and check the asserts, like `steppe test`.
    #[arg(long)]
    test: bool,
    /// Print the run's id as soon as it begins and return; the run goes
    /// on (follow it with `steppe runs --coordinator URL --run ID`).
    #[arg(long, conflicts_with = "test")]
    detach: bool,
    /// The coordinator to run it on (e.g. http://10.0.0.5:7070).
    #[arg(long, value_name = "URL")]
    coordinator: String,
    /// A file holding the coordinator's token (the CLI's token for your team).
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// With an https:// coordinator: the CA certificate (PEM) that signed its certificate.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Run the steps on the workers of this pool (`steppe worker --pool NAME`).
    #[arg(long, value_name = "NAME")]
    pool: Option<String>,
    /// Answer an ask_user question ahead (SUBSTRING=ANSWER; repeatable).
    #[arg(long = "answer", value_name = "SUBSTRING=ANSWER")]
    answer: Vec<String>,
    /// Also send these files (a glob relative to the pipeline's
    /// directory; a directory sends everything under it; repeatable).
    /// Lines of a checked-in .steppe-include beside the pipeline add more.
    #[arg(long, value_name = "GLOB")]
    include: Vec<String>,
    /// The name its history goes under (default: the file's stem). Two
    /// pipelines never share history; two submissions of one name do.
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    /// Print only the verdict (the job's outcome, PASS/FAIL, errors), not
    /// the steps' progress and output.
    #[arg(short, long)]
    quiet: bool,
    /// Do not probe the models a job uses before its first step.
    #[arg(long)]
    no_preflight: bool,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    start: StartArgs,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    vars: VarArgs,
}

impl SubmitArgs {
    pub fn run(self) -> Result<ExitCode> {
        let SubmitArgs { pipeline, job, test, detach, coordinator, token_file, tls_ca, pool, answer, include, name, quiet, no_preflight, cache, start, script, vars } = self;
        let start = start.start();
        cache.pins()?;
        let remote = Remote::new(&coordinator, token_file.as_deref(), tls_ca.as_deref())?;
        let mut vars = vars.resolve()?;
        let scenario = script.prepare(&pipeline, &mut vars)?;
        if detach && script.dump_requests.is_some() {
            anyhow::bail!("--dump-requests with --detach: the requests come back when the run ends, to a submitter that follows it; drop --detach");
        }
        let mut include = include;
        include.extend(scenario.iter().flat_map(|s| s.files.iter().cloned()));
        let (scenario, dump_requests) = scenario.map(|s| (Some(s.text), s.dump)).unwrap_or_default();
        let o = SubmitOptions { job, test, detach, pool, vars: vars.into_iter().collect(), answers: answer, include, name, scenario, dump_requests, quiet, no_preflight, force: cache.force, pins: cache.pin, start };
        let code = runtime_with(Some(1))?.block_on(submit(&remote, &pipeline, o))?;
        Ok(ExitCode::from(u8::try_from(code).unwrap_or(2)))
    }
}

impl ExecArgs {
    /// `--coordinator`: hand the run to a coordinator and follow it.
    /// `vars` resolved (with a scenario's); `scenario` sent for the coordinator to serve.
    pub fn submit(&self, path: &Path, job: Option<&str>, test: bool, vars: steppe_language::vars::Vars, scenario: Option<&Prepared>, start: Option<&StartFrom>) -> Result<Option<ExitCode>> {
        let Some(remote) = self.remote.remote()? else { return Ok(None) };
        let vars = vars.into_iter().collect();
        let o = SubmitOptions {
            job: job.map(str::to_string),
            test,
            pool: self.pool.clone(),
            vars,
            answers: self.answer.clone(),
            include: self.include.iter().chain(scenario.iter().flat_map(|s| &s.files)).cloned().collect(),
            name: self.pipeline_name.clone(),
            scenario: scenario.map(|s| s.text.clone()),
            dump_requests: scenario.and_then(|s| s.dump.clone()),
            quiet: self.quiet,
            no_preflight: self.no_preflight,
            force: self.cache.force,
            pins: self.cache.pin.clone(),
            start: start.cloned(),
            ..Default::default()
        };
        let code = runtime_with(Some(1))?.block_on(submit(&remote, path, o))?;
        Ok(Some(ExitCode::from(u8::try_from(code).unwrap_or(2))))
    }
}

/// Abort a run going on at a coordinator (one started with --detach, say),
/// or every run of one pipeline; hooks run with their grace, as after Ctrl-C.
///
/// Examples:
///   steppe cancel r-1a22a36de6b-26745 --coordinator http://10.0.0.5:7070 --token-file token
///   steppe cancel --pipeline nightly --coordinator http://10.0.0.5:7070 --token-file token
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CancelArgs {
    /// The run's id (`steppe submit --detach` prints it; `steppe runs --coordinator URL` lists them).
    #[arg(required_unless_present = "name")]
    run: Option<String>,
    /// Every run of this pipeline going on (with a run id: only if it is this pipeline's).
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl CancelArgs {
    pub fn run(self) -> Result<ExitCode> {
        let CancelArgs { run, name, remote } = self;
        let Some(remote) = remote.remote()? else {
            anyhow::bail!("steppe cancel stops a run at a coordinator: add --coordinator URL (an embedded run stops with Ctrl-C)");
        };
        if let Some(n) = &name {
            steppe_runtime::store::check_name("--pipeline", n).map_err(anyhow::Error::msg)?;
        }
        let cancelled = runtime()?.block_on(cancel(&remote, run.as_deref().unwrap_or_default(), name.as_deref().unwrap_or_default()))?;
        if cancelled.is_empty() {
            let what = match (&run, &name) {
                (Some(r), Some(p)) => format!("no run {r} of pipeline {p}"),
                (Some(r), None) => format!("no run {r}"),
                (None, Some(p)) => format!("no run of pipeline {p}"),
                (None, None) => "no run".to_string(),
            };
            warn!("steppe: error: {what} is going on at {}", remote.url);
            return Ok(ExitCode::from(1));
        }
        for id in cancelled {
            say!("cancelled {id}");
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Asks the coordinator to abort run `run_id` (or, without one, every run
/// of `pipeline`); the runs it cancelled.
pub async fn cancel(remote: &Remote, run_id: &str, pipeline: &str) -> anyhow::Result<Vec<String>> {
    let mut client = RunsClient::with_interceptor(remote.channel().await?, remote.bearer()?);
    let req = CancelRequest { run_id: run_id.to_string(), pipeline: pipeline.to_string() };
    let reply = client.cancel(req).await.map_err(|s| anyhow::anyhow!("the coordinator refused: {}{}", s.message(), remote.hint(&s)))?.into_inner();
    Ok(reply.run_ids)
}

/// What a submission asks of the coordinator, besides the pipeline.
#[derive(Debug, Default)]
pub struct SubmitOptions {
    pub job: Option<String>,
    /// Run every job and check the asserts (`steppe test`).
    pub test: bool,
    /// Return as soon as the run has begun, printing its id.
    pub detach: bool,
    pub pool: Option<String>,
    pub vars: HashMap<String, String>,
    pub answers: Vec<String>,
    /// Extra files to send (globs relative to the pipeline's directory).
    pub include: Vec<String>,
    /// The pipeline's name (`--pipeline`; default: the file's stem).
    pub name: Option<String>,
    /// `--script`: the scenario the coordinator serves to the run's agents.
    pub scenario: Option<String>,
    /// `--dump-requests FILE`: where the scripted model's requests go.
    pub dump_requests: Option<PathBuf>,
    /// `-q`: the verdict lines only.
    pub quiet: bool,
    /// `--no-preflight`: the job's models are not probed first.
    pub no_preflight: bool,
    /// `--force`: no chain is skipped.
    pub force: bool,
    /// `--pin NAME=VALUE`: what every get takes.
    pub pins: Vec<String>,
    /// `--resume RUN` or `--replay RUN --from STEP`.
    pub start: Option<StartFrom>,
}

/// `steppe submit`: loads the pipeline here (so problems show before anything
/// is sent), sends it with every file it reads and what `--include` or
/// `.steppe-include` add, prints what comes back.
pub async fn submit(remote: &Remote, path: &Path, o: SubmitOptions) -> anyhow::Result<i32> {
    let SubmitOptions { job, test, detach, pool, vars, answers, include, name: pipeline_name, scenario, dump_requests, quiet, no_preflight, force, pins, start } = o;
    // Checked here too, so a bad name is said before anything is sent.
    let pipeline_name = crate::services::pipeline_name(pipeline_name.as_deref(), path)?;
    let (job, pool) = (job.as_deref(), pool.as_deref());
    let opts = LoadOptions { submission: true, ..LoadOptions::from_env(vars.clone().into_iter().collect()) };
    let Ok(loaded) = load_reporting(path, &opts) else { return Ok(2) };
    let bundle = crate::bundle::collect(path, &loaded, &include)?;
    if !quiet {
        warn!("steppe: sending {} to {}", bundle.summary(), remote.url);
    }
    let name = bundle.files.first().map(|f| f.path.clone()).unwrap_or_default();
    let files = bundle.files;
    let mut client = RunsClient::with_interceptor(remote.channel().await?, remote.bearer()?);
    if let Some(p) = pool {
        steppe_runtime::queue::check_pool_name(p).map_err(|e| anyhow::anyhow!("--pool {e}"))?;
    }
    let req = SubmitRequest { pipeline: name, files, job: job.unwrap_or_default().to_string(), vars, test, answers, detach, pool: pool.unwrap_or_default().to_string(), name: pipeline_name, dump_requests: dump_requests.is_some(), scenario: scenario.unwrap_or_default(), quiet, no_preflight, force, pins, resume: String::new(), replay: String::new(), from: String::new() };
    let req = match start {
        Some(StartFrom::Resume(r)) => SubmitRequest { resume: r, ..req },
        Some(StartFrom::Replay { run, from }) => SubmitRequest { replay: run, from, ..req },
        None => req,
    };
    let size = prost::Message::encoded_len(&req);
    if size > crate::bundle::SUBMISSION_MAX {
        anyhow::bail!(
            "{}: the pipeline and the files it sends come to {:.1} MiB; a submission carries at most 4 MiB (fetch large inputs with a resource or produce them in a step)",
            path.display(),
            size as f64 / (1 << 20) as f64
        );
    }
    // The first Ctrl-C cancels the run and stays to show how it ends (its
    // hooks run with their grace); a second one leaves at once. Caught from
    // before the submission goes, so none falls to the default handler.
    let mut ctrl_c = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // The submission's span: the runs it starts go under it, one trace.
    let span = steppe_worker::telemetry::start(&opentelemetry::Context::current(), "", format!("submit {}", path.display()), vec![opentelemetry::KeyValue::new("coordinator", remote.url.clone())], None);
    let mut req = tonic::Request::new(req);
    if let Ok(tp) = steppe_worker::telemetry::parent_of(&span).parse() {
        req.metadata_mut().insert("traceparent", tp);
    }
    let mut stream = client.submit(req).await.map_err(|s| anyhow::anyhow!("the coordinator refused the submission: {}{}", s.message(), remote.hint(&s)))?.into_inner();
    let mut started: Vec<String> = Vec::new();
    let mut requests: Vec<String> = Vec::new();
    let mut interrupted = false;
    loop {
        let ev = tokio::select! {
            ev = stream.message() => ev,
            _ = ctrl_c.recv() => {
                if interrupted {
                    return Ok(130);
                }
                interrupted = true;
                warn!("steppe: cancelling {} on the coordinator (Ctrl-C again to leave it to finish alone)", if started.is_empty() { "the submission".to_string() } else { started.join(", ") });
                let mut c = client.clone();
                for id in &started {
                    let _ = c.cancel(CancelRequest { run_id: id.clone(), ..Default::default() }).await;
                }
                continue;
            }
        };
        let ev = match ev {
            Ok(ev) => ev,
            // A coordinator that comes back (or one started in its place)
            // takes the run over: follow it there.
            Err(_) if started.len() == 1 && !test && !interrupted => return reattach(remote, &started[0]).await,
            Err(s) => return Err(went_away(&remote.url, &started, &s)),
        };
        let Some(ev) = ev else { break };
        match ev.event {
            Some(run_event::Event::Line(l)) => {
                if l.starts_with("steppe: error:") || l.starts_with("  ") && l.contains(": ") && !l.starts_with("  [") {
                    warn!("{l}");
                } else {
                    say!("{l}");
                }
            }
            Some(run_event::Event::ModelRequest(r)) => requests.push(r),
            Some(run_event::Event::Finished(f)) => {
                if let Some(file) = &dump_requests {
                    super::scenario::write_requests(file, requests.into_iter())?;
                }
                return Ok(f.exit_code);
            }
            Some(run_event::Event::Started(id)) if detach => {
                say!("{id}");
                return Ok(0);
            }
            Some(run_event::Event::Started(id)) => {
                if interrupted {
                    let _ = client.clone().cancel(CancelRequest { run_id: id.clone(), ..Default::default() }).await;
                }
                started.push(id);
            }
            None => {}
        }
    }
    if started.len() == 1 && !test && !interrupted {
        return reattach(remote, &started[0]).await;
    }
    Err(went_away(&remote.url, &started, &tonic::Status::unavailable("the stream ended without saying how the run finished")))
}

/// Follows a run whose coordinator went away, until it ends.
async fn reattach(remote: &Remote, id: &str) -> anyhow::Result<i32> {
    warn!("steppe: lost the coordinator at {} while {id} ran; following it until it ends (a coordinator that starts again takes it over)", remote.url);
    let (remote, id) = (remote.clone(), id.to_string());
    let code = tokio::task::spawn_blocking(move || super::follow::reattach(&remote, &id)).await??;
    Ok(i32::from(code))
}

/// The coordinator stopped answering while its runs went on: what became of
/// them, and where to look once it is back.
fn went_away(url: &str, started: &[String], s: &tonic::Status) -> anyhow::Error {
    let what = if started.is_empty() { "before the run began".to_string() } else { format!("while {} ran", started.join(", ")) };
    let look = match started.first() {
        Some(id) => format!("; see `steppe runs --run {id} --coordinator {url} --follow`"),
        None => String::new(),
    };
    anyhow::anyhow!("the coordinator at {url} went away {what} ({}){look}", s.message())
}
