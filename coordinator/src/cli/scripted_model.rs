//! `steppe scripted-model`: a scenario served as an OpenAI-compatible model.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use super::runtime;
use crate::scripted;

/// Serve a scenario as an OpenAI-compatible model on loopback.
///
/// Point an agent's source at it by hand (endpoint: http://ADDR/v1/) to run a
/// pipeline against the scenario without `steppe test --script`.
///
/// Example:
///   steppe scripted-model --script scenario.yaml --listen 127.0.0.1:8099
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct ScriptedModelArgs {
    /// The scenario file (docs/scripted-model.md): the answers, in turns or rules.
    #[arg(long, value_name = "SCENARIO")]
    script: PathBuf,
    /// Where to listen; agents reach it at http://ADDR/v1/.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8099")]
    listen: std::net::SocketAddr,
}

impl ScriptedModelArgs {
    pub fn run(self) -> Result<ExitCode> {
        scripted_model(&self.script, self.listen)
    }
}

fn scripted_model(script: &Path, listen: std::net::SocketAddr) -> Result<ExitCode> {
    let sc = scripted::load(script)?;
    let rt = runtime()?;
    rt.block_on(async {
        let m = scripted::serve(sc.model, listen, false).await?;
        say!("scripted model serving {} on {}", script.display(), m.base_url);
        tokio::signal::ctrl_c().await.ok();
        for p in m.failures() {
            warn!("unanswered: {p}");
        }
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
