//! The built-in tools and custom tools of agent steps. Every path goes
//! through the sandbox policy first; a refusal comes back to the model as
//! `{"error": …}` data and is recorded as a denial.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};
use steppe_runtime::agent_work::{DenialRecord, ToolDef};

use crate::host_env::HOST_ENV;
use crate::sandbox::{Access, SandboxPolicy};

pub const INLINE_CAP: usize = 32_000;
const READ_CAP: usize = 100_000;

/// Where one agent step's tools act.
pub struct Space {
    pub policy: SandboxPolicy,
    /// The working directory (`dir:` applied).
    pub cwd: PathBuf,
    pub env: Vec<String>,
    /// The step's container (`image:`): shell and custom tools run in it.
    pub toolbox: Option<std::sync::Arc<crate::container::toolbox::Toolbox>>,
}

pub fn error(msg: impl Into<String>) -> Value {
    json!({ "error": msg.into() })
}

fn arg_str<'a>(args: &'a Value, key: &str) -> Option<&'a str> {
    args.get(key).and_then(Value::as_str)
}

impl Space {
    fn check(&self, tool: &str, path: &str, access: Access, denials: &mut Vec<DenialRecord>) -> Result<PathBuf, Value> {
        self.policy.check_path(tool, path, &self.cwd, access).map_err(|d| {
            denials.push(DenialRecord { tool: d.tool.clone(), path: d.path.clone(), reason: d.reason.clone() });
            error(format!("{tool}: {}", d.reason))
        })
    }

    /// Runs a built-in tool. Unknown names are refused (and recorded).
    pub async fn builtin(&self, def: &ToolDef, args: &Value, denials: &mut Vec<DenialRecord>) -> Value {
        let name = def.name();
        let r = match name {
            "read_file" => self.read_file(args, denials),
            "list_dir" => self.list_dir(args, denials),
            "search_files" => self.search_files(args, denials),
            "write_file" => self.write_file(args, denials),
            "edit_file" => self.edit_file(args, denials),
            "run_shell" => {
                let Some(cmd) = arg_str(args, "command") else { return error("run_shell: missing required argument \"command\"") };
                let timeout = match def {
                    ToolDef::Builtin { timeout_ms, .. } => timeout_ms.map(Duration::from_millis),
                    _ => None,
                };
                Ok(self.shell(cmd, timeout, INLINE_CAP).await)
            }
            "web_fetch" => {
                let allow = match def {
                    ToolDef::Builtin { allow, .. } => allow.clone(),
                    _ => Vec::new(),
                };
                Ok(web_fetch(args, &allow, denials).await)
            }
            other => {
                denials.push(DenialRecord { tool: other.to_string(), path: String::new(), reason: format!("unknown tool for the engine: \"{other}\"") });
                Err(error(format!("unknown tool \"{other}\"")))
            }
        };
        r.unwrap_or_else(|e| e)
    }

    fn read_file(&self, args: &Value, denials: &mut Vec<DenialRecord>) -> Result<Value, Value> {
        let path = arg_str(args, "path").ok_or_else(|| error("read_file: missing required argument \"path\""))?;
        let full = self.check("read_file", path, Access::Read, denials)?;
        let bytes = self.policy.read_file(&full).map_err(|e| error(format!("read_file: {path}: {e}")))?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (start, end) = (args.get("start_line").and_then(Value::as_u64), args.get("end_line").and_then(Value::as_u64));
        if start.is_some() || end.is_some() {
            let lines: Vec<&str> = text.split_inclusive('\n').collect();
            let s = start.unwrap_or(1).max(1) as usize;
            let e = end.map(|e| e as usize).unwrap_or(lines.len()).min(lines.len());
            if s > e || s > lines.len() {
                return Err(error(format!("read_file: {path} has {} lines; start_line {s} and end_line {e} select none", lines.len())));
            }
            let mut out = String::new();
            let mut last = s - 1;
            for (i, l) in lines[s - 1..e].iter().enumerate() {
                if out.len() + l.len() > READ_CAP && i > 0 {
                    break;
                }
                out.push_str(l);
                last = s + i;
            }
            let truncated = last < e;
            return Ok(json!({"content": out, "start_line": s, "end_line": last, "truncated": truncated}));
        }
        if text.len() > READ_CAP {
            let mut cut = READ_CAP;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            return Ok(json!({"content": format!("<file_truncated>{path} is {} bytes; the first {cut} are shown (limit {READ_CAP}). Use start_line/end_line to page through the rest.</file_truncated>\n{}", text.len(), &text[..cut])}));
        }
        Ok(json!({ "content": text }))
    }

