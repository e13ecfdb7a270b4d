//! The host environment a command run on this host sees: an allowlist.

/// Host variables every host-executed command sees (plus declared names that are set).
pub const HOST_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TMPDIR", "TMP", "TEMP",
    "USER", "LOGNAME", "SHELL", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
    "no_proxy",
];
