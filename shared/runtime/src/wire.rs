//! Conversions between the engine's types and the `steppe.v1` messages.

use std::path::PathBuf;
use std::time::Duration;

use steppe_proto::v1;
use crate::artifacts::ArtifactRef;
use crate::assignment::{Assignment, AssignmentResult, Cwd, Judge, OutputLine, OutputRecord};
use crate::outcome::{Class, StepError};

fn named(v: &[(String, ArtifactRef)]) -> Vec<v1::NamedArtifact> {
    v.iter()
        .map(|(n, r)| v1::NamedArtifact { name: n.clone(), artifact: Some(v1::ArtifactRef { digest: r.digest.clone() }) })
        .collect()
}

fn unnamed(v: Vec<v1::NamedArtifact>) -> Vec<(String, ArtifactRef)> {
    v.into_iter()
        .filter_map(|n| n.artifact.map(|a| (n.name, ArtifactRef { digest: a.digest })))
        .collect()
}

pub fn assignment_to_wire(a: &Assignment) -> v1::Assignment {
    v1::Assignment {
        id: a.id.clone(),
        run_id: a.run_id.clone(),
        step: a.step.clone(),
        attempt: a.attempt,
        epoch: a.epoch,
        command: a.command.clone(),
        env: a.env.clone(),
        cwd: Some(match &a.cwd {
            Cwd::StepDir => v1::assignment::Cwd::StepDir(true),
            Cwd::CaptureSelf => v1::assignment::Cwd::CaptureSelf(true),
            Cwd::Host(p) => v1::assignment::Cwd::HostDir(p.to_string_lossy().into_owned()),
            Cwd::Snapshot { tree, dir } => v1::assignment::Cwd::Snapshot(v1::Snapshot { tree: Some(v1::ArtifactRef { digest: tree.digest.clone() }), dir: dir.clone() }),
        }),
        inputs: named(&a.inputs),
        outputs: a.outputs.clone(),
        timeout_ms: a.timeout.map(|t| t.as_millis() as u64),
        judge: Some(v1::Judge { stdout: a.judge.stdout.clone(), code: a.judge.code, files: a.judge.files.clone() }),
        image: a.image.clone(),
        stream: a.stream,
        agent_json: a.agent.as_ref().and_then(|w| serde_json::to_string(w).ok()).unwrap_or_default(),
        fix_json: a.fix.as_ref().and_then(|w| serde_json::to_string(w).ok()).unwrap_or_default(),
        template_json: a.template.as_ref().map(|d| d.to_string()).unwrap_or_default(),
    }
}

pub fn assignment_from_wire(a: v1::Assignment) -> Assignment {
    let judge = a.judge.unwrap_or_default();
    Assignment {
        id: a.id,
        run_id: a.run_id,
        step: a.step,
        attempt: a.attempt,
        epoch: a.epoch,
        // The pool chose the worker; the worker has no use for it.
        pool: String::new(),
        command: a.command,
        env: a.env,
        cwd: match a.cwd {
            Some(v1::assignment::Cwd::CaptureSelf(_)) => Cwd::CaptureSelf,
            Some(v1::assignment::Cwd::HostDir(p)) => Cwd::Host(PathBuf::from(p)),
            Some(v1::assignment::Cwd::Snapshot(s)) => Cwd::Snapshot { tree: ArtifactRef { digest: s.tree.map(|t| t.digest).unwrap_or_default() }, dir: s.dir },
            _ => Cwd::StepDir,
        },
        inputs: unnamed(a.inputs),
        outputs: a.outputs,
        timeout: a.timeout_ms.map(Duration::from_millis),
        judge: Judge { stdout: judge.stdout, code: judge.code, files: judge.files },
        image: a.image,
        stream: a.stream,
        agent: if a.agent_json.is_empty() { None } else { serde_json::from_str(&a.agent_json).ok().map(Box::new) },
        fix: if a.fix_json.is_empty() { None } else { serde_json::from_str(&a.fix_json).ok().map(Box::new) },
        template: if a.template_json.is_empty() { None } else { serde_json::from_str(&a.template_json).ok() },
    }
}

