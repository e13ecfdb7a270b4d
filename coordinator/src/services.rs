//! The process-wide parts every run shares, started once per process, and
//! the engine that puts one loaded pipeline on them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use steppe_language::LoadOptions;
use steppe_runtime::store::{check_name, Scope};

use crate::{dispatch, engine, registry};

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
    /// The artifact directory (canonical) and its store, for the services
    /// that hand artifacts to remote workers.
    pub artifact_dir: PathBuf,
    pub local_store: steppe_runtime::artifacts::LocalArtifactStore,
    /// Local worker slots (0: only remote workers run steps).
    pub slots: usize,
    /// The object store every worker uses directly, when artifacts live in one.
    pub object_store: Option<String>,
}

/// What every Redis key of an installation starts with (`--redis-prefix`).
pub const DEFAULT_REDIS_PREFIX: &str = "steppe";

/// The Redis stream assignments wait on under `prefix` (workers started
/// with --queue are told it); other pools' streams are named after it.
pub fn queue_key(prefix: &str) -> String {
    format!("{prefix}:assignments")
}

/// What `steppe coordinator` sets beyond embedded mode.
#[derive(Default)]
pub struct ClusterOptions {
    /// Where assignments wait, a queue per worker pool (default: in process).
    pub pools: Option<steppe_runtime::queue::Pools>,
    /// The shared artifact directory (default: `<state>/artifacts`).
    pub artifacts: Option<PathBuf>,
    /// Artifacts in an object store instead (`s3://BUCKET/PREFIX`); the
    /// artifact directory is then its cache here.
    pub object_store: Option<String>,
    /// Lines go to the process log (`tracing`, naming each line's run)
    /// rather than a terminal.
    pub log: bool,
}

/// Starts the shared parts; `state` holds artifacts (and submissions), `db`
/// the run store. `serving`: remote workers will be served (`crate::server`).
pub async fn start_services(state: &Path, db: &Path, scratch: &Path, slots: usize, quiet: bool, serving: bool) -> Result<Arc<Services>> {
    start_services_opening(state, OpeningStore::later(db), scratch, slots, quiet, serving).await
}

/// As [`start_services`], with a store that may be opening already.
pub async fn start_services_opening(state: &Path, db: OpeningStore, scratch: &Path, slots: usize, quiet: bool, serving: bool) -> Result<Arc<Services>> {
    let runs: Arc<dyn steppe_runtime::store::Store> = Arc::new(db.opened()?);
    start_services_with(state, runs, scratch, slots, quiet, serving, ClusterOptions::default()).await
}

/// A pipeline's run store (`.steppe/<file>.db`), opened on a thread of its
/// own while the pipeline loads when it exists already; one that does not
/// is made only once the pipeline has loaded (an invalid one makes none).
pub struct OpeningStore {
    db: PathBuf,
    opening: Option<std::thread::JoinHandle<Result<steppe_runtime::store::SqliteStore, steppe_runtime::store::StoreError>>>,
}

impl OpeningStore {
    pub fn start(db: PathBuf) -> OpeningStore {
        let opening = if db.is_file() {
            let path = db.clone();
            std::thread::Builder::new().name("steppe-store".into()).spawn(move || steppe_runtime::store::SqliteStore::open(&path)).ok()
        } else {
            None
        };
        OpeningStore { db, opening }
    }

    /// Opened when it is asked for.
    pub fn later(db: &Path) -> OpeningStore {
        OpeningStore { db: db.to_path_buf(), opening: None }
    }

    fn opened(self) -> Result<steppe_runtime::store::SqliteStore> {
        match self.opening.map(|t| t.join()) {
            Some(Ok(opened)) => Ok(opened?),
            // The thread panicked (a bug): opened here, saying so if it fails again.
            Some(Err(_)) | None => Ok(steppe_runtime::store::SqliteStore::open(&self.db)?),
        }
    }
}

