//! The process log of the long-running commands (`steppe coordinator`,
//! `steppe worker`): `tracing` events on stdout or stderr, as text or JSON
//! lines for a log collector, filtered by `--log-level` or `RUST_LOG`, and
//! written a batch at a time ([`Batches`]).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use clap::{Args, ValueEnum};

#[derive(Args, Debug, Clone)]
pub struct LogArgs {
    /// How much the coordinator and workers log: error, warn, info, debug
    /// or trace (steppe's own lines; other crates' from warn). RUST_LOG, in
    /// its full syntax, is used when this is not given.
    #[arg(long, value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug", "trace"])]
    pub log_level: Option<String>,
    /// The shape of those log lines: text for people, json (one object a
    /// line: timestamp, level, message, and the run and pipeline a line is
    /// about) for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogArgs {
    /// The filter: the flag's level for steppe's crates, or RUST_LOG, or info.
    fn filter(&self) -> tracing_subscriber::EnvFilter {
        use tracing_subscriber::EnvFilter;
        let ours = |level: &str| EnvFilter::new(format!("warn,steppe={level},steppe_coordinator={level},steppe_worker={level},steppe_runtime={level},steppe_cloud={level}"));
        match (&self.log_level, std::env::var("RUST_LOG")) {
            (Some(level), _) => ours(level),
            (None, Ok(spec)) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
                eprintln!("steppe: RUST_LOG={spec:?} is not a filter ({e}); logging at info");
                ours("info")
            }),
            _ => ours("info"),
        }
    }

    /// Installs the process's log on stdout (the coordinator's, where its
    /// banner is) or stderr (a worker's) — once; later calls do nothing.
    pub fn init(&self, to: Sink) {
        use std::io::IsTerminal;
        let colour = self.log_format == LogFormat::Text && std::env::var_os("NO_COLOR").is_none() && match to {
            Sink::Stdout => std::io::stdout().is_terminal(),
            Sink::Stderr => std::io::stderr().is_terminal(),
        };
        let writer = Lines(BATCHES.get_or_init(|| Batches::start(Box::new(move |bytes| to.write_all(bytes)))).clone());
        let builder = tracing_subscriber::fmt().with_env_filter(self.filter()).with_writer(writer).with_target(false).with_ansi(colour);
        let _ = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        };
    }
}

/// Where a process's log goes. A process killed (`SIGKILL`, or a signal
/// before its handlers are installed) may lose the last [`BATCH`] of its
/// info lines; one that ends otherwise writes them out first ([`flush`]).
#[derive(Debug, Clone, Copy)]
pub enum Sink {
    Stdout,
    Stderr,
}

impl Sink {
    fn write_all(self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Stdout => std::io::stdout().lock().write_all(bytes),
            Sink::Stderr => std::io::stderr().lock().write_all(bytes),
        }
    }
}

/// How long a log line may wait for others to go out with it.
const BATCH: Duration = Duration::from_millis(5);

/// Past this much pending, the thread that logs writes the batch out
/// itself (and waits for a reader that does not keep up, as it would
/// writing its line alone).
const PENDING_MAX: usize = 1 << 20;

static BATCHES: OnceLock<Arc<Batches>> = OnceLock::new();

/// The log's lines, gathered and written out in one `write` a batch by a
/// thread of their own, at most [`BATCH`] after the first of them; a
/// warning or an error goes out at once, with what was pending before it.
/// A busy coordinator logs two lines a step; written one at a time, each
/// cost a `write` on the thread that logged it and a wake-up of whoever
/// reads the log (a terminal, a container runtime, a collector).
struct Batches {
    pending: Mutex<Vec<u8>>,
    /// Held while a batch is taken and written, so that batches go out in
    /// order and [`flush`] returns after the one being written.
    writing: Mutex<()>,
    arrived: Condvar,
    out: Out,
    /// False when no thread could be started for them: each line is
    /// written as it comes.
    batched: AtomicBool,
}

/// Where a batch is written.
type Out = Box<dyn Fn(&[u8]) -> std::io::Result<()> + Send + Sync>;

impl Batches {
    fn start(out: Out) -> Arc<Batches> {
        let b = Arc::new(Batches { pending: Mutex::new(Vec::new()), writing: Mutex::new(()), arrived: Condvar::new(), out, batched: AtomicBool::new(true) });
        let writer = b.clone();
        let started = std::thread::Builder::new().name("steppe-log".into()).spawn(move || loop {
            {
                let mut pending = writer.pending.lock().unwrap_or_else(|p| p.into_inner());
                while pending.is_empty() {
                    pending = writer.arrived.wait(pending).unwrap_or_else(|p| p.into_inner());
                }
            }
            std::thread::sleep(BATCH);
            writer.write_out();
        });
        if started.is_err() {
            b.batched.store(false, Ordering::Relaxed);
        }
        b
    }

    /// Writes what is pending now.
    fn write_out(&self) {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let batch = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if !batch.is_empty() {
            let _ = (self.out)(&batch);
        }
    }
}

/// Writes out the log's pending lines: the process is about to end.
pub fn flush() {
    if let Some(b) = BATCHES.get() {
        b.write_out();
    }
}

/// The log's writer: a [`Line`] for each event.
struct Lines(Arc<Batches>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Lines {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line { batches: self.0.clone(), urgent: false }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Line {
        Line { batches: self.0.clone(), urgent: *meta.level() <= tracing::Level::WARN }
    }
}

/// One log line, on its way into the pending batch (a warning or an
/// error: out at once).
struct Line {
    batches: Arc<Batches>,
    urgent: bool,
}

impl Write for Line {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let b = &self.batches;
        if !b.batched.load(Ordering::Relaxed) {
            return (b.out)(bytes).map(|()| bytes.len());
        }
        let mut pending = b.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() && !self.urgent {
            b.arrived.notify_one();
        }
        pending.extend_from_slice(bytes);
        if self.urgent || pending.len() > PENDING_MAX {
            drop(pending);
            b.write_out();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered() -> (Arc<Batches>, Arc<Mutex<Vec<u8>>>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let sink = got.clone();
        let b = Batches::start(Box::new(move |bytes: &[u8]| {
            sink.lock().unwrap().extend_from_slice(bytes);
            Ok(())
        }));
        (b, got)
    }

    fn text(got: &Mutex<Vec<u8>>) -> String {
        String::from_utf8(got.lock().unwrap().clone()).unwrap()
    }

    /// Lines from four threads, warnings among them: each arrives once, and
    /// each thread's in the order it logged them.
    #[test]
    fn every_line_arrives_once_in_its_threads_order() {
        let (b, got) = gathered();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let mut line = Line { batches: b.clone(), urgent: i % 50 == 0 };
                        line.write_all(format!("{t} {i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        b.write_out();
        let mut next = [0usize; 4];
        for line in text(&got).lines() {
            let (t, i) = line.split_once(' ').unwrap();
            let (t, i): (usize, usize) = (t.parse().unwrap(), i.parse().unwrap());
            assert_eq!(i, next[t], "thread {t}'s lines in order, once each");
            next[t] += 1;
        }
        assert_eq!(next, [500; 4]);
    }

    /// A warning is written before its write returns, after what was pending.
    #[test]
    fn a_warning_goes_out_at_once_with_what_came_before() {
        let (b, got) = gathered();
        Line { batches: b.clone(), urgent: false }.write_all(b"info\n").unwrap();
        Line { batches: b, urgent: true }.write_all(b"warn\n").unwrap();
        assert_eq!(text(&got), "info\nwarn\n");
    }
}
