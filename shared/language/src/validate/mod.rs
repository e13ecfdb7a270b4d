//! Every load-time rule of the format (pipeline-language.md §10, the rules of
//! agent-steps.md, and the closed tool list of the sandbox).
//!
//! Checks never stop at the first problem: each reports what it finds and the
//! next runs, so `steppe validate` shows everything at once.

mod agents;
mod flow;
mod resources;
mod steps;
pub mod unhonoured;

pub(crate) use steps::misplaced;

use std::collections::{HashMap, HashSet};

use crate::load::options::LoadOptions;
use crate::load::report::Report;
use crate::model::{AgentDef, ContainerLimits, Job, McpServer, Pipeline, Resource, ResourceType, TaskDef};
use crate::suggest::did_you_mean;

pub(crate) struct Cx<'p, 'r, 'a> {
    pub p: &'p Pipeline,
    pub opts: &'p LoadOptions,
    pub r: &'r mut Report<'a>,
    pub types: HashMap<&'p str, &'p ResourceType>,
    pub resources: HashMap<&'p str, &'p Resource>,
    pub agents: HashMap<&'p str, &'p AgentDef>,
    pub tasks: HashMap<&'p str, &'p TaskDef>,
    pub servers: HashMap<&'p str, &'p McpServer>,
    pub jobs: HashMap<&'p str, &'p Job>,
    /// Agents some step, fix, judge, responder or sub-agent grant reaches.
    pub used_agents: HashSet<&'p str>,
    /// Step names of the job being checked → whether the step declares verdicts.
    pub current_names: HashMap<String, bool>,
}

impl<'p> Cx<'p, '_, '_> {
    pub fn err(&mut self, path: &str, msg: impl Into<String>) {
        self.r.err(path, msg);
    }

    pub fn suggest<'c>(&self, written: &str, names: impl IntoIterator<Item = &'c str>) -> String {
        did_you_mean(written, names)
    }

    pub fn agent_names(&self) -> Vec<&'p str> {
        self.p.agents.iter().map(|a| a.name.as_str()).collect()
    }
}

/// The most cells one `across:` step runs (the product of its axes).
pub const MAX_ACROSS_CELLS: usize = 10_000;

/// Runs every rule against a decoded pipeline, reporting into `r`.
pub fn validate(p: &Pipeline, opts: &LoadOptions, r: &mut Report) {
    let mut cx = Cx {
        p,
        opts,
        r,
        types: HashMap::new(),
        resources: HashMap::new(),
        agents: HashMap::new(),
        tasks: HashMap::new(),
        servers: HashMap::new(),
        jobs: HashMap::new(),
        used_agents: HashSet::new(),
        current_names: HashMap::new(),
    };
    index(&mut cx);
    top_level(&mut cx);
    resources::check(&mut cx);
    task_entries(&mut cx);
    for (j, job) in p.jobs.iter().enumerate() {
        steps::check_job(&mut cx, job, &format!("jobs[{j}]"));
    }
    agents::check(&mut cx);
    unhonoured::warn(p, cx.r);
}

/// Builds the name indexes, reporting duplicate and empty names.
fn index(cx: &mut Cx) {
    fn names<'p, T>(
        cx: &mut Cx<'p, '_, '_>,
        items: &'p [T],
        section: &str,
        what: &str,
        name: impl Fn(&'p T) -> &'p str,
    ) -> HashMap<&'p str, &'p T> {
        let mut m = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let n = name(item);
            if n.trim().is_empty() {
                cx.err(&format!("{section}[{i}].name"), format!("{what} needs a name"));
                continue;
            }
            if m.insert(n, item).is_some() {
                cx.err(&format!("{section}[{i}].name"), format!("duplicate {what} name \"{n}\""));
            }
        }
        m
    }
    let p = cx.p;
    cx.types = names(cx, &p.resource_types, "resource_types", "resource type", |t| &t.name);
    cx.resources = names(cx, &p.resources, "resources", "resource", |t| &t.name);
    cx.agents = names(cx, &p.agents, "agents", "agent", |t| &t.name);
    cx.tasks = names(cx, &p.tasks, "tasks", "task", |t| &t.name);
    cx.servers = names(cx, &p.mcp_servers, "mcp_servers", "MCP server", |t| &t.name);
    cx.jobs = names(cx, &p.jobs, "jobs", "job", |t| &t.name);
}

