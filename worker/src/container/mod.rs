//! Steps and tools in containers on the Docker engine: what every container
//! steppe starts shares (its labels, its host settings, its removal however
//! the step ends) and the sweep of those a dead process left.

pub mod images;
pub mod task;
pub mod toolbox;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bollard::models::HostConfig;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use bollard::Docker;
use steppe_runtime::assignment::{Assignment, ContainerSettings};
use tokio::sync::Notify;

pub use task::{start, Running};

/// Where the step's directory is mounted inside the container.
pub const WORKDIR: &str = "/workspace";
/// Every container steppe starts carries this label (its assignment id, or
/// the agent's name for a tool container).
pub const LABEL: &str = "steppe.assignment";
/// And this one: the process that started it (host:pid:start).
pub const OWNER: &str = "steppe.owner";
/// And these: the run and the step it belongs to (for `docker ps` readers).
pub const RUN: &str = "steppe.run";
pub const STEP: &str = "steppe.step";

/// The engine (`$DOCKER_HOST`: unix:// or tcp://, else the local socket),
/// its API version negotiated (these machines speak 1.41).
pub async fn engine() -> Result<Docker, String> {
    let d = Docker::connect_with_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
    let d = d.negotiate_version().await.map_err(|e| format!("the Docker engine does not answer: {e}"))?;
    d.ping().await.map_err(|e| format!("the Docker engine does not answer: {e}"))?;
    Ok(d)
}

/// The labels of a container started for assignment `id`, step `step` of run `run`.
fn labels(id: &str, run: &str, step: &str) -> std::collections::HashMap<String, String> {
    [
        (LABEL.to_string(), id.to_string()),
        (OWNER.to_string(), steppe_runtime::store::this_owner().to_string()),
        (RUN.to_string(), run.to_string()),
        (STEP.to_string(), step.to_string()),
    ]
    .into()
}

/// The invoking user's ids (the default `user:` on Linux, as the reference):
/// what a step writes stays the user's.
fn user_of(c: &ContainerSettings) -> String {
    // SAFETY: getuid and getgid cannot fail and touch no memory.
    c.user.clone().unwrap_or_else(|| format!("{}:{}", unsafe { libc::getuid() }, unsafe { libc::getgid() }))
}

/// The engine's settings of a container holding `dir` as its working
/// directory: the only mount, `network:`, `privileged:` and the limits.
/// Unless privileged, it may not make device nodes (`CAP_MKNOD`, which
/// Docker grants by default): one left in the step's directory by a root
/// shell would be the host's device to whatever opens it there later (a
/// task on the host, the artifact store).
fn host_config(c: &ContainerSettings, dir: &Path, read_only_root: bool) -> HostConfig {
    HostConfig {
        binds: Some(vec![format!("{}:{WORKDIR}", dir.display())]),
        network_mode: c.network.clone(),
        privileged: Some(c.privileged),
        cap_drop: (!c.privileged).then(|| vec!["MKNOD".to_string()]),
        cpu_shares: c.cpu_shares,
        memory: c.memory_bytes,
        readonly_rootfs: Some(read_only_root),
        ..Default::default()
    }
}

/// A container that runs as a `user:` other than the invoking one must be
/// able to write the step's directory and its outputs: those directories
/// (never the files inputs hold, which may be the artifact store's own) are
/// opened to every user. They sit in the process's private scratch
/// directory, which no other user of this host can enter.
fn open_for(c: &ContainerSettings, dir: &Path, outputs: &[String]) {
    use std::os::unix::fs::PermissionsExt;
    if c.user.is_none() {
        return;
    }
    for d in std::iter::once(dir.to_path_buf()).chain(outputs.iter().map(|o| dir.join(o))) {
        let _ = std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777));
    }
}

/// The values of the declared names this process has, as `NAME=value`.
fn env_of(names: &[String]) -> Vec<String> {
    names.iter().filter_map(|n| std::env::var(n).ok().map(|v| format!("{n}={v}"))).collect()
}

