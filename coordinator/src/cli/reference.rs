//! docs/cli.md, made from the command definitions `--help` prints: every
//! command, its arguments and flags with their help, defaults and values.

use clap::CommandFactory;

/// The whole command line as Markdown.
pub fn markdown() -> String {
    let root = super::Cli::command();
    let mut out = String::from("# The `steppe` command line\n\n<!-- Made from the command definitions by `UPDATE_CLI_DOCS=1 cargo test -p steppe-coordinator cli_reference`; edit the doc comments in coordinator/src/cli/, not this file. -->\n\n");
    if let Some(about) = root.get_long_about().or(root.get_about()) {
        out.push_str(&format!("{}\n\n", about.to_string().trim()));
    }
    out.push_str("| command | what it does |\n|---|---|\n");
    for c in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
        out.push_str(&format!("| [`steppe {}`](#steppe-{}) | {} |\n", c.get_name(), anchor(c.get_name()), about.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")));
    }
    out.push('\n');
    for c in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        command(&mut out, c, "steppe");
    }
    out
}

fn anchor(name: &str) -> String {
    name.replace(' ', "-")
}

fn command(out: &mut String, c: &clap::Command, parent: &str) {
    let path = format!("{parent} {}", c.get_name());
    let level = if parent == "steppe" { "##" } else { "###" };
    out.push_str(&format!("{level} `{path}`\n\n"));
    if let Some(about) = c.get_long_about().or(c.get_about()) {
        let text = about.to_string();
        // Example lines (indented in the help) become a code block.
        let mut in_code = false;
        for line in text.trim().lines() {
            let code = line.starts_with("  ");
            if code != in_code {
                out.push_str("```\n");
                in_code = code;
            }
            out.push_str(if code { line.trim_start() } else { line });
            out.push('\n');
        }
        if in_code {
            out.push_str("```\n");
        }
        out.push('\n');
    }
    let mut usage = c.clone().bin_name(path.clone());
    out.push_str(&format!("```\n{}\n```\n\n", usage.render_usage().to_string().trim_start_matches("Usage: ")));
    let args: Vec<&clap::Arg> = c.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help" && a.get_id() != "version").collect();
    if !args.is_empty() {
        out.push_str("| argument | meaning |\n|---|---|\n");
        for a in args {
            let name = match (a.get_long(), a.get_short()) {
                (Some(l), Some(s)) => format!("`-{s}`, `--{l}`"),
                (Some(l), None) => format!("`--{l}`"),
                (None, Some(s)) => format!("`-{s}`"),
                (None, None) => format!("`{}`", a.get_value_names().and_then(|v| v.first()).map(|v| v.to_string()).unwrap_or_else(|| a.get_id().to_string().to_uppercase())),
            };
            let value = match (a.get_long().is_some() || a.get_short().is_some(), a.get_action().takes_values(), a.get_value_names()) {
                (true, true, Some(v)) => format!(" `{}`", v.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(" ")),
                (true, true, None) => format!(" `{}`", a.get_id().to_string().to_uppercase()),
                _ => String::new(),
            };
            let help = a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default();
            let mut text = help.split_whitespace().collect::<Vec<_>>().join(" ");
            let possible: Vec<String> = a.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| format!("`{}`", v.get_name())).collect();
            if !possible.is_empty() && a.get_action().takes_values() {
                text.push_str(&format!(" One of {}.", possible.join(", ")));
            }
            let defaults: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            if !defaults.is_empty() && a.get_action().takes_values() {
                text.push_str(&format!(" Default: `{}`.", defaults.join(" ")));
            }
            if let Some(env) = a.get_env() {
                text.push_str(&format!(" Also from `${}`.", env.to_string_lossy()));
            }
            out.push_str(&format!("| {name}{value} | {} |\n", text.replace('|', "\\|")));
        }
        out.push('\n');
    }
    for sub in c.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
        command(out, sub, &path);
    }
}

#[cfg(test)]
mod tests {
    /// docs/cli.md is what the definitions make (UPDATE_CLI_DOCS=1 rewrites it).
    #[test]
    fn cli_reference_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cli.md");
        let made = super::markdown();
        if std::env::var_os("UPDATE_CLI_DOCS").is_some() {
            std::fs::write(&path, &made).expect("write docs/cli.md");
            return;
        }
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(kept == made, "docs/cli.md is not what the command definitions make: run `UPDATE_CLI_DOCS=1 cargo test -p steppe-coordinator cli_reference` and commit it");
        assert!(made.contains("## `steppe runs`") && made.contains("`--follow`"), "the reference holds the commands and their flags");
    }
}
