//! `steppe jobs`: a pipeline's jobs, each with its last run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;
use steppe_runtime::store::{RunFilter, Store};

use super::args::{RemoteArgs, VarArgs};
use super::format::{fmt_ms, fmt_time};
use super::load_reporting;
use crate::text::shown;

/// List a pipeline's jobs, each with its steps and its last run.
///
/// The jobs come from the file; their last runs from the pipeline's own
/// store (.steppe/<file>.db), or from the coordinator's with --coordinator.
///
/// Examples:
///   steppe jobs ci.yml
///   steppe jobs ci.yml --coordinator http://10.0.0.5:7070 --token-file token
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct JobsArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// The name its history is kept under (default: the file's stem).
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    /// Resume a job its breaker paused (`max_consecutive_failures`): its
    /// failure count is cleared and `steppe watch` runs it again.
    #[arg(long, value_name = "JOB", conflicts_with = "coordinator")]
    resume: Option<String>,
    #[command(flatten)]
    vars: VarArgs,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl JobsArgs {
    pub fn run(self) -> Result<ExitCode> {
        let loaded = match load_reporting(&self.pipeline, &LoadOptions::from_env(self.vars.resolve()?)) {
            Ok(l) => l,
            Err(code) => return Ok(code),
        };
        let name = crate::services::pipeline_name(self.name.as_deref(), &self.pipeline)?;
        let store: Option<Box<dyn Store>> = match self.remote.remote()? {
            Some(remote) => Some(Box::new(crate::history::RemoteStore::connect(&remote)?)),
            None => steppe_runtime::store::SqliteStore::open_existing(&steppe_runtime::store::db_path(&self.pipeline))?.map(|s| Box::new(s) as Box<dyn Store>),
        };
        if let Some(job) = &self.resume {
            if !loaded.pipeline.jobs.iter().any(|j| &j.name == job) {
                let names: Vec<&str> = loaded.pipeline.jobs.iter().map(|j| j.name.as_str()).collect();
                anyhow::bail!("--resume {job}: {} has no job of that name; jobs: {}{}", self.pipeline.display(), names.join(", "), steppe_language::suggest::did_you_mean(job, names.iter().copied()));
            }
            let scope = steppe_runtime::store::Scope::new("", &name);
            let was = store.as_ref().map(|s| crate::watch::queue::breaker(s.as_ref(), &scope, job)).unwrap_or_default();
            if let Some(s) = &store {
                crate::watch::queue::set_breaker(s.as_ref(), &scope, job, &Default::default())?;
            }
            say!("{}: {}", shown(job), if was.paused { "resumed; steppe watch runs it again" } else { "was not paused; its failure count is cleared" });
            return Ok(ExitCode::SUCCESS);
        }
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0);
        say!("{:<28} {:>5}  {:<10} {:<21} {:>9}  {}", "JOB", "STEPS", "LAST", "STARTED", "DURATION", "RUN");
        for job in &loaded.pipeline.jobs {
            let last = match &store {
                Some(s) => s.runs(&RunFilter { pipeline: Some(&name), job: Some(&job.name), limit: 1, ..Default::default() })?.into_iter().next(),
                None => None,
            };
            let (outcome, started, took, id) = match &last {
                Some(r) => (r.outcome.clone().unwrap_or_else(|| "running".into()), fmt_time(r.started_ms), fmt_ms(r.finished_ms.unwrap_or(now) - r.started_ms), r.id.clone()),
                None => ("never run".into(), "-".into(), "-".into(), String::new()),
            };
            let paused = store.as_ref().is_some_and(|s| crate::watch::queue::breaker(s.as_ref(), &steppe_runtime::store::Scope::new("", &name), &job.name).paused);
            let outcome = if paused { format!("{outcome} (paused)") } else { outcome };
            say!("{:<28} {:>5}  {:<10} {:<21} {:>9}  {}", shown(&job.name), job.plan.len(), outcome, started, took, id);
        }
        Ok(ExitCode::SUCCESS)
    }
}
