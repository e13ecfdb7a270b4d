//! Artifacts stored by content hash, so a worker anywhere can fetch the
//! inputs it needs by reference.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A stored directory tree, named by the SHA-256 of its contents.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArtifactRef {
    pub digest: String,
}

/// Where artifacts live. The local directory backend is the embedded one.
pub trait ArtifactStore: Send + Sync {
    /// Stores the tree under `dir` and returns its reference.
    fn put_dir(&self, dir: &Path) -> io::Result<ArtifactRef>;
    /// Copies a stored tree into `dest` (created if missing; it must not
    /// hold anything else) and checks the copy against its digest: a tree
    /// changed behind the store's back is an error, never silently used.
    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()>;
    /// Forgets a stored tree (a finished submission's files).
    fn remove(&self, r: &ArtifactRef) -> io::Result<()>;
}

/// Checks a materialized copy against the digest it was asked for.
pub fn verify(r: &ArtifactRef, dest: &Path) -> io::Result<()> {
    let got = digest_dir(dest)?;
    if got != r.digest {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("artifact {} does not match its digest (its stored copy was changed: got {got}); refusing to use it", r.digest),
        ));
    }
    Ok(())
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

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a stored tree lives. A reference comes from a peer, so it must
    /// be a digest and nothing else (no `..`, no `/`).
    pub fn path_of(&self, r: &ArtifactRef) -> io::Result<PathBuf> {
        if !is_digest(&r.digest) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{:?} is not an artifact digest (64 hex digits)", r.digest)));
        }
        Ok(self.root.join(&r.digest))
    }

    pub fn has(&self, r: &ArtifactRef) -> bool {
        self.path_of(r).is_ok_and(|p| p.is_dir())
    }

    /// The shared-directory handshake: the id written in this store's root
    /// (made on first use). A worker that reads the same id at the same path
    /// shares the directory; any other streams artifacts instead.
    pub fn store_id(&self) -> io::Result<String> {
        let marker = self.root.join(".steppe-store-id");
        if let Ok(id) = fs::read_to_string(&marker) {
            if !id.trim().is_empty() {
                return Ok(id.trim().to_string());
            }
        }
        let mut h = Sha256::new();
        h.update(format!("{}-{:?}-{:?}", std::process::id(), std::time::SystemTime::now(), self.root).as_bytes());
        let id = format!("{:x}", h.finalize())[..32].to_string();
        let tmp = self.root.join(format!(".steppe-store-id.{}", std::process::id()));
        fs::write(&tmp, &id)?;
        fs::rename(&tmp, &marker)?;
        Ok(id)
    }

    /// The id in the store's root, if there is one.
    pub fn read_store_id(root: &Path) -> Option<String> {
        fs::read_to_string(root.join(".steppe-store-id")).ok().map(|s| s.trim().to_string())
    }

    /// Stores a tree that arrived as a tar stream: unpacked aside, digested
    /// here (the sender's word is not taken), then stored.
    pub fn put_tar(&self, tar: &mut dyn io::Read) -> io::Result<ArtifactRef> {
        let tmp = self.root.join(format!(".in-{}-{:?}", std::process::id(), std::thread::current().id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)?;
        let r = unpack_tar(tar, &tmp).and_then(|()| self.put_dir(&tmp));
        let _ = fs::remove_dir_all(&tmp);
        r
    }
}

