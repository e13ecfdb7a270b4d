//! Loading a pipeline file: the sequence every command shares.
//!
//! read → substitute `((vars))` → parse YAML → inline `file:` includes →
//! strict decode → read `*_file` fields → register built-ins → validate.
//! Each phase reports every problem it finds; a phase with problems ends the
//! load, because later phases would only report their echoes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::builtins;
use crate::confine;
use crate::de::decode;
use crate::model::{FileRef, Fix, Message, Pipeline, Step, StepKind};
use crate::source::{Diagnostic, Diagnostics, Mark, SourceFiles};
use crate::validate;
use crate::vars::Vars;
use crate::yaml::{self, Node, NodeKind};

/// What a load needs besides the file.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub vars: Vars,
    /// `$STEPPE_MODEL` (or `$STEPS_MODEL`): the model of agents that name none (before `defaults.model`).
    pub env_model: Option<String>,
    /// The pipeline goes to a coordinator (`steppe submit`) or came from a
    /// submitter: paths of the host that loads it (an MCP server's
    /// absolute `cwd`) are refused, as the coordinator refuses them.
    pub submission: bool,
    /// Every file the pipeline names must lie inside this directory, by
    /// text and through symlinks (a coordinator's unpacked submission).
    pub root: Option<PathBuf>,
}

impl LoadOptions {
    pub fn from_env(vars: Vars) -> Self {
        LoadOptions {
            vars,
            // STEPS_MODEL is the reference runner's spelling; accepted so its setups carry over.
            env_model: ["STEPPE_MODEL", "STEPS_MODEL"]
                .iter()
                .find_map(|v| std::env::var(v).ok().filter(|m| !m.is_empty())),
            submission: false,
            root: None,
        }
    }
}

/// A loaded, valid pipeline.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub pipeline: Pipeline,
    pub path: PathBuf,
    /// The directory `*_file` paths are relative to.
    pub dir: PathBuf,
    pub files: SourceFiles,
    pub source_map: SourceMap,
    /// Every file the load read besides the pipeline (includes and `*_file`
    /// fields), relative to `dir`: what a remote coordinator needs with it.
    pub read_files: Vec<String>,
    /// What loaded but will not be acted on (keys not honoured yet), positioned.
    pub warnings: Vec<Diagnostic>,
}

/// Key path → position, for every key and list item of the loaded document.
#[derive(Debug, Clone, Default)]
pub struct SourceMap {
    marks: HashMap<String, Mark>,
}

impl SourceMap {
    fn build(root: &Node) -> Self {
        let mut marks = HashMap::new();
        marks.insert(String::new(), root.mark);
        fn walk(n: &Node, path: &str, marks: &mut HashMap<String, Mark>) {
            match &n.kind {
                NodeKind::Map(entries) => {
                    for (k, v) in entries {
                        let key = k.as_str().unwrap_or_default();
                        let p = if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
                        marks.insert(p.clone(), k.mark);
                        walk(v, &p, marks);
                    }
                }
                NodeKind::Seq(items) => {
                    for (i, v) in items.iter().enumerate() {
                        let p = format!("{path}[{i}]");
                        marks.insert(p.clone(), v.mark);
                        walk(v, &p, marks);
                    }
                }
                NodeKind::Scalar(_) => {}
            }
        }
        walk(root, "", &mut marks);
        SourceMap { marks }
    }

    /// The position of `path`, or of its nearest ancestor that has one.
    pub fn lookup(&self, path: &str) -> Mark {
        let mut p = path;
        loop {
            if let Some(m) = self.marks.get(p) {
                return *m;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return self.marks.get("").copied().unwrap_or_default(),
            }
        }
    }
}

/// Collects positioned diagnostics for one load: problems, and warnings
/// (which do not stop it).
pub struct Report<'a> {
    pub files: &'a SourceFiles,
    pub map: &'a SourceMap,
    pub diags: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