    fn list_dir(&self, args: &Value, denials: &mut Vec<DenialRecord>) -> Result<Value, Value> {
        let path = arg_str(args, "path").unwrap_or(".");
        let full = self.check("list_dir", path, Access::Read, denials)?;
        let listed = self.policy.open_dir(&full).and_then(|d| crate::sandbox::list(&d, true)).map_err(|e| error(format!("list_dir: {path}: {e}")))?;
        let mut entries: Vec<(String, bool, u64)> = listed.into_iter().map(|e| (e.name.to_string_lossy().into_owned(), e.is_dir, e.size)).collect();
        entries.sort();
        let total = entries.len();
        let shown: Vec<Value> = entries.iter().take(1000).map(|(n, d, s)| json!({"name": n, "is_dir": d, "size": s})).collect();
        let mut r = json!({"entries": shown, "total": total, "truncated": total > 1000});
        if total > 1000 {
            r["message"] = json!("only the first 1000 entries are shown; list a narrower path, or use run_shell with ls | grep");
        }
        Ok(r)
    }

    fn search_files(&self, args: &Value, denials: &mut Vec<DenialRecord>) -> Result<Value, Value> {
        let pattern = arg_str(args, "pattern");
        let glob = arg_str(args, "glob");
        if pattern.is_none() && glob.is_none() {
            return Err(error("search_files: give a pattern, a glob, or both"));
        }
        let mode = arg_str(args, "output_mode").unwrap_or("files_with_matches");
        if mode != "files_with_matches" && pattern.is_none() {
            return Err(error(format!("search_files: output_mode {mode} needs a pattern")));
        }
        let path = arg_str(args, "path").unwrap_or(".");
        let base = self.check("search_files", path, Access::Read, denials)?;
        let head = args.get("head_limit").and_then(Value::as_u64).unwrap_or(50).clamp(1, 200) as usize;
        let ci = args.get("case_insensitive").and_then(Value::as_bool).unwrap_or(false);
        let re = match pattern {
            Some(p) => Some(regex::RegexBuilder::new(p).case_insensitive(ci).build().map_err(|e| error(format!("search_files: bad pattern: {e}")))?),
            None => None,
        };
        let glob_re = glob.map(glob_to_regex).transpose().map_err(|e| error(format!("search_files: bad glob: {e}")))?;
        let base_dir = self.policy.open_dir(&base).map_err(|e| error(format!("search_files: {path}: {e}")))?;
        let (mut matches, mut counts, mut hits) = (Vec::new(), Vec::new(), Vec::new());
        let (mut total, mut scanned, mut budget) = (0usize, 0usize, 28_000usize);
        let mut visit = |dir: &std::os::fd::OwnedFd, name: &std::ffi::OsStr, rel: &Path| {
            let rel_s = rel.to_string_lossy().replace('\\', "/");
            if let Some(g) = &glob_re {
                let subject = if glob.is_some_and(|g| g.contains('/')) { rel_s.clone() } else { rel.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default() };
                if !g.is_match(&subject) {
                    return;
                }
            }
            let Some(re) = &re else {
                total += 1;
                if hits.len() < head {
                    hits.push(json!(rel_s));
                }
                return;
            };
            let Ok(mut file) = crate::sandbox::open_in(dir, name, crate::sandbox::Open::Read) else { return };
            if file.metadata().map_or(true, |m| m.len() > 2 << 20) {
                return;
            }
            let mut bytes = Vec::new();
            if std::io::Read::read_to_end(&mut file, &mut bytes).is_err() {
                return;
            }
            if bytes.iter().take(8000).any(|b| *b == 0) {
                return;
            }
            scanned += 1;
            let text = String::from_utf8_lossy(&bytes);
            let mut n = 0;
            for (i, line) in text.lines().enumerate() {
                if re.is_match(line) {
                    n += 1;
                    if mode == "content" {
                        total += 1;
                        let shown = if line.len() > 500 { format!("{} …[line truncated]", &line[..line.char_indices().take_while(|(j, _)| *j < 500).last().map_or(0, |(j, c)| j + c.len_utf8())]) } else { line.to_string() };
                        let cost = shown.len() + rel_s.len() + 120;
                        if matches.len() < head && cost <= budget {
                            budget -= cost;
                            matches.push(json!({"path": rel_s, "line": i + 1, "text": shown}));
                        }
                    }
                }
            }
            if n > 0 {
                match mode {
                    "count" => {
                        total += n;
                        if counts.len() < head {
                            counts.push(json!({"path": rel_s, "count": n}));
                        }
                    }
                    "content" => {}
                    _ => {
                        total += 1;
                        if hits.len() < head {
                            hits.push(json!(rel_s));
                        }
                    }
                }
            }
        };
        walk(&base_dir, Path::new(""), 0, &mut 20_000, &mut visit);
        let shown = match mode {
            "content" => matches.len(),
            "count" => counts.len(),
            _ => hits.len(),
        };
        let mut r = json!({"mode": mode, "base": path, "total": total, "files_scanned": scanned, "truncated": shown < total});
        match mode {
            "content" => r["matches"] = json!(matches),
            "count" => r["counts"] = json!(counts),
            _ => r["files"] = json!(hits),
        }
        if shown < total {
            r["message"] = json!(format!("{shown} of {total} shown; narrow the pattern, glob or path rather than paging"));
        }
        Ok(r)
    }

