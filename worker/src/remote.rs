//! `steppe worker`: a worker in its own process, holding one gRPC session with
//! the coordinator — assignments and cancellations in, output lines, results
//! and heartbeats out.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use steppe_proto::v1::coordinator_client::CoordinatorClient;
use steppe_proto::v1::{coordinator_message, worker_message, CoordinatorMessage, Drain, Heartbeat, Hello, OutputLine, Release, SpendRequest, Taken, WorkerMessage};
use steppe_runtime::budget::Ledger;
use steppe_runtime::assignment::{Assignment, AssignmentResult};
use steppe_runtime::outcome::StepError;
use steppe_runtime::queue::{keep_leases, Queue};
use steppe_runtime::artifacts::{ArtifactStore, LocalArtifactStore};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::exec::execute_isolated;
use crate::sink::{LineSink, Stream};
use crate::local::Cancels;
use crate::transfer::StreamedArtifactStore;
use steppe_runtime::wire::{assignment_from_wire, cap_line, offload_payload, result_to_wire};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("--metrics {addr}: {source}")]
    Metrics { addr: String, source: std::io::Error },
    #[error("cannot reach the coordinator at {url}: {source}")]
    Connect { url: String, source: tonic::transport::Error },
    #[error("--coordinator {url} is not a URL steppe can dial (http://HOST:PORT or https://HOST:PORT): {source}")]
    BadUrl { url: String, source: tonic::transport::Error },
    #[error("the coordinator refused the session: {}", .0.message())]
    Session(#[from] tonic::Status),
    #[error("the coordinator closed the session before welcoming this worker")]
    NoWelcome,
    #[error("artifact directory {dir}: {source}")]
    Artifacts { dir: String, source: std::io::Error },
    #[error(transparent)]
    Queue(steppe_runtime::queue::QueueError),
    #[error(transparent)]
    Token(#[from] steppe_runtime::auth::BadToken),
    #[error("--tls-ca {path}: {source}")]
    TlsCa { path: String, source: std::io::Error },
    #[error("cannot reach the coordinator at {url}: its certificate is not signed by a CA this host trusts (a private CA? pass --tls-ca FILE)")]
    UntrustedCertificate { url: String },
    #[error("--tls-ca is for an https:// coordinator; {0} is plain http")]
    TlsCaWithoutHttps(String),
    #[error("the coordinator at {url} did not come back within {after} (--reconnect-for)")]
    GaveUp { url: String, after: String },
}

struct Lines {
    tx: mpsc::Sender<WorkerMessage>,
    id: String,
    /// Lines dropped since the last one that went out.
    dropped: std::sync::atomic::AtomicUsize,
}

impl Lines {
    fn message(&self, run_id: &str, step: &str, stderr: bool, line: String) -> WorkerMessage {
        WorkerMessage {
            msg: Some(worker_message::Msg::Line(OutputLine { run_id: run_id.to_string(), assignment_id: self.id.clone(), step: step.to_string(), stderr, line })),
        }
    }
}

impl LineSink for Lines {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str) {
        use std::sync::atomic::Ordering;
        // Live output is best effort: a full channel drops the line rather
        // than stall the step (the result still carries the whole output),
        // and the next line that goes out says how many were dropped.
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            let note = format!("… {dropped} line(s) of live output dropped: the coordinator could not keep up (the step's record has them)");
            if self.tx.try_send(self.message(run_id, step, true, note)).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            self.dropped.fetch_sub(dropped, Ordering::Relaxed);
        }
        if self.tx.try_send(self.message(run_id, step, stream == Stream::Stderr, cap_line(line).into_owned())).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A channel to the coordinator at `url`. An https:// URL is verified
/// against `tls_ca` (a PEM file) when given, and the system's roots otherwise.
pub async fn connect(url: &str, tls_ca: Option<&std::path::Path>) -> Result<tonic::transport::Channel, WorkerError> {
    let connect_err = |source| WorkerError::Connect { url: url.to_string(), source };
    let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_string()).map_err(|source| WorkerError::BadUrl { url: url.to_string(), source })?
        .tcp_nodelay(true)
        // A coordinator that vanished without closing the connection (its
        // machine lost, a partition) is noticed within half a minute.
        .http2_keep_alive_interval(std::time::Duration::from_secs(10))
        .keep_alive_timeout(std::time::Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if url.starts_with("https://") {
        let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
        if let Some(ca) = tls_ca {
            let pem = std::fs::read(ca).map_err(|source| WorkerError::TlsCa { path: ca.display().to_string(), source })?;
            tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
        }
        endpoint = endpoint.tls_config(tls).map_err(connect_err)?;
    } else if tls_ca.is_some() {
        return Err(WorkerError::TlsCaWithoutHttps(url.to_string()));
    }
    endpoint.connect().await.map_err(|source| {
        let text = format!("{source:?}");
        if text.contains("UnknownIssuer") && tls_ca.is_none() {
            WorkerError::UntrustedCertificate { url: url.to_string() }
        } else {
            connect_err(source)
        }
    })
}

/// What every assignment this worker runs shares.
#[derive(Clone)]
struct Running {
    tx: mpsc::Sender<WorkerMessage>,
    store: Arc<dyn ArtifactStore>,
    work_root: PathBuf,
    cancels: Cancels,
    /// The shared queue, for a worker that pulls (it acknowledges what it reported).
    queue: Option<Arc<dyn Queue>>,
    /// The coordinator's host as dialled: where a model it serves on an
    /// unspecified address (a scripted one) is reached.
    coordinator_host: Option<String>,
    /// The run's spending counters, kept by the coordinator.
    ledger: Arc<dyn Ledger>,
    stats: Arc<Stats>,
    /// Its place in the coordinator's line, for a worker that pulls and is handed work.
    hands: Option<Arc<crate::hands::Hands>>,
}

/// What this worker does, for `--metrics`.
pub struct Stats {
    pub metrics: Arc<crate::metrics::Metrics>,
    busy: std::sync::atomic::AtomicI64,
    connected: std::sync::atomic::AtomicBool,
}

impl Stats {
    fn new() -> Self {
        Stats { metrics: Default::default(), busy: Default::default(), connected: Default::default() }
    }
}

/// Spending counters at the coordinator (`Coordinator.Spend`).
struct CoordinatorLedger(CoordinatorClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, steppe_runtime::auth::WithToken>>);

impl Ledger for CoordinatorLedger {
    fn spend<'a>(&'a self, counter: &'a str, tokens: u64) -> steppe_runtime::budget::SpendFuture<'a> {
        Box::pin(async move {
            let mut c = self.0.clone();
            c.spend(SpendRequest { counter: counter.to_string(), tokens }).await.map(|r| r.into_inner().total).map_err(|s| format!("the coordinator: {}", s.message()))
        })
    }

    fn ask<'a>(&'a self, q: steppe_runtime::store::QuestionRecord) -> steppe_runtime::budget::LedgerFuture<'a, (steppe_runtime::store::QuestionRecord, bool)> {
        Box::pin(async move {
            let mut c = self.0.clone();
            let r = c.ask(steppe_runtime::wire::history::question_to_wire(q)).await.map_err(|s| format!("the coordinator: {}", s.message()))?.into_inner();
            let q = r.question.ok_or("the coordinator filed no question")?;
            Ok((steppe_runtime::wire::history::question_from_wire(q), r.filed))
        })
    }

    fn question(&self, id: i64) -> steppe_runtime::budget::LedgerFuture<'_, Option<steppe_runtime::store::QuestionRecord>> {
        Box::pin(async move {
            let mut c = self.0.clone();
            let r = c.question(steppe_proto::v1::QuestionRef { id }).await.map_err(|s| format!("the coordinator: {}", s.message()))?.into_inner();
            Ok(r.question.map(steppe_runtime::wire::history::question_from_wire))
        })
    }

    fn settle<'a>(&'a self, id: i64, answer: Option<&'a str>, source: &'a str) -> steppe_runtime::budget::LedgerFuture<'a, bool> {
        Box::pin(async move {
            let mut c = self.0.clone();
            let req = steppe_proto::v1::SettleRequest { id, answer: answer.map(str::to_string), source: source.to_string() };
            c.settle(req).await.map(|r| r.into_inner().settled).map_err(|s| format!("the coordinator: {}", s.message()))
        })
    }
}

