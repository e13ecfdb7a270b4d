//! The host environment a command run on this host sees: an allowlist.

/// Host variables every host-executed command sees (plus declared names that
/// are set). Defined by the language, whose key reference documents it.
pub use steppe_language::builtins::HOST_ENV;

/// The shell host commands run under, as a path: a program named by path
/// lets the process be started by `posix_spawn` (vfork) rather than
/// `fork`, which copies this large process's page tables for every step —
/// std falls back to `fork` when the child's `PATH` is set and the program
/// is a bare name. Looked up once, on this process's `PATH` (which the
/// child gets).
pub fn shell() -> &'static std::ffi::OsStr {
    static SHELL: std::sync::OnceLock<std::ffi::OsString> = std::sync::OnceLock::new();
    SHELL.get_or_init(|| steppe_language::machine::on_path("sh").map(|p| p.into_os_string()).unwrap_or_else(|| "sh".into()))
}

/// The allowlist's variables this process has, read once (a process's own
/// environment does not change under it).
pub fn values() -> &'static [(&'static str, std::ffi::OsString)] {
    static VALUES: std::sync::OnceLock<Vec<(&'static str, std::ffi::OsString)>> = std::sync::OnceLock::new();
    VALUES.get_or_init(|| HOST_ENV.iter().filter_map(|n| std::env::var_os(n).map(|v| (*n, v))).collect())
}
