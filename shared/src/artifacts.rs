//! Artifacts stored by content hash, so a worker anywhere can fetch the
//! inputs it needs by reference.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A stored directory tree, named by the SHA-256 of its contents.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct ArtifactRef {
    pub digest: String,
}

/// Where artifacts live. The local directory backend is the embedded one.
pub trait ArtifactStore: Send + Sync {
    /// Stores the tree under `dir` and returns its reference.
    fn put_dir(&self, dir: &Path) -> io::Result<ArtifactRef>;
    /// Copies a stored tree into `dest` (created if missing).
    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()>;
}

/// Content-addressed trees under one directory: `<root>/<digest>/…`.
#[derive(Debug, Clone)]
pub struct LocalArtifactStore {
    root: PathBuf,
}

impl LocalArtifactStore {
    pub fn new(root: &Path) -> io::Result<Self> {
        fs::create_dir_all(root)?;
        Ok(LocalArtifactStore { root: root.to_path_buf() })
    }
}

/// Every entry of a tree, sorted, as (relative path, metadata).
fn entries(dir: &Path) -> io::Result<Vec<(PathBuf, fs::Metadata)>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut children: Vec<_> = fs::read_dir(dir.join(&rel))?.collect::<Result<_, _>>()?;
        children.sort_by_key(|e| e.file_name());
        for c in children {
            let r = rel.join(c.file_name());
            let meta = fs::symlink_metadata(c.path())?;
            if meta.is_dir() {
                stack.push(r.clone());
            }
            out.push((r, meta));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The digest of a tree: paths, kinds, the executable bit, bytes, link targets.
pub fn digest_dir(dir: &Path) -> io::Result<String> {
    let mut h = Sha256::new();
    for (rel, meta) in entries(dir)? {
        h.update(rel.to_string_lossy().as_bytes());
        h.update([0]);
        let full = dir.join(&rel);
        if meta.file_type().is_symlink() {
            h.update(b"l");
            h.update(fs::read_link(&full)?.to_string_lossy().as_bytes());
        } else if meta.is_dir() {
            h.update(b"d");
        } else {
            h.update(if meta.mode() & 0o111 != 0 { b"x" } else { b"f" });
            h.update(fs::read(&full)?);
        }
        h.update([0]);
    }
    Ok(format!("{:x}", h.finalize()))
}

/// Copies a tree, keeping modes and symlinks.
pub fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    fs::create_dir_all(to)?;
    for (rel, meta) in entries(from)? {
        let (src, dst) = (from.join(&rel), to.join(&rel));
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(fs::read_link(&src)?, &dst)?;
        } else if meta.is_dir() {
            fs::create_dir_all(&dst)?;
        } else {
            fs::copy(&src, &dst)?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        }
    }
    Ok(())
}

impl ArtifactStore for LocalArtifactStore {
    fn put_dir(&self, dir: &Path) -> io::Result<ArtifactRef> {
        let digest = digest_dir(dir)?;
        let dest = self.root.join(&digest);
        if !dest.exists() {
            let tmp = self.root.join(format!(".tmp-{digest}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            copy_tree(dir, &tmp)?;
            if fs::rename(&tmp, &dest).is_err() {
                // Another writer stored the same content first.
                let _ = fs::remove_dir_all(&tmp);
            }
        }
        Ok(ArtifactRef { digest })
    }

    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()> {
        let src = self.root.join(&r.digest);
        if !src.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("artifact {} is not in the store", r.digest)));
        }
        copy_tree(&src, dest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_content_same_digest_and_round_trip() {
        let base = std::env::temp_dir().join(format!("steppe-art-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let a = base.join("a");
        fs::create_dir_all(a.join("sub")).unwrap();
        fs::write(a.join("sub/f.txt"), "hello").unwrap();
        fs::write(a.join("run.sh"), "#!/bin/sh").unwrap();
        fs::set_permissions(a.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        let store = LocalArtifactStore::new(&base.join("store")).unwrap();
        let r1 = store.put_dir(&a).unwrap();
        let r2 = store.put_dir(&a).unwrap();
        assert_eq!(r1, r2);
        let out = base.join("out");
        store.materialize(&r1, &out).unwrap();
        assert_eq!(fs::read_to_string(out.join("sub/f.txt")).unwrap(), "hello");
        assert_ne!(fs::metadata(out.join("run.sh")).unwrap().mode() & 0o111, 0);
        fs::write(a.join("sub/f.txt"), "changed").unwrap();
        assert_ne!(store.put_dir(&a).unwrap(), r1);
    }
}
