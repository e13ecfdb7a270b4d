//! `steppe test`: every job once, in order, and the pipeline's asserts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;

use super::args::{ExecArgs, VarArgs};
use super::scenario::ScriptArgs;
use super::run::engine;
use super::{load_reporting, runtime, scratch};
use crate::run_actor::{run_id, run_until_signal};
use crate::text::shown;

/// Run every job once, in order, and check the pipeline's asserts.
///
/// Prints PASS <job> or FAIL <job>: <error> per job, checks the pipeline-level
/// assert.execution against the job names, then N/N passed.
/// Exit status: 0 only when every job passed; 2 otherwise.
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct TestArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    #[command(flatten)]
    script: ScriptArgs,
    #[command(flatten)]
    exec: ExecArgs,
    #[command(flatten)]
    vars: VarArgs,
}

impl TestArgs {
    pub fn run(self) -> Result<ExitCode> {
        test(&self.pipeline, &self.script, &self.exec, &self.vars)
    }
}

fn test(path: &Path, script: &ScriptArgs, exec: &ExecArgs, vars: &VarArgs) -> Result<ExitCode> {
    let mut vars_v = vars.resolve()?;
    let scenario = script.prepare(path, &mut vars_v)?;
    if let Some(code) = exec.submit(path, None, true, vars_v.clone(), scenario.as_ref())? {
        return Ok(code);
    }
    let loaded = match load_reporting(path, &LoadOptions::from_env(vars_v)) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    let model = match &scenario {
        Some(sc) => Some(rt.block_on(sc.serve())?),
        None => None,
    };
    let targets = model.as_ref().map(|m| m.targets());
    let scratch = scratch()?;
    let engine = rt.block_on(engine(&loaded, exec, scratch.path(), targets))?;
    let jobs = loaded.pipeline.jobs.clone();
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut aborted = false;
    for job in &jobs {
        let result = rt.block_on(run_until_signal(&engine, job, run_id()));
        match result.result {
            Ok(()) => say!("PASS {}", shown(&job.name)),
            Err(e) => {
                aborted |= e.class == steppe_runtime::outcome::Class::Aborted;
                say!("FAIL {}: {}", shown(&job.name), shown(&e.message));
                failures.push((job.name.clone(), e.message));
            }
        }
        if aborted {
            return Ok(ExitCode::from(130));
        }
    }
    if let Some(want) = loaded.pipeline.assert.as_ref().and_then(|a| a.execution.as_ref()) {
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