/// Removes the container when dropped, whatever happened. The removal goes
/// on beside the step's next work; a process waits for it before it ends
/// ([`removals_settled`]), so no container outlives the run that made it.
struct Removed {
    docker: Docker,
    id: String,
}

impl Drop for Removed {
    fn drop(&mut self) {
        let (docker, id) = (self.docker.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let pending = Removing::begin();
            rt.spawn(async move {
                let _pending = pending;
                let _ = docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::default().force(true).build())).await;
            });
        }
    }
}

/// Removals asked of the engine and not answered yet.
static REMOVING: AtomicUsize = AtomicUsize::new(0);
/// Told when the last of them is answered (or dropped with its runtime).
static SETTLED: Notify = Notify::const_new();

/// One removal in flight, counted until dropped.
struct Removing;

impl Removing {
    fn begin() -> Removing {
        REMOVING.fetch_add(1, Ordering::SeqCst);
        Removing
    }
}

impl Drop for Removing {
    fn drop(&mut self) {
        if REMOVING.fetch_sub(1, Ordering::SeqCst) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// Waits, for at most `limit`, until every container removal this process
/// asked for is answered: a process calls it as it ends, before its runtime
/// (and with it a removal still on its way) is dropped. How many are left.
pub async fn removals_settled(limit: Duration) -> usize {
    let settled = async {
        loop {
            // Waiting from here on: a removal answered after the count is read still wakes it.
            let told = SETTLED.notified();
            if REMOVING.load(Ordering::SeqCst) == 0 {
                return;
            }
            told.await;
        }
    };
    let _ = tokio::time::timeout(limit, settled).await;
    REMOVING.load(Ordering::SeqCst)
}

/// Removes the containers a process of this host left when it died (killed
/// with -9, its machine's power cut): their owner's pid is gone. Returns how many.
pub async fn sweep_orphans() -> usize {
    let Ok(docker) = engine().await else { return 0 };
    let filters: std::collections::HashMap<&str, Vec<&str>> = [("label", vec![OWNER])].into();
    let Ok(found) = docker.list_containers(Some(bollard::query_parameters::ListContainersOptionsBuilder::default().all(true).filters(&filters).build())).await else { return 0 };
    let host = steppe_runtime::store::this_owner().split(':').next().unwrap_or_default().to_string();
    let mut removed = 0;
    for c in found {
        let owner = c.labels.as_ref().and_then(|l| l.get(OWNER)).cloned().unwrap_or_default();
        let mut parts = owner.split(':');
        let (Some(h), Some(pid)) = (parts.next(), parts.next().and_then(|p| p.parse::<i32>().ok())) else { continue };
        // Another host's, or a live process's: not ours to touch.
        if h != host || std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Some(id) = c.id {
            if docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::default().force(true).build())).await.is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Whether `a` is a command this build runs in an image (an agent step's
/// image holds its tools instead; see [`toolbox`]).
pub fn runs_in_image(a: &Assignment) -> bool {
    a.image.is_some() && a.agent.is_none() && matches!(a.cwd, steppe_runtime::assignment::Cwd::StepDir | steppe_runtime::assignment::Cwd::CaptureSelf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's end waits for the removals in flight, and no longer than it is told.
    #[tokio::test]
    async fn an_ending_process_waits_for_its_removals_and_no_longer_than_told() {
        assert_eq!(removals_settled(Duration::from_millis(10)).await, 0, "none asked for, none waited for");
        let (quick, slow) = (Removing::begin(), Removing::begin());
        let answered = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(quick);
        });
        assert_eq!(removals_settled(Duration::from_millis(300)).await, 1, "the slow one is still out when the wait runs out");
        answered.await.expect("the quick one answered");
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(slow);
        });
        let woken = tokio::time::timeout(Duration::from_secs(5), removals_settled(Duration::from_secs(3600))).await;
        assert_eq!(woken, Ok(0), "woken when the last one is answered, not at the end of its wait");
        later.await.expect("the slow one answered");
    }
}