pub fn result_to_wire(r: &AssignmentResult) -> v1::AssignmentResult {
    let (class, message) = match &r.result {
        Ok(()) => (v1::OutcomeClass::Succeeded, String::new()),
        Err(e) => (
            match e.class {
                Class::Failed => v1::OutcomeClass::Failed,
                Class::Errored => v1::OutcomeClass::Errored,
                Class::Aborted => v1::OutcomeClass::Aborted,
            },
            e.message.clone(),
        ),
    };
    v1::AssignmentResult {
        assignment_id: r.assignment_id.clone(),
        epoch: r.epoch,
        exit_code: r.exit_code,
        stdout: r.stdout.clone(),
        stderr: r.stderr.clone(),
        outputs: named(&r.outputs),
        class: class as i32,
        message,
        agent_json: r.agent.as_ref().and_then(|o| serde_json::to_string(o).ok()).unwrap_or_default(),
        payload: None,
        output: Some(record_to_wire(&r.output)),
    }
}

fn lines_to_wire(v: &[OutputLine]) -> Vec<v1::RecordedLine> {
    v.iter().map(|l| v1::RecordedLine { stderr: l.stderr, line: l.line.clone() }).collect()
}

fn lines_from_wire(v: Vec<v1::RecordedLine>) -> Vec<OutputLine> {
    v.into_iter().map(|l| OutputLine { stderr: l.stderr, line: l.line }).collect()
}

fn record_to_wire(o: &OutputRecord) -> v1::OutputRecord {
    v1::OutputRecord {
        head: lines_to_wire(&o.head),
        tail: lines_to_wire(&o.tail),
        omitted_lines: o.omitted_lines,
        omitted_bytes: o.omitted_bytes,
        full: o.full.as_ref().map(|r| v1::ArtifactRef { digest: r.digest.clone() }),
    }
}

fn record_from_wire(o: v1::OutputRecord) -> OutputRecord {
    OutputRecord {
        head: lines_from_wire(o.head),
        tail: lines_from_wire(o.tail),
        omitted_lines: o.omitted_lines,
        omitted_bytes: o.omitted_bytes,
        full: o.full.map(|r| ArtifactRef { digest: r.digest }),
    }
}

/// Results above this size carry their text by reference (the gRPC limit is 4 MiB).
pub const INLINE_RESULT_MAX: usize = 1 << 20;

/// Lines above this size are cut before they travel.
pub const LINE_MAX: usize = 64 << 10;

/// Cuts a line to [`LINE_MAX`] bytes (on a character boundary), saying how much went.
pub fn cap_line(line: &str) -> std::borrow::Cow<'_, str> {
    if line.len() <= LINE_MAX {
        return line.into();
    }
    let mut end = LINE_MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes cut)", &line[..end], line.len() - end).into()
}

/// Moves a large result's text into an artifact (claim check): what
/// travels is the reference.
pub fn offload_payload(r: &mut v1::AssignmentResult, store: &dyn crate::artifacts::ArtifactStore, scratch: &std::path::Path) -> std::io::Result<()> {
    use prost::Message;
    if r.encoded_len() <= INLINE_RESULT_MAX {
        return Ok(());
    }
    let dir = scratch.join(format!("payload-{}-{}", r.assignment_id, r.epoch));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("stdout"), &r.stdout)?;
    std::fs::write(dir.join("stderr"), &r.stderr)?;
    std::fs::write(dir.join("agent.json"), &r.agent_json)?;
    let stored = store.put_dir(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    r.payload = Some(v1::ArtifactRef { digest: stored?.digest });
    r.stdout.clear();
    r.stderr.clear();
    r.agent_json.clear();
    Ok(())
}

/// The most one file of a result's payload may hold.
const PAYLOAD_FILE_MAX: u64 = 64 << 20;

/// Brings a result's text back from its payload artifact, if it has one.
pub fn restore_payload(r: &mut v1::AssignmentResult, store: &dyn crate::artifacts::ArtifactStore, scratch: &std::path::Path) -> std::io::Result<()> {
    let Some(p) = r.payload.take() else { return Ok(()) };
    let dir = scratch.join(format!("payload-in-{}-{}", r.assignment_id, r.epoch));
    let _ = std::fs::remove_dir_all(&dir);
    // The artifact came from a worker: a symlink in it must not lead to this host's files.
    let read = |name: &str| {
        steppe_language::confine::resolve(&dir, name, Some(&dir), "the result's payload")
            .and_then(|p| steppe_language::confine::read_capped(&p, PAYLOAD_FILE_MAX))
            .map_err(|e| std::io::Error::other(format!("{name} {e}")))
    };
    let got = store.materialize(&ArtifactRef { digest: p.digest }, &dir).and_then(|()| Ok((read("stdout")?, read("stderr")?, read("agent.json")?)));
    let _ = std::fs::remove_dir_all(&dir);
    let (out, err, agent) = got?;
    r.stdout = String::from_utf8_lossy(&out).into_owned();
    r.stderr = String::from_utf8_lossy(&err).into_owned();
    r.agent_json = String::from_utf8_lossy(&agent).into_owned();
    Ok(())
}

