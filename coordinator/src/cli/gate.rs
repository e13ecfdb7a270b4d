//! `steppe gate`: Stepgate's command — stepfiles served as MCP tools over
//! stdio or loopback HTTP, `--list` to check them, `--verify` for ledgers.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

/// Stepgate: gated stepfiles as MCP tools, and their runs' ledgers.
///
/// `steppe gate STEPFILE…` serves each stepfile as an MCP tool over stdio
/// (or over streamable HTTP on 127.0.0.1 with --http PORT). Calling a
/// stepfile's tool starts a run and shows its first step; the client calls
/// the step's operations with `stepgate_call` and hands in the step's output
/// with `stepgate_submit`, which the step's gates check. Mechanical steps
/// (`do:`) run without the client. Requests go only to the hosts the
/// stepfile's tools declare (every redirect hop checked); a credential comes
/// from `<NAME>_API_KEY` and goes only to its own hosts. Every event is in
/// the run's ledger (`<stepfile>-<run>.jsonl` in --ledger-dir, else stderr).
///
/// With --verify, each FILE is a run's ledger (`<stepfile>-<run>.jsonl`):
/// every record's `seq` must be its place, its `prev` the SHA-256 of the
/// canonical (RFC 8785) form of the record before it, and `run` and
/// `stepfile` the same throughout. Prints `FILE: intact, N records` or
/// `FILE: broken at seq K: REASON`; exits 1 when any is broken.
///
/// With --test, the stepfile's recorded cases (from --record-cases, or
/// written by hand) are replayed offline: each step's recorded output is
/// judged again by its produces, derive, let and gates (verifier and approval
/// gates named and skipped), mechanical steps recomputed from their recorded
/// calls; the failing gates must be the ones recorded. Prints
/// `ok  CASE / STEP` or `FAIL  CASE / STEP` with the reasons; exits 1 on any
/// mismatch, 2 when the cases or the stepfile do not load.
///
/// With --list, each FILE is a stepfile (YAML or JSON): loaded strictly
/// (an unknown key is an error with its position), its load-time rules
/// checked, listed with its identity (`sha256:` of its RFC 8785 form).
/// Problems print as `StepfileInvalid: FILE:LINE:COL: PATH: MESSAGE`, exit 2.
///
/// Examples:
///   steppe gate shelf-audit.yaml --ledger-dir ledgers      # MCP over stdio
///   steppe gate shelf-audit.yaml --http 8765               # http://127.0.0.1:8765/mcp
///   steppe gate --list shelf-audit.yaml
///   steppe gate shelf-audit.yaml --record-cases cases/     # keep each run's attempts
///   steppe gate --test shelf-audit.yaml cases/shelf-audit-*.cases.yaml
///   steppe gate --verify ledgers/shelf-audit-*.jsonl
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct GateArgs {
    /// Stepfiles to serve or list (.yaml, .yml, .json), or ledgers to check
    /// (with --verify). None serves the authoring tools only.
    #[arg(value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Check ledgers rather than serve stepfiles.
    #[arg(long, conflicts_with = "list")]
    verify: bool,
    /// Load the stepfiles and list them (id, steps, identity, title).
    #[arg(long, conflicts_with = "test")]
    list: bool,
    /// Replay a stepfile's recorded cases offline: `--test STEPFILE [CASES]`
    /// (default CASES: `<id>.cases.yaml` beside it). A name that is not a
    /// path is looked up in --catalog.
    #[arg(long, conflicts_with = "verify")]
    test: bool,
    /// Where `--test NAME` finds `<domain>/<NAME>/<NAME>.stepfile.yaml`.
    #[arg(long, value_name = "DIR", default_value = "stepfiles")]
    catalog: PathBuf,
    /// Serve streamable HTTP on 127.0.0.1:PORT at /mcp instead of stdio (0 picks a port).
    #[arg(long, value_name = "PORT")]
    http: Option<u16>,
    /// Write each run's ledger to DIR/<stepfile>-<run>.jsonl (default: stderr).
    #[arg(long, value_name = "DIR")]
    ledger_dir: Option<PathBuf>,
    /// Write each run's attempts to DIR/<stepfile>-<run>.cases.yaml.
    #[arg(long, value_name = "DIR")]
    record_cases: Option<PathBuf>,
    /// Calls a step may make, over all its attempts (refused ones count).
    #[arg(long, default_value_t = 100, value_name = "N")]
    calls_per_step: u32,
    /// Characters of a result the client is shown (the rest cut, with a note).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    tool_result_chars: usize,
    /// A run nobody drives for this long is abandoned.
    #[arg(long, default_value_t = 1_800_000, value_name = "MS")]
    run_idle_ms: u64,
    /// Each outgoing request's deadline, body included.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    request_timeout_ms: u64,
    /// The most of a response that is read.
    #[arg(long, default_value_t = 10_485_760, value_name = "BYTES")]
    response_bytes: usize,
    /// An email address for the User-Agent of every request.
    #[arg(long, value_name = "EMAIL")]
    contact: Option<String>,
    /// Let stepgate_try drafts use credential NAME, sent only to these
    /// hosts (repeatable): `--draft-credential github=api.github.com`.
    #[arg(long, value_name = "NAME=HOST[,HOST]")]
    draft_credential: Vec<String>,
    /// Let stepgate_try drafts use setting NAME (repeatable).
    #[arg(long, value_name = "NAME")]
    draft_setting: Vec<String>,
    /// Serve no authoring tools (a gate hosted for a pipeline's agent, which
    /// must not reach public URLs or run drafts through it).
    #[arg(long, hide = true)]
    no_authoring: bool,
    /// Number runs 1, 2, … instead of random UUIDs (a gate hosted for one
    /// pipeline step, whose transcript then reads alike run to run).
    #[arg(long, hide = true)]
    sequential_runs: bool,
}

