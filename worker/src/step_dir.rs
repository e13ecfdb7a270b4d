//! Step directories: each step starts in an empty directory of its own; one
//! that its step left empty and as made is kept for a later step instead of
//! being removed and made again (most steps write nothing in it).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Directories kept for reuse, each under the work root it was made in.
static SPARE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// At most this many are kept (about the slots of one process).
const SPARE_MAX: usize = 256;

/// The permission bits a directory is made with here (the umask applied),
/// read off the first one made: a kept directory must still have them.
static MADE_MODE: AtomicU32 = AtomicU32::new(u32::MAX);

/// An empty directory under `root` for one step.
pub fn take(root: &Path) -> std::io::Result<PathBuf> {
    let kept = {
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        spare.iter().rposition(|d| d.parent() == Some(root)).map(|i| spare.swap_remove(i))
    };
    if let Some(d) = kept {
        // Nothing may have reached it since (a process that left the step's
        // group): it is checked again before it is handed out.
        if pristine(&d) {
            return Ok(d);
        }
        let _ = std::fs::remove_dir_all(&d);
    }
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let d = root.join(format!("step-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    if MADE_MODE.load(Ordering::Relaxed) == u32::MAX {
        if let Ok(m) = std::fs::symlink_metadata(&d) {
            MADE_MODE.store(m.permissions().mode() & 0o7777, Ordering::Relaxed);
        }
    }
    Ok(d)
}

/// The step is over: its directory is kept when it is as it was made
/// (a real directory, empty, its permissions unchanged), else removed.
pub fn give_back(d: PathBuf) {
    if pristine(&d) {
        let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
        if spare.len() < SPARE_MAX {
            spare.push(d);
            return;
        }
    }
    if std::fs::remove_dir(&d).is_ok() {
        return;
    }
    // What the step left may be large: removed on a blocking thread, so a
    // runtime of one thread goes on (its heartbeats with it).
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(move || std::fs::remove_dir_all(&d))),
        Err(_) => {
            let _ = std::fs::remove_dir_all(&d);
        }
    }
}

fn pristine(d: &Path) -> bool {
    let Ok(m) = std::fs::symlink_metadata(d) else { return false };
    if !m.is_dir() || m.permissions().mode() & 0o7777 != MADE_MODE.load(Ordering::Relaxed) {
        return false;
    }
    std::fs::read_dir(d).is_ok_and(|mut entries| entries.next().is_none())
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
        give_back(a.clone());
        let b = take(&r).unwrap();
        assert_eq!(a, b, "an empty directory is kept for the next step");
        std::fs::write(b.join("left.txt"), "x").unwrap();
        give_back(b.clone());
        assert!(!b.exists(), "a directory with something left in it is removed");
        let c = take(&r).unwrap();
        assert_ne!(c, b);
        assert_eq!(std::fs::read_dir(&c).unwrap().count(), 0, "every step starts empty");
        let _ = std::fs::remove_dir_all(&r);
    }

    #[test]
    fn a_kept_directory_that_changed_is_not_handed_out() {
        let r = root("changed");
        let a = take(&r).unwrap();
        give_back(a.clone());
        // Written in after it was given back (a process the step left behind).
        std::fs::write(a.join("late.txt"), "x").unwrap();
        let b = take(&r).unwrap();
        assert_ne!(a, b);
        assert_eq!(std::fs::read_dir(&b).unwrap().count(), 0);
        // Its permissions changed: not kept.
        let changed = MADE_MODE.load(Ordering::Relaxed) ^ 0o010;
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(changed)).unwrap();
        give_back(b.clone());
        assert!(!b.exists());
        // Another work root's directory is not handed out here.
        let other = root("other");
        let o = take(&other).unwrap();
        give_back(o.clone());
        let mine = take(&r).unwrap();
        assert_ne!(mine.parent(), o.parent());
        let _ = std::fs::remove_dir_all(&r);
        let _ = std::fs::remove_dir_all(&other);
    }
}
