//! Assignments and their results ↔ the `steppe.v1` messages of worker.proto.

use std::path::PathBuf;
use std::time::Duration;

use steppe_proto::v1;

use super::agent::{container_from_wire, container_to_wire, outcome_from_wire, outcome_to_wire, work_from_wire, work_to_wire};
use super::json::{json_from_wire, json_to_wire};
use super::WireError;
use crate::artifacts::ArtifactRef;
use crate::assignment::{Assignment, AssignmentResult, Cwd, Judge, McpStage, OutputLine, OutputRecord};
use crate::outcome::{Class, StepError};

fn artifact_to_wire(r: &ArtifactRef) -> v1::ArtifactRef {
    v1::ArtifactRef { digest: r.digest.clone() }
}

fn named_to_wire(v: &[(String, ArtifactRef)]) -> Vec<v1::NamedArtifact> {
    v.iter().map(|(n, r)| v1::NamedArtifact { name: n.clone(), artifact: Some(artifact_to_wire(r)) }).collect()
}

fn named_from_wire(v: Vec<v1::NamedArtifact>) -> Result<Vec<(String, ArtifactRef)>, WireError> {
    v.into_iter()
        .map(|n| {
            let a = n.artifact.ok_or(WireError::Missing("NamedArtifact.artifact"))?;
            Ok((n.name, ArtifactRef { digest: a.digest }))
        })
        .collect()
}

pub fn assignment_to_wire(a: &Assignment) -> v1::Assignment {
    let Assignment { id, run_id, step, attempt, pool, epoch, command, template, env, cwd, inputs, outputs, timeout, judge, image, stream, agent, fix, by_reference, container, trace_parent, enqueued_unix_ns, masked_env, mcp, pushed_by, first_delivery: _ } = a;
    v1::Assignment {
        id: id.clone(),
        run_id: run_id.clone(),
        step: step.clone(),
        attempt: *attempt,
        epoch: *epoch,
        pool: pool.clone(),
        command: command.clone(),
        env: env.clone(),
        cwd: Some(match cwd {
            Cwd::StepDir => v1::assignment::Cwd::StepDir(true),
            Cwd::CaptureSelf => v1::assignment::Cwd::CaptureSelf(true),
            Cwd::Host(p) => v1::assignment::Cwd::HostDir(p.to_string_lossy().into_owned()),
            Cwd::Snapshot { tree, dir } => v1::assignment::Cwd::Snapshot(v1::Snapshot { tree: Some(artifact_to_wire(tree)), dir: dir.clone() }),
        }),
        inputs: named_to_wire(inputs),
        outputs: outputs.clone(),
        timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        judge: Some(v1::Judge { stdout: judge.stdout.clone(), code: judge.code, files: judge.files.clone() }),
        image: image.clone(),
        stream: *stream,
        agent: agent.as_deref().map(|w| Box::new(work_to_wire(w))),
        fix: fix.as_deref().map(|w| Box::new(work_to_wire(w))),
        template: template.as_ref().map(json_to_wire),
        by_reference: *by_reference,
        container: Some(container_to_wire(container)),
        trace_parent: trace_parent.clone(),
        enqueued_unix_ns: *enqueued_unix_ns,
        masked_env: masked_env.clone(),
        pushed_by: pushed_by.clone(),
        mcp: mcp.as_deref().map(|m| v1::McpStage {
            server: Some(super::agent::mcp_server_to_wire(&m.server)),
            stage: m.stage.clone(),
            tool: m.tool.clone(),
            args: Some(json_to_wire(&m.args)),
            version: Some(json_to_wire(&m.version)),
        }),
    }
}

