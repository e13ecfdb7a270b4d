//! The `steppe` command line.

/// `println!` that never panics: a closed stdout (`steppe runs | head`)
/// makes the rest of the output go nowhere instead of ending in a panic.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// `eprintln!` that never panics.
macro_rules! warn {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

mod artifacts;
mod bundle;
mod dispatch;
mod engine;
mod history;
mod registry;
mod run_actor;
mod scripted;
mod service;
mod submit;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use steppe_language::vars::{parse_var_flag, Vars};
use steppe_language::{load_file, machine, schema, LoadOptions};

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
    /// Run one job of a pipeline, on this machine.
    ///
    /// Each step that does work runs in a fresh directory holding only its declared
    /// inputs; declared outputs are kept (by content hash) only when the step succeeds.
    /// Steps print as they start and end; their output is streamed, prefixed by step.
    ///
    /// Exit status: 0 succeeded, 1 failed, 130 aborted (Ctrl-C), 2 anything else
    /// (errored steps, invalid pipeline).
    ///
    /// Examples:
    ///   steppe run ci.yml                 (the pipeline has one job)
    ///   steppe run ci.yml --job build --var branch=main
    #[command(verbatim_doc_comment)]
    Run {
        /// The pipeline file.
        pipeline: PathBuf,
        /// The job to run (required when the pipeline has more than one).
        #[arg(long)]
        job: Option<String>,
        #[command(flatten)]
        exec: ExecArgs,
        #[command(flatten)]
        vars: VarArgs,
    },
    /// Run every job once, in order, and check the pipeline's asserts.
    ///
    /// Prints PASS <job> or FAIL <job>: <error> per job, checks the pipeline-level
    /// assert.execution against the job names, then N/N passed.
    /// Exit status: 0 only when every job passed; 2 otherwise.
    #[command(verbatim_doc_comment)]
    Test {
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
    },
    /// Serve a scenario as an OpenAI-compatible model on loopback.
    ///
    /// Point an agent's source at it by hand (endpoint: http://ADDR/v1/) to run a
    /// pipeline against the scenario without `steppe test --script`.
    ///
    /// Example:
    ///   steppe scripted-model --script scenario.yaml --listen 127.0.0.1:8099
    #[command(name = "scripted-model", verbatim_doc_comment)]
    ScriptedModel {
        #[arg(long, value_name = "SCENARIO")]
        script: PathBuf,
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8099")]
        listen: std::net::SocketAddr,
    },
    /// Run steps for a coordinator: a worker in its own process.
    ///
    /// Connects to a coordinator (`steppe coordinator`, or `steppe run --listen
    /// ADDR`), takes assignments from its queue, runs each in a fresh directory
    /// of its declared inputs, and streams output lines and results back. When
    /// the coordinator goes away, what runs here stops (it runs again
    /// elsewhere) and the worker reconnects for up to --reconnect-for.
    /// SIGTERM drains (finishes what it runs, takes nothing new; a second
    /// SIGTERM stops at once); Ctrl-C stops at once. Stopping kills each
    /// running step's whole process group. Artifacts come from the coordinator's artifact
    /// directory when this host shares it (checked, not assumed), otherwise
    /// they travel through the coordinator in chunks.
    ///
    /// Example:
    ///   steppe worker --coordinator http://127.0.0.1:7070 --slots 4
    #[command(verbatim_doc_comment)]
    Worker(WorkerArgs),
    /// Serve runs for `steppe submit` and assignments for `steppe worker`s.
    ///
    /// A long-lived coordinator: pipelines are submitted to it (with every file
    /// they read), their steps go on its queue, and workers anywhere take them.
    /// With --token-file every call (submissions and worker sessions) must carry
    /// that token. History lives in DIR/steppe.db (or --store), artifacts in
    /// DIR/artifacts (or --artifacts): workers that see the directory use it,
    /// others get artifacts through the coordinator.
    ///
    /// Example:
    ///   steppe coordinator --listen 127.0.0.1:7070 --token-file token
    ///   steppe worker --coordinator http://127.0.0.1:7070 --token-file token
    ///   steppe submit ci.yml --job build --coordinator http://127.0.0.1:7070 --token-file token
    #[command(verbatim_doc_comment)]
    Coordinator {
        #[arg(long, value_name = "ADDR")]
        listen: std::net::SocketAddr,
        /// Worker slots inside the coordinator itself (default 0: only remote workers).
        #[arg(long, value_name = "N", default_value_t = 0)]
        workers: usize,
        /// Where the coordinator keeps history, artifacts and submissions.
        #[arg(long, value_name = "DIR", default_value = ".steppe-coordinator")]
        state: PathBuf,
        /// A file holding the token every client and worker must present.
        #[arg(long, value_name = "FILE", env = "STEPPE_TOKEN_FILE")]
        token_file: Option<PathBuf>,
        /// The queue assignments wait on: redis://HOST:PORT/ (Redis Streams,
        /// leased) instead of this process's memory. Keep a password out of
        /// the command line: --redis-password-file, or the URL in $STEPPE_QUEUE.
        #[arg(long, value_name = "URL", env = "STEPPE_QUEUE", hide_env_values = true)]
        queue: Option<String>,
        /// How long a queue entry stays with whoever took it unless renewed.
        /// The coordinator renews what it holds every third of this, so a
        /// step may run longer; a coordinator that dies stops renewing, and
        /// its entries go to the next coordinator after this long.
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_lease)]
        queue_lease: std::time::Duration,
        /// Where history lives: redis://HOST:PORT/ instead of DIR/steppe.db, so
        /// a restarted (or another) coordinator sees the same runs and versions.
        /// (Or the URL in $STEPPE_STORE.)
        #[arg(long, value_name = "URL", env = "STEPPE_STORE", hide_env_values = true)]
        store: Option<String>,
        /// A file holding the Redis password, for --queue and --store URLs
        /// that carry none (so it never shows in `ps`).
        #[arg(long, value_name = "FILE", env = "STEPPE_REDIS_PASSWORD_FILE")]
        redis_password_file: Option<PathBuf>,
        /// A worker silent this long (no heartbeat; they come every 5s) is
        /// fenced: its steps run elsewhere and its late results are refused.
        #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_lease)]
        worker_lease: std::time::Duration,
        /// The artifact directory workers share (default: DIR/artifacts);
        /// on several hosts, a shared mount every worker sees at this path.
        /// Workers that do not see it get artifacts through the coordinator.
        #[arg(long, value_name = "DIR")]
        artifacts: Option<PathBuf>,
        /// Serve TLS with this certificate chain (PEM); clients then use
        /// https:// URLs (and --tls-ca FILE for a private CA).
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    },
    /// Run a pipeline on a coordinator and follow it like `steppe run`.
    ///
    /// Loads the pipeline here first (so problems show before anything is sent),
    /// sends it with every file it reads (includes, run_file:, prompt files …)
    /// and nothing else of its directory unless you name it: --include GLOB, or
    /// a checked-in .steppe-include listing one glob per line (resource checks
    /// run in a copy of what was sent). Says how many files and bytes go, then
    /// prints the run's output as it happens. Exits like `steppe run` (or, with
    /// --test, like `steppe test`). The coordinator deletes the files when the
    /// run ends; its history stays.
    ///
    /// Examples:
    ///   steppe submit ci.yml --job build --coordinator http://10.0.0.5:7070 --token-file token
    ///   steppe submit ci.yml --include 'scripts/*.sh' --include fixtures --coordinator …
    #[command(verbatim_doc_comment)]
    Submit {
        pipeline: PathBuf,
        #[arg(long)]
        job: Option<String>,
        /// Run every job and check the asserts, like `steppe test`.
        #[arg(long)]
        test: bool,
        /// Print the run's id as soon as it begins and return; the run goes
        /// on (follow it with `steppe runs --coordinator URL --run ID`).
        #[arg(long, conflicts_with = "test")]
        detach: bool,
        #[arg(long, value_name = "URL")]
        coordinator: String,
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// With an https:// coordinator: the CA certificate (PEM) that signed its certificate.
        #[arg(long, value_name = "FILE")]
        tls_ca: Option<PathBuf>,
        /// Run the steps on the workers of this pool (`steppe worker --pool NAME`).
        #[arg(long, value_name = "NAME")]
        pool: Option<String>,
        /// Answer an ask_user question ahead (SUBSTRING=ANSWER; repeatable).
        #[arg(long = "answer", value_name = "SUBSTRING=ANSWER")]
        answer: Vec<String>,
        /// Also send these files (a glob relative to the pipeline's
        /// directory; a directory sends everything under it; repeatable).
        /// Lines of a checked-in .steppe-include beside the pipeline add more.
        #[arg(long, value_name = "GLOB")]
        include: Vec<String>,
        #[command(flatten)]
        vars: VarArgs,
    },
    /// Show recorded runs of a pipeline (read-only; never creates the store).
    ///
    /// Without flags: the newest runs, one per line. --steps: the steps of the
    /// newest run (or of --run ID). --logs: its output lines.
    ///
    /// Examples:
    ///   steppe runs ci.yml --job build --limit 5
    ///   steppe runs ci.yml --steps
    ///   steppe runs ci.yml --run r-18c2… --logs
    #[command(verbatim_doc_comment)]
    Runs {
        /// The pipeline file (its store is .steppe/<file>.db beside it);
        /// not needed with --coordinator.
        #[arg(required_unless_present = "coordinator")]
        pipeline: Option<PathBuf>,
        /// Only runs of this job.
        #[arg(long)]
        job: Option<String>,
        /// How many runs to list.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Show the steps of one run.
        #[arg(long)]
        steps: bool,
        /// The run to show (default: the newest).
        #[arg(long, value_name = "ID")]
        run: Option<String>,
        /// Show the run's output lines: each step's first and last lines,
        /// and how much was left out between them.
        #[arg(long)]
        logs: bool,
        /// With --logs (implied): each step's whole output, fetched from
        /// where it was stored (through the coordinator with --coordinator).
        #[arg(long)]
        full: bool,
        /// With --logs: only this step's lines.
        #[arg(long, value_name = "NAME")]
        step: Option<String>,
        /// Spend: tokens per run (or, with --run, per step). Unpriced is not $0.00.
        #[arg(long)]
        cost: bool,
        /// Show agent steps' transcripts (text, calls, results) with --steps.
        #[arg(long)]
        transcript: bool,
        /// Show the run's events (steps started and ended, notes) in order.
        #[arg(long)]
        events: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// List approvals waiting for a decision (ID JOB REQUESTED MESSAGE).
    Approvals {
        /// The pipeline file (not needed with --coordinator).
        #[arg(required_unless_present = "coordinator")]
        pipeline: Option<PathBuf>,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Approve a parked approval: the run continues.
    Approve(DecideArgs),
    /// Reject a parked approval: the approval step fails.
    Reject(DecideArgs),
    /// Abort a run going on at a coordinator (one started with --detach, say);
    /// its hooks run with their grace, as after Ctrl-C.
    ///
    /// Example:
    ///   steppe cancel r-1a22a36de6b-26745 --coordinator http://10.0.0.5:7070 --token-file token
    #[command(verbatim_doc_comment)]
    Cancel {
        /// The run's id (`steppe submit --detach` prints it; `steppe runs --coordinator URL` lists them).
        run: String,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Print the JSON Schema of the pipeline format.
    ///
    /// Generated from the same types the loader decodes into, so it cannot drift.
    /// Point your editor at it, e.g. with a first line in the pipeline:
    ///   # yaml-language-server: $schema=./steppe.schema.json
    #[command(verbatim_doc_comment)]
    Schema,
}

/// `approve` and `reject`.
#[derive(Args, Debug)]
struct DecideArgs {
    /// The pipeline file (left out with --coordinator), then the
    /// approval's id from `steppe approvals`.
    #[arg(value_name = "PIPELINE> <ID", num_args = 1..=2, required = true)]
    target: Vec<String>,
    /// Why (kept in the record; a rejection shows it in the failure).
    #[arg(long, default_value = "")]
    reason: String,
    #[command(flatten)]
    remote: RemoteArgs,
}

/// `--coordinator`: work through a coordinator instead of this machine.
#[derive(Args, Debug, Default)]
struct RemoteArgs {
    /// Work through this coordinator (e.g. http://10.0.0.5:7070): runs go to
    /// it (as `steppe submit`), history comes from it instead of the
    /// pipeline's .steppe/ store.
    #[arg(long, value_name = "URL")]
    coordinator: Option<String>,
    /// With --coordinator: a file holding the coordinator's token.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    token_file: Option<PathBuf>,
    /// With an https:// --coordinator: the CA certificate (PEM) that signed
    /// its certificate (default: the system's roots).
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    tls_ca: Option<PathBuf>,
}

impl RemoteArgs {
    /// The coordinator to work through, if --coordinator was given.
    fn remote(&self) -> Result<Option<submit::Remote>> {
        match &self.coordinator {
            Some(url) => Ok(Some(submit::Remote::new(url, self.token_file.as_deref(), self.tls_ca.as_deref())?)),
            None => Ok(None),
        }
    }
}

/// `steppe worker`'s flags.
#[derive(Args, Debug)]
struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, value_name = "URL")]
    coordinator: String,
    /// Assignments run at once (default: one per core).
    #[arg(long, value_name = "N")]
    slots: Option<u32>,
    /// A file holding the token the coordinator requires.
    #[arg(long, value_name = "FILE", env = "STEPPE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Fetch and store artifacts through the coordinator even when its
    /// artifact directory is visible here (a slow or unreliable mount).
    #[arg(long)]
    stream_artifacts: bool,
    /// With an https:// coordinator: the CA certificate (PEM) that signed
    /// its certificate (default: the system's roots).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Take assignments from the coordinator's Redis queue directly
    /// (redis://HOST:PORT/, the coordinator's --queue) instead of having
    /// them sent over the session; the queue's lease brings back what
    /// a lost worker took. (Or the URL in $STEPPE_QUEUE.)
    #[arg(long, value_name = "URL", env = "STEPPE_QUEUE", hide_env_values = true)]
    queue: Option<String>,
    /// A file holding the Redis password, for a --queue URL that carries none.
    #[arg(long, value_name = "FILE", env = "STEPPE_REDIS_PASSWORD_FILE")]
    redis_password_file: Option<PathBuf>,
    /// The pool this worker serves: it runs only the steps of runs
    /// submitted with the same --pool (default: the default pool).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pool: String,
    /// When the coordinator goes away (restarted, cut off), keep trying to
    /// reach it this long, with backoff, before exiting (0s: exit at once).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_wait)]
    reconnect_for: std::time::Duration,
}

