//! Watching a pipeline (pipeline-language.md §5.4, §9): the resources its
//! jobs trigger on polled, a build of each job a new version reaches queued
//! in the run store, and the queue run under the jobs' limits; a job whose
//! build succeeds queues the jobs that wait for it (`passed:`).

pub mod queue;
pub mod webhook;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use steppe_language::model::{Pipeline, VersionSpec};
use steppe_runtime::outcome::{Class, Outcome};
use steppe_runtime::store::{now_ms, Scope, Store};
use tokio::sync::Notify;

use crate::engine::{Engine, JobRun};
use crate::services::Services;
use crate::text::shown;
use queue::{Limits, Row, State};

/// How long a stopping watcher waits for a build that is not interruptible.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(600);

/// The resources jobs trigger on, each with the jobs it triggers (an alias
/// resolves to its resource, polled once).
pub fn triggers(p: &Pipeline) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for job in &p.jobs {
        steppe_language::model::walk::each_step_of(job, "", &mut |s, _| {
            if s.get.is_some() && s.trigger == Some(true) {
                let r = s.resource.clone().or(s.get.clone()).unwrap_or_default();
                let jobs = out.entry(r).or_default();
                if !jobs.contains(&job.name) {
                    jobs.push(job.name.clone());
                }
            }
        });
    }
    out
}

/// The jobs a success of `job` triggers: those with a trigger get that
/// must have passed it.
pub fn downstream(p: &Pipeline, job: &str) -> Vec<String> {
    let mut out = Vec::new();
    for j in &p.jobs {
        steppe_language::model::walk::each_step_of(j, "", &mut |s, _| {
            if s.trigger == Some(true) && s.passed.as_ref().is_some_and(|ps| ps.iter().any(|x| x == job)) && !out.contains(&j.name) {
                out.push(j.name.clone());
            }
        });
    }
    out
}

/// One watcher of one pipeline, in this process.
pub struct Watcher {
    pub svc: Arc<Services>,
    pub loaded: steppe_language::Loaded,
    pub scope: Scope,
    pub store: Arc<dyn Store>,
    /// What each build's engine is made with.
    pub preflight: bool,
    pub force: bool,
    pub pins: Vec<(String, String)>,
    pub version_history: Option<u64>,
    pub run_history: Option<u64>,
    pub max_concurrent: usize,
    /// Read-modify-write of the queue, one at a time.
    queue: tokio::sync::Mutex<()>,
    /// Builds running: run id → (job, its engine).
    running: Mutex<HashMap<String, (String, Arc<Engine>)>>,
    /// Said when a build ends or a webhook queues one.
    pub wake: Notify,
}

impl Watcher {
    pub fn new(svc: Arc<Services>, loaded: steppe_language::Loaded, scope: Scope, max_concurrent: usize) -> Result<Arc<Self>, String> {
        let store = svc.out.store().cloned().ok_or("no run store to keep the watch in")?;
        Ok(Arc::new(Watcher {
            svc,
            loaded,
            scope,
            store,
            preflight: true,
            force: false,
            pins: Vec::new(),
            version_history: None,
            run_history: None,
            max_concurrent: max_concurrent.max(1),
            queue: tokio::sync::Mutex::new(()),
            running: Mutex::default(),
            wake: Notify::new(),
        }))
    }

    fn pipeline(&self) -> &Pipeline {
        &self.loaded.pipeline
    }

    fn say(&self, line: &str) {
        self.svc.out.note(line);
    }

    /// An engine for one build, with an abort switch of its own.
    fn engine(&self) -> Arc<Engine> {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut e = crate::services::make_engine_with(&self.svc, &self.loaded, self.scope.clone(), Vec::new(), None, Arc::new(tx), rx);
        e.preflight = self.preflight;
        e.force = self.force;
        e.pins = self.pins.clone();
        e.version_history = self.version_history;
        e.run_history = self.run_history;
        e.park_questions = true;
        Arc::new(e)
    }

    /// Builds a stopped watcher left running wait again.
    pub async fn recover(&self) -> Result<(), String> {
        let _g = self.queue.lock().await;
        let mut rows = queue::load(self.store.as_ref(), &self.scope).map_err(|e| e.to_string())?;
        let n = queue::reset_interrupted(&mut rows);
        if n > 0 {
            queue::save(self.store.as_ref(), &self.scope, &rows).map_err(|e| e.to_string())?;
            self.say(&format!("watch: {n} build(s) interrupted when the last watcher stopped wait again"));
        }
        Ok(())
    }

    /// Checks every trigger resource once and queues what new versions reach.
    pub async fn poll(self: &Arc<Self>) {
        for (resource, jobs) in triggers(self.pipeline()) {
            if let Err(e) = self.poll_one(&resource, &jobs, false).await {
                self.say(&format!("watch: check {}: {e} (tried again next poll)", shown(&resource)));
            }
        }
    }