    fn write_file(&self, args: &Value, denials: &mut Vec<DenialRecord>) -> Result<Value, Value> {
        let path = arg_str(args, "path").ok_or_else(|| error("write_file: missing required argument \"path\""))?;
        let content = arg_str(args, "content").ok_or_else(|| error("write_file: missing required argument \"content\""))?;
        let full = self.check("write_file", path, Access::Write, denials)?;
        let append = args.get("append").and_then(Value::as_bool).unwrap_or(false);
        let how = if append { crate::sandbox::Open::Append } else { crate::sandbox::Open::Write };
        let r = self.policy.open_file(&full, how).and_then(|mut f| std::io::Write::write_all(&mut f, content.as_bytes()));
        r.map_err(|e| error(format!("write_file: {path}: {e}")))?;
        Ok(json!({"bytes_written": content.len(), "path": path}))
    }

    fn edit_file(&self, args: &Value, denials: &mut Vec<DenialRecord>) -> Result<Value, Value> {
        let path = arg_str(args, "path").ok_or_else(|| error("edit_file: missing required argument \"path\""))?;
        let old = arg_str(args, "old_string").unwrap_or_default();
        let new = arg_str(args, "new_string").ok_or_else(|| error("edit_file: missing required argument \"new_string\""))?;
        if old.is_empty() {
            return Err(error("edit_file: old_string is empty; to create or replace a whole file use write_file"));
        }
        if old == new {
            return Err(error("edit_file: old_string and new_string are the same; nothing to change"));
        }
        let full = self.check("edit_file", path, Access::Write, denials)?;
        let text = match self.policy.read_text(&full) {
            Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return Err(error(format!("edit_file: {path}: {e}"))),
            r => r.map_err(|_| error(format!("edit_file: {path} does not exist or is not text; to create it use write_file")))?,
        };
        let replace_all = args.get("replace_all").and_then(Value::as_bool).unwrap_or(false);
        let (span, mode) = match find_span(&text, old) {
            Some(x) => x,
            None => return Err(error(format!("edit_file: old_string was not found in {path}; read the file again and copy the exact text, indentation included"))),
        };
        let count = text.matches(span.as_str()).count();
        if count > 1 && !replace_all {
            return Err(error(format!("edit_file: old_string appears {count} times in {path}; add surrounding lines to make it unique, or set replace_all")));
        }
        let offset = text.find(span.as_str()).unwrap_or(0);
        let first_line = 1 + text[..offset].matches('\n').count();
        let updated = if replace_all { text.replace(span.as_str(), new) } else { text.replacen(span.as_str(), new, 1) };
        self.policy.write_file(&full, updated.as_bytes()).map_err(|e| error(format!("edit_file: {path}: {e}")))?;
        Ok(json!({"path": path, "replacements": if replace_all { count } else { 1 }, "first_line": first_line, "match_mode": mode}))
    }