/// As [`start_services`], with the run store `runs` and a cluster's queue and artifact directory.
pub async fn start_services_with(state: &Path, runs: Arc<dyn steppe_runtime::store::Store>, scratch: &Path, slots: usize, quiet: bool, serving: bool, cluster: ClusterOptions) -> Result<Arc<Services>> {
    use steppe_runtime::artifacts::LocalArtifactStore;
    use steppe_runtime::queue::InProcessQueue;
    let ClusterOptions { pools, artifacts, object_store, log } = cluster;
    let artifact_dir = artifacts.unwrap_or_else(|| state.join("artifacts"));
    let local_store = LocalArtifactStore::new(&artifact_dir).with_context(|| format!("creating {}", artifact_dir.display()))?;
    let store: Arc<dyn steppe_runtime::artifacts::ArtifactStore> = match &object_store {
        Some(url) => Arc::new(steppe_cloud::s3::S3ArtifactStore::connect(url, &artifact_dir, None).await.with_context(|| format!("--artifacts {url}"))?),
        None => Arc::new(local_store.clone()),
    };
    let artifact_dir = artifact_dir.canonicalize().unwrap_or(artifact_dir);
    let work = scratch.join("steps");
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    if slots == 0 && !serving {
        anyhow::bail!("--workers 0 leaves nobody to run steps; add --listen ADDR and start `steppe worker`s");
    }
    let subscribers: Vec<Box<dyn crate::event_hub::Subscriber>> = match (log, quiet) {
        (true, _) => vec![Box::new(crate::event_hub::Log::default())],
        (false, true) => Vec::new(),
        (false, false) => vec![Box::new(crate::event_hub::Terminal::new())],
    };
    let out = Arc::new(crate::event_hub::EventHub::start_with(subscribers, Some(runs.clone())).await.context("starting the event hub")?);
    crate::liveness::start(runs, out.clone());
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
    // Local loops take the steps with an image too: a job with one starts
    // only once this process reached a Docker engine and has its images
    // (`engine::containers`), so no probe slows a run that has none.
    let containers = slots > 0;
    let local_queue: Arc<dyn steppe_runtime::queue::Queue> = if containers {
        let boxed = dispatcher.pools.get(&steppe_runtime::queue::container_pool(steppe_runtime::queue::DEFAULT_POOL)).await.context("opening the container queue")?;
        Arc::new(steppe_runtime::queue::Merged::new(boxed, dispatcher.pools.default_pool().clone()))
    } else {
        dispatcher.pools.default_pool().clone()
    };
    steppe_worker::local::spawn_local_workers(slots, local_queue, store.clone(), work, out.clone(), dispatcher.clone(), dispatcher.local.clone());
    if slots > 0 {
        registry.joined("local", slots as u32, false, steppe_runtime::queue::DEFAULT_POOL, containers);
    }
    crate::waits::tell_long_waits(dispatcher.clone(), registry.clone(), out.clone());
    Ok(Arc::new(Services {
        store,
        dispatcher,
        out,
        registry,
        cancel_tx: Arc::new(cancel_tx),
        cancel_rx,
        state: state.to_path_buf(),
        scratch: scratch.to_path_buf(),
        artifact_dir,
        local_store,
        slots,
        object_store,
    }))
}

/// An engine for one loaded pipeline on the shared services (sharing their
/// Ctrl-C switch).
pub fn make_engine(svc: &Services, loaded: &steppe_language::Loaded, scope: Scope, answers: Vec<(String, String)>, scripted: Option<(String, Option<String>)>, preflight: bool) -> Arc<engine::Engine> {
    Arc::new(engine::Engine { preflight, ..make_engine_with(svc, loaded, scope, answers, scripted, svc.cancel_tx.clone(), svc.cancel_rx.clone()) })
}

/// The name a pipeline's history goes under: `--pipeline NAME`, else the
/// file's stem (`ci.yml` → `ci`), checked to be a plain word.
pub fn pipeline_name(given: Option<&str>, file: &Path) -> Result<String> {
    let name = match given {
        Some(n) => n.to_string(),
        None => file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
    };
    check_name("pipeline", &name).map_err(|e| anyhow::anyhow!("{e}; name it with --pipeline NAME"))?;
    Ok(name)
}

