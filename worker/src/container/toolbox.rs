//! The one container an agent step's shell and custom tools run in: its
//! image, the step's directory as the only writable mount (the image's own
//! files read-only), started with the conversation and removed with it.
//! Each tool call is an exec in it; one that outlives its timeout restarts
//! the container, which kills everything the call left running and keeps
//! the step's files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, RestartContainerOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use steppe_runtime::agent_work::ContainerSettings;

use super::{env_of, host_config, labels, user_of, Removed, WORKDIR};

pub struct Toolbox {
    docker: Docker,
    id: String,
    /// The host directory mounted at [`WORKDIR`].
    root: PathBuf,
    user: String,
    env: Vec<String>,
    pub image: String,
    _removed: Removed,
}

/// What one command in the toolbox gave: each stream's kept bytes and its
/// whole length, and the exit code.
pub struct Ran {
    pub stdout: (Vec<u8>, usize),
    pub stderr: (Vec<u8>, usize),
    pub exit_code: i64,
}

impl Toolbox {
    /// Starts the container of agent `agent`'s conversation in run `run`
    /// holding `root`; `say` hears an image pull.
    pub async fn start(agent: &str, run: &str, image: &str, settings: &ContainerSettings, env: &[String], root: &Path, say: &(dyn Fn(&str) + Sync)) -> Result<Toolbox, String> {
        let docker = super::engine().await.map_err(|e| format!("image \"{image}\": {e}"))?;
        super::images::ensure(&docker, image, say).await?;
        let user = user_of(settings);
        // Its outputs are the step directory's empty directories as it starts.
        let outputs: Vec<String> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()) && std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_none()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        super::open_for(settings, root, &outputs);
        let config = ContainerCreateBody {
            image: Some(image.to_string()),
            // Kept alive by a shell waiting on a stdin nobody writes to: no
            // binary but `sh` is needed in the image.
            entrypoint: Some(vec!["sh".into(), "-c".into()]),
            cmd: Some(vec!["read forever".into()]),
            open_stdin: Some(true),
            working_dir: Some(WORKDIR.into()),
            user: Some(user.clone()),
            labels: Some(labels(&format!("{run}/{agent}"), run, agent)),
            host_config: Some(host_config(settings, root, true)),
            ..Default::default()
        };
        let created = docker
            .create_container(Some(CreateContainerOptionsBuilder::default().build()), config)
            .await
            .map_err(|e| format!("image \"{image}\": creating the tools' container: {e}"))?;
        let removed = Removed { docker: docker.clone(), id: created.id.clone() };
        docker.start_container(&created.id, None).await.map_err(|e| format!("image \"{image}\": starting the tools' container: {e}"))?;
        Ok(Toolbox { docker, id: created.id, root: root.to_path_buf(), user, env: env_of(env), image: image.to_string(), _removed: removed })
    }

    /// Where host path `p` (inside the mounted directory) is in the container.
    pub fn inside(&self, p: &Path) -> String {
        match p.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => WORKDIR.to_string(),
            Ok(rel) => format!("{WORKDIR}/{}", rel.display()),
            Err(_) => WORKDIR.to_string(),
        }
    }

    /// `sh -c cmd` in the container with `cwd` (a host path under the
    /// mounted directory) as its working directory; each stream kept up to
    /// `keep` bytes. A timeout restarts the container (killing whatever
    /// the command started) and says so.
    pub async fn run(&self, cmd: &str, cwd: &Path, timeout: Option<Duration>, keep: usize) -> Result<Ran, String> {
        let exec = self
            .docker
            .create_exec(
                &self.id,
                CreateExecOptions {
                    cmd: Some(vec!["sh".to_string(), "-c".to_string(), cmd.to_string()]),
                    working_dir: Some(self.inside(cwd)),
                    env: Some(self.env.clone()),
                    user: Some(self.user.clone()),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| format!("cannot run the command in image \"{}\": {e}", self.image))?;
        let started = self.docker.start_exec(&exec.id, None).await.map_err(|e| format!("cannot run the command in image \"{}\": {e}", self.image))?;
        let StartExecResults::Attached { mut output, .. } = started else {
            return Err("the engine did not attach to the command".to_string());
        };
        let mut out: (Vec<u8>, usize) = (Vec::new(), 0);
        let mut err: (Vec<u8>, usize) = (Vec::new(), 0);
        let read = async {
            while let Some(Ok(chunk)) = output.next().await {
                let (to, bytes) = match chunk {
                    bollard::container::LogOutput::StdErr { message } => (&mut err, message),
                    other => (&mut out, other.into_bytes()),
                };
                to.1 += bytes.len();
                let room = keep.saturating_sub(to.0.len());
                to.0.extend_from_slice(&bytes[..bytes.len().min(room)]);
            }
        };
        match timeout {
            Some(t) => {
                if tokio::time::timeout(t, read).await.is_err() {
                    let restarted = self.docker.restart_container(&self.id, Some(RestartContainerOptionsBuilder::default().t(0).build())).await;
                    let note = match restarted {
                        Ok(()) => "its container was restarted (files in the step's directory are kept)".to_string(),
                        Err(e) => format!("restarting its container failed: {e}"),
                    };
                    return Err(format!("command timed out after {}; {note}", steppe_language::duration::show(t)));
                }
            }
            None => read.await,
        }
        // The stream can end a moment before the engine records the exit.
        for _ in 0..50 {
            let inspected = self.docker.inspect_exec(&exec.id).await.map_err(|e| format!("the command's exit status is unknown: {e}"))?;
            if inspected.running != Some(true) {
                return Ok(Ran { stdout: out, stderr: err, exit_code: inspected.exit_code.unwrap_or(-1) });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err("the command's exit status is unknown: the engine still reports it running".to_string())
    }
}
