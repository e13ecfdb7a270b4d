//! `steppe coordinator` and `steppe worker`: the two long-lived processes of a cluster.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;

use super::args::{parse_lease, parse_wait};
use super::{cores, scratch};
use crate::remote::read_token;
use crate::run_actor::terminated;
use crate::server::{serve, Auth, ServeOptions};
use crate::services::{queue_key, start_services_with, ClusterOptions, DEFAULT_REDIS_PREFIX};

/// Serve runs for `steppe submit` and assignments for `steppe worker`s.
///
/// A long-lived coordinator: pipelines are submitted to it (with every file
/// they read), their steps go on its queue, and workers anywhere take them.
/// With --token-file every call (submissions and worker sessions) must carry
/// that token. History lives in DIR/steppe.db (or --store), artifacts in
/// DIR/artifacts (or --artifacts): workers that see the directory use it,
/// others get artifacts through the coordinator.
///
/// Example:
///   steppe coordinator --listen 127.0.0.1:7070 --token-file token
///   steppe worker --coordinator http://127.0.0.1:7070 --token-file token
///   steppe submit ci.yml --job build --coordinator http://127.0.0.1:7070 --token-file token
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CoordinatorArgs {
    /// Where workers, submitters and the CLI reach it (e.g. 0.0.0.0:7070).
    #[arg(long, value_name = "ADDR")]
    listen: std::net::SocketAddr,
    /// Worker slots inside the coordinator itself (default 0: only remote workers).
    #[arg(long, value_name = "N", default_value_t = 0)]
    workers: usize,
    /// Runtime threads (default: half the cores, at least one; every core
    /// with --workers). A coordinator's work is many small tasks: on more
    /// threads than it keeps busy, waking one task wakes an idle thread too,
    /// and the rest of the cores are left to its store, its queue and any
    /// workers on the same host.
    #[arg(long, value_name = "N", env = "STEPPE_COORDINATOR_THREADS")]
    threads: Option<usize>,
    /// Where the coordinator keeps history, artifacts and submissions.
    #[arg(long, value_name = "DIR", default_value = ".steppe-coordinator")]
    state: PathBuf,
    /// A file holding the token every client and worker must present (an
    /// admin token: it opens everything, every team's history included).
    #[arg(long, value_name = "FILE", env = "STEPPE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Teams and roles: a YAML list of entries `{team, role, sha256[, pools,
    /// name]}`, role one of submit, worker, admin, sha256 the SHA-256 of a
    /// token (`steppe token new` makes one and prints its entry). A submit
    /// token sees and acts on its own team's pipelines only; a worker token
    /// only serves assignments (of its `pools`, if listed); an admin token
    /// sees every team. Read again on SIGHUP.
    #[arg(long, value_name = "FILE", env = "STEPPE_AUTH_FILE")]
    auth: Option<PathBuf>,
    /// The queue assignments wait on: redis://[USER:PASSWORD@]HOST:PORT/
    /// (Redis Streams, leased; rediss:// for TLS, verified against the
    /// system's CAs or $SSL_CERT_FILE) instead of this process's memory.
    /// Keep a password out of the command line: --redis-password-file, or
    /// the URL in $STEPPE_QUEUE.
    #[arg(long, value_name = "URL", env = "STEPPE_QUEUE", hide_env_values = true)]
    queue: Option<String>,
    /// How long a queue entry stays with whoever took it unless renewed.
    /// The coordinator renews what it holds every third of this, so a
    /// step may run longer; a coordinator that dies stops renewing, and
    /// its entries go to the next coordinator after this long.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_lease)]
    queue_lease: std::time::Duration,
    /// Never make a queue that is missing (SQS: a pool's queue and its
    /// dead-letter queue); in production they are made by whoever owns the account.
    #[arg(long)]
    no_create_queues: bool,
    /// SQS: deliveries of an assignment (each to a worker that was then
    /// lost) after which it goes to the dead-letter queue and its step errors.
    #[arg(long, value_name = "N", default_value = "5")]
    max_receives: u32,
    /// Where history lives: redis:// or rediss:// (as --queue) instead of DIR/steppe.db, so
    /// a restarted (or another) coordinator sees the same runs and versions.
    /// (Or the URL in $STEPPE_STORE.)
    #[arg(long, value_name = "URL", env = "STEPPE_STORE", hide_env_values = true)]
    store: Option<String>,
    /// A file holding the Redis password, for --queue and --store URLs
    /// that carry none (so it never shows in `ps`).
    #[arg(long, value_name = "FILE", env = "STEPPE_REDIS_PASSWORD_FILE")]
    redis_password_file: Option<PathBuf>,
    /// What this installation's Redis keys start with: coordinators with
    /// different prefixes share one Redis without seeing each other's
    /// queue entries or history. (Workers are told it.)
    #[arg(long, value_name = "PREFIX", env = "STEPPE_REDIS_PREFIX", default_value = DEFAULT_REDIS_PREFIX, value_parser = parse_prefix)]
    redis_prefix: String,
    /// A worker silent this long (no heartbeat; they come every 5s) is
    /// fenced: its steps run elsewhere and its late results are refused.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_lease)]
    worker_lease: std::time::Duration,
    /// Where artifacts live: a directory workers share (default:
    /// DIR/artifacts; on several hosts a shared mount every worker sees at
    /// this path — workers that do not see it get artifacts through the
    /// coordinator), or an object store every worker reads and writes
    /// directly: s3://BUCKET/PREFIX (the bucket must exist; the standard AWS
    /// environment configures it, AWS_ENDPOINT_URL_S3 for MinIO or GCS).
    #[arg(long, value_name = "DIR|URL")]
    artifacts: Option<String>,
    /// Serve TLS with this certificate chain (PEM); clients then use
    /// https:// URLs (and --tls-ca FILE for a private CA).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics on http://ADDR/metrics (per pool: backlog,
    /// in flight, the oldest wait, workers and free slots; steps by
    /// outcome; queue-wait and run-time histograms; tokens), and /healthz
    /// and /readyz for probes. An autoscaler (KEDA) scales workers on them.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Serve the dashboard on http://ADDR/: runs, live run views, logs,
    /// transcripts, traces, approvals and the fleet, for the team of the
    /// token a person signs in with (the CLI's tokens).
    #[arg(long, value_name = "ADDR")]
    web: Option<std::net::SocketAddr>,
    /// Watch this pipeline as `steppe watch` does (repeatable): its trigger
    /// resources polled every --watch-interval (checks run here), its builds
    /// queued in the coordinator's store and run on its workers, its history
    /// under the file's stem.
    #[arg(long = "watch", value_name = "PIPELINE")]
    watch: Vec<PathBuf>,
    /// How often watched pipelines are polled.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::args::parse_wait)]
    watch_interval: std::time::Duration,
    #[command(flatten)]
    log: super::log::LogArgs,
}

