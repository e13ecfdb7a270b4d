//! A put step: a resource that can be written to, and what it sends.


use super::super::resources::{backend, has_out, Backend};
use super::super::Cx;
use crate::model::Step;

pub(super) fn check_put(cx: &mut Cx, s: &Step, path: &str) {
    let name = s.put.as_deref().unwrap_or_default();
    match cx.resources.get(name).copied() {
        None => {
            let names: Vec<&str> = cx.p.resources.iter().map(|r| r.name.as_str()).collect();
            let sug = cx.suggest(name, names);
            cx.err(&format!("{path}.put"), format!("put \"{name}\" names a resource that is not declared in resources:{sug}"));
        }
        Some(r) => {
            if let Some(t) = cx.types.get(r.type_.as_str()).copied() {
                if !has_out(t) {
                    let msg = match backend(t) {
                        Backend::Expr => format!("put \"{name}\" targets expr-backed resource type \"{}\", which sets no expr.out", t.name),
                        Backend::Mcp => format!("put \"{name}\" targets mcp-backed resource type \"{}\", which sets no mcp.out.tool", t.name),
                        _ => format!("put \"{name}\" targets resource type \"{}\", which declares no out: command", t.name),
                    };
                    cx.err(path, msg);
                }
            }
        }
    }
}
