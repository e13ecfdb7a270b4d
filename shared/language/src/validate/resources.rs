//! Resource types, resources (a built-in type's `source:` keys) and MCP servers.

use std::collections::HashSet;

use serde_json::Value;

use super::{check_container, check_env, is_env_name, Container, Cx};
use crate::builtins::{self, BuiltinResourceType};
use crate::expr::{compile, Stage};
use crate::model::{McpStage, Resource, ResourceType};

/// Which backend a resource type uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Shell,
    Expr,
    Mcp,
    None,
}

pub(crate) fn backend(t: &ResourceType) -> Backend {
    let Some(c) = &t.config else { return Backend::None };
    if c.mcp.is_some() {
        Backend::Mcp
    } else if c.expr.is_some() {
        Backend::Expr
    } else if c.check.is_some() || c.in_.is_some() || c.out.is_some() {
        Backend::Shell
    } else {
        Backend::None
    }
}

fn stage_tool(s: &Option<McpStage>) -> bool {
    s.as_ref().and_then(|s| s.tool.as_deref()).is_some_and(|t| !t.is_empty())
}

/// Whether the type can publish (a put needs it).
pub(crate) fn has_out(t: &ResourceType) -> bool {
    let Some(c) = &t.config else { return false };
    match backend(t) {
        Backend::Shell => c.out.is_some(),
        Backend::Expr => c.expr.as_ref().is_some_and(|e| e.out.is_some()),
        Backend::Mcp => c.mcp.as_ref().is_some_and(|m| stage_tool(&m.out)),
        Backend::None => false,
    }
}

