//! The process log of the long-running commands (`steppe coordinator`,
//! `steppe worker`): `tracing` events on stderr, as text or JSON lines for a
//! log collector, filtered by `--log-level` or `RUST_LOG`.

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
        let writer = tracing_subscriber::fmt::writer::BoxMakeWriter::new(move || -> Box<dyn std::io::Write> {
            match to {
                Sink::Stdout => Box::new(std::io::stdout()),
                Sink::Stderr => Box::new(std::io::stderr()),
            }
        });
        let builder = tracing_subscriber::fmt().with_env_filter(self.filter()).with_writer(writer).with_target(false).with_ansi(colour);
        let _ = match self.log_format {
            LogFormat::Text => builder.try_init(),
            LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
        };
    }
}

/// Where a process's log goes.
#[derive(Debug, Clone, Copy)]
pub enum Sink {
    Stdout,
    Stderr,
}
