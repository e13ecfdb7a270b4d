//! The process-wide parts every run shares, started once per process, and
//! the engine that puts one loaded pipeline on them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use steppe_language::LoadOptions;

use crate::{artifacts, dispatch, engine, history, registry, runs_service, service};

/// The process-wide parts every run shares: the artifact store, the queue and
/// Dispatcher, the EventHub (with the run store), the WorkerRegistry, local
/// worker loops, and (with a listener) the worker and submission services.
pub struct Services {
    pub store: Arc<dyn steppe_runtime::artifacts::ArtifactStore>,
    pub dispatcher: Arc<dispatch::Dispatcher>,
    pub out: Arc<crate::event_hub::EventHub>,
    pub registry: registry::WorkerRegistry,
    pub cancel_tx: Arc<tokio::sync::watch::Sender<bool>>,
    pub cancel_rx: tokio::sync::watch::Receiver<bool>,
    /// Where submitted pipelines are unpacked.
    pub state: PathBuf,
    /// This process's scratch directory (step directories, temporaries);
    /// the command that made it removes it.
    pub scratch: PathBuf,
}

/// The Redis stream assignments wait on (workers started with --queue read it too).
pub const QUEUE_KEY: &str = "steppe:assignments";

/// How long a remote worker may stay silent before it is fenced (three heartbeats).
pub const DEFAULT_WORKER_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// What `steppe coordinator` sets beyond embedded mode.
pub struct ClusterOptions {
    /// Where assignments wait, a queue per worker pool (default: in process).
    pub pools: Option<steppe_runtime::queue::Pools>,
    pub worker_lease: std::time::Duration,
    /// The shared artifact directory (default: `<state>/artifacts`).
    pub artifacts: Option<PathBuf>,
    /// Serve TLS with this certificate and key.
    pub tls: Option<tonic::transport::Identity>,
    /// A `steppe coordinator` (workers wait for it to come back), not a
    /// run's own listener (workers exit when it goes).
    pub long_lived: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions { pools: None, worker_lease: DEFAULT_WORKER_LEASE, artifacts: None, tls: None, long_lived: false }
    }
}

/// Starts the shared parts; `state` holds artifacts (and submissions), `db` the run store.
pub async fn start_services(state: &Path, db: &Path, scratch: &Path, slots: usize, quiet: bool, listen: Option<std::net::SocketAddr>) -> Result<Arc<Services>> {
    let runs: Arc<dyn steppe_runtime::store::Store> = Arc::new(steppe_runtime::store::SqliteStore::open(db)?);
    start_services_with(state, runs, scratch, slots, quiet, listen, None, ClusterOptions::default()).await
}

/// As [`start_services`], on `queue` (the in-process queue when `None`).
#[allow(clippy::too_many_arguments)]
pub async fn start_services_with(
    state: &Path,
    runs: Arc<dyn steppe_runtime::store::Store>,
    scratch: &Path,
    slots: usize,
    quiet: bool,
    listen: Option<std::net::SocketAddr>,
    token: Option<String>,
    cluster: ClusterOptions,
) -> Result<Arc<Services>> {
    use steppe_runtime::artifacts::LocalArtifactStore;
    use steppe_runtime::queue::InProcessQueue;
    let ClusterOptions { pools, worker_lease, artifacts, tls, long_lived } = cluster;
    let artifact_dir = artifacts.unwrap_or_else(|| state.join("artifacts"));
    let local_store = LocalArtifactStore::new(&artifact_dir).with_context(|| format!("creating {}", artifact_dir.display()))?;
    let store: Arc<dyn steppe_runtime::artifacts::ArtifactStore> = Arc::new(local_store.clone());
    let artifact_dir = artifact_dir.canonicalize().unwrap_or(artifact_dir);
    let work = scratch.join("steps");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    if slots == 0 && listen.is_none() {
        anyhow::bail!("--workers 0 leaves nobody to run steps; add --listen ADDR and start `steppe worker`s");
    }
    let history_store = runs.clone();
    let out = Arc::new(crate::event_hub::EventHub::start(quiet, Some(runs)).await.context("starting the event hub")?);
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let pools = Arc::new(pools.unwrap_or_else(|| steppe_runtime::queue::Pools::in_process(Arc::new(InProcessQueue::new()))));
    if let Some(lease) = pools.default_pool().lease() {
        // Lease extension: what this process took stays its own while it
        // lives, however long the step runs.
        let (pools, out) = (pools.clone(), out.clone());
        steppe_runtime::queue::keep_leases(
            lease,
            move || {
                let pools = pools.clone();
                Box::pin(async move { pools.all().await })
            },
            move |e| out.note(&format!("could not renew queue leases: {e}")),
        );
    }
    let dispatcher = dispatch::Dispatcher::start(pools, Some(out.clone())).await.context("starting the dispatcher")?;
    let registry = registry::WorkerRegistry::start(out.clone()).await.context("starting the worker registry")?;
    steppe_worker::local::spawn_local_workers(slots, dispatcher.pools.default_pool().clone(), store.clone(), work, out.clone(), dispatcher.clone(), dispatcher.local.clone());
    if slots > 0 {
        registry.joined("local", slots as u32, false, steppe_runtime::queue::DEFAULT_POOL);
    }
    let svc = Arc::new(Services { store, dispatcher, out, registry, cancel_tx: Arc::new(cancel_tx), cancel_rx, state: state.to_path_buf(), scratch: scratch.to_path_buf() });
    if let Some(addr) = listen {
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
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let mut server = tonic::transport::Server::builder().tcp_nodelay(true);
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
    }
    Ok(svc)
}

/// An engine for one loaded pipeline on the shared services (sharing their
/// Ctrl-C switch).
pub fn make_engine(svc: &Services, loaded: &steppe_language::Loaded, answers: Vec<(String, String)>, scripted: Option<(String, Option<String>)>) -> Arc<engine::Engine> {
    Arc::new(make_engine_with(svc, loaded, answers, scripted, svc.cancel_tx.clone(), svc.cancel_rx.clone()))
}

/// As [`make_engine`], with an abort switch of its own (a submission).
pub fn make_engine_with(
    svc: &Services,
    loaded: &steppe_language::Loaded,
    answers: Vec<(String, String)>,
    scripted: Option<(String, Option<String>)>,
    cancel_tx: Arc<tokio::sync::watch::Sender<bool>>,
    cancel_rx: tokio::sync::watch::Receiver<bool>,
) -> engine::Engine {
    let dir = if loaded.dir.as_os_str().is_empty() { PathBuf::from(".") } else { loaded.dir.clone() };
    engine::Engine {
        pipeline: Arc::new(loaded.pipeline.clone()),
        dir,
        decide_with: loaded.path.display().to_string(),
        pool: String::new(),
        store: svc.store.clone(),
        dispatcher: svc.dispatcher.clone(),
        out: svc.out.clone(),
        cancel: cancel_rx,
        cancel_tx,
        env_model: LoadOptions::from_env(Default::default()).env_model,
        scripted: scripted.as_ref().map(|(p, _)| p.clone()),
        scripted_fallback: scripted.and_then(|(_, f)| f),
        answers,
        submission: None,
        scratch: svc.scratch.clone(),
    }
}

pub fn parse_answers(answers: &[String]) -> Result<Vec<(String, String)>> {
    answers
        .iter()
        .map(|a| match a.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(anyhow::anyhow!("--answer {a}: expected SUBSTRING=ANSWER")),
        })
        .collect()
}
