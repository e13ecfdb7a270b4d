//! Step directories: each step starts in an empty directory of its own; one
//! that its step left as it found it is kept for a later step instead of
//! being removed and made again (most steps write nothing in it), in this
//! process and, when it ends, on a shelf in a pool under the temp dir that
//! later steppe processes of the same user take whole.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use steppe_runtime::scratch::{euid, users_dir, users_path};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A directory kept for reuse under the work root it serves.
struct Spare {
    root: PathBuf,
    path: PathBuf,
}

/// Directories kept for reuse. Each lies on a shelf: a directory of this
/// process's under its work root (`shelf-<pid>`, where it makes new ones,
/// or one taken from the pool), which moves whole.
static SPARE: Mutex<Vec<Spare>> = Mutex::new(Vec::new());

/// At most this many are kept (more than a process runs at once, as a rule).
const SPARE_MAX: usize = 4096;

/// The shelf this process makes directories on, per work root.
static OWN_SHELVES: Mutex<Vec<(PathBuf, PathBuf)>> = Mutex::new(Vec::new());

/// A step's directory, with what it looked like when handed out: a step
/// that leaves it as it found it leaves its status unchanged.
#[derive(Debug)]
pub struct StepDir {
    root: PathBuf,
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

/// The permission bits a directory is made with here (0777 less the
/// umask): a kept directory must still have them. None where the umask
/// cannot be read without changing it; then none is kept.
fn made_mode() -> Option<u32> {
    static MODE: OnceLock<Option<u32>> = OnceLock::new();
    *MODE.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let umask = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
        u32::from_str_radix(umask.trim(), 8).ok().map(|m| 0o777 & !m)
    })
}

/// Shelves between processes: `$TMPDIR/steppe-spares.u<uid>` (0700, this
/// user's). Making a directory is dear where the file system skips the
/// inodes it freed lately (ext4 without a journal scans past every one:
/// 0.35 ms a `mkdir` after a run of thousands); a shelf moved in and out by
/// rename neither frees nor allocates one, however many it holds.
static POOL: Mutex<Pool> = Mutex::new(Pool { state: PoolState::Unopened, listed: Vec::new(), listed_at: None });

/// At most this many directories wait in the pool, on all its shelves.
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
    /// Shelves seen in the pool, not yet tried.
    listed: Vec<OsString>,
    listed_at: Option<Instant>,
}

