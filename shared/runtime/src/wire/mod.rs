//! Conversions between the engine's types and the `steppe.v1` messages (one
//! file per concern beside this one), the limits on what travels, and the
//! claim check that carries a large result by reference.

mod agent;
mod assignment;
pub mod history;
pub mod json;
pub mod trace;

use steppe_proto::v1;

use crate::artifacts::ArtifactRef;

pub use agent::{outcome_from_wire, outcome_to_wire, work_from_wire, work_to_wire};
pub use assignment::{assignment_from_wire, assignment_to_wire, result_from_wire, result_to_wire};

/// Why a message from a peer cannot be read as the engine's type.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A sub-message every sender sets is absent.
    #[error("{0} is missing")]
    Missing(&'static str),
    #[error("{field}: {problem}")]
    Json { field: &'static str, problem: json::JsonError },
    #[error("{0}: not a JSON object")]
    NotAnObject(&'static str),
}

/// A JSON object that must be present.
fn object_from_wire(j: Option<v1::Json>, field: &'static str) -> Result<serde_json::Map<String, serde_json::Value>, WireError> {
    let j = j.ok_or(WireError::Missing(field))?;
    match json::json_from_wire(j).map_err(|problem| WireError::Json { field, problem })? {
        serde_json::Value::Object(m) => Ok(m),
        _ => Err(WireError::NotAnObject(field)),
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

/// A message through its prost bytes and back (for round-trip tests).
#[cfg(test)]
pub(crate) fn through_bytes<M: prost::Message + Default>(m: M) -> M {
    M::decode(m.encode_to_vec().as_slice()).expect("prost decodes what it encoded")
}

/// The file of a payload artifact holding the agent outcome (prost-encoded);
/// absent when the result has none.
const AGENT_FILE: &str = "agent.pb";

/// Whether [`offload_payload`] has anything to move (it then writes files,
/// so belongs where blocking is fine); most results are small.
pub fn needs_offload(r: &v1::AssignmentResult) -> bool {
    use prost::Message;
    r.encoded_len() > INLINE_RESULT_MAX
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
    let written = (|| {
        std::fs::write(dir.join("stdout"), &r.stdout)?;
        std::fs::write(dir.join("stderr"), &r.stderr)?;
        if let Some(agent) = &r.agent {
            std::fs::write(dir.join(AGENT_FILE), agent.encode_to_vec())?;
        }
        store.put_dir(&dir)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    r.payload = Some(v1::ArtifactRef { digest: written?.digest });
    r.stdout.clear();
    r.stderr.clear();
    r.agent = None;
    Ok(())
}

/// The most one file of a result's payload may hold.
const PAYLOAD_FILE_MAX: u64 = 64 << 20;

/// Brings a result's text back from its payload artifact, if it has one.
pub fn restore_payload(r: &mut v1::AssignmentResult, store: &dyn crate::artifacts::ArtifactStore, scratch: &std::path::Path) -> std::io::Result<()> {
    use prost::Message;
    use steppe_language::confine::{read_capped, resolve, PathError};
    let Some(p) = r.payload.take() else { return Ok(()) };
    let dir = scratch.join(format!("payload-in-{}-{}", r.assignment_id, r.epoch));
    let _ = std::fs::remove_dir_all(&dir);
    // The artifact came from a worker: a symlink in it must not lead to this host's files.
    let read = |name: &str| resolve(&dir, name, Some(&dir), "the result's payload").and_then(|p| read_capped(&p, PAYLOAD_FILE_MAX));
    let failed = |name: &str, e: PathError| std::io::Error::other(format!("{name} {e}"));
    let got = store.materialize(&ArtifactRef { digest: p.digest }, &dir).and_then(|()| {
        let out = read("stdout").map_err(|e| failed("stdout", e))?;
        let err = read("stderr").map_err(|e| failed("stderr", e))?;
        let agent = match read(AGENT_FILE) {
            Err(PathError::Missing) => None,
            got => Some(got.map_err(|e| failed(AGENT_FILE, e))?),
        };
        Ok((out, err, agent))
    });
    let _ = std::fs::remove_dir_all(&dir);
    let (out, err, agent) = got?;
    r.stdout = String::from_utf8_lossy(&out).into_owned();
    r.stderr = String::from_utf8_lossy(&err).into_owned();
    r.agent = match agent {
        None => None,
        Some(bytes) => Some(Box::new(v1::AgentOutcome::decode(bytes.as_slice()).map_err(|e| std::io::Error::other(format!("{AGENT_FILE} is not an AgentOutcome: {e}")))?)),
    };
    Ok(())
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
        let store = crate::artifacts::LocalArtifactStore::new(&base.join("store")).unwrap();
        let r = crate::artifacts::ArtifactStore::put_dir(&store, &tree).unwrap();
        let mut wire = v1::AssignmentResult { payload: Some(v1::ArtifactRef { digest: r.digest }), ..Default::default() };
        let e = restore_payload(&mut wire, &store, &base).unwrap_err();
        assert!(e.to_string().contains("leads outside"), "{e}");
        assert!(!wire.stdout.contains("coordinator only"));
    }

    #[test]
    fn a_large_result_travels_by_reference_and_comes_back_whole() {
        let base = std::env::temp_dir().join(format!("steppe-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let store = crate::artifacts::LocalArtifactStore::new(&base.join("store")).unwrap();
        let outcome = crate::agent_work::AgentOutcome {
            response: "r".repeat(INLINE_RESULT_MAX),
            trajectory: vec![crate::agent_work::TrajectoryEntry { name: "t".into(), args: serde_json::json!({"b": 1, "a": [2.5]}), ok: true }],
            ..Default::default()
        };
        for agent in [Some(outcome), None] {
            let mut r = crate::assignment::AssignmentResult::with_id("a1", 2, Ok(()));
            r.stdout = "o".repeat(INLINE_RESULT_MAX);
            r.stderr = "e".into();
            r.agent = agent;
            let mut wire = result_to_wire(&r);
            offload_payload(&mut wire, &store, &base).unwrap();
            assert!(wire.payload.is_some() && wire.stdout.is_empty() && wire.agent.is_none(), "offloaded");
            restore_payload(&mut wire, &store, &base).unwrap();
            let back = result_from_wire(wire).unwrap();
            assert_eq!((back.stdout, back.stderr, back.agent), (r.stdout, r.stderr, r.agent));
        }
        let small = result_to_wire(&crate::assignment::AssignmentResult::with_id("a2", 0, Ok(())));
        let mut kept = small.clone();
        offload_payload(&mut kept, &store, &base).unwrap();
        assert_eq!(kept, small, "a small result travels inline");
    }

    #[test]
    fn a_payload_whose_agent_file_does_not_decode_is_refused() {
        let base = std::env::temp_dir().join(format!("steppe-payload-pb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let tree = base.join("tree");
        std::fs::create_dir_all(&tree).unwrap();
        std::fs::write(tree.join("stdout"), "").unwrap();
        std::fs::write(tree.join("stderr"), "").unwrap();
        std::fs::write(tree.join(AGENT_FILE), [0xff, 0xff, 0xff]).unwrap();
        let store = crate::artifacts::LocalArtifactStore::new(&base.join("store")).unwrap();
        let r = crate::artifacts::ArtifactStore::put_dir(&store, &tree).unwrap();
        let mut wire = v1::AssignmentResult { payload: Some(v1::ArtifactRef { digest: r.digest }), ..Default::default() };
        let e = restore_payload(&mut wire, &store, &base).unwrap_err();
        assert!(e.to_string().starts_with("agent.pb is not an AgentOutcome"), "{e}");
    }
}