impl Running {
    /// Runs an assignment taken from the queue once it has a slot; one taken
    /// ahead that gets none in time goes back to the coordinator (which
    /// queues it again for any worker) unrun, and one cancelled while it
    /// waits is reported aborted at once.
    async fn run_when_a_slot_frees(self, a: Assignment, cancel: tokio::sync::watch::Receiver<bool>, claim: crate::pull::Claim) {
        let mut cancelled = cancel.clone();
        let slot = tokio::select! {
            s = claim.slot() => s,
            // Reported aborted by the run itself, which finds the cancel first.
            _ = crate::stop::cancelled(&mut cancelled) => return self.run_one(a, cancel, None).await,
        };
        let Some(slot) = slot else {
            self.cancels.done(&a.id);
            let _ = self.tx.send(WorkerMessage { msg: Some(worker_message::Msg::Release(Release { assignment_id: a.id.clone() })) }).await;
            if let Some(q) = &self.queue {
                let _ = q.ack(&a.id).await;
            }
            return;
        };
        self.run_one(a, cancel, Some(slot)).await
    }

    /// Runs one assignment and reports its result; `slot` is held until then.
    async fn run_one(self, mut a: Assignment, cancel: tokio::sync::watch::Receiver<bool>, slot: Option<crate::pull::Slot>) {
        let Running { tx, store, work_root, cancels, queue, coordinator_host, ledger, stats, hands } = self;
        let began = std::time::Instant::now();
        stats.metrics.steps_started.inc();
        stats.busy.fetch_add(1, Ordering::Relaxed);
        if let Some(host) = &coordinator_host {
            for w in a.agent.iter_mut().chain(a.fix.iter_mut()) {
                w.reach_unspecified_at(host);
            }
        }
        let sink = Arc::new(Lines { tx: tx.clone(), id: a.id.clone(), dropped: Default::default() });
        let r = match &a.cwd {
            // Only the coordinator's own process runs a step in a directory of its host.
            steppe_runtime::assignment::Cwd::Host(p) => steppe_runtime::assignment::AssignmentResult::of(
                &a,
                Err(steppe_runtime::outcome::StepError::errored(format!("{}: a worker does not run a step in a directory of its host ({}) named by the coordinator", a.step, p.display()))),
            ),
            _ => execute_isolated(&a, store.clone(), &work_root, sink.clone(), Some(ledger), cancel).await,
        };
        cancels.done(&a.id);
        stats.busy.fetch_sub(1, Ordering::Relaxed);
        stats.metrics.run_seconds.observe(began.elapsed().as_secs_f64());
        stats.metrics.finished(&r);
        let dropped = sink.dropped.swap(0, std::sync::atomic::Ordering::Relaxed);
        if dropped > 0 {
            let note = format!("… {dropped} line(s) of live output dropped: the coordinator could not keep up (the step's record has them)");
            let _ = tx.send(sink.message(&a.run_id, &a.step, true, note)).await;
        }
        let mut wire = result_to_wire(&r);
        let step = a.step.clone();
        let offloaded = if !steppe_runtime::wire::needs_offload(&wire) {
            Ok(wire)
        } else {
            tokio::task::spawn_blocking(move || {
                if let Err(e) = offload_payload(&mut wire, store.as_ref(), &work_root) {
                    wire.class = steppe_proto::v1::OutcomeClass::Errored as i32;
                    wire.message = format!("{step}: its output ({} bytes) could not be stored for the coordinator: {e}", wire.stdout.len() + wire.stderr.len());
                    wire.stdout.clear();
                    wire.stderr.clear();
                    wire.agent = None;
                }
                wire
            })
            .await
        };
        let wire = match offloaded {
            Ok(wire) => wire,
            Err(e) => {
                tracing::warn!("steppe worker: reporting {}: {e}", a.id);
                return;
            }
        };
        if let (Some(h), Some(s)) = (&hands, &slot) {
            // Its slot frees with this result (unless one taken ahead waits
            // for it): in line before the coordinator reads the result,
            // whose step hands out its next at once.
            if s.none_ahead() {
                h.enter().await;
            }
        }
        let reported = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Result(wire)) }).await.is_ok();
        // The slot is free once the result is sent: the next pop need not
        // wait for the acknowledgement's round trip.
        drop(slot);
        if reported {
            if let Some(q) = queue {
                // Reported: the entry need not come back (if the report is
                // lost with the session, the coordinator requeues by id).
                let _ = q.ack(&a.id).await;
            }
        }
    }
}

