//! A command's flags built only when that command is the one run.
//!
//! clap builds every command's flags, help texts included, before it parses
//! one: two dozen commands' worth of allocation on every `steppe run`, about
//! a millisecond of a one-step run's wall time on a slow VM. When the command
//! line names its command first ([`parse`]), every command's arguments are
//! added by [`clap::Command::defer`], run when clap builds that command: only
//! the one parsed is. Otherwise (`steppe --help`, `steppe help run`, a
//! misspelt command, completions, the reference) they are built at once, as
//! the root's list of commands shows each one's about, which its flags carry.

use std::cell::Cell;

use clap::{ArgMatches, Args, Command, FromArgMatches, Parser, Subcommand};

thread_local! {
    /// Whether [`Lazy`] defers on this thread: set by [`parse`] only.
    static DEFER: Cell<bool> = const { Cell::new(false) };
}

/// The process's command line; when it names a command first, only that
/// command's flags are built.
pub fn parse() -> super::Cli {
    let first = std::env::args_os().nth(1);
    let named = first.as_deref().and_then(|a| a.to_str()).is_some_and(super::Command::has_subcommand);
    DEFER.with(|d| d.set(named));
    let cli = super::Cli::parse();
    DEFER.with(|d| d.set(false));
    cli
}

/// `T`'s flags, deferred until its command is built (see the module).
#[derive(Debug)]
pub struct Lazy<T>(pub T);

impl<T: FromArgMatches> FromArgMatches for Lazy<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Lazy)
    }

    fn from_arg_matches_mut(matches: &mut ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(matches).map(Lazy)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }

    fn update_from_arg_matches_mut(&mut self, matches: &mut ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(matches)
    }
}

impl<T: Args> Args for Lazy<T> {
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }

    fn augment_args(cmd: Command) -> Command {
        if DEFER.with(Cell::get) { cmd.defer(T::augment_args) } else { T::augment_args(cmd) }
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        if DEFER.with(Cell::get) { cmd.defer(T::augment_args_for_update) } else { T::augment_args_for_update(cmd) }
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use crate::cli::Cli;

    #[test]
    fn a_commands_flags_wait_until_it_is_built_and_then_parse_as_before() {
        let eager = Cli::command();
        assert!(eager.find_subcommand("run").expect("run").get_about().is_some(), "by default every command is built, its about with it");
        super::DEFER.with(|d| d.set(true));
        let root = Cli::command();
        let run = root.find_subcommand("run").expect("the run command");
        assert_eq!(run.get_arguments().count(), 0, "run's flags are not built with the root");
        let mut built = Cli::command();
        built.build();
        assert!(built.find_subcommand("run").expect("run").get_arguments().any(|a| a.get_long() == Some("job")), "built, run has its flags");
        let cli = Cli::try_parse_from(["steppe", "run", "ci.yml", "--job", "build", "--workers", "3"]).expect("parses");
        let said = format!("{cli:?}");
        assert!(said.contains("job: Some(\"build\")") && said.contains("workers: Some(3)"), "{said}");
        let wrong = Cli::try_parse_from(["steppe", "run", "ci.yml", "--workrs", "3"]).expect_err("a misspelt flag");
        assert!(wrong.to_string().contains("--workers"), "the flag meant is suggested: {wrong}");
        super::DEFER.with(|d| d.set(false));
    }
}