#[derive(Args, Debug, Default)]
struct ExecArgs {
    /// Worker slots in this process: steps that may run at once (default: one
    /// per core). 0 runs nothing locally: steps wait for `steppe worker`s.
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Also serve remote workers on this address (gRPC), e.g. 127.0.0.1:7070.
    /// They share this machine's artifact directory.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Print only the summary, not each step.
    #[arg(long, short)]
    quiet: bool,
    /// Answer an agent's ask_user question ahead: every question containing
    /// SUBSTRING (case-insensitive) gets ANSWER. Repeatable.
    #[arg(long = "answer", value_name = "SUBSTRING=ANSWER")]
    answer: Vec<String>,
    #[command(flatten)]
    remote: RemoteArgs,
    /// With --coordinator: run the steps on the workers of this pool.
    #[arg(long, value_name = "NAME", requires = "coordinator")]
    pool: Option<String>,
    /// With --coordinator: also send these files (see `steppe submit --help`).
    #[arg(long, value_name = "GLOB", requires = "coordinator")]
    include: Vec<String>,
}

impl ExecArgs {
    /// `--coordinator`: hand the run to a coordinator and follow it.
    fn submit(&self, path: &Path, job: Option<&str>, test: bool, vars: &VarArgs) -> Result<Option<ExitCode>> {
        let Some(remote) = self.remote.remote()? else { return Ok(None) };
        let vars = vars.resolve()?.into_iter().collect();
        let o = submit::SubmitOptions { job: job.map(str::to_string), test, pool: self.pool.clone(), vars, answers: self.answer.clone(), include: self.include.clone(), ..Default::default() };
        let code = runtime()?.block_on(submit::submit(&remote, path, o))?;
        Ok(Some(ExitCode::from(u8::try_from(code).unwrap_or(2))))
    }
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
    let (node, problems) = steppe_language::yaml::parse(&text, 0)
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
            warn!("steppe: error: {}", steppe_runtime::secrets::mask_urls(&format!("{e:#}")));
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Validate { pipeline, syntax_only, vars } => validate(&pipeline, syntax_only, &vars),
        Command::Run { pipeline, job, exec, vars } => run_job(&pipeline, job.as_deref(), &exec, &vars),
        Command::Test { pipeline, script, dump_requests, exec, vars } => test(&pipeline, script.as_deref(), dump_requests.as_deref(), &exec, &vars),
        Command::ScriptedModel { script, listen } => scripted_model(&script, listen),
        Command::Runs { pipeline, job, limit, steps, run, logs, full, step, cost, transcript, events, remote } => {
            let h = History::open(pipeline.as_deref(), &remote)?;
            if events {
                runs_events(&h, job.as_deref(), run.as_deref())
            } else if cost {
                runs_cost(&h, job.as_deref(), limit, run.as_deref())
            } else {
                let logs = (logs || full || step.is_some()).then_some(LogsView { full, step });
                runs(&h, job.as_deref(), limit, steps || transcript, run.as_deref(), logs, transcript)
            }
        }
        Command::Approvals { pipeline, remote } => approvals(&History::open(pipeline.as_deref(), &remote)?),
        Command::Cancel { run, remote } => {
            let Some(remote) = remote.remote()? else {
                anyhow::bail!("steppe cancel stops a run at a coordinator: add --coordinator URL (an embedded run stops with Ctrl-C)");
            };
            let rt = runtime()?;
            let cancelled = rt.block_on(submit::cancel(&remote, &run))?;
            if cancelled {
                say!("cancelled {run}");
                Ok(ExitCode::SUCCESS)
            } else {
                warn!("steppe: error: no run {run} is going on at {}", remote.url);
                Ok(ExitCode::from(1))
            }
        }
        Command::Approve(args) => decide(&args, true),
        Command::Reject(args) => decide(&args, false),
        Command::Worker(args) => worker(args),
        Command::Coordinator { listen, workers, state, token_file, queue, queue_lease, store, redis_password_file, worker_lease, artifacts, tls_cert, tls_key } => {
            let tls = tls_cert.zip(tls_key);
            let (queue, store) = with_redis_password(queue, store, redis_password_file.as_deref())?;
            coordinator(listen, workers, &state, token_file.as_deref(), queue.as_deref().map(|q| (q, queue_lease)), store.as_deref(), worker_lease, artifacts.as_deref(), tls)
        }
        Command::Submit { pipeline, job, test, detach, coordinator, token_file, tls_ca, pool, answer, include, vars } => {
            let remote = submit::Remote::new(&coordinator, token_file.as_deref(), tls_ca.as_deref())?;
            let vars = vars.resolve()?.into_iter().collect();
            let rt = runtime()?;
            let o = submit::SubmitOptions { job, test, detach, pool, vars, answers: answer, include };
            let code = rt.block_on(submit::submit(&remote, &pipeline, o))?;
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(2)))
        }
        Command::Schema => {
            say!("{}", schema::pipeline_schema_json());
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn validate(path: &Path, syntax_only: bool, vars: &VarArgs) -> Result<ExitCode> {
    let opts = LoadOptions::from_env(vars.resolve()?);
    let loaded = match load_reporting(path, &opts) {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    if !syntax_only {
        let problems = machine::check(&loaded, opts.env_model.as_deref());
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

fn load_or_report(path: &Path, vars: &VarArgs) -> Result<Result<steppe_language::Loaded, ExitCode>> {
    Ok(load_reporting(path, &LoadOptions::from_env(vars.resolve()?)))
}

/// Loads the pipeline; on problems prints every one and gives the exit code (2).
/// Loads the pipeline; prints what it loaded but will not act on (warnings),
/// or every problem and gives the exit code (2).
pub(crate) fn load_reporting(path: &Path, opts: &LoadOptions) -> Result<steppe_language::Loaded, ExitCode> {
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

/// The process-wide parts every run shares: the artifact store, the queue and
/// Dispatcher, the EventHub (with the run store), the WorkerRegistry, local
/// worker loops, and (with a listener) the worker and submission services.
pub struct Services {
    pub store: Arc<dyn steppe_runtime::artifacts::ArtifactStore>,
    pub dispatcher: Arc<dispatch::Dispatcher>,
    pub out: Arc<engine::EventHub>,
    pub registry: registry::WorkerRegistry,
    pub cancel_tx: Arc<tokio::sync::watch::Sender<bool>>,
    pub cancel_rx: tokio::sync::watch::Receiver<bool>,
    /// Where submitted pipelines are unpacked.
    pub state: PathBuf,
    /// This process's scratch directory (step directories, temporaries);
    /// the command that made it removes it.
    pub scratch: PathBuf,
}

/// The Redis stream assignments wait on (workers started with --queue read it too).
const QUEUE_KEY: &str = "steppe:assignments";

/// How long a remote worker may stay silent before it is fenced (three heartbeats).
const DEFAULT_WORKER_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// What `steppe coordinator` sets beyond embedded mode.
struct ClusterOptions {
    /// Where assignments wait, a queue per worker pool (default: in process).
    pools: Option<steppe_runtime::queue::Pools>,
    worker_lease: std::time::Duration,
    /// The shared artifact directory (default: `<state>/artifacts`).
    artifacts: Option<PathBuf>,
    /// Serve TLS with this certificate and key.
    tls: Option<tonic::transport::Identity>,
    /// A `steppe coordinator` (workers wait for it to come back), not a
    /// run's own listener (workers exit when it goes).
    long_lived: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions { pools: None, worker_lease: DEFAULT_WORKER_LEASE, artifacts: None, tls: None, long_lived: false }
    }
}

/// Starts the shared parts; `state` holds artifacts (and submissions), `db` the run store.
async fn start_services(state: &Path, db: &Path, scratch: &Path, slots: usize, quiet: bool, listen: Option<std::net::SocketAddr>) -> Result<Arc<Services>> {
    let runs: Arc<dyn steppe_runtime::store::Store> = Arc::new(steppe_runtime::store::SqliteStore::open(db)?);
    start_services_with(state, runs, scratch, slots, quiet, listen, None, ClusterOptions::default()).await
}

/// As [`start_services`], on `queue` (the in-process queue when `None`).
#[allow(clippy::too_many_arguments)]
async fn start_services_with(
    state: &Path,
    runs: Arc<dyn steppe_runtime::store::Store>,
    scratch: &Path,
    slots: usize,
    quiet: bool,
    listen: Option<std::net::SocketAddr>,
    token: Option<String>,
    cluster: ClusterOptions,
) -> Result<Arc<Services>> {
    use steppe_runtime::artifacts::LocalArtifactStore;
    use steppe_runtime::queue::InProcessQueue;
    let ClusterOptions { pools, worker_lease, artifacts, tls, long_lived } = cluster;
    let artifact_dir = artifacts.unwrap_or_else(|| state.join("artifacts"));
    let local_store = LocalArtifactStore::new(&artifact_dir).with_context(|| format!("creating {}", artifact_dir.display()))?;
    let store: Arc<dyn steppe_runtime::artifacts::ArtifactStore> = Arc::new(local_store.clone());
    let artifact_dir = artifact_dir.canonicalize().unwrap_or(artifact_dir);
    let work = scratch.join("steps");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    if slots == 0 && listen.is_none() {
        anyhow::bail!("--workers 0 leaves nobody to run steps; add --listen ADDR and start `steppe worker`s");
    }
    let history_store = runs.clone();
    let out = Arc::new(engine::Output::start(quiet, Some(runs)).await.context("starting the event hub")?);
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let pools = Arc::new(pools.unwrap_or_else(|| steppe_runtime::queue::Pools::in_process(Arc::new(InProcessQueue::new()))));
    if let Some(lease) = pools.default_pool().lease() {
        // Lease extension: what this process took stays its own while it
        // lives, however long the step runs.
        let (pools, out) = (pools.clone(), out.clone());
        steppe_runtime::queue::keep_leases(
            lease,
            move || {
                let pools = pools.clone();
                Box::pin(async move { pools.all().await })
            },
            move |e| out.note(&format!("could not renew queue leases: {e}")),
        );
    }
    let dispatcher = dispatch::Dispatcher::start(pools, Some(out.clone())).await.context("starting the dispatcher")?;
    let registry = registry::WorkerRegistry::start(out.clone()).await.context("starting the worker registry")?;
    steppe_worker::local::spawn_local_workers(slots, dispatcher.pools.default_pool().clone(), store.clone(), work, out.clone(), dispatcher.clone(), dispatcher.local.clone());
    if slots > 0 {
        registry.joined("local", slots as u32, false, steppe_runtime::queue::DEFAULT_POOL);
    }
    let svc = Arc::new(Services { store, dispatcher, out, registry, cancel_tx: Arc::new(cancel_tx), cancel_rx, state: state.to_path_buf(), scratch: scratch.to_path_buf() });
    if let Some(addr) = listen {
        let listener = std::net::TcpListener::bind(addr).with_context(|| format!("--listen {addr}"))?;
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let bound = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        svc.out.note(&format!("serving workers on {bound}{}", if tls.is_some() { " (TLS)" } else { "" }));
        if slots == 0 {
            let (registry, out) = (svc.registry.clone(), svc.out.clone());
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                if registry.list().await.is_empty() {
                    out.note(&format!("no workers yet: start one with `steppe worker --coordinator {scheme}://{bound}`"));
                }
            });
        }
        let store_id = local_store.store_id().with_context(|| format!("marking {}", artifact_dir.display()))?;
        let pull_queue = svc.dispatcher.pools.default_pool().lease().map(|lease| (QUEUE_KEY.to_string(), lease));
        let workers = service::WorkerService {
            dispatcher: svc.dispatcher.clone(),
            sink: svc.out.clone(),
            artifact_dir,
            store_id,
            store: svc.store.clone(),
            registry: svc.registry.clone(),
            lease: worker_lease,
            pull_queue,
            ephemeral: !long_lived,
            scratch: svc.scratch.clone(),
        };
        let artifacts = artifacts::ArtifactService { store: local_store };
        let runs = submit::RunService { svc: svc.clone(), active: Default::default() };
        let history = history::HistoryService { store: history_store };
        let out = svc.out.clone();
        let auth = steppe_runtime::auth::TokenCheck::new(token, std::sync::Arc::new(move |peer: &str| out.note(&format!("refused an unauthenticated call from {peer}"))));
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut server = tonic::transport::Server::builder().tcp_nodelay(true);
        if let Some(identity) = tls {
            server = server.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)).context("--tls-cert/--tls-key")?;
        }
        tokio::spawn(async move {
            let r = server
                .add_service(steppe_proto::v1::coordinator_server::CoordinatorServer::with_interceptor(workers, auth.clone()))
                .add_service(steppe_proto::v1::runs_server::RunsServer::with_interceptor(runs, auth.clone()))
                .add_service(steppe_proto::v1::history_server::HistoryServer::with_interceptor(history, auth.clone()))
                .add_service(steppe_proto::v1::artifacts_server::ArtifactsServer::with_interceptor(artifacts, auth))
                .serve_with_incoming(incoming)
                .await;
            if let Err(e) = r {
                warn!("steppe: worker service stopped: {e}");
            }
        });
    }
    Ok(svc)
}