pub(crate) fn check(cx: &mut Cx) {
    let p = cx.p;
    // The built-in types the file does not shadow (registered after it, so not in it).
    let mut builtin = HashSet::new();
    for (i, t) in p.resource_types.iter().enumerate() {
        let path = format!("resource_types[{i}]");
        if !cx.r.map.contains(&path) {
            builtin.insert(t.name.as_str());
        }
        check_type(cx, t, &path);
    }
    for (i, r) in p.resources.iter().enumerate() {
        let path = format!("resources[{i}]");
        match cx.types.get(r.type_.as_str()).copied() {
            None => {
                let names: Vec<&str> = p.resource_types.iter().map(|t| t.name.as_str()).collect();
                let s = cx.suggest(&r.type_, names);
                cx.err(&format!("{path}.type"), format!("resource \"{}\" names type \"{}\", which is not declared in resource_types: (or built in){s}", r.name, r.type_));
            }
            Some(t) => {
                if backend(t) == Backend::Mcp && r.env.is_some() {
                    cx.err(&format!("{path}.env"), format!("resource \"{}\": env: has no effect on an mcp-backed type; the server's own environment applies", r.name));
                }
                if let Some(doc) = builtin.contains(t.name.as_str()).then(|| builtins::resource_type_doc(&t.name)).flatten() {
                    check_builtin_source(cx, r, doc, &path);
                }
            }
        }
        if let Some(env) = &r.env {
            check_env(cx, env, &format!("{path}.env"));
        }
        if let Some(w) = &r.webhook_token_env {
            if !is_env_name(w) {
                cx.err(&format!("{path}.webhook_token_env"), "webhook_token_env must be the NAME of an environment variable (like GITHUB_WEBHOOK_TOKEN), not the token itself");
            }
        }
    }
    for (i, s) in p.mcp_servers.iter().enumerate() {
        let path = format!("mcp_servers[{i}]");
        match (&s.endpoint, &s.command, &s.stepgate) {
            (Some(_), Some(_), _) => cx.err(&path, format!("mcp server \"{}\": endpoint and command are mutually exclusive — an MCP server is either remote (endpoint) or a local stdio program (command)", s.name)),
            (Some(_), None, Some(_)) | (None, Some(_), Some(_)) => cx.err(&path, format!("mcp server \"{}\": stepgate: is served by steppe itself, so it takes no endpoint or command", s.name)),
            (None, None, None) => cx.err(&path, format!("mcp server \"{}\" needs an endpoint: (http), a command: (stdio) or stepgate: (gated stepfiles)", s.name)),
            _ => {}
        }
        if let Some(g) = &s.stepgate {
            let gp = format!("{path}.stepgate");
            if g.stepfiles.is_empty() {
                cx.err(&format!("{gp}.stepfiles"), format!("mcp server \"{}\": stepgate: serves at least one stepfile", s.name));
            }
            for (j, f) in g.stepfiles.iter().enumerate() {
                if let Err(e) = crate::confine::check_relative(f, "the pipeline's directory").and_then(|climb| if climb > 0 { Err(crate::confine::PathError::Escapes { root: "the pipeline's directory" }) } else { Ok(0) }) {
                    cx.err(&format!("{gp}.stepfiles[{j}]"), format!("mcp server \"{}\": stepfile \"{f}\" {e}", s.name));
                }
            }
            for (j, n) in g.env.iter().flatten().enumerate() {
                if !is_env_name(n) {
                    cx.err(&format!("{gp}.env[{j}]"), format!("mcp server \"{}\": env lists the NAMEs of variables, not \"{n}\"", s.name));
                }
            }
            if s.args.is_some() || s.cwd.is_some() || s.auth.is_some() {
                cx.err(&path, format!("mcp server \"{}\": args, cwd and auth do not apply to a stepgate: server", s.name));
            }
        }
        if let Some(e) = &s.endpoint {
            match url_parts(e) {
                Err(m) => cx.err(&format!("{path}.endpoint"), format!("mcp server \"{}\": endpoint {m}", s.name)),
                Ok((_, userinfo)) if userinfo => cx.err(&format!("{path}.endpoint"), format!("mcp server \"{}\": endpoint must not carry credentials; use auth:", s.name)),
                _ => {}
            }
            if s.args.is_some() || s.cwd.is_some() {
                cx.err(&path, format!("mcp server \"{}\": args and cwd apply only to a command: server", s.name));
            }
        }
        if let (Some(cwd), true) = (&s.cwd, cx.opts.submission) {
            if let Err(e) = crate::confine::check_relative(cwd, "the step's directory").and_then(|climb| if climb > 0 { Err(crate::confine::PathError::Escapes { root: "the step's directory" }) } else { Ok(0) }) {
                cx.err(&format!("{path}.cwd"), format!("mcp server \"{}\": cwd \"{cwd}\" {e}: a pipeline sent to a coordinator may not name paths of the hosts that run it", s.name));
            }
        }
        if let Some(a) = &s.auth {
            let kind = a.type_.as_deref().unwrap_or("none");
            let ap = format!("{path}.auth");
            match kind {
                "none" => {}
                "bearer" => {
                    if a.api_key_env.is_none() {
                        cx.err(&ap, "auth type bearer needs api_key_env: (the NAME of the variable holding the token)");
                    }
                }
                "oauth" => {
                    if a.client_secret_env.is_some() && a.client_id.is_none() {
                        cx.err(&ap, "auth.client_secret_env needs auth.client_id");
                    }
                    if let Some(port) = a.callback_port {
                        if !(1024..=65535).contains(&port) {
                            cx.err(&format!("{ap}.callback_port"), "auth.callback_port must be between 1024 and 65535");
                        }
                    }
                }
                other => {
                    let s = cx.suggest(other, ["none", "bearer", "oauth"]);
                    cx.err(&format!("{ap}.type"), format!("auth type \"{other}\" is not valid; use none, bearer or oauth{s}"));
                }
            }
            if kind != "none" && s.endpoint.is_none() {
                cx.err(&ap, format!("mcp server \"{}\": auth needs an http endpoint; a stdio server takes none", s.name));
            }
            for (v, key) in [(&a.api_key_env, "api_key_env"), (&a.client_secret_env, "client_secret_env")] {
                if let Some(v) = v {
                    if !is_env_name(v) {
                        cx.err(&format!("{ap}.{key}"), format!("{key} must be the NAME of an environment variable, not \"{v}\""));
                    }
                }
            }
        }
    }
}

/// A resource of a built-in type: its `source:` sets only the keys the type
/// reads, and every key it needs.
fn check_builtin_source(cx: &mut Cx, r: &Resource, doc: &BuiltinResourceType, path: &str) {
    let keys = || doc.source.iter().map(|k| k.key);
    let takes = doc.source.iter().map(|k| if k.required { format!("{} (required)", k.key) } else { k.key.to_string() }).collect::<Vec<_>>().join(", ");
    let empty = serde_json::Map::new();
    let source = match &r.source {
        None | Some(Value::Null) => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => {
            cx.err(&format!("{path}.source"), format!("resource \"{}\": source: of a {} resource is a mapping; it takes {takes}", r.name, doc.name));
            return;
        }
    };
    for key in source.keys() {
        if !keys().any(|k| k == key) {
            let sug = cx.suggest(key, keys());
            cx.err(&format!("{path}.source.{key}"), format!("resource \"{}\": unknown source key \"{key}\" for a {} resource{sug}; a {} source takes {takes}", r.name, doc.name, doc.name));
        }
    }
    for k in doc.source.iter().filter(|k| k.required && !source.contains_key(k.key)) {
        let at = if r.source.is_some() { format!("{path}.source") } else { path.to_string() };
        cx.err(&at, format!("resource \"{}\": a {} resource needs source.{}: {}", r.name, doc.name, k.key, k.description));
    }
}

