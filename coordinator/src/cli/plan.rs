//! `steppe plan`: what a run would do now, step by step: run, or skip a
//! chain a run already succeeded through.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::LoadOptions;
use steppe_runtime::merkle::short;

use super::args::VarArgs;
use super::{cores, load_reporting, runtime, scratch};
use crate::engine::chain::Chain;
use crate::engine::JobRun;
use crate::text::shown;

/// Show what a run would run and what it would skip, and why; run nothing
/// but the checks of the resources its gets fetch.
///
/// Each top-level step is hashed with everything before it (a merkle chain):
/// its command, inputs, outputs, image, the version a get chooses. A chain a
/// run of the job already succeeded through is skipped whole. Puts, agents,
/// `when:` guards, routing, blocks, `across:`, `load_var:`, approvals and
/// tasks with a `fix:` make their chain uncacheable: it always runs.
///
/// Prints `ACTION STEP HASH WHY` per step, then `N step(s): X would run,
/// Y cached`. `steppe run --force` runs a chain even when it is cached.
///
/// Examples:
///   steppe plan ci.yml
///   steppe plan ci.yml --job build --pin ref=abc123
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct PlanArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// Only this job (default: every job).
    #[arg(long)]
    job: Option<String>,
    /// Every get takes the oldest version whose field NAME is VALUE (repeatable).
    #[arg(long = "pin", value_name = "NAME=VALUE")]
    pin: Vec<String>,
    /// The name its history goes under (default: the file's stem).
    #[arg(long = "pipeline", value_name = "NAME")]
    pipeline_name: Option<String>,
    #[command(flatten)]
    vars: VarArgs,
}

impl PlanArgs {
    pub fn run(self) -> Result<ExitCode> {
        let pins = super::args::parse_pins(&self.pin)?;
        let loaded = match load_reporting(&self.pipeline, &LoadOptions::from_env(self.vars.resolve()?)) {
            Ok(l) => l,
            Err(code) => return Ok(code),
        };
        let jobs = crate::services::pick_jobs(&loaded.pipeline.jobs, self.job.as_deref(), &self.pipeline.display().to_string()).map_err(anyhow::Error::msg)?;
        let rt = runtime()?;
        let scratch = scratch()?;
        let svc = rt.block_on(crate::services::start_services(&loaded.dir.join(".steppe"), &steppe_runtime::store::db_path(&loaded.path), scratch.path(), cores(), true, false))?;
        let scope = steppe_runtime::store::Scope::new("", &crate::services::pipeline_name(self.pipeline_name.as_deref(), &self.pipeline)?);
        let mut engine = crate::services::make_engine_with(&svc, &loaded, scope, Vec::new(), None, svc.cancel_tx.clone(), svc.cancel_rx.clone());
        engine.pins = pins;
        let engine = std::sync::Arc::new(engine);
        let many = jobs.len() > 1;
        for job in jobs {
            let run = JobRun::new(engine.clone(), job.clone(), "plan".into());
            let chains = rt.block_on(run.plan_chains());
            if many {
                say!("job {}:", shown(&job.name));
            }
            for line in table(&chains) {
                say!("{}", line);
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// The plan's rows and its summary line: the steps before an `every` get
/// once, then each input set's.
fn table(chains: &[Chain]) -> Vec<String> {
    let all_skip = chains.iter().all(Chain::skippable);
    let prefix = chains.first().map_or(0, Chain::shared);
    let mut rows: Vec<[String; 4]> = Vec::new();
    let why_run = |c: &Chain| match (&c.uncacheable, &c.unresolved) {
        (_, Some(e)) => format!("a get cannot choose its version: {e}"),
        (Some((step, why)), None) => format!("{step} makes this chain uncacheable ({why})"),
        (None, None) => "no run succeeded through this chain yet".to_string(),
    };
    let mut add = |c: &Chain, from: usize, to: usize, skip: bool| {
        for (n, node) in c.nodes.iter().enumerate().take(to).skip(from) {
            let why = match (skip, n == from, &node.version) {
                (true, true, Some(v)) => format!("cached (version: {v})"),
                (true, true, None) => "cached".to_string(),
                (true, false, _) => "chain".to_string(),
                (false, _, Some(v)) => format!("{} (version: {v})", why_run(c)),
                (false, _, None) => why_run(c),
            };
            rows.push([if skip { "skip" } else { "run" }.to_string(), shown(&node.step).to_string(), short(&node.hash).to_string(), shown(&why).to_string()]);
        }
    };
    if let Some(first) = chains.first() {
        add(first, 0, prefix, all_skip);
    }
    for c in chains.iter().filter(|c| c.set.is_some()) {
        add(c, prefix, c.nodes.len(), c.skippable());
    }
    let width = rows.iter().map(|r| r[1].chars().count()).max().unwrap_or(4).max(4);
    let mut out = vec![format!("{:<6} {:<width$} {:<12} WHY", "ACTION", "STEP", "HASH")];
    out.extend(rows.iter().map(|r| format!("{:<6} {:<width$} {:<12} {}", r[0], r[1], r[2], r[3])));
    let run = rows.iter().filter(|r| r[0] == "run").count();
    out.push(format!("{} step(s): {run} would run, {} cached", rows.len(), rows.len() - run));
    out
}
