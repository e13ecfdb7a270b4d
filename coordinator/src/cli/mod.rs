//! The `steppe` commands: one module per command, its flags beside its logic.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use steppe_language::{load_file, LoadOptions};

use lazy::Lazy;

pub mod args;
pub mod cluster;
pub mod completions;
pub mod follow;
pub mod format;
pub mod gate;
pub mod history;
mod history_source;
pub mod jobs;
pub mod lazy;
pub mod mcp;
pub mod plan;
pub mod preflight;
pub mod questions;
pub mod log;
pub mod reference;
pub mod run;
pub mod scenario;
pub mod scripted_model;
pub mod submit;
pub mod test;
pub mod token;
pub mod trace;
pub mod validate;
pub mod watch;
pub mod web;

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
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    pub fn run(self) -> Result<ExitCode> {
        self.command.run()
    }
}

#[derive(Subcommand, Debug)]
pub enum Command {
    Validate(Lazy<validate::ValidateArgs>),
    Run(Lazy<run::RunArgs>),
    Test(Lazy<test::TestArgs>),
    #[command(name = "scripted-model")]
    ScriptedModel(Lazy<scripted_model::ScriptedModelArgs>),
    Worker(Lazy<cluster::WorkerArgs>),
    Coordinator(Lazy<cluster::CoordinatorArgs>),
    Submit(Lazy<submit::SubmitArgs>),
    Runs(Lazy<history::RunsArgs>),
    Jobs(Lazy<jobs::JobsArgs>),
    Approvals(Lazy<history::ApprovalsArgs>),
    Questions(Lazy<questions::QuestionsArgs>),
    Pipelines(Lazy<history::PipelinesArgs>),
    /// Approve a parked approval: the run continues.
    Approve(Lazy<history::DecideArgs>),
    /// Reject a parked approval: the approval step fails.
    Reject(Lazy<history::DecideArgs>),
    Cancel(Lazy<submit::CancelArgs>),
    Schema(Lazy<validate::SchemaArgs>),
    Token(Lazy<token::TokenArgs>),
    Web(Lazy<web::WebArgs>),
    Completions(Lazy<completions::CompletionsArgs>),
    Mcp(Lazy<mcp::McpArgs>),
    Preflight(Lazy<preflight::PreflightArgs>),
    Plan(Lazy<plan::PlanArgs>),
    Watch(Lazy<watch::WatchArgs>),
    Gate(Lazy<gate::GateArgs>),
}

impl Command {
    pub fn run(self) -> Result<ExitCode> {
        match self {
            Command::Validate(a) => a.0.run(),
            Command::Run(a) => a.0.run(),
            Command::Test(a) => a.0.run(),
            Command::ScriptedModel(a) => a.0.run(),
            Command::Worker(a) => a.0.run(),
            Command::Coordinator(a) => a.0.run(),
            Command::Submit(a) => a.0.run(),
            Command::Runs(a) => a.0.run(),
            Command::Jobs(a) => a.0.run(),
            Command::Approvals(a) => a.0.run(),
            Command::Questions(a) => a.0.run(),
            Command::Pipelines(a) => a.0.run(),
            Command::Approve(a) => a.0.run(true),
            Command::Reject(a) => a.0.run(false),
            Command::Cancel(a) => a.0.run(),
            Command::Schema(a) => a.0.run(),
            Command::Token(a) => a.0.run(),
            Command::Web(a) => a.0.run(),
            Command::Completions(a) => a.0.run(),
            Command::Mcp(a) => a.0.run(),
            Command::Preflight(a) => a.0.run(),
            Command::Plan(a) => a.0.run(),
            Command::Watch(a) => a.0.run(),
            Command::Gate(a) => a.0.run(),
        }
    }
}

/// What the process exits with: the command's code, or 2 after its error
/// (credentials in URLs masked).
pub fn exit(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            // The process log's last lines come before the error they led to.
            log::flush();
            warn!("steppe: error: {}", steppe_runtime::secrets::mask(&causes(&e)));
            if let Some(h) = hint(&e) {
                warn!("steppe: hint: {}", steppe_runtime::secrets::mask_urls(&h));
            }
            ExitCode::from(2)
        }
    }
}

/// An error and its causes, each said once.
pub fn causes(e: &anyhow::Error) -> String {
    steppe_runtime::causes::said(e.chain())
}

/// What to try after an error, where its cause says.
fn hint(e: &anyhow::Error) -> Option<String> {
    e.chain().find_map(|c| match c.downcast_ref::<steppe_worker::remote::WorkerError>()? {
        steppe_worker::remote::WorkerError::Connect { url, .. } => Some(format!(
            "is a coordinator listening at {url}? start one with `steppe coordinator --listen ADDR:PORT` (its first line says where it listens), or fix --coordinator"
        )),
        _ => None,
    })
}

/// Loads the pipeline; prints what it loaded but will not act on (warnings),
/// or every problem and gives the exit code (2).
pub fn load_reporting(path: &Path, opts: &LoadOptions) -> Result<steppe_language::Loaded, ExitCode> {
    let loaded = load_file(path, opts).map_err(|diags| {
        for d in diags.iter() {
            warn!("{d}");
        }
        warn!("steppe: error: {} problem(s) in {}", diags.len(), path.display());
        ExitCode::from(2)
    })?;
    for w in &loaded.warnings {
        warn!("{w}");
    }
    Ok(loaded)
}

