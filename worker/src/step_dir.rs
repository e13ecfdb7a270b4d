//! Step directories: each step starts in an empty directory of its own; one
//! that its step left empty and as made is kept for a later step instead of
//! being removed and made again (most steps write nothing in it), in this
//! process or, past what one process keeps, in a pool under the temp dir
//! that later steppe processes of the same user take from.

use std::ffi::OsString;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Directories kept for reuse, each under the work root it was made in.
static SPARE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A step's directory, with what it looked like when handed out: a step
/// that leaves it as it found it leaves its status unchanged.
#[derive(Debug)]
pub struct StepDir {
    path: PathBuf,
    found: Option<Stamp>,
}

impl StepDir {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What changes when anything is made or removed in a directory (or its
/// mode or owner is changed): only a hint of where a step wrote, never what
/// decides a directory is empty (the check before it is handed out does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp { ino: m.ino(), mtime: (m.mtime(), m.mtime_nsec()), ctime: (m.ctime(), m.ctime_nsec()) }
    }
}

/// At most this many are kept (about the slots of one process).
const SPARE_MAX: usize = 256;

/// The permission bits a directory is made with here (the umask applied),
/// read off the first one made: a kept directory must still have them.
static MADE_MODE: AtomicU32 = AtomicU32::new(u32::MAX);

/// Empty step directories between processes: `$TMPDIR/steppe-spares.u<uid>`
/// (0700, this user's). Making a directory is dear where the file system
/// skips the inodes it freed lately (ext4 without a journal scans past every
/// one: 0.35 ms a `mkdir` after a run of thousands); moving one in and out
/// by rename neither frees nor allocates one.
static POOL: Mutex<Pool> = Mutex::new(Pool { state: PoolState::Unopened, listed: Vec::new(), listed_at: None, held: 0 });

/// At most this many wait in the pool.
const POOL_MAX: usize = 4096;

/// The pool is listed again at most this often once what was listed is used up.
const RELIST: Duration = Duration::from_secs(1);

enum PoolState {
    Unopened,
    Open(PathBuf),
    /// Not ours, not a directory, or on another file system than the steps.
    Unusable,
}

struct Pool {
    state: PoolState,
    /// Names seen in the pool, not yet tried.
    listed: Vec<OsString>,
    listed_at: Option<Instant>,
    /// About how many wait there (as last listed, and what this process moved since).
    held: usize,
}

impl Pool {
    /// The pool's directory; made only when `make` (something is put in
    /// it), so a process that never fills its own spares leaves none behind.
    fn dir(&mut self, make: bool) -> Option<PathBuf> {
        if let PoolState::Unopened = self.state {
            if !make {
                if self.listed_at.is_some_and(|t| t.elapsed() < RELIST) {
                    return None;
                }
                self.listed_at = Some(Instant::now());
                if std::fs::symlink_metadata(pool_path(&std::env::temp_dir())).is_err() {
                    return None;
                }
            }
            self.state = match open_pool(&std::env::temp_dir()) {
                Some(d) => PoolState::Open(d),
                None => PoolState::Unusable,
            };
            self.relist();
        }
        match &self.state {
            PoolState::Open(d) => Some(d.clone()),
            _ => None,
        }
    }

    fn relist(&mut self) {
        let PoolState::Open(d) = &self.state else { return };
        self.listed = std::fs::read_dir(d).map(|es| es.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        self.held = self.listed.len();
        self.listed_at = Some(Instant::now());
    }

    /// A directory moved out of the pool to `to`, checked as a made one
    /// would be; its status then.
    fn take_into(&mut self, to: &Path) -> Option<Stamp> {
        let pool = self.dir(false)?;
        loop {
            if self.listed.is_empty() {
                if self.listed_at.is_some_and(|t| t.elapsed() < RELIST) {
                    return None;
                }
                self.relist();
                if self.listed.is_empty() {
                    return None;
                }
            }
            let name = self.listed.pop()?;
            match std::fs::rename(pool.join(&name), to) {
                Ok(()) => {
                    self.held = self.held.saturating_sub(1);
                    if let Some(found) = pristine(to) {
                        return Some(found);
                    }
                    let _ = std::fs::remove_dir_all(to);
                }
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    self.state = PoolState::Unusable;
                    return None;
                }
                // Taken by another process since it was listed.
                Err(_) => {}
            }
        }
    }

