//! A `run:` that the shell would start as one program with plain words
//! (`sleep 1`, `make -j4 all`) is started as that program directly: the
//! same process `sh -c` would end up running, without a shell started
//! first (as make does). Anything the shell would interpret — quotes,
//! variables, globs, redirections, operators, comments, assignments, a
//! builtin or keyword — goes to `sh -c` as written, as does a program that
//! cannot be started directly (not found, not executable, a script without
//! `#!`), so the shell reports it in its own words.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// dash's builtins and keywords: the shell's own, not the programs of the
/// same name (`echo` and `printf` treat backslashes differently, `cd` and
/// `exit` are no programs at all).
const SHELL_WORDS: &[&str] = &[
    ".", ":", "[", "alias", "bg", "break", "cd", "chdir", "command", "continue", "echo", "eval", "exec", "exit", "export", "false", "fc", "fg", "getopts", "hash", "jobs", "kill", "local", "printf", "pwd", "read", "readonly", "return", "set", "shift", "test", "times", "trap", "true", "type", "ulimit", "umask", "unalias", "unset", "wait", "!", "{", "}", "case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then", "until", "while", "function", "select", "source",
];

/// The words of `command` when the shell would run them as one program
/// with these arguments, unchanged.
pub fn words(command: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./+,:@%=".contains(c);
    if command.is_empty() || !command.chars().all(|c| c == ' ' || plain(c)) {
        return None;
    }
    let words: Vec<&str> = command.split(' ').filter(|w| !w.is_empty()).collect();
    let first = *words.first()?;
    // `NAME=value cmd` is an assignment; a builtin or keyword is the shell's.
    if first.contains('=') || SHELL_WORDS.contains(&first) {
        return None;
    }
    Some(words)
}

/// Where `program` is: a name with a slash relative to `cwd`, any other
/// looked up on `PATH` (this process's, which host commands are given) as
/// the shell would, the answer kept for the next step.
pub fn program_path(program: &str, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(cwd.join(program));
    }
    static FOUND: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    if let Some(p) = FOUND.lock().unwrap_or_else(|p| p.into_inner()).as_ref().and_then(|m| m.get(program)) {
        return Some(p.clone());
    }
    let found = steppe_language::machine::on_path(program)?;
    let mut cache = FOUND.lock().unwrap_or_else(|p| p.into_inner());
    let m = cache.get_or_insert_with(HashMap::new);
    if m.len() < 1024 {
        m.insert(program.to_string(), found.clone());
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_run_directly_and_whatever_the_shell_interprets_does_not() {
        assert_eq!(words("sleep 1"), Some(vec!["sleep", "1"]));
        assert_eq!(words("make  -j4 all CC=gcc"), Some(vec!["make", "-j4", "all", "CC=gcc"]));
        assert_eq!(words("./bin/tool --flag=x,y:z@h%1+2"), Some(vec!["./bin/tool", "--flag=x,y:z@h%1+2"]));
        for shell in [
            "", "   ", "echo hi", "true", "exit 3", "cd /", "test -f x", "[ -f x ]", "if true", "FOO=1 env", "ls *.txt", "ls ?", "cat a > b", "a | b", "a && b", "a; b",
            "echo $HOME", "echo \"q\"", "echo 'q'", "ls ~", "cmd # c", "a\nb", "a\tb", "x $(y)", "x `y`", "a & b", "(a)", "ls [ab]", "ls {a,b}", "ünï",
        ] {
            assert_eq!(words(shell), None, "{shell:?} is the shell's to run");
        }
    }

    #[test]
    fn programs_are_found_on_path_or_relative_to_the_step() {
        let sh = program_path("sh", Path::new("/nowhere")).expect("sh on PATH");
        assert!(sh.is_absolute() && sh.exists());
        assert_eq!(program_path("sh", Path::new("/elsewhere")), Some(sh), "kept");
        assert_eq!(program_path("./run.sh", Path::new("/step")), Some(PathBuf::from("/step/./run.sh")));
        assert_eq!(program_path("no-such-program-anywhere", Path::new("/")), None);
    }
}
