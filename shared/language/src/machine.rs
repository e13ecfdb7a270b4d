//! Checks of this machine against a loaded pipeline (`steppe validate` without
//! `--syntax-only`): API key variables set, stdio MCP commands and CLI agent
//! binaries on PATH, and (through the caller, which knows a Docker engine)
//! the images steps name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::builtins;
use crate::load::{Loaded, Report};
use crate::model::walk::each_step;
use crate::model::{Pipeline, Step, ToolGrant};

/// Names of every agent the plan reaches: steps, ensemble members and judges,
/// fix agents, and (transitively) sub-agents and `answered_by` responders.
pub fn reached_agents(p: &Pipeline) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    each_step(p, &mut |s: &Step, _| {
        if let Some(a) = &s.agent {
            out.insert(a.clone());
        }
        if let Some(f) = s.fix.as_ref().and_then(|f| f.agent()) {
            out.insert(f.to_string());
        }
        if let Some(d) = s.ensemble.as_ref().and_then(|e| e.decide.as_deref()) {
            if !matches!(d, "majority" | "unanimous" | "any") {
                out.insert(d.to_string());
            }
        }
    });
    for t in &p.tasks {
        if let Some(f) = t.fix.as_ref().and_then(|f| f.agent()) {
            out.insert(f.to_string());
        }
    }
    loop {
        let mut added = false;
        for a in &p.agents {
            if !out.contains(&a.name) {
                continue;
            }
            for g in a.tools.iter().flatten() {
                if let ToolGrant::Spec(s) = g {
                    for t in [&s.agent, &s.answered_by].into_iter().flatten() {
                        added |= out.insert(t.clone());
                    }
                }
            }
        }
        if !added {
            return out;
        }
    }
}

/// Finds `program` the way a shell would: a path with a slash as given, else on `$PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = Path::new(program);
        return p.is_file().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file())
}

fn env_set(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| !v.is_empty())
}

/// Whether an image reference is known before the run: not empty, and
/// made of no `{{ .vars }}` of a cell nor a `((var))` a step captures.
pub fn known_before_run(image: &str) -> bool {
    !image.is_empty() && !image.contains("{{") && !image.contains("((")
}

/// Every image the file names as written ([`known_before_run`]), with
/// the key path naming it.
pub fn named_images(p: &Pipeline) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut add = |image: &Option<String>, path: String| {
        if let Some(i) = image.as_ref().filter(|i| known_before_run(i)) {
            out.push((i.clone(), path));
        }
    };
    for (i, t) in p.resource_types.iter().enumerate() {
        add(&t.image, format!("resource_types[{i}].image"));
    }
    for (i, t) in p.tasks.iter().enumerate() {
        add(&t.image, format!("tasks[{i}].image"));
    }
    for (i, a) in p.agents.iter().enumerate() {
        add(&a.image, format!("agents[{i}].image"));
    }
    each_step(p, &mut |s: &Step, path| add(&s.image, format!("{path}.image")));
    out
}

/// Runs the machine checks, reporting into a fresh report of `loaded`'s
/// files; `image_problem` says what is wrong with an image on this machine
/// (None: nothing), asked once per distinct image.
pub fn check(loaded: &Loaded, env_model: Option<&str>, image_problem: &mut dyn FnMut(&str) -> Option<String>) -> Vec<crate::source::Diagnostic> {
    let p = &loaded.pipeline;
    let mut r = Report::new(&loaded.files, &loaded.source_map);
    let mut asked = BTreeSet::new();
    for (image, path) in named_images(p) {
        if asked.insert(image.clone()) {
            if let Some(problem) = image_problem(&image) {
                r.err(&path, problem);
            }
        }
    }
    let reached = reached_agents(p);
    let mut servers = BTreeSet::new();
    for (i, a) in p.agents.iter().enumerate() {
        if !reached.contains(&a.name) {
            continue;
        }
        let path = format!("agents[{i}]");
        let model = a
            .source
            .as_ref()
            .and_then(|s| s.model.clone())
            .or_else(|| env_model.map(str::to_string))
            .or_else(|| p.defaults.as_ref().and_then(|d| d.model.clone()));
        let key_env = a.source.as_ref().and_then(|s| s.api_key_env.clone());
        match model.as_deref() {
            Some(m) if m.starts_with('@') => {
                let cli = m[1..].split('/').next().unwrap_or_default();
                if on_path(cli).is_none() {
                    r.err(&path, format!("agent \"{}\" runs the {cli} CLI ({m}), but \"{cli}\" is not on PATH", a.name));
                }
                if let Some(k) = key_env {
                    if !env_set(&k) {
                        r.err(&format!("{path}.source.api_key_env"), format!("agent \"{}\": environment variable {k} is not set", a.name));
                    }
                }
            }
            Some(m) => {
                let provider = builtins::provider_of(m);
                let (var, required) = match (&key_env, provider) {
                    (Some(k), _) => (Some(k.clone()), true),
                    (None, Some(p)) => (p.key_env.map(str::to_string), p.key_required),
                    (None, None) => (None, false),
                };
                if let (Some(var), true) = (var, required) {
                    if !env_set(&var) {
                        r.err(&path, format!("agent \"{}\" ({m}) needs its API key in ${var}, which is not set", a.name));
                    }
                }
            }
            None => {}
        }
        for g in a.tools.iter().flatten() {
            if let ToolGrant::Spec(s) = g {
                if let Some(m) = &s.mcp {
                    servers.insert(m.clone());
                }
            }
        }
    }
    for (i, s) in p.mcp_servers.iter().enumerate() {
        if !servers.contains(&s.name) {
            continue;
        }
        if let Some(cmd) = &s.command {
            if on_path(cmd).is_none() {
                r.err(&format!("mcp_servers[{i}].command"), format!("mcp server \"{}\": command \"{cmd}\" is not on PATH", s.name));
            }
        }
        if let Some(k) = s.auth.as_ref().and_then(|a| a.api_key_env.as_ref()) {
            if !env_set(k) {
                r.err(&format!("mcp_servers[{i}].auth.api_key_env"), format!("mcp server \"{}\": environment variable {k} is not set", s.name));
            }
        }
    }
    r.diags
}
