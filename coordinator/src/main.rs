//! The `steppe` binary: parses the command line and hands it to its command
//! (`steppe_coordinator::cli`).

use std::process::ExitCode;

use clap::Parser;
use steppe_coordinator::cli::{exit, Cli};

fn main() -> ExitCode {
    exit(Cli::parse().run())
}