    /// `sh -c` in the working directory, in a process group of its own
    /// (killed whole when it ends, times out or the conversation is
    /// dropped); each stream kept up to the spill limit and capped at `cap`
    /// bytes inline.
    pub async fn shell(&self, cmd: &str, timeout: Option<Duration>, cap: usize) -> Value {
        if let Some(tb) = &self.toolbox {
            return match tb.run(cmd, &self.cwd, timeout, KEEP).await {
                Ok(r) => json!({
                    "stdout": self.spill(&r.stdout.0, r.stdout.1, cap),
                    "stderr": self.spill(&r.stderr.0, r.stderr.1, cap),
                    "exit_code": r.exit_code,
                }),
                Err(e) => error(e),
            };
        }
        let mut c = tokio::process::Command::new(crate::host_env::shell());
        c.arg("-c").arg(cmd).current_dir(&self.cwd).env_clear().stdin(std::process::Stdio::null());
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).process_group(0).kill_on_drop(true);
        for name in HOST_ENV.iter().copied().chain(self.env.iter().map(String::as_str)) {
            if let Some(v) = std::env::var_os(name) {
                c.env(name, v);
            }
        }
        let mut child = match c.spawn() {
            Ok(ch) => ch,
            Err(e) => return error(format!("cannot run the command: {e}")),
        };
        let group = crate::process_group::Group::of(&child);
        let (out, err) = (child.stdout.take(), child.stderr.take());
        let run = async {
            let (o, e, status) = tokio::join!(read_bounded(out), read_bounded(err), child.wait());
            (o, e, status)
        };
        let (o, e, status) = match timeout {
            Some(t) => match tokio::time::timeout(t, run).await {
                Ok(r) => r,
                Err(_) => return error(format!("command timed out after {}", steppe_language::duration::show(t))),
            },
            None => run.await,
        };
        drop(group);
        match status {
            Ok(st) => json!({
                "stdout": self.spill(&o.0, o.1, cap),
                "stderr": self.spill(&e.0, e.1, cap),
                "exit_code": st.code().unwrap_or(-1),
            }),
            Err(e) => error(format!("cannot run the command: {e}")),
        }
    }

    /// Output over the inline cap is written whole (≤ 10 MiB) to a spill file
    /// under `.steps-agent-out/` and replaced by a pointer and a preview.
    fn spill(&self, bytes: &[u8], total: usize, cap: usize) -> String {
        if total <= cap {
            return String::from_utf8_lossy(bytes).into_owned();
        }
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = self.policy.write_root().join(".steps-agent-out");
        let file = dir.join(format!("output-{}-{}.txt", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        let limit = 10 << 20;
        let mut body = bytes[..bytes.len().min(limit)].to_vec();
        if total > limit {
            body.extend_from_slice(format!("\n... [truncated {} bytes]", total - limit).as_bytes());
        }
        let written = self.policy.write_file(&file, &body);
        match written {
            Ok(()) => {
                let preview = capped(&bytes[..bytes.len().min(2000)], 2000);
                format!(
                    "<persistent_file>\nThe output was {} and is saved in full at {}. Read it directly (with read_file and start_line/end_line), not whole.\nA preview of the first 2.0 KB follows.\n</persistent_file>\n\n{preview}",
                    human(total),
                    file.display()
                )
            }
            Err(e) => format!("{}\n[the whole output could not be saved under .steps-agent-out: {e}]", capped(bytes, cap)),
        }
    }
}

/// How much of a tool command's stream is kept (the spill file's limit,
/// and one byte more so the truncation is noticed); the rest is drained.
const KEEP: usize = (10 << 20) + 1;

/// Reads a stream to its end, keeping at most [`KEEP`] bytes of it:
/// (what was kept, how many bytes came in all).
async fn read_bounded<R: tokio::io::AsyncRead + Unpin>(r: Option<R>) -> (Vec<u8>, usize) {
    use tokio::io::AsyncReadExt;
    let Some(mut r) = r else { return (Vec::new(), 0) };
    let (mut kept, mut total) = (Vec::new(), 0usize);
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, total),
            Ok(n) => {
                total = total.saturating_add(n);
                let room = KEEP.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

fn human(n: usize) -> String {
    if n < 1024 {
        format!("{n} B")
    } else if n < 1 << 20 {
        format!("{:.1} KB", n as f64 / 1024.0)
    } else {
        format!("{:.1} MB", n as f64 / (1 << 20) as f64)
    }
}

/// A text result capped at the inline limit (a sub-agent's answer).
pub fn spill_cap(s: &str) -> String {
    capped(s.as_bytes(), INLINE_CAP)
}

fn capped(bytes: &[u8], cap: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    if s.len() <= cap {
        return s.into_owned();
    }
    let mut cut = cap;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}\n... [truncated {} bytes]", &s[..cut], s.len() - cut)
}

/// Exact match first, then line-by-line modulo surrounding whitespace.
fn find_span(text: &str, old: &str) -> Option<(String, &'static str)> {
    if text.contains(old) {
        return Some((old.to_string(), "exact"));
    }
    let want: Vec<&str> = old.trim_end_matches('\n').lines().map(str::trim).collect();
    if want.is_empty() {
        return None;
    }
    let lines: Vec<&str> = text.lines().collect();
    for i in 0..lines.len().saturating_sub(want.len() - 1) {
        if lines[i..i + want.len()].iter().map(|l| l.trim()).eq(want.iter().copied()) {
            return Some((lines[i..i + want.len()].join("\n"), "line-trimmed"));
        }
    }
    block_anchor(&lines, &want).map(|s| (s, "block-anchor"))
}

/// For 3+ lines: the first and last lines (trimmed) anchor a block of about
/// the same length; the middle lines must be similar enough (≥ 0.65 mean).
fn block_anchor(lines: &[&str], want: &[&str]) -> Option<String> {
    let n = want.len();
    if n < 3 {
        return None;
    }
    let slack = (n / 4).max(1);
    let similarity = |a: &str, b: &str| -> f64 {
        let max = a.chars().count().max(b.chars().count());
        if max == 0 {
            return 1.0;
        }
        if a.len().saturating_mul(b.len()) > 1 << 20 {
            return 0.0;
        }
        1.0 - steppe_language::suggest::levenshtein(a, b) as f64 / max as f64
    };
    let mut best: Option<(f64, usize, usize)> = None;
    for i in 0..lines.len() {
        if lines[i].trim() != want[0] {
            continue;
        }
        let Some(j) = (i + 2..lines.len()).find(|&j| lines[j].trim() == want[n - 1]) else { continue };
        let len = j - i + 1;
        if len + slack < n || len > n + slack {
            continue;
        }
        let middle_file = &lines[i + 1..j];
        let middle_want = &want[1..n - 1];
        let pairs = middle_file.len().min(middle_want.len()).max(1);
        let score: f64 = middle_file.iter().zip(middle_want).map(|(a, b)| similarity(a.trim(), b)).sum::<f64>() / pairs as f64;
        if score >= 0.65 && best.is_none_or(|(s, _, _)| score > s) {
            best = Some((score, i, j));
        }
    }
    best.map(|(_, i, j)| lines[i..=j].join("\n"))
}

/// How deep `search_files` looks below its base.
const SEARCH_DEPTH: usize = 64;

/// Hands `visit` the regular files below `dir` (at `rel` below the search's
/// base, `depth` down), in name order, none reached through a symlink;
/// `left`: how many more files and directories it may look at.
fn walk(dir: &std::os::fd::OwnedFd, rel: &Path, depth: usize, left: &mut usize, visit: &mut impl FnMut(&std::os::fd::OwnedFd, &std::ffi::OsStr, &Path)) {
    let Ok(mut entries) = crate::sandbox::list(dir, false) else { return };
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        if *left == 0 {
            return;
        }
        if matches!(e.name.to_str(), Some(".git" | "node_modules" | "vendor" | ".steps-agent-out")) {
            continue;
        }
        if e.is_dir && depth < SEARCH_DEPTH {
            *left -= 1;
            if let Ok(sub) = crate::sandbox::subdir(dir, &e.name) {
                walk(&sub, &rel.join(&e.name), depth + 1, left, visit);
            }
        } else if e.is_file {
            *left -= 1;
            visit(dir, &e.name, &rel.join(&e.name));
        }
    }
}

