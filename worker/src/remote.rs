//! `steppe worker`: a worker in its own process, holding one gRPC session with
//! the coordinator — assignments and cancellations in, output lines, results
//! and heartbeats out.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use steppe_proto::v1::coordinator_client::CoordinatorClient;
use steppe_proto::v1::{coordinator_message, worker_message, Drain, Heartbeat, Hello, OutputLine, Release, WorkerMessage};
use steppe_shared::artifacts::{ArtifactStore, LocalArtifactStore};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::exec::{execute, LineSink, Stream};
use crate::local::Cancels;
use crate::wire::{assignment_from_wire, result_to_wire};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot reach the coordinator at {url}: {source}")]
    Connect { url: String, source: tonic::transport::Error },
    #[error("the coordinator refused the session: {0}")]
    Session(#[from] tonic::Status),
    #[error("the coordinator closed the session before welcoming this worker")]
    NoWelcome,
    #[error("artifact directory {dir}: {source}")]
    Artifacts { dir: String, source: std::io::Error },
    #[error("the token holds characters a header cannot carry")]
    Token,
}

struct Lines {
    tx: mpsc::Sender<WorkerMessage>,
    id: String,
}

impl LineSink for Lines {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str) {
        let msg = WorkerMessage {
            msg: Some(worker_message::Msg::Line(OutputLine {
                run_id: run_id.to_string(),
                assignment_id: self.id.clone(),
                step: step.to_string(),
                stderr: stream == Stream::Stderr,
                line: line.to_string(),
            })),
        };
        // Output is best effort: a full channel drops the line rather than stall the step.
        let _ = self.tx.try_send(msg);
    }
}

/// Serves one coordinator until it closes the session. `token` is sent as a
/// bearer token on the session when the coordinator requires one.
pub async fn run(url: &str, slots: u32, name: &str, work_root: PathBuf, token: Option<String>) -> Result<(), WorkerError> {
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|source| WorkerError::Connect { url: url.to_string(), source })?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|source| WorkerError::Connect { url: url.to_string(), source })?;
    let header: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>> = match &token {
        Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| WorkerError::Token)?),
        None => None,
    };
    let mut client = CoordinatorClient::with_interceptor(channel, move |mut req: tonic::Request<()>| {
        if let Some(h) = &header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    });
    let (tx, rx) = mpsc::channel::<WorkerMessage>(1024);
    let _ = tx
        .send(WorkerMessage { msg: Some(worker_message::Msg::Hello(Hello { worker: name.to_string(), slots })) })
        .await;
    let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    let (store, every): (Arc<dyn ArtifactStore>, Duration) = match inbound.message().await? {
        Some(m) => match m.msg {
            Some(coordinator_message::Msg::Welcome(w)) => (
                Arc::new(
                    LocalArtifactStore::new(std::path::Path::new(&w.artifact_dir))
                        .map_err(|source| WorkerError::Artifacts { dir: w.artifact_dir.clone(), source })?,
                ),
                if w.heartbeat_ms == 0 { Duration::from_secs(5) } else { Duration::from_millis(w.heartbeat_ms.max(100)) },
            ),
            _ => return Err(WorkerError::NoWelcome),
        },
        None => return Err(WorkerError::NoWelcome),
    };
    let heartbeat_tx = tx.clone();
    let heartbeat = tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            if heartbeat_tx.send(WorkerMessage { msg: Some(worker_message::Msg::Heartbeat(Heartbeat {})) }).await.is_err() {
                return;
            }
        }
    });
    let cancels = Cancels::default();
    let mut running = tokio::task::JoinSet::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut draining = false;
    loop {
        let sigterm = async {
            match term.as_mut() {
                Some(t) if !draining => {
                    t.recv().await;
                }
                _ => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = sigterm => {
                // SIGTERM drains: nothing new is taken, what runs finishes and reports.
                draining = true;
                eprintln!("steppe worker {name}: draining ({} running)", running.len());
                let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Drain(Drain {})) }).await;
                if running.is_empty() {
                    break;
                }
            }
            Some(_) = running.join_next(), if !running.is_empty() => {
                if draining && running.is_empty() {
                    break;
                }
            }
            m = inbound.message() => {
                // A session that ends, cleanly or not, means the coordinator is gone.
                let Ok(Some(m)) = m else { break };
                match m.msg {
                    Some(coordinator_message::Msg::Assignment(wa)) if draining => {
                        let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Release(Release { assignment_id: wa.id })) }).await;
                    }
                    Some(coordinator_message::Msg::Assignment(wa)) => {
                        let a = assignment_from_wire(wa);
                        let (tx, store, work_root, cancels) = (tx.clone(), store.clone(), work_root.clone(), cancels.clone());
                        running.spawn(async move {
                            let cancel = cancels.register(&a.id);
                            let sink = Arc::new(Lines { tx: tx.clone(), id: a.id.clone() });
                            let r = execute(&a, store, &work_root, sink, cancel).await;
                            cancels.done(&a.id);
                            let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Result(result_to_wire(&r))) }).await;
                        });
                    }
                    Some(coordinator_message::Msg::Cancel(c)) => {
                        cancels.cancel(&c.assignment_id);
                    }
                    Some(coordinator_message::Msg::Welcome(_)) | None => {}
                }
            }
        }
    }
    heartbeat.abort();
    if draining {
        // Close our side only now, and wait for the coordinator to close its
        // side: that is when it has read every result we sent (an exit right
        // away could lose the last one, and the step would run again).
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = inbound.message().await {} }).await;
    }
    Ok(())
}
