//! `steppe validate` and `steppe schema`: a pipeline checked without running it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use steppe_language::{machine, schema, LoadOptions};

use super::args::VarArgs;
use super::load_reporting;

/// Check a pipeline: every load rule, and (unless --syntax-only) this machine.
///
/// Loads the file exactly as a run would — ((vars)) substituted, includes and
/// *_file fields read, every rule checked — and reports every problem at once,
/// each with its file, line, column and key path. Without --syntax-only it also
/// checks this machine: API key variables set, stdio MCP commands and CLI agent
/// binaries on PATH, a Docker engine and the images steps name. Nothing runs
/// and no state is written.
///
/// Exit status: 0 valid, 2 invalid (or the file cannot be read).
///
/// Examples:
///   steppe validate ci.yml
///   steppe validate ci.yml --syntax-only --var branch=main
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ValidateArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// Check the file only, not this machine (keys, PATH, Docker images).
    #[arg(long)]
    syntax_only: bool,
    #[command(flatten)]
    vars: VarArgs,
}

impl ValidateArgs {
    pub fn run(self) -> Result<ExitCode> {
        validate(&self.pipeline, self.syntax_only, &self.vars)
    }
}

fn validate(path: &Path, syntax_only: bool, vars: &VarArgs) -> Result<ExitCode> {
    let opts = LoadOptions::from_env(vars.resolve()?);
    let loaded = match load_reporting(path, &opts) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    if !syntax_only {
        // Images on this machine's Docker engine (asked only when the file names one).
        let rt = super::runtime()?;
        let mut engine = None;
        let mut unreachable_said = false;
        let mut image_problem = |image: &str| {
            let engine = engine.get_or_insert_with(|| rt.block_on(steppe_worker::container::engine()));
            if engine.is_err() && std::mem::replace(&mut unreachable_said, true) {
                return None;
            }
            rt.block_on(steppe_worker::container::images::problem(engine, image))
        };
        let problems = machine::check(&loaded, opts.env_model.as_deref(), &mut image_problem);
        if !problems.is_empty() {
            for d in &problems {
                warn!("{d}");
            }
            warn!(
                "steppe: error: {} problem(s) with this machine for {} (the file itself is valid; --syntax-only skips these checks)",
                problems.len(),
                path.display()
            );
            return Ok(ExitCode::from(2));
        }
    }
    let p = &loaded.pipeline;
    let user_agents = p.agents.iter().filter(|a| !(a.name.starts_with("@builtin/") && a.source.is_none() && a.file.is_none())).count();
    say!(
        "ok: {} ({} job(s), {} resource(s), {} agent(s))",
        path.display(),
        p.jobs.len(),
        p.resources.len(),
        user_agents
    );
    Ok(ExitCode::SUCCESS)
}

/// Print the JSON Schema of the pipeline format.
///
/// Generated from the same types the loader decodes into, so it cannot drift.
/// Point your editor at it, e.g. with a first line in the pipeline:
///   # yaml-language-server: $schema=./steppe.schema.json
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct SchemaArgs {}

impl SchemaArgs {
    pub fn run(self) -> Result<ExitCode> {
        say!("{}", schema::pipeline_schema_json());
        Ok(ExitCode::SUCCESS)
    }
}
