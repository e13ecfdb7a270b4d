//! `steppe web`: the dashboard over a pipeline's own store, on loopback.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

use super::runtime;

/// Open the dashboard of a pipeline's runs in a browser.
///
/// Serves the runs of the pipeline's own store (.steppe/<file>.db, as
/// `steppe runs` reads it): the runs list with filters, each run's plan as a
/// graph, its steps, logs, agent transcripts (tool calls, verdicts, sandbox
/// denials) and trace waterfall — live while a run goes — and the approvals
/// waiting, decided from the page. It listens on loopback only and answers
/// only requests addressed there. A cluster's dashboard is served by
/// `steppe coordinator --web ADDR`, with a sign-in by token.
///
/// Examples:
///   steppe web ci.yml                      then open http://127.0.0.1:7717/
///   steppe web ci.yml --listen 127.0.0.1:0   any free port (printed)
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct WebArgs {
    /// The pipeline file (its store is .steppe/<file>.db beside it).
    pipeline: PathBuf,
    /// Where to listen: a loopback address (port 0: any free one).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7717")]
    listen: std::net::SocketAddr,
}

impl WebArgs {
    pub fn run(self) -> Result<ExitCode> {
        if !self.listen.ip().is_loopback() {
            anyhow::bail!("--listen {}: `steppe web` serves one pipeline's store without sign-in, so it listens on loopback only (use `steppe coordinator --web` for a shared dashboard)", self.listen);
        }
        let db = steppe_runtime::store::db_path(&self.pipeline);
        let store = steppe_runtime::store::SqliteStore::open(&db).with_context(|| format!("opening the run store {}", db.display()))?;
        let rt = runtime()?;
        rt.block_on(async {
            let web = crate::web::Web::new(std::sync::Arc::new(store), None, None)?;
            let bound = crate::web::serve(self.listen, web).with_context(|| format!("--listen {}", self.listen))?;
            say!("dashboard of {} on http://{bound}/ (Ctrl-C to stop)", self.pipeline.display());
            tokio::signal::ctrl_c().await?;
            Ok::<_, anyhow::Error>(())
        })?;
        Ok(ExitCode::SUCCESS)
    }
}
