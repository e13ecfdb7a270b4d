//! Every command a worker starts (a task's `sh -c`, an agent's run_shell or
//! custom tool) leads a process group of its own, and the whole group,
//! grandchildren included, is killed however the command ends: done (what
//! it left in the background), timed out, cancelled, its future dropped, or
//! the worker exiting ([`kill_all`]).
//!
//! A process that leaves the group on purpose (`setsid`) escapes this; a
//! host-shell step is not a sandbox (docs/security.md), containers are.

use std::collections::HashSet;
use std::sync::Mutex;

static LIVE: Mutex<Option<HashSet<i32>>> = Mutex::new(None);

/// A started command's process group; killed when dropped.
#[derive(Debug)]
pub struct Group {
    pgid: i32,
}

impl Group {
    /// The group of a child started with `process_group(0)` (it leads it).
    pub fn of(child: &tokio::process::Child) -> Option<Group> {
        Group::of_pid(child.id()?)
    }

    /// The group a child of this pid leads.
    pub fn of_pid(pid: u32) -> Option<Group> {
        let pgid = i32::try_from(pid).ok().filter(|p| *p > 1)?;
        if let Ok(mut live) = LIVE.lock() {
            live.get_or_insert_with(HashSet::new).insert(pgid);
        }
        Some(Group { pgid })
    }

    /// Kills every process left in the group.
    pub fn kill(&self) {
        signal(self.pgid);
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        signal(self.pgid);
        if let Ok(mut live) = LIVE.lock() {
            if let Some(l) = live.as_mut() {
                l.remove(&self.pgid);
            }
        }
    }
}

fn signal(pgid: i32) {
    // SAFETY: signalling a process group this worker started; no memory is touched.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

/// Kills every group still running: the worker is exiting.
pub fn kill_all() {
    let groups: Vec<i32> = LIVE.lock().ok().and_then(|l| l.as_ref().map(|s| s.iter().copied().collect())).unwrap_or_default();
    for g in groups {
        signal(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Running, not a zombie waiting for whoever reaps orphans.
    fn alive(pid: i32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit(") ").next().and_then(|r| r.chars().next());
        matches!(state, Some(c) if c != 'Z' && c != 'X')
    }

    #[tokio::test]
    async fn a_dropped_group_takes_its_grandchildren_with_it() {
        let mut child = tokio::process::Command::new("sh")
            .args(["-c", "sleep 300 & echo $!; (sleep 300 &) ; sleep 300"])
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("sh");
        let group = Group::of(&child).expect("a group");
        let mut out = tokio::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line).await.expect("pid");
        let grandchild: i32 = line.trim().parse().expect("a pid");
        assert!(alive(grandchild));
        drop(group);
        let _ = child.wait().await;
        // Reaped by init once killed; give it a moment.
        let t0 = std::time::Instant::now();
        while alive(grandchild) && t0.elapsed() < std::time::Duration::from_secs(5) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!alive(grandchild), "the background grandchild was killed with the group");
    }
}