fn top_level(cx: &mut Cx) {
    let p = cx.p;
    if p.jobs.is_empty() {
        cx.err("jobs", "the pipeline declares no jobs: (a pipeline needs at least one job)");
    }
    if let Some(d) = &p.defaults {
        if let Some(v) = d.delegate_budget_percent {
            if !(1..=100).contains(&v) {
                cx.err("defaults.delegate_budget_percent", format!("delegate_budget_percent must be between 1 and 100, not {v}"));
            }
        }
        for (v, key) in [(d.version_history, "version_history"), (d.run_history, "run_history")] {
            if v.is_some_and(|v| v < 0) {
                cx.err(&format!("defaults.{key}"), format!("{key} must not be negative (0 keeps everything)"));
            }
        }
        if let Some(pf) = &d.preflight {
            for (v, key) in [(pf.timeout, "timeout"), (pf.cache, "cache")] {
                if v.is_some_and(|v| !v.is_positive()) {
                    cx.err(&format!("defaults.preflight.{key}"), format!("preflight.{key} must be a positive duration"));
                }
            }
            if pf.cache.is_some_and(|c| c.as_nanos() > 15 * 60 * 1_000_000_000) {
                cx.err("defaults.preflight.cache", "preflight.cache may be at most 15m: a target verified longer ago than that is probed again");
            }
        }
    }
    if let Some(w) = &p.workspace {
        let strategy = w.strategy.as_deref().unwrap_or("copy");
        if !["copy", "btrfs"].contains(&strategy) {
            cx.err("workspace.strategy", format!("workspace.strategy \"{strategy}\" is not valid; use copy or btrfs{}", did_you_mean(strategy, ["copy", "btrfs"])));
        }
        if strategy == "btrfs" && w.root.is_none() {
            cx.err("workspace.strategy", "workspace.strategy btrfs requires workspace.root");
        }
        if let Some(c) = w.options.as_ref().and_then(|o| o.compression.as_deref()) {
            if !["zstd", "lzo", "zlib", "none"].contains(&c) {
                cx.err("workspace.options.compression", format!("workspace.options.compression \"{c}\" is not valid; use zstd, lzo, zlib or none"));
            }
            if strategy != "btrfs" {
                cx.err("workspace.options.compression", "workspace.options.compression applies only to strategy: btrfs");
            }
        }
        if let Some(c) = &w.cache {
            if c.resources == Some(true) && w.root.is_none() {
                cx.err("workspace.cache.resources", "workspace.cache.resources requires workspace.root");
            }
            if c.max_entries.is_some_and(|m| m < 0) {
                cx.err("workspace.cache.max_entries", "workspace.cache.max_entries must not be negative");
            }
        }
    } 
    if let Some(a) = &p.assert {
        if a.outcome.is_some() {
            cx.err("assert.outcome", "outcome is only valid on a job assert");
        }
        step_fields_off_step(cx, a, "assert");
    }
}

/// A tasks: entry's own container fields. The rules that need an image are
/// judged at each step using the entry (a step may supply the image); an entry
/// no step uses is judged on its own.
fn task_entries(cx: &mut Cx) {
    let p = cx.p;
    let mut used = HashSet::new();
    // The across variables of the cells each entry runs in.
    let mut cells: HashMap<&str, Vec<&str>> = HashMap::new();
    let mut load_vars = HashSet::new();
    crate::model::walk::each_step(p, &mut |s, _| {
        if let Some(n) = &s.load_var {
            load_vars.insert(n.as_str());
        }
        if let (Some(t), None) = (&s.task, &s.run) {
            used.insert(t.as_str());
            cells.entry(t.as_str()).or_default().extend(s.across.iter().flatten().filter_map(|a| a.var.as_deref()));
        }
    });
    for (i, t) in p.tasks.iter().enumerate() {
        let path = format!("tasks[{i}]");
        let is_used = used.contains(t.name.as_str());
        check_container(
            cx,
            &Container {
                image: t.image.as_deref(),
                user: t.user.as_deref(),
                network: if is_used { None } else { t.network.as_deref() },
                privileged: if is_used { None } else { t.privileged },
                limits: if is_used { None } else { t.container_limits.as_ref() },
                env: t.env.as_deref(),
            },
            t.image.as_deref(),
            &path,
        );
        if is_used {
            if let Some(l) = &t.container_limits {
                if l.cpu.is_none() && l.memory.is_none() {
                    cx.err(&format!("{path}.container_limits"), "container_limits sets neither cpu nor memory");
                }
            }
        }
        if t.timeout.is_some_and(|d| !d.is_positive()) {
            cx.err(&format!("{path}.timeout"), "timeout must be a positive duration");
        }
        if let Some(i) = &t.inputs {
            check_artifact_names(cx, i, &format!("{path}.inputs"), "input");
        }
        if let Some(o) = &t.outputs {
            check_artifact_names(cx, o, &format!("{path}.outputs"), "output");
        }
        if let Some(f) = &t.fix {
            steps::check_fix(cx, f, &format!("{path}.fix"));
        }
        match &t.run {
            None => cx.err(&path, format!("tasks: entry \"{}\" needs run: (or run_file:, or a file: that sets it)", t.name)),
            Some(run) => {
                for (_, r) in crate::vars::scan(run) {
                    if let crate::vars::Ref::ConcourseLocal(name) = r {
                        let across = cells.get(t.name.as_str()).map(Vec::as_slice).unwrap_or_default();
                        cx.err(&format!("{path}.run"), flow::concourse_local(name, "run", true, across, &load_vars));
                    }
                }
            }
        }
    }
}

