//! A run's ledger (§1.13): one JSON line per event, each the JCS form of
//! `{run, stepfile, seq, type, at, prev, …}` where `prev` is the digest of
//! the whole previous record, so an edited, dropped or reordered record
//! breaks the chain; and `verify`, which walks it.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

use crate::jcs::{canonical, digest};

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("a record's fields must be a JSON object without run, stepfile, seq, type, at or prev")]
    Fields,
}

/// Appends a run's records to `<dir>/<stepfile>-<run>.jsonl`, chaining each
/// to the one before.
pub struct Ledger {
    /// The file; none writes to standard error.
    path: Option<PathBuf>,
    run: String,
    stepfile: String,
    seq: u64,
    prev: Option<String>,
}

const ENVELOPE: [&str; 6] = ["run", "stepfile", "seq", "type", "at", "prev"];

impl Ledger {
    pub fn create(dir: &Path, stepfile: &str, run: &str) -> Result<Ledger, LedgerError> {
        let path = dir.join(format!("{stepfile}-{run}.jsonl"));
        std::fs::create_dir_all(dir).map_err(|source| LedgerError::Io { path: dir.to_path_buf(), source })?;
        std::fs::File::create(&path).map_err(|source| LedgerError::Io { path: path.clone(), source })?;
        Ok(Ledger { path: Some(path), run: run.to_string(), stepfile: stepfile.to_string(), seq: 0, prev: None })
    }

