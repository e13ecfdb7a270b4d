//! steppe-language: the pipeline language — the YAML tree, the strict
//! decoder, the model, loading, `((vars))`, validation, `expr:`, templates,
//! built-ins, JSON Schema, the key reference and the machine checks.
//!
//! It depends on no async runtime, no gRPC and no database (ARCHITECTURE.md;
//! a test below keeps it so): anything that only reads a pipeline can use it.

pub mod builtins;
pub mod calendar;
pub mod confine;
pub mod de;
pub mod duration;
pub mod expr;
pub mod load;
pub mod machine;
pub mod model;
pub mod reference;
pub mod schema;
pub mod source;
pub mod suggest;
pub mod template;
pub mod validate;
pub mod vars;
pub mod yaml;

pub use load::{load_file, load_str, LoadOptions, Loaded};
pub use source::{Diagnostic, Diagnostics};

#[cfg(test)]
mod tests {
    const FORBIDDEN: [&str; 12] = ["tokio", "tonic", "prost", "rusqlite", "redis", "reqwest", "axum", "ractor", "hyper", "mio", "steppe-runtime", "steppe-proto"];

    /// The language crate stays free of runtimes, servers and databases:
    /// not one of them among everything it builds with, directly or not.
    #[test]
    fn the_language_depends_on_no_runtime_server_or_database() {
        let out = std::process::Command::new(env!("CARGO"))
            .args(["tree", "-p", "steppe-language", "-e", "normal", "--prefix", "none", "--offline"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("cargo tree runs");
        assert!(out.status.success(), "cargo tree: {}", String::from_utf8_lossy(&out.stderr));
        let tree = String::from_utf8_lossy(&out.stdout);
        let crates: Vec<&str> = tree.lines().filter_map(|l| l.split_whitespace().next()).collect();
        assert!(crates.contains(&"saphyr-parser"), "the tree was read: {tree}");
        for forbidden in FORBIDDEN {
            assert!(!crates.contains(&forbidden), "steppe-language must not depend on {forbidden} (even through another crate): it is the language, not the runtime");
        }
    }
}
