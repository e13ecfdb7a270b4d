//! Loading a pipeline file: the sequence every command shares.
//!
//! read → substitute `((vars))` → parse YAML → inline `file:` includes →
//! strict decode → read `*_file` fields → register built-ins → validate.
//! Each phase reports every problem it finds; a phase with problems ends the
//! load, because later phases would only report their echoes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::confine;
use crate::de::decode;
use crate::model::Pipeline;
use crate::source::{Diagnostic, Diagnostics, SourceFiles};
use crate::validate;

mod builtin_entries;
mod files;
mod includes;
pub(crate) mod options;
mod reader;
pub(crate) mod report;

pub use options::LoadOptions;
pub use report::{Report, SourceMap};

use builtin_entries::register_builtins;
use files::resolve_files;
use includes::inline_includes;
use reader::FileReader;
use crate::yaml::{self, NodeKind};

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
    let text = opts.substitute(text).map_err(|m| whole_file_error(path, m))?;
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