/// An engine for one loaded pipeline on the shared services (sharing their
/// Ctrl-C switch).
fn make_engine(svc: &Services, loaded: &steppe_language::Loaded, answers: Vec<(String, String)>, scripted: Option<(String, Option<String>)>) -> Arc<engine::Engine> {
    Arc::new(make_engine_with(svc, loaded, answers, scripted, svc.cancel_tx.clone(), svc.cancel_rx.clone()))
}

/// As [`make_engine`], with an abort switch of its own (a submission).
fn make_engine_with(
    svc: &Services,
    loaded: &steppe_language::Loaded,
    answers: Vec<(String, String)>,
    scripted: Option<(String, Option<String>)>,
    cancel_tx: Arc<tokio::sync::watch::Sender<bool>>,
    cancel_rx: tokio::sync::watch::Receiver<bool>,
) -> engine::Engine {
    let dir = if loaded.dir.as_os_str().is_empty() { PathBuf::from(".") } else { loaded.dir.clone() };
    engine::Engine {
        pipeline: Arc::new(loaded.pipeline.clone()),
        dir,
        decide_with: loaded.path.display().to_string(),
        pool: String::new(),
        store: svc.store.clone(),
        dispatcher: svc.dispatcher.clone(),
        out: svc.out.clone(),
        cancel: cancel_rx,
        cancel_tx,
        env_model: LoadOptions::from_env(Default::default()).env_model,
        scripted: scripted.as_ref().map(|(p, _)| p.clone()),
        scripted_fallback: scripted.and_then(|(_, f)| f),
        answers,
        submission: None,
        scratch: svc.scratch.clone(),
    }
}

