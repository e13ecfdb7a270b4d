//! The `steppe` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use steppe_shared::vars::{parse_var_flag, Vars};
use steppe_shared::{load_file, machine, schema, LoadOptions};

/// steppe runs Concourse-style YAML pipelines with LLM agent steps,
/// on one machine or a cluster.
///
/// A pipeline file declares resources, jobs and agents; each job is a plan of
/// steps (get, task, put, agent, and the blocks that combine them).
///
/// Start here:
///   steppe validate pipeline.yml      check a pipeline without running it
///   steppe schema > steppe.schema.json   JSON Schema for your editor
#[derive(Parser, Debug)]
#[command(name = "steppe", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Check a pipeline: every load rule, and (unless --syntax-only) this machine.
    ///
    /// Loads the file exactly as a run would — ((vars)) substituted, includes and
    /// *_file fields read, every rule checked — and reports every problem at once,
    /// each with its file, line, column and key path. Without --syntax-only it also
    /// checks this machine: API key variables set, stdio MCP commands and CLI agent
    /// binaries on PATH. Nothing runs and no state is written.
    ///
    /// Exit status: 0 valid, 2 invalid (or the file cannot be read).
    ///
    /// Examples:
    ///   steppe validate ci.yml
    ///   steppe validate ci.yml --syntax-only --var branch=main
    #[command(verbatim_doc_comment)]
    Validate {
        /// The pipeline file.
        pipeline: PathBuf,
        /// Check the file only, not this machine (keys, PATH).
        #[arg(long)]
        syntax_only: bool,
        #[command(flatten)]
        vars: VarArgs,
    },
    /// Print the JSON Schema of the pipeline format.
    ///
    /// Generated from the same types the loader decodes into, so it cannot drift.
    /// Point your editor at it, e.g. with a first line in the pipeline:
    ///   # yaml-language-server: $schema=./steppe.schema.json
    #[command(verbatim_doc_comment)]
    Schema,
}

#[derive(Args, Debug, Default)]
struct VarArgs {
    /// Set a ((var)): NAME=VALUE (repeatable; wins over --vars-file).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    var: Vec<String>,
    /// A YAML file of NAME: VALUE pairs for ((vars)).
    #[arg(long = "vars-file", value_name = "FILE")]
    vars_file: Option<PathBuf>,
}

impl VarArgs {
    fn resolve(&self) -> Result<Vars> {
        let mut vars = Vars::new();
        if let Some(f) = &self.vars_file {
            vars.extend(read_vars_file(f)?);
        }
        for flag in &self.var {
            let (k, v) = parse_var_flag(flag).map_err(anyhow::Error::msg)?;
            vars.insert(k, v);
        }
        Ok(vars)
    }
}

fn read_vars_file(path: &Path) -> Result<Vars> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read --vars-file {}", path.display()))?;
    let (node, problems) = steppe_shared::yaml::parse(&text, 0)
        .map_err(|e| anyhow::anyhow!("{}:{}:{}: invalid YAML: {}", path.display(), e.mark.line, e.mark.col, e.message))?;
    if let Some(p) = problems.first() {
        anyhow::bail!("{}:{}:{}: {}", path.display(), p.mark.line, p.mark.col, p.message);
    }
    let Some(node) = node else { return Ok(Vars::new()) };
    let Some(entries) = node.entries() else {
        anyhow::bail!("{}: --vars-file must be a mapping of NAME: VALUE", path.display());
    };
    let mut vars = Vars::new();
    for (k, v) in entries {
        let (Some(k), Some(v)) = (k.as_str(), v.as_str()) else {
            anyhow::bail!("{}:{}:{}: --vars-file values must be scalars (they are substituted as text)", path.display(), v.mark.line, v.mark.col);
        };
        vars.insert(k.to_string(), v.to_string());
    }
    Ok(vars)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("steppe: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Validate { pipeline, syntax_only, vars } => validate(&pipeline, syntax_only, &vars),
        Command::Schema => {
            println!("{}", schema::pipeline_schema_json());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn validate(path: &Path, syntax_only: bool, vars: &VarArgs) -> Result<ExitCode> {
    let opts = LoadOptions::from_env(vars.resolve()?);
    let loaded = match load_file(path, &opts) {
        Ok(l) => l,
        Err(diags) => {
            for d in diags.iter() {
                eprintln!("{d}");
            }
            eprintln!("steppe: error: {} problem(s) in {}", diags.len(), path.display());
            return Ok(ExitCode::from(2));
        }
    };
    if !syntax_only {
        let problems = machine::check(&loaded, opts.env_model.as_deref());
        if !problems.is_empty() {
            for d in &problems {
                eprintln!("{d}");
            }
            eprintln!(
                "steppe: error: {} problem(s) with this machine for {} (the file itself is valid; --syntax-only skips these checks)",
                problems.len(),
                path.display()
            );
            return Ok(ExitCode::from(2));
        }
    }
    let p = &loaded.pipeline;
    let user_agents = p.agents.iter().filter(|a| !(a.name.starts_with("@builtin/") && a.source.is_none() && a.file.is_none())).count();
    println!(
        "ok: {} ({} job(s), {} resource(s), {} agent(s))",
        path.display(),
        p.jobs.len(),
        p.resources.len(),
        user_agents
    );
    Ok(ExitCode::SUCCESS)
}