pub fn result_from_wire(r: v1::AssignmentResult) -> AssignmentResult {
    let result = match v1::OutcomeClass::try_from(r.class).unwrap_or(v1::OutcomeClass::Errored) {
        v1::OutcomeClass::Succeeded => Ok(()),
        v1::OutcomeClass::Failed => Err(StepError::failed(r.message)),
        v1::OutcomeClass::Errored => Err(StepError::errored(r.message)),
        v1::OutcomeClass::Aborted => Err(StepError::aborted(r.message)),
    };
    AssignmentResult {
        assignment_id: r.assignment_id,
        epoch: r.epoch,
        exit_code: r.exit_code,
        stdout: r.stdout,
        stderr: r.stderr,
        outputs: unnamed(r.outputs),
        result,
        agent: if r.agent_json.is_empty() { None } else { serde_json::from_str(&r.agent_json).ok() },
        output: r.output.map(record_from_wire).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_pointing_out_of_itself_is_refused() {
        let base = std::env::temp_dir().join(format!("steppe-payload-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let tree = base.join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(base.join("secret"), "coordinator only").unwrap();
        std::os::unix::fs::symlink(base.join("secret"), tree.join("stdout")).unwrap();
        std::fs::write(tree.join("stderr"), "").unwrap();
        std::fs::write(tree.join("agent.json"), "").unwrap();
        let store = crate::artifacts::LocalArtifactStore::new(&base.join("store")).unwrap();
        let r = crate::artifacts::ArtifactStore::put_dir(&store, &tree).unwrap();
        let mut wire = v1::AssignmentResult { payload: Some(v1::ArtifactRef { digest: r.digest }), ..Default::default() };
        let e = restore_payload(&mut wire, &store, &base).unwrap_err();
        assert!(e.to_string().contains("leads outside"), "{e}");
        assert!(!wire.stdout.contains("coordinator only"));
    }

    #[test]
    fn assignments_and_results_round_trip() {
        let a = Assignment {
            id: "a1".into(),
            run_id: "r".into(),
            step: "build [os=linux]".into(),
            attempt: 2,
            epoch: 1,
            pool: String::new(),
            command: "echo {{ .source.x }}".into(),
            template: Some(serde_json::json!({"source": {"x": 1}})),
            env: vec!["GOFLAGS".into()],
            cwd: Cwd::Host(PathBuf::from("/srv")),
            inputs: vec![("src".into(), ArtifactRef { digest: "abc".into() })],
            outputs: vec!["out".into()],
            timeout: Some(Duration::from_millis(1500)),
            judge: Judge { stdout: Some("ok".into()), code: Some(3), files: vec!["out/f".into()] },
            image: None,
            stream: true,
            agent: None,
            fix: None,
        };
        let b = assignment_from_wire(assignment_to_wire(&a));
        assert_eq!((b.id, b.cwd, b.inputs, b.timeout, b.judge, b.template), (a.id, a.cwd, a.inputs, a.timeout, a.judge, a.template));
        let r = AssignmentResult {
            assignment_id: "a1".into(),
            epoch: 3,
            exit_code: Some(1),
            stdout: "o".into(),
            stderr: "e".into(),
            outputs: vec![],
            result: Err(StepError::failed("boom")),
            agent: None,
            output: OutputRecord {
                head: vec![OutputLine { stderr: false, line: "first".into() }],
                tail: vec![OutputLine { stderr: true, line: "last".into() }],
                omitted_lines: 7,
                omitted_bytes: 70,
                full: Some(ArtifactRef { digest: "d".repeat(64) }),
            },
        };
        let back = result_from_wire(result_to_wire(&r));
        assert_eq!(back.result, r.result);
        assert_eq!(back.exit_code, Some(1));
        assert_eq!(back.output, r.output);
    }
}
