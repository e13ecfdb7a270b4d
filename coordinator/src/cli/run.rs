//! `steppe run`: one job of a pipeline, on this machine (or handed to a coordinator).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;

use super::args::{ExecArgs, StartArgs, VarArgs};
use super::scenario::ScriptArgs;
use super::{cores, load_reporting, runtime_with, scratch};
use crate::engine;
use crate::engine::checkpoint::StartFrom;
use crate::run_actor::{run_id, run_until_signal_from};
use crate::services::{parse_answers, start_services_opening};
use crate::text::shown;

/// Run one job of a pipeline, on this machine.
///
/// Each step that does work runs in a fresh directory holding only its declared
/// inputs; declared outputs are kept (by content hash) only when the step succeeds.
/// Steps print as they start and end; their output is streamed, prefixed by step.
///
/// Exit status: 0 succeeded, 1 failed, 130 aborted (Ctrl-C), 2 anything else
/// (errored steps, invalid pipeline).
///
/// Examples:
///   steppe run ci.yml                 (the pipeline has one job)
///   steppe run ci.yml --job build --var branch=main
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct RunArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// The job to run (required when the pipeline has more than one).
    #[arg(long)]
    job: Option<String>,
    #[command(flatten)]
    start: StartArgs,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    exec: ExecArgs,
    #[command(flatten)]
    vars: VarArgs,
}

impl RunArgs {
    pub fn run(self) -> Result<ExitCode> {
        let start = self.start.start();
        run_job(&self.pipeline, self.job.as_deref(), start, &self.script, &self.exec, &self.vars)
    }
}

fn run_job(path: &Path, job: Option<&str>, start: Option<StartFrom>, script: &ScriptArgs, exec: &ExecArgs, vars: &VarArgs) -> Result<ExitCode> {
    let job_flag = job;
    let mut vars = vars.resolve()?;
    let scenario = script.prepare(path, &mut vars)?;
    if let Some(code) = exec.submit(path, job, false, vars.clone(), scenario.as_ref(), start.as_ref())? {
        return Ok(code);
    }
    let store = crate::services::OpeningStore::start(steppe_runtime::store::db_path(path));
    let loaded = match load_reporting(path, &LoadOptions::from_env(vars)) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let jobs = &loaded.pipeline.jobs;
    let job = match job {
        // Continuing a run: its job, found once the store is open.
        _ if start.is_some() => jobs.first().cloned().ok_or_else(|| anyhow::anyhow!("{} has no jobs", path.display()))?,
        Some(name) => match jobs.iter().find(|j| j.name == name) {
            Some(j) => j.clone(),
            None => {
                let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
                anyhow::bail!(
                    "job \"{name}\" is not in {}; jobs: {}{}",
                    path.display(),
                    names.join(", "),
                    steppe_language::suggest::did_you_mean(name, names.iter().copied())
                );
            }
        },
        None if jobs.len() == 1 => jobs[0].clone(),
        None => {
            let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
            anyhow::bail!("{} has {} jobs; pick one with --job ({})", path.display(), jobs.len(), names.join(", "));
        }
    };
    let scratch = scratch()?;
    let rt = runtime_with(exec.runtime_threads())?;
    let id = run_id();
    let (result, model, job) = rt.block_on(async {
        let model = match &scenario {
            Some(sc) => Some(sc.serve().await?),
            None => None,
        };
        let engine = engine(&loaded, exec, store, scratch.path(), model.as_ref().map(|m| m.targets()), true).await?;
        let (job, begin) = match &start {
            None => (job, None),
            Some(from) => {
                let store = engine.out.store().ok_or_else(|| anyhow::anyhow!("no run store to continue a run from"))?;
                let (j, begin) = engine::checkpoint::resolve(store.as_ref(), &engine.scope, jobs, from).map_err(anyhow::Error::msg)?;
                if let Some(asked) = job_flag.filter(|n| *n != j.name) {
                    anyhow::bail!("--job {asked}: run {} ran job {}", from.run_id(), j.name);
                }
                (j, Some(begin))
            }
        };
        let run = engine::JobRun::starting(engine.clone(), job.clone(), id.clone(), begin);
        anyhow::Ok((run_until_signal_from(&engine, run).await, model, job))
    })?;
    let outcome = steppe_runtime::outcome::Outcome::of(&result.result);
    if !exec.quiet {
        say!("execution: [{}]", shown(&result.log.join(", ")));
    }
    match &result.result {
        Ok(()) => say!("job {} succeeded", shown(&job.name)),
        Err(e) => {
            // Before the verdict, which stays the last thing said.
            warn!("resume with: steppe run {} --resume {id}", shown(&path.display().to_string()));
            say!("job {} {}: {}", shown(&job.name), outcome.word(), crate::text::shown_lines(&e.message));
        }
    }
    if let Some(m) = &model {
        if !m.finish()? && outcome.exit_code() == 0 {
            return Ok(ExitCode::from(2));
        }
    }
    Ok(ExitCode::from(outcome.exit_code()))
}

/// Builds the engine of embedded mode: services under the pipeline's `.steppe/`.
/// `park_questions`: an unanswerable ask_user question waits in the store
/// (`steppe run`), rather than taking its default or aborting (`steppe test`).
pub(super) async fn engine(loaded: &steppe_language::Loaded, exec: &ExecArgs, store: crate::services::OpeningStore, scratch: &Path, scripted: Option<(String, Option<String>)>, park_questions: bool) -> Result<Arc<engine::Engine>> {
    let svc = start_services_opening(&loaded.dir.join(".steppe"), store, scratch, exec.workers.unwrap_or_else(cores), exec.quiet, exec.listen.is_some()).await?;
    if let Some(addr) = exec.listen {
        crate::server::serve(&svc, addr, crate::server::ServeOptions::default())?;
    }
    let scope = steppe_runtime::store::Scope::new("", &crate::services::pipeline_name(exec.pipeline_name.as_deref(), &loaded.path)?);
    let answers = parse_answers(&exec.answer)?;
    let built = crate::services::make_engine_with(&svc, loaded, scope, answers, scripted, svc.cancel_tx.clone(), svc.cancel_rx.clone());
    // `steppe test` runs every step: nothing is skipped, nothing pinned.
    let (force, pins) = if park_questions { (exec.cache.force, exec.cache.pins()?) } else { (true, Vec::new()) };
    let (version_history, run_history) = (exec.cache.version_history, exec.cache.run_history);
    Ok(Arc::new(engine::Engine { preflight: !exec.no_preflight, park_questions, force, pins, version_history, run_history, ..built }))
}
