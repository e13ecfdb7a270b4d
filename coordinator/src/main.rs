//! The `steppe` binary: parses the command line and hands it to its command
//! (`steppe_coordinator::cli`).

use std::process::ExitCode;

use clap::Parser;
use steppe_coordinator::cli::{exit, Command};

/// steppe runs Concourse-style YAML pipelines with LLM agent steps,
/// on one machine or a cluster.
///
/// A pipeline file declares resources, jobs and agents; each job is a plan of
/// steps (get, task, put, agent, and the blocks that combine them).
///
/// Start here:
///   steppe run pipeline.yml --job build   run one job
///   steppe test pipeline.yml           run every job, check its asserts
///   steppe validate pipeline.yml       check a pipeline without running it
///   steppe schema > steppe.schema.json   JSON Schema for your editor
#[derive(Parser, Debug)]
#[command(name = "steppe", version, about, long_about, verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

fn main() -> ExitCode {
    exit(Cli::parse().command.run())
}
