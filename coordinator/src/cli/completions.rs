//! `steppe completions SHELL`: the shell's completion script, made from the
//! same command definitions as `--help`.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, CommandFactory};
use clap_complete::Shell;

/// Print a completion script for your shell.
///
/// Examples:
///   steppe completions bash > ~/.local/share/bash-completion/completions/steppe
///   steppe completions zsh > "${fpath[1]}/_steppe"
///   steppe completions fish > ~/.config/fish/completions/steppe.fish
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    #[arg(value_enum)]
    shell: Shell,
}

impl CompletionsArgs {
    pub fn run(self) -> Result<ExitCode> {
        let mut cmd = super::Cli::command();
        let mut out = std::io::stdout().lock();
        clap_complete::generate(self.shell, &mut cmd, "steppe", &mut out);
        Ok(ExitCode::SUCCESS)
    }
}
