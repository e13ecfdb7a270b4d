//! `--script SCENARIO` on run and test: the scripted model answering a run's
//! agents, served here or (with --coordinator) by the coordinator.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use steppe_language::vars::Vars;

use crate::scripted::{self, Scenario, ScriptedModel};

#[derive(Args, Debug, Default)]
pub struct ScriptArgs {
    /// Answer every agent's model requests from this scenario (the scripted
    /// model): no API key, deterministic. A request the scenario cannot answer
    /// fails the run even when every job passed. With --coordinator the
    /// coordinator serves it to its workers for this run only.
    #[arg(long, value_name = "SCENARIO")]
    pub script: Option<PathBuf>,
    /// With --script: write every request the scripted model received here, as JSON lines.
    #[arg(long, value_name = "FILE", requires = "script")]
    pub dump_requests: Option<PathBuf>,
}

/// A scenario loaded, its files written and its vars added.
pub struct Prepared {
    pub scenario: Scenario,
    /// Its text, as sent to a coordinator.
    pub text: String,
    /// The files it wrote, relative to the pipeline's directory: sent with a
    /// submission whether the pipeline names them or not.
    pub files: Vec<String>,
    pub dump: Option<PathBuf>,
}

impl ScriptArgs {
    /// Loads the scenario, writes its `files` into the pipeline's directory
    /// and adds its `vars` to `vars` (flags win).
    pub fn prepare(&self, pipeline: &Path, vars: &mut Vars) -> Result<Option<Prepared>> {
        let Some(path) = &self.script else { return Ok(None) };
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read scenario {}", path.display()))?;
        let scenario = scripted::parse(&text, path)?;
        let dir = pipeline.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        for (rel, content) in &scenario.files {
            if Path::new(rel).is_absolute() || rel.split('/').any(|s| s == "..") {
                anyhow::bail!("{}: files: {rel:?} must be a path inside the pipeline's directory", path.display());
            }
            let full = dir.join(rel);
            if let Some(parent) = full.parent() {
                std::fs::create_dir_all(parent).with_context(|| format!("scenario files: {}", parent.display()))?;
            }
            std::fs::write(&full, content).with_context(|| format!("scenario files: {}", full.display()))?;
        }
        for (k, v) in &scenario.vars {
            vars.entry(k.clone()).or_insert_with(|| v.clone());
        }
        // Sent as include patterns: escaped, so a name is only itself.
        let files = scenario.files.keys().map(|f| globset::escape(f)).collect();
        Ok(Some(Prepared { scenario, text, files, dump: self.dump_requests.clone() }))
    }
}

/// The scripted model (and fallback) serving a run in this process.
pub struct Serving {
    model: ScriptedModel,
    fallback: Option<ScriptedModel>,
    dump: Option<PathBuf>,
}

impl Prepared {
    pub async fn serve(&self) -> Result<Serving> {
        let at: std::net::SocketAddr = "127.0.0.1:0".parse()?;
        let keep = self.dump.is_some();
        let model = scripted::serve(self.scenario.model.clone(), at, keep).await?;
        let fallback = match self.scenario.fallback.clone() {
            Some(f) => Some(scripted::serve(Some(f), at, keep).await?),
            None => None,
        };
        Ok(Serving { model, fallback, dump: self.dump.clone() })
    }
}

impl Serving {
    /// The model's and the fallback's URLs, for the engine.
    pub fn targets(&self) -> (String, Option<String>) {
        (self.model.base_url.clone(), self.fallback.as_ref().map(|f| f.base_url.clone()))
    }

    /// Writes the requests it received (with --dump-requests) and says what
    /// it could not answer; false when there was something.
    pub fn finish(&self) -> Result<bool> {
        let models = || std::iter::once(&self.model).chain(self.fallback.as_ref());
        if let Some(f) = &self.dump {
            write_requests(f, models().flat_map(|m| m.requests()).map(|r| r.to_string()))?;
        }
        let mut problems = self.model.failures();
        problems.extend(self.fallback.iter().flat_map(|f| f.failures()).map(|p| format!("fallback {p}")));
        for p in &problems {
            say!("FAIL scenario: {p}");
        }
        if !problems.is_empty() {
            warn!("steppe: error: the scenario could not answer {} request(s)", problems.len());
        }
        Ok(problems.is_empty())
    }
}

/// `--dump-requests FILE`: one JSON request per line.
pub fn write_requests(file: &Path, requests: impl Iterator<Item = String>) -> Result<()> {
    let text: String = requests.map(|r| r + "\n").collect();
    std::fs::write(file, text).with_context(|| format!("--dump-requests {}", file.display()))
}
