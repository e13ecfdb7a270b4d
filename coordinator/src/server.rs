//! The gRPC server of a process that serves others: remote workers
//! (Coordinator), their artifacts, submissions (Runs) and history, every
//! call behind the token check.

use std::sync::Arc;

use anyhow::{Context, Result};

use crate::services::{Services, QUEUE_KEY};
use crate::{artifacts, history, runs_service, service};

/// How long a remote worker may stay silent before it is fenced (three heartbeats).
pub const DEFAULT_WORKER_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// How the server is reached and what it asks of its clients.
pub struct ServeOptions {
    /// Every call must carry this bearer token.
    pub token: Option<String>,
    /// Serve TLS with this certificate and key.
    pub tls: Option<tonic::transport::Identity>,
    pub worker_lease: std::time::Duration,
    /// A `steppe coordinator` (workers wait for it to come back), not a
    /// run's own listener (workers exit when it goes).
    pub long_lived: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { token: None, tls: None, worker_lease: DEFAULT_WORKER_LEASE, long_lived: false }
    }
}

/// Binds `addr` and serves the services there until the process ends.
pub fn serve(svc: &Arc<Services>, addr: std::net::SocketAddr, opts: ServeOptions) -> Result<()> {
    let ServeOptions { token, tls, worker_lease, long_lived } = opts;
    let slots = svc.slots;
    let local_store = svc.local_store.clone();
    let artifact_dir = svc.artifact_dir.clone();
    let history_store = svc.out.store().cloned().context("the services have no run store")?;
    let listener = std::net::TcpListener::bind(addr).with_context(|| format!("--listen {addr}"))?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let bound = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    svc.out.note(&format!("serving workers on {bound}{}", if tls.is_some() { " (TLS)" } else { "" }));
    if slots == 0 {
        let (registry, out) = (svc.registry.clone(), svc.out.clone());
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            if registry.list().await.is_empty() {
                out.note(&format!("no workers yet: start one with `steppe worker --coordinator {scheme}://{bound}`"));
            }
        });
    }
    let store_id = local_store.store_id().with_context(|| format!("marking {}", artifact_dir.display()))?;
    let pull_queue = svc.dispatcher.pools.default_pool().lease().map(|lease| (QUEUE_KEY.to_string(), lease));
    let workers = service::WorkerService {
        dispatcher: svc.dispatcher.clone(),
        sink: svc.out.clone(),
        artifact_dir,
        store_id,
        store: svc.store.clone(),
        registry: svc.registry.clone(),
        lease: worker_lease,
        pull_queue,
        ephemeral: !long_lived,
        scratch: svc.scratch.clone(),
    };
    let artifacts = artifacts::ArtifactService { store: local_store };
    let runs = runs_service::RunService { svc: svc.clone(), active: Default::default() };
    let history = history::HistoryService { store: history_store };
    let out = svc.out.clone();
    let auth = steppe_runtime::auth::TokenCheck::new(token, std::sync::Arc::new(move |peer: &str| out.note(&format!("refused an unauthenticated call from {peer}"))));
    // The listener is ours (bound before serving, to say the address), so the
    // accepted sockets get TCP_NODELAY here: a short reply must not wait for
    // the peer's delayed ACK (40 ms a cancel or a Taken once took).
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let mut server = tonic::transport::Server::builder();
    if let Some(identity) = tls {
        server = server.tls_config(tonic::transport::ServerTlsConfig::new().identity(identity)).context("--tls-cert/--tls-key")?;
    }
    tokio::spawn(async move {
        let r = server
            .add_service(steppe_proto::v1::coordinator_server::CoordinatorServer::with_interceptor(workers, auth.clone()))
            .add_service(steppe_proto::v1::runs_server::RunsServer::with_interceptor(runs, auth.clone()))
            .add_service(steppe_proto::v1::history_server::HistoryServer::with_interceptor(history, auth.clone()))
            .add_service(steppe_proto::v1::artifacts_server::ArtifactsServer::with_interceptor(artifacts, auth))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = r {
            warn!("steppe: worker service stopped: {e}");
        }
    });
    Ok(())
}
