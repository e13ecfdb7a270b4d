//! The files a pipeline names, read for the loader: confined, regular, bounded, cached.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::confine;

/// The most text the loader inlines from files (each use counts: a file
/// named by a thousand steps is inlined a thousand times).
const INLINED_CAP: u64 = 64 << 20;

/// Reads the files a pipeline names (includes and `*_file` fields): relative
/// to its directory, confined to `root` when there is one, regular files of
/// bounded size only, and within [`INLINED_CAP`] in all.
pub(super) struct FileReader {
    pub(super) dir: PathBuf,
    pub(super) root: Option<PathBuf>,
    pub(super) inlined: u64,
    /// Files read besides the pipeline, relative to `dir`, first read first.
    pub(super) reads: Vec<String>,
    pub(super) cache: HashMap<String, String>,
}

impl FileReader {
    /// The text of `rel`; `key` names the field in messages.
    pub(super) fn read(&mut self, rel: &str, key: &str) -> Result<String, String> {
        let text = match self.cache.get(rel) {
            Some(t) => t.clone(),
            None => {
                let t = confine::read_text(&self.dir, rel, self.root.as_deref(), "the submission", confine::FILE_CAP).map_err(|e| match e {
                    confine::PathError::Missing => format!("{key}: no such file relative to the pipeline directory: {rel}"),
                    confine::PathError::Escapes { .. } => format!(
                        "{key}: \"{rel}\" leads outside the submission: a submitted pipeline may only name files sent with it (steppe submit sends every file the pipeline reads)"
                    ),
                    confine::PathError::Absolute { .. } => format!(
                        "{key}: \"{rel}\" must be relative to the pipeline directory: absolute paths are refused, so a pipeline loads the same on every machine and coordinator"
                    ),
                    e => format!("{key}: \"{rel}\" {e}"),
                })?;
                if !self.reads.iter().any(|r| r == rel) {
                    self.reads.push(rel.to_string());
                }
                self.cache.insert(rel.to_string(), t.clone());
                t
            }
        };
        self.inlined = self.inlined.saturating_add(text.len() as u64);
        if self.inlined > INLINED_CAP {
            return Err(format!(
                "{key}: {rel}: the text read from files comes to over {} MiB in all (each use counts); inline less, or read large inputs in a step",
                INLINED_CAP >> 20
            ));
        }
        if text.trim().is_empty() {
            return Err(format!("{key}: {rel} is empty"));
        }
        Ok(text)
    }
}
