//! A step's output as it is written: every line goes to a file as it
//! arrives (memory stays bounded however many lines come), the first and
//! last lines are kept for the store, and the whole file becomes an
//! artifact when anything was left out of them. Lines also go on to the
//! live view, which may drop them under a flood; the record never does.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use steppe_runtime::artifacts::ArtifactStore;
use steppe_runtime::assignment::{OutputLine, OutputRecord};

use crate::sink::{LineSink, Stream};

/// The name of the whole output inside its artifact.
pub const FULL_OUTPUT: &str = "output.log";

struct Kept {
    /// Opened only once something will be left out of head and tail (a
    /// step that prints little never touches the disk for it).
    file: Option<std::io::BufWriter<std::fs::File>>,
    head: Vec<OutputLine>,
    tail: VecDeque<OutputLine>,
    /// Bytes held in head, and in tail.
    head_bytes: usize,
    tail_bytes: usize,
    omitted_lines: u64,
    omitted_bytes: u64,
    /// Writing the file failed: the record says so instead of pointing at it.
    broken: Option<String>,
}

/// Head and tail may hold this much each (lines arrive cut at 64 KiB).
const HELD_MAX: usize = 512 << 10;

/// Wraps the live sink of one assignment.
pub struct Recorder {
    live: Arc<dyn LineSink>,
    path: PathBuf,
    kept: Mutex<Kept>,
}

fn shortened(mut l: OutputLine) -> OutputLine {
    if l.line.len() > OutputRecord::LINE {
        let mut end = OutputRecord::LINE;
        while !l.line.is_char_boundary(end) {
            end -= 1;
        }
        let more = l.line.len() - end;
        l.line.truncate(end);
        l.line.push_str(&format!("… ({more} more bytes in the full output)"));
    }
    l
}

fn write_line(f: &mut std::io::BufWriter<std::fs::File>, l: &OutputLine) -> std::io::Result<()> {
    f.write_all(if l.stderr { b"e " } else { b"o " })?;
    f.write_all(l.line.as_bytes())?;
    f.write_all(b"\n")
}

impl Kept {
    /// Starts the file with everything seen so far.
    fn open(&mut self, path: &Path) {
        if self.file.is_some() || self.broken.is_some() {
            return;
        }
        let opened = std::fs::File::create(path).map(|f| std::io::BufWriter::with_capacity(64 << 10, f)).and_then(|mut f| {
            for l in self.head.iter().chain(self.tail.iter()) {
                write_line(&mut f, l)?;
            }
            Ok(f)
        });
        match opened {
            Ok(f) => self.file = Some(f),
            Err(e) => self.broken = Some(format!("the full output could not be written ({}: {e})", path.display())),
        }
    }
}

impl Recorder {
    /// Records into `dir/output-<id>.log` (when it comes to that).
    pub fn new(dir: &Path, id: &str, live: Arc<dyn LineSink>) -> Arc<Recorder> {
        let safe: String = id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
        Arc::new(Recorder {
            live,
            path: dir.join(format!("output-{safe}.log")),
            kept: Mutex::new(Kept { file: None, head: Vec::new(), tail: VecDeque::new(), head_bytes: 0, tail_bytes: 0, omitted_lines: 0, omitted_bytes: 0, broken: None }),
        })
    }

    /// Whether [`Recorder::finish`] will store anything (and so should run
    /// where blocking is fine); most steps print little, and it will not.
    pub fn stores(&self) -> bool {
        let k = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        k.omitted_lines > 0 || k.file.is_some() || k.head.iter().chain(k.tail.iter()).any(|l| l.line.len() > OutputRecord::LINE)
    }

    /// The record, and (when anything was left out of it, lines or the
    /// ends of long ones) the whole output stored as an artifact. The file
    /// goes either way.
    pub fn finish(&self, store: &dyn ArtifactStore) -> OutputRecord {
        let mut k = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let long = k.head.iter().chain(k.tail.iter()).any(|l| l.line.len() > OutputRecord::LINE);
        let mut full = None;
        let mut failure = None;
        let wrote = k.file.is_some() || k.omitted_lines > 0 || long;
        if k.omitted_lines > 0 || long {
            k.open(&self.path);
            let flushed = k.file.take().map(|mut f| f.flush());
            let stored = match (&k.broken, flushed) {
                (Some(why), _) => Err(why.clone()),
                (None, Some(Err(e))) => Err(format!("the full output could not be written: {e}")),
                (None, None) => Err("the full output was not written".to_string()),
                (None, Some(Ok(()))) => store_file(&self.path, store),
            };
            match stored {
                Ok(r) => full = Some(r),
                Err(why) => failure = Some(OutputLine { stderr: true, line: format!("steppe: {why}; only the first and last lines are kept") }),
            }
        }
        if wrote {
            let _ = std::fs::remove_file(&self.path);
        }
        let mut record = OutputRecord {
            head: std::mem::take(&mut k.head).into_iter().map(shortened).collect(),
            tail: k.tail.drain(..).map(shortened).collect(),
            omitted_lines: k.omitted_lines,
            omitted_bytes: k.omitted_bytes,
            full,
        };
        record.tail.extend(failure);
        record
    }
}