/// This process's scratch directory, removed when the command returns (and
/// swept by the next steppe to start, if this one is killed).
fn scratch() -> Result<WorkScratch> {
    scratch_of("work")
}

/// As [`scratch`], of `kind`: when a steppe process on this host died (its
/// scratch directory left behind), the containers dead processes left on
/// the Docker engine are swept too, beside the command.
fn scratch_of(kind: &str) -> Result<WorkScratch> {
    steppe_runtime::scratch::Scratch::create_then(kind, |dead_seen| {
        if dead_seen {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() {
                // Bounded: the command waits for it before it exits.
                let _ = rt.block_on(async { tokio::time::timeout(std::time::Duration::from_secs(10), steppe_worker::container::sweep_orphans()).await });
            }
        }
    })
    .map(WorkScratch)
    .context("creating a scratch directory under the system's temp dir")
}

/// A command's scratch directory, where its steps' directories are made:
/// the empty ones it kept go on a shelf for later processes
/// (`steppe_worker::step_dir::shelve`) before the rest is removed.
struct WorkScratch(steppe_runtime::scratch::Scratch);

impl std::ops::Deref for WorkScratch {
    type Target = steppe_runtime::scratch::Scratch;
    fn deref(&self) -> &steppe_runtime::scratch::Scratch {
        &self.0
    }
}

impl std::ops::DerefMut for WorkScratch {
    fn deref_mut(&mut self) -> &mut steppe_runtime::scratch::Scratch {
        &mut self.0
    }
}

impl Drop for WorkScratch {
    fn drop(&mut self) {
        steppe_worker::step_dir::shelve();
    }
}

/// The command's async runtime, with this process's tracing started on it
/// (its spans exported when it is dropped, while the runtime still runs).
struct Runtime(Option<tokio::runtime::Runtime>);

impl std::ops::Deref for Runtime {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        self.0.as_ref().expect("the runtime lives until dropped")
    }
}

/// How long a process that ends waits for the engine to remove the
/// containers of its last steps.
const CONTAINER_REMOVALS_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.as_ref().filter(|_| tokio::runtime::Handle::try_current().is_err()) {
            let left = rt.block_on(steppe_worker::container::removals_settled(CONTAINER_REMOVALS_WAIT));
            if left > 0 {
                log::flush();
                eprintln!(
                    "steppe: the Docker engine did not confirm removing {left} container(s) of this process within {} s; remove what is left with: docker rm -f $(docker ps -aq --filter label={}={})",
                    CONTAINER_REMOVALS_WAIT.as_secs(),
                    steppe_worker::container::OWNER,
                    steppe_runtime::store::this_owner()
                );
            }
        }
        steppe_worker::telemetry::shutdown();
        drop(self.0.take());
    }
}

fn runtime() -> Result<Runtime> {
    runtime_with(None)
}

/// The runtime with `threads` worker threads (default: one per core). A
/// process whose work is waiting (on child processes, on peers) runs
/// fastest on as few as it needs: every task woken on one thread would
/// otherwise wake an idle sibling to look for work.
fn runtime_with(threads: Option<usize>) -> Result<Runtime> {
    // The plan walker recurses once per nested block (at most yaml::MAX_DEPTH
    // deep): room for that on every worker thread, not tokio's default 2 MiB.
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        b.worker_threads(n.max(1));
    }
    // Short bursts between the steps' commands: the threads ask for short
    // slices so that one woken to reap a command is not kept waiting
    // behind another command (worker::short_slice).
    b.on_thread_start(|| {
        steppe_worker::short_slice::ask();
    });
    let rt = b.enable_all().thread_stack_size(32 << 20).build().context("starting the async runtime")?;
    {
        let _inside = rt.enter();
        // The subcommand names the process's role in its spans.
        let role = std::env::args().nth(1).unwrap_or_else(|| "steppe".into());
        steppe_worker::telemetry::init(&role);
    }
    Ok(Runtime(Some(rt)))
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

#[cfg(test)]
mod tests {
    use clap::Subcommand;

    /// Every command, flag and argument says what it is for in `--help`.
    #[test]
    fn every_command_and_flag_has_help() {
        let root = super::Command::augment_subcommands(clap::Command::new("steppe"));
        let mut missing = Vec::new();
        fn walk(c: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for a in c.get_arguments() {
                if a.get_id() == "help" || a.get_id() == "version" || a.is_hide_set() {
                    continue;
                }
                if a.get_help().is_none() && a.get_long_help().is_none() {
                    missing.push(format!("{path} --{}", a.get_long().map(str::to_string).unwrap_or_else(|| a.get_id().to_string())));
                }
            }
            for s in c.get_subcommands() {
                if s.get_about().is_none() && s.get_long_about().is_none() {
                    missing.push(format!("{path} {} (the command)", s.get_name()));
                }
                walk(s, &format!("{path} {}", s.get_name()), missing);
            }
        }
        walk(&root, "steppe", &mut missing);
        assert!(missing.is_empty(), "without help text: {missing:#?}");
    }
}