fn parse_answers(answers: &[String]) -> Result<Vec<(String, String)>> {
    answers
        .iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(anyhow::anyhow!("--answer {a}: expected SUBSTRING=ANSWER")),
        })
        .collect()
}

/// Builds the engine of embedded mode: services under the pipeline's `.steppe/`.
async fn engine(loaded: &steppe_language::Loaded, exec: &ExecArgs, scratch: &Path, scripted: Option<(String, Option<String>)>) -> Result<Arc<engine::Engine>> {
    let svc = start_services(&loaded.dir.join(".steppe"), &steppe_runtime::store::db_path(&loaded.path), scratch, exec.workers.unwrap_or_else(cores), exec.quiet, exec.listen).await?;
    Ok(make_engine(&svc, loaded, parse_answers(&exec.answer)?, scripted))
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
}

/// Runs one job, turning Ctrl-C into an abort (hooks still get their grace).
async fn run_one(engine: &Arc<engine::Engine>, job: &steppe_language::model::Job) -> engine::JobResult {
    run_one_as(engine, job, run_id()).await
}

async fn run_one_as(engine: &Arc<engine::Engine>, job: &steppe_language::model::Job, id: String) -> engine::JobResult {
    let run = engine::JobRun::new(engine.clone(), job.clone(), id);
    let fut = run_actor::run_in_actor(run);
    tokio::pin!(fut);
    // Ctrl-C and SIGTERM abort alike: steps are killed (their process
    // groups whole), hooks get their grace.
    tokio::select! {
        r = &mut fut => r,
        _ = tokio::signal::ctrl_c() => {
            warn!("steppe: interrupted; stopping (hooks get their grace)");
            engine.abort();
            fut.await
        }
        _ = terminated() => {
            warn!("steppe: terminated; stopping (hooks get their grace)");
            engine.abort();
            fut.await
        }
    }
}