pub fn assignment_from_wire(a: v1::Assignment) -> Result<Assignment, WireError> {
    let judge = a.judge.ok_or(WireError::Missing("Assignment.judge"))?;
    Ok(Assignment {
        id: a.id,
        run_id: a.run_id,
        step: a.step,
        attempt: a.attempt,
        epoch: a.epoch,
        pool: a.pool,
        by_reference: a.by_reference,
        container: a.container.map(container_from_wire).unwrap_or_default(),
        trace_parent: a.trace_parent,
        enqueued_unix_ns: a.enqueued_unix_ns,
        masked_env: a.masked_env,
        pushed_by: a.pushed_by,
        first_delivery: false,
        mcp: match a.mcp {
            None => None,
            Some(m) => Some(Box::new(McpStage {
                server: super::agent::mcp_server_from_wire(m.server.ok_or(WireError::Missing("McpStage.server"))?),
                stage: m.stage,
                tool: m.tool,
                args: json_from_wire(m.args.ok_or(WireError::Missing("McpStage.args"))?).map_err(|problem| WireError::Json { field: "McpStage.args", problem })?,
                version: json_from_wire(m.version.ok_or(WireError::Missing("McpStage.version"))?).map_err(|problem| WireError::Json { field: "McpStage.version", problem })?,
            })),
        },
        command: a.command,
        env: a.env,
        cwd: match a.cwd.ok_or(WireError::Missing("Assignment.cwd"))? {
            v1::assignment::Cwd::StepDir(_) => Cwd::StepDir,
            v1::assignment::Cwd::CaptureSelf(_) => Cwd::CaptureSelf,
            v1::assignment::Cwd::HostDir(p) => Cwd::Host(PathBuf::from(p)),
            v1::assignment::Cwd::Snapshot(s) => {
                let tree = s.tree.ok_or(WireError::Missing("Snapshot.tree"))?;
                Cwd::Snapshot { tree: ArtifactRef { digest: tree.digest }, dir: s.dir }
            }
        },
        inputs: named_from_wire(a.inputs)?,
        outputs: a.outputs,
        timeout: a.timeout_ms.map(Duration::from_millis),
        judge: Judge { stdout: judge.stdout, code: judge.code, files: judge.files },
        image: a.image,
        stream: a.stream,
        agent: a.agent.map(|w| work_from_wire(*w)).transpose()?.map(Box::new),
        fix: a.fix.map(|w| work_from_wire(*w)).transpose()?.map(Box::new),
        template: match a.template {
            None => None,
            Some(t) => Some(json_from_wire(t).map_err(|problem| WireError::Json { field: "Assignment.template", problem })?),
        },
    })
}

pub fn result_to_wire(r: &AssignmentResult) -> v1::AssignmentResult {
    let (class, message, timed_out) = match &r.result {
        Ok(()) => (v1::OutcomeClass::Succeeded, String::new(), false),
        Err(e) => (
            match e.class {
                Class::Failed => v1::OutcomeClass::Failed,
                Class::Errored => v1::OutcomeClass::Errored,
                Class::Aborted => v1::OutcomeClass::Aborted,
            },
            e.message.clone(),
            e.timed_out,
        ),
    };
    v1::AssignmentResult {
        assignment_id: r.assignment_id.clone(),
        epoch: r.epoch,
        exit_code: r.exit_code,
        stdout: r.stdout.clone(),
        stderr: r.stderr.clone(),
        outputs: named_to_wire(&r.outputs),
        class: class as i32,
        message,
        agent: r.agent.as_ref().map(|o| Box::new(outcome_to_wire(o))),
        payload: None,
        output: Some(record_to_wire(&r.output)),
        timed_out,
        spans: r.spans.iter().map(super::trace::span_to_wire).collect(),
    }
}