/// Checks a URL is http(s) and says whether it carries userinfo.
pub(crate) fn url_parts(u: &str) -> Result<(String, bool), String> {
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
        .ok_or_else(|| format!("\"{u}\" must be an http:// or https:// URL"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() {
        return Err(format!("\"{u}\" has no host"));
    }
    let userinfo = authority.contains('@');
    let host = authority.rsplit('@').next().unwrap_or(authority);
    Ok((host.to_string(), userinfo))
}

fn check_type(cx: &mut Cx, t: &ResourceType, path: &str) {
    let c_path = format!("{path}.config");
    check_container(
        cx,
        &Container {
            image: t.image.as_deref(),
            user: t.user.as_deref(),
            network: t.network.as_deref(),
            privileged: t.privileged,
            limits: t.container_limits.as_ref(),
            env: t.env.as_deref(),
        },
        t.image.as_deref(),
        path,
    );
    let Some(c) = &t.config else {
        cx.err(path, format!("resource_type \"{}\" needs a config: with check/in/out, expr: or mcp:", t.name));
        return;
    };
    let shell = c.check.is_some() || c.in_.is_some() || c.out.is_some();
    let mut set = Vec::new();
    if shell {
        set.push("check/in/out");
    }
    if c.mcp.is_some() {
        set.push("mcp:");
    }
    if c.expr.is_some() {
        set.push("expr:");
    }
    if set.len() > 1 {
        cx.err(&c_path, format!("resource_type \"{}\": {} are mutually exclusive — a resource type picks exactly one backend", t.name, set.join(", ")));
    }
    if set.is_empty() {
        cx.err(&c_path, format!("resource_type \"{}\": config sets none of check/in/out, expr: or mcp:", t.name));
    }
    if let Some(e) = &c.expr {
        if e.check.is_none() && e.in_.is_none() && e.out.is_none() {
            cx.err(&format!("{c_path}.expr"), format!("resource_type \"{}\": expr: sets none of check/in/out", t.name));
        }
        for (src, stage) in [(&e.check, Stage::Check), (&e.in_, Stage::In), (&e.out, Stage::Out)] {
            if let Some(src) = src {
                if let Err(err) = compile(src, stage) {
                    let (line, col) = line_col(src, err.pos);
                    cx.err(
                        &format!("{c_path}.expr.{}", stage.name()),
                        format!("resource_type \"{}\": expr.{}: {} (line {line}, column {col} of the expression)", t.name, stage.name(), err.message),
                    );
                }
            }
        }
        let banned: Vec<&str> = [
            (t.image.is_some(), "image:"),
            (t.network.is_some(), "network:"),
            (t.user.is_some(), "user:"),
            (t.privileged.is_some(), "privileged:"),
            (t.container_limits.is_some(), "container_limits:"),
        ]
        .iter()
        .filter(|(s, _)| *s)
        .map(|(_, k)| *k)
        .collect();
        if !banned.is_empty() {
            cx.err(path, format!("resource_type \"{}\": expr: evaluates in-process, so {} cannot apply", t.name, banned.join("/")));
        }
    }
    if let Some(m) = &c.mcp {
        let mp = format!("{c_path}.mcp");
        match m.server.as_deref() {
            None => cx.err(&mp, format!("resource_type \"{}\": mcp: needs server: (the name of an mcp_servers: entry)", t.name)),
            Some(s) => match cx.servers.get(s).copied() {
                None => {
                    let names: Vec<&str> = cx.p.mcp_servers.iter().map(|m| m.name.as_str()).collect();
                    let sug = cx.suggest(s, names);
                    cx.err(&format!("{mp}.server"), format!("resource_type \"{}\": mcp: names server \"{s}\", which is not declared in mcp_servers:{sug}", t.name));
                }
                Some(srv) => {
                    if srv.cwd.as_deref().is_some_and(|d| !std::path::Path::new(d).is_absolute()) {
                        cx.err(&format!("{mp}.server"), format!("resource_type \"{}\": mcp server \"{s}\" has a relative cwd, which has no step directory to resolve against here; make it absolute", t.name));
                    }
                }
            },
        }
        let stages = [("check", &m.check), ("in", &m.in_), ("out", &m.out)];
        if stages.iter().all(|(_, s)| s.is_none()) {
            cx.err(&mp, format!("resource_type \"{}\": mcp: sets none of check/in/out", t.name));
        }
        for (name, s) in stages {
            if let Some(s) = s {
                if s.tool.as_deref().is_none_or(str::is_empty) {
                    cx.err(&format!("{mp}.{name}"), format!("resource_type \"{}\": mcp.{name} names no tool", t.name));
                }
            }
        }
    }
}

/// 1-based line and column of byte offset `pos` in `src`.
fn line_col(src: &str, pos: usize) -> (usize, usize) {
    let before = &src[..pos.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}
