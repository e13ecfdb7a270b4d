//! The gRPC server of a process that serves others: remote workers
//! (Coordinator), their artifacts, submissions (Runs) and history, every
//! call behind the token check.

use std::sync::Arc;

use anyhow::{Context, Result};

use steppe_runtime::auth::{AuthFile, Callers, TokenCheck};

use crate::event_hub::EventHub;
use crate::services::{queue_key, Services, DEFAULT_REDIS_PREFIX};
use crate::{artifacts, history, runs_service, service};

/// How long a remote worker may stay silent before it is fenced (three heartbeats).
pub const DEFAULT_WORKER_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// Who may call: the entries of an `--auth` file (teams and roles), and
/// the one admin token of `--token-file`; neither lets every call in.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    pub file: Option<std::path::PathBuf>,
    pub admin_token: Option<String>,
}

impl Auth {
    /// The callers as the files say now.
    pub fn load(&self) -> Result<Option<AuthFile>> {
        let mut callers = match &self.file {
            Some(f) => Some(AuthFile::read(f).map_err(anyhow::Error::msg)?),
            None => None,
        };
        if let Some(t) = &self.admin_token {
            callers = Some(callers.unwrap_or_default().with_admin_token(t));
        }
        Ok(callers)
    }
}

/// How the server is reached and what it asks of its clients.
pub struct ServeOptions {
    pub auth: Auth,
    /// Serve TLS with this certificate and key.
    pub tls: Option<tonic::transport::Identity>,
    pub worker_lease: std::time::Duration,
    /// A `steppe coordinator` (workers wait for it to come back), not a
    /// run's own listener (workers exit when it goes).
    pub long_lived: bool,
    /// The Redis stream of the default pool, told to workers that take
    /// from the queue themselves.
    pub queue_key: String,
    /// Serve the dashboard here too (signing in with the same tokens).
    pub web: Option<std::net::SocketAddr>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions { auth: Auth::default(), tls: None, worker_lease: DEFAULT_WORKER_LEASE, long_lived: false, queue_key: queue_key(DEFAULT_REDIS_PREFIX), web: None }
    }
}

/// Binds `addr` and serves the services there until the process ends.
pub fn serve(svc: &Arc<Services>, addr: std::net::SocketAddr, opts: ServeOptions) -> Result<()> {
    let ServeOptions { auth, tls, worker_lease, long_lived, queue_key, web } = opts;
    let callers: Callers = Arc::new(std::sync::RwLock::new(auth.load()?));
    if auth.file.is_some() {
        reload_on_sighup(auth, callers.clone(), svc.out.clone());
    }
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
    if let Some(addr) = web {
        let fleet = crate::web::Fleet { registry: svc.registry.clone(), dispatcher: svc.dispatcher.clone() };
        let web = crate::web::Web::new(history_store.clone(), Some(callers.clone()), Some(fleet))?;
        let bound = crate::web::serve(addr, web).with_context(|| format!("--web {addr}"))?;
        svc.out.note(&format!("dashboard on http://{bound}/"));
    }
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
    let pull_queue = svc.dispatcher.pools.default_pool().lease().map(|lease| (queue_key.clone(), lease));
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
        callers: callers.clone(),
        artifact_url: svc.object_store.clone().unwrap_or_default(),
    };
    let artifacts = artifacts::ArtifactService { store: local_store };
    let runs = runs_service::RunService { svc: svc.clone(), active: Default::default(), callers: callers.clone(), model_host: bound.ip(), trace_parent: None };
    runs.take_over_orphans();
    let history = history::HistoryService { store: history_store };
    let out = svc.out.clone();
    let auth = TokenCheck::with_callers(callers, Arc::new(move |peer: &str, why: &str| out.note(&format!("refused a call from {peer}: {why}"))));
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

/// SIGHUP: the `--auth` file is read again and takes effect for the next
/// call (a removed entry's token is refused from then on). A file that does
/// not read leaves the callers as they were, and says why.
fn reload_on_sighup(auth: Auth, callers: Callers, out: Arc<EventHub>) {
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else { return };
        while hup.recv().await.is_some() {
            let a = auth.clone();
            match tokio::task::spawn_blocking(move || a.load()).await {
                Ok(Ok(now)) => {
                    let n = now.as_ref().map_or(0, AuthFile::len);
                    *callers.write().unwrap_or_else(|p| p.into_inner()) = now;
                    out.note(&format!("reloaded --auth: {n} caller(s)"));
                }
                Ok(Err(e)) => out.note(&format!("--auth not reloaded (the callers stay as they were): {e:#}")),
                Err(e) => out.note(&format!("--auth not reloaded: {e}")),
            }
        }
    });
}
