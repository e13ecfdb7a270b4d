//! `steppe test`: every job once, in order, and the pipeline's asserts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;

use super::args::{ExecArgs, VarArgs};
use super::scenario::ScriptArgs;
use super::run::engine;
use super::{load_reporting, runtime_with, scratch};
use crate::run_actor::{run_id, run_until_signal};
use crate::text::shown;

/// Run every job once, in order, and check the pipeline's asserts.
///
/// Prints PASS <job> or FAIL <job>: <error> per job, checks the pipeline-level
/// assert.execution against the job names, then N/N passed. With --job, only
/// that job runs (its own asserts still checked; the pipeline-level
/// assert.execution, which names every job, is not).
/// Exit status: 0 only when every job passed; 130 after Ctrl-C; 2 otherwise.
///
/// Examples:
///   steppe test ci.yml
///   steppe test ci.yml --job build
///   steppe test agents.yml --script scenario.yaml
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct TestArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    exec: ExecArgs,
    #[command(flatten)]
    vars: VarArgs,
}

impl TestArgs {
    pub fn run(self) -> Result<ExitCode> {
        test(&self.pipeline, self.job.as_deref(), &self.script, &self.exec, &self.vars)
    }
}

fn test(path: &Path, only: Option<&str>, script: &ScriptArgs, exec: &ExecArgs, vars: &VarArgs) -> Result<ExitCode> {
    let mut vars_v = vars.resolve()?;
    let scenario = script.prepare(path, &mut vars_v)?;
    if let Some(code) = exec.submit(path, only, true, vars_v.clone(), scenario.as_ref(), None)? {
        return Ok(code);
    }
    let store = crate::services::OpeningStore::start(steppe_runtime::store::db_path(path));
    let loaded = match load_reporting(path, &LoadOptions::from_env(vars_v)) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let rt = runtime_with(exec.runtime_threads())?;
    let model = match &scenario {
        Some(sc) => Some(rt.block_on(sc.serve())?),
        None => None,
    };
    let targets = model.as_ref().map(|m| m.targets());
    let scratch = scratch()?;
    let engine = rt.block_on(engine(&loaded, exec, store, scratch.path(), targets, false))?;
    let jobs = match crate::services::pick_jobs(&loaded.pipeline.jobs, only, &path.display().to_string()) {
        Ok(j) => j,
        Err(e) => {
            warn!("steppe: error: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut aborted = false;
    for job in &jobs {
        let result = rt.block_on(run_until_signal(&engine, job, run_id()));
        match result.result {
            Ok(()) => say!("PASS {}", shown(&job.name)),
            Err(e) => {
                aborted |= e.class == steppe_runtime::outcome::Class::Aborted;
                say!("FAIL {}: {}", shown(&job.name), crate::text::shown_lines(&e.message));
                failures.push((job.name.clone(), e.message));
            }
        }
        if aborted {
            return Ok(ExitCode::from(130));
        }
    }
    if let Some(want) = loaded.pipeline.assert.as_ref().and_then(|a| a.execution.as_ref()).filter(|_| only.is_none()) {
        let got: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        if want != &got {
            warn!("steppe: error: pipeline assert.execution mismatch\n  want: [{}]\n  got:  [{}]", want.join(", "), got.join(", "));
            return Ok(ExitCode::from(2));
        }
    }
    if let Some(m) = &model {
        if !m.finish()? {
            return Ok(ExitCode::from(2));
        }
    }
    if !failures.is_empty() {
        warn!("steppe: error: test: {} job(s) failed:", failures.len());
        for (j, e) in &failures {
            warn!("  {}: {}", shown(j), shown(e));
        }
        return Ok(ExitCode::from(2));
    }
    say!("{}/{} passed", jobs.len(), jobs.len());
    Ok(ExitCode::SUCCESS)
}