    /// A ledger in `dir`, or on standard error when there is none.
    pub fn open(dir: Option<&Path>, stepfile: &str, run: &str) -> Result<Ledger, LedgerError> {
        match dir {
            Some(d) => Ledger::create(d, stepfile, run),
            None => Ok(Ledger { path: None, run: run.to_string(), stepfile: stepfile.to_string(), seq: 0, prev: None }),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Appends a record of `kind` with `fields` (an object), stamped `at`
    /// (RFC 3339 UTC); returns the line as written.
    pub fn record(&mut self, kind: &str, at: &str, fields: Value) -> Result<String, LedgerError> {
        let Value::Object(fields) = fields else { return Err(LedgerError::Fields) };
        if fields.keys().any(|k| ENVELOPE.contains(&k.as_str())) {
            return Err(LedgerError::Fields);
        }
        let mut rec = Map::new();
        rec.insert("run".into(), json!(self.run));
        rec.insert("stepfile".into(), json!(self.stepfile));
        rec.insert("seq".into(), json!(self.seq));
        rec.insert("type".into(), json!(kind));
        rec.insert("at".into(), json!(at));
        rec.insert("prev".into(), self.prev.clone().map_or(Value::Null, Value::String));
        rec.extend(fields);
        let line = canonical(&Value::Object(rec));
        match &self.path {
            Some(path) => {
                let mut f = std::fs::OpenOptions::new().append(true).open(path).map_err(|source| LedgerError::Io { path: path.clone(), source })?;
                writeln!(f, "{line}").map_err(|source| LedgerError::Io { path: path.clone(), source })?;
            }
            None => eprintln!("{line}"),
        }
        self.prev = Some(digest(line.as_bytes()));
        self.seq += 1;
        Ok(line)
    }
}

/// What `--verify` found in one ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Intact { records: u64 },
    Broken { seq: u64, reason: String },
}

impl Verdict {
    /// The line `steppe gate --verify` prints for `file`.
    pub fn line(&self, file: &Path) -> String {
        match self {
            Verdict::Intact { records } => format!("{}: intact, {records} records", file.display()),
            Verdict::Broken { seq, reason } => format!("{}: broken at seq {seq}: {reason}", file.display()),
        }
    }
}

/// Walks a ledger: every record's `seq` is its index, its `prev` the digest
/// of the canonical form of the record before it (null for the first), and
/// `run` and `stepfile` never change.
pub fn verify(path: &Path) -> Result<Verdict, LedgerError> {
    let f = std::fs::File::open(path).map_err(|source| LedgerError::Io { path: path.to_path_buf(), source })?;
    let mut prev: Option<String> = None;
    let mut ids: Option<(Value, Value)> = None;
    let mut n: u64 = 0;
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|source| LedgerError::Io { path: path.to_path_buf(), source })?;
        if line.trim().is_empty() {
            continue;
        }
        let broken = |reason: String| Ok(Verdict::Broken { seq: n, reason });
        let rec: Value = match serde_json::from_str(&line) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return broken("not a JSON object".into()),
            Err(e) => return broken(format!("not JSON: {e}")),
        };
        if rec.get("seq").and_then(Value::as_u64) != Some(n) {
            return broken(format!("seq is {}, expected {n} (a record was dropped, added or moved)", rec.get("seq").map_or("missing".into(), Value::to_string)));
        }
        let want = prev.clone().map_or(Value::Null, Value::String);
        if rec.get("prev") != Some(&want) {
            return broken("prev is not the digest of the record before it (a record was edited, dropped or moved)".into());
        }
        let these = (rec.get("run").cloned().unwrap_or(Value::Null), rec.get("stepfile").cloned().unwrap_or(Value::Null));
        match &ids {
            None => ids = Some(these),
            Some(first) if *first != these => return broken("run or stepfile differs from the first record's".into()),
            Some(_) => {}
        }
        prev = Some(digest(canonical(&rec).as_bytes()));
        n += 1;
    }
    Ok(Verdict::Intact { records: n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(dir: &Path) -> PathBuf {
        let mut l = Ledger::create(dir, "shelf-audit", "run-1").unwrap();
        l.record("run_started", "2026-12-02T00:00:00Z", json!({"identity": "sha256:ab", "inputs": "sha256:cd"})).unwrap();
        l.record("step_started", "2026-12-02T00:00:01Z", json!({"step": "fetch"})).unwrap();
        l.record("gate", "2026-12-02T00:00:02Z", json!({"step": "fetch", "attempt": 1, "gate": "names", "verdict": "pass", "diagnosis": null})).unwrap();
        l.record("run_finished", "2026-12-02T00:00:03Z", json!({"outcome": "passed"})).unwrap();
        assert!(l.record("x", "t", json!({"seq": 9})).is_err(), "the envelope is not a field");
        l.path().expect("a file").to_path_buf()
    }

    fn rewrite(path: &Path, f: impl FnOnce(&mut Vec<String>)) -> PathBuf {
        let mut lines: Vec<String> = std::fs::read_to_string(path).unwrap().lines().map(str::to_string).collect();
        f(&mut lines);
        let out = path.with_extension("tampered.jsonl");
        std::fs::write(&out, lines.join("\n") + "\n").unwrap();
        out
    }

    #[test]
    fn an_intact_ledger_verifies_and_every_tampering_breaks_it() {
        let dir = std::env::temp_dir().join(format!("steppe-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = ledger(&dir);
        assert!(path.ends_with("shelf-audit-run-1.jsonl"));
        assert_eq!(verify(&path).unwrap(), Verdict::Intact { records: 4 });
        let first: Value = serde_json::from_str(std::fs::read_to_string(&path).unwrap().lines().next().unwrap()).unwrap();
        assert_eq!(first["prev"], Value::Null);
        assert_eq!(first["seq"], json!(0));

        let edited = rewrite(&path, |l| l[2] = l[2].replace("\"pass\"", "\"fail\""));
        assert_eq!(verify(&edited).unwrap(), Verdict::Broken { seq: 3, reason: "prev is not the digest of the record before it (a record was edited, dropped or moved)".into() });
        let dropped = rewrite(&path, |l| {
            l.remove(1);
        });
        assert!(matches!(verify(&dropped).unwrap(), Verdict::Broken { seq: 1, .. }));
        let swapped = rewrite(&path, |l| l.swap(1, 2));
        assert!(matches!(verify(&swapped).unwrap(), Verdict::Broken { seq: 1, .. }));
        let cut_tail = rewrite(&path, |l| {
            l.pop();
        });
        assert_eq!(verify(&cut_tail).unwrap(), Verdict::Intact { records: 3 }, "a ledger cut short is a shorter chain; its last record says whether the run ended");
        let garbage = rewrite(&path, |l| l[0] = "{not json".into());
        assert!(matches!(verify(&garbage).unwrap(), Verdict::Broken { seq: 0, .. }));
        assert!(Verdict::Intact { records: 4 }.line(Path::new("l.jsonl")).ends_with("l.jsonl: intact, 4 records"));
    }
}
