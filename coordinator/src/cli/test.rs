//! `steppe test`: every job once, in order, and the pipeline's asserts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use steppe_language::LoadOptions;

use super::args::{ExecArgs, VarArgs};
use super::run::engine;
use super::{load_reporting, runtime, scratch};
use crate::run_actor::{run_id, run_until_signal};
use crate::scripted;
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
    /// Answer every agent's model requests from this scenario (the scripted
    /// model): no API key, deterministic. A request the scenario cannot answer
    /// fails the test even when every job passed.
    #[arg(long, value_name = "SCENARIO")]
    script: Option<PathBuf>,
    /// With --script: write every request the scripted model received here, as JSON lines.
    #[arg(long, value_name = "FILE", requires = "script")]
    dump_requests: Option<PathBuf>,
    #[command(flatten)]
    exec: ExecArgs,
    #[command(flatten)]
    vars: VarArgs,
}

impl TestArgs {
    pub fn run(self) -> Result<ExitCode> {
        test(&self.pipeline, self.script.as_deref(), self.dump_requests.as_deref(), &self.exec, &self.vars)
    }
}

fn test(path: &Path, script: Option<&Path>, dump: Option<&Path>, exec: &ExecArgs, vars: &VarArgs) -> Result<ExitCode> {
    if script.is_some() && exec.remote.coordinator.is_some() {
        anyhow::bail!("--script runs the scripted model in this process; it cannot be combined with --coordinator");
    }
    if let Some(code) = exec.submit(path, None, true, vars)? {
        return Ok(code);
    }
    let scenario = match script {
        Some(p) => Some(scripted::load(p)?),
        None => None,
    };
    let mut vars_v = vars.resolve()?;
    if let Some(sc) = &scenario {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        for (rel, content) in &sc.files {
            if Path::new(rel).is_absolute() || rel.split('/').any(|s| s == "..") {
                anyhow::bail!("scenario files: {rel:?} must be a path inside the pipeline's directory");
            }
            let full = dir.join(rel);
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("scenario files: {}", parent.display()))?;
            }
            std::fs::write(&full, content).with_context(|| format!("scenario files: {}", full.display()))?;
        }
        for (k, v) in &sc.vars {
            vars_v.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let loaded = match load_reporting(path, &LoadOptions::from_env(vars_v)) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let rt = runtime()?;
    let model = match &scenario {
        Some(sc) => Some(rt.block_on(scripted::serve(sc.model.clone(), "127.0.0.1:0".parse()?))?),
        None => None,
    };
    let fallback = match scenario.as_ref().and_then(|sc| sc.fallback.clone()) {
        Some(f) => Some(rt.block_on(scripted::serve(Some(f), "127.0.0.1:0".parse()?))?),
        None => None,
    };
    let targets = model.as_ref().map(|m| (m.base_url.clone(), fallback.as_ref().map(|f| f.base_url.clone())));
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
        if let Some(f) = dump {
            let mut lines: Vec<String> = m.requests().iter().map(|r| r.to_string()).collect();
            if let Some(fb) = &fallback {
                lines.extend(fb.requests().iter().map(|r| r.to_string()));
            }
            std::fs::write(f, lines.join("\n") + "\n").with_context(|| format!("--dump-requests {}", f.display()))?;
        }
        let mut problems = m.failures();
        if let Some(fb) = &fallback {
            problems.extend(fb.failures().into_iter().map(|p| format!("fallback {p}")));
        }
        if !problems.is_empty() {
            for p in &problems {
                say!("FAIL scenario: {p}");
            }
            warn!("steppe: error: the scenario could not answer {} request(s)", problems.len());
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