pub fn result_from_wire(r: v1::AssignmentResult) -> Result<AssignmentResult, WireError> {
    // A class this build does not know (a newer worker's) counts as errored.
    let result = match v1::OutcomeClass::try_from(r.class).unwrap_or(v1::OutcomeClass::Errored) {
        v1::OutcomeClass::Succeeded => Ok(()),
        v1::OutcomeClass::Failed => Err(StepError::failed(r.message)),
        v1::OutcomeClass::Errored => Err(StepError::errored(r.message)),
        v1::OutcomeClass::Aborted => Err(StepError::aborted(r.message)),
    }
    .map_err(|e| StepError { timed_out: r.timed_out, ..e });
    Ok(AssignmentResult {
        assignment_id: r.assignment_id,
        epoch: r.epoch,
        exit_code: r.exit_code,
        stdout: r.stdout,
        stderr: r.stderr,
        outputs: named_from_wire(r.outputs)?,
        result,
        agent: r.agent.map(|o| outcome_from_wire(*o)).transpose()?,
        // None from a result made without running anything.
        output: r.output.map(record_from_wire).unwrap_or_default(),
        spans: r.spans.into_iter().map(super::trace::span_from_wire).collect(),
    })
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
        full: o.full.as_ref().map(artifact_to_wire),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::ContainerSettings;
    use crate::wire::through_bytes;

    fn full_assignment(cwd: Cwd, template: Option<serde_json::Value>) -> Assignment {
        Assignment {
            id: "a1".into(),
            run_id: "r".into(),
            step: "build [os=linux]".into(),
            attempt: 2,
            epoch: 1,
            pool: "gpu".into(),
            command: "echo {{ .source.x }}".into(),
            template,
            env: vec!["GOFLAGS".into()],
            cwd,
            inputs: vec![("src".into(), ArtifactRef { digest: "abc".into() }), ("b".into(), ArtifactRef { digest: "def".into() })],
            outputs: vec!["out".into()],
            timeout: Some(Duration::from_millis(1500)),
            judge: Judge { stdout: Some("ok".into()), code: Some(-3), files: vec!["out/f".into()] },
            image: Some("alpine:3".into()),
            stream: true,
            agent: Some(Box::new(crate::wire::agent::tests::full_work(1))),
            fix: Some(Box::new(crate::wire::agent::tests::full_work(0))),
            by_reference: true,
            container: ContainerSettings { user: Some("1000:1000".into()), network: Some("none".into()), privileged: true, cpu_shares: Some(512), memory_bytes: Some(1 << 28) },
            trace_parent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            enqueued_unix_ns: 1_700_000_000_000_000_000,
            masked_env: vec!["OPENROUTER_API_KEY".into(), "DOCS_TOKEN".into()],
            mcp: Some(Box::new(McpStage {
                server: crate::agent_work::McpServerWork { name: "tracker".into(), command: vec!["/usr/bin/tracker".into(), "--stdio".into()], ..Default::default() },
                stage: "in".into(),
                tool: "fetch_issue".into(),
                args: serde_json::json!({"id": 7, "repo": "acme/ci"}),
                version: serde_json::json!({"ref": "abc"}),
            })),
            pushed_by: "4242-1700000000000000000".into(),
            // The queue's to say, never sent: false on the way out.
            first_delivery: false,
        }
    }

    /// Assignment has no PartialEq (nor needs one outside this test).
    fn assert_same(a: &Assignment, b: &Assignment) {
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn assignments_round_trip_whole() {
        let cwds = [
            Cwd::StepDir,
            Cwd::CaptureSelf,
            Cwd::Host(PathBuf::from("/srv")),
            Cwd::Snapshot { tree: ArtifactRef { digest: "t".repeat(64) }, dir: "sub/dir".into() },
        ];
        let templates = [None, Some(serde_json::json!({"source": {"x": 1, "a": [u64::MAX, -1, 0.5]}, "version": {}, "params": null}))];
        for cwd in cwds {
            for template in templates.clone() {
                let a = full_assignment(cwd.clone(), template);
                let b = assignment_from_wire(through_bytes(assignment_to_wire(&a))).unwrap();
                assert_same(&a, &b);
            }
        }
        let plain = Assignment::command("r", "s", "true".into());
        assert_same(&plain, &assignment_from_wire(through_bytes(assignment_to_wire(&plain))).unwrap());
    }

    #[test]
    fn an_unreadable_assignment_is_an_error() {
        let mut w = assignment_to_wire(&full_assignment(Cwd::StepDir, None));
        w.cwd = None;
        assert_eq!(assignment_from_wire(w).unwrap_err().to_string(), "Assignment.cwd is missing");
        let mut w = assignment_to_wire(&full_assignment(Cwd::StepDir, None));
        w.template = Some(v1::Json { nodes: vec![] });
        assert!(assignment_from_wire(w).unwrap_err().to_string().starts_with("Assignment.template: the nodes end"));
        let mut w = assignment_to_wire(&full_assignment(Cwd::StepDir, None));
        w.inputs[1].artifact = None;
        assert!(matches!(assignment_from_wire(w), Err(WireError::Missing("NamedArtifact.artifact"))));
        let mut w = assignment_to_wire(&full_assignment(Cwd::StepDir, None));
        if let Some(agent) = w.agent.as_mut() {
            agent.assert = None;
        }
        assert!(matches!(assignment_from_wire(w), Err(WireError::Missing("AgentWork.assert"))));
    }

    #[test]
    fn results_round_trip_whole() {
        let r = AssignmentResult {
            assignment_id: "a1".into(),
            epoch: 3,
            exit_code: Some(1),
            stdout: "o".into(),
            stderr: "e".into(),
            outputs: vec![("out".into(), ArtifactRef { digest: "x".into() })],
            result: Err(StepError::failed("boom")),
            agent: Some(crate::agent_work::AgentOutcome {
                response: "r".into(),
                trajectory: vec![crate::agent_work::TrajectoryEntry { name: "t".into(), args: serde_json::json!({"b": 1, "a": 2}), ok: true }],
                ..Default::default()
            }),
            output: OutputRecord {
                head: vec![OutputLine { stderr: false, line: "first".into() }],
                tail: vec![OutputLine { stderr: true, line: "last".into() }],
                omitted_lines: 7,
                omitted_bytes: 70,
                full: Some(ArtifactRef { digest: "d".repeat(64) }),
            },
            spans: vec![crate::trace::SpanRecord { trace_id: "t".into(), span_id: "s".into(), name: "execute".into(), attributes: vec![("worker".into(), "w1".into())], ..Default::default() }],
        };
        let back = result_from_wire(through_bytes(result_to_wire(&r))).unwrap();
        assert_eq!(format!("{back:?}"), format!("{r:?}"));
        for result in [Ok(()), Err(StepError::errored("e")), Err(StepError::aborted("a")), Err(StepError::timed_out("t: timed out after 1s"))] {
            let r = AssignmentResult::with_id("x", 0, result.clone());
            assert_eq!(result_from_wire(result_to_wire(&r)).unwrap().result, result);
        }
    }
}
