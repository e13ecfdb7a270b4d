//! A step's command in an image on the Docker engine: the step's fresh
//! directory mounted as its working directory (nothing else of the host),
//! `sh -c` inside, the image's environment plus the declared names, output
//! streamed and captured as on the host; the container is removed however
//! the step ends (its future dropped included).

use std::path::Path;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use steppe_runtime::assignment::Assignment;
use steppe_runtime::outcome::StepError;
use tokio::io::AsyncWriteExt;

/// Where the step's directory is mounted inside the container.
pub const WORKDIR: &str = "/workspace";
/// Every container steppe starts carries this label (its assignment id).
pub const LABEL: &str = "steppe.assignment";
/// And this one: the process that started it (host:pid:start).
pub const OWNER: &str = "steppe.owner";

/// The engine, its API version negotiated (these machines speak 1.41).
pub async fn engine() -> Result<Docker, String> {
    let d = Docker::connect_with_socket_defaults().map_err(|e| format!("no Docker engine: {e}"))?;
    d.negotiate_version().await.map_err(|e| format!("the Docker engine does not answer: {e}"))
}

/// Removes the container when dropped, whatever happened.
struct Removed {
    docker: Docker,
    id: String,
}

impl Drop for Removed {
    fn drop(&mut self) {
        let (docker, id) = (self.docker.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = docker.remove_container(&id, Some(RemoveContainerOptionsBuilder::default().force(true).build())).await;
            });
        }
    }
}

/// What the run gives back: exit code (None when it was stopped) and the
/// two streams' readers, to be read as a host command's pipes are.
pub struct Running {
    streams: std::sync::Mutex<Option<(tokio::io::DuplexStream, tokio::io::DuplexStream)>>,
    docker: Docker,
    id: String,
    _removed: Removed,
}

/// Creates and starts the container of `a` running `command` in `dir`.
pub async fn start(a: &Assignment, image: &str, command: &str, dir: &Path) -> Result<Running, StepError> {
    let docker = engine().await.map_err(|e| StepError::errored(format!("{}: image \"{image}\": {e}", a.step)))?;
    let env: Vec<String> = a.env.iter().filter_map(|n| std::env::var(n).ok().map(|v| format!("{n}={v}"))).collect();
    // The invoking user's ids by default (as the reference on Linux): the
    // step's files stay the user's.
    let c = &a.container;
    let user = c.user.clone().unwrap_or_else(|| format!("{}:{}", unsafe { libc::getuid() }, unsafe { libc::getgid() }));
    let config = ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(vec!["sh".into(), "-c".into(), command.to_string()]),
        working_dir: Some(WORKDIR.into()),
        env: Some(env),
        user: Some(user),
        labels: Some([(LABEL.to_string(), a.id.clone()), (OWNER.to_string(), steppe_runtime::store::this_owner().to_string())].into()),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        host_config: Some(HostConfig {
            binds: Some(vec![format!("{}:{WORKDIR}", dir.display())]),
            network_mode: c.network.clone(),
            privileged: Some(c.privileged),
            cpu_shares: c.cpu_shares,
            memory: c.memory_bytes,
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker.create_container(Some(CreateContainerOptionsBuilder::default().build()), config).await.map_err(|e| {
        let text = e.to_string();
        if text.contains("No such image") || text.contains("404") {
            StepError::errored(format!(
                "{}: image \"{image}\" is not on this Docker engine and no registry was reached: build it (docker build -t {image} …) or load it (docker load -i FILE, docker import ROOTFS.tar {image})",
                a.step
            ))
        } else {
            StepError::errored(format!("{}: image \"{image}\": creating its container: {text}", a.step))
        }
    })?;
    let removed = Removed { docker: docker.clone(), id: created.id.clone() };
    docker.start_container(&created.id, None).await.map_err(|e| StepError::errored(format!("{}: image \"{image}\": starting its container: {e}", a.step)))?;
    // The engine's log stream split into two pipes, read like a process's.
    let (out_w, stdout) = tokio::io::duplex(64 * 1024);
    let (err_w, stderr) = tokio::io::duplex(64 * 1024);
    let mut logs = docker.logs(&created.id, Some(LogsOptionsBuilder::default().follow(true).stdout(true).stderr(true).build()));
    tokio::spawn(async move {
        let (mut out_w, mut err_w) = (out_w, err_w);
        while let Some(Ok(chunk)) = logs.next().await {
            let _ = match chunk {
                bollard::container::LogOutput::StdErr { message } => err_w.write_all(&message).await,
                other => out_w.write_all(&other.into_bytes()).await,
            };
        }
    });
    Ok(Running { streams: std::sync::Mutex::new(Some((stdout, stderr))), docker, id: created.id, _removed: removed })
}

impl Running {
    /// The command's stdout and stderr (once).
    pub fn streams(&self) -> (tokio::io::DuplexStream, tokio::io::DuplexStream) {
        match self.streams.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(s) => s,
            None => (tokio::io::duplex(1).1, tokio::io::duplex(1).1),
        }
    }

    /// Waits for the command to end: its exit code.
    pub async fn wait(&self) -> Option<i32> {
        let mut w = self.docker.wait_container(&self.id, Some(WaitContainerOptionsBuilder::default().condition("not-running").build()));
        match w.next().await {
            Some(Ok(r)) => i32::try_from(r.status_code).ok(),
            // A non-zero exit comes as an error carrying the code.
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => i32::try_from(code).ok(),
            _ => None,
        }
    }

    /// Stops it now (a timeout, a cancel).
    pub async fn kill(&self) {
        let _ = self.docker.remove_container(&self.id, Some(RemoveContainerOptionsBuilder::default().force(true).build())).await;
    }
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

/// Whether `a` is one this build runs in an image.
pub fn runs_in_image(a: &Assignment) -> bool {
    a.image.is_some() && a.agent.is_none() && matches!(a.cwd, steppe_runtime::assignment::Cwd::StepDir | steppe_runtime::assignment::Cwd::CaptureSelf)
}