/// As [`make_engine`], with an abort switch of its own (a submission).
pub fn make_engine_with(
    svc: &Services,
    loaded: &steppe_language::Loaded,
    scope: Scope,
    answers: Vec<(String, String)>,
    scripted: Option<(String, Option<String>)>,
    cancel_tx: Arc<tokio::sync::watch::Sender<bool>>,
    cancel_rx: tokio::sync::watch::Receiver<bool>,
) -> engine::Engine {
    let dir = if loaded.dir.as_os_str().is_empty() { PathBuf::from(".") } else { loaded.dir.clone() };
    let env_model = LoadOptions::from_env(Default::default()).env_model;
    let masked_env = engine::secret_env_names(&loaded.pipeline, env_model.as_deref());
    steppe_runtime::secrets::remember_env(&masked_env);
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
        env_model,
        scripted: scripted.as_ref().map(|(p, _)| p.clone()),
        scripted_fallback: scripted.and_then(|(_, f)| f),
        answers,
        submission: None,
        scratch: svc.scratch.clone(),
        scope,
        docker: if svc.slots > 0 { engine::docker::Docker::Local } else { engine::docker::Docker::Remote(svc.registry.clone()) },
        trace_parent: None,
        masked_env,
        preflight: true,
        park_questions: true,
        force: false,
        pins: Vec::new(),
        version_history: None,
        run_history: None,
    }
}

/// The jobs `only` picks (all of them without it), or why it picks none.
pub fn pick_jobs(jobs: &[steppe_language::model::Job], only: Option<&str>, pipeline: &str) -> Result<Vec<steppe_language::model::Job>, String> {
    match only {
        None => Ok(jobs.to_vec()),
        Some(name) => match jobs.iter().find(|j| j.name == name) {
            Some(j) => Ok(vec![j.clone()]),
            None => {
                let names: Vec<String> = jobs.iter().map(|j| crate::text::shown(&j.name).into_owned()).collect();
                Err(format!("job \"{}\" is not in {pipeline}; its jobs: {}", crate::text::shown(name), names.join(", ")))
            }
        },
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

/// Serves the Dispatcher's figures and the workers' on `addr` (`--metrics`).
pub async fn serve_metrics(svc: &Arc<Services>, addr: std::net::SocketAddr) -> std::io::Result<std::net::SocketAddr> {
    use steppe_worker::metrics::PoolLabel;
    let metrics = svc.dispatcher.metrics.clone();
    let (m, dispatcher, registry) = (metrics.clone(), svc.dispatcher.clone(), svc.registry.clone());
    let refresh: steppe_worker::metrics::Refresh = Arc::new(move || {
        let (m, dispatcher, registry) = (m.clone(), dispatcher.clone(), registry.clone());
        Box::pin(async move {
            let figures = dispatcher.figures().await;
            let workers = registry.list().await;
            let mut pools: std::collections::BTreeSet<String> = figures.iter().map(|f| f.pool.clone()).collect();
            pools.extend(workers.iter().map(|w| w.pool.clone()));
            pools.insert(steppe_runtime::queue::DEFAULT_POOL.to_string());
            for pool in pools {
                let label = PoolLabel { pool: pool.clone() };
                let f = figures.iter().find(|f| f.pool == pool).cloned().unwrap_or_default();
                let serving: Vec<_> = workers.iter().filter(|w| w.serves(&pool)).collect();
                let slots: i64 = serving.iter().map(|w| i64::from(w.slots)).sum();
                m.backlog.get_or_create(&label).set(f.waiting);
                m.in_flight.get_or_create(&label).set(f.in_flight);
                m.oldest_waiting_seconds.get_or_create(&label).set(f.oldest_waiting.as_secs_f64());
                m.workers_connected.get_or_create(&label).set(serving.iter().filter(|w| w.remote).count() as i64);
                m.slots_free.get_or_create(&label).set((slots - f.in_flight).max(0));
            }
        })
    });
    steppe_worker::metrics::serve(addr, metrics, refresh, Arc::new(|| true)).await
}
