//! The `steppe` binary: parses the command line and hands it to its command
//! (`steppe_coordinator::cli`).

use std::process::ExitCode;

use clap::Parser;
use steppe_coordinator::cli::{exit, Cli};

/// mimalloc: many small allocations freed on other threads (every step's
/// records, every model turn's JSON) are where glibc's allocator lost time.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    exit(Cli::parse().run())
}
