//! Opening a path the policy resolved from its root down, one component at a
//! time, following no symlink: what the check judged is what is opened, or
//! nothing. A directory swapped for a symlink between the check and the open
//! (by a shell in the step's container, say) is refused, not followed out.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{mkdirat, Mode};

/// How a tool opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    Read,
    /// Written over from the start; made (with missing directories) when absent.
    Write,
    /// Written at the end; made (with missing directories) when absent.
    Append,
}

const DIR: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// `root` opened, which must still be the directory of identity `made` (its
/// device and inode when the policy was made).
pub(super) fn open_root(root: &Path, made: (u64, u64)) -> io::Result<OwnedFd> {
    let replaced = || io::Error::new(io::ErrorKind::PermissionDenied, format!("{} was replaced since the step began", root.display()));
    let now = match nix::fcntl::open(root, DIR, Mode::empty()) {
        Ok(fd) => File::from(fd),
        Err(Errno::ELOOP | Errno::ENOTDIR) => return Err(replaced()),
        Err(e) => return Err(e.into()),
    };
    if super::identity(&now.metadata()?) != made {
        return Err(replaced());
    }
    Ok(now.into())
}

/// The directory `rel` below `start` (`start` itself when `rel` is empty);
/// with `create`, missing directories are made on the way.
pub(super) fn descend(start: OwnedFd, rel: &Path, create: bool) -> io::Result<OwnedFd> {
    let mut at = start;
    for c in rel.components() {
        let Component::Normal(name) = c else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} is not a plain path below its root", rel.display())));
        };
        at = match openat(&at, name, DIR, Mode::empty()) {
            Err(Errno::ENOENT) if create => {
                match mkdirat(&at, name, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(e.into()),
                }
                openat(&at, name, DIR, Mode::empty()).map_err(|e| changed(e, &at, name))?
            }
            r => r.map_err(|e| changed(e, &at, name))?,
        };
    }
    Ok(at)
}

/// The regular file `rel` below `start`, opened as [`open_in`] opens it.
pub(super) fn open_below(start: OwnedFd, rel: &Path, how: Open) -> io::Result<File> {
    let Some(name) = rel.file_name() else { return Err(super::not_a_file(&File::from(start).metadata()?)) };
    let dir = descend(start, rel.parent().unwrap_or(Path::new("")), how != Open::Read)?;
    open_in(&dir, name, how)
}

/// One name in a directory: what it is (never followed), and its size when
/// asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: OsString,
    pub is_dir: bool,
    pub is_file: bool,
    pub size: u64,
}

/// The names in `dir` (not `.` and `..`), each looked at without following
/// it: by the directory's own record of its type, or a `lstat` where that
/// is unknown or `sizes` are wanted.
pub fn list(dir: &OwnedFd, sizes: bool) -> io::Result<Vec<Entry>> {
    use nix::dir::Type;
    use std::os::unix::ffi::OsStrExt;
    // A description of its own (a dup would share, and use up, `dir`'s offset).
    let here = openat(dir, ".", DIR, Mode::empty())?;
    let mut out = Vec::new();
    for e in nix::dir::Dir::from_fd(here)? {
        let e = e?;
        let name = OsStr::from_bytes(e.file_name().to_bytes());
        if name == "." || name == ".." {
            continue;
        }
        let (is_dir, is_file, size) = match e.file_type() {
            Some(t) if !sizes => (t == Type::Directory, t == Type::File, 0),
            _ => match nix::sys::stat::fstatat(dir, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => {
                    let kind = st.st_mode & libc::S_IFMT;
                    (kind == libc::S_IFDIR, kind == libc::S_IFREG, u64::try_from(st.st_size).unwrap_or(0))
                }
                Err(_) => continue,
            },
        };
        out.push(Entry { name: name.to_os_string(), is_dir, is_file, size });
    }
    Ok(out)
}

/// The directory `name` in `dir`, not followed if it is a symlink.
pub fn subdir(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    openat(dir, name, DIR, Mode::empty()).map_err(|e| changed(e, dir, name))
}

/// The regular file `name` in `dir`, opened as `how` says. What is there is
/// looked at first by an open that opens nothing (`O_PATH`, not following a
/// symlink): anything but a regular file (a FIFO, a device, a socket, a
/// directory, a symlink) is refused, and a regular file is then reopened
/// through that look (`/proc/self/fd`), so a node renamed over the name in
/// between is never opened. A file that is not there is made, for writing,
/// only if it is still not there (`O_EXCL`).
pub fn open_in(dir: &OwnedFd, name: &OsStr, how: Open) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    let base = OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let flags = match how {
        Open::Read => OFlag::O_RDONLY,
        Open::Write => OFlag::O_WRONLY | OFlag::O_TRUNC,
        Open::Append => OFlag::O_WRONLY | OFlag::O_APPEND,
    } | base;
    for _ in 0..3 {
        let looked = match look(dir, name) {
            Ok(l) => l,
            Err(e) if e.kind() == io::ErrorKind::NotFound && how != Open::Read => {
                let made = openat(dir, name, flags | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW, Mode::from_bits_truncate(0o666));
                match made {
                    Ok(fd) => return Ok(File::from(fd)),
                    Err(Errno::EEXIST) => continue,
                    Err(e) => return Err(changed(e, dir, name)),
                }
            }
            Err(e) => return Err(e),
        };
        let m = looked.metadata()?;
        if !m.file_type().is_file() {
            return Err(super::not_a_file(&m));
        }
        return match nix::fcntl::open(format!("/proc/self/fd/{}", looked.as_raw_fd()).as_str(), flags, Mode::empty()) {
            // The very inode looked at, a regular file.
            Ok(fd) => Ok(File::from(fd)),
            // No /proc here: by name, refusing a symlink, and judged again.
            Err(Errno::ENOENT) => {
                let f = File::from(openat(dir, name, flags | OFlag::O_NOFOLLOW, Mode::empty()).map_err(|e| changed(e, dir, name))?);
                let m = f.metadata()?;
                if !m.file_type().is_file() {
                    return Err(super::not_a_file(&m));
                }
                Ok(f)
            }
            Err(e) => Err(e.into()),
        };
    }
    Err(io::Error::new(io::ErrorKind::WouldBlock, format!("\"{}\" kept appearing and disappearing while it was being made; try again", name.to_string_lossy())))
}

/// `name` in `dir` as it is, without following or opening it (`O_PATH`).
fn look(dir: &OwnedFd, name: &OsStr) -> io::Result<File> {
    let fd = openat(dir, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())?;
    Ok(File::from(fd))
}

/// What a refused step down means: `name` is a symlink now (the check saw
/// none, so the path changed since, and it is not followed), or something
/// that is not a directory.
fn changed(e: Errno, dir: &OwnedFd, name: &OsStr) -> io::Error {
    if !matches!(e, Errno::ELOOP | Errno::ENOTDIR) {
        return e.into();
    }
    let name_s = name.to_string_lossy();
    match look(dir, name).and_then(|f| f.metadata()) {
        Ok(m) if m.file_type().is_symlink() => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("\"{name_s}\" is a symlink now: the path changed after it was checked, and a symlink is not followed"),
        ),
        Ok(m) => {
            let what = if m.is_file() { "a file" } else { steppe_language::confine::file_kind(m.file_type()) };
            io::Error::new(io::ErrorKind::InvalidInput, format!("\"{name_s}\" is {what}, not a directory"))
        }
        Err(e) => e,
    }
}