fn glob_to_regex(g: &str) -> Result<regex::Regex, regex::Error> {
    let (prefix, rest) = match g.strip_prefix("**/") {
        Some(r) => ("(?:.*/)?", r),
        None => ("", g),
    };
    let mut re = String::from("^");
    re.push_str(prefix);
    for ch in rest.chars() {
        match ch {
            '*' => re.push_str("[^/]*"),
            '?' => re.push_str("[^/]"),
            c => re.push_str(&regex::escape(&c.to_string())),
        }
    }
    re.push('$');
    regex::Regex::new(&re)
}

mod custom;
pub mod mcp;
pub mod mcp_oauth;
pub mod stepgate;
mod web_fetch;

pub use custom::{custom, custom_params};
use web_fetch::web_fetch;

#[cfg(test)]
mod tests {
    use super::*;
    use super::web_fetch::host_allowed;

    fn space(name: &str) -> (Space, PathBuf) {
        let d = std::env::temp_dir().join(format!("steppe-tools-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("src")).unwrap();
        std::fs::write(d.join("src/main.rs"), "fn main() {\n    println!(\"hi\");\n}\n").unwrap();
        let policy = SandboxPolicy::new(&d, &[]).unwrap();
        (Space { policy, cwd: d.canonicalize().unwrap(), env: vec![], toolbox: None }, d)
    }

    fn b(name: &str) -> ToolDef {
        ToolDef::Builtin { name: name.into(), allow: vec![], timeout_ms: None }
    }

    #[tokio::test]
    async fn file_tools_work_inside_and_refuse_outside() {
        let (s, _) = space("files");
        let mut den = Vec::new();
        let r = s.builtin(&b("read_file"), &json!({"path": "src/main.rs"}), &mut den).await;
        assert!(r["content"].as_str().unwrap().contains("println"));
        let r = s.builtin(&b("write_file"), &json!({"path": "out/deep/x.md", "content": "hello"}), &mut den).await;
        assert_eq!(r["bytes_written"], 5);
        let r = s.builtin(&b("edit_file"), &json!({"path": "src/main.rs", "old_string": "println!(\"hi\");", "new_string": "println!(\"bye\");"}), &mut den).await;
        assert_eq!(r["match_mode"], "exact", "{r}");
        let r = s.builtin(&b("edit_file"), &json!({"path": "src/main.rs", "old_string": "fn main() {\n  println!(\"bye\");", "new_string": "fn main() {\n    println!(\"ok\");"}), &mut den).await;
        assert_eq!(r["match_mode"], "line-trimmed", "{r}");
        let r = s.builtin(&b("edit_file"), &json!({"path": "src/main.rs", "old_string": "fn main() {\n    printn!(\"ok\");\n}", "new_string": "fn main() {\n    println!(\"ok\");\n}"}), &mut den).await;
        assert_eq!(r["match_mode"], "block-anchor", "{r}");
        let r = s.builtin(&b("search_files"), &json!({"pattern": "ok", "output_mode": "content"}), &mut den).await;
        assert_eq!(r["matches"][0]["path"], "src/main.rs", "{r}");
        let r = s.builtin(&b("list_dir"), &json!({}), &mut den).await;
        assert_eq!(r["total"], 2, "{r}");
        assert!(den.is_empty());
        let r = s.builtin(&b("read_file"), &json!({"path": "../../etc/passwd"}), &mut den).await;
        assert!(r["error"].as_str().unwrap().contains("outside the sandbox"), "{r}");
        let r = s.builtin(&b("write_file"), &json!({"path": "/tmp/escape.txt", "content": "x"}), &mut den).await;
        assert!(r.get("error").is_some());
        assert_eq!(den.len(), 2);
        assert_eq!(den[0].tool, "read_file");
    }

    /// A FIFO a shell left in the step's directory (`mkfifo`) is no file:
    /// every file tool says so at once instead of blocking the worker, and
    /// a search passes over it.
    #[tokio::test]
    async fn file_tools_refuse_what_is_not_a_file() {
        let (s, d) = space("fifo");
        let c = std::ffi::CString::new(d.join("src/pipe.rs").to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let mut den = Vec::new();
        for (tool, args) in [
            ("read_file", json!({"path": "src/pipe.rs"})),
            ("write_file", json!({"path": "src/pipe.rs", "content": "x"})),
            ("write_file", json!({"path": "src/pipe.rs", "content": "x", "append": true})),
            ("edit_file", json!({"path": "src/pipe.rs", "old_string": "a", "new_string": "b"})),
        ] {
            let r = tokio::time::timeout(Duration::from_secs(5), s.builtin(&b(tool), &args, &mut den)).await.expect("answered at once");
            let e = r["error"].as_str().unwrap_or_default();
            assert!(e.contains("src/pipe.rs: a FIFO, not a file a tool may open"), "{tool}: {r}");
        }
        let r = s.builtin(&b("search_files"), &json!({"pattern": "main"}), &mut den).await;
        assert_eq!(r["files"], json!(["src/main.rs"]), "{r}");
    }

    /// search_files looks below its base through no symlink and no deeper
    /// than SEARCH_DEPTH; list_dir says what a symlink is, not where it leads.
    #[tokio::test]
    async fn search_and_list_pass_over_symlinks_and_stop_at_their_depth() {
        let (s, d) = space("links");
        let outside = d.with_extension("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("leak.rs"), "fn main() {}").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("src/linked")).unwrap();
        let too_deep = (0..70).fold(d.join("deep"), |p, _| p.join("d"));
        std::fs::create_dir_all(&too_deep).unwrap();
        std::fs::write(too_deep.join("main.rs"), "fn main() {}").unwrap();
        std::fs::write(d.join("deep/d/main.rs"), "fn main() {}").unwrap();
        let mut den = Vec::new();
        let r = s.builtin(&b("search_files"), &json!({"pattern": "main"}), &mut den).await;
        assert_eq!(r["files"], json!(["deep/d/main.rs", "src/main.rs"]), "{r}");
        let r = s.builtin(&b("list_dir"), &json!({"path": "src"}), &mut den).await;
        assert_eq!(r["entries"], json!([{"name": "linked", "is_dir": false, "size": outside.as_os_str().len()}, {"name": "main.rs", "is_dir": false, "size": 34}]), "{r}");
        let r = s.builtin(&b("list_dir"), &json!({"path": "src/main.rs"}), &mut den).await;
        assert!(r["error"].as_str().unwrap_or_default().contains("\"main.rs\" is a file, not a directory"), "{r}");
    }

    #[tokio::test]
    async fn web_fetch_fence_refuses_before_connecting() {
        let mut denials = Vec::new();
        let r = web_fetch(&json!({"url": "https://issues.example/open"}), &["specification.website".into()], &mut denials).await;
        assert_eq!(r["error"], "web_fetch: host \"issues.example\", which is not in this tool's allow: list (specification.website)");
        assert_eq!(denials.len(), 1, "a refusal is a sandbox denial");
        assert_eq!(denials[0].path, "https://issues.example/open");
        // A redirect off the list is refused too, naming the host, and recorded.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            if let Ok((mut sock, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = sock.read(&mut buf).await;
                let _ = sock.write_all(b"HTTP/1.1 302 Found\r\nLocation: http://exfiltrate.example/x\r\nContent-Length: 0\r\n\r\n").await;
            }
        });
        let mut denials = Vec::new();
        let r = web_fetch(&json!({"url": format!("http://127.0.0.1:{port}/start")}), &["127.0.0.1".into()], &mut denials).await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("127.0.0.1 redirected to host \"exfiltrate.example\""), "{r}");
        assert_eq!(denials.len(), 1, "{denials:?}");
        assert!(host_allowed("docs.Example.com", &["example.com".into()]));
        assert!(!host_allowed("badexample.com", &["example.com".into()]));
    }