impl<'a> Report<'a> {
    pub fn new(files: &'a SourceFiles, map: &'a SourceMap) -> Self {
        Report { files, map, diags: Vec::new(), warnings: Vec::new() }
    }

    /// A warning at `path`: the message says what is not done.
    pub fn warn(&mut self, path: &str, message: impl Into<String>) {
        let mark = self.map.lookup(path);
        self.warnings.push(Diagnostic {
            file: self.files.path(mark.file).to_path_buf(),
            line: mark.line,
            col: mark.col,
            path: path.to_string(),
            message: format!("warning: {}", message.into()),
        });
    }

    pub fn at_mark(&mut self, mark: Mark, path: &str, message: impl Into<String>) {
        self.diags.push(Diagnostic {
            file: self.files.path(mark.file).to_path_buf(),
            line: mark.line,
            col: mark.col,
            path: path.to_string(),
            message: message.into(),
        });
    }

    pub fn err(&mut self, path: &str, message: impl Into<String>) {
        let mark = self.map.lookup(path);
        self.at_mark(mark, path, message);
    }
}

fn whole_file_error(path: &Path, message: String) -> Diagnostics {
    Diagnostics(vec![Diagnostic {
        file: path.to_path_buf(),
        line: 0,
        col: 0,
        path: String::new(),
        message,
    }])
}

/// Loads and validates the pipeline at `path`.
pub fn load_file(path: &Path, opts: &LoadOptions) -> Result<Loaded, Diagnostics> {
    let bytes = confine::read_capped(path, confine::FILE_CAP)
        .map_err(|e| whole_file_error(path, format!("cannot read the pipeline: it {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|_| whole_file_error(path, "cannot read the pipeline: it is not UTF-8 text".into()))?;
    load_str(&text, path, opts)
}

/// What a caught panic said (its message, when it carried one).
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// The stack a load runs on. Decoding and validation recurse over the tree
/// (bounded by [`yaml::MAX_DEPTH`]); a caller's thread (a tokio worker has
/// 2 MiB) need not have room for that.
const LOAD_STACK: usize = 64 << 20;

/// Loads and validates pipeline `text` as if read from `path`, on a thread
/// of its own: a panic in the loader is reported as a diagnostic of this
/// load, and its recursion never meets the caller's stack limit.
pub fn load_str(text: &str, path: &Path, opts: &LoadOptions) -> Result<Loaded, Diagnostics> {
    let outcome = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("steppe-load".into())
            .stack_size(LOAD_STACK)
            .spawn_scoped(s, || load_here(text, path, opts))
            .map(|h| h.join())
    });
    match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => {
            let what = panic_text(panic.as_ref());
            Err(whole_file_error(path, format!("cannot read the pipeline: the loader failed on it ({what}); please report this file")))
        }
        Err(e) => Err(whole_file_error(path, format!("cannot read the pipeline: starting the loader: {e}"))),
    }
}