impl Pool {
    /// The pool's directory; made only when `make` (a shelf is put in it),
    /// so a process that keeps nothing leaves none behind.
    fn dir(&mut self, make: bool) -> Option<PathBuf> {
        if let PoolState::Unopened = self.state {
            if !make {
                if self.listed_at.is_some_and(|t| t.elapsed() < RELIST) {
                    return None;
                }
                self.listed_at = Some(Instant::now());
                if std::fs::symlink_metadata(pool_path(&pool_base())).is_err() {
                    return None;
                }
            }
            self.state = match open_pool(&pool_base()) {
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

    /// The shelves in the pool, the smallest last (the first taken: a
    /// process that needs one directory reads the names of few).
    fn relist(&mut self) {
        let PoolState::Open(d) = &self.state else { return };
        self.listed = std::fs::read_dir(d).map(|es| es.flatten().map(|e| e.file_name()).collect()).unwrap_or_default();
        self.listed.sort_by_key(|n| std::cmp::Reverse(shelf_count(n)));
        self.listed_at = Some(Instant::now());
    }

    /// A shelf moved out of the pool to under `root`, its directories kept
    /// (each checked before it is handed out); whether there was one.
    fn adopt(&mut self, root: &Path) -> bool {
        let Some(pool) = self.dir(false) else { return false };
        loop {
            if self.listed.is_empty() {
                if self.listed_at.is_some_and(|t| t.elapsed() < RELIST) {
                    return false;
                }
                self.relist();
                if self.listed.is_empty() {
                    return false;
                }
            }
            let Some(name) = self.listed.pop() else { return false };
            let shelf = root.join(format!("shelf-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
            match std::fs::rename(pool.join(&name), &shelf) {
                Ok(()) => {
                    if !std::fs::symlink_metadata(&shelf).is_ok_and(|m| m.is_dir() && m.uid() == euid()) {
                        // Not a shelf of ours (nothing but this user's can be put there): gone.
                        let _ = std::fs::remove_file(&shelf).or_else(|_| std::fs::remove_dir_all(&shelf));
                        continue;
                    }
                    let mut held: Vec<PathBuf> = std::fs::read_dir(&shelf).map(|es| es.flatten().map(|e| e.path()).collect()).unwrap_or_default();
                    if held.is_empty() {
                        // An empty directory an earlier steppe pooled on its own: one to use.
                        held.push(shelf);
                    }
                    let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
                    let room = SPARE_MAX.saturating_sub(spare.len());
                    spare.extend(held.into_iter().take(room).map(|path| Spare { root: root.to_path_buf(), path }));
                    return true;
                }
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    self.state = PoolState::Unusable;
                    return false;
                }
                // Taken by another process since it was listed.
                Err(_) => {}
            }
        }
    }

    /// Moves `shelf` (holding `held` directories) into the pool; false when
    /// the pool would hold too many, or is unusable.
    fn put(&mut self, shelf: &Path, held: usize) -> bool {
        let Some(pool) = self.dir(true) else { return false };
        self.relist();
        let waiting: usize = self.listed.iter().map(|n| shelf_count(n)).sum();
        if waiting + held > POOL_MAX {
            return false;
        }
        let name = format!("{}-{}-{held}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        std::fs::rename(shelf, pool.join(name)).is_ok()
    }
}

/// How many directories a shelf named `<pid>-<seq>-<count>` holds (1 for any
/// other name: a directory an earlier steppe pooled on its own).
fn shelf_count(name: &OsString) -> usize {
    match name.to_str().unwrap_or_default().split('-').collect::<Vec<_>>().as_slice() {
        [_, _, count] => count.parse().unwrap_or(1),
        _ => 1,
    }
}

/// Where the pool is: the temp dir (in unit tests a directory nobody makes,
/// so that they neither take from nor add to the user's pool).
fn pool_base() -> PathBuf {
    let tmp = std::env::temp_dir();
    if cfg!(test) {
        return tmp.join(format!("steppe-stepdir-no-pool-{}", std::process::id()));
    }
    tmp
}

fn pool_path(base: &Path) -> PathBuf {
    users_path(base, POOL_PREFIX)
}

/// The pool under `base`, made when missing; None unless it is a real
/// directory of this user's that nobody else may enter.
fn open_pool(base: &Path) -> Option<PathBuf> {
    users_dir(base, POOL_PREFIX, true)
}

const POOL_PREFIX: &str = "steppe-spares";

/// A kept directory for `root` that is still as made.
fn kept(root: &Path) -> Option<StepDir> {
    loop {
        let d = {
            let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
            let i = spare.iter().rposition(|s| s.root == root)?;
            spare.swap_remove(i).path
        };
        // Anything may have reached it since it was given back (a process
        // that left the step's group): checked before it is handed out.
        match pristine(&d) {
            Some(found) => return Some(StepDir { root: root.to_path_buf(), path: d, found: Some(found) }),
            None => remove_aside(d),
        }
    }
}

/// An empty directory under `root` for one step.
pub fn take(root: &Path) -> std::io::Result<StepDir> {
    if let Some(d) = kept(root) {
        return Ok(d);
    }
    if made_mode().is_some() && POOL.lock().unwrap_or_else(|p| p.into_inner()).adopt(root) {
        if let Some(d) = kept(root) {
            return Ok(d);
        }
    }
    let shelf = own_shelf(root)?;
    let d = shelf.join(format!("step-{}", SEQ.fetch_add(1, Ordering::Relaxed)));
    std::fs::DirBuilder::new().create(&d)?;
    let found = std::fs::symlink_metadata(&d).ok().map(|m| Stamp::of(&m));
    Ok(StepDir { root: root.to_path_buf(), path: d, found })
}

/// `<root>/shelf-<pid>`, made the first time.
fn own_shelf(root: &Path) -> std::io::Result<PathBuf> {
    let mut own = OWN_SHELVES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, s)) = own.iter().find(|(r, _)| r == root) {
        return Ok(s.clone());
    }
    let s = root.join(format!("shelf-{}", std::process::id()));
    std::fs::create_dir_all(&s)?;
    own.push((root.to_path_buf(), s.clone()));
    Ok(s)
}

/// The step is over: its directory is kept when its status is as it was
/// handed out (nothing made or removed in it since, its mode and owner
/// unchanged), else removed.
pub fn give_back(d: StepDir) {
    let StepDir { root, path, found } = d;
    let unchanged = found.is_some() && std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir() && Some(Stamp::of(&m)) == found);
    if unchanged {
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_MAX {
            spare.push(Spare { root, path });
            return;
        }
    }
    if std::fs::remove_dir(&path).is_ok() {
        return;
    }
    remove_aside(path);
}

/// The process is done with its work roots: every shelf whose directories
/// are all kept (none in use, none unaccounted for) goes into the pool
/// whole, for later processes; anything else stays to go with its root.
pub fn shelve() {
    let spares = std::mem::take(&mut *SPARE.lock().unwrap_or_else(|p| p.into_inner()));
    let mut shelves: Vec<(PathBuf, usize)> = Vec::new();
    for s in &spares {
        let Some(shelf) = s.path.parent().filter(|p| *p != s.root) else { continue };
        match shelves.iter_mut().find(|(p, _)| p == shelf) {
            Some((_, n)) => *n += 1,
            None => shelves.push((shelf.to_path_buf(), 1)),
        }
    }
    OWN_SHELVES.lock().unwrap_or_else(|p| p.into_inner()).clear();
    for (shelf, held) in shelves {
        let all_kept = std::fs::read_dir(&shelf).is_ok_and(|es| es.count() == held);
        if all_kept {
            POOL.lock().unwrap_or_else(|p| p.into_inner()).put(&shelf, held);
        }
    }
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
    if !m.is_dir() || Some(m.permissions().mode() & 0o7777) != made_mode() || m.uid() != euid() {
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
        let changed = made_mode().unwrap() ^ 0o010;
        std::fs::set_permissions(b.path(), std::fs::Permissions::from_mode(changed)).unwrap();
        let second = b.path().to_path_buf();
        give_back(b);
        assert!(!second.exists());
        // Its mode changed after it was given back: not handed out.
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
        let theirs = o.path().to_path_buf();
        give_back(o);
        let mine = take(&r).unwrap();
        assert!(mine.path().starts_with(&r) && !theirs.starts_with(&r));
        give_back(mine);
        let _ = std::fs::remove_dir_all(&r);
        let _ = std::fs::remove_dir_all(&other);
    }

    #[test]
    fn a_pooled_shelf_is_taken_whole_and_what_changed_on_it_is_not_handed_out() {
        let (base, from, to) = (root("pool-base"), root("pool-from"), root("pool-to"));
        let dir = open_pool(&base).expect("a pool of our own");
        let mut pool = Pool { state: PoolState::Open(dir.clone()), listed: Vec::new(), listed_at: None };
        // A shelf of three empty directories goes in by one rename.
        let shelf = from.join("shelf");
        std::fs::create_dir(&shelf).unwrap();
        for n in ["a", "b", "c"] {
            std::fs::create_dir(shelf.join(n)).unwrap();
        }
        assert!(pool.put(&shelf, 3), "a shelf goes into the pool");
        assert!(!shelf.exists());
        assert!(!pool.put(&from, POOL_MAX), "nor past what the pool holds");
        // One is written in while it waits: not handed out.
        let pooled = std::fs::read_dir(&dir).unwrap().flatten().next().unwrap().path();
        std::fs::write(pooled.join("b").join("late.txt"), "x").unwrap();
        pool.relist();
        assert!(pool.adopt(&to), "the shelf comes out whole");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "the pool is then empty");
        let mut handed = Vec::new();
        while let Some(d) = kept(&to) {
            assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "every one handed out is empty");
            handed.push(d.path().file_name().unwrap().to_owned());
        }
        handed.sort();
        assert_eq!(handed, ["a", "c"], "the spoiled one is not handed out");
        let _ = [base, from, to].map(std::fs::remove_dir_all);
    }

    #[test]
    fn the_smallest_shelf_is_taken_first() {
        let (base, to) = (root("pool-small"), root("pool-small-to"));
        let dir = open_pool(&base).expect("a pool of our own");
        for (name, n) in [("1-1-3", 3), ("1-2-1", 1), ("1-3-2", 2)] {
            std::fs::create_dir(dir.join(name)).unwrap();
            for i in 0..n {
                std::fs::create_dir(dir.join(name).join(format!("d{i}"))).unwrap();
            }
        }
        let mut pool = Pool { state: PoolState::Open(dir.clone()), listed: Vec::new(), listed_at: None };
        pool.relist();
        assert!(pool.adopt(&to));
        let mut left: Vec<String> = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert_eq!(left, ["1-1-3", "1-3-2"], "the shelf of one was taken");
        while kept(&to).is_some() {}
        let _ = [base, to].map(std::fs::remove_dir_all);
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
