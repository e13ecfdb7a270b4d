//! Whole-document `file:` includes of `tasks:` and `agents:` entries, inlined at the node level.

use super::options::LoadOptions;
use super::reader::FileReader;
use crate::source::{Mark, SourceFiles};
use crate::yaml::{self, Node, NodeKind};

/// Inlines whole-document `file:` includes of `tasks:` and `agents:` entries,
/// one level deep: the entry's own keys win, except `privileged`, which is on
/// if either says so.
pub(super) fn inline_includes(
    root: &mut Node,
    reader: &mut FileReader,
    files: &mut SourceFiles,
    opts: &LoadOptions,
    spent: &mut yaml::Size,
    problems: &mut Vec<(Mark, String, String)>,
) {
    let NodeKind::Map(entries) = &mut root.kind else { return };
    for (k, v) in entries.iter_mut() {
        let section = match k.as_str() {
            Some(s @ ("tasks" | "agents")) => s,
            _ => continue,
        };
        let NodeKind::Seq(items) = &mut v.kind else { continue };
        let forbidden: &[&str] = if section == "tasks" { &["file", "run_file"] } else { &["file", "system_file"] };
        for (i, item) in items.iter_mut().enumerate() {
            let entry_path = format!("{section}[{i}]");
            let Some(file_node) = item.get("file") else { continue };
            let Some(rel) = file_node.as_str().map(str::to_string) else { continue };
            let mark = file_node.mark;
            let fpath = format!("{entry_path}.file");
            let text = match reader.read(&rel, "file") {
                Ok(t) => t,
                Err(e) => {
                    problems.push((mark, fpath, e));
                    continue;
                }
            };
            let id = files.add(&reader.dir.join(&rel));
            let text = match opts.substitute(&text) {
                Ok(t) => t,
                Err(e) => {
                    problems.push((mark, fpath, format!("{rel}: {e}")));
                    continue;
                }
            };
            let doc = match yaml::parse_within(&text, id, spent) {
                Ok((Some(doc), dup)) => {
                    for d in dup {
                        problems.push((d.mark, fpath.clone(), d.message));
                    }
                    doc
                }
                Ok((None, _)) => {
                    problems.push((mark, fpath, format!("file: {rel} is empty")));
                    continue;
                }
                Err(e) => {
                    problems.push((e.mark, fpath, format!("invalid YAML in {rel}: {}", e.message)));
                    continue;
                }
            };
            let NodeKind::Map(doc_entries) = doc.kind else {
                problems.push((doc.mark, fpath, format!("file: {rel} must hold a mapping of {} fields", &section[..section.len() - 1])));
                continue;
            };
            let NodeKind::Map(inline) = &mut item.kind else { continue };
            let mut merged: Vec<(Node, Node)> = Vec::new();
            for (dk, dv) in doc_entries {
                let Some(name) = dk.as_str() else { continue };
                if forbidden.contains(&name) {
                    problems.push((dk.mark, fpath.clone(), format!("{rel} sets {name}:, but includes are resolved one level deep only")));
                    continue;
                }
                if name == "name" {
                    continue;
                }
                match inline.iter().position(|(ik, _)| ik.as_str() == Some(name)) {
                    None => merged.push((dk, dv)),
                    Some(pos) if name == "privileged" => {
                        let inline_on = inline[pos].1.as_str() == Some("true");
                        let doc_on = dv.as_str() == Some("true");
                        if doc_on && !inline_on {
                            inline[pos].1 = dv;
                        }
                    }
                    Some(_) => {}
                }
            }
            inline.extend(merged);
        }
    }
}
