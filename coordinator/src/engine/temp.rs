//! Temporary directories of a run (under the process's scratch) and small files stored as artifacts.


use steppe_runtime::artifacts::ArtifactRef;

use super::run::*;
use std::path::PathBuf;

impl JobRun {
    /// A temporary directory under the engine's scratch, gone when dropped.
    pub(super) fn temp(&self, what: &str) -> TempDir {
        TempDir(self.engine.scratch.join(format!("{what}-{}", rand_suffix())))
    }

    /// Stores a directory of small files (name → contents) as an artifact.
    pub(super) fn store_files(&self, files: &[(String, String)]) -> std::io::Result<ArtifactRef> {
        let dir = self.temp("files");
        std::fs::create_dir_all(&dir.0)?;
        for (n, t) in files {
            std::fs::write(dir.0.join(n), t)?;
        }
        self.engine.store.put_dir(&dir.0)
    }
}

/// A temporary directory, removed when dropped (on every error path too).
pub(crate) struct TempDir(pub(crate) PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(super) fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}
