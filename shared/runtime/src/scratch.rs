//! A process's scratch directory under the system's temp dir (step
//! directories, artifact views, unpacked inputs): removed when the command
//! that made it returns, and, when a process died before it could, by the
//! next steppe process of the same kind to start.

use std::io;
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
        std::fs::create_dir_all(&path)?;
        // The process's own: step directories (and what they hold) are
        // nobody else's on this host, whatever modes are set inside.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
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
        let _ = std::fs::remove_dir_all(&self.path);
    }
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

fn alive(pid: i32) -> bool {
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
}