/// `stdout`/`code`/`verdict`/`files`/`tool_calls`/`nudge` on a job or pipeline assert.
pub(crate) fn step_fields_off_step(cx: &mut Cx, a: &crate::model::AssertSpec, path: &str) {
    for (set, key) in [
        (a.stdout.is_some(), "stdout"),
        (a.code.is_some(), "code"),
        (a.verdict.is_some(), "verdict"),
        (a.files.is_some(), "files"),
        (a.tool_calls.is_some(), "tool_calls"),
        (a.nudge.is_some(), "nudge"),
    ] {
        if set {
            cx.err(&format!("{path}.{key}"), format!("{key}: stdout/code/verdict/files are only valid on task/agent step asserts"));
        }
    }
}

/// The container fields shared by steps, tasks, agents and resource types.
pub(crate) struct Container<'a> {
    pub image: Option<&'a str>,
    pub user: Option<&'a str>,
    pub network: Option<&'a str>,
    pub privileged: Option<bool>,
    pub limits: Option<&'a ContainerLimits>,
    pub env: Option<&'a [String]>,
}

/// The container rules; `image` is the resolved image (own or inherited).
pub(crate) fn check_container(cx: &mut Cx, c: &Container, resolved_image: Option<&str>, path: &str) {
    for (v, key) in [(c.image, "image"), (c.user, "user"), (c.network, "network")] {
        if let Some(v) = v {
            if v.starts_with('-') {
                cx.err(&format!("{path}.{key}"), format!("{key} \"{v}\" must not start with '-'"));
            }
        }
    }
    let has_image = resolved_image.is_some_and(|i| !i.is_empty());
    if let Some(n) = c.network {
        if !has_image {
            cx.err(&format!("{path}.network"), format!("network \"{n}\" requires image:"));
        }
    }
    if c.privileged == Some(true) && !has_image {
        cx.err(&format!("{path}.privileged"), "privileged requires image:");
    }
    if let Some(l) = c.limits {
        if !has_image {
            cx.err(&format!("{path}.container_limits"), "container_limits requires image:");
        }
        if l.cpu.is_none() && l.memory.is_none() {
            cx.err(&format!("{path}.container_limits"), "container_limits sets neither cpu nor memory");
        }
        if l.cpu.is_some_and(|c| c <= 0) {
            cx.err(&format!("{path}.container_limits.cpu"), "container_limits.cpu must be a positive share weight (1024 = docker's default)");
        }
        if let Some(m) = &l.memory {
            if m.bytes().is_none_or(|b| b == 0) {
                cx.err(&format!("{path}.container_limits.memory"), format!("container_limits.memory \"{}\" is not a size (bytes, or like 512m)", m.0));
            }
        }
    }
    if let Some(env) = c.env {
        check_env(cx, env, &format!("{path}.env"));
    }
}

pub(crate) fn check_env(cx: &mut Cx, env: &[String], path: &str) {
    for (i, e) in env.iter().enumerate() {
        if e.trim().is_empty() {
            cx.err(&format!("{path}[{i}]"), "env contains an empty variable name");
        } else if e.contains('=') {
            cx.err(&format!("{path}[{i}]"), format!("env entry \"{e}\" must be a variable NAME, not a KEY=VALUE pair"));
        }
    }
}

pub(crate) fn is_env_name(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphabetic() || f == '_')
        && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

/// Artifact names: `^[A-Za-z0-9][A-Za-z0-9._-]*$`, `upstream` reserved, no duplicates.
pub(crate) fn check_artifact_names(cx: &mut Cx, names: &[String], path: &str, what: &str) {
    let mut seen = HashSet::new();
    for (i, n) in names.iter().enumerate() {
        let p = format!("{path}[{i}]");
        if !is_artifact_name(n) {
            cx.err(&p, format!("{what} \"{n}\" is not a valid artifact name (letters, digits, . _ -, starting with a letter or digit)"));
        } else if n == "upstream" {
            cx.err(&p, format!("{what} \"upstream\" is reserved: context.from files land in upstream/"));
        }
        if !seen.insert(n.as_str()) {
            cx.err(&p, format!("{what} \"{n}\" is listed twice"));
        }
    }
}

pub fn is_artifact_name(n: &str) -> bool {
    let mut c = n.chars();
    matches!(c.next(), Some(f) if f.is_ascii_alphanumeric())
        && c.all(|ch| ch.is_ascii_alphanumeric() || matches!(ch, '.' | '_' | '-'))
}

/// The first path segment of an artifact-relative path.
pub(crate) fn first_segment(p: &str) -> &str {
    let p = p.trim_start_matches("./");
    p.split('/').next().unwrap_or(p)
}
