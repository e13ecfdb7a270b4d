//! ask_user's person at the terminal: the question on the run's terminal,
//! the answer typed back (one question at a time, however many steps ask).

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use serde_json::{json, Value};

/// A person is being asked at this process's terminal: the live status line keeps off it.
static ASKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a person is being asked at this process's terminal now.
pub fn person_is_answering() -> bool {
    ASKING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Marks the terminal taken while it lives.
struct Asking;

impl Drop for Asking {
    fn drop(&mut self) {
        ASKING.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Asks at this process's terminal; None when there is none, nobody typed
/// an answer in time, or (with `options_required`) three answers were not
/// among the options.
pub(super) async fn ask_person(question: &str, options: &[String], options_required: bool, timeout: Option<Duration>) -> Option<Value> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    if !std::io::stdin().is_terminal() {
        return None;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    ASKING.store(true, std::sync::atomic::Ordering::Relaxed);
    let _asking = Asking;
    let (q, opts) = (steppe_runtime::printable::escape_controls(question).into_owned(), options.to_vec());
    let read = tokio::task::spawn_blocking(move || -> Option<String> {
        let shown = if opts.is_empty() { String::new() } else { format!(" [{}]", opts.join(" | ")) };
        for _ in 0..3 {
            // One write, so the run's other lines cannot land inside the prompt.
            let prompt = format!("\r\x1b[2K? {q}{shown}\n> ");
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(prompt.as_bytes()).and_then(|()| err.flush());
            drop(err);
            let mut line = String::new();
            if std::io::stdin().lock().read_line(&mut line).ok()? == 0 {
                return None;
            }
            let answer = line.trim().to_string();
            if answer.is_empty() {
                return None;
            }
            if !options_required || opts.is_empty() || opts.contains(&answer) {
                return Some(answer);
            }
            let again = format!("  (answer with one of: {})\n", opts.join(", "));
            let _ = std::io::stderr().lock().write_all(again.as_bytes());
        }
        None
    });
    let answer = match timeout {
        Some(t) => tokio::time::timeout(t, read).await.ok()?.ok()?,
        None => read.await.ok()?,
    }?;
    Some(json!({"answered": true, "answer": answer, "source": "person"}))
}