/// What `steppe worker` is told on its command line.
pub struct WorkerConfig {
    pub url: String,
    pub slots: u32,
    /// A name for the coordinator's logs.
    pub name: String,
    /// Where step directories (and the artifact cache) go.
    pub work_root: PathBuf,
    /// Sent as a bearer token on every call when the coordinator requires one.
    pub token: Option<String>,
    /// Artifacts through the coordinator even if its directory is visible here.
    pub stream_artifacts: bool,
    /// The CA that signed an https:// coordinator's certificate.
    pub tls_ca: Option<PathBuf>,
    /// Take assignments from this shared queue (redis://…) instead of
    /// having the coordinator send them.
    pub queue: Option<String>,
    /// The pool it serves ("": the default pool).
    pub pool: String,
    /// How long to keep trying to reach a coordinator that went away.
    pub reconnect_for: Duration,
    /// Leave (as if drained) after this long with nothing to run.
    pub exit_when_idle: Option<Duration>,
    /// Serve /metrics, /healthz and /readyz here.
    pub metrics: Option<std::net::SocketAddr>,
    /// It reaches a Docker engine (found out at start, [`crate::container::reachable`]).
    pub containers: bool,
}

/// Serves one coordinator until it closes the session.
/// How a session with the coordinator ended.
#[derive(Debug, PartialEq)]
enum End {
    /// The worker chose to (drained, interrupted).
    Stopped,
    /// The coordinator went away: it may come back.
    Lost,
}

