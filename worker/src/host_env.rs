//! The host environment a command run on this host sees: an allowlist.

/// Host variables every host-executed command sees (plus declared names that
/// are set). Defined by the language, whose key reference documents it.
pub use steppe_language::builtins::HOST_ENV;