    #[tokio::test]
    async fn custom_tools_render_pin_and_report_missing_args() {
        let (s, _) = space("custom");
        let def = ToolDef::Custom {
            name: "post".into(),
            description: String::new(),
            run: "echo {{ .args.repo }} {{ .args.body | shellquote }}".into(),
            required: true,
            max_calls: 1,
            pinned: serde_json::from_value(json!({"repo": "acme/ci"})).unwrap(),
            max_output_bytes: None,
            timeout_ms: None,
            literal: false,
        };
        assert_eq!(custom_params("{{ .args.repo }} {{ .args.body | shellquote }} {{ .args.repo }}"), vec!["repo", "body"]);
        let r = custom(&s, &def, &json!({"body": "looks good"})).await;
        assert_eq!(r["stdout"], "acme/ci looks good\n");
        assert_eq!(r["exit_code"], 0);
        let r = custom(&s, &def, &json!({})).await;
        assert!(r["error"].as_str().unwrap().contains("missing required argument(s): \"body\""), "{r}");
    }

    #[tokio::test]
    async fn big_output_spills_to_a_file_the_model_can_read() {
        let (s, d) = space("spill");
        let r = s.shell("head -c 50000 /dev/zero | tr '\\0' a", None, INLINE_CAP).await;
        let out = r["stdout"].as_str().unwrap();
        assert!(out.starts_with("<persistent_file>") && out.contains("48.8 KB"), "{}", &out[..200]);
        let path = out.split("saved in full at ").nth(1).unwrap().split(". Read").next().unwrap();
        assert!(path.starts_with(d.canonicalize().unwrap().to_str().unwrap()));
        assert_eq!(std::fs::read(path).unwrap().len(), 50_000);
        assert!(out.len() < 3_000);
        // The spill directory pointed elsewhere: nothing is written there,
        // and the model reads the output capped, told why it is not whole.
        let away = d.with_extension("away");
        std::fs::create_dir_all(&away).unwrap();
        std::fs::remove_dir_all(d.join(".steps-agent-out")).unwrap();
        std::os::unix::fs::symlink(&away, d.join(".steps-agent-out")).unwrap();
        let r = s.shell("head -c 50000 /dev/zero | tr '\\0' a", None, INLINE_CAP).await;
        let out = r["stdout"].as_str().unwrap();
        assert!(out.contains("[truncated 18000 bytes]") && out.contains("could not be saved under .steps-agent-out: \".steps-agent-out\" is a symlink now"), "{}", &out[out.len() - 300..]);
        assert_eq!(std::fs::read_dir(&away).unwrap().count(), 0, "written through the link");
    }
}