/// Stores the log file as an artifact holding [`FULL_OUTPUT`].
fn store_file(path: &Path, store: &dyn ArtifactStore) -> Result<steppe_runtime::artifacts::ArtifactRef, String> {
    let dir = path.with_extension("d");
    let _ = std::fs::remove_dir_all(&dir);
    let r = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::rename(path, dir.join(FULL_OUTPUT)))
        .and_then(|()| store.put_dir(&dir))
        .map_err(|e| format!("the full output could not be stored: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    r
}

impl LineSink for Recorder {
    fn line(&self, run_id: &str, step: &str, stream: Stream, line: &str) {
        // Secrets this process holds never reach the record, the file or the live view.
        let line = &*steppe_runtime::secrets::mask(line);
        {
            let mut k = self.kept.lock().unwrap_or_else(|p| p.into_inner());
            let l = OutputLine { stderr: stream == Stream::Stderr, line: line.to_string() };
            if let Some(f) = k.file.as_mut() {
                if let Err(e) = write_line(f, &l) {
                    k.file = None;
                    k.broken = Some(format!("the full output could not be written: {e}"));
                }
            }
            let len = l.line.len();
            if k.tail.is_empty() && k.head.len() < OutputRecord::HEAD && k.head_bytes + len <= HELD_MAX {
                k.head_bytes += len;
                k.head.push(l);
            } else {
                k.tail_bytes += len;
                k.tail.push_back(l);
            }
            // The file takes over before anything is left out of the tail.
            let over = |k: &Kept| k.tail.len() > OutputRecord::TAIL || (k.tail_bytes > HELD_MAX && k.tail.len() > 1);
            if over(&k) {
                k.open(&self.path);
            }
            while over(&k) {
                if let Some(gone) = k.tail.pop_front() {
                    k.tail_bytes -= gone.line.len();
                    k.omitted_lines += 1;
                    k.omitted_bytes += gone.line.len() as u64 + 1;
                }
            }
        }
        self.live.line(run_id, step, stream, line);
    }
}

/// Reads the lines of a stored full output: (stderr, line) each.
pub fn parse_full(text: &str) -> impl Iterator<Item = (bool, &str)> {
    text.lines().map(|l| match l.split_at_checked(2) {
        Some(("e ", rest)) => (true, rest),
        Some(("o ", rest)) => (false, rest),
        _ => (false, l),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Nowhere;
    impl LineSink for Nowhere {
        fn line(&self, _: &str, _: &str, _: Stream, _: &str) {}
    }

    #[test]
    fn a_flood_keeps_its_head_and_tail_and_stores_the_rest() {
        let base = std::env::temp_dir().join(format!("steppe-recorder-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let store = steppe_runtime::artifacts::LocalArtifactStore::new(&base.join("store")).unwrap();
        let small = Recorder::new(&base, "a-1", Arc::new(Nowhere));
        small.line("r", "s", Stream::Stdout, "only");
        let r = small.finish(&store);
        assert_eq!((r.head.len(), r.tail.len(), r.omitted_lines, r.full.is_none()), (1, 0, 0, true), "nothing left out, nothing stored");
        let big = Recorder::new(&base, "a-2", Arc::new(Nowhere));
        for i in 0..100_000 {
            big.line("r", "s", if i % 10 == 0 { Stream::Stderr } else { Stream::Stdout }, &format!("line {i}"));
        }
        let r = big.finish(&store);
        assert_eq!(r.head.len(), OutputRecord::HEAD);
        assert_eq!(r.tail.len(), OutputRecord::TAIL);
        assert_eq!(r.omitted_lines, 100_000 - 1000);
        assert_eq!(r.head[0].line, "line 0");
        assert!(r.head[0].stderr && !r.head[1].stderr);
        assert_eq!(r.tail.last().map(|l| l.line.as_str()), Some("line 99999"));
        let out = base.join("out");
        store.materialize(r.full.as_ref().unwrap(), &out).unwrap();
        let text = std::fs::read_to_string(out.join(FULL_OUTPUT)).unwrap();
        let lines: Vec<(bool, &str)> = parse_full(&text).collect();
        assert_eq!(lines.len(), 100_000);
        assert_eq!(lines[50_000], (true, "line 50000"));
        assert!(!base.join("output-a-2.log").exists(), "the file goes");
    }
}
