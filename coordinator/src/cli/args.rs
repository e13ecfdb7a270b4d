//! Flags several commands share: ((vars)), --coordinator, and how a run executes.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use steppe_language::vars::{parse_var_flag, Vars};

use crate::remote::Remote;

/// `--coordinator`: work through a coordinator instead of this machine.
#[derive(Args, Debug, Default)]
pub struct RemoteArgs {
    /// Work through this coordinator (e.g. http://10.0.0.5:7070): runs go to
    /// it (as `steppe submit`), history comes from it instead of the
    /// pipeline's .steppe/ store.
    #[arg(long, value_name = "URL")]
    pub coordinator: Option<String>,
    /// With --coordinator: a file holding the coordinator's token.
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    pub token_file: Option<PathBuf>,
    /// With an https:// --coordinator: the CA certificate (PEM) that signed
    /// its certificate (default: the system's roots).
    #[arg(long, value_name = "FILE", requires = "coordinator")]
    pub tls_ca: Option<PathBuf>,
}

impl RemoteArgs {
    /// The coordinator to work through, if --coordinator was given.
    pub fn remote(&self) -> Result<Option<Remote>> {
        match &self.coordinator {
            Some(url) => Ok(Some(Remote::new(url, self.token_file.as_deref(), self.tls_ca.as_deref())?)),
            None => Ok(None),
        }
    }
}

#[derive(Args, Debug, Default)]
pub struct ExecArgs {
    /// Worker slots in this process: steps that may run at once (default: one
    /// per core). 0 runs nothing locally: steps wait for `steppe worker`s.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// Also serve remote workers on this address (gRPC), e.g. 127.0.0.1:7070.
    /// They share this machine's artifact directory.
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Print only the summary, not each step.
    #[arg(long, short)]
    pub quiet: bool,
    /// Do not probe the models a job uses before its first step (as
    /// `defaults.preflight.disabled: true` does).
    #[arg(long)]
    pub no_preflight: bool,
    /// Answer an agent's ask_user question ahead: every question containing
    /// SUBSTRING (case-insensitive) gets ANSWER. Repeatable.
    #[arg(long = "answer", value_name = "SUBSTRING=ANSWER")]
    pub answer: Vec<String>,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// With --coordinator: run the steps on the workers of this pool.
    #[arg(long, value_name = "NAME", requires = "coordinator")]
    pub pool: Option<String>,
    /// With --coordinator: also send these files (see `steppe submit --help`).
    #[arg(long, value_name = "GLOB", requires = "coordinator")]
    pub include: Vec<String>,
    /// The name its history goes under (default: the file's stem, `ci` for
    /// ci.yml): runs, approvals, versions and `passed:` records of one
    /// pipeline are never another's.
    #[arg(long = "pipeline", value_name = "NAME")]
    pub pipeline_name: Option<String>,
}

impl ExecArgs {
    /// The runtime's threads for an embedded run: one per local worker slot
    /// at most (a one-step run needs one), every core when remote workers
    /// may join (`--listen`).
    pub fn runtime_threads(&self) -> Option<usize> {
        match (self.listen, self.workers) {
            (None, Some(n)) => Some(n.clamp(1, super::cores())),
            _ => None,
        }
    }
}

/// The step cache: `--force` and `--pin`.
#[derive(Args, Debug, Default, Clone)]
pub struct CacheArgs {
    /// Run every step, even of a chain a run already succeeded through (the
    /// success is still recorded).
    #[arg(long)]
    pub force: bool,
    /// Every get takes the oldest version whose field NAME is VALUE (all
    /// pins must match; repeatable). Beats a step's `version:`.
    #[arg(long = "pin", value_name = "NAME=VALUE")]
    pub pin: Vec<String>,
    /// Versions kept per resource, the oldest dropped first (default 1000;
    /// 0 keeps all; `defaults.version_history` wins).
    #[arg(long, value_name = "N")]
    pub version_history: Option<u64>,
    /// Runs kept per job, the oldest removed first (default 100; 0 keeps
    /// all; `defaults.run_history` wins).
    #[arg(long, value_name = "N")]
    pub run_history: Option<u64>,
    /// Keep the run's workspace for --resume and --replay: steppe always
    /// does (every step's outputs stay in the artifact store, by content),
    /// so this is accepted for the reference runner's pipelines and changes
    /// nothing.
    #[arg(long)]
    pub keep_workspace: bool,
}

impl CacheArgs {
    /// The pins as (field, value) pairs.
    pub fn pins(&self) -> Result<Vec<(String, String)>> {
        parse_pins(&self.pin)
    }
}

/// `--resume RUN` or `--replay RUN --from STEP`: a run that continues another.
#[derive(Args, Debug, Default, Clone)]
pub struct StartArgs {
    /// Continue a run that failed, errored or was aborted: the job it ran,
    /// from the step after the last one it finished, with the artifacts and
    /// values it had (a new run; the steps it finished print as skipped).
    #[arg(long, value_name = "RUN", conflicts_with = "replay")]
    pub resume: Option<String>,
    /// Start a new run at a step of an earlier run (with --from), from the
    /// artifacts and values that run had before that step. The earlier run
    /// must have finished every step before it.
    #[arg(long, value_name = "RUN", requires = "from")]
    pub replay: Option<String>,
    /// With --replay: the top-level step to start at.
    #[arg(long, value_name = "STEP", requires = "replay")]
    pub from: Option<String>,
}

impl StartArgs {
    pub fn start(&self) -> Option<crate::engine::checkpoint::StartFrom> {
        use crate::engine::checkpoint::StartFrom;
        match (&self.resume, &self.replay, &self.from) {
            (Some(r), _, _) => Some(StartFrom::Resume(r.clone())),
            (None, Some(run), Some(from)) => Some(StartFrom::Replay { run: run.clone(), from: from.clone() }),
            _ => None,
        }
    }
}

/// `NAME=VALUE` pins, each checked.
pub fn parse_pins(pins: &[String]) -> Result<Vec<(String, String)>> {
    pins.iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
            _ => anyhow::bail!("--pin {p}: write it as NAME=VALUE, a field of the version (e.g. --pin ref=abc123)"),
        })
        .collect()
}

#[derive(Args, Debug, Default)]
pub struct VarArgs {
    /// Set a ((var)): NAME=VALUE (repeatable; wins over --vars-file).
    #[arg(long = "var", value_name = "NAME=VALUE")]
    pub var: Vec<String>,
    /// A YAML file of NAME: VALUE pairs for ((vars)).
    #[arg(long = "vars-file", value_name = "FILE")]
    pub vars_file: Option<PathBuf>,
}

impl VarArgs {
    pub fn resolve(&self) -> Result<Vars> {
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

pub fn parse_wait(text: &str) -> Result<std::time::Duration, String> {
    let d = steppe_language::duration::Duration::parse(text)?;
    d.to_std().ok_or_else(|| format!("{text}: not a duration to wait"))
}

pub fn parse_lease(text: &str) -> Result<std::time::Duration, String> {
    let d = steppe_language::duration::Duration::parse(text)?;
    d.to_std().filter(|d| *d >= std::time::Duration::from_secs(1)).ok_or_else(|| format!("{text}: a lease is at least 1s"))
}
