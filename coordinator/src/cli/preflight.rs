//! `steppe preflight`: the model sources a pipeline's jobs would use, each
//! asked for one token, and the MCP servers they are granted, reached, as a
//! run does before its first step.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;

use super::args::VarArgs;
use super::{load_reporting, runtime, scratch};
use crate::engine::JobRun;
use crate::text::shown;

/// Probe the models and MCP servers a pipeline's jobs use; run nothing.
///
/// Each agent a job reaches (its steps, hooks, fix agents and the sub-agents
/// they grant) has its model source asked for one token; a primary that does
/// not answer is replaced by the first fallback that does. The MCP servers
/// it is granted tools of are reached: an HTTP server is connected to and
/// the granted tool names looked up in its list; a stdio server's program
/// is looked for on PATH. Nothing is recorded. A source (or an MCP server)
/// whose key (or token) variable is not set here is not probed.
///
/// Exit status: 0 when every agent has a source that answers and MCP
/// servers that serve its grants, 2 otherwise.
///
/// Examples:
///   steppe preflight ci.yml
///   steppe preflight ci.yml --job review
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct PreflightArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// Only this job.
    #[arg(long)]
    job: Option<String>,
    #[command(flatten)]
    vars: VarArgs,
}

impl PreflightArgs {
    pub fn run(self) -> Result<ExitCode> {
        let loaded = match load_reporting(&self.pipeline, &LoadOptions::from_env(self.vars.resolve()?)) {
            Ok(l) => l,
            Err(code) => return Ok(code),
        };
        let jobs = crate::services::pick_jobs(&loaded.pipeline.jobs, self.job.as_deref(), &self.pipeline.display().to_string()).map_err(anyhow::Error::msg)?;
        let rt = runtime()?;
        let scratch = scratch()?;
        // Services of its own in the scratch directory: the pipeline's history is not touched.
        let dir = scratch.path().join("preflight");
        let svc = rt.block_on(crate::services::start_services(&dir, &dir.join("runs.db"), scratch.path(), 1, true, false))?;
        let scope = steppe_runtime::store::Scope::new("", &crate::services::pipeline_name(None, &self.pipeline)?);
        let engine = crate::services::make_engine(&svc, &loaded, scope, Vec::new(), None, true);
        let mut failed = false;
        for job in jobs {
            let run = JobRun::new(engine.clone(), job.clone(), "preflight".into());
            let report = rt.block_on(run.probe_sources());
            say!("job {}:", shown(&job.name));
            if report.ok.is_empty() && report.pinned.is_empty() && report.problems.is_empty() {
                say!("  nothing to probe");
            }
            for l in &report.ok {
                say!("  ok: {}", shown(l));
            }
            for l in &report.pinned {
                say!("  fallback: {}", shown(l));
            }
            for l in &report.problems {
                say!("  failed: {}", shown(l));
            }
            failed |= !report.problems.is_empty();
        }
        Ok(if failed { ExitCode::from(2) } else { ExitCode::SUCCESS })
    }
}
