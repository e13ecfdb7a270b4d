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
    let fd = nix::fcntl::open(root, DIR, Mode::empty()).map_err(|e| changed(e, root.as_os_str()))?;
    let now = File::from(fd);
    if super::identity(&now.metadata()?) != made {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, format!("{} was replaced since the step began", root.display())));
    }
    Ok(now.into())
}

/// The directory `rel` below `start` (`start` itself, again, when `rel` is
/// empty); with `create`, missing directories are made on the way.
pub(super) fn descend(start: &OwnedFd, rel: &Path, create: bool) -> io::Result<OwnedFd> {
    let mut at = start.try_clone()?;
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
                openat(&at, name, DIR, Mode::empty()).map_err(|e| changed(e, name))?
            }
            r => r.map_err(|e| changed(e, name))?,
        };
    }
    Ok(at)
}

/// The regular file `rel` below `start`, opened as [`open_in`] opens it.
pub fn open_below(start: &OwnedFd, rel: &Path, how: Open) -> io::Result<File> {
    let Some(name) = rel.file_name() else { return Err(super::not_a_file(&File::from(start.try_clone()?).metadata()?)) };
    let dir = descend(start, rel.parent().unwrap_or(Path::new("")), how != Open::Read)?;
    open_in(&dir, name, how)
}

/// One name in a directory: what it is, and its size, as `lstat` has them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: OsString,
    pub is_dir: bool,
    pub is_file: bool,
    pub size: u64,
}

/// The names in `dir` (not `.` and `..`), each looked at without following it.
pub fn list(dir: &OwnedFd) -> io::Result<Vec<Entry>> {
    use std::os::unix::ffi::OsStrExt;
    let names: Vec<OsString> = nix::dir::Dir::from_fd(dir.try_clone()?)?
        .into_iter()
        .filter_map(Result::ok)
        .map(|e| OsStr::from_bytes(e.file_name().to_bytes()).to_os_string())
        .filter(|n| n != "." && n != "..")
        .collect();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let Ok(st) = nix::sys::stat::fstatat(dir, name.as_os_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) else { continue };
        let kind = st.st_mode & libc::S_IFMT;
        out.push(Entry { name, is_dir: kind == libc::S_IFDIR, is_file: kind == libc::S_IFREG, size: u64::try_from(st.st_size).unwrap_or(0) });
    }
    Ok(out)
}

/// The directory `name` in `dir`, not followed if it is a symlink.
pub fn subdir(dir: &OwnedFd, name: &OsStr) -> io::Result<OwnedFd> {
    descend(dir, Path::new(name), false)
}

/// The regular file `name` in `dir`, opened as `how` says. Anything else
/// there (a FIFO, a device, a socket, a directory, a symlink) is refused
/// before it is opened, by a look that opens nothing (`O_PATH`).
pub(super) fn open_in(dir: &OwnedFd, name: &OsStr, how: Open) -> io::Result<File> {
    let look = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(dir, name, look, Mode::empty()) {
        Ok(fd) => {
            let m = File::from(fd).metadata()?;
            if !m.file_type().is_file() {
                return Err(super::not_a_file(&m));
            }
        }
        Err(Errno::ENOENT) if how != Open::Read => {}
        Err(e) => return Err(e.into()),
    }
    let flags = match how {
        Open::Read => OFlag::O_RDONLY,
        Open::Write => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC,
        Open::Append => OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_APPEND,
    };
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let f = File::from(openat(dir, name, flags, Mode::from_bits_truncate(0o666)).map_err(|e| changed(e, name))?);
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(super::not_a_file(&m));
    }
    Ok(f)
}

/// What a refused step down means: a symlink (`O_NOFOLLOW`) or no longer a
/// directory where the check saw one.
fn changed(e: Errno, name: &OsStr) -> io::Error {
    match e {
        Errno::ELOOP | Errno::ENOTDIR => io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("\"{}\" is a symlink or not a directory now: the path changed after it was checked, and is not followed", name.to_string_lossy()),
        ),
        e => e.into(),
    }
}
