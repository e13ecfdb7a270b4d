//! Where the history commands (`runs`, `approvals`, `approve`, `reject`,
//! `runs --follow`) look: a pipeline's own store or a coordinator's.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::args::RemoteArgs;
use super::scratch;
use crate::history;
use crate::remote::Remote;

/// Where `runs`, `approvals`, `approve` and `reject` look: the pipeline's
/// own store (None when nothing has run yet) or a coordinator's.
pub(super) struct History {
    pub(super) store: Option<Box<dyn steppe_runtime::store::Store>>,
    /// The pipeline whose history to show (None: every one the store holds for us).
    pub(super) pipeline: Option<String>,
    /// Names the history in messages: the pipeline file or the coordinator.
    pub(super) label: String,
    /// The pipeline file's store, to open once it exists.
    db: Option<PathBuf>,
    /// Where its artifacts are: the pipeline's `.steppe/artifacts`, or the coordinator.
    artifacts: Artifacts,
}

enum Artifacts {
    Local(PathBuf),
    Remote(Remote),
}

impl History {
    /// The history of pipeline `name` (or, with a file, the file's own
    /// pipeline by default) in the file's store or a coordinator's.
    pub(super) fn open(file: Option<&Path>, name: Option<&str>, remote: &RemoteArgs) -> Result<History> {
        if let Some(n) = name {
            steppe_runtime::store::check_name("--pipeline", n).map_err(anyhow::Error::msg)?;
        }
        if let Some(remote) = remote.remote()? {
            let store = history::RemoteStore::connect(&remote)?;
            let label = match name {
                Some(n) => format!("pipeline {n} at the coordinator {}", remote.url),
                None => format!("the coordinator at {}", remote.url),
            };
            return Ok(History { store: Some(Box::new(store)), pipeline: name.map(str::to_string), label, db: None, artifacts: Artifacts::Remote(remote) });
        }
        let path = file.context("name the pipeline file (or --coordinator URL)")?;
        let db = steppe_runtime::store::db_path(path);
        let store = steppe_runtime::store::SqliteStore::open_existing(&db)?;
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let pipeline = crate::services::pipeline_name(name, path)?;
        Ok(History {
            store: store.map(|s| Box::new(s) as Box<dyn steppe_runtime::store::Store>),
            label: if name.is_some() { format!("pipeline {pipeline} of {}", path.display()) } else { path.display().to_string() },
            pipeline: Some(pipeline),
            db: Some(db),
            artifacts: Artifacts::Local(dir.join(".steppe").join("artifacts")),
        })
    }

    /// Opens the pipeline's store if it has come to exist since.
    pub(super) fn reopen(&mut self) -> Result<()> {
        if let (None, Some(db)) = (&self.store, &self.db) {
            self.store = steppe_runtime::store::SqliteStore::open_existing(db)?.map(|s| Box::new(s) as Box<dyn steppe_runtime::store::Store>);
        }
        Ok(())
    }

    /// Run `run`, or the newest (of `job`) when none is named.
    pub(super) fn run_or_newest(&self, store: &dyn steppe_runtime::store::Store, job: Option<&str>, run: Option<&str>) -> Result<steppe_runtime::store::RunRecord> {
        match run {
            Some(id) => store.run(id)?.with_context(|| format!("no run {id} in the history of {}", self.label)),
            None => self.runs(store, job, 1)?.into_iter().next().with_context(|| format!("no runs recorded for {}", self.label)),
        }
    }

    /// Runs of this history's pipeline (and `job`), newest first.
    pub(super) fn runs(&self, store: &dyn steppe_runtime::store::Store, job: Option<&str>, limit: usize) -> Result<Vec<steppe_runtime::store::RunRecord>> {
        Ok(store.runs(&steppe_runtime::store::RunFilter { team: None, pipeline: self.pipeline.as_deref(), job, limit, skip: 0 })?)
    }

    /// The lines of a step's whole output, stored as artifact `digest`.
    pub(super) fn full_output(&self, digest: &str) -> Result<Vec<(bool, String)>> {
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