impl CoordinatorArgs {
    pub fn run(self) -> Result<ExitCode> {
        let CoordinatorArgs { listen, workers, threads, state, token_file, auth, queue, queue_lease, no_create_queues, max_receives, store, redis_password_file, redis_prefix, worker_lease, artifacts, tls_cert, tls_key, metrics, web, watch, watch_interval, log } = self;
        // Loaded now, so a mistake in one stops the coordinator before it serves.
        let mut watched = Vec::new();
        for path in &watch {
            let loaded = match super::load_reporting(path, &steppe_language::LoadOptions::from_env(Default::default())) {
                Ok(l) => l,
                Err(code) => return Ok(code),
            };
            if crate::watch::triggers(&loaded.pipeline).is_empty() {
                anyhow::bail!("--watch {}: no get has trigger: true, so there is nothing to watch", path.display());
            }
            let name = crate::services::pipeline_name(None, path)?;
            watched.push((loaded, name));
        }
        log.init(super::log::Sink::Stdout);
        let queue_key = steppe_cloud::queues::base_key(queue.as_deref().unwrap_or_default(), &queue_key(&redis_prefix));
        let (queue, store) = with_redis_password(queue, store, redis_password_file.as_deref())?;
        let auth = Auth { file: auth, admin_token: read_token(token_file.as_deref())? };
        // Read now, so a mistake in it stops the coordinator before it serves.
        auth.load()?;
        let tls = match tls_cert.zip(tls_key) {
            Some((cert, key)) => {
                let read = |p: &Path| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
                Some(tonic::transport::Identity::from_pem(read(&cert)?, read(&key)?))
            }
            None => None,
        };
        let scratch = scratch()?;
        let threads = threads.unwrap_or(if workers > 0 { cores() } else { cores() / 2 }).max(1);
        super::runtime_with(Some(threads))?.block_on(async {
            std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
            // Submissions of a coordinator that died: those it kept for a
            // successor are taken over (`RunService::take_over_orphans`); the
            // rest, and any a day old, went with it.
            crate::runs_service::sweep_submissions(&state.join("submissions"));
            let pools = match queue.as_deref() {
                Some(url) if steppe_cloud::queues::is_queue_url(url) => {
                    let name = format!("coordinator-{}", std::process::id());
                    let options = steppe_cloud::queues::QueueOptions { create: !no_create_queues, max_receives, ..Default::default() };
                    Some(steppe_cloud::queues::pools(url, &queue_key, &name, queue_lease, options).await?.handing_off())
                }
                Some(other) => anyhow::bail!("--queue {other}: a queue is redis://HOST:PORT/, rediss://… or sqs://QUEUE_PREFIX"),
                None => None,
            };
            let runs: Arc<dyn steppe_runtime::store::Store> = match store.as_deref() {
                // History written while Redis is away is kept and delivered when it is back.
                Some(url) if is_redis(url) => Arc::new(steppe_runtime::store::Outbox::new(steppe_runtime::store::RedisStore::connect(url, &redis_prefix)?)),
                Some(other) => anyhow::bail!("--store {other}: only redis:// stores are supported so far"),
                None => Arc::new(steppe_runtime::store::SqliteStore::open(&state.join("steppe.db"))?),
            };
            let svc = start_services_with(&state, runs, scratch.path(), workers, false, true, ClusterOptions { pools, artifacts: artifacts.as_deref().filter(|a| !a.starts_with("s3://")).map(PathBuf::from), object_store: artifacts.filter(|a| a.starts_with("s3://")), log: true }).await?;
            let open = auth.file.is_none() && auth.admin_token.is_none();
            serve(&svc, listen, ServeOptions { auth, tls, worker_lease, long_lived: true, queue_key, web })?;
            // What it works with, said once (credentials masked).
            let mask = |u: &str| steppe_runtime::secrets::mask_urls(u).into_owned();
            svc.out.note(&format!("queue: {}", queue.as_deref().map(mask).unwrap_or_else(|| "in this process's memory (workers are sent their steps)".into())));
            svc.out.note(&format!("store: {}", store.as_deref().map(mask).unwrap_or_else(|| state.join("steppe.db").display().to_string())));
            svc.out.note(&format!("artifacts: {}", svc.object_store.as_deref().map(mask).unwrap_or_else(|| svc.artifact_dir.display().to_string())));
            if open {
                svc.out.note("WARNING: no --auth or --token-file: anyone who reaches this address can submit pipelines, run commands on its workers and read every run's history");
            }
            if let Some(addr) = metrics {
                let bound = crate::services::serve_metrics(&svc, addr).await.with_context(|| format!("--metrics {addr}"))?;
                svc.out.note(&format!("metrics on http://{bound}/metrics"));
            }
            let (stop_watching, watching) = tokio::sync::watch::channel(false);
            let mut watchers = Vec::new();
            for (loaded, name) in watched {
                let w = crate::watch::Watcher::new(svc.clone(), loaded, steppe_runtime::store::Scope::new("", &name), 1).map_err(anyhow::Error::msg)?;
                w.recover().await.map_err(anyhow::Error::msg)?;
                svc.out.note(&format!("watching pipeline {name} every {}", steppe_language::duration::show(watch_interval)));
                let mut stop = watching.clone();
                watchers.push(tokio::spawn(async move {
                    w.run(watch_interval, false, async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await
                }));
            }
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminated() => {}
            }
            svc.out.note("steppe coordinator: stopping");
            let _ = stop_watching.send(true);
            for w in watchers {
                let _ = w.await;
            }
            svc.out.flush().await;
            anyhow::Ok(())
        })?;
        Ok(ExitCode::SUCCESS)
    }
}

