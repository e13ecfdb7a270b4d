//! Paths a pipeline names: kept relative, confined to a root, and read only
//! from regular files of bounded size.
//!
//! The loader reads `*_file` fields and includes through here, and so do the
//! coordinator's own reads of artifacts (`load_var`, `across.from_file`, put
//! `{file:}` markers): on a shared coordinator a path a submitter wrote must
//! never reach the coordinator's own files, by `..`, by an absolute path or
//! through a symlink, and a FIFO or a device must never hang a read.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// How many directories a path may climb above the one it is relative to
/// (`steppe submit` bundles what they lead to, nested this deep at most).
pub const MAX_CLIMB: usize = 16;

/// The most the loader reads from one file.
pub const FILE_CAP: u64 = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum PathError {
    #[error("is empty")]
    Empty,
    #[error("holds a NUL byte")]
    Nul,
    #[error("is an absolute path; name it relative to {base}")]
    Absolute { base: &'static str },
    #[error("climbs {climb} directories up (at most {MAX_CLIMB})")]
    Climbs { climb: usize },
    #[error("leads outside {root}")]
    Escapes { root: &'static str },
    #[error("does not exist")]
    Missing,
    #[error("is {kind}, not a regular file")]
    NotRegular { kind: &'static str },
    #[error("is {} bytes, over the limit of {} bytes", .len, .cap)]
    TooLarge { len: u64, cap: u64 },
    #[error("cannot be read: {0}")]
    Io(std::io::Error),
}

/// How deep `rel` climbs above its starting directory, if it is a plain
/// relative path at all.
pub fn check_relative(rel: &str, base: &'static str) -> Result<usize, PathError> {
    if rel.is_empty() {
        return Err(PathError::Empty);
    }
    if rel.contains('\0') {
        return Err(PathError::Nul);
    }
    let mut level: isize = 0;
    let mut climb = 0usize;
    for c in Path::new(rel).components() {
        match c {
            Component::Normal(_) => level += 1,
            Component::ParentDir => level -= 1,
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(PathError::Absolute { base }),
        }
        climb = climb.max(usize::try_from(-level).unwrap_or(0));
    }
    if climb > MAX_CLIMB {
        return Err(PathError::Climbs { climb });
    }
    Ok(climb)
}

/// `path` with `.` and `..` resolved by text alone (symlinks are not looked at).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Resolves `rel` against `base`; with a `root`, the result must stay inside
/// it both by text and after following symlinks (`root_name` says what the
/// root is in messages: "the submission", "the artifact").
pub fn resolve(base: &Path, rel: &str, root: Option<&Path>, root_name: &'static str) -> Result<PathBuf, PathError> {
    check_relative(rel, if root.is_some() { root_name } else { "the pipeline's directory" })?;
    let full = base.join(rel);
    let Some(root) = root else { return Ok(full) };
    let (root_abs, full_abs) = (absolute(root), absolute(&full));
    if !normalize(&full_abs).starts_with(normalize(&root_abs)) {
        return Err(PathError::Escapes { root: root_name });
    }
    // A symlink inside the root may still point out of it.
    if let (Ok(real), Ok(real_root)) = (full.canonicalize(), root.canonicalize()) {
        if !real.starts_with(&real_root) {
            return Err(PathError::Escapes { root: root_name });
        }
    }
    Ok(full)
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}

/// What a file that is not a regular one is, for a message saying so.
pub fn file_kind(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symlink"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "a special file"
    }
}

/// Reads a regular file of at most `cap` bytes. A FIFO, socket or device is
/// refused without blocking on it.
pub fn read_capped(path: &Path, cap: u64) -> Result<Vec<u8>, PathError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => PathError::Missing,
        _ => PathError::Io(e),
    })?;
    let meta = file.metadata().map_err(PathError::Io)?;
    if !meta.file_type().is_file() {
        return Err(PathError::NotRegular { kind: file_kind(meta.file_type()) });
    }
    if meta.len() > cap {
        return Err(PathError::TooLarge { len: meta.len(), cap });
    }
    let mut buf = Vec::with_capacity(meta.len() as usize);
    file.take(cap + 1).read_to_end(&mut buf).map_err(PathError::Io)?;
    if buf.len() as u64 > cap {
        return Err(PathError::TooLarge { len: buf.len() as u64, cap });
    }
    Ok(buf)
}

/// [`resolve`] then [`read_capped`], as text.
pub fn read_text(base: &Path, rel: &str, root: Option<&Path>, root_name: &'static str, cap: u64) -> Result<String, PathError> {
    let full = resolve(base, rel, root, root_name)?;
    let bytes = read_capped(&full, cap)?;
    String::from_utf8(bytes).map_err(|_| PathError::Io(std::io::Error::new(std::io::ErrorKind::InvalidData, "it is not UTF-8 text")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steppe-confine-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn relative_paths_and_their_climb() {
        assert_eq!(check_relative("a/b.sh", "x").unwrap(), 0);
        assert_eq!(check_relative("../shared/b.sh", "x").unwrap(), 1);
        assert_eq!(check_relative("a/../../b", "x").unwrap(), 1);
        assert!(matches!(check_relative("/etc/passwd", "x"), Err(PathError::Absolute { .. })));
        assert!(matches!(check_relative("", "x"), Err(PathError::Empty)));
        assert!(matches!(check_relative("a\0b", "x"), Err(PathError::Nul)));
        let deep = "../".repeat(MAX_CLIMB + 1) + "etc/passwd";
        assert!(matches!(check_relative(&deep, "x"), Err(PathError::Climbs { .. })));
    }

    #[test]
    fn a_root_confines_by_text_and_by_symlink() {
        let d = tmp("root");
        let root = d.join("sub");
        std::fs::create_dir_all(root.join("p")).unwrap();
        std::fs::write(root.join("p/ok.sh"), "echo").unwrap();
        std::fs::write(d.join("outside"), "secret").unwrap();
        std::os::unix::fs::symlink(d.join("outside"), root.join("p/link")).unwrap();
        let base = root.join("p");
        assert!(resolve(&base, "ok.sh", Some(&root), "the submission").is_ok());
        assert!(matches!(resolve(&base, "../../outside", Some(&root), "the submission"), Err(PathError::Escapes { .. })));
        assert!(matches!(resolve(&base, "link", Some(&root), "the submission"), Err(PathError::Escapes { .. })));
        assert!(resolve(&base, "../../outside", None, "the submission").is_ok(), "no root: climbs are the user's own business");
    }

    #[test]
    fn only_regular_files_within_the_cap_are_read() {
        let d = tmp("read");
        std::fs::write(d.join("f"), "0123456789").unwrap();
        assert_eq!(read_capped(&d.join("f"), 10).unwrap(), b"0123456789");
        assert!(matches!(read_capped(&d.join("f"), 9), Err(PathError::TooLarge { len: 10, cap: 9 })));
        assert!(matches!(read_capped(&d, 10), Err(PathError::NotRegular { kind: "a directory" })));
        assert!(matches!(read_capped(&d.join("nope"), 10), Err(PathError::Missing)));
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_capped(&fifo, 10), Err(PathError::NotRegular { kind: "a FIFO" })), "a FIFO is refused without blocking");
        assert!(matches!(read_capped(Path::new("/dev/zero"), 10), Err(PathError::NotRegular { kind: "a device" })));
    }
}