/// Resolves when this process gets SIGTERM.
async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut t) => {
            t.recv().await;
        }
        Err(_) => std::future::pending::<()>().await,
    }
}

/// This process's scratch directory, removed when the command returns (and
/// swept by the next steppe to start, if this one is killed).
fn scratch() -> Result<steppe_runtime::scratch::Scratch> {
    steppe_runtime::scratch::Scratch::create("work").context("creating a scratch directory under the system's temp dir")
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    // The plan walker recurses once per nested block (at most yaml::MAX_DEPTH
    // deep): room for that on every worker thread, not tokio's default 2 MiB.
    tokio::runtime::Builder::new_multi_thread().enable_all().thread_stack_size(32 << 20).build().context("starting the async runtime")
}

/// A run's id: its start time, this process, and a count, so two runs begun
/// in the same millisecond (two submissions at once) never share one.
fn run_id() -> String {
    static COUNT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
    let n = COUNT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("r-{t:x}-{}-{n}", std::process::id())
}

fn run_job(path: &Path, job: Option<&str>, exec: &ExecArgs, vars: &VarArgs) -> Result<ExitCode> {
    if let Some(code) = exec.submit(path, job, false, vars)? {
        return Ok(code);
    }
    let loaded = match load_or_report(path, vars)? {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let jobs = &loaded.pipeline.jobs;
    let job = match job {
        Some(name) => match jobs.iter().find(|j| j.name == name) {
            Some(j) => j.clone(),
            None => {
                let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
                anyhow::bail!(
                    "job \"{name}\" is not in {}; jobs: {}{}",
                    path.display(),
                    names.join(", "),
                    steppe_language::suggest::did_you_mean(name, names.iter().copied())
                );
            }
        },
        None if jobs.len() == 1 => jobs[0].clone(),
        None => {
            let names: Vec<&str> = jobs.iter().map(|j| j.name.as_str()).collect();
            anyhow::bail!("{} has {} jobs; pick one with --job ({})", path.display(), jobs.len(), names.join(", "));
        }
    };
    let scratch = scratch()?;
    let rt = runtime()?;
    let result = rt.block_on(async {
        let engine = engine(&loaded, exec, scratch.path(), None).await?;
        anyhow::Ok(run_one(&engine, &job).await)
    })?;
    let outcome = steppe_runtime::outcome::Outcome::of(&result.result);
    if !exec.quiet {
        say!("execution: [{}]", shown(&result.log.join(", ")));
    }
    match &result.result {
        Ok(()) => say!("job {} succeeded", shown(&job.name)),
        Err(e) => {
            say!("job {} {}: {}", shown(&job.name), outcome.word(), shown(&e.message));
        }
    }
    Ok(ExitCode::from(outcome.exit_code()))
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
        let result = rt.block_on(run_one(&engine, job));
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

fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    let d = steppe_language::duration::Duration::parse(text)?;
    d.to_std().ok_or_else(|| format!("{text}: not a duration to wait"))
}

#[allow(clippy::too_many_arguments)]
fn parse_lease(text: &str) -> Result<std::time::Duration, String> {
    let d = steppe_language::duration::Duration::parse(text)?;
    d.to_std().filter(|d| *d >= std::time::Duration::from_secs(1)).ok_or_else(|| format!("{text}: a lease is at least 1s"))
}

#[allow(clippy::too_many_arguments)]
fn coordinator(
    listen: std::net::SocketAddr,
    workers: usize,
    state: &Path,
    token_file: Option<&Path>,
    queue: Option<(&str, std::time::Duration)>,
    store: Option<&str>,
    worker_lease: std::time::Duration,
    artifacts: Option<&Path>,
    tls: Option<(PathBuf, PathBuf)>,
) -> Result<ExitCode> {
    let token = submit::read_token(token_file)?;
    let scratch = scratch()?;
    let rt = runtime()?;
    rt.block_on(async {
        std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
        // Submissions of a coordinator that died: their runs died with it.
        let _ = std::fs::remove_dir_all(state.join("submissions"));
        let pools = match queue {
            Some((url, lease)) if url.starts_with("redis://") || url.starts_with("rediss://") => {
                let name = format!("coordinator-{}", std::process::id());
                let default = Arc::new(steppe_runtime::queue::RedisQueue::connect(url, QUEUE_KEY, &name, lease).await?);
                Some(steppe_runtime::queue::Pools::redis(default, url, QUEUE_KEY, &name, lease))
            }
            Some((other, _)) => anyhow::bail!("--queue {other}: only redis:// queues are supported so far"),
            None => None,
        };
        let runs: Arc<dyn steppe_runtime::store::Store> = match store {
            // History written while Redis is away is kept and delivered when it is back.
            Some(url) if url.starts_with("redis://") || url.starts_with("rediss://") => Arc::new(steppe_runtime::store::Outbox::new(steppe_runtime::store::RedisStore::connect(url, "steppe")?)),
            Some(other) => anyhow::bail!("--store {other}: only redis:// stores are supported so far"),
            None => Arc::new(steppe_runtime::store::SqliteStore::open(&state.join("steppe.db"))?),
        };
        let tls = match tls {
            Some((cert, key)) => {
                let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
                Some(tonic::transport::Identity::from_pem(read(&cert)?, read(&key)?))
            }
            None => None,
        };
        let cluster = ClusterOptions { pools, worker_lease, artifacts: artifacts.map(Path::to_path_buf), tls, long_lived: true };
        let svc = start_services_with(state, runs, scratch.path(), workers, false, Some(listen), token, cluster).await?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminated() => {}
        }
        svc.out.note("steppe coordinator: stopping");
        svc.out.flush().await;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Puts the password of `--redis-password-file` into Redis URLs that carry none.
fn with_redis_password(queue: Option<String>, store: Option<String>, file: Option<&Path>) -> Result<(Option<String>, Option<String>)> {
    let Some(file) = file else { return Ok((queue, store)) };
    let password = steppe_runtime::secrets::read_file(file, "--redis-password-file").map_err(anyhow::Error::msg)?;
    let add = |u: Option<String>| u.map(|u| if u.starts_with("redis") { steppe_runtime::secrets::with_password(&u, &password) } else { u });
    Ok((add(queue), add(store)))
}

fn worker(args: WorkerArgs) -> Result<ExitCode> {
    let WorkerArgs { coordinator: url, slots, token_file, stream_artifacts, tls_ca, queue, redis_password_file, pool, reconnect_for } = args;
    let (queue, _) = with_redis_password(queue, None, redis_password_file.as_deref())?;
    steppe_runtime::queue::check_pool_name(&pool).map_err(|e| anyhow::anyhow!("--pool {e}"))?;
    if let Some(q) = queue.as_deref().filter(|q| !q.starts_with("redis://") && !q.starts_with("rediss://")) {
        anyhow::bail!("--queue {q}: a worker takes from a Redis queue (redis://HOST:PORT/)");
    }
    let token = submit::read_token(token_file.as_deref())?;
    let rt = runtime()?;
    let slots = slots.unwrap_or(cores() as u32);
    let name = format!("{}:{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into()), std::process::id());
    let scratch = steppe_runtime::scratch::Scratch::create("worker").context("creating a scratch directory under the system's temp dir")?;
    let work = scratch.path().to_path_buf();
    warn!("steppe worker {name}: connecting to {url} with {slots} slot(s)");
    let config = steppe_worker::remote::WorkerConfig { url, slots, name: name.clone(), work_root: work.clone(), token, stream_artifacts, tls_ca, queue, pool, reconnect_for };
    rt.block_on(steppe_worker::remote::run(config))?;
    warn!("steppe worker {name}: stopped");
    Ok(ExitCode::SUCCESS)
}

fn fmt_ms(ms: i64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms % 60_000) / 1000)
    }
}

fn fmt_time(ms: i64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z", rem / 3600, (rem % 3600) / 60, rem % 60)
}

/// Where `runs`, `approvals`, `approve` and `reject` look: the pipeline's
/// own store (None when nothing has run yet) or a coordinator's.
struct History {
    store: Option<Box<dyn steppe_runtime::store::Store>>,
    /// Names the history in messages: the pipeline file or the coordinator.
    label: String,
    /// Where its artifacts are: the pipeline's `.steppe/artifacts`, or the coordinator.
    artifacts: Artifacts,
}

enum Artifacts {
    Local(PathBuf),
    Remote(submit::Remote),
}

/// `runs --logs`: all of each step's output or only its record, one step or all.
struct LogsView {
    full: bool,
    step: Option<String>,
}

impl History {
    fn open(pipeline: Option<&Path>, remote: &RemoteArgs) -> Result<History> {
        if let Some(remote) = remote.remote()? {
            let store = history::RemoteStore::connect(&remote)?;
            return Ok(History { store: Some(Box::new(store)), label: format!("the coordinator at {}", remote.url), artifacts: Artifacts::Remote(remote) });
        }
        let path = pipeline.context("name the pipeline file (or --coordinator URL)")?;
        let store = steppe_runtime::store::SqliteStore::open_existing(&steppe_runtime::store::db_path(path))?;
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Ok(History {
            store: store.map(|s| Box::new(s) as Box<dyn steppe_runtime::store::Store>),
            label: path.display().to_string(),
            artifacts: Artifacts::Local(dir.join(".steppe").join("artifacts")),
        })
    }

    /// The lines of a step's whole output, stored as artifact `digest`.
    fn full_output(&self, digest: &str) -> Result<Vec<(bool, String)>> {
        let scratch = scratch()?;
        let dest = scratch.path().join("full");
        match &self.artifacts {
            Artifacts::Local(dir) => steppe_runtime::artifacts::ArtifactStore::materialize(&steppe_runtime::artifacts::LocalArtifactStore::new(dir)?, &steppe_runtime::artifacts::ArtifactRef { digest: digest.to_string() }, &dest)?,
            Artifacts::Remote(remote) => history::RemoteStore::connect(remote)?.fetch(digest, scratch.path(), &dest)?,
        }
        let text = std::fs::read_to_string(dest.join(steppe_worker::output::FULL_OUTPUT)).with_context(|| format!("reading the full output {digest}"))?;
        Ok(steppe_worker::output::parse_full(&text).map(|(e, l)| (e, l.to_string())).collect())
    }
}

/// Prints a run's logs: each step's record, or (`full`) its whole output in
/// place of head, gap and tail.
fn print_logs(h: &History, lines: &[steppe_runtime::store::LogLine], view: &LogsView) -> Result<()> {
    let lines: Vec<&steppe_runtime::store::LogLine> = lines.iter().filter(|l| view.step.as_deref().is_none_or(|s| s == l.step)).collect();
    let show = |step: &str, stderr: bool, line: &str| say!("[{}]{} {}", shown(step), if stderr { " (stderr)" } else { "" }, line);
    // With --full, a step's head, gap line and tail make way for its whole output.
    let mut replaced: std::collections::HashMap<usize, (usize, &str)> = Default::default();
    if view.full {
        for (i, l) in lines.iter().enumerate() {
            if let Some(o) = &l.omitted {
                let start = i.saturating_sub(o.head as usize);
                let end = (i + o.tail as usize).min(lines.len().saturating_sub(1));
                replaced.insert(start, (end, o.full.as_str()));
            }
        }
    }
    let mut i = 0;
    while i < lines.len() {
        if let Some((end, digest)) = replaced.get(&i) {
            let step = &lines[i].step;
            for (stderr, line) in h.full_output(digest)? {
                show(step, stderr, &line);
            }
            i = end + 1;
            continue;
        }
        show(&lines[i].step, lines[i].stderr, &lines[i].line);
        i += 1;
    }
    if let (Some(step), true) = (&view.step, lines.is_empty()) {
        say!("no output recorded for step {}", shown(step));
    }
    Ok(())
}

fn runs(h: &History, job: Option<&str>, limit: usize, steps: bool, run: Option<&str>, logs: Option<LogsView>, transcript: bool) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    if !steps && logs.is_none() && run.is_none() {
        let rows = store.runs(job, limit)?;
        if rows.is_empty() {
            say!("no runs recorded for {}", h.label);
            return Ok(ExitCode::SUCCESS);
        }
        say!("{:<26} {:<20} {:<21} {:>9}  OUTCOME", "RUN", "JOB", "STARTED", "DURATION");
        for r in rows {
            let dur = r.finished_ms.map(|f| fmt_ms(f - r.started_ms)).unwrap_or_else(|| "-".into());
            let outcome = r.outcome.clone().unwrap_or_else(|| "running".into());
            let msg = if r.message.is_empty() { String::new() } else { format!(": {}", r.message.lines().next().unwrap_or_default()) };
            say!("{:<26} {:<20} {:<21} {:>9}  {outcome}{}", r.id, shown(&r.job), fmt_time(r.started_ms), dur, shown(&msg));
        }
        return Ok(ExitCode::SUCCESS);
    }
    let record = match run {
        Some(id) => store.run(id)?.with_context(|| format!("no run {id} in the history of {}", h.label))?,
        None => store.runs(job, 1)?.into_iter().next().with_context(|| format!("no runs recorded for {}", h.label))?,
    };
    say!("run {} of job {} ({})", record.id, shown(&record.job), record.outcome.as_deref().unwrap_or("running"));
    if steps || logs.is_none() {
        say!("{:<40} {:<10} {:>9} {:>5} {:>9}", "STEP", "OUTCOME", "DURATION", "EXIT", "TOKENS");
        for s in store.steps(&record.id)? {
            let exit = s.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "-".into());
            let tokens = s.tokens.map(thousands).unwrap_or_else(|| "-".into());
            say!("{:<40} {:<10} {:>9} {:>5} {:>9}", shown(&s.name), s.outcome, fmt_ms(s.duration_ms), exit, tokens);
            let detail: serde_json::Value = s.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or_default();
            if let Some(v) = detail.get("verdict").and_then(|v| v.as_str()) {
                say!("    verdict: {}", shown(v));
            }
            if transcript {
                for e in detail.get("transcript").and_then(|t| t.as_array()).into_iter().flatten() {
                    let kind = e.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
                    let name = e.get("name").and_then(|v| v.as_str()).unwrap_or_default();
                    let content = e.get("content").and_then(|v| v.as_str()).unwrap_or_default();
                    let short: String = content.chars().take(300).collect();
                    say!("    {kind:<8} {} {}", shown(name), shown(&short));
                }
            }
            for d in detail.get("denials").and_then(|d| d.as_array()).into_iter().flatten() {
                let field = |k: &str| shown(d.get(k).and_then(|v| v.as_str()).unwrap_or_default()).into_owned();
                say!("    denied: {} {} — {}", field("tool"), field("path"), field("reason"));
            }
        }
    }
    if let Some(view) = &logs {
        print_logs(h, &store.logs(&record.id)?, view)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// A name or a model's words, with control characters shown, not obeyed.
pub(crate) fn shown(s: &str) -> std::borrow::Cow<'_, str> {
    steppe_runtime::printable::escape_controls(s)
}