fn parse_prefix(p: &str) -> Result<String, String> {
    let plain = !p.is_empty() && p.len() <= 64 && p.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if plain {
        Ok(p.to_string())
    } else {
        Err(format!("{p:?}: a prefix is up to 64 letters, digits, '-', '_' or '.'"))
    }
}

fn is_redis(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

/// Run steps for a coordinator: a worker in its own process.
///
/// Connects to a coordinator (`steppe coordinator`, or `steppe run --listen
/// ADDR`), takes assignments from its queue, runs each in a fresh directory
/// of its declared inputs, and streams output lines and results back. When
/// the coordinator goes away, what runs here stops (it runs again
/// elsewhere) and the worker reconnects for up to --reconnect-for.
/// SIGTERM drains (finishes what it runs, takes nothing new; a second
/// SIGTERM stops at once); Ctrl-C stops at once. Stopping kills each
/// running step's whole process group. Artifacts come from the coordinator's artifact
/// directory when this host shares it (checked, not assumed), otherwise
/// they travel through the coordinator in chunks.
///
/// Example:
///   steppe worker --coordinator http://127.0.0.1:7070 --slots 4
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct WorkerArgs {
    /// The coordinator's URL.
    #[arg(long, value_name = "URL")]
    coordinator: String,
    /// Assignments run at once (default: one per core).
    #[arg(long, value_name = "N")]
    slots: Option<u32>,
    /// A file holding the token the coordinator requires.
    #[arg(long, value_name = "FILE", env = "STEPPE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Fetch and store artifacts through the coordinator even when its
    /// artifact directory is visible here (a slow or unreliable mount).
    #[arg(long)]
    stream_artifacts: bool,
    /// With an https:// coordinator: the CA certificate (PEM) that signed
    /// its certificate (default: the system's roots).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Take assignments from the coordinator's queue directly (its
    /// --queue: redis://HOST:PORT/ or sqs://QUEUE_PREFIX) instead of having
    /// them sent over the session; the queue's lease brings back what
    /// a lost worker took. (Or the URL in $STEPPE_QUEUE.)
    #[arg(long, value_name = "URL", env = "STEPPE_QUEUE", hide_env_values = true)]
    queue: Option<String>,
    /// A file holding the Redis password, for a --queue URL that carries none.
    #[arg(long, value_name = "FILE", env = "STEPPE_REDIS_PASSWORD_FILE")]
    redis_password_file: Option<PathBuf>,
    /// The pool this worker serves: it runs only the steps of runs
    /// submitted with the same --pool (default: the default pool).
    #[arg(long, value_name = "NAME", default_value = "default")]
    pool: String,
    /// When the coordinator goes away (restarted, cut off), keep trying to
    /// reach it this long, with backoff, before exiting (0s: exit at once).
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_wait)]
    reconnect_for: std::time::Duration,
    /// Leave (exit 0, as after a drain) once nothing has come to run for
    /// this long: with an autoscaler, workers follow the backlog down to zero.
    #[arg(long, value_name = "DURATION", value_parser = parse_wait)]
    exit_when_idle: Option<std::time::Duration>,
    /// Serve Prometheus metrics on http://ADDR/metrics (this worker's
    /// slots, steps by outcome, run times, tokens), /healthz and /readyz
    /// (ready while it has a session with the coordinator).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Take no steps with an image even if a Docker engine is reachable
    /// (by default a worker that reaches one takes its pool's container
    /// steps too; one that does not never gets them).
    #[arg(long)]
    no_containers: bool,
    #[command(flatten)]
    log: super::log::LogArgs,
}

