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
/// Serving stepfiles (`steppe gate STEPFILE…`) is not built yet.
///
/// Examples:
///   steppe gate --verify ledgers/shelf-audit-*.jsonl
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct GateArgs {
    /// The ledgers to check (with --verify).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Check ledgers rather than serve stepfiles.
    #[arg(long)]
    verify: bool,
}

impl GateArgs {
    pub fn run(self) -> Result<ExitCode> {
        if !self.verify {
            anyhow::bail!("serving stepfiles as MCP tools is not built yet; `steppe gate --verify LEDGER…` checks run ledgers");
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
