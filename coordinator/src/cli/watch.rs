//! `steppe watch`: polls a pipeline's trigger resources and runs the builds
//! their new versions queue, until stopped (or once, with --once).

use std::fs::File;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use steppe_language::LoadOptions;

use super::args::{parse_wait, CacheArgs, VarArgs};
use super::{cores, load_reporting, runtime, scratch};
use crate::text::shown;
use crate::watch::{triggers, Watcher};

/// Watch a pipeline's trigger resources and run the builds they queue.
///
/// Every `get` with `trigger: true` names a resource to poll. Each poll runs
/// the resource's check; a version newer than the last one seen queues a
/// build of every job that triggers on it (one waiting build per job; a
/// running job may have one more). The first poll of a resource builds its
/// newest version once. A build that succeeds queues the jobs whose trigger
/// gets must have `passed:` it.
///
/// Builds run up to --max-concurrent at a time, under each job's `serial`,
/// `serial_groups` and `max_in_flight`; `max_consecutive_failures` failed
/// builds in a row pause a job (`steppe jobs PIPELINE --resume JOB`). The
/// queue is kept in the pipeline's store: `steppe runs PIPELINE --queue`
/// shows it, and builds a stopped watcher left wait again at its next start.
/// Ctrl-C stops: builds of `interruptible: true` jobs are aborted, others
/// are waited for (up to 10 minutes).
///
/// With --listen, `POST /check/RESOURCE` (with the token the resource's
/// `webhook_token_env` names, as `?token=` or `Authorization: Bearer`)
/// checks it at once and queues its jobs.
///
/// Examples:
///   steppe watch ci.yml
///   steppe watch ci.yml --interval 1m --max-concurrent 4
///   steppe watch ci.yml --once           (one poll, then run what it queued)
///   WEBHOOK_TOKEN=s3cret steppe watch ci.yml --listen 127.0.0.1:8089
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct WatchArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// How often to poll.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_wait)]
    interval: Duration,
    /// Poll once, run what it queued (and what they queue), then exit.
    #[arg(long)]
    once: bool,
    /// Builds that may run at once.
    #[arg(long, value_name = "N", default_value_t = 1)]
    max_concurrent: usize,
    /// Serve webhooks (POST /check/RESOURCE) on this address.
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Worker slots in this process (default: one per core).
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Do not probe the models a job uses before its first step.
    #[arg(long)]
    no_preflight: bool,
    #[command(flatten)]
    cache: CacheArgs,
    /// The name its history goes under (default: the file's stem).
    #[arg(long = "pipeline", value_name = "NAME")]
    pipeline_name: Option<String>,
    #[command(flatten)]
    vars: VarArgs,
}

impl WatchArgs {
    pub fn run(self) -> Result<ExitCode> {
        let pins = self.cache.pins()?;
        let loaded = match load_reporting(&self.pipeline, &LoadOptions::from_env(self.vars.resolve()?)) {
            Ok(l) => l,
            Err(code) => return Ok(code),
        };
        let watched = triggers(&loaded.pipeline);
        if watched.is_empty() {
            anyhow::bail!("{}: no get has trigger: true, so there is nothing to watch; add `trigger: true` to the gets whose new versions should start a build", self.pipeline.display());
        }
        let db = steppe_runtime::store::db_path(&loaded.path);
        let state = loaded.dir.join(".steppe");
        std::fs::create_dir_all(&state).with_context(|| format!("creating {}", state.display()))?;
        let lock_path = state.join(format!("{}.watch.lock", db.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()));
        let lock = File::create(&lock_path).with_context(|| format!("creating {}", lock_path.display()))?;
        if lock.try_lock().is_err() {
            anyhow::bail!("another steppe watch is watching {} (it holds {}); stop it first", self.pipeline.display(), lock_path.display());
        }
        let scratch = scratch()?;
        let rt = runtime()?;
        let code = rt.block_on(async {
            let svc = crate::services::start_services(&state, &db, scratch.path(), self.workers.unwrap_or_else(cores), false, false).await?;
            let scope = steppe_runtime::store::Scope::new("", &crate::services::pipeline_name(self.pipeline_name.as_deref(), &self.pipeline)?);
            let w = Watcher::new(svc, loaded, scope, self.max_concurrent).map_err(anyhow::Error::msg)?;
            let w = {
                let mut w = std::sync::Arc::try_unwrap(w).map_err(|_| anyhow::anyhow!("the watcher is shared already"))?;
                w.preflight = !self.no_preflight;
                w.force = self.cache.force;
                w.pins = pins;
                w.version_history = self.cache.version_history;
                w.run_history = self.cache.run_history;
                std::sync::Arc::new(w)
            };
            w.recover().await.map_err(anyhow::Error::msg)?;
            let names: Vec<String> = watched.keys().map(|r| shown(r).to_string()).collect();
            say!("watching {} ({}) every {}", names.join(", "), shown(&self.pipeline.display().to_string()), steppe_language::duration::show(self.interval));
            if let Some(addr) = self.listen {
                let at = crate::watch::webhook::serve(w.clone(), addr).await?;
                say!("webhooks: POST http://{at}/check/RESOURCE");
            }
            let stopped = w.run(self.interval, self.once, crate::run_actor::stopped()).await;
            if stopped {
                warn!("steppe: stopped the watch");
            }
            anyhow::Ok(if stopped { 130u8 } else { 0 })
        })?;
        drop(lock);
        Ok(ExitCode::from(code))
    }
}