fn load_here(text: &str, path: &Path, opts: &LoadOptions) -> Result<Loaded, Diagnostics> {
    let dir = path
        .parent()
        .map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p })
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut files = SourceFiles::default();
    let file_id = files.add(path);
    let text = substitute_bounded(text, &opts.vars).map_err(|m| whole_file_error(path, m))?;
    let mut reader = FileReader { dir: dir.clone(), root: opts.root.clone(), inlined: 0, reads: Vec::new(), cache: HashMap::new() };
    // One allowance of nodes and text for the pipeline and every file it includes.
    let mut spent = yaml::Size::default();
    let (root, yaml_problems) = yaml::parse_within(&text, file_id, &mut spent).map_err(|e| {
        Diagnostics(vec![Diagnostic {
            file: path.to_path_buf(),
            line: e.mark.line,
            col: e.mark.col,
            path: String::new(),
            message: format!("invalid YAML: {}", e.message),
        }])
    })?;
    let Some(mut root) = root else {
        return Err(whole_file_error(path, "the pipeline file is empty".into()));
    };
    if !matches!(root.kind, NodeKind::Map(_)) {
        let map = SourceMap::build(&root);
        let mut r = Report::new(&files, &map);
        r.err("", format!("a pipeline is a mapping of jobs:, resources:, … — this file holds {}", root.describe()));
        return Err(Diagnostics(r.diags));
    }

    // Includes first, so positions and decoding cover the included documents.
    let mut include_problems = Vec::new();
    inline_includes(&mut root, &mut reader, &mut files, opts, &mut spent, &mut include_problems);
    let map = SourceMap::build(&root);
    let mut report = Report::new(&files, &map);
    for p in yaml_problems {
        report.at_mark(p.mark, "", p.message);
    }
    for (mark, path, msg) in include_problems {
        report.at_mark(mark, &path, msg);
    }

    let (pipeline, problems) = decode::<Pipeline>(&root, "");
    for p in problems {
        report.at_mark(p.mark, &p.path, p.message);
    }
    if !report.diags.is_empty() {
        return Err(Diagnostics(report.diags));
    }
    let Some(mut pipeline) = pipeline else {
        report.err("", "the pipeline could not be decoded");
        return Err(Diagnostics(report.diags));
    };

    resolve_files(&mut pipeline, &mut reader, &mut report);
    if !report.diags.is_empty() {
        return Err(Diagnostics(report.diags));
    }
    register_builtins(&mut pipeline, &mut report);
    if !report.diags.is_empty() {
        return Err(Diagnostics(report.diags));
    }

    validate::validate(&pipeline, opts, &mut report);
    if !report.diags.is_empty() {
        return Err(Diagnostics(report.diags));
    }
    let warnings = std::mem::take(&mut report.warnings);
    Ok(Loaded {
        pipeline,
        path: path.to_path_buf(),
        dir,
        files,
        source_map: map,
        read_files: reader.reads,
        warnings,
    })
}

/// The most text `((vars))` substitution may make of a pipeline.
const SUBSTITUTED_CAP: usize = 16 << 20;

fn substitute_bounded(text: &str, vars: &Vars) -> Result<String, String> {
    crate::vars::substitute_within(text, vars, SUBSTITUTED_CAP)
}

/// The most text the loader inlines from files (each use counts: a file
/// named by a thousand steps is inlined a thousand times).
const INLINED_CAP: u64 = 64 << 20;

/// Reads the files a pipeline names (includes and `*_file` fields): relative
/// to its directory, confined to `root` when there is one, regular files of
/// bounded size only, and within [`INLINED_CAP`] in all.
struct FileReader {
    dir: PathBuf,
    root: Option<PathBuf>,
    inlined: u64,
    /// Files read besides the pipeline, relative to `dir`, first read first.
    reads: Vec<String>,
    cache: HashMap<String, String>,
}

impl FileReader {
    /// The text of `rel`; `key` names the field in messages.
    fn read(&mut self, rel: &str, key: &str) -> Result<String, String> {
        let text = match self.cache.get(rel) {
            Some(t) => t.clone(),
            None => {
                let t = confine::read_text(&self.dir, rel, self.root.as_deref(), "the submission", confine::FILE_CAP).map_err(|e| match e {
                    confine::PathError::Missing => format!("{key}: no such file relative to the pipeline directory: {rel}"),
                    confine::PathError::Escapes { .. } => format!(
                        "{key}: \"{rel}\" leads outside the submission: a submitted pipeline may only name files sent with it (steppe submit sends every file the pipeline reads)"
                    ),
                    confine::PathError::Absolute { .. } => format!(
                        "{key}: \"{rel}\" must be relative to the pipeline directory: absolute paths are refused, so a pipeline loads the same on every machine and coordinator"
                    ),
                    e => format!("{key}: \"{rel}\" {e}"),
                })?;
                if !self.reads.iter().any(|r| r == rel) {
                    self.reads.push(rel.to_string());
                }
                self.cache.insert(rel.to_string(), t.clone());
                t
            }
        };
        self.inlined = self.inlined.saturating_add(text.len() as u64);
        if self.inlined > INLINED_CAP {
            return Err(format!(
                "{key}: {rel}: the text read from files comes to over {} MiB in all (each use counts); inline less, or read large inputs in a step",
                INLINED_CAP >> 20
            ));
        }
        if text.trim().is_empty() {
            return Err(format!("{key}: {rel} is empty"));
        }
        Ok(text)
    }
}