impl GateArgs {
    fn draft_credentials(&self) -> Result<Vec<(String, Vec<String>)>> {
        self.draft_credential
            .iter()
            .map(|g| match g.split_once('=') {
                Some((name, hosts)) if !name.is_empty() && !hosts.is_empty() => Ok((name.to_string(), hosts.split(',').map(|h| h.trim().to_lowercase()).collect())),
                _ => anyhow::bail!("--draft-credential takes NAME=HOST[,HOST], not {g:?}"),
            })
            .collect()
    }

    fn serve(&self, loaded: Vec<steppe_gate::stepfile::Loaded>) -> Result<ExitCode> {
        let opts = steppe_gate::run::Options {
            calls_per_step: self.calls_per_step,
            tool_result_chars: self.tool_result_chars,
            run_idle: Duration::from_millis(self.run_idle_ms),
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            response_bytes: self.response_bytes,
            ledger_dir: self.ledger_dir.clone(),
            contact: self.contact.clone(),
            record_cases: self.record_cases.clone(),
            offline: false,
            sequential_runs: self.sequential_runs,
            draft: steppe_gate::authoring::Grants { credentials: self.draft_credentials()?, settings: self.draft_setting.clone() },
            catalog: self.catalog.clone(),
            authoring: !self.no_authoring,
        };
        steppe_cloud::install_crypto();
        if let Some(dir) = &self.record_cases {
            std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
            warn!("steppe gate: recording cases in {}; each file holds the APIs' full responses, so trim them before sharing", dir.display());
        }
        let gate = steppe_gate::server::Gate::new(loaded, opts);
        let rt = tokio::runtime::Runtime::new()?;
        let served = rt.block_on(async {
            match self.http {
                Some(port) => steppe_gate::http::serve_http(gate, port, |addr| warn!("steppe gate: serving MCP at http://{addr}/mcp")).await,
                None => steppe_gate::server::serve_stdio(gate).await,
            }
        });
        served.map_err(|e| anyhow::anyhow!(e))?;
        Ok(ExitCode::SUCCESS)
    }

    fn test(&self) -> Result<ExitCode> {
        use steppe_gate::casetest;
        let (Some(target), extra) = (self.files.first(), self.files.get(1)) else {
            anyhow::bail!("--test needs a stepfile path or catalog name: steppe gate --test STEPFILE [CASES]");
        };
        let failed = |e: steppe_gate::error::GateError| {
            warn!("{e}");
            Ok(ExitCode::from(2))
        };
        let path = match casetest::resolve(&target.to_string_lossy(), &self.catalog) {
            Ok(p) => p,
            Err(e) => return failed(e),
        };
        let loaded = match steppe_gate::load::load_file(&path) {
            Ok(l) => l,
            Err(e) => {
                warn!("{e}");
                return Ok(ExitCode::from(2));
            }
        };
        let cases_path = extra.cloned().unwrap_or_else(|| casetest::default_cases(&path, &loaded.stepfile.id));
        let reports = match casetest::load(&cases_path, &loaded).and_then(|cases| casetest::run(&loaded, &cases)) {
            Ok(r) => r,
            Err(e) => return failed(e),
        };
        for r in &reports {
            for line in r.lines() {
                say!("{line}");
            }
        }
        Ok(if reports.iter().all(|r| r.ok) { ExitCode::SUCCESS } else { ExitCode::from(1) })
    }

    pub fn run(self) -> Result<ExitCode> {
        if self.test {
            return self.test();
        }
        if self.verify && self.files.is_empty() {
            anyhow::bail!("--verify needs the ledgers to check: steppe gate --verify LEDGER…");
        }
        if !self.verify {
            // Every stepfile loads before anything is served.
            let mut loaded = Vec::new();
            let mut invalid = false;
            for f in &self.files {
                match steppe_gate::load::load_file(f) {
                    Ok(l) => loaded.push(l),
                    Err(e) => {
                        invalid = true;
                        warn!("{e}");
                    }
                }
            }
            let mut ids: Vec<&str> = loaded.iter().map(|l: &steppe_gate::stepfile::Loaded| l.stepfile.id.as_str()).collect();
            ids.sort_unstable();
            if let (false, Some(w)) = (self.list, ids.windows(2).find(|w| w[0] == w[1])) {
                warn!("StepfileInvalid: two stepfiles have the id {}: each is served as a tool of that name, so ids are unique", w[0]);
                invalid = true;
            }
            if invalid {
                return Ok(ExitCode::from(2));
            }
            if !self.list {
                return self.serve(loaded);
            }
            for l in &loaded {
                let s = &l.stepfile;
                say!("{:<32} {:>3} step(s)  {}  {}", s.id, s.steps.len(), l.identity, s.title.as_deref().unwrap_or(""));
            }
            return Ok(ExitCode::SUCCESS);
        }
        let mut broken = false;
        for f in &self.files {
            match steppe_gate::ledger::verify(f) {
                Ok(v) => {
                    broken |= matches!(v, steppe_gate::ledger::Verdict::Broken { .. });
                    say!("{}", v.line(f));
                }
                Err(e) => {
                    broken = true;
                    say!("{e}");
                }
            }
        }
        Ok(if broken { ExitCode::from(1) } else { ExitCode::SUCCESS })
    }
}