impl WorkerError {
    /// Whether trying again later may help (the coordinator restarting, a
    /// network cut), as opposed to a refusal that will not change.
    fn transient(&self) -> bool {
        match self {
            WorkerError::Connect { .. } | WorkerError::NoWelcome | WorkerError::Queue(_) => true,
            WorkerError::Session(s) => matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled | tonic::Code::Internal),
            _ => false,
        }
    }
}

/// Serves the coordinator; when it goes away (restarted, cut off), what
/// runs here is stopped (it is requeued there) and the worker reconnects
/// with backoff for up to `reconnect_for` before giving up.
pub async fn run(config: WorkerConfig) -> Result<(), WorkerError> {
    let mut lost_at: Option<std::time::Instant> = None;
    let mut backoff = Duration::from_millis(250);
    let stats = Arc::new(Stats::new());
    if let Some(addr) = config.metrics {
        let bound = serve_metrics(addr, stats.clone(), &config).await.map_err(|source| WorkerError::Metrics { addr: addr.to_string(), source })?;
        tracing::info!("steppe worker {}: metrics on http://{bound}/metrics", config.name);
    }
    loop {
        let r = session(&config, lost_at.is_some(), &stats).await;
        stats.connected.store(false, Ordering::Relaxed);
        match r {
            Ok(End::Stopped) => return Ok(()),
            Ok(End::Lost) if config.reconnect_for.is_zero() => return Ok(()),
            Ok(End::Lost) => {
                tracing::warn!(
                    "steppe worker {}: lost the coordinator at {}; reconnecting for up to {} (--reconnect-for)",
                    config.name,
                    steppe_runtime::secrets::mask_urls(&config.url),
                    steppe_language::duration::show(config.reconnect_for)
                );
                lost_at = Some(std::time::Instant::now());
                backoff = Duration::from_millis(250);
            }
            Err(e) if e.transient() && !config.reconnect_for.is_zero() => {
                if lost_at.is_none() {
                    // Said once: a coordinator not up yet, or a mistyped URL.
                    tracing::warn!("steppe worker {}: {}; trying again for up to {} (--reconnect-for)", config.name, steppe_runtime::causes::of(&e), steppe_language::duration::show(config.reconnect_for));
                }
                let since = *lost_at.get_or_insert_with(std::time::Instant::now);
                if since.elapsed() >= config.reconnect_for {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
        if lost_at.is_some_and(|t| t.elapsed() >= config.reconnect_for) {
            return Err(WorkerError::GaveUp { url: steppe_runtime::secrets::mask_urls(&config.url).into_owned(), after: steppe_language::duration::show(config.reconnect_for) });
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// `/metrics` of a worker: its slots and steps; `/readyz` while it has a session.
async fn serve_metrics(addr: std::net::SocketAddr, stats: Arc<Stats>, config: &WorkerConfig) -> std::io::Result<std::net::SocketAddr> {
    let label = crate::metrics::PoolLabel { pool: config.pool.clone() };
    let slots = i64::from(config.slots);
    let s = stats.clone();
    let refresh: crate::metrics::Refresh = Arc::new(move || {
        let connected = i64::from(s.connected.load(Ordering::Relaxed));
        let busy = s.busy.load(Ordering::Relaxed);
        s.metrics.workers_connected.get_or_create(&label).set(connected);
        s.metrics.in_flight.get_or_create(&label).set(busy);
        s.metrics.slots_free.get_or_create(&label).set((slots - busy).max(0) * connected);
        Box::pin(async {})
    });
    let s = stats.clone();
    crate::metrics::serve(addr, stats.metrics.clone(), refresh, Arc::new(move || s.connected.load(Ordering::Relaxed))).await
}

/// One session with the coordinator, from Hello to its end.
async fn session(config: &WorkerConfig, reconnecting: bool, stats: &Arc<Stats>) -> Result<End, WorkerError> {
    let WorkerConfig { url, slots, name, work_root, token, stream_artifacts, tls_ca, queue, pool, exit_when_idle, containers, .. } = config;
    let (slots, stream_artifacts, pool, work_root) = (*slots, *stream_artifacts, pool.clone(), work_root.clone());
    let (url, name) = (url.as_str(), name.as_str());
    let channel = connect(url, tls_ca.as_deref()).await?;
    let with_token = steppe_runtime::auth::WithToken::new(token.as_deref())?;
    let mut client = CoordinatorClient::with_interceptor(channel.clone(), with_token.clone());
    let (tx, rx) = mpsc::channel::<WorkerMessage>(1024);
    let _ = tx
        .send(WorkerMessage { msg: Some(worker_message::Msg::Hello(Hello { worker: name.to_string(), slots, pulls: queue.is_some(), pool, containers: *containers, takes_hand_overs: queue.as_deref().is_some_and(steppe_cloud::queues::hands_over_to_pullers) })) })
        .await;
    let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
    let welcome = match inbound.message().await? {
        Some(CoordinatorMessage { msg: Some(coordinator_message::Msg::Welcome(w)) }) => w,
        _ => return Err(WorkerError::NoWelcome),
    };
    if reconnecting {
        tracing::info!("steppe worker {name}: reconnected to {}", steppe_runtime::secrets::mask_urls(url));
    }
    let every = if welcome.heartbeat_ms == 0 { Duration::from_secs(5) } else { Duration::from_millis(welcome.heartbeat_ms.max(100)) };
    let shared = std::path::Path::new(&welcome.artifact_dir);
    let store: Arc<dyn ArtifactStore> = if !welcome.artifact_url.is_empty() {
        // The coordinator keeps artifacts in an object store: this worker reads and writes it too.
        let cache = work_root.join("artifact-cache");
        Arc::new(steppe_cloud::s3::S3ArtifactStore::connect(&welcome.artifact_url, &cache, None).await.map_err(|source| WorkerError::Artifacts { dir: welcome.artifact_url.clone(), source })?)
    } else if !stream_artifacts && !welcome.store_id.is_empty() && LocalArtifactStore::read_store_id(shared).as_deref() == Some(welcome.store_id.as_str()) {
        Arc::new(LocalArtifactStore::new(shared).map_err(|source| WorkerError::Artifacts { dir: welcome.artifact_dir.clone(), source })?)
    } else {
        if !stream_artifacts {
            tracing::info!("steppe worker {name}: the coordinator's artifact directory is not shared with this host; artifacts travel through the coordinator");
        }
        let cache = work_root.join("artifact-cache");
        Arc::new(
            StreamedArtifactStore::new(&cache, channel, with_token, tokio::runtime::Handle::current())
                .map_err(|source| WorkerError::Artifacts { dir: cache.display().to_string(), source })?,
        )
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
    let coordinator_host = steppe_runtime::agent_work::url_host(url).map(str::to_string);
    let ledger: Arc<dyn Ledger> = Arc::new(CoordinatorLedger(client.clone()));
    stats.connected.store(true, Ordering::Relaxed);
    let ctx = Running { tx: tx.clone(), store, work_root, cancels: Cancels::default(), queue: None, coordinator_host, ledger, stats: stats.clone(), hands: None };
    let slots_of_queue = crate::pull::Slots::new(slots as usize);
    // A worker started with --queue takes assignments from the shared queue itself.
    let (pulled_tx, mut pulled) = mpsc::channel::<(Assignment, crate::pull::Claim)>(1);
    let stop_pulling = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ctx = match &queue {
        Some(queue_url) => {
            let lease = Duration::from_millis(welcome.queue_lease_ms.max(1000));
            // The coordinator made the pool's queue before it said welcome.
            let options = steppe_cloud::queues::QueueOptions { create: false, ..Default::default() };
            let mut q: Arc<dyn Queue> = steppe_cloud::queues::connect(queue_url, &welcome.queue_key, name, lease, &options).await.map_err(WorkerError::Queue)?;
            if !welcome.container_queue_key.is_empty() {
                // It reaches a Docker engine: its pool's steps with an image too.
                let boxed = steppe_cloud::queues::connect(queue_url, &welcome.container_queue_key, name, lease, &options).await.map_err(WorkerError::Queue)?;
                q = Arc::new(steppe_runtime::queue::Merged::new(boxed, q));
            }
            // Its coordinator hands it work while it waits, and says when it queues some.
            let hands = welcome.hands_over.then(|| Arc::new(crate::hands::Hands::new(tx.clone())));
            tokio::spawn(crate::pull::pull(q.clone(), slots_of_queue.clone(), pulled_tx, stop_pulling.clone(), hands.clone()));
            // What this worker took stays its own while it runs.
            let renew = q.clone();
            keep_leases(
                lease,
                move || {
                    let q = renew.clone();
                    Box::pin(async move { vec![q] })
                },
                |e| tracing::warn!("steppe worker: renewing queue leases: {e}"),
            );
            Running { queue: Some(q), hands, ..ctx }
        }
        None => {
            drop(pulled_tx);
            ctx
        }
    };
    let mut running = tokio::task::JoinSet::new();
    let mut awaiting: std::collections::HashMap<String, (Assignment, crate::pull::Claim)> = Default::default();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let mut draining = false;
    let mut lost = false;
    let mut busy_at = tokio::time::Instant::now();
    loop {
        if !running.is_empty() || !awaiting.is_empty() {
            busy_at = tokio::time::Instant::now();
        }
        let idle_until = async {
            match exit_when_idle {
                Some(d) if !draining => tokio::time::sleep_until(busy_at + *d).await,
                _ => std::future::pending::<()>().await,
            }
        };
        let sigterm = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        let sigint = async {
            match int.as_mut() {
                Some(i) => {
                    i.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = sigint => {
                // Ctrl-C stops now: what runs is killed (process groups
                // and all), and the coordinator gives it to another worker.
                tracing::info!("steppe worker {name}: interrupted; stopping {} running step(s)", running.len());
                running.abort_all();
                crate::process_group::kill_all();
                break;
            }

            _ = sigterm => {
                if draining {
                    tracing::info!("steppe worker {name}: a second SIGTERM; stopping {} running step(s) now", running.len());
                    running.abort_all();
                    crate::process_group::kill_all();
                    break;
                }
                // SIGTERM drains: nothing new is taken, what runs finishes and reports.
                draining = true;
                stop_pulling.store(true, std::sync::atomic::Ordering::SeqCst);
                tracing::info!("steppe worker {name}: draining ({} running)", running.len());
                let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Drain(Drain {})) }).await;
                if running.is_empty() {
                    break;
                }
            }
            _ = idle_until, if running.is_empty() && awaiting.is_empty() => {
                // Nothing came for a while: leave, as a drained worker does (scale to zero).
                let d = exit_when_idle.map(steppe_language::duration::show).unwrap_or_default();
                tracing::info!("steppe worker {name}: nothing to run for {d}; leaving (--exit-when-idle)");
                draining = true;
                stop_pulling.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Drain(Drain {})) }).await;
                break;
            }
            Some(_) = running.join_next(), if !running.is_empty() => {
                if draining && running.is_empty() {
                    break;
                }
            }
            Some((a, claim)) = pulled.recv() => {
                // Taken from the queue: run at once (a Cancel stops it) or
                // once the coordinator confirms, awaited before it hears of
                // it, so no Confirm is missed.
                let started = crate::pull::runs_unconfirmed(&a, &welcome.incarnation);
                let taken = WorkerMessage { msg: Some(worker_message::Msg::Taken(Taken { assignment_id: a.id.clone(), epoch: a.epoch, by_reference: a.by_reference, started })) };
                if started {
                    let _ = tx.send(taken).await;
                    let cancel = ctx.cancels.register(&a.id);
                    running.spawn(ctx.clone().run_when_a_slot_frees(a, cancel, claim));
                } else {
                    awaiting.insert(a.id.clone(), (a, claim));
                    let _ = tx.send(taken).await;
                }
            }
            m = inbound.message() => {
                // A session that ends, cleanly or not, means the coordinator is gone.
                let Ok(Some(m)) = m else {
                    lost = !draining && !welcome.ephemeral;
                    break;
                };
                match m.msg {
                    Some(coordinator_message::Msg::Assignment(wa)) if draining => {
                        let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Release(Release { assignment_id: wa.id })) }).await;
                    }
                    Some(coordinator_message::Msg::Assignment(wa)) => {
                        let (id, epoch) = (wa.id.clone(), wa.epoch);
                        let handed = match (&ctx.hands, assignment_from_wire(wa)) {
                            (Some(h), handed) => {
                                // The wait it answers is spent, whatever it holds.
                                let claim = handed.is_ok().then(|| slots_of_queue.for_hand_over());
                                h.handed(slots_of_queue.any_free()).await;
                                // Out of line while a look held the free slot: it looks again.
                                h.look.notify_one();
                                match (handed, claim) {
                                    (Ok(a), Some(claim)) => {
                                        let cancel = ctx.cancels.register(&a.id);
                                        // Handed over while it waited: no queue entry to acknowledge.
                                        running.spawn(Running { queue: None, ..ctx.clone() }.run_when_a_slot_frees(a, cancel, claim));
                                        continue;
                                    }
                                    (handed, _) => handed,
                                }
                            }
                            (None, handed) => handed,
                        };
                        match handed {
                            Ok(a) => {
                                // Registered here, not in the task: a cancel read next must find it.
                                let cancel = ctx.cancels.register(&a.id);
                                running.spawn(ctx.clone().run_one(a, cancel, None));
                            }
                            Err(e) => {
                                let message = format!("worker {name} could not read assignment {id}: {e}");
                                tracing::warn!("steppe worker: {message}");
                                let r = AssignmentResult::with_id(&id, epoch, Err(StepError::errored(message)));
                                let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Result(result_to_wire(&r))) }).await;
                            }
                        }
                    }
                    Some(coordinator_message::Msg::Confirm(c)) => {
                        if let Some((taken, claim)) = awaiting.remove(&c.assignment_id) {
                            // A stand-in is run as the whole the coordinator sent with the Confirm.
                            let a = match c.assignment.map(assignment_from_wire) {
                                Some(Ok(whole)) => whole,
                                Some(Err(e)) => {
                                    if let Some(q) = &ctx.queue {
                                        let _ = q.ack(&taken.id).await;
                                    }
                                    let r = AssignmentResult::with_id(&taken.id, taken.epoch, Err(StepError::errored(format!("worker {name} could not read assignment {}: {e}", taken.id))));
                                    let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Result(result_to_wire(&r))) }).await;
                                    continue;
                                }
                                None if taken.by_reference => {
                                    if let Some(q) = &ctx.queue {
                                        let _ = q.ack(&taken.id).await;
                                    }
                                    let r = AssignmentResult::with_id(&taken.id, taken.epoch, Err(StepError::errored(format!("{}: the coordinator confirmed a stand-in without the assignment it stands for", taken.step))));
                                    let _ = tx.send(WorkerMessage { msg: Some(worker_message::Msg::Result(result_to_wire(&r))) }).await;
                                    continue;
                                }
                                None => taken,
                            };
                            let cancel = ctx.cancels.register(&a.id);
                            running.spawn(ctx.clone().run_when_a_slot_frees(a, cancel, claim));
                        }
                    }
                    Some(coordinator_message::Msg::Cancel(c)) => match awaiting.remove(&c.assignment_id) {
                        // Taken but not confirmed: nobody waits for it; it goes unrun.
                        Some((a, _slot)) => {
                            if let Some(q) = &ctx.queue {
                                let _ = q.ack(&a.id).await;
                            }
                        }
                        None => {
                            ctx.cancels.cancel(&c.assignment_id);
                        }
                    },
                    Some(coordinator_message::Msg::Look(_)) => {
                        if let Some(h) = &ctx.hands {
                            h.look.notify_one();
                        }
                    }
                    Some(coordinator_message::Msg::Welcome(_)) | None => {}
                }
            }
        }
    }
    stop_pulling.store(true, std::sync::atomic::Ordering::SeqCst);
    heartbeat.abort();
    if draining {
        // Close our side only now, and wait for the coordinator to close its
        // side: that is when it has read every result we sent (an exit right
        // away could lose the last one, and the step would run again).
        // Every sender goes: the loop's context holds one too.
        drop(ctx);
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(10), async { while let Ok(Some(_)) = inbound.message().await {} }).await;
    }
    // What still runs belongs to a session that is gone: the coordinator
    // requeues it, so it stops here (dropping the tasks kills their groups).
    running.abort_all();
    Ok(if lost { End::Lost } else { End::Stopped })
}