/// Inlines whole-document `file:` includes of `tasks:` and `agents:` entries,
/// one level deep: the entry's own keys win, except `privileged`, which is on
/// if either says so.
fn inline_includes(
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
            let text = match substitute_bounded(&text, &opts.vars) {
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

/// Resolves an inline field and its `_file` twin into the inline field.
fn twin(
    inline: &mut Option<String>,
    file: &Option<String>,
    names: (&str, &str),
    rd: &mut FileReader,
    path: &str,
    r: &mut Report,
) {
    let Some(rel) = file else { return };
    if inline.is_some() {
        r.err(&format!("{path}.{}", names.1), format!("{}: and {}: are mutually exclusive", names.0, names.1));
        return;
    }
    match rd.read(rel, names.1) {
        Ok(t) => *inline = Some(t),
        Err(e) => r.err(&format!("{path}.{}", names.1), e),
    }
}

fn resolve_message_list(
    prompt: &Option<String>,
    prompt_file: &Option<FileRef>,
    messages: &Option<Vec<String>>,
    message_files: &Option<Vec<FileRef>>,
    rd: &mut FileReader,
    path: &str,
    r: &mut Report,
) -> Vec<Message> {
    if prompt.is_some() && prompt_file.is_some() {
        r.err(&format!("{path}.prompt_file"), "prompt: and prompt_file: are mutually exclusive");
    }
    if messages.is_some() && message_files.is_some() {
        r.err(&format!("{path}.message_files"), "messages: and message_files: are mutually exclusive");
    }
    let short = if prompt.is_some() { Some("prompt") } else if prompt_file.is_some() { Some("prompt_file") } else { None };
    let long = if messages.is_some() { Some("messages") } else if message_files.is_some() { Some("message_files") } else { None };
    if let (Some(s), Some(l)) = (short, long) {
        r.err(
            &format!("{path}.{s}"),
            format!("{s}: and {l}: are mutually exclusive — {l}: is the list of user turns; {s}: is a one-message shorthand for it"),
        );
    }
    let mut out = Vec::new();
    let mut read = |f: &FileRef, key: &str, out: &mut Vec<Message>| match f {
        FileRef::Path(rel) => {
            match rd.read(rel, key.rsplit('.').next().unwrap_or(key)) {
                Ok(t) => out.push(Message::Text(t)),
                Err(e) => r.err(key, e),
            }
        }
        FileRef::Artifact { artifact, path } => out.push(Message::Artifact {
            artifact: artifact.clone(),
            path: path.clone(),
        }),
    };
    if let Some(p) = prompt {
        out.push(Message::Text(p.clone()));
    }
    if let Some(f) = prompt_file {
        read(f, &format!("{path}.prompt_file"), &mut out);
    }
    if let Some(m) = messages {
        out.extend(m.iter().cloned().map(Message::Text));
    }
    if let Some(files) = message_files {
        for (i, f) in files.iter().enumerate() {
            read(f, &format!("{path}.message_files[{i}]"), &mut out);
        }
    }
    out
}

fn resolve_fix(fix: &mut Option<Fix>, rd: &mut FileReader, path: &str, r: &mut Report) {
    if let Some(Fix::Spec(spec)) = fix {
        let p = format!("{path}.fix");
        spec.resolved_messages = resolve_message_list(
            &spec.prompt,
            &spec.prompt_file,
            &spec.messages,
            &spec.message_files,
            rd,
            &p,
            r,
        );
    }
}

fn resolve_step(s: &mut Step, rd: &mut FileReader, path: &str, r: &mut Report) {
    let kind = s.kind();
    if s.run_file.is_some() && kind.is_some_and(|k| k != StepKind::Task) {
        r.err(&format!("{path}.run_file"), "run_file: is only valid on task steps");
    } else {
        twin(&mut s.run, &s.run_file, ("run", "run_file"), rd, path, r);
    }
    let has_messages = s.prompt.is_some() || s.prompt_file.is_some() || s.messages.is_some() || s.message_files.is_some();
    if kind.is_some_and(|k| k != StepKind::Agent) && has_messages {
        for (set, key) in [
            (s.prompt_file.is_some(), "prompt_file"),
            (s.message_files.is_some(), "message_files"),
        ] {
            if set {
                r.err(&format!("{path}.{key}"), format!("{key}: is only valid on agent steps"));
            }
        }
    } else if has_messages {
        s.resolved_messages = resolve_message_list(
            &s.prompt,
            &s.prompt_file,
            &s.messages,
            &s.message_files,
            rd,
            path,
            r,
        );
    }
    resolve_fix(&mut s.fix, rd, path, r);
    crate::model::walk::each_child_mut(s, path, &mut |c, p| resolve_step(c, rd, p, r));
}

fn resolve_files(p: &mut Pipeline, rd: &mut FileReader, r: &mut Report) {
    for (i, t) in p.tasks.iter_mut().enumerate() {
        let path = format!("tasks[{i}]");
        twin(&mut t.run, &t.run_file, ("run", "run_file"), rd, &path, r);
        resolve_fix(&mut t.fix, rd, &path, r);
    }
    for (i, a) in p.agents.iter_mut().enumerate() {
        let path = format!("agents[{i}]");
        if let Some(sf) = &a.system_file {
            if let Some(profile) = sf.strip_prefix("@builtin/") {
                if a.system.is_some() {
                    r.err(&format!("{path}.system_file"), "system: and system_file: are mutually exclusive");
                } else {
                    match builtins::profile_persona(profile) {
                        Some(text) => a.system = Some(text.to_string()),
                        None => r.err(
                            &format!("{path}.system_file"),
                            format!(
                                "\"{sf}\" names no built-in profile; the profiles are {}{}",
                                builtins::PROFILE_NAMES.join(", "),
                                crate::suggest::did_you_mean(profile, builtins::PROFILE_NAMES.iter().copied())
                            ),
                        ),
                    }
                }
                continue;
            }
        }
        twin(&mut a.system, &a.system_file, ("system", "system_file"), rd, &path, r);
    }
    for (i, t) in p.resource_types.iter_mut().enumerate() {
        let path = format!("resource_types[{i}].config");
        if let Some(c) = &mut t.config {
            twin(&mut c.check, &c.check_file, ("check", "check_file"), rd, &path, r);
            twin(&mut c.in_, &c.in_file, ("in", "in_file"), rd, &path, r);
            twin(&mut c.out, &c.out_file, ("out", "out_file"), rd, &path, r);
            if let Some(e) = &mut c.expr {
                let path = format!("{path}.expr");
                twin(&mut e.check, &e.check_file, ("check", "check_file"), rd, &path, r);
                twin(&mut e.in_, &e.in_file, ("in", "in_file"), rd, &path, r);
                twin(&mut e.out, &e.out_file, ("out", "out_file"), rd, &path, r);
            }
        }
    }
    for (j, job) in p.jobs.iter_mut().enumerate() {
        for (i, s) in job.plan.iter_mut().enumerate() {
            resolve_step(s, rd, &format!("jobs[{j}].plan[{i}]"), r);
        }
        for (key, h) in [
            ("on_success", &mut job.on_success),
            ("on_failure", &mut job.on_failure),
            ("on_error", &mut job.on_error),
            ("on_abort", &mut job.on_abort),
            ("ensure", &mut job.ensure),
        ] {
            if let Some(h) = h {
                resolve_step(h, rd, &format!("jobs[{j}].{key}"), r);
            }
        }
    }
}

/// Merges `@builtin/` entries over their profiles and adds the profiles and
/// built-in resource types the file does not shadow.
fn register_builtins(p: &mut Pipeline, r: &mut Report) {
    for (i, a) in p.agents.iter_mut().enumerate() {
        if let Some(name) = a.name.strip_prefix("@builtin/") {
            match builtins::profile(name) {
                Some(profile) => *a = builtins::merge_agent(profile, std::mem::take(a)),
                None => r.err(
                    &format!("agents[{i}].name"),
                    format!(
                        "\"{}\" names no built-in profile; the profiles are {}{}",
                        a.name,
                        builtins::PROFILE_NAMES.iter().map(|n| format!("@builtin/{n}")).collect::<Vec<_>>().join(", "),
                        crate::suggest::did_you_mean(name, builtins::PROFILE_NAMES.iter().copied())
                    ),
                ),
            }
        }
    }
    for name in builtins::PROFILE_NAMES {
        let full = format!("@builtin/{name}");
        if !p.agents.iter().any(|a| a.name == full) {
            if let Some(profile) = builtins::profile(name) {
                p.agents.push(profile);
            }
        }
    }
    for name in builtins::BUILTIN_RESOURCE_TYPES {
        if !p.resource_types.iter().any(|t| t.name == *name) {
            if let Some(t) = builtins::resource_type(name) {
                p.resource_types.push(t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Message, ToolGrant};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steppe-load-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("inc")).unwrap();
        d
    }

    fn load(d: &Path, text: &str) -> Result<Loaded, Diagnostics> {
        let p = d.join("pipeline.yml");
        std::fs::write(&p, text).unwrap();
        load_file(&p, &LoadOptions::default())
    }

    fn messages(e: &Diagnostics) -> String {
        e.to_string()
    }

    #[test]
    fn includes_merge_with_inline_fields_winning() {
        let d = dir("include");
        std::fs::write(
            d.join("inc/task.yml"),
            "name: ignored\nrun: echo from file\ntimeout: 10m\nprivileged: true\nimage: alpine\noutputs: [out]\n",
        )
        .unwrap();
        let l = load(
            &d,
            "tasks:\n- name: unit\n  file: inc/task.yml\n  timeout: 5m\n  privileged: false\njobs:\n- name: j\n  plan:\n  - task: unit\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let t = &l.pipeline.tasks[0];
        assert_eq!(t.name, "unit");
        assert_eq!(t.run.as_deref(), Some("echo from file"));
        assert_eq!(t.timeout.map(|t| t.to_string()).as_deref(), Some("5m0s"));
        assert_eq!(t.privileged, Some(true), "privileged is on if either says so");
        assert_eq!(t.outputs.as_deref(), Some(&["out".to_string()][..]));
    }

    #[test]
    fn includes_are_one_level_deep_and_positioned_in_their_own_file() {
        let d = dir("nested");
        std::fs::write(d.join("inc/a.yml"), "file: inc/b.yml\nrun: echo\n").unwrap();
        std::fs::write(d.join("inc/bad.yml"), "run: echo\nrnu: typo\n").unwrap();
        let e = load(&d, "tasks:\n- name: a\n  file: inc/a.yml\n- name: b\n  file: inc/bad.yml\n- name: c\n  file: inc/missing.yml\njobs:\n- name: j\n  plan:\n  - task: a\n").unwrap_err();
        let m = messages(&e);
        assert!(m.contains("sets file:, but includes are resolved one level deep only"), "{m}");
        assert!(m.contains("inc/bad.yml:2:1: tasks[1].rnu: unknown key \"rnu\" (did you mean \"run\"?)"), "{m}");
        assert!(m.contains("no such file relative to the pipeline directory: inc/missing.yml"), "{m}");
    }

    #[test]
    fn file_fields_are_read_relative_to_the_pipeline() {
        let d = dir("files");
        std::fs::write(d.join("inc/run.sh"), "echo from run_file\n").unwrap();
        std::fs::write(d.join("inc/m1.md"), "first\n").unwrap();
        std::fs::write(d.join("inc/persona.md"), "You are terse.\n").unwrap();
        let l = load(
            &d,
            "agents:\n- name: a\n  source: {model: ollama/llama3}\n  system_file: inc/persona.md\njobs:\n- name: j\n  plan:\n  - task: t\n    run_file: inc/run.sh\n    outputs: [repo]\n  - agent: a\n    inputs: [repo]\n    message_files: [inc/m1.md, {artifact: repo, path: NOTES.md}]\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let job = &l.pipeline.jobs[0];
        assert_eq!(job.plan[0].run.as_deref(), Some("echo from run_file\n"));
        assert_eq!(
            job.plan[1].resolved_messages,
            vec![
                Message::Text("first\n".into()),
                Message::Artifact { artifact: "repo".into(), path: "NOTES.md".into() }
            ]
        );
        assert_eq!(l.pipeline.agents[0].system.as_deref(), Some("You are terse.\n"));
        assert_eq!(l.read_files, vec!["inc/persona.md", "inc/run.sh", "inc/m1.md"]);
    }

    #[test]
    fn file_field_errors() {
        let d = dir("fileerr");
        std::fs::write(d.join("inc/empty.sh"), "  \n").unwrap();
        let e = load(
            &d,
            "jobs:\n- name: j\n  plan:\n  - task: t\n    run: echo\n    run_file: inc/empty.sh\n  - task: u\n    run_file: inc/empty.sh\n  - agent: a\n    run_file: inc/empty.sh\n",
        )
        .unwrap_err();
        let m = messages(&e);
        assert!(m.contains("run: and run_file: are mutually exclusive"), "{m}");
        assert!(m.contains("run_file: inc/empty.sh is empty"), "{m}");
        assert!(m.contains("run_file: is only valid on task steps"), "{m}");
    }

    #[test]
    fn builtin_profiles_merge_under_user_entries() {
        let d = dir("profiles");
        let l = load(
            &d,
            "agents:\n- name: \"@builtin/reviewer\"\n  source: {model: ollama/llama3}\n  tools: [read_file]\ndefaults:\n  model: ollama/llama3\njobs:\n- name: j\n  plan:\n  - agent: \"@builtin/reviewer\"\n    messages: [review]\n  - agent: \"@builtin/explorer\"\n    messages: [find]\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let r = l.pipeline.agents.iter().find(|a| a.name == "@builtin/reviewer").unwrap();
        assert_eq!(r.max_turns, Some(30));
        assert_eq!(r.max_context_bytes, Some(400_000));
        assert_eq!(r.tools.as_deref(), Some(&[ToolGrant::Name("read_file".into())][..]));
        assert!(r.system.as_deref().unwrap_or_default().contains("reviewer"));
        assert!(l.pipeline.agents.iter().any(|a| a.name == "@builtin/explorer"));
        assert!(l.pipeline.resource_types.iter().any(|t| t.name == "git"));
    }

    #[test]
    fn decode_errors_name_the_nested_path() {
        let d = dir("nestedpath");
        let e = load(
            &d,
            "jobs:\n- name: j\n  plan:\n  - do:\n    - task: a\n      run: echo\n      attempts: many\n    - in_parallel:\n        steps:\n        - task: b\n          run: echo\n          timeout: soon\n",
        )
        .unwrap_err();
        let m = messages(&e);
        assert!(m.contains("pipeline.yml:7:17: jobs[0].plan[0].do[0].attempts: expected a whole number"), "{m}");
        assert!(m.contains("jobs[0].plan[0].do[1].in_parallel.steps[0].timeout: \"soon\" is not a duration"), "{m}");
    }
}
