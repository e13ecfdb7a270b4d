//! `steppe gate`: Stepgate's command. So far `--verify`, which checks the
//! hash chain of run ledgers; serving stepfiles is not built yet.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

/// Stepgate: gated stepfiles as MCP tools, and their runs' ledgers.
///
/// With --verify, each FILE is a run's ledger (`<stepfile>-<run>.jsonl`):
/// every record's `seq` must be its place, its `prev` the SHA-256 of the
/// canonical (RFC 8785) form of the record before it, and `run` and
/// `stepfile` the same throughout. Prints `FILE: intact, N records` or
/// `FILE: broken at seq K: REASON`; exits 1 when any is broken.
///
/// With --list, each FILE is a stepfile (YAML or JSON): loaded strictly
/// (an unknown key is an error with its position), its load-time rules
/// checked, listed with its identity (`sha256:` of its RFC 8785 form).
/// Problems print as `StepfileInvalid: FILE:LINE:COL: PATH: MESSAGE`, exit 2.
///
/// Serving stepfiles (`steppe gate STEPFILE…`) is not built yet.
///
/// Examples:
///   steppe gate --list shelf-audit.yaml
///   steppe gate --verify ledgers/shelf-audit-*.jsonl
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct GateArgs {
    /// The ledgers to check (with --verify).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Check ledgers rather than serve stepfiles.
    #[arg(long, conflicts_with = "list")]
    verify: bool,
    /// Load the stepfiles and list them (id, steps, identity, title).
    #[arg(long)]
    list: bool,
}

impl GateArgs {
    pub fn run(self) -> Result<ExitCode> {
        if !self.verify {
            // Every stepfile loads before anything is served.
            let mut loaded = Vec::new();
            let mut invalid = false;
            for f in &self.files {
                match steppe_gate::stepfile::load_file(f) {
                    Ok(l) => loaded.push(l),
                    Err(e) => {
                        invalid = true;
                        warn!("{e}");
                    }
                }
            }
            if invalid {
                return Ok(ExitCode::from(2));
            }
            if !self.list {
                anyhow::bail!("serving stepfiles as MCP tools is not built yet; `steppe gate --list STEPFILE…` checks them, `steppe gate --verify LEDGER…` checks run ledgers");
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
