//! A process's scratch directory under the system's temp dir (step
//! directories, artifact views, unpacked inputs): emptied when the command
//! that made it returns and left for the next command to take whole (or
//! removed), and, when a process died before it could, removed by the next
//! steppe process of the same kind to start.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Removes its directory when dropped.
pub struct Scratch {
    path: PathBuf,
    /// The sweep of dead processes' directories, beside the command's start
    /// (the temp dir may hold many entries); waited for before exit.
    sweeping: Option<std::thread::JoinHandle<()>>,
}

impl Scratch {
    /// `$TMPDIR/steppe-<kind>-<pid>`; the ones of `kind` whose process is
    /// gone are swept away on a thread of their own.
    pub fn create(kind: &str) -> io::Result<Scratch> {
        Self::create_then(kind, |_| {})
    }

    /// As [`Scratch::create`]; `then` runs on the sweep's thread once it is
    /// over, told whether a steppe process of any kind on this host died
    /// leaving its directory (whatever else it left, containers, is swept
    /// then: a host where none died has nothing to sweep).
    pub fn create_then(kind: &str, then: impl FnOnce(bool) + Send + 'static) -> io::Result<Scratch> {
        let base = std::env::temp_dir();
        let path = base.join(format!("steppe-{kind}-{}", std::process::id()));
        if !adopt(&spares_base(), &path) {
            std::fs::create_dir_all(&path)?;
            // The process's own: step directories (and what they hold) are
            // nobody else's on this host, whatever modes are set inside.
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        }
        let kind = kind.to_string();
        let sweeping = std::thread::Builder::new().name("steppe-sweep".into()).spawn(move || then(sweep(&base, &kind))).ok();
        Ok(Scratch { path, sweeping })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until the sweep begun by [`Scratch::create`] is over.
    pub fn swept(&mut self) {
        if let Some(t) = self.sweeping.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.swept();
        if !retire(&spares_base(), &self.path) {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Scratch directories given back, emptied, for later commands to take by
/// rename: making a directory is dear where the file system skips the
/// inodes it freed lately (ext4 without a journal: 0.35–0.7 ms a `mkdir`
/// after a run of thousands, two of them and two removals in every
/// command), and a rename neither frees nor allocates one.
const SPARES_MAX: usize = 8;

/// What a scratch directory may hold when it is given back and taken: its
/// step directories' root (`steps`), empty.
const KEPT: &str = "steps";

/// Where the spares are: the temp dir (in unit tests a directory nobody
/// makes, so that they neither take from nor add to the user's).
fn spares_base() -> PathBuf {
    let tmp = std::env::temp_dir();
    if cfg!(test) {
        return tmp.join(format!("steppe-scratch-no-spares-{}", std::process::id()));
    }
    tmp
}

/// `$TMPDIR/steppe-scratch-spares.u<uid>`, as [`users_dir`] finds it.
fn spares(base: &Path, make: bool) -> Option<PathBuf> {
    users_dir(base, "steppe-scratch-spares", make)
}

/// `<base>/<prefix>.u<uid>`: where a pool of this user's lies under the temp dir.
pub fn users_path(base: &Path, prefix: &str) -> PathBuf {
    base.join(format!("{prefix}.u{}", euid()))
}

/// [`users_path`] when it is a real directory of this user's that nobody
/// else may enter (made so first, when `make` and it is missing); None for
/// a link, another's directory or one open to others.
pub fn users_dir(base: &Path, prefix: &str, make: bool) -> Option<PathBuf> {
    let d = users_path(base, prefix);
    if make {
        match std::fs::DirBuilder::new().mode(0o700).create(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(_) => return None,
        }
    }
    let m = std::fs::symlink_metadata(&d).ok()?;
    (m.is_dir() && m.uid() == euid() && m.permissions().mode() & 0o077 == 0).then_some(d)
}

/// A spare moved to `path`; whether one is there now. One that is not as
/// given back (not a directory of this user's, 0700, holding nothing but
/// an empty `steps` of this user's) is removed and the next tried.
fn adopt(base: &Path, path: &Path) -> bool {
    let Some(d) = spares(base, false) else { return false };
    let Ok(listed) = std::fs::read_dir(&d) else { return false };
    for e in listed.flatten() {
        // Taken by another process since it was listed: the next.
        if std::fs::rename(e.path(), path).is_err() {
            continue;
        }
        if as_given_back(path) {
            return true;
        }
        let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
    }
    false
}

fn as_given_back(path: &Path) -> bool {
    let ours = |p: &Path, mode: Option<u32>| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() && m.uid() == euid() && mode.is_none_or(|want| m.permissions().mode() & 0o7777 == want));
    let empty = |p: &Path| std::fs::read_dir(p).is_ok_and(|mut es| es.next().is_none());
    if !ours(path, Some(0o700)) {
        return false;
    }
    let Ok(held) = std::fs::read_dir(path) else { return false };
    let held: Vec<_> = held.flatten().collect();
    held.iter().all(|e| e.file_name() == KEPT && ours(&e.path(), None) && empty(&e.path()))
}

/// Empties `path` (but for `steps`, itself emptied) and moves it among the
/// spares; false when it could not be (then it is for the caller to remove).
fn retire(base: &Path, path: &Path) -> bool {
    let Some(d) = spares(base, true) else { return false };
    if !std::fs::read_dir(&d).is_ok_and(|es| es.count() < SPARES_MAX) {
        return false;
    }
    let Ok(held) = std::fs::read_dir(path) else { return false };
    for e in held.flatten() {
        let p = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let emptied = if e.file_name() == KEPT && is_dir {
            std::fs::read_dir(&p).is_ok_and(|inner| inner.flatten().all(|i| remove(&i.path(), i.file_type().is_ok_and(|t| t.is_dir()))))
        } else {
            remove(&p, is_dir)
        };
        if !emptied {
            return false;
        }
    }
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    std::fs::rename(path, d.join(name)).is_ok()
}

fn remove(p: &Path, is_dir: bool) -> bool {
    if is_dir { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) }.is_ok()
}

/// The user this process runs as: the owner of its scratch and its pools.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The kinds of scratch directory steppe's commands make.
const KINDS: [&str; 2] = ["work", "worker"];

/// Removes the `steppe-<kind>-<pid>` directories under `base` (of `kind` or
/// any kind steppe makes) whose process no longer exists; whether there was
/// one. Anything else named so is not steppe's and is left alone: were it
/// counted, every later start would sweep again.
fn sweep(base: &Path, kind: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(base) else { return false };
    let mut dead_seen = false;
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((of, pid)) = name.to_str().and_then(|n| n.strip_prefix("steppe-")).and_then(|n| n.rsplit_once('-')) else { continue };
        let Ok(pid) = pid.parse::<i32>() else { continue };
        if (of == kind || KINDS.contains(&of)) && pid > 0 && !alive(pid) {
            dead_seen = true;
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
    dead_seen
}

/// Whether process `pid` exists (whoever's it is).
pub fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only asks whether the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_process_scratch_is_swept_and_a_live_one_kept() {
        let kind = format!("sweeptest{}", std::process::id());
        let base = std::env::temp_dir();
        // No process has pid 2^22+1 (above Linux's pid_max).
        let dead = base.join(format!("steppe-{kind}-4194305"));
        std::fs::create_dir_all(dead.join("step-1")).unwrap();
        let live = base.join(format!("steppe-{kind}-1"));
        std::fs::create_dir_all(&live).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let mut s = Scratch::create_then(&kind, move |dead| tx.send(dead).unwrap()).unwrap();
        s.swept();
        assert!(rx.recv().unwrap(), "a dead process's directory was seen");
        assert!(!dead.exists(), "a dead process's scratch is removed");
        assert!(live.exists(), "pid 1 is alive: its directory stays");
        let mine = s.path().to_path_buf();
        assert!(mine.is_dir());
        drop(s);
        assert!(!mine.exists(), "removed when dropped");
        let _ = std::fs::remove_dir_all(live);
    }

    #[test]
    fn what_steppe_did_not_make_is_neither_swept_nor_counted() {
        let base = std::env::temp_dir().join(format!("sweep-base-{}", std::process::id()));
        // Of no kind steppe makes (a test's own directory, say), its pid dead.
        let other = base.join("steppe-run-ahead-4194305");
        std::fs::create_dir_all(&other).unwrap();
        assert!(!sweep(&base, "work"), "no dead steppe process: nothing else (containers) to sweep");
        assert!(other.exists(), "not steppe's: left alone");
        // A dead worker's, found by a `steppe run`: removed, and counted once.
        let worker = base.join("steppe-worker-4194305");
        std::fs::create_dir_all(worker.join("steps")).unwrap();
        assert!(sweep(&base, "work"));
        assert!(!worker.exists());
        assert!(!sweep(&base, "work"), "swept once, not seen again");
        let _ = std::fs::remove_dir_all(base);
    }

    fn names(d: &Path) -> Vec<String> {
        let mut n: Vec<String> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    }

    fn base(name: &str) -> PathBuf {
        let b = std::env::temp_dir().join(format!("scratch-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&b);
        std::fs::create_dir_all(&b).unwrap();
        b
    }

    fn made(p: &Path) {
        std::fs::create_dir_all(p).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    #[test]
    fn a_scratch_given_back_is_taken_whole_by_the_next_command_emptied() {
        let base = base("given");
        let first = base.join("steppe-work-1");
        made(&first);
        std::fs::create_dir_all(first.join("steps/shelf-1/step-1")).unwrap();
        std::fs::write(first.join("steps/left"), "x").unwrap();
        std::fs::create_dir_all(first.join("unpacked/input")).unwrap();
        std::fs::write(first.join("view"), "x").unwrap();
        assert!(retire(&base, &first), "given back");
        assert!(!first.exists(), "moved away");
        let next = base.join("steppe-work-2");
        assert!(adopt(&base, &next), "taken by the next");
        assert_eq!(names(&next), ["steps"], "what it held is gone, but for its steps' root");
        assert!(names(&next.join("steps")).is_empty(), "which is empty");
        assert_eq!(std::fs::symlink_metadata(&next).unwrap().permissions().mode() & 0o7777, 0o700);
        assert!(!adopt(&base, &base.join("steppe-work-3")), "one spare is taken once");
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn a_spare_not_as_given_back_is_removed_not_taken() {
        let base = base("hostile");
        let d = spares(&base, true).expect("spares made");
        let outside = base.join("outside");
        made(&outside);
        std::fs::write(outside.join("keep"), "x").unwrap();
        // Something left in it, a mode not its own, a link to elsewhere, a
        // steps that is not empty, a file.
        made(&d.join("a"));
        std::fs::write(d.join("a/planted"), "x").unwrap();
        std::fs::create_dir_all(d.join("b")).unwrap();
        std::fs::set_permissions(d.join("b"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&outside, d.join("c")).unwrap();
        made(&d.join("d/steps/x"));
        std::fs::write(d.join("e"), "x").unwrap();
        let target = base.join("steppe-work-9");
        assert!(!adopt(&base, &target), "none is taken");
        assert!(!target.exists());
        assert!(names(&d).is_empty(), "each is removed");
        assert_eq!(names(&outside), ["keep"], "what a link pointed at is left alone");
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn no_more_spares_wait_than_the_limit() {
        let base = base("limit");
        let kept = (0..SPARES_MAX + 2)
            .filter(|i| {
                let p = base.join(format!("steppe-work-{i}"));
                made(&p);
                retire(&base, &p)
            })
            .count();
        assert_eq!(kept, SPARES_MAX);
        assert_eq!(names(&spares(&base, false).unwrap()).len(), SPARES_MAX);
        std::fs::remove_dir_all(base).unwrap();
    }

    #[test]
    fn the_spares_are_not_taken_for_a_dead_process_scratch() {
        let base = base("sweepspares");
        let d = spares(&base, true).unwrap();
        assert!(!sweep(&base, "work"), "not a scratch of a process");
        assert!(d.exists());
        std::fs::remove_dir_all(base).unwrap();
    }
}