    /// Moves `d` into the pool; false when it is full or unusable.
    fn put(&mut self, d: &Path) -> bool {
        if self.held >= POOL_MAX {
            return false;
        }
        let Some(pool) = self.dir(true) else { return false };
        let name = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        match std::fs::rename(d, pool.join(name)) {
            Ok(()) => {
                self.held += 1;
                true
            }
            Err(_) => false,
        }
    }
}

/// The user this process runs as: the owner of its directories and its pool.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn pool_path(base: &Path) -> PathBuf {
    base.join(format!("steppe-spares.u{}", euid()))
}

/// The pool under `base`, made when missing; None unless it is a real
/// directory of this user's that nobody else may enter.
fn open_pool(base: &Path) -> Option<PathBuf> {
    let d = pool_path(base);
    match std::fs::DirBuilder::new().mode(0o700).create(&d) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(_) => return None,
    }
    let m = std::fs::symlink_metadata(&d).ok()?;
    (m.is_dir() && m.uid() == euid() && m.permissions().mode() & 0o077 == 0).then_some(d)
}

/// An empty directory under `root` for one step.
pub fn take(root: &Path) -> std::io::Result<StepDir> {
    loop {
        let kept = {
            let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
            spare.iter().rposition(|d| d.parent() == Some(root)).map(|i| spare.swap_remove(i))
        };
        let Some(d) = kept else { break };
        // Kept unchecked when its step seemed to leave it as found, and
        // anything may have reached it since (a process that left the
        // step's group): checked before it is handed out.
        if let Some(found) = pristine(&d) {
            return Ok(StepDir { path: d, found: Some(found) });
        }
        remove_aside(d);
    }
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let d = root.join(format!("step-{}-{n}", std::process::id()));
    if MADE_MODE.load(Ordering::Relaxed) != u32::MAX {
        if let Some(found) = POOL.lock().unwrap_or_else(|p| p.into_inner()).take_into(&d) {
            return Ok(StepDir { path: d, found: Some(found) });
        }
    }
    std::fs::create_dir_all(&d)?;
    let made = std::fs::symlink_metadata(&d).ok();
    if let Some(m) = &made {
        if MADE_MODE.load(Ordering::Relaxed) == u32::MAX {
            MADE_MODE.store(m.permissions().mode() & 0o7777, Ordering::Relaxed);
        }
    }
    Ok(StepDir { found: made.as_ref().map(Stamp::of), path: d })
}

/// The step is over: its directory is kept when its status is as it was
/// handed out (nothing made or removed in it since, its mode and owner
/// unchanged), else removed.
pub fn give_back(d: StepDir) {
    let StepDir { path: d, found } = d;
    let unchanged = found.is_some() && std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir() && Some(Stamp::of(&m)) == found);
    if unchanged {
        {
            let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
            if spare.len() < SPARE_MAX {
                spare.push(d);
                return;
            }
        }
        // Another process may take it from the pool: checked first.
        if pristine(&d).is_some() && POOL.lock().unwrap_or_else(|p| p.into_inner()).put(&d) {
            return;
        }
    }
    if std::fs::remove_dir(&d).is_ok() {
        return;
    }
    remove_aside(d);
}