fn approvals(h: &History) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no approvals pending for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let pending = store.pending_approvals()?;
    if pending.is_empty() {
        say!("no approvals pending for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    }
    say!("{:<4} {:<20} {:<21} MESSAGE", "ID", "JOB", "REQUESTED");
    for a in pending {
        say!("{:<4} {:<20} {:<21} {}", a.id, shown(&a.job), fmt_time(a.requested_ms), shown(&a.message));
    }
    Ok(ExitCode::SUCCESS)
}

/// `approve|reject [PIPELINE] ID`: the pipeline is needed unless --coordinator.
fn approval_target(target: &[String], remote: &RemoteArgs) -> Result<(Option<PathBuf>, i64)> {
    let (pipeline, id) = match target {
        [id] => (None, id),
        [pipeline, id] => (Some(PathBuf::from(pipeline)), id),
        _ => anyhow::bail!("give the pipeline file and the approval id, e.g. `steppe approve ci.yml 3`"),
    };
    if pipeline.is_none() && remote.coordinator.is_none() {
        anyhow::bail!("give the pipeline file before the id (`steppe approve ci.yml {id}`), or --coordinator URL");
    }
    let id = id.parse().with_context(|| format!("{id:?} is not an approval id: `steppe approvals` lists them"))?;
    Ok((pipeline, id))
}

fn decide(args: &DecideArgs, approve: bool) -> Result<ExitCode> {
    let (pipeline, id) = approval_target(&args.target, &args.remote)?;
    let h = History::open(pipeline.as_deref(), &args.remote)?;
    let reason = args.reason.as_str();
    let store = h.store.as_ref().with_context(|| format!("nothing has run yet for {}", h.label))?;
    let approver = ["STEPPE_APPROVER", "USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).unwrap_or_else(|| "unknown".into());
    let Some(rec) = store.approval(id)? else {
        anyhow::bail!("no approval {id} for {}", h.label);
    };
    if let Some(d) = &rec.decision {
        anyhow::bail!("approval {id} was already {d} by {}", rec.approver);
    }
    if !store.decide_approval(id, approve, reason, &approver)? {
        anyhow::bail!("approval {id} was decided by someone else just now");
    }
    say!("{} approval {id}", if approve { "approved" } else { "rejected" });
    Ok(ExitCode::SUCCESS)
}

fn scripted_model(script: &Path, listen: std::net::SocketAddr) -> Result<ExitCode> {
    let sc = scripted::load(script)?;
    let rt = runtime()?;
    rt.block_on(async {
        let m = scripted::serve(sc.model, listen).await?;
        say!("scripted model serving {} on {}", script.display(), m.base_url);
        tokio::signal::ctrl_c().await.ok();
        for p in m.failures() {
            warn!("unanswered: {p}");
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

fn thousands(n: i64) -> String {
    let s = n.abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

fn runs_cost(h: &History, job: Option<&str>, limit: usize, run: Option<&str>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    match run {
        None => {
            say!("{:<26} {:>12} {:>11} {:>6}", "RUN", "TOKENS", "COST", "STEPS");
            for r in store.runs(job, limit)? {
                let steps = store.steps(&r.id)?;
                let agent: Vec<_> = steps.iter().filter(|s| s.tokens.is_some()).collect();
                let tokens: i64 = agent.iter().filter_map(|s| s.tokens).sum();
                // Hosted providers report tokens, not dollars: no cost is recorded, which is not $0.00.
                say!("{:<26} {:>12} {:>11} {:>6}", r.id, thousands(tokens), "unpriced", agent.len());
            }
        }
        Some(id) => {
            say!("{:<40} {:>12} {:>9}", "STEP", "TOKENS", "DURATION");
            for s in store.steps(id)?.into_iter().filter(|s| s.tokens.is_some()) {
                say!("{:<40} {:>12} {:>9}", shown(&s.name), thousands(s.tokens.unwrap_or(0)), fmt_ms(s.duration_ms));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn runs_events(h: &History, job: Option<&str>, run: Option<&str>) -> Result<ExitCode> {
    let Some(store) = &h.store else {
        say!("no runs recorded for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    };
    let id = match run {
        Some(id) => id.to_string(),
        None => store.runs(job, 1)?.into_iter().next().map(|r| r.id).with_context(|| format!("no runs recorded for {}", h.label))?,
    };
    for (kind, step, message) in store.events(&id)? {
        say!("{kind:<8} {:<30} {}", shown(&step), shown(&message));
    }
    Ok(ExitCode::SUCCESS)
}
