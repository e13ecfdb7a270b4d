//! `*_file` fields (`run_file`, `system_file`, `prompt_file`, `message_files`, …) read into their inline twins.

use super::reader::FileReader;
use crate::builtins;
use super::report::Report;
use crate::model::{FileRef, Fix, Message, Pipeline, Step, StepKind};

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

pub(super) fn resolve_files(p: &mut Pipeline, rd: &mut FileReader, r: &mut Report) {
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
