//! Source files, positions inside them, and the diagnostics that point at them.

use std::fmt;
use std::path::{Path, PathBuf};

/// Index of a file in [`SourceFiles`]: the pipeline itself is 0, includes follow.
pub type FileId = u16;

/// A position in one of the loaded files. Lines and columns are 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mark {
    pub file: FileId,
    pub line: u32,
    pub col: u32,
}

/// The files a load read, so a [`Mark`] can be shown as `path:line:col`.
#[derive(Debug, Clone, Default)]
pub struct SourceFiles {
    paths: Vec<PathBuf>,
}

impl SourceFiles {
    pub fn add(&mut self, path: &Path) -> FileId {
        if let Some(i) = self.paths.iter().position(|p| p == path) {
            return i as FileId;
        }
        self.paths.push(path.to_path_buf());
        (self.paths.len() - 1) as FileId
    }

    pub fn path(&self, id: FileId) -> &Path {
        self.paths
            .get(id as usize)
            .map(PathBuf::as_path)
            .unwrap_or_else(|| Path::new("<unknown>"))
    }
}

/// One problem found while loading: where it is, which key, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: u32,
    pub col: u32,
    /// Key path such as `jobs[0].plan[2].across[0].values`; empty for the whole document.
    pub path: String,
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        if self.path.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": {}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one load, in the order they were found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn iter(&self) -> impl Iterator<Item = &Diagnostic> {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}
