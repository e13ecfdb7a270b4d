//! `steppe token new`: a fresh token for a coordinator's `--auth` file, and the entry that lets it in.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use steppe_runtime::auth::{digest, hex, new_token, role_of, AuthFile};

/// Make tokens for a coordinator's --auth file.
#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    New(NewArgs),
}

/// Print a fresh random token, and the --auth entry that lets it in.
///
/// The token goes to stdout (keep it: the coordinator keeps only its SHA-256);
/// the entry goes to stderr, or with --append-to into the auth file itself.
/// Send the coordinator SIGHUP to take a changed file in.
///
/// Examples:
///   steppe token new --team blue --role submit > blue.token
///   steppe token new --team blue --role worker --pools blue-gpu --append-to auth.yml > worker.token
///   steppe token new --role admin --append-to auth.yml > admin.token
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
struct NewArgs {
    /// The team the token acts for (not needed for an admin token).
    #[arg(long, required_if_eq_any = [("role", "submit"), ("role", "worker")])]
    team: Option<String>,
    /// submit (run and read its team's pipelines), worker (serve
    /// assignments), or admin (everything, every team).
    #[arg(long, value_parser = ["submit", "worker", "admin"])]
    role: String,
    /// Pools the team owns (a worker token then serves only these).
    #[arg(long, value_delimiter = ',', value_name = "POOL,…")]
    pools: Vec<String>,
    /// A label for the coordinator's logs.
    #[arg(long)]
    name: Option<String>,
    /// Append the entry to this --auth file (created if missing) instead of printing it.
    #[arg(long, value_name = "FILE")]
    append_to: Option<PathBuf>,
}

impl TokenArgs {
    pub fn run(self) -> Result<ExitCode> {
        let TokenCommand::New(a) = self.command;
        let token = new_token().context("reading the system's random source")?;
        let mut entry = String::new();
        if let Some(n) = &a.name {
            entry.push_str(&format!("- name: {n:?}\n  team: {:?}\n", a.team.clone().unwrap_or_default()));
        } else {
            entry.push_str(&format!("- team: {:?}\n", a.team.clone().unwrap_or_default()));
        }
        entry.push_str(&format!("  role: {}\n  sha256: {}\n", a.role, hex(&digest(&token))));
        if !a.pools.is_empty() {
            entry.push_str(&format!("  pools: [{}]\n", a.pools.join(", ")));
        }
        // The entry must read back as one the coordinator accepts.
        AuthFile::parse(&entry).map_err(|e| anyhow::anyhow!("{}", e.join("; ")))?;
        debug_assert!(role_of(&a.role).is_some());
        match &a.append_to {
            Some(f) => {
                let mut whole = std::fs::read_to_string(f).unwrap_or_default();
                if !whole.is_empty() && !whole.ends_with('\n') {
                    whole.push('\n');
                }
                whole.push_str(&entry);
                AuthFile::parse(&whole).map_err(|e| anyhow::anyhow!("{} would not read after adding the entry: {}", f.display(), e.join("; ")))?;
                std::fs::OpenOptions::new().create(true).append(true).open(f).and_then(|mut out| {
                    if whole.len() > entry.len() && !std::fs::read_to_string(f)?.ends_with('\n') {
                        out.write_all(b"\n")?;
                    }
                    out.write_all(entry.as_bytes())
                })
                .with_context(|| format!("appending to {}", f.display()))?;
                warn!("steppe: added the entry to {} (send the coordinator SIGHUP to take it in)", f.display());
            }
            None => warn!("steppe: add this entry to the coordinator's --auth file (it keeps only the token's SHA-256):\n{}", entry.trim_end()),
        }
        say!("{token}");
        Ok(ExitCode::SUCCESS)
    }
}
