//! A `stepgate:` MCP server: the granted stepfiles served by this binary's
//! `steppe gate` over stdio, from a directory of its own outside the step's
//! (so the agent can neither edit its procedure nor its ledger); the ledgers
//! handed to the step's record when the step ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use steppe_runtime::agent_work::McpServerWork;

/// Ledgers a step's gates kept: (server/file, the JSON lines).
pub type Ledgers = Arc<Mutex<Vec<(String, String)>>>;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A gate's own directory: its stepfiles and, under `ledger/`, its ledgers.
pub struct GateDir {
    pub server: String,
    pub dir: PathBuf,
    /// The stepfiles written into it.
    files: Vec<PathBuf>,
}

impl GateDir {
    /// Writes `spec`'s stepfiles into a fresh directory.
    pub fn make(spec: &McpServerWork) -> std::io::Result<GateDir> {
        let dir = std::env::temp_dir().join(format!("steppe-gate-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ledger"))?;
        let mut files = Vec::new();
        for (name, text) in &spec.stepfiles {
            let file = dir.join(Path::new(name).file_name().unwrap_or_default());
            std::fs::write(&file, text)?;
            files.push(file);
        }
        Ok(GateDir { server: spec.name.clone(), dir, files })
    }

    /// The command that serves it: this binary's `steppe gate`, run ids
    /// numbered from 1 so a step's transcript reads alike run to run, and
    /// no authoring tools (an agent must not fetch URLs or run drafts by them).
    pub fn command(&self) -> std::io::Result<Vec<String>> {
        let exe = std::env::current_exe()?;
        let mut cmd = vec![exe.display().to_string(), "gate".to_string()];
        cmd.extend(self.files.iter().map(|f| f.display().to_string()));
        cmd.extend(["--ledger-dir".to_string(), self.dir.join("ledger").display().to_string(), "--sequential-runs".to_string(), "--no-authoring".to_string()]);
        Ok(cmd)
    }

    /// Its ledgers, each `(server/file, lines)`.
    pub fn ledgers(&self) -> Vec<(String, String)> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.join("ledger")).into_iter().flatten().flatten().map(|e| e.path()).collect();
        files.sort();
        files
            .into_iter()
            .filter_map(|f| {
                let text = std::fs::read_to_string(&f).ok()?;
                Some((format!("{}/{}", self.server, f.file_name()?.to_string_lossy()), text))
            })
            .collect()
    }
}

impl Drop for GateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