    /// Checks one resource; `changed` (a webhook) queues its jobs whatever
    /// the check says. The cursor moves only after the jobs are queued.
    pub async fn poll_one(self: &Arc<Self>, resource: &str, jobs: &[String], changed: bool) -> Result<(), String> {
        let Some(first) = self.pipeline().jobs.first().cloned() else { return Ok(()) };
        let checker = JobRun::new(self.engine(), first, "watch".into());
        let versions = checker.check_resource(resource).await.map_err(|e| e.message)?;
        let Some(newest) = versions.last().cloned() else {
            if changed {
                self.enqueue(jobs, &format!("webhook for {resource}")).await?;
            }
            return Ok(());
        };
        let key = format!("watch:cursor:{resource}");
        let cursor: Option<Value> = self.store.value(&self.scope, &key).map_err(|e| e.to_string())?.and_then(|t| serde_json::from_str(&t).ok());
        let fresh = cursor.as_ref() != Some(&newest);
        if cursor.is_none() {
            // Cold start: the newest version builds once; an `every` job
            // starts from it rather than from the first version ever seen.
            for job in self.pipeline().jobs.iter().filter(|j| jobs.contains(&j.name)) {
                let every = job.plan.iter().any(|s| s.get.is_some() && s.resource.as_ref().or(s.get.as_ref()).is_some_and(|r| r == resource) && matches!(s.version, Some(VersionSpec::Every)));
                if every {
                    for v in &versions[..versions.len() - 1] {
                        self.store.record_taken(&self.scope, &job.name, resource, v).map_err(|e| e.to_string())?;
                    }
                }
            }
        }
        if fresh || changed {
            let why = if changed { format!("webhook for {resource}") } else { format!("{resource} {newest}") };
            self.enqueue(jobs, &why).await?;
        }
        if fresh {
            self.store.set_value(&self.scope, &key, Some(&newest.to_string())).map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    pub async fn enqueue(&self, jobs: &[String], why: &str) -> Result<(), String> {
        let _g = self.queue.lock().await;
        let mut rows = queue::load(self.store.as_ref(), &self.scope).map_err(|e| e.to_string())?;
        let mut queued = Vec::new();
        for j in jobs {
            if queue::enqueue(&mut rows, j, why, now_ms()) {
                queued.push(j.as_str());
            }
        }
        queue::save(self.store.as_ref(), &self.scope, &rows).map_err(|e| e.to_string())?;
        if !queued.is_empty() {
            self.say(&format!("watch: queued {} ({})", queued.iter().map(|j| shown(j).to_string()).collect::<Vec<_>>().join(", "), shown(why)));
        }
        self.wake.notify_one();
        Ok(())
    }

    /// Starts what the queue and the limits allow; how many builds run now,
    /// and whether more could start (only `--max-concurrent` held them back).
    pub async fn dispatch(self: &Arc<Self>) -> (usize, bool) {
        let _g = self.queue.lock().await;
        let mut rows = queue::load(self.store.as_ref(), &self.scope).unwrap_or_default();
        let limits: HashMap<String, Limits> = self.pipeline().jobs.iter().map(|j| (j.name.clone(), Limits::of(j))).collect();
        let paused = |job: &str| queue::breaker(self.store.as_ref(), &self.scope, job).paused;
        let mut started = Vec::new();
        let more = loop {
            if self.running_count() + started.len() >= self.max_concurrent {
                break true;
            }
            match queue::claim(&mut rows, &limits, &paused) {
                Ok(job) => started.push(job),
                Err(_) => break false,
            }
        };
        if !started.is_empty() {
            if let Err(e) = queue::save(self.store.as_ref(), &self.scope, &rows) {
                self.say(&format!("watch: saving the queue: {e}"));
            }
        }
        for job in started {
            self.start_build(job);
        }
        (self.running_count(), more)
    }

    fn running_count(&self) -> usize {
        self.running.lock().map(|r| r.len()).unwrap_or(0)
    }

    fn start_build(self: &Arc<Self>, job_name: String) {
        let Some(job) = self.pipeline().jobs.iter().find(|j| j.name == job_name).cloned() else {
            let me = self.clone();
            tokio::spawn(async move { me.ended(&job_name, None, "").await });
            return;
        };
        let engine = self.engine();
        let id = crate::run_actor::run_id();
        if let Ok(mut r) = self.running.lock() {
            r.insert(id.clone(), (job_name.clone(), engine.clone()));
        }
        self.say(&format!("watch: build of {} started: {id}", shown(&job_name)));
        let me = self.clone();
        tokio::spawn(async move {
            let r = crate::run_actor::run_in_actor(JobRun::new(engine, job, id.clone())).await;
            if let Ok(mut running) = me.running.lock() {
                running.remove(&id);
            }
            let outcome = Outcome::of(&r.result);
            match &r.result {
                Ok(()) => me.say(&format!("watch: build of {} succeeded: {id}", shown(&job_name))),
                Err(e) => me.say(&format!("watch: build of {} {}: {id}: {}", shown(&job_name), outcome.word(), crate::text::shown_lines(&e.message))),
            }
            let class = r.result.as_ref().err().map(|e| e.class);
            me.ended(&job_name, Some(class), &id).await;
        });
    }

    /// A build ended (`None`: its job is gone): its row goes, its breaker
    /// counts it (an interrupted build does not count), a success queues
    /// the jobs waiting for it.
    async fn ended(self: &Arc<Self>, job: &str, class: Option<Option<Class>>, _id: &str) {
        {
            let _g = self.queue.lock().await;
            let mut rows: Vec<Row> = queue::load(self.store.as_ref(), &self.scope).unwrap_or_default();
            if class == Some(Some(Class::Aborted)) {
                // Interrupted: it waits again, for the next start.
                if let Some(r) = rows.iter_mut().find(|r| r.job == job && r.state == State::Running) {
                    r.state = State::Pending;
                }
            } else {
                queue::finish(&mut rows, job);
            }
            if let Err(e) = queue::save(self.store.as_ref(), &self.scope, &rows) {
                self.say(&format!("watch: saving the queue: {e}"));
            }
        }
        if let Some(class) = class.filter(|c| *c != Some(Class::Aborted)) {
            let succeeded = class.is_none();
            let max = self.pipeline().jobs.iter().find(|j| j.name == job).and_then(|j| j.max_consecutive_failures);
            let mut b = queue::breaker(self.store.as_ref(), &self.scope, job);
            if queue::count(&mut b, succeeded, max) {
                self.say(&format!("trigger.job_paused: {} paused after {} consecutive failed builds; resume it with: steppe jobs {} --resume {}", shown(job), b.failures, shown(&self.loaded.path.display().to_string()), shown(job)));
            }
            if let Err(e) = queue::set_breaker(self.store.as_ref(), &self.scope, job, &b) {
                self.say(&format!("watch: recording {job}'s failures: {e}"));
            }
            if succeeded {
                let next = downstream(self.pipeline(), job);
                if !next.is_empty() {
                    if let Err(e) = self.enqueue(&next, &format!("{job} succeeded")).await {
                        self.say(&format!("watch: queueing after {job}: {e}"));
                    }
                }
            }
        }
        self.wake.notify_one();
    }

    /// Stops: interruptible builds are aborted (and wait again at the next
    /// start), the others are waited for, up to [`SHUTDOWN_GRACE`].
    pub async fn stop(&self) {
        let running: Vec<(String, bool, Arc<Engine>)> = self
            .running
            .lock()
            .map(|r| r.values().map(|(j, e)| (j.clone(), self.pipeline().jobs.iter().any(|x| &x.name == j && x.interruptible == Some(true)), e.clone())).collect())
            .unwrap_or_default();
        for (job, interruptible, engine) in &running {
            if *interruptible {
                self.say(&format!("watch: interrupting {} (interruptible: true); it runs again at the next start", shown(job)));
                engine.abort();
            } else {
                self.say(&format!("watch: waiting for {} to end (at most {})", shown(job), steppe_language::duration::show(SHUTDOWN_GRACE)));
            }
        }
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        loop {
            let left: Vec<(String, Arc<Engine>)> = self.running.lock().map(|r| r.values().cloned().collect()).unwrap_or_default();
            if left.is_empty() {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                for (_, e) in &left {
                    e.abort();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // An interrupted build's row stays running: the next start queues it again.
    }
}

impl Watcher {
    /// Polls every `interval` and runs what is queued until `stop` resolves
    /// (then stops as [`Watcher::stop`] says; true) or, with `once`, until
    /// the first poll's builds and what they queued have run (false).
    pub async fn run(self: &Arc<Self>, interval: Duration, once: bool, stop: impl std::future::Future<Output = ()>) -> bool {
        tokio::pin!(stop);
        let mut next_poll = tokio::time::Instant::now();
        loop {
            if tokio::time::Instant::now() >= next_poll {
                self.poll().await;
                next_poll = tokio::time::Instant::now() + interval;
            }
            let (running, more) = self.dispatch().await;
            if once && running == 0 && !more {
                return false;
            }
            let wait = if once { Duration::from_secs(3600) } else { next_poll.saturating_duration_since(tokio::time::Instant::now()) };
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(wait) => {}
                _ = &mut stop => {
                    self.stop().await;
                    return true;
                }
            }
        }
    }
}

/// Rows as `steppe runs --queue` prints them.
pub fn queue_table(rows: &[Row]) -> Vec<String> {
    let mut out = vec![format!("{:<28} {:<8} {:<21} WHY", "JOB", "STATE", "QUEUED")];
    for r in rows {
        let state = match r.state {
            State::Pending => "pending",
            State::Running => "running",
        };
        out.push(format!("{:<28} {:<8} {:<21} {}", shown(&r.job), state, crate::cli::format::fmt_time(r.queued_ms), shown(&r.why)));
    }
    out
}
