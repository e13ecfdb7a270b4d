//! The `steppe` binary: parses the command line and hands it to its command
//! (`steppe_coordinator::cli`).

use std::io::Write;
use std::process::ExitCode;

use steppe_coordinator::cli::{exit, lazy};

/// mimalloc: many small allocations freed on other threads (every step's
/// records, every model turn's JSON) are where glibc's allocator lost time.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let code = exit(lazy::parse().run());
    // The command is over and everything it owned is dropped (its store
    // closed, its scratch removed): the process leaves without the C
    // library's exit handlers, of which only the allocator's own is left,
    // handing every page back one by one (a fifth of a millisecond to 30 ms).
    steppe_coordinator::cli::log::flush();
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    match (0..=u8::MAX).find(|c| ExitCode::from(*c) == code) {
        // SAFETY: _exit ends the process at once; nothing of Rust's runs after.
        Some(c) => unsafe { libc::_exit(i32::from(c)) },
        None => code,
    }
}
