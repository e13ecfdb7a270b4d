//! A get step: its resource, version, `passed:` constraints and trigger.

use std::collections::HashSet;

use super::super::resources::{backend, Backend};
use super::super::Cx;
use super::*;
use crate::model::{Job, Step, VersionSpec};

pub(super) fn check_get(cx: &mut Cx, job: &Job, s: &Step, path: &str, place: Place) {
    let name = s.get.as_deref().unwrap_or_default();
    let res_name = s.resource.as_deref().unwrap_or(name);
    let res = cx.resources.get(res_name).copied();
    match res {
        None => {
            let names: Vec<&str> = cx.p.resources.iter().map(|r| r.name.as_str()).collect();
            let sug = cx.suggest(res_name, names);
            let key = if s.resource.is_some() { "resource" } else { "get" };
            cx.err(&format!("{path}.{key}"), format!("get \"{name}\" names resource \"{res_name}\", which is not declared in resources:{sug}"));
        }
        Some(r) => {
            if let Some(t) = cx.types.get(r.type_.as_str()).copied() {
                let c = t.config.as_ref();
                match backend(t) {
                    Backend::Expr if c.and_then(|c| c.expr.as_ref()).is_none_or(|e| e.check.is_none()) => {
                        cx.err(path, format!("get \"{name}\" targets expr-backed resource type \"{}\", which sets no expr.check", t.name));
                    }
                    Backend::Mcp if c.and_then(|c| c.mcp.as_ref()).and_then(|m| m.check.as_ref()).and_then(|c| c.tool.as_deref()).is_none_or(str::is_empty) => {
                        cx.err(path, format!("get \"{name}\" targets mcp-backed resource type \"{}\", which sets no mcp.check.tool", t.name));
                    }
                    _ => {}
                }
            }
        }
    }
    match &s.version {
        Some(VersionSpec::Other(w)) => {
            let sug = cx.suggest(w, ["latest", "every"]);
            cx.err(&format!("{path}.version"), format!("version \"{w}\" is not valid; use latest, every, or a mapping of version fields{sug}"));
        }
        Some(VersionSpec::Every) if !place.top_level => {
            cx.err(&format!("{path}.version"), "version: every is only valid on a top-level get");
        }
        _ => {}
    }
    if let Some(passed) = &s.passed {
        if passed.is_empty() {
            cx.err(&format!("{path}.passed"), "passed must name at least one job");
        }
        let mut seen = HashSet::new();
        for (i, j) in passed.iter().enumerate() {
            let p = format!("{path}.passed[{i}]");
            if !seen.insert(j.as_str()) {
                cx.err(&p, format!("passed names job \"{j}\" twice"));
                continue;
            }
            if j == &job.name {
                cx.err(&p, "passed names its own job");
                continue;
            }
            match cx.jobs.get(j.as_str()).copied() {
                None => {
                    let names: Vec<&str> = cx.p.jobs.iter().map(|j| j.name.as_str()).collect();
                    let sug = cx.suggest(j, names);
                    cx.err(&p, format!("passed names job \"{j}\", which does not exist{sug}"));
                }
                Some(other) => {
                    if !job_gets(other, res_name) {
                        cx.err(&p, format!("passed names job \"{j}\", which never gets resource \"{res_name}\""));
                    }
                }
            }
        }
    }
}

/// Whether any get in `job` (at any depth) fetches `resource`.
pub(super) fn job_gets(job: &Job, resource: &str) -> bool {
    let mut found = false;
    crate::model::walk::each_plan_step(job, &mut |s, _| {
        found |= s.get.is_some() && s.resource.as_deref().or(s.get.as_deref()) == Some(resource);
    });
    found
}
