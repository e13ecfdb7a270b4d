//! A submitted pipeline's files on the coordinator. Its resource checks run
//! on workers, in a stored snapshot of them, never on the coordinator's own
//! host; the files and the snapshot go when the submission ends (when the
//! last run using them lets go of it).

use std::path::PathBuf;
use std::sync::Arc;

use steppe_runtime::artifacts::{ArtifactRef, ArtifactStore};

pub struct Submission {
    /// Where the bundle is unpacked.
    pub root: PathBuf,
    /// The pipeline's directory, relative to `root` (deeper when the
    /// pipeline reads files above its own directory).
    pub dir: String,
    snapshot: tokio::sync::OnceCell<ArtifactRef>,
    store: Arc<dyn ArtifactStore>,
}

impl Submission {
    pub fn new(root: PathBuf, dir: String, store: Arc<dyn ArtifactStore>) -> Self {
        Submission { root, dir, snapshot: tokio::sync::OnceCell::new(), store }
    }

    /// The submission's files as a stored tree (made on first use).
    pub async fn snapshot(&self) -> Result<ArtifactRef, String> {
        self.snapshot
            .get_or_try_init(|| async {
                let (store, root) = (self.store.clone(), self.root.clone());
                tokio::task::spawn_blocking(move || store.put_dir(&root)).await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
            })
            .await
            .cloned()
    }

}

/// The unpacked files and the snapshot go; history stays.
impl Drop for Submission {
    fn drop(&mut self) {
        if let Some(r) = self.snapshot.get() {
            let _ = self.store.remove(r);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