impl WorkerArgs {
    pub fn run(self) -> Result<ExitCode> {
        worker(self)
    }
}

fn worker(args: WorkerArgs) -> Result<ExitCode> {
    let WorkerArgs { coordinator: url, slots, token_file, stream_artifacts, tls_ca, queue, redis_password_file, pool, reconnect_for, exit_when_idle, metrics, no_containers, log } = args;
    log.init(super::log::Sink::Stderr);
    crate::remote::check_url(&url)?;
    let (queue, _) = with_redis_password(queue, None, redis_password_file.as_deref())?;
    steppe_runtime::queue::check_pool_name(&pool).map_err(|e| anyhow::anyhow!("--pool {e}"))?;
    if let Some(q) = queue.as_deref().filter(|q| !steppe_cloud::queues::is_queue_url(q)) {
        anyhow::bail!("--queue {q}: a worker takes from its coordinator's queue (redis://HOST:PORT/, rediss://… or sqs://QUEUE_PREFIX)");
    }
    let token = read_token(token_file.as_deref())?;
    let slots = slots.unwrap_or(cores() as u32);
    // A thread per slot at most: a worker of one slot runs its step's
    // process and talks to its coordinator, and waits on both.
    let rt = super::runtime_with(Some(cores().min(slots.max(1) as usize)))?;
    let name = format!("{}:{}", std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".into()), std::process::id());
    let scratch = super::scratch_of("worker")?;
    let work = scratch.path().to_path_buf();
    let containers = !no_containers && match rt.block_on(steppe_worker::container::engine()) {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!("steppe worker {name}: {e}; steps with an image go to other workers");
            false
        }
    };
    let docker = if containers { ", runs containers" } else { "" };
    tracing::info!("steppe worker {name}: connecting to {} with {slots} slot(s){docker}", steppe_runtime::secrets::mask_urls(&url));
    let config = steppe_worker::remote::WorkerConfig { url, slots, name: name.clone(), work_root: work.clone(), token, stream_artifacts, tls_ca, queue, pool, reconnect_for, exit_when_idle, metrics, containers };
    // On the runtime's threads, not this one: the session and the slots it
    // feeds then share a thread (one slot, one thread) instead of waking
    // each other across two on every message.
    rt.block_on(async { tokio::spawn(steppe_worker::remote::run(config)).await }).context("the worker's session ended abruptly")??;
    tracing::info!("steppe worker {name}: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Puts the password of `--redis-password-file` into Redis URLs that carry none.
fn with_redis_password(queue: Option<String>, store: Option<String>, file: Option<&Path>) -> Result<(Option<String>, Option<String>)> {
    let Some(file) = file else { return Ok((queue, store)) };
    let password = steppe_runtime::secrets::read_file(file, "--redis-password-file").map_err(anyhow::Error::msg)?;
    let add = |u: Option<String>| u.map(|u| if u.starts_with("redis") { steppe_runtime::secrets::with_password(&u, &password) } else { u });
    Ok((add(queue), add(store)))
}