/// Removes what a step left (it may be large) on a blocking thread, so a
/// runtime of one thread goes on (its heartbeats with it).
fn remove_aside(d: PathBuf) {
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(move || std::fs::remove_dir_all(&d))),
        Err(_) => {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

/// Whether `d` is as a step directory is made here: a real directory, its
/// mode as made, this user's, and empty; its status then.
fn pristine(d: &Path) -> Option<Stamp> {
    let m = std::fs::symlink_metadata(d).ok()?;
    if !m.is_dir() || m.permissions().mode() & 0o7777 != MADE_MODE.load(Ordering::Relaxed) || m.uid() != euid() {
        return None;
    }
    std::fs::read_dir(d).ok()?.next().is_none().then(|| Stamp::of(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(name: &str) -> PathBuf {
        let r = std::env::temp_dir().join(format!("steppe-stepdir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&r);
        std::fs::create_dir_all(&r).unwrap();
        r
    }

    #[test]
    fn a_directory_left_empty_is_used_again_and_one_written_in_is_not() {
        let r = root("reuse");
        let a = take(&r).unwrap();
        let first = a.path().to_path_buf();
        give_back(a);
        let b = take(&r).unwrap();
        assert_eq!(b.path(), first, "an empty directory is kept for the next step");
        std::fs::write(b.path().join("left.txt"), "x").unwrap();
        give_back(b);
        let c = take(&r).unwrap();
        assert_ne!(c.path(), first, "a directory written in is not handed out again");
        assert!(!first.exists(), "a directory with something left in it is removed");
        assert_eq!(std::fs::read_dir(c.path()).unwrap().count(), 0, "every step starts empty");
        give_back(c);
        let _ = std::fs::remove_dir_all(&r);
    }

    #[test]
    fn a_kept_directory_that_changed_is_not_handed_out() {
        let r = root("changed");
        let a = take(&r).unwrap();
        let first = a.path().to_path_buf();
        give_back(a);
        // Written in after it was given back (a process the step left behind).
        std::fs::write(first.join("late.txt"), "x").unwrap();
        let b = take(&r).unwrap();
        assert_ne!(b.path(), first);
        assert!(!first.exists(), "what was written in it is removed");
        assert_eq!(std::fs::read_dir(b.path()).unwrap().count(), 0);
        // Its permissions changed: not kept.
        let changed = MADE_MODE.load(Ordering::Relaxed) ^ 0o010;
        std::fs::set_permissions(b.path(), std::fs::Permissions::from_mode(changed)).unwrap();
        let second = b.path().to_path_buf();
        give_back(b);
        assert!(!second.exists());
        // Made empty again in its place after it was given back: not handed out unchecked.
        let c = take(&r).unwrap();
        let third = c.path().to_path_buf();
        give_back(c);
        std::fs::set_permissions(&third, std::fs::Permissions::from_mode(changed)).unwrap();
        let d = take(&r).unwrap();
        assert_ne!(d.path(), third, "a kept directory whose mode changed is not handed out");
        give_back(d);
        // Another work root's directory is not handed out here.
        let other = root("other");
        let o = take(&other).unwrap();
        let theirs = o.path().parent().map(Path::to_path_buf);
        give_back(o);
        let mine = take(&r).unwrap();
        assert_ne!(mine.path().parent().map(Path::to_path_buf), theirs);
        let _ = std::fs::remove_dir_all(&r);
        let _ = std::fs::remove_dir_all(&other);
    }

    #[test]
    fn a_pooled_directory_is_taken_by_rename_and_a_changed_one_is_not_handed_out() {
        let r = root("pool");
        let base = root("pool-base");
        let made = take(&r).unwrap().path;
        let dir = open_pool(&base).expect("a pool of our own");
        let mut pool = Pool { state: PoolState::Open(dir.clone()), listed: Vec::new(), listed_at: None, held: 0 };
        assert!(pool.put(&made), "an empty directory goes into the pool");
        assert!(!made.exists());
        let spoiled = take(&r).unwrap().path;
        assert!(pool.put(&spoiled));
        pool.relist();
        assert_eq!(pool.held, 2);
        // One of the two is written in while it waits: it is removed, not handed out.
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).collect();
        std::fs::write(names[0].join("late.txt"), "x").unwrap();
        let (a, b) = (r.join("a"), r.join("b"));
        assert!(pool.take_into(&a).is_some(), "a clean one comes out");
        assert_eq!(std::fs::read_dir(&a).unwrap().count(), 0);
        assert!(pool.take_into(&b).is_none(), "the spoiled one is not handed out, and the pool is then empty");
        assert!(!b.exists());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the spoiled one was removed from the pool");
        let _ = std::fs::remove_dir_all(&r);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_pool_anyone_else_may_enter_or_a_link_is_not_used() {
        let base = root("pool-open");
        let d = pool_path(&base);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(open_pool(&base).is_none(), "a pool others may write in is not used");
        std::fs::remove_dir(&d).unwrap();
        let elsewhere = root("pool-elsewhere");
        std::os::unix::fs::symlink(&elsewhere, &d).unwrap();
        assert!(open_pool(&base).is_none(), "a link in the pool's place is not followed");
        let _ = std::fs::remove_dir_all(&base);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }
}
