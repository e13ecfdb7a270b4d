//! A step's command in an image: the step's fresh directory mounted as its
//! working directory (nothing else of the host), `sh -c` inside, the image's
//! environment plus the declared names, the engine's log stream split into
//! two pipes read like a process's.

use std::path::Path;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder};
use bollard::Docker;
use futures::StreamExt;
use steppe_runtime::assignment::Assignment;
use steppe_runtime::outcome::StepError;
use tokio::io::AsyncWriteExt;

use super::{env_of, host_config, labels, user_of, Removed, WORKDIR};
use crate::sink::LineSink;

/// A started container: its exit code (None when it was stopped) and its
/// two streams, to be read as a host command's pipes are.
pub struct Running {
    streams: std::sync::Mutex<Option<(tokio::io::DuplexStream, tokio::io::DuplexStream)>>,
    docker: Docker,
    id: String,
    _removed: Removed,
}

/// Creates and starts the container of `a` running `command` in `dir`
/// (pulling the image first when the engine lacks it, saying so on `sink`).
pub async fn start(a: &Assignment, image: &str, command: &str, dir: &Path, sink: &std::sync::Arc<dyn LineSink>) -> Result<Running, StepError> {
    let docker = super::engine().await.map_err(|e| StepError::errored(format!("{}: image \"{image}\": {e}", a.step)))?;
    let say = |line: &str| sink.line(&a.run_id, &a.step, crate::sink::Stream::Stderr, line);
    super::images::ensure(&docker, image, &say).await.map_err(|e| StepError::errored(format!("{}: {e}", a.step)))?;
    let c = &a.container;
    super::open_for(c, dir, &a.outputs);
    let config = ContainerCreateBody {
        image: Some(image.to_string()),
        // `sh -c` whatever the image's own entrypoint (`steppe`'s image has one).
        entrypoint: Some(vec!["sh".into(), "-c".into()]),
        cmd: Some(vec![command.to_string()]),
        working_dir: Some(WORKDIR.into()),
        env: Some(env_of(&a.env)),
        user: Some(user_of(c)),
        labels: Some(labels(&a.id, &a.run_id, &a.step)),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        host_config: Some(host_config(c, dir, false)),
        ..Default::default()
    };
    let created = docker
        .create_container(Some(CreateContainerOptionsBuilder::default().build()), config)
        .await
        .map_err(|e| StepError::errored(format!("{}: image \"{image}\": creating its container: {e}", a.step)))?;
    let removed = Removed { docker: docker.clone(), id: created.id.clone() };
    // Attached before it starts, as `docker run` does: a logs request made
    // after a quick command exits can miss what the engine had not yet
    // written to its log (and attaching with the log replayed can repeat a line).
    let attached = docker
        .attach_container(&created.id, Some(AttachContainerOptionsBuilder::default().stream(true).stdout(true).stderr(true).build()))
        .await
        .map_err(|e| StepError::errored(format!("{}: image \"{image}\": attaching to its container: {e}", a.step)))?;
    docker.start_container(&created.id, None).await.map_err(|e| StepError::errored(format!("{}: image \"{image}\": starting its container: {e}", a.step)))?;
    let (out_w, stdout) = tokio::io::duplex(64 * 1024);
    let (err_w, stderr) = tokio::io::duplex(64 * 1024);
    let mut output = attached.output;
    tokio::spawn(async move {
        let (mut out_w, mut err_w) = (out_w, err_w);
        while let Some(Ok(chunk)) = output.next().await {
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