/// A SHA-256 in lowercase hex.
pub fn is_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Writes the tree under `dir` as a tar stream (modes and symlinks kept,
/// symlinks not followed).
pub fn pack_tar(dir: &Path, out: &mut dyn io::Write) -> io::Result<()> {
    let mut b = tar::Builder::new(out);
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    for (rel, _) in entries(dir)? {
        b.append_path_with_name(dir.join(&rel), &rel)?;
    }
    b.finish()
}

/// Unpacks a tar stream into `dest`. The tar crate refuses entries that
/// would land outside `dest` (absolute paths, `..`, writes through links).
pub fn unpack_tar(tar: &mut dyn io::Read, dest: &Path) -> io::Result<()> {
    let mut a = tar::Archive::new(tar);
    a.set_preserve_permissions(true);
    a.set_overwrite(true);
    a.unpack(dest)
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
            let ft = meta.file_type();
            if !(ft.is_dir() || ft.is_file() || ft.is_symlink()) {
                // Reading a FIFO would wait for a writer forever.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not a regular file, directory or symlink (a FIFO, socket or device); it cannot be stored", r.display()),
                ));
            }
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
            // A directory of this writer's own: two steps of one process
            // storing the same content at once must not share one.
            static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = self.root.join(format!(".tmp-{digest}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&tmp);
            copy_tree(dir, &tmp)?;
            if let Err(e) = fs::rename(&tmp, &dest) {
                let _ = fs::remove_dir_all(&tmp);
                // Another writer stored the same content first; anything else is an error.
                if !dest.is_dir() {
                    return Err(e);
                }
            }
        }
        Ok(ArtifactRef { digest })
    }

    fn materialize(&self, r: &ArtifactRef, dest: &Path) -> io::Result<()> {
        let src = self.path_of(r)?;
        if !src.is_dir() {
            return Err(io::Error::new(io::ErrorKind::NotFound, format!("artifact {} is not in the store", r.digest)));
        }
        copy_tree(&src, dest)?;
        verify(r, dest)
    }

    fn remove(&self, r: &ArtifactRef) -> io::Result<()> {
        let p = self.path_of(r)?;
        match fs::remove_dir_all(&p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_writers_of_the_same_content_at_once_all_get_it_stored() {
        let root = std::env::temp_dir().join(format!("steppe-artifacts-race-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let store = std::sync::Arc::new(LocalArtifactStore::new(&root).unwrap());
        let src = root.join("src");
        fs::create_dir_all(src.join("deep")).unwrap();
        for i in 0..50 {
            fs::write(src.join("deep").join(format!("f{i}")), "x".repeat(1000)).unwrap();
        }
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (store, src) = (store.clone(), src.clone());
                std::thread::spawn(move || store.put_dir(&src))
            })
            .collect();
        for h in handles {
            let r = h.join().unwrap().expect("stored");
            let dest = root.join("out").join(rand_name());
            store.materialize(&r, &dest).expect("whole and verified");
        }
    }

    fn rand_name() -> String {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        format!("m{}", N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }

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

    #[test]
    fn a_tree_travels_as_tar_and_keeps_its_digest() {
        let base = std::env::temp_dir().join(format!("steppe-art-tar-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let a = base.join("a");
        fs::create_dir_all(a.join("sub/empty")).unwrap();
        fs::write(a.join("sub/f.txt"), "hello").unwrap();
        fs::write(a.join("run.sh"), "#!/bin/sh").unwrap();
        fs::set_permissions(a.join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("sub/f.txt", a.join("link")).unwrap();
        let mut tar = Vec::new();
        pack_tar(&a, &mut tar).unwrap();
        let store = LocalArtifactStore::new(&base.join("store")).unwrap();
        let r = store.put_tar(&mut tar.as_slice()).unwrap();
        assert_eq!(r.digest, digest_dir(&a).unwrap(), "same tree, same digest on the far side");
        assert!(store.has(&r));
    }

    #[test]
    fn a_tree_changed_in_the_store_is_refused_and_special_files_are_not_stored() {
        let base = std::env::temp_dir().join(format!("steppe-art-tamper-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let a = base.join("a");
        fs::create_dir_all(&a).unwrap();
        fs::write(a.join("f.txt"), "hello").unwrap();
        let store = LocalArtifactStore::new(&base.join("store")).unwrap();
        let r = store.put_dir(&a).unwrap();
        fs::write(store.path_of(&r).unwrap().join("f.txt"), "tampered").unwrap();
        let err = store.materialize(&r, &base.join("out")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("does not match its digest"), "{err}");
        store.remove(&r).unwrap();
        assert!(!store.has(&r));
        let fifo = a.join("pipe");
        let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = store.put_dir(&a).unwrap_err();
        assert!(err.to_string().contains("pipe is not a regular file"), "{err}");
    }

    #[test]
    fn hostile_references_and_tar_entries_stay_inside() {
        let base = std::env::temp_dir().join(format!("steppe-art-hostile-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let store = LocalArtifactStore::new(&base.join("store")).unwrap();
        let err = store.materialize(&ArtifactRef { digest: "../../etc".into() }, &base.join("out")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        // A tar whose entry climbs out of the directory it is unpacked in.
        let mut tar = Vec::new();
        {
            let mut b = tar::Builder::new(&mut tar);
            let mut h = tar::Header::new_gnu();
            let body = b"escaped";
            h.set_size(body.len() as u64);
            h.set_mode(0o644);
            h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"../escaped.tx");
            h.set_cksum();
            b.append(&h, &body[..]).unwrap();
            b.finish().unwrap();
        }
        let _ = store.put_tar(&mut tar.as_slice());
        assert!(!base.join("store/escaped.tx").exists() && !base.join("escaped.tx").exists(), "nothing lands outside");
    }
}
